//! `onceprint bench polls`: what a fleet of Star CloudPRNT printers polling the broker
//! costs. It starts a broker on a fresh database, registers P `cloudprnt`
//! printers (each with its own login), and plays P printers that each poll
//! `POST /cloudprnt` every `interval` with Basic auth, from one keep-alive connection
//! apiece, at random phases. Optionally T tasks are submitted while they poll, spread
//! over the printers; a printer told `jobReady` fetches the job as `text/plain` and
//! confirms it with `DELETE … code=200 OK`, as a real printer does.
//!
//! It reports polls/s, poll latency percentiles, the broker's CPU time per poll (user +
//! system, from `/proc`, over the measured window only) and its peak RSS; with tasks, how
//! many were printed, and it counts as problems any answer but 200 to a poll, a job that
//! was not printed by the end, and a job fetched twice under two tokens.
//!
//! It must never talk to anything but the broker it started, on 127.0.0.1, and the
//! PostgreSQL database it was handed (inside a schema it creates and drops).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use hyper::body::Bytes;
use hyper::header::HeaderValue;
use hyper::Method;
use serde::Serialize;
use serde_json::{json, Value};

use crate::broker::Broker;
use crate::http::{snippet, Conn};
use crate::plan::SplitMix64;
use crate::report::{finish_text, machine_line, Percentiles};
use crate::setup::{setup_call, tenant};
use crate::{random_hex, run_dir, BenchError, STORE_ID};

