//! Offline operation, broker side: what a store agent needs to take orders on
//! the shop's LAN while the broker is unreachable ([`Offline::directory`]), and the sync
//! of the tasks it took meanwhile ([`Offline::sync`], `POST /v1/agent/offline-tasks`).
//!
//! A synced task is checked like a submission — `biz_no`, target, print type, content
//! canonicalized and fingerprinted here, never trusted from the agent — and scoped to the
//! agent's store. The printer it went to (`printed_on`) must be its printer, or one of its
//! station's. Then one [`Store::merge_offline`] transaction per task applies the merge
//! rules of the wire spec: a key the broker does not know becomes a task under the LAN
//! task id (its business day the agent's acceptance time), a known one keeps the LAN id as
//! an alias and is moved as [`onceprint_core::offline::decide`] says, through a
//! compare-and-set this module prepares (with its alert) and the store applies on the row
//! it read. The first gate learns every state the sync made or changed, and the store's
//! agents are woken when a lane may move.
//!
//! What changed while the shop was cut off is not a reason to refuse: a station that no
//! longer lists the printer the agent printed on keeps the task on that printer; a print
//! type no longer configured keeps its name with the default policy; a shop PC's clock far
//! off moves the reported times onto the broker's clock (the task then has an id of its
//! own and the LAN id names it). What is left — a report the agent could not have written
//! (a malformed id, an unknown outcome), content that does not parse, a target not of the
//! store — is `rejected` with the reason, and an `offline_task.rejected` alert tells a
//! person; the agent keeps the task and shows it. Database failures fail the whole
//! request, so the agent retries it.

use std::sync::Arc;

use onceprint_core::offline::{self, AliasKind, OfflineOutcome};
use onceprint_core::{
    ids::validate_biz_no, Content, ContentLimits, CoreError, IdempotencyKey, Millis, PolicyTable, Target, TaskId,
    TaskState,
};
use onceprint_store::{
    AgentIdentity, MergeStep, NewTask, OfflineMerge, OfflineTask, Store, StoreError, Task, TaskEvent, Transition,
};

use crate::clock::{now_ms, Clock, SystemClock};
use crate::transport::TransportConfig;
use crate::{Directory, RecentTasks, StoreSignals};

/// Most tasks in one sync request.
pub const MAX_TASKS: usize = 500;
/// Most journal records of one task.
pub const MAX_HISTORY: usize = 200;
/// How far the agent's clock may be off the broker's before the times it reports are
/// corrected. Task ids sort by their time and a broker seeds its id generator with the
/// greatest id it holds, so a task from far in the future would make every later task id
/// sort before it; a task from far in the past would be charged on a day long closed.
pub const MAX_CLOCK_AHEAD_MS: Millis = 5 * 60 * 1000;
/// Longest detail kept from the agent, in characters.
const MAX_DETAIL: usize = 500;

/// The lease naming the one store agent that takes a store's LAN orders. A ticket it
/// printed offline is known to its journal alone until its upload reaches the broker, so
/// it must be the only agent that prints the store's tickets: another agent could print
/// the cloud's copy of that ticket first (both back online after a cut). So a second
/// listener refuses LAN orders with the first one's name, and the store's deliveries go
/// to the holder only; other agents of the store stand by. The lease never expires on its
/// own: only a person frees it (`DELETE /v1/stores/{id}/lan-listener`).
pub fn lan_listener_lease(tenant_id: &str, store_id: &str) -> String {
    format!("lan-listener/{tenant_id}/{store_id}")
}

/// How long a LAN listener lease lasts: for ever, in practice (about 31,000 years).
const LAN_LISTENER_LEASE_MS: i64 = 1_000_000_000_000_000;

/// The answer to an agent's claim of its store's LAN listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LanClaim {
    /// The agent holds it (it did already, or took it now).
    Held,
    /// Another agent holds it.
    TakenBy(String),
}

/// What the sync needs of intake's configuration.
#[derive(Debug, Clone)]
pub struct OfflineConfig {
    pub policies: PolicyTable,
    pub content_limits: ContentLimits,
    /// Ledger amount per task (charged once, at the agent's acceptance time).
    pub charge: i64,
}

/// One record of the agent's journal for a task.
#[derive(Debug, Clone, Default)]
pub struct JournalRecord {
    pub at: Millis,
    pub attempt: i32,
    /// `started`, `printed`, `in_doubt`, `no_paper`, `cover_open`, `offline`, `paper_jam`, `error`.
    pub state: String,
    pub detail: String,
}

