//! The webhook transport (R15–R18): the broker pushes each job to an HTTP endpoint with
//! `Idempotency-Key: biz_no#printer_id`, so the receiving side prints once per key however
//! often a delivery is repeated. A 2xx means "accepted", never "printed": the task stays
//! `sent` until a signed callback (`POST /v1/callbacks/{printer_id}`) or the endpoint's
//! status URL says what happened. Whichever answer comes first wins; the other finds the
//! task finished and changes nothing (R18).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use onceprint_core::{Outcome, TaskState};
use onceprint_store::{AgentIdentity, Printer, Store, StoreError, Task, Transition};

use crate::alerts::signature;
use crate::clock::now_ms;
use crate::delivery::{AckIn, Dispatcher};
use crate::transport::Transport;
use crate::StoreSignals;

/// The pseudo agent id under which pushed deliveries are recorded.
pub const PUSH_AGENT: &str = "webhook";

/// Tuning of the pusher.
#[derive(Debug, Clone)]
pub struct PushConfig {
    pub interval_ms: u64,
    /// After this long without an answer, the status URL is asked (or the job re-sent
    /// with the same idempotency key).
    pub recheck_after_ms: i64,
    pub timeout_ms: u64,
    /// Callbacks signed more than this far from now are refused (replays).
    pub replay_window_s: i64,
}

impl Default for PushConfig {
    fn default() -> Self {
        PushConfig { interval_ms: 200, recheck_after_ms: 10_000, timeout_ms: 10_000, replay_window_s: 300 }
    }
}

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

/// Maps a vendor's status word to an ack outcome.
pub fn outcome_of(status: &str) -> Option<Outcome> {
    match status {
        "printed" | "done" | "success" => Some(Outcome::Printed),
        "failed" => Some(Outcome::Error),
        other => Outcome::parse(other),
    }
}

/// Pushes jobs to webhook printers until shutdown.
pub struct WebhookPusher {
    store: Arc<dyn Store>,
    dispatcher: Arc<Dispatcher>,
    signals: Arc<StoreSignals>,
    config: PushConfig,
    client: reqwest::Client,
}

impl WebhookPusher {
    pub fn new(
        store: Arc<dyn Store>,
        dispatcher: Arc<Dispatcher>,
        signals: Arc<StoreSignals>,
        config: PushConfig,
    ) -> Result<WebhookPusher, reqwest::Error> {
        let client = reqwest::Client::builder().timeout(Duration::from_millis(config.timeout_ms)).build()?;
        Ok(WebhookPusher { store, dispatcher, signals, config, client })
    }

