//! Set-up endpoints: tenants (admin); stores, printers, stations, agent tokens, LAN keys, API keys
//! and the set-up audit (tenant). Every change goes through `onceprint_engine::Setup`,
//! which checks the input, writes the change with its audit row and makes the directory
//! forget the object; these handlers only parse, call and shape the answer.

use axum::extract::State;

use crate::extract::{Path, Query};
use axum::http::StatusCode;
use axum::Json;
use onceprint_engine::setup::{PrinterChange, PrinterSpec, Reason};
use onceprint_engine::Caller;

use crate::dto::*;
use crate::error::{ApiError, ErrorBody};
use crate::extract::{Admin, JsonBody, TenantAuth};
use crate::AppState;

impl TenantAuth {
    fn caller(&self) -> Caller<'_> {
        Caller::api_key(&self.tenant_id, &self.key_id)
    }
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
    let c = st.setup.create_tenant(req.id, req.name).await?;
    Ok((
        StatusCode::CREATED,
        Json(TenantCreated {
            id: c.tenant.id,
            name: c.tenant.name,
            api_key: c.api_key,
            api_key_id: c.api_key_id,
            created_at: rfc3339(c.tenant.created_at),
        }),
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
    let s = st.setup.create_store(auth.caller(), req.id, req.name, req.timezone.as_deref()).await?;
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
              (status = 401, body = ErrorBody),
              (status = 404, description = "`not_found`: `store_id` is not a store of the tenant", body = ErrorBody),
              (status = 409, body = ErrorBody)))]
pub async fn create_printer(
    State(st): State<AppState>,
    auth: TenantAuth,
    JsonBody(req): JsonBody<CreatePrinter>,
) -> Result<(StatusCode, Json<PrinterOut>), ApiError> {
    let mut transport = req.transport;
    integral::normalize(&mut transport);
    let spec = PrinterSpec { id: req.id, store_id: req.store_id, name: req.name, transport };
    let (p, login) = st.setup.create_printer(auth.caller(), spec).await?;
    let mut out = PrinterOut::from(p);
    out.credentials = login.map(Into::into);
    Ok((StatusCode::CREATED, Json(out)))
}

/// Give a printer that logs in to the broker (`cloudprnt`, `epson_sdp`, `mqtt`) a new
/// login: the answer shows it once; the old password stops working at once. Also the way
/// to give a login to a printer whose transport was changed to one of those kinds.
#[utoipa::path(post, path = "/v1/printers/{id}/credentials", tag = "set-up",
    security(("tenant" = [])), params(("id" = String, Path)),
    responses((status = 200, body = PrinterCredentialsOut), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody),
              (status = 404, description = "`not_found`: no such printer, or the printer has no login (only \
                  `cloudprnt`, `epson_sdp` and `mqtt` printers log in)", body = ErrorBody)))]
pub async fn rotate_printer_credentials(
    State(st): State<AppState>,
    auth: TenantAuth,
    Path(id): Path<String>,
) -> Result<Json<PrinterCredentialsOut>, ApiError> {
    Ok(Json(st.setup.rotate_printer_login(auth.caller(), &id).await?.into()))
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

/// One printer, with its `online`, `last_seen_at`, `last_error` and `enabled`.
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

/// Change a printer's `name` and/or `transport` (a whole transport object, checked like at
/// registration). The delivery in flight is not taken back and its ack applies as usual;
/// the next delivery goes by the new configuration. A printer cannot change store.
#[utoipa::path(patch, path = "/v1/printers/{id}", tag = "set-up", request_body = UpdatePrinter,
    security(("tenant" = [])), params(("id" = String, Path)),
    responses((status = 200, body = PrinterOut), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 404, description = "`not_found`: no such printer (in `store_id`, when given)", body = ErrorBody),
              (status = 409, description = "`conflict`: the printer kept changing under concurrent edits", body = ErrorBody)))]
pub async fn update_printer(
    State(st): State<AppState>,
    auth: TenantAuth,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<UpdatePrinter>,
) -> Result<Json<PrinterOut>, ApiError> {
    let mut transport = req.transport;
    transport.iter_mut().for_each(integral::normalize);
    let change = PrinterChange { name: req.name, transport, store_id: req.store_id };
    Ok(Json(st.setup.update_printer(auth.caller(), &id, change).await?.into()))
}

async fn switch(
    st: AppState,
    auth: TenantAuth,
    id: String,
    enabled: bool,
    req: SwitchIn,
) -> Result<Json<PrinterOut>, ApiError> {
    let why = Reason { operator: req.operator, reason: req.reason };
    Ok(Json(st.setup.set_printer_enabled(auth.caller(), &id, enabled, why).await?.into()))
}

