//! `POST /v1/print-task-batches`: each item answered as `POST /v1/print-tasks`
//! would answer it alone, new tasks created in the order sent, retries creating nothing
//! twice. Every test runs on SQLite and on PostgreSQL.

mod common;

use std::time::Duration;

use common::{order, task_of, Agent, TestApp};
use reqwest::StatusCode;
use serde_json::{json, Value};

both_backends!(
    a_batch_answers_each_item_as_a_single_submission_would,
    a_batch_prints_in_the_order_sent,
    a_batch_envelope_is_checked,
);

fn results(a: &common::Answer) -> Vec<Value> {
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    a.body["results"].as_array().cloned().expect("results")
}

async fn a_batch_answers_each_item_as_a_single_submission_would(app: &TestApp) {
    let key = app.tenant("acme").await;
    // A task submitted on its own first: the batch repeats its key with other content.
    let b1 = app.submit(&key, order("B1", "first\n")).await;
    assert_eq!(b1.status, StatusCode::CREATED, "{b1:?}");
    let mut unknown_field = order("A6", "x\n");
    unknown_field["colour"] = json!("red");
    let mut unknown_printer = order("A5", "x\n");
    unknown_printer["printer_id"] = json!("nope");
    let items = vec![
        order("A1", "Table 1\n"),
        order("A2", "Table 2\n"),
        order("A1", "Table 1\n"),
        json!({"printer_id": "p1", "content": {"type": "text", "text": "no number\n"}}),
        order("B1", "other content\n"),
        unknown_printer,
        unknown_field,
    ];
    let batch = json!({ "tasks": items });
    let first = results(&app.post("/v1/print-task-batches", &key, batch.clone()).await);
    let statuses: Vec<u64> = first.iter().map(|r| r["status"].as_u64().unwrap_or(0)).collect();
    assert_eq!(statuses, [201, 201, 200, 400, 422, 404, 400], "{first:#?}");
    let a1 = first[0]["task"]["task_id"].as_str().expect("task_id").to_owned();
    let a2 = first[1]["task"]["task_id"].as_str().expect("task_id").to_owned();
    assert_ne!(a1, a2);
    assert_eq!(first[0]["task"]["duplicate"], false);
    assert_eq!(first[0]["task"]["biz_no"], "A1");
    assert_eq!(first[0]["task"]["print_type"], "receipt");
    assert_eq!(first[0]["task"]["state"], "pending");
    // The same key twice in one batch is one task; the second is its duplicate.
    assert_eq!(first[2]["task"]["task_id"], a1.as_str(), "{first:#?}");
    assert_eq!(first[2]["task"]["duplicate"], true);
    assert_eq!(first[3]["error"]["code"], "missing_biz_no");
    assert_eq!(first[4]["error"]["code"], "idempotency_mismatch");
    assert_eq!(first[5]["error"]["code"], "not_found");
    assert!(first[5]["error"]["message"].as_str().unwrap_or("").contains("nope"), "{first:#?}");
    assert_eq!(first[6]["error"]["code"], "invalid_request");
    assert!(first[6]["error"]["message"].as_str().unwrap_or("").contains("colour"), "{first:#?}");
    for r in &first[3..] {
        assert!(r.get("task").is_none(), "an error result carries no task: {r}");
    }

    // The answer was lost, say: the whole batch again creates nothing and answers the
    // same tasks; an item sent on its own is answered as a duplicate too.
    let again = results(&app.post("/v1/print-task-batches", &key, batch).await);
    let statuses: Vec<u64> = again.iter().map(|r| r["status"].as_u64().unwrap_or(0)).collect();
    assert_eq!(statuses, [200, 200, 200, 400, 422, 404, 400], "{again:#?}");
    assert_eq!(again[0]["task"]["task_id"], a1.as_str());
    assert_eq!(again[1]["task"]["task_id"], a2.as_str());
    let single = app.submit(&key, order("A2", "Table 2\n")).await;
    assert_eq!(single.status, StatusCode::OK, "{single:?}");
    assert_eq!(single.body["task_id"], a2.as_str());

    let tasks = app.all_tasks(&key).await;
    let mut numbers: Vec<&str> = tasks.iter().filter_map(|t| t["biz_no"].as_str()).collect();
    numbers.sort_unstable();
    assert_eq!(numbers, ["A1", "A2", "B1"], "one task per key, nothing for refused items");
    // Each new task has its audit trail and its charge like a single submission.
    let events = common::events_of(app, &key, &a2).await;
    assert!(events.iter().any(|(_, to, _)| to == "pending"), "{events:?}");
}

async fn a_batch_prints_in_the_order_sent(app: &TestApp) {
    let key = app.tenant("acme").await;
    let numbers: Vec<String> = (1..=12).map(|i| format!("K{i}")).collect();
    let items: Vec<Value> = numbers.iter().map(|n| order(n, &format!("ticket {n}\n"))).collect();
    let answers = results(&app.post("/v1/print-task-batches", &key, json!({ "tasks": items })).await);
    assert!(answers.iter().all(|r| r["status"] == 201), "{answers:#?}");
    let ids: Vec<String> = answers.iter().map(|r| r["task"]["task_id"].as_str().unwrap_or("").to_owned()).collect();

    // One printer prints one ticket at a time: the lane hands them out in the order sent.
    let agent = Agent::new(app, &key, "agent-1", "s-1").await;
    let mut printed = Vec::new();
    while printed.len() < ids.len() {
        let deliveries = agent.poll_until(app, Duration::from_secs(10)).await;
        assert_eq!(deliveries.len(), 1, "one printer, one ticket in flight: {deliveries:?}");
        let (task, attempt) = task_of(&deliveries[0]);
        assert_eq!(agent.ack(app, &task, attempt, "printed").await, "applied");
        printed.push(task);
    }
    assert_eq!(printed, ids);
}

async fn a_batch_envelope_is_checked(app: &TestApp) {
    let key = app.tenant("acme").await;
    let many: Vec<Value> = (0..501).map(|i| order(&format!("M{i}"), "x\n")).collect();
    for (body, needle) in [
        (json!({"tasks": []}), "1 to 500"),
        (json!({ "tasks": many }), "1 to 500"),
        (json!({"task": [order("A1", "x\n")]}), "task"),
        (json!({"tasks": {"biz_no": "A1"}}), "tasks"),
        (json!([order("A1", "x\n")]), ""),
        (json!({}), "tasks"),
    ] {
        let a = app.post("/v1/print-task-batches", &key, body.clone()).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{body}: {a:?}");
        assert_eq!(a.code(), "invalid_request", "{a:?}");
        assert!(a.body["error"]["message"].as_str().unwrap_or("").contains(needle), "{a:?}");
    }
    let a = app.call("POST", "/v1/print-task-batches", None, Some(json!({"tasks": [order("A1", "x\n")]}))).await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{a:?}");
    assert!(app.all_tasks(&key).await.is_empty(), "a refused batch creates nothing");
}
