//! The manual channel and failover as an operator and an agent see them over HTTP, on
//! SQLite and PostgreSQL.

mod common;

use base64::Engine as _;
use common::{order, Backend, TestApp};
use onceprint_server::HttpConfig;
use reqwest::StatusCode;
use serde_json::{json, Value};

both_backends!(
    mark_printed_closes_a_doubtful_task_and_empties_the_attention_list,
    cancel_refunds_exactly_once_and_only_where_it_makes_sense,
    reprints_are_numbered_attached_and_marked_on_paper,
    transfer_moves_work_within_the_store_and_resubmits_find_it,
    actions_need_an_operator_and_a_reason,
);

async fn agent(app: &TestApp, key: &str) -> String {
    let a = app.call("POST", "/v1/stores/s1/agent-tokens", Some(key), None).await;
    a.body["token"].as_str().expect("token").to_owned()
}

async fn poll(app: &TestApp, token: &str) -> Vec<Value> {
    let a = app.post("/v1/agent/poll", token, json!({"agent_id": "a1", "session": "s", "wait_ms": 1000})).await;
    a.body["deliveries"].as_array().cloned().unwrap_or_default()
}

async fn ack(app: &TestApp, token: &str, task: &str, attempt: i64, outcome: &str) {
    let a = app
        .post("/v1/agent/acks", token, json!({"acks": [{"task_id": task, "attempt": attempt, "outcome": outcome}]}))
        .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
}

async fn act(app: &TestApp, key: &str, id: &str, action: &str, extra: Value) -> common::Answer {
    let mut body = json!({"operator": "alice", "reason": "customer asked"});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    app.post(&format!("/v1/print-tasks/{id}/{action}"), key, body).await
}

async fn submit(app: &TestApp, key: &str, biz: &str) -> String {
    app.submit(key, order(biz, &format!("ticket {biz}\n"))).await.body["task_id"].as_str().expect("id").to_owned()
}

/// Submits, delivers and acks `outcome` for attempt 1.
async fn submit_and_ack(app: &TestApp, key: &str, token: &str, biz: &str, outcome: &str) -> String {
    let id = submit(app, key, biz).await;
    let d = poll(app, token).await;
    assert_eq!(d.len(), 1);
    ack(app, token, &id, 1, outcome).await;
    id
}

async fn mark_printed_closes_a_doubtful_task_and_empties_the_attention_list(app: &TestApp) {
    let key = app.tenant("acme").await;
    let token = agent(app, &key).await;
    let pending = submit(app, &key, "P0").await;
    let refused = act(app, &key, &pending, "mark-printed", json!({})).await;
    assert_eq!((refused.status, refused.code()), (StatusCode::CONFLICT, "invalid_transition"));
    assert!(refused.body["error"]["message"].as_str().unwrap_or("").contains("pending"), "{refused:?}");
    // Clear the lane, then put one task in doubt.
    act(app, &key, &pending, "cancel", json!({})).await;
    let id = submit_and_ack(app, &key, &token, "D1", "in_doubt").await;
    let att = app.get("/v1/stores/s1/attention", &key).await;
    assert_eq!(att.body["tasks"][0]["task_id"], id.as_str());
    assert_eq!(att.body["tasks"][0]["state"], "in_doubt");
    let done = act(app, &key, &id, "mark-printed", json!({})).await;
    assert_eq!(done.status, StatusCode::OK, "{done:?}");
    assert_eq!(done.body["task"]["state"], "closed");
    assert!(app.get("/v1/stores/s1/attention", &key).await.body["tasks"].as_array().is_some_and(Vec::is_empty));
    let ev = app.get(&format!("/v1/print-tasks/{id}/events"), &key).await.body;
    let last = ev["events"].as_array().and_then(|e| e.last()).cloned().unwrap_or_default();
    // With a tenant key the audit names the key; the name given stands beside it.
    assert_eq!(last["to"].as_str(), Some("closed"));
    assert!(last["actor"].as_str().unwrap_or("").starts_with("api_key:key_"), "{last}");
    assert!(last["reason"].as_str().unwrap_or("").contains("customer asked (by \"alice\")"), "{last}");
    assert_eq!(app.get("/v1/stores/nope/attention", &key).await.code(), "not_found");
}

