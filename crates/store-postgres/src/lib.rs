//! The PostgreSQL backend of onceprint.
//!
//! This crate owns everything PostgreSQL-specific: the SQL of every [`Store`] method, the
//! schema and its migrations (applied at start under an advisory lock, see
//! [`migrations`]), the connection pool (deadpool, plain TCP without TLS) and the mapping
//! of SQLSTATEs onto [`StoreError`]. Intake is batched: a whole group-committed batch is
//! inserted with one `unnest` statement; a batch of transitions is pipelined over one
//! connection in one transaction (see the `delivery` module). Alerts for webhooks are
//! written to an outbox by the same statement as the change they report (see the
//! `alerts` module). The broker nodes of one schema tell each other of wake-ups and set-up
//! changes over LISTEN/NOTIFY, outside every transaction of the store (see [`notify`]).
//!
//! It must never decide domain rules. Which transitions are legal, whether a duplicate is
//! a retry or a mismatch, what a task costs — all of that lives in `onceprint-core` and is
//! decided by the callers. What the store does enforce is what only the database can: the
//! unique idempotency key, the compare-and-set on (state, attempts) and at most one task in
//! flight per printer (a partial unique index). Callers must never skip that
//! compare-and-set by writing state directly.
//!
//! Where things are: a batch of intake that could collide on the one-in-flight index falls
//! back to change-by-change under savepoints; the device log (`device_log.rs`: agents'
//! records upserted in one `unnest` statement, read by task id range); a keeper that analyzes
//! the busy tables as they grow (`statistics.rs`: cached plans made for an empty table read
//! every row); retention's SQL (`retention.rs`: one short transaction per pruned batch;
//! intake's guard against a prune racing its insert is in `submit.rs` and migration 13);
//! LISTEN/NOTIFY between the nodes of one schema (`notify.rs`: the `NodeLink`, a channel
//! named after the schema, one sending and one listening connection per node, reconnected).

mod alerts;
mod delivery;
mod device_log;
mod error;
pub mod migrations;
pub mod notify;
mod offline;
mod operations;
mod operators;
mod reconcile;
mod retention;
mod rows;
mod setup;
mod statistics;
mod submit;
pub mod testing;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use onceprint_core::{IdempotencyKey, TaskState};
use onceprint_store::*;
use tokio_postgres::types::ToSql;
use tokio_postgres::NoTls;

use crate::error::{pg_error, pool_error, violation, Violation};
use crate::rows::{LEDGER_COLUMNS, PRINTER_COLUMNS, STORE_COLUMNS, TASK_COLUMNS};

/// How long a new connection may take before the broker reports the database unavailable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a caller waits for a free pooled connection. Generous, because under intake
/// load every connection may be busy committing for a while; a real outage is caught
/// sooner by the connect timeout.
const WAIT_TIMEOUT: Duration = Duration::from_secs(30);

/// A [`Store`] on PostgreSQL. Cheap to share: clone the `Arc` it is usually wrapped in.
pub struct PostgresStore {
    pool: Pool,
    /// LISTEN/NOTIFY to the other broker nodes on this schema.
    link: Arc<notify::PgLink>,
    /// Keeps the planner statistics of the busy tables current while the store lives.
    _statistics: statistics::Keeper,
}

