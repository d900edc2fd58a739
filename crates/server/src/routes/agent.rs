//! The store agent protocol (docs/API.md): long poll for deliveries, acknowledge outcomes.

use std::time::Duration;

use axum::extract::State;
use axum::Json;
use onceprint_core::{validate_id, Outcome};
use onceprint_engine::printer_watch::{IdleStatus, MAX_REPORTS};
use onceprint_engine::AckIn;

use crate::dto::{
    AckResultOut, AckResults, AcksIn, DeliveryList, DeliveryOut, PollIn, StatusIn, WatchList, WatchedOut,
};
use crate::error::{ApiError, ErrorBody};
use crate::extract::{AgentAuth, AgentAuthUnmetered, JsonBody};
use crate::AppState;

/// Longest accepted long-poll wait.
const MAX_WAIT_MS: u64 = 60_000;
/// Most deliveries in one answer, to a poll or with acks.
const MAX_DELIVERIES: u32 = 256;

/// Long poll for deliveries to this agent's store's printers. Answers as soon as work
/// exists, or with no deliveries after `wait_ms`. Unconfirmed deliveries handed to this
/// agent come back, as a new attempt, when it restarted (new `session`, once the earlier
/// process is quiet) or missed the deadline. A session older than the newest one of its
/// agent id is answered 409 `agent_superseded`: another process with the same agent id
/// took over, and this one must stop.
#[utoipa::path(post, path = "/v1/agent/poll", operation_id = "agent_poll", tag = "store agent", request_body = PollIn,
    security(("agent" = [])),
    responses((status = 200, body = DeliveryList), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 409, body = ErrorBody)))]
pub async fn poll(
    State(st): State<AppState>,
    AgentAuth(who): AgentAuth,
    JsonBody(req): JsonBody<PollIn>,
) -> Result<Json<DeliveryList>, ApiError> {
    validate_id("agent_id", &req.agent_id)?;
    if let Some(s) = &req.session {
        validate_id("session", s)?;
    }
    let wait = req.wait_ms.unwrap_or(25_000).min(MAX_WAIT_MS);
    let max = req.max.unwrap_or(16).clamp(1, MAX_DELIVERIES) as usize;
    let deliveries = st
        .agents
        .poll(&who, &req.agent_id, req.session.as_deref(), req.session_age_ms, Duration::from_millis(wait), max)
        .await?;
    Ok(Json(DeliveryList { deliveries: deliveries.into_iter().map(DeliveryOut::from).collect() }))
}

/// Acknowledge delivery outcomes. Never refused for the agent's rate limit: an ack finishes
/// work. Idempotent: an ack for an older attempt or a finished
/// task changes nothing (`stale`); a repeated ack is `duplicate`. Extension (agent protocol
/// 2): with `next`, the answer also hands out the next task of each printer whose task in
/// flight these acks end (`deliveries`, as a poll's), in the same commit as the acks, so
/// that a busy printer's next job needs no poll.
#[utoipa::path(post, path = "/v1/agent/acks", operation_id = "agent_acks", tag = "store agent", request_body = AcksIn,
    security(("agent" = [])),
    responses((status = 200, body = AckResults), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)))]
pub async fn acks(
    State(st): State<AppState>,
    AgentAuth(who): AgentAuthUnmetered,
    JsonBody(req): JsonBody<AcksIn>,
) -> Result<Json<AckResults>, ApiError> {
    if req.acks.len() > 1000 {
        return Err(ApiError::invalid("acks: at most 1000 per request"));
    }
    let agent_id = req.agent_id.clone().unwrap_or_else(|| "unknown".into());
    validate_id("agent_id", &agent_id)?;
    if let Some(s) = &req.session {
        validate_id("session", s)?;
    }
    let mut acks = Vec::with_capacity(req.acks.len());
    for (i, a) in req.acks.iter().enumerate() {
        let outcome = Outcome::parse(&a.outcome).ok_or_else(|| {
            ApiError::invalid(format!(
                "acks[{i}].outcome: unknown outcome {:?}; one of {}",
                a.outcome,
                Outcome::ALL.map(Outcome::as_str).join(", ")
            ))
        })?;
        // An agent reports every failure after the first byte of a job as `in_doubt`
        // (docs/RESULT-CODES.md, "Store agent"): its outcomes say what they prove.
        let detail: String = a.detail.clone().unwrap_or_default().chars().take(500).collect();
        acks.push(AckIn::agent(a.task_id.clone(), a.attempt, outcome, detail));
    }
    let ids: Vec<String> = acks.iter().map(|a| a.task_id.clone()).collect();
    let next = req.next.unwrap_or(0).min(MAX_DELIVERIES) as usize;
    let (results, deliveries) = st.agents.ack_and_take(&who, &agent_id, req.session.as_deref(), acks, next).await?;
    Ok(Json(AckResults {
        results: ids
            .into_iter()
            .zip(results)
            .map(|(task_id, r)| AckResultOut { task_id, result: r.as_str().to_owned() })
            .collect(),
        deliveries: req.next.is_some().then(|| deliveries.into_iter().map(DeliveryOut::from).collect()),
    }))
}

