//! `TestApp`: the real server on a real port with a real database, driven over HTTP.
//! Modelled on Zero To Production's `spawn_app()`: each test gets its own database
//! (SQLite file or PostgreSQL schema) and its own port, so tests never share state.

#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::HeaderMap;

use onceprint_server::HttpConfig;
use onceprint_store::testing::Harness;
use onceprint_store::Store;
use reqwest::StatusCode;
use serde_json::{json, Value};

pub const ADMIN: &str = "test-admin-token";

#[derive(Clone, Copy, Debug)]
pub enum Backend {
    Sqlite,
    Postgres,
}

pub struct TestApp {
    pub base: String,
    pub http: reqwest::Client,
    pub store: Arc<dyn Store>,
    _harness: Harness,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<()>>,
}

/// An HTTP answer: status and JSON body (Null when the body is not JSON).
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub body: Value,
}

impl Answer {
    /// The error code of an error body.
    pub fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("<no error code>")
    }
}

impl TestApp {
    /// Starts a broker on `backend`; `None` when that backend is not available here (the
    /// backend's harness has printed SKIPPED).
    pub async fn spawn(backend: Backend) -> Option<TestApp> {
        TestApp::spawn_with(backend, HttpConfig::default()).await
    }

    pub async fn spawn_with(backend: Backend, config: HttpConfig) -> Option<TestApp> {
        let harness = match backend {
            Backend::Sqlite => onceprint_store_sqlite::testing::fresh_store().await,
            Backend::Postgres => onceprint_store_postgres::testing::fresh_store().await,
        }?;
        Some(TestApp::spawn_on(harness, config).await)
    }

    /// A broker on an existing database (a restart).
    async fn spawn_on(harness: Harness, config: HttpConfig) -> TestApp {
        TestApp::spawn_at(harness, config, "127.0.0.1:0").await
    }

    async fn spawn_at(harness: Harness, config: HttpConfig, listen: &str) -> TestApp {
        let store = harness.store.clone();
        let (hash, _) = onceprint_server::settle_admin_token(store.as_ref(), Some(ADMIN)).await.expect("admin token");
        // The address of a broker that just stopped may take a moment to be free again.
        let mut tries = 0;
        let bound = loop {
            match onceprint_server::bind(store.clone(), hash.clone(), listen, config.clone()).await {
                Ok(b) => break b,
                Err(e) if tries < 50 => {
                    tries += 1;
                    tracing::debug!(error = %e, "address busy; binding again");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                Err(e) => panic!("bind {listen}: {e}"),
            }
        };
        let addr = bound.local_addr().expect("addr");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            bound
                .serve(async {
                    let _ = rx.await;
                })
                .await
                .expect("serve");
        });
        TestApp {
            base: format!("http://{addr}"),
            http: reqwest::Client::new(),
            store,
            _harness: harness,
            shutdown: Some(tx),
            server: Some(server),
        }
    }

    /// Stops this broker and starts a new one on the same database: the new process knows
    /// only what the database holds, on the same address (printers that call in keep the
    /// broker's URL they were set up with).
    pub async fn restart(mut self, config: HttpConfig) -> TestApp {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(h) = self.server.take() {
            let _ = h.await;
        }
        let harness = std::mem::replace(
            &mut self._harness,
            Harness { store: self.store.clone(), guard: Box::new(()), url: String::new() },
        );
        let listen = self.base.trim_start_matches("http://").to_owned();
        TestApp::spawn_at(harness, config, &listen).await
    }

    /// Runs SQL statements straight on the broker's database (fault injection in tests).
    pub async fn sql(&self, statements: &str) {
        let url = self._harness.url.clone();
        if let Some(path) = url.strip_prefix("sqlite://") {
            let (path, statements) = (path.to_owned(), statements.to_owned());
            tokio::task::spawn_blocking(move || {
                let c = rusqlite::Connection::open(path).expect("open the test database");
                c.busy_timeout(std::time::Duration::from_secs(10)).expect("busy timeout");
                c.execute_batch(&statements).expect("statements");
            })
            .await
            .expect("sql task");
        } else {
            let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.expect("connect");
            let driver = tokio::spawn(connection);
            client.batch_execute(statements).await.expect("statements");
            drop(client);
            let _ = driver.await;
        }
    }

    pub fn is_postgres(&self) -> bool {
        !self._harness.url.starts_with("sqlite://")
    }

    pub async fn call(&self, method: &str, path: &str, token: Option<&str>, body: Option<Value>) -> Answer {
        let mut req = self.http.request(method.parse().expect("method"), format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let res = req.send().await.expect("request");
        let status = res.status();
        let text = res.text().await.expect("body");
        Answer { status, body: serde_json::from_str(&text).unwrap_or(Value::Null) }
    }

    pub async fn raw(&self, path: &str, token: &str, body: Vec<u8>) -> Answer {
        let res = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(token)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("request");
        let status = res.status();
        let text = res.text().await.expect("body");
        Answer { status, body: serde_json::from_str(&text).unwrap_or(Value::Null) }
    }

    pub async fn get(&self, path: &str, token: &str) -> Answer {
        self.call("GET", path, Some(token), None).await
    }

    pub async fn post(&self, path: &str, token: &str, body: Value) -> Answer {
        self.call("POST", path, Some(token), Some(body)).await
    }

    /// Creates tenant `id` with store s1 and printers p1, p2 in it; returns its API key.
    pub async fn tenant(&self, id: &str) -> String {
        let a = self.post("/v1/tenants", ADMIN, json!({"id": id, "name": format!("Tenant {id}")})).await;
        assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
        let key = a.body["api_key"].as_str().expect("api_key").to_owned();
        let a = self.post("/v1/stores", &key, json!({"id": "s1", "name": "Main street"})).await;
        assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
        for p in ["p1", "p2"] {
            let a = self
                .post(
                    "/v1/printers",
                    &key,
                    json!({"id": p, "store_id": "s1", "name": format!("Printer {p}"),
                           "transport": {"kind": "agent", "address": "tcp://192.0.2.10:9100"}}),
                )
                .await;
            assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
        }
        key
    }

    pub async fn submit(&self, key: &str, body: Value) -> Answer {
        self.post("/v1/print-tasks", key, body).await
    }

    /// All tasks of the tenant (follows cursors).
    pub async fn all_tasks(&self, key: &str) -> Vec<Value> {
        let mut out = Vec::new();
        let mut cursor = String::new();
        loop {
            let a = self.get(&format!("/v1/print-tasks?limit=100&cursor={cursor}"), key).await;
            assert_eq!(a.status, StatusCode::OK, "{a:?}");
            out.extend(a.body["tasks"].as_array().cloned().unwrap_or_default());
            match a.body["next_cursor"].as_str() {
                Some(c) => cursor = c.to_owned(),
                None => return out,
            }
        }
    }

    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(h) = self.server.take() {
            let _ = h.await;
        }
    }
}

