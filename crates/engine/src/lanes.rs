//! The lane engine: the one mechanism every transport delivers through.
//!
//! A printer's lane is its active tasks; at most one is in flight (`sent`, a unique index
//! in the database), the others wait in (priority, seq) order, `seq` being the order in
//! which the database inserted them. Three operations:
//!
//! - [`LaneEngine::claim`] hands out what may go now, for a set of printers, to a claimant
//!   (an agent session polling for its store, the push driver of a transport). A lane's
//!   next step is decided by `onceprint_core::lane::next_step` from the pair (task in
//!   flight, first waiting task): the in-flight task is always looked at, whatever its
//!   priority, so it is offered again to a restarted claimant or settled as in doubt when
//!   its claimant went away, and the lane can never stall behind it.
//! - [`LaneEngine::ack`] applies what a claimant reports, with `onceprint_core::ack::decide`
//!   as a compare-and-set on (state, attempt). Acks of one task in one batch are applied in
//!   order, each against the state the previous one left. A failover commits in the
//!   same transaction as the failure that causes it.
//! - [`LaneEngine::sweep_once`] settles deliveries whose agent went away while another
//!   serves the store; the watchdog (`crate::watchdog`) reports lanes without progress.
//!
//! Offering a task to an agent again is a new attempt: the attempt number is the fencing
//! token, so an answer from an earlier process about the earlier attempt can no longer
//! move the task (a late `printed` still closes it: paper did come out). A push driver
//! re-sends the same attempt (its receiver prints once per idempotency key), and a push
//! delivery nobody answers goes to a person after `push_doubt_after_ms` instead of being
//! asked about for ever.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

mod paused;
pub use paused::PausedReport;

use onceprint_core::ack::{decide, Ack, AckChange, AckDecision, AckTask, Outcome};
use onceprint_core::lane::{next_step, Holder, InFlight, Reoffer, Step, Waiting};
use onceprint_core::{delivery_key, Millis, PolicyTable, Proof, TaskState};
use onceprint_store::{
    AgentIdentity, Lane, ManualChange, PrinterStatusUpdate, Store, StoreError, Task, TaskContent, Transition,
};
use rand::Rng;

use crate::claimant::{AgentRegistry, Claimant, ClaimantKind};
use crate::clock::Clock;
use crate::directory::PrinterInfo;
use crate::transport::{Encoding, TransportKind};
use crate::{Directory, RecentTasks, Shared, StoreSignals};

/// Tuning of delivery.
#[derive(Debug, Clone)]
pub struct DeliveryConfig {
    /// A delivery not acknowledged after this long is offered again to its claimant (an
    /// agent answers from its journal, a push driver asks the status URL or re-sends).
    pub redeliver_after_ms: i64,
    /// An agent that has not been heard of (poll or ack) for this long is gone.
    pub agent_gone_after_ms: i64,
    /// An earlier process of an agent id that has been quiet this long has stopped; its
    /// deliveries go to the newer process (see `crate::claimant::RegistryConfig`).
    pub takeover_quiet_ms: i64,
    /// How often the sweeper looks for overdue deliveries.
    pub sweep_interval_ms: u64,
    /// Waiting polls re-check the database at least this often even without a signal.
    /// Every change that can give a poll work signals its store (on this node, and over
    /// the node link on the others), and a poll also wakes at the earliest time one of its
    /// lanes may move, so this only bounds the wait after a signal that was lost. It is a
    /// read per waiting poll: at one second, 10,000 idle agents were 10,000 reads a second.
    pub recheck_ms: u64,
    /// The line printed at the top of a reprint; `{n}` is the reprint number.
    pub reprint_banner: String,
    /// The line printed at the top of another attempt of a ticket whose earlier attempt
    /// may have printed (the print type reprints on doubt): the copy is marked as one.
    pub doubt_reprint_banner: String,
    /// A lane with work and no progress for this long is `printer.stalled`.
    pub stall_after_ms: i64,
    /// A station's printer paused by its own state (no paper, cover open, paper jam,
    /// offline) for this long hands its station tickets to the station's next printer
    /// (README, "Failover"); shorter pauses wait, like any lane.
    pub station_failover_after_ms: i64,
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        DeliveryConfig {
            redeliver_after_ms: 30_000,
            agent_gone_after_ms: 60_000,
            takeover_quiet_ms: 3_000,
            sweep_interval_ms: 1_000,
            recheck_ms: 30_000,
            reprint_banner: "*** REPRINT {n} ***".into(),
            doubt_reprint_banner: "*** REPRINT (MAY BE A COPY) ***".into(),
            stall_after_ms: 120_000,
            station_failover_after_ms: 30_000,
        }
    }
}

/// One job handed to a claimant.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The task as it is now: `sent`, to this claimant.
    pub task: Task,
    pub attempt: i32,
    pub printer: Arc<PrinterInfo>,
    /// What the printer side prints once per (`onceprint_core::delivery_key`).
    pub idempotency_key: String,
    /// The bytes for the printer, in the transport's encoding.
    pub data: Vec<u8>,
    /// An earlier attempt may have printed and the print type reprints on doubt: the
    /// agent may print over its journal's record of an older attempt, and the copy
    /// carries the doubt reprint banner.
    pub reprint: bool,
    /// `Some` when the task was in flight at this claimant already and is offered again.
    pub again: Option<Reoffer>,
}

/// What a claim handed out.
#[derive(Debug, Default)]
pub struct Claimed {
    pub deliveries: Vec<Delivery>,
    /// When a lane that has to wait now may move (a retry time, a deadline, an earlier
    /// session becoming quiet): a long poll looks again then.
    pub next_look: Option<Millis>,
    /// Deliveries in flight at this claimant that this claim left with it, as read: a
    /// printer that polls is told again about the job it was offered and has not fetched
    /// (same attempt, no write), and must not be given another while it holds one.
    pub held: Vec<Task>,
}

/// How a claim hands out.
#[derive(Debug, Clone, Copy)]
pub struct ClaimRules {
    /// At most this many deliveries.
    pub max: usize,
    /// The claimant answers within this long, or the delivery is offered to it again.
    pub answer_within_ms: i64,
    /// A delivery this claimant holds and has not answered this long after it first went
    /// out is settled as in doubt instead of being offered again (push transports, whose
    /// receivers may never answer; `None` for agents, whose journal always answers).
    pub give_up_after_ms: Option<i64>,
    /// Handing out is fetching: the answer that hands a job to the claimant carries its
    /// data (Epson Server Direct Print), so the delivery may print from the moment it is
    /// handed out and is recorded as fetched in the same compare-and-set.
    pub fetched_on_hand_out: bool,
}

/// Which printers a claim is for.
#[derive(Clone, Copy)]
pub enum Scope<'a> {
    /// The printers of a store that use this transport kind.
    Store { store_id: &'a str, kind: TransportKind },
    /// The printers of a store that use this transport kind and that the claimant can
    /// reach now (a push driver whose receivers come and go: an MQTT printer that is
    /// switched off takes no new work, and its delivery in flight is neither given up nor
    /// sent again until it is back). The lanes of the others are not looked at.
    Reachable { store_id: &'a str, kind: TransportKind, reachable: &'a (dyn Fn(&PrinterInfo) -> bool + Sync) },
    /// One printer that polls for itself (CloudPRNT, Epson Server Direct Print), when it
    /// uses this transport kind; `store_id` is the printer's store, whose signals say
    /// whether a lane found empty may have work now.
    Printer { printer_id: &'a str, store_id: &'a str, kind: TransportKind },
}

/// How long a printer's lane, found empty, is taken to stay empty without being read again
/// while its store is not signalled: the safety net for a signal this node never heard
/// (another node's, lost on the way). The same bound as the directory's cache.
const EMPTY_LANE_TRUSTED_MS: Millis = 10_000;

