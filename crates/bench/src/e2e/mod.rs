//! The delivery benchmark behind `onceprint bench e2e`: submit → broker → agent → printer →
//! paper, with every process real.
//!
//! It starts, from the same executable, a broker (`serve`, on a fresh SQLite file or
//! PostgreSQL schema), `printer-sim` with P printers on consecutive loopback ports and a
//! paper log, and one store agent (`agent`) with a state directory of its own. It sets up
//! a tenant, store `s1`, printers `p0…` pointing at the simulator and an agent token over
//! HTTP, submits N text tasks round-robin over the printers from C connections (one task
//! per request, or `batch` consecutive tasks per `POST /v1/print-task-batches`), and waits
//! until every task's marker line (`E2E <n>`) is on paper. Optionally it `kill -9`s the
//! agent once a share of the tasks has printed, restarts it at once with the same state
//! directory, and measures how long printing takes to resume. The verdict comes from the
//! paper log first (each task exactly once) and the broker's task list second (each task
//! `printed`; after the kill, at most one `in_doubt` per printer).
//!
//! Like `bench submit`, it talks to nothing but the processes it started, on 127.0.0.1,
//! and the PostgreSQL database it was handed; it leaves nothing running: every process is
//! stopped with SIGTERM at the end (and killed if the bench itself fails).

mod check;
mod report;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::body::Bytes;
use hyper::header::HeaderValue;

pub use check::{check_delivery, marker_of, DeliveryCheck, InDoubtTask, ListedTask};
pub use report::{AgentRestart, AgentTraffic, BrokerThreads, E2eReport, MachineCpu, PerProcess};

use crate::broker::Broker;
use crate::http::Conn;
use crate::paper::{unix_now_us, PaperWatcher, Tally};
use crate::procs::{agent_args, note_stop, MachineTimes, Proc, ProcStats, ThreadTimes};
use crate::report::{machine_line, Percentiles};
use crate::setup::{self, Deployment};
use crate::sim::MAX_PRINTERS;
use crate::{load, random_hex, verify, BenchError, STORE_ID};

/// Printing must resume within this long after the agent's restart.
pub const RESUME_LIMIT: Duration = Duration::from_secs(5);
/// How long the restarted agent gets to print anything before the bench gives up on it.
const RESUME_WAIT: Duration = Duration::from_secs(60);
/// After paper stops growing for this long, the bench asks the broker whether the tasks
/// still missing are ones that will never print (`in_doubt`, `failed`).
const STALL_CHECK: Duration = Duration::from_secs(1);
/// How long the broker gets, once everything is on paper, to take the last acks.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);

/// What `run_e2e` should do.
#[derive(Debug, Clone)]
pub struct E2eOptions {
    /// The `onceprint` executable: broker, agent and printer simulator.
    pub exe: PathBuf,
    /// `None`: a fresh SQLite file. `postgres://…`: a fresh schema there, dropped after.
    pub database: Option<String>,
    pub printers: usize,
    pub tasks: usize,
    /// Submission connections, each with one request in flight.
    pub concurrency: usize,
    /// Submissions per HTTP request: 1 sends each task alone to `POST /v1/print-tasks`;
    /// 2–500 send that many consecutive tasks together to `POST /v1/print-task-batches`.
    pub batch: usize,
    /// Kill the agent (`kill -9`) once this share of the tasks is on paper, and restart it.
    pub kill_agent_at: Option<f64>,
    /// The whole run (submitting and printing) must end within this.
    pub timeout: Duration,
    /// Broker nodes on one PostgreSQL database behind the bench's load balancer, which
    /// the submitters and the agent talk to (1: one broker, no balancer).
    pub nodes: usize,
    /// Finished and waiting tasks written into the database before the agent starts
    /// (module [`crate::preload`]); none by default.
    pub preload: crate::PreloadOptions,
}

impl E2eOptions {
    /// The defaults for a given executable.
    pub fn new(exe: impl Into<PathBuf>) -> Self {
        Self {
            exe: exe.into(),
            database: None,
            printers: 100,
            tasks: 50_000,
            concurrency: 32,
            batch: 1,
            kill_agent_at: None,
            timeout: Duration::from_secs(600),
            nodes: 1,
            preload: crate::PreloadOptions::default(),
        }
    }
}

