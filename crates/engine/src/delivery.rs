//! Delivery, broker side: per-printer lanes handed to store agents by long poll, acks
//! applied with compare-and-set, and the sweeper for deliveries nobody answered (R9–R14,
//! R16–R24).
//!
//! A printer's lane is its active tasks (`pending`, `sent`, `retrying`) ordered by
//! (priority, id). Only the head may be in flight, and only one task per printer may be
//! `sent` — the database enforces that with a unique index, so two pollers (or two broker
//! nodes) can never hand out two tasks of one printer. A lane whose head waits for its
//! retry time waits as a whole: later tickets do not overtake it (R23). Lanes of other
//! printers are independent, so one dead printer never slows the others.
//!
//! The rules for what an ack does live in `onceprint_core::ack`; this module loads the
//! task, asks the rule, and applies the answer as a compare-and-set.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use onceprint_core::ack::{decide, Ack, AckDecision, Outcome};
use onceprint_core::{Millis, PolicyTable, TaskState};
use onceprint_store::{AgentIdentity, PrinterStatusUpdate, Store, StoreError, Task, Transition};
use rand::Rng;

use crate::clock::now_ms;
use crate::signals::StoreSignals;
use crate::{Directory, RecentTasks};

/// Tuning of delivery.
#[derive(Debug, Clone)]
pub struct DeliveryConfig {
    /// A delivery not acknowledged after this long is offered again to the same agent,
    /// which answers from its journal (R13).
    pub redeliver_after_ms: i64,
    /// An agent that has not polled for this long is considered gone.
    pub agent_gone_after_ms: i64,
    /// How often the sweeper looks for overdue deliveries.
    pub sweep_interval_ms: u64,
    /// Waiting polls re-check the database at least this often (work from other nodes,
    /// retry times coming due).
    pub recheck_ms: u64,
    /// The line printed at the top of a reprint; `{n}` is the reprint number.
    pub reprint_banner: String,
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        DeliveryConfig {
            redeliver_after_ms: 30_000,
            agent_gone_after_ms: 60_000,
            sweep_interval_ms: 1_000,
            recheck_ms: 1_000,
            reprint_banner: "*** REPRINT {n} ***".into(),
        }
    }
}

/// One job handed to an agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub task_id: String,
    pub attempt: i32,
    pub printer_id: String,
    pub printer_address: String,
    /// `biz_no#printer_id` (R16).
    pub idempotency_key: String,
    pub content_type: &'static str,
    pub data: Vec<u8>,
    /// The previous attempt ended in doubt and the print type reprints on doubt: the agent
    /// may print over its journal's `started`/`in_doubt` record for an older attempt.
    pub reprint: bool,
}

/// One ack as received.
#[derive(Debug, Clone)]
pub struct AckIn {
    pub task_id: String,
    pub attempt: i32,
    pub outcome: Outcome,
    pub detail: String,
}

/// The result of one ack (CONTRACT.md).
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

#[derive(Debug, Clone)]
struct AgentSeen {
    last_poll: Millis,
}

/// What the sweeper did in one pass (for logs and tests).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SweepReport {
    pub overdue: usize,
    pub in_doubt: usize,
    pub retrying: usize,
}

/// The broker side of delivery. Share it behind an `Arc`.
pub struct Dispatcher {
    store: Arc<dyn Store>,
    directory: Arc<Directory>,
    gate: Arc<RecentTasks>,
    signals: Arc<StoreSignals>,
    policies: PolicyTable,
    config: DeliveryConfig,
    /// (tenant, store) → agent id → last poll. In memory: after a broker restart no agent
    /// counts as replaced until agents poll again, which errs on the side of waiting.
    agents: Mutex<HashMap<(String, String), HashMap<String, AgentSeen>>>,
}

/// The printer's configured render profile (`transport.profile`), if any.
pub(crate) fn printer_profile(transport: &str) -> Option<String> {
    serde_json::from_str::<serde_json::Value>(transport)
        .ok()
        .and_then(|v| v.get("profile").and_then(|a| a.as_str()).map(str::to_owned))
}

fn printer_address(transport: &str) -> String {
    serde_json::from_str::<serde_json::Value>(transport)
        .ok()
        .and_then(|v| v.get("address").and_then(|a| a.as_str()).map(str::to_owned))
        .unwrap_or_default()
}

