//! The measured part: `concurrency` connections submitting the plan as fast as the broker
//! answers, one submission per `POST /v1/print-tasks`, or (`--batch K`) K consecutive
//! submissions per `POST /v1/print-task-batches`, each result mapped back to its own
//! submission so that verification does not care which.

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
    /// Submissions per HTTP request (1: each alone to `POST /v1/print-tasks`).
    pub batch: usize,
    /// HTTP requests sent: one per submission, or one per batch of up to `batch`.
    pub requests_http: usize,
    /// The answer time of every HTTP request that got an answer, in µs (any order).
    pub request_latencies_us: Vec<u64>,
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

/// The most submissions one `POST /v1/print-task-batches` takes.
pub const MAX_BATCH: usize = 500;

/// The path of one submission, and of a batch of them.
const SUBMIT_PATH: &str = "/v1/print-tasks";
const BATCH_PATH: &str = "/v1/print-task-batches";

/// Refuses a batch size the broker would refuse (`--batch`, 1 = one task per request).
pub fn validate_batch(batch: usize) -> Result<(), BenchError> {
    if (1..=MAX_BATCH).contains(&batch) {
        Ok(())
    } else {
        Err(BenchError::InvalidOptions(format!(
            "batch must be 1–{MAX_BATCH} (submissions per POST /v1/print-task-batches; 1 sends each alone to POST /v1/print-tasks), not {batch}"
        )))
    }
}

