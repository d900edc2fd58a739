//! The store agent protocol as an agent sees it: long polls, deliveries, acks and their
//! idempotency, on SQLite and PostgreSQL.

mod common;

use std::time::{Duration, Instant};

use base64::Engine as _;
use common::{order, TestApp};
use reqwest::StatusCode;
use serde_json::{json, Value};

both_backends!(
    a_submitted_task_is_delivered_once_and_acked_printed,
    a_restarted_agent_gets_its_unconfirmed_delivery_again,
    recoverable_outcomes_schedule_a_retry,
    doubt_waits_for_a_person,
    long_poll_wakes_up_on_submission,
    agents_only_see_and_ack_their_own_store,
    bad_agent_requests_are_refused,
    agent_protocol_versions_outside_the_range_are_refused_clearly,
    acks_with_next_hand_out_the_next_task_of_the_lanes_they_free,
);

async fn agent_token(app: &TestApp, key: &str, store: &str) -> String {
    let a = app.call("POST", &format!("/v1/stores/{store}/agent-tokens"), Some(key), None).await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    a.body["token"].as_str().expect("token").to_owned()
}

async fn poll(app: &TestApp, token: &str, session: &str, wait_ms: u64) -> Vec<Value> {
    let a = app
        .post(
            "/v1/agent/poll",
            token,
            json!({"agent_id": "agent-1", "session": session, "wait_ms": wait_ms, "max": 16}),
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    a.body["deliveries"].as_array().cloned().expect("deliveries")
}

async fn ack(app: &TestApp, token: &str, task: &str, attempt: i64, outcome: &str) -> String {
    let a = app
        .post("/v1/agent/acks", token, json!({"agent_id": "agent-1", "acks": [{"task_id": task, "attempt": attempt, "outcome": outcome, "detail": "test"}]}))
        .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    a.body["results"][0]["result"].as_str().expect("result").to_owned()
}

async fn state(app: &TestApp, key: &str, id: &str) -> Value {
    app.get(&format!("/v1/print-tasks/{id}"), key).await.body
}

async fn a_submitted_task_is_delivered_once_and_acked_printed(app: &TestApp) {
    let key = app.tenant("acme").await;
    let token = agent_token(app, &key, "s1").await;
    assert!(poll(app, &token, "s1", 50).await.is_empty());
    let id = app.submit(&key, order("A1#kitchen", "Table 5\n")).await.body["task_id"].as_str().expect("id").to_owned();
    let d = poll(app, &token, "s1", 1000).await;
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0]["task_id"], id.as_str());
    assert_eq!(d[0]["attempt"], 1);
    assert_eq!(d[0]["printer_id"], "p1");
    assert_eq!(d[0]["printer_address"], "tcp://192.0.2.10:9100");
    assert_eq!(d[0]["idempotency_key"], "A1%23kitchen#p1", "a `#` inside biz_no is escaped (docs/API.md)");
    assert_eq!(d[0]["content_type"], "escpos");
    let bytes = base64::engine::general_purpose::STANDARD.decode(d[0]["data"].as_str().expect("data")).expect("base64");
    assert_eq!(&bytes[..2], &[0x1B, 0x40], "starts with ESC @");
    assert!(bytes.windows(8).any(|w| w == b"Table 5\n"));
    assert_eq!(state(app, &key, &id).await["state"], "sent");
    // The lane is busy: the same agent session gets nothing more.
    assert!(poll(app, &token, "s1", 50).await.is_empty());

    assert_eq!(ack(app, &token, &id, 1, "printed").await, "applied");
    let t = state(app, &key, &id).await;
    assert_eq!((t["state"].as_str(), t["attempts"].as_i64()), (Some("printed"), Some(1)));
    assert!(t["printed_at"].is_string());
    assert_eq!(ack(app, &token, &id, 1, "printed").await, "duplicate");
    assert_eq!(ack(app, &token, &id, 1, "no_paper").await, "stale", "a finished task is not moved");
    assert_eq!(ack(app, &token, "01ZZZZZZZZZZZZZZZZZZZZZZZZ", 1, "printed").await, "stale");
    // A duplicate submission now answers "printed".
    let again = app.submit(&key, order("A1#kitchen", "Table 5\n")).await;
    assert_eq!((again.status, again.body["state"].as_str()), (StatusCode::OK, Some("printed")));
    let p = app.get("/v1/printers/p1", &key).await.body;
    assert_eq!((p["online"].as_bool(), p["last_error"].is_null()), (Some(true), true), "{p}");
}

