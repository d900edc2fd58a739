//! A reconciliation day with missing, unexpected and reprinted orders, matched against a
//! hand-computed expectation, and stores' time zones, on SQLite and PostgreSQL.
//!
//! Where a business day begins and ends across daylight saving changes is tested in the
//! engine (`reconcile::tests` and `tests/reconcile_time_zones.rs`), with tasks at chosen
//! times; here the broker stamps tasks with the current time, so only the `timezone`
//! text is checked: accepted, refused, kept and shown.

mod common;

use common::{order, TestApp};
use reqwest::StatusCode;
use serde_json::{json, Value};

both_backends!(
    a_day_with_missing_unexpected_and_reprinted_orders,
    bad_reconciliation_requests,
    a_missing_date_means_today_in_the_stores_zone,
    stores_take_iana_time_zones_and_fixed_offsets,
    unknown_time_zones_are_refused_naming_the_field
);

async fn deliver_and_ack(app: &TestApp, token: &str, outcome: &str) -> String {
    let d = app.post("/v1/agent/poll", token, json!({"agent_id": "a1", "session": "s", "wait_ms": 1000})).await;
    let task = d.body["deliveries"][0]["task_id"].as_str().expect("a delivery").to_owned();
    let attempt = d.body["deliveries"][0]["attempt"].as_i64().unwrap_or(1);
    let a = app
        .post("/v1/agent/acks", token, json!({"acks": [{"task_id": task, "attempt": attempt, "outcome": outcome}]}))
        .await;
    assert_eq!(a.status, StatusCode::OK);
    task
}

fn today() -> String {
    // The store below is on UTC, so the business day is the UTC date.
    today_at_offset(0)
}

/// Today's date at a fixed offset from UTC, in seconds.
fn today_at_offset(offset_secs: i64) -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let days = (secs as i64 + offset_secs).div_euclid(86_400);
    // civil_from_days (Howard Hinnant)
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

async fn a_day_with_missing_unexpected_and_reprinted_orders(app: &TestApp) {
    let key = app.tenant("acme").await;
    let token = app.call("POST", "/v1/stores/s1/agent-tokens", Some(&key), None).await.body["token"]
        .as_str()
        .expect("token")
        .to_owned();
    // O1 prints; O2 prints and is reprinted; O3 is cancelled; O4 ends in doubt; X9 prints
    // but nobody expected it; O5 is expected but never arrived.
    for biz in ["O1", "O2"] {
        app.submit(&key, order(biz, biz)).await;
        deliver_and_ack(app, &token, "printed").await;
    }
    let o2 =
        app.get("/v1/print-tasks?biz_no=O2", &key).await.body["tasks"][0]["task_id"].as_str().expect("O2").to_owned();
    let r =
        app.post(&format!("/v1/print-tasks/{o2}/reprint"), &key, json!({"operator": "alice", "reason": "torn"})).await;
    assert_eq!(r.status, StatusCode::CREATED);
    deliver_and_ack(app, &token, "printed").await;
    let o3 = app.submit(&key, order("O3", "O3")).await.body["task_id"].as_str().expect("O3").to_owned();
    app.post(&format!("/v1/print-tasks/{o3}/cancel"), &key, json!({"operator": "alice", "reason": "left"})).await;
    app.submit(&key, order("O4", "O4")).await;
    deliver_and_ack(app, &token, "in_doubt").await;
    app.submit(&key, order("X9", "X9")).await;
    deliver_and_ack(app, &token, "printed").await;

    let date = today();
    let path = format!("/v1/stores/s1/reconciliation?date={date}");
    let plain = app.get(&path, &key).await;
    assert_eq!(plain.status, StatusCode::OK, "{plain:?}");
    assert_eq!(plain.body["expected"], Value::Null);
    let got = app.post(&path, &key, json!(["O1", "O2", "O3", "O4", "O5"])).await;
    assert_eq!(got.status, StatusCode::OK, "{got:?}");
    let expected = json!({
        "store_id": "s1", "date": date, "timezone": "UTC",
        "counts": {"submitted": 5, "printed": 3, "reprinted": 1, "failed": 0, "in_doubt": 1,
                   "transferred": 0, "cancelled": 1, "closed": 0, "open": 0},
        "ledger": {"charges": 6, "charged_amount": 6, "refunds": 1, "refunded_amount": 1},
        "expected": 5,
        "expected_not_printed": ["O3", "O4", "O5"],
        "printed_not_expected": ["X9"],
        "printed_more_than_once": [],
        // No agent uploaded a device log (tests/device_log.rs has days with one).
        "device_log": "none",
        "device_counts": {"records": 0, "device_printed": 0, "broker_printed": 4,
                          "device_printed_broker_not": 0, "broker_printed_device_not": null},
        "device_printed_broker_not": [],
        "broker_printed_device_not": []
    });
    assert_eq!(got.body, expected);

    // The same as CSV, from a CSV upload.
    let res = app
        .http
        .post(format!("{}{path}", app.base))
        .bearer_auth(&key)
        .header("content-type", "text/csv")
        .header("accept", "text/csv")
        .body("biz_no\nO1\nO2\nO3\nO4\nO5\n")
        .send()
        .await
        .expect("csv");
    assert_eq!(res.status(), StatusCode::OK);
    let csv = res.text().await.expect("text");
    assert!(csv.starts_with("section,item,value\n"), "{csv}");
    assert!(
        csv.contains("count,printed,3\n")
            && csv.contains("expected_not_printed,O5,\n")
            && csv.contains("printed_not_expected,X9,\n"),
        "{csv}"
    );
}

