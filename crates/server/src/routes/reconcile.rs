//! Daily reconciliation per store: JSON, or CSV with `Accept: text/csv`.

use axum::extract::State;

use crate::extract::{Path, Query};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use onceprint_engine::reconcile::{reconcile, DeviceLogPresence, ReconcileError, Report};
use serde::Deserialize;

use crate::error::{ApiError, ErrorBody};
use crate::extract::{content_type, parse_json, unsupported_media_type, Body, Principal};
use crate::AppState;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DateParam {
    /// The business day, `YYYY-MM-DD`, in the store's time zone: from the start of that
    /// local date to the start of the next, which is 23 or 25 hours on the days daylight
    /// saving time begins or ends. Without it: today in the store's time zone.
    pub date: Option<String>,
}

/// The day asked for, or today in the store's time zone when the query names none.
async fn day_of(st: &AppState, tenant_id: &str, store_id: &str, q: DateParam) -> Result<String, ApiError> {
    if let Some(date) = q.date {
        return Ok(date);
    }
    let shop = st
        .store
        .get_store(tenant_id, store_id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no store {store_id:?}")))?;
    let zone = onceprint_engine::tz::parse(&shop.timezone)
        .map_err(|error| map_err(ReconcileError::StoreZone { store_id: store_id.to_owned(), error }))?;
    Ok(zone.local_date(onceprint_engine::clock::now_ms()))
}

/// Most expected business numbers in one request.
const MAX_EXPECTED: usize = 1_000_000;

fn wants_csv(headers: &HeaderMap) -> bool {
    headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|v| v.contains("text/csv"))
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

/// The report as CSV: one `section,item,value` row per fact, lists one row per entry.
pub fn report_csv(r: &Report) -> String {
    let mut out = String::from("section,item,value\n");
    let mut row = |section: &str, item: &str, value: String| {
        out.push_str(&format!("{},{},{}\n", csv_field(section), csv_field(item), csv_field(&value)));
    };
    row("report", "store_id", r.store_id.clone());
    row("report", "date", r.date.clone());
    row("report", "timezone", r.timezone.clone());
    let c = &r.counts;
    for (k, v) in [
        ("submitted", c.submitted),
        ("printed", c.printed),
        ("reprinted", c.reprinted),
        ("failed", c.failed),
        ("in_doubt", c.in_doubt),
        ("transferred", c.transferred),
        ("cancelled", c.cancelled),
        ("closed", c.closed),
        ("open", c.open),
    ] {
        row("count", k, v.to_string());
    }
    row("ledger", "charges", r.ledger.charges.to_string());
    row("ledger", "charged_amount", r.ledger.charged_amount.to_string());
    row("ledger", "refunds", r.ledger.refunds.to_string());
    row("ledger", "refunded_amount", r.ledger.refunded_amount.to_string());
    if let Some(n) = r.expected {
        row("expected", "count", n.to_string());
    }
    for b in &r.expected_not_printed {
        row("expected_not_printed", b, String::new());
    }
    for b in &r.printed_not_expected {
        row("printed_not_expected", b, String::new());
    }
    for b in &r.printed_more_than_once {
        row("printed_more_than_once", b, String::new());
    }
    // The device log: whether there is one, its counts, then one row per
    // difference with the task id as the item and the rest as `name=value` pairs. The key
    // comes last, since a business number may hold any character but a control one.
    row("device_log", "status", device_log_status(r.device_log).to_owned());
    let d = &r.device_counts;
    row("device_count", "records", d.records.to_string());
    row("device_count", "device_printed", d.device_printed.to_string());
    row("device_count", "broker_printed", d.broker_printed.to_string());
    row("device_count", "device_printed_broker_not", d.device_printed_broker_not.to_string());
    row(
        "device_count",
        "broker_printed_device_not",
        d.broker_printed_device_not.map(|n| n.to_string()).unwrap_or_default(),
    );
    for (section, list) in [
        ("device_printed_broker_not", &r.device_printed_broker_not),
        ("broker_printed_device_not", &r.broker_printed_device_not),
    ] {
        for e in list {
            let value = format!(
                "printer_id={};device_state={};broker_state={};key={}",
                e.printer_id,
                e.device_state.as_deref().unwrap_or(""),
                e.broker_state.as_deref().unwrap_or(""),
                e.key
            );
            row(section, &e.task_id, value);
        }
    }
    out
}

fn device_log_status(p: DeviceLogPresence) -> &'static str {
    match p {
        DeviceLogPresence::None => "none",
        DeviceLogPresence::Present => "present",
    }
}

