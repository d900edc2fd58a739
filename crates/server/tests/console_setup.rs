//! The console's set-up pages over HTTP, on SQLite and PostgreSQL: a manager adds printers
//! of every kind that logs in or not, sees a printer's login once, renames, disables and
//! enables a printer, sends a test ticket through intake, sets up stations, adds a group
//! bot as an alert target and sends it a test; each change is audited as the operator.
//! Staff see the printers but every set-up request of theirs is refused.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::TestApp;
use onceprint_server::HttpConfig;
use reqwest::StatusCode;
use serde_json::{json, Value};

fn fast_alerts() -> HttpConfig {
    let mut c = HttpConfig::default();
    c.alerts.poll_interval_ms = 50;
    c.alerts.first_backoff_ms = 200;
    c
}

both_backends!(
    config = crate::fast_alerts;
    a_manager_sets_up_printers_and_stations_in_the_console,
    staff_see_the_printers_but_cannot_set_them_up,
    a_manager_adds_a_group_bot_and_sends_it_a_test,
);

const PASSWORD: &str = "a long enough passphrase";

/// Tenant `acme` (store s1 with p1 and p2), staff `amy` of s1 and manager `max`.
async fn setup(app: &TestApp) -> String {
    let key = app.tenant("acme").await;
    let amy = json!({"id": "amy", "name": "Amy", "role": "staff", "stores": ["s1"], "password": PASSWORD});
    assert_eq!(app.post("/v1/operators", &key, amy).await.status, StatusCode::CREATED);
    let max = json!({"id": "max", "name": "Max", "role": "manager", "password": PASSWORD});
    assert_eq!(app.post("/v1/operators", &key, max).await.status, StatusCode::CREATED);
    key
}

/// A browser without JavaScript: cookies kept, redirects not followed.
struct Browser {
    http: reqwest::Client,
    base: String,
    cookies: Vec<(String, String)>,
}

struct Page {
    status: StatusCode,
    location: String,
    body: String,
}

impl Browser {
    async fn logged_in(app: &TestApp, operator: &str) -> Browser {
        let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("client");
        let mut b = Browser { http, base: app.base.clone(), cookies: Vec::new() };
        let page = b.get("/console/login").await;
        let csrf = hidden(&page.body, "csrf");
        let form = [("csrf", csrf.as_str()), ("next", "/console/"), ("tenant", "acme"), ("operator", operator)];
        let mut form = form.to_vec();
        form.push(("password", PASSWORD));
        let page = b.post("/console/login", &form).await;
        assert_eq!(page.status, StatusCode::SEE_OTHER, "login of {operator}");
        b
    }

    async fn send(&mut self, req: reqwest::RequestBuilder) -> Page {
        let cookie = self.cookies.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("; ");
        let res = req.header("cookie", cookie).send().await.expect("request");
        let status = res.status();
        let location = res.headers().get("location").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
        for c in res.headers().get_all("set-cookie").iter().filter_map(|v| v.to_str().ok()) {
            if let Some((k, v)) = c.split(';').next().and_then(|f| f.split_once('=')) {
                self.cookies.retain(|(n, _)| n != k);
                if !v.is_empty() && !c.contains("Max-Age=0") {
                    self.cookies.push((k.to_owned(), v.to_owned()));
                }
            }
        }
        Page { status, location, body: res.text().await.unwrap_or_default() }
    }

    async fn get(&mut self, path: &str) -> Page {
        let req = self.http.get(format!("{}{path}", self.base));
        self.send(req).await
    }

    async fn post(&mut self, path: &str, form: &[(&str, &str)]) -> Page {
        let req = self.http.post(format!("{}{path}", self.base)).form(form);
        self.send(req).await
    }

