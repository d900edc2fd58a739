//! Changing the set-up through the API: editing, disabling and enabling
//! printers, changing stations, agent tokens and API keys with their revocation, and the
//! set-up audit — on SQLite and PostgreSQL. Agents are played over HTTP, so what a change
//! does to deliveries in flight and waiting is seen the way a store agent sees it.

mod common;

use std::time::Duration;

use common::{order, task_of, Agent, Answer, Backend, TestApp, ADMIN};
use onceprint_server::HttpConfig;
use reqwest::StatusCode;
use serde_json::{json, Value};

both_backends!(
    printers_are_edited_with_the_checks_of_registration,
    an_edit_applies_from_the_next_delivery_and_the_delivery_in_flight_still_acks,
    a_disabled_printer_keeps_its_tasks_waiting_and_its_delivery_in_flight_acks,
    stations_skip_disabled_printers_and_get_new_printer_lists,
    a_revoked_agent_token_fails_on_the_next_request,
    api_keys_are_added_and_revoked_but_never_the_last,
    setup_events_list_every_change_newest_first_without_secrets,
    another_tenants_set_up_is_not_found,
    printers_that_call_in_get_a_login_shown_once_and_replaced_on_request,
);

/// Tests that need a broker without the in-process duplicate gate, so that a retry is
/// judged by the database, as on another node or after a restart.
mod without_gate {
    use super::*;
    per_backend!(duplicates_to_a_disabled_printer_are_answered_and_new_work_is_refused);
}

/// The bodies of disable and enable.
fn disable() -> Value {
    json!({"operator": "ana", "reason": "the cutter jams"})
}

fn enable() -> Value {
    json!({"operator": "ana", "reason": "cutter replaced"})
}

async fn patch(app: &TestApp, path: &str, key: &str, body: Value) -> Answer {
    app.call("PATCH", path, Some(key), Some(body)).await
}

async fn delete(app: &TestApp, path: &str, key: &str) -> Answer {
    app.call("DELETE", path, Some(key), None).await
}

fn message(a: &Answer) -> &str {
    a.body["error"]["message"].as_str().unwrap_or("")
}

async fn submit(app: &TestApp, key: &str, body: Value) -> String {
    let a = app.submit(key, body).await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    a.body["task_id"].as_str().expect("task_id").to_owned()
}

async fn task(app: &TestApp, key: &str, id: &str) -> Value {
    app.get(&format!("/v1/print-tasks/{id}"), key).await.body
}

fn agent_transport(address: &str) -> Value {
    json!({"kind": "agent", "address": address})
}

async fn printers_are_edited_with_the_checks_of_registration(app: &TestApp) {
    let key = app.tenant("acme").await;
    let renamed = patch(app, "/v1/printers/p1", &key, json!({"name": "Hot kitchen"})).await;
    assert_eq!(renamed.status, StatusCode::OK, "{renamed:?}");
    assert_eq!(renamed.body["name"], "Hot kitchen");
    assert_eq!(renamed.body["transport"], agent_transport("tcp://192.0.2.10:9100"), "the transport stays");
    assert_eq!((renamed.body["enabled"].clone(), renamed.body["store_id"].clone()), (json!(true), json!("s1")));

    // A transport is checked exactly as at registration, and the message names the field.
    for (transport, field) in [
        (json!({"kind": "agent", "address": "192.0.2.10:9100"}), "transport.address"),
        (json!({"kind": "agent", "address": "tcp://host:0"}), "transport.address"),
        (json!({"kind": "webhook", "url": "ftp://cloud.example", "secret": "0123456789abcdef"}), "transport.url"),
        (json!({"kind": "webhook", "url": "https://cloud.example", "secret": "short"}), "transport.secret"),
        // 12 characters in 24 bytes: short by the OpenAPI document's count, which is in characters.
        (json!({"kind": "webhook", "url": "https://cloud.example", "secret": "éééééééééééé"}), "transport.secret"),
        (json!({"kind": "carrier-pigeon"}), "supported kinds"),
        (json!({"kind": "agent", "address": "tcp://h:1", "profile": "nope"}), "transport.profile"),
    ] {
        let a = patch(app, "/v1/printers/p1", &key, json!({ "transport": transport })).await;
        assert_eq!((a.status, a.code()), (StatusCode::BAD_REQUEST, "invalid_request"), "{transport}: {a:?}");
        assert!(message(&a).contains(field), "{transport}: {a:?}");
    }
    for (body, field) in [
        (json!({}), "name"),
        (json!({"name": ""}), "name"),
        (json!({"name": "x", "colour": "red"}), "colour"),
        (json!({"name": 7}), "name"),
    ] {
        let a = patch(app, "/v1/printers/p1", &key, body.clone()).await;
        assert_eq!((a.status, a.code()), (StatusCode::BAD_REQUEST, "invalid_request"), "{body}: {a:?}");
        assert!(message(&a).contains(field), "{body}: {a:?}");
    }
    // A printer cannot change store: in another store there is no such printer. Naming its
    // own store is fine (a client sending back what it read).
    let s2 = app.post("/v1/stores", &key, json!({"id": "s2", "name": "Second"})).await;
    assert_eq!(s2.status, StatusCode::CREATED);
    let moved = patch(app, "/v1/printers/p1", &key, json!({"store_id": "s2", "name": "x"})).await;
    assert_eq!((moved.status, moved.code()), (StatusCode::NOT_FOUND, "not_found"), "{moved:?}");
    assert!(message(&moved).contains("p1") && message(&moved).contains("s2"), "{moved:?}");
    let same = patch(app, "/v1/printers/p1", &key, json!({"store_id": "s1", "name": "Kitchen"})).await;
    assert_eq!((same.status, same.body["name"].clone()), (StatusCode::OK, json!("Kitchen")), "{same:?}");

    let unknown = patch(app, "/v1/printers/nope", &key, json!({"name": "x"})).await;
    assert_eq!((unknown.status, unknown.code()), (StatusCode::NOT_FOUND, "not_found"));

    // To a webhook: the secret is kept for signing and never shown again.
    let webhook = json!({"kind": "webhook", "url": "https://cloud.example/jobs", "secret": "0123456789abcdef-s3cret"});
    let w = patch(app, "/v1/printers/p1", &key, json!({ "transport": webhook })).await;
    assert_eq!(w.status, StatusCode::OK, "{w:?}");
    let read = app.get("/v1/printers/p1", &key).await;
    assert_eq!(read.body["transport"]["kind"], "webhook");
    assert_eq!(read.body["transport"]["secret"], "***");
    assert!(!read.body.to_string().contains("s3cret") && !w.body.to_string().contains("s3cret"));
    // The other printer was not touched.
    assert_eq!(app.get("/v1/printers/p2", &key).await.body["name"], "Printer p2");
}

