//! The push driver: one loop for every transport whose printers the broker sends jobs to
//! (`webhook`, and `mqtt` in the `onceprint-mqtt` crate). A push transport says how to [`PushTransport::send`] a delivery and
//! how to [`PushTransport::query`] what became of one; the driver claims the lanes of its
//! printers on the lane engine, sends, and turns what the transport learns into acks, so
//! the same rules, alerts and failover apply as for agents.
//!
//! "Accepted" is never "printed": a delivery stays `sent` until the receiver reports (a
//! callback, through [`LaneEngine::ack`]) or the transport's query says so. A delivery
//! without an answer by its deadline is asked about, and sent again with the same
//! attempt and idempotency key when the receiver does not know it (it prints once per
//! key); one without an answer after `doubt_after_ms` goes to a person.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use onceprint_core::{Outcome, Proof};
use onceprint_store::{AgentIdentity, StoreError};

use crate::claimant::Claimant;
use crate::directory::PrinterInfo;
use crate::lanes::{AckIn, ClaimRules, Delivery, LaneEngine, Scope};
use crate::lease::Lease;
use crate::transport::TransportKind;
use onceprint_core::Millis;

/// What sending a delivery did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sent {
    /// The receiver took it (not printed yet).
    Accepted,
    /// It did not get there, or was refused: this ack outcome and what it proves about
    /// paper, with what happened.
    Failed { outcome: Outcome, proof: Proof, detail: String },
    /// Whether it got there cannot be known now (the way to the receiver broke while it
    /// was being handed over, and the message may still arrive). Nothing is reported:
    /// the delivery stays as it is, is asked about again at its next deadline, and goes to
    /// a person if nobody ever answers.
    NotNow { detail: String },
}

/// What the receiver says about a delivery sent earlier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Asked {
    /// It is done: this ack outcome, and what it proves about paper.
    Done { outcome: Outcome, proof: Proof, detail: String },
    /// It has the job and has not finished it.
    Pending,
    /// It does not know the job, could not be asked, or cannot be asked at all: send it
    /// again (same key).
    Unknown,
}

/// One push transport.
#[async_trait]
pub trait PushTransport: Send + Sync + 'static {
    fn kind(&self) -> TransportKind;
    async fn send(&self, delivery: &Delivery) -> Sent;
    async fn query(&self, delivery: &Delivery) -> Asked;
    /// Whether the receiver of this printer can be reached now. A printer that cannot is
    /// left alone by the driver: no new work, and its delivery in flight is neither sent
    /// again nor given up until it can (an MQTT printer that is switched off, or all of
    /// them while the MQTT server is down). Webhook endpoints are always tried.
    fn reachable(&self, _printer: &PrinterInfo) -> bool {
        true
    }
}

/// Tuning of the push driver.
#[derive(Debug, Clone)]
pub struct PushConfig {
    /// How often the driver looks at the stores whose lanes have a deadline due (a retry
    /// time, a delivery to ask about); a store signalled meanwhile is looked at sooner.
    pub interval_ms: u64,
    /// How often the driver looks at every store of its printers, signalled or not: the
    /// safety net for a signal this node never heard, spread over this time a slice with
    /// each tick. Otherwise a store that was neither signalled nor has a deadline due is
    /// not read at all, so that thousands of idle printers cost next to nothing.
    pub sweep_ms: u64,
    /// The shortest time between two passes started by signals: a storm of signals costs
    /// a bounded number of passes, while a ticket for an idle printer goes out within
    /// about this long of its commit.
    pub wake_gap_ms: u64,
    /// After this long without an answer, the receiver is asked (or the job re-sent with
    /// the same idempotency key).
    pub recheck_after_ms: i64,
    /// A delivery without an answer this long after it was first sent goes to `in_doubt`
    /// (or is reprinted, within its attempts, where the print type says so).
    pub doubt_after_ms: i64,
    pub timeout_ms: u64,
    /// Callbacks signed more than this far from now are refused (replays).
    pub replay_window_s: i64,
}

