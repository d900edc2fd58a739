//! A simulated MQTT printer: a Star printer in CloudPRNT Version MQTT (Full MQTT / Pass
//! URL) mode or a device speaking onceprint's device protocol (docs/MQTT.md), written
//! from the documentation, not from the broker's code, so that it tests what the
//! documents promise.
//!
//! A Star printer knows only what Star's client settings page lets a person set (Star
//! CloudPRNT Protocol Guide, "Client Settings"): the server URL and an HTTP Basic user and
//! password. Before anything else it asks the server for its settings (Server setting
//! information request (GET)), which name the MQTT server, its login and whether TLS is
//! used; a server that answers 404 supports only CloudPRNT Version HTTP, and this printer,
//! which simulates an MQTT printer, reports an error ([`MqttPrinter::last_error`]) and asks
//! again later. It asks again after every lost MQTT connection, as Star's printers do. Jobs
//! come as `print-job` messages: `url` jobs are downloaded over HTTP with the printer's
//! HTTP login (Print job requests (GET)), `raw` jobs carry plain text.
//!
//! An onceprint device connects with its own login to the MQTT server it is given.
//!
//! Either connects with client id = its device id or MAC, clean session off and a last
//! will, subscribes to its own `to-device` topics, announces its status, and prints the
//! jobs it receives into the same paper log as the TCP printers (`device` and `job` set;
//! ESC/POS decoded to text, a PNG recorded by a hash of its bytes, plain text as text). It
//! acknowledges a job (PUBACK) after handling it, so a job it dropped the connection on is
//! delivered again by the MQTT server.
//!
//! What it remembers, as the real devices do: a Star printer its last ten job tokens (a
//! repeated one is answered "duplicate, not printed"); an onceprint device a journal of
//! idempotency keys (started, printed): a key printed before is answered `duplicate` /
//! `printed`, one started before a crash `duplicate` / `started`, one it is printing right
//! now not at all. The journal lives as long as the simulator process: a simulated crash
//! (a dropped connection) keeps it, as flash memory would.
//!
//! It must never print a job it has journaled as printed, and never publish a "printed"
//! result for a job whose paper-log line was not written.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use base64::Engine as _;
use onceprint_escpos::parse::{Event as Esc, Parser};
use onceprint_escpos::text::decode_text;
use rumqttc::{AsyncClient, Event, LastWill, MqttOptions, Packet, Publish, QoS};
use serde_json::{json, Value};
use tokio::sync::watch;

use crate::faults::FaultsHandle;
use crate::jobs::{Cut, Jobs, PrintedJob, Recorder};
use crate::polled::{read_star_job, star_cut, StarJob, STAR_DOTS_PER_MM};
use crate::{Faults, SimError};

/// Which device protocol the simulated printer speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// Star CloudPRNT Version MQTT, Full MQTT / Pass URL.
    Cloudprnt,
    Onceprint,
}

/// A Star printer's print width on an 80 mm roll, in millimetres (576 dots).
pub const DEFAULT_PRINT_WIDTH_MM: u16 = 72;

/// What [`MqttPrinter::start`] starts.
#[derive(Debug, Clone)]
pub struct MqttSimConfig {
    /// onceprint: the MQTT server. A Star printer does not use it: it learns its MQTT
    /// server from the server's settings answer.
    pub host: String,
    pub port: u16,
    pub protocol: Protocol,
    /// Device id (onceprint) or MAC (CloudPRNT, as it appears in topics and queries).
    pub device: String,
    /// onceprint: the MQTT login. CloudPRNT: the printer's HTTP Basic login, the only
    /// credentials a Star printer has (its MQTT login comes from the settings answer).
    pub username: Option<String>,
    pub password: Option<String>,
    /// CloudPRNT: the server URL set on the printer (`http://host:port/cloudprnt`).
    pub server_url: Option<String>,
    /// CloudPRNT: the print width in millimetres; × 8 dots per millimetre it is the only
    /// image width the printer prints (72 mm, 576 dots, on 80 mm paper; 48 mm on 58 mm).
    pub print_width_mm: u16,
    pub paper_log: Option<std::path::PathBuf>,
    pub faults: Faults,
}

impl MqttSimConfig {
    /// A Star printer in CloudPRNT Version MQTT mode, as a person sets one up: the server
    /// URL and the HTTP login; 72 mm print width, no paper log, no faults.
    pub fn cloudprnt(server_url: &str, mac: &str, username: &str, password: &str) -> MqttSimConfig {
        MqttSimConfig {
            host: String::new(),
            port: 0,
            protocol: Protocol::Cloudprnt,
            device: mac.to_owned(),
            username: Some(username.to_owned()),
            password: Some(password.to_owned()),
            server_url: Some(server_url.to_owned()),
            print_width_mm: DEFAULT_PRINT_WIDTH_MM,
            paper_log: None,
            faults: Faults::default(),
        }
    }

    /// An onceprint device on the MQTT server `host:port` with its MQTT login.
    pub fn onceprint(host: &str, port: u16, device: &str, username: &str, password: &str) -> MqttSimConfig {
        MqttSimConfig {
            host: host.to_owned(),
            port,
            protocol: Protocol::Onceprint,
            device: device.to_owned(),
            username: Some(username.to_owned()),
            password: Some(password.to_owned()),
            server_url: None,
            print_width_mm: DEFAULT_PRINT_WIDTH_MM,
            paper_log: None,
            faults: Faults::default(),
        }
    }
}

