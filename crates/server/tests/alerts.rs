//! Alerts: signed webhooks from the outbox, retried when the receiver fails, visible via
//! the API, on SQLite and PostgreSQL.

mod common;

use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode};
use common::{order, receiver, Backend, Received, TestApp};
use onceprint_server::HttpConfig;
use serde_json::{json, Value};

/// The documented verification recipe, done independently of the broker's code.
fn verify(secret: &str, headers: &HeaderMap, body: &str) -> bool {
    use hmac::Mac;
    let Some(sig) = headers.get("x-onceprint-signature").and_then(|v| v.to_str().ok()) else { return false };
    let mut t = None;
    let mut v1 = None;
    for part in sig.split(',') {
        match part.split_once('=') {
            Some(("t", x)) => t = Some(x.to_owned()),
            Some(("v1", x)) => v1 = Some(x.to_owned()),
            _ => {}
        }
    }
    let (Some(t), Some(v1)) = (t, v1) else { return false };
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).expect("key");
    mac.update(format!("{t}.{body}").as_bytes());
    let hex: String = mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect();
    let fresh = t.parse::<i64>().ok().is_some_and(|t| {
        let now =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
        (now - t).abs() < 300
    });
    hex == v1 && fresh
}

fn fast() -> HttpConfig {
    let mut c = HttpConfig::default();
    c.alerts.poll_interval_ms = 50;
    c.alerts.first_backoff_ms = 200;
    for p in c.intake.policies.types.values_mut() {
        p.max_attempts = 1;
        // A printer's refusal fails the ticket at once instead of pausing its lane.
        p.max_wait_ms = 0;
    }
    c
}

async fn wait_for(got: &Received, n: usize) {
    let start = Instant::now();
    while got.lock().expect("lock").len() < n {
        assert!(start.elapsed() < Duration::from_secs(15), "only {} webhook calls", got.lock().expect("lock").len());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn failed_and_doubtful_tasks_alert_with_signed_retried_webhooks(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, fast()).await else { return };
    let key = app.tenant("acme").await;
    let (url, got) = receiver(1).await;
    let secret = "a-long-enough-secret";
    let w = app
        .post(
            "/v1/webhooks",
            &key,
            json!({"id": "ops", "url": url, "secret": secret,
        "events": ["task.failed", "task.in_doubt", "printer.offline"]}),
        )
        .await;
    assert_eq!(w.status, StatusCode::CREATED, "{w:?}");
    assert_eq!(w.body["secret"], secret);
    let bad = app.post("/v1/webhooks", &key, json!({"id": "x", "url": url, "events": ["task.exploded"]})).await;
    assert_eq!(bad.code(), "invalid_request");

    let token = app.call("POST", "/v1/stores/s1/agent-tokens", Some(&key), None).await.body["token"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    let id = app.submit(&key, order("A1", "x")).await.body["task_id"].as_str().unwrap_or("").to_owned();
    app.post("/v1/agent/poll", &token, json!({"agent_id": "a", "session": "s", "wait_ms": 1000})).await;
    // Offline with attempts used up: the task fails and the printer goes offline... it was
    // never online, so only task.failed is alerted.
    app.post("/v1/agent/acks", &token, json!({"acks": [{"task_id": id, "attempt": 1, "outcome": "offline"}]})).await;
    assert_eq!(app.get(&format!("/v1/print-tasks/{id}"), &key).await.body["state"], "failed");

    // First call answered 500, the retry 204: the same event twice.
    wait_for(&got, 2).await;
    let calls = got.lock().expect("lock").clone();
    let bodies: Vec<Value> = calls.iter().map(|(_, b)| serde_json::from_str(b).expect("json")).collect();
    assert_eq!(bodies[0]["type"], "task.failed");
    assert_eq!(bodies[0]["data"]["task_id"], id.as_str());
    assert_eq!(bodies[0]["data"]["last_error"], "offline");
    assert_eq!(bodies[0]["id"], bodies[1]["id"], "a retry carries the same event id");
    assert_eq!(calls[0].0.get("x-onceprint-event-id").and_then(|v| v.to_str().ok()), bodies[0]["id"].as_str());
    for (h, b) in &calls {
        assert!(verify(secret, h, b), "signature must verify");
        assert!(!verify("wrong-secret-wrong-secret", h, b));
    }
    // The receiver has answered the retry; the broker records the answer right after it
    // arrives, so the history may lag a moment behind what the receiver saw.
    let start = Instant::now();
    let d = loop {
        let d = app.get("/v1/webhooks/ops/deliveries", &key).await;
        if d.body["deliveries"][0]["attempts"].as_i64() == Some(2) || start.elapsed() > Duration::from_secs(10) {
            break d;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let first = &d.body["deliveries"][0];
    assert_eq!((first["attempts"].as_i64(), first["last_status"].as_i64()), (Some(2), Some(204)), "{d:?}");
    assert!(first["delivered_at"].is_string());
    assert_eq!(app.get("/v1/webhooks/nope/deliveries", &key).await.code(), "not_found");

    // An in-doubt task alerts too; a printed one does not (not subscribed).
    let id2 = app.submit(&key, order("A2", "x")).await.body["task_id"].as_str().unwrap_or("").to_owned();
    app.post("/v1/agent/poll", &token, json!({"agent_id": "a", "session": "s", "wait_ms": 1000})).await;
    app.post("/v1/agent/acks", &token, json!({"acks": [{"task_id": id2, "attempt": 1, "outcome": "in_doubt"}]})).await;
    wait_for(&got, 3).await;
    let last: Value = serde_json::from_str(&got.lock().expect("lock")[2].1).expect("json");
    assert_eq!((last["type"].as_str(), last["data"]["task_id"].as_str()), (Some("task.in_doubt"), Some(id2.as_str())));
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_sqlite() {
    failed_and_doubtful_tasks_alert_with_signed_retried_webhooks(Backend::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_postgres() {
    failed_and_doubtful_tasks_alert_with_signed_retried_webhooks(Backend::Postgres).await
}
