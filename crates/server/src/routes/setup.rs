//! Set-up endpoints: tenants (admin), stores, printers, stations and agent tokens (tenant).

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use onceprint_core::validate_id;
use onceprint_engine::transport::TransportConfig;
use onceprint_engine::{clock::now_ms, secrets, tz};
use onceprint_store::{NewAgentToken, NewPrinter, NewStation, NewStore, NewTenant, SetupAudit};

use crate::dto::*;
use crate::error::{ApiError, ErrorBody};
use crate::extract::{Admin, JsonBody, TenantAuth};
use crate::AppState;

fn check_name(field: &str, name: &str) -> Result<(), ApiError> {
    if name.trim().is_empty() || name.len() > 200 {
        return Err(ApiError::invalid(format!("{field}: must be 1–200 bytes")));
    }
    Ok(())
}

/// Create a tenant (merchant) and its API key.
#[utoipa::path(post, path = "/v1/tenants", tag = "set-up", request_body = CreateTenant,
    security(("admin" = [])),
    responses((status = 201, body = TenantCreated), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn create_tenant(
    State(st): State<AppState>,
    _admin: Admin,
    JsonBody(req): JsonBody<CreateTenant>,
) -> Result<(StatusCode, Json<TenantCreated>), ApiError> {
    validate_id("id", &req.id)?;
    check_name("name", &req.name)?;
    let api_key = secrets::generate("opk_");
    let t = st
        .store
        .create_tenant(NewTenant {
            api_key_id: format!("key_{}", &secrets::hash(&api_key)[..16]),
            id: req.id,
            name: req.name,
            api_key_hash: secrets::hash(&api_key),
            now: now_ms(),
            audit: SetupAudit { actor: "admin".into(), detail: serde_json::json!({}) },
        })
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(TenantCreated { id: t.id, name: t.name, api_key, created_at: rfc3339(t.created_at) }),
    ))
}

/// Create a store of the calling tenant.
#[utoipa::path(post, path = "/v1/stores", tag = "set-up", request_body = CreateStore,
    security(("tenant" = [])),
    responses((status = 201, body = StoreOut), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn create_store(
    State(st): State<AppState>,
    auth: TenantAuth,
    JsonBody(req): JsonBody<CreateStore>,
) -> Result<(StatusCode, Json<StoreOut>), ApiError> {
    validate_id("id", &req.id)?;
    check_name("name", &req.name)?;
    // Checked before anything is written; the canonical text is what the store keeps.
    let zone = tz::parse(req.timezone.as_deref().unwrap_or_default())?;
    let s = st
        .store
        .create_store(NewStore {
            audit: SetupAudit { actor: format!("api_key:{}", auth.key_id), detail: serde_json::json!({}) },
            tenant_id: auth.tenant_id,
            id: req.id,
            name: req.name,
            timezone: zone.name().to_owned(),
            now: now_ms(),
        })
        .await?;
    Ok((StatusCode::CREATED, Json(s.into())))
}

/// List the calling tenant's stores.
#[utoipa::path(get, path = "/v1/stores", tag = "set-up", security(("tenant" = [])),
    responses((status = 200, body = StoreList), (status = 401, body = ErrorBody)))]
pub async fn list_stores(State(st): State<AppState>, auth: TenantAuth) -> Result<Json<StoreList>, ApiError> {
    let stores = st.store.list_stores(&auth.tenant_id).await?;
    Ok(Json(StoreList { stores: stores.into_iter().map(Into::into).collect() }))
}

/// One store of the calling tenant.
#[utoipa::path(get, path = "/v1/stores/{id}", tag = "set-up", security(("tenant" = [])),
    params(("id" = String, Path)),
    responses((status = 200, body = StoreOut), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn get_store(
    State(st): State<AppState>,
    auth: TenantAuth,
    Path(id): Path<String>,
) -> Result<Json<StoreOut>, ApiError> {
    match st.store.get_store(&auth.tenant_id, &id).await? {
        Some(s) => Ok(Json(s.into())),
        None => Err(ApiError::not_found(format!("no store {id:?}"))),
    }
}

/// Register a printer, bound to one store of the calling tenant.
#[utoipa::path(post, path = "/v1/printers", tag = "set-up", request_body = CreatePrinter,
    security(("tenant" = [])),
    responses((status = 201, body = PrinterOut), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn create_printer(
    State(st): State<AppState>,
    auth: TenantAuth,
    JsonBody(req): JsonBody<CreatePrinter>,
) -> Result<(StatusCode, Json<PrinterOut>), ApiError> {
    validate_id("id", &req.id)?;
    validate_id("store_id", &req.store_id)?;
    let name = req.name.unwrap_or_else(|| req.id.clone());
    check_name("name", &name)?;
    let transport = TransportConfig::from_request(req.transport)?.to_stored_json();
    let p = st
        .store
        .create_printer(NewPrinter {
            audit: SetupAudit { actor: format!("api_key:{}", auth.key_id), detail: serde_json::json!({}) },
            tenant_id: auth.tenant_id,
            id: req.id,
            store_id: req.store_id,
            name,
            transport,
            now: now_ms(),
        })
        .await?;
    Ok((StatusCode::CREATED, Json(p.into())))
}

/// List the calling tenant's printers, optionally of one store.
#[utoipa::path(get, path = "/v1/printers", tag = "set-up", security(("tenant" = [])),
    params(PrinterListParams),
    responses((status = 200, body = PrinterList), (status = 401, body = ErrorBody)))]
