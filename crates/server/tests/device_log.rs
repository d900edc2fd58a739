//! The device log digest through the API, on SQLite and PostgreSQL: a store
//! agent uploads its journal's latest record per task (`POST /v1/agent/journal-digest`),
//! and the store's reconciliation report (JSON and CSV) lists where the device log and the
//! broker disagree.

mod common;

use common::{order, TestApp};
use reqwest::StatusCode;
use serde_json::{json, Value};

both_backends!(
    a_digest_is_stored_once_and_a_matching_day_shows_no_difference,
    the_report_lists_what_the_device_and_the_broker_disagree_on,
    malformed_digests_are_refused_whole,
    another_stores_agent_does_not_speak_for_this_store
);

async fn agent_token(app: &TestApp, key: &str, store: &str) -> String {
    let a = app.call("POST", &format!("/v1/stores/{store}/agent-tokens"), Some(key), None).await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    a.body["token"].as_str().expect("token").to_owned()
}

/// Submits `biz` to p1, has the agent take it and answer `outcome`; the task id.
async fn print(app: &TestApp, key: &str, token: &str, biz: &str, outcome: &str) -> String {
    let made = app.submit(key, order(biz, biz)).await;
    assert_eq!(made.status, StatusCode::CREATED, "{made:?}");
    let d = app.post("/v1/agent/poll", token, json!({"agent_id": "a1", "session": "s", "wait_ms": 2000})).await;
    let task = d.body["deliveries"][0]["task_id"].as_str().expect("a delivery").to_owned();
    assert_eq!(task, made.body["task_id"].as_str().unwrap_or(""), "{d:?}");
    let attempt = d.body["deliveries"][0]["attempt"].as_i64().unwrap_or(1);
    let a = app
        .post("/v1/agent/acks", token, json!({"acks": [{"task_id": task, "attempt": attempt, "outcome": outcome}]}))
        .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    task
}

fn record(task_id: &str, key: &str, state: &str, at: i64) -> Value {
    json!({"task_id": task_id, "key": key, "printer_id": "p1", "state": state, "at": at})
}

async fn digest(app: &TestApp, token: &str, records: Vec<Value>) -> crate::common::Answer {
    app.post("/v1/agent/journal-digest", token, json!({"agent_id": "a1", "records": records})).await
}

async fn report(app: &TestApp, key: &str) -> Value {
    let r = app.get(&format!("/v1/stores/s1/reconciliation?date={}", today()), key).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    r.body
}

async fn report_csv(app: &TestApp, key: &str) -> String {
    let res = app
        .http
        .get(format!("{}/v1/stores/s1/reconciliation?date={}", app.base, today()))
        .bearer_auth(key)
        .header("accept", "text/csv")
        .send()
        .await
        .expect("csv");
    assert_eq!(res.status(), StatusCode::OK);
    res.text().await.expect("text")
}

