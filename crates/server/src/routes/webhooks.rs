//! Webhook endpoints for alerts and their delivery attempts.

use axum::extract::State;

use crate::extract::Path;
use axum::http::StatusCode;
use axum::Json;
use onceprint_core::validate_id;
use onceprint_engine::alerts::{AlertFormat, EVENT_KINDS, TEST_EVENT};
use onceprint_engine::{clock::now_ms, secrets};
use onceprint_store::{NewWebhook, OutboxEvent, Webhook};

use crate::dto::{
    rfc3339, CreateWebhook, WebhookCreated, WebhookDeliveryList, WebhookDeliveryOut, WebhookList, WebhookOut,
    WebhookTestQueued,
};
use crate::error::{ApiError, ErrorBody};
use crate::extract::{JsonBody, TenantAuth};
use crate::AppState;

/// Register an endpoint. Events are POSTed as JSON with `x-onceprint-event-id` and
/// `x-onceprint-signature: t=UNIX_SECONDS,v1=HEX(HMAC-SHA256(secret, "t.body"))`; to a
/// chat group bot (`format`: `wecom`, `dingtalk`, `feishu`, `slack`) as the bot's text
/// message, signed as that bot checks when it has a secret.
#[utoipa::path(post, path = "/v1/webhooks", operation_id = "create_webhook", tag = "alerts", request_body = CreateWebhook, security(("tenant" = [])),
    responses((status = 201, body = WebhookCreated), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 409, body = ErrorBody)))]
pub async fn create(
    State(st): State<AppState>,
    auth: TenantAuth,
    JsonBody(req): JsonBody<CreateWebhook>,
) -> Result<(StatusCode, Json<WebhookCreated>), ApiError> {
    let (w, secret) = create_webhook(&st, &auth.tenant_id, req).await?;
    Ok((
        StatusCode::CREATED,
        Json(WebhookCreated {
            id: w.id,
            url: w.url,
            events: w.events,
            format: w.format,
            secret,
            created_at: rfc3339(w.created_at),
        }),
    ))
}

/// Checks and registers an endpoint of `tenant_id`: the one mechanism of the API and of
/// the console's alert page. Answers the endpoint and its signing secret (generated for
/// `onceprint` when none was given, empty for a bot without one).
pub(crate) async fn create_webhook(
    st: &AppState,
    tenant_id: &str,
    req: CreateWebhook,
) -> Result<(Webhook, String), ApiError> {
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
    let format = match req.format.as_deref() {
        None => AlertFormat::Onceprint,
        Some(f) => AlertFormat::parse(f).ok_or_else(|| {
            ApiError::invalid(format!("format: unknown {f:?}; one of {}", AlertFormat::NAMES.join(", ")))
        })?,
    };
    let secret = match req.secret {
        // Characters, as the OpenAPI document's `minLength` counts them.
        Some(s) if s.chars().count() < 16 => return Err(ApiError::invalid("secret: at least 16 characters")),
        Some(s) => s,
        // A bot without a signing secret is sent unsigned; onceprint's events always are.
        None if format.is_bot() => String::new(),
        None => secrets::generate("whsec_"),
    };
    let w = st
        .store
        .create_webhook(NewWebhook {
            tenant_id: tenant_id.to_owned(),
            id: req.id,
            url: req.url,
            secret: secret.clone(),
            format: format.as_str().to_owned(),
            events: req.events,
            now: now_ms(),
        })
        .await?;
    Ok((w, secret))
}

/// The calling tenant's endpoints.
#[utoipa::path(get, path = "/v1/webhooks", operation_id = "list_webhooks", tag = "alerts", security(("tenant" = [])),
    responses((status = 200, body = WebhookList), (status = 401, body = ErrorBody)))]
pub async fn list(State(st): State<AppState>, auth: TenantAuth) -> Result<Json<WebhookList>, ApiError> {
    let hooks = st.store.list_webhooks(&auth.tenant_id).await?;
    Ok(Json(WebhookList {
        webhooks: hooks
            .into_iter()
            .map(|w| WebhookOut {
                id: w.id,
                url: w.url,
                format: w.format,
                events: w.events,
                created_at: rfc3339(w.created_at),
            })
            .collect(),
    }))
}

/// Sends a test message (`webhook.test`) to this endpoint alone, through the outbox like
/// every alert: its delivery appears in `GET /v1/webhooks/{id}/deliveries` with the
/// endpoint's answer (for a bot, its error code when it refused the message).
#[utoipa::path(post, path = "/v1/webhooks/{id}/test", operation_id = "test_webhook", tag = "alerts", security(("tenant" = [])),
    params(("id" = String, Path)),
    responses((status = 202, body = WebhookTestQueued), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn test(
    State(st): State<AppState>,
    auth: TenantAuth,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<WebhookTestQueued>), ApiError> {
    let event_id = queue_test(&st, &auth.tenant_id, &id).await?;
    Ok((StatusCode::ACCEPTED, Json(WebhookTestQueued { event_id })))
}

/// Puts a test message (`webhook.test`) for endpoint `id` of `tenant_id` in the outbox:
/// the one mechanism of the API and of the console's "send test". Answers its event id.
pub(crate) async fn queue_test(st: &AppState, tenant_id: &str, id: &str) -> Result<String, ApiError> {
    let now = now_ms();
    let event_id = onceprint_engine::alerts::new_event_id(now);
    let payload = serde_json::json!({
        "id": event_id,
        "type": TEST_EVENT,
        "created_at": rfc3339(now),
        "tenant_id": tenant_id,
        "data": { "webhook_id": id },
    });
    let event = OutboxEvent {
        event_id: event_id.clone(),
        tenant_id: tenant_id.to_owned(),
        kind: TEST_EVENT.into(),
        payload: payload.to_string(),
        now,
    };
    if !st.store.enqueue_webhook_test(id, event).await? {
        return Err(ApiError::not_found(format!("no webhook {id:?}")));
    }
    Ok(event_id)
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
