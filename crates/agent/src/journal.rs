//! The durable print journal: what this agent did with each of its last N task ids.
//!
//! The journal is an append-only file of JSON lines, one [`Record`] per line. The rule the
//! whole agent rests on is the order of two writes: a `started` record is durable (written
//! and fdatasynced) before the first byte of a job goes to the printer, and a `printed`
//! record is durable before the broker is told. So after any crash or power loss, a task id
//! whose latest record is `started` may or may not be on paper, and the agent says so
//! (`in_doubt`) instead of printing it again; a task id whose latest record is `printed` is
//! answered from here without printing.
//!
//! Many printer workers append at once. One writer thread takes every append that is
//! waiting, writes them in one `write`, makes them durable with one `fdatasync`, and only
//! then answers each caller (group commit), so the cost of durability is shared by a burst
//! instead of paid per record. The in-memory index (task id → latest record, bounded to the
//! last N task ids) is updated by the writer after the sync, so a lookup only ever answers
//! from facts that are on disk.
//!
//! Records carry the delivery's idempotency key too, and the index also maps each key to
//! the task id that last wrote under it: "was this key printed here?" is answered like
//! "was this task id printed?", so the same ticket arriving under another task id (the
//! same order sent to the cloud and to the shop, a broker restored from an older backup)
//! is not printed twice, while two tickets of one order (a receipt and a prebill: other
//! print types, other keys) both print.
//!
//! The file is compacted when it holds more than 2N records: the live records are written
//! to a temporary file, synced, renamed over the journal, and the directory is synced, so a
//! crash at any point leaves either the old or the new file, both complete.
//!
//! After power loss the last line may be torn (and a file system may leave a run of NUL
//! bytes where unsynced data was). Such lines were never acknowledged as durable, so no
//! printing depended on them, and they are ignored. Any other unreadable line is damage
//! that a person must look at, and opening fails rather than guess.
//!
//! Once a write or sync has failed, the journal refuses every later append until the agent
//! restarts: after a failed fsync the kernel may have dropped the data silently, and
//! printing on top of a journal that may not be durable would break the rule above.

use crate::fsutil::{now_rfc3339, sync_dir};
use crate::protocol::Outcome;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use tokio::sync::{mpsc, oneshot};

/// The journal's file name inside the state directory.
pub const FILE_NAME: &str = "journal.jsonl";

/// At most this many records go into one write and one sync; a bigger burst is simply
/// split, which keeps the latency of the first caller in a burst bounded.
const MAX_BATCH: usize = 1024;

/// The state a task reached on this agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordState {
    /// Bytes are about to be sent to the printer; without a later record, the task is in
    /// doubt.
    Started,
    Printed,
    InDoubt,
    NoPaper,
    CoverOpen,
    Offline,
    PaperJam,
    Error,
}

impl From<Outcome> for RecordState {
    fn from(o: Outcome) -> RecordState {
        match o {
            Outcome::Printed => RecordState::Printed,
            Outcome::NoPaper => RecordState::NoPaper,
            Outcome::CoverOpen => RecordState::CoverOpen,
            Outcome::Offline => RecordState::Offline,
            Outcome::PaperJam => RecordState::PaperJam,
            Outcome::InDoubt => RecordState::InDoubt,
            Outcome::Error => RecordState::Error,
        }
    }
}

/// One line of the journal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub task_id: String,
    pub attempt: u32,
    pub state: RecordState,
    /// RFC 3339 UTC.
    pub at: String,
    #[serde(default)]
    pub detail: String,
    /// The delivery's idempotency key (docs/API.md: business number, printer, print type,
    /// reprint number), so that the journal also answers "was this key printed here?"
    /// under another task id. Empty in records of journals written before it existed, and
    /// then not written; a later record of the same task without a key keeps the earlier
    /// record's key.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub key: String,
}

impl Record {
    /// A record stamped with the current time.
    pub fn new(task_id: &str, attempt: u32, state: RecordState, detail: impl Into<String>) -> Record {
        Record {
            task_id: task_id.to_owned(),
            attempt,
            state,
            at: now_rfc3339(),
            detail: detail.into(),
            key: String::new(),
        }
    }

    /// The same record with the delivery's idempotency key.
    pub fn keyed(mut self, key: &str) -> Record {
        self.key = key.to_owned();
        self
    }
}

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("journal {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "journal {path}, line {line}: not a valid record ({reason}). Only the last line can be \
         torn by a crash, so this is damage a person must look at; the agent will not guess \
         which tasks it has printed. Move the file aside only once every task it names is \
         settled on the broker."
    )]
    Corrupt { path: PathBuf, line: usize, reason: String },
    #[error("the journal failed earlier ({0}) and accepts nothing more until the agent restarts")]
    Failed(String),
    #[error("the journal is closed")]
    Closed,
}

