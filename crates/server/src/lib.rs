//! The HTTP surface of the onceprint broker (docs/API.md).
//!
//! This crate owns routing, authentication of the three kinds of bearer tokens, the JSON
//! shapes and the single mapping of every failure to the error body, the Prometheus
//! metrics and the OpenAPI document generated from the handlers.
//!
//! It must never hold business rules or SQL: handlers parse, call `onceprint-engine` or
//! the `Store`, and shape the answer. A handler that needs a rule asks the domain crate.
//!
//! Where things are: `http1.rs`, the accept loop (every connection served as HTTP/1.1 by
//! hyper directly; graceful shutdown drains open connections); `around.rs`, the one
//! middleware every route runs in (request id and span, latency, agent protocol check; one
//! layer, because axum boxes each layer's futures per route, which a waiting long poll
//! holds); `routes/`, with `/cloudprnt` and `/epson-sdp` for printers that poll and
//! `routes::offline` for the store agent's LAN keys, directory, LAN listener and offline sync;
//! `request_id.rs`, request ids and the access log; `tls.rs`, native TLS (rustls, handshakes
//! off the accept loop); `extract.rs`, bearer authentication (admin, tenant, agent,
//! operator; a staff member scoped to their stores; rate-limit tokens taken here, except for
//! intake) and the printers' HTTP Basic login; `digest.rs`, HTTP Digest on `/epson-sdp`
//! (RFC 7616, SHA-256 and MD5, stateless nonces signed with a per-process key, each answer
//! taken once); `agent_protocol.rs`, the agent protocol version check; `error.rs`, the one
//! mapping of errors to the JSON error body; `console/`, the staff console (cookie sessions
//! with CSRF tokens, English and Chinese, server-rendered pages, server-sent events, assets
//! compiled in), which never decides which actions a state allows, maps errors only
//! through `error.rs`, and fetches nothing from another origin.

pub mod agent_protocol;
mod around;
pub mod console;
mod digest;
mod dto;
mod error;
mod extract;
pub mod http1;
mod metrics;
pub mod openapi;
pub mod request_id;
mod routes;
pub mod tls;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::{delete, get, post, put};
use axum::Router;
use onceprint_engine::clock::{Clock, SystemClock};
use onceprint_engine::transport::cloudprnt::CloudPrnt;
use onceprint_engine::transport::epson_sdp::EpsonSdp;
use onceprint_engine::transport::polled::{Polled, PolledConfig};
use onceprint_engine::transport::TransportKind;
use onceprint_engine::{
    secrets, AgentRegistry, AgentTransport, DeliveryConfig, Directory, Intake, IntakeConfig, LaneEngine, Operations,
    OperationsConfig, Operators, PrinterWatch, RegistryConfig, Retention, Setup, Shared, StoreSignals, Watchdog,
};
use onceprint_store::{Store, StoreError};

pub use error::ApiError;

/// The default requests per second each enabled agent printer adds to its store agent's
/// rate budget: a printer printing back to back at four tickets a second, each fetched by
/// a poll of its own, costs four polls a second (docs/CONFIGURATION.md,
/// `--agent-rate-per-printer`).
pub const DEFAULT_AGENT_RATE_PER_PRINTER: f64 = 4.0;

