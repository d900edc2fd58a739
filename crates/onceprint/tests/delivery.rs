//! Delivery end to end with the real binary: `onceprint serve`, `onceprint agent` and
//! `onceprint printer-sim` as separate processes on real sockets, the broker on SQLite or
//! PostgreSQL. "Printed" is judged by the simulator's paper log, never by the broker alone.

mod common;

use common::wait_line;
use common::world::*;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

macro_rules! both {
    ($($name:ident),*) => {
        mod sqlite { $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() { super::$name(false).await }
        )* }
        mod postgres { $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() { super::$name(true).await }
        )* }
    };
}

both!(
    submitted_ticket_prints_once_with_a_complete_audit_trail,
    printer_faults_retry_with_the_reason_then_print_once,
    killing_the_agent_mid_stream_prints_nothing_twice,
    killing_the_broker_mid_stream_loses_nothing,
    order_and_priority_hold_and_a_dead_printer_slows_no_one,
    past_its_wait_budget_a_paused_ticket_fails_with_the_reason,
    a_paper_out_pauses_the_lane_and_twenty_tickets_print_in_order_after_the_refill,
    a_station_fails_over_once_when_its_printer_stays_paused,
    a_lost_ack_is_answered_from_the_journal_without_a_second_print,
    a_crash_mid_job_waits_for_a_person_unless_the_policy_reprints,
    failover_prints_once_on_the_backup_and_the_primary_never_prints_it,
    an_operator_reprint_comes_out_marked_as_a_reprint,
    alerts_manual_actions_and_reconciliation_with_the_real_binary,
    a_chinese_kitchen_ticket_document_prints_the_right_characters,
    vendor_callbacks_with_good_bad_and_replayed_signatures,
    a_reconciliation_day_matches_the_hand_computed_report,
    the_shop_prints_offline_once_and_the_broker_merges_on_sync
);

fn sign(secret: &str, ts: i64, body: &str) -> String {
    format!("t={ts},v1={}", hmac_hex(secret, &format!("{ts}.{body}")))
}

fn unix_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

/// A vendor cloud that accepts jobs (202) and records their idempotency keys.
async fn vendor_cloud() -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    let keys: std::sync::Arc<std::sync::Mutex<Vec<String>>> = Default::default();
    let seen = keys.clone();
    let addr = tiny_http(move |head, _body| {
        seen.lock().expect("lock").push(header_value(head, "idempotency-key"));
        "202 Accepted"
    })
    .await;
    (format!("http://{addr}/jobs"), keys)
}

