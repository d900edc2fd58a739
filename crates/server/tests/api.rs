//! The HTTP contract, asserted the way a user sees it: status codes, JSON bodies, and what
//! ends up in the database. Every test runs on SQLite and on PostgreSQL.

mod common;

use common::{order, TestApp, ADMIN};
use reqwest::StatusCode;
use serde_json::json;

both_backends!(
    an_agent_status_report_naming_a_printer_twice_counts_its_last_status,
    a_webhook_naming_an_event_twice_gets_it_once,
    first_submission_creates_and_retries_are_duplicates,
    same_key_with_other_content_is_a_mismatch,
    missing_biz_no_is_refused_before_anything_else,
    bad_input_is_a_clear_4xx_and_writes_nothing,
    sixty_four_concurrent_identical_submissions_make_one_task,
    tenants_are_isolated,
    set_up_objects_are_validated,
    tasks_list_pages_and_events_show_the_audit_trail,
    authentication_is_required,
    meta_endpoints_answer,
    bad_query_strings_and_paths_get_the_json_error_body,
    an_agent_forwards_lan_submissions_with_the_same_answers_for_its_store_only,
);

async fn first_submission_creates_and_retries_are_duplicates(app: &TestApp) {
    let key = app.tenant("acme").await;
    let first = app.submit(&key, order("A1001#kitchen", "Table 5\n1 x Noodles\n")).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert_eq!(first.body["state"], "pending");
    assert_eq!(first.body["duplicate"], false);
    let id = first.body["task_id"].as_str().expect("task_id").to_owned();

    for _ in 0..3 {
        let again = app.submit(&key, order("A1001#kitchen", "Table 5\n1 x Noodles\n")).await;
        assert_eq!(again.status, StatusCode::OK, "{again:?}");
        assert_eq!(again.body["task_id"], id.as_str());
        assert_eq!(again.body["duplicate"], true);
        assert_eq!(again.body["state"], "pending");
        assert!(again.body["message"].as_str().unwrap_or("").contains(&id), "{again:?}");
    }
    // print_type joins the key: the same biz_no as a refund slip is another task.
    let mut refund = order("A1001#kitchen", "Table 5\n1 x Noodles\n");
    refund["print_type"] = json!("refund");
    let r = app.submit(&key, refund).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    assert_ne!(r.body["task_id"], id.as_str());

    let task = app.get(&format!("/v1/print-tasks/{id}"), &key).await;
    assert_eq!(task.status, StatusCode::OK);
    for field in [
        "task_id",
        "biz_no",
        "printer_id",
        "store_id",
        "print_type",
        "state",
        "attempts",
        "last_error",
        "created_at",
        "updated_at",
        "printed_at",
    ] {
        assert!(task.body.get(field).is_some(), "field {field} missing: {task:?}");
    }
    assert_eq!(task.body["store_id"], "s1");
    assert_eq!(task.body["print_type"], "receipt");
    assert_eq!(task.body["attempts"], 0);
    assert!(task.body["created_at"].as_str().unwrap_or("").ends_with('Z'));
    assert_eq!(app.all_tasks(&key).await.len(), 2);
    let ledger = app.store.ledger_entries(&id).await.expect("ledger");
    assert_eq!(ledger.len(), 1, "one charge, however many retries");
}

