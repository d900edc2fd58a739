//! A full database for `bench submit` and `bench e2e` ("flat cost"):
//! `--preload-finished N` and `--preload-waiting M` put N finished and M waiting tasks into
//! the fresh broker's database before the measured run, so that intake and dispatch are
//! measured against a database that has been in use for a while rather than an empty one.
//!
//! The preloaded tasks are shaped like the broker's own, row for row: a `tasks` row with
//! the canonical text content, its fingerprint, the lane order `seq` and every column a
//! task of that state has; its audit trail in `task_events` (submitted, dispatched to the
//! store's agent, then printed, retried until it failed, or in doubt and cancelled by an
//! operator, with the attempt numbers and reasons the engine writes); its ledger charge,
//! and the refund of a cancelled task. They are spread like a fleet's history:
//! - finished tasks (about 97.5 % printed, 1.5 % failed, 1 % cancelled; receipts,
//!   kitchen tickets and labels) created over the [`DAYS`] days before the run, half on
//!   the bench store's printers and half on [`OTHER_STORES`] other stores of the same
//!   tenant, several of them in other time zones, so that business days differ;
//! - waiting tasks (`pending`, never sent) created over the last [`WAITING_HOURS`] hours,
//!   on the other stores' printers only. No agent polls those stores, so the measured
//!   run's printers never print them, but every lane read, the sweeper, the watchdog's
//!   lane statistics, retention and the console's queries see them.
//!
//! Tenant, stores and printers are set up over the HTTP API like the rest of the bench's
//! set-up; only the task rows are written directly, in bulk, after the broker has migrated
//! its schema: on PostgreSQL with `COPY` (the sequence default numbers the tasks, as it
//! does the broker's inserts), followed by `VACUUM (ANALYZE)`, which autovacuum would
//! long have done to rows this old (without it autovacuum starts on the new rows during
//! the measured run); on SQLite through a connection of the bench's own in transactions of
//! [`SQLITE_CHUNK`] tasks (the broker's writer waits at most one of them), with
//! `task_seq` advanced as the broker's writer advances it, and the WAL checkpointed at the
//! end. SQLite gets no `ANALYZE`: the broker never runs one, so a database in service has
//! no `sqlite_stat1`, and the bench should not measure plans that no deployment has.
//! After the writes the bench waits [`SETTLE`] so that the broker's periodic jobs have
//! looked at the new rows once before anything is measured.
//!
//! The rows are generated from the task number alone (ids, times and choices come from a
//! fixed hash), so two runs preload the same history and [`expected`] can tell what a
//! preload of a given size holds without reading it back.

use std::collections::BTreeMap;
use std::time::Instant;

use hyper::body::Bytes;
use hyper::header::HeaderValue;
use hyper::Method;
use onceprint_core::{Fingerprint, TaskId};
use serde::Serialize;
use serde_json::json;

use crate::http::{snippet, Conn};
use crate::setup::setup_call;
use crate::{BenchError, STORE_ID};

/// Other stores of the bench tenant that hold preloaded tasks.
pub const OTHER_STORES: usize = 20;
/// Printers of each other store.
pub const PRINTERS_PER_OTHER_STORE: usize = 5;
/// Finished tasks were created over this many days before the run.
pub const DAYS: i64 = 7;
/// Waiting tasks were created over this many hours before the run.
pub const WAITING_HOURS: i64 = 2;
/// Tasks per `COPY` on PostgreSQL (one per table).
pub const CHUNK: usize = 20_000;
/// Tasks per SQLite transaction: short enough that the broker's writer, which waits for
/// the lock meanwhile, still renews its leases in time (a chunk of 20,000 took longer
/// than a lease on a loaded machine, and the broker stepped down from all its jobs).
pub const SQLITE_CHUNK: usize = 2_000;
/// The biz_no prefixes of preloaded tasks: none of the benches' own tasks uses them.
pub const FINISHED_PREFIX: &str = "PRE-F-";
pub const WAITING_PREFIX: &str = "PRE-W-";

/// The wait after the writes, before the measured run.
pub const SETTLE: std::time::Duration = std::time::Duration::from_secs(3);

const TENANT: &str = "bench";
const DAY_MS: i64 = 86_400_000;
const HOUR_MS: i64 = 3_600_000;
/// Time zones of the other stores, in turn: business days end at different instants.
const ZONES: &[&str] = &["UTC", "Europe/Berlin", "Asia/Shanghai", "America/New_York"];

/// How many tasks to preload. Both zero: no preload, the database stays empty.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PreloadOptions {
    pub finished: usize,
    pub waiting: usize,
}

impl PreloadOptions {
    pub fn is_empty(&self) -> bool {
        self.finished == 0 && self.waiting == 0
    }

    pub(crate) fn validate(&self) -> Result<(), BenchError> {
        if u32::try_from(self.finished).is_err() || u32::try_from(self.waiting).is_err() {
            return Err(BenchError::InvalidOptions("too many preloaded tasks".into()));
        }
        Ok(())
    }
}

/// What a preload wrote, and how long it took (not part of any measured figure).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PreloadReport {
    pub finished: usize,
    pub waiting: usize,
    /// Tasks per state.
    pub states: BTreeMap<String, u64>,
    pub events: u64,
    pub ledger_entries: u64,
    pub other_stores: usize,
    pub other_printers: usize,
    /// Writing the rows (with the checkpoint or `VACUUM (ANALYZE)`), after the set-up over
    /// HTTP and before the settling wait.
    pub seconds: f64,
    /// Whether the broker's own count of tasks by state (`/metrics`) agreed afterwards.
    pub broker_counts_agree: bool,
}

