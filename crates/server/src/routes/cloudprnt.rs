//! Star CloudPRNT (Version HTTP) at `/cloudprnt`: one URL for every printer, HTTP Basic
//! with the printer's login. Handlers parse Star's wire format and call
//! `onceprint_engine::transport::cloudprnt`.

use axum::extract::State;

use crate::extract::Query;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use onceprint_engine::transport::cloudprnt::PollIn;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::error::{ErrorBody, PrinterError};
use crate::extract::{parse_json, Body, PrinterAuth};
use crate::AppState;

/// Header naming the job's idempotency key (the same on every attempt of a task).
pub const IDEMPOTENCY_KEY_HEADER: &str = "x-onceprint-idempotency-key";

/// A CloudPRNT poll. Fields this broker does not use (`uniqueID`, `clientAction`,
/// `status`, peripherals) are accepted and ignored.
#[derive(Debug, Deserialize, ToSchema)]
pub struct CloudPrntPoll {
    /// The printer's status, URL-encoded: `200%20OK`, `410%20Out%20of%20Paper`,
    /// `411 Paper Jam`, `420 Cover Open`, …
    #[serde(rename = "statusCode")]
    pub status_code: String,
    /// Must be the printer's MAC when present.
    #[serde(rename = "printerMAC")]
    pub printer_mac: Option<String>,
    /// The job the printer works on, if it says.
    #[serde(rename = "jobToken")]
    pub job_token: Option<String>,
    #[serde(rename = "printingInProgress")]
    pub printing_in_progress: Option<bool>,
}

/// The answer to a poll.
#[derive(Debug, Serialize, ToSchema)]
pub struct CloudPrntPollAnswer {
    #[serde(rename = "jobReady")]
    pub job_ready: bool,
    /// Offered for the job: `image/png` (the print area at the printer's width) always,
    /// and `text/plain` only for a job of plain ASCII text.
    #[serde(rename = "mediaTypes", skip_serializing_if = "Vec::is_empty")]
    pub media_types: Vec<String>,
    /// Names the job (task and attempt) in the GET and the confirmation.
    #[serde(rename = "jobToken", skip_serializing_if = "Option::is_none")]
    pub job_token: Option<String>,
    /// Always `DELETE`.
    #[serde(rename = "deleteMethod", skip_serializing_if = "Option::is_none")]
    pub delete_method: Option<String>,
}

/// The query of the job GET and of the confirmation.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct CloudPrntQuery {
    /// The printer's MAC (required).
    pub mac: Option<String>,
    /// The media type asked for (`image/png` when left out).
    #[serde(rename = "type")]
    pub media_type: Option<String>,
    /// The `jobToken` of the poll answer.
    pub token: Option<String>,
    /// The result, in a confirmation, read with Star's table (docs/RESULT-CODES.md): `OK`,
    /// `200 OK` or any 2xx printed; `520` nothing printed (another attempt); `510`–`512`,
    /// `521` data the printer cannot use (failed); a stop (`410`, `411`, `420`) or any
    /// code Star does not list after the fetch may have printed (in doubt).
    pub code: Option<String>,
    /// Present (`&delete`): this GET is a confirmation (`deleteMethod` GET).
    pub delete: Option<String>,
    /// A server-assigned id (`uniqueID`); this broker assigns none and ignores it.
    #[allow(dead_code)]
    pub uid: Option<String>,
}

/// The answer to a confirmation.
#[derive(Debug, Serialize, ToSchema)]
pub struct CloudPrntConfirmed {
    /// `applied`, `duplicate` or `stale` (an older attempt's token changes nothing).
    pub result: String,
}

