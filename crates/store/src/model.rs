//! Rows that cross the [`crate::Store`] boundary. Times are milliseconds since the epoch;
//! the HTTP layer turns them into RFC 3339.

use onceprint_core::{Millis, TaskState};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewTenant {
    pub id: String,
    pub name: String,
    /// The id of the tenant's first API key (further keys come from
    /// [`crate::Store::create_api_key`]).
    pub api_key_id: String,
    /// SHA-256 (hex) of the API key; the key itself is never stored.
    pub api_key_hash: String,
    pub now: Millis,
    pub audit: SetupAudit,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tenant {
    pub id: String,
    pub name: String,
    pub created_at: Millis,
}

/// Who an active API key speaks for, and which of the tenant's keys it is (the actor of
/// the set-up audit, `api_key:ID`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantKey {
    pub tenant: Tenant,
    pub key_id: String,
}

/// One of a tenant's API keys, as the API lists it (never the key or its hash).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKey {
    pub tenant_id: String,
    pub id: String,
    pub created_at: Millis,
    /// Set once; a revoked key authenticates nobody.
    pub revoked_at: Option<Millis>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewApiKey {
    pub tenant_id: String,
    pub id: String,
    /// SHA-256 (hex) of the key.
    pub key_hash: String,
    pub now: Millis,
    pub audit: SetupAudit,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevokeApiKey {
    pub tenant_id: String,
    pub id: String,
    pub now: Millis,
    pub audit: SetupAudit,
}

/// A revoked key or token, with the hash it was found by (for the caller to drop from its
/// caches; it is never shown).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revoked<T> {
    pub row: T,
    pub hash: String,
}

/// What [`crate::Store::revoke_api_key`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyRevocation {
    /// The key is revoked (now, or it already was: then nothing was written).
    Revoked(Revoked<ApiKey>),
    /// Refused: it is the tenant's last active key, and revoking it would lock the tenant
    /// out of its own set-up for good.
    LastActiveKey,
    /// The tenant has no key with this id.
    NotFound,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewStore {
    pub tenant_id: String,
    pub id: String,
    pub name: String,
    /// The store's time zone, already checked by the caller: an IANA name
    /// ("Europe/Berlin"), a fixed offset ("+08:00"), or "UTC". Its business days
    /// (reconciliation) start at local midnight in this zone. The store keeps the text as
    /// given and does not interpret it.
    pub timezone: String,
    pub now: Millis,
    pub audit: SetupAudit,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreRow {
    pub tenant_id: String,
    pub id: String,
    pub name: String,
    /// See [`NewStore::timezone`].
    pub timezone: String,
    pub created_at: Millis,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewPrinter {
    pub tenant_id: String,
    pub id: String,
    pub store_id: String,
    pub name: String,
    /// The transport object as JSON text (`{"kind":"agent","address":…}`).
    pub transport: String,
    /// The printer's own login, for transports whose printers call the broker (CloudPRNT,
    /// Epson Server Direct Print, MQTT): kept in the same transaction as the printer.
    pub credential: Option<PrinterSecret>,
    pub now: Millis,
    pub audit: SetupAudit,
}

/// A printer's login as stored: the user name and the SHA-256 of its random password
/// (never the password, ARCHITECTURE invariant 7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrinterSecret {
    /// Unique across every tenant (a printer presents only this and the password).
    pub username: String,
    pub secret_hash: String,
    /// For a printer that logs in to the MQTT server: the same password hashed the way the
    /// MQTT server checks it (Mosquitto's `$7$` PBKDF2-SHA512 line), so that its password
    /// file can be written again from the database at any time. A salted slow hash of a
    /// 256-bit random password, never the password.
    pub mqtt_hash: Option<String>,
    /// For a printer that may sign in with HTTP Digest (Epson Server Direct Print): the
    /// RFC 7616 `HA1` of the login, `H(username:realm:password)` in lowercase hex, with MD5
    /// and with SHA-256. The broker cannot check a Digest answer against [`Self::secret_hash`],
    /// so it keeps these instead. Each one is a password equivalent for Digest sign-in (not
    /// for Basic, and it does not give back the random password), so it is kept only for
    /// the printers that use it. `None` for logins made before Digest was offered.
    pub ha1_md5: Option<String>,
    pub ha1_sha256: Option<String>,
}

/// A printer's login as HTTP Digest sign-in needs it, found by user name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrinterDigestLogin {
    pub tenant_id: String,
    pub printer_id: String,
    pub username: String,
    /// [`PrinterSecret::ha1_md5`].
    pub ha1_md5: Option<String>,
    /// [`PrinterSecret::ha1_sha256`].
    pub ha1_sha256: Option<String>,
}

/// A printer's login to the MQTT server, as its password file needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MqttLogin {
    pub tenant_id: String,
    pub printer_id: String,
    pub username: String,
    /// [`PrinterSecret::mqtt_hash`].
    pub mqtt_hash: String,
}

/// Whose login a password is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrinterCredential {
    pub tenant_id: String,
    pub printer_id: String,
    pub username: String,
}

