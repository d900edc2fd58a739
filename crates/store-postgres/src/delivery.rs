//! Delivery: compare-and-set transitions (one or a batch), printer lanes, due tasks and
//! printer health, for PostgreSQL. A transition or a printer flipping on- or offline
//! writes its alert to the outbox in the same statement (see [`crate::alerts`]).
//!
//! The one-in-flight-per-printer rule is the partial unique index
//! `tasks_one_in_flight_per_printer`. A transition to `sent` that collides with it fails
//! with a unique violation, which here is an answer (`false`, nothing written), not an
//! error. Against a concurrent transaction that has put another task of the printer into
//! `sent` but not committed yet, PostgreSQL makes the second one wait and then decides:
//! a unique violation if the first commits, success if it rolls back. So two engines can
//! never both hand a printer a task.
//!
//! A batch of transitions is one statement over `unnest` where that means the same as
//! applying its changes one after the other (see [`apply_transitions`]). Otherwise it
//! runs in one transaction, its statements pipelined over the one
//! connection: every change is sent up front, and the answers are read afterwards. A
//! violation would abort the whole transaction, so each change to `sent` (the only kind
//! that can collide) runs under a savepoint. When one is refused, everything sent after it
//! has failed too (the transaction is aborted), so the store rolls back to the savepoint
//! and pipelines the rest again. A batch costs three round trips (begin, the pipeline,
//! commit) plus one per refused change.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use deadpool_postgres::GenericClient;
use onceprint_core::{Millis, TaskState};
use onceprint_store::{Lane, LaneStats, OutboxEvent, PausedWait, PrinterStatusUpdate, StoreResult, Task, Transition};
use tokio_postgres::types::ToSql;

use crate::alerts;
use crate::error::{pg_error, violation, Violation};
use crate::rows::{self, TASK_COLUMNS, TASK_COLUMNS_T};

/// The partial unique index behind the one-in-flight-per-printer rule.
const ONE_IN_FLIGHT: &str = "tasks_one_in_flight_per_printer";

/// One statement, hence atomic on its own: the compare-and-set update, its audit event
/// and, when the change carries one and an endpoint of the tenant wants its kind, its
/// alert in the outbox with one delivery per such endpoint. When the update matches no row, the inserts
/// read nothing from it and write nothing; the statement returns a row exactly when the
/// change applied. Without an alert (`$13` NULL) the outbox insert writes nothing either.
const TRANSITION: &str = "
WITH moved AS (
    UPDATE tasks
    SET state = $2::text, attempts = $5, last_error = $6, next_attempt_at = $7, updated_at = $8::int8,
        printed_at = CASE WHEN $2::text = 'printed' THEN $8::int8 ELSE printed_at END,
        sent_to = $11, sent_session = $12,
        sent_at = CASE WHEN $2::text = 'sent' AND $3::text <> 'sent' THEN $8::int8 ELSE sent_at END,
        may_have_printed = may_have_printed OR $18::bool, refusals = refusals + $19::int4
    WHERE id = $1 AND state = $3::text AND attempts = $4
    RETURNING id
),
logged AS (
    INSERT INTO task_events (task_id, at, from_state, to_state, attempt, actor, reason)
    SELECT id, $8::int8, $3::text, $2::text, $5, $9, $10 FROM moved
    RETURNING id
),
alert AS (
    INSERT INTO outbox (event_id, tenant_id, kind, payload, created_at)
    SELECT $13::text, $14::text, $15::text, $16::text, $17::int8 FROM moved
    WHERE $13::text IS NOT NULL
      AND EXISTS (SELECT 1 FROM webhooks w WHERE w.tenant_id = $14::text AND $15::text = ANY (w.events))
    RETURNING event_id, tenant_id, kind, created_at
),
fanned_out AS (
    INSERT INTO webhook_deliveries (event_id, webhook_id, tenant_id, next_attempt_at, created_at)
    SELECT a.event_id, w.id, w.tenant_id, a.created_at, a.created_at
    FROM alert a JOIN webhooks w ON w.tenant_id = a.tenant_id AND a.kind = ANY (w.events)
)
SELECT id FROM logged";

