//! Offline operation, broker side, through the HTTP API on both backends: LAN keys
//! (created, listed, revoked; never a credential at the broker), the store directory an
//! agent takes orders with while the broker is unreachable, the store's one LAN listener,
//! forwarded station tasks placed where the agent would print them, and the sync of the
//! tasks it took meanwhile (`POST /v1/agent/offline-tasks`) with the merge rules of the
//! wire spec — what changed while the shop was cut off taken, not refused; what cannot be
//! taken alerted to a person.

mod common;

use common::{order, Agent, TestApp};
use onceprint_core::TaskId;
use reqwest::StatusCode;
use serde_json::{json, Value};
use sha2::Digest;

both_backends!(
    lan_keys_are_created_listed_and_revoked_and_authenticate_nothing_at_the_broker,
    the_directory_is_the_agents_store,
    an_unknown_key_becomes_a_printed_task_under_the_lan_id_on_its_business_day,
    a_known_key_merges_into_the_cloud_task_and_its_lan_id_answers_with_it,
    other_content_under_a_known_key_holds_the_cloud_task_and_prints_nothing,
    a_pending_task_joins_the_lane_and_is_delivered_to_the_agent,
    what_the_broker_can_never_take_is_rejected_and_a_malformed_request_is_400,
    what_changed_while_the_shop_was_cut_off_is_taken_not_refused,
    a_shop_pc_clock_far_off_is_corrected_and_recorded_not_refused,
    a_rejected_task_is_alerted_and_an_unreadable_one_is_rejected_alone,
    a_forwarded_station_task_goes_where_the_agent_would_print_it,
    one_store_agent_takes_a_stores_lan_orders,
);

const DAY_MS: i64 = 24 * 3600 * 1000;

fn now_ms() -> i64 {
    onceprint_engine::clock::now_ms()
}

/// A LAN task id as the agent mints it: from its acceptance time.
fn lan_id(accepted_at: i64, n: u8) -> String {
    TaskId::from_parts(accepted_at, [n, 7, 7, 7, 7, 7, 7, 7, 7, n]).into_string()
}

/// A task the agent printed offline on p1.
fn printed(id: &str, accepted_at: i64, biz_no: &str, text: &str) -> Value {
    json!({
        "task_id": id, "biz_no": biz_no, "printer_id": "p1", "station_id": null, "print_type": "receipt",
        "content": {"type": "text", "text": text},
        "accepted_at": accepted_at, "lan_key_id": "k1", "printed_on": "p1",
        "outcome": "printed", "attempts": 1, "detail": "printer confirmed (GS ( H)",
        "history": [
            {"at": accepted_at + 100, "attempt": 1, "state": "started", "detail": ""},
            {"at": accepted_at + 300, "attempt": 1, "state": "printed", "detail": "GS ( H"},
        ],
    })
}

async fn sync(app: &TestApp, agent: &Agent, tasks: Vec<Value>) -> Vec<Value> {
    let a = app.post("/v1/agent/offline-tasks", &agent.token, json!({"agent_id": agent.id, "tasks": tasks})).await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    a.body["results"].as_array().cloned().expect("results")
}

async fn lan_key(app: &TestApp, key: &str, body: Option<Value>) -> common::Answer {
    app.call("POST", "/v1/stores/s1/lan-keys", Some(key), body).await
}