async fn an_edit_applies_from_the_next_delivery_and_the_delivery_in_flight_still_acks(app: &TestApp) {
    let key = app.tenant("acme").await;
    let agent = Agent::new(app, &key, "kitchen-pc", "t000000000001-0000000000000001").await;
    let first = submit(app, &key, order("E1", "first")).await;
    let second = submit(app, &key, order("E2", "second")).await;
    let d = agent.poll_until(app, Duration::from_secs(5)).await;
    assert_eq!(d.len(), 1, "one task in flight per printer: {d:?}");
    let (id, attempt) = task_of(&d[0]);
    assert_eq!(id, first);
    assert_eq!(d[0]["printer_address"], "tcp://192.0.2.10:9100");

    // The printer moves to another address while the first ticket may be printing.
    let a = patch(app, "/v1/printers/p1", &key, json!({"transport": agent_transport("tcp://192.0.2.99:9100")})).await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    // The delivery in flight is not taken back or offered again, and nothing else goes
    // to the printer before it is answered.
    assert!(agent.poll(app, 300).await.is_empty());
    assert_eq!(task(app, &key, &first).await["state"], "sent");
    // Its ack applies as usual: acks go by task id and attempt.
    assert_eq!(agent.ack(app, &id, attempt, "printed").await, "applied");
    assert_eq!(task(app, &key, &first).await["state"], "printed");
    // The next delivery carries the new address.
    let d = agent.poll_until(app, Duration::from_secs(5)).await;
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(task_of(&d[0]).0, second);
    assert_eq!(d[0]["printer_address"], "tcp://192.0.2.99:9100");
}

