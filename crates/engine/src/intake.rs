//! Intake: one submission from parsed request to durable task.
//!
//! The order of work is part of the contract (docs/ARCHITECTURE.md, "Data flow of a
//! submission"): the `biz_no` red line first, then the
//! duplicate gates, then validation against the directory, then one durable write that
//! persists the task, its audit event and its ledger charge together. A duplicate answered
//! by the first gate never reaches validation, the database or the ledger.

use std::sync::Arc;

use onceprint_core::content::CanonicalContent;
use onceprint_core::offline::{station_printer, StationMember};
use onceprint_core::{
    ids::validate_biz_no, Content, ContentLimits, CoreError, IdempotencyKey, PolicyTable, Target, TaskState,
};
use onceprint_store::{GroupCommitConfig, GroupCommitter, NewTask, Store, StoreError, SubmitOutcome, Task};

use crate::clock::{Clock, SystemClock};
use crate::shared_gate::{GuardedSharedGate, SharedEntry, SharedGate, SharedGateConfig};
use crate::transport::TransportConfig;
use crate::{Directory, RecentTasks, StoreSignals};

/// Tuning of intake.
#[derive(Debug, Clone)]
pub struct IntakeConfig {
    pub policies: PolicyTable,
    pub content_limits: ContentLimits,
    /// Keys remembered by the first gate.
    pub gate_capacity: usize,
    pub group_commit: GroupCommitConfig,
    /// Ledger amount per accepted task.
    pub charge: i64,
    /// Requests per tenant (submissions and every other call with the tenant's API key);
    /// `None`: unlimited. Duplicates answered by the first gate are never refused.
    pub tenant_rate: Option<crate::limits::RateLimit>,
}

impl Default for IntakeConfig {
    fn default() -> Self {
        IntakeConfig {
            policies: PolicyTable::default(),
            content_limits: ContentLimits::default(),
            gate_capacity: 200_000,
            group_commit: GroupCommitConfig::default(),
            charge: 1,
            tenant_rate: None,
        }
    }
}

/// A submission as parsed from the request, before any check.
#[derive(Debug, Clone, Default)]
pub struct SubmitRequest {
    pub tenant_id: String,
    pub biz_no: Option<String>,
    pub printer_id: Option<String>,
    pub station_id: Option<String>,
    pub print_type: Option<String>,
    pub content: Option<Content>,
    /// A submission a store agent forwards from its shop's LAN: the target must be a
    /// printer or station of this store, the agent's own. Checked before the gates, since
    /// it decides who may know about a task at all, not whether a task is valid. A station
    /// task of such a submission goes where the agent would print it offline
    /// ([`onceprint_core::offline::station_printer`] with `via_lan`).
    pub store_scope: Option<String>,
    /// For a forwarded station task: the printer the agent chose, the one it would print
    /// on had it accepted the task offline. Honoured when it is an enabled printer of the
    /// station, so that both paths share one delivery key even when the agent's copy of
    /// the store's set-up is behind the broker's.
    pub lan_printer: Option<String>,
    /// Who the audit trail names as the submitter; `tenant:{tenant_id}` when `None`.
    pub actor: Option<String>,
}

/// Whether the answer created a task or found one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubmitKind {
    Created,
    Duplicate,
}

/// The answer to a submission that was not refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubmitAnswer {
    pub kind: SubmitKind,
    pub task_id: String,
    pub state: TaskState,
    /// Whether the answer came from the in-process gate (for metrics).
    pub from_gate: bool,
    /// Whether the answer came from the shared gate (another node's commit, read by task
    /// id), without a database write (for metrics).
    pub from_shared_gate: bool,
    /// The task named was pruned by retention: only its final state is left.
    pub pruned: bool,
}

