//! The one place where failures become HTTP answers with the error body of docs/API.md, "Errors":
//! `{"error": {"code": "snake_case_code", "message": "…"}}`.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use onceprint_core::CoreError;
use onceprint_engine::transport::cloudprnt::CloudPrntError;
use onceprint_engine::transport::epson_sdp::EpsonSdpError;
use onceprint_engine::tz::ZoneError;
use onceprint_engine::{IntakeError, SetupError};
use onceprint_store::StoreError;
use serde::Serialize;
use utoipa::ToSchema;

/// An HTTP error answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status} {code}: {message}")]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// Seconds to send as `Retry-After` (429 answers).
    pub retry_after: Option<u64>,
}

/// The JSON error body.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable, snake_case: `unauthorized`, `not_found`, `missing_biz_no`, `invalid_request`,
    /// `idempotency_mismatch`, `invalid_transition`, `payload_too_large`, `invalid_content`, `conflict`,
    /// `printer_disabled`, `last_api_key`, `agent_superseded`, `method_not_allowed`,
    /// `unsupported_media_type`, `unavailable`, `internal`, `forbidden` (403),
    /// `too_many_requests` (429, with `Retry-After`), `csrf` (403),
    /// `agent_protocol_unsupported` (426, the agent protocol version is outside the range
    /// the broker names in `Onceprint-Agent-Protocols`).
    pub code: String,
    /// For people: what was wrong and, where possible, how to fix it.
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, code, message: message.into(), retry_after: None }
    }
    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }
    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }
    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }
    pub fn conflict(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::CONFLICT, "conflict", message)
    }
    pub fn forbidden(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, "forbidden", message)
    }
    /// 429 `too_many_requests` with `Retry-After: seconds`.
    pub fn rate_limited(seconds: u64, message: impl Into<String>) -> ApiError {
        ApiError {
            retry_after: Some(seconds),
            ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, "too_many_requests", message)
        }
    }
    pub fn too_large(limit: usize) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            onceprint_core::content::body_too_large_message(limit),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody { error: ErrorDetail { code: self.code.to_owned(), message: self.message } };
        if self.status == StatusCode::PAYLOAD_TOO_LARGE {
            // The rest of an oversized body is never read, so the connection cannot carry another
            // request and the server closes it. Saying so in the answer keeps clients from reusing
            // it for their next request, which would then fail half-way ("incomplete message").
            return (self.status, [(header::CONNECTION, "close")], Json(body)).into_response();
        }
        if let Some(seconds) = self.retry_after {
            return (self.status, [(header::RETRY_AFTER, seconds.to_string())], Json(body)).into_response();
        }
        (self.status, Json(body)).into_response()
    }
}

impl From<CoreError> for ApiError {
    fn from(e: CoreError) -> Self {
        match e {
            CoreError::MissingBizNo => ApiError::new(
                StatusCode::BAD_REQUEST,
                "missing_biz_no",
                "biz_no is required: send the order or serial number that identifies this print (e.g. \"A1001#kitchen\")",
            ),
            CoreError::Invalid { .. } => ApiError::invalid(e.to_string()),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::AlreadyExists(what) => ApiError::conflict(format!("{what} already exists")),
            // A reference to an object that does not exist (a `store_id`, a printer of a
            // station) answers like a path naming one: the request is well formed, the
            // object is not there.
            StoreError::NotFound(what) => ApiError::not_found(format!("{what} does not exist")),
            StoreError::Unavailable(m) => {
                tracing::error!(error = %m, "database unavailable");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "the database is unavailable; retry later",
                )
            }
            StoreError::Backend(m) => {
                tracing::error!(error = %m, "database error");
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "internal error; see the broker log")
            }
        }
    }
}

impl From<onceprint_engine::DeliveryError> for ApiError {
    fn from(e: onceprint_engine::DeliveryError) -> Self {
        match e {
            onceprint_engine::DeliveryError::Store(s) => s.into(),
        }
    }
}

impl From<onceprint_engine::PollError> for ApiError {
    fn from(e: onceprint_engine::PollError) -> Self {
        match e {
            onceprint_engine::PollError::Store(s) => s.into(),
            onceprint_engine::PollError::Superseded(s) => {
                ApiError::new(StatusCode::CONFLICT, "agent_superseded", s.to_string())
            }
        }
    }
}

impl From<IntakeError> for ApiError {
    fn from(e: IntakeError) -> Self {
        match e {
            IntakeError::Invalid(c) => c.into(),
            IntakeError::UnknownTarget(m) => ApiError::not_found(m),
            IntakeError::InvalidContent(m) => ApiError::new(StatusCode::BAD_REQUEST, "invalid_content", m),
            IntakeError::PrinterDisabled(m) => ApiError::new(StatusCode::CONFLICT, "printer_disabled", m),
            IntakeError::Mismatch { task_id } => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency_mismatch",
                format!(
                    "task {task_id} already exists for this biz_no, target and print_type with different content; \
                     use a new biz_no for different content"
                ),
            ),
            IntakeError::RateLimited { retry_after_secs } => ApiError::rate_limited(
                retry_after_secs,
                "too many requests for this tenant: over its rate limit. Retries of tasks already \
                 accepted are still answered; new work may be sent again after Retry-After",
            ),
            IntakeError::Store(s) => s.into(),
        }
    }
}

impl From<onceprint_engine::device_log::DigestError> for ApiError {
    fn from(e: onceprint_engine::device_log::DigestError) -> Self {
        use onceprint_engine::device_log::DigestError;
        match e {
            DigestError::Invalid(c) => c.into(),
            DigestError::Store(s) => s.into(),
        }
    }
}

