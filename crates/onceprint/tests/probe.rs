//! `onceprint probe URL`, the container image's health check, through the real binary: exit
//! 0 for a 2xx answer of a running broker, non-zero for any other answer, for a refused
//! connection, and for a peer that accepts but never answers (within the timeout).

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_onceprint");

fn temp_dir(name: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("onceprint-{name}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// A broker on a fresh SQLite file and a free port; returns it with its base URL.
fn start_broker(dir: &std::path::Path) -> (Child, String) {
    let db = format!("sqlite://{}", dir.join("probe.db").display());
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--database", &db])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start serve");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let base = loop {
        let line = lines.next().expect("the broker exited before listening").expect("read stdout");
        if let Some(url) = line.strip_prefix("listening on ") {
            break url.to_owned();
        }
    };
    // Keep draining stdout so that the broker never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    (child, base)
}

fn probe(args: &[&str]) -> (Output, Duration) {
    let started = Instant::now();
    let out = Command::new(BIN).arg("probe").args(args).env("RUST_LOG", "warn").output().expect("run probe");
    (out, started.elapsed())
}

#[test]
fn probe_passes_for_a_ready_broker_and_fails_for_other_answers() {
    let dir = temp_dir("probe");
    let (mut broker, base) = start_broker(&dir);

    let (out, _) = probe(&[&format!("{base}/readyz")]);
    assert!(out.status.success(), "readyz of a running broker: {out:?}");
    let (out, _) = probe(&["--timeout-ms", "2000", &format!("{base}/healthz")]);
    assert!(out.status.success(), "healthz: {out:?}");

    // An answer that is not 2xx is a failed check, and says what came back.
    let (out, _) = probe(&[&format!("{base}/no-such-path")]);
    assert_eq!(out.status.code(), Some(1), "404 must fail the probe: {out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("404"), "the failure names the status: {stderr}");

    broker.kill().expect("kill the broker");
    let _ = broker.wait();

    // The same URL with the broker gone: nobody listens, the connection is refused.
    let (out, _) = probe(&[&format!("{base}/readyz")]);
    assert!(!out.status.success(), "a stopped broker must fail the probe: {out:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn probe_gives_up_on_a_peer_that_never_answers() {
    // The kernel completes the TCP handshake into the listener's backlog, but nothing ever
    // reads the request or answers: only the timeout can end the probe.
    let silent = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = silent.local_addr().expect("addr");
    let (out, took) = probe(&["--timeout-ms", "300", &format!("http://{addr}/readyz")]);
    assert!(!out.status.success(), "no answer must fail the probe: {out:?}");
    assert!(took < Duration::from_secs(10), "the probe must give up after its timeout, took {took:?}");
    drop(silent);
}

#[test]
fn probe_refuses_a_url_it_cannot_use() {
    let (out, _) = probe(&["not a url"]);
    assert!(!out.status.success(), "a malformed URL must fail the probe: {out:?}");
}
