//! The offline outbox: every task the agent accepted on the shop's LAN while the broker
//! could not be reached, durable before the LAN answer goes out (SQLite in the state
//! directory, `synchronous=FULL`), with its local printing state and whether the broker
//! has taken it over yet.
//!
//! The outbox is the agent's own intake while it is offline, so it keeps intake's rules:
//! one task per idempotency key (tenant is implied; target, business number and print
//! type are the key, enforced by a unique index, which is the final judge here as the
//! broker's is in the cloud), the content fingerprint to tell a retry (200) from a
//! mismatch (422). It never decides anything once the broker is back: a task not printed
//! by then is handed over and the broker delivers it like any other.
//!
//! States of a row: `accepted` (waiting for its printer, or for the pause after a
//! printer said it cannot print), `printing` (handed to the printer's worker; after a
//! crash it is given to the worker again with the same attempt, and the journal answers
//! for what may have happened), `printed`, `in_doubt` and `failed` (final), `handed`
//! (in an upload to the broker while not printed: it prints only through the broker once
//! the broker took it, and goes back to `accepted` if the upload fails or the process
//! stops before its answer), and `rejected` (handed, and the broker could not take it:
//! kept for a person, never printed here). Nothing the agent answered 201 for leaves the
//! outbox: a task the broker rejected stays, counted on the LAN `/healthz`.

use rusqlite::{params, Connection, OptionalExtension};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::{Arc, Mutex};

const FILE: &str = "offline-outbox.sqlite";

/// Outbox failures: the database file, or the SQL on it.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    #[error("offline outbox {path}: {source}")]
    Open {
        path: String,
        #[source]
        source: rusqlite::Error,
    },
    #[error("offline outbox: {0}")]
    Sql(#[from] rusqlite::Error),
    #[error("offline outbox: {0}")]
    Internal(String),
}

/// The local state of an offline task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LocalState {
    Accepted,
    Printing,
    Printed,
    InDoubt,
    Failed,
    Handed,
    /// Handed to the broker, which could not take it (`rejected`), before it printed: it
    /// is kept, never printed here, and shown (the LAN `/healthz`, the log, the broker's
    /// `offline_task.rejected` alert) for a person to decide.
    Rejected,
}

impl LocalState {
    pub fn as_str(self) -> &'static str {
        match self {
            LocalState::Accepted => "accepted",
            LocalState::Printing => "printing",
            LocalState::Printed => "printed",
            LocalState::InDoubt => "in_doubt",
            LocalState::Failed => "failed",
            LocalState::Handed => "handed",
            LocalState::Rejected => "rejected",
        }
    }

    fn parse(s: &str) -> LocalState {
        match s {
            "printing" => LocalState::Printing,
            "printed" => LocalState::Printed,
            "in_doubt" => LocalState::InDoubt,
            "failed" => LocalState::Failed,
            "handed" => LocalState::Handed,
            "rejected" => LocalState::Rejected,
            _ => LocalState::Accepted,
        }
    }

    /// The task state (docs/API.md) a LAN answer names for this local state.
    pub fn task_state(self) -> &'static str {
        match self {
            LocalState::Accepted | LocalState::Handed => "pending",
            LocalState::Printing => "sent",
            LocalState::Printed => "printed",
            LocalState::InDoubt => "in_doubt",
            LocalState::Failed | LocalState::Rejected => "failed",
        }
    }
}

/// One outcome of a local attempt, kept for the upload to the broker's audit trail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryEntry {
    pub at: i64,
    pub attempt: u32,
    pub state: String,
    pub detail: String,
}

/// A task accepted offline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OfflineTask {
    pub task_id: String,
    /// `printer:ID` or `station:ID` (core's key part).
    pub target: String,
    pub biz_no: String,
    pub print_type: String,
    pub fingerprint: String,
    /// The submission's JSON body as the POS sent it (fields of `POST /v1/print-tasks`);
    /// uploaded as is, so the broker canonicalizes and fingerprints it itself.
    pub request: String,
    /// The printer it prints on (for a station, the one chosen at acceptance).
    pub printer_id: String,
    pub delivery_key: String,
    pub lan_key_id: String,
    pub accepted_at: i64,
    pub state: LocalState,
    /// The attempt last given to the printer's worker (0: none yet).
    pub attempt: u32,
    /// When an `accepted` task may go to its printer again.
    pub next_at: i64,
    pub detail: String,
    pub history: Vec<HistoryEntry>,
    pub synced: bool,
    /// The boot the acceptance was timed in, and the machine's clock since that boot then
    /// (`crate::boot_clock`); empty and 0 for a task an older agent accepted.
    pub clock_origin: String,
    pub clock_ms: i64,
}