async fn cancel_refunds_exactly_once_and_only_where_it_makes_sense(app: &TestApp) {
    let key = app.tenant("acme").await;
    let token = agent(app, &key).await;
    let id = submit(app, &key, "C1").await;
    let done = act(app, &key, &id, "cancel", json!({})).await;
    assert_eq!((done.status, done.body["task"]["state"].as_str()), (StatusCode::OK, Some("cancelled")));
    let again = act(app, &key, &id, "cancel", json!({})).await;
    assert_eq!(again.code(), "invalid_transition");
    assert!(again.body["error"]["message"].as_str().unwrap_or("").contains("cancelled"));
    let ledger = app.store.ledger_entries(&id).await.expect("ledger");
    let kinds: Vec<&str> = ledger.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, vec!["charge", "refund"]);
    // In flight: not cancellable. Printed: not cancellable.
    let sent = submit(app, &key, "C2").await;
    assert_eq!(poll(app, &token).await.len(), 1);
    assert_eq!(act(app, &key, &sent, "cancel", json!({})).await.code(), "invalid_transition");
    ack(app, &token, &sent, 1, "printed").await;
    assert_eq!(act(app, &key, &sent, "cancel", json!({})).await.code(), "invalid_transition");
    assert_eq!(app.store.ledger_entries(&sent).await.expect("ledger").len(), 1);
}

async fn reprints_are_numbered_attached_and_marked_on_paper(app: &TestApp) {
    let key = app.tenant("acme").await;
    let token = agent(app, &key).await;
    let id = submit(app, &key, "R1").await;
    assert_eq!(act(app, &key, &id, "reprint", json!({})).await.code(), "invalid_transition", "not while pending");
    assert_eq!(poll(app, &token).await.len(), 1);
    ack(app, &token, &id, 1, "printed").await;
    let r1 = act(app, &key, &id, "reprint", json!({})).await;
    assert_eq!(r1.status, StatusCode::CREATED, "{r1:?}");
    assert_eq!(r1.body["task"]["state"], "printed", "the original stays printed");
    let created = &r1.body["created"];
    assert_eq!(
        (created["origin_task_id"].as_str(), created["origin_kind"].as_str()),
        (Some(id.as_str()), Some("reprint"))
    );
    assert_eq!((created["reprint_no"].as_i64(), created["biz_no"].as_str()), (Some(1), Some("R1")));
    let r1_id = created["task_id"].as_str().expect("id").to_owned();
    let d = poll(app, &token).await;
    assert_eq!(d[0]["task_id"], r1_id.as_str());
    let bytes = base64::engine::general_purpose::STANDARD.decode(d[0]["data"].as_str().unwrap_or("")).expect("b64");
    assert!(bytes.windows(17).any(|w| w == b"*** REPRINT 1 ***"), "the slip says it is a reprint");
    ack(app, &token, &r1_id, 1, "printed").await;
    let r2 = act(app, &key, &id, "reprint", json!({})).await;
    assert_eq!(r2.body["created"]["reprint_no"], 2);
    let ev = app.get(&format!("/v1/print-tasks/{r1_id}/events"), &key).await.body;
    assert!(ev["events"][0]["actor"].as_str().unwrap_or("").starts_with("api_key:"), "{ev}");
    assert!(ev["events"][0]["reason"].as_str().unwrap_or("").contains("by \"alice\""), "{ev}");
    // A submission retry still answers with the original, never a reprint.
    let dup = app.submit(&key, order("R1", "ticket R1\n")).await;
    assert_eq!(dup.body["task_id"], id.as_str());
}

