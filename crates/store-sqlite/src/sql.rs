//! The SQL of the SQLite backend. Every function runs on a connection handed in by the
//! writer thread (inside its transaction and savepoint) or by the reader pool.

use std::collections::HashMap;

use onceprint_core::TaskState;
use onceprint_store::*;
use rusqlite::{params, Connection, OptionalExtension, Row, ToSql};

use crate::setup::{audit, check_station_printers, insert_api_key};
use crate::{backend_err, constraint_err};

/// The predicate of the partial index `tasks_lane` (migration 21), which a query must
/// repeat literally for SQLite to use the index. Written as comparisons rather than
/// `state IN (…)`: SQLite evaluates an `IN` list of three into a temporary B-tree, built
/// and dropped for the old and the new row of every insert and update of `tasks`.
pub(crate) const IN_LANE: &str = "(state = 'pending' OR state = 'sent' OR state = 'retrying')";

pub(crate) const TASK_COLS: &str =
    "id, tenant_id, store_id, printer_id, station_id, target, biz_no, print_type, priority, \
     content_type, fingerprint, state, attempts, last_error, next_attempt_at, created_at, updated_at, printed_at, \
     sent_to, sent_session, origin_task_id, origin_kind, reprint_no, successor_task_id, sent_at, may_have_printed, \
     refusals";

fn state_of(s: &str, col: usize) -> rusqlite::Result<TaskState> {
    TaskState::parse(s).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(
            col,
            rusqlite::types::Type::Text,
            format!("unknown state {s:?}").into(),
        )
    })
}

pub(crate) fn task_from_row(r: &Row<'_>) -> rusqlite::Result<Task> {
    let state: String = r.get(11)?;
    Ok(Task {
        task_id: r.get(0)?,
        tenant_id: r.get(1)?,
        store_id: r.get(2)?,
        printer_id: r.get(3)?,
        station_id: r.get(4)?,
        target: r.get(5)?,
        biz_no: r.get(6)?,
        print_type: r.get(7)?,
        priority: r.get(8)?,
        content_type: r.get(9)?,
        fingerprint: r.get(10)?,
        state: state_of(&state, 11)?,
        attempts: r.get(12)?,
        last_error: r.get(13)?,
        next_attempt_at: r.get(14)?,
        created_at: r.get(15)?,
        updated_at: r.get(16)?,
        printed_at: r.get(17)?,
        sent_to: r.get(18)?,
        sent_session: r.get(19)?,
        origin_task_id: r.get(20)?,
        origin_kind: r.get::<_, Option<String>>(21)?.and_then(|k| OriginKind::parse(&k)),
        reprint_no: r.get(22)?,
        successor_task_id: r.get(23)?,
        sent_at: r.get(24)?,
        may_have_printed: r.get(25)?,
        refusals: r.get(26)?,
    })
}

pub fn get_setting(c: &Connection, key: &str) -> StoreResult<Option<String>> {
    c.query_row("SELECT value FROM settings WHERE key = ?1", [key], |r| r.get(0)).optional().map_err(backend_err)
}

pub fn put_setting(c: &Connection, key: &str, value: &str) -> StoreResult<()> {
    c.execute(
        "INSERT INTO settings (key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        [key, value],
    )
    .map(|_| ())
    .map_err(backend_err)
}

pub fn create_tenant(c: &Connection, t: NewTenant) -> StoreResult<Tenant> {
    c.execute(
        "INSERT INTO tenants (id, name, api_key_hash, created_at) VALUES (?1, ?2, ?3, ?4)",
        params![t.id, t.name, t.api_key_hash, t.now],
    )
    .map_err(|e| constraint_err(e, &format!("tenant {}", t.id), "tenant"))?;
    insert_api_key(c, &t.id, &t.api_key_id, &t.api_key_hash, t.now)?;
    audit(c, &t.id, t.now, (SetupObject::Tenant, &t.id, SetupAction::Create), &t.audit)?;
    Ok(Tenant { id: t.id, name: t.name, created_at: t.now })
}

pub fn tenant_by_key_hash(c: &Connection, h: &str) -> StoreResult<Option<TenantKey>> {
    c.prepare_cached(
        "SELECT t.id, t.name, t.created_at, k.id FROM api_keys k JOIN tenants t ON t.id = k.tenant_id \
         WHERE k.key_hash = ?1 AND k.revoked_at IS NULL",
    )
    .and_then(|mut s| {
        s.query_row([h], |r| {
            Ok(TenantKey {
                tenant: Tenant { id: r.get(0)?, name: r.get(1)?, created_at: r.get(2)? },
                key_id: r.get(3)?,
            })
        })
        .optional()
    })
    .map_err(backend_err)
}

pub fn create_store(c: &Connection, s: NewStore) -> StoreResult<StoreRow> {
    c.execute(
        "INSERT INTO stores (tenant_id, id, name, timezone, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
        params![s.tenant_id, s.id, s.name, s.timezone, s.now],
    )
    .map_err(|e| constraint_err(e, &format!("store {}", s.id), &format!("tenant {}", s.tenant_id)))?;
    audit(c, &s.tenant_id, s.now, (SetupObject::Store, &s.id, SetupAction::Create), &s.audit)?;
    Ok(StoreRow { tenant_id: s.tenant_id, id: s.id, name: s.name, timezone: s.timezone, created_at: s.now })
}

fn store_from_row(r: &Row<'_>) -> rusqlite::Result<StoreRow> {
    Ok(StoreRow { tenant_id: r.get(0)?, id: r.get(1)?, name: r.get(2)?, created_at: r.get(3)?, timezone: r.get(4)? })
}

pub fn get_store(c: &Connection, t: &str, id: &str) -> StoreResult<Option<StoreRow>> {
    c.query_row(
        "SELECT tenant_id, id, name, created_at, timezone FROM stores WHERE tenant_id = ?1 AND id = ?2",
        [t, id],
        store_from_row,
    )
    .optional()
    .map_err(backend_err)
}

pub fn list_stores(c: &Connection, t: &str) -> StoreResult<Vec<StoreRow>> {
    let mut s = c
        .prepare_cached("SELECT tenant_id, id, name, created_at, timezone FROM stores WHERE tenant_id = ?1 ORDER BY id")
        .map_err(backend_err)?;
    let rows = s.query_map([t], store_from_row).map_err(backend_err)?;
    rows.collect::<rusqlite::Result<Vec<_>>>().map_err(backend_err)
}

const PRINTER_COLS: &str =
    "tenant_id, id, store_id, name, transport, online, last_seen_at, last_error, created_at, enabled, paused_since";

fn printer_from_row(r: &Row<'_>) -> rusqlite::Result<Printer> {
    Ok(Printer {
        tenant_id: r.get(0)?,
        id: r.get(1)?,
        store_id: r.get(2)?,
        name: r.get(3)?,
        transport: r.get(4)?,
        online: r.get(5)?,
        last_seen_at: r.get(6)?,
        last_error: r.get(7)?,
        created_at: r.get(8)?,
        enabled: r.get(9)?,
        paused_since: r.get(10)?,
    })
}

pub fn create_printer(c: &Connection, p: NewPrinter) -> StoreResult<Printer> {
    c.execute(
        "INSERT INTO printers (tenant_id, id, store_id, name, transport, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![p.tenant_id, p.id, p.store_id, p.name, p.transport, p.now],
    )
    .map_err(|e| constraint_err(e, &format!("printer {}", p.id), &format!("store {}", p.store_id)))?;
    if let Some(secret) = &p.credential {
        crate::setup::put_printer_secret(c, &p.tenant_id, &p.id, secret, p.now)?;
    }
    audit(c, &p.tenant_id, p.now, (SetupObject::Printer, &p.id, SetupAction::Create), &p.audit)?;
    Ok(Printer {
        tenant_id: p.tenant_id,
        id: p.id,
        store_id: p.store_id,
        name: p.name,
        transport: p.transport,
        enabled: true,
        online: false,
        last_seen_at: None,
        last_error: None,
        paused_since: None,
        created_at: p.now,
    })
}