/// A task the agent accepted offline, as it reports it.
#[derive(Debug, Clone, Default)]
pub struct OfflineReport {
    /// The id the agent minted from `accepted_at` (`TaskId::from_parts`).
    pub task_id: String,
    pub biz_no: Option<String>,
    pub printer_id: Option<String>,
    pub station_id: Option<String>,
    pub print_type: Option<String>,
    pub content: Option<Content>,
    pub accepted_at: Millis,
    pub lan_key_id: String,
    /// The printer the agent chose; `None` for a task it has not printed (the broker then
    /// chooses as intake does).
    pub printed_on: Option<String>,
    /// `printed`, `in_doubt`, `failed` or `pending`.
    pub outcome: String,
    pub attempts: i32,
    pub detail: String,
    pub history: Vec<JournalRecord>,
    /// Why the task could not be read at all (a field of the wrong type, content that
    /// does not parse): it is rejected with this reason, the other tasks are taken.
    pub unreadable: Option<String>,
    /// How long before the upload the agent accepted the task, by a clock that no setting
    /// of the wall clock moves (the machine's time since boot): when the agent knows it,
    /// the acceptance time on the broker's clock is exact, whatever the shop PC's clock
    /// said then or says now.
    pub age_ms: Option<Millis>,
}

/// What the sync did with one task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncResult {
    /// The broker did not know the key: the task is kept under its LAN id.
    Created,
    /// The broker had the task: the LAN id is its alias.
    Merged,
    /// The broker had other content under the key: the LAN id is an alias of that task,
    /// which is held for a person.
    Conflict,
    /// The broker can never take this task; `detail` says why.
    Rejected,
}

impl SyncResult {
    pub fn as_str(self) -> &'static str {
        match self {
            SyncResult::Created => "created",
            SyncResult::Merged => "merged",
            SyncResult::Conflict => "conflict",
            SyncResult::Rejected => "rejected",
        }
    }
}

/// The answer for one task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncAnswer {
    /// The LAN task id, as sent.
    pub task_id: String,
    pub result: SyncResult,
    /// The broker's task the LAN id stands for (itself when created); `None` if rejected.
    pub broker_task_id: Option<String>,
    pub state: Option<TaskState>,
    pub detail: String,
}

/// A printer as the agent needs it offline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectoryPrinter {
    pub printer_id: String,
    /// What a delivery's `printer_address` would be (empty for a printer the agent does
    /// not drive).
    pub printer_address: String,
    pub enabled: bool,
    /// Driven by the store agent (transport `agent`): it can print to it itself.
    pub agent: bool,
    /// The render profile configured for the printer (`None`: the default).
    pub profile: Option<String>,
}

/// A station as the agent needs it offline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectoryStation {
    pub station_id: String,
    pub printers: Vec<String>,
}

/// The store's set-up as the agent needs it to take orders offline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreDirectory {
    pub store_id: String,
    pub printers: Vec<DirectoryPrinter>,
    pub stations: Vec<DirectoryStation>,
    /// The configured print types, by priority.
    pub print_types: Vec<String>,
    pub default_print_type: String,
    /// The content limit after decoding, which the agent applies offline as intake does.
    pub max_content_bytes: usize,
}

/// The offline service. Share it behind an `Arc`.
pub struct Offline {
    store: Arc<dyn Store>,
    directory: Arc<Directory>,
    gate: Arc<RecentTasks>,
    signals: Arc<StoreSignals>,
    config: OfflineConfig,
    /// The broker's clock an upload's times are compared with and corrected to.
    clock: Arc<dyn Clock>,
}

/// A report checked and made ready for the store, or why it cannot be taken.
type Prepared = Result<(OfflineTask, IdempotencyKey, OfflineOutcome), String>;

fn clip(s: &str) -> String {
    s.chars().take(MAX_DETAIL).collect()
}

fn rejected(task_id: &str, detail: impl Into<String>) -> SyncAnswer {
    SyncAnswer {
        task_id: task_id.to_owned(),
        result: SyncResult::Rejected,
        broker_task_id: None,
        state: None,
        detail: detail.into(),
    }
}

impl Offline {
    pub fn new(
        store: Arc<dyn Store>,
        directory: Arc<Directory>,
        gate: Arc<RecentTasks>,
        signals: Arc<StoreSignals>,
        config: OfflineConfig,
    ) -> Offline {
        Offline { store, directory, gate, signals, config, clock: Arc::new(SystemClock) }
    }

