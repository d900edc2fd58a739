//! The lane engine through the API, one test per way a lane once stalled or printed twice,
//! on SQLite and PostgreSQL: agents are played over HTTP with explicit sessions,
//! webhook printers by a small vendor server, so every step is deterministic.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::Query;
use axum::http::{HeaderMap, StatusCode};
use base64::Engine as _;
use common::{order, receiver, task_of, Agent, Backend, TestApp};
use onceprint_server::HttpConfig;
use serde_json::{json, Value};

/// Short timings so that deadlines pass within a test.
fn fast() -> HttpConfig {
    let mut c = HttpConfig::default();
    c.delivery.redeliver_after_ms = 600;
    c.delivery.agent_gone_after_ms = 1_500;
    c.delivery.takeover_quiet_ms = 400;
    c.delivery.sweep_interval_ms = 50;
    c.delivery.recheck_ms = 50;
    c.delivery.stall_after_ms = 1_500;
    c.push.interval_ms = 50;
    c.push.recheck_after_ms = 300;
    for p in c.intake.policies.types.values_mut() {
        p.backoff.initial_ms = 50;
        p.backoff.cap_ms = 200;
        p.backoff.jitter = 0.0;
    }
    c
}

per_backend!(
    a_task_in_flight_is_offered_to_the_restarted_agent_whatever_waits_behind_it,
    a_task_in_flight_is_offered_again_after_its_deadline_whatever_waits_behind_it,
    a_lost_poll_answer_is_offered_again_after_the_deadline,
    reprint_on_doubt_is_bounded_by_the_attempts,
    one_ack_batch_is_applied_in_order_and_never_fails_over_a_printed_task,
    a_failover_commits_whole_or_not_at_all,
    a_failover_skips_a_disabled_backup,
    a_station_threshold_of_its_own_decides_when_it_fails_over,
    a_second_live_process_with_one_agent_id_is_fenced,
    a_shop_pc_clock_an_hour_ahead_then_corrected_never_stalls_the_lane,
    a_killed_agents_open_poll_does_not_hold_its_delivery,
    agents_not_seen_since_a_broker_restart_are_not_gone,
    ids_stay_in_order_when_the_clock_stepped_back_across_a_restart,
    cancelling_a_transferred_task_refunds_the_order_once,
    failover_never_moves_a_task_that_may_have_printed,
    a_lane_without_progress_raises_printer_stalled,
    webhook_tasks_in_a_store_with_a_live_agent_are_asked_about_not_doubted,
    webhook_deliveries_carry_distinct_keys_and_the_reprint_banner,
    a_webhook_job_the_receiver_never_got_is_sent_again,
    a_webhook_job_nobody_answers_goes_to_a_person,
);

async fn submit(app: &TestApp, key: &str, biz_no: &str, print_type: &str) -> String {
    let mut body = order(biz_no, &format!("{biz_no}\n"));
    body["print_type"] = json!(print_type);
    let a = app.submit(key, body).await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    a.body["task_id"].as_str().expect("id").to_owned()
}

async fn task(app: &TestApp, key: &str, id: &str) -> Value {
    app.get(&format!("/v1/print-tasks/{id}"), key).await.body
}

async fn wait_state(app: &TestApp, key: &str, id: &str, state: &str, within: Duration) -> Value {
    let start = Instant::now();
    loop {
        let t = task(app, key, id).await;
        if t["state"] == state {
            return t;
        }
        assert!(start.elapsed() < within, "never {state}: {t}\n{:?}", common::events_of(app, key, id).await);
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
}

/// Prints every delivery (acks `printed`) until the lanes are empty; returns the task ids
/// in the order they were handed out.
async fn drain(app: &TestApp, agent: &Agent, within: Duration) -> Vec<String> {
    let mut out = Vec::new();
    let start = Instant::now();
    let mut empty_polls = 0;
    while empty_polls < 3 {
        assert!(start.elapsed() < within, "the lanes did not drain; printed so far {out:?}");
        let d = agent.poll(app, 200).await;
        if d.is_empty() {
            empty_polls += 1;
            continue;
        }
        empty_polls = 0;
        for x in d {
            let (id, n) = task_of(&x);
            assert_eq!(agent.ack(app, &id, n, "printed").await, "applied");
            out.push(id);
        }
    }
    out
}

/// The stall the lane engine was made for: a prebill in flight at an agent that restarts while refunds
/// arrive. The restarted agent gets the prebill again first (its earlier process went
/// quiet), then the refunds in order. Before the lane engine, nothing ever moved again.
async fn a_task_in_flight_is_offered_to_the_restarted_agent_whatever_waits_behind_it(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, fast()).await else { return };
    let key = app.tenant("acme").await;
    let first = Agent::new(&app, &key, "kitchen-pc", "t000000000001-0000000000000001").await;
    let prebill = submit(&app, &key, "P1", "prebill").await;
    let d = first.poll(&app, 1000).await;
    assert_eq!(d.iter().map(task_of).collect::<Vec<_>>(), vec![(prebill.clone(), 1)]);
    let refunds = [
        submit(&app, &key, "R1", "refund").await,
        submit(&app, &key, "R2", "refund").await,
        submit(&app, &key, "R3", "refund").await,
    ];
    // kill -9 and restart: the same agent id, a new session.
    let second = Agent { session: "t000000000002-0000000000000002".into(), ..first };
    let again = second.poll_until(&app, Duration::from_secs(5)).await;
    assert_eq!(again.iter().map(task_of).collect::<Vec<_>>(), vec![(prebill.clone(), 2)], "the task in flight first");
    assert_eq!(second.ack(&app, &prebill, 2, "printed").await, "applied");
    let rest = drain(&app, &second, Duration::from_secs(10)).await;
    assert_eq!(rest, refunds.to_vec(), "then the refunds, in order");
    app.stop().await;
}