async fn same_key_with_other_content_is_a_mismatch(app: &TestApp) {
    let key = app.tenant("acme").await;
    let first = app.submit(&key, order("B7", "one thing")).await;
    assert_eq!(first.status, StatusCode::CREATED);
    // Once from the database (fresh process state would not know it) and once from the gate.
    for _ in 0..2 {
        let other = app.submit(&key, order("B7", "another thing")).await;
        assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY, "{other:?}");
        assert_eq!(other.code(), "idempotency_mismatch");
        assert!(other.body["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains(first.body["task_id"].as_str().unwrap_or("?")));
    }
    assert_eq!(app.all_tasks(&key).await.len(), 1);
}

async fn missing_biz_no_is_refused_before_anything_else(app: &TestApp) {
    let key = app.tenant("acme").await;
    let bodies = [
        json!({"printer_id": "p1", "content": {"type": "text", "text": "x"}}),
        json!({"biz_no": "", "printer_id": "p1", "content": {"type": "text", "text": "x"}}),
        json!({"biz_no": "   ", "printer_id": "p1", "content": {"type": "text", "text": "x"}}),
        json!({"biz_no": null, "printer_id": "p1", "content": {"type": "text", "text": "x"}}),
        // Everything else is wrong too; the missing biz_no is still what the caller hears.
        json!({"printer_id": 42, "print_type": "nope", "content": {"type": "pdf"}}),
        json!({}),
    ];
    for b in bodies {
        let a = app.submit(&key, b.clone()).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{b} → {a:?}");
        assert_eq!(a.code(), "missing_biz_no", "{b} → {a:?}");
    }
    assert!(app.all_tasks(&key).await.is_empty());
}

async fn bad_input_is_a_clear_4xx_and_writes_nothing(app: &TestApp) {
    let key = app.tenant("acme").await;
    let cases: Vec<(serde_json::Value, &str)> = vec![
        (
            json!({"biz_no": "X", "printer_id": "p1", "station_id": "s", "content": {"type": "text", "text": "x"}}),
            "exactly one",
        ),
        (json!({"biz_no": "X", "content": {"type": "text", "text": "x"}}), "printer_id"),
        (json!({"biz_no": "X", "printer_id": "bad id!", "content": {"type": "text", "text": "x"}}), "printer_id"),
        (json!({"biz_no": "X", "printer_id": "p1"}), "content"),
        (json!({"biz_no": "X", "printer_id": "p1", "content": {"type": "text", "text": ""}}), "content.text"),
        (json!({"biz_no": "X", "printer_id": "p1", "content": {"type": "escpos", "data": "***"}}), "content.data"),
        (json!({"biz_no": "X", "printer_id": "p1", "content": {"type": "pdf"}}), "pdf"),
        (
            json!({"biz_no": "X", "printer_id": "p1", "print_type": "nope", "content": {"type": "text", "text": "x"}}),
            "unknown print type",
        ),
        (json!({"biz_no": 12, "printer_id": "p1", "content": {"type": "text", "text": "x"}}), "biz_no"),
        (
            json!({"biz_no": "X", "printer_id": "p1", "colour": "red", "content": {"type": "text", "text": "x"}}),
            "colour",
        ),
        (
            json!({"biz_no": "X", "printer_id": "p1", "content": {"type": "text", "text": "x".repeat(300 * 1024)}}),
            "limit",
        ),
        (json!(["not", "an", "object"]), "object"),
    ];
    for (body, needle) in cases {
        let a = app.submit(&key, body.clone()).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{body} → {a:?}");
        assert_eq!(a.code(), "invalid_request", "{body} → {a:?}");
        let msg = a.body["error"]["message"].as_str().unwrap_or("");
        assert!(msg.contains(needle), "message {msg:?} should mention {needle:?}");
    }
    // A target that does not exist is well formed: 404, naming the field.
    for (body, needle) in [
        (json!({"biz_no": "X", "printer_id": "nope", "content": {"type": "text", "text": "x"}}), "printer_id"),
        (json!({"biz_no": "X", "station_id": "nope", "content": {"type": "text", "text": "x"}}), "station_id"),
    ] {
        let a = app.submit(&key, body.clone()).await;
        assert_eq!((a.status, a.code()), (StatusCode::NOT_FOUND, "not_found"), "{body} → {a:?}");
        let msg = a.body["error"]["message"].as_str().unwrap_or("");
        assert!(msg.contains(needle), "message {msg:?} should mention {needle:?}");
    }
    let malformed = app.raw("/v1/print-tasks", &key, b"{\"biz_no\": \"X\", ".to_vec()).await;
    assert_eq!((malformed.status, malformed.code()), (StatusCode::BAD_REQUEST, "invalid_request"), "{malformed:?}");
    let huge = app.raw("/v1/print-tasks", &key, vec![b' '; 2 * 1024 * 1024]).await;
    assert_eq!((huge.status, huge.code()), (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"), "{huge:?}");
    // The unread rest of the body makes the connection unusable; the answer must say it closes,
    // or the client's next request on the same connection fails half-way.
    let res = app
        .http
        .post(format!("{}/v1/print-tasks", app.base))
        .bearer_auth(&key)
        .body(vec![b' '; 2 * 1024 * 1024])
        .send()
        .await
        .expect("request");
    assert_eq!(res.headers().get("connection").map(|v| v.as_bytes()), Some(&b"close"[..]), "{:?}", res.headers());
    drop(res);
    // A client still sending when the broker has seen enough gets the 413, not a reset: the
    // broker reads the rest of a body up to a bound before it closes the connection.
    let answer = slow_oversized_post(app, &key).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("payload_too_large"), "{answer}");
    assert!(app.all_tasks(&key).await.is_empty(), "no partial writes");
}

/// Posts a 2 MiB body in 64 KiB pieces 10 ms apart over a plain socket, as a client on a
/// slow line sends it, and returns the answer as text (or what went wrong).
async fn slow_oversized_post(app: &TestApp, key: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = app.base.trim_start_matches("http://").to_owned();
    let mut sock = tokio::net::TcpStream::connect(&addr).await.expect("connect");
    let piece = 64 * 1024;
    let total = 32 * piece;
    let head = format!(
        "POST /v1/print-tasks HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {key}\r\n\
         content-type: application/json\r\ncontent-length: {total}\r\n\r\n"
    );
    let sent = async {
        sock.write_all(head.as_bytes()).await?;
        for _ in 0..32 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            sock.write_all(&vec![b' '; piece]).await?;
        }
        let mut answer = Vec::new();
        sock.read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&answer).into_owned())
    };
    sent.await.unwrap_or_else(|e| format!("the request failed: {e}"))
}

