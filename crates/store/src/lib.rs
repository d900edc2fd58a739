//! The storage boundary of onceprint.
//!
//! This crate owns the [`Store`] trait that every database backend implements (SQLite and
//! PostgreSQL today), the row types that cross it, the [`GroupCommitter`] that turns many
//! concurrent submissions into one durable transaction, and — behind the `conformance`
//! feature — the one test suite every backend must pass.
//!
//! It must never contain SQL or know which database is behind the trait: the rules that
//! decide duplicates and legal transitions live in `onceprint-core`, the SQL in the backend
//! crates. What the trait promises (atomic creation of task + audit event + ledger charge,
//! compare-and-set transitions, the unique key as final judge) is spelled out on each
//! method and checked by the conformance suite.
//!
//! Where things are: the row types include the cluster's leases and shared agent sessions,
//! `Tombstone` (what retention keeps of a pruned task), `TokenKind` (agent tokens and LAN keys
//! in one table; `agent_by_token_hash` finds agent tokens only), `Store::merge_offline` with
//! its `MergePlanner` and `task_aliases` (merged, conflict, renamed), `Store::lease_row`, and
//! `DeviceLogRecord` (a store agent's latest journal record of a task, with the order in
//! which one record supersedes another: the stronger state, then the later time;
//! `Store::device_log_of_aliases` reads the records under LAN ids merged into tasks).
//! `NodeLink` (`link.rs`) carries text messages from every broker node to every node sharing
//! the database (`Store::node_link`). The conformance suite and the idempotency property test
//! run against every backend.

mod batch;
pub mod link;
pub mod model;
pub mod testing;

#[cfg(feature = "conformance")]
pub mod conformance;

use async_trait::async_trait;
use onceprint_core::{IdempotencyKey, TaskState};

pub use batch::{GroupCommitConfig, GroupCommitter};
pub use link::{Heard, NodeLink};
pub use model::*;

/// Failures of a backend, independent of which database is behind it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// An object with this id already exists (tenant, store, printer, station).
    #[error("{0} already exists")]
    AlreadyExists(String),
    /// A referenced object does not exist (for example the store of a new printer).
    #[error("{0} not found")]
    NotFound(String),
    /// The database cannot be reached or refused the connection.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// Anything else the database reported. Carries the backend's message for the logs.
    #[error("database error: {0}")]
    Backend(String),
}

pub type StoreResult<T> = Result<T, StoreError>;

