//! The HTTP client for the broker's agent endpoints. Outbound requests only, so the agent
//! works from behind NAT and store firewalls.
//!
//! The client knows one or more brokers (`--server` repeated: the nodes of one cluster, or
//! a load balancer and a node behind it). It keeps using one broker while that broker
//! answers and moves to the next one in the list when a request to it fails in a way that
//! says "this node cannot serve now": no connection, a timeout, a 5xx, or a protocol
//! version it does not speak. Every clone of the client (the poll loop, the ack sender,
//! the status reporter) shares the choice, so one process talks to one broker at a time
//! with one agent id and one session. Nothing else changes on failover: the caller backs
//! off and retries as before, and an ack that did not get through is retried on the next
//! broker (the journal keeps printed work from being printed again if the next broker
//! hands it out once more).
//!
//! Every request carries the agent protocol version ([`PROTOCOL_HEADER`]); a broker that
//! cannot serve it answers `426 agent_protocol_unsupported` and names the versions it
//! speaks in [`BROKER_PROTOCOLS_HEADER`] (docs: README, "Agent protocol versions").

use crate::backoff::Backoff;
use crate::protocol::{
    Ack, AcksRequest, AcksResponse, Delivery, PollRequest, PollResponse, PrinterStatusReport, StatusRequest,
    StatusResponse, WatchedPrinter,
};
use reqwest::header::RETRY_AFTER;
use reqwest::{StatusCode, Url};
use std::error::Error as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// The request header naming the agent protocol version the agent speaks.
pub const PROTOCOL_HEADER: &str = "onceprint-agent-protocol";
/// The answer header in which a broker names the agent protocol versions it serves, as
/// `MIN-MAX` (e.g. `1-1`).
pub const BROKER_PROTOCOLS_HEADER: &str = "onceprint-agent-protocols";
/// The newest agent protocol this agent speaks. Version 1 is the protocol of every release
/// before it (an agent that sends no header is taken to speak 1); version 2 adds `next` to
/// the acks, whose answer then carries the printers' next deliveries; version 3 adds the
/// process's age to the polls (`session_age_ms`), so that the broker orders this agent
/// id's sessions on its own clock, whatever the shop PC's clock says; version 4 adds the
/// agent's clock to the upload of offline tasks (`sent_at`), so that the broker corrects
/// the times of a shop PC whose clock is far off. A version is raised only for a change
/// an older broker would misread or refuse.
pub const PROTOCOL_VERSION: u32 = 4;
/// The oldest agent protocol this agent speaks, and the one it names to a broker whose
/// range it has not heard yet. Every request names the newest version that both speak,
/// as far as the broker's last answer (its [`BROKER_PROTOCOLS_HEADER`]) told.
pub const OLDEST_PROTOCOL: u32 = 1;
/// The wait before asking again a broker that does not speak this agent's protocol: it
/// will not learn to until it is upgraded, so asking often would only fill both logs.
const PROTOCOL_WAIT: Duration = Duration::from_secs(60);

/// How long a probe of a broker that stopped answering may take (`GET /healthz`).
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long an ack POST may take before it is treated as failed and retried.
const ACK_TIMEOUT: Duration = Duration::from_secs(10);
/// Slack on top of the long-poll wait before the poll request is given up.
const POLL_SLACK: Duration = Duration::from_secs(10);
/// The wait after a 401: the token is wrong now but may be re-issued; asking every few
/// hundred milliseconds would only fill the broker's log.
const UNAUTHORIZED_WAIT: Duration = Duration::from_secs(60);
/// Bounds on a Retry-After we obey: one bogus header must neither silence a store for
/// hours nor (with `0`) turn the agent into a tight loop against a broker that is already
/// overloaded.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);
const MIN_RETRY_AFTER: Duration = Duration::from_millis(250);

