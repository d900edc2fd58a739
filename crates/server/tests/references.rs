//! What the OpenAPI document promises about a request that is valid by its schema: a
//! reference to an object that does not exist is 404 `not_found` wherever it appears (in
//! the path or in the body), lengths count characters as `maxLength` does, integer fields
//! take a number with a zero fraction, and a manual action with a tenant API key is taken
//! without a person's name — on SQLite and PostgreSQL.

mod common;

use common::{order, Agent, Answer, TestApp};
use reqwest::StatusCode;
use serde_json::{json, Value};

both_backends!(
    a_reference_to_nothing_is_not_found_in_every_body,
    a_manual_action_names_a_printer_of_the_tasks_store,
    integer_fields_take_numbers_with_a_zero_fraction,
    lengths_count_characters,
    a_manual_action_with_an_api_key_may_leave_out_the_operator,
);

/// Asserts the one answer of a reference to something absent: 404 with the error body.
fn assert_not_found(a: &Answer, what: &str) {
    assert_eq!(a.status, StatusCode::NOT_FOUND, "{what}: {a:?}");
    assert_eq!(a.code(), "not_found", "{what}: {a:?}");
    assert!(a.body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{what}: {a:?}");
}

fn agent_printer(id: &str, store: &str) -> Value {
    json!({"id": id, "store_id": store, "transport": {"kind": "agent", "address": "tcp://192.0.2.10:9100"}})
}

/// The tenant of `TestApp::tenant` (store s1 with p1, p2), a second store s2 with printer
/// q1 and a station st1 of s1.
async fn two_stores(app: &TestApp) -> String {
    let key = app.tenant("acme").await;
    let a = app.post("/v1/stores", &key, json!({"id": "s2", "name": "Harbour"})).await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    let a = app.post("/v1/printers", &key, agent_printer("q1", "s2")).await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    let a = app.post("/v1/stations", &key, json!({"id": "st1", "store_id": "s1", "printers": ["p1", "p2"]})).await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    key
}

async fn a_reference_to_nothing_is_not_found_in_every_body(app: &TestApp) {
    let key = two_stores(app).await;

    let to_printer = app
        .submit(
            &key,
            json!({"biz_no": "A1", "printer_id": "nope",
        "content": {"type": "text", "text": "x\n"}}),
        )
        .await;
    assert_not_found(&to_printer, "a task for an unknown printer");
    let to_station = app
        .submit(
            &key,
            json!({"biz_no": "A1", "station_id": "nope",
        "content": {"type": "text", "text": "x\n"}}),
        )
        .await;
    assert_not_found(&to_station, "a task for an unknown station");

    assert_not_found(
        &app.post("/v1/printers", &key, agent_printer("p9", "nope")).await,
        "a printer of an unknown store",
    );
    let moved = app.call("PATCH", "/v1/printers/p1", Some(&key), Some(json!({"store_id": "nope", "name": "x"}))).await;
    assert_not_found(&moved, "a printer moved to an unknown store");
    let moved = app.call("PATCH", "/v1/printers/p1", Some(&key), Some(json!({"store_id": "s2", "name": "x"}))).await;
    assert_not_found(&moved, "a printer moved to another store");
    assert_eq!(app.get("/v1/printers/p1", &key).await.body["store_id"], "s1", "the printer stayed");
    let kept = app.call("PATCH", "/v1/printers/p1", Some(&key), Some(json!({"store_id": "s1", "name": "Hot"}))).await;
    assert_eq!(kept.status, StatusCode::OK, "its own store: {kept:?}");

    let station = |store: &str, printers: Value| json!({"id": "st9", "store_id": store, "printers": printers});
    assert_not_found(&app.post("/v1/stations", &key, station("nope", json!(["p1"]))).await, "a station of no store");
    assert_not_found(&app.post("/v1/stations", &key, station("s1", json!(["p1", "nope"]))).await, "an unknown printer");
    assert_not_found(&app.post("/v1/stations", &key, station("s1", json!(["q1"]))).await, "another store's printer");
    let changed = app.call("PATCH", "/v1/stations/st1", Some(&key), Some(json!({"printers": ["nope"]}))).await;
    assert_not_found(&changed, "a station changed to an unknown printer");
    assert_not_found(&app.get("/v1/stations/st9", &key).await, "no station was created");

    let staff = json!({"id": "kim", "role": "staff", "stores": ["s1", "nope"], "password": "correct horse battery"});
    assert_not_found(&app.post("/v1/operators", &key, staff).await, "an operator of an unknown store");

    // A printer that does not log in has no login to rotate.
    let rotated = app.call("POST", "/v1/printers/p1/credentials", Some(&key), None).await;
    assert_not_found(&rotated, "an agent printer's login");

    // The store agent's submission reaches only its own store: another store's printer is
    // as absent as one that was never registered.
    let token = Agent::new(app, &key, "a1", "t1").await.token;
    let from_agent = app.post("/v1/agent/print-tasks", &token, order("A2", "x\n")).await;
    assert_eq!(from_agent.status, StatusCode::CREATED, "{from_agent:?}");
    let elsewhere = app
        .post(
            "/v1/agent/print-tasks",
            &token,
            json!({"biz_no": "A3", "printer_id": "q1",
        "content": {"type": "text", "text": "x\n"}}),
        )
        .await;
    assert_not_found(&elsewhere, "an agent's task for another store's printer");
}

async fn a_manual_action_names_a_printer_of_the_tasks_store(app: &TestApp) {
    let key = two_stores(app).await;
    let a = app.submit(&key, order("A1", "Table 5\n")).await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    let id = a.body["task_id"].as_str().expect("task_id").to_owned();
    let transfer = |printer: &str| json!({"operator": "ana", "reason": "printer dead", "printer_id": printer});

    let path = format!("/v1/print-tasks/{id}/transfer");
    assert_not_found(&app.post(&path, &key, transfer("nope")).await, "a transfer to an unknown printer");
    assert_not_found(&app.post(&path, &key, transfer("q1")).await, "a transfer to another store's printer");
    let same = app.post(&path, &key, transfer("p1")).await;
    assert_eq!((same.status, same.code()), (StatusCode::CONFLICT, "invalid_transition"), "its own printer: {same:?}");
    // A transfer names its printer: the schema requires it, and so does the broker.
    let without = app.post(&path, &key, json!({"operator": "ana", "reason": "printer dead"})).await;
    assert_eq!(without.status, StatusCode::BAD_REQUEST, "{without:?}");
    assert_eq!(app.get(&format!("/v1/print-tasks/{id}"), &key).await.body["state"], "pending", "nothing moved");

    let moved = app.post(&path, &key, transfer("p2")).await;
    assert_eq!(moved.status, StatusCode::CREATED, "{moved:?}");
    assert_eq!(moved.body["created"]["printer_id"], "p2");
}

async fn integer_fields_take_numbers_with_a_zero_fraction(app: &TestApp) {
    let key = app.tenant("acme").await;
    // JSON Schema counts 50553.0 as the integer 50553, and so does the document.
    let created = app
        .post(
            "/v1/stations",
            &key,
            json!({"id": "st1", "store_id": "s1", "printers": ["p1"], "failover_after_ms": 1000.0}),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    assert_eq!(created.body["failover_after_ms"], json!(1000));
    let changed = app.call("PATCH", "/v1/stations/st1", Some(&key), Some(json!({"failover_after_ms": 50553.0}))).await;
    assert_eq!(changed.status, StatusCode::OK, "{changed:?}");
    assert_eq!(changed.body["failover_after_ms"], json!(50553));
    assert_eq!(app.get("/v1/stations/st1", &key).await.body["failover_after_ms"], json!(50553));

    // A fraction is no integer, and `null` still goes back to the broker's threshold.
    let half = app.call("PATCH", "/v1/stations/st1", Some(&key), Some(json!({"failover_after_ms": 1.5}))).await;
    assert_eq!((half.status, half.code()), (StatusCode::BAD_REQUEST, "invalid_request"), "{half:?}");
    let reset = app.call("PATCH", "/v1/stations/st1", Some(&key), Some(json!({"failover_after_ms": null}))).await;
    assert_eq!(reset.status, StatusCode::OK, "{reset:?}");
    assert_eq!(reset.body["failover_after_ms"], Value::Null);

    // The agent's poll too.
    let agent = Agent::new(app, &key, "a1", "t1").await;
    let polled = app.post("/v1/agent/poll", &agent.token, json!({"agent_id": "a1", "wait_ms": 0.0, "max": 4.0})).await;
    assert_eq!(polled.status, StatusCode::OK, "{polled:?}");
}

async fn lengths_count_characters(app: &TestApp) {
    let key = app.tenant("acme").await;
    // 200 characters of three bytes each: within the document's maxLength of 200.
    let long = "面".repeat(200);
    let a = app.post("/v1/stores", &key, json!({"id": "s2", "name": long})).await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    let a = app.post("/v1/stores", &key, json!({"id": "s3", "name": "面".repeat(201)})).await;
    assert_eq!((a.status, a.code()), (StatusCode::BAD_REQUEST, "invalid_request"), "{a:?}");

    let biz_no = "单".repeat(128);
    let a = app.submit(&key, order(&biz_no, "x\n")).await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    let a = app.submit(&key, order(&"单".repeat(129), "x\n")).await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{a:?}");

    let switch = json!({"operator": "王".repeat(200), "reason": "纸".repeat(2000)});
    let a = app.post("/v1/printers/p2/disable", &key, switch).await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
}

async fn a_manual_action_with_an_api_key_may_leave_out_the_operator(app: &TestApp) {
    let key = app.tenant("acme").await;
    let a = app.submit(&key, order("A1", "Table 5\n")).await;
    let id = a.body["task_id"].as_str().expect("task_id").to_owned();
    let cancelled = app.post(&format!("/v1/print-tasks/{id}/cancel"), &key, json!({"reason": "order voided"})).await;
    assert_eq!(cancelled.status, StatusCode::OK, "{cancelled:?}");
    assert_eq!(cancelled.body["task"]["state"], "cancelled");
    // The key is the actor; no person's name stands beside it.
    let events = app.get(&format!("/v1/print-tasks/{id}/events"), &key).await.body["events"].clone();
    let last = events.as_array().and_then(|e| e.last()).cloned().unwrap_or_default();
    assert!(last["actor"].as_str().is_some_and(|a| a.starts_with("api_key:")), "{events}");
    assert_eq!(last["reason"], "cancel: order voided", "{events}");
}
