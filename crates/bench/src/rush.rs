//! Time to paper under a lunch rush, behind `onceprint bench rush`: how long a ticket
//! takes from its submission to paper when printers print at a real speed, and how much
//! of that the broker and the store agent add.
//!
//! It starts, from the given executable, a broker with its *default* settings (rate
//! limits on, as a shop runs it; `rate_limits_off` turns them off and the report says
//! so), one `printer-sim` with the store agent's ESC/POS printers, optionally the mixed
//! fleet of printers that call the broker (CloudPRNT, Epson Server Direct Print, MQTT
//! devices: [`crate::faults::fleet`]), and one store agent. Every printer takes a fixed
//! time per ticket, set through its simulator's control endpoint (`slow_ms`); with a
//! range, each printer gets its own time from the range, spread evenly and interleaved
//! over the kinds. Tickets are submitted at an even pace (`rate` a second for `seconds`),
//! to the printers in turn (or drawn at random), a share of them sent again 1–4 times with
//! the same idempotency key ([`crate::faults::schedule::submissions`], sent and retried by
//! [`crate::faults::submit`]).
//!
//! Per ticket, from the submission's first send (`s`) and the paper log's time of its
//! line (`p`, the end of printing), with `d` the printer's own time per ticket and `f`
//! the end of the printer's previous ticket:
//!
//! - time to paper = `p − s`;
//! - queued behind the printer's previous ticket = `max(0, f − s)`;
//! - broker and agent's share ("added") = `p − d − max(s, f)`: what is left once the
//!   printer's own time and its queue are taken away.
//!
//! A printer that polls (CloudPRNT, Epson) learns of a ticket only when it next asks, and
//! how often it asks is its own setting. Its simulator writes the times of its polls since
//! its previous job into the paper-log line, so for those printers the wait for the first
//! poll sent at or after `max(s, f)` (`a`) is reported apart ("waiting for a poll") and the
//! share is `p − d − a`. When no poll was sent after `max(s, f)` (the poll that found the
//! ticket was already on its way), `a = max(s, f)`.
//!
//! It talks to nothing but the processes it started, on 127.0.0.1, and the PostgreSQL
//! database it was handed; every process is stopped at the end.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::header::HeaderValue;
use hyper::Method;
use serde::Serialize;
use serde_json::json;

use crate::broker::{Broker, Launch};
use crate::faults::fleet::{self, Fleet};
use crate::faults::{connect, schedule, submit};
use crate::http::{bearer, snippet, Conn};
use crate::paper::{unix_now_us, PaperWatcher};
use crate::procs::{agent_args, note_stop, Proc, ProcStats};
use crate::report::{finish_text, machine_line, Percentiles};
use crate::setup::{self, Deployment};
use crate::sim::{put_faults, start_sim, MAX_PRINTERS};
use crate::{random_hex, BenchError};

/// After the last submission, printing must end within this.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(120);
/// Time the agent gets to connect before the first ticket.
const AGENT_WARMUP: Duration = Duration::from_millis(1_000);

/// What `run_rush` should do.
#[derive(Debug, Clone)]
pub struct RushOptions {
    /// The `onceprint` executable: broker, agent and printer simulators.
    pub exe: PathBuf,
    /// `None`: a fresh SQLite file. `postgres://…`: a fresh schema there, dropped after.
    pub database: Option<String>,
    /// The store agent's ESC/POS printers.
    pub printers: usize,
    /// Printers that call the broker, beside the agent's.
    pub fleet: Fleet,
    /// Tickets a second (first submissions; repeats come on top).
    pub rate: f64,
    /// Submissions are spread over this many seconds.
    pub seconds: f64,
    /// The printers' own time per ticket, in ms: each printer gets one value of this
    /// range (both ends the same: every printer alike).
    pub print_ms: (u64, u64),
    /// Share of tickets whose submission is repeated 1–4 times with the same key.
    pub repeat_share: f64,
    /// How tickets are spread over the printers: round robin (each printer one ticket
    /// every `printers / rate` seconds, as a steady rush) or at random (bursts and queues).
    pub spread: schedule::Spread,
    /// Submission connections.
    pub concurrency: usize,
    pub seed: u64,
    /// Start the broker with its rate limits off (a measurement of what it can do, not of
    /// what a shop sees).
    pub rate_limits_off: bool,
    /// How often the CloudPRNT and Epson printers poll, ms.
    pub poll_interval_ms: u64,
}