async fn transfer_moves_work_within_the_store_and_resubmits_find_it(app: &TestApp) {
    let key = app.tenant("acme").await;
    let id = submit(app, &key, "T1").await;
    assert_eq!(act(app, &key, &id, "transfer", json!({})).await.code(), "invalid_request", "printer_id required");
    assert_eq!(act(app, &key, &id, "transfer", json!({"printer_id": "nope"})).await.code(), "not_found");
    app.post("/v1/stores", &key, json!({"id": "s2", "name": "Other"})).await;
    app.post(
        "/v1/printers",
        &key,
        json!({"id": "q1", "store_id": "s2", "transport": {"kind": "agent", "address": "tcp://10.0.0.9:9100"}}),
    )
    .await;
    let cross = act(app, &key, &id, "transfer", json!({"printer_id": "q1"})).await;
    assert_eq!(cross.code(), "not_found", "another store's printer: {cross:?}");
    let moved = act(app, &key, &id, "transfer", json!({"printer_id": "p2"})).await;
    assert_eq!(moved.status, StatusCode::CREATED, "{moved:?}");
    let succ = moved.body["created"]["task_id"].as_str().expect("id").to_owned();
    assert_eq!(
        (moved.body["task"]["state"].as_str(), moved.body["task"]["successor_task_id"].as_str()),
        (Some("transferred"), Some(succ.as_str()))
    );
    assert_eq!(moved.body["created"]["printer_id"], "p2");
    let dup = app.submit(&key, order("T1", "ticket T1\n")).await;
    assert_eq!(
        (dup.status, dup.body["task_id"].as_str()),
        (StatusCode::OK, Some(succ.as_str())),
        "the live task of the chain"
    );
    assert!(app.store.ledger_entries(&succ).await.expect("ledger").is_empty(), "charged once, on the original");
    assert_eq!(act(app, &key, &id, "transfer", json!({"printer_id": "p2"})).await.code(), "invalid_transition");
}

async fn actions_need_an_operator_and_a_reason(app: &TestApp) {
    let key = app.tenant("acme").await;
    let id = submit(app, &key, "V1").await;
    let a = app.post(&format!("/v1/print-tasks/{id}/cancel"), &key, json!({"operator": "", "reason": "x"})).await;
    assert_eq!(a.code(), "invalid_request");
    let a = app.post(&format!("/v1/print-tasks/{id}/cancel"), &key, json!({"operator": "bob"})).await;
    assert_eq!(a.code(), "invalid_request");
    let other = app.tenant("bistro").await;
    assert_eq!(act(app, &other, &id, "cancel", json!({})).await.code(), "not_found");
    assert_eq!(app.get(&format!("/v1/print-tasks/{id}"), &key).await.body["state"], "pending");
}

