//! Operating the real binary: JSON logs whose every line of a request names
//! the request (and its task), native TLS that agents reach with `https://`, and the
//! tenants' rate limit as set on the command line.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::wait_line;
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_onceprint");
const ADMIN: &str = "operable-admin";

fn temp_dir(name: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("onceprint-{name}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// A child process killed when the test ends, whatever happens.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `onceprint serve` on a fresh SQLite file with `args`; stderr (the log) into `log`.
/// Returns the process and the URL it announced.
fn serve(dir: &Path, args: &[&str], log: &Path) -> (Proc, String) {
    let log = std::fs::File::create(log).expect("log file");
    let db = format!("sqlite://{}/broker.db", dir.display());
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--database", &db, "--admin-token", ADMIN])
        .args(args)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .expect("start serve");
    let base = wait_line(&mut child, "listening on ");
    (Proc(child), base)
}

/// A tenant with store s1 and printer p1 at `address`; returns the API key.
async fn tenant(http: &reqwest::Client, base: &str, address: &str) -> String {
    let t: Value = http
        .post(format!("{base}/v1/tenants"))
        .bearer_auth(ADMIN)
        .json(&json!({"id": "acme", "name": "Acme"}))
        .send()
        .await
        .expect("tenant")
        .json()
        .await
        .expect("json");
    let key = t["api_key"].as_str().expect("api_key").to_owned();
    for (path, body) in [
        ("/v1/stores", json!({"id": "s1", "name": "Main"})),
        (
            "/v1/printers",
            json!({"id": "p1", "store_id": "s1", "name": "Kitchen", "transport": {"kind": "agent", "address": address}}),
        ),
    ] {
        let res = http.post(format!("{base}{path}")).bearer_auth(&key).json(&body).send().await.expect("set-up");
        assert_eq!(res.status(), reqwest::StatusCode::CREATED, "{path}");
    }
    key
}

fn order(biz_no: &str) -> Value {
    json!({"biz_no": biz_no, "printer_id": "p1", "content": {"type": "text", "text": format!("order {biz_no}\n")}})
}

#[tokio::test]
async fn json_logs_name_the_request_and_the_task_in_every_line() {
    let dir = temp_dir("jsonlog");
    let log = dir.join("broker.log");
    let (broker, base) = serve(&dir, &["--log-format", "json"], &log);
    let http = reqwest::Client::new();
    let key = tenant(&http, &base, "tcp://192.0.2.1:9100").await;

    // A caller's request id is kept and returned; without one, the broker makes one.
    let res = http
        .post(format!("{base}/v1/print-tasks"))
        .bearer_auth(&key)
        .header("x-request-id", "pos-42-try-1")
        .json(&order("A1"))
        .send()
        .await
        .expect("submit");
    assert_eq!(res.status(), reqwest::StatusCode::CREATED);
    assert_eq!(res.headers()["x-request-id"], "pos-42-try-1");
    let task_id = res.json::<Value>().await.expect("json")["task_id"].as_str().expect("task_id").to_owned();
    let res = http.get(format!("{base}/v1/print-tasks/{task_id}")).bearer_auth(&key).send().await.expect("get");
    let made = res.headers()["x-request-id"].to_str().expect("ascii").to_owned();
    assert!(made.starts_with("req_"), "{made}");
    // An id that could forge log fields is replaced, not logged.
    let res = http
        .get(format!("{base}/v1/print-tasks/{task_id}"))
        .bearer_auth(&key)
        .header("x-request-id", "a\"b c")
        .send()
        .await
        .expect("get");
    assert_ne!(res.headers()["x-request-id"], "a\"b c");
    drop(broker);

    let text = std::fs::read_to_string(&log).expect("log");
    let lines: Vec<Value> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not one JSON object per line ({e}): {l}")))
        .collect();
    assert!(lines.len() >= 5, "{text}");
    for l in &lines {
        assert!(l["timestamp"].is_string() && l["level"].is_string(), "{l}");
    }
    let of = |id: &str| -> Vec<&Value> { lines.iter().filter(|l| l["span"]["request_id"] == id).collect() };
    let submit = of("pos-42-try-1");
    assert!(!submit.is_empty(), "no line of the submission in\n{text}");
    assert!(
        submit.iter().any(|l| l["span"]["task_id"] == task_id.as_str() && l["fields"]["status"] == 201),
        "the submission's answer line names its task: {submit:?}"
    );
    let get = of(&made);
    assert!(get.iter().any(|l| l["span"]["task_id"] == task_id.as_str() && l["fields"]["status"] == 200), "{get:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn agents_reach_a_tls_broker_and_print() {
    let dir = temp_dir("tls");
    let cert = fixture("tls-cert.pem");
    let key_file = fixture("tls-key.pem");
    let (_broker, base) = serve(
        &dir,
        &["--tls-cert", &cert.display().to_string(), "--tls-key", &key_file.display().to_string()],
        &dir.join("broker.log"),
    );
    assert!(base.starts_with("https://127.0.0.1:"), "{base}");
    let ca = fixture("tls-ca.pem");
    let pem = std::fs::read(&ca).expect("ca");
    let http = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&pem).expect("pem"))
        .build()
        .expect("client");
    let health = http.get(format!("{base}/healthz")).send().await.expect("https");
    assert_eq!(health.status(), reqwest::StatusCode::OK);
    // Plain HTTP to the TLS port gets no answer from the API.
    let plain = base.replacen("https://", "http://", 1);
    let refused = reqwest::Client::new().get(format!("{plain}/healthz")).timeout(Duration::from_secs(5)).send().await;
    assert!(refused.map(|r| r.status() != reqwest::StatusCode::OK).unwrap_or(true), "plain HTTP was served");
    // A client that does not trust the certificate is refused.
    assert!(
        reqwest::Client::new().get(format!("{base}/healthz")).send().await.is_err(),
        "an untrusted cert was accepted"
    );

    // A simulated printer and an agent that reaches the broker over https.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
        l.local_addr().expect("addr").port()
    };
    let paper = dir.join("paper.jsonl");
    let _sim = Proc(
        Command::new(BIN)
            .args(["printer-sim", "--listen", &format!("127.0.0.1:{port}"), "--count", "1"])
            .arg("--paper-log")
            .arg(&paper)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("printer-sim"),
    );
    let key = tenant(&http, &base, &format!("tcp://127.0.0.1:{port}")).await;
    let token: Value = http
        .post(format!("{base}/v1/stores/s1/agent-tokens"))
        .bearer_auth(&key)
        .send()
        .await
        .expect("token")
        .json()
        .await
        .expect("json");
    let _agent = Proc(
        Command::new(BIN)
            .args(["agent", "--server", &base, "--token", token["token"].as_str().expect("token")])
            .arg("--state-dir")
            .arg(dir.join("agent"))
            .arg("--ca-cert")
            .arg(&ca)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("agent.log")).expect("agent log"))
            .spawn()
            .expect("agent"),
    );
    let made: Value = http
        .post(format!("{base}/v1/print-tasks"))
        .bearer_auth(&key)
        .json(&order("T1"))
        .send()
        .await
        .expect("submit")
        .json()
        .await
        .expect("json");
    let id = made["task_id"].as_str().expect("task_id").to_owned();
    let start = Instant::now();
    loop {
        let task: Value = http
            .get(format!("{base}/v1/print-tasks/{id}"))
            .bearer_auth(&key)
            .send()
            .await
            .expect("get")
            .json()
            .await
            .expect("json");
        if task["state"] == "printed" {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "not printed over TLS: {task}; agent log:\n{}",
            std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let paper = std::fs::read_to_string(&paper).unwrap_or_default();
    assert_eq!(paper.lines().filter(|l| l.contains("order T1")).count(), 1, "printed once: {paper}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn the_tenant_rate_limit_is_set_on_the_command_line() {
    let dir = temp_dir("ratelimit");
    let (_broker, base) =
        serve(&dir, &["--tenant-rate-limit", "0.01", "--tenant-rate-burst", "5"], &dir.join("broker.log"));
    let http = reqwest::Client::new();
    // The store and the printer take two of the five.
    let key = tenant(&http, &base, "tcp://192.0.2.1:9100").await;
    for biz in ["R1", "R2", "R3"] {
        let res = http
            .post(format!("{base}/v1/print-tasks"))
            .bearer_auth(&key)
            .json(&order(biz))
            .send()
            .await
            .expect("submit");
        assert_eq!(res.status(), reqwest::StatusCode::CREATED, "{biz}");
    }
    let res =
        http.post(format!("{base}/v1/print-tasks")).bearer_auth(&key).json(&order("R4")).send().await.expect("submit");
    assert_eq!(res.status(), reqwest::StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = res.headers()["retry-after"].to_str().expect("ascii").parse().expect("seconds");
    assert!(retry >= 1);
    let body: Value = res.json().await.expect("json body");
    assert_eq!(body["error"]["code"], "too_many_requests");
    // A retry of an accepted task is still answered with its task.
    let res =
        http.post(format!("{base}/v1/print-tasks")).bearer_auth(&key).json(&order("R2")).send().await.expect("submit");
    assert_eq!(res.status(), reqwest::StatusCode::OK);
    assert_eq!(res.json::<Value>().await.expect("json")["duplicate"], true);
    // Nonsense settings are refused at start with the setting named.
    let out = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--tenant-rate-limit=-3"])
        .current_dir(&dir)
        .output()
        .expect("serve");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("tenant_rate_limit"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