/// A printer's new login (rotation): the old one stops working in the same commit.
#[derive(Debug, Clone)]
pub struct PrinterSecretChange {
    pub tenant_id: String,
    pub printer_id: String,
    pub secret: PrinterSecret,
    pub now: Millis,
    pub audit: SetupAudit,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Printer {
    pub tenant_id: String,
    pub id: String,
    pub store_id: String,
    pub name: String,
    pub transport: String,
    /// A disabled printer's lane is handed out to nobody and it takes no new submissions;
    /// its tasks wait (see [`PrinterEnabled`]).
    pub enabled: bool,
    pub online: bool,
    pub last_seen_at: Option<Millis>,
    pub last_error: Option<String>,
    /// Since when the printer's own state (no paper, cover open, paper jam, offline)
    /// holds its lane: set when `last_error` turns into one of them, cleared when it
    /// turns into anything else. A station fails over to its backup once
    /// this is older than the broker's station threshold.
    pub paused_since: Option<Millis>,
    pub created_at: Millis,
}

/// A change of a printer's name and transport (its store never changes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrinterUpdate {
    pub tenant_id: String,
    pub id: String,
    /// The name and transport the caller read: the change applies only while the printer
    /// still has them (a compare-and-set), so that the audit's "before" is what was
    /// really replaced, also when two edits race.
    pub expected_name: String,
    pub expected_transport: String,
    pub name: String,
    pub transport: String,
    pub now: Millis,
    pub audit: SetupAudit,
}

/// Disabling or enabling a printer. Setting the state it already has changes nothing and
/// writes no audit row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrinterEnabled {
    pub tenant_id: String,
    pub id: String,
    pub enabled: bool,
    pub now: Millis,
    pub audit: SetupAudit,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewStation {
    pub tenant_id: String,
    pub id: String,
    pub store_id: String,
    /// Primary first, then backups in order.
    pub printers: Vec<String>,
    /// See [`Station::failover_after_ms`].
    pub failover_after_ms: Option<i64>,
    pub now: Millis,
    pub audit: SetupAudit,
}

/// A new printer list for a station (tasks already created keep their printer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StationUpdate {
    pub tenant_id: String,
    pub id: String,
    /// The list the caller read (a compare-and-set, as for [`PrinterUpdate`]).
    pub expected_printers: Vec<String>,
    pub printers: Vec<String>,
    /// The station's threshold after the change (unchanged: the one it had).
    pub failover_after_ms: Option<i64>,
    pub now: Millis,
    pub audit: SetupAudit,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Station {
    pub tenant_id: String,
    pub id: String,
    pub store_id: String,
    pub printers: Vec<String>,
    /// How long the primary (or the printer a ticket is on) may be paused by no paper,
    /// cover open, paper jam or offline before the station's tickets move to the next
    /// printer; `None`: the broker's `station_failover_after_ms`.
    pub failover_after_ms: Option<i64>,
    pub created_at: Millis,
}

/// What a store credential kept in the agent-token table is for. Agent tokens
/// and LAN keys are one mechanism — created with a hash, listed, revoked, audited — and
/// differ only in who checks them: the broker checks agent tokens, the store agent checks
/// LAN keys on its LAN listener (from the hashes it caches). A LAN key authenticates
/// nothing at the broker: [`crate::Store::agent_by_token_hash`] finds agent tokens only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum TokenKind {
    #[default]
    Agent,
    Lan,
}

impl TokenKind {
    pub fn as_str(self) -> &'static str {
        match self {
            TokenKind::Agent => "agent",
            TokenKind::Lan => "lan",
        }
    }

    /// The set-up audit's object kind for a token of this kind.
    pub fn setup_object(self) -> SetupObject {
        match self {
            TokenKind::Agent => SetupObject::AgentToken,
            TokenKind::Lan => SetupObject::LanKey,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewAgentToken {
    /// Names the token in lists and revocation (unique per tenant, across both kinds).
    pub id: String,
    pub kind: TokenKind,
    /// SHA-256 (hex) of the token.
    pub token_hash: String,
    pub tenant_id: String,
    pub store_id: String,
    pub now: Millis,
    pub audit: SetupAudit,
}

/// A store agent token as the API lists it (never the token or its hash).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentToken {
    pub tenant_id: String,
    pub store_id: String,
    pub id: String,
    pub created_at: Millis,
    /// Set once; a revoked token authenticates nobody.
    pub revoked_at: Option<Millis>,
}

/// An active token's id and the hash it is stored with (for the store agent, which
/// checks LAN keys itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenHash {
    pub id: String,
    pub hash: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevokeAgentToken {
    pub tenant_id: String,
    pub store_id: String,
    pub id: String,
    /// Only a token of this kind is revoked (another kind's id is "no such token").
    pub kind: TokenKind,
    pub now: Millis,
    pub audit: SetupAudit,
}

/// Who an agent token speaks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentIdentity {
    pub tenant_id: String,
    pub store_id: String,
}

/// A task to create. The id is chosen by the caller so that a retry of the same batch
/// cannot create a second row under a new id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewTask {
    pub task_id: String,
    pub tenant_id: String,
    pub store_id: String,
    /// The printer the task goes to (for a station task: the station's current primary).
    pub printer_id: String,
    pub station_id: Option<String>,
    /// Key part from `Target::key_part` (`printer:p1`, `station:hot`).
    pub target: String,
    pub biz_no: String,
    pub print_type: String,
    pub priority: i32,
    pub content_type: String,
    pub content: Vec<u8>,
    pub fingerprint: String,
    /// Who submitted it, for the audit trail (`tenant:ID`).
    pub actor: String,
    /// Amount charged in the ledger, in the tenant's billing unit; 0 writes no charge
    /// (a transferred task's successor: the order was charged once already).
    pub charge: i64,
    pub now: Millis,
    /// Set when the task continues or reprints another task instead of being submitted.
    pub origin: Option<Origin>,
}