    /// Compares and corrects uploads' times with `clock` instead of the system's (a
    /// simulation's clock). The LAN listener's lease keeps the system's clock, as every
    /// lease of the cluster does.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Offline {
        self.clock = clock;
        self
    }

    /// The agent's store as it needs it offline: its printers, stations and print types.
    pub async fn directory(&self, agent: &AgentIdentity) -> Result<StoreDirectory, StoreError> {
        let printers = self.store.list_printers(&agent.tenant_id, Some(&agent.store_id)).await?;
        let stations = self.store.list_stations(&agent.tenant_id, &agent.store_id).await?;
        let mut types: Vec<(&String, i32)> = self.config.policies.types.iter().map(|(k, p)| (k, p.priority)).collect();
        types.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(b.0)));
        Ok(StoreDirectory {
            store_id: agent.store_id.clone(),
            printers: printers
                .into_iter()
                .map(|p| {
                    let transport = TransportConfig::from_stored(&p.transport);
                    let (address, agent, profile) = match &transport {
                        Some(TransportConfig::Agent(a)) => (a.address.clone(), true, a.profile.clone()),
                        Some(t) => (String::new(), false, t.encoding().profile().map(str::to_owned)),
                        None => (String::new(), false, None),
                    };
                    DirectoryPrinter { printer_id: p.id, printer_address: address, enabled: p.enabled, agent, profile }
                })
                .collect(),
            stations: stations
                .into_iter()
                .map(|s| DirectoryStation { station_id: s.id, printers: s.printers })
                .collect(),
            print_types: types.into_iter().map(|(k, _)| k.clone()).collect(),
            default_print_type: onceprint_core::policy::DEFAULT_PRINT_TYPE.to_owned(),
            max_content_bytes: self.config.content_limits.max_bytes,
        })
    }

    /// Takes the store's LAN listener for `agent_id`, or names the agent holding it.
    pub async fn claim_lan_listener(&self, agent: &AgentIdentity, agent_id: &str) -> Result<LanClaim, StoreError> {
        let name = lan_listener_lease(&agent.tenant_id, &agent.store_id);
        if self.store.acquire_lease(&name, agent_id, now_ms(), LAN_LISTENER_LEASE_MS).await?.is_some() {
            // The store's deliveries go to this agent alone from now on (agent polls ask
            // the directory); a renewal by the holder changes nothing to forget.
            let known = self.directory.lan_listener(&agent.tenant_id, &agent.store_id).await?;
            if known.as_deref() != Some(agent_id) {
                self.directory.forget_lan_listener(&agent.tenant_id, &agent.store_id);
            }
            return Ok(LanClaim::Held);
        }
        let holder = self.store.lease_row(&name).await?.map(|l| l.holder).unwrap_or_default();
        Ok(LanClaim::TakenBy(holder))
    }

    /// Takes the agent's reports, one transaction per task, and answers each in order.
    /// A database failure fails the whole call (tasks merged before it stay merged, and
    /// answer the same when the agent sends them again).
    ///
    /// `sent_at` is the agent's clock when it sent the upload (agents that send it): the
    /// broker compares it with its own and corrects the reported times when the two are
    /// far apart, instead of refusing them. A task the broker cannot take (`rejected`) is
    /// also written to the outbox as an `offline_task.rejected` alert, with the reason
    /// and what the agent reported of it, for a person: the agent keeps it too.
    pub async fn sync(
        &self,
        agent: &AgentIdentity,
        agent_id: &str,
        reports: Vec<OfflineReport>,
        sent_at: Option<Millis>,
    ) -> Result<Vec<SyncAnswer>, StoreError> {
        let clock = AgentClock { now: self.clock.now_ms(), sent_at };
        let mut out = Vec::with_capacity(reports.len());
        for report in reports {
            let answer = match self.prepare(agent, agent_id, &report, &clock).await? {
                Err(why) => {
                    self.alert_rejected(agent, agent_id, &report, &why, clock.now).await?;
                    rejected(&report.task_id, why)
                }
                Ok((task, key, outcome)) => {
                    let answer = self.merge(agent, agent_id, task, key, outcome).await?;
                    if answer.result == SyncResult::Rejected {
                        self.alert_rejected(agent, agent_id, &report, &answer.detail, clock.now).await?;
                    }
                    answer
                }
            };
            out.push(answer);
        }
        Ok(out)
    }

    /// The `offline_task.rejected` alert for a report the broker could not take: what a
    /// person needs to find the order and print it if it did not print.
    async fn alert_rejected(
        &self,
        agent: &AgentIdentity,
        agent_id: &str,
        r: &OfflineReport,
        why: &str,
        now: Millis,
    ) -> Result<(), StoreError> {
        tracing::warn!(
            tenant_id = %agent.tenant_id,
            store_id = %agent.store_id,
            agent_id,
            lan_task_id = %r.task_id,
            outcome = %r.outcome,
            reason = why,
            "an offline task could not be taken; the store agent keeps it"
        );
        let event_id = crate::alerts::new_event_id(now);
        let payload = serde_json::json!({
            "id": event_id,
            "type": "offline_task.rejected",
            "created_at": crate::clock::rfc3339(now),
            "tenant_id": agent.tenant_id,
            "data": {
                "store_id": agent.store_id,
                "agent_id": agent_id,
                "lan_task_id": r.task_id,
                "biz_no": r.biz_no,
                "printer_id": r.printer_id,
                "station_id": r.station_id,
                "print_type": r.print_type,
                "printed_on": r.printed_on,
                "outcome": r.outcome,
                "accepted_at": r.accepted_at,
                "reason": why,
            },
        });
        self.store
            .record_alert(&onceprint_store::OutboxEvent {
                event_id,
                tenant_id: agent.tenant_id.clone(),
                kind: "offline_task.rejected".into(),
                payload: payload.to_string(),
                now,
            })
            .await
    }

    async fn merge(
        &self,
        agent: &AgentIdentity,
        agent_id: &str,
        task: OfflineTask,
        key: IdempotencyKey,
        outcome: OfflineOutcome,
    ) -> Result<SyncAnswer, StoreError> {
        // The answer names the task by the id the agent sent: the broker's task may have an
        // id of its own (a clock far off), which the answer gives as `broker_task_id`.
        let lan_id = task.lan_id.clone();
        let fingerprint = task.task.fingerprint.clone();
        let planner = planner(fingerprint.clone(), outcome, lan_id.clone(), format!("agent:{agent_id}"), task.now);
        let merged = match self.store.merge_offline(task, planner).await {
            Ok(m) => m,
            // The printer was deleted between the check and the insert.
            Err(StoreError::NotFound(what)) => return Ok(rejected(&lan_id, format!("{what} does not exist"))),
            Err(e) => return Err(e),
        };
        let answer = |result, t: &Task, detail: String| SyncAnswer {
            task_id: lan_id.clone(),
            result,
            broker_task_id: Some(t.task_id.clone()),
            state: Some(t.state),
            detail,
        };
        Ok(match merged {
            OfflineMerge::Created { task, again, pruned } => {
                if !again {
                    self.gate.insert(&key, &task.task_id, &task.fingerprint, task.state);
                    if task.state == TaskState::Pending {
                        self.signals.notify(&agent.tenant_id, &agent.store_id);
                    }
                }
                let detail = match (task.state, pruned) {
                    (s, true) => {
                        format!("kept as task {} ({s}), since pruned after the retention period", task.task_id)
                    }
                    (TaskState::Pending, _) => {
                        format!("kept as task {}; the broker delivers it to its printer", task.task_id)
                    }
                    (s, _) => format!("kept as task {} ({s})", task.task_id),
                };
                answer(SyncResult::Created, &task, detail)
            }
            OfflineMerge::Aliased { kind, task, pruned, changed, again: _ } => {
                if changed {
                    self.gate.set_state(&task.task_id, task.state);
                    // A task that left `sent` frees its printer's lane.
                    self.signals.notify(&task.tenant_id, &task.store_id);
                }
                let (result, detail) = match kind {
                    AliasKind::Merged => (
                        SyncResult::Merged,
                        format!(
                            "the broker had this order as task {} ({}{}); LAN task {lan_id} is merged into it",
                            task.task_id,
                            task.state,
                            if pruned { ", pruned" } else { "" }
                        ),
                    ),
                    // The store answers a renamed task as created, never as an alias.
                    AliasKind::Renamed => (SyncResult::Created, format!("kept as task {}", task.task_id)),
                    AliasKind::Conflict => (
                        SyncResult::Conflict,
                        format!(
                            "conflicting content under one key: the broker has task {} ({}) with other content; \
                             nothing printed or charged for LAN task {lan_id}",
                            task.task_id, task.state
                        ),
                    ),
                };
                answer(result, &task, detail)
            }
            OfflineMerge::IdTaken => {
                rejected(&lan_id, format!("task_id: {lan_id} names another task; the agent must mint a new id"))
            }
        })
    }

    /// Checks one report as intake checks a submission and builds what the store writes.
    async fn prepare(
        &self,
        agent: &AgentIdentity,
        agent_id: &str,
        r: &OfflineReport,
        clock: &AgentClock,
    ) -> Result<Prepared, StoreError> {
        match self.check(agent, agent_id, r, clock).await {
            Ok(p) => Ok(Ok(p)),
            Err(Check::Refused(why)) => Ok(Err(why)),
            Err(Check::Store(e)) => Err(e),
        }
    }

    async fn check(
        &self,
        agent: &AgentIdentity,
        agent_id: &str,
        r: &OfflineReport,
        clock: &AgentClock,
    ) -> Result<(OfflineTask, IdempotencyKey, OfflineOutcome), Check> {
        let now = clock.now;
        if let Some(why) = &r.unreadable {
            return Err(Check::refused(why.clone()));
        }
        let (id_time, _) = TaskId::parts(&r.task_id)
            .ok_or_else(|| Check::refused("task_id: not a task id (26 characters of Crockford base32)"))?;
        if id_time != r.accepted_at {
            return Err(Check::refused(format!(
                "task_id: it carries the time {id_time}, not accepted_at {}; mint it with TaskId::from_parts(accepted_at, …)",
                r.accepted_at
            )));
        }
        if r.accepted_at <= 0 {
            return Err(Check::refused(format!("accepted_at: {} is not a time after 1970", r.accepted_at)));
        }
        onceprint_core::validate_id("lan_key_id", &r.lan_key_id)?;
        let biz_no = validate_biz_no(r.biz_no.as_deref())?.to_owned();
        let target = Target::from_request(r.printer_id.as_deref(), r.station_id.as_deref())?;
        // A print type the broker no longer has (its configuration changed while the shop
        // was cut off) keeps its name, which is part of the key, and the default's policy.
        let mut notes: Vec<String> = Vec::new();
        let (print_type, policy) = match self.config.policies.resolve(r.print_type.as_deref()) {
            Ok(found) => found,
            Err(e) => {
                let name = r.print_type.as_deref().unwrap_or(onceprint_core::policy::DEFAULT_PRINT_TYPE);
                onceprint_core::validate_id("print_type", name)?;
                let (_, default) = self.config.policies.resolve(None)?;
                notes.push(format!("{e}; it has the default print type's policy"));
                (name, default)
            }
        };
        let content = r.content.as_ref().ok_or_else(|| CoreError::invalid("content", "is required"))?;
        let canonical = content.canonicalize(self.config.content_limits)?;
        let fingerprint = canonical.fingerprint();
        let outcome = OfflineOutcome::parse(&r.outcome).ok_or_else(|| {
            Check::refused(format!(
                "outcome: {:?} is not one of {}",
                r.outcome,
                OfflineOutcome::ALL.map(OfflineOutcome::as_str).join(", ")
            ))
        })?;
        if !(0..=1000).contains(&r.attempts) {
            return Err(Check::refused("attempts: must be 0–1000"));
        }
        // The broker renders what it delivers: content it could not render is refused now,
        // as at intake, not failed later. What the agent printed already needs no check.
        if outcome == OfflineOutcome::Pending {
            crate::content::validate(canonical.content_type, &canonical.bytes)
                .map_err(|e| Check::refused(e.to_string()))?;
        }
        let placed = self.printer_of(agent, &target, r.printed_on.as_deref(), outcome).await?;
        notes.extend(placed.note);
        let (printer_id, station_id) = (placed.printer_id, placed.station_id);

        // The agent's times, on the broker's clock: a shop PC's clock far off (set back by
        // a flat CMOS battery, say, or hours ahead) moves every time it reported by what it
        // was off when it uploaded. A small difference is only recorded.
        let (lead, shift) = clock.of_task(r.accepted_at, r.age_ms);
        let at = |t: Millis| (t - shift).clamp(0, now);
        let accepted_at = at(r.accepted_at);
        if let Some(note) = clock_note(lead, shift) {
            notes.push(note);
        }

        let actor = format!("agent:{agent_id}");
        // The journal records the broker keeps: the first, and the latest ones. The agent
        // bounds what it keeps itself; an older agent's longer history is cut here, never
        // refused.
        let records: Vec<&JournalRecord> = if r.history.len() > MAX_HISTORY {
            notes.push(format!(
                "{} of the agent's {} journal records left out (the first and the latest {} kept)",
                r.history.len() - MAX_HISTORY,
                r.history.len(),
                MAX_HISTORY - 1
            ));
            std::iter::once(&r.history[0]).chain(&r.history[r.history.len() - (MAX_HISTORY - 1)..]).collect()
        } else {
            r.history.iter().collect()
        };
        let mut history = Vec::with_capacity(records.len() + 1);
        let mut state = TaskState::Pending;
        let mut last_at = accepted_at;
        let mut printed_at = None;
        for (i, h) in records.iter().enumerate() {
            let to = offline::journal_state(&h.state).ok_or_else(|| {
                Check::refused(format!(
                    "history[{i}].state: {:?} is not one of {}",
                    h.state,
                    offline::JOURNAL_STATES.join(", ")
                ))
            })?;
            // An event dated before 1970, or an attempt below zero, is no journal record
            // the agent writes; it would only make the audit trail lie.
            if h.at < 0 {
                return Err(Check::refused(format!("history[{i}].at: {} is not a time after 1970", h.at)));
            }
            if h.attempt < 0 {
                return Err(Check::refused(format!("history[{i}].attempt: {} is below 0", h.attempt)));
            }
            let detail = clip(&h.detail);
            let reason = if detail.is_empty() {
                format!("store agent journal, offline: {}", h.state)
            } else {
                format!("store agent journal, offline: {} ({detail})", h.state)
            };
            // On the broker's clock, and never before the acceptance or after now (a clock
            // that stepped during the outage).
            let h_at = at(h.at).max(accepted_at);
            history.push(TaskEvent {
                at: h_at,
                from: Some(state),
                to,
                attempt: h.attempt,
                actor: actor.clone(),
                reason,
            });
            if to == TaskState::Printed {
                printed_at = Some(h_at);
            }
            state = to;
            last_at = last_at.max(h_at);
        }
        let detail = clip(&r.detail);
        if state != outcome.state() {
            let reason = if detail.is_empty() {
                format!("reported by the store agent: {}", outcome.as_str())
            } else {
                format!("reported by the store agent: {} ({detail})", outcome.as_str())
            };
            history.push(TaskEvent {
                at: last_at,
                from: Some(state),
                to: outcome.state(),
                attempt: r.attempts,
                actor: actor.clone(),
                reason,
            });
        }
        let last_error = match outcome {
            OfflineOutcome::Printed | OfflineOutcome::Pending => None,
            OfflineOutcome::InDoubt => Some("in_doubt".to_owned()),
            OfflineOutcome::Failed => Some(if detail.is_empty() { "failed offline".to_owned() } else { detail }),
        };
        let may_have_printed = outcome == OfflineOutcome::InDoubt || r.history.iter().any(|h| h.state == "in_doubt");
        let key = IdempotencyKey::new(&agent.tenant_id, &target, &biz_no, print_type);
        // The task keeps the LAN id unless its time is off: then an id of the corrected
        // acceptance time, and the LAN id names it as an alias (a task id carries its
        // creation time; one far in the future would also seed the id generators of
        // restarting brokers).
        let task_id = if accepted_at == r.accepted_at {
            r.task_id.clone()
        } else {
            TaskId::from_parts(accepted_at, rand::random::<[u8; 10]>()).into_string()
        };
        let mut reason = format!(
            "accepted on the shop LAN (key {}) by store agent {agent_id} while the broker was unreachable",
            r.lan_key_id
        );
        for note in &notes {
            reason.push_str("; ");
            reason.push_str(note);
        }
        let task = OfflineTask {
            task: NewTask {
                task_id,
                tenant_id: agent.tenant_id.clone(),
                store_id: agent.store_id.clone(),
                printer_id,
                station_id,
                target: key.target.clone(),
                biz_no,
                print_type: print_type.to_owned(),
                priority: policy.priority,
                content_type: canonical.content_type.to_owned(),
                content: canonical.bytes,
                fingerprint: fingerprint.0,
                actor: format!("lan:{}@agent:{}", r.lan_key_id, agent.store_id),
                charge: self.config.charge,
                now: accepted_at,
                origin: None,
            },
            lan_id: r.task_id.clone(),
            reason,
            state: outcome.state(),
            attempts: r.attempts,
            last_error,
            updated_at: last_at,
            printed_at: (outcome == OfflineOutcome::Printed).then(|| printed_at.unwrap_or(last_at)),
            may_have_printed,
            history,
            now,
        };
        Ok((task, key, outcome))
    }

    /// The printer the task goes to, the target being of the agent's store (another
    /// store's printer or station is answered as if it did not exist):
    /// - `printed_on`, when it is the task's printer or one of its station's;
    /// - `printed_on` still, when the agent tried it there although the station no longer
    ///   lists it (changed while the shop was cut off): that is where its paper is, and
    ///   the task says so;
    /// - else as a LAN submission's station task is placed ([`offline::station_printer`],
    ///   the function the agent chose with), waiting on the first printer if all are
    ///   disabled, as a disabled lane's tasks do.
    async fn printer_of(
        &self,
        agent: &AgentIdentity,
        target: &Target,
        printed_on: Option<&str>,
        outcome: OfflineOutcome,
    ) -> Result<Placed, Check> {
        let tenant = &agent.tenant_id;
        let in_store = |store_id: &str| store_id == agent.store_id;
        let (candidates, station_id) = match target {
            Target::Printer(p) => match self.directory.printer(tenant, p).await? {
                Some(printer) if in_store(&printer.store_id) => (vec![printer.id], None),
                _ => return Err(Check::refused(format!("printer_id: no printer {p:?} in store {:?}", agent.store_id))),
            },
            Target::Station(s) => match self.directory.station(tenant, s).await? {
                Some(station) if in_store(&station.store_id) && !station.printers.is_empty() => {
                    (station.printers, Some(station.id))
                }
                _ => return Err(Check::refused(format!("station_id: no station {s:?} in store {:?}", agent.store_id))),
            },
        };
        let placed = |printer_id: &str, note: Option<String>| Placed {
            printer_id: printer_id.to_owned(),
            station_id: station_id.clone(),
            note,
        };
        if let Some(p) = printed_on {
            if candidates.iter().any(|c| c == p) {
                return Ok(placed(p, None));
            }
            let of_store = self.directory.printer(tenant, p).await?.is_some_and(|x| in_store(&x.store_id));
            if outcome != OfflineOutcome::Pending && of_store {
                return Ok(placed(
                    p,
                    Some(format!(
                        "printed on {p:?}, which is no longer the task's printer ({}): kept where the agent printed it",
                        candidates.join(", ")
                    )),
                ));
            }
        }
        let mut members = Vec::with_capacity(candidates.len());
        for c in &candidates {
            let info = self.directory.printer_info(tenant, c).await?;
            let enabled = info.as_ref().is_some_and(|i| i.row.enabled);
            let agent_driven = info.is_some_and(|i| matches!(i.transport, Some(TransportConfig::Agent(_))));
            members.push((c.as_str(), enabled, agent_driven));
        }
        let members: Vec<offline::StationMember<'_>> = members
            .iter()
            .map(|(id, enabled, agent)| offline::StationMember { printer_id: id, enabled: *enabled, agent: *agent })
            .collect();
        let chosen = offline::station_printer(&members, true).unwrap_or(candidates[0].as_str()).to_owned();
        let note = printed_on.filter(|p| *p != chosen).map(|p| {
            format!("the agent had chosen {p:?}, which is no longer the task's printer; it waits on {chosen:?}")
        });
        Ok(placed(&chosen, note))
    }
}