/// A running simulated MQTT printer.
pub struct MqttPrinter {
    faults: FaultsHandle,
    jobs: Jobs,
    name: String,
    problem: Arc<Mutex<Option<String>>>,
    stop: watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

/// What the devices of one simulator process share: the paper log (one file, however many
/// devices write to it) and a Star printer's HTTP client (one connection pool).
#[derive(Clone)]
pub struct Shared {
    recorder: Arc<Recorder>,
    http: reqwest::Client,
}

impl Shared {
    /// Opens the paper log at `paper_log` (none: jobs are only kept in memory).
    pub async fn open(paper_log: Option<&std::path::Path>) -> Result<Shared, SimError> {
        let http = reqwest::Client::builder()
            .user_agent(concat!("onceprint-printer-sim/", env!("CARGO_PKG_VERSION"), " (Star CloudPRNT MQTT)"))
            .build()
            .map_err(|e| SimError::Usage(format!("cannot build the printer's HTTP client: {e}")))?;
        Ok(Shared { recorder: Arc::new(Recorder::open(paper_log).await?), http })
    }

    /// Every job printed by the devices that share this.
    pub fn jobs(&self) -> Jobs {
        self.recorder.jobs()
    }
}

impl MqttPrinter {
    /// Starts the printer; it connects (and reconnects) in the background.
    pub async fn start(config: MqttSimConfig) -> Result<MqttPrinter, SimError> {
        let shared = Shared::open(config.paper_log.as_deref()).await?;
        MqttPrinter::start_shared(config, &shared).await
    }

    /// Starts the printer with the paper log and HTTP client of `shared` (its
    /// `config.paper_log` is not opened again): many devices in one process.
    pub async fn start_shared(config: MqttSimConfig, shared: &Shared) -> Result<MqttPrinter, SimError> {
        let name = match config.protocol {
            Protocol::Onceprint => tokio::net::lookup_host((config.host.as_str(), config.port))
                .await
                .ok()
                .and_then(|mut a| a.next())
                .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], config.port)))
                .to_string(),
            Protocol::Cloudprnt => {
                let url = config.server_url.as_deref().ok_or_else(|| {
                    SimError::Usage("a Star CloudPRNT printer needs its server URL (--server-url)".into())
                })?;
                settings_url(url, &config.device).map_err(SimError::Usage)?;
                format!("cloudprnt-mqtt:{}", config.device)
            }
        };
        let recorder = shared.recorder.clone();
        let faults = FaultsHandle::new(std::slice::from_ref(&name), config.faults);
        let jobs = recorder.jobs();
        let problem = Arc::new(Mutex::new(None));
        let (stop, stop_rx) = watch::channel(false);
        let device = Device {
            config,
            name: name.clone(),
            faults: faults.clone(),
            recorder,
            http: shared.http.clone(),
            problem: problem.clone(),
            tokens: VecDeque::new(),
            journal: HashMap::new(),
            connection: 0,
            current: None,
        };
        let task = tokio::spawn(device.run(stop_rx));
        Ok(MqttPrinter { faults, jobs, name, problem, stop, task: Some(task) })
    }

    pub fn faults(&self) -> FaultsHandle {
        self.faults.clone()
    }

    pub fn jobs(&self) -> Jobs {
        self.jobs.clone()
    }

    /// The name its faults and paper-log lines are kept under: an onceprint device's MQTT
    /// server address, `cloudprnt-mqtt:MAC` for a Star printer (whose MQTT server is known
    /// only once the settings answer came).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Why the printer is not working now, as a Star printer's display or self-print would
    /// say: the settings request failed, the server supports only HTTP, its MQTT settings
    /// are ones this printer cannot use, or the MQTT server they name refused it or does
    /// not answer. `None` once it is connected.
    pub fn last_error(&self) -> Option<String> {
        self.problem.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Stops the printer: its connection drops without a goodbye (its will fires).
    pub async fn shutdown(mut self) {
        self.stop.send_replace(true);
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for MqttPrinter {
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}

/// The devices of a fleet file (`printer-sim --fleet`, see [`crate::read_fleet_file`]):
/// each is `template` with its own id and login.
pub fn fleet_configs(template: &MqttSimConfig, file: &std::path::Path) -> Result<Vec<MqttSimConfig>, SimError> {
    Ok(crate::read_fleet_file(file)?
        .into_iter()
        .map(|(device, username, password)| MqttSimConfig {
            device,
            username: Some(username),
            password: Some(password),
            ..template.clone()
        })
        .collect())
}

/// An onceprint device's journal entry for one idempotency key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Journal {
    /// Started, and the device is printing it now (this connection).
    Printing,
    /// Started before a crash and never proven printed.
    Started,
    Printed,
    /// Refused before printing (paper out, cover open) at this attempt, with the word
    /// published: a copy of this attempt that comes again is answered the same.
    Refused {
        attempt: i64,
        word: &'static str,
    },
}

struct Device {
    config: MqttSimConfig,
    /// The name its faults and paper-log lines are kept under.
    name: String,
    faults: FaultsHandle,
    recorder: Arc<Recorder>,
    /// A Star printer's HTTP client (settings and job downloads).
    http: reqwest::Client,
    problem: Arc<Mutex<Option<String>>>,
    /// A Star printer's last ten job tokens.
    tokens: VecDeque<String>,
    journal: HashMap<String, Journal>,
    connection: u64,
    /// A Star printer's MQTT settings of the current connection.
    current: Option<MqttServer>,
}

/// What handling one job asks of the connection.
enum After {
    Ack,
    /// Drop the connection now, without acknowledging the job.
    Drop,
    /// Acknowledge the job (PUBACK), then lose power before anything else goes out.
    AckThenDrop,
    /// Acknowledge the message, leave the MQTT server with a DISCONNECT and connect again
    /// with new settings.
    Reconnect,
}

/// What a Star printer puts on paper for one job, as the paper log records it.
struct Slip {
    text: String,
    images: usize,
    bytes: usize,
    cut: Cut,
}

/// The MQTT server and login a Star printer takes from the server's settings answer.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MqttServer {
    host: String,
    port: u16,
    username: Option<String>,
    password: Option<String>,
}