pub fn get_printer(c: &Connection, t: &str, id: &str) -> StoreResult<Option<Printer>> {
    c.prepare_cached(&format!("SELECT {PRINTER_COLS} FROM printers WHERE tenant_id = ?1 AND id = ?2"))
        .and_then(|mut s| s.query_row([t, id], printer_from_row).optional())
        .map_err(backend_err)
}

pub fn list_printers(c: &Connection, t: &str, store: Option<&str>) -> StoreResult<Vec<Printer>> {
    let mut s = c
        .prepare_cached(&format!(
            "SELECT {PRINTER_COLS} FROM printers WHERE tenant_id = ?1 AND (?2 IS NULL OR store_id = ?2) ORDER BY id"
        ))
        .map_err(backend_err)?;
    let rows = s.query_map(params![t, store], printer_from_row).map_err(backend_err)?;
    rows.collect::<rusqlite::Result<Vec<_>>>().map_err(backend_err)
}

pub fn create_station(c: &Connection, s: NewStation) -> StoreResult<Station> {
    check_station_printers(c, &s.tenant_id, &s.printers)?;
    let printers = serde_json::to_string(&s.printers).map_err(|e| StoreError::Backend(e.to_string()))?;
    c.execute(
        "INSERT INTO stations (tenant_id, id, store_id, printers, created_at, failover_after_ms) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![s.tenant_id, s.id, s.store_id, printers, s.now, s.failover_after_ms],
    )
    .map_err(|e| constraint_err(e, &format!("station {}", s.id), &format!("store {}", s.store_id)))?;
    audit(c, &s.tenant_id, s.now, (SetupObject::Station, &s.id, SetupAction::Create), &s.audit)?;
    Ok(Station {
        tenant_id: s.tenant_id,
        id: s.id,
        store_id: s.store_id,
        printers: s.printers,
        failover_after_ms: s.failover_after_ms,
        created_at: s.now,
    })
}

pub fn get_station(c: &Connection, t: &str, id: &str) -> StoreResult<Option<Station>> {
    let row = c
        .query_row(
            "SELECT tenant_id, id, store_id, printers, created_at, failover_after_ms FROM stations \
             WHERE tenant_id = ?1 AND id = ?2",
            [t, id],
            |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                    r.get(4)?,
                    r.get(5)?,
                ))
            },
        )
        .optional()
        .map_err(backend_err)?;
    row.map(|(tenant_id, id, store_id, printers, created_at, failover_after_ms)| {
        let printers =
            serde_json::from_str(&printers).map_err(|e| StoreError::Backend(format!("station {id}: {e}")))?;
        Ok(Station { tenant_id, id, store_id, printers, failover_after_ms, created_at })
    })
    .transpose()
}

pub fn create_agent_token(c: &Connection, t: NewAgentToken) -> StoreResult<AgentToken> {
    let what = match t.kind {
        TokenKind::Agent => "agent token",
        TokenKind::Lan => "LAN key",
    };
    c.execute(
        "INSERT INTO agent_tokens (token_hash, tenant_id, store_id, created_at, id, kind) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![t.token_hash, t.tenant_id, t.store_id, t.now, t.id, t.kind.as_str()],
    )
    .map_err(|e| constraint_err(e, &format!("{what} {}", t.id), &format!("store {}", t.store_id)))?;
    audit(c, &t.tenant_id, t.now, (t.kind.setup_object(), &t.id, SetupAction::Create), &t.audit)?;
    Ok(AgentToken { tenant_id: t.tenant_id, store_id: t.store_id, id: t.id, created_at: t.now, revoked_at: None })
}

pub fn agent_by_token_hash(c: &Connection, h: &str) -> StoreResult<Option<AgentIdentity>> {
    c.prepare_cached(
        "SELECT tenant_id, store_id FROM agent_tokens WHERE token_hash = ?1 AND revoked_at IS NULL AND kind = 'agent'",
    )
    .and_then(|mut s| s.query_row([h], |r| Ok(AgentIdentity { tenant_id: r.get(0)?, store_id: r.get(1)? })).optional())
    .map_err(backend_err)
}

type KeyRef<'a> = (&'a str, &'a str, &'a str, &'a str);

pub fn submit_batch(c: &Connection, batch: Vec<NewTask>) -> StoreResult<Vec<SubmitOutcome>> {
    let mut insert_task = c
        .prepare_cached(
            "INSERT INTO tasks (id, tenant_id, store_id, printer_id, station_id, target, biz_no, print_type, priority, \
             content_type, content, fingerprint, state, attempts, created_at, updated_at, \
             origin_task_id, origin_kind, reprint_no, seq) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, 'pending', 0, ?13, ?13, ?14, ?15, ?16, ?17) \
             ON CONFLICT (tenant_id, target, biz_no, print_type) DO NOTHING",
        )
        .map_err(backend_err)?;
    let mut tombstones = crate::retention::TombstoneByKey::prepare(c)?;

    // The lane order (migration 14): every inserted task takes the next value of the
    // counter. This runs on the writer thread, the only one that inserts tasks, so reading
    // the counter once and writing it back once per batch cannot interleave with another
    // insert.
    let mut last_seq: i64 = c
        .prepare_cached("SELECT last FROM task_seq")
        .and_then(|mut s| s.query_row([], |r| r.get(0)))
        .map_err(backend_err)?;
    let first_seq = last_seq;
    // For each submission, the index of an earlier one of this batch with the same key.
    // Found before the loop, so that the loop can consume the submissions.
    let earlier: Vec<Option<usize>> = {
        let mut seen: HashMap<KeyRef<'_>, usize> = HashMap::with_capacity(batch.len());
        batch
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let key = (t.tenant_id.as_str(), t.target.as_str(), t.biz_no.as_str(), t.print_type.as_str());
                seen.get(&key).copied().or_else(|| {
                    seen.insert(key, i);
                    None
                })
            })
            .collect()
    };
    let mut out: Vec<SubmitOutcome> = Vec::with_capacity(batch.len());
    let mut created: Vec<Created> = Vec::with_capacity(batch.len());
    for (t, earlier) in batch.into_iter().zip(earlier) {
        if let Some(first) = earlier {
            out.push(out[first].repeat());
            continue;
        }
        // A pruned task keeps its key in its tombstone: a late replay is answered with it
        // and creates nothing. (The writer thread runs prunes too, so no prune can slip in
        // between this look and the insert.)
        if let Some(tombstone) = tombstones.find(&t.tenant_id, &t.target, &t.biz_no, &t.print_type)? {
            out.push(SubmitOutcome::Pruned(tombstone));
            continue;
        }
        let inserted = insert_task
            .execute(params![
                t.task_id,
                t.tenant_id,
                t.store_id,
                t.printer_id,
                t.station_id,
                t.target,
                t.biz_no,
                t.print_type,
                t.priority,
                t.content_type,
                t.content,
                t.fingerprint,
                t.now,
                t.origin.as_ref().map(|o| o.task_id.as_str()),
                t.origin.as_ref().map(|o| o.kind.as_str()),
                t.origin.as_ref().and_then(|o| o.reprint_no),
                last_seq + 1
            ])
            .map_err(|e| constraint_err(e, &format!("task {}", t.task_id), &format!("printer {}", t.printer_id)))?;
        if inserted == 1 {
            last_seq += 1;
            let mut t = t;
            let reason = t.origin.as_mut().map_or_else(|| "submitted".to_owned(), |o| std::mem::take(&mut o.reason));
            created.push(Created { at: out.len(), actor: std::mem::take(&mut t.actor), reason, charge: t.charge });
            out.push(SubmitOutcome::Created(t.into_created_task()));
        } else {
            let existing = find_task(c, &t.tenant_id, &t.target, &t.biz_no, &t.print_type)?.ok_or_else(|| {
                StoreError::Backend(format!("task key of {} conflicted but no row was found", t.task_id))
            })?;
            out.push(SubmitOutcome::Existing(existing));
        }
    }
    if last_seq != first_seq {
        c.prepare_cached("UPDATE task_seq SET last = ?1")
            .and_then(|mut s| s.execute([last_seq]))
            .map_err(backend_err)?;
    }
    // Each created task's audit event and ledger charge, several rows per statement: one
    // statement per row cost the writer thread (intake's bottleneck) a cursor opened and
    // closed per table and row.
    let task_of = |x: &Created| match &out[x.at] {
        SubmitOutcome::Created(t) => Ok(t),
        _ => Err(StoreError::Backend("intake lost track of a created task".into())),
    };
    let mut events: Vec<(&Task, &Created)> = Vec::with_capacity(created.len());
    for x in &created {
        events.push((task_of(x)?, x));
    }
    insert_rows(
        c,
        "INSERT INTO task_events (task_id, at, from_state, to_state, attempt, actor, reason) VALUES ",
        "(?, ?, NULL, 'pending', 0, ?, ?)",
        &events,
        |(t, x), p| p.extend([&t.task_id as &dyn ToSql, &t.created_at, &x.actor, &x.reason]),
    )?;
    let charges: Vec<(&Task, &Created)> = events.iter().copied().filter(|(_, x)| x.charge != 0).collect();
    insert_rows(
        c,
        "INSERT INTO ledger (tenant_id, task_id, kind, amount, at) VALUES ",
        "(?, ?, 'charge', ?, ?)",
        &charges,
        |(t, x), p| p.extend([&t.tenant_id as &dyn ToSql, &t.task_id, &x.charge, &t.created_at]),
    )?;
    Ok(out)
}

