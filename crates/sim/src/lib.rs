//! Simulation testing of the delivery path (docs/SIMULATION.md).
//!
//! This crate owns `onceprint sim` and the seeds `cargo test` runs: a fault schedule drawn
//! from a seed ([`schedule`]) is played against the real broker code — intake, the lane
//! engine and its agent transport, the CloudPRNT and Epson Server Direct Print adapters on
//! the polled mechanism, the push driver, the manual channel, failover, the sweeps, the
//! offline sync, retention — on a real store, under a clock only the schedule moves, with a POS,
//! store agents running the agent's own worker and journal (and its offline outbox), ESC/POS
//! printers behind them, printers of every other kind (MQTT devices on the real MQTT
//! transport and inbox, behind a simulated MQTT server), a webhook receiver, the shop's
//! line and the network between them simulated by their
//! documented rules ([`world`]). After every step the world checks the promise against
//! what it knows and the broker does not: the paper. A failing run names its seed and a
//! shrunk schedule that still fails, and a seed replays the same run.
//!
//! It must never be linked into the broker or the agent, reach for the machine's clock
//! or randomness in deciding what a run does (the seed alone decides), or hold rules of
//! its own about what the broker should do: the invariants are the promise as the README
//! and docs/SIMULATION.md state it, not the engine's code restated.
//!
//! Where things are: `schedule.rs`, a fault schedule drawn from a seed (`rng.rs`, its own
//! SplitMix64); `world.rs`, the run under a `ManualClock` with a POS, store agents, printers
//! of each kind, a webhook receiver and the network; `world/lan.rs`, the shop's LAN path on
//! the agent's real outbox; `world/store_agent.rs`, the agents' real worker and journal and
//! their simulated ESC/POS printers; `world/mqtt.rs`, the MQTT printers and their server;
//! `world/nodes.rs`, the broker as several nodes on the one database behind a load
//! balancer; lanes are drained at the end, and failing schedules are shrunk and replayed
//! by seed.

pub mod cli;
pub mod rng;
pub mod schedule;
pub mod world;

use std::path::PathBuf;
use std::sync::OnceLock;

use onceprint_store::testing::Harness;
use schedule::Op;
use world::{Tally, Violation, World};

/// Where a run's store lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// A SQLite file on tmpfs (`/dev/shm` where there is one), copied from a migrated
    /// template for each run.
    Sqlite,
    /// A fresh schema on the PostgreSQL server named by `ONCEPRINT_TEST_POSTGRES` for each
    /// run (slower).
    Postgres,
}

/// How runs are made.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub backend: Backend,
    /// A schedule has between a quarter of this and this many steps.
    pub max_steps: usize,
    /// Shrink a failing schedule before reporting it.
    pub shrink: bool,
    /// Print every step and the tasks after it.
    pub trace: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options { backend: Backend::Sqlite, max_steps: 80, shrink: true, trace: false }
    }
}

/// Why a run could not even start.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("cannot prepare the store: {0}")]
    Store(String),
    #[error("the PostgreSQL backend needs ONCEPRINT_TEST_POSTGRES (e.g. postgres://postgres@127.0.0.1:5432/test)")]
    NoPostgres,
}

/// A seed whose run broke the promise.
#[derive(Debug, Clone)]
pub struct Failure {
    pub seed: u64,
    pub violation: Violation,
    /// The schedule the seed drew.
    pub schedule: Vec<Op>,
    /// The shortest schedule found that still fails (the schedule itself when not shrunk).
    pub shrunk: Vec<Op>,
    pub shrunk_violation: Violation,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = |v: &Violation| match v.step {
            Some(s) => format!("after step {s}"),
            None => "while draining".to_owned(),
        };
        writeln!(f, "seed {} broke the promise {}: {}", self.seed, at(&self.violation), self.violation.what)?;
        writeln!(f, "replay: onceprint sim --seed {}", self.seed)?;
        writeln!(
            f,
            "shrunk from {} to {} steps, failing {}: {}",
            self.schedule.len(),
            self.shrunk.len(),
            at(&self.shrunk_violation),
            self.shrunk_violation.what
        )?;
        for (i, op) in self.shrunk.iter().enumerate() {
            writeln!(f, "  {i:>3}  {op}")?;
        }
        Ok(())
    }
}

fn runtime() -> tokio::runtime::Runtime {
    // One thread: the steps run one after the other, so the order of everything the
    // broker does in a run is the schedule's.
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime")
}