async fn a_disabled_printer_keeps_its_tasks_waiting_and_its_delivery_in_flight_acks(app: &TestApp) {
    let key = app.tenant("acme").await;
    let agent = Agent::new(app, &key, "kitchen-pc", "t000000000001-0000000000000001").await;
    let first = submit(app, &key, order("W1", "first")).await;
    let waiting = submit(app, &key, order("W2", "second")).await;
    let d = agent.poll_until(app, Duration::from_secs(5)).await;
    let (id, attempt) = task_of(&d[0]);
    assert_eq!(id, first);

    let bad = app.post("/v1/printers/p1/disable", &key, json!({"operator": "ana"})).await;
    assert_eq!((bad.status, bad.code()), (StatusCode::BAD_REQUEST, "invalid_request"), "{bad:?}");
    let bad = app.post("/v1/printers/p1/disable", &key, json!({"operator": " ", "reason": "x"})).await;
    assert!(message(&bad).contains("operator"), "{bad:?}");
    let off = app.post("/v1/printers/p1/disable", &key, disable()).await;
    assert_eq!((off.status, off.body["enabled"].clone()), (StatusCode::OK, json!(false)), "{off:?}");
    assert_eq!(app.get("/v1/printers/p1", &key).await.body["enabled"], false);
    let listed = app.get("/v1/printers?store_id=s1", &key).await.body["printers"].clone();
    assert_eq!((listed[0]["enabled"].clone(), listed[1]["enabled"].clone()), (json!(false), json!(true)));
    // Disabling again changes nothing.
    let again = app.post("/v1/printers/p1/disable", &key, disable()).await;
    assert_eq!((again.status, again.body["enabled"].clone()), (StatusCode::OK, json!(false)));

    // The ticket in flight was not taken back (it may be printing); its ack still applies.
    assert_eq!(task(app, &key, &first).await["state"], "sent");
    assert_eq!(agent.ack(app, &id, attempt, "printed").await, "applied");
    assert_eq!(task(app, &key, &first).await["state"], "printed");
    // The next one waits, visibly, and nobody gets it.
    assert!(agent.poll(app, 300).await.is_empty());
    let w = task(app, &key, &waiting).await;
    assert_eq!((w["state"].clone(), w["attempts"].clone()), (json!("pending"), json!(0)));
    assert!(app.all_tasks(&key).await.iter().any(|t| t["task_id"] == waiting.as_str()));
    // The store's other printer goes on printing.
    let other =
        submit(app, &key, json!({"biz_no": "W3", "printer_id": "p2", "content": {"type": "text", "text": "x"}})).await;
    let d = agent.poll_until(app, Duration::from_secs(5)).await;
    assert_eq!(d.iter().map(|x| task_of(x).0).collect::<Vec<_>>(), vec![other.clone()]);
    assert_eq!(agent.ack(app, &other, task_of(&d[0]).1, "printed").await, "applied");

    // An operator may move the waiting ticket to a printer that works, not to the disabled
    // one it waits on.
    let to_disabled = app
        .post(
            &format!("/v1/print-tasks/{waiting}/transfer"),
            &key,
            json!({"operator": "ana", "reason": "x", "printer_id": "p1"}),
        )
        .await;
    assert_eq!(to_disabled.code(), "invalid_transition", "{to_disabled:?}");
    let moved = app
        .post(
            &format!("/v1/print-tasks/{waiting}/transfer"),
            &key,
            json!({"operator": "ana", "reason": "p1 is disabled", "printer_id": "p2"}),
        )
        .await;
    assert_eq!(moved.status, StatusCode::CREATED, "{moved:?}");
    let successor = moved.body["created"]["task_id"].as_str().unwrap_or("").to_owned();
    let d = agent.poll_until(app, Duration::from_secs(5)).await;
    assert_eq!(d.iter().map(|x| task_of(x).0).collect::<Vec<_>>(), vec![successor.clone()]);
    assert_eq!(d[0]["printer_id"], "p2");
    assert_eq!(agent.ack(app, &successor, task_of(&d[0]).1, "printed").await, "applied");

    // Enabled again, the lane moves: a new ticket is handed out.
    let on = app.post("/v1/printers/p1/enable", &key, enable()).await;
    assert_eq!((on.status, on.body["enabled"].clone()), (StatusCode::OK, json!(true)), "{on:?}");
    let later = submit(app, &key, order("W4", "later")).await;
    let d = agent.poll_until(app, Duration::from_secs(5)).await;
    assert_eq!(d.iter().map(|x| task_of(x).0).collect::<Vec<_>>(), vec![later]);
    assert_eq!(d[0]["printer_id"], "p1");

    let unknown = app.post("/v1/printers/nope/enable", &key, enable()).await;
    assert_eq!((unknown.status, unknown.code()), (StatusCode::NOT_FOUND, "not_found"));
}

async fn duplicates_to_a_disabled_printer_are_answered_and_new_work_is_refused(backend: Backend) {
    let mut config = HttpConfig::default();
    config.intake.gate_capacity = 0;
    let Some(app) = TestApp::spawn_with(backend, config).await else { return };
    let key = app.tenant("acme").await;
    let id = submit(&app, &key, order("D1", "Table 5")).await;
    let station =
        app.post("/v1/stations", &key, json!({"id": "hot", "store_id": "s1", "printers": ["p1", "p2"]})).await;
    assert_eq!(station.status, StatusCode::CREATED, "{station:?}");
    let station_body = json!({"biz_no": "D2", "station_id": "hot", "content": {"type": "text", "text": "x"}});
    let station_task = submit(&app, &key, station_body.clone()).await;
    for p in ["p1", "p2"] {
        let off = app.post(&format!("/v1/printers/{p}/disable"), &key, disable()).await;
        assert_eq!(off.status, StatusCode::OK, "{off:?}");
    }

    // Dedup comes first: the POS retrying an order taken before the printer was
    // disabled gets the task as before — from the database, since this broker has no gate.
    let again = app.submit(&key, order("D1", "Table 5")).await;
    assert_eq!(again.status, StatusCode::OK, "{again:?}");
    assert_eq!((again.body["task_id"].as_str(), again.body["duplicate"].clone()), (Some(id.as_str()), json!(true)));
    let again = app.submit(&key, station_body).await;
    assert_eq!((again.status, again.body["task_id"].as_str()), (StatusCode::OK, Some(station_task.as_str())));
    // Same key, other content is still a client bug.
    let other = app.submit(&key, order("D1", "Table 6")).await;
    assert_eq!(other.code(), "idempotency_mismatch", "{other:?}");
    // New work is refused, saying why and what to do.
    let new = app.submit(&key, order("D3", "x")).await;
    assert_eq!((new.status, new.code()), (StatusCode::CONFLICT, "printer_disabled"), "{new:?}");
    assert!(message(&new).contains("printer_id") && message(&new).contains("p1"), "{new:?}");
    let new =
        app.submit(&key, json!({"biz_no": "D4", "station_id": "hot", "content": {"type": "text", "text": "x"}})).await;
    assert_eq!((new.status, new.code()), (StatusCode::CONFLICT, "printer_disabled"), "{new:?}");
    assert!(message(&new).contains("station_id"), "{new:?}");
    // Nothing was created or charged for the refused ones.
    assert_eq!(app.all_tasks(&key).await.len(), 2);
    app.stop().await;
}