/// The same without a restart: the delivery's deadline passes while higher-priority work
/// waits; it is offered again to the same agent (which answers from its journal).
async fn a_task_in_flight_is_offered_again_after_its_deadline_whatever_waits_behind_it(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, fast()).await else { return };
    let key = app.tenant("acme").await;
    let agent = Agent::new(&app, &key, "a", "t000000000001-0000000000000001").await;
    let prebill = submit(&app, &key, "P1", "prebill").await;
    assert_eq!(agent.poll(&app, 1000).await.len(), 1);
    let refund = submit(&app, &key, "R1", "refund").await;
    // Nothing while the delivery is in flight and not overdue: one job at a time.
    assert!(agent.poll(&app, 100).await.is_empty());
    let again = agent.poll_until(&app, Duration::from_secs(5)).await;
    assert_eq!(again.iter().map(task_of).collect::<Vec<_>>(), vec![(prebill.clone(), 2)]);
    assert_eq!(agent.ack(&app, &prebill, 2, "printed").await, "applied");
    assert_eq!(drain(&app, &agent, Duration::from_secs(10)).await, vec![refund]);
    app.stop().await;
}

/// A poll's answer lost on the way: the agent polls again in the same session and gets
/// the delivery again after its deadline, while a refund that arrived meanwhile waits.
async fn a_lost_poll_answer_is_offered_again_after_the_deadline(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, fast()).await else { return };
    let key = app.tenant("acme").await;
    let agent = Agent::new(&app, &key, "a", "t000000000001-0000000000000001").await;
    let lost = submit(&app, &key, "K1", "kitchen").await;
    let _never_read = agent.poll(&app, 1000).await;
    let refund = submit(&app, &key, "R1", "refund").await;
    let start = Instant::now();
    let again = agent.poll_until(&app, Duration::from_secs(5)).await;
    assert!(start.elapsed() >= Duration::from_millis(400), "before the deadline: {:?}", start.elapsed());
    assert_eq!(again.iter().map(task_of).collect::<Vec<_>>(), vec![(lost.clone(), 2)]);
    assert_eq!(agent.ack(&app, &lost, 2, "printed").await, "applied");
    assert_eq!(drain(&app, &agent, Duration::from_secs(10)).await, vec![refund]);
    let t = task(&app, &key, &lost).await;
    assert_eq!((t["state"].as_str(), t["attempts"].as_i64()), (Some("printed"), Some(2)));
    app.stop().await;
}

/// "Reprint on doubt" goes through the ack rules, so it stops at the attempt limit: the
/// sweeper once sent such a task round for ever.
async fn reprint_on_doubt_is_bounded_by_the_attempts(backend: Backend) {
    let mut config = fast();
    let kitchen = config.intake.policies.types.get_mut("kitchen").expect("kitchen");
    kitchen.reprint_on_doubt = true;
    kitchen.max_attempts = 2;
    let Some(app) = TestApp::spawn_with(backend, config).await else { return };
    let key = app.tenant("acme").await;
    let a = Agent::new(&app, &key, "a", "t000000000001-0000000000000001").await;
    let b = Agent::new(&app, &key, "b", "t000000000001-0000000000000002").await;
    let id = submit(&app, &key, "K1", "kitchen").await;
    assert_eq!(a.poll(&app, 1000).await.len(), 1);
    // a goes away without answering; b serves the store: reprint on doubt (attempt 2).
    let d = b.poll_until(&app, Duration::from_secs(8)).await;
    assert_eq!(d.iter().map(task_of).collect::<Vec<_>>(), vec![(id.clone(), 2)]);
    assert_eq!(d[0]["reprint"], true);
    // Now b goes away and a is back: attempt 2 was the last, so a person decides.
    let t = {
        let start = Instant::now();
        loop {
            assert!(a.poll(&app, 200).await.is_empty(), "never offered a third time");
            let t = task(&app, &key, &id).await;
            if t["state"] != "sent" || start.elapsed() > Duration::from_secs(8) {
                break t;
            }
        }
    };
    assert_eq!((t["state"].as_str(), t["attempts"].as_i64()), (Some("in_doubt"), Some(2)), "{t}");
    app.stop().await;
}

/// A configuration where every print type has one attempt and a station fails over at
/// the first refusal (no pause threshold), a station `hot` (p1, then p2), an agent, and a
/// station task handed to it.
async fn station_task_at_its_last_attempt(backend: Backend, biz_no: &str) -> Option<(TestApp, String, Agent, String)> {
    let mut config = fast();
    for p in config.intake.policies.types.values_mut() {
        p.max_attempts = 1;
    }
    config.delivery.station_failover_after_ms = 0;
    let app = TestApp::spawn_with(backend, config).await?;
    let key = app.tenant("acme").await;
    let s = app.post("/v1/stations", &key, json!({"id": "hot", "store_id": "s1", "printers": ["p1", "p2"]})).await;
    assert_eq!(s.status, StatusCode::CREATED, "{s:?}");
    let agent = Agent::new(&app, &key, "a", "t000000000001-0000000000000001").await;
    let a = app
        .submit(&key, json!({"biz_no": biz_no, "station_id": "hot", "content": {"type": "text", "text": "x"}}))
        .await;
    let id = a.body["task_id"].as_str().expect("id").to_owned();
    assert_eq!(agent.poll(&app, 1000).await.len(), 1);
    Some((app, key, agent, id))
}

