//! LAN intake (`--listen`): the task submission API (docs/API.md), served by the store
//! agent to its own shop's POS, authenticated with a LAN key the tenant created for the
//! store (`POST /v1/stores/{id}/lan-keys`).
//!
//! While the broker answers, a submission is forwarded to it (`POST /v1/agent/print-tasks`)
//! and the POS gets the broker's own answer, byte for byte. When no answer comes within
//! `--offline-after-ms` (or the broker answers 5xx), the agent accepts the task itself:
//! same answers (`missing_biz_no` first, 201 new, 200 duplicate, 422 mismatch, 413 past
//! the broker's body limit), durable in the offline outbox before the answer, printed
//! through the same per-printer workers and the same journal, and handed to the broker
//! once it is back (see `offline`).
//!
//! One key, one copy, whichever path a ticket takes:
//! - the idempotency key of an offline task is the broker's (target, business number,
//!   print type), and the key its deliveries carry is the broker's delivery key;
//! - a station task goes to the printer [`onceprint_core::offline::station_printer`]
//!   chooses for a LAN submission, and the forward names it (`Onceprint-Lan-Printer`), so
//!   that a task the broker took and the agent also took (its answer came too late) has
//!   one printer and one delivery key: the journal prints it once;
//! - the broker's answer to a forwarded submission is remembered, so a retry during an
//!   outage gets the broker's task (200), not a new one;
//! - one agent per store takes LAN orders (the broker's LAN listener claim); another
//!   refuses them, naming the one that takes them.
//!
//! The outbox answers retries on the LAN, the journal answers the cloud's delivery by key,
//! and the broker merges the two under one key on sync.

use crate::cache::{ListenerClaim, OfflineCache, StoreDirectory};
use crate::outbox::{Forwarded, Inserted, OfflineTask, Outbox};
use crate::upstream::Upstream;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use onceprint_core::offline::{station_printer, StationMember};
use onceprint_core::{ids::validate_biz_no, Content, CoreError, Target};
use serde::Deserialize;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// After a forward failed, further submissions go straight to the offline path for this
/// long instead of each waiting `--offline-after-ms` for a broker that just failed.
const DOWN_FOR: Duration = Duration::from_secs(5);

/// The request header of a forward naming the printer this agent would print a station
/// task on (the broker's `LAN_PRINTER_HEADER`).
pub(crate) const LAN_PRINTER_HEADER: &str = "onceprint-lan-printer";

/// Everything a LAN request needs.
#[derive(Clone)]
pub(crate) struct LanState {
    /// The broker (its HTTP client; in the simulation, its engine over a simulated
    /// network).
    pub client: Arc<dyn Upstream>,
    pub cache: OfflineCache,
    pub outbox: Outbox,
    pub offline_after: Duration,
    /// Until when the broker is taken to be down (set by a failed forward).
    pub down_until: Arc<Mutex<Option<Instant>>>,
    /// Wakes the local lane (a new offline task).
    pub wake: Arc<Notify>,
}

pub(crate) fn router(state: LanState) -> Router {
    // The body limit is the broker's (from the store directory), applied in the handler
    // with the broker's 413 answer; the framework's own limit would answer in plain text.
    Router::new()
        .route("/v1/print-tasks", post(submit))
        .route("/healthz", get(health))
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(state)
}

/// A submission's fields (docs/API.md); the content is kept as JSON for the upload.
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

