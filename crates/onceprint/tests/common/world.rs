//! The world of the delivery tests of the real binary: `onceprint serve`, `onceprint
//! agent` and `onceprint printer-sim` as separate processes on real sockets, the broker on
//! SQLite or PostgreSQL, a chaos proxy between agent and broker, and the shop's POS on the
//! agent's LAN listener. "Printed" is judged by the simulator's paper log.

#![allow(dead_code)]

use super::wait_line;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

pub const ADMIN: &str = "e2e-admin";
pub const BIN: &str = env!("CARGO_BIN_EXE_onceprint");

/// Broker settings that make the timing-dependent paths quick in tests.
/// Fast timings. `label` tickets wait at most 2.5 s for a paused printer (the budget
/// test); the others wait the default ten minutes. A station's printer paused for 3 s
/// hands its station tickets to the next printer.
pub const FAST: &str = "redeliver_after_ms = 1500\nagent_gone_after_ms = 1500\nsweep_interval_ms = 200\n\
station_failover_after_ms = 3000\n\
[print_types.label]\npriority = 30\nmax_attempts = 3\nreprint_on_doubt = false\nmax_wait_ms = 2500\n\
backoff = { initial_ms = 200, factor = 2.0, cap_ms = 1000, jitter = 0.0 }\n\
[print_types.receipt]\npriority = 10\nmax_attempts = 3\nreprint_on_doubt = false\n\
backoff = { initial_ms = 200, factor = 2.0, cap_ms = 1000, jitter = 0.0 }\n\
[print_types.refund]\npriority = 0\nmax_attempts = 3\nreprint_on_doubt = false\n\
backoff = { initial_ms = 200, factor = 2.0, cap_ms = 1000, jitter = 0.0 }\n\
[print_types.kitchen]\npriority = 20\nmax_attempts = 3\nreprint_on_doubt = true\n\
backoff = { initial_ms = 200, factor = 2.0, cap_ms = 1000, jitter = 0.0 }\n";

