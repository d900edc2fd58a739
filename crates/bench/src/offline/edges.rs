//! The edges of offline operation that `bench offline` can add to a shop whose line keeps
//! dropping (README, "When the internet is down"), each behind a switch of [`Edges`]:
//!
//! - **slow forwards**: in the second half of every online period the shop's line holds
//!   the broker's answers for longer than the agent's `--offline-after-ms`, so the broker
//!   takes a forwarded LAN submission and the agent, no answer in time, accepts it offline
//!   too: one order, two tasks, one printer and one delivery key, merged at the sync;
//! - **mixed station**: a CloudPRNT printer (a `printer-sim` polling the broker through the
//!   shop's line, writing the run's paper log) and the station [`KITCHEN`] = [that printer,
//!   the agent's `p0`], which a share of the orders names;
//! - **station change**: the station [`BAR`], one agent printer, which the bench moves to
//!   another agent printer in the middle of every cut (`PATCH /v1/stations/bar`), so the
//!   sync finds the station no longer listing the printer the agent printed on;
//! - **rejected merges**: a small share of the LAN orders carry content larger than a
//!   limit the bench then sets by restarting the broker (`kill -9`, and back on its address
//!   with `max_content_bytes` below that size) in the middle of the last cut that begins
//!   within the submission window; the sync of what the agent took offline meanwhile is
//!   rejected, an `offline_task.rejected` alert goes out, and the agent keeps the task;
//! - **failing uploads**: in the first half of every second online period (the ones that
//!   follow the first, third … cut) the line answers `502` to the agent's
//!   `POST /v1/agent/offline-tasks` and passes everything else, so the upload's tasks go
//!   back to the agent's own lane;
//! - **second agent**: another agent process of the store (its own state directory and
//!   agent id, the same token and line) with a LAN listener, started once the first holds
//!   the store's listener; a share of the LAN re-sends go to it, once each (a POS trying
//!   the other PC), and must be answered `503 lan_listener_taken`;
//! - **clock skew**: the lives of the (killed and restarted) agent have their wall clock
//!   off by [`CLOCKS`] in turn.
//!
//! Station orders go one way only, to the cloud or to the LAN, never both: a station
//! ticket from the cloud goes to the station's first enabled printer and one from the LAN
//! to its first enabled printer the agent drives, so the same order sent both ways to a
//! station whose first printer the agent does not drive (the kitchen's CloudPRNT printer),
//! or to a station whose printers changed while the shop was cut off (the bar), has two
//! delivery keys on two printers and prints on both when the cloud's copy prints before the
//! agent's upload reaches the broker. That is the product's documented limit, not what this
//! run tests.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::body::Bytes;
use hyper::header::HeaderValue;
use hyper::Method;
use serde::Serialize;
use serde_json::{json, Value};

use crate::broker::{Broker, Launch};
use crate::faults::schedule::Submissions;
use crate::http::{snippet, Conn};
use crate::lb::Uplink;
use crate::load::{outcome_of, Outcome};
use crate::{BenchError, STORE_ID};

use super::Cut;

/// The mixed station: the CloudPRNT printer first, the agent's `p0` second.
pub const KITCHEN: &str = "kitchen";
/// The station whose printer the bench moves during every cut.
pub const BAR: &str = "bar";
/// Shares of the orders sent to each station (when its edge is on).
pub const KITCHEN_SHARE: f64 = 0.08;
pub const BAR_SHARE: f64 = 0.08;
/// Share of the orders with a LAN side whose content is over the limit the broker is
/// restarted with.
pub const LARGE_SHARE: f64 = 0.01;
/// The content limit (`max_content_bytes`) of the restarted broker, and the size of a
/// large order's content, well above it and far below the default limit (256 KiB).
pub const LOWERED_LIMIT: usize = 4_096;
const LARGE_CONTENT_LINES: usize = 170;
const LARGE_CONTENT_LINE: &str = "Allergy note: no peanuts, no sesame.\n";
/// Share of the LAN re-sends that go to the second agent instead.
pub const SECOND_AGENT_SHARE: f64 = 0.05;
/// The second agent's id.
pub const SECOND_AGENT_ID: &str = "bench-offline-agent-2";
/// The wall clock of each life of the agent, off by this much in turn: right, two hours
/// ahead, a day behind.
pub const CLOCKS: [i64; 3] = [0, 7_200_000, -86_400_000];
/// How long the line holds the broker's answers in a slow period by default: well past
/// the agent's `--offline-after-ms` (500).
pub const DEFAULT_HOLD: Duration = Duration::from_millis(1_500);
/// The agent's `--offline-after-ms` in this run.
pub const OFFLINE_AFTER_MS: u64 = 500;
/// A station that should never fail over in this run: its tickets stay on the printer
/// they were given, so every order has one task (failover is `bench faults`' subject).
const NO_FAILOVER_MS: u64 = 3_600_000;