/// Review finding 1: the agent retried `no_paper(N)` and then printed attempt N; both acks
/// arrive in one batch. Applied in order, the task ends `printed`; nothing fails over to
/// the backup printer (which would print a second copy).
async fn one_ack_batch_is_applied_in_order_and_never_fails_over_a_printed_task(backend: Backend) {
    let Some((app, key, agent, id)) = station_task_at_its_last_attempt(backend, "S1").await else { return };
    let results = agent.acks(&app, &[(&id, 1, "no_paper"), (&id, 1, "printed")]).await;
    assert_eq!(results, vec!["applied", "applied"]);
    let t = task(&app, &key, &id).await;
    assert_eq!(t["state"], "printed", "{t}");
    assert!(t["successor_task_id"].is_null(), "no failover: {t}");
    let all = app.all_tasks(&key).await;
    assert_eq!(all.len(), 1, "no task for the backup printer: {all:?}");
    app.stop().await;
}

/// Review finding 8: the failure that causes a failover and the failover itself commit
/// together. A database error while writing the successor leaves the task as it was
/// (`sent`), so the agent's retried ack completes it; before, `failed` committed alone and
/// the task stayed failed for good.
async fn a_failover_commits_whole_or_not_at_all(backend: Backend) {
    let Some((app, key, agent, id)) = station_task_at_its_last_attempt(backend, "F1").await else { return };
    // The database refuses the successor (any error between the two writes would do).
    if app.is_postgres() {
        app.sql(
            "CREATE FUNCTION refuse_failover() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN RAISE EXCEPTION 'injected failure'; END $$; \
             CREATE TRIGGER refuse_failover BEFORE INSERT ON tasks FOR EACH ROW \
             WHEN (NEW.target LIKE 'failover:%') EXECUTE FUNCTION refuse_failover();",
        )
        .await;
    } else {
        app.sql(
            "CREATE TRIGGER refuse_failover BEFORE INSERT ON tasks WHEN NEW.target LIKE 'failover:%' \
             BEGIN SELECT RAISE(ABORT, 'injected failure'); END;",
        )
        .await;
    }
    let body = json!({"agent_id": "a", "session": agent.session, "acks": [{"task_id": id, "attempt": 1, "outcome": "no_paper", "detail": "test"}]});
    let refused = app.post("/v1/agent/acks", &agent.token, body.clone()).await;
    assert!(refused.status.is_server_error(), "{refused:?}");
    let t = task(&app, &key, &id).await;
    assert_eq!(t["state"], "sent", "nothing of the failing change was written: {t}");
    app.sql(if app.is_postgres() { "DROP TRIGGER refuse_failover ON tasks" } else { "DROP TRIGGER refuse_failover" })
        .await;
    // The agent sends its ack again.
    let again = app.post("/v1/agent/acks", &agent.token, body).await;
    assert_eq!(again.body["results"][0]["result"], "applied", "{again:?}");
    let t = task(&app, &key, &id).await;
    assert_eq!(t["state"], "transferred", "{t}");
    let next = t["successor_task_id"].as_str().expect("successor").to_owned();
    let n = task(&app, &key, &next).await;
    assert_eq!((n["printer_id"].as_str(), n["state"].as_str()), (Some("p2"), Some("pending")));
    let trail: Vec<String> = common::events_of(&app, &key, &id).await.into_iter().map(|e| e.1).collect();
    assert_eq!(trail, vec!["pending", "sent", "failed", "transferred"]);
    app.stop().await;
}

/// A station's failover goes to the next backup that is not disabled.
async fn a_failover_skips_a_disabled_backup(backend: Backend) {
    let Some((app, key, agent, x0)) = station_task_at_its_last_attempt(backend, "X0").await else { return };
    let p = app
        .post(
            "/v1/printers",
            &key,
            json!({"id": "p3", "store_id": "s1", "transport": {"kind": "agent", "address": "tcp://192.0.2.10:9100"}}),
        )
        .await;
    assert_eq!(p.status, StatusCode::CREATED, "{p:?}");
    let s = app.call("PATCH", "/v1/stations/hot", Some(&key), Some(json!({"printers": ["p1", "p2", "p3"]}))).await;
    assert_eq!(s.status, StatusCode::OK, "{s:?}");
    let d = app.post("/v1/printers/p2/disable", &key, json!({"operator": "alice", "reason": "broken"})).await;
    assert_eq!(d.status, StatusCode::OK, "{d:?}");
    let a =
        app.submit(&key, json!({"biz_no": "X1", "station_id": "hot", "content": {"type": "text", "text": "x"}})).await;
    let id = a.body["task_id"].as_str().expect("id").to_owned();
    // X0 holds p1's lane; it prints, then X1 comes and runs out of paper.
    assert_eq!(agent.ack(&app, &x0, 1, "printed").await, "applied");
    let d = agent.poll_until(&app, Duration::from_secs(5)).await;
    assert_eq!(d.iter().map(task_of).collect::<Vec<_>>(), vec![(id.clone(), 1)]);
    assert_eq!(agent.ack(&app, &id, 1, "no_paper").await, "applied");
    let t = task(&app, &key, &id).await;
    let next = t["successor_task_id"].as_str().expect("failed over").to_owned();
    assert_eq!(task(&app, &key, &next).await["printer_id"], "p3", "not the disabled p2");
    app.stop().await;
}