impl Dispatcher {
    pub fn new(
        store: Arc<dyn Store>,
        directory: Arc<Directory>,
        gate: Arc<RecentTasks>,
        signals: Arc<StoreSignals>,
        policies: PolicyTable,
        config: DeliveryConfig,
    ) -> Dispatcher {
        Dispatcher { store, directory, gate, signals, policies, config, agents: Mutex::default() }
    }

    pub fn signals(&self) -> &Arc<StoreSignals> {
        &self.signals
    }

    fn policy(&self, print_type: &str) -> onceprint_core::PrintTypePolicy {
        self.policies.policy_for(print_type)
    }

    fn seen(&self, who: &AgentIdentity, agent_id: &str, now: Millis) {
        if let Ok(mut agents) = self.agents.lock() {
            agents
                .entry((who.tenant_id.clone(), who.store_id.clone()))
                .or_default()
                .insert(agent_id.to_owned(), AgentSeen { last_poll: now });
        }
    }

    /// Long poll: deliveries for the agent's store, as soon as there are any, or an empty
    /// list after `wait`.
    pub async fn poll(
        &self,
        who: &AgentIdentity,
        agent_id: &str,
        session: Option<&str>,
        wait: Duration,
        max: usize,
    ) -> Result<Vec<Delivery>, DeliveryError> {
        let start = tokio::time::Instant::now();
        let deadline = start + wait;
        let notify = self.signals.get(&who.tenant_id, &who.store_id);
        loop {
            self.seen(who, agent_id, now_ms());
            let woken = notify.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let (deliveries, next_due) = self.collect(who, agent_id, session, max).await?;
            let now = tokio::time::Instant::now();
            if !deliveries.is_empty() || now >= deadline || self.signals.is_shutting_down() {
                return Ok(deliveries);
            }
            let mut until = deadline.min(now + Duration::from_millis(self.config.recheck_ms));
            if let Some(due) = next_due {
                let ms = (due - now_ms()).max(0) as u64;
                until = until.min(now + Duration::from_millis(ms));
            }
            tokio::select! {
                _ = &mut woken => {}
                _ = tokio::time::sleep_until(until) => {}
                _ = self.signals.shutdown() => {}
            }
        }
    }

