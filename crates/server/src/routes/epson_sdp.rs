//! Epson Server Direct Print at `/epson-sdp`: the printer POSTs form-encoded requests with
//! its login, by HTTP Digest (as Epson's manual describes) or Basic. Handlers parse the form and call
//! `onceprint_engine::transport::epson_sdp`.

use axum::extract::State;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use utoipa::ToSchema;

use crate::error::{ApiError, ErrorBody, PrinterError};
use crate::extract::{Body, PrinterAuth};
use crate::routes::cloudprnt::IDEMPOTENCY_KEY_HEADER;
use crate::AppState;

/// Header of a SetResponse answer: what became of each result, `printjobid=applied`,
/// `…=duplicate`, `…=stale` or `…=unknown`, comma-separated (for logs and tests; the
/// printer ignores it).
pub const RESULTS_HEADER: &str = "x-onceprint-results";

/// A Server Direct Print request (`application/x-www-form-urlencoded`).
#[derive(Debug, Deserialize, ToSchema)]
pub struct EpsonSdpRequest {
    /// `GetRequest` (asks for a job) or `SetResponse` (reports results).
    #[serde(rename = "ConnectionType")]
    pub connection_type: String,
    /// The ID set in the printer's Web Config; must be the printer's `printer_id` when
    /// one is configured.
    #[serde(rename = "ID")]
    pub id: Option<String>,
    /// For `SetResponse`: the `PrintResponseInfo` XML.
    #[serde(rename = "ResponseFile")]
    pub response_file: Option<String>,
}

fn xml(body: String) -> Response {
    let mut res = body.into_response();
    res.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/xml; charset=utf-8"));
    res
}

/// Epson Server Direct Print. `GetRequest` answers a `PrintRequestInfo` document with at
/// most one `ePOSPrint` (the printer's lane: one job at a time), whose
/// `Parameter/printjobid` names the task and attempt and whose `PrintData` is the
/// ePOS-Print XML of the receipt; an empty body when there is nothing to print. A job
/// handed out is fetched at once (it may print from then on): a second GetRequest while
/// it is unconfirmed puts it in doubt. `SetResponse` credits each result of its
/// `ResponseFile` to the job its `printjobid` names, read with Epson's table
/// (docs/RESULT-CODES.md): success printed; codes that can follow printing, and codes
/// Epson does not list, in doubt; `EPTR_REC_EMPTY` / `EPTR_COVER_OPEN` pause the lane (in
/// doubt, unless the printer had stopped before the job went out); data the printer
/// refused fails. A Version 3.00 refusal of the print data fails the job in flight. A
/// late result for an older job id is stale and changes nothing else. A `ResponseFile`
/// that cannot be read is 400, noted on the job in flight. The printer signs in with HTTP
/// Digest (SHA-256 or MD5, `qop=auth`) or Basic. No login, a wrong or expired one (Digest:
/// `stale=true`) or a wrong ID: 401 with the Digest and Basic challenges, nothing changes.
#[utoipa::path(post, path = "/epson-sdp", operation_id = "epson_sdp_request", tag = "printers that poll",
    request_body(content = EpsonSdpRequest, content_type = "application/x-www-form-urlencoded"),
    security(("printer_digest" = []), ("printer" = [])),
    responses((status = 200, description = "PrintRequestInfo XML (GetRequest; empty when there is nothing to print), \
                                             or empty (SetResponse)", content_type = "text/xml",
               headers(("x-onceprint-idempotency-key" = String), ("x-onceprint-results" = String))),
              (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)))]
pub async fn request(
    State(st): State<AppState>,
    PrinterAuth(printer): PrinterAuth<true>,
    Body(body): Body,
) -> Result<Response, PrinterError> {
    // A 401 after sign-in (a wrong ID) challenges as the sign-in does.
    answer(&st, &printer, &body).await.map_err(PrinterError::offering_digest)
}

async fn answer(
    st: &AppState,
    printer: &onceprint_engine::directory::PrinterInfo,
    body: &[u8],
) -> Result<Response, PrinterError> {
    let req: EpsonSdpRequest =
        serde_urlencoded::from_bytes(body).map_err(|e| ApiError::invalid(format!("invalid form body: {e}")))?;
    match req.connection_type.as_str() {
        "GetRequest" => {
            let handed = st.epson_sdp.get_request(printer, req.id.as_deref()).await?;
            let Some(h) = handed else { return Ok(xml(String::new())) };
            let mut res = xml(h.xml);
            if let Ok(v) = HeaderValue::from_str(&h.idempotency_key) {
                res.headers_mut().insert(IDEMPOTENCY_KEY_HEADER, v);
            }
            Ok(res)
        }
        "SetResponse" => {
            let file =
                req.response_file.ok_or_else(|| ApiError::invalid("ResponseFile is required for SetResponse"))?;
            let credited = st.epson_sdp.set_response(printer, req.id.as_deref(), &file).await?;
            let summary: Vec<String> = credited
                .iter()
                .map(|c| format!("{}={}", c.printjobid, c.result.map_or("unknown", |r| r.as_str())))
                .collect();
            let mut res = xml(String::new());
            if let Ok(v) = HeaderValue::from_str(&summary.join(",")) {
                res.headers_mut().insert(RESULTS_HEADER, v);
            }
            Ok(res)
        }
        other => Err(ApiError::invalid(format!("ConnectionType: {other:?} is not GetRequest or SetResponse")).into()),
    }
}
