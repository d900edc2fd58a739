//! The store agent's LAN listener at its edges, with the real binary: a slow broker and a
//! station across two kinds of printer, a second listener for the store, a task the
//! broker rejects at sync, an upload that keeps failing, a POS retrying through an
//! outage, a brand-new agent, the broker killed, oversize bodies, and the agent's return
//! to polling. "Printed" is judged by the simulator's paper log, the broker's answers by
//! its API. The broker runs on SQLite: what is the broker's here is tested on both
//! backends in `crates/server/tests/offline.rs` and the store's conformance suite.

mod common;

use common::world::*;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The broker's task for `biz_no` (the first listed), if any.
async fn task_of(w: &World, biz_no: &str) -> Option<Value> {
    let list = w.get(&format!("/v1/print-tasks?biz_no={biz_no}")).await;
    list["tasks"].as_array().and_then(|t| t.first().cloned())
}

/// Waits until `ok` holds for the LAN listener's `/healthz`; answers it.
async fn wait_health(w: &World, pos: &Pos, ok: impl Fn(&Value) -> bool, secs: u64) -> Value {
    let start = Instant::now();
    loop {
        let h = pos.health().await;
        if ok(&h) {
            return h;
        }
        assert!(start.elapsed() < Duration::from_secs(secs), "LAN /healthz: {h}\n{}", w.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A station whose first printer is not the agent's (a vendor cloud printer) and whose
/// second is. The broker commits a forwarded submission but answers after the agent gave
/// up waiting, so the agent accepts it offline too: both go to the agent's printer under
/// one delivery key, the journal prints it once, and the sync merges the two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_broker_and_a_mixed_station_print_one_copy() {
    let Some(mut w) = World::start("slowmixed", false, 1).await else { return };
    w.post(
        "/v1/printers",
        json!({"id": "cloud", "store_id": "s1", "transport":
               {"kind": "webhook", "url": "http://127.0.0.1:9/jobs", "secret": "0123456789abcdef0123"}}),
    )
    .await;
    w.post("/v1/stations", json!({"id": "kitchen", "store_id": "s1", "printers": ["cloud", "p0"]})).await;
    let (faults, pos) = w.with_lan_listener().await;

    // The broker takes the order but answers after the agent's 700 ms.
    faults.delay_answers_ms.store(1500, Ordering::SeqCst);
    let body = json!({"biz_no": "T4", "station_id": "kitchen",
                      "content": {"type": "text", "text": "TICKET T4\nTable 4: 1 x fish soup\n"}});
    let (status, offline, lan) = pos.send(&pos.key, body).await;
    assert_eq!((status, offline), (201, true), "accepted offline: {lan}");
    faults.delay_answers_ms.store(0, Ordering::SeqCst);
    let lan_id = lan["task_id"].as_str().expect("LAN task id").to_owned();

    w.wait_printed("T4", 30).await;
    let start = Instant::now();
    let broker = loop {
        if let Some(t) = task_of(&w, "T4").await.filter(|t| t["task_id"] != lan_id.as_str()) {
            if t["state"] == "printed" {
                break t;
            }
        }
        assert!(start.elapsed() < Duration::from_secs(40), "{:?}\n{}", task_of(&w, "T4").await, w.logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(broker["printer_id"], "p0", "the broker's task is on the printer the agent printed on: {broker}");
    // The sync merges the LAN task into it: its id names the broker's task.
    let merged = w.wait_known(&lan_id, &["printed"], 40).await;
    assert_eq!(merged["task_id"], broker["task_id"], "{merged}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(w.printed_count("T4"), 1, "one copy on paper\n{}", w.logs());
}

/// A second agent listening for the same store's LAN orders (a POS retrying to it) is
/// refused with a clear reason naming the agent that takes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_lan_listener_of_the_store_refuses_with_the_first_ones_name() {
    let Some(mut w) = World::start("twolisteners", false, 1).await else { return };
    let (_faults, pos) = w.with_lan_listener().await;
    let holder = w.get("/v1/stores/s1/lan-listener").await;
    let first = holder["agent_id"].as_str().expect("the first agent holds the listener").to_owned();
    let (_second, pos2) = w.another_lan_agent("agent2", &w.base.clone(), &pos.key);
    let h = wait_health(&w, &pos2, |h| h["lan_listener"] == "other_agent", 20).await;
    assert_eq!(h["lan_listener_agent"], first.as_str(), "{h}");

    let (status, _, refused) = pos2.ticket("TWO1", &ticket_text("TWO1")).await;
    assert_eq!((status, refused["error"]["code"].as_str()), (503, Some("lan_listener_taken")), "{refused}");
    let message = refused["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains(&first) && message.contains("lan-listener"), "{message}");
    // The first takes it; one copy.
    let (status, _, _) = pos.ticket("TWO1", &ticket_text("TWO1")).await;
    assert_eq!(status, 201);
    w.wait_printed("TWO1", 20).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(w.printed_count("TWO1"), 1);
}

/// The broker's content limit was lowered while the shop was cut off, below a ticket the
/// agent took: the broker cannot take that ticket. It does not vanish: the agent keeps it
/// (LAN `/healthz` counts it), does not print what the broker refused, and the broker
/// alerts a person with what the agent knows of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_the_broker_rejects_at_sync_is_kept_shown_and_alerted() {
    let Some(mut w) = World::start("rejected", false, 1).await else { return };
    let (url, got) = recording_receiver().await;
    w.post("/v1/webhooks", json!({"id": "ops", "url": url, "events": ["offline_task.rejected"]})).await;
    let (faults, pos) = w.with_lan_listener().await;
    w.faults(0, json!({"paper_out": true})).await;
    faults.blackhole.store(true, Ordering::SeqCst);
    let text = format!("{}{}\n", ticket_text("BIG1"), "x".repeat(10_000));
    let (status, offline, lan) = pos.ticket("BIG1", &text).await;
    assert_eq!((status, offline), (201, true), "{lan}");
    let lan_id = lan["task_id"].as_str().expect("id").to_owned();
    // Meanwhile the broker is restarted with a content limit below the ticket.
    w.restart_broker_with("max_content_bytes = 5000");
    faults.blackhole.store(false, Ordering::SeqCst);

    wait_health(&w, &pos, |h| h["offline_tasks_rejected"] == 1 && h["offline_tasks_not_synced"] == 0, 40).await;
    let start = Instant::now();
    let alert = loop {
        let calls = got.lock().expect("lock").clone();
        if let Some(a) = calls.iter().filter_map(|(_, b)| serde_json::from_str::<Value>(b).ok()).next() {
            break a;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "no alert\n{}", w.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        (alert["type"].as_str(), alert["data"]["lan_task_id"].as_str()),
        (Some("offline_task.rejected"), Some(&*lan_id))
    );
    assert_eq!(alert["data"]["biz_no"], "BIG1");
    assert!(alert["data"]["reason"].as_str().unwrap_or("").contains("5000"), "{alert}");
    // The paper comes back: the agent does not print what the broker would not take.
    w.faults(0, json!({"paper_out": false})).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(w.printed_count("BIG1"), 0, "{}", w.logs());
    assert_eq!(pos.health().await["offline_tasks_rejected"], 1, "still kept");
}

/// 230 tickets taken offline while the printer is out of paper; when the broker is back,
/// the upload of offline tasks keeps failing (502) while everything else works. Every
/// ticket still prints, once; the upload goes through once it works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_upload_never_keeps_a_ticket_from_printing() {
    let Some(mut w) = World::start("failupload", false, 1).await else { return };
    let (faults, pos) = w.with_lan_listener().await;
    w.faults(0, json!({"paper_out": true})).await;
    faults.blackhole.store(true, Ordering::SeqCst);
    for i in 0..230 {
        let m = format!("U{i:03}");
        let (status, offline, _) = pos.ticket(&m, &ticket_text(&m)).await;
        assert_eq!((status, offline), (201, true));
    }
    faults.fail_uploads.store(true, Ordering::SeqCst);
    faults.blackhole.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(3)).await;
    w.faults(0, json!({"paper_out": false})).await;
    let start = Instant::now();
    loop {
        let missing: Vec<String> = (0..230).map(|i| format!("U{i:03}")).filter(|m| w.printed_count(m) == 0).collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "{} tickets never printed while the upload failed: {:?}\n{}",
            missing.len(),
            &missing[..missing.len().min(10)],
            w.logs()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(pos.health().await["offline_tasks_not_synced"], 230, "none reached the broker yet");
    faults.fail_uploads.store(false, Ordering::SeqCst);
    wait_health(&w, &pos, |h| h["offline_tasks_not_synced"] == 0, 60).await;
    for i in 0..230 {
        assert_eq!(w.printed_count(&format!("U{i:03}")), 1);
    }
}

/// A POS retrying, during an outage, a ticket the broker answered through this listener
/// before it gets the broker's task (200, same id), never a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_during_an_outage_gets_the_brokers_task() {
    let Some(mut w) = World::start("retryout", false, 1).await else { return };
    let (faults, pos) = w.with_lan_listener().await;
    let (status, offline, first) = pos.ticket("F1", &ticket_text("F1")).await;
    assert_eq!((status, offline), (201, false), "{first}");
    let id = first["task_id"].as_str().expect("id").to_owned();
    w.wait_printed("F1", 20).await;
    faults.blackhole.store(true, Ordering::SeqCst);
    let (status, offline, again) = pos.ticket("F1", &ticket_text("F1")).await;
    assert_eq!((status, offline), (200, true), "{again}");
    assert_eq!((again["task_id"].as_str(), again["duplicate"].as_bool()), (Some(id.as_str()), Some(true)), "{again}");
    let (status, _, other) = pos.ticket("F1", "TICKET F1\n2 x Noodles\n").await;
    assert_eq!((status, other["error"]["code"].as_str()), (422, Some("idempotency_mismatch")), "{other}");
    faults.blackhole.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(w.printed_count("F1"), 1);
    assert_eq!(w.get("/v1/print-tasks?biz_no=F1").await["tasks"].as_array().map(Vec::len), Some(1));
}

/// An agent that never reached the broker cannot tell a good LAN key from a wrong one:
/// the POS is told to retry (503), not that its key is wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_agent_that_never_reached_the_broker_answers_503() {
    let Some(w) = World::start("newagent", false, 1).await else { return };
    let key = w.post("/v1/stores/s1/lan-keys", json!({})).await["key"].as_str().expect("key").to_owned();
    let faults = ProxyFaults::default();
    faults.refuse.store(true, Ordering::SeqCst);
    let proxy = chaos_proxy(w.base.clone(), faults.clone()).await;
    let (_agent, pos) = w.another_lan_agent("fresh", &proxy, &key);
    let h = wait_health(&w, &pos, |h| h["status"] == "ok", 20).await;
    assert_eq!((h["lan_keys"].as_bool(), h["directory"].as_bool()), (Some(false), Some(false)), "{h}");
    let (status, _, body) = pos.ticket("N1", &ticket_text("N1")).await;
    assert_eq!((status, body["error"]["code"].as_str()), (503, Some("unavailable")), "{body}");
    assert!(body["error"]["message"].as_str().unwrap_or("").contains("has not reached the broker yet"), "{body}");
}

/// Once the broker stops answering, the LAN `/healthz` says so, from the agent's polls
/// and probes (no LAN submission needed), and keeps saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_says_the_broker_is_unreachable_once_it_stops_answering() {
    let Some(mut w) = World::start("healthdown", false, 1).await else { return };
    let (_faults, pos) = w.with_lan_listener().await;
    let h = wait_health(&w, &pos, |h| h["broker"] == "reachable", 20).await;
    assert!(h["broker_last_answer_ms_ago"].as_u64().is_some(), "{h}");
    World::kill9(&mut w.broker);
    let killed = Instant::now();
    let h = wait_health(&w, &pos, |h| h["broker"] == "unreachable", 10).await;
    assert!(h["broker_error"].as_str().is_some_and(|e| !e.is_empty()), "{h}");
    while killed.elapsed() < Duration::from_secs(8) {
        let h = pos.health().await;
        assert_eq!(h["broker"], "unreachable", "{:?} after the kill: {h}", killed.elapsed());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The LAN listener takes what the broker takes: the broker's body limit, answered 413
/// with the broker's JSON error, and the broker's content limit (here 2,000 bytes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lan_listener_holds_the_brokers_limits_with_the_brokers_answers() {
    let Some(mut w) = World::start_configured("limits", false, 1, &[], "max_content_bytes = 2000").await else {
        return;
    };
    let (faults, pos) = w.with_lan_listener().await;
    faults.blackhole.store(true, Ordering::SeqCst);
    let text = |n: usize| format!("TICKET L\n{}\n", "x".repeat(n));
    let (status, _, body) = pos.ticket("L1", &text(3000)).await;
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("invalid_request")), "{body}");
    assert!(body["error"]["message"].as_str().unwrap_or("").contains("2000"), "{body}");
    let (status, offline, _) = pos.ticket("L2", &text(1000)).await;
    assert_eq!((status, offline), (201, true));

    // Past the broker's 1 MiB body limit: its own 413, in JSON, on the LAN too.
    let big =
        |n: usize| json!({"biz_no": "L3", "printer_id": "p0", "content": {"type": "text", "text": "x".repeat(n)}});
    let send = |url: String, key: String, body: Value| {
        let http = w.http.clone();
        async move {
            let res = http.post(url).bearer_auth(key).json(&body).send().await.expect("send");
            let status = res.status().as_u16();
            let kind = res.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
            (status, kind, res.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    for n in [1_100_000, 3_000_000] {
        let (status, kind, lan) = send(format!("{}/v1/print-tasks", pos.base), pos.key.clone(), big(n)).await;
        assert_eq!(
            (status, kind.as_str(), lan["error"]["code"].as_str()),
            (413, "application/json", Some("payload_too_large"))
        );
        let (status, _, broker) = send(format!("{}/v1/print-tasks", w.base), w.key.clone(), big(n)).await;
        assert_eq!(status, 413);
        assert_eq!(lan, broker, "one limit, one error body");
    }
}

/// After an outage the agent resumes polling within seconds of the broker's return (its
/// probes, not its 30 s backoff step), and a stop sends the device log's last records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_resumes_within_seconds_and_a_stop_sends_the_device_log() {
    let Some(mut w) = World::start("resume", false, 1).await else { return };
    let (faults, _pos) =
        w.with_lan_listener_flags(&[("--directory-refresh-ms", "600000"), ("--digest-interval-ms", "600000")]).await;
    let first = w.submit("R0", 0, "receipt").await;
    w.wait_state(&first, &["printed"], 20).await;
    // 25 s of a broker that refuses connections: the poll backoff grows past 10 s.
    faults.refuse.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(25)).await;
    let id = w.submit("R1", 0, "receipt").await;
    faults.refuse.store(false, Ordering::SeqCst);
    let back = Instant::now();
    w.wait_state(&id, &["printed"], 40).await;
    let took = back.elapsed();
    assert!(took < Duration::from_secs(8), "the ticket waited {took:?} after the broker came back\n{}", w.logs());

    // SIGTERM right after it printed, long before the next digest: the device log has it.
    w.sigterm_agent();
    let task = w.state(&id).await;
    let date = task["created_at"].as_str().unwrap_or("").get(..10).unwrap_or("").to_owned();
    let day = w.get(&format!("/v1/stores/s1/reconciliation?date={date}")).await;
    assert_eq!(day["device_log"], "present", "{day}");
    assert_eq!(day["broker_printed_device_not"], json!([]), "{day}");
}

/// Two agents of one store behind the same shop line, the first taking LAN orders. During
/// a cut the first prints a LAN ticket that the cloud also took; when the line is back the
/// cloud's copy goes to the first agent only (the other stands by), whose journal knows
/// it: one copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stand_by_agent_never_prints_what_the_lan_agent_printed_offline() {
    let Some(mut w) = World::start("standby", false, 1).await else { return };
    let (faults, pos) = w.with_lan_listener().await;
    let proxy = w.agent_server.clone().expect("the shop line");
    let (_second, pos2) = w.another_lan_agent("agent2", &proxy, &pos.key);
    wait_health(&w, &pos2, |h| h["lan_listener"] == "other_agent", 20).await;

    faults.blackhole.store(true, Ordering::SeqCst);
    for i in 0..5 {
        let m = format!("CUT{i}");
        let (status, offline, _) = pos.ticket(&m, &ticket_text(&m)).await;
        assert_eq!((status, offline), (201, true));
        let body = json!({"biz_no": m, "printer_id": "p0", "content": {"type": "text", "text": ticket_text(&m)}});
        w.post("/v1/print-tasks", body).await;
    }
    for i in 0..5 {
        w.wait_printed(&format!("CUT{i}"), 20).await;
    }
    faults.blackhole.store(false, Ordering::SeqCst);
    wait_health(&w, &pos, |h| h["offline_tasks_not_synced"] == 0, 40).await;
    for i in 0..5 {
        let t = task_of(&w, &format!("CUT{i}")).await.expect("the broker's task");
        w.wait_state(t["task_id"].as_str().unwrap_or(""), &["printed"], 30).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    for i in 0..5 {
        assert_eq!(w.printed_count(&format!("CUT{i}")), 1, "CUT{i} once\n{}", w.logs());
    }
}

/// The shop PC's clock is a day behind when the agent takes a ticket offline, and right
/// again (the agent restarted) when it uploads it: the ticket's age by the machine's
/// clock since boot places it today on the broker's clock, charged today.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_taken_under_a_wrong_clock_is_placed_by_the_broker_clock() {
    let Some(mut w) = World::start("clock", false, 1).await else { return };
    let (faults, pos) = w.with_lan_listener_flags(&[("--test-clock-offset-ms", "-86400000")]).await;
    faults.blackhole.store(true, Ordering::SeqCst);
    let (status, offline, lan) = pos.ticket("CLK1", &ticket_text("CLK1")).await;
    assert_eq!((status, offline), (201, true), "{lan}");
    let lan_id = lan["task_id"].as_str().expect("id").to_owned();
    w.wait_printed("CLK1", 20).await;
    // The clock is put right; the agent restarts before the line is back.
    World::kill9(&mut w.agent);
    for pair in w.agent_extra.chunks_mut(2) {
        if pair[0] == "--test-clock-offset-ms" {
            pair[1] = "0".into();
        }
    }
    w.start_agent();
    faults.blackhole.store(false, Ordering::SeqCst);
    let t = w.wait_known(&lan_id, &["printed"], 40).await;
    let today = w.get("/v1/stores/s1/reconciliation").await["date"].as_str().unwrap_or("").to_owned();
    assert_eq!(t["created_at"].as_str().and_then(|c| c.get(..10)), Some(today.as_str()), "{t}");
    let events = w.get(&format!("/v1/print-tasks/{lan_id}/events")).await.to_string();
    assert!(events.contains("1.0 days behind the broker's"), "{events}");
    // Today's reconciliation finds the device's record, kept under the LAN id of
    // yesterday's time, for the task of today: no difference.
    let start = Instant::now();
    loop {
        let day = w.get(&format!("/v1/stores/s1/reconciliation?date={today}")).await;
        let empty = |f: &str| day[f].as_array().is_some_and(|a| a.is_empty());
        if day["device_log"] == "present" && empty("broker_printed_device_not") && empty("device_printed_broker_not") {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{day}\n{}", w.logs());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The upload reaches the broker, which merges the shop's ticket into the order's cloud
/// task, and its answer is lost on the way back; a person then moves that task to the
/// other printer. The agent does not print the ticket on its own lane while the broker
/// may have taken it: it uploads again, learns the broker has it, and the moved task is
/// the order's one copy on paper.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_whose_answer_is_lost_never_prints_beside_the_brokers_copy() {
    let Some(mut w) = World::start("lostanswer", false, 2).await else { return };
    let (faults, pos) = w.with_lan_listener().await;
    w.faults(0, json!({"paper_out": true})).await;
    faults.blackhole.store(true, Ordering::SeqCst);
    let (status, offline, lan) = pos.ticket("LA1", &ticket_text("LA1")).await;
    assert_eq!((status, offline), (201, true), "{lan}");
    // The same order through the cloud while the shop is cut off.
    let cloud = w
        .post(
            "/v1/print-tasks",
            json!({"biz_no": "LA1", "printer_id": "p0", "content": {"type": "text", "text": ticket_text("LA1")}}),
        )
        .await;
    let cloud_id = cloud["task_id"].as_str().expect("cloud task").to_owned();
    // The line comes back; the upload gets there, its answer does not.
    faults.lose_upload_answers.store(true, Ordering::SeqCst);
    faults.blackhole.store(false, Ordering::SeqCst);
    let start = Instant::now();
    while faults.upload_answers_lost.load(Ordering::SeqCst) == 0 {
        assert!(start.elapsed() < Duration::from_secs(30), "no upload\n{}", w.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A person moves the order's task to the printer that has paper.
    w.post(
        &format!("/v1/print-tasks/{cloud_id}/transfer"),
        json!({"operator": "ops", "reason": "p0 is out of paper", "printer_id": "p1"}),
    )
    .await;
    w.wait_printed("LA1", 30).await;
    // Paper back in p0, and uploads answered again: the shop's ticket is the broker's.
    w.faults(0, json!({"paper_out": false})).await;
    faults.lose_upload_answers.store(false, Ordering::SeqCst);
    wait_health(&w, &pos, |h| h["offline_tasks_not_synced"] == 0, 30).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(w.printed_count("LA1"), 1, "{}", w.logs());
}