/// A station's own `failover_after_ms` overrides the broker's (30 s here): at 0
/// the first refusal of a paused primary hands the ticket on; set back to `null`, the next
/// ticket waits for the primary. Bad thresholds are refused with the field named.
async fn a_station_threshold_of_its_own_decides_when_it_fails_over(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, fast()).await else { return };
    let key = app.tenant("acme").await;
    for bad in [json!(-1), json!(86_400_001), json!("soon")] {
        let r = app
            .post(
                "/v1/stations",
                &key,
                json!({"id": "x", "store_id": "s1", "printers": ["p1"], "failover_after_ms": bad}),
            )
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{bad}: {r:?}");
    }
    let s = app
        .post(
            "/v1/stations",
            &key,
            json!({"id": "quick", "store_id": "s1", "printers": ["p1", "p2"], "failover_after_ms": 0}),
        )
        .await;
    assert_eq!((s.status, s.body["failover_after_ms"].as_i64()), (StatusCode::CREATED, Some(0)), "{s:?}");
    let agent = Agent::new(&app, &key, "a", "t000000000001-0000000000000001").await;
    let station_order =
        |biz: &str| json!({"biz_no": biz, "station_id": "quick", "content": {"type": "text", "text": "x"}});
    let q1 = app.submit(&key, station_order("Q1")).await.body["task_id"].as_str().expect("id").to_owned();
    assert_eq!(agent.poll(&app, 1000).await.iter().map(task_of).collect::<Vec<_>>(), vec![(q1.clone(), 1)]);
    assert_eq!(agent.ack(&app, &q1, 1, "no_paper").await, "applied");
    let t = task(&app, &key, &q1).await;
    assert_eq!(t["state"], "transferred", "a threshold of 0 moves it at once: {t}");
    // Back to the broker's 30 s: the next ticket waits for p1.
    let r = app.call("PATCH", "/v1/stations/quick", Some(&key), Some(json!({"failover_after_ms": null}))).await;
    assert_eq!((r.status, r.body["failover_after_ms"].is_null()), (StatusCode::OK, true), "{r:?}");
    assert_eq!(r.body["printers"], json!(["p1", "p2"]), "absent printers stay: {r:?}");
    let same = app.call("PATCH", "/v1/stations/quick", Some(&key), Some(json!({}))).await;
    assert_eq!(same.status, StatusCode::OK, "{same:?}");
    let q2 = app.submit(&key, station_order("Q2")).await.body["task_id"].as_str().expect("id").to_owned();
    let offered = agent.poll_until(&app, Duration::from_secs(5)).await;
    assert!(offered.iter().map(task_of).any(|(id, _)| id == q2), "{offered:?}");
    assert_eq!(agent.ack(&app, &q2, 1, "no_paper").await, "applied");
    let t = task(&app, &key, &q2).await;
    assert_eq!((t["state"].as_str(), t["last_error"].as_str()), (Some("retrying"), Some("no_paper")), "{t}");
    assert!(t["successor_task_id"].is_null(), "{t}");
    app.stop().await;
}

/// Review finding 7: two live processes with one agent id. The newer session wins; the
/// older is told to stop (409 `agent_superseded`) but keeps the delivery it holds until it
/// answers it, so the newer one never prints it too.
async fn a_second_live_process_with_one_agent_id_is_fenced(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, fast()).await else { return };
    let key = app.tenant("acme").await;
    let old = Agent::new(&app, &key, "shared", "t000000000001-0000000000000001").await;
    let id = submit(&app, &key, "A1", "receipt").await;
    assert_eq!(old.poll(&app, 1000).await.len(), 1);
    let new = Agent { token: old.token.clone(), id: old.id.clone(), session: "t000000000002-0000000000000002".into() };
    // The newer process starts; the older one is still live (it polled a moment ago).
    assert!(new.poll(&app, 100).await.is_empty(), "the old process may be printing it");
    // The old one polls again and learns it must stop.
    let from_old = old.poll_answer(&app, 1_000).await;
    assert_eq!((from_old.status, from_old.code()), (StatusCode::CONFLICT, "agent_superseded"), "{from_old:?}");
    // It was heard after the newer one appeared: a second live process, whose delivery
    // stays with it while it still talks (up to agent_gone_after_ms of silence).
    assert!(new.poll(&app, 1_000).await.is_empty(), "the old process still holds it");
    // The old process finishes its print and says so before it stops.
    assert_eq!(old.ack(&app, &id, 1, "printed").await, "applied");
    assert!(new.poll(&app, 500).await.is_empty(), "never offered to the newer process");
    let next = submit(&app, &key, "A2", "receipt").await;
    let d = new.poll(&app, 1000).await;
    assert_eq!(d.iter().map(task_of).collect::<Vec<_>>(), vec![(next, 1)]);
    // A process that polls only now but has been running for longer than the newer one
    // (its age, on its own monotonic clock) is refused too.
    let older = Agent { session: "t000000000000-0000000000000003".into(), ..old };
    let a = app
        .post(
            "/v1/agent/poll",
            &older.token,
            json!({"agent_id": older.id, "session": older.session, "wait_ms": 100, "session_age_ms": 3_600_000}),
        )
        .await;
    assert_eq!(a.code(), "agent_superseded", "{a:?}");
    let t = task(&app, &key, &id).await;
    assert_eq!((t["state"].as_str(), t["attempts"].as_i64()), (Some("printed"), Some(1)));
    app.stop().await;
}

/// kill -9 of an agent closes its long poll's connection: the broker notices at once, so
/// the restarted agent gets the delivery back after `takeover_quiet_ms`, not after the
/// dead poll's wait.
async fn a_killed_agents_open_poll_does_not_hold_its_delivery(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, fast()).await else { return };
    let key = app.tenant("acme").await;
    let dead = Agent::new(&app, &key, "a", "t000000000001-0000000000000001").await;
    let id = submit(&app, &key, "A1", "receipt").await;
    assert_eq!(dead.poll(&app, 1000).await.len(), 1);
    // Its next long poll is open when the process dies: the client gives up after 200 ms
    // and the connection closes.
    let client = reqwest::Client::builder().timeout(Duration::from_millis(200)).build().expect("client");
    let cut = client
        .post(format!("{}/v1/agent/poll", app.base))
        .bearer_auth(&dead.token)
        .json(&json!({"agent_id": "a", "session": dead.session, "wait_ms": 30_000, "max": 16}))
        .send()
        .await;
    assert!(cut.is_err(), "the poll was cut off");
    let restarted = Agent { session: "t000000000002-0000000000000002".into(), ..dead };
    let start = Instant::now();
    let d = restarted.poll_until(&app, Duration::from_secs(10)).await;
    assert_eq!(d.iter().map(task_of).collect::<Vec<_>>(), vec![(id, 2)]);
    assert!(start.elapsed() < Duration::from_secs(3), "held by the dead poll: {:?}", start.elapsed());
    app.stop().await;
}