async fn bad_reconciliation_requests(app: &TestApp) {
    let key = app.tenant("acme").await;
    assert_eq!(app.get("/v1/stores/s1/reconciliation?date=2026-02-30", &key).await.code(), "invalid_request");
    assert_eq!(app.get("/v1/stores/s1/reconciliation?date=yesterday", &key).await.code(), "invalid_request");
    assert_eq!(app.get("/v1/stores/nope/reconciliation?date=2026-11-29", &key).await.code(), "not_found");
    let other = app.tenant("bistro").await;
    app.post("/v1/stores", &other, json!({"id": "east", "name": "East", "timezone": "+08:00"})).await;
    assert_eq!(
        app.get("/v1/stores/east/reconciliation?date=2026-11-29", &key).await.code(),
        "not_found",
        "another tenant's store"
    );
    let east = app.get("/v1/stores/east/reconciliation?date=2026-11-29", &other).await;
    assert_eq!(east.body["timezone"], "+08:00");
    let bad = app.post("/v1/stores", &other, json!({"id": "west", "name": "W", "timezone": "Europe/Pariss"})).await;
    assert_eq!(bad.code(), "invalid_request");
    let a = app.post("/v1/stores/s1/reconciliation?date=2026-11-29", &key, json!({"nope": 1})).await;
    assert_eq!(a.code(), "invalid_request");
}

async fn a_missing_date_means_today_in_the_stores_zone(app: &TestApp) {
    let key = app.tenant("acme").await;
    app.submit(&key, order("T1", "T1")).await;
    let plain = app.get("/v1/stores/s1/reconciliation", &key).await;
    assert_eq!(plain.status, StatusCode::OK, "{plain:?}");
    assert_eq!(plain.body["date"], today());
    assert_eq!(plain.body["counts"]["submitted"], 1, "{plain:?}");
    // Two stores 25 hours apart are never on the same date: each gets its own today.
    for (id, zone, offset) in [("east", "+14:00", 14 * 3600), ("west", "-11:00", -11 * 3600)] {
        let made = app.post("/v1/stores", &key, json!({"id": id, "name": id, "timezone": zone})).await;
        assert_eq!(made.status, StatusCode::CREATED, "{made:?}");
        let day = app.get(&format!("/v1/stores/{id}/reconciliation"), &key).await;
        assert_eq!(day.status, StatusCode::OK, "{day:?}");
        assert_eq!(day.body["date"], today_at_offset(offset), "{zone}");
        let posted = app.post(&format!("/v1/stores/{id}/reconciliation"), &key, json!(["T1"])).await;
        assert_eq!(posted.body["date"], today_at_offset(offset), "{posted:?}");
    }
    assert_eq!(app.get("/v1/stores/nope/reconciliation", &key).await.code(), "not_found");
}

