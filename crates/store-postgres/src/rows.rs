//! Decoding of result rows into the store's models.
//!
//! Every column is read with `try_get`, so a row that does not match the expected shape
//! (a schema changed behind our back, a state spelling this version does not know)
//! becomes a [`StoreError::Backend`] instead of a panic in the broker.

use onceprint_core::TaskState;
use onceprint_store::{
    LedgerEntry, OriginKind, Printer, Station, StoreError, StoreResult, StoreRow, Task, TaskEvent, Tenant, Tombstone,
};
use tokio_postgres::types::FromSql;
use tokio_postgres::Row;

/// The task columns in the order [`task`] reads them. Content is left out on purpose: it
/// can be large and only [`onceprint_store::Store::task_content`] needs it.
pub(crate) const TASK_COLUMNS: &str = "id, tenant_id, store_id, printer_id, station_id, target, biz_no, \
     print_type, priority, content_type, fingerprint, state, attempts, last_error, next_attempt_at, \
     created_at, updated_at, printed_at, sent_to, sent_session, origin_task_id, origin_kind, reprint_no, \
     successor_task_id, sent_at, may_have_printed, refusals";

/// [`TASK_COLUMNS`] qualified with the alias `t`, for joins.
pub(crate) const TASK_COLUMNS_T: &str = "t.id, t.tenant_id, t.store_id, t.printer_id, t.station_id, t.target, \
     t.biz_no, t.print_type, t.priority, t.content_type, t.fingerprint, t.state, t.attempts, t.last_error, \
     t.next_attempt_at, t.created_at, t.updated_at, t.printed_at, t.sent_to, t.sent_session, t.origin_task_id, \
     t.origin_kind, t.reprint_no, t.successor_task_id, t.sent_at, t.may_have_printed, t.refusals";

/// A tombstone's columns qualified with the alias `b`, in the order [`tombstone`] reads
/// them: the task columns of [`task`] first (typed NULLs for the delivery bookkeeping a
/// tombstone does not keep), then its own.
pub(crate) const TOMBSTONE_COLUMNS_B: &str = "b.task_id, b.tenant_id, b.store_id, b.printer_id, b.station_id, \
     b.target, b.biz_no, b.print_type, b.priority, b.content_type, b.fingerprint, b.state, b.attempts, \
     b.last_error, NULL::int8, b.created_at, b.updated_at, b.printed_at, NULL::text, NULL::text, \
     b.origin_task_id, b.origin_kind, b.reprint_no, b.successor_task_id, NULL::int8, b.may_have_printed, 0::int4, \
     b.business_day, b.pruned_at";

/// The store columns in the order [`store`] reads them.
pub(crate) const STORE_COLUMNS: &str = "tenant_id, id, name, timezone, created_at";

/// The ledger columns in the order [`ledger_entry`] reads them.
pub(crate) const LEDGER_COLUMNS: &str = "task_id, tenant_id, kind, amount, at";

pub(crate) const PRINTER_COLUMNS: &str =
    "tenant_id, id, store_id, name, transport, online, last_seen_at, last_error, created_at, enabled, paused_since";

/// Reads column `idx`, turning a type mismatch into a backend error.
pub(crate) fn col<'a, T: FromSql<'a>>(row: &'a Row, idx: usize) -> StoreResult<T> {
    row.try_get(idx).map_err(|e| {
        let name = row.columns().get(idx).map(|c| c.name().to_owned()).unwrap_or_else(|| format!("#{idx}"));
        StoreError::Backend(format!("unexpected value in column {name}: {e}"))
    })
}

/// Parses a stored state spelling.
pub(crate) fn state(s: &str) -> StoreResult<TaskState> {
    TaskState::parse(s).ok_or_else(|| StoreError::Backend(format!("unknown task state {s:?} in the database")))
}

pub(crate) fn tombstone(row: &Row) -> StoreResult<Tombstone> {
    Ok(Tombstone { task: task(row)?, business_day: col(row, 27)?, pruned_at: col(row, 28)? })
}

