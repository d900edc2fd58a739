//! Runs the bench end to end, small, against the workspace's own `onceprint` binary.
//!
//! `CARGO_BIN_EXE_*` only exists inside the binary's own package, so the binary is looked
//! up in the target directory instead; build it first (`cargo build -p onceprint`). The
//! tests skip, with a note, while it is missing or does not have `serve` yet.

use std::path::PathBuf;
use std::time::Duration;

use onceprint_bench::{
    offline::Edges, run_e2e, run_idle, run_offline, run_rush, run_submit, E2eOptions, IdleOptions, OfflineOptions,
    RushOptions, SubmitOptions,
};

fn broker_exe() -> Option<PathBuf> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    let exe = target.join("debug").join("onceprint");
    if !exe.exists() {
        eprintln!("skipping: {} not built (cargo build -p onceprint)", exe.display());
        return None;
    }
    let help = std::process::Command::new(&exe).args(["serve", "--help"]).output().ok()?;
    if !String::from_utf8_lossy(&help.stdout).contains("--listen") {
        eprintln!("skipping: {} has no `serve --listen` yet", exe.display());
        return None;
    }
    Some(exe)
}

/// The binary, when it also has the store agent and the printer simulator (`bench e2e`
/// starts all three).
fn delivery_exe() -> Option<PathBuf> {
    let exe = broker_exe()?;
    let help = std::process::Command::new(&exe).args(["printer-sim", "--help"]).output().ok()?;
    if !String::from_utf8_lossy(&help.stdout).contains("--paper-log") {
        eprintln!("skipping: {} has no `printer-sim --paper-log` yet", exe.display());
        return None;
    }
    Some(exe)
}

fn small(exe: PathBuf) -> SubmitOptions {
    SubmitOptions { requests: 2_000, concurrency: 8, warmup: 200, ..SubmitOptions::new(exe) }
}

fn check(report: &onceprint_bench::SubmitReport) {
    println!("{}", report.render_text());
    assert!(report.problems.is_empty(), "{:#?}", report.problems);
    assert_eq!(report.accepted, report.distinct_keys);
    assert_eq!(report.accepted + report.duplicates, report.requests);
    // The JSON form is what `--json` prints.
    let json = serde_json::to_value(report).unwrap();
    assert_eq!(json["accepted"], report.accepted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_smoke_sqlite() {
    let Some(exe) = broker_exe() else { return };
    let report = run_submit(small(exe)).await.expect("bench run");
    assert_eq!(report.backend, "sqlite");
    check(&report);
}

/// `bench submit --batch 50`: the same verification, every answer taken from a result of
/// `POST /v1/print-task-batches` (repeats inside one batch included).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_smoke_sqlite_batched() {
    let Some(exe) = broker_exe() else { return };
    let opts = SubmitOptions { requests: 600, warmup: 100, batch: 50, ..small(exe) };
    let report = run_submit(opts).await.expect("bench run");
    assert_eq!(report.backend, "sqlite");
    check(&report);
    assert_eq!((report.batch, report.requests_http, report.http_latency_ms.count), (50, 12, 12));
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!((json["batch"].as_u64(), json["requests_http"].as_u64()), (Some(50), Some(12)));
}

/// `postgres://postgres@127.0.0.1:5432/test`); skipped otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_smoke_postgres() {
    let Some(exe) = broker_exe() else { return };
    let Ok(url) = std::env::var("ONCEPRINT_BENCH_POSTGRES_URL") else {
        eprintln!("skipping: ONCEPRINT_BENCH_POSTGRES_URL not set");
        return;
    };
    let report = run_submit(SubmitOptions { database: Some(url), ..small(exe) }).await.expect("bench run");
    assert_eq!(report.backend, "postgres");
    check(&report);
}

fn small_e2e(exe: PathBuf) -> E2eOptions {
    E2eOptions { printers: 4, tasks: 400, concurrency: 8, timeout: Duration::from_secs(120), ..E2eOptions::new(exe) }
}