/// Why a task was created by the broker rather than submitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OriginKind {
    /// A numbered reprint of the origin task.
    Reprint,
    /// An operator moved the origin task to another printer.
    Transfer,
    /// The station's primary could not print; the origin task moved to a backup.
    Failover,
}

impl OriginKind {
    pub fn as_str(self) -> &'static str {
        match self {
            OriginKind::Reprint => "reprint",
            OriginKind::Transfer => "transfer",
            OriginKind::Failover => "failover",
        }
    }

    pub fn parse(s: &str) -> Option<OriginKind> {
        [OriginKind::Reprint, OriginKind::Transfer, OriginKind::Failover].into_iter().find(|k| k.as_str() == s)
    }
}

/// The task a broker-created task hangs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub task_id: String,
    pub kind: OriginKind,
    /// 1, 2, … for reprints.
    pub reprint_no: Option<i32>,
    /// The reason of the creation event (operator, why).
    pub reason: String,
}

/// An operator's action or a failover, applied in one transaction (see
/// [`crate::Store::apply_manual`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManualChange {
    /// The task acted on.
    pub task_id: String,
    /// Its compare-and-set state changes, applied one after the other; if any of them does
    /// not apply, nothing of the whole change is written (a failover is `sent → failed`
    /// and `failed → transferred` together with the successor, or none of it).
    pub transitions: Vec<Transition>,
    /// Refund the charge of this task (at most once, whatever happens). It is the task
    /// acted on, or the task of its chain that carries the order's charge (a transferred
    /// task's successor is not charged again; cancelling it refunds the original's charge).
    pub refund: Option<String>,
    /// A task created by the action (a reprint, or the transferred task's successor).
    pub successor: Option<NewTask>,
    pub now: Millis,
}

impl NewTask {
    /// The row this submission becomes when it is inserted: every backend answers
    /// `Created` with it instead of reading the row back. Consumes the submission, so
    /// that its strings move into the row (the SQLite writer thread, intake's bottleneck,
    /// would otherwise copy and free a dozen of them per task).
    pub fn into_created_task(self) -> Task {
        let NewTask {
            task_id,
            tenant_id,
            store_id,
            printer_id,
            station_id,
            target,
            biz_no,
            print_type,
            priority,
            content_type,
            content: _,
            fingerprint,
            actor: _,
            charge: _,
            now,
            origin,
        } = self;
        let (origin_task_id, origin_kind, reprint_no) = match origin {
            Some(o) => (Some(o.task_id), Some(o.kind), o.reprint_no),
            None => (None, None, None),
        };
        Task {
            task_id,
            tenant_id,
            store_id,
            printer_id,
            station_id,
            target,
            biz_no,
            print_type,
            priority,
            content_type,
            fingerprint,
            state: TaskState::Pending,
            attempts: 0,
            last_error: None,
            next_attempt_at: None,
            created_at: now,
            updated_at: now,
            printed_at: None,
            sent_to: None,
            sent_session: None,
            sent_at: None,
            may_have_printed: false,
            origin_task_id,
            origin_kind,
            reprint_no,
            successor_task_id: None,
            refusals: 0,
        }
    }

    /// [`NewTask::into_created_task`] of a copy, for a backend that still needs the
    /// submission afterwards.
    pub fn created_task(&self) -> Task {
        self.clone().into_created_task()
    }
}

/// What [`crate::Store::submit_batch`] did with one submission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubmitOutcome {
    /// A new task row, audit event and ledger charge were committed.
    Created(Task),
    /// A task with this key already existed; nothing was written.
    Existing(Task),
    /// A task with this key existed and was pruned by retention; only its tombstone is
    /// left, and nothing was written (no new task, no second charge).
    Pruned(Tombstone),
}

impl SubmitOutcome {
    /// The task the key stands for: the new or existing row, or what the tombstone keeps of
    /// a pruned one.
    pub fn task(&self) -> &Task {
        match self {
            SubmitOutcome::Created(t) | SubmitOutcome::Existing(t) => t,
            SubmitOutcome::Pruned(b) => &b.task,
        }
    }

    /// The answer to a repeat of the same key later in the same batch: whatever the first
    /// occurrence became, as found (a task created by the first is `Existing` for the rest).
    pub fn repeat(&self) -> SubmitOutcome {
        match self {
            SubmitOutcome::Created(t) | SubmitOutcome::Existing(t) => SubmitOutcome::Existing(t.clone()),
            SubmitOutcome::Pruned(b) => SubmitOutcome::Pruned(b.clone()),
        }
    }
}

/// What is left of a finished task after retention pruned it: the task row as it
/// ended, without its content and its audit trail, kept so that a late replay of the same
/// submission is still answered with the task and its final state (never a new task or a
/// second charge), and so that the task still counts in its day's reconciliation. Its
/// ledger entries are never pruned.
///
/// The delivery bookkeeping of a task that has ended is not kept: in `task`,
/// `next_attempt_at`, `sent_to`, `sent_session` and `sent_at` are always `None`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tombstone {
    pub task: Task,
    /// The business day the task was created on, `YYYY-MM-DD` in its store's time zone
    /// at the time of pruning (the day whose reconciliation it belongs to).
    pub business_day: String,
    /// When the task was pruned.
    pub pruned_at: Millis,
}