/// Extension: the status of the store's idle printers, as the agent read it with
/// `DLE EOT` between jobs, every few seconds and at once when it changes. Each
/// printer's `online`, `last_seen_at` and `last_error` follow (`ready` clears the error);
/// reports on printers that are not the store's enabled agent printers are ignored. The
/// answer lists the printers the agent should watch, so an agent learns them without
/// waiting for a job. A store whose agents all fall silent has its agent printers shown
/// `offline` with `last_error` `"agent offline"` and an `agent.offline` alert.
#[utoipa::path(post, path = "/v1/agent/status", operation_id = "agent_status", tag = "store agent", request_body = StatusIn,
    security(("agent" = [])),
    responses((status = 200, body = WatchList), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)))]
pub async fn status(
    State(st): State<AppState>,
    AgentAuth(who): AgentAuth,
    JsonBody(req): JsonBody<StatusIn>,
) -> Result<Json<WatchList>, ApiError> {
    validate_id("agent_id", &req.agent_id)?;
    if let Some(s) = &req.session {
        validate_id("session", s)?;
    }
    if req.printers.len() > MAX_REPORTS {
        return Err(ApiError::invalid(format!("printers: at most {MAX_REPORTS} per request")));
    }
    let mut reports = Vec::with_capacity(req.printers.len());
    for (i, p) in req.printers.into_iter().enumerate() {
        let status = IdleStatus::parse(&p.status).ok_or_else(|| {
            ApiError::invalid(format!(
                "printers[{i}].status: {:?} is not one of ready, no_paper, cover_open, paper_jam, offline",
                p.status
            ))
        })?;
        reports.push((p.printer_id, status));
    }
    let watched = st.watch.report(&who, &req.agent_id, req.session.as_deref(), &reports).await?;
    Ok(Json(WatchList {
        printers: watched
            .into_iter()
            .map(|w| WatchedOut { printer_id: w.printer_id, printer_address: w.address })
            .collect(),
    }))
}

/// The request header of a forwarded LAN submission naming the printer the agent would
/// print a station task on, had it accepted the task offline.
pub const LAN_PRINTER_HEADER: &str = "onceprint-lan-printer";

/// Extension: a task submission the store agent forwards from its shop's LAN (a POS
/// pointed at the agent). The body and every answer are those of `POST /v1/print-tasks`
/// — `missing_biz_no` first, 201 new, 200 duplicate, 422 mismatch — for the agent's
/// tenant; the target must be a printer or station of the agent's own store (any other is
/// answered 404 `not_found`, as if it did not exist). A station task goes where the
/// agent would print it offline: the printer named in the `Onceprint-Lan-Printer` header
/// when it is an enabled printer of the station, else the station's first enabled printer
/// that the agent drives, else its first enabled one. The audit trail names the agent's
/// store as the submitter (`agent:STORE`).
#[utoipa::path(post, path = "/v1/agent/print-tasks", operation_id = "agent_submit", tag = "store agent",
    request_body = crate::dto::SubmitTask,
    security(("agent" = [])),
    responses(
        (status = 201, description = "a new task was created", body = crate::dto::SubmitOut),
        (status = 200, description = "duplicate: the existing task, nothing created or charged", body = crate::dto::SubmitOut),
        (status = 400, description = "`missing_biz_no`, `invalid_request` or `invalid_content`", body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, description = "`not_found`: `printer_id` or `station_id` names no printer or station of the \
            agent's store", body = ErrorBody),
        (status = 409, description = "`printer_disabled`", body = ErrorBody),
        (status = 413, body = ErrorBody),
        (status = 422, description = "`idempotency_mismatch`: same key, different content", body = ErrorBody)))]
pub async fn submit(
    State(st): State<AppState>,
    AgentAuth(agent): AgentAuth,
    headers: axum::http::HeaderMap,
    crate::extract::JsonBytes(bytes): crate::extract::JsonBytes,
) -> Result<(axum::http::StatusCode, axum::http::HeaderMap, Json<crate::dto::SubmitOut>), ApiError> {
    // The printer the agent would print a station task on offline: honoured when it is an
    // enabled printer of the station, so both paths share one delivery key.
    let lan_printer = headers
        .get(LAN_PRINTER_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|p| validate_id("printer_id", p).is_ok())
        .map(str::to_owned);
    let who = crate::routes::tasks::Submitter {
        actor: Some(format!("agent:{}", agent.store_id)),
        store_scope: Some(agent.store_id),
        tenant_id: agent.tenant_id,
        lan_printer,
    };
    crate::routes::tasks::submit_counted(&st, who, &bytes).await
}