fn check_e2e(report: &onceprint_bench::E2eReport) {
    println!("{}", report.render_text());
    assert!(report.problems.is_empty(), "{:#?}", report.problems);
    assert!(report.completed);
    let d = &report.delivery;
    assert_eq!((d.duplicated_tasks, d.extra_sheets, d.stray_jobs), (0, 0, 0));
    assert_eq!(d.printed_on_paper + d.missing, report.tasks);
    assert_eq!(d.missing, d.missing_in_doubt, "only in_doubt tasks may be missing from paper");
    assert!(report.printed_per_sec > 0.0);
    // Every printed task was acknowledged, and one broker counted the requests.
    if report.nodes == 1 {
        let traffic = report.agent_traffic.as_ref().expect("the broker's /metrics counted the agent's requests");
        assert!(traffic.ack_requests > 0 && traffic.ack_answer_ms_mean > 0.0, "{traffic:?}");
    }
    let json = serde_json::to_value(report).unwrap();
    assert_eq!(json["tasks"], report.tasks);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_smoke_sqlite() {
    let Some(exe) = delivery_exe() else { return };
    let report = run_e2e(small_e2e(exe)).await.expect("bench run");
    assert_eq!(report.backend, "sqlite");
    check_e2e(&report);
    assert_eq!(report.delivery.printed_on_paper, report.tasks);
    assert!(report.delivery.in_doubt.is_empty());
    // Where the kernel keeps scheduler figures, the broker's writer thread was seen working.
    if std::path::Path::new("/proc/self/schedstat").exists() {
        let threads = report.broker_threads.as_ref().expect("the broker's threads were measured");
        assert!(
            threads.groups.iter().any(|g| g.name == "sqlite-writer" && g.threads == 1 && g.on_cpu_seconds > 0.0),
            "{threads:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_smoke_sqlite_agent_killed() {
    let Some(exe) = delivery_exe() else { return };
    let opts = E2eOptions { tasks: 1_000, kill_agent_at: Some(0.5), ..small_e2e(exe) };
    let report = run_e2e(opts).await.expect("bench run");
    check_e2e(&report);
    let restart = report.agent_restart.as_ref().expect("restart measured");
    assert!(restart.killed_after_printed.is_some_and(|n| n >= 500));
    assert!(restart.resume_ms.is_some_and(|ms| ms <= 5_000.0), "{restart:?}");
}

/// `bench e2e --batch 20`: tasks submitted 20 per `POST /v1/print-task-batches`, each
/// printed exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_smoke_sqlite_batched() {
    let Some(exe) = delivery_exe() else { return };
    let report = run_e2e(E2eOptions { batch: 20, ..small_e2e(exe) }).await.expect("bench run");
    assert_eq!(report.backend, "sqlite");
    check_e2e(&report);
    assert_eq!(report.delivery.printed_on_paper, report.tasks);
    assert_eq!((report.submit_failures, report.batch, report.requests_http), (0, 20, 20));
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["batch"].as_u64(), Some(20));
}

/// Needs `ONCEPRINT_BENCH_POSTGRES_URL`, like `submit_smoke_postgres`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_smoke_postgres() {
    let Some(exe) = delivery_exe() else { return };
    let Ok(url) = std::env::var("ONCEPRINT_BENCH_POSTGRES_URL") else {
        eprintln!("skipping: ONCEPRINT_BENCH_POSTGRES_URL not set");
        return;
    };
    let report = run_e2e(E2eOptions { database: Some(url), ..small_e2e(exe) }).await.expect("bench run");
    assert_eq!(report.backend, "postgres");
    check_e2e(&report);
}

/// `bench idle`, small: a few dozen agents long-poll while intake is measured twice. Every
/// poll must be answered, empty and on time, and both intake runs verified; the figures
/// `--json` prints must be there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_smoke_sqlite() {
    let Some(exe) = broker_exe() else { return };
    let opts = IdleOptions { agents: 40, wait_ms: 2_000, requests: 1_000, concurrency: 8, ..IdleOptions::new(exe) };
    let report = run_idle(opts).await.expect("bench idle run");
    println!("{}", report.render_text());
    assert!(report.problems.is_empty(), "{:#?}", report.problems);
    assert_eq!(report.backend, "sqlite");
    assert!(report.polls_answered >= 40, "{} polls answered for 40 agents", report.polls_answered);
    assert!(report.kib_per_agent.is_some() && report.idle_cpu_share.is_some());
    for run in [&report.intake_without_agents, &report.intake_with_agents] {
        assert!(run.accepted > 0 && run.accepted + run.duplicates == 1_000, "{run:?}");
    }
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["agents"], 40);
}

/// The binary, when its store agent also has the LAN listener (`bench offline`).
fn offline_exe() -> Option<PathBuf> {
    let exe = delivery_exe()?;
    let help = std::process::Command::new(&exe).args(["agent", "--help"]).output().ok()?;
    if !String::from_utf8_lossy(&help.stdout).contains("--offline-after-ms") {
        eprintln!("skipping: {} has no `agent --listen --offline-after-ms` yet", exe.display());
        return None;
    }
    Some(exe)
}

