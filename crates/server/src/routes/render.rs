//! Receipt previews: a document in, a PNG (or text, or ESC/POS) out; and the
//! preview of a stored task as its printer would print it.

use axum::extract::State;

use crate::extract::{Path, Query};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use onceprint_engine::content::{document_of, preview_png, render_document, ContentError};
use serde::Deserialize;

use crate::error::{ApiError, ErrorBody};
use crate::extract::{Body, Principal, TenantAuth};
use crate::AppState;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PreviewParams {
    /// A built-in profile such as `escpos-58-gb18030` (default: the document's paper at
    /// `escpos-80-gb18030`).
    pub profile: Option<String>,
    /// `png` (default), `text` or `escpos`.
    pub format: Option<String>,
}

fn content_error(e: ContentError) -> ApiError {
    match e {
        ContentError::Invalid(m) => ApiError::new(StatusCode::BAD_REQUEST, "invalid_content", m),
        ContentError::NoPreview(_) => ApiError::invalid(e.to_string()),
        ContentError::Render(m) => {
            tracing::error!(error = %m, "rendering failed");
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "rendering failed; see the broker log")
        }
    }
}

/// Render a receipt document (JSON; or cloud markup with `Content-Type: text/plain`) to a
/// PNG preview, plain text or ESC/POS bytes. The body may also be exactly the `content`
/// object a task takes (`{"type":"text"|"markup"|"doc",…}`), or a whole task body with its
/// `content`, so what a task would print is previewed without reshaping it. Invalid
/// documents are 400 `invalid_content` naming the field.
#[utoipa::path(post, path = "/v1/render/preview", tag = "receipt documents", security(("tenant" = [])),
    params(PreviewParams),
    request_body(content = Object, description = "a receipt document (see the ReceiptDocument schema), or markup as text/plain"),
    responses((status = 200, content_type = "image/png"), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)))]
pub async fn preview(
    State(st): State<AppState>,
    _auth: TenantAuth,
    Query(q): Query<PreviewParams>,
    headers: HeaderMap,
    Body(body): Body,
) -> Result<Response, ApiError> {
    if let Some(p) = &q.profile {
        onceprint_engine::content::check_profile(p).map_err(|e| ApiError::invalid(format!("profile: {e}")))?;
    }
    let is_markup =
        headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| v.starts_with("text/plain"));
    if !is_markup {
        crate::extract::require_json(&headers)?;
    }
    let (kind, body) = if is_markup { ("markup", body.to_vec()) } else { preview_input(&body, &st)? };
    // Rendering a large document takes CPU time: off the async workers.
    let format = q.format.unwrap_or_else(|| "png".into());
    let profile = q.profile.clone();
    let (bytes, mime) = tokio::task::spawn_blocking(move || {
        let doc = document_of(kind, &body)?.ok_or_else(|| {
            ContentError::NoPreview("raw ESC/POS content has no preview; send a text, markup or doc content".into())
        })?;
        render_document(&doc, profile.as_deref(), &format)
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", format!("render task: {e}")))?
    .map_err(content_error)?;
    Ok(([(header::CONTENT_TYPE, mime)], bytes).into_response())
}

/// What a JSON preview body holds: a task's `content` object (recognised by its `type`),
/// a whole task body (recognised by its `content` object), or else a receipt document. A
/// content object goes through the same validation as at intake, so a preview is refused
/// exactly when the task would be.
fn preview_input(body: &[u8], st: &AppState) -> Result<(&'static str, Vec<u8>), ApiError> {
    let value: serde_json::Value = crate::extract::parse_json(body)?;
    let content = match &value {
        serde_json::Value::Object(m) if m.get("type").is_some_and(|t| t.is_string()) => Some(value.clone()),
        serde_json::Value::Object(m) if m.get("content").is_some_and(|c| c.is_object()) => m.get("content").cloned(),
        _ => None,
    };
    let Some(content) = content else { return Ok(("doc", body.to_vec())) };
    let content: onceprint_core::content::Content = serde_json::from_value(content)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_content", format!("content: {e}")))?;
    let canonical = content.canonicalize(st.config.intake.content_limits)?;
    Ok((canonical.content_type, canonical.bytes))
}

/// A PNG of how a task prints on its printer (text, document and markup tasks).
#[utoipa::path(get, path = "/v1/print-tasks/{task_id}/preview.png", tag = "receipt documents", security(("tenant" = []), ("operator" = [])),
    params(("task_id" = String, Path)),
    responses((status = 200, content_type = "image/png"), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 404, description = "`not_found`: no such task, or a task of raw ESC/POS bytes, which has no \
                  preview", body = ErrorBody)))]
pub async fn task_preview(
    State(st): State<AppState>,
    auth: Principal,
    Path(task_id): Path<String>,
) -> Result<Response, ApiError> {
    let task = crate::routes::manual::visible_task(&st, &auth, &task_id).await?;
    let png = task_png(&st, &task).await?;
    Ok(([(header::CONTENT_TYPE, "image/png")], png).into_response())
}

/// The PNG preview of a task as its printer prints it (also the console's ticket image).
pub(crate) async fn task_png(st: &AppState, task: &onceprint_store::Task) -> Result<Vec<u8>, ApiError> {
    let not_found = || ApiError::not_found(format!("no task {:?}", task.task_id));
    let content = st.store.task_content(&task.task_id).await?.ok_or_else(not_found)?;
    let profile = st
        .directory
        .printer(&task.tenant_id, &task.printer_id)
        .await?
        .and_then(|p| serde_json::from_str::<serde_json::Value>(&p.transport).ok())
        .and_then(|v| v.get("profile").and_then(|p| p.as_str()).map(str::to_owned));
    let png =
        tokio::task::spawn_blocking(move || preview_png(&content.content_type, &content.content, profile.as_deref()))
            .await
            .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", format!("render task: {e}")))?
            .map_err(|e| match e {
                // A task of raw ESC/POS bytes has no preview to show: nothing is there, as for
                // a task that does not exist.
                ContentError::NoPreview(_) => ApiError::not_found(format!(
                    "task {:?} has no preview: its content is raw ESC/POS bytes",
                    task.task_id
                )),
                e => content_error(e),
            })?;
    Ok(png)
}
