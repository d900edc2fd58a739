//! `onceprint bench fairness`: does one tenant's retry storm hurt another tenant (issue
//! 11)? It starts a broker with a per-tenant rate limit L, sets up two tenants, and
//! measures the submission latency of the *quiet* tenant (new tasks at a steady rate
//! below L) twice: alone, and while the *storm* tenant sends new tasks at F × L from
//! several connections. It reports the quiet tenant's percentiles in both phases and
//! their ratio, what the storm was answered (201 up to its limit, 429 beyond), and counts
//! as problems any quiet submission not answered 201 and a storm that got more accepted
//! than its limit allows.
//!
//! It must never talk to anything but the broker it started, on 127.0.0.1, and the
//! PostgreSQL database it was handed (inside a schema it creates and drops).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::body::Bytes;
use hyper::header::HeaderValue;
use hyper::Method;
use serde::Serialize;
use serde_json::json;

use crate::broker::{Broker, Launch};
use crate::http::{bearer, Conn};
use crate::report::{finish_text, machine_line, Percentiles};
use crate::setup::setup_call;
use crate::{random_hex, run_dir, BenchError, STORE_ID};

/// What `run_fairness` should do.
#[derive(Debug, Clone)]
pub struct FairnessOptions {
    pub broker_exe: PathBuf,
    /// `None`: a fresh SQLite file; `postgres://…`: a fresh schema there.
    pub database: Option<String>,
    /// The tenants' rate limit, requests per second (the burst is the same number).
    pub limit: f64,
    /// The storm sends this many times the limit.
    pub storm_factor: f64,
    /// The quiet tenant's submissions per second (below the limit).
    pub quiet_rate: f64,
    /// Seconds per phase.
    pub seconds: f64,
    /// Connections the storm uses.
    pub storm_connections: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct FairnessReport {
    pub machine: String,
    pub backend: &'static str,
    pub limit_per_second: f64,
    pub storm_factor: f64,
    pub seconds: f64,
    /// The quiet tenant alone.
    pub quiet_alone_ms: Percentiles,
    /// The quiet tenant during the storm.
    pub quiet_in_storm_ms: Percentiles,
    /// p99 in the storm / p99 alone (target ≤ 1.2).
    pub p99_ratio: f64,
    /// Requests per second the storm actually sent.
    pub storm_sent_per_second: f64,
    pub storm_accepted: u64,
    pub storm_refused_429: u64,
    pub storm_other: u64,
    pub problems: Vec<String>,
}

impl FairnessReport {
    pub fn render_text(&self) -> String {
        let mut s = format!(
            "bench fairness — tenant limit {:.0}/s, storm at {:.0}× ({:.0} sent/s), {:.0} s per phase ({}, {})\n",
            self.limit_per_second,
            self.storm_factor,
            self.storm_sent_per_second,
            self.seconds,
            self.backend,
            self.machine
        );
        for (name, p) in
            [("quiet tenant alone", &self.quiet_alone_ms), ("quiet tenant in storm", &self.quiet_in_storm_ms)]
        {
            s.push_str(&format!(
                "  {name:<22} {} submissions; ms p50 {:.2} p90 {:.2} p99 {:.2} max {:.2}\n",
                p.count, p.p50, p.p90, p.p99, p.max
            ));
        }
        s.push_str(&format!(
            "  p99 in storm / alone: {:.2} (target ≤ 1.20: {})\n",
            self.p99_ratio,
            if self.p99_ratio <= 1.2 { "met" } else { "missed" }
        ));
        s.push_str(&format!(
            "  storm answered: {} accepted (201), {} refused (429), {} other\n",
            self.storm_accepted, self.storm_refused_429, self.storm_other
        ));
        finish_text(s, &self.problems)
    }
}

pub async fn run_fairness(opts: FairnessOptions) -> Result<FairnessReport, BenchError> {
    if !(opts.limit >= 1.0 && opts.storm_factor >= 1.0 && opts.seconds > 0.0 && opts.storm_connections > 0) {
        return Err(BenchError::InvalidOptions("limit ≥ 1, storm factor ≥ 1, seconds > 0, connections ≥ 1".into()));
    }
    if !(opts.quiet_rate > 0.0 && opts.quiet_rate < opts.limit) {
        return Err(BenchError::InvalidOptions("the quiet rate must be above 0 and below the limit".into()));
    }
    let tmp = run_dir("onceprint-bench-fairness-")?;
    let dir = tmp.path().to_path_buf();
    let opts = &opts;
    crate::on_database(opts.database.as_deref(), &dir.clone(), |backend, url| async move {
        run_on(opts, backend, &url, &dir).await
    })
    .await
}

/// Creates tenant `id` with store s1 and printer p0 (an address nobody serves: the tasks
/// wait, which is all intake needs); returns its key.
async fn tenant(conn: &mut Conn, admin: &HeaderValue, id: &str) -> Result<HeaderValue, BenchError> {
    let t = setup_call(conn, admin, "/v1/tenants", json!({"id": id, "name": id})).await?;
    let key = t["api_key"].as_str().unwrap_or_default();
    let auth = bearer(key).map_err(|m| BenchError::Protocol { context: "tenant".into(), detail: m })?;
    setup_call(conn, &auth, "/v1/stores", json!({"id": STORE_ID, "name": "Bench store"})).await?;
    let printer = json!({"id": "p0", "store_id": STORE_ID, "name": "p0",
                         "transport": {"kind": "agent", "address": "tcp://192.0.2.1:9100"}});
    setup_call(conn, &auth, "/v1/printers", printer).await?;
    Ok(auth)
}

fn order(prefix: &str, n: u64) -> Bytes {
    Bytes::from(
        json!({"biz_no": format!("{prefix}-{n}"), "printer_id": "p0",
               "content": {"type": "text", "text": format!("order {n}\n1 x noodles\n")}})
        .to_string(),
    )
}

/// Sends new submissions at `rate` per second until `until`; returns the latencies (µs)
/// and statuses of the answers.
async fn paced(
    addr: SocketAddr,
    auth: HeaderValue,
    prefix: String,
    rate: f64,
    until: Instant,
    counter: Arc<AtomicU64>,
) -> Result<Vec<(u64, u16)>, BenchError> {
    let mut conn =
        Conn::connect(addr).await.map_err(|detail| BenchError::Http { context: "connect".into(), detail })?;
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    // A late tick is not made up for: the rate is what the client could send.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut out = Vec::new();
    while Instant::now() < until {
        tick.tick().await;
        let n = counter.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let answer = conn.request(Method::POST, "/v1/print-tasks", &auth, Some(order(&prefix, n))).await;
        let us = started.elapsed().as_micros() as u64;
        match answer {
            Ok((status, _)) => out.push((us, status.as_u16())),
            Err(_) => out.push((us, 0)),
        }
    }
    Ok(out)
}

async fn run_on(
    opts: &FairnessOptions,
    backend: &'static str,
    url: &str,
    dir: &std::path::Path,
) -> Result<FairnessReport, BenchError> {
    let admin_token = random_hex(16)?;
    let limit = format!("{}", opts.limit);
    let broker = Broker::launch(&Launch {
        exe: opts.broker_exe.clone(),
        database_url: url.to_owned(),
        admin_token: admin_token.clone(),
        log_path: dir.join("broker.log"),
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        config: None,
        extra_args: vec!["--tenant-rate-limit".into(), limit.clone(), "--tenant-rate-burst".into(), limit],
        default_rate_limits: false,
    })
    .await?;
    let addr = broker.addr;
    let mut conn =
        Conn::connect(addr).await.map_err(|detail| BenchError::Http { context: "connect".into(), detail })?;
    let admin = bearer(&admin_token).map_err(BenchError::InvalidOptions)?;
    let quiet = tenant(&mut conn, &admin, "quiet").await?;
    let storm = tenant(&mut conn, &admin, "storm").await?;
    // The set-up calls took tokens; let both buckets fill again.
    tokio::time::sleep(Duration::from_secs_f64((3.0 / opts.limit).max(0.05) + 0.5)).await;

    let phase = Duration::from_secs_f64(opts.seconds);
    let quiet_counter = Arc::new(AtomicU64::new(0));
    // Warm-up, then the quiet tenant alone.
    paced(
        addr,
        quiet.clone(),
        "warm".into(),
        opts.quiet_rate,
        Instant::now() + Duration::from_secs(1),
        quiet_counter.clone(),
    )
    .await?;
    let alone =
        paced(addr, quiet.clone(), "quiet".into(), opts.quiet_rate, Instant::now() + phase, quiet_counter.clone())
            .await?;

    // The storm, and the quiet tenant measured again beside it.
    let until = Instant::now() + phase;
    let storm_counter = Arc::new(AtomicU64::new(0));
    let per_conn = opts.limit * opts.storm_factor / opts.storm_connections as f64;
    let storm_started = Instant::now();
    let mut storms = Vec::new();
    for _ in 0..opts.storm_connections {
        storms.push(tokio::spawn(paced(addr, storm.clone(), "storm".into(), per_conn, until, storm_counter.clone())));
    }
    let in_storm = paced(addr, quiet.clone(), "quiet".into(), opts.quiet_rate, until, quiet_counter.clone()).await?;
    let mut storm_answers = Vec::new();
    for s in storms {
        match s.await {
            Ok(Ok(a)) => storm_answers.extend(a),
            Ok(Err(e)) => return Err(e),
            Err(e) => return Err(BenchError::InvalidOptions(format!("storm task: {e}"))),
        }
    }
    let storm_secs = storm_started.elapsed().as_secs_f64();
    let mut problems = Vec::new();
    crate::procs::note_stop("broker", broker.stop().await, &mut problems);

    for (phase, answers) in [("alone", &alone), ("in the storm", &in_storm)] {
        let bad = answers.iter().filter(|(_, s)| *s != 201).count();
        if bad > 0 {
            problems.push(format!("{bad} quiet-tenant submissions {phase} were not answered 201"));
        }
    }
    let accepted = storm_answers.iter().filter(|(_, s)| *s == 201).count() as u64;
    let refused = storm_answers.iter().filter(|(_, s)| *s == 429).count() as u64;
    let other = storm_answers.len() as u64 - accepted - refused;
    // Burst + the rate over the storm's time, with one second of slack for timing.
    let allowed = opts.limit * (storm_secs + 2.0);
    if accepted as f64 > allowed {
        problems.push(format!("the storm got {accepted} tasks accepted; its limit allows about {allowed:.0}"));
    }
    if other > 0 {
        problems.push(format!("{other} storm requests got neither 201 nor 429"));
    }
    let quiet_alone_ms = Percentiles::from_micros(alone.iter().map(|(us, _)| *us).collect());
    let quiet_in_storm_ms = Percentiles::from_micros(in_storm.iter().map(|(us, _)| *us).collect());
    let p99_ratio = if quiet_alone_ms.p99 > 0.0 { quiet_in_storm_ms.p99 / quiet_alone_ms.p99 } else { 0.0 };
    Ok(FairnessReport {
        machine: machine_line(),
        backend,
        limit_per_second: opts.limit,
        storm_factor: opts.storm_factor,
        seconds: opts.seconds,
        quiet_alone_ms,
        quiet_in_storm_ms,
        p99_ratio,
        storm_sent_per_second: storm_answers.len() as f64 / storm_secs.max(0.001),
        storm_accepted: accepted,
        storm_refused_429: refused,
        storm_other: other,
        problems,
    })
}
