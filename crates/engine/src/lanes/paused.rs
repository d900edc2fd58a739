//! Lanes that progress by time: the tickets of a printer that says nothing.
//!
//! A printer whose lane is paused — out of paper, cover open, jammed, or offline because
//! it stopped calling in (`transport::polled`) or its MQTT device left — may never report
//! again. Failover to a station's next printer and a print type's `max_wait_ms` are
//! decided at an ack when the printer talks ([`LaneEngine::ack`]); this sweep decides them
//! by the clock for the tickets that wait on such a printer, so that they move on although
//! nothing is heard: a station ticket that cannot have printed goes to the station's next
//! printer once the printer has been paused for the station's threshold, and any ticket
//! past its print type's `max_wait_ms` fails with the printer's state as the reason. Both
//! are compare-and-sets on the ticket as read (a claim or an ack that moved it first
//! wins), and a ticket that moved is `transferred` or `failed`: a printer that comes back
//! never gets it. Only waiting tickets are touched; a delivery in flight ends by its
//! transport's rules (answered, or settled in doubt), never here.

use std::collections::{BTreeSet, HashMap};

use onceprint_core::{Millis, TaskState};
use onceprint_store::{ManualChange, PausedWait, Task, Transition};

use super::{DeliveryError, LaneEngine};

/// How many waiting tickets one sweep looks at (the rest at the next).
const BATCH: i64 = 500;

/// What one sweep of paused lanes did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PausedReport {
    /// Waiting tickets of paused printers looked at.
    pub waiting: usize,
    /// Station tickets moved to the station's next printer.
    pub moved: usize,
    /// Tickets failed past their print type's `max_wait_ms`.
    pub failed: usize,
}

impl LaneEngine {
    /// One look at the tickets that wait for a paused printer (see the module docs).
    pub async fn sweep_paused(&self) -> Result<PausedReport, DeliveryError> {
        let now = self.now();
        let waits = self.store.waiting_on_paused_printers(BATCH).await?;
        let mut report = PausedReport { waiting: waits.len(), ..PausedReport::default() };
        let mut thresholds: HashMap<(String, String), i64> = HashMap::new();
        let mut failures: Vec<Transition> = Vec::new();
        let mut moves: Vec<ManualChange> = Vec::new();
        for w in &waits {
            let task = &w.task;
            let paused_ms = (now - w.paused_since).max(0);
            if let Some(station_id) = task.station_id.as_deref().filter(|_| !task.may_have_printed) {
                let key = (task.tenant_id.clone(), station_id.to_owned());
                let threshold = match thresholds.get(&key) {
                    Some(t) => *t,
                    None => {
                        let t = self
                            .directory
                            .station(&task.tenant_id, station_id)
                            .await?
                            .and_then(|s| s.failover_after_ms)
                            .unwrap_or(self.config.station_failover_after_ms);
                        thresholds.insert(key, t);
                        t
                    }
                };
                if paused_ms >= threshold {
                    if let Some(next) = self.next_station_printer(task).await? {
                        moves.push(self.move_on(w, &next, paused_ms, threshold, now).await?);
                        continue;
                    }
                }
            }
            let policy = self.policies.policy_for(&task.print_type);
            let waited = now - task.created_at;
            if waited >= policy.max_wait_ms {
                failures.push(self.give_up(w, waited, policy.max_wait_ms, now));
            }
        }
        let mut stores: BTreeSet<(String, String)> = BTreeSet::new();
        if !failures.is_empty() {
            let applied = self.store.apply_transitions(&failures).await?;
            for (t, ok) in failures.iter().zip(applied) {
                if !ok {
                    continue; // moved by a claim or an ack meanwhile
                }
                report.failed += 1;
                self.gate.set_state(&t.task_id, t.to);
                tracing::warn!(task_id = %t.task_id, reason = %t.reason, "a ticket waited past its budget for a paused printer");
            }
        }
        for m in moves {
            if !self.store.apply_manual(&m).await? {
                continue;
            }
            report.moved += 1;
            self.gate.set_state(&m.task_id, TaskState::Transferred);
            if let Some(succ) = &m.successor {
                stores.insert((succ.tenant_id.clone(), succ.store_id.clone()));
                tracing::warn!(task_id = %m.task_id, successor = %succ.task_id, printer = %succ.printer_id,
                    "failover: the printer was paused past the station's threshold");
            }
        }
        for (tenant, store) in stores {
            self.signals.notify(&tenant, &store);
        }
        Ok(report)
    }

    /// The failover of a waiting station ticket to `next`: `transferred` with the
    /// successor, one change.
    async fn move_on(
        &self,
        w: &PausedWait,
        next: &str,
        paused_ms: Millis,
        threshold: i64,
        now: Millis,
    ) -> Result<ManualChange, DeliveryError> {
        let task = &w.task;
        let why = w.printer_state.as_deref().unwrap_or("paused");
        let succ = self.failover_successor(task, next, why).await?;
        let moved = Transition {
            task_id: task.task_id.clone(),
            from: task.state,
            expected_attempts: task.attempts,
            to: TaskState::Transferred,
            attempts: task.attempts,
            last_error: w.printer_state.clone(),
            next_attempt_at: None,
            actor: "engine".into(),
            reason: format!(
                "failover: {} has been paused ({why}) for {} s without a word, past the station's failover threshold \
                 ({threshold} ms); nothing of this ticket was printed; continued on {next} as {}",
                task.printer_id,
                paused_ms / 1000,
                succ.task_id
            ),
            now,
            sent_to: task.sent_to.clone(),
            sent_session: task.sent_session.clone(),
            may_have_printed: false,
            event: None,
            refused: false,
        };
        Ok(ManualChange {
            task_id: task.task_id.clone(),
            transitions: vec![moved],
            refund: None,
            successor: Some(succ),
            now,
        })
    }

    /// A waiting ticket that ran out of its print type's budget: `failed`, with the
    /// printer's state as its error and the alert of a failure.
    fn give_up(&self, w: &PausedWait, waited: Millis, max_wait_ms: i64, now: Millis) -> Transition {
        let task: &Task = &w.task;
        let state = w.printer_state.clone().unwrap_or_else(|| "paused".into());
        let what = if state == "offline" { "printer offline".to_owned() } else { format!("printer paused: {state}") };
        let reason = format!(
            "{what}: waited {} s for {} (paused since {} s ago), past the print type's max_wait_ms ({max_wait_ms} ms)",
            waited / 1000,
            task.printer_id,
            (now - w.paused_since).max(0) / 1000
        );
        Transition {
            event: crate::alerts::task_event(task, TaskState::Failed, Some(&state), &reason, now),
            task_id: task.task_id.clone(),
            from: task.state,
            expected_attempts: task.attempts,
            to: TaskState::Failed,
            attempts: task.attempts,
            last_error: Some(state),
            next_attempt_at: None,
            actor: "engine".into(),
            reason,
            now,
            sent_to: task.sent_to.clone(),
            sent_session: task.sent_session.clone(),
            may_have_printed: false,
            refused: false,
        }
    }
}
