//! The run behind `onceprint bench offline`: a shop whose internet
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
//! has its task at the broker (or, with rejected merges, an `offline_task.rejected` alert). The verdict comes from the paper log first: no order on
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
//! With [`Edges`] it adds the edges of offline operation ([`edges`]): answers the line
//! holds past the agent's patience, a station over a CloudPRNT printer and an agent
//! printer, a station moved while the shop is cut off, content the broker stops taking
//! while the shop is cut off (the broker restarted with a lower `max_content_bytes`),
//! uploads the line fails, a second agent of the store with a LAN listener, and the agent's
//! clock off by hours or a day. Their orders are judged by the same verdict, with two
//! more ways for an order to be accounted for: a LAN order whose sync the broker rejected
//! (an `offline_task.rejected` alert received, the agent keeping it) and a large order
//! every send of which came after the lower limit (`400`, never taken). Either is still a
//! problem if it is on paper twice.
//!
//! Like the other runs it talks to nothing but the processes it started, on 127.0.0.1,
//! and the PostgreSQL database it was given (inside a schema of its own, dropped after),
//! and leaves nothing running.

pub mod edges;

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
use crate::faults::chaos::{self, AgentCtx, KillRecord};
use crate::faults::events::EventSink;
use crate::faults::fleet;
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
pub use edges::{Destination, Edges};

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
/// How long after the drain the last rejection alerts may still arrive (webhooks go out
/// after their change commits, with retries).
const ALERTS_WAIT: Duration = Duration::from_secs(15);

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
    /// The edges of offline operation the run adds ([`edges`]).
    pub edges: Edges,
    /// How long the line holds the broker's answers in a slow period (slow forwards).
    pub hold: Duration,
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
            edges: Edges::default(),
            hold: edges::DEFAULT_HOLD,
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
    let e = opts.edges;
    if e.slow_forwards
        && !(Duration::from_millis(edges::OFFLINE_AFTER_MS + 100)..=Duration::from_secs(10)).contains(&opts.hold)
    {
        return bad(format!(
            "the hold of a slow period must be 0.1–10 s longer than the agent's --offline-after-ms ({} ms)",
            edges::OFFLINE_AFTER_MS
        ));
    }
    if e.station_change && opts.printers < 2 {
        return bad("the station change moves a station between two agent printers: --printers 2 at least".into());
    }
    if e.clock_skew && opts.kill_agent_every.is_none() {
        return bad("the clock skew changes the agent's clock between its lives: it needs --kill-agent-every".into());
    }
    if e.second_agent && opts.mix.lan + opts.mix.both == 0 {
        return bad("the second agent gets LAN re-sends: the mix must send some orders to the LAN".into());
    }
    crate::validate_database(opts.database.as_deref())
}

/// One order of the plan.
#[derive(Debug, Clone, Copy)]
struct Order {
    channel: Channel,
    to: Destination,
    /// Its content is over the limit the broker is restarted with (rejected merges).
    large: bool,
}

impl Order {
    #[cfg(test)]
    fn new(channel: Channel) -> Order {
        Order { channel, to: Destination::Printer(0), large: false }
    }
}

/// The seeded plan: per order its side, and the sends of each side in sending order;
/// `second` are the LAN re-sends that go to the second agent.
struct OfflinePlan {
    orders: Vec<Order>,
    cloud: Submissions,
    lan: Submissions,
    second: Submissions,
}

/// Draws the orders and their sends. The order `n` has `biz_no` `E<n>` and prints the
/// marker `E2E <n>` (the bodies of `bench e2e`), so the paper log tells orders apart.
///
/// The edges draw from a stream of their own, so that switching them changes nothing else
/// of the plan: per order whether it goes to a station (a station order that the mix sends
/// both ways goes one way instead, half to each: see [`edges`]) and whether its content is
/// large; per LAN re-send whether it goes to the second agent instead.
fn plan(opts: &OfflineOptions) -> OfflinePlan {
    let mut rng = SplitMix64::new(opts.seed ^ 0x004f_4646_4c49_4e45);
    let mut edge_rng = SplitMix64::new(opts.seed ^ 0x0045_4447_4553);
    let e = opts.edges;
    let window_ms = opts.window.as_millis() as u64;
    let mut orders = Vec::with_capacity(opts.tasks);
    let mut printer_of = Vec::with_capacity(opts.tasks);
    let mut print_type_of = Vec::with_capacity(opts.tasks);
    // (send time, order of drawing, request, racing) per side: cloud, LAN, second agent.
    let mut sends: [Vec<(u64, usize, PlannedRequest, bool)>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    let total_weight: u32 = PRINT_TYPES.iter().map(|(_, _, w)| w).sum();
    for n in 0..opts.tasks {
        let at = n as u64 * window_ms / opts.tasks as u64;
        let drawn = opts.mix.pick(&mut rng);
        let mut channel = drawn;
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
        let (station, one_way, large) = (edge_rng.next_f64(), edge_rng.next_f64(), edge_rng.next_f64());
        let to = if e.mixed_station && station < edges::KITCHEN_SHARE {
            Destination::Kitchen
        } else if e.station_change && station >= 1.0 - edges::BAR_SHARE {
            Destination::Bar
        } else {
            Destination::Printer(printer)
        };
        if to != Destination::Printer(printer) && channel == Channel::Both {
            channel = if one_way < 0.5 { Channel::Cloud } else { Channel::Lan };
        }
        let large = e.rejected_merges && channel.lan() && large < edges::LARGE_SHARE;
        orders.push(Order { channel, to, large });
        printer_of.push(printer);
        print_type_of.push(print_type);
        let body = edges::order_body(n as u32, to, print_type, large);
        // The re-sends are drawn for the sides the mix chose, also one a station order
        // does not use, so that the rest of the plan stays as it is without the edges.
        for (side, was, used) in [(0, drawn.cloud(), channel.cloud()), (1, drawn.lan(), channel.lan())] {
            if !was {
                continue;
            }
            let key = n as u32;
            let first = sends[side].len();
            if used {
                sends[side].push((at, first, PlannedRequest { key, repeat: false, body: body.clone() }, false));
            }
            let (lo, hi) = opts.resends;
            for _ in 0..lo + rng.below(hi - lo + 1) {
                let racing = rng.next_f64() < RACING_SHARE;
                let when = if racing { at } else { at + 1 + rng.below(RESEND_SPREAD_MS) as u64 };
                if !used {
                    continue;
                }
                let to_second = side == 1 && e.second_agent && edge_rng.next_f64() < edges::SECOND_AGENT_SHARE;
                let list = &mut sends[if to_second { 2 } else { side }];
                let order = list.len();
                list.push((when, order, PlannedRequest { key, repeat: true, body: body.clone() }, racing));
            }
        }
    }
    let [cloud, lan, second] = sends.map(|mut list| {
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
    OfflinePlan { orders, cloud, lan, second }
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
    /// Final answers other than 201 and 200, and sends that got no final answer before
    /// the deadline (status 0); of them, `400`s for content over the lowered limit (the
    /// only ones expected, with rejected merges).
    pub other: usize,
    pub over_limit: usize,
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
        over_limit: run.outcomes.iter().filter(|o| edges::over_limit(o)).count(),
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
    /// Orders whose LAN task the broker rejected at the sync (alerted) and holds no task
    /// for: kept by the agent, on paper once (printed offline) or never.
    pub rejected_kept: usize,
    /// Large orders every send of which was refused (`400`, content over the lowered
    /// limit): never taken, never on paper.
    pub refused_over_limit: usize,
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
    /// The ledger charges expected: one per order the broker holds a task for (every order
    /// but those rejected and kept by the agent, or refused over the lowered limit).
    pub expected_charges: u64,
    /// Entries of `device_printed_broker_not` that are LAN tasks the broker rejected and
    /// the agent keeps (printed offline), or orders on paper once that the broker holds in
    /// doubt for a person: explained, left out of the lists above.
    pub device_explained: usize,
}

/// What the edges did; each part `None` when its edge was off.
#[derive(Debug, Clone, Default, Serialize)]
pub struct EdgeReport {
    pub on: Vec<&'static str>,
    pub slow_forwards: Option<SlowReport>,
    pub mixed_station: Option<StationReport>,
    pub station_change: Option<StationChangeReport>,
    pub rejected_merges: Option<RejectedReport>,
    pub failing_uploads: Option<UploadReport>,
    pub second_agent: Option<edges::SecondAgentStats>,
    /// The wall clock offset of each life of the agent, in ms.
    pub clock_offsets_ms: Option<Vec<i64>>,
}

/// Slow forwards: the line held the broker's answers in these spans.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SlowReport {
    pub hold_ms: u64,
    pub periods: Vec<Cut>,
    /// LAN answers accepted offline whose send began while the line was slow (up).
    pub lan_offline_while_slow: usize,
    /// Orders the broker took from a forward whose answer came too late and the agent
    /// accepted offline too (the broker's task has the agent's LAN task merged into it):
    /// one order, two tasks, one printer and one delivery key.
    pub doubles: usize,
    pub examples: Vec<String>,
}

/// The mixed station.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StationReport {
    pub station: &'static str,
    pub printers: Vec<String>,
    pub orders_cloud: usize,
    pub orders_lan: usize,
    /// The broker's tasks of the station's orders, per printer.
    pub tasks_per_printer: BTreeMap<String, usize>,
}

/// The station moved during the cuts.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StationChangeReport {
    pub station: &'static str,
    pub orders_cloud: usize,
    pub orders_lan: usize,
    pub moves: Vec<edges::StationMove>,
    pub tasks_per_printer: BTreeMap<String, usize>,
}