async fn stations_skip_disabled_printers_and_get_new_printer_lists(app: &TestApp) {
    let key = app.tenant("acme").await;
    let s = app.post("/v1/stations", &key, json!({"id": "hot", "store_id": "s1", "printers": ["p1", "p2"]})).await;
    assert_eq!(s.status, StatusCode::CREATED, "{s:?}");
    let ticket =
        |biz_no: &str| json!({"biz_no": biz_no, "station_id": "hot", "content": {"type": "text", "text": "x"}});
    let on_primary = submit(app, &key, ticket("S0")).await;
    assert_eq!(task(app, &key, &on_primary).await["printer_id"], "p1");
    // With the primary disabled, new station tasks go to the next printer.
    assert_eq!(app.post("/v1/printers/p1/disable", &key, disable()).await.status, StatusCode::OK);
    let on_backup = submit(app, &key, ticket("S1")).await;
    assert_eq!(task(app, &key, &on_backup).await["printer_id"], "p2");
    assert_eq!(app.post("/v1/printers/p1/enable", &key, enable()).await.status, StatusCode::OK);

    // A new list is checked like at creation.
    app.post("/v1/stores", &key, json!({"id": "s2", "name": "Second"})).await;
    let q1 = app
        .post(
            "/v1/printers",
            &key,
            json!({"id": "q1", "store_id": "s2", "transport": agent_transport("tcp://10.0.0.6:9100")}),
        )
        .await;
    assert_eq!(q1.status, StatusCode::CREATED);
    for (printers, says) in
        [(json!([]), "printers"), (json!(["p2", "p2"]), "twice"), (json!(["bad id!"]), "printers[0]")]
    {
        let a = patch(app, "/v1/stations/hot", &key, json!({ "printers": printers })).await;
        assert_eq!((a.status, a.code()), (StatusCode::BAD_REQUEST, "invalid_request"), "{printers}: {a:?}");
        assert!(message(&a).contains(says), "{printers}: {a:?}");
    }
    // Another store's printer is, for this station, no printer at all.
    for (printers, says) in [(json!(["p1", "q1"]), "q1"), (json!(["nope"]), "nope")] {
        let a = patch(app, "/v1/stations/hot", &key, json!({ "printers": printers })).await;
        assert_eq!((a.status, a.code()), (StatusCode::NOT_FOUND, "not_found"), "{printers}: {a:?}");
        assert!(message(&a).contains(says), "{printers}: {a:?}");
    }
    let moved = patch(app, "/v1/stations/hot", &key, json!({"printers": ["p1"], "store_id": "s2"})).await;
    assert_eq!(moved.code(), "invalid_request", "a station cannot change store either: {moved:?}");
    let unknown = patch(app, "/v1/stations/cold", &key, json!({"printers": ["p1"]})).await;
    assert_eq!((unknown.status, unknown.code()), (StatusCode::NOT_FOUND, "not_found"));

    let changed = patch(app, "/v1/stations/hot", &key, json!({"printers": ["p2", "p1"]})).await;
    assert_eq!(changed.status, StatusCode::OK, "{changed:?}");
    assert_eq!(changed.body["printers"], json!(["p2", "p1"]));
    assert_eq!(app.get("/v1/stations/hot", &key).await.body["printers"], json!(["p2", "p1"]));
    // New tasks go to the new primary at once; tasks already created keep their printer.
    let after = submit(app, &key, ticket("S2")).await;
    assert_eq!(task(app, &key, &after).await["printer_id"], "p2");
    assert_eq!(task(app, &key, &on_primary).await["printer_id"], "p1");
}

