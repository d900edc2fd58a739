//! LAN intake (`--listen`): the task submission API of CONTRACT.md, served by the store
//! agent to its own shop's POS, authenticated with a LAN key the tenant created for the
//! store (`POST /v1/stores/{id}/lan-keys`).
//!
//! While the broker answers, a submission is forwarded to it (`POST /v1/agent/print-tasks`)
//! and the POS gets the broker's own answer, byte for byte. When no answer comes within
//! `--offline-after-ms` (or the broker answers 5xx), the agent accepts the task itself:
//! same answers (`missing_biz_no` first, 201 new, 200 duplicate, 422 mismatch), durable in
//! the offline outbox before the answer, printed through the same per-printer workers and
//! the same journal, and handed to the broker once it is back (see `offline`).
//!
//! The idempotency key of an offline task is the broker's (target, business number,
//! print type), and the key its deliveries carry is the broker's delivery key, so a task
//! that reached both the cloud and the shop prints once: the outbox answers retries on the
//! LAN, the journal answers the cloud's delivery by key, and the broker merges the two
//! under one key on sync.

use crate::broker::BrokerClient;
use crate::cache::{OfflineCache, StoreDirectory};
use crate::outbox::{Inserted, OfflineTask, Outbox};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use onceprint_core::{ids::validate_biz_no, Content, ContentLimits, CoreError, Target};
use serde::Deserialize;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// After a forward failed, further submissions go straight to the offline path for this
/// long instead of each waiting `--offline-after-ms` for a broker that just failed.
const DOWN_FOR: Duration = Duration::from_secs(5);

/// Everything a LAN request needs.
#[derive(Clone)]
pub(crate) struct LanState {
    pub client: BrokerClient,
    pub cache: OfflineCache,
    pub outbox: Outbox,
    pub offline_after: Duration,
    /// Until when the broker is taken to be down (set by a failed forward).
    pub down_until: Arc<Mutex<Option<Instant>>>,
    /// Wakes the local lane (a new offline task).
    pub wake: Arc<Notify>,
}

pub(crate) fn router(state: LanState) -> Router {
    Router::new().route("/v1/print-tasks", post(submit)).route("/healthz", get(health)).with_state(state)
}

/// A submission's fields (CONTRACT.md); the content is kept as JSON for the upload.
#[derive(Debug, Deserialize)]
struct LanSubmit {
    biz_no: Option<String>,
    printer_id: Option<String>,
    station_id: Option<String>,
    print_type: Option<String>,
    content: Option<serde_json::Value>,
}

fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    let body = serde_json::json!({"error": {"code": code, "message": message.into()}});
    (status, axum::Json(body)).into_response()
}

fn core_error(e: CoreError) -> Response {
    match e {
        CoreError::MissingBizNo => error(
            StatusCode::BAD_REQUEST,
            "missing_biz_no",
            "biz_no is required: send the order or serial number that identifies this print (e.g. \"A1001#kitchen\")",
        ),
        other => error(StatusCode::BAD_REQUEST, "invalid_request", other.to_string()),
    }
}

/// The answer for a task the outbox holds (created now, or found under the key).
fn answer(task: &OfflineTask, created: bool) -> Response {
    let (status, message) = if created {
        (
            StatusCode::CREATED,
            "task accepted by the store agent while the broker is unreachable; it prints on the shop's printer \
             and is handed to the broker once it is back"
                .to_owned(),
        )
    } else {
        (
            StatusCode::OK,
            format!(
                "duplicate of task {} (state {}), accepted by the store agent while the broker was unreachable; \
                 nothing was created",
                task.task_id,
                task.state.task_state()
            ),
        )
    };
    let body = serde_json::json!({
        "task_id": task.task_id,
        "state": task.state.task_state(),
        "duplicate": !created,
        "message": message,
        "biz_no": task.biz_no,
        "print_type": task.print_type,
    });
    let mut resp = (status, axum::Json(body)).into_response();
    if let Ok(v) = HeaderValue::from_str(&format!("/v1/print-tasks/{}", task.task_id)) {
        resp.headers_mut().insert(header::LOCATION, v);
    }
    resp.headers_mut().insert("x-onceprint-offline", HeaderValue::from_static("accepted-by-agent"));
    resp
}