fn validate(opts: &E2eOptions) -> Result<(), BenchError> {
    let bad = |m: &str| Err(BenchError::InvalidOptions(m.to_string()));
    if opts.tasks == 0 {
        return bad("tasks must be at least 1");
    }
    if u32::try_from(opts.tasks).is_err() {
        return bad("too many tasks");
    }
    if opts.concurrency == 0 {
        return bad("concurrency must be at least 1");
    }
    load::validate_batch(opts.batch)?;
    if opts.printers == 0 || opts.printers > MAX_PRINTERS {
        return bad("printers must be 1–5000");
    }
    if let Some(f) = opts.kill_agent_at {
        if !(f > 0.0 && f < 1.0) {
            return bad("kill-agent-at must be a fraction between 0 and 1 (exclusive)");
        }
    }
    if opts.timeout.is_zero() {
        return bad("the timeout must be positive");
    }
    crate::cluster::validate_nodes(opts.nodes, opts.database.as_deref())?;
    opts.preload.validate()?;
    crate::validate_database(opts.database.as_deref())
}

/// The submission of task `n`: `biz_no` `E<n>`, printer `p<n mod printers>`, and a text
/// whose first line is the marker `E2E <n>`. Only our own digits go in, so nothing needs
/// JSON escaping.
pub fn task_body(n: u32, printers: usize) -> Bytes {
    task_body_for(n, n as usize % printers, "receipt")
}

/// The submission of task `n` to printer `p<printer>` with `print_type`: `biz_no`
/// `E<n>` and the marker line `E2E <n>` (the paper log's link back to the task). The
/// print type is one of the bench's own names, so nothing needs JSON escaping.
pub fn task_body_for(n: u32, printer: usize, print_type: &str) -> Bytes {
    Bytes::from(format!(
        r#"{{"biz_no":"E{n}","printer_id":"p{printer}","print_type":"{print_type}","content":{{"type":"text","text":"E2E {n}\n1 x Noodles  12.00\n"}}}}"#
    ))
}

/// Runs the whole benchmark: start everything, set up, submit, wait for paper, verify,
/// stop everything.
///
/// Returns `Err` only when the run could not be carried out; what went wrong in a run
/// that could is listed in [`E2eReport::problems`].
pub async fn run_e2e(opts: E2eOptions) -> Result<E2eReport, BenchError> {
    validate(&opts)?;
    let tmp = crate::run_dir("onceprint-bench-e2e-")?;
    let dir = tmp.path();
    let opts = &opts;
    crate::on_database(opts.database.as_deref(), dir, |backend, url| async move {
        let mut report = run_on(opts, &url, dir).await?;
        report.backend = backend.to_string();
        Ok(report)
    })
    .await
}

/// The processes of a run other than the broker.
struct Procs {
    sim: Option<Proc>,
    agent: Option<Proc>,
    /// The agent's earlier life, when it was killed.
    killed_agent: ProcStats,
    /// The machine's CPU times when the first submission went out.
    machine_at_start: Option<MachineTimes>,
    /// The one broker's process id (none behind the load balancer), and its threads'
    /// times when the first submission went out.
    broker_pid: Option<u32>,
    broker_threads_at_start: Option<(ThreadTimes, Instant)>,
}

