//! A rolling upgrade on one PostgreSQL: a broker of the previous release keeps serving while
//! a broker of this version starts on the same database and applies its migrations; both
//! answer submissions and duplicates for each other; an agent of the previous release
//! prints through the new broker; every ticket is on paper once (docs/DEPLOYMENT.md,
//! "Rolling upgrades").
//!
//! The previous release's binary is not built by this repository's tests (that would be a
//! second full build in CI): the test runs when `ONCEPRINT_TEST_OLD_BINARY` names it and
//! `ONCEPRINT_TEST_POSTGRES` is set, and says SKIPPED otherwise. docs/DEPLOYMENT.md says how
//! to build the old binary from a git tag or commit and run this test.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::broker::{temp_dir, Api, ADMIN, BIN};
use common::wait_line;
use serde_json::json;

const OLD_ENV: &str = "ONCEPRINT_TEST_OLD_BINARY";

fn spawn(bin: &str, args: &[String], log: &Path) -> Child {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(log).expect("log file");
    Command::new(bin)
        .args(args)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {bin}: {e}"))
}

struct Kill(Vec<Child>);

impl Drop for Kill {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn serve(bin: &str, database: &str, dir: &Path, name: &str) -> (Child, String) {
    let args: Vec<String> =
        ["serve", "--listen", "127.0.0.1:0", "--database", database, "--admin-token", ADMIN, "--config"]
            .iter()
            .map(|s| s.to_string())
            .chain([dir.join("broker.toml").display().to_string()])
            .collect();
    let mut child = spawn(bin, &args, &dir.join(format!("{name}.log")));
    let base = wait_line(&mut child, "listening on ");
    (child, base)
}

fn ticket(biz: &str) -> String {
    format!("TICKET {biz}\n1 x Noodles\n")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_of_the_previous_release_and_one_of_this_version_share_one_database() {
    let Ok(old) = std::env::var(OLD_ENV) else {
        // Straight to stderr, past the test harness's capture: a skip must be visible.
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: set {OLD_ENV} to the previous release's onceprint binary (docs/DEPLOYMENT.md)"
        );
        return;
    };
    assert!(Path::new(&old).is_file(), "{OLD_ENV}={old} is not a file");
    // The old node migrates an empty schema to the previous release's version, as a running
    // cluster would have left it.
    let Some(schema) = onceprint_store_postgres::testing::fresh_schema().await else {
        eprintln!("SKIPPED: ONCEPRINT_TEST_POSTGRES is not set");
        return;
    };
    let dir = temp_dir("rolling-upgrade");
    std::fs::write(dir.join("broker.toml"), "redeliver_after_ms = 1500\nagent_gone_after_ms = 3000\n").expect("config");
    let mut procs = Kill(Vec::new());

    let (old_node, old_base) = serve(&old, schema.url(), &dir, "old");
    procs.0.push(old_node);
    let sim_port = free_port();
    let api = {
        let http = reqwest::Client::new();
        let t: serde_json::Value = http
            .post(format!("{old_base}/v1/tenants"))
            .bearer_auth(ADMIN)
            .json(&json!({"id": "shop", "name": "Shop"}))
            .send()
            .await
            .expect("tenant")
            .json()
            .await
            .expect("tenant json");
        Api { base: old_base.clone(), key: t["api_key"].as_str().expect("api key").to_owned(), http }
    };
    assert_eq!(api.post("/v1/stores", json!({"id": "s1", "name": "Main"})).await.0, 201);
    let printer = json!({"id": "p1", "store_id": "s1",
                         "transport": {"kind": "agent", "address": format!("tcp://127.0.0.1:{sim_port}")}});
    assert_eq!(api.post("/v1/printers", printer).await.0, 201);

    let mut ids = std::collections::BTreeMap::new();
    for i in 0..5 {
        let (status, body) = api.submit(&format!("before-{i}"), "p1", &ticket(&format!("before-{i}"))).await;
        assert_eq!(status, 201, "{body}");
        ids.insert(format!("before-{i}"), body["task_id"].as_str().expect("task id").to_owned());
    }

    // This version starts on the same database and migrates it while the old node serves.
    let (new_node, new_base) = serve(BIN, schema.url(), &dir, "new");
    procs.0.push(new_node);
    let new_api = api.on(&new_base);

    // Both keep taking work and answer each other's duplicates with the one task.
    for i in 0..5 {
        let (status, body) = api.submit(&format!("old-after-{i}"), "p1", &ticket(&format!("old-after-{i}"))).await;
        assert_eq!(status, 201, "the old node after the migration: {body}");
        ids.insert(format!("old-after-{i}"), body["task_id"].as_str().expect("task id").to_owned());
        let (status, body) = new_api.submit(&format!("new-{i}"), "p1", &ticket(&format!("new-{i}"))).await;
        assert_eq!(status, 201, "{body}");
        ids.insert(format!("new-{i}"), body["task_id"].as_str().expect("task id").to_owned());
    }
    for (biz, id) in &ids {
        for side in [&api, &new_api] {
            let (status, body) = side.submit(biz, "p1", &ticket(biz)).await;
            assert_eq!(status, 200, "duplicate of {biz} on {}: {body}", side.base);
            assert_eq!(body["task_id"], json!(id), "{biz} on {}", side.base);
        }
    }

    // A printer, and an agent of the previous release, through the new node.
    let mut sim_args: Vec<String> = ["printer-sim", "--listen"].iter().map(|s| s.to_string()).collect();
    sim_args.push(format!("127.0.0.1:{sim_port}"));
    sim_args.extend(["--paper-log".to_owned(), dir.join("paper.jsonl").display().to_string()]);
    procs.0.push(spawn(BIN, &sim_args, &dir.join("sim.log")));
    let (status, tok) = api.post("/v1/stores/s1/agent-tokens", json!({})).await;
    assert_eq!(status, 201, "{tok}");
    let agent_args: Vec<String> = vec![
        "agent".into(),
        "--server".into(),
        new_base.clone(),
        "--token".into(),
        tok["token"].as_str().expect("agent token").to_owned(),
        "--state-dir".into(),
        dir.join("agent").display().to_string(),
        "--poll-wait-ms".into(),
        "2000".into(),
    ];
    procs.0.push(spawn(&old, &agent_args, &dir.join("agent.log")));

    let start = Instant::now();
    loop {
        let mut printed = 0;
        for id in ids.values() {
            // The old node reads what the new one changed.
            let (status, body) = api.get(&format!("/v1/print-tasks/{id}")).await;
            assert_eq!(status, 200, "{body}");
            if body["state"] == "printed" {
                printed += 1;
            }
        }
        if printed == ids.len() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{printed} of {} printed; logs in {}",
            ids.len(),
            dir.display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let paper = std::fs::read_to_string(dir.join("paper.jsonl")).unwrap_or_default();
    for biz in ids.keys() {
        let needle = format!("TICKET {biz}\n");
        let n = paper.lines().filter(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .and_then(|j| j["text"].as_str().map(|t| t.contains(&needle)))
                .unwrap_or(false)
        });
        assert_eq!(n.count(), 1, "{biz} on paper once");
    }
    // The old node still stops cleanly against the new schema.
    let old_node = procs.0.remove(0);
    let pid = old_node.id().to_string();
    Command::new("kill").args(["-TERM", &pid]).status().expect("kill -TERM");
    let mut old_node = old_node;
    let status = old_node.wait().expect("wait");
    assert!(status.success(), "the old node exited with {status}");
    let _ = std::fs::remove_dir_all(&dir);
}
