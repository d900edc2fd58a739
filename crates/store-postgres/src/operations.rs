//! Operations: an operator's action or a failover applied in one transaction
//! ([`onceprint_store::Store::apply_manual`]), the per-store attention list and the
//! reprint count, for PostgreSQL.
//!
//! An action is a short transaction of a few statements, in the order the SQLite backend
//! runs them: the compare-and-set transition with its audit event (the same statement as
//! [`crate::delivery::transition`]), the refund, the successor task (the intake statement
//! of [`crate::submit`], so it gets its creation event and, unless it is free, its
//! charge), and the link from a transferred task to its successor. Whatever fails or does
//! not apply rolls all of it back. The refund copies the charge under the ledger's unique
//! key (task, kind), so a task is refunded at most once however often it is asked for,
//! also by concurrent actions: the second insert waits for the first and then does nothing.

use onceprint_store::{ManualChange, OriginKind, StoreError, StoreResult, SubmitOutcome, Task};

use crate::error::pg_error;
use crate::rows::{self, TASK_COLUMNS};
use crate::{delivery, submit};

const REFUND: &str = "
INSERT INTO ledger (tenant_id, task_id, kind, amount, at)
SELECT tenant_id, task_id, 'refund', amount, $2::int8 FROM ledger WHERE task_id = $1 AND kind = 'charge'
ON CONFLICT (task_id, kind) DO NOTHING";

const LINK_SUCCESSOR: &str = "UPDATE tasks SET successor_task_id = $1 WHERE id = $2";

/// Through `tasks_attention`, whose predicate the state list repeats literally so that the
/// planner can prove the partial index applies.
pub(crate) const ATTENTION: &str = "
SELECT {cols} FROM tasks
WHERE tenant_id = $1 AND store_id = $2 AND state IN ('failed', 'in_doubt')
ORDER BY updated_at, id
LIMIT $3";

/// Through `tasks_by_origin` and `task_tombstones_by_origin`: pruned reprints count, so
/// that a new reprint never takes the number (and key) of a pruned one.
pub(crate) const REPRINT_COUNT: &str = "
SELECT (SELECT count(*) FROM tasks WHERE origin_task_id = $1 AND origin_kind = 'reprint')
     + (SELECT count(*) FROM task_tombstones WHERE origin_task_id = $1 AND origin_kind = 'reprint')";

pub(crate) async fn apply_manual(client: &mut deadpool_postgres::Client, change: &ManualChange) -> StoreResult<bool> {
    // Dropping the transaction on an early return (an error) rolls all of it back.
    let tx = client.transaction().await.map_err(pg_error)?;
    for t in &change.transitions {
        if !delivery::transition(&tx, t).await? {
            tx.rollback().await.map_err(pg_error)?;
            return Ok(false);
        }
    }
    if let Some(charged) = &change.refund {
        let stmt = tx.prepare_cached(REFUND).await.map_err(pg_error)?;
        tx.execute(&stmt, &[charged, &change.now]).await.map_err(pg_error)?;
    }
    if let Some(succ) = &change.successor {
        let out = submit::submit_batch(&tx, vec![succ.clone()], true).await?;
        if !matches!(out.first(), Some(SubmitOutcome::Created(_))) {
            return Err(StoreError::AlreadyExists(format!("a task for key {} {}", succ.target, succ.biz_no)));
        }
        // A reprint stands beside its original; a transfer or failover carries it on.
        if succ.origin.as_ref().is_some_and(|o| o.kind != OriginKind::Reprint) {
            let stmt = tx.prepare_cached(LINK_SUCCESSOR).await.map_err(pg_error)?;
            tx.execute(&stmt, &[&succ.task_id, &change.task_id]).await.map_err(pg_error)?;
        }
    }
    tx.commit().await.map_err(pg_error)?;
    Ok(true)
}

pub(crate) async fn attention(
    client: &deadpool_postgres::Client,
    tenant_id: &str,
    store_id: &str,
    limit: i64,
) -> StoreResult<Vec<Task>> {
    let stmt = client.prepare_cached(&ATTENTION.replace("{cols}", TASK_COLUMNS)).await.map_err(pg_error)?;
    let found = client.query(&stmt, &[&tenant_id, &store_id, &limit.max(0)]).await.map_err(pg_error)?;
    found.iter().map(rows::task).collect()
}

pub(crate) async fn reprint_count(client: &deadpool_postgres::Client, task_id: &str) -> StoreResult<i32> {
    let stmt = client.prepare_cached(REPRINT_COUNT).await.map_err(pg_error)?;
    let row = client.query_one(&stmt, &[&task_id]).await.map_err(pg_error)?;
    let count: i64 = rows::col(&row, 0)?;
    i32::try_from(count).map_err(|_| StoreError::Backend(format!("task {task_id} has {count} reprints")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::tests::plan;

    #[tokio::test]
    async fn attention_and_reprints_are_read_from_their_indexes() {
        let Some(h) = crate::testing::fresh_store().await else {
            return;
        };
        let attention = plan(&h.url, &ATTENTION.replace("{cols}", TASK_COLUMNS), &[&"acme", &"s1", &10i64]).await;
        assert!(attention.contains("using tasks_attention on tasks"), "{attention}");
        let reprints = plan(&h.url, REPRINT_COUNT, &[&"t1"]).await;
        assert!(reprints.contains("tasks_by_origin"), "{reprints}");
        drop(h);
    }
}