    /// The session's CSRF token, from a page of the console.
    async fn csrf(&mut self) -> String {
        hidden(&self.get("/console/stores/s1/").await.body, "csrf")
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

/// The text of the first element carrying attribute `attr` (e.g. `data-login-password`).
fn marked(body: &str, attr: &str) -> Option<String> {
    let i = body.find(&format!(" {attr}>"))?;
    let rest = &body[i + attr.len() + 2..];
    rest.split('<').next().map(str::to_owned)
}

async fn setup_events(app: &TestApp, key: &str) -> Vec<Value> {
    let a = app.call("GET", "/v1/setup-events?limit=100", Some(key), None).await;
    a.body["events"].as_array().cloned().unwrap_or_default()
}

async fn a_manager_sets_up_printers_and_stations_in_the_console(app: &TestApp) {
    let key = setup(app).await;
    let mut b = Browser::logged_in(app, "max").await;
    let csrf = b.csrf().await;
    let page = b.get("/console/stores/s1/printers").await;
    assert_eq!(page.status, StatusCode::OK);
    for form in ["data-add=\"agent\"", "data-add=\"cloudprnt\"", "data-add=\"epson_sdp\"", "data-add=\"webhook\""] {
        assert!(page.body.contains(form), "{form} offered to a manager");
    }
    assert!(page.body.contains("id=\"nav-setup\""), "the navigation leads a manager here");

    // A Star printer: its login shows on the answer, once.
    let added = b
        .post(
            "/console/stores/s1/printers",
            &[
                ("csrf", &csrf),
                ("kind", "cloudprnt"),
                ("id", "bar"),
                ("name", "Bar"),
                ("mac", "00:11:62:AA:BB:CC"),
                ("poll_interval_s", "5"),
                ("profile", ""),
            ],
        )
        .await;
    assert_eq!(added.status, StatusCode::CREATED, "{}", added.body);
    let password = marked(&added.body, "data-login-password").expect("the password shown");
    let username = marked(&added.body, "data-login-username").expect("the user name shown");
    assert!(username.starts_with("prn_") && password.len() >= 20, "{username} {password}");
    let url = marked(&added.body, "data-server-url").expect("the server URL shown");
    assert_eq!(url, format!("{}/cloudprnt", app.base));
    let again = b.get("/console/stores/s1/printers").await;
    assert!(!again.body.contains(&password) && !again.body.contains("data-login-password"), "shown once only");
    assert!(again.body.contains("data-setup-printer=\"bar\""));
    let p = app.call("GET", "/v1/printers/bar", Some(&key), None).await;
    assert_eq!((p.body["name"].as_str(), p.body["transport"]["kind"].as_str()), (Some("Bar"), Some("cloudprnt")));

    // A new login: another password, shown once more.
    let rotated = b.post("/console/stores/s1/printers/bar/rotate", &[("csrf", &csrf)]).await;
    assert_eq!(rotated.status, StatusCode::OK);
    let second = marked(&rotated.body, "data-login-password").expect("the new password shown");
    assert_ne!(second, password);

    // Rename and change the polling interval; disable and enable with a reason.
    let edit = b
        .post(
            "/console/stores/s1/printers/bar/edit",
            &[
                ("csrf", &csrf),
                ("kind", "cloudprnt"),
                ("name", "Bar left"),
                ("mac", "00:11:62:AA:BB:CC"),
                ("poll_interval_s", "7"),
            ],
        )
        .await;
    assert_eq!((edit.status, edit.location.as_str()), (StatusCode::SEE_OTHER, "/console/stores/s1/printers?done=edit"));
    let p = app.call("GET", "/v1/printers/bar", Some(&key), None).await;
    assert_eq!((p.body["name"].as_str(), p.body["transport"]["poll_interval_s"].as_u64()), (Some("Bar left"), Some(7)));
    let off =
        b.post("/console/stores/s1/printers/bar/disable", &[("csrf", &csrf), ("reason", "moved to the back")]).await;
    assert_eq!(off.status, StatusCode::SEE_OTHER);
    assert_eq!(app.call("GET", "/v1/printers/bar", Some(&key), None).await.body["enabled"], false);
    b.post("/console/stores/s1/printers/bar/enable", &[("csrf", &csrf), ("reason", "back in use")]).await;
    assert_eq!(app.call("GET", "/v1/printers/bar", Some(&key), None).await.body["enabled"], true);
    // A refusal of the engine (a MAC that is no MAC) shows its message, changes nothing.
    let bad = b
        .post(
            "/console/stores/s1/printers",
            &[("csrf", &csrf), ("kind", "cloudprnt"), ("id", "bad"), ("mac", "not a mac")],
        )
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.body);
    assert!(bad.body.contains("mac"), "{}", bad.body);

    // A test print goes through intake like any ticket, to that printer.
    let test = b.post("/console/stores/s1/printers/p1/test-print", &[("csrf", &csrf)]).await;
    assert_eq!(test.status, StatusCode::SEE_OTHER);
    let task = test.location.split("task=").nth(1).expect("the ticket in the address").to_owned();
    let t = app.call("GET", &format!("/v1/print-tasks/{task}"), Some(&key), None).await;
    assert_eq!(t.status, StatusCode::OK, "{t:?}");
    assert_eq!((t.body["printer_id"].as_str(), t.body["print_type"].as_str()), (Some("p1"), Some("receipt")));
    assert!(t.body["biz_no"].as_str().is_some_and(|b| b.starts_with("TEST-")), "{t:?}");
    let page = b.get(&test.location).await;
    assert!(page.body.contains(&format!("/console/stores/s1/tickets/{task}")), "the page links to the ticket");

    // Stations: p1 then p2; then the other way round.
    let st = b
        .post(
            "/console/stores/s1/stations",
            &[
                ("csrf", &csrf),
                ("id", "kitchen"),
                ("printer", "p1"),
                ("printer", "p2"),
                ("printer", ""),
                ("failover_after_s", ""),
            ],
        )
        .await;
    assert_eq!(st.status, StatusCode::SEE_OTHER, "{}", st.body);
    let s = app.call("GET", "/v1/stations/kitchen", Some(&key), None).await;
    assert_eq!(s.body["printers"], json!(["p1", "p2"]));
    b.post(
        "/console/stores/s1/stations/kitchen/edit",
        &[("csrf", &csrf), ("printer", "p2"), ("printer", "p1"), ("failover_after_s", "30")],
    )
    .await;
    let s = app.call("GET", "/v1/stations/kitchen", Some(&key), None).await;
    assert_eq!((s.body["printers"].clone(), s.body["failover_after_ms"].as_i64()), (json!(["p2", "p1"]), Some(30_000)));
    let page = b.get("/console/stores/s1/printers").await;
    assert!(page.body.contains("data-station=\"kitchen\""));

    // Every change is in the set-up audit under the operator's name.
    let events = setup_events(app, &key).await;
    let by_max = events.iter().filter(|e| e["actor"] == "operator:max").count();
    assert!(by_max >= 7, "printer, rotate, edit, disable, enable, station, station edit: {events:?}");
    // A printer of another store is not found from this store's page.
    let other = b.post("/console/stores/s1/printers/nope/disable", &[("csrf", &csrf), ("reason", "x")]).await;
    assert_eq!(other.status, StatusCode::NOT_FOUND);
}

async fn staff_see_the_printers_but_cannot_set_them_up(app: &TestApp) {
    let key = setup(app).await;
    let mut b = Browser::logged_in(app, "amy").await;
    let csrf = b.csrf().await;
    let page = b.get("/console/stores/s1/printers").await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains("data-setup-printer=\"p1\""), "staff see the list");
    for form in ["data-add=", "data-action=\"test-print\"", "data-action=\"edit\"", "data-action=\"disable\""] {
        assert!(!page.body.contains(form), "no {form} for staff");
    }
    let home = b.get("/console/stores/s1/").await;
    assert!(!home.body.contains("nav-setup") && !home.body.contains("nav-alerts"));
    let refused: Vec<(&str, Vec<(&str, &str)>)> = vec![
        ("/console/stores/s1/printers", vec![("kind", "agent"), ("id", "x1"), ("address", "tcp://192.0.2.1:9100")]),
        ("/console/stores/s1/printers/p1/test-print", vec![]),
        ("/console/stores/s1/printers/p1/disable", vec![("reason", "x")]),
        ("/console/stores/s1/printers/p1/edit", vec![("name", "Mine")]),
        ("/console/stores/s1/stations", vec![("id", "st"), ("printer", "p1")]),
        ("/console/alerts", vec![("id", "w"), ("url", "http://192.0.2.1/"), ("event", "task.failed")]),
        ("/console/alerts/w/test", vec![]),
    ];
    for (path, fields) in refused {
        let mut form = vec![("csrf", csrf.as_str())];
        form.extend(fields);
        let page = b.post(path, &form).await;
        assert_eq!(page.status, StatusCode::FORBIDDEN, "{path}");
        assert!(page.body.contains("data-code=\"forbidden\""), "{path}: {}", page.body);
    }
    assert_eq!(b.get("/console/alerts").await.status, StatusCode::FORBIDDEN);
    let p = app.call("GET", "/v1/printers/p1", Some(&key), None).await;
    assert_eq!((p.body["name"].as_str(), p.body["enabled"].as_bool()), (Some("Printer p1"), Some(true)));
    let tasks = app.all_tasks(&key).await;
    assert!(tasks.is_empty(), "no test print by staff: {tasks:?}");
}

