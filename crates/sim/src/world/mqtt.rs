//! The MQTT printers in the simulated world: the broker's real MQTT transport
//! (`onceprint_mqtt::transport::MqttTransport` on the push driver) and its real inbox
//! (`onceprint_mqtt::inbox::Inbox`, PUBACK only once a message's effect is durable) speak
//! through a stand-in for the MQTT server ([`SimServer`], the transport's `Connection`),
//! to an onceprint device (`m1`, docs/MQTT.md "onceprint device protocol", with its
//! journal) and a Star printer in CloudPRNT Version MQTT (`s1`, `url` print-jobs fetched
//! through the broker's real CloudPRNT GET, `Polled::fetch_pushed`, and answered with
//! `print-result` and `client-status` as Star's "MQTT Message Payload Specification" has
//! them).
//!
//! The server keeps QoS 1 and persistent sessions as Mosquitto does with clean session
//! off: a job waits in a device's session until the device takes it; a message the broker
//! applied but did not acknowledge is delivered again at the broker's next connection; a
//! publish of the broker's client that the server never confirmed is sent again at the
//! next connection that keeps the session, and is gone with a session that is not kept.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use base64::Engine as _;
use onceprint_core::results::star;
use onceprint_core::{Proof, TaskState};
use onceprint_engine::clock::{Clock, ManualClock};
use onceprint_engine::transport::cloudprnt::CloudPrntError;
use onceprint_engine::transport::push::{PushConfig, PushDriver, PushTransport};
use onceprint_engine::transport::TransportKind;
use onceprint_engine::{Claimant, LaneEngine};
use onceprint_mqtt::devices::Devices;
use onceprint_mqtt::inbox::Inbox;
use onceprint_mqtt::link::{Connection, Published};
use onceprint_mqtt::transport::MqttTransport;
use onceprint_mqtt::JobUrl;
use onceprint_store::{Store, StoreError};
use rumqttc::{Publish, QoS};
use serde_json::json;

use super::{engine_err, token_task, Fail, World, PUSH_DOUBT_AFTER_MS, TENANT};
use crate::schedule::{DevicePrint, MqttOp, StarPrint, SILENCE_MS};

/// The onceprint device's printer, and its device id.
pub(super) const DEVICE: &str = "m1";
const DEVICE_ID: &str = "kitchen-1";
/// The Star printer in CloudPRNT Version MQTT, and its MAC (in topics in lower case).
pub(super) const STAR: &str = "s1";
const STAR_MAC: &str = "00:11:62:00:00:02";
/// The targets MQTT steps submit to (see `schedule::MQTT_TARGETS`).
pub(super) const TARGETS: [(&str, bool); crate::schedule::MQTT_TARGETS] =
    [(DEVICE, false), (STAR, false), ("st-m", true), ("st-q", true)];
/// The printers MQTT steps transfer to (see `schedule::MQTT_PRINTERS`).
pub(super) const PRINTERS: [&str; crate::schedule::MQTT_PRINTERS] = [DEVICE, STAR];
/// The URL the Star printer was set up with (it fetches its jobs there).
const JOB_URL: &str = "https://print.example/cloudprnt";
/// The transport's settings: an onceprint device's job is sent again after 10 s without
/// an answer; a Star job whose fate the broker cannot know goes to a person after 20 s.
const RESEND_AFTER_MS: i64 = 10_000;
const STAR_UNKNOWN_AFTER_MS: i64 = 20_000;
/// Star's status codes the simulated printer reports, by the schedule's state.
const STAR_STATES: [&str; 3] = ["200%20OK", "410%20Out%20of%20Paper", "420%20Cover%20Open"];
const DEVICE_STATES: [&str; 3] = ["ok", "no_paper", "cover_open"];

/// Whether `printer` is one of the MQTT printers.
pub(super) fn is_mqtt(printer: &str) -> bool {
    printer == DEVICE || printer == STAR
}

/// A message the server holds for the broker's session.
struct ForBroker {
    pkid: u16,
    topic: String,
    payload: Vec<u8>,
    /// Handed to the broker on its current connection (not again until the next one).
    handed: bool,
    /// Handed before: the next delivery carries the DUP flag.
    dup: bool,
}

