//! Delivery end to end with the real binary: `onceprint serve`, `onceprint agent` and
//! `onceprint printer-sim` as separate processes on real sockets, the broker on SQLite or
//! PostgreSQL. "Printed" is judged by the simulator's paper log, never by the broker alone.

mod common;

use common::wait_line;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const ADMIN: &str = "e2e-admin";
const BIN: &str = env!("CARGO_BIN_EXE_onceprint");

/// Broker settings that make the timing-dependent paths quick in tests.
/// Fast timings. `label` tickets wait at most 2.5 s for a paused printer (the budget
/// test); the others wait the default ten minutes. A station's printer paused for 3 s
/// hands its station tickets to the next printer.
const FAST: &str = "redeliver_after_ms = 1500\nagent_gone_after_ms = 1500\nsweep_interval_ms = 200\n\
station_failover_after_ms = 3000\n\
[print_types.label]\npriority = 30\nmax_attempts = 3\nreprint_on_doubt = false\nmax_wait_ms = 2500\n\
backoff = { initial_ms = 200, factor = 2.0, cap_ms = 1000, jitter = 0.0 }\n\
[print_types.receipt]\npriority = 10\nmax_attempts = 3\nreprint_on_doubt = false\n\
backoff = { initial_ms = 200, factor = 2.0, cap_ms = 1000, jitter = 0.0 }\n\
[print_types.refund]\npriority = 0\nmax_attempts = 3\nreprint_on_doubt = false\n\
backoff = { initial_ms = 200, factor = 2.0, cap_ms = 1000, jitter = 0.0 }\n\
[print_types.kitchen]\npriority = 20\nmax_attempts = 3\nreprint_on_doubt = true\n\
backoff = { initial_ms = 200, factor = 2.0, cap_ms = 1000, jitter = 0.0 }\n";