impl PreloadReport {
    pub fn render_line(&self) -> String {
        format!(
            "preload: {} finished + {} waiting tasks ({} events, {} ledger entries) on {} other stores / {} printers \
             and the bench store, written in {:.1} s (not measured); broker counts agree: {}",
            self.finished,
            self.waiting,
            self.events,
            self.ledger_entries,
            self.other_stores,
            self.other_printers,
            self.seconds,
            self.broker_counts_agree
        )
    }
}

/// Where preloaded tasks go: the bench store's printers and the other stores' printers.
#[derive(Debug, Clone)]
pub struct Layout {
    pub bench_printers: usize,
    /// The moment the history ends: every preloaded task was created before it.
    pub now_ms: i64,
}

impl Layout {
    pub fn other_store(i: usize) -> String {
        format!("o{:02}", i + 1)
    }

    /// (store, printer) of the other stores' printer number `n`.
    pub fn other_printer(n: usize) -> (String, String) {
        let store = n / PRINTERS_PER_OTHER_STORE % OTHER_STORES;
        let s = Self::other_store(store);
        let p = format!("{s}-p{}", n % PRINTERS_PER_OTHER_STORE);
        (s, p)
    }
}

/// An id above every preloaded task's and below every task the broker creates after the
/// preload (ids sort by creation time): the benches' listings of their own tasks stop at it.
pub fn floor_id(layout: &Layout) -> String {
    TaskId::from_parts(layout.now_ms, [0xFF; 10]).into_string()
}

/// One audit event of a generated task.
#[derive(Debug, Clone, PartialEq)]
pub struct GenEvent {
    pub at: i64,
    pub from: Option<&'static str>,
    pub to: &'static str,
    pub attempt: i32,
    pub actor: String,
    pub reason: String,
}

/// One generated task with everything written for it.
#[derive(Debug, Clone, PartialEq)]
pub struct GenTask {
    pub id: String,
    pub store_id: String,
    pub printer_id: String,
    pub target: String,
    pub biz_no: String,
    pub print_type: &'static str,
    pub priority: i32,
    pub content: Vec<u8>,
    pub fingerprint: String,
    pub state: &'static str,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
    pub printed_at: Option<i64>,
    pub sent_to: Option<String>,
    pub sent_session: Option<String>,
    pub sent_at: Option<i64>,
    pub may_have_printed: bool,
    pub events: Vec<GenEvent>,
    /// (kind, amount, at).
    pub ledger: Vec<(&'static str, i64, i64)>,
}

/// SplitMix64: a fixed, well-mixed hash of the task number (not for secrets).
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn random10(seed: u64) -> [u8; 10] {
    let (a, b) = (mix(seed).to_be_bytes(), mix(seed ^ 0xA5A5_A5A5).to_be_bytes());
    [a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], b[0], b[1]]
}

/// The print types the broker knows by default, with their priorities (core::policy).
fn print_type(k: u64) -> (&'static str, i32) {
    match k % 10 {
        0..=6 => ("receipt", 10),
        7 | 8 => ("kitchen", 20),
        _ => ("label", 30),
    }
}

fn agent_of(store: &str) -> String {
    format!("agent:{store}-till")
}

fn session_of(store: &str, day: i64) -> String {
    format!("preload-{store}-{day}")
}

/// The finished task number `k` of `finished`.
pub fn finished_task(layout: &Layout, k: usize, finished: usize) -> GenTask {
    let span = DAYS * DAY_MS - 2 * HOUR_MS;
    let start = layout.now_ms - DAYS * DAY_MS;
    let created = start + (k as i128 * span as i128 / finished.max(1) as i128) as i64;
    let (store, printer) = if k & 1 == 0 {
        (STORE_ID.to_string(), format!("p{}", (k / 2) % layout.bench_printers.max(1)))
    } else {
        Layout::other_printer(k / 2)
    };
    let h = mix(k as u64 ^ 0x0F1E_2D3C);
    let state = match h % 1000 {
        0..=14 => "failed",
        15..=24 => "cancelled",
        _ => "printed",
    };
    // Order numbers as order systems make them: increasing, of one width.
    let biz_no = format!("{FINISHED_PREFIX}{k:09}");
    base_task(TaskId::from_parts(created, random10(k as u64)), store, printer, biz_no, k as u64, created, state)
}

/// The waiting task number `j` of `waiting`.
pub fn waiting_task(layout: &Layout, j: usize, waiting: usize) -> GenTask {
    let span = WAITING_HOURS * HOUR_MS - 60_000;
    let start = layout.now_ms - WAITING_HOURS * HOUR_MS;
    let created = start + (j as i128 * span as i128 / waiting.max(1) as i128) as i64;
    let (store, printer) = Layout::other_printer(j);
    let biz_no = format!("{WAITING_PREFIX}{j:09}");
    let seed = (j as u64) | (1 << 40);
    base_task(TaskId::from_parts(created, random10(seed)), store, printer, biz_no, j as u64, created, "pending")
}

