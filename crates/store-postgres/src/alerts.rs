//! Alerts: webhook endpoints and the deliveries of the outbox, for PostgreSQL.
//!
//! An alert is written to `outbox` by the statement that makes the change it reports (a
//! transition, see [`crate::delivery`], or a printer going on- or offline), together with
//! one `webhook_deliveries` row for each endpoint of the tenant whose `events` contain its
//! kind, due at once. A committed change therefore always has its alert, and a change that
//! did not apply has none. An alert no endpoint wants is not written at all: nothing
//! reads the outbox except through a delivery, and a `task.printed` row for every task
//! would be a write per print for nobody. The sender reads due deliveries here, through the partial index
//! `webhook_deliveries_due`, and records each attempt.

use onceprint_core::Millis;
use onceprint_store::{
    DueWebhook, NewWebhook, OutboxEvent, PrinterStatusUpdate, StoreResult, Webhook, WebhookAttempt, WebhookDelivery,
};

use crate::error::pg_error;
use crate::rows::col;

const CREATE_WEBHOOK: &str = "
INSERT INTO webhooks (tenant_id, id, url, secret, events, created_at, format) VALUES ($1, $2, $3, $4, $5, $6, $7)
RETURNING tenant_id, id, url, events, created_at, format";

const LIST_WEBHOOKS: &str =
    "SELECT tenant_id, id, url, events, created_at, format FROM webhooks WHERE tenant_id = $1 ORDER BY id";

/// A test message for one endpoint: its outbox row and its delivery, only when the
/// endpoint is the tenant's (no row: not found).
const ENQUEUE_WEBHOOK_TEST: &str = "
WITH hook AS (SELECT id, tenant_id FROM webhooks WHERE tenant_id = $2 AND id = $6),
event AS (
    INSERT INTO outbox (event_id, tenant_id, kind, payload, created_at)
    SELECT $1, $2, $3, $4, $5 FROM hook
    RETURNING event_id
)
INSERT INTO webhook_deliveries (event_id, webhook_id, tenant_id, next_attempt_at, created_at)
SELECT event.event_id, hook.id, hook.tenant_id, $5, $5 FROM event, hook";

/// The endpoint left-joined with its newest deliveries: no row at all means the endpoint
/// is not the tenant's, a row of NULLs that it has no deliveries (or `limit` is 0). The
/// deliveries are read through `webhook_deliveries_by_hook`.
pub(crate) const WEBHOOK_DELIVERIES: &str = "
SELECT d.event_id, d.webhook_id, d.kind, d.attempts, d.next_attempt_at, d.last_status, d.last_error,
       d.delivered_at, d.created_at
FROM webhooks w
LEFT JOIN LATERAL (
    SELECT d.event_id, d.webhook_id, o.kind, d.attempts, d.next_attempt_at, d.last_status, d.last_error,
           d.delivered_at, d.created_at
    FROM webhook_deliveries d JOIN outbox o ON o.event_id = d.event_id
    WHERE d.tenant_id = w.tenant_id AND d.webhook_id = w.id
    ORDER BY d.created_at DESC, d.event_id DESC
    LIMIT $3
) d ON true
WHERE w.tenant_id = $1 AND w.id = $2
ORDER BY d.created_at DESC, d.event_id DESC";

/// Through `webhook_deliveries_due`, whose predicate the conditions repeat literally so
/// that the planner can prove the partial index applies.
pub(crate) const DUE_WEBHOOKS: &str = "
SELECT d.event_id, d.webhook_id, d.tenant_id, w.url, w.secret, o.payload, d.attempts, w.format
FROM webhook_deliveries d
JOIN webhooks w ON w.tenant_id = d.tenant_id AND w.id = d.webhook_id
JOIN outbox o ON o.event_id = d.event_id
WHERE d.delivered_at IS NULL AND d.next_attempt_at IS NOT NULL AND d.next_attempt_at <= $1
ORDER BY d.next_attempt_at
LIMIT $2";

/// A delivered attempt ends the delivery; a failed one schedules the next (NULL: give up).
const RECORD_WEBHOOK_ATTEMPT: &str = "
UPDATE webhook_deliveries
SET attempts = attempts + 1, last_status = $3, last_error = $4,
    delivered_at = CASE WHEN $5::bool THEN $6::int8 ELSE NULL END,
    next_attempt_at = CASE WHEN $5::bool THEN NULL ELSE $7::int8 END
WHERE event_id = $1 AND webhook_id = $2";

pub(crate) async fn create_webhook(client: &deadpool_postgres::Client, w: NewWebhook) -> StoreResult<Webhook> {
    let stmt = client.prepare_cached(CREATE_WEBHOOK).await.map_err(pg_error)?;
    let row = client
        .query_one(&stmt, &[&w.tenant_id, &w.id, &w.url, &w.secret, &w.events, &w.now, &w.format])
        .await
        .map_err(|e| crate::create_error(e, |_| format!("webhook {}", w.id), |_| format!("tenant {}", w.tenant_id)))?;
    webhook(&row)
}

pub(crate) async fn list_webhooks(client: &deadpool_postgres::Client, tenant_id: &str) -> StoreResult<Vec<Webhook>> {
    let stmt = client.prepare_cached(LIST_WEBHOOKS).await.map_err(pg_error)?;
    client.query(&stmt, &[&tenant_id]).await.map_err(pg_error)?.iter().map(webhook).collect()
}