async fn a_revoked_agent_token_fails_on_the_next_request(app: &TestApp) {
    let key = app.tenant("acme").await;
    let created = app.call("POST", "/v1/stores/s1/agent-tokens", Some(&key), None).await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    let token_id = created.body["id"].as_str().unwrap_or("").to_owned();
    assert!(token_id.starts_with("tok_"), "{created:?}");
    assert_eq!(created.body["store_id"], "s1");
    let first =
        Agent { token: created.body["token"].as_str().unwrap_or("").into(), id: "a".into(), session: "s-1".into() };
    let second = Agent::new(app, &key, "b", "s-2").await;

    let listed = app.get("/v1/stores/s1/agent-tokens", &key).await;
    assert_eq!(listed.status, StatusCode::OK);
    let tokens = listed.body["tokens"].as_array().cloned().unwrap_or_default();
    assert_eq!(tokens.len(), 2);
    // Oldest first; two tokens made within one millisecond may come either way.
    assert!(tokens.iter().any(|t| t["id"] == token_id.as_str()), "{tokens:?}");
    assert!(tokens.iter().all(|t| t.get("token").is_none() && t["revoked_at"].is_null()), "{tokens:?}");
    assert!(!listed.body.to_string().contains(&first.token), "a list never shows a token");

    // The token works, and its identity is now in the directory cache…
    assert_eq!(first.poll_answer(app, 0).await.status, StatusCode::OK);
    let revoked = delete(app, &format!("/v1/stores/s1/agent-tokens/{token_id}"), &key).await;
    assert_eq!(revoked.status, StatusCode::OK, "{revoked:?}");
    assert!(revoked.body["revoked_at"].is_string(), "{revoked:?}");
    // …which the revocation cleared: the very next request is refused.
    let refused = first.poll_answer(app, 0).await;
    assert_eq!((refused.status, refused.code()), (StatusCode::UNAUTHORIZED, "unauthorized"));
    let acks = app.post("/v1/agent/acks", &first.token, json!({"acks": []})).await;
    assert_eq!(acks.status, StatusCode::UNAUTHORIZED);
    assert_eq!(second.poll_answer(app, 0).await.status, StatusCode::OK, "the store's other token still works");

    // Revoking again answers the token as it is.
    let again = delete(app, &format!("/v1/stores/s1/agent-tokens/{token_id}"), &key).await;
    assert_eq!((again.status, again.body["revoked_at"].clone()), (StatusCode::OK, revoked.body["revoked_at"].clone()));
    // The list holds the revoked token with its time and the other one untouched, in either
    // order when both were made within one millisecond.
    let listed = app.get("/v1/stores/s1/agent-tokens", &key).await.body["tokens"].clone();
    let listed = listed.as_array().cloned().unwrap_or_default();
    let (gone, kept): (Vec<_>, Vec<_>) = listed.iter().partition(|t| t["id"] == token_id.as_str());
    assert_eq!((gone.len(), kept.len()), (1, 1), "{listed:?}");
    assert_eq!(gone[0]["revoked_at"], revoked.body["revoked_at"]);
    assert!(kept[0]["revoked_at"].is_null(), "{listed:?}");

    for path in ["/v1/stores/s1/agent-tokens/tok_nope", &format!("/v1/stores/s9/agent-tokens/{token_id}")] {
        let a = delete(app, path, &key).await;
        assert_eq!((a.status, a.code()), (StatusCode::NOT_FOUND, "not_found"), "{path}: {a:?}");
    }
    assert_eq!(app.get("/v1/stores/s9/agent-tokens", &key).await.status, StatusCode::NOT_FOUND);
}

async fn api_keys_are_added_and_revoked_but_never_the_last(app: &TestApp) {
    let t = app.post("/v1/tenants", ADMIN, json!({"id": "acme", "name": "Acme"})).await;
    assert_eq!(t.status, StatusCode::CREATED, "{t:?}");
    let first = t.body["api_key"].as_str().unwrap_or("").to_owned();
    let first_id = t.body["api_key_id"].as_str().unwrap_or("").to_owned();
    assert!(first_id.starts_with("key_"), "{t:?}");
    let listed = app.get("/v1/api-keys", &first).await;
    assert_eq!(
        listed.body["api_keys"],
        json!([{"id": first_id, "created_at": t.body["created_at"], "revoked_at": null}])
    );

    let last = delete(app, &format!("/v1/api-keys/{first_id}"), &first).await;
    assert_eq!((last.status, last.code()), (StatusCode::CONFLICT, "last_api_key"), "{last:?}");
    assert!(message(&last).contains("POST /v1/api-keys"), "{last:?}");

    let created = app.call("POST", "/v1/api-keys", Some(&first), None).await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    let second = created.body["api_key"].as_str().unwrap_or("").to_owned();
    let second_id = created.body["id"].as_str().unwrap_or("").to_owned();
    assert!(second.starts_with("opk_") && second != first);
    assert_eq!(app.get("/v1/stores", &second).await.status, StatusCode::OK, "the new key works");

    // A key may revoke itself while another is active; the next request with it fails,
    // although the directory had just cached it.
    assert_eq!(app.get("/v1/stores", &first).await.status, StatusCode::OK);
    let revoked = delete(app, &format!("/v1/api-keys/{first_id}"), &first).await;
    assert_eq!(revoked.status, StatusCode::OK, "{revoked:?}");
    assert!(revoked.body["revoked_at"].is_string());
    let refused = app.get("/v1/stores", &first).await;
    assert_eq!((refused.status, refused.code()), (StatusCode::UNAUTHORIZED, "unauthorized"));
    assert_eq!(app.get("/v1/stores", &second).await.status, StatusCode::OK);

    let again = delete(app, &format!("/v1/api-keys/{first_id}"), &second).await;
    assert_eq!((again.status, again.body["revoked_at"].clone()), (StatusCode::OK, revoked.body["revoked_at"].clone()));
    let last = delete(app, &format!("/v1/api-keys/{second_id}"), &second).await;
    assert_eq!((last.status, last.code()), (StatusCode::CONFLICT, "last_api_key"));
    let unknown = delete(app, "/v1/api-keys/key_nope", &second).await;
    assert_eq!((unknown.status, unknown.code()), (StatusCode::NOT_FOUND, "not_found"));

    let keys = app.get("/v1/api-keys", &second).await.body["api_keys"].clone();
    assert_eq!(keys.as_array().map(Vec::len), Some(2));
    // Oldest first, though two keys made within one millisecond may come either way.
    let of = |id: &str| keys.as_array().and_then(|k| k.iter().find(|k| k["id"] == id).cloned()).unwrap_or_default();
    assert!(of(&first_id)["revoked_at"].is_string(), "{keys:?}");
    assert!(of(&second_id)["revoked_at"].is_null(), "{keys:?}");
    assert!(!keys.to_string().contains(&second), "a list never shows a key");
}