fn base_task(
    id: TaskId,
    store: String,
    printer: String,
    biz_no: String,
    k: u64,
    created: i64,
    state: &'static str,
) -> GenTask {
    let (print_type, priority) = print_type(k);
    let content = format!("{biz_no}\n2 x Noodles  12.00\n1 x Tea  3.50\nTotal  27.50\n").into_bytes();
    let fingerprint = Fingerprint::of("text", &content).0;
    let tenant_actor = format!("tenant:{TENANT}");
    let mut t = GenTask {
        id: id.into_string(),
        target: format!("printer:{printer}"),
        store_id: store,
        printer_id: printer,
        biz_no,
        print_type,
        priority,
        content,
        fingerprint,
        state,
        attempts: 0,
        last_error: None,
        created_at: created,
        updated_at: created,
        printed_at: None,
        sent_to: None,
        sent_session: None,
        sent_at: None,
        may_have_printed: false,
        events: vec![GenEvent {
            at: created,
            from: None,
            to: "pending",
            attempt: 0,
            actor: tenant_actor,
            reason: "submitted".into(),
        }],
        ledger: vec![("charge", 1, created)],
    };
    if state == "pending" {
        return t;
    }
    let agent = agent_of(&t.store_id);
    let session = session_of(&t.store_id, created / DAY_MS);
    let mut at = created + 30 + (mix(k) % 200) as i64;
    let send = |t: &mut GenTask, attempt: i32, at: i64| {
        let from = if attempt == 1 { "pending" } else { "retrying" };
        let reason = if attempt == 1 {
            format!("dispatched to {agent}")
        } else {
            format!("attempt {attempt} dispatched to {agent}")
        };
        t.events.push(GenEvent { at, from: Some(from), to: "sent", attempt, actor: agent.clone(), reason });
        t.attempts = attempt;
        t.sent_to = Some(agent.clone());
        t.sent_session = Some(session.clone());
        t.sent_at = Some(at);
    };
    // The agent's answer to the first attempt.
    let first_answer = |t: &mut GenTask, at: i64, to: &'static str, reason: &str| {
        let actor = agent_of(&t.store_id);
        t.events.push(GenEvent { at, from: Some("sent"), to, attempt: 1, actor, reason: reason.to_string() });
    };
    match state {
        "printed" => {
            send(&mut t, 1, at);
            at += 250 + (mix(k ^ 7) % 900) as i64;
            first_answer(&mut t, at, "printed", "attempt 1: the printer confirmed it printed");
            t.printed_at = Some(at);
        }
        "failed" => {
            // Five attempts (the default policy's limit), each answered `offline`.
            for attempt in 1..=5 {
                send(&mut t, attempt, at);
                at += 2_000;
                let (to, reason) = if attempt < 5 {
                    ("retrying", format!("attempt {attempt}: offline; retry in {} ms", 1_000 * attempt))
                } else {
                    ("failed", "attempt 5: offline; no attempts left".to_string())
                };
                let actor = agent_of(&t.store_id);
                t.events.push(GenEvent { at, from: Some("sent"), to, attempt, actor, reason });
                t.last_error = Some("offline".into());
                at += 1_000 * attempt as i64;
            }
            at -= 5_000;
        }
        _ => {
            // In doubt after the first attempt, then cancelled by a manager an hour later.
            send(&mut t, 1, at);
            at += 30_000;
            let reason = "attempt 1: the printer may have printed but cannot prove it; waiting for a person";
            first_answer(&mut t, at, "in_doubt", reason);
            t.last_error = Some("in_doubt".into());
            t.may_have_printed = true;
            at += HOUR_MS;
            let reason = "cancelled by the shift manager: reprinted by hand".to_string();
            t.events.push(GenEvent {
                at,
                from: Some("in_doubt"),
                to: "cancelled",
                attempt: 1,
                actor: "operator:manager".into(),
                reason,
            });
            t.ledger.push(("refund", 1, at));
        }
    }
    t.updated_at = at;
    t
}

/// All tasks of a preload in creation order (finished ones first: they are older).
fn tasks(layout: &Layout, opts: PreloadOptions) -> impl Iterator<Item = GenTask> + '_ {
    (0..opts.finished)
        .map(move |k| finished_task(layout, k, opts.finished))
        .chain((0..opts.waiting).map(move |j| waiting_task(layout, j, opts.waiting)))
}

/// What a preload of this size holds, computed without writing anything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Expected {
    pub states: BTreeMap<String, u64>,
    pub events: u64,
    pub ledger_entries: u64,
    /// Tasks per (store, state).
    pub per_store: BTreeMap<(String, String), u64>,
    /// The bench store's reconciliation per UTC day (the bench store is in UTC): the day's
    /// start in ms → what its report must count.
    pub bench_store_days: BTreeMap<i64, DayExpected>,
    /// Tasks in the lanes of the other stores' printers.
    pub waiting_per_printer: BTreeMap<String, u64>,
}

/// The parts of a day's reconciliation a preload decides.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DayExpected {
    pub submitted: u64,
    pub printed: u64,
    pub failed: u64,
    pub cancelled: u64,
    pub charges: u64,
    pub refunds: u64,
}

fn day_of(ms: i64) -> i64 {
    ms - ms.rem_euclid(DAY_MS)
}