/// Settings of the HTTP server.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// Largest accepted request body; larger ones get 413 `payload_too_large`.
    pub max_body_bytes: usize,
    pub intake: IntakeConfig,
    pub delivery: DeliveryConfig,
    pub alerts: onceprint_engine::alerts::AlertConfig,
    pub push: onceprint_engine::PushConfig,
    /// Printers that poll the broker (CloudPRNT, Epson Server Direct Print).
    pub polled: PolledConfig,
    /// The MQTT server that `mqtt` printers use (`serve --mqtt-url`); without it, `mqtt`
    /// printers are refused at set-up.
    pub mqtt: Option<onceprint_mqtt::MqttSettings>,
    /// The shared first gate of several nodes on one database (`serve --redis-url`);
    /// without it, each node has only its own in-process gate.
    pub redis: Option<onceprint_redis_gate::RedisGateSettings>,
    /// Operator sessions and the login throttle.
    pub operators: onceprint_engine::OperatorsConfig,
    /// The staff console at `/console/`.
    pub console: console::ConsoleConfig,
    /// Serve HTTPS with this certificate and key (`serve --tls-cert/--tls-key`).
    pub tls: Option<tls::Tls>,
    /// Requests per store agent token (polls, acks, status reports); `None`: unlimited.
    /// The tenants' limit is `intake.tenant_rate`.
    pub agent_rate: Option<onceprint_engine::limits::RateLimit>,
    /// Requests per second each enabled agent printer of a store adds to its agent's rate
    /// budget, where that comes to more than `agent_rate` (the burst grows in proportion);
    /// 0: the budget is `agent_rate` whatever the store drives.
    pub agent_rate_per_printer: f64,
    /// Retention of finished tasks.
    pub retention: onceprint_engine::RetentionConfig,
    /// Tests of the real binary only: the retention job's clock runs this far ahead of the
    /// wall clock (0 in production).
    pub retention_clock_offset_ms: i64,
    /// Several nodes on one database: the node's id and its leases.
    pub cluster: ClusterConfig,
    /// Tests of the real binary only: task ids are minted from a clock this far off the
    /// wall clock (0 in production), to show that lanes do not order by ids.
    pub id_clock_offset_ms: i64,
    /// How long a nonce of an HTTP Digest challenge to a printer is good for.
    pub printer_nonce_ttl_ms: u64,
    /// The broker's base URL as printers reach it (`serve --public-url`), put in the `url`
    /// print-jobs of Star printers in CloudPRNT Version MQTT; `None`: the URL each printer
    /// used for its server-setting request.
    pub public_url: Option<String>,
}

/// How this node takes part in a cluster of nodes sharing one PostgreSQL.
#[derive(Debug, Clone, Default)]
pub struct ClusterConfig {
    /// This node's id in leases, logs and `/metrics` (`serve --node-id`); `None`: a random
    /// one per process.
    pub node_id: Option<String>,
    pub leases: onceprint_engine::LeaseConfig,
    /// How often the agent registry is synced with the other nodes (PostgreSQL only).
    pub agent_sync_interval_ms: u64,
    /// Tell the other broker nodes on the same database of wake-ups and set-up changes
    /// (PostgreSQL's LISTEN/NOTIFY; `None`: not at all, e.g. to measure its cost).
    pub link: Option<onceprint_engine::ClusterConfig>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            max_body_bytes: onceprint_core::content::DEFAULT_MAX_BODY_BYTES,
            intake: IntakeConfig::default(),
            delivery: DeliveryConfig::default(),
            alerts: Default::default(),
            push: Default::default(),
            polled: Default::default(),
            mqtt: None,
            redis: None,
            operators: Default::default(),
            console: Default::default(),
            agent_rate: None,
            agent_rate_per_printer: DEFAULT_AGENT_RATE_PER_PRINTER,
            tls: None,
            retention: Default::default(),
            retention_clock_offset_ms: 0,
            cluster: ClusterConfig {
                agent_sync_interval_ms: 1_000,
                link: Some(Default::default()),
                ..Default::default()
            },
            id_clock_offset_ms: 0,
            printer_nonce_ttl_ms: digest::DEFAULT_NONCE_TTL_MS,
            public_url: None,
        }
    }
}

/// Shared state of all handlers.
#[derive(Clone)]
pub struct AppState {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) intake: Arc<Intake>,
    pub(crate) lanes: Arc<LaneEngine>,
    pub(crate) agents: Arc<AgentTransport>,
    pub(crate) cloudprnt: Arc<CloudPrnt>,
    /// Where Star printers in CloudPRNT Version MQTT fetch their jobs.
    pub(crate) job_url: Arc<onceprint_mqtt::JobUrl>,
    pub(crate) epson_sdp: Arc<EpsonSdp>,
    pub(crate) watchdog: Arc<Watchdog>,
    pub(crate) operations: Arc<Operations>,
    pub(crate) setup: Arc<Setup>,
    pub(crate) operators: Arc<Operators>,
    pub(crate) watch: Arc<PrinterWatch>,
    pub(crate) retention: Arc<Retention>,
    /// The broker's side of offline operation.
    pub(crate) offline: Arc<onceprint_engine::Offline>,
    pub(crate) directory: Arc<Directory>,
    pub(crate) leases: Arc<onceprint_engine::Leases>,
    pub(crate) metrics: Arc<metrics::Metrics>,
    pub(crate) admin_token_hash: Arc<str>,
    /// HTTP Digest sign-in of printers: nonce lifetime and the answers already taken.
    pub(crate) digest: Arc<digest::DigestAuth>,
    pub(crate) config: Arc<HttpConfig>,
    pub(crate) agent_limiter: Option<Arc<onceprint_engine::limits::RateLimiter>>,
    /// The word to and from the other nodes on the same database, when there are any.
    pub(crate) cluster: Option<Arc<onceprint_engine::Cluster>>,
}