async fn stores_take_iana_time_zones_and_fixed_offsets(app: &TestApp) {
    let key = app.tenant("acme").await;
    let created =
        app.post("/v1/stores", &key, json!({"id": "berlin", "name": "Berlin", "timezone": "Europe/Berlin"})).await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    assert_eq!(created.body["timezone"], "Europe/Berlin");
    assert_eq!(app.get("/v1/stores/berlin", &key).await.body["timezone"], "Europe/Berlin");

    // Other spellings, and what the broker keeps for each: names as the time zone
    // database writes them, offsets as +HH:MM, and one spelling for UTC.
    for (id, given, kept) in [
        ("ny", json!("america/new_york"), "America/New_York"),
        ("shanghai", json!("+8:00"), "+08:00"),
        ("mumbai", json!("+05:30"), "+05:30"),
        ("stjohns", json!("-03:30"), "-03:30"),
        ("zulu", json!("Z"), "UTC"),
        ("zero", json!("+00:00"), "UTC"),
        ("empty", json!(""), "UTC"),
        ("none", Value::Null, "UTC"),
    ] {
        let a = app.post("/v1/stores", &key, json!({"id": id, "name": id, "timezone": given})).await;
        assert_eq!(a.status, StatusCode::CREATED, "{given}: {a:?}");
        assert_eq!(a.body["timezone"], kept, "{given}");
    }
    let listed = app.get("/v1/stores", &key).await;
    let zones: Vec<(&str, &str)> = listed.body["stores"]
        .as_array()
        .expect("stores")
        .iter()
        .map(|s| (s["id"].as_str().unwrap_or(""), s["timezone"].as_str().unwrap_or("")))
        .collect();
    assert!(zones.contains(&("berlin", "Europe/Berlin")) && zones.contains(&("ny", "America/New_York")), "{zones:?}");
    assert!(zones.contains(&("s1", "UTC")), "a store created without a time zone is on UTC: {zones:?}");

    // The report names the zone its day was computed in, also on the day the clocks go
    // back (a 25-hour day in Berlin).
    let day = app.get("/v1/stores/berlin/reconciliation?date=2026-10-25", &key).await;
    assert_eq!(day.status, StatusCode::OK, "{day:?}");
    assert_eq!(
        (day.body["timezone"].as_str(), day.body["counts"]["submitted"].as_u64()),
        (Some("Europe/Berlin"), Some(0))
    );
    let csv = app
        .http
        .get(format!("{}/v1/stores/ny/reconciliation?date=2026-11-01", app.base))
        .bearer_auth(&key)
        .header("accept", "text/csv")
        .send()
        .await
        .expect("csv");
    assert!(csv.text().await.expect("text").contains("report,timezone,America/New_York\n"));
}

async fn unknown_time_zones_are_refused_naming_the_field(app: &TestApp) {
    let key = app.tenant("acme").await;
    let mars = app.post("/v1/stores", &key, json!({"id": "mars", "name": "Mars", "timezone": "Mars/Olympus"})).await;
    assert_eq!((mars.status, mars.code()), (StatusCode::BAD_REQUEST, "invalid_request"), "{mars:?}");
    let message = mars.body["error"]["message"].as_str().unwrap_or("");
    assert!(message.starts_with("timezone: "), "{message}");
    assert!(message.contains("Mars/Olympus"), "says what was wrong: {message}");
    assert!(message.contains("\"Asia/Shanghai\"") && message.contains("\"+08:00\""), "gives examples: {message}");
    assert_eq!(app.get("/v1/stores/mars", &key).await.code(), "not_found", "nothing was stored");

    for bad in [json!("+15:00"), json!("+0800"), json!("08:00"), json!("+08:60"), json!("Etc/Unknown"), json!(480)] {
        let a = app.post("/v1/stores", &key, json!({"id": "bad", "name": "Bad", "timezone": bad})).await;
        assert_eq!(a.code(), "invalid_request", "{bad}: {a:?}");
        assert!(a.body["error"]["message"].as_str().unwrap_or("").contains("timezone"), "{bad}: {a:?}");
    }
    assert_eq!(app.get("/v1/stores/bad", &key).await.code(), "not_found");
}