/// Starts the simulator and the broker on `database_url`, drives the run, and always
/// stops everything.
async fn run_on(opts: &E2eOptions, database_url: &str, dir: &Path) -> Result<E2eReport, BenchError> {
    let sim = crate::sim::start_sim(&opts.exe, opts.printers, dir).await?;
    let admin_token = random_hex(24)?;
    // On an error the simulator is killed when `sim` is dropped.
    let nodes = crate::cluster::start_nodes(opts.nodes, &opts.exe, database_url, &admin_token, dir, None, &[]).await?;
    let (brokers, launches): (Vec<Broker>, Vec<_>) = nodes.into_iter().unzip();
    let lb = if launches.len() > 1 { Some(crate::cluster::balance(&launches).await?) } else { None };
    let addr = lb.as_ref().map_or(brokers[0].addr, |lb| lb.addr);
    let (first_port, paper_log) = (sim.first_port, sim.paper_log.clone());
    let mut procs = Procs {
        sim: Some(sim.proc),
        agent: None,
        killed_agent: ProcStats::default(),
        machine_at_start: None,
        broker_pid: (brokers.len() == 1).then(|| brokers[0].pid()),
        broker_threads_at_start: None,
    };

    let result = drive(opts, addr, first_port, &paper_log, &mut procs, dir, &admin_token, database_url).await;

    // Read what /proc knows before stopping: it is gone once a process is reaped. With
    // several nodes the broker's CPU time is theirs summed, its peak the highest node's.
    let broker_stats = brokers.iter().map(Broker::stats).fold(ProcStats::default(), ProcStats::merge);
    let agent_stats = procs.agent.as_ref().map(Proc::stats).unwrap_or_default().merge(procs.killed_agent);
    let sim_stats = procs.sim.as_ref().map(Proc::stats).unwrap_or_default();
    let bench_stats = ProcStats::own();
    let machine_at_end = MachineTimes::now();
    let broker_threads = match (procs.broker_pid, &procs.broker_threads_at_start) {
        (Some(pid), Some((start, at))) => ThreadTimes::of(pid)
            .map(|end| BrokerThreads { window_seconds: at.elapsed().as_secs_f64(), groups: end.since(start) }),
        _ => None,
    };
    let tails = result.is_err().then(|| {
        let tail = |p: &Option<Proc>| p.as_ref().map_or("(not running)".to_string(), Proc::log_tail);
        format!(
            "\n--- broker log (last lines) ---\n{}\n--- agent log ---\n{}\n--- printer-sim log ---\n{}",
            brokers[0].log_tail(),
            tail(&procs.agent),
            tail(&procs.sim)
        )
    });

    // The agent first (it hands back what it holds and flushes its acks), then the
    // printers, then the broker.
    let mut stop_problems = Vec::new();
    if let Some(agent) = procs.agent.take() {
        note_stop("agent", agent.stop().await, &mut stop_problems);
    }
    if let Some(sim) = procs.sim.take() {
        note_stop("printer-sim", sim.stop().await, &mut stop_problems);
    }
    drop(lb);
    for broker in brokers {
        note_stop("broker", broker.stop().await, &mut stop_problems);
    }

    let mut report = result.map_err(|e| e.with_logs(tails))?;
    let mib = |s: ProcStats| s.peak_rss_kib.map(|k| k as f64 / 1024.0);
    report.peak_rss_mib = PerProcess {
        broker: mib(broker_stats),
        agent: mib(agent_stats),
        printer_sim: mib(sim_stats),
        bench: mib(bench_stats),
    };
    report.cpu_seconds = PerProcess {
        broker: broker_stats.cpu_seconds,
        agent: agent_stats.cpu_seconds,
        printer_sim: sim_stats.cpu_seconds,
        bench: bench_stats.cpu_seconds,
    };
    if let (Some(start), Some(end)) = (procs.machine_at_start, machine_at_end) {
        let busy = end.busy - start.busy;
        let ours: f64 = [broker_stats, agent_stats, sim_stats, bench_stats].iter().filter_map(|s| s.cpu_seconds).sum();
        report.machine_cpu = Some(MachineCpu {
            busy_seconds: busy,
            idle_seconds: end.idle - start.idle,
            other_busy_seconds: (busy - ours).max(0.0),
        });
    }
    report.problems.extend(stop_problems);
    report.broker_threads = broker_threads;
    report.nodes = launches.len();
    let all_cpu: f64 = [broker_stats, agent_stats, sim_stats, bench_stats].iter().filter_map(|s| s.cpu_seconds).sum();
    report.cpu_ms_per_task = (opts.tasks > 0).then(|| all_cpu * 1000.0 / opts.tasks as f64);
    report.broker_cpu_ms_per_task =
        broker_stats.cpu_seconds.filter(|_| opts.tasks > 0).map(|c| c * 1000.0 / opts.tasks as f64);
    Ok(report)
}