/// One task retention wants to prune, with what it found when it read the task: the
/// prune is a compare-and-set on them, so a task that changed since is left alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PruneTask {
    pub task_id: String,
    /// The end state the task was read in.
    pub state: TaskState,
    /// Its `updated_at` as read.
    pub updated_at: Millis,
    /// See [`Tombstone::business_day`].
    pub business_day: String,
}

/// What one [`crate::Store::prune_tasks`] call removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pruned {
    /// The tasks pruned (now tombstones), in no set order.
    pub task_ids: Vec<String>,
    /// Audit events deleted with them.
    pub events: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    pub task_id: String,
    pub tenant_id: String,
    pub store_id: String,
    pub printer_id: String,
    pub station_id: Option<String>,
    pub target: String,
    pub biz_no: String,
    pub print_type: String,
    pub priority: i32,
    pub content_type: String,
    pub fingerprint: String,
    pub state: TaskState,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub next_attempt_at: Option<Millis>,
    pub created_at: Millis,
    pub updated_at: Millis,
    pub printed_at: Option<Millis>,
    /// The agent the current (or last) delivery was handed to.
    pub sent_to: Option<String>,
    /// The agent process (session) it was handed to: a restarted agent has a new one.
    pub sent_session: Option<String>,
    /// When the task last went into `sent` from a waiting state; offering it again to a
    /// claimant does not move it, so `now - sent_at` is how long the lane has been busy
    /// with this task (its in-flight age, which the lane watchdog reads).
    pub sent_at: Option<Millis>,
    /// Some attempt of this task may have put paper out without proof either way (it ended
    /// in doubt, or with an error after sending). Such a task is never moved to another
    /// printer automatically.
    pub may_have_printed: bool,
    /// Offers its printer refused with a status that pauses the lane (no paper, cover
    /// open, paper jam, offline): `attempts - refusals` deliveries reached the printer,
    /// and only those count against the print type's `max_attempts`.
    pub refusals: i32,
    /// The task this one reprints or continues (see [`OriginKind`]).
    pub origin_task_id: Option<String>,
    pub origin_kind: Option<OriginKind>,
    pub reprint_no: Option<i32>,
    /// For a transferred task: the task that carries on its work.
    pub successor_task_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskContent {
    pub content_type: String,
    pub content: Vec<u8>,
}

/// The answer of [`crate::Store::read_for_acks`].
#[derive(Debug, Clone, Default)]
pub struct AckRead {
    /// The tenant's tasks among the acked ids, in no set order.
    pub tasks: Vec<Task>,
    /// The lane heads of the printers of those tasks that are `sent` (when asked for).
    pub heads: Vec<Task>,
    /// The content of each head (task id → content).
    pub contents: Vec<(String, TaskContent)>,
}

impl AckRead {
    /// The printers, sorted and each once, of the tasks that are in flight: the lanes an
    /// ack of those tasks may free.
    pub fn printers_in_flight(tasks: &[Task]) -> Vec<String> {
        let mut printers: Vec<String> =
            tasks.iter().filter(|t| t.state == TaskState::Sent).map(|t| t.printer_id.clone()).collect();
        printers.sort();
        printers.dedup();
        printers
    }
}

#[derive(Debug, Clone, Default)]
pub struct TaskQuery {
    pub tenant_id: String,
    pub store_id: Option<String>,
    pub state: Option<TaskState>,
    pub biz_no: Option<String>,
    /// Only tasks whose business number starts with this (`A1003` finds `A1003` and
    /// `A1003#kitchen`), compared character by character, case and all. Both backends
    /// read it as a range of their `(tenant, business number)` index, so it costs what
    /// the matching tasks cost, not what the tenant's tasks cost.
    pub biz_no_prefix: Option<String>,
    /// Only tasks of this printer (read through the `(tenant, printer, id)` index).
    pub printer_id: Option<String>,
    /// Only tasks of this print type.
    pub print_type: Option<String>,
    /// Only tasks whose id is at least this one. Task ids sort by creation time, so with
    /// [`TaskQuery::id_to`] this is "created in a time range".
    pub id_from: Option<String>,
    /// Only tasks whose id is below this one.
    pub id_to: Option<String>,
    pub limit: i64,
    /// The next page: only tasks whose id is below this one (the last of a page).
    pub cursor: Option<String>,
    /// The previous page: only the `limit` tasks just above this id (the first of a page),
    /// still answered newest first. Both cursors are keysets on the id, so a page costs
    /// what its tasks cost however deep it is.
    pub after: Option<String>,
}

