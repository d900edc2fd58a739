//! Set-up writes on PostgreSQL: tenants with their first API key, stores, printers (created,
//! edited, disabled and enabled), stations (created and changed), API keys and agent tokens
//! with their revocation, and the set-up audit.
//!
//! Every write is one transaction that also inserts its row of `setup_events`, so a change
//! without its audit row (or the other way round) can never be committed. Edits are
//! compare-and-sets on what the caller read, so that the audit's "before" is what was
//! really replaced; revocations of a tenant's API keys lock the tenant row, so that two
//! concurrent revocations cannot both see "another key is still active" and revoke the
//! last two.

use deadpool_postgres::GenericClient;
use onceprint_core::Millis;
use onceprint_store::*;

use crate::error::pg_error;
use crate::rows::{self, PRINTER_COLUMNS, STORE_COLUMNS};
use crate::{create_error, PostgresStore};

const STATION_COLUMNS: &str = "tenant_id, id, store_id, printers, created_at, failover_after_ms";
const API_KEY_COLUMNS: &str = "tenant_id, id, created_at, revoked_at, key_hash";
const AGENT_TOKEN_COLUMNS: &str = "tenant_id, store_id, id, created_at, revoked_at, token_hash";

/// Writes one row of the set-up audit: `what` is the object kind, its id and the action.
pub(crate) async fn audit<C: GenericClient>(
    c: &C,
    tenant_id: &str,
    now: Millis,
    what: (SetupObject, &str, SetupAction),
    a: &SetupAudit,
) -> StoreResult<()> {
    let (object, object_id, action) = what;
    let stmt = c
        .prepare_cached(
            "INSERT INTO setup_events (tenant_id, at, actor, object_kind, object_id, action, detail)
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .await
        .map_err(pg_error)?;
    c.execute(
        &stmt,
        &[&tenant_id, &now, &a.actor, &object.as_str(), &object_id, &action.as_str(), &a.detail.to_string()],
    )
    .await
    .map_err(pg_error)?;
    Ok(())
}

fn api_key(row: &tokio_postgres::Row) -> StoreResult<(ApiKey, String)> {
    Ok((
        ApiKey {
            tenant_id: rows::col(row, 0)?,
            id: rows::col(row, 1)?,
            created_at: rows::col(row, 2)?,
            revoked_at: rows::col(row, 3)?,
        },
        rows::col(row, 4)?,
    ))
}

fn agent_token(row: &tokio_postgres::Row) -> StoreResult<(AgentToken, String)> {
    Ok((
        AgentToken {
            tenant_id: rows::col(row, 0)?,
            store_id: rows::col(row, 1)?,
            id: rows::col(row, 2)?,
            created_at: rows::col(row, 3)?,
            revoked_at: rows::col(row, 4)?,
        },
        rows::col(row, 5)?,
    ))
}

async fn insert_api_key<C: GenericClient>(
    c: &C,
    tenant_id: &str,
    id: &str,
    hash: &str,
    now: Millis,
) -> StoreResult<()> {
    let stmt = c
        .prepare_cached("INSERT INTO api_keys (tenant_id, id, key_hash, created_at) VALUES ($1, $2, $3, $4)")
        .await
        .map_err(pg_error)?;
    c.execute(&stmt, &[&tenant_id, &id, &hash, &now]).await.map_err(|e| {
        create_error(
            e,
            |constraint| {
                // The hash must never appear in a message, only the fact.
                if constraint == "api_keys_key_hash_key" {
                    "an API key with this hash".to_owned()
                } else {
                    format!("API key {id}")
                }
            },
            |_| format!("tenant {tenant_id}"),
        )
    })?;
    Ok(())
}

/// Checks, under a key-share lock that keeps them from going away before the commit, that
/// every printer of a station is the tenant's: the schema cannot reference array elements.
async fn check_station_printers<C: GenericClient>(c: &C, tenant_id: &str, printers: &[String]) -> StoreResult<()> {
    let stmt = c
        .prepare_cached("SELECT id FROM printers WHERE tenant_id = $1 AND id = ANY($2::text[]) FOR KEY SHARE")
        .await
        .map_err(pg_error)?;
    let found = c.query(&stmt, &[&tenant_id, &printers]).await.map_err(pg_error)?;
    let found: Vec<&str> = found.iter().map(|r| rows::col(r, 0)).collect::<StoreResult<_>>()?;
    if let Some(missing) = printers.iter().find(|p| !found.contains(&p.as_str())) {
        return Err(StoreError::NotFound(format!("printer {missing}")));
    }
    Ok(())
}

impl PostgresStore {
    pub(crate) async fn setup_create_tenant(&self, t: NewTenant) -> StoreResult<Tenant> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_error)?;
        let stmt = tx
            .prepare_cached(
                "INSERT INTO tenants (id, name, api_key_hash, created_at) VALUES ($1, $2, $3, $4)
                 RETURNING id, name, created_at",
            )
            .await
            .map_err(pg_error)?;
        let row = tx.query_one(&stmt, &[&t.id, &t.name, &t.api_key_hash, &t.now]).await.map_err(|e| {
            create_error(
                e,
                |constraint| {
                    if constraint == "tenants_api_key_hash_key" {
                        "a tenant with this API key".to_owned()
                    } else {
                        format!("tenant {}", t.id)
                    }
                },
                |_| format!("tenant {}", t.id),
            )
        })?;
        let tenant = rows::tenant(&row)?;
        insert_api_key(&tx, &t.id, &t.api_key_id, &t.api_key_hash, t.now).await?;
        audit(&tx, &t.id, t.now, (SetupObject::Tenant, &t.id, SetupAction::Create), &t.audit).await?;
        tx.commit().await.map_err(pg_error)?;
        Ok(tenant)
    }

    pub(crate) async fn setup_create_store(&self, s: NewStore) -> StoreResult<StoreRow> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_error)?;
        let stmt = tx
            .prepare_cached(&format!(
                "INSERT INTO stores (tenant_id, id, name, timezone, created_at)
                 VALUES ($1, $2, $3, $4, $5) RETURNING {STORE_COLUMNS}"
            ))
            .await
            .map_err(pg_error)?;
        let row = tx
            .query_one(&stmt, &[&s.tenant_id, &s.id, &s.name, &s.timezone, &s.now])
            .await
            .map_err(|e| create_error(e, |_| format!("store {}", s.id), |_| format!("tenant {}", s.tenant_id)))?;
        let created = rows::store(&row)?;
        audit(&tx, &s.tenant_id, s.now, (SetupObject::Store, &s.id, SetupAction::Create), &s.audit).await?;
        tx.commit().await.map_err(pg_error)?;
        Ok(created)
    }

    pub(crate) async fn setup_create_printer(&self, p: NewPrinter) -> StoreResult<Printer> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_error)?;
        let stmt = tx
            .prepare_cached(&format!(
                "INSERT INTO printers (tenant_id, id, store_id, name, transport, created_at)
                 VALUES ($1, $2, $3, $4, $5, $6) RETURNING {PRINTER_COLUMNS}"
            ))
            .await
            .map_err(pg_error)?;
        let row = tx
            .query_one(&stmt, &[&p.tenant_id, &p.id, &p.store_id, &p.name, &p.transport, &p.now])
            .await
            .map_err(|e| create_error(e, |_| format!("printer {}", p.id), |_| format!("store {}", p.store_id)))?;
        let created = rows::printer(&row)?;
        if let Some(secret) = &p.credential {
            put_printer_secret(&tx, &p.tenant_id, &p.id, secret, p.now).await?;
        }
        audit(&tx, &p.tenant_id, p.now, (SetupObject::Printer, &p.id, SetupAction::Create), &p.audit).await?;
        tx.commit().await.map_err(pg_error)?;
        Ok(created)
    }

    pub(crate) async fn setup_set_printer_secret(&self, change: PrinterSecretChange) -> StoreResult<bool> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_error)?;
        let stmt = tx
            .prepare_cached("SELECT 1 FROM printers WHERE tenant_id = $1 AND id = $2 FOR NO KEY UPDATE")
            .await
            .map_err(pg_error)?;
        if tx.query_opt(&stmt, &[&change.tenant_id, &change.printer_id]).await.map_err(pg_error)?.is_none() {
            return Ok(false);
        }
        put_printer_secret(&tx, &change.tenant_id, &change.printer_id, &change.secret, change.now).await?;
        audit(
            &tx,
            &change.tenant_id,
            change.now,
            (SetupObject::Printer, &change.printer_id, SetupAction::Rotate),
            &change.audit,
        )
        .await?;
        tx.commit().await.map_err(pg_error)?;
        Ok(true)
    }

    pub(crate) async fn setup_mqtt_logins(&self) -> StoreResult<Vec<MqttLogin>> {
        self.query(
            "SELECT tenant_id, printer_id, username, mqtt_hash FROM printer_credentials
             WHERE mqtt_hash IS NOT NULL ORDER BY username",
            &[],
        )
        .await?
        .iter()
        .map(|r| {
            Ok(MqttLogin {
                tenant_id: rows::col(r, 0)?,
                printer_id: rows::col(r, 1)?,
                username: rows::col(r, 2)?,
                mqtt_hash: rows::col(r, 3)?,
            })
        })
        .collect()
    }

    pub(crate) async fn setup_printer_by_secret_hash(
        &self,
        secret_hash: &str,
    ) -> StoreResult<Option<PrinterCredential>> {
        let row = self
            .query_opt(
                "SELECT tenant_id, printer_id, username FROM printer_credentials WHERE secret_hash = $1",
                &[&secret_hash],
            )
            .await?;
        match row {
            Some(r) => Ok(Some(PrinterCredential {
                tenant_id: rows::col(&r, 0)?,
                printer_id: rows::col(&r, 1)?,
                username: rows::col(&r, 2)?,
            })),
            None => Ok(None),
        }
    }

    pub(crate) async fn setup_printer_login_by_username(
        &self,
        username: &str,
    ) -> StoreResult<Option<PrinterDigestLogin>> {
        let row = self
            .query_opt(
                "SELECT tenant_id, printer_id, username, ha1_md5, ha1_sha256 FROM printer_credentials
                 WHERE username = $1",
                &[&username],
            )
            .await?;
        match row {
            Some(r) => Ok(Some(PrinterDigestLogin {
                tenant_id: rows::col(&r, 0)?,
                printer_id: rows::col(&r, 1)?,
                username: rows::col(&r, 2)?,
                ha1_md5: rows::col(&r, 3)?,
                ha1_sha256: rows::col(&r, 4)?,
            })),
            None => Ok(None),
        }
    }

    pub(crate) async fn setup_update_printer(&self, u: PrinterUpdate) -> StoreResult<Option<Printer>> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_error)?;
        let stmt = tx
            .prepare_cached(&format!(
                "UPDATE printers SET name = $1, transport = $2
                 WHERE tenant_id = $3 AND id = $4 AND name = $5 AND transport = $6
                 RETURNING {PRINTER_COLUMNS}"
            ))
            .await
            .map_err(pg_error)?;
        let row = tx
            .query_opt(&stmt, &[&u.name, &u.transport, &u.tenant_id, &u.id, &u.expected_name, &u.expected_transport])
            .await
            .map_err(pg_error)?;
        let Some(row) = row else { return Ok(None) };
        let changed = rows::printer(&row)?;
        audit(&tx, &u.tenant_id, u.now, (SetupObject::Printer, &u.id, SetupAction::Update), &u.audit).await?;
        tx.commit().await.map_err(pg_error)?;
        Ok(Some(changed))
    }

    pub(crate) async fn setup_set_printer_enabled(&self, u: PrinterEnabled) -> StoreResult<Option<Printer>> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_error)?;
        // Locked, so that of two concurrent flips only the first writes an audit row.
        let stmt = tx
            .prepare_cached(&format!(
                "SELECT {PRINTER_COLUMNS} FROM printers WHERE tenant_id = $1 AND id = $2 FOR NO KEY UPDATE"
            ))
            .await
            .map_err(pg_error)?;
        let Some(row) = tx.query_opt(&stmt, &[&u.tenant_id, &u.id]).await.map_err(pg_error)? else {
            return Ok(None);
        };
        let before = rows::printer(&row)?;
        if before.enabled == u.enabled {
            return Ok(Some(before));
        }
        let stmt = tx
            .prepare_cached("UPDATE printers SET enabled = $1 WHERE tenant_id = $2 AND id = $3")
            .await
            .map_err(pg_error)?;
        tx.execute(&stmt, &[&u.enabled, &u.tenant_id, &u.id]).await.map_err(pg_error)?;
        let action = if u.enabled { SetupAction::Enable } else { SetupAction::Disable };
        audit(&tx, &u.tenant_id, u.now, (SetupObject::Printer, &u.id, action), &u.audit).await?;
        tx.commit().await.map_err(pg_error)?;
        Ok(Some(Printer { enabled: u.enabled, ..before }))
    }

    pub(crate) async fn setup_create_station(&self, s: NewStation) -> StoreResult<Station> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_error)?;
        check_station_printers(&tx, &s.tenant_id, &s.printers).await?;
        let stmt = tx
            .prepare_cached(&format!(
                "INSERT INTO stations (tenant_id, id, store_id, printers, created_at, failover_after_ms)
                 VALUES ($1, $2, $3, $4, $5, $6)
                 RETURNING {STATION_COLUMNS}"
            ))
            .await
            .map_err(pg_error)?;
        let row = tx
            .query_one(&stmt, &[&s.tenant_id, &s.id, &s.store_id, &s.printers, &s.now, &s.failover_after_ms])
            .await
            .map_err(|e| create_error(e, |_| format!("station {}", s.id), |_| format!("store {}", s.store_id)))?;
        let created = rows::station(&row)?;
        audit(&tx, &s.tenant_id, s.now, (SetupObject::Station, &s.id, SetupAction::Create), &s.audit).await?;
        tx.commit().await.map_err(pg_error)?;
        Ok(created)
    }

    pub(crate) async fn setup_update_station(&self, u: StationUpdate) -> StoreResult<Option<Station>> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_error)?;
        let stmt = tx
            .prepare_cached(&format!(
                "UPDATE stations SET printers = $3, failover_after_ms = $5
                 WHERE tenant_id = $1 AND id = $2 AND printers = $4
                 RETURNING {STATION_COLUMNS}"
            ))
            .await
            .map_err(pg_error)?;
        let row = tx
            .query_opt(&stmt, &[&u.tenant_id, &u.id, &u.printers, &u.expected_printers, &u.failover_after_ms])
            .await
            .map_err(pg_error)?;
        let Some(row) = row else { return Ok(None) };
        let changed = rows::station(&row)?;
        check_station_printers(&tx, &u.tenant_id, &u.printers).await?;
        audit(&tx, &u.tenant_id, u.now, (SetupObject::Station, &u.id, SetupAction::Update), &u.audit).await?;
        tx.commit().await.map_err(pg_error)?;
        Ok(Some(changed))
    }

    pub(crate) async fn setup_create_agent_token(&self, t: NewAgentToken) -> StoreResult<AgentToken> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_error)?;
        let stmt = tx
            .prepare_cached(
                "INSERT INTO agent_tokens (token_hash, tenant_id, store_id, created_at, id, kind)
                 VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .await
            .map_err(pg_error)?;
        let what = match t.kind {
            TokenKind::Agent => "agent token",
            TokenKind::Lan => "LAN key",
        };
        tx.execute(&stmt, &[&t.token_hash, &t.tenant_id, &t.store_id, &t.now, &t.id, &t.kind.as_str()])
            .await
            .map_err(|e| create_error(e, |_| format!("{what} {}", t.id), |_| format!("store {}", t.store_id)))?;
        audit(&tx, &t.tenant_id, t.now, (t.kind.setup_object(), &t.id, SetupAction::Create), &t.audit).await?;
        tx.commit().await.map_err(pg_error)?;
        Ok(AgentToken { tenant_id: t.tenant_id, store_id: t.store_id, id: t.id, created_at: t.now, revoked_at: None })
    }

    /// A store's tokens of one kind with their stored hashes, oldest first.
    pub(crate) async fn setup_list_agent_tokens(
        &self,
        tenant_id: &str,
        store_id: &str,
        kind: TokenKind,
    ) -> StoreResult<Vec<(AgentToken, String)>> {
        self.query(
            &format!(
                "SELECT {AGENT_TOKEN_COLUMNS} FROM agent_tokens WHERE tenant_id = $1 AND store_id = $2 AND kind = $3
                 ORDER BY created_at, id"
            ),
            &[&tenant_id, &store_id, &kind.as_str()],
        )
        .await?
        .iter()
        .map(agent_token)
        .collect()
    }

    pub(crate) async fn setup_revoke_agent_token(
        &self,
        r: RevokeAgentToken,
    ) -> StoreResult<Option<Revoked<AgentToken>>> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_error)?;
        let stmt = tx
            .prepare_cached(&format!(
                "SELECT {AGENT_TOKEN_COLUMNS} FROM agent_tokens WHERE tenant_id = $1 AND store_id = $2 AND id = $3
                 AND kind = $4 FOR UPDATE"
            ))
            .await
            .map_err(pg_error)?;
        let found = tx.query_opt(&stmt, &[&r.tenant_id, &r.store_id, &r.id, &r.kind.as_str()]).await;
        let Some(row) = found.map_err(pg_error)? else {
            return Ok(None);
        };
        let (token, hash) = agent_token(&row)?;
        if token.revoked_at.is_some() {
            return Ok(Some(Revoked { row: token, hash }));
        }
        let stmt = tx
            .prepare_cached("UPDATE agent_tokens SET revoked_at = $1 WHERE token_hash = $2")
            .await
            .map_err(pg_error)?;
        tx.execute(&stmt, &[&r.now, &hash]).await.map_err(pg_error)?;
        audit(&tx, &r.tenant_id, r.now, (r.kind.setup_object(), &r.id, SetupAction::Revoke), &r.audit).await?;
        tx.commit().await.map_err(pg_error)?;
        Ok(Some(Revoked { row: AgentToken { revoked_at: Some(r.now), ..token }, hash }))
    }

    pub(crate) async fn setup_tenant_by_key_hash(&self, hash: &str) -> StoreResult<Option<TenantKey>> {
        let row = self
            .query_opt(
                "SELECT t.id, t.name, t.created_at, k.id FROM api_keys k JOIN tenants t ON t.id = k.tenant_id
                 WHERE k.key_hash = $1 AND k.revoked_at IS NULL",
                &[&hash],
            )
            .await?;
        row.map(|r| Ok(TenantKey { tenant: rows::tenant(&r)?, key_id: rows::col(&r, 3)? })).transpose()
    }

    pub(crate) async fn setup_create_api_key(&self, k: NewApiKey) -> StoreResult<ApiKey> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_error)?;
        insert_api_key(&tx, &k.tenant_id, &k.id, &k.key_hash, k.now).await?;
        audit(&tx, &k.tenant_id, k.now, (SetupObject::ApiKey, &k.id, SetupAction::Create), &k.audit).await?;
        tx.commit().await.map_err(pg_error)?;
        Ok(ApiKey { tenant_id: k.tenant_id, id: k.id, created_at: k.now, revoked_at: None })
    }

    pub(crate) async fn setup_list_api_keys(&self, tenant_id: &str) -> StoreResult<Vec<ApiKey>> {
        self.query(
            &format!("SELECT {API_KEY_COLUMNS} FROM api_keys WHERE tenant_id = $1 ORDER BY created_at, id"),
            &[&tenant_id],
        )
        .await?
        .iter()
        .map(|r| api_key(r).map(|(k, _)| k))
        .collect()
    }

    pub(crate) async fn setup_revoke_api_key(&self, r: RevokeApiKey) -> StoreResult<KeyRevocation> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_error)?;
        // One revocation of the tenant's keys at a time (see the module comment).
        let stmt = tx.prepare_cached("SELECT 1 FROM tenants WHERE id = $1 FOR UPDATE").await.map_err(pg_error)?;
        if tx.query_opt(&stmt, &[&r.tenant_id]).await.map_err(pg_error)?.is_none() {
            return Ok(KeyRevocation::NotFound);
        }
        let stmt = tx
            .prepare_cached(&format!("SELECT {API_KEY_COLUMNS} FROM api_keys WHERE tenant_id = $1 AND id = $2"))
            .await
            .map_err(pg_error)?;
        let Some(row) = tx.query_opt(&stmt, &[&r.tenant_id, &r.id]).await.map_err(pg_error)? else {
            return Ok(KeyRevocation::NotFound);
        };
        let (key, hash) = api_key(&row)?;
        if key.revoked_at.is_some() {
            return Ok(KeyRevocation::Revoked(Revoked { row: key, hash }));
        }
        let stmt = tx
            .prepare_cached("SELECT count(*) FROM api_keys WHERE tenant_id = $1 AND id <> $2 AND revoked_at IS NULL")
            .await
            .map_err(pg_error)?;
        let others: i64 = rows::col(&tx.query_one(&stmt, &[&r.tenant_id, &r.id]).await.map_err(pg_error)?, 0)?;
        if others == 0 {
            return Ok(KeyRevocation::LastActiveKey);
        }
        let stmt = tx
            .prepare_cached("UPDATE api_keys SET revoked_at = $1 WHERE tenant_id = $2 AND id = $3")
            .await
            .map_err(pg_error)?;
        tx.execute(&stmt, &[&r.now, &r.tenant_id, &r.id]).await.map_err(pg_error)?;
        // A broker of the previous version still looks keys up in `tenants`; the column is
        // unique and required, so the revoked key's hash is made unmatchable rather than
        // removed.
        let stmt = tx
            .prepare_cached(
                "UPDATE tenants SET api_key_hash = 'revoked:' || api_key_hash WHERE id = $1 AND api_key_hash = $2",
            )
            .await
            .map_err(pg_error)?;
        tx.execute(&stmt, &[&r.tenant_id, &hash]).await.map_err(pg_error)?;
        audit(&tx, &r.tenant_id, r.now, (SetupObject::ApiKey, &r.id, SetupAction::Revoke), &r.audit).await?;
        tx.commit().await.map_err(pg_error)?;
        Ok(KeyRevocation::Revoked(Revoked { row: ApiKey { revoked_at: Some(r.now), ..key }, hash }))
    }

    pub(crate) async fn setup_events_page(
        &self,
        tenant_id: &str,
        limit: i64,
        before: Option<i64>,
    ) -> StoreResult<Vec<SetupEvent>> {
        // Two statements rather than `$2 IS NULL OR id < $2`, so that each gets a plan that
        // reads the (tenant_id, id) index backwards and stops after `limit` rows.
        let cols = "id, tenant_id, at, actor, object_kind, object_id, action, detail";
        let limit = limit.max(0);
        let found = match before {
            Some(before) => {
                self.query(
                    &format!(
                        "SELECT {cols} FROM setup_events WHERE tenant_id = $1 AND id < $2 ORDER BY id DESC LIMIT $3"
                    ),
                    &[&tenant_id, &before, &limit],
                )
                .await?
            }
            None => {
                self.query(
                    &format!("SELECT {cols} FROM setup_events WHERE tenant_id = $1 ORDER BY id DESC LIMIT $2"),
                    &[&tenant_id, &limit],
                )
                .await?
            }
        };
        found
            .iter()
            .map(|r| {
                let id: i64 = rows::col(r, 0)?;
                let detail: String = rows::col(r, 7)?;
                Ok(SetupEvent {
                    id,
                    tenant_id: rows::col(r, 1)?,
                    at: rows::col(r, 2)?,
                    actor: rows::col(r, 3)?,
                    object_kind: rows::col(r, 4)?,
                    object_id: rows::col(r, 5)?,
                    action: rows::col(r, 6)?,
                    detail: serde_json::from_str(&detail)
                        .map_err(|e| StoreError::Backend(format!("setup event {id}: detail is not JSON: {e}")))?,
                })
            })
            .collect()
    }
}

