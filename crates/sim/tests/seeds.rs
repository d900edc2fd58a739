//! The fixed seeds `cargo test` runs: every schedule from seed 0 up to
//! `ONCEPRINT_SIM_SEEDS` (default below) against the real broker code on SQLite; with
//! `ONCEPRINT_TEST_POSTGRES` set, a smaller range on PostgreSQL too. A failure prints the
//! seed, its shrunk schedule and the command that replays it.

use onceprint_sim::cli::run_range;
use onceprint_sim::{Backend, Options};

fn seeds(default: u64) -> u64 {
    std::env::var("ONCEPRINT_SIM_SEEDS").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

#[test]
fn fixed_seeds_keep_the_promise_on_sqlite() {
    let options = Options { backend: Backend::Sqlite, ..Options::default() };
    let report = run_range(0, seeds(3_000), threads(), &options).expect("the simulation runs");
    eprintln!("{report}");
    if let Some(f) = &report.failure {
        panic!("{f}");
    }
    assert!(report.tally.printed > 0 && report.tally.faults > 0, "the runs printed and struck faults: {report}");
}

#[test]
fn fixed_seeds_keep_the_promise_on_postgres() {
    if std::env::var(onceprint_store_postgres::testing::ENV).is_err() {
        eprintln!("SKIPPED: set ONCEPRINT_TEST_POSTGRES to run the simulation on PostgreSQL");
        return;
    }
    let options = Options { backend: Backend::Postgres, ..Options::default() };
    // A twentieth of the SQLite seeds: each schedule on several nodes renews leases and
    // syncs registries every simulated second, a few commits each on PostgreSQL, and this
    // test runs beside the SQLite one, which it should not outlast by much.
    let report = run_range(1_000_000, seeds(3_000) / 20, threads(), &options).expect("the simulation runs");
    eprintln!("{report}");
    if let Some(f) = &report.failure {
        panic!("{f}");
    }
}
