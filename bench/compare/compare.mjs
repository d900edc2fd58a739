// onceprint against BullMQ on Redis, side by side on one machine in one run.
//
// Run it through bench/compare.sh, which builds the onceprint binary, installs the pinned
// bullmq and ioredis from npm into a scratch folder and passes that folder as --modules.
//
// BullMQ side: a redis-server of our own (AOF, appendfsync everysec) on a free loopback
// port, one queue per printer, 64 producers calling queue.add(name, data, {jobId: key})
// (with --batch K: K consecutive jobs at once, addBulk per queue that has several, see runAdds),
// and workers (concurrency 1 per queue, like a printer lane) in a child process whose side
// effect is appending a line to a file. The child is a process of its own so that it can
// be killed with SIGKILL mid-run and restarted, as onceprint's agent is.
//
// onceprint side: the same binary's `bench submit` and `bench e2e` with --json (and with
// --batch K, K tasks per POST /v1/print-task-batches).
//
// Every figure that is compared is measured in this one run, phases interleaved (BullMQ,
// then onceprint, for each measure), because absolute figures on the shared machines swing
// by 3x from one day to the next: only the ratios mean something.

import { spawn, execFileSync } from 'node:child_process';
import { createRequire } from 'node:module';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { fileURLToPath } from 'node:url';

const SCRIPT = fileURLToPath(import.meta.url);

// ---------------------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------------------

const OPTIONS = {
  tasks: { type: 'string', default: '50000' },
  duplicates: { type: 'string', default: '0.3' },
  'duplicates-high': { type: 'string', default: '0.95' },
  printers: { type: 'string', default: '100' },
  producers: { type: 'string', default: '64' },
  batch: { type: 'string', default: '1' },
  connections: { type: 'string', default: '4' },
  warmup: { type: 'string', default: '5000' },
  'kill-at': { type: 'string', default: '0.5' },
  'timeout-secs': { type: 'string', default: '300' },
  phases: { type: 'string', default: 'intake,duplicates,printed,restart' },
  'skip-onceprint': { type: 'boolean', default: false },
  'skip-bullmq': { type: 'boolean', default: false },
  onceprint: { type: 'string' },
  database: { type: 'string' },
  'redis-server': { type: 'string', default: 'redis-server' },
  modules: { type: 'string' },
  'json-out': { type: 'string' },
  'keep-dir': { type: 'boolean', default: false },
  median: { type: 'boolean', default: false },
  help: { type: 'boolean', short: 'h', default: false },
  // Internal: this script started as the BullMQ worker child.
  role: { type: 'string', default: 'main' },
  'redis-port': { type: 'string' },
  out: { type: 'string' },
};

const USAGE = `usage: bench/compare.sh [options]   (or node compare.mjs --modules DIR [options])

onceprint against BullMQ on Redis, same machine, same run; prints the ratios.

  --tasks N            submissions / tasks per measure (50000)
  --duplicates F       share of repeated keys in the intake measure (0.3)
  --duplicates-high F  share of repeated keys in the duplicate-answer measure (0.95)
  --printers P         printers = BullMQ queues, one worker each, concurrency 1 (100)
  --producers C        concurrent producers / submit connections (64)
  --batch B            jobs per producer call, 1-500: with K > 1 each BullMQ producer call is
                       K consecutive jobs sent at once (one addBulk per queue with several of
                       them, a plain add for a queue's single job, awaited together) and
                       onceprint's benches get --batch K (K tasks per
                       POST /v1/print-task-batches); latencies are then per call (1)
  --connections K      Redis connections the BullMQ producers share (4)
  --warmup N           submissions before each intake measure, both sides (5000)
  --kill-at F          kill -9 the worker / agent once this share is printed (0.5)
  --timeout-secs S     give up on a BullMQ phase after this long (300)
  --phases LIST        which measures, comma-separated (intake,duplicates,printed,restart)
  --skip-onceprint     measure BullMQ only
  --skip-bullmq        measure onceprint only
  --onceprint PATH     the onceprint binary (compare.sh: target/release/onceprint)
  --database URL       postgres://... for onceprint's benches (default: a fresh SQLite file)
  --redis-server PATH  the redis-server executable (redis-server)
  --json-out FILE      also write the whole result as JSON to FILE
  --keep-dir           keep the temp folder (Redis AOF, worker output, logs)
  --modules DIR        node_modules holding bullmq and ioredis (compare.sh sets it)

  node compare.mjs --median A.json B.json ...
                       the medians of several --json-out results (each ratio is the median
                       of the runs' own ratios: only a ratio measured in one run compares)`;

function fail(message) {
  console.error(`compare: ${message}`);
  process.exit(2);
}

function parseOptions() {
  let parsed;
  let files;
  try {
    const all = parseArgs({ options: OPTIONS, allowPositionals: true });
    parsed = all.values;
    files = all.positionals;
    if (files.length > 0 && !parsed.median) throw new Error(`unexpected argument ${files[0]}`);
  } catch (e) {
    fail(`${e.message}\n${USAGE}`);
  }
  if (parsed.help) {
    console.log(USAGE);
    process.exit(0);
  }
  const int = (name, min) => {
    const v = Number(parsed[name]);
    if (!Number.isInteger(v) || v < min) fail(`--${name} must be an integer >= ${min}, not ${parsed[name]}`);
    return v;
  };
  const share = (name, lo, hi) => {
    const v = Number(parsed[name]);
    if (!Number.isFinite(v) || v < lo || v > hi) fail(`--${name} must be within ${lo}..${hi}, not ${parsed[name]}`);
    return v;
  };
  if (Number(parsed.batch) > 500) fail(`--batch must be an integer within 1..500 (the most POST /v1/print-task-batches takes), not ${parsed.batch}`);
  const phases = new Set(parsed.phases.split(',').map((p) => p.trim()).filter(Boolean));
  for (const p of phases) {
    if (!['intake', 'duplicates', 'printed', 'restart'].includes(p)) fail(`unknown phase ${p} in --phases`);
  }
  return {
    role: parsed.role,
    median: parsed.median ? files : null,
    phases,
    tasks: int('tasks', 1),
    duplicates: share('duplicates', 0, 0.99),
    duplicatesHigh: share('duplicates-high', 0, 0.99),
    printers: int('printers', 1),
    producers: int('producers', 1),
    batch: int('batch', 1),
    connections: int('connections', 1),
    warmup: int('warmup', 0),
    killAt: share('kill-at', 0.01, 0.99),
    timeoutMs: int('timeout-secs', 1) * 1000,
    skipOnceprint: parsed['skip-onceprint'],
    skipBullmq: parsed['skip-bullmq'],
    onceprint: parsed.onceprint,
    database: parsed.database,
    redisServer: parsed['redis-server'],
    modules: parsed.modules,
    jsonOut: parsed['json-out'],
    keepDir: parsed['keep-dir'],
    redisPort: parsed['redis-port'] === undefined ? undefined : Number(parsed['redis-port']),
    out: parsed.out,
  };
}