fn answer(report: Report, headers: &HeaderMap) -> Response {
    if wants_csv(headers) {
        ([(header::CONTENT_TYPE, "text/csv; charset=utf-8")], report_csv(&report)).into_response()
    } else {
        (StatusCode::OK, Json(report)).into_response()
    }
}

pub(crate) fn map_err(e: ReconcileError) -> ApiError {
    match e {
        ReconcileError::NoStore(s) => ApiError::not_found(format!("no store {s:?}")),
        ReconcileError::BadDate(_) => ApiError::invalid(e.to_string()),
        // The request was fine; the stored row is not. That is for the operator's log,
        // and the caller can do nothing about it but report it.
        ReconcileError::StoreZone { .. } => {
            tracing::error!(error = %e, "cannot reconcile");
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "internal error; see the broker log")
        }
        ReconcileError::Store(s) => s.into(),
    }
}

/// The store's day: counts, charges and refunds, any business number printed more than
/// once (which must never happen), and the day's tasks against the store agents' device
/// log (`POST /v1/agent/journal-digest`): printed by the device but not at the broker, and
/// printed at the broker on the agent's printers but not by the device (only when a device
/// log for the day exists: `device_log` says `none` otherwise).
#[utoipa::path(get, path = "/v1/stores/{id}/reconciliation", tag = "reconciliation", security(("tenant" = []), ("operator" = [])),
    params(("id" = String, Path), DateParam),
    responses((status = 200, body = Report, description = "JSON, or CSV with `Accept: text/csv`"),
              (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn get_day(
    State(st): State<AppState>,
    auth: Principal,
    Path(store_id): Path<String>,
    Query(q): Query<DateParam>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    if !auth.may_see_store(&store_id) {
        return Err(ApiError::not_found(format!("no store {store_id:?}")));
    }
    let date = day_of(&st, auth.tenant_id(), &store_id, q).await?;
    let report = reconcile(st.store.as_ref(), auth.tenant_id(), &store_id, &date, None).await.map_err(map_err)?;
    Ok(answer(report, &headers))
}

/// Parses expected business numbers: a JSON array of strings, `{"expected": [...]}`, or
/// (with `Content-Type: text/csv`) one per line, the first column, an optional `biz_no`
/// header line.
fn parse_expected(headers: &HeaderMap, body: &[u8]) -> Result<Vec<String>, ApiError> {
    let is_csv = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/csv") || v.starts_with("text/plain"));
    if !is_csv {
        crate::extract::require_json(headers).map_err(|_| {
            unsupported_media_type(content_type(headers).unwrap_or_default(), "application/json or text/csv")
        })?;
    }
    let list: Vec<String> = if is_csv {
        let text = std::str::from_utf8(body).map_err(|_| ApiError::invalid("the CSV body is not UTF-8"))?;
        text.lines()
            .enumerate()
            .filter_map(|(i, line)| {
                let first = line.split(',').next().unwrap_or("").trim().trim_matches('"').to_owned();
                (!(first.is_empty() || (i == 0 && first.eq_ignore_ascii_case("biz_no")))).then_some(first)
            })
            .collect()
    } else {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Expected {
            List(Vec<String>),
            Object { expected: Vec<String> },
        }
        match parse_json::<Expected>(body)? {
            Expected::List(l) | Expected::Object { expected: l } => l,
        }
    };
    if list.len() > MAX_EXPECTED {
        return Err(ApiError::invalid(format!("expected: at most {MAX_EXPECTED} business numbers per request")));
    }
    Ok(list)
}

/// The same, against the business numbers the merchant expected: lists of expected but not
/// printed, printed but not expected, and printed more than once.
#[utoipa::path(post, path = "/v1/stores/{id}/reconciliation", tag = "reconciliation", security(("tenant" = []), ("operator" = [])),
    params(("id" = String, Path), DateParam),
    request_body(content = Vec<String>, description = "JSON array of biz_no, or text/csv with one biz_no per line"),
    responses((status = 200, body = Report, description = "JSON, or CSV with `Accept: text/csv`"),
              (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn post_day(
    State(st): State<AppState>,
    auth: Principal,
    Path(store_id): Path<String>,
    Query(q): Query<DateParam>,
    headers: HeaderMap,
    Body(body): Body,
) -> Result<Response, ApiError> {
    if !auth.may_see_store(&store_id) {
        return Err(ApiError::not_found(format!("no store {store_id:?}")));
    }
    let expected = parse_expected(&headers, &body)?;
    let date = day_of(&st, auth.tenant_id(), &store_id, q).await?;
    let report =
        reconcile(st.store.as_ref(), auth.tenant_id(), &store_id, &date, Some(&expected)).await.map_err(map_err)?;
    Ok(answer(report, &headers))
}
