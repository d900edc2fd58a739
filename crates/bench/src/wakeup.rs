//! `onceprint bench wakeup`: how fast a task committed on one broker node reaches a long
//! poll waiting on another node of the same PostgreSQL schema, and what telling
//! the other nodes costs intake.
//!
//! It starts nodes A and B on a fresh schema, registers one agent printer, and for each
//! round holds a long poll on B (a re-check far longer than the round, so only the word
//! from A can end it early), submits one task on A, and measures from A's 201 to B's
//! answer with the delivery; the delivery is then acknowledged as printed on B, which
//! frees the lane for the next round. Then it measures intake on A (closed loop, several
//! connections, distinct keys over ten printers) twice: with the node link off and on.
//!
//! It must never talk to anything but the brokers it started, on 127.0.0.1, and the
//! PostgreSQL database it was handed (inside a schema it creates and drops).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::body::Bytes;
use hyper::header::HeaderValue;
use hyper::Method;
use serde::Serialize;
use serde_json::{json, Value};

use crate::broker::{Broker, Launch};
use crate::http::{bearer, snippet, Conn};
use crate::report::{finish_text, machine_line, Percentiles};
use crate::setup::{setup_call, store_and_printers, tenant};
use crate::{random_hex, run_dir, BenchError, STORE_ID};

/// What `run_wakeup` should do.
#[derive(Debug, Clone)]
pub struct WakeupOptions {
    pub broker_exe: PathBuf,
    /// A `postgres://` URL; a fresh schema is created there and dropped afterwards.
    pub database: String,
    pub rounds: usize,
    /// Seconds of intake per phase (link off, link on).
    pub intake_seconds: f64,
    /// Connections of the intake phases.
    pub concurrency: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct WakeupReport {
    pub machine: String,
    pub rounds: usize,
    /// From node A's 201 to node B's poll answering with the task.
    pub wakeup_ms: Percentiles,
    pub intake_seconds: f64,
    pub concurrency: usize,
    pub intake_per_second_link_off: f64,
    pub intake_per_second_link_on: f64,
    pub problems: Vec<String>,
}

impl WakeupReport {
    pub fn render_text(&self) -> String {
        let w = &self.wakeup_ms;
        let mut s = format!(
            "bench wakeup — two nodes on one PostgreSQL schema ({})\n  cross-node wake-up, A's 201 → B's poll \
             answer, {} rounds: ms p50 {:.2} p90 {:.2} p99 {:.2} max {:.2}\n",
            self.machine, self.rounds, w.p50, w.p90, w.p99, w.max
        );
        s.push_str(&format!(
            "  intake on A, {} connections, {:.0} s each: {:.0}/s with the node link off, {:.0}/s with it on\n",
            self.concurrency, self.intake_seconds, self.intake_per_second_link_off, self.intake_per_second_link_on
        ));
        finish_text(s, &self.problems)
    }
}

fn http_err(context: &str) -> impl Fn(String) -> BenchError + '_ {
    move |detail| BenchError::Http { context: context.to_owned(), detail }
}

pub async fn run_wakeup(opts: WakeupOptions) -> Result<WakeupReport, BenchError> {
    if !(opts.database.starts_with("postgres://") || opts.database.starts_with("postgresql://")) {
        return Err(BenchError::InvalidOptions("wakeup needs --database postgres://… (nodes share it)".into()));
    }
    if opts.rounds == 0 || opts.concurrency == 0 || opts.intake_seconds <= 0.0 {
        return Err(BenchError::InvalidOptions("rounds, concurrency and intake seconds must be positive".into()));
    }
    let tmp = run_dir("onceprint-bench-wakeup-")?;
    let dir = tmp.path().to_path_buf();
    let database = opts.database.clone();
    let opts = &opts;
    crate::on_database(Some(&database), &dir.clone(), |_, url| async move { run_on(opts, &url, &dir).await }).await
}

fn launch(opts: &WakeupOptions, url: &str, admin: &str, log: PathBuf, extra: &[&str]) -> Launch {
    Launch {
        exe: opts.broker_exe.clone(),
        database_url: url.to_owned(),
        admin_token: admin.to_owned(),
        log_path: log,
        listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        config: None,
        extra_args: extra.iter().map(|s| (*s).to_owned()).collect(),
        default_rate_limits: false,
    }
}