/// Counters for tests and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct JournalStats {
    /// Records made durable since open.
    pub records: u64,
    /// fdatasync calls for appends since open (one per batch).
    pub syncs: u64,
    /// Compactions since open (including one at open, if the file needed it).
    pub compactions: u64,
    /// Records in the file now.
    pub file_records: u64,
}

#[derive(Default)]
struct Counters {
    records: AtomicU64,
    syncs: AtomicU64,
    compactions: AtomicU64,
    file_records: AtomicU64,
}

/// Task id → latest record, for the last `capacity` task ids written, and idempotency
/// key → the task id that last wrote a record under it.
struct Index {
    capacity: usize,
    map: HashMap<String, (u64, Record)>,
    by_key: HashMap<String, String>,
    /// Task ids in the order they were last written; entries whose sequence number no
    /// longer matches the map are stale and skipped, which keeps updates O(1).
    order: VecDeque<(u64, String)>,
    next_seq: u64,
}

impl Index {
    fn new(capacity: usize) -> Index {
        Index { capacity, map: HashMap::new(), by_key: HashMap::new(), order: VecDeque::new(), next_seq: 0 }
    }

    fn insert(&mut self, mut record: Record) {
        let seq = self.next_seq;
        self.next_seq += 1;
        if record.key.is_empty() {
            if let Some((_, earlier)) = self.map.get(&record.task_id) {
                record.key = earlier.key.clone();
            }
        }
        if !record.key.is_empty() {
            // The later writer owns the key, except that a task whose latest record is
            // `printed` keeps it against another task's record that is not: the answer
            // to "was this key printed here?" must not be lost to a task that only said
            // it was in doubt because of it (a reprint on doubt would then print it).
            let printed_elsewhere = self.by_key.get(&record.key).is_some_and(|owner| {
                *owner != record.task_id && self.map.get(owner).is_some_and(|(_, r)| r.state == RecordState::Printed)
            });
            if record.state == RecordState::Printed || !printed_elsewhere {
                self.by_key.insert(record.key.clone(), record.task_id.clone());
            }
        }
        self.order.push_back((seq, record.task_id.clone()));
        self.map.insert(record.task_id.clone(), (seq, record));
        while self.map.len() > self.capacity {
            match self.order.pop_front() {
                Some((s, id)) => {
                    if self.map.get(&id).is_some_and(|(live, _)| *live == s) {
                        if let Some((_, gone)) = self.map.remove(&id) {
                            if self.by_key.get(&gone.key).is_some_and(|owner| *owner == id) {
                                self.by_key.remove(&gone.key);
                            }
                        }
                    }
                }
                None => break,
            }
        }
        // Stale entries pile up when the same task ids are written again and again;
        // rebuilding from the map now and then keeps the queue within a constant factor
        // of the live set.
        if self.order.len() > 2 * self.capacity + 1024 {
            let mut live: Vec<(u64, String)> = self.map.iter().map(|(id, (s, _))| (*s, id.clone())).collect();
            live.sort_unstable();
            self.order = live.into();
        }
    }

    /// Live records, oldest write first, so that replaying them rebuilds the same order.
    fn live_in_order(&self) -> Vec<&Record> {
        let mut live: Vec<(u64, &Record)> = self.map.values().map(|(s, r)| (*s, r)).collect();
        live.sort_unstable_by_key(|(s, _)| *s);
        live.into_iter().map(|(_, r)| r).collect()
    }
}

enum Request {
    Append { record: Record, done: oneshot::Sender<Result<(), JournalError>> },
    Close { done: oneshot::Sender<Result<(), JournalError>> },
}

