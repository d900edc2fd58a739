//! The manual channel and failover: an operator's reprint, mark-printed, cancel
//! and transfer, and the engine's own move of a station task to a backup printer.
//!
//! Which action is allowed in which state is decided by `onceprint_core::manual`; this
//! module builds the change — the original's compare-and-set transition, the refund, the
//! successor task — and has the store apply it in one transaction. A reprint is a task of
//! its own (its own attempts and audit) that hangs on the original and is numbered; it is
//! never a look-alike new task under a new business number.

use std::sync::Arc;

use onceprint_core::manual::{original_goes_to, ManualAction, ManualTask, NotAllowed};
use onceprint_core::{CoreError, PolicyTable, TaskState};
use onceprint_store::{ManualChange, NewTask, Origin, OriginKind, Store, StoreError, Task, Transition};

use crate::clock::{Clock, SystemClock};
use crate::{Directory, RecentTasks, Shared, StoreSignals};

/// Why an action was refused.
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    #[error("no task {0:?}")]
    NotFound(String),
    /// The printer the action names is not a printer of the task's store (or not the
    /// tenant's at all): to the caller it does not exist, as another tenant's object.
    #[error("{0}")]
    UnknownPrinter(String),
    /// A transfer to the printer the task already has would move nothing.
    #[error("{0}")]
    SamePrinter(String),
    #[error(transparent)]
    NotAllowed(#[from] NotAllowed),
    /// The printer the action would print on is disabled: the copy would only wait there.
    #[error("{0}")]
    PrinterDisabled(String),
    #[error(transparent)]
    Invalid(#[from] CoreError),
    /// The task changed between reading and acting.
    #[error("the task changed while acting on it (it is now {0}); look at it again")]
    Raced(TaskState),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Who takes a manual action. The audit trail names an authenticated identity:
/// the operator who logged in, or the tenant API key that was used, never only a name the
/// caller typed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Actor {
    /// An operator (console session or operator token): recorded as `operator:ID`.
    Operator(String),
    /// A tenant API key: recorded as `api_key:ID`, with the free-text name the caller gave
    /// beside it in the reason (who at the merchant's end pressed the button) when there is
    /// one. An order system acting on its own has no person to name: the key is the actor.
    ApiKey { key_id: String, name: Option<String> },
}

impl Actor {
    /// The audit trail's actor.
    pub fn audit_name(&self) -> String {
        match self {
            Actor::Operator(id) => format!("operator:{id}"),
            Actor::ApiKey { key_id, .. } => format!("api_key:{key_id}"),
        }
    }
}

/// An operator's request.
#[derive(Debug, Clone)]
pub struct ActionRequest {
    pub tenant_id: String,
    pub task_id: String,
    pub actor: Actor,
    pub reason: String,
    /// The target printer of a transfer; for a reprint, another printer of the store to
    /// print the copy on (the original's printer when absent), e.g. when the original's
    /// printer is dead and the ticket is in doubt.
    pub printer_id: Option<String>,
}

/// The task acted on (as it is now) and the task the action created, if any.
#[derive(Debug, Clone)]
pub struct ActionOutcome {
    pub task: Task,
    pub created: Option<Task>,
}

/// Settings of the manual channel.
#[derive(Debug, Clone)]
pub struct OperationsConfig {
    /// Ledger amount of a reprint (a reprint is a print).
    pub charge: i64,
}

impl Default for OperationsConfig {
    fn default() -> Self {
        OperationsConfig { charge: 1 }
    }
}

/// The manual channel. Share it behind an `Arc`.
pub struct Operations {
    store: Arc<dyn Store>,
    directory: Arc<Directory>,
    gate: Arc<RecentTasks>,
    signals: Arc<StoreSignals>,
    policies: PolicyTable,
    config: OperationsConfig,
    clock: Arc<dyn Clock>,
}

fn new_task_id(now: i64) -> String {
    crate::ids::next_task_id(now).into_string()
}

pub(crate) fn check_text(field: &str, value: &str, max: usize) -> Result<(), CoreError> {
    if value.trim().is_empty() {
        return Err(CoreError::invalid(field, "is required: say who acts and why"));
    }
    // Characters, as the document's `maxLength` counts them.
    if value.chars().count() > max || value.chars().any(char::is_control) {
        return Err(CoreError::invalid(field, format!("must be at most {max} characters without control characters")));
    }
    Ok(())
}

/// What a successor task is.
pub(crate) struct SuccessorSpec<'a> {
    pub kind: OriginKind,
    pub printer_id: &'a str,
    pub reprint_no: Option<i32>,
    pub actor: String,
    pub reason: String,
    pub priority: i32,
    pub charge: i64,
    /// When it is created, by the clock of whoever creates it.
    pub now: i64,
}