/// The smallest string above every string that starts with `prefix`, in the order of
/// code points (the order of UTF-8 bytes, which SQLite's `BINARY` and PostgreSQL's `"C"`
/// collations use): `prefix` with its last character replaced by the next one. `None`
/// when there is no such string (an empty prefix, or one made only of `char::MAX`), and
/// then the range has no upper end.
pub fn prefix_upper_bound(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        // The next code point that is a `char` (the surrogates are skipped).
        let next = (last as u32 + 1..=char::MAX as u32).find_map(char::from_u32);
        if let Some(next) = next {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

/// One line of the audit trail. `from` is `None` for the creation event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskEvent {
    pub at: Millis,
    pub from: Option<TaskState>,
    pub to: TaskState,
    pub attempt: i32,
    pub actor: String,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerEntry {
    pub task_id: String,
    pub tenant_id: String,
    /// `charge` or `refund`; each at most once per task (unique constraint).
    pub kind: String,
    pub amount: i64,
    pub at: Millis,
}

/// A compare-and-set state change (see [`crate::Store::transition`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    pub task_id: String,
    pub from: TaskState,
    pub expected_attempts: i32,
    pub to: TaskState,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub next_attempt_at: Option<Millis>,
    pub actor: String,
    pub reason: String,
    pub now: Millis,
    /// For a transition to `sent`: the claimant and session it is handed to.
    pub sent_to: Option<String>,
    pub sent_session: Option<String>,
    /// Marks the task as possibly printed ([`Task::may_have_printed`]); the mark is never
    /// removed, so `false` leaves the task as it was.
    pub may_have_printed: bool,
    /// The offer was refused by the printer's status ([`Task::refusals`] grows by one).
    pub refused: bool,
    /// An alert to write to the outbox in the same transaction, if the change applies.
    pub event: Option<OutboxEvent>,
}

/// An alert for the tenant's webhook endpoints, written in the same transaction as
/// the change it reports and delivered later from the outbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxEvent {
    /// Unique; receivers deduplicate on it.
    pub event_id: String,
    pub tenant_id: String,
    /// `task.failed`, `task.in_doubt`, `task.printed`, `printer.offline`, `printer.online`.
    pub kind: String,
    /// The JSON body sent to the endpoints.
    pub payload: String,
    pub now: Millis,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewWebhook {
    pub tenant_id: String,
    pub id: String,
    pub url: String,
    /// The signing secret (onceprint's signature, or a group bot's signing key; empty: a
    /// bot without signing).
    pub secret: String,
    /// How events are written for the endpoint: `onceprint` (the signed event as JSON) or
    /// a group bot's message (`wecom`, `dingtalk`, `feishu`, `slack`).
    pub format: String,
    /// Event kinds the endpoint receives.
    pub events: Vec<String>,
    pub now: Millis,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Webhook {
    pub tenant_id: String,
    pub id: String,
    pub url: String,
    /// See [`NewWebhook::format`].
    pub format: String,
    pub events: Vec<String>,
    pub created_at: Millis,
}

/// One event's delivery to one endpoint, as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookDelivery {
    pub event_id: String,
    pub webhook_id: String,
    pub kind: String,
    pub attempts: i32,
    pub next_attempt_at: Option<Millis>,
    pub last_status: Option<i32>,
    pub last_error: Option<String>,
    pub delivered_at: Option<Millis>,
    pub created_at: Millis,
}

/// A delivery that is due, with what it takes to send it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueWebhook {
    pub event_id: String,
    pub webhook_id: String,
    pub tenant_id: String,
    pub url: String,
    pub secret: String,
    /// See [`NewWebhook::format`].
    pub format: String,
    pub payload: String,
    pub attempts: i32,
}

/// The result of one delivery attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookAttempt {
    pub event_id: String,
    pub webhook_id: String,
    pub delivered: bool,
    pub status: Option<i32>,
    pub error: Option<String>,
    /// When to try again; `None` with `delivered == false` means "give up".
    pub next_attempt_at: Option<Millis>,
    pub now: Millis,
}

/// A printer's health as last reported by its agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrinterStatusUpdate {
    pub tenant_id: String,
    pub printer_id: String,
    pub online: bool,
    pub last_error: Option<String>,
    pub now: Millis,
    /// Id for the `printer.online` / `printer.offline` alert written if `online` flips.
    pub event_id: String,
}

/// A printer seen alive at `at`, with nothing else to report: a poll that changes neither
/// `online` nor `last_error` ([`crate::Store::touch_printers_seen`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrinterSeen {
    pub tenant_id: String,
    pub printer_id: String,
    pub at: Millis,
}

/// Which printers of a polled transport may have gone silent
/// ([`crate::Store::silent_printers`]): those the broker holds online (or that never
/// called and were not judged yet) whose last sign of life, `last_seen_at` or else
/// `created_at`, is older than `now` − 2 × their poll interval − `grace_ms`. The interval
/// is the transport's `poll_interval_s` in seconds, or `default_interval_ms` where it
/// names none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SilenceQuery {
    pub kind: String,
    pub now: Millis,
    pub default_interval_ms: i64,
    pub grace_ms: i64,
}

impl SilenceQuery {
    /// The time before which a printer's last sign of life must lie for it to be silent
    /// whatever its interval: poll intervals are whole seconds, at least one (a default
    /// below that counts as it is).
    pub fn earliest_threshold(&self) -> Millis {
        self.now - 2 * self.default_interval_ms.min(1000) - self.grace_ms
    }
}

/// Printer states (`last_error`) in which the printer's lane waits for the printer: it
/// cannot print anything until a person or the network fixes it.
pub const PAUSING_ERRORS: [&str; 4] = ["no_paper", "cover_open", "paper_jam", "offline"];

