//! Three `onceprint serve` nodes on one fresh PostgreSQL schema: work that must
//! happen once per cluster runs on the holder of its lease only, a dead holder's work is
//! taken over within seconds, and the agent registry is shared, so that an agent whose
//! polls reach different nodes is not taken for gone by the node that sweeps.
//!
//! Needs `ONCEPRINT_TEST_POSTGRES`; without it the tests say they were skipped.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode};
use common::broker::{temp_dir, Api, Broker};
use serde_json::{json, Value};

const SECRET: &str = "vendor-shared-secret-123";

/// Short leases and a short "gone", so that take-overs happen within a test's patience.
const CONFIG: &str = r#"
lease_renew_ms = 300
lease_ttl_ms = 1500
agent_sync_interval_ms = 200
agent_gone_after_ms = 3000
takeover_quiet_ms = 1000
sweep_interval_ms = 200
redeliver_after_ms = 1000
"#;

async fn schema() -> Option<onceprint_store_postgres::testing::SchemaGuard> {
    let guard = onceprint_store_postgres::testing::fresh_schema().await;
    if guard.is_none() {
        let env = onceprint_store_postgres::testing::ENV;
        let _ = writeln!(std::io::stderr(), "SKIPPED: the cluster tests need {env}=postgres://… (not set)");
    }
    guard
}

fn start_nodes(url: &str, dir: &Path, n: usize) -> Vec<Broker> {
    let config = dir.join("onceprint.toml");
    std::fs::write(&config, CONFIG).expect("config");
    let config = config.to_string_lossy().into_owned();
    (0..n)
        .map(|i| {
            let node = format!("node-{i}");
            Broker::start(url, &["--config", &config, "--node-id", &node], &[], &dir.join(format!("{node}.log")))
        })
        .collect()
}

/// The node id holding lease `name`, from the nodes' `/metrics` (`None`: nobody, or more
/// than one node claims it — which the caller treats as "not settled yet").
async fn holder(nodes: &[Option<&Broker>], name: &str) -> Option<String> {
    let http = reqwest::Client::new();
    let mut holders = Vec::new();
    for b in nodes.iter().flatten() {
        let Ok(res) = http.get(format!("{}/metrics", b.base)).send().await else { continue };
        let text = res.text().await.unwrap_or_default();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix(&format!("onceprint_lease_held{{name=\"{name}\",node_id=\"")) else {
                continue;
            };
            if let Some((node, value)) = rest.split_once("\"} ") {
                if value.trim() == "1" {
                    holders.push(node.to_owned());
                }
            }
        }
    }
    (holders.len() == 1).then(|| holders.remove(0))
}