/// How long a Star printer waits before asking for the settings again after they failed.
/// Star describes its own schedule ("Server setting information request (GET)", Retry GET
/// request); the simulator asks again after a second so that a test need not wait.
const SETTINGS_RETRY: Duration = Duration::from_secs(1);

/// "Request Timeout: 15 seconds" (Star CloudPRNT Protocol Guide, "Server setting
/// information request (GET)", "Request (GET)").
const SETTINGS_TIMEOUT: Duration = Duration::from_secs(15);

/// How long a Star printer gives a job download before it reports `520` ("Timeout, client
/// could not download the job within an internal timeout limit", "Printer Status Codes").
/// Star does not give the limit; this is the polling printer's.
const DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(10);

/// A Star printer's MQTT keep alive. Star does not document it; the simulator does not
/// answer the MQTT server while it downloads and prints a job, so the keep alive must
/// outlast a slow download and a slow print, or the MQTT server would drop the printer
/// in the middle of every slow job.
const STAR_KEEP_ALIVE: Duration = Duration::from_secs(30);

/// The media types this printer prints from a `url` job: the two whose rendering the
/// paper log can check (Star CloudPRNT Protocol Guide, "Content Media Types").
const STAR_MEDIA: [&str; 2] = ["image/png", "text/plain"];

/// The answer to a repeated job token. Star's "MQTT General Specification" says a printer
/// answers it with "Printer Status Codes indicating that a message with a duplicate jobToken
/// was received and will not be printed"; the number itself could not be read from the
/// table, so the simulator uses a client-error code (5xx: "a client issue", nothing
/// printed) of its own, distinct from every code it uses elsewhere.
pub const DUPLICATE_STATUS: &str = "590 Duplicate jobToken, not printed";

