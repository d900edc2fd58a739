//! Request ids and the access log: every request runs inside a `request` span carrying
//! its id (the caller's `X-Request-Id` when it sent a usable one, else a new one), its
//! method and path, and the task id where there is one, so every log line written while
//! serving it (with `--log-format json`, one JSON object per line) names the request. The
//! id is returned in the `X-Request-Id` header, so a caller can quote it in a report.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

use axum::extract::Request;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument as _;

pub const HEADER: &str = "x-request-id";

/// A caller's id is kept when it is 1–128 visible ASCII characters; anything else (empty,
/// too long, control characters that could forge log lines) is replaced.
fn usable(v: &HeaderValue) -> Option<&str> {
    let s = v.to_str().ok()?;
    (!s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_graphic())).then_some(s)
}

/// A new id: a random prefix per process and a counter, unique across restarts and
/// nodes without a system call per request.
fn new_id() -> String {
    static PREFIX: OnceLock<String> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let prefix = PREFIX.get_or_init(|| onceprint_engine::secrets::short_id("req_"));
    format!("{prefix}-{:x}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// The task id in a path of the task API (`/v1/print-tasks/{task_id}/…`).
fn task_in_path(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/v1/print-tasks/")?;
    let id = rest.split('/').next()?;
    (!id.is_empty()).then_some(id)
}

/// Paths polled by machines every few seconds: their access lines are debug, not info.
fn is_noise(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz" | "/metrics" | "/v1/agent/poll" | "/cloudprnt" | "/epson-sdp")
}

/// The middleware: span, access log line, `X-Request-Id` on the answer.
pub async fn tag(req: Request, next: Next) -> Response {
    let id = req.headers().get(HEADER).and_then(usable).map_or_else(new_id, str::to_owned);
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    let span = tracing::info_span!(
        "request",
        request_id = %id,
        method = %method,
        path = %path,
        task_id = tracing::field::Empty,
    );
    if let Some(task) = task_in_path(&path) {
        span.record("task_id", task);
    }
    let started = Instant::now();
    let mut res = next.run(req).instrument(span.clone()).await;
    let status = res.status().as_u16();
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    span.in_scope(|| {
        if is_noise(&path) && status < 400 {
            tracing::debug!(status, ms, "answered");
        } else {
            tracing::info!(status, ms, "answered");
        }
    });
    if let Ok(v) = HeaderValue::from_str(&id) {
        res.headers_mut().insert(HEADER, v);
    }
    res
}

/// Names the task a request is about, for requests whose path does not (a submission).
pub fn record_task(task_id: &str) {
    tracing::Span::current().record("task_id", task_id);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_from_callers_are_kept_only_when_harmless() {
        assert_eq!(usable(&HeaderValue::from_static("pos-42/retry-3")), Some("pos-42/retry-3"));
        assert_eq!(usable(&HeaderValue::from_static("")), None);
        assert_eq!(usable(&HeaderValue::from_static("a b")), None, "spaces could fake log fields");
        assert_eq!(usable(&HeaderValue::from_str(&"x".repeat(129)).expect("header")), None);
    }

    #[test]
    fn new_ids_differ() {
        assert_ne!(new_id(), new_id());
    }

    #[test]
    fn task_ids_come_from_task_paths() {
        assert_eq!(task_in_path("/v1/print-tasks/01ABC/events"), Some("01ABC"));
        assert_eq!(task_in_path("/v1/print-tasks/01ABC"), Some("01ABC"));
        assert_eq!(task_in_path("/v1/print-tasks"), None);
        assert_eq!(task_in_path("/v1/printers/p1"), None);
    }
}
