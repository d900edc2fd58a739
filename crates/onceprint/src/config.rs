//! `onceprint serve` configuration: command-line flags, then environment variables, then
//! the TOML file given with `--config`, then defaults — the first that sets a value wins.

use std::collections::BTreeMap;
use std::path::PathBuf;

/// The long polls' re-check on PostgreSQL without the node link: there it is how a node
/// hears of work committed on another, so it stays short.
const UNLINKED_RECHECK_MS: u64 = 1_000;

use anyhow::Context as _;
use onceprint_core::{ContentLimits, PolicyTable, PrintTypePolicy};
use onceprint_engine::{DeliveryConfig, IntakeConfig};
use onceprint_server::HttpConfig;
use onceprint_store::GroupCommitConfig;
use serde::Deserialize;

/// Flags of `onceprint serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on (port 0 picks a free port; the chosen address is printed).
    #[arg(long, env = "ONCEPRINT_LISTEN")]
    pub listen: Option<String>,
    /// Database: sqlite://PATH (default sqlite://onceprint.db) or postgres://USER@HOST/DB.
    #[arg(long, visible_alias = "db", env = "ONCEPRINT_DATABASE_URL")]
    pub database: Option<String>,
    /// Admin token; without one, a token is generated at first start and printed once.
    #[arg(long, env = "ONCEPRINT_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// TOML configuration file (docs/CONFIGURATION.md lists every key).
    #[arg(long, env = "ONCEPRINT_CONFIG")]
    pub config: Option<PathBuf>,
    /// Largest accepted request body in bytes (default 1048576).
    #[arg(long, env = "ONCEPRINT_MAX_BODY_BYTES")]
    pub max_body_bytes: Option<usize>,
    /// The MQTT server that mqtt printers use: mqtt://[USER:PASSWORD@]HOST:PORT. Without
    /// it, mqtt printers are refused.
    #[arg(long, env = "ONCEPRINT_MQTT_URL", hide_env_values = true)]
    pub mqtt_url: Option<String>,
    /// The broker's user name on the MQTT server (instead of the one in --mqtt-url).
    #[arg(long, env = "ONCEPRINT_MQTT_USERNAME")]
    pub mqtt_username: Option<String>,
    /// The broker's password on the MQTT server (instead of the one in --mqtt-url).
    #[arg(long, env = "ONCEPRINT_MQTT_PASSWORD", hide_env_values = true)]
    pub mqtt_password: Option<String>,
    /// The broker's MQTT client id; keep it stable, the MQTT server keeps the broker's
    /// session under it (default onceprint-broker).
    #[arg(long, env = "ONCEPRINT_MQTT_CLIENT_ID")]
    pub mqtt_client_id: Option<String>,
    /// Keep the MQTT server's password file (DIR/passwd) and ACL file (DIR/acl) in step
    /// with the printers in the database.
    #[arg(long, env = "ONCEPRINT_MQTT_ACL_DIR", value_name = "DIR")]
    pub mqtt_acl_dir: Option<PathBuf>,
    /// After the MQTT files change, send SIGHUP to the process whose pid this file holds
    /// (Mosquitto's pid_file), so that it reads them again.
    #[arg(long, env = "ONCEPRINT_MQTT_RELOAD_PID_FILE", value_name = "FILE")]
    pub mqtt_reload_pid_file: Option<PathBuf>,
    /// The MQTT server as printers reach it, mqtt://HOST:PORT or mqtts://HOST:PORT (TLS),
    /// told to Star printers in their server settings (default: the host and port of
    /// --mqtt-url, without TLS).
    #[arg(long, env = "ONCEPRINT_MQTT_PRINTER_URL", value_name = "URL")]
    pub mqtt_printer_url: Option<String>,
    /// The broker's URL as printers reach it (http://HOST:PORT or https://HOST[/PREFIX]),
    /// where Star printers in CloudPRNT Version MQTT fetch their jobs (default: the URL
    /// each printer used for its server settings; set it with several nodes or a proxy).
    #[arg(long, env = "ONCEPRINT_PUBLIC_URL", value_name = "URL")]
    pub public_url: Option<String>,
    /// The shared first gate of several nodes on one database: redis://[:PASSWORD@]HOST:PORT[/DB].
    /// Retries that reach another node than the first submission are answered from it
    /// without a database write; without it each node has only its own gate. Redis slow or
    /// down never fails intake: it is bypassed and the database judges.
    #[arg(long, env = "ONCEPRINT_REDIS_URL", hide_env_values = true)]
    pub redis_url: Option<String>,
    /// Longest wait for one Redis call of the shared gate, in milliseconds (default 25);
    /// past it, the gate is bypassed for a second.
    #[arg(long, env = "ONCEPRINT_REDIS_TIMEOUT_MS", value_name = "MS")]
    pub redis_timeout_ms: Option<u64>,
    /// Put before every key of the shared gate, so that one Redis can serve several
    /// clusters (default onceprint:). Every node of one database must use the same.
    #[arg(long, env = "ONCEPRINT_REDIS_PREFIX")]
    pub redis_prefix: Option<String>,
    /// Mark the console's cookies Secure on every answer (use when the broker is reached
    /// only over HTTPS; without it they are Secure when X-Forwarded-Proto says https).
    #[arg(long, env = "ONCEPRINT_CONSOLE_SECURE_COOKIES")]
    pub console_secure_cookies: bool,
    /// Serve HTTPS: the certificate chain, PEM, leaf first (with --tls-key).
    #[arg(long, env = "ONCEPRINT_TLS_CERT", value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert, PEM (PKCS#8, PKCS#1 or SEC1).
    #[arg(long, env = "ONCEPRINT_TLS_KEY", value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Requests per second one tenant may make with its API keys, sustained (default 500;
    /// 0: unlimited). Over it: 429 with Retry-After. Retries of tasks already accepted are
    /// always answered.
    #[arg(long, env = "ONCEPRINT_TENANT_RATE_LIMIT", value_name = "PER_SECOND")]
    pub tenant_rate_limit: Option<f64>,
    /// Requests one tenant may make at once above the sustained rate (default 2 × the rate).
    #[arg(long, env = "ONCEPRINT_TENANT_RATE_BURST", value_name = "REQUESTS")]
    pub tenant_rate_burst: Option<f64>,
    /// Requests per second one store's agent token may make (default 100; 0: unlimited);
    /// acks, which finish work, are never counted or refused.
    #[arg(long, env = "ONCEPRINT_AGENT_RATE_LIMIT", value_name = "PER_SECOND")]
    pub agent_rate_limit: Option<f64>,
    /// Requests one agent may make at once above its rate (default 2 × the rate).
    #[arg(long, env = "ONCEPRINT_AGENT_RATE_BURST", value_name = "REQUESTS")]
    pub agent_rate_burst: Option<f64>,
    /// Requests per second each enabled agent printer of a store adds to its agent's rate
    /// limit, where that comes to more than --agent-rate-limit (default 4; the burst grows
    /// in proportion; 0: the agent has --agent-rate-limit whatever it drives).
    #[arg(long, env = "ONCEPRINT_AGENT_RATE_PER_PRINTER", value_name = "PER_SECOND")]
    pub agent_rate_per_printer: Option<f64>,
    /// Finished tasks (printed, transferred, cancelled, closed) whose last change is more
    /// than this many days old are pruned: content and audit trail deleted, a tombstone
    /// and the ledger kept (default 90; 0 keeps every task for ever).
    #[arg(long, env = "ONCEPRINT_RETENTION_DAYS", value_name = "DAYS")]
    pub retention_days: Option<u32>,
    /// This node's id in a cluster of nodes on one PostgreSQL: the holder of its leases, in
    /// its logs and in /metrics (default: a random id per process).
    #[arg(long, env = "ONCEPRINT_NODE_ID")]
    pub node_id: Option<String>,
    /// With PostgreSQL: tell the other broker nodes on the same schema of new work, freed
    /// lanes and set-up changes at once, over LISTEN/NOTIFY (default true). With false, the
    /// other nodes find work at their next re-check and changes after the directory's TTL.
    #[arg(long, env = "ONCEPRINT_NODE_LINK", value_name = "BOOL")]
    pub node_link: Option<bool>,
    /// A waiting long poll looks at its lanes again after this long even without a signal
    /// (default 30000 ms: signals and due times wake polls, this only covers a lost
    /// signal; 1000 ms on PostgreSQL with --node-link=false, where re-checks are how a
    /// node learns of work committed on another).
    #[arg(long, env = "ONCEPRINT_POLL_RECHECK_MS", value_name = "MS")]
    pub poll_recheck_ms: Option<u64>,
    /// Threads that run the broker's HTTP and async work (default: on SQLite one fewer
    /// than the machine's cores, at least 1, so that the SQLite writer thread keeps a core
    /// of its own; on PostgreSQL one per core).
    #[arg(long, env = "ONCEPRINT_WORKER_THREADS", value_name = "N")]
    pub worker_threads: Option<usize>,
    /// Tests of the real binary only: task ids are minted from a clock this many
    /// milliseconds off the wall clock (negative: behind), like a node whose clock is wrong.
    #[arg(long, env = "ONCEPRINT_TEST_ID_CLOCK_OFFSET_MS", hide = true, allow_hyphen_values = true)]
    pub test_id_clock_offset_ms: Option<i64>,
    /// Tests of the real binary only: the retention job's clock runs this many
    /// milliseconds ahead of the wall clock.
    #[arg(long, env = "ONCEPRINT_TEST_RETENTION_CLOCK_OFFSET_MS", hide = true)]
    pub test_retention_clock_offset_ms: Option<i64>,
}

