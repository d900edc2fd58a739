//! The benchmarks behind `onceprint bench submit`, `bench e2e` and `bench faults`.
//!
//! `bench e2e` (module [`e2e`]) measures delivery end to end — broker, store agent and
//! simulated printers as real processes, judged by the printers' paper log; see there.
//! `bench faults` (module [`faults`]) runs the same processes under printer faults,
//! `kill -9` of the agent and the broker and client retry storms, and proves (or refutes)
//! that nothing prints twice, nothing is lost and every lane drains. `bench offline`
//! (module [`offline`]) does the same for a shop whose internet connection keeps dropping
//! while its POS submits to the cloud and to the store agent's LAN listener.
//! The rest of this overview is about `bench submit`, the intake benchmark.
//!
//! That one is a single measurement: how fast a freshly started broker accepts print tasks
//! over HTTP when a share of the submissions are repeats (the idempotent-retry path order
//! systems lean on), and whether every answer still obeys the contract while it does. It
//! starts the broker as a child process on a database of its own (a temporary SQLite file
//! or a throw-away PostgreSQL schema), sets up a tenant, store and printers, replays a
//! deterministic request plan over many keep-alive connections (one submission per
//! request, or `batch` of them per `POST /v1/print-task-batches`), verifies every answer and
//! the stored tasks, and reports throughput, latency percentiles and the broker's peak
//! memory.
//!
//! It must never talk to anything but the broker it started, on 127.0.0.1, and the
//! PostgreSQL database it was explicitly handed; never touch existing data (it only
//! writes inside the SQLite file or schema it created, and drops the schema afterwards);
//! and never leave the broker running. It does not parse command lines or print: the
//! binary wires [`SubmitOptions`] to its CLI and prints [`SubmitReport::render_text`] or
//! the report as JSON, and exits non-zero when [`SubmitReport::problems`] is not empty.
//!
//! Where things are: `demo.rs`, `onceprint demo`; `faults/`, the fault run (`fleet.rs`, a
//! mixed fleet of agent, CloudPRNT, Epson and MQTT printers); `offline/`, a store agent
//! with its LAN listener behind a shop line the run cuts and restores; `idle.rs`, idle
//! long-polling agents; `cluster.rs`, several nodes on one PostgreSQL (`--nodes N`, `--redis`);
//! `lb.rs`, a TCP round-robin load balancer with `/readyz` health checks (also `bench lb`) and
//! the shop's `Uplink`; `preload.rs`, a full database written in bulk before a measured run
//! (`--preload-finished`, `--preload-waiting`); and the polling, fairness and wake-up runs.

mod broker;
pub mod cluster;
pub mod demo;
pub mod e2e;
pub mod fairness;
pub mod faults;
mod http;
pub mod idle;
pub mod lb;
mod load;
pub mod mqtt;
pub mod offline;
pub mod paper;
mod pg;
mod plan;
pub mod polls;
pub mod preload;
mod procs;
mod report;
pub mod rush;
mod setup;
mod sim;
mod verify;
pub mod wakeup;

use std::future::Future;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hyper::body::Bytes;

use broker::Broker;
pub use demo::{run_demo, DemoOptions, DemoReport};
pub use e2e::{run_e2e, E2eOptions, E2eReport};
pub use fairness::{run_fairness, FairnessOptions, FairnessReport};
pub use faults::{run_faults, FaultsOptions, FaultsReport};
use http::Conn;
pub use idle::{run_idle, IdleOptions, IdleReport};
pub use mqtt::{run_mqtt, MqttBenchOptions, MqttBenchProtocol, MqttBenchReport};
pub use offline::{run_offline, OfflineOptions, OfflineReport};
pub use plan::{body_for, build_plan, Plan, PlannedRequest, RECENT_WINDOW};
pub use polls::{run_polls, PollsOptions, PollsReport};
pub use preload::{PreloadOptions, PreloadReport};
pub use report::{percentile, LatencyReport, Percentiles, SubmitReport};
pub use rush::{run_rush, RushOptions, RushReport};
pub use wakeup::{run_wakeup, WakeupOptions, WakeupReport};