async fn a_restarted_agent_gets_its_unconfirmed_delivery_again(app: &TestApp) {
    let key = app.tenant("acme").await;
    let token = agent_token(app, &key, "s1").await;
    let id = app.submit(&key, order("R1", "x")).await.body["task_id"].as_str().expect("id").to_owned();
    assert_eq!(poll(app, &token, "first", 1000).await.len(), 1);
    // Same agent id, new session: it crashed and came back. Once the first process has
    // been quiet for `takeover_quiet_ms` (3 s), its delivery comes to the new one, as a new
    // attempt: the attempt is the fencing token.
    let start = Instant::now();
    let again = poll(app, &token, "second", 10_000).await;
    assert_eq!(again.len(), 1);
    assert!(start.elapsed() >= Duration::from_millis(2_500), "taken over too early: {:?}", start.elapsed());
    assert!(start.elapsed() < Duration::from_millis(6_000), "taken over too late: {:?}", start.elapsed());
    assert_eq!((again[0]["task_id"].as_str(), again[0]["attempt"].as_i64()), (Some(id.as_str()), Some(2)));
    let events = app.get(&format!("/v1/print-tasks/{id}/events"), &key).await.body;
    let tos: Vec<&str> = events["events"].as_array().expect("events").iter().filter_map(|e| e["to"].as_str()).collect();
    assert_eq!(tos, vec!["pending", "sent", "sent"], "the redelivery is audited");
    assert_eq!(ack(app, &token, &id, 1, "no_paper").await, "stale", "the old attempt cannot move it any more");
    assert_eq!(ack(app, &token, &id, 2, "printed").await, "applied");
}

async fn recoverable_outcomes_schedule_a_retry(app: &TestApp) {
    let key = app.tenant("acme").await;
    let token = agent_token(app, &key, "s1").await;
    let id = app.submit(&key, order("N1", "x")).await.body["task_id"].as_str().expect("id").to_owned();
    assert_eq!(poll(app, &token, "s", 1000).await.len(), 1);
    assert_eq!(ack(app, &token, &id, 1, "no_paper").await, "applied");
    let t = state(app, &key, &id).await;
    assert_eq!((t["state"].as_str(), t["last_error"].as_str()), (Some("retrying"), Some("no_paper")));
    assert!(t["next_attempt_at"].is_string());
    let p = app.get("/v1/printers/p1", &key).await.body;
    assert_eq!(p["last_error"], "no_paper");
    assert_eq!(ack(app, &token, &id, 1, "no_paper").await, "duplicate");
    // Default receipt policy: first retry after about a second (jitter shortens it).
    let start = Instant::now();
    let d = poll(app, &token, "s", 5000).await;
    assert_eq!(d.len(), 1);
    assert_eq!(d[0]["attempt"], 2);
    assert!(start.elapsed() >= Duration::from_millis(500), "retried too early: {:?}", start.elapsed());
    assert_eq!(ack(app, &token, &id, 1, "printed").await, "applied", "a late PRINTED for attempt 1 still counts");
    assert_eq!(ack(app, &token, &id, 2, "printed").await, "duplicate");
}

async fn doubt_waits_for_a_person(app: &TestApp) {
    let key = app.tenant("acme").await;
    let token = agent_token(app, &key, "s1").await;
    let id = app.submit(&key, order("D1", "x")).await.body["task_id"].as_str().expect("id").to_owned();
    assert_eq!(poll(app, &token, "s", 1000).await.len(), 1);
    assert_eq!(ack(app, &token, &id, 1, "in_doubt").await, "applied");
    assert_eq!(state(app, &key, &id).await["state"], "in_doubt");
    // Never offered again.
    assert!(poll(app, &token, "other-session", 100).await.is_empty());
    let doubtful = app.get("/v1/print-tasks?state=in_doubt", &key).await.body;
    assert_eq!(doubtful["tasks"][0]["task_id"], id.as_str());
}

async fn long_poll_wakes_up_on_submission(app: &TestApp) {
    let key = app.tenant("acme").await;
    let token = agent_token(app, &key, "s1").await;
    let start = Instant::now();
    let (d, _) = tokio::join!(poll(app, &token, "s", 10_000), async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        app.submit(&key, order("W1", "x")).await
    });
    assert_eq!(d.len(), 1);
    assert!(start.elapsed() < Duration::from_secs(3), "the poll slept past the submission: {:?}", start.elapsed());
}

