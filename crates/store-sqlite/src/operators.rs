//! The SQL of operators and their sessions on SQLite: accounts with their
//! argon2id password hashes, login sessions and operator tokens (only their SHA-256), and
//! revocation. Creating an operator and revoking an operator's sessions are set-up
//! changes and write their audit row in the same savepoint.

use onceprint_core::Millis;
use onceprint_store::*;
use rusqlite::{params, Connection, OptionalExtension, Row};

use crate::setup::audit;
use crate::{backend_err, constraint_err};

const OPERATOR_COLUMNS: &str = "o.tenant_id, o.id, o.name, o.role, o.stores, o.created_at, o.disabled_at";
/// How many columns [`OPERATOR_COLUMNS`] names.
const OPERATOR_WIDTH: usize = 7;

/// An operator from the seven columns of [`OPERATOR_COLUMNS`] starting at `at`.
fn operator(r: &Row, at: usize) -> rusqlite::Result<Operator> {
    let role: String = r.get(at + 3)?;
    let stores: String = r.get(at + 4)?;
    let bad = |what: &str| {
        rusqlite::Error::FromSqlConversionFailure(at, rusqlite::types::Type::Text, format!("operator {what}").into())
    };
    Ok(Operator {
        tenant_id: r.get(at)?,
        id: r.get(at + 1)?,
        name: r.get(at + 2)?,
        role: OperatorRole::parse(&role).ok_or_else(|| bad("role"))?,
        store_ids: serde_json::from_str(&stores).map_err(|_| bad("stores"))?,
        created_at: r.get(at + 5)?,
        disabled_at: r.get(at + 6)?,
    })
}

