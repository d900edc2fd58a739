//! Batched intake: [`onceprint_store::Store::submit_batch`] for PostgreSQL.
//!
//! Throughput is decided by round trips, not by rows, so a batch of any size costs one
//! statement when every key is new and two when some already existed:
//!
//! 1. One statement inserts the tasks from parallel arrays (`unnest`), skipping keys that
//!    already exist (`ON CONFLICT … DO NOTHING`), and — through data-modifying CTEs that
//!    read the inserted ids — the creation event and the ledger charge of exactly the
//!    tasks it inserted. A single statement is a single transaction, so a task is never
//!    visible without its event and its charge, and the commit is durable when the
//!    statement returns.
//! 2. Only if some keys were skipped, one read fetches their rows. It runs as a separate
//!    statement on purpose: it needs a snapshot taken after the insert waited for any
//!    concurrent transaction that held the same key, or it could miss that row.
//!
//! Keys whose task was pruned are skipped by the insert (their tombstone keeps them) and
//! answered with the tombstone, read after the tasks. The insert's tombstone check reads
//! the statement's snapshot, which can miss a prune that committed while the insert
//! waited for that very key; the statement's guard (migration 13) sees it and aborts the
//! statement, and the batch is tried again (see [`submit_batch`]).

use std::collections::{HashMap, HashSet};

use onceprint_store::{NewTask, StoreError, StoreResult, SubmitOutcome, Task, Tombstone};

use deadpool_postgres::GenericClient;

use crate::error::{pg_error, violation, Violation};
use crate::rows::{self, TASK_COLUMNS_T, TOMBSTONE_COLUMNS_B};

const INSERT_TASKS: &str = "
WITH ins AS (
    INSERT INTO tasks (id, tenant_id, store_id, printer_id, station_id, target, biz_no, print_type,
                       priority, content_type, content, fingerprint, state, attempts, created_at, updated_at,
                       origin_task_id, origin_kind, reprint_no, seq)
    -- The rows go in key order (ord), so that concurrent batches take shared keys in the
    -- same order; their lane sequence numbers follow the batch's order instead ($20, each
    -- row's rank in it): the batch's numbers are drawn once, sorted, and handed out by
    -- rank, so an order system's tickets for one printer print in the order it sent them.
    SELECT u.id, u.tenant_id, u.store_id, u.printer_id, u.station_id, u.target, u.biz_no, u.print_type,
           u.priority, u.content_type, u.content, u.fingerprint, 'pending', 0, u.now_ms, u.now_ms,
           u.origin_task_id, u.origin_kind, u.reprint_no,
           (SELECT array_agg(s ORDER BY s)
            FROM (SELECT nextval('tasks_seq') AS s FROM generate_series(1, cardinality($1::text[]))) AS drawn)[u.rank]
    FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[],
                $8::text[], $9::int4[], $10::text[], $11::bytea[], $12::text[], $13::int8[],
                $16::text[], $17::text[], $18::int4[], $20::int4[])
         WITH ORDINALITY AS u(id, tenant_id, store_id, printer_id, station_id, target, biz_no, print_type,
                              priority, content_type, content, fingerprint, now_ms,
                              origin_task_id, origin_kind, reprint_no, rank, ord)
    WHERE NOT EXISTS (SELECT 1 FROM task_tombstones b
                      WHERE b.tenant_id = u.tenant_id AND b.target = u.target
                        AND b.biz_no = u.biz_no AND b.print_type = u.print_type)
    ORDER BY u.ord
    ON CONFLICT (tenant_id, target, biz_no, print_type) DO NOTHING
    RETURNING id, tenant_id, target, biz_no, print_type
),
guard AS (
    SELECT onceprint_refuse_pruned_keys(array_agg(tenant_id), array_agg(target), array_agg(biz_no),
                                        array_agg(print_type)) AS ok
    FROM ins
),
meta AS (
    SELECT * FROM unnest($1::text[], $2::text[], $13::int8[], $14::text[], $15::int8[], $19::text[])
        AS m(id, tenant_id, now_ms, actor, charge, reason)
),
ev AS (
    INSERT INTO task_events (task_id, at, from_state, to_state, attempt, actor, reason)
    SELECT meta.id, meta.now_ms, NULL, 'pending', 0, meta.actor, meta.reason
    FROM ins JOIN meta USING (id)
),
charge AS (
    INSERT INTO ledger (tenant_id, task_id, kind, amount, at)
    SELECT meta.tenant_id, meta.id, 'charge', meta.charge, meta.now_ms
    FROM ins JOIN meta USING (id)
    WHERE meta.charge <> 0
)
SELECT id FROM ins WHERE (SELECT ok FROM guard)";