/// The most outcomes kept per task. A printer out of paper for a whole evening retries a
/// task every half minute; its history keeps the first outcome and the latest ones, so
/// that it stays small on disk and within what the broker takes in one upload.
pub const MAX_HISTORY: usize = 100;

/// Drops the oldest outcomes but the first beyond [`MAX_HISTORY`].
fn bound_history(h: &mut Vec<HistoryEntry>) {
    if h.len() > MAX_HISTORY {
        let extra = h.len() - MAX_HISTORY;
        h.drain(1..1 + extra);
    }
}

/// What the broker made of a task accepted on the LAN, once it was synced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handover {
    pub synced: bool,
    /// The sync's result (`created`, `merged`, `conflict`, `rejected`), once synced.
    pub result: Option<String>,
    /// The broker's task under the same key, when it named one.
    pub broker_task_id: Option<String>,
}

/// What inserting a new offline task found.
#[derive(Debug)]
pub enum Inserted {
    Created(OfflineTask),
    /// A task under the same key exists already (a retry, or a race with one).
    Existing(OfflineTask),
}

/// The outbox. Cheap to clone; every call runs on the blocking pool.
#[derive(Clone)]
pub struct Outbox {
    conn: Arc<Mutex<Connection>>,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS lan_tasks (
    task_id TEXT PRIMARY KEY,
    target TEXT NOT NULL,
    biz_no TEXT NOT NULL,
    print_type TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    request TEXT NOT NULL,
    printer_id TEXT NOT NULL,
    delivery_key TEXT NOT NULL,
    lan_key_id TEXT NOT NULL,
    accepted_at INTEGER NOT NULL,
    state TEXT NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 0,
    next_at INTEGER NOT NULL,
    detail TEXT NOT NULL DEFAULT '',
    history TEXT NOT NULL DEFAULT '[]',
    synced INTEGER NOT NULL DEFAULT 0,
    sync_result TEXT,
    broker_task_id TEXT
);
CREATE UNIQUE INDEX IF NOT EXISTS lan_tasks_key ON lan_tasks (target, biz_no, print_type);
CREATE INDEX IF NOT EXISTS lan_tasks_open ON lan_tasks (synced, state);
CREATE TABLE IF NOT EXISTS forwarded (
    target TEXT NOT NULL,
    biz_no TEXT NOT NULL,
    print_type TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    task_id TEXT NOT NULL,
    state TEXT NOT NULL,
    at INTEGER NOT NULL,
    PRIMARY KEY (target, biz_no, print_type)
);
CREATE INDEX IF NOT EXISTS forwarded_at ON forwarded (at);
";

/// How long the answer to a forwarded submission is remembered: a POS retries a ticket
/// within minutes, rarely hours; a week covers any outage a shop rides out.
pub const FORWARDED_KEPT_MS: i64 = 7 * 24 * 3600 * 1000;

/// A submission the broker answered through this agent (201 or 200): a retry of it while
/// the broker is unreachable is answered with the broker's task, never accepted anew.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forwarded {
    pub target: String,
    pub biz_no: String,
    pub print_type: String,
    pub fingerprint: String,
    pub task_id: String,
    /// The task's state in the broker's answer.
    pub state: String,
    pub at: i64,
}

const COLUMNS: &str = "task_id, target, biz_no, print_type, fingerprint, request, printer_id, delivery_key, \
                       lan_key_id, accepted_at, state, attempt, next_at, detail, history, synced, clock_origin, \
                       clock_ms";