/// Where a synced task goes, and what the audit trail should say about it.
struct Placed {
    printer_id: String,
    station_id: Option<String>,
    note: Option<String>,
}

/// The agent's clock as its upload showed it: what it read when it sent the upload
/// (`sent_at`, from agents that send it) against the broker's clock on arrival; a task's
/// own age, when the agent sends it, tells more ([`AgentClock::of_task`]).
#[derive(Debug, Clone, Copy)]
pub struct AgentClock {
    /// The broker's clock when the upload arrived.
    pub now: Millis,
    /// The agent's clock when it sent the upload, if it said.
    pub sent_at: Option<Millis>,
}

impl AgentClock {
    /// How far the agent's clock was ahead of the broker's for a task accepted at
    /// `accepted_at` by that clock (negative: behind), when it can be told, and what to
    /// subtract from the task's times: that lead when it is past [`MAX_CLOCK_AHEAD_MS`]
    /// either way, else nothing. Best first: the task's age by the agent's clock since
    /// boot (exact, also across a wall-clock step or a restart of the agent); then the
    /// upload's `sent_at` (right unless the clock changed between the acceptance and the
    /// upload); without either, only a time ahead of the broker's by more than the
    /// tolerance tells, and the acceptance then counts as now.
    fn of_task(&self, accepted_at: Millis, age_ms: Option<Millis>) -> (Option<Millis>, Millis) {
        let lead = match age_ms.filter(|a| (0..=MAX_AGE_MS).contains(a)) {
            Some(age) => Some(accepted_at - (self.now - age)),
            None => self.sent_at.map(|s| s - self.now),
        };
        let shift = match lead {
            Some(lead) if lead.abs() > MAX_CLOCK_AHEAD_MS => lead,
            Some(_) => 0,
            None if accepted_at > self.now + MAX_CLOCK_AHEAD_MS => accepted_at - self.now,
            None => 0,
        };
        (lead, shift)
    }
}