const SELECT_EXISTING: &str = "
SELECT {cols}
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) AS k(tenant_id, target, biz_no, print_type)
JOIN tasks t ON t.tenant_id = k.tenant_id AND t.target = k.target
            AND t.biz_no = k.biz_no AND t.print_type = k.print_type";

/// The tombstones of keys not found among the tasks.
const SELECT_TOMBSTONES: &str = "
SELECT {cols}
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) AS k(tenant_id, target, biz_no, print_type)
JOIN task_tombstones b ON b.tenant_id = k.tenant_id AND b.target = k.target
                      AND b.biz_no = k.biz_no AND b.print_type = k.print_type";

/// The SQLSTATE the insert's guard raises (migration 13).
const PRUNED_MEANWHILE: &str = "OP001";

/// How often a batch is tried again after a prune raced it. One retry is enough (its
/// snapshot shows the prune), a few more only guard against a burst of prunes.
const ATTEMPTS: usize = 3;

const FIRST_MISSING_PRINTER: &str = "
SELECT p.printer_id
FROM unnest($1::text[], $2::text[]) AS p(tenant_id, printer_id)
WHERE NOT EXISTS (SELECT 1 FROM printers WHERE tenant_id = p.tenant_id AND id = p.printer_id)
LIMIT 1";

/// The idempotency key of a submission, borrowed from it.
type Key<'a> = (&'a str, &'a str, &'a str, &'a str);

fn key_of(t: &NewTask) -> Key<'_> {
    (&t.tenant_id, &t.target, &t.biz_no, &t.print_type)
}

/// Why one try of a batch did not give its outcomes.
enum Failed {
    /// A key was pruned while the batch inserted it; nothing of the statement was kept.
    PrunedMeanwhile,
    Store(StoreError),
}

impl From<StoreError> for Failed {
    fn from(e: StoreError) -> Self {
        Failed::Store(e)
    }
}

/// Runs on a pooled connection (each statement its own transaction, see the module
/// documentation) or, with `in_transaction`, inside a transaction of the caller's (an
/// operator's action that creates a successor task). A batch that raced a prune is tried
/// again on a pooled connection; inside a transaction, which the failed statement has
/// aborted, the caller gets an error and writes nothing.
pub(crate) async fn submit_batch<C: GenericClient>(
    client: &C,
    batch: Vec<NewTask>,
    in_transaction: bool,
) -> StoreResult<Vec<SubmitOutcome>> {
    if batch.is_empty() {
        return Ok(Vec::new());
    }
    let mut tries = 0;
    loop {
        tries += 1;
        match try_batch(client, &batch).await {
            Ok(out) => return Ok(out),
            Err(Failed::Store(e)) => return Err(e),
            Err(Failed::PrunedMeanwhile) if in_transaction || tries >= ATTEMPTS => {
                return Err(StoreError::Backend("a submitted key was pruned while it was being inserted".into()))
            }
            Err(Failed::PrunedMeanwhile) => {
                tracing::debug!(tasks = batch.len(), "a submitted key was pruned during its insert; trying again")
            }
        }
    }
}

