//! The store agent's side of offline operation: the LAN keys it checks on its LAN
//! listener, the claim of that listener (one agent per store), the store's directory it
//! takes orders with while the broker is unreachable, and the sync of the tasks it took
//! meanwhile. The decisions are `onceprint_engine::Offline`'s and `Setup`'s; these
//! handlers parse, call and shape.

use axum::extract::State;
use axum::Json;
use onceprint_core::validate_id;
use onceprint_engine::offline::{JournalRecord, LanClaim, OfflineReport, MAX_TASKS};

use crate::dto::{
    AgentDirectory, DirectoryPrinterOut, DirectoryStationOut, LanKeyHashOut, LanKeyHashes, LanListenerClaim,
    LanListenerOut, OfflineResultOut, OfflineResults, OfflineTaskIn, OfflineTasksIn, OfflineTasksWire,
};
use crate::error::{ApiError, ErrorBody};
use crate::extract::{AgentAuth, JsonBody};
use crate::AppState;

/// Extension: the active LAN keys of the agent's store, as SHA-256 hashes of
/// the whole key strings. The agent keeps them to check a LAN submission's
/// `Authorization: Bearer` key itself, also while the broker is unreachable.
#[utoipa::path(get, path = "/v1/agent/lan-keys", operation_id = "agent_lan_keys", tag = "store agent",
    security(("agent" = [])),
    responses((status = 200, body = LanKeyHashes), (status = 401, body = ErrorBody)))]
pub async fn lan_keys(State(st): State<AppState>, AgentAuth(who): AgentAuth) -> Result<Json<LanKeyHashes>, ApiError> {
    let keys = st.setup.lan_key_hashes(&who.tenant_id, &who.store_id).await?;
    Ok(Json(LanKeyHashes { keys: keys.into_iter().map(|k| LanKeyHashOut { id: k.id, sha256: k.hash }).collect() }))
}

/// Extension: the agent's store as the agent needs it to take orders on the
/// shop's LAN while the broker is unreachable: its printers (`agent`: driven by the store
/// agent, which can print to it itself; `printer_address` as a delivery would carry it;
/// `profile` the render profile configured, `null` for the default), its stations
/// (primary first), the configured print types, and the broker's body and content
/// limits, which the LAN listener applies as the broker does.
#[utoipa::path(get, path = "/v1/agent/directory", operation_id = "agent_directory", tag = "store agent",
    security(("agent" = [])),
    responses((status = 200, body = AgentDirectory), (status = 401, body = ErrorBody)))]
pub async fn directory(
    State(st): State<AppState>,
    AgentAuth(who): AgentAuth,
) -> Result<Json<AgentDirectory>, ApiError> {
    let d = st.offline.directory(&who).await?;
    Ok(Json(AgentDirectory {
        store_id: d.store_id,
        printers: d
            .printers
            .into_iter()
            .map(|p| DirectoryPrinterOut {
                printer_id: p.printer_id,
                printer_address: p.printer_address,
                enabled: p.enabled,
                agent: p.agent,
                profile: p.profile,
            })
            .collect(),
        stations: d
            .stations
            .into_iter()
            .map(|s| DirectoryStationOut { station_id: s.station_id, printers: s.printers })
            .collect(),
        print_types: d.print_types,
        default_print_type: d.default_print_type,
        max_body_bytes: st.config.max_body_bytes,
        max_content_bytes: d.max_content_bytes,
    }))
}

/// Extension: the store agent with a LAN listener claims it for its store. One agent per
/// store takes LAN orders: the first to claim holds the listener until a person frees
/// it (`DELETE /v1/stores/{id}/lan-listener`); another agent's claim is answered 409
/// `lan_listener_taken`, naming the holder, and that agent refuses LAN orders. Claiming
/// again as the holder answers 200.
#[utoipa::path(post, path = "/v1/agent/lan-listener", operation_id = "agent_lan_listener", tag = "store agent",
    request_body = LanListenerClaim,
    security(("agent" = [])),
    responses((status = 200, body = LanListenerOut), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 409, description = "`lan_listener_taken`: another store agent holds the store's LAN listener",
               body = ErrorBody)))]
pub async fn lan_listener(
    State(st): State<AppState>,
    AgentAuth(who): AgentAuth,
    JsonBody(req): JsonBody<LanListenerClaim>,
) -> Result<Json<LanListenerOut>, ApiError> {
    validate_id("agent_id", &req.agent_id)?;
    match st.offline.claim_lan_listener(&who, &req.agent_id).await? {
        LanClaim::Held => Ok(Json(LanListenerOut { store_id: who.store_id, agent_id: Some(req.agent_id) })),
        LanClaim::TakenBy(holder) => Err(ApiError::new(
            axum::http::StatusCode::CONFLICT,
            "lan_listener_taken",
            format!(
                "store agent {holder:?} takes the LAN orders of store {:?}; send them to it. To move them to agent \
                 {:?}, stop the other agent's listener and free it with DELETE /v1/stores/{}/lan-listener",
                who.store_id, req.agent_id, who.store_id
            ),
        )),
    }
}