impl PostgresStore {
    /// Connects to `url` (a `postgres://` URL or a key=value connection string), checks
    /// that the database answers and applies any pending migrations.
    ///
    /// The URL may select a schema with `?options=-csearch_path%3Dmyschema`; the tables
    /// are created in, and read from, the first schema of the search path. `pool_size` is
    /// the most connections this store opens (at least one).
    pub async fn connect(url: &str, pool_size: usize) -> StoreResult<PostgresStore> {
        let mut config: tokio_postgres::Config =
            url.parse().map_err(|e| StoreError::Backend(format!("invalid PostgreSQL URL: {e}")))?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        let target = describe_target(&config);
        let link_config = config.clone();
        let manager = Manager::from_config(config, NoTls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
        let pool = Pool::builder(manager)
            .max_size(pool_size.max(1))
            .runtime(Runtime::Tokio1)
            .create_timeout(Some(CONNECT_TIMEOUT * 2))
            .wait_timeout(Some(WAIT_TIMEOUT))
            .build()
            .map_err(|e| StoreError::Backend(format!("cannot build the PostgreSQL pool: {e}")))?;

        let unavailable = |e: StoreError| match e {
            StoreError::Unavailable(m) => StoreError::Unavailable(format!("cannot use PostgreSQL at {target}: {m}")),
            other => other,
        };
        let mut client = pool.get().await.map_err(pool_error).map_err(unavailable)?;
        client.simple_query("SELECT 1").await.map_err(pg_error).map_err(unavailable)?;
        migrations::apply(&mut client).await.map_err(unavailable)?;
        let channel: String =
            client.query_one(notify::CHANNEL, &[]).await.map_err(pg_error)?.try_get(0).map_err(pg_error)?;
        drop(client);

        let link = notify::PgLink::new(link_config, channel);
        let store = PostgresStore { _statistics: statistics::spawn(pool.clone()), pool, link };
        let version = store.schema_version().await?;
        if version > migrations::LATEST_VERSION {
            // A newer broker migrated this database. Running on is usually fine (migrations
            // add rather than remove), but an operator should know.
            tracing::warn!(
                version,
                known = migrations::LATEST_VERSION,
                "the PostgreSQL schema is newer than this broker"
            );
        }
        Ok(store)
    }

    /// The highest migration applied to the database.
    pub async fn schema_version(&self) -> StoreResult<i32> {
        let client = self.client().await?;
        let row =
            client.query_one("SELECT coalesce(max(version), 0) FROM schema_migrations", &[]).await.map_err(pg_error)?;
        rows::col(&row, 0)
    }

    async fn client(&self) -> StoreResult<deadpool_postgres::Client> {
        self.pool.get().await.map_err(pool_error)
    }

    /// Runs a cached prepared statement and returns its rows.
    async fn query(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> StoreResult<Vec<tokio_postgres::Row>> {
        let client = self.client().await?;
        let stmt = client.prepare_cached(sql).await.map_err(pg_error)?;
        client.query(&stmt, params).await.map_err(pg_error)
    }

    /// Like [`PostgresStore::query`], for at most one row.
    async fn query_opt(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> StoreResult<Option<tokio_postgres::Row>> {
        let client = self.client().await?;
        let stmt = client.prepare_cached(sql).await.map_err(pg_error)?;
        client.query_opt(&stmt, params).await.map_err(pg_error)
    }
}

/// `host:port/dbname` for messages, without the password a URL may carry.
fn describe_target(config: &tokio_postgres::Config) -> String {
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let host = match h {
                tokio_postgres::config::Host::Tcp(name) => name.clone(),
                #[cfg(unix)]
                tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
            };
            // A URL gives either one port for all hosts or one per host; 5432 otherwise.
            let ports = config.get_ports();
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            format!("{host}:{port}")
        })
        .collect();
    let hosts = if hosts.is_empty() { "localhost:5432".to_owned() } else { hosts.join(",") };
    format!("{hosts}/{}", config.get_dbname().or(config.get_user()).unwrap_or(""))
}

/// Builds a `StoreError` for a failed create: unique violations become `AlreadyExists`,
/// foreign-key violations `NotFound`, with the names the caller supplies.
pub(crate) fn create_error(
    e: tokio_postgres::Error,
    exists: impl FnOnce(&str) -> String,
    missing: impl FnOnce(&str) -> String,
) -> StoreError {
    match violation(&e) {
        Some(Violation::Unique(c)) => StoreError::AlreadyExists(exists(c)),
        Some(Violation::ForeignKey(c)) => StoreError::NotFound(missing(c)),
        None => pg_error(e),
    }
}

#[async_trait]
impl Store for PostgresStore {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    fn node_link(&self) -> Option<Arc<dyn onceprint_store::NodeLink>> {
        Some(self.link.clone())
    }

    async fn ping(&self) -> StoreResult<()> {
        let client = self.client().await?;
        client.simple_query("SELECT 1").await.map_err(pg_error)?;
        Ok(())
    }

    async fn acquire_lease(
        &self,
        name: &str,
        holder: &str,
        now: onceprint_core::Millis,
        ttl_ms: i64,
    ) -> StoreResult<Option<i64>> {
        // One statement: INSERT … ON CONFLICT takes the row lock, so two nodes racing for a
        // free or expired lease are serialized and the second sees the first's holder.
        let row = self
            .query_opt(
                "INSERT INTO leases (name, holder, token, expires_at) VALUES ($1, $2, 1, $3::bigint + $4::bigint)
                 ON CONFLICT (name) DO UPDATE SET
                     token = CASE WHEN leases.holder = EXCLUDED.holder THEN leases.token ELSE leases.token + 1 END,
                     holder = EXCLUDED.holder,
                     expires_at = EXCLUDED.expires_at
                 WHERE leases.holder = EXCLUDED.holder OR leases.expires_at <= $3::bigint
                 RETURNING token",
                &[&name, &holder, &now, &ttl_ms],
            )
            .await?;
        row.map(|r| rows::col(&r, 0)).transpose()
    }

    async fn release_lease(&self, name: &str, holder: &str, now: onceprint_core::Millis) -> StoreResult<bool> {
        let rows = self
            .query(
                "UPDATE leases SET expires_at = $3 WHERE name = $1 AND holder = $2 AND expires_at > $3 RETURNING 1",
                &[&name, &holder, &now],
            )
            .await?;
        Ok(!rows.is_empty())
    }

    async fn lease_row(&self, name: &str) -> StoreResult<Option<LeaseRow>> {
        let row =
            self.query_opt("SELECT name, holder, token, expires_at FROM leases WHERE name = $1", &[&name]).await?;
        row.map(|r| {
            Ok(LeaseRow {
                name: rows::col(&r, 0)?,
                holder: rows::col(&r, 1)?,
                token: rows::col(&r, 2)?,
                expires_at: rows::col(&r, 3)?,
            })
        })
        .transpose()
    }