async fn wait_holder(nodes: &[Option<&Broker>], name: &str, within: Duration) -> String {
    let start = Instant::now();
    loop {
        if let Some(h) = holder(nodes, name).await {
            return h;
        }
        assert!(start.elapsed() < within, "no single holder of lease {name} within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn live(nodes: &[Option<Broker>]) -> Vec<Option<&Broker>> {
    nodes.iter().map(|n| n.as_ref()).collect()
}

fn index_of(node: &str) -> usize {
    node.strip_prefix("node-").and_then(|n| n.parse().ok()).expect("node-N")
}

/// A webhook receiver: records every job with the node that pushed it, and knows which
/// delivery keys it has (its status URL says "printed" for those, 404 for others).
#[derive(Default)]
struct Receiver {
    /// (task id, idempotency key, pushing node), in arrival order.
    jobs: Vec<(String, String, String)>,
}

async fn receiver() -> (String, Arc<Mutex<Receiver>>) {
    let state = Arc::new(Mutex::new(Receiver::default()));
    let (s1, s2) = (state.clone(), state.clone());
    let app = axum::Router::new()
        .route(
            "/jobs",
            axum::routing::post(move |headers: HeaderMap, body: String| {
                let s = s1.clone();
                async move {
                    let v: Value = serde_json::from_str(&body).unwrap_or_default();
                    let header = |h: &str| headers.get(h).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
                    s.lock().expect("lock").jobs.push((
                        v["task_id"].as_str().unwrap_or("").to_owned(),
                        header("idempotency-key"),
                        header("x-onceprint-node"),
                    ));
                    StatusCode::ACCEPTED
                }
            }),
        )
        .route(
            "/status",
            axum::routing::get(move |q: axum::extract::Query<BTreeMap<String, String>>| {
                let s = s2.clone();
                async move {
                    let key = q.get("idempotency_key").cloned().unwrap_or_default();
                    if s.lock().expect("lock").jobs.iter().any(|j| j.1 == key) {
                        (StatusCode::OK, axum::Json(json!({"status": "printed"})))
                    } else {
                        (StatusCode::NOT_FOUND, axum::Json(json!({"status": "unknown"})))
                    }
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

fn sign(secret: &str, ts: i64, body: &str) -> String {
    use hmac::Mac;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).expect("key");
    mac.update(format!("{ts}.{body}").as_bytes());
    let hex: String = mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect();
    format!("t={ts},v1={hex}")
}

/// Reports every job the receiver got as printed, through a signed callback to one of the
/// live nodes in turn (a callback may reach any node).
async fn confirm_jobs(
    rx: &Arc<Mutex<Receiver>>,
    printers: &BTreeMap<String, String>,
    bases: &[String],
    done: &mut usize,
) {
    let http = reqwest::Client::new();
    let jobs: Vec<(String, String, String)> = rx.lock().expect("lock").jobs[*done..].to_vec();
    for (i, (task_id, key, _)) in jobs.iter().enumerate() {
        let Some(printer) = printers.get(key.split('#').nth(1).unwrap_or_default()) else { continue };
        let body = json!({"task_id": task_id, "status": "printed"}).to_string();
        let ts = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let base = &bases[(*done + i) % bases.len()];
        let _ = http
            .post(format!("{base}/v1/callbacks/{printer}"))
            .header("content-type", "application/json")
            .header("x-onceprint-signature", sign(SECRET, ts as i64, &body))
            .body(body)
            .send()
            .await;
    }
    *done += jobs.len();
}

async fn states(api: &Api, ids: &[String]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for id in ids {
        let (_, t) = api.get(&format!("/v1/print-tasks/{id}")).await;
        out.insert(id.clone(), t["state"].as_str().unwrap_or("?").to_owned());
    }
    out
}

/// Confirms jobs as they arrive until every task is printed.
async fn drain(
    api: &Api,
    rx: &Arc<Mutex<Receiver>>,
    printers: &BTreeMap<String, String>,
    bases: &[String],
    ids: &[String],
    done: &mut usize,
    within: Duration,
) {
    let start = Instant::now();
    loop {
        confirm_jobs(rx, printers, bases, done).await;
        let s = states(api, ids).await;
        if s.values().all(|st| st == "printed") {
            return;
        }
        assert!(start.elapsed() < within, "not all printed within {within:?}: {s:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_node_pushes_and_another_takes_over_when_it_is_killed() {
    let Some(guard) = schema().await else { return };
    let dir = temp_dir("cluster-push");
    let mut nodes: Vec<Option<Broker>> = start_nodes(guard.url(), &dir, 3).into_iter().map(Some).collect();
    let api = Api::tenant(&nodes[0].as_ref().expect("node").base, "acme", "UTC", &[]).await;
    let (url, rx) = receiver().await;
    let mut printers = BTreeMap::new();
    for p in ["w1", "w2", "w3", "w4"] {
        let (status, body) = api
            .post(
                "/v1/printers",
                json!({"id": p, "store_id": "s1", "transport": {"kind": "webhook", "url": format!("{url}/jobs"),
                       "secret": SECRET, "status_url": format!("{url}/status")}}),
            )
            .await;
        assert_eq!(status, 201, "{body}");
        printers.insert(p.to_owned(), p.to_owned());
    }
    let first = wait_holder(&live(&nodes), "push:webhook", Duration::from_secs(15)).await;

    // All three run: tasks submitted to every node are pushed by the holder alone, each
    // delivery key once.
    let bases: Vec<String> = nodes.iter().flatten().map(|b| b.base.clone()).collect();
    let mut ids = Vec::new();
    for i in 0..24 {
        let (status, body) = api.on(&bases[i % 3]).submit(&format!("A{i}"), &format!("w{}", 1 + i % 4), "hi\n").await;
        assert_eq!(status, 201, "{body}");
        ids.push(body["task_id"].as_str().expect("id").to_owned());
    }
    let mut done = 0;
    drain(&api, &rx, &printers, &bases, &ids, &mut done, Duration::from_secs(60)).await;
    {
        let r = rx.lock().expect("lock");
        let keys: Vec<&String> = r.jobs.iter().map(|j| &j.1).collect();
        let unique: BTreeSet<&String> = keys.iter().copied().collect();
        assert_eq!(keys.len(), unique.len(), "each delivery key pushed once while all nodes run: {:?}", r.jobs);
        assert_eq!(unique.len(), ids.len());
        let pushers: BTreeSet<&String> = r.jobs.iter().map(|j| &j.2).collect();
        assert_eq!(pushers, BTreeSet::from([&first]), "only the lease holder pushes");
    }

    // The holder dies (kill -9) with work submitted: another node takes the lease over and
    // delivers the rest; a delivery the dead node had pushed is asked about first, never
    // sent under another key.
    let before = rx.lock().expect("lock").jobs.len();
    let mut more = Vec::new();
    for i in 0..24 {
        let (status, body) = api.on(&bases[i % 3]).submit(&format!("B{i}"), &format!("w{}", 1 + i % 4), "hi\n").await;
        assert_eq!(status, 201, "{body}");
        more.push(body["task_id"].as_str().expect("id").to_owned());
    }
    let dead = index_of(&first);
    let killed_at = Instant::now();
    if let Some(mut b) = nodes[dead].take() {
        let _ = b.child.kill();
        let _ = b.child.wait();
    }
    let survivors: Vec<String> = nodes.iter().flatten().map(|b| b.base.clone()).collect();
    let api = api.on(&survivors[0]);
    let second = wait_holder(&live(&nodes), "push:webhook", Duration::from_secs(15)).await;
    assert_ne!(second, first, "a surviving node holds the lease");
    let took_over = killed_at.elapsed();
    drain(&api, &rx, &printers, &survivors, &more, &mut done, Duration::from_secs(60)).await;
    // Reported, not asserted (no timing assertions in tests).
    eprintln!(
        "take-over: lease held by {second} {took_over:?} after the kill, all delivered after {:?}",
        killed_at.elapsed()
    );
    let r = rx.lock().expect("lock");
    let mut keys_of: BTreeMap<&String, BTreeSet<&String>> = BTreeMap::new();
    for (task, key, _) in &r.jobs {
        keys_of.entry(task).or_default().insert(key);
    }
    assert_eq!(keys_of.len(), ids.len() + more.len(), "every task was pushed");
    assert!(keys_of.values().all(|k| k.len() == 1), "no task pushed under two keys: {keys_of:?}");
    let after: BTreeSet<&String> = r.jobs[before..].iter().map(|j| &j.2).collect();
    assert!(
        after.iter().all(|n| **n == first || **n == second),
        "after the kill only the new holder pushes: {after:?}"
    );
    let mut seen_after_takeover = BTreeSet::new();
    for (_, key, node) in r.jobs[before..].iter().filter(|j| j.2 == second) {
        assert!(seen_after_takeover.insert(key), "the new holder pushed {key} twice");
        let _ = node;
    }
    drop(r);
    for b in nodes.into_iter().flatten() {
        assert!(b.stop().success());
    }
}

async fn poll(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    agent: &str,
    session: &str,
    wait_ms: u64,
) -> (u16, Value) {
    let res = http
        .post(format!("{base}/v1/agent/poll"))
        .bearer_auth(token)
        .json(&json!({"agent_id": agent, "session": session, "wait_ms": wait_ms, "max": 16}))
        .send()
        .await
        .expect("poll");
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_polling_other_nodes_is_not_gone_and_one_that_stopped_is() {
    let Some(guard) = schema().await else { return };
    let dir = temp_dir("cluster-agents");
    let nodes = start_nodes(guard.url(), &dir, 3);
    let all: Vec<Option<&Broker>> = nodes.iter().map(Some).collect();
    let api = Api::tenant(&nodes[0].base, "acme", "UTC", &["p1"]).await;
    let (status, tok) = api.post("/v1/stores/s1/agent-tokens", json!({})).await;
    assert_eq!(status, 201, "{tok}");
    let token = tok["token"].as_str().expect("token").to_owned();
    let sweeper = index_of(&wait_holder(&all, "sweeper", Duration::from_secs(15)).await);
    let (x, y) = match sweeper {
        0 => (1, 2),
        1 => (0, 2),
        _ => (0, 1),
    };
    let (h, x, y) = (nodes[sweeper].base.clone(), nodes[x].base.clone(), nodes[y].base.clone());
    let http = reqwest::Client::new();
    let session_a = onceprint_core::ids::agent_session_id(1_000, 1);
    let session_b = onceprint_core::ids::agent_session_id(1_000, 2);

    // Agent a takes the task on node x and keeps polling nodes x and y (never the sweeping
    // node h), without answering it; agent b polls node h, which sweeps and also decides
    // b's claims. Longer than "gone" plus the sync lag, a stays live for h.
    let (status, body) = api.on(&x).submit("T1", "p1", "hi\n").await;
    assert_eq!(status, 201, "{body}");
    let task = body["task_id"].as_str().expect("id").to_owned();
    let start = Instant::now();
    loop {
        let (status, d) = poll(&http, &x, &token, "a", &session_a, 200).await;
        assert_eq!(status, 200, "{d}");
        if d["deliveries"].as_array().is_some_and(|d| !d.is_empty()) {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "agent a got nothing");
    }
    let start = Instant::now();
    let mut turn = 0;
    while start.elapsed() < Duration::from_secs(9) {
        let base = if turn % 2 == 0 { &x } else { &y };
        turn += 1;
        let (status, _) = poll(&http, base, &token, "a", &session_a, 300).await;
        assert_eq!(status, 200);
        let (status, _) = poll(&http, &h, &token, "b", &session_b, 100).await;
        assert_eq!(status, 200);
        let (_, t) = api.get(&format!("/v1/print-tasks/{task}")).await;
        assert_eq!(t["state"], "sent", "agent a is live on other nodes; its delivery stays with it: {t}");
    }

    // Agent a really stops: after "gone" (and the lag), the delivery is settled in doubt,
    // as with one node.
    let start = Instant::now();
    loop {
        let _ = poll(&http, &h, &token, "b", &session_b, 200).await;
        let (_, t) = api.get(&format!("/v1/print-tasks/{task}")).await;
        if t["state"] == "in_doubt" {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "a stopped agent's delivery was not settled: {t}");
    }

    // A newer session of an agent id seen on one node supersedes the older on every node.
    let old = onceprint_core::ids::agent_session_id(2_000, 3);
    let new = onceprint_core::ids::agent_session_id(3_000, 4);
    assert_eq!(poll(&http, &x, &token, "c", &old, 10).await.0, 200);
    assert_eq!(poll(&http, &y, &token, "c", &new, 10).await.0, 200);
    let start = Instant::now();
    loop {
        let (status, body) = poll(&http, &x, &token, "c", &old, 10).await;
        if status == 409 {
            assert_eq!(body["error"]["code"], "agent_superseded", "{body}");
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "the older session is still served on node x");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for b in nodes {
        assert!(b.stop().success());
    }
}