/// CloudPRNT poll. Updates the printer's `online`, `last_seen_at` and `last_error` (410 no
/// paper, 411 paper jam, 420 cover open) and says whether a job is ready for it. A printer
/// reporting an error gets no job; the attempt it holds unfetched ends with that reason,
/// and a stop reported on the job it fetched sends that job to a person. A job it fetched
/// is in progress until its result (Star: "a server can assume that the print is in
/// progress after the GET, until a DELETE, or POST with error code is received"); idle
/// polls in between are the firmware's way until they go on past the printer's offline
/// threshold after the fetch, or the answer deadline passes: then it is in doubt. It is
/// never offered again. Wrong login or another printer's MAC: 401, nothing changes.
#[utoipa::path(post, path = "/cloudprnt", operation_id = "cloudprnt_poll", tag = "printers that poll", request_body = CloudPrntPoll,
    security(("printer" = [])),
    responses((status = 200, body = CloudPrntPollAnswer), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody)))]
pub async fn poll(
    State(st): State<AppState>,
    PrinterAuth(printer): PrinterAuth,
    Body(body): Body,
) -> Result<Json<CloudPrntPollAnswer>, PrinterError> {
    let req: CloudPrntPoll = parse_json(&body)?;
    let poll = PollIn {
        status_code: req.status_code,
        mac: req.printer_mac,
        job_token: req.job_token,
        printing_in_progress: req.printing_in_progress,
    };
    let out = st.cloudprnt.poll(&printer, &poll).await?;
    Ok(Json(CloudPrntPollAnswer {
        job_ready: out.job_ready,
        media_types: out.media_types.iter().map(|m| (*m).to_owned()).collect(),
        delete_method: out.job_ready.then(|| "DELETE".to_owned()),
        job_token: out.job_token,
    }))
}

/// CloudPRNT job GET: the job the token names, as `image/png` (the print area only, 1 bit
/// per dot, as wide as the printer's `X-Star-Print-Width` × `X-Star-Horizontal-Resolution`
/// or its render profile; how the slip ends in `X-Star-Cut`) or, for plain ASCII text,
/// `text/plain`. No side effect the printer can see (it may GET again), but the broker
/// records durably that the job was fetched, since a fetched job may print. 404: no such
/// job or token for this printer; 415: a media type not offered for the job. With
/// `&delete` it is the confirmation instead (as `DELETE`).
#[utoipa::path(get, path = "/cloudprnt", operation_id = "cloudprnt_get_job", tag = "printers that poll", params(CloudPrntQuery),
    security(("printer" = [])),
    responses((status = 200, description = "The job, in the media type asked for",
               content_type = "image/png",
               headers(("x-onceprint-idempotency-key" = String),
                       ("x-star-cut" = String, description = "`full`, `partial` or `none`: how the slip ends (images only)"))),
              (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 415, body = ErrorBody)))]
pub async fn get(
    State(st): State<AppState>,
    PrinterAuth(printer): PrinterAuth,
    request_headers: axum::http::HeaderMap,
    Query(q): Query<CloudPrntQuery>,
) -> Result<Response, PrinterError> {
    if q.delete.is_some() {
        return confirm(&st, &printer, &q).await;
    }
    let dots = print_dots(&request_headers);
    let job = st.cloudprnt.fetch(&printer, q.mac.as_deref(), q.media_type.as_deref(), q.token.as_deref(), dots).await?;
    let mut res = job.bytes.into_response();
    let headers = res.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(job.content_type));
    if let Ok(v) = HeaderValue::from_str(&job.idempotency_key) {
        headers.insert(IDEMPOTENCY_KEY_HEADER, v);
    }
    if let Some(cut) = job.cut {
        headers.insert("x-star-cut", HeaderValue::from_static(cut));
    }
    Ok(res)
}

