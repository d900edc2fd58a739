//! A broker process for tests of the real binary that restart it and talk to its API:
//! started with `serve` on a free port, stopped with SIGTERM (and the exit code checked),
//! and a small tenant API client.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

pub const BIN: &str = env!("CARGO_BIN_EXE_onceprint");
pub const ADMIN: &str = "broker-test-admin";

pub struct Broker {
    pub child: Child,
    pub base: String,
}

impl Broker {
    /// `onceprint serve` on `database` with `args` and `env` besides, logging into `log`.
    pub fn start(database: &str, args: &[&str], env: &[(&str, String)], log: &Path) -> Broker {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(log).expect("log file");
        let mut cmd = Command::new(BIN);
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--database", database, "--admin-token", ADMIN])
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(log);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("start onceprint serve");
        let base = super::wait_line(&mut child, "listening on ");
        Broker { child, base }
    }

    /// SIGTERM, then the exit status (the broker must stop within 15 s).
    pub fn stop(mut self) -> ExitStatus {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().expect("kill -TERM");
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(start.elapsed() < Duration::from_secs(15), "the broker did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn temp_dir(name: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("onceprint-{name}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// A tenant's view of a broker: its API key and a client.
#[derive(Clone)]
pub struct Api {
    pub base: String,
    pub key: String,
    pub http: reqwest::Client,
}

impl Api {
    /// Creates tenant `id` with store s1 in `timezone` and agent printers `printers`.
    pub async fn tenant(base: &str, id: &str, timezone: &str, printers: &[&str]) -> Api {
        let http = reqwest::Client::new();
        let t: Value = http
            .post(format!("{base}/v1/tenants"))
            .bearer_auth(ADMIN)
            .json(&json!({"id": id, "name": id}))
            .send()
            .await
            .expect("tenant")
            .json()
            .await
            .expect("tenant json");
        let api = Api { base: base.to_owned(), key: t["api_key"].as_str().expect("api key").to_owned(), http };
        let (status, _) = api.post("/v1/stores", json!({"id": "s1", "name": "Main", "timezone": timezone})).await;
        assert_eq!(status, 201);
        for p in printers {
            let printer =
                json!({"id": p, "store_id": "s1", "transport": {"kind": "agent", "address": "tcp://127.0.0.1:9100"}});
            let (status, body) = api.post("/v1/printers", printer).await;
            assert_eq!(status, 201, "{body}");
        }
        api
    }

    /// The same tenant on another broker (a restart).
    pub fn on(&self, base: &str) -> Api {
        Api { base: base.to_owned(), ..self.clone() }
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.post_as(&self.key, path, body).await
    }

    pub async fn post_as(&self, token: &str, path: &str, body: Value) -> (u16, Value) {
        let res = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(token)
            .json(&body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST {path}: {e}"));
        let status = res.status().as_u16();
        (status, res.json().await.unwrap_or(Value::Null))
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let res = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(&self.key)
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        let status = res.status().as_u16();
        (status, res.json().await.unwrap_or(Value::Null))
    }

    /// Submits a text task for `printer`.
    pub async fn submit(&self, biz_no: &str, printer: &str, text: &str) -> (u16, Value) {
        self.post(
            "/v1/print-tasks",
            json!({"biz_no": biz_no, "printer_id": printer, "content": {"type": "text", "text": text}}),
        )
        .await
    }
}