// bullmq and ioredis live in a scratch folder (compare.sh installs them there, never into
// the repository), so they are loaded through a require rooted in that folder rather than
// through bare ESM imports, which would only look next to this script.
function loadModules(dir) {
  const root = dir ?? path.join(path.dirname(SCRIPT), 'node_modules');
  const req = createRequire(path.join(path.resolve(root), '..', 'compare-loader.js'));
  let bullmq, ioredis;
  try {
    bullmq = req('bullmq');
    ioredis = req('ioredis');
  } catch (e) {
    fail(`cannot load bullmq/ioredis from ${root} (${e.message}); run bench/compare.sh, or pass --modules DIR`);
  }
  const version = (name) => {
    try {
      return JSON.parse(fs.readFileSync(req.resolve(`${name}/package.json`), 'utf8')).version;
    } catch {
      return 'unknown';
    }
  };
  return {
    Queue: bullmq.Queue,
    Worker: bullmq.Worker,
    Redis: ioredis.default ?? ioredis.Redis ?? ioredis,
    versions: { bullmq: version('bullmq'), ioredis: version('ioredis') },
  };
}

// ---------------------------------------------------------------------------------------
// The plan: the same generator as crates/bench/src/plan.rs, so both sides get the same
// sequence of keys and repeats for a given seed.
// ---------------------------------------------------------------------------------------

const MASK64 = (1n << 64n) - 1n;
const RECENT_WINDOW = 1000;
const PLAN_SEED = 1n;

class SplitMix64 {
  constructor(seed) {
    this.state = BigInt.asUintN(64, seed);
  }

  nextU64() {
    this.state = (this.state + 0x9e3779b97f4a7c15n) & MASK64;
    let z = this.state;
    z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & MASK64;
    z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & MASK64;
    return z ^ (z >> 31n);
  }

  nextF64() {
    return Number(this.nextU64() >> 11n) / 2 ** 53;
  }

  below(n) {
    return Number(this.nextU64() % BigInt(n));
  }
}

/** Each request is a new key with probability 1 - share, else one of the last 1000 keys. */
function buildPlan(prefix, requests, share, seed) {
  const rng = new SplitMix64(seed);
  const keys = new Array(requests);
  let distinct = 0;
  for (let i = 0; i < requests; i++) {
    const repeat = distinct > 0 && rng.nextF64() < share;
    if (repeat) {
      const start = Math.max(0, distinct - RECENT_WINDOW);
      keys[i] = start + rng.below(distinct - start);
    } else {
      keys[i] = distinct++;
    }
  }
  return { prefix, keys, distinct };
}

/** The job's data: the same fields as onceprint's submission body for key n. */
function jobData(prefix, n, printers) {
  return {
    biz_no: `${prefix}${n}`,
    printer_id: `p${n % printers}`,
    print_type: 'receipt',
    content: { type: 'text', text: `Order ${prefix}${n}\n1 x Noodles  12.00\n` },
  };
}

// ---------------------------------------------------------------------------------------
// Small utilities
// ---------------------------------------------------------------------------------------

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const nowMs = () => performance.timeOrigin + performance.now();

function percentile(sorted, p) {
  if (sorted.length === 0) return 0;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[i];
}

/** p50/p99/max of latencies in ms; `per` (only with --batch K > 1) says what one sample is. */
function latencySummary(values, per) {
  const s = Float64Array.from(values).sort();
  const r = (v) => Math.round(v * 1000) / 1000;
  const summary = { count: s.length, p50: r(percentile(s, 50)), p99: r(percentile(s, 99)), max: r(s.length ? s[s.length - 1] : 0) };
  return per === undefined ? summary : { per, ...summary };
}

/** What one latency sample is with --batch K > 1. */
const perCall = (opts) => `call (up to ${opts.batch} jobs: addBulk per queue with several, add for one, awaited together)`;

/** user + system CPU seconds of a process, from /proc (Linux only; null elsewhere). */
function cpuSeconds(pid) {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    // Fields after the command name, which is in parentheses and may contain spaces.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    const ticks = Number(fields[11]) + Number(fields[12]);
    return ticks / 100;
  } catch {
    return null;
  }
}