pub type Received = Arc<Mutex<Vec<(HeaderMap, String)>>>;

/// A receiver that answers 500 to the first `fail_first` requests, then 204.
pub async fn receiver(fail_first: usize) -> (String, Received) {
    let got: Received = Arc::default();
    let seen = got.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: HeaderMap, body: String| {
            let seen = seen.clone();
            async move {
                let mut g = seen.lock().expect("lock");
                g.push((headers, body));
                if g.len() <= fail_first {
                    StatusCode::INTERNAL_SERVER_ERROR
                } else {
                    StatusCode::NO_CONTENT
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}/hook"), got)
}

/// `t=…,v1=…`: a body signed the way the broker signs and checks callbacks, computed
/// here independently of the broker's code.
pub fn sign(secret: &str, ts: i64, body: &str) -> String {
    use hmac::Mac;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).expect("key");
    mac.update(format!("{ts}.{body}").as_bytes());
    let hex: String = mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect();
    format!("t={ts},v1={hex}")
}

/// A vendor's report on `POST /v1/callbacks/{printer}`, signed with `secret` at `ts`.
pub async fn callback(app: &TestApp, printer: &str, body: Value, secret: &str, ts: i64) -> Answer {
    let text = body.to_string();
    let res = app
        .http
        .post(format!("{}/v1/callbacks/{printer}", app.base))
        .header("content-type", "application/json")
        .header("x-onceprint-signature", sign(secret, ts, &text))
        .body(text)
        .send()
        .await
        .expect("callback");
    let status = res.status();
    Answer { status, body: res.json().await.unwrap_or(Value::Null) }
}

/// A typical text submission.
pub fn order(biz_no: &str, text: &str) -> Value {
    json!({"biz_no": biz_no, "printer_id": "p1", "content": {"type": "text", "text": text}})
}

/// A store agent played over HTTP.
#[derive(Clone)]
pub struct Agent {
    pub token: String,
    pub id: String,
    pub session: String,
}

impl Agent {
    pub async fn new(app: &TestApp, key: &str, id: &str, session: &str) -> Agent {
        let a = app.call("POST", "/v1/stores/s1/agent-tokens", Some(key), None).await;
        assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
        Agent { token: a.body["token"].as_str().expect("token").into(), id: id.into(), session: session.into() }
    }

    pub async fn poll_answer(&self, app: &TestApp, wait_ms: u64) -> Answer {
        app.post(
            "/v1/agent/poll",
            &self.token,
            json!({"agent_id": self.id, "session": self.session, "wait_ms": wait_ms, "max": 16}),
        )
        .await
    }

    pub async fn poll(&self, app: &TestApp, wait_ms: u64) -> Vec<Value> {
        let a = self.poll_answer(app, wait_ms).await;
        assert_eq!(a.status, StatusCode::OK, "{a:?}");
        a.body["deliveries"].as_array().cloned().expect("deliveries")
    }

    /// Polls until something comes or `within` passes.
    pub async fn poll_until(&self, app: &TestApp, within: Duration) -> Vec<Value> {
        let start = Instant::now();
        loop {
            let d = self.poll(app, 300).await;
            if !d.is_empty() || start.elapsed() > within {
                return d;
            }
        }
    }

    pub async fn acks(&self, app: &TestApp, acks: &[(&str, i64, &str)]) -> Vec<String> {
        let list: Vec<Value> =
            acks.iter().map(|(t, n, o)| json!({"task_id": t, "attempt": n, "outcome": o, "detail": "test"})).collect();
        let a = app
            .post("/v1/agent/acks", &self.token, json!({"agent_id": self.id, "session": self.session, "acks": list}))
            .await;
        assert_eq!(a.status, StatusCode::OK, "{a:?}");
        a.body["results"]
            .as_array()
            .expect("results")
            .iter()
            .map(|r| r["result"].as_str().unwrap_or("").into())
            .collect()
    }

    pub async fn ack(&self, app: &TestApp, task: &str, attempt: i64, outcome: &str) -> String {
        self.acks(app, &[(task, attempt, outcome)]).await.remove(0)
    }
}

pub fn task_of(d: &Value) -> (String, i64) {
    (d["task_id"].as_str().unwrap_or("").to_owned(), d["attempt"].as_i64().unwrap_or(0))
}

/// Generates `NAME_sqlite` and `NAME_postgres` tests from one async fn taking a `TestApp`.
#[macro_export]
macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        $crate::both_backends!(config = $crate::common::default_config; $($name),*);
    };
    // With `config = f`: each broker starts with `f()` (an `HttpConfig`).
    (config = $config:path; $($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let Some(app) =
                        $crate::common::TestApp::spawn_with($crate::common::Backend::Sqlite, $config()).await
                    else { return };
                    super::$name(&app).await;
                    app.stop().await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let Some(app) =
                        $crate::common::TestApp::spawn_with($crate::common::Backend::Postgres, $config()).await
                    else { return };
                    super::$name(&app).await;
                    app.stop().await;
                }
            )*
        }
    };
}