/// A whole batch of changes as one statement: [`TRANSITION`] over the rows of `unnest`,
/// each row's compare-and-set, audit event and alert exactly as there, the events in
/// the order of the batch. It returns the ordinal (from 1) of every change that applied.
/// Used only where it means the same as applying the changes one after the other (see
/// [`apply_transitions`]); a refusal by the one-in-flight index fails it whole.
const TRANSITION_BATCH: &str = "
WITH c AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::int4[], $5::int4[], $6::text[], $7::int8[],
                         $8::int8[], $9::text[], $10::text[], $11::text[], $12::text[], $13::text[], $14::text[],
                         $15::text[], $16::text[], $17::int8[], $18::bool[], $19::int4[])
        WITH ORDINALITY AS c(id, to_state, from_state, expected, attempts, last_error, next_attempt_at, now_ms,
                             actor, reason, sent_to, sent_session, event_id, event_tenant, event_kind,
                             event_payload, event_at, may_have_printed, refused, ord)
),
moved AS (
    UPDATE tasks t
    SET state = c.to_state, attempts = c.attempts, last_error = c.last_error, next_attempt_at = c.next_attempt_at,
        updated_at = c.now_ms,
        printed_at = CASE WHEN c.to_state = 'printed' THEN c.now_ms ELSE t.printed_at END,
        sent_to = c.sent_to, sent_session = c.sent_session,
        sent_at = CASE WHEN c.to_state = 'sent' AND c.from_state <> 'sent' THEN c.now_ms ELSE t.sent_at END,
        may_have_printed = t.may_have_printed OR c.may_have_printed, refusals = t.refusals + c.refused
    FROM c
    WHERE t.id = ANY ($1::text[]) AND t.id = c.id AND t.state = c.from_state AND t.attempts = c.expected
    RETURNING c.ord
),
done AS (
    SELECT c.* FROM c JOIN moved m ON m.ord = c.ord
),
logged AS (
    INSERT INTO task_events (task_id, at, from_state, to_state, attempt, actor, reason)
    SELECT id, now_ms, from_state, to_state, attempts, actor, reason FROM done ORDER BY ord
),
alert AS (
    INSERT INTO outbox (event_id, tenant_id, kind, payload, created_at)
    SELECT event_id, event_tenant, event_kind, event_payload, event_at FROM done d
    WHERE event_id IS NOT NULL
      AND EXISTS (SELECT 1 FROM webhooks w WHERE w.tenant_id = d.event_tenant AND d.event_kind = ANY (w.events))
    ORDER BY ord
    RETURNING event_id, tenant_id, kind, created_at
),
fanned_out AS (
    INSERT INTO webhook_deliveries (event_id, webhook_id, tenant_id, next_attempt_at, created_at)
    SELECT a.event_id, w.id, w.tenant_id, a.created_at, a.created_at
    FROM alert a JOIN webhooks w ON w.tenant_id = a.tenant_id AND a.kind = ANY (w.events)
)
SELECT ord FROM moved";

/// The savepoint a change to `sent` runs under inside a batch. Only one is ever open: the
/// next change to `sent` releases it (keeping its work) and sets a new one.
const SAVEPOINT: &str = "SAVEPOINT one_in_flight";
const NEXT_SAVEPOINT: &str = "RELEASE SAVEPOINT one_in_flight; SAVEPOINT one_in_flight";
const ROLLBACK_TO_SAVEPOINT: &str = "ROLLBACK TO SAVEPOINT one_in_flight";

/// For each printer of the store, its task in flight (through the partial unique index
/// `tasks_one_in_flight_per_printer`) and, when nothing is in flight, its first waiting
/// task by (priority, seq) (through `tasks_lane`, whose predicate the query repeats
/// literally so that the planner can use the partial index; `<> 'sent'` then steps over
/// at most the one row in flight). The waiting task of a busy lane is not read: nothing
/// but its task in flight can move while it is busy. `{which}`
/// is the condition on the printer (`p.store_id = $2`, or `p.id = $2`).
const LANES: &str = "
SELECT lane.*
FROM printers p
CROSS JOIN LATERAL (
    (SELECT {cols}
     FROM tasks
     WHERE tenant_id = p.tenant_id AND printer_id = p.id AND state = 'sent'
     LIMIT 1)
    UNION ALL
    (SELECT {cols}
     FROM tasks
     WHERE tenant_id = p.tenant_id AND printer_id = p.id AND state IN ('pending', 'sent', 'retrying')
       AND state <> 'sent'
     ORDER BY priority, seq
     LIMIT 1)
    -- The first branch that yields a row ends the scan: a busy lane costs one probe.
    LIMIT 1
) AS lane
WHERE p.tenant_id = $1 AND {which}
ORDER BY p.id";

fn lanes_sql(which: &str) -> String {
    LANES.replace("{cols}", TASK_COLUMNS).replace("{which}", which)
}

/// The first waiting task of each of the printers in `$2`, whatever is in flight: the
/// second branch of [`LANES`] alone.
const LANE_HEADS: &str = "
SELECT head.*
FROM printers p
CROSS JOIN LATERAL (
    SELECT {cols}
    FROM tasks
    WHERE tenant_id = p.tenant_id AND printer_id = p.id AND state IN ('pending', 'sent', 'retrying')
      AND state <> 'sent'
    ORDER BY priority, seq
    LIMIT 1
) AS head
WHERE p.tenant_id = $1 AND p.id = ANY ($2)
ORDER BY p.id";

pub(crate) async fn lane_heads(
    client: &deadpool_postgres::Client,
    tenant_id: &str,
    printer_ids: &[String],
) -> StoreResult<Vec<Task>> {
    let stmt = client.prepare_cached(&LANE_HEADS.replace("{cols}", TASK_COLUMNS)).await.map_err(pg_error)?;
    let found = client.query(&stmt, &[&tenant_id, &printer_ids]).await.map_err(pg_error)?;
    found.iter().map(rows::task).collect()
}

