//! The SQL of set-up changes on SQLite: editing, disabling and enabling printers, changing
//! stations, API keys and agent tokens with their revocation, and the set-up audit that
//! every set-up write records in its own transaction (the writer's savepoint).

use onceprint_core::Millis;
use onceprint_store::*;
use rusqlite::{params, Connection, OptionalExtension, Row};

use crate::sql::{get_printer, get_station};
use crate::{backend_err, constraint_err};

/// Writes one row of the set-up audit: `what` is the object kind, its id and the action.
pub fn audit(
    c: &Connection,
    tenant_id: &str,
    now: Millis,
    what: (SetupObject, &str, SetupAction),
    a: &SetupAudit,
) -> StoreResult<()> {
    let (object, object_id, action) = what;
    c.prepare_cached(
        "INSERT INTO setup_events (tenant_id, at, actor, object_kind, object_id, action, detail) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )
    .and_then(|mut s| {
        s.execute(params![tenant_id, now, a.actor, object.as_str(), object_id, action.as_str(), a.detail.to_string()])
    })
    .map(|_| ())
    .map_err(backend_err)
}

pub fn setup_events(c: &Connection, tenant_id: &str, limit: i64, before: Option<i64>) -> StoreResult<Vec<SetupEvent>> {
    let mut s = c
        .prepare_cached(
            "SELECT id, tenant_id, at, actor, object_kind, object_id, action, detail FROM setup_events \
             WHERE tenant_id = ?1 AND (?2 IS NULL OR id < ?2) ORDER BY id DESC LIMIT ?3",
        )
        .map_err(backend_err)?;
    let rows = s
        .query_map(params![tenant_id, before, limit], |r| {
            Ok((
                SetupEvent {
                    id: r.get(0)?,
                    tenant_id: r.get(1)?,
                    at: r.get(2)?,
                    actor: r.get(3)?,
                    object_kind: r.get(4)?,
                    object_id: r.get(5)?,
                    action: r.get(6)?,
                    detail: serde_json::Value::Null,
                },
                r.get::<_, String>(7)?,
            ))
        })
        .map_err(backend_err)?;
    rows.map(|row| {
        let (mut e, detail) = row.map_err(backend_err)?;
        e.detail = serde_json::from_str(&detail)
            .map_err(|err| StoreError::Backend(format!("setup event {}: detail is not JSON: {err}", e.id)))?;
        Ok(e)
    })
    .collect()
}

/// Checks that every printer of a station is the tenant's; the schema cannot reference
/// array elements, so the store keeps the invariant "a station names only its tenant's
/// printers" itself (the caller also checks that they are in the station's store).
pub fn check_station_printers(c: &Connection, tenant_id: &str, printers: &[String]) -> StoreResult<()> {
    for p in printers {
        let found: Option<i64> = c
            .prepare_cached("SELECT 1 FROM printers WHERE tenant_id = ?1 AND id = ?2")
            .and_then(|mut s| s.query_row([tenant_id, p], |r| r.get(0)).optional())
            .map_err(backend_err)?;
        if found.is_none() {
            return Err(StoreError::NotFound(format!("printer {p}")));
        }
    }
    Ok(())
}

pub fn update_printer(c: &Connection, u: &PrinterUpdate) -> StoreResult<Option<Printer>> {
    let changed = c
        .prepare_cached(
            "UPDATE printers SET name = ?1, transport = ?2 \
             WHERE tenant_id = ?3 AND id = ?4 AND name = ?5 AND transport = ?6",
        )
        .and_then(|mut s| {
            s.execute(params![u.name, u.transport, u.tenant_id, u.id, u.expected_name, u.expected_transport])
        })
        .map_err(backend_err)?;
    if changed == 0 {
        return Ok(None);
    }
    audit(c, &u.tenant_id, u.now, (SetupObject::Printer, &u.id, SetupAction::Update), &u.audit)?;
    get_printer(c, &u.tenant_id, &u.id)
}

pub fn set_printer_enabled(c: &Connection, u: &PrinterEnabled) -> StoreResult<Option<Printer>> {
    let Some(before) = get_printer(c, &u.tenant_id, &u.id)? else { return Ok(None) };
    if before.enabled == u.enabled {
        return Ok(Some(before));
    }
    c.prepare_cached("UPDATE printers SET enabled = ?1 WHERE tenant_id = ?2 AND id = ?3")
        .and_then(|mut s| s.execute(params![u.enabled, u.tenant_id, u.id]))
        .map_err(backend_err)?;
    let action = if u.enabled { SetupAction::Enable } else { SetupAction::Disable };
    audit(c, &u.tenant_id, u.now, (SetupObject::Printer, &u.id, action), &u.audit)?;
    Ok(Some(Printer { enabled: u.enabled, ..before }))
}

pub fn update_station(c: &Connection, u: &StationUpdate) -> StoreResult<Option<Station>> {
    let Some(before) = get_station(c, &u.tenant_id, &u.id)? else { return Ok(None) };
    if before.printers != u.expected_printers {
        return Ok(None);
    }
    check_station_printers(c, &u.tenant_id, &u.printers)?;
    let printers = serde_json::to_string(&u.printers).map_err(|e| StoreError::Backend(e.to_string()))?;
    c.prepare_cached("UPDATE stations SET printers = ?1, failover_after_ms = ?4 WHERE tenant_id = ?2 AND id = ?3")
        .and_then(|mut s| s.execute(params![printers, u.tenant_id, u.id, u.failover_after_ms]))
        .map_err(backend_err)?;
    audit(c, &u.tenant_id, u.now, (SetupObject::Station, &u.id, SetupAction::Update), &u.audit)?;
    Ok(Some(Station { printers: u.printers.clone(), failover_after_ms: u.failover_after_ms, ..before }))
}

/// Adds an API key row; the caller writes the audit (a tenant's first key is part of the
/// tenant's creation, a further key a change of its own).
pub fn insert_api_key(c: &Connection, tenant_id: &str, id: &str, key_hash: &str, now: Millis) -> StoreResult<()> {
    c.prepare_cached("INSERT INTO api_keys (tenant_id, id, key_hash, created_at) VALUES (?1, ?2, ?3, ?4)")
        .and_then(|mut s| s.execute(params![tenant_id, id, key_hash, now]))
        .map(|_| ())
        .map_err(|e| constraint_err(e, &format!("API key {id}"), &format!("tenant {tenant_id}")))
}

pub fn create_api_key(c: &Connection, k: &NewApiKey) -> StoreResult<ApiKey> {
    insert_api_key(c, &k.tenant_id, &k.id, &k.key_hash, k.now)?;
    audit(c, &k.tenant_id, k.now, (SetupObject::ApiKey, &k.id, SetupAction::Create), &k.audit)?;
    Ok(ApiKey { tenant_id: k.tenant_id.clone(), id: k.id.clone(), created_at: k.now, revoked_at: None })
}

fn api_key_from_row(r: &Row<'_>) -> rusqlite::Result<(ApiKey, String)> {
    Ok((ApiKey { tenant_id: r.get(0)?, id: r.get(1)?, created_at: r.get(2)?, revoked_at: r.get(3)? }, r.get(4)?))
}

pub fn list_api_keys(c: &Connection, tenant_id: &str) -> StoreResult<Vec<ApiKey>> {
    let mut s = c
        .prepare_cached(
            "SELECT tenant_id, id, created_at, revoked_at, key_hash FROM api_keys \
             WHERE tenant_id = ?1 ORDER BY created_at, id",
        )
        .map_err(backend_err)?;
    let rows = s.query_map([tenant_id], api_key_from_row).map_err(backend_err)?;
    rows.map(|r| r.map(|(k, _)| k).map_err(backend_err)).collect()
}

pub fn revoke_api_key(c: &Connection, r: &RevokeApiKey) -> StoreResult<KeyRevocation> {
    let found = c
        .prepare_cached(
            "SELECT tenant_id, id, created_at, revoked_at, key_hash FROM api_keys WHERE tenant_id = ?1 AND id = ?2",
        )
        .and_then(|mut s| s.query_row([&r.tenant_id, &r.id], api_key_from_row).optional())
        .map_err(backend_err)?;
    let Some((key, hash)) = found else { return Ok(KeyRevocation::NotFound) };
    if key.revoked_at.is_some() {
        return Ok(KeyRevocation::Revoked(Revoked { row: key, hash }));
    }
    // The single writer runs this check and the change without anyone in between.
    let others: i64 = c
        .prepare_cached("SELECT count(*) FROM api_keys WHERE tenant_id = ?1 AND id <> ?2 AND revoked_at IS NULL")
        .and_then(|mut s| s.query_row([&r.tenant_id, &r.id], |row| row.get(0)))
        .map_err(backend_err)?;
    if others == 0 {
        return Ok(KeyRevocation::LastActiveKey);
    }
    c.prepare_cached("UPDATE api_keys SET revoked_at = ?1 WHERE tenant_id = ?2 AND id = ?3")
        .and_then(|mut s| s.execute(params![r.now, r.tenant_id, r.id]))
        .map_err(backend_err)?;
    // A broker of the previous version still looks keys up in `tenants`; the column is
    // unique and required, so the revoked key's hash is made unmatchable rather than
    // removed.
    c.prepare_cached(
        "UPDATE tenants SET api_key_hash = 'revoked:' || api_key_hash WHERE id = ?1 AND api_key_hash = ?2",
    )
    .and_then(|mut s| s.execute([&r.tenant_id, &hash]))
    .map_err(backend_err)?;
    audit(c, &r.tenant_id, r.now, (SetupObject::ApiKey, &r.id, SetupAction::Revoke), &r.audit)?;
    Ok(KeyRevocation::Revoked(Revoked { row: ApiKey { revoked_at: Some(r.now), ..key }, hash }))
}

fn agent_token_from_row(r: &Row<'_>) -> rusqlite::Result<(AgentToken, String)> {
    Ok((
        AgentToken {
            tenant_id: r.get(0)?,
            store_id: r.get(1)?,
            id: r.get(2)?,
            created_at: r.get(3)?,
            revoked_at: r.get(4)?,
        },
        r.get(5)?,
    ))
}

pub fn list_agent_tokens(
    c: &Connection,
    tenant_id: &str,
    store_id: &str,
    kind: TokenKind,
) -> StoreResult<Vec<AgentToken>> {
    Ok(list_agent_token_rows(c, tenant_id, store_id, kind)?.into_iter().map(|(t, _)| t).collect())
}

pub fn active_token_hashes(
    c: &Connection,
    tenant_id: &str,
    store_id: &str,
    kind: TokenKind,
) -> StoreResult<Vec<TokenHash>> {
    Ok(list_agent_token_rows(c, tenant_id, store_id, kind)?
        .into_iter()
        .filter(|(t, _)| t.revoked_at.is_none())
        .map(|(t, hash)| TokenHash { id: t.id, hash })
        .collect())
}

fn list_agent_token_rows(
    c: &Connection,
    tenant_id: &str,
    store_id: &str,
    kind: TokenKind,
) -> StoreResult<Vec<(AgentToken, String)>> {
    let mut s = c
        .prepare_cached(
            "SELECT tenant_id, store_id, id, created_at, revoked_at, token_hash FROM agent_tokens \
             WHERE tenant_id = ?1 AND store_id = ?2 AND kind = ?3 ORDER BY created_at, id",
        )
        .map_err(backend_err)?;
    let rows = s.query_map([tenant_id, store_id, kind.as_str()], agent_token_from_row).map_err(backend_err)?;
    rows.map(|r| r.map_err(backend_err)).collect()
}

pub fn list_stations(c: &Connection, tenant_id: &str, store_id: &str) -> StoreResult<Vec<Station>> {
    let mut s = c
        .prepare_cached(
            "SELECT tenant_id, id, store_id, printers, created_at, failover_after_ms FROM stations \
             WHERE tenant_id = ?1 AND store_id = ?2 ORDER BY id",
        )
        .map_err(backend_err)?;
    let rows = s
        .query_map([tenant_id, store_id], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
                r.get(4)?,
                r.get(5)?,
            ))
        })
        .map_err(backend_err)?;
    let mut out = Vec::new();
    for row in rows {
        let (tenant_id, id, store_id, printers, created_at, failover_after_ms) = row.map_err(backend_err)?;
        let printers =
            serde_json::from_str(&printers).map_err(|e| StoreError::Backend(format!("station {id}: {e}")))?;
        out.push(Station { tenant_id, id, store_id, printers, failover_after_ms, created_at });
    }
    Ok(out)
}

