//! Tasks the store agent accepted offline: [`onceprint_store::Store::merge_offline`]
//! and the LAN task ids kept as aliases, for PostgreSQL.
//!
//! One merge is one short transaction (READ COMMITTED) that goes through the rules in
//! order. Each statement sees what committed before it started, and the unique keys judge
//! what races: the task under the key is read `FOR UPDATE`, so the planner's
//! compare-and-set applies to the row as read (an ack or another node's merge of the same
//! task waits for this transaction); the alias is inserted under its primary key, so of
//! two uploads of the same report on two nodes one makes the alias and the other, having
//! waited for it, answers from it; the task is inserted under the idempotency key with
//! `ON CONFLICT DO NOTHING`, and a conflict with an intake that committed meanwhile starts
//! the transaction again, which then finds that task. A prune that commits while the
//! insert waits for its key leaves a tombstone the insert's snapshot did not see; the
//! check after the insert sees it and starts again too (as intake's guard of migration 13
//! does).

use deadpool_postgres::GenericClient;
use onceprint_core::offline::AliasKind;
use onceprint_core::TaskState;
use onceprint_store::*;

use crate::error::{pg_error, violation, Violation};
use crate::rows::{self, TASK_COLUMNS, TOMBSTONE_COLUMNS_B};
use crate::{delivery, retention};

const ALIAS: &str =
    "SELECT alias_id, tenant_id, task_id, kind, created_at FROM task_aliases WHERE alias_id = $1 AND tenant_id = $2";

const INSERT_ALIAS: &str = "
INSERT INTO task_aliases (alias_id, tenant_id, task_id, kind, created_at) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT DO NOTHING
RETURNING alias_id";

const TASK_BY_ID: &str = "SELECT {cols} FROM tasks WHERE id = $1 AND tenant_id = $2";

const TASK_BY_KEY_FOR_UPDATE: &str = "
SELECT {cols} FROM tasks WHERE tenant_id = $1 AND target = $2 AND biz_no = $3 AND print_type = $4
FOR UPDATE";

const TOMBSTONE_BY_KEY: &str = "
SELECT {cols} FROM task_tombstones b
WHERE b.tenant_id = $1 AND b.target = $2 AND b.biz_no = $3 AND b.print_type = $4";

/// The task under its LAN id, unless the key has a tombstone (as intake's insert). Any
/// conflict — the key, or the id of another tenant's task — inserts nothing.
const INSERT_TASK: &str = "
INSERT INTO tasks (id, tenant_id, store_id, printer_id, station_id, target, biz_no, print_type, priority,
                   content_type, content, fingerprint, state, attempts, last_error, created_at, updated_at,
                   printed_at, may_have_printed)
SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19
WHERE NOT EXISTS (SELECT 1 FROM task_tombstones b
                  WHERE b.tenant_id = $2 AND b.target = $6 AND b.biz_no = $7 AND b.print_type = $8)
ON CONFLICT DO NOTHING
RETURNING id";

const KEY_PRUNED: &str = "
SELECT EXISTS (SELECT 1 FROM task_tombstones
               WHERE tenant_id = $1 AND target = $2 AND biz_no = $3 AND print_type = $4)";

const INSERT_EVENTS: &str = "
INSERT INTO task_events (task_id, at, from_state, to_state, attempt, actor, reason)
SELECT $1, e.at, e.from_state, e.to_state, e.attempt, e.actor, e.reason
FROM unnest($2::int8[], $3::text[], $4::text[], $5::int4[], $6::text[], $7::text[]) WITH ORDINALITY
     AS e(at, from_state, to_state, attempt, actor, reason, ord)
ORDER BY e.ord";

const INSERT_CHARGE: &str =
    "INSERT INTO ledger (tenant_id, task_id, kind, amount, at) VALUES ($1, $2, 'charge', $3, $4)";

/// How often a merge starts again after a race it lost (an intake or a prune of the same
/// key committing meanwhile). Each loss is decided by a commit, so the next round sees it.
const ATTEMPTS: usize = 4;

