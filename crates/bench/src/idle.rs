//! `onceprint bench idle`: what many idle store agents cost one broker. A shop
//! chain has one agent per store, and almost all of them wait in a long poll almost all
//! the time, so the cost of a waiting poll is what decides how many stores a node serves.
//!
//! It starts a broker on a fresh database, sets up store `s1` with printers for intake
//! and A further stores, each with one agent printer and its own agent token, and then:
//!
//! 1. measures intake (`POST /v1/print-tasks`, C connections, a share of duplicates) with
//!    no agent connected;
//! 2. connects A simulated agents (one keep-alive connection each, on loopback), each
//!    long-polling `POST /v1/agent/poll` for its store again as soon as an answer comes;
//! 3. once every agent's first poll is sent, lets them sit for a few seconds and reads the
//!    broker's RSS and its CPU use while nothing but the polls happens;
//! 4. measures intake again, the same plan with new keys, while the agents wait;
//! 5. keeps the agents until each has been answered at least once (a whole `wait_ms`),
//!    so a poll that is never answered is seen.
//!
//! Problems are: any poll answered with anything but 200, lost or answered later than
//! `wait_ms` plus [`LATE_SLACK`], a poll that brought deliveries (the agents' stores have
//! no tasks), and any intake answer that breaks the contract.
//!
//! Like the other benches it talks only to the broker it started (127.0.0.1) and the
//! PostgreSQL database it was handed, inside a schema it creates and drops.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper::body::Bytes;
use hyper::header::HeaderValue;
use hyper::Method;
use serde::Serialize;
use serde_json::{json, Value};

use crate::broker::Broker;
use crate::http::{bearer, snippet, Conn};
use crate::report::{finish_text, machine_line, LatencyReport, Percentiles};
use crate::setup::{setup_call, store_and_printers, tenant};
use crate::{build_plan, load, random_hex, run_dir, verify, BenchError, PLAN_SEED};

/// A poll answered this much later than its `wait_ms` counts as late.
pub const LATE_SLACK: Duration = Duration::from_secs(10);
/// How long the agents sit, all connected, before the broker's memory and idle CPU are read.
const SETTLE: Duration = Duration::from_secs(5);
/// The window over which the broker's idle CPU use is measured.
const IDLE_WINDOW: Duration = Duration::from_secs(10);
/// Agents connecting at the same moment: more would only overflow the listen backlog.
const CONNECTING_AT_ONCE: usize = 256;
/// Connections the per-store set-up calls are spread over.
const SETUP_CONNECTIONS: usize = 8;

/// What `run_idle` should do.
#[derive(Debug, Clone)]
pub struct IdleOptions {
    pub broker_exe: PathBuf,
    /// `None`: a fresh SQLite file; `postgres://…`: a fresh schema there.
    pub database: Option<String>,
    /// Idle agents, one per store.
    pub agents: usize,
    /// The agents' `wait_ms`.
    pub wait_ms: u64,
    /// Submissions of each intake measurement.
    pub requests: usize,
    pub concurrency: usize,
    pub duplicate_share: f64,
    /// Extra arguments for the broker's `serve` (e.g. `--poll-recheck-ms 1000`, to
    /// measure a setting side by side).
    pub broker_args: Vec<String>,
}

impl IdleOptions {
    pub fn new(exe: impl Into<PathBuf>) -> Self {
        Self {
            broker_exe: exe.into(),
            database: None,
            agents: 10_000,
            wait_ms: 25_000,
            requests: 50_000,
            concurrency: 64,
            duplicate_share: 0.30,
            broker_args: Vec::new(),
        }
    }
}

/// One intake measurement.
#[derive(Debug, Clone, Serialize)]
pub struct IntakeFigures {
    pub accepted: usize,
    pub duplicates: usize,
    pub wall_seconds: f64,
    pub accepted_per_sec: f64,
    pub latency_ms: LatencyReport,
}

