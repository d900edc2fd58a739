//! Retention for PostgreSQL: finding the finished tasks that may be pruned, pruning
//! a batch of them into tombstones, and reading tombstones back.
//!
//! A prune is one short transaction per batch: lock the tasks that are still as they were
//! read (`FOR UPDATE`, so two nodes pruning at once take turns and the second finds them
//! gone), copy them into `task_tombstones`, delete their audit events, delete them. Intake
//! racing a prune for the same key is handled on intake's side (see `submit` and
//! migration 13).

use deadpool_postgres::GenericClient;
use onceprint_core::{IdempotencyKey, Millis, TaskState};
use onceprint_store::{PruneTask, Pruned, StoreResult, Task, Tombstone};

use crate::error::pg_error;
use crate::rows::{self, TASK_COLUMNS, TOMBSTONE_COLUMNS_B};

/// Through the primary key from `$1` up to `$2`; the other conditions filter the rows
/// met, so a run pages through the old tasks once.
const PRUNABLE: &str = "
SELECT {cols} FROM tasks
WHERE id > $1 AND id < $2 AND updated_at < $3 AND state = ANY($4)
ORDER BY id
LIMIT $5";

/// The compare-and-set of a prune: only tasks still in the state and at the change they
/// were read with, locked until the prune commits.
const LOCK_UNCHANGED: &str = "
SELECT t.id
FROM tasks t
JOIN unnest($1::text[], $2::text[], $3::int8[]) AS c(id, state, updated_at)
  ON t.id = c.id AND t.state = c.state AND t.updated_at = c.updated_at
ORDER BY t.id
FOR UPDATE OF t";

/// The tombstones of the locked tasks. A key that already has a tombstone (which intake
/// never lets happen) keeps its task rather than failing the batch for good.
const KEEP: &str = "
INSERT INTO task_tombstones (task_id, tenant_id, store_id, printer_id, station_id, target, biz_no, print_type,
                             priority, content_type, fingerprint, state, attempts, last_error, created_at,
                             updated_at, printed_at, origin_task_id, origin_kind, reprint_no, successor_task_id,
                             may_have_printed, business_day, pruned_at)
SELECT t.id, t.tenant_id, t.store_id, t.printer_id, t.station_id, t.target, t.biz_no, t.print_type, t.priority,
       t.content_type, t.fingerprint, t.state, t.attempts, t.last_error, t.created_at, t.updated_at, t.printed_at,
       t.origin_task_id, t.origin_kind, t.reprint_no, t.successor_task_id, t.may_have_printed, d.day, $3::int8
FROM tasks t JOIN unnest($1::text[], $2::text[]) AS d(id, day) ON d.id = t.id
ON CONFLICT DO NOTHING
RETURNING task_id";

const DELETE_EVENTS: &str = "DELETE FROM task_events WHERE task_id = ANY($1)";
const DELETE_TASKS: &str = "DELETE FROM tasks WHERE id = ANY($1)";

const BY_ID: &str = "SELECT {cols} FROM task_tombstones b WHERE b.task_id = $1 AND b.tenant_id = $2";

const BY_KEY: &str = "
SELECT {cols} FROM task_tombstones b
WHERE b.tenant_id = $1 AND b.target = $2 AND b.biz_no = $3 AND b.print_type = $4";

/// Through `task_tombstones_by_store`, in its order.
const CREATED_BETWEEN: &str = "
SELECT {cols} FROM task_tombstones b
WHERE b.tenant_id = $1 AND b.store_id = $2 AND b.task_id >= $3 AND b.task_id < $4
ORDER BY b.task_id";

pub(crate) async fn prunable_tasks(
    client: &deadpool_postgres::Client,
    states: &[TaskState],
    before_id: &str,
    changed_before: Millis,
    after_id: Option<&str>,
    limit: i64,
) -> StoreResult<Vec<Task>> {
    let states: Vec<&str> = states.iter().map(|s| s.as_str()).collect();
    let stmt = client.prepare_cached(&PRUNABLE.replace("{cols}", TASK_COLUMNS)).await.map_err(pg_error)?;
    let found = client
        .query(&stmt, &[&after_id.unwrap_or(""), &before_id, &changed_before, &states, &limit])
        .await
        .map_err(pg_error)?;
    found.iter().map(rows::task).collect()
}