impl RushOptions {
    pub fn new(exe: impl Into<PathBuf>) -> Self {
        Self {
            exe: exe.into(),
            database: None,
            printers: 60,
            fleet: Fleet::default(),
            rate: 75.0,
            seconds: 20.0,
            print_ms: (500, 500),
            repeat_share: 0.30,
            spread: schedule::Spread::RoundRobin,
            concurrency: 32,
            seed: 1,
            rate_limits_off: false,
            poll_interval_ms: fleet::DEFAULT_POLL_INTERVAL_MS,
        }
    }

    fn tasks(&self) -> usize {
        (self.rate * self.seconds).round() as usize
    }
}

/// The figures of one transport.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TransportFigures {
    pub transport: String,
    pub printers: usize,
    /// Tickets on paper.
    pub tickets: usize,
    /// Submission → paper, ms.
    pub to_paper_ms: Percentiles,
    /// The printers' own time per ticket, ms.
    pub print_ms: Percentiles,
    /// Queued behind the printer's previous ticket, ms.
    pub queued_ms: Percentiles,
    /// The broker and agent's share, ms (see the module's definition).
    pub added_ms: Percentiles,
    /// Printers that poll: waiting for the printer's first poll after the ticket could
    /// have gone, ms (part of "to paper", not of "added").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub poll_wait_ms: Option<Percentiles>,
    /// MQTT devices: of "added", the part until the device began the job (the broker,
    /// Mosquitto and the network; the rest is the simulator's own work), ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to_printer_ms: Option<Percentiles>,
}

/// 429 answers the broker gave, by caller, from its `/metrics`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Refusals {
    /// Metered requests of the store agent (polls, status reports, …) answered.
    pub agent_requests: u64,
    pub agent_429: u64,
    /// Tenant calls (submissions) answered 429.
    pub tenant_429: u64,
    /// Agent polls answered.
    pub agent_polls: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct RushReport {
    pub backend: String,
    pub machine: String,
    pub printers: String,
    pub rate_limits: String,
    /// `round robin` or `random`.
    pub spread: String,
    pub rate: f64,
    pub seconds: f64,
    pub print_ms: (u64, u64),
    /// How often the printers that poll polled, ms.
    pub poll_interval_ms: u64,
    pub tasks: usize,
    /// HTTP submissions sent (repeats and retries included).
    pub requests: usize,
    /// Submission attempts answered 429 (the submitters retried them).
    pub submissions_429: usize,
    /// The broker's answer to each ticket's first submission, ms: the intake part of the
    /// broker's share (a ticket can be handed out once its task is committed).
    pub answer_ms: Percentiles,
    pub transports: Vec<TransportFigures>,
    pub refusals: Refusals,
    pub broker_peak_rss_mib: Option<f64>,
    pub broker_cpu_seconds: Option<f64>,
    pub broker_cpu_ms_per_ticket: Option<f64>,
    pub agent_peak_rss_mib: Option<f64>,
    pub agent_cpu_seconds: Option<f64>,
    /// From the first submission to the last ticket on paper.
    pub wall_seconds: f64,
    pub problems: Vec<String>,
}