/// What `run_polls` should do.
#[derive(Debug, Clone)]
pub struct PollsOptions {
    pub broker_exe: PathBuf,
    /// `None`: a fresh SQLite file; `postgres://…`: a fresh schema there.
    pub database: Option<String>,
    pub printers: usize,
    /// Each printer polls this often.
    pub interval: Duration,
    /// How long polls are measured (after one interval of warm-up).
    pub seconds: f64,
    /// Tasks submitted during the measured window, spread over the printers.
    pub tasks: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct PollsReport {
    pub machine: String,
    pub backend: &'static str,
    pub printers: usize,
    pub interval_ms: u64,
    pub seconds: f64,
    pub polls: u64,
    pub polls_per_second: f64,
    pub poll_latency_ms: Percentiles,
    /// Broker CPU time (user + system) per poll over the measured window, in microseconds
    /// (with tasks, their intake and delivery are in it too).
    pub broker_cpu_us_per_poll: Option<f64>,
    /// Share of one core the broker used over the window.
    pub broker_cpu_share: Option<f64>,
    pub broker_peak_rss_mib: Option<f64>,
    pub tasks: usize,
    pub printed: usize,
    pub problems: Vec<String>,
}

impl PollsReport {
    pub fn render_text(&self) -> String {
        let mut s = format!(
            "bench polls — {} CloudPRNT printers polling every {} ms for {:.0} s ({}, {})\n",
            self.printers, self.interval_ms, self.seconds, self.backend, self.machine
        );
        let p = &self.poll_latency_ms;
        s.push_str(&format!(
            "  polls: {} ({:.0}/s); latency ms p50 {:.2} p90 {:.2} p99 {:.2} max {:.2}\n",
            self.polls, self.polls_per_second, p.p50, p.p90, p.p99, p.max
        ));
        if let (Some(us), Some(share)) = (self.broker_cpu_us_per_poll, self.broker_cpu_share) {
            s.push_str(&format!("  broker CPU: {us:.0} µs per poll ({:.1} % of one core)\n", share * 100.0));
        }
        if let Some(m) = self.broker_peak_rss_mib {
            s.push_str(&format!("  broker peak RSS: {m:.1} MiB\n"));
        }
        if self.tasks > 0 {
            s.push_str(&format!(
                "  tasks: {} submitted, {} printed (fetched and confirmed)\n",
                self.tasks, self.printed
            ));
        }
        finish_text(s, &self.problems)
    }
}

/// One simulated printer: its MAC and Basic-auth header.
struct Poller {
    mac: String,
    auth: HeaderValue,
}

#[derive(Default)]
struct Tally {
    latencies_us: Vec<u64>,
    problems: Vec<String>,
    /// task token → how many times it was fetched.
    fetched: HashMap<String, u32>,
    printed: usize,
}

pub async fn run_polls(opts: PollsOptions) -> Result<PollsReport, BenchError> {
    if opts.printers == 0 || opts.printers > 20_000 {
        return Err(BenchError::InvalidOptions("printers must be 1–20000".into()));
    }
    if opts.interval < Duration::from_millis(100) || opts.seconds <= 0.0 {
        return Err(BenchError::InvalidOptions("interval must be ≥ 100 ms and seconds > 0".into()));
    }
    let tmp = run_dir("onceprint-bench-polls-")?;
    let dir = tmp.path().to_path_buf();
    let opts = &opts;
    crate::on_database(opts.database.as_deref(), &dir.clone(), |backend, url| async move {
        run_on(opts, backend, &url, &dir).await
    })
    .await
}

async fn run_on(
    opts: &PollsOptions,
    backend: &'static str,
    url: &str,
    dir: &std::path::Path,
) -> Result<PollsReport, BenchError> {
    let admin = random_hex(16)?;
    let broker = Broker::start(&opts.broker_exe, url, &admin, &dir.join("broker.log")).await?;
    let addr = broker.addr;
    let mut conn =
        Conn::connect(addr).await.map_err(|detail| BenchError::Http { context: "connecting".into(), detail })?;
    let auth = tenant(&mut conn, &admin).await?;
    setup_call(&mut conn, &auth, "/v1/stores", json!({"id": STORE_ID, "name": "Bench store"})).await?;
    let mut pollers = Vec::with_capacity(opts.printers);
    for p in 0..opts.printers {
        let mac = format!("00:11:62:{:02x}:{:02x}:{:02x}", (p >> 16) & 0xff, (p >> 8) & 0xff, p & 0xff);
        let body = json!({"id": format!("p{p}"), "store_id": STORE_ID,
                          "transport": {"kind": "cloudprnt", "mac": mac, "poll_interval_s": opts.interval.as_secs().max(1)}});
        let created = setup_call(&mut conn, &auth, "/v1/printers", body).await?;
        let user = created["credentials"]["username"].as_str().unwrap_or_default();
        let pass = created["credentials"]["password"].as_str().unwrap_or_default();
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
        let auth = HeaderValue::from_str(&format!("Basic {basic}"))
            .map_err(|e| BenchError::Protocol { context: "printer login".into(), detail: e.to_string() })?;
        pollers.push(Arc::new(Poller { mac, auth }));
    }

    let tally = Arc::new(Mutex::new(Tally::default()));
    let warmup = opts.interval;
    let start = Instant::now();
    let measure_from = start + warmup;
    let stop_at = measure_from + Duration::from_secs_f64(opts.seconds);
    let mut rng = SplitMix64::new(7);
    let mut handles = Vec::with_capacity(pollers.len());
    for poller in &pollers {
        let phase = Duration::from_micros(rng.next_u64() % opts.interval.as_micros().max(1) as u64);
        let (poller, tally, interval) = (poller.clone(), tally.clone(), opts.interval);
        handles.push(tokio::spawn(async move {
            poll_loop(addr, poller, tally, start + phase, interval, measure_from, stop_at).await
        }));
    }
    // The broker's CPU time over the measured window only.
    tokio::time::sleep_until((measure_from).into()).await;
    let cpu_before = broker.stats().cpu_seconds;
    let window_start = Instant::now();
    if opts.tasks > 0 {
        submit_tasks(&mut conn, &auth, opts).await?;
    }
    tokio::time::sleep_until(stop_at.into()).await;
    let cpu_after = broker.stats().cpu_seconds;
    let window = window_start.elapsed().as_secs_f64();
    for h in handles {
        let _ = h.await;
    }
    let stats = broker.stats();
    let mut problems = Vec::new();
    crate::procs::note_stop("broker", broker.stop().await, &mut problems);

    let mut t = std::mem::take(&mut *tally.lock().unwrap_or_else(|e| e.into_inner()));
    problems.append(&mut t.problems);
    let twice: Vec<&String> = t.fetched.iter().filter(|(_, n)| **n > 1).map(|(k, _)| k).collect();
    if !twice.is_empty() {
        problems.push(format!("{} job tokens were handed out more than once", twice.len()));
    }
    if t.printed < opts.tasks {
        problems.push(format!("{} of {} tasks were not printed by the end", opts.tasks - t.printed, opts.tasks));
    }
    let polls = t.latencies_us.len() as u64;
    let cpu = match (cpu_before, cpu_after) {
        (Some(a), Some(b)) if b >= a => Some(b - a),
        _ => None,
    };
    Ok(PollsReport {
        machine: machine_line(),
        backend,
        printers: opts.printers,
        interval_ms: opts.interval.as_millis() as u64,
        seconds: opts.seconds,
        polls,
        polls_per_second: polls as f64 / opts.seconds,
        poll_latency_ms: Percentiles::from_micros(t.latencies_us),
        broker_cpu_us_per_poll: cpu.filter(|_| polls > 0).map(|c| c * 1e6 / polls as f64),
        broker_cpu_share: cpu.map(|c| c / window.max(1e-9)),
        broker_peak_rss_mib: stats.peak_rss_kib.map(|k| k as f64 / 1024.0),
        tasks: opts.tasks,
        printed: t.printed,
        problems,
    })
}

/// Submits the tasks at once, spread round-robin over the printers.
async fn submit_tasks(conn: &mut Conn, auth: &HeaderValue, opts: &PollsOptions) -> Result<(), BenchError> {
    for i in 0..opts.tasks {
        let body = json!({"biz_no": format!("poll-{i}"), "printer_id": format!("p{}", i % opts.printers),
                          "print_type": "receipt", "content": {"type": "text", "text": format!("order {i}\n")}});
        let (status, answer) = conn
            .request(Method::POST, "/v1/print-tasks", auth, Some(Bytes::from(body.to_string())))
            .await
            .map_err(|detail| BenchError::Http { context: "submitting".into(), detail })?;
        if status.as_u16() != 201 {
            return Err(BenchError::Protocol {
                context: "submitting".into(),
                detail: format!("HTTP {status}: {}", snippet(&answer, 300)),
            });
        }
    }
    Ok(())
}

async fn poll_loop(
    addr: std::net::SocketAddr,
    p: Arc<Poller>,
    tally: Arc<Mutex<Tally>>,
    first: Instant,
    interval: Duration,
    measure_from: Instant,
    stop_at: Instant,
) {
    let note = |m: String| tally.lock().unwrap_or_else(|e| e.into_inner()).problems.push(m);
    let mut conn = match Conn::connect(addr).await {
        Ok(c) => c,
        Err(e) => return note(format!("printer {}: {e}", p.mac)),
    };
    let mut next = first;
    let poll_body =
        Bytes::from(json!({"statusCode": "200%20OK", "printerMAC": p.mac, "printingInProgress": false}).to_string());
    while next < stop_at {
        tokio::time::sleep_until(next.into()).await;
        next += interval;
        let sent = Instant::now();
        let answer = conn.request(Method::POST, "/cloudprnt", &p.auth, Some(poll_body.clone())).await;
        let took = sent.elapsed();
        let (status, body) = match answer {
            Ok(a) => a,
            Err(e) => return note(format!("printer {}: poll failed: {e}", p.mac)),
        };
        if status.as_u16() != 200 {
            note(format!("printer {}: poll answered {status}: {}", p.mac, snippet(&body, 200)));
            continue;
        }
        if sent >= measure_from {
            tally.lock().unwrap_or_else(|e| e.into_inner()).latencies_us.push(took.as_micros() as u64);
        }
        let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        if v["jobReady"] == true {
            let token = v["jobToken"].as_str().unwrap_or_default().to_owned();
            if let Err(e) = print_job(&mut conn, &p, &token, &tally).await {
                note(format!("printer {}: job {token}: {e}", p.mac));
            }
        }
    }
}

/// Fetches a job as text and confirms it, as a printer that printed it does.
async fn print_job(conn: &mut Conn, p: &Poller, token: &str, tally: &Mutex<Tally>) -> Result<(), String> {
    let mac = pct(&p.mac);
    let tok = pct(token);
    let (status, _) = conn
        .request(Method::GET, &format!("/cloudprnt?mac={mac}&type=text%2Fplain&token={tok}"), &p.auth, None)
        .await?;
    if status.as_u16() != 200 {
        return Err(format!("GET answered {status}"));
    }
    *tally.lock().unwrap_or_else(|e| e.into_inner()).fetched.entry(token.to_owned()).or_default() += 1;
    let (status, body) =
        conn.request(Method::DELETE, &format!("/cloudprnt?mac={mac}&code=200%20OK&token={tok}"), &p.auth, None).await?;
    if !status.is_success() {
        return Err(format!("DELETE answered {status}: {}", snippet(&body, 200)));
    }
    tally.lock().unwrap_or_else(|e| e.into_inner()).printed += 1;
    Ok(())
}

fn pct(s: &str) -> String {
    crate::http::pct_encode(s)
}