pub(crate) async fn alias<C: GenericClient>(
    client: &C,
    tenant_id: &str,
    alias_id: &str,
) -> StoreResult<Option<TaskAlias>> {
    let stmt = client.prepare_cached(ALIAS).await.map_err(pg_error)?;
    let Some(row) = client.query_opt(&stmt, &[&alias_id, &tenant_id]).await.map_err(pg_error)? else {
        return Ok(None);
    };
    let kind: String = rows::col(&row, 3)?;
    Ok(Some(TaskAlias {
        alias_id: rows::col(&row, 0)?,
        tenant_id: rows::col(&row, 1)?,
        task_id: rows::col(&row, 2)?,
        kind: AliasKind::parse(&kind).ok_or_else(|| StoreError::Backend(format!("unknown alias kind {kind:?}")))?,
        created_at: rows::col(&row, 4)?,
    }))
}

async fn task_or_tombstone<C: GenericClient>(
    client: &C,
    tenant_id: &str,
    task_id: &str,
) -> StoreResult<Option<(Task, bool)>> {
    let stmt = client.prepare_cached(&TASK_BY_ID.replace("{cols}", TASK_COLUMNS)).await.map_err(pg_error)?;
    if let Some(row) = client.query_opt(&stmt, &[&task_id, &tenant_id]).await.map_err(pg_error)? {
        return Ok(Some((rows::task(&row)?, false)));
    }
    Ok(retention::get_tombstone(client, tenant_id, task_id).await?.map(|b| (b.task, true)))
}

async fn insert_alias<C: GenericClient>(
    client: &C,
    o: &OfflineTask,
    task_id: &str,
    kind: AliasKind,
) -> StoreResult<bool> {
    let stmt = client.prepare_cached(INSERT_ALIAS).await.map_err(pg_error)?;
    let t = &o.task;
    let row = client
        .query_opt(&stmt, &[&o.lan_id, &t.tenant_id, &task_id, &kind.as_str(), &o.now])
        .await
        .map_err(pg_error)?;
    Ok(row.is_some())
}

async fn insert_events<C: GenericClient>(client: &C, task_id: &str, events: &[&TaskEvent]) -> StoreResult<()> {
    let at: Vec<i64> = events.iter().map(|e| e.at).collect();
    let from: Vec<Option<&str>> = events.iter().map(|e| e.from.map(TaskState::as_str)).collect();
    let to: Vec<&str> = events.iter().map(|e| e.to.as_str()).collect();
    let attempt: Vec<i32> = events.iter().map(|e| e.attempt).collect();
    let actor: Vec<&str> = events.iter().map(|e| e.actor.as_str()).collect();
    let reason: Vec<&str> = events.iter().map(|e| e.reason.as_str()).collect();
    let stmt = client.prepare_cached(INSERT_EVENTS).await.map_err(pg_error)?;
    client.execute(&stmt, &[&task_id, &at, &from, &to, &attempt, &actor, &reason]).await.map_err(pg_error)?;
    Ok(())
}

pub(crate) async fn merge_offline(
    client: &mut deadpool_postgres::Client,
    o: &OfflineTask,
    planner: &(dyn Fn(&Task) -> MergeStep + Send + Sync),
) -> StoreResult<OfflineMerge> {
    for _ in 0..ATTEMPTS {
        let tx = client.transaction().await.map_err(pg_error)?;
        // Dropping the transaction on an early return (an error, or a lost race) rolls
        // all of this round back.
        match merge_round(&tx, o, planner).await? {
            Some(out) => {
                tx.commit().await.map_err(pg_error)?;
                return Ok(out);
            }
            // A race was lost; nothing of this round is kept.
            None => tx.rollback().await.map_err(pg_error)?,
        }
    }
    // Only an id that is another tenant's task loses every round (its insert conflicts on
    // the primary key without a task under the key to find).
    Ok(OfflineMerge::IdTaken)
}

