//! Crash test with the real binary: kill -9 the broker while 8 clients submit, restart it
//! on the same database, and check the promise behind every answer: each task that got a
//! 201 or 200 exists with its audit trail, and no key has two tasks.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const ADMIN: &str = "crash-test-admin";

struct Broker {
    child: Child,
    base: String,
}

/// Starts `onceprint serve` and waits for its "listening on" line.
fn start_broker(database: &str) -> Broker {
    let mut child = Command::new(env!("CARGO_BIN_EXE_onceprint"))
        .args(["serve", "--listen", "127.0.0.1:0", "--database", database, "--admin-token", ADMIN])
        .env("RUST_LOG", "warn")
        // Eight clients submit as fast as they can: this test is about durability, not
        // about the tenant's rate limit.
        .env("ONCEPRINT_TENANT_RATE_LIMIT", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start onceprint serve");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let base = loop {
        match lines.next() {
            Some(Ok(line)) => {
                if let Some(url) = line.strip_prefix("listening on ") {
                    break url.trim().to_owned();
                }
            }
            _ => panic!("the broker exited before listening"),
        }
    };
    // Keep draining stdout so the broker never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Broker { child, base }
}

/// What clients were told: key → task id, for every 201/200 answer.
type Told = Arc<Mutex<BTreeMap<String, BTreeSet<String>>>>;

async fn crash_and_recover(database: String) {
    let broker = start_broker(&database);
    let http = reqwest::Client::new();
    let post = |base: &str, path: &str, token: &str, body: Value| {
        http.post(format!("{base}{path}")).bearer_auth(token.to_owned()).json(&body).send()
    };
    let t = post(&broker.base, "/v1/tenants", ADMIN, json!({"id": "crash", "name": "Crash"})).await.expect("tenant");
    let key = t.json::<Value>().await.expect("json")["api_key"].as_str().expect("key").to_owned();
    post(&broker.base, "/v1/stores", &key, json!({"id": "s1", "name": "S"})).await.expect("store");
    post(
        &broker.base,
        "/v1/printers",
        &key,
        json!({"id": "p1", "store_id": "s1", "transport": {"kind": "agent", "address": "tcp://127.0.0.1:9100"}}),
    )
    .await
    .expect("printer");

    let told: Told = Arc::default();
    let unanswered: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let mut clients = Vec::new();
    for c in 0..8 {
        let (http, base, key, told, unanswered) =
            (http.clone(), broker.base.clone(), key.clone(), told.clone(), unanswered.clone());
        clients.push(tokio::spawn(async move {
            for i in 0..100_000u32 {
                // Every fifth request repeats the previous key, as a retrying POS would.
                let n = if i % 5 == 4 { i - 1 } else { i };
                let biz_no = format!("C{c}-{n}");
                let body = json!({"biz_no": biz_no, "printer_id": "p1", "content": {"type": "text", "text": format!("order {biz_no}\n")}});
                match http.post(format!("{base}/v1/print-tasks")).bearer_auth(&key).json(&body).send().await {
                    Ok(res) if res.status().as_u16() == 201 || res.status().as_u16() == 200 => {
                        let v: Value = match res.json().await {
                            Ok(v) => v,
                            Err(_) => {
                                unanswered.lock().expect("lock").insert(biz_no);
                                return;
                            }
                        };
                        let id = v["task_id"].as_str().expect("task_id").to_owned();
                        told.lock().expect("lock").entry(biz_no).or_default().insert(id);
                    }
                    Ok(res) => panic!("unexpected status {} for {biz_no}", res.status()),
                    Err(_) => {
                        // The broker died under this request: the client does not know.
                        unanswered.lock().expect("lock").insert(biz_no);
                        return;
                    }
                }
            }
        }));
    }

    // Let the clients get going, then pull the plug.
    let start = Instant::now();
    while told.lock().expect("lock").len() < 1500 && start.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut child = broker.child;
    child.kill().expect("kill -9"); // SIGKILL: no graceful anything.
    child.wait().expect("wait");
    for c in clients {
        c.await.expect("client task");
    }
    let told = told.lock().expect("lock").clone();
    assert!(told.len() >= 1500, "clients got {} answers before the kill", told.len());

    let broker = start_broker(&database);
    let get = |path: String| http.get(format!("{}{path}", broker.base)).bearer_auth(key.clone()).send();
    // Every answered task survived, with its audit trail.
    for (biz_no, ids) in &told {
        assert_eq!(ids.len(), 1, "{biz_no} was answered with two task ids: {ids:?}");
        let id = ids.iter().next().expect("id");
        let task: Value = get(format!("/v1/print-tasks/{id}")).await.expect("get").json().await.expect("json");
        assert_eq!(task["biz_no"], biz_no.as_str(), "task {id} lost after kill -9: {task}");
        let events: Value =
            get(format!("/v1/print-tasks/{id}/events")).await.expect("events").json().await.expect("json");
        assert_eq!(events["events"][0]["to"], "pending", "audit trail of {id}: {events}");
    }
    // Retrying the unanswered requests yields 201 or 200, never a second task.
    let unanswered = unanswered.lock().expect("lock").clone();
    for biz_no in &unanswered {
        let body = json!({"biz_no": biz_no, "printer_id": "p1", "content": {"type": "text", "text": format!("order {biz_no}\n")}});
        let res = post(&broker.base, "/v1/print-tasks", &key, body).await.expect("retry");
        assert!(res.status().as_u16() == 201 || res.status().as_u16() == 200, "{}", res.status());
    }
    // No key has two tasks.
    let mut seen = BTreeMap::<String, String>::new();
    let mut cursor = String::new();
    loop {
        let page: Value =
            get(format!("/v1/print-tasks?limit=500&cursor={cursor}")).await.expect("list").json().await.expect("json");
        for t in page["tasks"].as_array().expect("tasks") {
            let biz = t["biz_no"].as_str().expect("biz_no").to_owned();
            let id = t["task_id"].as_str().expect("id").to_owned();
            if let Some(other) = seen.insert(biz.clone(), id.clone()) {
                panic!("{biz} has two tasks: {other} and {id}");
            }
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = c.to_owned(),
            None => break,
        }
    }
    for biz_no in told.keys().chain(unanswered.iter()) {
        assert!(seen.contains_key(biz_no), "{biz_no} missing after restart");
    }
    let mut child = broker.child;
    child.kill().expect("stop");
    let _ = child.wait();
    eprintln!(
        "crash test: {} answered keys survived, {} unanswered retried, {} tasks",
        told.len(),
        unanswered.len(),
        seen.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_submissions_loses_nothing_sqlite() {
    let dir = tempfile_dir();
    crash_and_recover(format!("sqlite://{}/crash.db", dir.display())).await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_submissions_loses_nothing_postgres() {
    let Some(h) = onceprint_store_postgres::testing::fresh_store().await else { return };
    crash_and_recover(h.url.clone()).await;
    drop(h);
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("onceprint-crash-{}-{:?}", std::process::id(), Instant::now()));
    let dir = std::path::PathBuf::from(dir.to_string_lossy().replace(['{', '}', ' ', ':', ','], "_"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}
