//! The `mqtt` push transport on the shared push driver: sending is publishing the job with
//! QoS 1 and waiting for the MQTT server's PUBACK ("accepted", never "printed"); what
//! happened arrives later as a result message (`crate::inbox`).
//!
//! There is no way to ask a device about a job, so [`PushTransport::query`] answers from
//! what the broker knows.
//!
//! - An onceprint device keeps a journal of the keys it printed (docs/MQTT.md), so a job
//!   it may have lost is sent again with the same attempt and key: when the device has
//!   gone away since, when the MQTT server did not keep the broker's session, when the
//!   broker restarted, or when it has not answered for `resend_after_ms`.
//! - A Star printer is never sent a job again once the MQTT server accepted it: it
//!   remembers its last ten job tokens, and Star does not say that they survive a power
//!   cycle, so a repeated token may print twice. The MQTT server queues the job in the
//!   printer's persistent session until the printer takes it. A printer that went away
//!   after it was handed the job and came back without a result may have printed it: the
//!   job is settled in doubt (a late result still closes it). So is one whose fate this
//!   broker cannot know — published by an earlier broker process, never confirmed by the
//!   MQTT server, or in flight when the broker's session was lost — once no result came
//!   within `star_unknown_after_ms` of sending it. Any other job without an answer waits
//!   for it, and goes to a person after `push_doubt_after_ms`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use onceprint_core::{Outcome, Proof};
use onceprint_engine::clock::{Clock, SystemClock};
use onceprint_engine::directory::PrinterInfo;
use onceprint_engine::transport::push::{Asked, PushTransport, Sent};
use onceprint_engine::transport::{MqttProtocol, TransportConfig, TransportKind};
use onceprint_engine::Delivery;

use crate::devices::Devices;
use crate::job_url::JobUrl;
use crate::link::{Connection, Published};
use crate::protocol::{job_payload, DeviceAddr, Job};

#[derive(Debug, Clone, Copy)]
struct SentRecord {
    device_epoch: u64,
    lost_sessions: u64,
    /// By the transport's monotonic clock.
    at: i64,
}

/// The process's monotonic clock in milliseconds since the transport was made: how long a
/// job has gone unanswered is measured on it, so that a step of the wall clock neither
/// sends a job again early nor holds it back.
struct Monotonic(Instant);

impl Clock for Monotonic {
    fn now_ms(&self) -> i64 {
        i64::try_from(self.0.elapsed().as_millis()).unwrap_or(i64::MAX)
    }
}

/// The MQTT transport. Share it behind an `Arc`.
pub struct MqttTransport {
    link: Arc<dyn Connection>,
    devices: Arc<Devices>,
    /// (task, attempt) → when and in which epochs it was last handed to the MQTT server.
    sent: Mutex<HashMap<(String, i32), SentRecord>>,
    resend_after: Duration,
    /// See `MqttSettings::star_unknown_after_ms`.
    star_unknown_after_ms: i64,
    /// Where Star printers fetch their `url` jobs.
    job_url: Arc<JobUrl>,
    /// The wall clock a task's `sent_at` is compared with (the lane engine's).
    wall: Arc<dyn Clock>,
    /// How long ago a job was handed over (see [`Monotonic`]).
    monotonic: Arc<dyn Clock>,
}

/// The device a delivery goes to.
pub fn device_of(printer: &PrinterInfo) -> Option<DeviceAddr> {
    match &printer.transport {
        Some(TransportConfig::Mqtt(m)) => Some(DeviceAddr::new(m.protocol, m.device())),
        _ => None,
    }
}

impl MqttTransport {
    pub fn new(
        link: Arc<dyn Connection>,
        devices: Arc<Devices>,
        resend_after: Duration,
        star_unknown_after_ms: i64,
        job_url: Arc<JobUrl>,
    ) -> MqttTransport {
        MqttTransport {
            link,
            devices,
            sent: Mutex::default(),
            resend_after,
            star_unknown_after_ms,
            job_url,
            wall: Arc::new(SystemClock),
            monotonic: Arc::new(Monotonic(Instant::now())),
        }
    }

    /// The same transport reading other clocks: `wall` for the tasks' times (the lane
    /// engine's clock), `monotonic` for how long a job has gone unanswered. The simulation
    /// moves both by hand; the broker keeps the system's.
    pub fn with_clocks(mut self, wall: Arc<dyn Clock>, monotonic: Arc<dyn Clock>) -> MqttTransport {
        self.wall = wall;
        self.monotonic = monotonic;
        self
    }

    /// A result for this attempt arrived: nothing more to send.
    pub fn answered(&self, task_id: &str, attempt: i32) {
        let mut sent = self.sent.lock().unwrap_or_else(PoisonError::into_inner);
        sent.remove(&(task_id.to_owned(), attempt));
        // Records of deliveries that ended some other way (a person settled them) are
        // dropped once they are old, so that the map stays the size of what is in flight.
        if sent.len() > 10_000 {
            let now = self.monotonic.now_ms();
            sent.retain(|_, r| now - r.at < 3_600_000);
        }
    }
}

