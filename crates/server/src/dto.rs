//! The JSON shapes of the HTTP API. Field names are fixed by the published API
//! (docs/API.md); the types here also feed the OpenAPI document, so the description cannot drift from the code.

use onceprint_core::Millis;
use onceprint_store::{AgentToken, ApiKey, Printer, SetupEvent, Station, StoreRow, Task, TaskEvent};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

pub use onceprint_engine::clock::rfc3339;

/// JSON Schema counts `3.0` as an integer, and so does the document: integer fields take a
/// number with a zero fraction as that integer (serde alone would refuse it).
pub mod integral {
    use serde::{de::Error, Deserialize, Deserializer};

    fn exact<T: TryFrom<i128>>(n: &serde_json::Number) -> Option<T> {
        let wide: i128 = match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => i128::from(i),
            (_, Some(u), _) => i128::from(u),
            // Within ±2^63 every f64 with a zero fraction is an exact integer.
            (_, _, Some(f)) if f.fract() == 0.0 && f.abs() < 9.2e18 => f as i128,
            _ => return None,
        };
        T::try_from(wide).ok()
    }

    pub fn required<'de, D: Deserializer<'de>, T: TryFrom<i128>>(d: D) -> Result<T, D::Error> {
        let n = serde_json::Number::deserialize(d)?;
        exact(&n).ok_or_else(|| D::Error::custom(format!("{n} is not an integer in range")))
    }

    pub fn optional<'de, D: Deserializer<'de>, T: TryFrom<i128>>(d: D) -> Result<Option<T>, D::Error> {
        match Option::<serde_json::Number>::deserialize(d)? {
            None => Ok(None),
            Some(n) => exact(&n).map(Some).ok_or_else(|| D::Error::custom(format!("{n} is not an integer in range"))),
        }
    }

    /// A field whose absence differs from `null`: `Some(None)` for `null`, `Some(Some(n))`
    /// for an integer; with `#[serde(default)]` an absent field stays `None`.
    pub fn present_optional<'de, D: Deserializer<'de>, T: TryFrom<i128>>(d: D) -> Result<Option<Option<T>>, D::Error> {
        optional(d).map(Some)
    }

    /// The same for the integers inside a free-form object (a printer's transport): each
    /// number with a zero fraction becomes that integer.
    pub fn normalize(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Number(n) if n.is_f64() => {
                if let Some(i) = exact::<i64>(n) {
                    *v = serde_json::Value::from(i);
                }
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(normalize),
            serde_json::Value::Object(map) => map.values_mut().for_each(normalize),
            _ => {}
        }
    }
}

mod offline;
pub use offline::*;