/// Which edges a run adds; all off by default, all on with [`Edges::all`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Edges {
    pub slow_forwards: bool,
    pub mixed_station: bool,
    pub station_change: bool,
    pub rejected_merges: bool,
    pub failing_uploads: bool,
    pub second_agent: bool,
    pub clock_skew: bool,
}

impl Edges {
    pub fn all() -> Edges {
        Edges {
            slow_forwards: true,
            mixed_station: true,
            station_change: true,
            rejected_merges: true,
            failing_uploads: true,
            second_agent: true,
            clock_skew: true,
        }
    }

    /// The names of the edges that are on, for the report.
    pub fn names(&self) -> Vec<&'static str> {
        [
            (self.slow_forwards, "slow forwards"),
            (self.mixed_station, "mixed station"),
            (self.station_change, "station change"),
            (self.rejected_merges, "rejected merges"),
            (self.failing_uploads, "failing uploads"),
            (self.second_agent, "second agent"),
            (self.clock_skew, "clock skew"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect()
    }
}

/// Where an order goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Destination {
    /// The agent printer `p<n>`.
    Printer(usize),
    Kitchen,
    Bar,
}

/// The body of order `n`: the marker `E2E <n>` on its first line, so the paper log tells
/// orders apart, and for a large order [`LARGE_CONTENT_LINES`] more lines.
pub fn order_body(n: u32, to: Destination, print_type: &str, large: bool) -> Bytes {
    if let (Destination::Printer(p), false) = (to, large) {
        return crate::e2e::task_body_for(n, p, print_type);
    }
    let mut text = format!("E2E {n}\n1 x Noodles  12.00\n");
    if large {
        text.push_str(&LARGE_CONTENT_LINE.repeat(LARGE_CONTENT_LINES));
    }
    let mut body = json!({"biz_no": format!("E{n}"), "print_type": print_type,
                          "content": {"type": "text", "text": text}});
    let (field, value) = match to {
        Destination::Printer(p) => ("printer_id", format!("p{p}")),
        Destination::Kitchen => ("station_id", KITCHEN.to_string()),
        Destination::Bar => ("station_id", BAR.to_string()),
    };
    body[field] = Value::String(value);
    Bytes::from(body.to_string())
}

/// The two printer lists the bar alternates between: one agent printer each, the last
/// two of the agent's `printers`.
pub fn bar_printers(printers: usize, turn: usize) -> Vec<String> {
    let first = printers.saturating_sub(2);
    vec![format!("p{}", first + turn % 2)]
}

/// The broker's configuration after the restart: the run's, with the lowered content
/// limit (a top-level key, so it goes before the first table).
pub fn lowered_config(config: &str) -> String {
    format!("max_content_bytes = {LOWERED_LIMIT}\n{config}")
}

/// One change of the bar's printers.
#[derive(Debug, Clone, Serialize)]
pub struct StationMove {
    /// Seconds after the submissions began.
    pub at_s: f64,
    pub printers: Vec<String>,
    /// The broker's answer: 200, or what went wrong.
    pub status: u16,
}

/// The broker's restart with the lowered content limit.
#[derive(Debug, Clone, Serialize)]
pub struct Restart {
    pub at_s: f64,
    /// From the kill until it listened again.
    pub down_ms: f64,
    pub max_content_bytes: usize,
}

/// What the line driver did, in seconds after the submissions began.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LineLog {
    pub cuts: Vec<Cut>,
    /// Spans in which the line held every answer.
    pub slow: Vec<Cut>,
    /// Spans in which the line answered `502` to uploads.
    pub failing_uploads: Vec<Cut>,
    pub station_moves: Vec<StationMove>,
    pub restart: Option<Restart>,
}