/// One database backend. All methods are safe to call concurrently.
///
/// Every write is durable when the returned future resolves: callers answer HTTP clients
/// and acknowledge messages only afterwards.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Short name for logs and metrics ("sqlite", "postgres").
    fn backend(&self) -> &'static str;

    /// Cheap round trip used by `/readyz`.
    async fn ping(&self) -> StoreResult<()>;

    /// The link to the other broker nodes sharing this database, for a backend that
    /// several nodes can share; `None` (the default) for one that only one process opens.
    fn node_link(&self) -> Option<std::sync::Arc<dyn NodeLink>> {
        None
    }

    /// Small key/value settings that belong to the database (e.g. the admin token hash).
    async fn get_setting(&self, key: &str) -> StoreResult<Option<String>>;
    async fn put_setting(&self, key: &str, value: &str) -> StoreResult<()>;

    // Set-up. Every set-up write (the `create_*`, `update_*`, `set_printer_enabled` and
    // `revoke_*` methods) records its `audit` as one row of the set-up audit in the same
    // transaction as the change, and none when it changes nothing.

    /// Creates the tenant together with its first API key.
    async fn create_tenant(&self, tenant: NewTenant) -> StoreResult<Tenant>;
    /// The tenant of an active (not revoked) API key, and which key it is.
    async fn tenant_by_key_hash(&self, api_key_hash: &str) -> StoreResult<Option<TenantKey>>;
    /// Fails with `AlreadyExists` when the id is taken, `NotFound` when the tenant is gone.
    async fn create_api_key(&self, key: NewApiKey) -> StoreResult<ApiKey>;
    /// The tenant's keys, active and revoked, oldest first.
    async fn list_api_keys(&self, tenant_id: &str) -> StoreResult<Vec<ApiKey>>;
    /// Revokes a key of the tenant, unless it is the tenant's last active one; checked and
    /// changed in one transaction, so that two revocations racing cannot revoke the last
    /// two keys. Revoking a revoked key changes nothing and answers `Revoked`.
    async fn revoke_api_key(&self, change: RevokeApiKey) -> StoreResult<KeyRevocation>;

    async fn create_store(&self, store: NewStore) -> StoreResult<StoreRow>;
    async fn get_store(&self, tenant_id: &str, store_id: &str) -> StoreResult<Option<StoreRow>>;
    async fn list_stores(&self, tenant_id: &str) -> StoreResult<Vec<StoreRow>>;

    /// Fails with `NotFound("store …")` when the store is not the tenant's.
    async fn create_printer(&self, printer: NewPrinter) -> StoreResult<Printer>;
    async fn get_printer(&self, tenant_id: &str, printer_id: &str) -> StoreResult<Option<Printer>>;
    async fn list_printers(&self, tenant_id: &str, store_id: Option<&str>) -> StoreResult<Vec<Printer>>;
    /// Changes a printer's name and transport if it still has the expected ones; `None`
    /// (and nothing written) when the tenant has no such printer or it was changed since.
    async fn update_printer(&self, change: PrinterUpdate) -> StoreResult<Option<Printer>>;
    /// Disables or enables a printer; `None` when the tenant has no such printer. The
    /// audit row is written only when the state flips.
    async fn set_printer_enabled(&self, change: PrinterEnabled) -> StoreResult<Option<Printer>>;
    /// Printers of every tenant whose transport has this `kind` (the broker pushes to
    /// `webhook` printers itself).
    async fn printers_by_transport(&self, kind: &str) -> StoreResult<Vec<Printer>>;
    /// Printers of every tenant with this id (a vendor callback names only the printer;
    /// its signature tells which tenant's printer it is).
    /// The printer whose login has this password hash (none for an unknown or replaced one).
    async fn printer_by_secret_hash(&self, secret_hash: &str) -> StoreResult<Option<PrinterCredential>>;

    /// The login with this user name and its Digest keys (none for an unknown or replaced
    /// one): HTTP Digest names the user but never sends the password.
    async fn printer_login_by_username(&self, username: &str) -> StoreResult<Option<PrinterDigestLogin>>;

    /// Replaces a printer's login; `false` when the printer does not exist.
    async fn set_printer_secret(&self, change: PrinterSecretChange) -> StoreResult<bool>;

    async fn printers_with_id(&self, printer_id: &str) -> StoreResult<Vec<Printer>>;

    /// Every login of every tenant that has an MQTT password hash, by user name: what the
    /// MQTT server's password file is written from.
    async fn mqtt_logins(&self) -> StoreResult<Vec<MqttLogin>>;

    /// A store's stations, by id.
    async fn list_stations(&self, tenant_id: &str, store_id: &str) -> StoreResult<Vec<Station>>;

    /// Fails with `NotFound` when the store or a printer is not the tenant's; the caller
    /// checks beforehand that all printers belong to the station's store.
    async fn create_station(&self, station: NewStation) -> StoreResult<Station>;
    async fn get_station(&self, tenant_id: &str, station_id: &str) -> StoreResult<Option<Station>>;
    /// Replaces a station's printers if it still has the expected list; `None` (nothing
    /// written) when the tenant has no such station or it was changed since. Fails with
    /// `NotFound("printer …")` like creation.
    async fn update_station(&self, change: StationUpdate) -> StoreResult<Option<Station>>;

    /// Fails with `NotFound` when the store is not the tenant's. Agent tokens and LAN keys
    /// ([`TokenKind`]) are kept alike; ids are unique per tenant across both kinds.
    async fn create_agent_token(&self, token: NewAgentToken) -> StoreResult<AgentToken>;
    /// The identity of an active (not revoked) token of kind `agent`: a LAN key is never
    /// found here, whatever its hash.
    async fn agent_by_token_hash(&self, token_hash: &str) -> StoreResult<Option<AgentIdentity>>;
    /// A store's tokens of one kind, active and revoked, oldest first.
    async fn list_agent_tokens(&self, tenant_id: &str, store_id: &str, kind: TokenKind)
        -> StoreResult<Vec<AgentToken>>;
    /// The ids and stored hashes of a store's active tokens of one kind, oldest first.
    async fn active_token_hashes(
        &self,
        tenant_id: &str,
        store_id: &str,
        kind: TokenKind,
    ) -> StoreResult<Vec<TokenHash>>;
    /// Revokes a token of the store of the kind named; `None` when the store has no such
    /// token. Revoking a revoked token changes nothing.
    async fn revoke_agent_token(&self, change: RevokeAgentToken) -> StoreResult<Option<Revoked<AgentToken>>>;

    /// Creates an operator (audited). `AlreadyExists` when the id is taken in the tenant,
    /// `NotFound("store …")` when a store is not the tenant's; nothing is written then.
    async fn create_operator(&self, operator: NewOperator) -> StoreResult<Operator>;
    /// The tenant's operators, by id.
    async fn list_operators(&self, tenant_id: &str) -> StoreResult<Vec<Operator>>;
    /// An operator and its password hash, for checking a login.
    async fn operator_login(&self, tenant_id: &str, operator_id: &str) -> StoreResult<Option<(Operator, String)>>;
    /// Starts a session; `NotFound("operator …")` when the operator does not exist.
    async fn create_operator_session(&self, session: NewOperatorSession) -> StoreResult<()>;
    /// The session whose secret has this hash, unless it was revoked (expired sessions
    /// are returned; the caller compares `expires_at` with its clock).
    async fn operator_session(&self, token_hash: &str) -> StoreResult<Option<OperatorSession>>;
    /// Revokes one session (logout); `false` when there was no active one.
    async fn revoke_operator_session(&self, token_hash: &str, now: onceprint_core::Millis) -> StoreResult<bool>;
    /// Revokes every active session of an operator, audited; how many were revoked, or
    /// `None` when the tenant has no such operator.
    async fn revoke_operator_sessions(&self, change: RevokeOperatorSessions) -> StoreResult<Option<u64>>;
    /// Disables or enables an operator, sets a new password, or records an unlock, audited
    /// in the same transaction; the operator as it is after the change, or `None` when the
    /// tenant has no such operator. A disable and a new password end every active session.
    async fn change_operator(&self, change: ChangeOperator) -> StoreResult<Option<Operator>>;

    /// The tenant's set-up audit, newest first: at most `limit` rows with an id below
    /// `before` (the last id of the previous page).
    async fn setup_events(&self, tenant_id: &str, limit: i64, before: Option<i64>) -> StoreResult<Vec<SetupEvent>>;

    /// Creates tasks in one transaction, each with its first audit event and its ledger
    /// charge. A task whose key already exists — in the database or earlier in the
    /// same batch — is not created; its existing row is returned instead. The unique
    /// constraint on the key is the final judge, also against concurrent batches. A key
    /// whose task was pruned is answered with its tombstone (`Pruned`) and never creates a
    /// task again, also when the pruning commits while the batch is being written. Results
    /// are in input order.
    async fn submit_batch(&self, batch: Vec<NewTask>) -> StoreResult<Vec<SubmitOutcome>>;

    /// Takes a task the store agent accepted offline, in one transaction, with
    /// the unique key as the final judge:
    /// 1. A LAN task id uploaded before answers as it did (`again`), writing nothing.
    /// 2. A key with no task and no tombstone: the task is inserted under the LAN task id
    ///    in the state and with the figures given, with its creation event, its history
    ///    and its charge (at `task.now`); a waiting task joins its printer's lane.
    /// 3. A key with a task: the LAN id becomes its alias, and `planner`'s step for the
    ///    task as read in the transaction is applied there (compare-and-set and event).
    /// 4. A key with a tombstone: the LAN id becomes an alias of the pruned task.
    ///
    /// Never a second charge. A LAN id that names another task is `IdTaken`.
    async fn merge_offline(&self, task: OfflineTask, planner: MergePlanner) -> StoreResult<OfflineMerge>;

    /// The task a LAN task id is an alias of, for the tenant.
    async fn task_alias(&self, tenant_id: &str, alias_id: &str) -> StoreResult<Option<TaskAlias>>;

    /// A task of the tenant that is kept (a pruned one is `None`; see
    /// [`Store::get_tombstone`]).
    async fn get_task(&self, tenant_id: &str, task_id: &str) -> StoreResult<Option<Task>>;
    /// The tenant's tasks among `task_ids` (unknown ids are left out), in no set order.
    async fn get_tasks(&self, tenant_id: &str, task_ids: &[String]) -> StoreResult<Vec<Task>>;
    async fn find_task(&self, key: &IdempotencyKey) -> StoreResult<Option<Task>>;
    async fn task_content(&self, task_id: &str) -> StoreResult<Option<TaskContent>>;
    /// The content of several tasks at once (task id → content; unknown ids left out).
    async fn task_contents(&self, task_ids: &[String]) -> StoreResult<Vec<(String, TaskContent)>>;
    /// Newest first; `cursor` is the last task id of the previous page.
    async fn list_tasks(&self, query: &TaskQuery) -> StoreResult<Vec<Task>>;
    /// `None` when the task does not exist for this tenant.
    async fn task_events(&self, tenant_id: &str, task_id: &str) -> StoreResult<Option<Vec<TaskEvent>>>;
    async fn ledger_entries(&self, task_id: &str) -> StoreResult<Vec<LedgerEntry>>;
    /// Number of tasks in each state, for the `/metrics` gauge.
    async fn count_by_state(&self) -> StoreResult<Vec<(TaskState, i64)>>;

    /// Compare-and-set on (state, attempts): applies `change` only if the task is still in
    /// `change.from` at `change.expected_attempts`, writing the audit event in the same
    /// transaction. Returns `false` (and writes nothing) when someone else moved it first.
    /// The caller has checked the transition against the state machine.
    async fn transition(&self, change: &Transition) -> StoreResult<bool>;

    /// Several compare-and-set transitions in one transaction; one result per change, in
    /// order. A change that loses its compare-and-set, or that would put a second task of
    /// one printer into `sent` (the one-in-flight-per-printer rule, enforced by a
    /// unique index), is `false` and writes nothing; the others still apply.
    async fn apply_transitions(&self, changes: &[Transition]) -> StoreResult<Vec<bool>>;

    /// The lanes of a store's printers of transport kind `kind` (the `kind` of their
    /// transport JSON) that have active tasks: for each, the task in flight, or, when
    /// nothing is in flight, the first waiting task by (priority, seq) (while a lane is busy
    /// only its task in flight can move, so its waiting task is not read). Through indexes,
    /// a probe or two per printer of that kind, never a scan of the backlog: a claim of one
    /// transport does not read the lanes of the store's other printers.
    async fn lanes(&self, tenant_id: &str, store_id: &str, kind: &str) -> StoreResult<Vec<Lane>>;

    /// One printer's lane, as in [`Store::lanes`] (empty when it has no active task).
    async fn lane(&self, tenant_id: &str, printer_id: &str) -> StoreResult<Lane>;

    /// For each of the tenant's printers in `printer_ids` that has one, its first waiting
    /// (`pending` or `retrying`) task by (priority, seq), whatever it has in flight: what
    /// its lane hands out next once the task in flight ends. An ack that ends the task in
    /// flight hands this one out in the same transaction (the agent's `next`). Through the
    /// same index probe as [`Store::lanes`], one per printer; in the order of printer ids.
    async fn lane_heads(&self, tenant_id: &str, printer_ids: &[String]) -> StoreResult<Vec<Task>>;

    /// What a batch of an agent's acks is decided on, as [`Store::get_tasks`] answers it,
    /// and, with `heads`, what the lanes of the acked tasks that are `sent` hand out next
    /// ([`Store::lane_heads`]) together with the content of those heads
    /// ([`Store::task_contents`]), so that their hand-out needs no read after its write.
    /// The default makes the three reads one after the other; a backend that can read them
    /// in one go (one read transaction on one connection) overrides it: every ack batch
    /// with `next` pays this read, and every read hop is latency in a printer's cycle.
    async fn read_for_acks(&self, tenant_id: &str, task_ids: &[String], heads: bool) -> StoreResult<AckRead> {
        let tasks = self.get_tasks(tenant_id, task_ids).await?;
        if !heads {
            return Ok(AckRead { tasks, heads: Vec::new(), contents: Vec::new() });
        }
        let printers = AckRead::printers_in_flight(&tasks);
        let heads = if printers.is_empty() { Vec::new() } else { self.lane_heads(tenant_id, &printers).await? };
        let ids: Vec<String> = heads.iter().map(|t| t.task_id.clone()).collect();
        let contents = if ids.is_empty() { Vec::new() } else { self.task_contents(&ids).await? };
        Ok(AckRead { tasks, heads, contents })
    }

    /// Figures of every lane with active tasks, of every tenant (the watchdog).
    async fn lane_stats(&self) -> StoreResult<Vec<LaneStats>>;

    /// The greatest task id in the database. A broker seeds its id generator with it, so a
    /// wall clock that stepped back across a restart cannot mint ids that sort before the
    /// tasks already waiting.
    async fn max_task_id(&self) -> StoreResult<Option<String>>;

    /// Writes an alert that belongs to no state change (`printer.stalled`) to the outbox,
    /// fanned out to the tenant's endpoints that subscribed to its kind (and not written at
    /// all when none did).
    async fn record_alert(&self, event: &OutboxEvent) -> StoreResult<()>;

    /// Tasks in `state` whose `next_attempt_at` has passed, oldest deadline first, found
    /// through the (state, next_attempt_at) index. For `sent` tasks that column holds
    /// the delivery deadline.
    async fn due_tasks(&self, state: TaskState, now: onceprint_core::Millis, limit: i64) -> StoreResult<Vec<Task>>;

    /// The waiting tasks (`pending`, `retrying`) of the printers whose lane is paused
    /// (`paused_since` set: no paper, cover open, paper jam, offline — a printer that called
    /// in and fell silent among them), with each printer's pause, in lane order per printer,
    /// at most `limit`. The sweeper moves them on by time when the printer says nothing:
    /// a station's failover threshold, the print type's `max_wait_ms`. Through the
    /// partial index of paused printers, then a probe of `tasks_lane` per printer.
    async fn waiting_on_paused_printers(&self, limit: i64) -> StoreResult<Vec<PausedWait>>;

    /// Applies an operator's action or a failover in one transaction: the compare-and-set
    /// transitions of the task (with their audit events; all or none), the refund of the
    /// charge named (unique per task, so never twice), and the successor task (with its own creation event and
    /// charge; a transfer or failover also links the original to it). Returns `false`
    /// and writes nothing when a compare-and-set fails. A successor whose key exists
    /// already fails with `AlreadyExists` and writes nothing.
    async fn apply_manual(&self, change: &ManualChange) -> StoreResult<bool>;

    /// Failed and in-doubt tasks of a store, oldest change first.
    async fn attention(&self, tenant_id: &str, store_id: &str, limit: i64) -> StoreResult<Vec<Task>>;

    /// Kept tasks of a store whose id lies in `[from_id, to_id)`. Task ids sort by creation
    /// time, so this is "created in a time range", read through the (tenant, store, id)
    /// index. Pruned tasks are not among them; reconciliation reads them with
    /// [`Store::tasks_and_tombstones_created_between`].
    async fn tasks_created_between(
        &self,
        tenant_id: &str,
        store_id: &str,
        from_id: &str,
        to_id: &str,
    ) -> StoreResult<Vec<Task>>;

    /// Ledger entries of a store's tasks written in `[from, to)`, pruned tasks'
    /// entries included.
    async fn ledger_between(
        &self,
        tenant_id: &str,
        store_id: &str,
        from: onceprint_core::Millis,
        to: onceprint_core::Millis,
    ) -> StoreResult<Vec<LedgerEntry>>;

    /// How many reprints a task has (pruned reprints included, so that a new reprint never
    /// takes the number, and key, of a pruned one).
    async fn reprint_count(&self, task_id: &str) -> StoreResult<i32>;

    // Retention. Finished tasks are pruned in small batches: each task's content and
    // audit events are deleted and its row replaced by a tombstone in one transaction; the
    // ledger is never touched.

    /// Tasks in one of `states`, created before `before_id` (ids sort by creation time)
    /// and last changed before `changed_before`, with an id greater than `after_id`, by id,
    /// at most `limit`: what retention may prune. Read through the primary key from
    /// `after_id`, so that a run pages through the old tasks once.
    async fn prunable_tasks(
        &self,
        states: &[TaskState],
        before_id: &str,
        changed_before: onceprint_core::Millis,
        after_id: Option<&str>,
        limit: i64,
    ) -> StoreResult<Vec<Task>>;

    /// Prunes the tasks named, in one transaction: each one that is still in the state
    /// and at the `updated_at` it was read with (a compare-and-set) loses its audit events
    /// and its content, and its row becomes a [`Tombstone`] written in the same
    /// transaction (with `pruned_at` = `now`). Tasks that changed or are gone are left
    /// alone and not reported.
    async fn prune_tasks(&self, tasks: &[PruneTask], now: onceprint_core::Millis) -> StoreResult<Pruned>;

    /// The tombstone of a pruned task of the tenant.
    async fn get_tombstone(&self, tenant_id: &str, task_id: &str) -> StoreResult<Option<Tombstone>>;

    /// The tombstone kept under an idempotency key, if its task was pruned.
    async fn find_tombstone(&self, key: &IdempotencyKey) -> StoreResult<Option<Tombstone>>;

    /// A store's day as reconciliation needs it, in one consistent read: the kept tasks
    /// whose id lies in `[from_id, to_id)` (as [`Store::tasks_created_between`]) and the
    /// tombstones of the pruned ones, each task in exactly one of the two lists even while
    /// retention runs.
    async fn tasks_and_tombstones_created_between(
        &self,
        tenant_id: &str,
        store_id: &str,
        from_id: &str,
        to_id: &str,
    ) -> StoreResult<(Vec<Task>, Vec<Tombstone>)>;

    /// Stores store agents' device log records, one row per (tenant, store,
    /// task id), in one transaction: a record replaces the stored one only when it
    /// [supersedes](DeviceLogRecord::supersedes) it, so uploading the same records again
    /// changes nothing and the outcome does not depend on the order of uploads. Several
    /// records of one task in the call are merged the same way. Returns how many rows were
    /// inserted or replaced.
    async fn put_device_log(&self, records: &[DeviceLogRecord]) -> StoreResult<u64>;

    /// A store's device log records whose task id lies in `[from_id, to_id)`, by task id:
    /// the records of the tasks created in a time range, as for
    /// [`Store::tasks_created_between`] (an agent's ids for tasks it accepted on the shop's
    /// LAN sort by their acceptance time too).
    async fn device_log_between(
        &self,
        tenant_id: &str,
        store_id: &str,
        from_id: &str,
        to_id: &str,
    ) -> StoreResult<Vec<DeviceLogRecord>>;
    /// The device log records kept under the LAN task ids merged into `task_ids` (their
    /// aliases), each given the id of the task it names, in one statement. A LAN id sorts
    /// by the acceptance time the agent's clock gave it, which a shop PC's clock far off
    /// puts outside the day of the task it was merged into, so the day's id range misses
    /// it.
    async fn device_log_of_aliases(
        &self,
        tenant_id: &str,
        store_id: &str,
        task_ids: &[String],
    ) -> StoreResult<Vec<DeviceLogRecord>>;

    /// Records printer health reported by agents (`online`, `last_seen_at`, `last_error`).
    /// When `online` flips, a `printer.online` / `printer.offline` alert is written to the
    /// outbox in the same transaction.
    async fn update_printer_status(&self, updates: &[PrinterStatusUpdate]) -> StoreResult<()>;

    /// Moves `last_seen_at` of each printer forward to its `at` (never back), touching
    /// nothing else, in one call: the refreshes of printers that keep polling with nothing
    /// new to say. Only printers the broker holds online are touched, so a concurrent
    /// change of `online` or `last_error` is never overwritten and an offline printer keeps
    /// the time it went silent. Returns the printers that were not touched (offline, or
    /// gone), whose next report must be written whole.
    async fn touch_printers_seen(&self, seen: &[PrinterSeen]) -> StoreResult<Vec<(String, String)>>;

    /// The printers of a polled transport that went silent (see [`SilenceQuery`]), ordered
    /// by tenant and id: the database compares every row and returns only those.
    async fn silent_printers(&self, query: &SilenceQuery) -> StoreResult<Vec<Printer>>;

    /// [`Store::apply_transitions`], then, for every `(i, report)` of `reports` whose change
    /// `changes[i]` applied, [`Store::update_printer_status`] with the report: what an
    /// agent's acks say about the tasks and about the printers that printed them. A report
    /// whose change did not apply is not written (a stale ack describes the printer as it
    /// was). The default runs the two one after the other; a backend with a single writer
    /// overrides it to write both in one transaction, which saves a commit on every batch
    /// of acks.
    async fn apply_transitions_with_reports(
        &self,
        changes: &[Transition],
        reports: &[(usize, PrinterStatusUpdate)],
    ) -> StoreResult<Vec<bool>> {
        let applied = self.apply_transitions(changes).await?;
        let updates: Vec<PrinterStatusUpdate> =
            reports.iter().filter(|(i, _)| applied.get(*i).copied().unwrap_or(false)).map(|(_, u)| u.clone()).collect();
        if !updates.is_empty() {
            self.update_printer_status(&updates).await?;
        }
        Ok(applied)
    }

    /// Registers a webhook endpoint for alerts.
    async fn create_webhook(&self, webhook: NewWebhook) -> StoreResult<Webhook>;
    async fn list_webhooks(&self, tenant_id: &str) -> StoreResult<Vec<Webhook>>;
    /// Writes `event` to the outbox for endpoint `webhook_id` alone, whatever it subscribed
    /// to (a test message a person asked for); `false` when the tenant has no such endpoint.
    async fn enqueue_webhook_test(&self, webhook_id: &str, event: OutboxEvent) -> StoreResult<bool>;
    /// Delivery attempts of one endpoint, newest event first. `None` when the endpoint is
    /// not the tenant's.
    async fn webhook_deliveries(
        &self,
        tenant_id: &str,
        webhook_id: &str,
        limit: i64,
    ) -> StoreResult<Option<Vec<WebhookDelivery>>>;
    /// Deliveries not yet delivered whose time has come, oldest first.
    async fn due_webhooks(&self, now: onceprint_core::Millis, limit: i64) -> StoreResult<Vec<DueWebhook>>;
    /// Records one delivery attempt.
    async fn record_webhook_attempt(&self, attempt: &WebhookAttempt) -> StoreResult<()>;

    // --- Several nodes on one database ---

    /// Takes or renews the lease `name` for `holder` until `now + ttl_ms`, as one
    /// compare-and-set: it succeeds when nobody holds the lease, when it expired by `now`,
    /// or when `holder` holds it already. Returns the lease's fencing token when `holder`
    /// holds it afterwards, `None` when another holder's lease is still running. The token
    /// increases by one on every change of holder (never on a renewal), so work done
    /// under an older token can be told apart from the current holder's.
    async fn acquire_lease(
        &self,
        name: &str,
        holder: &str,
        now: onceprint_core::Millis,
        ttl_ms: i64,
    ) -> StoreResult<Option<i64>>;
    /// Gives the lease up at once (it expires now) if `holder` still holds it, so that
    /// another node may take it without waiting for its expiry. Returns whether it did.
    async fn release_lease(&self, name: &str, holder: &str, now: onceprint_core::Millis) -> StoreResult<bool>;
    /// The lease `name` as it stands, expired or not; `None` if nobody ever took it.
    async fn lease_row(&self, name: &str) -> StoreResult<Option<LeaseRow>>;
    /// Writes what this node heard of agent sessions, in one statement: a row per session,
    /// merged with what other nodes wrote (the latest `heard_at` wins; `started_at` is kept
    /// as first written).
    async fn put_agent_sessions(&self, rows: &[AgentSessionRow]) -> StoreResult<()>;
    /// Agent sessions heard at or after `since`, in one statement.
    async fn agent_sessions_since(&self, since: onceprint_core::Millis) -> StoreResult<Vec<AgentSessionRow>>;
    /// Deletes the sessions nobody heard since `heard_before` (long stopped processes), so
    /// that the table holds about one row per live agent process. Returns how many.
    async fn forget_agent_sessions(&self, heard_before: onceprint_core::Millis) -> StoreResult<u64>;
    /// Background upkeep a backend runs on its own (PostgreSQL's planner statistics) runs
    /// only while `gate` answers true, so that a cluster does it on one node. Backends
    /// without such upkeep ignore it.
    fn set_upkeep_gate(&self, _gate: UpkeepGate) {}
}

/// Asked by a backend's own background upkeep before each round (see
/// [`Store::set_upkeep_gate`]).
pub type UpkeepGate = std::sync::Arc<dyn Fn() -> bool + Send + Sync>;