/// Review finding 3: after a broker restart, an agent not yet seen is unknown, not gone.
/// Agent a holds an overdue delivery; the broker restarts; agent b polls first. a comes
/// back a moment later and confirms: nothing went to `in_doubt` meanwhile.
async fn agents_not_seen_since_a_broker_restart_are_not_gone(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, fast()).await else { return };
    let key = app.tenant("acme").await;
    let a = Agent::new(&app, &key, "a", "t000000000001-0000000000000001").await;
    let b = Agent::new(&app, &key, "b", "t000000000001-0000000000000002").await;
    let id = submit(&app, &key, "A1", "receipt").await;
    assert_eq!(a.poll(&app, 1000).await.len(), 1);
    tokio::time::sleep(Duration::from_millis(700)).await; // past the deadline
    let app = app.restart(fast()).await;
    assert!(b.poll(&app, 600).await.is_empty());
    assert_eq!(task(&app, &key, &id).await["state"], "sent");
    assert_eq!(a.ack(&app, &id, 1, "printed").await, "applied");
    let trail: Vec<String> = common::events_of(&app, &key, &id).await.into_iter().map(|e| e.1).collect();
    assert_eq!(trail, vec!["pending", "sent", "printed"]);
    app.stop().await;
}

/// Review finding 9: a task minted before a restart by a clock that ran an hour ahead.
/// New tasks after the restart still sort after it: FIFO holds, and the business day of
/// a new task is never earlier than that of the tasks before it.
async fn ids_stay_in_order_when_the_clock_stepped_back_across_a_restart(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, fast()).await else { return };
    let key = app.tenant("acme").await;
    let agent = Agent::new(&app, &key, "a", "t000000000001-0000000000000001").await;
    let now = onceprint_engine::clock::now_ms();
    let ahead = onceprint_core::TaskId::from_parts(now + 3_600_000, [7; 10]).into_string();
    let submitted = app.store.submit_batch(vec![onceprint_store::NewTask {
        task_id: ahead.clone(),
        tenant_id: "acme".into(),
        store_id: "s1".into(),
        printer_id: "p1".into(),
        station_id: None,
        target: "printer:p1".into(),
        biz_no: "EARLY".into(),
        print_type: "receipt".into(),
        priority: 10,
        content_type: "text".into(),
        content: b"early\n".to_vec(),
        fingerprint: "fp".into(),
        actor: "tenant:acme".into(),
        charge: 1,
        now: now + 3_600_000,
        origin: None,
    }]);
    submitted.await.expect("the task from the clock that ran ahead");
    let app = app.restart(fast()).await;
    let later = submit(&app, &key, "LATER", "receipt").await;
    assert!(later > ahead, "{later} sorts after {ahead}");
    assert_eq!(drain(&app, &agent, Duration::from_secs(10)).await, vec![ahead, later]);
    app.stop().await;
}

/// Review finding 5: a transfer's successor is not charged again, so cancelling it must
/// refund the original's charge: the day shows one charge and one refund.
async fn cancelling_a_transferred_task_refunds_the_order_once(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, fast()).await else { return };
    let key = app.tenant("acme").await;
    let id = submit(&app, &key, "C1", "receipt").await;
    let who = json!({"operator": "alice", "reason": "printer broken"});
    let mut moved = who.clone();
    moved["printer_id"] = json!("p2");
    let t = app.post(&format!("/v1/print-tasks/{id}/transfer"), &key, moved).await;
    assert_eq!(t.status, StatusCode::CREATED, "{t:?}");
    let succ = t.body["created"]["task_id"].as_str().expect("successor").to_owned();
    let c = app.post(&format!("/v1/print-tasks/{succ}/cancel"), &key, who.clone()).await;
    assert_eq!(c.status, StatusCode::OK, "{c:?}");
    let again = app.post(&format!("/v1/print-tasks/{succ}/cancel"), &key, who).await;
    assert_eq!(again.code(), "invalid_transition");
    let day = chrono_like_today();
    let r = app.get(&format!("/v1/stores/s1/reconciliation?date={day}"), &key).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let (charges, refunds) = (&r.body["ledger"]["charges"], &r.body["ledger"]["refunds"]);
    assert_eq!((charges, refunds), (&json!(1), &json!(1)), "{}", r.body);
    app.stop().await;
}

fn chrono_like_today() -> String {
    let now = onceprint_engine::clock::rfc3339(onceprint_engine::clock::now_ms());
    now[..10].to_owned()
}

