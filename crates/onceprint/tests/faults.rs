//! The fault run of `onceprint bench faults`, small and seeded, with the real binary: a
//! broker, a store agent and four simulated printers as processes; 1,500 tasks over 15 s
//! with client retry storms, printer faults, two `kill -9` of the agent and two of the
//! broker; then every lane must drain, nothing may be on paper twice and nothing may be
//! lost. On SQLite always, on PostgreSQL when `ONCEPRINT_TEST_POSTGRES` names a server
//! (skipped with `SKIPPED` on stderr otherwise).
//!
//! The bench itself checks everything and lists what it found in `problems`; this test
//! only insists that the list is empty and that the run really did what it was asked to,
//! so that a run whose faults never happened cannot pass.

use std::time::Duration;

use onceprint_bench::{run_faults, FaultsOptions, FaultsReport};

const BIN: &str = env!("CARGO_BIN_EXE_onceprint");

fn small(database: Option<String>) -> FaultsOptions {
    FaultsOptions {
        database,
        tasks: 1_500,
        printers: 4,
        concurrency: 8,
        seed: 7,
        fault_window: Duration::from_secs(15),
        fault_every: Duration::from_secs(3),
        agent_kills: 2,
        broker_kills: 2,
        drain_timeout: Duration::from_secs(60),
        timeout: Duration::from_secs(180),
        // Every task's audit trail.
        audit_sample: 1_500,
        ..FaultsOptions::new(BIN)
    }
}

fn check(report: &FaultsReport) {
    println!("{}", report.render_text());
    assert!(report.problems.is_empty(), "the fault run found problems:\n{}", report.render_text());
    // The run did what it was asked to: kills, faults, repeats, retries after kills.
    assert_eq!((report.agent_kills.len(), report.broker_kills.len()), (2, 2));
    assert!(report.faults_injected.values().sum::<usize>() >= 5, "{:?}", report.faults_injected);
    let s = &report.submissions;
    assert!(s.repeats > 0 && s.racing_repeats > 0);
    assert!(s.retried_no_answer > 0, "the broker kills interrupted no submission");
    assert_eq!(s.accepted_tasks, report.tasks);
    let v = &report.verdict;
    assert!(report.drained);
    assert_eq!((v.duplicates.count, v.lost.count, v.stray_jobs), (0, 0, 0));
    assert_eq!(report.audit.checked, report.tasks);
    // `--json` prints this.
    let json = serde_json::to_value(report).expect("report as JSON");
    assert_eq!(json["tasks"], report.tasks);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_fault_run_sqlite_prints_once_loses_nothing_and_drains() {
    let report = run_faults(small(None)).await.expect("the fault run could be carried out");
    assert_eq!(report.backend, "sqlite");
    check(&report);
}

/// The PostgreSQL server of the tests, or `None` after saying SKIPPED.
fn postgres_url() -> Option<String> {
    let env = onceprint_store_postgres::testing::ENV;
    match std::env::var(env) {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ => {
            // Straight to stderr, past the test harness's capture, like the other
            // PostgreSQL tests: a skip must be visible in a CI log.
            use std::io::Write as _;
            let _ = writeln!(std::io::stderr(), "SKIPPED: PostgreSQL tests need {env}=postgres://… (not set)");
            None
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_fault_run_postgres_prints_once_loses_nothing_and_drains() {
    let Some(url) = postgres_url() else { return };
    let report = run_faults(small(Some(url))).await.expect("the fault run could be carried out");
    assert_eq!(report.backend, "postgres");
    check(&report);
}

/// Three broker nodes on one PostgreSQL schema behind the bench's load balancer: the
/// agent, the printers and the submitters talk to the balancer, the broker kills go to
/// the nodes in turn; still nothing twice, nothing lost, every lane drained, and one event
/// id per change among the task events the run's webhook received. The nodes share a
/// Redis first gate of the run's own, which is killed once and restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_fault_run_on_three_nodes_behind_a_load_balancer() {
    let Some(url) = postgres_url() else { return };
    let opts = FaultsOptions { nodes: 3, broker_kills: 3, redis: true, ..small(Some(url)) };
    let report = run_faults(opts).await.expect("the fault run could be carried out");
    println!("{}", report.render_text());
    assert!(report.problems.is_empty(), "the fault run found problems:\n{}", report.render_text());
    assert_eq!((report.nodes, report.broker_kills.len()), (3, 3));
    assert!(report.redis_killed_at_s.is_some(), "Redis was killed once");
    let v = &report.verdict;
    assert!(report.drained);
    assert_eq!((v.duplicates.count, v.lost.count, v.stray_jobs), (0, 0, 0));
    let e = &report.events;
    assert!(e.events > 0, "the run's webhook received task events");
    assert_eq!((e.changes_with_two_events, e.printed_without_event), (0, 0));
}