    /// One look at the store's lanes: hands out what can go now. Also returns the earliest
    /// time a waiting lane head comes due.
    async fn collect(
        &self,
        who: &AgentIdentity,
        agent_id: &str,
        session: Option<&str>,
        max: usize,
    ) -> Result<(Vec<Delivery>, Option<Millis>), DeliveryError> {
        let now = now_ms();
        let mut heads = self.store.lane_heads(&who.tenant_id, &who.store_id).await?;
        heads.sort_by(|a, b| (a.priority, &a.task_id).cmp(&(b.priority, &b.task_id)));
        let mut next_due: Option<Millis> = None;
        let mut changes: Vec<Transition> = Vec::new();
        let mut chosen: Vec<Task> = Vec::new();
        for head in heads {
            if changes.len() >= max {
                break;
            }
            // Only lanes of agent printers are handed to agents; the broker pushes to
            // webhook printers itself.
            let is_agent = match self.directory.printer(&head.tenant_id, &head.printer_id).await? {
                Some(p) => matches!(
                    crate::transport::Transport::parse(&p.transport),
                    Some(crate::transport::Transport::Agent { .. })
                ),
                None => false,
            };
            if !is_agent {
                continue;
            }
            let deadline = now + self.config.redeliver_after_ms;
            let change = match head.state {
                TaskState::Pending => Some((head.attempts + 1, format!("dispatched to agent {agent_id}"))),
                TaskState::Retrying => match head.next_attempt_at {
                    Some(t) if t > now => {
                        next_due = Some(next_due.map_or(t, |n| n.min(t)));
                        None
                    }
                    _ => Some((
                        head.attempts + 1,
                        format!("attempt {} dispatched to agent {agent_id}", head.attempts + 1),
                    )),
                },
                TaskState::Sent if head.sent_to.as_deref() == Some(agent_id) => {
                    let restarted = head.sent_session.as_deref() != session;
                    let overdue = head.next_attempt_at.is_some_and(|t| t <= now);
                    if restarted || overdue {
                        let why = if restarted {
                            "offered again: the agent restarted before acknowledging"
                        } else {
                            "offered again: no acknowledgement before the deadline"
                        };
                        Some((head.attempts, why.to_owned()))
                    } else {
                        if let Some(t) = head.next_attempt_at {
                            next_due = Some(next_due.map_or(t, |n| n.min(t)));
                        }
                        None
                    }
                }
                // In flight at another agent: the lane is busy; the sweeper decides.
                _ => None,
            };
            if let Some((attempts, reason)) = change {
                changes.push(Transition {
                    task_id: head.task_id.clone(),
                    from: head.state,
                    expected_attempts: head.attempts,
                    to: TaskState::Sent,
                    attempts,
                    last_error: head.last_error.clone(),
                    next_attempt_at: Some(deadline),
                    actor: format!("agent:{agent_id}"),
                    reason,
                    now,
                    sent_to: Some(agent_id.to_owned()),
                    sent_session: session.map(str::to_owned),
                    event: None,
                });
                chosen.push(head);
            }
        }
        if changes.is_empty() {
            return Ok((Vec::new(), next_due));
        }
        let applied = self.store.apply_transitions(&changes).await?;
        let sent_ids: Vec<String> =
            changes.iter().zip(&applied).filter(|(_, ok)| **ok).map(|(c, _)| c.task_id.clone()).collect();
        // One read for the content of everything handed out in this look.
        let mut contents: HashMap<String, onceprint_store::TaskContent> =
            self.store.task_contents(&sent_ids).await?.into_iter().collect();
        let mut out = Vec::with_capacity(changes.len());
        for ((change, task), ok) in changes.into_iter().zip(chosen).zip(applied) {
            if !ok {
                continue; // someone else moved it first; the next look sees the new state
            }
            self.gate.set_state(&task.task_id, TaskState::Sent);
            let Some(content) = contents.remove(&task.task_id) else { continue };
            let banner = match (task.origin_kind, task.reprint_no) {
                (Some(onceprint_store::OriginKind::Reprint), Some(n)) => {
                    Some(self.config.reprint_banner.replace("{n}", &n.to_string()))
                }
                _ => None,
            };
            let printer = self.directory.printer(&task.tenant_id, &task.printer_id).await?;
            let profile = printer.as_ref().and_then(|p| printer_profile(&p.transport));
            let data = match crate::content::render_for(
                &content.content_type,
                content.content,
                banner.as_deref(),
                profile.as_deref(),
            ) {
                Ok(d) => d,
                Err(why) => {
                    self.fail_unrenderable(&task, change.attempts, &why).await?;
                    continue;
                }
            };
            let address = printer.as_ref().map(|p| printer_address(&p.transport)).unwrap_or_default();
            out.push(Delivery {
                idempotency_key: format!("{}#{}", task.biz_no, task.printer_id),
                task_id: task.task_id,
                attempt: change.attempts,
                printer_id: task.printer_id,
                printer_address: address,
                content_type: "escpos",
                reprint: task.state == TaskState::Retrying && task.last_error.as_deref() == Some("in_doubt"),
                data,
            });
        }
        Ok((out, next_due))
    }

    async fn fail_unrenderable(&self, task: &Task, attempts: i32, why: &str) -> Result<(), DeliveryError> {
        let change = Transition {
            task_id: task.task_id.clone(),
            from: TaskState::Sent,
            expected_attempts: attempts,
            to: TaskState::Failed,
            attempts,
            last_error: Some("unrenderable".into()),
            next_attempt_at: None,
            actor: "engine".into(),
            reason: format!("cannot render the content: {why}"),
            now: now_ms(),
            sent_to: None,
            sent_session: None,
            event: crate::alerts::task_event(task, TaskState::Failed, Some("unrenderable"), why, now_ms()),
        };
        if self.store.transition(&change).await? {
            self.gate.set_state(&task.task_id, TaskState::Failed);
        }
        Ok(())
    }