/// Set-up, the agent, submissions, the wait for paper, and the verdict.
#[allow(clippy::too_many_arguments)]
async fn drive(
    opts: &E2eOptions,
    addr: SocketAddr,
    first_port: u16,
    paper_log: &Path,
    procs: &mut Procs,
    dir: &Path,
    admin_token: &str,
    database_url: &str,
) -> Result<E2eReport, BenchError> {
    let mut conn = Conn::connect(addr)
        .await
        .map_err(|detail| BenchError::Http { context: "connecting for set-up".into(), detail })?;
    let addresses: Vec<String> =
        (0..opts.printers).map(|p| format!("tcp://127.0.0.1:{}", usize::from(first_port) + p)).collect();
    let Deployment { auth, agent_token } = setup::deploy(&mut conn, admin_token, &addresses).await?;
    let token = agent_token.as_str();
    let mut problems = Vec::new();
    let preloaded = if opts.preload.is_empty() {
        None
    } else {
        let (report, layout) =
            crate::preload::preload(&mut conn, &auth, database_url, opts.printers, opts.preload).await?;
        if !report.broker_counts_agree {
            problems.push(format!("after the preload the broker's task counts differ: {}", report.render_line()));
        }
        Some((report, layout))
    };
    // The preloaded history is older than every task of the run: listings stop there.
    let floor = preloaded.as_ref().map(|(_, layout)| crate::preload::floor_id(layout));
    let floor = floor.as_deref();

    let watcher = PaperWatcher::start(paper_log.to_path_buf(), opts.tasks)
        .map_err(|e| BenchError::io("starting the paper-log reader", e))?;
    let args = agent_args(addr, token, &dir.join("agent"), None);
    let agent_log = dir.join("agent.log");
    procs.agent = Some(Proc::spawn("agent", &opts.exe, &args, &agent_log)?);
    // An agent that refuses its flags or state directory exits at once: say so clearly
    // rather than wait for paper that never comes.
    tokio::time::sleep(Duration::from_millis(300)).await;
    if let Some(agent) = procs.agent.as_mut() {
        if let Some(status) = agent.exited() {
            return Err(BenchError::Protocol {
                context: "starting the agent".into(),
                detail: format!("it exited with {status}:\n{}", agent.log_tail()),
            });
        }
    }

    let n = opts.tasks;
    let bodies: Arc<Vec<Bytes>> = Arc::new((0..n as u32).map(|i| task_body(i, opts.printers)).collect());
    let deadline = Instant::now() + opts.timeout;
    procs.machine_at_start = MachineTimes::now();
    procs.broker_threads_at_start = procs.broker_pid.and_then(ThreadTimes::of).map(|t| (t, Instant::now()));
    let submit = async {
        let load = load::run_load_batched(addr, auth.clone(), bodies, opts.concurrency, opts.batch);
        tokio::time::timeout_at(deadline.into(), load).await.map_err(|_| BenchError::Protocol {
            context: "submitting".into(),
            detail: format!("not all submissions were answered within {:?}", opts.timeout),
        })?
    };
    let restart = async {
        match opts.kill_agent_at {
            None => Ok(None),
            Some(share) => {
                let threshold = ((share * n as f64).round() as usize).clamp(1, n);
                let ctx = RestartCtx { exe: &opts.exe, args: &args, log: &agent_log, addr, auth: &auth };
                kill_and_restart(&ctx, &watcher, procs, threshold, n, deadline).await.map(Some)
            }
        }
    };
    let (run, restart) = tokio::try_join!(submit, restart)?;

    let completed = wait_for_paper(&watcher, &mut conn, &auth, n, deadline, floor).await?;
    let settled = settle(&mut conn, &auth).await?;
    let tally =
        watcher.finish().map_err(|detail| BenchError::Protocol { context: "reading the paper log".into(), detail })?;
    let listed = verify::list_states_above(&mut conn, &auth, &format!("store_id={STORE_ID}"), n, floor).await?;
    // Behind the load balancer one node's counts would be part of the run's: left out.
    let agent_traffic = if opts.nodes == 1 { agent_traffic(&mut conn, &auth, n).await } else { None };

    if !completed {
        problems.push(format!("timed out after {:?} with {} of {n} tasks on paper", opts.timeout, tally.distinct));
    }
    if !settled {
        problems.push(format!("the broker still had tasks in flight {SETTLE_TIMEOUT:?} after printing ended"));
    }
    let failed: Vec<String> = run
        .outcomes
        .iter()
        .enumerate()
        .filter(|(_, o)| o.status != 201)
        .map(|(i, o)| format!("E{i}: {} {}", o.status, o.detail.as_deref().unwrap_or("")))
        .collect();
    if !failed.is_empty() {
        problems.push(format!(
            "{} submissions were not answered 201, e.g. {}",
            failed.len(),
            failed.iter().take(5).cloned().collect::<Vec<_>>().join("; ")
        ));
    }
    if let Some(r) = &restart {
        match (r.killed_after_printed, r.resume_ms) {
            (None, _) => problems.push("the agent was never killed: printing did not get that far".into()),
            (Some(_), None) => {
                problems.push(format!("printing did not resume within {RESUME_WAIT:?} of the agent's restart"))
            }
            (Some(_), Some(ms)) if ms > RESUME_LIMIT.as_secs_f64() * 1000.0 => problems.push(format!(
                "printing resumed {ms:.0} ms after the agent's restart (limit {} ms)",
                RESUME_LIMIT.as_millis()
            )),
            _ => {}
        }
    }
    if tally.bad_times > 0 {
        problems.push(format!("{} paper-log lines had an unreadable `at` time", tally.bad_times));
    }
    let delivery = check_delivery(&tally, &listed, restart.is_some(), &mut problems);

    let (latency, before_answer) = print_latencies(&tally, &run);
    let print_seconds = tally.last_at_us.map_or(0.0, |last| (last - run.started_unix_us).max(0) as f64 / 1e6);
    let submit_seconds = run.wall.as_secs_f64();
    let per_sec = |count: usize, secs: f64| if secs > 0.0 { count as f64 / secs } else { 0.0 };
    Ok(E2eReport {
        backend: String::new(),
        machine: machine_line(),
        printers: opts.printers,
        tasks: n,
        concurrency: opts.concurrency,
        batch: run.batch,
        requests_http: run.requests_http,
        kill_agent_at: opts.kill_agent_at,
        submit_seconds,
        submitted_per_sec: per_sec(n - failed.len(), submit_seconds),
        submit_failures: failed.len(),
        submit_latency_ms: Percentiles::from_micros(
            run.outcomes.iter().filter(|o| o.status == 201).map(load::Outcome::latency_us).collect(),
        ),
        requests_http_per_sec: per_sec(run.request_latencies_us.len(), submit_seconds),
        http_latency_ms: Percentiles::from_micros(run.request_latencies_us),
        print_seconds,
        printed_per_sec: per_sec(tally.distinct, print_seconds),
        printed_latency_ms: latency,
        printed_before_answer: before_answer,
        completed,
        agent_restart: restart,
        delivery,
        peak_rss_mib: PerProcess::default(),
        cpu_seconds: PerProcess::default(),
        nodes: 1,
        cpu_ms_per_task: None,
        broker_cpu_ms_per_task: None,
        machine_cpu: None,
        agent_traffic,
        broker_threads: None,
        preload: preloaded.map(|(r, _)| r),
        problems,
    })
}