fn row_to_task(r: &rusqlite::Row<'_>) -> rusqlite::Result<OfflineTask> {
    let history: String = r.get(14)?;
    Ok(OfflineTask {
        task_id: r.get(0)?,
        target: r.get(1)?,
        biz_no: r.get(2)?,
        print_type: r.get(3)?,
        fingerprint: r.get(4)?,
        request: r.get(5)?,
        printer_id: r.get(6)?,
        delivery_key: r.get(7)?,
        lan_key_id: r.get(8)?,
        accepted_at: r.get(9)?,
        state: LocalState::parse(&r.get::<_, String>(10)?),
        attempt: r.get(11)?,
        next_at: r.get(12)?,
        detail: r.get(13)?,
        history: serde_json::from_str(&history).unwrap_or_default(),
        synced: r.get::<_, i64>(15)? != 0,
        clock_origin: r.get(16)?,
        clock_ms: r.get(17)?,
    })
}

impl Outbox {
    /// Opens (creating if needed) the outbox in the state directory.
    pub fn open(dir: &Path) -> Result<Outbox, OutboxError> {
        let path = dir.join(FILE);
        let open_err = |source| OutboxError::Open { path: path.display().to_string(), source };
        let conn = Connection::open(&path).map_err(open_err)?;
        // WAL with a full sync per commit: the LAN answer goes out only after the task is
        // on disk, as the broker's does (nothing accepted is lost on a power cut).
        conn.pragma_update(None, "journal_mode", "WAL").map_err(open_err)?;
        conn.pragma_update(None, "synchronous", "FULL").map_err(open_err)?;
        conn.busy_timeout(std::time::Duration::from_secs(5)).map_err(open_err)?;
        conn.execute_batch(SCHEMA).map_err(open_err)?;
        // Columns later releases added to an outbox an earlier one created.
        let has = |column: &str| -> rusqlite::Result<bool> {
            conn.query_row("SELECT COUNT(*) FROM pragma_table_info('lan_tasks') WHERE name = ?1", [column], |r| {
                r.get::<_, i64>(0)
            })
            .map(|n| n > 0)
        };
        if !has("clock_origin").map_err(open_err)? {
            conn.execute_batch(
                "ALTER TABLE lan_tasks ADD COLUMN clock_origin TEXT NOT NULL DEFAULT ''; \
                 ALTER TABLE lan_tasks ADD COLUMN clock_ms INTEGER NOT NULL DEFAULT 0;",
            )
            .map_err(open_err)?;
        }
        // A process that stopped between marking tasks for an upload and hearing its
        // answer left them `handed`: the broker may have taken them, as after a lost
        // answer, so they stay with it and go in the next upload (`take_for_sync` takes
        // them again), whose answer is the first one's.
        Ok(Outbox { conn: Arc::new(Mutex::new(conn)) })
    }