/// Disable a printer: its lane is handed out to nobody. Waiting tasks stay waiting (and
/// can be transferred); the task in flight is not taken back and its ack still applies;
/// new submissions to it are refused with 409 `printer_disabled` (duplicates of existing
/// tasks are answered as before); stations send new tasks to their next enabled printer.
/// Disabling a disabled printer changes nothing.
#[utoipa::path(post, path = "/v1/printers/{id}/disable", tag = "set-up", request_body = SwitchIn,
    security(("tenant" = [])), params(("id" = String, Path)),
    responses((status = 200, body = PrinterOut), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 404, body = ErrorBody)))]
pub async fn disable_printer(
    State(st): State<AppState>,
    auth: TenantAuth,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<SwitchIn>,
) -> Result<Json<PrinterOut>, ApiError> {
    switch(st, auth, id, false, req).await
}

/// Enable a disabled printer: its lane moves again, waiting tasks first.
#[utoipa::path(post, path = "/v1/printers/{id}/enable", tag = "set-up", request_body = SwitchIn,
    security(("tenant" = [])), params(("id" = String, Path)),
    responses((status = 200, body = PrinterOut), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 404, body = ErrorBody)))]
pub async fn enable_printer(
    State(st): State<AppState>,
    auth: TenantAuth,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<SwitchIn>,
) -> Result<Json<PrinterOut>, ApiError> {
    switch(st, auth, id, true, req).await
}

/// Create a failover station: a primary printer and backups, all of one store.
#[utoipa::path(post, path = "/v1/stations", tag = "set-up", request_body = CreateStation,
    security(("tenant" = [])),
    responses((status = 201, body = StationOut), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody),
              (status = 404, description = "`not_found`: `store_id` is not a store of the tenant, or a printer is not \
                  one of that store's", body = ErrorBody),
              (status = 409, body = ErrorBody)))]
pub async fn create_station(
    State(st): State<AppState>,
    auth: TenantAuth,
    JsonBody(req): JsonBody<CreateStation>,
) -> Result<(StatusCode, Json<StationOut>), ApiError> {
    let s = st.setup.create_station(auth.caller(), req.id, req.store_id, req.printers, req.failover_after_ms).await?;
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

/// Replace a station's printers (primary first), checked like at creation, and/or set its
/// failover threshold. Tasks already created keep their printer.
#[utoipa::path(patch, path = "/v1/stations/{id}", tag = "set-up", request_body = UpdateStation,
    security(("tenant" = [])), params(("id" = String, Path)),
    responses((status = 200, body = StationOut), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 404, description = "`not_found`: no such station, or a printer is not one of the station's \
                  store's", body = ErrorBody),
              (status = 409, description = "`conflict`: the station kept changing under concurrent edits", body = ErrorBody)))]
pub async fn update_station(
    State(st): State<AppState>,
    auth: TenantAuth,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<UpdateStation>,
) -> Result<Json<StationOut>, ApiError> {
    Ok(Json(st.setup.update_station(auth.caller(), &id, req.printers, req.failover_after_ms).await?.into()))
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
    let (t, token) = st.setup.create_agent_token(auth.caller(), &id).await?;
    Ok((
        StatusCode::CREATED,
        Json(AgentTokenOut { id: t.id, token, store_id: t.store_id, created_at: rfc3339(t.created_at) }),
    ))
}