#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// No connection to the broker could be made: the request was never sent.
    #[error("cannot reach the broker: {0}")]
    Unreachable(String),
    /// The request may have reached the broker, but no answer came back (a timeout, a
    /// connection that broke after the request went out).
    #[error("no answer from the broker: {0}")]
    Transport(String),
    #[error(
        "the broker refused the agent token (401): check --token; a store's token is issued \
         with POST /v1/stores/{{id}}/agent-tokens"
    )]
    Unauthorized,
    #[error("the broker asks to slow down (429)")]
    RateLimited { retry_after: Option<Duration> },
    #[error("the broker answered {status}: {body}")]
    Status { status: u16, body: String },
    #[error("the broker's answer could not be read: {0}")]
    Decode(String),
    /// 409 `agent_superseded`: another process with this agent id started later and took
    /// over; this one must stop.
    #[error("{0}")]
    Superseded(String),
    /// 426 `agent_protocol_unsupported`: the broker does not speak this agent's protocol
    /// version. `broker` is the range it named (`MIN-MAX`), when it named one.
    #[error(
        "the broker does not speak agent protocol {agent} (it speaks {}): {message}",
        broker.as_deref().unwrap_or("an unknown range")
    )]
    ProtocolUnsupported { agent: u32, broker: Option<String>, message: String },
}

impl BrokerError {
    /// How long to wait before the next try after this error: exponential backoff
    /// for network errors and 5xx, what the broker said for 429, a slow fixed pace for 401.
    pub fn retry_delay(&self, backoff: &mut Backoff) -> Duration {
        match self {
            BrokerError::Unauthorized => UNAUTHORIZED_WAIT,
            BrokerError::ProtocolUnsupported { .. } => PROTOCOL_WAIT,
            BrokerError::RateLimited { retry_after: Some(d) } => (*d).clamp(MIN_RETRY_AFTER, MAX_RETRY_AFTER),
            _ => backoff.next_delay(),
        }
    }

    /// Whether this error says the broker node cannot serve now, so that another node of
    /// the list may: no connection or a timeout, a 5xx, or a protocol version it does not
    /// speak (during a rolling upgrade another node may). A 4xx about the request itself
    /// (401, 409, 429) would be the same on every node.
    /// Whether the request may have reached the broker and taken effect although no
    /// answer says so: the answer was lost (a timeout, a connection that broke after the
    /// request went out) or could not be read. A connection never made, and any answer
    /// the broker gave (an error status included), say what became of the request.
    pub fn answer_lost(&self) -> bool {
        matches!(self, BrokerError::Transport(_) | BrokerError::Decode(_))
    }

    pub fn fails_over(&self) -> bool {
        match self {
            BrokerError::Unreachable(_) | BrokerError::Transport(_) | BrokerError::ProtocolUnsupported { .. } => true,
            BrokerError::Status { status, .. } => *status >= 500,
            _ => false,
        }
    }
}

fn transport(e: reqwest::Error) -> BrokerError {
    // reqwest's own message is only "error sending request for url"; the cause (refused,
    // reset, timed out) is further down the chain and is what an operator needs.
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    if e.is_connect() {
        BrokerError::Unreachable(msg)
    } else {
        BrokerError::Transport(msg)
    }
}

/// One broker of the list: its base URL (for log lines), its three endpoints, and the
/// range of agent protocol versions it named in its last answer.
#[derive(Debug)]
struct Endpoint {
    base: String,
    poll_url: Url,
    acks_url: Url,
    status_url: Url,
    /// `MIN << 32 | MAX` of the broker's last `Onceprint-Agent-Protocols`; 0 before any
    /// answer named one (a broker of a release before versioning never does).
    serves: AtomicU64,
}

impl Endpoint {
    /// Remembers the range an answer of this broker named.
    fn heard(&self, headers: &reqwest::header::HeaderMap) {
        let range = headers.get(BROKER_PROTOCOLS_HEADER).and_then(|v| v.to_str().ok()).and_then(|v| {
            let (min, max) = v.trim().split_once('-')?;
            Some((min.trim().parse::<u32>().ok()?, max.trim().parse::<u32>().ok()?))
        });
        if let Some((min, max)) = range.filter(|(min, max)| min <= max) {
            self.serves.store(u64::from(min) << 32 | u64::from(max), Ordering::Relaxed);
        }
    }

    /// The version to name in a request: the newest that this agent and the broker both
    /// speak, as far as the broker told; [`OLDEST_PROTOCOL`] while it has not told, or
    /// when it serves none that this agent speaks (it then answers 426, naming its range).
    fn version(&self) -> u32 {
        let serves = self.serves.load(Ordering::Relaxed);
        let (min, max) = ((serves >> 32) as u32, serves as u32);
        let newest = max.min(PROTOCOL_VERSION);
        if serves != 0 && newest >= min.max(OLDEST_PROTOCOL) {
            newest
        } else {
            OLDEST_PROTOCOL
        }
    }