/// What a created task still needs written after its row: its audit event and charge.
struct Created {
    /// Its index in the outcomes (the task row as created).
    at: usize,
    actor: String,
    reason: String,
    charge: i64,
}

/// Inserts `rows` with `head` followed by one `values` group per row, up to 64 rows per
/// statement. Statements for 64, 16, 4 and 1 rows are prepared once and cached, so a
/// batch of n rows takes at most n/64 + 3 + 3 + 3 statements.
fn insert_rows<T>(
    c: &Connection,
    head: &str,
    values: &str,
    rows: &[T],
    bind: impl for<'a> Fn(&'a T, &mut Vec<&'a dyn ToSql>),
) -> StoreResult<()> {
    let mut rest = rows;
    while !rest.is_empty() {
        let n = [64, 16, 4, 1].into_iter().find(|&n| n <= rest.len()).unwrap_or(1);
        let (chunk, tail) = rest.split_at(n);
        let mut sql = String::with_capacity(head.len() + n * (values.len() + 2));
        sql.push_str(head);
        for i in 0..n {
            if i > 0 {
                sql.push_str(", ");
            }
            sql.push_str(values);
        }
        let mut params: Vec<&dyn ToSql> = Vec::with_capacity(n * 4);
        for row in chunk {
            bind(row, &mut params);
        }
        c.prepare_cached(&sql).and_then(|mut s| s.execute(&*params)).map_err(backend_err)?;
        rest = tail;
    }
    Ok(())
}

/// Gives the waiting tasks that have no lane `seq` one, in id order behind every other
/// task: tasks a broker older than migration 13 inserted after a downgrade (it knew no
/// `seq` and ordered by id itself). Finished tasks are never ordered and keep none. Reads
/// the lane index only, so it costs nothing with no such task. Runs once, at open.
pub fn sequence_unnumbered_tasks(c: &Connection) -> StoreResult<usize> {
    let ids: Vec<String> = c
        .prepare(&format!("SELECT id FROM tasks INDEXED BY tasks_lane WHERE {IN_LANE} AND seq IS NULL ORDER BY id"))
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .map_err(backend_err)?;
    for id in &ids {
        c.execute_batch("UPDATE task_seq SET last = last + 1").map_err(backend_err)?;
        c.execute("UPDATE tasks SET seq = (SELECT last FROM task_seq) WHERE id = ?1", [id]).map_err(backend_err)?;
    }
    Ok(ids.len())
}

pub fn get_task(c: &Connection, t: &str, id: &str) -> StoreResult<Option<Task>> {
    c.prepare_cached(&format!("SELECT {TASK_COLS} FROM tasks WHERE id = ?1 AND tenant_id = ?2"))
        .and_then(|mut s| s.query_row([id, t], task_from_row).optional())
        .map_err(backend_err)
}

pub fn find_task(
    c: &Connection,
    tenant: &str,
    target: &str,
    biz_no: &str,
    print_type: &str,
) -> StoreResult<Option<Task>> {
    c.prepare_cached(&format!(
        "SELECT {TASK_COLS} FROM tasks WHERE tenant_id = ?1 AND target = ?2 AND biz_no = ?3 AND print_type = ?4"
    ))
    .and_then(|mut s| s.query_row([tenant, target, biz_no, print_type], task_from_row).optional())
    .map_err(backend_err)
}

pub fn task_content(c: &Connection, id: &str) -> StoreResult<Option<TaskContent>> {
    c.query_row("SELECT content_type, content FROM tasks WHERE id = ?1", [id], |r| {
        Ok(TaskContent { content_type: r.get(0)?, content: r.get(1)? })
    })
    .optional()
    .map_err(backend_err)
}

pub fn list_tasks(c: &Connection, q: &TaskQuery) -> StoreResult<Vec<Task>> {
    // One statement per combination of filters (each cached once per connection) instead
    // of `?n IS NULL OR …`, which SQLite cannot plan around: with it every list walked the
    // tenant's whole index, so a store's list, or a search by `biz_no`, read every task of
    // the tenant before the page was full (a second per call with a million finished
    // tasks). Now a store's list walks `tasks_by_store` (for one state too, checking each
    // row), a printer's `tasks_by_printer`, and a `biz_no` search `tasks_by_biz_no`, as on
    // PostgreSQL.
    let state = q.state.map(TaskState::as_str);
    let upper = q.biz_no_prefix.as_deref().and_then(onceprint_store::prefix_upper_bound);
    // A prefix search reads the range of `tasks_by_biz_no` that starts with the prefix,
    // named so that the planner does not walk a whole store by id instead (which it may
    // prefer for a store's list and a small limit) and read every task of it for a rare
    // prefix. Its matches are then sorted by id: as many as start with the prefix.
    let index = if q.biz_no_prefix.is_some() { " INDEXED BY tasks_by_biz_no" } else { "" };
    let mut sql = format!("SELECT {TASK_COLS} FROM tasks{index} WHERE tenant_id = ?1");
    let mut args: Vec<&dyn rusqlite::ToSql> = vec![&q.tenant_id];
    if let Some(store) = &q.store_id {
        args.push(store);
        sql.push_str(&format!(" AND store_id = ?{}", args.len()));
    }
    if let Some(state) = &state {
        args.push(state);
        sql.push_str(&format!(" AND state = ?{}", args.len()));
    }
    if let Some(biz_no) = &q.biz_no {
        args.push(biz_no);
        sql.push_str(&format!(" AND biz_no = ?{}", args.len()));
    }
    if let Some(prefix) = &q.biz_no_prefix {
        args.push(prefix);
        sql.push_str(&format!(" AND biz_no >= ?{}", args.len()));
        if let Some(upper) = &upper {
            args.push(upper);
            sql.push_str(&format!(" AND biz_no < ?{}", args.len()));
        }
    }
    if let Some(printer) = &q.printer_id {
        args.push(printer);
        sql.push_str(&format!(" AND printer_id = ?{}", args.len()));
    }
    if let Some(print_type) = &q.print_type {
        args.push(print_type);
        sql.push_str(&format!(" AND print_type = ?{}", args.len()));
    }
    for (bound, op) in [(&q.id_from, ">="), (&q.id_to, "<"), (&q.cursor, "<"), (&q.after, ">")] {
        if let Some(id) = bound {
            args.push(id);
            sql.push_str(&format!(" AND id {op} ?{}", args.len()));
        }
    }
    args.push(&q.limit);
    // The page before a cursor is the tasks just above it: read upwards from it, then
    // turned round so that every page is newest first.
    let order = if q.after.is_some() { "ASC" } else { "DESC" };
    sql.push_str(&format!(" ORDER BY id {order} LIMIT ?{}", args.len()));
    let mut s = c.prepare_cached(&sql).map_err(backend_err)?;
    let rows = s.query_map(args.as_slice(), task_from_row).map_err(backend_err)?;
    let mut tasks = rows.collect::<rusqlite::Result<Vec<_>>>().map_err(backend_err)?;
    if q.after.is_some() {
        tasks.reverse();
    }
    Ok(tasks)
}

