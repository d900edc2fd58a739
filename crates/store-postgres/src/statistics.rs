//! Keeps the planner's statistics of the busy tables current.
//!
//! Every statement of this store is a cached prepared statement, and PostgreSQL plans it
//! with the statistics it has when the plan is made. A fresh database (a new deployment, a
//! benchmark, a test) starts with empty tables; until the first `ANALYZE` the planner
//! believes they hold a handful of rows, and it picks plans that are only right for that:
//! the compare-and-set `UPDATE … WHERE id = $1 AND state = $3` through the `(state,
//! next_attempt_at)` index instead of the primary key, the lane heads through a tenant
//! index instead of `tasks_lane`, `id = ANY($2)` through a tenant index. With tens of
//! thousands of tasks each of those reads every task of the state or the tenant, and
//! delivery on PostgreSQL fell to ~1,000 printed tasks/s, almost all of it PostgreSQL
//! walking rows (measured with `auto_explain`; see docs/BENCHMARKS.md).
//!
//! Autovacuum would analyze the tables, but it looks at a database only once per
//! `autovacuum_naptime` (a minute by default), and a table that grows from nothing to
//! 50,000 rows in that minute runs on plans for an empty table all along. So the store
//! checks the tables itself every [`CHECK_EVERY`] and analyzes one where more rows changed
//! since its last analysis than the statistics say it has (at least [`MIN_CHANGES`]): the
//! plans go wrong when the statistics are off by an order of magnitude, not by a tenth, so
//! doubling is the step that matters, and later growth is autovacuum's (whose share for
//! `tasks` is lowered to 5 % by migration 7). An `ANALYZE` samples at most a few tens of
//! thousands of rows and invalidates the cached plans that use the table, so the next
//! executions are planned with the new numbers.
//!
//! It must never hold up the work: the check is one small query, an `ANALYZE` waits at most
//! [`LOCK_TIMEOUT`] for its lock (another node or autovacuum may be analyzing the same
//! table; then this round is skipped), and failures are logged and retried next round.

use std::time::Duration;

use std::sync::{Arc, Mutex, PoisonError};

use deadpool_postgres::Pool;
use onceprint_store::UpkeepGate;
use tokio::sync::oneshot;

/// How often the tables are looked at.
pub(crate) const CHECK_EVERY: Duration = Duration::from_secs(2);
/// Fewer changed rows than this never trigger an analysis.
pub(crate) const MIN_CHANGES: f64 = 500.0;
/// The share of a table's rows that must have changed since its last analysis.
const CHANGED_SHARE: f64 = 1.0;
/// How long an `ANALYZE` waits for its lock before the round is skipped.
const LOCK_TIMEOUT: &str = "200ms";

/// The tables whose plans matter on the hot paths: intake, delivery, alerts.
const TABLES: &[&str] = &["tasks", "task_events", "ledger", "outbox", "webhook_deliveries", "printers"];

/// Rows changed since the last analysis and the rows the planner believes a table has
/// (`-1` before its first analysis), for the tables of the current schema.
const CHANGES: &str = "
SELECT s.relname::text, s.n_mod_since_analyze::float8, c.reltuples::float8
FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
WHERE s.schemaname = current_schema() AND s.relname = ANY($1)";

/// Whether a table with `changed` rows modified since its last analysis, and `believed`
/// rows in the planner's statistics, is due for an analysis.
pub(crate) fn due(changed: f64, believed: f64) -> bool {
    changed >= MIN_CHANGES && changed >= CHANGED_SHARE * believed.max(0.0)
}

/// Stops the keeper when dropped (with the store that owns it).
pub(crate) struct Keeper {
    _stop: oneshot::Sender<()>,
    gate: Arc<Mutex<Option<UpkeepGate>>>,
}

impl Keeper {
    /// From now on a round runs only while `gate` answers true (the node holds the
    /// cluster's `statistics` lease): one node analyzing is enough.
    pub(crate) fn set_gate(&self, gate: UpkeepGate) {
        *self.gate.lock().unwrap_or_else(PoisonError::into_inner) = Some(gate);
    }
}