fn today() -> String {
    // The test stores are on UTC, so the business day is the UTC date.
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let days = (secs as i64).div_euclid(86_400);
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

async fn a_digest_is_stored_once_and_a_matching_day_shows_no_difference(app: &TestApp) {
    let key = app.tenant("acme").await;
    let token = agent_token(app, &key, "s1").await;
    let o1 = print(app, &key, &token, "O1", "printed").await;
    let o2 = print(app, &key, &token, "O2", "printed").await;

    // Before any upload the device side is unknown, and the report says so instead of
    // calling both printed tasks missing.
    let before = report(app, &key).await;
    assert_eq!(before["device_log"], "none", "{before}");
    assert_eq!(before["broker_printed_device_not"], json!([]));
    assert_eq!(
        before["device_counts"],
        json!({"records": 0, "device_printed": 0, "broker_printed": 2, "device_printed_broker_not": 0,
               "broker_printed_device_not": null})
    );
    assert!(report_csv(app, &key).await.contains("device_log,status,none\n"));

    let records = vec![record(&o1, "O1#p1", "printed", 1_000), record(&o2, "O2#p1", "printed", 1_001)];
    let up = digest(app, &token, records.clone()).await;
    assert_eq!((up.status, &up.body), (StatusCode::OK, &json!({"accepted": 2, "changed": 2})), "{up:?}");
    // The same digest again, and an older record of a task, change nothing.
    let again = digest(app, &token, records).await;
    assert_eq!(again.body, json!({"accepted": 2, "changed": 0}), "{again:?}");
    let older = digest(app, &token, vec![record(&o1, "O1#p1", "failed", 999)]).await;
    assert_eq!(older.body, json!({"accepted": 1, "changed": 0}), "{older:?}");
    assert_eq!(digest(app, &token, vec![]).await.body, json!({"accepted": 0, "changed": 0}));

    let day = report(app, &key).await;
    assert_eq!(day["device_log"], "present", "{day}");
    assert_eq!(day["device_printed_broker_not"], json!([]));
    assert_eq!(day["broker_printed_device_not"], json!([]));
    assert_eq!(
        day["device_counts"],
        json!({"records": 2, "device_printed": 2, "broker_printed": 2, "device_printed_broker_not": 0,
               "broker_printed_device_not": 0})
    );
    let csv = report_csv(app, &key).await;
    assert!(
        csv.contains("device_log,status,present\n")
            && csv.contains("device_count,records,2\n")
            && csv.contains("device_count,broker_printed_device_not,0\n"),
        "{csv}"
    );
}

async fn the_report_lists_what_the_device_and_the_broker_disagree_on(app: &TestApp) {
    let key = app.tenant("acme").await;
    let token = agent_token(app, &key, "s1").await;
    let agree = print(app, &key, &token, "O1", "printed").await;
    let unreported = print(app, &key, &token, "O2#kitchen", "printed").await;
    let doubted = print(app, &key, &token, "O3", "printed").await;
    let in_doubt = print(app, &key, &token, "O4", "in_doubt").await;
    // A task the agent printed under an id of its own (accepted on the shop's LAN, say)
    // that the broker has never heard of: the same creation time, other random bits.
    let last = if agree.ends_with('0') { '1' } else { '0' };
    let lan = format!("{}{last}", &agree[..25]);

    let up = digest(
        app,
        &token,
        vec![
            record(&agree, "O1#p1", "printed", 1),
            record(&doubted, "O3#p1", "in_doubt", 2),
            record(&in_doubt, "O4#p1", "printed", 3),
            record(&lan, "L1#p1", "printed", 4),
        ],
    )
    .await;
    assert_eq!(up.body, json!({"accepted": 4, "changed": 4}), "{up:?}");

    let day = report(app, &key).await;
    assert_eq!(day["device_log"], "present");
    let mut device_not: Vec<Value> = vec![
        json!({"task_id": in_doubt, "key": "O4#p1", "printer_id": "p1", "device_state": "printed",
               "broker_state": "in_doubt"}),
        json!({"task_id": lan, "key": "L1#p1", "printer_id": "p1", "device_state": "printed", "broker_state": null}),
    ];
    device_not.sort_by(|a, b| a["task_id"].as_str().cmp(&b["task_id"].as_str()));
    assert_eq!(day["device_printed_broker_not"], json!(device_not), "{day}");
    assert_eq!(
        day["broker_printed_device_not"],
        json!([
            // No record: the key as the broker sends it, `#` of the business number escaped.
            {"task_id": unreported, "key": "O2%23kitchen#p1", "printer_id": "p1", "device_state": null,
             "broker_state": "printed"},
            {"task_id": doubted, "key": "O3#p1", "printer_id": "p1", "device_state": "in_doubt",
             "broker_state": "printed"},
        ]),
        "{day}"
    );
    assert_eq!(
        day["device_counts"],
        json!({"records": 4, "device_printed": 3, "broker_printed": 3, "device_printed_broker_not": 2,
               "broker_printed_device_not": 2})
    );

    let csv = report_csv(app, &key).await;
    for line in [
        format!("device_printed_broker_not,{in_doubt},printer_id=p1;device_state=printed;broker_state=in_doubt;key=O4#p1\n"),
        format!("device_printed_broker_not,{lan},printer_id=p1;device_state=printed;broker_state=;key=L1#p1\n"),
        format!("broker_printed_device_not,{unreported},printer_id=p1;device_state=;broker_state=printed;key=O2%23kitchen#p1\n"),
        format!("broker_printed_device_not,{doubted},printer_id=p1;device_state=in_doubt;broker_state=printed;key=O3#p1\n"),
        "device_count,device_printed_broker_not,2\n".to_owned(),
    ] {
        assert!(csv.contains(&line), "{line} in\n{csv}");
    }

    // The device's later word settles a difference: the task it doubted it printed after all.
    let later = digest(app, &token, vec![record(&doubted, "O3#p1", "printed", 5)]).await;
    assert_eq!(later.body, json!({"accepted": 1, "changed": 1}));
    let day = report(app, &key).await;
    assert_eq!(day["broker_printed_device_not"].as_array().map(Vec::len), Some(1), "{day}");
    assert_eq!(day["broker_printed_device_not"][0]["task_id"], unreported.as_str());
}

async fn malformed_digests_are_refused_whole(app: &TestApp) {
    let key = app.tenant("acme").await;
    let token = agent_token(app, &key, "s1").await;
    let task = print(app, &key, &token, "O1", "printed").await;
    let good = record(&task, "O1#p1", "printed", 1);
    let with = |field: &str, value: Value| {
        let mut r = good.clone();
        r[field] = value;
        r
    };
    for (bad, names) in [
        (with("task_id", json!("T1")), "records[1].task_id"),
        (with("task_id", json!(task.to_lowercase())), "records[1].task_id"),
        (with("state", json!("started")), "records[1].state"),
        (with("printer_id", json!("p 1")), "records[1].printer_id"),
        (with("key", json!("")), "records[1].key"),
        (with("key", json!("a\u{7}b")), "records[1].key"),
        (with("at", json!(-1)), "records[1].at"),
        (with("at", json!(1.5)), "records[1].at"),
        (with("at", json!("1")), "records[1].at"),
        (with("extra", json!(1)), "records[1]"),
    ] {
        let a = digest(app, &token, vec![good.clone(), bad.clone()]).await;
        assert_eq!((a.status, a.code()), (StatusCode::BAD_REQUEST, "invalid_request"), "{bad}: {a:?}");
        let message = a.body["error"]["message"].as_str().unwrap_or("");
        assert!(message.starts_with(names), "{bad}: {message}");
    }
    let mut missing = good.clone();
    if let Some(o) = missing.as_object_mut() {
        o.remove("key");
    }
    assert_eq!(digest(app, &token, vec![missing]).await.code(), "invalid_request");
    let too_many = vec![good.clone(); 5001];
    let a = digest(app, &token, too_many).await;
    assert_eq!(a.code(), "invalid_request", "{a:?}");
    assert!(a.body["error"]["message"].as_str().unwrap_or("").contains("5000"), "{a:?}");
    for body in [
        json!({"records": [good]}),
        json!({"agent_id": "a 1", "records": [good]}),
        json!({"agent_id": "a1", "session": "s s", "records": [good]}),
        json!({"agent_id": "a1", "records": good}),
        json!([good]),
    ] {
        let a = app.post("/v1/agent/journal-digest", &token, body.clone()).await;
        assert_eq!(a.code(), "invalid_request", "{body}: {a:?}");
    }
    assert_eq!(
        app.post("/v1/agent/journal-digest", &key, json!({"agent_id": "a1", "records": []})).await.status,
        StatusCode::UNAUTHORIZED,
        "a tenant key is not an agent token"
    );
    assert_eq!(
        app.call("POST", "/v1/agent/journal-digest", None, Some(json!({"agent_id": "a1", "records": []}))).await.status,
        StatusCode::UNAUTHORIZED
    );

    // Nothing of any refused request was kept, the good record beside a bad one included.
    let day = report(app, &key).await;
    assert_eq!(day["device_log"], "none", "{day}");
    // 5000 records are taken.
    let at_most: Vec<Value> = (0..5000).map(|i| record(&task, "O1#p1", "printed", i)).collect();
    let a = digest(app, &token, at_most).await;
    assert_eq!(a.body, json!({"accepted": 5000, "changed": 1}), "the latest of one task's records: {a:?}");
}

async fn another_stores_agent_does_not_speak_for_this_store(app: &TestApp) {
    let key = app.tenant("acme").await;
    let token = agent_token(app, &key, "s1").await;
    let task = print(app, &key, &token, "O1", "printed").await;
    let made = app.post("/v1/stores", &key, json!({"id": "s2", "name": "Second"})).await;
    assert_eq!(made.status, StatusCode::CREATED, "{made:?}");
    let other = agent_token(app, &key, "s2").await;
    let up = digest(app, &other, vec![record(&task, "O1#p1", "failed", 1)]).await;
    assert_eq!(up.body, json!({"accepted": 1, "changed": 1}), "{up:?}");
    // s1 has no device log; s2's record names a task s2 does not have.
    assert_eq!(report(app, &key).await["device_log"], "none");
    let s2 = app.get(&format!("/v1/stores/s2/reconciliation?date={}", today()), &key).await;
    assert_eq!(s2.body["device_log"], "present", "{s2:?}");
    assert_eq!(s2.body["device_printed_broker_not"], json!([]), "a failed record is no print");
    let up = digest(app, &other, vec![record(&task, "O1#p1", "printed", 2)]).await;
    assert_eq!(up.body["changed"], 1);
    let s2 = app.get(&format!("/v1/stores/s2/reconciliation?date={}", today()), &key).await;
    assert_eq!(
        s2.body["device_printed_broker_not"],
        json!([{"task_id": task, "key": "O1#p1", "printer_id": "p1", "device_state": "printed", "broker_state": null}]),
        "the other store's task is not shown: {s2:?}"
    );
}