async fn merge_round<C: GenericClient>(
    tx: &C,
    o: &OfflineTask,
    planner: &(dyn Fn(&Task) -> MergeStep + Send + Sync),
) -> StoreResult<Option<OfflineMerge>> {
    // `None`: a race was lost, and the caller rolls this round back and starts again.
    let t = &o.task;
    // An upload of the same report again answers as the first did.
    if let Some(a) = alias(tx, &t.tenant_id, &o.lan_id).await? {
        let (task, pruned) = task_or_tombstone(tx, &t.tenant_id, &a.task_id)
            .await?
            .ok_or_else(|| StoreError::Backend(format!("task alias {} names no task", a.alias_id)))?;
        if a.kind == AliasKind::Renamed {
            return Ok(Some(OfflineMerge::Created { task, again: true, pruned }));
        }
        return Ok(Some(OfflineMerge::Aliased { kind: a.kind, task, pruned, changed: false, again: true }));
    }
    if let Some((task, pruned)) = task_or_tombstone(tx, &t.tenant_id, &o.lan_id).await? {
        let same_key = task.target == t.target && task.biz_no == t.biz_no && task.print_type == t.print_type;
        let out = if same_key { OfflineMerge::Created { task, again: true, pruned } } else { OfflineMerge::IdTaken };
        return Ok(Some(out));
    }

    // The key is known, as a kept task or (merge rule 4) a pruned one's tombstone: the LAN
    // id becomes another name of the broker's task.
    let key: [&(dyn tokio_postgres::types::ToSql + Sync); 4] = [&t.tenant_id, &t.target, &t.biz_no, &t.print_type];
    let stmt = tx.prepare_cached(&TASK_BY_KEY_FOR_UPDATE.replace("{cols}", TASK_COLUMNS)).await.map_err(pg_error)?;
    let known = match tx.query_opt(&stmt, &key).await.map_err(pg_error)? {
        Some(row) => Some((rows::task(&row)?, false)),
        None => {
            let stmt =
                tx.prepare_cached(&TOMBSTONE_BY_KEY.replace("{cols}", TOMBSTONE_COLUMNS_B)).await.map_err(pg_error)?;
            match tx.query_opt(&stmt, &key).await.map_err(pg_error)? {
                Some(row) => Some((rows::tombstone(&row)?.task, true)),
                None => None,
            }
        }
    };
    if let Some((mut existing, mut pruned)) = known {
        // The order may have moved on (a transfer, a failover): the LAN id names the task
        // it lives on now, as a retry's answer does, whether or not retention pruned the
        // tasks it moved through; a kept task is read `FOR UPDATE` like the first. Chains
        // are a hop per move; the bound only guards against a cycle.
        for _ in 0..64 {
            let Some(next) = existing.successor_task_id.clone().filter(|_| existing.state == TaskState::Transferred)
            else {
                break;
            };
            let by_id = tx
                .prepare_cached(&format!("{} FOR UPDATE", TASK_BY_ID.replace("{cols}", TASK_COLUMNS)))
                .await
                .map_err(pg_error)?;
            match tx.query_opt(&by_id, &[&next, &t.tenant_id]).await.map_err(pg_error)? {
                Some(row) => (existing, pruned) = (rows::task(&row)?, false),
                None => match retention::get_tombstone(tx, &t.tenant_id, &next).await? {
                    Some(b) => (existing, pruned) = (b.task, true),
                    None => break,
                },
            }
        }
        let step = planner(&existing);
        if !insert_alias(tx, o, &existing.task_id, step.kind).await? {
            // Another upload of this report made the alias meanwhile (it answers next
            // round), or the id is another tenant's alias.
            return Ok(if alias(tx, &t.tenant_id, &o.lan_id).await?.is_some() {
                None
            } else {
                Some(OfflineMerge::IdTaken)
            });
        }
        // A tombstone keeps the task's final state: nothing to change.
        if pruned {
            return Ok(Some(OfflineMerge::Aliased {
                kind: step.kind,
                task: existing,
                pruned,
                changed: false,
                again: false,
            }));
        }
        let mut changed = false;
        if let Some(change) = &step.transition {
            // The row is locked since it was read, so the compare-and-set cannot lose; a
            // planner's change that does not apply is a bug, not a race.
            if !delivery::transition(tx, change).await? {
                return Err(StoreError::Backend(format!(
                    "the offline merge of {} could not move task {} from {}",
                    t.task_id, existing.task_id, change.from
                )));
            }
            changed = true;
        }
        if let Some(note) = &step.note {
            insert_events(tx, &existing.task_id, &[note]).await?;
        }
        let (task, _) = task_or_tombstone(tx, &t.tenant_id, &existing.task_id)
            .await?
            .ok_or_else(|| StoreError::Backend(format!("task {} vanished during a merge", existing.task_id)))?;
        return Ok(Some(OfflineMerge::Aliased { kind: step.kind, task, pruned: false, changed, again: false }));
    }
    // The key is unknown: the task as the agent took it, under its LAN id; `seq` comes
    // from its default (the sequence), so it joins its printer's lane behind what waits.
    let stmt = tx.prepare_cached(INSERT_TASK).await.map_err(pg_error)?;
    let inserted = tx
        .query_opt(
            &stmt,
            &[
                &t.task_id,
                &t.tenant_id,
                &t.store_id,
                &t.printer_id,
                &t.station_id,
                &t.target,
                &t.biz_no,
                &t.print_type,
                &t.priority,
                &t.content_type,
                &t.content,
                &t.fingerprint,
                &o.state.as_str(),
                &o.attempts,
                &o.last_error,
                &t.now,
                &o.updated_at,
                &o.printed_at,
                &o.may_have_printed,
            ],
        )
        .await;
    let inserted = match inserted {
        Ok(row) => row,
        Err(e) if matches!(violation(&e), Some(Violation::ForeignKey(_))) => {
            return Err(StoreError::NotFound(format!("printer {}", t.printer_id)))
        }
        Err(e) => return Err(pg_error(e)),
    };
    if inserted.is_none() {
        // A task or tombstone under the key committed meanwhile (found next round), or
        // the id is another tenant's task.
        return Ok(None);
    }
    let stmt = tx.prepare_cached(KEY_PRUNED).await.map_err(pg_error)?;
    let pruned: bool = rows::col(&tx.query_one(&stmt, &key).await.map_err(pg_error)?, 0)?;
    if pruned {
        return Ok(None);
    }
    let created = TaskEvent {
        at: t.now,
        from: None,
        to: TaskState::Pending,
        attempt: 0,
        actor: t.actor.clone(),
        reason: o.reason.clone(),
    };
    let events: Vec<&TaskEvent> = std::iter::once(&created).chain(&o.history).collect();
    insert_events(tx, &t.task_id, &events).await?;
    if t.charge != 0 {
        let stmt = tx.prepare_cached(INSERT_CHARGE).await.map_err(pg_error)?;
        tx.execute(&stmt, &[&t.tenant_id, &t.task_id, &t.charge, &t.now]).await.map_err(pg_error)?;
    }
    // An id the broker minted instead of the LAN id (the agent's clock was far off): the
    // LAN id names the task as an alias. Taken meanwhile (by this report's other upload,
    // found next round, or as another tenant's alias): this round is rolled back.
    if t.task_id != o.lan_id && !insert_alias(tx, o, &t.task_id, AliasKind::Renamed).await? {
        return Ok(None);
    }
    let (task, _) = task_or_tombstone(tx, &t.tenant_id, &t.task_id)
        .await?
        .ok_or_else(|| StoreError::Backend(format!("task {} was inserted but cannot be read", t.task_id)))?;
    Ok(Some(OfflineMerge::Created { task, again: false, pruned: false }))
}