async fn lan_keys_are_created_listed_and_revoked_and_authenticate_nothing_at_the_broker(app: &TestApp) {
    let key = app.tenant("acme").await;
    let agent = Agent::new(app, &key, "a1", "s1").await;

    let a = lan_key(app, &key, None).await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    let generated = a.body["id"].as_str().expect("id").to_owned();
    assert!(generated.starts_with("lan_"), "{a:?}");
    let a = lan_key(app, &key, Some(json!({"id": "k1"}))).await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    assert_eq!((a.body["id"].as_str(), a.body["store_id"].as_str()), (Some("k1"), Some("s1")));
    let lan = a.body["key"].as_str().expect("key").to_owned();
    assert!(lan.starts_with("opl_") && a.body["created_at"].is_string(), "{a:?}");
    assert_eq!(lan_key(app, &key, Some(json!({"id": "k1"}))).await.status, StatusCode::CONFLICT);
    assert_eq!(lan_key(app, &key, Some(json!({"id": "no spaces"}))).await.status, StatusCode::BAD_REQUEST);
    let a = app.call("POST", "/v1/stores/s9/lan-keys", Some(&key), None).await;
    assert_eq!(a.status, StatusCode::NOT_FOUND, "{a:?}");

    // Listed without the key or its hash; not among the agent tokens.
    let list = app.get("/v1/stores/s1/lan-keys", &key).await;
    assert_eq!(list.status, StatusCode::OK, "{list:?}");
    let keys = list.body["keys"].as_array().cloned().expect("keys");
    let ids: Vec<&str> = keys.iter().filter_map(|k| k["id"].as_str()).collect();
    assert_eq!(ids.len(), 2);
    assert!(ids.contains(&"k1") && ids.contains(&generated.as_str()));
    assert!(!list.body.to_string().contains(&lan), "never the key");
    assert!(keys.iter().all(|k| k.get("key").is_none() && k.get("sha256").is_none() && k["revoked_at"].is_null()));
    let tokens = app.get("/v1/stores/s1/agent-tokens", &key).await.body;
    assert_eq!(tokens["tokens"].as_array().map(Vec::len), Some(1), "{tokens}");

    // The agent gets the active keys' hashes, of the whole key string.
    let a = app.get("/v1/agent/lan-keys", &agent.token).await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    let sha: String = sha2::Sha256::digest(lan.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
    let k1 = a.body["keys"].as_array().and_then(|ks| ks.iter().find(|k| k["id"] == "k1").cloned()).expect("k1");
    assert_eq!(k1, json!({"id": "k1", "sha256": sha}));

    // A LAN key is no credential at the broker: not as an agent token, not as a tenant key.
    for (method, path, body) in [
        ("POST", "/v1/agent/poll", Some(json!({"agent_id": "a9", "wait_ms": 0}))),
        ("GET", "/v1/agent/lan-keys", None),
        ("GET", "/v1/agent/directory", None),
        ("POST", "/v1/agent/print-tasks", Some(order("X1", "x"))),
        ("POST", "/v1/agent/offline-tasks", Some(json!({"agent_id": "a9", "tasks": []}))),
        ("POST", "/v1/print-tasks", Some(order("X1", "x"))),
        ("GET", "/v1/print-tasks", None),
        ("GET", "/v1/stores/s1/lan-keys", None),
    ] {
        let a = app.call(method, path, Some(&lan), body).await;
        assert_eq!((a.status, a.code()), (StatusCode::UNAUTHORIZED, "unauthorized"), "{method} {path}: {a:?}");
    }

    // Revoked: listed with the time, gone from the agent's list. Only through its own path.
    let a = app.call("DELETE", "/v1/stores/s1/lan-keys/k1", Some(&key), None).await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    assert!(a.body["revoked_at"].is_string(), "{a:?}");
    let again = app.call("DELETE", "/v1/stores/s1/lan-keys/k1", Some(&key), None).await;
    assert_eq!((again.status, &again.body["revoked_at"]), (StatusCode::OK, &a.body["revoked_at"]));
    let token_id = tokens["tokens"][0]["id"].as_str().expect("token id").to_owned();
    let a = app.call("DELETE", &format!("/v1/stores/s1/lan-keys/{token_id}"), Some(&key), None).await;
    assert_eq!(a.status, StatusCode::NOT_FOUND, "an agent token is no LAN key: {a:?}");
    let a = app.call("DELETE", "/v1/stores/s1/agent-tokens/k1", Some(&key), None).await;
    assert_eq!(a.status, StatusCode::NOT_FOUND, "a LAN key is no agent token: {a:?}");
    let a = app.get("/v1/agent/lan-keys", &agent.token).await;
    let ids: Vec<&str> = a.body["keys"].as_array().into_iter().flatten().filter_map(|k| k["id"].as_str()).collect();
    assert_eq!(ids, [generated.as_str()], "{a:?}");
    assert_eq!(agent.poll_answer(app, 0).await.status, StatusCode::OK, "the agent token still works");

    // Audited like agent tokens.
    let events = app.get("/v1/setup-events", &key).await.body;
    let lan_events: Vec<(String, String)> = events["events"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["object_id"] == "k1")
        .map(|e| (e["object_kind"].as_str().unwrap_or("").to_owned(), e["action"].as_str().unwrap_or("").to_owned()))
        .collect();
    assert_eq!(lan_events, [("lan_key".into(), "revoke".into()), ("lan_key".into(), "create".into())], "{events}");
}

async fn the_directory_is_the_agents_store(app: &TestApp) {
    let key = app.tenant("acme").await;
    let agent = Agent::new(app, &key, "a1", "s1").await;
    let a = app.post("/v1/stations", &key, json!({"id": "st1", "store_id": "s1", "printers": ["p2", "p1"]})).await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    let a = app
        .post(
            "/v1/printers",
            &key,
            json!({"id": "w1", "store_id": "s1", "transport":
                   {"kind": "webhook", "url": "http://127.0.0.1:9/hook", "secret": "0123456789abcdef0123"}}),
        )
        .await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    let a = app
        .post(
            "/v1/printers/p2/disable",
            &key,
            json!({"operator": "alice", "reason": "paper jam, waiting for the technician"}),
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    let a = app.post("/v1/stores", &key, json!({"id": "s2", "name": "Harbour"})).await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    let a = app
        .post(
            "/v1/printers",
            &key,
            json!({"id": "q1", "store_id": "s2", "transport": {"kind": "agent", "address": "tcp://192.0.2.11:9100"}}),
        )
        .await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");

    let d = app.get("/v1/agent/directory", &agent.token).await;
    assert_eq!(d.status, StatusCode::OK, "{d:?}");
    assert_eq!(d.body["store_id"], "s1");
    assert_eq!(
        d.body["printers"],
        json!([
            {"printer_id": "p1", "printer_address": "tcp://192.0.2.10:9100", "enabled": true, "agent": true, "profile": null},
            {"printer_id": "p2", "printer_address": "tcp://192.0.2.10:9100", "enabled": false, "agent": true, "profile": null},
            {"printer_id": "w1", "printer_address": "", "enabled": true, "agent": false, "profile": null},
        ]),
        "{d:?}"
    );
    assert_eq!(d.body["stations"], json!([{"station_id": "st1", "printers": ["p2", "p1"]}]));
    let types: Vec<&str> = d.body["print_types"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    assert_eq!(types[..4], ["refund", "receipt", "kitchen", "label"], "by priority: {d:?}");
    assert_eq!(d.body["default_print_type"], "receipt");
    assert_eq!(app.get("/v1/agent/directory", &key).await.status, StatusCode::UNAUTHORIZED);
}

async fn an_unknown_key_becomes_a_printed_task_under_the_lan_id_on_its_business_day(app: &TestApp) {
    let key = app.tenant("acme").await;
    let agent = Agent::new(app, &key, "a1", "s1").await;
    // Yesterday noon (UTC, the store's zone): the shop took the order while the broker was
    // unreachable, and syncs it today.
    let accepted_at = (now_ms() / DAY_MS - 1) * DAY_MS + DAY_MS / 2;
    let id = lan_id(accepted_at, 1);
    let report = printed(&id, accepted_at, "L-100", "two noodles");

    let results = sync(app, &agent, vec![report.clone()]).await;
    assert_eq!(results.len(), 1);
    let r = &results[0];
    assert_eq!((r["task_id"].as_str(), r["result"].as_str()), (Some(id.as_str()), Some("created")), "{r}");
    assert_eq!((r["broker_task_id"].as_str(), r["state"].as_str()), (Some(id.as_str()), Some("printed")), "{r}");

    let t = app.get(&format!("/v1/print-tasks/{id}"), &key).await;
    assert_eq!(t.status, StatusCode::OK, "{t:?}");
    assert_eq!((t.body["state"].as_str(), t.body["attempts"].as_i64()), (Some("printed"), Some(1)), "{t:?}");
    assert_eq!((t.body["printer_id"].as_str(), t.body["biz_no"].as_str()), (Some("p1"), Some("L-100")));
    let created = onceprint_engine::clock::rfc3339(accepted_at);
    assert_eq!(t.body["created_at"].as_str(), Some(created.as_str()), "its business day is the acceptance time");

    // The audit trail names the LAN path first, then the agent's journal.
    let events = app.get(&format!("/v1/print-tasks/{id}/events"), &key).await.body;
    let events = events["events"].as_array().cloned().expect("events");
    assert_eq!(events[0]["actor"], "lan:k1@agent:s1", "{events:?}");
    assert!(events[0]["reason"].as_str().unwrap_or("").contains("shop LAN"), "{events:?}");
    assert!(events[0]["reason"].as_str().unwrap_or("").contains("unreachable"), "{events:?}");
    let trail: Vec<(Value, Value, Value)> =
        events.iter().map(|e| (e["from"].clone(), e["to"].clone(), e["actor"].clone())).collect();
    assert_eq!(
        trail,
        [
            (Value::Null, json!("pending"), json!("lan:k1@agent:s1")),
            (json!("pending"), json!("sent"), json!("agent:a1")),
            (json!("sent"), json!("printed"), json!("agent:a1")),
        ]
    );
    let charges = app.store.ledger_entries(&id).await.expect("ledger");
    assert_eq!(charges.iter().map(|e| (e.kind.as_str(), e.at)).collect::<Vec<_>>(), [("charge", accepted_at)]);

    // Counted on its business day, not today.
    let day = &created[..10];
    let rep = app.get(&format!("/v1/stores/s1/reconciliation?date={day}"), &key).await;
    assert_eq!(rep.status, StatusCode::OK, "{rep:?}");
    assert_eq!((rep.body["counts"]["submitted"].as_i64(), rep.body["counts"]["printed"].as_i64()), (Some(1), Some(1)));
    let today = onceprint_engine::clock::rfc3339(now_ms());
    let rep = app.get(&format!("/v1/stores/s1/reconciliation?date={}", &today[..10]), &key).await;
    assert_eq!(rep.body["counts"]["submitted"].as_i64(), Some(0), "{rep:?}");

    // The agent retries until it has an answer: the same answer, nothing changes.
    let again = sync(app, &agent, vec![report]).await;
    assert_eq!(again[0]["result"], "created");
    assert_eq!(again[0]["broker_task_id"], id.as_str());
    assert_eq!(app.store.ledger_entries(&id).await.expect("ledger").len(), 1, "one charge");
    let n = app.get(&format!("/v1/print-tasks/{id}/events"), &key).await.body["events"].as_array().map(Vec::len);
    assert_eq!(n, Some(3));
    // The POS's late retry to the cloud is the same task, already printed.
    let a = app.submit(&key, order("L-100", "two noodles")).await;
    assert_eq!(
        (a.status, a.body["task_id"].as_str(), a.body["state"].as_str()),
        (StatusCode::OK, Some(id.as_str()), Some("printed"))
    );
    assert_eq!(app.all_tasks(&key).await.len(), 1);
    assert!(agent.poll(app, 0).await.is_empty(), "nothing to print again");
}

async fn a_known_key_merges_into_the_cloud_task_and_its_lan_id_answers_with_it(app: &TestApp) {
    let key = app.tenant("acme").await;
    let agent = Agent::new(app, &key, "a1", "s1").await;
    // The POS reached the cloud, timed out, and sent the same order to the agent's LAN
    // listener, which printed it while the broker was unreachable from the shop.
    let cloud = app.submit(&key, order("M-1", "one soup")).await;
    assert_eq!(cloud.status, StatusCode::CREATED, "{cloud:?}");
    let cloud_id = cloud.body["task_id"].as_str().expect("task_id").to_owned();
    let accepted_at = now_ms() - 60_000;
    let id = lan_id(accepted_at, 2);

    let results = sync(app, &agent, vec![printed(&id, accepted_at, "M-1", "one soup")]).await;
    let r = &results[0];
    assert_eq!((r["result"].as_str(), r["broker_task_id"].as_str()), (Some("merged"), Some(cloud_id.as_str())), "{r}");
    assert_eq!(r["state"], "printed");

    // The LAN id answers with the merged task, and its trail says what happened.
    let t = app.get(&format!("/v1/print-tasks/{id}"), &key).await;
    assert_eq!(t.status, StatusCode::OK, "{t:?}");
    assert_eq!((t.body["task_id"].as_str(), t.body["state"].as_str()), (Some(cloud_id.as_str()), Some("printed")));
    let events = common::events_of(app, &key, &id).await;
    assert_eq!(events.last().map(|e| (e.0.as_str(), e.1.as_str())), Some(("pending", "printed")), "{events:?}");
    assert!(events
        .last()
        .is_some_and(|e| e.2.contains(&format!("printed offline by the store agent (LAN task {id})"))));
    assert_eq!(events, common::events_of(app, &key, &cloud_id).await);
    // One task, one charge; nothing for the broker to print any more.
    assert_eq!(app.all_tasks(&key).await.len(), 1);
    assert_eq!(app.store.ledger_entries(&cloud_id).await.expect("ledger").len(), 1);
    assert!(app.store.ledger_entries(&id).await.expect("ledger").is_empty(), "no second charge");
    assert!(agent.poll(app, 0).await.is_empty());
    // The gate learnt the new state: a retry answers printed.
    let a = app.submit(&key, order("M-1", "one soup")).await;
    assert_eq!((a.status, a.body["state"].as_str()), (StatusCode::OK, Some("printed")), "{a:?}");
    // Again: the same answer.
    let again = sync(app, &agent, vec![printed(&id, accepted_at, "M-1", "one soup")]).await;
    assert_eq!(
        (again[0]["result"].as_str(), again[0]["broker_task_id"].as_str()),
        (Some("merged"), Some(cloud_id.as_str()))
    );
    assert_eq!(common::events_of(app, &key, &cloud_id).await.len(), events.len());

    // A task in flight at the agent that then printed it offline: its late ack changes
    // nothing (a printed ack of a printed task is a duplicate).
    let sent = app.submit(&key, order("M-2", "rice")).await;
    let sent_id = sent.body["task_id"].as_str().expect("task_id").to_owned();
    let d = agent.poll_until(app, std::time::Duration::from_secs(5)).await;
    assert_eq!(common::task_of(&d[0]).0, sent_id);
    let other = lan_id(accepted_at + 1, 3);
    let r = sync(app, &agent, vec![printed(&other, accepted_at + 1, "M-2", "rice")]).await;
    assert_eq!((r[0]["result"].as_str(), r[0]["state"].as_str()), (Some("merged"), Some("printed")), "{r:?}");
    assert_eq!(agent.ack(app, &sent_id, 1, "printed").await, "duplicate");
    assert_eq!(agent.ack(app, &sent_id, 1, "in_doubt").await, "stale");
    let t = app.get(&format!("/v1/print-tasks/{sent_id}"), &key).await.body;
    assert_eq!(t["state"], "printed");
}

async fn other_content_under_a_known_key_holds_the_cloud_task_and_prints_nothing(app: &TestApp) {
    let key = app.tenant("acme").await;
    let agent = Agent::new(app, &key, "a1", "s1").await;
    let cloud = app.submit(&key, order("C-1", "table 3: noodles")).await;
    let cloud_id = cloud.body["task_id"].as_str().expect("task_id").to_owned();
    let accepted_at = now_ms() - 30_000;
    let id = lan_id(accepted_at, 4);

    let r = sync(app, &agent, vec![printed(&id, accepted_at, "C-1", "table 3: dumplings")]).await;
    assert_eq!((r[0]["result"].as_str(), r[0]["broker_task_id"].as_str()), (Some("conflict"), Some(cloud_id.as_str())));
    assert_eq!(r[0]["state"], "in_doubt", "{r:?}");
    let t = app.get(&format!("/v1/print-tasks/{cloud_id}"), &key).await.body;
    assert_eq!(t["state"], "in_doubt");
    let attention = app.get("/v1/stores/s1/attention", &key).await.body;
    assert!(attention.to_string().contains(&cloud_id), "on the attention list: {attention}");
    let events = common::events_of(app, &key, &cloud_id).await;
    assert!(
        events.iter().any(|e| e.2.contains(&format!(
            "conflicting content under one key: LAN task {id} accepted offline with other content"
        ))),
        "{events:?}"
    );
    // The LAN id still answers; nothing prints, nothing more is charged.
    let t = app.get(&format!("/v1/print-tasks/{id}"), &key).await;
    assert_eq!((t.status, t.body["task_id"].as_str()), (StatusCode::OK, Some(cloud_id.as_str())));
    assert!(agent.poll(app, 0).await.is_empty(), "nothing prints");
    assert!(app.store.ledger_entries(&id).await.expect("ledger").is_empty());
    assert_eq!(app.all_tasks(&key).await.len(), 1);
    let again = sync(app, &agent, vec![printed(&id, accepted_at, "C-1", "table 3: dumplings")]).await;
    assert_eq!((again[0]["result"].as_str(), again[0]["state"].as_str()), (Some("conflict"), Some("in_doubt")));
}

async fn a_pending_task_joins_the_lane_and_is_delivered_to_the_agent(app: &TestApp) {
    let key = app.tenant("acme").await;
    let agent = Agent::new(app, &key, "a1", "s1").await;
    let a = app.post("/v1/stations", &key, json!({"id": "st1", "store_id": "s1", "printers": ["p2", "p1"]})).await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    let accepted_at = now_ms() - 10_000;
    let id = lan_id(accepted_at, 5);
    // Accepted on the LAN, not printed (the printer was out of paper, say).
    let report = json!({
        "task_id": id, "biz_no": "P-1", "printer_id": null, "station_id": "st1", "print_type": "kitchen",
        "content": {"type": "text", "text": "one curry"},
        "accepted_at": accepted_at, "lan_key_id": "k1", "printed_on": null,
        "outcome": "pending", "attempts": 0, "detail": "", "history": [],
    });
    let r = sync(app, &agent, vec![report]).await;
    assert_eq!((r[0]["result"].as_str(), r[0]["state"].as_str()), (Some("created"), Some("pending")), "{r:?}");
    let t = app.get(&format!("/v1/print-tasks/{id}"), &key).await.body;
    assert_eq!((t["printer_id"].as_str(), t["print_type"].as_str()), (Some("p2"), Some("kitchen")), "{t}");

    let d = agent.poll_until(app, std::time::Duration::from_secs(5)).await;
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!((d[0]["task_id"].as_str(), d[0]["printer_id"].as_str()), (Some(id.as_str()), Some("p2")));
    assert_eq!(agent.ack(app, &id, 1, "printed").await, "applied");
    common::wait_state(app, &key, &id, "printed", std::time::Duration::from_secs(5)).await;
    assert_eq!(app.store.ledger_entries(&id).await.expect("ledger").len(), 1);
}

async fn what_the_broker_can_never_take_is_rejected_and_a_malformed_request_is_400(app: &TestApp) {
    let key = app.tenant("acme").await;
    let agent = Agent::new(app, &key, "a1", "s1").await;
    let a = app.post("/v1/stores", &key, json!({"id": "s2", "name": "Harbour"})).await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    let a = app
        .post(
            "/v1/printers",
            &key,
            json!({"id": "q1", "store_id": "s2", "transport": {"kind": "agent", "address": "tcp://192.0.2.11:9100"}}),
        )
        .await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    let at = now_ms() - 5_000;
    let mut unknown_printer = printed(&lan_id(at, 10), at, "R-1", "x");
    unknown_printer["printer_id"] = json!("nope");
    unknown_printer["printed_on"] = json!("nope");
    let mut other_store = printed(&lan_id(at, 11), at, "R-2", "x");
    other_store["printer_id"] = json!("q1");
    other_store["printed_on"] = json!("q1");
    let wrong_time = printed(&lan_id(at - 1, 12), at, "R-3", "x");
    let mut no_biz_no = printed(&lan_id(at, 13), at, "R-4", "x");
    no_biz_no["biz_no"] = json!("");
    let mut bad_outcome = printed(&lan_id(at, 15), at, "R-6", "x");
    bad_outcome["outcome"] = json!("lost");
    let mut before_1970 = printed(&lan_id(at, 17), at, "R-8", "x");
    before_1970["history"][0]["at"] = json!(-1);
    let good = printed(&lan_id(at, 16), at, "R-7", "x");
    let r = sync(
        app,
        &agent,
        vec![unknown_printer, other_store, wrong_time, no_biz_no, bad_outcome, before_1970, good.clone()],
    )
    .await;
    let results: Vec<&str> = r.iter().filter_map(|x| x["result"].as_str()).collect();
    assert_eq!(results, ["rejected", "rejected", "rejected", "rejected", "rejected", "rejected", "created"], "{r:?}");
    assert!(r[5]["detail"].as_str().unwrap_or("").contains("history[0].at"), "{r:?}");
    assert!(r[..6].iter().all(|x| x["broker_task_id"].is_null() && !x["detail"].as_str().unwrap_or("").is_empty()));
    assert!(r[1]["detail"].as_str().unwrap_or("").contains("no printer \"q1\" in store \"s1\""), "{r:?}");
    assert_eq!(app.all_tasks(&key).await.len(), 1, "only the good one");

    // A malformed request as a whole, or too many tasks, is 400 and takes nothing.
    let a =
        app.post("/v1/agent/offline-tasks", &agent.token, json!({"agent_id": "a1", "tasks": [{"task_id": 5}]})).await;
    assert_eq!((a.status, a.code()), (StatusCode::BAD_REQUEST, "invalid_request"), "{a:?}");
    let many: Vec<Value> = (0..501).map(|_| good.clone()).collect();
    let a = app.post("/v1/agent/offline-tasks", &agent.token, json!({"agent_id": "a1", "tasks": many})).await;
    assert_eq!((a.status, a.code()), (StatusCode::BAD_REQUEST, "invalid_request"), "{a:?}");
    let a = app.post("/v1/agent/offline-tasks", &key, json!({"agent_id": "a1", "tasks": []})).await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED, "a tenant key is no agent token");
}

/// The events of task `id` (its reasons joined), as the tenant reads them.
async fn reasons(app: &TestApp, key: &str, id: &str) -> String {
    let e = app.get(&format!("/v1/print-tasks/{id}/events"), key).await;
    assert_eq!(e.status, StatusCode::OK, "{e:?}");
    e.body["events"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|e| e["reason"].as_str())
        .collect::<Vec<_>>()
        .join(" | ")
}

/// A report of the agent for station `st` (printed on `on`, or only accepted).
fn station_report(id: &str, at: i64, biz_no: &str, on: &str, outcome: &str) -> Value {
    let mut r = printed(id, at, biz_no, "station ticket");
    r["printer_id"] = Value::Null;
    r["station_id"] = json!("st");
    r["printed_on"] = json!(on);
    r["outcome"] = json!(outcome);
    if outcome == "pending" {
        r["attempts"] = json!(0);
        r["history"] = json!([]);
    }
    r
}

/// The shop was cut off while a person changed the set-up: a station lost the printer the
/// agent printed on, a print type left the configuration, and the agent's journal grew
/// long behind a printer out of paper. None of it is a reason to refuse what the shop
/// took: each task is kept, and its audit trail says what changed.
async fn what_changed_while_the_shop_was_cut_off_is_taken_not_refused(app: &TestApp) {
    let key = app.tenant("acme").await;
    let agent = Agent::new(app, &key, "a1", "s1").await;
    let a = app.post("/v1/stations", &key, json!({"id": "st", "store_id": "s1", "printers": ["p1", "p2"]})).await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    // While the shop is cut off, the station moves to p2 only.
    let a = app.call("PATCH", "/v1/stations/st", Some(&key), Some(json!({"printers": ["p2"]}))).await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    let at = now_ms() - 60_000;
    let printed_there = station_report(&lan_id(at, 1), at, "S-1", "p1", "printed");
    let waiting = station_report(&lan_id(at, 2), at, "S-2", "p1", "pending");
    let mut dessert = printed(&lan_id(at, 3), at, "S-3", "cake");
    dessert["print_type"] = json!("dessert");
    let mut long = printed(&lan_id(at, 4), at, "S-4", "soup");
    let mut history: Vec<Value> =
        (0..250).map(|i| json!({"at": at + 10 * i, "attempt": i + 1, "state": "no_paper", "detail": ""})).collect();
    history.push(json!({"at": at + 5000, "attempt": 251, "state": "started", "detail": ""}));
    history.push(json!({"at": at + 5100, "attempt": 251, "state": "printed", "detail": ""}));
    long["history"] = json!(history);
    long["attempts"] = json!(251);
    let r = sync(app, &agent, vec![printed_there, waiting, dessert, long]).await;
    let results: Vec<&str> = r.iter().filter_map(|x| x["result"].as_str()).collect();
    assert_eq!(results, ["created", "created", "created", "created"], "{r:?}");

    // Printed on p1: it stays on p1, where its paper is, and says why.
    let t = app.get(&format!("/v1/print-tasks/{}", lan_id(at, 1)), &key).await.body;
    assert_eq!((t["printer_id"].as_str(), t["state"].as_str()), (Some("p1"), Some("printed")), "{t}");
    assert!(reasons(app, &key, &lan_id(at, 1)).await.contains("no longer the task's printer"));
    // Not tried: it goes where a LAN submission to the station goes now, and prints there.
    let t = app.get(&format!("/v1/print-tasks/{}", lan_id(at, 2)), &key).await.body;
    assert_eq!((t["printer_id"].as_str(), t["state"].as_str()), (Some("p2"), Some("pending")), "{t}");
    assert!(reasons(app, &key, &lan_id(at, 2)).await.contains("it waits on \"p2\""));
    let delivered = agent.poll(app, 0).await;
    assert_eq!(delivered.len(), 1, "{delivered:?}");
    assert_eq!(
        (delivered[0]["task_id"].as_str(), delivered[0]["printer_id"].as_str()),
        (Some(&*lan_id(at, 2)), Some("p2"))
    );
    // A print type no longer configured keeps its name, with the default's policy.
    let t = app.get(&format!("/v1/print-tasks/{}", lan_id(at, 3)), &key).await.body;
    assert_eq!(t["print_type"], "dessert", "{t}");
    assert!(reasons(app, &key, &lan_id(at, 3)).await.contains("default print type's policy"));
    // A history past 200 records keeps the first and the latest, and says so.
    let events = app.get(&format!("/v1/print-tasks/{}/events", lan_id(at, 4)), &key).await.body;
    let events = events["events"].as_array().cloned().unwrap_or_default();
    assert_eq!(events.len(), 1 + 200, "the creation and 200 journal records");
    assert_eq!(events.last().map(|e| e["to"].clone()), Some(json!("printed")));
    assert!(events[0]["reason"].as_str().unwrap_or("").contains("52 of the agent's 252 journal records left out"));
    assert_eq!(app.get(&format!("/v1/print-tasks/{}", lan_id(at, 4)), &key).await.body["state"], "printed");
}

/// Uploads `body` and answers its first result.
async fn upload_first(app: &TestApp, agent: &Agent, body: Value) -> Value {
    let a = app.post("/v1/agent/offline-tasks", &agent.token, body).await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    a.body["results"][0].clone()
}

/// The printer of task `id`.
async fn printer_of(app: &TestApp, key: &str, id: &str) -> Value {
    app.get(&format!("/v1/print-tasks/{id}"), key).await.body["printer_id"].clone()
}

/// Forwards a station task as the agent does, naming the printer it would print on.
async fn forward(app: &TestApp, agent: &Agent, biz_no: &str, named: Option<&str>) -> String {
    let mut req =
        app.http.post(format!("{}/v1/agent/print-tasks", app.base)).bearer_auth(&agent.token).json(
            &json!({"biz_no": biz_no, "station_id": "kitchen", "content": {"type": "text", "text": "fish soup"}}),
        );
    if let Some(p) = named {
        req = req.header("onceprint-lan-printer", p);
    }
    let res = req.send().await.expect("forward");
    assert_eq!(res.status(), StatusCode::CREATED);
    let v: Value = res.json().await.expect("json");
    v["task_id"].as_str().unwrap_or("").to_owned()
}

/// A shop PC's clock far ahead (or set back by a flat CMOS battery) moves the agent's
/// times onto the broker's clock, by what the upload's `sent_at` shows; the task gets an
/// id of the corrected time and its LAN id still names it. A small difference is only
/// noted. Nothing is refused.
async fn a_shop_pc_clock_far_off_is_corrected_and_recorded_not_refused(app: &TestApp) {
    let key = app.tenant("acme").await;
    let agent = Agent::new(app, &key, "a1", "s1").await;
    let now = now_ms();
    let upload = |sent_at: Option<i64>, tasks: Vec<Value>| {
        let mut body = json!({"agent_id": agent.id, "tasks": tasks});
        if let Some(s) = sent_at {
            body["sent_at"] = json!(s);
        }
        body
    };
    let post = |body: Value| upload_first(app, &agent, body);
    // Two hours ahead: accepted a minute before the upload, by the PC's clock.
    let ahead = now + 2 * 3600 * 1000;
    let id = lan_id(ahead - 60_000, 1);
    let r = post(upload(Some(ahead), vec![printed(&id, ahead - 60_000, "C-1", "x")])).await;
    assert_eq!(r["result"], "created", "{r}");
    assert_eq!(r["task_id"], id.as_str(), "the answer names the task by the id the agent sent: {r}");
    let broker_id = r["broker_task_id"].as_str().expect("broker id").to_owned();
    assert_ne!(broker_id, id, "an id of the corrected time");
    let t = app.get(&format!("/v1/print-tasks/{id}"), &key).await;
    assert_eq!((t.status, t.body["task_id"].as_str()), (StatusCode::OK, Some(broker_id.as_str())), "{t:?}");
    let (id_time, _) = TaskId::parts(&broker_id).expect("a task id");
    assert!((id_time - (now - 60_000)).abs() < 10_000, "accepted about a minute ago: {id_time} vs {now}");
    let created = TaskId::parts(&broker_id).map(|(t, _)| onceprint_engine::clock::rfc3339(t)).unwrap_or_default();
    assert_eq!(t.body["created_at"].as_str(), Some(created.as_str()));
    assert!(reasons(app, &key, &broker_id).await.contains("2.0 h ahead of the broker's: its times are corrected"));
    // Sent again: the same answer, one task.
    let again = post(upload(Some(ahead + 5_000), vec![printed(&id, ahead - 60_000, "C-1", "x")])).await;
    assert_eq!((again["result"].as_str(), again["broker_task_id"].as_str()), (Some("created"), Some(&*broker_id)));

    // Set back to 2001: accepted ten minutes before the upload.
    let behind = 978_307_200_000;
    let id2 = lan_id(behind - 600_000, 2);
    let r = post(upload(Some(behind), vec![printed(&id2, behind - 600_000, "C-2", "x")])).await;
    assert_eq!(r["result"], "created", "{r}");
    let (t2, _) = TaskId::parts(r["broker_task_id"].as_str().unwrap_or("")).expect("a task id");
    assert!((t2 - (now - 600_000)).abs() < 10_000, "charged today, not in 2001");
    assert!(reasons(app, &key, r["broker_task_id"].as_str().unwrap_or("")).await.contains("days behind the broker's"));

    // Three seconds ahead: kept as it came, the difference noted.
    let id3 = lan_id(now - 1_000, 3);
    let r = post(upload(Some(now + 3_000), vec![printed(&id3, now - 1_000, "C-3", "x")])).await;
    assert_eq!((r["result"].as_str(), r["broker_task_id"].as_str()), (Some("created"), Some(&*id3)), "{r}");
    assert!(reasons(app, &key, &id3).await.contains("s ahead of the broker's"));

    // The clock was a day behind when the agent accepted the task and right when it
    // uploaded (set back, then corrected, while the line was down): the task's age by
    // the clock since boot places it, where `sent_at` alone could not.
    let id5 = lan_id(now - DAY_MS - 120_000, 5);
    let mut aged = printed(&id5, now - DAY_MS - 120_000, "C-5", "x");
    aged["age_ms"] = json!(120_000);
    let r = post(upload(Some(now), vec![aged])).await;
    assert_eq!((r["result"].as_str(), r["task_id"].as_str()), (Some("created"), Some(id5.as_str())), "{r}");
    let (t5, _) = TaskId::parts(r["broker_task_id"].as_str().unwrap_or("")).expect("a task id");
    assert!((t5 - (now - 120_000)).abs() < 10_000, "accepted two minutes ago, today");
    assert!(reasons(app, &key, r["broker_task_id"].as_str().unwrap_or(""))
        .await
        .contains("1.0 days behind the broker's"));

    // An older agent says nothing of its clock: a time far ahead counts as now.
    let id4 = lan_id(now + DAY_MS, 4);
    let r = post(upload(None, vec![printed(&id4, now + DAY_MS, "C-4", "x")])).await;
    assert_eq!(r["result"], "created", "{r}");
    assert_ne!(r["broker_task_id"].as_str(), Some(id4.as_str()));
    assert_eq!(app.all_tasks(&key).await.len(), 5);
}

/// What the broker cannot take is `rejected` and an `offline_task.rejected` alert tells a
/// person what the agent knows of it. A task that cannot even be read is rejected alone:
/// the tasks beside it are taken.
async fn a_rejected_task_is_alerted_and_an_unreadable_one_is_rejected_alone(app: &TestApp) {
    let key = app.tenant("acme").await;
    let agent = Agent::new(app, &key, "a1", "s1").await;
    let (url, got) = common::receiver(0).await;
    let w = app.post("/v1/webhooks", &key, json!({"id": "ops", "url": url, "events": ["offline_task.rejected"]})).await;
    assert_eq!(w.status, StatusCode::CREATED, "{w:?}");
    let at = now_ms() - 5_000;
    let mut unreadable = printed(&lan_id(at, 1), at, "U-1", "x");
    unreadable["content"] = json!({"type": "hologram", "text": "x"});
    let mut elsewhere = printed(&lan_id(at, 2), at, "U-2", "x");
    elsewhere["printer_id"] = json!("nope");
    elsewhere["printed_on"] = json!("nope");
    let good = printed(&lan_id(at, 3), at, "U-3", "x");
    let r = sync(app, &agent, vec![unreadable, elsewhere, good]).await;
    let results: Vec<&str> = r.iter().filter_map(|x| x["result"].as_str()).collect();
    assert_eq!(results, ["rejected", "rejected", "created"], "{r:?}");
    assert!(r[0]["detail"].as_str().unwrap_or("").contains("tasks[0]"), "{r:?}");

    let start = std::time::Instant::now();
    let alerts = loop {
        let calls = got.lock().expect("lock").clone();
        let bodies: Vec<Value> = calls.iter().filter_map(|(_, b)| serde_json::from_str(b).ok()).collect();
        if bodies.len() >= 2 || start.elapsed() > std::time::Duration::from_secs(20) {
            break bodies;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let mut seen: Vec<(String, String)> = alerts
        .iter()
        .map(|a| (a["type"].as_str().unwrap_or("").to_owned(), a["data"]["biz_no"].as_str().unwrap_or("").to_owned()))
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            ("offline_task.rejected".to_owned(), "U-1".to_owned()),
            ("offline_task.rejected".to_owned(), "U-2".to_owned())
        ]
    );
    let u2 = alerts.iter().find(|a| a["data"]["biz_no"] == "U-2").cloned().unwrap_or_default();
    assert_eq!(
        (u2["data"]["lan_task_id"].as_str(), u2["data"]["store_id"].as_str()),
        (Some(&*lan_id(at, 2)), Some("s1"))
    );
    assert!(u2["data"]["reason"].as_str().unwrap_or("").contains("no printer \"nope\""), "{u2}");

    // A task that does not even name itself cannot be answered: the request is 400.
    let a =
        app.post("/v1/agent/offline-tasks", &agent.token, json!({"agent_id": "a1", "tasks": [{"biz_no": "x"}]})).await;
    assert_eq!((a.status, a.code()), (StatusCode::BAD_REQUEST, "invalid_request"), "{a:?}");
}

/// A station task the store agent forwards from its LAN goes where the agent would print
/// it offline: the printer it names when that is an enabled printer of the station, else
/// the station's first enabled printer the agent drives. From the cloud, the primary.
async fn a_forwarded_station_task_goes_where_the_agent_would_print_it(app: &TestApp) {
    let key = app.tenant("acme").await;
    let agent = Agent::new(app, &key, "a1", "s1").await;
    let a = app
        .post(
            "/v1/printers",
            &key,
            json!({"id": "cloud", "store_id": "s1", "transport":
                   {"kind": "webhook", "url": "http://127.0.0.1:9/hook", "secret": "0123456789abcdef0123"}}),
        )
        .await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    let a = app
        .post("/v1/stations", &key, json!({"id": "kitchen", "store_id": "s1", "printers": ["cloud", "p1", "p2"]}))
        .await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    assert_eq!(
        printer_of(app, &key, &forward(app, &agent, "K-1", None).await).await,
        "p1",
        "the first printer the agent drives"
    );
    assert_eq!(printer_of(app, &key, &forward(app, &agent, "K-2", Some("p2")).await).await, "p2", "the agent's choice");
    assert_eq!(
        printer_of(app, &key, &forward(app, &agent, "K-3", Some("elsewhere")).await).await,
        "p1",
        "not of the station: ignored"
    );
    let a = app.post("/v1/printers/p2/disable", &key, json!({"operator": "o", "reason": "r"})).await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    assert_eq!(printer_of(app, &key, &forward(app, &agent, "K-4", Some("p2")).await).await, "p1", "disabled: ignored");
    let cloud = app
        .submit(&key, json!({"biz_no": "K-5", "station_id": "kitchen", "content": {"type": "text", "text": "x"}}))
        .await;
    assert_eq!(
        printer_of(app, &key, cloud.body["task_id"].as_str().unwrap_or("")).await,
        "cloud",
        "from the cloud: the primary"
    );
}

/// A delivery an agent holds when another agent takes the store's LAN orders: the first
/// stands by from then on and is never offered it again, so once it is overdue it goes to
/// a person (it may have printed, and only the listener may print), and the lane moves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_held_by_an_agent_that_stands_by_goes_to_a_person_sqlite() {
    stand_by_holder(common::Backend::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_held_by_an_agent_that_stands_by_goes_to_a_person_postgres() {
    stand_by_holder(common::Backend::Postgres).await
}

async fn stand_by_holder(backend: common::Backend) {
    let mut config = common::default_config();
    config.delivery.redeliver_after_ms = 500;
    let Some(app) = TestApp::spawn_with(backend, config).await else { return };
    let key = app.tenant("acme").await;
    let first = Agent::new(&app, &key, "a1", "s1").await;
    let second = Agent::new(&app, &key, "a2", "s1").await;
    let held = app.submit(&key, order("SB-1", "x")).await.body["task_id"].as_str().expect("id").to_owned();
    // The second agent is handed the ticket (its answer may be lost on the way).
    let got = second.poll(&app, 0).await;
    assert_eq!(got.len(), 1, "{got:?}");
    let c = app.post("/v1/agent/lan-listener", &first.token, json!({"agent_id": first.id})).await;
    assert_eq!(c.status, StatusCode::OK, "{c:?}");
    let next = app.submit(&key, order("SB-2", "y")).await.body["task_id"].as_str().expect("id").to_owned();
    assert!(second.poll(&app, 300).await.is_empty(), "the second agent stands by");
    let got = first.poll_until(&app, std::time::Duration::from_secs(10)).await;
    assert_eq!(got.first().map(|d| d["task_id"].clone()), Some(json!(next)), "{got:?}");
    let t = app.get(&format!("/v1/print-tasks/{held}"), &key).await;
    assert_eq!(t.body["state"], "in_doubt", "{t:?}");
    app.stop().await;
}

/// One store agent takes a store's LAN orders: the first to claim the listener holds it,
/// another is refused with the holder's name, and only a person frees it.
async fn one_store_agent_takes_a_stores_lan_orders(app: &TestApp) {
    let key = app.tenant("acme").await;
    let first = Agent::new(app, &key, "a1", "s1").await;
    let second = Agent::new(app, &key, "a2", "s1").await;
    let claim = |agent: &Agent| {
        let body = json!({"agent_id": agent.id});
        let token = agent.token.clone();
        async move { app.post("/v1/agent/lan-listener", &token, body).await }
    };
    let none = app.get("/v1/stores/s1/lan-listener", &key).await;
    assert_eq!((none.status, none.code()), (StatusCode::NOT_FOUND, "not_found"), "no agent holds it yet: {none:?}");
    assert_eq!(app.get("/v1/stores/nope/lan-listener", &key).await.status, StatusCode::NOT_FOUND);
    let a = claim(&first).await;
    assert_eq!((a.status, a.body["agent_id"].as_str()), (StatusCode::OK, Some("a1")), "{a:?}");
    let b = claim(&second).await;
    assert_eq!((b.status, b.code()), (StatusCode::CONFLICT, "lan_listener_taken"), "{b:?}");
    let message = b.body["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains("\"a1\"") && message.contains("DELETE /v1/stores/s1/lan-listener"), "{message}");
    assert_eq!(claim(&first).await.status, StatusCode::OK, "the holder claims again");
    // Only the holder prints the store's tickets: a ticket it printed offline is known to
    // its journal alone until its upload arrives. The other agent stands by.
    let t = app.submit(&key, order("SB-1", "x")).await;
    assert_eq!(t.status, StatusCode::CREATED, "{t:?}");
    assert!(second.poll(app, 300).await.is_empty(), "a stand-by agent is handed nothing");
    let got = first.poll(app, 0).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["task_id"], t.body["task_id"]);
    let (id, attempt) = common::task_of(&got[0]);
    assert_eq!(first.ack(app, &id, attempt, "printed").await, "applied");
    let g = app.get("/v1/stores/s1/lan-listener", &key).await;
    assert_eq!((g.status, g.body["agent_id"].as_str()), (StatusCode::OK, Some("a1")), "{g:?}");
    let d = app.call("DELETE", "/v1/stores/s1/lan-listener", Some(&key), None).await;
    assert_eq!((d.status, d.body["agent_id"].as_str()), (StatusCode::OK, Some("a1")), "{d:?}");
    let g = app.get("/v1/stores/s1/lan-listener", &key).await;
    assert_eq!(g.status, StatusCode::NOT_FOUND, "freed: {g:?}");
    let d = app.call("DELETE", "/v1/stores/s1/lan-listener", Some(&key), None).await;
    assert_eq!(d.status, StatusCode::NOT_FOUND, "freed again: {d:?}");
    assert_eq!(claim(&second).await.status, StatusCode::OK, "freed: the other agent takes it");
    assert_eq!(claim(&first).await.status, StatusCode::CONFLICT);
    let t = app.submit(&key, order("SB-2", "x")).await;
    assert!(first.poll(app, 300).await.is_empty(), "now the first agent stands by");
    let got = second.poll(app, 0).await;
    assert_eq!(got.iter().filter(|d| d["task_id"] == t.body["task_id"]).count(), 1, "{got:?}");
    // Another tenant's store of the same name is its own: freeing it leaves this one held.
    let other = app.tenant("other").await;
    let d = app.call("DELETE", "/v1/stores/s1/lan-listener", Some(&other), None).await;
    assert_eq!(d.status, StatusCode::NOT_FOUND, "{d:?}");
    let g = app.get("/v1/stores/s1/lan-listener", &key).await;
    assert_eq!(g.body["agent_id"].as_str(), Some("a2"), "{g:?}");
}
