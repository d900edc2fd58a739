//! Print task endpoints: submit (the idempotent heart of onceprint), read, list, audit.

use axum::extract::State;

use crate::extract::{Path, Query};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::Json;
use onceprint_core::{CoreError, TaskId, TaskState};
use onceprint_engine::{SubmitKind, SubmitRequest};
use onceprint_store::TaskQuery;

use crate::dto::*;
use crate::error::{ApiError, ErrorBody};
use crate::extract::{parse_json, JsonBytes, Principal};
use crate::metrics::SubmitOutcomeLabel;
use crate::AppState;

/// Decides between `missing_biz_no` and `invalid_request` for a body that did not parse
/// into [`SubmitTask`]: a missing or empty `biz_no` is always reported first.
fn refuse_unparsed(bytes: &[u8], err: ApiError) -> ApiError {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(bytes) else { return err };
    let Some(obj) = value.as_object() else {
        return ApiError::invalid("the body must be a JSON object");
    };
    match obj.get("biz_no") {
        None | Some(serde_json::Value::Null) => CoreError::MissingBizNo.into(),
        Some(serde_json::Value::String(s)) if s.trim().is_empty() => CoreError::MissingBizNo.into(),
        _ => err,
    }
}

/// Submit a print task. Any number of retries create exactly one task.
#[utoipa::path(post, path = "/v1/print-tasks", tag = "print tasks", request_body = SubmitTask,
    security(("tenant" = [])),
    responses(
        (status = 201, description = "a new task was created", body = SubmitOut),
        (status = 200, description = "duplicate: the existing task, nothing created or charged (`\"pruned\": true` when \
            retention pruned it: its final state is answered)", body = SubmitOut),
        (status = 400, description = "`missing_biz_no`, `invalid_request`, or `invalid_content` (a receipt document \
            that breaks a layout rule, content the target printer cannot print)", body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 404, description = "`not_found`: `printer_id` or `station_id` names no printer or station of the \
            tenant", body = ErrorBody),
        (status = 409, description = "`printer_disabled`: a new task for a disabled printer (or a station whose \
            printers are all disabled); a duplicate of an existing task is still answered 200", body = ErrorBody),
        (status = 413, body = ErrorBody),
        (status = 422, description = "`idempotency_mismatch`: same key, different content", body = ErrorBody)))]
pub async fn submit(
    State(st): State<AppState>,
    crate::extract::TenantAuthForIntake(auth): crate::extract::TenantAuthForIntake,
    JsonBytes(bytes): JsonBytes,
) -> Result<(StatusCode, HeaderMap, Json<SubmitOut>), ApiError> {
    submit_counted(
        &st,
        Submitter { tenant_id: auth.tenant_id, store_scope: None, actor: None, lan_printer: None },
        &bytes,
    )
    .await
}

/// Who submits: a tenant's API key, or a store agent forwarding from its shop's LAN
/// (scoped to its store, named in the audit trail).
pub(crate) struct Submitter {
    pub tenant_id: String,
    pub store_scope: Option<String>,
    pub actor: Option<String>,
    /// For a forwarded LAN submission: the printer the agent would print it on.
    pub lan_printer: Option<String>,
}

/// One submission, answered and counted in the metrics: the one path of every submit
/// endpoint, so that they answer alike.
pub(crate) async fn submit_counted(
    st: &AppState,
    who: Submitter,
    bytes: &[u8],
) -> Result<(StatusCode, HeaderMap, Json<SubmitOut>), ApiError> {
    let result = match parse_submission(bytes) {
        Ok(req) => {
            let (request, echo) = intake_request(who, req);
            answer_of(st.intake.submit(request).await.map_err(ApiError::from), echo)
        }
        Err(e) => Err(e),
    };
    count(st, &result);
    result.map(|(status, headers, out)| (status, headers, Json(out)))
}

/// The body of one submission, with `missing_biz_no` before any other refusal.
fn parse_submission(bytes: &[u8]) -> Result<SubmitTask, ApiError> {
    parse_json(bytes).map_err(|e| refuse_unparsed(bytes, e))
}