/// A printer's lane found empty: when, and where its store's signals stood just before.
#[derive(Debug, Clone, Copy)]
struct EmptyLane {
    epoch: (u64, u64),
    at: Millis,
}

/// One ack as received: what the printer side said about the printer (`outcome`) and
/// what that proves about the attempt's paper (`proof`, from the vendor tables of
/// `onceprint_core::results`).
#[derive(Debug, Clone)]
pub struct AckIn {
    pub task_id: String,
    pub attempt: i32,
    pub outcome: Outcome,
    pub detail: String,
    pub proof: Proof,
}

impl AckIn {
    /// An ack of a store agent, whose outcomes say what they prove by the agent protocol
    /// ([`Proof::of_agent_outcome`]).
    pub fn agent(task_id: impl Into<String>, attempt: i32, outcome: Outcome, detail: impl Into<String>) -> AckIn {
        AckIn {
            task_id: task_id.into(),
            attempt,
            outcome,
            detail: detail.into(),
            proof: Proof::of_agent_outcome(outcome),
        }
    }
}

/// What an ack may hand out in the same write ([`LaneEngine::ack_and_hand_out`]): the next
/// task of each lane it frees, to the acknowledging claimant, for printers of transport
/// `kind`, under `rules` (`rules.max` bounds the deliveries).
#[derive(Debug, Clone, Copy)]
pub struct HandOutNext {
    pub kind: TransportKind,
    pub rules: ClaimRules,
}

/// The answer to acks: one result per ack, in order, and the deliveries handed out with
/// them (none without [`HandOutNext`]).
#[derive(Debug, Default)]
pub struct Acked {
    pub results: Vec<AckResult>,
    pub deliveries: Vec<Delivery>,
}

/// The result of one ack (docs/API.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckResult {
    Applied,
    Duplicate,
    Stale,
}

impl AckResult {
    pub fn as_str(self) -> &'static str {
        match self {
            AckResult::Applied => "applied",
            AckResult::Duplicate => "duplicate",
            AckResult::Stale => "stale",
        }
    }
}

/// Failures of delivery operations.
#[derive(Debug, thiserror::Error)]
pub enum DeliveryError {
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What the sweeper did in one pass (for logs and tests).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SweepReport {
    pub overdue: usize,
    pub in_doubt: usize,
    pub retrying: usize,
}

/// The lane engine. Share it behind an `Arc`.
pub struct LaneEngine {
    store: Arc<dyn Store>,
    directory: Arc<Directory>,
    gate: Arc<RecentTasks>,
    signals: Arc<StoreSignals>,
    policies: PolicyTable,
    config: DeliveryConfig,
    clock: Arc<dyn Clock>,
    agents: Arc<AgentRegistry>,
    /// Lanes of printers that poll for themselves found empty on this node, by (tenant,
    /// printer): an idle poll is answered from here without reading the database
    /// ([`StoreSignals::epoch`]).
    empty_lanes: Mutex<HashMap<(String, String), EmptyLane>>,
}

/// A change the engine makes to a lane on a claim, with what it is for.
enum LaneChange {
    HandOut { task: Box<Task>, printer: Arc<PrinterInfo>, again: Option<Reoffer> },
    Settle,
}

/// What a claim decided, lane by lane, before it writes.
#[derive(Default)]
struct ClaimPlan {
    /// What could be handed out, keyed by (priority, id) (see `LaneEngine::most_urgent`).
    offers: Vec<((i32, String), Transition, LaneChange)>,
    /// Deliveries settled as in doubt.
    changes: Vec<(Transition, LaneChange)>,
    /// Deliveries left with a printer that polls, as read (see [`Claimed::held`]).
    held: Vec<Task>,
    next_look: Option<Millis>,
}

impl ClaimPlan {
    fn look_at(&mut self, t: Option<Millis>) {
        if let Some(t) = t {
            self.next_look = Some(self.next_look.map_or(t, |n| n.min(t)));
        }
    }
}

/// A task's state as acks of one batch see it, one after the other.
#[derive(Clone)]
struct View {
    task: Task,
}

/// One decided ack, waiting to be applied.
struct Decided {
    index: usize,
    transition: Transition,
    /// The failover this failure causes: applied with it, in one transaction.
    failover: Option<ManualChange>,
    /// This change leaves a station task failed with nothing printed by any attempt.
    allows_failover: bool,
    outcome: Outcome,
    detail: String,
    printer_id: String,
}

impl LaneEngine {
    pub fn new(
        shared: Shared,
        config: DeliveryConfig,
        clock: Arc<dyn Clock>,
        agents: Arc<AgentRegistry>,
    ) -> LaneEngine {
        let Shared { store, directory, gate, signals, policies } = shared;
        LaneEngine { store, directory, gate, signals, policies, config, clock, agents, empty_lanes: Mutex::default() }
    }

    pub fn signals(&self) -> &Arc<StoreSignals> {
        &self.signals
    }