type Calls = Arc<Mutex<Vec<Value>>>;

/// A WeCom-like group bot on loopback: takes a text message, answers `errcode` 0.
async fn group_bot() -> (String, Calls) {
    let calls: Calls = Arc::default();
    let seen = calls.clone();
    let app = axum::Router::new().route(
        "/bot",
        axum::routing::post(move |body: String| {
            let seen = seen.clone();
            async move {
                let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
                seen.lock().expect("lock").push(v);
                json!({"errcode": 0, "errmsg": "ok"}).to_string()
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}/bot?key=bot-key-1"), calls)
}

async fn a_manager_adds_a_group_bot_and_sends_it_a_test(app: &TestApp) {
    let key = setup(app).await;
    let (url, calls) = group_bot().await;
    let mut b = Browser::logged_in(app, "max").await;
    let csrf = b.csrf().await;
    let page = b.get("/console/alerts").await;
    assert_eq!(page.status, StatusCode::OK);
    for f in ["wecom", "dingtalk", "feishu", "slack", "onceprint"] {
        assert!(page.body.contains(&format!("<option value=\"{f}\"")), "{f} offered");
    }
    let added = b
        .post(
            "/console/alerts",
            &[
                ("csrf", &csrf),
                ("id", "kitchen-bot"),
                ("format", "wecom"),
                ("url", &url),
                ("secret", ""),
                ("event", "task.failed"),
                ("event", "printer.offline"),
            ],
        )
        .await;
    assert_eq!(added.status, StatusCode::CREATED, "{}", added.body);
    assert!(!added.body.contains("bot-key-1"), "the bot's key is not shown");
    let hooks = app.call("GET", "/v1/webhooks", Some(&key), None).await;
    assert_eq!(hooks.body["webhooks"][0]["format"], "wecom", "{hooks:?}");
    assert_eq!(hooks.body["webhooks"][0]["events"], json!(["task.failed", "printer.offline"]));

    let sent = b.post("/console/alerts/kitchen-bot/test", &[("csrf", &csrf)]).await;
    assert_eq!(sent.status, StatusCode::SEE_OTHER);
    assert!(sent.location.starts_with("/console/alerts?done=test"), "{}", sent.location);
    let start = Instant::now();
    loop {
        let got = calls.lock().expect("lock").clone();
        if let Some(m) = got.first() {
            assert_eq!(m["msgtype"], "text", "{m}");
            assert!(m["text"]["content"].is_string(), "{m}");
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(15), "the bot got no test message");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The page shows how it went.
    let start = Instant::now();
    loop {
        let page = b.get("/console/alerts").await;
        if page.body.contains("data-delivery=\"delivered\"") {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(15), "never shown delivered: {}", page.body);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // An unknown target is "not found".
    assert_eq!(b.post("/console/alerts/none/test", &[("csrf", &csrf)]).await.status, StatusCode::NOT_FOUND);
}