/// Review finding 6: only attempts that prove nothing printed allow a failover. A webhook
/// answering 5xx may have received the job; an earlier attempt that ended in doubt may
/// have printed. Either way the task waits for a person on its own printer.
async fn failover_never_moves_a_task_that_may_have_printed(backend: Backend) {
    let mut config = fast();
    for p in config.intake.policies.types.values_mut() {
        p.max_attempts = 2;
    }
    config.intake.policies.types.get_mut("kitchen").expect("kitchen").reprint_on_doubt = true;
    config.delivery.station_failover_after_ms = 0;
    // A job the endpoint answered 5xx is sent again with its key until this, then a person.
    config.push.doubt_after_ms = 1_500;
    let Some(app) = TestApp::spawn_with(backend, config).await else { return };
    let key = app.tenant("acme").await;
    // A cloud printer whose endpoint fails with 500, backed up by p2.
    let (url, _vendor) = vendor(VendorMode::Fail500).await;
    let p = app
        .post(
            "/v1/printers",
            &key,
            json!({"id": "cloud", "store_id": "s1", "transport": {"kind": "webhook", "url": format!("{url}/jobs"), "secret": SECRET}}),
        )
        .await;
    assert_eq!(p.status, StatusCode::CREATED, "{p:?}");
    for (id, printers) in [("web", json!(["cloud", "p2"])), ("hot", json!(["p1", "p2"]))] {
        let s = app.post("/v1/stations", &key, json!({"id": id, "store_id": "s1", "printers": printers})).await;
        assert_eq!(s.status, StatusCode::CREATED, "{s:?}");
    }
    let w =
        app.submit(&key, json!({"biz_no": "W1", "station_id": "web", "content": {"type": "text", "text": "x"}})).await;
    let web = w.body["task_id"].as_str().expect("id").to_owned();
    let t = wait_state(&app, &key, &web, "in_doubt", Duration::from_secs(10)).await;
    assert!(t["successor_task_id"].is_null(), "a 5xx is not proof that nothing printed: {t}");
    assert_eq!(t["attempts"], 1, "sent again with the same key, never as a new attempt: {t}");

    let agent = Agent::new(&app, &key, "a", "t000000000001-0000000000000001").await;
    let k = app
        .submit(
            &key,
            json!({"biz_no": "K1", "station_id": "hot", "print_type": "kitchen", "content": {"type": "text", "text": "x"}}),
        )
        .await;
    let kitchen = k.body["task_id"].as_str().expect("id").to_owned();
    assert_eq!(agent.poll(&app, 1000).await.len(), 1);
    assert_eq!(agent.ack(&app, &kitchen, 1, "in_doubt").await, "applied"); // reprint on doubt: attempt 2
    let d = agent.poll_until(&app, Duration::from_secs(5)).await;
    assert_eq!(d.iter().map(task_of).collect::<Vec<_>>(), vec![(kitchen.clone(), 2)]);
    // Out of paper now: any other ticket of the station would move to p2 at once (the
    // threshold is 0); this one waits for its own printer.
    assert_eq!(agent.ack(&app, &kitchen, 2, "no_paper").await, "applied");
    let t = task(&app, &key, &kitchen).await;
    assert_eq!((t["state"].as_str(), t["last_error"].as_str()), (Some("retrying"), Some("no_paper")), "{t}");
    assert!(t["successor_task_id"].is_null(), "attempt 1 may have printed: {t}");
    assert!(app.all_tasks(&key).await.iter().all(|t| t["printer_id"] != "p2"), "nothing went to the backup");
    app.stop().await;
}