/// The store every bench task goes to.
const STORE_ID: &str = "s1";
/// Seed of the request plans: fixed, so every run replays the same plan and runs are
/// comparable with each other.
const PLAN_SEED: u64 = 1;

/// What `run_submit` should do. Plain fields so the binary can fill them from clap (or a
/// test by hand) without this crate knowing about either.
#[derive(Debug, Clone)]
pub struct SubmitOptions {
    /// The `onceprint` executable to start as the broker.
    pub broker_exe: PathBuf,
    /// `None`: a fresh SQLite file in a temporary directory. `postgres://…`: a fresh
    /// schema in that database, dropped at the end.
    pub database: Option<String>,
    /// Measured submissions.
    pub requests: usize,
    /// HTTP connections, each with one request in flight.
    pub concurrency: usize,
    /// Submissions per HTTP request: 1 sends each alone to `POST /v1/print-tasks`; 2–500
    /// send that many consecutive ones of the plan together to `POST /v1/print-task-batches`
    /// (warm-up included).
    pub batch: usize,
    /// Share of submissions that repeat a recently sent key.
    pub duplicate_share: f64,
    /// Printers the tasks are spread over.
    pub printers: usize,
    /// Submissions sent before the measured ones (own keys, verified, not timed).
    pub warmup: usize,
    /// Broker nodes on one PostgreSQL database behind the bench's load balancer (1: one
    /// broker, no balancer).
    pub nodes: usize,
    /// Finished and waiting tasks written into the database before the warm-up (module
    /// [`preload`]); none by default.
    pub preload: PreloadOptions,
}