pub fn expected(layout: &Layout, opts: PreloadOptions) -> Expected {
    let mut e = Expected::default();
    for t in tasks(layout, opts) {
        *e.states.entry(t.state.to_string()).or_default() += 1;
        e.events += t.events.len() as u64;
        e.ledger_entries += t.ledger.len() as u64;
        *e.per_store.entry((t.store_id.clone(), t.state.to_string())).or_default() += 1;
        if t.state == "pending" {
            *e.waiting_per_printer.entry(t.printer_id.clone()).or_default() += 1;
        }
        if t.store_id != STORE_ID {
            continue;
        }
        let day = e.bench_store_days.entry(day_of(t.created_at)).or_default();
        day.submitted += 1;
        match t.state {
            "printed" => day.printed += 1,
            "failed" => day.failed += 1,
            "cancelled" => day.cancelled += 1,
            _ => {}
        }
        for (kind, _, at) in &t.ledger {
            let day = e.bench_store_days.entry(day_of(*at)).or_default();
            match *kind {
                "charge" => day.charges += 1,
                _ => day.refunds += 1,
            }
        }
    }
    e
}

/// Creates the other stores and their printers over the HTTP API (agent transport, an
/// address nothing listens on: no agent of theirs ever polls).
pub async fn set_up_other_stores(conn: &mut Conn, auth: &HeaderValue) -> Result<usize, BenchError> {
    let mut printers = 0;
    for i in 0..OTHER_STORES {
        let store = Layout::other_store(i);
        let zone = ZONES[i % ZONES.len()];
        setup_call(conn, auth, "/v1/stores", json!({"id": store, "name": format!("Store {store}"), "timezone": zone}))
            .await?;
        for p in 0..PRINTERS_PER_OTHER_STORE {
            let body = json!({"id": format!("{store}-p{p}"), "store_id": store, "name": format!("Printer {p} of {store}"),
                              "transport": {"kind": "agent", "address": "tcp://127.0.0.1:9"}});
            setup_call(conn, auth, "/v1/printers", body).await?;
            printers += 1;
        }
    }
    Ok(printers)
}

/// Sets up the other stores, writes the preload into the database at `database_url` (the
/// broker's URL: `sqlite://PATH` or PostgreSQL with the bench schema on its search path)
/// and checks the broker's own counts. The bench store and its `bench_printers` printers
/// must exist already.
pub async fn preload(
    conn: &mut Conn,
    auth: &HeaderValue,
    database_url: &str,
    bench_printers: usize,
    opts: PreloadOptions,
) -> Result<(PreloadReport, Layout), BenchError> {
    let other_printers = set_up_other_stores(conn, auth).await?;
    let layout = Layout { bench_printers, now_ms: crate::paper::unix_now_us() / 1000 };
    let started = Instant::now();
    let mut report = if let Some(path) = database_url.strip_prefix("sqlite://") {
        let (path, layout2) = (path.to_string(), layout.clone());
        tokio::task::spawn_blocking(move || write_sqlite(&path, &layout2, opts))
            .await
            .map_err(|e| BenchError::Protocol { context: "preloading".into(), detail: e.to_string() })??
    } else {
        write_postgres(database_url, &layout, opts).await?
    };
    report.seconds = started.elapsed().as_secs_f64();
    tokio::time::sleep(SETTLE).await;
    report.finished = opts.finished;
    report.waiting = opts.waiting;
    report.other_stores = OTHER_STORES;
    report.other_printers = other_printers;
    let counts = broker_counts(conn, auth).await?;
    report.broker_counts_agree =
        report.states.iter().all(|(s, n)| counts.get(s) == Some(n)) && counts.values().sum::<u64>() == opts_total(opts);
    Ok((report, layout))
}

fn opts_total(opts: PreloadOptions) -> u64 {
    (opts.finished + opts.waiting) as u64
}

/// The broker's count of tasks by state, from `/metrics` (`onceprint_tasks{state=…}`).
pub async fn broker_counts(conn: &mut Conn, auth: &HeaderValue) -> Result<BTreeMap<String, u64>, BenchError> {
    let (status, body) = conn
        .request(Method::GET, "/metrics", auth, None)
        .await
        .map_err(|detail| BenchError::Http { context: "reading /metrics".into(), detail })?;
    if status.as_u16() != 200 {
        return Err(BenchError::Protocol {
            context: "reading /metrics".into(),
            detail: format!("HTTP {status}: {}", snippet(&body, 300)),
        });
    }
    Ok(parse_task_counts(&String::from_utf8_lossy(&body)))
}

/// `onceprint_tasks{state="printed"} 12` lines → state → count (zero counts left out).
pub fn parse_task_counts(text: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("onceprint_tasks{state=\"") else { continue };
        let Some((state, value)) = rest.split_once("\"} ") else { continue };
        if let Ok(n) = value.trim().parse::<u64>() {
            if n > 0 {
                out.insert(state.to_string(), n);
            }
        }
    }
    out
}

/// Reads the preload back through the broker's API and says what disagrees with
/// [`expected`] (empty: all of it agrees): the task list of every store by state, one
/// task's audit trail, the bench store's reconciliation for every day of the history, and
/// the lanes of the other stores as the watchdog measures them (`/metrics`, waited for
/// up to 20 s: the watchdog looks every few seconds).
pub async fn verify(conn: &mut Conn, auth: &HeaderValue, layout: &Layout, opts: PreloadOptions) -> Vec<String> {
    let want = expected(layout, opts);
    let mut problems = Vec::new();
    if let Err(e) = verify_inner(conn, auth, layout, opts, &want, &mut problems).await {
        problems.push(format!("reading the preload back failed: {e}"));
    }
    problems
}