/// The agent's requests as the broker counted them (`/metrics`). A diagnostic figure, not
/// part of the verdict: when the broker's metrics cannot be read the line is left out of
/// the report (every other request of the run went to the same broker, so a failure here
/// has shown itself there already).
async fn agent_traffic(conn: &mut Conn, auth: &HeaderValue, tasks: usize) -> Option<AgentTraffic> {
    let (status, body) = conn.request(hyper::Method::GET, "/metrics", auth, None).await.ok()?;
    (status.as_u16() == 200).then(|| AgentTraffic::from_metrics(&String::from_utf8_lossy(&body), tasks)).flatten()
}

/// Submit answer → first sheet, per task that was both answered 201 and printed.
fn print_latencies(tally: &Tally, run: &load::LoadResult) -> (Percentiles, usize) {
    let mut before = 0;
    let mut us = Vec::with_capacity(run.outcomes.len());
    for (i, o) in run.outcomes.iter().enumerate() {
        let at = tally.first_at_us.get(i).copied().unwrap_or(i64::MIN);
        if o.status != 201 || at == i64::MIN {
            continue;
        }
        let answered = run.started_unix_us + o.end_us as i64;
        if at < answered {
            before += 1;
        }
        us.push((at - answered).max(0) as u64);
    }
    (Percentiles::from_micros(us), before)
}

