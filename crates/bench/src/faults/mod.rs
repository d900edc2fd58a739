//! The fault run behind `onceprint bench faults`: the proof of "print exactly once, lose
//! nothing, every lane drains" under printer faults, crashes and client retry storms.
//!
//! It starts, from the given executable, a broker (`serve`, on a fresh SQLite file or a
//! fresh PostgreSQL schema, with short delivery timings and four print types of
//! different priorities: [`schedule::broker_config`]), one `printer-sim` with P printers
//! and a paper log, and one store agent. It then runs a seeded plan for a fault window:
//!
//! - N tasks submitted at an even pace over several keep-alive connections, spread over
//!   the printers and print types, a share of them repeated 1–4 times (some racing the
//!   original), every request retried until it gets a final answer ([`submit`]);
//! - printer faults through the simulator's control API — paper out, cover open,
//!   offline, a crash mid-job, slow printing — and `kill -9` of the agent (restarted on
//!   the same state directory and agent id) and of the broker (restarted on the same
//!   address and database) at random moments ([`schedule`], [`chaos`]).
//!
//! With `--nodes N` (PostgreSQL only) the broker is N `serve` nodes on one database behind
//! the bench's load balancer ([`crate::lb`]); the agent, the printers that call in and the
//! submitters all talk to the balancer, and the broker kills go to the nodes in turn, each
//! node restarted on its own port. With `--redis` the run starts its own `redis-server`,
//! gives every node `--redis-url`, and kills Redis with `kill -9` once, half-way through
//! the fault window, restarting it a second later: intake must not notice.
//!
//! When every submission is answered and every planned fault done, faults stop (all
//! cleared, every process up) and the run waits until no task of the store is `pending`,
//! `sent` or `retrying`, bounded by the drain timeout. The verdict ([`check`]) comes from
//! the paper log first and the broker second: duplicates, lost tasks, honest doubt,
//! stalled lanes with their tasks, stray paper, audit trails; plus every answer checked
//! against the intake contract (only 201/200, one task id per key).
//!
//! It owns the fault run's plan, drivers and verdict; the processes, the paper log and
//! the HTTP plumbing are the bench crate's shared pieces. It must never talk to anything
//! but the processes it started, on 127.0.0.1, and the PostgreSQL database it was given
//! (where it only writes inside the schema it created, and drops that schema afterwards);
//! and it must leave nothing running, also when it fails: every child is stopped at the
//! end, killed on drop when the bench errors out, and killed by the kernel when the bench
//! itself dies (see `procs::die_with_parent`).

pub mod chaos;
pub mod check;
pub mod events;
pub mod fleet;
mod report;
pub mod schedule;
pub mod submit;
pub mod watch;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::header::HeaderValue;
use hyper::Method;
use serde_json::Value;

pub use check::{Attention, DoubtCase, DoubtCheck, Findings, LaneTask, StalledLane, TaskFinding, Verdict};
pub use report::{AuditCheck, FaultsReport, SubmissionStats};

use crate::broker::{Broker, Launch};
use crate::http::{pct_encode, snippet, Conn};
use crate::paper::{unix_now_us, PaperWatcher};
use crate::plan::SplitMix64;
use crate::procs::{agent_args, note_stop, Proc};
use crate::report::machine_line;
use crate::setup::{self, Deployment};
use crate::sim::{start_sim, Sim, MAX_PRINTERS};
use crate::verify::{self, ListedTask};
use crate::{random_hex, BenchError, STORE_ID};
use chaos::{AgentCtx, Outage};
use submit::SubmitRun;

/// The agent's id: given explicitly, so that every life of the agent is the same agent
/// to the broker (the state directory would keep a generated one too).
const AGENT_ID: &str = "bench-agent";
/// The wall clock of each life of the agent, off the machine's by this much (in turn): a
/// shop PC whose clock jumps an hour or a day either way between restarts. The broker
/// must order the agent's sessions by its own clock whatever these say.
const AGENT_CLOCKS: [i64; 5] = [0, 3_600_000, -3_600_000, 86_400_000, -300_000];
/// Attempts that failed this soon after an outage ended still count as explained by it:
/// connections opened into the dying broker, or just after it came back, may fail.
const OUTAGE_GRACE: Duration = Duration::from_secs(2);
/// How often the drain looks whether work is left.
const DRAIN_POLL: Duration = Duration::from_millis(250);
/// After the drain the paper log must be quiet this long before it is judged: jobs a
/// printer buffered while blocked print as soon as its faults clear.
const PAPER_QUIET: Duration = Duration::from_secs(1);
const PAPER_QUIET_MAX: Duration = Duration::from_secs(15);
/// How long after the drain the task events may still arrive.
const EVENTS_WAIT: Duration = Duration::from_secs(30);
/// Connections fetching audit trails at once.
const AUDIT_CONNECTIONS: usize = 4;

