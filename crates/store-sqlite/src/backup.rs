//! Online backup of a broker's SQLite database (`onceprint backup`), with SQLite's
//! backup API, while the broker runs and writes.
//!
//! The whole database is copied in a single backup step. That step reads under one read
//! transaction, so the copy is the database exactly as it was at one commit: everything
//! committed before the backup began is in it (every task a client was answered 201 for),
//! nothing half-written is. In WAL mode a reader never blocks the writer, so the broker
//! goes on committing meanwhile. (Copying in several small steps would let the broker's
//! writes restart the copy again and again, possibly for ever.)
//!
//! The copy is written next to the destination, checked (`PRAGMA quick_check`), turned
//! into a self-contained file (rollback journal instead of WAL, so that it is one file and
//! can be moved anywhere), flushed to disk and only then renamed to the destination: a
//! crash or a failed check never leaves a half backup under the destination's name.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use onceprint_store::StoreError;
use rusqlite::backup::{Backup, StepResult};
use rusqlite::{Connection, OpenFlags, OptionalExtension};

/// How long the backup waits in all for the source to let it start reading (it only
/// waits while the database is locked exclusively, e.g. by a migration).
const BUSY_FOR: Duration = Duration::from_secs(30);

/// What a backup copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupReport {
    pub destination: PathBuf,
    pub bytes: u64,
    /// The schema version (migrations applied) of the copy.
    pub schema_version: i64,
    pub tasks: i64,
    pub tombstones: i64,
    pub elapsed: Duration,
}

fn failed(what: &str, path: &Path, e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(format!("backup: {what} {}: {e}", path.display()))
}

/// Copies the database at `source` (a broker's file, in use or not) to `destination`.
pub fn backup(source: &Path, destination: &Path) -> Result<BackupReport, StoreError> {
    let started = Instant::now();
    if !source.is_file() {
        return Err(StoreError::NotFound(format!("SQLite database {}", source.display())));
    }
    if let (Ok(a), Ok(b)) = (source.canonicalize(), destination.canonicalize()) {
        if a == b {
            return Err(StoreError::Backend(format!(
                "backup: {} is the database itself; choose another file",
                destination.display()
            )));
        }
    }
    // Read-write without create: the source must exist, and a WAL database needs its
    // shared-memory file writable even for reading. Nothing in it is changed (closing the
    // last connection to a database checkpoints its WAL, as every connection does).
    crate::memory::configure();
    let src = Connection::open_with_flags(source, OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX)
        .map_err(|e| failed("cannot open", source, e))?;
    src.busy_timeout(Duration::from_secs(10)).map_err(|e| failed("cannot configure", source, e))?;
    let is_broker_db: Option<i64> = src
        .query_row("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'", [], |r| r.get(0))
        .optional()
        .map_err(|e| failed("cannot read", source, e))?;
    if is_broker_db.is_none() {
        return Err(StoreError::Backend(format!("backup: {} is not an onceprint database", source.display())));
    }

    let partial = partial_path(destination);
    let _ = std::fs::remove_file(&partial);
    let result = copy_into(&src, &partial).and_then(|report| {
        std::fs::rename(&partial, destination).map_err(|e| failed("cannot rename the copy to", destination, e))?;
        if let Some(dir) = destination.parent().filter(|d| !d.as_os_str().is_empty()) {
            // The rename itself is durable once the directory is flushed.
            if let Ok(d) = std::fs::File::open(dir) {
                let _ = d.sync_all();
            }
        }
        Ok(report)
    });
    match result {
        Ok((bytes, schema_version, tasks, tombstones)) => Ok(BackupReport {
            destination: destination.to_path_buf(),
            bytes,
            schema_version,
            tasks,
            tombstones,
            elapsed: started.elapsed(),
        }),
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            let _ = std::fs::remove_file(journal_of(&partial));
            Err(e)
        }
    }
}

/// `FILE.partial` beside the destination (same directory, so the rename is atomic).
fn partial_path(destination: &Path) -> PathBuf {
    let mut name = destination.file_name().map(|n| n.to_os_string()).unwrap_or_else(|| "backup.db".into());
    name.push(".partial");
    destination.with_file_name(name)
}

fn journal_of(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push("-journal");
    PathBuf::from(name)
}

/// The copy itself; answers (bytes, schema version, tasks, tombstones) of the checked copy.
fn copy_into(src: &Connection, partial: &Path) -> Result<(u64, i64, i64, i64), StoreError> {
    let mut dst = Connection::open(partial).map_err(|e| failed("cannot create", partial, e))?;
    {
        let backup = Backup::new(src, &mut dst).map_err(|e| failed("cannot start copying into", partial, e))?;
        let deadline = Instant::now() + BUSY_FOR;
        loop {
            // -1: every page in this one step, under one read transaction of the source.
            match backup.step(-1).map_err(|e| failed("copying into", partial, e))? {
                StepResult::Done => break,
                StepResult::More => continue,
                // Busy or locked (or a kind this version does not know): not done yet.
                _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
                _ => return Err(failed("the database stayed locked; no copy written to", partial, "busy")),
            }
        }
    }
    // The copy carries the source's WAL mode; a backup is better one self-contained file.
    let mode: String = dst
        .query_row("PRAGMA journal_mode=DELETE", [], |r| r.get(0))
        .map_err(|e| failed("cannot finish", partial, e))?;
    if !mode.eq_ignore_ascii_case("delete") {
        return Err(failed("cannot switch to a rollback journal:", partial, mode));
    }
    let check: String =
        dst.query_row("PRAGMA quick_check", [], |r| r.get(0)).map_err(|e| failed("cannot check", partial, e))?;
    if check != "ok" {
        return Err(failed("the copy failed its check:", partial, check));
    }
    let count = |sql: &str| -> Result<i64, StoreError> {
        dst.query_row(sql, [], |r| r.get(0)).map_err(|e| failed("cannot read", partial, e))
    };
    let schema_version = count("SELECT COALESCE(MAX(version), 0) FROM schema_migrations")?;
    let tasks = count("SELECT COUNT(*) FROM tasks")?;
    // A database of a broker before retention has no tombstones table.
    let tombstones =
        if count("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'task_tombstones'")? == 1 {
            count("SELECT COUNT(*) FROM task_tombstones")?
        } else {
            0
        };
    drop(dst);
    let file = std::fs::File::open(partial).map_err(|e| failed("cannot reopen", partial, e))?;
    file.sync_all().map_err(|e| failed("cannot flush", partial, e))?;
    let bytes = file.metadata().map(|m| m.len()).unwrap_or(0);
    Ok((bytes, schema_version, tasks, tombstones))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_files_sit_beside_the_destination() {
        assert_eq!(partial_path(Path::new("/b/x.db")), PathBuf::from("/b/x.db.partial"));
        assert_eq!(partial_path(Path::new("x.db")), PathBuf::from("x.db.partial"));
        assert_eq!(journal_of(Path::new("/b/x.db.partial")), PathBuf::from("/b/x.db.partial-journal"));
    }
}
