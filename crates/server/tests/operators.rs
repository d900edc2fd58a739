//! Operators over HTTP, on SQLite and PostgreSQL: accounts made with the tenant
//! key, operator tokens by password (throttled), manual actions audited as the operator,
//! a staff member confined to their stores, and the console's security: every page behind
//! the login, cookie flags, a new session id at login, CSRF refused, expired sessions.

mod common;

use std::time::Duration;

use common::{order, Agent, TestApp};
use onceprint_server::HttpConfig;
use reqwest::StatusCode;
use serde_json::{json, Value};

both_backends!(
    operator_tokens_act_as_their_operator_and_only_in_their_stores,
    wrong_passwords_are_throttled_even_before_the_right_one,
    every_console_page_needs_a_login_except_login_and_assets,
    console_login_sets_strict_cookies_and_a_new_session_every_time,
    console_actions_need_the_csrf_token_and_an_allowed_state,
    staff_of_one_store_cannot_open_another_stores_tickets,
    the_consoles_day_shows_the_device_log_differences,
    every_console_answer_forbids_framing_and_foreign_content,
    a_language_switch_to_an_unusable_path_goes_to_the_start_page,
    an_action_sent_after_the_session_ended_comes_back_to_the_forms_page_undone,
    ticket_search_finds_the_start_of_a_number_and_the_days_text,
    the_consoles_day_counts_the_tickets_still_waiting,
    a_tickets_history_is_told_in_plain_words_in_both_languages,
    a_live_view_ends_when_its_browser_goes_away,
    a_manager_disables_unlocks_and_gives_new_passwords_in_the_console,
    the_console_shows_counts_printer_names_and_first_lines,
    the_tickets_list_filters_by_time_and_type_and_acts_in_bulk,
);

const PASSWORD: &str = "a long enough passphrase";

/// Tenant `acme` with stores s1 (printers p1, p2) and s2 (printer q1), staff `amy` of s1
/// and manager `max`; returns the API key.
async fn setup(app: &TestApp) -> String {
    let key = app.tenant("acme").await;
    let a = app.post("/v1/stores", &key, json!({"id": "s2", "name": "Harbour", "timezone": "Asia/Shanghai"})).await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    let a = app
        .post(
            "/v1/printers",
            &key,
            json!({"id": "q1", "store_id": "s2", "transport": {"kind": "agent", "address": "tcp://192.0.2.20:9100"}}),
        )
        .await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    let amy = json!({"id": "amy", "name": "Amy", "role": "staff", "stores": ["s1"], "password": PASSWORD});
    let a = app.post("/v1/operators", &key, amy).await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    assert_eq!((a.body["role"].as_str(), a.body["stores"][0].as_str()), (Some("staff"), Some("s1")));
    assert!(a.body.get("password").is_none() && a.body.get("password_hash").is_none(), "{a:?}");
    let a = app.post("/v1/operators", &key, json!({"id": "max", "role": "manager", "password": PASSWORD})).await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    key
}

async fn operator_token(app: &TestApp, operator: &str, password: &str) -> common::Answer {
    app.call(
        "POST",
        "/v1/operator-sessions",
        None,
        Some(json!({"tenant_id": "acme", "operator_id": operator, "password": password})),
    )
    .await
}

/// A task of store `store` put in doubt by an agent of that store.
async fn in_doubt(app: &TestApp, key: &str, store: &str, printer: &str, biz: &str) -> String {
    let a = app.call("POST", &format!("/v1/stores/{store}/agent-tokens"), Some(key), None).await;
    let agent =
        Agent { token: a.body["token"].as_str().expect("token").into(), id: format!("a-{store}"), session: "s".into() };
    let body = json!({"biz_no": biz, "printer_id": printer, "content": {"type": "text", "text": "ticket\n"}});
    let id = app.submit(key, body).await.body["task_id"].as_str().expect("id").to_owned();
    let d = agent.poll_until(app, Duration::from_secs(5)).await;
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(agent.ack(app, &id, 1, "in_doubt").await, "applied");
    id
}

async fn operator_tokens_act_as_their_operator_and_only_in_their_stores(app: &TestApp) {
    let key = setup(app).await;
    let t = operator_token(app, "amy", PASSWORD).await;
    assert_eq!(t.status, StatusCode::CREATED, "{t:?}");
    let amy = t.body["token"].as_str().expect("token").to_owned();
    assert!(amy.starts_with("opo_"), "{amy}");
    assert_eq!(t.body["operator"]["id"], "amy");
    let mine = in_doubt(app, &key, "s1", "p1", "D1").await;
    let theirs = in_doubt(app, &key, "s2", "q1", "D2").await;

    // A body naming someone else is refused; naming nobody acts as the token's operator.
    let a = app
        .post(&format!("/v1/print-tasks/{mine}/mark-printed"), &amy, json!({"operator": "bob", "reason": "x"}))
        .await;
    assert_eq!((a.status, a.code()), (StatusCode::FORBIDDEN, "forbidden"), "{a:?}");
    let a = app.post(&format!("/v1/print-tasks/{mine}/mark-printed"), &amy, json!({"reason": "on the pass"})).await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    let ev = app.get(&format!("/v1/print-tasks/{mine}/events"), &amy).await;
    let last = ev.body["events"].as_array().and_then(|e| e.last()).cloned().unwrap_or(Value::Null);
    assert_eq!((last["actor"].as_str(), last["to"].as_str()), (Some("operator:amy"), Some("closed")), "{ev:?}");

    // Store s2 does not exist for amy: its task, its attention list, its day.
    for path in [
        format!("/v1/print-tasks/{theirs}"),
        format!("/v1/print-tasks/{theirs}/events"),
        format!("/v1/print-tasks/{theirs}/preview.png"),
        "/v1/stores/s2/attention".to_owned(),
        "/v1/stores/s2/reconciliation?date=2026-01-01".to_owned(),
        "/v1/print-tasks?store_id=s2".to_owned(),
    ] {
        assert_eq!(app.get(&path, &amy).await.status, StatusCode::NOT_FOUND, "{path}");
    }
    let a = app.post(&format!("/v1/print-tasks/{theirs}/reprint"), &amy, json!({"reason": "x"})).await;
    assert_eq!(a.status, StatusCode::NOT_FOUND, "{a:?}");
    // Her own store's list needs no store_id; she has one store.
    let list = app.get("/v1/print-tasks", &amy).await;
    assert!(list.body["tasks"].as_array().is_some_and(|t| t.iter().all(|t| t["store_id"] == "s1")), "{list:?}");
    // Operators cannot do set-up, nor manage operators.
    assert_eq!(app.get("/v1/operators", &amy).await.status, StatusCode::UNAUTHORIZED);

    // The manager sees both stores.
    let max = operator_token(app, "max", PASSWORD).await.body["token"].as_str().expect("token").to_owned();
    assert_eq!(app.get(&format!("/v1/print-tasks/{theirs}"), &max).await.status, StatusCode::OK);

    // Revoking amy's sessions ends her token at once (audited).
    let r = app.call("DELETE", "/v1/operators/amy/sessions", Some(&key), None).await;
    assert_eq!((r.status, r.body["revoked"].as_u64()), (StatusCode::OK, Some(1)), "{r:?}");
    assert_eq!(app.get(&format!("/v1/print-tasks/{mine}"), &amy).await.status, StatusCode::UNAUTHORIZED);
    let audit = app.get("/v1/setup-events?limit=1", &key).await;
    assert_eq!(
        (audit.body["events"][0]["object_kind"].as_str(), audit.body["events"][0]["action"].as_str()),
        (Some("operator"), Some("revoke")),
        "{audit:?}"
    );
    // Logout of a token.
    let a = app.call("DELETE", "/v1/operator-sessions", Some(&max), None).await;
    assert_eq!(a.status, StatusCode::NO_CONTENT);
    assert_eq!(app.get(&format!("/v1/print-tasks/{theirs}"), &max).await.status, StatusCode::UNAUTHORIZED);

    // Bad accounts are refused with the field named; ids are per tenant.
    let bad = app.post("/v1/operators", &key, json!({"id": "zed", "role": "staff", "password": PASSWORD})).await;
    assert!(bad.body["error"]["message"].as_str().unwrap_or("").contains("stores"), "{bad:?}");
    let bad = app
        .post("/v1/operators", &key, json!({"id": "zed", "role": "staff", "stores": ["s1"], "password": "short"}))
        .await;
    assert!(bad.body["error"]["message"].as_str().unwrap_or("").contains("password"), "{bad:?}");
    let bad = app
        .post("/v1/operators", &key, json!({"id": "zed", "role": "staff", "stores": ["s9"], "password": PASSWORD}))
        .await;
    assert_eq!((bad.status, bad.code()), (StatusCode::NOT_FOUND, "not_found"), "a store that does not exist: {bad:?}");
    let dup = app.post("/v1/operators", &key, json!({"id": "amy", "role": "manager", "password": PASSWORD})).await;
    assert_eq!(dup.code(), "conflict");
}

