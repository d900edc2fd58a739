//! The `webhook` transport (push): the broker POSTs each job to an HTTP endpoint
//! with an `Idempotency-Key` (the task's delivery key), so the receiving side prints once
//! per key however often a delivery is repeated. A 2xx means "accepted", never "printed":
//! the task stays `sent` until a signed callback (`POST /v1/callbacks/{printer_id}`) or the
//! endpoint's status URL says what happened. Whichever answer comes first wins; the other
//! finds the task finished and changes nothing.
//!
//! What each answer means is the webhook table of `onceprint_core::results`
//! (docs/RESULT-CODES.md). A job that provably never reached the endpoint (the connection
//! could not be made) is `offline`; one the endpoint refused (a 4xx other than 408 and
//! 429) printed nothing and is retried as a new attempt. A 5xx, 408, 429 or a connection
//! lost after the request went out may have reached it: the attempt stays in flight,
//! and at its deadline the status URL is asked or the same attempt is sent again with the
//! same key (the receiver prints once per key), until it is settled in doubt.

use std::time::Duration;

use async_trait::async_trait;
use base64::Engine as _;
use onceprint_core::{Outcome, Proof};
use onceprint_store::{Printer, Store, StoreResult};

use crate::alerts::signature;
use crate::clock::now_ms;
use crate::lanes::Delivery;
use crate::transport::push::{Asked, PushConfig, PushTransport, Sent};
use crate::transport::{TransportConfig, TransportKind, WebhookConfig};

/// Checks a signature header `t=…,v1=…` over `body` with `secret`, within the replay
/// window around `now_s`.
pub fn verify_signature(secret: &str, header: &str, body: &str, now_s: i64, window_s: i64) -> bool {
    let mut t = None;
    let mut v1 = None;
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", x)) => t = x.parse::<i64>().ok(),
            Some(("v1", x)) => v1 = Some(x.to_owned()),
            _ => {}
        }
    }
    let (Some(t), Some(v1)) = (t, v1) else { return false };
    if (now_s - t).abs() > window_s {
        return false;
    }
    let expected = signature(secret, t, body);
    crate::secrets::hashes_equal(&expected, &format!("t={t},v1={v1}"))
}

/// What a status word of a callback or of the status URL says about the printer and
/// proves about paper (`onceprint_core::results::webhook`); `None` for an unknown word.
pub fn outcome_of(status: &str) -> Option<(Outcome, Proof)> {
    onceprint_core::results::webhook::status(status).map(|c| (c.outcome, c.proof))
}

/// The webhook printer of any tenant with this id whose secret signed `body` (a vendor
/// callback names only the printer; its signature tells whose printer it is).
pub async fn signed_by(
    store: &dyn Store,
    printer_id: &str,
    header: &str,
    body: &str,
    window_s: i64,
) -> StoreResult<Option<Printer>> {
    let now_s = now_ms() / 1000;
    Ok(store.printers_with_id(printer_id).await?.into_iter().find(|p| {
        match TransportConfig::from_stored(&p.transport) {
            Some(TransportConfig::Webhook(w)) => verify_signature(w.secret.expose(), header, body, now_s, window_s),
            _ => false,
        }
    }))
}

/// The webhook transport.
pub struct Webhook {
    client: reqwest::Client,
    /// Sent as `X-Onceprint-Node` with every job (an extension of the contract), so that a
    /// receiver and the operators can see which broker node pushed it.
    node_id: Option<String>,
}

/// The header that names the broker node that pushed a job.
pub const NODE_HEADER: &str = "x-onceprint-node";

impl Webhook {
    pub fn new(config: &PushConfig) -> Result<Webhook, reqwest::Error> {
        let client = reqwest::Client::builder().timeout(Duration::from_millis(config.timeout_ms)).build()?;
        Ok(Webhook { client, node_id: None })
    }

    /// Names this node in every job sent.
    pub fn with_node_id(mut self, node_id: &str) -> Webhook {
        self.node_id = Some(node_id.to_owned());
        self
    }