function freePort() {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.on('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

function machineLine() {
  const cpus = os.cpus();
  return `${cpus.length} cores, ${cpus[0]?.model ?? 'unknown CPU'}, ${Math.round(os.totalmem() / 2 ** 30)} GiB`;
}

function loadLine() {
  return os
    .loadavg()
    .map((v) => v.toFixed(2))
    .join(', ');
}

// Processes this script started; whatever happens, they are killed before it exits.
const children = new Set();

function killChildren() {
  for (const child of children) {
    if (child.exitCode === null && child.signalCode === null) {
      try {
        child.kill('SIGKILL');
      } catch {
        // Already gone.
      }
    }
  }
}

function track(child) {
  children.add(child);
  child.on('exit', () => children.delete(child));
  return child;
}

// ---------------------------------------------------------------------------------------
// Redis of our own
// ---------------------------------------------------------------------------------------

async function startRedis(opts, dir, Redis) {
  const port = await freePort();
  const redisDir = path.join(dir, 'redis');
  fs.mkdirSync(redisDir, { recursive: true });
  const log = fs.openSync(path.join(dir, 'redis.log'), 'a');
  // AOF with fsync every second is Redis's durable setting that teams run BullMQ with
  // (appendfsync always would fsync per write); RDB snapshots are off so that a snapshot
  // fork does not land in a measured phase.
  const args = [
    '--port', String(port), '--bind', '127.0.0.1', '--dir', redisDir,
    '--appendonly', 'yes', '--appendfsync', 'everysec', '--save', '',
    '--daemonize', 'no', '--protected-mode', 'yes',
  ];
  const proc = track(spawn(opts.redisServer, args, { stdio: ['ignore', log, log] }));
  const spawned = await new Promise((resolve) => {
    proc.once('spawn', () => resolve(null));
    proc.once('error', (e) => resolve(e));
  });
  if (spawned) fail(`cannot start ${opts.redisServer}: ${spawned.message}`);
  const deadline = Date.now() + 10_000;
  for (;;) {
    const probe = new Redis({ host: '127.0.0.1', port, lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
    probe.on('error', () => {});
    try {
      await probe.connect();
      const info = await probe.info('server');
      await probe.quit();
      const version = /redis_version:(\S+)/.exec(info)?.[1] ?? 'unknown';
      return { proc, port, version };
    } catch {
      probe.disconnect();
      if (Date.now() > deadline || proc.exitCode !== null) fail(`redis-server did not come up on port ${port} (see ${dir}/redis.log)`);
      await sleep(100);
    }
  }
}

// ---------------------------------------------------------------------------------------
// BullMQ: producers
// ---------------------------------------------------------------------------------------

/** K Redis connections, each with one Queue object per printer. */
async function openQueues(mods, port, opts) {
  const conns = [];
  const queues = [];
  for (let c = 0; c < opts.connections; c++) {
    const conn = new mods.Redis({ host: '127.0.0.1', port, maxRetriesPerRequest: null });
    conn.setMaxListeners(opts.printers * 4 + 16);
    conns.push(conn);
    const row = [];
    for (let q = 0; q < opts.printers; q++) row.push(new mods.Queue(`p${q}`, { connection: conn }));
    queues.push(row);
  }
  await Promise.all(queues.flat().map((q) => q.waitUntilReady()));
  return {
    conns,
    queues,
    async close() {
      await Promise.all(queues.flat().map((q) => q.close()));
      await Promise.all(conns.map((c) => c.quit().catch(() => c.disconnect())));
    },
  };
}

/**
 * Sends every planned add, `producers` at a time (each producer takes the next request
 * when its previous add has returned), and returns the wall time and add latencies.
 * With --batch K > 1 a producer takes the next K planned jobs at a time instead
 * (runBulkAdds), and the latencies are per call.
 */
async function runAdds(set, plan, opts, onProgress) {
  if (opts.batch > 1) return runBulkAdds(set, plan, opts, onProgress);
  let next = 0;
  const latencies = new Float64Array(plan.keys.length);
  const errors = [];
  const started = nowMs();
  const producer = async (p) => {
    const queues = set.queues[p % set.queues.length];
    for (;;) {
      const i = next++;
      if (i >= plan.keys.length) return;
      const n = plan.keys[i];
      const t0 = nowMs();
      try {
        await queues[n % opts.printers].add('receipt', jobData(plan.prefix, n, opts.printers), { jobId: `${plan.prefix}${n}` });
      } catch (e) {
        if (errors.length < 10) errors.push(String(e?.message ?? e));
        errors.count = (errors.count ?? 0) + 1;
      }
      latencies[i] = nowMs() - t0;
      if (onProgress) onProgress(i);
    }
  };
  await Promise.all(Array.from({ length: opts.producers }, (_, p) => producer(p)));
  const ended = nowMs();
  return { started, ended, wallSeconds: (ended - started) / 1000, latencies, errors, errorCount: errors.count ?? 0 };
}

/**
 * runAdds with --batch K > 1: each producer call takes the next K planned jobs, as one
 * POST /v1/print-task-batches of onceprint's bench takes the next K submissions.
 *
 * BullMQ's bulk add, Queue.addBulk, is per queue (one MULTI of that queue's add scripts),
 * and the K consecutive jobs of a call mostly go to different queues (key n goes to queue
 * n % printers). So a call groups its jobs per queue, in plan order within each queue, and
 * sends one addBulk per queue at once (a plain add where a queue has a single job: an
 * addBulk of one is a MULTI, three times dearer here), awaiting them all: the producer's
 * queues share one Redis connection (as for queue.add), on which ioredis writes them back to back
 * without waiting for replies, so they travel together like the one HTTP request on the
 * other side. The call's latency runs until its last addBulk answered. (FlowProducer.addBulk could put jobs of
 * several queues in one MULTI, but it adds flows, parents and children, with semantics of
 * their own; independent jobs are what Queue.addBulk is for.) A repeat inside one call is
 * answered by the same jobId check as in queue.add.
 */
async function runBulkAdds(set, plan, opts, onProgress) {
  const n = plan.keys.length;
  const calls = Math.ceil(n / opts.batch);
  let next = 0;
  const latencies = new Float64Array(calls);
  const errors = [];
  // The calls' jobs, grouped per queue, built before the clock starts (like the plan).
  const groups = new Array(calls);
  for (let c = 0; c < calls; c++) {
    const perQueue = new Map();
    for (let i = c * opts.batch; i < Math.min(n, (c + 1) * opts.batch); i++) {
      const key = plan.keys[i];
      const q = key % opts.printers;
      if (!perQueue.has(q)) perQueue.set(q, []);
      perQueue.get(q).push({ name: 'receipt', data: jobData(plan.prefix, key, opts.printers), opts: { jobId: `${plan.prefix}${key}` } });
    }
    groups[c] = [...perQueue];
  }
  const started = nowMs();
  const producer = async (p) => {
    const queues = set.queues[p % set.queues.length];
    for (;;) {
      const c = next++;
      if (c >= calls) return;
      const t0 = nowMs();
      // A queue's several jobs go in one addBulk (one MULTI); a queue's single job in a
      // plain add, which is cheaper than a MULTI of one (measured: with 100 queues a call
      // of 50 jobs is mostly single jobs, and addBulk for each ran at a third of add's
      // rate). All of a call's commands are sent at once on the producer's connection.
      const settled = await Promise.allSettled(
        groups[c].map(([q, jobs]) => (jobs.length === 1 ? queues[q].add(jobs[0].name, jobs[0].data, jobs[0].opts) : queues[q].addBulk(jobs))),
      );
      latencies[c] = nowMs() - t0;
      for (const s of settled) {
        if (s.status === 'rejected') {
          if (errors.length < 10) errors.push(String(s.reason?.message ?? s.reason));
          errors.count = (errors.count ?? 0) + 1;
        }
      }
      if (onProgress) onProgress(Math.min(n, (c + 1) * opts.batch) - 1);
    }
  };
  await Promise.all(Array.from({ length: opts.producers }, (_, p) => producer(p)));
  const ended = nowMs();
  return { started, ended, wallSeconds: (ended - started) / 1000, latencies, errors, errorCount: errors.count ?? 0, calls };
}

/** Sum of the job counts over every queue. */
async function jobCounts(set, opts) {
  const total = {};
  for (let q = 0; q < opts.printers; q++) {
    const counts = await set.queues[0][q].getJobCounts();
    for (const [k, v] of Object.entries(counts)) total[k] = (total[k] ?? 0) + v;
  }
  return total;
}

async function flush(mods, port) {
  const c = new mods.Redis({ host: '127.0.0.1', port, maxRetriesPerRequest: null });
  await c.flushall();
  await c.quit();
}

async function bullIntake(mods, redis, opts, share, label) {
  await flush(mods, redis.port);
  const set = await openQueues(mods, redis.port, opts);
  try {
    // Warm-up keys ("W…") are disjoint from the measured ones ("B…"), as in bench submit.
    const warm = opts.warmup > 0 ? buildPlan('W', opts.warmup, share, PLAN_SEED ^ 0x5741524dn) : null;
    if (warm) await runAdds(set, warm, opts);
    const plan = buildPlan('B', opts.tasks, share, PLAN_SEED);
    const redisCpu0 = cpuSeconds(redis.proc.pid);
    const nodeCpu0 = process.cpuUsage();
    const run = await runAdds(set, plan, opts);
    const redisCpu = cpuSeconds(redis.proc.pid) - redisCpu0;
    const nodeCpuUs = process.cpuUsage(nodeCpu0);
    const counts = await jobCounts(set, opts);
    const warmDistinct = warm?.distinct ?? 0;
    const stored = Object.values(counts).reduce((a, b) => a + b, 0);
    const problems = [];
    if (run.errorCount > 0) problems.push(`${run.errorCount} ${opts.batch > 1 ? 'addBulk' : 'add'} calls failed, e.g. ${run.errors[0]}`);
    if (stored !== plan.distinct + warmDistinct) {
      problems.push(`Redis holds ${stored} jobs, expected ${plan.distinct + warmDistinct} (one per distinct key)`);
    }
    const duplicates = plan.keys.length - plan.distinct;
    const result = {
      measure: label,
      requests: plan.keys.length,
      duplicate_share: share,
      duplicate_share_actual: duplicates / plan.keys.length,
      distinct_keys: plan.distinct,
      wall_seconds: run.wallSeconds,
      accepted: plan.distinct,
      duplicates,
      accepted_per_sec: plan.distinct / run.wallSeconds,
      duplicates_per_sec: duplicates / run.wallSeconds,
      answers_per_sec: plan.keys.length / run.wallSeconds,
      // With --batch K > 1 only: K, the producer calls and their rate.
      ...(opts.batch > 1 ? { batch: opts.batch, calls: run.calls, calls_per_sec: run.calls / run.wallSeconds } : {}),
      add_latency_ms: latencySummary(run.latencies, opts.batch > 1 ? perCall(opts) : undefined),
      redis_cpu_ms_per_request: redisCpu === null ? null : (redisCpu * 1000) / plan.keys.length,
      producer_cpu_ms_per_request: (nodeCpuUs.user + nodeCpuUs.system) / 1000 / plan.keys.length,
      job_counts: counts,
      problems,
    };
    log(
      `  BullMQ ${label}: ${fmtRate(result.accepted_per_sec)} accepted/s, ${fmtRate(result.duplicates_per_sec)} duplicate answers/s ` +
        `(${opts.batch > 1 ? `${plan.keys.length} jobs in ${run.calls} addBulk calls of up to ${opts.batch}` : `${plan.keys.length} adds`} in ${run.wallSeconds.toFixed(2)} s, ${(result.duplicate_share_actual * 100).toFixed(1)} % repeats)` +
        (problems.length ? `  PROBLEMS: ${problems.join('; ')}` : ''),
    );
    return result;
  } finally {
    await set.close();
  }
}

// ---------------------------------------------------------------------------------------
// BullMQ: the worker child and the "paper" it writes
// ---------------------------------------------------------------------------------------

/** The child process: one Worker per queue, concurrency 1, appending a line per job. */
async function workerChild(opts) {
  const mods = loadModules(opts.modules);
  // O_APPEND: each line is one write(2), so lines of the 100 workers never interleave. No
  // fsync: BullMQ's worker acknowledges nothing to a printer, and the side effect stands
  // for "the job ran", not for a durable record.
  const fd = fs.openSync(opts.out, 'a');
  const conn = new mods.Redis({ host: '127.0.0.1', port: opts.redisPort, maxRetriesPerRequest: null });
  conn.setMaxListeners(opts.printers * 4 + 16);
  const workers = [];
  for (let q = 0; q < opts.printers; q++) {
    const w = new mods.Worker(
      `p${q}`,
      async (job) => {
        fs.writeSync(fd, `${job.id} ${nowMs().toFixed(3)} ${process.pid}\n`);
      },
      // Defaults everywhere else (lockDuration 30 s, stalledInterval 30 s,
      // maxStalledCount 1): what a team starts with, and what the restart measure reports.
      { connection: conn, concurrency: 1, autorun: true },
    );
    w.on('error', () => {});
    workers.push(w);
  }
  await Promise.all(workers.map((w) => w.waitUntilReady()));
  process.send?.({ ready: true });
  const stop = async () => {
    await Promise.all(workers.map((w) => w.close()));
    await conn.quit().catch(() => {});
    fs.closeSync(fd);
    process.exit(0);
  };
  process.on('SIGTERM', stop);
  process.on('disconnect', stop);
}

function spawnWorkerChild(opts, redisPort, outFile, logFile) {
  const log = fs.openSync(logFile, 'a');
  const args = [
    SCRIPT, '--role', 'worker', '--redis-port', String(redisPort), '--out', outFile,
    '--printers', String(opts.printers),
  ];
  if (opts.modules) args.push('--modules', opts.modules);
  const child = track(spawn(process.execPath, args, { stdio: ['ignore', log, log, 'ipc'] }));
  const ready = new Promise((resolve, reject) => {
    child.on('message', (m) => m?.ready && resolve());
    child.once('exit', (code, signal) => reject(new Error(`worker child exited (${code ?? signal}) before it was ready; see ${logFile}`)));
  });
  return { child, ready };
}

async function stopChild(child, ms = 15_000) {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((resolve) => child.once('exit', resolve));
  child.kill('SIGTERM');
  const t = setTimeout(() => child.kill('SIGKILL'), ms);
  await exited;
  clearTimeout(t);
}

/** Follows the worker's output file as it grows, as onceprint's bench follows its paper log. */
class PaperTail {
  constructor(file) {
    this.file = file;
    this.offset = 0;
    this.rest = '';
    this.lines = []; // { id, at }
    this.seen = new Map(); // id -> times on paper
  }

  poll() {
    let fd;
    try {
      fd = fs.openSync(this.file, 'r');
    } catch {
      return;
    }
    try {
      const size = fs.fstatSync(fd).size;
      if (size <= this.offset) return;
      const buf = Buffer.alloc(size - this.offset);
      fs.readSync(fd, buf, 0, buf.length, this.offset);
      this.offset = size;
      const text = this.rest + buf.toString('utf8');
      const parts = text.split('\n');
      this.rest = parts.pop();
      for (const line of parts) {
        const [id, at] = line.split(' ');
        this.lines.push({ id, at: Number(at) });
        this.seen.set(id, (this.seen.get(id) ?? 0) + 1);
      }
    } finally {
      fs.closeSync(fd);
    }
  }

  get distinct() {
    return this.seen.size;
  }
}

/**
 * The delivery measure: workers running, N distinct jobs added by the producers, until
 * every job's line is in the file. With `kill`, the worker child is killed with SIGKILL
 * once `killAt` of the jobs are on "paper" and restarted at once.
 */
async function bullPrinted(mods, redis, opts, dir, kill) {
  await flush(mods, redis.port);
  const tag = kill ? 'restart' : 'printed';
  const outFile = path.join(dir, `bullmq-${tag}.lines`);
  const logFile = path.join(dir, `bullmq-${tag}-worker.log`);
  fs.writeFileSync(outFile, '');
  let { child, ready } = spawnWorkerChild(opts, redis.port, outFile, logFile);
  await ready;
  const set = await openQueues(mods, redis.port, opts);
  const tail = new PaperTail(outFile);
  const plan = buildPlan('E', opts.tasks, 0, PLAN_SEED);
  const problems = [];
  const workerCpu = [];
  let restart = null;
  try {
    const redisCpu0 = cpuSeconds(redis.proc.pid);
    const adds = runAdds(set, plan, opts);
    const started = nowMs();
    const deadline = Date.now() + opts.timeoutMs;
    let killed = false;
    let stalled = null;
    let restartedAt = 0;
    let linesAtKill = 0;
    let resumeMs = null;
    let stalledDone = null;
    let lastStateCheck = 0;
    // With a kill, the run lasts until the jobs the killed worker held are completed too:
    // their lines may be in the file already (written just before the kill, the job not
    // yet moved to completed), so the file alone cannot tell.
    const done = () => tail.distinct >= plan.distinct && (!kill || stalledDone !== null);
    while (!done() && Date.now() < deadline) {
      await sleep(kill && killed && resumeMs === null ? 5 : 50);
      tail.poll();
      if (kill && !killed && tail.distinct >= Math.ceil(plan.distinct * opts.killAt)) {
        killed = true;
        linesAtKill = tail.lines.length;
        const printedAtKill = tail.distinct;
        workerCpu.push(cpuSeconds(child.pid));
        const exited = new Promise((resolve) => child.once('exit', resolve));
        child.kill('SIGKILL');
        await exited;
        const killedAt = nowMs();
        // With the only worker dead, every job in an `active` list is one the killed
        // worker held: BullMQ can give it back only after its lock expires and a stalled
        // check runs.
        // One pipelined round trip over the queues' `active` lists (BullMQ's default key
        // prefix `bull`), so that the restart is not held up by the listing.
        const pipe = set.conns[0].pipeline();
        for (let q = 0; q < opts.printers; q++) pipe.lrange(`bull:p${q}:active`, 0, -1);
        const lists = await pipe.exec();
        const active = [];
        lists.forEach(([err, ids], q) => {
          if (err) problems.push(`listing the active jobs of queue p${q}: ${err.message}`);
          for (const id of ids ?? []) active.push({ q, id });
        });
        stalled = active;
        restartedAt = nowMs();
        ({ child, ready } = spawnWorkerChild(opts, redis.port, outFile, logFile));
        restart = { printed_at_kill: printedAtKill, active_at_kill: active.length, kill_to_restart_ms: restartedAt - killedAt };
        restart.killed_at = killedAt;
        ready.catch(() => {});
      }
      if (killed && resumeMs === null) {
        const held = new Set(stalled.map((s) => s.id));
        const first = tail.lines.slice(linesAtKill).find((l) => l.at >= restartedAt && !held.has(l.id));
        if (first) resumeMs = first.at - restartedAt;
      }
      if (killed && stalledDone === null && stalled.length === 0) stalledDone = { ms: 0, failed: 0 };
      if (killed && stalledDone === null && tail.distinct >= plan.distinct - stalled.length && Date.now() - lastStateCheck >= 250) {
        // Only now can the stalled jobs be the ones left; ask Redis for their states.
        lastStateCheck = Date.now();
        const states = await Promise.all(stalled.map((s) => set.queues[0][s.q].getJobState(s.id)));
        if (states.every((s) => s === 'completed' || s === 'failed')) {
          stalledDone = { ms: nowMs() - restartedAt, failed: states.filter((s) => s === 'failed').length };
        }
      }
    }
    tail.poll();
    const run = await adds;
    const redisCpu = cpuSeconds(redis.proc.pid) - redisCpu0;
    const completed = tail.distinct >= plan.distinct;
    if (!completed) problems.push(`timed out with ${tail.distinct} of ${plan.distinct} jobs on paper`);
    if (kill && killed && stalledDone === null) problems.push(`the ${stalled.length} jobs active at the kill were not completed within the timeout`);
    if (kill && !killed) problems.push('the worker was never killed (printing never got that far)');
    if (run.errorCount > 0) problems.push(`${run.errorCount} ${opts.batch > 1 ? 'addBulk' : 'add'} calls failed, e.g. ${run.errors[0]}`);
    // Let the last moveToFinished calls land before counting.
    await sleep(500);
    const counts = await jobCounts(set, opts);
    workerCpu.push(cpuSeconds(child.pid));
    const expected = new Set(plan.keys.map((n) => `E${n}`));
    let twice = 0;
    let extra = 0;
    let stray = 0;
    for (const [id, times] of tail.seen) {
      if (!expected.has(id)) stray++;
      else if (times > 1) {
        twice++;
        extra += times - 1;
      }
    }
    const missing = [...expected].filter((id) => !tail.seen.has(id)).length;
    if (stray) problems.push(`${stray} lines of jobs never added`);
    if (!kill && twice) problems.push(`${twice} jobs ran twice`);
    if (!kill && counts.completed !== plan.distinct) problems.push(`${counts.completed} jobs completed in Redis, expected ${plan.distinct}`);
    const lastAt = tail.lines.reduce((m, l) => Math.max(m, l.at), 0);
    const printSeconds = (lastAt - started) / 1000;
    const cpu = workerCpu.filter((v) => v !== null).reduce((a, b) => a + b, 0);
    const result = {
      measure: kill ? `printed with kill -9 at ${opts.killAt}` : 'printed',
      tasks: plan.distinct,
      printers: opts.printers,
      producers: opts.producers,
      ...(opts.batch > 1 ? { batch: opts.batch, calls: run.calls } : {}),
      submit_seconds: run.wallSeconds,
      submitted_per_sec: plan.distinct / run.wallSeconds,
      print_seconds: printSeconds,
      printed_per_sec: tail.distinct / printSeconds,
      completed,
      on_paper: { lines: tail.lines.length, distinct: tail.distinct, ran_twice: twice, extra_lines: extra, missing, stray },
      job_counts: counts,
      redis_cpu_ms_per_task: redisCpu === null ? null : (redisCpu * 1000) / plan.distinct,
      worker_cpu_ms_per_task: (cpu * 1000) / plan.distinct,
      problems,
    };
    if (kill) {
      const { killed_at: killedAt, ...restartFigures } = restart ?? {};
      result.restart = {
        ...restartFigures,
        resume_ms: resumeMs,
        stalled_completed_ms: stalledDone?.ms ?? null,
        stalled_completed_after_kill_ms: stalledDone && killedAt ? stalledDone.ms + (restartedAt - killedAt) : null,
        stalled_failed: stalledDone?.failed ?? null,
        note:
          'resume_ms: from the restart to the first line of a job not active at the kill; ' +
          'stalled_completed_ms (_after_kill_ms): from the restart (the kill) until every job active at the kill is completed (lock expiry + stalled check).',
      };
    }
    const r = result.restart;
    log(
      `  BullMQ ${result.measure}: ${fmtRate(result.printed_per_sec)} completed/s (${tail.distinct} in ${printSeconds.toFixed(2)} s)` +
        (r ? `; after the restart: next job ${fmtMs(r.resume_ms)}, the ${r.active_at_kill} active at the kill ${fmtMs(r.stalled_completed_ms)}, ${twice} ran twice` : '') +
        (problems.length ? `  PROBLEMS: ${problems.join('; ')}` : ''),
    );
    return result;
  } finally {
    await stopChild(child);
    await set.close();
  }
}

// ---------------------------------------------------------------------------------------
// onceprint
// ---------------------------------------------------------------------------------------

function runOnceprint(opts, dir, name, args) {
  const full = [...args, ...(opts.database ? ['--database', opts.database] : []), '--json'];
  const errFile = path.join(dir, `onceprint-${name}.stderr`);
  return new Promise((resolve) => {
    const err = fs.openSync(errFile, 'w');
    const child = track(spawn(opts.onceprint, full, { stdio: ['ignore', 'pipe', err] }));
    let out = '';
    child.stdout.on('data', (d) => (out += d));
    child.on('error', (e) => resolve({ command: [opts.onceprint, ...full].join(' '), error: e.message }));
    child.on('exit', (code, signal) => {
      fs.closeSync(err);
      let report = null;
      try {
        report = JSON.parse(out);
      } catch {
        // Reported below with the tail of stderr.
      }
      const result = { command: [opts.onceprint, ...full].join(' '), exit: code ?? signal, report };
      if (report === null || code !== 0) {
        const tailText = fs.readFileSync(errFile, 'utf8').split('\n').slice(-15).join('\n');
        result.error = report === null ? `no JSON report (exit ${code ?? signal}): ${tailText}` : `exit ${code}: ${(report.problems ?? []).join('; ')}`;
      }
      resolve(result);
    });
  });
}

/** `--batch K` for onceprint's benches; nothing with K = 1, so that their command line stays what it was. */
const batchArgs = (opts) => (opts.batch > 1 ? ['--batch', String(opts.batch)] : []);

async function onceprintSubmit(opts, dir, share, name) {
  const r = await runOnceprint(opts, dir, name, [
    'bench', 'submit', '--requests', String(opts.tasks), '--concurrency', String(opts.producers),
    '--duplicates', String(share), '--printers', String(opts.printers), '--warmup', String(opts.warmup),
    ...batchArgs(opts),
  ]);
  const p = r.report;
  // With --batch K > 1 the report counts submissions (`requests`) and HTTP requests
  // (`requests_http`) apart; its latency_ms are per submission (each its request's) and
  // http_latency_ms per request.
  const sent = opts.batch > 1 ? `${p?.requests} submissions in ${p?.requests_http} requests of up to ${p?.batch}` : `${p?.requests} requests`;
  log(
    p
      ? `  onceprint ${name}: ${fmtRate(p.accepted_per_sec)} accepted/s, ${fmtRate(p.duplicates_per_sec)} duplicate answers/s (${sent} in ${p.wall_seconds.toFixed(2)} s)` +
          (r.error ? `  PROBLEMS: ${r.error}` : '')
      : `  onceprint ${name}: FAILED ${r.error}`,
  );
  return r;
}

async function onceprintE2e(opts, dir, kill, name) {
  const args = [
    'bench', 'e2e', '--tasks', String(opts.tasks), '--printers', String(opts.printers),
    '--concurrency', String(opts.producers), ...batchArgs(opts),
  ];
  if (kill) args.push('--kill-agent-at', String(opts.killAt));
  const r = await runOnceprint(opts, dir, name, args);
  const p = r.report;
  const k = p?.agent_restart;
  log(
    p
      ? `  onceprint ${name}: ${fmtRate(p.printed_per_sec)} printed/s (${p.delivery?.printed_on_paper} in ${p.print_seconds.toFixed(2)} s)` +
          (k ? `; after the restart: next job ${fmtMs(k.resume_ms)}, ${k.in_flight_at_kill} in flight at the kill, ${p.delivery?.missing_in_doubt ?? 0} in_doubt` : '') +
          (r.error ? `  PROBLEMS: ${r.error}` : '')
      : `  onceprint ${name}: FAILED ${r.error}`,
  );
  return r;
}

// ---------------------------------------------------------------------------------------
// The report
// ---------------------------------------------------------------------------------------

const GUARANTEES = {
  bullmq:
    'Redis with AOF, appendfsync everysec: an add is answered before its write is on disk, so up to ~1 s of ' +
    'acknowledged jobs can be lost when the machine or Redis crashes. jobId makes an add idempotent while the job ' +
    'is kept. The worker\'s side effect is one line appended to a file (no fsync, no printer, no confirmation); a job ' +
    'whose worker dies stays active until its lock expires and a stalled check moves it back to wait, and then runs ' +
    'again (at least once: its side effect may happen twice). No audit trail, no ledger.',
  onceprint:
    'SQLite (WAL, synchronous=FULL) or PostgreSQL: every accepted task is committed and fsynced together with its ' +
    'audit event and its ledger charge before the 201 answer; a repeat gets the original task (200). Delivery is ' +
    'over HTTP to a store agent with an fsynced journal, to simulated ESC/POS printers that confirm each job ' +
    '(GS ( H printed-ACK); a task is printed only on that ACK, and what cannot be proved after a crash goes ' +
    'in_doubt to a person instead of being printed twice (exactly once on paper).',
};

const fmtRate = (v) => (v === null || v === undefined || !Number.isFinite(v) ? '—' : Math.round(v).toLocaleString('en-US'));
const fmtMs = (v) => (v === null || v === undefined ? 'never' : v >= 10_000 ? `${(v / 1000).toFixed(1)} s` : `${Math.round(v)} ms`);
const fmtRatio = (v) => (v === null || !Number.isFinite(v) ? '—' : `${v.toFixed(2)}×`);

function log(line) {
  console.error(line);
}

function ratioRow(measure, bull, once, target) {
  const ratio = bull && once ? once / bull : null;
  let verdict = '—';
  if (ratio !== null) {
    verdict = ratio >= target ? 'met' : `missed: ${Math.round((1 - ratio / target) * 100)} % short (${fmtRatio(ratio)} of ${target}×)`;
  }
  return { measure, bullmq: bull ?? null, onceprint: once ?? null, ratio, target: `≥ ${target}×`, verdict, text: [measure, fmtRate(bull), fmtRate(once), fmtRatio(ratio), `≥ ${target}×`, verdict] };
}

function buildTable(result) {
  const b = result.bullmq;
  const o = result.onceprint;
  const rows = [];
  // With --batch K > 1 the measures that submit in batches say so (result.options.batch is
  // there only then).
  const k = result.options.batch > 1 ? `, batches of ${result.options.batch}` : '';
  rows.push(ratioRow(`intake: accepted/s (${Math.round(result.options.duplicates * 100)} % duplicates${k})`, b?.intake?.accepted_per_sec, o?.intake?.report?.accepted_per_sec, 3));
  rows.push(ratioRow(`duplicate answers/s (${Math.round(result.options.duplicates_high * 100)} % duplicates${k})`, b?.duplicates?.duplicates_per_sec, o?.duplicates?.report?.duplicates_per_sec, 5));
  if (b?.intake_single) {
    rows.push(ratioRow(`intake, onceprint's batches vs BullMQ's add of one job`, b.intake_single.accepted_per_sec, o?.intake?.report?.accepted_per_sec, 3));
  }
  if (b?.duplicates_single) {
    rows.push(ratioRow(`duplicate answers, onceprint's batches vs BullMQ's add of one job`, b.duplicates_single.duplicates_per_sec, o?.duplicates?.report?.duplicates_per_sec, 5));
  }
  rows.push(ratioRow(`printed/s (${result.options.printers} printers${k})`, b?.printed?.printed_per_sec, o?.printed?.report?.printed_per_sec, 2));
  const bResume = b?.restart?.restart?.resume_ms ?? null;
  const bStalled = b?.restart?.restart?.stalled_completed_ms ?? null;
  const oRestart = o?.restart?.report?.agent_restart ?? null;
  const oResume = oRestart?.resume_ms ?? null;
  const resumeVerdict = o?.restart ? (oResume !== null && oResume <= 5000 ? 'met' : `missed (${fmtMs(oResume)})`) : '—';
  rows.push({
    measure: 'after kill -9 + restart: next job printed',
    bullmq: bResume,
    onceprint: oResume,
    ratio: bResume !== null && oResume ? bResume / oResume : null,
    target: '≤ 5 s (onceprint)',
    verdict: resumeVerdict,
    text: [
      'after kill -9 + restart: next job printed',
      b?.restart ? fmtMs(bResume) : '—',
      o?.restart ? fmtMs(oResume) : '—',
      '—', '≤ 5 s', resumeVerdict,
    ],
  });
  const oInDoubt = o?.restart?.report?.delivery?.missing_in_doubt;
  const oInFlight = oRestart?.in_flight_at_kill;
  rows.push({
    measure: 'jobs held by the killed worker / agent',
    bullmq: bStalled,
    onceprint: oInFlight ?? null,
    ratio: null,
    target: '',
    verdict: '',
    text: [
      'jobs held by the killed worker / agent',
      b?.restart ? `${b.restart.restart?.active_at_kill ?? '?'} active: done ${fmtMs(bStalled)} after restart, ${b.restart.on_paper.ran_twice} ran twice` : '—',
      o?.restart ? `${oInFlight ?? '?'} in flight: ${oInDoubt ?? 0} in_doubt, ${o.restart.report?.delivery?.duplicated_tasks ?? 0} twice` : '—',
      '', '', '',
    ],
  });
  return rows;
}

function renderTable(rows) {
  const head = ['measure', 'BullMQ', 'onceprint', 'ratio', 'target', 'verdict'];
  const all = [head, ...rows.map((r) => r.text.map(String))];
  const widths = head.map((_, i) => Math.max(...all.map((r) => r[i].length)));
  const line = (r) => `| ${r.map((c, i) => c.padEnd(widths[i])).join(' | ')} |`;
  return [line(head), `|${widths.map((w) => '-'.repeat(w + 2)).join('|')}|`, ...rows.map((r) => line(r.text.map(String)))].join('\n');
}

// ---------------------------------------------------------------------------------------
// Main
// ---------------------------------------------------------------------------------------

async function main(opts) {
  if (opts.skipBullmq && opts.skipOnceprint) fail('nothing to do: both sides skipped');
  if (!opts.skipOnceprint && !opts.onceprint) fail('--onceprint PATH is needed (compare.sh passes target/release/onceprint)');
  const mods = opts.skipBullmq ? null : loadModules(opts.modules);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'onceprint-compare-'));
  const cleanup = () => {
    killChildren();
    if (!opts.keepDir) fs.rmSync(dir, { recursive: true, force: true });
  };
  process.on('exit', cleanup);
  for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
    process.on(sig, () => {
      log(`compare: ${sig}, stopping`);
      process.exit(130);
    });
  }

  const result = {
    started_at: new Date().toISOString(),
    machine: machineLine(),
    load_before: loadLine(),
    options: {
      tasks: opts.tasks, duplicates: opts.duplicates, duplicates_high: opts.duplicatesHigh, printers: opts.printers,
      phases: [...opts.phases], producers: opts.producers, redis_connections: opts.connections, warmup: opts.warmup, kill_at: opts.killAt,
      database: opts.database ?? 'sqlite',
      // Only with --batch K > 1, so that a --batch 1 result is what it was before.
      ...(opts.batch > 1 ? { batch: opts.batch } : {}),
    },
    versions: { node: process.version },
    guarantees: GUARANTEES,
    bullmq: opts.skipBullmq ? null : {},
    onceprint: opts.skipOnceprint ? null : {},
  };
  if (mods) Object.assign(result.versions, mods.versions);
  if (!opts.skipOnceprint) {
    try {
      result.versions.onceprint = execFileSync(opts.onceprint, ['--version'], { encoding: 'utf8' }).trim().replace(/^onceprint\s+/, '');
    } catch (e) {
      fail(`cannot run ${opts.onceprint}: ${e.message}`);
    }
  }
  let redis = null;
  if (mods) {
    redis = await startRedis(opts, dir, mods.Redis);
    result.versions.redis = redis.version;
  }
  const batched = opts.batch > 1 ? `, batches of ${opts.batch} (at once per producer call, addBulk per queue / POST /v1/print-task-batches)` : '';
  log(`compare: ${result.machine}; load ${result.load_before}; ${opts.tasks} tasks, ${opts.printers} printers, ${opts.producers} producers${batched}; temp ${dir}`);

  // Interleaved, one measure at a time on both sides, so that a change of load on the
  // shared machine hits both sides of a ratio alike.
  const once = !opts.skipOnceprint;
  if (opts.phases.has('intake')) {
    log('intake');
    if (mods) result.bullmq.intake = await bullIntake(mods, redis, opts, opts.duplicates, 'intake');
    if (once) result.onceprint.intake = await onceprintSubmit(opts, dir, opts.duplicates, 'intake');
    // With batches, BullMQ's one-job add too: the targets are stated against
    // queue.add, and a team would weigh onceprint's batch against both.
    if (mods && opts.batch > 1) {
      result.bullmq.intake_single = await bullIntake(mods, redis, { ...opts, batch: 1 }, opts.duplicates, 'intake, one add per job');
    }
  }
  if (opts.phases.has('duplicates')) {
    log('duplicate answers');
    if (mods) result.bullmq.duplicates = await bullIntake(mods, redis, opts, opts.duplicatesHigh, 'duplicates');
    if (once) result.onceprint.duplicates = await onceprintSubmit(opts, dir, opts.duplicatesHigh, 'duplicates');
    if (mods && opts.batch > 1) {
      result.bullmq.duplicates_single = await bullIntake(mods, redis, { ...opts, batch: 1 }, opts.duplicatesHigh, 'duplicates, one add per job');
    }
  }
  if (opts.phases.has('printed')) {
    log('printed');
    if (mods) result.bullmq.printed = await bullPrinted(mods, redis, opts, dir, false);
    if (once) result.onceprint.printed = await onceprintE2e(opts, dir, false, 'printed');
  }
  if (opts.phases.has('restart')) {
    log('kill -9 and restart');
    if (mods) result.bullmq.restart = await bullPrinted(mods, redis, opts, dir, true);
    if (once) result.onceprint.restart = await onceprintE2e(opts, dir, true, 'restart');
  }

  if (redis) {
    const exited = new Promise((resolve) => redis.proc.once('exit', resolve));
    redis.proc.kill('SIGTERM');
    await Promise.race([exited, sleep(5000)]);
  }
  result.load_after = loadLine();
  result.finished_at = new Date().toISOString();
  result.table = buildTable(result).map(({ text, ...row }) => row);

  const problems = [];
  for (const [side, phases] of Object.entries({ bullmq: result.bullmq ?? {}, onceprint: result.onceprint ?? {} })) {
    for (const [phase, r] of Object.entries(phases)) {
      for (const p of r?.problems ?? []) problems.push(`${side} ${phase}: ${p}`);
      if (r?.error) problems.push(`${side} ${phase}: ${r.error}`);
    }
  }
  result.problems = problems;

  const out = [];
  out.push('');
  out.push(`onceprint vs BullMQ — ${result.machine}; load before ${result.load_before}, after ${result.load_after}`);
  out.push(
    `versions: onceprint ${result.versions.onceprint ?? '—'}, bullmq ${result.versions.bullmq ?? '—'}, ioredis ${result.versions.ioredis ?? '—'}, ` +
      `redis ${result.versions.redis ?? '—'}, node ${result.versions.node}; backend ${result.options.database.startsWith('postgres') ? 'postgres' : 'sqlite'}`,
  );
  out.push(`workload: ${opts.tasks} submissions/tasks, ${opts.printers} printers (queues), ${opts.producers} producers, warm-up ${opts.warmup}${batched}`);
  if (opts.batch > 1) {
    out.push(
      `batches: each producer call carries ${opts.batch} consecutive jobs/tasks (BullMQ: sent at once, one queue.addBulk per queue with several of them, a plain add for a single one, awaited together; ` +
        'onceprint: one POST /v1/print-task-batches); rates count jobs/tasks; in the JSON, BullMQ add_latency_ms and onceprint ' +
        'http_latency_ms are per call, onceprint latency_ms per task (its call\'s)',
    );
  }
  out.push('');
  out.push(renderTable(buildTable(result)));
  out.push('');
  out.push(`BullMQ guarantees: ${GUARANTEES.bullmq}`);
  out.push(`onceprint guarantees: ${GUARANTEES.onceprint}`);
  if (problems.length) {
    out.push('');
    out.push('problems:');
    for (const p of problems) out.push(`  - ${p}`);
  }
  console.log(out.join('\n'));
  if (opts.jsonOut) fs.writeFileSync(opts.jsonOut, `${JSON.stringify(result, null, 2)}\n`);
  if (opts.keepDir) log(`compare: kept ${dir}`);
  return problems.length === 0 ? 0 : 1;
}

/** Medians over several runs' JSON results, per measure. */
function medianReport(files) {
  if (files.length === 0) fail('--median needs the JSON files of the runs');
  const runs = files.map((f) => {
    try {
      return JSON.parse(fs.readFileSync(f, 'utf8'));
    } catch (e) {
      return fail(`cannot read ${f}: ${e.message}`);
    }
  });
  const median = (values) => {
    const v = values.filter((x) => x !== null && x !== undefined && Number.isFinite(x)).sort((a, b) => a - b);
    if (v.length === 0) return null;
    return v.length % 2 ? v[(v.length - 1) / 2] : (v[v.length / 2 - 1] + v[v.length / 2]) / 2;
  };
  const head = ['measure', 'BullMQ', 'onceprint', 'ratio', 'runs (ratio)', 'target'];
  const rows = [];
  const measures = runs[0].table.map((r) => r.measure);
  for (const [i, measure] of measures.entries()) {
    const cells = runs.map((r) => r.table[i] ?? {});
    const isMs = measure.startsWith('after kill');
    const fmt = isMs ? fmtMs : fmtRate;
    if (measure.startsWith('jobs held')) continue;
    const ratios = cells.map((c) => c.ratio);
    rows.push([
      measure,
      fmt(median(cells.map((c) => c.bullmq))),
      fmt(median(cells.map((c) => c.onceprint))),
      isMs ? '—' : fmtRatio(median(ratios)),
      isMs ? cells.map((c) => `${fmtMs(c.bullmq)} / ${fmtMs(c.onceprint)}`).join(' · ') : ratios.map(fmtRatio).join(' · '),
      cells[0].target ?? '',
    ]);
  }
  const stalled = runs.map((r) => r.bullmq?.restart?.restart?.stalled_completed_ms ?? null);
  const twice = runs.map((r) => r.bullmq?.restart?.on_paper?.ran_twice ?? null);
  const inDoubt = runs.map((r) => r.onceprint?.restart?.report?.delivery?.missing_in_doubt ?? null);
  const all = [head, ...rows];
  const widths = head.map((_, i) => Math.max(...all.map((r) => String(r[i]).length)));
  const line = (r) => `| ${r.map((c, i) => String(c).padEnd(widths[i])).join(' | ')} |`;
  console.log(`${runs.length} runs: ${runs.map((r) => `${r.started_at} (load ${r.load_before} → ${r.load_after})`).join('; ')}`);
  console.log([line(head), `|${widths.map((w) => '-'.repeat(w + 2)).join('|')}|`, ...rows.map(line)].join('\n'));
  console.log(
    `BullMQ jobs active at the kill, completed after the restart in: ${stalled.map(fmtMs).join(' · ')}; ran twice: ${twice.join(' · ')}. ` +
      `onceprint tasks in_doubt after the agent kill: ${inDoubt.join(' · ')}.`,
  );
}

const opts = parseOptions();
if (opts.median) {
  medianReport(opts.median);
} else if (opts.role === 'worker') {
  if (!opts.redisPort || !opts.out) fail('the worker role needs --redis-port and --out');
  await workerChild(opts);
} else {
  try {
    process.exitCode = await main(opts);
  } catch (e) {
    console.error(`compare: ${e?.stack ?? e}`);
    process.exitCode = 1;
  } finally {
    killChildren();
    // Everything is closed by now; this only guards against a handle left open by a
    // failed phase keeping the process alive.
    setTimeout(() => process.exit(process.exitCode), 1000).unref();
  }
}
