//! The manual channel (R26) and the per-store attention list (R27).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use onceprint_core::manual::ManualAction;
use onceprint_engine::{ActionError, ActionRequest};

use crate::dto::{ActionIn, ActionOut, TaskList, TaskOut};
use crate::error::{ApiError, ErrorBody};
use crate::extract::{JsonBody, TenantAuth};
use crate::AppState;

async fn act(
    st: AppState,
    auth: TenantAuth,
    task_id: String,
    action: ManualAction,
    req: ActionIn,
) -> Result<(StatusCode, Json<ActionOut>), ApiError> {
    let outcome = st
        .operations
        .act(
            action,
            ActionRequest {
                tenant_id: auth.tenant_id,
                task_id,
                operator: req.operator,
                reason: req.reason,
                printer_id: req.printer_id,
            },
        )
        .await
        .map_err(|e| match e {
            ActionError::NotFound(id) => ApiError::not_found(format!("no task {id:?}")),
            ActionError::NotAllowed(n) => ApiError::new(StatusCode::CONFLICT, "invalid_transition", n.to_string()),
            ActionError::Raced(_) => ApiError::new(StatusCode::CONFLICT, "invalid_transition", e.to_string()),
            ActionError::Invalid(c) => c.into(),
            ActionError::Store(s) => s.into(),
        })?;
    let status = if outcome.created.is_some() { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(ActionOut { task: outcome.task.into(), created: outcome.created.map(TaskOut::from) })))
}

/// Print the task again as a numbered reprint attached to it (from `printed`, `closed`,
/// `failed`, `in_doubt`; a failed or in-doubt original is closed by it). The slip carries a
/// visible "REPRINT n" line.
#[utoipa::path(post, path = "/v1/print-tasks/{task_id}/reprint", tag = "manual channel", request_body = ActionIn,
    security(("tenant" = [])), params(("task_id" = String, Path)),
    responses((status = 201, body = ActionOut), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 404, body = ErrorBody), (status = 409, description = "`invalid_transition`", body = ErrorBody)))]
pub async fn reprint(
    State(st): State<AppState>,
    auth: TenantAuth,
    Path(task_id): Path<String>,
    JsonBody(req): JsonBody<ActionIn>,
) -> Result<(StatusCode, Json<ActionOut>), ApiError> {
    act(st, auth, task_id, ManualAction::Reprint, req).await
}

/// Close a `failed` or `in_doubt` task without printing: the paper is known to exist.
#[utoipa::path(post, path = "/v1/print-tasks/{task_id}/mark-printed", tag = "manual channel", request_body = ActionIn,
    security(("tenant" = [])), params(("task_id" = String, Path)),
    responses((status = 200, body = ActionOut), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 404, body = ErrorBody), (status = 409, description = "`invalid_transition`", body = ErrorBody)))]
pub async fn mark_printed(
    State(st): State<AppState>,
    auth: TenantAuth,
    Path(task_id): Path<String>,
    JsonBody(req): JsonBody<ActionIn>,
) -> Result<(StatusCode, Json<ActionOut>), ApiError> {
    act(st, auth, task_id, ManualAction::MarkPrinted, req).await
}

/// Cancel a task that has not printed (`pending`, `retrying`, `failed`, `in_doubt`) and
/// refund its charge, exactly once.
#[utoipa::path(post, path = "/v1/print-tasks/{task_id}/cancel", tag = "manual channel", request_body = ActionIn,
    security(("tenant" = [])), params(("task_id" = String, Path)),
    responses((status = 200, body = ActionOut), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 404, body = ErrorBody), (status = 409, description = "`invalid_transition`", body = ErrorBody)))]
pub async fn cancel(
    State(st): State<AppState>,
    auth: TenantAuth,
    Path(task_id): Path<String>,
    JsonBody(req): JsonBody<ActionIn>,
) -> Result<(StatusCode, Json<ActionOut>), ApiError> {
    act(st, auth, task_id, ManualAction::Cancel, req).await
}

/// Move a task that has not printed (`pending`, `retrying`, `failed`) to another printer of
/// the same store; the original becomes `transferred` and links to the new task.
#[utoipa::path(post, path = "/v1/print-tasks/{task_id}/transfer", tag = "manual channel", request_body = ActionIn,
    security(("tenant" = [])), params(("task_id" = String, Path)),
    responses((status = 201, body = ActionOut), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 404, body = ErrorBody), (status = 409, description = "`invalid_transition`", body = ErrorBody)))]
pub async fn transfer(
    State(st): State<AppState>,
    auth: TenantAuth,
    Path(task_id): Path<String>,
    JsonBody(req): JsonBody<ActionIn>,
) -> Result<(StatusCode, Json<ActionOut>), ApiError> {
    act(st, auth, task_id, ManualAction::Transfer, req).await
}

/// Failed and in-doubt tasks of a store, with their reasons, oldest first.
#[utoipa::path(get, path = "/v1/stores/{id}/attention", tag = "manual channel", security(("tenant" = [])),
    params(("id" = String, Path)),
    responses((status = 200, body = TaskList), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn attention(
    State(st): State<AppState>,
    auth: TenantAuth,
    Path(store_id): Path<String>,
) -> Result<Json<TaskList>, ApiError> {
    if st.store.get_store(&auth.tenant_id, &store_id).await?.is_none() {
        return Err(ApiError::not_found(format!("no store {store_id:?}")));
    }
    let tasks = st.store.attention(&auth.tenant_id, &store_id, 1000).await?;
    Ok(Json(TaskList { tasks: tasks.into_iter().map(Into::into).collect(), next_cursor: None }))
}