/// Failover: a station task whose primary cannot print moves to the backup; the
/// original is transferred and never delivered again; resubmitting finds the live task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_moves_a_station_task_to_the_backup_sqlite() {
    failover(Backend::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_moves_a_station_task_to_the_backup_postgres() {
    failover(Backend::Postgres).await
}

async fn failover(backend: Backend) {
    let mut config = HttpConfig::default();
    for p in config.intake.policies.types.values_mut() {
        p.max_attempts = 1;
    }
    // The primary's first refusal hands the ticket on (no pause threshold).
    config.delivery.station_failover_after_ms = 0;
    let Some(app) = TestApp::spawn_with(backend, config).await else { return };
    let key = app.tenant("acme").await;
    let token = agent(&app, &key).await;
    app.post("/v1/stations", &key, json!({"id": "hot", "store_id": "s1", "printers": ["p1", "p2"]})).await;
    let body = json!({"biz_no": "F1", "station_id": "hot", "content": {"type": "text", "text": "hot dish\n"}});
    let id = app.submit(&key, body.clone()).await.body["task_id"].as_str().expect("id").to_owned();
    let d = poll(&app, &token).await;
    assert_eq!(d[0]["printer_id"], "p1");
    ack(&app, &token, &id, 1, "offline").await;
    let orig = app.get(&format!("/v1/print-tasks/{id}"), &key).await.body;
    assert_eq!(orig["state"], "transferred", "{orig}");
    let succ = orig["successor_task_id"].as_str().expect("successor").to_owned();
    let next = app.get(&format!("/v1/print-tasks/{succ}"), &key).await.body;
    assert_eq!((next["printer_id"].as_str(), next["origin_kind"].as_str()), (Some("p2"), Some("failover")));
    let d = poll(&app, &token).await;
    assert_eq!((d.len(), d[0]["task_id"].as_str()), (1, Some(succ.as_str())), "only the backup's task is delivered");
    let dup = app.submit(&key, body).await;
    assert_eq!(dup.body["task_id"], succ.as_str());
    // A doubt is never failed over: it may have printed.
    let id2 = app
        .submit(&key, json!({"biz_no": "F2", "station_id": "hot", "content": {"type": "text", "text": "x\n"}}))
        .await
        .body["task_id"]
        .as_str()
        .expect("id")
        .to_owned();
    ack(&app, &token, &succ, 1, "printed").await;
    let d = poll(&app, &token).await;
    assert_eq!(d[0]["task_id"], id2.as_str());
    ack(&app, &token, &id2, 1, "in_doubt").await;
    assert_eq!(app.get(&format!("/v1/print-tasks/{id2}"), &key).await.body["state"], "in_doubt");
    app.stop().await;
}

/// The one rule for doubt in the manual channel: a ticket that may have printed is never moved unmarked to
/// another printer; it is reprinted, with a banner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_that_may_have_printed_is_reprinted_never_transferred_sqlite() {
    may_have_printed_is_never_transferred(Backend::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_that_may_have_printed_is_reprinted_never_transferred_postgres() {
    may_have_printed_is_never_transferred(Backend::Postgres).await
}

async fn may_have_printed_is_never_transferred(backend: Backend) {
    let mut config = HttpConfig::default();
    for p in config.intake.policies.types.values_mut() {
        // In doubt → another attempt, marked as a reprint; the task waits in `retrying`.
        p.reprint_on_doubt = true;
        p.max_attempts = 2;
        p.backoff.initial_ms = 60_000;
    }
    let Some(app) = TestApp::spawn_with(backend, config).await else { return };
    let key = app.tenant("acme").await;
    let token = agent(&app, &key).await;
    let id = submit_and_ack(&app, &key, &token, "D1", "in_doubt").await;
    let t = app.get(&format!("/v1/print-tasks/{id}"), &key).await.body;
    assert_eq!((t["state"].as_str(), t["last_error"].as_str()), (Some("retrying"), Some("in_doubt")), "{t}");
    // Transfer: refused, naming why and pointing at the reprint; nothing created.
    let a = act(&app, &key, &id, "transfer", json!({"printer_id": "p2"})).await;
    assert_eq!((a.status, a.code()), (StatusCode::CONFLICT, "invalid_transition"), "{a:?}");
    let message = a.body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("may have printed") && message.contains("reprint"), "{message}");
    let t = app.get(&format!("/v1/print-tasks/{id}"), &key).await.body;
    assert_eq!((t["state"].as_str(), t["successor_task_id"].as_str()), (Some("retrying"), None), "{t}");
    // A ticket whose attempt proved nothing printed may still move.
    let body = json!({"biz_no": "D2", "printer_id": "p2", "content": {"type": "text", "text": "D2\n"}});
    let moved = app.submit(&key, body).await.body["task_id"].as_str().expect("id").to_owned();
    assert_eq!(poll(&app, &token).await.len(), 1);
    ack(&app, &token, &moved, 1, "offline").await;
    assert_eq!(act(&app, &key, &moved, "transfer", json!({"printer_id": "p1"})).await.status, StatusCode::CREATED);
    app.stop().await;
}

/// A reprint onto a disabled printer would only wait there: refused, also when it is the
/// original's own printer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reprint_onto_a_disabled_printer_is_refused_sqlite() {
    reprint_onto_a_disabled_printer(Backend::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reprint_onto_a_disabled_printer_is_refused_postgres() {
    reprint_onto_a_disabled_printer(Backend::Postgres).await
}

async fn reprint_onto_a_disabled_printer(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    let key = app.tenant("acme").await;
    let token = agent(&app, &key).await;
    let id = submit_and_ack(&app, &key, &token, "E1", "printed").await;
    for p in ["p1", "p2"] {
        let a = app.post(&format!("/v1/printers/{p}/disable"), &key, json!({"operator": "o", "reason": "r"})).await;
        assert_eq!(a.status, StatusCode::OK, "{a:?}");
    }
    for target in [json!({}), json!({"printer_id": "p1"}), json!({"printer_id": "p2"})] {
        let a = act(&app, &key, &id, "reprint", target.clone()).await;
        assert_eq!((a.status, a.code()), (StatusCode::CONFLICT, "printer_disabled"), "{target}: {a:?}");
    }
    assert_eq!(app.store.reprint_count(&id).await.expect("count"), 0, "nothing was created");
    app.post("/v1/printers/p1/enable", &key, json!({"operator": "o", "reason": "r"})).await;
    assert_eq!(act(&app, &key, &id, "reprint", json!({})).await.status, StatusCode::CREATED);
    app.stop().await;
}
