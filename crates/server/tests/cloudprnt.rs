//! Star CloudPRNT through the public interface, on SQLite and PostgreSQL: the real server,
//! a printer played over HTTP step by step (or the printer simulator in its CloudPRNT
//! mode), the task's state and audit trail read back through the API.

mod common;

use std::time::{Duration, Instant};

use common::{events_of, printer_with_login, wait_state, TestApp};
use onceprint_printer_sim::{Cut, FaultUpdate, Faults, PolledPrinter, Protocol, SimConfig, Simulator};
use reqwest::StatusCode;
use serde_json::{json, Value};

const MAC: &str = "00:11:62:AA:BB:CC";

both_backends!(
    config = crate::common::fast_polled;
    wrong_logins_and_macs_are_refused_and_move_nothing,
    a_job_is_polled_fetched_as_png_and_confirmed_once,
    paper_out_before_the_job_waits_and_paper_out_after_the_fetch_goes_to_a_person,
    result_codes_after_a_fetch_follow_stars_table,
    a_job_for_a_printer_is_the_print_area_at_its_width_with_the_cut_in_a_header,
    idle_polls_right_after_the_fetch_are_printing_and_past_the_offline_threshold_a_doubt,
    a_strict_simulated_printer_prints_documents_as_images_at_its_own_width,
    a_stale_or_foreign_token_changes_nothing,
    raw_escpos_is_refused_for_cloudprnt_printers_and_stations_that_reach_one,
    a_printer_that_stops_polling_goes_offline_and_its_fetched_job_to_a_person,
    the_simulated_printer_prints_every_task_once_through_its_faults,
    an_idle_printer_is_offered_new_work_at_its_very_next_poll,
    an_idle_printer_keeps_its_last_seen_moving_and_stays_online,
    an_idle_printer_that_stops_polling_is_shown_offline_and_back_at_its_next_poll,
);

/// A CloudPRNT printer played over HTTP.
struct Star {
    url: String,
    user: String,
    pass: String,
    mac: String,
    http: reqwest::Client,
}

impl Star {
    async fn new(app: &TestApp, key: &str, id: &str, mac: &str) -> Star {
        Star::with(app, key, id, json!({"kind": "cloudprnt", "mac": mac})).await
    }

    /// A printer set up with this transport configuration.
    async fn with(app: &TestApp, key: &str, id: &str, transport: Value) -> Star {
        let (user, pass) = printer_with_login(app, key, id, transport.clone()).await;
        let mac = transport["mac"].as_str().unwrap_or_default().to_owned();
        Star { url: format!("{}/cloudprnt", app.base), user, pass, mac, http: reqwest::Client::new() }
    }

    async fn poll_with(&self, user: &str, pass: &str, body: Value) -> (StatusCode, Value, Option<String>) {
        let res = self.http.post(&self.url).basic_auth(user, Some(pass)).json(&body).send().await.expect("poll");
        let status = res.status();
        let challenge = res.headers().get("www-authenticate").and_then(|v| v.to_str().ok()).map(str::to_owned);
        (status, res.json().await.unwrap_or(Value::Null), challenge)
    }

    /// A poll with `statusCode`; `token` and `printing` as the printer would send them.
    async fn poll(&self, status: &str, token: Option<&str>, printing: Option<bool>) -> Value {
        let mut body = json!({"statusCode": status.replace(' ', "%20"), "printerMAC": self.mac});
        if let Some(t) = token {
            body["jobToken"] = json!(t);
        }
        if let Some(p) = printing {
            body["printingInProgress"] = json!(p);
        }
        let (s, v, _) = self.poll_with(&self.user, &self.pass, body).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        v
    }

