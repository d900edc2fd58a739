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

/// What a chat group's bot received: the path with its query, and the body.
type BotCalls = std::sync::Arc<std::sync::Mutex<Vec<(String, String)>>>;

fn hmac_base64(key: &[u8], msg: &[u8]) -> String {
    use base64::Engine as _;
    use hmac::Mac;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key).expect("key");
    mac.update(msg);
    base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
}

/// `%XX` escapes decoded (a URL query's value).
fn percent_decoded(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex =
            b.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok()).and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b[i], hex) {
            (b'%', Some(x)) => {
                out.push(x);
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Bots as their vendors document them, checking signatures independently of the
/// broker's code. WeCom refuses the first message as over its rate (errcode 45009, with
/// HTTP 200 as WeCom answers); DingTalk checks `timestamp` and `sign` in the query
/// (Base64 HMAC-SHA256 of `timestamp\nsecret` with the secret, URL-encoded); Feishu checks
/// `timestamp` and `sign` in the body (HMAC-SHA256 keyed with `timestamp\nsecret` over
/// nothing); Slack answers `ok`.
async fn bots(dingtalk_secret: &'static str, feishu_secret: &'static str) -> (String, BotCalls) {
    use axum::extract::Path;
    let calls: BotCalls = Default::default();
    let seen = calls.clone();
    let app = axum::Router::new().route(
        "/{bot}",
        axum::routing::post(move |Path(bot): Path<String>, uri: axum::http::Uri, body: String| {
            let seen = seen.clone();
            async move {
                let n = {
                    let mut g = seen.lock().expect("lock");
                    g.push((uri.to_string(), body.clone()));
                    g.iter().filter(|(u, _)| u.starts_with(&format!("/{bot}"))).count()
                };
                let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
                let answer = match bot.as_str() {
                    "wecom" if n == 1 => json!({"errcode": 45009, "errmsg": "api freq out of limit"}),
                    "wecom" if v["msgtype"] == "text" && v["text"]["content"].is_string() => {
                        json!({"errcode": 0, "errmsg": "ok"})
                    }
                    "dingtalk" => {
                        let q: std::collections::HashMap<String, String> = uri
                            .query()
                            .unwrap_or("")
                            .split('&')
                            .filter_map(|kv| kv.split_once('='))
                            .map(|(k, v)| (k.to_owned(), percent_decoded(v)))
                            .collect();
                        let ts = q.get("timestamp").cloned().unwrap_or_default();
                        let want =
                            hmac_base64(dingtalk_secret.as_bytes(), format!("{ts}\n{dingtalk_secret}").as_bytes());
                        if q.get("sign") == Some(&want) && v["text"]["content"].is_string() {
                            json!({"errcode": 0, "errmsg": "ok"})
                        } else {
                            json!({"errcode": 310000, "errmsg": "sign not match"})
                        }
                    }
                    "feishu" => {
                        let ts = v["timestamp"].as_str().unwrap_or("");
                        let want = hmac_base64(format!("{ts}\n{feishu_secret}").as_bytes(), b"");
                        if v["sign"].as_str() == Some(want.as_str()) && v["msg_type"] == "text" {
                            json!({"code": 0, "msg": "success"})
                        } else {
                            json!({"code": 19021, "msg": "sign match fail"})
                        }
                    }
                    "slack" if v["text"].is_string() => return (StatusCode::OK, "ok".to_owned()),
                    _ => json!({"errcode": 40008, "errmsg": "invalid message type"}),
                };
                (StatusCode::OK, answer.to_string())
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), calls)
}

async fn delivered(app: &TestApp, key: &str, hook: &str) -> Value {
    let start = Instant::now();
    loop {
        let d = app.get(&format!("/v1/webhooks/{hook}/deliveries"), key).await.body["deliveries"].clone();
        let all = d.as_array().is_some_and(|l| !l.is_empty() && l.iter().all(|x| x["delivered_at"].is_string()));
        if all || start.elapsed() > Duration::from_secs(15) {
            return d;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn chat_group_bots_get_their_own_message_and_a_test_on_request(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, fast()).await else { return };
    let key = app.tenant("acme").await;
    let (ding, feishu) = ("SECa-dingtalk-signing-secret", "a-feishu-signing-secret");
    let (base, calls) = bots(ding, feishu).await;
    for (id, url, secret) in [
        ("wecom", format!("{base}/wecom?key=k-1"), None),
        ("dingtalk", format!("{base}/dingtalk?access_token=t-1"), Some(ding)),
        ("feishu", format!("{base}/feishu"), Some(feishu)),
        ("slack", format!("{base}/slack"), None),
    ] {
        let mut body = json!({"id": id, "url": url, "format": id, "events": ["task.failed"]});
        if let Some(s) = secret {
            body["secret"] = json!(s);
        }
        let w = app.post("/v1/webhooks", &key, body).await;
        assert_eq!((w.status, w.body["format"].as_str()), (StatusCode::CREATED, Some(id)), "{w:?}");
        assert_eq!(w.body["secret"], secret.unwrap_or(""), "a bot's secret is its own, or none");
    }
    let bad = app
        .post("/v1/webhooks", &key, json!({"id": "x", "url": base, "format": "fax", "events": ["task.failed"]}))
        .await;
    assert_eq!(bad.code(), "invalid_request", "{bad:?}");
    let listed = app.get("/v1/webhooks", &key).await.body["webhooks"].clone();
    assert_eq!(listed[0]["format"], "dingtalk", "{listed}");

    // A ticket fails: each bot gets it in its own message, in plain words.
    let token = app.call("POST", "/v1/stores/s1/agent-tokens", Some(&key), None).await.body["token"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    let id = app.submit(&key, order("B7", "x")).await.body["task_id"].as_str().unwrap_or("").to_owned();
    app.post("/v1/agent/poll", &token, json!({"agent_id": "a", "session": "s", "wait_ms": 1000})).await;
    app.post("/v1/agent/acks", &token, json!({"acks": [{"task_id": id, "attempt": 1, "outcome": "no_paper"}]})).await;
    for hook in ["wecom", "dingtalk", "feishu", "slack"] {
        let d = delivered(&app, &key, hook).await;
        assert!(d[0]["delivered_at"].is_string(), "{hook}: {d}");
    }
    // WeCom's refusal (over its rate) was tried again and is in the history.
    let wecom = delivered(&app, &key, "wecom").await;
    assert_eq!(wecom[0]["attempts"], 2, "{wecom}");
    let seen = calls.lock().expect("lock").clone();
    let text_of = |bot: &str| {
        let (_, body) = seen.iter().rev().find(|(u, _)| u.starts_with(&format!("/{bot}"))).cloned().unwrap_or_default();
        let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        let text = [&v["text"]["content"], &v["content"]["text"], &v["text"]]
            .into_iter()
            .find_map(|t| t.as_str().map(str::to_owned));
        text
    };
    for bot in ["wecom", "dingtalk", "feishu", "slack"] {
        let text = text_of(bot).unwrap_or_default();
        assert!(text.starts_with("onceprint: 打印失败 Ticket failed"), "{bot}: {text}");
        assert!(text.contains("B7") && text.contains("缺纸 no paper"), "{bot}: {text}");
    }

    // The test button: one message to that bot alone.
    let before = calls.lock().expect("lock").len();
    let t = app.call("POST", "/v1/webhooks/feishu/test", Some(&key), None).await;
    assert_eq!(t.status, StatusCode::ACCEPTED, "{t:?}");
    let d = delivered(&app, &key, "feishu").await;
    assert_eq!(
        (d[0]["event_type"].as_str(), d[0]["event_id"].as_str()),
        (Some("webhook.test"), t.body["event_id"].as_str())
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = calls.lock().expect("lock").clone();
    assert_eq!(after.len(), before + 1, "the test goes to that endpoint alone");
    assert!(after[before].1.contains("Test message"), "{:?}", after[before]);
    assert_eq!(app.call("POST", "/v1/webhooks/nope/test", Some(&key), None).await.status, StatusCode::NOT_FOUND);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_group_bots_sqlite() {
    chat_group_bots_get_their_own_message_and_a_test_on_request(Backend::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_group_bots_postgres() {
    chat_group_bots_get_their_own_message_and_a_test_on_request(Backend::Postgres).await
}