/// One thing the line driver does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Down,
    Up,
    Hold(bool),
    FailUploads(bool),
    MoveBar(usize),
    Restart,
}

/// The shop's line over time: online periods of `online` and cuts of `offline`,
/// starting online, and the edges' changes within them.
#[derive(Debug, Clone, Copy)]
pub struct Timeline {
    pub online: Duration,
    pub offline: Duration,
    pub edges: Edges,
    /// The cut (counted from 0) in whose middle the broker is restarted.
    pub restart_cut: Option<u64>,
}

impl Timeline {
    /// The cut in whose middle the broker is restarted: the last one that begins within
    /// the submission window.
    pub fn new(online: Duration, offline: Duration, window: Duration, edges: Edges) -> Timeline {
        let period = (online + offline).as_millis() as u64;
        let (online_ms, window_ms) = (online.as_millis() as u64, window.as_millis() as u64);
        let last = (window_ms > online_ms).then(|| (window_ms - online_ms - 1) / period.max(1));
        Timeline { online, offline, edges, restart_cut: last.filter(|_| edges.rejected_merges) }
    }

    /// The steps of period `k` (online period `k`, then cut `k`), in ms after the start,
    /// in the order they are taken.
    fn steps(&self, k: u64) -> Vec<(u64, Step)> {
        let (on, off) = (self.online.as_millis() as u64, self.offline.as_millis() as u64);
        let start = k * (on + off);
        let mut steps = Vec::new();
        if k > 0 {
            steps.push((start, Step::Up));
        }
        if self.edges.failing_uploads && k % 2 == 1 {
            steps.push((start, Step::FailUploads(true)));
            steps.push((start + on / 2, Step::FailUploads(false)));
        }
        if self.edges.slow_forwards {
            steps.push((start + on / 2, Step::Hold(true)));
            steps.push((start + on, Step::Hold(false)));
        }
        steps.push((start + on, Step::Down));
        if self.edges.station_change {
            steps.push((start + on + off / 2, Step::MoveBar(k as usize + 1)));
        }
        if self.restart_cut == Some(k) {
            steps.push((start + on + off / 2, Step::Restart));
        }
        steps
    }
}

/// What the line driver works on.
pub struct LineCtx<'a> {
    pub uplink: &'a Uplink,
    pub timeline: Timeline,
    pub hold: Duration,
    /// The broker, restarted as `restart` says.
    pub broker: &'a mut Option<Broker>,
    pub restart: &'a Launch,
    pub broker_addr: SocketAddr,
    pub auth: &'a HeaderValue,
    pub printers: usize,
}

/// Takes the line down and brings it back, period after period, from `t0` (starting
/// online) until `done`, with the edges' changes in between; then brings it back for
/// good, without holds or failing uploads. Returns what it did.
pub async fn drive_line(
    ctx: LineCtx<'_>,
    t0: Instant,
    mut done: tokio::sync::watch::Receiver<bool>,
    problems: &mut Vec<String>,
) -> Result<LineLog, BenchError> {
    let LineCtx { uplink, timeline, hold, broker, restart, broker_addr, auth, printers } = ctx;
    let mut log = LineLog::default();
    let secs = |i: Instant| i.saturating_duration_since(t0).as_secs_f64();
    let open = |list: &mut Vec<Cut>| list.push(Cut { from_s: secs(Instant::now()), to_s: f64::NAN });
    let close = |list: &mut Vec<Cut>| {
        if let Some(c) = list.last_mut().filter(|c| c.to_s.is_nan()) {
            c.to_s = secs(Instant::now());
        }
    };
    'periods: for k in 0.. {
        for (at_ms, step) in timeline.steps(k) {
            tokio::select! {
                _ = tokio::time::sleep_until((t0 + Duration::from_millis(at_ms)).into()) => {}
                _ = done.wait_for(|d| *d) => break 'periods,
            }
            match step {
                Step::Down => {
                    uplink.set_up(false);
                    open(&mut log.cuts);
                }
                Step::Up => {
                    uplink.set_up(true);
                    close(&mut log.cuts);
                }
                Step::Hold(on) => {
                    uplink.set_hold(if on { hold } else { Duration::ZERO });
                    if on {
                        open(&mut log.slow)
                    } else {
                        close(&mut log.slow)
                    }
                }
                Step::FailUploads(on) => {
                    uplink.set_fail_uploads(on);
                    if on {
                        open(&mut log.failing_uploads)
                    } else {
                        close(&mut log.failing_uploads)
                    }
                }
                Step::MoveBar(turn) => {
                    let list = bar_printers(printers, turn);
                    let at_s = secs(Instant::now());
                    let status = move_station(broker_addr, auth, BAR, &list).await;
                    if status != 200 {
                        problems.push(format!("moving station {BAR} to {list:?} at {at_s:.1} s answered {status}"));
                    }
                    log.station_moves.push(StationMove { at_s, printers: list, status });
                }
                Step::Restart => {
                    let killed = Instant::now();
                    if let Some(mut b) = broker.take() {
                        match b.exited() {
                            Some(status) => {
                                problems.push(format!("the broker had exited on its own ({status}) before its restart"))
                            }
                            None => b.kill9().await?,
                        }
                    }
                    *broker = Some(crate::faults::chaos::restart_broker(restart).await?);
                    log.restart = Some(Restart {
                        at_s: secs(killed),
                        down_ms: killed.elapsed().as_secs_f64() * 1000.0,
                        max_content_bytes: LOWERED_LIMIT,
                    });
                }
            }
        }
    }
    uplink.set_hold(Duration::ZERO);
    uplink.set_fail_uploads(false);
    uplink.set_up(true);
    for list in [&mut log.cuts, &mut log.slow, &mut log.failing_uploads] {
        close(list);
    }
    Ok(log)
}

