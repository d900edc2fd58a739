//! Request extractors: JSON bodies with our error body, the kinds of bearer
//! authentication (admin token, tenant API key, store agent token, and — for the calls an
//! operator may make — an operator token, see [`Principal`]), and the login of printers
//! that poll the broker (HTTP Basic, and HTTP Digest for Epson Server Direct Print).

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use onceprint_engine::secrets;
use serde::de::DeserializeOwned;

use crate::error::ApiError;
use crate::AppState;

/// Parses JSON bytes into `T`, turning serde's message (which names the field, line and
/// column) into an `invalid_request` answer.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    // The plain parser is the fast path; only a body that fails is parsed a second time
    // with path tracking, to name the offending field in the message.
    let mut de = serde_json::Deserializer::from_slice(bytes);
    match T::deserialize(objects_only::ObjectsOnly(&mut de)).and_then(|v| de.end().map(|()| v)) {
        Ok(v) => Ok(v),
        Err(plain) => Err(explain_json_error::<T>(bytes, plain)),
    }
}

fn explain_json_error<T: DeserializeOwned>(bytes: &[u8], plain: serde_json::Error) -> ApiError {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    match serde_path_to_error::deserialize::<_, T>(objects_only::ObjectsOnly(&mut de)) {
        Err(e) => {
            let path = e.path().to_string();
            if path.is_empty() || path == "." {
                ApiError::invalid(format!("invalid JSON body: {}", e.inner()))
            } else {
                ApiError::invalid(format!("{path}: {}", e.inner()))
            }
        }
        // The value parsed, so what failed was trailing data after it.
        Ok(_) => ApiError::invalid(format!("invalid JSON body: {plain}")),
    }
}

/// A body whose type is a struct must be a JSON object. serde's derived structs also
/// take an array of their fields in order (`[null, null]` would be a PATCH that changes
/// nothing, answered 200), which no client means and the OpenAPI document does not allow.
/// Bodies that are arrays by type (a reconciliation's list, a batch) are untouched.
mod objects_only {
    use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
    use std::fmt;

    pub struct ObjectsOnly<D>(pub D);

    macro_rules! forward {
        ($($method:ident)*) => {
            $(fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
                self.0.$method(visitor)
            })*
        };
    }

    impl<'de, D: Deserializer<'de>> Deserializer<'de> for ObjectsOnly<D> {
        type Error = D::Error;

        forward! {
            deserialize_any deserialize_bool deserialize_i8 deserialize_i16 deserialize_i32
            deserialize_i64 deserialize_i128 deserialize_u8 deserialize_u16 deserialize_u32
            deserialize_u64 deserialize_u128 deserialize_f32 deserialize_f64 deserialize_char
            deserialize_str deserialize_string deserialize_bytes deserialize_byte_buf
            deserialize_option deserialize_unit deserialize_seq deserialize_map
            deserialize_identifier deserialize_ignored_any
        }

        fn deserialize_unit_struct<V: Visitor<'de>>(self, name: &'static str, v: V) -> Result<V::Value, D::Error> {
            self.0.deserialize_unit_struct(name, v)
        }

        fn deserialize_newtype_struct<V: Visitor<'de>>(self, name: &'static str, v: V) -> Result<V::Value, D::Error> {
            self.0.deserialize_newtype_struct(name, v)
        }

        fn deserialize_tuple<V: Visitor<'de>>(self, len: usize, v: V) -> Result<V::Value, D::Error> {
            self.0.deserialize_tuple(len, v)
        }

        fn deserialize_tuple_struct<V: Visitor<'de>>(
            self,
            name: &'static str,
            len: usize,
            v: V,
        ) -> Result<V::Value, D::Error> {
            self.0.deserialize_tuple_struct(name, len, v)
        }

        fn deserialize_struct<V: Visitor<'de>>(
            self,
            name: &'static str,
            fields: &'static [&'static str],
            v: V,
        ) -> Result<V::Value, D::Error> {
            self.0.deserialize_struct(name, fields, NoArray(v))
        }

        fn deserialize_enum<V: Visitor<'de>>(
            self,
            name: &'static str,
            variants: &'static [&'static str],
            v: V,
        ) -> Result<V::Value, D::Error> {
            self.0.deserialize_enum(name, variants, v)
        }

        fn is_human_readable(&self) -> bool {
            self.0.is_human_readable()
        }
    }

    /// A struct's visitor that refuses the array form.
    struct NoArray<V>(V);

    impl<'de, V: Visitor<'de>> Visitor<'de> for NoArray<V> {
        type Value = V::Value;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            self.0.expecting(f)
        }

        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            self.0.visit_map(map)
        }

        fn visit_seq<A: SeqAccess<'de>>(self, _seq: A) -> Result<Self::Value, A::Error> {
            Err(de::Error::custom("the body must be a JSON object, not an array"))
        }
    }
}

