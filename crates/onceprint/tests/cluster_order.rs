//! Several `onceprint serve` nodes on one PostgreSQL schema, real processes on
//! real sockets: tickets for one printer leave in submission order whichever node took
//! them, even from nodes whose clocks disagree; a long poll on one node is woken by a
//! submission on another; a key revoked on one node stops working on the others long
//! before the directory's TTL.

mod common;

use std::time::{Duration, Instant};

use common::broker::{temp_dir, Api, Broker};
use serde_json::{json, Value};

/// A store agent speaking the agent protocol over HTTP (as `onceprint agent` does).
struct Agent {
    base: String,
    token: String,
    http: reqwest::Client,
}

impl Agent {
    async fn of(api: &Api) -> Agent {
        let (status, body) = api.post("/v1/stores/s1/agent-tokens", json!({})).await;
        assert_eq!(status, 201, "{body}");
        let token = body["token"].as_str().expect("token").to_owned();
        Agent { base: api.base.clone(), token, http: reqwest::Client::new() }
    }

    fn on(&self, base: &str) -> Agent {
        Agent { base: base.to_owned(), token: self.token.clone(), http: self.http.clone() }
    }

    async fn poll(&self, wait_ms: u64) -> Vec<Value> {
        let res = self
            .http
            .post(format!("{}/v1/agent/poll", self.base))
            .bearer_auth(&self.token)
            .json(&json!({"agent_id": "agent-1", "wait_ms": wait_ms, "max": 16}))
            .send()
            .await
            .expect("poll");
        assert_eq!(res.status().as_u16(), 200);
        let body: Value = res.json().await.expect("poll json");
        body["deliveries"].as_array().cloned().unwrap_or_default()
    }

    async fn printed(&self, d: &Value) {
        let ack =
            json!({"acks": [{"task_id": d["task_id"], "attempt": d["attempt"], "outcome": "printed", "detail": ""}]});
        let res = self
            .http
            .post(format!("{}/v1/agent/acks", self.base))
            .bearer_auth(&self.token)
            .json(&ack)
            .send()
            .await
            .expect("ack");
        assert_eq!(res.status().as_u16(), 200);
    }
}

/// `count` nodes on one fresh schema, node i with the environment `env(i)`.
async fn nodes(
    name: &str,
    count: usize,
    env: impl Fn(usize) -> Vec<(&'static str, String)>,
) -> Option<(Vec<Broker>, onceprint_store_postgres::testing::SchemaGuard)> {
    let schema = onceprint_store_postgres::testing::fresh_schema().await?;
    let dir = temp_dir(name);
    let brokers =
        (0..count).map(|i| Broker::start(schema.url(), &[], &env(i), &dir.join(format!("node{i}.log")))).collect();
    Some((brokers, schema))
}

/// Twelve tickets for one printer, submitted one after the other (each once the previous
/// was answered) round-robin to three nodes, one minting ids from a clock 5 s behind and
/// one from a clock 5 s ahead: by id they would leave grouped by node, by the database's
/// sequence they leave as submitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tickets_leave_in_submission_order_across_nodes_with_skewed_clocks() {
    let offsets = ["0", "-5000", "5000"];
    let Some((brokers, _schema)) =
        nodes("cluster-order", 3, |i| vec![("ONCEPRINT_TEST_ID_CLOCK_OFFSET_MS", offsets[i].to_owned())]).await
    else {
        return;
    };
    let api = Api::tenant(&brokers[0].base, "acme", "UTC", &["p1"]).await;
    let mut submitted = Vec::new();
    for i in 0..12 {
        let node = api.on(&brokers[i % 3].base);
        let (status, body) = node.submit(&format!("T{i:02}"), "p1", &format!("ticket {i}\n")).await;
        assert_eq!(status, 201, "{body}");
        submitted.push(body["task_id"].as_str().expect("task id").to_owned());
    }
    let mut by_id = submitted.clone();
    by_id.sort();
    assert_ne!(by_id, submitted, "the skewed clocks must make id order differ from submission order");

    // The agent takes them one at a time (one in flight per printer), from any node.
    let agent = Agent::of(&api).await;
    let mut left = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while left.len() < submitted.len() {
        assert!(Instant::now() < deadline, "only {left:?} left");
        let node = agent.on(&brokers[left.len() % 3].base);
        for d in node.poll(2_000).await {
            left.push(d["task_id"].as_str().expect("task id").to_owned());
            node.printed(&d).await;
        }
    }
    assert_eq!(left, submitted, "tickets must leave in submission order");
    for b in brokers {
        assert!(b.stop().success());
    }
}

/// A long poll waiting on node B answers with the task submitted on node A at once, not at
/// its next re-check (made a minute here, longer than the poll's own wait): only the word
/// from node A can end it before its wait does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_on_one_node_is_woken_by_a_submission_on_another() {
    let Some((brokers, _schema)) =
        nodes("cluster-wake", 2, |_| vec![("ONCEPRINT_POLL_RECHECK_MS", "60000".to_owned())]).await
    else {
        return;
    };
    let api = Api::tenant(&brokers[0].base, "acme", "UTC", &["p1"]).await;
    let agent = Agent::of(&api).await.on(&brokers[1].base);
    // Node B knows the agent (and its printers) before the long poll starts.
    assert!(agent.poll(0).await.is_empty());

    let wait = Duration::from_secs(20);
    let started = Instant::now();
    let poll = tokio::spawn(async move { (agent.poll(wait.as_millis() as u64).await, started.elapsed()) });
    // Let the poll begin waiting (its first look finds nothing), then submit on node A.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let (status, body) = api.submit("W1", "p1", "wake up\n").await;
    assert_eq!(status, 201, "{body}");
    let (deliveries, took) = poll.await.expect("poll task");
    assert_eq!(deliveries.len(), 1, "{deliveries:?}");
    assert_eq!(deliveries[0]["task_id"], body["task_id"]);
    assert!(took < wait / 2, "the poll answered only after {took:?}: it was not woken");
    for b in brokers {
        assert!(b.stop().success());
    }
}

/// An API key revoked on node A is refused by node B, which had it cached, long before the
/// directory's TTL (10 s) would have made B read it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_revoked_on_one_node_stops_working_on_the_others() {
    let Some((brokers, _schema)) = nodes("cluster-forget", 2, |_| Vec::new()).await else {
        return;
    };
    let api = Api::tenant(&brokers[0].base, "acme", "UTC", &["p1"]).await;
    let (status, created) = api.post("/v1/api-keys", json!({})).await;
    assert_eq!(status, 201, "{created}");
    let second = Api { key: created["api_key"].as_str().expect("key").to_owned(), ..api.on(&brokers[1].base) };
    // Node B caches the key.
    assert_eq!(second.get("/v1/printers").await.0, 200);

    let id = created["id"].as_str().expect("key id");
    let res =
        api.http.delete(format!("{}/v1/api-keys/{id}", api.base)).bearer_auth(&api.key).send().await.expect("revoke");
    assert_eq!(res.status().as_u16(), 200);
    let revoked = Instant::now();
    loop {
        let (status, _) = second.get("/v1/printers").await;
        if status == 401 {
            break;
        }
        assert!(revoked.elapsed() < Duration::from_secs(5), "node B still takes the revoked key");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for b in brokers {
        assert!(b.stop().success());
    }
}
