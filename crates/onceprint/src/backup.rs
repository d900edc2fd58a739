//! `onceprint backup --to FILE`: a consistent copy of the broker's SQLite database while
//! the broker runs (SQLite's online backup API, in `onceprint-store-sqlite`). PostgreSQL
//! databases are backed up with PostgreSQL's own tools; this command says so.

use std::path::PathBuf;

use anyhow::Context as _;

/// Flags of `onceprint backup`.
#[derive(Debug, clap::Args)]
pub struct BackupArgs {
    /// Where to write the copy (replaced atomically if it exists).
    #[arg(long, value_name = "FILE")]
    pub to: PathBuf,
    // The database, as `serve` takes it (`--database`/`--db`, ONCEPRINT_DATABASE_URL,
    // `database` in the --config file; default sqlite://onceprint.db).
    #[command(flatten)]
    pub serve: crate::config::ServeArgs,
}

/// What `pg_dump` advice a PostgreSQL URL gets.
pub const POSTGRES_ADVICE: &str = "onceprint backup copies SQLite databases; a PostgreSQL database is backed up with \
     PostgreSQL's tools while the broker runs, e.g. `pg_dump --format=custom --file=onceprint.dump \"$URL\"` \
     (consistent on its own: one snapshot), and restored with `pg_restore --dbname=\"$EMPTY_DB_URL\" onceprint.dump`; \
     see docs/OPERATIONS.md, Backup and restore";

pub fn run(args: BackupArgs) -> anyhow::Result<()> {
    let database = crate::config::resolve(args.serve)?.database;
    if database.starts_with("postgres://") || database.starts_with("postgresql://") {
        anyhow::bail!("{POSTGRES_ADVICE}");
    }
    let path = database.strip_prefix("sqlite://").or_else(|| database.strip_prefix("sqlite:")).unwrap_or(&database);
    if path.is_empty() {
        anyhow::bail!("--database names no file");
    }
    let report = onceprint_store_sqlite::backup::backup(std::path::Path::new(path), &args.to)
        .with_context(|| format!("cannot back up {path}"))?;
    println!(
        "backup written to {} ({} bytes, schema version {}, {} tasks, {} pruned task tombstones, {} ms)",
        report.destination.display(),
        report.bytes,
        report.schema_version,
        report.tasks,
        report.tombstones,
        report.elapsed.as_millis()
    );
    Ok(())
}