/// The raw body, with the configured size limit answered as 413 `payload_too_large`.
pub struct Body(pub Bytes);

/// How much of an oversized body the broker still reads, and for how long, before it answers
/// 413 and closes the connection. A server that closes a connection with unread bytes in its
/// receive buffer makes the kernel reset it, and a reset can reach the client before it has
/// read the answer: the client then sees "broken pipe" or "connection reset" instead of a clear
/// `payload_too_large` (the lingering close of HTTP servers, RFC 9112 §9.6). Reading the rest,
/// up to a bound, lets the answer arrive; a body beyond the bound is cut off as before.
const DRAIN_BYTES: usize = 8 * 1024 * 1024;
const DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(2);

impl FromRequest<AppState> for Body {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        use futures_util::StreamExt;
        let limit = state.config.max_body_bytes;
        let declared = req
            .headers()
            .get(axum::http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        if declared.is_some_and(|n| n > limit.saturating_add(DRAIN_BYTES)) {
            return Err(ApiError::too_large(limit));
        }
        let mut stream = req.into_body().into_data_stream();
        // Most bodies arrive in one chunk, which is kept as it is; only more are copied together.
        let mut chunks: Vec<Bytes> = Vec::new();
        let mut seen = 0usize;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| ApiError::invalid(format!("cannot read the request body: {e}")))?;
            seen += chunk.len();
            if seen > limit {
                drop(chunks);
                let drain = async {
                    while seen <= limit.saturating_add(DRAIN_BYTES) {
                        match stream.next().await {
                            Some(Ok(c)) => seen += c.len(),
                            _ => break,
                        }
                    }
                };
                let _ = tokio::time::timeout(DRAIN_TIME, drain).await;
                return Err(ApiError::too_large(limit));
            }
            chunks.push(chunk);
        }
        Ok(Body(match chunks.len() {
            0 => Bytes::new(),
            1 => chunks.swap_remove(0),
            _ => Bytes::from(chunks.concat()),
        }))
    }
}

/// The source a login is counted against: the address the connection came from or, when
/// that is the broker's own machine (a reverse proxy there), the last address of
/// `X-Forwarded-For` (the one the proxy added; a client can write anything before it). ""
/// when neither is known.
pub fn login_source(peer: Option<crate::http1::PeerAddr>, headers: &axum::http::HeaderMap) -> String {
    let Some(crate::http1::PeerAddr(addr)) = peer else { return String::new() };
    if addr.ip().is_loopback() {
        let forwarded = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .last()
            .and_then(|ip| ip.trim().parse::<std::net::IpAddr>().ok());
        if let Some(ip) = forwarded {
            return ip.to_string();
        }
    }
    addr.ip().to_string()
}

/// Whether a `Content-Type` value names JSON: `application/json` or a `+json` type such
/// as `application/merge-patch+json`, parameters (`; charset=utf-8`) ignored.
pub fn is_json_media_type(value: &str) -> bool {
    let essence = value.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// The request's `Content-Type`, if it sent one (`Some("")` for a value that is not text).
pub fn content_type(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers.get(axum::http::header::CONTENT_TYPE).map(|v| v.to_str().unwrap_or_default())
}

/// 415 `unsupported_media_type` for a body sent as something other than JSON. A request
/// without `Content-Type` is read as JSON: the API takes nothing else, and simple clients
/// leave the header out.
pub fn require_json(headers: &axum::http::HeaderMap) -> Result<(), ApiError> {
    match content_type(headers) {
        None => Ok(()),
        Some(v) if is_json_media_type(v) => Ok(()),
        Some(v) => Err(unsupported_media_type(v, "application/json")),
    }
}

/// The answer to a body of a media type an endpoint does not take.
pub fn unsupported_media_type(got: &str, takes: &str) -> ApiError {
    ApiError::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
        format!("Content-Type {got:?} is not accepted here; send {takes}"),
    )
}

