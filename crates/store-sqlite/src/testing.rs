//! Test support: a fresh SQLite database in its own temporary directory.

use std::sync::Arc;

use onceprint_store::testing::Harness;

use crate::SqliteStore;

/// A new, migrated store on a real file that is deleted with the harness.
pub async fn fresh_store() -> Option<Harness> {
    let dir = tempfile_dir();
    let path = dir.join("onceprint.db");
    let store = SqliteStore::open(&path).unwrap_or_else(|e| panic!("cannot open test database: {e}"));
    let url = format!("sqlite://{}", path.display());
    Some(Harness { store: Arc::new(store), guard: Box::new(DirGuard(dir)), url })
}

/// [`fresh_store`] whose writer always looks busy (one job counted as waiting that never
/// comes), so that the reads SQLite gives the writer only when it is idle go to a pooled
/// reader: their other path, for the same conformance cases.
pub async fn fresh_store_with_a_busy_writer() -> Option<Harness> {
    let dir = tempfile_dir();
    let path = dir.join("onceprint.db");
    let store = SqliteStore::open(&path).unwrap_or_else(|e| panic!("cannot open test database: {e}"));
    store.inner.queued.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let url = format!("sqlite://{}", path.display());
    Some(Harness { store: Arc::new(store), guard: Box::new(DirGuard(dir)), url })
}

fn tempfile_dir() -> std::path::PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let dir = std::env::temp_dir().join(format!(
        "onceprint-test-{}-{}-{nanos}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    dir
}

struct DirGuard(std::path::PathBuf);

impl Drop for DirGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