impl From<ZoneError> for ApiError {
    /// A `timezone` the broker does not know. The message names the field and gives
    /// examples of what is accepted.
    fn from(e: ZoneError) -> Self {
        ApiError::invalid(e.to_string())
    }
}

impl From<SetupError> for ApiError {
    fn from(e: SetupError) -> Self {
        match e {
            SetupError::Invalid(c) => c.into(),
            SetupError::Zone(z) => z.into(),
            SetupError::NotFound(m) => ApiError::not_found(m),
            SetupError::LastApiKey(_) => ApiError::new(StatusCode::CONFLICT, "last_api_key", e.to_string()),
            SetupError::Conflict(m) => ApiError::conflict(m),
            SetupError::Store(s) => s.into(),
        }
    }
}

impl From<CloudPrntError> for ApiError {
    fn from(e: CloudPrntError) -> Self {
        match e {
            CloudPrntError::Unauthorized(m) => ApiError::unauthorized(m),
            CloudPrntError::NoSuchJob(m) => ApiError::not_found(m),
            CloudPrntError::UnsupportedMedia(m) => {
                ApiError::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type", m)
            }
            CloudPrntError::Invalid(m) => ApiError::invalid(m),
            CloudPrntError::Delivery(d) => d.into(),
        }
    }
}

impl From<onceprint_engine::OperatorError> for ApiError {
    fn from(e: onceprint_engine::OperatorError) -> Self {
        use onceprint_engine::OperatorError;
        match e {
            OperatorError::Invalid(c) => c.into(),
            OperatorError::BadLogin => ApiError::unauthorized(e.to_string()),
            OperatorError::Throttled { retry_after_s } => ApiError {
                retry_after: Some(retry_after_s),
                ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, "too_many_requests", e.to_string())
            },
            OperatorError::Forbidden(m) => ApiError::forbidden(m),
            OperatorError::Disabled(_) => ApiError::forbidden(e.to_string()),
            OperatorError::NotFound(m) => ApiError::not_found(m),
            OperatorError::Store(s) => s.into(),
        }
    }
}

impl From<EpsonSdpError> for ApiError {
    fn from(e: EpsonSdpError) -> Self {
        match e {
            EpsonSdpError::Unauthorized(m) => ApiError::unauthorized(m),
            EpsonSdpError::Invalid(m) => ApiError::invalid(m),
            EpsonSdpError::Delivery(d) => d.into(),
        }
    }
}

/// An error answer to a printer that logs in itself: the same body, and on a 401 the
/// challenges, since embedded HTTP clients often send their credentials only after being
/// challenged. Every printer route challenges for Basic; routes of printers that may sign
/// in with HTTP Digest (Epson Server Direct Print) offer Digest first (`crate::digest`).
#[derive(Debug)]
pub struct PrinterError {
    pub error: ApiError,
    challenge: Challenge,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Challenge {
    Basic,
    /// Digest (SHA-256, then MD5) and Basic; `stale`: the answer was right, its nonce not.
    Digest {
        stale: bool,
    },
}

impl PrinterError {
    /// The same error, challenging for Digest too.
    pub fn offering_digest(self) -> PrinterError {
        match self.challenge {
            Challenge::Basic => PrinterError { challenge: Challenge::Digest { stale: false }, ..self },
            Challenge::Digest { .. } => self,
        }
    }

    /// A refused Digest answer; `stale` as RFC 7616 §3.3 means it.
    pub fn digest(error: ApiError, stale: bool) -> PrinterError {
        PrinterError { error, challenge: Challenge::Digest { stale } }
    }
}

impl<E: Into<ApiError>> From<E> for PrinterError {
    fn from(e: E) -> Self {
        PrinterError { error: e.into(), challenge: Challenge::Basic }
    }
}

/// The Basic challenge of every printer route.
const BASIC_CHALLENGE: &str = "Basic realm=\"onceprint printers\", charset=\"UTF-8\"";

impl IntoResponse for PrinterError {
    fn into_response(self) -> Response {
        let challenge = (self.error.status == StatusCode::UNAUTHORIZED).then_some(self.challenge);
        let mut res = self.error.into_response();
        let headers = res.headers_mut();
        if let Some(Challenge::Digest { stale }) = challenge {
            // Most preferred first (RFC 7616 §3.7); Basic last for the printers that only
            // know Basic.
            for value in crate::digest::challenges(stale) {
                headers.append(header::WWW_AUTHENTICATE, value);
            }
        }
        if challenge.is_some() {
            headers.append(header::WWW_AUTHENTICATE, header::HeaderValue::from_static(BASIC_CHALLENGE));
        }
        res
    }
}

impl From<onceprint_engine::ActionError> for ApiError {
    fn from(e: onceprint_engine::ActionError) -> Self {
        use onceprint_engine::ActionError;
        match e {
            ActionError::NotFound(_) | ActionError::UnknownPrinter(_) => ApiError::not_found(e.to_string()),
            ActionError::NotAllowed(n) => ApiError::new(StatusCode::CONFLICT, "invalid_transition", n.to_string()),
            ActionError::SamePrinter(m) => ApiError::new(StatusCode::CONFLICT, "invalid_transition", m),
            ActionError::Raced(_) => ApiError::new(StatusCode::CONFLICT, "invalid_transition", e.to_string()),
            ActionError::PrinterDisabled(m) => ApiError::new(StatusCode::CONFLICT, "printer_disabled", m),
            ActionError::Invalid(c) => c.into(),
            ActionError::Store(s) => s.into(),
        }
    }
}