/// A migrated SQLite database, made once per process; each run copies it.
fn template() -> Result<&'static PathBuf, SimError> {
    static TEMPLATE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    TEMPLATE
        .get_or_init(|| {
            let dir = scratch_dir("template");
            let path = dir.join("template.db");
            let store = onceprint_store_sqlite::SqliteStore::open(&path).map_err(|e| e.to_string())?;
            drop(store);
            // The migrations are in the main file once the store is closed; a WAL left
            // behind is folded in by the next open.
            Ok(path)
        })
        .as_ref()
        .map_err(|e| SimError::Store(e.clone()))
}

fn scratch_dir(what: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let base = if std::path::Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
    base.join(format!("onceprint-sim-{}-{what}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)))
}

struct DirGuard(PathBuf);

impl Drop for DirGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn harness(rt: &tokio::runtime::Runtime, backend: Backend) -> Result<Harness, SimError> {
    match backend {
        Backend::Sqlite => {
            let template = template()?;
            let dir = scratch_dir("run");
            std::fs::create_dir_all(&dir).map_err(|e| SimError::Store(format!("{}: {e}", dir.display())))?;
            let name = template.file_name().and_then(|n| n.to_str()).unwrap_or("template.db").to_owned();
            let from = template.parent().expect("the template is in a directory");
            for entry in std::fs::read_dir(from).map_err(|e| SimError::Store(e.to_string()))? {
                let entry = entry.map_err(|e| SimError::Store(e.to_string()))?;
                let file = entry.file_name().to_string_lossy().into_owned();
                if file.starts_with(&name) {
                    let to = dir.join(file.replacen(&name, "run.db", 1));
                    std::fs::copy(entry.path(), &to).map_err(|e| SimError::Store(e.to_string()))?;
                }
            }
            let path = dir.join("run.db");
            let store = onceprint_store_sqlite::SqliteStore::open(&path).map_err(|e| SimError::Store(e.to_string()))?;
            Ok(Harness {
                store: std::sync::Arc::new(store),
                guard: Box::new(DirGuard(dir)),
                url: format!("sqlite://{}", path.display()),
            })
        }
        Backend::Postgres => rt.block_on(onceprint_store_postgres::testing::fresh_store()).ok_or(SimError::NoPostgres),
    }
}

/// Plays `ops` in a fresh world.
pub fn run_schedule(ops: &[Op], options: &Options) -> Result<Result<Tally, Violation>, SimError> {
    let rt = runtime();
    let harness = harness(&rt, options.backend)?;
    let agent_dir = scratch_dir("agent");
    std::fs::create_dir_all(&agent_dir).map_err(|e| SimError::Store(format!("{}: {e}", agent_dir.display())))?;
    let _agent_dir = DirGuard(agent_dir.clone());
    let world = World::new(rt, harness, options.trace, &agent_dir).map_err(SimError::Store)?;
    Ok(world.run(ops))
}

/// Plays the schedule of `seed`; on a broken promise, shrinks it.
pub fn run_seed(seed: u64, options: &Options) -> Result<Result<Tally, Box<Failure>>, SimError> {
    let schedule = schedule::generate(seed, options.max_steps);
    match run_schedule(&schedule, options)? {
        Ok(t) => Ok(Ok(t)),
        Err(violation) => {
            let (shrunk, shrunk_violation) = if options.shrink {
                shrink(&schedule, violation.clone(), &Options { trace: false, ..*options })?
            } else {
                (schedule.clone(), violation.clone())
            };
            Ok(Err(Box::new(Failure { seed, violation, schedule, shrunk, shrunk_violation })))
        }
    }
}

/// Removes steps while the schedule still fails (delta debugging: chunks of halving size,
/// then single steps), within a bound of runs.
pub fn shrink(ops: &[Op], violation: Violation, options: &Options) -> Result<(Vec<Op>, Violation), SimError> {
    let mut best = ops.to_vec();
    let mut best_violation = violation;
    let mut runs = 0;
    let mut chunk = (best.len() / 2).max(1);
    // The steps after the failing one never ran: cut them first.
    if let Some(step) = best_violation.step {
        best.truncate(step + 1);
    }
    while chunk >= 1 && runs < 400 {
        let mut i = 0;
        let mut progressed = false;
        while i < best.len() && runs < 400 {
            let mut candidate = best.clone();
            let end = (i + chunk).min(candidate.len());
            candidate.drain(i..end);
            runs += 1;
            match run_schedule(&candidate, options)? {
                Err(v) => {
                    best = candidate;
                    if let Some(step) = v.step {
                        best.truncate(step + 1);
                    }
                    best_violation = v;
                    progressed = true;
                }
                Ok(_) => i += chunk,
            }
        }
        if !progressed {
            if chunk == 1 {
                break;
            }
            chunk /= 2;
        }
    }
    Ok((best, best_violation))
}
