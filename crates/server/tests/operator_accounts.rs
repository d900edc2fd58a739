//! Operator accounts over HTTP, on SQLite and PostgreSQL: failed logins counted per
//! account and source (a stranger guessing from elsewhere cannot lock the owner out) with a
//! ceiling per account, a lock-out lifted on request, a disabled login and a new password,
//! each ending the operator's sessions. The brokers here lock a source out after 2
//! failures (and an account after 20 from all sources), to keep the slow hash's work small.

mod common;

use common::TestApp;
use onceprint_server::HttpConfig;
use reqwest::StatusCode;
use serde_json::{json, Value};

both_backends!(
    config = crate::two_failures;
    a_stranger_guessing_from_elsewhere_does_not_lock_the_owner_out,
    guesses_spread_over_many_sources_lock_the_account_until_it_is_unlocked,
    a_disabled_operator_cannot_log_in_and_its_sessions_end,
    a_new_password_ends_every_session,
);

const PASSWORD: &str = "a long enough passphrase";
const NEW_PASSWORD: &str = "another long passphrase";

fn two_failures() -> HttpConfig {
    let mut c = HttpConfig::default();
    c.operators.login_max_failures = 2;
    c
}

/// Tenant `acme` with staff `amy` of store s1 and manager `max`; returns the API key.
async fn setup(app: &TestApp) -> String {
    let key = app.tenant("acme").await;
    for body in [
        json!({"id": "amy", "name": "Amy", "role": "staff", "stores": ["s1"], "password": PASSWORD}),
        json!({"id": "max", "role": "manager", "password": PASSWORD}),
    ] {
        let a = app.post("/v1/operators", &key, body).await;
        assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
        assert!(a.body["disabled_at"].is_null() && a.body["login_locked_until"].is_null(), "{a:?}");
    }
    key
}

/// A login for the API from `source`: the tests reach the broker over loopback, as a
/// reverse proxy on the broker's machine would, so the broker takes the source from the
/// last address of `X-Forwarded-For`.
async fn login_from(app: &TestApp, source: &str, operator: &str, password: &str) -> (StatusCode, Value) {
    let res = app
        .http
        .post(format!("{}/v1/operator-sessions", app.base))
        .header("x-forwarded-for", format!("192.0.2.200, {source}"))
        .json(&json!({"tenant_id": "acme", "operator_id": operator, "password": password}))
        .send()
        .await
        .expect("login");
    let status = res.status();
    (status, res.json().await.unwrap_or(Value::Null))
}

async fn operator(app: &TestApp, key: &str, id: &str) -> Value {
    let list = app.get("/v1/operators", key).await;
    assert_eq!(list.status, StatusCode::OK, "{list:?}");
    list.body["operators"].as_array().and_then(|l| l.iter().find(|o| o["id"] == id).cloned()).unwrap_or_default()
}

async fn a_stranger_guessing_from_elsewhere_does_not_lock_the_owner_out(app: &TestApp) {
    let key = setup(app).await;
    let stranger = "203.0.113.9";
    for _ in 0..2 {
        assert_eq!(login_from(app, stranger, "amy", "a wrong guess!").await.0, StatusCode::UNAUTHORIZED);
    }
    // The stranger's source is refused now, even with the right password…
    let (status, body) = login_from(app, stranger, "amy", PASSWORD).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    // …and so is the same stranger behind any address written before the proxy's.
    let (status, _) = login_from(app, &format!("198.51.100.1, {stranger}"), "amy", PASSWORD).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    // Amy at the shop's counter logs in as usual.
    let (status, body) = login_from(app, "198.51.100.7", "amy", PASSWORD).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert!(body["token"].as_str().is_some_and(|t| t.starts_with("opo_")), "{body}");

    // The lock-out shows, and a manager's key lifts it for the stranger's source too.
    let locked = operator(app, &key, "amy").await;
    assert!(locked["login_locked_until"].is_string(), "{locked}");
    assert!(operator(app, &key, "max").await["login_locked_until"].is_null());
    let unlocked = app.call("DELETE", "/v1/operators/amy/lockout", Some(&key), None).await;
    assert_eq!(unlocked.status, StatusCode::OK, "{unlocked:?}");
    assert!(unlocked.body["login_locked_until"].is_null(), "{unlocked:?}");
    assert_eq!(login_from(app, stranger, "amy", PASSWORD).await.0, StatusCode::CREATED);
    let events = app.get("/v1/setup-events", &key).await;
    let first = &events.body["events"][0];
    assert_eq!((first["object_id"].as_str(), first["action"].as_str()), (Some("amy"), Some("update")), "{events:?}");
    assert_eq!(first["detail"]["login"], "unlocked", "{first}");

    let unknown = app.call("DELETE", "/v1/operators/zed/lockout", Some(&key), None).await;
    assert_eq!((unknown.status, unknown.code()), (StatusCode::NOT_FOUND, "not_found"));
}

