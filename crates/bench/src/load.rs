//! The measured part: `concurrency` connections submitting the plan as fast as the broker
//! answers.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::body::Bytes;
use hyper::header::HeaderValue;
use hyper::{Method, StatusCode};
use serde::Deserialize;

use crate::http::{snippet, Conn};
use crate::BenchError;

/// What happened to one request.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// HTTP status, or 0 when no answer arrived (connection error or timeout).
    pub status: u16,
    /// Send and answer times in µs since the run started; they let verification tell
    /// a repeat that raced its original from one sent after the original was answered.
    pub start_us: u64,
    pub end_us: u64,
    pub task_id: Option<Box<str>>,
    pub duplicate: Option<bool>,
    /// The answer carried `X-Onceprint-Offline` (the store agent accepted the task itself
    /// while the broker was unreachable); only `bench offline` sends where it can.
    pub offline: bool,
    /// For anything but a parsed 2xx answer: the start of the body or the error.
    pub detail: Option<String>,
}

impl Outcome {
    pub fn latency_us(&self) -> u64 {
        self.end_us.saturating_sub(self.start_us)
    }
}

pub struct LoadResult {
    /// Indexed like the plan.
    pub outcomes: Vec<Outcome>,
    pub wall: Duration,
    /// When the first request was sent, in µs since the Unix epoch: outcome times are
    /// relative to it, and `bench e2e` compares them with the paper log's times.
    pub started_unix_us: i64,
}

/// The fields of a submission answer the bench checks; the rest is ignored.
#[derive(Deserialize)]
struct TaskAnswer {
    task_id: Option<String>,
    duplicate: Option<bool>,
}

/// The [`Outcome`] of one submission sent at `start_us` and finished at `end_us`: the
/// status with the answer's task id and duplicate flag, or status 0 with the error when no
/// answer arrived.
pub fn outcome_of(result: Result<(StatusCode, Bytes), String>, start_us: u64, end_us: u64) -> Outcome {
    let mut outcome = Outcome { start_us, end_us, ..Outcome::default() };
    match result {
        Ok((status, body)) => {
            outcome.status = status.as_u16();
            if status.is_success() {
                match serde_json::from_slice::<TaskAnswer>(&body) {
                    Ok(answer) => {
                        outcome.task_id = answer.task_id.map(String::into_boxed_str);
                        outcome.duplicate = answer.duplicate;
                    }
                    Err(e) => outcome.detail = Some(format!("unparsable answer ({e}): {}", snippet(&body, 200))),
                }
            } else {
                outcome.detail = Some(snippet(&body, 300));
            }
        }
        Err(detail) => outcome.detail = Some(detail),
    }
    outcome
}

/// Sends every body once, `concurrency` at a time, and records each outcome.
///
/// Workers pull the next index from a shared counter instead of owning a fixed slice, so
/// a slow connection never leaves the others idle at the end of the run.
pub async fn run_load(
    addr: SocketAddr,
    auth: HeaderValue,
    bodies: Arc<Vec<Bytes>>,
    concurrency: usize,
) -> Result<LoadResult, BenchError> {
    let next = Arc::new(AtomicUsize::new(0));
    let workers = concurrency.clamp(1, bodies.len().max(1));
    // Connect everyone first so connection set-up is not part of the measured time.
    let mut conns = Vec::with_capacity(workers);
    for _ in 0..workers {
        conns.push(
            Conn::connect(addr)
                .await
                .map_err(|detail| BenchError::Http { context: "opening load connections".into(), detail })?,
        );
    }
    let t0 = Instant::now();
    let started_unix_us = crate::paper::unix_now_us();
    let mut handles = Vec::with_capacity(workers);
    for conn in conns {
        handles.push(tokio::spawn(worker(addr, conn, auth.clone(), bodies.clone(), next.clone(), t0)));
    }
    let mut outcomes: Vec<Outcome> = vec![Outcome::default(); bodies.len()];
    let mut first_error = None;
    for handle in handles {
        match handle.await {
            Ok(Ok(done)) => {
                for (i, outcome) in done {
                    outcomes[i] = outcome;
                }
            }
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(join) => {
                first_error.get_or_insert(BenchError::Http { context: "load worker".into(), detail: join.to_string() });
            }
        }
    }
    let wall = t0.elapsed();
    match first_error {
        Some(e) => Err(e),
        None => Ok(LoadResult { outcomes, wall, started_unix_us }),
    }
}

async fn worker(
    addr: SocketAddr,
    mut conn: Conn,
    auth: HeaderValue,
    bodies: Arc<Vec<Bytes>>,
    next: Arc<AtomicUsize>,
    t0: Instant,
) -> Result<Vec<(usize, Outcome)>, BenchError> {
    let mut done = Vec::with_capacity(bodies.len() / 16 + 1);
    loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= bodies.len() {
            return Ok(done);
        }
        let start = t0.elapsed();
        let result = conn.request(Method::POST, "/v1/print-tasks", &auth, Some(bodies[i].clone())).await;
        let lost = result.is_err();
        done.push((i, outcome_of(result, start.as_micros() as u64, t0.elapsed().as_micros() as u64)));
        if lost {
            // The connection is in an unknown state: record the loss and start afresh.
            // If even that fails the broker is gone and the run cannot go on.
            conn = Conn::connect(addr)
                .await
                .map_err(|detail| BenchError::Http { context: "reconnecting after a lost request".into(), detail })?;
        }
    }
}
