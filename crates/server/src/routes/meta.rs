//! Health, readiness, metrics and the OpenAPI document.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Json;

use crate::dto::Health;
use crate::error::ErrorBody;
use crate::AppState;

/// The process is up.
#[utoipa::path(get, path = "/healthz", tag = "meta", responses((status = 200, body = Health)))]
pub async fn healthz() -> Json<Health> {
    Json(Health { status: "ok".into() })
}

/// The database answers.
#[utoipa::path(get, path = "/readyz", tag = "meta",
    responses((status = 200, body = Health), (status = 503, body = ErrorBody)))]
pub async fn readyz(State(st): State<AppState>) -> impl IntoResponse {
    match st.store.ping().await {
        Ok(()) => (StatusCode::OK, Json(serde_json::json!({"status": "ready"}))),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({"error": {"code": "unavailable", "message": format!("database: {e}")}})),
        ),
    }
}

/// The metrics in the OpenMetrics text format (which Prometheus scrapes).
#[utoipa::path(get, path = "/metrics", tag = "meta",
    responses((status = 200, content_type = "application/openmetrics-text", body = String)))]
pub async fn metrics(State(st): State<AppState>) -> impl IntoResponse {
    let body = st.metrics.render(&st).await;
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], body)
}

/// This API's OpenAPI 3.1 description.
#[utoipa::path(get, path = "/openapi.json", tag = "meta", responses((status = 200, content_type = "application/json")))]
pub async fn openapi(State(st): State<AppState>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], crate::openapi::document_json_for(&st.config))
}