impl Default for PushConfig {
    fn default() -> Self {
        PushConfig {
            interval_ms: 200,
            sweep_ms: 10_000,
            wake_gap_ms: 10,
            recheck_after_ms: 10_000,
            doubt_after_ms: 300_000,
            timeout_ms: 10_000,
            replay_window_s: 300,
        }
    }
}

/// Which stores the driver serves, and when each has to be looked at again without a
/// signal.
struct Schedule {
    known: BTreeSet<(String, String)>,
    /// When `known` was read.
    known_read: tokio::time::Instant,
    /// Signalled stores not in `known`, until it is read again.
    unknown: BTreeSet<(String, String)>,
    /// How many stores the spread sweep owes (fractions carried over).
    owed: f64,
    /// The last store the spread sweep looked at.
    cursor: Option<(String, String)>,
    /// By the lane engine's clock.
    at: HashMap<(String, String), Millis>,
}

impl Default for Schedule {
    fn default() -> Schedule {
        Schedule {
            known: BTreeSet::new(),
            known_read: tokio::time::Instant::now(),
            unknown: BTreeSet::new(),
            owed: 0.0,
            cursor: None,
            at: HashMap::new(),
        }
    }
}

impl Schedule {
    fn set(&mut self, store: (String, String), next: Option<Millis>) {
        match next {
            Some(t) => {
                self.at.insert(store, t);
            }
            None => {
                self.at.remove(&store);
            }
        }
    }

    /// The next stores the spread sweep owes, after the cursor and around.
    fn slice(&mut self) -> Vec<(String, String)> {
        let n = (self.owed.floor() as usize).min(self.known.len());
        self.owed -= n as f64;
        let mut out = Vec::with_capacity(n);
        let after = match &self.cursor {
            Some(c) => self.known.range((std::ops::Bound::Excluded(c.clone()), std::ops::Bound::Unbounded)),
            None => self.known.range::<(String, String), _>(..),
        };
        out.extend(after.take(n).cloned());
        if out.len() < n {
            out.extend(self.known.iter().take(n - out.len()).cloned());
        }
        if let Some(last) = out.last() {
            self.cursor = Some(last.clone());
        }
        out
    }

    /// The stores whose time has come (they stay scheduled until a look sets them again).
    fn due(&self, now: Millis) -> BTreeSet<(String, String)> {
        self.at.iter().filter(|(_, t)| **t <= now).map(|(s, _)| s.clone()).collect()
    }
}

/// Drives one push transport until shutdown.
///
/// With several broker nodes only the holder of the driver's lease pushes: a pass starts
/// only while the lease is held, its claimant session names the lease's fencing token
/// (`run:TOKEN`), and every send first checks that the lease is still held. A delivery in
/// flight under an older token is another run's (a node that died or stepped down): it is
/// asked about with [`PushTransport::query`] at once and sent again (same attempt, same
/// key) only when the receiver does not have it. One under a newer token belongs to the
/// node that took over, and is left alone.
pub struct PushDriver {
    lanes: Arc<LaneEngine>,
    transport: Arc<dyn PushTransport>,
    config: PushConfig,
    lease: Lease,
}

impl PushDriver {
    /// A driver that pushes whenever it runs (a broker alone, or a test); see
    /// [`PushDriver::with_lease`].
    pub fn new(lanes: Arc<LaneEngine>, transport: Arc<dyn PushTransport>, config: PushConfig) -> PushDriver {
        let lease = Lease::always(&format!("push:{}", transport.kind().as_str()));
        PushDriver { lanes, transport, config, lease }
    }

    /// Pushes only while this node holds `lease`, under its token.
    pub fn with_lease(mut self, lease: Lease) -> PushDriver {
        self.lease = lease;
        self
    }

    pub fn spawn(self) -> tokio::task::JoinHandle<()> {
        self.spawn_until(std::future::pending())
    }

