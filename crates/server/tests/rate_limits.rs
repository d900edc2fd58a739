//! Fairness under retry storms: a tenant over its rate limit is answered 429
//! with `Retry-After` and the JSON error body, while its retries of accepted tasks are
//! still answered and other tenants are not affected; a store's agent has a limit of
//! its own, which grows with the agent printers the store has. On SQLite and PostgreSQL.

mod common;

use common::{order, Agent, TestApp};
use onceprint_engine::limits::RateLimit;
use onceprint_server::HttpConfig;
use reqwest::StatusCode;
use serde_json::{json, Value};

/// Buckets that refill so slowly (one token in 100 s) that a test's few seconds never
/// earn a token back: every count below is exact.
fn limited() -> HttpConfig {
    let mut c = HttpConfig::default();
    c.intake.tenant_rate = Some(RateLimit::new(0.01, 10.0));
    c.agent_rate = Some(RateLimit::new(0.01, 3.0));
    // The configured limit alone, whatever the store drives (see `scaled` for the rest).
    c.agent_rate_per_printer = 0.0;
    c
}

/// An agent's budget of `0.01/s` with a burst of 3 for a store of one agent printer, and
/// as much again for each further printer: a store of 2 printers has a burst of 6, a
/// store of 30 a burst of 90. Refills so slow that the counts below are exact but for a
/// token or two over a slow test.
fn scaled() -> HttpConfig {
    HttpConfig { agent_rate: Some(RateLimit::new(0.01, 3.0)), agent_rate_per_printer: 0.01, ..HttpConfig::default() }
}

both_backends!(config = crate::limited;
    a_tenant_over_its_limit_is_refused_but_its_duplicates_are_answered,
    a_batch_over_the_limit_refuses_its_new_items_one_by_one,
    a_store_agent_has_a_limit_of_its_own
);

mod per_printer {
    use super::*;
    both_backends!(config = crate::scaled;
        a_busy_agent_has_a_budget_that_grows_with_its_printers,
        printers_added_later_raise_the_budget
    );
}

/// The status, `Retry-After` and JSON body of a submission.
async fn submit_raw(app: &TestApp, key: &str, body: Value) -> (StatusCode, Option<String>, Value) {
    let res = app
        .http
        .post(format!("{}/v1/print-tasks", app.base))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .expect("request");
    let status = res.status();
    let retry = res.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let ct = res.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let text = res.text().await.expect("body");
    if !status.is_success() {
        assert!(ct.starts_with("application/json"), "{status} answered as {ct:?}: {text}");
    }
    (status, retry, serde_json::from_str(&text).unwrap_or(Value::Null))
}

async fn a_tenant_over_its_limit_is_refused_but_its_duplicates_are_answered(app: &TestApp) {
    // `tenant` makes a store and two printers: 3 of the 10 tokens.
    let key = app.tenant("acme").await;
    let other = app.tenant("bistro").await;
    let (status, _, first) = submit_raw(app, &key, order("A0", "soup")).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    // Retries of a known task take no token, however many there are.
    for _ in 0..50 {
        let (status, _, dup) = submit_raw(app, &key, order("A0", "soup")).await;
        assert_eq!(status, StatusCode::OK, "{dup}");
        assert_eq!(dup["duplicate"], true);
    }
    // Six tokens left: six new tasks, then 429.
    for i in 1..=6 {
        let (status, _, body) = submit_raw(app, &key, order(&format!("A{i}"), "noodles")).await;
        assert_eq!(status, StatusCode::CREATED, "A{i}: {body}");
    }
    let (status, retry, body) = submit_raw(app, &key, order("A7", "rice")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["error"]["code"], "too_many_requests", "{body}");
    let seconds: u64 = retry.as_deref().and_then(|r| r.parse().ok()).expect("Retry-After in whole seconds");
    assert!((1..=100).contains(&seconds), "Retry-After: {seconds}");
    // Over the limit, a retry of an accepted task still gets its task and state …
    let (status, _, dup) = submit_raw(app, &key, order("A3", "noodles")).await;
    assert_eq!(status, StatusCode::OK, "{dup}");
    assert_eq!(dup["duplicate"], true);
    assert_eq!(dup["state"], "pending");
    // … and a changed retry is still told it conflicts, not to slow down.
    let (status, _, mismatch) = submit_raw(app, &key, order("A3", "other content")).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{mismatch}");
    // The tenant's other calls draw from the same bucket.
    let list = app.get("/v1/print-tasks", &key).await;
    assert_eq!(list.status, StatusCode::TOO_MANY_REQUESTS, "{list:?}");
    assert_eq!(list.code(), "too_many_requests");
    // Nothing was created for the refused submission.
    let a7 =
        onceprint_core::IdempotencyKey::new("acme", &onceprint_core::Target::Printer("p1".into()), "A7", "receipt");
    assert!(app.store.find_task(&a7).await.expect("find").is_none(), "a refused submission left a task");
    // Another tenant is not affected.
    let (status, _, theirs) = submit_raw(app, &other, order("B1", "tea")).await;
    assert_eq!(status, StatusCode::CREATED, "{theirs}");
    // A missing biz_no is still refused first, before the limit is looked at.
    let (status, _, body) =
        submit_raw(app, &key, json!({"printer_id": "p1", "content": {"type": "text", "text": "x"}})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::BAD_REQUEST, Some("missing_biz_no")));
}