fn temp_dir(name: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("onceprint-e2e-{name}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// `count` consecutive free TCP ports on 127.0.0.1.
fn free_ports(count: u16) -> u16 {
    for _ in 0..200 {
        let base = 20_000 + (rand_u16() % 40_000);
        let ok = (0..count).all(|i| std::net::TcpListener::bind(("127.0.0.1", base + i)).is_ok());
        if ok {
            return base;
        }
    }
    panic!("no {count} consecutive free ports");
}

fn rand_u16() -> u16 {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(7);
    (nanos ^ (std::process::id() << 7)) as u16
}

fn spawn(args: &[String], log: &Path) -> Child {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(log).expect("log file");
    Command::new(BIN)
        .args(args)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .expect("spawn onceprint")
}

struct World {
    dir: PathBuf,
    database: String,
    broker: Option<Child>,
    agent: Option<Child>,
    sim: Child,
    base: String,
    key: String,
    agent_token: String,
    sim_base_port: u16,
    control: String,
    http: reqwest::Client,
    /// Where the agent connects, when not straight to the broker (a chaos proxy).
    agent_server: Option<String>,
    /// More `onceprint agent` flags (the LAN listener, say).
    agent_extra: Vec<String>,
    _pg: Option<onceprint_store::testing::Harness>,
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
    async fn start(name: &str, postgres: bool, printers: u16) -> Option<World> {
        World::start_with(name, postgres, printers, &[]).await
    }

    async fn start_with(name: &str, postgres: bool, printers: u16, sim_flags: &[&str]) -> Option<World> {
        let dir = temp_dir(name);
        let pg = if postgres { Some(onceprint_store_postgres::testing::fresh_store().await?) } else { None };
        let database = match &pg {
            Some(h) => h.url.clone(),
            None => format!("sqlite://{}/broker.db", dir.display()),
        };
        let sim_base_port = free_ports(printers);
        let control_port = free_ports(1);
        let control = format!("127.0.0.1:{control_port}");
        let mut sim_args: Vec<String> = vec![
            "printer-sim".into(),
            "--listen".into(),
            format!("127.0.0.1:{sim_base_port}"),
            "--count".into(),
            printers.to_string(),
            "--paper-log".into(),
            dir.join("paper.jsonl").display().to_string(),
            "--control".into(),
            control.clone(),
        ];
        sim_args.extend(sim_flags.iter().map(|s| s.to_string()));
        let sim = spawn(&sim_args, &dir.join("sim.log"));
        std::fs::write(dir.join("broker.toml"), FAST).expect("config");
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
        w.wait_sim().await;
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

    fn start_broker(&mut self) {
        let args: Vec<String> = [
            "serve",
            "--listen",
            "127.0.0.1:0",
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

    fn start_agent(&mut self) {
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

    fn kill9(child: &mut Option<Child>) {
        if let Some(mut c) = child.take() {
            c.kill().expect("kill -9");
            let _ = c.wait();
        }
    }

    async fn wait_sim(&self) {
        let start = Instant::now();
        while self.http.get(format!("http://{}/healthz", self.control)).send().await.is_err() {
            assert!(start.elapsed() < Duration::from_secs(10), "simulator did not start");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn faults(&self, printer: u16, faults: Value) {
        let mut body = faults;
        body["printer"] = json!(format!("127.0.0.1:{}", self.sim_base_port + printer));
        let res = self.http.put(format!("http://{}/faults", self.control)).json(&body).send().await.expect("faults");
        assert!(res.status().is_success(), "{}", res.status());
    }

    async fn post_admin(&self, path: &str, body: Value) -> Value {
        let res =
            self.http.post(format!("{}{path}", self.base)).bearer_auth(ADMIN).json(&body).send().await.expect("post");
        res.json().await.expect("json")
    }

    async fn post(&self, path: &str, body: Value) -> Value {
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

    async fn get(&self, path: &str) -> Value {
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
    async fn submit(&self, marker: &str, printer: u16, print_type: &str) -> String {
        let body = json!({"biz_no": marker, "printer_id": format!("p{printer}"), "print_type": print_type,
                          "content": {"type": "text", "text": format!("TICKET {marker}\n1 x Noodles\n")}});
        let v = self.post("/v1/print-tasks", body).await;
        v["task_id"].as_str().expect("task_id").to_owned()
    }

    /// Waits until printer p0 is as `ok` wants it; returns its row.
    async fn wait_printer(&self, ok: impl Fn(&Value) -> bool, secs: u64) -> Value {
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

    async fn state(&self, task: &str) -> Value {
        self.get(&format!("/v1/print-tasks/{task}")).await
    }

    async fn wait_state(&self, task: &str, states: &[&str], secs: u64) -> Value {
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

    fn paper(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.join("paper.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// How many cut jobs on paper carry `TICKET marker`.
    fn printed_count(&self, marker: &str) -> usize {
        let needle = format!("TICKET {marker}\n");
        self.paper().iter().filter(|j| j["text"].as_str().unwrap_or("").contains(&needle)).count()
    }

    fn logs(&self) -> String {
        let tail = |f: &str| {
            let s = std::fs::read_to_string(self.dir.join(f)).unwrap_or_default();
            let lines: Vec<&str> = s.lines().collect();
            lines[lines.len().saturating_sub(15)..].join("\n")
        };
        format!("--- broker\n{}\n--- agent\n{}\n--- sim\n{}", tail("broker.log"), tail("agent.log"), tail("sim.log"))
    }

    async fn events(&self, task: &str) -> Vec<(String, String)> {
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

macro_rules! both {
    ($($name:ident),*) => {
        mod sqlite { $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() { super::$name(false).await }
        )* }
        mod postgres { $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() { super::$name(true).await }
        )* }
    };
}

both!(
    submitted_ticket_prints_once_with_a_complete_audit_trail,
    printer_faults_retry_with_the_reason_then_print_once,
    killing_the_agent_mid_stream_prints_nothing_twice,
    killing_the_broker_mid_stream_loses_nothing,
    order_and_priority_hold_and_a_dead_printer_slows_no_one,
    past_its_wait_budget_a_paused_ticket_fails_with_the_reason,
    a_paper_out_pauses_the_lane_and_twenty_tickets_print_in_order_after_the_refill,
    a_station_fails_over_once_when_its_printer_stays_paused,
    a_lost_ack_is_answered_from_the_journal_without_a_second_print,
    a_crash_mid_job_waits_for_a_person_unless_the_policy_reprints,
    failover_prints_once_on_the_backup_and_the_primary_never_prints_it,
    an_operator_reprint_comes_out_marked_as_a_reprint,
    alerts_manual_actions_and_reconciliation_with_the_real_binary,
    a_chinese_kitchen_ticket_document_prints_the_right_characters,
    vendor_callbacks_with_good_bad_and_replayed_signatures,
    a_reconciliation_day_matches_the_hand_computed_report,
    the_shop_prints_offline_once_and_the_broker_merges_on_sync
);

fn sign(secret: &str, ts: i64, body: &str) -> String {
    format!("t={ts},v1={}", hmac_hex(secret, &format!("{ts}.{body}")))
}

fn unix_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

/// A vendor cloud that accepts jobs (202) and records their idempotency keys.
async fn vendor_cloud() -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    let keys: std::sync::Arc<std::sync::Mutex<Vec<String>>> = Default::default();
    let seen = keys.clone();
    let addr = tiny_http(move |head, _body| {
        seen.lock().expect("lock").push(header_value(head, "idempotency-key"));
        "202 Accepted"
    })
    .await;
    (format!("http://{addr}/jobs"), keys)
}

async fn vendor_callbacks_with_good_bad_and_replayed_signatures(pg: bool) {
    let Some(w) = World::start("callbacks", pg, 1).await else { return };
    let secret = "vendor-shared-secret-xyz";
    let (url, keys) = vendor_cloud().await;
    w.post(
        "/v1/printers",
        json!({"id": "cloud", "store_id": "s1", "transport": {"kind": "webhook", "url": url, "secret": secret}}),
    )
    .await;
    let t = w
        .post(
            "/v1/print-tasks",
            json!({"biz_no": "CB1", "printer_id": "cloud", "content": {"type": "text", "text": "x\n"}}),
        )
        .await;
    let id = t["task_id"].as_str().expect("id").to_owned();
    let start = Instant::now();
    while keys.lock().expect("lock").is_empty() {
        assert!(start.elapsed() < Duration::from_secs(10), "the job never reached the vendor\n{}", w.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        keys.lock().expect("lock")[0],
        "cb1#cloud",
        "Idempotency-Key: biz_no#printer_id (header read lower-cased)"
    );
    assert_eq!(w.state(&id).await["state"], "sent", "accepted by the vendor is not printed");
    let body = json!({"task_id": id, "status": "printed"}).to_string();
    let send = |sig: String| {
        w.http
            .post(format!("{}/v1/callbacks/cloud", w.base))
            .header("content-type", "application/json")
            .header("x-onceprint-signature", sig)
            .body(body.clone())
            .send()
    };
    assert_eq!(send(sign("wrong-secret-wrong-secret", unix_now(), &body)).await.expect("cb").status().as_u16(), 401);
    assert_eq!(send(sign(secret, unix_now() - 3600, &body)).await.expect("cb").status().as_u16(), 401, "replayed");
    let ok = send(sign(secret, unix_now(), &body)).await.expect("cb");
    assert_eq!(ok.status().as_u16(), 200);
    assert_eq!(ok.json::<Value>().await.expect("json")["result"], "applied");
    assert_eq!(w.state(&id).await["state"], "printed");
    let again = send(sign(secret, unix_now(), &body)).await.expect("cb").json::<Value>().await.expect("json");
    assert_eq!(again["result"], "duplicate", "idempotent: a finished task is not moved");
    let unknown = json!({"task_id": "01ZZZZZZZZZZZZZZZZZZZZZZZZ", "status": "printed"}).to_string();
    let res = w
        .http
        .post(format!("{}/v1/callbacks/cloud", w.base))
        .header("x-onceprint-signature", sign(secret, unix_now(), &unknown))
        .body(unknown)
        .send()
        .await
        .expect("cb");
    assert_eq!(res.status().as_u16(), 404);
}

async fn a_reconciliation_day_matches_the_hand_computed_report(pg: bool) {
    let Some(w) = World::start("recon", pg, 1).await else { return };
    // R1, R2 print; R2 is reprinted; R3 is cancelled before it can print (paper out);
    // X1 prints but was not expected; R4 is expected and never submitted.
    for m in ["R1", "R2"] {
        let id = w.submit(m, 0, "receipt").await;
        w.wait_state(&id, &["printed"], 20).await;
    }
    let r2 = w.get("/v1/print-tasks?biz_no=R2").await["tasks"][0]["task_id"].as_str().unwrap_or("").to_owned();
    let rp = w.post(&format!("/v1/print-tasks/{r2}/reprint"), json!({"operator": "amy", "reason": "torn"})).await;
    w.wait_state(rp["created"]["task_id"].as_str().unwrap_or(""), &["printed"], 20).await;
    w.faults(0, json!({"paper_out": true})).await;
    let r3 = w.submit("R3", 0, "receipt").await;
    w.wait_state(&r3, &["retrying"], 20).await;
    w.post(&format!("/v1/print-tasks/{r3}/cancel"), json!({"operator": "amy", "reason": "left"})).await;
    w.faults(0, json!({"paper_out": false})).await;
    let x1 = w.submit("X1", 0, "receipt").await;
    w.wait_state(&x1, &["printed"], 20).await;
    let date = w.state(&x1).await["created_at"].as_str().unwrap_or("").get(..10).unwrap_or("").to_owned();
    let mut got = w.post(&format!("/v1/stores/s1/reconciliation?date={date}"), json!(["R1", "R2", "R3", "R4"])).await;
    // The device log comparison (issue 14) depends on whether this agent uploads its
    // journal digest; whichever it does, the device and the broker must agree.
    for list in ["device_printed_broker_not", "broker_printed_device_not"] {
        assert_eq!(got[list], json!([]), "{list}: {got}");
    }
    assert_eq!(got["device_counts"]["broker_printed"], 4, "{got}");
    if let Some(o) = got.as_object_mut() {
        for k in ["device_log", "device_counts", "device_printed_broker_not", "broker_printed_device_not"] {
            o.remove(k);
        }
    }
    let expected = json!({
        "store_id": "s1", "date": date, "timezone": "UTC",
        "counts": {"submitted": 4, "printed": 3, "reprinted": 1, "failed": 0, "in_doubt": 0,
                   "transferred": 0, "cancelled": 1, "closed": 0, "open": 0},
        "ledger": {"charges": 5, "charged_amount": 5, "refunds": 1, "refunded_amount": 1},
        "expected": 4,
        "expected_not_printed": ["R3", "R4"],
        "printed_not_expected": ["X1"],
        "printed_more_than_once": []
    });
    assert_eq!(got, expected);
    assert_eq!(w.printed_count("R2"), 2, "the original and its reprint");
    assert_eq!(w.printed_count("R3"), 0);
}

async fn a_chinese_kitchen_ticket_document_prints_the_right_characters(pg: bool) {
    let Some(w) = World::start("cjk", pg, 1).await else { return };
    let path = format!("{}/../render/tests/fixtures/kitchen-ticket.json", env!("CARGO_MANIFEST_DIR"));
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("json");
    let t = w
        .post("/v1/print-tasks", json!({"biz_no": "CN1", "printer_id": "p0", "content": {"type": "doc", "doc": doc}}))
        .await;
    let id = t["task_id"].as_str().expect("id").to_owned();
    w.wait_state(&id, &["printed"], 20).await;
    let paper = w.paper();
    let text = paper.last().and_then(|j| j["text"].as_str()).unwrap_or("").to_owned();
    for needle in ["宫保鸡丁", "水煮牛肉", "扬州炒饭 Fried rice", "花生过敏"] {
        assert!(text.contains(needle), "{needle:?} missing from the paper log: {text}");
    }
    let markup =
        std::fs::read_to_string(format!("{}/../render/tests/fixtures/markup-ticket.txt", env!("CARGO_MANIFEST_DIR")))
            .expect("fixture");
    let t = w
        .post(
            "/v1/print-tasks",
            json!({"biz_no": "CN2", "printer_id": "p0", "content": {"type": "markup", "markup": markup}}),
        )
        .await;
    let id = t["task_id"].as_str().expect("id").to_owned();
    w.wait_state(&id, &["printed"], 20).await;
    let paper = w.paper();
    let last = paper.last().cloned().unwrap_or_default();
    assert!(last["text"].as_str().unwrap_or("").contains("酸辣土豆丝"), "{last}");
    assert_eq!(last["qr"][0], "https://example.com/o/0087", "{last}");
}

/// A minimal HTTP/1.1 server for tests: reads one request per connection (headers and a
/// Content-Length body), hands the lower-cased head and the body to `handle`, answers with
/// the status line it returns, and closes the connection.
async fn tiny_http<F>(handle: F) -> std::net::SocketAddr
where
    F: Fn(&str, String) -> &'static str + Send + Sync + 'static,
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
                    let status = handle(&head, body);
                    let reply = format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
                    let _ = sock.write_all(reply.as_bytes()).await;
                    return;
                }
            });
        }
    });
    addr
}

fn header_value(head: &str, name: &str) -> String {
    head.lines()
        .find_map(|l| l.strip_prefix(name).map(|v| v.trim_start_matches(':').trim().to_owned()))
        .unwrap_or_default()
}

type Calls = std::sync::Arc<std::sync::Mutex<Vec<(String, String)>>>;

/// A webhook receiver that answers 500 to its first call, then 200; records
/// (signature header, body).
async fn alert_receiver() -> (String, Calls) {
    let got: Calls = Default::default();
    let seen = got.clone();
    let addr = tiny_http(move |head, body| {
        let mut g = seen.lock().expect("lock");
        g.push((header_value(head, "x-onceprint-signature"), body));
        if g.len() == 1 {
            "500 Internal Server Error"
        } else {
            "200 OK"
        }
    })
    .await;
    (format!("http://{addr}/alerts"), got)
}

fn hmac_hex(secret: &str, msg: &str) -> String {
    use hmac::Mac;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).expect("key");
    mac.update(msg.as_bytes());
    mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect()
}

async fn alerts_manual_actions_and_reconciliation_with_the_real_binary(pg: bool) {
    let Some(w) = World::start("ops", pg, 1).await else { return };
    let (url, got) = alert_receiver().await;
    let secret = "ops-webhook-secret-0123";
    w.post("/v1/webhooks", json!({"id": "ops", "url": url, "secret": secret, "events": ["task.failed"]})).await;
    // A cover left open past the label's wait budget: failed, and an alert.
    w.faults(0, json!({"cover_open": true})).await;
    let failed = w.submit("OPS1", 0, "label").await;
    w.wait_state(&failed, &["failed"], 30).await;
    let start = Instant::now();
    while got.lock().expect("lock").len() < 2 {
        assert!(start.elapsed() < Duration::from_secs(15), "alert not retried: {:?}", got.lock().expect("lock"));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let calls = got.lock().expect("lock").clone();
    for (sig, body) in &calls {
        let (t, v1) =
            sig.split_once(',').map(|(t, v)| (t.trim_start_matches("t="), v.trim_start_matches("v1="))).expect("sig");
        assert_eq!(hmac_hex(secret, &format!("{t}.{body}")), v1, "signature verifies");
        let v: Value = serde_json::from_str(body).expect("json");
        assert_eq!((v["type"].as_str(), v["data"]["task_id"].as_str()), (Some("task.failed"), Some(failed.as_str())));
    }
    // Forbidden: mark-printed of a pending task. Allowed: cancel it, reprint nothing.
    w.faults(0, json!({"cover_open": false})).await;
    let ok = w.submit("OPS2", 0, "receipt").await;
    w.wait_state(&ok, &["printed"], 20).await;
    let res = w
        .http
        .post(format!("{}/v1/print-tasks/{ok}/cancel", w.base))
        .bearer_auth(&w.key)
        .json(&json!({"operator": "amy", "reason": "test"}))
        .send()
        .await
        .expect("cancel");
    assert_eq!(res.status().as_u16(), 409, "a printed task cannot be cancelled");
    let closed = w
        .post(&format!("/v1/print-tasks/{failed}/mark-printed"), json!({"operator": "amy", "reason": "found it"}))
        .await;
    assert_eq!(closed["task"]["state"], "closed");

    // The day, from cron: OPS3 was expected and never came.
    let csv = w.dir.join("orders.csv");
    std::fs::write(&csv, "biz_no\nOPS1\nOPS2\nOPS3\n").expect("csv");
    let today = w.get("/v1/print-tasks?limit=1").await["tasks"][0]["created_at"]
        .as_str()
        .unwrap_or("")
        .get(..10)
        .unwrap_or("")
        .to_owned();
    let out = Command::new(BIN)
        .args(["reconcile", "--server", &w.base, "--token", &w.key, "--store", "s1", "--date", &today])
        .arg("--expected")
        .arg(&csv)
        .output()
        .expect("reconcile");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "differences exit 1: {text}");
    assert!(text.contains("expected but not printed (1): OPS3"), "{text}");
    assert!(!text.contains("MORE THAN ONCE"), "{text}");
    std::fs::write(&csv, "OPS1\nOPS2\n").expect("csv");
    let out = Command::new(BIN)
        .args(["reconcile", "--server", &w.base, "--token", &w.key, "--store", "s1", "--date", &today, "--csv"])
        .arg("--expected")
        .arg(&csv)
        .output()
        .expect("reconcile");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(String::from_utf8_lossy(&out.stdout).contains("count,submitted,2"));
}

async fn failover_prints_once_on_the_backup_and_the_primary_never_prints_it(pg: bool) {
    let Some(w) = World::start("failover", pg, 2).await else { return };
    w.post("/v1/stations", json!({"id": "hot", "store_id": "s1", "printers": ["p0", "p1"]})).await;
    w.faults(0, json!({"offline": true})).await;
    let body = json!({"biz_no": "H1", "station_id": "hot",
                      "content": {"type": "text", "text": "TICKET H1\n1 x Noodles\n"}});
    let id = w.post("/v1/print-tasks", body.clone()).await["task_id"].as_str().expect("id").to_owned();
    let orig = w.wait_state(&id, &["transferred"], 30).await;
    let succ = orig["successor_task_id"].as_str().expect("successor").to_owned();
    w.wait_state(&succ, &["printed"], 30).await;
    // The primary comes back: it must print nothing.
    w.faults(0, json!({"offline": false})).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let on = |port: u16| w.paper().iter().filter(|j| j["printer"] == format!("127.0.0.1:{port}")).count();
    assert_eq!((on(w.sim_base_port), on(w.sim_base_port + 1)), (0, 1), "{:?}", w.paper());
    assert_eq!(w.printed_count("H1"), 1);
    // A retry of the order answers with the live task of the chain.
    let again = w.post("/v1/print-tasks", body).await;
    assert_eq!((again["task_id"].as_str(), again["state"].as_str()), (Some(succ.as_str()), Some("printed")));
}

async fn an_operator_reprint_comes_out_marked_as_a_reprint(pg: bool) {
    let Some(w) = World::start("reprint", pg, 1).await else { return };
    let id = w.submit("RP1", 0, "receipt").await;
    w.wait_state(&id, &["printed"], 20).await;
    let r = w.post(&format!("/v1/print-tasks/{id}/reprint"), json!({"operator": "alice", "reason": "torn"})).await;
    let reprint = r["created"]["task_id"].as_str().expect("reprint").to_owned();
    w.wait_state(&reprint, &["printed"], 20).await;
    let jobs: Vec<String> = w
        .paper()
        .iter()
        .filter_map(|j| j["text"].as_str().map(str::to_owned))
        .filter(|t| t.contains("TICKET RP1"))
        .collect();
    assert_eq!(jobs.len(), 2, "{jobs:?}");
    assert!(!jobs[0].contains("REPRINT"));
    assert!(jobs[1].starts_with("*** REPRINT 1 ***\n"), "{:?}", jobs[1]);
}

async fn a_crash_mid_job_waits_for_a_person_unless_the_policy_reprints(pg: bool) {
    let Some(w) = World::start("doubt", pg, 1).await else { return };
    // The printer prints the job, then drops the connection before its printed-ACK.
    w.faults(0, json!({"crash_mid_job": 1})).await;
    let id = w.submit("D1", 0, "receipt").await;
    let t = w.wait_state(&id, &["in_doubt"], 20).await;
    assert_eq!(t["last_error"], "in_doubt");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(w.printed_count("D1"), 1, "in doubt: never printed again by the system");
    assert_eq!(w.state(&id).await["state"], "in_doubt");
    // Kitchen tickets here reprint on doubt: a second copy beats a missing dish.
    w.faults(0, json!({"crash_mid_job": 1})).await;
    let id = w.submit("K1", 0, "kitchen").await;
    let t = w.wait_state(&id, &["printed"], 20).await;
    assert_eq!(t["attempts"], 2, "{t}");
    assert_eq!(w.printed_count("K1"), 2, "the policy asked for the reprint");
}

/// What the proxy between agent and broker does to the traffic.
#[derive(Clone, Default)]
struct ProxyFaults {
    /// Cut every connection on which the agent sends an ack: the acknowledgement never
    /// arrives.
    drop_acks: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// The uplink is down: connections are taken, and whatever is sent either way is
    /// dropped, so requests time out (a dead 4G link, not a refused connection).
    blackhole: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// A TCP proxy between agent and broker that injects `faults`.
async fn chaos_proxy(upstream: String, faults: ProxyFaults) -> String {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("proxy bind");
    let addr = listener.local_addr().expect("addr");
    let upstream = upstream.trim_start_matches("http://").to_owned();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let upstream = upstream.clone();
            let faults = faults.clone();
            tokio::spawn(async move {
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
                let up = async {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = match cr.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        let chunk = &buf[..n];
                        if faults.drop_acks.load(Ordering::SeqCst)
                            && chunk.windows(19).any(|w| w == b"POST /v1/agent/acks")
                        {
                            return; // the ack is lost on the way
                        }
                        if hole() {
                            continue;
                        }
                        if sw.write_all(chunk).await.is_err() {
                            return;
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
                        if cw.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                };
                tokio::select! { _ = up => {}, _ = down => {} }
            });
        }
    });
    format!("http://{addr}")
}

async fn a_lost_ack_is_answered_from_the_journal_without_a_second_print(pg: bool) {
    let Some(mut w) = World::start("lostack", pg, 1).await else { return };
    let faults = ProxyFaults::default();
    faults.drop_acks.store(true, std::sync::atomic::Ordering::SeqCst);
    let drop_acks = faults.drop_acks.clone();
    let proxy = chaos_proxy(w.base.clone(), faults).await;
    World::kill9(&mut w.agent);
    w.agent_server = Some(proxy);
    w.start_agent();
    let id = w.submit("L1", 0, "receipt").await;
    // Printed on paper, but the broker has not heard: still sent.
    let start = Instant::now();
    while w.printed_count("L1") == 0 {
        assert!(start.elapsed() < Duration::from_secs(20), "never printed\n{}", w.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(w.state(&id).await["state"], "sent");
    // Past the delivery deadline the broker offers it again; the agent answers from its
    // journal. Let acks through only after that redelivery happened.
    let start = Instant::now();
    while !w.events(&id).await.contains(&("sent".into(), "sent".into())) {
        assert!(start.elapsed() < Duration::from_secs(20), "no redelivery\n{}", w.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop_acks.store(false, std::sync::atomic::Ordering::SeqCst);
    let t = w.wait_state(&id, &["printed"], 30).await;
    // Offered again as a new attempt (the attempt is the fencing token), which the agent
    // answered from its journal without printing.
    assert!(t["attempts"].as_i64() >= Some(2), "{t}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(w.printed_count("L1"), 1, "one sheet of paper");
}

async fn submitted_ticket_prints_once_with_a_complete_audit_trail(pg: bool) {
    let Some(w) = World::start("basic", pg, 1).await else { return };
    let id = w.submit("A1001", 0, "receipt").await;
    let t = w.wait_state(&id, &["printed"], 20).await;
    assert_eq!(t["attempts"], 1);
    assert!(t["printed_at"].is_string());
    assert_eq!(w.printed_count("A1001"), 1, "{:?}", w.paper());
    let path = w.events(&id).await;
    assert_eq!(
        path,
        vec![("-".into(), "pending".into()), ("pending".into(), "sent".into()), ("sent".into(), "printed".into())]
    );
    let p = w.get("/v1/printers/p0").await;
    assert_eq!(p["online"], true, "{p}");
    assert!(p["last_seen_at"].is_string());
}

async fn printer_faults_retry_with_the_reason_then_print_once(pg: bool) {
    let Some(w) = World::start("faults", pg, 1).await else { return };
    for (fault, reason) in [("paper_out", "no_paper"), ("cover_open", "cover_open"), ("offline", "offline")] {
        w.faults(0, json!({ fault: true })).await;
        let marker = format!("F-{reason}");
        let id = w.submit(&marker, 0, "receipt").await;
        let t = w.wait_state(&id, &["retrying"], 20).await;
        assert_eq!(t["last_error"], reason, "{t}");
        // The printer row follows the task's change right after it (a separate write).
        let p = w.wait_printer(|p| p["last_error"] == reason, 5).await;
        assert!(p["paused_since"].is_string(), "the printer's state holds its lane: {p}");
        assert_eq!(w.printed_count(&marker), 0);
        w.faults(0, json!({ fault: false })).await;
        w.wait_state(&id, &["printed"], 20).await;
        assert_eq!(w.printed_count(&marker), 1, "printed exactly once after {fault}");
    }
}

async fn killing_the_agent_mid_stream_prints_nothing_twice(pg: bool) {
    // Slow printers, so that the kill lands in the middle of jobs.
    let Some(mut w) = World::start_with("agentkill", pg, 2, &["--slow-ms", "25"]).await else { return };
    let mut ids = BTreeMap::new();
    for i in 0..60 {
        let m = format!("K{i}");
        ids.insert(m.clone(), w.submit(&m, (i % 2) as u16, "receipt").await);
        if i == 25 {
            World::kill9(&mut w.agent);
            tokio::time::sleep(Duration::from_millis(300)).await;
            w.start_agent();
        }
    }
    let mut in_doubt = 0;
    for (m, id) in &ids {
        let t = w.wait_state(id, &["printed", "in_doubt"], 30).await;
        let n = w.printed_count(m);
        assert!(n <= 1, "{m} printed {n} times");
        if t["state"] == "in_doubt" {
            in_doubt += 1;
        } else {
            assert_eq!(n, 1, "{m} is printed but not on paper");
        }
    }
    assert!(in_doubt <= 2, "only a job cut off per printer may be in doubt, got {in_doubt}");
}

async fn killing_the_broker_mid_stream_loses_nothing(pg: bool) {
    let Some(mut w) = World::start_with("brokerkill", pg, 2, &["--slow-ms", "10"]).await else { return };
    let mut ids = BTreeMap::new();
    for i in 0..40 {
        let m = format!("B{i}");
        ids.insert(m.clone(), w.submit(&m, (i % 2) as u16, "receipt").await);
    }
    World::kill9(&mut w.broker);
    w.start_broker();
    // The agent keeps its old server URL: restart it against the new port (a real broker
    // restarts on its fixed address; the port here is chosen by the OS).
    World::kill9(&mut w.agent);
    w.start_agent();
    for i in 40..60 {
        let m = format!("B{i}");
        ids.insert(m.clone(), w.submit(&m, (i % 2) as u16, "receipt").await);
    }
    for (m, id) in &ids {
        let t = w.wait_state(id, &["printed", "in_doubt"], 30).await;
        let n = w.printed_count(m);
        assert!(n <= 1, "{m} printed {n} times");
        if t["state"] == "printed" {
            assert_eq!(n, 1, "{m}");
        }
    }
}

/// A child process killed when the test ends, however it ends.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Two broker nodes on one PostgreSQL schema; the agent is given both (`--server A,B`),
/// prints through A, A is killed with kill -9 mid-stream, and the agent carries on
/// through B with the same session: every ticket comes out once, none is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_given_two_nodes_fails_over_when_one_is_killed() {
    let Some(mut w) = World::start_with("failover", true, 2, &["--slow-ms", "10"]).await else { return };
    let node_a = w.base.clone();
    let args: Vec<String> = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--database",
        &w.database,
        "--admin-token",
        ADMIN,
        "--config",
        &w.dir.join("broker.toml").display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut b = spawn(&args, &w.dir.join("broker-b.log"));
    let node_b = wait_line(&mut b, "listening on ");
    let _b = Reaped(b);
    // The agent started by `World` knows only node A: restart it with both nodes, as a
    // comma list (the repeated flag is checked by the agent's own tests).
    World::kill9(&mut w.agent);
    w.agent_server = Some(format!("{node_a},{node_b}"));
    w.start_agent();

    let mut ids = BTreeMap::new();
    for i in 0..30 {
        let m = format!("F{i}");
        ids.insert(m.clone(), w.submit(&m, (i % 2) as u16, "receipt").await);
    }
    // Some printed through A, then A dies with work in flight.
    w.wait_state(&ids["F3"], &["printed", "in_doubt"], 30).await;
    World::kill9(&mut w.broker);
    w.base = node_b.clone();
    for i in 30..60 {
        let m = format!("F{i}");
        ids.insert(m.clone(), w.submit(&m, (i % 2) as u16, "receipt").await);
    }
    let mut in_doubt = 0;
    for (m, id) in &ids {
        let t = w.wait_state(id, &["printed", "in_doubt"], 60).await;
        let n = w.printed_count(m);
        assert!(n <= 1, "{m} printed {n} times");
        if t["state"] == "printed" {
            assert_eq!(n, 1, "{m} is printed but not on paper");
        } else {
            in_doubt += 1;
        }
    }
    // At most the job each printer was printing when A died may end in doubt; a job whose
    // ack did not reach A is not among them, its ack is retried on B.
    assert!(in_doubt <= 2, "{in_doubt} in doubt");
    let log = std::fs::read_to_string(w.dir.join("agent.log")).unwrap_or_default();
    assert!(
        log.contains("failing over to the next broker") && log.contains(node_b.trim_start_matches("http://")),
        "the agent says which broker it left and which it uses:\n{}",
        w.logs()
    );
}

async fn order_and_priority_hold_and_a_dead_printer_slows_no_one(pg: bool) {
    let Some(w) = World::start("order", pg, 2).await else { return };
    // Printer 1 is dead for the whole test; printer 0 must not notice.
    w.faults(1, json!({"offline": true})).await;
    w.faults(0, json!({"paper_out": true})).await;
    let mut expected = Vec::new();
    for i in 0..5 {
        let m = format!("O{i}");
        w.submit(&m, 0, "receipt").await;
        expected.push(m);
    }
    w.submit("DEAD", 1, "receipt").await;
    // A refund submitted last goes before the queued receipts that have not left yet.
    let refund = w.submit("R0", 0, "refund").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    w.faults(0, json!({"paper_out": false})).await;
    w.wait_state(&refund, &["printed"], 20).await;
    let start = Instant::now();
    for m in &expected {
        let id = w.get(&format!("/v1/print-tasks?biz_no={m}")).await["tasks"][0]["task_id"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        w.wait_state(&id, &["printed"], 20).await;
    }
    assert!(start.elapsed() < Duration::from_secs(10), "printer 0 was slowed down");
    let order: Vec<String> = w
        .paper()
        .iter()
        .filter(|j| j["printer"] == format!("127.0.0.1:{}", w.sim_base_port))
        .filter_map(|j| {
            j["text"].as_str().and_then(|t| t.lines().next()).map(|l| l.trim_start_matches("TICKET ").to_owned())
        })
        .collect();
    // The refund (priority 0) overtakes the queued receipts; the receipts keep their order.
    let pos = |m: &str| order.iter().position(|x| x == m).unwrap_or(usize::MAX);
    for pair in expected.windows(2) {
        assert!(pos(&pair[0]) < pos(&pair[1]), "FIFO broken: {order:?}");
    }
    assert!(pos("R0") < pos("O4"), "the refund should overtake queued receipts: {order:?}");
    assert_eq!(order.len(), 6, "{order:?}");
}

/// Past its print type's `max_wait_ms` (2.5 s for `label` here), a ticket waiting for a
/// paused printer fails with the printer's reason, and only then (issue 15).
async fn past_its_wait_budget_a_paused_ticket_fails_with_the_reason(pg: bool) {
    let Some(w) = World::start("failed", pg, 1).await else { return };
    w.faults(0, json!({"cover_open": true})).await;
    let start = Instant::now();
    let id = w.submit("X1", 0, "label").await;
    let t = w.wait_state(&id, &["failed"], 30).await;
    assert!(start.elapsed() >= Duration::from_millis(2_400), "failed before its budget: {:?}", start.elapsed());
    assert_eq!(t["last_error"], "cover_open", "{t}");
    let trail = w.get(&format!("/v1/print-tasks/{id}/events")).await;
    let last = trail["events"].as_array().and_then(|e| e.last()).cloned().unwrap_or_default();
    let why = last["reason"].as_str().unwrap_or("");
    assert!(why.contains("cover_open") && why.contains("max_wait_ms"), "{last}");
    let failed = w.get("/v1/print-tasks?store_id=s1&state=failed").await;
    assert_eq!(failed["tasks"][0]["task_id"], id.as_str());
    assert_eq!(w.printed_count("X1"), 0);
}

/// A webhook receiver that answers 200 to everything; records the bodies.
async fn recording_receiver() -> (String, Calls) {
    let got: Calls = Default::default();
    let seen = got.clone();
    let addr = tiny_http(move |_, body| {
        seen.lock().expect("lock").push((String::new(), body));
        "200 OK"
    })
    .await;
    (format!("http://{addr}/alerts"), got)
}

/// The alert kinds a receiver got, in order.
fn kinds(got: &Calls) -> Vec<String> {
    got.lock()
        .expect("lock")
        .iter()
        .filter_map(|(_, b)| serde_json::from_str::<Value>(b).ok())
        .map(|v| v["type"].as_str().unwrap_or("?").to_owned())
        .collect()
}

/// Issue 15's acceptance: a printer out of paper for two minutes (`ONCEPRINT_TEST_PAPER_OUT_S`
/// shortens it) with 20 tickets waiting. The lane pauses: no ticket fails or spends its
/// attempts, one `printer.paused` alert goes out, not one per ticket; after the refill the
/// printer's status report resumes the lane, one `printer.resumed` alert goes out, and all
/// 20 print once each, in the order they came.
async fn a_paper_out_pauses_the_lane_and_twenty_tickets_print_in_order_after_the_refill(pg: bool) {
    let Some(w) = World::start("paperout", pg, 1).await else { return };
    let (url, got) = recording_receiver().await;
    w.post(
        "/v1/webhooks",
        json!({"id": "ops", "url": url, "events": ["task.failed", "printer.paused", "printer.resumed"]}),
    )
    .await;
    w.faults(0, json!({"paper_out": true})).await;
    let mut ids = Vec::new();
    for i in 0..20 {
        ids.push(w.submit(&format!("P{i:02}"), 0, "receipt").await);
    }
    let head = w.wait_state(&ids[0], &["retrying"], 20).await;
    assert_eq!(head["last_error"], "no_paper", "{head}");
    let paused = w.wait_printer(|p| p["paused_since"].is_string(), 5).await;
    assert_eq!(paused["last_error"], "no_paper", "{paused}");
    let secs: u64 = std::env::var("ONCEPRINT_TEST_PAPER_OUT_S").ok().and_then(|s| s.parse().ok()).unwrap_or(120);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(secs) {
        let failed = w.get("/v1/print-tasks?store_id=s1&state=failed").await;
        assert_eq!(failed["tasks"].as_array().map(Vec::len), Some(0), "a ticket failed during the paper-out: {failed}");
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    // Offered again and again (the attempt number grows), far past max_attempts = 3.
    let head = w.state(&ids[0]).await;
    assert_eq!(head["state"], "retrying", "{head}");
    assert!(head["attempts"].as_i64() > Some(3), "{head}");
    assert_eq!(w.paper().len(), 0, "nothing printed without paper");
    w.faults(0, json!({"paper_out": false})).await;
    let refilled = Instant::now();
    for id in &ids {
        w.wait_state(id, &["printed"], 30).await;
    }
    let resumed_in = refilled.elapsed();
    let order: Vec<String> = w
        .paper()
        .iter()
        .filter_map(|j| {
            j["text"].as_str().and_then(|t| t.lines().next()).map(|l| l.trim_start_matches("TICKET ").to_owned())
        })
        .collect();
    let expected: Vec<String> = (0..20).map(|i| format!("P{i:02}")).collect();
    assert_eq!(order, expected, "all 20 once each, in order");
    let p = w.wait_printer(|p| p["paused_since"].is_null(), 5).await;
    assert!(p["last_error"].is_null(), "{p}");
    // Alerts: one pause and one recovery for the printer; no ticket failed.
    let start = Instant::now();
    while kinds(&got).len() < 2 && start.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(kinds(&got), vec!["printer.paused", "printer.resumed"], "resumed {resumed_in:?} after the refill");
    let calls = got.lock().expect("lock").clone();
    let pause: Value = serde_json::from_str(&calls[0].1).expect("json");
    assert_eq!(
        (pause["data"]["printer_id"].as_str(), pause["data"]["reason"].as_str()),
        (Some("p0"), Some("no_paper"))
    );
}

/// A station's printer that stays paused past the station threshold (3 s here) hands the
/// station's tickets to the next printer: each ticket fails over once, prints once on the
/// backup, and the primary prints none of them after its refill (issue 15, R25).
async fn a_station_fails_over_once_when_its_printer_stays_paused(pg: bool) {
    let Some(w) = World::start("stationpause", pg, 2).await else { return };
    w.post("/v1/stations", json!({"id": "hot", "store_id": "s1", "printers": ["p0", "p1"]})).await;
    w.faults(0, json!({"paper_out": true})).await;
    let start = Instant::now();
    let mut ids = Vec::new();
    for i in 0..5 {
        let body = json!({"biz_no": format!("S{i}"), "station_id": "hot",
                          "content": {"type": "text", "text": format!("TICKET S{i}\n1 x Noodles\n")}});
        ids.push(w.post("/v1/print-tasks", body).await["task_id"].as_str().expect("id").to_owned());
    }
    let first = w.wait_state(&ids[0], &["transferred"], 30).await;
    assert!(start.elapsed() >= Duration::from_millis(2_900), "failed over before the threshold: {:?}", start.elapsed());
    assert_eq!(first["last_error"], "no_paper", "{first}");
    for id in &ids {
        let t = w.wait_state(id, &["transferred"], 30).await;
        let succ = t["successor_task_id"].as_str().expect("successor").to_owned();
        let s = w.wait_state(&succ, &["printed"], 30).await;
        assert_eq!((s["printer_id"].as_str(), s["origin_kind"].as_str()), (Some("p1"), Some("failover")), "{s}");
        assert!(s["successor_task_id"].is_null(), "one failover per ticket: {s}");
        let moved: Vec<(String, String)> = w.events(id).await;
        assert_eq!(moved.iter().filter(|e| e.1 == "transferred").count(), 1, "{moved:?}");
    }
    w.faults(0, json!({"paper_out": false})).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let on = |port: u16| w.paper().iter().filter(|j| j["printer"] == format!("127.0.0.1:{port}")).count();
    assert_eq!((on(w.sim_base_port), on(w.sim_base_port + 1)), (0, 5), "{:?}", w.paper());
    for i in 0..5 {
        assert_eq!(w.printed_count(&format!("S{i}")), 1);
    }
}

/// The shop's POS, pointed at the store agent's LAN listener.
struct Pos {
    base: String,
    key: String,
    http: reqwest::Client,
}

impl Pos {
    /// POSTs `body` to the agent's `/v1/print-tasks`: status, whether the agent accepted
    /// it offline, and the body.
    async fn send(&self, key: &str, body: Value) -> (u16, bool, Value) {
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

    async fn ticket(&self, marker: &str, text: &str) -> (u16, bool, Value) {
        self.send(&self.key, json!({"biz_no": marker, "printer_id": "p0", "content": {"type": "text", "text": text}}))
            .await
    }
}

fn ticket_text(marker: &str) -> String {
    format!("TICKET {marker}\n1 x Noodles\n")
}

impl World {
    /// Restarts the agent behind a proxy with the LAN listener on; returns the proxy's
    /// faults and the POS.
    async fn with_lan_listener(&mut self) -> (ProxyFaults, Pos) {
        let faults = ProxyFaults::default();
        let proxy = chaos_proxy(self.base.clone(), faults.clone()).await;
        World::kill9(&mut self.agent);
        let key = self.post("/v1/stores/s1/lan-keys", json!({})).await["key"].as_str().expect("LAN key").to_owned();
        let port = free_ports(1);
        self.agent_server = Some(proxy);
        self.agent_extra = [
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--offline-after-ms",
            "700",
            "--directory-refresh-ms",
            "300",
            "--digest-interval-ms",
            "500",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        self.start_agent();
        let pos = Pos { base: format!("http://127.0.0.1:{port}"), key, http: self.http.clone() };
        // The agent knows the key once it has fetched the store's LAN keys.
        let start = Instant::now();
        loop {
            let ok = self.http.get(format!("{}/healthz", pos.base)).send().await.ok();
            if let Some(r) = ok {
                let v: Value = r.json().await.unwrap_or(Value::Null);
                if v["directory"] == true {
                    break;
                }
            }
            assert!(start.elapsed() < Duration::from_secs(20), "the LAN listener never got ready\n{}", self.logs());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        (faults, pos)
    }

    /// Waits until the broker knows `task` (a LAN task id, after the sync) in one of
    /// `states`; answers the task.
    async fn wait_known(&self, task: &str, states: &[&str], secs: u64) -> Value {
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

    async fn wait_printed(&self, marker: &str, secs: u64) {
        let start = Instant::now();
        while self.printed_count(marker) == 0 {
            assert!(start.elapsed() < Duration::from_secs(secs), "{marker} never printed\n{}", self.logs());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn the_shop_prints_offline_once_and_the_broker_merges_on_sync(pg: bool) {
    use std::sync::atomic::Ordering;
    let Some(mut w) = World::start("offline", pg, 1).await else { return };
    let (faults, pos) = w.with_lan_listener().await;

    // Online: the agent forwards, and the POS gets the broker's own answer.
    let (status, offline, on1) = pos.ticket("ON1", &ticket_text("ON1")).await;
    assert_eq!((status, offline), (201, false), "{on1}");
    let on1 = on1["task_id"].as_str().expect("task id").to_owned();
    w.wait_state(&on1, &["printed"], 20).await;

    // The uplink drops: the agent answers from its own outbox, as the broker would.
    faults.blackhole.store(true, Ordering::SeqCst);
    let (status, offline, off1) = pos.ticket("OFF1", &ticket_text("OFF1")).await;
    assert_eq!((status, offline), (201, true), "{off1}");
    let off1 = off1["task_id"].as_str().expect("task id").to_owned();
    let (status, _, again) = pos.ticket("OFF1", &ticket_text("OFF1")).await;
    assert_eq!((status, again["task_id"].as_str(), again["duplicate"].as_bool()), (200, Some(&*off1), Some(true)));
    let (status, _, other) = pos.ticket("OFF1", "TICKET OFF1\n2 x Noodles\n").await;
    assert_eq!((status, other["error"]["code"].as_str()), (422, Some("idempotency_mismatch")), "{other}");
    let (status, _, missing) =
        pos.send(&pos.key, json!({"printer_id": "p0", "content": {"type": "text", "text": "x"}})).await;
    assert_eq!((status, missing["error"]["code"].as_str()), (400, Some("missing_biz_no")), "{missing}");
    let (status, _, _) = pos.send("opl_wrong", json!({"biz_no": "X", "printer_id": "p0"})).await;
    assert_eq!(status, 401, "a wrong LAN key is refused");
    let (status, _, unknown) = pos
        .send(&pos.key, json!({"biz_no": "U1", "printer_id": "nope", "content": {"type": "text", "text": "x"}}))
        .await;
    assert_eq!(status, 400, "{unknown}");

    // The same order reaches the cloud (the broker is up; only the shop's uplink is down)
    // and the LAN; and another order reaches both with different content.
    let both_cloud = w.submit("BOTH1", 0, "receipt").await;
    let (status, offline, both_lan) = pos.ticket("BOTH1", &ticket_text("BOTH1")).await;
    assert_eq!((status, offline), (201, true));
    let both_lan = both_lan["task_id"].as_str().expect("task id").to_owned();
    let mis_cloud = w
        .post(
            "/v1/print-tasks",
            json!({"biz_no": "MIS1", "printer_id": "p0", "content": {"type": "text", "text": "TICKET MIS1\ncloud\n"}}),
        )
        .await["task_id"]
        .as_str()
        .expect("task id")
        .to_owned();
    let (status, _, mis_lan) = pos.ticket("MIS1", "TICKET MIS1\nlan\n").await;
    assert_eq!(status, 201, "{mis_lan}");
    for m in ["OFF1", "BOTH1", "MIS1"] {
        w.wait_printed(m, 20).await;
    }

    // kill -9 while offline, right after the answer: nothing lost, nothing twice.
    let (status, _, off2) = pos.ticket("OFF2", &ticket_text("OFF2")).await;
    assert_eq!(status, 201);
    let off2 = off2["task_id"].as_str().expect("task id").to_owned();
    World::kill9(&mut w.agent);
    w.start_agent();
    w.wait_printed("OFF2", 30).await;

    // The uplink is back: the agent hands its offline work to the broker.
    faults.blackhole.store(false, Ordering::SeqCst);
    let t = w.wait_known(&off1, &["printed"], 60).await;
    assert_eq!(t["task_id"], *off1, "the LAN answer's task id stays valid");
    let events = w.get(&format!("/v1/print-tasks/{off1}/events")).await.to_string();
    assert!(events.contains("lan:"), "the audit trail shows the LAN path: {events}");
    w.wait_known(&off2, &["printed"], 60).await;
    // One task for the order that reached both, printed once; the LAN id names it too.
    w.wait_state(&both_cloud, &["printed"], 60).await;
    let merged = w.wait_known(&both_lan, &["printed"], 60).await;
    assert_eq!(merged["task_id"], *both_cloud, "the LAN id answers with the merged task");
    // Conflicting content under one key goes to a person, and nothing more prints.
    w.wait_state(&mis_cloud, &["in_doubt"], 60).await;
    let attention = w.get("/v1/stores/s1/attention").await.to_string();
    assert!(attention.contains(&mis_cloud), "{attention}");
    // Retries now reach the broker, which knows the offline task.
    let (status, offline, again) = pos.ticket("OFF1", &ticket_text("OFF1")).await;
    assert_eq!((status, offline), (200, false), "{again}");
    assert_eq!(again["task_id"], *off1);

    tokio::time::sleep(Duration::from_secs(2)).await;
    for m in ["ON1", "OFF1", "OFF2", "BOTH1", "MIS1"] {
        assert_eq!(w.printed_count(m), 1, "{m} printed once\n{}", w.logs());
    }
    let paper = w.paper().iter().map(|j| j["text"].as_str().unwrap_or("").to_owned()).collect::<Vec<_>>();
    assert!(!paper.iter().any(|t| t.contains("TICKET MIS1\ncloud")), "the conflicting cloud ticket never printed");
    // Both paths in the merged task's audit trail.
    let both_events = w.get(&format!("/v1/print-tasks/{both_cloud}/events")).await.to_string();
    assert!(both_events.contains(&both_lan), "the merged task names the LAN task: {both_events}");
    // Charged once per order: ON1, OFF1, OFF2, BOTH1 and MIS1. The device log (the agent's
    // journal digest) agrees with the broker but for the conflict, which a person decides:
    // the device printed the LAN version of MIS1, the broker holds its task in doubt.
    let date = t["created_at"].as_str().unwrap_or("").get(..10).unwrap_or("").to_owned();
    let start = Instant::now();
    let day = loop {
        let day = w.get(&format!("/v1/stores/s1/reconciliation?date={date}")).await;
        let settled = day["device_log"] == "present"
            && day["broker_printed_device_not"].as_array().is_some_and(|a| a.is_empty())
            && day["device_printed_broker_not"].as_array().is_some_and(|a| a.len() == 1);
        if settled || start.elapsed() > Duration::from_secs(45) {
            break day;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(day["ledger"]["charges"], 5, "{day}");
    assert_eq!(day["printed_more_than_once"], json!([]), "{day}");
    assert_eq!(day["broker_printed_device_not"], json!([]), "{day}");
    let differs = day["device_printed_broker_not"].as_array().cloned().unwrap_or_default();
    assert_eq!(differs.len(), 1, "{day}");
    assert_eq!(differs[0]["task_id"], *mis_cloud, "{day}");
    assert_eq!(differs[0]["broker_state"], "in_doubt", "{day}");
}