/// Figures of every lane with active tasks, read through `tasks_lane`.
///
/// Grouped by (tenant, printer), the order of `tasks_lane`'s keys, so that an index-only
/// scan of it (migration 16) needs no sort of the tasks, only of the lanes at the end; a
/// printer belongs to one store, so that groups by store too.
const LANE_STATS: &str = "
SELECT tenant_id, min(store_id), printer_id, count(*) FILTER (WHERE state <> 'sent'),
       min(created_at) FILTER (WHERE state <> 'sent'), min(sent_at) FILTER (WHERE state = 'sent')
FROM tasks
WHERE state IN ('pending', 'sent', 'retrying')
GROUP BY tenant_id, printer_id
ORDER BY 1, 2, 3";

/// An alert of its own (not carried by a transition), fanned out like a transition's.
const RECORD_ALERT: &str = "
WITH alert AS (
    INSERT INTO outbox (event_id, tenant_id, kind, payload, created_at)
    SELECT $1::text, $2::text, $3::text, $4::text, $5::int8
    WHERE EXISTS (SELECT 1 FROM webhooks w WHERE w.tenant_id = $2::text AND $3::text = ANY (w.events))
    RETURNING event_id, tenant_id, kind, created_at
)
INSERT INTO webhook_deliveries (event_id, webhook_id, tenant_id, next_attempt_at, created_at)
SELECT a.event_id, w.id, w.tenant_id, a.created_at, a.created_at
FROM alert a JOIN webhooks w ON w.tenant_id = a.tenant_id AND a.kind = ANY (w.events)";

/// Through the partial (state, next_attempt_at) index `tasks_due`, which holds the tasks
/// in `sent` and `retrying`. The state is written into the text rather than passed as a
/// parameter: only a literal lets the planner prove that the partial index applies. (It
/// comes from [`TaskState::as_str`], never from input.)
fn due_tasks_sql(state: TaskState) -> String {
    format!(
        "SELECT {TASK_COLUMNS} FROM tasks
         WHERE state = '{}' AND next_attempt_at <= $1
         ORDER BY next_attempt_at
         LIMIT $2",
        state.as_str()
    )
}

/// All reports in one statement (one transaction), applied as if one after the other.
/// The printer rows are locked first in key order, so two concurrent reports naming the
/// same printers cannot deadlock; `FOR NO KEY UPDATE` is the lock the update takes anyway
/// and, unlike `FOR UPDATE`, does not block intake, whose foreign-key checks share-lock
/// the same rows. The locked rows hold the `online` value and the pausing state
/// (`last_error` one of [`onceprint_store::PAUSING_ERRORS`]) the reports find: a report
/// whose value differs from it (for the first report of a printer) or from the previous
/// report of the printer writes its `printer.online` / `printer.offline` alert, and one
/// whose pausing differs its `printer.paused` / `printer.resumed` alert, to the
/// outbox, fanned out like a transition's. The row ends with the last report's values and
/// `paused_since` kept, set or cleared; a printer whose row paused and whose last report
/// does not has its waiting retries made due now (`resumed`), so the lane moves at once.
/// Reports of unknown printers are ignored.
const UPDATE_PRINTER_STATUS: &str = "
WITH u AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::bool[], $4::int8[], $5::text[], $6::text[], $7::text[],
                         $8::text[], $9::text[], $10::text[], $11::text[])
        WITH ORDINALITY AS u(tenant_id, printer_id, online, seen_at, last_error, event_id, kind, payload,
                             pause_id, pause_kind, pause_payload, ord)
),
locked AS MATERIALIZED (
    SELECT p.tenant_id, p.id, p.online, p.paused_since,
           coalesce(p.last_error IN ('no_paper', 'cover_open', 'paper_jam', 'offline'), false) AS paused
    FROM printers p
    WHERE (p.tenant_id, p.id) IN (SELECT tenant_id, printer_id FROM u)
    ORDER BY p.tenant_id, p.id
    FOR NO KEY UPDATE OF p
),
flagged AS MATERIALIZED (
    SELECT u.*, coalesce(u.last_error IN ('no_paper', 'cover_open', 'paper_jam', 'offline'), false) AS paused
    FROM u
),
reports AS MATERIALIZED (
    SELECT f.*, coalesce(lag(f.online) OVER w, l.online) AS was_online,
           coalesce(lag(f.paused) OVER w, l.paused) AS was_paused, l.paused AS row_paused,
           l.paused_since AS row_paused_since, lead(f.ord) OVER w IS NULL AS is_last
    FROM flagged f JOIN locked l ON l.tenant_id = f.tenant_id AND l.id = f.printer_id
    WINDOW w AS (PARTITION BY f.tenant_id, f.printer_id ORDER BY f.ord)
),
updated AS (
    UPDATE printers p
    SET online = r.online, last_seen_at = r.seen_at, last_error = r.last_error,
        paused_since = CASE WHEN NOT r.paused THEN NULL
                            WHEN r.was_paused THEN coalesce(r.row_paused_since, r.seen_at)
                            ELSE r.seen_at END
    FROM reports r
    WHERE r.is_last AND p.tenant_id = r.tenant_id AND p.id = r.printer_id
),
resumed AS (
    UPDATE tasks t
    SET next_attempt_at = r.seen_at
    FROM reports r
    WHERE r.is_last AND r.row_paused AND NOT r.paused
      AND t.tenant_id = r.tenant_id AND t.printer_id = r.printer_id
      AND t.state = 'retrying' AND t.next_attempt_at > r.seen_at
      AND t.last_error IN ('no_paper', 'cover_open', 'paper_jam', 'offline')
),
events AS (
    SELECT ord, 0 AS sub, event_id, tenant_id, kind, payload, seen_at FROM reports WHERE online <> was_online
    UNION ALL
    SELECT ord, 1 AS sub, pause_id, tenant_id, pause_kind, pause_payload, seen_at FROM reports
    WHERE paused <> was_paused
),
alerts AS (
    INSERT INTO outbox (event_id, tenant_id, kind, payload, created_at)
    SELECT event_id, tenant_id, kind, payload, seen_at FROM events e
    WHERE EXISTS (SELECT 1 FROM webhooks w WHERE w.tenant_id = e.tenant_id AND e.kind = ANY (w.events))
    ORDER BY ord, sub
    RETURNING event_id, tenant_id, kind, created_at
)
INSERT INTO webhook_deliveries (event_id, webhook_id, tenant_id, next_attempt_at, created_at)
SELECT a.event_id, w.id, w.tenant_id, a.created_at, a.created_at
FROM alerts a JOIN webhooks w ON w.tenant_id = a.tenant_id AND a.kind = ANY (w.events)";

