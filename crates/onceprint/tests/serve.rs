//! `onceprint serve` as a user runs it: the admin token is generated and shown once,
//! remembered across restarts, configuration comes from flags, environment and TOML, and
//! SIGTERM stops the broker cleanly with exit code 0.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Serve {
    child: Child,
    lines: Vec<String>,
    base: String,
}

fn serve(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Serve {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_onceprint"));
    cmd.arg("serve").args(args).current_dir(dir).env("RUST_LOG", "warn").stdout(Stdio::piped()).stderr(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("start serve");
    let stdout = child.stdout.take().expect("stdout");
    let mut reader = BufReader::new(stdout).lines();
    let mut lines = Vec::new();
    let base = loop {
        let line = reader.next().expect("the broker exited before listening").expect("read stdout");
        lines.push(line.clone());
        if let Some(url) = line.strip_prefix("listening on ") {
            break url.to_owned();
        }
    };
    std::thread::spawn(move || for _ in reader {});
    Serve { child, lines, base }
}

fn terminate(mut s: Serve) -> std::process::ExitStatus {
    let pid = s.child.id().to_string();
    Command::new("kill").args(["-TERM", &pid]).status().expect("kill -TERM");
    let start = Instant::now();
    loop {
        if let Some(status) = s.child.try_wait().expect("wait") {
            return status;
        }
        assert!(start.elapsed() < Duration::from_secs(15), "the broker did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("onceprint-{name}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

async fn create_tenant(base: &str, admin: &str, id: &str) -> reqwest::StatusCode {
    reqwest::Client::new()
        .post(format!("{base}/v1/tenants"))
        .bearer_auth(admin)
        .json(&serde_json::json!({"id": id, "name": id}))
        .send()
        .await
        .expect("request")
        .status()
}

#[tokio::test]
async fn generated_admin_token_is_shown_once_and_remembered() {
    let dir = temp_dir("token");
    // Default database: sqlite://onceprint.db in the working directory.
    let first = serve(&dir, &["--listen", "127.0.0.1:0"], &[]);
    let token_line = first.lines.iter().find(|l| l.starts_with("admin token")).expect("token printed at first start");
    let token = token_line.rsplit(' ').next().expect("token").to_owned();
    assert!(token.starts_with("opadm_"));
    assert_eq!(create_tenant(&first.base, &token, "t1").await, reqwest::StatusCode::CREATED);
    assert_eq!(create_tenant(&first.base, "wrong", "t2").await, reqwest::StatusCode::UNAUTHORIZED);
    assert!(terminate(first).success(), "SIGTERM → exit 0");
    assert!(dir.join("onceprint.db").exists());

    let second = serve(&dir, &["--listen", "127.0.0.1:0"], &[]);
    assert!(!second.lines.iter().any(|l| l.contains("admin token")), "shown once only: {:?}", second.lines);
    assert_eq!(create_tenant(&second.base, &token, "t3").await, reqwest::StatusCode::CREATED);
    assert!(terminate(second).success());
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn flags_beat_environment_beat_the_config_file() {
    let dir = temp_dir("config");
    std::fs::write(
        dir.join("onceprint.toml"),
        "admin_token = \"from-file\"\ndatabase = \"sqlite://file.db\"\nmax_body_bytes = 200\n",
    )
    .expect("write config");
    let s = serve(
        &dir,
        &["--config", "onceprint.toml", "--listen", "127.0.0.1:0"],
        &[("ONCEPRINT_ADMIN_TOKEN", "from-env")],
    );
    assert_eq!(create_tenant(&s.base, "from-file", "a").await, reqwest::StatusCode::UNAUTHORIZED);
    assert_eq!(create_tenant(&s.base, "from-env", "b").await, reqwest::StatusCode::CREATED);
    // max_body_bytes from the file applies: a 300-byte body is too large.
    let res = reqwest::Client::new()
        .post(format!("{}/v1/tenants", s.base))
        .bearer_auth("from-env")
        .body(format!("{{\"id\":\"c\",\"name\":\"{}\"}}", "x".repeat(300)))
        .send()
        .await
        .expect("request");
    assert_eq!(res.status(), reqwest::StatusCode::PAYLOAD_TOO_LARGE);
    assert!(terminate(s).success());
    assert!(dir.join("file.db").exists(), "database from the config file");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn bad_configuration_is_a_clear_error() {
    let dir = temp_dir("badconfig");
    std::fs::write(dir.join("bad.toml"), "listen = 5\n").expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_onceprint"))
        .args(["serve", "--config", "bad.toml"])
        .current_dir(&dir)
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.toml") && err.contains("listen"), "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_onceprint"))
        .args(["serve", "--database", "mysql://x", "--listen", "127.0.0.1:0"])
        .current_dir(&dir)
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("sqlite://PATH or postgres://"));
    let _ = std::fs::remove_dir_all(dir);
}

/// Starts `serve` with info logs and returns the line that says it is serving.
fn serving_line(dir: &Path, args: &[&str]) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_onceprint"))
        .arg("serve")
        .args(args)
        .current_dir(dir)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start serve");
    let stderr = child.stderr.take().expect("stderr");
    let line = BufReader::new(stderr)
        .lines()
        .map_while(Result::ok)
        .find(|l| l.contains("onceprint serving"))
        .expect("the broker exited before serving");
    let _ = child.kill();
    let _ = child.wait();
    line
}

#[test]
fn worker_threads_come_from_the_flag_or_the_file_and_default_to_one_fewer_than_the_cores() {
    let dir = temp_dir("workers");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let line = serving_line(&dir, &["--listen", "127.0.0.1:0"]);
    assert!(line.contains(&format!("worker_threads={}", (cores - 1).max(1))), "SQLite default: {line}");
    let line = serving_line(&dir, &["--listen", "127.0.0.1:0", "--worker-threads", "3"]);
    assert!(line.contains("worker_threads=3"), "{line}");
    std::fs::write(dir.join("w.toml"), "worker_threads = 5\n").expect("write");
    let line = serving_line(&dir, &["--listen", "127.0.0.1:0", "--config", "w.toml"]);
    assert!(line.contains("worker_threads=5"), "{line}");

    std::fs::write(dir.join("zero.toml"), "worker_threads = 0\n").expect("write");
    for args in [["--worker-threads", "0"], ["--config", "zero.toml"]] {
        let out = Command::new(env!("CARGO_BIN_EXE_onceprint"))
            .arg("serve")
            .args(args)
            .args(["--listen", "127.0.0.1:0"])
            .current_dir(&dir)
            .output()
            .expect("run");
        assert!(!out.status.success(), "{args:?} must be refused");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("worker_threads: at least 1"), "{args:?}: {err}");
    }
    for command in
        [&["agent", "--server", "http://127.0.0.1:1", "--token", "t", "--state-dir", "s"][..], &["printer-sim"]]
    {
        let out = Command::new(env!("CARGO_BIN_EXE_onceprint"))
            .args(command)
            .args(["--worker-threads", "0"])
            .current_dir(&dir)
            .output()
            .expect("run");
        assert!(!out.status.success(), "{command:?} --worker-threads 0 must be refused");
        assert!(String::from_utf8_lossy(&out.stderr).contains("--worker-threads"), "{command:?}");
    }
    let _ = std::fs::remove_dir_all(dir);
}