/// Rejected merges.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RejectedReport {
    /// Orders with content over the lowered limit.
    pub large_orders: usize,
    pub restart: Option<edges::Restart>,
    /// Distinct LAN tasks the broker alerted as rejected.
    pub alerts: usize,
    pub alert_examples: Vec<edges::RejectedAlert>,
    /// Orders kept by the agent with no task at the broker.
    pub rejected_kept: usize,
    /// Orders never taken (every send `400` over the limit).
    pub refused: usize,
    /// `400` answers over the limit, both sides.
    pub answers_over_limit: usize,
    /// The agent's `offline_tasks_rejected` at the end.
    pub agent_rejected: Option<u64>,
}

/// Failing uploads.
#[derive(Debug, Clone, Default, Serialize)]
pub struct UploadReport {
    pub periods: Vec<Cut>,
    /// Uploads the line answered `502`, and uploads it carried.
    pub failed: u64,
    pub passed: u64,
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
    /// Orders the agent keeps because the broker rejected their sync (alerted), and large
    /// orders never taken: accounted for.
    pub rejected_kept: Vec<OrderFinding>,
    pub refused: Vec<OrderFinding>,
    pub edges: EdgeReport,
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
    /// The second agent of the store, with its own LAN listener (second agent).
    second: Option<Proc>,
    sim: Option<Sim>,
    /// The CloudPRNT printer of the mixed station.
    callers: Vec<Proc>,
}

/// How the broker is started, first and after its restart with the lowered limit.
struct Launches {
    first: Launch,
    restart: Launch,
}