async fn try_batch<C: GenericClient>(client: &C, batch: &[NewTask]) -> Result<Vec<SubmitOutcome>, Failed> {
    // Collapse repeats of a key inside the batch: the first occurrence is the one that may
    // be created, later ones answer with whatever the first one turns into.
    let mut first_of: HashMap<Key<'_>, usize> = HashMap::with_capacity(batch.len());
    let mut leader = Vec::with_capacity(batch.len());
    for (i, t) in batch.iter().enumerate() {
        leader.push(*first_of.entry(key_of(t)).or_insert(i));
    }

    // Insert in key order. Two batches that share keys then wait for each other's keys in
    // the same order, which rules out deadlocks between concurrent intake transactions.
    let mut unique: Vec<usize> = first_of.values().copied().collect();
    unique.sort_unstable_by(|a, b| key_of(&batch[*a]).cmp(&key_of(&batch[*b])));

    let pick = |f: fn(&NewTask) -> &str| unique.iter().map(|&i| f(&batch[i])).collect::<Vec<&str>>();
    let ids = pick(|t| &t.task_id);
    let tenants = pick(|t| &t.tenant_id);
    let stores = pick(|t| &t.store_id);
    let printers = pick(|t| &t.printer_id);
    let targets = pick(|t| &t.target);
    let biz_nos = pick(|t| &t.biz_no);
    let print_types = pick(|t| &t.print_type);
    let content_types = pick(|t| &t.content_type);
    let fingerprints = pick(|t| &t.fingerprint);
    let actors = pick(|t| &t.actor);
    let stations: Vec<Option<&str>> = unique.iter().map(|&i| batch[i].station_id.as_deref()).collect();
    let priorities: Vec<i32> = unique.iter().map(|&i| batch[i].priority).collect();
    let contents: Vec<&[u8]> = unique.iter().map(|&i| batch[i].content.as_slice()).collect();
    let nows: Vec<i64> = unique.iter().map(|&i| batch[i].now).collect();
    let charges: Vec<i64> = unique.iter().map(|&i| batch[i].charge).collect();
    let origins: Vec<Option<&str>> =
        unique.iter().map(|&i| batch[i].origin.as_ref().map(|o| o.task_id.as_str())).collect();
    let origin_kinds: Vec<Option<&str>> =
        unique.iter().map(|&i| batch[i].origin.as_ref().map(|o| o.kind.as_str())).collect();
    let reprint_nos: Vec<Option<i32>> =
        unique.iter().map(|&i| batch[i].origin.as_ref().and_then(|o| o.reprint_no)).collect();
    // The creation event's reason: why the broker created the task, or a plain submission.
    let reasons = pick(|t| t.origin.as_ref().map_or("submitted", |o| o.reason.as_str()));
    // Each row's rank in the batch's order (1 for the first submitted), which decides its
    // lane sequence number; the rows themselves are in key order.
    let mut by_position: Vec<usize> = (0..unique.len()).collect();
    by_position.sort_unstable_by_key(|&k| unique[k]);
    let mut ranks = vec![0i32; unique.len()];
    for (rank, &k) in by_position.iter().enumerate() {
        ranks[k] = rank as i32 + 1;
    }

    let stmt = client.prepare_cached(INSERT_TASKS).await.map_err(pg_error)?;
    let inserted = client
        .query(
            &stmt,
            &[
                &ids,
                &tenants,
                &stores,
                &printers,
                &stations,
                &targets,
                &biz_nos,
                &print_types,
                &priorities,
                &content_types,
                &contents,
                &fingerprints,
                &nows,
                &actors,
                &charges,
                &origins,
                &origin_kinds,
                &reprint_nos,
                &reasons,
                &ranks,
            ],
        )
        .await;
    let inserted = match inserted {
        Ok(rows) => rows,
        Err(e) if e.code().is_some_and(|c| c.code() == PRUNED_MEANWHILE) => return Err(Failed::PrunedMeanwhile),
        Err(e) => return Err(insert_error(client, e, &tenants, &printers).await.into()),
    };
    // The returned ids borrow from the result rows, which live until the end of this call.
    let mut created: HashSet<&str> = HashSet::with_capacity(inserted.len());
    for row in &inserted {
        created.insert(rows::col(row, 0)?);
    }

    // Fetch the stored rows of the keys that were not inserted.
    let skipped: Vec<usize> =
        unique.iter().copied().filter(|&i| !created.contains(batch[i].task_id.as_str())).collect();
    let mut existing: HashMap<(String, String, String, String), Task> = HashMap::with_capacity(skipped.len());
    if !skipped.is_empty() {
        let column = |f: fn(&NewTask) -> &str| skipped.iter().map(|&i| f(&batch[i])).collect::<Vec<&str>>();
        let stmt = client.prepare_cached(&SELECT_EXISTING.replace("{cols}", TASK_COLUMNS_T)).await.map_err(pg_error)?;
        let found = client
            .query(
                &stmt,
                &[
                    &column(|t| &t.tenant_id),
                    &column(|t| &t.target),
                    &column(|t| &t.biz_no),
                    &column(|t| &t.print_type),
                ],
            )
            .await
            .map_err(pg_error)?;
        for row in &found {
            let task = rows::task(row)?;
            existing.insert(
                (task.tenant_id.clone(), task.target.clone(), task.biz_no.clone(), task.print_type.clone()),
                task,
            );
        }
    }
    // Keys with neither a new nor a kept task: pruned ones. Read after the tasks, so that a
    // task pruned since the insert looked is found here (its tombstone and its deletion
    // committed together).
    let pruned_keys: Vec<usize> = skipped
        .iter()
        .copied()
        .filter(|&i| {
            let t = &batch[i];
            !existing.contains_key(&(t.tenant_id.clone(), t.target.clone(), t.biz_no.clone(), t.print_type.clone()))
        })
        .collect();
    let mut tombstones: HashMap<(String, String, String, String), Tombstone> = HashMap::new();
    if !pruned_keys.is_empty() {
        let column = |f: fn(&NewTask) -> &str| pruned_keys.iter().map(|&i| f(&batch[i])).collect::<Vec<&str>>();
        let stmt =
            client.prepare_cached(&SELECT_TOMBSTONES.replace("{cols}", TOMBSTONE_COLUMNS_B)).await.map_err(pg_error)?;
        let found = client
            .query(
                &stmt,
                &[
                    &column(|t| &t.tenant_id),
                    &column(|t| &t.target),
                    &column(|t| &t.biz_no),
                    &column(|t| &t.print_type),
                ],
            )
            .await
            .map_err(pg_error)?;
        for row in &found {
            let b = rows::tombstone(row)?;
            let t = &b.task;
            tombstones.insert((t.tenant_id.clone(), t.target.clone(), t.biz_no.clone(), t.print_type.clone()), b);
        }
    }

    let mut outcomes: Vec<Option<SubmitOutcome>> = vec![None; batch.len()];
    for (i, t) in batch.iter().enumerate() {
        let first = leader[i];
        let outcome = if first != i {
            // A repeat inside the batch: the first occurrence's task answers, as stored.
            match &outcomes[first] {
                Some(o) => o.repeat(),
                None => return Err(StoreError::Backend("intake lost track of a repeated key".into()).into()),
            }
        } else if created.contains(t.task_id.as_str()) {
            SubmitOutcome::Created(t.created_task())
        } else {
            let k = (t.tenant_id.clone(), t.target.clone(), t.biz_no.clone(), t.print_type.clone());
            match (existing.remove(&k), tombstones.remove(&k)) {
                (Some(task), _) => SubmitOutcome::Existing(task),
                (None, Some(tombstone)) => SubmitOutcome::Pruned(tombstone),
                (None, None) => {
                    return Err(StoreError::Backend(format!(
                        "task {} was neither inserted nor found under its key",
                        t.task_id
                    ))
                    .into())
                }
            }
        };
        outcomes[i] = Some(outcome);
    }
    // Every slot was filled above: a leader always precedes its repeats.
    Ok(outcomes.into_iter().flatten().collect())
}

