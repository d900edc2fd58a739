//! Alerts: events written to the outbox in the same transaction as the change they
//! report, delivered to the tenant's webhook endpoints with retries and backoff, each
//! signed with HMAC-SHA256 over `timestamp.body` so receivers can check who sent it and
//! refuse replays, each with a unique id so receivers can drop duplicates.
//!
//! Delivery is at least once: an endpoint may see an event twice (a 2xx lost on the way
//! back), never zero times while the broker runs, and must deduplicate on the event id.

use std::sync::Arc;
use std::time::Duration;

use hmac::{Hmac, Mac};
use onceprint_core::{Millis, TaskId};
use onceprint_store::{OutboxEvent, Store, Task, WebhookAttempt};
use rand::RngCore;
use sha2::Sha256;

use crate::clock::{now_ms, rfc3339};
use crate::StoreSignals;

/// Header carrying `t=UNIX_SECONDS,v1=HEX_HMAC`.
pub const SIGNATURE_HEADER: &str = "x-onceprint-signature";
pub const EVENT_ID_HEADER: &str = "x-onceprint-event-id";
pub const EVENT_TYPE_HEADER: &str = "x-onceprint-event-type";

/// Event kinds an endpoint can subscribe to.
/// `printer.refused_message`: a printer's device (MQTT) sent an answer about a task that
/// is not its printer's; it was refused.
/// `printer.paused` / `printer.resumed`: a printer's own state (no paper, cover open, paper
/// jam, offline) started or stopped holding its lane, once per printer.
/// `offline_task.rejected`: the broker could not take a task a store agent accepted on
/// its shop's LAN while the broker was unreachable; the agent keeps it for a person.
pub const EVENT_KINDS: [&str; 11] = [
    "task.failed",
    "task.in_doubt",
    "task.printed",
    "printer.offline",
    "printer.online",
    "printer.stalled",
    "printer.paused",
    "printer.resumed",
    "printer.refused_message",
    "agent.offline",
    "offline_task.rejected",
];

/// A fresh, unique event id.
pub fn new_event_id(now: Millis) -> String {
    let mut random = [0u8; 10];
    rand::thread_rng().fill_bytes(&mut random);
    format!("evt_{}", TaskId::from_parts(now, random))
}

/// The alert for a task that reached `state`, if that state is alerted on.
pub fn task_event(
    task: &Task,
    state: onceprint_core::TaskState,
    last_error: Option<&str>,
    reason: &str,
    now: Millis,
) -> Option<OutboxEvent> {
    let kind = match state {
        onceprint_core::TaskState::Failed => "task.failed",
        onceprint_core::TaskState::InDoubt => "task.in_doubt",
        onceprint_core::TaskState::Printed => "task.printed",
        _ => return None,
    };
    let event_id = new_event_id(now);
    let payload = TaskAlert {
        created_at: rfc3339(now),
        data: TaskAlertData {
            attempts: task.attempts,
            biz_no: &task.biz_no,
            last_error,
            print_type: &task.print_type,
            printer_id: &task.printer_id,
            reason,
            state: state.as_str(),
            store_id: &task.store_id,
            task_id: &task.task_id,
        },
        id: &event_id,
        tenant_id: &task.tenant_id,
        kind,
    };
    // Serialising borrowed fields cannot fail; an empty payload would only mean a bug.
    let payload = serde_json::to_string(&payload).unwrap_or_default();
    Some(OutboxEvent { event_id, tenant_id: task.tenant_id.clone(), kind: kind.into(), payload, now })
}

/// A task alert's body. Typed rather than built as a `serde_json::Value`: every `printed`
/// ack builds one (the store drops it when no endpoint wants it), and the value tree's
/// allocations were about 5 % of the broker's time in delivery. The fields are in the
/// alphabetical order the `Value` map wrote them in, so the bytes sent stay the same.
#[derive(serde::Serialize)]
struct TaskAlert<'a> {
    created_at: String,
    data: TaskAlertData<'a>,
    id: &'a str,
    tenant_id: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
}

#[derive(serde::Serialize)]
struct TaskAlertData<'a> {
    attempts: i32,
    biz_no: &'a str,
    last_error: Option<&'a str>,
    print_type: &'a str,
    printer_id: &'a str,
    reason: &'a str,
    state: &'a str,
    store_id: &'a str,
    task_id: &'a str,
}

/// `t=…,v1=…` for `body` sent at `timestamp` (Unix seconds).
pub fn signature(secret: &str, timestamp: i64, body: &str) -> String {
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret.as_bytes()) {
        Ok(m) => m,
        // HMAC accepts keys of any length; this arm is unreachable in practice.
        Err(_) => return format!("t={timestamp},v1="),
    };
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body.as_bytes());
    let hex: String = mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect();
    format!("t={timestamp},v1={hex}")
}

