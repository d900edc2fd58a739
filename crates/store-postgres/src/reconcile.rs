//! Reconciliation reads for PostgreSQL: a store's tasks created in a time range and the
//! ledger entries of its tasks written in one.
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
/// changes no result; it only lets the planner also reach the store's tasks through
/// `tasks_tenant_store_id_idx` when that is the cheaper side of the join. The entries of
/// pruned tasks find their store through the tombstone; a task is kept or a tombstone,
/// never both, and one statement reads one snapshot, so no entry is counted twice.
pub(crate) const LEDGER_BETWEEN: &str = "
SELECT l.task_id, l.tenant_id, l.kind, l.amount, l.at
FROM ledger l JOIN tasks t ON t.id = l.task_id
WHERE l.tenant_id = $1 AND l.at >= $3::int8 AND l.at < $4::int8 AND t.tenant_id = $1 AND t.store_id = $2
UNION ALL
SELECT l.task_id, l.tenant_id, l.kind, l.amount, l.at
FROM ledger l JOIN task_tombstones b ON b.task_id = l.task_id
WHERE l.tenant_id = $1 AND l.at >= $3::int8 AND l.at < $4::int8 AND b.tenant_id = $1 AND b.store_id = $2
ORDER BY 5, 1, 3";

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

    /// 10 tenants of 10 stores each, 20 000 tasks in creation order spread over all of
    /// them, each with its charge written at its creation time; then fresh statistics, so
    /// that the plans are the ones a populated database gets. (On empty tables the planner
    /// has no reason to prefer one usable index over another.) The tables are named: a
    /// bare `ANALYZE` analyzes every schema of the database, the other tests' as well, and
    /// `a_table_that_grows_from_nothing_is_analyzed` then finds its new table analyzed.
    const POPULATE: &str = "
INSERT INTO tenants (id, name, api_key_hash, created_at)
    SELECT 't' || t, 't' || t, 'h' || t, 0 FROM generate_series(0, 9) t;
INSERT INTO stores (tenant_id, id, name, created_at)
    SELECT 't' || t, 's' || s, 'x', 0 FROM generate_series(0, 9) t, generate_series(0, 9) s;
INSERT INTO printers (tenant_id, id, store_id, name, transport, created_at)
    SELECT 't' || t, 'p' || s, 's' || s, 'x', '{}', 0 FROM generate_series(0, 9) t, generate_series(0, 9) s;
INSERT INTO tasks (id, tenant_id, store_id, printer_id, target, biz_no, print_type, priority, content_type,
                   content, fingerprint, state, created_at, updated_at)
    SELECT lpad(i::text, 20, '0') || '-t' || (i % 10), 't' || (i % 10), 's' || (i / 10 % 10), 'p' || (i / 10 % 10),
           'printer:p' || (i / 10 % 10), 'b' || i, 'receipt', 0, 'text/plain', '', 'f', 'printed', i, i
    FROM generate_series(1, 20000) i;
INSERT INTO ledger (tenant_id, task_id, kind, amount, at) SELECT tenant_id, id, 'charge', 1, created_at FROM tasks;
ANALYZE tenants, stores, printers, tasks, ledger;";

    #[tokio::test]
    async fn day_reads_use_their_indexes() {
        let Some(h) = crate::testing::fresh_store().await else {
            return;
        };
        let (client, connection) = tokio_postgres::connect(&h.url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        client.batch_execute(POPULATE).await.unwrap();

        let tasks = TASKS_CREATED_BETWEEN.replace("{cols}", TASK_COLUMNS);
        let (from, to) = (format!("{:020}", 5000), format!("{:020}", 6000));
        let tasks = plan(&h.url, &tasks, &[&"t3", &"s1", &from, &to]).await;
        // All three columns bound the scan: the ids compare in the index's "C" collation.
        assert!(tasks.contains("using tasks_tenant_store_id_idx on tasks"), "{tasks}");
        assert!(
            tasks.contains("(id >= '00000000000000005000'::text) AND (id < '00000000000000006000'::text)"),
            "{tasks}"
        );
        assert!(!tasks.contains("Filter"), "{tasks}");
        assert!(!tasks.contains("Sort"), "the order must come from the index:\n{tasks}");

        let ledger = plan(&h.url, LEDGER_BETWEEN, &[&"t3", &"s1", &5000i64, &6000i64]).await;
        assert!(ledger.contains("using ledger_by_time on ledger"), "{ledger}");
        drop(h);
    }
}