    async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, OutboxError> + Send + 'static,
    ) -> Result<T, OutboxError> {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            let mut c = conn.lock().map_err(|_| OutboxError::Internal("outbox lock poisoned".into()))?;
            f(&mut c)
        })
        .await
        .map_err(|e| OutboxError::Internal(format!("outbox task: {e}")))?
    }

    /// The task under this key, if any.
    pub async fn find(&self, target: &str, biz_no: &str, print_type: &str) -> Result<Option<OfflineTask>, OutboxError> {
        let (t, b, p) = (target.to_owned(), biz_no.to_owned(), print_type.to_owned());
        self.with(move |c| {
            Ok(c.query_row(
                &format!("SELECT {COLUMNS} FROM lan_tasks WHERE target = ?1 AND biz_no = ?2 AND print_type = ?3"),
                params![t, b, p],
                row_to_task,
            )
            .optional()?)
        })
        .await
    }

    /// A task by its id.
    pub async fn get(&self, task_id: &str) -> Result<Option<OfflineTask>, OutboxError> {
        let id = task_id.to_owned();
        self.with(move |c| {
            Ok(c.query_row(&format!("SELECT {COLUMNS} FROM lan_tasks WHERE task_id = ?1"), params![id], row_to_task)
                .optional()?)
        })
        .await
    }

    /// Whether `task_id` is a task accepted on the LAN, and what the broker said of it:
    /// `None` for any other task id (one the broker handed out).
    pub async fn handover(&self, task_id: &str) -> Result<Option<Handover>, OutboxError> {
        let id = task_id.to_owned();
        self.with(move |c| {
            Ok(c.query_row(
                "SELECT synced, sync_result, broker_task_id FROM lan_tasks WHERE task_id = ?1",
                params![id],
                |r| Ok(Handover { synced: r.get::<_, i64>(0)? != 0, result: r.get(1)?, broker_task_id: r.get(2)? }),
            )
            .optional()?)
        })
        .await
    }

    /// Inserts a new task, durably; the unique key decides a race between two LAN
    /// requests for one key.
    pub async fn insert(&self, task: OfflineTask) -> Result<Inserted, OutboxError> {
        self.with(move |c| {
            let n = c.execute(
                "INSERT INTO lan_tasks (task_id, target, biz_no, print_type, fingerprint, request, printer_id, \
                 delivery_key, lan_key_id, accepted_at, state, attempt, next_at, detail, clock_origin, clock_ms) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, 'accepted', 0, ?10, '', ?11, ?12) \
                 ON CONFLICT (target, biz_no, print_type) DO NOTHING",
                params![
                    task.task_id,
                    task.target,
                    task.biz_no,
                    task.print_type,
                    task.fingerprint,
                    task.request,
                    task.printer_id,
                    task.delivery_key,
                    task.lan_key_id,
                    task.accepted_at,
                    task.clock_origin,
                    task.clock_ms
                ],
            )?;
            let found = c.query_row(
                &format!("SELECT {COLUMNS} FROM lan_tasks WHERE target = ?1 AND biz_no = ?2 AND print_type = ?3"),
                params![task.target, task.biz_no, task.print_type],
                row_to_task,
            )?;
            Ok(if n == 1 { Inserted::Created(found) } else { Inserted::Existing(found) })
        })
        .await
    }

    /// Tasks to give to their printers now: `printing` ones (left so by a crash; the
    /// journal answers for them) and `accepted` ones whose pause is over, oldest first.
    pub async fn due(&self, now: i64) -> Result<Vec<OfflineTask>, OutboxError> {
        self.with(move |c| {
            let mut st = c.prepare(&format!(
                "SELECT {COLUMNS} FROM lan_tasks WHERE synced = 0 AND \
                 (state = 'printing' OR (state = 'accepted' AND next_at <= ?1)) ORDER BY task_id"
            ))?;
            let rows = st.query_map(params![now], row_to_task)?.collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .await
    }

    /// `accepted` → `printing` with the next attempt number, durably, before the task
    /// goes to its printer's worker. `None` when the task is no longer `accepted` (the
    /// broker took it over meanwhile).
    pub async fn start(&self, task_id: &str) -> Result<Option<u32>, OutboxError> {
        let id = task_id.to_owned();
        self.with(move |c| {
            let n = c.execute(
                "UPDATE lan_tasks SET state = 'printing', attempt = attempt + 1 \
                 WHERE task_id = ?1 AND state = 'accepted' AND synced = 0",
                params![id],
            )?;
            if n == 0 {
                return Ok(None);
            }
            Ok(Some(c.query_row("SELECT attempt FROM lan_tasks WHERE task_id = ?1", params![id], |r| r.get(0))?))
        })
        .await
    }

    /// Records the outcome of attempt `attempt`: a final state, or back to `accepted`
    /// until `retry_at` (a printer that said it cannot print; nothing came out).
    pub async fn finish(
        &self,
        task_id: &str,
        attempt: u32,
        to: LocalState,
        retry_at: i64,
        entry: HistoryEntry,
    ) -> Result<bool, OutboxError> {
        let id = task_id.to_owned();
        self.with(move |c| {
            let tx = c.transaction()?;
            let history: Option<String> = tx
                .query_row(
                    "SELECT history FROM lan_tasks WHERE task_id = ?1 AND state = 'printing' AND attempt = ?2",
                    params![id, attempt],
                    |r| r.get(0),
                )
                .optional()?;
            let Some(history) = history else { return Ok(false) };
            let mut h: Vec<HistoryEntry> = serde_json::from_str(&history).unwrap_or_default();
            let detail = entry.detail.clone();
            h.push(entry);
            bound_history(&mut h);
            let h = serde_json::to_string(&h).map_err(|e| OutboxError::Internal(e.to_string()))?;
            tx.execute(
                "UPDATE lan_tasks SET state = ?2, next_at = ?3, detail = ?4, history = ?5 WHERE task_id = ?1",
                params![id, to.as_str(), retry_at, detail, h],
            )?;
            tx.commit()?;
            Ok(true)
        })
        .await
    }

    /// Tasks the broker has not taken yet, for the upload, at most `limit`: those of them
    /// not printed are marked `handed` first (in the same transaction), so that from now
    /// on they print only through the broker. Only the tasks of this upload are marked:
    /// the others stay on the local lane until their own upload, so that a failing upload
    /// leaves no task that can neither print here nor reach the broker. A task being
    /// printed right now waits for its outcome.
    pub async fn take_for_sync(&self, limit: usize) -> Result<Vec<OfflineTask>, OutboxError> {
        Ok(self.take_for_sync_marked(limit).await?.0)
    }

    /// [`Outbox::take_for_sync`], with the ids of the tasks this call handed over (they
    /// were `accepted`): only they may go back to the local lane should this upload fail.
    /// The others were handed to an earlier upload whose answer was lost (or that the
    /// process stopped in), so the broker may have them whatever becomes of this one.
    pub async fn take_for_sync_marked(&self, limit: usize) -> Result<(Vec<OfflineTask>, Vec<String>), OutboxError> {
        self.with(move |c| {
            let tx = c.transaction()?;
            let rows = {
                let mut st = tx.prepare(&format!(
                    "SELECT {COLUMNS} FROM lan_tasks WHERE synced = 0 AND state NOT IN ('printing', 'rejected') \
                     ORDER BY task_id LIMIT ?1"
                ))?;
                let rows = st.query_map(params![limit as i64], row_to_task)?.collect::<Result<Vec<_>, _>>()?;
                rows
            };
            let mut out = Vec::with_capacity(rows.len());
            let mut handed_now = Vec::new();
            for mut t in rows {
                if t.state == LocalState::Accepted {
                    tx.execute("UPDATE lan_tasks SET state = 'handed' WHERE task_id = ?1", params![t.task_id])?;
                    t.state = LocalState::Handed;
                    handed_now.push(t.task_id.clone());
                }
                out.push(t);
            }
            tx.commit()?;
            Ok((out, handed_now))
        })
        .await
    }

    /// A failed upload that the broker did not take (it was never sent, or the broker
    /// answered that it failed): `handed` tasks go back to `accepted` and print here again.
    /// An upload whose answer was lost is not this: the broker may have taken it, so its
    /// tasks stay `handed` until an upload is answered.
    pub async fn sync_failed(&self, task_ids: Vec<String>) -> Result<(), OutboxError> {
        self.with(move |c| {
            let tx = c.transaction()?;
            for id in &task_ids {
                tx.execute(
                    "UPDATE lan_tasks SET state = 'accepted' WHERE task_id = ?1 AND state = 'handed' AND synced = 0",
                    params![id],
                )?;
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }

    /// The broker answered for these tasks: (task id, result, the broker's task id).
    pub async fn synced(&self, results: Vec<(String, String, Option<String>)>) -> Result<(), OutboxError> {
        self.with(move |c| {
            let tx = c.transaction()?;
            for (id, result, broker_id) in &results {
                tx.execute(
                    "UPDATE lan_tasks SET synced = 1, sync_result = ?2, broker_task_id = ?3 WHERE task_id = ?1",
                    params![id, result, broker_id],
                )?;
                if result == "rejected" {
                    tx.execute(
                        "UPDATE lan_tasks SET state = 'rejected' WHERE task_id = ?1 AND state = 'handed'",
                        [id],
                    )?;
                }
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }

    /// Remembers the broker's answer to a forwarded submission (the latest one per key),
    /// and forgets those older than [`FORWARDED_KEPT_MS`].
    pub async fn remember_forwarded(&self, f: Forwarded) -> Result<(), OutboxError> {
        self.with(move |c| {
            // Written on every forward the broker answered, so without an fsync of its own:
            // a remembered answer lost to a power cut only means a retry during the next
            // outage gets a LAN task id of its own, which the broker merges into its task
            // (same key, same printer: the journal prints it once). The connection is back
            // to a full sync before anything else writes.
            c.pragma_update(None, "synchronous", "NORMAL")?;
            let written = remember_forwarded(c, &f);
            c.pragma_update(None, "synchronous", "FULL")?;
            written
        })
        .await
    }

    /// The broker's answer to a forwarded submission under this key, if remembered.
    pub async fn forwarded(
        &self,
        target: &str,
        biz_no: &str,
        print_type: &str,
    ) -> Result<Option<Forwarded>, OutboxError> {
        let (t, b, p) = (target.to_owned(), biz_no.to_owned(), print_type.to_owned());
        self.with(move |c| {
            Ok(c.query_row(
                "SELECT target, biz_no, print_type, fingerprint, task_id, state, at FROM forwarded \
                 WHERE target = ?1 AND biz_no = ?2 AND print_type = ?3",
                params![t, b, p],
                |r| {
                    Ok(Forwarded {
                        target: r.get(0)?,
                        biz_no: r.get(1)?,
                        print_type: r.get(2)?,
                        fingerprint: r.get(3)?,
                        task_id: r.get(4)?,
                        state: r.get(5)?,
                        at: r.get(6)?,
                    })
                },
            )
            .optional()?)
        })
        .await
    }

    /// How many tasks the broker answered `rejected`: kept here for a person.
    pub async fn rejected(&self) -> Result<u64, OutboxError> {
        self.with(|c| {
            Ok(
                c.query_row("SELECT COUNT(*) FROM lan_tasks WHERE sync_result = 'rejected'", [], |r| {
                    r.get::<_, i64>(0)
                })? as u64,
            )
        })
        .await
    }

    /// How many tasks the broker has not taken yet.
    pub async fn unsynced(&self) -> Result<u64, OutboxError> {
        self.with(|c| {
            Ok(c.query_row("SELECT COUNT(*) FROM lan_tasks WHERE synced = 0", [], |r| r.get::<_, i64>(0))? as u64)
        })
        .await
    }
}

/// Writes a remembered forward, forgetting those past [`FORWARDED_KEPT_MS`].
fn remember_forwarded(c: &Connection, f: &Forwarded) -> Result<(), OutboxError> {
    c.execute(
        "INSERT INTO forwarded (target, biz_no, print_type, fingerprint, task_id, state, at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) \
         ON CONFLICT (target, biz_no, print_type) DO UPDATE SET fingerprint = excluded.fingerprint, \
         task_id = excluded.task_id, state = excluded.state, at = excluded.at",
        params![f.target, f.biz_no, f.print_type, f.fingerprint, f.task_id, f.state, f.at],
    )?;
    c.execute("DELETE FROM forwarded WHERE at < ?1", params![f.at - FORWARDED_KEPT_MS])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(id: &str, biz_no: &str, fingerprint: &str) -> OfflineTask {
        OfflineTask {
            task_id: id.into(),
            target: "printer:p1".into(),
            biz_no: biz_no.into(),
            print_type: "receipt".into(),
            fingerprint: fingerprint.into(),
            request: "{}".into(),
            printer_id: "p1".into(),
            delivery_key: format!("{biz_no}#p1"),
            lan_key_id: "k1".into(),
            accepted_at: 1_000,
            state: LocalState::Accepted,
            attempt: 0,
            next_at: 1_000,
            detail: String::new(),
            history: Vec::new(),
            synced: false,
            clock_origin: "boot:test".into(),
            clock_ms: 500,
        }
    }

    fn entry(state: &str) -> HistoryEntry {
        HistoryEntry { at: 2_000, attempt: 1, state: state.into(), detail: String::new() }
    }

    #[tokio::test]
    async fn one_task_per_key_survives_reopening() {
        let dir = tempfile::tempdir().expect("dir");
        let o = Outbox::open(dir.path()).expect("open");
        assert!(matches!(o.insert(task("t1", "A1", "f1")).await, Ok(Inserted::Created(_))));
        match o.insert(task("t2", "A1", "f2")).await {
            Ok(Inserted::Existing(t)) => assert_eq!((t.task_id.as_str(), t.fingerprint.as_str()), ("t1", "f1")),
            other => panic!("the key's first task answers: {other:?}"),
        }
        drop(o);
        let o = Outbox::open(dir.path()).expect("reopen");
        let found = o.find("printer:p1", "A1", "receipt").await.expect("find").expect("kept");
        assert_eq!(found.task_id, "t1");
        assert_eq!(o.unsynced().await.ok(), Some(1));
    }

    #[tokio::test]
    async fn attempts_grow_and_a_printing_task_comes_back_after_a_crash() {
        let dir = tempfile::tempdir().expect("dir");
        let o = Outbox::open(dir.path()).expect("open");
        o.insert(task("t1", "A1", "f")).await.expect("insert");
        assert_eq!(o.start("t1").await.ok(), Some(Some(1)));
        assert_eq!(o.start("t1").await.ok(), Some(None), "only an accepted task starts");
        // No paper: back to accepted until the pause is over.
        assert!(o.finish("t1", 1, LocalState::Accepted, 5_000, entry("no_paper")).await.expect("finish"));
        assert!(o.due(4_999).await.expect("due").is_empty());
        assert_eq!(o.due(5_000).await.expect("due").len(), 1);
        assert_eq!(o.start("t1").await.ok(), Some(Some(2)));
        // A crash now: the task is still printing, and due at once with attempt 2.
        drop(o);
        let o = Outbox::open(dir.path()).expect("reopen");
        let due = o.due(0).await.expect("due");
        assert_eq!((due[0].state, due[0].attempt), (LocalState::Printing, 2));
        assert!(!o.finish("t1", 1, LocalState::Printed, 0, entry("printed")).await.expect("stale"), "stale attempt");
        assert!(o.finish("t1", 2, LocalState::Printed, 0, entry("printed")).await.expect("finish"));
        let t = o.get("t1").await.expect("get").expect("kept");
        assert_eq!((t.state, t.history.len()), (LocalState::Printed, 2));
    }

    #[tokio::test]
    async fn only_the_tasks_of_an_upload_are_handed_and_stay_handed_over_a_crash() {
        let dir = tempfile::tempdir().expect("dir");
        let o = Outbox::open(dir.path()).expect("open");
        for (id, biz_no) in [("t1", "A1"), ("t2", "A2"), ("t3", "A3")] {
            o.insert(task(id, biz_no, "f")).await.expect("insert");
        }
        let taken: Vec<String> = o.take_for_sync(2).await.expect("take").into_iter().map(|t| t.task_id).collect();
        assert_eq!(taken, ["t1", "t2"]);
        assert!(taken.iter().all(|id| id != "t3"));
        // The task left out of this upload still prints here while the upload is pending.
        assert_eq!(o.start("t3").await.ok(), Some(Some(1)), "not part of the upload: it prints here");
        assert_eq!(o.start("t1").await.ok(), Some(None), "part of the upload: it waits for the answer");
        // The process stops before the upload's answer: the broker may have taken t1 and
        // t2, so at the next start they still wait for it, and go in the next upload.
        drop(o);
        let o = Outbox::open(dir.path()).expect("reopen");
        assert_eq!(o.start("t1").await.ok(), Some(None));
        assert_eq!(o.start("t2").await.ok(), Some(None));
        let again: Vec<String> = o.take_for_sync(10).await.expect("take").into_iter().map(|t| t.task_id).collect();
        assert_eq!(again, ["t1", "t2"], "t3 is being printed here: it goes up once it has an outcome");
    }

    #[tokio::test]
    async fn an_outbox_of_an_earlier_release_is_opened_and_keeps_its_tasks() {
        let dir = tempfile::tempdir().expect("dir");
        {
            // The tables as the release before the clock columns created them (`SCHEMA`
            // itself is unchanged since: the columns are added when the outbox opens).
            let c = Connection::open(dir.path().join(FILE)).expect("open");
            c.execute_batch(SCHEMA).expect("schema");
            c.execute(
                "INSERT INTO lan_tasks (task_id, target, biz_no, print_type, fingerprint, request, printer_id, \
                 delivery_key, lan_key_id, accepted_at, state, next_at) \
                 VALUES ('t0', 'printer:p1', 'A0', 'receipt', 'f', '{}', 'p1', 'A0#p1', 'k1', 1000, 'accepted', 1000)",
                [],
            )
            .expect("insert");
        }
        let o = Outbox::open(dir.path()).expect("open an earlier outbox");
        let t = o.get("t0").await.expect("get").expect("kept");
        assert_eq!((t.clock_origin.as_str(), t.clock_ms), ("", 0), "an older task has no boot clock");
        o.insert(task("t1", "A1", "f")).await.expect("insert");
        let t = o.get("t1").await.expect("get").expect("kept");
        assert_eq!((t.clock_origin.as_str(), t.clock_ms), ("boot:test", 500));
    }

    #[test]
    fn the_boot_clock_goes_on_with_its_origin() {
        let (origin, a) = crate::boot_clock();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let (again, b) = crate::boot_clock();
        assert_eq!(origin, again);
        assert!(b - a >= 20 && !origin.is_empty(), "{a} then {b}");
    }

    #[tokio::test]
    async fn a_rejected_task_is_kept_and_counted_and_never_printed_here() {
        let dir = tempfile::tempdir().expect("dir");
        let o = Outbox::open(dir.path()).expect("open");
        o.insert(task("t1", "A1", "f")).await.expect("insert");
        o.take_for_sync(10).await.expect("take");
        o.synced(vec![("t1".into(), "rejected".into(), None)]).await.expect("synced");
        let t = o.get("t1").await.expect("get").expect("kept");
        assert_eq!((t.state, t.synced), (LocalState::Rejected, true));
        assert_eq!(t.state.task_state(), "failed", "a retry of it is told it will not print");
        assert_eq!(o.rejected().await.ok(), Some(1));
        assert_eq!(o.start("t1").await.ok(), Some(None));
        assert!(o.due(i64::MAX).await.expect("due").is_empty());
    }

    #[tokio::test]
    async fn the_history_keeps_the_first_and_the_latest_outcomes() {
        let dir = tempfile::tempdir().expect("dir");
        let o = Outbox::open(dir.path()).expect("open");
        o.insert(task("t1", "A1", "f")).await.expect("insert");
        for attempt in 1..=(MAX_HISTORY as u32 + 30) {
            assert_eq!(o.start("t1").await.ok(), Some(Some(attempt)));
            let e = HistoryEntry { at: i64::from(attempt), attempt, state: "no_paper".into(), detail: String::new() };
            assert!(o.finish("t1", attempt, LocalState::Accepted, 0, e).await.expect("finish"));
        }
        let h = o.get("t1").await.expect("get").expect("kept").history;
        assert_eq!(h.len(), MAX_HISTORY);
        assert_eq!((h[0].attempt, h[1].attempt), (1, 32));
        assert_eq!(h.last().map(|e| e.attempt), Some(MAX_HISTORY as u32 + 30));
    }

    #[tokio::test]
    async fn unprinted_tasks_are_handed_over_and_come_back_when_the_upload_fails() {
        let dir = tempfile::tempdir().expect("dir");
        let o = Outbox::open(dir.path()).expect("open");
        o.insert(task("t1", "A1", "f")).await.expect("insert");
        o.insert(task("t2", "A2", "f")).await.expect("insert");
        o.insert(task("t3", "A3", "f")).await.expect("insert");
        o.start("t2").await.expect("start");
        o.start("t3").await.expect("start");
        o.finish("t3", 1, LocalState::Printed, 0, entry("printed")).await.expect("finish");
        // t2 is being printed: it waits for its outcome.
        let taken: Vec<String> = o.take_for_sync(10).await.expect("take").into_iter().map(|t| t.task_id).collect();
        assert_eq!(taken, ["t1", "t3"]);
        assert_eq!(o.start("t1").await.ok(), Some(None), "a handed task no longer prints here");
        o.sync_failed(vec!["t1".into(), "t3".into()]).await.expect("failed");
        assert_eq!(o.start("t1").await.ok(), Some(Some(1)), "after a failed upload it prints here again");
        o.synced(vec![("t3".into(), "created".into(), Some("t3".into()))]).await.expect("synced");
        assert_eq!(o.unsynced().await.ok(), Some(2));
        assert!(o.get("t3").await.expect("get").is_some_and(|t| t.synced));
        let handed = |synced, result: Option<&str>, broker: Option<&str>| {
            Some(Handover { synced, result: result.map(Into::into), broker_task_id: broker.map(Into::into) })
        };
        assert_eq!(o.handover("t3").await.expect("handover"), handed(true, Some("created"), Some("t3")));
        assert_eq!(o.handover("t2").await.expect("handover"), handed(false, None, None));
        assert_eq!(o.handover("not-a-lan-task").await.expect("handover"), None);
    }
}