/// A successor of `task` (a reprint, a transfer or a failover), with the original's
/// business number, print type and content, keyed so it can never collide with a
/// submission: `reprint:ORIGIN:N`, `transfer:ORIGIN`, `failover:ORIGIN`.
pub(crate) async fn successor(store: &dyn Store, task: &Task, spec: SuccessorSpec<'_>) -> Result<NewTask, StoreError> {
    let SuccessorSpec { kind, printer_id, reprint_no, actor, reason, priority, charge, now } = spec;
    let content = store
        .task_content(&task.task_id)
        .await?
        .ok_or_else(|| StoreError::Backend(format!("task {} has no content", task.task_id)))?;
    let target = match (kind, reprint_no) {
        (OriginKind::Reprint, Some(n)) => format!("reprint:{}:{n}", task.task_id),
        _ => format!("{}:{}", kind.as_str(), task.task_id),
    };
    // A moved reprint stays a reprint: its copy carries the same numbered banner, never
    // comes out as if it were the first.
    let reprint_no = match kind {
        OriginKind::Reprint => reprint_no,
        OriginKind::Transfer | OriginKind::Failover => task.reprint_no,
    };
    Ok(NewTask {
        task_id: new_task_id(now),
        tenant_id: task.tenant_id.clone(),
        store_id: task.store_id.clone(),
        printer_id: printer_id.to_owned(),
        station_id: task.station_id.clone(),
        target,
        biz_no: task.biz_no.clone(),
        print_type: task.print_type.clone(),
        priority,
        content_type: content.content_type,
        content: content.content,
        fingerprint: task.fingerprint.clone(),
        actor,
        charge,
        now,
        origin: Some(Origin { task_id: task.task_id.clone(), kind, reprint_no, reason }),
    })
}

impl Operations {
    /// The task of `task`'s chain that carries the order's charge: a transfer or failover
    /// successor is not charged again, so cancelling it refunds the task it carries on.
    async fn charged_task(&self, task: &Task) -> Result<String, StoreError> {
        let mut current = task.clone();
        // A chain is as long as the moves made; the bound only guards against a cycle
        // that the store would never produce.
        for _ in 0..64 {
            let moved = matches!(current.origin_kind, Some(OriginKind::Transfer | OriginKind::Failover));
            let Some(origin) = current.origin_task_id.clone().filter(|_| moved) else { break };
            // The original may have been pruned (it ended as transferred long ago): its
            // tombstone keeps the links, and its ledger entries are never pruned.
            match self.store.get_task(&current.tenant_id, &origin).await? {
                Some(t) => current = t,
                None => match self.store.get_tombstone(&current.tenant_id, &origin).await? {
                    Some(b) => current = b.task,
                    None => break,
                },
            }
        }
        Ok(current.task_id)
    }

    /// Checks that `printer_id` is an enabled printer of `task`'s store (a copy or a
    /// transfer can never go to another store's printer) and returns its id.
    async fn printer_in_store(&self, tenant_id: &str, task: &Task, printer_id: &str) -> Result<String, ActionError> {
        onceprint_core::validate_id("printer_id", printer_id)?;
        let printer =
            self.directory.printer(tenant_id, printer_id).await?.filter(|p| p.store_id == task.store_id).ok_or_else(
                || {
                    ActionError::UnknownPrinter(format!(
                        "printer_id: no printer {printer_id:?} in store {:?}, the task's store",
                        task.store_id
                    ))
                },
            )?;
        if !printer.enabled {
            // The task would only wait there: a disabled printer's lane goes to nobody.
            return Err(ActionError::PrinterDisabled(format!(
                "printer {printer_id:?} is disabled; enable it or choose another printer"
            )));
        }
        Ok(printer.id)
    }

    pub fn new(shared: Shared, config: OperationsConfig) -> Operations {
        let Shared { store, directory, gate, signals, policies } = shared;
        Operations { store, directory, gate, signals, policies, config, clock: Arc::new(SystemClock) }
    }