/// What the server holds.
#[derive(Default)]
struct ServerState {
    /// Whether the broker's connection is up.
    connected: bool,
    lost_sessions: u64,
    /// What becomes of the broker's next publishes (see `MqttOp::Pass`).
    publish_fault: usize,
    /// The broker's publishes its client never had confirmed: sent again at its next
    /// connection that keeps the session.
    unconfirmed: Vec<(String, Vec<u8>)>,
    /// Each device's session: what was published to it and not yet taken (PUBACK).
    to_device: BTreeMap<String, VecDeque<(String, Vec<u8>)>>,
    /// The broker's session: what devices published (their wills included).
    to_broker: VecDeque<ForBroker>,
    next_pkid: u16,
    /// PUBACKs the broker sent.
    acked: HashSet<u16>,
    /// The broker process dies before the PUBACK it is about to send.
    drop_acks: bool,
    /// Jobs the broker published, in order: (printer, task id, whether the server
    /// confirmed it).
    published: Vec<(&'static str, String, bool)>,
}

/// The MQTT server as the broker's connection sees it.
#[derive(Default)]
pub(super) struct SimServer(Mutex<ServerState>);

impl SimServer {
    fn state(&self) -> MutexGuard<'_, ServerState> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The device a `…/to-device/{device}/…` topic names.
fn device_of_topic(topic: &str) -> Option<&str> {
    topic.split_once("/to-device/").and_then(|(_, rest)| rest.split('/').next())
}

impl ServerState {
    fn queue_for_device(&mut self, topic: String, payload: Vec<u8>) {
        if let Some(device) = device_of_topic(&topic) {
            self.to_device.entry(device.to_owned()).or_default().push_back((topic, payload));
        }
    }

    /// A device publishes (the server confirms it at once: the device's side of QoS 1
    /// is not what is simulated).
    fn published_by_device(&mut self, topic: String, payload: Vec<u8>) {
        self.next_pkid = self.next_pkid.wrapping_add(1).max(1);
        let pkid = self.next_pkid;
        self.to_broker.push_back(ForBroker { pkid, topic, payload, handed: false, dup: false });
    }

    /// The broker connects (again).
    fn connect(&mut self, kept: bool) {
        self.connected = true;
        if kept {
            for (topic, payload) in std::mem::take(&mut self.unconfirmed) {
                self.queue_for_device(topic, payload);
            }
            for m in self.to_broker.iter_mut() {
                m.handed = false;
            }
        } else {
            self.lost_sessions += 1;
            self.unconfirmed.clear();
            self.to_broker.clear();
        }
    }
}

#[async_trait::async_trait]
impl Connection for SimServer {
    fn is_connected(&self) -> bool {
        self.state().connected
    }

    fn lost_sessions(&self) -> u64 {
        self.state().lost_sessions
    }

    async fn publish(&self, topic: &str, payload: Vec<u8>) -> Published {
        let mut st = self.state();
        if !st.connected {
            return Published::NotSent;
        }
        let fault = st.publish_fault;
        let job = serde_json::from_slice::<serde_json::Value>(&payload).ok().and_then(|v| {
            v.get("jobToken")
                .and_then(|t| t.as_str())
                .map(|t| (STAR, token_task(t)))
                .or_else(|| v.get("task_id").and_then(|t| t.as_str()).map(|t| (DEVICE, t.to_owned())))
        });
        if let Some((printer, task)) = job {
            st.published.push((printer, task, fault == 0));
        }
        if fault < 2 {
            st.queue_for_device(topic.to_owned(), payload.clone());
        }
        if fault == 0 {
            return Published::Acked;
        }
        // rumqttc keeps a publish without its PUBACK and sends it again when it connects
        // with the session kept.
        st.unconfirmed.push((topic.to_owned(), payload));
        Published::Unknown
    }

