//! The embedded SQLite backend, onceprint's default.
//!
//! It owns the SQLite schema and SQL, the single writer thread with its group commit, and
//! a small pool of read connections. Durability is not negotiable here: WAL mode with
//! `synchronous=FULL`, so a commit has reached the disk before any caller is answered and
//! a 201 survives kill -9 and power loss.
//!
//! All writes go through one thread that owns the only write connection. It takes every
//! job waiting in its queue, runs each inside its own savepoint (a failing job does not
//! spoil its neighbours) and commits them together: one flush for many callers. Readers
//! never block the writer (WAL), and the writer never waits for a lock.
//!
//! `backup` copies a database online with SQLite's backup API (`onceprint backup`).
//!
//! This crate must never decide domain rules (duplicates are decided by the unique
//! constraint, legality of transitions by `onceprint-core`) and must never answer a
//! caller before the commit that carries its write.
//!
//! Where things are: retention's SQL (`retention.rs`: prunable tasks, a batch pruned into
//! `task_tombstones` as one writer job); the device log (`device_log.rs`: agents' records
//! upserted in one writer job, read by task id range); the online backup (`backup.rs`:
//! SQLite's backup API in one step under one read transaction, checked, written beside the
//! target and renamed); SQLite's memory (`memory.rs`: set before the first connection of the
//! process; SQLite allocates through Rust's global allocator and keeps no memory statistics,
//! whose global mutex every allocation of the writer took).

pub mod backup;
mod device_log;
mod memory;
mod offline;
mod operators;
mod retention;
mod schema;
mod setup;
mod sql;
pub mod testing;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use async_trait::async_trait;
use onceprint_core::{IdempotencyKey, TaskState};
use onceprint_store::*;
use rusqlite::{Connection, OpenFlags};
use tokio::sync::oneshot;

/// Most jobs committed in one transaction. Bounds the latency a single commit adds.
const MAX_JOBS_PER_COMMIT: usize = 1024;

type Finish = Box<dyn FnOnce(Result<(), StoreError>) + Send>;
type Job = Box<dyn FnOnce(&Connection) -> Finish + Send>;

/// Read connections kept open, and reads run at once: SQLite readers in WAL mode do not
/// block each other, but on a machine with a few cores more than this only adds threads.
const READERS: usize = 8;
/// Page cache of each read connection, in KiB.
const READER_CACHE_KIB: usize = 4096;

/// The SQLite store. Cloning is cheap and shares the writer and the readers.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    readers: Mutex<Vec<Connection>>,
    /// One permit per pooled read connection. Without it every concurrent read became a
    /// blocking thread of its own with a connection opened just for it (and its page
    /// cache): 10,000 long polls arriving together made ~500 threads and connections,
    /// 1.5 GB of RSS and seconds of intake latency. Waiting for a permit on the async
    /// side costs nothing; reads beyond the pool simply queue, in arrival order.
    read_slots: Arc<tokio::sync::Semaphore>,
    /// Jobs sent to the writer and not started yet: whether the writer has time for a
    /// read that could go to either side (`read_for_acks`).
    queued: Arc<AtomicUsize>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Dropping the sender stops the checkpointer thread.
    checkpointer: Mutex<Option<(mpsc::Sender<()>, std::thread::JoinHandle<()>)>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Closing the queue lets the writer finish what it has and exit; joining makes
        // sure the last commit is on disk before the store is gone.
        if let Ok(mut jobs) = self.jobs.lock() {
            jobs.take();
        }
        if let Ok(mut w) = self.writer.lock() {
            if let Some(handle) = w.take() {
                let _ = handle.join();
            }
        }
        if let Ok(mut c) = self.checkpointer.lock() {
            if let Some((stop, handle)) = c.take() {
                drop(stop);
                let _ = handle.join();
            }
        }
    }
}

fn backend_err(e: rusqlite::Error) -> StoreError {
    StoreError::Backend(e.to_string())
}

/// Maps constraint violations to the errors the trait promises.
fn constraint_err(e: rusqlite::Error, what: &str, missing: &str) -> StoreError {
    if let rusqlite::Error::SqliteFailure(f, _) = &e {
        match f.extended_code {
            rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY | rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE => {
                return StoreError::AlreadyExists(what.to_owned())
            }
            rusqlite::ffi::SQLITE_CONSTRAINT_FOREIGNKEY => return StoreError::NotFound(missing.to_owned()),
            _ => {}
        }
    }
    backend_err(e)
}

fn open_connection(path: &Path) -> Result<Connection, StoreError> {
    memory::configure();
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| StoreError::Unavailable(format!("cannot open {}: {e}", path.display())))?;
    // WAL lets readers run beside the writer; FULL makes every commit reach the disk
    // (WAL with NORMAL may lose the last commits on power loss, which would break the
    // promise behind a 201). Statement and savepoint journals in memory: every write job
    // runs in a savepoint and every INSERT with several indexes inside a transaction opens
    // a statement journal, which past 64 KiB spilled to a temporary file; those pwrites were
    // 45 % of the writer thread's time at intake (perf). They only serve a rollback
    // inside a transaction, never recovery, so memory loses nothing on a crash.
    conn.execute_batch(
        "PRAGMA journal_mode=WAL;
         PRAGMA synchronous=FULL;
         PRAGMA temp_store=MEMORY;
         PRAGMA foreign_keys=ON;
         PRAGMA busy_timeout=10000;
         PRAGMA cache_size=-16384;",
    )
    .map_err(|e| StoreError::Unavailable(format!("cannot configure {}: {e}", path.display())))?;
    conn.set_prepared_statement_cache_capacity(64);
    Ok(conn)
}

fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)",
    )
    .map_err(backend_err)?;
    let applied: i64 = conn
        .query_row("SELECT COALESCE(MAX(version), 0) FROM schema_migrations", [], |r| r.get(0))
        .map_err(backend_err)?;
    for (i, sql) in schema::MIGRATIONS.iter().enumerate() {
        let version = i as i64 + 1;
        if version <= applied {
            continue;
        }
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).map_err(backend_err)?;
        tx.execute_batch(sql).map_err(backend_err)?;
        tx.execute(
            "INSERT INTO schema_migrations (version, applied_at) VALUES (?1, strftime('%s','now') * 1000)",
            [version],
        )
        .map_err(backend_err)?;
        tx.commit().map_err(backend_err)?;
        tracing::info!(version, "sqlite migration applied");
    }
    Ok(())
}