async fn vendor_callbacks_with_good_bad_and_replayed_signatures(pg: bool) {
    let Some(w) = World::start("callbacks", pg, 1).await else { return };
    let secret = "vendor-shared-secret-xyz";
    let (url, keys) = vendor_cloud().await;
    w.post(
        "/v1/printers",
        json!({"id": "cloud", "store_id": "s1", "transport": {"kind": "webhook", "url": url, "secret": secret}}),
    )
    .await;
    let t = w
        .post(
            "/v1/print-tasks",
            json!({"biz_no": "CB1", "printer_id": "cloud", "content": {"type": "text", "text": "x\n"}}),
        )
        .await;
    let id = t["task_id"].as_str().expect("id").to_owned();
    let start = Instant::now();
    while keys.lock().expect("lock").is_empty() {
        assert!(start.elapsed() < Duration::from_secs(10), "the job never reached the vendor\n{}", w.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        keys.lock().expect("lock")[0],
        "cb1#cloud",
        "Idempotency-Key: biz_no#printer_id (header read lower-cased)"
    );
    assert_eq!(w.state(&id).await["state"], "sent", "accepted by the vendor is not printed");
    let body = json!({"task_id": id, "status": "printed"}).to_string();
    let send = |sig: String| {
        w.http
            .post(format!("{}/v1/callbacks/cloud", w.base))
            .header("content-type", "application/json")
            .header("x-onceprint-signature", sig)
            .body(body.clone())
            .send()
    };
    assert_eq!(send(sign("wrong-secret-wrong-secret", unix_now(), &body)).await.expect("cb").status().as_u16(), 401);
    assert_eq!(send(sign(secret, unix_now() - 3600, &body)).await.expect("cb").status().as_u16(), 401, "replayed");
    let ok = send(sign(secret, unix_now(), &body)).await.expect("cb");
    assert_eq!(ok.status().as_u16(), 200);
    assert_eq!(ok.json::<Value>().await.expect("json")["result"], "applied");
    assert_eq!(w.state(&id).await["state"], "printed");
    let again = send(sign(secret, unix_now(), &body)).await.expect("cb").json::<Value>().await.expect("json");
    assert_eq!(again["result"], "duplicate", "idempotent: a finished task is not moved");
    let unknown = json!({"task_id": "01ZZZZZZZZZZZZZZZZZZZZZZZZ", "status": "printed"}).to_string();
    let res = w
        .http
        .post(format!("{}/v1/callbacks/cloud", w.base))
        .header("x-onceprint-signature", sign(secret, unix_now(), &unknown))
        .body(unknown)
        .send()
        .await
        .expect("cb");
    assert_eq!(res.status().as_u16(), 404);
}

async fn a_reconciliation_day_matches_the_hand_computed_report(pg: bool) {
    let Some(w) = World::start("recon", pg, 1).await else { return };
    // Orders "R1" and "R2" print, "R2" is reprinted, "R3" is cancelled before it can print
    // (paper out), "X1" prints but was not expected, "R4" is expected and never submitted.
    for m in ["R1", "R2"] {
        let id = w.submit(m, 0, "receipt").await;
        w.wait_state(&id, &["printed"], 20).await;
    }
    let r2 = w.get("/v1/print-tasks?biz_no=R2").await["tasks"][0]["task_id"].as_str().unwrap_or("").to_owned();
    let rp = w.post(&format!("/v1/print-tasks/{r2}/reprint"), json!({"operator": "amy", "reason": "torn"})).await;
    w.wait_state(rp["created"]["task_id"].as_str().unwrap_or(""), &["printed"], 20).await;
    w.faults(0, json!({"paper_out": true})).await;
    let r3 = w.submit("R3", 0, "receipt").await;
    w.wait_state(&r3, &["retrying"], 20).await;
    w.post(&format!("/v1/print-tasks/{r3}/cancel"), json!({"operator": "amy", "reason": "left"})).await;
    w.faults(0, json!({"paper_out": false})).await;
    let x1 = w.submit("X1", 0, "receipt").await;
    w.wait_state(&x1, &["printed"], 20).await;
    let date = w.state(&x1).await["created_at"].as_str().unwrap_or("").get(..10).unwrap_or("").to_owned();
    let mut got = w.post(&format!("/v1/stores/s1/reconciliation?date={date}"), json!(["R1", "R2", "R3", "R4"])).await;
    // The device log comparison depends on whether this agent uploads its
    // journal digest; whichever it does, the device and the broker must agree.
    for list in ["device_printed_broker_not", "broker_printed_device_not"] {
        assert_eq!(got[list], json!([]), "{list}: {got}");
    }
    assert_eq!(got["device_counts"]["broker_printed"], 4, "{got}");
    if let Some(o) = got.as_object_mut() {
        for k in ["device_log", "device_counts", "device_printed_broker_not", "broker_printed_device_not"] {
            o.remove(k);
        }
    }
    let expected = json!({
        "store_id": "s1", "date": date, "timezone": "UTC",
        "counts": {"submitted": 4, "printed": 3, "reprinted": 1, "failed": 0, "in_doubt": 0,
                   "transferred": 0, "cancelled": 1, "closed": 0, "open": 0},
        "ledger": {"charges": 5, "charged_amount": 5, "refunds": 1, "refunded_amount": 1},
        "expected": 4,
        "expected_not_printed": ["R3", "R4"],
        "printed_not_expected": ["X1"],
        "printed_more_than_once": []
    });
    assert_eq!(got, expected);
    assert_eq!(w.printed_count("R2"), 2, "the original and its reprint");
    assert_eq!(w.printed_count("R3"), 0);
}

async fn a_chinese_kitchen_ticket_document_prints_the_right_characters(pg: bool) {
    let Some(w) = World::start("cjk", pg, 1).await else { return };
    let path = format!("{}/../render/tests/fixtures/kitchen-ticket.json", env!("CARGO_MANIFEST_DIR"));
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("json");
    let t = w
        .post("/v1/print-tasks", json!({"biz_no": "CN1", "printer_id": "p0", "content": {"type": "doc", "doc": doc}}))
        .await;
    let id = t["task_id"].as_str().expect("id").to_owned();
    w.wait_state(&id, &["printed"], 20).await;
    let paper = w.paper();
    let text = paper.last().and_then(|j| j["text"].as_str()).unwrap_or("").to_owned();
    for needle in ["宫保鸡丁", "水煮牛肉", "扬州炒饭 Fried rice", "花生过敏"] {
        assert!(text.contains(needle), "{needle:?} missing from the paper log: {text}");
    }
    let markup =
        std::fs::read_to_string(format!("{}/../render/tests/fixtures/markup-ticket.txt", env!("CARGO_MANIFEST_DIR")))
            .expect("fixture");
    let t = w
        .post(
            "/v1/print-tasks",
            json!({"biz_no": "CN2", "printer_id": "p0", "content": {"type": "markup", "markup": markup}}),
        )
        .await;
    let id = t["task_id"].as_str().expect("id").to_owned();
    w.wait_state(&id, &["printed"], 20).await;
    let paper = w.paper();
    let last = paper.last().cloned().unwrap_or_default();
    assert!(last["text"].as_str().unwrap_or("").contains("酸辣土豆丝"), "{last}");
    assert_eq!(last["qr"][0], "https://example.com/o/0087", "{last}");
}

/// A webhook receiver that answers 500 to its first call, then 200; records
/// (signature header, body).
async fn alert_receiver() -> (String, Calls) {
    let got: Calls = Default::default();
    let seen = got.clone();
    let addr = tiny_http(move |head, body| {
        let mut g = seen.lock().expect("lock");
        g.push((header_value(head, "x-onceprint-signature"), body));
        if g.len() == 1 {
            "500 Internal Server Error"
        } else {
            "200 OK"
        }
    })
    .await;
    (format!("http://{addr}/alerts"), got)
}

fn hmac_hex(secret: &str, msg: &str) -> String {
    use hmac::Mac;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).expect("key");
    mac.update(msg.as_bytes());
    mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect()
}

