//! Requests the framework would refuse on its own — a body of another media type, a method
//! the path does not take — answered through the one error mapping, as the OpenAPI
//! document says (found by schemathesis).

mod common;

use common::{order, TestApp, ADMIN};
use reqwest::StatusCode;
use serde_json::{json, Value};

both_backends!(
    a_body_of_another_media_type_is_415_with_the_json_error_body,
    json_media_types_and_a_missing_content_type_are_read_as_json,
    a_wrong_method_is_405_with_the_json_error_body_and_allow,
    integers_written_with_a_zero_fraction_are_integers,
    a_body_that_is_an_object_by_schema_is_refused_as_an_array,
);

async fn send(
    app: &TestApp,
    method: &str,
    path: &str,
    token: &str,
    content_type: &str,
    body: String,
) -> (StatusCode, Value) {
    let res = app
        .http
        .request(method.parse().expect("method"), format!("{}{path}", app.base))
        .bearer_auth(token)
        .header("content-type", content_type)
        .body(body)
        .send()
        .await
        .expect("request");
    let status = res.status();
    let text = res.text().await.expect("body");
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

async fn a_body_of_another_media_type_is_415_with_the_json_error_body(app: &TestApp) {
    let key = app.tenant("acme").await;
    let task = order("T1", "x").to_string();
    let cases = [
        ("POST", "/v1/print-tasks", key.as_str(), "text/plain", task.clone()),
        ("POST", "/v1/print-tasks", key.as_str(), "application/x-www-form-urlencoded", task),
        ("POST", "/v1/tenants", ADMIN, "text/plain", json!({"id": "t2", "name": "T2"}).to_string()),
        ("POST", "/v1/stores", key.as_str(), "application/xml", json!({"id": "s9", "name": "S9"}).to_string()),
        ("PATCH", "/v1/printers/p1", key.as_str(), "text/plain", json!({"name": "x"}).to_string()),
        ("POST", "/v1/stores/s1/reconciliation?date=2026-01-01", key.as_str(), "application/xml", "[]".into()),
        ("POST", "/v1/render/preview", key.as_str(), "image/png", "{}".into()),
    ];
    for (method, path, token, content_type, body) in cases {
        let (status, body) = send(app, method, path, token, content_type, body).await;
        assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{method} {path} as {content_type}: {body}");
        assert_eq!(body["error"]["code"], "unsupported_media_type", "{method} {path}: {body}");
        assert!(body["error"]["message"].as_str().is_some_and(|m| m.contains(content_type)), "{body}");
    }
    // Nothing was created by any of them.
    assert!(app.all_tasks(&key).await.is_empty());
    let store = app.get("/v1/stores/s9", &key).await;
    assert_eq!(store.status, StatusCode::NOT_FOUND);
}

async fn json_media_types_and_a_missing_content_type_are_read_as_json(app: &TestApp) {
    let key = app.tenant("acme").await;
    for (i, content_type) in
        ["application/json", "application/json; charset=utf-8", "Application/JSON", "application/merge-patch+json"]
            .into_iter()
            .enumerate()
    {
        let (status, body) =
            send(app, "POST", "/v1/print-tasks", &key, content_type, order(&format!("J{i}"), "x").to_string()).await;
        assert_eq!(status, StatusCode::CREATED, "{content_type}: {body}");
    }
    let res = app
        .http
        .post(format!("{}/v1/print-tasks", app.base))
        .bearer_auth(&key)
        .body(order("J-none", "x").to_string())
        .send()
        .await
        .expect("request");
    assert_eq!(res.status(), StatusCode::CREATED);
}

async fn a_wrong_method_is_405_with_the_json_error_body_and_allow(app: &TestApp) {
    let key = app.tenant("acme").await;
    for (method, path, allowed) in [
        ("PUT", "/v1/print-tasks", "GET,HEAD,POST"),
        ("DELETE", "/v1/stores/s1", "GET,HEAD"),
        ("GET", "/v1/tenants", "POST"),
    ] {
        let res = app
            .http
            .request(method.parse().expect("method"), format!("{}{path}", app.base))
            .bearer_auth(&key)
            .send()
            .await
            .expect("request");
        assert_eq!(res.status(), StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
        let allow = res.headers().get("allow").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
        let mut got: Vec<&str> = allow.split(',').map(str::trim).collect();
        got.sort_unstable();
        assert_eq!(got.join(","), allowed, "{method} {path}: Allow");
        let body: Value = res.json().await.expect("JSON body");
        assert_eq!(body["error"]["code"], "method_not_allowed", "{method} {path}");
    }
}

/// JSON Schema (and so the document) counts `16.0` as an integer; the broker took only `16`.
async fn integers_written_with_a_zero_fraction_are_integers(app: &TestApp) {
    let key = app.tenant("acme").await;
    let token = app.post("/v1/stores/s1/agent-tokens", &key, json!({})).await;
    let token = token.body["token"].as_str().expect("agent token").to_owned();
    let poll = app.post("/v1/agent/poll", &token, json!({"agent_id": "a1", "wait_ms": 0.0, "max": 16.0})).await;
    assert_eq!(poll.status, StatusCode::OK, "{poll:?}");
    let acks = app
        .post("/v1/agent/acks", &token, json!({"agent_id": "a1", "acks": [{"task_id": "01JAAAAAAAAAAAAAAAAAAAAAAA", "attempt": 1.0, "outcome": "printed"}]}))
        .await;
    assert_eq!(acks.status, StatusCode::OK, "{acks:?}");
    let printer = app
        .post(
            "/v1/printers",
            &key,
            json!({"id": "c9", "store_id": "s1", "transport": {"kind": "cloudprnt", "mac": "00:11:62:00:00:09", "poll_interval_s": 5.0}}),
        )
        .await;
    assert_eq!(printer.status, StatusCode::CREATED, "{printer:?}");
    // A fraction is still refused, naming the field.
    let half = app.post("/v1/agent/poll", &token, json!({"agent_id": "a1", "wait_ms": 0.5})).await;
    assert_eq!((half.status, half.code()), (StatusCode::BAD_REQUEST, "invalid_request"), "{half:?}");
}

/// serde reads a struct from an array of its fields too; the document says object, so
/// `[null, null]` must not be a PATCH that changes nothing (found by schemathesis).
async fn a_body_that_is_an_object_by_schema_is_refused_as_an_array(app: &TestApp) {
    let key = app.tenant("acme").await;
    let station = app.post("/v1/stations", &key, json!({"id": "hot", "store_id": "s1", "printers": ["p1"]})).await;
    assert_eq!(station.status, StatusCode::CREATED, "{station:?}");
    let cases = [
        ("PATCH", "/v1/stations/hot", "[null, null]"),
        ("PATCH", "/v1/printers/p1", "[]"),
        ("POST", "/v1/print-tasks", "[\"T1\", \"p1\"]"),
        ("POST", "/v1/print-task-batches", "[[]]"),
    ];
    for (method, path, body) in cases {
        let (status, answer) = send(app, method, path, &key, "application/json", body.into()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{method} {path} {body}: {answer}");
        assert_eq!(answer["error"]["code"], "invalid_request", "{method} {path}: {answer}");
        assert!(
            answer["error"]["message"].as_str().is_some_and(|m| m.contains("must be a JSON object")),
            "{method} {path}: {answer}"
        );
    }
    // Arrays where the document says array still read.
    let (status, answer) =
        send(app, "POST", "/v1/stores/s1/reconciliation?date=2026-01-01", &key, "application/json", "[\"R1\"]".into())
            .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(app.get("/v1/stations/hot", &key).await.body["printers"], json!(["p1"]));
}