/// A retry of a task the outbox holds: 200 with the same content, 422 with other.
fn answer_existing(task: &OfflineTask, fingerprint: &str) -> Response {
    if task.fingerprint != fingerprint {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "idempotency_mismatch",
            format!(
                "task {} already exists for this biz_no, target and print_type with different content; send \
                 the same content to retry, or a new biz_no for a new print",
                task.task_id
            ),
        );
    }
    answer(task, false)
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then_some(token.trim())
}

async fn health(State(st): State<LanState>) -> Response {
    let down = st.down_until.lock().ok().and_then(|d| *d).is_some_and(|t| t > Instant::now());
    let unsynced = st.outbox.unsynced().await.unwrap_or(0);
    let body = serde_json::json!({
        "status": "ok",
        "broker": if down { "unreachable" } else { "reachable" },
        "offline_tasks_not_synced": unsynced,
        "directory": st.cache.directory().is_some(),
    });
    (StatusCode::OK, axum::Json(body)).into_response()
}

async fn submit(State(st): State<LanState>, headers: HeaderMap, body: Bytes) -> Response {
    let Some(lan_key_id) = bearer(&headers).and_then(|k| st.cache.lan_key_id(k)) else {
        return error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "send a LAN key of this store as `Authorization: Bearer opl_…` (created with \
             POST /v1/stores/{id}/lan-keys; the agent learns new keys within a minute while the broker is reachable)",
        );
    };
    // The business number first (R1), whatever else is wrong with the body.
    let value: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return error(StatusCode::BAD_REQUEST, "invalid_request", format!("the body is not JSON: {e}")),
    };
    if !value.is_object() {
        return error(StatusCode::BAD_REQUEST, "invalid_request", "the body must be a JSON object");
    }
    let biz_raw = value.get("biz_no").and_then(|b| b.as_str()).map(str::to_owned);
    if let Err(e) = validate_biz_no(biz_raw.as_deref()) {
        return core_error(e);
    }
    let req: LanSubmit = match serde_json::from_value(value) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, "invalid_request", e.to_string()),
    };
    let biz_no = match validate_biz_no(req.biz_no.as_deref()) {
        Ok(b) => b.to_owned(),
        Err(e) => return core_error(e),
    };
    let target = match Target::from_request(req.printer_id.as_deref(), req.station_id.as_deref()) {
        Ok(t) => t,
        Err(e) => return core_error(e),
    };
    let directory = st.cache.directory();
    let default_type = directory
        .as_ref()
        .map(|d| d.default_print_type.clone())
        .unwrap_or_else(|| onceprint_core::policy::DEFAULT_PRINT_TYPE.to_owned());
    let print_type = req.print_type.clone().unwrap_or(default_type);
    let content: Content = match req.content.clone().map(serde_json::from_value) {
        Some(Ok(c)) => c,
        Some(Err(e)) => return error(StatusCode::BAD_REQUEST, "invalid_request", format!("content: {e}")),
        None => return core_error(CoreError::invalid("content", "is required")),
    };
    let canonical = match content.canonicalize(ContentLimits::default()) {
        Ok(c) => c,
        Err(e) => return core_error(e),
    };
    let fingerprint = canonical.fingerprint().0;

    // A task this agent accepted offline and has not handed over yet is answered from
    // the outbox: the broker does not know it.
    let known = match st.outbox.find(&target.key_part(), &biz_no, &print_type).await {
        Ok(k) => k,
        Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, "unavailable", e.to_string()),
    };
    if let Some(task) = known.as_ref().filter(|t| !t.synced) {
        return answer_existing(task, &fingerprint);
    }

    // Online: the broker's own answer.
    let down = st.down_until.lock().ok().and_then(|d| *d).is_some_and(|t| t > Instant::now());
    if !down {
        match st.client.forward_submission(body.to_vec(), st.offline_after).await {
            Ok(f) => {
                if let Ok(mut d) = st.down_until.lock() {
                    *d = None;
                }
                let mut resp =
                    (StatusCode::from_u16(f.status).unwrap_or(StatusCode::BAD_GATEWAY), f.body).into_response();
                resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
                if let Some(v) = f.location.and_then(|l| HeaderValue::from_str(&l).ok()) {
                    resp.headers_mut().insert(header::LOCATION, v);
                }
                return resp;
            }
            Err(e) => {
                tracing::warn!(error = %e, biz_no = %biz_no, "the broker did not answer the LAN submission; accepting it offline");
                if let Ok(mut d) = st.down_until.lock() {
                    *d = Some(Instant::now() + DOWN_FOR);
                }
            }
        }
    }
    // Offline, a task the broker has (handed over earlier) is still answered from here.
    if let Some(task) = &known {
        return answer_existing(task, &fingerprint);
    }
    accept_offline(&st, directory, lan_key_id, biz_no, target, print_type, &canonical, fingerprint, &body).await
}