/// The journal. Share it with `Arc`; appends from many tasks are group-committed.
pub struct Journal {
    path: PathBuf,
    tx: Mutex<Option<mpsc::UnboundedSender<Request>>>,
    index: Arc<Mutex<Index>>,
    counters: Arc<Counters>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave the index half-updated in a way that
    // matters (each insert is a few map operations), so a poisoned lock is still usable.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Journal {
    /// Opens (or creates) the journal in `dir`, keeping the last `capacity` task ids.
    /// Blocking: reads the whole file. Call it from a blocking context in async code.
    pub fn open(dir: &Path, capacity: usize) -> Result<Journal, JournalError> {
        let capacity = capacity.max(1);
        let path = dir.join(FILE_NAME);
        let io_err = |source| JournalError::Io { path: path.clone(), source };
        let loaded = load(&path, capacity)?;
        let counters = Arc::new(Counters::default());
        let mut file_records = loaded.records;
        let file = if loaded.needs_rewrite || file_records > 2 * capacity {
            if loaded.needs_rewrite {
                tracing::warn!(
                    path = %path.display(),
                    "journal ends in a torn or unterminated record (crash or power loss while writing); \
                     rewriting it without the unreadable part"
                );
            }
            let (file, written) = compact(&path, &loaded.index).map_err(io_err)?;
            counters.compactions.fetch_add(1, Ordering::Relaxed);
            file_records = written;
            file
        } else {
            let existed = path.exists();
            let file = OpenOptions::new().create(true).append(true).open(&path).map_err(io_err)?;
            if !existed {
                // The new file's directory entry must be durable before anything in the
                // file is relied on.
                sync_dir(dir).map_err(io_err)?;
            }
            file
        };
        counters.file_records.store(file_records as u64, Ordering::Relaxed);
        let index = Arc::new(Mutex::new(loaded.index));
        let (tx, rx) = mpsc::unbounded_channel();
        let writer = Writer {
            path: path.clone(),
            file,
            file_records,
            capacity,
            failed: None,
            index: index.clone(),
            counters: counters.clone(),
        };
        std::thread::Builder::new().name("journal-writer".into()).spawn(move || writer.run(rx)).map_err(io_err)?;
        Ok(Journal { path, tx: Mutex::new(Some(tx)), index, counters })
    }

    /// The journal file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The latest durable record of `task_id`, if it is among the last N task ids.
    pub fn lookup(&self, task_id: &str) -> Option<Record> {
        lock(&self.index).map.get(task_id).map(|(_, r)| r.clone())
    }

    /// The latest durable record written under the idempotency key `key`, by whichever
    /// task id wrote it last, if that task id is among the last N. The same key under
    /// another task id means the same ticket (an order that reached the broker twice, a
    /// task accepted offline and again in the cloud, a broker restored from an older
    /// backup): what this answers decides whether it may print.
    pub fn lookup_key(&self, key: &str) -> Option<Record> {
        if key.is_empty() {
            return None;
        }
        let index = lock(&self.index);
        let task_id = index.by_key.get(key)?;
        index.map.get(task_id).map(|(_, r)| r.clone())
    }

    /// The latest record of every task id the journal remembers whose latest record was
    /// written at or after the mark `since` (0: all of them), oldest write first, and the
    /// mark to ask from next time: what the device-log digest uploads, a little at a time.
    pub fn latest_since(&self, since: u64) -> (Vec<Record>, u64) {
        let index = lock(&self.index);
        let mut live: Vec<(u64, &Record)> =
            index.map.values().filter(|(s, _)| *s >= since).map(|(s, r)| (*s, r)).collect();
        live.sort_unstable_by_key(|(s, _)| *s);
        (live.into_iter().map(|(_, r)| r.clone()).collect(), index.next_seq)
    }