/// What `run_faults` should do.
#[derive(Debug, Clone)]
pub struct FaultsOptions {
    /// The `onceprint` executable: broker, agent and printer simulator.
    pub exe: PathBuf,
    /// `None`: a fresh SQLite file. `postgres://…`: a fresh schema there, dropped after.
    pub database: Option<String>,
    pub tasks: usize,
    /// The store agent's printers (raw TCP, simulated by one `printer-sim`).
    pub printers: usize,
    /// Printers that call the broker (CloudPRNT, Epson, MQTT), beside the agent's.
    pub fleet: fleet::Fleet,
    /// Submission connections.
    pub concurrency: usize,
    /// Seed of the submission plan and of the chaos.
    pub seed: u64,
    /// Share of tasks whose submission is repeated 1–4 times.
    pub repeat_share: f64,
    /// Submissions are spread over this window, and faults and kills fall into it.
    pub fault_window: Duration,
    /// Mean quiet time between two faults of one printer.
    pub fault_every: Duration,
    pub agent_kills: usize,
    pub broker_kills: usize,
    /// Broker nodes on one PostgreSQL database behind the load balancer (1: no balancer).
    pub nodes: usize,
    /// Start a Redis for the nodes' shared first gate, and kill it once mid-run.
    pub redis: bool,
    /// How long the lanes get to drain once faults stop.
    pub drain_timeout: Duration,
    /// Submitting and the fault phase must end within this (the drain comes after).
    pub timeout: Duration,
    /// Audit trails checked: every task not `printed`, and printed ones up to this many
    /// in all (a seeded sample; all when it is at least `tasks`).
    pub audit_sample: usize,
    /// Keep the run's directory (logs of every process, paper log, agent journal, SQLite
    /// file) instead of removing it, and name it in the report: to look behind a finding.
    pub keep_dir: bool,
}

impl FaultsOptions {
    /// The defaults for a given executable.
    pub fn new(exe: impl Into<PathBuf>) -> Self {
        Self {
            exe: exe.into(),
            database: None,
            tasks: 10_000,
            printers: 8,
            fleet: fleet::Fleet::default(),
            concurrency: 16,
            seed: 1,
            repeat_share: 0.30,
            fault_window: Duration::from_secs(30),
            fault_every: Duration::from_secs(4),
            agent_kills: 5,
            broker_kills: 3,
            nodes: 1,
            redis: false,
            drain_timeout: Duration::from_secs(120),
            timeout: Duration::from_secs(600),
            audit_sample: 1_000,
            keep_dir: false,
        }
    }
}

fn validate(opts: &FaultsOptions) -> Result<(), BenchError> {
    let bad = |m: String| Err(BenchError::InvalidOptions(m));
    if opts.tasks == 0 || u32::try_from(opts.tasks).is_err() {
        return bad("tasks must be between 1 and 4294967295".into());
    }
    if opts.printers == 0 || opts.printers > MAX_PRINTERS {
        return bad(format!("printers must be 1–{MAX_PRINTERS}"));
    }
    if opts.fleet.total() > 200 {
        return bad("at most 200 calling-in printers (one process each)".into());
    }
    if opts.concurrency == 0 || opts.concurrency > 1_000 {
        return bad("concurrency must be 1–1000".into());
    }
    if !(0.0..=1.0).contains(&opts.repeat_share) {
        return bad("the repeat share must be in [0, 1]".into());
    }
    if opts.fault_window < Duration::from_secs(1) {
        return bad("the fault window must be at least 1 s".into());
    }
    if opts.fault_every < Duration::from_millis(100) {
        return bad("faults may come at most every 100 ms per printer".into());
    }
    if opts.agent_kills > 100 || opts.broker_kills > 100 {
        return bad("at most 100 kills of each process".into());
    }
    if opts.drain_timeout.is_zero() {
        return bad("the drain timeout must be positive".into());
    }
    if opts.timeout <= opts.fault_window {
        return bad(format!(
            "the timeout ({} s) must be longer than the fault window ({} s)",
            opts.timeout.as_secs(),
            opts.fault_window.as_secs()
        ));
    }
    if opts.nodes == 0 || opts.nodes > crate::cluster::MAX_NODES {
        return bad(format!("nodes must be 1–{}", crate::cluster::MAX_NODES));
    }
    let postgres = opts.database.as_deref().is_some_and(|d| d.starts_with("postgres"));
    if (opts.nodes > 1 || opts.redis) && !postgres {
        return bad("--nodes above 1 and --redis need --database postgres://… (nodes share one database)".into());
    }
    crate::validate_database(opts.database.as_deref())
}

/// Runs the whole fault run: start everything, set up, submit under faults, stop the
/// faults, drain, judge, stop everything.
///
/// Returns `Err` only when the run could not be carried out (a process would not start,
/// set-up failed, the simulator went away); everything the broker, agent or printers got
/// wrong in a run that could is listed in [`FaultsReport::problems`].
pub async fn run_faults(opts: FaultsOptions) -> Result<FaultsReport, BenchError> {
    validate(&opts)?;
    let tmp = crate::run_dir("onceprint-bench-faults-")?;
    let dir = tmp.path();
    let opts = &opts;
    let result = crate::on_database(opts.database.as_deref(), dir, |backend, url| async move {
        let mut report = run_on(opts, &url, dir).await?;
        report.backend = backend.to_string();
        Ok(report)
    })
    .await;
    if !opts.keep_dir {
        return result;
    }
    // Every process is stopped by now; what stays is files.
    let kept = tmp.keep();
    match result {
        Ok(mut report) => {
            report.kept_dir = Some(kept.display().to_string());
            Ok(report)
        }
        Err(e) => Err(BenchError::Kept { dir: kept.display().to_string(), source: Box::new(e) }),
    }
}