    pub fn spawn(self) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(self.config.interval_ms));
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = self.signals.shutdown() => return,
                }
                if let Err(e) = self.pass().await {
                    tracing::warn!(error = %e, "webhook push pass failed");
                }
            }
        })
    }

    /// One look at every webhook printer's lane.
    pub async fn pass(&self) -> Result<(), StoreError> {
        let printers = self.store.printers_by_transport("webhook").await?;
        let mut by_store: BTreeMap<(String, String), Vec<Printer>> = BTreeMap::new();
        for p in printers {
            by_store.entry((p.tenant_id.clone(), p.store_id.clone())).or_default().push(p);
        }
        for ((tenant, store), printers) in by_store {
            let heads = self.store.lane_heads(&tenant, &store).await?;
            for head in heads {
                let Some(printer) = printers.iter().find(|p| p.id == head.printer_id) else { continue };
                let Some(Transport::Webhook { url, secret, status_url }) = Transport::parse(&printer.transport) else {
                    continue;
                };
                self.step(&head, &url, &secret, status_url.as_deref()).await?;
            }
        }
        Ok(())
    }

    async fn step(&self, head: &Task, url: &str, secret: &str, status_url: Option<&str>) -> Result<(), StoreError> {
        let now = now_ms();
        let due = head.next_attempt_at.is_none_or(|t| t <= now);
        match head.state {
            TaskState::Pending | TaskState::Retrying if due => {
                let attempt = head.attempts + 1;
                let change = self.to_sent(head, attempt, format!("pushed to {url}"), now);
                if self.store.transition(&change).await? {
                    self.send(head, attempt, url, secret).await?;
                }
            }
            TaskState::Sent if due && head.sent_to.as_deref() == Some(PUSH_AGENT) => {
                // No answer yet: ask the status URL, or re-send with the same key (the
                // receiving side prints once per key, so this cannot print twice).
                if let Some(status_url) = status_url {
                    if let Some(outcome) = self.query(head, status_url).await {
                        self.apply(head, head.attempts, outcome, "status URL").await?;
                        return Ok(());
                    }
                }
                let change = Transition {
                    from: TaskState::Sent,
                    reason: "no answer yet; asked again".into(),
                    ..self.to_sent(head, head.attempts, String::new(), now)
                };
                if self.store.transition(&change).await? && status_url.is_none() {
                    self.send(head, head.attempts, url, secret).await?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn to_sent(&self, head: &Task, attempt: i32, reason: String, now: i64) -> Transition {
        Transition {
            task_id: head.task_id.clone(),
            from: head.state,
            expected_attempts: head.attempts,
            to: TaskState::Sent,
            attempts: attempt,
            last_error: head.last_error.clone(),
            next_attempt_at: Some(now + self.config.recheck_after_ms),
            actor: format!("transport:{PUSH_AGENT}"),
            reason,
            now,
            sent_to: Some(PUSH_AGENT.into()),
            sent_session: Some("push".into()),
            event: None,
        }
    }

    /// POSTs the job. A refusal or a network error is an `offline` ack: retried with
    /// backoff like any printer that cannot be reached.
    async fn send(&self, task: &Task, attempt: i32, url: &str, secret: &str) -> Result<(), StoreError> {
        let Some(content) = self.store.task_content(&task.task_id).await? else { return Ok(()) };
        let printer = self.store.get_printer(&task.tenant_id, &task.printer_id).await?;
        let profile = printer.as_ref().and_then(|p| crate::delivery::printer_profile(&p.transport));
        let data = match crate::content::render_for(&content.content_type, content.content, None, profile.as_deref()) {
            Ok(d) => d,
            Err(why) => {
                tracing::warn!(task_id = %task.task_id, %why, "cannot render for the webhook");
                return self.apply(task, attempt, Outcome::Error, &why).await;
            }
        };
        let key = format!("{}#{}", task.biz_no, task.printer_id);
        let body = serde_json::json!({
            "task_id": task.task_id,
            "attempt": attempt,
            "printer_id": task.printer_id,
            "idempotency_key": key,
            "content_type": "escpos",
            "data": base64::engine::general_purpose::STANDARD.encode(data),
        })
        .to_string();
        let res = self
            .client
            .post(url)
            .header("content-type", "application/json")
            .header("idempotency-key", &key)
            .header(crate::alerts::SIGNATURE_HEADER, signature(secret, now_ms() / 1000, &body))
            .body(body)
            .send()
            .await;
        match res {
            Ok(r) if r.status().is_success() => {
                tracing::info!(task_id = %task.task_id, attempt, "accepted by the webhook (not printed yet)");
                Ok(())
            }
            Ok(r) => self.apply(task, attempt, Outcome::Offline, &format!("webhook answered {}", r.status())).await,
            Err(e) => self.apply(task, attempt, Outcome::Offline, &format!("webhook unreachable: {e}")).await,
        }
    }

    async fn query(&self, task: &Task, status_url: &str) -> Option<Outcome> {
        let key = format!("{}#{}", task.biz_no, task.printer_id);
        let res = self
            .client
            .get(status_url)
            .query(&[("task_id", task.task_id.as_str()), ("idempotency_key", &key)])
            .send()
            .await;
        let v: serde_json::Value = res.ok()?.json().await.ok()?;
        outcome_of(v.get("status")?.as_str()?)
    }

    async fn apply(&self, task: &Task, attempt: i32, outcome: Outcome, detail: &str) -> Result<(), StoreError> {
        let who = AgentIdentity { tenant_id: task.tenant_id.clone(), store_id: task.store_id.clone() };
        let ack = AckIn { task_id: task.task_id.clone(), attempt, outcome, detail: detail.to_owned() };
        match self.dispatcher.ack(&who, PUSH_AGENT, vec![ack]).await {
            Ok(_) => Ok(()),
            Err(crate::DeliveryError::Store(e)) => Err(e),
        }
    }
}