/// Why a submission was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IntakeError {
    #[error(transparent)]
    Invalid(#[from] CoreError),
    /// A receipt document or markup that cannot be rendered; names the field.
    #[error("{0}")]
    InvalidContent(String),
    /// A referenced printer or station does not exist for this tenant.
    #[error("{0}")]
    UnknownTarget(String),
    /// The target printer is disabled (for a station: all of its printers), and the
    /// submission is not a retry of an existing task. The message names the field.
    #[error("{0}")]
    PrinterDisabled(String),
    /// Same key, different content.
    #[error("task {task_id} already exists for this biz_no, printer and print type with different content")]
    Mismatch { task_id: String },
    /// The tenant is over its rate limit; a request may succeed after this many seconds.
    #[error("too many requests for this tenant; retry after {retry_after_secs} s")]
    RateLimited { retry_after_secs: u64 },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A task as found under a key: kept, or what the tombstone of a pruned one keeps.
enum Found {
    Kept(Task),
    Pruned(Task),
}

impl Found {
    fn task(&self) -> &Task {
        match self {
            Found::Kept(t) | Found::Pruned(t) => t,
        }
    }

    fn into_task(self) -> Task {
        match self {
            Found::Kept(t) | Found::Pruned(t) => t,
        }
    }
}

/// A submission after the checks before its commit.
// Lives on the stack of one submission only; boxing the new task would cost an
// allocation on the hot path for nothing.
#[allow(clippy::large_enum_variant)]
enum Prepared {
    /// Answered without a commit: a repeat one of the gates knew, or of a disabled target.
    Answered(SubmitAnswer),
    /// New work for the group committer.
    New(NewWork),
}

struct NewWork {
    task: NewTask,
    key: IdempotencyKey,
    fingerprint: String,
}

/// Where a new task goes, or why it cannot go anywhere.
enum Resolved {
    To { printer_id: String, store_id: String, station_id: Option<String> },
    Disabled(String),
}

/// The intake service.
pub struct Intake {
    store: Arc<dyn Store>,
    directory: Arc<Directory>,
    gate: Arc<RecentTasks>,
    /// The gate shared by all nodes of the database (`serve --redis-url`), if any.
    shared: Option<Arc<GuardedSharedGate>>,
    committer: GroupCommitter,
    signals: Arc<StoreSignals>,
    config: IntakeConfig,
    limiter: Option<Arc<crate::limits::RateLimiter>>,
    clock: Arc<dyn Clock>,
}

impl Intake {
    /// Starts intake (and its group committer) on the current tokio runtime.
    pub fn start(
        store: Arc<dyn Store>,
        directory: Arc<Directory>,
        signals: Arc<StoreSignals>,
        config: IntakeConfig,
    ) -> Intake {
        let committer = GroupCommitter::start(store.clone(), config.group_commit);
        let limiter = config.tenant_rate.map(|l| Arc::new(crate::limits::RateLimiter::new(l)));
        Intake {
            gate: Arc::new(RecentTasks::new(config.gate_capacity)),
            shared: None,
            store,
            directory,
            committer,
            signals,
            config,
            limiter,
            clock: Arc::new(SystemClock),
        }
    }

    /// Reads the time from `clock` instead of the system's (a simulation's clock).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Intake {
        self.clock = clock;
        self
    }

    /// Consults `gate` after the in-process gate missed (several nodes on one database).
    pub fn with_shared_gate(mut self, gate: Arc<dyn SharedGate>, config: SharedGateConfig) -> Intake {
        self.shared = Some(Arc::new(GuardedSharedGate::new(gate, config)));
        self
    }

    /// The shared gate, if one is configured (for metrics).
    pub fn shared_gate(&self) -> Option<&Arc<GuardedSharedGate>> {
        self.shared.as_ref()
    }

    /// The tenants' rate limiter, shared with the HTTP layer so that a tenant's
    /// submissions and its other calls draw from one bucket.
    pub fn tenant_limiter(&self) -> Option<&Arc<crate::limits::RateLimiter>> {
        self.limiter.as_ref()
    }

    /// The first gate, shared with whoever changes task states in this process.
    pub fn gate(&self) -> &Arc<RecentTasks> {
        &self.gate
    }

    pub fn policies(&self) -> &PolicyTable {
        &self.config.policies
    }

    /// Runs one submission through the order of work: `biz_no`, gates, validation, write.
    pub async fn submit(&self, req: SubmitRequest) -> Result<SubmitAnswer, IntakeError> {
        match self.prepare(req).await? {
            Prepared::Answered(answer) => Ok(answer),
            Prepared::New(new) => {
                let outcome = self.committer.submit(new.task).await?;
                self.finish(&new.key, &new.fingerprint, outcome).await
            }
        }
    }

    /// Runs several submissions (one batch request) through the same order of work as
    /// [`Intake::submit`], each on its own: one item's refusal does not touch the others.
    /// The new tasks among them are committed in one transaction and created in the order
    /// given, so that tickets of one order for one printer print in the order sent.
    /// One answer per request, in the same order.
    pub async fn submit_many(&self, reqs: Vec<SubmitRequest>) -> Vec<Result<SubmitAnswer, IntakeError>> {
        // The checks before the commit read caches and, with several nodes, the shared
        // gate. Calls to the shared gate wait on the network: then the items run side by
        // side. Without it they wait on nothing but a rare directory miss, and one after
        // the other costs less than polling a set of futures (each item's future moved
        // into a node of its own; measured: ~3 % of the CPU of a 50-item batch). Task ids
        // are minted in each item's own check, but lanes are ordered by the sequence the
        // commit assigns, which follows the group.
        let prepared = if self.shared.is_some() {
            futures_util::future::join_all(reqs.into_iter().map(|r| self.prepare(r))).await
        } else {
            let mut prepared = Vec::with_capacity(reqs.len());
            for r in reqs {
                prepared.push(self.prepare(r).await);
            }
            prepared
        };
        let mut answers: Vec<Option<Result<SubmitAnswer, IntakeError>>> = Vec::with_capacity(prepared.len());
        let mut pending = Vec::new();
        let mut tasks = Vec::new();
        for (i, p) in prepared.into_iter().enumerate() {
            match p {
                Ok(Prepared::Answered(a)) => answers.push(Some(Ok(a))),
                Err(e) => answers.push(Some(Err(e))),
                Ok(Prepared::New(new)) => {
                    answers.push(None);
                    tasks.push(new.task);
                    pending.push((i, new.key, new.fingerprint));
                }
            }
        }
        let outcomes = self.committer.submit_group(tasks).await;
        // The same choice after the commit: only the shared gate's `remember` waits.
        let finish_one =
            |((i, key, fingerprint), outcome): ((usize, IdempotencyKey, String), Result<_, StoreError>)| async move {
                let answer = match outcome {
                    Ok(outcome) => self.finish(&key, &fingerprint, outcome).await,
                    Err(e) => Err(e.into()),
                };
                (i, answer)
            };
        if self.shared.is_some() {
            let finished = futures_util::future::join_all(pending.into_iter().zip(outcomes).map(finish_one)).await;
            for (i, answer) in finished {
                answers[i] = Some(answer);
            }
        } else {
            for item in pending.into_iter().zip(outcomes) {
                let (i, answer) = finish_one(item).await;
                answers[i] = Some(answer);
            }
        }
        answers
            .into_iter()
            .map(|a| {
                a.unwrap_or_else(|| {
                    Err(IntakeError::Store(StoreError::Backend("a batch item was not answered".into())))
                })
            })
            .collect()
    }

    /// Everything of a submission before its commit: the red line, validation, both
    /// gates, the rate limit and the target. A repeat the gates know, or a refusal, ends
    /// here; new work comes back as the task to commit.
    async fn prepare(&self, req: SubmitRequest) -> Result<Prepared, IntakeError> {
        // The red line comes before anything else is looked at.
        let biz_no = validate_biz_no(req.biz_no.as_deref())?.to_owned();
        let target = Target::from_request(req.printer_id.as_deref(), req.station_id.as_deref())?;
        let (print_type, policy) = self.config.policies.resolve(req.print_type.as_deref())?;
        let content = req.content.as_ref().ok_or_else(|| CoreError::invalid("content", "is required"))?;
        let canonical: CanonicalContent = content.canonicalize(self.config.content_limits)?;
        let fingerprint = canonical.fingerprint();
        let key = IdempotencyKey::new(&req.tenant_id, &target, &biz_no, print_type);
        if let Some(store_id) = &req.store_scope {
            self.check_scope(&req.tenant_id, &target, store_id).await?;
        }

        // First gate: a retry of a task this process already committed. A task that was
        // transferred answers with the live task of its chain, which the gate does not
        // know: that case goes to the database.
        if let Some(hit) = self.gate.get(&key).filter(|h| h.state() != TaskState::Transferred) {
            return if hit.fingerprint == fingerprint.0 {
                let state = self.current_state(&key.tenant_id, &hit).await;
                Ok(Prepared::Answered(SubmitAnswer {
                    kind: SubmitKind::Duplicate,
                    task_id: hit.task_id.clone(),
                    state,
                    from_gate: true,
                    from_shared_gate: false,
                    pruned: hit.pruned(),
                }))
            } else {
                Err(IntakeError::Mismatch { task_id: hit.task_id.clone() })
            };
        }

        // The shared gate, on a miss of this process's gate: a task another node committed
        // is answered from its id without a database write. Bypassed (None) while the
        // shared gate is slow or down; a claim, ours or another node's, decides nothing.
        if let Some(shared) = &self.shared {
            if let Some(SharedEntry::Known { task_id, .. }) = shared.claim(&key).await {
                if let Some(found) = self.read_remembered(&key, &task_id).await? {
                    shared.record_answer();
                    let mut answer = self.answer(SubmitKind::Duplicate, found, &key, &fingerprint.0).await?;
                    answer.from_shared_gate = true;
                    return Ok(Prepared::Answered(answer));
                }
            }
        }

        // Fairness: past the first gate, so a retry storm of known tasks is answered, not
        // refused; before validation and the database, so a storm of new work costs
        // other tenants nothing but this check.
        if let Some(limiter) = &self.limiter {
            limiter
                .check(&req.tenant_id, self.clock.now_ms())
                .map_err(|l| IntakeError::RateLimited { retry_after_secs: l.retry_after_secs })?;
        }

        // Validation (after the gates). Documents and markup are checked now: a task
        // that could never print is refused with the field named, not failed later.
        crate::content::validate(canonical.content_type, &canonical.bytes)
            .map_err(|e| IntakeError::InvalidContent(e.to_string()))?;
        // The target must be the tenant's, and able to take new work.
        // Content a printer the task may reach cannot print (raw ESC/POS for a printer that
        // takes rendered receipts) is refused now, for a station's backups too, not found
        // out at failover.
        self.check_printable(&req.tenant_id, &target, canonical.content_type).await?;
        let via_lan = req.store_scope.is_some().then_some(req.lan_printer.as_deref());
        let (printer_id, store_id, station_id) = match self.resolve(&req.tenant_id, &target, via_lan).await? {
            Resolved::To { printer_id, store_id, station_id } => (printer_id, store_id, station_id),
            Resolved::Disabled(why) => {
                // Dedup still comes first: a retry of a task made before the printer
                // was disabled is answered as before; only new work is refused.
                let found = match self.store.find_task(&key).await? {
                    Some(task) => Found::Kept(task),
                    None => match self.store.find_tombstone(&key).await? {
                        Some(b) => Found::Pruned(b.task),
                        None => return Err(IntakeError::PrinterDisabled(why)),
                    },
                };
                self.remember_shared(&key, found.task()).await;
                return self.answer(SubmitKind::Duplicate, found, &key, &fingerprint.0).await.map(Prepared::Answered);
            }
        };

        let now = self.clock.now_ms();
        let new = NewTask {
            task_id: crate::ids::next_task_id(now).into_string(),
            tenant_id: req.tenant_id.clone(),
            store_id,
            printer_id,
            station_id,
            target: key.target.clone(),
            biz_no,
            print_type: print_type.to_owned(),
            priority: policy.priority,
            content_type: canonical.content_type.to_owned(),
            content: canonical.bytes,
            fingerprint: fingerprint.0.clone(),
            actor: req.actor.clone().unwrap_or_else(|| format!("tenant:{}", req.tenant_id)),
            charge: self.config.charge,
            now,
            origin: None,
        };
        Ok(Prepared::New(NewWork { task: new, key, fingerprint: fingerprint.0 }))
    }

    /// The answer to a submission once its batch is durable.
    async fn finish(
        &self,
        key: &IdempotencyKey,
        fingerprint: &str,
        outcome: SubmitOutcome,
    ) -> Result<SubmitAnswer, IntakeError> {
        let (kind, found) = match outcome {
            SubmitOutcome::Created(t) => (SubmitKind::Created, Found::Kept(t)),
            SubmitOutcome::Existing(t) => (SubmitKind::Duplicate, Found::Kept(t)),
            // A late replay of a pruned task: its tombstone answers, nothing was created.
            SubmitOutcome::Pruned(b) => (SubmitKind::Duplicate, Found::Pruned(b.task)),
        };
        // Durable now (created, or found by the unique key): other nodes may answer its
        // retries from the shared gate.
        self.remember_shared(key, found.task()).await;
        // The printer's lane has work: wake the store's waiting agent polls (printing
        // never blocks intake).
        if kind == SubmitKind::Created {
            let task = found.task();
            self.signals.notify(&task.tenant_id, &task.store_id);
        }
        self.answer(kind, found, key, fingerprint).await
    }

    /// The answer about a durable task (or the tombstone of a pruned one): remembered by
    /// the gate, refused as a mismatch when its content differs, and for a transferred
    /// task the live task of its chain.
    async fn answer(
        &self,
        kind: SubmitKind,
        found: Found,
        key: &IdempotencyKey,
        fingerprint: &str,
    ) -> Result<SubmitAnswer, IntakeError> {
        let task = found.task();
        self.gate.insert(key, &task.task_id, &task.fingerprint, task.state);
        if let Found::Pruned(_) = found {
            self.gate.mark_pruned(&task.task_id);
        }
        if task.fingerprint != fingerprint {
            return Err(IntakeError::Mismatch { task_id: task.task_id.clone() });
        }
        let found = if task.state == TaskState::Transferred { self.live_task(found).await? } else { found };
        let pruned = matches!(found, Found::Pruned(_));
        let task = found.into_task();
        Ok(SubmitAnswer {
            kind,
            task_id: task.task_id,
            state: task.state,
            from_gate: false,
            from_shared_gate: false,
            pruned,
        })
    }

    /// Tells the shared gate (if any) that `task` is durable under `key`.
    async fn remember_shared(&self, key: &IdempotencyKey, task: &Task) {
        if let Some(shared) = &self.shared {
            shared.remember(key, &task.task_id, &task.fingerprint).await;
        }
    }

    /// The state to answer a duplicate found in this process's gate with. On one node the
    /// gate's state is current (every change in this process updates it). With several
    /// nodes (a shared gate configured) another node may have moved the task since, so a
    /// task not yet in an end state is read by its id — one primary-key read, so that a
    /// retry after another node printed it answers `printed` — and the gate updated.
    /// A failed read answers with the gate's state: a duplicate answer is never refused
    /// for want of a fresher one.
    async fn current_state(&self, tenant_id: &str, hit: &crate::gate::GateEntry) -> TaskState {
        let known = hit.state();
        if self.shared.is_none() || known.is_final() || hit.pruned() {
            return known;
        }
        match self.store.get_task(tenant_id, &hit.task_id).await {
            Ok(Some(t)) => {
                if t.state != known {
                    self.gate.set_state(&t.task_id, t.state);
                }
                t.state
            }
            _ => known,
        }
    }

    /// The task the shared gate named for `key`, read by its id (a primary-key read, so
    /// the state is current), or its tombstone if retention pruned it. `None` when
    /// this database has no such task under this key (a gate left over from another
    /// database, say): the shared gate is then not believed, and the submission goes on.
    async fn read_remembered(&self, key: &IdempotencyKey, task_id: &str) -> Result<Option<Found>, IntakeError> {
        let found = match self.store.get_task(&key.tenant_id, task_id).await? {
            Some(t) => Found::Kept(t),
            None => match self.store.get_tombstone(&key.tenant_id, task_id).await? {
                Some(b) => Found::Pruned(b.task),
                None => return Ok(None),
            },
        };
        let t = found.task();
        let same_key = t.target == key.target && t.biz_no == key.biz_no && t.print_type == key.print_type;
        Ok(same_key.then_some(found))
    }

    /// The printer a new task for `target` goes to: the printer itself, or for a station
    /// the printer [`onceprint_core::offline::station_printer`] chooses (the first enabled,
    /// primary first; through the agent's LAN listener, `via_lan`, the first enabled one
    /// the agent drives, or the one the agent named if it is an enabled printer of the
    /// station).
    async fn resolve(
        &self,
        tenant_id: &str,
        target: &Target,
        via_lan: Option<Option<&str>>,
    ) -> Result<Resolved, IntakeError> {
        match target {
            Target::Printer(p) => {
                let printer = self
                    .directory
                    .printer(tenant_id, p)
                    .await?
                    .ok_or_else(|| IntakeError::UnknownTarget(format!("printer_id: no printer {p:?}")))?;
                if !printer.enabled {
                    return Ok(Resolved::Disabled(format!(
                        "printer_id: printer {p:?} is disabled and takes no new tasks; enable it \
                         (POST /v1/printers/{p}/enable) or send to another printer"
                    )));
                }
                Ok(Resolved::To { printer_id: printer.id, store_id: printer.store_id, station_id: None })
            }
            Target::Station(s) => {
                let station = self
                    .directory
                    .station(tenant_id, s)
                    .await?
                    .ok_or_else(|| IntakeError::UnknownTarget(format!("station_id: no station {s:?}")))?;
                if station.printers.is_empty() {
                    return Err(IntakeError::UnknownTarget(format!("station_id: station {s:?} has no printers")));
                }
                let mut seen = Vec::with_capacity(station.printers.len());
                for p in &station.printers {
                    let info = self.directory.printer_info(tenant_id, p).await?;
                    let enabled = info.as_ref().is_some_and(|i| i.row.enabled);
                    let agent = info.is_some_and(|i| matches!(i.transport, Some(TransportConfig::Agent(_))));
                    seen.push((p.as_str(), enabled, agent));
                }
                let members: Vec<StationMember<'_>> = seen
                    .iter()
                    .map(|(printer_id, enabled, agent)| StationMember { printer_id, enabled: *enabled, agent: *agent })
                    .collect();
                let named = via_lan.flatten().filter(|p| members.iter().any(|m| m.printer_id == *p && m.enabled));
                let chosen = named.or_else(|| station_printer(&members, via_lan.is_some()));
                if let Some(p) = chosen {
                    return Ok(Resolved::To {
                        printer_id: p.to_owned(),
                        store_id: station.store_id.clone(),
                        station_id: Some(station.id.clone()),
                    });
                }
                Ok(Resolved::Disabled(format!(
                    "station_id: every printer of station {s:?} ({}) is disabled; enable one of them",
                    station.printers.join(", ")
                )))
            }
        }
    }

    /// A scoped submission's target must belong to `store_id`. Another store's printer or
    /// station is answered as if it did not exist: the caller may not learn of it.
    async fn check_scope(&self, tenant_id: &str, target: &Target, store_id: &str) -> Result<(), IntakeError> {
        let found = match target {
            Target::Printer(p) => self.directory.printer(tenant_id, p).await?.map(|x| x.store_id),
            Target::Station(s) => self.directory.station(tenant_id, s).await?.map(|x| x.store_id),
        };
        if found.as_deref() == Some(store_id) {
            return Ok(());
        }
        Err(IntakeError::UnknownTarget(match target {
            Target::Printer(p) => format!("printer_id: no printer {p:?} in store {store_id:?}"),
            Target::Station(s) => format!("station_id: no station {s:?} in store {store_id:?}"),
        }))
    }

    /// Whether every printer `target` may reach can print `content_type`. Unknown targets
    /// pass here: `resolve` names them.
    async fn check_printable(&self, tenant_id: &str, target: &Target, content_type: &str) -> Result<(), IntakeError> {
        let printers = match target {
            Target::Printer(p) => vec![p.clone()],
            Target::Station(s) => match self.directory.station(tenant_id, s).await? {
                Some(station) => station.printers,
                None => return Ok(()),
            },
        };
        for p in &printers {
            let Some(info) = self.directory.printer_info(tenant_id, p).await? else { continue };
            let Some(transport) = info.transport.as_ref() else { continue };
            if let Err(why) = transport.encoding().accepts(content_type) {
                let role = match target {
                    Target::Printer(_) => format!("printer {p:?}"),
                    Target::Station(s) => format!("printer {p:?} of station {s:?}"),
                };
                return Err(IntakeError::InvalidContent(format!(
                    "content.type: {role} is a {} printer: {why}",
                    transport.kind().as_str()
                )));
            }
        }
        Ok(())
    }

    /// Follows a transferred task's successors to the task that carries its work now
    /// (a resubmission answers with the live task of the chain), kept or pruned.
    async fn live_task(&self, mut found: Found) -> Result<Found, IntakeError> {
        // Chains are short (one hop per backup printer); the bound only guards against a
        // damaged link pointing in a circle.
        for _ in 0..32 {
            let task = found.task();
            let Some(next) = task.successor_task_id.clone() else { break };
            if let Some(t) = self.store.get_task(&task.tenant_id, &next).await? {
                found = Found::Kept(t);
            } else if let Some(b) = self.store.get_tombstone(&task.tenant_id, &next).await? {
                found = Found::Pruned(b.task);
            } else {
                break;
            }
        }
        Ok(found)
    }

    /// The store behind intake (for read paths of the HTTP layer).
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }
}