/// An agent that takes a delivery and never answers (it keeps polling) makes no
/// progress; past `stall_after_ms` the lane is `printer.stalled`, once, and `/metrics`
/// shows its in-flight age.
async fn a_lane_without_progress_raises_printer_stalled(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, fast()).await else { return };
    let key = app.tenant("acme").await;
    let (hook, got) = receiver(0).await;
    let w = app.post("/v1/webhooks", &key, json!({"id": "ops", "url": hook, "events": ["printer.stalled"]})).await;
    assert_eq!(w.status, StatusCode::CREATED, "{w:?}");
    let agent = Agent::new(&app, &key, "silent", "t000000000001-0000000000000001").await;
    submit(&app, &key, "A1", "receipt").await;
    let start = Instant::now();
    while got.lock().expect("lock").is_empty() {
        assert!(start.elapsed() < Duration::from_secs(10), "no printer.stalled alert");
        let _ = agent.poll(&app, 200).await; // takes the delivery again and again, never answers
    }
    assert!(start.elapsed() >= Duration::from_millis(1_400), "stalled too early: {:?}", start.elapsed());
    let metrics =
        app.http.get(format!("{}/metrics", app.base)).send().await.expect("metrics").text().await.expect("text");
    assert!(metrics.contains(r#"onceprint_lane_stalled{tenant="acme",store="s1",printer="p1"} 1"#), "{metrics}");
    assert!(metrics.contains("onceprint_lane_in_flight_seconds{"), "{metrics}");
    tokio::time::sleep(Duration::from_millis(800)).await;
    let alerts: Vec<Value> =
        got.lock().expect("lock").iter().map(|(_, b)| serde_json::from_str(b).unwrap_or_default()).collect();
    assert_eq!(alerts.len(), 1, "one alert per stall: {alerts:?}");
    assert_eq!(
        (alerts[0]["type"].as_str(), alerts[0]["data"]["printer_id"].as_str()),
        (Some("printer.stalled"), Some("p1"))
    );
    app.stop().await;
}

const SECRET: &str = "vendor-shared-secret-123";

#[derive(Clone, Copy, PartialEq)]
enum VendorMode {
    /// Takes every job, says "pending" for jobs it has, "unknown" for others.
    Normal,
    /// Answers 202 to the first job but loses it (as when the broker died mid-POST).
    LoseFirst,
    /// Answers 500 to every job.
    Fail500,
    /// Takes jobs and says "pending" for ever.
    Silent,
}

#[derive(Default)]
struct VendorState {
    jobs: Vec<(HeaderMap, Value)>,
    status_asks: usize,
    lost: bool,
}

async fn vendor(mode: VendorMode) -> (String, Arc<Mutex<VendorState>>) {
    let state = Arc::new(Mutex::new(VendorState::default()));
    let (s1, s2) = (state.clone(), state.clone());
    let app = axum::Router::new()
        .route(
            "/jobs",
            axum::routing::post(move |headers: HeaderMap, body: String| {
                let s = s1.clone();
                async move {
                    let mut s = s.lock().expect("lock");
                    match mode {
                        VendorMode::Fail500 => return StatusCode::INTERNAL_SERVER_ERROR,
                        VendorMode::LoseFirst if !s.lost => {
                            s.lost = true;
                            return StatusCode::ACCEPTED;
                        }
                        _ => {}
                    }
                    s.jobs.push((headers, serde_json::from_str(&body).unwrap_or_default()));
                    StatusCode::ACCEPTED
                }
            }),
        )
        .route(
            "/status",
            axum::routing::get(move |Query(q): Query<HashMap<String, String>>| {
                let s = s2.clone();
                async move {
                    let mut s = s.lock().expect("lock");
                    s.status_asks += 1;
                    let known =
                        s.jobs.iter().any(|(_, j)| j["task_id"].as_str() == q.get("task_id").map(String::as_str));
                    let status = if known || mode == VendorMode::Silent { "pending" } else { "unknown" };
                    axum::Json(json!({"status": status}))
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), state)
}

async fn webhook_printer(app: &TestApp, key: &str, id: &str, url: &str, status: bool) {
    let mut transport = json!({"kind": "webhook", "url": format!("{url}/jobs"), "secret": SECRET});
    if status {
        transport["status_url"] = json!(format!("{url}/status"));
    }
    let p = app.post("/v1/printers", key, json!({"id": id, "store_id": "s1", "transport": transport})).await;
    assert_eq!(p.status, StatusCode::CREATED, "{p:?}");
}

async fn report(app: &TestApp, printer: &str, task_id: &str, status: &str) -> Value {
    let ts = onceprint_engine::clock::now_ms() / 1000;
    common::callback(app, printer, json!({"task_id": task_id, "status": status}), SECRET, ts).await.body
}

async fn wait_jobs(v: &Arc<Mutex<VendorState>>, n: usize, within: Duration) {
    let start = Instant::now();
    while v.lock().expect("lock").jobs.len() < n {
        assert!(start.elapsed() < within, "the vendor got {} jobs", v.lock().expect("lock").jobs.len());
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
}

/// Review notes: the sweeper once took the webhook pusher for an agent that went away, so
/// in a store with a live agent a webhook task without an answer went to `in_doubt`
/// instead of being asked about through its status URL.
async fn webhook_tasks_in_a_store_with_a_live_agent_are_asked_about_not_doubted(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, fast()).await else { return };
    let key = app.tenant("acme").await;
    let (url, v) = vendor(VendorMode::Normal).await;
    webhook_printer(&app, &key, "cloud", &url, true).await;
    let agent = Agent::new(&app, &key, "a", "t000000000001-0000000000000001").await;
    let a = app
        .submit(&key, json!({"biz_no": "W1", "printer_id": "cloud", "content": {"type": "text", "text": "x"}}))
        .await;
    let id = a.body["task_id"].as_str().expect("id").to_owned();
    wait_jobs(&v, 1, Duration::from_secs(5)).await;
    // Well past the recheck, the deadline and agent_gone_after_ms, with the agent polling.
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(2_500) {
        assert!(agent.poll(&app, 200).await.is_empty(), "agents never get a webhook printer's lane");
    }
    let t = task(&app, &key, &id).await;
    assert_eq!(t["state"], "sent", "{t}\n{:?}", common::events_of(&app, &key, &id).await);
    assert!(v.lock().expect("lock").status_asks > 0, "the status URL was asked");
    assert_eq!(v.lock().expect("lock").jobs.len(), 1, "the vendor has it: not sent again");
    assert_eq!(report(&app, "cloud", &id, "printed").await["result"], "applied");
    assert_eq!(task(&app, &key, &id).await["state"], "printed");
    app.stop().await;
}

/// Review finding 2 and the banner: a receipt, a prebill and a reprint of one order on
/// one webhook printer carry three different Idempotency-Keys (a receiver that prints once
/// per key prints all three), and the reprint says it is one.
async fn webhook_deliveries_carry_distinct_keys_and_the_reprint_banner(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, fast()).await else { return };
    let key = app.tenant("acme").await;
    let (url, v) = vendor(VendorMode::Normal).await;
    webhook_printer(&app, &key, "cloud", &url, false).await;
    let mut ids = Vec::new();
    for print_type in ["receipt", "prebill"] {
        let a = app
            .submit(
                &key,
                json!({"biz_no": "A1#x", "printer_id": "cloud", "print_type": print_type, "content": {"type": "text", "text": "Order A1\n"}}),
            )
            .await;
        let id = a.body["task_id"].as_str().expect("id").to_owned();
        wait_jobs(&v, ids.len() + 1, Duration::from_secs(5)).await;
        assert_eq!(report(&app, "cloud", &id, "printed").await["result"], "applied");
        ids.push(id);
    }
    let r = app
        .post(&format!("/v1/print-tasks/{}/reprint", ids[0]), &key, json!({"operator": "alice", "reason": "smudged"}))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    wait_jobs(&v, 3, Duration::from_secs(5)).await;
    let jobs: Vec<(String, Value)> = v
        .lock()
        .expect("lock")
        .jobs
        .iter()
        .map(|(h, j)| (h.get("idempotency-key").and_then(|k| k.to_str().ok()).unwrap_or("").to_owned(), j.clone()))
        .collect();
    let keys: Vec<&str> = jobs.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys[0], "A1%23x#cloud");
    assert_eq!(keys[1], "A1%23x#cloud#type=prebill");
    assert!(keys[2].starts_with("A1%23x#cloud#reprint=1#origin="), "{keys:?}");
    assert_eq!(jobs[2].1["idempotency_key"], keys[2], "the body carries the same key");
    let data =
        base64::engine::general_purpose::STANDARD.decode(jobs[2].1["data"].as_str().unwrap_or("")).expect("data");
    assert!(data.windows(15).any(|w| w == b"*** REPRINT 1 *"), "the reprint banner is on the job");
    let first =
        base64::engine::general_purpose::STANDARD.decode(jobs[0].1["data"].as_str().unwrap_or("")).expect("data");
    assert!(!first.windows(7).any(|w| w == b"REPRINT"), "the original has none");
    app.stop().await;
}

/// Review finding 4: a job the receiver never got (the broker died while POSTing it, or
/// the request was lost) and whose status URL says "unknown" is sent again with the same
/// key, instead of being asked about for ever.
async fn a_webhook_job_the_receiver_never_got_is_sent_again(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, fast()).await else { return };
    let key = app.tenant("acme").await;
    let (url, v) = vendor(VendorMode::LoseFirst).await;
    webhook_printer(&app, &key, "cloud", &url, true).await;
    let a = app
        .submit(&key, json!({"biz_no": "L1", "printer_id": "cloud", "content": {"type": "text", "text": "x"}}))
        .await;
    let id = a.body["task_id"].as_str().expect("id").to_owned();
    wait_jobs(&v, 1, Duration::from_secs(5)).await;
    let (header, body) = v.lock().expect("lock").jobs[0].clone();
    assert_eq!(header.get("idempotency-key").and_then(|k| k.to_str().ok()), Some("L1#cloud"));
    assert_eq!(body["attempt"], 1, "the same attempt, sent again");
    assert_eq!(report(&app, "cloud", &id, "printed").await["result"], "applied");
    app.stop().await;
}

