//! The manual channel and the per-store attention list.

use axum::extract::State;

use crate::extract::Path;
use axum::http::StatusCode;
use axum::Json;
use onceprint_core::manual::ManualAction;
use onceprint_core::TaskId;
use onceprint_engine::{ActionRequest, Actor};
use onceprint_store::Task;

use crate::dto::{ActionIn, ActionOut, TaskList, TaskOut, TransferIn};
use crate::error::{ApiError, ErrorBody};
use crate::extract::{JsonBody, Principal};
use crate::AppState;

/// Who acts, from the authentication and the body: an operator token acts as its
/// operator (a body naming anyone else is refused); a tenant key acts as itself, with the
/// name of the person acting recorded beside it when the body gives one.
pub(crate) fn actor_of(principal: &Principal, named: Option<String>) -> Result<Actor, ApiError> {
    match principal {
        Principal::Operator(s) => match named.filter(|n| !n.is_empty()) {
            Some(n) if n != s.operator.id => Err(ApiError::forbidden(format!(
                "this operator token is {:?}'s; it cannot act as {n:?} (leave operator out)",
                s.operator.id
            ))),
            _ => Ok(Actor::Operator(s.operator.id.clone())),
        },
        Principal::Tenant(t) => Ok(Actor::ApiKey { key_id: t.key_id.clone(), name: named }),
    }
}

/// The task `task_id` as `principal` may see it: another store's task is `not_found`
/// for a staff member, as another tenant's is for everyone.
pub(crate) async fn visible_task(st: &AppState, principal: &Principal, task_id: &str) -> Result<Task, ApiError> {
    match visible_task_or_tombstone(st, principal, task_id).await? {
        Ok(task) => Ok(task),
        // Whatever needs the content or the trail (a reprint, a preview) or would change
        // an end state cannot be done any more: 410, not the 404 of a task never known.
        Err(_) => Err(ApiError::new(
            StatusCode::GONE,
            "task_pruned",
            format!(
                "task {task_id:?} ended long ago and was pruned after the retention period: only its final \
                 state is kept (GET /v1/print-tasks/{task_id})"
            ),
        )),
    }
}

/// The caller's task, or the tombstone of a pruned one (another tenant's, another
/// store's for a staff member, or an unknown one is `not_found`).
pub(crate) async fn visible_task_or_tombstone(
    st: &AppState,
    principal: &Principal,
    task_id: &str,
) -> Result<Result<Task, onceprint_store::Tombstone>, ApiError> {
    let not_found = || ApiError::not_found(format!("no task {task_id:?}"));
    let id = TaskId::parse(task_id).ok_or_else(not_found)?;
    if let Some(t) = st.store.get_task(principal.tenant_id(), id.as_str()).await? {
        return if principal.may_see_store(&t.store_id) { Ok(Ok(t)) } else { Err(not_found()) };
    }
    match st.store.get_tombstone(principal.tenant_id(), id.as_str()).await? {
        Some(b) if principal.may_see_store(&b.task.store_id) => Ok(Err(b)),
        _ => Err(not_found()),
    }
}

async fn act(
    st: AppState,
    principal: Principal,
    task_id: String,
    action: ManualAction,
    req: ActionIn,
) -> Result<(StatusCode, Json<ActionOut>), ApiError> {
    let actor = actor_of(&principal, req.operator)?;
    visible_task(&st, &principal, &task_id).await?;
    let outcome = st
        .operations
        .act(
            action,
            ActionRequest {
                tenant_id: principal.tenant_id().to_owned(),
                task_id,
                actor,
                reason: req.reason,
                printer_id: req.printer_id,
            },
        )
        .await?;
    let status = if outcome.created.is_some() { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(ActionOut { task: outcome.task.into(), created: outcome.created.map(TaskOut::from) })))
}

/// Print the task again as a numbered reprint attached to it (from `printed`, `closed`,
/// `failed`, `in_doubt`; a failed or in-doubt original is closed by it). The slip carries a
/// visible "REPRINT n" line. `printer_id` (optional) prints the copy on another enabled
/// printer of the same store, e.g. when the original's printer is dead.
///
/// Every manual action is audited with the authenticated actor: `operator:ID` with an
/// operator token (a body whose `operator` names someone else is refused with 403
/// `forbidden`), `api_key:ID` with a tenant key, the body's `operator` (when given) then
/// standing beside it in the reason. A staff member's token reaches only their stores' tasks (others are
/// `not_found`).
#[utoipa::path(post, path = "/v1/print-tasks/{task_id}/reprint", tag = "manual channel", request_body = ActionIn,
    security(("tenant" = []), ("operator" = [])), params(("task_id" = String, Path)),
    responses((status = 201, body = ActionOut), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 403, body = ErrorBody),
              (status = 404, description = "`not_found`: no such task, or `printer_id` is not a printer of the task's \
                  store", body = ErrorBody),
              (status = 409, description = "`invalid_transition`", body = ErrorBody),
              (status = 410, description = "`task_pruned`: the task was pruned after the retention period", body = ErrorBody)))]