async fn sixty_four_concurrent_identical_submissions_make_one_task(app: &TestApp) {
    let key = app.tenant("acme").await;
    let mut handles = Vec::new();
    for _ in 0..64 {
        let http = app.http.clone();
        let url = format!("{}/v1/print-tasks", app.base);
        let key = key.clone();
        handles.push(tokio::spawn(async move {
            let res = http.post(url).bearer_auth(key).json(&order("RUSH-1", "same ticket")).send().await.expect("send");
            let status = res.status();
            let body: serde_json::Value = res.json().await.expect("json");
            (status, body["task_id"].as_str().unwrap_or("").to_owned())
        }));
    }
    let mut created = 0;
    let mut ok = 0;
    let mut ids = std::collections::BTreeSet::new();
    for h in handles {
        let (status, id) = h.await.expect("join");
        match status {
            StatusCode::CREATED => created += 1,
            StatusCode::OK => ok += 1,
            other => panic!("unexpected status {other}"),
        }
        ids.insert(id);
    }
    assert_eq!((created, ok), (1, 63));
    assert_eq!(ids.len(), 1);
    let tasks = app.all_tasks(&key).await;
    assert_eq!(tasks.len(), 1, "one task row");
    let id = ids.into_iter().next().unwrap_or_default();
    assert_eq!(app.store.ledger_entries(&id).await.expect("ledger").len(), 1, "one ledger charge");
}

async fn tenants_are_isolated(app: &TestApp) {
    let a = app.tenant("acme").await;
    let b = app.tenant("bistro").await;
    let t = app.submit(&a, order("A1", "acme's")).await;
    let id = t.body["task_id"].as_str().expect("id").to_owned();
    assert_eq!(app.get(&format!("/v1/print-tasks/{id}"), &b).await.code(), "not_found");
    assert_eq!(app.get(&format!("/v1/print-tasks/{id}/events"), &b).await.code(), "not_found");
    assert!(app.all_tasks(&b).await.is_empty());
    // bistro has its own p1; the same biz_no is its own task there.
    let tb = app.submit(&b, order("A1", "bistro's")).await;
    assert_eq!(tb.status, StatusCode::CREATED, "{tb:?}");
    assert_ne!(tb.body["task_id"], id.as_str());
    let s = app.post("/v1/stores", &b, json!({"id": "s9", "name": "Other"})).await;
    assert_eq!(s.status, StatusCode::CREATED);
    assert_eq!(app.get("/v1/stores/s9", &a).await.code(), "not_found");
    assert_eq!(app.call("POST", "/v1/stores/s9/agent-tokens", Some(&a), None).await.code(), "not_found");
}