    fn config(d: &Delivery) -> Option<&WebhookConfig> {
        match &d.printer.transport {
            Some(TransportConfig::Webhook(w)) => Some(w),
            _ => None,
        }
    }
}

#[async_trait]
impl PushTransport for Webhook {
    fn kind(&self) -> TransportKind {
        TransportKind::Webhook
    }

    async fn send(&self, d: &Delivery) -> Sent {
        let Some(w) = Self::config(d) else {
            return Sent::Failed {
                outcome: Outcome::Offline,
                proof: Proof::NotPrinted,
                detail: "the printer is no longer a webhook printer".into(),
            };
        };
        let body = serde_json::json!({
            "task_id": d.task.task_id,
            "attempt": d.attempt,
            "printer_id": d.task.printer_id,
            "idempotency_key": d.idempotency_key,
            "content_type": "escpos",
            "data": base64::engine::general_purpose::STANDARD.encode(&d.data),
        })
        .to_string();
        let mut req = self
            .client
            .post(&w.url)
            .header("content-type", "application/json")
            .header("idempotency-key", &d.idempotency_key)
            .header(crate::alerts::SIGNATURE_HEADER, signature(w.secret.expose(), now_ms() / 1000, &body));
        if let Some(node) = &self.node_id {
            req = req.header(NODE_HEADER, node);
        }
        let res = req.body(body).send().await;
        match res {
            Ok(r) if r.status().is_success() => Sent::Accepted,
            // The endpoint refused the job: it printed nothing.
            Ok(r) if r.status().is_client_error() && !matches!(r.status().as_u16(), 408 | 429) => Sent::Failed {
                outcome: Outcome::Error,
                proof: Proof::NotPrinted,
                detail: format!("webhook answered {}", r.status()),
            },
            // It may have taken the job before it failed: asked about (or sent again with
            // the same key) at the deadline, never a new attempt.
            Ok(r) => Sent::NotNow { detail: format!("webhook answered {}", r.status()) },
            // Nothing reached the endpoint: it cannot have printed.
            Err(e) if e.is_connect() => Sent::Failed {
                outcome: Outcome::Offline,
                proof: Proof::NotPrinted,
                detail: format!("webhook unreachable: {e}"),
            },
            // The request may have reached it before the answer was lost.
            Err(e) => Sent::NotNow { detail: format!("no answer from the webhook: {e}") },
        }
    }

    async fn query(&self, d: &Delivery) -> Asked {
        let Some(status_url) = Self::config(d).and_then(|w| w.status_url.as_deref()) else { return Asked::Unknown };
        let res = self
            .client
            .get(status_url)
            .query(&[("task_id", d.task.task_id.as_str()), ("idempotency_key", d.idempotency_key.as_str())])
            .send()
            .await;
        let Ok(res) = res else { return Asked::Unknown };
        if res.status() == reqwest::StatusCode::NOT_FOUND {
            return Asked::Unknown;
        }
        let Ok(v) = res.json::<serde_json::Value>().await else { return Asked::Unknown };
        let status = v.get("status").and_then(|s| s.as_str()).unwrap_or_default();
        match status {
            "pending" | "accepted" | "queued" | "printing" => Asked::Pending,
            s => match outcome_of(s) {
                Some((outcome, proof)) => Asked::Done { outcome, proof, detail: format!("status URL: {s}") },
                // "unknown", "not_found", or anything else: it does not have the job.
                None => Asked::Unknown,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_are_checked_within_the_window() {
        let sig = signature("s3cret-s3cret-s3cret", 1_700_000_000, "{}");
        assert!(verify_signature("s3cret-s3cret-s3cret", &sig, "{}", 1_700_000_100, 300));
        assert!(!verify_signature("s3cret-s3cret-s3cret", &sig, "{}", 1_700_000_400, 300), "replayed");
        assert!(!verify_signature("other-secret-other", &sig, "{}", 1_700_000_000, 300));
        assert!(!verify_signature("s3cret-s3cret-s3cret", &sig, "{ }", 1_700_000_000, 300));
        assert!(!verify_signature("s3cret-s3cret-s3cret", "garbage", "{}", 1_700_000_000, 300));
    }
}