/// WAL frames above which the checkpointer also resets the log (RESTART), so that a WAL
/// kept alive by long readers cannot grow without bound.
const WAL_RESTART_FRAMES: i64 = 50_000;

/// The checkpointer thread: copies committed WAL pages into the database file in the
/// background. The writer has automatic checkpoints turned off, so a commit never pays
/// for a checkpoint; a fully checkpointed WAL is reused from its start by the next commit.
fn checkpoint_loop(conn: Connection, stop: mpsc::Receiver<()>) {
    loop {
        // A message or a closed channel both mean "stop after one last checkpoint".
        let stopping =
            !matches!(stop.recv_timeout(std::time::Duration::from_millis(200)), Err(mpsc::RecvTimeoutError::Timeout));
        let frames: Result<(i64, i64, i64), _> =
            conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)));
        match frames {
            Ok((_, log, _)) if log > WAL_RESTART_FRAMES => {
                if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(RESTART)", [], |_| Ok(())) {
                    tracing::warn!(error = %e, "sqlite WAL restart checkpoint failed");
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "sqlite checkpoint failed"),
        }
        if stopping {
            return;
        }
    }
}

/// The writer thread: take a job, take everything else waiting, commit once, answer all.
fn writer_loop(conn: Connection, jobs: mpsc::Receiver<Job>) {
    while let Ok(first) = jobs.recv() {
        let mut finishers: Vec<Finish> = Vec::with_capacity(16);
        if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
            // Dropping the job drops its reply channel: the caller gets an error and
            // nothing was written.
            tracing::error!(error = %e, "sqlite writer cannot begin a transaction");
            drop(first);
            continue;
        }
        finishers.push(run_in_savepoint(&conn, first));
        while finishers.len() < MAX_JOBS_PER_COMMIT {
            match jobs.try_recv() {
                Ok(job) => finishers.push(run_in_savepoint(&conn, job)),
                Err(_) => break,
            }
        }
        let commit = conn.execute_batch("COMMIT").map_err(backend_err);
        if commit.is_err() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        for finish in finishers {
            finish(commit.clone());
        }
    }
}

fn run_in_savepoint(conn: &Connection, job: Job) -> Finish {
    if let Err(e) = conn.execute_batch("SAVEPOINT job") {
        // Same as above: the caller sees its reply channel closed, nothing was written.
        tracing::error!(error = %e, "sqlite writer cannot open a savepoint");
        drop(job);
        return Box::new(|_| {});
    }
    job(conn)
}

impl SqliteStore {
    /// Opens (creating if needed) the database file and applies migrations.
    pub fn open(path: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        let path = path.as_ref().to_path_buf();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| StoreError::Unavailable(format!("cannot create {}: {e}", dir.display())))?;
        }
        let mut conn = open_connection(&path)?;
        migrate(&mut conn)?;
        let numbered = sql::sequence_unnumbered_tasks(&conn)?;
        if numbered > 0 {
            tracing::info!(tasks = numbered, "gave lane sequence numbers to tasks an older broker inserted");
        }
        conn.execute_batch("PRAGMA wal_autocheckpoint=0").map_err(backend_err)?;
        let checkpoint_conn = open_connection(&path)?;
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let checkpointer = std::thread::Builder::new()
            .name("sqlite-checkpoint".into())
            .spawn(move || checkpoint_loop(checkpoint_conn, stop_rx))
            .map_err(|e| StoreError::Backend(format!("cannot start the checkpoint thread: {e}")))?;
        let (tx, rx) = mpsc::channel::<Job>();
        let writer = std::thread::Builder::new()
            .name("sqlite-writer".into())
            .spawn(move || writer_loop(conn, rx))
            .map_err(|e| StoreError::Backend(format!("cannot start the writer thread: {e}")))?;
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                path,
                jobs: Mutex::new(Some(tx)),
                readers: Mutex::new(Vec::new()),
                read_slots: Arc::new(tokio::sync::Semaphore::new(READERS)),
                queued: Arc::new(AtomicUsize::new(0)),
                writer: Mutex::new(Some(writer)),
                checkpointer: Mutex::new(Some((stop_tx, checkpointer))),
            }),
        })
    }

    /// Opens a store from a `sqlite://PATH` URL (or a bare path).
    pub fn open_url(url: &str) -> Result<SqliteStore, StoreError> {
        let path = url.strip_prefix("sqlite://").or_else(|| url.strip_prefix("sqlite:")).unwrap_or(url);
        if path.is_empty() {
            return Err(StoreError::Unavailable("the sqlite URL names no file".into()));
        }
        SqliteStore::open(path)
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Runs `f` on the writer thread inside its own savepoint; resolves after the commit
    /// that carries it.
    async fn write<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel::<StoreResult<T>>();
        let queued = self.inner.queued.clone();
        let job: Job = Box::new(move |conn: &Connection| {
            queued.fetch_sub(1, Ordering::Relaxed);
            let result = f(conn);
            let end = if result.is_ok() { "RELEASE job" } else { "ROLLBACK TO job; RELEASE job" };
            let result = match conn.execute_batch(end) {
                Ok(()) => result,
                Err(e) => Err(backend_err(e)),
            };
            Box::new(move |commit: Result<(), StoreError>| {
                let _ = tx.send(commit.and(result));
            })
        });
        let sender = self
            .inner
            .jobs
            .lock()
            .map_err(|_| StoreError::Backend("writer queue poisoned".into()))?
            .clone()
            .ok_or_else(|| StoreError::Unavailable("store is closed".into()))?;
        self.inner.queued.fetch_add(1, Ordering::Relaxed);
        if sender.send(job).is_err() {
            self.inner.queued.fetch_sub(1, Ordering::Relaxed);
            return Err(StoreError::Unavailable("the writer thread has stopped".into()));
        }
        rx.await.map_err(|_| StoreError::Unavailable("the writer thread dropped the job".into()))?
    }

    /// Runs `f` on a pooled read connection on the blocking thread pool.
    async fn read<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
    {
        let inner = self.inner.clone();
        // The permit moves into the blocking task, so a caller that gives up waiting (a
        // long poll whose client left) does not free the slot while the read still runs.
        let slot = self
            .inner
            .read_slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| StoreError::Unavailable("store is closed".into()))?;
        tokio::task::spawn_blocking(move || {
            let _slot = slot;
            let pooled = inner.readers.lock().ok().and_then(|mut r| r.pop());
            let conn = match pooled {
                Some(c) => c,
                None => {
                    let c = open_connection(&inner.path)?;
                    // Readers look up rows by index (lane heads, a task, a page of a
                    // list); a smaller page cache each keeps eight of them from holding
                    // 128 MiB of pages the OS page cache holds anyway. The writer keeps
                    // its larger cache.
                    c.execute_batch(&format!("PRAGMA cache_size=-{READER_CACHE_KIB};")).map_err(backend_err)?;
                    c
                }
            };
            let result = f(&conn);
            if let Ok(mut r) = inner.readers.lock() {
                if r.len() < READERS {
                    r.push(conn);
                }
            }
            result
        })
        .await
        .map_err(|e| StoreError::Backend(format!("read task failed: {e}")))?
    }
}

