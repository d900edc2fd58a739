//! Retention with the real binary, on SQLite and PostgreSQL.
//!
//! A broker with retention off takes a day of tasks: printed (by this test speaking the
//! agent protocol), cancelled, transferred to another printer and printed there, and one
//! left open. It is stopped and started again with `--retention-days 90` and its
//! retention clock 91 days ahead (the hidden test setting), so that those tasks are
//! finished and old. Then: every finished task is pruned and the open one kept; the
//! day's reconciliation (HTTP and `onceprint reconcile`) is identical before and after;
//! a late replay answers 200 with the same task id, the final state and `"pruned": true`,
//! creates nothing and charges nothing; different content is still 422; GET answers from
//! the tombstone, the trail is gone, a reprint is refused with 410.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::broker::{temp_dir, Api, Broker, BIN};
use serde_json::{json, Value};

const DAY_MS: i64 = 86_400_000;

/// Polls as agent `a1` and acknowledges every delivery as printed, until `want` tasks
/// have printed.
async fn print_as_agent(api: &Api, token: &str, want: usize) {
    let mut printed = 0;
    let start = Instant::now();
    while printed < want {
        assert!(start.elapsed() < Duration::from_secs(30), "only {printed} of {want} tasks printed");
        let (status, polled) =
            api.post_as(token, "/v1/agent/poll", json!({"agent_id": "a1", "wait_ms": 1000, "max": 16})).await;
        assert_eq!(status, 200, "{polled}");
        let acks: Vec<Value> = polled["deliveries"]
            .as_array()
            .expect("deliveries")
            .iter()
            .map(|d| json!({"task_id": d["task_id"], "attempt": d["attempt"], "outcome": "printed", "detail": "ok"}))
            .collect();
        if acks.is_empty() {
            continue;
        }
        let (status, results) = api.post_as(token, "/v1/agent/acks", json!({"acks": acks, "agent_id": "a1"})).await;
        assert_eq!(status, 200, "{results}");
        printed += results["results"].as_array().expect("results").iter().filter(|r| r["result"] == "applied").count();
    }
}

/// The day's report over HTTP and from `onceprint reconcile --json`.
async fn reports(api: &Api, date: &str) -> (Value, Value) {
    let (status, http) = api.get(&format!("/v1/stores/s1/reconciliation?date={date}")).await;
    assert_eq!(status, 200, "{http}");
    let out = Command::new(BIN)
        .args(["reconcile", "--server", &api.base, "--token", &api.key, "--store", "s1", "--date", date, "--json"])
        .output()
        .expect("onceprint reconcile");
    assert!(out.status.success(), "reconcile: {}", String::from_utf8_lossy(&out.stderr));
    let cli: Value = serde_json::from_slice(&out.stdout).expect("reconcile --json prints JSON");
    (http, cli)
}

async fn metric(base: &str, name: &str) -> Option<f64> {
    let text = reqwest::get(format!("{base}/metrics")).await.ok()?.text().await.ok()?;
    text.lines().find(|l| l.starts_with(name)).and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse().ok())
}