impl RushReport {
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }

    pub fn render_text(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        let _ = writeln!(s, "bench rush ({}, {})", self.backend, self.machine);
        let _ = writeln!(
            s,
            "printers: {} (those that poll every {} ms); print time {}–{} ms; {} tickets at {}/s over {} s ({}), {} submissions; broker rate limits: {}",
            self.printers,
            self.poll_interval_ms,
            self.print_ms.0,
            self.print_ms.1,
            self.tasks,
            self.rate,
            self.seconds,
            self.spread,
            self.requests,
            self.rate_limits
        );
        let _ = writeln!(
            s,
            "{:<12} {:>7} | {:>26} | {:>20} | {:>20} | {:>26}",
            "transport",
            "tickets",
            "to paper p50/p95/p99 ms",
            "printer p50/p99 ms",
            "queued p50/p99 ms",
            "added p50/p95/p99 ms"
        );
        for t in &self.transports {
            let _ = writeln!(
                s,
                "{:<12} {:>7} | {:>8.1} {:>8.1} {:>8.1} | {:>9.1} {:>9.1} | {:>9.1} {:>9.1} | {:>8.1} {:>8.1} {:>8.1}",
                t.transport,
                t.tickets,
                t.to_paper_ms.p50,
                t.to_paper_ms.p95,
                t.to_paper_ms.p99,
                t.print_ms.p50,
                t.print_ms.p99,
                t.queued_ms.p50,
                t.queued_ms.p99,
                t.added_ms.p50,
                t.added_ms.p95,
                t.added_ms.p99
            );
        }
        for t in &self.transports {
            if let Some(w) = &t.to_printer_ms {
                let _ = writeln!(
                    s,
                    "{}: of \"added\", until the device began the job p50 {:.1} / p95 {:.1} / p99 {:.1} ms",
                    t.transport, w.p50, w.p95, w.p99
                );
            }
            if let Some(w) = &t.poll_wait_ms {
                let _ = writeln!(
                    s,
                    "{}: waiting for the printer's next poll (its own interval, not in \"added\") p50 {:.1} / p95 {:.1} / p99 {:.1} ms",
                    t.transport, w.p50, w.p95, w.p99
                );
            }
        }
        let _ = writeln!(
            s,
            "submission answered (first send, 201): p50 {:.1} / p95 {:.1} / p99 {:.1} ms",
            self.answer_ms.p50, self.answer_ms.p95, self.answer_ms.p99
        );
        let r = &self.refusals;
        let _ = writeln!(
            s,
            "429s: agent {} of {} metered requests ({} polls), tenant {}; submission attempts answered 429: {}",
            r.agent_429, r.agent_requests, r.agent_polls, r.tenant_429, self.submissions_429
        );
        let mib = |v: Option<f64>| v.map_or("?".to_string(), |v| format!("{v:.0} MiB"));
        let secs = |v: Option<f64>| v.map_or("?".to_string(), |v| format!("{v:.1} s"));
        let _ = writeln!(
            s,
            "broker: peak RSS {}, CPU {} ({} ms per ticket); agent: peak RSS {}, CPU {}; wall {:.1} s",
            mib(self.broker_peak_rss_mib),
            secs(self.broker_cpu_seconds),
            self.broker_cpu_ms_per_ticket.map_or("?".to_string(), |v| format!("{v:.2}")),
            mib(self.agent_peak_rss_mib),
            secs(self.agent_cpu_seconds),
            self.wall_seconds
        );
        finish_text(s, &self.problems)
    }
}

fn validate(opts: &RushOptions) -> Result<(), BenchError> {
    let all = opts.printers + opts.fleet.total();
    if opts.printers == 0 || all > MAX_PRINTERS {
        return Err(BenchError::InvalidOptions(format!("--printers: 1 to {MAX_PRINTERS} agent printers in all")));
    }
    if opts.fleet.mqtt_star > 0 {
        return Err(BenchError::InvalidOptions(
            "Star printers in MQTT mode are named by job tokens on paper; the rush takes the other kinds".into(),
        ));
    }
    if !(opts.rate > 0.0 && opts.seconds > 0.0 && opts.tasks() > 0) {
        return Err(BenchError::InvalidOptions("--rate and --seconds must give at least one ticket".into()));
    }
    if !(10..=60_000).contains(&opts.poll_interval_ms) {
        return Err(BenchError::InvalidOptions("--poll-interval-ms: 10 to 60000".into()));
    }
    if opts.print_ms.0 > opts.print_ms.1 {
        return Err(BenchError::InvalidOptions("--print-ms: LOW-HIGH with LOW ≤ HIGH".into()));
    }
    if !(0.0..=1.0).contains(&opts.repeat_share) {
        return Err(BenchError::InvalidOptions("--retries: a share from 0 to 1".into()));
    }
    Ok(())
}

pub async fn run_rush(opts: RushOptions) -> Result<RushReport, BenchError> {
    validate(&opts)?;
    let tmp = crate::run_dir("onceprint-bench-rush-")?;
    let dir = tmp.path();
    let opts = &opts;
    crate::on_database(opts.database.as_deref(), dir, |backend, url| async move {
        let mut report = run_on(opts, &url, dir).await?;
        report.backend = backend.to_string();
        Ok(report)
    })
    .await
}