/// Whether a printer in this state holds its lane (see [`PAUSING_ERRORS`]).
pub fn pauses_lane(last_error: Option<&str>) -> bool {
    last_error.is_some_and(|e| PAUSING_ERRORS.contains(&e))
}

impl PrinterStatusUpdate {
    /// The `printer.paused` (this report holds the lane) or `printer.resumed` alert this
    /// report raises if the printer's pausing flips with it: id, kind and body, the same
    /// bytes for every backend. The backend decides whether it flips (it reads the row).
    pub fn pause_event(&self) -> (String, &'static str, String) {
        let paused = pauses_lane(self.last_error.as_deref());
        let kind = if paused { "printer.paused" } else { "printer.resumed" };
        let id = format!("{}.pause", self.event_id);
        let body = serde_json::json!({
            "id": id, "type": kind, "created_at_ms": self.now, "tenant_id": self.tenant_id,
            "data": {
                "printer_id": self.printer_id,
                "online": self.online,
                "reason": if paused { self.last_error.as_deref() } else { None },
                "last_error": self.last_error,
            },
        });
        (id, kind, body.to_string())
    }
}

/// A task waiting for a printer whose lane is paused ([`crate::Store::waiting_on_paused_printers`]).
#[derive(Debug, Clone, PartialEq)]
pub struct PausedWait {
    pub task: Task,
    /// Since when the printer's lane is paused.
    pub paused_since: Millis,
    /// Why: the printer's `last_error` (`offline`, `no_paper`, …).
    pub printer_state: Option<String>,
}

/// A printer's lane as the lane engine looks at it: the task in flight (at most one, the
/// database enforces it), whatever its priority, or, when nothing is in flight, the first
/// waiting task by (priority, seq): `seq` is the order the database inserted the tasks in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lane {
    pub printer_id: String,
    /// The task in `sent`, if any.
    pub in_flight: Option<Task>,
    /// The first `pending` or `retrying` task by (priority, seq), when nothing is in flight.
    pub waiting: Option<Task>,
}

/// The figures of one printer's lane, for the watchdog and `/metrics`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneStats {
    pub tenant_id: String,
    pub store_id: String,
    pub printer_id: String,
    /// Tasks waiting (`pending`, `retrying`).
    pub waiting: i64,
    /// Creation time of the oldest waiting task.
    pub oldest_waiting_at: Option<Millis>,
    /// [`Task::sent_at`] of the task in flight.
    pub in_flight_since: Option<Millis>,
}

/// Who made a set-up change and what it changed. Every set-up write carries one;
/// the store writes it as a row of the set-up audit in the same transaction as the
/// change, with the object and the action that the change itself is, so that the audit
/// cannot name another object than the one changed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SetupAudit {
    /// `admin` or `api_key:ID`.
    pub actor: String,
    /// What changed, as the caller describes it. Never a secret: for a printer, its
    /// transport as the API shows it (secrets as `"***"`).
    pub detail: serde_json::Value,
}

/// The kinds of objects the set-up audit names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetupObject {
    Tenant,
    Store,
    Printer,
    Station,
    AgentToken,
    ApiKey,
    /// A person's console login.
    Operator,
    /// A store-local submission key, checked by the store agent.
    LanKey,
}

impl SetupObject {
    pub fn as_str(self) -> &'static str {
        match self {
            SetupObject::Tenant => "tenant",
            SetupObject::Store => "store",
            SetupObject::Printer => "printer",
            SetupObject::Station => "station",
            SetupObject::AgentToken => "agent_token",
            SetupObject::ApiKey => "api_key",
            SetupObject::Operator => "operator",
            SetupObject::LanKey => "lan_key",
        }
    }
}

/// What a set-up change did to its object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetupAction {
    Create,
    Update,
    Disable,
    Enable,
    Revoke,
    /// A printer's login was replaced.
    Rotate,
}

impl SetupAction {
    pub fn as_str(self) -> &'static str {
        match self {
            SetupAction::Create => "create",
            SetupAction::Update => "update",
            SetupAction::Disable => "disable",
            SetupAction::Enable => "enable",
            SetupAction::Revoke => "revoke",
            SetupAction::Rotate => "rotate",
        }
    }
}

/// One row of the set-up audit, as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetupEvent {
    /// Increases with every row of the database; pages go by it (newest first).
    pub id: i64,
    pub tenant_id: String,
    pub at: Millis,
    pub actor: String,
    /// A [`SetupObject`] spelling.
    pub object_kind: String,
    pub object_id: String,
    /// A [`SetupAction`] spelling.
    pub action: String,
    pub detail: serde_json::Value,
}

/// What an operator may see and do: `staff` only in the stores they are bound
/// to, `manager` in every store of the tenant, and managers also create operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OperatorRole {
    Staff,
    Manager,
}

impl OperatorRole {
    pub fn as_str(self) -> &'static str {
        match self {
            OperatorRole::Staff => "staff",
            OperatorRole::Manager => "manager",
        }
    }

    pub fn parse(s: &str) -> Option<OperatorRole> {
        match s {
            "staff" => Some(OperatorRole::Staff),
            "manager" => Some(OperatorRole::Manager),
            _ => None,
        }
    }
}

