//! The HTTP control endpoint: read and change faults at run time, count printed jobs.
//!
//! `GET /healthz`, `GET /faults`, `PUT /faults`, `GET /jobs`. Errors use the broker's
//! error body, `{"error": {"code", "message"}}`, so scripts handle both alike.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::faults::{FaultUpdate, FaultsHandle};
use crate::jobs::Jobs;

#[derive(Clone)]
struct Ctl {
    faults: FaultsHandle,
    jobs: Jobs,
}

/// The body of `PUT /faults`: the printer to change (all when left out) and the fields
/// of [`FaultUpdate`] to set.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FaultRequest {
    printer: Option<String>,
    paper_out: Option<bool>,
    cover_open: Option<bool>,
    offline: Option<bool>,
    crash_mid_job: Option<u32>,
    slow_ms: Option<u64>,
    clone: Option<bool>,
    duplicate_confirm: Option<u32>,
    lost_result: Option<u32>,
    lose_result: Option<u32>,
    duplicate_result: Option<u32>,
    disconnect_mid_job: Option<u32>,
    receive_twice: Option<u32>,
    power_cycle_forgets: Option<bool>,
    error_after_print: Option<u32>,
}

fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    (status, Json(json!({"error": {"code": code, "message": message.into()}}))).into_response()
}

async fn healthz() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

async fn get_faults(State(ctl): State<Ctl>) -> Json<serde_json::Value> {
    Json(json!({"printers": ctl.faults.all()}))
}

async fn put_faults(State(ctl): State<Ctl>, body: Bytes) -> Response {
    // Parsed by hand rather than with the `Json` extractor so that a bad body gets the
    // same error shape as everything else.
    let req: FaultRequest = match serde_json::from_slice(&body) {
        Ok(req) => req,
        Err(e) => return error(StatusCode::BAD_REQUEST, "invalid_request", e.to_string()),
    };
    let update = FaultUpdate {
        paper_out: req.paper_out,
        cover_open: req.cover_open,
        offline: req.offline,
        crash_mid_job: req.crash_mid_job,
        slow_ms: req.slow_ms,
        clone: req.clone,
        duplicate_confirm: req.duplicate_confirm,
        lost_result: req.lost_result,
        lose_result: req.lose_result,
        duplicate_result: req.duplicate_result,
        disconnect_mid_job: req.disconnect_mid_job,
        receive_twice: req.receive_twice,
        power_cycle_forgets: req.power_cycle_forgets,
        error_after_print: req.error_after_print,
    };
    match ctl.faults.update(req.printer.as_deref(), update) {
        Ok(changed) => {
            tracing::info!(printer = ?req.printer, ?update, "faults changed");
            Json(json!({"printers": changed})).into_response()
        }
        Err(e) => error(StatusCode::NOT_FOUND, "not_found", e.to_string()),
    }
}

async fn get_jobs(State(ctl): State<Ctl>) -> Json<serde_json::Value> {
    Json(json!({"jobs": ctl.jobs.count()}))
}

/// Serves the control endpoint until the simulator stops.
pub(crate) async fn serve(listener: TcpListener, faults: FaultsHandle, jobs: Jobs, mut stop: watch::Receiver<bool>) {
    let app = Router::new()
        .route("/healthz", get(healthz))
        .route("/faults", get(get_faults).put(put_faults))
        .route("/jobs", get(get_jobs))
        .with_state(Ctl { faults, jobs });
    let shutdown = async move {
        let _ = stop.wait_for(|&s| s).await;
    };
    if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(shutdown).await {
        tracing::error!(error = %e, "control endpoint failed");
    }
}