/// Writes a printer's login, replacing the one it had.
async fn put_printer_secret<C: GenericClient>(
    tx: &C,
    tenant_id: &str,
    printer_id: &str,
    secret: &PrinterSecret,
    now: Millis,
) -> StoreResult<()> {
    let stmt = tx
        .prepare_cached(
            "INSERT INTO printer_credentials
             (tenant_id, printer_id, username, secret_hash, created_at, mqtt_hash, ha1_md5, ha1_sha256)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
             ON CONFLICT (tenant_id, printer_id) DO UPDATE SET username = EXCLUDED.username,
             secret_hash = EXCLUDED.secret_hash, created_at = EXCLUDED.created_at, mqtt_hash = EXCLUDED.mqtt_hash,
             ha1_md5 = EXCLUDED.ha1_md5, ha1_sha256 = EXCLUDED.ha1_sha256",
        )
        .await
        .map_err(pg_error)?;
    tx.execute(
        &stmt,
        &[
            &tenant_id,
            &printer_id,
            &secret.username,
            &secret.secret_hash,
            &now,
            &secret.mqtt_hash,
            &secret.ha1_md5,
            &secret.ha1_sha256,
        ],
    )
    .await
    .map_err(|e| create_error(e, |_| format!("login {}", secret.username), |_| format!("printer {printer_id}")))?;
    Ok(())
}