/// `--public-url` checked: http(s)://HOST[:PORT][/PREFIX], without a query, fragment or
/// login, and without its trailing slash.
fn public_url(url: &str) -> anyhow::Result<String> {
    let bad = |why: &str| anyhow::anyhow!("--public-url {url:?}: {why}; expected http(s)://HOST[:PORT][/PREFIX]");
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .ok_or_else(|| bad("the scheme must be http:// or https://"))?;
    let host = rest.split('/').next().unwrap_or_default();
    if host.is_empty() || host.contains('@') {
        return Err(bad("a host is needed, without a login"));
    }
    if url.contains(['?', '#']) || url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad("no query, fragment or spaces are taken"));
    }
    Ok(url.trim_end_matches('/').to_owned())
}

/// A rate limit from its settings: `None` when the rate is 0 (unlimited).
fn rate_limit(
    what: &str,
    rate: Option<f64>,
    burst: Option<f64>,
    default_rate: f64,
) -> anyhow::Result<Option<onceprint_engine::limits::RateLimit>> {
    let rate = rate.unwrap_or(default_rate);
    if !rate.is_finite() || rate < 0.0 {
        anyhow::bail!("{what}_rate_limit: must be a number of requests per second, 0 or more (0: unlimited)");
    }
    if rate == 0.0 {
        return Ok(None);
    }
    let burst = burst.unwrap_or(rate * 2.0);
    if !burst.is_finite() || burst < 1.0 {
        anyhow::bail!("{what}_rate_burst: must be at least 1 request");
    }
    Ok(Some(onceprint_engine::limits::RateLimit::new(rate, burst)))
}

