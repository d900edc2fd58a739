//! The `agent` transport (pull): store agents long-poll for the deliveries of their store's
//! agent printers and acknowledge what the printer said (docs/API.md, "The store agent
//! protocol"). Send = hand out on a poll (`claim`), query = offer again to the same agent
//! id, whose journal answers, verify = the agent's token (checked by the HTTP layer).
//!
//! A poll names the agent id and its session (one per agent process). A session older
//! than the agent id's newest is refused ([`PollError::Superseded`]): two live processes
//! with one agent id must not both print, so the older is told to stop. In a store whose
//! LAN orders one agent takes, only that agent is handed the store's deliveries; the
//! others stand by (`offline::lan_listener_lease`).

use std::sync::Arc;
use std::time::Duration;

use onceprint_store::{AgentIdentity, StoreError};

use crate::claimant::{Claimant, Superseded};
use crate::lanes::{AckIn, AckResult, ClaimRules, Delivery, DeliveryError, HandOutNext, LaneEngine, Scope};
use crate::transport::{TransportConfig, TransportKind};

/// Why a poll was not answered with deliveries.
#[derive(Debug, thiserror::Error)]
pub enum PollError {
    #[error(transparent)]
    Superseded(#[from] Superseded),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<DeliveryError> for PollError {
    fn from(e: DeliveryError) -> Self {
        match e {
            DeliveryError::Store(s) => PollError::Store(s),
        }
    }
}

/// One delivery as an agent receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentDelivery {
    pub task_id: String,
    pub attempt: i32,
    pub printer_id: String,
    /// `tcp://HOST:PORT`, `usb:///PATH` or `serial:///PATH[?…]`, as configured on the
    /// printer.
    pub printer_address: String,
    pub idempotency_key: String,
    pub content_type: &'static str,
    pub data: Vec<u8>,
    pub reprint: bool,
}

impl From<Delivery> for AgentDelivery {
    fn from(d: Delivery) -> Self {
        let printer_address = match &d.printer.transport {
            Some(TransportConfig::Agent(a)) => a.address.clone(),
            _ => String::new(),
        };
        AgentDelivery {
            task_id: d.task.task_id,
            attempt: d.attempt,
            printer_id: d.task.printer_id,
            printer_address,
            idempotency_key: d.idempotency_key,
            content_type: "escpos",
            data: d.data,
            reprint: d.reprint,
        }
    }
}

/// The agent transport on the lane engine.
pub struct AgentTransport {
    lanes: Arc<LaneEngine>,
}

impl AgentTransport {
    pub fn new(lanes: Arc<LaneEngine>) -> AgentTransport {
        AgentTransport { lanes }
    }

