//! A simulated MQTT printer: a Star printer in CloudPRNT Version MQTT mode or a device
//! speaking onceprint's device protocol (docs/MQTT.md), written from the documentation,
//! not from the broker's code, so that it tests what the documents promise.
//!
//! It connects with its own login, client id = its device id or MAC, clean session off
//! and a last will, subscribes to its own `to-device` topics, announces its status, and
//! prints the jobs it receives into the same paper log as the TCP printers (`device` and
//! `job` set; ESC/POS decoded to text, a CloudPRNT PNG recorded by a hash of its bytes).
//! It acknowledges a job (PUBACK) after handling it, so a job it dropped the connection on
//! is delivered again by the MQTT server.
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
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use onceprint_escpos::parse::{Event as Esc, Parser};
use onceprint_escpos::text::decode_text;
use rumqttc::{AsyncClient, Event, LastWill, MqttOptions, Packet, Publish, QoS};
use serde_json::{json, Value};
use tokio::sync::watch;

use crate::faults::FaultsHandle;
use crate::jobs::{Cut, Jobs, PrintedJob, Recorder};
use crate::{Faults, SimError};

/// Which device protocol the simulated printer speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Cloudprnt,
    Onceprint,
}

/// What [`MqttPrinter::start`] starts.
#[derive(Debug, Clone)]
pub struct MqttSimConfig {
    pub host: String,
    pub port: u16,
    pub protocol: Protocol,
    /// Device id (onceprint) or MAC (CloudPRNT, as it appears in topics).
    pub device: String,
    pub username: Option<String>,
    pub password: Option<String>,
    pub paper_log: Option<std::path::PathBuf>,
    pub faults: Faults,
}

/// A running simulated MQTT printer.
pub struct MqttPrinter {
    faults: FaultsHandle,
    jobs: Jobs,
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl MqttPrinter {
    /// Starts the printer; it connects (and reconnects) in the background.
    pub async fn start(config: MqttSimConfig) -> Result<MqttPrinter, SimError> {
        let addr = tokio::net::lookup_host((config.host.as_str(), config.port))
            .await
            .ok()
            .and_then(|mut a| a.next())
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], config.port)));
        let recorder = Arc::new(Recorder::open(config.paper_log.as_deref()).await?);
        let faults = FaultsHandle::new(&[addr.to_string()], config.faults);
        let jobs = recorder.jobs();
        let (stop, stop_rx) = watch::channel(false);
        let device = Device {
            config,
            addr,
            faults: faults.clone(),
            recorder,
            tokens: VecDeque::new(),
            journal: HashMap::new(),
            connection: 0,
        };
        let task = tokio::spawn(device.run(stop_rx));
        Ok(MqttPrinter { faults, jobs, addr, stop, task: Some(task) })
    }

    pub fn faults(&self) -> FaultsHandle {
        self.faults.clone()
    }

    pub fn jobs(&self) -> Jobs {
        self.jobs.clone()
    }

    /// The address its faults are kept under (the MQTT server's).
    pub fn addr(&self) -> SocketAddr {
        self.addr
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

/// An onceprint device's journal entry for one idempotency key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Journal {
    /// Started, and the device is printing it now (this connection).
    Printing,
    /// Started before a crash and never proven printed.
    Started,
    Printed,
}

struct Device {
    config: MqttSimConfig,
    addr: SocketAddr,
    faults: FaultsHandle,
    recorder: Arc<Recorder>,
    /// A Star printer's last ten job tokens.
    tokens: VecDeque<String>,
    journal: HashMap<String, Journal>,
    connection: u64,
}

/// What handling one job asks of the connection.
enum After {
    Ack,
    /// Drop the connection now, without acknowledging the job.
    Drop,
    /// Acknowledge the job (PUBACK), then lose power before anything else goes out.
    AckThenDrop,
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

