//! The shared first gate with the real binary: three `onceprint serve` nodes on one fresh
//! PostgreSQL schema, with `--redis-url` to a `redis-server` this test starts (and kills).
//!
//! 1. A task submitted on node A is answered on node B as a duplicate *from the shared
//!    gate* (the answer's `x-onceprint-gate: shared` header, and B's
//!    `onceprint_shared_gate_answers_total` moved), with its current state after node A
//!    changed it; other content under the key on node C is a 422, also from the gate.
//! 2. 2,000 keys, each sent to two or three nodes at once, while Redis is killed with
//!    SIGKILL a third of the way in and started again on the same port two thirds in:
//!    every request answered 201 or 200 (never a 5xx), exactly one 201 per key and every
//!    answer naming the same task, exactly one task row per key in the database (counted
//!    with SQL), intake going on while Redis was down (the gate bypassed), and the gate
//!    used again after the restart.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::broker::{temp_dir, Api, Broker};
use onceprint_redis_gate::testing::RedisServer;
use serde_json::{json, Value};

const KEYS: usize = 2_000;
/// Keys in flight at once (each sent to two or three nodes).
const PARALLEL: usize = 24;

/// One submission's answer: status, body, and which gate answered (if any).
struct Answer {
    status: u16,
    body: Value,
    gate: Option<String>,
}

async fn submit(http: &reqwest::Client, base: &str, key: &str, biz_no: &str, text: &str) -> Answer {
    let res = http
        .post(format!("{base}/v1/print-tasks"))
        .bearer_auth(key)
        .json(&json!({"biz_no": biz_no, "printer_id": "p1", "content": {"type": "text", "text": text}}))
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST /v1/print-tasks on {base}: {e}"));
    let status = res.status().as_u16();
    let gate = res.headers().get("x-onceprint-gate").and_then(|v| v.to_str().ok()).map(str::to_owned);
    Answer { status, body: res.json().await.unwrap_or(Value::Null), gate }
}