/// Failures while starting the server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("server error: {0}")]
    Serve(std::io::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Mqtt(#[from] onceprint_mqtt::MqttError),
    #[error(transparent)]
    Redis(#[from] onceprint_redis_gate::RedisGateError),
}

/// The settings key under which the admin token's hash is kept.
const ADMIN_TOKEN_SETTING: &str = "admin_token_hash";

/// How the admin token was settled at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminToken {
    /// Given on the command line, in the environment or the config file.
    Given,
    /// A token generated at an earlier start is in use (its hash is stored).
    Stored,
    /// Generated now; the caller must show it once.
    Generated(String),
}

/// Settles the admin token: a given token wins and is remembered (by hash); otherwise the
/// stored one stays valid; otherwise a new one is generated and returned for showing once.
pub async fn settle_admin_token(store: &dyn Store, given: Option<&str>) -> Result<(String, AdminToken), StoreError> {
    if let Some(token) = given.filter(|t| !t.is_empty()) {
        let hash = secrets::hash(token);
        store.put_setting(ADMIN_TOKEN_SETTING, &hash).await?;
        return Ok((hash, AdminToken::Given));
    }
    if let Some(hash) = store.get_setting(ADMIN_TOKEN_SETTING).await? {
        return Ok((hash, AdminToken::Stored));
    }
    let token = secrets::generate("opadm_");
    let hash = secrets::hash(&token);
    store.put_setting(ADMIN_TOKEN_SETTING, &hash).await?;
    Ok((hash, AdminToken::Generated(token)))
}

/// Builds the router with all routes and middleware.
pub fn router(state: AppState) -> Router {
    use routes::{
        agent, callbacks, cloudprnt, epson_sdp, journal_digest, manual, meta, offline, operators, reconcile, render,
        setup, tasks, webhooks,
    };
    Router::new()
        .route("/v1/operators", post(operators::create_operator).get(operators::list_operators))
        .route("/v1/operators/{id}/sessions", delete(operators::revoke_operator_sessions))
        .route("/v1/operators/{id}/disable", post(operators::disable_operator))
        .route("/v1/operators/{id}/enable", post(operators::enable_operator))
        .route("/v1/operators/{id}/password", put(operators::set_operator_password))
        .route("/v1/operators/{id}/lockout", delete(operators::unlock_operator))
        .route(
            "/v1/operator-sessions",
            post(operators::create_operator_session).delete(operators::delete_operator_session),
        )
        .route("/v1/agent/status", post(agent::status))
        .merge(console::router())
        .route("/v1/tenants", post(setup::create_tenant))
        .route("/v1/stores", post(setup::create_store).get(setup::list_stores))
        .route("/v1/stores/{id}", get(setup::get_store))
        .route("/v1/stores/{id}/agent-tokens", post(setup::create_agent_token).get(setup::list_agent_tokens))
        .route("/v1/stores/{id}/agent-tokens/{token_id}", delete(setup::revoke_agent_token))
        .route("/v1/stores/{id}/lan-keys", post(setup::create_lan_key).get(setup::list_lan_keys))
        .route("/v1/stores/{id}/lan-keys/{key_id}", delete(setup::revoke_lan_key))
        .route("/v1/stores/{id}/lan-listener", get(setup::get_lan_listener).delete(setup::release_lan_listener))
        .route("/v1/printers", post(setup::create_printer).get(setup::list_printers))
        .route("/v1/printers/{id}", get(setup::get_printer).patch(setup::update_printer))
        .route("/v1/printers/{id}/disable", post(setup::disable_printer))
        .route("/v1/printers/{id}/enable", post(setup::enable_printer))
        .route("/v1/printers/{id}/credentials", post(setup::rotate_printer_credentials))
        .route("/v1/stations", post(setup::create_station))
        .route("/v1/stations/{id}", get(setup::get_station).patch(setup::update_station))
        .route("/v1/api-keys", post(setup::create_api_key).get(setup::list_api_keys))
        .route("/v1/api-keys/{id}", delete(setup::revoke_api_key))
        .route("/v1/setup-events", get(setup::setup_events))
        .route("/v1/print-tasks", post(tasks::submit).get(tasks::list_tasks))
        .route("/v1/print-task-batches", post(tasks::submit_batch))
        .route("/v1/print-tasks/{task_id}", get(tasks::get_task))
        .route("/v1/print-tasks/{task_id}/events", get(tasks::task_events))
        .route("/v1/print-tasks/{task_id}/reprint", post(manual::reprint))
        .route("/v1/print-tasks/{task_id}/mark-printed", post(manual::mark_printed))
        .route("/v1/print-tasks/{task_id}/cancel", post(manual::cancel))
        .route("/v1/print-tasks/{task_id}/transfer", post(manual::transfer))
        .route("/v1/stores/{id}/attention", get(manual::attention))
        .route("/v1/stores/{id}/reconciliation", get(reconcile::get_day).post(reconcile::post_day))
        .route("/v1/callbacks/{printer_id}", post(callbacks::callback))
        .route("/v1/render/preview", post(render::preview))
        .route("/v1/print-tasks/{task_id}/preview.png", get(render::task_preview))
        .route("/v1/webhooks", post(webhooks::create).get(webhooks::list))
        .route("/v1/webhooks/{id}/deliveries", get(webhooks::deliveries))
        .route("/v1/webhooks/{id}/test", post(webhooks::test))
        .route("/v1/agent/poll", post(agent::poll))
        .route("/v1/agent/acks", post(agent::acks))
        .route("/v1/agent/print-tasks", post(agent::submit))
        .route("/v1/agent/lan-keys", get(offline::lan_keys))
        .route("/v1/agent/directory", get(offline::directory))
        .route("/v1/agent/lan-listener", post(offline::lan_listener))
        .route("/v1/agent/offline-tasks", post(offline::offline_tasks))
        .route("/v1/agent/journal-digest", post(journal_digest::journal_digest))
        .route("/cloudprnt", post(cloudprnt::poll).get(cloudprnt::get).delete(cloudprnt::delete))
        .route("/cloudprnt-setting.json", get(cloudprnt::server_setting))
        .route("/epson-sdp", post(epson_sdp::request))
        .route("/healthz", get(meta::healthz))
        .route("/readyz", get(meta::readyz))
        .route("/metrics", get(meta::metrics))
        .route("/openapi.json", get(meta::openapi))
        .fallback(|| async { ApiError::not_found("no such endpoint; see /openapi.json") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                axum::http::StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this endpoint does not take that method; see /openapi.json",
            )
        })
        .layer(axum::middleware::from_fn_with_state(state.clone(), around::around))
        .layer(DefaultBodyLimit::max(state.config.max_body_bytes))
        .with_state(state)
}