impl SubmitOptions {
    /// The defaults for a given broker executable.
    pub fn new(broker_exe: impl Into<PathBuf>) -> Self {
        Self {
            broker_exe: broker_exe.into(),
            database: None,
            requests: 200_000,
            concurrency: 64,
            batch: 1,
            duplicate_share: 0.30,
            printers: 10,
            warmup: 5_000,
            nodes: 1,
            preload: PreloadOptions::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("invalid options: {0}")]
    InvalidOptions(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the broker did not start: {reason}\n--- broker stderr (last lines) ---\n{stderr}")]
    BrokerStart { reason: String, stderr: String },
    #[error("HTTP to the broker failed while {context}: {detail}")]
    Http { context: String, detail: String },
    #[error("set-up step `{step}` got HTTP {status}: {body}")]
    Setup { step: String, status: u16, body: String },
    #[error("unexpected answer while {context}: {detail}")]
    Protocol { context: String, detail: String },
    #[error("{source}\n(the run's directory is kept in {dir})")]
    Kept {
        dir: String,
        #[source]
        source: Box<BenchError>,
    },
    #[error("PostgreSQL, {context}: {source}")]
    Postgres {
        context: String,
        #[source]
        source: tokio_postgres::Error,
    },
}

impl BenchError {
    fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io { context: context.into(), source }
    }

    fn postgres(context: impl Into<String>, source: tokio_postgres::Error) -> Self {
        Self::Postgres { context: context.into(), source }
    }

    /// Appends the processes' log tails to an error a process is the likely cause of (an
    /// HTTP failure or an unexpected answer); other errors are the bench's own and stay
    /// as they are.
    fn with_logs(self, tails: Option<String>) -> Self {
        match (self, tails) {
            (BenchError::Http { context, detail }, Some(t)) => {
                BenchError::Http { context, detail: format!("{detail}{t}") }
            }
            (BenchError::Protocol { context, detail }, Some(t)) => {
                BenchError::Protocol { context, detail: format!("{detail}{t}") }
            }
            (other, _) => other,
        }
    }
}

/// Runs the whole benchmark: start a broker, set up, warm up, measure, verify, stop.
///
/// Returns `Err` only when the run could not be carried out (the broker would not start,
/// set-up failed, the connection died); contract violations seen during a completed run
/// are listed in [`SubmitReport::problems`].
pub async fn run_submit(opts: SubmitOptions) -> Result<SubmitReport, BenchError> {
    validate(&opts)?;
    let tmp = run_dir("onceprint-bench-")?;
    let (dir, opts) = (tmp.path(), &opts);
    on_database(opts.database.as_deref(), dir, |backend, url| async move { run_on(opts, backend, &url, dir).await })
        .await
}

/// Runs `run(backend, broker_url)` on a fresh database: a SQLite file in `dir` when
/// `database` is `None`, else a new schema in that PostgreSQL database, dropped afterwards
/// whatever happened.
async fn on_database<T, F, Fut>(database: Option<&str>, dir: &Path, run: F) -> Result<T, BenchError>
where
    F: FnOnce(&'static str, String) -> Fut,
    Fut: Future<Output = Result<T, BenchError>>,
{
    match database {
        None => {
            let url = format!("sqlite://{}", dir.join("bench.db").display());
            run("sqlite", url).await
        }
        Some(url) => {
            let schema = pg::PgSchema::create(url, &random_hex(6)?).await?;
            let result = run("postgres", schema.broker_url(url)).await;
            // Drop the schema whatever happened; a failed drop only matters if the run
            // itself succeeded (otherwise its error is the one worth reporting).
            let dropped = schema.drop_schema().await;
            match (result, dropped) {
                (Ok(report), Ok(())) => Ok(report),
                (Ok(_), Err(e)) => Err(e),
                (Err(e), _) => Err(e),
            }
        }
    }
}

/// `None` or a `postgres://` URL.
fn validate_database(database: Option<&str>) -> Result<(), BenchError> {
    match database {
        Some(url) if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) => {
            Err(BenchError::InvalidOptions(
                "database must be a postgres:// URL (leave it out for a fresh SQLite file)".to_string(),
            ))
        }
        _ => Ok(()),
    }
}

fn validate(opts: &SubmitOptions) -> Result<(), BenchError> {
    let bad = |m: &str| Err(BenchError::InvalidOptions(m.to_string()));
    if opts.requests == 0 {
        return bad("requests must be at least 1");
    }
    if opts.concurrency == 0 {
        return bad("concurrency must be at least 1");
    }
    load::validate_batch(opts.batch)?;
    if opts.printers == 0 {
        return bad("printers must be at least 1");
    }
    if !(0.0..1.0).contains(&opts.duplicate_share) {
        return bad("duplicate share must be in [0, 1)");
    }
    if u32::try_from(opts.requests.max(opts.warmup)).is_err() {
        return bad("too many requests");
    }
    cluster::validate_nodes(opts.nodes, opts.database.as_deref())?;
    opts.preload.validate()?;
    validate_database(opts.database.as_deref())
}

/// Starts the broker on `database_url`, runs everything against it, and always stops it.
async fn run_on(
    opts: &SubmitOptions,
    backend: &str,
    database_url: &str,
    dir: &Path,
) -> Result<SubmitReport, BenchError> {
    let admin_token = random_hex(24)?;
    let nodes = cluster::start_nodes(opts.nodes, &opts.broker_exe, database_url, &admin_token, dir, None, &[]).await?;
    let brokers: Vec<Broker> = nodes.into_iter().map(|(b, _)| b).collect();
    let lb = if brokers.len() > 1 {
        let addrs: Vec<std::net::SocketAddr> = brokers.iter().map(|b| b.addr).collect();
        Some(lb::LoadBalancer::start(std::net::SocketAddr::from(([127, 0, 0, 1], 0)), &addrs).await?)
    } else {
        None
    };
    let addr = lb.as_ref().map_or(brokers[0].addr, |lb| lb.addr);
    // The nodes' CPU time summed, read from /proc around the measured run.
    let cpu = || brokers.iter().map(|b| b.stats().cpu_seconds).sum::<Option<f64>>();
    let result = drive(opts, addr, &admin_token, database_url, &cpu).await;
    // Read the peak before stopping: /proc/<pid> is gone once the broker is reaped.
    let rss_kib = brokers.iter().filter_map(Broker::peak_rss_kib).max();
    let log_tail = brokers[0].log_tail();
    drop(lb);
    let mut stopped = Ok(Some(std::process::ExitStatus::default()));
    for broker in brokers {
        let s = broker.stop().await;
        if !matches!(s, Ok(Some(status)) if status.success()) {
            stopped = s;
        }
    }
    let mut report = result.map_err(|e| match e {
        // Attach the broker's log to errors where the broker is the likely culprit.
        BenchError::Http { context, detail } => {
            BenchError::Http { context, detail: format!("{detail}\n--- broker stderr (last lines) ---\n{log_tail}") }
        }
        other => other,
    })?;
    report.backend = backend.to_string();
    report.broker_peak_rss_mib = rss_kib.map(|k| k as f64 / 1024.0);
    match stopped? {
        Some(status) if status.success() => {}
        Some(status) => report
            .problems
            .push(format!("the broker exited with {status} after SIGTERM (the contract asks for exit 0)")),
        None => report.problems.push("the broker did not exit within 30 s of SIGTERM and was killed".to_string()),
    }
    Ok(report)
}

/// Set-up, warm-up, the measured run and verification, against a running broker.
async fn drive(
    opts: &SubmitOptions,
    addr: std::net::SocketAddr,
    admin_token: &str,
    database_url: &str,
    broker_cpu: &dyn Fn() -> Option<f64>,
) -> Result<SubmitReport, BenchError> {
    let mut conn = Conn::connect(addr)
        .await
        .map_err(|detail| BenchError::Http { context: "connecting for set-up".into(), detail })?;
    let auth = setup::tenant(&mut conn, admin_token).await?;
    // Nobody polls for this agent: tasks stay pending, which is all intake needs.
    let addresses = vec!["tcp://127.0.0.1:9100".to_string(); opts.printers];
    setup::store_and_printers(&mut conn, &auth, &addresses).await?;

    let mut problems = Vec::new();
    let preloaded = if opts.preload.is_empty() {
        None
    } else {
        let (report, layout) = preload::preload(&mut conn, &auth, database_url, opts.printers, opts.preload).await?;
        if !report.broker_counts_agree {
            problems.push(format!("after the preload the broker's task counts differ: {}", report.render_line()));
        }
        Some((report, layout))
    };
    // The preloaded history is older than every task of the run: listings stop there.
    let floor = preloaded.as_ref().map(|(_, layout)| preload::floor_id(layout));
    // Warm-up keys ("W…") are disjoint from the measured ones ("B…"), so the measured run
    // starts with no key already known and its 201 count equals its distinct keys.
    let mut answered = std::collections::HashMap::new();
    if opts.warmup > 0 {
        let plan = build_plan("W", opts.warmup, opts.duplicate_share, opts.printers, PLAN_SEED ^ 0x5741_524D);
        let bodies: Arc<Vec<Bytes>> = Arc::new(plan.requests.iter().map(|r| r.body.clone()).collect());
        let run = load::run_load_batched(addr, auth.clone(), bodies, opts.concurrency, opts.batch).await?;
        answered.extend(verify::check_answers("warm-up", &plan, &run.outcomes, &Default::default(), &mut problems));
    }

    let plan = build_plan("B", opts.requests, opts.duplicate_share, opts.printers, PLAN_SEED);
    let bodies: Arc<Vec<Bytes>> = Arc::new(plan.requests.iter().map(|r| r.body.clone()).collect());
    let cpu_before = broker_cpu();
    let run = load::run_load_batched(addr, auth.clone(), bodies, opts.concurrency, opts.batch).await?;
    let cpu_after = broker_cpu();
    answered.extend(verify::check_answers("measured", &plan, &run.outcomes, &Default::default(), &mut problems));

    let listed = verify::list_tasks_above(&mut conn, &auth, STORE_ID, answered.len(), floor.as_deref()).await?;
    verify::check_listing(&answered, &listed, &mut problems);

    let count = |s: u16| run.outcomes.iter().filter(|o| o.status == s).count();
    let (accepted, duplicates) = (count(201), count(200));
    let wall = run.wall.as_secs_f64();
    let per_sec = |n: usize| if wall > 0.0 { n as f64 / wall } else { 0.0 };
    Ok(SubmitReport {
        backend: String::new(),
        machine: report::machine_line(),
        requests: opts.requests,
        batch: run.batch,
        requests_http: run.requests_http,
        warmup: opts.warmup,
        concurrency: opts.concurrency,
        printers: opts.printers,
        duplicate_share: opts.duplicate_share,
        duplicate_share_actual: plan.repeats() as f64 / plan.requests.len() as f64,
        distinct_keys: plan.distinct_keys,
        wall_seconds: wall,
        accepted,
        duplicates,
        other: run.outcomes.len() - accepted - duplicates,
        accepted_per_sec: per_sec(accepted),
        duplicates_per_sec: per_sec(duplicates),
        answers_per_sec: per_sec(run.outcomes.iter().filter(|o| o.status != 0).count()),
        requests_http_per_sec: per_sec(run.request_latencies_us.len()),
        latency_ms: LatencyReport::from_outcomes(&run.outcomes),
        http_latency_ms: Percentiles::from_micros(run.request_latencies_us),
        broker_peak_rss_mib: None,
        nodes: opts.nodes,
        broker_cpu_ms_per_request: match (cpu_before, cpu_after) {
            (Some(a), Some(b)) if opts.requests > 0 => Some((b - a) * 1000.0 / opts.requests as f64),
            _ => None,
        },
        preload: preloaded.map(|(r, _)| r),
        problems,
    })
}

/// A new temporary directory for one run's files (database, logs, paper log), removed
/// when the returned guard is dropped.
fn run_dir(prefix: &str) -> Result<tempfile::TempDir, BenchError> {
    tempfile::Builder::new().prefix(prefix).tempdir().map_err(|e| BenchError::io("creating a temporary directory", e))
}

/// `bytes` random bytes from the kernel, as hex: admin token and schema suffix.
fn random_hex(bytes: usize) -> Result<String, BenchError> {
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(|e| BenchError::io("reading /dev/urandom", e))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_documented_ones() {
        let o = SubmitOptions::new("onceprint");
        assert_eq!((o.requests, o.concurrency, o.printers, o.warmup), (200_000, 64, 10, 5_000));
        assert_eq!(o.batch, 1);
        assert_eq!(o.duplicate_share, 0.30);
        assert!(o.database.is_none());
        assert!(validate(&o).is_ok());
    }

    #[test]
    fn bad_options_are_refused() {
        let base = SubmitOptions::new("onceprint");
        let check = |f: &dyn Fn(&mut SubmitOptions)| {
            let mut o = base.clone();
            f(&mut o);
            validate(&o).is_err()
        };
        assert!(check(&|o| o.requests = 0));
        assert!(check(&|o| o.concurrency = 0));
        assert!(check(&|o| o.batch = 0));
        assert!(check(&|o| o.batch = 501));
        assert!(!check(&|o| o.batch = 500));
        assert!(check(&|o| o.printers = 0));
        assert!(check(&|o| o.duplicate_share = 1.0));
        assert!(check(&|o| o.duplicate_share = -0.1));
        assert!(check(&|o| o.database = Some("sqlite://x.db".into())));
        assert!(!check(&|o| o.database = Some("postgres://postgres@127.0.0.1/test".into())));
    }

    #[test]
    fn random_hex_has_the_asked_length() {
        let a = random_hex(8).unwrap();
        assert_eq!(a.len(), 16);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, random_hex(8).unwrap());
    }
}