/// Tuning of webhook delivery.
#[derive(Debug, Clone)]
pub struct AlertConfig {
    pub poll_interval_ms: u64,
    pub timeout_ms: u64,
    /// First retry after this long, doubling to `max_backoff_ms`.
    pub first_backoff_ms: i64,
    pub max_backoff_ms: i64,
    /// Attempts before giving up on one event for one endpoint.
    pub max_attempts: i32,
}

impl Default for AlertConfig {
    fn default() -> Self {
        AlertConfig {
            poll_interval_ms: 500,
            timeout_ms: 10_000,
            first_backoff_ms: 1_000,
            max_backoff_ms: 300_000,
            max_attempts: 20,
        }
    }
}

/// Delivers due webhook deliveries until shutdown.
///
/// Only the node holding `lease` delivers, so two nodes never POST one delivery at once; it
/// looks at the lease again before each POST. A delivery POSTed just before the lease was
/// lost, whose attempt was not recorded, is POSTed again by the next holder: each event id
/// is delivered at least once, and receivers deduplicate by the event id header.
pub fn spawn_deliverer(
    store: Arc<dyn Store>,
    signals: Arc<StoreSignals>,
    config: AlertConfig,
    lease: crate::Lease,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let client = match reqwest::Client::builder().timeout(Duration::from_millis(config.timeout_ms)).build() {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "cannot build the webhook client; alerts stay in the outbox");
                return;
            }
        };
        let mut tick = tokio::time::interval(Duration::from_millis(config.poll_interval_ms));
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = signals.shutdown() => return,
            }
            if !lease.is_held() {
                continue;
            }
            let due = match store.due_webhooks(now_ms(), 100).await {
                Ok(d) => d,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read due webhooks");
                    continue;
                }
            };
            for d in due {
                if !lease.is_held() {
                    break;
                }
                let now = now_ms();
                let ts = now / 1000;
                let res = client
                    .post(&d.url)
                    .header("content-type", "application/json")
                    .header(EVENT_ID_HEADER, &d.event_id)
                    .header(SIGNATURE_HEADER, signature(&d.secret, ts, &d.payload))
                    .body(d.payload.clone())
                    .send()
                    .await;
                let (delivered, status, error) = match res {
                    Ok(r) if r.status().is_success() => (true, Some(i32::from(r.status().as_u16())), None),
                    Ok(r) => (false, Some(i32::from(r.status().as_u16())), Some(format!("HTTP {}", r.status()))),
                    Err(e) => (false, None, Some(e.to_string())),
                };
                let attempts = d.attempts + 1;
                let next = if delivered || attempts >= config.max_attempts {
                    None
                } else {
                    let exp = (attempts - 1).clamp(0, 30) as u32;
                    Some(now + config.first_backoff_ms.saturating_mul(1 << exp).min(config.max_backoff_ms))
                };
                if !delivered {
                    tracing::warn!(event = %d.event_id, webhook = %d.webhook_id, attempts, error = ?error, "webhook delivery failed");
                }
                let attempt = WebhookAttempt {
                    event_id: d.event_id,
                    webhook_id: d.webhook_id,
                    delivered,
                    status,
                    error,
                    next_attempt_at: next,
                    now,
                };
                if let Err(e) = store.record_webhook_attempt(&attempt).await {
                    tracing::warn!(error = %e, "cannot record a webhook attempt");
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_alert_has_the_fields_and_bytes_of_the_value_it_replaced() {
        let task = Task {
            tenant_id: "t\"1".into(),
            biz_no: "B-é".into(),
            ..crate::offline::tests::task(onceprint_core::TaskState::Sent, "f")
        };
        for (state, error) in
            [(onceprint_core::TaskState::Printed, None), (onceprint_core::TaskState::Failed, Some("no_paper"))]
        {
            let e = task_event(&task, state, error, "why \n", 1_700_000_000_123).expect("an alerted state");
            let kind = if error.is_some() { "task.failed" } else { "task.printed" };
            let before = serde_json::json!({
                "id": e.event_id,
                "type": kind,
                "created_at": rfc3339(1_700_000_000_123),
                "tenant_id": task.tenant_id,
                "data": {
                    "task_id": task.task_id,
                    "biz_no": task.biz_no,
                    "store_id": task.store_id,
                    "printer_id": task.printer_id,
                    "print_type": task.print_type,
                    "state": state.as_str(),
                    "attempts": task.attempts,
                    "last_error": error,
                    "reason": "why \n",
                }
            });
            assert_eq!(e.payload, before.to_string());
            assert_eq!(e.kind, kind);
        }
        assert!(task_event(&task, onceprint_core::TaskState::Sent, None, "", 1).is_none());
    }

    #[test]
    fn signature_matches_openssl() {
        // printf '%s' '1700000000.{"a":1}' | openssl dgst -sha256 -hmac secret
        assert_eq!(
            signature("secret", 1_700_000_000, r#"{"a":1}"#),
            "t=1700000000,v1=49f24e537407743fa4a0242bb63b94b9a47ee99cbbe071ccd8a22550ae411686"
        );
    }
}