pub fn task_events(c: &Connection, t: &str, id: &str) -> StoreResult<Option<Vec<TaskEvent>>> {
    if get_task(c, t, id)?.is_none() {
        return Ok(None);
    }
    let mut s = c
        .prepare_cached(
            "SELECT at, from_state, to_state, attempt, actor, reason FROM task_events WHERE task_id = ?1 ORDER BY id",
        )
        .map_err(backend_err)?;
    let rows = s
        .query_map([id], |r| {
            let from: Option<String> = r.get(1)?;
            let to: String = r.get(2)?;
            Ok(TaskEvent {
                at: r.get(0)?,
                from: from.map(|f| state_of(&f, 1)).transpose()?,
                to: state_of(&to, 2)?,
                attempt: r.get(3)?,
                actor: r.get(4)?,
                reason: r.get(5)?,
            })
        })
        .map_err(backend_err)?;
    rows.collect::<rusqlite::Result<Vec<_>>>().map(Some).map_err(backend_err)
}

pub fn ledger_entries(c: &Connection, id: &str) -> StoreResult<Vec<LedgerEntry>> {
    let mut s = c
        .prepare_cached("SELECT task_id, tenant_id, kind, amount, at FROM ledger WHERE task_id = ?1 ORDER BY kind")
        .map_err(backend_err)?;
    let rows = s
        .query_map([id], |r| {
            Ok(LedgerEntry {
                task_id: r.get(0)?,
                tenant_id: r.get(1)?,
                kind: r.get(2)?,
                amount: r.get(3)?,
                at: r.get(4)?,
            })
        })
        .map_err(backend_err)?;
    rows.collect::<rusqlite::Result<Vec<_>>>().map_err(backend_err)
}

pub fn count_by_state(c: &Connection) -> StoreResult<Vec<(TaskState, i64)>> {
    let mut s = c.prepare_cached("SELECT state, COUNT(*) FROM tasks GROUP BY state").map_err(backend_err)?;
    let rows = s
        .query_map([], |r| {
            let st: String = r.get(0)?;
            Ok((state_of(&st, 0)?, r.get(1)?))
        })
        .map_err(backend_err)?;
    rows.collect::<rusqlite::Result<Vec<_>>>().map_err(backend_err)
}

pub fn transition(c: &Connection, t: &Transition) -> StoreResult<bool> {
    let updated = c
        .prepare_cached(
            "UPDATE tasks SET state = ?1, attempts = ?2, last_error = ?3, next_attempt_at = ?4, updated_at = ?5, \
             printed_at = CASE WHEN ?1 = 'printed' THEN ?5 ELSE printed_at END, sent_to = ?9, sent_session = ?10, \
             sent_at = CASE WHEN ?1 = 'sent' AND ?7 <> 'sent' THEN ?5 ELSE sent_at END, \
             may_have_printed = may_have_printed OR ?11, refusals = refusals + ?12 \
             WHERE id = ?6 AND state = ?7 AND attempts = ?8",
        )
        .and_then(|mut s| {
            s.execute(params![
                t.to.as_str(),
                t.attempts,
                t.last_error,
                t.next_attempt_at,
                t.now,
                t.task_id,
                t.from.as_str(),
                t.expected_attempts,
                t.sent_to,
                t.sent_session,
                t.may_have_printed,
                i32::from(t.refused)
            ])
        });
    let changed = match updated {
        Ok(n) => n,
        // The partial unique index refused a second task in flight on this printer: the
        // statement is undone, the transaction goes on, and the change did not apply.
        Err(rusqlite::Error::SqliteFailure(f, _)) if f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE => 0,
        Err(e) => return Err(backend_err(e)),
    };
    if changed != 1 {
        return Ok(false);
    }
    c.prepare_cached(
        "INSERT INTO task_events (task_id, at, from_state, to_state, attempt, actor, reason) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )
    .and_then(|mut s| {
        s.execute(params![t.task_id, t.now, t.from.as_str(), t.to.as_str(), t.attempts, t.actor, t.reason])
    })
    .map_err(backend_err)?;
    if let Some(e) = &t.event {
        insert_event(c, e)?;
    }
    Ok(true)
}

/// Writes an alert to the outbox and fans it out to the tenant's endpoints that want it,
/// in the caller's transaction. An alert no endpoint wants is not written: the outbox is
/// only ever read through its deliveries, and a `task.printed` row for every task would
/// be a write per print for nobody.
fn insert_event(c: &Connection, e: &OutboxEvent) -> StoreResult<()> {
    let wanted = c
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM webhooks w, json_each(w.events) k WHERE w.tenant_id = ?1 AND k.value = ?2)",
        )
        .and_then(|mut s| s.query_row(params![e.tenant_id, e.kind], |r| r.get::<_, bool>(0)))
        .map_err(backend_err)?;
    if !wanted {
        return Ok(());
    }
    c.prepare_cached("INSERT INTO outbox (event_id, tenant_id, kind, payload, created_at) VALUES (?1, ?2, ?3, ?4, ?5)")
        .and_then(|mut s| s.execute(params![e.event_id, e.tenant_id, e.kind, e.payload, e.now]))
        .map_err(backend_err)?;
    c.prepare_cached(
        "INSERT INTO webhook_deliveries (event_id, webhook_id, tenant_id, next_attempt_at, created_at) \
         SELECT DISTINCT ?1, w.id, w.tenant_id, ?4, ?4 FROM webhooks w, json_each(w.events) k \
         WHERE w.tenant_id = ?2 AND k.value = ?3",
    )
    .and_then(|mut s| s.execute(params![e.event_id, e.tenant_id, e.kind, e.now]))
    .map_err(backend_err)?;
    Ok(())
}

pub fn apply_transitions(c: &Connection, changes: &[Transition]) -> StoreResult<Vec<bool>> {
    changes.iter().map(|t| transition(c, t)).collect()
}