    /// Long poll: deliveries for the agent's store, as soon as there are any, or an empty
    /// list after `wait`.
    #[allow(clippy::too_many_arguments)]
    pub async fn poll(
        &self,
        who: &AgentIdentity,
        agent_id: &str,
        session: Option<&str>,
        session_age_ms: Option<u64>,
        wait: Duration,
        max: usize,
    ) -> Result<Vec<AgentDelivery>, PollError> {
        let registry = self.lanes.agents();
        let signals = self.lanes.signals().clone();
        let guard = registry.begin_poll(&who.tenant_id, &who.store_id, agent_id, session, session_age_ms)?;
        if guard.took_over {
            // Polls of the earlier session look again (and learn that they must stop); the
            // earlier session's deliveries come to this one once it is quiet.
            signals.notify(&who.tenant_id, &who.store_id);
        }
        let claimant = Claimant::agent(agent_id, session);
        let rules = self.rules(max);
        let start = tokio::time::Instant::now();
        let deadline = start + wait;
        let notify = signals.get(&who.tenant_id, &who.store_id);
        if self.stands_by(who, agent_id).await? {
            // Another agent takes the store's LAN orders, and only it may print the store's
            // tickets (`offline::lan_listener_lease`): this one waits out its poll.
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => {}
                _ = signals.shutdown() => {}
            }
            return Ok(Vec::new());
        }
        loop {
            if let Some(newer) = registry.is_superseded(&who.tenant_id, &who.store_id, agent_id, session) {
                return Err(Superseded { agent_id: agent_id.to_owned(), newer }.into());
            }
            let woken = notify.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            // Boxed: a waiting poll's future would otherwise reserve room for the whole
            // claim's state for as long as it waits, in every one of thousands of polls.
            let claimed = Box::pin(self.lanes.claim(
                &claimant,
                &who.tenant_id,
                Scope::Store { store_id: &who.store_id, kind: TransportKind::Agent },
                rules,
            ))
            .await?;
            let now = tokio::time::Instant::now();
            if !claimed.deliveries.is_empty() || now >= deadline || signals.is_shutting_down() {
                return Ok(claimed.deliveries.into_iter().map(AgentDelivery::from).collect());
            }
            let mut until = deadline.min(now + Duration::from_millis(self.lanes.config().recheck_ms));
            if let Some(t) = claimed.next_look {
                let ms = (t - self.lanes.now()).max(0) as u64;
                until = until.min(now + Duration::from_millis(ms));
            }
            tokio::select! {
                _ = &mut woken => {}
                _ = tokio::time::sleep_until(until) => {
                    if until >= deadline {
                        // Nothing woke the poll and nothing came due before its end: answer
                        // at once rather than read the lanes once more. The agent's next
                        // poll reads them as it arrives, so a last look here would only
                        // double the reads of every idle agent.
                        return Ok(Vec::new());
                    }
                }
                _ = signals.shutdown() => {}
            }
        }
    }

    /// Whether another agent of the store holds its LAN listener: then this one is handed
    /// nothing. Whatever it was handed before keeps its deliveries' own course (acks and
    /// redeliveries to it, whose journal answers).
    async fn stands_by(&self, who: &AgentIdentity, agent_id: &str) -> Result<bool, StoreError> {
        let holder = self.lanes.directory().lan_listener(&who.tenant_id, &who.store_id).await?;
        Ok(holder.is_some_and(|h| h != agent_id))
    }

    /// How deliveries are handed to an agent: it answers within the redelivery deadline,
    /// its journal always answers, so nothing is given up on.
    fn rules(&self, max: usize) -> ClaimRules {
        ClaimRules {
            max,
            answer_within_ms: self.lanes.config().redeliver_after_ms,
            give_up_after_ms: None,
            fetched_on_hand_out: false,
        }
    }

    /// Applies an agent's acks. Acks of a superseded session are taken too: they tell the
    /// truth about its own attempts, and the attempt number keeps them from moving a task
    /// that was offered to the newer session since.
    pub async fn ack(
        &self,
        who: &AgentIdentity,
        agent_id: &str,
        session: Option<&str>,
        acks: Vec<AckIn>,
    ) -> Result<Vec<AckResult>, DeliveryError> {
        Ok(self.ack_and_take(who, agent_id, session, acks, 0).await?.0)
    }

    /// [`AgentTransport::ack`] that also hands the agent, with `next` > 0, the next task of
    /// each of its printers' lanes these acks free, at most `next` (agent protocol 2; see
    /// [`LaneEngine::ack_and_hand_out`]): its printers go on without waiting for a poll. A
    /// superseded session gets nothing new, as its polls would not.
    pub async fn ack_and_take(
        &self,
        who: &AgentIdentity,
        agent_id: &str,
        session: Option<&str>,
        acks: Vec<AckIn>,
        next: usize,
    ) -> Result<(Vec<AckResult>, Vec<AgentDelivery>), DeliveryError> {
        let registry = self.lanes.agents();
        registry.heard(&who.tenant_id, &who.store_id, agent_id, session);
        let current = registry.is_superseded(&who.tenant_id, &who.store_id, agent_id, session).is_none()
            && !self.stands_by(who, agent_id).await?;
        let next = (next > 0 && current).then(|| HandOutNext { kind: TransportKind::Agent, rules: self.rules(next) });
        let acked = self.lanes.ack_and_hand_out(who, &Claimant::agent(agent_id, session), acks, next).await?;
        Ok((acked.results, acked.deliveries.into_iter().map(AgentDelivery::from).collect()))
    }
}