async fn set_up_objects_are_validated(app: &TestApp) {
    let key = app.tenant("acme").await;
    let dup = app.post("/v1/tenants", ADMIN, json!({"id": "acme", "name": "again"})).await;
    assert_eq!((dup.status, dup.code()), (StatusCode::CONFLICT, "conflict"));
    let bad = app.post("/v1/tenants", ADMIN, json!({"id": "a b", "name": "x"})).await;
    assert_eq!((bad.status, bad.code()), (StatusCode::BAD_REQUEST, "invalid_request"));
    let long = app.post("/v1/stores", &key, json!({"id": "x".repeat(65), "name": "x"})).await;
    assert_eq!(long.code(), "invalid_request");
    let unknown_store = app
        .post("/v1/printers", &key, json!({"id": "p9", "store_id": "nowhere", "transport": {"kind": "agent", "address": "tcp://10.0.0.5:9100"}}))
        .await;
    assert_eq!((unknown_store.status, unknown_store.code()), (StatusCode::NOT_FOUND, "not_found"), "{unknown_store:?}");
    for transport in [
        json!({"kind": "carrier-pigeon", "address": "x"}),
        json!({"kind": "agent", "address": "10.0.0.5:9100"}),
        json!({"kind": "agent", "address": "tcp://host:0"}),
    ] {
        let a = app.post("/v1/printers", &key, json!({"id": "p9", "store_id": "s1", "transport": transport})).await;
        assert_eq!(a.code(), "invalid_request", "{a:?}");
    }
    let p = app.get("/v1/printers/p1", &key).await;
    assert_eq!(p.status, StatusCode::OK);
    assert_eq!(p.body["online"], false);
    assert!(p.body["last_seen_at"].is_null() && p.body["last_error"].is_null());
    assert_eq!(p.body["transport"]["kind"], "agent");
    assert_eq!(app.get("/v1/printers?store_id=s1", &key).await.body["printers"].as_array().map(Vec::len), Some(2));

    app.post("/v1/stores", &key, json!({"id": "s2", "name": "Second"})).await;
    app.post(
        "/v1/printers",
        &key,
        json!({"id": "q1", "store_id": "s2", "transport": {"kind": "agent", "address": "tcp://10.0.0.6:9100"}}),
    )
    .await;
    // Another store's printer is, for a station of s1, no printer at all.
    let cross = app.post("/v1/stations", &key, json!({"id": "hot", "store_id": "s1", "printers": ["p1", "q1"]})).await;
    assert_eq!((cross.status, cross.code()), (StatusCode::NOT_FOUND, "not_found"), "{cross:?}");
    assert!(cross.body["error"]["message"].as_str().unwrap_or("").contains("q1"));
    let empty = app.post("/v1/stations", &key, json!({"id": "hot", "store_id": "s1", "printers": []})).await;
    assert_eq!(empty.code(), "invalid_request");
    let ok = app.post("/v1/stations", &key, json!({"id": "hot", "store_id": "s1", "printers": ["p2", "p1"]})).await;
    assert_eq!(ok.status, StatusCode::CREATED, "{ok:?}");
    // A station task goes to the primary and is keyed on the station.
    let t =
        app.submit(&key, json!({"biz_no": "S1", "station_id": "hot", "content": {"type": "text", "text": "x"}})).await;
    assert_eq!(t.status, StatusCode::CREATED, "{t:?}");
    let got = app.get(&format!("/v1/print-tasks/{}", t.body["task_id"].as_str().unwrap_or("")), &key).await;
    assert_eq!((got.body["printer_id"].as_str(), got.body["station_id"].as_str()), (Some("p2"), Some("hot")));

    let tok = app.call("POST", "/v1/stores/s1/agent-tokens", Some(&key), None).await;
    assert_eq!(tok.status, StatusCode::CREATED);
    assert!(tok.body["token"].as_str().unwrap_or("").starts_with("opa_"));
}