/// The task in flight (through the partial unique index `tasks_one_in_flight_per_printer`)
/// and, for a printer with nothing in flight, the first waiting task (through
/// `tasks_lane`, whose predicate the query repeats literally; `<> 'sent'` then skips at
/// most the one row in flight) of each printer in `printers`, a condition on the printers
/// table `p`. The waiting task of a busy lane is not read: nothing but its task in flight
/// can move while it is busy.
fn lanes_where(c: &Connection, printers: &str, args: &[&str]) -> StoreResult<Vec<Lane>> {
    // One task per printer: `COALESCE` evaluates its second probe only when the first
    // found nothing, so a busy lane costs one index probe.
    let mut s = c
        .prepare_cached(&format!(
            "SELECT {TASK_COLS} FROM tasks WHERE id IN ( \
               SELECT COALESCE( \
                 (SELECT u.id FROM tasks u \
                  WHERE u.tenant_id = p.tenant_id AND u.printer_id = p.id AND u.state = 'sent'), \
                 (SELECT u.id FROM tasks u \
                  WHERE u.tenant_id = p.tenant_id AND u.printer_id = p.id \
                    AND {IN_LANE} AND u.state <> 'sent' \
                  ORDER BY u.priority, u.seq LIMIT 1)) \
               FROM printers p WHERE {printers})"
        ))
        .map_err(backend_err)?;
    let rows = s.query_map(rusqlite::params_from_iter(args), task_from_row).map_err(backend_err)?;
    let tasks = rows.collect::<rusqlite::Result<Vec<_>>>().map_err(backend_err)?;
    Ok(group_lanes(tasks))
}

/// Groups the tasks of [`lanes_where`] by printer, the one in `sent` as in flight (in the
/// order of printer ids; a store's hundreds of lanes in one pass, not one search each).
fn group_lanes(mut tasks: Vec<Task>) -> Vec<Lane> {
    tasks.sort_by(|a, b| a.printer_id.cmp(&b.printer_id));
    let mut lanes: Vec<Lane> = Vec::new();
    for t in tasks {
        if lanes.last().is_none_or(|l| l.printer_id != t.printer_id) {
            lanes.push(Lane { printer_id: t.printer_id.clone(), in_flight: None, waiting: None });
        }
        let Some(lane) = lanes.last_mut() else { continue };
        if t.state == TaskState::Sent {
            lane.in_flight = Some(t);
        } else {
            lane.waiting = Some(t);
        }
    }
    lanes
}

pub fn lanes(c: &Connection, tenant: &str, store: &str, kind: &str) -> StoreResult<Vec<Lane>> {
    lanes_where(
        c,
        "p.tenant_id = ?1 AND p.store_id = ?2 AND json_extract(p.transport, '$.kind') = ?3",
        &[tenant, store, kind],
    )
}

pub fn lane(c: &Connection, tenant: &str, printer: &str) -> StoreResult<Lane> {
    let found = lanes_where(c, "p.tenant_id = ?1 AND p.id = ?2", &[tenant, printer])?;
    Ok(found.into_iter().next().unwrap_or(Lane { printer_id: printer.to_owned(), in_flight: None, waiting: None }))
}

/// The first waiting task of each of `printers` (a JSON array of printer ids) that has
/// one, by the same probe of `tasks_lane` as [`lanes_where`]'s second, whatever is in
/// flight.
pub fn lane_heads(c: &Connection, tenant: &str, printers: &[String]) -> StoreResult<Vec<Task>> {
    let ids = serde_json::to_string(printers).map_err(|e| StoreError::Backend(e.to_string()))?;
    let mut s = c
        .prepare_cached(&format!(
            "SELECT {TASK_COLS} FROM tasks WHERE id IN ( \
               SELECT (SELECT u.id FROM tasks u \
                       WHERE u.tenant_id = p.tenant_id AND u.printer_id = p.id \
                         AND {IN_LANE} AND u.state <> 'sent' \
                       ORDER BY u.priority, u.seq LIMIT 1) \
               FROM printers p WHERE p.tenant_id = ?1 AND p.id IN (SELECT value FROM json_each(?2))) \
             ORDER BY printer_id"
        ))
        .map_err(backend_err)?;
    let rows = s.query_map(params![tenant, ids], task_from_row).map_err(backend_err)?;
    rows.collect::<rusqlite::Result<Vec<_>>>().map_err(backend_err)
}

/// See `Store::read_for_acks`: the three reads on one connection, inside the caller's
/// transaction (the writer's, or a read transaction of a reader), so that one snapshot
/// serves them.
pub fn read_for_acks(c: &Connection, tenant: &str, task_ids: &[String], with_heads: bool) -> StoreResult<AckRead> {
    let tasks = get_tasks(c, tenant, task_ids)?;
    let printers = if with_heads { AckRead::printers_in_flight(&tasks) } else { Vec::new() };
    let heads = if printers.is_empty() { Vec::new() } else { lane_heads(c, tenant, &printers)? };
    let ids: Vec<String> = heads.iter().map(|t| t.task_id.clone()).collect();
    let contents = if ids.is_empty() { Vec::new() } else { task_contents(c, &ids)? };
    Ok(AckRead { tasks, heads, contents })
}

pub fn lane_stats(c: &Connection) -> StoreResult<Vec<LaneStats>> {
    let mut s = c
        .prepare_cached(
            // A covering walk of `tasks_lane` (migration 15), already in lane order: no
            // table lookups and no sort of the active tasks, only of the lanes. A printer
            // belongs to one store, so grouping by printer groups by store too. Without
            // `INDEXED BY` SQLite takes `tasks_due` for the states, and sorts.
            &format!(
                "SELECT tenant_id, MIN(store_id), printer_id, SUM(state <> 'sent'), \
                        MIN(CASE WHEN state <> 'sent' THEN created_at END), \
                        MIN(CASE WHEN state = 'sent' THEN sent_at END) \
                 FROM tasks INDEXED BY tasks_lane WHERE {IN_LANE} \
                 GROUP BY tenant_id, printer_id ORDER BY 1, 2, 3"
            ),
        )
        .map_err(backend_err)?;
    let rows = s
        .query_map([], |r| {
            Ok(LaneStats {
                tenant_id: r.get(0)?,
                store_id: r.get(1)?,
                printer_id: r.get(2)?,
                waiting: r.get(3)?,
                oldest_waiting_at: r.get(4)?,
                in_flight_since: r.get(5)?,
            })
        })
        .map_err(backend_err)?;
    rows.collect::<rusqlite::Result<Vec<_>>>().map_err(backend_err)
}

pub fn max_task_id(c: &Connection) -> StoreResult<Option<String>> {
    c.query_row("SELECT MAX(id) FROM tasks", [], |r| r.get(0)).map_err(backend_err)
}

pub fn record_alert(c: &Connection, e: &OutboxEvent) -> StoreResult<()> {
    insert_event(c, e)
}

/// See `Store::waiting_on_paused_printers`: the paused printers through
/// `printers_paused` (migration 22), each lane's waiting tasks through `tasks_lane` (its
/// predicate repeated, so the planner can use it).
pub fn waiting_on_paused_printers(c: &Connection, limit: i64) -> StoreResult<Vec<PausedWait>> {
    let mut s = c
        .prepare_cached(&format!(
            "SELECT {TASK_COLS}, pp.paused_since, pp.printer_state FROM                (SELECT tenant_id AS p_tenant, id AS p_id, paused_since, last_error AS printer_state                 FROM printers INDEXED BY printers_paused WHERE paused_since IS NOT NULL) pp              JOIN tasks ON tasks.tenant_id = pp.p_tenant AND tasks.printer_id = pp.p_id              WHERE {IN_LANE} AND state <> 'sent'              ORDER BY pp.p_tenant, pp.p_id, priority, seq LIMIT ?1"
        ))
        .map_err(backend_err)?;
    let rows = s
        .query_map(params![limit.max(0)], |r| {
            Ok(PausedWait { task: task_from_row(r)?, paused_since: r.get(27)?, printer_state: r.get(28)? })
        })
        .map_err(backend_err)?;
    rows.collect::<rusqlite::Result<Vec<_>>>().map_err(backend_err)
}