async fn setup_events_list_every_change_newest_first_without_secrets(app: &TestApp) {
    let t = app.post("/v1/tenants", ADMIN, json!({"id": "acme", "name": "Acme"})).await;
    let key = t.body["api_key"].as_str().unwrap_or("").to_owned();
    let by_key = format!("api_key:{}", t.body["api_key_id"].as_str().unwrap_or(""));
    let ok = |a: Answer| assert!(a.status.is_success(), "{a:?}");
    ok(app.post("/v1/stores", &key, json!({"id": "s1", "name": "Main", "timezone": "Asia/Shanghai"})).await);
    let old = json!({"kind": "webhook", "url": "https://old.example/jobs", "secret": "old-s3cret-0123456789"});
    let new = json!({"kind": "webhook", "url": "https://new.example/jobs", "secret": "new-s3cret-0123456789"});
    ok(app.post("/v1/printers", &key, json!({"id": "p1", "store_id": "s1", "transport": old})).await);
    ok(app
        .post(
            "/v1/printers",
            &key,
            json!({"id": "p2", "store_id": "s1", "transport": agent_transport("tcp://10.0.0.2:9100")}),
        )
        .await);
    ok(patch(app, "/v1/printers/p1", &key, json!({"name": "Cloud", "transport": new})).await);
    ok(app.post("/v1/printers/p1/disable", &key, disable()).await);
    ok(app.post("/v1/printers/p1/enable", &key, enable()).await);
    ok(app.post("/v1/stations", &key, json!({"id": "hot", "store_id": "s1", "printers": ["p1", "p2"]})).await);
    ok(patch(app, "/v1/stations/hot", &key, json!({"printers": ["p2", "p1"]})).await);
    let token = app.call("POST", "/v1/stores/s1/agent-tokens", Some(&key), None).await;
    let token_id = token.body["id"].as_str().unwrap_or("").to_owned();
    ok(delete(app, &format!("/v1/stores/s1/agent-tokens/{token_id}"), &key).await);
    let second = app.call("POST", "/v1/api-keys", Some(&key), None).await;
    let second_key = second.body["api_key"].as_str().unwrap_or("").to_owned();
    let second_id = second.body["id"].as_str().unwrap_or("").to_owned();
    let first_id = t.body["api_key_id"].as_str().unwrap_or("").to_owned();
    ok(delete(app, &format!("/v1/api-keys/{first_id}"), &second_key).await);
    // Changes that change nothing, or fail, leave no row.
    ok(app.post("/v1/printers/p1/enable", &second_key, enable()).await);
    assert_eq!(
        app.post(
            "/v1/printers",
            &second_key,
            json!({"id": "p2", "store_id": "s1", "transport": agent_transport("tcp://10.0.0.2:9100")})
        )
        .await
        .status,
        StatusCode::CONFLICT
    );

    let all = app.get("/v1/setup-events?limit=500", &second_key).await;
    assert_eq!(all.status, StatusCode::OK, "{all:?}");
    let events = all.body["events"].as_array().cloned().unwrap_or_default();
    let what: Vec<(String, String, String)> = events
        .iter()
        .map(|e| {
            let s = |f: &str| e[f].as_str().unwrap_or("").to_owned();
            (s("object_kind"), s("object_id"), s("action"))
        })
        .collect();
    let want = [
        ("api_key", first_id.as_str(), "revoke"),
        ("api_key", second_id.as_str(), "create"),
        ("agent_token", token_id.as_str(), "revoke"),
        ("agent_token", token_id.as_str(), "create"),
        ("station", "hot", "update"),
        ("station", "hot", "create"),
        ("printer", "p1", "enable"),
        ("printer", "p1", "disable"),
        ("printer", "p1", "update"),
        ("printer", "p2", "create"),
        ("printer", "p1", "create"),
        ("store", "s1", "create"),
        ("tenant", "acme", "create"),
    ];
    assert_eq!(what, want.map(|(k, i, a)| (k.to_owned(), i.to_owned(), a.to_owned())));
    assert!(all.body["next_cursor"].is_null());
    // Who: the admin made the tenant, its first key everything up to the second key's
    // creation, the second key the revocation of the first.
    let actors: Vec<&str> = events.iter().map(|e| e["actor"].as_str().unwrap_or("")).collect();
    assert_eq!(actors[0], format!("api_key:{second_id}"));
    assert!(actors[1..12].iter().all(|a| *a == by_key), "{actors:?}");
    assert_eq!(actors[12], "admin");
    assert!(events.iter().all(|e| e["at"].as_str().unwrap_or("").ends_with('Z')));

    // The printer edit shows before and after, with the secrets hidden; no secret or key
    // appears anywhere in the audit.
    let edit = &events[8]["detail"];
    assert_eq!(edit["before"]["transport"]["url"], "https://old.example/jobs");
    assert_eq!(edit["after"]["transport"]["url"], "https://new.example/jobs");
    assert_eq!((edit["before"]["name"].clone(), edit["after"]["name"].clone()), (json!("p1"), json!("Cloud")));
    assert_eq!(
        (edit["before"]["transport"]["secret"].clone(), edit["after"]["transport"]["secret"].clone()),
        (json!("***"), json!("***"))
    );
    let text = all.body.to_string();
    for secret in
        ["old-s3cret", "new-s3cret", key.as_str(), second_key.as_str(), token.body["token"].as_str().unwrap_or("?")]
    {
        assert!(!text.contains(secret), "{secret} in the audit");
    }
    assert_eq!(events[7]["detail"], disable());
    assert_eq!(
        events[4]["detail"],
        json!({"before": {"printers": ["p1", "p2"], "failover_after_ms": null},
               "after": {"printers": ["p2", "p1"], "failover_after_ms": null}})
    );
    assert_eq!(events[11]["detail"], json!({"name": "Main", "timezone": "Asia/Shanghai"}));

    // Pages of 5 give the same list; bad paging is refused.
    let mut paged = Vec::new();
    let mut cursor = String::new();
    loop {
        let page = app.get(&format!("/v1/setup-events?limit=5&cursor={cursor}"), &second_key).await;
        assert_eq!(page.status, StatusCode::OK, "{page:?}");
        paged.extend(page.body["events"].as_array().cloned().unwrap_or_default());
        match page.body["next_cursor"].as_str() {
            Some(c) => cursor = c.to_owned(),
            None => break,
        }
    }
    assert_eq!(paged, events);
    for q in ["limit=0", "limit=501", "cursor=abc", "cursor=-1"] {
        let a = app.get(&format!("/v1/setup-events?{q}"), &second_key).await;
        assert_eq!((a.status, a.code()), (StatusCode::BAD_REQUEST, "invalid_request"), "{q}: {a:?}");
    }

    // Another tenant sees only its own creation.
    let other = app.tenant("other").await;
    let theirs = app.get("/v1/setup-events", &other).await.body["events"].clone();
    assert!(theirs.as_array().is_some_and(|e| e.len() == 4 && e.iter().all(|e| e["object_id"] != "acme")), "{theirs}");
    assert_eq!(app.call("GET", "/v1/setup-events", None, None).await.status, StatusCode::UNAUTHORIZED);
}

