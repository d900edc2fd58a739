//! Operators and their API sessions: accounts created with the tenant's API
//! key, operator tokens obtained with an operator's own password, and revocation.

use axum::extract::State;

use crate::extract::Path;
use axum::http::StatusCode;
use axum::Json;
use onceprint_engine::operators::OperatorSpec;
use onceprint_engine::Creator;
use onceprint_store::SessionKind;

use crate::dto::{
    CreateOperator, OperatorList, OperatorLogin, OperatorOut, OperatorPassword, OperatorTokenOut, SessionsRevoked,
};
use crate::error::{ApiError, ErrorBody};
use crate::extract::{login_source, JsonBody, OperatorAuth, TenantAuth};
use crate::http1::PeerAddr;
use crate::AppState;

/// Creates an operator: `staff` bound to one or more stores, or a `manager` of the whole
/// tenant. The password (at least 10 characters) is kept only as its argon2id hash.
#[utoipa::path(post, path = "/v1/operators", tag = "operators", security(("tenant" = [])),
    request_body = CreateOperator,
    responses((status = 201, body = OperatorOut), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 404, description = "`not_found`: one of `stores` is not a store of the tenant", body = ErrorBody),
              (status = 409, body = ErrorBody)))]
pub async fn create_operator(
    State(st): State<AppState>,
    auth: TenantAuth,
    JsonBody(req): JsonBody<CreateOperator>,
) -> Result<(StatusCode, Json<OperatorOut>), ApiError> {
    let creator = Creator::ApiKey { tenant_id: &auth.tenant_id, key_id: &auth.key_id };
    let spec = OperatorSpec {
        id: req.id,
        name: req.name,
        role: req.role,
        stores: req.stores.unwrap_or_default(),
        password: req.password,
    };
    let operator = st.operators.create(creator, spec).await?;
    Ok((StatusCode::CREATED, Json(operator.into())))
}

/// The tenant's operators, by id.
#[utoipa::path(get, path = "/v1/operators", tag = "operators", security(("tenant" = [])),
    responses((status = 200, body = OperatorList), (status = 401, body = ErrorBody)))]
pub async fn list_operators(State(st): State<AppState>, auth: TenantAuth) -> Result<Json<OperatorList>, ApiError> {
    let operators = st.operators.list(&auth.tenant_id).await?;
    let out = operators.into_iter().map(|o| {
        let lock = st.operators.lockout(&o.tenant_id, &o.id);
        OperatorOut::from(o).with_lockout(lock)
    });
    Ok(Json(OperatorList { operators: out.collect() }))
}

/// Ends every session of an operator: console logins and operator tokens alike stop
/// working at once (audited in the set-up audit).
#[utoipa::path(delete, path = "/v1/operators/{id}/sessions", tag = "operators", security(("tenant" = [])),
    params(("id" = String, Path)),
    responses((status = 200, body = SessionsRevoked), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn revoke_operator_sessions(
    State(st): State<AppState>,
    auth: TenantAuth,
    Path(id): Path<String>,
) -> Result<Json<SessionsRevoked>, ApiError> {
    let creator = Creator::ApiKey { tenant_id: &auth.tenant_id, key_id: &auth.key_id };
    let revoked = st.operators.revoke_sessions(creator, &id).await?;
    Ok(Json(SessionsRevoked { revoked }))
}

/// Disables an operator's login: every session (console and operator tokens) ends at once
/// and logging in is refused (403) until the login is enabled again. Audited.
#[utoipa::path(post, path = "/v1/operators/{id}/disable", tag = "operators", security(("tenant" = [])),
    params(("id" = String, Path)),
    responses((status = 200, body = OperatorOut), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn disable_operator(
    State(st): State<AppState>,
    auth: TenantAuth,
    Path(id): Path<String>,
) -> Result<Json<OperatorOut>, ApiError> {
    set_enabled(st, auth, id, false).await
}

/// Enables a disabled operator's login again (sessions it had stay ended). Audited.
#[utoipa::path(post, path = "/v1/operators/{id}/enable", tag = "operators", security(("tenant" = [])),
    params(("id" = String, Path)),
    responses((status = 200, body = OperatorOut), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn enable_operator(
    State(st): State<AppState>,
    auth: TenantAuth,
    Path(id): Path<String>,
) -> Result<Json<OperatorOut>, ApiError> {
    set_enabled(st, auth, id, true).await
}

async fn set_enabled(st: AppState, auth: TenantAuth, id: String, enabled: bool) -> Result<Json<OperatorOut>, ApiError> {
    let creator = Creator::ApiKey { tenant_id: &auth.tenant_id, key_id: &auth.key_id };
    let o = st.operators.set_enabled(creator, &id, enabled).await?;
    let lock = st.operators.lockout(&o.tenant_id, &o.id);
    Ok(Json(OperatorOut::from(o).with_lockout(lock)))
}

/// Gives an operator a new password (at least 10 characters): every session ends and the
/// operator's failed logins are forgotten. Audited, without the password.
#[utoipa::path(put, path = "/v1/operators/{id}/password", tag = "operators", security(("tenant" = [])),
    params(("id" = String, Path)), request_body = OperatorPassword,
    responses((status = 200, body = OperatorOut), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 404, body = ErrorBody)))]