async fn run_on(opts: &OfflineOptions, database_url: &str, dir: &Path) -> Result<OfflineReport, BenchError> {
    let started = Instant::now();
    let sim = start_sim(&opts.exe, opts.printers, dir).await?;
    let toml = broker_config_with(PRINT_TYPES.iter().map(|(name, priority, _)| (*name, *priority)));
    let (config, lowered) = (dir.join("broker.toml"), dir.join("broker-lowered.toml"));
    for (path, text) in [(&config, toml.clone()), (&lowered, edges::lowered_config(&toml))] {
        std::fs::write(path, text).map_err(|e| BenchError::io(format!("writing {}", path.display()), e))?;
    }
    let admin_token = random_hex(24)?;
    // A fixed port: the restarted broker comes back where the proxy and the submitters
    // still look for it.
    let first = Launch {
        exe: opts.exe.clone(),
        database_url: database_url.to_string(),
        admin_token: admin_token.clone(),
        log_path: dir.join("broker.log"),
        listen: SocketAddr::from(([127, 0, 0, 1], free_port_run(1)?)),
        config: Some(config),
        extra_args: Vec::new(),
        default_rate_limits: false,
    };
    let launches = Launches { restart: Launch { config: Some(lowered), ..first.clone() }, first };
    let broker = Broker::launch(&launches.first).await?;
    let broker_addr = broker.addr;
    let mut running = Running { broker: Some(broker), agent: None, second: None, sim: Some(sim), callers: Vec::new() };
    let uplink = Uplink::default();
    let proxy =
        LoadBalancer::start_with_uplink(SocketAddr::from(([127, 0, 0, 1], 0)), &[broker_addr], uplink.clone()).await;
    let result = match proxy {
        Ok(proxy) => {
            let at = Addrs { broker: broker_addr, proxy: proxy.addr };
            let r = drive(opts, &mut running, &launches, at, &uplink, dir, &admin_token, started).await;
            drop(proxy);
            r
        }
        Err(e) => Err(e),
    };
    let tails = result.is_err().then(|| {
        let tail = |p: Option<&Proc>| p.map_or("(not running)".to_string(), Proc::log_tail);
        format!(
            "\n--- broker log (last lines) ---\n{}\n--- agent log ---\n{}\n--- printer-sim log ---\n{}",
            crate::procs::log_tail(&launches.first.log_path, 40),
            tail(running.agent.as_ref()),
            tail(running.sim.as_ref().map(|s| &s.proc))
        )
    });
    // The agents first (they hand back what they hold and flush their acks), then the
    // printers, then the broker.
    let mut stop_problems = Vec::new();
    if let Some(agent) = running.agent.take() {
        note_stop("agent", agent.stop().await, &mut stop_problems);
    }
    if let Some(agent) = running.second.take() {
        note_stop("second agent", agent.stop().await, &mut stop_problems);
    }
    if let Some(sim) = running.sim.take() {
        note_stop("printer-sim", sim.proc.stop().await, &mut stop_problems);
    }
    for caller in running.callers.drain(..) {
        note_stop("printer-sim (CloudPRNT)", caller.stop().await, &mut stop_problems);
    }
    if let Some(broker) = running.broker.take() {
        note_stop("broker", broker.stop().await, &mut stop_problems);
    }
    let mut report = result.map_err(|e| e.with_logs(tails))?;
    report.problems.extend(stop_problems);
    report.total_seconds = started.elapsed().as_secs_f64();
    Ok(report)
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
        if let Some(h) = edges::health(listen).await {
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

/// The broker's own address (the cloud side, the bench's reads) and the shop line's.
#[derive(Debug, Clone, Copy)]
struct Addrs {
    broker: SocketAddr,
    proxy: SocketAddr,
}

/// The agent's flags besides those of every bench agent: its LAN listener on `listen`,
/// and the short timings of this run.
fn lan_agent_args(proxy: SocketAddr, token: &str, state_dir: &Path, id: &str, listen: SocketAddr) -> Vec<String> {
    let mut args = agent_args(proxy, token, state_dir, Some(id));
    args.extend(
        [
            "--listen",
            &listen.to_string(),
            "--offline-after-ms",
            &edges::OFFLINE_AFTER_MS.to_string(),
            "--directory-refresh-ms",
            "500",
            "--digest-interval-ms",
            "1000",
        ]
        .map(String::from),
    );
    args
}

/// Set-up, the submissions while the line comes and goes, the drain and the verdict.
#[allow(clippy::too_many_arguments)]
async fn drive(
    opts: &OfflineOptions,
    running: &mut Running,
    launches: &Launches,
    at: Addrs,
    uplink: &Uplink,
    dir: &Path,
    admin_token: &str,
    started: Instant,
) -> Result<OfflineReport, BenchError> {
    let e = opts.edges;
    let broker_addr = at.broker;
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
    // The alert receiver: a rejected merge must raise `offline_task.rejected`.
    let sink = if e.rejected_merges {
        let sink = EventSink::start().await?;
        setup::setup_call(
            &mut conn,
            &auth,
            "/v1/webhooks",
            json!({"id": "bench-alerts", "url": sink.url(), "events": ["offline_task.rejected"]}),
        )
        .await?;
        Some(sink)
    } else {
        None
    };
    // The mixed station's CloudPRNT printer polls the broker through the shop's line, like
    // the agent, and prints onto the run's paper log.
    let cloudprnt = if e.mixed_station {
        let place = fleet::Place {
            exe: &opts.exe,
            broker: at.proxy,
            mqtt_port: None,
            paper_log: &paper_log,
            dir,
            poll_interval_ms: fleet::DEFAULT_POLL_INTERVAL_MS,
        };
        let one = fleet::Fleet { cloudprnt: 1, ..fleet::Fleet::default() };
        running.callers.extend(fleet::start(&mut conn, &auth, one, opts.printers, place).await?.procs);
        Some(format!("p{}", opts.printers))
    } else {
        None
    };
    edges::create_stations(&mut conn, &auth, e, cloudprnt.as_deref(), opts.printers).await?;

    // The agent's listener keeps its port over restarts: the POS knows it by address.
    let listen = SocketAddr::from(([127, 0, 0, 1], free_port_run(1)?));
    let args = lan_agent_args(at.proxy, &agent_token, &dir.join("agent"), AGENT_ID, listen);
    let agent_log = dir.join("agent.log");
    let clocks: &[i64] = if e.clock_skew { &edges::CLOCKS } else { &[] };
    let agent_ctx = AgentCtx::new(&opts.exe, &args, &agent_log, clocks);
    running.agent = Some(agent_ctx.spawn()?);
    wait_agent_ready(listen, &mut running.agent, &agent_log).await?;
    // The second agent starts once the first holds the store's LAN listener.
    let second_listen = if e.second_agent {
        edges::wait_listener(listen, "this_agent", &agent_log, AGENT_READY).await?;
        let listen2 = SocketAddr::from(([127, 0, 0, 1], free_port_run(1)?));
        let args2 = lan_agent_args(at.proxy, &agent_token, &dir.join("agent-2"), edges::SECOND_AGENT_ID, listen2);
        let log2 = dir.join("agent-2.log");
        running.second = Some(Proc::spawn("second agent", &opts.exe, &args2, &log2)?);
        edges::wait_listener(listen2, "other_agent", &log2, AGENT_READY).await?;
        Some(listen2)
    } else {
        None
    };

    let watcher =
        PaperWatcher::start(paper_log, opts.tasks).map_err(|e| BenchError::io("starting the paper-log reader", e))?;
    let plan = plan(opts);
    let (cloud_subs, lan_subs, second_subs) = (Arc::new(plan.cloud), Arc::new(plan.lan), Arc::new(plan.second));
    let kills = agent_kill_plan(opts.kill_agent_every, opts.window);
    let timeline = edges::Timeline::new(opts.online, opts.offline, opts.window, e);

    let t0 = Instant::now();
    let first_date = utc_date(time::OffsetDateTime::now_utc());
    let deadline = t0 + opts.window + opts.timeout;
    let (done_tx, done_rx) = tokio::sync::watch::channel(false);
    let (mut kill_notes, mut line_notes) = (Vec::new(), Vec::new());
    let submissions = async {
        let all = tokio::join!(
            submit_all(broker_addr, auth.clone(), cloud_subs.clone(), opts.concurrency, t0, deadline),
            submit_all(listen, lan_auth.clone(), lan_subs.clone(), opts.concurrency, t0, deadline),
            async {
                match second_listen {
                    Some(l) => edges::send_once_all(l, lan_auth.clone(), second_subs.clone(), 2, t0).await,
                    None => Vec::new(),
                }
            },
        );
        done_tx.send_replace(true);
        all
    };
    let line_ctx = edges::LineCtx {
        uplink,
        timeline,
        hold: opts.hold,
        broker: &mut running.broker,
        restart: &launches.restart,
        broker_addr,
        auth: &auth,
        printers: opts.printers,
    };
    let ((cloud_run, lan_run, second_run), line, agent_kills) = tokio::join!(
        submissions,
        edges::drive_line(line_ctx, t0, done_rx.clone(), &mut line_notes),
        chaos::agent_kills(&mut running.agent, &agent_ctx, &kills, t0, &mut kill_notes),
    );
    let (line, agent_kills) = (line?, agent_kills?);
    let submit_seconds = cloud_run.last_answer_us.max(lan_run.last_answer_us) as f64 / 1e6;
    let mut problems: Vec<String> = kill_notes.into_iter().chain(line_notes).collect();
    let mut notes: Vec<String> = Vec::new();
    if line.cuts.is_empty() {
        notes.push("the line never went down: the submissions ended within the first online period".into());
    }
    if lan_run.outcomes.iter().all(|o| !o.offline) && !lan_subs.plan.requests.is_empty() {
        notes.push("no LAN answer was accepted offline: the agent's offline path was not exercised".into());
    }
    if e.rejected_merges && line.restart.is_none() {
        notes.push("the submissions ended before the broker's planned restart: no merge could be rejected".into());
    }
    if e.mixed_station || e.station_change {
        notes.push(
            "station orders go to the cloud or to the LAN, never both: the same order sent both ways to a station \
             whose first printer the agent does not drive, or whose printers changed while the shop was cut off, \
             can print on two printers (the documented limit)"
                .into(),
        );
    }

    // The line is back for good (drive_line saw to it); the agents must run to drain.
    let agent_status = running.agent.as_mut().map(Proc::exited);
    if !matches!(agent_status, Some(None)) {
        problems.push(format!("the agent had exited on its own ({agent_status:?}) when the submissions ended"));
        running.agent = Some(agent_ctx.spawn()?);
    }
    if let Some(status) = running.second.as_mut().and_then(Proc::exited) {
        problems.push(format!("the second agent had exited on its own ({status}) when the submissions ended"));
    }

    // Every order that got an answer somewhere must end up as a task at the broker, or as
    // a LAN task the broker rejected (alerted) and the agent keeps.
    let alerts_now = || sink.as_ref().map(|s| edges::rejected_alerts(&s.bodies())).unwrap_or_default();
    let answered_orders: BTreeSet<u32> =
        answered(&cloud_subs, &cloud_run).chain(answered(&lan_subs, &lan_run)).collect();
    let drain_start = Instant::now();
    let mut conn = crate::faults::connect(broker_addr, "draining").await?;
    let mut last_wait = String::new();
    let mut last_health = None;
    let drained = loop {
        let health = edges::health(listen).await;
        let unsynced = health.as_ref().and_then(|h| h.get("offline_tasks_not_synced")).and_then(Value::as_u64);
        if health.is_some() {
            last_health = health.clone();
        }
        if unsynced == Some(0) && !verify::any_active(&mut conn, &auth).await? {
            let listed = verify::list_states(&mut conn, &auth, &format!("store_id={STORE_ID}"), opts.tasks).await?;
            let mut have: BTreeSet<String> = listed.into_iter().map(|t| t.biz_no).collect();
            have.extend(alerts_now().into_iter().map(|a| a.biz_no));
            let missing = answered_orders.iter().filter(|n| !have.contains(&format!("E{n}"))).count();
            if missing == 0 {
                break true;
            }
            last_wait = format!("{missing} answered orders have no task at the broker (nor a rejection alert) yet");
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
    // Every task the agent keeps as rejected is alerted: the alerts of those with a task
    // at the broker too (an order also sent to the cloud) may still be on their way.
    let agent_rejected = last_health.as_ref().and_then(|h| h.get("offline_tasks_rejected")).and_then(Value::as_u64);
    let alerts_by = Instant::now() + ALERTS_WAIT;
    while sink.is_some() && Instant::now() < alerts_by && (alerts_now().len() as u64) < agent_rejected.unwrap_or(0) {
        tokio::time::sleep(DRAIN_POLL).await;
    }
    let alerts = alerts_now();
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
    let rejected = rejected_by_order(&alerts, &plan.orders, &mut problems);
    if let Some(n) = agent_rejected.filter(|&n| n != alerts.len() as u64) {
        problems.push(format!(
            "the agent keeps {n} offline tasks as rejected (LAN /healthz) but {} were alerted (offline_task.rejected)",
            alerts.len()
        ));
    }

    let verdict = judge(&Judged {
        orders: &plan.orders,
        tally: &tally,
        listed: &listed,
        answers: &answers,
        resolved: &resolved,
        rejected: &rejected,
    });
    problems.extend(verdict.problems.iter().cloned());

    let last_date = utc_date(time::OffsetDateTime::now_utc());
    // What the device printed and the broker does not hold printed, for a reason the run
    // knows: a LAN task the broker rejected (the agent keeps it), and honest doubt (on
    // paper once, held in doubt for a person: the agent was killed before the printer's
    // confirmation reached the broker, which is what the reconciliation shows a person).
    let explained: BTreeSet<String> = alerts
        .iter()
        .map(|a| a.lan_task_id.clone())
        .chain(verdict.in_doubt_on_paper.iter().flat_map(|f| f.broker_tasks.iter().cloned()))
        .collect();
    let expected_charges = (opts.tasks - verdict.rejected_kept.len() - verdict.refused.len()) as u64;
    let reconciliation = reconcile(
        &mut conn,
        &auth,
        (&first_date, &last_date),
        (expected_charges, &explained),
        &mut problems,
        &mut notes,
    )
    .await?;

    let slow = match e.slow_forwards {
        true => Some(slow_report(&mut conn, &auth, opts, &line, (&lan_subs, &lan_run), &plan.orders, &listed).await?),
        false => None,
    };
    let by_printer = |to: Destination| {
        let mut per: BTreeMap<String, usize> = BTreeMap::new();
        for t in
            listed.iter().filter(|t| order_of(&t.biz_no).and_then(|n| plan.orders.get(n)).is_some_and(|o| o.to == to))
        {
            *per.entry(t.printer_id.clone()).or_default() += 1;
        }
        per
    };
    let count =
        |to: Destination, channel: Channel| plan.orders.iter().filter(|o| o.to == to && o.channel == channel).count();
    let edge_report = EdgeReport {
        on: e.names(),
        slow_forwards: slow,
        mixed_station: e.mixed_station.then(|| StationReport {
            station: edges::KITCHEN,
            printers: vec![cloudprnt.clone().unwrap_or_default(), "p0".into()],
            orders_cloud: count(Destination::Kitchen, Channel::Cloud),
            orders_lan: count(Destination::Kitchen, Channel::Lan),
            tasks_per_printer: by_printer(Destination::Kitchen),
        }),
        station_change: e.station_change.then(|| StationChangeReport {
            station: edges::BAR,
            orders_cloud: count(Destination::Bar, Channel::Cloud),
            orders_lan: count(Destination::Bar, Channel::Lan),
            moves: line.station_moves.clone(),
            tasks_per_printer: by_printer(Destination::Bar),
        }),
        rejected_merges: e.rejected_merges.then(|| RejectedReport {
            large_orders: plan.orders.iter().filter(|o| o.large).count(),
            restart: line.restart.clone(),
            alerts: alerts.len(),
            alert_examples: alerts.iter().take(TEXT_EXAMPLES).cloned().collect(),
            rejected_kept: verdict.rejected_kept.len(),
            refused: verdict.refused.len(),
            answers_over_limit: answers.iter().flatten().filter(|o| edges::over_limit(o)).count(),
            agent_rejected,
        }),
        failing_uploads: e.failing_uploads.then(|| UploadReport {
            periods: line.failing_uploads.clone(),
            failed: uplink.counters.uploads_failed.load(std::sync::atomic::Ordering::Relaxed),
            passed: uplink.counters.uploads_passed.load(std::sync::atomic::Ordering::Relaxed),
        }),
        second_agent: e.second_agent.then(|| edges::second_agent_stats(&second_subs, &second_run, &mut problems)),
        clock_offsets_ms: e.clock_skew.then(|| agent_ctx.offsets()),
    };

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
        cuts: line.cuts,
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
        rejected_kept: verdict.rejected_kept,
        refused: verdict.refused,
        edges: edge_report,
        reconciliation,
        notes,
        total_seconds: started.elapsed().as_secs_f64(),
        kept_dir: None,
        problems,
    })
}

/// The order number of a `biz_no` of this run (`E<n>`).
fn order_of(biz_no: &str) -> Option<usize> {
    crate::e2e::marker_of(biz_no).map(|n| n as usize)
}

/// The rejected LAN task ids per order. An alert for an order that is not large (nothing
/// else should be rejected in this run), or for no order of the run, is a problem.
fn rejected_by_order(
    alerts: &[edges::RejectedAlert],
    orders: &[Order],
    problems: &mut Vec<String>,
) -> BTreeMap<usize, BTreeSet<String>> {
    let mut out: BTreeMap<usize, BTreeSet<String>> = BTreeMap::new();
    let mut unexpected = Vec::new();
    for a in alerts {
        match order_of(&a.biz_no).filter(|&n| orders.get(n).is_some_and(|o| o.large)) {
            Some(n) => {
                out.entry(n).or_default().insert(a.lan_task_id.clone());
            }
            None => unexpected.push(format!("{} (LAN task {}): {}", a.biz_no, a.lan_task_id, a.reason)),
        }
    }
    if !unexpected.is_empty() {
        problems.push(format!(
            "the broker rejected {} offline tasks of orders whose content is within every limit, e.g. {}",
            unexpected.len(),
            unexpected.iter().take(5).cloned().collect::<Vec<_>>().join("; ")
        ));
    }
    out
}

/// Slow forwards: the LAN answers accepted offline while the line was slow, and of their
/// orders those the broker took from the forward as well (its task's audit trail shows
/// the agent's LAN task merged into a task it had).
async fn slow_report(
    conn: &mut Conn,
    auth: &HeaderValue,
    opts: &OfflineOptions,
    line: &edges::LineLog,
    (subs, run): (&Submissions, &SubmitRun),
    orders: &[Order],
    listed: &[ListedTask],
) -> Result<SlowReport, BenchError> {
    let slow_at = |us: u64| {
        let s = us as f64 / 1e6;
        line.slow.iter().any(|c| s >= c.from_s && s < c.to_s)
    };
    let mut candidates: BTreeMap<usize, String> = BTreeMap::new();
    let mut while_slow = 0;
    for (req, o) in subs.plan.requests.iter().zip(&run.outcomes) {
        if o.offline && slow_at(o.start_us) {
            while_slow += 1;
            if let (201, Some(id)) = (o.status, o.task_id.as_deref()) {
                candidates.entry(req.key as usize).or_insert_with(|| id.to_string());
            }
        }
    }
    let by_biz: HashMap<&str, &ListedTask> = listed.iter().map(|t| (t.biz_no.as_str(), t)).collect();
    let mut report = SlowReport {
        hold_ms: opts.hold.as_millis() as u64,
        periods: line.slow.clone(),
        lan_offline_while_slow: while_slow,
        ..SlowReport::default()
    };
    for (n, lan_id) in candidates {
        if orders.get(n).is_none_or(|o| o.channel != Channel::Lan) {
            continue;
        }
        let Some(task) = by_biz.get(format!("E{n}").as_str()).filter(|t| t.task_id != lan_id) else { continue };
        let trail = crate::faults::events(conn, auth, &task.task_id).await?;
        let merged = trail.iter().skip(1).any(|e| e.reason.contains(&lan_id))
            && trail.first().is_some_and(|e| !e.reason.contains(&lan_id));
        if merged {
            report.doubles += 1;
            if report.examples.len() < TEXT_EXAMPLES {
                report.examples.push(format!("E{n}: LAN task {lan_id} merged into {} ({})", task.task_id, task.state));
            }
        }
    }
    Ok(report)
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
    rejected_kept: Vec<OrderFinding>,
    refused: Vec<OrderFinding>,
    problems: Vec<String>,
}

/// What the verdict judges.
struct Judged<'a> {
    orders: &'a [Order],
    tally: &'a Tally,
    listed: &'a [ListedTask],
    /// Per order, the final answers of its sends (both sides).
    answers: &'a [Vec<&'a Outcome>],
    resolved: &'a BTreeMap<String, Option<Resolved>>,
    /// Per order, its LAN tasks the broker rejected at the sync (alerted).
    rejected: &'a BTreeMap<usize, BTreeSet<String>>,
}