/// The TOML file. Every key is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub listen: Option<String>,
    pub database: Option<String>,
    pub admin_token: Option<String>,
    pub max_body_bytes: Option<usize>,
    /// Largest print content after decoding (default 262144).
    pub max_content_bytes: Option<usize>,
    /// Keys remembered by the in-process duplicate gate (default 200000; 0 disables).
    pub gate_capacity: Option<usize>,
    /// Most submissions committed in one transaction (default 512).
    pub group_commit_max_batch: Option<usize>,
    /// Batches committing at once (default 3 on SQLite, 4 on PostgreSQL).
    pub group_commit_in_flight: Option<usize>,
    /// PostgreSQL connection pool size (default 16).
    pub postgres_pool_size: Option<usize>,
    /// Threads of the async runtime (default: cores − 1 on SQLite, cores on PostgreSQL).
    pub worker_threads: Option<usize>,
    /// Ledger amount charged per accepted task (default 1).
    pub charge_per_task: Option<i64>,
    /// A delivery not acknowledged after this long is offered again to the same agent
    /// (default 30000).
    pub redeliver_after_ms: Option<i64>,
    /// An agent that has not polled for this long counts as gone (default 60000).
    pub agent_gone_after_ms: Option<i64>,
    /// The line printed at the top of a reprint; `{n}` is its number
    /// (default "*** REPRINT {n} ***").
    pub reprint_banner: Option<String>,
    /// The line printed at the top of another attempt of a ticket whose earlier attempt
    /// may have printed, where the print type reprints on doubt; `{n}` is the attempt
    /// (default "*** REPRINT (MAY BE A COPY) ***").
    pub doubt_reprint_banner: Option<String>,
    /// How often the sweeper runs (default 1000).
    pub sweep_interval_ms: Option<u64>,
    /// An earlier process of an agent id quiet this long has stopped; its deliveries go to
    /// the restarted one (default 3000).
    pub takeover_quiet_ms: Option<i64>,
    /// A lane with work and no progress this long raises `printer.stalled` (default 120000).
    pub stall_after_ms: Option<i64>,
    /// A station printer paused by no paper, cover open, paper jam or offline this long
    /// hands its station tickets to the station's next printer (default 30000).
    pub station_failover_after_ms: Option<i64>,
    /// A pushed (webhook) delivery without an answer this long goes to a person (default
    /// 300000).
    pub push_doubt_after_ms: Option<i64>,
    /// A job a CloudPRNT or Epson printer fetched and did not confirm this long goes to
    /// `in_doubt`.
    pub polled_answer_within_ms: Option<i64>,
    /// See `serve --console-secure-cookies`.
    pub console_secure_cookies: Option<bool>,
    /// How long a console login lasts, in seconds (default 43200, 12 hours).
    pub console_session_ttl_s: Option<i64>,
    /// How long an operator token for the API lasts, in seconds (default 2592000, 30 days).
    pub operator_token_ttl_s: Option<i64>,
    /// Failed logins of one operator within `login_window_s` after which every attempt is
    /// refused until the window has passed (default 5).
    pub login_max_failures: Option<u32>,
    /// Default 900 (15 minutes).
    pub login_window_s: Option<i64>,
    /// Print types: replaces the built-in table when present.
    pub print_types: Option<BTreeMap<String, PrintTypePolicy>>,
    /// The MQTT server of mqtt printers (see `--mqtt-url` and its neighbours).
    pub mqtt_url: Option<String>,
    pub mqtt_username: Option<String>,
    pub mqtt_password: Option<String>,
    pub mqtt_client_id: Option<String>,
    pub mqtt_acl_dir: Option<PathBuf>,
    pub mqtt_reload_pid_file: Option<PathBuf>,
    /// See `serve --mqtt-printer-url`.
    pub mqtt_printer_url: Option<String>,
    /// See `serve --public-url`.
    pub public_url: Option<String>,
    /// An onceprint MQTT device that has not answered a job this long is sent it again
    /// with the same key (default 30000).
    pub mqtt_resend_after_ms: Option<i64>,
    /// A Star MQTT printer's job of unknown fate (the broker restarted, or the MQTT server
    /// never confirmed it) goes to a person when no result came this long after it was
    /// sent (default 20000); it is never sent again.
    pub mqtt_star_unknown_after_ms: Option<i64>,
    /// See `serve --redis-url`, `--redis-timeout-ms` and `--redis-prefix`.
    pub redis_url: Option<String>,
    pub redis_timeout_ms: Option<u64>,
    pub redis_prefix: Option<String>,
    /// How long a claim of the shared gate without a task lives, in seconds (default 30).
    pub redis_claim_ttl_s: Option<u64>,
    /// How long the shared gate remembers a committed task, in seconds (default 86400).
    pub redis_remember_ttl_s: Option<u64>,
    /// See `serve --tls-cert` and `--tls-key`.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// See `serve --tenant-rate-limit` and its neighbours.
    pub tenant_rate_limit: Option<f64>,
    pub tenant_rate_burst: Option<f64>,
    pub agent_rate_limit: Option<f64>,
    pub agent_rate_burst: Option<f64>,
    pub agent_rate_per_printer: Option<f64>,
    /// See `serve --retention-days`.
    pub retention_days: Option<u32>,
    /// Seconds between two retention runs (default 3600; the first run starts after at
    /// most a minute).
    pub retention_interval_s: Option<u64>,
    /// See `serve --node-id`.
    pub node_id: Option<String>,
    /// How often a node renews the leases of the jobs that run once per cluster (default
    /// 1000).
    pub lease_renew_ms: Option<u64>,
    /// How long a lease lasts after its last renewal: a dead node's jobs move to another
    /// node this long after it died (default 5000; at least 3 × `lease_renew_ms`).
    pub lease_ttl_ms: Option<i64>,
    /// How often a node shares what it heard of agents with the other nodes (PostgreSQL
    /// only; default 1000).
    pub agent_sync_interval_ms: Option<u64>,
    /// See `serve --node-link`.
    pub node_link: Option<bool>,
    /// See `serve --poll-recheck-ms`.
    pub poll_recheck_ms: Option<u64>,
}