async fn a_store_agent_has_a_limit_of_its_own(app: &TestApp) {
    let key = app.tenant("acme").await;
    let agent = Agent::new(app, &key, "a1", "s1").await;
    let (status, _, body) = submit_raw(app, &key, order("K1", "noodles")).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let mut delivered = None;
    for _ in 0..3 {
        let a = agent.poll_answer(app, 0).await;
        assert_eq!(a.status, StatusCode::OK, "{a:?}");
        if let Some(d) = a.body["deliveries"].as_array().and_then(|d| d.first()) {
            delivered = Some(common::task_of(d));
        }
    }
    let a = agent.poll_answer(app, 0).await;
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS, "{a:?}");
    assert_eq!(a.code(), "too_many_requests");
    // An ack finishes work and is never refused: over its limit, the agent still reports
    // what its printer did, and the ticket is printed.
    let (task, attempt) = delivered.expect("the first poll handed out K1");
    assert_eq!(agent.ack(app, &task, attempt, "printed").await, "applied");
    let t = app.get(&format!("/v1/print-tasks/{task}"), &key).await;
    assert_eq!(t.body["state"], "printed", "{t:?}");
    // The tenant's own calls are not the agent's: intake goes on.
    let (status, _, body) = submit_raw(app, &key, order("A1", "soup")).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

/// A batch draws one token per new task, like single submissions: past the limit its new
/// items are answered 429 each, with `retry_after_secs`, while its repeats of accepted
/// tasks are answered; sent again, it creates nothing twice.
async fn a_batch_over_the_limit_refuses_its_new_items_one_by_one(app: &TestApp) {
    // `tenant` makes a store and two printers: 3 of the 10 tokens; A0 takes a fourth.
    let key = app.tenant("acme").await;
    let (status, _, first) = submit_raw(app, &key, order("A0", "soup")).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    let mut items = vec![order("A0", "soup")];
    items.extend((1..=8).map(|i| order(&format!("B{i}"), "noodles")));
    let batch = json!({ "tasks": items });
    let statuses = |a: &common::Answer| -> Vec<u64> {
        assert_eq!(a.status, StatusCode::OK, "{a:?}");
        a.body["results"].as_array().expect("results").iter().map(|r| r["status"].as_u64().unwrap_or(0)).collect()
    };
    let answer = app.post("/v1/print-task-batches", &key, batch.clone()).await;
    let first = statuses(&answer);
    assert_eq!(first[0], 200, "the repeat takes no token: {answer:?}");
    assert_eq!(first[1..].iter().filter(|s| **s == 201).count(), 6, "six tokens left: {answer:?}");
    assert_eq!(first[1..].iter().filter(|s| **s == 429).count(), 2, "{answer:?}");
    for r in answer.body["results"].as_array().expect("results").iter().filter(|r| r["status"] == 429) {
        assert_eq!(r["error"]["code"], "too_many_requests", "{r}");
        let seconds = r["retry_after_secs"].as_u64().expect("retry_after_secs");
        assert!((1..=100).contains(&seconds), "{r}");
    }
    // Sent again: what was created is answered as duplicates, the rest is refused again.
    let again = statuses(&app.post("/v1/print-task-batches", &key, batch).await);
    let expected: Vec<u64> = first.iter().map(|s| if *s == 201 { 200 } else { *s }).collect();
    assert_eq!(again, expected);
}