pub fn create_operator(c: &Connection, o: &NewOperator) -> StoreResult<Operator> {
    for store_id in &o.store_ids {
        let found = c
            .prepare_cached("SELECT 1 FROM stores WHERE tenant_id = ?1 AND id = ?2")
            .and_then(|mut s| s.query_row(params![o.tenant_id, store_id], |_| Ok(())).optional())
            .map_err(backend_err)?;
        if found.is_none() {
            return Err(StoreError::NotFound(format!("store {store_id}")));
        }
    }
    let stores = serde_json::Value::from(o.store_ids.clone()).to_string();
    c.prepare_cached(
        "INSERT INTO operators (tenant_id, id, name, role, stores, password_hash, created_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )
    .and_then(|mut s| s.execute(params![o.tenant_id, o.id, o.name, o.role.as_str(), stores, o.password_hash, o.now]))
    .map_err(|e| constraint_err(e, &format!("operator {}", o.id), &format!("tenant {}", o.tenant_id)))?;
    audit(c, &o.tenant_id, o.now, (SetupObject::Operator, &o.id, SetupAction::Create), &o.audit)?;
    Ok(Operator {
        tenant_id: o.tenant_id.clone(),
        id: o.id.clone(),
        name: o.name.clone(),
        role: o.role,
        store_ids: o.store_ids.clone(),
        created_at: o.now,
        disabled_at: None,
    })
}

pub fn list_operators(c: &Connection, tenant_id: &str) -> StoreResult<Vec<Operator>> {
    let mut s = c
        .prepare_cached(&format!("SELECT {OPERATOR_COLUMNS} FROM operators o WHERE o.tenant_id = ?1 ORDER BY o.id"))
        .map_err(backend_err)?;
    let rows = s.query_map([tenant_id], |r| operator(r, 0)).map_err(backend_err)?;
    rows.map(|r| r.map_err(backend_err)).collect()
}

pub fn operator_login(c: &Connection, tenant_id: &str, operator_id: &str) -> StoreResult<Option<(Operator, String)>> {
    c.prepare_cached(&format!(
        "SELECT {OPERATOR_COLUMNS}, o.password_hash FROM operators o WHERE o.tenant_id = ?1 AND o.id = ?2"
    ))
    .and_then(|mut s| {
        s.query_row(params![tenant_id, operator_id], |r| Ok((operator(r, 0)?, r.get(OPERATOR_WIDTH)?))).optional()
    })
    .map_err(backend_err)
}

pub fn create_session(c: &Connection, s: &NewOperatorSession) -> StoreResult<()> {
    c.prepare_cached(
        "INSERT INTO operator_sessions (token_hash, id, tenant_id, operator_id, kind, csrf_token, created_at, \
         expires_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )
    .and_then(|mut st| {
        st.execute(params![
            s.token_hash,
            s.id,
            s.tenant_id,
            s.operator_id,
            s.kind.as_str(),
            s.csrf_token,
            s.created_at,
            s.expires_at
        ])
    })
    .map(|_| ())
    .map_err(|e| constraint_err(e, &format!("session {}", s.id), &format!("operator {}", s.operator_id)))
}

pub fn session(c: &Connection, token_hash: &str) -> StoreResult<Option<OperatorSession>> {
    c.prepare_cached(&format!(
        "SELECT s.id, s.kind, s.csrf_token, s.created_at, s.expires_at, {OPERATOR_COLUMNS} \
         FROM operator_sessions s JOIN operators o ON o.tenant_id = s.tenant_id AND o.id = s.operator_id \
         WHERE s.token_hash = ?1 AND s.revoked_at IS NULL AND o.disabled_at IS NULL"
    ))
    .and_then(|mut st| {
        st.query_row([token_hash], |r| {
            let kind: String = r.get(1)?;
            Ok(OperatorSession {
                id: r.get(0)?,
                kind: SessionKind::parse(&kind).ok_or_else(|| {
                    rusqlite::Error::FromSqlConversionFailure(1, rusqlite::types::Type::Text, "session kind".into())
                })?,
                csrf_token: r.get(2)?,
                created_at: r.get(3)?,
                expires_at: r.get(4)?,
                operator: operator(r, 5)?,
            })
        })
        .optional()
    })
    .map_err(backend_err)
}

pub fn revoke_session(c: &Connection, token_hash: &str, now: Millis) -> StoreResult<bool> {
    c.prepare_cached("UPDATE operator_sessions SET revoked_at = ?2 WHERE token_hash = ?1 AND revoked_at IS NULL")
        .and_then(|mut s| s.execute(params![token_hash, now]))
        .map(|n| n > 0)
        .map_err(backend_err)
}

pub fn revoke_sessions(c: &Connection, r: &RevokeOperatorSessions) -> StoreResult<Option<u64>> {
    if operator_login(c, &r.tenant_id, &r.operator_id)?.is_none() {
        return Ok(None);
    }
    let n = c
        .prepare_cached(
            "UPDATE operator_sessions SET revoked_at = ?3 \
             WHERE tenant_id = ?1 AND operator_id = ?2 AND revoked_at IS NULL",
        )
        .and_then(|mut s| s.execute(params![r.tenant_id, r.operator_id, r.now]))
        .map_err(backend_err)?;
    audit(c, &r.tenant_id, r.now, (SetupObject::Operator, &r.operator_id, SetupAction::Revoke), &r.audit)?;
    Ok(Some(n as u64))
}

fn end_sessions(c: &Connection, tenant_id: &str, operator_id: &str, now: Millis) -> StoreResult<usize> {
    c.prepare_cached(
        "UPDATE operator_sessions SET revoked_at = ?3 WHERE tenant_id = ?1 AND operator_id = ?2 AND revoked_at IS NULL",
    )
    .and_then(|mut s| s.execute(params![tenant_id, operator_id, now]))
    .map_err(backend_err)
}

pub fn change_operator(c: &Connection, ch: &ChangeOperator) -> StoreResult<Option<Operator>> {
    if operator_login(c, &ch.tenant_id, &ch.operator_id)?.is_none() {
        return Ok(None);
    }
    let (t, id) = (&ch.tenant_id, &ch.operator_id);
    let run = |sql: &str, p: &[&dyn rusqlite::ToSql]| {
        c.prepare_cached(sql).and_then(|mut s| s.execute(p)).map(|_| ()).map_err(backend_err)
    };
    let action = match &ch.change {
        OperatorChange::Disable => {
            run(
                "UPDATE operators SET disabled_at = COALESCE(disabled_at, ?3) WHERE tenant_id = ?1 AND id = ?2",
                params![t, id, ch.now],
            )?;
            end_sessions(c, t, id, ch.now)?;
            SetupAction::Disable
        }
        OperatorChange::Enable => {
            run("UPDATE operators SET disabled_at = NULL WHERE tenant_id = ?1 AND id = ?2", params![t, id])?;
            SetupAction::Enable
        }
        OperatorChange::Password { password_hash } => {
            run(
                "UPDATE operators SET password_hash = ?3 WHERE tenant_id = ?1 AND id = ?2",
                params![t, id, password_hash],
            )?;
            end_sessions(c, t, id, ch.now)?;
            SetupAction::Update
        }
        OperatorChange::Unlock => SetupAction::Update,
    };
    audit(c, t, ch.now, (SetupObject::Operator, id, action), &ch.audit)?;
    Ok(operator_login(c, t, id)?.map(|(o, _)| o))
}