/// The value of one metric line (`name` with its labels, as rendered) on a node.
async fn metric(http: &reqwest::Client, base: &str, name: &str) -> f64 {
    let text =
        http.get(format!("{base}/metrics")).send().await.expect("GET /metrics").text().await.expect("metrics text");
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_share_the_gate_and_survive_redis_being_killed() {
    let Some(schema) = onceprint_store_postgres::testing::fresh_schema().await else { return };
    let Some(mut redis) = RedisServer::start() else { return };
    let dir = temp_dir("cluster-gate");
    // A small pool per node (three nodes share the test server with other tests), no
    // tenant rate limit (the run sends thousands of requests in seconds).
    std::fs::write(dir.join("node.toml"), "postgres_pool_size = 6\n").expect("config");
    let config = dir.join("node.toml").display().to_string();
    let redis_url = redis.url();
    // The timeout is generous: this test is about what is answered, not how fast, and
    // three nodes, Redis and PostgreSQL share two cores here.
    let args = [
        "--config",
        &config,
        "--redis-url",
        &redis_url,
        "--redis-prefix",
        "cluster-gate:",
        "--redis-timeout-ms",
        "500",
        "--tenant-rate-limit",
        "0",
    ];
    let nodes: Vec<Broker> = ["a", "b", "c"]
        .iter()
        .map(|n| Broker::start(schema.url(), &args, &[], &dir.join(format!("node-{n}.log"))))
        .collect();
    let bases: Vec<String> = nodes.iter().map(|n| n.base.clone()).collect();
    let (a, b, c) = (&bases[0], &bases[1], &bases[2]);
    let api = Api::tenant(a, "t1", "UTC", &["p1"]).await;
    let http = reqwest::Client::new();

    // 1. Node A commits; node B answers the retry from the shared gate.
    let first = submit(&http, a, &api.key, "G1", "one").await;
    assert_eq!(first.status, 201, "{}", first.body);
    let task_id = first.body["task_id"].as_str().expect("task id").to_owned();
    let dup = submit(&http, b, &api.key, "G1", "one").await;
    assert_eq!((dup.status, dup.body["task_id"].as_str()), (200, Some(task_id.as_str())), "{}", dup.body);
    assert_eq!(dup.body["duplicate"], true);
    assert_eq!(dup.gate.as_deref(), Some("shared"), "node B answered from the shared gate");
    assert_eq!(metric(&http, b, "onceprint_shared_gate_answers_total").await, 1.0);
    assert_eq!(metric(&http, b, "onceprint_submissions_total{outcome=\"duplicate_shared_gate\"}").await, 1.0);
    // Other content under the same key, on node C: a mismatch, also from the gate.
    let other = submit(&http, c, &api.key, "G1", "other content").await;
    assert_eq!(other.status, 422, "{}", other.body);
    assert_eq!(other.body["error"]["code"], "idempotency_mismatch", "{}", other.body);
    assert_eq!(metric(&http, c, "onceprint_shared_gate_answers_total").await, 1.0);

    // The state in a shared-gate answer is read by task id: current after node A moved
    // the task, on a node that never saw it.
    let second = submit(&http, a, &api.key, "G2", "two").await;
    assert_eq!(second.status, 201, "{}", second.body);
    let second_id = second.body["task_id"].as_str().expect("task id").to_owned();
    let (status, body) = api
        .post(&format!("/v1/print-tasks/{second_id}/cancel"), json!({"operator": "test", "reason": "state moves"}))
        .await;
    assert_eq!(status, 200, "{body}");
    let late = submit(&http, c, &api.key, "G2", "two").await;
    assert_eq!((late.status, late.gate.as_deref()), (200, Some("shared")), "{}", late.body);
    assert_eq!(late.body["state"], "cancelled", "{}", late.body);

    // 2. Many keys on several nodes at once, Redis killed in the middle.
    let done = Arc::new(AtomicUsize::new(0));
    let down_answers = Arc::new(AtomicUsize::new(0));
    let redis_down = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sem = Arc::new(tokio::sync::Semaphore::new(PARALLEL));
    let mut jobs = Vec::with_capacity(KEYS);
    let started = Instant::now();
    let mut killed_at = None;
    let mut restarted_at = None;
    for i in 0..KEYS {
        // Kill and restart happen while requests are in flight.
        if i == KEYS / 3 {
            while done.load(Ordering::Acquire) + PARALLEL < i {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            redis.kill();
            redis_down.store(true, Ordering::Release);
            killed_at = Some(started.elapsed());
        }
        if i == 2 * KEYS / 3 {
            while done.load(Ordering::Acquire) + PARALLEL < i {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            redis_down.store(false, Ordering::Release);
            redis.restart();
            restarted_at = Some(started.elapsed());
        }
        let permit = sem.clone().acquire_owned().await.expect("semaphore");
        let http = http.clone();
        let key = api.key.clone();
        // Two or three nodes per key, starting on a different one each time.
        let targets: Vec<String> = (0..2 + i % 2).map(|n| bases[(i + n) % 3].clone()).collect();
        let (done, down_answers, redis_down) = (done.clone(), down_answers.clone(), redis_down.clone());
        jobs.push(tokio::spawn(async move {
            let biz_no = format!("K{i:05}");
            let text = format!("ticket {i}");
            // The same submission to every target node at once.
            let sends: Vec<_> = targets
                .into_iter()
                .map(|base| {
                    let (http, key, biz_no, text) = (http.clone(), key.clone(), biz_no.clone(), text.clone());
                    tokio::spawn(async move { submit(&http, &base, &key, &biz_no, &text).await })
                })
                .collect();
            let mut answers = Vec::with_capacity(sends.len());
            for send in sends {
                answers.push(send.await.expect("submission"));
            }
            if redis_down.load(Ordering::Acquire) {
                down_answers.fetch_add(answers.len(), Ordering::Relaxed);
            }
            done.fetch_add(1, Ordering::Release);
            drop(permit);
            (biz_no, answers)
        }));
    }
    let mut by_source: HashMap<String, usize> = HashMap::new();
    let mut task_of: HashMap<String, String> = HashMap::new();
    for job in jobs {
        let (biz_no, answers) = job.await.expect("job");
        let created = answers.iter().filter(|a| a.status == 201).count();
        for a in &answers {
            assert!(a.status == 201 || a.status == 200, "{biz_no}: {} {}", a.status, a.body);
            *by_source.entry(a.gate.clone().unwrap_or_else(|| "database".into())).or_default() += 1;
        }
        assert_eq!(created, 1, "{biz_no}: exactly one submission created the task");
        let ids: Vec<&str> = answers.iter().filter_map(|a| a.body["task_id"].as_str()).collect();
        assert!(ids.len() == answers.len() && ids.iter().all(|id| *id == ids[0]), "{biz_no}: one task id: {ids:?}");
        task_of.insert(biz_no, ids[0].to_owned());
    }
    let elapsed = started.elapsed();
    assert!(down_answers.load(Ordering::Relaxed) > 0, "intake went on while Redis was down");
    let mut bypassed = 0.0;
    for base in &bases {
        bypassed += metric(&http, base, "onceprint_shared_gate_bypassed_total").await;
    }
    assert!(bypassed > 0.0, "the nodes bypassed the gate while Redis was down");
    eprintln!(
        "{KEYS} keys in {elapsed:?} (Redis killed at {killed_at:?}, back at {restarted_at:?}); answers by source: \
         {by_source:?}; {} answered while Redis was down; bypassed calls on all nodes: {bypassed}",
        down_answers.load(Ordering::Relaxed)
    );

    // Exactly one task per key, counted in the database.
    let (client, connection) = tokio_postgres::connect(schema.url(), tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(connection);
    let row = client
        .query_one(
            "SELECT count(*), count(DISTINCT biz_no) FROM tasks WHERE tenant_id = 't1' AND biz_no LIKE 'K%'",
            &[],
        )
        .await
        .expect("count");
    let (rows, keys): (i64, i64) = (row.get(0), row.get(1));
    assert_eq!((rows, keys), (KEYS as i64, KEYS as i64), "one task row per key");
    let ids: Vec<String> = client
        .query("SELECT id FROM tasks WHERE tenant_id = 't1' AND biz_no LIKE 'K%'", &[])
        .await
        .expect("ids")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let answered: std::collections::HashSet<&String> = task_of.values().collect();
    assert!(ids.iter().all(|id| answered.contains(id)), "every row is a task that was answered");

    // After the restart the gate is used again: a new key committed on one node is
    // answered from the gate on another (once the nodes' back-off has passed).
    let mut used_again = false;
    for n in 0..100 {
        let biz_no = format!("R{n}");
        let created = submit(&http, a, &api.key, &biz_no, "after").await;
        assert_eq!(created.status, 201, "{}", created.body);
        let dup = submit(&http, b, &api.key, &biz_no, "after").await;
        assert_eq!(dup.status, 200, "{}", dup.body);
        if dup.gate.as_deref() == Some("shared") {
            used_again = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(used_again, "the shared gate answered again after Redis was restarted");
    assert_eq!(metric(&http, b, "onceprint_shared_gate_up").await, 1.0);
    // Every node finds Redis again once it next asks (a node whose last call before the
    // restart failed is in its back-off until then): a retry to each node of a task
    // committed on A is answered from the shared gate.
    for (name, node) in [("a", a), ("c", c)] {
        let mut back = false;
        for n in 0..50 {
            let biz_no = format!("B{name}{n}");
            let created = submit(&http, b, &api.key, &biz_no, "back").await;
            assert_eq!(created.status, 201, "{}", created.body);
            let dup = submit(&http, node, &api.key, &biz_no, "back").await;
            assert_eq!(dup.status, 200, "{}", dup.body);
            if dup.gate.as_deref() == Some("shared") {
                back = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(back, "node {name} uses the shared gate again after Redis was restarted");
    }

    for node in nodes {
        assert!(node.stop().success(), "a node did not stop cleanly");
    }
    // One log line when Redis went away and one when it was back, not one per request.
    let mut gone_lines = 0;
    for n in ["a", "b", "c"] {
        let log = std::fs::read_to_string(dir.join(format!("node-{n}.log"))).expect("node log");
        let gone = log.matches("shared gate unreachable").count();
        let back = log.matches("shared gate reachable again").count();
        assert!(gone >= 1 && back >= 1, "node {n} logged the outage ({gone}) and the return ({back})");
        gone_lines += gone;
    }
    assert!(gone_lines < 30, "outage lines are not per request: {gone_lines}");
    let _ = std::fs::remove_dir_all(&dir);
    drop(schema);
}