/// One `#[tokio::test]` per backend for each `async fn name(backend: Backend)`: for tests
/// that start (and restart) brokers themselves.
#[macro_export]
macro_rules! per_backend {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::common::Backend::Sqlite).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::common::Backend::Postgres).await;
                }
            )*
        }
    };
}

/// The broker configuration of most tests.
pub fn default_config() -> HttpConfig {
    HttpConfig::default()
}

/// Short timings for printers that poll: retries due at once, a printer polling every
/// second is offline after 2.3 s of silence (and its fetched job in doubt after 2.3 s of
/// idle polls).
#[allow(dead_code)]
pub fn fast_polled() -> HttpConfig {
    let mut c = HttpConfig::default();
    c.polled.default_poll_interval_s = 1;
    c.polled.offline_grace_ms = 300;
    c.polled.check_interval_ms = 50;
    for p in c.intake.policies.types.values_mut() {
        p.backoff.initial_ms = 50;
        p.backoff.cap_ms = 200;
        p.backoff.jitter = 0.0;
    }
    c
}

/// Creates printer `id` in store s1 with `transport` (a kind that logs in) and returns its
/// login from the creation answer.
pub async fn printer_with_login(app: &TestApp, key: &str, id: &str, transport: Value) -> (String, String) {
    let a = app
        .post(
            "/v1/printers",
            key,
            json!({"id": id, "store_id": "s1", "name": format!("Printer {id}"), "transport": transport}),
        )
        .await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    let c = &a.body["credentials"];
    (c["username"].as_str().expect("username").to_owned(), c["password"].as_str().expect("password").to_owned())
}

/// The audit trail of a task as (from, to, reason).
pub async fn events_of(app: &TestApp, key: &str, id: &str) -> Vec<(String, String, String)> {
    let e = app.get(&format!("/v1/print-tasks/{id}/events"), key).await.body;
    e["events"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|e| {
            (
                e["from"].as_str().unwrap_or("").to_owned(),
                e["to"].as_str().unwrap_or("").to_owned(),
                e["reason"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

/// Waits until task `id` is in `state`; panics with its audit trail otherwise.
pub async fn wait_state(app: &TestApp, key: &str, id: &str, state: &str, within: Duration) -> Value {
    let start = Instant::now();
    loop {
        let t = app.get(&format!("/v1/print-tasks/{id}"), key).await.body;
        if t["state"] == state {
            return t;
        }
        assert!(start.elapsed() < within, "never {state}: {t}\n{:#?}", events_of(app, key, id).await);
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
}

/// The `printjobid` of an Epson PrintRequestInfo.
#[allow(dead_code)]
pub fn job_id(xml: &str) -> String {
    let start = xml.find("<printjobid>").map(|i| i + "<printjobid>".len());
    let end = xml.find("</printjobid>");
    match (start, end) {
        (Some(s), Some(e)) if s <= e => xml[s..e].to_owned(),
        _ => panic!("no printjobid in {xml}"),
    }
}
