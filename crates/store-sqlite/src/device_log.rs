//! The device log digest for SQLite: store agents' latest journal record per task,
//! upserted on the writer thread and read back by task id range, or through the LAN task
//! ids merged into tasks, for reconciliation.

use onceprint_store::*;
use rusqlite::{params, Connection, Row};

use crate::backend_err;

/// The order of [`DeviceLogRecord::supersedes`] in SQL: a stronger state, or the same
/// state and a later `at`. Kept next to the Rust rule so the two cannot drift apart unnoticed;
/// the conformance suite checks they agree.
const UPSERT: &str = "
INSERT INTO device_log (tenant_id, store_id, task_id, key, printer_id, state, at, agent_id, received_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
ON CONFLICT (tenant_id, store_id, task_id) DO UPDATE SET
    key = excluded.key, printer_id = excluded.printer_id, state = excluded.state, at = excluded.at,
    agent_id = excluded.agent_id, received_at = excluded.received_at
WHERE (CASE excluded.state WHEN 'printed' THEN 2 WHEN 'in_doubt' THEN 1 ELSE 0 END)
         > (CASE device_log.state WHEN 'printed' THEN 2 WHEN 'in_doubt' THEN 1 ELSE 0 END)
   OR ((CASE excluded.state WHEN 'printed' THEN 2 WHEN 'in_doubt' THEN 1 ELSE 0 END)
         = (CASE device_log.state WHEN 'printed' THEN 2 WHEN 'in_doubt' THEN 1 ELSE 0 END)
       AND excluded.at > device_log.at)";

pub fn put_device_log(c: &Connection, records: &[DeviceLogRecord]) -> StoreResult<u64> {
    let mut upsert = c.prepare_cached(UPSERT).map_err(backend_err)?;
    let mut changed = 0u64;
    for r in DeviceLogRecord::latest_per_task(records) {
        // `execute` counts a row the conflict clause left alone as no change.
        changed += upsert
            .execute(params![
                r.tenant_id,
                r.store_id,
                r.task_id,
                r.key,
                r.printer_id,
                r.state.as_str(),
                r.at,
                r.agent_id,
                r.received_at
            ])
            .map_err(|e| crate::constraint_err(e, "device log record", &format!("store {:?}", r.store_id)))?
            as u64;
    }
    Ok(changed)
}

fn record_from_row(r: &Row<'_>) -> rusqlite::Result<DeviceLogRecord> {
    let state: String = r.get(5)?;
    Ok(DeviceLogRecord {
        tenant_id: r.get(0)?,
        store_id: r.get(1)?,
        task_id: r.get(2)?,
        key: r.get(3)?,
        printer_id: r.get(4)?,
        // Only this module writes the column, from a `DeviceLogState`; anything else is a
        // row written by other means, reported rather than guessed at.
        state: DeviceLogState::parse(&state).ok_or_else(|| {
            rusqlite::Error::FromSqlConversionFailure(
                5,
                rusqlite::types::Type::Text,
                format!("device_log.state {state:?} is not a device log state").into(),
            )
        })?,
        at: r.get(6)?,
        agent_id: r.get(7)?,
        received_at: r.get(8)?,
    })
}

pub fn device_log_of_aliases(
    c: &Connection,
    tenant_id: &str,
    store_id: &str,
    task_ids: &[String],
) -> StoreResult<Vec<DeviceLogRecord>> {
    if task_ids.is_empty() {
        return Ok(Vec::new());
    }
    let ids = serde_json::to_string(task_ids).map_err(|e| StoreError::Backend(e.to_string()))?;
    let mut s = c
        .prepare_cached(
            "SELECT d.tenant_id, d.store_id, a.task_id, d.key, d.printer_id, d.state, d.at, d.agent_id, d.received_at \
             FROM task_aliases a JOIN device_log d ON d.tenant_id = a.tenant_id AND d.task_id = a.alias_id \
             WHERE a.tenant_id = ?1 AND d.store_id = ?2 AND a.task_id IN (SELECT value FROM json_each(?3)) \
             ORDER BY a.task_id",
        )
        .map_err(backend_err)?;
    let rows = s.query_map(params![tenant_id, store_id, ids], record_from_row).map_err(backend_err)?;
    rows.collect::<rusqlite::Result<Vec<_>>>().map_err(backend_err)
}

pub fn device_log_between(
    c: &Connection,
    tenant_id: &str,
    store_id: &str,
    from_id: &str,
    to_id: &str,
) -> StoreResult<Vec<DeviceLogRecord>> {
    // A range of the primary key, in its order.
    let mut s = c
        .prepare_cached(
            "SELECT tenant_id, store_id, task_id, key, printer_id, state, at, agent_id, received_at FROM device_log \
             WHERE tenant_id = ?1 AND store_id = ?2 AND task_id >= ?3 AND task_id < ?4 ORDER BY task_id",
        )
        .map_err(backend_err)?;
    let rows = s.query_map(params![tenant_id, store_id, from_id, to_id], record_from_row).map_err(backend_err)?;
    rows.collect::<rusqlite::Result<Vec<_>>>().map_err(backend_err)
}
