//! Operators and their API sessions: accounts created with the tenant's API
//! key, operator tokens obtained with an operator's own password, and revocation.

use axum::extract::State;

use crate::extract::Path;
use axum::http::StatusCode;
use axum::Json;
use onceprint_engine::operators::OperatorSpec;
use onceprint_engine::Creator;
use onceprint_store::SessionKind;

use crate::dto::{CreateOperator, OperatorList, OperatorLogin, OperatorOut, OperatorTokenOut, SessionsRevoked};
use crate::error::{ApiError, ErrorBody};
use crate::extract::{JsonBody, OperatorAuth, TenantAuth};
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
    Ok(Json(OperatorList { operators: operators.into_iter().map(Into::into).collect() }))
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

/// Logs an operator in for the API: answers an operator token (`opo_…`, shown once) to
/// send as `Authorization: Bearer` to the manual actions, the task reads, the attention
/// list and reconciliation. Wrong credentials are 401 (one answer for unknown tenant,
/// unknown operator and wrong password); after 5 failures of one operator within 15
/// minutes every attempt is 429 `too_many_requests` with `Retry-After` until the window
/// has passed.
#[utoipa::path(post, path = "/v1/operator-sessions", tag = "operators", request_body = OperatorLogin,
    responses((status = 201, body = OperatorTokenOut), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 429, body = ErrorBody)))]
pub async fn create_operator_session(
    State(st): State<AppState>,
    JsonBody(req): JsonBody<OperatorLogin>,
) -> Result<(StatusCode, Json<OperatorTokenOut>), ApiError> {
    let login = st.operators.login(&req.tenant_id, &req.operator_id, &req.password, SessionKind::Token).await?;
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