/// A store's agent tokens, active and revoked, oldest first (ids and times, never the
/// tokens).
#[utoipa::path(get, path = "/v1/stores/{id}/agent-tokens", tag = "set-up", security(("tenant" = [])),
    params(("id" = String, Path)),
    responses((status = 200, body = AgentTokenList), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn list_agent_tokens(
    State(st): State<AppState>,
    auth: TenantAuth,
    Path(id): Path<String>,
) -> Result<Json<AgentTokenList>, ApiError> {
    let tokens = st.setup.agent_tokens(auth.caller(), &id).await?;
    Ok(Json(AgentTokenList { tokens: tokens.into_iter().map(Into::into).collect() }))
}

/// Revoke an agent token: from the next request on it is refused with 401 (on other broker
/// nodes within 10 s). Deliveries the agent holds are not taken back: the same agent id
/// polling with a new token is offered them again, and one it never answers goes to a
/// person like any delivery of an agent that went away. Revoking a revoked token answers
/// it unchanged.
#[utoipa::path(delete, path = "/v1/stores/{id}/agent-tokens/{token_id}", tag = "set-up", security(("tenant" = [])),
    params(("id" = String, Path), ("token_id" = String, Path)),
    responses((status = 200, body = AgentTokenInfo), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn revoke_agent_token(
    State(st): State<AppState>,
    auth: TenantAuth,
    Path((id, token_id)): Path<(String, String)>,
) -> Result<Json<AgentTokenInfo>, ApiError> {
    Ok(Json(st.setup.revoke_agent_token(auth.caller(), &id, &token_id).await?.into()))
}

/// Extension: create a LAN key of the store (shown once). The shop's POS sends
/// it to the store agent's LAN listener (`agent --listen`), which checks it itself — also
/// while the broker is unreachable — from the hashes it fetches with
/// `GET /v1/agent/lan-keys`. A LAN key authenticates nothing at the broker. The body is
/// optional: `{"id"}` names the key (generated otherwise).
#[utoipa::path(post, path = "/v1/stores/{id}/lan-keys", tag = "set-up", security(("tenant" = [])),
    params(("id" = String, Path)), request_body(content = Option<CreateLanKey>),
    responses((status = 201, body = LanKeyOut), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 404, body = ErrorBody),
              (status = 409, description = "`conflict`: the id names another key or token of the tenant", body = ErrorBody)))]
pub async fn create_lan_key(
    State(st): State<AppState>,
    auth: TenantAuth,
    Path(id): Path<String>,
    crate::extract::JsonBytes(bytes): crate::extract::JsonBytes,
) -> Result<(StatusCode, Json<LanKeyOut>), ApiError> {
    // No body, only white space, or JSON `null` is a request without an id.
    let req: CreateLanKey = if bytes.iter().all(u8::is_ascii_whitespace) {
        CreateLanKey::default()
    } else {
        crate::extract::parse_json::<Option<CreateLanKey>>(&bytes)?.unwrap_or_default()
    };
    let (k, key) = st.setup.create_lan_key(auth.caller(), &id, req.id).await?;
    Ok((
        StatusCode::CREATED,
        Json(LanKeyOut { id: k.id, store_id: k.store_id, key, created_at: rfc3339(k.created_at) }),
    ))
}

/// Extension: a store's LAN keys, active and revoked, oldest first (ids and
/// times, never the keys or their hashes).
#[utoipa::path(get, path = "/v1/stores/{id}/lan-keys", tag = "set-up", security(("tenant" = [])),
    params(("id" = String, Path)),
    responses((status = 200, body = LanKeyList), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn list_lan_keys(
    State(st): State<AppState>,
    auth: TenantAuth,
    Path(id): Path<String>,
) -> Result<Json<LanKeyList>, ApiError> {
    let keys = st.setup.lan_keys(auth.caller(), &id).await?;
    Ok(Json(LanKeyList { keys: keys.into_iter().map(Into::into).collect() }))
}

/// Extension: revoke a LAN key. The store agent refuses it once it fetched the
/// store's keys again (`GET /v1/agent/lan-keys`), which it can only while the broker is
/// reachable. Revoking a revoked key answers it unchanged.
#[utoipa::path(delete, path = "/v1/stores/{id}/lan-keys/{key_id}", tag = "set-up", security(("tenant" = [])),
    params(("id" = String, Path), ("key_id" = String, Path)),
    responses((status = 200, body = LanKeyInfo), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn revoke_lan_key(
    State(st): State<AppState>,
    auth: TenantAuth,
    Path((id, key_id)): Path<(String, String)>,
) -> Result<Json<LanKeyInfo>, ApiError> {
    Ok(Json(st.setup.revoke_lan_key(auth.caller(), &id, &key_id).await?.into()))
}

/// Extension: the store agent that takes the store's LAN orders (it claimed the store's
/// LAN listener: one agent per store). While no agent holds it there is no listener to
/// show: 404, as for a store the tenant does not have.
#[utoipa::path(get, path = "/v1/stores/{id}/lan-listener", tag = "set-up", security(("tenant" = [])),
    params(("id" = String, Path)),
    responses((status = 200, body = crate::dto::LanListenerOut), (status = 401, body = ErrorBody),
              (status = 404, description = "`not_found`: no such store, or no agent holds its LAN listener",
                  body = ErrorBody)))]