    async fn ack(&self, message: &Publish) {
        let mut st = self.state();
        if !st.drop_acks {
            st.acked.insert(message.pkid);
        }
    }
}

/// An onceprint device as docs/MQTT.md describes it: a journal of keys in flash, written
/// before it acts.
struct SimDevice {
    online: bool,
    dead: bool,
    boots: u64,
    state: usize,
    /// Key → printed (else started).
    journal: HashMap<String, bool>,
    /// Keys whose data it could not use: the same data is refused again.
    refused: HashSet<String>,
    /// Key → the attempt it refused (out of paper, cover open) and the word it answered:
    /// a copy of that attempt that comes again is answered the same (docs/MQTT.md, "The
    /// journal").
    declined: HashMap<String, (i64, usize)>,
}

/// A Star printer in CloudPRNT Version MQTT.
struct SimStar {
    online: bool,
    dead: bool,
    state: usize,
    /// Its last ten job tokens. Star does not say whether they survive a power cycle, so
    /// the printer forgets them when it is switched off, which makes any print-job the
    /// broker sends it again a second copy on paper. The one exception: once the MQTT
    /// server did not confirm one of its jobs, the broker's MQTT client sends that publish
    /// again at its next connection (MQTT 3.1.1, QoS 1), which the broker does not
    /// prevent; from then on the printer keeps its tokens (docs/SIMULATION.md, "Limits").
    tokens: VecDeque<String>,
    /// One of its jobs was published without the MQTT server's PUBACK.
    client_resends: bool,
}

/// The broker process's MQTT transport: what a restart loses.
struct MqttBroker {
    inbox: Arc<Inbox>,
    driver: PushDriver,
}

/// The MQTT side of the world.
pub(super) struct MqttWorld {
    server: Arc<SimServer>,
    /// The broker's monotonic clock: the time that really passed.
    pub monotonic: Arc<ManualClock>,
    broker: Option<MqttBroker>,
    device: SimDevice,
    star: SimStar,
}

impl Default for MqttWorld {
    fn default() -> Self {
        MqttWorld {
            server: Arc::new(SimServer::default()),
            monotonic: Arc::new(ManualClock::new(0)),
            broker: None,
            device: SimDevice {
                online: true,
                dead: false,
                boots: 1,
                state: 0,
                journal: HashMap::new(),
                refused: HashSet::new(),
                declined: HashMap::new(),
            },
            star: SimStar { online: true, dead: false, state: 0, tokens: VecDeque::new(), client_resends: false },
        }
    }
}

/// The MQTT printers and their stations, in the store's set-up; the URL the Star printer
/// used for its server settings, remembered as the broker remembers it.
pub(super) async fn set_up(store: &Arc<dyn Store>, now: i64) -> Result<(), StoreError> {
    let printers = [
        (DEVICE, format!(r#"{{"kind":"mqtt","protocol":"onceprint","device_id":"{DEVICE_ID}"}}"#)),
        (STAR, format!(r#"{{"kind":"mqtt","protocol":"cloudprnt","mac":"{STAR_MAC}"}}"#)),
    ];
    super::add_printers(store, printers, now).await?;
    super::add_stations(store, [("st-m", [DEVICE, STAR]), ("st-q", [STAR, "a1"])], now).await?;
    JobUrl::new(store.clone(), None).learn(TENANT, STAR, JOB_URL.to_owned()).await
}

fn start_broker(
    lanes: &Arc<LaneEngine>,
    store: &Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    monotonic: Arc<dyn Clock>,
    server: &Arc<SimServer>,
) -> MqttBroker {
    let devices = Arc::new(Devices::default());
    let transport = Arc::new(
        MqttTransport::new(
            server.clone(),
            devices.clone(),
            Duration::from_millis(RESEND_AFTER_MS as u64),
            STAR_UNKNOWN_AFTER_MS,
            Arc::new(JobUrl::new(store.clone(), None)),
        )
        .with_clocks(clock, monotonic),
    );
    let inbox = Arc::new(Inbox::new(
        lanes.clone(),
        server.clone(),
        devices,
        transport.clone(),
        Claimant::push(TransportKind::Mqtt.as_str()),
    ));
    let driver = PushDriver::new(
        lanes.clone(),
        transport as Arc<dyn PushTransport>,
        PushConfig { recheck_after_ms: SILENCE_MS, doubt_after_ms: PUSH_DOUBT_AFTER_MS, ..PushConfig::default() },
    );
    MqttBroker { inbox, driver }
}

impl World {
    /// The broker's MQTT transport starts and connects; the devices, online from the
    /// start, announce themselves and the broker hears them before the first step.
    pub(super) fn mqtt_start(&mut self) -> Result<(), Fail> {
        self.mqtt.server.state().connected = true;
        self.device_status();
        self.star_status(None);
        self.mqtt_restart()?;
        self.mqtt_deliver_all()
    }

    /// A new broker process (the rest of it was just started again): a new MQTT link
    /// resumes the broker's session, so what it had not acknowledged is delivered again;
    /// its client's unconfirmed publishes are gone with it.
    pub(super) fn mqtt_restart(&mut self) -> Result<(), Fail> {
        // A Star job of an earlier process goes to a person if no result comes.
        for t in self.tasks()? {
            if t.state == TaskState::Sent && t.printer_id == STAR {
                self.facts.exposed.insert(t.task_id);
            }
        }
        let b = start_broker(
            &self.broker.lanes,
            &self.store,
            self.clock.clone(),
            self.mqtt.monotonic.clone(),
            &self.mqtt.server,
        );
        self.mqtt.broker = Some(b);
        let connected = {
            let mut st = self.mqtt.server.state();
            st.unconfirmed.clear();
            let connected = st.connected;
            if connected {
                st.connect(true);
            }
            connected
        };
        if connected {
            self.mqtt_ask_everyone()?;
        }
        Ok(())
    }

    fn mqtt_ask_everyone(&mut self) -> Result<(), Fail> {
        let Some(inbox) = self.mqtt.broker.as_ref().map(|b| b.inbox.clone()) else { return Ok(()) };
        self.block_on(inbox.ask_everyone())
    }

    pub(super) fn mqtt_step(&mut self, op: &MqttOp) -> Result<(), Fail> {
        match *op {
            MqttOp::Pass { publish } => self.mqtt_pass(publish)?,
            MqttOp::Deliver { fault } => self.mqtt_deliver(fault)?,
            MqttOp::Link { up: false, .. } => self.mqtt.server.state().connected = false,
            MqttOp::Link { up: true, kept } => {
                if !kept {
                    // What the broker published and the server may not have: a Star job
                    // is not sent again, and goes to a person without a result.
                    let lost: Vec<String> = {
                        let st = self.mqtt.server.state();
                        st.unconfirmed.iter().filter_map(|(_, p)| star_job_task(p)).collect()
                    };
                    self.facts.exposed.extend(lost);
                    for t in self.tasks()? {
                        if t.state == TaskState::Sent && t.printer_id == STAR {
                            self.facts.exposed.insert(t.task_id);
                        }
                    }
                }
                self.mqtt.server.state().connect(kept);
                self.mqtt_ask_everyone()?;
            }
            _ if self.device_gone(op) => {}
            MqttOp::Device { print } => self.device_take(print)?,
            MqttOp::DeviceState { state } => {
                if self.mqtt.device.state != state {
                    self.mqtt.device.state = state;
                    self.device_status();
                }
            }
            MqttOp::DevicePower { on } => self.device_power(on),
            MqttOp::Star { print, fetch_lost } => self.star_take(print, fetch_lost)?,
            MqttOp::StarState { state } => {
                if self.mqtt.star.state != state {
                    self.mqtt.star.state = state;
                    self.star_status(None);
                }
            }
            MqttOp::StarPower { on } => self.star_power(on)?,
            MqttOp::Dies { star: false } => {
                self.device_power(false);
                self.mqtt.device.dead = true;
            }
            MqttOp::Dies { star: true } => {
                self.star_power(false)?;
                self.mqtt.star.dead = true;
            }
        }
        Ok(())
    }

    /// A step of a device that is switched off for good changes nothing.
    fn device_gone(&self, op: &MqttOp) -> bool {
        match op {
            MqttOp::Device { .. } | MqttOp::DeviceState { .. } | MqttOp::DevicePower { .. } => self.mqtt.device.dead,
            MqttOp::Star { .. } | MqttOp::StarState { .. } | MqttOp::StarPower { .. } => self.mqtt.star.dead,
            _ => false,
        }
    }

    /// The push driver's round; the jobs it published are handed out in that order.
    fn mqtt_pass(&mut self, publish: usize) -> Result<(), Fail> {
        let Some(b) = &self.mqtt.broker else { return Ok(()) };
        self.mqtt.server.state().publish_fault = publish;
        let result = self.block_on(b.driver.pass());
        self.mqtt.server.state().publish_fault = 0;
        result?.map_err(|e| engine_err("MQTT push pass", e))?;
        let (published, will_pending) = {
            let mut st = self.mqtt.server.state();
            let will = st.to_broker.iter().any(|m| m.topic.ends_with("/client-will"));
            (std::mem::take(&mut st.published), will)
        };
        let away = !self.mqtt.star.online || will_pending;
        for (printer, task_id, confirmed) in published {
            if let Some(t) = self.task(&task_id)? {
                self.first_out(&t)?;
            }
            // A Star job the server did not confirm is never sent again: without a result
            // it goes to a person. So does one published while the printer was away or its
            // last will was still on its way: the broker cannot tell whether it left
            // before or after it took the job.
            if printer == STAR && (!confirmed || away) {
                self.facts.exposed.insert(task_id);
            }
            if printer == STAR && !confirmed {
                self.mqtt.star.client_resends = true;
            }
        }
        Ok(())
    }

    /// The server hands the broker the oldest message it has not handed on this
    /// connection.
    fn mqtt_deliver(&mut self, fault: usize) -> Result<(), Fail> {
        let Some(inbox) = self.mqtt.broker.as_ref().map(|b| b.inbox.clone()) else { return Ok(()) };
        let message = {
            let mut st = self.mqtt.server.state();
            if !st.connected {
                return Ok(());
            }
            let Some(m) = st.to_broker.iter_mut().find(|m| !m.handed) else { return Ok(()) };
            m.handed = true;
            let mut p = Publish::new(m.topic.clone(), QoS::AtLeastOnce, m.payload.clone());
            p.pkid = m.pkid;
            p.dup = m.dup;
            m.dup = true;
            st.drop_acks = fault == 2;
            p
        };
        let pkid = message.pkid;
        let applied = self.block_on(inbox.apply_then_ack(message));
        {
            let mut st = self.mqtt.server.state();
            st.drop_acks = false;
            // A PUBACK lost on the way counts as none.
            if st.acked.remove(&pkid) && fault == 0 {
                st.to_broker.retain(|m| m.pkid != pkid);
            }
        }
        applied?;
        if fault == 2 {
            self.step(&crate::schedule::Op::RestartBroker)?;
        }
        Ok(())
    }

    fn device_topic(method: &str) -> String {
        format!("{}/{DEVICE_ID}/{method}", onceprint_mqtt::protocol::DEVICE_TO_SERVER)
    }

    fn star_topic(method: &str) -> String {
        format!("{}/{}/{method}", onceprint_mqtt::protocol::STAR_TO_SERVER, STAR_MAC.to_ascii_lowercase())
    }

    fn device_publish(&self, method: &str, payload: serde_json::Value) {
        self.mqtt.server.state().published_by_device(Self::device_topic(method), payload.to_string().into_bytes());
    }

    fn star_publish(&self, method: &str, payload: serde_json::Value) {
        self.mqtt.server.state().published_by_device(Self::star_topic(method), payload.to_string().into_bytes());
    }

    /// The device's status, as it publishes it on connect, on a change and when asked.
    fn device_status(&self) {
        let d = &self.mqtt.device;
        if !d.online {
            return;
        }
        let conn = format!("{DEVICE_ID}-{}", d.boots);
        self.device_publish("status", json!({"v": 1, "online": true, "conn": conn, "state": DEVICE_STATES[d.state]}));
    }

    /// The Star printer's `client-status`, with the job it is printing.
    fn star_status(&self, printing: Option<&str>) {
        let s = &self.mqtt.star;
        if !s.online {
            return;
        }
        let mut status = json!({
            "title": "client-status",
            "printerMAC": STAR_MAC,
            "statusCode": STAR_STATES[s.state],
            "printingInProgress": printing.is_some(),
        });
        if let Some(token) = printing {
            status["jobToken"] = json!(token);
        }
        self.star_publish("client-status", status);
    }

    fn device_power(&mut self, on: bool) {
        let d = &mut self.mqtt.device;
        if on == d.online {
            return;
        }
        d.online = on;
        if on {
            d.boots += 1;
            self.device_status();
        } else {
            // The server publishes its last will.
            self.device_publish("status", json!({"v": 1, "online": false}));
        }
    }

    fn star_power(&mut self, on: bool) -> Result<(), Fail> {
        let s = &mut self.mqtt.star;
        if on == s.online {
            return Ok(());
        }
        s.online = on;
        if on {
            self.star_status(None);
            return Ok(());
        }
        if !s.client_resends {
            s.tokens.clear();
        }
        self.star_publish("client-will", json!({"title": "client-will", "printerMAC": STAR_MAC}));
        // The broker cannot tell whether the printer took its job in flight before it
        // left: such a job is in doubt once the printer is back without a result.
        for t in self.tasks()? {
            if t.state == TaskState::Sent && t.printer_id == STAR {
                self.facts.exposed.insert(t.task_id);
            }
        }
        Ok(())
    }

    /// The next message in a device's session, if it is connected to take it.
    fn next_for(&self, device: &str) -> Option<(String, Vec<u8>)> {
        let st = self.mqtt.server.state();
        st.to_device.get(device).and_then(|q| q.front().cloned())
    }

    /// The device's PUBACK of the message it took.
    fn taken(&self, device: &str) {
        let mut st = self.mqtt.server.state();
        if let Some(q) = st.to_device.get_mut(device) {
            q.pop_front();
        }
    }

    /// The onceprint device takes its next message: a status request is answered; a job
    /// is answered from the journal if it has the key, else checked, journaled, printed.
    fn device_take(&mut self, print: DevicePrint) -> Result<(), Fail> {
        if !self.mqtt.device.online {
            return Ok(());
        }
        let Some((topic, payload)) = self.next_for(DEVICE_ID) else { return Ok(()) };
        if !topic.ends_with("/job") {
            self.device_status();
            self.taken(DEVICE_ID);
            return Ok(());
        }
        let job: serde_json::Value =
            serde_json::from_slice(&payload).map_err(|e| format!("a job the device cannot read: {e}"))?;
        let field = |name: &str| job.get(name).and_then(|v| v.as_str()).unwrap_or_default().to_owned();
        let (task_id, key) = (field("task_id"), field("key"));
        let attempt = job.get("attempt").and_then(|v| v.as_i64()).unwrap_or(0);
        let reprint = job.get("reprint").and_then(|v| v.as_bool()).unwrap_or(false);
        let data = base64::engine::general_purpose::STANDARD
            .decode(field("data"))
            .map_err(|e| format!("a job whose data is not base64: {e}"))?;
        let result = |word: &str, previous: Option<&str>| {
            let mut r = json!({"v": 1, "task_id": task_id, "attempt": attempt, "key": key, "result": word});
            if let Some(p) = previous {
                r["previous"] = json!(p);
            }
            r
        };
        match self.mqtt.device.journal.get(&key).copied() {
            Some(true) => {
                self.device_publish("result", result("duplicate", Some("printed")));
                self.taken(DEVICE_ID);
                return Ok(());
            }
            Some(false) if !reprint => {
                self.device_publish("result", result("duplicate", Some("started")));
                self.taken(DEVICE_ID);
                return Ok(());
            }
            _ => {}
        }
        if let Some(&(declined, state)) = self.mqtt.device.declined.get(&key) {
            if declined >= attempt {
                self.device_publish("result", result(DEVICE_STATES[state], None));
                self.taken(DEVICE_ID);
                return Ok(());
            }
        }
        if self.mqtt.device.state != 0 {
            // Checked before printing: nothing printed; the refusal is journaled.
            let state = self.mqtt.device.state;
            self.mqtt.device.declined.insert(key.clone(), (attempt, state));
            self.device_publish("result", result(DEVICE_STATES[state], None));
            self.taken(DEVICE_ID);
            return Ok(());
        }
        if print == DevicePrint::Rejected || self.mqtt.device.refused.contains(&key) {
            self.mqtt.device.refused.insert(key.clone());
            self.device_publish("result", result("rejected", None));
            self.taken(DEVICE_ID);
            return Ok(());
        }
        self.mqtt.device.journal.insert(key.clone(), false);
        let (paper, printed) = match print {
            DevicePrint::Printed | DevicePrint::AckLost => (true, true),
            DevicePrint::Error { paper } => (paper, false),
            DevicePrint::PowerLoss { paper, journaled } => (paper || journaled, journaled),
            DevicePrint::Rejected => (false, false),
        };
        if paper {
            self.paper(&task_id, &data);
        }
        if printed {
            self.mqtt.device.journal.insert(key.clone(), true);
        }
        match print {
            DevicePrint::PowerLoss { journaled, .. } => {
                if !journaled {
                    self.facts.exposed.insert(task_id.clone());
                }
                // No result, no PUBACK: the job stays in its session.
                self.device_power(false);
            }
            DevicePrint::Error { .. } => {
                self.facts.exposed.insert(task_id.clone());
                self.device_publish("result", result("error", None));
                self.taken(DEVICE_ID);
            }
            // The PUBACK is lost: the server delivers the job again.
            DevicePrint::AckLost => self.device_publish("result", result("printed", None)),
            _ => {
                self.device_publish("result", result("printed", None));
                self.taken(DEVICE_ID);
            }
        }
        Ok(())
    }

    /// The Star printer takes its next message (PUBACK on receipt): a status request is
    /// answered; a print-job's data is fetched from its URL over HTTP (the broker's real
    /// CloudPRNT GET), printed, and answered with a `print-result`.
    fn star_take(&mut self, print: StarPrint, fetch_lost: bool) -> Result<(), Fail> {
        let mac = STAR_MAC.to_ascii_lowercase();
        if !self.mqtt.star.online {
            return Ok(());
        }
        let Some((topic, payload)) = self.next_for(&mac) else { return Ok(()) };
        self.taken(&mac);
        if !topic.ends_with("/print-job") {
            self.star_status(None);
            return Ok(());
        }
        let job: serde_json::Value =
            serde_json::from_slice(&payload).map_err(|e| format!("a print-job the printer cannot read: {e}"))?;
        let token = job.get("jobToken").and_then(|v| v.as_str()).unwrap_or_default().to_owned();
        if job.get("jobType").and_then(|v| v.as_str()) != Some("url")
            || job.get("printData").and_then(|v| v.as_str()) != Some(JOB_URL)
        {
            return Err(format!("the Star printer was sent a print-job it cannot fetch: {job}"));
        }
        let result = |ok: bool, code: &str| {
            json!({"title": "print-result", "jobToken": token, "printSucceeded": ok, "statusCode": code,
                   "printerMAC": STAR_MAC})
        };
        if self.mqtt.star.tokens.contains(&token) {
            // A token it has seen: not printed again, and said so with a code Star does
            // not document.
            self.star_publish("print-result", result(false, "200%20OK"));
            return Ok(());
        }
        self.mqtt.star.tokens.push_back(token.clone());
        if self.mqtt.star.tokens.len() > 10 {
            self.mqtt.star.tokens.pop_front();
        }
        let task = token_task(&token);
        let stopped = self.mqtt.star.state;
        if stopped != 0 {
            // It cannot print: it says why, and nothing came out.
            let code = STAR_STATES[stopped];
            if star::job_result(&code.replace("%20", " ")).proof == Proof::MayHavePrinted {
                self.facts.exposed.insert(task);
            }
            self.star_publish("print-result", result(false, code));
            return Ok(());
        }
        self.star_status(Some(&token));
        let got = self.block_on(async {
            let info = self.printer_info(STAR).await?;
            Ok::<_, Fail>(
                self.broker.cloudprnt.fetch(&info, Some(STAR_MAC), Some("text/plain"), Some(&token), None).await,
            )
        })??;
        let data = match got {
            Ok(_) if fetch_lost => None,
            Ok(job) => Some(job.bytes),
            Err(CloudPrntError::NoSuchJob(_)) => None,
            Err(e) => return Err(engine_err("CloudPRNT job GET of an MQTT print-job", e)),
        };
        let Some(data) = data else {
            // Nothing to print: a download that did not complete (520).
            self.star_publish("print-result", result(false, "520%20Download%20Timeout"));
            self.star_status(None);
            return Ok(());
        };
        let (paper, results): (bool, Vec<(bool, &str)>) = match print {
            StarPrint::Printed => (true, vec![(true, "200%20OK")]),
            StarPrint::Twice => (true, vec![(true, "200%20OK"), (true, "200%20OK")]),
            StarPrint::Code { code, paper } => {
                let paper = match star::job_result(code).proof {
                    Proof::NotPrinted | Proof::Refused => false,
                    Proof::Printed => true,
                    Proof::MayHavePrinted => paper,
                };
                (paper, vec![(false, code)])
            }
            StarPrint::PowerLoss { paper } => (paper, vec![]),
        };
        if paper {
            self.paper(&task, &data);
        }
        if results.is_empty() || results.iter().any(|(ok, c)| !ok && star::job_result(c).proof == Proof::MayHavePrinted)
        {
            self.facts.exposed.insert(task);
        }
        if results.is_empty() {
            self.star_power(false)?;
            return Ok(());
        }
        for (ok, code) in results {
            self.star_publish("print-result", result(ok, &code.replace(' ', "%20")));
        }
        self.star_status(None);
        Ok(())
    }

    /// One round of the drain: faults stop, the MQTT server is reachable and keeps the
    /// session, the devices that are not dead are on and ready, take what they were sent
    /// and print it, and the broker hears everything.
    pub(super) fn mqtt_drain_round(&mut self, open: &[onceprint_store::Task]) -> Result<(), Fail> {
        let idle = {
            let st = self.mqtt.server.state();
            st.to_broker.is_empty()
                && st.unconfirmed.is_empty()
                && st.to_device.values().flatten().all(|(topic, _)| topic.ends_with("status-request"))
        };
        if idle && !open.iter().any(|t| is_mqtt(&t.printer_id)) {
            // Nothing of the MQTT printers' is open or on its way.
            return Ok(());
        }
        if !self.mqtt.server.state().connected {
            self.mqtt_step(&MqttOp::Link { up: true, kept: true })?;
        }
        for op in [
            MqttOp::DevicePower { on: true },
            MqttOp::DeviceState { state: 0 },
            MqttOp::StarPower { on: true },
            MqttOp::StarState { state: 0 },
        ] {
            self.mqtt_step(&op)?;
        }
        self.mqtt_deliver_all()?;
        self.mqtt_pass(0)?;
        for _ in 0..8 {
            self.mqtt_step(&MqttOp::Device { print: DevicePrint::Printed })?;
            self.mqtt_step(&MqttOp::Star { print: StarPrint::Printed, fetch_lost: false })?;
        }
        self.mqtt_deliver_all()
    }

    fn mqtt_deliver_all(&mut self) -> Result<(), Fail> {
        while self.mqtt.server.state().connected && self.mqtt.server.state().to_broker.iter().any(|m| !m.handed) {
            self.mqtt_deliver(0)?;
        }
        Ok(())
    }
}

/// The task of a Star print-job's payload.
fn star_job_task(payload: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(payload).ok()?;
    v.get("jobToken").and_then(|t| t.as_str()).map(token_task)
}
