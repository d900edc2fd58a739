//! Tasks the store agent accepted offline: [`onceprint_store::Store::merge_offline`]
//! and the LAN task ids kept as aliases, for SQLite.
//!
//! A merge is one job of the writer thread, which also runs every intake batch and every
//! prune: whatever the job reads (an alias, a task under the LAN id, the task or tombstone
//! under the key) cannot change before its writes are in, so the rules are applied in
//! order without locks. What a known task's merge changes is the engine's
//! [`onceprint_store::MergePlanner`]'s decision; this module only reads, calls it and
//! writes.

use onceprint_core::offline::AliasKind;
use onceprint_core::TaskState;
use onceprint_store::*;
use rusqlite::{params, Connection, OptionalExtension};

use crate::retention::{find_tombstone_parts, get_tombstone};
use crate::sql::{find_task, get_task, transition};
use crate::{backend_err, constraint_err};

pub fn alias(c: &Connection, tenant_id: &str, alias_id: &str) -> StoreResult<Option<TaskAlias>> {
    let row = c
        .prepare_cached(
            "SELECT alias_id, tenant_id, task_id, kind, created_at FROM task_aliases \
             WHERE alias_id = ?1 AND tenant_id = ?2",
        )
        .and_then(|mut s| {
            s.query_row([alias_id, tenant_id], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                    r.get(4)?,
                ))
            })
            .optional()
        })
        .map_err(backend_err)?;
    row.map(|(alias_id, tenant_id, task_id, kind, created_at)| {
        let kind = AliasKind::parse(&kind)
            .ok_or_else(|| StoreError::Backend(format!("task alias {alias_id}: unknown kind {kind:?}")))?;
        Ok(TaskAlias { alias_id, tenant_id, task_id, kind, created_at })
    })
    .transpose()
}

/// The kept task or, failing that, the tombstone's task, with whether it was pruned.
fn task_or_tombstone(c: &Connection, tenant_id: &str, task_id: &str) -> StoreResult<Option<(Task, bool)>> {
    if let Some(t) = get_task(c, tenant_id, task_id)? {
        return Ok(Some((t, false)));
    }
    Ok(get_tombstone(c, tenant_id, task_id)?.map(|b| (b.task, true)))
}

/// Inserts the alias; `false` when the id is taken already (by another tenant's alias:
/// this tenant's was looked for first).
fn insert_alias(c: &Connection, o: &OfflineTask, task_id: &str, kind: AliasKind) -> StoreResult<bool> {
    let n = c
        .prepare_cached(
            "INSERT INTO task_aliases (alias_id, tenant_id, task_id, kind, created_at) VALUES (?1, ?2, ?3, ?4, ?5) \
             ON CONFLICT DO NOTHING",
        )
        .and_then(|mut s| s.execute(params![o.lan_id, o.task.tenant_id, task_id, kind.as_str(), o.now]))
        .map_err(backend_err)?;
    Ok(n == 1)
}

/// Whether `alias_id` names a task of any tenant already.
fn alias_taken(c: &Connection, alias_id: &str) -> StoreResult<bool> {
    c.prepare_cached("SELECT 1 FROM task_aliases WHERE alias_id = ?1")
        .and_then(|mut s| s.exists([alias_id]))
        .map_err(backend_err)
}