    /// The URL of `path` (starting with `/`) on this broker.
    fn url(&self, path: &str) -> Result<Url, BrokerError> {
        Url::parse(&format!("{}{path}", self.base)).map_err(|e| BrokerError::Decode(format!("{path}: {e}")))
    }

    fn parse(server: &str) -> Result<Endpoint, String> {
        let base = server.trim().trim_end_matches('/');
        let parse = |path: &str| Url::parse(&format!("{base}{path}")).map_err(|e| format!("{server:?}: {e}"));
        let poll_url = parse("/v1/agent/poll")?;
        match poll_url.scheme() {
            "http" | "https" => {}
            other => {
                return Err(format!(
                    "{server:?}: unsupported scheme {other:?}; use http://HOST:PORT or https://HOST:PORT"
                ))
            }
        }
        Ok(Endpoint {
            base: base.to_owned(),
            poll_url,
            acks_url: parse("/v1/agent/acks")?,
            status_url: parse("/v1/agent/status")?,
            serves: AtomicU64::new(0),
        })
    }
}

/// The broker's answer to a forwarded LAN submission.
#[derive(Debug, Clone)]
pub struct Forwarded {
    pub status: u16,
    pub location: Option<String>,
    pub body: Vec<u8>,
}

/// Whether the brokers answer, as every request of every clone of the client found: the
/// LAN listener's `/healthz` reports it, and the poll loop, backing off after failures,
/// resumes as soon as any request (a sync, a forward, a probe) is answered again.
#[derive(Debug)]
struct Reach {
    /// The monotonic origin of the two times below.
    origin: std::time::Instant,
    /// Milliseconds after `origin` (plus one, so that 0 means never) of the last answer:
    /// any HTTP answer but a 5xx, since a 401 or a 409 comes from a broker that is there.
    answered: AtomicU64,
    /// The same for the last request that found no broker: no connection, a timeout, a 5xx.
    failed: AtomicU64,
    last_error: Mutex<Option<String>>,
    /// Woken when an answer follows a failure.
    back: Notify,
}

/// What the agent knows of the brokers' reachability now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reachability {
    /// `Some(true)` when the last request that ended was answered, `Some(false)` when it
    /// found no broker, `None` before any request ended.
    pub reachable: Option<bool>,
    /// How long ago the last answer came, if one ever did.
    pub last_answer_ago: Option<Duration>,
    /// The last request's error, while the brokers do not answer.
    pub last_error: Option<String>,
}

impl Reach {
    fn new() -> Reach {
        Reach {
            origin: std::time::Instant::now(),
            answered: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            last_error: Mutex::new(None),
            back: Notify::new(),
        }
    }

    fn now(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64 + 1
    }

    /// Records how a request ended.
    fn record<T>(&self, outcome: &Result<T, BrokerError>) {
        let now = self.now();
        match outcome {
            Err(e) if e.fails_over() => {
                self.failed.fetch_max(now, Ordering::Relaxed);
                if let Ok(mut l) = self.last_error.lock() {
                    *l = Some(e.to_string());
                }
            }
            _ => {
                let failing = self.failed.load(Ordering::Relaxed) > self.answered.load(Ordering::Relaxed);
                self.answered.fetch_max(now, Ordering::Relaxed);
                if failing {
                    self.back.notify_waiters();
                }
            }
        }
    }

    fn reachability(&self) -> Reachability {
        let (answered, failed) = (self.answered.load(Ordering::Relaxed), self.failed.load(Ordering::Relaxed));
        let reachable = match (answered, failed) {
            (0, 0) => None,
            (a, f) => Some(a >= f),
        };
        let now = self.now();
        Reachability {
            reachable,
            last_answer_ago: (answered > 0).then(|| Duration::from_millis(now.saturating_sub(answered))),
            last_error: if reachable == Some(false) {
                self.last_error.lock().ok().and_then(|l| l.clone())
            } else {
                None
            },
        }
    }
}