/// The offline path of a new submission: checked against the saved directory as the
/// broker would check it, then made durable in the outbox and woken up for printing.
#[allow(clippy::too_many_arguments)]
async fn accept_offline(
    st: &LanState,
    directory: Option<StoreDirectory>,
    lan_key_id: String,
    biz_no: String,
    target: Target,
    print_type: String,
    canonical: &onceprint_core::content::CanonicalContent,
    fingerprint: String,
    body: &[u8],
) -> Response {
    let Some(dir) = directory else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "the broker is unreachable and this agent has not yet fetched its store's directory, so it cannot \
             accept tasks offline; retry later",
        );
    };
    if !dir.print_types.is_empty() && !dir.print_types.contains(&print_type) {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            format!("print_type: unknown print type {print_type:?}; one of {}", dir.print_types.join(", ")),
        );
    }
    let printer = match &target {
        Target::Printer(p) => match dir.printers.iter().find(|x| x.printer_id == *p) {
            None => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request",
                    format!("printer_id: no printer {p:?} in store {:?}", dir.store_id),
                )
            }
            Some(x) if !x.enabled => {
                return error(
                    StatusCode::CONFLICT,
                    "printer_disabled",
                    format!("printer_id: printer {p:?} is disabled and takes no new tasks"),
                )
            }
            Some(x) => x.clone(),
        },
        Target::Station(s) => {
            let Some(station) = dir.stations.iter().find(|x| x.station_id == *s) else {
                return error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request",
                    format!("station_id: no station {s:?} in store {:?}", dir.store_id),
                );
            };
            let first = station
                .printers
                .iter()
                .filter_map(|id| dir.printers.iter().find(|x| x.printer_id == *id))
                .find(|x| x.enabled && x.agent);
            match first {
                Some(x) => x.clone(),
                None => {
                    return error(
                        StatusCode::CONFLICT,
                        "printer_disabled",
                        format!("station_id: no enabled printer of station {s:?} is driven by this store agent"),
                    )
                }
            }
        }
    };
    if !printer.agent {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            format!(
                "printer {:?} is not driven by this store agent, and the broker that reaches it is unreachable; \
                 retry later",
                printer.printer_id
            ),
        );
    }
    // A task that could never print is refused now, with the field named, as the broker
    // refuses it.
    if let Err(e) = onceprint_render::stored::escpos_for(
        canonical.content_type,
        canonical.bytes.clone(),
        None,
        printer.profile.as_deref(),
    ) {
        return error(StatusCode::BAD_REQUEST, "invalid_content", format!("content: {e}"));
    }
    let now = now_ms();
    let task = OfflineTask {
        task_id: onceprint_core::TaskId::from_parts(now, rand::random::<[u8; 10]>()).into_string(),
        target: target.key_part(),
        biz_no: biz_no.clone(),
        print_type: print_type.clone(),
        fingerprint: fingerprint.clone(),
        request: String::from_utf8_lossy(body).into_owned(),
        printer_id: printer.printer_id.clone(),
        delivery_key: onceprint_core::key::delivery_key(&biz_no, &printer.printer_id, &target.key_part(), &print_type),
        lan_key_id,
        accepted_at: now,
        state: crate::outbox::LocalState::Accepted,
        attempt: 0,
        next_at: now,
        detail: String::new(),
        history: Vec::new(),
        synced: false,
    };
    match st.outbox.insert(task).await {
        Ok(Inserted::Created(t)) => {
            tracing::info!(task_id = %t.task_id, biz_no = %t.biz_no, printer_id = %t.printer_id, "accepted offline");
            st.wake.notify_one();
            answer(&t, true)
        }
        Ok(Inserted::Existing(t)) => answer_existing(&t, &fingerprint),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, "unavailable", format!("not accepted: {e}")),
    }
}

pub(crate) fn now_ms() -> i64 {
    crate::wall_ms()
}