    async fn put_agent_sessions(&self, sessions: &[AgentSessionRow]) -> StoreResult<()> {
        if sessions.is_empty() {
            return Ok(());
        }
        // Sorted by key, so that two nodes writing the same sessions lock them in one order.
        let mut sessions: Vec<&AgentSessionRow> = sessions.iter().collect();
        sessions.sort_by(|a, b| {
            (&a.tenant_id, &a.store_id, &a.agent_id, &a.session).cmp(&(
                &b.tenant_id,
                &b.store_id,
                &b.agent_id,
                &b.session,
            ))
        });
        sessions.dedup_by(|a, b| {
            (&a.tenant_id, &a.store_id, &a.agent_id, &a.session) == (&b.tenant_id, &b.store_id, &b.agent_id, &b.session)
        });
        let col = |f: fn(&AgentSessionRow) -> &str| sessions.iter().map(|r| f(r)).collect::<Vec<&str>>();
        let (tenants, stores, agents, ids, nodes) = (
            col(|r| &r.tenant_id),
            col(|r| &r.store_id),
            col(|r| &r.agent_id),
            col(|r| &r.session),
            col(|r| &r.node_id),
        );
        let started: Vec<i64> = sessions.iter().map(|r| r.started_at).collect();
        let heard: Vec<i64> = sessions.iter().map(|r| r.heard_at).collect();
        let open: Vec<bool> = sessions.iter().map(|r| r.open_poll).collect();
        self.query(
            "INSERT INTO agent_sessions AS s
                 (tenant_id, store_id, agent_id, session, started_at, heard_at, open_poll, node_id)
             SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::bigint[],
                                  $7::bool[], $8::text[])
             ON CONFLICT (tenant_id, store_id, agent_id, session) DO UPDATE SET
                 heard_at = EXCLUDED.heard_at, open_poll = EXCLUDED.open_poll, node_id = EXCLUDED.node_id
             WHERE EXCLUDED.heard_at >= s.heard_at",
            &[&tenants, &stores, &agents, &ids, &started, &heard, &open, &nodes],
        )
        .await?;
        Ok(())
    }

    async fn agent_sessions_since(&self, since: onceprint_core::Millis) -> StoreResult<Vec<AgentSessionRow>> {
        let rows = self
            .query(
                "SELECT tenant_id, store_id, agent_id, session, started_at, heard_at, open_poll, node_id
                 FROM agent_sessions WHERE heard_at >= $1",
                &[&since],
            )
            .await?;
        rows.iter()
            .map(|r| {
                Ok(AgentSessionRow {
                    tenant_id: rows::col(r, 0)?,
                    store_id: rows::col(r, 1)?,
                    agent_id: rows::col(r, 2)?,
                    session: rows::col(r, 3)?,
                    started_at: rows::col(r, 4)?,
                    heard_at: rows::col(r, 5)?,
                    open_poll: rows::col(r, 6)?,
                    node_id: rows::col(r, 7)?,
                })
            })
            .collect()
    }

    async fn forget_agent_sessions(&self, heard_before: onceprint_core::Millis) -> StoreResult<u64> {
        let client = self.client().await?;
        let stmt = client.prepare_cached("DELETE FROM agent_sessions WHERE heard_at < $1").await.map_err(pg_error)?;
        client.execute(&stmt, &[&heard_before]).await.map_err(pg_error)
    }

    fn set_upkeep_gate(&self, gate: onceprint_store::UpkeepGate) {
        self._statistics.set_gate(gate);
    }

    async fn get_setting(&self, key: &str) -> StoreResult<Option<String>> {
        match self.query_opt("SELECT value FROM settings WHERE key = $1", &[&key]).await? {
            Some(row) => Ok(Some(rows::col(&row, 0)?)),
            None => Ok(None),
        }
    }

    async fn put_setting(&self, key: &str, value: &str) -> StoreResult<()> {
        self.query(
            "INSERT INTO settings (key, value) VALUES ($1, $2)
             ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
            &[&key, &value],
        )
        .await?;
        Ok(())
    }

    async fn create_tenant(&self, tenant: NewTenant) -> StoreResult<Tenant> {
        self.setup_create_tenant(tenant).await
    }

    async fn tenant_by_key_hash(&self, api_key_hash: &str) -> StoreResult<Option<TenantKey>> {
        self.setup_tenant_by_key_hash(api_key_hash).await
    }

    async fn create_api_key(&self, key: NewApiKey) -> StoreResult<ApiKey> {
        self.setup_create_api_key(key).await
    }

    async fn list_api_keys(&self, tenant_id: &str) -> StoreResult<Vec<ApiKey>> {
        self.setup_list_api_keys(tenant_id).await
    }

    async fn revoke_api_key(&self, change: RevokeApiKey) -> StoreResult<KeyRevocation> {
        self.setup_revoke_api_key(change).await
    }

    async fn create_store(&self, store: NewStore) -> StoreResult<StoreRow> {
        self.setup_create_store(store).await
    }