/// Polls (answered at once) until the first refusal, at most `max`: how many got through,
/// the refusal's `Retry-After` if one came, and the deliveries handed out on the way.
async fn polls_until_refused(app: &TestApp, agent: &Agent, max: usize) -> (usize, Option<u64>, Vec<Value>) {
    let mut deliveries = Vec::new();
    for n in 0..max {
        let res = app
            .http
            .post(format!("{}/v1/agent/poll", app.base))
            .bearer_auth(&agent.token)
            .json(&json!({"agent_id": agent.id, "session": agent.session, "wait_ms": 0, "max": 16}))
            .send()
            .await
            .expect("poll");
        let status = res.status();
        let retry = res.headers().get("retry-after").and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
        let body: Value = res.json().await.expect("a JSON answer");
        if status == StatusCode::TOO_MANY_REQUESTS {
            assert_eq!(body["error"]["code"], "too_many_requests", "{body}");
            return (n, retry, deliveries);
        }
        assert_eq!(status, StatusCode::OK, "{body}");
        deliveries.extend(body["deliveries"].as_array().cloned().unwrap_or_default());
    }
    (max, None, deliveries)
}

/// Adds agent printers `p{from}…p{to - 1}` to the tenant's store `s1`.
async fn add_agent_printers(app: &TestApp, key: &str, from: usize, to: usize) {
    for i in from..to {
        let a = app
            .post(
                "/v1/printers",
                key,
                json!({"id": format!("p{i}"), "store_id": "s1", "name": format!("Printer {i}"),
                       "transport": {"kind": "agent", "address": format!("tcp://192.0.2.10:{}", 9100 + i)}}),
            )
            .await;
        assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    }
}

/// The agent of a store with 30 printers is not refused at a rate at which the agent of a
/// store with 2 is; a storm far over its own budget is still refused with `Retry-After`;
/// its acks are never refused.
async fn a_busy_agent_has_a_budget_that_grows_with_its_printers(app: &TestApp) {
    let busy_key = app.tenant("acme").await;
    add_agent_printers(app, &busy_key, 3, 31).await;
    let small_key = app.tenant("bistro").await;
    let busy = Agent::new(app, &busy_key, "a1", "s1").await;
    let small = Agent::new(app, &small_key, "a1", "s1").await;

    let (status, _, body) = submit_raw(app, &busy_key, order("K1", "noodles")).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    // The small store's agent: its burst of 6, then 429.
    let (small_polls, retry, _) = polls_until_refused(app, &small, 100).await;
    assert!((6..=8).contains(&small_polls), "{small_polls} polls of a 2-printer store's agent went through");
    assert!(retry.is_some_and(|s| s >= 1), "Retry-After: {retry:?}");

    // The busy store's agent: ten times as many polls and more are answered …
    let (busy_polls, retry, delivered) = polls_until_refused(app, &busy, 500).await;
    assert!(busy_polls >= 10 * small_polls, "only {busy_polls} polls of a 30-printer store's agent went through");
    // … but a storm far over its budget is still refused, and told when to come back.
    assert!(busy_polls < 500, "a storm of 500 polls was never refused");
    assert!(retry.is_some_and(|s| s >= 1), "Retry-After: {retry:?}");

    // Over its budget, the agent still acknowledges what its printer did: the ticket is
    // printed.
    let (task, attempt) = common::task_of(delivered.first().expect("a poll handed out K1"));
    assert_eq!(busy.ack(app, &task, attempt, "printed").await, "applied");
    let t = app.get(&format!("/v1/print-tasks/{task}"), &busy_key).await;
    assert_eq!(t.body["state"], "printed", "{t:?}");
}

/// A store that gains printers gives its agent the larger budget without a restart.
async fn printers_added_later_raise_the_budget(app: &TestApp) {
    let key = app.tenant("acme").await;
    let agent = Agent::new(app, &key, "a1", "s1").await;
    let (before, _, _) = polls_until_refused(app, &agent, 100).await;
    assert!((6..=8).contains(&before), "{before} polls of a 2-printer store's agent went through");
    add_agent_printers(app, &key, 3, 31).await;
    // The store now drives 30 printers: the larger burst is there at once.
    let (after, retry, _) = polls_until_refused(app, &agent, 500).await;
    assert!(after >= 60, "only {after} polls went through after the store grew to 30 printers");
    assert!(after < 500 && retry.is_some(), "a storm of 500 polls was never refused");
}