pub(crate) fn task(row: &Row) -> StoreResult<Task> {
    Ok(Task {
        task_id: col(row, 0)?,
        tenant_id: col(row, 1)?,
        store_id: col(row, 2)?,
        printer_id: col(row, 3)?,
        station_id: col(row, 4)?,
        target: col(row, 5)?,
        biz_no: col(row, 6)?,
        print_type: col(row, 7)?,
        priority: col(row, 8)?,
        content_type: col(row, 9)?,
        fingerprint: col(row, 10)?,
        state: state(col(row, 11)?)?,
        attempts: col(row, 12)?,
        last_error: col(row, 13)?,
        next_attempt_at: col(row, 14)?,
        created_at: col(row, 15)?,
        updated_at: col(row, 16)?,
        printed_at: col(row, 17)?,
        sent_to: col(row, 18)?,
        sent_session: col(row, 19)?,
        origin_task_id: col(row, 20)?,
        // Informational only: a kind a newer broker wrote reads as none, as on SQLite,
        // rather than making the task unreadable.
        origin_kind: col::<Option<&str>>(row, 21)?.and_then(OriginKind::parse),
        reprint_no: col(row, 22)?,
        successor_task_id: col(row, 23)?,
        sent_at: col(row, 24)?,
        may_have_printed: col(row, 25)?,
        refusals: col(row, 26)?,
    })
}

/// Reads `id, name, created_at`.
pub(crate) fn tenant(row: &Row) -> StoreResult<Tenant> {
    Ok(Tenant { id: col(row, 0)?, name: col(row, 1)?, created_at: col(row, 2)? })
}

/// Reads [`STORE_COLUMNS`].
pub(crate) fn store(row: &Row) -> StoreResult<StoreRow> {
    Ok(StoreRow {
        tenant_id: col(row, 0)?,
        id: col(row, 1)?,
        name: col(row, 2)?,
        timezone: col(row, 3)?,
        created_at: col(row, 4)?,
    })
}

/// Reads [`LEDGER_COLUMNS`].
pub(crate) fn ledger_entry(row: &Row) -> StoreResult<LedgerEntry> {
    Ok(LedgerEntry {
        task_id: col(row, 0)?,
        tenant_id: col(row, 1)?,
        kind: col(row, 2)?,
        amount: col(row, 3)?,
        at: col(row, 4)?,
    })
}

/// Reads [`PRINTER_COLUMNS`].
pub(crate) fn printer(row: &Row) -> StoreResult<Printer> {
    Ok(Printer {
        tenant_id: col(row, 0)?,
        id: col(row, 1)?,
        store_id: col(row, 2)?,
        name: col(row, 3)?,
        transport: col(row, 4)?,
        online: col(row, 5)?,
        last_seen_at: col(row, 6)?,
        last_error: col(row, 7)?,
        created_at: col(row, 8)?,
        enabled: col(row, 9)?,
        paused_since: col(row, 10)?,
    })
}

/// Reads `tenant_id, id, store_id, printers, created_at, failover_after_ms`.
pub(crate) fn station(row: &Row) -> StoreResult<Station> {
    Ok(Station {
        tenant_id: col(row, 0)?,
        id: col(row, 1)?,
        store_id: col(row, 2)?,
        printers: col(row, 3)?,
        created_at: col(row, 4)?,
        failover_after_ms: col(row, 5)?,
    })
}

/// Reads `at, from_state, to_state, attempt, actor, reason` starting at column `first`.
pub(crate) fn event(row: &Row, first: usize) -> StoreResult<TaskEvent> {
    let from: Option<&str> = col(row, first + 1)?;
    Ok(TaskEvent {
        at: col(row, first)?,
        from: from.map(state).transpose()?,
        to: state(col(row, first + 2)?)?,
        attempt: col(row, first + 3)?,
        actor: col(row, first + 4)?,
        reason: col(row, first + 5)?,
    })
}
