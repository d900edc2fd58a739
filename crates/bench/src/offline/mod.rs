//! The issue 14 acceptance run behind `onceprint bench offline`: a shop whose internet
//! connection keeps dropping, proving (or refuting) that every order prints exactly once
//! and is accounted for once the line is back.
//!
//! It starts, from the given executable, a broker (`serve` on a fresh SQLite file or a
//! fresh PostgreSQL schema, with short delivery timings and the print types receipt,
//! kitchen and label: [`crate::faults::schedule::broker_config_with`]), one `printer-sim`
//! with P printers and a paper log, a tenant with the store `s1`, its printers, an agent
//! token and a LAN key, and a store agent with its LAN listener (`agent --listen`). The
//! agent reaches the broker only through the bench's proxy ([`crate::lb`] with an
//! [`Uplink`]): the shop's line. The run then
//!
//! - alternates online and offline periods of the line, starting online; offline, the
//!   proxy takes connections and drops every byte both ways, so the agent's requests time
//!   out as on a dead line, and when the line is back the connections that lived through
//!   the cut are closed;
//! - submits N orders at an even pace over the submission window, each to the cloud (the
//!   broker's `POST /v1/print-tasks` with the tenant's key, directly: only the shop's line
//!   is down), to the LAN (the agent's listener with the LAN key) or to both, in a seeded
//!   mix; every submission is sent again 1–3 times with the same body (some at the same
//!   moment, racing it), and each send is retried until it gets a final answer
//!   ([`crate::faults::submit`]);
//! - with `kill_agent_every`, kills the agent with SIGKILL at that pace and starts it
//!   again on the same state directory, listener and agent id, whatever the line is doing.
//!
//! When every submission is answered the line comes back for good, and the run waits (up
//! to the drain timeout) until the agent's `/healthz` counts no offline task left to
//! sync, no task of the store is `pending`, `sent` or `retrying`, and every answered order
//! has its task at the broker. The verdict comes from the paper log first: no order on
//! paper twice, and every order on paper once or, if not, `in_doubt` or `failed` at the
//! broker (listed by name); an order on paper once that the broker holds `in_doubt` is
//! honest doubt (the agent was killed before the printer confirmed: a person looks), listed
//! too, while any other disagreement of the broker with the paper is a problem. Then every answer: all answers of one order must name one
//! task, directly or through a LAN task id the broker resolves to it
//! (`GET /v1/print-tasks/{id}`). Then the broker's own account of the day
//! (`GET /v1/stores/s1/reconciliation`): nothing printed more than once, the device log's
//! lists (`device_printed_broker_not`, `broker_printed_device_not`) empty, and one ledger
//! charge per order.
//!
//! Like the other runs it talks to nothing but the processes it started, on 127.0.0.1,
//! and the PostgreSQL database it was given (inside a schema of its own, dropped after),
//! and leaves nothing running.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::header::HeaderValue;
use hyper::Method;
use serde::Serialize;
use serde_json::{json, Value};

use crate::broker::{Broker, Launch};
use crate::e2e::task_body_for;
use crate::faults::chaos::{self, AgentCtx, KillRecord};
use crate::faults::schedule::{broker_config_with, Kill, Submissions};
use crate::faults::submit::{submit_all, SubmitRun};
use crate::http::{bearer, pct_encode, snippet, Conn};
use crate::lb::{LoadBalancer, Uplink};
use crate::load::Outcome;
use crate::paper::{PaperWatcher, Tally};
use crate::plan::{Plan, PlannedRequest, SplitMix64};
use crate::procs::{agent_args, note_stop, Proc};
use crate::report::machine_line;
use crate::setup::{self, Deployment};
use crate::sim::{free_port_run, start_sim, Sim, MAX_PRINTERS};
use crate::verify::{self, ListedTask};
use crate::{random_hex, BenchError, STORE_ID};

/// The shop's print types: name, priority and how often an order gets it (out of 100).
/// All three are in the broker's default configuration too.
pub const PRINT_TYPES: [(&str, i32, u32); 3] = [("receipt", 10, 50), ("kitchen", 20, 35), ("label", 30, 15)];
/// The agent's id, the same in every life of the agent.
const AGENT_ID: &str = "bench-offline-agent";
/// Share of the re-sends of a submission sent at the same moment as it; the others follow
/// it by up to [`RESEND_SPREAD_MS`] (a POS retrying after a slow answer).
const RACING_SHARE: f64 = 0.3;
const RESEND_SPREAD_MS: usize = 3_000;
/// How long the agent gets to come up, fetch its directory and LAN keys and listen.
const AGENT_READY: Duration = Duration::from_secs(30);
/// A killed agent is started again this long after the kill.
const AGENT_DOWN_MS: u64 = 200;
/// How often the drain looks whether work is left.
const DRAIN_POLL: Duration = Duration::from_millis(250);
/// Connections resolving answered task ids at the broker.
const RESOLVE_CONNECTIONS: usize = 4;
/// Entries of each per-order list the text report shows (the JSON has them all).
const TEXT_EXAMPLES: usize = 10;

/// The share of orders sent to each side, as percentages (or any weights).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Mix {
    pub cloud: u32,
    pub lan: u32,
    pub both: u32,
}

impl Default for Mix {
    fn default() -> Self {
        Mix { cloud: 40, lan: 40, both: 20 }
    }
}

impl std::fmt::Display for Mix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.cloud, self.lan, self.both)
    }
}

impl std::str::FromStr for Mix {
    type Err = String;

    /// `CLOUD/LAN/BOTH`, e.g. `40/40/20`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let parts: Vec<&str> = s.split('/').map(str::trim).collect();
        let bad = || format!("{s:?}: expected CLOUD/LAN/BOTH shares such as 40/40/20");
        let [cloud, lan, both] = parts.as_slice() else { return Err(bad()) };
        let n = |x: &str| x.parse::<u32>().map_err(|_| bad());
        let mix = Mix { cloud: n(cloud)?, lan: n(lan)?, both: n(both)? };
        if mix.total() == 0 || mix.total() > 1_000_000 {
            return Err(format!("{s:?}: the shares must add up to something between 1 and 1000000"));
        }
        Ok(mix)
    }
}

impl Mix {
    fn total(&self) -> u32 {
        self.cloud.saturating_add(self.lan).saturating_add(self.both)
    }

    fn pick(&self, rng: &mut SplitMix64) -> Channel {
        let x = rng.below(self.total() as usize) as u32;
        if x < self.cloud {
            Channel::Cloud
        } else if x < self.cloud + self.lan {
            Channel::Lan
        } else {
            Channel::Both
        }
    }
}

/// Where an order is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Channel {
    Cloud,
    Lan,
    Both,
}

impl Channel {
    fn cloud(self) -> bool {
        matches!(self, Channel::Cloud | Channel::Both)
    }

    fn lan(self) -> bool {
        matches!(self, Channel::Lan | Channel::Both)
    }
}

/// What `run_offline` should do.
#[derive(Debug, Clone)]
pub struct OfflineOptions {
    /// The `onceprint` executable: broker, agent and printer simulator.
    pub exe: PathBuf,
    /// `None`: a fresh SQLite file. `postgres://…`: a fresh schema there, dropped after.
    pub database: Option<String>,
    /// Orders.
    pub tasks: usize,
    /// The store agent's printers (raw TCP, one `printer-sim`).
    pub printers: usize,
    /// Length of each online period of the shop's line, and of each offline one.
    pub online: Duration,
    pub offline: Duration,
    /// The orders' first submissions are spread evenly over this window.
    pub window: Duration,
    pub mix: Mix,
    /// Each submission is sent again between `resends.0` and `resends.1` times.
    pub resends: (usize, usize),
    /// SIGKILL and restart of the agent at this pace during the window.
    pub kill_agent_every: Option<Duration>,
    /// Connections of each side (cloud and LAN).
    pub concurrency: usize,
    pub seed: u64,
    /// How long everything gets to settle once the line is back for good.
    pub drain_timeout: Duration,
    /// Every submission must be answered within this after the window.
    pub timeout: Duration,
    /// Keep the run's directory (logs, paper log, agent state, SQLite file) and name it.
    pub keep_dir: bool,
}