pub async fn reprint(
    State(st): State<AppState>,
    auth: Principal,
    Path(task_id): Path<String>,
    JsonBody(req): JsonBody<ActionIn>,
) -> Result<(StatusCode, Json<ActionOut>), ApiError> {
    act(st, auth, task_id, ManualAction::Reprint, req).await
}

/// Close a `failed` or `in_doubt` task without printing: the paper is known to exist.
#[utoipa::path(post, path = "/v1/print-tasks/{task_id}/mark-printed", tag = "manual channel", request_body = ActionIn,
    security(("tenant" = []), ("operator" = [])), params(("task_id" = String, Path)),
    responses((status = 200, body = ActionOut), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 403, body = ErrorBody),
              (status = 404, description = "`not_found`: no such task", body = ErrorBody),
              (status = 409, description = "`invalid_transition`", body = ErrorBody),
              (status = 410, description = "`task_pruned`: the task was pruned after the retention period", body = ErrorBody)))]
pub async fn mark_printed(
    State(st): State<AppState>,
    auth: Principal,
    Path(task_id): Path<String>,
    JsonBody(req): JsonBody<ActionIn>,
) -> Result<(StatusCode, Json<ActionOut>), ApiError> {
    act(st, auth, task_id, ManualAction::MarkPrinted, req).await
}

/// Cancel a task that has not printed (`pending`, `retrying`, `failed`, `in_doubt`) and
/// refund its charge, exactly once.
#[utoipa::path(post, path = "/v1/print-tasks/{task_id}/cancel", tag = "manual channel", request_body = ActionIn,
    security(("tenant" = []), ("operator" = [])), params(("task_id" = String, Path)),
    responses((status = 200, body = ActionOut), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 403, body = ErrorBody),
              (status = 404, description = "`not_found`: no such task", body = ErrorBody),
              (status = 409, description = "`invalid_transition`", body = ErrorBody),
              (status = 410, description = "`task_pruned`: the task was pruned after the retention period", body = ErrorBody)))]
pub async fn cancel(
    State(st): State<AppState>,
    auth: Principal,
    Path(task_id): Path<String>,
    JsonBody(req): JsonBody<ActionIn>,
) -> Result<(StatusCode, Json<ActionOut>), ApiError> {
    act(st, auth, task_id, ManualAction::Cancel, req).await
}

/// Move a task that has not printed (`pending`, `retrying`, `failed`) to another printer of
/// the same store; the original becomes `transferred` and links to the new task.
#[utoipa::path(post, path = "/v1/print-tasks/{task_id}/transfer", tag = "manual channel", request_body = TransferIn,
    security(("tenant" = []), ("operator" = [])), params(("task_id" = String, Path)),
    responses((status = 201, body = ActionOut), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 403, body = ErrorBody),
              (status = 404, description = "`not_found`: no such task, or `printer_id` is not a printer of the task's \
                  store", body = ErrorBody),
              (status = 409, description = "`invalid_transition`", body = ErrorBody),
              (status = 410, description = "`task_pruned`: the task was pruned after the retention period", body = ErrorBody)))]
pub async fn transfer(
    State(st): State<AppState>,
    auth: Principal,
    Path(task_id): Path<String>,
    JsonBody(req): JsonBody<TransferIn>,
) -> Result<(StatusCode, Json<ActionOut>), ApiError> {
    act(st, auth, task_id, ManualAction::Transfer, req.into()).await
}

/// Failed and in-doubt tasks of a store, with their reasons, oldest first.
#[utoipa::path(get, path = "/v1/stores/{id}/attention", tag = "manual channel", security(("tenant" = []), ("operator" = [])),
    params(("id" = String, Path)),
    responses((status = 200, body = TaskList), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn attention(
    State(st): State<AppState>,
    auth: Principal,
    Path(store_id): Path<String>,
) -> Result<Json<TaskList>, ApiError> {
    if !auth.may_see_store(&store_id) || st.store.get_store(auth.tenant_id(), &store_id).await?.is_none() {
        return Err(ApiError::not_found(format!("no store {store_id:?}")));
    }
    let tasks = st.store.attention(auth.tenant_id(), &store_id, 1000).await?;
    Ok(Json(TaskList { tasks: tasks.into_iter().map(Into::into).collect(), next_cursor: None }))
}