    /// How many task ids the journal remembers now.
    pub fn len(&self) -> usize {
        lock(&self.index).map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn stats(&self) -> JournalStats {
        JournalStats {
            records: self.counters.records.load(Ordering::Relaxed),
            syncs: self.counters.syncs.load(Ordering::Relaxed),
            compactions: self.counters.compactions.load(Ordering::Relaxed),
            file_records: self.counters.file_records.load(Ordering::Relaxed),
        }
    }

    /// Appends `record` and returns once it is durable (or the write failed).
    pub async fn append(&self, record: Record) -> Result<(), JournalError> {
        let (done, answer) = oneshot::channel();
        {
            let tx = lock(&self.tx);
            let tx = tx.as_ref().ok_or(JournalError::Closed)?;
            tx.send(Request::Append { record, done }).map_err(|_| JournalError::Closed)?;
        }
        // The writer answers every request it takes; a dropped answer means the writer
        // thread is gone, which leaves the record's durability unknown.
        answer.await.unwrap_or(Err(JournalError::Closed))
    }

    /// Waits for every append already queued, stops the writer and refuses later appends.
    /// Returns the writer's failure, if it had one.
    pub async fn close(&self) -> Result<(), JournalError> {
        let (done, answer) = oneshot::channel();
        let tx = lock(&self.tx).take();
        match tx {
            Some(tx) => {
                if tx.send(Request::Close { done }).is_err() {
                    return Ok(());
                }
            }
            None => return Ok(()),
        }
        answer.await.unwrap_or(Ok(()))
    }
}

struct Loaded {
    index: Index,
    records: usize,
    /// The file ends in something that is not a complete record line.
    needs_rewrite: bool,
}

fn load(path: &Path, capacity: usize) -> Result<Loaded, JournalError> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(source) => return Err(JournalError::Io { path: path.to_owned(), source }),
    };
    let mut index = Index::new(capacity);
    let mut records = 0;
    let mut needs_rewrite = false;
    let segments: Vec<&[u8]> = bytes.split(|b| *b == b'\n').collect();
    // `split` yields an empty last segment when the file ends with a newline, which is
    // the normal end; a non-empty last segment is a record whose newline never made it.
    let last_nonempty = segments.iter().rposition(|s| !s.is_empty());
    let unterminated = segments.last().is_some_and(|s| !s.is_empty());
    for (i, line) in segments.iter().enumerate() {
        if line.is_empty() {
            continue;
        }
        match serde_json::from_slice::<Record>(line) {
            Ok(r) => {
                index.insert(r);
                records += 1;
            }
            Err(e) => {
                let all_nul = line.iter().all(|b| *b == 0);
                if Some(i) == last_nonempty || all_nul {
                    needs_rewrite = true;
                    tracing::warn!(path = %path.display(), line = i + 1, error = %e, "ignoring a torn journal record");
                } else {
                    return Err(JournalError::Corrupt { path: path.to_owned(), line: i + 1, reason: e.to_string() });
                }
            }
        }
    }
    // A complete record without its newline was never acknowledged as durable (record and
    // newline go out in one write), so nothing was printed because of it. It is kept all
    // the same, since remembering a start too many errs on the safe side, and the file is
    // rewritten so that the next append starts on a line of its own.
    needs_rewrite |= unterminated;
    Ok(Loaded { index, records, needs_rewrite })
}

/// Writes the live records to a temporary file and renames it over the journal. Returns
/// the new file opened for appending and the number of records in it.
fn compact(path: &Path, index: &Index) -> io::Result<(File, usize)> {
    let mut buf = Vec::new();
    let live = index.live_in_order();
    for r in &live {
        serde_json::to_writer(&mut buf, r)?;
        buf.push(b'\n');
    }
    crate::fsutil::write_atomic(path, &buf)?;
    let file = OpenOptions::new().append(true).open(path)?;
    Ok((file, live.len()))
}

struct Writer {
    path: PathBuf,
    file: File,
    file_records: usize,
    capacity: usize,
    /// Set after the first failed write or sync; see the module doc.
    failed: Option<String>,
    index: Arc<Mutex<Index>>,
    counters: Arc<Counters>,
}