/// The printable width in dots a Star printer reports with its job GET: `X-Star-Print-Width`
/// (millimetres, PageInfo's `printWidth`) times `X-Star-Horizontal-Resolution` (dots per
/// millimetre, 8 when left out), as Star's CloudPRNT Protocol Guide ("Client HTTP Request
/// Headers") defines them and Star's sample server multiplies them. `None` when the
/// printer does not say, or says something no roll is (the render profile's width then).
fn print_dots(headers: &axum::http::HeaderMap) -> Option<u16> {
    let number = |name: &str| -> Option<f64> {
        let v: f64 = headers.get(name)?.to_str().ok()?.trim().parse().ok()?;
        (v.is_finite() && v > 0.0).then_some(v)
    };
    let mm = number("x-star-print-width")?;
    let per_mm = number("x-star-horizontal-resolution").unwrap_or(8.0);
    let dots = (mm * per_mm).round();
    (1.0..=4096.0).contains(&dots).then_some(dots as u16)
}

/// CloudPRNT job confirmation: `code` is the printer's result for the job the token
/// names. A token of an older attempt changes nothing (`stale`); another printer's job is
/// 404.
#[utoipa::path(delete, path = "/cloudprnt", operation_id = "cloudprnt_confirm", tag = "printers that poll", params(CloudPrntQuery),
    security(("printer" = [])),
    responses((status = 200, body = CloudPrntConfirmed), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn delete(
    State(st): State<AppState>,
    PrinterAuth(printer): PrinterAuth,
    Query(q): Query<CloudPrntQuery>,
) -> Result<Response, PrinterError> {
    confirm(&st, &printer, &q).await
}

async fn confirm(
    st: &AppState,
    printer: &onceprint_engine::directory::PrinterInfo,
    q: &CloudPrntQuery,
) -> Result<Response, PrinterError> {
    let result = st.cloudprnt.confirm(printer, q.mac.as_deref(), q.code.as_deref(), q.token.as_deref()).await?;
    Ok(Json(CloudPrntConfirmed { result: result.as_str().to_owned() }).into_response())
}

/// The query of the server-setting request.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ServerSettingQuery {
    /// The printer's MAC (checked against its login when present).
    pub mac: Option<String>,
    /// The last path segment of the printer's server URL, which the printer replaced with
    /// `cloudprnt-setting.json` (`cloudprnt` for this broker's URL). Not needed: jobs are
    /// always at `/cloudprnt`.
    #[allow(dead_code)]
    pub replaced_path: Option<String>,
    /// A server-assigned id; this broker assigns none and ignores it.
    #[allow(dead_code)]
    pub uid: Option<String>,
}

/// How printers log in to the MQTT server.
#[derive(Debug, Serialize, ToSchema)]
pub struct MqttAuthenticationSetting {
    pub username: String,
    pub password: String,
}

/// The MQTT server as printers reach it.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MqttConnectionSetting {
    pub host_name: String,
    pub port_number: u16,
    pub use_tls: bool,
    pub authentication_setting: MqttAuthenticationSetting,
}

/// CloudPRNT Version MQTT for this printer.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SettingForMqtt {
    /// Always false: Full MQTT (jobs as MQTT print-jobs the printer fetches by URL).
    #[serde(rename = "useTriggerPOST")]
    pub use_trigger_post: bool,
    pub mqtt_connection_setting: MqttConnectionSetting,
}

/// Star's server-setting file (`star_cloudprnt_server_setting`).
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServerSetting {
    /// `star_cloudprnt_server_setting`.
    pub title: String,
    /// `1.0.0`.
    pub version: String,
    /// `["HTTP"]` for a printer that polls, `["HTTP","MQTT"]` for one set up as an `mqtt`
    /// printer of Star's protocol.
    pub server_support_protocol: Vec<String>,
    #[serde(rename = "settingForMQTT", skip_serializing_if = "Option::is_none")]
    pub setting_for_mqtt: Option<SettingForMqtt>,
}