pub fn temp_dir(name: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("onceprint-e2e-{name}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// `count` consecutive free TCP ports on 127.0.0.1, below the kernel's ephemeral range
/// (32768 and up on Linux), so that no outgoing connection of another test takes one of
/// them between this check and the bind of the process that is to listen there.
pub fn free_ports(count: u16) -> u16 {
    for _ in 0..200 {
        let base = 20_000 + (rand_u16() % 12_000);
        let ok = (0..count).all(|i| std::net::TcpListener::bind(("127.0.0.1", base + i)).is_ok());
        if ok {
            return base;
        }
    }
    panic!("no {count} consecutive free ports");
}

/// A running `onceprint printer-sim`: `count` printers on consecutive ports from
/// `first_port`, its control endpoint at `control`.
pub struct Sim {
    pub child: Child,
    pub first_port: u16,
    pub control: String,
}

/// Starts `printer-sim` with `count` printers (paper log `dir/paper.jsonl`, log
/// `dir/sim.log`, `flags` added) and waits until its control endpoint answers. A port
/// found free can still be taken by a test running alongside before the simulator binds
/// it; the simulator then exits, and it is started again on other ports.
pub async fn start_sim(dir: &Path, count: u16, flags: &[&str]) -> Sim {
    let http = reqwest::Client::new();
    for _ in 0..5 {
        let first_port = free_ports(count + 1);
        let control = format!("127.0.0.1:{}", first_port + count);
        let mut args: Vec<String> = vec![
            "printer-sim".into(),
            "--listen".into(),
            format!("127.0.0.1:{first_port}"),
            "--count".into(),
            count.to_string(),
            "--paper-log".into(),
            dir.join("paper.jsonl").display().to_string(),
            "--control".into(),
            control.clone(),
        ];
        args.extend(flags.iter().map(|s| s.to_string()));
        let mut child = spawn(&args, &dir.join("sim.log"));
        let start = Instant::now();
        loop {
            if let Ok(Some(_)) = child.try_wait() {
                break;
            }
            if http.get(format!("http://{control}/healthz")).send().await.is_ok() {
                return Sim { child, first_port, control };
            }
            if start.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                panic!("simulator did not answer on {control} within 20 s; see {}", dir.join("sim.log").display());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    panic!("simulator exited five times on start; see {}", dir.join("sim.log").display());
}

pub fn rand_u16() -> u16 {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(7);
    (nanos ^ (std::process::id() << 7)) as u16
}

pub fn spawn(args: &[String], log: &Path) -> Child {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(log).expect("log file");
    Command::new(BIN)
        .args(args)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .expect("spawn onceprint")
}

pub struct World {
    pub dir: PathBuf,
    pub database: String,
    pub broker: Option<Child>,
    pub agent: Option<Child>,
    pub sim: Child,
    pub base: String,
    pub key: String,
    pub agent_token: String,
    pub sim_base_port: u16,
    pub control: String,
    pub http: reqwest::Client,
    /// Where the agent connects, when not straight to the broker (a chaos proxy).
    pub agent_server: Option<String>,
    /// More `onceprint agent` flags (the LAN listener, say).
    pub agent_extra: Vec<String>,
    pub _pg: Option<onceprint_store::testing::Harness>,
}

impl Drop for World {
    fn drop(&mut self) {
        for c in [self.agent.as_mut(), self.broker.as_mut(), Some(&mut self.sim)].into_iter().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("logs kept in {}", self.dir.display());
        }
    }
}

impl World {
    pub async fn start(name: &str, postgres: bool, printers: u16) -> Option<World> {
        World::start_with(name, postgres, printers, &[]).await
    }

    pub async fn start_with(name: &str, postgres: bool, printers: u16, sim_flags: &[&str]) -> Option<World> {
        World::start_configured(name, postgres, printers, sim_flags, "").await
    }

    /// [`World::start_with`] with `config` added to the broker's settings file (TOML).
    pub async fn start_configured(
        name: &str,
        postgres: bool,
        printers: u16,
        sim_flags: &[&str],
        config: &str,
    ) -> Option<World> {
        let dir = temp_dir(name);
        let pg = if postgres { Some(onceprint_store_postgres::testing::fresh_store().await?) } else { None };
        let database = match &pg {
            Some(h) => h.url.clone(),
            None => format!("sqlite://{}/broker.db", dir.display()),
        };
        let Sim { child: sim, first_port: sim_base_port, control } = start_sim(&dir, printers, sim_flags).await;
        // Top-level keys first: a key after a table header would belong to the table.
        std::fs::write(dir.join("broker.toml"), format!("{config}\n{FAST}")).expect("config");
        let mut w = World {
            dir,
            database,
            broker: None,
            agent: None,
            sim,
            base: String::new(),
            key: String::new(),
            agent_token: String::new(),
            sim_base_port,
            control,
            http: reqwest::Client::new(),
            agent_server: None,
            agent_extra: Vec::new(),
            _pg: pg,
        };
        w.start_broker();
        let t = w.post_admin("/v1/tenants", json!({"id": "shop", "name": "Shop"})).await;
        w.key = t["api_key"].as_str().expect("api key").to_owned();
        w.post("/v1/stores", json!({"id": "s1", "name": "Main"})).await;
        for i in 0..printers {
            w.post(
                "/v1/printers",
                json!({"id": format!("p{i}"), "store_id": "s1",
                       "transport": {"kind": "agent", "address": format!("tcp://127.0.0.1:{}", sim_base_port + i)}}),
            )
            .await;
        }
        let tok = w.post("/v1/stores/s1/agent-tokens", json!({})).await;
        w.agent_token = tok["token"].as_str().expect("agent token").to_owned();
        w.start_agent();
        Some(w)
    }

    pub fn start_broker(&mut self) {
        self.start_broker_on("127.0.0.1:0");
    }

    /// Kills the broker (kill -9) and starts it again on the same address with `config`
    /// added to its settings (a person changed them while the shop was cut off, say).
    pub fn restart_broker_with(&mut self, config: &str) {
        World::kill9(&mut self.broker);
        std::fs::write(self.dir.join("broker.toml"), format!("{config}\n{FAST}")).expect("config");
        let addr = self.base.trim_start_matches("http://").to_owned();
        self.start_broker_on(&addr);
    }

    fn start_broker_on(&mut self, addr: &str) {
        let args: Vec<String> = [
            "serve",
            "--listen",
            addr,
            "--database",
            &self.database,
            "--admin-token",
            ADMIN,
            "--config",
            &self.dir.join("broker.toml").display().to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut child = spawn(&args, &self.dir.join("broker.log"));
        self.base = wait_line(&mut child, "listening on ");
        self.broker = Some(child);
    }

    pub fn start_agent(&mut self) {
        let server = self.agent_server.clone().unwrap_or_else(|| self.base.clone());
        let args: Vec<String> = [
            "agent",
            "--server",
            &server,
            "--token",
            &self.agent_token,
            "--state-dir",
            &self.dir.join("agent").display().to_string(),
            "--poll-wait-ms",
            "2000",
            "--print-timeout-ms",
            "3000",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain(self.agent_extra.iter().cloned())
        .collect();
        self.agent = Some(spawn(&args, &self.dir.join("agent.log")));
    }

    pub fn kill9(child: &mut Option<Child>) {
        if let Some(mut c) = child.take() {
            c.kill().expect("kill -9");
            let _ = c.wait();
        }
    }

    pub async fn faults(&self, printer: u16, faults: Value) {
        let mut body = faults;
        body["printer"] = json!(format!("127.0.0.1:{}", self.sim_base_port + printer));
        let res = self.http.put(format!("http://{}/faults", self.control)).json(&body).send().await.expect("faults");
        assert!(res.status().is_success(), "{}", res.status());
    }

    pub async fn post_admin(&self, path: &str, body: Value) -> Value {
        let res =
            self.http.post(format!("{}{path}", self.base)).bearer_auth(ADMIN).json(&body).send().await.expect("post");
        res.json().await.expect("json")
    }

    pub async fn post(&self, path: &str, body: Value) -> Value {
        let res = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.key)
            .json(&body)
            .send()
            .await
            .expect("post");
        assert!(res.status().is_success(), "{path}: {}", res.status());
        res.json().await.expect("json")
    }

    pub async fn get(&self, path: &str) -> Value {
        self.http
            .get(format!("{}{path}", self.base))
            .bearer_auth(&self.key)
            .send()
            .await
            .expect("get")
            .json()
            .await
            .expect("json")
    }

    /// Submits a ticket whose printed text carries `marker`; returns the task id.
    pub async fn submit(&self, marker: &str, printer: u16, print_type: &str) -> String {
        let body = json!({"biz_no": marker, "printer_id": format!("p{printer}"), "print_type": print_type,
                          "content": {"type": "text", "text": format!("TICKET {marker}\n1 x Noodles\n")}});
        let v = self.post("/v1/print-tasks", body).await;
        v["task_id"].as_str().expect("task_id").to_owned()
    }

    /// Waits until printer p0 is as `ok` wants it; returns its row.
    pub async fn wait_printer(&self, ok: impl Fn(&Value) -> bool, secs: u64) -> Value {
        let start = Instant::now();
        loop {
            let p = self.get("/v1/printers/p0").await;
            if ok(&p) {
                return p;
            }
            assert!(start.elapsed() < Duration::from_secs(secs), "printer p0: {p}\n{}", self.logs());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn state(&self, task: &str) -> Value {
        self.get(&format!("/v1/print-tasks/{task}")).await
    }

    pub async fn wait_state(&self, task: &str, states: &[&str], secs: u64) -> Value {
        let start = Instant::now();
        loop {
            let t = self.state(task).await;
            if states.iter().any(|s| t["state"] == *s) {
                return t;
            }
            assert!(start.elapsed() < Duration::from_secs(secs), "task {task} stuck: {t}\n{}", self.logs());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn paper(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.join("paper.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// How many cut jobs on paper carry `TICKET marker`.
    pub fn printed_count(&self, marker: &str) -> usize {
        let needle = format!("TICKET {marker}\n");
        self.paper().iter().filter(|j| j["text"].as_str().unwrap_or("").contains(&needle)).count()
    }

    pub fn logs(&self) -> String {
        let tail = |f: &str| {
            let s = std::fs::read_to_string(self.dir.join(f)).unwrap_or_default();
            let lines: Vec<&str> = s.lines().collect();
            lines[lines.len().saturating_sub(15)..].join("\n")
        };
        format!("--- broker\n{}\n--- agent\n{}\n--- sim\n{}", tail("broker.log"), tail("agent.log"), tail("sim.log"))
    }

    pub async fn events(&self, task: &str) -> Vec<(String, String)> {
        let v = self.get(&format!("/v1/print-tasks/{task}/events")).await;
        v["events"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|e| (e["from"].as_str().unwrap_or("-").to_owned(), e["to"].as_str().unwrap_or("?").to_owned()))
            .collect()
    }
}

/// What the proxy between agent and broker does to the traffic.
#[derive(Clone, Default)]
pub struct ProxyFaults {
    /// The broker is down: every connection is closed at once (refused, as a killed
    /// broker's port is), so requests fail fast.
    pub refuse: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// The broker is slow: what it sends back is held this many milliseconds first (its
    /// work is done; only the answer is late).
    pub delay_answers_ms: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// The upload of offline tasks is answered 502 without reaching the broker; all else
    /// passes.
    pub fail_uploads: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Cut every connection on which the agent sends an ack: the acknowledgement never
    /// arrives.
    pub drop_acks: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// The uplink is down: connections are taken, and whatever is sent either way is
    /// dropped, so requests time out (a dead 4G link, not a refused connection).
    pub blackhole: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// The upload of offline tasks reaches the broker, and its answer is lost: the
    /// connection is cut as the answer comes back.
    pub lose_upload_answers: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// How many upload answers were lost so.
    pub upload_answers_lost: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

/// A TCP proxy between agent and broker that injects `faults`.
pub async fn chaos_proxy(upstream: String, faults: ProxyFaults) -> String {
    use std::sync::atomic::Ordering;
    const UPLOAD: &[u8] = b"POST /v1/agent/offline-tasks";
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("proxy bind");
    let addr = listener.local_addr().expect("addr");
    let upstream = upstream.trim_start_matches("http://").to_owned();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let upstream = upstream.clone();
            let faults = faults.clone();
            tokio::spawn(async move {
                if faults.refuse.load(Ordering::SeqCst) {
                    return;
                }
                let hole = || faults.blackhole.load(Ordering::SeqCst);
                if hole() {
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n) = client.read(&mut buf).await {
                        if n == 0 {
                            return;
                        }
                    }
                    return;
                }
                let Ok(mut server) = tokio::net::TcpStream::connect(&upstream).await else { return };
                let (mut cr, mut cw) = client.split();
                let (mut sr, mut sw) = server.split();
                // An upload went up on this connection whose answer is to be lost.
                let losing = std::sync::atomic::AtomicBool::new(false);
                let up = async {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = match cr.read(&mut buf).await {
                            Ok(0) | Err(_) => return false,
                            Ok(n) => n,
                        };
                        let chunk = &buf[..n];
                        if faults.drop_acks.load(Ordering::SeqCst)
                            && chunk.windows(19).any(|w| w == b"POST /v1/agent/acks")
                        {
                            return false; // the ack is lost on the way
                        }
                        if faults.fail_uploads.load(Ordering::SeqCst)
                            && chunk.windows(UPLOAD.len()).any(|w| w == UPLOAD)
                        {
                            return true; // answered 502 below
                        }
                        if faults.lose_upload_answers.load(Ordering::SeqCst)
                            && chunk.windows(UPLOAD.len()).any(|w| w == UPLOAD)
                        {
                            losing.store(true, Ordering::SeqCst);
                        }
                        if hole() {
                            continue;
                        }
                        if sw.write_all(chunk).await.is_err() {
                            return false;
                        }
                    }
                };
                let down = async {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = match sr.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        if hole() {
                            continue;
                        }
                        if losing.load(Ordering::SeqCst) {
                            faults.upload_answers_lost.fetch_add(1, Ordering::SeqCst);
                            return; // the connection is cut as the answer comes back
                        }
                        let delay = faults.delay_answers_ms.load(Ordering::SeqCst);
                        if delay > 0 {
                            tokio::time::sleep(Duration::from_millis(delay)).await;
                        }
                        if cw.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                };
                let bad_gateway = tokio::select! { refused = up => refused, _ = down => false };
                if bad_gateway {
                    let _ = cw
                        .write_all(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                        .await;
                }
            });
        }
    });
    format!("http://{addr}")
}

/// The shop's POS, pointed at the store agent's LAN listener.
pub struct Pos {
    pub base: String,
    pub key: String,
    pub http: reqwest::Client,
}

impl Pos {
    /// POSTs `body` to the agent's `/v1/print-tasks`: status, whether the agent accepted
    /// it offline, and the body.
    pub async fn send(&self, key: &str, body: Value) -> (u16, bool, Value) {
        let res = self
            .http
            .post(format!("{}/v1/print-tasks", self.base))
            .bearer_auth(key)
            .json(&body)
            .timeout(Duration::from_secs(20))
            .send()
            .await
            .expect("LAN submit");
        let offline = res.headers().get("x-onceprint-offline").is_some();
        (res.status().as_u16(), offline, res.json().await.unwrap_or(Value::Null))
    }

    /// The LAN listener's `/healthz` (null if it does not answer).
    pub async fn health(&self) -> Value {
        match self.http.get(format!("{}/healthz", self.base)).send().await {
            Ok(r) => r.json().await.unwrap_or(Value::Null),
            Err(_) => Value::Null,
        }
    }

    pub async fn ticket(&self, marker: &str, text: &str) -> (u16, bool, Value) {
        self.send(&self.key, json!({"biz_no": marker, "printer_id": "p0", "content": {"type": "text", "text": text}}))
            .await
    }
}

pub fn ticket_text(marker: &str) -> String {
    format!("TICKET {marker}\n1 x Noodles\n")
}

impl World {
    /// Restarts the agent behind a proxy with the LAN listener on; returns the proxy's
    /// faults and the POS.
    pub async fn with_lan_listener(&mut self) -> (ProxyFaults, Pos) {
        self.with_lan_listener_flags(&[]).await
    }

    /// [`World::with_lan_listener`] with agent flags set: `(flag, value)` replaces the
    /// default value of `flag` or adds it.
    pub async fn with_lan_listener_flags(&mut self, flags: &[(&str, &str)]) -> (ProxyFaults, Pos) {
        let faults = ProxyFaults::default();
        let proxy = chaos_proxy(self.base.clone(), faults.clone()).await;
        World::kill9(&mut self.agent);
        let key = self.post("/v1/stores/s1/lan-keys", json!({})).await["key"].as_str().expect("LAN key").to_owned();
        let port = free_ports(1);
        self.agent_server = Some(proxy);
        self.agent_extra = lan_flags(port, flags);
        self.start_agent();
        let pos = Pos { base: format!("http://127.0.0.1:{port}"), key, http: self.http.clone() };
        // The agent knows the key once it has fetched the store's LAN keys.
        let start = Instant::now();
        loop {
            if pos.health().await["directory"] == true {
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(20), "the LAN listener never got ready\n{}", self.logs());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        (faults, pos)
    }

    /// Another store agent of store s1 with a LAN listener of its own (its own state
    /// directory, so its own agent id), talking to the broker through `server`; killed
    /// when the guard drops. Its POS uses `key`.
    pub fn another_lan_agent(&self, name: &str, server: &str, key: &str) -> (Reaped, Pos) {
        let port = free_ports(1);
        let args: Vec<String> = [
            "agent",
            "--server",
            server,
            "--token",
            &self.agent_token,
            "--state-dir",
            &self.dir.join(name).display().to_string(),
            "--poll-wait-ms",
            "2000",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain(lan_flags(port, &[]))
        .collect();
        let child = spawn(&args, &self.dir.join(format!("{name}.log")));
        (Reaped(child), Pos { base: format!("http://127.0.0.1:{port}"), key: key.to_owned(), http: self.http.clone() })
    }

    /// Stops the agent as a service manager does (SIGTERM) and waits for it to exit.
    pub fn sigterm_agent(&mut self) {
        if let Some(mut c) = self.agent.take() {
            let pid = c.id().to_string();
            let sent = Command::new("kill").args(["-TERM", &pid]).status().expect("kill -TERM");
            assert!(sent.success());
            let status = c.wait().expect("wait");
            assert!(status.success(), "the agent exits cleanly on SIGTERM: {status:?}");
        }
    }

    /// Waits until the broker knows `task` (a LAN task id, after the sync) in one of
    /// `states`; answers the task.
    pub async fn wait_known(&self, task: &str, states: &[&str], secs: u64) -> Value {
        let start = Instant::now();
        loop {
            let t = self.state(task).await;
            if states.iter().any(|s| t["state"] == *s) {
                return t;
            }
            assert!(start.elapsed() < Duration::from_secs(secs), "task {task} not synced: {t}\n{}", self.logs());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn wait_printed(&self, marker: &str, secs: u64) {
        let start = Instant::now();
        while self.printed_count(marker) == 0 {
            assert!(start.elapsed() < Duration::from_secs(secs), "{marker} never printed\n{}", self.logs());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A child process killed when its guard drops, however the test ends.
pub struct Reaped(pub Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The LAN listener flags of the tests: quick refreshes, `flags` replacing or adding.
fn lan_flags(port: u16, flags: &[(&str, &str)]) -> Vec<String> {
    let listen = format!("127.0.0.1:{port}");
    let mut all: Vec<(String, String)> = [
        ("--listen", listen.as_str()),
        ("--offline-after-ms", "700"),
        ("--directory-refresh-ms", "300"),
        ("--digest-interval-ms", "500"),
    ]
    .iter()
    .map(|(f, v)| (f.to_string(), v.to_string()))
    .collect();
    for (f, v) in flags {
        match all.iter_mut().find(|(g, _)| g == f) {
            Some(slot) => slot.1 = v.to_string(),
            None => all.push((f.to_string(), v.to_string())),
        }
    }
    all.into_iter().flat_map(|(f, v)| [f, v]).collect()
}

/// A minimal HTTP/1.1 server for tests: reads one request per connection (headers and a
/// Content-Length body), hands the lower-cased head and the body to `handle`, answers with
/// the status line it returns, and closes the connection.
pub async fn tiny_http<F>(handle: F) -> std::net::SocketAddr
where
    F: Fn(&str, String) -> &'static str + Send + Sync + 'static,
{
    tiny_http_answering(move |head, body| (handle(head, body), "")).await
}

/// [`tiny_http`] whose handler also gives the answer's body (sent as JSON).
pub async fn tiny_http_answering<F>(handle: F) -> std::net::SocketAddr
where
    F: Fn(&str, String) -> (&'static str, &'static str) + Send + Sync + 'static,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let handle = std::sync::Arc::new(handle);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let handle = handle.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                loop {
                    let Ok(n) = sock.read(&mut chunk).await else { return };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&buf).to_string();
                    let Some(end) = text.find("\r\n\r\n") else { continue };
                    let head = text[..end].to_ascii_lowercase();
                    let len = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:").map(|v| v.trim().parse::<usize>().unwrap_or(0)))
                        .unwrap_or(0);
                    if buf.len() < end + 4 + len {
                        continue;
                    }
                    let body = String::from_utf8_lossy(&buf[end + 4..end + 4 + len]).to_string();
                    let (status, answer) = handle(&head, body);
                    let reply = format!(
                        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
                         connection: close\r\n\r\n{answer}",
                        answer.len()
                    );
                    let _ = sock.write_all(reply.as_bytes()).await;
                    return;
                }
            });
        }
    });
    addr
}

pub fn header_value(head: &str, name: &str) -> String {
    head.lines()
        .find_map(|l| l.strip_prefix(name).map(|v| v.trim_start_matches(':').trim().to_owned()))
        .unwrap_or_default()
}

pub type Calls = std::sync::Arc<std::sync::Mutex<Vec<(String, String)>>>;

/// A webhook receiver that answers 200 to everything; records the bodies.
/// A WeCom group robot's webhook as its documentation describes the answer: `errcode` 0
/// for a message it took. Records each message's body.
pub async fn wecom_robot() -> (String, Calls) {
    let got: Calls = Default::default();
    let seen = got.clone();
    let addr = tiny_http_answering(move |_, body| {
        seen.lock().expect("lock").push((String::new(), body));
        ("200 OK", r#"{"errcode":0,"errmsg":"ok"}"#)
    })
    .await;
    (format!("http://{addr}/cgi-bin/webhook/send?key=test"), got)
}

pub async fn recording_receiver() -> (String, Calls) {
    let got: Calls = Default::default();
    let seen = got.clone();
    let addr = tiny_http(move |_, body| {
        seen.lock().expect("lock").push((String::new(), body));
        "200 OK"
    })
    .await;
    (format!("http://{addr}/alerts"), got)
}