    /// Applies acks from an agent of `who`'s store. Acks for tasks of other stores or
    /// unknown tasks are `stale`: they change nothing.
    pub async fn ack(
        &self,
        who: &AgentIdentity,
        agent_id: &str,
        acks: Vec<AckIn>,
    ) -> Result<Vec<AckResult>, DeliveryError> {
        let now = now_ms();
        let mut results = vec![AckResult::Stale; acks.len()];
        let mut changes: Vec<(usize, Transition)> = Vec::new();
        let mut printer_updates: HashMap<String, PrinterStatusUpdate> = HashMap::new();
        // Station tasks whose attempts ran out with a reason proving nothing printed.
        let mut failover: HashMap<String, Task> = HashMap::new();
        // One read for the whole batch of acks.
        let ids: Vec<String> = acks.iter().map(|a| a.task_id.clone()).collect();
        let tasks: HashMap<String, Task> =
            self.store.get_tasks(&who.tenant_id, &ids).await?.into_iter().map(|t| (t.task_id.clone(), t)).collect();
        for (i, a) in acks.iter().enumerate() {
            let Some(task) = tasks.get(&a.task_id).cloned() else { continue };
            if task.store_id != who.store_id {
                continue;
            }
            let policy = self.policy(&task.print_type);
            let ack = Ack { attempt: a.attempt, outcome: a.outcome, detail: a.detail.clone() };
            let unit: f64 = rand::thread_rng().gen();
            let c = match decide(task.state, task.attempts, &ack, &policy, now, unit) {
                AckDecision::Apply(c) => c,
                AckDecision::Duplicate => {
                    results[i] = AckResult::Duplicate;
                    continue;
                }
                AckDecision::Stale => continue,
            };
            if c.to == TaskState::Failed && task.station_id.is_some() && a.outcome.proves_nothing_printed() {
                failover.insert(task.task_id.clone(), task.clone());
            }
            let event = crate::alerts::task_event(&task, c.to, c.last_error.as_deref(), &c.reason, now);
            changes.push((
                i,
                Transition {
                    event,
                    task_id: task.task_id.clone(),
                    from: c.from,
                    expected_attempts: task.attempts,
                    to: c.to,
                    attempts: c.attempts,
                    last_error: c.last_error,
                    next_attempt_at: c.next_attempt_at,
                    actor: format!("agent:{agent_id}"),
                    reason: c.reason,
                    now,
                    sent_to: task.sent_to.clone(),
                    sent_session: task.sent_session.clone(),
                },
            ));
            // What the printer said about itself. Only acks that change a task count: a
            // stale or repeated ack describes the printer as it was, not as it is.
            let (online, last_error) = match a.outcome {
                Outcome::Printed => (true, None),
                Outcome::Offline => (false, Some("offline".to_owned())),
                Outcome::NoPaper | Outcome::CoverOpen | Outcome::PaperJam => {
                    (true, Some(a.outcome.as_str().to_owned()))
                }
                Outcome::InDoubt | Outcome::Error => {
                    (true, Some(format!("{}: {}", a.outcome.as_str(), a.detail).trim_end_matches(": ").to_owned()))
                }
            };
            printer_updates.insert(
                task.printer_id.clone(),
                PrinterStatusUpdate {
                    tenant_id: who.tenant_id.clone(),
                    printer_id: task.printer_id.clone(),
                    online,
                    last_error,
                    now,
                    event_id: crate::alerts::new_event_id(now),
                },
            );
        }
        if !changes.is_empty() {
            let list: Vec<Transition> = changes.iter().map(|(_, t)| t.clone()).collect();
            let applied = self.store.apply_transitions(&list).await?;
            for ((i, t), ok) in changes.into_iter().zip(applied) {
                if ok {
                    results[i] = AckResult::Applied;
                    self.gate.set_state(&t.task_id, t.to);
                    tracing::info!(task_id = %t.task_id, from = %t.from, to = %t.to, reason = %t.reason, "ack applied");
                    if let Some(mut task) = failover.remove(&t.task_id) {
                        task.state = TaskState::Failed;
                        task.last_error = t.last_error.clone();
                        self.fail_over(task).await?;
                    }
                }
            }
            // A lane may have freed up (or a retry was scheduled): let waiting polls look.
            self.signals.notify(&who.tenant_id, &who.store_id);
        }
        if !printer_updates.is_empty() {
            let updates: Vec<PrinterStatusUpdate> = printer_updates.into_values().collect();
            self.store.update_printer_status(&updates).await?;
        }
        Ok(results)
    }