    async fn get_store(&self, tenant_id: &str, store_id: &str) -> StoreResult<Option<StoreRow>> {
        self.query_opt(
            &format!("SELECT {STORE_COLUMNS} FROM stores WHERE tenant_id = $1 AND id = $2"),
            &[&tenant_id, &store_id],
        )
        .await?
        .as_ref()
        .map(rows::store)
        .transpose()
    }

    async fn list_stores(&self, tenant_id: &str) -> StoreResult<Vec<StoreRow>> {
        self.query(&format!("SELECT {STORE_COLUMNS} FROM stores WHERE tenant_id = $1 ORDER BY id"), &[&tenant_id])
            .await?
            .iter()
            .map(rows::store)
            .collect()
    }

    async fn create_printer(&self, printer: NewPrinter) -> StoreResult<Printer> {
        self.setup_create_printer(printer).await
    }

    async fn get_printer(&self, tenant_id: &str, printer_id: &str) -> StoreResult<Option<Printer>> {
        self.query_opt(
            &format!("SELECT {PRINTER_COLUMNS} FROM printers WHERE tenant_id = $1 AND id = $2"),
            &[&tenant_id, &printer_id],
        )
        .await?
        .as_ref()
        .map(rows::printer)
        .transpose()
    }

    async fn list_printers(&self, tenant_id: &str, store_id: Option<&str>) -> StoreResult<Vec<Printer>> {
        let rows = match store_id {
            Some(store_id) => {
                self.query(
                    &format!(
                        "SELECT {PRINTER_COLUMNS} FROM printers WHERE tenant_id = $1 AND store_id = $2 ORDER BY id"
                    ),
                    &[&tenant_id, &store_id],
                )
                .await?
            }
            None => {
                self.query(
                    &format!("SELECT {PRINTER_COLUMNS} FROM printers WHERE tenant_id = $1 ORDER BY id"),
                    &[&tenant_id],
                )
                .await?
            }
        };
        rows.iter().map(rows::printer).collect()
    }

    async fn update_printer(&self, change: PrinterUpdate) -> StoreResult<Option<Printer>> {
        self.setup_update_printer(change).await
    }

    async fn set_printer_enabled(&self, change: PrinterEnabled) -> StoreResult<Option<Printer>> {
        self.setup_set_printer_enabled(change).await
    }

    async fn printers_by_transport(&self, kind: &str) -> StoreResult<Vec<Printer>> {
        // The transport is JSON text, as on SQLite; a row that is not JSON fails the read
        // there too.
        self.query(
            &format!(
                "SELECT {PRINTER_COLUMNS} FROM printers WHERE transport::jsonb ->> 'kind' = $1 ORDER BY tenant_id, id"
            ),
            &[&kind],
        )
        .await?
        .iter()
        .map(rows::printer)
        .collect()
    }

    async fn printer_by_secret_hash(&self, secret_hash: &str) -> StoreResult<Option<PrinterCredential>> {
        self.setup_printer_by_secret_hash(secret_hash).await
    }

    async fn printer_login_by_username(&self, username: &str) -> StoreResult<Option<PrinterDigestLogin>> {
        self.setup_printer_login_by_username(username).await
    }

    async fn set_printer_secret(&self, change: PrinterSecretChange) -> StoreResult<bool> {
        self.setup_set_printer_secret(change).await
    }

    async fn mqtt_logins(&self) -> StoreResult<Vec<MqttLogin>> {
        self.setup_mqtt_logins().await
    }

    async fn printers_with_id(&self, printer_id: &str) -> StoreResult<Vec<Printer>> {
        self.query(&format!("SELECT {PRINTER_COLUMNS} FROM printers WHERE id = $1 ORDER BY tenant_id"), &[&printer_id])
            .await?
            .iter()
            .map(rows::printer)
            .collect()
    }

    async fn create_station(&self, station: NewStation) -> StoreResult<Station> {
        self.setup_create_station(station).await
    }

    async fn get_station(&self, tenant_id: &str, station_id: &str) -> StoreResult<Option<Station>> {
        self.query_opt(
            "SELECT tenant_id, id, store_id, printers, created_at, failover_after_ms FROM stations
             WHERE tenant_id = $1 AND id = $2",
            &[&tenant_id, &station_id],
        )
        .await?
        .as_ref()
        .map(rows::station)
        .transpose()
    }

    async fn update_station(&self, change: StationUpdate) -> StoreResult<Option<Station>> {
        self.setup_update_station(change).await
    }

    async fn create_agent_token(&self, token: NewAgentToken) -> StoreResult<AgentToken> {
        self.setup_create_agent_token(token).await
    }

    async fn agent_by_token_hash(&self, token_hash: &str) -> StoreResult<Option<AgentIdentity>> {
        match self
            .query_opt(
                "SELECT tenant_id, store_id FROM agent_tokens
                 WHERE token_hash = $1 AND revoked_at IS NULL AND kind = 'agent'",
                &[&token_hash],
            )
            .await?
        {
            Some(row) => Ok(Some(AgentIdentity { tenant_id: rows::col(&row, 0)?, store_id: rows::col(&row, 1)? })),
            None => Ok(None),
        }
    }