/// A client for one or more brokers with one agent token.
#[derive(Clone)]
pub struct BrokerClient {
    http: reqwest::Client,
    brokers: Arc<[Endpoint]>,
    /// The index into `brokers` of the broker in use, shared by every clone.
    current: Arc<AtomicUsize>,
    token: String,
    /// Who this process is, sent with the acks.
    agent_id: Option<String>,
    session: Option<String>,
    /// When this process's session began, on the monotonic clock: its age goes with the
    /// polls (agent protocol 3).
    started: std::time::Instant,
    /// Whether the brokers answer, shared by every clone.
    reach: Arc<Reach>,
}

impl std::fmt::Debug for BrokerClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerClient").field("brokers", &self.brokers).finish_non_exhaustive()
    }
}

impl BrokerClient {
    /// `server` is the broker's base URL (`http://HOST:PORT` or `https://HOST:PORT`,
    /// optionally with a path prefix). `ca_cert` is a PEM file of certificate authorities
    /// to trust for an https broker besides the public ones built in (a broker with a
    /// private or self-signed certificate). Returns a human-readable reason when it is
    /// unusable.
    pub fn new(
        server: &str,
        token: &str,
        connect_timeout: Duration,
        ca_cert: Option<&std::path::Path>,
    ) -> Result<BrokerClient, String> {
        Self::with_brokers(&[server], token, connect_timeout, ca_cert)
    }