#[async_trait]
impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    async fn ping(&self) -> StoreResult<()> {
        self.read(|c| c.query_row("SELECT 1", [], |_| Ok(())).map_err(backend_err)).await
    }

    async fn acquire_lease(
        &self,
        name: &str,
        holder: &str,
        now: onceprint_core::Millis,
        ttl_ms: i64,
    ) -> StoreResult<Option<i64>> {
        let (name, holder) = (name.to_owned(), holder.to_owned());
        self.write(move |c| sql::acquire_lease(c, &name, &holder, now, ttl_ms)).await
    }

    async fn release_lease(&self, name: &str, holder: &str, now: onceprint_core::Millis) -> StoreResult<bool> {
        let (name, holder) = (name.to_owned(), holder.to_owned());
        self.write(move |c| sql::release_lease(c, &name, &holder, now)).await
    }

    async fn lease_row(&self, name: &str) -> StoreResult<Option<LeaseRow>> {
        let name = name.to_owned();
        self.read(move |c| sql::lease_row(c, &name)).await
    }

    async fn put_agent_sessions(&self, rows: &[AgentSessionRow]) -> StoreResult<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let rows = rows.to_vec();
        self.write(move |c| sql::put_agent_sessions(c, &rows)).await
    }

    async fn agent_sessions_since(&self, since: onceprint_core::Millis) -> StoreResult<Vec<AgentSessionRow>> {
        self.read(move |c| sql::agent_sessions_since(c, since)).await
    }

    async fn forget_agent_sessions(&self, heard_before: onceprint_core::Millis) -> StoreResult<u64> {
        self.write(move |c| {
            c.execute("DELETE FROM agent_sessions WHERE heard_at < ?1", [heard_before])
                .map(|n| n as u64)
                .map_err(backend_err)
        })
        .await
    }

    async fn get_setting(&self, key: &str) -> StoreResult<Option<String>> {
        let key = key.to_owned();
        self.read(move |c| sql::get_setting(c, &key)).await
    }

    async fn put_setting(&self, key: &str, value: &str) -> StoreResult<()> {
        let (key, value) = (key.to_owned(), value.to_owned());
        self.write(move |c| sql::put_setting(c, &key, &value)).await
    }

    async fn create_tenant(&self, tenant: NewTenant) -> StoreResult<Tenant> {
        self.write(move |c| sql::create_tenant(c, tenant)).await
    }

    async fn tenant_by_key_hash(&self, api_key_hash: &str) -> StoreResult<Option<TenantKey>> {
        let h = api_key_hash.to_owned();
        self.read(move |c| sql::tenant_by_key_hash(c, &h)).await
    }

    async fn create_api_key(&self, key: NewApiKey) -> StoreResult<ApiKey> {
        self.write(move |c| setup::create_api_key(c, &key)).await
    }

    async fn list_api_keys(&self, tenant_id: &str) -> StoreResult<Vec<ApiKey>> {
        let t = tenant_id.to_owned();
        self.read(move |c| setup::list_api_keys(c, &t)).await
    }

    async fn revoke_api_key(&self, change: RevokeApiKey) -> StoreResult<KeyRevocation> {
        self.write(move |c| setup::revoke_api_key(c, &change)).await
    }

    async fn create_store(&self, store: NewStore) -> StoreResult<StoreRow> {
        self.write(move |c| sql::create_store(c, store)).await
    }

    async fn get_store(&self, tenant_id: &str, store_id: &str) -> StoreResult<Option<StoreRow>> {
        let (t, s) = (tenant_id.to_owned(), store_id.to_owned());
        self.read(move |c| sql::get_store(c, &t, &s)).await
    }

    async fn list_stores(&self, tenant_id: &str) -> StoreResult<Vec<StoreRow>> {
        let t = tenant_id.to_owned();
        self.read(move |c| sql::list_stores(c, &t)).await
    }

    async fn create_printer(&self, printer: NewPrinter) -> StoreResult<Printer> {
        self.write(move |c| sql::create_printer(c, printer)).await
    }

    async fn get_printer(&self, tenant_id: &str, printer_id: &str) -> StoreResult<Option<Printer>> {
        let (t, p) = (tenant_id.to_owned(), printer_id.to_owned());
        self.read(move |c| sql::get_printer(c, &t, &p)).await
    }

    async fn list_printers(&self, tenant_id: &str, store_id: Option<&str>) -> StoreResult<Vec<Printer>> {
        let (t, s) = (tenant_id.to_owned(), store_id.map(str::to_owned));
        self.read(move |c| sql::list_printers(c, &t, s.as_deref())).await
    }

    async fn update_printer(&self, change: PrinterUpdate) -> StoreResult<Option<Printer>> {
        self.write(move |c| setup::update_printer(c, &change)).await
    }

    async fn set_printer_enabled(&self, change: PrinterEnabled) -> StoreResult<Option<Printer>> {
        self.write(move |c| setup::set_printer_enabled(c, &change)).await
    }

    async fn printers_by_transport(&self, kind: &str) -> StoreResult<Vec<Printer>> {
        let k = kind.to_owned();
        self.read(move |c| sql::printers_by_transport(c, &k)).await
    }

    async fn printer_by_secret_hash(&self, secret_hash: &str) -> StoreResult<Option<PrinterCredential>> {
        let h = secret_hash.to_owned();
        self.read(move |c| setup::printer_by_secret_hash(c, &h)).await
    }

    async fn printer_login_by_username(&self, username: &str) -> StoreResult<Option<PrinterDigestLogin>> {
        let u = username.to_owned();
        self.read(move |c| setup::printer_login_by_username(c, &u)).await
    }

    async fn set_printer_secret(&self, change: PrinterSecretChange) -> StoreResult<bool> {
        self.write(move |c| setup::set_printer_secret(c, &change)).await
    }

    async fn mqtt_logins(&self) -> StoreResult<Vec<MqttLogin>> {
        self.read(setup::mqtt_logins).await
    }

    async fn printers_with_id(&self, printer_id: &str) -> StoreResult<Vec<Printer>> {
        let id = printer_id.to_owned();
        self.read(move |c| sql::printers_with_id(c, &id)).await
    }

    async fn create_station(&self, station: NewStation) -> StoreResult<Station> {
        self.write(move |c| sql::create_station(c, station)).await
    }

    async fn get_station(&self, tenant_id: &str, station_id: &str) -> StoreResult<Option<Station>> {
        let (t, s) = (tenant_id.to_owned(), station_id.to_owned());
        self.read(move |c| sql::get_station(c, &t, &s)).await
    }

    async fn update_station(&self, change: StationUpdate) -> StoreResult<Option<Station>> {
        self.write(move |c| setup::update_station(c, &change)).await
    }

    async fn create_agent_token(&self, token: NewAgentToken) -> StoreResult<AgentToken> {
        self.write(move |c| sql::create_agent_token(c, token)).await
    }

    async fn agent_by_token_hash(&self, token_hash: &str) -> StoreResult<Option<AgentIdentity>> {
        let h = token_hash.to_owned();
        self.read(move |c| sql::agent_by_token_hash(c, &h)).await
    }

    async fn list_agent_tokens(
        &self,
        tenant_id: &str,
        store_id: &str,
        kind: TokenKind,
    ) -> StoreResult<Vec<AgentToken>> {
        let (t, s) = (tenant_id.to_owned(), store_id.to_owned());
        self.read(move |c| setup::list_agent_tokens(c, &t, &s, kind)).await
    }

    async fn active_token_hashes(
        &self,
        tenant_id: &str,
        store_id: &str,
        kind: TokenKind,
    ) -> StoreResult<Vec<TokenHash>> {
        let (t, s) = (tenant_id.to_owned(), store_id.to_owned());
        self.read(move |c| setup::active_token_hashes(c, &t, &s, kind)).await
    }

    async fn list_stations(&self, tenant_id: &str, store_id: &str) -> StoreResult<Vec<Station>> {
        let (t, s) = (tenant_id.to_owned(), store_id.to_owned());
        self.read(move |c| setup::list_stations(c, &t, &s)).await
    }

    async fn revoke_agent_token(&self, change: RevokeAgentToken) -> StoreResult<Option<Revoked<AgentToken>>> {
        self.write(move |c| setup::revoke_agent_token(c, &change)).await
    }

    async fn create_operator(&self, operator: NewOperator) -> StoreResult<Operator> {
        self.write(move |c| operators::create_operator(c, &operator)).await
    }

    async fn list_operators(&self, tenant_id: &str) -> StoreResult<Vec<Operator>> {
        let t = tenant_id.to_owned();
        self.read(move |c| operators::list_operators(c, &t)).await
    }

    async fn operator_login(&self, tenant_id: &str, operator_id: &str) -> StoreResult<Option<(Operator, String)>> {
        let (t, o) = (tenant_id.to_owned(), operator_id.to_owned());
        self.read(move |c| operators::operator_login(c, &t, &o)).await
    }

    async fn create_operator_session(&self, session: NewOperatorSession) -> StoreResult<()> {
        self.write(move |c| operators::create_session(c, &session)).await
    }

    async fn operator_session(&self, token_hash: &str) -> StoreResult<Option<OperatorSession>> {
        let h = token_hash.to_owned();
        self.read(move |c| operators::session(c, &h)).await
    }

    async fn revoke_operator_session(&self, token_hash: &str, now: onceprint_core::Millis) -> StoreResult<bool> {
        let h = token_hash.to_owned();
        self.write(move |c| operators::revoke_session(c, &h, now)).await
    }

    async fn revoke_operator_sessions(&self, change: RevokeOperatorSessions) -> StoreResult<Option<u64>> {
        self.write(move |c| operators::revoke_sessions(c, &change)).await
    }

    async fn change_operator(&self, change: ChangeOperator) -> StoreResult<Option<Operator>> {
        self.write(move |c| operators::change_operator(c, &change)).await
    }

    async fn setup_events(&self, tenant_id: &str, limit: i64, before: Option<i64>) -> StoreResult<Vec<SetupEvent>> {
        let t = tenant_id.to_owned();
        self.read(move |c| setup::setup_events(c, &t, limit, before)).await
    }

    async fn submit_batch(&self, batch: Vec<NewTask>) -> StoreResult<Vec<SubmitOutcome>> {
        self.write(move |c| sql::submit_batch(c, batch)).await
    }

    async fn merge_offline(&self, task: OfflineTask, planner: MergePlanner) -> StoreResult<OfflineMerge> {
        self.write(move |c| offline::merge(c, &task, planner.as_ref())).await
    }

    async fn task_alias(&self, tenant_id: &str, alias_id: &str) -> StoreResult<Option<TaskAlias>> {
        let (t, id) = (tenant_id.to_owned(), alias_id.to_owned());
        self.read(move |c| offline::alias(c, &t, &id)).await
    }

    async fn get_task(&self, tenant_id: &str, task_id: &str) -> StoreResult<Option<Task>> {
        let (t, id) = (tenant_id.to_owned(), task_id.to_owned());
        self.read(move |c| sql::get_task(c, &t, &id)).await
    }

    async fn get_tasks(&self, tenant_id: &str, task_ids: &[String]) -> StoreResult<Vec<Task>> {
        let (t, ids) = (tenant_id.to_owned(), task_ids.to_vec());
        self.read(move |c| sql::get_tasks(c, &t, &ids)).await
    }

    async fn find_task(&self, key: &IdempotencyKey) -> StoreResult<Option<Task>> {
        let key = key.clone();
        self.read(move |c| sql::find_task(c, &key.tenant_id, &key.target, &key.biz_no, &key.print_type)).await
    }

    async fn task_content(&self, task_id: &str) -> StoreResult<Option<TaskContent>> {
        let id = task_id.to_owned();
        self.read(move |c| sql::task_content(c, &id)).await
    }

    async fn task_contents(&self, task_ids: &[String]) -> StoreResult<Vec<(String, TaskContent)>> {
        let ids = task_ids.to_vec();
        self.read(move |c| sql::task_contents(c, &ids)).await
    }

    async fn list_tasks(&self, query: &TaskQuery) -> StoreResult<Vec<Task>> {
        let q = query.clone();
        self.read(move |c| sql::list_tasks(c, &q)).await
    }

    async fn task_events(&self, tenant_id: &str, task_id: &str) -> StoreResult<Option<Vec<TaskEvent>>> {
        let (t, id) = (tenant_id.to_owned(), task_id.to_owned());
        self.read(move |c| sql::task_events(c, &t, &id)).await
    }

    async fn ledger_entries(&self, task_id: &str) -> StoreResult<Vec<LedgerEntry>> {
        let id = task_id.to_owned();
        self.read(move |c| sql::ledger_entries(c, &id)).await
    }

    async fn count_by_state(&self) -> StoreResult<Vec<(TaskState, i64)>> {
        self.read(sql::count_by_state).await
    }

    async fn transition(&self, change: &Transition) -> StoreResult<bool> {
        let change = change.clone();
        self.write(move |c| sql::transition(c, &change)).await
    }

    async fn apply_transitions(&self, changes: &[Transition]) -> StoreResult<Vec<bool>> {
        let changes = changes.to_vec();
        self.write(move |c| sql::apply_transitions(c, &changes)).await
    }

    async fn lanes(&self, tenant_id: &str, store_id: &str, kind: &str) -> StoreResult<Vec<Lane>> {
        let (t, s, k) = (tenant_id.to_owned(), store_id.to_owned(), kind.to_owned());
        self.read(move |c| sql::lanes(c, &t, &s, &k)).await
    }

    async fn lane(&self, tenant_id: &str, printer_id: &str) -> StoreResult<Lane> {
        let (t, p) = (tenant_id.to_owned(), printer_id.to_owned());
        self.read(move |c| sql::lane(c, &t, &p)).await
    }

    async fn lane_heads(&self, tenant_id: &str, printer_ids: &[String]) -> StoreResult<Vec<Task>> {
        if printer_ids.is_empty() {
            return Ok(Vec::new());
        }
        let (t, ids) = (tenant_id.to_owned(), printer_ids.to_vec());
        self.read(move |c| sql::lane_heads(c, &t, &ids)).await
    }

    async fn read_for_acks(&self, tenant_id: &str, task_ids: &[String], heads: bool) -> StoreResult<AckRead> {
        let (t, ids) = (tenant_id.to_owned(), task_ids.to_vec());
        // On the writer's connection when it has nothing waiting, as a job that writes
        // nothing: its page cache holds the pages the last commits wrote (the acked tasks,
        // the lanes' ends), while a reader's cache is dropped whenever the WAL has changed
        // since its last read, which during delivery is every time, and each page comes
        // back through a pread (15-20 % of the broker in delivery). The answer waits for
        // the commit of its group like any job, so it never shows a row a failed commit
        // took back. With jobs waiting (intake filling the writer) a reader takes it
        // instead: there the reads would only lengthen the queue every 201 waits in
        // (measured: 5-19 % fewer tasks through with 1.1 M tasks in the file, batch 1).
        if self.inner.queued.load(Ordering::Relaxed) == 0 {
            return self.write(move |c| sql::read_for_acks(c, &t, &ids, heads)).await;
        }
        self.read(move |c| {
            // One read transaction: one snapshot for the three reads.
            let tx = c.unchecked_transaction().map_err(backend_err)?;
            let read = sql::read_for_acks(&tx, &t, &ids, heads)?;
            tx.finish().map_err(backend_err)?;
            Ok(read)
        })
        .await
    }

    async fn lane_stats(&self) -> StoreResult<Vec<LaneStats>> {
        self.read(sql::lane_stats).await
    }

    async fn max_task_id(&self) -> StoreResult<Option<String>> {
        self.read(sql::max_task_id).await
    }

    async fn record_alert(&self, event: &OutboxEvent) -> StoreResult<()> {
        let e = event.clone();
        self.write(move |c| sql::record_alert(c, &e)).await
    }

    async fn due_tasks(&self, state: TaskState, now: onceprint_core::Millis, limit: i64) -> StoreResult<Vec<Task>> {
        self.read(move |c| sql::due_tasks(c, state, now, limit)).await
    }

    async fn waiting_on_paused_printers(&self, limit: i64) -> StoreResult<Vec<PausedWait>> {
        self.read(move |c| sql::waiting_on_paused_printers(c, limit)).await
    }

    async fn apply_manual(&self, change: &ManualChange) -> StoreResult<bool> {
        let change = change.clone();
        self.write(move |c| sql::apply_manual(c, &change)).await
    }

    async fn attention(&self, tenant_id: &str, store_id: &str, limit: i64) -> StoreResult<Vec<Task>> {
        let (t, s) = (tenant_id.to_owned(), store_id.to_owned());
        self.read(move |c| sql::attention(c, &t, &s, limit)).await
    }

    async fn tasks_created_between(
        &self,
        tenant_id: &str,
        store_id: &str,
        from_id: &str,
        to_id: &str,
    ) -> StoreResult<Vec<Task>> {
        let (t, s, f, to) = (tenant_id.to_owned(), store_id.to_owned(), from_id.to_owned(), to_id.to_owned());
        self.read(move |c| sql::tasks_created_between(c, &t, &s, &f, &to)).await
    }

    async fn ledger_between(
        &self,
        tenant_id: &str,
        store_id: &str,
        from: onceprint_core::Millis,
        to: onceprint_core::Millis,
    ) -> StoreResult<Vec<LedgerEntry>> {
        let (t, s) = (tenant_id.to_owned(), store_id.to_owned());
        self.read(move |c| sql::ledger_between(c, &t, &s, from, to)).await
    }

    async fn reprint_count(&self, task_id: &str) -> StoreResult<i32> {
        let id = task_id.to_owned();
        self.read(move |c| sql::reprint_count(c, &id)).await
    }

    async fn prunable_tasks(
        &self,
        states: &[TaskState],
        before_id: &str,
        changed_before: onceprint_core::Millis,
        after_id: Option<&str>,
        limit: i64,
    ) -> StoreResult<Vec<Task>> {
        let (states, before, after) = (states.to_vec(), before_id.to_owned(), after_id.map(str::to_owned));
        self.read(move |c| retention::prunable_tasks(c, &states, &before, changed_before, after.as_deref(), limit))
            .await
    }

    async fn prune_tasks(&self, tasks: &[PruneTask], now: onceprint_core::Millis) -> StoreResult<Pruned> {
        let tasks = tasks.to_vec();
        self.write(move |c| retention::prune_tasks(c, &tasks, now)).await
    }

    async fn get_tombstone(&self, tenant_id: &str, task_id: &str) -> StoreResult<Option<Tombstone>> {
        let (t, id) = (tenant_id.to_owned(), task_id.to_owned());
        self.read(move |c| retention::get_tombstone(c, &t, &id)).await
    }

    async fn find_tombstone(&self, key: &IdempotencyKey) -> StoreResult<Option<Tombstone>> {
        let key = key.clone();
        self.read(move |c| retention::find_tombstone(c, &key)).await
    }

    async fn tasks_and_tombstones_created_between(
        &self,
        tenant_id: &str,
        store_id: &str,
        from_id: &str,
        to_id: &str,
    ) -> StoreResult<(Vec<Task>, Vec<Tombstone>)> {
        let (t, s, f, to) = (tenant_id.to_owned(), store_id.to_owned(), from_id.to_owned(), to_id.to_owned());
        self.read(move |c| retention::tasks_and_tombstones_created_between(c, &t, &s, &f, &to)).await
    }

    async fn put_device_log(&self, records: &[DeviceLogRecord]) -> StoreResult<u64> {
        if records.is_empty() {
            return Ok(0);
        }
        let records = records.to_vec();
        self.write(move |c| device_log::put_device_log(c, &records)).await
    }

    async fn device_log_between(
        &self,
        tenant_id: &str,
        store_id: &str,
        from_id: &str,
        to_id: &str,
    ) -> StoreResult<Vec<DeviceLogRecord>> {
        let (t, s, f, to) = (tenant_id.to_owned(), store_id.to_owned(), from_id.to_owned(), to_id.to_owned());
        self.read(move |c| device_log::device_log_between(c, &t, &s, &f, &to)).await
    }

    async fn device_log_of_aliases(
        &self,
        tenant_id: &str,
        store_id: &str,
        task_ids: &[String],
    ) -> StoreResult<Vec<DeviceLogRecord>> {
        let (t, st, ids) = (tenant_id.to_owned(), store_id.to_owned(), task_ids.to_vec());
        self.read(move |c| device_log::device_log_of_aliases(c, &t, &st, &ids)).await
    }

    async fn create_webhook(&self, webhook: NewWebhook) -> StoreResult<Webhook> {
        self.write(move |c| sql::create_webhook(c, webhook)).await
    }

    async fn list_webhooks(&self, tenant_id: &str) -> StoreResult<Vec<Webhook>> {
        let t = tenant_id.to_owned();
        self.read(move |c| sql::list_webhooks(c, &t)).await
    }

    async fn webhook_deliveries(
        &self,
        tenant_id: &str,
        webhook_id: &str,
        limit: i64,
    ) -> StoreResult<Option<Vec<WebhookDelivery>>> {
        let (t, w) = (tenant_id.to_owned(), webhook_id.to_owned());
        self.read(move |c| sql::webhook_deliveries(c, &t, &w, limit)).await
    }

    async fn enqueue_webhook_test(&self, webhook_id: &str, event: OutboxEvent) -> StoreResult<bool> {
        let w = webhook_id.to_owned();
        self.write(move |c| sql::enqueue_webhook_test(c, &w, &event)).await
    }

    async fn due_webhooks(&self, now: onceprint_core::Millis, limit: i64) -> StoreResult<Vec<DueWebhook>> {
        self.read(move |c| sql::due_webhooks(c, now, limit)).await
    }

    async fn record_webhook_attempt(&self, attempt: &WebhookAttempt) -> StoreResult<()> {
        let a = attempt.clone();
        self.write(move |c| sql::record_webhook_attempt(c, &a)).await
    }

    async fn touch_printers_seen(&self, seen: &[PrinterSeen]) -> StoreResult<Vec<(String, String)>> {
        if seen.is_empty() {
            return Ok(Vec::new());
        }
        let seen = seen.to_vec();
        self.write(move |c| sql::touch_printers_seen(c, &seen)).await
    }

    async fn silent_printers(&self, query: &SilenceQuery) -> StoreResult<Vec<Printer>> {
        let q = query.clone();
        self.read(move |c| sql::silent_printers(c, &q)).await
    }

    async fn update_printer_status(&self, updates: &[PrinterStatusUpdate]) -> StoreResult<()> {
        let updates = updates.to_vec();
        self.write(move |c| sql::update_printer_status(c, &updates)).await
    }

    /// One writer job, so one commit: the transitions and the printer reports of applied
    /// ones.
    async fn apply_transitions_with_reports(
        &self,
        changes: &[Transition],
        reports: &[(usize, PrinterStatusUpdate)],
    ) -> StoreResult<Vec<bool>> {
        let (changes, reports) = (changes.to_vec(), reports.to_vec());
        self.write(move |c| {
            let applied = sql::apply_transitions(c, &changes)?;
            let updates: Vec<PrinterStatusUpdate> = reports
                .into_iter()
                .filter(|(i, _)| applied.get(*i).copied().unwrap_or(false))
                .map(|(_, u)| u)
                .collect();
            sql::update_printer_status(c, &updates)?;
            Ok(applied)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An in-memory database as a broker of an earlier version left it: the first
    /// `version` migrations applied and recorded.
    fn database_at(version: usize) -> Connection {
        let conn = Connection::open_in_memory().expect("memory database");
        conn.execute_batch("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)")
            .expect("schema_migrations");
        for (i, sql) in schema::MIGRATIONS.iter().take(version).enumerate() {
            conn.execute_batch(sql).expect("old migration");
            conn.execute("INSERT INTO schema_migrations (version, applied_at) VALUES (?1, 0)", [i as i64 + 1])
                .expect("version");
        }
        conn
    }

    /// The migration to time zones keeps every existing store's offset, now as text.
    #[test]
    fn stores_keep_their_utc_offset_as_a_time_zone() {
        // The database as the broker before time zones left it: migrations 1 to 5.
        let mut conn = database_at(5);
        conn.execute("INSERT INTO tenants (id, name, api_key_hash, created_at) VALUES ('t', 't', 'h', 0)", [])
            .expect("tenant");
        for (id, minutes) in [("east", 480), ("india", 330), ("west", -300), ("newfoundland", -210), ("utc", 0)] {
            conn.execute(
                "INSERT INTO stores (tenant_id, id, name, utc_offset_minutes, created_at) VALUES ('t', ?1, ?1, ?2, 0)",
                rusqlite::params![id, minutes],
            )
            .expect("store");
        }

        migrate(&mut conn).expect("migrate");

        let zones: Vec<(String, String)> =
            sql::list_stores(&conn, "t").expect("stores").into_iter().map(|s| (s.id, s.timezone)).collect();
        let want =
            [("east", "+08:00"), ("india", "+05:30"), ("newfoundland", "-03:30"), ("utc", "UTC"), ("west", "-05:00")];
        assert_eq!(zones, want.map(|(id, tz)| (id.to_owned(), tz.to_owned())));
        // A store created afterwards gets the zone it is given.
        sql::create_store(
            &conn,
            NewStore {
                tenant_id: "t".into(),
                id: "berlin".into(),
                name: "Berlin".into(),
                timezone: "Europe/Berlin".into(),
                now: 0,
                audit: SetupAudit::default(),
            },
        )
        .expect("new store");
        assert_eq!(
            sql::get_store(&conn, "t", "berlin").expect("read").map(|s| s.timezone).as_deref(),
            Some("Europe/Berlin")
        );
    }

    /// The migration to retention keeps the ledger as it was, and lets a task whose
    /// charge stays in the ledger be pruned (the ledger's reference to `tasks` is gone).
    #[test]
    fn the_ledger_keeps_its_rows_and_lets_pruned_tasks_go() {
        // The database as the broker before retention left it: migrations 1 to 12.
        let mut conn = database_at(12);
        conn.execute_batch(
            "INSERT INTO tenants (id, name, api_key_hash, created_at) VALUES ('t', 't', 'h', 0);
             INSERT INTO stores (tenant_id, id, name, created_at) VALUES ('t', 's', 's', 0);
             INSERT INTO printers (tenant_id, id, store_id, name, transport, created_at) VALUES ('t', 'p', 's', 'p', '{}', 0);
             INSERT INTO tasks (id, tenant_id, store_id, printer_id, target, biz_no, print_type, priority, content_type,
                                content, fingerprint, state, created_at, updated_at)
                 VALUES ('T1', 't', 's', 'p', 'printer:p', 'B1', 'receipt', 10, 'text', x'00', 'f', 'printed', 1, 2);
             INSERT INTO ledger (tenant_id, task_id, kind, amount, at) VALUES ('t', 'T1', 'charge', 3, 1);
             INSERT INTO ledger (tenant_id, task_id, kind, amount, at) VALUES ('t', 'T1', 'refund', 3, 2);",
        )
        .expect("old rows");

        // As the broker opens its file: with foreign keys enforced, also while migrating.
        conn.execute_batch("PRAGMA foreign_keys=ON").expect("foreign keys");
        migrate(&mut conn).expect("migrate");

        let kinds: Vec<(String, i64)> =
            sql::ledger_entries(&conn, "T1").expect("ledger").into_iter().map(|e| (e.kind, e.amount)).collect();
        assert_eq!(kinds, vec![("charge".to_owned(), 3), ("refund".to_owned(), 3)]);
        let task = sql::get_task(&conn, "t", "T1").expect("read").expect("task");
        let pruned = retention::prune_tasks(
            &conn,
            &[PruneTask {
                task_id: "T1".into(),
                state: task.state,
                updated_at: task.updated_at,
                business_day: "1970-01-01".into(),
            }],
            5,
        )
        .expect("prune");
        assert_eq!(pruned.task_ids, vec!["T1".to_owned()]);
        assert_eq!(sql::ledger_entries(&conn, "T1").expect("ledger").len(), 2, "the ledger stays");
        assert_eq!(sql::ledger_between(&conn, "t", "s", 0, 10).expect("day").len(), 2, "found through the tombstone");
        let index: i64 = conn
            .query_row("SELECT COUNT(*) FROM sqlite_master WHERE name = 'ledger_by_time'", [], |r| r.get(0))
            .expect("index");
        assert_eq!(index, 1, "the day's ledger is still read through its index");
    }

    /// The migration to set-up changes keeps every key and token working, gives them ids,
    /// and leaves printers enabled.
    #[test]
    fn keys_and_tokens_of_earlier_versions_keep_working_with_ids() {
        // The database as the broker before set-up changes left it: migrations 1 to 7.
        let mut conn = database_at(7);
        conn.execute_batch(
            "INSERT INTO tenants (id, name, api_key_hash, created_at) VALUES ('t', 't', '0123456789abcdef0123', 5);
             INSERT INTO stores (tenant_id, id, name, created_at) VALUES ('t', 's', 's', 0);
             INSERT INTO printers (tenant_id, id, store_id, name, transport, created_at) VALUES ('t', 'p', 's', 'p', '{}', 0);
             INSERT INTO agent_tokens (token_hash, tenant_id, store_id, created_at) VALUES ('fedcba9876543210fe', 't', 's', 7);",
        )
        .expect("old rows");

        migrate(&mut conn).expect("migrate");

        let key = sql::tenant_by_key_hash(&conn, "0123456789abcdef0123").expect("read").expect("key still works");
        assert_eq!((key.tenant.id.as_str(), key.key_id.as_str()), ("t", "key_0123456789abcdef"));
        assert_eq!(setup::list_api_keys(&conn, "t").expect("keys")[0].created_at, 5);
        assert!(sql::agent_by_token_hash(&conn, "fedcba9876543210fe").expect("read").is_some());
        let tokens = setup::list_agent_tokens(&conn, "t", "s", TokenKind::Agent).expect("tokens");
        assert_eq!((tokens[0].id.as_str(), tokens[0].created_at), ("tok_fedcba9876543210", 7));
        assert!(sql::get_printer(&conn, "t", "p").expect("read").expect("printer").enabled);
    }

    /// The migration to the lane sequence numbers existing tasks in id order, and a task
    /// inserted without a `seq` (by a broker older than migration 13, after a downgrade)
    /// lines up last once this broker opens the file again.
    #[test]
    fn existing_and_old_brokers_tasks_get_a_sequence_in_order() {
        // The database as the broker before the sequence left it: migrations 1 to 12.
        let mut conn = database_at(12);
        let task = |id: &str, biz_no: &str| {
            format!(
                "INSERT INTO tasks (id, tenant_id, store_id, printer_id, target, biz_no, print_type, priority,
                                    content_type, content, fingerprint, state, created_at, updated_at)
                 VALUES ('{id}', 't', 's', 'p', 'printer:p', '{biz_no}', 'receipt', 10, 'text', x'00', 'f', 'pending', 1, 1);"
            )
        };
        conn.execute_batch(&format!(
            "INSERT INTO tenants (id, name, api_key_hash, created_at) VALUES ('t', 't', 'h', 0);
             INSERT INTO stores (tenant_id, id, name, created_at) VALUES ('t', 's', 's', 0);
             INSERT INTO printers (tenant_id, id, store_id, name, transport, created_at) VALUES ('t', 'p', 's', 'p', '{{}}', 0);
             {}{}",
            task("T2", "B2"),
            task("T1", "B1")
        ))
        .expect("old rows");
        migrate(&mut conn).expect("migrate");
        // As a broker of the previous version inserts: no `seq`, and an id that sorts first;
        // the next open numbers it behind the others.
        conn.execute_batch(&task("T0", "B0")).expect("old broker's insert");
        assert_eq!(sql::sequence_unnumbered_tasks(&conn).expect("number"), 1);
        assert_eq!(sql::sequence_unnumbered_tasks(&conn).expect("number again"), 0);
        let seqs: Vec<(String, i64)> = conn
            .prepare("SELECT id, seq FROM tasks ORDER BY seq")
            .and_then(|mut s| s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
            .expect("read");
        assert_eq!(seqs, vec![("T1".to_owned(), 1), ("T2".to_owned(), 2), ("T0".to_owned(), 3)]);
        assert_eq!(sql::lane(&conn, "t", "p").expect("lane").waiting.map(|t| t.task_id).as_deref(), Some("T1"));
    }

    /// The lane reads find their tasks through `tasks_lane` (never a scan of the
    /// backlog): the predicate they repeat (`sql::IN_LANE`) must be the index's own, and
    /// a write of `tasks` must not build a temporary B-tree for it (migration 21).
    #[test]
    fn the_lane_reads_use_the_lane_index_and_writes_build_no_temporary_tree() {
        let mut conn = database_at(0);
        migrate(&mut conn).expect("migrate");
        let plan = |sql: &str| -> String {
            conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
                .and_then(|mut s| s.query_map([], |r| r.get::<_, String>(3))?.collect::<Result<Vec<_>, _>>())
                .expect("plan")
                .join("; ")
        };
        let lanes = format!(
            "SELECT id FROM tasks u WHERE u.tenant_id = 't' AND u.printer_id = 'p' AND {} AND u.state <> 'sent' \
             ORDER BY u.priority, u.seq LIMIT 1",
            sql::IN_LANE
        );
        assert!(plan(&lanes).contains("USING INDEX tasks_lane"), "{}", plan(&lanes));
        let program = |sql: &str| -> Vec<String> {
            conn.prepare(&format!("EXPLAIN {sql}"))
                .and_then(|mut s| s.query_map([], |r| r.get::<_, String>(1))?.collect::<Result<Vec<_>, _>>())
                .expect("program")
        };
        for write in [
            "UPDATE tasks SET state = 'sent', attempts = 1 WHERE id = 'x' AND state = 'pending' AND attempts = 0",
            "INSERT INTO tasks (id, tenant_id, store_id, printer_id, target, biz_no, print_type, priority, \
             content_type, content, fingerprint, state, created_at, updated_at) \
             VALUES ('x', 't', 's', 'p', 'printer:p', 'b', 'receipt', 10, 'text', x'00', 'f', 'pending', 1, 1)",
        ] {
            assert!(!program(write).iter().any(|op| op == "OpenEphemeral"), "a temporary B-tree in {write}");
        }
    }
}