    /// Polls (ready, idle) until a job is ready; returns its token.
    async fn next_job(&self) -> String {
        let start = Instant::now();
        loop {
            let v = self.poll("200 OK", None, None).await;
            if v["jobReady"] == true {
                return v["jobToken"].as_str().expect("jobToken").to_owned();
            }
            assert!(start.elapsed() < Duration::from_secs(10), "no job ready: {v}");
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
    }

    async fn get(&self, media: &str, token: &str) -> (StatusCode, reqwest::header::HeaderMap, Vec<u8>) {
        self.get_with(media, token, &[]).await
    }

    /// A job GET with request headers of Star's ("Client HTTP Request Headers").
    async fn get_with(
        &self,
        media: &str,
        token: &str,
        headers: &[(&str, &str)],
    ) -> (StatusCode, reqwest::header::HeaderMap, Vec<u8>) {
        let mut req = self.http.get(&self.url);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let res = req
            .basic_auth(&self.user, Some(&self.pass))
            .query(&[("mac", self.mac.as_str()), ("type", media), ("token", token)])
            .send()
            .await
            .expect("job GET");
        let (status, headers) = (res.status(), res.headers().clone());
        (status, headers, res.bytes().await.expect("body").to_vec())
    }

    async fn delete(&self, code: &str, token: &str) -> (StatusCode, Value) {
        let res = self
            .http
            .delete(&self.url)
            .basic_auth(&self.user, Some(&self.pass))
            .query(&[("mac", self.mac.as_str()), ("code", code), ("token", token)])
            .send()
            .await
            .expect("DELETE");
        let status = res.status();
        (status, res.json().await.unwrap_or(Value::Null))
    }
}

async fn submit(app: &TestApp, key: &str, printer: &str, biz_no: &str) -> String {
    let a = app
        .submit(key, json!({"biz_no": biz_no, "printer_id": printer, "content": {"type": "text", "text": format!("order {biz_no}\n")}}))
        .await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    a.body["task_id"].as_str().expect("task_id").to_owned()
}

async fn task(app: &TestApp, key: &str, id: &str) -> Value {
    app.get(&format!("/v1/print-tasks/{id}"), key).await.body
}

async fn printer(app: &TestApp, key: &str, id: &str) -> Value {
    app.get(&format!("/v1/printers/{id}"), key).await.body
}

async fn wrong_logins_and_macs_are_refused_and_move_nothing(app: &TestApp) {
    let key = app.tenant("acme").await;
    let star = Star::new(app, &key, "star", MAC).await;
    let id = submit(app, &key, "star", "A1").await;
    let poll = json!({"statusCode": "200%20OK", "printerMAC": MAC});
    let (s, v, challenge) = star.poll_with(&star.user, "wrong-password", poll.clone()).await;
    assert_eq!((s, v["error"]["code"].as_str()), (StatusCode::UNAUTHORIZED, Some("unauthorized")), "{v}");
    assert!(challenge.is_some_and(|c| c.starts_with("Basic")), "printers are challenged for Basic auth");
    let (s, _, _) = star.poll_with("prn_nobody", &star.pass, poll).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let other_mac = json!({"statusCode": "200%20OK", "printerMAC": "00:11:62:00:00:01"});
    let (s, v, _) = star.poll_with(&star.user, &star.pass, other_mac).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{v}");
    // The MAC is compared in one spelling: upper or lower case is the same printer.
    let (s, ok, _) =
        star.poll_with(&star.user, &star.pass, json!({"statusCode": "200 OK", "printerMAC": MAC.to_lowercase()})).await;
    assert_eq!((s, &ok["jobReady"]), (StatusCode::OK, &json!(true)), "{ok}");
    let token = ok["jobToken"].as_str().expect("token").to_owned();
    // A job GET or a confirmation with another MAC, or without one, is refused too.
    for mac in ["00:11:62:00:00:01", ""] {
        let res = star
            .http
            .get(&star.url)
            .basic_auth(&star.user, Some(&star.pass))
            .query(&[("mac", mac), ("type", "image/png"), ("token", token.as_str())])
            .send()
            .await
            .expect("GET");
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
        let res = star
            .http
            .delete(&star.url)
            .basic_auth(&star.user, Some(&star.pass))
            .query(&[("mac", mac), ("code", "200 OK"), ("token", token.as_str())])
            .send()
            .await
            .expect("DELETE");
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    }
    let t = task(app, &key, &id).await;
    assert_eq!((t["state"].as_str(), t["attempts"].as_i64()), (Some("sent"), Some(1)), "{t}");
    let events = events_of(app, &key, &id).await;
    assert!(!events.iter().any(|e| e.2.contains("fetched")), "a refused GET fetched nothing: {events:?}");
    // An agent token or an API key is no printer login.
    let res =
        star.http.post(&star.url).bearer_auth(&key).json(&json!({"statusCode": "200"})).send().await.expect("poll");
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
}

async fn a_job_is_polled_fetched_as_png_and_confirmed_once(app: &TestApp) {
    let key = app.tenant("acme").await;
    let star = Star::new(app, &key, "star", MAC).await;
    let idle = star.poll("200 OK", None, Some(false)).await;
    assert_eq!(idle, json!({"jobReady": false}));
    let p = printer(app, &key, "star").await;
    assert_eq!((p["online"].as_bool(), p["last_error"].is_null()), (Some(true), true), "{p}");
    assert!(p["last_seen_at"].is_string(), "{p}");

    let id = submit(app, &key, "star", "A1").await;
    let v = star.poll("200 OK", None, Some(false)).await;
    assert_eq!(v["jobReady"], true, "{v}");
    assert_eq!(v["mediaTypes"], json!(["image/png", "text/plain"]));
    assert_eq!(v["deleteMethod"], "DELETE");
    let token = v["jobToken"].as_str().expect("token").to_owned();
    // Offered, not fetched: the next poll names the same job again, nothing is written.
    let again = star.poll("200 OK", None, Some(false)).await;
    assert_eq!(again["jobToken"].as_str(), Some(token.as_str()));
    assert_eq!(task(app, &key, &id).await["attempts"], 1);

    let (s, headers, png) = star.get("image/png", &token).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(headers.get("content-type").and_then(|v| v.to_str().ok()), Some("image/png"));
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert_eq!(headers.get("x-onceprint-idempotency-key").and_then(|v| v.to_str().ok()), Some("A1#star"));
    // Plain text ends with a partial cut, as on an ESC/POS printer.
    assert_eq!(headers.get("x-star-cut").and_then(|v| v.to_str().ok()), Some("partial"));
    let fetched: Vec<_> = events_of(app, &key, &id)
        .await
        .into_iter()
        .filter(|e| e.2.contains("fetched by the printer as image/png"))
        .collect();
    assert_eq!(fetched.len(), 1, "the fetch is remembered: {fetched:?}");
    assert_eq!((fetched[0].0.as_str(), fetched[0].1.as_str()), ("sent", "sent"));
    // GET again (and as text) is the same job and remembers nothing new.
    let (s, _, png2) = star.get("image/png", &token).await;
    assert_eq!((s, png2 == png), (StatusCode::OK, true));
    // Plain ASCII text goes as it is, under a media type without parameters (firmware may
    // refuse `; charset=…`), for the printer's own font and code page.
    let (s, headers, text) = star.get("text/plain", &token).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(headers.get("content-type").and_then(|v| v.to_str().ok()), Some("text/plain"));
    assert_eq!(String::from_utf8_lossy(&text), "order A1\n");
    assert!(headers.get("x-star-cut").is_none(), "text ends with the printer's own cut");
    let n = events_of(app, &key, &id).await.iter().filter(|e| e.2.contains("fetched")).count();
    assert_eq!(n, 1);
    let (s, _, _) = star.get("application/vnd.star.starprnt", &token).await;
    assert_eq!(s, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    // While it prints, polls name its job: nothing else is offered.
    let busy = star.poll("200 OK", Some(&token), Some(true)).await;
    assert_eq!(busy["jobReady"], false);

    let (s, v) = star.delete("200 OK", &token).await;
    assert_eq!((s, v["result"].as_str()), (StatusCode::OK, Some("applied")), "{v}");
    let t = task(app, &key, &id).await;
    assert_eq!((t["state"].as_str(), t["attempts"].as_i64()), (Some("printed"), Some(1)), "{t}");
    let (_, v) = star.delete("OK", &token).await;
    assert_eq!(v["result"], "duplicate", "a repeated confirmation changes nothing");
    assert_eq!(star.poll("200 OK", Some(&token), Some(false)).await["jobReady"], false);
    let (s, _, _) = star.get("image/png", &token).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "a finished job is no job");
    let printed = events_of(app, &key, &id).await.iter().filter(|e| e.1 == "printed").count();
    assert_eq!(printed, 1);
}

async fn paper_out_before_the_job_waits_and_paper_out_after_the_fetch_goes_to_a_person(app: &TestApp) {
    let key = app.tenant("acme").await;
    let star = Star::new(app, &key, "star", MAC).await;
    let id = submit(app, &key, "star", "A1").await;
    // The printer reports no paper: it gets no job, and the attempt ends with the reason.
    let v = star.poll("410 Out of Paper", None, Some(false)).await;
    assert_eq!(v["jobReady"], false);
    let t = task(app, &key, &id).await;
    assert_eq!((t["state"].as_str(), t["last_error"].as_str()), (Some("retrying"), Some("no_paper")), "{t}");
    assert_eq!(printer(app, &key, "star").await["last_error"], "no_paper");
    // Paper back: the job goes; the printer fetches it, and the roll ends inside it. Part
    // of the slip may be on paper: the ticket goes to a person, never printed again
    // unmarked, and the printer shows why its lane waits.
    tokio::time::sleep(Duration::from_millis(120)).await;
    let token = star.next_job().await;
    assert_eq!(star.get("image/png", &token).await.0, StatusCode::OK);
    let (s, v) = star.delete("410 Out of Paper", &token).await;
    assert_eq!((s, v["result"].as_str()), (StatusCode::OK, Some("applied")));
    let t = task(app, &key, &id).await;
    assert_eq!(
        (t["state"].as_str(), t["last_error"].as_str(), t["attempts"].as_i64()),
        (Some("in_doubt"), Some("in_doubt"), Some(2)),
        "{t}"
    );
    let events = events_of(app, &key, &id).await;
    assert!(events.last().is_some_and(|e| e.2.contains("no_paper") && e.2.contains("may have printed")), "{events:?}");
    assert_eq!(printer(app, &key, "star").await["last_error"], "no_paper");
    // The next ticket: the cover is opened before it goes (it waits), then it prints. The
    // first is never offered again.
    let second = submit(app, &key, "star", "A2").await;
    star.poll("420 Cover Open", None, Some(false)).await;
    let t = task(app, &key, &second).await;
    assert_eq!((t["state"].as_str(), t["last_error"].as_str()), (Some("retrying"), Some("cover_open")), "{t}");
    assert_eq!(printer(app, &key, "star").await["last_error"], "cover_open");
    tokio::time::sleep(Duration::from_millis(250)).await;
    let token = star.next_job().await;
    assert!(token.starts_with(&second) && token.ends_with(".2"), "{token}");
    assert_eq!(star.get("image/png", &token).await.0, StatusCode::OK);
    assert_eq!(star.delete("OK", &token).await.1["result"], "applied");
    let t = task(app, &key, &second).await;
    assert_eq!((t["state"].as_str(), t["attempts"].as_i64()), (Some("printed"), Some(2)), "{t}");
    assert!(printer(app, &key, "star").await["last_error"].is_null());
    let t = task(app, &key, &id).await;
    assert_eq!((t["state"].as_str(), t["attempts"].as_i64()), (Some("in_doubt"), Some(2)), "{t}");
}

/// Star's result codes after the printer fetched the job (docs/RESULT-CODES.md): a
/// download that did not complete printed nothing and goes again; data the printer cannot
/// use fails (and printed nothing); a code Star does not document may have printed.
async fn result_codes_after_a_fetch_follow_stars_table(app: &TestApp) {
    let key = app.tenant("acme").await;
    let star = Star::new(app, &key, "star", MAC).await;
    let timeout = submit(app, &key, "star", "T1").await;
    let token = star.next_job().await;
    assert_eq!(star.get("image/png", &token).await.0, StatusCode::OK);
    assert_eq!(star.delete("520 Timeout", &token).await.1["result"], "applied");
    let t = task(app, &key, &timeout).await;
    assert_eq!((t["state"].as_str(), t["last_error"].as_str()), (Some("retrying"), Some("error")), "{t}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let again = star.next_job().await;
    assert!(again.starts_with(&timeout) && again.ends_with(".2"), "{again}");
    assert_eq!(star.get("image/png", &again).await.0, StatusCode::OK);
    assert_eq!(star.delete("OK", &again).await.1["result"], "applied");

    let refused = submit(app, &key, "star", "T2").await;
    let token = star.next_job().await;
    assert_eq!(star.get("image/png", &token).await.0, StatusCode::OK);
    assert_eq!(star.delete("511 Media decoding error", &token).await.1["result"], "applied");
    let t = task(app, &key, &refused).await;
    assert_eq!((t["state"].as_str(), t["last_error"].as_str()), (Some("failed"), Some("refused")), "{t}");

    let unknown = submit(app, &key, "star", "T3").await;
    let token = star.next_job().await;
    assert_eq!(star.get("image/png", &token).await.0, StatusCode::OK);
    assert_eq!(star.delete("599 Something new", &token).await.1["result"], "applied");
    let t = task(app, &key, &unknown).await;
    assert_eq!(t["state"], "in_doubt", "{t}");
    // Never offered again: the lane is empty.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for _ in 0..3 {
        assert_eq!(star.poll("200 OK", None, Some(false)).await["jobReady"], false);
    }
    assert_eq!(task(app, &key, &unknown).await["attempts"], 1);
}

/// Width, bit depth and colour type from a PNG's header (IHDR, the first chunk). The
/// pixels are the render crate's to check (`crates/render/tests/print_image.rs`).
fn png_header(png: &[u8]) -> (u32, u8, u8) {
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert_eq!(&png[12..16], b"IHDR");
    (u32::from_be_bytes([png[16], png[17], png[18], png[19]]), png[24], png[25])
}

/// A Star printer prints an `image/png` job at its own dot width (Star CloudPRNT Protocol
/// Guide, "Client HTTP Request Headers"): the print area only, no preview frame, the cut
/// as `X-Star-Cut`; text
/// in Chinese or markup is not offered as `text/plain`, which it would print literally.
async fn a_job_for_a_printer_is_the_print_area_at_its_width_with_the_cut_in_a_header(app: &TestApp) {
    let key = app.tenant("acme").await;
    let star = Star::new(app, &key, "star", MAC).await;
    let a = app
        .submit(&key, json!({"biz_no": "K1", "printer_id": "star", "content": {"type": "markup", "markup": "[center]Table 4\n1 x 鱼汤\n"}}))
        .await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    let v = star.poll("200 OK", None, Some(false)).await;
    assert_eq!(v["mediaTypes"], json!(["image/png"]), "markup is not plain text: {v}");
    let token = v["jobToken"].as_str().expect("token").to_owned();
    let (s, _, _) = star.get("text/plain", &token).await;
    assert_eq!(s, StatusCode::UNSUPPORTED_MEDIA_TYPE);

    // No width said: the render profile's, 576 dots on 80 mm.
    let (s, headers, png) = star.get("image/png", &token).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(headers.get("x-star-cut").and_then(|v| v.to_str().ok()), Some("partial"), "markup ends with a cut");
    assert_eq!(png_header(&png), (576, 1, 0), "576 dots wide, 1 bit per dot, greyscale");
    // A 58 mm printer says so: 48 mm × 8 dots/mm.
    let narrow = [("X-Star-Print-Width", "48"), ("X-Star-Horizontal-Resolution", "8")];
    let (s, _, png) = star.get_with("image/png", &token, &narrow).await;
    assert_eq!((s, png_header(&png).0), (StatusCode::OK, 384));
    let (s, v) = star.delete("200 OK", &token).await;
    assert_eq!((s, v["result"].as_str()), (StatusCode::OK, Some("applied")), "{v}");
}

async fn a_stale_or_foreign_token_changes_nothing(app: &TestApp) {
    let key = app.tenant("acme").await;
    let star = Star::new(app, &key, "star", MAC).await;
    let other = Star::new(app, &key, "star2", "00:11:62:00:00:02").await;
    let id = submit(app, &key, "star", "A1").await;
    let old = star.next_job().await;
    star.poll("410 Out of Paper", Some(&old), Some(false)).await;
    assert_eq!(task(app, &key, &id).await["state"], "retrying");
    tokio::time::sleep(Duration::from_millis(120)).await;
    let current = star.next_job().await;
    assert_ne!(current, old);
    assert_eq!(star.get("image/png", &current).await.0, StatusCode::OK);
    // The older attempt's token: stale, nothing changes.
    let (s, v) = star.delete("420 Cover Open", &old).await;
    assert_eq!((s, v["result"].as_str()), (StatusCode::OK, Some("stale")), "{v}");
    assert_eq!(star.get("image/png", &old).await.0, StatusCode::NOT_FOUND);
    let t = task(app, &key, &id).await;
    assert_eq!((t["state"].as_str(), t["attempts"].as_i64()), (Some("sent"), Some(2)), "{t}");
    // Another printer's login cannot fetch or confirm this printer's job.
    assert_eq!(other.get("image/png", &current).await.0, StatusCode::NOT_FOUND);
    assert_eq!(other.delete("200 OK", &current).await.0, StatusCode::NOT_FOUND);
    let (s, _) = star.delete("200 OK", "not-a-token").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(task(app, &key, &id).await["state"], "sent");
    assert_eq!(star.delete("200 OK", &current).await.1["result"], "applied");
    assert_eq!(task(app, &key, &id).await["state"], "printed");
}

async fn raw_escpos_is_refused_for_cloudprnt_printers_and_stations_that_reach_one(app: &TestApp) {
    let key = app.tenant("acme").await;
    Star::new(app, &key, "star", MAC).await;
    let escpos = json!({"type": "escpos", "data": "G0AKSGkKHVYA"});
    let a = app.submit(&key, json!({"biz_no": "E1", "printer_id": "star", "content": escpos})).await;
    assert_eq!((a.status, a.code()), (StatusCode::BAD_REQUEST, "invalid_content"), "{a:?}");
    let message = a.body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("raw ESC/POS") && message.contains("star"), "{message}");
    // An agent printer takes it; a station whose backup is the CloudPRNT printer does not,
    // since a failover would take the task there.
    assert_eq!(
        app.submit(&key, json!({"biz_no": "E2", "printer_id": "p1", "content": escpos})).await.status,
        StatusCode::CREATED
    );
    let s = app.post("/v1/stations", &key, json!({"id": "bar", "store_id": "s1", "printers": ["p1", "star"]})).await;
    assert_eq!(s.status, StatusCode::CREATED, "{s:?}");
    let a = app.submit(&key, json!({"biz_no": "E3", "station_id": "bar", "content": escpos})).await;
    assert_eq!((a.status, a.code()), (StatusCode::BAD_REQUEST, "invalid_content"), "{a:?}");
    let a = app
        .submit(&key, json!({"biz_no": "E4", "station_id": "bar", "content": {"type": "text", "text": "fine\n"}}))
        .await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
}