/// Star CloudPRNT server-setting request: a Star printer asks for `cloudprnt-setting.json`
/// beside its server URL (the URL's last segment replaced; Star CloudPRNT Protocol Guide,
/// "Server setting information request (GET)") with its login, before anything else. A
/// printer set up as a `cloudprnt` printer is told to poll over HTTP; one set up as an
/// `mqtt` printer of Star's protocol is told the MQTT server as printers reach it
/// (`serve --mqtt-printer-url`, else the host and port of `--mqtt-url`) and its MQTT login,
/// which is its broker login (the MQTT server's password file holds it). The printer then
/// takes its jobs as `url` print-jobs that it fetches from `GET /cloudprnt`. Wrong login,
/// another printer's MAC or a printer of another transport: 401.
#[utoipa::path(get, path = "/cloudprnt-setting.json", operation_id = "cloudprnt_server_setting", tag = "printers that poll",
    params(ServerSettingQuery), security(("printer" = [])),
    responses((status = 200, body = ServerSetting), (status = 401, body = ErrorBody)))]
pub async fn server_setting(
    State(st): State<AppState>,
    PrinterAuth(printer): PrinterAuth,
    request_headers: axum::http::HeaderMap,
    Query(q): Query<ServerSettingQuery>,
) -> Result<Json<ServerSetting>, PrinterError> {
    use onceprint_engine::transport::cloudprnt::Mode;
    let mode = st.cloudprnt.mode(&printer, q.mac.as_deref(), false)?;
    let http_only = || ServerSetting {
        title: "star_cloudprnt_server_setting".into(),
        version: "1.0.0".into(),
        server_support_protocol: vec!["HTTP".into()],
        setting_for_mqtt: None,
    };
    let Some(mqtt) = st.config.mqtt.as_ref().filter(|_| mode == Mode::Mqtt) else {
        return Ok(Json(http_only()));
    };
    // The login the printer signed in with is its MQTT login: PrinterAuth accepted it.
    let Some((username, password)) = basic_login(&request_headers) else {
        return Err(crate::ApiError::unauthorized("this endpoint takes the printer's login with HTTP Basic").into());
    };
    if let Some(url) = cloudprnt_url_used(&request_headers, st.config.tls.is_some()) {
        st.job_url.learn(&printer.row.tenant_id, &printer.row.id, url).await.map_err(crate::ApiError::from)?;
    }
    let p = &mqtt.for_printers;
    Ok(Json(ServerSetting {
        server_support_protocol: vec!["HTTP".into(), "MQTT".into()],
        setting_for_mqtt: Some(SettingForMqtt {
            use_trigger_post: false,
            mqtt_connection_setting: MqttConnectionSetting {
                host_name: p.host.clone(),
                port_number: p.port,
                use_tls: p.tls,
                authentication_setting: MqttAuthenticationSetting { username, password },
            },
        }),
        ..http_only()
    }))
}

/// The user and password of an HTTP Basic `Authorization` header.
fn basic_login(headers: &axum::http::HeaderMap) -> Option<(String, String)> {
    use base64::Engine as _;
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, encoded) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD.decode(encoded.trim()).ok()?;
    let (user, password) = String::from_utf8(decoded).ok()?.split_once(':').map(|(u, p)| (u.into(), p.into()))?;
    Some((user, password))
}

/// The broker's `/cloudprnt` URL as the printer that sent this request reaches it: the
/// scheme (`X-Forwarded-Proto` from a proxy, else this server's) and the host it asked for
/// (`X-Forwarded-Host`, else `Host`). `None` when they are not a plain host[:port].
fn cloudprnt_url_used(headers: &axum::http::HeaderMap, tls: bool) -> Option<String> {
    let value =
        |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(|v| v.split(',').next().unwrap_or(v).trim());
    let scheme = match value("x-forwarded-proto") {
        Some(p) if p.eq_ignore_ascii_case("https") => "https",
        Some(p) if p.eq_ignore_ascii_case("http") => "http",
        _ if tls => "https",
        _ => "http",
    };
    let host = value("x-forwarded-host").or_else(|| value("host"))?;
    let plain = !host.is_empty()
        && host.len() <= 255
        && host.bytes().all(|b| b.is_ascii_alphanumeric() || b"-.:[]_".contains(&b));
    plain.then(|| format!("{scheme}://{host}/cloudprnt"))
}