/// The parameters of [`TRANSITION`] for one change.
struct Params<'a> {
    change: &'a Transition,
    to: &'static str,
    from: &'static str,
    /// The alert's columns, all NULL without one.
    event_id: Option<&'a str>,
    event_tenant: Option<&'a str>,
    event_kind: Option<&'a str>,
    event_payload: Option<&'a str>,
    event_at: Option<Millis>,
    /// 1 for a status refusal ([`Transition::refused`]), else 0.
    refused: i32,
}

impl<'a> Params<'a> {
    fn new(change: &'a Transition) -> Params<'a> {
        let e = change.event.as_ref();
        Params {
            change,
            to: change.to.as_str(),
            from: change.from.as_str(),
            event_id: e.map(|e| e.event_id.as_str()),
            event_tenant: e.map(|e| e.tenant_id.as_str()),
            event_kind: e.map(|e| e.kind.as_str()),
            event_payload: e.map(|e| e.payload.as_str()),
            event_at: e.map(|e| e.now),
            refused: i32::from(change.refused),
        }
    }

    fn values(&self) -> [&(dyn ToSql + Sync); 19] {
        let c = self.change;
        [
            &c.task_id,
            &self.to,
            &self.from,
            &c.expected_attempts,
            &c.attempts,
            &c.last_error,
            &c.next_attempt_at,
            &c.now,
            &c.actor,
            &c.reason,
            &c.sent_to,
            &c.sent_session,
            &self.event_id,
            &self.event_tenant,
            &self.event_kind,
            &self.event_payload,
            &self.event_at,
            &c.may_have_printed,
            &self.refused,
        ]
    }
}

/// Whether a failed transition was refused by the one-in-flight index.
fn refused_in_flight(e: &tokio_postgres::Error) -> bool {
    matches!(violation(e), Some(Violation::Unique(ONE_IN_FLIGHT)))
}

/// Runs on a pooled connection or inside a caller's transaction (an operator's action).
/// In a transaction, a refusal by the one-in-flight index aborts it: the caller must then
/// roll back, which it does anyway when the change did not apply.
pub(crate) async fn transition<C: GenericClient>(client: &C, change: &Transition) -> StoreResult<bool> {
    let stmt = client.prepare_cached(TRANSITION).await.map_err(pg_error)?;
    // A single statement is its own transaction: when the index refuses the update, the
    // statement is rolled back whole and no event is written.
    match client.query(&stmt, &Params::new(change).values()).await {
        Ok(rows) => Ok(!rows.is_empty()),
        Err(e) if refused_in_flight(&e) => Ok(false),
        Err(e) => Err(pg_error(e)),
    }
}

/// One request of a pipeline and what its answer means.
#[derive(Clone, Copy)]
enum Step {
    /// Setting (or moving) the savepoint before a change to `sent`.
    Savepoint,
    /// The transition of `changes[i]`.
    Change(usize),
}

type Answer<'a> = Pin<Box<dyn Future<Output = Result<Option<bool>, tokio_postgres::Error>> + Send + 'a>>;

/// Applies `changes` as if one after the other, in one transaction; `true` for each that
/// applied.
///
/// A batch takes one statement ([`TRANSITION_BATCH`]) when that gives the same answers as
/// one change after the other, which holds when no task appears twice and either no
/// change goes to `sent` (the acks of a poll's deliveries: moving out of `sent` can never
/// collide) or every change does (a poll handing out work). In the second case a printer
/// named twice, or one with a task already in flight, makes the one-in-flight index refuse
/// the statement whole, and the batch is applied again the long way, change by change,
/// where each refusal is an answer of its own. A mixed batch always goes the long way: in
/// one statement, a task leaving `sent` and another entering it on the same printer could
/// be applied in either order.
pub(crate) async fn apply_transitions(
    client: &mut deadpool_postgres::Client,
    changes: &[Transition],
) -> StoreResult<Vec<bool>> {
    if changes.is_empty() {
        return Ok(Vec::new());
    }
    let to_sent = changes.iter().filter(|c| c.to == TaskState::Sent).count();
    if changes.len() > 1 && (to_sent == 0 || to_sent == changes.len()) && distinct_tasks(changes) {
        match apply_batch(client, changes).await {
            Ok(applied) => return Ok(applied),
            Err(e) if to_sent > 0 && refused_in_flight(&e) => {} // the long way below
            Err(e) => return Err(pg_error(e)),
        }
    }
    apply_one_by_one(client, changes).await
}

fn distinct_tasks(changes: &[Transition]) -> bool {
    let mut ids: Vec<&str> = changes.iter().map(|c| c.task_id.as_str()).collect();
    ids.sort_unstable();
    ids.windows(2).all(|w| w[0] != w[1])
}

/// The whole batch in one statement (its own transaction).
async fn apply_batch(
    client: &deadpool_postgres::Client,
    changes: &[Transition],
) -> Result<Vec<bool>, tokio_postgres::Error> {
    let params: Vec<Params<'_>> = changes.iter().map(Params::new).collect();
    let ids: Vec<&str> = changes.iter().map(|c| c.task_id.as_str()).collect();
    let to: Vec<&str> = params.iter().map(|p| p.to).collect();
    let from: Vec<&str> = params.iter().map(|p| p.from).collect();
    let expected: Vec<i32> = changes.iter().map(|c| c.expected_attempts).collect();
    let attempts: Vec<i32> = changes.iter().map(|c| c.attempts).collect();
    let last_error: Vec<Option<&str>> = changes.iter().map(|c| c.last_error.as_deref()).collect();
    let next: Vec<Option<Millis>> = changes.iter().map(|c| c.next_attempt_at).collect();
    let now: Vec<Millis> = changes.iter().map(|c| c.now).collect();
    let actor: Vec<&str> = changes.iter().map(|c| c.actor.as_str()).collect();
    let reason: Vec<&str> = changes.iter().map(|c| c.reason.as_str()).collect();
    let sent_to: Vec<Option<&str>> = changes.iter().map(|c| c.sent_to.as_deref()).collect();
    let session: Vec<Option<&str>> = changes.iter().map(|c| c.sent_session.as_deref()).collect();
    let event_id: Vec<Option<&str>> = params.iter().map(|p| p.event_id).collect();
    let event_tenant: Vec<Option<&str>> = params.iter().map(|p| p.event_tenant).collect();
    let event_kind: Vec<Option<&str>> = params.iter().map(|p| p.event_kind).collect();
    let event_payload: Vec<Option<&str>> = params.iter().map(|p| p.event_payload).collect();
    let event_at: Vec<Option<Millis>> = params.iter().map(|p| p.event_at).collect();
    let may_have_printed: Vec<bool> = changes.iter().map(|c| c.may_have_printed).collect();
    let refused: Vec<i32> = params.iter().map(|p| p.refused).collect();
    let stmt = client.prepare_cached(TRANSITION_BATCH).await?;
    let rows = client
        .query(
            &stmt,
            &[
                &ids,
                &to,
                &from,
                &expected,
                &attempts,
                &last_error,
                &next,
                &now,
                &actor,
                &reason,
                &sent_to,
                &session,
                &event_id,
                &event_tenant,
                &event_kind,
                &event_payload,
                &event_at,
                &may_have_printed,
                &refused,
            ],
        )
        .await?;
    let mut applied = vec![false; changes.len()];
    for row in rows {
        let ord: i64 = row.try_get(0)?;
        // Ordinals count from 1 and come from the batch itself.
        if let Some(slot) = usize::try_from(ord).ok().and_then(|o| o.checked_sub(1)).and_then(|i| applied.get_mut(i)) {
            *slot = true;
        }
    }
    Ok(applied)
}

/// Change by change, pipelined over the connection, in one transaction.
async fn apply_one_by_one(client: &mut deadpool_postgres::Client, changes: &[Transition]) -> StoreResult<Vec<bool>> {
    let tx = client.transaction().await.map_err(pg_error)?;
    let stmt = tx.prepare_cached(TRANSITION).await.map_err(pg_error)?;
    let params: Vec<Params<'_>> = changes.iter().map(Params::new).collect();

    let mut applied = Vec::with_capacity(changes.len());
    // Every round after the first starts right after a refusal, with the savepoint set.
    let mut savepoint_set = false;
    while applied.len() < changes.len() {
        let start = applied.len();
        let mut steps = Vec::with_capacity(2 * (changes.len() - start));
        let mut answers: Vec<Answer<'_>> = Vec::with_capacity(2 * (changes.len() - start));
        let (tx, stmt) = (&tx, &stmt);
        for (i, p) in params.iter().enumerate().skip(start) {
            if p.change.to == TaskState::Sent {
                let sql = if savepoint_set { NEXT_SAVEPOINT } else { SAVEPOINT };
                savepoint_set = true;
                steps.push(Step::Savepoint);
                answers.push(Box::pin(async move { tx.batch_execute(sql).await.map(|()| None) }));
            }
            steps.push(Step::Change(i));
            answers.push(Box::pin(async move {
                let values = p.values();
                tx.query(stmt, &values).await.map(|rows| Some(!rows.is_empty()))
            }));
        }
        // The answers come in the order the requests were sent. After the first failure
        // the transaction is aborted and every later request fails as well, so only the
        // answers up to the first failure mean anything.
        for (step, answer) in steps.into_iter().zip(join_all(answers).await) {
            match (step, answer) {
                (_, Ok(None)) => {}
                (_, Ok(Some(done))) => applied.push(done),
                (Step::Change(i), Err(e)) if changes[i].to == TaskState::Sent && refused_in_flight(&e) => {
                    // The savepoint was set right before this change: undo just it.
                    tx.batch_execute(ROLLBACK_TO_SAVEPOINT).await.map_err(pg_error)?;
                    applied.push(false);
                    break;
                }
                // Dropping the transaction rolls all of it back.
                (_, Err(e)) => return Err(pg_error(e)),
            }
        }
    }
    tx.commit().await.map_err(pg_error)?;
    Ok(applied)
}

/// Polls every future until all are done, each first in the order given, so that requests
/// on one connection are sent in that order and pipelined. (A tiny `join_all`, to avoid a
/// dependency for it.)
async fn join_all<F: Future + Unpin>(mut futures: Vec<F>) -> Vec<F::Output> {
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match Pin::new(future).poll(cx) {
                    Poll::Ready(value) => *output = Some(value),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

/// Groups lane rows by printer, the one in `sent` as in flight.
fn group_lanes(tasks: Vec<Task>) -> Vec<Lane> {
    let mut lanes: Vec<Lane> = Vec::new();
    for t in tasks {
        if lanes.last().is_none_or(|l| l.printer_id != t.printer_id) {
            lanes.push(Lane { printer_id: t.printer_id.clone(), in_flight: None, waiting: None });
        }
        if let Some(lane) = lanes.last_mut() {
            if t.state == TaskState::Sent {
                lane.in_flight = Some(t);
            } else {
                lane.waiting = Some(t);
            }
        }
    }
    lanes
}

pub(crate) async fn lanes(
    client: &deadpool_postgres::Client,
    tenant_id: &str,
    store_id: &str,
    kind: &str,
) -> StoreResult<Vec<Lane>> {
    let stmt = client
        .prepare_cached(&lanes_sql("p.store_id = $2 AND p.transport::jsonb ->> 'kind' = $3"))
        .await
        .map_err(pg_error)?;
    let found = client.query(&stmt, &[&tenant_id, &store_id, &kind]).await.map_err(pg_error)?;
    Ok(group_lanes(found.iter().map(rows::task).collect::<StoreResult<_>>()?))
}

pub(crate) async fn lane(client: &deadpool_postgres::Client, tenant_id: &str, printer_id: &str) -> StoreResult<Lane> {
    let stmt = client.prepare_cached(&lanes_sql("p.id = $2")).await.map_err(pg_error)?;
    let found = client.query(&stmt, &[&tenant_id, &printer_id]).await.map_err(pg_error)?;
    let lanes = group_lanes(found.iter().map(rows::task).collect::<StoreResult<_>>()?);
    Ok(lanes.into_iter().next().unwrap_or(Lane { printer_id: printer_id.to_owned(), in_flight: None, waiting: None }))
}

pub(crate) async fn lane_stats(client: &deadpool_postgres::Client) -> StoreResult<Vec<LaneStats>> {
    let stmt = client.prepare_cached(LANE_STATS).await.map_err(pg_error)?;
    let found = client.query(&stmt, &[]).await.map_err(pg_error)?;
    found
        .iter()
        .map(|r| {
            Ok(LaneStats {
                tenant_id: rows::col(r, 0)?,
                store_id: rows::col(r, 1)?,
                printer_id: rows::col(r, 2)?,
                waiting: rows::col(r, 3)?,
                oldest_waiting_at: rows::col(r, 4)?,
                in_flight_since: rows::col(r, 5)?,
            })
        })
        .collect()
}

pub(crate) async fn record_alert(client: &deadpool_postgres::Client, e: &OutboxEvent) -> StoreResult<()> {
    let stmt = client.prepare_cached(RECORD_ALERT).await.map_err(pg_error)?;
    client.execute(&stmt, &[&e.event_id, &e.tenant_id, &e.kind, &e.payload, &e.now]).await.map_err(pg_error)?;
    Ok(())
}

/// See `Store::waiting_on_paused_printers`: the paused printers through `printers_paused`
/// (migration 21), each lane's waiting tasks through `tasks_lane`.
const WAITING_ON_PAUSED: &str = "
SELECT {cols_t}, p.paused_since, p.last_error
FROM printers p
CROSS JOIN LATERAL (
    SELECT {cols}, seq
    FROM tasks
    WHERE tenant_id = p.tenant_id AND printer_id = p.id AND state IN ('pending', 'sent', 'retrying')
      AND state <> 'sent'
    ORDER BY priority, seq
) AS t
WHERE p.paused_since IS NOT NULL
ORDER BY p.tenant_id, p.id, t.priority, t.seq
LIMIT $1";

pub(crate) async fn waiting_on_paused_printers(
    client: &deadpool_postgres::Client,
    limit: i64,
) -> StoreResult<Vec<PausedWait>> {
    let sql = WAITING_ON_PAUSED.replace("{cols_t}", TASK_COLUMNS_T).replace("{cols}", TASK_COLUMNS);
    let stmt = client.prepare_cached(&sql).await.map_err(pg_error)?;
    let found = client.query(&stmt, &[&limit.max(0)]).await.map_err(pg_error)?;
    found
        .iter()
        .map(|r| {
            Ok(PausedWait { task: rows::task(r)?, paused_since: rows::col(r, 27)?, printer_state: rows::col(r, 28)? })
        })
        .collect()
}

pub(crate) async fn due_tasks(
    client: &deadpool_postgres::Client,
    state: TaskState,
    now: Millis,
    limit: i64,
) -> StoreResult<Vec<Task>> {
    let stmt = client.prepare_cached(&due_tasks_sql(state)).await.map_err(pg_error)?;
    let found = client.query(&stmt, &[&now, &limit.max(0)]).await.map_err(pg_error)?;
    found.iter().map(rows::task).collect()
}

pub(crate) async fn update_printer_status(
    client: &deadpool_postgres::Client,
    updates: &[PrinterStatusUpdate],
) -> StoreResult<()> {
    if updates.is_empty() {
        return Ok(());
    }
    let tenants: Vec<&str> = updates.iter().map(|u| u.tenant_id.as_str()).collect();
    let printers: Vec<&str> = updates.iter().map(|u| u.printer_id.as_str()).collect();
    let online: Vec<bool> = updates.iter().map(|u| u.online).collect();
    let seen: Vec<Millis> = updates.iter().map(|u| u.now).collect();
    let errors: Vec<Option<&str>> = updates.iter().map(|u| u.last_error.as_deref()).collect();
    // Every report carries the alert it would write; the statement decides which flip.
    let event_ids: Vec<&str> = updates.iter().map(|u| u.event_id.as_str()).collect();
    let kinds: Vec<&str> = updates.iter().map(|u| alerts::printer_event_kind(u.online)).collect();
    let payloads: Vec<String> = updates.iter().map(alerts::printer_event_payload).collect();
    let pauses: Vec<(String, &'static str, String)> = updates.iter().map(|u| u.pause_event()).collect();
    let pause_ids: Vec<&str> = pauses.iter().map(|p| p.0.as_str()).collect();
    let pause_kinds: Vec<&str> = pauses.iter().map(|p| p.1).collect();
    let pause_payloads: Vec<&str> = pauses.iter().map(|p| p.2.as_str()).collect();
    let stmt = client.prepare_cached(UPDATE_PRINTER_STATUS).await.map_err(pg_error)?;
    client
        .execute(
            &stmt,
            &[
                &tenants,
                &printers,
                &online,
                &seen,
                &errors,
                &event_ids,
                &kinds,
                &payloads,
                &pause_ids,
                &pause_kinds,
                &pause_payloads,
            ],
        )
        .await
        .map_err(pg_error)?;
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The plan of `sql` as text, on a connection that avoids sequential and bitmap scans
    /// whenever it can (the test tables are tiny), so that what remains shows whether an
    /// index can serve the query at all.
    pub(crate) async fn plan(url: &str, sql: &str, params: &[&(dyn ToSql + Sync)]) -> String {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        client.batch_execute("SET enable_seqscan = off; SET enable_bitmapscan = off").await.unwrap();
        let lines = client.query(&format!("EXPLAIN {sql}"), params).await.unwrap();
        lines.iter().map(|r| r.get::<_, String>(0)).collect::<Vec<_>>().join("\n")
    }

    #[tokio::test]
    async fn lanes_and_due_tasks_are_read_in_order_from_their_indexes() {
        let Some(h) = crate::testing::fresh_store().await else {
            return;
        };
        let lanes = plan(&h.url, &lanes_sql("p.store_id = $2"), &[&"acme", &"s1"]).await;
        assert!(lanes.contains("using tasks_lane on tasks"), "{lanes}");
        assert!(!lanes.contains("Sort"), "the lane order must come from the index:\n{lanes}");

        for state in [TaskState::Sent, TaskState::Retrying] {
            let due = plan(&h.url, &due_tasks_sql(state), &[&0i64, &10i64]).await;
            assert!(due.contains("using tasks_due on tasks"), "{due}");
            assert!(!due.contains("Sort"), "{due}");
        }
        drop(h);
    }

    /// The one-statement path on its own: the answers of the rows that applied, nothing
    /// for a lost compare-and-set, and a refusal by the one-in-flight index failing the
    /// statement whole (which is what sends such a batch the long way). Its tasks are found
    /// by the primary key.
    #[tokio::test]
    async fn a_batch_in_one_statement_answers_per_change() {
        use onceprint_store::conformance::new_task;
        use onceprint_store::{NewPrinter, NewStore, NewTenant, SetupAudit, Store};
        let Some(guard) = crate::testing::fresh_schema().await else {
            return;
        };
        let store = crate::PostgresStore::connect(guard.url(), 2).await.unwrap();
        let now = onceprint_store::conformance::NOW;
        let tenant = NewTenant {
            id: "acme".into(),
            name: "Acme".into(),
            api_key_hash: "h".into(),
            now,
            api_key_id: "key-acme".into(),
            audit: SetupAudit::default(),
        };
        store.create_tenant(tenant).await.unwrap();
        let shop = NewStore {
            tenant_id: "acme".into(),
            id: "s1".into(),
            name: "s".into(),
            timezone: "UTC".into(),
            now,
            audit: SetupAudit::default(),
        };
        store.create_store(shop).await.unwrap();
        for p in ["p1", "p2"] {
            let printer = NewPrinter {
                tenant_id: "acme".into(),
                id: p.into(),
                store_id: "s1".into(),
                name: p.into(),
                transport: "{}".into(),
                credential: None,
                now,
                audit: SetupAudit::default(),
            };
            store.create_printer(printer).await.unwrap();
        }
        let mut tasks =
            vec![new_task("acme", "A", "x", 1), new_task("acme", "B", "x", 2), new_task("acme", "C", "x", 3)];
        tasks[1].printer_id = "p2".into();
        tasks[1].target = "printer:p2".into();
        store.submit_batch(tasks.clone()).await.unwrap();
        let send = |i: usize, expected: i32| Transition {
            task_id: tasks[i].task_id.clone(),
            from: TaskState::Pending,
            expected_attempts: expected,
            to: TaskState::Sent,
            attempts: 1,
            last_error: None,
            next_attempt_at: Some(now + 30_000),
            actor: "engine".into(),
            reason: "dispatched".into(),
            now,
            sent_to: Some("agent-1".into()),
            sent_session: None,
            may_have_printed: false,
            event: None,
            refused: false,
        };
        let client = store.pool.get().await.unwrap();
        let answers = apply_batch(&client, &[send(0, 0), send(1, 3)]).await.unwrap();
        assert_eq!(answers, vec![true, false], "B's compare-and-set names an attempt it never had");
        let refused = apply_batch(&client, &[send(1, 0), send(2, 0)]).await.expect_err("C collides with A on p1");
        assert!(refused_in_flight(&refused), "{refused}");
        assert_eq!(store.get_task("acme", &tasks[1].task_id).await.unwrap().unwrap().state, TaskState::Pending);

        let lines = client
            .query(
                &format!("EXPLAIN {TRANSITION_BATCH}"),
                &[
                    &vec!["t"],
                    &vec!["sent"],
                    &vec!["pending"],
                    &vec![0i32],
                    &vec![1i32],
                    &vec![None::<&str>],
                    &vec![None::<i64>],
                    &vec![0i64],
                    &vec!["a"],
                    &vec!["r"],
                    &vec![None::<&str>],
                    &vec![None::<&str>],
                    &vec![None::<&str>],
                    &vec![None::<&str>],
                    &vec![None::<&str>],
                    &vec![None::<&str>],
                    &vec![None::<i64>],
                    &vec![false],
                    &vec![0i32],
                ],
            )
            .await
            .unwrap();
        let plan = lines.iter().map(|r| r.get::<_, String>(0)).collect::<Vec<_>>().join("\n");
        assert!(plan.contains("tasks_pkey"), "{plan}");
        drop(client);
        drop(store);
        drop(guard);
    }

    /// The compare-and-set must find its task by the primary key whatever the planner
    /// believes about the table. Its generic plan (the one a prepared statement ends up
    /// with) is asked for on a table the planner has no statistics for, as on a fresh
    /// database: it once took the (state, next_attempt_at) index there.
    #[tokio::test]
    async fn the_compare_and_set_goes_through_the_primary_key() {
        let Some(h) = crate::testing::fresh_store().await else {
            return;
        };
        let (client, connection) = tokio_postgres::connect(&h.url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        client.batch_execute("SET plan_cache_mode = force_generic_plan").await.unwrap();
        let types =
            "text, text, text, int, int, text, int8, int8, text, text, text, text, text, text, text, text, int8, bool, int";
        client.batch_execute(&format!("PREPARE cas ({types}) AS {TRANSITION}")).await.unwrap();
        let lines = client
            .query(
                "EXPLAIN EXECUTE cas('t', 'printed', 'sent', 1, 1, NULL, NULL, 0, 'a', 'r', NULL, NULL, \
                 NULL, NULL, NULL, NULL, NULL, false, 0)",
                &[],
            )
            .await
            .unwrap();
        let plan = lines.iter().map(|r| r.get::<_, String>(0)).collect::<Vec<_>>().join("\n");
        assert!(plan.contains("using tasks_pkey on tasks"), "{plan}");
        drop(h);
    }
}