    /// Reads the time from `clock` instead of the system's (a simulation's clock).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Operations {
        self.clock = clock;
        self
    }

    /// Carries out one operator action.
    pub async fn act(&self, action: ManualAction, req: ActionRequest) -> Result<ActionOutcome, ActionError> {
        if let Actor::ApiKey { name: Some(name), .. } = &req.actor {
            check_text("operator", name, 100)?;
        }
        check_text("reason", &req.reason, 500)?;
        let task = self
            .store
            .get_task(&req.tenant_id, &req.task_id)
            .await?
            .ok_or_else(|| ActionError::NotFound(req.task_id.clone()))?;
        let to = original_goes_to(action, ManualTask { state: task.state, may_have_printed: task.may_have_printed })?;
        let actor = req.actor.audit_name();
        // With a tenant key, the name the caller gave stands beside the key in the reason.
        let reason = match &req.actor {
            Actor::Operator(_) | Actor::ApiKey { name: None, .. } => req.reason.clone(),
            Actor::ApiKey { name: Some(name), .. } => format!("{} (by {name:?})", req.reason),
        };
        let now = self.clock.now_ms();
        let transition = to.map(|to| Transition {
            task_id: task.task_id.clone(),
            from: task.state,
            expected_attempts: task.attempts,
            to,
            attempts: task.attempts,
            last_error: task.last_error.clone(),
            next_attempt_at: None,
            actor: actor.clone(),
            reason: format!("{}: {reason}", action.as_str()),
            now,
            sent_to: task.sent_to.clone(),
            sent_session: task.sent_session.clone(),
            may_have_printed: false,
            event: None,
            refused: false,
        });
        let successor = match action {
            ManualAction::Reprint => {
                let n = self.store.reprint_count(&task.task_id).await? + 1;
                // Reprints of old orders queue behind live tickets when a `reprint`
                // print type is configured; otherwise they keep the original's priority.
                let priority = self.policies.types.get("reprint").map_or(task.priority, |p| p.priority);
                // The original's own printer too must be able to print the copy.
                let printer_id = req.printer_id.as_deref().unwrap_or(&task.printer_id);
                let printer_id = self.printer_in_store(&req.tenant_id, &task, printer_id).await?;
                let on = if printer_id == task.printer_id { String::new() } else { format!(" on {printer_id}") };
                let spec = SuccessorSpec {
                    kind: OriginKind::Reprint,
                    printer_id: &printer_id,
                    reprint_no: Some(n),
                    actor: actor.clone(),
                    reason: format!("reprint {n} of {}{on} by {actor}: {reason}", task.task_id),
                    priority,
                    charge: self.config.charge,
                    now,
                };
                Some(successor(self.store.as_ref(), &task, spec).await?)
            }
            ManualAction::Transfer => {
                let printer_id = req
                    .printer_id
                    .as_deref()
                    .ok_or_else(|| CoreError::invalid("printer_id", "is required: the printer to transfer to"))?;
                if printer_id == task.printer_id {
                    return Err(ActionError::SamePrinter(format!(
                        "printer_id: the task is already on printer {printer_id:?}; transfer it to another printer"
                    )));
                }
                let printer_id = self.printer_in_store(&req.tenant_id, &task, printer_id).await?;
                let spec = SuccessorSpec {
                    kind: OriginKind::Transfer,
                    printer_id: &printer_id,
                    reprint_no: None,
                    actor: actor.clone(),
                    reason: format!("transferred from {} ({}) by {actor}: {}", task.task_id, task.printer_id, reason),
                    priority: task.priority,
                    // The order was charged once, on the original.
                    charge: 0,
                    now,
                };
                Some(successor(self.store.as_ref(), &task, spec).await?)
            }
            ManualAction::MarkPrinted | ManualAction::Cancel => None,
        };
        let refund = match action {
            ManualAction::Cancel => Some(self.charged_task(&task).await?),
            _ => None,
        };
        let change = ManualChange {
            task_id: task.task_id.clone(),
            transitions: transition.into_iter().collect(),
            refund,
            successor: successor.clone(),
            now,
        };
        if !self.store.apply_manual(&change).await? {
            let now_state = self.store.get_task(&req.tenant_id, &req.task_id).await?.map_or(task.state, |t| t.state);
            return Err(ActionError::Raced(now_state));
        }
        if let Some(to) = to {
            self.gate.set_state(&task.task_id, to);
        }
        if successor.is_some() {
            self.signals.notify(&task.tenant_id, &task.store_id);
        }
        tracing::info!(task_id = %task.task_id, action = action.as_str(), actor = %actor, "manual action");
        let after = self.store.get_task(&req.tenant_id, &task.task_id).await?.unwrap_or(task);
        let created = match successor {
            Some(s) => self.store.get_task(&req.tenant_id, &s.task_id).await?,
            None => None,
        };
        Ok(ActionOutcome { task: after, created })
    }
}