impl Writer {
    fn run(mut self, mut rx: mpsc::UnboundedReceiver<Request>) {
        while let Some(first) = rx.blocking_recv() {
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(r) => batch.push(r),
                    Err(_) => break,
                }
            }
            let mut appends = Vec::with_capacity(batch.len());
            let mut close = None;
            for r in batch {
                match r {
                    Request::Append { record, done } => appends.push((record, done)),
                    Request::Close { done } => close = Some(done),
                }
            }
            if !appends.is_empty() {
                self.commit(appends);
            }
            if let Some(done) = close {
                let answer = match &self.failed {
                    Some(f) => Err(JournalError::Failed(f.clone())),
                    None => {
                        self.file.sync_data().map_err(|source| JournalError::Io { path: self.path.clone(), source })
                    }
                };
                let _ = done.send(answer);
                return;
            }
        }
    }

    fn commit(&mut self, appends: Vec<(Record, oneshot::Sender<Result<(), JournalError>>)>) {
        if let Some(f) = &self.failed {
            for (_, done) in appends {
                let _ = done.send(Err(JournalError::Failed(f.clone())));
            }
            return;
        }
        let mut buf = Vec::with_capacity(appends.len() * 128);
        for (r, _) in &appends {
            // Serializing plain strings and numbers cannot fail; should it ever, the
            // record is not written and the write below reports it to every caller.
            if let Err(e) = serde_json::to_writer(&mut buf, r) {
                self.failed = Some(format!("cannot encode a record: {e}"));
            }
            buf.push(b'\n');
        }
        if self.failed.is_none() {
            if let Err(e) = self.file.write_all(&buf).and_then(|()| self.file.sync_data()) {
                self.failed = Some(format!("{}: {e}", self.path.display()));
            }
        }
        if let Some(f) = &self.failed {
            tracing::error!(
                path = %self.path.display(),
                error = %f,
                "journal write failed; the agent prints nothing more until it is restarted"
            );
            for (_, done) in appends {
                let _ = done.send(Err(JournalError::Failed(f.clone())));
            }
            return;
        }
        let n = appends.len();
        self.counters.syncs.fetch_add(1, Ordering::Relaxed);
        self.counters.records.fetch_add(n as u64, Ordering::Relaxed);
        self.file_records += n;
        {
            let mut index = lock(&self.index);
            for (r, _) in &appends {
                index.insert(r.clone());
            }
        }
        for (_, done) in appends {
            let _ = done.send(Ok(()));
        }
        if self.file_records > 2 * self.capacity {
            self.compact();
        }
        self.counters.file_records.store(self.file_records as u64, Ordering::Relaxed);
    }

    fn compact(&mut self) {
        // The index is copied under the lock so that lookups are not held up by file IO.
        let snapshot = {
            let index = lock(&self.index);
            let mut copy = Index::new(self.capacity);
            for r in index.live_in_order() {
                copy.insert(r.clone());
            }
            copy
        };
        match compact(&self.path, &snapshot) {
            Ok((file, written)) => {
                self.file = file;
                self.file_records = written;
                self.counters.compactions.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(path = %self.path.display(), records = written, "journal compacted");
            }
            Err(e) => {
                // Whether or not the rename happened, the file on disk is complete (the
                // old one with every record, or the new one with the live ones). But if
                // it did happen, `self.file` now points at the unlinked old file, so
                // appending on would lose records: stop here.
                let msg = format!("compaction of {} failed: {e}", self.path.display());
                tracing::error!(error = %msg, "journal compaction failed; the agent prints nothing more until restarted");
                self.failed = Some(msg);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: &str, state: RecordState) -> Record {
        Record::new(id, 1, state, "")
    }

    #[test]
    fn index_keeps_the_last_n_task_ids_by_latest_write() {
        let mut ix = Index::new(2);
        ix.insert(rec("a", RecordState::Started));
        ix.insert(rec("b", RecordState::Started));
        ix.insert(rec("a", RecordState::Printed));
        ix.insert(rec("c", RecordState::Started));
        assert!(ix.map.contains_key("a"), "a was written after b");
        assert!(!ix.map.contains_key("b"));
        assert!(ix.map.contains_key("c"));
        let order: Vec<&str> = ix.live_in_order().iter().map(|r| r.task_id.as_str()).collect();
        assert_eq!(order, ["a", "c"]);
    }

    #[test]
    fn the_index_answers_by_idempotency_key_and_forgets_the_key_with_its_task() {
        let mut ix = Index::new(2);
        ix.insert(rec("a", RecordState::Started).keyed("K1#p1"));
        // A later record of the same task without a key keeps the key.
        ix.insert(rec("a", RecordState::Printed));
        assert_eq!(ix.map["a"].1.key, "K1#p1");
        assert_eq!(ix.by_key.get("K1#p1").map(String::as_str), Some("a"));
        // The same key under another task id: the later writer owns it, except that a
        // record that is not `printed` leaves it with a task that printed it.
        ix.insert(rec("x", RecordState::InDoubt).keyed("K1#p1"));
        assert_eq!(ix.by_key.get("K1#p1").map(String::as_str), Some("a"));
        ix.insert(rec("b", RecordState::Printed).keyed("K1#p1"));
        assert_eq!(ix.by_key.get("K1#p1").map(String::as_str), Some("b"));
        ix.insert(rec("c", RecordState::Started).keyed("K2#p1"));
        // `a` left the index (capacity 2) without taking `b`'s key along.
        assert!(!ix.map.contains_key("a"));
        assert_eq!(ix.by_key.get("K1#p1").map(String::as_str), Some("b"));
        ix.insert(rec("d", RecordState::Started));
        // `b` left too: its key goes with it.
        assert!(!ix.by_key.contains_key("K1#p1"));
        assert_eq!(ix.by_key.len(), 1);
    }

    #[test]
    fn a_record_without_a_key_reads_and_writes_as_before() {
        let old = r#"{"task_id":"T1","attempt":1,"state":"printed","at":"2026-12-01T00:00:00Z","detail":""}"#;
        let r: Record = serde_json::from_str(old).expect("a record of an older journal");
        assert_eq!(r.key, "");
        assert_eq!(serde_json::to_string(&r).expect("json"), old, "no key field is written when empty");
    }

    #[test]
    fn index_order_queue_stays_bounded() {
        let mut ix = Index::new(3);
        for i in 0..10_000 {
            ix.insert(rec(&format!("t{}", i % 3), RecordState::Started));
        }
        assert_eq!(ix.map.len(), 3);
        assert!(ix.order.len() <= 2 * 3 + 1024 + 1);
    }
}