/// A printer status code as Star's MQTT payloads carry it: URL-encoded (Star CloudPRNT
/// Protocol Guide, "MQTT Message Payload Specification", `statusCode`; `200%20OK`).
pub fn encode_status(code: &str) -> String {
    let mut out = String::with_capacity(code.len() * 2);
    for b in code.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Star's description of a printer status code it refuses a job with ("Printer Status
/// Codes"), for the text after the number.
fn star_refusal(code: &str) -> String {
    let text = match code {
        "510" => "Incompatible media type",
        "511" => "Media decoding error",
        "512" => "Unsupported media version",
        "520" => "Job download timeout",
        "521" => "Job too large",
        _ => "Client error",
    };
    format!("{code} {text}")
}

/// The server-settings URL beside the server URL set on the printer: its last path segment
/// replaced by `cloudprnt-setting.json`, with `mac` and `replaced_path` (the replaced
/// segment) as the query; `uid` only when the server set one, which this printer never
/// has (Star CloudPRNT Protocol Guide, "Server setting information request (GET)",
/// "Request (GET)", End Point: `https://cloudprnt.net/printer.php` becomes
/// `https://cloudprnt.net/cloudprnt-setting.json?mac=…&replaced_path=printer.php`).
fn settings_url(server_url: &str, mac: &str) -> Result<reqwest::Url, String> {
    let mut url = reqwest::Url::parse(server_url).map_err(|e| format!("server URL {server_url:?}: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("server URL {server_url:?} is not http or https"));
    }
    let replaced = url.path_segments().and_then(|mut s| s.next_back()).unwrap_or_default().to_owned();
    url.path_segments_mut()
        .map_err(|()| format!("server URL {server_url:?} has no path"))?
        .pop()
        .push("cloudprnt-setting.json");
    url.set_query(None);
    url.set_fragment(None);
    url.query_pairs_mut().append_pair("mac", mac).append_pair("replaced_path", &replaced);
    Ok(url)
}

/// Reads a settings answer as a printer must use it (Star CloudPRNT Protocol Guide, "Server
/// setting information request (GET)", "Response (GET)"; Star's sample
/// `cloudprnt-setting_mqtt.json`): `title` is `star_cloudprnt_server_setting`, `version`
/// is given, `serverSupportProtocol` lists `MQTT` (else the server is HTTP only), and then
/// `settingForMQTT` is required, with `mqttConnectionSetting` `hostName`, `portNumber`,
/// `useTls` and `authenticationSetting` `{username, password}`. `useTriggerPOST: true`
/// (CloudPRNT Version MQTT Trigger POST) and `useTls: true` are not simulated: errors.
fn parse_settings(v: &Value) -> Result<MqttServer, String> {
    if v["title"] != "star_cloudprnt_server_setting" {
        return Err(format!("the settings answer's title is {}, not \"star_cloudprnt_server_setting\"", v["title"]));
    }
    if !v["version"].is_string() {
        return Err("the settings answer has no version".into());
    }
    let protocols = v["serverSupportProtocol"]
        .as_array()
        .ok_or("the settings answer has no serverSupportProtocol list")?
        .iter()
        .map(|p| p.as_str().ok_or("serverSupportProtocol holds something other than strings"))
        .collect::<Result<Vec<_>, _>>()?;
    if !protocols.contains(&"MQTT") {
        return Err(format!("the server supports {protocols:?}, not MQTT: this printer works only over MQTT"));
    }
    let mqtt =
        v.get("settingForMQTT").filter(|m| m.is_object()).ok_or("MQTT is supported but settingForMQTT is missing")?;
    match mqtt.get("useTriggerPOST") {
        None | Some(Value::Bool(false)) => {}
        Some(Value::Bool(true)) => {
            return Err(
                "the server asks for CloudPRNT Version MQTT Trigger POST, which this printer does not simulate".into()
            )
        }
        Some(other) => return Err(format!("useTriggerPOST is {other}, not true or false")),
    }
    let conn = mqtt
        .get("mqttConnectionSetting")
        .filter(|c| c.is_object())
        .ok_or("settingForMQTT has no mqttConnectionSetting")?;
    let host = conn["hostName"].as_str().filter(|h| !h.is_empty()).ok_or("mqttConnectionSetting has no hostName")?;
    let port = conn["portNumber"]
        .as_u64()
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("mqttConnectionSetting.portNumber is {}, not a port number", conn["portNumber"]))?;
    match conn.get("useTls") {
        None | Some(Value::Bool(false)) => {}
        Some(Value::Bool(true)) => {
            return Err("the server asks for MQTT over TLS, which this simulator does not speak".into())
        }
        Some(other) => return Err(format!("useTls is {other}, not true or false")),
    }
    let auth = &conn["authenticationSetting"];
    let field = |k: &str| auth.get(k).and_then(Value::as_str).map(str::to_owned);
    Ok(MqttServer { host: host.to_owned(), port, username: field("username"), password: field("password") })
}

impl Device {
    fn topics(&self) -> (String, String) {
        match self.config.protocol {
            Protocol::Cloudprnt => (
                format!("star/cloudprnt/to-device/{}/#", self.config.device),
                format!("star/cloudprnt/to-server/{}", self.config.device),
            ),
            Protocol::Onceprint => (
                format!("onceprint/v1/to-device/{}/#", self.config.device),
                format!("onceprint/v1/to-server/{}", self.config.device),
            ),
        }
    }

    fn will(&self) -> (String, Vec<u8>) {
        let (_, up) = self.topics();
        match self.config.protocol {
            Protocol::Cloudprnt => (
                format!("{up}/client-will"),
                json!({"title": "client-will", "printerMAC": self.config.device}).to_string().into_bytes(),
            ),
            Protocol::Onceprint => (format!("{up}/status"), json!({"v": 1, "online": false}).to_string().into_bytes()),
        }
    }

    fn set_problem(&self, problem: Option<String>) {
        *self.problem.lock().unwrap_or_else(PoisonError::into_inner) = problem;
    }

    /// The Server setting information request (GET), following `nextUrl` ("If this key is
    /// defined, a printer will execute this GET request again for the URL of the value"),
    /// with the printer's HTTP Basic login, which it passes from the first request on
    /// ("Client Settings"). A 404 means "Server only supports CloudPRNT Version HTTP".
    async fn server_settings(&self) -> Result<MqttServer, String> {
        let server_url = self.config.server_url.as_deref().unwrap_or_default();
        let mut url = settings_url(server_url, &self.config.device)?;
        for _ in 0..4 {
            let mut req = self.http.get(url.clone()).timeout(SETTINGS_TIMEOUT);
            if let Some(user) = &self.config.username {
                req = req.basic_auth(user, self.config.password.as_deref());
            }
            let res = req.send().await.map_err(|e| format!("the settings request to {url} failed: {e}"))?;
            match res.status() {
                reqwest::StatusCode::OK => {}
                reqwest::StatusCode::NOT_FOUND => {
                    return Err(format!(
                        "{url} answered 404: the server supports only CloudPRNT Version HTTP, and this printer works only over MQTT"
                    ))
                }
                other => return Err(format!("the settings request to {url} answered {other}")),
            }
            let answer: Value = res.json().await.map_err(|e| format!("the settings answer is not JSON: {e}"))?;
            if let Some(next) = answer.get("nextUrl") {
                let next = next.as_str().ok_or("nextUrl is not a string")?;
                url = reqwest::Url::parse(next).map_err(|e| format!("nextUrl {next:?}: {e}"))?;
                continue;
            }
            return parse_settings(&answer);
        }
        Err("the settings answers sent this printer on through nextUrl too often".into())
    }

    async fn run(mut self, mut stop: watch::Receiver<bool>) {
        let mut status = self.faults.subscribe(0);
        loop {
            if *stop.borrow() {
                return;
            }
            let (host, port, username, password) = match self.config.protocol {
                Protocol::Onceprint => (
                    self.config.host.clone(),
                    self.config.port,
                    self.config.username.clone(),
                    self.config.password.clone(),
                ),
                // A Star printer asks for its settings whenever it starts and whenever
                // its MQTT connection was lost ("Server setting information request
                // (GET)", Request execution timing).
                Protocol::Cloudprnt => match self.server_settings().await {
                    Ok(s) => {
                        self.current = Some(s.clone());
                        (s.host, s.port, s.username, s.password)
                    }
                    Err(e) => {
                        tracing::error!(device = %self.config.device, error = %e, "no MQTT settings from the CloudPRNT server");
                        self.set_problem(Some(e));
                        tokio::select! {
                            _ = stop.wait_for(|s| *s) => return,
                            _ = tokio::time::sleep(SETTINGS_RETRY) => {}
                        }
                        continue;
                    }
                },
            };
            self.connection += 1;
            // MQTT 3.1.1 with QoS 1, client id = the MAC for a Star printer, a will; Star's
            // printers do not use Retain ("MQTT General Specification").
            let mut options = MqttOptions::new(self.config.device.clone(), host, port);
            options.set_keep_alive(match self.config.protocol {
                Protocol::Cloudprnt => STAR_KEEP_ALIVE,
                Protocol::Onceprint => Duration::from_secs(5),
            });
            options.set_clean_session(false);
            options.set_manual_acks(true);
            options.set_max_packet_size(4 * 1024 * 1024, 4 * 1024 * 1024);
            let (will_topic, will_payload) = self.will();
            options.set_last_will(LastWill::new(will_topic, will_payload, QoS::AtLeastOnce, false));
            if let Some(u) = username {
                options.set_credentials(u, password.unwrap_or_default());
            }
            let (client, mut eventloop) = AsyncClient::new(options, 256);
            // A result and the PUBACK of its job go out back to back; without TCP_NODELAY
            // the second waits for the first to be acknowledged (Nagle's algorithm).
            let mut network = rumqttc::NetworkOptions::new();
            network.set_tcp_nodelay(true);
            eventloop.set_network_options(network);
            let mut power_lost = false;
            let mut last_status: Option<Value> = None;
            // A crash or dropped connection ends this loop; the next one reconnects.
            loop {
                let event = tokio::select! {
                    _ = stop.wait_for(|s| *s) => return,
                    e = eventloop.poll() => e,
                    // A Star printer publishes client-status when its status changes
                    // ("MQTT Message Payload Specification", request-client-status:
                    // "Normally, a printer publishes a status notification message only
                    // when there is a status change").
                    Ok(()) = async {
                        match status.as_mut() {
                            Some(rx) => rx.changed().await.map_err(|_| ()),
                            None => std::future::pending().await,
                        }
                    }, if self.config.protocol == Protocol::Cloudprnt && last_status.is_some() => {
                        let (_, now) = self.status_payload();
                        if last_status.as_ref() != Some(&now) {
                            self.publish_status(&client);
                            last_status = Some(now);
                        }
                        continue;
                    }
                };
                match event {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        self.set_problem(None);
                        let (down, _) = self.topics();
                        let _ = client.try_subscribe(down, QoS::AtLeastOnce);
                        self.publish_status(&client);
                        last_status = Some(self.status_payload().1);
                    }
                    Ok(Event::Incoming(Packet::Publish(p))) => match self.on_message(&client, &p).await {
                        After::Drop => {
                            tracing::info!(device = %self.config.device, "simulated crash: connection dropped");
                            power_lost = true;
                            break;
                        }
                        After::AckThenDrop => {
                            let _ = client.try_ack(&p);
                            // Let the PUBACK leave before the power goes.
                            let sent = async {
                                loop {
                                    match eventloop.poll().await {
                                        Ok(Event::Outgoing(rumqttc::Outgoing::PubAck(_))) | Err(_) => return,
                                        Ok(_) => {}
                                    }
                                }
                            };
                            let _ = tokio::time::timeout(Duration::from_millis(500), sent).await;
                            tracing::info!(device = %self.config.device, "simulated power cut after acknowledging a job");
                            power_lost = true;
                            break;
                        }
                        After::Ack => {
                            let _ = client.try_ack(&p);
                        }
                        After::Reconnect => {
                            let _ = client.try_ack(&p);
                            let _ = client.try_disconnect();
                            let left = async {
                                loop {
                                    match eventloop.poll().await {
                                        Ok(Event::Outgoing(rumqttc::Outgoing::Disconnect)) | Err(_) => return,
                                        Ok(_) => {}
                                    }
                                }
                            };
                            let _ = tokio::time::timeout(Duration::from_millis(500), left).await;
                            tracing::info!(device = %self.config.device, "new MQTT settings: connecting again");
                            break;
                        }
                    },
                    Ok(_) => {}
                    Err(e) => {
                        tracing::debug!(device = %self.config.device, error = %e, "MQTT connection lost");
                        // A Star printer asks for its settings again before it reconnects,
                        // and says why it is not working meanwhile (a refused login, an
                        // MQTT server that does not answer).
                        if self.config.protocol == Protocol::Cloudprnt {
                            let server = self.current.as_ref().map(|s| format!("{}:{}", s.host, s.port));
                            self.set_problem(Some(format!(
                                "the MQTT server {} of the settings: {e}",
                                server.unwrap_or_default()
                            )));
                            break;
                        }
                        tokio::select! {
                            _ = stop.wait_for(|s| *s) => return,
                            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                        }
                    }
                }
            }
            // Dropping the event loop closes the socket without a DISCONNECT: the MQTT
            // server publishes the will, as for a printer that lost power.
            drop(eventloop);
            if power_lost {
                // Whatever it was printing when it crashed is "started" now.
                for state in self.journal.values_mut() {
                    if *state == Journal::Printing {
                        *state = Journal::Started;
                    }
                }
                // A Star printer's remembered job tokens may not survive a power cycle.
                if self.faults.current(0).power_cycle_forgets {
                    self.tokens.clear();
                }
            }
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                _ = tokio::time::sleep(Duration::from_millis(300)) => {}
            }
        }
    }

    fn status_payload(&self) -> (String, Value) {
        let f = self.faults.current(0);
        let (_, up) = self.topics();
        match self.config.protocol {
            // client-status: `title`, `printerMAC`, `statusCode` URL-encoded, and
            // `printingInProgress` ("MQTT Message Payload Specification", client-status).
            Protocol::Cloudprnt => {
                let code = if f.paper_out {
                    "410 Out of paper"
                } else if f.cover_open {
                    "420 Cover open"
                } else {
                    "200 OK"
                };
                (
                    format!("{up}/client-status"),
                    json!({"title": "client-status", "printerMAC": self.config.device, "statusCode": encode_status(code),
                           "printingInProgress": false}),
                )
            }
            Protocol::Onceprint => {
                let state = if f.paper_out {
                    "no_paper"
                } else if f.cover_open {
                    "cover_open"
                } else {
                    "ok"
                };
                (
                    format!("{up}/status"),
                    json!({"v": 1, "online": true, "conn": format!("{}-{}", self.config.device, self.connection),
                           "state": state}),
                )
            }
        }
    }

    fn publish_status(&self, client: &AsyncClient) {
        let (topic, payload) = self.status_payload();
        let _ = client.try_publish(topic, QoS::AtLeastOnce, false, payload.to_string());
    }

    fn publish_result(&self, client: &AsyncClient, payload: Value) {
        let (_, up) = self.topics();
        let topic = match self.config.protocol {
            Protocol::Cloudprnt => format!("{up}/print-result"),
            Protocol::Onceprint => format!("{up}/result"),
        };
        let times = if self.faults.take(0, |f| countdown(&mut f.duplicate_result)) { 2 } else { 1 };
        for _ in 0..times {
            let _ = client.try_publish(topic.clone(), QoS::AtLeastOnce, false, payload.to_string());
        }
    }

    async fn on_message(&mut self, client: &AsyncClient, p: &Publish) -> After {
        let method = p.topic.rsplit('/').next().unwrap_or_default();
        match (self.config.protocol, method) {
            (Protocol::Cloudprnt, "print-job") | (Protocol::Onceprint, "job") => {
                let Ok(job) = serde_json::from_slice::<Value>(&p.payload) else {
                    tracing::warn!(device = %self.config.device, topic = %p.topic, "a job that is not JSON is ignored");
                    return After::Ack;
                };
                let twice = self.faults.take(0, |f| countdown(&mut f.receive_twice));
                let after = self.on_job(client, &job).await;
                if twice && matches!(after, After::Ack) {
                    return self.on_job(client, &job).await;
                }
                after
            }
            (Protocol::Cloudprnt, "request-client-status") | (Protocol::Onceprint, "status-request") => {
                self.publish_status(client);
                After::Ack
            }
            // "Make a printer perform Server setting information request (GET)" ("MQTT
            // Message Payload Specification", request-get-server-info): settings that name
            // another MQTT server or login take effect at once; settings it cannot use are
            // reported, and it stays where it is.
            (Protocol::Cloudprnt, "request-get-server-info") => match self.server_settings().await {
                Ok(s) if self.current.as_ref() != Some(&s) => After::Reconnect,
                Ok(_) => After::Ack,
                Err(e) => {
                    tracing::error!(device = %self.config.device, error = %e, "the settings asked for cannot be used");
                    self.set_problem(Some(e));
                    After::Ack
                }
            },
            _ => After::Ack,
        }
    }

    async fn on_job(&mut self, client: &AsyncClient, job: &Value) -> After {
        match self.config.protocol {
            Protocol::Cloudprnt => self.on_star_job(client, job).await,
            Protocol::Onceprint => self.on_device_job(client, job).await,
        }
    }

    /// A `print-job` as a Star printer in Full MQTT / Pass URL mode handles it (Star
    /// CloudPRNT Protocol Guide, "MQTT Message Payload Specification", print-job and
    /// print-result; "MQTT General Specification", duplicate reception):
    /// - a token among its last ten is answered "duplicate, not printed" and not printed;
    /// - out of paper or with the cover open it answers `410` / `420`, nothing printed;
    /// - it remembers the token once it takes the job on (Star does not say at which
    ///   step; a job refused for paper can so come again under its token);
    /// - `jobType: url`: it downloads `printData` as a Print job request (GET) would and
    ///   prints it ([`Device::download`]); `raw`: `printData` is the job itself, which this
    ///   printer takes as `text/plain` only (Star's sample server sends raw jobs only as
    ///   text, and Star printers in raw mode take text or Star's own command set), any
    ///   other media type `510`;
    /// - the print-result carries `title`, `jobToken`, `printSucceeded`, `statusCode`
    ///   (URL-encoded) and `printerMAC`.
    async fn on_star_job(&mut self, client: &AsyncClient, job: &Value) -> After {
        let f = self.faults.current(0);
        let Some(token) = job.get("jobToken").and_then(Value::as_str).map(str::to_owned) else {
            tracing::warn!(device = %self.config.device, "a print-job without jobToken cannot be answered; ignored");
            return After::Ack;
        };
        let result = |ok: bool, code: &str| {
            json!({"title": "print-result", "jobToken": token, "printSucceeded": ok, "statusCode": encode_status(code),
                   "printerMAC": self.config.device})
        };
        if self.tokens.contains(&token) {
            self.publish_result(client, result(false, DUPLICATE_STATUS));
            return After::Ack;
        }
        if f.paper_out || f.cover_open {
            let code = if f.paper_out { "410 Out of paper" } else { "420 Cover open" };
            self.publish_result(client, result(false, code));
            return After::Ack;
        }
        if self.faults.take(0, |f| countdown(&mut f.disconnect_mid_job)) {
            return After::Drop;
        }
        self.tokens.push_back(token.clone());
        while self.tokens.len() > 10 {
            self.tokens.pop_front();
        }
        let media: Vec<&str> = job
            .get("mediaTypes")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let data = job.get("printData").and_then(Value::as_str).unwrap_or_default();
        let slip = match job.get("jobType").and_then(Value::as_str) {
            // The printer chooses "the type that it prefers to handle from those
            // available" ("Print job requests (GET)", `type`); this one takes the first of
            // the server's list that it prints, so the server's order decides.
            Some("url") => match media.iter().find(|m| STAR_MEDIA.contains(m)) {
                Some(m) => self.download(data, m, &token).await,
                None => Err(("510", format!("none of the media types {media:?} is one this printer takes"))),
            },
            Some("raw") => match media.as_slice() {
                ["text/plain"] => {
                    // Star's sample server asks for the cut with `printerControl.cutter`
                    // (`mqtt_publish.php`: `{"type": "full", "feed": true}`).
                    let cut = match job.pointer("/printerControl/cutter/type").and_then(Value::as_str) {
                        Some("partial") => Cut::Partial,
                        _ => Cut::Full,
                    };
                    Ok(Slip { text: data.to_owned(), images: 0, bytes: data.len(), cut })
                }
                other => Err(("510", format!("a raw job of media types {other:?}: this printer takes raw text only"))),
            },
            other => Err(("510", format!("jobType {other:?} is neither url nor raw"))),
        };
        let slip = match slip {
            Ok(slip) => slip,
            Err((code, why)) => {
                tracing::warn!(device = %self.config.device, job = %token, code, "{why}: the printer refuses the job, nothing printed");
                self.publish_result(client, result(false, &star_refusal(code)));
                return After::Ack;
            }
        };
        if !self.record(slip, &token).await {
            return After::Drop;
        }
        if self.faults.take(0, |f| countdown(&mut f.crash_mid_job)) {
            // Printed and acknowledged, then switched off before the result.
            return After::AckThenDrop;
        }
        if self.faults.take(0, |f| countdown(&mut f.lose_result)) {
            return After::Ack;
        }
        if self.faults.take(0, |f| countdown(&mut f.error_after_print)) {
            // A failure after the paper came out, in a code Star does not list.
            self.publish_result(client, result(false, "599 Error after printing"));
            return After::Ack;
        }
        self.publish_result(client, result(true, "200 OK"));
        After::Ack
    }

    /// A `url` job's download: "If url is specified in the jobType key in print-job
    /// message received by a printer from a CloudPRNT server, the printer will execute
    /// this GET request" (Star CloudPRNT Protocol Guide, "Print job requests (GET)"), to
    /// `printData` with the query of "Request (GET)" (`type`, `mac`, `token`; no `uid`,
    /// which the server never set), the printer's HTTP Basic login, and its print width
    /// and resolution ("Client HTTP Request Headers": `X-Star-Print-Width` in mm,
    /// `X-Star-Horizontal-Resolution` in dots per mm). An answer other than 200, or none
    /// in time, is `520` ("Response (GET)": "Other than 200: … 520 (or 521)"); the body is
    /// read by [`read_star_job`]; `X-Star-Cut` says how the slip ends.
    async fn download(&self, url: &str, media: &str, token: &str) -> Result<Slip, (&'static str, String)> {
        let mut url = reqwest::Url::parse(url).map_err(|e| ("520", format!("printData {url:?} is not a URL: {e}")))?;
        url.query_pairs_mut()
            .append_pair("type", media)
            .append_pair("mac", &self.config.device)
            .append_pair("token", token);
        let mut req = self
            .http
            .get(url.clone())
            .timeout(DOWNLOAD_TIMEOUT)
            .header("X-Star-Print-Width", self.config.print_width_mm.to_string())
            .header("X-Star-Horizontal-Resolution", STAR_DOTS_PER_MM.to_string());
        if let Some(user) = &self.config.username {
            req = req.basic_auth(user, self.config.password.as_deref());
        }
        let res = req.send().await.map_err(|e| ("520", format!("the job GET {url} failed: {e}")))?;
        if res.status() != reqwest::StatusCode::OK {
            return Err(("520", format!("the job GET {url} answered {}", res.status())));
        }
        let content_type = res.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
        let cut = star_cut(res.headers().get("x-star-cut").and_then(|v| v.to_str().ok()));
        let bytes = res.bytes().await.map_err(|e| ("520", format!("the job GET body: {e}")))?;
        let dots = usize::from(self.config.print_width_mm) * usize::from(STAR_DOTS_PER_MM);
        Ok(match read_star_job(media, &content_type, &bytes, dots)? {
            StarJob::Text(text) => Slip { text, images: 0, bytes: bytes.len(), cut },
            // The picture itself is not read back: a hash of its bytes tells copies apart.
            StarJob::Png => Slip { text: format!("png:{:016x}", fnv1a(&bytes)), images: 1, bytes: bytes.len(), cut },
        })
    }

    /// A `job` as an onceprint device handles it (docs/MQTT.md).
    async fn on_device_job(&mut self, client: &AsyncClient, job: &Value) -> After {
        let f = self.faults.current(0);
        let data = job
            .get("data")
            .and_then(Value::as_str)
            .and_then(|d| base64::engine::general_purpose::STANDARD.decode(d).ok())
            .unwrap_or_default();
        let key = job.get("key").and_then(Value::as_str).unwrap_or_default().to_owned();
        let reprint = job.get("reprint").and_then(Value::as_bool).unwrap_or(false);
        let result = |r: &str, previous: Option<&str>| {
            let mut v = json!({"v": 1, "task_id": job.get("task_id"), "attempt": job.get("attempt"),
                               "key": key, "result": r});
            if let Some(p) = previous {
                v["previous"] = json!(p);
            }
            v
        };
        let attempt = job.get("attempt").and_then(Value::as_i64).unwrap_or(0);
        match self.journal.get(&key).copied() {
            Some(Journal::Printed) => {
                self.publish_result(client, result("duplicate", Some("printed")));
                return After::Ack;
            }
            // A copy of an attempt this device refused (docs/MQTT.md, "The journal", step 1).
            Some(Journal::Refused { attempt: refused, word }) if refused >= attempt => {
                self.publish_result(client, result(word, None));
                return After::Ack;
            }
            // Printing it right now: its result follows.
            Some(Journal::Printing) => return After::Ack,
            Some(Journal::Started) if !reprint => {
                self.publish_result(client, result("duplicate", Some("started")));
                return After::Ack;
            }
            _ => {}
        }
        if f.paper_out || f.cover_open {
            let word = if f.paper_out { "no_paper" } else { "cover_open" };
            self.journal.insert(key.clone(), Journal::Refused { attempt, word });
            self.publish_result(client, result(word, None));
            return After::Ack;
        }
        if self.faults.take(0, |f| countdown(&mut f.disconnect_mid_job)) {
            return After::Drop;
        }
        self.journal.insert(key.clone(), Journal::Printing);
        if !self.print_escpos(&data, &key).await {
            return After::Drop;
        }
        if self.faults.take(0, |f| countdown(&mut f.crash_mid_job)) {
            // Printed, but the crash came before the journal said so.
            return After::Drop;
        }
        self.journal.insert(key.clone(), Journal::Printed);
        if self.faults.take(0, |f| countdown(&mut f.lose_result)) {
            return After::Ack;
        }
        if self.faults.take(0, |f| countdown(&mut f.error_after_print)) {
            // "something failed; paper may or may not have come out" (docs/MQTT.md).
            self.publish_result(client, result("error", None));
            return After::Ack;
        }
        self.publish_result(client, result("printed", None));
        After::Ack
    }

    /// Prints one ESC/POS job into the paper log; `false` when the line could not be
    /// written (the job must then not be reported printed).
    async fn print_escpos(&self, data: &[u8], job: &str) -> bool {
        let mut slip = Slip { text: String::new(), images: 0, bytes: data.len(), cut: Cut::Uncut };
        let mut qr = Vec::new();
        let mut double_byte = false;
        for (event, _) in Parser::new().push_sized(data) {
            match event {
                Esc::Text(b) => slip.text.push_str(&decode_text(&b, double_byte)),
                Esc::DoubleByte(on) => double_byte = on,
                Esc::Init => double_byte = false,
                Esc::Qr { data } => qr.push(String::from_utf8_lossy(&data).into_owned()),
                Esc::Raster { .. } => slip.images += 1,
                Esc::Cut { partial } => slip.cut = if partial { Cut::Partial } else { Cut::Full },
                _ => {}
            }
        }
        self.write(slip, qr, job).await
    }

    /// Prints a Star printer's job into the paper log; `false` when the line could not be
    /// written.
    async fn record(&self, slip: Slip, job: &str) -> bool {
        self.write(slip, Vec::new(), job).await
    }

    /// Prints (taking `slow_ms` when the printer is slow) and writes the paper-log line.
    async fn write(&self, slip: Slip, qr: Vec<String>, job: &str) -> bool {
        let started_us = (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000) as i64;
        let slow_ms = self.faults.current(0).slow_ms;
        if slow_ms > 0 {
            tokio::time::sleep(Duration::from_millis(slow_ms)).await;
        }
        let printed = PrintedJob {
            printer: self.name.clone(),
            seq: self.recorder.jobs().count() as u64 + 1,
            at: crate::printer::now_rfc3339(),
            text: slip.text,
            bytes: slip.bytes,
            qr,
            barcodes: Vec::new(),
            images: slip.images,
            cut: slip.cut,
            device: Some(self.config.device.clone()),
            job: Some(job.to_owned()),
            polls_us: Vec::new(),
            started_us: Some(started_us),
        };
        match self.recorder.record(printed).await {
            Ok(()) => true,
            Err(e) => {
                tracing::error!(error = %e, "cannot write the paper log");
                false
            }
        }
    }
}

