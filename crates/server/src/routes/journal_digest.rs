//! The store agent's device log digest: `POST /v1/agent/journal-digest`.
//!
//! A route module of its own beside `agent.rs`, since it belongs to reconciliation rather
//! than to delivery: nothing here moves a task.

use axum::extract::State;
use axum::Json;
use onceprint_core::validate_id;
use onceprint_engine::device_log::{accept_digest, DigestRecord};

use crate::dto::{JournalDigestIn, JournalDigestOut};
use crate::error::{ApiError, ErrorBody};
use crate::extract::{AgentAuth, JsonBody};
use crate::AppState;

/// Extension: the agent's account of what its printers did, each task's latest
/// journal record (`printed`, `in_doubt`, or `failed`), for the store's reconciliation
/// report (`device_printed_broker_not`, `broker_printed_device_not`). At most 5000
/// records per request. The broker keeps one record per task of the agent's store, the
/// latest by `at` (at the same instant, printed over in doubt over failed), so sending a
/// digest again changes nothing (`changed` 0). A request is checked whole before anything
/// is stored: any malformed record is 400 `invalid_request` naming it, and nothing of the
/// request is kept. Records are not checked against the broker's tasks: a task the broker
/// does not know is a difference the report shows. Changes no task.
#[utoipa::path(post, path = "/v1/agent/journal-digest", operation_id = "agent_journal_digest", tag = "store agent",
    request_body = JournalDigestIn,
    security(("agent" = [])),
    responses((status = 200, body = JournalDigestOut), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 413, body = ErrorBody)))]
pub async fn journal_digest(
    State(st): State<AppState>,
    AgentAuth(who): AgentAuth,
    JsonBody(req): JsonBody<JournalDigestIn>,
) -> Result<Json<JournalDigestOut>, ApiError> {
    if let Some(s) = &req.session {
        validate_id("session", s)?;
    }
    let records: Vec<DigestRecord> = req
        .records
        .into_iter()
        .map(|r| DigestRecord { task_id: r.task_id, key: r.key, printer_id: r.printer_id, state: r.state, at: r.at })
        .collect();
    let done =
        accept_digest(st.store.as_ref(), &who, &req.agent_id, &records, onceprint_engine::clock::now_ms()).await?;
    Ok(Json(JournalDigestOut { accepted: done.accepted, changed: done.changed }))
}