/// What the kill-and-restart needs to start the agent again.
struct RestartCtx<'a> {
    exe: &'a Path,
    args: &'a [String],
    log: &'a Path,
    addr: SocketAddr,
    auth: &'a HeaderValue,
}

/// Waits until `threshold` tasks are on paper, kills the agent with SIGKILL, restarts it
/// at once with the same state directory, and measures until the restarted agent's first
/// job is on paper.
///
/// Jobs the killed agent had already sent may still come out of a printer after the kill
/// (the printer has the bytes). They must not count as the restarted agent printing, so
/// the tasks the broker had out at the kill (`sent`, at most one per printer) are listed
/// between the kill and the restart, and only a job of another task, time-stamped after
/// the restart, ends the measurement.
async fn kill_and_restart(
    ctx: &RestartCtx<'_>,
    watcher: &PaperWatcher,
    procs: &mut Procs,
    threshold: usize,
    tasks: usize,
    deadline: Instant,
) -> Result<AgentRestart, BenchError> {
    let mut progress = watcher.progress();
    let reached = tokio::time::timeout_at(deadline.into(), progress.wait_for(|p| p.distinct >= threshold))
        .await
        .ok()
        .and_then(|r| r.ok().map(|p| p.distinct));
    let Some(printed) = reached else { return Ok(AgentRestart::default()) };
    let lines_at_kill = watcher.with_seen(<[_]>::len);
    if let Some(agent) = procs.agent.take() {
        procs.killed_agent = agent.stats();
        agent.kill9().await?;
    }
    let mut conn = Conn::connect(ctx.addr)
        .await
        .map_err(|detail| BenchError::Http { context: "connecting to list in-flight tasks".into(), detail })?;
    let sent = verify::list_states(&mut conn, ctx.auth, &format!("store_id={STORE_ID}&state=sent"), 512).await?;
    let in_flight: HashSet<u32> = sent.iter().filter_map(|t| marker_of(&t.biz_no)).collect();

    let restarted_us = unix_now_us();
    procs.agent = Some(Proc::spawn("agent", ctx.exe, ctx.args, ctx.log)?);
    let give_up = deadline.min(Instant::now() + RESUME_WAIT);
    let resumed = loop {
        let first = watcher.with_seen(|seen| {
            seen.get(lines_at_kill..).unwrap_or_default().iter().find_map(|s| {
                let new_task = s.markers.iter().any(|m| !in_flight.contains(m));
                (s.at_us >= restarted_us && new_task).then_some(s.at_us)
            })
        });
        if let Some(at) = first {
            break Some((at - restarted_us) as f64 / 1000.0);
        }
        if Instant::now() >= give_up || progress.borrow().distinct >= tasks {
            break None;
        }
        let _ = tokio::time::timeout(Duration::from_millis(50), progress.changed()).await;
    };
    Ok(AgentRestart { killed_after_printed: Some(printed), in_flight_at_kill: in_flight.len(), resume_ms: resumed })
}