pub async fn set_operator_password(
    State(st): State<AppState>,
    auth: TenantAuth,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<OperatorPassword>,
) -> Result<Json<OperatorOut>, ApiError> {
    let creator = Creator::ApiKey { tenant_id: &auth.tenant_id, key_id: &auth.key_id };
    let o = st.operators.set_password(creator, &id, req.password).await?;
    Ok(Json(o.into()))
}

/// Lifts the lock-out of an operator's login after too many failures, for every source, on
/// the node that answers (each node counts failures on its own). Audited.
#[utoipa::path(delete, path = "/v1/operators/{id}/lockout", tag = "operators", security(("tenant" = [])),
    params(("id" = String, Path)),
    responses((status = 200, body = OperatorOut), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn unlock_operator(
    State(st): State<AppState>,
    auth: TenantAuth,
    Path(id): Path<String>,
) -> Result<Json<OperatorOut>, ApiError> {
    let creator = Creator::ApiKey { tenant_id: &auth.tenant_id, key_id: &auth.key_id };
    let o = st.operators.unlock(creator, &id).await?;
    Ok(Json(o.into()))
}

/// Logs an operator in for the API: answers an operator token (`opo_…`, shown once) to
/// send as `Authorization: Bearer` to the manual actions, the task reads, the attention
/// list and reconciliation. Wrong credentials are 401 (one answer for unknown tenant,
/// unknown operator and wrong password); the right password of a disabled operator is 403.
/// After 5 failures of one operator from one source (the client's address) within 15
/// minutes every attempt from that source is 429 `too_many_requests` with `Retry-After`
/// until the window has passed; after 50 from all sources together, every source's is,
/// until the window passes or the lock-out is lifted (`DELETE /v1/operators/{id}/lockout`).
#[utoipa::path(post, path = "/v1/operator-sessions", tag = "operators", request_body = OperatorLogin,
    responses((status = 201, body = OperatorTokenOut), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 403, body = ErrorBody), (status = 429, body = ErrorBody)))]
pub async fn create_operator_session(
    State(st): State<AppState>,
    peer: Option<axum::Extension<PeerAddr>>,
    headers: axum::http::HeaderMap,
    JsonBody(req): JsonBody<OperatorLogin>,
) -> Result<(StatusCode, Json<OperatorTokenOut>), ApiError> {
    let source = login_source(peer.map(|p| p.0), &headers);
    let login =
        st.operators.login(&req.tenant_id, &req.operator_id, &req.password, SessionKind::Token, &source).await?;
    Ok((
        StatusCode::CREATED,
        Json(OperatorTokenOut {
            token: login.secret,
            expires_at: crate::dto::rfc3339(login.session.expires_at),
            operator: login.session.operator.into(),
        }),
    ))
}

/// Ends the calling operator token's session (logout).
#[utoipa::path(delete, path = "/v1/operator-sessions", tag = "operators", security(("operator" = [])),
    responses((status = 204), (status = 401, body = ErrorBody)))]
pub async fn delete_operator_session(
    State(st): State<AppState>,
    _auth: OperatorAuth,
    headers: axum::http::HeaderMap,
) -> Result<StatusCode, ApiError> {
    let token = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim)
        .unwrap_or_default();
    st.operators.logout(token).await?;
    Ok(StatusCode::NO_CONTENT)
}