/// Explains a failed insert. A foreign-key violation means a task names a printer the
/// tenant does not have; one more query finds which, so the message is actionable.
async fn insert_error<C: GenericClient>(
    client: &C,
    e: tokio_postgres::Error,
    tenants: &[&str],
    printers: &[&str],
) -> StoreError {
    match violation(&e) {
        Some(Violation::ForeignKey(_)) => {
            // With a single printer in the batch (always the case for a successor task,
            // whose insert runs inside a transaction the failure has aborted, so that no
            // further query could run there) the missing one is known without asking.
            if let Some(first) = printers.first() {
                if tenants.iter().zip(printers).all(|(t, p)| (t, p) == (&tenants[0], first)) {
                    return StoreError::NotFound(format!("printer {first}"));
                }
            }
            let missing = client.query_opt(FIRST_MISSING_PRINTER, &[&tenants, &printers]).await;
            match missing {
                Ok(Some(row)) => match rows::col::<String>(&row, 0) {
                    Ok(p) => StoreError::NotFound(format!("printer {p}")),
                    Err(e) => e,
                },
                _ => StoreError::NotFound("printer of a task in this batch".into()),
            }
        }
        Some(Violation::Unique(_)) => {
            // The key conflict is handled by ON CONFLICT, so this is the primary key: the
            // caller reused a task id for a different key.
            StoreError::AlreadyExists("a task with one of these ids".into())
        }
        None => pg_error(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 20 000 tombstones of one tenant, with fresh statistics: the plans are the ones a
    /// database that has pruned for a while gets.
    const POPULATE: &str = "
INSERT INTO task_tombstones (task_id, tenant_id, store_id, printer_id, target, biz_no, print_type, priority,
                             content_type, fingerprint, state, attempts, created_at, updated_at, may_have_printed,
                             business_day, pruned_at)
    SELECT lpad(i::text, 20, '0'), 't', 's', 'p', 'printer:p', 'b' || i, 'receipt', 0, 'text', 'f', 'printed', 1,
           i, i, false, '2025-01-01', i
    FROM generate_series(1, 20000) i;
ANALYZE task_tombstones;
SET plan_cache_mode = force_generic_plan;";

    /// Intake probes the tombstones of each submitted key through their unique key, in the
    /// plan every batch runs with (a generic one: the statement is prepared once per
    /// connection), never by reading the table, which grows with every pruned task.
    #[tokio::test]
    async fn the_tombstone_checks_of_intake_use_the_key_index() {
        let Some(h) = crate::testing::fresh_store().await else {
            return;
        };
        let (client, connection) = tokio_postgres::connect(&h.url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        client.batch_execute(POPULATE).await.unwrap();
        for (name, sql, args) in [
            (
                "ins",
                INSERT_TASKS.to_owned(),
                "'{i}', '{t}', '{s}', '{p}', '{NULL}', '{printer:p}', '{b1}', '{receipt}', '{0}', '{text}', \
                 '{\"\\\\x00\"}', '{f}', '{1}', '{tenant:t}', '{1}', '{NULL}', '{NULL}', '{NULL}', '{submitted}', '{0}'",
            ),
            (
                "tomb",
                SELECT_TOMBSTONES.replace("{cols}", TOMBSTONE_COLUMNS_B),
                "'{t}', '{printer:p}', '{b1}', '{receipt}'",
            ),
        ] {
            client.batch_execute(&format!("PREPARE {name} AS {sql}")).await.unwrap();
            let lines = client.query(&format!("EXPLAIN EXECUTE {name}({args})"), &[]).await.unwrap();
            let plan = lines.iter().map(|r| r.get::<_, String>(0)).collect::<Vec<_>>().join("\n");
            assert!(plan.contains("task_tombstones_idempotency_key"), "{name}:\n{plan}");
            assert!(!plan.contains("Seq Scan on task_tombstones"), "{name}:\n{plan}");
        }
        drop(h);
    }
}