/// A bound, not yet serving, broker.
pub struct Bound {
    listener: tokio::net::TcpListener,
    state: AppState,
}

/// Starts intake and binds the listener. Serving starts with [`Bound::serve`].
pub async fn bind(
    store: Arc<dyn Store>,
    admin_token_hash: String,
    listen: &str,
    config: HttpConfig,
) -> Result<Bound, ServerError> {
    // New ids sort after every task already stored, whatever the wall clock says now.
    if let Some(id) = store.max_task_id().await? {
        onceprint_engine::ids::observe(&id);
    }
    onceprint_engine::ids::set_clock_offset(config.id_clock_offset_ms);
    let directory = Arc::new(Directory::new(store.clone()));
    let signals = Arc::new(StoreSignals::default());
    let cluster = match (store.node_link(), &config.cluster.link) {
        (Some(link), Some(c)) => {
            Some(onceprint_engine::Cluster::new(link, signals.clone(), directory.clone(), c.clone()))
        }
        _ => None,
    };
    let mut intake = Intake::start(store.clone(), directory.clone(), signals.clone(), config.intake.clone());
    if let Some(settings) = &config.redis {
        let gate = onceprint_redis_gate::RedisGate::new(settings.clone())?;
        tracing::info!(gate = %onceprint_engine::SharedGate::describe(&gate), "shared first gate on Redis");
        intake = intake.with_shared_gate(
            Arc::new(gate),
            onceprint_engine::SharedGateConfig { timeout: settings.timeout, ..Default::default() },
        );
    }
    let intake = Arc::new(intake);
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    // Only PostgreSQL can be shared by several nodes; SQLite's broker is alone and never
    // needs to allow for what other nodes heard.
    let shared_database = store.backend() == "postgres";
    let registry = AgentRegistry::new(
        clock.clone(),
        RegistryConfig {
            gone_after_ms: config.delivery.agent_gone_after_ms,
            takeover_quiet_ms: config.delivery.takeover_quiet_ms,
            remote_lag_ms: if shared_database { 2 * config.cluster.agent_sync_interval_ms.max(10) as i64 } else { 0 },
        },
    );
    let node_id = config.cluster.node_id.clone().unwrap_or_else(onceprint_engine::lease::new_node_id);
    tracing::info!(%node_id, "this node's id (leases, /metrics)");
    let leases = onceprint_engine::Leases::new(store.clone(), clock.clone(), node_id, config.cluster.leases);
    {
        let statistics = leases.lease(onceprint_engine::lease::names::STATISTICS);
        store.set_upkeep_gate(Arc::new(move || statistics.is_held()));
    }
    let shared = Shared {
        store: store.clone(),
        directory: directory.clone(),
        gate: intake.gate().clone(),
        signals,
        policies: config.intake.policies.clone(),
    };
    let retention_clock: Arc<dyn Clock> = match config.retention_clock_offset_ms {
        0 => clock.clone(),
        offset_ms => Arc::new(onceprint_engine::clock::OffsetClock { offset_ms }),
    };
    let retention = Retention::new(store.clone(), shared.gate.clone(), retention_clock, config.retention.clone());
    let lanes = Arc::new(LaneEngine::new(shared.clone(), config.delivery.clone(), clock, registry));
    let watch = PrinterWatch::new(store.clone(), lanes.agents().clone(), lanes.signals().clone());
    let operations = Arc::new(Operations::new(shared, OperationsConfig { charge: config.intake.charge }));
    let setup = Arc::new(
        Setup::new(store.clone(), directory.clone())
            .with_mqtt(config.mqtt.is_some())
            .with_signals(lanes.signals().clone()),
    );
    let cloudprnt = Polled::new(lanes.clone(), TransportKind::Cloudprnt, config.polled.clone());
    let epson_sdp = Polled::new(lanes.clone(), TransportKind::EpsonSdp, config.polled.clone());
    let operators = Arc::new(Operators::new(store.clone(), config.operators.clone()));
    let offline = Arc::new(onceprint_engine::Offline::new(
        store.clone(),
        directory.clone(),
        intake.gate().clone(),
        lanes.signals().clone(),
        onceprint_engine::OfflineConfig {
            policies: config.intake.policies.clone(),
            content_limits: config.intake.content_limits,
            charge: config.intake.charge,
        },
    ));
    let job_url = Arc::new(onceprint_mqtt::JobUrl::new(store.clone(), config.public_url.as_deref()));
    let state = AppState {
        store,
        job_url,
        intake,
        agents: Arc::new(AgentTransport::new(lanes.clone())),
        cloudprnt: Arc::new(CloudPrnt::new(cloudprnt)),
        epson_sdp: Arc::new(EpsonSdp::new(epson_sdp)),
        watchdog: Watchdog::new(lanes.clone()),
        lanes,
        operations,
        setup,
        operators,
        watch,
        retention,
        offline,
        directory,
        leases,
        metrics: metrics::Metrics::new(),
        admin_token_hash: admin_token_hash.into(),
        digest: Arc::new(digest::DigestAuth::new(config.printer_nonce_ttl_ms)),
        agent_limiter: config.agent_rate.map(|l| Arc::new(onceprint_engine::limits::RateLimiter::new(l))),
        cluster,
        config: Arc::new(config),
    };
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|source| ServerError::Bind { addr: listen.to_owned(), source })?;
    Ok(Bound { listener, state })
}

