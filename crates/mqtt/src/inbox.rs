//! What devices publish, applied: results through [`LaneEngine::ack`] (the same rules as
//! every other transport: an answer for an older attempt, a repeated one or a late one
//! changes nothing it should not), statuses and last wills into the printer row.
//!
//! A message is acknowledged (PUBACK) only after its effect is durable. One that
//! cannot be applied now (the database is away) is tried again, in order, and never
//! acknowledged before it is applied; should the broker stop first, the MQTT server
//! delivers it again to the next process. A message that can never mean anything (an
//! unknown device, bad JSON, another device's task) is acknowledged at once, after a
//! refusal was recorded where that matters.
//!
//! A device speaks only for its own printer: the task a result names must be that
//! printer's, and for onceprint devices the idempotency key must be the task's. Anything
//! else is refused and audited (an alert `printer.refused_message` for the sending
//! printer's tenant, and a warning in the log), even though the MQTT server's ACLs should
//! never let it through.

use std::sync::Arc;
use std::time::Duration;

use onceprint_core::delivery_key;
use onceprint_engine::lanes::printer_status;
use onceprint_engine::{AckIn, Claimant, DeliveryError, LaneEngine};
use onceprint_store::{AgentIdentity, OutboxEvent, StoreError};
use rumqttc::Publish;
use tokio::sync::mpsc;

use crate::devices::{Devices, Owner};
use crate::link::{Connection, Incoming};
use crate::protocol::{decode, parse_topic, DeviceAddr, JobResult, Message, Status};
use crate::transport::MqttTransport;

/// Applies what devices publish.
pub struct Inbox {
    pub(crate) lanes: Arc<LaneEngine>,
    pub(crate) link: Arc<dyn Connection>,
    pub(crate) devices: Arc<Devices>,
    pub(crate) transport: Arc<MqttTransport>,
    pub(crate) claimant: Claimant,
}

impl Inbox {
    /// The inbox of one term of the MQTT transport: results are acknowledged on the lane
    /// engine as `claimant`, a result's attempt is reported to `transport` as answered.
    pub fn new(
        lanes: Arc<LaneEngine>,
        link: Arc<dyn Connection>,
        devices: Arc<Devices>,
        transport: Arc<MqttTransport>,
        claimant: Claimant,
    ) -> Inbox {
        Inbox { lanes, link, devices, transport, claimant }
    }

    /// Runs until the link's channel closes (the link stopped).
    pub async fn run(self: Arc<Self>, mut rx: mpsc::UnboundedReceiver<Incoming>) {
        while let Some(incoming) = rx.recv().await {
            match incoming {
                Incoming::Connected { .. } => {
                    // Every lane the link serves may move again (its printers were out of
                    // reach while it was down): the push driver looks at all of them.
                    self.lanes.signals().notify_everyone_here();
                    // Devices announce themselves when they connect, not when the broker
                    // does: ask every known device for its status now.
                    let this = self.clone();
                    tokio::spawn(async move { this.ask_everyone().await });
                }
                Incoming::Message(p) => self.apply_then_ack(p).await,
            }
        }
    }

    /// Asks every device of an `mqtt` printer for its status (after the link connected).
    pub async fn ask_everyone(&self) {
        if let Err(e) = self.devices.refresh(self.lanes.store().as_ref()).await {
            tracing::warn!(error = %e, "cannot read the MQTT printers");
        }
        for addr in self.devices.all() {
            let (topic, payload) = addr.status_request();
            let _ = self.link.publish(&topic, payload).await;
        }
    }

