//! The preload of `bench submit` / `bench e2e` (`--preload-finished`, `--preload-waiting`)
//! read back through a real broker: every store's task list by state, the broker's own
//! counts (`/metrics`), one task's audit trail, the bench store's reconciliation for every
//! day of the history and the watchdog's lanes must all agree with what was written.
//!
//! The broker is the workspace's binary of the same profile (`cargo build -p onceprint`;
//! `cargo test --workspace` builds it). Without it the test says SKIPPED, and fails under
//! CI, where the binary is always built.

use std::path::PathBuf;

use onceprint_bench::preload::run_check;
use onceprint_bench::PreloadOptions;

const SMALL: PreloadOptions = PreloadOptions { finished: 3_000, waiting: 600 };

/// The `onceprint` binary of the profile this test was built with (`target/debug` or
/// `target/release`): the test binary lives in that directory's `deps/`.
fn broker_exe() -> Option<PathBuf> {
    let exe = std::env::current_exe()
        .ok()
        .and_then(|t| t.parent()?.parent().map(|dir| dir.join("onceprint")))
        .unwrap_or_else(|| PathBuf::from("onceprint"));
    if exe.exists() {
        return Some(exe);
    }
    assert!(std::env::var_os("CI").is_none(), "{} is missing under CI", exe.display());
    eprintln!("SKIPPED: {} not built (cargo build -p onceprint)", exe.display());
    None
}

fn check(report: &onceprint_bench::PreloadReport, problems: &[String]) {
    println!("{}", report.render_line());
    assert!(problems.is_empty(), "{problems:#?}");
    assert!(report.broker_counts_agree);
    assert_eq!(report.states.values().sum::<u64>(), (SMALL.finished + SMALL.waiting) as u64);
    for state in ["printed", "failed", "cancelled", "pending"] {
        assert!(report.states.get(state).copied().unwrap_or(0) > 0, "no {state} task in {:?}", report.states);
    }
    assert!(report.events > report.states.values().sum::<u64>() * 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_sees_the_preload_sqlite() {
    let Some(exe) = broker_exe() else { return };
    let (report, problems) = run_check(&exe, None, 4, SMALL).await.expect("preload check");
    check(&report, &problems);
}

/// Runs where `ONCEPRINT_TEST_POSTGRES` names a database (CI sets it); SKIPPED otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_sees_the_preload_postgres() {
    let Some(exe) = broker_exe() else { return };
    let Ok(url) = std::env::var("ONCEPRINT_TEST_POSTGRES") else {
        eprintln!("SKIPPED: ONCEPRINT_TEST_POSTGRES not set");
        return;
    };
    let (report, problems) = run_check(&exe, Some(url), 4, SMALL).await.expect("preload check");
    check(&report, &problems);
}