async fn late_replays_of_pruned_tasks(database: &str, dir: &std::path::Path) {
    let log = dir.join("broker.log");
    // Retention off for the day itself (0 is "keep for ever").
    let broker = Broker::start(database, &["--retention-days", "0"], &[], &log);
    let api = Api::tenant(&broker.base, "shop", "+08:00", &["p1", "p2"]).await;
    let (status, token) = api.post("/v1/stores/s1/agent-tokens", json!({})).await;
    assert_eq!(status, 201);
    let token = token["token"].as_str().expect("agent token").to_owned();

    let mut ids = std::collections::BTreeMap::new();
    for biz in ["P1", "P2", "P3"] {
        let (status, body) = api.submit(biz, "p1", &format!("order {biz}\n")).await;
        assert_eq!(status, 201, "{body}");
        ids.insert(biz, body["task_id"].as_str().expect("id").to_owned());
    }
    print_as_agent(&api, &token, 3).await;
    let (_, c1) = api.submit("C1", "p1", "order C1\n").await;
    ids.insert("C1", c1["task_id"].as_str().expect("id").to_owned());
    let (status, body) =
        api.post(&format!("/v1/print-tasks/{}/cancel", ids["C1"]), json!({"operator": "ann", "reason": "left"})).await;
    assert_eq!(status, 200, "{body}");
    let (_, t1) = api.submit("T1", "p1", "order T1\n").await;
    ids.insert("T1", t1["task_id"].as_str().expect("id").to_owned());
    let (status, moved) = api
        .post(
            &format!("/v1/print-tasks/{}/transfer", ids["T1"]),
            json!({"operator": "ann", "reason": "p1 jammed", "printer_id": "p2"}),
        )
        .await;
    assert_eq!(status, 201, "{moved}");
    let successor = moved["created"]["task_id"].as_str().expect("successor").to_owned();
    print_as_agent(&api, &token, 1).await;
    let (status, open) = api.submit("O1", "p1", "order O1\n").await;
    assert_eq!(status, 201);
    let open = open["task_id"].as_str().expect("id").to_owned();

    // The business day in the store's zone (+08:00) of the first task (ids carry their
    // creation time).
    let (created, _) = onceprint_core::TaskId::parts(&ids["P1"]).expect("a task id");
    let date = onceprint_engine::tz::parse("+08:00").expect("zone").local_date(created);
    let (http_before, cli_before) = reports(&api, &date).await;
    assert_eq!(http_before["counts"]["submitted"], 6, "{http_before}");
    assert_eq!(http_before["counts"]["printed"], 4, "{http_before}");
    assert_eq!(http_before["counts"]["open"], 1, "{http_before}");
    assert_eq!(http_before["ledger"]["charges"], 6, "{http_before}");
    assert!(broker.stop().success(), "SIGTERM → exit 0");

    // Again, with retention on and its clock 91 days ahead; runs every second.
    std::fs::write(dir.join("broker.toml"), "retention_interval_s = 1\n").expect("config");
    let config = dir.join("broker.toml").display().to_string();
    let broker = Broker::start(
        database,
        &["--retention-days", "90", "--config", &config],
        &[("ONCEPRINT_TEST_RETENTION_CLOCK_OFFSET_MS", (91 * DAY_MS).to_string())],
        &log,
    );
    let api = api.on(&broker.base);
    let start = Instant::now();
    while metric(&broker.base, "onceprint_retention_pruned_total{kind=\"task\"}").await != Some(6.0) {
        assert!(start.elapsed() < Duration::from_secs(30), "the finished tasks were not pruned in time");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(metric(&broker.base, "onceprint_retention_pruned_total{kind=\"event\"}").await.unwrap_or(0.0) >= 12.0);

    // The day's report is identical.
    let (http_after, cli_after) = reports(&api, &date).await;
    assert_eq!(http_after, http_before, "the reconciliation report changed when its tasks were pruned");
    assert_eq!(cli_after, cli_before);

    // Late replays: the same task, its final state, pruned; nothing new.
    for (biz, id, state) in [
        ("P1", ids["P1"].as_str(), "printed"),
        ("C1", ids["C1"].as_str(), "cancelled"),
        ("T1", successor.as_str(), "printed"),
    ] {
        let (status, body) = api.submit(biz, "p1", &format!("order {biz}\n")).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!((body["task_id"].as_str(), body["state"].as_str()), (Some(id), Some(state)), "{body}");
        assert_eq!((&body["duplicate"], &body["pruned"]), (&json!(true), &json!(true)), "{body}");
    }
    let (status, body) = api.submit("O1", "p1", "order O1\n").await;
    assert_eq!((status, body["task_id"].as_str()), (200, Some(open.as_str())), "{body}");
    assert_eq!(body.get("pruned"), None, "an open task is kept: {body}");
    let (status, body) = api.submit("P1", "p1", "another order\n").await;
    assert_eq!((status, body["error"]["code"].as_str()), (422, Some("idempotency_mismatch")), "{body}");
    let (http_replayed, _) = reports(&api, &date).await;
    assert_eq!(http_replayed, http_before, "a replay created a task or a charge");

    // What a pruned task's id still answers.
    let (status, task) = api.get(&format!("/v1/print-tasks/{}", ids["P1"])).await;
    assert_eq!(status, 200, "{task}");
    assert_eq!(
        (task["state"].as_str(), task["biz_no"].as_str(), &task["pruned"]),
        (Some("printed"), Some("P1"), &json!(true))
    );
    let (status, events) = api.get(&format!("/v1/print-tasks/{}/events", ids["P1"])).await;
    assert_eq!((status, &events), (200, &json!({"events": [], "pruned": true})));
    let (status, refused) =
        api.post(&format!("/v1/print-tasks/{}/reprint", ids["P1"]), json!({"operator": "ann", "reason": "copy"})).await;
    assert_eq!((status, refused["error"]["code"].as_str()), (410, Some("task_pruned")), "{refused}");
    let (_, kept) = api.get(&format!("/v1/print-tasks/{open}")).await;
    assert_eq!((kept["state"].as_str(), kept.get("pruned")), (Some("pending"), None));
    let (_, list) = api.get("/v1/print-tasks?limit=50").await;
    let listed: Vec<&str> =
        list["tasks"].as_array().expect("tasks").iter().filter_map(|t| t["task_id"].as_str()).collect();
    assert_eq!(listed, vec![open.as_str()], "only the kept task is listed");
    assert!(broker.stop().success(), "SIGTERM → exit 0");
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(log.contains("retention run: finished tasks pruned"), "one log line per run");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_replays_of_pruned_tasks_sqlite() {
    let dir = temp_dir("retention");
    late_replays_of_pruned_tasks(&format!("sqlite://{}/broker.db", dir.display()), &dir).await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_replays_of_pruned_tasks_postgres() {
    let Some(h) = onceprint_store_postgres::testing::fresh_store().await else { return };
    let dir = temp_dir("retention-pg");
    late_replays_of_pruned_tasks(&h.url, &dir).await;
    let _ = std::fs::remove_dir_all(dir);
    drop(h);
}
