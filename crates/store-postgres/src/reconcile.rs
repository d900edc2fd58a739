//! Reconciliation reads for PostgreSQL: a store's tasks created in a time range and the
//! ledger entries of its tasks written in one (R28).
//!
//! Both are plain range reads through an index. Task ids sort by creation time in byte
//! order, which is the "C" collation of `tasks.id`; a bound passed as a parameter takes
//! the column's collation, so `id >= $3 AND id < $4` is a range scan of
//! `tasks_tenant_store_id_idx` and its order is the `ORDER BY id`. The ledger is read
//! through `ledger_by_time` (migration 4) and joined to the tasks to keep only the store's.

use onceprint_core::Millis;
use onceprint_store::{LedgerEntry, StoreResult, Task};

use crate::error::pg_error;
use crate::rows::{self, TASK_COLUMNS};

/// Through `tasks_tenant_store_id_idx`, in its order.
pub(crate) const TASKS_CREATED_BETWEEN: &str = "
SELECT {cols} FROM tasks
WHERE tenant_id = $1 AND store_id = $2 AND id >= $3 AND id < $4
ORDER BY id";

/// Through `ledger_by_time`. A ledger entry's tenant is its task's, so `t.tenant_id = $1`
/// changes no result; it lets the join use the tasks' primary key with the tenant known.
pub(crate) const LEDGER_BETWEEN: &str = "
SELECT l.task_id, l.tenant_id, l.kind, l.amount, l.at
FROM ledger l JOIN tasks t ON t.id = l.task_id
WHERE l.tenant_id = $1 AND l.at >= $3::int8 AND l.at < $4::int8 AND t.tenant_id = $1 AND t.store_id = $2
ORDER BY l.at, l.task_id, l.kind";

pub(crate) async fn tasks_created_between(
    client: &deadpool_postgres::Client,
    tenant_id: &str,
    store_id: &str,
    from_id: &str,
    to_id: &str,
) -> StoreResult<Vec<Task>> {
    let stmt = client.prepare_cached(&TASKS_CREATED_BETWEEN.replace("{cols}", TASK_COLUMNS)).await.map_err(pg_error)?;
    let found = client.query(&stmt, &[&tenant_id, &store_id, &from_id, &to_id]).await.map_err(pg_error)?;
    found.iter().map(rows::task).collect()
}

pub(crate) async fn ledger_between(
    client: &deadpool_postgres::Client,
    tenant_id: &str,
    store_id: &str,
    from: Millis,
    to: Millis,
) -> StoreResult<Vec<LedgerEntry>> {
    let stmt = client.prepare_cached(LEDGER_BETWEEN).await.map_err(pg_error)?;
    let found = client.query(&stmt, &[&tenant_id, &store_id, &from, &to]).await.map_err(pg_error)?;
    found.iter().map(rows::ledger_entry).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::tests::plan;

    #[tokio::test]
    async fn day_reads_use_their_indexes() {
        let Some(h) = crate::testing::fresh_store().await else {
            return;
        };
        let tasks = TASKS_CREATED_BETWEEN.replace("{cols}", TASK_COLUMNS);
        let tasks = plan(&h.url, &tasks, &[&"acme", &"s1", &"0001", &"0002"]).await;
        assert!(tasks.contains("using tasks_tenant_store_id_idx on tasks"), "{tasks}");
        assert!(!tasks.contains("Sort"), "the order must come from the index:\n{tasks}");
        let ledger = plan(&h.url, LEDGER_BETWEEN, &[&"acme", &"s1", &0i64, &1i64]).await;
        assert!(ledger.contains("ledger_by_time"), "{ledger}");
        drop(h);
    }
}