async fn alerts_manual_actions_and_reconciliation_with_the_real_binary(pg: bool) {
    let Some(w) = World::start("ops", pg, 1).await else { return };
    let (url, got) = alert_receiver().await;
    let secret = "ops-webhook-secret-0123";
    w.post("/v1/webhooks", json!({"id": "ops", "url": url, "secret": secret, "events": ["task.failed"]})).await;
    // A cover left open past the label's wait budget: failed, and an alert.
    w.faults(0, json!({"cover_open": true})).await;
    let failed = w.submit("OPS1", 0, "label").await;
    w.wait_state(&failed, &["failed"], 30).await;
    let start = Instant::now();
    while got.lock().expect("lock").len() < 2 {
        assert!(start.elapsed() < Duration::from_secs(15), "alert not retried: {:?}", got.lock().expect("lock"));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let calls = got.lock().expect("lock").clone();
    for (sig, body) in &calls {
        let (t, v1) =
            sig.split_once(',').map(|(t, v)| (t.trim_start_matches("t="), v.trim_start_matches("v1="))).expect("sig");
        assert_eq!(hmac_hex(secret, &format!("{t}.{body}")), v1, "signature verifies");
        let v: Value = serde_json::from_str(body).expect("json");
        assert_eq!((v["type"].as_str(), v["data"]["task_id"].as_str()), (Some("task.failed"), Some(failed.as_str())));
    }
    // Forbidden: mark-printed of a pending task. Allowed: cancel it, reprint nothing.
    w.faults(0, json!({"cover_open": false})).await;
    let ok = w.submit("OPS2", 0, "receipt").await;
    w.wait_state(&ok, &["printed"], 20).await;
    let res = w
        .http
        .post(format!("{}/v1/print-tasks/{ok}/cancel", w.base))
        .bearer_auth(&w.key)
        .json(&json!({"operator": "amy", "reason": "test"}))
        .send()
        .await
        .expect("cancel");
    assert_eq!(res.status().as_u16(), 409, "a printed task cannot be cancelled");
    let closed = w
        .post(&format!("/v1/print-tasks/{failed}/mark-printed"), json!({"operator": "amy", "reason": "found it"}))
        .await;
    assert_eq!(closed["task"]["state"], "closed");

    // The day, from cron: OPS3 was expected and never came.
    let csv = w.dir.join("orders.csv");
    std::fs::write(&csv, "biz_no\nOPS1\nOPS2\nOPS3\n").expect("csv");
    let today = w.get("/v1/print-tasks?limit=1").await["tasks"][0]["created_at"]
        .as_str()
        .unwrap_or("")
        .get(..10)
        .unwrap_or("")
        .to_owned();
    let out = Command::new(BIN)
        .args(["reconcile", "--server", &w.base, "--token", &w.key, "--store", "s1", "--date", &today])
        .arg("--expected")
        .arg(&csv)
        .output()
        .expect("reconcile");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "differences exit 1: {text}");
    assert!(text.contains("expected but not printed (1): OPS3"), "{text}");
    assert!(!text.contains("MORE THAN ONCE"), "{text}");
    std::fs::write(&csv, "OPS1\nOPS2\n").expect("csv");
    let out = Command::new(BIN)
        .args(["reconcile", "--server", &w.base, "--token", &w.key, "--store", "s1", "--date", &today, "--csv"])
        .arg("--expected")
        .arg(&csv)
        .output()
        .expect("reconcile");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(String::from_utf8_lossy(&out.stdout).contains("count,submitted,2"));
}

async fn failover_prints_once_on_the_backup_and_the_primary_never_prints_it(pg: bool) {
    let Some(w) = World::start("failover", pg, 2).await else { return };
    w.post("/v1/stations", json!({"id": "hot", "store_id": "s1", "printers": ["p0", "p1"]})).await;
    w.faults(0, json!({"offline": true})).await;
    let body = json!({"biz_no": "H1", "station_id": "hot",
                      "content": {"type": "text", "text": "TICKET H1\n1 x Noodles\n"}});
    let id = w.post("/v1/print-tasks", body.clone()).await["task_id"].as_str().expect("id").to_owned();
    let orig = w.wait_state(&id, &["transferred"], 30).await;
    let succ = orig["successor_task_id"].as_str().expect("successor").to_owned();
    w.wait_state(&succ, &["printed"], 30).await;
    // The primary comes back: it must print nothing.
    w.faults(0, json!({"offline": false})).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let on = |port: u16| w.paper().iter().filter(|j| j["printer"] == format!("127.0.0.1:{port}")).count();
    assert_eq!((on(w.sim_base_port), on(w.sim_base_port + 1)), (0, 1), "{:?}", w.paper());
    assert_eq!(w.printed_count("H1"), 1);
    // A retry of the order answers with the live task of the chain.
    let again = w.post("/v1/print-tasks", body).await;
    assert_eq!((again["task_id"].as_str(), again["state"].as_str()), (Some(succ.as_str()), Some("printed")));
}

async fn an_operator_reprint_comes_out_marked_as_a_reprint(pg: bool) {
    let Some(w) = World::start("reprint", pg, 1).await else { return };
    let id = w.submit("RP1", 0, "receipt").await;
    w.wait_state(&id, &["printed"], 20).await;
    let r = w.post(&format!("/v1/print-tasks/{id}/reprint"), json!({"operator": "alice", "reason": "torn"})).await;
    let reprint = r["created"]["task_id"].as_str().expect("reprint").to_owned();
    w.wait_state(&reprint, &["printed"], 20).await;
    let jobs: Vec<String> = w
        .paper()
        .iter()
        .filter_map(|j| j["text"].as_str().map(str::to_owned))
        .filter(|t| t.contains("TICKET RP1"))
        .collect();
    assert_eq!(jobs.len(), 2, "{jobs:?}");
    assert!(!jobs[0].contains("REPRINT"));
    assert!(jobs[1].starts_with("*** REPRINT 1 ***\n"), "{:?}", jobs[1]);
}