    async fn list_agent_tokens(
        &self,
        tenant_id: &str,
        store_id: &str,
        kind: TokenKind,
    ) -> StoreResult<Vec<AgentToken>> {
        Ok(self.setup_list_agent_tokens(tenant_id, store_id, kind).await?.into_iter().map(|(t, _)| t).collect())
    }

    async fn active_token_hashes(
        &self,
        tenant_id: &str,
        store_id: &str,
        kind: TokenKind,
    ) -> StoreResult<Vec<TokenHash>> {
        Ok(self
            .setup_list_agent_tokens(tenant_id, store_id, kind)
            .await?
            .into_iter()
            .filter(|(t, _)| t.revoked_at.is_none())
            .map(|(t, hash)| TokenHash { id: t.id, hash })
            .collect())
    }

    async fn list_stations(&self, tenant_id: &str, store_id: &str) -> StoreResult<Vec<Station>> {
        self.query(
            "SELECT tenant_id, id, store_id, printers, created_at, failover_after_ms FROM stations
             WHERE tenant_id = $1 AND store_id = $2 ORDER BY id",
            &[&tenant_id, &store_id],
        )
        .await?
        .iter()
        .map(rows::station)
        .collect()
    }

    async fn revoke_agent_token(&self, change: RevokeAgentToken) -> StoreResult<Option<Revoked<AgentToken>>> {
        self.setup_revoke_agent_token(change).await
    }

    async fn create_operator(&self, operator: NewOperator) -> StoreResult<Operator> {
        self.ops_create_operator(operator).await
    }

    async fn list_operators(&self, tenant_id: &str) -> StoreResult<Vec<Operator>> {
        self.ops_list_operators(tenant_id).await
    }

    async fn operator_login(&self, tenant_id: &str, operator_id: &str) -> StoreResult<Option<(Operator, String)>> {
        self.ops_operator_login(tenant_id, operator_id).await
    }

    async fn create_operator_session(&self, session: NewOperatorSession) -> StoreResult<()> {
        self.ops_create_session(session).await
    }

    async fn operator_session(&self, token_hash: &str) -> StoreResult<Option<OperatorSession>> {
        self.ops_session(token_hash).await
    }

    async fn revoke_operator_session(&self, token_hash: &str, now: onceprint_core::Millis) -> StoreResult<bool> {
        self.ops_revoke_session(token_hash, now).await
    }

    async fn revoke_operator_sessions(&self, change: RevokeOperatorSessions) -> StoreResult<Option<u64>> {
        self.ops_revoke_sessions(change).await
    }

    async fn change_operator(&self, change: ChangeOperator) -> StoreResult<Option<Operator>> {
        self.ops_change_operator(change).await
    }

    async fn setup_events(&self, tenant_id: &str, limit: i64, before: Option<i64>) -> StoreResult<Vec<SetupEvent>> {
        self.setup_events_page(tenant_id, limit, before).await
    }