impl Bound {
    pub fn local_addr(&self) -> Result<SocketAddr, ServerError> {
        self.listener.local_addr().map_err(ServerError::Serve)
    }

    /// Serves until `shutdown` resolves, then stops accepting, lets in-flight requests
    /// finish and returns once intake has nothing left to commit.
    pub async fn serve(self, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<(), ServerError> {
        use onceprint_engine::lease::names;
        // The router's state is bound once, here; each connection gets a clone of the
        // handle. (`axum::serve` given the `Router` itself bound it again for every
        // connection, cloning every boxed endpoint and layer: about 100 KiB per open
        // connection, which is what 10,000 idle agents' long polls cost.)
        let app = router(self.state.clone());
        let lanes = self.state.lanes.clone();
        let leases = self.state.leases.clone();
        // Jobs that must run once per cluster each ask their lease before a round of work.
        let sweeper = lanes.spawn_sweeper(leases.lease(names::SWEEPER));
        self.state.watchdog.alert_only_with(leases.lease(names::WATCHDOG_ALERTS));
        let watchdog = self
            .state
            .watchdog
            .spawn(std::time::Duration::from_millis((lanes.config().sweep_interval_ms * 5).clamp(200, 5_000)));
        let pusher = match onceprint_engine::transport::webhook::Webhook::new(&self.state.config.push) {
            Ok(w) => Some(
                onceprint_engine::PushDriver::new(
                    lanes.clone(),
                    Arc::new(w.with_node_id(leases.node_id())),
                    self.state.config.push.clone(),
                )
                .with_lease(leases.lease(names::PUSH_WEBHOOK))
                .spawn(),
            ),
            Err(e) => {
                tracing::error!(error = %e, "cannot start the webhook transport");
                None
            }
        };
        let mqtt = match &self.state.config.mqtt {
            Some(settings) => Some(onceprint_mqtt::start(
                lanes.clone(),
                settings,
                self.state.config.push.clone(),
                leases.lease(names::MQTT),
                self.state.job_url.clone(),
            )?),
            None => None,
        };

        // One node looks for printers that stopped polling (whichever node they polled).
        let polled_lease = leases.lease(names::POLLED_OFFLINE);
        let silent = [
            self.state.cloudprnt.polled().spawn(polled_lease.clone()),
            self.state.epson_sdp.polled().spawn(polled_lease),
        ];
        let deliverer = onceprint_engine::alerts::spawn_deliverer(
            self.state.store.clone(),
            lanes.signals().clone(),
            self.state.config.alerts.clone(),
            leases.lease(names::ALERTS),
        );
        let agent_watch = self.state.watch.spawn(
            std::time::Duration::from_millis(
                (self.state.config.delivery.agent_gone_after_ms / 3).clamp(200, 5_000) as u64
            ),
            leases.lease(names::AGENT_WATCH),
        );
        let retention = self.state.retention.spawn(lanes.signals().clone(), leases.lease(names::RETENTION));
        // Every lease is known now: the keeper takes them at once, then renews them.
        let keeper = leases.spawn(lanes.signals().clone());
        let agent_sync = (self.state.store.backend() == "postgres").then(|| {
            lanes.agents().spawn_sync(
                self.state.store.clone(),
                leases.node_id().to_owned(),
                std::time::Duration::from_millis(self.state.config.cluster.agent_sync_interval_ms.max(10)),
                lanes.signals().clone(),
            )
        });
        let cluster = self.state.cluster.as_ref().map(|c| c.spawn());
        let signals = lanes.signals().clone();
        // Long polls would hold graceful shutdown for up to their wait time; ending them at
        // once (they answer with no deliveries) lets in-flight requests finish promptly.
        let shutdown = async move {
            shutdown.await;
            signals.begin_shutdown();
        };
        match self.state.config.tls.clone() {
            Some(tls) => {
                let listener = tls::TlsListener::new(self.listener, &tls).map_err(ServerError::Serve)?;
                http1::serve(listener, app, shutdown).await;
            }
            None => http1::serve(self.listener, app, shutdown).await,
        }
        let _ = sweeper.await;
        let _ = watchdog.await;
        if let Some(p) = pusher {
            let _ = p.await;
        }
        if let Some(m) = mqtt {
            m.join().await;
        }
        let _ = deliverer.await;
        for s in silent {
            let _ = s.await;
        }
        let _ = agent_watch.await;
        if let Some(r) = retention {
            let _ = r.await;
        }
        for c in cluster.into_iter().flatten() {
            let _ = c.await;
        }
        if let Some(s) = agent_sync {
            let _ = s.await;
        }
        // Last, once every job has stopped: another node may take the leases over at once.
        let _ = keeper.await;
        leases.release_all().await;
        Ok(())
    }
}