/// The longest age of a task the broker believes: a year (an older one is a clock error).
const MAX_AGE_MS: Millis = 366 * 24 * 3600 * 1000;

/// The audit note on the agent's clock, when it was off by a second or more.
fn clock_note(lead: Option<Millis>, shift: Millis) -> Option<String> {
    let lead = lead.unwrap_or(shift);
    if lead.abs() < 1000 {
        return None;
    }
    let way = if lead > 0 { "ahead of" } else { "behind" };
    let amount = human_duration(lead.unsigned_abs());
    Some(if shift != 0 {
        format!("the store agent's clock was {amount} {way} the broker's: its times are corrected by that much")
    } else {
        format!("the store agent's clock was {amount} {way} the broker's")
    })
}

/// `1.5 s`, `12 min`, `3.0 h`, `2.5 days`.
fn human_duration(ms: u64) -> String {
    match ms {
        ms if ms < 60_000 => format!("{:.1} s", ms as f64 / 1000.0),
        ms if ms < 3_600_000 => format!("{} min", ms / 60_000),
        ms if ms < 86_400_000 => format!("{:.1} h", ms as f64 / 3_600_000.0),
        ms => format!("{:.1} days", ms as f64 / 86_400_000.0),
    }
}

/// Why a report was not prepared: the broker can never take it, or the database failed.
enum Check {
    Refused(String),
    Store(StoreError),
}