async fn guesses_spread_over_many_sources_lock_the_account_until_it_is_unlocked(app: &TestApp) {
    let key = setup(app).await;
    // Twenty sources, one guess each: no source is locked out, the account is.
    for i in 0..20 {
        let (status, _) = login_from(app, &format!("203.0.113.{i}"), "max", "a wrong guess!").await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "guess {i}");
    }
    let (status, body) = login_from(app, "198.51.100.7", "max", PASSWORD).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert!(operator(app, &key, "max").await["login_locked_until"].is_string());
    // Other operators are not touched.
    assert_eq!(login_from(app, "198.51.100.7", "amy", PASSWORD).await.0, StatusCode::CREATED);
    let a = app.call("DELETE", "/v1/operators/max/lockout", Some(&key), None).await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    assert_eq!(login_from(app, "198.51.100.7", "max", PASSWORD).await.0, StatusCode::CREATED);
}

async fn a_disabled_operator_cannot_log_in_and_its_sessions_end(app: &TestApp) {
    let key = setup(app).await;
    let (_, body) = login_from(app, "198.51.100.7", "amy", PASSWORD).await;
    let token = body["token"].as_str().unwrap_or_default().to_owned();
    assert_eq!(app.get("/v1/stores/s1/attention", &token).await.status, StatusCode::OK);

    let off = app.call("POST", "/v1/operators/amy/disable", Some(&key), None).await;
    assert_eq!(off.status, StatusCode::OK, "{off:?}");
    let since = off.body["disabled_at"].clone();
    assert!(since.is_string(), "{off:?}");
    assert_eq!(app.get("/v1/stores/s1/attention", &token).await.status, StatusCode::UNAUTHORIZED);
    // The right password is told the login is disabled; a wrong one learns nothing.
    let (status, body) = login_from(app, "198.51.100.7", "amy", PASSWORD).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::FORBIDDEN, Some("forbidden")), "{body}");
    assert!(body["error"]["message"].as_str().unwrap_or("").contains("disabled"), "{body}");
    assert_eq!(login_from(app, "198.51.100.8", "amy", "a wrong guess!").await.0, StatusCode::UNAUTHORIZED);
    // Disabling again keeps the first time.
    let again = app.call("POST", "/v1/operators/amy/disable", Some(&key), None).await;
    assert_eq!((again.status, again.body["disabled_at"].clone()), (StatusCode::OK, since));
    assert!(operator(app, &key, "amy").await["disabled_at"].is_string());

    let on = app.call("POST", "/v1/operators/amy/enable", Some(&key), None).await;
    assert_eq!((on.status, on.body["disabled_at"].clone()), (StatusCode::OK, Value::Null), "{on:?}");
    assert_eq!(
        app.get("/v1/stores/s1/attention", &token).await.status,
        StatusCode::UNAUTHORIZED,
        "sessions stay ended"
    );
    assert_eq!(login_from(app, "198.51.100.7", "amy", PASSWORD).await.0, StatusCode::CREATED);

    let events = app.get("/v1/setup-events", &key).await.body["events"].clone();
    let actions: Vec<&str> = events.as_array().into_iter().flatten().filter_map(|e| e["action"].as_str()).collect();
    assert_eq!(actions[..3], ["enable", "disable", "disable"], "{events}");

    let other = app.tenant("other").await;
    for path in ["/v1/operators/amy/disable", "/v1/operators/zed/enable"] {
        let a = app.call("POST", path, Some(&other), None).await;
        assert_eq!((a.status, a.code()), (StatusCode::NOT_FOUND, "not_found"), "{path}: {a:?}");
    }
}

async fn a_new_password_ends_every_session(app: &TestApp) {
    let key = setup(app).await;
    let (_, body) = login_from(app, "198.51.100.7", "amy", PASSWORD).await;
    let token = body["token"].as_str().unwrap_or_default().to_owned();

    for (body, field) in [
        (json!({"password": "short"}), "password"),
        (json!({"password": NEW_PASSWORD, "old": PASSWORD}), "old"),
        (json!({}), "password"),
    ] {
        let a = app.call("PUT", "/v1/operators/amy/password", Some(&key), Some(body.clone())).await;
        assert_eq!((a.status, a.code()), (StatusCode::BAD_REQUEST, "invalid_request"), "{body}: {a:?}");
        assert!(a.body["error"]["message"].as_str().unwrap_or("").contains(field), "{body}: {a:?}");
    }
    assert_eq!(app.get("/v1/stores/s1/attention", &token).await.status, StatusCode::OK, "refusals change nothing");

    let a = app.call("PUT", "/v1/operators/amy/password", Some(&key), Some(json!({"password": NEW_PASSWORD}))).await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    assert!(a.body.get("password").is_none() && !a.body.to_string().contains(NEW_PASSWORD), "{a:?}");
    assert_eq!(app.get("/v1/stores/s1/attention", &token).await.status, StatusCode::UNAUTHORIZED);
    assert_eq!(login_from(app, "198.51.100.7", "amy", PASSWORD).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(login_from(app, "198.51.100.7", "amy", NEW_PASSWORD).await.0, StatusCode::CREATED);
    let events = app.get("/v1/setup-events", &key).await.body["events"].clone();
    assert_eq!(events[0]["detail"]["password"], "replaced", "{events}");
    assert!(!events.to_string().contains(NEW_PASSWORD), "the audit never holds a password");

    let unknown =
        app.call("PUT", "/v1/operators/zed/password", Some(&key), Some(json!({"password": NEW_PASSWORD}))).await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
}