/// What the answer repeats of the request: its `biz_no` and print type.
struct Echo {
    biz_no: String,
    print_type: String,
}

fn intake_request(who: Submitter, req: SubmitTask) -> (SubmitRequest, Echo) {
    let echo = Echo {
        biz_no: req.biz_no.clone().unwrap_or_default(),
        print_type: req.print_type.clone().unwrap_or_else(|| onceprint_core::policy::DEFAULT_PRINT_TYPE.to_owned()),
    };
    let request = SubmitRequest {
        tenant_id: who.tenant_id,
        biz_no: req.biz_no,
        printer_id: req.printer_id,
        station_id: req.station_id,
        print_type: req.print_type,
        content: req.content,
        store_scope: who.store_scope,
        actor: who.actor,
        lan_printer: who.lan_printer,
    };
    (request, echo)
}

/// One submission's answer before it becomes a response: status, headers, body.
type Answered = Result<(StatusCode, HeaderMap, SubmitOut), ApiError>;

/// Counts one submission's answer in the metrics.
fn count(st: &AppState, result: &Answered) {
    let label = match result {
        Ok((StatusCode::CREATED, _, _)) => SubmitOutcomeLabel::Created,
        Ok((_, headers, _)) if headers.get("x-onceprint-gate").is_some_and(|v| v == "shared") => {
            SubmitOutcomeLabel::DuplicateSharedGate
        }
        Ok((_, headers, _)) if headers.contains_key("x-onceprint-gate") => SubmitOutcomeLabel::DuplicateGate,
        Ok(_) => SubmitOutcomeLabel::Duplicate,
        Err(e) if e.code == "idempotency_mismatch" => SubmitOutcomeLabel::Mismatch,
        Err(e) if e.code == "too_many_requests" => SubmitOutcomeLabel::RateLimited,
        Err(e) if e.status.is_server_error() => SubmitOutcomeLabel::Error,
        Err(_) => SubmitOutcomeLabel::Rejected,
    };
    st.metrics.submission(label);
}

/// The HTTP answer to intake's answer: status, headers and body.
fn answer_of(answer: Result<onceprint_engine::SubmitAnswer, ApiError>, echo: Echo) -> Answered {
    let answer = answer?;
    crate::request_id::record_task(&answer.task_id);
    let mut headers = HeaderMap::new();
    if let Ok(v) = HeaderValue::from_str(&format!("/v1/print-tasks/{}", answer.task_id)) {
        headers.insert(header::LOCATION, v);
    }
    let (status, duplicate, message) = match answer.kind {
        SubmitKind::Created => (StatusCode::CREATED, false, "task accepted; it prints asynchronously".to_owned()),
        SubmitKind::Duplicate if answer.pruned => (
            StatusCode::OK,
            true,
            format!(
                "duplicate of task {} (state {}), pruned after the retention period: only its final state is kept; \
                 nothing was created or charged",
                answer.task_id, answer.state
            ),
        ),
        SubmitKind::Duplicate if answer.state == TaskState::Printed => (
            StatusCode::OK,
            true,
            format!("duplicate of task {}, which has already printed; nothing was created or charged", answer.task_id),
        ),
        SubmitKind::Duplicate => (
            StatusCode::OK,
            true,
            format!("duplicate of task {} (state {}); nothing was created or charged", answer.task_id, answer.state),
        ),
    };
    if answer.from_gate {
        headers.insert("x-onceprint-gate", HeaderValue::from_static("memory"));
    } else if answer.from_shared_gate {
        headers.insert("x-onceprint-gate", HeaderValue::from_static("shared"));
    }
    Ok((
        status,
        headers,
        SubmitOut {
            task_id: answer.task_id,
            state: answer.state.as_str().to_owned(),
            duplicate,
            message,
            biz_no: echo.biz_no,
            print_type: echo.print_type,
            pruned: answer.pruned,
        },
    ))
}

/// Most submissions in one batch request.
pub const MAX_BATCH: usize = 500;