/// Judges every order by the paper log, the broker's tasks and the answers it got.
///
/// Two more ways for an order to be accounted for come with rejected merges: a LAN task
/// the broker rejected at the sync (alerted) is kept by the agent, on paper once if it
/// printed offline and never otherwise, and names no task at the broker; and a large order
/// every send of which came after the lower limit was refused (`400`) and never taken.
/// Either on paper twice is a duplicate like any other.
fn judge(j: &Judged<'_>) -> Verdict {
    let mut by_biz: HashMap<&str, Vec<&ListedTask>> = HashMap::new();
    for t in j.listed {
        by_biz.entry(t.biz_no.as_str()).or_default().push(t);
    }
    let own: HashMap<&str, &ListedTask> = j.listed.iter().map(|t| (t.task_id.as_str(), t)).collect();
    let no_rejects = BTreeSet::new();
    let mut v = Verdict { paper: PaperCounts { jobs: j.tally.lines, ..PaperCounts::default() }, ..Verdict::default() };
    for (n, order) in j.orders.iter().enumerate() {
        let biz_no = format!("E{n}");
        let on_paper = j.tally.counts.get(n).copied().unwrap_or(0);
        let tasks = by_biz.get(biz_no.as_str()).cloned().unwrap_or_default();
        let answers = j.answers.get(n).map_or(&[][..], Vec::as_slice);
        let rejected = j.rejected.get(&n).unwrap_or(&no_rejects);
        let mut answered_ids: Vec<String> = Vec::new();
        for id in answers.iter().filter_map(|o| o.task_id.as_deref()) {
            if !answered_ids.iter().any(|a| a == id) {
                answered_ids.push(id.to_string());
            }
        }
        let accepted = answers.iter().any(|o| matches!(o.status, 200 | 201));
        // Never taken: every send refused over the lowered limit (the only refusal the run
        // expects, and only for large orders).
        let refused = order.large && !answers.is_empty() && answers.iter().all(|o| edges::over_limit(o));
        // Kept by the agent: its LAN task rejected at the sync, and no task at the broker.
        let kept = !rejected.is_empty() && tasks.is_empty();
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
                None if kept => {}
                None if refused => {}
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
        if kept {
            v.paper.rejected_kept += 1;
            v.rejected_kept.push(finding(format!(
                "LAN task {} rejected at the sync and kept by the agent; on paper {on_paper} times",
                join(rejected)
            )));
        } else if refused && tasks.is_empty() {
            v.paper.refused_over_limit += 1;
            v.refused
                .push(finding(format!("every send refused over the lowered content limit; on paper {on_paper} times")));
        }

        // Then the broker's record against the paper.
        let broker_note = match tasks.as_slice() {
            // Printed offline, kept by the agent: the broker rightly has no task.
            [] if kept && on_paper == 1 => None,
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

        // Then the answers: all of one task, directly or through an id the broker resolves;
        // a LAN task the broker rejected names none.
        let mut why: Vec<String> = Vec::new();
        let unanswered = answers.iter().filter(|o| o.status == 0).count();
        if unanswered > 0 {
            why.push(format!("{unanswered} sends got no final answer"));
        }
        for o in answers.iter().filter(|o| !matches!(o.status, 0 | 200 | 201)) {
            if !(order.large && edges::over_limit(o)) {
                why.push(format!("answered {}", edges::describe(o)));
            }
        }
        let mut canonical: BTreeSet<String> = BTreeSet::new();
        for id in &answered_ids {
            match own.get(id.as_str()) {
                Some(t) if t.biz_no == biz_no => {
                    canonical.insert(t.task_id.clone());
                }
                Some(t) => why.push(format!("answered task {id} is the broker's task of {}", t.biz_no)),
                None => match j.resolved.get(id) {
                    Some(Some(r)) if r.biz_no == biz_no => {
                        canonical.insert(r.task_id.clone());
                    }
                    Some(Some(r)) => why.push(format!("answered id {id} resolves to {} of {}", r.task_id, r.biz_no)),
                    _ if rejected.contains(id) => {}
                    _ => why.push(format!("answered id {id} is unknown to the broker (GET /v1/print-tasks/{id}: 404)")),
                },
            }
        }
        if canonical.len() > 1 {
            why.push(format!("the answers name {} different tasks: {}", canonical.len(), join(&canonical)));
        }
        if !accepted && !refused {
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
///
/// `expected` is the ledger charges the day(s) must have and the LAN task ids the device
/// log may name without the broker having them (printed offline, rejected, kept by the
/// agent): those entries of `device_printed_broker_not` are explained and left out.
async fn reconcile(
    conn: &mut Conn,
    auth: &HeaderValue,
    (first, last): (&str, &str),
    (charges, explained): (u64, &BTreeSet<String>),
    problems: &mut Vec<String>,
    notes: &mut Vec<String>,
) -> Result<ReconciliationCheck, BenchError> {
    let since = Instant::now();
    loop {
        let mut check = ReconciliationCheck {
            dates: dates_between(first, last),
            expected_charges: charges,
            ..ReconciliationCheck::default()
        };
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
        if let Some(list) = check.device_printed_broker_not.as_mut() {
            let before = list.len();
            list.retain(|d| d.get("task_id").and_then(Value::as_str).is_none_or(|id| !explained.contains(id)));
            check.device_explained = before - list.len();
        }
        check.waited_s = since.elapsed().as_secs_f64();
        let device_empty = |l: &Option<Vec<Value>>| l.as_ref().is_none_or(Vec::is_empty);
        let settled = check.device_log.is_none()
            || (check.device_log.as_deref() == Some("present")
                && device_empty(&check.device_printed_broker_not)
                && device_empty(&check.broker_printed_device_not));
        if settled || since.elapsed() >= DEVICE_LOG_WAIT {
            check_day(&check, problems, notes);
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

fn check_day(check: &ReconciliationCheck, problems: &mut Vec<String>, notes: &mut Vec<String>) {
    if !check.printed_more_than_once.is_empty() {
        problems.push(format!(
            "the reconciliation lists {} keys printed more than once: {}",
            check.printed_more_than_once.len(),
            check.printed_more_than_once.iter().take(10).cloned().collect::<Vec<_>>().join("; ")
        ));
    }
    if check.ledger_charges != check.expected_charges {
        problems.push(format!(
            "the ledger has {} charges for {} orders the broker holds (one each)",
            check.ledger_charges, check.expected_charges
        ));
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
        if !self.edges.on.is_empty() {
            let _ = writeln!(s, "  edges: {}", self.edges.on.join(", "));
        }
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
        self.render_edges(&mut s);
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
             for (in_doubt/failed), {} lost; {} on paper once and in doubt at the broker; {} rejected at the sync \
             and kept by the agent, {} refused over the lowered limit",
            p.jobs,
            p.printed_once,
            p.printed_twice_or_more,
            p.extra_sheets,
            p.not_printed_accounted,
            p.lost,
            p.in_doubt_on_paper,
            p.rejected_kept,
            p.refused_over_limit
        );
        let _ = writeln!(s, "  LAN task ids resolved through the broker: {}", self.resolved_lan_ids);
        for (what, list) in [
            ("duplicates", &self.duplicates),
            ("lost", &self.lost),
            ("not printed, accounted for", &self.not_printed),
            ("on paper once, in doubt at the broker (honest doubt)", &self.in_doubt_on_paper),
            ("inconsistent answers", &self.inconsistent),
            ("broker differs from paper", &self.broker_differs),
            ("rejected at the sync, kept by the agent (accounted for)", &self.rejected_kept),
            ("refused over the lowered content limit (accounted for)", &self.refused),
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
            "  reconciliation {}: submitted {}, printed {}, in_doubt {}, failed {}, open {}, ledger charges {} \
             (expected {}), printed_more_than_once {}, device log {}, device_printed_broker_not {} (+{} explained: \
             rejected LAN tasks the agent printed and keeps, honest doubt), broker_printed_device_not {}",
            r.dates.join(" + "),
            r.submitted,
            r.printed,
            r.in_doubt,
            r.failed,
            r.open,
            r.ledger_charges,
            r.expected_charges,
            r.printed_more_than_once.len(),
            r.device_log.as_deref().unwrap_or("absent"),
            len(&r.device_printed_broker_not),
            r.device_explained,
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

/// Spans as `from–to` seconds.
fn spans(list: &[Cut]) -> String {
    let all: Vec<String> = list.iter().map(|c| format!("{:.1}–{:.1}", c.from_s, c.to_s)).collect();
    if all.is_empty() {
        "none".into()
    } else {
        all.join(", ")
    }
}

/// A clock offset in ms, as a person reads it: `0`, `+2 h`, `-1 d`, `+90 s`.
fn offset(ms: i64) -> String {
    let sign = if ms < 0 { "-" } else { "+" };
    let a = ms.unsigned_abs();
    match a {
        0 => "0".into(),
        a if a % 86_400_000 == 0 => format!("{sign}{} d", a / 86_400_000),
        a if a % 3_600_000 == 0 => format!("{sign}{} h", a / 3_600_000),
        a => format!("{sign}{:.0} s", a as f64 / 1000.0),
    }
}

impl OfflineReport {
    /// The lines of the edges that were on.
    fn render_edges(&self, s: &mut String) {
        let e = &self.edges;
        if let Some(r) = &e.slow_forwards {
            let _ = writeln!(
                s,
                "  slow forwards: answers held {} ms in {}; {} LAN answers accepted offline while the line was slow; \
                 {} orders taken by the broker from a late forward and by the agent offline (merged into one task)",
                r.hold_ms,
                spans(&r.periods),
                r.lan_offline_while_slow,
                r.doubles
            );
        }
        if let Some(r) = &e.mixed_station {
            let _ = writeln!(
                s,
                "  station {} {:?}: {} cloud and {} LAN orders; tasks per printer {:?}",
                r.station, r.printers, r.orders_cloud, r.orders_lan, r.tasks_per_printer
            );
        }
        if let Some(r) = &e.station_change {
            let moves: Vec<String> = r.moves.iter().map(|m| format!("{:.1} s → {:?}", m.at_s, m.printers)).collect();
            let _ = writeln!(
                s,
                "  station {} moved during the cuts: {}; {} cloud and {} LAN orders; tasks per printer {:?}",
                r.station,
                if moves.is_empty() { "never".into() } else { moves.join(", ") },
                r.orders_cloud,
                r.orders_lan,
                r.tasks_per_printer
            );
        }
        if let Some(r) = &e.rejected_merges {
            let restart = r.restart.as_ref().map_or("never restarted".to_string(), |x| {
                format!(
                    "broker restarted at {:.1} s ({:.0} ms down) with max_content_bytes {}",
                    x.at_s, x.down_ms, x.max_content_bytes
                )
            });
            let _ = writeln!(
                s,
                "  rejected merges: {} large orders; {restart}; {} rejected LAN tasks alerted (the agent keeps {}); \
                 {} orders kept by the agent only, {} refused, {} answers 400 over the limit",
                r.large_orders,
                r.alerts,
                r.agent_rejected.map_or("?".to_string(), |n| n.to_string()),
                r.rejected_kept,
                r.refused,
                r.answers_over_limit
            );
        }
        if let Some(r) = &e.failing_uploads {
            let _ = writeln!(
                s,
                "  failing uploads in {}: {} uploads answered 502 by the line, {} carried",
                spans(&r.periods),
                r.failed,
                r.passed
            );
        }
        if let Some(r) = &e.second_agent {
            let _ = writeln!(
                s,
                "  second agent: {} LAN re-sends, {} answered 503 lan_listener_taken, {} otherwise",
                r.sends, r.refused_taken, r.other
            );
        }
        if let Some(c) = &e.clock_offsets_ms {
            let all: Vec<String> = c.iter().map(|&ms| offset(ms)).collect();
            let _ = writeln!(s, "  agent clock per life: {}", all.join(", "));
        }
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
        let orders = vec![Order::new(Channel::Both); 5];
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
        let none = BTreeMap::new();
        let v = judge(&Judged {
            orders: &orders,
            tally: &tally,
            listed: &listed,
            answers: &answers,
            resolved: &resolved,
            rejected: &none,
        });
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
        let orders = vec![Order::new(Channel::Cloud); 4];
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
        let (resolved, rejected) = (BTreeMap::new(), BTreeMap::new());
        let v = judge(&Judged {
            orders: &orders,
            tally: &tally,
            listed: &listed,
            answers: &answers,
            resolved: &resolved,
            rejected: &rejected,
        });
        let differs: Vec<&str> = v.broker_differs.iter().map(|f| f.biz_no.as_str()).collect();
        assert_eq!(differs, ["E0", "E1", "E2"]);
        assert!(v.inconsistent.iter().any(|f| f.biz_no == "E2" && f.detail.contains("2 different tasks")));
        assert_eq!(v.lost.iter().map(|f| f.biz_no.as_str()).collect::<Vec<_>>(), ["E1"]);
        // On paper once and in doubt: honest doubt, listed but no problem of its own.
        assert_eq!(v.in_doubt_on_paper.iter().map(|f| f.biz_no.as_str()).collect::<Vec<_>>(), ["E3"]);
        assert_eq!(v.paper.in_doubt_on_paper, 1);
    }

    #[test]
    fn rejected_and_refused_orders_are_accounted_for_but_never_twice() {
        let large = Order { large: true, ..Order::new(Channel::Lan) };
        let mut orders = vec![large; 5];
        orders[3].channel = Channel::Cloud;
        orders[4] = Order::new(Channel::Cloud);
        // E0 printed offline and kept; E1 never printed and kept; E2 kept but on paper
        // twice; E3 refused at every send; E4 not large, refused all the same.
        let tally = Tally::with_prints(&[(0, 1), (2, 2)], 5);
        let over = || Outcome {
            status: 400,
            detail: Some(r#"{"error":{"message":"content: is 6324 bytes, the limit is 4096 bytes"}}"#.into()),
            ..Outcome::default()
        };
        let answers_owned: Vec<Vec<Outcome>> = vec![
            vec![out(201, "L0"), over()],
            vec![out(201, "L1"), out(200, "L1")],
            vec![out(201, "L2")],
            vec![over(), over()],
            vec![over()],
        ];
        let answers: Vec<Vec<&Outcome>> = answers_owned.iter().map(|a| a.iter().collect()).collect();
        let rejected: BTreeMap<usize, BTreeSet<String>> =
            (0..3).map(|n| (n, BTreeSet::from([format!("L{n}")]))).collect();
        let resolved = BTreeMap::new();
        let v = judge(&Judged {
            orders: &orders,
            tally: &tally,
            listed: &[],
            answers: &answers,
            resolved: &resolved,
            rejected: &rejected,
        });
        let names = |l: &[OrderFinding]| l.iter().map(|f| f.biz_no.clone()).collect::<Vec<_>>();
        assert_eq!(names(&v.rejected_kept), ["E0", "E1", "E2"]);
        assert_eq!(names(&v.refused), ["E3"]);
        assert_eq!((v.paper.rejected_kept, v.paper.refused_over_limit), (3, 1));
        assert_eq!(names(&v.duplicates), ["E2"]);
        assert_eq!(names(&v.lost), ["E4"]);
        assert_eq!(names(&v.inconsistent), ["E4"], "{:?}", v.inconsistent);
        assert!(v.inconsistent[0].detail.contains("answered 400"));
        assert!(
            names(&v.broker_differs).contains(&"E2".to_string())
                && !names(&v.broker_differs).contains(&"E0".to_string())
        );
    }

    #[test]
    fn the_edges_change_the_plan_only_where_they_say() {
        let base = OfflineOptions { tasks: 4_000, ..OfflineOptions::new("x") };
        let with =
            OfflineOptions { edges: Edges::all(), kill_agent_every: Some(Duration::from_secs(5)), ..base.clone() };
        assert!(validate(&with).is_ok());
        let (a, b) = (plan(&base), plan(&with));
        let count = |to: Destination| b.orders.iter().filter(|o| o.to == to).count();
        let (kitchen, bar) = (count(Destination::Kitchen), count(Destination::Bar));
        assert!((200..450).contains(&kitchen) && (200..450).contains(&bar), "{kitchen} {bar}");
        for (x, y) in a.orders.iter().zip(&b.orders) {
            match y.to {
                Destination::Printer(_) => assert_eq!(x.channel, y.channel, "a printer order keeps its side"),
                _ => assert_ne!(y.channel, Channel::Both, "a station order goes one way"),
            }
            assert!(!y.large || y.channel.lan(), "a large order has a LAN side");
        }
        let large = b.orders.iter().filter(|o| o.large).count();
        assert!((10..80).contains(&large), "{large}");
        // The second agent gets LAN re-sends only, about 5 % of them.
        assert!(b.second.plan.requests.iter().all(|r| r.repeat && b.orders[r.key as usize].channel.lan()));
        let lan_resends = b.lan.plan.requests.iter().filter(|r| r.repeat).count() + b.second.plan.requests.len();
        let second = b.second.plan.requests.len() as f64 / lan_resends as f64;
        assert!((0.03..0.07).contains(&second), "{second}");
        assert!(a.second.plan.requests.is_empty());
        let body = String::from_utf8_lossy(
            &b.lan.plan.requests.iter().find(|r| b.orders[r.key as usize].large).expect("a large LAN send").body,
        )
        .into_owned();
        assert!(body.len() > edges::LOWERED_LIMIT);
    }

    #[test]
    fn edges_need_what_they_work_on() {
        let check = |f: &dyn Fn(&mut OfflineOptions)| {
            let mut o = OfflineOptions {
                edges: Edges::all(),
                kill_agent_every: Some(Duration::from_secs(5)),
                ..OfflineOptions::new("x")
            };
            f(&mut o);
            validate(&o).err().map(|e| e.to_string()).unwrap_or_default()
        };
        assert!(check(&|o| o.kill_agent_every = None).contains("--kill-agent-every"));
        assert!(check(&|o| o.printers = 1).contains("--printers 2"));
        assert!(check(&|o| o.hold = Duration::from_millis(300)).contains("offline-after-ms"));
        assert!(check(&|o| o.mix = Mix { cloud: 1, lan: 0, both: 0 }).contains("LAN"));
        assert_eq!(check(&|_| {}), "");
        assert_eq!(offset(7_200_000), "+2 h");
        assert_eq!(offset(-86_400_000), "-1 d");
        assert_eq!(offset(0), "0");
    }

    #[test]
    fn reconciliation_days_add_up_and_absent_device_fields_are_a_note() {
        let mut c = ReconciliationCheck { expected_charges: 3, ..ReconciliationCheck::default() };
        add_day(
            &mut c,
            &json!({"counts": {"submitted": 3, "printed": 2, "in_doubt": 1}, "ledger": {"charges": 3},
                                "printed_more_than_once": []}),
        );
        let (mut problems, mut notes) = (Vec::new(), Vec::new());
        check_day(&c, &mut problems, &mut notes);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(notes.len(), 1);
        add_day(
            &mut c,
            &json!({"counts": {"submitted": 1}, "ledger": {"charges": 1}, "device_log": "present",
                                "printed_more_than_once": ["E1 (receipt) × 2"],
                                "device_printed_broker_not": [{"task_id": "x"}], "broker_printed_device_not": []}),
        );
        let (mut problems, mut notes) = (Vec::new(), Vec::new());
        check_day(&c, &mut problems, &mut notes);
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