/// A person who logs in to the console or takes manual actions with an operator token.
/// Ids are per tenant, like every other id; the password is kept only as its argon2id
/// hash (a PHC string), never returned by the row type that the API shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operator {
    pub tenant_id: String,
    pub id: String,
    pub name: String,
    pub role: OperatorRole,
    /// The stores a `staff` operator works in (empty for a manager, who has them all).
    pub store_ids: Vec<String>,
    pub created_at: Millis,
    /// When a manager (or the tenant's API key) disabled this login; `None` while it may
    /// log in. A disabled operator's sessions end with the change.
    pub disabled_at: Option<Millis>,
}

impl Operator {
    /// Whether this operator may see and act on `store_id`'s printers and tickets.
    pub fn may_see_store(&self, store_id: &str) -> bool {
        self.role == OperatorRole::Manager || self.store_ids.iter().any(|s| s == store_id)
    }
}

#[derive(Debug, Clone)]
pub struct NewOperator {
    pub tenant_id: String,
    pub id: String,
    pub name: String,
    pub role: OperatorRole,
    /// Each must be a store of the tenant (else `NotFound("store …")`, nothing written).
    pub store_ids: Vec<String>,
    /// The argon2id PHC string of the password.
    pub password_hash: String,
    pub now: Millis,
    pub audit: SetupAudit,
}

/// Where an operator session came from: a console login (cookie, with a CSRF token) or
/// an operator token for the API (`Authorization: Bearer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionKind {
    Console,
    Token,
}

impl SessionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SessionKind::Console => "console",
            SessionKind::Token => "token",
        }
    }

    pub fn parse(s: &str) -> Option<SessionKind> {
        match s {
            "console" => Some(SessionKind::Console),
            "token" => Some(SessionKind::Token),
            _ => None,
        }
    }
}

/// A new login session. The secret the client holds is never stored: only its SHA-256.
#[derive(Debug, Clone)]
pub struct NewOperatorSession {
    pub id: String,
    pub token_hash: String,
    pub tenant_id: String,
    pub operator_id: String,
    pub kind: SessionKind,
    /// Sent back with every console form; a request without it changes nothing.
    pub csrf_token: String,
    pub created_at: Millis,
    pub expires_at: Millis,
}

/// An active (not revoked) session with its operator. Expiry is the caller's to check
/// against its clock, so that the store never reads a clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorSession {
    pub id: String,
    pub kind: SessionKind,
    pub csrf_token: String,
    pub created_at: Millis,
    pub expires_at: Millis,
    pub operator: Operator,
}

/// A change to an operator's account, audited as a set-up change.
#[derive(Debug, Clone)]
pub struct ChangeOperator {
    pub tenant_id: String,
    pub operator_id: String,
    pub change: OperatorChange,
    pub now: Millis,
    pub audit: SetupAudit,
}

/// What [`ChangeOperator`] changes about an account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OperatorChange {
    /// The login stops working and every session ends (audited `disable`). Disabling a
    /// disabled operator keeps the first time.
    Disable,
    /// The login works again (audited `enable`); sessions ended by the disable stay ended.
    Enable,
    /// A new password (its argon2id PHC string); every session ends, so a password that
    /// leaked stops working everywhere at once (audited `update`).
    Password { password_hash: String },
    /// Nothing in the database: the login throttle lives in each broker process. The
    /// audit row (`update`) records who lifted it.
    Unlock,
}

/// Revocation of every session of an operator (audited as a set-up change).
#[derive(Debug, Clone)]
pub struct RevokeOperatorSessions {
    pub tenant_id: String,
    pub operator_id: String,
    pub now: Millis,
    pub audit: SetupAudit,
}

/// A lease as it stands (`Store::lease_row`): who holds it, its fencing token, and until
/// when (it may have expired).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRow {
    pub name: String,
    pub holder: String,
    pub token: i64,
    pub expires_at: Millis,
}

/// One agent session as a broker node heard it, written to `agent_sessions` by
/// every node of a cluster and merged by the others, so that a node knows the agents that
/// poll the other nodes. Times are milliseconds of the writing node's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentSessionRow {
    pub tenant_id: String,
    pub store_id: String,
    pub agent_id: String,
    /// The session id (empty for an agent that sends none).
    pub session: String,
    /// When the session started (the time its id carries, else when it was first seen).
    pub started_at: Millis,
    /// When a node last heard the session (a poll or an ack).
    pub heard_at: Millis,
    /// Whether a poll of the session was open at a node when it wrote `heard_at`.
    pub open_poll: bool,
    /// The node that wrote the row last.
    pub node_id: String,
}

/// A task the store agent accepted on the shop's LAN while the broker was unreachable,
/// as the engine prepared it for [`crate::Store::merge_offline`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OfflineTask {
    /// The task as it is inserted when its key is unknown (merge rule 1), under its LAN
    /// task id or, when the agent's clock was far off, under an id the broker minted from
    /// the corrected acceptance time: `now` is the acceptance time (its creation time and
    /// the time of its charge, so its business day is the day the shop took the order),
    /// `actor` names the LAN path, `printer_id` the printer the agent printed on.
    pub task: NewTask,
    /// The id the agent minted and answered the POS with. When it differs from
    /// `task.task_id` it is kept as an alias of kind `renamed`, so that it still names
    /// the task; a task found under the key keeps it as a `merged` or `conflict` alias.
    pub lan_id: String,
    /// The creation event's reason.
    pub reason: String,
    /// The row as it is inserted: the state the agent's outcome gives, and its figures.
    pub state: TaskState,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub updated_at: Millis,
    pub printed_at: Option<Millis>,
    pub may_have_printed: bool,
    /// The audit events after the creation event (the agent's journal), oldest first.
    pub history: Vec<TaskEvent>,
    /// When the broker took the report (the alias's creation time).
    pub now: Millis,
}

