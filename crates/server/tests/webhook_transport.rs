//! The webhook transport: jobs pushed with an Idempotency-Key, "accepted" is not
//! "printed", signed callbacks (good, bad, replayed), status polling, whichever answer
//! comes first wins — on SQLite and PostgreSQL.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::Query;
use axum::http::{HeaderMap, StatusCode};
use common::{callback, Backend, TestApp};
use onceprint_server::HttpConfig;
use serde_json::{json, Value};

const SECRET: &str = "vendor-shared-secret-123";

#[derive(Default)]
struct Vendor {
    jobs: Vec<(HeaderMap, Value)>,
    status: String,
}

async fn vendor() -> (String, Arc<Mutex<Vendor>>) {
    let state = Arc::new(Mutex::new(Vendor { status: "pending".into(), ..Default::default() }));
    let (s1, s2) = (state.clone(), state.clone());
    let app = axum::Router::new()
        .route(
            "/jobs",
            axum::routing::post(move |headers: HeaderMap, body: String| {
                let s = s1.clone();
                async move {
                    let v: Value = serde_json::from_str(&body).unwrap_or_default();
                    s.lock().expect("lock").jobs.push((headers, v));
                    StatusCode::ACCEPTED
                }
            }),
        )
        .route(
            "/status",
            axum::routing::get(move |Query(_q): Query<std::collections::HashMap<String, String>>| {
                let s = s2.clone();
                async move { axum::Json(json!({"status": s.lock().expect("lock").status.clone()})) }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), state)
}

fn now_s() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

fn fast() -> HttpConfig {
    let mut c = HttpConfig::default();
    c.push.interval_ms = 50;
    c.push.recheck_after_ms = 300;
    c
}

async fn wait_jobs(v: &Arc<Mutex<Vendor>>, n: usize) {
    let start = Instant::now();
    while v.lock().expect("lock").jobs.len() < n {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the vendor got {} jobs",
            v.lock().expect("lock").jobs.len()
        );
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
}

async fn wait_state(app: &TestApp, key: &str, id: &str, state: &str) -> Value {
    let start = Instant::now();
    loop {
        let t = app.get(&format!("/v1/print-tasks/{id}"), key).await.body;
        if t["state"] == state {
            return t;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{t}");
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
}

async fn callbacks_are_signed_idempotent_and_accepted_is_not_printed(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, fast()).await else { return };
    let key = app.tenant("acme").await;
    let (base, v) = vendor().await;
    let p = app
        .post(
            "/v1/printers",
            &key,
            json!({"id": "cloud1", "store_id": "s1",
            "transport": {"kind": "webhook", "url": format!("{base}/jobs"), "secret": SECRET}}),
        )
        .await;
    assert_eq!(p.status, StatusCode::CREATED, "{p:?}");
    assert_eq!(p.body["transport"]["secret"], "***", "the secret is never shown again");
    let id = app
        .submit(&key, json!({"biz_no": "V1", "printer_id": "cloud1", "content": {"type": "text", "text": "hi\n"}}))
        .await
        .body["task_id"]
        .as_str()
        .expect("id")
        .to_owned();
    wait_jobs(&v, 1).await;
    let (headers, job) = v.lock().expect("lock").jobs[0].clone();
    assert_eq!(headers.get("idempotency-key").and_then(|h| h.to_str().ok()), Some("V1#cloud1"));
    assert_eq!((job["task_id"].as_str(), job["attempt"].as_i64()), (Some(id.as_str()), Some(1)));
    assert_eq!(app.get(&format!("/v1/print-tasks/{id}"), &key).await.body["state"], "sent", "accepted is not printed");

    let good = json!({"task_id": id, "status": "printed"});
    let bad = callback(&app, "cloud1", good.clone(), "not-the-secret-at-all", now_s()).await;
    assert_eq!((bad.status, bad.code()), (StatusCode::UNAUTHORIZED, "unauthorized"));
    let replayed = callback(&app, "cloud1", good.clone(), SECRET, now_s() - 3600).await;
    assert_eq!(replayed.status, StatusCode::UNAUTHORIZED, "outside the replay window");
    let unknown = callback(
        &app,
        "cloud1",
        json!({"task_id": "01ZZZZZZZZZZZZZZZZZZZZZZZZ", "status": "printed"}),
        SECRET,
        now_s(),
    )
    .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    let ok = callback(&app, "cloud1", good.clone(), SECRET, now_s()).await;
    assert_eq!((ok.status, ok.body["result"].as_str()), (StatusCode::OK, Some("applied")));
    assert_eq!(app.get(&format!("/v1/print-tasks/{id}"), &key).await.body["state"], "printed");
    let again = callback(&app, "cloud1", good, SECRET, now_s()).await;
    assert_eq!(again.body["result"], "duplicate", "a finished task is not moved");
    let late_fail = callback(&app, "cloud1", json!({"task_id": id, "status": "failed"}), SECRET, now_s()).await;
    assert_eq!(late_fail.body["result"], "stale");
    assert_eq!(app.get(&format!("/v1/print-tasks/{id}"), &key).await.body["state"], "printed");
    app.stop().await;
}

async fn status_polling_and_unreachable_endpoints(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, fast()).await else { return };
    let key = app.tenant("acme").await;
    let (base, v) = vendor().await;
    app.post("/v1/printers", &key, json!({"id": "cloud2", "store_id": "s1",
        "transport": {"kind": "webhook", "url": format!("{base}/jobs"), "secret": SECRET, "status_url": format!("{base}/status")}}))
        .await;
    let id = app
        .submit(&key, json!({"biz_no": "S1", "printer_id": "cloud2", "content": {"type": "text", "text": "hi\n"}}))
        .await
        .body["task_id"]
        .as_str()
        .expect("id")
        .to_owned();
    wait_jobs(&v, 1).await;
    v.lock().expect("lock").status = "printed".into();
    wait_state(&app, &key, &id, "printed").await;
    assert_eq!(v.lock().expect("lock").jobs.len(), 1, "asked, never re-sent");
    // The callback arriving after the status answer changes nothing.
    let late = callback(&app, "cloud2", json!({"task_id": id, "status": "printed"}), SECRET, now_s()).await;
    assert_eq!(late.body["result"], "duplicate");

    // Nothing listening: the printer is offline, the task retries with the reason.
    app.post(
        "/v1/printers",
        &key,
        json!({"id": "cloud3", "store_id": "s1",
        "transport": {"kind": "webhook", "url": "http://127.0.0.1:9/jobs", "secret": SECRET}}),
    )
    .await;
    let id = app
        .submit(&key, json!({"biz_no": "S2", "printer_id": "cloud3", "content": {"type": "text", "text": "hi\n"}}))
        .await
        .body["task_id"]
        .as_str()
        .expect("id")
        .to_owned();
    let t = wait_state(&app, &key, &id, "retrying").await;
    assert_eq!(t["last_error"], "offline");
    let bad = app.post("/v1/printers", &key, json!({"id": "cloud4", "store_id": "s1", "transport": {"kind": "webhook", "url": "ftp://x", "secret": SECRET}})).await;
    assert_eq!(bad.code(), "invalid_request");
    let weak = app.post("/v1/printers", &key, json!({"id": "cloud4", "store_id": "s1", "transport": {"kind": "webhook", "url": "http://x", "secret": "short"}})).await;
    assert_eq!(weak.code(), "invalid_request");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callbacks_sqlite() {
    callbacks_are_signed_idempotent_and_accepted_is_not_printed(Backend::Sqlite).await
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callbacks_postgres() {
    callbacks_are_signed_idempotent_and_accepted_is_not_printed(Backend::Postgres).await
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_polling_sqlite() {
    status_polling_and_unreachable_endpoints(Backend::Sqlite).await
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_polling_postgres() {
    status_polling_and_unreachable_endpoints(Backend::Postgres).await
}