#[derive(Debug, Clone, Serialize)]
pub struct IdleReport {
    pub machine: String,
    pub backend: &'static str,
    pub agents: usize,
    pub wait_ms: u64,
    pub broker_args: Vec<String>,
    /// Seconds from the first agent's connect to the last agent's first poll being sent.
    pub connect_seconds: f64,
    /// The broker's RSS (VmRSS) before any agent connected, after the first intake run.
    pub rss_before_mib: Option<f64>,
    /// Its RSS with every agent waiting, after [`SETTLE`].
    pub rss_with_agents_mib: Option<f64>,
    /// (with − before) / agents, in KiB.
    pub kib_per_agent: Option<f64>,
    /// The broker's peak RSS (VmHWM) over the whole run.
    pub broker_peak_rss_mib: Option<f64>,
    /// Share of one core the broker used while the agents only waited.
    pub idle_cpu_share: Option<f64>,
    pub intake_without_agents: IntakeFigures,
    pub intake_with_agents: IntakeFigures,
    /// with / without.
    pub intake_ratio: f64,
    pub polls_answered: usize,
    /// How much later than `wait_ms` the empty answers came (ms; negative would mean early).
    pub poll_lateness_ms: Percentiles,
    pub problems: Vec<String>,
}

impl IdleReport {
    pub fn render_text(&self) -> String {
        let mib = |v: Option<f64>| v.map_or("?".to_string(), |m| format!("{m:.1} MiB"));
        let mut s = format!(
            "bench idle — {} agents long-polling (wait {} ms) one broker ({}, {}){}\n",
            self.agents,
            self.wait_ms,
            self.backend,
            self.machine,
            if self.broker_args.is_empty() { String::new() } else { format!(", serve {}", self.broker_args.join(" ")) }
        );
        s.push_str(&format!("  all agents polling after {:.1} s\n", self.connect_seconds));
        s.push_str(&format!(
            "  broker RSS: {} before, {} with the agents waiting ({} per agent), peak {}\n",
            mib(self.rss_before_mib),
            mib(self.rss_with_agents_mib),
            self.kib_per_agent.map_or("?".to_string(), |k| format!("{k:.1} KiB")),
            mib(self.broker_peak_rss_mib)
        ));
        if let Some(c) = self.idle_cpu_share {
            s.push_str(&format!("  broker CPU while they wait: {:.1} % of one core\n", c * 100.0));
        }
        let line = |name: &str, f: &IntakeFigures| {
            let p = &f.latency_ms.accepted;
            format!(
                "  intake {name}: {:.0} accepted/s ({} in {:.2} s), 201 p50 {:.2} ms p99 {:.2} ms max {:.1} ms\n",
                f.accepted_per_sec, f.accepted, f.wall_seconds, p.p50, p.p99, p.max
            )
        };
        s.push_str(&line("without agents", &self.intake_without_agents));
        s.push_str(&line("with agents   ", &self.intake_with_agents));
        s.push_str(&format!("  intake with / without: {:.2}\n", self.intake_ratio));
        let l = &self.poll_lateness_ms;
        s.push_str(&format!(
            "  polls answered: {}; lateness past wait_ms: p50 {:.0} ms p99 {:.0} ms max {:.0} ms\n",
            self.polls_answered, l.p50, l.p99, l.max
        ));
        finish_text(s, &self.problems)
    }
}

#[derive(Default)]
struct PollTally {
    answered: usize,
    lateness_us: Vec<u64>,
    problems: Vec<String>,
    other_status: usize,
    lost: usize,
    late: usize,
    with_deliveries: usize,
}

pub async fn run_idle(opts: IdleOptions) -> Result<IdleReport, BenchError> {
    if opts.agents == 0 || opts.agents > 50_000 {
        return Err(BenchError::InvalidOptions("agents must be 1–50000".into()));
    }
    if !(1_000..=60_000).contains(&opts.wait_ms) {
        return Err(BenchError::InvalidOptions("wait_ms must be 1000–60000".into()));
    }
    if opts.requests == 0 || opts.concurrency == 0 || !(0.0..1.0).contains(&opts.duplicate_share) {
        return Err(BenchError::InvalidOptions(
            "requests and concurrency must be ≥ 1 and the duplicate share in [0, 1)".into(),
        ));
    }
    crate::validate_database(opts.database.as_deref())?;
    raise_fd_limit(opts.agents + 1_000);
    let tmp = run_dir("onceprint-bench-idle-")?;
    let dir = tmp.path().to_path_buf();
    let opts = &opts;
    crate::on_database(opts.database.as_deref(), &dir.clone(), |backend, url| async move {
        run_on(opts, backend, &url, &dir).await
    })
    .await
}