/// The processes of a run; whatever is here at the end is stopped.
#[derive(Default)]
struct Running {
    broker: Option<Broker>,
    agent: Option<Proc>,
    sims: Vec<Proc>,
    mosquitto: Option<Proc>,
}

async fn run_on(opts: &RushOptions, database_url: &str, dir: &Path) -> Result<RushReport, BenchError> {
    let mut running = Running::default();
    let result = drive(opts, database_url, dir, &mut running).await;
    let tails = result.is_err().then(|| {
        let tail = |p: Option<&Proc>| p.map_or("(not running)".to_string(), Proc::log_tail);
        format!(
            "\n--- broker log (last lines) ---\n{}\n--- agent log ---\n{}",
            running.broker.as_ref().map_or("(not running)".to_string(), Broker::log_tail),
            tail(running.agent.as_ref()),
        )
    });
    let mut stop_problems = Vec::new();
    if let Some(agent) = running.agent.take() {
        note_stop("agent", agent.stop().await, &mut stop_problems);
    }
    for sim in running.sims.drain(..) {
        note_stop("printer-sim", sim.stop().await, &mut stop_problems);
    }
    if let Some(broker) = running.broker.take() {
        note_stop("broker", broker.stop().await, &mut stop_problems);
    }
    if let Some(m) = running.mosquitto.take() {
        // Its exit status after SIGTERM is not under test.
        let _ = m.stop().await;
    }
    let mut report = result.map_err(|e| e.with_logs(tails))?;
    report.problems.extend(stop_problems);
    Ok(report)
}

/// The transport of printer `i` (the agent's first, then the fleet in [`fleet::start`]'s
/// order).
fn transport_of(i: usize, agent_printers: usize, fleet: Fleet) -> &'static str {
    let Some(mut j) = i.checked_sub(agent_printers) else { return "escpos" };
    for (n, name) in [(fleet.cloudprnt, "cloudprnt"), (fleet.epson, "epson_sdp"), (fleet.mqtt, "mqtt")] {
        if j < n {
            return name;
        }
        j -= n;
    }
    "mqtt_star"
}

/// The bench agent's arguments, with deliveries in hand for two per printer (never fewer
/// than the benches' 256): a shop with hundreds of printers on one agent sets
/// `--max-deliveries` above its printer count, or its printers wait for permits.
fn rush_agent_args(addr: std::net::SocketAddr, token: &str, dir: &Path, printers: usize) -> Vec<String> {
    let mut args = agent_args(addr, token, &dir.join("agent"), None);
    if let Some(i) = args.iter().position(|a| a == "--max-deliveries") {
        if let Some(v) = args.get_mut(i + 1) {
            let permits = v.parse::<usize>().unwrap_or(256).max(2 * printers);
            *v = permits.to_string();
        }
    }
    args
}

/// Printer `i`'s time per ticket: spread over the range by the golden ratio, so that
/// every kind of printer gets short and long times alike.
fn print_ms_of(i: usize, (lo, hi): (u64, u64)) -> u64 {
    let frac = (i as f64 * 0.618_033_988_75).fract();
    lo + ((hi - lo) as f64 * frac).round() as u64
}