pub async fn get_lan_listener(
    State(st): State<AppState>,
    auth: TenantAuth,
    Path(id): Path<String>,
) -> Result<Json<crate::dto::LanListenerOut>, ApiError> {
    let agent_id = st.setup.lan_listener(auth.caller(), &id).await?.ok_or_else(|| free_listener(&id))?;
    Ok(Json(crate::dto::LanListenerOut { store_id: id, agent_id: Some(agent_id) }))
}

/// The answer about a LAN listener no agent holds.
fn free_listener(store_id: &str) -> ApiError {
    ApiError::not_found(format!("no store agent holds the LAN listener of store {store_id:?}"))
}

/// Extension: frees the store's LAN listener so that another store agent may take it (a
/// shop PC replaced, say); answers the agent that held it. Stop that agent's listener
/// first: until it refreshes the store's set-up it still takes LAN orders, and if it asks
/// before the new one it takes the listener again. A listener already free is 404, as
/// after any deletion (a retried release changes nothing).
#[utoipa::path(delete, path = "/v1/stores/{id}/lan-listener", tag = "set-up", security(("tenant" = [])),
    params(("id" = String, Path)),
    responses((status = 200, body = crate::dto::LanListenerOut), (status = 401, body = ErrorBody),
              (status = 404, description = "`not_found`: no such store, or no agent holds its LAN listener",
                  body = ErrorBody)))]
pub async fn release_lan_listener(
    State(st): State<AppState>,
    auth: TenantAuth,
    Path(id): Path<String>,
) -> Result<Json<crate::dto::LanListenerOut>, ApiError> {
    let agent_id = st.setup.release_lan_listener(auth.caller(), &id).await?.ok_or_else(|| free_listener(&id))?;
    Ok(Json(crate::dto::LanListenerOut { store_id: id, agent_id: Some(agent_id) }))
}

/// Create another API key of the calling tenant (shown once).
#[utoipa::path(post, path = "/v1/api-keys", tag = "set-up", security(("tenant" = [])),
    responses((status = 201, body = ApiKeyCreated), (status = 401, body = ErrorBody)))]
pub async fn create_api_key(
    State(st): State<AppState>,
    auth: TenantAuth,
) -> Result<(StatusCode, Json<ApiKeyCreated>), ApiError> {
    let (k, api_key) = st.setup.create_api_key(auth.caller()).await?;
    Ok((StatusCode::CREATED, Json(ApiKeyCreated { id: k.id, api_key, created_at: rfc3339(k.created_at) })))
}

/// The calling tenant's API keys, active and revoked, oldest first (never the keys).
#[utoipa::path(get, path = "/v1/api-keys", tag = "set-up", security(("tenant" = [])),
    responses((status = 200, body = ApiKeyList), (status = 401, body = ErrorBody)))]
pub async fn list_api_keys(State(st): State<AppState>, auth: TenantAuth) -> Result<Json<ApiKeyList>, ApiError> {
    let keys = st.setup.api_keys(auth.caller()).await?;
    Ok(Json(ApiKeyList { api_keys: keys.into_iter().map(Into::into).collect() }))
}

/// Revoke an API key (the one calling included): from the next request on it is refused
/// with 401 (on other broker nodes within 10 s). The last active key cannot be revoked
/// (409 `last_api_key`), so a tenant cannot lock itself out. Revoking a revoked key
/// answers it unchanged.
#[utoipa::path(delete, path = "/v1/api-keys/{id}", tag = "set-up", security(("tenant" = [])),
    params(("id" = String, Path)),
    responses((status = 200, body = ApiKeyOut), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 409, description = "`last_api_key`", body = ErrorBody)))]
pub async fn revoke_api_key(
    State(st): State<AppState>,
    auth: TenantAuth,
    Path(id): Path<String>,
) -> Result<Json<ApiKeyOut>, ApiError> {
    Ok(Json(st.setup.revoke_api_key(auth.caller(), &id).await?.into()))
}

/// The calling tenant's set-up changes, newest first: who (`admin`, `api_key:ID`), what
/// object, what action, and a detail that never holds a secret.
#[utoipa::path(get, path = "/v1/setup-events", tag = "set-up", security(("tenant" = [])),
    params(SetupEventParams),
    responses((status = 200, body = SetupEventList), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)))]
pub async fn setup_events(
    State(st): State<AppState>,
    auth: TenantAuth,
    Query(q): Query<SetupEventParams>,
) -> Result<Json<SetupEventList>, ApiError> {
    let page = st.setup.events(auth.caller(), q.limit, q.cursor.as_deref()).await?;
    Ok(Json(SetupEventList {
        events: page.events.into_iter().map(Into::into).collect(),
        next_cursor: page.next_cursor,
    }))
}