async fn tasks_list_pages_and_events_show_the_audit_trail(app: &TestApp) {
    let key = app.tenant("acme").await;
    let mut ids = Vec::new();
    for i in 0..7 {
        let a = app.submit(&key, order(&format!("L{i}"), "x")).await;
        ids.push(a.body["task_id"].as_str().expect("id").to_owned());
    }
    let page = app.get("/v1/print-tasks?store_id=s1&limit=3", &key).await;
    assert_eq!(page.body["tasks"].as_array().map(Vec::len), Some(3));
    assert!(page.body["next_cursor"].is_string());
    let all = app.all_tasks(&key).await;
    assert_eq!(all.len(), 7);
    let by_biz = app.get("/v1/print-tasks?biz_no=L3", &key).await;
    assert_eq!(by_biz.body["tasks"][0]["task_id"], ids[3].as_str());
    let pending = app.get("/v1/print-tasks?state=pending&limit=500", &key).await;
    assert_eq!(pending.body["tasks"].as_array().map(Vec::len), Some(7));
    assert_eq!(app.get("/v1/print-tasks?state=bogus", &key).await.code(), "invalid_request");
    assert_eq!(app.get("/v1/print-tasks?limit=0", &key).await.code(), "invalid_request");
    assert_eq!(app.get("/v1/print-tasks?cursor=zzz", &key).await.code(), "invalid_request");

    let ev = app.get(&format!("/v1/print-tasks/{}/events", ids[0]), &key).await;
    assert_eq!(ev.status, StatusCode::OK);
    let events = ev.body["events"].as_array().cloned().unwrap_or_default();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["to"], "pending");
    assert!(events[0]["from"].is_null());
    assert_eq!(events[0]["actor"], "tenant:acme");
    assert!(events[0]["at"].is_string() && events[0]["reason"].is_string());
    assert_eq!(app.get("/v1/print-tasks/not-a-task", &key).await.code(), "not_found");
}

async fn authentication_is_required(app: &TestApp) {
    let key = app.tenant("acme").await;
    let none = app.call("POST", "/v1/print-tasks", None, Some(order("A", "x"))).await;
    assert_eq!((none.status, none.code()), (StatusCode::UNAUTHORIZED, "unauthorized"));
    let wrong = app.submit("opk_wrong", order("A", "x")).await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    // A tenant key is not the admin token.
    let as_admin = app.post("/v1/tenants", &key, json!({"id": "evil", "name": "x"})).await;
    assert_eq!(as_admin.status, StatusCode::UNAUTHORIZED);
    let no_admin = app.call("POST", "/v1/tenants", Some("nope"), Some(json!({"id": "x", "name": "x"}))).await;
    assert_eq!(no_admin.code(), "unauthorized");
    assert!(app.all_tasks(&key).await.is_empty());
}