pub async fn list_printers(
    State(st): State<AppState>,
    auth: TenantAuth,
    Query(q): Query<PrinterListParams>,
) -> Result<Json<PrinterList>, ApiError> {
    let printers = st.store.list_printers(&auth.tenant_id, q.store_id.as_deref()).await?;
    Ok(Json(PrinterList { printers: printers.into_iter().map(Into::into).collect() }))
}

/// One printer, with its `online`, `last_seen_at` and `last_error`.
#[utoipa::path(get, path = "/v1/printers/{id}", tag = "set-up", security(("tenant" = [])),
    params(("id" = String, Path)),
    responses((status = 200, body = PrinterOut), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn get_printer(
    State(st): State<AppState>,
    auth: TenantAuth,
    Path(id): Path<String>,
) -> Result<Json<PrinterOut>, ApiError> {
    match st.store.get_printer(&auth.tenant_id, &id).await? {
        Some(p) => Ok(Json(p.into())),
        None => Err(ApiError::not_found(format!("no printer {id:?}"))),
    }
}

/// Create a failover station: a primary printer and backups, all of one store.
#[utoipa::path(post, path = "/v1/stations", tag = "set-up", request_body = CreateStation,
    security(("tenant" = [])),
    responses((status = 201, body = StationOut), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn create_station(
    State(st): State<AppState>,
    auth: TenantAuth,
    JsonBody(req): JsonBody<CreateStation>,
) -> Result<(StatusCode, Json<StationOut>), ApiError> {
    validate_id("id", &req.id)?;
    validate_id("store_id", &req.store_id)?;
    if req.printers.is_empty() || req.printers.len() > 16 {
        return Err(ApiError::invalid("printers: give 1–16 printer ids, the primary first"));
    }
    if st.store.get_store(&auth.tenant_id, &req.store_id).await?.is_none() {
        return Err(ApiError::invalid(format!("store_id: no store {:?}", req.store_id)));
    }
    for (i, p) in req.printers.iter().enumerate() {
        validate_id(&format!("printers[{i}]"), p)?;
        if req.printers[..i].contains(p) {
            return Err(ApiError::invalid(format!("printers[{i}]: {p:?} is listed twice")));
        }
        match st.store.get_printer(&auth.tenant_id, p).await? {
            None => return Err(ApiError::invalid(format!("printers[{i}]: no printer {p:?}"))),
            Some(printer) if printer.store_id != req.store_id => {
                return Err(ApiError::invalid(format!(
                    "printers[{i}]: printer {p:?} belongs to store {:?}, not {:?}; a station's printers must all be in its store",
                    printer.store_id, req.store_id
                )))
            }
            Some(_) => {}
        }
    }
    let s = st
        .store
        .create_station(NewStation {
            audit: SetupAudit { actor: format!("api_key:{}", auth.key_id), detail: serde_json::json!({}) },
            tenant_id: auth.tenant_id,
            id: req.id,
            store_id: req.store_id,
            printers: req.printers,
            now: now_ms(),
        })
        .await?;
    Ok((StatusCode::CREATED, Json(s.into())))
}

/// One station.
#[utoipa::path(get, path = "/v1/stations/{id}", tag = "set-up", security(("tenant" = [])),
    params(("id" = String, Path)),
    responses((status = 200, body = StationOut), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn get_station(
    State(st): State<AppState>,
    auth: TenantAuth,
    Path(id): Path<String>,
) -> Result<Json<StationOut>, ApiError> {
    match st.store.get_station(&auth.tenant_id, &id).await? {
        Some(s) => Ok(Json(s.into())),
        None => Err(ApiError::not_found(format!("no station {id:?}"))),
    }
}

/// Issue a token for a store agent. The agent may only serve this store's printers.
#[utoipa::path(post, path = "/v1/stores/{id}/agent-tokens", tag = "set-up", security(("tenant" = [])),
    params(("id" = String, Path)),
    responses((status = 201, body = AgentTokenOut), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn create_agent_token(
    State(st): State<AppState>,
    auth: TenantAuth,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<AgentTokenOut>), ApiError> {
    if st.store.get_store(&auth.tenant_id, &id).await?.is_none() {
        return Err(ApiError::not_found(format!("no store {id:?}")));
    }
    let token = secrets::generate("opa_");
    st.store
        .create_agent_token(NewAgentToken {
            id: format!("tok_{}", &secrets::hash(&token)[..16]),
            audit: SetupAudit { actor: format!("api_key:{}", auth.key_id), detail: serde_json::json!({}) },
            token_hash: secrets::hash(&token),
            tenant_id: auth.tenant_id,
            store_id: id.clone(),
            now: now_ms(),
        })
        .await?;
    Ok((StatusCode::CREATED, Json(AgentTokenOut { token, store_id: id })))
}