/// Everything `serve` needs, resolved.
#[derive(Debug)]
pub struct Resolved {
    pub listen: String,
    pub database: String,
    pub admin_token: Option<String>,
    pub postgres_pool_size: usize,
    /// Threads of the async runtime `serve` builds.
    pub worker_threads: usize,
    pub http: HttpConfig,
}

/// The runtime's worker threads when none are configured. On SQLite every write goes
/// through one writer thread, the bottleneck of intake and delivery: with as many runtime
/// workers as cores, the workers and the writer took turns on the cores and the writer
/// waited for one. On 2 cores one worker gave intake 1-9 % more and delivery 0-6 % more
/// (up to 10 % with the agent and the printer simulator on one worker too), duplicate
/// answers no less (docs/BENCHMARKS.md, "What we tried"). PostgreSQL does its writing in its
/// own processes, where one worker fewer changed nothing, so the broker keeps tokio's
/// default of one worker per core there.
fn default_worker_threads(is_pg: bool, cores: usize) -> usize {
    if is_pg {
        cores.max(1)
    } else {
        cores.saturating_sub(1).max(1)
    }
}

pub fn resolve(args: ServeArgs) -> anyhow::Result<Resolved> {
    let file: FileConfig = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
            toml::from_str(&text).with_context(|| format!("invalid configuration in {}", path.display()))?
        }
        None => FileConfig::default(),
    };
    let database = args.database.or(file.database).unwrap_or_else(|| "sqlite://onceprint.db".into());
    let is_pg = database.starts_with("postgres://") || database.starts_with("postgresql://");
    let node_link = args.node_link.or(file.node_link).unwrap_or(true);
    let mut policies = PolicyTable::default();
    if let Some(types) = file.print_types {
        if types.is_empty() {
            anyhow::bail!("print_types: at least one print type is needed");
        }
        if !types.contains_key(onceprint_core::policy::DEFAULT_PRINT_TYPE) {
            anyhow::bail!("print_types: the default print type \"receipt\" must be configured");
        }
        for name in types.keys() {
            onceprint_core::validate_id("print_types", name).map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        policies = PolicyTable { types };
    }
    let mut content_limits = ContentLimits::default();
    if let Some(n) = file.max_content_bytes {
        content_limits.max_bytes = n;
    }
    let mqtt_printer_url = args.mqtt_printer_url.or(file.mqtt_printer_url);
    let public_url = match args.public_url.or(file.public_url) {
        Some(u) => Some(public_url(&u)?),
        None => None,
    };
    let mqtt = match args.mqtt_url.or(file.mqtt_url) {
        None => {
            if args.mqtt_acl_dir.is_some() || file.mqtt_acl_dir.is_some() {
                anyhow::bail!("--mqtt-acl-dir needs --mqtt-url");
            }
            if mqtt_printer_url.is_some() {
                anyhow::bail!("--mqtt-printer-url needs --mqtt-url");
            }
            None
        }
        Some(url) => {
            let mut m = onceprint_mqtt::MqttSettings::from_url(
                &url,
                args.mqtt_username.or(file.mqtt_username),
                args.mqtt_password.or(file.mqtt_password),
            )?;
            if let Some(id) = args.mqtt_client_id.or(file.mqtt_client_id) {
                m.client_id = id;
            }
            m.acl_dir = args.mqtt_acl_dir.or(file.mqtt_acl_dir);
            m.reload_pid_file = args.mqtt_reload_pid_file.or(file.mqtt_reload_pid_file);
            if let Some(ms) = file.mqtt_resend_after_ms {
                m.resend_after_ms = ms.max(1_000);
            }
            if let Some(ms) = file.mqtt_star_unknown_after_ms {
                m.star_unknown_after_ms = ms.max(1_000);
            }
            if m.acl_dir.is_some() && m.username.is_none() {
                return Err(onceprint_mqtt::MqttError::NoBrokerLogin.into());
            }
            if let Some(u) = &mqtt_printer_url {
                m.for_printers = onceprint_mqtt::PrinterFacing::from_url(u)?;
            }
            Some(m)
        }
    };
    if args.redis_url.is_none()
        && file.redis_url.is_none()
        && (args.redis_timeout_ms.is_some() || args.redis_prefix.is_some())
    {
        anyhow::bail!("--redis-timeout-ms and --redis-prefix need --redis-url");
    }
    let redis = match args.redis_url.or(file.redis_url) {
        None => None,
        Some(url) => {
            let mut r = onceprint_redis_gate::RedisGateSettings::new(&url);
            if let Some(ms) = args.redis_timeout_ms.or(file.redis_timeout_ms) {
                r.timeout = std::time::Duration::from_millis(ms.max(1));
            }
            if let Some(prefix) = args.redis_prefix.or(file.redis_prefix) {
                r.prefix = prefix;
            }
            if let Some(s) = file.redis_claim_ttl_s {
                r.claim_ttl = std::time::Duration::from_secs(s.max(1));
            }
            if let Some(s) = file.redis_remember_ttl_s {
                r.remember_ttl = std::time::Duration::from_secs(s.max(1));
            }
            // Checked now, so that a bad URL stops the start with its reason.
            onceprint_redis_gate::RedisGate::new(r.clone())?;
            Some(r)
        }
    };
    let tls = match (args.tls_cert.or(file.tls_cert), args.tls_key.or(file.tls_key)) {
        (Some(cert), Some(key)) => Some(onceprint_server::tls::Tls::from_pem_files(&cert, &key)?),
        (None, None) => None,
        _ => anyhow::bail!("TLS needs both a certificate (--tls-cert) and its key (--tls-key)"),
    };
    let tls_on = tls.is_some();
    let group_commit = GroupCommitConfig {
        max_batch: file.group_commit_max_batch.unwrap_or(512).max(1),
        // SQLite: 3. With 2, one batch committed while the next formed, and
        // the writer took that one alone. With 3, two batches wait while one commits and
        // the writer takes both into its next commit: half the flushes per task, 4-8 %
        // more intake with 50-task batches, single submissions and delivery unchanged
        // (docs/BENCHMARKS.md, "What we tried").
        max_in_flight: file.group_commit_in_flight.unwrap_or(if is_pg { 4 } else { 3 }).max(1),
    };
    let worker_threads = match args.worker_threads.or(file.worker_threads) {
        Some(0) => anyhow::bail!("worker_threads: at least 1 thread is needed"),
        Some(n) => n,
        None => default_worker_threads(is_pg, std::thread::available_parallelism().map_or(1, |n| n.get())),
    };
    Ok(Resolved {
        worker_threads,
        listen: args.listen.or(file.listen).unwrap_or_else(|| "127.0.0.1:8080".into()),
        database,
        admin_token: args.admin_token.or(file.admin_token).filter(|t| !t.is_empty()),
        postgres_pool_size: file.postgres_pool_size.unwrap_or(16).max(1),
        http: HttpConfig {
            max_body_bytes: args
                .max_body_bytes
                .or(file.max_body_bytes)
                .unwrap_or(onceprint_core::content::DEFAULT_MAX_BODY_BYTES),
            intake: IntakeConfig {
                policies,
                content_limits,
                gate_capacity: file.gate_capacity.unwrap_or(200_000),
                group_commit,
                charge: file.charge_per_task.unwrap_or(1),
                tenant_rate: rate_limit(
                    "tenant",
                    args.tenant_rate_limit.or(file.tenant_rate_limit),
                    args.tenant_rate_burst.or(file.tenant_rate_burst),
                    500.0,
                )?,
            },
            tls,
            agent_rate: rate_limit(
                "agent",
                args.agent_rate_limit.or(file.agent_rate_limit),
                args.agent_rate_burst.or(file.agent_rate_burst),
                100.0,
            )?,
            agent_rate_per_printer: {
                let per_printer = args
                    .agent_rate_per_printer
                    .or(file.agent_rate_per_printer)
                    .unwrap_or(onceprint_server::DEFAULT_AGENT_RATE_PER_PRINTER);
                if !per_printer.is_finite() || per_printer < 0.0 {
                    anyhow::bail!("agent_rate_per_printer: must be a number of requests per second, 0 or more");
                }
                per_printer
            },
            alerts: Default::default(),
            polled: {
                let p = onceprint_engine::transport::polled::PolledConfig::default();
                onceprint_engine::transport::polled::PolledConfig {
                    answer_within_ms: file.polled_answer_within_ms.unwrap_or(p.answer_within_ms).max(1_000),
                    ..p
                }
            },
            mqtt,
            redis,
            operators: {
                let o = onceprint_engine::OperatorsConfig::default();
                onceprint_engine::OperatorsConfig {
                    session_ttl_ms: file.console_session_ttl_s.map_or(o.session_ttl_ms, |s| s.max(1) * 1000),
                    token_ttl_ms: file.operator_token_ttl_s.map_or(o.token_ttl_ms, |s| s.max(1) * 1000),
                    login_max_failures: file.login_max_failures.unwrap_or(o.login_max_failures).max(1),
                    login_window_ms: file.login_window_s.map_or(o.login_window_ms, |s| s.max(1) * 1000),
                }
            },
            console: onceprint_server::console::ConsoleConfig {
                // Behind native TLS every answer goes over HTTPS.
                secure_cookies: args.console_secure_cookies || file.console_secure_cookies.unwrap_or(false) || tls_on,
                ..Default::default()
            },
            push: {
                let p = onceprint_engine::PushConfig::default();
                onceprint_engine::PushConfig {
                    doubt_after_ms: file.push_doubt_after_ms.unwrap_or(p.doubt_after_ms).max(1_000),
                    ..p
                }
            },
            retention: {
                let r = onceprint_engine::RetentionConfig::default();
                onceprint_engine::RetentionConfig {
                    days: args.retention_days.or(file.retention_days).unwrap_or(r.days),
                    interval: file
                        .retention_interval_s
                        .map_or(r.interval, |s| std::time::Duration::from_secs(s.max(1))),
                    ..r
                }
            },
            retention_clock_offset_ms: args.test_retention_clock_offset_ms.unwrap_or(0),
            cluster: {
                let l = onceprint_engine::LeaseConfig::default();
                let renew_every_ms = file.lease_renew_ms.unwrap_or(l.renew_every_ms).max(10);
                let node_id = args.node_id.or(file.node_id).filter(|n| !n.is_empty());
                if let Some(n) = &node_id {
                    onceprint_core::validate_id("node_id", n).map_err(|e| anyhow::anyhow!("{e}"))?;
                }
                onceprint_server::ClusterConfig {
                    node_id,
                    leases: onceprint_engine::LeaseConfig {
                        renew_every_ms,
                        // A lease must survive a missed renewal or two.
                        ttl_ms: file.lease_ttl_ms.unwrap_or(l.ttl_ms).max(3 * renew_every_ms as i64),
                    },
                    agent_sync_interval_ms: file.agent_sync_interval_ms.unwrap_or(1_000).max(10),
                    link: node_link.then(onceprint_engine::ClusterConfig::default),
                }
            },
            id_clock_offset_ms: args.test_id_clock_offset_ms.unwrap_or(0),
            // Epson printers' Digest nonces: the server's lifetime, not a setting.
            printer_nonce_ttl_ms: HttpConfig::default().printer_nonce_ttl_ms,
            public_url,
            delivery: {
                let d = DeliveryConfig::default();
                DeliveryConfig {
                    redeliver_after_ms: file.redeliver_after_ms.unwrap_or(d.redeliver_after_ms).max(100),
                    agent_gone_after_ms: file.agent_gone_after_ms.unwrap_or(d.agent_gone_after_ms).max(100),
                    sweep_interval_ms: file.sweep_interval_ms.unwrap_or(d.sweep_interval_ms).max(10),
                    takeover_quiet_ms: file.takeover_quiet_ms.unwrap_or(d.takeover_quiet_ms).max(0),
                    stall_after_ms: file.stall_after_ms.unwrap_or(d.stall_after_ms).max(1_000),
                    station_failover_after_ms: file
                        .station_failover_after_ms
                        .unwrap_or(d.station_failover_after_ms)
                        .max(0),
                    recheck_ms: args
                        .poll_recheck_ms
                        .or(file.poll_recheck_ms)
                        .unwrap_or(if is_pg && !node_link { UNLINKED_RECHECK_MS } else { d.recheck_ms })
                        .max(10),
                    reprint_banner: file.reprint_banner.unwrap_or(d.reprint_banner),
                    doubt_reprint_banner: file.doubt_reprint_banner.unwrap_or(d.doubt_reprint_banner),
                }
            },
        },
    })
}

#[cfg(test)]
mod tests {
    use super::default_worker_threads;

    #[test]
    fn sqlite_leaves_its_writer_a_core_and_postgres_takes_them_all() {
        assert_eq!(default_worker_threads(false, 1), 1);
        assert_eq!(default_worker_threads(false, 2), 1);
        assert_eq!(default_worker_threads(false, 8), 7);
        assert_eq!(default_worker_threads(true, 1), 1);
        assert_eq!(default_worker_threads(true, 2), 2);
        assert_eq!(default_worker_threads(true, 8), 8);
    }
}