async fn verify_inner(
    conn: &mut Conn,
    auth: &HeaderValue,
    layout: &Layout,
    opts: PreloadOptions,
    want: &Expected,
    problems: &mut Vec<String>,
) -> Result<(), BenchError> {
    // Every store's tasks, listed by the broker, counted by state.
    let stores: Vec<String> =
        std::iter::once(STORE_ID.to_string()).chain((0..OTHER_STORES).map(Layout::other_store)).collect();
    let mut listed: BTreeMap<(String, String), u64> = BTreeMap::new();
    let mut biz_nos = std::collections::HashSet::new();
    for store in &stores {
        let query = format!("store_id={store}");
        let hint = opts.finished + opts.waiting;
        let tasks = crate::verify::list_states(conn, auth, &query, hint).await?;
        for t in tasks {
            biz_nos.insert(t.biz_no.clone());
            *listed.entry((store.clone(), t.state)).or_default() += 1;
        }
    }
    if listed != want.per_store {
        problems.push(format!(
            "the broker lists tasks per (store, state) {listed:?}, the preload wrote {:?}",
            want.per_store
        ));
    }
    if biz_nos.len() != opts.finished + opts.waiting {
        problems.push(format!("{} distinct biz_no listed, {} preloaded", biz_nos.len(), opts.finished + opts.waiting));
    }
    let counts = broker_counts(conn, auth).await?;
    if counts != want.states {
        problems.push(format!("the broker counts {counts:?} by state (/metrics), the preload wrote {:?}", want.states));
    }

    // One failed task's audit trail as the broker shows it.
    if let Some(k) = (0..opts.finished).find(|&k| finished_task(layout, k, opts.finished).state == "failed") {
        let t = finished_task(layout, k, opts.finished);
        let path = format!("/v1/print-tasks/{}/events", t.id);
        let body = get_json(conn, auth, &path).await?;
        let shown: Vec<(String, i64)> = body
            .get("events")
            .and_then(serde_json::Value::as_array)
            .map(|a| {
                a.iter()
                    .map(|e| {
                        let to = e.get("to").and_then(serde_json::Value::as_str).unwrap_or_default().to_string();
                        (to, e.get("attempt").and_then(serde_json::Value::as_i64).unwrap_or(-1))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let wrote: Vec<(String, i64)> = t.events.iter().map(|e| (e.to.to_string(), i64::from(e.attempt))).collect();
        if shown != wrote {
            problems.push(format!("task {} shows events {shown:?}, the preload wrote {wrote:?}", t.id));
        }
    }

    // The bench store's reconciliation, day by day.
    for (day, d) in &want.bench_store_days {
        let date = time::OffsetDateTime::from_unix_timestamp(day / 1000)
            .map(|t| t.date())
            .map_err(|e| BenchError::InvalidOptions(format!("day {day}: {e}")))?;
        let date = format!("{:04}-{:02}-{:02}", date.year(), u8::from(date.month()), date.day());
        let r = get_json(conn, auth, &format!("/v1/stores/{STORE_ID}/reconciliation?date={date}")).await?;
        let n =
            |section: &str, field: &str| r.get(section).and_then(|s| s.get(field)).and_then(serde_json::Value::as_u64);
        let got = DayExpected {
            submitted: n("counts", "submitted").unwrap_or(u64::MAX),
            printed: n("counts", "printed").unwrap_or(u64::MAX),
            failed: n("counts", "failed").unwrap_or(u64::MAX),
            cancelled: n("counts", "cancelled").unwrap_or(u64::MAX),
            charges: n("ledger", "charges").unwrap_or(u64::MAX),
            refunds: n("ledger", "refunds").unwrap_or(u64::MAX),
        };
        if &got != d {
            problems.push(format!(
                "reconciliation of {STORE_ID} on {date}: the broker says {got:?}, the preload wrote {d:?}"
            ));
        }
    }

    // The lanes of the other stores, as the watchdog last measured them.
    let give_up = Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let lanes = lane_waiting(conn, auth).await?;
        if lanes == want.waiting_per_printer {
            break;
        }
        if Instant::now() >= give_up {
            problems.push(format!(
                "the watchdog's lanes ({} printers, {} tasks waiting) differ from the preload's ({} printers, {} tasks)",
                lanes.len(),
                lanes.values().sum::<u64>(),
                want.waiting_per_printer.len(),
                want.waiting_per_printer.values().sum::<u64>()
            ));
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    Ok(())
}

async fn get_json(conn: &mut Conn, auth: &HeaderValue, path: &str) -> Result<serde_json::Value, BenchError> {
    let (status, body) = conn
        .request(Method::GET, path, auth, None)
        .await
        .map_err(|detail| BenchError::Http { context: format!("GET {path}"), detail })?;
    if status.as_u16() != 200 {
        return Err(BenchError::Protocol {
            context: format!("GET {path}"),
            detail: format!("HTTP {status}: {}", snippet(&body, 300)),
        });
    }
    serde_json::from_slice(&body)
        .map_err(|e| BenchError::Protocol { context: format!("GET {path}"), detail: format!("not JSON: {e}") })
}

/// `onceprint_lane_waiting_tasks{…printer="P"} N` lines of `/metrics` → printer → N.
async fn lane_waiting(conn: &mut Conn, auth: &HeaderValue) -> Result<BTreeMap<String, u64>, BenchError> {
    let (_, body) = conn
        .request(Method::GET, "/metrics", auth, None)
        .await
        .map_err(|detail| BenchError::Http { context: "reading /metrics".into(), detail })?;
    let mut out = BTreeMap::new();
    for line in String::from_utf8_lossy(&body).lines() {
        let Some(rest) = line.strip_prefix("onceprint_lane_waiting_tasks{") else { continue };
        let Some((labels, value)) = rest.split_once("} ") else { continue };
        let printer = labels.split(',').find_map(|l| l.strip_prefix("printer=\"")).map(|p| p.trim_end_matches('"'));
        if let (Some(p), Ok(n)) = (printer, value.trim().parse::<u64>()) {
            if n > 0 {
                out.insert(p.to_string(), n);
            }
        }
    }
    Ok(out)
}

/// Starts a broker on a fresh database (`None`: SQLite; else a PostgreSQL URL, a fresh
/// schema dropped afterwards), sets up the bench tenant and store, preloads, and returns
/// the preload's report with [`verify`]'s findings. For the preload's own test.
pub async fn run_check(
    exe: &std::path::Path,
    database: Option<String>,
    bench_printers: usize,
    opts: PreloadOptions,
) -> Result<(PreloadReport, Vec<String>), BenchError> {
    crate::validate_database(database.as_deref())?;
    opts.validate()?;
    let tmp = crate::run_dir("onceprint-bench-preload-")?;
    let dir = tmp.path();
    crate::on_database(database.as_deref(), dir, |_, url| async move {
        let admin_token = crate::random_hex(24)?;
        let broker = crate::broker::Broker::start(exe, &url, &admin_token, &dir.join("broker.log")).await?;
        let result = async {
            let mut conn = Conn::connect(broker.addr)
                .await
                .map_err(|detail| BenchError::Http { context: "connecting for set-up".into(), detail })?;
            let auth = crate::setup::tenant(&mut conn, &admin_token).await?;
            let addresses = vec!["tcp://127.0.0.1:9".to_string(); bench_printers];
            crate::setup::store_and_printers(&mut conn, &auth, &addresses).await?;
            let (report, layout) = preload(&mut conn, &auth, &url, bench_printers, opts).await?;
            let problems = verify(&mut conn, &auth, &layout, opts).await;
            Ok::<_, BenchError>((report, problems))
        }
        .await;
        let tail = broker.log_tail();
        let _ = broker.stop().await;
        result.map_err(|e| e.with_logs(Some(format!("\n--- broker log ---\n{tail}"))))
    })
    .await
}

fn sqlite_err(context: &str) -> impl Fn(rusqlite::Error) -> BenchError + '_ {
    move |e| BenchError::Protocol { context: format!("preloading SQLite: {context}"), detail: e.to_string() }
}

fn write_sqlite(path: &str, layout: &Layout, opts: PreloadOptions) -> Result<PreloadReport, BenchError> {
    let mut c = rusqlite::Connection::open(path).map_err(sqlite_err("opening the database"))?;
    // The broker's writer may want the lock between two chunks; it waits up to its own
    // busy timeout (10 s), and this connection waits as long for the broker's commits.
    // `synchronous=NORMAL`: the preload need not survive a power cut, a run would be
    // started again.
    // A large page cache of its own keeps the index pages the inserts walk in memory.
    // Foreign keys are not checked on this connection (each check is one more B-tree
    // probe per row): the rows reference only what set-up created and the tasks written
    // just before them, and the preload's test reads them back through the broker.
    c.execute_batch(
        "PRAGMA busy_timeout=30000; PRAGMA foreign_keys=OFF; PRAGMA synchronous=NORMAL; PRAGMA cache_size=-262144;",
    )
    .map_err(sqlite_err("configuring"))?;
    let mut report = PreloadReport::default();
    let mut all = tasks(layout, opts).peekable();
    while all.peek().is_some() {
        let chunk: Vec<GenTask> = all.by_ref().take(SQLITE_CHUNK).collect();
        let tx =
            c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).map_err(sqlite_err("beginning"))?;
        // Like the broker's writer: the lane order continues from the counter.
        let mut seq: i64 =
            tx.query_row("SELECT last FROM task_seq", [], |r| r.get(0)).map_err(sqlite_err("task_seq"))?;
        {
            let mut task = tx
                .prepare_cached(
                    "INSERT INTO tasks (id, tenant_id, store_id, printer_id, station_id, target, biz_no, print_type, \
                     priority, content_type, content, fingerprint, state, attempts, last_error, next_attempt_at, \
                     created_at, updated_at, printed_at, sent_to, sent_session, sent_at, may_have_printed, seq) \
                     VALUES (?1, ?2, ?3, ?4, NULL, ?5, ?6, ?7, ?8, 'text', ?9, ?10, ?11, ?12, ?13, NULL, ?14, ?15, \
                     ?16, ?17, ?18, ?19, ?20, ?21)",
                )
                .map_err(sqlite_err("preparing tasks"))?;
            let mut event = tx
                .prepare_cached(
                    "INSERT INTO task_events (task_id, at, from_state, to_state, attempt, actor, reason) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                )
                .map_err(sqlite_err("preparing task_events"))?;
            let mut ledger = tx
                .prepare_cached("INSERT INTO ledger (tenant_id, task_id, kind, amount, at) VALUES (?1, ?2, ?3, ?4, ?5)")
                .map_err(sqlite_err("preparing ledger"))?;
            for t in &chunk {
                seq += 1;
                task.execute(rusqlite::params![
                    t.id,
                    TENANT,
                    t.store_id,
                    t.printer_id,
                    t.target,
                    t.biz_no,
                    t.print_type,
                    t.priority,
                    t.content,
                    t.fingerprint,
                    t.state,
                    t.attempts,
                    t.last_error,
                    t.created_at,
                    t.updated_at,
                    t.printed_at,
                    t.sent_to,
                    t.sent_session,
                    t.sent_at,
                    t.may_have_printed,
                    seq
                ])
                .map_err(sqlite_err("inserting a task"))?;
                for e in &t.events {
                    event
                        .execute(rusqlite::params![t.id, e.at, e.from, e.to, e.attempt, e.actor, e.reason])
                        .map_err(sqlite_err("inserting an event"))?;
                }
                for (kind, amount, at) in &t.ledger {
                    ledger
                        .execute(rusqlite::params![TENANT, t.id, kind, amount, at])
                        .map_err(sqlite_err("inserting a ledger entry"))?;
                }
                tally(&mut report, t);
            }
        }
        tx.execute("UPDATE task_seq SET last = ?1", [seq]).map_err(sqlite_err("task_seq"))?;
        tx.commit().map_err(sqlite_err("committing"))?;
    }
    // The broker's checkpointer copies the WAL into the database in the background; done
    // here, the measured run does not start with hundreds of megabytes still to copy.
    c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())).map_err(sqlite_err("checkpointing"))?;
    Ok(report)
}

fn tally(report: &mut PreloadReport, t: &GenTask) {
    *report.states.entry(t.state.to_string()).or_default() += 1;
    report.events += t.events.len() as u64;
    report.ledger_entries += t.ledger.len() as u64;
}

/// A value in `COPY … FROM STDIN` text format: `\N` for NULL, the four characters the
/// format reserves escaped.
fn copy_text(out: &mut String, value: Option<&str>) {
    match value {
        None => out.push_str("\\N"),
        Some(v) => {
            for ch in v.chars() {
                match ch {
                    '\\' => out.push_str("\\\\"),
                    '\t' => out.push_str("\\t"),
                    '\n' => out.push_str("\\n"),
                    '\r' => out.push_str("\\r"),
                    c => out.push(c),
                }
            }
        }
    }
}

fn copy_row(out: &mut String, fields: &[Option<&str>]) {
    for (i, f) in fields.iter().enumerate() {
        if i > 0 {
            out.push('\t');
        }
        copy_text(out, *f);
    }
    out.push('\n');
}

/// `bytea` in COPY text format: `\x` and hex digits, the backslash itself escaped.
fn bytea_hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(2 + bytes.len() * 2);
    s.push_str("\\x");
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

async fn write_postgres(url: &str, layout: &Layout, opts: PreloadOptions) -> Result<PreloadReport, BenchError> {
    use futures_util::SinkExt as _;

    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .map_err(|e| BenchError::postgres("connecting to preload", e))?;
    let connection = tokio::spawn(async move {
        let _ = connection.await;
    });
    // Bulk loading as a database administrator does it: triggers off for this session,
    // which skips the foreign-key check of every row (two RI-trigger queries per event
    // row and task; the rows reference only what set-up created and the tasks copied just
    // before them). Only a superuser may; for anyone else the checks stay on, and the
    // preload is slower. Nothing else of the broker's uses triggers.
    let _ = client.batch_execute("SET session_replication_role = replica").await;
    let copy = |sql: &'static str, data: String| {
        let client = &client;
        async move {
            let sink = client.copy_in(sql).await.map_err(|e| BenchError::postgres(sql, e))?;
            let mut sink = Box::pin(sink);
            sink.send(Bytes::from(data)).await.map_err(|e| BenchError::postgres(sql, e))?;
            sink.as_mut().finish().await.map_err(|e| BenchError::postgres(sql, e))?;
            Ok::<(), BenchError>(())
        }
    };
    let mut report = PreloadReport::default();
    let mut all = tasks(layout, opts).peekable();
    while all.peek().is_some() {
        let chunk: Vec<GenTask> = all.by_ref().take(CHUNK).collect();
        let (mut tasks_data, mut events_data, mut ledger_data) = (String::new(), String::new(), String::new());
        for t in &chunk {
            let (priority, attempts) = (t.priority.to_string(), t.attempts.to_string());
            let (created, updated) = (t.created_at.to_string(), t.updated_at.to_string());
            let printed = t.printed_at.map(|v| v.to_string());
            let sent_at = t.sent_at.map(|v| v.to_string());
            let content = bytea_hex(&t.content);
            copy_row(
                &mut tasks_data,
                &[
                    Some(&t.id),
                    Some(TENANT),
                    Some(&t.store_id),
                    Some(&t.printer_id),
                    Some(&t.target),
                    Some(&t.biz_no),
                    Some(t.print_type),
                    Some(&priority),
                    Some("text"),
                    Some(&content),
                    Some(&t.fingerprint),
                    Some(t.state),
                    Some(&attempts),
                    t.last_error.as_deref(),
                    Some(&created),
                    Some(&updated),
                    printed.as_deref(),
                    t.sent_to.as_deref(),
                    t.sent_session.as_deref(),
                    sent_at.as_deref(),
                    Some(if t.may_have_printed { "t" } else { "f" }),
                ],
            );
            for e in &t.events {
                let (at, attempt) = (e.at.to_string(), e.attempt.to_string());
                copy_row(
                    &mut events_data,
                    &[Some(&t.id), Some(&at), e.from, Some(e.to), Some(&attempt), Some(&e.actor), Some(&e.reason)],
                );
            }
            for (kind, amount, at) in &t.ledger {
                let (amount, at) = (amount.to_string(), at.to_string());
                copy_row(&mut ledger_data, &[Some(TENANT), Some(&t.id), Some(kind), Some(&amount), Some(&at)]);
            }
            tally(&mut report, t);
        }
        // `seq` is left to its default, the sequence, as the broker's inserts leave it: the
        // rows are numbered in the order they are copied, which is creation order.
        copy(
            "COPY tasks (id, tenant_id, store_id, printer_id, target, biz_no, print_type, priority, content_type, \
             content, fingerprint, state, attempts, last_error, created_at, updated_at, printed_at, sent_to, \
             sent_session, sent_at, may_have_printed) FROM STDIN",
            tasks_data,
        )
        .await?;
        copy("COPY task_events (task_id, at, from_state, to_state, attempt, actor, reason) FROM STDIN", events_data)
            .await?;
        copy("COPY ledger (tenant_id, task_id, kind, amount, at) FROM STDIN", ledger_data).await?;
    }
    client
        .batch_execute("VACUUM (ANALYZE) tasks, task_events, ledger")
        .await
        .map_err(|e| BenchError::postgres("vacuuming after the preload", e))?;
    drop(client);
    let _ = connection.await;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        Layout { bench_printers: 10, now_ms: 1_800_000_000_000 }
    }

    #[test]
    fn tasks_are_spread_and_shaped_like_real_ones() {
        let l = layout();
        let opts = PreloadOptions { finished: 4_000, waiting: 1_000 };
        let all: Vec<GenTask> = tasks(&l, opts).collect();
        // Ids are the broker's shape, unique, and sort by creation time.
        assert!(all.iter().all(|t| TaskId::parse(&t.id).is_some()));
        let mut ids: Vec<&str> = all.iter().map(|t| t.id.as_str()).collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids sort in creation order");
        ids.dedup();
        assert_eq!(ids.len(), 5_000);
        assert!(all.iter().all(|t| TaskId::parts(&t.id).map(|p| p.0) == Some(t.created_at)));
        // Finished tasks lie in the past days, waiting ones in the last hours, all before now.
        assert!(all.iter().all(|t| t.created_at < l.now_ms && t.updated_at < l.now_ms));
        let (finished, waiting) = all.split_at(4_000);
        assert!(finished.iter().all(|t| t.created_at >= l.now_ms - DAYS * DAY_MS));
        assert!(waiting.iter().all(|t| t.state == "pending" && t.created_at >= l.now_ms - WAITING_HOURS * HOUR_MS));
        // Waiting tasks only on other stores; finished ones on both.
        assert!(waiting.iter().all(|t| t.store_id != STORE_ID));
        assert!(finished.iter().any(|t| t.store_id == STORE_ID) && finished.iter().any(|t| t.store_id != STORE_ID));
        let e = expected(&l, opts);
        for s in ["printed", "failed", "cancelled"] {
            assert!(e.states.get(s).copied().unwrap_or(0) > 0, "some {s}");
        }
        // Every event chain starts with the submission and ends in the task's state, and
        // every task is charged once (cancelled ones refunded).
        for t in &all {
            assert_eq!(t.events[0].to, "pending");
            assert_eq!(t.events.last().map(|e| e.to), Some(t.state));
            assert!(t.events.windows(2).all(|w| w[1].from == Some(w[0].to) && w[0].at <= w[1].at));
            assert_eq!(t.ledger.iter().filter(|l| l.0 == "charge").count(), 1);
            assert_eq!(t.ledger.iter().any(|l| l.0 == "refund"), t.state == "cancelled");
            assert_eq!(t.fingerprint, Fingerprint::of("text", &t.content).0);
        }
        // The same number gives the same task: runs preload the same history.
        assert_eq!(finished_task(&l, 17, 4_000), all[17]);
    }

    #[test]
    fn copy_text_escapes_what_the_format_reserves() {
        let mut s = String::new();
        copy_row(&mut s, &[Some("a\tb\\c\nd"), None, Some("")]);
        assert_eq!(s, "a\\tb\\\\c\\nd\t\\N\t\n");
        assert_eq!(bytea_hex(b"A\n"), "\\x410a");
    }

    #[test]
    fn task_counts_are_read_from_the_metrics_text() {
        let text = "# TYPE onceprint_tasks gauge\nonceprint_tasks{state=\"printed\"} 12\n\
                    onceprint_tasks{state=\"failed\"} 0\nonceprint_tasks{state=\"pending\"} 3\nother 1\n";
        let counts = parse_task_counts(text);
        assert_eq!(counts.len(), 2);
        assert_eq!((counts["printed"], counts["pending"]), (12, 3));
    }
}
