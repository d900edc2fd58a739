//! Retention for SQLite: finding the finished tasks that may be pruned, pruning a
//! batch of them into tombstones, and reading tombstones back.
//!
//! A prune runs on the writer thread like every write, as one job: the batch's audit
//! events are deleted, each task still in the state it was read in is copied into
//! `task_tombstones` and its row deleted, all inside the job's savepoint and committed with
//! whatever else the writer commits. Intake for the same key runs on the same thread, so
//! it sees either the task or its tombstone, never neither.

use onceprint_core::{IdempotencyKey, TaskState};
use onceprint_store::*;
use rusqlite::{params, Connection, OptionalExtension, Row};

use crate::backend_err;
use crate::sql::{task_from_row, TASK_COLS};

/// The tombstone's columns, in the order [`tombstone_from_row`] reads them. The first
/// ones line up with the task columns of `sql::task_from_row` (with NULL for what a
/// tombstone does not keep), so that one row reader serves both.
const TOMBSTONE_COLS: &str = "task_id, tenant_id, store_id, printer_id, station_id, target, biz_no, print_type, \
     priority, content_type, fingerprint, state, attempts, last_error, NULL, created_at, updated_at, printed_at, \
     NULL, NULL, origin_task_id, origin_kind, reprint_no, successor_task_id, NULL, may_have_printed, 0, \
     business_day, pruned_at";

fn tombstone_from_row(r: &Row<'_>) -> rusqlite::Result<Tombstone> {
    Ok(Tombstone { task: task_from_row(r)?, business_day: r.get(27)?, pruned_at: r.get(28)? })
}

pub fn prunable_tasks(
    c: &Connection,
    states: &[TaskState],
    before_id: &str,
    changed_before: i64,
    after_id: Option<&str>,
    limit: i64,
) -> StoreResult<Vec<Task>> {
    let states = serde_json::to_string(&states.iter().map(|s| s.as_str()).collect::<Vec<_>>())
        .map_err(|e| StoreError::Backend(e.to_string()))?;
    // The primary key is walked from `after_id` up to `before_id`; the other conditions
    // are checked on the rows met, so each old task is looked at once per run.
    let mut s = c
        .prepare_cached(&format!(
            "SELECT {TASK_COLS} FROM tasks WHERE id > ?1 AND id < ?2 AND updated_at < ?3 \
             AND state IN (SELECT value FROM json_each(?4)) ORDER BY id LIMIT ?5"
        ))
        .map_err(backend_err)?;
    let rows = s
        .query_map(params![after_id.unwrap_or(""), before_id, changed_before, states, limit], task_from_row)
        .map_err(backend_err)?;
    rows.collect::<rusqlite::Result<Vec<_>>>().map_err(backend_err)
}

pub fn prune_tasks(c: &Connection, tasks: &[PruneTask], now: i64) -> StoreResult<Pruned> {
    let mut out = Pruned::default();
    let mut still = c
        .prepare_cached("SELECT 1 FROM tasks WHERE id = ?1 AND state = ?2 AND updated_at = ?3")
        .map_err(backend_err)?;
    let mut events = c.prepare_cached("DELETE FROM task_events WHERE task_id = ?1").map_err(backend_err)?;
    let mut keep = c
        .prepare_cached(
            "INSERT INTO task_tombstones (task_id, tenant_id, store_id, printer_id, station_id, target, biz_no, \
             print_type, priority, content_type, fingerprint, state, attempts, last_error, created_at, updated_at, \
             printed_at, origin_task_id, origin_kind, reprint_no, successor_task_id, may_have_printed, \
             business_day, pruned_at) \
             SELECT id, tenant_id, store_id, printer_id, station_id, target, biz_no, print_type, priority, \
             content_type, fingerprint, state, attempts, last_error, created_at, updated_at, printed_at, \
             origin_task_id, origin_kind, reprint_no, successor_task_id, may_have_printed, ?2, ?3 \
             FROM tasks WHERE id = ?1 \
             ON CONFLICT DO NOTHING",
        )
        .map_err(backend_err)?;
    let mut delete = c.prepare_cached("DELETE FROM tasks WHERE id = ?1").map_err(backend_err)?;
    for t in tasks {
        // The compare-and-set: a task that is not as it was read is not touched. (End
        // states never change, so this only skips a task that is already gone.)
        let unchanged = still
            .query_row(params![t.task_id, t.state.as_str(), t.updated_at], |_| Ok(()))
            .optional()
            .map_err(backend_err)?
            .is_some();
        if !unchanged {
            continue;
        }
        // A key that has a tombstone already (which intake never lets happen) keeps its
        // task rather than failing every run for good.
        if keep.execute(params![t.task_id, t.business_day, now]).map_err(backend_err)? == 0 {
            continue;
        }
        // Events before the task: they refer to its row.
        out.events += events.execute([&t.task_id]).map_err(backend_err)? as u64;
        delete.execute([&t.task_id]).map_err(backend_err)?;
        out.task_ids.push(t.task_id.clone());
    }
    Ok(out)
}

