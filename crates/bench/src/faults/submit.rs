//! The order systems of a fault run: `concurrency` keep-alive connections sending the
//! planned submissions at their planned moments, each retried — as a POS retries — until
//! it gets an answer that is not "try again".
//!
//! A request that got no answer (the connection was refused or reset while the broker was
//! down) or a 5xx / 429 answer is sent again, byte for byte, after a short backoff, on a
//! fresh connection; 201, 200 and every other 4xx are final. Each failed attempt is
//! recorded, so the verdict can tell the retries the bench's own kills explain from those
//! it does not.
//!
//! `bench offline` sends through the same workers twice over, once to the broker and once
//! to the store agent's LAN listener (whose answers may carry [`OFFLINE_HEADER`]).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::header::HeaderValue;
use hyper::Method;

use super::schedule::Submissions;
use crate::http::Conn;
use crate::load::{outcome_of, Outcome};

/// The header of a store agent's answer for a task it accepted while the broker was
/// unreachable (README, "When the internet is down"); a broker never sends it.
pub const OFFLINE_HEADER: &str = "x-onceprint-offline";

/// Retry backoff: 50 ms doubling to 1 s.
const RETRY_FIRST: Duration = Duration::from_millis(50);
const RETRY_CAP: Duration = Duration::from_secs(1);

/// One attempt that did not end its submission.
#[derive(Debug, Clone)]
pub struct FailedAttempt {
    /// Index into the plan's requests.
    pub request: usize,
    /// µs after the fault phase began.
    pub start_us: u64,
    pub end_us: u64,
    /// HTTP status, 0 when no answer arrived (or no connection could be opened).
    pub status: u16,
    pub detail: String,
}

/// All submissions of a run, answered.
#[derive(Debug, Clone, Default)]
pub struct SubmitRun {
    /// Per planned request, its final attempt (status 0 if the deadline came first).
    pub outcomes: Vec<Outcome>,
    /// Per planned request, the attempts it took.
    pub attempts: Vec<u32>,
    pub failed_attempts: Vec<FailedAttempt>,
    /// When the last answer came, µs after the fault phase began.
    pub last_answer_us: u64,
}

impl SubmitRun {
    /// Keys one of whose attempts was sent and got no answer: the broker may have created
    /// their task and only the 201 was lost.
    pub fn keys_with_lost_answers(&self, subs: &Submissions) -> HashSet<u32> {
        self.failed_attempts
            .iter()
            .filter(|a| a.status == 0)
            .filter_map(|a| subs.plan.requests.get(a.request).map(|r| r.key))
            .collect()
    }

    pub fn total_attempts(&self) -> u64 {
        self.attempts.iter().map(|&a| u64::from(a)).sum()
    }
}

/// Sends every planned request at its moment (relative to `t0`), `concurrency` at a time,
/// retrying each until it is answered or `deadline` passes.
///
/// Workers take the next request from a shared counter in sending order and wait for its
/// moment; one stuck retrying while the broker is down holds only its own connection, and
/// the others go on with theirs (into the same outage), so everything sent during an
/// outage is retried when the broker is back — the retry storm of a real shop.
pub async fn submit_all(
    addr: SocketAddr,
    auth: HeaderValue,
    subs: Arc<Submissions>,
    concurrency: usize,
    t0: Instant,
    deadline: Instant,
) -> SubmitRun {
    let n = subs.plan.requests.len();
    let next = Arc::new(AtomicUsize::new(0));
    let mut handles = Vec::with_capacity(concurrency);
    for _ in 0..concurrency.clamp(1, n.max(1)) {
        let (auth, subs, next) = (auth.clone(), subs.clone(), next.clone());
        handles.push(tokio::spawn(async move { worker(addr, auth, subs, next, t0, deadline).await }));
    }
    let mut run = SubmitRun { outcomes: vec![Outcome::default(); n], attempts: vec![0; n], ..SubmitRun::default() };
    for handle in handles {
        // A worker only ends by returning; a panic in one would be a bench bug, and its
        // requests then stay at status 0 with this note, which the verdict reports.
        match handle.await {
            Ok(done) => {
                for (i, outcome, attempts, failed) in done {
                    run.last_answer_us = run.last_answer_us.max(outcome.end_us);
                    run.outcomes[i] = outcome;
                    run.attempts[i] = attempts;
                    run.failed_attempts.extend(failed);
                }
            }
            Err(e) => run.failed_attempts.push(FailedAttempt {
                request: usize::MAX,
                start_us: 0,
                end_us: 0,
                status: 0,
                detail: format!("a submit worker died: {e}"),
            }),
        }
    }
    run.failed_attempts.sort_by_key(|a| (a.start_us, a.request));
    run
}

/// One `POST /v1/print-tasks` with the answer's headers, within [`crate::http::REQUEST_TIMEOUT`].
async fn send(
    conn: &mut Conn,
    auth: &HeaderValue,
    body: hyper::body::Bytes,
) -> Result<(hyper::StatusCode, hyper::HeaderMap, hyper::body::Bytes), String> {
    conn.request_with_headers(Method::POST, "/v1/print-tasks", auth, Some(body), crate::http::REQUEST_TIMEOUT).await
}

type Done = Vec<(usize, Outcome, u32, Vec<FailedAttempt>)>;

async fn worker(
    addr: SocketAddr,
    auth: HeaderValue,
    subs: Arc<Submissions>,
    next: Arc<AtomicUsize>,
    t0: Instant,
    deadline: Instant,
) -> Done {
    let mut done = Vec::new();
    let mut conn: Option<Conn> = None;
    let us = |at: Instant| at.saturating_duration_since(t0).as_micros() as u64;
    loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        let Some(req) = subs.plan.requests.get(i) else { return done };
        let send_at = t0 + Duration::from_millis(subs.send_at_ms[i]);
        tokio::time::sleep_until(send_at.into()).await;
        let mut failed = Vec::new();
        let mut delay = RETRY_FIRST;
        let mut attempts = 0u32;
        let outcome = loop {
            attempts += 1;
            let start = Instant::now();
            let result = match conn.as_mut() {
                Some(c) => send(c, &auth, req.body.clone()).await,
                None => match Conn::connect(addr).await {
                    Ok(c) => send(conn.insert(c), &auth, req.body.clone()).await,
                    Err(e) => Err(e),
                },
            };
            let offline = result.as_ref().is_ok_and(|(_, headers, _)| headers.contains_key(OFFLINE_HEADER));
            let mut outcome = outcome_of(result.map(|(status, _, body)| (status, body)), us(start), us(Instant::now()));
            outcome.offline = offline;
            let retry = outcome.status == 0 || outcome.status == 429 || outcome.status >= 500;
            if !retry {
                break outcome;
            }
            if outcome.status == 0 {
                // No answer: the connection is in an unknown state, or there was none.
                conn = None;
            }
            failed.push(FailedAttempt {
                request: i,
                start_us: outcome.start_us,
                end_us: outcome.end_us,
                status: outcome.status,
                detail: outcome.detail.clone().unwrap_or_default(),
            });
            if Instant::now() + delay >= deadline {
                let mut gave_up = outcome;
                gave_up.status = 0;
                gave_up.detail = Some(format!(
                    "no final answer before the deadline after {attempts} attempts (last: {})",
                    gave_up.detail.as_deref().unwrap_or("")
                ));
                break gave_up;
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(RETRY_CAP);
        };
        done.push((i, outcome, attempts, failed));
    }
}