async fn another_tenants_set_up_is_not_found(app: &TestApp) {
    let acme = app.tenant("acme").await;
    let other = app.tenant("other").await;
    // Objects only the other tenant has.
    app.post(
        "/v1/printers",
        &other,
        json!({"id": "x1", "store_id": "s1", "transport": agent_transport("tcp://10.0.0.7:9100")}),
    )
    .await;
    app.post("/v1/stations", &other, json!({"id": "hot", "store_id": "s1", "printers": ["x1"]})).await;
    let token = app.call("POST", "/v1/stores/s1/agent-tokens", Some(&other), None).await;
    let token_id = token.body["id"].as_str().unwrap_or("").to_owned();
    let extra = app.call("POST", "/v1/api-keys", Some(&other), None).await;
    let key_id = extra.body["id"].as_str().unwrap_or("").to_owned();

    for a in [
        patch(app, "/v1/printers/x1", &acme, json!({"name": "mine now"})).await,
        app.post("/v1/printers/x1/disable", &acme, disable()).await,
        app.post("/v1/printers/x1/enable", &acme, enable()).await,
        patch(app, "/v1/stations/hot", &acme, json!({"printers": ["p1"]})).await,
        // Both tenants have a store s1; the token is still only the other's.
        delete(app, &format!("/v1/stores/s1/agent-tokens/{token_id}"), &acme).await,
        delete(app, &format!("/v1/api-keys/{key_id}"), &acme).await,
    ] {
        assert_eq!((a.status, a.code()), (StatusCode::NOT_FOUND, "not_found"), "{a:?}");
    }
    // Nothing of theirs changed; acme's lists hold only acme's.
    let x1 = app.get("/v1/printers/x1", &other).await.body;
    assert_eq!((x1["name"].clone(), x1["enabled"].clone()), (json!("x1"), json!(true)));
    assert_eq!(app.get("/v1/stations/hot", &other).await.body["printers"], json!(["x1"]));
    assert!(app.get("/v1/stores/s1/agent-tokens", &other).await.body["tokens"][0]["revoked_at"].is_null());
    assert!(app.get("/v1/api-keys", &other).await.body["api_keys"][1]["revoked_at"].is_null());
    assert!(app.get("/v1/stores/s1/agent-tokens", &acme).await.body["tokens"].as_array().is_some_and(Vec::is_empty));
    assert_eq!(app.get("/v1/api-keys", &acme).await.body["api_keys"].as_array().map(Vec::len), Some(1));
    assert!(!app.get("/v1/setup-events", &acme).await.body.to_string().contains("x1"));
    // And without a key, nothing at all.
    for (method, path) in [("PATCH", "/v1/printers/p1"), ("POST", "/v1/api-keys"), ("DELETE", "/v1/api-keys/k")] {
        let a = app.call(method, path, None, Some(json!({"name": "x"}))).await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{method} {path}");
    }
}

