//! Runs the bench end to end, small, against the workspace's own `onceprint` binary.
//!
//! `CARGO_BIN_EXE_*` only exists inside the binary's own package, so the binary is looked
//! up in the target directory instead; build it first (`cargo build -p onceprint`). The
//! tests skip, with a note, while it is missing or does not have `serve` yet.

use std::path::PathBuf;

use onceprint_bench::{run_submit, SubmitOptions};

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

/// Needs a PostgreSQL URL in `ONCEPRINT_BENCH_POSTGRES_URL` (e.g.
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