impl OfflineOptions {
    /// The defaults for a given executable.
    pub fn new(exe: impl Into<PathBuf>) -> Self {
        Self {
            exe: exe.into(),
            database: None,
            tasks: 5_000,
            printers: 4,
            online: Duration::from_secs(8),
            offline: Duration::from_secs(8),
            window: Duration::from_secs(48),
            mix: Mix::default(),
            resends: (1, 3),
            kill_agent_every: None,
            concurrency: 8,
            seed: 1,
            drain_timeout: Duration::from_secs(180),
            timeout: Duration::from_secs(300),
            keep_dir: false,
        }
    }
}

fn validate(opts: &OfflineOptions) -> Result<(), BenchError> {
    let bad = |m: String| Err(BenchError::InvalidOptions(m));
    if opts.tasks == 0 || u32::try_from(opts.tasks).is_err() {
        return bad("tasks must be between 1 and 4294967295".into());
    }
    if opts.printers == 0 || opts.printers > MAX_PRINTERS {
        return bad(format!("printers must be 1–{MAX_PRINTERS}"));
    }
    if opts.online < Duration::from_millis(200) || opts.offline < Duration::from_millis(200) {
        return bad("online and offline periods must be at least 200 ms".into());
    }
    if opts.window < Duration::from_millis(500) {
        return bad("the submission window must be at least 500 ms".into());
    }
    if opts.window <= opts.online {
        return bad("the submission window must be longer than one online period, or the line never drops".into());
    }
    if opts.mix.total() == 0 {
        return bad("the mix must send some orders somewhere".into());
    }
    if opts.resends.0 > opts.resends.1 || opts.resends.1 > 10 {
        return bad("re-sends must be a range within 0–10".into());
    }
    if opts.kill_agent_every.is_some_and(|e| e < Duration::from_millis(500)) {
        return bad("the agent may be killed at most every 500 ms".into());
    }
    if opts.concurrency == 0 || opts.concurrency > 1_000 {
        return bad("concurrency must be 1–1000".into());
    }
    if opts.drain_timeout.is_zero() || opts.timeout.is_zero() {
        return bad("the drain timeout and the timeout must be positive".into());
    }
    crate::validate_database(opts.database.as_deref())
}

/// One order of the plan.
#[derive(Debug, Clone, Copy)]
struct Order {
    channel: Channel,
}

/// The seeded plan: per order its side, and the sends of each side in sending order.
struct OfflinePlan {
    orders: Vec<Order>,
    cloud: Submissions,
    lan: Submissions,
}

/// Draws the orders and their sends. The order `n` has `biz_no` `E<n>` and prints the
/// marker `E2E <n>` (the bodies of `bench e2e`), so the paper log tells orders apart.
fn plan(opts: &OfflineOptions) -> OfflinePlan {
    let mut rng = SplitMix64::new(opts.seed ^ 0x004f_4646_4c49_4e45);
    let window_ms = opts.window.as_millis() as u64;
    let mut orders = Vec::with_capacity(opts.tasks);
    let mut printer_of = Vec::with_capacity(opts.tasks);
    let mut print_type_of = Vec::with_capacity(opts.tasks);
    // (send time, order of drawing, request, racing) per side.
    let mut sends: [Vec<(u64, usize, PlannedRequest, bool)>; 2] = [Vec::new(), Vec::new()];
    let total_weight: u32 = PRINT_TYPES.iter().map(|(_, _, w)| w).sum();
    for n in 0..opts.tasks {
        let at = n as u64 * window_ms / opts.tasks as u64;
        let channel = opts.mix.pick(&mut rng);
        let printer = rng.below(opts.printers);
        let mut pick = rng.below(total_weight as usize) as u32;
        let mut print_type = PRINT_TYPES[0].0;
        for (name, _, weight) in PRINT_TYPES {
            if pick < weight {
                print_type = name;
                break;
            }
            pick -= weight;
        }
        orders.push(Order { channel });
        printer_of.push(printer);
        print_type_of.push(print_type);
        let body = task_body_for(n as u32, printer, print_type);
        for (side, used) in [(0, channel.cloud()), (1, channel.lan())] {
            if !used {
                continue;
            }
            let list = &mut sends[side];
            let key = n as u32;
            list.push((at, list.len(), PlannedRequest { key, repeat: false, body: body.clone() }, false));
            let (lo, hi) = opts.resends;
            for _ in 0..lo + rng.below(hi - lo + 1) {
                let racing = rng.next_f64() < RACING_SHARE;
                let when = if racing { at } else { at + 1 + rng.below(RESEND_SPREAD_MS) as u64 };
                list.push((when, list.len(), PlannedRequest { key, repeat: true, body: body.clone() }, racing));
            }
        }
    }
    let [cloud, lan] = sends.map(|mut list| {
        list.sort_by_key(|(at, order, _, _)| (*at, *order));
        let distinct: BTreeSet<u32> = list.iter().map(|(_, _, r, _)| r.key).collect();
        let mut s = Submissions {
            plan: Plan { prefix: "E", requests: Vec::with_capacity(list.len()), distinct_keys: distinct.len() },
            send_at_ms: Vec::with_capacity(list.len()),
            racing: Vec::with_capacity(list.len()),
            printer_of: printer_of.clone(),
            print_type_of: print_type_of.clone(),
        };
        for (at, _, req, racing) in list {
            s.send_at_ms.push(at);
            s.racing.push(racing);
            s.plan.requests.push(req);
        }
        s
    });
    OfflinePlan { orders, cloud, lan }
}

/// The moments of the agent kills: every `every` from the start of the window to its end.
fn agent_kill_plan(every: Option<Duration>, window: Duration) -> Vec<Kill> {
    let Some(every) = every.filter(|e| !e.is_zero()) else { return Vec::new() };
    let (every_ms, window_ms) = (every.as_millis() as u64, window.as_millis() as u64);
    (1..)
        .map(|i| i * every_ms)
        .take_while(|&at| at < window_ms)
        .map(|at_ms| Kill { at_ms, down_ms: AGENT_DOWN_MS })
        .collect()
}

/// One span in which the shop's line was down, in seconds after the window began.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Cut {
    pub from_s: f64,
    pub to_s: f64,
}

/// What one side's submissions got.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SideStats {
    /// Orders sent to this side.
    pub orders: usize,
    /// Planned sends (each order's first submission and its re-sends).
    pub sends: usize,
    /// HTTP attempts, the retries of sends that got no answer or a 5xx / 429 included.
    pub attempts: u64,
    pub created: usize,
    pub duplicate: usize,
    /// Answers carrying `X-Onceprint-Offline: accepted-by-agent`.
    pub accepted_offline: usize,
    /// Final answers other than 201 and 200 (none expected), and sends that got no final
    /// answer before the deadline (status 0).
    pub other: usize,
    pub retried_no_answer: usize,
    pub retried_5xx: usize,
}

fn side_stats(orders: usize, subs: &Submissions, run: &SubmitRun) -> SideStats {
    let count = |s: u16| run.outcomes.iter().filter(|o| o.status == s).count();
    let (created, duplicate) = (count(201), count(200));
    SideStats {
        orders,
        sends: subs.plan.requests.len(),
        attempts: run.total_attempts(),
        created,
        duplicate,
        accepted_offline: run.outcomes.iter().filter(|o| o.offline).count(),
        other: run.outcomes.len() - created - duplicate,
        retried_no_answer: run.failed_attempts.iter().filter(|a| a.status == 0).count(),
        retried_5xx: run.failed_attempts.iter().filter(|a| a.status != 0).count(),
    }
}