async fn drive(
    opts: &RushOptions,
    database_url: &str,
    dir: &Path,
    running: &mut Running,
) -> Result<RushReport, BenchError> {
    let tasks = opts.tasks();
    let all = opts.printers + opts.fleet.total();
    let sim = start_sim(&opts.exe, opts.printers, dir).await?;
    let (control, first_port, paper_log) = (sim.control, sim.first_port, sim.paper_log.clone());
    running.sims.push(sim.proc);
    let mqtt_port = if opts.fleet.mqtt > 0 {
        let (m, port) = fleet::start_mosquitto(dir).await?;
        running.mosquitto = Some(m);
        Some(port)
    } else {
        None
    };
    // Nothing but what the MQTT devices need: every other setting is the default.
    let config = dir.join("broker.toml");
    std::fs::write(&config, fleet::broker_config(mqtt_port))
        .map_err(|e| BenchError::io(format!("writing {}", config.display()), e))?;
    let admin_token = random_hex(24)?;
    let broker = Broker::launch(&Launch {
        exe: opts.exe.clone(),
        database_url: database_url.to_string(),
        admin_token: admin_token.clone(),
        log_path: dir.join("broker.log"),
        listen: ([127, 0, 0, 1], 0).into(),
        config: Some(config),
        extra_args: Vec::new(),
        default_rate_limits: !opts.rate_limits_off,
    })
    .await?;
    let addr = broker.addr;
    running.broker = Some(broker);

    let mut conn = connect(addr, "set-up").await?;
    let printer_addr = |i: usize| std::net::SocketAddr::from(([127, 0, 0, 1], first_port + i as u16));
    let addresses: Vec<String> = (0..opts.printers).map(|p| format!("tcp://{}", printer_addr(p))).collect();
    let Deployment { auth, agent_token } = setup::deploy(&mut conn, &admin_token, &addresses).await?;
    let place = fleet::Place {
        exe: &opts.exe,
        broker: addr,
        mqtt_port,
        paper_log: &paper_log,
        dir,
        poll_interval_ms: opts.poll_interval_ms,
    };
    let callers = fleet::start(&mut conn, &auth, opts.fleet, opts.printers, place).await?;
    let mut targets: Vec<(std::net::SocketAddr, String)> =
        (0..opts.printers).map(|i| (control, printer_addr(i).to_string())).collect();
    running.sims.extend(callers.procs);
    targets.extend(callers.printers);
    drop(conn);
    // Every printer's own speed.
    let mut controls: BTreeMap<std::net::SocketAddr, Conn> = BTreeMap::new();
    for (i, (ctl, name)) in targets.iter().enumerate() {
        let conn = match controls.entry(*ctl) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(v) => v.insert(connect(*ctl, "a simulator's control").await?),
        };
        put_faults(conn, &json!({"printer": name, "slow_ms": print_ms_of(i, opts.print_ms)}))
            .await
            .map_err(|detail| BenchError::Http { context: "setting a printer's speed".into(), detail })?;
    }
    drop(controls);

    let watcher =
        PaperWatcher::start(paper_log, tasks).map_err(|e| BenchError::io("starting the paper-log reader", e))?;
    let agent_log = dir.join("agent.log");
    let mut agent =
        Proc::spawn("agent", &opts.exe, &rush_agent_args(addr, &agent_token, dir, opts.printers), &agent_log)?;
    tokio::time::sleep(AGENT_WARMUP).await;
    if let Some(status) = agent.exited() {
        return Err(BenchError::Protocol {
            context: "starting the agent".into(),
            detail: format!("it exited with {status}:\n{}", crate::procs::log_tail(&agent_log, 40)),
        });
    }
    running.agent = Some(agent);

    let window_ms = (opts.seconds * 1000.0).round() as u64;
    let subs =
        Arc::new(schedule::submissions_spread(tasks, all, opts.repeat_share, window_ms, opts.seed, None, opts.spread));
    let t0 = Instant::now();
    let t0_unix_us = unix_now_us();
    let deadline = t0 + Duration::from_millis(window_ms) + DRAIN_TIMEOUT;
    let run = submit::submit_all(addr, auth.clone(), subs.clone(), opts.concurrency, t0, deadline).await;

    // Wait for every ticket on paper.
    let mut progress = watcher.progress();
    let printed_all = tokio::time::timeout_at(deadline.into(), async {
        loop {
            if progress.borrow().distinct >= tasks {
                return;
            }
            if progress.changed().await.is_err() {
                return;
            }
        }
    })
    .await
    .is_ok();
    let broker_stats = running.broker.as_ref().map(Broker::stats).unwrap_or_default();
    let agent_stats = running.agent.as_ref().map(Proc::stats).unwrap_or_default();
    let admin = bearer(&admin_token).map_err(BenchError::InvalidOptions)?;
    let refusals = refusals(addr, &admin).await?;
    let tally =
        watcher.finish().map_err(|e| BenchError::Protocol { context: "reading the paper log".into(), detail: e })?;

    let mut problems = Vec::new();
    if !printed_all {
        problems.push(format!("{} of {tasks} tickets were not on paper in time", tally.missing().len()));
    }
    let duplicates = tally.duplicates();
    if !duplicates.is_empty() {
        problems.push(format!("{} tickets printed more than once, e.g. E2E {}", duplicates.len(), duplicates[0].0));
    }
    tally.report_strays(&mut problems);
    let unanswered = run.outcomes.iter().filter(|o| !matches!(o.status, 200 | 201)).count();
    if unanswered > 0 {
        problems.push(format!("{unanswered} submissions ended without 200/201"));
    }

    // First send of each ticket, in µs since the epoch.
    let mut sent_us = vec![i64::MAX; tasks];
    let mut answers = Vec::with_capacity(tasks);
    for (req, outcome) in subs.plan.requests.iter().zip(&run.outcomes) {
        if let Some(s) = sent_us.get_mut(req.key as usize) {
            *s = (*s).min(t0_unix_us + outcome.start_us as i64);
        }
        if !req.repeat && outcome.status == 201 {
            answers.push(outcome.end_us.saturating_sub(outcome.start_us));
        }
    }
    // Each printer's tickets in the order they came out.
    let mut by_printer: Vec<Vec<(i64, usize)>> = vec![Vec::new(); all];
    for (m, &at) in tally.first_at_us.iter().enumerate() {
        if tally.counts.get(m).is_some_and(|&c| c > 0) && sent_us[m] != i64::MAX {
            by_printer[subs.printer_of[m]].push((at, m));
        }
    }
    let mut figures: BTreeMap<&'static str, (usize, [Vec<u64>; 6])> = BTreeMap::new();
    for (p, tickets) in by_printer.iter_mut().enumerate() {
        tickets.sort_unstable();
        let own_us = print_ms_of(p, opts.print_ms) as i64 * 1000;
        let entry = figures.entry(transport_of(p, opts.printers, opts.fleet)).or_default();
        entry.0 += 1;
        let mut free_at = i64::MIN;
        for &(at, m) in tickets.iter() {
            let sent = sent_us[m];
            let ready = sent.max(free_at);
            let [to_paper, own, queued, added, poll_wait, to_printer] = &mut entry.1;
            if let Some(&started) = tally.first_started_us.get(&(m as u32)) {
                to_printer.push((started - ready).max(0) as u64);
            }
            // A polling printer's first poll once the ticket could go (see the module's
            // definition).
            let asked = match tally.first_polls_us.get(&(m as u32)) {
                Some(polls) => {
                    let asked = polls.iter().copied().filter(|&t| t >= ready).min().unwrap_or(ready);
                    poll_wait.push((asked - ready) as u64);
                    asked
                }
                None => ready,
            };
            to_paper.push((at - sent).max(0) as u64);
            own.push(own_us as u64);
            queued.push(free_at.saturating_sub(sent).max(0) as u64);
            added.push((at - own_us - asked).max(0) as u64);
            free_at = at;
        }
    }
    let transports = figures
        .into_iter()
        .map(|(transport, (printers, [to_paper, own, queued, added, poll_wait, to_printer]))| TransportFigures {
            transport: transport.to_string(),
            printers,
            tickets: to_paper.len(),
            to_paper_ms: Percentiles::from_micros(to_paper),
            print_ms: Percentiles::from_micros(own),
            queued_ms: Percentiles::from_micros(queued),
            added_ms: Percentiles::from_micros(added),
            poll_wait_ms: (!poll_wait.is_empty()).then(|| Percentiles::from_micros(poll_wait)),
            to_printer_ms: (!to_printer.is_empty()).then(|| Percentiles::from_micros(to_printer)),
        })
        .collect();
    let wall_seconds = tally.last_at_us.map_or(0.0, |last| (last - t0_unix_us) as f64 / 1e6);
    let mib = |s: ProcStats| s.peak_rss_kib.map(|k| k as f64 / 1024.0);
    Ok(RushReport {
        backend: String::new(),
        machine: machine_line(),
        printers: fleet::describe(opts.printers, opts.fleet),
        rate_limits: if opts.rate_limits_off { "off".into() } else { "default".into() },
        spread: match opts.spread {
            schedule::Spread::RoundRobin => "round robin".into(),
            schedule::Spread::Random => "random".into(),
        },
        rate: opts.rate,
        seconds: opts.seconds,
        print_ms: opts.print_ms,
        poll_interval_ms: opts.poll_interval_ms,
        tasks,
        requests: run.total_attempts() as usize,
        submissions_429: run.failed_attempts.iter().filter(|a| a.status == 429).count(),
        answer_ms: Percentiles::from_micros(answers),
        transports,
        refusals,
        broker_peak_rss_mib: mib(broker_stats),
        broker_cpu_seconds: broker_stats.cpu_seconds,
        broker_cpu_ms_per_ticket: broker_stats.cpu_seconds.map(|c| c * 1000.0 / tasks as f64),
        agent_peak_rss_mib: mib(agent_stats),
        agent_cpu_seconds: agent_stats.cpu_seconds,
        wall_seconds,
        problems,
    })
}