async fn agents_only_see_and_ack_their_own_store(app: &TestApp) {
    let key = app.tenant("acme").await;
    app.post("/v1/stores", &key, json!({"id": "s2", "name": "Other"})).await;
    let other = agent_token(app, &key, "s2").await;
    let mine = agent_token(app, &key, "s1").await;
    let id = app.submit(&key, order("I1", "x")).await.body["task_id"].as_str().expect("id").to_owned();
    assert!(poll(app, &other, "s", 100).await.is_empty(), "another store's agent sees nothing");
    assert_eq!(poll(app, &mine, "s", 1000).await.len(), 1);
    assert_eq!(ack(app, &other, &id, 1, "printed").await, "stale", "nor can it ack");
    assert_eq!(state(app, &key, &id).await["state"], "sent");
    let b = app.tenant("bistro").await;
    let theirs = agent_token(app, &b, "s1").await;
    assert!(poll(app, &theirs, "s", 100).await.is_empty(), "nor another tenant's agent");
}

async fn bad_agent_requests_are_refused(app: &TestApp) {
    let key = app.tenant("acme").await;
    let token = agent_token(app, &key, "s1").await;
    let a = app.post("/v1/agent/poll", "opa_wrong", json!({"agent_id": "a"})).await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    let a = app.post("/v1/agent/poll", &key, json!({"agent_id": "a"})).await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED, "a tenant key is not an agent token");
    let a = app.post("/v1/agent/poll", &token, json!({"agent_id": "bad id!"})).await;
    assert_eq!(a.code(), "invalid_request");
    let a = app
        .post("/v1/agent/acks", &token, json!({"acks": [{"task_id": "x", "attempt": 1, "outcome": "smudged"}]}))
        .await;
    assert_eq!(a.code(), "invalid_request");
    assert!(a.body["error"]["message"].as_str().unwrap_or("").contains("smudged"));
}

/// An agent request naming `version` (or none); the answer's status, error code and
/// message, and the range header.
async fn poll_as_version(app: &TestApp, token: &str, version: Option<&str>) -> (StatusCode, Value, Option<String>) {
    let mut req = app
        .http
        .post(format!("{}/v1/agent/poll", app.base))
        .bearer_auth(token)
        .json(&json!({"agent_id": "agent-1", "session": "s1", "wait_ms": 0, "max": 1}));
    if let Some(v) = version {
        req = req.header("Onceprint-Agent-Protocol", v);
    }
    let resp = req.send().await.expect("poll");
    let status = resp.status();
    let range = resp.headers().get("onceprint-agent-protocols").and_then(|v| v.to_str().ok()).map(str::to_owned);
    (status, resp.json().await.unwrap_or_default(), range)
}

async fn agent_protocol_versions_outside_the_range_are_refused_clearly(app: &TestApp) {
    let key = app.tenant("acme").await;
    let token = agent_token(app, &key, "s1").await;
    // Agents of releases before versioning send no header and must keep working, as 1.
    // Version 2 (acks that take the next deliveries), 3 (polls that say the session's
    // age) and 4 (uploads that say the agent's clock) are served beside it.
    for version in [None, Some("1"), Some(" 1 "), Some("2"), Some("3"), Some("4")] {
        let (status, body, range) = poll_as_version(app, &token, version).await;
        assert_eq!(status, StatusCode::OK, "{version:?}: {body}");
        assert_eq!(range.as_deref(), Some("1-4"), "every answer names the broker's range");
    }
    // An agent newer than the broker is told to upgrade the broker (or run an older agent).
    let (status, body, range) = poll_as_version(app, &token, Some("5")).await;
    assert_eq!(status, StatusCode::UPGRADE_REQUIRED, "{body}");
    assert_eq!(body["error"]["code"], "agent_protocol_unsupported", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("upgrade the broker") && message.contains('5'), "{message}");
    assert_eq!(range.as_deref(), Some("1-4"));
    // An agent older than the broker serves is told to upgrade the agent.
    let (status, body, _) = poll_as_version(app, &token, Some("0")).await;
    assert_eq!(status, StatusCode::UPGRADE_REQUIRED, "{body}");
    assert!(body["error"]["message"].as_str().unwrap_or_default().contains("upgrade the agent"), "{body}");
    let (status, body, _) = poll_as_version(app, &token, Some("one")).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (StatusCode::UPGRADE_REQUIRED, Some("agent_protocol_unsupported"))
    );
    // Nothing of a refused request took effect, and other endpoints carry the range too.
    let a = app.http.get(format!("{}/healthz", app.base)).send().await.expect("healthz");
    assert_eq!(a.headers().get("onceprint-agent-protocols").and_then(|v| v.to_str().ok()), Some("1-4"));
}

