//! The JSON shapes of offline operation: LAN keys, the store directory an agent takes
//! orders with while the broker is unreachable, the store's LAN listener, and the sync of
//! those orders.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{integral, opt_time, rfc3339};
use onceprint_store::AgentToken;

/// Optional body of `POST /v1/stores/{id}/lan-keys`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateLanKey {
    /// Names the key (1–64 characters of `A-Za-z0-9._:-`, unique in the tenant among its
    /// agent tokens and LAN keys); generated (`lan_…`) when left out.
    pub id: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct LanKeyOut {
    pub id: String,
    pub store_id: String,
    /// The LAN key (`opl_…`), for the shop's POS to send to the store agent as
    /// `Authorization: Bearer`. Shown only in this answer; only its hash is stored.
    pub key: String,
    pub created_at: String,
}

/// A LAN key as listed (never the key or its hash).
#[derive(Debug, Serialize, ToSchema)]
pub struct LanKeyInfo {
    pub id: String,
    pub store_id: String,
    pub created_at: String,
    /// Set once revoked; the store agent refuses a revoked key once it fetched the store's
    /// keys again.
    pub revoked_at: Option<String>,
}

impl From<AgentToken> for LanKeyInfo {
    fn from(t: AgentToken) -> Self {
        LanKeyInfo {
            id: t.id,
            store_id: t.store_id,
            created_at: rfc3339(t.created_at),
            revoked_at: opt_time(t.revoked_at),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct LanKeyList {
    pub keys: Vec<LanKeyInfo>,
}

/// An active LAN key as the store agent checks it.
#[derive(Debug, Serialize, ToSchema)]
pub struct LanKeyHashOut {
    pub id: String,
    /// SHA-256 (lower-case hex) of the whole key string, `opl_` included.
    pub sha256: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct LanKeyHashes {
    /// The active keys of the agent's store.
    pub keys: Vec<LanKeyHashOut>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DirectoryPrinterOut {
    pub printer_id: String,
    /// What a delivery's `printer_address` would be; empty for a printer the agent does
    /// not drive.
    pub printer_address: String,
    pub enabled: bool,
    /// Driven by the store agent (transport `agent`): the agent can print to it itself.
    pub agent: bool,
    /// The render profile configured for the printer; `null`: the default profile.
    pub profile: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DirectoryStationOut {
    pub station_id: String,
    /// Primary first, then backups.
    pub printers: Vec<String>,
}

/// The agent's store as it needs it to take orders offline.
#[derive(Debug, Serialize, ToSchema)]
pub struct AgentDirectory {
    pub store_id: String,
    pub printers: Vec<DirectoryPrinterOut>,
    pub stations: Vec<DirectoryStationOut>,
    /// The configured print types, highest priority first.
    pub print_types: Vec<String>,
    pub default_print_type: String,
    /// The broker's request body limit (`max_body_bytes`): the agent's LAN listener takes
    /// what the broker would, and answers a larger body 413 `payload_too_large` as it does.
    pub max_body_bytes: usize,
    /// The broker's content limit after decoding (`max_content_bytes`), which the LAN
    /// listener applies to a task it accepts offline.
    pub max_content_bytes: usize,
}

/// Body of `POST /v1/agent/lan-listener`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LanListenerClaim {
    /// The agent that takes the store's LAN orders (its `agent_id`).
    pub agent_id: String,
}

/// The store agent that takes a store's LAN orders.
#[derive(Debug, Serialize, ToSchema)]
pub struct LanListenerOut {
    pub store_id: String,
    /// The agent id holding the store's LAN listener; null while no agent holds it.
    #[schema(required = true)]
    pub agent_id: Option<String>,
}

/// One record of the agent's journal for an offline task.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JournalRecordIn {
    /// Milliseconds since the epoch.
    #[serde(deserialize_with = "integral::required")]
    pub at: i64,
    #[serde(default, deserialize_with = "integral::optional")]
    pub attempt: Option<i32>,
    /// `started`, `printed`, `in_doubt`, `no_paper`, `cover_open`, `offline`, `paper_jam`
    /// or `error` (another value rejects the task).
    pub state: String,
    pub detail: Option<String>,
}

/// A task the store agent accepted on the shop's LAN while the broker was unreachable.
/// `biz_no`, `printer_id`, `station_id`, `print_type` and `content` are the fields of the
/// LAN submission, as for `POST /v1/print-tasks`; the broker canonicalizes and
/// fingerprints the content itself.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OfflineTaskIn {
    /// The id the agent minted from `accepted_at` (`TaskId::from_parts(accepted_at, random)`,
    /// 26 characters of Crockford base32 whose time part is `accepted_at`).
    pub task_id: String,
    pub biz_no: Option<String>,
    pub printer_id: Option<String>,
    pub station_id: Option<String>,
    pub print_type: Option<String>,
    #[schema(value_type = Object)]
    pub content: Option<onceprint_core::Content>,
    /// When the agent accepted it (milliseconds since the epoch): the task's creation time,
    /// its business day and the time of its charge.
    #[serde(deserialize_with = "integral::required")]
    pub accepted_at: i64,
    /// The LAN key the submission came with.
    pub lan_key_id: String,
    /// The printer the agent chose (for a station, the first enabled printer it drives).
    /// The task stays there when it is the task's printer or one of its station's, or
    /// when the agent tried it there even though the station changed since; `null`, or a
    /// printer no longer the task's for a task not tried: the broker chooses as for a
    /// LAN submission.
    pub printed_on: Option<String>,
    /// `printed`, `in_doubt`, `failed` or `pending` (accepted, not printed yet: the broker
    /// takes it over and delivers it). Another value rejects the task.
    pub outcome: String,
    /// Attempts the agent made (default 0).
    #[serde(default, deserialize_with = "integral::optional")]
    pub attempts: Option<i32>,
    pub detail: Option<String>,
    /// The agent journal's records for it, oldest first.
    #[serde(default)]
    pub history: Vec<JournalRecordIn>,
    /// How long before this upload the agent accepted the task, in milliseconds, by a
    /// clock that no setting of the wall clock moves (the machine's time since boot), when
    /// the agent knows it (agent protocol 4): the broker then places the acceptance on its
    /// own clock exactly. Optional.
    #[serde(default, deserialize_with = "integral::optional")]
    pub age_ms: Option<i64>,
}

/// Tasks the store agent accepted on the shop's LAN while the broker was unreachable.
// The handler reads the upload as `OfflineTasksWire`, one task at a time; this type
// gives the published document its shape.
#[allow(dead_code)]
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OfflineTasksIn {
    pub agent_id: String,
    /// The agent process's session, as in its polls (optional).
    pub session: Option<String>,
    /// The agent's clock when it sent this upload (milliseconds since the epoch). When it
    /// is off the broker's by more than 5 minutes, the tasks' times are moved onto the
    /// broker's clock (and a task gets an id of the corrected time, its LAN id naming
    /// it); a smaller difference is noted in the audit trail. Optional.
    #[serde(default, deserialize_with = "integral::optional")]
    pub sent_at: Option<i64>,
    /// At most 500. A task that cannot be read (a field of the wrong type, content that
    /// does not parse) is answered `rejected` on its own, if it has a string `task_id`.
    pub tasks: Vec<OfflineTaskIn>,
}

/// [`OfflineTasksIn`] as read: each task parsed on its own, so that one the broker
/// cannot read is rejected alone instead of failing the upload.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OfflineTasksWire {
    pub agent_id: String,
    pub session: Option<String>,
    #[serde(default, deserialize_with = "integral::optional")]
    pub sent_at: Option<i64>,
    pub tasks: Vec<serde_json::Value>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct OfflineResultOut {
    /// The LAN task id, as sent.
    pub task_id: String,
    /// `created` (the broker did not know the key: the task is kept under the LAN id),
    /// `merged` (the broker had the order: the LAN id is an alias of its task),
    /// `conflict` (the broker had other content under the key: the LAN id is an alias of
    /// that task, now held for a person) or `rejected` (never taken; stop sending it,
    /// keep it for a person: an `offline_task.rejected` alert went out).
    pub result: String,
    /// The broker's task the LAN id stands for (when created, the LAN id itself, or an id
    /// of the corrected time when the agent's clock was far off); `null` when rejected.
    pub broker_task_id: Option<String>,
    /// That task's state after the sync; `null` when rejected.
    pub state: Option<String>,
    pub detail: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct OfflineResults {
    /// One per task sent, in order.
    pub results: Vec<OfflineResultOut>,
}