    async fn run(mut self, mut stop: watch::Receiver<bool>) {
        loop {
            if *stop.borrow() {
                return;
            }
            self.connection += 1;
            let mut options = MqttOptions::new(self.config.device.clone(), self.config.host.clone(), self.config.port);
            options.set_keep_alive(Duration::from_secs(5));
            options.set_clean_session(false);
            options.set_manual_acks(true);
            options.set_max_packet_size(4 * 1024 * 1024, 4 * 1024 * 1024);
            let (will_topic, will_payload) = self.will();
            options.set_last_will(LastWill::new(will_topic, will_payload, QoS::AtLeastOnce, false));
            if let Some(u) = &self.config.username {
                options.set_credentials(u.clone(), self.config.password.clone().unwrap_or_default());
            }
            let (client, mut eventloop) = AsyncClient::new(options, 256);
            // A crash or dropped connection ends this loop; the next one reconnects.
            loop {
                let event = tokio::select! {
                    _ = stop.wait_for(|s| *s) => return,
                    e = eventloop.poll() => e,
                };
                match event {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        let (down, _) = self.topics();
                        let _ = client.try_subscribe(down, QoS::AtLeastOnce);
                        self.publish_status(&client);
                    }
                    Ok(Event::Incoming(Packet::Publish(p))) => match self.on_message(&client, &p).await {
                        After::Drop => {
                            tracing::info!(device = %self.config.device, "simulated crash: connection dropped");
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
                            break;
                        }
                        After::Ack => {
                            let _ = client.try_ack(&p);
                        }
                    },
                    Ok(_) => {}
                    Err(e) => {
                        tracing::debug!(device = %self.config.device, error = %e, "MQTT connection lost");
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
            Protocol::Cloudprnt => {
                let code = if f.paper_out {
                    "410%20Out%20of%20paper"
                } else if f.cover_open {
                    "420%20Cover%20open"
                } else {
                    "200%20OK"
                };
                (
                    format!("{up}/client-status"),
                    json!({"title": "client-status", "printerMAC": self.config.device, "statusCode": code,
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
        match method {
            "print-job" | "job" => {
                let Ok(job) = serde_json::from_slice::<Value>(&p.payload) else { return After::Ack };
                let twice = self.faults.take(0, |f| countdown(&mut f.receive_twice));
                let after = self.on_job(client, &job).await;
                if twice && matches!(after, After::Ack) {
                    return self.on_job(client, &job).await;
                }
                after
            }
            "request-client-status" | "status-request" => {
                self.publish_status(client);
                After::Ack
            }
            _ => After::Ack,
        }
    }

    async fn on_job(&mut self, client: &AsyncClient, job: &Value) -> After {
        let f = self.faults.current(0);
        let data = job
            .get(if self.config.protocol == Protocol::Cloudprnt { "printData" } else { "data" })
            .and_then(Value::as_str)
            .and_then(|d| base64::engine::general_purpose::STANDARD.decode(d).ok())
            .unwrap_or_default();
        match self.config.protocol {
            Protocol::Cloudprnt => {
                let token = job.get("jobToken").and_then(Value::as_str).unwrap_or_default().to_owned();
                let result = |ok: bool, code: &str| {
                    json!({"title": "print-result", "jobToken": token, "printSucceeded": ok, "statusCode": code,
                           "printerMAC": self.config.device})
                };
                if self.tokens.contains(&token) {
                    // The answer Star documents for a repeated token; the code is this
                    // simulator's own (the broker does not depend on its value).
                    self.publish_result(client, result(false, "590%20Duplicate%20jobToken%2C%20not%20printed"));
                    return After::Ack;
                }
                if f.paper_out || f.cover_open {
                    let code = if f.paper_out { "410%20Out%20of%20paper" } else { "420%20Cover%20open" };
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
                if !self.print(&data, true, &token).await {
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
                    self.publish_result(client, result(false, "599%20Error%20after%20printing"));
                    return After::Ack;
                }
                self.publish_result(client, result(true, "200%20OK"));
                After::Ack
            }
            Protocol::Onceprint => {
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
                match self.journal.get(&key) {
                    Some(Journal::Printed) => {
                        self.publish_result(client, result("duplicate", Some("printed")));
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
                    self.publish_result(client, result(if f.paper_out { "no_paper" } else { "cover_open" }, None));
                    return After::Ack;
                }
                if self.faults.take(0, |f| countdown(&mut f.disconnect_mid_job)) {
                    return After::Drop;
                }
                self.journal.insert(key.clone(), Journal::Printing);
                if !self.print(&data, false, &key).await {
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
        }
    }

    /// Prints one job into the paper log; `false` when the line could not be written (the
    /// job must then not be reported printed).
    async fn print(&self, data: &[u8], png: bool, job: &str) -> bool {
        let slow_ms = self.faults.current(0).slow_ms;
        if slow_ms > 0 {
            tokio::time::sleep(Duration::from_millis(slow_ms)).await;
        }
        let mut printed = PrintedJob {
            printer: self.addr.to_string(),
            seq: self.recorder.jobs().count() as u64 + 1,
            at: time::OffsetDateTime::now_utc()
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default(),
            text: String::new(),
            bytes: data.len(),
            qr: Vec::new(),
            barcodes: Vec::new(),
            images: 0,
            cut: Cut::Uncut,
            device: Some(self.config.device.clone()),
            job: Some(job.to_owned()),
        };
        if png {
            // The picture itself is not read back: a hash of its bytes tells copies apart.
            printed.text = format!("png:{:016x}", fnv1a(data));
            printed.images = 1;
            printed.cut = Cut::Full;
        } else {
            let mut double_byte = false;
            for (event, _) in Parser::new().push_sized(data) {
                match event {
                    Esc::Text(b) => printed.text.push_str(&decode_text(&b, double_byte)),
                    Esc::DoubleByte(on) => double_byte = on,
                    Esc::Init => double_byte = false,
                    Esc::Qr { data } => printed.qr.push(String::from_utf8_lossy(&data).into_owned()),
                    Esc::Raster { .. } => printed.images += 1,
                    Esc::Cut { partial } => printed.cut = if partial { Cut::Partial } else { Cut::Full },
                    _ => {}
                }
            }
        }
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