/// Extension: submit up to 500 print tasks in one request, for an order system
/// that sends an order's tickets together or catches up after an outage.
///
/// Each item is the body of `POST /v1/print-tasks` and is answered as that endpoint would
/// answer it alone (`status` 201 new, 200 duplicate, 400, 409, 422, 429 …), in the order
/// sent; the items are independent, so one refusal does not stop the others, and a retry
/// of the whole batch after a lost answer creates nothing twice. The new tasks of a batch
/// are committed together, in one transaction, and created in array order: tickets of one
/// batch for one printer print in the order sent. The answer comes once they are durable.
/// The whole body counts against the broker's body limit (`max_body_bytes`, 1 MiB by default).
#[utoipa::path(post, path = "/v1/print-task-batches", tag = "print tasks", request_body = SubmitBatch,
    security(("tenant" = [])),
    responses(
        (status = 200, description = "one result per item, in the order sent", body = BatchResults),
        (status = 400, description = "`invalid_request`: not a batch, or 0 or more than 500 items", body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 413, body = ErrorBody)))]
pub async fn submit_batch(
    State(st): State<AppState>,
    crate::extract::TenantAuthForIntake(auth): crate::extract::TenantAuthForIntake,
    JsonBytes(bytes): JsonBytes,
) -> Result<Json<BatchResults>, ApiError> {
    let batch: SubmitBatchRaw = parse_json(&bytes)?;
    if batch.tasks.is_empty() || batch.tasks.len() > MAX_BATCH {
        return Err(ApiError::invalid(format!(
            "tasks: {} items; a batch holds 1 to {MAX_BATCH} tasks",
            batch.tasks.len()
        )));
    }
    let mut slots: Vec<Option<Answered>> = Vec::with_capacity(batch.tasks.len());
    let mut requests = Vec::new();
    let mut echoes = Vec::new();
    for raw in &batch.tasks {
        match parse_submission(raw.get().as_bytes()) {
            Ok(req) => {
                let who =
                    Submitter { tenant_id: auth.tenant_id.clone(), store_scope: None, actor: None, lan_printer: None };
                let (request, echo) = intake_request(who, req);
                requests.push(request);
                echoes.push((slots.len(), echo));
                slots.push(None);
            }
            Err(e) => slots.push(Some(Err(e))),
        }
    }
    let answers = st.intake.submit_many(requests).await;
    for ((i, echo), answer) in echoes.into_iter().zip(answers) {
        slots[i] = Some(answer_of(answer.map_err(ApiError::from), echo));
    }
    let results = slots
        .into_iter()
        .map(|slot| {
            let result = slot.unwrap_or_else(|| {
                Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "a batch item was not answered"))
            });
            count(&st, &result);
            match result {
                Ok((status, _, out)) => {
                    BatchResult { status: status.as_u16(), task: Some(out), error: None, retry_after_secs: None }
                }
                Err(e) => BatchResult {
                    status: e.status.as_u16(),
                    task: None,
                    retry_after_secs: e.retry_after,
                    error: Some(crate::error::ErrorDetail { code: e.code.to_owned(), message: e.message }),
                },
            }
        })
        .collect();
    Ok(Json(BatchResults { results }))
}

/// One task of the calling tenant.
///
/// A LAN task id the store agent minted for an order the broker already had (offline
/// sync, `POST /v1/agent/offline-tasks`) answers with the task it was merged into.
///
/// A task pruned by retention (`retention_days`) answers 200 from its tombstone, with
/// `"pruned": true` and its final state.
#[utoipa::path(get, path = "/v1/print-tasks/{task_id}", tag = "print tasks", security(("tenant" = []), ("operator" = [])),
    params(("task_id" = String, Path)),
    responses((status = 200, body = TaskOut), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn get_task(
    State(st): State<AppState>,
    auth: Principal,
    Path(task_id): Path<String>,
) -> Result<Json<TaskOut>, ApiError> {
    match visible_task_or_alias(&st, &auth, &task_id).await? {
        Ok(task) => Ok(Json(task.into())),
        Err(tombstone) => Ok(Json(tombstone.into())),
    }
}

/// The caller's task (or tombstone) by its id or, failing that, by a LAN task id the store
/// agent minted for an order the broker had already: such an id is an alias of
/// the task it was merged into, and answers with that task.
async fn visible_task_or_alias(
    st: &AppState,
    auth: &Principal,
    task_id: &str,
) -> Result<Result<onceprint_store::Task, onceprint_store::Tombstone>, ApiError> {
    match crate::routes::manual::visible_task_or_tombstone(st, auth, task_id).await {
        Err(e) if e.status == StatusCode::NOT_FOUND && TaskId::parse(task_id).is_some() => {
            match st.store.task_alias(auth.tenant_id(), task_id).await? {
                Some(alias) => crate::routes::manual::visible_task_or_tombstone(st, auth, &alias.task_id).await,
                None => Err(e),
            }
        }
        found => found,
    }
}

/// List tasks, newest first, with cursor pagination.
#[utoipa::path(get, path = "/v1/print-tasks", tag = "print tasks", security(("tenant" = []), ("operator" = [])),
    params(TaskListParams),
    responses((status = 200, body = TaskList), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)))]