#[async_trait]
impl PushTransport for MqttTransport {
    fn kind(&self) -> TransportKind {
        TransportKind::Mqtt
    }

    async fn send(&self, d: &Delivery) -> Sent {
        let Some(addr) = device_of(&d.printer) else {
            return Sent::Failed {
                outcome: Outcome::Offline,
                proof: Proof::NotPrinted,
                detail: "the printer is no longer an MQTT printer".into(),
            };
        };
        let url = match addr.protocol {
            MqttProtocol::Cloudprnt => {
                match self.job_url.for_printer(&d.printer.row.tenant_id, &d.printer.row.id).await {
                    Ok(u) => u,
                    // Nothing was published: nothing can have printed.
                    Err(e) => {
                        return Sent::Failed {
                            outcome: Outcome::Offline,
                            proof: Proof::NotPrinted,
                            detail: format!("cannot read the printer's job URL: {e}"),
                        }
                    }
                }
            }
            MqttProtocol::Onceprint => None,
        };
        let job = Job {
            task_id: &d.task.task_id,
            attempt: d.attempt,
            key: &d.idempotency_key,
            reprint: d.reprint,
            data: &d.data,
            url: url.as_deref(),
        };
        let Some(payload) = job_payload(addr.protocol, &job) else {
            // Nothing was published: nothing can have printed.
            return Sent::Failed {
                outcome: Outcome::Offline,
                proof: Proof::NotPrinted,
                detail: "the broker does not know its URL as this printer reaches it: set serve --public-url, or \
                         restart the printer so that it asks for its server settings"
                    .into(),
            };
        };
        let record = SentRecord {
            device_epoch: self.devices.epoch(&addr),
            lost_sessions: self.link.lost_sessions(),
            at: self.monotonic.now_ms(),
        };
        match self.link.publish(&addr.job_topic(), payload).await {
            Published::Acked => {
                self.sent
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert((d.task.task_id.clone(), d.attempt), record);
                Sent::Accepted
            }
            // The first send of an attempt that never left the broker cannot have printed.
            Published::NotSent if d.again.is_none() => Sent::Failed {
                outcome: Outcome::Offline,
                proof: Proof::NotPrinted,
                detail: "the MQTT server cannot be reached".into(),
            },
            // A copy sent earlier may be on its way: nothing is known now.
            Published::NotSent => Sent::NotNow { detail: "the MQTT server cannot be reached".into() },
            Published::Unknown => {
                Sent::NotNow { detail: "handed to the MQTT link, but the MQTT server did not confirm it".into() }
            }
        }
    }

    async fn query(&self, d: &Delivery) -> Asked {
        let Some(addr) = device_of(&d.printer) else { return Asked::Unknown };
        if !self.link.is_connected() {
            return Asked::Pending;
        }
        let record =
            self.sent.lock().unwrap_or_else(PoisonError::into_inner).get(&(d.task.task_id.clone(), d.attempt)).copied();
        if addr.protocol == MqttProtocol::Cloudprnt {
            let unknown = |why: &str| {
                let sent_at = d.task.sent_at.unwrap_or(d.task.updated_at);
                if self.wall.now_ms() - sent_at < self.star_unknown_after_ms {
                    return Asked::Pending;
                }
                Asked::Done {
                    outcome: Outcome::InDoubt,
                    proof: Proof::MayHavePrinted,
                    detail: format!(
                        "{why}, and no result came within {} s; it is not sent again, since the printer may not \
                         remember the job token",
                        self.star_unknown_after_ms / 1000
                    ),
                }
            };
            return match record {
                Some(r) if r.device_epoch != self.devices.epoch(&addr) => Asked::Done {
                    outcome: Outcome::InDoubt,
                    proof: Proof::MayHavePrinted,
                    detail: "the printer left the MQTT server after it was handed the job and came back without a \
                             result; it is not sent again, since the printer may not remember the job token"
                        .into(),
                },
                None => {
                    unknown("the job was published by an earlier broker process or never confirmed by the MQTT server")
                }
                Some(r) if r.lost_sessions != self.link.lost_sessions() => {
                    unknown("the MQTT server did not keep the broker's session while the job was in flight")
                }
                // Accepted by the MQTT server: it is the printer's, and its result is awaited.
                Some(_) => Asked::Pending,
            };
        }
        match record {
            // Sent by an earlier process, or never confirmed by the MQTT server.
            None => Asked::Unknown,
            Some(r) if r.device_epoch != self.devices.epoch(&addr) => Asked::Unknown,
            Some(r) if r.lost_sessions != self.link.lost_sessions() => Asked::Unknown,
            Some(r) if self.monotonic.now_ms() - r.at >= self.resend_after.as_millis() as i64 => Asked::Unknown,
            Some(_) => Asked::Pending,
        }
    }

    fn reachable(&self, printer: &PrinterInfo) -> bool {
        self.link.is_connected()
            && device_of(printer).is_some_and(|addr| self.devices.online(&addr, printer.row.online))
    }
}