async fn a_printer_that_stops_polling_goes_offline_and_its_fetched_job_to_a_person(app: &TestApp) {
    let key = app.tenant("acme").await;
    let (url, got) = common::receiver(0).await;
    let w = app
        .post("/v1/webhooks", &key, json!({"id": "ops", "url": url, "secret": "a-long-enough-secret", "events": ["printer.offline", "printer.online", "task.in_doubt"]}))
        .await;
    assert_eq!(w.status, StatusCode::CREATED, "{w:?}");
    let star = Star::new(app, &key, "star", MAC).await;
    let waiting = submit(app, &key, "star", "A1").await;
    let token = star.next_job().await;
    assert_eq!(star.get("text/plain", &token).await.0, StatusCode::OK);
    // Silent: after 2 × 1 s + 0.3 s the printer is offline and the job it fetched in doubt.
    let t = wait_state(app, &key, &waiting, "in_doubt", Duration::from_secs(8)).await;
    assert!(t["last_error"] == "in_doubt", "{t}");
    let events = events_of(app, &key, &waiting).await;
    assert!(events.last().is_some_and(|e| e.2.contains("went silent")), "{events:?}");
    // The job is settled before the printer is marked offline (so that a crash between
    // the two leaves the printer online and the next check finishes the work): the
    // printer's row may lag the task's by one write.
    let start = Instant::now();
    loop {
        let p = printer(app, &key, "star").await;
        if p["online"] == false {
            assert_eq!(p["last_error"].as_str(), Some("offline"), "{p}");
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(5), "never marked offline: {p}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let start = Instant::now();
    loop {
        let kinds: Vec<String> = got
            .lock()
            .expect("lock")
            .iter()
            .filter_map(|(_, b)| serde_json::from_str::<Value>(b).ok())
            .filter_map(|v| v["type"].as_str().map(str::to_owned))
            .collect();
        if kinds.iter().any(|k| k == "printer.offline") && kinds.iter().any(|k| k == "task.in_doubt") {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "alerts: {kinds:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A job it was only told about never left the broker: when the printer falls silent,
    // that attempt ends as "offline" (nothing to doubt), and the ticket waits with the
    // printer's paused lane; back, the printer is offered it as a new attempt.
    let offered = submit(app, &key, "star", "A2").await;
    let v = star.poll("200 OK", None, Some(false)).await;
    assert!(v["jobToken"].as_str().is_some_and(|t| t.starts_with(&offered)), "{v}");
    assert_eq!(printer(app, &key, "star").await["online"], true, "a poll brings it back");
    let start = Instant::now();
    while printer(app, &key, "star").await["online"] != false {
        assert!(start.elapsed() < Duration::from_secs(8), "never offline again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let t = task(app, &key, &offered).await;
    assert_eq!((t["state"].as_str(), t["last_error"].as_str()), (Some("retrying"), Some("offline")), "{t}");
    let v = star.poll("200 OK", None, Some(false)).await;
    let token = v["jobToken"].as_str().unwrap_or_default().to_owned();
    assert!(token.starts_with(&offered) && token.ends_with(".2"), "offered again as a new attempt: {v}");
    assert_eq!(star.get("image/png", &token).await.0, StatusCode::OK);
    assert_eq!(star.delete("OK", &token).await.1["result"], "applied");
    assert_eq!(task(app, &key, &offered).await["state"], "printed");
}

/// The printer simulator in its CloudPRNT mode, with its faults: every task prints once,
/// and the paper log agrees with the broker.
async fn the_simulated_printer_prints_every_task_once_through_its_faults(app: &TestApp) {
    let key = app.tenant("acme").await;
    let (user, pass) =
        printer_with_login(app, &key, "star", json!({"kind": "cloudprnt", "mac": MAC, "poll_interval_s": 1})).await;
    let printer = PolledPrinter {
        url: format!("{}/cloudprnt", app.base),
        username: user,
        password: pass,
        protocol: Protocol::CloudPrnt { mac: MAC.to_lowercase(), media_type: "text/plain".into(), print_width_mm: 72 },
        // Slow enough that the test puts paper in before the attempts run out.
        poll_interval: Duration::from_millis(200),
    };
    let faults = Faults { paper_out: true, duplicate_confirm: 1, ..Faults::default() };
    let sim = Simulator::start_polled(printer, SimConfig { faults, ..SimConfig::ephemeral() }).await.expect("sim");
    let a1 = submit(app, &key, "star", "A1").await;
    wait_state(app, &key, &a1, "retrying", Duration::from_secs(5)).await;
    assert_eq!(sim.jobs().count(), 0, "no paper, nothing printed");
    // Paper in: A1 prints (confirmed twice: the second is a duplicate).
    sim.faults().update_all(FaultUpdate { paper_out: Some(false), ..FaultUpdate::default() });
    wait_state(app, &key, &a1, "printed", Duration::from_secs(5)).await;
    // The next job prints, then the printer crashes before confirming and polls idle: in
    // doubt once its idle polls go on past its offline threshold after the fetch.
    sim.faults().update_all(FaultUpdate { crash_mid_job: Some(1), ..FaultUpdate::default() });
    let a2 = submit(app, &key, "star", "A2").await;
    wait_state(app, &key, &a2, "in_doubt", Duration::from_secs(5)).await;
    // A lost confirmation arrives late, after the next poll: still credited to its job.
    sim.faults().update_all(FaultUpdate { lost_result: Some(1), ..FaultUpdate::default() });
    let a3 = submit(app, &key, "star", "A3").await;
    wait_state(app, &key, &a3, "printed", Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let jobs = sim.jobs().all();
    for biz in ["A1", "A2", "A3"] {
        let n = jobs.iter().filter(|j| j.text.contains(&format!("order {biz}\n"))).count();
        assert_eq!(n, 1, "{biz} on paper once: {jobs:?}");
    }
    assert!(jobs.iter().all(|j| j.printer == format!("cloudprnt:{}", MAC.to_lowercase())));
    assert_eq!(task(app, &key, &a2).await["state"], "in_doubt", "never printed twice, never offered again");
    sim.shutdown().await;
}

/// A printer that polls and falls silent (switched off) does not hold its tickets for
/// ever: it is offline after 2 × its poll interval + the grace, its lane pauses, a
/// station ticket that cannot have printed moves to the station's next printer after the
/// station's threshold, a ticket past its print type's budget fails with "printer
/// offline", and the printer, back, gets none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_polled_printer_fails_over_and_its_tickets_run_out_of_time_sqlite() {
    silent_printer(common::Backend::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_polled_printer_fails_over_and_its_tickets_run_out_of_time_postgres() {
    silent_printer(common::Backend::Postgres).await
}

/// A broker with fast polled-printer timings, tenant `acme`, the CloudPRNT printer `star`
/// (no poll yet) and the station `hot` (`star`, then the agent printer `p2`, failing over
/// after `failover_after_ms`) with one ticket submitted to it, `H1`.
async fn hot_station(
    backend: common::Backend,
    failover_after_ms: i64,
    max_wait_ms: Option<i64>,
) -> Option<(TestApp, String, Star, String)> {
    let mut config = common::fast_polled();
    config.delivery.sweep_interval_ms = 100;
    if let Some(ms) = max_wait_ms {
        config.intake.policies.types.get_mut("receipt").expect("receipt").max_wait_ms = ms;
    }
    let app = TestApp::spawn_with(backend, config).await?;
    let key = app.tenant("acme").await;
    let star = Star::new(&app, &key, "star", MAC).await;
    let s = app
        .post(
            "/v1/stations",
            &key,
            json!({"id": "hot", "store_id": "s1", "printers": ["star", "p2"], "failover_after_ms": failover_after_ms}),
        )
        .await;
    assert_eq!(s.status, StatusCode::CREATED, "{s:?}");
    let hot = app
        .submit(&key, json!({"biz_no": "H1", "station_id": "hot", "content": {"type": "text", "text": "hot dish\n"}}))
        .await
        .body["task_id"]
        .as_str()
        .expect("id")
        .to_owned();
    Some((app, key, star, hot))
}

/// A printer that is set up and never polls (never switched on, or never given the
/// broker's URL) holds its station's tickets no longer than one that fell silent: 2 × its
/// poll interval + the grace after it was set up it is offline, and a station ticket moves
/// to the backup after the station's threshold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_polled_printer_that_never_calls_in_fails_over_sqlite() {
    never_calls_in(common::Backend::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_polled_printer_that_never_calls_in_fails_over_postgres() {
    never_calls_in(common::Backend::Postgres).await
}

async fn never_calls_in(backend: common::Backend) {
    let Some((app, key, _star, hot)) = hot_station(backend, 1000, None).await else { return };
    let t = wait_state(&app, &key, &hot, "transferred", Duration::from_secs(15)).await;
    let succ = t["successor_task_id"].as_str().expect("successor").to_owned();
    let next = task(&app, &key, &succ).await;
    assert_eq!((next["printer_id"].as_str(), next["origin_kind"].as_str()), (Some("p2"), Some("failover")));
    let p = printer(&app, &key, "star").await;
    assert_eq!((p["online"].as_bool(), p["last_error"].as_str()), (Some(false), Some("offline")), "{p}");
    app.stop().await;
}

/// A reprint is a reprint wherever it prints: when its printer dies and the station
/// moves it to the backup, the copy still carries its numbered banner. Without it, a
/// ticket whose first copy may have come out would come out a second time unmarked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reprint_that_fails_over_keeps_its_banner_sqlite() {
    reprint_fails_over(common::Backend::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reprint_that_fails_over_keeps_its_banner_postgres() {
    reprint_fails_over(common::Backend::Postgres).await
}

async fn reprint_fails_over(backend: common::Backend) {
    use base64::Engine as _;
    let Some((app, key, star, hot)) = hot_station(backend, 1000, None).await else { return };
    // The printer fetches the ticket and reports an error it does not document: it may
    // have printed, so it goes to a person, who asks for a reprint.
    let token = star.next_job().await;
    assert_eq!(star.get("text/plain", &token).await.0, StatusCode::OK);
    assert_eq!(star.delete("599 Something new", &token).await.1["result"], "applied");
    assert_eq!(task(&app, &key, &hot).await["state"], "in_doubt");
    let r = app
        .post(&format!("/v1/print-tasks/{hot}/reprint"), &key, json!({"operator": "alice", "reason": "not sure"}))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let reprint = r.body["created"]["task_id"].as_str().expect("reprint id").to_owned();
    // The printer is switched off before it takes the reprint: offline, and the reprint
    // moves to the backup.
    let t = wait_state(&app, &key, &reprint, "transferred", Duration::from_secs(15)).await;
    let succ = t["successor_task_id"].as_str().expect("successor").to_owned();
    let agent = app.call("POST", "/v1/stores/s1/agent-tokens", Some(&key), None).await.body["token"]
        .as_str()
        .expect("token")
        .to_owned();
    let d = app.post("/v1/agent/poll", &agent, json!({"agent_id": "a1", "session": "s", "wait_ms": 2000})).await;
    let job = &d.body["deliveries"][0];
    assert_eq!(job["task_id"], succ.as_str(), "{:?}", d.body);
    let data = base64::engine::general_purpose::STANDARD.decode(job["data"].as_str().unwrap_or("")).expect("data");
    assert!(data.windows(17).any(|w| w == b"*** REPRINT 1 ***"), "the moved reprint still says it is one");
    app.stop().await;
}

async fn silent_printer(backend: common::Backend) {
    let Some((app, key, star, hot)) = hot_station(backend, 2000, Some(6_000)).await else { return };
    let plain = submit(&app, &key, "star", "R1").await;
    // The printer is told about the station ticket, and is switched off before it fetches.
    let token = star.next_job().await;
    assert!(token.starts_with(&hot), "{token}");
    let silent = Instant::now();
    // Offline, the station ticket on the backup, without a word from the printer.
    let t = wait_state(&app, &key, &hot, "transferred", Duration::from_secs(10)).await;
    let succ = t["successor_task_id"].as_str().expect("successor").to_owned();
    assert!(silent.elapsed() >= Duration::from_millis(2_000), "not before the threshold");
    let p = printer(&app, &key, "star").await;
    assert_eq!((p["online"].as_bool(), p["last_error"].as_str()), (Some(false), Some("offline")), "{p}");
    let next = task(&app, &key, &succ).await;
    assert_eq!((next["printer_id"].as_str(), next["origin_kind"].as_str()), (Some("p2"), Some("failover")));
    let events = events_of(&app, &key, &hot).await;
    assert!(events.iter().any(|e| e.2.contains("without fetching it")), "{events:?}");
    // The backup's agent prints it.
    let agent = app.call("POST", "/v1/stores/s1/agent-tokens", Some(&key), None).await.body["token"]
        .as_str()
        .expect("token")
        .to_owned();
    let d = app.post("/v1/agent/poll", &agent, json!({"agent_id": "a1", "session": "s", "wait_ms": 2000})).await;
    assert_eq!(d.body["deliveries"][0]["task_id"], succ.as_str(), "{:?}", d.body);
    // The other ticket runs out of its print type's budget: failed, "printer offline".
    let t = wait_state(&app, &key, &plain, "failed", Duration::from_secs(10)).await;
    assert_eq!(t["last_error"], "offline", "{t}");
    let events = events_of(&app, &key, &plain).await;
    assert!(events.last().is_some_and(|e| e.2.contains("printer offline")), "{events:?}");
    // Back on: nothing that moved or failed is handed to it.
    for _ in 0..3 {
        let v = star.poll("200 OK", None, Some(false)).await;
        assert_eq!(v["jobReady"], false, "{v}");
    }
    assert_eq!(star.get("image/png", &token).await.0, StatusCode::NOT_FOUND);
    assert_eq!(task(&app, &key, &hot).await["state"], "transferred");
    app.stop().await;
}

/// Star: "a server can assume that the print is in progress after the GET, until a
/// DELETE, or POST with error code is received" (CloudPRNT Protocol Guide, "Polling the
/// server (POST)"): firmware may poll idle between downloading a job and printing it.
async fn idle_polls_right_after_the_fetch_are_printing_and_past_the_offline_threshold_a_doubt(app: &TestApp) {
    let key = app.tenant("acme").await;
    // Polling every 3 s: idle polls end a fetched job 2 × 3 s + 0.3 s after the fetch.
    let star = Star::with(app, &key, "star", json!({"kind": "cloudprnt", "mac": MAC, "poll_interval_s": 3})).await;
    let first = submit(app, &key, "star", "A1").await;
    let second = submit(app, &key, "star", "A2").await;
    let token = star.next_job().await;
    assert_eq!(star.get("image/png", &token).await.0, StatusCode::OK);
    // Idle polls between download and print: the job is in progress, nothing else goes.
    for _ in 0..3 {
        let v = star.poll("200 OK", None, Some(false)).await;
        assert_eq!(v["jobReady"], false, "{v}");
    }
    assert_eq!(task(app, &key, &first).await["state"], "sent");
    let (_, v) = star.delete("200 OK", &token).await;
    assert_eq!(v["result"], "applied", "{v}");
    let t = task(app, &key, &first).await;
    assert_eq!((t["state"].as_str(), t["attempts"].as_i64()), (Some("printed"), Some(1)), "{t}");

    // The next job is fetched, and the printer (rebooted, say) only ever polls idle:
    // past its offline threshold after the fetch (6.3 s) it is in doubt,
    // never offered again, long before the answer deadline (5 min).
    let token = star.next_job().await;
    assert!(token.starts_with(&second), "{token}");
    assert_eq!(star.get("image/png", &token).await.0, StatusCode::OK);
    let start = Instant::now();
    loop {
        let v = star.poll("200 OK", None, Some(false)).await;
        assert!(!v["jobToken"].as_str().unwrap_or_default().starts_with(&second), "offered again: {v}");
        if task(app, &key, &second).await["state"] == "in_doubt" {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "never settled");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (s, _, _) = star.get("image/png", &token).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "a job in doubt is fetched no more");
    assert_eq!(task(app, &key, &second).await["attempts"], 1);
    // Its late confirmation is still the truth: paper did come out.
    assert_eq!(star.delete("200 OK", &token).await.1["result"], "applied");
    assert_eq!(task(app, &key, &second).await["state"], "printed");
}

/// The simulator prints as a Star printer does (it refuses an image that is not its print
/// width, a media type it did not ask for, a content type with parameters): a receipt
/// document and Chinese markup print once each, as images, on an 80 mm and a 58 mm
/// printer, cut as the documents say; an ASCII text ticket prints as text. Both printers
/// run in one simulator (a fleet), each with its own faults: the 58 mm one starts out of
/// paper and prints only once paper is in.
async fn a_strict_simulated_printer_prints_documents_as_images_at_its_own_width(app: &TestApp) {
    let key = app.tenant("acme").await;
    let mut printers = Vec::new();
    for (id, mac, mm) in [("star80", "00:11:62:00:00:80", 72u16), ("star58", "00:11:62:00:00:58", 48)] {
        let (user, pass) =
            printer_with_login(app, &key, id, json!({"kind": "cloudprnt", "mac": mac, "poll_interval_s": 1})).await;
        printers.push(PolledPrinter {
            url: format!("{}/cloudprnt", app.base),
            username: user,
            password: pass,
            protocol: Protocol::CloudPrnt {
                mac: mac.to_lowercase(),
                media_type: "text/plain".into(),
                print_width_mm: mm,
            },
            poll_interval: Duration::from_millis(100),
        });
    }
    let names: Vec<String> = printers.iter().map(PolledPrinter::name).collect();
    let sim = Simulator::start_polled_fleet(printers, SimConfig::ephemeral()).await.expect("sim");
    sim.faults()
        .update(Some(&names[1]), FaultUpdate { paper_out: Some(true), ..FaultUpdate::default() })
        .expect("the 58 mm printer is in the fleet");
    let mut ids: Vec<Vec<String>> = Vec::new();
    for id in ["star80", "star58"] {
        let doc = json!({"type": "doc", "doc": {"blocks": [
            {"type": "text", "text": "Table 7", "bold": true},
            {"type": "text", "text": "1 x noodles"},
            {"type": "cut", "mode": "full"}]}});
        let mut mine = Vec::new();
        for (biz, content) in [
            (format!("D1-{id}"), doc),
            (format!("M1-{id}"), json!({"type": "markup", "markup": "[center]桌 7\n1 x 鱼汤\n"})),
            (format!("T1-{id}"), json!({"type": "text", "text": "order T1\n"})),
        ] {
            let a = app.submit(&key, json!({"biz_no": biz, "printer_id": id, "content": content})).await;
            assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
            mine.push(a.body["task_id"].as_str().expect("task_id").to_owned());
        }
        ids.push(mine);
    }
    for t in &ids[0] {
        wait_state(app, &key, t, "printed", Duration::from_secs(10)).await;
    }
    let on = |name: &str| sim.jobs().all().into_iter().filter(|j| j.printer == name).collect::<Vec<_>>();
    assert!(on(&names[1]).is_empty(), "out of paper, nothing printed: {:?}", on(&names[1]));
    for t in &ids[1] {
        assert_ne!(task(app, &key, t).await["state"], "printed", "{t}");
    }
    sim.faults()
        .update(Some(&names[1]), FaultUpdate { paper_out: Some(false), ..FaultUpdate::default() })
        .expect("the 58 mm printer is in the fleet");
    for t in &ids[1] {
        wait_state(app, &key, t, "printed", Duration::from_secs(10)).await;
    }
    for name in &names {
        let jobs = on(name);
        assert_eq!(jobs.len(), 3, "{name}: each ticket once: {jobs:?}");
        let images: Vec<_> = jobs.iter().filter(|j| j.images == 1).collect();
        assert_eq!(images.len(), 2, "{name}: the document and the markup as images: {jobs:?}");
        let cuts: Vec<_> = images.iter().map(|j| j.cut).collect();
        assert_eq!(cuts, [Cut::Full, Cut::Partial], "{name}: the document's full cut, markup's partial one");
        assert!(jobs.iter().any(|j| j.images == 0 && j.text == "order T1\n"), "{name}: {jobs:?}");
        // Each line carries the polls since the printer's previous job, the poll that
        // announced it last, before the job was printed.
        for j in &jobs {
            let printed = time::OffsetDateTime::parse(&j.at, &time::format_description::well_known::Rfc3339)
                .expect("RFC 3339")
                .unix_timestamp_nanos()
                / 1_000;
            let last = *j.polls_us.last().expect("poll times");
            assert!(j.polls_us.windows(2).all(|w| w[0] <= w[1]) && i128::from(last) <= printed, "{j:?}");
        }
    }
}

/// A printer whose lane was found empty is answered from memory until its store is
/// signalled: new work of every kind (a submission, a person's reprint) is offered at the
/// very next poll, never one safety interval later.
async fn an_idle_printer_is_offered_new_work_at_its_very_next_poll(app: &TestApp) {
    let key = app.tenant("acme").await;
    let star = Star::new(app, &key, "star", MAC).await;
    for _ in 0..3 {
        assert_eq!(star.poll("200 OK", None, Some(false)).await["jobReady"], false);
    }
    let id = submit(app, &key, "star", "N1").await;
    let v = star.poll("200 OK", None, Some(false)).await;
    assert_eq!(v["jobReady"], true, "a submission is offered at once: {v}");
    let token = v["jobToken"].as_str().expect("token").to_owned();
    assert_eq!(star.get("text/plain", &token).await.0, StatusCode::OK);
    assert_eq!(star.delete("200 OK", &token).await.1["result"], "applied");
    for _ in 0..3 {
        assert_eq!(star.poll("200 OK", None, Some(false)).await["jobReady"], false);
    }
    let r = app
        .post(&format!("/v1/print-tasks/{id}/reprint"), &key, json!({"operator": "alice", "reason": "smudged"}))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let v = star.poll("200 OK", None, Some(false)).await;
    assert_eq!(v["jobReady"], true, "a reprint is offered at once: {v}");
}

/// `last_seen_at` of the printer as the API shows it, in milliseconds since the epoch.
async fn last_seen_ms(app: &TestApp, key: &str, id: &str) -> Option<i128> {
    let p = printer(app, key, id).await;
    let text = p["last_seen_at"].as_str()?;
    let t = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).expect("RFC 3339");
    Some(t.unix_timestamp_nanos() / 1_000_000)
}

/// A printer that keeps polling with nothing to print has only its `last_seen_at`
/// refreshed, in batches: the time the API shows moves forward again and again, and the
/// printer is never taken for offline meanwhile (its polls last three times its offline
/// threshold here).
async fn an_idle_printer_keeps_its_last_seen_moving_and_stays_online(app: &TestApp) {
    let key = app.tenant("acme").await;
    let star = Star::new(app, &key, "star", MAC).await;
    assert_eq!(star.poll("200 OK", None, Some(false)).await["jobReady"], false);
    let first = last_seen_ms(app, &key, "star").await.expect("seen at its first poll");
    let mut last = first;
    let mut moves = 0;
    let start = Instant::now();
    // 1 s interval: polled five times a second for 7 s, against an offline threshold of 2.3 s.
    while start.elapsed() < Duration::from_secs(7) {
        assert_eq!(star.poll("200 OK", None, Some(false)).await["jobReady"], false);
        let p = printer(app, &key, "star").await;
        assert_eq!((p["online"].as_bool(), p["last_error"].is_null()), (Some(true), true), "{p}");
        let seen = last_seen_ms(app, &key, "star").await.expect("seen");
        assert!(seen >= last, "last_seen_at never moves back: {seen} after {last}");
        if seen > last {
            moves += 1;
            last = seen;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(moves >= 3, "last_seen_at moved {moves} times, from {first} to {last}");
}

/// A printer whose idle polls were refreshed in batches and that then stops polling is
/// still found silent by the offline check: `online` false and `last_error` "offline" in
/// the API, with its `printer.offline` alert; its next poll brings it back online.
async fn an_idle_printer_that_stops_polling_is_shown_offline_and_back_at_its_next_poll(app: &TestApp) {
    let key = app.tenant("acme").await;
    let (url, got) = common::receiver(0).await;
    let w = app
        .post("/v1/webhooks", &key, json!({"id": "ops", "url": url, "secret": "a-long-enough-secret", "events": ["printer.offline", "printer.online"]}))
        .await;
    assert_eq!(w.status, StatusCode::CREATED, "{w:?}");
    let star = Star::new(app, &key, "star", MAC).await;
    // Idle long enough for several refreshes of `last_seen_at` alone.
    let first = {
        assert_eq!(star.poll("200 OK", None, Some(false)).await["jobReady"], false);
        last_seen_ms(app, &key, "star").await.expect("seen")
    };
    let start = Instant::now();
    while last_seen_ms(app, &key, "star").await.is_none_or(|s| s <= first) {
        assert!(start.elapsed() < Duration::from_secs(10), "last_seen_at never refreshed");
        assert_eq!(star.poll("200 OK", None, Some(false)).await["jobReady"], false);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(printer(app, &key, "star").await["online"], true);
    // Silent from now on.
    let start = Instant::now();
    loop {
        let p = printer(app, &key, "star").await;
        if p["online"] == false {
            assert_eq!(p["last_error"].as_str(), Some("offline"), "{p}");
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "never marked offline: {p}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let kinds = |got: &common::Received| -> Vec<String> {
        got.lock()
            .expect("lock")
            .iter()
            .filter_map(|(_, b)| serde_json::from_str::<Value>(b).ok())
            .filter_map(|v| v["type"].as_str().map(str::to_owned))
            .collect()
    };
    let start = Instant::now();
    while !kinds(&got).iter().any(|k| k == "printer.offline") {
        assert!(start.elapsed() < Duration::from_secs(10), "alerts: {:?}", kinds(&got));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Back: its next poll writes its health whole.
    assert_eq!(star.poll("200 OK", None, Some(false)).await["jobReady"], false);
    let p = printer(app, &key, "star").await;
    assert_eq!((p["online"].as_bool(), p["last_error"].is_null()), (Some(true), true), "{p}");
    let start = Instant::now();
    while !kinds(&got).iter().any(|k| k == "printer.online") {
        assert!(start.elapsed() < Duration::from_secs(10), "alerts: {:?}", kinds(&got));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
