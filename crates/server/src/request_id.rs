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
use axum::response::Response;

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

/// A request's id, span and start, taken as it comes in (before any handler runs);
/// [`Tag::finish`] writes its access line and puts the id on the answer.
pub(crate) struct Tag {
    header: Option<HeaderValue>,
    noise: bool,
    span: tracing::Span,
    started: Instant,
}

impl Tag {
    pub(crate) fn begin(req: &Request) -> Tag {
        let id = req.headers().get(HEADER).and_then(usable).map_or_else(new_id, str::to_owned);
        let path = req.uri().path();
        let span = tracing::info_span!(
            "request",
            request_id = %id,
            method = %req.method(),
            path = %path,
            task_id = tracing::field::Empty,
        );
        if let Some(task) = task_in_path(path) {
            span.record("task_id", task);
        }
        // The answer's header is a copy: a value sliced from the request's headers would
        // keep the connection's whole read buffer from being reused while the request
        // waits (a long poll waits for up to its `wait_ms`).
        Tag { header: HeaderValue::from_str(&id).ok(), noise: is_noise(path), span, started: Instant::now() }
    }

    /// The span every log line written while serving the request belongs to.
    pub(crate) fn span(&self) -> &tracing::Span {
        &self.span
    }

    /// The access line (debug for machines' routine polls that went well) and the
    /// `X-Request-Id` header.
    pub(crate) fn finish(self, res: &mut Response) {
        let status = res.status().as_u16();
        let ms = self.started.elapsed().as_secs_f64() * 1000.0;
        self.span.in_scope(|| {
            if self.noise && status < 400 {
                tracing::debug!(status, ms, "answered");
            } else {
                tracing::info!(status, ms, "answered");
            }
        });
        if let Some(v) = self.header {
            res.headers_mut().insert(HEADER, v);
        }
    }
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