    /// A client for several brokers (the nodes of one cluster), used one at a time in the
    /// order given, starting with the first; see the module documentation for when it
    /// moves on. Each URL is checked as in [`BrokerClient::new`].
    pub fn with_brokers(
        servers: &[impl AsRef<str>],
        token: &str,
        connect_timeout: Duration,
        ca_cert: Option<&std::path::Path>,
    ) -> Result<BrokerClient, String> {
        let brokers = servers.iter().map(|s| Endpoint::parse(s.as_ref())).collect::<Result<Vec<_>, _>>()?;
        if brokers.is_empty() {
            return Err("no broker URL given".into());
        }
        if token.is_empty() {
            return Err("the agent token is empty".into());
        }
        let mut builder = reqwest::Client::builder()
            .connect_timeout(connect_timeout)
            .user_agent(concat!("onceprint-agent/", env!("CARGO_PKG_VERSION")));
        if let Some(path) = ca_cert {
            let pem = std::fs::read(path).map_err(|e| format!("cannot read --ca-cert {}: {e}", path.display()))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| format!("--ca-cert {}: not a PEM certificate: {e}", path.display()))?;
            if certs.is_empty() {
                return Err(format!("--ca-cert {}: no certificate in it", path.display()));
            }
            for c in certs {
                builder = builder.add_root_certificate(c);
            }
        }
        let http = builder.build().map_err(|e| e.to_string())?;
        Ok(BrokerClient {
            http,
            brokers: brokers.into(),
            current: Arc::new(AtomicUsize::new(0)),
            token: token.to_owned(),
            agent_id: None,
            session: None,
            started: std::time::Instant::now(),
            reach: Arc::new(Reach::new()),
        })
    }

    /// Whether the brokers answer, as the last requests of this process found.
    pub fn reachability(&self) -> Reachability {
        self.reach.reachability()
    }

    /// Completes when a request is answered after requests failed (returns at once if the
    /// last request that ended was answered).
    pub async fn answered_again(&self) {
        let back = self.reach.back.notified();
        tokio::pin!(back);
        back.as_mut().enable();
        if self.reach.reachability().reachable != Some(false) {
            return;
        }
        back.await;
    }

    /// Asks the broker in use whether it answers at all (`GET /healthz`, no token, a short
    /// timeout), recording the outcome like any request. Used while the poll loop backs
    /// off, so that polling resumes within seconds of the broker's return rather than at
    /// the end of a backoff step of up to 30 s.
    pub async fn probe(&self) -> bool {
        let used = self.current.load(Ordering::Relaxed) % self.brokers.len();
        let answer = match self.brokers[used].url("/healthz") {
            Ok(url) => match self.http.get(url).timeout(PROBE_TIMEOUT).send().await {
                Ok(resp) if resp.status().is_server_error() => {
                    Err(BrokerError::Status { status: resp.status().as_u16(), body: String::new() })
                }
                Ok(_) => Ok(()),
                Err(e) => Err(transport(e)),
            },
            Err(e) => Err(e),
        };
        self.reach.record(&answer);
        answer.is_ok()
    }

    /// The same client, acknowledging as `agent_id` in `session`, which begins now.
    pub fn identified(mut self, agent_id: &str, session: &str) -> BrokerClient {
        self.agent_id = Some(agent_id.to_owned());
        self.session = Some(session.to_owned());
        self.started = std::time::Instant::now();
        self
    }

    /// Long-polls for deliveries: the broker answers as soon as work exists or after
    /// `wait_ms`. A broker that speaks agent protocol 3 is told how long this process's
    /// session has been running (an older one would refuse the field).
    pub async fn poll(&self, req: &PollRequest) -> Result<Vec<Delivery>, BrokerError> {
        let timeout = Duration::from_millis(req.wait_ms) + POLL_SLACK;
        let used = self.current.load(Ordering::Relaxed) % self.brokers.len();
        let version = self.brokers[used].version();
        let mut req = req.clone();
        req.session_age_ms = (version >= 3).then(|| self.started.elapsed().as_millis() as u64);
        let resp = self.request_to(used, |e| Ok(e.poll_url.clone()), timeout, &req, version).await?;
        let body: PollResponse = resp.json().await.map_err(|e| BrokerError::Decode(e.to_string()))?;
        Ok(body.deliveries)
    }

    /// Reports idle printers' status (`POST /v1/agent/status`); answers the printers the
    /// broker wants watched.
    pub async fn send_status(&self, printers: &[PrinterStatusReport]) -> Result<Vec<WatchedPrinter>, BrokerError> {
        let body = StatusRequest {
            agent_id: self.agent_id.clone().unwrap_or_default(),
            session: self.session.clone(),
            printers: printers.to_vec(),
        };
        let resp = self.request(|e| Ok(e.status_url.clone()), ACK_TIMEOUT, &body).await?;
        let answer: StatusResponse = resp.json().await.map_err(|e| BrokerError::Decode(e.to_string()))?;
        Ok(answer.printers)
    }

    /// GETs `path` (below the base URL) of the broker in use and reads its JSON answer.
    pub async fn get_json<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<T, BrokerError> {
        let used = self.current.load(Ordering::Relaxed) % self.brokers.len();
        let broker = &self.brokers[used];
        let url = broker.url(path)?;
        let version = broker.version();
        let sent = self
            .http
            .get(url)
            .bearer_auth(&self.token)
            .header(PROTOCOL_HEADER, version)
            .timeout(ACK_TIMEOUT)
            .send()
            .await;
        let answer = match sent {
            Ok(resp) => {
                broker.heard(resp.headers());
                check(resp, version).await
            }
            Err(e) => Err(transport(e)),
        };
        self.reach.record(&answer);
        if let Err(e) = &answer {
            self.fail_over(used, e);
        }
        answer?.json().await.map_err(|e| BrokerError::Decode(e.to_string()))
    }

    /// POSTs `body` as JSON to `path` (below the base URL) and reads the JSON answer.
    pub async fn post_json<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: &impl serde::Serialize,
        timeout: Duration,
    ) -> Result<T, BrokerError> {
        let resp = self.request(|e| e.url(path), timeout, body).await?;
        resp.json().await.map_err(|e| BrokerError::Decode(e.to_string()))
    }

    /// Forwards a LAN submission's body verbatim to `POST /v1/agent/print-tasks` (naming
    /// `lan_printer`, the printer this agent would print a station task on) and
    /// returns the broker's answer as it is (status, `Location`, body), whatever the
    /// status, so the POS gets exactly the broker's words. An error only when no answer
    /// came within `timeout` or the broker answered 5xx: the caller then takes the
    /// offline path.
    pub async fn forward_submission(
        &self,
        body: Vec<u8>,
        lan_printer: Option<&str>,
        timeout: Duration,
    ) -> Result<Forwarded, BrokerError> {
        let used = self.current.load(Ordering::Relaxed) % self.brokers.len();
        let broker = &self.brokers[used];
        let url = broker.url("/v1/agent/print-tasks")?;
        let mut request = self
            .http
            .post(url)
            .bearer_auth(&self.token)
            .header(PROTOCOL_HEADER, broker.version())
            .header(reqwest::header::CONTENT_TYPE, "application/json");
        if let Some(p) = lan_printer {
            request = request.header(crate::lan::LAN_PRINTER_HEADER, p);
        }
        let sent = request.timeout(timeout).body(body).send().await;
        let answer = async {
            let resp = sent.map_err(transport)?;
            broker.heard(resp.headers());
            let status = resp.status().as_u16();
            let location =
                resp.headers().get(reqwest::header::LOCATION).and_then(|v| v.to_str().ok()).map(str::to_owned);
            let body = resp.bytes().await.map_err(transport)?.to_vec();
            if status >= 500 {
                return Err(BrokerError::Status { status, body: String::from_utf8_lossy(&body).into_owned() });
            }
            Ok(Forwarded { status, location, body })
        }
        .await;
        self.reach.record(&answer);
        if let Err(e) = &answer {
            self.fail_over(used, e);
        }
        answer
    }

    /// The base URL of the broker in use now.
    pub fn current_broker(&self) -> &str {
        &self.brokers[self.current.load(Ordering::Relaxed) % self.brokers.len()].base
    }

    /// POSTs `body` as JSON with the agent's token and protocol version to the endpoint
    /// `url` picks of the broker in use; a non-2xx answer is an error. An error that says
    /// the node cannot serve moves the client to the next broker for the next request.
    async fn request(
        &self,
        url: impl Fn(&Endpoint) -> Result<Url, BrokerError>,
        timeout: Duration,
        body: &impl serde::Serialize,
    ) -> Result<reqwest::Response, BrokerError> {
        let used = self.current.load(Ordering::Relaxed) % self.brokers.len();
        self.request_to(used, &url, timeout, body, self.brokers[used].version()).await
    }

    /// [`BrokerClient::request`] to broker `used`, naming protocol `version`.
    async fn request_to(
        &self,
        used: usize,
        url: impl Fn(&Endpoint) -> Result<Url, BrokerError>,
        timeout: Duration,
        body: &impl serde::Serialize,
        version: u32,
    ) -> Result<reqwest::Response, BrokerError> {
        let broker = &self.brokers[used];
        let sent = self
            .http
            .post(url(broker)?)
            .bearer_auth(&self.token)
            .header(PROTOCOL_HEADER, version)
            .timeout(timeout)
            .json(body)
            .send()
            .await;
        let answer = match sent {
            Ok(resp) => {
                broker.heard(resp.headers());
                check(resp, version).await
            }
            Err(e) => Err(transport(e)),
        };
        self.reach.record(&answer);
        if let Err(e) = &answer {
            self.fail_over(used, e);
        }
        answer
    }

    /// Moves to the broker after `used` when `e` says `used` cannot serve. Only the first
    /// of several requests that failed on the same broker at once moves the client, so a
    /// burst of failures skips one broker, not several.
    fn fail_over(&self, used: usize, e: &BrokerError) {
        let n = self.brokers.len();
        if n < 2 || !e.fails_over() {
            return;
        }
        let next = (used + 1) % n;
        if self.current.compare_exchange(used, next, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
            tracing::warn!(
                left = %self.brokers[used].base,
                now_using = %self.brokers[next].base,
                error = %e,
                "broker failed; failing over to the next broker"
            );
        }
    }

    /// Whether the broker in use speaks agent protocol `version` (as far as its last
    /// answer told).
    pub fn speaks(&self, version: u32) -> bool {
        self.brokers[self.current.load(Ordering::Relaxed) % self.brokers.len()].version() >= version
    }

    /// Whether the broker in use hands out the next deliveries with acks (agent protocol
    /// 2, as far as its last answer told).
    pub fn takes_next(&self) -> bool {
        self.brokers[self.current.load(Ordering::Relaxed) % self.brokers.len()].version() >= 2
    }

    /// Sends acknowledgements; `Ok` means the broker has taken them (200). With `next` > 0
    /// and a broker that speaks agent protocol 2 the acks ask for the next deliveries of
    /// the printers whose tasks they end, at most `next`, and the answer carries them;
    /// otherwise it carries none.
    pub async fn send_acks(&self, acks: &[Ack], next: usize) -> Result<AcksResponse, BrokerError> {
        let used = self.current.load(Ordering::Relaxed) % self.brokers.len();
        let version = self.brokers[used].version();
        let next = (next > 0 && version >= 2).then_some(next);
        let body =
            AcksRequest { acks: acks.to_vec(), agent_id: self.agent_id.clone(), session: self.session.clone(), next };
        let resp = self.request_to(used, |e| Ok(e.acks_url.clone()), ACK_TIMEOUT, &body, version).await?;
        // The acks are applied once the broker answered 200; an unreadable body costs the
        // per-ack verdicts in the log and the deliveries it carried, which come back to
        // this agent after their deadline (and its journal answers them), so it is not a
        // reason to send the acks again.
        match resp.json::<AcksResponse>().await {
            Ok(r) => Ok(r),
            Err(e) => {
                tracing::warn!(error = %e, "the broker took the acks but its answer could not be read");
                Ok(AcksResponse::default())
            }
        }
    }
}