/// The raw bytes of a body that must be JSON (checked by media type, parsed by the
/// handler), for handlers that look at the bytes before parsing them.
pub struct JsonBytes(pub Bytes);

impl FromRequest<AppState> for JsonBytes {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        require_json(req.headers())?;
        let Body(bytes) = Body::from_request(req, state).await?;
        Ok(JsonBytes(bytes))
    }
}

/// A JSON body of type `T`.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let JsonBytes(bytes) = JsonBytes::from_request(req, state).await?;
        parse_json(&bytes).map(JsonBody)
    }
}

/// A query string, with a rejection through the one error mapping (400
/// `invalid_request` naming the parameter) instead of the framework's plain text.
pub struct Query<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(v)) => Ok(Query(v)),
            Err(e) => Err(ApiError::invalid(framework_message(&e.body_text(), "query string"))),
        }
    }
}

/// Path parameters, rejected like [`Query`].
pub struct Path<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for Path<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(v)) => Ok(Path(v)),
            Err(e) => Err(ApiError::invalid(framework_message(&e.body_text(), "path"))),
        }
    }
}

/// The framework's rejection text without its "Failed to deserialize …:" preamble, which
/// names the parser rather than what the caller got wrong.
fn framework_message(text: &str, what: &str) -> String {
    let detail = text.split_once(": ").map_or(text, |(_, rest)| rest);
    format!("{what}: {detail}")
}

fn bearer(parts: &Parts) -> Result<&str, ApiError> {
    let value = parts
        .headers
        .get(axum::http::header::AUTHORIZATION)
        .ok_or_else(|| ApiError::unauthorized("missing Authorization: Bearer header"))?;
    let value = value.to_str().map_err(|_| ApiError::unauthorized("malformed Authorization header"))?;
    let token = value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))
        .ok_or_else(|| ApiError::unauthorized("the Authorization header must be \"Bearer TOKEN\""))?;
    let token = token.trim();
    if token.is_empty() {
        return Err(ApiError::unauthorized("empty bearer token"));
    }
    Ok(token)
}

/// The caller presented the admin token.
pub struct Admin;

impl FromRequestParts<AppState> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let token = bearer(parts)?;
        if secrets::hashes_equal(&secrets::hash(token), &state.admin_token_hash) {
            Ok(Admin)
        } else {
            Err(ApiError::unauthorized("this endpoint needs the admin token"))
        }
    }
}

/// The caller presented a tenant API key.
pub struct TenantAuth {
    pub tenant_id: String,
    /// Which of the tenant's keys (the actor `api_key:ID` of set-up changes).
    pub key_id: String,
}

impl FromRequestParts<AppState> for TenantAuth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let TenantAuthForIntake(auth) = TenantAuthForIntake::from_request_parts(parts, state).await?;
        if let Some(limiter) = state.intake.tenant_limiter() {
            limiter.check(&auth.tenant_id, onceprint_engine::clock::now_ms()).map_err(|l| {
                ApiError::rate_limited(l.retry_after_secs, "too many requests for this tenant: over its rate limit")
            })?;
        }
        Ok(auth)
    }
}

/// A tenant's API key, not yet counted against the tenant's rate limit: for task
/// submission, where intake counts the request only once the first gate has not answered
/// it, so a retry of a known task is never refused.
pub struct TenantAuthForIntake(pub TenantAuth);

impl FromRequestParts<AppState> for TenantAuthForIntake {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let token = bearer(parts)?;
        match state.directory.tenant_by_key_hash(&secrets::hash(token)).await? {
            Some(k) => Ok(TenantAuthForIntake(TenantAuth { tenant_id: k.tenant.id, key_id: k.key_id })),
            None => Err(ApiError::unauthorized("unknown API key")),
        }
    }
}

/// The caller presented a store agent token. With `METERED` (the default) the request
/// draws from the store agent's rate limit; an unmetered one (an ack) neither draws nor is
/// refused: it finishes work the broker handed out, and refusing it would only keep a
/// busy printer's lane waiting (docs/CONFIGURATION.md, `--agent-rate-limit`).
pub struct AgentAuth<const METERED: bool = true>(pub onceprint_store::AgentIdentity);