pub fn due_tasks(c: &Connection, state: TaskState, now: i64, limit: i64) -> StoreResult<Vec<Task>> {
    let mut s = c
        .prepare_cached(&format!(
            "SELECT {TASK_COLS} FROM tasks WHERE state = ?1 AND next_attempt_at <= ?2 ORDER BY next_attempt_at LIMIT ?3"
        ))
        .map_err(backend_err)?;
    let rows = s.query_map(params![state.as_str(), now, limit], task_from_row).map_err(backend_err)?;
    rows.collect::<rusqlite::Result<Vec<_>>>().map_err(backend_err)
}

/// Applies printer reports one after the other. Each writes `printer.online` /
/// `printer.offline` when `online` flips and `printer.paused` / `printer.resumed` when the
/// printer's pausing state flips ([`pauses_lane`]); a printer that stops pausing has its
/// waiting retries made due now, so the lane moves at once instead of at its next
/// scheduled status check.
pub fn update_printer_status(c: &Connection, updates: &[PrinterStatusUpdate]) -> StoreResult<()> {
    for u in updates {
        let before: Option<(bool, Option<String>, Option<i64>)> = c
            .prepare_cached("SELECT online, last_error, paused_since FROM printers WHERE tenant_id = ?1 AND id = ?2")
            .and_then(|mut s| {
                s.query_row([&u.tenant_id, &u.printer_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).optional()
            })
            .map_err(backend_err)?;
        let Some((was_online, was_error, was_since)) = before else { continue };
        let was_paused = pauses_lane(was_error.as_deref());
        let paused = pauses_lane(u.last_error.as_deref());
        let since = match (was_paused, paused) {
            (_, false) => None,
            (true, true) => was_since.or(Some(u.now)),
            (false, true) => Some(u.now),
        };
        c.prepare_cached(
            "UPDATE printers SET online = ?1, last_seen_at = ?2, last_error = ?3, paused_since = ?6 \
             WHERE tenant_id = ?4 AND id = ?5",
        )
        .and_then(|mut s| s.execute(params![u.online, u.now, u.last_error, u.tenant_id, u.printer_id, since]))
        .map_err(backend_err)?;
        if was_online != u.online {
            let kind = if u.online { "printer.online" } else { "printer.offline" };
            let payload = serde_json::json!({
                "id": u.event_id, "type": kind, "created_at_ms": u.now, "tenant_id": u.tenant_id,
                "data": {"printer_id": u.printer_id, "online": u.online, "last_error": u.last_error},
            });
            insert_event(
                c,
                &OutboxEvent {
                    event_id: u.event_id.clone(),
                    tenant_id: u.tenant_id.clone(),
                    kind: kind.into(),
                    payload: payload.to_string(),
                    now: u.now,
                },
            )?;
        }
        if was_paused != paused {
            let (event_id, kind, payload) = u.pause_event();
            insert_event(
                c,
                &OutboxEvent { event_id, tenant_id: u.tenant_id.clone(), kind: kind.into(), payload, now: u.now },
            )?;
        }
        if was_paused && !paused {
            c.prepare_cached(
                "UPDATE tasks SET next_attempt_at = ?3 \
                 WHERE tenant_id = ?1 AND printer_id = ?2 AND state = 'retrying' AND next_attempt_at > ?3 \
                 AND last_error IN ('no_paper', 'cover_open', 'paper_jam', 'offline')",
            )
            .and_then(|mut s| s.execute(params![u.tenant_id, u.printer_id, u.now]))
            .map_err(backend_err)?;
        }
    }
    Ok(())
}

pub fn apply_manual(c: &Connection, m: &ManualChange) -> StoreResult<bool> {
    // The whole change under a savepoint of its own: when a later transition of the chain
    // does not apply, the earlier ones are undone with it.
    c.execute_batch("SAVEPOINT manual").map_err(backend_err)?;
    match apply_manual_steps(c, m) {
        Ok(true) => {
            c.execute_batch("RELEASE manual").map_err(backend_err)?;
            Ok(true)
        }
        other => {
            c.execute_batch("ROLLBACK TO manual; RELEASE manual").map_err(backend_err)?;
            other
        }
    }
}

fn apply_manual_steps(c: &Connection, m: &ManualChange) -> StoreResult<bool> {
    for t in &m.transitions {
        if !transition(c, t)? {
            return Ok(false);
        }
    }
    if let Some(charged) = &m.refund {
        // The refund copies the charge; the ledger's key (task, kind) makes a second refund
        // impossible even if an operator manages to ask twice.
        c.prepare_cached(
            "INSERT INTO ledger (tenant_id, task_id, kind, amount, at) \
             SELECT tenant_id, task_id, 'refund', amount, ?2 FROM ledger WHERE task_id = ?1 AND kind = 'charge' \
             ON CONFLICT (task_id, kind) DO NOTHING",
        )
        .and_then(|mut s| s.execute(params![charged, m.now]))
        .map_err(backend_err)?;
    }
    if let Some(succ) = &m.successor {
        let out = submit_batch(c, vec![succ.clone()])?;
        match out.first() {
            Some(SubmitOutcome::Created(_)) => {}
            _ => return Err(StoreError::AlreadyExists(format!("a task for key {} {}", succ.target, succ.biz_no))),
        }
        if succ.origin.as_ref().is_some_and(|o| o.kind != OriginKind::Reprint) {
            c.prepare_cached("UPDATE tasks SET successor_task_id = ?1 WHERE id = ?2")
                .and_then(|mut s| s.execute(params![succ.task_id, m.task_id]))
                .map_err(backend_err)?;
        }
    }
    Ok(true)
}

pub fn attention(c: &Connection, tenant: &str, store: &str, limit: i64) -> StoreResult<Vec<Task>> {
    let mut s = c
        .prepare_cached(&format!(
            "SELECT {TASK_COLS} FROM tasks WHERE tenant_id = ?1 AND store_id = ?2 AND state IN ('failed', 'in_doubt') \
             ORDER BY updated_at, id LIMIT ?3"
        ))
        .map_err(backend_err)?;
    let rows = s.query_map(params![tenant, store, limit], task_from_row).map_err(backend_err)?;
    rows.collect::<rusqlite::Result<Vec<_>>>().map_err(backend_err)
}

pub fn reprint_count(c: &Connection, task_id: &str) -> StoreResult<i32> {
    c.query_row(
        "SELECT (SELECT COUNT(*) FROM tasks WHERE origin_task_id = ?1 AND origin_kind = 'reprint') \
              + (SELECT COUNT(*) FROM task_tombstones WHERE origin_task_id = ?1 AND origin_kind = 'reprint')",
        [task_id],
        |r| r.get(0),
    )
    .map_err(backend_err)
}

pub fn tasks_created_between(
    c: &Connection,
    tenant: &str,
    store: &str,
    from: &str,
    to: &str,
) -> StoreResult<Vec<Task>> {
    let mut s = c
        .prepare_cached(&format!(
            "SELECT {TASK_COLS} FROM tasks WHERE tenant_id = ?1 AND store_id = ?2 AND id >= ?3 AND id < ?4 ORDER BY id"
        ))
        .map_err(backend_err)?;
    let rows = s.query_map([tenant, store, from, to], task_from_row).map_err(backend_err)?;
    rows.collect::<rusqlite::Result<Vec<_>>>().map_err(backend_err)
}

pub fn ledger_between(c: &Connection, tenant: &str, store: &str, from: i64, to: i64) -> StoreResult<Vec<LedgerEntry>> {
    let mut s = c
        .prepare_cached(
            // A task is either kept or a tombstone, never both (one statement, one snapshot).
            "SELECT l.task_id, l.tenant_id, l.kind, l.amount, l.at FROM ledger l JOIN tasks t ON t.id = l.task_id \
             WHERE l.tenant_id = ?1 AND l.at >= ?3 AND l.at < ?4 AND t.store_id = ?2 \
             UNION ALL \
             SELECT l.task_id, l.tenant_id, l.kind, l.amount, l.at FROM ledger l \
             JOIN task_tombstones b ON b.task_id = l.task_id \
             WHERE l.tenant_id = ?1 AND l.at >= ?3 AND l.at < ?4 AND b.store_id = ?2 \
             ORDER BY 5, 1, 3",
        )
        .map_err(backend_err)?;
    let rows = s
        .query_map(params![tenant, store, from, to], |r| {
            Ok(LedgerEntry {
                task_id: r.get(0)?,
                tenant_id: r.get(1)?,
                kind: r.get(2)?,
                amount: r.get(3)?,
                at: r.get(4)?,
            })
        })
        .map_err(backend_err)?;
    rows.collect::<rusqlite::Result<Vec<_>>>().map_err(backend_err)
}

pub fn create_webhook(c: &Connection, w: NewWebhook) -> StoreResult<Webhook> {
    let events = serde_json::to_string(&w.events).map_err(|e| StoreError::Backend(e.to_string()))?;
    c.execute(
        "INSERT INTO webhooks (tenant_id, id, url, secret, events, created_at, format) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![w.tenant_id, w.id, w.url, w.secret, events, w.now, w.format],
    )
    .map_err(|e| constraint_err(e, &format!("webhook {}", w.id), &format!("tenant {}", w.tenant_id)))?;
    Ok(Webhook { tenant_id: w.tenant_id, id: w.id, url: w.url, format: w.format, events: w.events, created_at: w.now })
}

pub fn list_webhooks(c: &Connection, tenant: &str) -> StoreResult<Vec<Webhook>> {
    let mut s = c
        .prepare_cached(
            "SELECT tenant_id, id, url, events, created_at, format FROM webhooks WHERE tenant_id = ?1 ORDER BY id",
        )
        .map_err(backend_err)?;
    let rows = s
        .query_map([tenant], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
                r.get(4)?,
                r.get::<_, String>(5)?,
            ))
        })
        .map_err(backend_err)?;
    let mut out = Vec::new();
    for row in rows {
        let (tenant_id, id, url, events, created_at, format) = row.map_err(backend_err)?;
        let events = serde_json::from_str(&events).map_err(|e| StoreError::Backend(format!("webhook {id}: {e}")))?;
        out.push(Webhook { tenant_id, id, url, format, events, created_at });
    }
    Ok(out)
}

