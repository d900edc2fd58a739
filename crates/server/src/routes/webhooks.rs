//! Webhook endpoints for alerts and their delivery attempts.

use axum::extract::State;

use crate::extract::Path;
use axum::http::StatusCode;
use axum::Json;
use onceprint_core::validate_id;
use onceprint_engine::alerts::EVENT_KINDS;
use onceprint_engine::{clock::now_ms, secrets};
use onceprint_store::NewWebhook;

use crate::dto::{
    rfc3339, CreateWebhook, WebhookCreated, WebhookDeliveryList, WebhookDeliveryOut, WebhookList, WebhookOut,
};
use crate::error::{ApiError, ErrorBody};
use crate::extract::{JsonBody, TenantAuth};
use crate::AppState;

/// Register an endpoint. Events are POSTed as JSON with `x-onceprint-event-id` and
/// `x-onceprint-signature: t=UNIX_SECONDS,v1=HEX(HMAC-SHA256(secret, "t.body"))`.
#[utoipa::path(post, path = "/v1/webhooks", operation_id = "create_webhook", tag = "alerts", request_body = CreateWebhook, security(("tenant" = [])),
    responses((status = 201, body = WebhookCreated), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 409, body = ErrorBody)))]
pub async fn create(
    State(st): State<AppState>,
    auth: TenantAuth,
    JsonBody(req): JsonBody<CreateWebhook>,
) -> Result<(StatusCode, Json<WebhookCreated>), ApiError> {
    validate_id("id", &req.id)?;
    let url_ok = (req.url.starts_with("http://") || req.url.starts_with("https://")) && req.url.len() <= 2000;
    if !url_ok || req.url.contains(char::is_whitespace) {
        return Err(ApiError::invalid("url: must be an http:// or https:// URL"));
    }
    if req.events.is_empty() {
        return Err(ApiError::invalid(format!("events: name at least one of {}", EVENT_KINDS.join(", "))));
    }
    for (i, e) in req.events.iter().enumerate() {
        if !EVENT_KINDS.contains(&e.as_str()) {
            return Err(ApiError::invalid(format!(
                "events[{i}]: unknown event {e:?}; one of {}",
                EVENT_KINDS.join(", ")
            )));
        }
    }
    let secret = match req.secret {
        // Characters, as the OpenAPI document's `minLength` counts them.
        Some(s) if s.chars().count() < 16 => return Err(ApiError::invalid("secret: at least 16 characters")),
        Some(s) => s,
        None => secrets::generate("whsec_"),
    };
    let w = st
        .store
        .create_webhook(NewWebhook {
            tenant_id: auth.tenant_id,
            id: req.id,
            url: req.url,
            secret: secret.clone(),
            events: req.events,
            now: now_ms(),
        })
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(WebhookCreated { id: w.id, url: w.url, events: w.events, secret, created_at: rfc3339(w.created_at) }),
    ))
}

/// The calling tenant's endpoints.
#[utoipa::path(get, path = "/v1/webhooks", operation_id = "list_webhooks", tag = "alerts", security(("tenant" = [])),
    responses((status = 200, body = WebhookList), (status = 401, body = ErrorBody)))]
pub async fn list(State(st): State<AppState>, auth: TenantAuth) -> Result<Json<WebhookList>, ApiError> {
    let hooks = st.store.list_webhooks(&auth.tenant_id).await?;
    Ok(Json(WebhookList {
        webhooks: hooks
            .into_iter()
            .map(|w| WebhookOut { id: w.id, url: w.url, events: w.events, created_at: rfc3339(w.created_at) })
            .collect(),
    }))
}

/// Delivery attempts of one endpoint, newest event first.
#[utoipa::path(get, path = "/v1/webhooks/{id}/deliveries", operation_id = "webhook_deliveries", tag = "alerts", security(("tenant" = [])),
    params(("id" = String, Path)),
    responses((status = 200, body = WebhookDeliveryList), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn deliveries(
    State(st): State<AppState>,
    auth: TenantAuth,
    Path(id): Path<String>,
) -> Result<Json<WebhookDeliveryList>, ApiError> {
    let Some(list) = st.store.webhook_deliveries(&auth.tenant_id, &id, 500).await? else {
        return Err(ApiError::not_found(format!("no webhook {id:?}")));
    };
    Ok(Json(WebhookDeliveryList {
        deliveries: list
            .into_iter()
            .map(|d| WebhookDeliveryOut {
                event_id: d.event_id,
                event_type: d.kind,
                attempts: d.attempts,
                next_attempt_at: d.next_attempt_at.map(rfc3339),
                last_status: d.last_status,
                last_error: d.last_error,
                delivered_at: d.delivered_at.map(rfc3339),
                created_at: rfc3339(d.created_at),
            })
            .collect(),
    }))
}