/// A store agent's request that is never refused for its rate: an ack.
pub type AgentAuthUnmetered = AgentAuth<false>;

impl<const METERED: bool> FromRequestParts<AppState> for AgentAuth<METERED> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let token = bearer(parts)?;
        let Some(agent) = state.directory.agent_by_token_hash(&secrets::hash(token)).await? else {
            return Err(ApiError::unauthorized("unknown agent token"));
        };
        if let Some(limiter) = state.agent_limiter.as_ref().filter(|_| METERED) {
            let key = format!("{}/{}", agent.tenant_id, agent.store_id);
            // A busy agent's requests grow with the printers it drives, so its budget does
            // too; the count comes from memory (after the store's first request).
            let per_printer = state.config.agent_rate_per_printer;
            let printers = if per_printer > 0.0 {
                state.directory.agent_printer_count(&agent.tenant_id, &agent.store_id).await
            } else {
                None
            };
            let limit = match printers {
                Some(n) => limiter.limit().at_least_per_unit(per_printer, n),
                None => limiter.limit(),
            };
            limiter.check_with(&key, onceprint_engine::clock::now_ms(), limit).map_err(|l| {
                ApiError::rate_limited(
                    l.retry_after_secs,
                    "too many requests from this store's agent: over its rate limit",
                )
            })?;
        }
        Ok(AgentAuth(agent))
    }
}

/// A printer that logs in itself (CloudPRNT, Epson Server Direct Print) with the login
/// made when the printer was created: HTTP Basic, and where `DIGEST` is set (the routes of
/// Epson Server Direct Print, whose manual describes Digest access authentication) HTTP
/// Digest too (`crate::digest`). Missing or wrong → 401 with the challenges.
pub struct PrinterAuth<const DIGEST: bool = false>(pub std::sync::Arc<onceprint_engine::directory::PrinterInfo>);

impl<const DIGEST: bool> FromRequestParts<AppState> for PrinterAuth<DIGEST> {
    type Rejection = crate::error::PrinterError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let found = printer_login::<DIGEST>(parts, state).await.map(PrinterAuth);
        if DIGEST {
            found.map_err(crate::error::PrinterError::offering_digest)
        } else {
            found
        }
    }
}

/// The value of an `Authorization` header after `scheme` and a space (the scheme is
/// case-insensitive, RFC 7235 §2.1).
fn after_scheme<'a>(value: &'a str, scheme: &str) -> Option<&'a str> {
    let (given, rest) = value.split_once(' ')?;
    given.eq_ignore_ascii_case(scheme).then_some(rest)
}

async fn printer_login<const DIGEST: bool>(
    parts: &Parts,
    state: &AppState,
) -> Result<std::sync::Arc<onceprint_engine::directory::PrinterInfo>, crate::error::PrinterError> {
    use base64::Engine as _;
    let refused = || {
        ApiError::unauthorized(if DIGEST {
            "this endpoint needs the printer's login (HTTP Digest or Basic)"
        } else {
            "this endpoint needs the printer's login (HTTP Basic)"
        })
    };
    let value =
        parts.headers.get(axum::http::header::AUTHORIZATION).and_then(|v| v.to_str().ok()).ok_or_else(refused)?;
    if let Some(answer) = after_scheme(value, "Digest") {
        if !DIGEST {
            return Err(ApiError::unauthorized("this endpoint takes the printer's login with HTTP Basic only").into());
        }
        return digest_login(parts, state, answer).await;
    }
    let encoded = after_scheme(value, "Basic").ok_or_else(refused)?;
    let decoded = base64::engine::general_purpose::STANDARD.decode(encoded.trim()).map_err(|_| refused())?;
    let text = String::from_utf8(decoded).map_err(|_| refused())?;
    let (user, password) = text.split_once(':').ok_or_else(refused)?;
    match state.directory.printer_by_login(user, password).await? {
        Some(p) => Ok(p),
        None => Err(ApiError::unauthorized("unknown printer login").into()),
    }
}