/// The bodies of `POST /v1/print-task-batches` for `bodies` taken `batch` at a time, in
/// order (the last one may be shorter): `{"tasks":[b1,b2,…]}`, the planned bytes as they
/// are.
pub fn batch_bodies(bodies: &[Bytes], batch: usize) -> Vec<Bytes> {
    bodies
        .chunks(batch.max(1))
        .map(|chunk| {
            let mut v = Vec::with_capacity(chunk.iter().map(Bytes::len).sum::<usize>() + chunk.len() + 12);
            v.extend_from_slice(br#"{"tasks":["#);
            for (k, body) in chunk.iter().enumerate() {
                if k > 0 {
                    v.push(b',');
                }
                v.extend_from_slice(body);
            }
            v.extend_from_slice(b"]}");
            Bytes::from(v)
        })
        .collect()
}

/// A batch answer: one result per task of the request, in order.
#[derive(Deserialize)]
struct BatchAnswer {
    results: Vec<BatchResult>,
}

/// One result of a batch answer: what `POST /v1/print-tasks` would have answered for that
/// task alone, its status with the task or the error.
#[derive(Deserialize)]
struct BatchResult {
    status: u16,
    task: Option<TaskAnswer>,
    error: Option<serde_json::Value>,
    retry_after_secs: Option<serde_json::Value>,
}

/// The [`Outcome`]s of the `items` submissions of one batch request sent at `start_us`
/// and finished at `end_us`, each with the request's times: the status, task id and
/// duplicate flag of its result, the error as its detail. When the request as a whole got
/// no answer every item has status 0; when it was refused (anything but 200) every item
/// has that status; when its answer is not one result per item every item has status 200
/// without a task id (verification calls that malformed), with the reason as detail.
pub fn outcomes_of_batch(
    result: Result<(StatusCode, Bytes), String>,
    items: usize,
    start_us: u64,
    end_us: u64,
) -> Vec<Outcome> {
    let base = Outcome { start_us, end_us, ..Outcome::default() };
    let all = |status: u16, detail: String| vec![Outcome { status, detail: Some(detail), ..base.clone() }; items];
    let (status, body) = match result {
        Err(detail) => return all(0, detail),
        Ok(answer) => answer,
    };
    if status != StatusCode::OK {
        let hint = if matches!(status.as_u16(), 404 | 405) {
            "(does this broker have POST /v1/print-task-batches?) "
        } else {
            ""
        };
        return all(status.as_u16(), format!("batch request answered {status}: {hint}{}", snippet(&body, 300)));
    }
    let answer = match serde_json::from_slice::<BatchAnswer>(&body) {
        Ok(a) if a.results.len() == items => a,
        Ok(a) => {
            return all(
                200,
                format!("the batch answer has {} results for {items} tasks: {}", a.results.len(), snippet(&body, 200)),
            )
        }
        Err(e) => return all(200, format!("unparsable batch answer ({e}): {}", snippet(&body, 200))),
    };
    answer
        .results
        .into_iter()
        .map(|r| {
            let mut o = Outcome { status: r.status, ..base.clone() };
            if (200..300).contains(&r.status) {
                match r.task {
                    Some(task) => {
                        o.task_id = task.task_id.map(String::into_boxed_str);
                        o.duplicate = task.duplicate;
                    }
                    None => o.detail = Some(format!("result with status {} but no task", r.status)),
                }
            } else {
                let mut detail =
                    r.error.map_or_else(|| "result without an error object".to_string(), |e| e.to_string());
                if let Some(after) = r.retry_after_secs {
                    detail.push_str(&format!(" (retry_after_secs {after})"));
                }
                o.detail = Some(snippet(detail.as_bytes(), 300));
            }
            o
        })
        .collect()
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
    run_load_batched(addr, auth, bodies, concurrency, 1).await
}

/// [`run_load`] with `batch` submissions per HTTP request: with 1 each body is one
/// `POST /v1/print-tasks`; with more, `batch` consecutive bodies go together in one
/// `POST /v1/print-task-batches` (built before the clock starts), a worker takes the next
/// `batch` indices at a time, and each result is mapped back to its submission's
/// [`Outcome`] (with the request's send and answer times).
pub async fn run_load_batched(
    addr: SocketAddr,
    auth: HeaderValue,
    bodies: Arc<Vec<Bytes>>,
    concurrency: usize,
    batch: usize,
) -> Result<LoadResult, BenchError> {
    validate_batch(batch)?;
    let items = bodies.len();
    let work = if batch == 1 {
        Arc::new(Work { path: SUBMIT_PATH, requests: bodies, batch, items })
    } else {
        Arc::new(Work { path: BATCH_PATH, requests: Arc::new(batch_bodies(&bodies, batch)), batch, items })
    };
    let next = Arc::new(AtomicUsize::new(0));
    let workers = concurrency.clamp(1, work.requests.len().max(1));
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
        handles.push(tokio::spawn(worker(addr, conn, auth.clone(), work.clone(), next.clone(), t0)));
    }
    let mut outcomes: Vec<Outcome> = vec![Outcome::default(); items];
    let mut request_latencies_us = Vec::with_capacity(work.requests.len());
    let mut first_error = None;
    for handle in handles {
        match handle.await {
            Ok(Ok((done, latencies))) => {
                for (i, outcome) in done {
                    outcomes[i] = outcome;
                }
                request_latencies_us.extend(latencies);
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
        None => Ok(LoadResult {
            outcomes,
            wall,
            started_unix_us,
            batch,
            requests_http: work.requests.len(),
            request_latencies_us,
        }),
    }
}

/// What the workers send: HTTP request `j` carries the submissions
/// `j * batch .. min((j + 1) * batch, items)`.
struct Work {
    path: &'static str,
    /// The HTTP bodies: the submissions themselves when `batch` is 1.
    requests: Arc<Vec<Bytes>>,
    batch: usize,
    /// Submissions in all.
    items: usize,
}

/// One connection's share: the outcomes by submission index, and the answer time of each
/// HTTP request that got an answer.
type WorkerDone = (Vec<(usize, Outcome)>, Vec<u64>);

async fn worker(
    addr: SocketAddr,
    mut conn: Conn,
    auth: HeaderValue,
    work: Arc<Work>,
    next: Arc<AtomicUsize>,
    t0: Instant,
) -> Result<WorkerDone, BenchError> {
    let mut done = Vec::with_capacity(work.items / 16 + 1);
    let mut latencies = Vec::with_capacity(work.requests.len() / 16 + 1);
    loop {
        let j = next.fetch_add(1, Ordering::Relaxed);
        if j >= work.requests.len() {
            return Ok((done, latencies));
        }
        let start = t0.elapsed();
        let result = conn.request(Method::POST, work.path, &auth, Some(work.requests[j].clone())).await;
        let end = t0.elapsed();
        let lost = result.is_err();
        let (start_us, end_us) = (start.as_micros() as u64, end.as_micros() as u64);
        if !lost {
            latencies.push(end_us.saturating_sub(start_us));
        }
        let first = j * work.batch;
        if work.batch == 1 {
            done.push((first, outcome_of(result, start_us, end_us)));
        } else {
            let items = work.batch.min(work.items - first);
            done.extend(
                outcomes_of_batch(result, items, start_us, end_us).into_iter().enumerate().map(|(k, o)| (first + k, o)),
            );
        }
        if lost {
            // The connection is in an unknown state: record the loss and start afresh.
            // If even that fails the broker is gone and the run cannot go on.
            conn = Conn::connect(addr)
                .await
                .map_err(|detail| BenchError::Http { context: "reconnecting after a lost request".into(), detail })?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_size_must_be_what_the_broker_takes() {
        assert!(validate_batch(1).is_ok());
        assert!(validate_batch(MAX_BATCH).is_ok());
        for bad in [0, MAX_BATCH + 1] {
            let e = validate_batch(bad).unwrap_err().to_string();
            assert!(e.contains("batch must be 1–500"), "{e}");
        }
    }

    #[test]
    fn batch_bodies_concatenate_the_planned_bytes_in_order() {
        let bodies: Vec<Bytes> = (0..5u32).map(|n| crate::plan::body_for("B", n, 3)).collect();
        let batches = batch_bodies(&bodies, 2);
        assert_eq!(batches.len(), 3);
        for (j, b) in batches.iter().enumerate() {
            let v: serde_json::Value = serde_json::from_slice(b).unwrap();
            let tasks = v["tasks"].as_array().unwrap();
            assert_eq!(tasks.len(), if j < 2 { 2 } else { 1 });
            for (k, t) in tasks.iter().enumerate() {
                let original: serde_json::Value = serde_json::from_slice(&bodies[j * 2 + k]).unwrap();
                assert_eq!(*t, original);
            }
        }
        assert_eq!(&batches[2][..], format!(r#"{{"tasks":[{}]}}"#, String::from_utf8_lossy(&bodies[4])).as_bytes());
    }

    #[test]
    fn batch_results_map_back_to_their_submissions() {
        let body = Bytes::from_static(
            br#"{"results":[
                {"status":201,"task":{"task_id":"T1","state":"pending","duplicate":false,"message":"m","biz_no":"B1","print_type":"receipt"}},
                {"status":200,"task":{"task_id":"T1","state":"pending","duplicate":true,"message":"m","biz_no":"B1","print_type":"receipt"}},
                {"status":422,"error":{"code":"idempotency_mismatch","message":"different content"}},
                {"status":429,"error":{"code":"too_many_requests","message":"slow down"},"retry_after_secs":2}
            ]}"#,
        );
        let o = outcomes_of_batch(Ok((StatusCode::OK, body)), 4, 10, 30);
        assert_eq!(o.iter().map(|o| o.status).collect::<Vec<_>>(), [201, 200, 422, 429]);
        assert!(o.iter().all(|o| (o.start_us, o.end_us) == (10, 30)));
        assert_eq!((o[0].task_id.as_deref(), o[0].duplicate, o[0].detail.as_deref()), (Some("T1"), Some(false), None));
        assert_eq!((o[1].task_id.as_deref(), o[1].duplicate), (Some("T1"), Some(true)));
        assert!(o[2].task_id.is_none() && o[2].detail.as_deref().unwrap().contains("idempotency_mismatch"));
        assert!(o[3].detail.as_deref().unwrap().contains("retry_after_secs 2"), "{:?}", o[3].detail);
    }

    #[test]
    fn a_batch_without_its_results_fails_every_submission() {
        let lost = outcomes_of_batch(Err("gone".into()), 3, 0, 5);
        assert!(lost.iter().all(|o| o.status == 0 && o.detail.as_deref() == Some("gone")));
        let refused = outcomes_of_batch(
            Ok((StatusCode::BAD_REQUEST, Bytes::from_static(br#"{"error":{"code":"invalid_request"}}"#))),
            2,
            0,
            5,
        );
        assert!(refused.iter().all(|o| o.status == 400 && o.detail.as_deref().unwrap().contains("invalid_request")));
        let missing = outcomes_of_batch(Ok((StatusCode::NOT_FOUND, Bytes::new())), 1, 0, 5);
        assert!(missing[0].detail.as_deref().unwrap().contains("print-task-batches"));
        let short = outcomes_of_batch(Ok((StatusCode::OK, Bytes::from_static(br#"{"results":[]}"#))), 2, 0, 5);
        assert!(short.iter().all(|o| o.status == 200 && o.task_id.is_none()));
        assert!(short[0].detail.as_deref().unwrap().contains("0 results for 2 tasks"));
        let junk = outcomes_of_batch(Ok((StatusCode::OK, Bytes::from_static(b"nope"))), 2, 0, 5);
        assert!(junk.iter().all(|o| o.status == 200 && o.task_id.is_none()));
    }
}