/// The broker's 429 answers and agent requests, from its request counts in `/metrics`.
async fn refusals(addr: std::net::SocketAddr, admin: &HeaderValue) -> Result<Refusals, BenchError> {
    let mut conn = connect(addr, "reading /metrics").await?;
    let (status, body) = conn
        .request(Method::GET, "/metrics", admin, None)
        .await
        .map_err(|detail| BenchError::Http { context: "reading /metrics".into(), detail })?;
    if !status.is_success() {
        return Err(BenchError::Protocol {
            context: "reading /metrics".into(),
            detail: format!("HTTP {status}: {}", snippet(&body, 300)),
        });
    }
    Ok(parse_refusals(&String::from_utf8_lossy(&body)))
}

/// Sums the request counts of the broker's request histogram by caller.
fn parse_refusals(text: &str) -> Refusals {
    let mut r = Refusals::default();
    for (k, (n, _)) in crate::report::request_counts(text) {
        let agent = k.route.starts_with("/v1/agent/");
        if agent && k.route != "/v1/agent/acks" {
            r.agent_requests += n;
            if k.status == "429" {
                r.agent_429 += n;
            }
        }
        if k.route == "/v1/agent/poll" {
            r.agent_polls += n;
        }
        if !agent && k.status == "429" {
            r.tenant_429 += n;
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_counts_are_summed_by_caller() {
        let text = "# HELP x\n\
            onceprint_http_request_duration_seconds_count{route=\"/v1/agent/poll\",method=\"POST\",status=\"200\"} 90\n\
            onceprint_http_request_duration_seconds_count{route=\"/v1/agent/poll\",method=\"POST\",status=\"429\"} 7\n\
            onceprint_http_request_duration_seconds_count{route=\"/v1/agent/acks\",method=\"POST\",status=\"200\"} 50\n\
            onceprint_http_request_duration_seconds_count{route=\"/v1/print-tasks\",method=\"POST\",status=\"429\"} 3\n\
            onceprint_http_request_duration_seconds_sum{route=\"/v1/agent/poll\",method=\"POST\",status=\"200\"} 1.5\n";
        let r = parse_refusals(text);
        assert_eq!((r.agent_requests, r.agent_429, r.agent_polls, r.tenant_429), (97, 7, 97, 3));
    }

    #[test]
    fn print_times_cover_the_range_for_every_kind() {
        assert!((0..100).all(|i| print_ms_of(i, (500, 500)) == 500));
        let times: Vec<u64> = (0..100).map(|i| print_ms_of(i, (500, 1500))).collect();
        assert!(times.iter().all(|t| (500..=1500).contains(t)));
        // The first ten (one kind) and the last ten (another) both reach both ends.
        for part in [&times[..10], &times[90..]] {
            assert!(part.iter().any(|&t| t < 800) && part.iter().any(|&t| t > 1200), "{part:?}");
        }
    }

    #[test]
    fn printers_are_named_by_transport() {
        let fleet = Fleet { cloudprnt: 2, epson: 1, mqtt: 1, mqtt_star: 0 };
        let kinds: Vec<_> = (0..7).map(|i| transport_of(i, 3, fleet)).collect();
        assert_eq!(kinds, ["escpos", "escpos", "escpos", "cloudprnt", "cloudprnt", "epson_sdp", "mqtt"]);
    }
}