async fn check(resp: reqwest::Response, version: u32) -> Result<reqwest::Response, BrokerError> {
    let status = resp.status();
    if status == StatusCode::OK {
        return Ok(resp);
    }
    if status == StatusCode::UNAUTHORIZED {
        return Err(BrokerError::Unauthorized);
    }
    if status == StatusCode::TOO_MANY_REQUESTS {
        let retry_after = resp
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        return Err(BrokerError::RateLimited { retry_after });
    }
    let broker_range = resp.headers().get(BROKER_PROTOCOLS_HEADER).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let mut body = resp.text().await.unwrap_or_default();
    if status == StatusCode::UPGRADE_REQUIRED {
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        if v["error"]["code"] == "agent_protocol_unsupported" {
            let message = v["error"]["message"].as_str().unwrap_or("").to_owned();
            return Err(BrokerError::ProtocolUnsupported { agent: version, broker: broker_range, message });
        }
    }
    if status == StatusCode::CONFLICT {
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        if v["error"]["code"] == "agent_superseded" {
            let message = v["error"]["message"].as_str().unwrap_or("another agent process took over").to_owned();
            return Err(BrokerError::Superseded(message));
        }
    }
    if body.len() > 500 {
        let mut cut = 500;
        while !body.is_char_boundary(cut) {
            cut -= 1;
        }
        body.truncate(cut);
        body.push('…');
    }
    Err(BrokerError::Status { status: status.as_u16(), body })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_delays_follow_r21() {
        let mut b = Backoff::default();
        let told = BrokerError::RateLimited { retry_after: Some(Duration::from_secs(7)) };
        assert_eq!(told.retry_delay(&mut b), Duration::from_secs(7));
        let zero = BrokerError::RateLimited { retry_after: Some(Duration::ZERO) };
        assert_eq!(zero.retry_delay(&mut b), MIN_RETRY_AFTER);
        let huge = BrokerError::RateLimited { retry_after: Some(Duration::from_secs(86_400)) };
        assert_eq!(huge.retry_delay(&mut b), MAX_RETRY_AFTER);
        assert_eq!(BrokerError::Unauthorized.retry_delay(&mut b), UNAUTHORIZED_WAIT);
        assert_eq!(b.failures(), 0, "told waits do not grow the backoff");
        let down = BrokerError::Unreachable("refused".into());
        assert!(down.retry_delay(&mut b) <= Duration::from_millis(500));
        assert!(down.retry_delay(&mut b) <= Duration::from_secs(1));
        assert_eq!(b.failures(), 2);
    }

    #[test]
    fn only_plain_http_urls_are_accepted() {
        let t = Duration::from_secs(1);
        assert!(BrokerClient::new("http://127.0.0.1:8080", "tok", t, None).is_ok());
        assert!(BrokerClient::new("http://broker.local/onceprint/", "tok", t, None).is_ok());
        assert!(BrokerClient::new("https://broker.example", "tok", t, None).is_ok());
        assert!(BrokerClient::new("ftp://broker.example", "tok", t, None).is_err());
        assert!(BrokerClient::new("broker:8080", "tok", t, None).is_err());
        assert!(BrokerClient::new("http://127.0.0.1:8080", "", t, None).is_err());
        let missing = std::path::Path::new("/nonexistent/ca.pem");
        assert!(BrokerClient::new("https://b.example", "tok", t, Some(missing)).is_err_and(|e| e.contains("ca-cert")));
    }
}