async fn wrong_passwords_are_throttled_even_before_the_right_one(app: &TestApp) {
    setup(app).await;
    for i in 0..5 {
        let a = operator_token(app, "amy", "wrong password!").await;
        assert_eq!((a.status, a.code()), (StatusCode::UNAUTHORIZED, "unauthorized"), "attempt {i}: {a:?}");
    }
    // The same answer for an operator who does not exist: ids cannot be probed.
    let a = operator_token(app, "nobody", PASSWORD).await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    let res = app
        .http
        .post(format!("{}/v1/operator-sessions", app.base))
        .json(&json!({"tenant_id": "acme", "operator_id": "amy", "password": PASSWORD}))
        .send()
        .await
        .expect("login");
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 =
        res.headers().get("retry-after").and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok()).unwrap_or(0);
    assert!((1..=900).contains(&retry), "Retry-After {retry}");
    // Another operator is not locked out by amy's attacker.
    assert_eq!(operator_token(app, "max", PASSWORD).await.status, StatusCode::CREATED);
}

/// A browser without cookies handling of its own: cookies are kept by hand, redirects not
/// followed.
struct Browser {
    http: reqwest::Client,
    base: String,
    cookies: Vec<(String, String)>,
}

struct Page {
    status: StatusCode,
    location: String,
    set_cookies: Vec<String>,
    headers: reqwest::header::HeaderMap,
    body: String,
}

impl Page {
    fn header(&self, name: &str) -> &str {
        self.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
    }
}

impl Browser {
    fn new(app: &TestApp) -> Browser {
        let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("client");
        Browser { http, base: app.base.clone(), cookies: Vec::new() }
    }

    fn cookie_header(&self) -> String {
        self.cookies.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("; ")
    }