impl Check {
    fn refused(why: impl Into<String>) -> Check {
        Check::Refused(why.into())
    }
}

impl From<CoreError> for Check {
    fn from(e: CoreError) -> Self {
        Check::Refused(e.to_string())
    }
}

impl From<StoreError> for Check {
    fn from(e: StoreError) -> Self {
        Check::Store(e)
    }
}

/// The merge step for the task found under the key: [`offline::decide`] turned into a
/// compare-and-set from the task as read (with its alert), or an audit record when the
/// task carries on as it is.
fn planner(
    fingerprint: String,
    outcome: OfflineOutcome,
    lan_id: String,
    actor: String,
    now: Millis,
) -> onceprint_store::MergePlanner {
    Arc::new(move |existing: &Task| {
        let d = offline::decide(existing.state, existing.fingerprint == fingerprint, outcome, &lan_id);
        match d.to {
            Some(to) => {
                let last_error = match to {
                    TaskState::InDoubt if d.kind == AliasKind::Conflict => Some("conflicting content".to_owned()),
                    TaskState::InDoubt => Some("in_doubt".to_owned()),
                    _ => None,
                };
                // The agent may have put paper out (its own doubt), or the broker's own
                // delivery in flight may have: either way nobody may send it elsewhere
                // blindly.
                let may_have_printed = to == TaskState::InDoubt
                    && (d.kind == AliasKind::Merged || existing.state == TaskState::Sent || existing.may_have_printed);
                let transition = Transition {
                    event: crate::alerts::task_event(existing, to, last_error.as_deref(), &d.reason, now),
                    task_id: existing.task_id.clone(),
                    from: existing.state,
                    expected_attempts: existing.attempts,
                    to,
                    attempts: existing.attempts,
                    last_error,
                    next_attempt_at: None,
                    actor: actor.clone(),
                    reason: d.reason,
                    now,
                    sent_to: existing.sent_to.clone(),
                    sent_session: existing.sent_session.clone(),
                    may_have_printed,
                    refused: false,
                };
                MergeStep { kind: d.kind, transition: Some(transition), note: None }
            }
            None => MergeStep {
                kind: d.kind,
                transition: None,
                note: Some(TaskEvent {
                    at: now,
                    from: Some(existing.state),
                    to: existing.state,
                    attempt: existing.attempts,
                    actor: actor.clone(),
                    reason: d.reason,
                }),
            },
        }
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A task of the engine's unit tests (the alerts' tests use it too).
    pub(crate) fn task(state: TaskState, fingerprint: &str) -> Task {
        Task {
            task_id: "T1".into(),
            tenant_id: "t".into(),
            store_id: "s".into(),
            printer_id: "p".into(),
            station_id: None,
            target: "printer:p".into(),
            biz_no: "B".into(),
            print_type: "receipt".into(),
            priority: 10,
            content_type: "text".into(),
            fingerprint: fingerprint.into(),
            state,
            attempts: 2,
            last_error: None,
            next_attempt_at: Some(5),
            created_at: 1,
            updated_at: 1,
            printed_at: None,
            sent_to: Some("agent:a".into()),
            sent_session: Some("s1".into()),
            sent_at: None,
            may_have_printed: false,
            origin_task_id: None,
            origin_kind: None,
            reprint_no: None,
            successor_task_id: None,
            refusals: 0,
        }
    }

    #[test]
    fn the_planner_compares_and_sets_from_the_task_as_read() {
        let plan = planner("f".into(), OfflineOutcome::Printed, "L1".into(), "agent:a1".into(), 99);
        let step = plan(&task(TaskState::Sent, "f"));
        let t = step.transition.expect("a change");
        assert_eq!((t.from, t.to, t.expected_attempts, t.attempts), (TaskState::Sent, TaskState::Printed, 2, 2));
        assert_eq!((t.next_attempt_at, t.sent_to.as_deref(), t.actor.as_str()), (None, Some("agent:a"), "agent:a1"));
        assert!(t.reason.contains("printed offline by the store agent (LAN task L1)"));
        assert!(step.note.is_none());

        let step = plan(&task(TaskState::Printed, "f"));
        assert!(step.transition.is_none());
        let note = step.note.expect("a record");
        assert_eq!((note.from, note.to), (Some(TaskState::Printed), TaskState::Printed));

        let step = plan(&task(TaskState::Pending, "other"));
        assert_eq!(step.kind, AliasKind::Conflict);
        let t = step.transition.expect("held");
        assert_eq!((t.to, t.may_have_printed), (TaskState::InDoubt, false));
        assert!(t.reason.starts_with("conflicting content under one key: LAN task L1"));
    }
}
