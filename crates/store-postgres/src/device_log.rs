//! The device log digest for PostgreSQL: store agents' latest journal record per task,
//! upserted in one `unnest` statement and read back by task id range, or through the LAN
//! task ids merged into tasks, for reconciliation.

use onceprint_store::{DeviceLogRecord, DeviceLogState, StoreError, StoreResult};

use crate::error::{pg_error, violation, Violation};
use crate::rows::col;

/// The order of [`DeviceLogRecord::supersedes`] in SQL: a stronger state, or the same state
/// and a later `at`; the conformance suite checks that the two agree. The rows are sorted
/// by key, so that two uploads of overlapping records lock their rows in one order.
const UPSERT: &str = r#"
INSERT INTO device_log AS d (tenant_id, store_id, task_id, key, printer_id, state, at, agent_id, received_at)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::bigint[],
                     $8::text[], $9::bigint[])
ON CONFLICT (tenant_id, store_id, task_id) DO UPDATE SET
    key = EXCLUDED.key, printer_id = EXCLUDED.printer_id, state = EXCLUDED.state, at = EXCLUDED.at,
    agent_id = EXCLUDED.agent_id, received_at = EXCLUDED.received_at
WHERE (CASE EXCLUDED.state WHEN 'printed' THEN 2 WHEN 'in_doubt' THEN 1 ELSE 0 END)
         > (CASE d.state WHEN 'printed' THEN 2 WHEN 'in_doubt' THEN 1 ELSE 0 END)
   OR ((CASE EXCLUDED.state WHEN 'printed' THEN 2 WHEN 'in_doubt' THEN 1 ELSE 0 END)
         = (CASE d.state WHEN 'printed' THEN 2 WHEN 'in_doubt' THEN 1 ELSE 0 END)
       AND EXCLUDED.at > d.at)"#;

/// Through the primary key, in its order.
pub(crate) const BETWEEN: &str = "
SELECT tenant_id, store_id, task_id, key, printer_id, state, at, agent_id, received_at FROM device_log
WHERE tenant_id = $1 AND store_id = $2 AND task_id >= $3 AND task_id < $4
ORDER BY task_id";

pub(crate) async fn put_device_log(
    client: &deadpool_postgres::Client,
    records: &[DeviceLogRecord],
) -> StoreResult<u64> {
    // One statement must not name a row twice (ON CONFLICT DO UPDATE refuses that), so a
    // task's records are merged first by the same rule as the statement's.
    let mut rows = DeviceLogRecord::latest_per_task(records);
    rows.sort_by(|a, b| (&a.tenant_id, &a.store_id, &a.task_id).cmp(&(&b.tenant_id, &b.store_id, &b.task_id)));
    let text = |f: fn(&DeviceLogRecord) -> &str| rows.iter().map(f).collect::<Vec<&str>>();
    let (tenants, stores, tasks, keys, printers, agents) = (
        text(|r| &r.tenant_id),
        text(|r| &r.store_id),
        text(|r| &r.task_id),
        text(|r| &r.key),
        text(|r| &r.printer_id),
        text(|r| &r.agent_id),
    );
    let states: Vec<&str> = rows.iter().map(|r| r.state.as_str()).collect();
    let at: Vec<i64> = rows.iter().map(|r| r.at).collect();
    let received: Vec<i64> = rows.iter().map(|r| r.received_at).collect();
    let stmt = client.prepare_cached(UPSERT).await.map_err(pg_error)?;
    client
        .execute(&stmt, &[&tenants, &stores, &tasks, &keys, &printers, &states, &at, &agents, &received])
        .await
        .map_err(|e| match violation(&e) {
            Some(Violation::ForeignKey(_)) => StoreError::NotFound("store".into()),
            _ => pg_error(e),
        })
}

/// The records under the aliases of some tasks, each under the task's id.
const OF_ALIASES: &str = "
SELECT d.tenant_id, d.store_id, a.task_id, d.key, d.printer_id, d.state, d.at, d.agent_id, d.received_at
FROM task_aliases a JOIN device_log d ON d.tenant_id = a.tenant_id AND d.task_id = a.alias_id
WHERE a.tenant_id = $1 AND d.store_id = $2 AND a.task_id = ANY($3::text[])
ORDER BY a.task_id";

pub(crate) async fn device_log_of_aliases(
    client: &deadpool_postgres::Client,
    tenant_id: &str,
    store_id: &str,
    task_ids: &[String],
) -> StoreResult<Vec<DeviceLogRecord>> {
    if task_ids.is_empty() {
        return Ok(Vec::new());
    }
    let stmt = client.prepare_cached(OF_ALIASES).await.map_err(pg_error)?;
    let found = client.query(&stmt, &[&tenant_id, &store_id, &task_ids]).await.map_err(pg_error)?;
    found.iter().map(record).collect()
}

fn record(row: &tokio_postgres::Row) -> StoreResult<DeviceLogRecord> {
    let state: String = col(row, 5)?;
    Ok(DeviceLogRecord {
        tenant_id: col(row, 0)?,
        store_id: col(row, 1)?,
        task_id: col(row, 2)?,
        key: col(row, 3)?,
        printer_id: col(row, 4)?,
        state: DeviceLogState::parse(&state)
            .ok_or_else(|| StoreError::Backend(format!("unknown device log state {state:?} in the database")))?,
        at: col(row, 6)?,
        agent_id: col(row, 7)?,
        received_at: col(row, 8)?,
    })
}

pub(crate) async fn device_log_between(
    client: &deadpool_postgres::Client,
    tenant_id: &str,
    store_id: &str,
    from_id: &str,
    to_id: &str,
) -> StoreResult<Vec<DeviceLogRecord>> {
    let stmt = client.prepare_cached(BETWEEN).await.map_err(pg_error)?;
    let found = client.query(&stmt, &[&tenant_id, &store_id, &from_id, &to_id]).await.map_err(pg_error)?;
    found.iter().map(record).collect()
}