pub fn webhook_deliveries(
    c: &Connection,
    tenant: &str,
    hook: &str,
    limit: i64,
) -> StoreResult<Option<Vec<WebhookDelivery>>> {
    let exists: Option<i64> = c
        .query_row("SELECT 1 FROM webhooks WHERE tenant_id = ?1 AND id = ?2", [tenant, hook], |r| r.get(0))
        .optional()
        .map_err(backend_err)?;
    if exists.is_none() {
        return Ok(None);
    }
    let mut s = c
        .prepare_cached(
            "SELECT d.event_id, d.webhook_id, o.kind, d.attempts, d.next_attempt_at, d.last_status, d.last_error, \
             d.delivered_at, d.created_at FROM webhook_deliveries d JOIN outbox o ON o.event_id = d.event_id \
             WHERE d.tenant_id = ?1 AND d.webhook_id = ?2 ORDER BY d.created_at DESC, d.event_id DESC LIMIT ?3",
        )
        .map_err(backend_err)?;
    let rows = s
        .query_map(params![tenant, hook, limit], |r| {
            Ok(WebhookDelivery {
                event_id: r.get(0)?,
                webhook_id: r.get(1)?,
                kind: r.get(2)?,
                attempts: r.get(3)?,
                next_attempt_at: r.get(4)?,
                last_status: r.get(5)?,
                last_error: r.get(6)?,
                delivered_at: r.get(7)?,
                created_at: r.get(8)?,
            })
        })
        .map_err(backend_err)?;
    rows.collect::<rusqlite::Result<Vec<_>>>().map(Some).map_err(backend_err)
}

pub fn due_webhooks(c: &Connection, now: i64, limit: i64) -> StoreResult<Vec<DueWebhook>> {
    let mut s = c
        .prepare_cached(
            "SELECT d.event_id, d.webhook_id, d.tenant_id, w.url, w.secret, o.payload, d.attempts, w.format \
             FROM webhook_deliveries d JOIN webhooks w ON w.tenant_id = d.tenant_id AND w.id = d.webhook_id \
             JOIN outbox o ON o.event_id = d.event_id \
             WHERE d.delivered_at IS NULL AND d.next_attempt_at IS NOT NULL AND d.next_attempt_at <= ?1 \
             ORDER BY d.next_attempt_at LIMIT ?2",
        )
        .map_err(backend_err)?;
    let rows = s
        .query_map(params![now, limit], |r| {
            Ok(DueWebhook {
                event_id: r.get(0)?,
                webhook_id: r.get(1)?,
                tenant_id: r.get(2)?,
                url: r.get(3)?,
                secret: r.get(4)?,
                payload: r.get(5)?,
                attempts: r.get(6)?,
                format: r.get(7)?,
            })
        })
        .map_err(backend_err)?;
    rows.collect::<rusqlite::Result<Vec<_>>>().map_err(backend_err)
}

pub fn enqueue_webhook_test(c: &Connection, webhook_id: &str, e: &OutboxEvent) -> StoreResult<bool> {
    let found = c
        .prepare_cached("SELECT 1 FROM webhooks WHERE tenant_id = ?1 AND id = ?2")
        .and_then(|mut s| s.query_row(params![e.tenant_id, webhook_id], |_| Ok(())).optional())
        .map_err(backend_err)?;
    if found.is_none() {
        return Ok(false);
    }
    c.prepare_cached("INSERT INTO outbox (event_id, tenant_id, kind, payload, created_at) VALUES (?1, ?2, ?3, ?4, ?5)")
        .and_then(|mut s| s.execute(params![e.event_id, e.tenant_id, e.kind, e.payload, e.now]))
        .map_err(backend_err)?;
    c.prepare_cached(
        "INSERT INTO webhook_deliveries (event_id, webhook_id, tenant_id, next_attempt_at, created_at) \
         VALUES (?1, ?2, ?3, ?4, ?4)",
    )
    .and_then(|mut s| s.execute(params![e.event_id, webhook_id, e.tenant_id, e.now]))
    .map_err(backend_err)?;
    Ok(true)
}

pub fn record_webhook_attempt(c: &Connection, a: &WebhookAttempt) -> StoreResult<()> {
    c.prepare_cached(
        "UPDATE webhook_deliveries SET attempts = attempts + 1, last_status = ?3, last_error = ?4, \
         delivered_at = CASE WHEN ?5 THEN ?6 ELSE NULL END, next_attempt_at = CASE WHEN ?5 THEN NULL ELSE ?7 END \
         WHERE event_id = ?1 AND webhook_id = ?2",
    )
    .and_then(|mut s| {
        s.execute(params![a.event_id, a.webhook_id, a.status, a.error, a.delivered, a.now, a.next_attempt_at])
    })
    .map(|_| ())
    .map_err(backend_err)
}

pub fn printers_by_transport(c: &Connection, kind: &str) -> StoreResult<Vec<Printer>> {
    let mut s = c
        .prepare_cached(&format!(
            "SELECT {PRINTER_COLS} FROM printers WHERE json_extract(transport, '$.kind') = ?1 ORDER BY tenant_id, id"
        ))
        .map_err(backend_err)?;
    let rows = s.query_map([kind], printer_from_row).map_err(backend_err)?;
    rows.collect::<rusqlite::Result<Vec<_>>>().map_err(backend_err)
}