fn insert_event(c: &Connection, task_id: &str, e: &TaskEvent) -> StoreResult<()> {
    c.prepare_cached(
        "INSERT INTO task_events (task_id, at, from_state, to_state, attempt, actor, reason) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )
    .and_then(|mut s| {
        s.execute(params![task_id, e.at, e.from.map(|f| f.as_str()), e.to.as_str(), e.attempt, e.actor, e.reason])
    })
    .map(|_| ())
    .map_err(backend_err)
}

pub fn merge(
    c: &Connection,
    o: &OfflineTask,
    planner: &(dyn Fn(&Task) -> MergeStep + Send + Sync),
) -> StoreResult<OfflineMerge> {
    let t = &o.task;
    // An upload of the same report again answers as the first did.
    if let Some(a) = alias(c, &t.tenant_id, &o.lan_id)? {
        let (task, pruned) = task_or_tombstone(c, &t.tenant_id, &a.task_id)?
            .ok_or_else(|| StoreError::Backend(format!("task alias {} names no task", a.alias_id)))?;
        if a.kind == AliasKind::Renamed {
            return Ok(OfflineMerge::Created { task, again: true, pruned });
        }
        return Ok(OfflineMerge::Aliased { kind: a.kind, task, pruned, changed: false, again: true });
    }
    if let Some((task, pruned)) = task_or_tombstone(c, &t.tenant_id, &o.lan_id)? {
        let same_key = task.target == t.target && task.biz_no == t.biz_no && task.print_type == t.print_type;
        return Ok(if same_key { OfflineMerge::Created { task, again: true, pruned } } else { OfflineMerge::IdTaken });
    }

    // The key is known, as a kept task or (merge rule 4) a pruned one's tombstone: the LAN
    // id becomes another name of the broker's task.
    let known = match find_task(c, &t.tenant_id, &t.target, &t.biz_no, &t.print_type)? {
        Some(task) => Some((task, false)),
        None => find_tombstone_parts(c, &t.tenant_id, &t.target, &t.biz_no, &t.print_type)?.map(|b| (b.task, true)),
    };
    if let Some((mut existing, mut pruned)) = known {
        // The order may have moved on (a transfer, a failover): the LAN id names the task
        // it lives on now, as a retry's answer does, whether or not retention pruned the
        // tasks it moved through. Chains are a hop per move; the bound only guards against
        // a cycle the store never makes.
        for _ in 0..64 {
            let Some(next) = existing.successor_task_id.clone().filter(|_| existing.state == TaskState::Transferred)
            else {
                break;
            };
            match task_or_tombstone(c, &t.tenant_id, &next)? {
                Some((task, was_pruned)) => (existing, pruned) = (task, was_pruned),
                None => break,
            }
        }
        let step = planner(&existing);
        if !insert_alias(c, o, &existing.task_id, step.kind)? {
            return Ok(OfflineMerge::IdTaken);
        }
        // A tombstone keeps the task's final state: nothing to change.
        if pruned {
            return Ok(OfflineMerge::Aliased { kind: step.kind, task: existing, pruned, changed: false, again: false });
        }
        let mut changed = false;
        if let Some(change) = &step.transition {
            // Nothing else writes while this job runs, so the compare-and-set on the task
            // just read cannot lose; a planner's change that does not apply is a bug.
            if !transition(c, change)? {
                return Err(StoreError::Backend(format!(
                    "the offline merge of {} could not move task {} from {}",
                    t.task_id, existing.task_id, change.from
                )));
            }
            changed = true;
        }
        if let Some(note) = &step.note {
            insert_event(c, &existing.task_id, note)?;
        }
        let task = get_task(c, &t.tenant_id, &existing.task_id)?
            .ok_or_else(|| StoreError::Backend(format!("task {} vanished during a merge", existing.task_id)))?;
        return Ok(OfflineMerge::Aliased { kind: step.kind, task, pruned: false, changed, again: false });
    }
    // A LAN id kept as another tenant's alias cannot name this task.
    let renamed = t.task_id != o.lan_id;
    if renamed && alias_taken(c, &o.lan_id)? {
        return Ok(OfflineMerge::IdTaken);
    }
    // The key is unknown: the task as the agent took it, under its LAN id. It takes the
    // next lane `seq` (the writer thread is the only one that inserts tasks), so it joins
    // its printer's lane behind what is waiting there already, as on PostgreSQL.
    let inserted = c
        .prepare_cached(
            "INSERT INTO tasks (id, tenant_id, store_id, printer_id, station_id, target, biz_no, print_type, priority, \
             content_type, content, fingerprint, state, attempts, last_error, created_at, updated_at, printed_at, \
             may_have_printed, seq) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, \
                     (SELECT last + 1 FROM task_seq)) \
             ON CONFLICT DO NOTHING",
        )
        .and_then(|mut s| {
            s.execute(params![
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
                o.state.as_str(),
                o.attempts,
                o.last_error,
                t.now,
                o.updated_at,
                o.printed_at,
                o.may_have_printed,
            ])
        })
        .map_err(|e| constraint_err(e, &format!("task {}", t.task_id), &format!("printer {}", t.printer_id)))?;
    if inserted != 1 {
        // Not the key (looked up above): the id is another tenant's task.
        return Ok(OfflineMerge::IdTaken);
    }
    c.prepare_cached("UPDATE task_seq SET last = last + 1").and_then(|mut s| s.execute([])).map_err(backend_err)?;
    let created = TaskEvent {
        at: t.now,
        from: None,
        to: onceprint_core::TaskState::Pending,
        attempt: 0,
        actor: t.actor.clone(),
        reason: o.reason.clone(),
    };
    for e in std::iter::once(&created).chain(&o.history) {
        insert_event(c, &t.task_id, e)?;
    }
    if t.charge != 0 {
        c.prepare_cached("INSERT INTO ledger (tenant_id, task_id, kind, amount, at) VALUES (?1, ?2, 'charge', ?3, ?4)")
            .and_then(|mut s| s.execute(params![t.tenant_id, t.task_id, t.charge, t.now]))
            .map_err(backend_err)?;
    }
    if renamed && !insert_alias(c, o, &t.task_id, AliasKind::Renamed)? {
        return Err(StoreError::Backend(format!("the alias {} was taken during its merge", o.lan_id)));
    }
    let task = get_task(c, &t.tenant_id, &t.task_id)?
        .ok_or_else(|| StoreError::Backend(format!("task {} was inserted but cannot be read", t.task_id)))?;
    Ok(OfflineMerge::Created { task, again: false, pruned: false })
}