pub(crate) async fn webhook_deliveries(
    client: &deadpool_postgres::Client,
    tenant_id: &str,
    webhook_id: &str,
    limit: i64,
) -> StoreResult<Option<Vec<WebhookDelivery>>> {
    let stmt = client.prepare_cached(WEBHOOK_DELIVERIES).await.map_err(pg_error)?;
    let found = client.query(&stmt, &[&tenant_id, &webhook_id, &limit.max(0)]).await.map_err(pg_error)?;
    if found.is_empty() {
        return Ok(None);
    }
    let mut deliveries = Vec::with_capacity(found.len());
    for row in &found {
        let event_id: Option<String> = col(row, 0)?;
        let Some(event_id) = event_id else { continue };
        deliveries.push(WebhookDelivery {
            event_id,
            webhook_id: col(row, 1)?,
            kind: col(row, 2)?,
            attempts: col(row, 3)?,
            next_attempt_at: col(row, 4)?,
            last_status: col(row, 5)?,
            last_error: col(row, 6)?,
            delivered_at: col(row, 7)?,
            created_at: col(row, 8)?,
        });
    }
    Ok(Some(deliveries))
}

pub(crate) async fn due_webhooks(
    client: &deadpool_postgres::Client,
    now: Millis,
    limit: i64,
) -> StoreResult<Vec<DueWebhook>> {
    let stmt = client.prepare_cached(DUE_WEBHOOKS).await.map_err(pg_error)?;
    let found = client.query(&stmt, &[&now, &limit.max(0)]).await.map_err(pg_error)?;
    found
        .iter()
        .map(|row| {
            Ok(DueWebhook {
                event_id: col(row, 0)?,
                webhook_id: col(row, 1)?,
                tenant_id: col(row, 2)?,
                url: col(row, 3)?,
                secret: col(row, 4)?,
                payload: col(row, 5)?,
                attempts: col(row, 6)?,
                format: col(row, 7)?,
            })
        })
        .collect()
}

pub(crate) async fn enqueue_webhook_test(
    client: &deadpool_postgres::Client,
    webhook_id: &str,
    e: &OutboxEvent,
) -> StoreResult<bool> {
    let stmt = client.prepare_cached(ENQUEUE_WEBHOOK_TEST).await.map_err(pg_error)?;
    let n = client
        .execute(&stmt, &[&e.event_id, &e.tenant_id, &e.kind, &e.payload, &e.now, &webhook_id])
        .await
        .map_err(pg_error)?;
    Ok(n > 0)
}

pub(crate) async fn record_webhook_attempt(client: &deadpool_postgres::Client, a: &WebhookAttempt) -> StoreResult<()> {
    let stmt = client.prepare_cached(RECORD_WEBHOOK_ATTEMPT).await.map_err(pg_error)?;
    client
        .execute(&stmt, &[&a.event_id, &a.webhook_id, &a.status, &a.error, &a.delivered, &a.now, &a.next_attempt_at])
        .await
        .map_err(pg_error)?;
    Ok(())
}

/// Reads `tenant_id, id, url, events, created_at, format`.
fn webhook(row: &tokio_postgres::Row) -> StoreResult<Webhook> {
    Ok(Webhook {
        tenant_id: col(row, 0)?,
        id: col(row, 1)?,
        url: col(row, 2)?,
        events: col(row, 3)?,
        created_at: col(row, 4)?,
        format: col(row, 5)?,
    })
}

/// The alert kind of a printer that has just become `online` (or not).
pub(crate) fn printer_event_kind(online: bool) -> &'static str {
    if online {
        "printer.online"
    } else {
        "printer.offline"
    }
}

/// The body of a printer's alert: the same JSON, byte for byte, as the SQLite backend
/// writes with `serde_json` (compact, keys in sorted order).
pub(crate) fn printer_event_payload(u: &PrinterStatusUpdate) -> String {
    let last_error = match &u.last_error {
        Some(e) => json_string(e),
        None => "null".to_owned(),
    };
    format!(
        r#"{{"created_at_ms":{},"data":{{"last_error":{},"online":{},"printer_id":{}}},"id":{},"tenant_id":{},"type":{}}}"#,
        u.now,
        last_error,
        u.online,
        json_string(&u.printer_id),
        json_string(&u.event_id),
        json_string(&u.tenant_id),
        json_string(printer_event_kind(u.online)),
    )
}

/// A JSON string literal, escaped the way `serde_json` does it.
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::tests::plan;

    #[test]
    fn printer_payloads_match_the_sqlite_backend() {
        let u = PrinterStatusUpdate {
            tenant_id: "acme".into(),
            printer_id: "p\"1".into(),
            online: false,
            last_error: Some("no\npaper\\\u{1}é".into()),
            now: 42,
            event_id: "evt-1".into(),
        };
        assert_eq!(
            printer_event_payload(&u),
            r#"{"created_at_ms":42,"data":{"last_error":"no\npaper\\\u0001é","online":false,"printer_id":"p\"1"},"id":"evt-1","tenant_id":"acme","type":"printer.offline"}"#
        );
        let u = PrinterStatusUpdate { online: true, last_error: None, ..u };
        assert!(printer_event_payload(&u).contains(r#""data":{"last_error":null,"online":true,"#));
        assert!(printer_event_payload(&u).ends_with(r#""type":"printer.online"}"#));
    }

    #[tokio::test]
    async fn deliveries_are_read_through_their_indexes() {
        let Some(h) = crate::testing::fresh_store().await else {
            return;
        };
        let due = plan(&h.url, DUE_WEBHOOKS, &[&0i64, &10i64]).await;
        assert!(due.contains("using webhook_deliveries_due on webhook_deliveries"), "{due}");
        let history = plan(&h.url, WEBHOOK_DELIVERIES, &[&"acme", &"ops", &10i64]).await;
        assert!(history.contains("webhook_deliveries_by_hook"), "{history}");
        drop(h);
    }
}