/// What the engine decided for a task found under the key of an [`OfflineTask`]: how the
/// LAN id is kept beside it, and the change or the record in its audit trail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergeStep {
    pub kind: onceprint_core::offline::AliasKind,
    /// A compare-and-set from the task as it was read (the store reads it in the merge's
    /// transaction and applies this in the same one).
    pub transition: Option<Transition>,
    /// An audit event that changes nothing (`from` = `to` = the task's state).
    pub note: Option<TaskEvent>,
}

/// Decides a [`MergeStep`] for the task found under the key (or the task a tombstone
/// keeps; then only the kind is used). Called inside the merge's transaction, so it must
/// not block.
pub type MergePlanner = std::sync::Arc<dyn Fn(&Task) -> MergeStep + Send + Sync>;

/// What [`crate::Store::merge_offline`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OfflineMerge {
    /// The key was unknown: the task was created under the LAN task id (or, with `again`,
    /// it had been by an earlier upload of the same report, and nothing was written).
    /// `pruned`: only its tombstone is left.
    Created { task: Task, again: bool, pruned: bool },
    /// The key was known: the LAN id is an alias of `task` (as it is after the change;
    /// a tombstone's task when `pruned`). `changed`: the merge moved its state. With
    /// `again`, an earlier upload made the alias and nothing was written.
    Aliased { kind: onceprint_core::offline::AliasKind, task: Task, pruned: bool, changed: bool, again: bool },
    /// The LAN task id names another task (of another key or another tenant): nothing
    /// was written.
    IdTaken,
}

/// A LAN task id kept as another name of a task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskAlias {
    pub alias_id: String,
    pub tenant_id: String,
    pub task_id: String,
    pub kind: onceprint_core::offline::AliasKind,
    pub created_at: Millis,
}

/// What a store agent's journal says happened to a task in the end (the device
/// log digest), as the agent reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceLogState {
    /// The last record for the task was a blocker (no paper, cover open, paper jam,
    /// offline) or an error.
    Failed,
    /// The agent cannot know whether the printer printed it.
    InDoubt,
    /// The printer confirmed it.
    Printed,
}

impl DeviceLogState {
    pub const ALL: [DeviceLogState; 3] = [DeviceLogState::Printed, DeviceLogState::InDoubt, DeviceLogState::Failed];

    pub fn as_str(self) -> &'static str {
        match self {
            DeviceLogState::Printed => "printed",
            DeviceLogState::InDoubt => "in_doubt",
            DeviceLogState::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<DeviceLogState> {
        DeviceLogState::ALL.into_iter().find(|v| v.as_str() == s)
    }
}

/// One task's latest record in a store agent's journal, kept per (tenant, store,
/// task id): what the device side says of the task, for reconciliation against the
/// broker's own state. It changes no task; it is only compared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceLogRecord {
    pub tenant_id: String,
    pub store_id: String,
    /// The task id the agent printed under (a broker task id, or the id the agent minted
    /// for a task accepted on the shop's LAN).
    pub task_id: String,
    /// The idempotency key the job carried to the printer.
    pub key: String,
    pub printer_id: String,
    pub state: DeviceLogState,
    /// When the agent journaled the record, by the agent's clock.
    pub at: Millis,
    /// The agent that reported it last.
    pub agent_id: String,
    /// When the broker stored it, by the broker's clock.
    pub received_at: Millis,
}

impl DeviceLogRecord {
    /// Whether `self` is a later word on its task than `other`: the stronger state wins
    /// (printed over in doubt over failed), and within one state the later `at`. A task's
    /// records on a device only ever climb that order — a printer's confirmation is the
    /// truth, and a ticket that may have printed is never printed again — so the state
    /// decides, not the agent's clock, which a shop PC may have had wrong for some of the
    /// records (set back, or different after a restart). Two records where neither is
    /// later are the same word, and the one stored first stays. Backends apply the same
    /// order in their upsert, so the stored record does not depend on the order uploads
    /// arrive in.
    pub fn supersedes(&self, other: &DeviceLogRecord) -> bool {
        (self.state, self.at) > (other.state, other.at)
    }

    /// The records of `records` that can be stored together: for each (tenant, store, task
    /// id), the one that [supersedes](DeviceLogRecord::supersedes) the others (the first of
    /// equals), in the order the tasks first appear. A backend's single upsert statement
    /// must not name one row twice.
    pub fn latest_per_task(records: &[DeviceLogRecord]) -> Vec<DeviceLogRecord> {
        let mut at: std::collections::HashMap<(&str, &str, &str), usize> = std::collections::HashMap::new();
        let mut out: Vec<DeviceLogRecord> = Vec::with_capacity(records.len());
        for r in records {
            match at.entry((&r.tenant_id, &r.store_id, &r.task_id)) {
                std::collections::hash_map::Entry::Occupied(e) => {
                    let kept = &mut out[*e.get()];
                    if r.supersedes(kept) {
                        *kept = r.clone();
                    }
                }
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(out.len());
                    out.push(r.clone());
                }
            }
        }
        out
    }
}