async fn run_on(opts: &WakeupOptions, url: &str, dir: &std::path::Path) -> Result<WakeupReport, BenchError> {
    let admin = random_hex(16)?;
    // Re-checks far apart: a poll that answers early was woken by the word from node A.
    let slow = ["--poll-recheck-ms", "60000"];
    let a = Broker::launch(&launch(opts, url, &admin, dir.join("a.log"), &slow)).await?;
    let b = Broker::launch(&launch(opts, url, &admin, dir.join("b.log"), &slow)).await?;
    let mut conn_a = Conn::connect(a.addr).await.map_err(http_err("connecting to A"))?;
    let auth = tenant(&mut conn_a, &admin).await?;
    let printers: Vec<String> = (0..10).map(|_| "tcp://127.0.0.1:9".to_owned()).collect();
    store_and_printers(&mut conn_a, &auth, &printers).await?;
    let token = setup_call(&mut conn_a, &auth, &format!("/v1/stores/{STORE_ID}/agent-tokens"), json!({})).await?;
    let token = token.get("token").and_then(Value::as_str).unwrap_or_default().to_owned();
    let agent = bearer(&token).map_err(BenchError::InvalidOptions)?;

    let mut problems = Vec::new();
    let mut latencies = Vec::with_capacity(opts.rounds);
    let mut poll_conn = Conn::connect(b.addr).await.map_err(http_err("connecting to B"))?;
    let mut ack_conn = Conn::connect(b.addr).await.map_err(http_err("connecting to B"))?;
    // Node B learns the agent before the rounds.
    poll(&mut poll_conn, &agent, 0).await?;
    for round in 0..opts.rounds {
        let agent_here = agent.clone();
        let waiting = tokio::spawn(async move {
            let answer = poll(&mut poll_conn, &agent_here, 10_000).await;
            (answer, Instant::now(), poll_conn)
        });
        // Let the poll reach its wait (its first look finds nothing).
        tokio::time::sleep(Duration::from_millis(30)).await;
        let body = json!({"biz_no": format!("W{round}"), "printer_id": "p0",
                          "content": {"type": "text", "text": "wake up\n"}});
        let (status, answer) = conn_a
            .request(Method::POST, "/v1/print-tasks", &auth, Some(Bytes::from(body.to_string())))
            .await
            .map_err(http_err("submitting on A"))?;
        let committed = Instant::now();
        if status.as_u16() != 201 {
            problems.push(format!("round {round}: submission answered {status}: {}", snippet(&answer, 200)));
        }
        let (deliveries, answered, conn) = waiting
            .await
            .map_err(|e| BenchError::Protocol { context: "the poll on B".into(), detail: e.to_string() })?;
        poll_conn = conn;
        let deliveries = deliveries?;
        match deliveries.first() {
            Some(d) => {
                latencies.push(answered.saturating_duration_since(committed).as_micros() as u64);
                let ack = json!({"acks": [{"task_id": d["task_id"], "attempt": d["attempt"],
                                           "outcome": "printed", "detail": ""}]});
                ack_conn
                    .request(Method::POST, "/v1/agent/acks", &agent, Some(Bytes::from(ack.to_string())))
                    .await
                    .map_err(http_err("acknowledging on B"))?;
            }
            None => problems.push(format!("round {round}: the poll on B ended without the task")),
        }
    }

    // Intake with the link off (node A restarted without it), then on again.
    let intake_off = {
        a.stop().await?;
        let off = Broker::launch(&launch(opts, url, &admin, dir.join("a-off.log"), &["--node-link", "false"])).await?;
        let rate = intake(opts, off.addr, &auth, "off").await?;
        off.stop().await?;
        rate
    };
    let on = Broker::launch(&launch(opts, url, &admin, dir.join("a-on.log"), &[])).await?;
    let intake_on = intake(opts, on.addr, &auth, "on").await?;
    on.stop().await?;
    b.stop().await?;
    Ok(WakeupReport {
        machine: machine_line(),
        rounds: opts.rounds,
        wakeup_ms: Percentiles::from_micros(latencies),
        intake_seconds: opts.intake_seconds,
        concurrency: opts.concurrency,
        intake_per_second_link_off: intake_off,
        intake_per_second_link_on: intake_on,
        problems,
    })
}

async fn poll(conn: &mut Conn, agent: &HeaderValue, wait_ms: u64) -> Result<Vec<Value>, BenchError> {
    let body = json!({"agent_id": "bench-agent", "wait_ms": wait_ms, "max": 16});
    let (status, answer) = conn
        .request(Method::POST, "/v1/agent/poll", agent, Some(Bytes::from(body.to_string())))
        .await
        .map_err(http_err("polling on B"))?;
    if status.as_u16() != 200 {
        return Err(BenchError::Protocol { context: "polling on B".into(), detail: snippet(&answer, 300) });
    }
    let v: Value = serde_json::from_slice(&answer).unwrap_or(Value::Null);
    Ok(v["deliveries"].as_array().cloned().unwrap_or_default())
}

/// Submissions per second answered 201 by the node at `addr`, closed loop.
async fn intake(
    opts: &WakeupOptions,
    addr: std::net::SocketAddr,
    auth: &HeaderValue,
    tag: &'static str,
) -> Result<f64, BenchError> {
    let stop = Arc::new(AtomicBool::new(false));
    let created = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for c in 0..opts.concurrency {
        let mut conn = Conn::connect(addr).await.map_err(http_err("connecting for intake"))?;
        let (stop, created, auth) = (stop.clone(), created.clone(), auth.clone());
        workers.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let body = json!({"biz_no": format!("I{tag}-{c}-{n}"), "printer_id": format!("p{}", n % 10),
                                  "content": {"type": "text", "text": "intake\n"}});
                n += 1;
                if let Ok((s, _)) =
                    conn.request(Method::POST, "/v1/print-tasks", &auth, Some(Bytes::from(body.to_string()))).await
                {
                    if s.as_u16() == 201 {
                        created.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(opts.intake_seconds)).await;
    let count = created.load(Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        let _ = w.await;
    }
    Ok(count as f64 / elapsed)
}