/// Starts the keeper on the current Tokio runtime.
pub(crate) fn spawn(pool: Pool) -> Keeper {
    let (stop_tx, mut stop) = oneshot::channel::<()>();
    let gate: Arc<Mutex<Option<UpkeepGate>>> = Arc::default();
    let keeper_gate = gate.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(CHECK_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = &mut stop => return,
                _ = tick.tick() => {}
            }
            let gate = keeper_gate.lock().unwrap_or_else(PoisonError::into_inner).clone();
            if gate.is_some_and(|g| !g()) {
                continue;
            }
            if let Err(e) = round(&pool).await {
                tracing::debug!(error = %e, "planner statistics: round skipped");
            }
        }
    });
    Keeper { _stop: stop_tx, gate }
}

/// One look at the tables, analyzing those that are due.
async fn round(pool: &Pool) -> Result<(), String> {
    let mut client = pool.get().await.map_err(|e| e.to_string())?;
    let tables: Vec<&str> = TABLES.to_vec();
    let rows = client.query(CHANGES, &[&tables]).await.map_err(|e| e.to_string())?;
    for row in rows {
        let read = |e: tokio_postgres::Error| e.to_string();
        let (table, changed, believed): (String, f64, f64) =
            (row.try_get(0).map_err(read)?, row.try_get(1).map_err(read)?, row.try_get(2).map_err(read)?);
        if !due(changed, believed) || !TABLES.contains(&table.as_str()) {
            continue;
        }
        // The name comes from our own list (checked just above), so it needs no quoting.
        let tx = client.transaction().await.map_err(|e| e.to_string())?;
        tx.batch_execute(&format!("SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'; ANALYZE {table}"))
            .await
            .map_err(|e| format!("ANALYZE {table}: {e}"))?;
        tx.commit().await.map_err(|e| e.to_string())?;
        tracing::debug!(table, changed, believed, "planner statistics: analyzed");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table that grows from nothing gets statistics from the store itself, within a few
    /// rounds, without autovacuum (switched off for the table here, so that only the
    /// keeper can be the one who analyzed it).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_table_that_grows_from_nothing_is_analyzed() {
        use onceprint_store::conformance::{new_task, NOW};
        use onceprint_store::{NewPrinter, NewStore, NewTenant, SetupAudit};
        let Some(h) = crate::testing::fresh_store().await else {
            return;
        };
        let (db, connection) = tokio_postgres::connect(&h.url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        db.batch_execute("ALTER TABLE tasks SET (autovacuum_enabled = false)").await.unwrap();
        let believed = || async {
            let row = db
                .query_one("SELECT reltuples::float8 FROM pg_class WHERE oid = 'tasks'::regclass", &[])
                .await
                .unwrap();
            row.get::<_, f64>(0)
        };
        assert!(believed().await < 0.0, "a new table has never been analyzed");

        let s = h.store.as_ref();
        s.create_tenant(NewTenant {
            id: "acme".into(),
            name: "a".into(),
            api_key_hash: "h".into(),
            now: NOW,
            api_key_id: "key-acme".into(),
            audit: SetupAudit::default(),
        })
        .await
        .unwrap();
        let shop = NewStore {
            tenant_id: "acme".into(),
            id: "s1".into(),
            name: "s".into(),
            timezone: "UTC".into(),
            now: NOW,
            audit: SetupAudit::default(),
        };
        s.create_store(shop).await.unwrap();
        let printer = NewPrinter {
            tenant_id: "acme".into(),
            id: "p1".into(),
            store_id: "s1".into(),
            name: "p".into(),
            transport: "{}".into(),
            credential: None,
            now: NOW,
            audit: SetupAudit::default(),
        };
        s.create_printer(printer).await.unwrap();
        let tasks: Vec<_> = (0..800u64).map(|n| new_task("acme", &format!("B{n}"), "x", n)).collect();
        s.submit_batch(tasks).await.unwrap();

        let deadline = tokio::time::Instant::now() + 10 * CHECK_EVERY;
        while believed().await < 800.0 {
            assert!(tokio::time::Instant::now() < deadline, "tasks never analyzed: {}", believed().await);
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        drop(db);
        drop(h);
    }

    #[test]
    fn a_table_is_analyzed_when_more_rows_changed_than_it_had() {
        assert!(!due(499.0, -1.0), "a few changes to a new table are not worth it");
        assert!(due(500.0, -1.0), "a new table that got rows is analyzed");
        assert!(due(500.0, 0.0));
        assert!(!due(1_999.0, 2_000.0));
        assert!(due(2_000.0, 2_000.0));
        assert!(!due(9_999.0, 10_000.0));
    }
}