pub fn revoke_agent_token(c: &Connection, r: &RevokeAgentToken) -> StoreResult<Option<Revoked<AgentToken>>> {
    let found = c
        .prepare_cached(
            "SELECT tenant_id, store_id, id, created_at, revoked_at, token_hash FROM agent_tokens \
             WHERE tenant_id = ?1 AND store_id = ?2 AND id = ?3 AND kind = ?4",
        )
        .and_then(|mut s| {
            s.query_row([r.tenant_id.as_str(), &r.store_id, &r.id, r.kind.as_str()], agent_token_from_row).optional()
        })
        .map_err(backend_err)?;
    let Some((token, hash)) = found else { return Ok(None) };
    if token.revoked_at.is_some() {
        return Ok(Some(Revoked { row: token, hash }));
    }
    c.prepare_cached("UPDATE agent_tokens SET revoked_at = ?1 WHERE token_hash = ?2")
        .and_then(|mut s| s.execute(params![r.now, hash]))
        .map_err(backend_err)?;
    audit(c, &r.tenant_id, r.now, (r.kind.setup_object(), &r.id, SetupAction::Revoke), &r.audit)?;
    Ok(Some(Revoked { row: AgentToken { revoked_at: Some(r.now), ..token }, hash }))
}

/// Writes a printer's login, replacing the one it had.
pub fn put_printer_secret(
    c: &Connection,
    tenant_id: &str,
    printer_id: &str,
    secret: &PrinterSecret,
    now: Millis,
) -> StoreResult<()> {
    c.prepare_cached(
        "INSERT INTO printer_credentials \
         (tenant_id, printer_id, username, secret_hash, created_at, mqtt_hash, ha1_md5, ha1_sha256) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) \
         ON CONFLICT (tenant_id, printer_id) DO UPDATE SET username = excluded.username, \
         secret_hash = excluded.secret_hash, created_at = excluded.created_at, mqtt_hash = excluded.mqtt_hash, \
         ha1_md5 = excluded.ha1_md5, ha1_sha256 = excluded.ha1_sha256",
    )
    .and_then(|mut s| {
        s.execute(params![
            tenant_id,
            printer_id,
            secret.username,
            secret.secret_hash,
            now,
            secret.mqtt_hash,
            secret.ha1_md5,
            secret.ha1_sha256
        ])
    })
    .map(|_| ())
    .map_err(|e| constraint_err(e, &format!("login {}", secret.username), &format!("printer {printer_id}")))
}