/// Waits until every task is on paper — or is one the broker says will never print
/// (`in_doubt`, `failed`) — or the deadline. `true` when it did not time out.
async fn wait_for_paper(
    watcher: &PaperWatcher,
    conn: &mut Conn,
    auth: &HeaderValue,
    tasks: usize,
    deadline: Instant,
    floor: Option<&str>,
) -> Result<bool, BenchError> {
    let mut progress = watcher.progress();
    let mut last = *progress.borrow_and_update();
    let mut last_change = Instant::now();
    let mut last_check = Instant::now();
    loop {
        let now = *progress.borrow_and_update();
        if now != last {
            (last, last_change) = (now, Instant::now());
        }
        if now.distinct >= tasks {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        if last_change.elapsed() >= STALL_CHECK && last_check.elapsed() >= STALL_CHECK {
            last_check = Instant::now();
            let mut never: HashSet<u32> = HashSet::new();
            for state in ["in_doubt", "failed"] {
                let query = format!("store_id={STORE_ID}&state={state}");
                for t in verify::list_states_above(conn, auth, &query, 128, floor).await? {
                    never.extend(marker_of(&t.biz_no).filter(|&m| !watcher.printed(m)));
                }
            }
            if now.distinct + never.len() >= tasks {
                return Ok(true);
            }
        }
        let _ = tokio::time::timeout(Duration::from_millis(250), progress.changed()).await;
    }
}

/// Waits until the broker has no task `pending`, `sent` or `retrying` (it has taken the
/// last acks). `false` after [`SETTLE_TIMEOUT`].
async fn settle(conn: &mut Conn, auth: &HeaderValue) -> Result<bool, BenchError> {
    let give_up = Instant::now() + SETTLE_TIMEOUT;
    loop {
        if !verify::any_active(conn, auth).await? {
            return Ok(true);
        }
        if Instant::now() >= give_up {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paper::{markers_in, PaperLine};
    use serde_json::Value;

    #[test]
    fn defaults_match_the_documented_ones() {
        let o = E2eOptions::new("onceprint");
        assert_eq!((o.printers, o.tasks, o.concurrency, o.batch), (100, 50_000, 32, 1));
        assert_eq!((o.kill_agent_at, o.timeout), (None, Duration::from_secs(600)));
        assert!(validate(&o).is_ok());
    }

    #[test]
    fn bad_options_are_refused() {
        let check = |f: &dyn Fn(&mut E2eOptions)| {
            let mut o = E2eOptions::new("onceprint");
            f(&mut o);
            validate(&o).is_err()
        };
        assert!(check(&|o| o.tasks = 0));
        assert!(check(&|o| o.printers = 0));
        assert!(check(&|o| o.printers = 5_001));
        assert!(check(&|o| o.concurrency = 0));
        assert!(check(&|o| o.batch = 0));
        assert!(check(&|o| o.batch = 501));
        assert!(!check(&|o| o.batch = 500));
        assert!(check(&|o| o.kill_agent_at = Some(0.0)));
        assert!(check(&|o| o.kill_agent_at = Some(1.0)));
        assert!(check(&|o| o.timeout = Duration::ZERO));
        assert!(check(&|o| o.database = Some("sqlite://x".into())));
        assert!(!check(&|o| o.kill_agent_at = Some(0.5)));
    }

    #[test]
    fn bodies_carry_the_marker_and_go_round_robin() {
        let v: Value = serde_json::from_slice(&task_body(102, 100)).unwrap();
        assert_eq!(v["biz_no"], "E102");
        assert_eq!(v["printer_id"], "p2");
        let text = v["content"]["text"].as_str().unwrap();
        assert_eq!(markers_in(text), vec![102]);
        assert_eq!(marker_of(v["biz_no"].as_str().unwrap()), Some(102));
    }

    #[test]
    fn latencies_run_from_the_answer_to_the_first_sheet() {
        let mut t = Tally::new(3);
        let line = |m: u32, at: i64| PaperLine::marked("x", at, vec![m]);
        t.add(&line(0, 1_000_000 + 5_000)); // 4 ms after its answer at +1 ms
        t.add(&line(1, 1_000_000 + 1_000)); // before its answer at +2 ms: counts as 0
        let o = |status, end_us| load::Outcome { status, start_us: 0, end_us, ..load::Outcome::default() };
        let run = load::LoadResult {
            outcomes: vec![o(201, 1_000), o(201, 2_000), o(201, 3_000)],
            wall: Duration::from_millis(3),
            started_unix_us: 1_000_000,
            batch: 1,
            requests_http: 3,
            request_latencies_us: vec![1_000, 2_000, 3_000],
        };
        let (p, before) = print_latencies(&t, &run);
        assert_eq!((p.count, before), (2, 1));
        assert_eq!((p.p50, p.max), (0.0, 4.0));
    }
}