/// Counts a fault down; `true` when it fired.
fn countdown(n: &mut u32) -> bool {
    if *n > 0 {
        *n -= 1;
        true
    } else {
        false
    }
}

fn fnv1a(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

/// Parses `mqtt://HOST:PORT` for the simulator.
pub fn parse_url(url: &str) -> Option<(String, u16)> {
    let rest = url.strip_prefix("mqtt://")?.trim_end_matches('/');
    let rest = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    match rest.rsplit_once(':') {
        Some((h, p)) => Some((h.to_owned(), p.parse().ok()?)),
        None => Some((rest.to_owned(), 1883)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_settings_url_replaces_the_last_path_segment() {
        let url = settings_url("https://cloudprnt.net/printer.php", "00:11:62:1d:9a:b7").unwrap();
        assert_eq!(
            url.as_str(),
            "https://cloudprnt.net/cloudprnt-setting.json?mac=00%3A11%3A62%3A1d%3A9a%3Ab7&replaced_path=printer.php"
        );
        let url = settings_url("http://127.0.0.1:8080/cloudprnt?x=1", "m").unwrap();
        assert_eq!(url.as_str(), "http://127.0.0.1:8080/cloudprnt-setting.json?mac=m&replaced_path=cloudprnt");
        assert!(settings_url("mqtt://host:1883", "m").is_err());
    }

    #[test]
    fn settings_are_read_strictly() {
        let good = json!({
            "title": "star_cloudprnt_server_setting", "version": "1.0.0", "serverSupportProtocol": ["HTTP", "MQTT"],
            "settingForMQTT": {"useTriggerPOST": false, "mqttConnectionSetting": {"hostName": "h", "portNumber": 1883,
                "useTls": false, "authenticationSetting": {"username": "u", "password": "p"}}}
        });
        assert_eq!(
            parse_settings(&good),
            Ok(MqttServer { host: "h".into(), port: 1883, username: Some("u".into()), password: Some("p".into()) })
        );
        let broken = |pointer: &str, value: Value| {
            let mut v = good.clone();
            *v.pointer_mut(pointer).unwrap() = value;
            parse_settings(&v).unwrap_err()
        };
        assert!(broken("/title", json!("other")).contains("title"));
        assert!(broken("/serverSupportProtocol", json!(["HTTP"])).contains("not MQTT"));
        assert!(broken("/settingForMQTT/useTriggerPOST", json!(true)).contains("Trigger POST"));
        assert!(broken("/settingForMQTT/mqttConnectionSetting/useTls", json!(true)).contains("TLS"));
        assert!(broken("/settingForMQTT/mqttConnectionSetting/portNumber", json!("1883")).contains("portNumber"));
        assert!(broken("/settingForMQTT", json!(null)).contains("settingForMQTT"));
    }

    #[test]
    fn status_codes_are_url_encoded() {
        assert_eq!(encode_status("200 OK"), "200%20OK");
        assert_eq!(
            encode_status("590 Duplicate jobToken, not printed"),
            "590%20Duplicate%20jobToken%2C%20not%20printed"
        );
    }
}