    pub fn agents(&self) -> &Arc<AgentRegistry> {
        &self.agents
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub fn directory(&self) -> &Arc<Directory> {
        &self.directory
    }

    pub fn config(&self) -> &DeliveryConfig {
        &self.config
    }

    pub fn now(&self) -> Millis {
        self.clock.now_ms()
    }

    pub fn policies(&self) -> &PolicyTable {
        &self.policies
    }

    fn jitter() -> f64 {
        rand::thread_rng().gen()
    }

    /// Who holds `task` (in flight), as seen by `asker` (`None`: the sweeper).
    fn holder(&self, task: &Task, printer: &PrinterInfo, asker: Option<&Claimant>) -> Holder {
        let Some(sent_to) = task.sent_to.as_deref() else {
            // A task in flight with no claimant recorded cannot be answered by anyone.
            return Holder::Other { gone: true };
        };
        // The common case, a busy lane held by the very session that asks, needs no look at
        // the registry.
        if let Some(a) = asker {
            if a.session == task.sent_session && sent_to.strip_prefix("agent:").is_some_and(|id| id == a.id) {
                return Holder::Me;
            }
        }
        let (kind, id) = Claimant::holder_of(sent_to);
        match kind {
            ClaimantKind::Agent => {
                let asker = asker.map(|a| match a.kind {
                    ClaimantKind::Agent => (a.id.as_str(), a.session.as_deref()),
                    // A push driver or a printer asking about an agent's delivery: the
                    // printer moved to another transport; the agent is "another claimant".
                    ClaimantKind::Push | ClaimantKind::Printer => ("", None),
                });
                let holder =
                    self.agents.holder(&task.tenant_id, &task.store_id, id, task.sent_session.as_deref(), asker);
                // With several nodes another node may have handed the delivery out moments
                // ago to an agent this node has not heard of since (a new agent, or one back
                // after an outage): this registry learns of that hearing only at the next
                // sync. The hand-out is itself a hearing, and the task keeps its time (every
                // hand-out moves `updated_at`), so the holder cannot be gone before that is
                // older than the gone time and the sync's lag.
                let registry = self.agents.config();
                let handed_out_lately = self.now() - task.updated_at <= registry.gone_after_ms + registry.remote_lag_ms;
                if registry.remote_lag_ms > 0 && holder == (Holder::Other { gone: true }) && handed_out_lately {
                    return Holder::Other { gone: false };
                }
                holder
            }
            ClaimantKind::Push => match asker {
                Some(a) if a.kind == ClaimantKind::Push && a.id == id => {
                    // The lease token in the sessions says whose run it is: this driver's
                    // own, an earlier run's (a node that died or stepped down; asked about
                    // before anything is sent again), or a later run's (another node took
                    // the lease over; this driver is stale and leaves it alone).
                    let mine = Claimant::run_token(a.session.as_deref());
                    let theirs = Claimant::run_token(task.sent_session.as_deref());
                    match (mine, theirs) {
                        (Some(m), Some(t)) if t > m => Holder::Other { gone: false },
                        (Some(m), Some(t)) if t < m => Holder::EarlierSession { quiet: true },
                        (Some(_), None) => Holder::EarlierSession { quiet: true },
                        _ => Holder::Me,
                    }
                }
                // The driver answers for itself while the printer still uses its
                // transport; once the printer moved to another one, nobody will ask about
                // the delivery again.
                _ => Holder::Other { gone: printer.transport.as_ref().map(|t| t.kind().as_str()) != Some(id) },
            },
            // A printer that polls holds only its own lane's delivery, so the same
            // transport kind asking is that printer. Once the printer uses another
            // transport, it will never answer through this one again.
            ClaimantKind::Printer => match asker {
                Some(a) if a.kind == ClaimantKind::Printer && a.id == id => Holder::Me,
                _ => Holder::Other { gone: printer.transport.as_ref().map(|t| t.kind().as_str()) != Some(id) },
            },
        }
    }

    /// Hands out what may go now to `claimant`, at most `max` deliveries.
    pub async fn claim(
        &self,
        claimant: &Claimant,
        tenant_id: &str,
        scope: Scope<'_>,
        rules: ClaimRules,
    ) -> Result<Claimed, DeliveryError> {
        let now = self.now();
        let mut reachable: Option<&(dyn Fn(&PrinterInfo) -> bool + Sync)> = None;
        let (lanes, kind) = match scope {
            Scope::Store { store_id, kind } => (self.store.lanes(tenant_id, store_id, kind.as_str()).await?, kind),
            Scope::Reachable { store_id, kind, reachable: r } => {
                reachable = Some(r);
                (self.store.lanes(tenant_id, store_id, kind.as_str()).await?, kind)
            }
            Scope::Printer { printer_id, store_id, kind } => {
                // Taken before the lane is read: a write that gives the lane work after
                // this read signals the store after its commit, and so moves the epoch.
                let epoch = self.signals.epoch(tenant_id, store_id);
                let key = (tenant_id.to_owned(), printer_id.to_owned());
                let known_empty = self
                    .empty_lanes
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get(&key)
                    .is_some_and(|e| e.epoch == epoch && now - e.at < EMPTY_LANE_TRUSTED_MS && now >= e.at);
                if known_empty {
                    return Ok(Claimed::default());
                }
                let lane = self.store.lane(tenant_id, printer_id).await?;
                let busy = lane.in_flight.is_some() || lane.waiting.is_some();
                let mut empty = self.empty_lanes.lock().unwrap_or_else(PoisonError::into_inner);
                if busy {
                    empty.remove(&key);
                } else {
                    empty.insert(key, EmptyLane { epoch, at: now });
                }
                drop(empty);
                (if busy { vec![lane] } else { Vec::new() }, kind)
            }
        };
        // The store whose waiting claimants hear of a settled delivery.
        let mut store_of_lanes: Option<String> = None;
        let mut plan = ClaimPlan::default();
        // The agent that takes the store's LAN orders, if one does: only it prints the
        // store's tickets, and the others stand by (`offline::lan_listener_lease`).
        let listener = match scope {
            Scope::Store { store_id, kind: TransportKind::Agent }
            | Scope::Reachable { store_id, kind: TransportKind::Agent, .. } => {
                self.directory.lan_listener(tenant_id, store_id).await?
            }
            _ => None,
        };
        for Lane { printer_id, in_flight, waiting } in lanes {
            let Some(printer) = self.directory.printer_info(tenant_id, &printer_id).await? else { continue };
            store_of_lanes.get_or_insert_with(|| printer.row.store_id.clone());
            if !Self::serves(&printer, kind, reachable) {
                if reachable.is_some() && Self::serves(&printer, kind, None) {
                    self.plan_give_up(&mut plan, claimant, &printer, in_flight.as_ref(), &rules, now);
                }
                continue;
            }
            self.plan_lane(&mut plan, claimant, printer, in_flight, waiting, &rules, now, listener.as_deref());
        }
        let ClaimPlan { mut changes, offers, held, mut next_look } = plan;
        changes.extend(Self::most_urgent(offers, rules.max, now, &mut next_look));
        if changes.is_empty() {
            return Ok(Claimed { deliveries: Vec::new(), next_look, held });
        }
        let transitions: Vec<Transition> = changes.iter().map(|(t, _)| t.clone()).collect();
        let applied = self.store.apply_transitions(&transitions).await?;
        let (deliveries, settled) = self.hand_over(changes, applied, &mut HashMap::new(), now).await?;
        if let (true, Some(store_id)) = (settled, store_of_lanes) {
            self.signals.notify(tenant_id, &store_id);
        }
        Ok(Claimed { deliveries, next_look, held })
    }

    /// Whether a claim of transport `kind` (and, for a push driver, of the printers it can
    /// reach now) takes `printer`'s lane.
    fn serves(
        printer: &PrinterInfo,
        kind: TransportKind,
        reachable: Option<&(dyn Fn(&PrinterInfo) -> bool + Sync)>,
    ) -> bool {
        // Another transport's lane: a delivery of it that this claimant holds (the printer
        // moved to another transport while it was in flight) is still answered through
        // `ack`. Out of a push driver's reach now, the lane waits as it is. A disabled
        // printer's lane goes to nobody: its waiting tasks wait, and its task in flight is
        // neither offered again nor settled here (it may be printing); an ack for it still
        // applies through `ack`.
        printer.transport.as_ref().map(|t| t.kind()) == Some(kind)
            && reachable.is_none_or(|r| r(printer))
            && printer.row.enabled
    }

    /// A printer a push driver cannot reach now (an MQTT printer switched off): its
    /// delivery in flight is neither sent again nor asked about, but one nobody answered
    /// within `give_up_after_ms` of going out still goes to a person, so that the lane
    /// moves on by time and the tickets behind it can fail over.
    fn plan_give_up(
        &self,
        plan: &mut ClaimPlan,
        claimant: &Claimant,
        printer: &PrinterInfo,
        in_flight: Option<&Task>,
        rules: &ClaimRules,
        now: Millis,
    ) {
        let (Some(task), Some(limit)) = (in_flight, rules.give_up_after_ms) else { return };
        if self.holder(task, printer, Some(claimant)) != Holder::Me {
            return;
        }
        let give_up = task.sent_at.unwrap_or(task.updated_at) + limit;
        if give_up > now {
            plan.look_at(Some(give_up));
            return;
        }
        let detail = format!(
            "{} took it and nobody answered within {} s, while the printer cannot be reached",
            task.sent_to.as_deref().unwrap_or("the transport"),
            limit / 1000
        );
        if let Some(t) = self.doubt(task, claimant.actor(), detail, now) {
            plan.changes.push((t, LaneChange::Settle));
        }
    }

    /// Decides one lane for `claimant`: its task in flight (offered again, settled, or
    /// waited for) or its first waiting task (handed out, or waited for), into `plan`.
    #[allow(clippy::too_many_arguments)]
    fn plan_lane(
        &self,
        plan: &mut ClaimPlan,
        claimant: &Claimant,
        printer: Arc<PrinterInfo>,
        in_flight: Option<Task>,
        waiting: Option<Task>,
        rules: &ClaimRules,
        now: Millis,
        listener: Option<&str>,
    ) {
        let flight = in_flight.as_ref().map(|t| {
            let mut holder = self.holder(t, &printer, Some(claimant));
            // An agent that stands by (another takes the store's LAN orders) is handed
            // nothing, so a delivery it holds and has not answered by its deadline is
            // never offered to it again: it may have printed it, and nobody else may.
            // Past the deadline it goes to a person instead of holding the lane for ever.
            if let (Holder::Other { gone: false }, Some(l)) = (holder, listener) {
                let standing_by = t
                    .sent_to
                    .as_deref()
                    .map(Claimant::holder_of)
                    .is_some_and(|(kind, id)| kind == ClaimantKind::Agent && id != l);
                if standing_by && t.next_attempt_at.is_some_and(|d| d <= now) {
                    holder = Holder::Other { gone: true };
                }
            }
            let mut deadline = t.next_attempt_at;
            if let (Holder::Me, Some(limit)) = (holder, rules.give_up_after_ms) {
                // A delivery nobody answers is not asked about for ever.
                let give_up = t.sent_at.unwrap_or(t.updated_at) + limit;
                if give_up <= now {
                    holder = Holder::Other { gone: true };
                } else {
                    deadline = deadline.map(|d| d.min(give_up));
                }
            }
            InFlight { deadline, holder }
        });
        let wait = waiting.as_ref().map(|t| match t.state {
            TaskState::Retrying => Waiting::Retrying { due: t.next_attempt_at },
            _ => Waiting::Pending,
        });
        let mut step = next_step(flight.as_ref(), wait.as_ref(), now);
        if let (ClaimantKind::Printer, Some(f), Some(t)) = (claimant.kind, &flight, &in_flight) {
            if f.holder == Holder::Me {
                // A printer's own delivery is never handed out again by a write. Not
                // fetched yet, it is simply named again in the printer's next answer
                // (same attempt and token); fetched, it may have printed, so it waits
                // for the printer's answer until its deadline and then goes to a
                // person (through the ack rules, so reprint-on-doubt still applies).
                let fetched = t.sent_session.as_deref() == Some(crate::claimant::FETCHED);
                step = match t.next_attempt_at {
                    Some(d) if fetched && d <= now => Step::Doubt,
                    d if fetched => Step::Wait { until: d },
                    _ => Step::Wait { until: None },
                };
                if step != Step::Doubt {
                    plan.held.push(t.clone());
                }
            }
        }
        match step {
            Step::Claim => {
                let Some(task) = waiting else { return };
                plan.offers.push((
                    (task.priority, task.task_id.clone()),
                    self.hand_out(&task, claimant, task.attempts + 1, None, now + rules.answer_within_ms, rules),
                    LaneChange::HandOut { task: Box::new(task), printer, again: None },
                ));
            }
            Step::Reoffer(why) => {
                let Some(task) = in_flight else { return };
                // An agent gets a new attempt (the fencing token); a push driver sends
                // the same one again.
                let attempt = if claimant.kind == ClaimantKind::Agent { task.attempts + 1 } else { task.attempts };
                plan.offers.push((
                    (task.priority, task.task_id.clone()),
                    self.hand_out(&task, claimant, attempt, Some(why), now + rules.answer_within_ms, rules),
                    LaneChange::HandOut { task: Box::new(task), printer, again: Some(why) },
                ));
            }
            Step::Doubt => {
                let Some(task) = in_flight else { return };
                let detail = match flight.map(|f| f.holder) {
                    Some(Holder::Me) => format!(
                        "{} fetched it and did not confirm before its deadline",
                        task.sent_to.as_deref().unwrap_or("the printer")
                    ),
                    _ => gone_detail(&task),
                };
                if let Some(t) = self.doubt(&task, claimant.actor(), detail, now) {
                    plan.changes.push((t, LaneChange::Settle));
                }
                // The lane moves on at once.
                plan.look_at(Some(now));
            }
            Step::Wait { until } => {
                plan.look_at(until);
                if let (Some(f), Some(t)) = (&flight, &in_flight) {
                    if matches!(f.holder, Holder::EarlierSession { quiet: false }) {
                        if let Some((_, id)) = t.sent_to.as_deref().map(Claimant::holder_of) {
                            plan.look_at(self.agents.quiet_at(
                                &t.tenant_id,
                                &t.store_id,
                                id,
                                t.sent_session.as_deref(),
                            ));
                        }
                    }
                }
            }
        }
    }

    /// What could be handed out, the most urgent and oldest first across printers (keyed
    /// by (priority, id)), at most `max`: when there is more than the claimant can take,
    /// every lane keeps moving rather than the first printers in id order.
    fn most_urgent(
        mut offers: Vec<((i32, String), Transition, LaneChange)>,
        max: usize,
        now: Millis,
        next_look: &mut Option<Millis>,
    ) -> impl Iterator<Item = (Transition, LaneChange)> {
        offers.sort_by(|a, b| a.0.cmp(&b.0));
        if offers.len() > max {
            offers.truncate(max);
            // More could go at once; the claimant asks again when it has room.
            *next_look = Some(next_look.map_or(now, |n| n.min(now)));
        }
        offers.into_iter().map(|(_, t, c)| (t, c))
    }

    /// After the write: the deliveries of the hand-outs that applied, with their content
    /// (one read for all) rendered for their printers, and whether any lane was settled (a
    /// delivery in doubt, content that cannot be rendered) so that its claimants may look
    /// again.
    async fn hand_over(
        &self,
        changes: Vec<(Transition, LaneChange)>,
        applied: Vec<bool>,
        contents: &mut HashMap<String, TaskContent>,
        now: Millis,
    ) -> Result<(Vec<Delivery>, bool), DeliveryError> {
        let ids: Vec<String> = changes
            .iter()
            .zip(&applied)
            .filter(|((_, c), ok)| **ok && matches!(c, LaneChange::HandOut { .. }))
            .map(|((t, _), _)| t.task_id.clone())
            .filter(|id| !contents.contains_key(id))
            .collect();
        // One read for the content of everything handed out in this look that the caller
        // has not read already (an ack's hand-outs come with their content; a task's
        // content never changes, so reading it before the claim is as good as after).
        if !ids.is_empty() {
            contents.extend(self.store.task_contents(&ids).await?);
        }
        let mut deliveries = Vec::with_capacity(ids.len());
        let mut settled = false;
        for ((t, change), ok) in changes.into_iter().zip(applied) {
            if !ok {
                continue; // someone else moved it first; the next look sees the new state
            }
            self.gate.set_state(&t.task_id, t.to);
            match change {
                LaneChange::Settle => {
                    settled = true;
                    tracing::warn!(task_id = %t.task_id, to = %t.to, reason = %t.reason, "delivery settled as in doubt");
                }
                LaneChange::HandOut { task, printer, again } => {
                    let Some(content) = contents.remove(&task.task_id) else { continue };
                    let sent = Task {
                        state: TaskState::Sent,
                        attempts: t.attempts,
                        next_attempt_at: t.next_attempt_at,
                        sent_to: t.sent_to.clone(),
                        sent_session: t.sent_session.clone(),
                        sent_at: if task.state == TaskState::Sent { task.sent_at } else { Some(now) },
                        ..(*task).clone()
                    };
                    match self.render(&sent, content, &printer) {
                        Ok(data) => deliveries.push(Delivery {
                            idempotency_key: delivery_key(
                                &sent.biz_no,
                                &sent.printer_id,
                                &sent.target,
                                &sent.print_type,
                            ),
                            attempt: t.attempts,
                            reprint: task.may_have_printed,
                            task: sent,
                            printer,
                            data,
                            again,
                        }),
                        Err(why) => {
                            settled = true;
                            self.fail_unrenderable(&sent, &why).await?;
                        }
                    }
                }
            }
        }
        Ok((deliveries, settled))
    }

    /// The transition that hands `task` to `claimant` as `attempt`.
    fn hand_out(
        &self,
        task: &Task,
        claimant: &Claimant,
        attempt: i32,
        again: Option<Reoffer>,
        deadline: Millis,
        rules: &ClaimRules,
    ) -> Transition {
        let now = self.now();
        let to = claimant.sent_to();
        let fetched = if rules.fetched_on_hand_out { " with its data (fetched)" } else { "" };
        let reason = match (task.state, again) {
            (TaskState::Pending, _) => format!("dispatched to {to}{fetched}"),
            (TaskState::Retrying, _) => format!("attempt {attempt} dispatched to {to}{fetched}"),
            (_, Some(Reoffer::Restarted)) => {
                format!("attempt {attempt}: offered again to {to}: its earlier process stopped before answering")
            }
            (_, _) if attempt == task.attempts => {
                format!("attempt {attempt} sent again to {to}: no answer before the deadline")
            }
            (_, _) => format!("attempt {attempt}: offered again to {to}: no answer before the deadline"),
        };
        Transition {
            task_id: task.task_id.clone(),
            from: task.state,
            expected_attempts: task.attempts,
            to: TaskState::Sent,
            attempts: attempt,
            last_error: task.last_error.clone(),
            next_attempt_at: Some(deadline),
            actor: claimant.actor(),
            reason,
            now,
            sent_to: Some(to),
            sent_session: if rules.fetched_on_hand_out {
                Some(crate::claimant::FETCHED.into())
            } else {
                claimant.session.clone()
            },
            // As for a fetch: how the attempt ends records whether it may have printed.
            may_have_printed: false,
            event: None,
            refused: false,
        }
    }

    /// Records durably that the printer `claimant` fetched the data of `task`'s attempt
    /// `attempt` (CloudPRNT's job GET), before the data is handed over: a job that was
    /// fetched may have printed, so it is never offered again and ends with the printer's
    /// answer or, after `answer_within_ms`, in doubt. A compare-and-set `sent → sent` on
    /// the same attempt to the session `fetched`, audited with `what` ("image/png").
    ///
    /// `true` when the delivery is (now, or already was) fetched by this claimant at this
    /// attempt; `false` when the task is not in flight at it with that attempt any more.
    pub async fn mark_fetched(
        &self,
        claimant: &Claimant,
        task: &Task,
        attempt: i32,
        what: &str,
        answer_within_ms: i64,
    ) -> Result<bool, DeliveryError> {
        let ours = task.state == TaskState::Sent
            && task.attempts == attempt
            && task.sent_to.as_deref() == Some(claimant.sent_to().as_str());
        if !ours {
            return Ok(false);
        }
        if task.sent_session.as_deref() == Some(crate::claimant::FETCHED) {
            // A repeated GET: nothing new to remember.
            return Ok(true);
        }
        let now = self.now();
        let change = Transition {
            task_id: task.task_id.clone(),
            from: TaskState::Sent,
            expected_attempts: attempt,
            to: TaskState::Sent,
            attempts: attempt,
            last_error: task.last_error.clone(),
            next_attempt_at: Some(now + answer_within_ms),
            actor: claimant.actor(),
            reason: format!("attempt {attempt} fetched by the printer as {what}: it may print from now on"),
            now,
            sent_to: task.sent_to.clone(),
            sent_session: Some(crate::claimant::FETCHED.into()),
            // The session says the data left; how the attempt ends (the printer's answer,
            // or a settlement in doubt) records whether it may have printed.
            may_have_printed: false,
            event: None,
            refused: false,
        };
        Ok(self.store.transition(&change).await?)
    }

    /// Writes `reason` to the audit trail of `task`, in flight, without changing it: a
    /// compare-and-set `sent → sent` on its attempt, holder and session. `false` when the
    /// task moved since it was read.
    pub async fn note_in_flight(&self, task: &Task, actor: String, reason: String) -> Result<bool, DeliveryError> {
        if task.state != TaskState::Sent {
            return Ok(false);
        }
        let now = self.now();
        let change = Transition {
            task_id: task.task_id.clone(),
            from: TaskState::Sent,
            expected_attempts: task.attempts,
            to: TaskState::Sent,
            attempts: task.attempts,
            last_error: task.last_error.clone(),
            next_attempt_at: task.next_attempt_at,
            actor,
            reason,
            now,
            sent_to: task.sent_to.clone(),
            sent_session: task.sent_session.clone(),
            may_have_printed: task.may_have_printed,
            event: None,
            refused: false,
        };
        Ok(self.store.transition(&change).await?)
    }

    /// Settles `task`, in flight at `claimant`, as in doubt because of what the broker saw
    /// (`detail`): the printer that fetched it polled again idle, or went silent. Through
    /// the ack rules like every doubt (so "reprint on doubt" stays bounded by the attempt
    /// limit), as a compare-and-set on the task as read; it says nothing about the printer
    /// itself, whose health its own transport records. `false` when the task moved since.
    pub async fn settle_in_doubt(
        &self,
        claimant: &Claimant,
        task: &Task,
        detail: String,
    ) -> Result<bool, DeliveryError> {
        self.settle(claimant, task, Outcome::InDoubt, Proof::MayHavePrinted, detail).await
    }

    /// Ends the attempt of `task` in flight at `claimant` with what the broker itself
    /// knows (`outcome`, proving `proof`), through the ack rules and as a compare-and-set
    /// on the task as read, without a report about the printer (its transport writes the
    /// printer's state). `false` when the task moved since.
    pub async fn settle(
        &self,
        claimant: &Claimant,
        task: &Task,
        outcome: Outcome,
        proof: Proof,
        detail: String,
    ) -> Result<bool, DeliveryError> {
        let now = self.now();
        let ack = Ack { attempt: task.attempts, outcome, detail, proof };
        let policy = self.policies.policy_for(&task.print_type);
        let change = match decide(&Self::ack_task(task), &ack, &policy, now, Self::jitter()) {
            AckDecision::Apply(c) => self.transition_for(task, &c, claimant.actor(), now),
            AckDecision::Duplicate | AckDecision::Stale => return Ok(false),
        };
        if !self.store.transition(&change).await? {
            return Ok(false);
        }
        self.gate.set_state(&change.task_id, change.to);
        tracing::warn!(task_id = %change.task_id, to = %change.to, reason = %change.reason, "delivery settled");
        // The lane is free (or a retry is scheduled): waiting claims may look again.
        self.signals.notify(&task.tenant_id, &task.store_id);
        Ok(true)
    }

    /// Settles a delivery that its holder can never answer, through the ack rules (so
    /// "reprint on doubt" is bounded by the attempt limit like any retry).
    fn doubt(&self, task: &Task, actor: String, detail: String, now: Millis) -> Option<Transition> {
        let ack = Ack { attempt: task.attempts, outcome: Outcome::InDoubt, detail, proof: Proof::MayHavePrinted };
        let policy = self.policies.policy_for(&task.print_type);
        match decide(&Self::ack_task(task), &ack, &policy, now, Self::jitter()) {
            AckDecision::Apply(c) => Some(self.transition_for(task, &c, actor, now)),
            AckDecision::Duplicate | AckDecision::Stale => None,
        }
    }

    fn transition_for(&self, task: &Task, c: &AckChange, actor: String, now: Millis) -> Transition {
        Transition {
            event: crate::alerts::task_event(task, c.to, c.last_error.as_deref(), &c.reason, now),
            task_id: task.task_id.clone(),
            from: c.from,
            expected_attempts: task.attempts,
            to: c.to,
            attempts: c.attempts,
            last_error: c.last_error.clone(),
            next_attempt_at: c.next_attempt_at,
            actor,
            reason: c.reason.clone(),
            now,
            sent_to: task.sent_to.clone(),
            sent_session: task.sent_session.clone(),
            may_have_printed: c.may_have_printed && c.to != TaskState::Printed,
            refused: c.refused,
        }
    }

    /// What [`decide`] needs of a task.
    fn ack_task(task: &Task) -> AckTask {
        AckTask { state: task.state, attempts: task.attempts, refusals: task.refusals, created_at: task.created_at }
    }

    /// A station task whose printer refused it with a pausing status waits like any other
    /// while the printer has been paused for less than the station threshold; past it, the
    /// refusal fails the task so that it fails over to the station's next printer (README,
    /// "Failover"). The pause counts from the printer row's `paused_since` (this refusal
    /// starts it when the row does not show a pause yet). Without a backup to move to, the
    /// task keeps waiting: failing it would only hand a paper change to a person.
    async fn station_threshold(&self, task: &Task, c: &mut AckChange, now: Millis) -> Result<(), DeliveryError> {
        // A task that may have printed never moves to another printer: it waits.
        if !c.refused || task.station_id.is_none() || task.may_have_printed {
            return Ok(());
        }
        let since = match self.store.get_printer(&task.tenant_id, &task.printer_id).await? {
            Some(p) if onceprint_store::pauses_lane(p.last_error.as_deref()) => p.paused_since.unwrap_or(now),
            _ => now,
        };
        let paused_ms = now - since;
        let threshold = match task.station_id.as_deref() {
            Some(id) => self.directory.station(&task.tenant_id, id).await?.and_then(|s| s.failover_after_ms),
            None => None,
        }
        .unwrap_or(self.config.station_failover_after_ms);
        if paused_ms < threshold {
            return Ok(());
        }
        if self.next_station_printer(task).await?.is_none() {
            return Ok(());
        }
        let why = c.last_error.clone().unwrap_or_default();
        c.to = TaskState::Failed;
        c.next_attempt_at = None;
        c.refused = false;
        c.reason = format!(
            "attempt {}: {why}; the printer has been paused for {} s, past the station's failover threshold ({} ms)",
            task.attempts,
            paused_ms / 1000,
            threshold
        );
        Ok(())
    }

    /// The bytes of `task` for `printer`, in its transport's encoding.
    fn render(&self, task: &Task, content: TaskContent, printer: &PrinterInfo) -> Result<Vec<u8>, String> {
        let encoding = printer.transport.as_ref().map(|t| t.encoding()).unwrap_or(Encoding::EscPos { profile: None });
        self.render_as(task, content, &encoding)
    }

    /// The bytes of `task` in `encoding` (a printer that asks for one of several media
    /// types, such as CloudPRNT's `text/plain`). A reprint carries a visible banner line at
    /// the top, whatever the transport; so does another attempt of a ticket whose earlier
    /// attempt may have printed (never delivered again unmarked). An attempt's own
    /// fetch does not count: `may_have_printed` is recorded when an attempt ends, so the
    /// same attempt renders the same bytes however often it is fetched.
    pub fn render_as(&self, task: &Task, content: TaskContent, encoding: &Encoding) -> Result<Vec<u8>, String> {
        // A reprint moved to another printer (a transfer, a failover) is still that
        // reprint: its successor keeps the number, and so the banner.
        let banner = match task.reprint_no {
            Some(n) => Some(self.config.reprint_banner.replace("{n}", &n.to_string())),
            None if task.may_have_printed => {
                Some(self.config.doubt_reprint_banner.replace("{n}", &task.attempts.to_string()))
            }
            _ => None,
        };
        match encoding.clone() {
            Encoding::EscPos { profile } => crate::content::render_for(
                &content.content_type,
                content.content,
                banner.as_deref(),
                profile.as_deref(),
            ),
            Encoding::Png { profile, dots } => crate::content::render_png_for(
                &content.content_type,
                &content.content,
                banner.as_deref(),
                profile.as_deref(),
                dots,
            ),
            Encoding::Text { .. } => {
                crate::content::render_text_for(&content.content_type, &content.content, banner.as_deref())
                    .map(String::into_bytes)
            }
            Encoding::EposXml { profile } => crate::content::render_epos_for(
                &content.content_type,
                &content.content,
                banner.as_deref(),
                profile.as_deref(),
            )
            .map(String::into_bytes),
        }
    }

    /// Content that cannot be rendered fails at once, for every transport: no attempt can
    /// ever print it.
    async fn fail_unrenderable(&self, task: &Task, why: &str) -> Result<(), DeliveryError> {
        let now = self.now();
        let change = Transition {
            task_id: task.task_id.clone(),
            from: TaskState::Sent,
            expected_attempts: task.attempts,
            to: TaskState::Failed,
            attempts: task.attempts,
            last_error: Some("unrenderable".into()),
            next_attempt_at: None,
            actor: "engine".into(),
            reason: format!("cannot render the content: {why}"),
            now,
            sent_to: task.sent_to.clone(),
            sent_session: task.sent_session.clone(),
            may_have_printed: false,
            event: crate::alerts::task_event(task, TaskState::Failed, Some("unrenderable"), why, now),
            refused: false,
        };
        if self.store.transition(&change).await? {
            self.gate.set_state(&task.task_id, TaskState::Failed);
            tracing::warn!(task_id = %task.task_id, %why, "content cannot be rendered; failed");
        }
        Ok(())
    }

    /// Applies acks from `claimant` for tasks of `who`'s store. Acks for tasks of other
    /// stores or unknown tasks are `stale`: they change nothing. Acks of one task are
    /// applied in the order given, each against the state the previous one left.
    pub async fn ack(
        &self,
        who: &AgentIdentity,
        claimant: &Claimant,
        acks: Vec<AckIn>,
    ) -> Result<Vec<AckResult>, DeliveryError> {
        Ok(self.ack_and_hand_out(who, claimant, acks, None).await?.results)
    }

    /// [`LaneEngine::ack`], and with `next` the next task of every lane that an applied ack
    /// frees (its task in flight leaves the lane: printed, failed, in doubt) handed out to
    /// `claimant` in the same write: the claimant's next job comes with the answer to its
    /// acks instead of after another poll, and the ack, the hand-out and the printer's
    /// report are one commit. The hand-out is the claim's (`plan_lane` on the lane's head,
    /// a compare-and-set, the one-in-flight index), so it applies only if the lane is free
    /// once the ack applied, and the most urgent go first when more lanes free up than
    /// `next.rules.max`. Only for a batch that acknowledges each task once, the everyday
    /// case; lanes it does not fill are left to the claimants' polls, which are woken.
    pub async fn ack_and_hand_out(
        &self,
        who: &AgentIdentity,
        claimant: &Claimant,
        acks: Vec<AckIn>,
        next: Option<HandOutNext>,
    ) -> Result<Acked, DeliveryError> {
        let mut results = vec![AckResult::Stale; acks.len()];
        let mut deliveries = Vec::new();
        // The printers whose lanes an applied change may have freed, and those that this
        // answer filled again: the store's polls need to look only when one is not filled.
        let mut touched: std::collections::HashSet<String> = std::collections::HashSet::new();
        let mut filled: std::collections::HashSet<String> = std::collections::HashSet::new();
        let mut settled = false;
        // Printer reports of acks applied through a failover chain, written at the end.
        let mut chain_reports: Vec<PrinterStatusUpdate> = Vec::new();
        let mut pending: Vec<usize> = (0..acks.len()).collect();
        // The content of the lane heads read with the acked tasks, for their hand-out.
        let mut contents: HashMap<String, TaskContent> = HashMap::new();
        // A change that loses its compare-and-set (another actor moved the task between
        // the read and the write) is decided again on a fresh read, a few times at most.
        for round in 0..3 {
            if pending.is_empty() {
                break;
            }
            let now = self.now();
            let mut ids: Vec<String> = pending.iter().map(|&i| acks[i].task_id.clone()).collect();
            ids.sort();
            ids.dedup();
            // The acked tasks and, on the first round of acks that ask for more, what each
            // lane hands out next once its task in flight ends, with its content: read
            // before the write so that the hand-out can go into it, in one read.
            let read = self.store.read_for_acks(&who.tenant_id, &ids, round == 0 && next.is_some()).await?;
            let mut views: HashMap<String, View> = read
                .tasks
                .into_iter()
                .filter(|t| t.store_id == who.store_id)
                .map(|t| (t.task_id.clone(), View { task: t }))
                .collect();
            let mut heads: HashMap<String, Task> = read.heads.into_iter().map(|t| (t.printer_id.clone(), t)).collect();
            contents.extend(read.contents);
            // Layer k holds the k-th change of every task, so that each layer has every
            // task at most once and layers apply one after the other.
            let mut layers: Vec<Vec<Decided>> = Vec::new();
            let mut depth: HashMap<String, usize> = HashMap::new();
            // Printers that reported a stop (no paper, cover open, jam) after a job may have
            // cut it short, unless they were stopped before the job was handed to them.
            let mut stops: HashMap<String, Option<Millis>> = HashMap::new();
            for &i in &pending {
                let a = &acks[i];
                let stop = matches!(a.outcome, Outcome::NoPaper | Outcome::CoverOpen | Outcome::PaperJam);
                if a.proof != Proof::MayHavePrinted || !stop {
                    continue;
                }
                let Some(view) = views.get(&a.task_id) else { continue };
                if !stops.contains_key(&view.task.printer_id) {
                    let row = self.store.get_printer(&who.tenant_id, &view.task.printer_id).await?;
                    let since = row
                        .filter(|p| onceprint_store::pauses_lane(p.last_error.as_deref()))
                        .and_then(|p| p.paused_since);
                    stops.insert(view.task.printer_id.clone(), since);
                }
            }
            for &i in &pending {
                let a = &acks[i];
                let Some(view) = views.get_mut(&a.task_id) else { continue };
                let task = &view.task;
                let policy = self.policies.policy_for(&task.print_type);
                let stopped_since = stops.get(&task.printer_id).copied().flatten();
                let proof = a.proof.given_stop_before_hand_out(a.outcome, stopped_since, task.sent_at);
                let ack = Ack { attempt: a.attempt, outcome: a.outcome, detail: a.detail.clone(), proof };
                let mut c = match decide(&Self::ack_task(task), &ack, &policy, now, Self::jitter()) {
                    AckDecision::Apply(c) => c,
                    AckDecision::Duplicate => {
                        results[i] = AckResult::Duplicate;
                        continue;
                    }
                    AckDecision::Stale => {
                        results[i] = AckResult::Stale;
                        continue;
                    }
                };
                self.station_threshold(task, &mut c, now).await?;
                let transition = self.transition_for(task, &c, claimant.actor(), now);
                let allows_failover = task.station_id.is_some() && c.allows_failover(task.may_have_printed);
                let d = depth.entry(a.task_id.clone()).or_insert(0);
                if layers.len() <= *d {
                    layers.push(Vec::new());
                }
                // The next ack of this task sees the state this one leaves.
                let after = Task {
                    state: c.to,
                    last_error: c.last_error.clone(),
                    next_attempt_at: c.next_attempt_at,
                    may_have_printed: task.may_have_printed || transition.may_have_printed,
                    refusals: task.refusals + i32::from(transition.refused),
                    ..task.clone()
                };
                layers[*d].push(Decided {
                    index: i,
                    transition,
                    failover: None,
                    allows_failover,
                    outcome: a.outcome,
                    detail: a.detail.clone(),
                    printer_id: task.printer_id.clone(),
                });
                *d += 1;
                view.task = after;
            }
            // A failover follows from where the batch leaves a task, not from one ack on
            // the way: `[no_paper(N), printed(N)]` ends `printed`, and nothing moves to a
            // backup printer. Only the task's last change in the batch can carry one.
            for (task_id, d) in &depth {
                let Some(last) =
                    layers.get_mut(d - 1).and_then(|l| l.iter_mut().find(|x| &x.transition.task_id == task_id))
                else {
                    continue;
                };
                if last.transition.to == TaskState::Failed && last.allows_failover {
                    if let Some(view) = views.get(task_id) {
                        let before = Task { state: last.transition.from, ..view.task.clone() };
                        last.failover = self.failover_change(&before, &last.transition, now).await?;
                    }
                }
            }
            // The hand-outs ride with the only layer of a batch that acknowledges each
            // task once: a lane whose task in flight that layer ends gets its head.
            let mut hand_outs: Vec<(Transition, LaneChange)> = Vec::new();
            if let (Some(n), [layer]) = (next, layers.as_slice()) {
                let mut plan = ClaimPlan::default();
                for d in layer {
                    let t = &d.transition;
                    if d.failover.is_some() || t.from != TaskState::Sent || t.to.in_lane() {
                        continue;
                    }
                    let Some(head) = heads.remove(&d.printer_id) else { continue };
                    let Some(printer) = self.directory.printer_info(&who.tenant_id, &d.printer_id).await? else {
                        continue;
                    };
                    if Self::serves(&printer, n.kind, None) {
                        self.plan_lane(&mut plan, claimant, printer, None, Some(head), &n.rules, now, None);
                    }
                }
                let mut unused = None;
                hand_outs.extend(Self::most_urgent(plan.offers, n.rules.max, now, &mut unused));
            }
            let mut retry: Vec<usize> = Vec::new();
            let mut lost: std::collections::HashSet<String> = std::collections::HashSet::new();
            for layer in layers {
                let (chains, plain): (Vec<Decided>, Vec<Decided>) = layer
                    .into_iter()
                    .filter(|d| {
                        if lost.contains(&d.transition.task_id) {
                            retry.push(d.index);
                            false
                        } else {
                            true
                        }
                    })
                    .partition(|d| d.failover.is_some());
                // What the printer said about itself goes with the change that tells it:
                // only acks that change a task count, a stale or repeated ack describes
                // the printer as it was.
                let reports: Vec<(usize, PrinterStatusUpdate)> = plain
                    .iter()
                    .enumerate()
                    .map(|(k, d)| {
                        (k, printer_status(&who.tenant_id, &d.printer_id, d.outcome, &d.detail, d.transition.now))
                    })
                    .collect();
                let offers = std::mem::take(&mut hand_outs);
                let mut list: Vec<Transition> = plain.iter().map(|d| d.transition.clone()).collect();
                list.extend(offers.iter().map(|(t, _)| t.clone()));
                let mut applied = if list.is_empty() {
                    Vec::new()
                } else {
                    self.store.apply_transitions_with_reports(&list, &reports).await?
                };
                let offered = applied.split_off(plain.len().min(applied.len()));
                let mut outcomes: Vec<(Decided, bool, bool)> =
                    plain.into_iter().zip(applied).map(|(d, ok)| (d, ok, false)).collect();
                for d in chains {
                    let ok = match &d.failover {
                        Some(m) => self.apply_failover(m).await?,
                        None => false,
                    };
                    outcomes.push((d, ok, true));
                }
                for (d, ok, chain) in outcomes {
                    if !ok {
                        lost.insert(d.transition.task_id.clone());
                        retry.push(d.index);
                        continue;
                    }
                    results[d.index] = AckResult::Applied;
                    touched.insert(d.printer_id.clone());
                    let t = &d.transition;
                    let to = if d.failover.is_some() { TaskState::Transferred } else { t.to };
                    self.gate.set_state(&t.task_id, to);
                    tracing::info!(task_id = %t.task_id, from = %t.from, to = %to, reason = %t.reason, "ack applied");
                    if chain {
                        chain_reports.push(printer_status(&who.tenant_id, &d.printer_id, d.outcome, &d.detail, t.now));
                    }
                }
                if !offers.is_empty() {
                    let (mut handed, s) = self.hand_over(offers, offered, &mut contents, now).await?;
                    settled |= s;
                    filled.extend(handed.iter().map(|d| d.task.printer_id.clone()));
                    deliveries.append(&mut handed);
                }
            }
            retry.sort_unstable();
            pending = retry;
        }
        if !chain_reports.is_empty() {
            self.store.update_printer_status(&chain_reports).await?;
        }
        // A lane may have freed up (or a retry was scheduled, or a printer that printed
        // again resumed its paused lane): let waiting polls look, unless every lane these
        // acks changed has its next job already.
        if settled || touched.iter().any(|p| !filled.contains(p)) {
            self.signals.notify(&who.tenant_id, &who.store_id);
        }
        Ok(Acked { results, deliveries })
    }

    /// The failover of a station task that is failing with `failed`: `failed` and
    /// `transferred` with the successor on the station's next printer, as one change.
    /// `None` when the station has no printer left (the task just fails).
    async fn failover_change(
        &self,
        task: &Task,
        failed: &Transition,
        now: Millis,
    ) -> Result<Option<ManualChange>, DeliveryError> {
        let Some(station_id) = task.station_id.clone() else { return Ok(None) };
        let Some(next) = self.next_station_printer(task).await? else {
            tracing::warn!(task_id = %task.task_id, station = %station_id, "failover: no backup printer left");
            return Ok(None);
        };
        let why = failed.last_error.clone().unwrap_or_default();
        let succ = self.failover_successor(task, &next, &why).await?;
        let moved = Transition {
            task_id: task.task_id.clone(),
            from: TaskState::Failed,
            expected_attempts: failed.attempts,
            to: TaskState::Transferred,
            attempts: failed.attempts,
            last_error: failed.last_error.clone(),
            next_attempt_at: None,
            actor: "engine".into(),
            reason: format!(
                "failover: {} could not print ({why}); continued on {next} as {}",
                task.printer_id, succ.task_id
            ),
            now,
            sent_to: task.sent_to.clone(),
            sent_session: task.sent_session.clone(),
            may_have_printed: false,
            event: None,
            refused: false,
        };
        Ok(Some(ManualChange {
            task_id: task.task_id.clone(),
            transitions: vec![failed.clone(), moved],
            refund: None,
            successor: Some(succ),
            now,
        }))
    }

    /// The task a station ticket fails over to on `next` (keyed `failover:ORIGIN`, not
    /// charged again), `why` naming what its printer said.
    async fn failover_successor(
        &self,
        task: &Task,
        next: &str,
        why: &str,
    ) -> Result<onceprint_store::NewTask, DeliveryError> {
        let spec = crate::operations::SuccessorSpec {
            kind: onceprint_store::OriginKind::Failover,
            printer_id: next,
            reprint_no: None,
            actor: "engine".into(),
            reason: format!("failover of {} from {} ({why}) to {next}", task.task_id, task.printer_id),
            priority: task.priority,
            charge: 0,
            now: self.now(),
        };
        Ok(crate::operations::successor(self.store.as_ref(), task, spec).await?)
    }

    /// The next printer of the task's station after its own that is not disabled: a
    /// disabled backup would only hold the ticket until someone enables it again.
    async fn next_station_printer(&self, task: &Task) -> Result<Option<String>, DeliveryError> {
        let Some(station_id) = task.station_id.as_deref() else { return Ok(None) };
        let Some(station) = self.directory.station(&task.tenant_id, station_id).await? else { return Ok(None) };
        let after = station.printers.iter().position(|p| *p == task.printer_id).map_or(0, |i| i + 1);
        for candidate in station.printers.iter().skip(after) {
            let enabled = self.directory.printer_info(&task.tenant_id, candidate).await?.is_some_and(|p| p.row.enabled);
            if enabled {
                return Ok(Some(candidate.clone()));
            }
        }
        Ok(None)
    }

    async fn apply_failover(&self, change: &ManualChange) -> Result<bool, DeliveryError> {
        let applied = self.store.apply_manual(change).await?;
        if applied {
            if let Some(succ) = &change.successor {
                self.signals.notify(&succ.tenant_id, &succ.store_id);
                tracing::warn!(task_id = %change.task_id, successor = %succ.task_id, printer = %succ.printer_id, "failover");
            }
        }
        Ok(applied)
    }

    /// One sweeper pass: a delivery past its deadline whose agent is gone while
    /// another agent now serves the store can never be answered, and nobody can know
    /// whether paper came out: it is settled as in doubt (or retried where the print type
    /// reprints on doubt, within its attempts). A delivery whose agent is still around is
    /// offered to it again on its next poll; one whose store has no agent at all waits
    /// for the agent to come back. Push deliveries are the push driver's. Never a blind
    /// resend to a different device.
    pub async fn sweep_once(&self) -> Result<SweepReport, DeliveryError> {
        let now = self.now();
        let overdue = self.store.due_tasks(TaskState::Sent, now, 500).await?;
        let mut report = SweepReport { overdue: overdue.len(), ..Default::default() };
        let mut changes = Vec::new();
        for task in overdue {
            let Some(sent_to) = task.sent_to.as_deref() else { continue };
            if Claimant::holder_of(sent_to).0 != ClaimantKind::Agent {
                continue;
            }
            let Some(printer) = self.directory.printer_info(&task.tenant_id, &task.printer_id).await? else {
                continue;
            };
            if self.holder(&task, &printer, None) != (Holder::Other { gone: true }) {
                continue;
            }
            if let Some(t) = self.doubt(&task, "sweeper".into(), gone_detail(&task), now) {
                changes.push(t);
            }
        }
        if !changes.is_empty() {
            let applied = self.store.apply_transitions(&changes).await?;
            for (t, ok) in changes.iter().zip(applied) {
                if ok {
                    self.gate.set_state(&t.task_id, t.to);
                    if t.to == TaskState::InDoubt {
                        report.in_doubt += 1;
                    } else {
                        report.retrying += 1;
                    }
                    tracing::warn!(task_id = %t.task_id, to = %t.to, reason = %t.reason, "sweeper");
                }
            }
        }
        Ok(report)
    }

    /// Runs the sweeper until shutdown, a pass only while this node holds `lease` (one
    /// sweeper per cluster).
    pub fn spawn_sweeper(self: &Arc<Self>, lease: crate::Lease) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(std::time::Duration::from_millis(this.config.sweep_interval_ms));
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        if !lease.is_held() {
                            continue;
                        }
                        if let Err(e) = this.sweep_once().await {
                            tracing::warn!(error = %e, "sweeper pass failed");
                        }
                        if let Err(e) = this.sweep_paused().await {
                            tracing::warn!(error = %e, "sweep of paused lanes failed");
                        }
                    }
                    _ = this.signals.shutdown() => return,
                }
            }
        })
    }
}

/// Why a delivery whose holder went away is in doubt.
fn gone_detail(task: &Task) -> String {
    let holder = task.sent_to.as_deref().unwrap_or("nobody");
    format!("{holder} went away without answering and cannot be asked again")
}

/// What an applied ack says about the printer itself, in the spellings `last_error` has
/// everywhere (transports that hear a printer's status report it through this too).
pub fn printer_status(
    tenant_id: &str,
    printer_id: &str,
    outcome: Outcome,
    detail: &str,
    now: Millis,
) -> PrinterStatusUpdate {
    let (online, last_error) = match outcome {
        Outcome::Printed => (true, None),
        Outcome::Offline => (false, Some("offline".to_owned())),
        Outcome::NoPaper | Outcome::CoverOpen | Outcome::PaperJam => (true, Some(outcome.as_str().to_owned())),
        Outcome::InDoubt | Outcome::Error => {
            (true, Some(format!("{}: {}", outcome.as_str(), detail).trim_end_matches(": ").to_owned()))
        }
    };
    PrinterStatusUpdate {
        tenant_id: tenant_id.to_owned(),
        printer_id: printer_id.to_owned(),
        online,
        last_error,
        now,
        event_id: crate::alerts::new_event_id(now),
    }
}