/// `PATCH /v1/stations/{id}` with a new printer list, straight to the broker (the tenant
/// changes it from elsewhere, not through the shop's line); the answer's status, 0 when
/// none came.
async fn move_station(broker: SocketAddr, auth: &HeaderValue, station: &str, printers: &[String]) -> u16 {
    let body = Bytes::from(json!({ "printers": printers }).to_string());
    let path = format!("/v1/stations/{station}");
    // One try on a fresh connection, one more after a pause: the broker may be settling.
    for _ in 0..2 {
        if let Ok(mut conn) = Conn::connect(broker).await {
            if let Ok((status, _)) = conn.request(Method::PATCH, &path, auth, Some(body.clone())).await {
                return status.as_u16();
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    0
}

/// Creates the stations of the edges that are on: the kitchen over `cloudprnt` (the
/// CloudPRNT printer's id) and `p0`, and the bar on its first printer list. Neither fails
/// over in this run ([`NO_FAILOVER_MS`]).
pub async fn create_stations(
    conn: &mut Conn,
    auth: &HeaderValue,
    edges: Edges,
    cloudprnt: Option<&str>,
    printers: usize,
) -> Result<(), BenchError> {
    if let (true, Some(primary)) = (edges.mixed_station, cloudprnt) {
        crate::setup::setup_call(
            conn,
            auth,
            "/v1/stations",
            json!({"id": KITCHEN, "store_id": STORE_ID, "printers": [primary, "p0"], "failover_after_ms": NO_FAILOVER_MS}),
        )
        .await?;
    }
    if edges.station_change {
        crate::setup::setup_call(
            conn,
            auth,
            "/v1/stations",
            json!({"id": BAR, "store_id": STORE_ID, "printers": bar_printers(printers, 0),
                   "failover_after_ms": NO_FAILOVER_MS}),
        )
        .await?;
    }
    Ok(())
}

/// Sends every planned request once, at its moment, over a fresh connection each (a POS
/// that tries the other PC once): no retry, whatever the answer.
pub async fn send_once_all(
    addr: SocketAddr,
    auth: HeaderValue,
    subs: Arc<Submissions>,
    concurrency: usize,
    t0: Instant,
) -> Vec<Outcome> {
    let n = subs.plan.requests.len();
    let next = Arc::new(AtomicUsize::new(0));
    let mut handles = Vec::new();
    for _ in 0..concurrency.clamp(1, n.max(1)) {
        let (auth, subs, next) = (auth.clone(), subs.clone(), next.clone());
        handles.push(tokio::spawn(async move {
            let us = |at: Instant| at.saturating_duration_since(t0).as_micros() as u64;
            let mut done = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(req) = subs.plan.requests.get(i) else { return done };
                tokio::time::sleep_until((t0 + Duration::from_millis(subs.send_at_ms[i])).into()).await;
                let start = Instant::now();
                let result = match Conn::connect(addr).await {
                    Ok(mut c) => c.request(Method::POST, "/v1/print-tasks", &auth, Some(req.body.clone())).await,
                    Err(e) => Err(e),
                };
                done.push((i, outcome_of(result, us(start), us(Instant::now()))));
            }
        }));
    }
    let mut outcomes = vec![Outcome::default(); n];
    for h in handles {
        // A worker that died (a bench bug) leaves its sends at status 0, which the
        // verdict reports as answers other than 503.
        if let Ok(done) = h.await {
            for (i, o) in done {
                outcomes[i] = o;
            }
        }
    }
    outcomes
}

/// What the second agent's LAN listener answered.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SecondAgentStats {
    /// LAN re-sends that went to it.
    pub sends: usize,
    /// Answered `503 lan_listener_taken`, as they must be.
    pub refused_taken: usize,
    /// Anything else, by example.
    pub other: usize,
    pub examples: Vec<String>,
}

/// Counts the second agent's answers; anything but `503 lan_listener_taken` is a problem.
pub fn second_agent_stats(subs: &Submissions, outcomes: &[Outcome], problems: &mut Vec<String>) -> SecondAgentStats {
    let mut s = SecondAgentStats { sends: outcomes.len(), ..SecondAgentStats::default() };
    for (req, o) in subs.plan.requests.iter().zip(outcomes) {
        let taken = o.status == 503 && o.detail.as_deref().is_some_and(|d| d.contains("lan_listener_taken"));
        if taken {
            s.refused_taken += 1;
        } else {
            s.other += 1;
            if s.examples.len() < 5 {
                s.examples.push(format!("E{}: {} {}", req.key, o.status, o.detail.as_deref().unwrap_or("")));
            }
        }
    }
    if s.other > 0 {
        problems.push(format!(
            "the second agent's LAN listener answered {} of {} sends otherwise than 503 lan_listener_taken, e.g. {}",
            s.other,
            s.sends,
            s.examples.join("; ")
        ));
    }
    s
}

/// The agent's `GET /healthz` on its LAN listener, as JSON; `None` while it does not answer.
pub async fn health(listen: SocketAddr) -> Option<Value> {
    let mut conn = Conn::connect(listen).await.ok()?;
    let none = HeaderValue::from_static("Bearer none");
    let (status, body) =
        conn.request_within(Method::GET, "/healthz", &none, None, Duration::from_secs(5)).await.ok()?;
    if !status.is_success() {
        return None;
    }
    serde_json::from_slice(&body).ok()
}

/// Waits until the agent on `listen` reports `want` for its `lan_listener` (and its
/// directory and LAN keys).
pub async fn wait_listener(listen: SocketAddr, want: &str, log: &Path, within: Duration) -> Result<(), BenchError> {
    let since = Instant::now();
    let mut last = Value::Null;
    while since.elapsed() < within {
        if let Some(h) = health(listen).await {
            if h.get("lan_listener").and_then(Value::as_str) == Some(want)
                && h.get("lan_keys") == Some(&Value::Bool(true))
            {
                return Ok(());
            }
            last = h;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(BenchError::Protocol {
        context: "starting the second agent".into(),
        detail: format!(
            "its /healthz on {listen} did not say lan_listener {want:?} within {within:?} (last: {last})\n{}",
            crate::procs::log_tail(log, 40)
        ),
    })
}

/// One `offline_task.rejected` alert as the receiver got it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RejectedAlert {
    pub lan_task_id: String,
    pub biz_no: String,
    pub reason: String,
}

/// The distinct rejected LAN tasks among the receiver's bodies (an alert may arrive more
/// than once, and a task sent again after a lost answer is alerted again).
pub fn rejected_alerts(bodies: &[Value]) -> Vec<RejectedAlert> {
    let mut seen = BTreeSet::new();
    bodies
        .iter()
        .filter(|v| v["type"] == "offline_task.rejected")
        .filter_map(|v| {
            let d = &v["data"];
            let lan_task_id = d["lan_task_id"].as_str()?.to_string();
            seen.insert(lan_task_id.clone()).then(|| RejectedAlert {
                lan_task_id,
                biz_no: d["biz_no"].as_str().unwrap_or_default().to_string(),
                reason: d["reason"].as_str().unwrap_or_default().to_string(),
            })
        })
        .collect()
}

/// Whether an answer is the broker's (or the agent's) refusal of content over the lowered
/// limit.
pub fn over_limit(o: &Outcome) -> bool {
    o.status == 400 && o.detail.as_deref().is_some_and(|d| d.contains("the limit is"))
}

/// The status and a snippet of an answer, for messages.
pub fn describe(o: &Outcome) -> String {
    format!("{} {}", o.status, snippet(o.detail.as_deref().unwrap_or("").as_bytes(), 160))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timeline_puts_each_edge_where_the_docs_say() {
        let t = Timeline::new(Duration::from_secs(8), Duration::from_secs(8), Duration::from_secs(64), Edges::all());
        // Cuts begin at 8, 24, 40, 56 s: the last one within the window is the fourth.
        assert_eq!(t.restart_cut, Some(3));
        assert_eq!(
            t.steps(0),
            vec![
                (4_000, Step::Hold(true)),
                (8_000, Step::Hold(false)),
                (8_000, Step::Down),
                (12_000, Step::MoveBar(1))
            ]
        );
        let p1 = t.steps(1);
        assert_eq!(p1[0], (16_000, Step::Up));
        assert!(p1.contains(&(16_000, Step::FailUploads(true))) && p1.contains(&(20_000, Step::FailUploads(false))));
        assert!(!t.steps(2).iter().any(|s| matches!(s.1, Step::FailUploads(_))));
        assert!(t.steps(3).contains(&(60_000, Step::Restart)));
        assert!(t.steps(3).windows(2).all(|w| w[0].0 <= w[1].0));
        let plain =
            Timeline::new(Duration::from_secs(8), Duration::from_secs(8), Duration::from_secs(64), Edges::default());
        assert_eq!(plain.steps(1), vec![(16_000, Step::Up), (24_000, Step::Down)]);
        assert_eq!(plain.restart_cut, None);
        let short = Timeline::new(
            Duration::from_millis(1_500),
            Duration::from_millis(1_500),
            Duration::from_secs(6),
            Edges::all(),
        );
        assert_eq!(short.restart_cut, Some(1), "cuts at 1.5 and 4.5 s");
    }

    #[test]
    fn bodies_carry_the_marker_and_large_ones_pass_the_lowered_limit() {
        let plain = order_body(7, Destination::Printer(2), "receipt", false);
        assert_eq!(plain, crate::e2e::task_body_for(7, 2, "receipt"));
        let v: Value = serde_json::from_slice(&order_body(8, Destination::Kitchen, "kitchen", true)).expect("json");
        assert_eq!((v["station_id"].as_str(), v["biz_no"].as_str()), (Some(KITCHEN), Some("E8")));
        let text = v["content"]["text"].as_str().unwrap_or_default();
        assert!(text.starts_with("E2E 8\n") && text.len() > LOWERED_LIMIT && text.len() < 64 * 1024);
        assert_eq!(crate::paper::markers_in(text), vec![8]);
        let bar: Value = serde_json::from_slice(&order_body(9, Destination::Bar, "label", false)).expect("json");
        assert_eq!(bar["station_id"], BAR);
        assert!(bar.get("printer_id").is_none());
    }

    #[test]
    fn the_bar_alternates_between_two_agent_printers() {
        assert_eq!(bar_printers(4, 0), ["p2"]);
        assert_eq!(bar_printers(4, 1), ["p3"]);
        assert_eq!(bar_printers(4, 2), ["p2"]);
        assert_eq!(bar_printers(2, 1), ["p1"]);
        assert!(lowered_config("a = 1\n").starts_with("max_content_bytes = 4096\na = 1"));
    }

    #[test]
    fn alerts_are_counted_once_per_lan_task() {
        let alert = |id: &str, biz: &str| json!({"type": "offline_task.rejected", "data": {"lan_task_id": id, "biz_no": biz, "reason": "content: too big"}});
        let bodies = vec![alert("L1", "E1"), alert("L1", "E1"), alert("L2", "E2"), json!({"type": "task.printed"})];
        let got = rejected_alerts(&bodies);
        assert_eq!(got.iter().map(|a| a.lan_task_id.as_str()).collect::<Vec<_>>(), ["L1", "L2"]);
        assert_eq!(got[0].reason, "content: too big");
    }
}