/// Raises this process's open-file limit towards `want` (the broker inherits it): every
/// agent is one socket on each side.
#[cfg(not(unix))]
fn raise_fd_limit(_want: usize) {}

#[cfg(unix)]
fn raise_fd_limit(want: usize) {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit only read and write the struct handed to them.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && (lim.rlim_cur as usize) < want {
            lim.rlim_cur = (want as libc::rlim_t).min(lim.rlim_max);
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

async fn run_on(opts: &IdleOptions, backend: &'static str, url: &str, dir: &Path) -> Result<IdleReport, BenchError> {
    let admin = random_hex(16)?;
    let broker = Broker::launch(&crate::broker::Launch {
        exe: opts.broker_exe.clone(),
        database_url: url.to_string(),
        admin_token: admin.clone(),
        log_path: dir.join("broker.log"),
        listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        config: None,
        extra_args: opts.broker_args.clone(),
        default_rate_limits: false,
    })
    .await?;
    let result = drive(opts, &broker, &admin).await;
    let peak = broker.peak_rss_kib();
    let tail = broker.log_tail();
    let mut problems = Vec::new();
    crate::procs::note_stop("broker", broker.stop().await, &mut problems);
    let mut report = result.map_err(|e| e.with_logs(Some(format!("\n--- broker log ---\n{tail}"))))?;
    report.backend = backend;
    report.broker_peak_rss_mib = peak.map(|k| k as f64 / 1024.0);
    report.problems.append(&mut problems);
    Ok(report)
}

async fn drive(opts: &IdleOptions, broker: &Broker, admin: &str) -> Result<IdleReport, BenchError> {
    let addr = broker.addr;
    let pid = broker.pid();
    let mut conn =
        Conn::connect(addr).await.map_err(|detail| BenchError::Http { context: "connecting".into(), detail })?;
    let auth = tenant(&mut conn, admin).await?;
    let printers = 10;
    store_and_printers(&mut conn, &auth, &vec!["tcp://127.0.0.1:9100".to_string(); printers]).await?;
    let tokens = agent_stores(addr, &auth, opts.agents).await?;

    let mut problems = Vec::new();
    let without = intake(opts, addr, &auth, "I", printers, &mut problems).await?;
    let rss_before = rss_kib(pid);

    // The agents. Each sends its first poll, then polls again as soon as it is answered.
    let tally = Arc::new(Mutex::new(PollTally::default()));
    let first_sent = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(tokio::sync::Notify::new());
    let gate = Arc::new(tokio::sync::Semaphore::new(CONNECTING_AT_ONCE));
    let connect_start = Instant::now();
    let mut handles = Vec::with_capacity(tokens.len());
    for (i, token) in tokens.into_iter().enumerate() {
        let (tally, first_sent, stop, gate) = (tally.clone(), first_sent.clone(), stop.clone(), gate.clone());
        let wait = Duration::from_millis(opts.wait_ms);
        handles.push(tokio::spawn(async move {
            agent_loop(addr, i, token, wait, gate, first_sent, tally, stop).await;
        }));
    }
    while first_sent.load(Ordering::Relaxed) < opts.agents {
        if connect_start.elapsed() > Duration::from_secs(300) {
            return Err(BenchError::Protocol {
                context: "connecting the agents".into(),
                detail: format!(
                    "only {} of {} agents polling after 300 s",
                    first_sent.load(Ordering::Relaxed),
                    opts.agents
                ),
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let connect_seconds = connect_start.elapsed().as_secs_f64();
    let all_polling = Instant::now();
    tokio::time::sleep(SETTLE).await;
    let rss_with = rss_kib(pid);
    let cpu_a = broker.stats().cpu_seconds;
    let t_a = Instant::now();
    tokio::time::sleep(IDLE_WINDOW).await;
    let idle_cpu_share = match (cpu_a, broker.stats().cpu_seconds) {
        (Some(a), Some(b)) => Some((b - a) / t_a.elapsed().as_secs_f64()),
        _ => None,
    };

    let with = intake(opts, addr, &auth, "J", printers, &mut problems).await?;
    // Every agent's first poll must have come back (empty, after wait_ms) before the end.
    let wait = Duration::from_millis(opts.wait_ms);
    let until = all_polling + wait + LATE_SLACK;
    loop {
        let answered = tally.lock().map(|t| t.answered).unwrap_or(0);
        if answered >= opts.agents || Instant::now() >= until {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.notify_waiters();
    for h in handles {
        h.abort();
    }

    let t = std::mem::take(&mut *tally.lock().unwrap_or_else(|e| e.into_inner()));
    problems.extend(t.problems.into_iter().take(5));
    for (n, what) in [
        (t.other_status, "polls were answered with a status other than 200"),
        (t.lost, "polls were lost (connection error or no answer)"),
        (t.late, "polls were answered later than wait_ms + 10 s"),
        (t.with_deliveries, "polls brought deliveries, though the agents' stores have no tasks"),
    ] {
        if n > 0 {
            problems.push(format!("{n} {what}"));
        }
    }
    if t.answered < opts.agents {
        problems.push(format!(
            "only {} polls were answered within wait_ms + 10 s of the last agent connecting ({} agents)",
            t.answered, opts.agents
        ));
    }
    let kib_per_agent = match (rss_before, rss_with) {
        (Some(a), Some(b)) => Some((b as f64 - a as f64) / opts.agents as f64),
        _ => None,
    };
    Ok(IdleReport {
        machine: machine_line(),
        backend: "",
        agents: opts.agents,
        wait_ms: opts.wait_ms,
        broker_args: opts.broker_args.clone(),
        connect_seconds,
        rss_before_mib: rss_before.map(|k| k as f64 / 1024.0),
        rss_with_agents_mib: rss_with.map(|k| k as f64 / 1024.0),
        kib_per_agent,
        broker_peak_rss_mib: None,
        idle_cpu_share,
        intake_ratio: if without.accepted_per_sec > 0.0 {
            with.accepted_per_sec / without.accepted_per_sec
        } else {
            0.0
        },
        intake_without_agents: without,
        intake_with_agents: with,
        polls_answered: t.answered,
        poll_lateness_ms: Percentiles::from_micros(t.lateness_us),
        problems,
    })
}

/// Creates stores `a0…` with one agent printer each and returns their agent tokens.
async fn agent_stores(addr: std::net::SocketAddr, auth: &HeaderValue, n: usize) -> Result<Vec<String>, BenchError> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut handles = Vec::new();
    for _ in 0..SETUP_CONNECTIONS.min(n) {
        let (next, auth) = (next.clone(), auth.clone());
        handles.push(tokio::spawn(async move {
            let mut conn = Conn::connect(addr)
                .await
                .map_err(|detail| BenchError::Http { context: "connecting for set-up".into(), detail })?;
            let mut mine = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return Ok::<_, BenchError>(mine);
                }
                let store = format!("a{i}");
                setup_call(&mut conn, &auth, "/v1/stores", json!({"id": store, "name": format!("Agent store {i}")}))
                    .await?;
                let printer = json!({"id": format!("ap{i}"), "store_id": store,
                                     "transport": {"kind": "agent", "address": "tcp://127.0.0.1:9100"}});
                setup_call(&mut conn, &auth, "/v1/printers", printer).await?;
                let answer =
                    setup_call(&mut conn, &auth, &format!("/v1/stores/{store}/agent-tokens"), json!({})).await?;
                let token = answer.get("token").and_then(Value::as_str).map(str::to_string).ok_or_else(|| {
                    BenchError::Protocol {
                        context: "creating an agent token".into(),
                        detail: format!("no token in {answer}"),
                    }
                })?;
                mine.push((i, token));
            }
        }));
    }
    let mut tokens = vec![String::new(); n];
    for h in handles {
        let part =
            h.await.map_err(|e| BenchError::Protocol { context: "set-up worker".into(), detail: e.to_string() })??;
        for (i, t) in part {
            tokens[i] = t;
        }
    }
    Ok(tokens)
}

/// One intake measurement with keys of `prefix`, verified.
async fn intake(
    opts: &IdleOptions,
    addr: std::net::SocketAddr,
    auth: &HeaderValue,
    prefix: &'static str,
    printers: usize,
    problems: &mut Vec<String>,
) -> Result<IntakeFigures, BenchError> {
    let plan = build_plan(prefix, opts.requests, opts.duplicate_share, printers, PLAN_SEED);
    let bodies: Arc<Vec<Bytes>> = Arc::new(plan.requests.iter().map(|r| r.body.clone()).collect());
    let run = load::run_load(addr, auth.clone(), bodies, opts.concurrency).await?;
    let answered = verify::check_answers(prefix, &plan, &run.outcomes, &Default::default(), problems);
    // Every key must have been answered (the listing check of `bench submit` would need
    // every key of the store; counting the answers is enough here).
    if answered.len() != plan.distinct_keys {
        problems.push(format!("{prefix}: {} keys answered for {} sent", answered.len(), plan.distinct_keys));
    }
    let count = |s: u16| run.outcomes.iter().filter(|o| o.status == s).count();
    let (accepted, duplicates) = (count(201), count(200));
    let wall = run.wall.as_secs_f64();
    Ok(IntakeFigures {
        accepted,
        duplicates,
        wall_seconds: wall,
        accepted_per_sec: if wall > 0.0 { accepted as f64 / wall } else { 0.0 },
        latency_ms: LatencyReport::from_outcomes(&run.outcomes),
    })
}

#[allow(clippy::too_many_arguments)]
async fn agent_loop(
    addr: std::net::SocketAddr,
    i: usize,
    token: String,
    wait: Duration,
    gate: Arc<tokio::sync::Semaphore>,
    first_sent: Arc<AtomicUsize>,
    tally: Arc<Mutex<PollTally>>,
    stop: Arc<tokio::sync::Notify>,
) {
    let note = |f: &dyn Fn(&mut PollTally)| {
        if let Ok(mut t) = tally.lock() {
            f(&mut t);
        }
    };
    let Ok(auth) = bearer(&token) else {
        note(&|t| t.problems.push(format!("agent {i}: token is not a header value")));
        return;
    };
    let body = Bytes::from(
        json!({"agent_id": format!("idle-{i}"), "session": format!("s{i}"), "wait_ms": wait.as_millis() as u64, "max": 16})
            .to_string(),
    );
    let connected = {
        let _permit = gate.acquire().await;
        Conn::connect(addr).await
    };
    let mut conn = match connected {
        Ok(c) => c,
        Err(e) => {
            note(&|t| {
                t.lost += 1;
                if t.problems.len() < 5 {
                    t.problems.push(format!("agent {i} could not connect: {e}"));
                }
            });
            first_sent.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    // Counted once the connection is up: the request below is written the moment the
    // task is next scheduled, and connecting is what takes time with thousands at once.
    first_sent.fetch_add(1, Ordering::Relaxed);
    // Long enough for a poll answered very late to be seen as late rather than lost.
    let within = wait + LATE_SLACK * 3;
    loop {
        let started = Instant::now();
        let r = tokio::select! {
            r = conn.request_within(Method::POST, "/v1/agent/poll", &auth, Some(body.clone()), within) => r,
            _ = stop.notified() => return,
        };
        let lost = r.is_err();
        record(&tally, i, started, wait, r);
        if lost {
            return;
        }
    }
}

fn record(
    tally: &Mutex<PollTally>,
    i: usize,
    started: Instant,
    wait: Duration,
    r: Result<(hyper::StatusCode, Bytes), String>,
) {
    let took = started.elapsed();
    let Ok(mut t) = tally.lock() else { return };
    match r {
        Err(e) => {
            t.lost += 1;
            if t.problems.len() < 5 {
                t.problems.push(format!("agent {i}: poll lost: {e}"));
            }
        }
        Ok((status, body)) if status.as_u16() != 200 => {
            t.other_status += 1;
            if t.problems.len() < 5 {
                t.problems.push(format!("agent {i}: poll answered {status}: {}", snippet(&body, 200)));
            }
        }
        Ok((_, body)) => {
            t.answered += 1;
            let deliveries = serde_json::from_slice::<Value>(&body)
                .ok()
                .and_then(|v| v.get("deliveries").and_then(Value::as_array).map(Vec::len))
                .unwrap_or(0);
            if deliveries > 0 {
                t.with_deliveries += 1;
            }
            t.lateness_us.push(took.saturating_sub(wait).as_micros() as u64);
            if took > wait + LATE_SLACK {
                t.late += 1;
            }
        }
    }
}