/// Extension: the tasks the store agent accepted on the shop's LAN while the broker was
/// unreachable.
///
/// At most 500 per request, each taken in a transaction of its own and answered in order:
/// - `created`: the broker did not know the key (tenant, target, `biz_no`, print type):
///   the task is kept under the LAN task id, in the state the agent's outcome says
///   (`pending` joins its printer's lane and is delivered as any task), created and
///   charged once at `accepted_at` (its business day), its audit trail naming the LAN
///   path (`lan:KEY@agent:STORE`) and the agent journal's records;
/// - `merged`: the broker had the order (same content): the LAN id becomes another name
///   of its task (`GET /v1/print-tasks/{LAN id}` answers with it); printed by the agent
///   → `printed`, in doubt → `in_doubt`, unless the task ended already; never a second
///   charge;
/// - `conflict`: the broker had other content under the key: that task, unless it ended,
///   goes to the attention list (`in_doubt`); nothing prints, nothing is charged;
/// - `rejected` (with `detail`): the broker cannot take it (a target not of the agent's
///   store, content that does not parse, a report no agent writes…); the agent stops
///   sending it and keeps it for a person, and an `offline_task.rejected` alert says so.
///
/// What changed while the shop was cut off does not reject a task: a station that no
/// longer lists the printer the agent printed on (the task stays on that printer), a
/// print type no longer configured (the default's policy), a shop PC's clock far off
/// (`sent_at`: the times are moved onto the broker's clock). A history longer than 200
/// records keeps the first and the latest. Sending a LAN task id again answers the same
/// result and changes nothing. A malformed request as a whole is 400.
#[utoipa::path(post, path = "/v1/agent/offline-tasks", operation_id = "agent_offline_tasks", tag = "store agent",
    request_body = OfflineTasksIn,
    security(("agent" = [])),
    responses((status = 200, body = OfflineResults), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 413, body = ErrorBody)))]
pub async fn offline_tasks(
    State(st): State<AppState>,
    AgentAuth(who): AgentAuth,
    JsonBody(req): JsonBody<OfflineTasksWire>,
) -> Result<Json<OfflineResults>, ApiError> {
    validate_id("agent_id", &req.agent_id)?;
    if let Some(s) = &req.session {
        validate_id("session", s)?;
    }
    if req.tasks.len() > MAX_TASKS {
        return Err(ApiError::invalid(format!("tasks: at most {MAX_TASKS} per request")));
    }
    let reports = req.tasks.into_iter().enumerate().map(|(i, t)| report(i, t)).collect::<Result<Vec<_>, _>>()?;
    let answers = st.offline.sync(&who, &req.agent_id, reports, req.sent_at).await?;
    Ok(Json(OfflineResults {
        results: answers
            .into_iter()
            .map(|a| OfflineResultOut {
                task_id: a.task_id,
                result: a.result.as_str().to_owned(),
                broker_task_id: a.broker_task_id,
                state: a.state.map(|s| s.as_str().to_owned()),
                detail: a.detail,
            })
            .collect(),
    }))
}

/// Task `i` of an upload as the engine takes it. One that does not read as a task but
/// names itself (a string `task_id`) is a report to reject with the reason; one that does
/// not even name itself cannot be answered, and fails the request.
fn report(i: usize, value: serde_json::Value) -> Result<OfflineReport, ApiError> {
    let t: OfflineTaskIn = match serde_json::from_value(value.clone()) {
        Ok(t) => t,
        Err(e) => {
            let Some(task_id) = value.get("task_id").and_then(|v| v.as_str()) else {
                return Err(ApiError::invalid(format!("tasks[{i}]: {e}")));
            };
            let text = |field: &str| value.get(field).and_then(|v| v.as_str()).map(str::to_owned);
            return Ok(OfflineReport {
                task_id: task_id.to_owned(),
                biz_no: text("biz_no"),
                printer_id: text("printer_id"),
                station_id: text("station_id"),
                print_type: text("print_type"),
                printed_on: text("printed_on"),
                outcome: text("outcome").unwrap_or_default(),
                accepted_at: value.get("accepted_at").and_then(|v| v.as_i64()).unwrap_or(0),
                unreadable: Some(format!("tasks[{i}]: {e}")),
                ..OfflineReport::default()
            });
        }
    };
    Ok(OfflineReport {
        task_id: t.task_id,
        biz_no: t.biz_no,
        printer_id: t.printer_id,
        station_id: t.station_id,
        print_type: t.print_type,
        content: t.content,
        accepted_at: t.accepted_at,
        lan_key_id: t.lan_key_id,
        printed_on: t.printed_on,
        outcome: t.outcome,
        attempts: t.attempts.unwrap_or(0),
        detail: t.detail.unwrap_or_default(),
        history: t
            .history
            .into_iter()
            .map(|h| JournalRecord {
                at: h.at,
                attempt: h.attempt.unwrap_or(0),
                state: h.state,
                detail: h.detail.unwrap_or_default(),
            })
            .collect(),
        unreadable: None,
        age_ms: t.age_ms,
    })
}
