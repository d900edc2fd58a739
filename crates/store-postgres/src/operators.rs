//! Operators and their sessions on PostgreSQL: accounts with their argon2id
//! password hashes, login sessions and operator tokens (only their SHA-256), and
//! revocation. Creating an operator and revoking an operator's sessions are set-up changes
//! and write their audit row in the same transaction.

use onceprint_core::Millis;
use onceprint_store::*;
use tokio_postgres::Row;

use crate::error::pg_error;
use crate::rows;
use crate::setup::audit;
use crate::{create_error, PostgresStore};

const OPERATOR_COLUMNS: &str = "o.tenant_id, o.id, o.name, o.role, o.stores, o.created_at, o.disabled_at";
/// How many columns [`OPERATOR_COLUMNS`] names.
const OPERATOR_WIDTH: usize = 7;

/// An operator from the seven columns of [`OPERATOR_COLUMNS`] starting at `at`.
fn operator(r: &Row, at: usize) -> StoreResult<Operator> {
    let role: String = rows::col(r, at + 3)?;
    let stores: String = rows::col(r, at + 4)?;
    Ok(Operator {
        tenant_id: rows::col(r, at)?,
        id: rows::col(r, at + 1)?,
        name: rows::col(r, at + 2)?,
        role: OperatorRole::parse(&role)
            .ok_or_else(|| StoreError::Backend(format!("operator role {role:?} is not known to this version")))?,
        store_ids: serde_json::from_str(&stores)
            .map_err(|e| StoreError::Backend(format!("operator stores are not a JSON list: {e}")))?,
        created_at: rows::col(r, at + 5)?,
        disabled_at: rows::col(r, at + 6)?,
    })
}