pub async fn list_tasks(
    State(st): State<AppState>,
    auth: Principal,
    Query(q): Query<TaskListParams>,
) -> Result<Json<TaskList>, ApiError> {
    // A staff member lists one of their stores: the one they have, or the one named.
    let store_id = match (&auth, q.store_id.filter(|s| !s.is_empty())) {
        (_, Some(s)) if !auth.may_see_store(&s) => return Err(ApiError::not_found(format!("no store {s:?}"))),
        (Principal::Operator(o), None) if o.operator.role == onceprint_store::OperatorRole::Staff => {
            match o.operator.store_ids.as_slice() {
                [one] => Some(one.clone()),
                _ => return Err(ApiError::invalid("store_id: is required for an operator of several stores")),
            }
        }
        (_, s) => s,
    };
    let limit = q.limit.unwrap_or(50);
    if !(1..=500).contains(&limit) {
        return Err(ApiError::invalid("limit: must be 1–500"));
    }
    let state = match q.state.as_deref() {
        None | Some("") => None,
        Some(s) => Some(TaskState::parse(s).ok_or_else(|| {
            ApiError::invalid(format!(
                "state: unknown state {s:?}; one of {}",
                TaskState::ALL.map(TaskState::as_str).join(", ")
            ))
        })?),
    };
    let cursor = match q.cursor.as_deref() {
        None | Some("") => None,
        Some(c) => {
            Some(TaskId::parse(c).ok_or_else(|| ApiError::invalid("cursor: not a cursor from this API"))?.into_string())
        }
    };
    let tasks = st
        .store
        .list_tasks(&TaskQuery {
            tenant_id: auth.tenant_id().to_owned(),
            store_id,
            state,
            biz_no: q.biz_no.filter(|s| !s.is_empty()),
            biz_no_prefix: None,
            limit,
            cursor,
            ..Default::default()
        })
        .await?;
    let next_cursor = if tasks.len() as i64 == limit { tasks.last().map(|t| t.task_id.clone()) } else { None };
    Ok(Json(TaskList { tasks: tasks.into_iter().map(Into::into).collect(), next_cursor }))
}

/// The audit trail of a task, oldest first (by its id, or a LAN task id merged into it).
///
/// A task pruned by retention lost its trail with it: 200 with no events and
/// `"pruned": true`.
#[utoipa::path(get, path = "/v1/print-tasks/{task_id}/events", tag = "print tasks", security(("tenant" = []), ("operator" = [])),
    params(("task_id" = String, Path)),
    responses((status = 200, body = EventList), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn task_events(
    State(st): State<AppState>,
    auth: Principal,
    Path(task_id): Path<String>,
) -> Result<Json<EventList>, ApiError> {
    let not_found = || ApiError::not_found(format!("no task {task_id:?}"));
    let task = match visible_task_or_alias(&st, &auth, &task_id).await? {
        Ok(task) => task,
        Err(_) => return Ok(Json(EventList { events: Vec::new(), pruned: true })),
    };
    match st.store.task_events(auth.tenant_id(), &task.task_id).await? {
        Some(events) => Ok(Json(EventList { events: events.into_iter().map(Into::into).collect(), pruned: false })),
        None => Err(not_found()),
    }
}
