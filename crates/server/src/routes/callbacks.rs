//! Vendor callbacks for webhook printers: signed printed/failed reports.

use axum::extract::State;

use crate::extract::Path;
use axum::http::HeaderMap;
use axum::Json;
use onceprint_engine::transport::webhook::{outcome_of, signed_by};
use onceprint_engine::{AckIn, Claimant};
use onceprint_store::AgentIdentity;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::error::{ApiError, ErrorBody};
use crate::extract::{parse_json, JsonBytes};
use crate::AppState;

#[derive(Debug, Deserialize, ToSchema)]
pub struct CallbackIn {
    pub task_id: String,
    /// Defaults to the task's current attempt.
    #[serde(default, deserialize_with = "crate::dto::integral::optional")]
    pub attempt: Option<i32>,
    /// `printed`, `failed`, or an ack outcome (`no_paper`, `cover_open`, `offline`,
    /// `paper_jam`, `in_doubt`, `error`).
    pub status: String,
    pub detail: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CallbackOut {
    pub task_id: String,
    /// `applied`, `duplicate` or `stale`.
    pub result: String,
}

/// A printed/failed report from a webhook printer's endpoint, signed like the jobs it
/// received: `x-onceprint-signature: t=UNIX_SECONDS,v1=HEX(HMAC-SHA256(secret, "t.body"))`.
/// A bad signature or a timestamp outside the replay window is 401; an unknown task 404;
/// a report for a finished task changes nothing and raises no second alert.
#[utoipa::path(post, path = "/v1/callbacks/{printer_id}", tag = "webhook transport", request_body = CallbackIn,
    params(("printer_id" = String, Path)),
    responses((status = 200, body = CallbackOut), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 404, body = ErrorBody)))]
pub async fn callback(
    State(st): State<AppState>,
    Path(printer_id): Path<String>,
    headers: HeaderMap,
    JsonBytes(body): JsonBytes,
) -> Result<Json<CallbackOut>, ApiError> {
    let text = std::str::from_utf8(&body).map_err(|_| ApiError::invalid("the body is not UTF-8"))?;
    let sig = headers
        .get(onceprint_engine::alerts::SIGNATURE_HEADER)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| ApiError::unauthorized("missing x-onceprint-signature"))?;
    // Printer ids are per tenant: the signature tells whose printer this is.
    let printer =
        signed_by(st.store.as_ref(), &printer_id, sig, text, st.config.push.replay_window_s).await?.ok_or_else(
            || ApiError::unauthorized("bad signature, unknown printer, or a timestamp outside the replay window"),
        )?;
    let req: CallbackIn = parse_json(&body)?;
    let (outcome, proof) =
        outcome_of(&req.status).ok_or_else(|| ApiError::invalid(format!("status: unknown status {:?}", req.status)))?;
    let task = st
        .store
        .get_task(&printer.tenant_id, &req.task_id)
        .await?
        .filter(|t| t.printer_id == printer.id)
        .ok_or_else(|| ApiError::not_found(format!("no task {:?} on printer {printer_id:?}", req.task_id)))?;
    let who = AgentIdentity { tenant_id: printer.tenant_id.clone(), store_id: printer.store_id.clone() };
    let ack = AckIn {
        task_id: task.task_id.clone(),
        attempt: req.attempt.unwrap_or(task.attempts),
        outcome,
        detail: req.detail.unwrap_or_else(|| "vendor callback".into()).chars().take(500).collect(),
        proof,
    };
    let results = st.lanes.ack(&who, &Claimant::push("webhook"), vec![ack]).await?;
    let result = results.first().map_or("stale", |r| r.as_str());
    Ok(Json(CallbackOut { task_id: task.task_id, result: result.to_owned() }))
}