async fn printers_that_call_in_get_a_login_shown_once_and_replaced_on_request(app: &TestApp) {
    let key = app.tenant("acme").await;
    let star = app
        .post(
            "/v1/printers",
            &key,
            json!({"id": "star", "store_id": "s1", "transport": {"kind": "cloudprnt", "mac": "00:11:62:AA:BB:CC"}}),
        )
        .await;
    assert_eq!(star.status, StatusCode::CREATED, "{star:?}");
    let username = star.body["credentials"]["username"].as_str().unwrap_or_default().to_owned();
    let password = star.body["credentials"]["password"].as_str().unwrap_or_default().to_owned();
    // A password a TM printer can hold: 30 characters of [A-Za-z0-9_-], no prefix.
    let printer_password =
        |p: &str| p.len() == 30 && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    assert!(username.starts_with("prn_") && username.len() == 20 && printer_password(&password), "{star:?}");
    assert_eq!(star.body["transport"]["mac"], "00:11:62:aa:bb:cc", "kept in one spelling");
    // Shown once: never in a read, never in the audit.
    let read = app.get("/v1/printers/star", &key).await;
    assert_eq!(read.status, StatusCode::OK);
    assert!(read.body.get("credentials").is_none(), "{read:?}");
    // A printer the broker reaches has no login of its own.
    assert!(app.get("/v1/printers/p1", &key).await.body.get("credentials").is_none());
    let p1 = app.call("POST", "/v1/printers/p1/credentials", Some(&key), None).await;
    assert_eq!((p1.status, p1.code()), (StatusCode::NOT_FOUND, "not_found"), "{p1:?}");
    assert!(p1.body["error"]["message"].as_str().unwrap_or_default().contains("cloudprnt"), "{p1:?}");
    let none = app.call("POST", "/v1/printers/nope/credentials", Some(&key), None).await;
    assert_eq!(none.status, StatusCode::NOT_FOUND, "{none:?}");
    // Another tenant cannot replace it.
    let other = app.tenant("other").await;
    let theirs = app.call("POST", "/v1/printers/star/credentials", Some(&other), None).await;
    assert_eq!(theirs.status, StatusCode::NOT_FOUND, "{theirs:?}");
    let new = app.call("POST", "/v1/printers/star/credentials", Some(&key), None).await;
    assert_eq!(new.status, StatusCode::OK, "{new:?}");
    let new_password = new.body["password"].as_str().unwrap_or_default();
    assert!(printer_password(new_password) && new_password != password, "{new:?}");
    let events = app.get("/v1/setup-events?limit=50", &key).await;
    let text = events.body.to_string();
    assert!(text.contains("\"rotate\""), "{text}");
    assert!(!text.contains(&password) && !text.contains(new_password), "no password in the audit: {text}");
    // Every kind that logs in gets one; an Epson printer and an MQTT device too.
    let epson =
        app.post("/v1/printers", &key, json!({"id": "tm", "store_id": "s1", "transport": {"kind": "epson_sdp"}})).await;
    assert_eq!(epson.status, StatusCode::CREATED, "{epson:?}");
    assert!(epson.body["credentials"]["password"].is_string(), "{epson:?}");
}