pub fn get_tombstone(c: &Connection, tenant: &str, id: &str) -> StoreResult<Option<Tombstone>> {
    c.prepare_cached(&format!("SELECT {TOMBSTONE_COLS} FROM task_tombstones WHERE task_id = ?1 AND tenant_id = ?2"))
        .and_then(|mut s| s.query_row([id, tenant], tombstone_from_row).optional())
        .map_err(backend_err)
}

pub fn find_tombstone(c: &Connection, key: &IdempotencyKey) -> StoreResult<Option<Tombstone>> {
    find_tombstone_parts(c, &key.tenant_id, &key.target, &key.biz_no, &key.print_type)
}

pub fn find_tombstone_parts(
    c: &Connection,
    tenant: &str,
    target: &str,
    biz_no: &str,
    print_type: &str,
) -> StoreResult<Option<Tombstone>> {
    TombstoneByKey::prepare(c)?.find(tenant, target, biz_no, print_type)
}

/// The look-up of a tombstone by task key, prepared once for many keys: intake asks it for
/// every new task of a batch, and each `prepare_cached` would format and hash the SQL text.
pub struct TombstoneByKey<'c>(rusqlite::CachedStatement<'c>);

impl<'c> TombstoneByKey<'c> {
    pub fn prepare(c: &'c Connection) -> StoreResult<Self> {
        c.prepare_cached(&format!(
            "SELECT {TOMBSTONE_COLS} FROM task_tombstones \
             WHERE tenant_id = ?1 AND target = ?2 AND biz_no = ?3 AND print_type = ?4"
        ))
        .map(TombstoneByKey)
        .map_err(backend_err)
    }

    pub fn find(
        &mut self,
        tenant: &str,
        target: &str,
        biz_no: &str,
        print_type: &str,
    ) -> StoreResult<Option<Tombstone>> {
        self.0.query_row([tenant, target, biz_no, print_type], tombstone_from_row).optional().map_err(backend_err)
    }
}

pub fn tasks_and_tombstones_created_between(
    c: &Connection,
    tenant: &str,
    store: &str,
    from: &str,
    to: &str,
) -> StoreResult<(Vec<Task>, Vec<Tombstone>)> {
    // Both reads in one read transaction (one snapshot of the WAL): a prune committing in
    // between cannot make a task appear in both lists or in neither.
    let tx = c.unchecked_transaction().map_err(backend_err)?;
    let tasks = crate::sql::tasks_created_between(&tx, tenant, store, from, to)?;
    let mut s = tx
        .prepare_cached(&format!(
            "SELECT {TOMBSTONE_COLS} FROM task_tombstones \
             WHERE tenant_id = ?1 AND store_id = ?2 AND task_id >= ?3 AND task_id < ?4 ORDER BY task_id"
        ))
        .map_err(backend_err)?;
    let rows = s.query_map([tenant, store, from, to], tombstone_from_row).map_err(backend_err)?;
    let tombstones = rows.collect::<rusqlite::Result<Vec<_>>>().map_err(backend_err)?;
    drop(s);
    tx.finish().map_err(backend_err)?;
    Ok((tasks, tombstones))
}