/// Agent protocol 2: acks that ask for `next` get the next task of each lane they free in
/// the answer, exactly as a poll would hand it out (a new attempt, `sent` to the agent,
/// audited), and nothing for a lane they leave busy or paused. Without `next` the answer
/// is the contract's.
async fn acks_with_next_hand_out_the_next_task_of_the_lanes_they_free(app: &TestApp) {
    let key = app.tenant("acme").await;
    let token = agent_token(app, &key, "s1").await;
    let mut ids = Vec::new();
    for (biz, text) in [("N1", "first\n"), ("N2", "second\n"), ("N3", "third\n")] {
        ids.push(app.submit(&key, order(biz, text)).await.body["task_id"].as_str().expect("id").to_owned());
    }
    let d = poll(app, &token, "s1", 1000).await;
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0]["task_id"], ids[0].as_str());
    let acks = |task: &str, attempt: i64, outcome: &str, next: Value| {
        let mut body = json!({"agent_id": "agent-1", "session": "s1",
            "acks": [{"task_id": task, "attempt": attempt, "outcome": outcome, "detail": "test"}]});
        if !next.is_null() {
            body["next"] = next;
        }
        body
    };
    // N1 printed: its answer hands out N2, whose lane N1 freed.
    let a = app.post("/v1/agent/acks", &token, acks(&ids[0], 1, "printed", json!(4))).await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    assert_eq!(a.body["results"][0]["result"], "applied");
    let next = a.body["deliveries"].as_array().cloned().expect("deliveries");
    assert_eq!(next.len(), 1, "{next:?}");
    assert_eq!((next[0]["task_id"].as_str(), next[0]["attempt"].as_i64()), (Some(ids[1].as_str()), Some(1)));
    assert_eq!(next[0]["printer_id"], "p1");
    assert_eq!(next[0]["idempotency_key"], "N2#p1");
    let bytes = base64::engine::general_purpose::STANDARD.decode(next[0]["data"].as_str().expect("data")).expect("b64");
    assert!(bytes.windows(7).any(|w| w == b"second\n"), "the task's own bytes");
    assert_eq!(state(app, &key, &ids[0]).await["state"], "printed");
    assert_eq!(state(app, &key, &ids[1]).await["state"], "sent");
    let events = app.get(&format!("/v1/print-tasks/{}/events", ids[1]), &key).await.body;
    let tos: Vec<&str> = events["events"].as_array().expect("events").iter().filter_map(|e| e["to"].as_str()).collect();
    assert_eq!(tos, vec!["pending", "sent"], "the hand-out is audited like a poll's");
    // The lane is busy with N2: a poll gets nothing, and a repeated ack hands out nothing.
    assert!(poll(app, &token, "s1", 50).await.is_empty());
    let again = app.post("/v1/agent/acks", &token, acks(&ids[0], 1, "printed", json!(4))).await;
    assert_eq!(again.body["results"][0]["result"], "duplicate");
    assert_eq!(again.body["deliveries"], json!([]));
    // N2 out of paper: the lane is paused, not freed; nothing is handed out.
    let paused = app.post("/v1/agent/acks", &token, acks(&ids[1], 1, "no_paper", json!(4))).await;
    assert_eq!(paused.body["results"][0]["result"], "applied");
    assert_eq!(paused.body["deliveries"], json!([]), "{paused:?}");
    assert_eq!(state(app, &key, &ids[2]).await["state"], "pending");
    // Without `next`, the answer is the contract's: results only.
    let plain = app.post("/v1/agent/acks", &token, acks(&ids[1], 1, "no_paper", Value::Null)).await;
    assert_eq!(plain.body["results"][0]["result"], "duplicate");
    assert!(plain.body.get("deliveries").is_none(), "{plain:?}");
    // A `next` that is not a count is refused before anything applies.
    let bad = app.post("/v1/agent/acks", &token, acks(&ids[1], 1, "printed", json!(-1))).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{bad:?}");
    assert_eq!(state(app, &key, &ids[1]).await["state"], "retrying");
}