fn opt_time(ms: Option<Millis>) -> Option<String> {
    ms.map(rfc3339)
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTenant {
    /// 1–64 characters of `A-Za-z0-9._:-`.
    pub id: String,
    pub name: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TenantCreated {
    pub id: String,
    pub name: String,
    /// The tenant's API key. Shown only in this answer; only its hash is stored.
    pub api_key: String,
    /// Extension: the key's id (for `GET /v1/api-keys`, revocation, and the set-up audit,
    /// where changes made with it are by `api_key:ID`).
    pub api_key_id: String,
    pub created_at: String,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateStore {
    pub id: String,
    pub name: String,
    /// The store's time zone, which decides where its business day (daily reconciliation)
    /// begins and ends: an IANA name such as `Asia/Shanghai` or `Europe/Berlin`, whose days
    /// follow daylight saving time (23 or 25 hours long on the days the clocks change), or
    /// a fixed UTC offset `+HH:MM` / `-HH:MM` of at most 14 hours, such as `+08:00`.
    /// `Z`, `UTC`, an empty string or no field mean UTC. Names are looked up in the IANA
    /// time zone database built into the broker, without regard to case; an unknown name
    /// is refused with `invalid_request`.
    pub timezone: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct StoreOut {
    pub id: String,
    pub name: String,
    /// The store's time zone as stored: an IANA name as the time zone database spells it
    /// (`Europe/Berlin`), a fixed offset `+HH:MM` / `-HH:MM` (`+08:00`), or `UTC`.
    pub timezone: String,
    pub created_at: String,
}

impl From<StoreRow> for StoreOut {
    fn from(s: StoreRow) -> Self {
        StoreOut { id: s.id, name: s.name, timezone: s.timezone, created_at: rfc3339(s.created_at) }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct StoreList {
    pub stores: Vec<StoreOut>,
}

/// How the broker reaches a printer (documentation of the transport object; the engine's
/// typed transport model parses and checks it).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct TransportIn {
    /// `agent` (a store agent prints to a printer on raw TCP 9100, USB or a serial port)
    /// or `webhook` (the broker pushes jobs to an HTTP endpoint: a vendor cloud or the
    /// merchant's own bridge).
    pub kind: String,
    /// `agent`: `tcp://HOST:PORT`, `usb:///PATH` (a USB printer device) or
    /// `serial:///PATH[?baud=N][&flow=rtscts]`, as seen from the store agent's machine.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// `webhook`: where jobs are POSTed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// `webhook`: the shared secret signing jobs and callbacks (at least 16 characters).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// `webhook`, optional: `GET status_url?task_id=…&idempotency_key=…` →
    /// `{"status": "printed" | "pending" | "failed" | …}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status_url: Option<String>,
    /// Render profile for receipt documents, e.g. `escpos-58-gb18030` (paper width and
    /// character encoding); default `escpos-80-gb18030` or the document's paper.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreatePrinter {
    pub id: String,
    pub store_id: String,
    /// Defaults to the id.
    pub name: Option<String>,
    #[schema(value_type = TransportIn)]
    pub transport: serde_json::Value,
}

/// A change of a printer: `name` and/or `transport`. A printer cannot change store
/// (`store_id` may be sent only with the printer's own store).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdatePrinter {
    pub name: Option<String>,
    /// A whole transport object, checked like at registration (secrets included: a
    /// webhook printer's `secret` must be given again).
    #[schema(value_type = Option<TransportIn>)]
    pub transport: Option<serde_json::Value>,
    pub store_id: Option<String>,
}

/// Who disables or enables a printer and why (recorded in the set-up audit).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SwitchIn {
    pub operator: String,
    pub reason: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct PrinterOut {
    pub id: String,
    pub store_id: String,
    pub name: String,
    /// As registered, secrets shown as `"***"`.
    #[schema(value_type = Object)]
    pub transport: serde_json::Value,
    /// Extension: `false` while the printer is disabled. Its lane is then handed out to
    /// nobody (waiting tasks wait; the task in flight is not taken back) and new
    /// submissions to it are refused with 409 `printer_disabled`.
    pub enabled: bool,
    pub online: bool,
    pub last_seen_at: Option<String>,
    pub last_error: Option<String>,
    /// Extension: since when the printer's own state (`last_error` `no_paper`,
    /// `cover_open`, `paper_jam` or `offline`) holds its lane; `null` while it does not.
    /// Its tickets wait without spending attempts until the printer reports ready (or
    /// their print type's `max_wait_ms` runs out); a station's tickets move to its next
    /// printer once the pause is older than `station_failover_after_ms`.
    pub paused_since: Option<String>,
    pub created_at: String,
    /// Only in the answer that creates a printer which logs in to the broker itself
    /// (`cloudprnt`, `epson_sdp`, `mqtt`), and in `POST /v1/printers/{id}/credentials`:
    /// shown once, never again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credentials: Option<PrinterCredentialsOut>,
}

/// The login a printer presents: HTTP Basic on `/cloudprnt` and `/epson-sdp`, HTTP Digest
/// on `/epson-sdp` too, or the user name and password on the MQTT server.
#[derive(Debug, Serialize, ToSchema)]
pub struct PrinterCredentialsOut {
    /// `prn_` and 16 lowercase hex digits (20 characters), unique across tenants.
    pub username: String,
    /// Exactly 30 characters of `[A-Za-z0-9_-]` (180 random bits, no prefix), which TM Web
    /// Config takes (at most 30 characters of letters, digits, `_`, `.` and `-`). It may
    /// begin with `-`: on a command line give it as `--password=…`. Logins made by earlier
    /// versions (`opp_` and 64 hex digits) keep working until rotated.
    pub password: String,
}

impl From<onceprint_engine::setup::PrinterLogin> for PrinterCredentialsOut {
    fn from(l: onceprint_engine::setup::PrinterLogin) -> Self {
        PrinterCredentialsOut { username: l.username, password: l.password }
    }
}

impl From<Printer> for PrinterOut {
    fn from(p: Printer) -> Self {
        PrinterOut {
            // Secrets are typed in the transport model and shown as "***" (never again
            // after registration); a configuration this version cannot read is shown as
            // nothing rather than as stored.
            transport: onceprint_engine::transport::TransportConfig::from_stored(&p.transport)
                .map(|t| t.redacted())
                .unwrap_or(serde_json::Value::Null),
            id: p.id,
            store_id: p.store_id,
            name: p.name,
            enabled: p.enabled,
            online: p.online,
            last_seen_at: opt_time(p.last_seen_at),
            last_error: p.last_error,
            paused_since: opt_time(p.paused_since),
            created_at: rfc3339(p.created_at),
            credentials: None,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct PrinterList {
    pub printers: Vec<PrinterOut>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateStation {
    pub id: String,
    pub store_id: String,
    /// Printer ids of the station's store: the primary first, then backups in order.
    pub printers: Vec<String>,
    /// Extension: how long (ms, 0 to 86400000) a printer of the station may be paused by
    /// no paper, cover open, paper jam or offline before its station tickets move to the
    /// next printer. Absent or `null`: the broker's `station_failover_after_ms` (30000).
    #[serde(default, deserialize_with = "integral::optional")]
    #[schema(minimum = 0, maximum = 86_400_000)]
    pub failover_after_ms: Option<i64>,
}

/// A station's change: a new printer list (printer ids of the station's store, the
/// primary first) and/or its failover threshold. Tasks already created keep their printer.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateStation {
    #[serde(default)]
    pub printers: Option<Vec<String>>,
    /// Extension: the station's own failover threshold (see `CreateStation`); `null` goes
    /// back to the broker's, absent leaves it as it is.
    #[serde(default, deserialize_with = "integral::present_optional")]
    #[schema(value_type = Option<i64>, minimum = 0, maximum = 86_400_000)]
    pub failover_after_ms: Option<Option<i64>>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct StationOut {
    pub id: String,
    pub store_id: String,
    pub printers: Vec<String>,
    /// Extension: the station's own failover threshold in ms; `null`: the broker's.
    pub failover_after_ms: Option<i64>,
    pub created_at: String,
}

impl From<Station> for StationOut {
    fn from(s: Station) -> Self {
        StationOut {
            id: s.id,
            store_id: s.store_id,
            printers: s.printers,
            failover_after_ms: s.failover_after_ms,
            created_at: rfc3339(s.created_at),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AgentTokenOut {
    /// Extension: names the token in `GET /v1/stores/{id}/agent-tokens` and revocation.
    pub id: String,
    /// The agent token. Shown only in this answer; only its hash is stored.
    pub token: String,
    pub store_id: String,
    pub created_at: String,
}

/// An agent token as listed (never the token itself).
#[derive(Debug, Serialize, ToSchema)]
pub struct AgentTokenInfo {
    pub id: String,
    pub store_id: String,
    pub created_at: String,
    /// Set once revoked; a revoked token is refused with 401.
    pub revoked_at: Option<String>,
}

impl From<AgentToken> for AgentTokenInfo {
    fn from(t: AgentToken) -> Self {
        AgentTokenInfo {
            id: t.id,
            store_id: t.store_id,
            created_at: rfc3339(t.created_at),
            revoked_at: opt_time(t.revoked_at),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AgentTokenList {
    pub tokens: Vec<AgentTokenInfo>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ApiKeyCreated {
    pub id: String,
    /// The key. Shown only in this answer; only its hash is stored.
    pub api_key: String,
    pub created_at: String,
}

/// An API key as listed (never the key itself).
#[derive(Debug, Serialize, ToSchema)]
pub struct ApiKeyOut {
    pub id: String,
    pub created_at: String,
    /// Set once revoked; a revoked key is refused with 401.
    pub revoked_at: Option<String>,
}

impl From<ApiKey> for ApiKeyOut {
    fn from(k: ApiKey) -> Self {
        ApiKeyOut { id: k.id, created_at: rfc3339(k.created_at), revoked_at: opt_time(k.revoked_at) }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ApiKeyList {
    pub api_keys: Vec<ApiKeyOut>,
}

/// One set-up change.
#[derive(Debug, Serialize, ToSchema)]
pub struct SetupEventOut {
    pub at: String,
    /// `admin` or `api_key:ID`.
    pub actor: String,
    /// `tenant`, `store`, `printer`, `station`, `agent_token`, `api_key` or `operator`.
    pub object_kind: String,
    pub object_id: String,
    /// `create`, `update`, `disable`, `enable` or `revoke`.
    pub action: String,
    /// What changed. Printer edits: `{"before":{"name","transport"},"after":{…}}` with
    /// transports as the API shows them (secrets as `"***"`); disable/enable:
    /// `{"operator","reason"}`; station changes: the printer lists before and after;
    /// operator accounts: `{"login":"disabled"|"enabled"|"unlocked"}`, `{"password":"replaced"}`
    /// (never the password), `{"sessions":"revoked"}`.
    #[schema(value_type = Object)]
    pub detail: serde_json::Value,
}

impl From<SetupEvent> for SetupEventOut {
    fn from(e: SetupEvent) -> Self {
        SetupEventOut {
            at: rfc3339(e.at),
            actor: e.actor,
            object_kind: e.object_kind,
            object_id: e.object_id,
            action: e.action,
            detail: e.detail,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SetupEventList {
    /// Newest first.
    pub events: Vec<SetupEventOut>,
    /// Pass as `cursor` for the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SetupEventParams {
    /// 1–500, default 50.
    pub limit: Option<i64>,
    pub cursor: Option<String>,
}

/// A print task submission. Exactly one of `printer_id` and `station_id`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitTask {
    /// The business number (order number, serial…). Required and non-empty.
    pub biz_no: Option<String>,
    pub printer_id: Option<String>,
    pub station_id: Option<String>,
    /// Default `receipt`. Joins the idempotency key and selects the retry policy and priority.
    pub print_type: Option<String>,
    /// `{"type":"text","text":…}`, `{"type":"escpos","data":BASE64}` or `{"type":"doc","doc":{…}}`.
    #[schema(value_type = Object)]
    pub content: Option<onceprint_core::Content>,
}

/// A batch of submissions (`POST /v1/print-task-batches`): 1 to 500 bodies of
/// `POST /v1/print-tasks`.
// The schema of the request body only: the handler reads `SubmitBatchRaw`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct SubmitBatch {
    pub tasks: Vec<SubmitTask>,
}

/// How the handler reads a batch: each item kept as its own JSON text, so that it is
/// parsed and refused exactly as the body of a single submission would be.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmitBatchRaw {
    pub tasks: Vec<Box<serde_json::value::RawValue>>,
}

/// The answers to a batch, one per item, in the order sent.
#[derive(Debug, Serialize, ToSchema)]
pub struct BatchResults {
    pub results: Vec<BatchResult>,
}

/// The answer to one item of a batch: the status `POST /v1/print-tasks` would have
/// answered it with, and its body: `task` for 201 and 200, `error` otherwise.
#[derive(Debug, Serialize, ToSchema)]
pub struct BatchResult {
    pub status: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task: Option<SubmitOut>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<crate::error::ErrorDetail>,
    /// With status 429: when to send this item again, as `Retry-After` would say.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_secs: Option<u64>,
}

/// The answer to a submission: 201 for a new task, 200 for a duplicate.
#[derive(Debug, Serialize, ToSchema)]
pub struct SubmitOut {
    pub task_id: String,
    pub state: String,
    pub duplicate: bool,
    pub message: String,
    pub biz_no: String,
    pub print_type: String,
    /// Present (`true`) only on a duplicate of a task that retention pruned
    /// (`retention_days`): `state` is its final state; its content and audit trail are gone.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub pruned: bool,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TaskOut {
    pub task_id: String,
    pub biz_no: String,
    pub printer_id: String,
    pub station_id: Option<String>,
    pub store_id: String,
    pub print_type: String,
    pub priority: i32,
    pub content_type: String,
    /// One of `pending`, `sent`, `retrying`, `printed`, `failed`, `in_doubt`,
    /// `transferred`, `cancelled`, `closed`.
    pub state: String,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub next_attempt_at: Option<String>,
    pub created_at: String,
    pub updated_at: String,
    pub printed_at: Option<String>,
    /// The task this one reprints or continues.
    pub origin_task_id: Option<String>,
    /// `reprint`, `transfer` or `failover`.
    pub origin_kind: Option<String>,
    /// 1, 2, … for reprints.
    pub reprint_no: Option<i32>,
    /// For a transferred task: the task carrying on its work.
    pub successor_task_id: Option<String>,
    /// Present (`true`) only for a task that retention pruned (`retention_days`): what is
    /// shown is its tombstone (its final state); its content and audit trail are gone.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub pruned: bool,
}

impl From<onceprint_store::Tombstone> for TaskOut {
    fn from(b: onceprint_store::Tombstone) -> Self {
        TaskOut { pruned: true, ..b.task.into() }
    }
}

impl From<Task> for TaskOut {
    fn from(t: Task) -> Self {
        TaskOut {
            task_id: t.task_id,
            biz_no: t.biz_no,
            printer_id: t.printer_id,
            station_id: t.station_id,
            store_id: t.store_id,
            print_type: t.print_type,
            priority: t.priority,
            content_type: t.content_type,
            state: t.state.as_str().to_owned(),
            attempts: t.attempts,
            last_error: t.last_error,
            next_attempt_at: opt_time(t.next_attempt_at),
            created_at: rfc3339(t.created_at),
            updated_at: rfc3339(t.updated_at),
            printed_at: opt_time(t.printed_at),
            origin_task_id: t.origin_task_id,
            origin_kind: t.origin_kind.map(|k| k.as_str().to_owned()),
            reprint_no: t.reprint_no,
            successor_task_id: t.successor_task_id,
            pruned: false,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TaskList {
    pub tasks: Vec<TaskOut>,
    /// Pass as `cursor` for the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EventOut {
    pub at: String,
    /// `null` for the creation event.
    pub from: Option<String>,
    pub to: String,
    pub attempt: i32,
    /// `tenant:ID`, `engine`, `agent:ID`, `operator:NAME`…
    pub actor: String,
    pub reason: String,
}

impl From<TaskEvent> for EventOut {
    fn from(e: TaskEvent) -> Self {
        EventOut {
            at: rfc3339(e.at),
            from: e.from.map(|s| s.as_str().to_owned()),
            to: e.to.as_str().to_owned(),
            attempt: e.attempt,
            actor: e.actor,
            reason: e.reason,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EventList {
    pub events: Vec<EventOut>,
    /// Present (`true`) only for a task that retention pruned: its audit trail was deleted
    /// with it, so `events` is empty.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub pruned: bool,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TaskListParams {
    pub store_id: Option<String>,
    pub state: Option<String>,
    pub biz_no: Option<String>,
    /// 1–500, default 50.
    pub limit: Option<i64>,
    pub cursor: Option<String>,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PrinterListParams {
    pub store_id: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    pub status: String,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PollIn {
    /// The agent's stable id (kept in its state directory).
    pub agent_id: String,
    /// Long-poll wait, at most 60000 (default 25000).
    #[serde(default, deserialize_with = "integral::optional")]
    pub wait_ms: Option<u64>,
    /// Most deliveries in one answer, 1–256 (default 16).
    #[serde(default, deserialize_with = "integral::optional")]
    pub max: Option<u32>,
    /// Extension: an id of this agent process. A new session tells the broker the agent
    /// restarted, so its unconfirmed deliveries are offered again at once.
    pub session: Option<String>,
    /// Extension (agent protocol 3): how long this agent process has been running, in
    /// milliseconds of its monotonic clock. Of two sessions of one agent id the one that
    /// started later on the broker's clock (first heard, less this age) is the newer; the
    /// agent's wall clock never counts. Without it, a session starts when the broker first
    /// hears it.
    #[serde(default, deserialize_with = "integral::optional")]
    pub session_age_ms: Option<u64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DeliveryOut {
    pub task_id: String,
    pub attempt: i32,
    pub printer_id: String,
    /// `tcp://HOST:PORT`, `usb:///PATH` or `serial:///PATH[?baud=N][&flow=rtscts]`.
    pub printer_address: String,
    /// The same on every redelivery of the task, never shared by two tasks of one printer:
    /// `biz_no#printer_id` in the simple case, suffixes `#type=`, `#station=`,
    /// `#reprint=N#origin=`, `#transfer=`, `#failover=` otherwise, `#` and `%` in `biz_no`
    /// written `%23` and `%25`.
    pub idempotency_key: String,
    /// Always `escpos`: `data` is the bytes to send to the printer.
    pub content_type: String,
    /// Base64.
    pub data: String,
    /// Extension: `true` when the previous attempt ended in doubt and the print type's
    /// policy is to reprint on doubt; the agent may then print although its journal
    /// shows the older attempt as started.
    pub reprint: bool,
}

impl From<onceprint_engine::AgentDelivery> for DeliveryOut {
    fn from(d: onceprint_engine::AgentDelivery) -> Self {
        use base64::Engine as _;
        DeliveryOut {
            task_id: d.task_id,
            attempt: d.attempt,
            printer_id: d.printer_id,
            printer_address: d.printer_address,
            idempotency_key: d.idempotency_key,
            content_type: d.content_type.to_owned(),
            data: base64::engine::general_purpose::STANDARD.encode(d.data),
            reprint: d.reprint,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DeliveryList {
    pub deliveries: Vec<DeliveryOut>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AckIn {
    pub task_id: String,
    #[serde(deserialize_with = "integral::required")]
    pub attempt: i32,
    /// `printed`, `no_paper`, `cover_open`, `offline`, `paper_jam`, `in_doubt` or `error`.
    pub outcome: String,
    pub detail: Option<String>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AcksIn {
    pub acks: Vec<AckIn>,
    /// Extension: the acknowledging agent's id, recorded in the audit trail.
    pub agent_id: Option<String>,
    /// Extension: the acknowledging agent process's session (as in its polls). Keeps the
    /// deliveries of a process that was replaced by a newer one with it while it still
    /// answers them.
    pub session: Option<String>,
    /// Extension (agent protocol 2): hand out, with the answer, the next task of each of
    /// the agent's printers whose task in flight these acks end, at most this many (taken
    /// as 0–256; 0 or absent: none). The answer then carries `deliveries`, as a poll's.
    #[serde(default, deserialize_with = "integral::optional")]
    pub next: Option<u32>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AckResultOut {
    pub task_id: String,
    /// `applied`, `duplicate` or `stale`.
    pub result: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AckResults {
    pub results: Vec<AckResultOut>,
    /// Extension (agent protocol 2): with `next` in the request, the deliveries handed out
    /// with these acks, exactly as a poll would have answered them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deliveries: Option<Vec<DeliveryOut>>,
}

/// An operator's action.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ActionIn {
    /// Who acts. With a tenant API key the audit records `api_key:ID` and, when given, this
    /// name beside it (leave it out when no person acts, e.g. an order system's own
    /// clean-up); with an operator token it may be left out, and if given must be the
    /// token's own operator id (the audit records `operator:ID`).
    pub operator: Option<String>,
    /// Why (recorded in the audit trail).
    pub reason: String,
    /// For `transfer`: the printer of the same store to print on instead. For `reprint`
    /// (optional): another printer of the same store to print the copy on.
    pub printer_id: Option<String>,
}

/// A transfer: who moves the task, why, and to which printer.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TransferIn {
    /// Who acts, as in the other manual actions (`ActionIn`).
    pub operator: Option<String>,
    /// Why (recorded in the audit trail).
    pub reason: String,
    /// The printer of the task's store to print on instead (another printer of another
    /// store, or none, is 404 `not_found`; the task's own printer is 409
    /// `invalid_transition`).
    pub printer_id: String,
}

impl From<TransferIn> for ActionIn {
    fn from(t: TransferIn) -> Self {
        ActionIn { operator: t.operator, reason: t.reason, printer_id: Some(t.printer_id) }
    }
}

/// The task acted on and the task the action created (reprint, transfer).
#[derive(Debug, Serialize, ToSchema)]
pub struct ActionOut {
    pub task: TaskOut,
    pub created: Option<TaskOut>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateWebhook {
    pub id: String,
    /// `http://…` or `https://…`.
    pub url: String,
    /// Any of `task.failed`, `task.in_doubt`, `task.printed`, `printer.offline`, `printer.online`.
    pub events: Vec<String>,
    /// The signing secret (at least 16 characters). For `onceprint`, generated when
    /// absent; for a group bot, the bot's own signing secret when it has one (DingTalk's
    /// `SEC…`, Feishu's), else leave it out.
    pub secret: Option<String>,
    /// How events are written: `onceprint` (default; the signed event as JSON) or a chat
    /// group bot's text message: `wecom` (企业微信), `dingtalk` (钉钉), `feishu` (飞书/Lark),
    /// `slack`.
    pub format: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct WebhookCreated {
    pub id: String,
    pub url: String,
    pub events: Vec<String>,
    /// `onceprint`, `wecom`, `dingtalk`, `feishu` or `slack`.
    pub format: String,
    /// The signing secret ("" for a bot without one). Shown only in this answer.
    pub secret: String,
    pub created_at: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct WebhookOut {
    pub id: String,
    pub url: String,
    /// `onceprint`, `wecom`, `dingtalk`, `feishu` or `slack`.
    pub format: String,
    pub events: Vec<String>,
    pub created_at: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct WebhookTestQueued {
    /// The test message's event id, as `GET /v1/webhooks/{id}/deliveries` shows it.
    pub event_id: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct WebhookList {
    pub webhooks: Vec<WebhookOut>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct WebhookDeliveryOut {
    pub event_id: String,
    pub event_type: String,
    pub attempts: i32,
    /// `null` once delivered or given up.
    pub next_attempt_at: Option<String>,
    pub last_status: Option<i32>,
    pub last_error: Option<String>,
    pub delivered_at: Option<String>,
    pub created_at: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct WebhookDeliveryList {
    pub deliveries: Vec<WebhookDeliveryOut>,
}

/// A new operator account.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateOperator {
    /// The login name, 1–64 characters of `A-Za-z0-9._:-`, unique in the tenant.
    pub id: String,
    /// The name people see (defaults to the id).
    pub name: Option<String>,
    /// `staff` (sees and acts on only `stores`) or `manager` (every store of the tenant;
    /// creates operators in the console).
    pub role: String,
    /// A staff member's stores (at least one); left out for a manager.
    pub stores: Option<Vec<String>>,
    /// At least 10 characters. Kept only as an argon2id hash.
    pub password: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct OperatorOut {
    pub id: String,
    pub name: String,
    /// `staff` or `manager`.
    pub role: String,
    pub stores: Vec<String>,
    pub created_at: String,
    /// When the login was disabled; `null` while it may log in.
    pub disabled_at: Option<String>,
    /// Until when logins of this operator are refused after too many failures (from one
    /// source, or from all together), as this node counts them; `null` when none is.
    pub login_locked_until: Option<String>,
}

impl From<onceprint_store::Operator> for OperatorOut {
    fn from(o: onceprint_store::Operator) -> Self {
        OperatorOut {
            id: o.id,
            name: o.name,
            role: o.role.as_str().to_owned(),
            stores: o.store_ids,
            created_at: rfc3339(o.created_at),
            disabled_at: o.disabled_at.map(rfc3339),
            login_locked_until: None,
        }
    }
}

impl OperatorOut {
    /// The operator with the lock-out this node holds for it.
    pub fn with_lockout(mut self, lock: Option<onceprint_engine::operators::Lockout>) -> Self {
        self.login_locked_until = lock.map(|l| rfc3339(l.until));
        self
    }
}

/// A new password for an operator.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OperatorPassword {
    /// At least 10 characters. Kept only as an argon2id hash; every session of the
    /// operator ends.
    pub password: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct OperatorList {
    pub operators: Vec<OperatorOut>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SessionsRevoked {
    /// How many active sessions (console logins and operator tokens) were ended.
    pub revoked: u64,
}

/// An operator's own credentials.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OperatorLogin {
    pub tenant_id: String,
    pub operator_id: String,
    pub password: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct OperatorTokenOut {
    /// `opo_…`: send as `Authorization: Bearer`. Shown only in this answer.
    pub token: String,
    pub expires_at: String,
    pub operator: OperatorOut,
}

/// An agent's report on its idle printers.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StatusIn {
    pub agent_id: String,
    pub session: Option<String>,
    /// May be empty (the answer still lists the printers to watch).
    pub printers: Vec<PrinterStatusIn>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PrinterStatusIn {
    pub printer_id: String,
    /// `ready`, `no_paper`, `cover_open`, `paper_jam` or `offline`.
    pub status: String,
}

/// The printers an agent should watch: its store's enabled agent printers.
#[derive(Debug, Serialize, ToSchema)]
pub struct WatchList {
    pub printers: Vec<WatchedOut>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct WatchedOut {
    pub printer_id: String,
    /// `tcp://HOST:PORT`.
    pub printer_address: String,
}

/// A store agent's device log digest: each task's latest journal record.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JournalDigestIn {
    pub agent_id: String,
    /// The agent process's session, as in its polls; checked, not needed.
    pub session: Option<String>,
    /// At most 5000 records; may be empty.
    pub records: Vec<DigestRecordIn>,
}

/// One task's latest record in the agent's journal.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DigestRecordIn {
    /// The task id the agent printed under: a broker task id, or one the agent minted for
    /// a task accepted on the shop's LAN.
    pub task_id: String,
    /// The idempotency key the job carried to the printer (`biz_no#printer_id`…).
    pub key: String,
    pub printer_id: String,
    /// `printed`, `in_doubt`, or `failed` (the last record was a blocker or an error).
    pub state: String,
    /// When the agent journaled the record: milliseconds since the epoch, by its clock.
    #[serde(deserialize_with = "integral::required")]
    pub at: i64,
}

/// What the broker did with a digest.
#[derive(Debug, Serialize, ToSchema)]
pub struct JournalDigestOut {
    /// Records in the request: all of them were checked and taken into account.
    pub accepted: u64,
    /// Stored records the request added or replaced with a later one (0 for a digest sent
    /// again).
    pub changed: u64,
}

#[cfg(test)]
mod tests {
    #[derive(serde::Deserialize)]
    struct At {
        #[serde(deserialize_with = "super::integral::required")]
        at: i64,
    }

    #[test]
    fn integers_written_with_a_zero_fraction_are_read_exactly() {
        // Found by schemathesis: without exact float parsing this read as ...451.2.
        for (json, want) in [
            (r#"{"at": 2182236715863451.0}"#, 2_182_236_715_863_451_i64),
            (r#"{"at": 9007199254740993}"#, 9_007_199_254_740_993),
            (r#"{"at": 3.0}"#, 3),
            (r#"{"at": -14862085307297.0}"#, -14_862_085_307_297),
        ] {
            let at: At = serde_json::from_str(json).unwrap_or_else(|e| panic!("{json}: {e}"));
            assert_eq!(at.at, want, "{json}");
        }
        assert!(serde_json::from_str::<At>(r#"{"at": 3.5}"#).is_err());
    }
}