pub fn set_printer_secret(c: &Connection, change: &PrinterSecretChange) -> StoreResult<bool> {
    if get_printer(c, &change.tenant_id, &change.printer_id)?.is_none() {
        return Ok(false);
    }
    put_printer_secret(c, &change.tenant_id, &change.printer_id, &change.secret, change.now)?;
    audit(
        c,
        &change.tenant_id,
        change.now,
        (SetupObject::Printer, &change.printer_id, SetupAction::Rotate),
        &change.audit,
    )?;
    Ok(true)
}

pub fn printer_by_secret_hash(c: &Connection, secret_hash: &str) -> StoreResult<Option<PrinterCredential>> {
    c.prepare_cached("SELECT tenant_id, printer_id, username FROM printer_credentials WHERE secret_hash = ?1")
        .and_then(|mut s| {
            s.query_row([secret_hash], |r| {
                Ok(PrinterCredential { tenant_id: r.get(0)?, printer_id: r.get(1)?, username: r.get(2)? })
            })
            .optional()
        })
        .map_err(backend_err)
}

pub fn printer_login_by_username(c: &Connection, username: &str) -> StoreResult<Option<PrinterDigestLogin>> {
    c.prepare_cached(
        "SELECT tenant_id, printer_id, username, ha1_md5, ha1_sha256 FROM printer_credentials WHERE username = ?1",
    )
    .and_then(|mut s| {
        s.query_row([username], |r| {
            Ok(PrinterDigestLogin {
                tenant_id: r.get(0)?,
                printer_id: r.get(1)?,
                username: r.get(2)?,
                ha1_md5: r.get(3)?,
                ha1_sha256: r.get(4)?,
            })
        })
        .optional()
    })
    .map_err(backend_err)
}

pub fn mqtt_logins(c: &Connection) -> StoreResult<Vec<MqttLogin>> {
    c.prepare_cached(
        "SELECT tenant_id, printer_id, username, mqtt_hash FROM printer_credentials \
         WHERE mqtt_hash IS NOT NULL ORDER BY username",
    )
    .and_then(|mut s| {
        s.query_map([], |r| {
            Ok(MqttLogin { tenant_id: r.get(0)?, printer_id: r.get(1)?, username: r.get(2)?, mqtt_hash: r.get(3)? })
        })?
        .collect::<Result<Vec<_>, _>>()
    })
    .map_err(backend_err)
}