/// 413 `payload_too_large` as the broker answers it, closing the connection (the rest of
/// the body is never read).
fn too_large(limit: usize) -> Response {
    let mut resp = error(
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        onceprint_core::content::body_too_large_message(limit),
    );
    resp.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

/// An answer given by the agent itself while the broker is unreachable: 201 for a task it
/// created, 200 for a retry of one it knows (its own, or the broker's answer to an earlier
/// forward).
fn answer(task_id: &str, state: &str, biz_no: &str, print_type: &str, created: bool, message: String) -> Response {
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    let body = serde_json::json!({
        "task_id": task_id,
        "state": state,
        "duplicate": !created,
        "message": message,
        "biz_no": biz_no,
        "print_type": print_type,
    });
    let mut resp = (status, axum::Json(body)).into_response();
    if let Ok(v) = HeaderValue::from_str(&format!("/v1/print-tasks/{task_id}")) {
        resp.headers_mut().insert(header::LOCATION, v);
    }
    resp.headers_mut().insert("x-onceprint-offline", HeaderValue::from_static("accepted-by-agent"));
    resp
}

/// The answer for a task the outbox holds (created now, or found under the key).
fn answer_task(task: &OfflineTask, created: bool) -> Response {
    let message = if created {
        "task accepted by the store agent while the broker is unreachable; it prints on the shop's printer \
         and is handed to the broker once it is back"
            .to_owned()
    } else {
        format!(
            "duplicate of task {} (state {}), accepted by the store agent while the broker was unreachable; \
             nothing was created",
            task.task_id,
            task.state.task_state()
        )
    };
    answer(&task.task_id, task.state.task_state(), &task.biz_no, &task.print_type, created, message)
}

fn mismatch(task_id: &str) -> Response {
    error(
        StatusCode::UNPROCESSABLE_ENTITY,
        "idempotency_mismatch",
        format!(
            "task {task_id} already exists for this biz_no, target and print_type with different content; send \
             the same content to retry, or a new biz_no for a new print"
        ),
    )
}

/// A retry of a task the outbox holds: 200 with the same content, 422 with other.
fn answer_existing(task: &OfflineTask, fingerprint: &str) -> Response {
    if task.fingerprint != fingerprint {
        return mismatch(&task.task_id);
    }
    answer_task(task, false)
}

/// A retry, while the broker is unreachable, of a submission the broker answered through
/// this agent: its task, never a new one.
fn answer_forwarded(f: &Forwarded, fingerprint: &str) -> Response {
    if f.fingerprint != fingerprint {
        return mismatch(&f.task_id);
    }
    let message = format!(
        "duplicate of task {} (state {} when the broker last answered), answered by the store agent while the \
         broker is unreachable; nothing was created",
        f.task_id, f.state
    );
    answer(&f.task_id, &f.state, &f.biz_no, &f.print_type, false, message)
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then_some(token.trim())
}

/// `GET /healthz` of the LAN listener: whether the broker answers (as the agent's last
/// requests found: polls, syncs, forwards, probes), what the agent holds for it, and
/// whether this agent takes the store's LAN orders. Fields: README, "LAN listener".
async fn health(State(st): State<LanState>) -> Response {
    let reach = st.client.reachability();
    let unsynced = st.outbox.unsynced().await.unwrap_or(0);
    let rejected = st.outbox.rejected().await.unwrap_or(0);
    let (listener, holder) = match st.cache.listener() {
        Some(ListenerClaim::Held) => ("this_agent", None),
        Some(ListenerClaim::TakenBy { agent_id, .. }) => ("other_agent", Some(agent_id)),
        None => ("unknown", None),
    };
    let body = serde_json::json!({
        "status": "ok",
        "broker": match reach.reachable {
            Some(true) => "reachable",
            Some(false) => "unreachable",
            None => "unknown",
        },
        "broker_last_answer_ms_ago": reach.last_answer_ago.map(|d| d.as_millis() as u64),
        "broker_error": reach.last_error,
        "offline_tasks_not_synced": unsynced,
        "offline_tasks_rejected": rejected,
        "directory": st.cache.directory().is_some(),
        "lan_keys": st.cache.knows_lan_keys(),
        "lan_listener": listener,
        "lan_listener_agent": holder,
    });
    (StatusCode::OK, axum::Json(body)).into_response()
}

/// Reads the body up to `limit` bytes; a larger one is answered 413. The rest of a larger
/// body is read and dropped up to [`DRAIN_FACTOR`] times the limit, so that a POS that
/// sent a little too much gets the answer rather than a broken connection; past that the
/// connection is closed.
async fn read_body(req: Request, limit: usize) -> Result<Bytes, Response> {
    use http_body_util::BodyExt;
    let mut body = req.into_body();
    let mut kept: Vec<u8> = Vec::new();
    let mut seen = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            error(StatusCode::BAD_REQUEST, "invalid_request", format!("the body could not be read: {e}"))
        })?;
        let Ok(data) = frame.into_data() else { continue };
        seen = seen.saturating_add(data.len());
        if seen <= limit {
            kept.extend_from_slice(&data);
        } else if seen > limit.saturating_mul(DRAIN_FACTOR) {
            break;
        }
    }
    if seen > limit {
        return Err(too_large(limit));
    }
    Ok(Bytes::from(kept))
}

/// How much of an oversize body is read (and dropped) before the 413, in limits.
const DRAIN_FACTOR: usize = 4;

/// Why a task cannot be taken, as its answer says it.
struct Refusal(StatusCode, &'static str, String);

impl From<Refusal> for Response {
    fn from(r: Refusal) -> Response {
        error(r.0, r.1, r.2)
    }
}

/// The printer of the store directory a task for `target` prints on when this agent
/// accepts it offline, or why none can; for a station, the one
/// [`onceprint_core::offline::station_printer`] chooses for a LAN submission.
fn printer_for<'d>(dir: &'d StoreDirectory, target: &Target) -> Result<&'d crate::cache::DirPrinter, Refusal> {
    match target {
        Target::Printer(p) => match dir.printers.iter().find(|x| x.printer_id == *p) {
            None => Err(Refusal(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                format!("printer_id: no printer {p:?} in store {:?}", dir.store_id),
            )),
            Some(x) if !x.enabled => Err(Refusal(
                StatusCode::CONFLICT,
                "printer_disabled",
                format!("printer_id: printer {p:?} is disabled and takes no new tasks"),
            )),
            Some(x) => Ok(x),
        },
        Target::Station(s) => {
            let Some(station) = dir.stations.iter().find(|x| x.station_id == *s) else {
                return Err(Refusal(
                    StatusCode::BAD_REQUEST,
                    "invalid_request",
                    format!("station_id: no station {s:?} in store {:?}", dir.store_id),
                ));
            };
            let printers: Vec<&crate::cache::DirPrinter> =
                station.printers.iter().filter_map(|id| dir.printers.iter().find(|x| x.printer_id == *id)).collect();
            let members: Vec<StationMember<'_>> = printers
                .iter()
                .map(|p| StationMember { printer_id: &p.printer_id, enabled: p.enabled, agent: p.agent })
                .collect();
            let chosen = station_printer(&members, true).and_then(|id| printers.iter().find(|p| p.printer_id == id));
            chosen.copied().ok_or_else(|| {
                Refusal(
                    StatusCode::CONFLICT,
                    "printer_disabled",
                    format!("station_id: every printer of station {s:?} is disabled"),
                )
            })
        }
    }
}