/// One order the verdict names.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct OrderFinding {
    pub biz_no: String,
    pub channel: Channel,
    /// Sheets on paper carrying the order's marker.
    pub on_paper: u32,
    /// The broker's task(s) of the order (`GET /v1/print-tasks?store_id=…` by `biz_no`).
    pub broker_tasks: Vec<String>,
    pub broker_state: Option<String>,
    /// Every task id the order's answers named, in the order first seen.
    pub answered_ids: Vec<String>,
    pub detail: String,
}

/// What the paper log says, over all orders.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PaperCounts {
    /// Orders on paper exactly once.
    pub printed_once: usize,
    /// Orders on paper more than once, and the sheets beyond the first.
    pub printed_twice_or_more: usize,
    pub extra_sheets: usize,
    /// Orders never on paper that the broker holds `in_doubt` or `failed`.
    pub not_printed_accounted: usize,
    /// Orders never on paper that the broker does not account for.
    pub lost: usize,
    /// Orders on paper once that the broker holds `in_doubt` (honest doubt: the agent
    /// could not prove the sheet, e.g. it was killed before the printer confirmed).
    pub in_doubt_on_paper: usize,
    pub jobs: usize,
}

/// The broker's reconciliation of the run's business day(s).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReconciliationCheck {
    pub dates: Vec<String>,
    pub submitted: u64,
    pub printed: u64,
    pub in_doubt: u64,
    pub failed: u64,
    pub open: u64,
    pub ledger_charges: u64,
    pub printed_more_than_once: Vec<String>,
    /// `device_log` of the report (`present` / `none`); `None` when the broker's report
    /// has no device-log fields at all (a broker without the device-log digest).
    pub device_log: Option<String>,
    pub device_printed_broker_not: Option<Vec<Value>>,
    pub broker_printed_device_not: Option<Vec<Value>>,
    /// Seconds after the drain until the device-log lists were empty (or the last look).
    pub waited_s: f64,
}

/// The report of one offline run.
#[derive(Debug, Clone, Serialize)]
pub struct OfflineReport {
    pub backend: String,
    pub machine: String,
    pub seed: u64,
    pub tasks: usize,
    pub printers: usize,
    pub mix: Mix,
    pub online_s: f64,
    pub offline_s: f64,
    pub window_s: f64,
    pub kill_agent_every_s: Option<f64>,
    /// When the line was down.
    pub cuts: Vec<Cut>,
    pub agent_kills: Vec<KillRecord>,
    pub cloud: SideStats,
    pub lan: SideStats,
    /// From the first submission to the last final answer.
    pub submit_seconds: f64,
    pub drained: bool,
    pub drain_seconds: f64,
    pub drain_timeout_s: f64,
    pub paper: PaperCounts,
    /// Orders on paper more than once.
    pub duplicates: Vec<OrderFinding>,
    /// Orders never on paper and not `in_doubt` / `failed` at the broker.
    pub lost: Vec<OrderFinding>,
    /// Orders never on paper that the broker holds `in_doubt` or `failed`: accounted for.
    pub not_printed: Vec<OrderFinding>,
    /// Orders on paper once that the broker holds `in_doubt`: honest doubt, for a person.
    pub in_doubt_on_paper: Vec<OrderFinding>,
    /// Orders whose answers name different tasks, a task id the broker does not resolve,
    /// or that got a final answer other than 201 / 200.
    pub inconsistent: Vec<OrderFinding>,
    /// Orders whose broker record disagrees with the paper: more than one task, none, or
    /// on paper once but not `printed` (or `printed` but never on paper).
    pub broker_differs: Vec<OrderFinding>,
    /// Answered task ids that are not a task's own id, resolved through the broker.
    pub resolved_lan_ids: usize,
    pub reconciliation: ReconciliationCheck,
    /// What the run could not check, and why.
    pub notes: Vec<String>,
    pub total_seconds: f64,
    pub kept_dir: Option<String>,
    pub problems: Vec<String>,
}

/// Runs the whole offline run: start everything, set up, submit while the line comes and
/// goes, bring it back, drain, judge, stop everything.
///
/// Returns `Err` only when the run could not be carried out (a process would not start,
/// set-up failed); everything the broker, agent or printers got wrong in a run that could
/// is in [`OfflineReport::problems`].
pub async fn run_offline(opts: OfflineOptions) -> Result<OfflineReport, BenchError> {
    validate(&opts)?;
    let tmp = crate::run_dir("onceprint-bench-offline-")?;
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
    let kept = tmp.keep();
    match result {
        Ok(mut report) => {
            report.kept_dir = Some(kept.display().to_string());
            Ok(report)
        }
        Err(e) => Err(BenchError::Kept { dir: kept.display().to_string(), source: Box::new(e) }),
    }
}

/// The processes of a run; whatever is here at the end is stopped.
struct Running {
    broker: Option<Broker>,
    agent: Option<Proc>,
    sim: Option<Sim>,
}