    /// Applies one message a device published and acknowledges it once its effect is
    /// durable; one that cannot be applied now is tried again until it is, or until the
    /// broker stops (then it stays unacknowledged, and the MQTT server delivers it again).
    pub async fn apply_then_ack(&self, p: Publish) {
        let mut backoff = Duration::from_millis(100);
        loop {
            match self.apply(&p).await {
                Ok(()) => {
                    self.link.ack(&p).await;
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, topic = %p.topic, "cannot apply an MQTT message now; trying again");
                    if self.lanes.signals().is_shutting_down() {
                        // Not acknowledged: the MQTT server delivers it to the next process.
                        return;
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    /// Applies one message; `Err` only for failures that may pass (the database).
    async fn apply(&self, p: &Publish) -> Result<(), StoreError> {
        let Some((addr, method)) = parse_topic(&p.topic) else {
            tracing::debug!(topic = %p.topic, "not a device topic");
            return Ok(());
        };
        let owner = match self.devices.owner(&addr) {
            Some(o) => Some(o),
            None => {
                // A printer created a moment ago: read the printers once more.
                self.devices.refresh(self.lanes.store().as_ref()).await?;
                self.devices.owner(&addr)
            }
        };
        let Some(owner) = owner else {
            tracing::info!(device = %addr.device, %method, "a message from a device that is no printer here; ignored");
            return Ok(());
        };
        match decode(&addr, method, &p.payload) {
            Ok(Message::Result(r)) => self.result(&addr, &owner, r).await,
            Ok(Message::Status(s)) => self.status(&addr, &owner, s).await,
            Ok(Message::Ignored(m)) => {
                tracing::debug!(device = %addr.device, method = %m, "MQTT method not used by the broker");
                Ok(())
            }
            Err(why) => {
                tracing::warn!(device = %addr.device, printer = %owner.printer_id, %why, "an MQTT message that cannot be understood; dropped");
                Ok(())
            }
        }
    }

    async fn result(&self, addr: &DeviceAddr, owner: &Owner, r: JobResult) -> Result<(), StoreError> {
        let store = self.lanes.store();
        let task = store.get_tasks(&owner.tenant_id, std::slice::from_ref(&r.task_id)).await?.into_iter().next();
        let why_not = match &task {
            None => Some(format!("task {} is not a task of this tenant", r.task_id)),
            Some(t) if t.printer_id != owner.printer_id => {
                Some(format!("task {} belongs to printer {}, not to this device's printer", t.task_id, t.printer_id))
            }
            Some(t) => match &r.key {
                Some(k) if *k != delivery_key(&t.biz_no, &t.printer_id, &t.target, &t.print_type) => {
                    Some(format!("idempotency key {k:?} is not task {}'s", t.task_id))
                }
                _ => None,
            },
        };
        if let Some(why) = why_not {
            return self.refuse(addr, owner, &r, &why).await;
        }
        let who = AgentIdentity { tenant_id: owner.tenant_id.clone(), store_id: owner.store_id.clone() };
        let ack = AckIn {
            task_id: r.task_id.clone(),
            attempt: r.attempt,
            outcome: r.outcome,
            detail: r.detail.clone(),
            proof: r.proof,
        };
        let results = match self.lanes.ack(&who, &self.claimant, vec![ack]).await {
            Ok(r) => r,
            Err(DeliveryError::Store(e)) => return Err(e),
        };
        let result = results.first().map_or("stale", |r| r.as_str());
        tracing::info!(task_id = %r.task_id, attempt = r.attempt, outcome = %r.outcome, %result, device = %addr.device, "MQTT result");
        self.transport.answered(&r.task_id, r.attempt);
        Ok(())
    }

    async fn status(&self, addr: &DeviceAddr, owner: &Owner, s: Status) -> Result<(), StoreError> {
        let now = self.lanes.now();
        let update = printer_status(&owner.tenant_id, &owner.printer_id, s.condition, &s.detail, now);
        self.lanes.store().update_printer_status(&[update]).await?;
        // Only once the row says so does the transport act on it (a job in flight is sent
        // again to a device that came back).
        let came = self.devices.heard(addr, s.online, s.connection.as_deref());
        tracing::info!(device = %addr.device, printer = %owner.printer_id, online = s.online, condition = %s.condition, came_back = came, "MQTT status");
        if came {
            // A lane that waited for the device may move now.
            self.lanes.signals().notify(&owner.tenant_id, &owner.store_id);
        }
        Ok(())
    }

    /// Records a result that the device had no right to send.
    async fn refuse(&self, addr: &DeviceAddr, owner: &Owner, r: &JobResult, why: &str) -> Result<(), StoreError> {
        tracing::warn!(
            device = %addr.device, printer = %owner.printer_id, tenant = %owner.tenant_id, task_id = %r.task_id,
            attempt = r.attempt, %why, "refused an MQTT result that the device's printer does not own"
        );
        let now = self.lanes.now();
        let event_id = onceprint_engine::alerts::new_event_id(now);
        let payload = serde_json::json!({
            "id": event_id,
            "type": REFUSED_KIND,
            "created_at_ms": now,
            "tenant_id": owner.tenant_id,
            "data": {
                "printer_id": owner.printer_id,
                "store_id": owner.store_id,
                "device": addr.device,
                "task_id": r.task_id,
                "attempt": r.attempt,
                "outcome": r.outcome.as_str(),
                "reason": why,
            },
        });
        let event = OutboxEvent {
            event_id,
            tenant_id: owner.tenant_id.clone(),
            kind: REFUSED_KIND.into(),
            payload: payload.to_string(),
            now,
        };
        self.lanes.store().record_alert(&event).await
    }
}

/// The alert for a message a device had no right to send.
pub const REFUSED_KIND: &str = "printer.refused_message";