    fn cookie(&self, name: &str) -> Option<String> {
        self.cookies.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    async fn send(&mut self, req: reqwest::RequestBuilder) -> Page {
        let res = req.header("cookie", self.cookie_header()).send().await.expect("request");
        let status = res.status();
        let location = res.headers().get("location").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
        let set_cookies: Vec<String> =
            res.headers().get_all("set-cookie").iter().filter_map(|v| v.to_str().ok()).map(str::to_owned).collect();
        for c in &set_cookies {
            let first = c.split(';').next().unwrap_or("");
            if let Some((k, v)) = first.split_once('=') {
                self.cookies.retain(|(n, _)| n != k);
                if !v.is_empty() && !c.contains("Max-Age=0") {
                    self.cookies.push((k.to_owned(), v.to_owned()));
                }
            }
        }
        let headers = res.headers().clone();
        Page { status, location, set_cookies, headers, body: res.text().await.unwrap_or_default() }
    }

    async fn get(&mut self, path: &str) -> Page {
        let req = self.http.get(format!("{}{path}", self.base));
        self.send(req).await
    }

    async fn post(&mut self, path: &str, form: &[(&str, &str)]) -> Page {
        let req = self.http.post(format!("{}{path}", self.base)).form(form);
        self.send(req).await
    }

    /// Logs in through the form, as a person does.
    async fn login(&mut self, operator: &str, password: &str) -> Page {
        let page = self.get("/console/login").await;
        let csrf = hidden(&page.body, "csrf");
        self.post(
            "/console/login",
            &[
                ("csrf", &csrf),
                ("next", "/console/"),
                ("tenant", "acme"),
                ("operator", operator),
                ("password", password),
            ],
        )
        .await
    }
}

/// The value of the hidden input `name` in a page.
fn hidden(body: &str, name: &str) -> String {
    let needle = format!("name=\"{name}\" value=\"");
    body.find(&needle)
        .map(|i| &body[i + needle.len()..])
        .and_then(|rest| rest.split('"').next())
        .unwrap_or("")
        .to_owned()
}

async fn every_console_page_needs_a_login_except_login_and_assets(app: &TestApp) {
    setup(app).await;
    let mut b = Browser::new(app);
    for (method, path, public) in onceprint_server::console::ROUTES {
        let page = match *method {
            "GET" => b.get(path).await,
            _ => b.post(path, &[("csrf", "x")]).await,
        };
        if *public {
            assert!(
                page.status.is_success() || page.status == StatusCode::SEE_OTHER,
                "{method} {path}: {}",
                page.status
            );
            assert!(!page.location.starts_with("/console/login?next"), "{method} {path} is public");
        } else {
            assert_eq!(page.status, StatusCode::SEE_OTHER, "{method} {path} without a login");
            assert!(page.location.starts_with("/console/login?next="), "{method} {path} -> {}", page.location);
        }
    }
    // A made-up session cookie is no login either.
    b.cookies.push(("op_session".into(), "ops_forged".into()));
    let page = b.get("/console/stores/s1/").await;
    assert!(page.location.starts_with("/console/login"), "{}", page.location);
    // The assets are what the binary carries: no CDN, no other origin.
    let css = b.get("/console/assets/console.css").await;
    let js = b.get("/console/assets/console.js").await;
    let login = b.get("/console/login").await;
    for text in [&css.body, &js.body, &login.body] {
        assert!(!text.contains("http://") && !text.contains("https://"), "no external references");
    }
}

async fn console_login_sets_strict_cookies_and_a_new_session_every_time(app: &TestApp) {
    setup(app).await;
    let mut b = Browser::new(app);
    // A login form sent without its token (another site's form) is refused.
    let page = b.post("/console/login", &[("tenant", "acme"), ("operator", "amy"), ("password", PASSWORD)]).await;
    assert_eq!(page.status, StatusCode::FORBIDDEN);
    assert!(b.cookie("op_session").is_none());

    // A session id planted before the login is not adopted.
    b.cookies.push(("op_session".into(), "ops_planted_by_an_attacker".into()));
    let page = b.login("amy", PASSWORD).await;
    assert_eq!((page.status, page.location.as_str()), (StatusCode::SEE_OTHER, "/console/"));
    let set = page.set_cookies.iter().find(|c| c.starts_with("op_session=")).cloned().expect("session cookie");
    for flag in ["HttpOnly", "SameSite=Strict", "Path=/console"] {
        assert!(set.contains(flag), "{flag} in {set}");
    }
    assert!(!set.contains("Secure"), "plain HTTP: no Secure flag ({set})");
    let first = b.cookie("op_session").expect("session");
    assert_ne!(first, "ops_planted_by_an_attacker");
    assert!(b.get("/console/stores/s1/").await.status.is_success());

    // Logging in again (same browser) gives a new session and ends the old one.
    let again = b.login("amy", PASSWORD).await;
    assert_eq!(again.status, StatusCode::SEE_OTHER);
    let second = b.cookie("op_session").expect("session");
    assert_ne!(first, second, "a new session id at every login");
    let mut stale = Browser::new(app);
    stale.cookies.push(("op_session".into(), first));
    assert_eq!(stale.get("/console/stores/s1/").await.status, StatusCode::SEE_OTHER, "the old session is over");

    // Behind a TLS proxy the cookie is Secure.
    let mut tls = Browser::new(app);
    let form = tls.get("/console/login").await;
    let csrf = hidden(&form.body, "csrf");
    let req = tls.http.post(format!("{}/console/login", tls.base)).header("x-forwarded-proto", "https").form(&[
        ("csrf", csrf.as_str()),
        ("next", "/console/"),
        ("tenant", "acme"),
        ("operator", "amy"),
        ("password", PASSWORD),
    ]);
    let page = tls.send(req).await;
    let set = page.set_cookies.iter().find(|c| c.starts_with("op_session=")).cloned().expect("session cookie");
    assert!(set.contains("Secure"), "{set}");

    // Logout ends the session.
    let csrf = hidden(&b.get("/console/stores/s1/").await.body, "csrf");
    let out = b.post("/console/logout", &[("csrf", &csrf)]).await;
    assert_eq!(out.location, "/console/login");
    assert_eq!(b.get("/console/stores/s1/").await.status, StatusCode::SEE_OTHER);

    // Wrong passwords in the console are throttled like the API's.
    let mut guesser = Browser::new(app);
    for _ in 0..5 {
        assert_eq!(guesser.login("max", "not the password").await.status, StatusCode::UNAUTHORIZED);
    }
    let page = guesser.login("max", PASSWORD).await;
    assert_eq!(page.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(guesser.cookie("op_session").is_none());
    // The wait is said in minutes (15 by default), not in hundreds of seconds.
    assert!(page.body.contains("try again in 15 min."), "{}", page.body);
}

async fn console_actions_need_the_csrf_token_and_an_allowed_state(app: &TestApp) {
    let key = setup(app).await;
    let id = in_doubt(app, &key, "s1", "p1", "C1").await;
    let pending = app.submit(&key, order("P1", "waiting\n")).await.body["task_id"].as_str().expect("id").to_owned();
    let mut b = Browser::new(app);
    b.login("amy", PASSWORD).await;
    let page = b.get(&format!("/console/stores/s1/tickets/{id}")).await;
    assert!(page.status.is_success());
    let csrf = hidden(&page.body, "csrf");
    assert!(!csrf.is_empty());
    let path = format!("/console/stores/s1/tickets/{id}/mark-printed");
    // Without the token, or with another session's, nothing happens.
    let refused = b.post(&path, &[("reason", "seen it")]).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert!(refused.body.contains("csrf"));
    let refused = b.post(&path, &[("reason", "seen it"), ("csrf", "csrf_from_somewhere_else")]).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert_eq!(app.get(&format!("/v1/print-tasks/{id}"), &key).await.body["state"], "in_doubt");
    // An in-doubt ticket offers mark printed, reprint and cancel, never transfer.
    for offered in ["mark-printed", "reprint", "cancel"] {
        assert!(page.body.contains(&format!("data-action=\"{offered}\"")), "{offered} offered");
    }
    assert!(!page.body.contains("data-action=\"transfer\""), "transfer is not offered in doubt");
    // A transfer forced anyway is refused by the server.
    let forced = b
        .post(
            &format!("/console/stores/s1/tickets/{id}/transfer"),
            &[("csrf", &csrf), ("reason", "x"), ("printer_id", "p2")],
        )
        .await;
    assert_eq!(forced.status, StatusCode::CONFLICT, "{}", forced.body);
    assert!(forced.body.contains("invalid_transition"));
    // A pending ticket offers no mark printed, and forcing it is refused.
    let p = b.get(&format!("/console/stores/s1/tickets/{pending}")).await;
    assert!(!p.body.contains("data-action=\"mark-printed\""));
    let forced = b
        .post(&format!("/console/stores/s1/tickets/{pending}/mark-printed"), &[("csrf", &csrf), ("reason", "x")])
        .await;
    assert_eq!(forced.status, StatusCode::CONFLICT);
    // A reason is required.
    let no_reason = b.post(&path, &[("csrf", &csrf), ("reason", " ")]).await;
    assert_eq!(no_reason.status, StatusCode::BAD_REQUEST);
    // With the token and a reason: done, and audited as the operator who is logged in.
    let done = b
        .post(&path, &[("csrf", &csrf), ("reason", "seen it on the pass"), ("back", "/console/stores/s1/attention")])
        .await;
    assert_eq!((done.status, done.location.as_str()), (StatusCode::SEE_OTHER, "/console/stores/s1/attention"));
    let ev = app.get(&format!("/v1/print-tasks/{id}/events"), &key).await;
    let last = ev.body["events"].as_array().and_then(|e| e.last()).cloned().unwrap_or(Value::Null);
    assert_eq!(last["actor"], "operator:amy");
    assert!(last["reason"].as_str().unwrap_or("").contains("seen it on the pass"));
    let att = b.get("/console/stores/s1/attention").await;
    assert!(!att.body.contains(&format!("data-task=\"{id}\"")), "it left the attention list");
}

async fn staff_of_one_store_cannot_open_another_stores_tickets(app: &TestApp) {
    let key = setup(app).await;
    let theirs = in_doubt(app, &key, "s2", "q1", "H1").await;
    let mut b = Browser::new(app);
    b.login("amy", PASSWORD).await;
    for path in [
        "/console/stores/s2/".to_owned(),
        "/console/stores/s2/attention".to_owned(),
        format!("/console/stores/s2/tickets/{theirs}"),
        format!("/console/stores/s2/tickets/{theirs}/preview.png"),
        format!("/console/stores/s1/tickets/{theirs}"),
        "/console/stores/s2/reconciliation".to_owned(),
        "/console/stores/s2/live".to_owned(),
        "/console/operators".to_owned(),
    ] {
        let page = b.get(&path).await;
        let expected = if path.ends_with("operators") { StatusCode::FORBIDDEN } else { StatusCode::NOT_FOUND };
        assert_eq!(page.status, expected, "{path}");
    }
    let csrf = hidden(&b.get("/console/stores/s1/").await.body, "csrf");
    let forced =
        b.post(&format!("/console/stores/s2/tickets/{theirs}/cancel"), &[("csrf", &csrf), ("reason", "x")]).await;
    assert_eq!(forced.status, StatusCode::NOT_FOUND);
    assert_eq!(app.get(&format!("/v1/print-tasks/{theirs}"), &key).await.body["state"], "in_doubt");
    // One store only: the console opens it straight away.
    assert_eq!(b.get("/console/").await.location, "/console/stores/s1/");
    // The manager sees both, and can create staff in the console.
    let mut m = Browser::new(app);
    m.login("max", PASSWORD).await;
    assert!(m.get(&format!("/console/stores/s2/tickets/{theirs}")).await.status.is_success());
    let page = m.get("/console/operators").await;
    let csrf = hidden(&page.body, "csrf");
    let made = m
        .post(
            "/console/operators",
            &[("csrf", &csrf), ("id", "sue"), ("role", "staff"), ("store", "s2"), ("password", PASSWORD)],
        )
        .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    let list = app.get("/v1/operators", &key).await;
    let sue = list.body["operators"].as_array().and_then(|l| l.iter().find(|o| o["id"] == "sue")).cloned();
    assert_eq!(sue.map(|s| s["stores"].clone()), Some(json!(["s2"])));
    // A staff member cannot, even with a forged form.
    let csrf = hidden(&b.get("/console/stores/s1/").await.body, "csrf");
    let refused = b
        .post("/console/operators", &[("csrf", &csrf), ("id", "eve"), ("role", "manager"), ("password", PASSWORD)])
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
}

/// A console session that expired sends the browser back to the login page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_console_session_goes_back_to_login() {
    let mut config = HttpConfig::default();
    config.operators.session_ttl_ms = 1_500;
    let Some(app) = TestApp::spawn_with(common::Backend::Sqlite, config).await else { return };
    setup(&app).await;
    let mut b = Browser::new(&app);
    b.login("amy", PASSWORD).await;
    assert!(b.get("/console/stores/s1/").await.status.is_success());
    tokio::time::sleep(Duration::from_millis(1_700)).await;
    let page = b.get("/console/stores/s1/attention").await;
    assert_eq!(page.status, StatusCode::SEE_OTHER);
    assert!(page.location.starts_with("/console/login?next=%2Fconsole%2Fstores%2Fs1%2Fattention"), "{}", page.location);
    assert!(page.location.ends_with("&expired=1"));
    let login = b.get(&page.location).await;
    assert!(login.body.contains("session ended"), "the login page says why");
    app.stop().await;
}

/// The console's reconciliation page lists the device log's differences, and
/// says when the day has no device log at all.
async fn the_consoles_day_shows_the_device_log_differences(app: &TestApp) {
    let key = setup(app).await;
    let agent = Agent::new(app, &key, "a1", "s").await;
    let made = app.submit(&key, order("D1", "D1")).await;
    let task = made.body["task_id"].as_str().expect("task").to_owned();
    let d = agent.poll_until(app, Duration::from_secs(5)).await;
    assert_eq!(agent.ack(app, &task, d[0]["attempt"].as_i64().unwrap_or(1), "printed").await, "applied");

    let mut b = Browser::new(app);
    b.login("amy", PASSWORD).await;
    let page = b.get("/console/stores/s1/reconciliation").await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains("uploaded no device log for this day"), "{}", page.body);