async fn run_on(opts: &OfflineOptions, database_url: &str, dir: &Path) -> Result<OfflineReport, BenchError> {
    let started = Instant::now();
    let sim = start_sim(&opts.exe, opts.printers, dir).await?;
    let config = dir.join("broker.toml");
    std::fs::write(&config, broker_config_with(PRINT_TYPES.iter().map(|(name, priority, _)| (*name, *priority))))
        .map_err(|e| BenchError::io(format!("writing {}", config.display()), e))?;
    let admin_token = random_hex(24)?;
    let launch = Launch {
        exe: opts.exe.clone(),
        database_url: database_url.to_string(),
        admin_token: admin_token.clone(),
        log_path: dir.join("broker.log"),
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        config: Some(config),
        extra_args: Vec::new(),
    };
    let broker = Broker::launch(&launch).await?;
    let broker_addr = broker.addr;
    let mut running = Running { broker: Some(broker), agent: None, sim: Some(sim) };
    let uplink = Uplink::default();
    let proxy =
        LoadBalancer::start_with_uplink(SocketAddr::from(([127, 0, 0, 1], 0)), &[broker_addr], uplink.clone()).await;
    let result = match proxy {
        Ok(proxy) => {
            let r = drive(opts, &mut running, broker_addr, proxy.addr, &uplink, dir, &admin_token, started).await;
            drop(proxy);
            r
        }
        Err(e) => Err(e),
    };
    let tails = result.is_err().then(|| {
        let tail = |p: Option<&Proc>| p.map_or("(not running)".to_string(), Proc::log_tail);
        format!(
            "\n--- broker log (last lines) ---\n{}\n--- agent log ---\n{}\n--- printer-sim log ---\n{}",
            crate::procs::log_tail(&launch.log_path, 40),
            tail(running.agent.as_ref()),
            tail(running.sim.as_ref().map(|s| &s.proc))
        )
    });
    let mut stop_problems = Vec::new();
    if let Some(agent) = running.agent.take() {
        note_stop("agent", agent.stop().await, &mut stop_problems);
    }
    if let Some(sim) = running.sim.take() {
        note_stop("printer-sim", sim.proc.stop().await, &mut stop_problems);
    }
    if let Some(broker) = running.broker.take() {
        note_stop("broker", broker.stop().await, &mut stop_problems);
    }
    let mut report = result.map_err(|e| e.with_logs(tails))?;
    report.problems.extend(stop_problems);
    report.total_seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// The agent's `GET /healthz` on its LAN listener, as JSON; `None` while it does not answer.
async fn agent_health(listen: SocketAddr) -> Option<Value> {
    let mut conn = Conn::connect(listen).await.ok()?;
    let none = HeaderValue::from_static("Bearer none");
    let (status, body) =
        conn.request_within(Method::GET, "/healthz", &none, None, Duration::from_secs(5)).await.ok()?;
    if !status.is_success() {
        return None;
    }
    serde_json::from_slice(&body).ok()
}

/// Waits until the agent listens, has its store's directory and reaches the broker.
async fn wait_agent_ready(listen: SocketAddr, agent: &mut Option<Proc>, log: &Path) -> Result<(), BenchError> {
    let since = Instant::now();
    let mut last = Value::Null;
    while since.elapsed() < AGENT_READY {
        if let Some(status) = agent.as_mut().and_then(Proc::exited) {
            return Err(BenchError::Protocol {
                context: "starting the agent".into(),
                detail: format!("it exited with {status}:\n{}", crate::procs::log_tail(log, 40)),
            });
        }
        if let Some(h) = agent_health(listen).await {
            if h.get("directory") == Some(&Value::Bool(true))
                && h.get("broker").and_then(Value::as_str) == Some("reachable")
            {
                return Ok(());
            }
            last = h;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(BenchError::Protocol {
        context: "starting the agent".into(),
        detail: format!(
            "its /healthz on {listen} did not report a directory and a reachable broker within {AGENT_READY:?} (last: {last})\n{}",
            crate::procs::log_tail(log, 40)
        ),
    })
}

/// Takes the line down and brings it back, period after period, from `t0` (starting
/// online) until `done`; then brings it back for good. Returns the cuts.
async fn toggle_line(
    uplink: &Uplink,
    online: Duration,
    offline: Duration,
    t0: Instant,
    mut done: tokio::sync::watch::Receiver<bool>,
) -> Vec<Cut> {
    let mut cuts = Vec::new();
    let mut at = t0;
    let secs = |i: Instant| i.saturating_duration_since(t0).as_secs_f64();
    loop {
        let up = uplink.is_up();
        at += if up { online } else { offline };
        tokio::select! {
            _ = tokio::time::sleep_until(at.into()) => {}
            _ = done.wait_for(|d| *d) => break,
        }
        uplink.set_up(!up);
        if up {
            cuts.push(Cut { from_s: secs(Instant::now()), to_s: f64::NAN });
        } else if let Some(c) = cuts.last_mut() {
            c.to_s = secs(Instant::now());
        }
    }
    if !uplink.is_up() {
        uplink.set_up(true);
        if let Some(c) = cuts.last_mut() {
            c.to_s = secs(Instant::now());
        }
    }
    cuts
}

/// Set-up, the submissions while the line comes and goes, the drain and the verdict.
#[allow(clippy::too_many_arguments)]
async fn drive(
    opts: &OfflineOptions,
    running: &mut Running,
    broker_addr: SocketAddr,
    proxy_addr: SocketAddr,
    uplink: &Uplink,
    dir: &Path,
    admin_token: &str,
    started: Instant,
) -> Result<OfflineReport, BenchError> {
    let (first_port, paper_log) = match &running.sim {
        Some(s) => (s.first_port, s.paper_log.clone()),
        None => return Err(BenchError::Protocol { context: "set-up".into(), detail: "no simulator".into() }),
    };
    let mut conn = crate::faults::connect(broker_addr, "set-up").await?;
    let addresses: Vec<String> =
        (0..opts.printers).map(|p| format!("tcp://127.0.0.1:{}", first_port + p as u16)).collect();
    let Deployment { auth, agent_token } = setup::deploy(&mut conn, admin_token, &addresses).await?;
    let lan = setup::setup_call(&mut conn, &auth, &format!("/v1/stores/{STORE_ID}/lan-keys"), json!({})).await?;
    let lan_key = lan.get("key").and_then(Value::as_str).ok_or_else(|| BenchError::Protocol {
        context: "creating the LAN key".into(),
        detail: format!("no key in {lan}"),
    })?;
    let lan_auth = bearer(lan_key).map_err(|m| BenchError::Protocol { context: "the LAN key".into(), detail: m })?;

    // The agent's listener keeps its port over restarts: the POS knows it by address.
    let listen = SocketAddr::from(([127, 0, 0, 1], free_port_run(1)?));
    let mut args = agent_args(proxy_addr, &agent_token, &dir.join("agent"), Some(AGENT_ID));
    args.extend(
        [
            "--listen",
            &listen.to_string(),
            "--offline-after-ms",
            "500",
            "--directory-refresh-ms",
            "500",
            "--digest-interval-ms",
            "1000",
        ]
        .map(String::from),
    );
    let agent_log = dir.join("agent.log");
    let agent_ctx = AgentCtx::new(&opts.exe, &args, &agent_log, &[]);
    running.agent = Some(agent_ctx.spawn()?);
    wait_agent_ready(listen, &mut running.agent, &agent_log).await?;

    let watcher =
        PaperWatcher::start(paper_log, opts.tasks).map_err(|e| BenchError::io("starting the paper-log reader", e))?;
    let plan = plan(opts);
    let (cloud_subs, lan_subs) = (Arc::new(plan.cloud), Arc::new(plan.lan));
    let kills = agent_kill_plan(opts.kill_agent_every, opts.window);

    let t0 = Instant::now();
    let first_date = utc_date(time::OffsetDateTime::now_utc());
    let deadline = t0 + opts.window + opts.timeout;
    let (done_tx, done_rx) = tokio::sync::watch::channel(false);
    let mut kill_notes = Vec::new();
    let submissions = async {
        let both = tokio::join!(
            submit_all(broker_addr, auth.clone(), cloud_subs.clone(), opts.concurrency, t0, deadline),
            submit_all(listen, lan_auth.clone(), lan_subs.clone(), opts.concurrency, t0, deadline),
        );
        done_tx.send_replace(true);
        both
    };
    let ((cloud_run, lan_run), cuts, agent_kills) = tokio::join!(
        submissions,
        toggle_line(uplink, opts.online, opts.offline, t0, done_rx.clone()),
        chaos::agent_kills(&mut running.agent, &agent_ctx, &kills, t0, &mut kill_notes),
    );
    let agent_kills = agent_kills?;
    let submit_seconds = cloud_run.last_answer_us.max(lan_run.last_answer_us) as f64 / 1e6;
    let mut problems: Vec<String> = kill_notes;
    let mut notes: Vec<String> = Vec::new();
    if cuts.is_empty() {
        notes.push("the line never went down: the submissions ended within the first online period".into());
    }
    if lan_run.outcomes.iter().all(|o| !o.offline) && !lan_subs.plan.requests.is_empty() {
        notes.push("no LAN answer was accepted offline: the agent's offline path was not exercised".into());
    }

    // The line is back for good (toggle_line saw to it); the agent must run to drain.
    uplink.set_up(true);
    let agent_status = running.agent.as_mut().map(Proc::exited);
    if !matches!(agent_status, Some(None)) {
        problems.push(format!("the agent had exited on its own ({agent_status:?}) when the submissions ended"));
        running.agent = Some(agent_ctx.spawn()?);
    }

    // Every order that got an answer somewhere must end up as a task at the broker.
    let answered_orders: BTreeSet<u32> =
        answered(&cloud_subs, &cloud_run).chain(answered(&lan_subs, &lan_run)).collect();
    let drain_start = Instant::now();
    let mut conn = crate::faults::connect(broker_addr, "draining").await?;
    let mut last_wait = String::new();
    let drained = loop {
        let health = agent_health(listen).await;
        let unsynced = health.as_ref().and_then(|h| h.get("offline_tasks_not_synced")).and_then(Value::as_u64);
        if unsynced == Some(0) && !verify::any_active(&mut conn, &auth).await? {
            let listed = verify::list_states(&mut conn, &auth, &format!("store_id={STORE_ID}"), opts.tasks).await?;
            let have: BTreeSet<&str> = listed.iter().map(|t| t.biz_no.as_str()).collect();
            let missing = answered_orders.iter().filter(|n| !have.contains(format!("E{n}").as_str())).count();
            if missing == 0 {
                break true;
            }
            last_wait = format!("{missing} answered orders have no task at the broker yet");
        } else {
            last_wait = format!("the agent's /healthz: {}", health.map_or("no answer".to_string(), |h| h.to_string()));
        }
        if drain_start.elapsed() >= opts.drain_timeout {
            break false;
        }
        tokio::time::sleep(DRAIN_POLL).await;
    };
    let drain_seconds = drain_start.elapsed().as_secs_f64();
    if !drained {
        problems.push(format!(
            "the run did not drain within {} s of the line coming back for good (last: {last_wait})",
            opts.drain_timeout.as_secs()
        ));
    }
    crate::faults::wait_for_quiet_paper(&watcher).await;
    let tally =
        watcher.finish().map_err(|detail| BenchError::Protocol { context: "reading the paper log".into(), detail })?;
    tally.report_strays(&mut problems);
    let listed = verify::list_states(&mut conn, &auth, &format!("store_id={STORE_ID}"), opts.tasks).await?;

    // The answers, per order, and what the broker makes of the ids they named.
    let mut answers: Vec<Vec<&Outcome>> = vec![Vec::new(); opts.tasks];
    for (subs, run) in [(&cloud_subs, &cloud_run), (&lan_subs, &lan_run)] {
        for (req, out) in subs.plan.requests.iter().zip(&run.outcomes) {
            answers[req.key as usize].push(out);
        }
    }
    let own_ids: HashMap<&str, &ListedTask> = listed.iter().map(|t| (t.task_id.as_str(), t)).collect();
    let foreign: BTreeSet<String> = answers
        .iter()
        .flatten()
        .filter_map(|o| o.task_id.as_deref())
        .filter(|id| !own_ids.contains_key(id))
        .map(str::to_string)
        .collect();
    let resolved = resolve_ids(broker_addr, &auth, foreign.iter().cloned().collect()).await?;

    let verdict = judge(&plan.orders, &tally, &listed, &answers, &resolved);
    problems.extend(verdict.problems.iter().cloned());

    let last_date = utc_date(time::OffsetDateTime::now_utc());
    let reconciliation =
        reconcile(&mut conn, &auth, &first_date, &last_date, opts.tasks, &mut problems, &mut notes).await?;

    Ok(OfflineReport {
        backend: String::new(),
        machine: machine_line(),
        seed: opts.seed,
        tasks: opts.tasks,
        printers: opts.printers,
        mix: opts.mix,
        online_s: opts.online.as_secs_f64(),
        offline_s: opts.offline.as_secs_f64(),
        window_s: opts.window.as_secs_f64(),
        kill_agent_every_s: opts.kill_agent_every.map(|d| d.as_secs_f64()),
        cuts,
        agent_kills,
        cloud: side_stats(plan.orders.iter().filter(|o| o.channel.cloud()).count(), &cloud_subs, &cloud_run),
        lan: side_stats(plan.orders.iter().filter(|o| o.channel.lan()).count(), &lan_subs, &lan_run),
        submit_seconds,
        drained,
        drain_seconds,
        drain_timeout_s: opts.drain_timeout.as_secs_f64(),
        paper: verdict.paper,
        duplicates: verdict.duplicates,
        lost: verdict.lost,
        not_printed: verdict.not_printed,
        in_doubt_on_paper: verdict.in_doubt_on_paper,
        inconsistent: verdict.inconsistent,
        broker_differs: verdict.broker_differs,
        resolved_lan_ids: resolved.values().filter(|r| r.is_some()).count(),
        reconciliation,
        notes,
        total_seconds: started.elapsed().as_secs_f64(),
        kept_dir: None,
        problems,
    })
}

/// The orders one of whose sends got a 201 or 200.
fn answered<'a>(subs: &'a Submissions, run: &'a SubmitRun) -> impl Iterator<Item = u32> + 'a {
    subs.plan.requests.iter().zip(&run.outcomes).filter(|(_, o)| matches!(o.status, 200 | 201)).map(|(r, _)| r.key)
}

/// A task as `GET /v1/print-tasks/{id}` answers for an id that is not its own.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Resolved {
    task_id: String,
    biz_no: String,
    state: String,
}

/// Asks the broker for each id (`GET /v1/print-tasks/{id}`) over a few connections; `None`
/// for an id it does not know (404).
async fn resolve_ids(
    addr: SocketAddr,
    auth: &HeaderValue,
    ids: Vec<String>,
) -> Result<BTreeMap<String, Option<Resolved>>, BenchError> {
    let work = Arc::new(ids);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut handles = Vec::new();
    for _ in 0..RESOLVE_CONNECTIONS.min(work.len()) {
        let (work, next, auth) = (work.clone(), next.clone(), auth.clone());
        handles.push(tokio::spawn(async move {
            let mut conn = crate::faults::connect(addr, "resolving task ids").await?;
            let mut out = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(id) = work.get(i) else { return Ok::<_, BenchError>(out) };
                let path = format!("/v1/print-tasks/{}", pct_encode(id));
                let (status, body) = conn
                    .request(Method::GET, &path, &auth, None)
                    .await
                    .map_err(|detail| BenchError::Http { context: format!("GET {path}"), detail })?;
                let found = match status.as_u16() {
                    200 => {
                        let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                        Some(Resolved {
                            task_id: verify::str_field(&v, "task_id"),
                            biz_no: verify::str_field(&v, "biz_no"),
                            state: verify::str_field(&v, "state"),
                        })
                    }
                    404 => None,
                    s => {
                        return Err(BenchError::Protocol {
                            context: format!("GET {path}"),
                            detail: format!("HTTP {s}: {}", snippet(&body, 300)),
                        })
                    }
                };
                out.push((id.clone(), found));
            }
        }));
    }
    let mut all = BTreeMap::new();
    for h in handles {
        let part = h
            .await
            .map_err(|e| BenchError::Protocol { context: "resolving task ids".into(), detail: e.to_string() })??;
        all.extend(part);
    }
    Ok(all)
}

/// The per-order verdict.
#[derive(Debug, Default)]
struct Verdict {
    paper: PaperCounts,
    duplicates: Vec<OrderFinding>,
    lost: Vec<OrderFinding>,
    not_printed: Vec<OrderFinding>,
    in_doubt_on_paper: Vec<OrderFinding>,
    inconsistent: Vec<OrderFinding>,
    broker_differs: Vec<OrderFinding>,
    problems: Vec<String>,
}

/// Judges every order by the paper log, the broker's tasks and the answers it got.
fn judge(
    orders: &[Order],
    tally: &Tally,
    listed: &[ListedTask],
    answers: &[Vec<&Outcome>],
    resolved: &BTreeMap<String, Option<Resolved>>,
) -> Verdict {
    let mut by_biz: HashMap<&str, Vec<&ListedTask>> = HashMap::new();
    for t in listed {
        by_biz.entry(t.biz_no.as_str()).or_default().push(t);
    }
    let own: HashMap<&str, &ListedTask> = listed.iter().map(|t| (t.task_id.as_str(), t)).collect();
    let mut v = Verdict { paper: PaperCounts { jobs: tally.lines, ..PaperCounts::default() }, ..Verdict::default() };
    for (n, order) in orders.iter().enumerate() {
        let biz_no = format!("E{n}");
        let on_paper = tally.counts.get(n).copied().unwrap_or(0);
        let tasks = by_biz.get(biz_no.as_str()).cloned().unwrap_or_default();
        let mut answered_ids: Vec<String> = Vec::new();
        for id in answers[n].iter().filter_map(|o| o.task_id.as_deref()) {
            if !answered_ids.iter().any(|a| a == id) {
                answered_ids.push(id.to_string());
            }
        }
        let finding = |detail: String| OrderFinding {
            biz_no: biz_no.clone(),
            channel: order.channel,
            on_paper,
            broker_tasks: tasks.iter().map(|t| t.task_id.clone()).collect(),
            broker_state: tasks.first().map(|t| t.state.clone()),
            answered_ids: answered_ids.clone(),
            detail,
        };

        // Paper first.
        match on_paper {
            0 => match tasks.first().map(|t| t.state.as_str()) {
                Some(s @ ("in_doubt" | "failed")) if tasks.len() == 1 => {
                    v.paper.not_printed_accounted += 1;
                    v.not_printed.push(finding(format!("never on paper; the broker holds it {s}")));
                }
                other => {
                    v.paper.lost += 1;
                    v.lost.push(finding(match other {
                        None => "never on paper, and the broker has no task for it".to_string(),
                        Some(s) => format!("never on paper, and the broker says {s}"),
                    }));
                }
            },
            1 => v.paper.printed_once += 1,
            k => {
                v.paper.printed_twice_or_more += 1;
                v.paper.extra_sheets += k as usize - 1;
                v.duplicates.push(finding(format!("on paper {k} times")));
            }
        }

        // Then the broker's record against the paper.
        let broker_note = match tasks.as_slice() {
            [] if on_paper > 0 => Some("on paper, but the broker has no task for it".to_string()),
            [] => None,
            // Honest doubt: the agent could not prove the sheet (killed between sending
            // the job and the printer's confirmation), so a person checks it. It is on
            // paper at most once, which is what the promise asks; listed, not a problem.
            [t] if on_paper == 1 && t.state == "in_doubt" => {
                v.paper.in_doubt_on_paper += 1;
                v.in_doubt_on_paper.push(finding("on paper once; the broker holds it in_doubt".into()));
                None
            }
            [t] if on_paper > 0 && t.state != "printed" => Some(format!("on paper, but the broker says {}", t.state)),
            [t] if on_paper == 0 && t.state == "printed" => {
                Some("the broker says printed, but it never came out of a printer".to_string())
            }
            [_] => None,
            many => Some(format!("the broker holds {} tasks for it", many.len())),
        };
        if let Some(note) = broker_note {
            v.broker_differs.push(finding(note));
        }

        // Then the answers: all of one task, directly or through an id the broker resolves.
        let mut why: Vec<String> = Vec::new();
        let unanswered = answers[n].iter().filter(|o| o.status == 0).count();
        if unanswered > 0 {
            why.push(format!("{unanswered} sends got no final answer"));
        }
        for o in answers[n].iter().filter(|o| !matches!(o.status, 0 | 200 | 201)) {
            why.push(format!("answered {}: {}", o.status, o.detail.as_deref().unwrap_or("")));
        }
        let mut canonical: BTreeSet<String> = BTreeSet::new();
        for id in &answered_ids {
            match own.get(id.as_str()) {
                Some(t) if t.biz_no == biz_no => {
                    canonical.insert(t.task_id.clone());
                }
                Some(t) => why.push(format!("answered task {id} is the broker's task of {}", t.biz_no)),
                None => match resolved.get(id) {
                    Some(Some(r)) if r.biz_no == biz_no => {
                        canonical.insert(r.task_id.clone());
                    }
                    Some(Some(r)) => why.push(format!("answered id {id} resolves to {} of {}", r.task_id, r.biz_no)),
                    _ => why.push(format!("answered id {id} is unknown to the broker (GET /v1/print-tasks/{id}: 404)")),
                },
            }
        }
        if canonical.len() > 1 {
            why.push(format!("the answers name {} different tasks: {}", canonical.len(), join(&canonical)));
        }
        if answers[n].iter().all(|o| o.status != 200 && o.status != 201) {
            why.push("no send of the order was accepted".into());
        }
        if !why.is_empty() {
            v.inconsistent.push(finding(why.join("; ")));
        }
    }
    let name = |f: &OrderFinding| format!("{} ({})", f.biz_no, f.detail);
    let mut report = |list: &[OrderFinding], what: &str| {
        if !list.is_empty() {
            let examples: Vec<String> = list.iter().take(5).map(name).collect();
            v.problems.push(format!("{} orders {what}, e.g. {}", list.len(), examples.join("; ")));
        }
    };
    report(&v.duplicates, "were printed more than once");
    report(&v.lost, "were lost (never on paper, not in doubt or failed at the broker)");
    report(&v.inconsistent, "got inconsistent answers");
    report(&v.broker_differs, "are recorded by the broker otherwise than the paper says");
    v
}

fn join(set: &BTreeSet<String>) -> String {
    set.iter().cloned().collect::<Vec<_>>().join(", ")
}

/// `YYYY-MM-DD` of a UTC time (the bench store's business day is in UTC).
fn utc_date(t: time::OffsetDateTime) -> String {
    let d = t.date();
    format!("{:04}-{:02}-{:02}", d.year(), u8::from(d.month()), d.day())
}

/// The days from `first` to `last` (both `YYYY-MM-DD`, a run spans one or two).
fn dates_between(first: &str, last: &str) -> Vec<String> {
    if first == last {
        vec![first.to_string()]
    } else {
        vec![first.to_string(), last.to_string()]
    }
}

/// How long the device log may take to reach the broker after the drain: the agent
/// uploads its digest every second; a few rounds more cover a slow round.
const DEVICE_LOG_WAIT: Duration = Duration::from_secs(15);

/// Reads the reconciliation of the run's day(s) and checks it; the device log's lists are
/// read again until they are empty (the digest runs every second) or
/// [`DEVICE_LOG_WAIT`] passed.
async fn reconcile(
    conn: &mut Conn,
    auth: &HeaderValue,
    first: &str,
    last: &str,
    orders: usize,
    problems: &mut Vec<String>,
    notes: &mut Vec<String>,
) -> Result<ReconciliationCheck, BenchError> {
    let since = Instant::now();
    loop {
        let mut check = ReconciliationCheck { dates: dates_between(first, last), ..ReconciliationCheck::default() };
        for date in check.dates.clone() {
            let path = format!("/v1/stores/{STORE_ID}/reconciliation?date={date}");
            let (status, body) = conn
                .request(Method::GET, &path, auth, None)
                .await
                .map_err(|detail| BenchError::Http { context: format!("GET {path}"), detail })?;
            if status.as_u16() != 200 {
                return Err(BenchError::Protocol {
                    context: format!("GET {path}"),
                    detail: format!("HTTP {status}: {}", snippet(&body, 300)),
                });
            }
            let r: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            add_day(&mut check, &r);
        }
        check.waited_s = since.elapsed().as_secs_f64();
        let device_empty = |l: &Option<Vec<Value>>| l.as_ref().is_none_or(Vec::is_empty);
        let settled = check.device_log.is_none()
            || (check.device_log.as_deref() == Some("present")
                && device_empty(&check.device_printed_broker_not)
                && device_empty(&check.broker_printed_device_not));
        if settled || since.elapsed() >= DEVICE_LOG_WAIT {
            check_day(&check, orders, problems, notes);
            return Ok(check);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Adds one day's report to the run's sums.
fn add_day(check: &mut ReconciliationCheck, r: &Value) {
    let n = |v: &Value, a: &str, b: &str| v.get(a).and_then(|x| x.get(b)).and_then(Value::as_u64).unwrap_or(0);
    check.submitted += n(r, "counts", "submitted");
    check.printed += n(r, "counts", "printed");
    check.in_doubt += n(r, "counts", "in_doubt");
    check.failed += n(r, "counts", "failed");
    check.open += n(r, "counts", "open");
    check.ledger_charges += n(r, "ledger", "charges");
    if let Some(list) = r.get("printed_more_than_once").and_then(Value::as_array) {
        check.printed_more_than_once.extend(list.iter().map(|x| x.as_str().map_or(x.to_string(), str::to_string)));
    }
    if let Some(d) = r.get("device_log").and_then(Value::as_str) {
        // Present on any day counts as present.
        if check.device_log.as_deref() != Some("present") {
            check.device_log = Some(d.to_string());
        }
    }
    for (field, slot) in [
        ("device_printed_broker_not", &mut check.device_printed_broker_not),
        ("broker_printed_device_not", &mut check.broker_printed_device_not),
    ] {
        if let Some(list) = r.get(field).and_then(Value::as_array) {
            slot.get_or_insert_with(Vec::new).extend(list.iter().cloned());
        }
    }
}

fn check_day(check: &ReconciliationCheck, orders: usize, problems: &mut Vec<String>, notes: &mut Vec<String>) {
    if !check.printed_more_than_once.is_empty() {
        problems.push(format!(
            "the reconciliation lists {} keys printed more than once: {}",
            check.printed_more_than_once.len(),
            check.printed_more_than_once.iter().take(10).cloned().collect::<Vec<_>>().join("; ")
        ));
    }
    if check.ledger_charges != orders as u64 {
        problems.push(format!("the ledger has {} charges for {orders} orders (one each)", check.ledger_charges));
    }
    match check.device_log.as_deref() {
        None if check.device_printed_broker_not.is_none() && check.broker_printed_device_not.is_none() => notes.push(
            "the broker's reconciliation has no device-log fields (device_log, device_printed_broker_not, \
             broker_printed_device_not): the device log was not compared"
                .into(),
        ),
        Some("present") => {}
        other => problems.push(format!(
            "the reconciliation's device log is {other:?} although the agent uploads its digest every second"
        )),
    }
    let examples = |l: &[Value]| l.iter().take(5).map(Value::to_string).collect::<Vec<_>>().join("; ");
    for (what, list) in [
        ("device_printed_broker_not", &check.device_printed_broker_not),
        ("broker_printed_device_not", &check.broker_printed_device_not),
    ] {
        if let Some(l) = list.as_ref().filter(|l| !l.is_empty()) {
            problems.push(format!(
                "the reconciliation's {what} lists {} tasks {:.0} s after the drain, e.g. {}",
                l.len(),
                check.waited_s,
                examples(l)
            ));
        }
    }
}

impl OfflineReport {
    /// The human report.
    pub fn render_text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "onceprint bench offline — {} on {}", self.backend, self.machine);
        let _ = writeln!(
            s,
            "  {} orders over {} printers, mix cloud/LAN/both {}, seed {}; line online {:.1} s / offline {:.1} s, \
             submissions over {:.0} s",
            self.tasks, self.printers, self.mix, self.seed, self.online_s, self.offline_s, self.window_s
        );
        let cuts: Vec<String> = self.cuts.iter().map(|c| format!("{:.1}–{:.1}", c.from_s, c.to_s)).collect();
        let _ = writeln!(s, "  line down (s): {}", if cuts.is_empty() { "never".into() } else { cuts.join(", ") });
        if let Some(every) = self.kill_agent_every_s {
            let at: Vec<String> = self.agent_kills.iter().map(|k| format!("{:.1}", k.at_s)).collect();
            let _ = writeln!(
                s,
                "  agent SIGKILLed every {every:.1} s: {} kills at {}",
                self.agent_kills.len(),
                at.join(", ")
            );
        }
        for (name, side) in [("cloud", &self.cloud), ("LAN", &self.lan)] {
            let _ = writeln!(
                s,
                "  {name:<5}: {} orders, {} sends ({} attempts), 201 {}, 200 {}, other {}, accepted offline {}, \
                 retried after no answer {} / 5xx {}",
                side.orders,
                side.sends,
                side.attempts,
                side.created,
                side.duplicate,
                side.other,
                side.accepted_offline,
                side.retried_no_answer,
                side.retried_5xx
            );
        }
        let _ = writeln!(
            s,
            "  submissions answered in {:.1} s; drain {} in {:.1} s (timeout {:.0} s)",
            self.submit_seconds,
            if self.drained { "complete" } else { "INCOMPLETE" },
            self.drain_seconds,
            self.drain_timeout_s
        );
        let p = &self.paper;
        let _ = writeln!(
            s,
            "  paper: {} jobs; {} orders once, {} more than once ({} extra sheets), {} not printed and accounted \
             for (in_doubt/failed), {} lost; {} on paper once and in doubt at the broker",
            p.jobs,
            p.printed_once,
            p.printed_twice_or_more,
            p.extra_sheets,
            p.not_printed_accounted,
            p.lost,
            p.in_doubt_on_paper
        );
        let _ = writeln!(s, "  LAN task ids resolved through the broker: {}", self.resolved_lan_ids);
        for (what, list) in [
            ("duplicates", &self.duplicates),
            ("lost", &self.lost),
            ("not printed, accounted for", &self.not_printed),
            ("on paper once, in doubt at the broker (honest doubt)", &self.in_doubt_on_paper),
            ("inconsistent answers", &self.inconsistent),
            ("broker differs from paper", &self.broker_differs),
        ] {
            if list.is_empty() {
                continue;
            }
            let _ = writeln!(s, "  {what} ({}):", list.len());
            for f in list.iter().take(TEXT_EXAMPLES) {
                let _ = writeln!(
                    s,
                    "    {} [{:?}] paper {} broker {:?} {:?} answers {:?}: {}",
                    f.biz_no, f.channel, f.on_paper, f.broker_tasks, f.broker_state, f.answered_ids, f.detail
                );
            }
        }
        let r = &self.reconciliation;
        let len = |l: &Option<Vec<Value>>| l.as_ref().map_or("absent".to_string(), |l| l.len().to_string());
        let _ = writeln!(
            s,
            "  reconciliation {}: submitted {}, printed {}, in_doubt {}, failed {}, open {}, ledger charges {}, \
             printed_more_than_once {}, device log {}, device_printed_broker_not {}, broker_printed_device_not {}",
            r.dates.join(" + "),
            r.submitted,
            r.printed,
            r.in_doubt,
            r.failed,
            r.open,
            r.ledger_charges,
            r.printed_more_than_once.len(),
            r.device_log.as_deref().unwrap_or("absent"),
            len(&r.device_printed_broker_not),
            len(&r.broker_printed_device_not)
        );
        for n in &self.notes {
            let _ = writeln!(s, "  note: {n}");
        }
        if let Some(d) = &self.kept_dir {
            let _ = writeln!(s, "  run directory kept: {d}");
        }
        let _ = writeln!(s, "  total {:.1} s", self.total_seconds);
        if self.problems.is_empty() {
            let _ = writeln!(s, "OK: no order printed twice, none lost, every answer consistent");
        } else {
            let _ = writeln!(s, "PROBLEMS ({}):", self.problems.len());
            for p in &self.problems {
                let _ = writeln!(s, "  - {p}");
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_documented_ones() {
        let o = OfflineOptions::new("onceprint");
        assert_eq!((o.tasks, o.printers, o.resends), (5_000, 4, (1, 3)));
        assert_eq!((o.online, o.offline), (Duration::from_secs(8), Duration::from_secs(8)));
        assert_eq!(o.mix, Mix { cloud: 40, lan: 40, both: 20 });
        assert!(validate(&o).is_ok());
    }

    #[test]
    fn bad_options_are_refused() {
        let check = |f: &dyn Fn(&mut OfflineOptions)| {
            let mut o = OfflineOptions::new("onceprint");
            f(&mut o);
            validate(&o).is_err()
        };
        assert!(check(&|o| o.tasks = 0));
        assert!(check(&|o| o.printers = 0));
        assert!(check(&|o| o.offline = Duration::from_millis(10)));
        assert!(check(&|o| o.window = o.online));
        assert!(check(&|o| o.resends = (3, 1)));
        assert!(check(&|o| o.kill_agent_every = Some(Duration::from_millis(10))));
        assert!(check(&|o| o.mix = Mix { cloud: 0, lan: 0, both: 0 }));
        assert!(check(&|o| o.database = Some("sqlite://x".into())));
        assert!(!check(&|o| o.kill_agent_every = Some(Duration::from_secs(5))));
    }

    #[test]
    fn mixes_parse() {
        assert_eq!("40/40/20".parse::<Mix>(), Ok(Mix { cloud: 40, lan: 40, both: 20 }));
        assert_eq!(" 1 / 0 / 0 ".parse::<Mix>(), Ok(Mix { cloud: 1, lan: 0, both: 0 }));
        assert!("40/40".parse::<Mix>().is_err());
        assert!("0/0/0".parse::<Mix>().is_err());
        assert!("a/b/c".parse::<Mix>().is_err());
    }

    #[test]
    fn the_plan_is_seeded_and_follows_the_mix() {
        let opts = OfflineOptions { tasks: 2_000, ..OfflineOptions::new("x") };
        let (a, b) = (plan(&opts), plan(&opts));
        let keys = |s: &Submissions| s.plan.requests.iter().map(|r| r.key).collect::<Vec<_>>();
        assert_eq!(keys(&a.cloud), keys(&b.cloud));
        assert_eq!(keys(&a.lan), keys(&b.lan));
        let count = |c: Channel| a.orders.iter().filter(|o| o.channel == c).count();
        let (cloud, lan, both) = (count(Channel::Cloud), count(Channel::Lan), count(Channel::Both));
        assert_eq!(cloud + lan + both, 2_000);
        assert!(
            (700..900).contains(&cloud) && (700..900).contains(&lan) && (300..500).contains(&both),
            "{cloud} {lan} {both}"
        );
        assert_eq!(a.cloud.plan.distinct_keys, cloud + both);
        assert_eq!(a.lan.plan.distinct_keys, lan + both);
        for side in [&a.cloud, &a.lan] {
            assert!(side.send_at_ms.windows(2).all(|w| w[0] <= w[1]), "sending order is time order");
            let mut per_key: HashMap<u32, Vec<&PlannedRequest>> = HashMap::new();
            for r in &side.plan.requests {
                per_key.entry(r.key).or_default().push(r);
            }
            for sends in per_key.values() {
                // The first send and 1–3 re-sends, all with the same body.
                assert!((2..=4).contains(&sends.len()), "{}", sends.len());
                assert!(sends.iter().all(|r| r.body == sends[0].body));
                assert_eq!(sends.iter().filter(|r| !r.repeat).count(), 1);
            }
        }
    }

    #[test]
    fn agent_kills_fall_into_the_window() {
        let kills = agent_kill_plan(Some(Duration::from_secs(5)), Duration::from_secs(16));
        assert_eq!(kills.iter().map(|k| k.at_ms).collect::<Vec<_>>(), vec![5_000, 10_000, 15_000]);
        assert!(agent_kill_plan(None, Duration::from_secs(16)).is_empty());
    }

    fn out(status: u16, id: &str) -> Outcome {
        Outcome { status, task_id: Some(id.into()), duplicate: Some(status == 200), ..Outcome::default() }
    }

    fn task(biz: &str, id: &str, state: &str) -> ListedTask {
        ListedTask { biz_no: biz.into(), task_id: id.into(), state: state.into(), ..ListedTask::default() }
    }

    #[test]
    fn the_verdict_finds_duplicates_losses_and_split_answers() {
        let orders = vec![Order { channel: Channel::Both }; 5];
        // E0 once; E1 twice; E2 never but in doubt; E3 never and pending; E4 once.
        let tally = Tally::with_prints(&[(0, 1), (1, 2), (4, 1)], 5);
        let listed = vec![
            task("E0", "t0", "printed"),
            task("E1", "t1", "printed"),
            task("E2", "t2", "in_doubt"),
            task("E3", "t3", "pending"),
            task("E4", "t4", "printed"),
        ];
        let answers_owned: Vec<Vec<Outcome>> = vec![
            vec![out(201, "t0"), out(201, "lan0")],
            vec![out(201, "t1"), out(200, "t1")],
            vec![out(201, "t2")],
            vec![out(201, "t3")],
            vec![out(201, "t4"), out(201, "lan4")],
        ];
        let answers: Vec<Vec<&Outcome>> = answers_owned.iter().map(|a| a.iter().collect()).collect();
        let resolved: BTreeMap<String, Option<Resolved>> = [
            ("lan0".to_string(), Some(Resolved { task_id: "t0".into(), biz_no: "E0".into(), state: "printed".into() })),
            ("lan4".to_string(), None),
        ]
        .into();
        let v = judge(&orders, &tally, &listed, &answers, &resolved);
        assert_eq!((v.paper.printed_once, v.paper.printed_twice_or_more, v.paper.extra_sheets), (2, 1, 1));
        assert_eq!((v.paper.not_printed_accounted, v.paper.lost), (1, 1));
        assert_eq!(v.duplicates.iter().map(|f| f.biz_no.as_str()).collect::<Vec<_>>(), ["E1"]);
        assert_eq!(v.lost.iter().map(|f| f.biz_no.as_str()).collect::<Vec<_>>(), ["E3"]);
        assert_eq!(v.not_printed.iter().map(|f| f.biz_no.as_str()).collect::<Vec<_>>(), ["E2"]);
        assert_eq!(v.inconsistent.iter().map(|f| f.biz_no.as_str()).collect::<Vec<_>>(), ["E4"]);
        assert!(v.inconsistent[0].detail.contains("unknown to the broker"), "{:?}", v.inconsistent);
        assert_eq!(v.broker_differs.iter().map(|f| f.biz_no.as_str()).collect::<Vec<_>>(), Vec::<&str>::new());
        assert_eq!(v.problems.len(), 3, "{:?}", v.problems);
    }

    #[test]
    fn the_verdict_compares_the_broker_with_the_paper() {
        let orders = vec![Order { channel: Channel::Cloud }; 4];
        let tally = Tally::with_prints(&[(0, 1), (2, 1), (3, 1)], 4);
        let listed = vec![
            task("E0", "t0", "failed"),
            task("E3", "t3", "in_doubt"),
            task("E1", "t1", "printed"),
            task("E2", "t2", "printed"),
            task("E2", "t2b", "printed"),
        ];
        let answers_owned =
            [vec![out(201, "t0")], vec![out(201, "t1")], vec![out(201, "t2"), out(200, "t2b")], vec![out(201, "t3")]];
        let answers: Vec<Vec<&Outcome>> = answers_owned.iter().map(|a| a.iter().collect()).collect();
        let v = judge(&orders, &tally, &listed, &answers, &BTreeMap::new());
        let differs: Vec<&str> = v.broker_differs.iter().map(|f| f.biz_no.as_str()).collect();
        assert_eq!(differs, ["E0", "E1", "E2"]);
        assert!(v.inconsistent.iter().any(|f| f.biz_no == "E2" && f.detail.contains("2 different tasks")));
        assert_eq!(v.lost.iter().map(|f| f.biz_no.as_str()).collect::<Vec<_>>(), ["E1"]);
        // On paper once and in doubt: honest doubt, listed but no problem of its own.
        assert_eq!(v.in_doubt_on_paper.iter().map(|f| f.biz_no.as_str()).collect::<Vec<_>>(), ["E3"]);
        assert_eq!(v.paper.in_doubt_on_paper, 1);
    }

    #[test]
    fn reconciliation_days_add_up_and_absent_device_fields_are_a_note() {
        let mut c = ReconciliationCheck::default();
        add_day(
            &mut c,
            &json!({"counts": {"submitted": 3, "printed": 2, "in_doubt": 1}, "ledger": {"charges": 3},
                                "printed_more_than_once": []}),
        );
        let (mut problems, mut notes) = (Vec::new(), Vec::new());
        check_day(&c, 3, &mut problems, &mut notes);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(notes.len(), 1);
        add_day(
            &mut c,
            &json!({"counts": {"submitted": 1}, "ledger": {"charges": 1}, "device_log": "present",
                                "printed_more_than_once": ["E1 (receipt) × 2"],
                                "device_printed_broker_not": [{"task_id": "x"}], "broker_printed_device_not": []}),
        );
        let (mut problems, mut notes) = (Vec::new(), Vec::new());
        check_day(&c, 3, &mut problems, &mut notes);
        let all = problems.join("\n");
        assert!(
            all.contains("printed more than once")
                && all.contains("4 charges")
                && all.contains("device_printed_broker_not"),
            "{all}"
        );
        assert!(notes.is_empty());
    }

    #[test]
    fn dates_are_utc_days() {
        let t = time::OffsetDateTime::from_unix_timestamp(1_795_947_072).unwrap();
        assert_eq!(utc_date(t), "2026-11-29");
        assert_eq!(dates_between("2026-11-29", "2026-11-29"), ["2026-11-29"]);
        assert_eq!(dates_between("2026-11-29", "2026-11-30").len(), 2);
    }
}