/// Each printer's `last_seen_at` moved forward, if the printer is online; the ones not
/// touched are returned. One statement per printer by its key, in the caller's one
/// writer job (one commit for the lot).
pub fn touch_printers_seen(c: &Connection, seen: &[PrinterSeen]) -> StoreResult<Vec<(String, String)>> {
    let mut s = c
        .prepare_cached(
            "UPDATE printers SET last_seen_at = MAX(COALESCE(last_seen_at, ?3), ?3) \
             WHERE tenant_id = ?1 AND id = ?2 AND online = 1",
        )
        .map_err(backend_err)?;
    let mut untouched = Vec::new();
    for p in seen {
        let n = s.execute(params![p.tenant_id, p.printer_id, p.at]).map_err(backend_err)?;
        if n == 0 {
            untouched.push((p.tenant_id.clone(), p.printer_id.clone()));
        }
    }
    Ok(untouched)
}

/// The silent printers of a polled transport: the comparison runs in the database, over
/// the printers table, and only the rows past their threshold come back. The first term
/// compares a column with the earliest threshold any printer can have, so the row of a
/// printer that keeps polling is passed over before its transport's JSON is parsed.
pub fn silent_printers(c: &Connection, q: &SilenceQuery) -> StoreResult<Vec<Printer>> {
    let mut s = c
        .prepare_cached(&format!(
            "SELECT {PRINTER_COLS} FROM printers WHERE COALESCE(last_seen_at, created_at) < ?5 \
             AND json_extract(transport, '$.kind') = ?1 \
             AND CASE WHEN last_seen_at IS NULL THEN COALESCE(last_error, '') <> 'offline' ELSE online = 1 END \
             AND COALESCE(last_seen_at, created_at) \
                 < ?2 - 2 * COALESCE(json_extract(transport, '$.poll_interval_s') * 1000, ?3) - ?4 \
             ORDER BY tenant_id, id"
        ))
        .map_err(backend_err)?;
    let rows = s
        .query_map(params![q.kind, q.now, q.default_interval_ms, q.grace_ms, q.earliest_threshold()], printer_from_row)
        .map_err(backend_err)?;
    rows.collect::<rusqlite::Result<Vec<_>>>().map_err(backend_err)
}

pub fn printers_with_id(c: &Connection, id: &str) -> StoreResult<Vec<Printer>> {
    let mut s = c
        .prepare_cached(&format!("SELECT {PRINTER_COLS} FROM printers WHERE id = ?1 ORDER BY tenant_id"))
        .map_err(backend_err)?;
    let rows = s.query_map([id], printer_from_row).map_err(backend_err)?;
    rows.collect::<rusqlite::Result<Vec<_>>>().map_err(backend_err)
}

pub fn get_tasks(c: &Connection, tenant: &str, ids: &[String]) -> StoreResult<Vec<Task>> {
    let list = serde_json::to_string(ids).map_err(|e| StoreError::Backend(e.to_string()))?;
    let mut s = c
        .prepare_cached(&format!(
            "SELECT {TASK_COLS} FROM tasks WHERE tenant_id = ?1 AND id IN (SELECT value FROM json_each(?2))"
        ))
        .map_err(backend_err)?;
    let rows = s.query_map(params![tenant, list], task_from_row).map_err(backend_err)?;
    rows.collect::<rusqlite::Result<Vec<_>>>().map_err(backend_err)
}

pub fn task_contents(c: &Connection, ids: &[String]) -> StoreResult<Vec<(String, TaskContent)>> {
    let list = serde_json::to_string(ids).map_err(|e| StoreError::Backend(e.to_string()))?;
    let mut s = c
        .prepare_cached("SELECT id, content_type, content FROM tasks WHERE id IN (SELECT value FROM json_each(?1))")
        .map_err(backend_err)?;
    let rows = s
        .query_map([list], |r| Ok((r.get(0)?, TaskContent { content_type: r.get(1)?, content: r.get(2)? })))
        .map_err(backend_err)?;
    rows.collect::<rusqlite::Result<Vec<_>>>().map_err(backend_err)
}

/// See `Store::acquire_lease`: one upsert whose update applies only to a free, expired or
/// own lease; the token moves on when the holder changes.
pub fn acquire_lease(c: &Connection, name: &str, holder: &str, now: i64, ttl_ms: i64) -> StoreResult<Option<i64>> {
    c.query_row(
        "INSERT INTO leases (name, holder, token, expires_at) VALUES (?1, ?2, 1, ?3 + ?4)
         ON CONFLICT(name) DO UPDATE SET
             token = CASE WHEN leases.holder = excluded.holder THEN leases.token ELSE leases.token + 1 END,
             holder = excluded.holder,
             expires_at = excluded.expires_at
         WHERE leases.holder = excluded.holder OR leases.expires_at <= ?3
         RETURNING token",
        params![name, holder, now, ttl_ms],
        |r| r.get(0),
    )
    .optional()
    .map_err(backend_err)
}

pub fn release_lease(c: &Connection, name: &str, holder: &str, now: i64) -> StoreResult<bool> {
    c.execute(
        "UPDATE leases SET expires_at = ?3 WHERE name = ?1 AND holder = ?2 AND expires_at > ?3",
        params![name, holder, now],
    )
    .map(|n| n > 0)
    .map_err(backend_err)
}

pub fn lease_row(c: &Connection, name: &str) -> StoreResult<Option<LeaseRow>> {
    c.query_row("SELECT name, holder, token, expires_at FROM leases WHERE name = ?1", [name], |r| {
        Ok(LeaseRow { name: r.get(0)?, holder: r.get(1)?, token: r.get(2)?, expires_at: r.get(3)? })
    })
    .optional()
    .map_err(backend_err)
}

pub fn put_agent_sessions(c: &Connection, rows: &[AgentSessionRow]) -> StoreResult<()> {
    let mut stmt = c
        .prepare_cached(
            "INSERT INTO agent_sessions
                 (tenant_id, store_id, agent_id, session, started_at, heard_at, open_poll, node_id)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
             ON CONFLICT(tenant_id, store_id, agent_id, session) DO UPDATE SET
                 heard_at = excluded.heard_at, open_poll = excluded.open_poll, node_id = excluded.node_id
             WHERE excluded.heard_at >= agent_sessions.heard_at",
        )
        .map_err(backend_err)?;
    for r in rows {
        stmt.execute(params![
            r.tenant_id,
            r.store_id,
            r.agent_id,
            r.session,
            r.started_at,
            r.heard_at,
            r.open_poll,
            r.node_id
        ])
        .map_err(backend_err)?;
    }
    Ok(())
}

pub fn agent_sessions_since(c: &Connection, since: i64) -> StoreResult<Vec<AgentSessionRow>> {
    let mut stmt = c
        .prepare_cached(
            "SELECT tenant_id, store_id, agent_id, session, started_at, heard_at, open_poll, node_id
             FROM agent_sessions WHERE heard_at >= ?1",
        )
        .map_err(backend_err)?;
    let rows = stmt
        .query_map([since], |r| {
            Ok(AgentSessionRow {
                tenant_id: r.get(0)?,
                store_id: r.get(1)?,
                agent_id: r.get(2)?,
                session: r.get(3)?,
                started_at: r.get(4)?,
                heard_at: r.get(5)?,
                open_poll: r.get(6)?,
                node_id: r.get(7)?,
            })
        })
        .map_err(backend_err)?;
    rows.collect::<Result<Vec<_>, _>>().map_err(backend_err)
}