    async fn submit_batch(&self, batch: Vec<NewTask>) -> StoreResult<Vec<SubmitOutcome>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let client = self.client().await?;
        submit::submit_batch(&client, batch, false).await
    }

    async fn merge_offline(&self, task: OfflineTask, planner: MergePlanner) -> StoreResult<OfflineMerge> {
        let mut client = self.client().await?;
        offline::merge_offline(&mut client, &task, planner.as_ref()).await
    }

    async fn task_alias(&self, tenant_id: &str, alias_id: &str) -> StoreResult<Option<TaskAlias>> {
        let client = self.client().await?;
        offline::alias(&client, tenant_id, alias_id).await
    }

    async fn get_task(&self, tenant_id: &str, task_id: &str) -> StoreResult<Option<Task>> {
        self.query_opt(
            &format!("SELECT {TASK_COLUMNS} FROM tasks WHERE id = $1 AND tenant_id = $2"),
            &[&task_id, &tenant_id],
        )
        .await?
        .as_ref()
        .map(rows::task)
        .transpose()
    }

    async fn get_tasks(&self, tenant_id: &str, task_ids: &[String]) -> StoreResult<Vec<Task>> {
        self.query(
            &format!("SELECT {TASK_COLUMNS} FROM tasks WHERE tenant_id = $1 AND id = ANY($2)"),
            &[&tenant_id, &task_ids],
        )
        .await?
        .iter()
        .map(rows::task)
        .collect()
    }

    async fn task_contents(&self, task_ids: &[String]) -> StoreResult<Vec<(String, TaskContent)>> {
        let rows = self.query("SELECT id, content_type, content FROM tasks WHERE id = ANY($1)", &[&task_ids]).await?;
        rows.iter()
            .map(|r| {
                Ok((
                    r.try_get::<_, String>(0).map_err(crate::error::pg_error)?,
                    TaskContent {
                        content_type: r.try_get(1).map_err(crate::error::pg_error)?,
                        content: r.try_get(2).map_err(crate::error::pg_error)?,
                    },
                ))
            })
            .collect()
    }

    async fn find_task(&self, key: &IdempotencyKey) -> StoreResult<Option<Task>> {
        self.query_opt(
            &format!(
                "SELECT {TASK_COLUMNS} FROM tasks
                 WHERE tenant_id = $1 AND target = $2 AND biz_no = $3 AND print_type = $4"
            ),
            &[&key.tenant_id, &key.target, &key.biz_no, &key.print_type],
        )
        .await?
        .as_ref()
        .map(rows::task)
        .transpose()
    }

    async fn task_content(&self, task_id: &str) -> StoreResult<Option<TaskContent>> {
        match self.query_opt("SELECT content_type, content FROM tasks WHERE id = $1", &[&task_id]).await? {
            Some(row) => Ok(Some(TaskContent { content_type: rows::col(&row, 0)?, content: rows::col(&row, 1)? })),
            None => Ok(None),
        }
    }

    async fn list_tasks(&self, query: &TaskQuery) -> StoreResult<Vec<Task>> {
        // One statement per combination of filters (each prepared once per connection)
        // instead of `$n IS NULL OR …`, so that the planner can use the index that fits
        // each combination.
        let state = query.state.map(TaskState::as_str);
        let limit = query.limit.max(0);
        let mut sql = format!("SELECT {TASK_COLUMNS} FROM tasks WHERE tenant_id = $1");
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&query.tenant_id];
        if let Some(store_id) = &query.store_id {
            params.push(store_id);
            sql.push_str(&format!(" AND store_id = ${}", params.len()));
        }
        if let Some(state) = &state {
            params.push(state);
            sql.push_str(&format!(" AND state = ${}", params.len()));
        }
        if let Some(biz_no) = &query.biz_no {
            params.push(biz_no);
            sql.push_str(&format!(" AND biz_no = ${}", params.len()));
        }
        // A prefix is a range of `tasks_biz_no_prefix_idx`, compared in the "C" collation
        // (code point order) in which the range is exactly the strings with the prefix.
        let upper = query.biz_no_prefix.as_deref().and_then(onceprint_store::prefix_upper_bound);
        if let Some(prefix) = &query.biz_no_prefix {
            params.push(prefix);
            sql.push_str(&format!(" AND biz_no COLLATE \"C\" >= ${}", params.len()));
            if let Some(upper) = &upper {
                params.push(upper);
                sql.push_str(&format!(" AND biz_no COLLATE \"C\" < ${}", params.len()));
            }
        }
        if let Some(printer) = &query.printer_id {
            params.push(printer);
            sql.push_str(&format!(" AND printer_id = ${}", params.len()));
        }
        if let Some(print_type) = &query.print_type {
            params.push(print_type);
            sql.push_str(&format!(" AND print_type = ${}", params.len()));
        }
        for (bound, op) in [(&query.id_from, ">="), (&query.id_to, "<"), (&query.cursor, "<"), (&query.after, ">")] {
            if let Some(id) = bound {
                params.push(id);
                sql.push_str(&format!(" AND id {op} ${}", params.len()));
            }
        }
        params.push(&limit);
        // The page before a cursor is the tasks just above it: read upwards from it, then
        // turned round so that every page is newest first.
        let order = if query.after.is_some() { "ASC" } else { "DESC" };
        sql.push_str(&format!(" ORDER BY id {order} LIMIT ${}", params.len()));
        let mut tasks = self.query(&sql, &params).await?.iter().map(rows::task).collect::<StoreResult<Vec<_>>>()?;
        if query.after.is_some() {
            tasks.reverse();
        }
        Ok(tasks)
    }

    async fn task_events(&self, tenant_id: &str, task_id: &str) -> StoreResult<Option<Vec<TaskEvent>>> {
        // The left join answers both questions in one round trip: no row at all means the
        // task is not this tenant's; a row with a NULL event id means it has no events.
        let rows = self
            .query(
                "SELECT e.id, e.at, e.from_state, e.to_state, e.attempt, e.actor, e.reason
                 FROM tasks t LEFT JOIN task_events e ON e.task_id = t.id
                 WHERE t.id = $1 AND t.tenant_id = $2
                 ORDER BY e.id",
                &[&task_id, &tenant_id],
            )
            .await?;
        if rows.is_empty() {
            return Ok(None);
        }
        let mut events = Vec::with_capacity(rows.len());
        for row in &rows {
            let id: Option<i64> = rows::col(row, 0)?;
            if id.is_some() {
                events.push(rows::event(row, 1)?);
            }
        }
        Ok(Some(events))
    }

    async fn ledger_entries(&self, task_id: &str) -> StoreResult<Vec<LedgerEntry>> {
        let rows = self
            .query(&format!("SELECT {LEDGER_COLUMNS} FROM ledger WHERE task_id = $1 ORDER BY id"), &[&task_id])
            .await?;
        rows.iter().map(rows::ledger_entry).collect()
    }

    async fn count_by_state(&self) -> StoreResult<Vec<(TaskState, i64)>> {
        let rows = self.query("SELECT state, count(*) FROM tasks GROUP BY state", &[]).await?;
        rows.iter().map(|row| Ok((rows::state(rows::col(row, 0)?)?, rows::col(row, 1)?))).collect()
    }

    async fn transition(&self, change: &Transition) -> StoreResult<bool> {
        let client = self.client().await?;
        delivery::transition(&client, change).await
    }

    async fn apply_transitions(&self, changes: &[Transition]) -> StoreResult<Vec<bool>> {
        if changes.is_empty() {
            return Ok(Vec::new());
        }
        let mut client = self.client().await?;
        delivery::apply_transitions(&mut client, changes).await
    }

    async fn lanes(&self, tenant_id: &str, store_id: &str, kind: &str) -> StoreResult<Vec<Lane>> {
        let client = self.client().await?;
        delivery::lanes(&client, tenant_id, store_id, kind).await
    }

    async fn lane(&self, tenant_id: &str, printer_id: &str) -> StoreResult<Lane> {
        let client = self.client().await?;
        delivery::lane(&client, tenant_id, printer_id).await
    }

    async fn lane_heads(&self, tenant_id: &str, printer_ids: &[String]) -> StoreResult<Vec<Task>> {
        if printer_ids.is_empty() {
            return Ok(Vec::new());
        }
        let client = self.client().await?;
        delivery::lane_heads(&client, tenant_id, printer_ids).await
    }

    async fn lane_stats(&self) -> StoreResult<Vec<LaneStats>> {
        let client = self.client().await?;
        delivery::lane_stats(&client).await
    }

    async fn max_task_id(&self) -> StoreResult<Option<String>> {
        let client = self.client().await?;
        let stmt = client.prepare_cached("SELECT max(id) FROM tasks").await.map_err(pg_error)?;
        let row = client.query_one(&stmt, &[]).await.map_err(pg_error)?;
        rows::col(&row, 0)
    }

    async fn record_alert(&self, event: &OutboxEvent) -> StoreResult<()> {
        let client = self.client().await?;
        delivery::record_alert(&client, event).await
    }

    async fn due_tasks(&self, state: TaskState, now: onceprint_core::Millis, limit: i64) -> StoreResult<Vec<Task>> {
        let client = self.client().await?;
        delivery::due_tasks(&client, state, now, limit).await
    }

    async fn waiting_on_paused_printers(&self, limit: i64) -> StoreResult<Vec<PausedWait>> {
        let client = self.client().await?;
        delivery::waiting_on_paused_printers(&client, limit).await
    }

    async fn apply_manual(&self, change: &ManualChange) -> StoreResult<bool> {
        let mut client = self.client().await?;
        operations::apply_manual(&mut client, change).await
    }

    async fn attention(&self, tenant_id: &str, store_id: &str, limit: i64) -> StoreResult<Vec<Task>> {
        let client = self.client().await?;
        operations::attention(&client, tenant_id, store_id, limit).await
    }

    async fn tasks_created_between(
        &self,
        tenant_id: &str,
        store_id: &str,
        from_id: &str,
        to_id: &str,
    ) -> StoreResult<Vec<Task>> {
        let client = self.client().await?;
        reconcile::tasks_created_between(&client, tenant_id, store_id, from_id, to_id).await
    }

    async fn ledger_between(
        &self,
        tenant_id: &str,
        store_id: &str,
        from: onceprint_core::Millis,
        to: onceprint_core::Millis,
    ) -> StoreResult<Vec<LedgerEntry>> {
        let client = self.client().await?;
        reconcile::ledger_between(&client, tenant_id, store_id, from, to).await
    }

    async fn put_device_log(&self, records: &[DeviceLogRecord]) -> StoreResult<u64> {
        if records.is_empty() {
            return Ok(0);
        }
        let client = self.client().await?;
        device_log::put_device_log(&client, records).await
    }

    async fn device_log_between(
        &self,
        tenant_id: &str,
        store_id: &str,
        from_id: &str,
        to_id: &str,
    ) -> StoreResult<Vec<DeviceLogRecord>> {
        let client = self.client().await?;
        device_log::device_log_between(&client, tenant_id, store_id, from_id, to_id).await
    }

    async fn device_log_of_aliases(
        &self,
        tenant_id: &str,
        store_id: &str,
        task_ids: &[String],
    ) -> StoreResult<Vec<DeviceLogRecord>> {
        let client = self.client().await?;
        device_log::device_log_of_aliases(&client, tenant_id, store_id, task_ids).await
    }

    async fn reprint_count(&self, task_id: &str) -> StoreResult<i32> {
        let client = self.client().await?;
        operations::reprint_count(&client, task_id).await
    }

    async fn prunable_tasks(
        &self,
        states: &[TaskState],
        before_id: &str,
        changed_before: onceprint_core::Millis,
        after_id: Option<&str>,
        limit: i64,
    ) -> StoreResult<Vec<Task>> {
        let client = self.client().await?;
        retention::prunable_tasks(&client, states, before_id, changed_before, after_id, limit).await
    }

    async fn prune_tasks(&self, tasks: &[PruneTask], now: onceprint_core::Millis) -> StoreResult<Pruned> {
        let mut client = self.client().await?;
        retention::prune_tasks(&mut client, tasks, now).await
    }

    async fn get_tombstone(&self, tenant_id: &str, task_id: &str) -> StoreResult<Option<Tombstone>> {
        let client = self.client().await?;
        retention::get_tombstone(&client, tenant_id, task_id).await
    }

    async fn find_tombstone(&self, key: &IdempotencyKey) -> StoreResult<Option<Tombstone>> {
        let client = self.client().await?;
        retention::find_tombstone(&client, key).await
    }

    async fn tasks_and_tombstones_created_between(
        &self,
        tenant_id: &str,
        store_id: &str,
        from_id: &str,
        to_id: &str,
    ) -> StoreResult<(Vec<Task>, Vec<Tombstone>)> {
        let mut client = self.client().await?;
        retention::tasks_and_tombstones_created_between(&mut client, tenant_id, store_id, from_id, to_id).await
    }

    async fn touch_printers_seen(&self, seen: &[PrinterSeen]) -> StoreResult<Vec<(String, String)>> {
        if seen.is_empty() {
            return Ok(Vec::new());
        }
        let tenants: Vec<&str> = seen.iter().map(|p| p.tenant_id.as_str()).collect();
        let printers: Vec<&str> = seen.iter().map(|p| p.printer_id.as_str()).collect();
        let at: Vec<onceprint_core::Millis> = seen.iter().map(|p| p.at).collect();
        // One statement for the lot; the rows it touched come back, the others are the
        // answer.
        let touched = self
            .query(
                "UPDATE printers p SET last_seen_at = GREATEST(COALESCE(p.last_seen_at, u.at), u.at) \
                 FROM unnest($1::text[], $2::text[], $3::bigint[]) AS u(tenant_id, id, at) \
                 WHERE p.tenant_id = u.tenant_id AND p.id = u.id AND p.online \
                 RETURNING p.tenant_id, p.id",
                &[&tenants, &printers, &at],
            )
            .await?;
        let touched: std::collections::HashSet<(String, String)> =
            touched.iter().map(|r| Ok((rows::col(r, 0)?, rows::col(r, 1)?))).collect::<StoreResult<_>>()?;
        Ok(seen.iter().map(|p| (p.tenant_id.clone(), p.printer_id.clone())).filter(|k| !touched.contains(k)).collect())
    }

    async fn silent_printers(&self, query: &SilenceQuery) -> StoreResult<Vec<Printer>> {
        // The transport is JSON text, as on SQLite (see `printers_by_transport`). The first
        // term passes over a printer that keeps polling before its JSON is parsed.
        self.query(
            &format!(
                "SELECT {PRINTER_COLUMNS} FROM printers WHERE COALESCE(last_seen_at, created_at) < $5 \
                 AND transport::jsonb ->> 'kind' = $1 \
                 AND CASE WHEN last_seen_at IS NULL THEN COALESCE(last_error, '') <> 'offline' ELSE online END \
                 AND COALESCE(last_seen_at, created_at) \
                     < $2 - 2 * COALESCE((transport::jsonb ->> 'poll_interval_s')::bigint * 1000, $3) - $4 \
                 ORDER BY tenant_id, id"
            ),
            &[&query.kind, &query.now, &query.default_interval_ms, &query.grace_ms, &query.earliest_threshold()],
        )
        .await?
        .iter()
        .map(rows::printer)
        .collect()
    }

    async fn update_printer_status(&self, updates: &[PrinterStatusUpdate]) -> StoreResult<()> {
        if updates.is_empty() {
            return Ok(());
        }
        let client = self.client().await?;
        delivery::update_printer_status(&client, updates).await
    }

    async fn create_webhook(&self, webhook: NewWebhook) -> StoreResult<Webhook> {
        let client = self.client().await?;
        alerts::create_webhook(&client, webhook).await
    }

    async fn list_webhooks(&self, tenant_id: &str) -> StoreResult<Vec<Webhook>> {
        let client = self.client().await?;
        alerts::list_webhooks(&client, tenant_id).await
    }

    async fn webhook_deliveries(
        &self,
        tenant_id: &str,
        webhook_id: &str,
        limit: i64,
    ) -> StoreResult<Option<Vec<WebhookDelivery>>> {
        let client = self.client().await?;
        alerts::webhook_deliveries(&client, tenant_id, webhook_id, limit).await
    }

    async fn enqueue_webhook_test(&self, webhook_id: &str, event: OutboxEvent) -> StoreResult<bool> {
        let client = self.client().await?;
        alerts::enqueue_webhook_test(&client, webhook_id, &event).await
    }

    async fn due_webhooks(&self, now: onceprint_core::Millis, limit: i64) -> StoreResult<Vec<DueWebhook>> {
        let client = self.client().await?;
        alerts::due_webhooks(&client, now, limit).await
    }

    async fn record_webhook_attempt(&self, attempt: &WebhookAttempt) -> StoreResult<()> {
        let client = self.client().await?;
        alerts::record_webhook_attempt(&client, attempt).await
    }
}