/// The processes of a run. Drivers take them in and out while they kill and restart them;
/// whatever is here at the end is stopped.
struct Running {
    /// The broker nodes, in the order of their launches; `None` while one is down.
    brokers: Vec<Option<Broker>>,
    /// In front of the nodes when there are several.
    lb: Option<crate::lb::LoadBalancer>,
    redis: Option<crate::cluster::Redis>,
    agent: Option<Proc>,
    sim: Option<Sim>,
    /// One simulator per calling-in printer.
    callers: Vec<Proc>,
    mosquitto: Option<Proc>,
}

/// Starts the processes, drives the run, and always stops everything.
async fn run_on(opts: &FaultsOptions, database_url: &str, dir: &Path) -> Result<FaultsReport, BenchError> {
    let started = Instant::now();
    let sim = start_sim(&opts.exe, opts.printers, dir).await?;
    let (mosquitto, mqtt_port) = if opts.fleet.mqtt + opts.fleet.mqtt_star > 0 {
        let (m, port) = fleet::start_mosquitto(dir).await?;
        (Some(m), Some(port))
    } else {
        (None, None)
    };
    let config = dir.join("broker.toml");
    std::fs::write(&config, format!("{}{}", fleet::broker_config(mqtt_port), schedule::broker_config()))
        .map_err(|e| BenchError::io(format!("writing {}", config.display()), e))?;
    let admin_token = random_hex(24)?;
    let redis = if opts.redis { Some(crate::cluster::Redis::start(dir).await?) } else { None };
    // `--redis-url` only with `--redis`, so that the run works with brokers that lack it.
    let extra: Vec<String> = redis.iter().flat_map(|r| ["--redis-url".to_string(), r.url()]).collect();
    let nodes =
        crate::cluster::start_nodes(opts.nodes, &opts.exe, database_url, &admin_token, dir, Some(&config), &extra)
            .await?;
    let (brokers, launches): (Vec<_>, Vec<_>) = nodes.into_iter().map(|(b, l)| (Some(b), l)).unzip();
    let lb = if launches.len() > 1 { Some(crate::cluster::balance(&launches).await?) } else { None };
    let addr = lb.as_ref().map_or(launches[0].listen, |lb| lb.addr);
    let mut running = Running { brokers, lb, redis, agent: None, sim: Some(sim), callers: Vec::new(), mosquitto };
    let mqtt_port = mqtt_port.unwrap_or(0);

    let result = drive(opts, &mut running, &launches, addr, dir, &admin_token, started, mqtt_port).await;
    let launch = &launches[0];

    let tails = result.is_err().then(|| {
        let tail = |p: Option<&Proc>| p.map_or("(not running)".to_string(), Proc::log_tail);
        format!(
            "\n--- broker log (last lines) ---\n{}\n--- agent log ---\n{}\n--- printer-sim log ---\n{}",
            crate::procs::log_tail(&launch.log_path, 40),
            tail(running.agent.as_ref()),
            tail(running.sim.as_ref().map(|s| &s.proc))
        )
    });
    // The agent first (it hands back what it holds and flushes its acks), then the
    // printers, then the broker.
    let mut stop_problems = Vec::new();
    if let Some(agent) = running.agent.take() {
        note_stop("agent", agent.stop().await, &mut stop_problems);
    }
    if let Some(sim) = running.sim.take() {
        note_stop("printer-sim", sim.proc.stop().await, &mut stop_problems);
    }
    for caller in running.callers.drain(..) {
        note_stop("printer-sim (calling in)", caller.stop().await, &mut stop_problems);
    }
    for broker in running.brokers.iter_mut().filter_map(Option::take) {
        note_stop("broker", broker.stop().await, &mut stop_problems);
    }
    drop(running.lb.take());
    if let Some(r) = running.redis.as_mut() {
        r.stop().await;
    }
    if let Some(m) = running.mosquitto.take() {
        // Its exit status after SIGTERM is not under test.
        let _ = m.stop().await;
    }
    let mut report = result.map_err(|e| e.with_logs(tails))?;
    report.problems.extend(stop_problems);
    report.total_seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// Set-up, the fault phase, the drain and the verdict.
#[allow(clippy::too_many_arguments)]
async fn drive(
    opts: &FaultsOptions,
    running: &mut Running,
    launches: &[Launch],
    addr: SocketAddr,
    dir: &Path,
    admin_token: &str,
    started: Instant,
    mqtt_port: u16,
) -> Result<FaultsReport, BenchError> {
    let (control, first_port, paper_log) = match &running.sim {
        Some(s) => (s.control, s.first_port, s.paper_log.clone()),
        None => return Err(BenchError::Protocol { context: "set-up".into(), detail: "no simulator".into() }),
    };
    let printer_addr = |i: usize| SocketAddr::from(([127, 0, 0, 1], first_port + i as u16));
    let mut conn = connect(addr, "set-up").await?;
    let addresses: Vec<String> = (0..opts.printers).map(|p| format!("tcp://{}", printer_addr(p))).collect();
    let Deployment { auth, agent_token } = setup::deploy(&mut conn, admin_token, &addresses).await?;
    // Every task event goes to the bench's receiver, for "one event id per change".
    let sink = events::EventSink::start().await?;
    setup::setup_call(
        &mut conn,
        &auth,
        "/v1/webhooks",
        serde_json::json!({"id": "bench-events", "url": sink.url(), "events": events::KINDS}),
    )
    .await?;
    let mqtt = (mqtt_port > 0).then_some(mqtt_port);
    let place = fleet::Place {
        exe: &opts.exe,
        broker: addr,
        mqtt_port: mqtt,
        paper_log: &paper_log,
        dir,
        poll_interval_ms: fleet::DEFAULT_POLL_INTERVAL_MS,
    };
    let callers = fleet::start(&mut conn, &auth, opts.fleet, opts.printers, place).await?;
    running.callers.extend(callers.procs);
    let targets = callers.printers;
    // With CloudPRNT printers, a station across transports: the first CloudPRNT printer,
    // backed up by the agent's p0. Its primary falls silent once in the run.
    let station = (opts.fleet.cloudprnt > 0).then_some(opts.printers);
    if let Some(primary) = station {
        setup::setup_call(
            &mut conn,
            &auth,
            "/v1/stations",
            serde_json::json!({"id": schedule::STATION_ID, "store_id": STORE_ID, "printers": [format!("p{primary}"), "p0"],
                               "failover_after_ms": schedule::STATION_FAILOVER_AFTER_MS}),
        )
        .await?;
    }
    drop(conn);
    let all_printers = opts.printers + opts.fleet.total();
    let target = |i: usize| match i.checked_sub(opts.printers) {
        Some(j) => targets[j].clone(),
        None => (control, printer_addr(i).to_string()),
    };

    let watcher =
        PaperWatcher::start(paper_log, opts.tasks).map_err(|e| BenchError::io("starting the paper-log reader", e))?;
    let args = agent_args(addr, &agent_token, &dir.join("agent"), Some(AGENT_ID));
    let agent_log = dir.join("agent.log");
    let agent_ctx = AgentCtx::new(&opts.exe, &args, &agent_log, &AGENT_CLOCKS);
    running.agent = Some(agent_ctx.spawn()?);
    // An agent that refuses its flags or state directory exits at once: say so clearly
    // rather than wait for paper that never comes.
    tokio::time::sleep(Duration::from_millis(300)).await;
    if let Some(status) = running.agent.as_mut().and_then(Proc::exited) {
        return Err(BenchError::Protocol {
            context: "starting the agent".into(),
            detail: format!("it exited with {status}:\n{}", crate::procs::log_tail(&agent_log, 40)),
        });
    }

    let window_ms = opts.fault_window.as_millis() as u64;
    let subs =
        Arc::new(schedule::submissions(opts.tasks, all_printers, opts.repeat_share, window_ms, opts.seed, station));
    let plan = schedule::chaos(schedule::ChaosPlan {
        printers: all_printers,
        callers_from: opts.printers,
        silent: station,
        window_ms,
        fault_every_ms: opts.fault_every.as_millis() as u64,
        agent_kills: opts.agent_kills,
        broker_kills: opts.broker_kills,
        seed: opts.seed,
    });

    // The fault phase: submissions, printer faults and kills side by side, with the lanes
    // watched from outside until they have drained.
    let lane_watch = watch::Watching::start(addr);
    let t0 = Instant::now();
    let t0_unix_us = unix_now_us();
    let deadline = t0 + opts.timeout;
    let (mut agent_notes, mut broker_notes) = (Vec::new(), Vec::new());
    let phase = async {
        tokio::try_join!(
            async {
                Ok::<SubmitRun, BenchError>(
                    submit::submit_all(addr, auth.clone(), subs.clone(), opts.concurrency, t0, deadline).await,
                )
            },
            chaos::printer_faults(&target, &plan.printer_events, t0),
            chaos::agent_kills(&mut running.agent, &agent_ctx, &plan.agent_kills, t0, &mut agent_notes),
            chaos::broker_kills(&mut running.brokers, launches, &plan.broker_kills, t0, &mut broker_notes),
            redis_kill(&mut running.redis, t0 + opts.fault_window / 2),
        )
    };
    // Submissions give up at the deadline by themselves; the margin is for a driver stuck
    // restarting a process that will not come up.
    let (submitted, injected, agent_kills, (broker_kills, outages), redis_killed_at) =
        tokio::time::timeout_at((deadline + Duration::from_secs(60)).into(), phase).await.map_err(|_| {
            BenchError::Protocol {
                context: "the fault phase".into(),
                detail: format!("it did not end within {:?}", opts.timeout),
            }
        })??;
    let fault_phase_seconds = t0.elapsed().as_secs_f64();
    let mut problems: Vec<String> = agent_notes.into_iter().chain(broker_notes).collect();

    // Faults stop: every printer healthy, every process up.
    chaos::put(&mut None, control, &schedule::clear_all_fields()).await?;
    // A fleet process holds many printers behind one control endpoint; a PUT without a
    // printer's name clears all of them.
    let caller_controls: std::collections::BTreeSet<_> = targets.iter().map(|(c, _)| *c).collect();
    for caller_control in caller_controls {
        chaos::put(&mut None, caller_control, &schedule::clear_all_fields()).await?;
    }
    ensure_up(running, launches, &agent_ctx, &mut problems).await?;
    let drain_start = Instant::now();
    let mut conn = connect(addr, "draining").await?;
    let drained = loop {
        if !verify::any_active(&mut conn, &auth).await? {
            break true;
        }
        if drain_start.elapsed() >= opts.drain_timeout {
            break false;
        }
        tokio::time::sleep(DRAIN_POLL).await;
    };
    let drain_seconds = drain_start.elapsed().as_secs_f64();
    let lanes = lane_watch.finish();
    if !lanes.stalled.is_empty() {
        problems.push(format!(
            "the broker reported stalled lanes (printer.stalled: work and no progress for stall_after_ms): {}",
            lanes.stalled.iter().cloned().collect::<Vec<_>>().join(", ")
        ));
    }
    wait_for_quiet_paper(&watcher).await;
    let mut tally =
        watcher.finish().map_err(|detail| BenchError::Protocol { context: "reading the paper log".into(), detail })?;
    // A ticket that failed over has two tasks under its key.
    let listed = verify::list_states(&mut conn, &auth, &format!("store_id={STORE_ID}"), opts.tasks * 2).await?;
    // Pictures printed by Star printers carry no readable marker, only their job token,
    // which names the task.
    let marker_of_task: std::collections::HashMap<&str, u32> =
        listed.iter().filter_map(|t| crate::e2e::marker_of(&t.biz_no).map(|m| (t.task_id.as_str(), m))).collect();
    tally.resolve_jobs(|task| marker_of_task.get(task).copied());
    // Events are delivered after their change commits, with retries: give the last ones a
    // moment to arrive before judging.
    let printed: std::collections::BTreeSet<String> =
        listed.iter().filter(|t| t.state == "printed").map(|t| t.task_id.clone()).collect();
    let events_by = Instant::now() + EVENTS_WAIT;
    while Instant::now() < events_by && sink.check(&printed).printed_without_event > 0 {
        tokio::time::sleep(DRAIN_POLL).await;
    }
    let event_check = sink.check(&printed);
    if event_check.changes_with_two_events > 0 {
        problems.push(format!(
            "{} changes produced two or more events (one event id per change), e.g. {}",
            event_check.changes_with_two_events,
            event_check.examples.join("; ")
        ));
    }
    if event_check.printed_without_event > 0 {
        problems.push(format!(
            "{} printed tasks had no task.printed event within {} s of the drain",
            event_check.printed_without_event,
            EVENTS_WAIT.as_secs()
        ));
    }

    // Answers first: the intake contract under retries and kills. A ticket that failed
    // over lives on in a successor under the same key, and a submission repeated after
    // the failover is answered with the successor: both are the submission's task.
    let moved: std::collections::HashMap<&str, &str> =
        listed.iter().filter_map(|t| t.moved_from.as_deref().map(|from| (t.task_id.as_str(), from))).collect();
    let first_of = |id: &str| -> Box<str> {
        let mut cur = id;
        for _ in 0..16 {
            match moved.get(cur) {
                Some(from) => cur = from,
                None => break,
            }
        }
        cur.into()
    };
    let outcomes: Vec<crate::load::Outcome> = submitted
        .outcomes
        .iter()
        .map(|o| crate::load::Outcome { task_id: o.task_id.as_deref().map(first_of), ..o.clone() })
        .collect();
    let lost_answers = submitted.keys_with_lost_answers(&subs);
    let accepted = verify::check_answers("fault-run", &subs.plan, &outcomes, &lost_answers, &mut problems);
    let pairs: Vec<(String, String)> =
        listed.iter().filter(|t| t.moved_from.is_none()).map(|t| (t.biz_no.clone(), t.task_id.clone())).collect();
    verify::check_listing(&accepted, &pairs, &mut problems);
    let submissions = submission_stats(&subs, &submitted, &outages, accepted.len(), &mut problems);

    // Then paper against the broker.
    if !drained {
        problems.push(format!(
            "the lanes did not drain within {} s of the faults stopping (see stalled lanes)",
            opts.drain_timeout.as_secs()
        ));
    }
    if tally.bad_times > 0 {
        problems.push(format!("{} paper-log lines had an unreadable `at` time", tally.bad_times));
    }
    let verdict = check::check(&tally, &listed, &accepted, &mut problems);
    let (audit, doubt_cases) = audit_trails(addr, &auth, &listed, opts.audit_sample, opts.seed).await?;
    let injected_at = injected_timeline(&plan, &agent_kills, &broker_kills, t0_unix_us, opts.printers);
    let doubt = check::check_doubt(&doubt_cases, &injected_at, &mut problems);
    if audit.inconsistent > 0 {
        problems.push(format!(
            "{} of {} audit trails are inconsistent, e.g. {}",
            audit.inconsistent,
            audit.checked,
            audit.examples.join("; ")
        ));
    }

    let print_seconds = tally.last_at_us.map_or(0.0, |last| (last - t0_unix_us).max(0) as f64 / 1e6);
    Ok(FaultsReport {
        backend: String::new(),
        machine: machine_line(),
        seed: opts.seed,
        tasks: opts.tasks,
        printers: all_printers,
        fleet: fleet::describe(opts.printers, opts.fleet),
        concurrency: opts.concurrency,
        fault_window_seconds: opts.fault_window.as_secs_f64(),
        repeat_share: opts.repeat_share,
        fault_every_ms: opts.fault_every.as_millis() as u64,
        submissions,
        agent_kills,
        broker_kills,
        nodes: launches.len(),
        redis: opts.redis,
        redis_killed_at_s: redis_killed_at.map(|at| at.saturating_duration_since(t0).as_secs_f64()),
        faults_injected: injected,
        fault_phase_seconds,
        drained,
        drain_seconds,
        lanes,
        drain_timeout_seconds: opts.drain_timeout.as_secs_f64(),
        printed_per_sec: if print_seconds > 0.0 { tally.distinct as f64 / print_seconds } else { 0.0 },
        print_seconds,
        verdict,
        doubt,
        events: event_check,
        audit,
        total_seconds: started.elapsed().as_secs_f64(),
        kept_dir: None,
        problems,
    })
}

/// A connection to the broker, with a few tries: right after a restart it may still be
/// settling in.
pub(crate) async fn connect(addr: SocketAddr, what: &str) -> Result<Conn, BenchError> {
    let mut last = String::new();
    for _ in 0..20 {
        match Conn::connect(addr).await {
            Ok(c) => return Ok(c),
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(BenchError::Http { context: format!("connecting for {what}"), detail: last })
}

/// After the fault phase: the simulator must still run (without it nothing can drain);
/// an agent or broker that died on its own is a finding, and is started again so that the
/// drain is still judged.
async fn ensure_up(
    running: &mut Running,
    launches: &[Launch],
    agent: &AgentCtx<'_>,
    problems: &mut Vec<String>,
) -> Result<(), BenchError> {
    if let Some(status) = running.callers.iter_mut().find_map(Proc::exited) {
        return Err(BenchError::Protocol {
            context: "ending the fault phase".into(),
            detail: format!("a calling-in printer-sim exited with {status}"),
        });
    }
    if let Some(status) = running.sim.as_mut().and_then(|s| s.proc.exited()) {
        return Err(BenchError::Protocol {
            context: "ending the fault phase".into(),
            detail: format!("printer-sim exited with {status}"),
        });
    }
    for (node, launch) in running.brokers.iter_mut().zip(launches) {
        let broker_status = node.as_mut().map(Broker::exited);
        if !matches!(broker_status, Some(None)) {
            problems.push(format!(
                "the broker on {} had exited on its own ({broker_status:?}) when faults stopped",
                launch.listen
            ));
            *node = Some(chaos::restart_broker(launch).await?);
        }
    }
    if let Some(r) = running.redis.as_mut() {
        if r.proc.as_mut().is_none_or(|p| p.exited().is_some()) {
            problems.push("redis-server was not running when faults stopped".into());
            r.restart().await?;
        }
    }
    let agent_status = running.agent.as_mut().map(Proc::exited);
    if !matches!(agent_status, Some(None)) {
        problems.push(format!("the agent had exited on its own ({agent_status:?}) when faults stopped"));
        running.agent = Some(agent.spawn()?);
    }
    Ok(())
}

/// `kill -9` of the run's Redis at `at`, restarted (empty) a second later; `None` without
/// one. Intake must neither fail nor create a duplicate meanwhile: the nodes bypass Redis
/// and the database judges.
async fn redis_kill(redis: &mut Option<crate::cluster::Redis>, at: Instant) -> Result<Option<Instant>, BenchError> {
    let Some(r) = redis.as_mut() else { return Ok(None) };
    tokio::time::sleep_until(at.into()).await;
    let killed = Instant::now();
    r.kill9().await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    r.restart().await?;
    Ok(Some(killed))
}

/// Waits until the paper log has not grown for [`PAPER_QUIET`] (at most
/// [`PAPER_QUIET_MAX`]).
pub(crate) async fn wait_for_quiet_paper(watcher: &PaperWatcher) {
    let mut progress = watcher.progress();
    let give_up = Instant::now() + PAPER_QUIET_MAX;
    loop {
        progress.borrow_and_update();
        match tokio::time::timeout(PAPER_QUIET, progress.changed()).await {
            Err(_) => return,
            Ok(Err(_)) => return,
            Ok(Ok(())) if Instant::now() >= give_up => return,
            Ok(Ok(())) => {}
        }
    }
}

/// Whether a failed attempt falls into (or right after) one of the broker's outages.
fn explained(attempt: &submit::FailedAttempt, outages: &[Outage]) -> bool {
    let grace = OUTAGE_GRACE.as_micros() as u64;
    outages.iter().any(|o| attempt.end_us >= o.from_us && attempt.start_us <= o.to_us + grace)
}

/// Counts the submissions and flags retries the bench's kills do not explain.
fn submission_stats(
    subs: &schedule::Submissions,
    run: &SubmitRun,
    outages: &[Outage],
    accepted_tasks: usize,
    problems: &mut Vec<String>,
) -> SubmissionStats {
    let count = |s: u16| run.outcomes.iter().filter(|o| o.status == s).count();
    let (created, duplicate) = (count(201), count(200));
    let unexplained: Vec<&submit::FailedAttempt> =
        run.failed_attempts.iter().filter(|a| !explained(a, outages)).collect();
    if !unexplained.is_empty() {
        let examples: Vec<String> = unexplained
            .iter()
            .take(5)
            .map(|a| {
                let biz = subs.plan.requests.get(a.request).map_or("?".to_string(), |r| subs.plan.biz_no(r.key));
                let what = if a.status == 0 { "no answer".to_string() } else { format!("HTTP {}", a.status) };
                format!("{biz} at {:.2} s: {what} ({})", a.start_us as f64 / 1e6, snippet(a.detail.as_bytes(), 120))
            })
            .collect();
        problems.push(format!(
            "{} submission attempts failed while the broker was up (no kill explains them), e.g. {}",
            unexplained.len(),
            examples.join("; ")
        ));
    }
    SubmissionStats {
        planned: subs.plan.requests.len(),
        repeats: subs.repeats(),
        racing_repeats: subs.racing_repeats(),
        attempts: run.total_attempts(),
        retried_no_answer: run.failed_attempts.iter().filter(|a| a.status == 0).count(),
        retried_5xx: run.failed_attempts.iter().filter(|a| a.status != 0).count(),
        retried_while_up: unexplained.len(),
        created,
        duplicate,
        other: run.outcomes.len() - created - duplicate,
        accepted_tasks,
        seconds: run.last_answer_us as f64 / 1e6,
    }
}

/// Checks the audit trails of every task not `printed` and of a seeded sample of the
/// printed ones, `sample` in all (or more, when more tasks are not printed), over a few
/// connections at once.
async fn audit_trails(
    addr: SocketAddr,
    auth: &HeaderValue,
    listed: &[ListedTask],
    sample: usize,
    seed: u64,
) -> Result<(AuditCheck, Vec<DoubtCase>), BenchError> {
    let (mut chosen, mut printed): (Vec<&ListedTask>, Vec<&ListedTask>) =
        listed.iter().partition(|t| t.state != "printed");
    // A partial Fisher–Yates shuffle picks the sample without favouring any part of it.
    let mut rng = SplitMix64::new(seed ^ 0x0041_5544_4954);
    let take = sample.saturating_sub(chosen.len()).min(printed.len());
    for i in 0..take {
        let j = i + rng.below(printed.len() - i);
        printed.swap(i, j);
    }
    chosen.extend(printed.into_iter().take(take));
    let work: Arc<Vec<(String, String, String, String)>> = Arc::new(
        chosen.iter().map(|t| (t.task_id.clone(), t.state.clone(), t.biz_no.clone(), t.printer_id.clone())).collect(),
    );
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut handles = Vec::new();
    for _ in 0..AUDIT_CONNECTIONS.min(work.len().max(1)) {
        let (work, next, auth) = (work.clone(), next.clone(), auth.clone());
        handles.push(tokio::spawn(async move {
            let mut conn = connect(addr, "reading audit trails").await?;
            let (mut bad, mut doubts) = (Vec::new(), Vec::new());
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((task_id, state, biz_no, printer_id)) = work.get(i) else {
                    return Ok::<_, BenchError>((bad, doubts));
                };
                let trail = events(&mut conn, &auth, task_id).await?;
                let steps: Vec<check::Step> = trail.iter().map(|e| (e.from.clone(), e.to.clone())).collect();
                if let Err(why) = check::check_trail(state, &steps) {
                    bad.push(format!("{task_id} ({state}): {why}"));
                }
                if state == "in_doubt" {
                    let into = trail.iter().rev().find(|e| e.to == "in_doubt");
                    doubts.push(DoubtCase {
                        task_id: task_id.clone(),
                        biz_no: biz_no.clone(),
                        printer: printer_id.trim_start_matches('p').parse().unwrap_or(usize::MAX),
                        created_us: trail.first().map_or(0, |e| e.at_us),
                        doubted_us: into.map_or(0, |e| e.at_us),
                        reason: into.map(|e| e.reason.clone()).unwrap_or_default(),
                    });
                }
            }
        }));
    }
    let mut out = AuditCheck { checked: work.len(), ..AuditCheck::default() };
    let mut doubts = Vec::new();
    for h in handles {
        let (bad, mut found) = h
            .await
            .map_err(|e| BenchError::Protocol { context: "reading audit trails".into(), detail: e.to_string() })??;
        out.inconsistent += bad.len();
        out.examples.extend(bad.into_iter().take(5usize.saturating_sub(out.examples.len())));
        doubts.append(&mut found);
    }
    Ok((out, doubts))
}

/// What the run injected, on the epoch's clock: the printer faults as planned (stops as
/// spans, crashes and errors after printing as moments) and the kills as they happened.
fn injected_timeline(
    plan: &schedule::Chaos,
    agent_kills: &[chaos::KillRecord],
    broker_kills: &[chaos::KillRecord],
    t0_unix_us: i64,
    callers_from: usize,
) -> check::Injected {
    let at = |ms: u64| t0_unix_us + ms as i64 * 1_000;
    let mut out = check::Injected { callers_from, ..check::Injected::default() };
    let mut open: std::collections::HashMap<usize, i64> = std::collections::HashMap::new();
    for e in &plan.printer_events {
        match (e.kind, e.on) {
            (schedule::FaultKind::CrashMidJob | schedule::FaultKind::ErrorAfterPrint, true) => {
                out.moments.entry(e.printer).or_default().push(at(e.at_ms));
            }
            (schedule::FaultKind::Slow(_), _) => {}
            (_, true) => {
                open.insert(e.printer, at(e.at_ms));
            }
            (_, false) => {
                if let Some(from) = open.remove(&e.printer) {
                    out.spans.entry(e.printer).or_default().push((from, at(e.at_ms)));
                }
            }
        }
    }
    // A stop still on when the phase ended lasted until faults were cleared.
    for (printer, from) in open {
        out.spans.entry(printer).or_default().push((from, i64::MAX));
    }
    let kill_at = |k: &chaos::KillRecord| t0_unix_us + (k.at_s * 1e6) as i64;
    out.agent_kills_us = agent_kills.iter().map(kill_at).collect();
    out.broker_kills_us = broker_kills.iter().map(kill_at).collect();
    out
}

/// One event of a task's audit trail, as the bench reads it.
pub(crate) struct TrailEvent {
    pub from: Option<String>,
    pub to: String,
    pub at_us: i64,
    pub reason: String,
}

/// `GET /v1/print-tasks/{id}/events`, oldest first.
pub(crate) async fn events(conn: &mut Conn, auth: &HeaderValue, task_id: &str) -> Result<Vec<TrailEvent>, BenchError> {
    let path = format!("/v1/print-tasks/{}/events", pct_encode(task_id));
    let context = || format!("reading the audit trail ({path})");
    let (status, body) = conn
        .request(Method::GET, &path, auth, None)
        .await
        .map_err(|detail| BenchError::Http { context: context(), detail })?;
    let page: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let Some(items) = page.get("events").and_then(Value::as_array).filter(|_| status.is_success()) else {
        return Err(BenchError::Protocol {
            context: context(),
            detail: format!("HTTP {status}: {}", snippet(&body, 300)),
        });
    };
    Ok(items
        .iter()
        .map(|e| TrailEvent {
            from: e.get("from").and_then(Value::as_str).map(str::to_string),
            to: verify::str_field(e, "to"),
            at_us: e.get("at").and_then(Value::as_str).and_then(crate::paper::rfc3339_to_unix_us).unwrap_or(0),
            reason: verify::str_field(e, "reason"),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_documented_ones() {
        let o = FaultsOptions::new("onceprint");
        assert_eq!((o.tasks, o.printers, o.concurrency, o.seed), (10_000, 8, 16, 1));
        assert_eq!((o.agent_kills, o.broker_kills), (5, 3));
        assert_eq!((o.drain_timeout, o.timeout), (Duration::from_secs(120), Duration::from_secs(600)));
        assert_eq!(o.repeat_share, 0.30);
        assert!(validate(&o).is_ok());
    }

    #[test]
    fn bad_options_are_refused() {
        let check = |f: &dyn Fn(&mut FaultsOptions)| {
            let mut o = FaultsOptions::new("onceprint");
            f(&mut o);
            validate(&o).err().map(|e| e.to_string())
        };
        assert!(check(&|o| o.tasks = 0).is_some());
        assert!(check(&|o| o.printers = 0).is_some());
        assert!(check(&|o| o.printers = MAX_PRINTERS + 1).is_some());
        assert!(check(&|o| o.concurrency = 0).is_some());
        assert!(check(&|o| o.repeat_share = 1.5).is_some());
        assert!(check(&|o| o.fault_window = Duration::from_millis(10)).is_some());
        assert!(check(&|o| o.fault_every = Duration::ZERO).is_some());
        assert!(check(&|o| o.agent_kills = 1_000).is_some());
        assert!(check(&|o| o.drain_timeout = Duration::ZERO).is_some());
        let msg = check(&|o| o.timeout = Duration::from_secs(30)).unwrap_or_default();
        assert!(msg.contains("longer than the fault window"), "{msg}");
        assert!(check(&|o| o.database = Some("sqlite://x".into())).is_some());
        assert!(check(&|o| o.database = Some("postgres://u@127.0.0.1/db".into())).is_none());
        assert!(check(&|o| (o.agent_kills, o.broker_kills) = (0, 0)).is_none());
        assert!(check(&|o| o.nodes = 0).is_some());
        assert!(check(&|o| o.nodes = 3).is_some(), "several nodes need PostgreSQL");
        assert!(check(&|o| o.redis = true).is_some(), "Redis only with PostgreSQL nodes");
        let pg = Some("postgres://u@127.0.0.1/db".to_string());
        assert!(check(&|o| (o.nodes, o.redis, o.database) = (3, true, pg.clone())).is_none());
    }

    #[test]
    fn only_failures_during_an_outage_are_explained() {
        let outages = [Outage { from_us: 10_000_000, to_us: 11_000_000 }];
        let at = |start_us: u64, end_us: u64| submit::FailedAttempt {
            request: 0,
            start_us,
            end_us,
            status: 0,
            detail: String::new(),
        };
        assert!(explained(&at(9_990_000, 10_000_100), &outages), "in flight at the kill");
        assert!(explained(&at(10_500_000, 10_500_100), &outages), "during the outage");
        assert!(explained(&at(12_500_000, 12_500_100), &outages), "within the grace after it");
        assert!(!explained(&at(13_500_000, 13_500_100), &outages), "long after it");
        assert!(!explained(&at(1_000_000, 1_000_100), &outages), "before it");
    }
}