/// An HTTP Digest answer (RFC 7616 §3.4, `qop=auth`), checked against the `HA1` kept with
/// the login its user name names.
async fn digest_login(
    parts: &Parts,
    state: &AppState,
    answer: &str,
) -> Result<std::sync::Arc<onceprint_engine::directory::PrinterInfo>, crate::error::PrinterError> {
    use crate::digest::{check_form, Answer, Refusal};
    use crate::error::PrinterError;
    use onceprint_engine::secrets::DigestAlgorithm;
    let refuse = |r: Refusal| PrinterError::digest(ApiError::unauthorized(r.message), r.stale);
    let answer = Answer::parse(answer).map_err(|m| {
        refuse(Refusal { message: format!("malformed Digest Authorization header: {m}"), stale: false })
    })?;
    let request_uri = parts.uri.path_and_query().map_or_else(|| parts.uri.path(), |pq| pq.as_str());
    let checked = check_form(&answer, request_uri).map_err(refuse)?;
    let unknown = || refuse(Refusal { message: "unknown printer login".into(), stale: false });
    let Some((login, printer)) = state.directory.printer_by_digest_username(checked.username).await? else {
        return Err(unknown());
    };
    let ha1 = match checked.algorithm {
        DigestAlgorithm::Md5 => login.ha1_md5.as_deref(),
        DigestAlgorithm::Sha256 => login.ha1_sha256.as_deref(),
    };
    let Some(ha1) = ha1 else {
        let epson =
            printer.transport.as_ref().map(|t| t.kind()) == Some(onceprint_engine::transport::TransportKind::EpsonSdp);
        let now = onceprint_engine::clock::now_ms();
        if state.digest.log_missing_key(&login.username, now) {
            tracing::warn!(
                tenant = %login.tenant_id, printer = %login.printer_id, username = %login.username,
                "a printer signs in with HTTP Digest, but its login has no Digest key: rotate its credentials"
            );
        }
        let message = if epson {
            "this printer's login was made before the broker offered HTTP Digest and has no Digest key: rotate the \
             printer's credentials (POST /v1/printers/{id}/credentials) and enter the new password in the printer, \
             or sign in with HTTP Basic"
        } else {
            "HTTP Digest is offered to Epson Server Direct Print printers only: this printer signs in with HTTP Basic"
        };
        return Err(refuse(Refusal { message: message.into(), stale: false }));
    };
    let now = onceprint_engine::clock::now_ms();
    state.digest.verify(&checked, ha1, parts.method.as_str(), now).map_err(refuse)?;
    Ok(printer)
}

/// Prefix of operator tokens (`POST /v1/operator-sessions`), which tells them apart from
/// tenant API keys without a database look-up.
pub const OPERATOR_TOKEN_PREFIX: &str = "opo_";

/// Who calls an endpoint that both a tenant and its operators may use: the tenant's API
/// key (everything of the tenant) or an operator token (what that operator may see: a
/// staff member only their stores, where another store's objects are `not_found`).
pub enum Principal {
    Tenant(TenantAuth),
    Operator(onceprint_store::OperatorSession),
}

impl Principal {
    pub fn tenant_id(&self) -> &str {
        match self {
            Principal::Tenant(t) => &t.tenant_id,
            Principal::Operator(s) => &s.operator.tenant_id,
        }
    }

    /// Whether the caller may see `store_id`.
    pub fn may_see_store(&self, store_id: &str) -> bool {
        match self {
            Principal::Tenant(_) => true,
            Principal::Operator(s) => s.operator.may_see_store(store_id),
        }
    }
}

impl FromRequestParts<AppState> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let token = bearer(parts)?;
        if token.starts_with(OPERATOR_TOKEN_PREFIX) {
            return match state.operators.authenticate(token).await? {
                Some(s) if s.kind == onceprint_store::SessionKind::Token => Ok(Principal::Operator(s)),
                _ => Err(ApiError::unauthorized("unknown, expired or revoked operator token")),
            };
        }
        TenantAuth::from_request_parts(parts, state).await.map(Principal::Tenant)
    }
}

/// The caller presented an operator token.
pub struct OperatorAuth;

impl FromRequestParts<AppState> for OperatorAuth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        match Principal::from_request_parts(parts, state).await? {
            Principal::Operator(_) => Ok(OperatorAuth),
            Principal::Tenant(_) => Err(ApiError::unauthorized("this endpoint needs an operator token")),
        }
    }
}