async fn submit(State(st): State<LanState>, req: Request) -> Response {
    let directory = st.cache.directory();
    let limit = directory.as_ref().map_or(onceprint_core::content::DEFAULT_MAX_BODY_BYTES, |d| d.body_limit());
    let headers = req.headers().clone();
    // A new agent that never reached the broker cannot tell a good LAN key from a wrong
    // one: the POS is told to retry, not that its key is wrong.
    if !st.cache.knows_lan_keys() {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "this store agent has not reached the broker yet, so it does not know the store's LAN keys; retry \
             once it has (its GET /healthz shows \"lan_keys\": true)",
        );
    }
    let Some(lan_key_id) = bearer(&headers).and_then(|k| st.cache.lan_key_id(k)) else {
        return error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "send a LAN key of this store as `Authorization: Bearer opl_…` (created with \
             POST /v1/stores/{id}/lan-keys; the agent learns new keys within a minute while the broker is reachable)",
        );
    };
    if let Some(ListenerClaim::TakenBy { message, .. }) = st.cache.listener() {
        return error(StatusCode::SERVICE_UNAVAILABLE, "lan_listener_taken", message);
    }
    let body = match read_body(req, limit).await {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    // The business number first, whatever else is wrong with the body.
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
    let limits = directory.as_ref().map(StoreDirectory::content_limits).unwrap_or_default();
    let canonical = match content.canonicalize(limits) {
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
    // Where this agent would print it, should it accept it offline: the forward names it,
    // so that the broker's task goes to the same printer.
    let lan_printer = match (&target, directory.as_ref()) {
        (Target::Station(_), Some(d)) => printer_for(d, &target).ok().map(|p| p.printer_id.clone()),
        _ => None,
    };

    // Online: the broker's own answer.
    let down = st.down_until.lock().ok().and_then(|d| *d).is_some_and(|t| t > Instant::now());
    if !down {
        match st.client.forward_submission(body.to_vec(), lan_printer.as_deref(), st.offline_after).await {
            Ok(f) => {
                if let Ok(mut d) = st.down_until.lock() {
                    *d = None;
                }
                if f.status == 200 || f.status == 201 {
                    remember(&st, &target, &biz_no, &print_type, &fingerprint, &f.body).await;
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
    // So is a submission the broker answered through this agent before the outage.
    match st.outbox.forwarded(&target.key_part(), &biz_no, &print_type).await {
        Ok(Some(f)) => return answer_forwarded(&f, &fingerprint),
        Ok(None) => {}
        Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, "unavailable", e.to_string()),
    }
    accept_offline(&st, directory, lan_key_id, biz_no, target, print_type, &canonical, fingerprint, &body).await
}

/// Remembers the broker's answer to a forwarded submission (its task id and state).
async fn remember(st: &LanState, target: &Target, biz_no: &str, print_type: &str, fingerprint: &str, body: &[u8]) {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let (Some(task_id), Some(state)) = (v["task_id"].as_str(), v["state"].as_str()) else { return };
    let f = Forwarded {
        target: target.key_part(),
        biz_no: biz_no.to_owned(),
        print_type: print_type.to_owned(),
        fingerprint: fingerprint.to_owned(),
        task_id: task_id.to_owned(),
        state: state.to_owned(),
        at: now_ms(),
    };
    if let Err(e) = st.outbox.remember_forwarded(f).await {
        tracing::warn!(error = %e, biz_no, "could not remember the broker's answer to a forwarded submission");
    }
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
    let printer = match printer_for(&dir, &target) {
        Ok(p) => p.clone(),
        Err(refusal) => return refusal.into(),
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
    let (clock_origin, clock_ms) = crate::boot_clock();
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
        clock_origin: clock_origin.to_owned(),
        clock_ms,
    };
    match st.outbox.insert(task).await {
        Ok(Inserted::Created(t)) => {
            tracing::info!(task_id = %t.task_id, biz_no = %t.biz_no, printer_id = %t.printer_id, "accepted offline");
            st.wake.notify_one();
            answer_task(&t, true)
        }
        Ok(Inserted::Existing(t)) => answer_existing(&t, &fingerprint),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, "unavailable", format!("not accepted: {e}")),
    }
}

pub(crate) fn now_ms() -> i64 {
    crate::wall_ms()
}