    // The device log names another task of the day, which the broker never printed.
    let lan = format!("{}{}", &task[..25], if task.ends_with('0') { '1' } else { '0' });
    let up = app
        .post(
            "/v1/agent/journal-digest",
            &agent.token,
            json!({"agent_id": "a1", "records": [
                {"task_id": lan, "key": "L1#p1", "printer_id": "p1", "state": "printed", "at": 1}]}),
        )
        .await;
    assert_eq!(up.status, StatusCode::OK, "{up:?}");
    let page = b.get("/console/stores/s1/reconciliation").await;
    assert!(!page.body.contains("uploaded no device log"), "{}", page.body);
    for text in [
        "Printed by the device, not by the broker&#39;s account",
        "Printed by the broker&#39;s account, not in the device log",
        &lan,
        &task,
        "L1#p1",
        "D1#p1",
    ] {
        assert!(page.body.contains(text), "{text} in {}", page.body);
    }
}

/// The console offers what `core::manual` allows for the ticket, not only for its state: a
/// ticket waiting to be printed again after an attempt that may have printed (the print
/// type reprints on doubt) offers no transfer, one whose attempt printed nothing does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_offers_no_transfer_of_a_ticket_that_may_have_printed_sqlite() {
    no_transfer_offered(common::Backend::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_offers_no_transfer_of_a_ticket_that_may_have_printed_postgres() {
    no_transfer_offered(common::Backend::Postgres).await
}

async fn no_transfer_offered(backend: common::Backend) {
    let mut config = HttpConfig::default();
    for p in config.intake.policies.types.values_mut() {
        p.reprint_on_doubt = true;
        p.backoff.initial_ms = 600_000;
    }
    let Some(app) = TestApp::spawn_with(backend, config).await else { return };
    let key = setup(&app).await;
    let doubtful = in_doubt(&app, &key, "s1", "p1", "D1").await;
    assert_eq!(app.get(&format!("/v1/print-tasks/{doubtful}"), &key).await.body["state"], "retrying");
    let a = app.call("POST", "/v1/stores/s1/agent-tokens", Some(&key), None).await;
    let agent = Agent { token: a.body["token"].as_str().expect("token").into(), id: "a2".into(), session: "s".into() };
    let body = json!({"biz_no": "N1", "printer_id": "p2", "content": {"type": "text", "text": "ticket\n"}});
    let clean = app.submit(&key, body).await.body["task_id"].as_str().expect("id").to_owned();
    assert_eq!(agent.poll_until(&app, Duration::from_secs(5)).await.len(), 1);
    assert_eq!(agent.ack(&app, &clean, 1, "no_paper").await, "applied");
    let mut b = Browser::new(&app);
    b.login("amy", PASSWORD).await;
    let page = b.get(&format!("/console/stores/s1/tickets/{doubtful}")).await;
    assert!(page.status.is_success());
    assert!(page.body.contains("data-action=\"cancel\""), "cancel is offered");
    assert!(!page.body.contains("data-action=\"transfer\""), "no transfer of what may have printed");
    let page = b.get(&format!("/console/stores/s1/tickets/{clean}")).await;
    assert!(page.body.contains("data-action=\"transfer\""), "nothing printed: it may move");
    app.stop().await;
}

/// Every console answer — page, error page, redirect, login page, asset — forbids being
/// framed by another site and loading anything but the console's own files.
async fn every_console_answer_forbids_framing_and_foreign_content(app: &TestApp) {
    let key = setup(app).await;
    let id = in_doubt(app, &key, "s1", "p1", "F1").await;
    let mut b = Browser::new(app);
    let mut answers = vec![
        ("login page", b.get("/console/login").await),
        ("redirect to the login", b.get("/console/stores/s1/").await),
        ("stylesheet", b.get("/console/assets/console.css").await),
        ("script", b.get("/console/assets/console.js").await),
    ];
    b.login("amy", PASSWORD).await;
    answers.push(("printers", b.get("/console/stores/s1/").await));
    answers.push(("ticket", b.get(&format!("/console/stores/s1/tickets/{id}")).await));
    answers.push(("error page", b.get("/console/stores/s2/").await));
    answers.push(("unknown page", b.get("/console/nothing/here").await));
    let by_get = b.get(&format!("/console/stores/s1/tickets/{id}/cancel")).await;
    assert_eq!(
        (by_get.status, by_get.location.clone()),
        (StatusCode::SEE_OTHER, format!("/console/stores/s1/tickets/{id}"))
    );
    answers.push(("action by GET", by_get));
    for (what, page) in &answers {
        let csp = page.header("content-security-policy");
        for directive in ["default-src 'self'", "frame-ancestors 'none'", "script-src 'self'", "style-src 'self'"] {
            assert!(csp.contains(directive), "{what}: {directive} in {csp:?}");
        }
        assert!(!csp.contains("unsafe-inline"), "{what}: {csp}");
        assert_eq!(page.header("x-frame-options"), "DENY", "{what}");
    }
    // Nothing inline for the policy to refuse: no script element with a body, no style
    // attribute, no event handler attribute.
    for (what, page) in &answers {
        let body = page.body.to_ascii_lowercase();
        for inline in ["<script>", " style=", " onclick=", " onload=", "<style", "javascript:"] {
            assert!(!body.contains(inline), "{what} has inline {inline}");
        }
    }
}

/// The language switch comes back only to console paths made of URL characters; any other
/// target (a decoded control character here) goes to the start page, always with a
/// `Location`.
async fn a_language_switch_to_an_unusable_path_goes_to_the_start_page(app: &TestApp) {
    setup(app).await;
    let mut b = Browser::new(app);
    for next in
        ["/console/%7f", "/console/%0d%0aSet-Cookie:%20x=y", "/console/%E4%B8%AD", "https://evil.example/", "//evil"]
    {
        let page = b.get(&format!("/console/lang?to=zh&next={next}")).await;
        assert_eq!((page.status, page.location.as_str()), (StatusCode::SEE_OTHER, "/console/"), "next={next}");
        assert!(!page.set_cookies.iter().any(|c| c.starts_with("x=")), "no header injection");
    }
    let page = b.get("/console/lang?to=zh&next=%2Fconsole%2Fstores%2Fs1%2Ftickets%3Fq%3DA1").await;
    assert_eq!(page.location, "/console/stores/s1/tickets?q=A1");
    let page = b.get("/console/lang?to=en&next=%2Fconsole%2Flogin%3Fnext%3D%252Fconsole%252F").await;
    assert_eq!(page.location, "/console/login?next=%2Fconsole%2F");
}

/// An action whose session ended before it arrived (here revoked) is not done, and the
/// login afterwards lands on the page the form was on — never on the action's URL, which
/// takes only POST — and says so.
async fn an_action_sent_after_the_session_ended_comes_back_to_the_forms_page_undone(app: &TestApp) {
    let key = setup(app).await;
    let id = in_doubt(app, &key, "s1", "p1", "U1").await;
    let mut b = Browser::new(app);
    b.login("amy", PASSWORD).await;
    let csrf = hidden(&b.get("/console/stores/s1/attention").await.body, "csrf");
    let r = app.call("DELETE", "/v1/operators/amy/sessions", Some(&key), None).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let action = format!("/console/stores/s1/tickets/{id}/mark-printed");
    let page =
        b.post(&action, &[("csrf", &csrf), ("reason", "on the pass"), ("back", "/console/stores/s1/attention")]).await;
    assert_eq!(page.status, StatusCode::SEE_OTHER);
    assert_eq!(page.location, "/console/login?next=%2Fconsole%2Fstores%2Fs1%2Fattention&expired=1&undone=1");
    assert_eq!(app.get(&format!("/v1/print-tasks/{id}"), &key).await.body["state"], "in_doubt", "not done");
    let login = b.get(&page.location).await;
    assert!(login.body.contains("it was NOT done"), "{}", login.body);
    assert_eq!(hidden(&login.body, "next"), "/console/stores/s1/attention");
    let csrf = hidden(&login.body, "csrf");
    let done = b
        .post(
            "/console/login",
            &[
                ("csrf", &csrf),
                ("next", "/console/stores/s1/attention"),
                ("tenant", "acme"),
                ("operator", "amy"),
                ("password", PASSWORD),
            ],
        )
        .await;
    assert_eq!((done.status, done.location.as_str()), (StatusCode::SEE_OTHER, "/console/stores/s1/attention"));
    assert_eq!(b.get(&done.location).await.status, StatusCode::OK);

    // A form without a `back` field: the page it was sent from (`Referer`), if it is a
    // console page of this host; another site's page counts for nothing.
    app.call("DELETE", "/v1/operators/amy/sessions", Some(&key), None).await;
    let (http, base) = (b.http.clone(), b.base.clone());
    let from = |referer: String| {
        http.post(format!("{base}{action}")).header("referer", referer).form(&[("csrf", "x"), ("reason", "y")])
    };
    let req = from(format!("{base}/console/stores/s1/tickets/{id}"));
    let page = b.send(req).await;
    assert_eq!(
        page.location,
        format!("/console/login?next=%2Fconsole%2Fstores%2Fs1%2Ftickets%2F{id}&expired=1&undone=1")
    );
    let page = b.send(from("https://evil.example/console/stores/s1/".into())).await;
    assert_eq!(page.location, "/console/login?next=%2Fconsole%2F&expired=1&undone=1");
    // Logging out of the ended session is not an action left undone.
    let page = b.post("/console/logout", &[("csrf", "x")]).await;
    assert_eq!(page.location, "/console/login?next=%2Fconsole%2F&expired=1");
    assert_eq!(app.get(&format!("/v1/print-tasks/{id}"), &key).await.body["state"], "in_doubt", "not done");
}

/// Search finds a ticket by the start of its business number across the store, and by
/// any part of its number or text within the day.
async fn ticket_search_finds_the_start_of_a_number_and_the_days_text(app: &TestApp) {
    let key = setup(app).await;
    let mut ids = std::collections::HashMap::new();
    for (biz, text) in [("A1003", "Table 4\n"), ("A1003#kitchen", "Table 4\nBeef noodles\n"), ("B77", "Table 12\n")] {
        let made = app.submit(&key, order(biz, text)).await;
        ids.insert(biz, made.body["task_id"].as_str().expect("id").to_owned());
    }
    let mut b = Browser::new(app);
    b.login("amy", PASSWORD).await;
    let found = |body: &str| {
        let mut f: Vec<&str> =
            ids.iter().filter(|(_, id)| body.contains(&format!("data-task=\"{id}\""))).map(|(b, _)| *b).collect();
        f.sort();
        f
    };
    for (q, expected) in [
        ("A1003", vec!["A1003", "A1003#kitchen"]),
        ("A100", vec!["A1003", "A1003#kitchen"]),
        ("kitchen", vec!["A1003#kitchen"]),
        ("noodles", vec!["A1003#kitchen"]),
        ("table+12", vec!["B77"]),
        ("Z9", vec![]),
    ] {
        let page = b.get(&format!("/console/stores/s1/tickets?q={q}")).await;
        assert_eq!(page.status, StatusCode::OK);
        assert_eq!(found(&page.body), expected, "q={q}");
    }
    // Within a day asked for, and the state filter still applies.
    let today = b.get("/console/stores/s1/reconciliation").await;
    let date = hidden_value(&today.body, "date");
    let page = b.get(&format!("/console/stores/s1/tickets?q=1003&day={date}")).await;
    assert_eq!(found(&page.body), vec!["A1003", "A1003#kitchen"], "{date}");
    let page = b.get("/console/stores/s1/tickets?q=A1003&state=printed").await;
    assert_eq!(found(&page.body), Vec::<&str>::new());
}

/// The value of the input whose `name` is given, whatever comes between.
fn hidden_value(body: &str, name: &str) -> String {
    let needle = format!("name=\"{name}\"");
    body.find(&needle)
        .map(|i| &body[i..])
        .and_then(|rest| rest.split("value=\"").nth(1))
        .and_then(|rest| rest.split('"').next())
        .unwrap_or("")
        .to_owned()
}

/// The day's page counts the tickets still waiting, so that its counts add up to the
/// tickets submitted, as the API's and the CSV's do.
async fn the_consoles_day_counts_the_tickets_still_waiting(app: &TestApp) {
    let key = setup(app).await;
    in_doubt(app, &key, "s1", "p1", "W1").await;
    for biz in ["W2", "W3"] {
        app.submit(&key, order(biz, "waiting\n")).await;
    }
    let mut b = Browser::new(app);
    b.login("amy", PASSWORD).await;
    let page = b.get("/console/stores/s1/reconciliation").await;
    let count = |state: &str| -> u64 {
        let needle = format!("data-count=\"{state}\">");
        page.body
            .find(&needle)
            .and_then(|i| page.body[i + needle.len()..].split('<').next().and_then(|n| n.parse().ok()))
            .unwrap_or_else(|| panic!("no count {state} in {}", page.body))
    };
    assert_eq!((count("submitted"), count("open"), count("in_doubt")), (3, 2, 1));
    let parts: u64 =
        ["printed", "failed", "in_doubt", "transferred", "cancelled", "closed", "open"].into_iter().map(count).sum();
    assert_eq!(parts, count("submitted"), "the counts add up");
    assert!(page.body.contains("still waiting"));
}

/// A ticket's history says what happened in plain words of the page's language — never
/// the engine's protocol wording — and times on Chinese pages are in Chinese units.
async fn a_tickets_history_is_told_in_plain_words_in_both_languages(app: &TestApp) {
    let key = setup(app).await;
    let id = in_doubt(app, &key, "s1", "p1", "H7").await;
    let mut b = Browser::new(app);
    b.login("amy", PASSWORD).await;
    let csrf = hidden(&b.get("/console/stores/s1/attention").await.body, "csrf");
    let path = format!("/console/stores/s1/tickets/{id}");
    let done = b.post(&format!("{path}/mark-printed"), &[("csrf", &csrf), ("reason", "on the pass")]).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    let en = b.get(&path).await;
    let zh = {
        b.cookies.push(("op_lang".into(), "zh".into()));
        b.get(&path).await
    };
    let timeline = |page: &Page| -> String {
        let body = &page.body;
        let start = body.find("id=\"timeline\"").expect("timeline");
        body[start..].split("</ol>").next().unwrap_or("").to_owned()
    };
    let (en_t, zh_t) = (timeline(&en), timeline(&zh));
    for line in [
        "Received from the order system",
        "Sent to the shop&#39;s print agent",
        "No confirmation came: it may or may not have printed",
        "Marked as printed by hand",
        "by amy",
        "on the pass",
    ] {
        assert!(en_t.contains(line), "{line} in {en_t}");
    }
    for line in ["已收到点单系统的打印请求", "已发送到门店的打印代理", "未收到确认", "已手动标记为已打印", "操作员 amy"]
    {
        assert!(zh_t.contains(line), "{line} in {zh_t}");
    }
    for jargon in ["dispatched", "agent:", "operator:", "engine", "GS ( H", "mark-printed:", "attempt"] {
        assert!(!en_t.contains(jargon) && !zh_t.contains(jargon), "{jargon} in {en_t} / {zh_t}");
    }
    // Ages on Chinese pages are in Chinese units.
    in_doubt(app, &key, "s1", "p2", "H8").await;
    let att = b.get("/console/stores/s1/attention").await;
    assert!(att.body.contains(" 秒") || att.body.contains(" 分钟"), "{}", att.body);
    assert!(!att.body.contains(" s<") && !att.body.contains(" min<"), "{}", att.body);
}

/// A live view's stream ends on the server when its browser goes away, so that a page
/// closed, left, or kept in the back/forward cache holds nothing on the broker.
async fn a_live_view_ends_when_its_browser_goes_away(app: &TestApp) {
    setup(app).await;
    let mut b = Browser::new(app);
    b.login("amy", PASSWORD).await;
    let open_streams = || async {
        let text = app.http.get(format!("{}/metrics", app.base)).send().await.expect("metrics").text().await;
        text.unwrap_or_default()
            .lines()
            .find(|l| l.starts_with("onceprint_console_live_streams "))
            .and_then(|l| l.split_whitespace().nth(1).and_then(|n| n.parse::<i64>().ok()))
            .expect("the live streams gauge")
    };
    assert_eq!(open_streams().await, 0);
    let mut res = b
        .http
        .get(format!("{}/console/stores/s1/live", b.base))
        .header("cookie", b.cookie_header())
        .send()
        .await
        .expect("live");
    assert_eq!(res.status(), StatusCode::OK);
    let first = res.chunk().await.expect("chunk").unwrap_or_default();
    assert!(String::from_utf8_lossy(&first).contains("hello"), "{first:?}");
    assert_eq!(open_streams().await, 1);
    drop(res);
    let start = std::time::Instant::now();
    while open_streams().await != 0 {
        assert!(start.elapsed() < Duration::from_secs(20), "the stream outlived its browser");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The card of operator `id` on the operators page.
fn card<'a>(body: &'a str, id: &str) -> &'a str {
    let start = body.find(&format!("data-operator=\"{id}\"")).unwrap_or(body.len());
    let rest = &body[start..];
    &rest[..rest.find("</li>").unwrap_or(rest.len())]
}

async fn a_manager_disables_unlocks_and_gives_new_passwords_in_the_console(app: &TestApp) {
    setup(app).await;
    let mut max = Browser::new(app);
    assert_eq!(max.login("max", PASSWORD).await.status, StatusCode::SEE_OTHER);
    let mut amy = Browser::new(app);
    assert_eq!(amy.login("amy", PASSWORD).await.status, StatusCode::SEE_OTHER);
    let page = max.get("/console/operators").await;
    assert_eq!(page.status, StatusCode::OK);
    let csrf = hidden(&page.body, "csrf");
    // Every account action for amy; a manager cannot disable their own login.
    for action in ["sign-out", "disable", "password"] {
        assert!(card(&page.body, "amy").contains(&format!("/console/operators/amy/{action}")), "{action}");
    }
    assert!(!card(&page.body, "max").contains("/console/operators/max/disable"), "{}", card(&page.body, "max"));
    let own = max.post("/console/operators/max/disable", &[("csrf", &csrf)]).await;
    assert_eq!(own.status, StatusCode::FORBIDDEN);

    // Without the form's token nothing happens; a staff member may not do it at all.
    assert_eq!(max.post("/console/operators/amy/disable", &[]).await.status, StatusCode::FORBIDDEN);
    let amy_csrf = hidden(&amy.get("/console/stores/s1/").await.body, "csrf");
    let staff = amy.post("/console/operators/max/disable", &[("csrf", &amy_csrf)]).await;
    assert_eq!(staff.status, StatusCode::FORBIDDEN);
    assert_eq!(max.get("/console/").await.status, StatusCode::OK, "max's session lives on");

    // Disabled: amy's session ends, her login is refused in words, the page says so.
    let done = max.post("/console/operators/amy/disable", &[("csrf", &csrf)]).await;
    assert_eq!((done.status, done.location.as_str()), (StatusCode::SEE_OTHER, "/console/operators?done=disable"));
    assert_eq!(amy.get("/console/stores/s1/").await.status, StatusCode::SEE_OTHER, "her session is over");
    let refused = amy.login("amy", PASSWORD).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert!(refused.body.contains("This login is disabled"), "{}", refused.body);
    let page = max.get("/console/operators?done=disable").await;
    assert!(page.body.contains("Login disabled; every session has ended."), "{}", page.body);
    assert!(card(&page.body, "amy").contains("data-state=\"disabled\""), "{}", card(&page.body, "amy"));
    assert!(!max.get("/console/operators?done=%3Cscript%3E").await.body.contains("<script>"), "only known notes");
    let done = max.post("/console/operators/amy/enable", &[("csrf", &csrf)]).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER);

    // Locked out by failed logins: shown with the wait, lifted by the manager.
    let mut guesser = Browser::new(app);
    for _ in 0..5 {
        assert_eq!(guesser.login("amy", "not her password").await.status, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(guesser.login("amy", PASSWORD).await.status, StatusCode::TOO_MANY_REQUESTS);
    let page = max.get("/console/operators").await;
    let amy_card = card(&page.body, "amy");
    assert!(amy_card.contains("data-state=\"locked\"") && amy_card.contains("15 min"), "{amy_card}");
    let done = max.post("/console/operators/amy/unlock", &[("csrf", &csrf)]).await;
    assert_eq!(done.location, "/console/operators?done=unlock");
    assert!(!card(&max.get("/console/operators").await.body, "amy").contains("data-state=\"locked\""));
    assert_eq!(guesser.login("amy", PASSWORD).await.status, StatusCode::SEE_OTHER);

    // A new password: too short is refused in words; a good one ends her sessions.
    let short = max.post("/console/operators/amy/password", &[("csrf", &csrf), ("password", "short")]).await;
    assert_eq!(short.status, StatusCode::BAD_REQUEST);
    assert!(short.body.contains("password"), "{}", short.body);
    assert_eq!(guesser.get("/console/stores/s1/").await.status, StatusCode::OK);
    let new = "a brand new passphrase";
    let done = max.post("/console/operators/amy/password", &[("csrf", &csrf), ("password", new)]).await;
    assert_eq!(done.location, "/console/operators?done=password");
    assert_eq!(guesser.get("/console/stores/s1/").await.status, StatusCode::SEE_OTHER);
    assert_eq!(amy.login("amy", PASSWORD).await.status, StatusCode::UNAUTHORIZED);
    assert_eq!(amy.login("amy", new).await.status, StatusCode::SEE_OTHER);

    // Signed out everywhere, and an unknown action or operator is not found.
    let done = max.post("/console/operators/amy/sign-out", &[("csrf", &csrf)]).await;
    assert_eq!(done.location, "/console/operators?done=sign-out");
    assert_eq!(amy.get("/console/stores/s1/").await.status, StatusCode::SEE_OTHER);
    assert_eq!(max.post("/console/operators/amy/delete", &[("csrf", &csrf)]).await.status, StatusCode::NOT_FOUND);
    assert_eq!(max.post("/console/operators/zed/disable", &[("csrf", &csrf)]).await.status, StatusCode::NOT_FOUND);
    // A GET of an action's address shows the page.
    let get = max.get("/console/operators/amy/disable").await;
    assert_eq!((get.status, get.location.as_str()), (StatusCode::SEE_OTHER, "/console/operators"));
}

async fn the_console_shows_counts_printer_names_and_first_lines(app: &TestApp) {
    let key = setup(app).await;
    let id = in_doubt(app, &key, "s1", "p1", "C1").await;
    let body = json!({"biz_no": "T7", "printer_id": "p2",
                      "content": {"type": "text", "text": "Table 7\n\n   Kung   pao chicken\nRice\n"}});
    let waiting = app.submit(&key, body).await.body["task_id"].as_str().unwrap_or("").to_owned();
    app.sql("UPDATE printers SET last_error = 'no_paper' WHERE id = 'q1'").await;

    let mut max = Browser::new(app);
    assert_eq!(max.login("max", PASSWORD).await.status, StatusCode::SEE_OTHER);
    // The stores at a glance: what needs a person where.
    let home = max.get("/console/").await;
    assert_eq!(home.status, StatusCode::OK);
    // p1 says what its last ticket met (in doubt), as its card on the store's page does.
    assert!(home.body.contains("data-store=\"s1\" data-attention=\"1\" data-printers-bad=\"1\""), "{}", home.body);
    assert!(home.body.contains("data-store=\"s2\" data-attention=\"0\" data-printers-bad=\"1\""), "{}", home.body);
    assert!(home.body.contains("printers with a problem"), "{}", home.body);

    // Every page of the store counts what needs attention in its navigation.
    for path in ["/console/stores/s1/", "/console/stores/s1/tickets", "/console/stores/s1/attention"] {
        let page = max.get(path).await;
        assert!(page.body.contains("id=\"attention-count\">1</span>"), "{path}: {}", page.body);
    }
    let quiet = max.get("/console/stores/s2/").await;
    assert!(quiet.body.contains("id=\"attention-count\" hidden>0</span>"), "{}", quiet.body);
    // A live refresh says the count in a header, for the badge outside the content.
    let req = max.http.get(format!("{}/console/stores/s1/attention", max.base)).header("x-console-fragment", "1");
    let fragment = max.send(req).await;
    assert_eq!(fragment.header("x-console-attention"), "1");

    // Printers by name, and each ticket's first lines as printed.
    let attention = max.get("/console/stores/s1/attention").await;
    let card = &attention.body[attention.body.find(&format!("data-task=\"{id}\"")).unwrap_or(0)..];
    assert!(card.contains("Printer p1 ·") && card.contains("<p class=\"lines\">ticket</p>"), "{card}");
    let tickets = max.get("/console/stores/s1/tickets").await;
    let card = &tickets.body[tickets.body.find(&format!("data-task=\"{waiting}\"")).unwrap_or(0)..];
    assert!(card.contains("Printer p2 ·"), "{card}");
    assert!(card.contains("<p class=\"lines\">Table 7\nKung pao chicken</p>"), "{card}");
    let ticket = max.get(&format!("/console/stores/s1/tickets/{id}")).await;
    assert!(ticket.body.contains("<dd>Printer p1</dd>"), "{}", ticket.body);
}

/// The tickets list filters by print type and by a time range of the store's day, refuses
/// a time or a page cursor it cannot read, and a bulk action comes back to the list with
/// how many were done and why the others were not.
async fn the_tickets_list_filters_by_time_and_type_and_acts_in_bulk(app: &TestApp) {
    let key = setup(app).await;
    // The doubtful one first: its agent takes every waiting ticket of the store.
    let doubt = in_doubt(app, &key, "s1", "p2", "D1").await;
    let receipt = app.submit(&key, order("R1", "Table 1\n")).await.body["task_id"].as_str().expect("id").to_owned();
    let mut kitchen = order("K1", "Beef noodles\n");
    kitchen["print_type"] = json!("kitchen");
    let kitchen = app.submit(&key, kitchen).await.body["task_id"].as_str().expect("id").to_owned();
    let mut b = Browser::new(app);
    b.login("amy", PASSWORD).await;
    let has = |page: &Page, id: &str| page.body.contains(&format!("data-task=\"{id}\""));
    let page = b.get("/console/stores/s1/tickets?type=kitchen").await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(has(&page, &kitchen) && !has(&page, &receipt), "by print type");
    let date = hidden_value(&b.get("/console/stores/s1/reconciliation").await.body, "date");
    let page = b.get(&format!("/console/stores/s1/tickets?day={date}&from=00%3A00")).await;
    assert!(has(&page, &kitchen) && has(&page, &receipt), "the whole day from midnight");
    let page = b.get(&format!("/console/stores/s1/tickets?day={date}&to=00%3A00")).await;
    assert!(!has(&page, &kitchen) && !has(&page, &receipt), "nothing before midnight");
    let page = b.get("/console/stores/s1/tickets?printer=p2").await;
    assert!(has(&page, &doubt) && !has(&page, &receipt), "by printer");
    assert!(page.body.contains(&format!("name=\"task\" value=\"{doubt}\"")), "a box to tick for the doubtful one");
    for bad in ["from=25%3A00", "to=noon", "before=nonsense", "after=x"] {
        let page = b.get(&format!("/console/stores/s1/tickets?{bad}")).await;
        assert_eq!(page.status, StatusCode::BAD_REQUEST, "{bad}");
    }

    // Mark printed in bulk: the doubtful ticket is done, the pending one is refused (its
    // state does not allow it), and the browser goes back to the filtered list.
    let csrf = hidden(&page.body, "csrf");
    let back = "/console/stores/s1/tickets?printer=p2";
    let form = [
        ("csrf", csrf.as_str()),
        ("back", back),
        ("action", "mark-printed"),
        ("reason", "on the pass"),
        ("task", doubt.as_str()),
        ("task", receipt.as_str()),
    ];
    let answer = b.post("/console/stores/s1/tickets/bulk", &form).await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.body);
    assert!(
        answer.location.starts_with(&format!("{back}&bulk=mark-printed&done=1&refused={receipt}.state")),
        "{}",
        answer.location
    );
    let page = b.get(&answer.location).await;
    assert!(page.body.contains("data-done=\"1\" data-refused=\"1\""), "{}", page.body);
    assert!(page.body.contains("R1") && page.body.contains("its state does not allow this"), "{}", page.body);
    assert_eq!(app.get(&format!("/v1/print-tasks/{doubt}"), &key).await.body["state"], "closed");
    assert_eq!(app.get(&format!("/v1/print-tasks/{receipt}"), &key).await.body["state"], "pending");
    // Back to another site is not followed; an unknown action is not done.
    let mut form = form;
    form[1] = ("back", "https://elsewhere.example/");
    let answer = b.post("/console/stores/s1/tickets/bulk", &form).await;
    assert!(answer.location.starts_with("/console/stores/s1/tickets?bulk="), "{}", answer.location);
    form[2] = ("action", "transfer");
    assert_eq!(b.post("/console/stores/s1/tickets/bulk", &form).await.status, StatusCode::NOT_FOUND);
}