fn small_offline(exe: PathBuf) -> OfflineOptions {
    OfflineOptions {
        tasks: 300,
        printers: 2,
        online: Duration::from_millis(1_500),
        offline: Duration::from_millis(1_500),
        window: Duration::from_secs(6),
        kill_agent_every: Some(Duration::from_millis(2_500)),
        concurrency: 4,
        drain_timeout: Duration::from_secs(90),
        timeout: Duration::from_secs(90),
        // The edges the product passes today; the second agent and the clock skew find the
        // faults described in docs/BENCHMARKS.md ("Offline") and are run by hand.
        edges: Edges {
            slow_forwards: true,
            mixed_station: true,
            station_change: true,
            rejected_merges: true,
            failing_uploads: true,
            ..Edges::default()
        },
        ..OfflineOptions::new(exe)
    }
}

fn check_offline(report: &onceprint_bench::OfflineReport) {
    println!("{}", report.render_text());
    assert!(report.problems.is_empty(), "{:#?}", report.problems);
    assert!(report.drained);
    assert!(!report.cuts.is_empty(), "the line went down at least once");
    assert!(!report.agent_kills.is_empty(), "the agent was killed at least once");
    assert!(report.lan.accepted_offline > 0, "some LAN orders were accepted offline");
    assert_eq!((report.paper.printed_twice_or_more, report.paper.lost), (0, 0));
    // Every order on paper once, or accounted for without paper.
    let kept_unprinted = report.rejected_kept.iter().filter(|f| f.on_paper == 0).count();
    let accounted = report.paper.not_printed_accounted + kept_unprinted + report.paper.refused_over_limit;
    assert_eq!(report.paper.printed_once + accounted, report.tasks);
    assert_eq!(report.reconciliation.ledger_charges, report.reconciliation.expected_charges);
    let e = &report.edges;
    assert!(e.slow_forwards.as_ref().is_some_and(|s| !s.periods.is_empty()), "the line was slow at times");
    assert!(e.station_change.as_ref().is_some_and(|s| s.moves.iter().all(|m| m.status == 200) && !s.moves.is_empty()));
    assert!(e.rejected_merges.as_ref().is_some_and(|r| r.restart.is_some()), "the broker was restarted");
    assert!(e.failing_uploads.as_ref().is_some_and(|u| !u.periods.is_empty()));
    assert!(e.mixed_station.as_ref().is_some_and(|s| s.orders_cloud + s.orders_lan > 0));
    let json = serde_json::to_value(report).unwrap();
    assert_eq!(json["tasks"], report.tasks);
}

/// `bench offline`, small: a few seconds of a shop line going down and up with the agent
/// killed meanwhile; nothing printed twice, nothing lost, every answer one task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_smoke_sqlite() {
    let Some(exe) = offline_exe() else { return };
    let report = run_offline(small_offline(exe)).await.expect("bench offline run");
    assert_eq!(report.backend, "sqlite");
    check_offline(&report);
}

/// Needs `ONCEPRINT_BENCH_POSTGRES_URL`, like `submit_smoke_postgres`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_smoke_postgres() {
    let Some(exe) = offline_exe() else { return };
    let Ok(url) = std::env::var("ONCEPRINT_BENCH_POSTGRES_URL") else {
        eprintln!("skipping: ONCEPRINT_BENCH_POSTGRES_URL not set");
        return;
    };
    let report = run_offline(OfflineOptions { database: Some(url), ..small_offline(exe) }).await.expect("bench run");
    assert_eq!(report.backend, "postgres");
    check_offline(&report);
}

/// A small rush through a broker with its default rate limits: every ticket on paper
/// once, each measured, the printers' set speed reported as their own time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rush_smoke_sqlite() {
    let Some(exe) = delivery_exe() else { return };
    let opts = RushOptions { printers: 6, rate: 20.0, seconds: 2.0, print_ms: (50, 150), ..RushOptions::new(exe) };
    let report = run_rush(opts).await.expect("bench run");
    println!("{}", report.render_text());
    assert!(report.problems.is_empty(), "{:#?}", report.problems);
    assert_eq!(report.rate_limits, "default");
    assert_eq!(report.transports.len(), 1, "{:?}", report.transports);
    let escpos = &report.transports[0];
    assert_eq!((escpos.transport.as_str(), escpos.printers, escpos.tickets), ("escpos", 6, report.tasks));
    assert!(escpos.print_ms.p50 >= 50.0 && escpos.print_ms.max <= 150.0, "{escpos:?}");
    assert!(report.requests > report.tasks, "the repeats were sent");
    assert!(report.refusals.agent_polls > 0, "{:?}", report.refusals);
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["tasks"], report.tasks);
}