impl PostgresStore {
    pub(crate) async fn ops_create_operator(&self, o: NewOperator) -> StoreResult<Operator> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_error)?;
        for store_id in &o.store_ids {
            let stmt =
                tx.prepare_cached("SELECT 1 FROM stores WHERE tenant_id = $1 AND id = $2").await.map_err(pg_error)?;
            if tx.query_opt(&stmt, &[&o.tenant_id, store_id]).await.map_err(pg_error)?.is_none() {
                return Err(StoreError::NotFound(format!("store {store_id}")));
            }
        }
        let stores = serde_json::Value::from(o.store_ids.clone()).to_string();
        let stmt = tx
            .prepare_cached(
                "INSERT INTO operators (tenant_id, id, name, role, stores, password_hash, created_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)",
            )
            .await
            .map_err(pg_error)?;
        tx.execute(&stmt, &[&o.tenant_id, &o.id, &o.name, &o.role.as_str(), &stores, &o.password_hash, &o.now])
            .await
            .map_err(|e| create_error(e, |_| format!("operator {}", o.id), |_| format!("tenant {}", o.tenant_id)))?;
        audit(&tx, &o.tenant_id, o.now, (SetupObject::Operator, &o.id, SetupAction::Create), &o.audit).await?;
        tx.commit().await.map_err(pg_error)?;
        Ok(Operator {
            tenant_id: o.tenant_id,
            id: o.id,
            name: o.name,
            role: o.role,
            store_ids: o.store_ids,
            created_at: o.now,
            disabled_at: None,
        })
    }

    pub(crate) async fn ops_list_operators(&self, tenant_id: &str) -> StoreResult<Vec<Operator>> {
        self.query(
            &format!("SELECT {OPERATOR_COLUMNS} FROM operators o WHERE o.tenant_id = $1 ORDER BY o.id"),
            &[&tenant_id],
        )
        .await?
        .iter()
        .map(|r| operator(r, 0))
        .collect()
    }

    pub(crate) async fn ops_operator_login(
        &self,
        tenant_id: &str,
        operator_id: &str,
    ) -> StoreResult<Option<(Operator, String)>> {
        let row = self
            .query_opt(
                &format!(
                    "SELECT {OPERATOR_COLUMNS}, o.password_hash FROM operators o WHERE o.tenant_id = $1 AND o.id = $2"
                ),
                &[&tenant_id, &operator_id],
            )
            .await?;
        match row {
            Some(r) => Ok(Some((operator(&r, 0)?, rows::col(&r, OPERATOR_WIDTH)?))),
            None => Ok(None),
        }
    }

    pub(crate) async fn ops_create_session(&self, s: NewOperatorSession) -> StoreResult<()> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(
                "INSERT INTO operator_sessions (token_hash, id, tenant_id, operator_id, kind, csrf_token, created_at,
                 expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            )
            .await
            .map_err(pg_error)?;
        client
            .execute(
                &stmt,
                &[
                    &s.token_hash,
                    &s.id,
                    &s.tenant_id,
                    &s.operator_id,
                    &s.kind.as_str(),
                    &s.csrf_token,
                    &s.created_at,
                    &s.expires_at,
                ],
            )
            .await
            .map_err(|e| create_error(e, |_| format!("session {}", s.id), |_| format!("operator {}", s.operator_id)))?;
        Ok(())
    }

    pub(crate) async fn ops_session(&self, token_hash: &str) -> StoreResult<Option<OperatorSession>> {
        let row = self
            .query_opt(
                &format!(
                    "SELECT s.id, s.kind, s.csrf_token, s.created_at, s.expires_at, {OPERATOR_COLUMNS}
                     FROM operator_sessions s JOIN operators o ON o.tenant_id = s.tenant_id AND o.id = s.operator_id
                     WHERE s.token_hash = $1 AND s.revoked_at IS NULL AND o.disabled_at IS NULL"
                ),
                &[&token_hash],
            )
            .await?;
        let Some(r) = row else { return Ok(None) };
        let kind: String = rows::col(&r, 1)?;
        Ok(Some(OperatorSession {
            id: rows::col(&r, 0)?,
            kind: SessionKind::parse(&kind)
                .ok_or_else(|| StoreError::Backend(format!("session kind {kind:?} is not known to this version")))?,
            csrf_token: rows::col(&r, 2)?,
            created_at: rows::col(&r, 3)?,
            expires_at: rows::col(&r, 4)?,
            operator: operator(&r, 5)?,
        }))
    }

    pub(crate) async fn ops_revoke_session(&self, token_hash: &str, now: Millis) -> StoreResult<bool> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached("UPDATE operator_sessions SET revoked_at = $2 WHERE token_hash = $1 AND revoked_at IS NULL")
            .await
            .map_err(pg_error)?;
        Ok(client.execute(&stmt, &[&token_hash, &now]).await.map_err(pg_error)? > 0)
    }

    pub(crate) async fn ops_revoke_sessions(&self, r: RevokeOperatorSessions) -> StoreResult<Option<u64>> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_error)?;
        let stmt =
            tx.prepare_cached("SELECT 1 FROM operators WHERE tenant_id = $1 AND id = $2").await.map_err(pg_error)?;
        if tx.query_opt(&stmt, &[&r.tenant_id, &r.operator_id]).await.map_err(pg_error)?.is_none() {
            return Ok(None);
        }
        let stmt = tx
            .prepare_cached(
                "UPDATE operator_sessions SET revoked_at = $3
                 WHERE tenant_id = $1 AND operator_id = $2 AND revoked_at IS NULL",
            )
            .await
            .map_err(pg_error)?;
        let n = tx.execute(&stmt, &[&r.tenant_id, &r.operator_id, &r.now]).await.map_err(pg_error)?;
        audit(&tx, &r.tenant_id, r.now, (SetupObject::Operator, &r.operator_id, SetupAction::Revoke), &r.audit).await?;
        tx.commit().await.map_err(pg_error)?;
        Ok(Some(n))
    }

    pub(crate) async fn ops_change_operator(&self, ch: ChangeOperator) -> StoreResult<Option<Operator>> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_error)?;
        let (t, id) = (&ch.tenant_id, &ch.operator_id);
        // The row is locked for the change, so two changes of one operator are applied one
        // after the other and each audit row follows the state it saw.
        let stmt = tx
            .prepare_cached("SELECT 1 FROM operators WHERE tenant_id = $1 AND id = $2 FOR UPDATE")
            .await
            .map_err(pg_error)?;
        if tx.query_opt(&stmt, &[t, id]).await.map_err(pg_error)?.is_none() {
            return Ok(None);
        }
        let end_sessions = "UPDATE operator_sessions SET revoked_at = $3
             WHERE tenant_id = $1 AND operator_id = $2 AND revoked_at IS NULL";
        let action = match &ch.change {
            OperatorChange::Disable => {
                let stmt = tx
                    .prepare_cached(
                        "UPDATE operators SET disabled_at = COALESCE(disabled_at, $3) WHERE tenant_id = $1 AND id = $2",
                    )
                    .await
                    .map_err(pg_error)?;
                tx.execute(&stmt, &[t, id, &ch.now]).await.map_err(pg_error)?;
                let stmt = tx.prepare_cached(end_sessions).await.map_err(pg_error)?;
                tx.execute(&stmt, &[t, id, &ch.now]).await.map_err(pg_error)?;
                SetupAction::Disable
            }
            OperatorChange::Enable => {
                let stmt = tx
                    .prepare_cached("UPDATE operators SET disabled_at = NULL WHERE tenant_id = $1 AND id = $2")
                    .await
                    .map_err(pg_error)?;
                tx.execute(&stmt, &[t, id]).await.map_err(pg_error)?;
                SetupAction::Enable
            }
            OperatorChange::Password { password_hash } => {
                let stmt = tx
                    .prepare_cached("UPDATE operators SET password_hash = $3 WHERE tenant_id = $1 AND id = $2")
                    .await
                    .map_err(pg_error)?;
                tx.execute(&stmt, &[t, id, password_hash]).await.map_err(pg_error)?;
                let stmt = tx.prepare_cached(end_sessions).await.map_err(pg_error)?;
                tx.execute(&stmt, &[t, id, &ch.now]).await.map_err(pg_error)?;
                SetupAction::Update
            }
            OperatorChange::Unlock => SetupAction::Update,
        };
        audit(&tx, t, ch.now, (SetupObject::Operator, id, action), &ch.audit).await?;
        let stmt = tx
            .prepare_cached(&format!("SELECT {OPERATOR_COLUMNS} FROM operators o WHERE o.tenant_id = $1 AND o.id = $2"))
            .await
            .map_err(pg_error)?;
        let row = tx.query_one(&stmt, &[t, id]).await.map_err(pg_error)?;
        let changed = operator(&row, 0)?;
        tx.commit().await.map_err(pg_error)?;
        Ok(Some(changed))
    }
}