async fn meta_endpoints_answer(app: &TestApp) {
    let key = app.tenant("acme").await;
    app.submit(&key, order("M1", "x")).await;
    app.submit(&key, order("M1", "x")).await;
    assert_eq!(app.call("GET", "/healthz", None, None).await.status, StatusCode::OK);
    let ready = app.call("GET", "/readyz", None, None).await;
    assert_eq!((ready.status, ready.body["status"].as_str()), (StatusCode::OK, Some("ready")));
    let metrics =
        app.http.get(format!("{}/metrics", app.base)).send().await.expect("metrics").text().await.expect("text");
    assert!(metrics.contains("onceprint_submissions_total{outcome=\"created\"} 1"), "{metrics}");
    assert!(metrics.contains("onceprint_submissions_total{outcome=\"duplicate_gate\"} 1"), "{metrics}");
    assert!(metrics.contains("onceprint_tasks{state=\"pending\"} 1"), "{metrics}");
    assert!(metrics.contains("onceprint_http_request_duration_seconds_bucket"), "{metrics}");
    // Latency is kept under the route's template, with the method and the answer's status.
    for labels in [
        r#"route="/v1/print-tasks",method="POST",status="201""#,
        r#"route="/v1/print-tasks",method="POST",status="200""#,
        r#"route="/healthz",method="GET",status="200""#,
    ] {
        assert!(metrics.contains(labels), "{labels} missing: {metrics}");
    }
    let nope = app.call("GET", "/v1/nothing-here", None, None).await;
    assert_eq!((nope.status, nope.code()), (StatusCode::NOT_FOUND, "not_found"));
    let wrong_method = app.call("DELETE", "/v1/print-tasks", Some(&key), None).await;
    assert_eq!((wrong_method.status, wrong_method.code()), (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"));
    let doc = app.call("GET", "/openapi.json", None, None).await;
    assert!(doc.body["paths"]["/v1/print-tasks"]["post"]["responses"]["201"].is_object());
}

async fn bad_query_strings_and_paths_get_the_json_error_body(app: &TestApp) {
    let key = app.tenant("acme").await;
    for path in [
        "/v1/print-tasks?limit=abc",
        "/v1/print-tasks?limit=-5",
        "/v1/stores/s1/reconciliation?date=2026-13-40&format=nope",
    ] {
        let a = app.get(path, &key).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{path}: {a:?}");
        assert_eq!(a.code(), "invalid_request", "{path}: the JSON error body, not the framework's text: {a:?}");
        let message = a.body["error"]["message"].as_str().unwrap_or_default();
        assert!(!message.contains("Failed to deserialize"), "{path}: {message}");
    }
    let a = app.get("/v1/print-tasks?limit=abc", &key).await;
    assert!(a.body["error"]["message"].as_str().unwrap_or_default().contains("limit"), "names the parameter: {a:?}");
}

/// A report naming one printer several times counts its last status, as one change.
async fn an_agent_status_report_naming_a_printer_twice_counts_its_last_status(app: &TestApp) {
    let key = app.tenant("acme").await;
    let agent = common::Agent::new(app, &key, "a1", "s1").await;
    let report = json!({"agent_id": "a1", "printers": [
        {"printer_id": "p1", "status": "no_paper"},
        {"printer_id": "p2", "status": "ready"},
        {"printer_id": "p1", "status": "cover_open"},
        {"printer_id": "p1", "status": "no_paper"},
        {"printer_id": "p1", "status": "cover_open"}
    ]});
    let a = app.post("/v1/agent/status", &agent.token, report).await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    let p1 = app.get("/v1/printers/p1", &key).await;
    assert_eq!(p1.body["last_error"], "cover_open", "the last status counts: {p1:?}");
}

/// Found by schemathesis: a webhook whose `events` named a kind twice made every such
/// event a 500 on SQLite (two deliveries of one event to one webhook).
async fn a_webhook_naming_an_event_twice_gets_it_once(app: &TestApp) {
    let key = app.tenant("acme").await;
    let w = app
        .post(
            "/v1/webhooks",
            &key,
            json!({"id": "ops", "url": "http://127.0.0.1:9/hook", "secret": "a-long-enough-secret",
                   "events": ["printer.offline", "printer.offline"]}),
        )
        .await;
    assert_eq!(w.status, StatusCode::CREATED, "{w:?}");
    // Found by schemathesis too: a secret of 12 characters in 24 bytes is short, as the
    // document's `minLength` (characters) says.
    let short = app
        .post(
            "/v1/webhooks",
            &key,
            json!({"id": "ops2", "url": "http://127.0.0.1:9/hook", "secret": "éééééééééééé", "events": ["printer.offline"]}),
        )
        .await;
    assert_eq!((short.status, short.code()), (StatusCode::BAD_REQUEST, "invalid_request"), "{short:?}");
    let agent = common::Agent::new(app, &key, "a1", "s1").await;
    // A printer never seen is not online yet: seen ready, then offline, is one event.
    for status in ["ready", "offline"] {
        let report = json!({"agent_id": "a1", "printers": [{"printer_id": "p1", "status": status}]});
        let a = app.post("/v1/agent/status", &agent.token, report).await;
        assert_eq!(a.status, StatusCode::OK, "{status}: {a:?}");
    }
    let d = app.get("/v1/webhooks/ops/deliveries", &key).await;
    assert_eq!(d.body["deliveries"].as_array().map(Vec::len), Some(1), "{d:?}");
}

/// A submission the store agent forwards from the shop's LAN gets the answers of
/// `POST /v1/print-tasks` (missing biz_no first, 201, 200 duplicate — also against the
/// same order sent to the cloud — 422 mismatch), only for its own store's printers, and
/// the audit trail names the agent's store.
async fn an_agent_forwards_lan_submissions_with_the_same_answers_for_its_store_only(app: &TestApp) {
    let key = app.tenant("acme").await;
    let agent = common::Agent::new(app, &key, "a1", "s1").await;
    let lan = |body: serde_json::Value| app.post("/v1/agent/print-tasks", &agent.token, body);

    let a = lan(json!({"printer_id": "p1", "content": {"type": "text", "text": "x"}})).await;
    assert_eq!((a.status, a.code()), (StatusCode::BAD_REQUEST, "missing_biz_no"), "{a:?}");

    let first = lan(order("L-1", "two noodles")).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    let task_id = first.body["task_id"].as_str().expect("task_id").to_owned();
    // The LAN retry and the same order sent to the cloud are the one task.
    for a in [lan(order("L-1", "two noodles")).await, app.submit(&key, order("L-1", "two noodles")).await] {
        assert_eq!(a.status, StatusCode::OK, "{a:?}");
        assert_eq!((a.body["task_id"].as_str(), a.body["duplicate"].as_bool()), (Some(task_id.as_str()), Some(true)));
    }
    let a = lan(order("L-1", "three noodles")).await;
    assert_eq!((a.status, a.code()), (StatusCode::UNPROCESSABLE_ENTITY, "idempotency_mismatch"), "{a:?}");

    // Another store's printer is not the agent's to print on, and is not even named.
    let a = app.post("/v1/stores", &key, json!({"id": "s2", "name": "Harbour"})).await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    let a = app
        .post(
            "/v1/printers",
            &key,
            json!({"id": "q1", "store_id": "s2", "name": "Bar",
                   "transport": {"kind": "agent", "address": "tcp://192.0.2.11:9100"}}),
        )
        .await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    let mut elsewhere = order("L-2", "a beer");
    elsewhere["printer_id"] = json!("q1");
    let a = lan(elsewhere.clone()).await;
    assert_eq!((a.status, a.code()), (StatusCode::NOT_FOUND, "not_found"), "{a:?}");
    let a = lan(json!({"biz_no": "L-3", "printer_id": "nope", "content": {"type": "text", "text": "x"}})).await;
    assert_eq!(a.status, StatusCode::NOT_FOUND, "{a:?}");
    // The tenant itself may; after that the agent's retry is still refused, not answered.
    assert_eq!(app.submit(&key, elsewhere.clone()).await.status, StatusCode::CREATED);
    assert_eq!(lan(elsewhere).await.status, StatusCode::NOT_FOUND);
    assert_eq!(app.post("/v1/agent/print-tasks", &key, order("L-4", "x")).await.status, StatusCode::UNAUTHORIZED);

    let events = app.get(&format!("/v1/print-tasks/{task_id}/events"), &key).await;
    assert_eq!(events.body["events"][0]["actor"], "agent:s1", "{events:?}");
    let tasks = app.all_tasks(&key).await;
    assert_eq!(tasks.len(), 2, "L-1 once and q1's task: {tasks:?}");
}