pub(crate) async fn prune_tasks(
    client: &mut deadpool_postgres::Client,
    tasks: &[PruneTask],
    now: Millis,
) -> StoreResult<Pruned> {
    if tasks.is_empty() {
        return Ok(Pruned::default());
    }
    let ids: Vec<&str> = tasks.iter().map(|t| t.task_id.as_str()).collect();
    let states: Vec<&str> = tasks.iter().map(|t| t.state.as_str()).collect();
    let changed: Vec<i64> = tasks.iter().map(|t| t.updated_at).collect();
    let days: Vec<&str> = tasks.iter().map(|t| t.business_day.as_str()).collect();
    // Dropping the transaction on an early return (an error) rolls all of it back.
    let tx = client.transaction().await.map_err(pg_error)?;
    let locked = tx.query(LOCK_UNCHANGED, &[&ids, &states, &changed]).await.map_err(pg_error)?;
    let locked: Vec<String> = locked.iter().map(|r| rows::col(r, 0)).collect::<StoreResult<_>>()?;
    if locked.is_empty() {
        tx.rollback().await.map_err(pg_error)?;
        return Ok(Pruned::default());
    }
    // Only the locked tasks, with the day each was given.
    let (kept_ids, kept_days): (Vec<&str>, Vec<&str>) =
        ids.iter().zip(&days).filter(|(id, _)| locked.iter().any(|l| l == *id)).map(|(i, d)| (*i, *d)).unzip();
    let stmt = tx.prepare_cached(KEEP).await.map_err(pg_error)?;
    let kept = tx.query(&stmt, &[&kept_ids, &kept_days, &now]).await.map_err(pg_error)?;
    let task_ids: Vec<String> = kept.iter().map(|r| rows::col(r, 0)).collect::<StoreResult<_>>()?;
    // Events first: they refer to the task rows.
    let stmt = tx.prepare_cached(DELETE_EVENTS).await.map_err(pg_error)?;
    let events = tx.execute(&stmt, &[&task_ids]).await.map_err(pg_error)?;
    let stmt = tx.prepare_cached(DELETE_TASKS).await.map_err(pg_error)?;
    tx.execute(&stmt, &[&task_ids]).await.map_err(pg_error)?;
    tx.commit().await.map_err(pg_error)?;
    Ok(Pruned { task_ids, events })
}

pub(crate) async fn get_tombstone<C: GenericClient>(
    client: &C,
    tenant_id: &str,
    task_id: &str,
) -> StoreResult<Option<Tombstone>> {
    let stmt = client.prepare_cached(&BY_ID.replace("{cols}", TOMBSTONE_COLUMNS_B)).await.map_err(pg_error)?;
    client.query_opt(&stmt, &[&task_id, &tenant_id]).await.map_err(pg_error)?.as_ref().map(rows::tombstone).transpose()
}

pub(crate) async fn find_tombstone<C: GenericClient>(
    client: &C,
    key: &IdempotencyKey,
) -> StoreResult<Option<Tombstone>> {
    let stmt = client.prepare_cached(&BY_KEY.replace("{cols}", TOMBSTONE_COLUMNS_B)).await.map_err(pg_error)?;
    client
        .query_opt(&stmt, &[&key.tenant_id, &key.target, &key.biz_no, &key.print_type])
        .await
        .map_err(pg_error)?
        .as_ref()
        .map(rows::tombstone)
        .transpose()
}

pub(crate) async fn tasks_and_tombstones_created_between(
    client: &mut deadpool_postgres::Client,
    tenant_id: &str,
    store_id: &str,
    from_id: &str,
    to_id: &str,
) -> StoreResult<(Vec<Task>, Vec<Tombstone>)> {
    // One snapshot for both reads (repeatable read): a prune committing in between cannot
    // put a task into both lists or into neither.
    let tx = client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .map_err(pg_error)?;
    let sql = crate::reconcile::TASKS_CREATED_BETWEEN.replace("{cols}", TASK_COLUMNS);
    let stmt = tx.prepare_cached(&sql).await.map_err(pg_error)?;
    let tasks = tx.query(&stmt, &[&tenant_id, &store_id, &from_id, &to_id]).await.map_err(pg_error)?;
    let tasks = tasks.iter().map(rows::task).collect::<StoreResult<Vec<_>>>()?;
    let stmt = tx.prepare_cached(&CREATED_BETWEEN.replace("{cols}", TOMBSTONE_COLUMNS_B)).await.map_err(pg_error)?;
    let tombstones = tx.query(&stmt, &[&tenant_id, &store_id, &from_id, &to_id]).await.map_err(pg_error)?;
    let tombstones = tombstones.iter().map(rows::tombstone).collect::<StoreResult<Vec<_>>>()?;
    tx.commit().await.map_err(pg_error)?;
    Ok((tasks, tombstones))
}
