//! Rows that cross the [`crate::Store`] boundary. Times are milliseconds since the epoch;
//! the HTTP layer turns them into RFC 3339.

use onceprint_core::{Millis, TaskState};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewTenant {
    pub id: String,
    pub name: String,
    /// SHA-256 (hex) of the API key; the key itself is never stored.
    pub api_key_hash: String,
    pub now: Millis,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tenant {
    pub id: String,
    pub name: String,
    pub created_at: Millis,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewStore {
    pub tenant_id: String,
    pub id: String,
    pub name: String,
    pub now: Millis,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreRow {
    pub tenant_id: String,
    pub id: String,
    pub name: String,
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
    pub now: Millis,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Printer {
    pub tenant_id: String,
    pub id: String,
    pub store_id: String,
    pub name: String,
    pub transport: String,
    pub online: bool,
    pub last_seen_at: Option<Millis>,
    pub last_error: Option<String>,
    pub created_at: Millis,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewStation {
    pub tenant_id: String,
    pub id: String,
    pub store_id: String,
    /// Primary first, then backups in order.
    pub printers: Vec<String>,
    pub now: Millis,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Station {
    pub tenant_id: String,
    pub id: String,
    pub store_id: String,
    pub printers: Vec<String>,
    pub created_at: Millis,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewAgentToken {
    /// SHA-256 (hex) of the token.
    pub token_hash: String,
    pub tenant_id: String,
    pub store_id: String,
    pub now: Millis,
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
    /// Amount charged in the ledger (R6), in the tenant's billing unit.
    pub charge: i64,
    pub now: Millis,
}

/// What [`crate::Store::submit_batch`] did with one submission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubmitOutcome {
    /// A new task row, audit event and ledger charge were committed.
    Created(Task),
    /// A task with this key already existed; nothing was written.
    Existing(Task),
}

impl SubmitOutcome {
    pub fn task(&self) -> &Task {
        match self {
            SubmitOutcome::Created(t) | SubmitOutcome::Existing(t) => t,
        }
    }
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
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskContent {
    pub content_type: String,
    pub content: Vec<u8>,
}

#[derive(Debug, Clone, Default)]
pub struct TaskQuery {
    pub tenant_id: String,
    pub store_id: Option<String>,
    pub state: Option<TaskState>,
    pub biz_no: Option<String>,
    pub limit: i64,
    pub cursor: Option<String>,
}

/// One line of the audit trail (R8). `from` is `None` for the creation event.
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
    /// For a transition to `sent`: the agent and session it is handed to.
    pub sent_to: Option<String>,
    pub sent_session: Option<String>,
}

/// A printer's health as last reported by its agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrinterStatusUpdate {
    pub tenant_id: String,
    pub printer_id: String,
    pub online: bool,
    pub last_error: Option<String>,
    pub now: Millis,
}
