//! MQTT printers with the real binary: `onceprint serve --mqtt-url …` keeping Mosquitto's
//! password and ACL files, a Mosquitto started here on a free port, `onceprint
//! printer-sim --mqtt` as the device, and the broker killed with `kill -9` in the middle of
//! a stream of tasks (on SQLite and PostgreSQL). Judged by the device's paper log: every
//! task printed, none twice.

mod common;

use common::wait_line;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const ADMIN: &str = "mqtt-kill-admin";
const BIN: &str = env!("CARGO_BIN_EXE_onceprint");

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port")
}

fn spawn(args: &[String], log: &Path) -> Child {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(log).expect("log file");
    Command::new(BIN).args(args).env("RUST_LOG", "info").stdout(Stdio::piped()).stderr(log).spawn().expect("spawn")
}

struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn paper(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path).unwrap_or_default().lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

async fn wait_for<F: FnMut() -> bool>(within: Duration, what: &str, mut f: F) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < within, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_killed_mid_stream_prints_nothing_twice_sqlite() {
    run(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_killed_mid_stream_prints_nothing_twice_postgres() {
    run(true).await;
}

async fn run(postgres: bool) {
    let pg = if postgres {
        match onceprint_store_postgres::testing::fresh_store().await {
            Some(h) => Some(h),
            None => return,
        }
    } else {
        None
    };
    let dir: PathBuf = tempfile::tempdir().expect("tempdir").keep();
    let database = match &pg {
        Some(h) => h.url.clone(),
        None => format!("sqlite://{}/broker.db", dir.display()),
    };
    let mqtt_port = free_port();
    let mqtt_url = format!("mqtt://onceprint:broker-pass@127.0.0.1:{mqtt_port}");
    std::fs::write(
        dir.join("broker.toml"),
        "mqtt_resend_after_ms = 1000\n[print_types.receipt]\npriority = 10\nmax_attempts = 5\n\
         reprint_on_doubt = false\nbackoff = { initial_ms = 200, factor = 2.0, cap_ms = 1000, jitter = 0.0 }\n",
    )
    .expect("config");
    let broker_args: Vec<String> = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--database",
        &database,
        "--admin-token",
        ADMIN,
        "--config",
        &dir.join("broker.toml").display().to_string(),
        "--mqtt-url",
        &mqtt_url,
        "--mqtt-acl-dir",
        &dir.display().to_string(),
        "--mqtt-reload-pid-file",
        &dir.join("mosquitto.pid").display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut procs = Procs(Vec::new());
    let mut broker = spawn(&broker_args, &dir.join("broker.log"));
    let mut base = wait_line(&mut broker, "listening on ");
    procs.0.push(broker);

    // Mosquitto, once the broker wrote its files.
    wait_for(Duration::from_secs(10), "the MQTT files", || dir.join("passwd").exists() && dir.join("acl").exists())
        .await;
    std::fs::write(
        dir.join("mosquitto.conf"),
        format!(
            "user root\nlistener {mqtt_port} 127.0.0.1\nallow_anonymous false\npassword_file {d}/passwd\n\
             acl_file {d}/acl\npersistence false\nlog_dest stderr\nlog_type error\n",
            d = dir.display()
        ),
    )
    .expect("mosquitto.conf");
    let exe = ["/usr/sbin/mosquitto", "/usr/bin/mosquitto"].into_iter().find(|p| Path::new(p).exists());
    let mosquitto = Command::new(exe.expect("mosquitto is installed (.ci/run installs it)"))
        .arg("-c")
        .arg(dir.join("mosquitto.conf"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("mosquitto");
    std::fs::write(dir.join("mosquitto.pid"), mosquitto.id().to_string()).expect("pid");
    procs.0.push(mosquitto);

    let http = reqwest::Client::new();
    let t: Value = http
        .post(format!("{base}/v1/tenants"))
        .bearer_auth(ADMIN)
        .json(&json!({"id": "shop", "name": "Shop"}))
        .send()
        .await
        .expect("tenant")
        .json()
        .await
        .expect("json");
    let key = t["api_key"].as_str().expect("api key").to_owned();
    let post = |base: String, path: &'static str, body: Value| {
        let (http, key) = (http.clone(), key.clone());
        async move { http.post(format!("{base}{path}")).bearer_auth(key).json(&body).send().await.expect("post") }
    };
    post(base.clone(), "/v1/stores", json!({"id": "s1", "name": "Main"})).await;
    let p: Value = post(
        base.clone(),
        "/v1/printers",
        json!({"id": "m1", "store_id": "s1", "transport": {"kind": "mqtt", "protocol": "onceprint", "device_id": "d1"}}),
    )
    .await
    .json()
    .await
    .expect("printer");
    let user = p["credentials"]["username"].as_str().expect("username").to_owned();
    let pass = p["credentials"]["password"].as_str().expect("password").to_owned();
    let sim_args: Vec<String> = [
        "printer-sim",
        "--mqtt",
        &format!("mqtt://127.0.0.1:{mqtt_port}"),
        "--protocol",
        "onceprint",
        "--device",
        "d1",
        "--username",
        &user,
        "--password",
        &pass,
        "--paper-log",
        &dir.join("paper.jsonl").display().to_string(),
        "--slow-ms",
        "40",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    procs.0.push(spawn(&sim_args, &dir.join("sim.log")));

    let n = 30;
    for i in 0..n {
        let a = post(
            base.clone(),
            "/v1/print-tasks",
            json!({"biz_no": format!("K{i}"), "printer_id": "m1", "content": {"type": "text", "text": format!("ticket K{i}\n")}}),
        )
        .await;
        assert_eq!(a.status().as_u16(), 201);
    }
    let log = dir.join("paper.jsonl");
    wait_for(Duration::from_secs(30), "a few printed", || paper(&log).len() >= 5).await;
    // kill -9 of the broker in the middle of the stream, and a new one on the same database.
    let mut old = procs.0.remove(0);
    old.kill().expect("kill -9");
    let _ = old.wait();
    let mut broker = spawn(&broker_args, &dir.join("broker.log"));
    base = wait_line(&mut broker, "listening on ");
    procs.0.insert(0, broker);

    let start = Instant::now();
    loop {
        let list: Value = http
            .get(format!("{base}/v1/print-tasks?limit=100"))
            .bearer_auth(&key)
            .send()
            .await
            .expect("list")
            .json()
            .await
            .expect("json");
        let tasks = list["tasks"].as_array().cloned().unwrap_or_default();
        if tasks.len() == n && tasks.iter().all(|t| t["state"] == "printed") {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(90), "not all printed: {tasks:?}; logs in {}", dir.display());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let jobs = paper(&log);
    for i in 0..n {
        let copies =
            jobs.iter().filter(|j| j["text"].as_str().unwrap_or("").contains(&format!("ticket K{i}\n"))).count();
        assert_eq!(copies, 1, "K{i} printed {copies} times; logs in {}", dir.display());
    }
    drop(procs);
    let _ = std::fs::remove_dir_all(&dir);
}