async fn a_crash_mid_job_waits_for_a_person_unless_the_policy_reprints(pg: bool) {
    let Some(w) = World::start("doubt", pg, 1).await else { return };
    // The printer prints the job, then drops the connection before its printed-ACK.
    w.faults(0, json!({"crash_mid_job": 1})).await;
    let id = w.submit("D1", 0, "receipt").await;
    let t = w.wait_state(&id, &["in_doubt"], 20).await;
    assert_eq!(t["last_error"], "in_doubt");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(w.printed_count("D1"), 1, "in doubt: never printed again by the system");
    assert_eq!(w.state(&id).await["state"], "in_doubt");
    // Kitchen tickets here reprint on doubt: a second copy beats a missing dish.
    w.faults(0, json!({"crash_mid_job": 1})).await;
    let id = w.submit("K1", 0, "kitchen").await;
    let t = w.wait_state(&id, &["printed"], 20).await;
    assert_eq!(t["attempts"], 2, "{t}");
    assert_eq!(w.printed_count("K1"), 2, "the policy asked for the reprint");
}

async fn a_lost_ack_is_answered_from_the_journal_without_a_second_print(pg: bool) {
    let Some(mut w) = World::start("lostack", pg, 1).await else { return };
    let faults = ProxyFaults::default();
    faults.drop_acks.store(true, std::sync::atomic::Ordering::SeqCst);
    let drop_acks = faults.drop_acks.clone();
    let proxy = chaos_proxy(w.base.clone(), faults).await;
    World::kill9(&mut w.agent);
    w.agent_server = Some(proxy);
    w.start_agent();
    let id = w.submit("L1", 0, "receipt").await;
    // Printed on paper, but the broker has not heard: still sent.
    let start = Instant::now();
    while w.printed_count("L1") == 0 {
        assert!(start.elapsed() < Duration::from_secs(20), "never printed\n{}", w.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(w.state(&id).await["state"], "sent");
    // Past the delivery deadline the broker offers it again; the agent answers from its
    // journal. Let acks through only after that redelivery happened.
    let start = Instant::now();
    while !w.events(&id).await.contains(&("sent".into(), "sent".into())) {
        assert!(start.elapsed() < Duration::from_secs(20), "no redelivery\n{}", w.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop_acks.store(false, std::sync::atomic::Ordering::SeqCst);
    let t = w.wait_state(&id, &["printed"], 30).await;
    // Offered again as a new attempt (the attempt is the fencing token), which the agent
    // answered from its journal without printing.
    assert!(t["attempts"].as_i64() >= Some(2), "{t}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(w.printed_count("L1"), 1, "one sheet of paper");
}

async fn submitted_ticket_prints_once_with_a_complete_audit_trail(pg: bool) {
    let Some(w) = World::start("basic", pg, 1).await else { return };
    let id = w.submit("A1001", 0, "receipt").await;
    let t = w.wait_state(&id, &["printed"], 20).await;
    assert_eq!(t["attempts"], 1);
    assert!(t["printed_at"].is_string());
    assert_eq!(w.printed_count("A1001"), 1, "{:?}", w.paper());
    let path = w.events(&id).await;
    assert_eq!(
        path,
        vec![("-".into(), "pending".into()), ("pending".into(), "sent".into()), ("sent".into(), "printed".into())]
    );
    let p = w.get("/v1/printers/p0").await;
    assert_eq!(p["online"], true, "{p}");
    assert!(p["last_seen_at"].is_string());
}

async fn printer_faults_retry_with_the_reason_then_print_once(pg: bool) {
    let Some(w) = World::start("faults", pg, 1).await else { return };
    for (fault, reason) in [("paper_out", "no_paper"), ("cover_open", "cover_open"), ("offline", "offline")] {
        w.faults(0, json!({ fault: true })).await;
        let marker = format!("F-{reason}");
        let id = w.submit(&marker, 0, "receipt").await;
        let t = w.wait_state(&id, &["retrying"], 20).await;
        assert_eq!(t["last_error"], reason, "{t}");
        // The printer row follows the task's change right after it (a separate write).
        let p = w.wait_printer(|p| p["last_error"] == reason, 5).await;
        assert!(p["paused_since"].is_string(), "the printer's state holds its lane: {p}");
        assert_eq!(w.printed_count(&marker), 0);
        w.faults(0, json!({ fault: false })).await;
        w.wait_state(&id, &["printed"], 20).await;
        assert_eq!(w.printed_count(&marker), 1, "printed exactly once after {fault}");
    }
}

async fn killing_the_agent_mid_stream_prints_nothing_twice(pg: bool) {
    // Slow printers, so that the kill lands in the middle of jobs.
    let Some(mut w) = World::start_with("agentkill", pg, 2, &["--slow-ms", "25"]).await else { return };
    let mut ids = BTreeMap::new();
    for i in 0..60 {
        let m = format!("K{i}");
        ids.insert(m.clone(), w.submit(&m, (i % 2) as u16, "receipt").await);
        if i == 25 {
            World::kill9(&mut w.agent);
            tokio::time::sleep(Duration::from_millis(300)).await;
            w.start_agent();
        }
    }
    let mut in_doubt = 0;
    for (m, id) in &ids {
        let t = w.wait_state(id, &["printed", "in_doubt"], 30).await;
        let n = w.printed_count(m);
        assert!(n <= 1, "{m} printed {n} times");
        if t["state"] == "in_doubt" {
            in_doubt += 1;
        } else {
            assert_eq!(n, 1, "{m} is printed but not on paper");
        }
    }
    assert!(in_doubt <= 2, "only a job cut off per printer may be in doubt, got {in_doubt}");
}

async fn killing_the_broker_mid_stream_loses_nothing(pg: bool) {
    let Some(mut w) = World::start_with("brokerkill", pg, 2, &["--slow-ms", "10"]).await else { return };
    let mut ids = BTreeMap::new();
    for i in 0..40 {
        let m = format!("B{i}");
        ids.insert(m.clone(), w.submit(&m, (i % 2) as u16, "receipt").await);
    }
    World::kill9(&mut w.broker);
    w.start_broker();
    // The agent keeps its old server URL: restart it against the new port (a real broker
    // restarts on its fixed address; the port here is chosen by the OS).
    World::kill9(&mut w.agent);
    w.start_agent();
    for i in 40..60 {
        let m = format!("B{i}");
        ids.insert(m.clone(), w.submit(&m, (i % 2) as u16, "receipt").await);
    }
    for (m, id) in &ids {
        let t = w.wait_state(id, &["printed", "in_doubt"], 30).await;
        let n = w.printed_count(m);
        assert!(n <= 1, "{m} printed {n} times");
        if t["state"] == "printed" {
            assert_eq!(n, 1, "{m}");
        }
    }
}

/// Two broker nodes on one PostgreSQL schema; the agent is given both (`--server A,B`),
/// prints through A, A is killed with kill -9 mid-stream, and the agent carries on
/// through B with the same session: every ticket comes out once, none is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_given_two_nodes_fails_over_when_one_is_killed() {
    let Some(mut w) = World::start_with("failover", true, 2, &["--slow-ms", "10"]).await else { return };
    let node_a = w.base.clone();
    let args: Vec<String> = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--database",
        &w.database,
        "--admin-token",
        ADMIN,
        "--config",
        &w.dir.join("broker.toml").display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut b = spawn(&args, &w.dir.join("broker-b.log"));
    let node_b = wait_line(&mut b, "listening on ");
    let _b = Reaped(b);
    // The agent started by `World` knows only node A: restart it with both nodes, as a
    // comma list (the repeated flag is checked by the agent's own tests).
    World::kill9(&mut w.agent);
    w.agent_server = Some(format!("{node_a},{node_b}"));
    w.start_agent();

    let mut ids = BTreeMap::new();
    for i in 0..30 {
        let m = format!("F{i}");
        ids.insert(m.clone(), w.submit(&m, (i % 2) as u16, "receipt").await);
    }
    // Some printed through A, then A dies with work in flight.
    w.wait_state(&ids["F3"], &["printed", "in_doubt"], 30).await;
    World::kill9(&mut w.broker);
    w.base = node_b.clone();
    for i in 30..60 {
        let m = format!("F{i}");
        ids.insert(m.clone(), w.submit(&m, (i % 2) as u16, "receipt").await);
    }
    let mut in_doubt = 0;
    for (m, id) in &ids {
        let t = w.wait_state(id, &["printed", "in_doubt"], 60).await;
        let n = w.printed_count(m);
        assert!(n <= 1, "{m} printed {n} times");
        if t["state"] == "printed" {
            assert_eq!(n, 1, "{m} is printed but not on paper");
        } else {
            in_doubt += 1;
        }
    }
    // At most the job each printer was printing when A died may end in doubt; a job whose
    // ack did not reach A is not among them, its ack is retried on B.
    assert!(in_doubt <= 2, "{in_doubt} in doubt");
    let log = std::fs::read_to_string(w.dir.join("agent.log")).unwrap_or_default();
    assert!(
        log.contains("failing over to the next broker") && log.contains(node_b.trim_start_matches("http://")),
        "the agent says which broker it left and which it uses:\n{}",
        w.logs()
    );
}

async fn order_and_priority_hold_and_a_dead_printer_slows_no_one(pg: bool) {
    let Some(w) = World::start("order", pg, 2).await else { return };
    // Printer 1 is dead for the whole test; printer 0 must not notice.
    w.faults(1, json!({"offline": true})).await;
    w.faults(0, json!({"paper_out": true})).await;
    let mut expected = Vec::new();
    for i in 0..5 {
        let m = format!("O{i}");
        w.submit(&m, 0, "receipt").await;
        expected.push(m);
    }
    w.submit("DEAD", 1, "receipt").await;
    // A refund submitted last goes before the queued receipts that have not left yet.
    let refund = w.submit("R0", 0, "refund").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    w.faults(0, json!({"paper_out": false})).await;
    w.wait_state(&refund, &["printed"], 20).await;
    let start = Instant::now();
    for m in &expected {
        let id = w.get(&format!("/v1/print-tasks?biz_no={m}")).await["tasks"][0]["task_id"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        w.wait_state(&id, &["printed"], 20).await;
    }
    assert!(start.elapsed() < Duration::from_secs(10), "printer 0 was slowed down");
    let order: Vec<String> = w
        .paper()
        .iter()
        .filter(|j| j["printer"] == format!("127.0.0.1:{}", w.sim_base_port))
        .filter_map(|j| {
            j["text"].as_str().and_then(|t| t.lines().next()).map(|l| l.trim_start_matches("TICKET ").to_owned())
        })
        .collect();
    // The refund (priority 0) overtakes the queued receipts; the receipts keep their order.
    let pos = |m: &str| order.iter().position(|x| x == m).unwrap_or(usize::MAX);
    for pair in expected.windows(2) {
        assert!(pos(&pair[0]) < pos(&pair[1]), "FIFO broken: {order:?}");
    }
    assert!(pos("R0") < pos("O4"), "the refund should overtake queued receipts: {order:?}");
    assert_eq!(order.len(), 6, "{order:?}");
}

/// Past its print type's `max_wait_ms` (2.5 s for `label` here), a ticket waiting for a
/// paused printer fails with the printer's reason, and only then.
async fn past_its_wait_budget_a_paused_ticket_fails_with_the_reason(pg: bool) {
    let Some(w) = World::start("failed", pg, 1).await else { return };
    w.faults(0, json!({"cover_open": true})).await;
    let start = Instant::now();
    let id = w.submit("X1", 0, "label").await;
    let t = w.wait_state(&id, &["failed"], 30).await;
    assert!(start.elapsed() >= Duration::from_millis(2_400), "failed before its budget: {:?}", start.elapsed());
    assert_eq!(t["last_error"], "cover_open", "{t}");
    let trail = w.get(&format!("/v1/print-tasks/{id}/events")).await;
    let last = trail["events"].as_array().and_then(|e| e.last()).cloned().unwrap_or_default();
    let why = last["reason"].as_str().unwrap_or("");
    assert!(why.contains("cover_open") && why.contains("max_wait_ms"), "{last}");
    let failed = w.get("/v1/print-tasks?store_id=s1&state=failed").await;
    assert_eq!(failed["tasks"][0]["task_id"], id.as_str());
    assert_eq!(w.printed_count("X1"), 0);
}

/// The alert kinds a receiver got, in order.
fn kinds(got: &Calls) -> Vec<String> {
    got.lock()
        .expect("lock")
        .iter()
        .filter_map(|(_, b)| serde_json::from_str::<Value>(b).ok())
        .map(|v| v["type"].as_str().unwrap_or("?").to_owned())
        .collect()
}

/// Paused lanes end to end: a printer out of paper for two minutes (`ONCEPRINT_TEST_PAPER_OUT_S`
/// shortens it) with 20 tickets waiting. The lane pauses: no ticket fails or spends its
/// attempts, one `printer.paused` alert goes out, not one per ticket; after the refill the
/// printer's status report resumes the lane, one `printer.resumed` alert goes out, and all
/// 20 print once each, in the order they came.
async fn a_paper_out_pauses_the_lane_and_twenty_tickets_print_in_order_after_the_refill(pg: bool) {
    let Some(w) = World::start("paperout", pg, 1).await else { return };
    let (url, got) = recording_receiver().await;
    w.post(
        "/v1/webhooks",
        json!({"id": "ops", "url": url, "events": ["task.failed", "printer.paused", "printer.resumed"]}),
    )
    .await;
    // The shop's chat group hears of it too, in the group robot's own message.
    let (robot, group) = wecom_robot().await;
    w.post(
        "/v1/webhooks",
        json!({"id": "group", "url": robot, "format": "wecom", "events": ["printer.paused", "printer.resumed"]}),
    )
    .await;
    w.faults(0, json!({"paper_out": true})).await;
    let mut ids = Vec::new();
    for i in 0..20 {
        ids.push(w.submit(&format!("P{i:02}"), 0, "receipt").await);
    }
    let head = w.wait_state(&ids[0], &["retrying"], 20).await;
    assert_eq!(head["last_error"], "no_paper", "{head}");
    let paused = w.wait_printer(|p| p["paused_since"].is_string(), 5).await;
    assert_eq!(paused["last_error"], "no_paper", "{paused}");
    let secs: u64 = std::env::var("ONCEPRINT_TEST_PAPER_OUT_S").ok().and_then(|s| s.parse().ok()).unwrap_or(120);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(secs) {
        let failed = w.get("/v1/print-tasks?store_id=s1&state=failed").await;
        assert_eq!(failed["tasks"].as_array().map(Vec::len), Some(0), "a ticket failed during the paper-out: {failed}");
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    // Offered again and again (the attempt number grows), far past max_attempts = 3.
    let head = w.state(&ids[0]).await;
    assert_eq!(head["state"], "retrying", "{head}");
    assert!(head["attempts"].as_i64() > Some(3), "{head}");
    assert_eq!(w.paper().len(), 0, "nothing printed without paper");
    w.faults(0, json!({"paper_out": false})).await;
    let refilled = Instant::now();
    for id in &ids {
        w.wait_state(id, &["printed"], 30).await;
    }
    let resumed_in = refilled.elapsed();
    let order: Vec<String> = w
        .paper()
        .iter()
        .filter_map(|j| {
            j["text"].as_str().and_then(|t| t.lines().next()).map(|l| l.trim_start_matches("TICKET ").to_owned())
        })
        .collect();
    let expected: Vec<String> = (0..20).map(|i| format!("P{i:02}")).collect();
    assert_eq!(order, expected, "all 20 once each, in order");
    let p = w.wait_printer(|p| p["paused_since"].is_null(), 5).await;
    assert!(p["last_error"].is_null(), "{p}");
    // Alerts: one pause and one recovery for the printer; no ticket failed.
    let start = Instant::now();
    while kinds(&got).len() < 2 && start.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(kinds(&got), vec!["printer.paused", "printer.resumed"], "resumed {resumed_in:?} after the refill");
    let calls = got.lock().expect("lock").clone();
    let pause: Value = serde_json::from_str(&calls[0].1).expect("json");
    assert_eq!(
        (pause["data"]["printer_id"].as_str(), pause["data"]["reason"].as_str()),
        (Some("p0"), Some("no_paper"))
    );
    // The group got one message that the printer stopped and one that it is back, each a
    // WeCom text message, in both languages.
    let start = Instant::now();
    while group.lock().expect("lock").len() < 2 && start.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let texts: Vec<String> = group
        .lock()
        .expect("lock")
        .iter()
        .filter_map(|(_, b)| serde_json::from_str::<Value>(b).ok())
        .map(|v| {
            assert_eq!(v["msgtype"], "text", "{v}");
            v["text"]["content"].as_str().unwrap_or_default().to_owned()
        })
        .collect();
    assert_eq!(texts.len(), 2, "one message each way: {texts:?}");
    assert!(texts[0].contains("打印机暂停 Printer paused") && texts[0].contains("p0"), "{texts:?}");
    assert!(texts[1].contains("打印机恢复正常 Printer back to normal") && texts[1].contains("p0"), "{texts:?}");
}

/// A station's printer that stays paused past the station threshold (3 s here) hands the
/// station's tickets to the next printer: each ticket fails over once, prints once on the
/// backup, and the primary prints none of them after its refill.
async fn a_station_fails_over_once_when_its_printer_stays_paused(pg: bool) {
    let Some(w) = World::start("stationpause", pg, 2).await else { return };
    w.post("/v1/stations", json!({"id": "hot", "store_id": "s1", "printers": ["p0", "p1"]})).await;
    w.faults(0, json!({"paper_out": true})).await;
    let start = Instant::now();
    let mut ids = Vec::new();
    for i in 0..5 {
        let body = json!({"biz_no": format!("S{i}"), "station_id": "hot",
                          "content": {"type": "text", "text": format!("TICKET S{i}\n1 x Noodles\n")}});
        ids.push(w.post("/v1/print-tasks", body).await["task_id"].as_str().expect("id").to_owned());
    }
    let first = w.wait_state(&ids[0], &["transferred"], 30).await;
    assert!(start.elapsed() >= Duration::from_millis(2_900), "failed over before the threshold: {:?}", start.elapsed());
    assert_eq!(first["last_error"], "no_paper", "{first}");
    for id in &ids {
        let t = w.wait_state(id, &["transferred"], 30).await;
        let succ = t["successor_task_id"].as_str().expect("successor").to_owned();
        let s = w.wait_state(&succ, &["printed"], 30).await;
        assert_eq!((s["printer_id"].as_str(), s["origin_kind"].as_str()), (Some("p1"), Some("failover")), "{s}");
        assert!(s["successor_task_id"].is_null(), "one failover per ticket: {s}");
        let moved: Vec<(String, String)> = w.events(id).await;
        assert_eq!(moved.iter().filter(|e| e.1 == "transferred").count(), 1, "{moved:?}");
    }
    w.faults(0, json!({"paper_out": false})).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let on = |port: u16| w.paper().iter().filter(|j| j["printer"] == format!("127.0.0.1:{port}")).count();
    assert_eq!((on(w.sim_base_port), on(w.sim_base_port + 1)), (0, 5), "{:?}", w.paper());
    for i in 0..5 {
        assert_eq!(w.printed_count(&format!("S{i}")), 1);
    }
}

async fn the_shop_prints_offline_once_and_the_broker_merges_on_sync(pg: bool) {
    use std::sync::atomic::Ordering;
    let Some(mut w) = World::start("offline", pg, 1).await else { return };
    let (faults, pos) = w.with_lan_listener().await;

    // Online: the agent forwards, and the POS gets the broker's own answer.
    let (status, offline, on1) = pos.ticket("ON1", &ticket_text("ON1")).await;
    assert_eq!((status, offline), (201, false), "{on1}");
    let on1 = on1["task_id"].as_str().expect("task id").to_owned();
    w.wait_state(&on1, &["printed"], 20).await;

    // The uplink drops: the agent answers from its own outbox, as the broker would.
    faults.blackhole.store(true, Ordering::SeqCst);
    let (status, offline, off1) = pos.ticket("OFF1", &ticket_text("OFF1")).await;
    assert_eq!((status, offline), (201, true), "{off1}");
    let off1 = off1["task_id"].as_str().expect("task id").to_owned();
    let (status, _, again) = pos.ticket("OFF1", &ticket_text("OFF1")).await;
    assert_eq!((status, again["task_id"].as_str(), again["duplicate"].as_bool()), (200, Some(&*off1), Some(true)));
    let (status, _, other) = pos.ticket("OFF1", "TICKET OFF1\n2 x Noodles\n").await;
    assert_eq!((status, other["error"]["code"].as_str()), (422, Some("idempotency_mismatch")), "{other}");
    let (status, _, missing) =
        pos.send(&pos.key, json!({"printer_id": "p0", "content": {"type": "text", "text": "x"}})).await;
    assert_eq!((status, missing["error"]["code"].as_str()), (400, Some("missing_biz_no")), "{missing}");
    let (status, _, _) = pos.send("opl_wrong", json!({"biz_no": "X", "printer_id": "p0"})).await;
    assert_eq!(status, 401, "a wrong LAN key is refused");
    let (status, _, unknown) = pos
        .send(&pos.key, json!({"biz_no": "U1", "printer_id": "nope", "content": {"type": "text", "text": "x"}}))
        .await;
    assert_eq!(status, 400, "{unknown}");

    // The same order reaches the cloud (the broker is up; only the shop's uplink is down)
    // and the LAN; and another order reaches both with different content.
    let both_cloud = w.submit("BOTH1", 0, "receipt").await;
    let (status, offline, both_lan) = pos.ticket("BOTH1", &ticket_text("BOTH1")).await;
    assert_eq!((status, offline), (201, true));
    let both_lan = both_lan["task_id"].as_str().expect("task id").to_owned();
    let mis_cloud = w
        .post(
            "/v1/print-tasks",
            json!({"biz_no": "MIS1", "printer_id": "p0", "content": {"type": "text", "text": "TICKET MIS1\ncloud\n"}}),
        )
        .await["task_id"]
        .as_str()
        .expect("task id")
        .to_owned();
    let (status, _, mis_lan) = pos.ticket("MIS1", "TICKET MIS1\nlan\n").await;
    assert_eq!(status, 201, "{mis_lan}");
    for m in ["OFF1", "BOTH1", "MIS1"] {
        w.wait_printed(m, 20).await;
    }

    // kill -9 while offline, right after the answer, with the ticket still waiting for its
    // printer: nothing lost, nothing twice. The printer says it is offline until the new
    // process runs, so that the kill lands before any of the ticket was sent (a kill after
    // the agent journaled `started` leaves it in doubt for a person, rightly, and on a
    // loaded machine that moment came first now and then).
    w.faults(0, json!({"offline": true})).await;
    let (status, _, off2) = pos.ticket("OFF2", &ticket_text("OFF2")).await;
    assert_eq!(status, 201);
    let off2 = off2["task_id"].as_str().expect("task id").to_owned();
    World::kill9(&mut w.agent);
    w.start_agent();
    w.faults(0, json!({"offline": false})).await;
    w.wait_printed("OFF2", 30).await;

    // The uplink is back: the agent hands its offline work to the broker.
    faults.blackhole.store(false, Ordering::SeqCst);
    let t = w.wait_known(&off1, &["printed"], 60).await;
    assert_eq!(t["task_id"], *off1, "the LAN answer's task id stays valid");
    let events = w.get(&format!("/v1/print-tasks/{off1}/events")).await.to_string();
    assert!(events.contains("lan:"), "the audit trail shows the LAN path: {events}");
    w.wait_known(&off2, &["printed"], 60).await;
    // One task for the order that reached both, printed once; the LAN id names it too.
    w.wait_state(&both_cloud, &["printed"], 60).await;
    let merged = w.wait_known(&both_lan, &["printed"], 60).await;
    assert_eq!(merged["task_id"], *both_cloud, "the LAN id answers with the merged task");
    // Conflicting content under one key goes to a person, and nothing more prints.
    w.wait_state(&mis_cloud, &["in_doubt"], 60).await;
    let attention = w.get("/v1/stores/s1/attention").await.to_string();
    assert!(attention.contains(&mis_cloud), "{attention}");
    // Retries now reach the broker, which knows the offline task.
    let (status, offline, again) = pos.ticket("OFF1", &ticket_text("OFF1")).await;
    assert_eq!((status, offline), (200, false), "{again}");
    assert_eq!(again["task_id"], *off1);

    tokio::time::sleep(Duration::from_secs(2)).await;
    for m in ["ON1", "OFF1", "OFF2", "BOTH1", "MIS1"] {
        assert_eq!(w.printed_count(m), 1, "{m} printed once\n{}", w.logs());
    }
    let paper = w.paper().iter().map(|j| j["text"].as_str().unwrap_or("").to_owned()).collect::<Vec<_>>();
    assert!(!paper.iter().any(|t| t.contains("TICKET MIS1\ncloud")), "the conflicting cloud ticket never printed");
    // Both paths in the merged task's audit trail.
    let both_events = w.get(&format!("/v1/print-tasks/{both_cloud}/events")).await.to_string();
    assert!(both_events.contains(&both_lan), "the merged task names the LAN task: {both_events}");
    // Charged once per order: ON1, OFF1, OFF2, BOTH1 and MIS1. The device log (the agent's
    // journal digest) agrees with the broker but for the conflict, which a person decides:
    // the device printed the LAN version of MIS1, the broker holds its task in doubt.
    let date = t["created_at"].as_str().unwrap_or("").get(..10).unwrap_or("").to_owned();
    let start = Instant::now();
    let day = loop {
        let day = w.get(&format!("/v1/stores/s1/reconciliation?date={date}")).await;
        let settled = day["device_log"] == "present"
            && day["broker_printed_device_not"].as_array().is_some_and(|a| a.is_empty())
            && day["device_printed_broker_not"].as_array().is_some_and(|a| a.len() == 1);
        if settled || start.elapsed() > Duration::from_secs(45) {
            break day;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(day["ledger"]["charges"], 5, "{day}");
    assert_eq!(day["printed_more_than_once"], json!([]), "{day}");
    assert_eq!(day["broker_printed_device_not"], json!([]), "{day}");
    let differs = day["device_printed_broker_not"].as_array().cloned().unwrap_or_default();
    assert_eq!(differs.len(), 1, "{day}");
    assert_eq!(differs[0]["task_id"], *mis_cloud, "{day}");
    assert_eq!(differs[0]["broker_state"], "in_doubt", "{day}");
}