    /// Runs until shutdown or until `stop` resolves.
    ///
    /// It looks only at the stores that may have work: those signalled since its last
    /// pass (a task committed, a result applied, a printer changed or back online, on this
    /// node or another), and those whose lanes have a deadline due; with each tick also a
    /// slice of all of them, so that every store is looked at once every `sweep_ms`. At
    /// start, when every store was signalled at once, after a failed pass and whenever the
    /// lease was not held, it looks at all of them at once.
    pub fn spawn_until(
        self,
        stop: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            tokio::pin!(stop);
            let mut tick = tokio::time::interval(Duration::from_millis(self.config.interval_ms));
            let signals = self.lanes.signals().clone();
            // Taken before the first sweep, so that nothing signalled after it is missed.
            let signalled = signals.signalled();
            let mut activity = signals.activity();
            let gap = Duration::from_millis(self.config.wake_gap_ms.max(1));
            let sweep_every = Duration::from_millis(self.config.sweep_ms.max(self.config.interval_ms));
            let mut last = tokio::time::Instant::now();
            let mut full = true;
            let mut schedule = Schedule::default();
            loop {
                let mut ticked = false;
                tokio::select! {
                    _ = tick.tick() => ticked = true,
                    changed = activity.changed() => {
                        if changed.is_ok() {
                            tokio::time::sleep_until(last + gap).await;
                        }
                    }
                    _ = signals.shutdown() => return,
                    _ = &mut stop => return,
                }
                let taken = signalled.take();
                let now = tokio::time::Instant::now();
                // Everything at once only at start, when every store was signalled, and
                // after a failure; otherwise the safety net is spread over `sweep_ms`, a
                // slice of the stores with each tick, so that no pass reads them all and
                // holds up a ticket committed meanwhile.
                let result = if taken.everyone || full {
                    full = false;
                    schedule.cursor = None;
                    last = now;
                    self.sweep(&mut schedule).await
                } else {
                    let mut stores: BTreeSet<(String, String)> = schedule.due(self.lanes.now());
                    if ticked {
                        let share = tick.period().as_secs_f64() / sweep_every.as_secs_f64();
                        schedule.owed += schedule.known.len() as f64 * share;
                        stores.extend(schedule.slice());
                    }
                    let (ours, unknown): (Vec<_>, Vec<_>) =
                        taken.stores.into_iter().partition(|s| schedule.known.contains(s));
                    stores.extend(ours);
                    schedule.unknown.extend(unknown);
                    // A store this driver did not know may have a printer of its kind now
                    // (set-up signals the printer's store), or the signal is another
                    // transport's: which stores are this transport's is read again (one
                    // query), at most once an interval, however many such signals come.
                    if !schedule.unknown.is_empty() && now >= schedule.known_read + tick.period() {
                        match self.stores().await {
                            Ok(known) => {
                                schedule.known = known;
                                schedule.known_read = now;
                                let unknown = std::mem::take(&mut schedule.unknown);
                                stores.extend(unknown.into_iter().filter(|s| schedule.known.contains(s)));
                            }
                            Err(e) => tracing::warn!(error = %e, "cannot read the push printers"),
                        }
                    }
                    if stores.is_empty() {
                        continue;
                    }
                    last = now;
                    self.look_at(stores, &mut schedule).await
                };
                match result {
                    Ok(true) => {}
                    // Stepped down, or a store could not be read: everything at the next pass.
                    Ok(false) => full = true,
                    Err(e) => {
                        full = true;
                        tracing::warn!(error = %e, transport = self.transport.kind().as_str(), "push pass failed");
                    }
                }
            }
        })
    }

    /// One look at every lane of the transport's printers (nothing while another node
    /// holds the driver's lease).
    pub async fn pass(&self) -> Result<(), StoreError> {
        self.sweep(&mut Schedule::default()).await.map(|_| ())
    }

    /// The (tenant, store) pairs that have a printer of this transport.
    async fn stores(&self) -> Result<BTreeSet<(String, String)>, StoreError> {
        let printers = self.lanes.store().printers_by_transport(self.transport.kind().as_str()).await?;
        Ok(printers.into_iter().map(|p| (p.tenant_id, p.store_id)).collect())
    }

    /// Every store of the transport's printers; `Ok(false)` when the lease was not held.
    async fn sweep(&self, schedule: &mut Schedule) -> Result<bool, StoreError> {
        if self.lease.token().is_none() {
            return Ok(false);
        }
        schedule.known = self.stores().await?;
        schedule.known_read = tokio::time::Instant::now();
        schedule.unknown.clear();
        schedule.at.clear();
        let stores = schedule.known.clone();
        self.look_at(stores, schedule).await
    }

    /// Claims and sends what may go now in `stores`, and notes when each has to be looked
    /// at again; `Ok(false)` when the lease was not held (or lost on the way).
    async fn look_at(&self, stores: BTreeSet<(String, String)>, schedule: &mut Schedule) -> Result<bool, StoreError> {
        let Some(token) = self.lease.token() else { return Ok(false) };
        let claimant = Claimant::push_run(self.transport.kind().as_str(), token);
        let kind = self.transport.kind();
        let rules = ClaimRules {
            max: 256,
            answer_within_ms: self.config.recheck_after_ms,
            give_up_after_ms: Some(self.config.doubt_after_ms),
            fetched_on_hand_out: false,
        };
        let reachable = |p: &PrinterInfo| self.transport.reachable(p);
        for (tenant, store) in stores {
            let scope = Scope::Reachable { store_id: &store, kind, reachable: &reachable };
            if !self.lease.is_held() {
                return Ok(false);
            }
            let claimed = match self.lanes.claim(&claimant, &tenant, scope, rules).await {
                Ok(c) => c,
                Err(crate::DeliveryError::Store(e)) => return Err(e),
            };
            // What was handed out now is asked about at its deadline, unless its result
            // (a signal) comes first.
            let mut next = claimed.next_look;
            if !claimed.deliveries.is_empty() {
                let deadline = self.lanes.now() + self.config.recheck_after_ms;
                next = Some(next.map_or(deadline, |n| n.min(deadline)));
            }
            schedule.set((tenant, store), next);
            for d in claimed.deliveries {
                if !self.lease.is_held() {
                    // Stepped down meanwhile: what was claimed stays `sent` under this
                    // token, and the next holder asks the receiver about it first.
                    return Ok(false);
                }
                self.deliver(&d, &claimant).await?;
            }
        }
        Ok(true)
    }

    async fn deliver(&self, d: &Delivery, claimant: &Claimant) -> Result<(), StoreError> {
        if d.again.is_some() {
            match self.transport.query(d).await {
                Asked::Done { outcome, proof, detail } => {
                    return self.report(d, claimant, outcome, proof, detail).await
                }
                Asked::Pending => {
                    tracing::debug!(task_id = %d.task.task_id, "the receiver has it, not printed yet");
                    return Ok(());
                }
                Asked::Unknown => {}
            }
        }
        match self.transport.send(d).await {
            Sent::Accepted => {
                tracing::info!(task_id = %d.task.task_id, attempt = d.attempt, "accepted by the receiver (not printed yet)");
                Ok(())
            }
            Sent::Failed { outcome, proof, detail } => self.report(d, claimant, outcome, proof, detail).await,
            Sent::NotNow { detail } => {
                tracing::warn!(task_id = %d.task.task_id, attempt = d.attempt, %detail, "not known whether the receiver got it; asked again later");
                Ok(())
            }
        }
    }

    async fn report(
        &self,
        d: &Delivery,
        claimant: &Claimant,
        outcome: Outcome,
        proof: Proof,
        detail: String,
    ) -> Result<(), StoreError> {
        let who = AgentIdentity { tenant_id: d.task.tenant_id.clone(), store_id: d.task.store_id.clone() };
        let ack = AckIn { task_id: d.task.task_id.clone(), attempt: d.attempt, outcome, detail, proof };
        match self.lanes.ack(&who, claimant, vec![ack]).await {
            Ok(_) => Ok(()),
            Err(crate::DeliveryError::Store(e)) => Err(e),
        }
    }
}