    /// Failover (R25): a station task that failed with a reason proving nothing came out
    /// (no paper, cover open, paper jam, printer unreachable) moves to the station's next
    /// printer as a new task with the same business number; the original becomes
    /// `transferred` and can never be delivered again, even when its printer comes back.
    /// A task that may have printed never gets here (it is `in_doubt`, not `failed`).
    async fn fail_over(&self, task: Task) -> Result<(), DeliveryError> {
        let Some(station_id) = task.station_id.clone() else { return Ok(()) };
        let Some(station) = self.directory.station(&task.tenant_id, &station_id).await? else { return Ok(()) };
        let next = station
            .printers
            .iter()
            .position(|p| *p == task.printer_id)
            .and_then(|i| station.printers.get(i + 1))
            .cloned();
        let Some(next) = next else {
            tracing::warn!(task_id = %task.task_id, station = %station_id, "failover: no backup printer left");
            return Ok(());
        };
        let why = task.last_error.clone().unwrap_or_default();
        let spec = crate::operations::SuccessorSpec {
            kind: onceprint_store::OriginKind::Failover,
            printer_id: &next,
            reprint_no: None,
            actor: "engine".into(),
            reason: format!("failover of {} from {} ({why}) to {next}", task.task_id, task.printer_id),
            priority: task.priority,
            charge: 0,
        };
        let succ = crate::operations::successor(self.store.as_ref(), &task, spec).await?;
        let now = now_ms();
        let change = onceprint_store::ManualChange {
            task_id: task.task_id.clone(),
            transition: Some(Transition {
                task_id: task.task_id.clone(),
                from: TaskState::Failed,
                expected_attempts: task.attempts,
                to: TaskState::Transferred,
                attempts: task.attempts,
                last_error: task.last_error.clone(),
                next_attempt_at: None,
                actor: "engine".into(),
                reason: format!(
                    "failover: {} could not print ({why}); continued on {next} as {}",
                    task.printer_id, succ.task_id
                ),
                now,
                sent_to: task.sent_to.clone(),
                sent_session: task.sent_session.clone(),
                event: None,
            }),
            refund: false,
            successor: Some(succ.clone()),
            now,
        };
        if self.store.apply_manual(&change).await? {
            self.gate.set_state(&task.task_id, TaskState::Transferred);
            self.signals.notify(&task.tenant_id, &task.store_id);
            tracing::warn!(task_id = %task.task_id, successor = %succ.task_id, printer = %next, "failover");
        }
        Ok(())
    }

    /// One sweeper pass (R13): deliveries past their deadline whose agent is gone while
    /// another agent now serves the store cannot be resolved by asking that agent again,
    /// and the broker cannot know whether paper came out: they go to `in_doubt` (or to
    /// `retrying` where the print type reprints on doubt). A delivery whose agent is still
    /// polling is offered again to it on its next poll; one whose store has no agent at
    /// all waits for the agent to come back. Never a blind resend to a different device.
    pub async fn sweep_once(&self) -> Result<SweepReport, DeliveryError> {
        let now = now_ms();
        let overdue = self.store.due_tasks(TaskState::Sent, now, 500).await?;
        let mut report = SweepReport { overdue: overdue.len(), ..Default::default() };
        let mut changes = Vec::new();
        for task in overdue {
            let Some(sent_to) = task.sent_to.clone() else { continue };
            let replaced_by = {
                let Ok(agents) = self.agents.lock() else { continue };
                let Some(store_agents) = agents.get(&(task.tenant_id.clone(), task.store_id.clone())) else { continue };
                let alive = |a: &AgentSeen| now - a.last_poll <= self.config.agent_gone_after_ms;
                if store_agents.get(&sent_to).is_some_and(alive) {
                    continue; // its own agent will be offered it again
                }
                match store_agents.iter().find(|(id, a)| **id != sent_to && alive(a)) {
                    Some((other, _)) => other.clone(),
                    None => continue, // nobody serves the store now: wait for the agent
                }
            };
            let policy = self.policy(&task.print_type);
            let (to, next, why) = if policy.reprint_on_doubt {
                let delay = policy.backoff.delay_ms(task.attempts.max(1) as u32, rand::thread_rng().gen());
                (
                    TaskState::Retrying,
                    Some(now + delay),
                    format!("agent {sent_to} went away without confirming and {replaced_by} serves the store now; reprint on doubt (policy)"),
                )
            } else {
                (
                    TaskState::InDoubt,
                    None,
                    format!("agent {sent_to} went away without confirming and {replaced_by} serves the store now; the broker cannot know whether it printed"),
                )
            };
            changes.push(Transition {
                task_id: task.task_id.clone(),
                from: TaskState::Sent,
                expected_attempts: task.attempts,
                to,
                attempts: task.attempts,
                last_error: Some("in_doubt".into()),
                next_attempt_at: next,
                actor: "sweeper".into(),
                event: crate::alerts::task_event(&task, to, Some("in_doubt"), &why, now),
                reason: why,
                now,
                sent_to: task.sent_to.clone(),
                sent_session: task.sent_session.clone(),
            });
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

    /// Runs the sweeper until shutdown.
    pub fn spawn_sweeper(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(this.config.sweep_interval_ms));
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        if let Err(e) = this.sweep_once().await {
                            tracing::warn!(error = %e, "sweeper pass failed");
                        }
                    }
                    _ = this.signals.shutdown() => return,
                }
            }
        })
    }
}