/// Review finding 4, the other half: a receiver that takes a job and never says what
/// became of it does not keep the task `sent` for ever; after `doubt_after_ms` it waits
/// for a person (with its alert), like any delivery nobody can answer.
async fn a_webhook_job_nobody_answers_goes_to_a_person(backend: Backend) {
    let mut config = fast();
    config.push.doubt_after_ms = 1_200;
    let Some(app) = TestApp::spawn_with(backend, config).await else { return };
    let key = app.tenant("acme").await;
    let (url, v) = vendor(VendorMode::Silent).await;
    webhook_printer(&app, &key, "cloud", &url, true).await;
    let a = app
        .submit(&key, json!({"biz_no": "S1", "printer_id": "cloud", "content": {"type": "text", "text": "x"}}))
        .await;
    let id = a.body["task_id"].as_str().expect("id").to_owned();
    let t = wait_state(&app, &key, &id, "in_doubt", Duration::from_secs(10)).await;
    assert_eq!(t["attempts"], 1, "{t}");
    assert_eq!(v.lock().expect("lock").jobs.len(), 1, "never sent twice: the receiver said it had it");
    let attention = app.get("/v1/stores/s1/attention", &key).await.body;
    assert_eq!(attention["tasks"][0]["task_id"], id.as_str(), "{attention}");
    app.stop().await;
}

/// Which of an agent id's processes is the newer is decided on the broker's clock.
/// The shop PC's clock ran an hour ahead (its session id carries that time); it is set
/// right and the agent restarted (systemd): the restarted process names an earlier time,
/// and is still the one that takes over the lane, with or without reporting its age.
async fn a_shop_pc_clock_an_hour_ahead_then_corrected_never_stalls_the_lane(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, fast()).await else { return };
    let key = app.tenant("acme").await;
    let now_ms = || {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
    };
    let session = |at: i64, n: u64| onceprint_core::ids::agent_session_id(at, n);
    let poll = |agent: &Agent, age: Option<u64>| {
        let mut body = json!({"agent_id": agent.id, "session": agent.session, "wait_ms": 300, "max": 16});
        if let Some(a) = age {
            body["session_age_ms"] = json!(a);
        }
        let token = agent.token.clone();
        let app = &app;
        async move { app.post("/v1/agent/poll", &token, body).await }
    };
    for (round, reports_age) in [(0, true), (1, false)] {
        let ahead = Agent::new(&app, &key, &format!("pc-{round}"), &session(now_ms() + 3_600_000, 1)).await;
        let id = submit(&app, &key, &format!("C{round}"), "receipt").await;
        let a = poll(&ahead, reports_age.then_some(60_000)).await;
        assert_eq!(a.status, StatusCode::OK, "{a:?}");
        assert_eq!(a.body["deliveries"][0]["task_id"], id.as_str(), "{:?}", a.body);
        // kill -9; the clock is set right; systemd starts the agent again.
        let corrected = Agent { session: session(now_ms(), 2), ..ahead.clone() };
        let start = Instant::now();
        let delivered = loop {
            let a = poll(&corrected, reports_age.then_some(200)).await;
            assert_eq!(a.status, StatusCode::OK, "the restarted process must not be superseded: {a:?}");
            if let Some(d) = a.body["deliveries"].as_array().and_then(|d| d.first().cloned()) {
                break d;
            }
            assert!(start.elapsed() < Duration::from_secs(10), "the lane stalled behind the old session");
        };
        assert_eq!(task_of(&delivered), (id.clone(), 2), "offered to the restarted process: {delivered}");
        assert_eq!(corrected.ack(&app, &id, 2, "printed").await, "applied");
        // The earlier process, should it come back, is fenced.
        let a = poll(&ahead, reports_age.then_some(61_000)).await;
        assert_eq!((a.status, a.code()), (StatusCode::CONFLICT, "agent_superseded"), "{a:?}");
    }
    app.stop().await;
}
