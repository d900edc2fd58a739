//! Tasks the store agent accepted on the shop's LAN while the broker was unreachable
//! (`POST /v1/agent/offline-tasks`): what the agent reports, how its journal's records
//! read as task states, what the report does to a task the broker already has under the
//! same idempotency key, and where a station's task goes, which the agent and the broker
//! decide with the one function [`station_printer`].
//!
//! The decision is a pure function of the existing task's state, whether the content is
//! the same, and the agent's outcome, so the rules of the wire spec (merge rules 2 and 3)
//! are tested here once; the engine turns the decision into a compare-and-set that the
//! store applies inside the transaction that read the task.

use crate::TaskState;

/// Where the store agent left a task it accepted offline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OfflineOutcome {
    /// The printer confirmed paper came out.
    Printed,
    /// The agent sent it and cannot prove it printed.
    InDoubt,
    /// The agent gave up (its last record was a blocker or an error).
    Failed,
    /// Accepted, not printed yet: the broker takes it over and delivers it.
    Pending,
}

impl OfflineOutcome {
    pub const ALL: [OfflineOutcome; 4] =
        [OfflineOutcome::Printed, OfflineOutcome::InDoubt, OfflineOutcome::Failed, OfflineOutcome::Pending];

    pub fn as_str(self) -> &'static str {
        match self {
            OfflineOutcome::Printed => "printed",
            OfflineOutcome::InDoubt => "in_doubt",
            OfflineOutcome::Failed => "failed",
            OfflineOutcome::Pending => "pending",
        }
    }

    pub fn parse(s: &str) -> Option<OfflineOutcome> {
        OfflineOutcome::ALL.into_iter().find(|o| o.as_str() == s)
    }

    /// The state a task created from the report starts in (merge rule 1).
    pub fn state(self) -> TaskState {
        match self {
            OfflineOutcome::Printed => TaskState::Printed,
            OfflineOutcome::InDoubt => TaskState::InDoubt,
            OfflineOutcome::Failed => TaskState::Failed,
            OfflineOutcome::Pending => TaskState::Pending,
        }
    }
}

/// The state of the task after one record of the agent's journal: `started` is a
/// delivery to the printer, `printed` and `in_doubt` say so, and a blocker or an error
/// ends the attempt without paper. `None` for a record this version does not know.
pub fn journal_state(record: &str) -> Option<TaskState> {
    match record {
        "started" => Some(TaskState::Sent),
        "printed" => Some(TaskState::Printed),
        "in_doubt" => Some(TaskState::InDoubt),
        "no_paper" | "cover_open" | "offline" | "paper_jam" | "error" => Some(TaskState::Retrying),
        _ => None,
    }
}

/// The journal records [`journal_state`] knows, for messages.
pub const JOURNAL_STATES: [&str; 8] =
    ["started", "printed", "in_doubt", "no_paper", "cover_open", "offline", "paper_jam", "error"];

/// How the LAN task id is kept beside the task the broker already had.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AliasKind {
    /// Same content: the LAN task is this task (merge rule 2).
    Merged,
    /// Other content under the same key (merge rule 3): the LAN id still answers with the
    /// task, which is held for a person.
    Conflict,
    /// The broker did not know the key but kept the task under an id of its own, minted
    /// from the acceptance time corrected for the agent's clock (merge rule 1 with a shop
    /// PC whose clock was far off): the LAN id answers with it.
    Renamed,
}

impl AliasKind {
    pub fn as_str(self) -> &'static str {
        match self {
            AliasKind::Merged => "merged",
            AliasKind::Conflict => "conflict",
            AliasKind::Renamed => "renamed",
        }
    }

    pub fn parse(s: &str) -> Option<AliasKind> {
        match s {
            "merged" => Some(AliasKind::Merged),
            "conflict" => Some(AliasKind::Conflict),
            "renamed" => Some(AliasKind::Renamed),
            _ => None,
        }
    }
}

/// What a report does to the task the broker has under its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergeDecision {
    pub kind: AliasKind,
    /// The state the task moves to, always a legal transition from its state; `None`:
    /// the task stays as it is and the report is only recorded in its audit trail.
    pub to: Option<TaskState>,
    /// The audit trail's reason for the change or the record.
    pub reason: String,
}

/// Merge rules 2 and 3 of the wire spec for a task in `existing` state.
///
/// - Same content, the agent printed it, the task is not final: → `printed` (a delivery
///   in flight then gets a stale answer to its ack).
/// - Same content, the agent may have printed it, the task is neither final nor in doubt
///   already: → `in_doubt`, so a person decides rather than the broker printing it again.
/// - Same content otherwise (pending, failed, or a task that ended): the report is
///   recorded and the broker's task carries on.
/// - Other content: the task, unless final or in doubt already, goes to `in_doubt` (the
///   attention list); nothing prints until a person looked.
pub fn decide(existing: TaskState, same_content: bool, outcome: OfflineOutcome, lan_task_id: &str) -> MergeDecision {
    let wanted = |to: TaskState| (!existing.is_final() && existing != to && existing.can_go_to(to)).then_some(to);
    if !same_content {
        return MergeDecision {
            kind: AliasKind::Conflict,
            to: wanted(TaskState::InDoubt),
            reason: format!(
                "conflicting content under one key: LAN task {lan_task_id} accepted offline with other content"
            ),
        };
    }
    let (to, reason) = match outcome {
        OfflineOutcome::Printed => match wanted(TaskState::Printed) {
            Some(to) => (Some(to), format!("printed offline by the store agent (LAN task {lan_task_id})")),
            None => (
                None,
                format!(
                    "the store agent printed it offline as LAN task {lan_task_id} while it was {existing} here{}",
                    if existing == TaskState::Printed { ": it may be on paper twice" } else { "" }
                ),
            ),
        },
        OfflineOutcome::InDoubt => match wanted(TaskState::InDoubt) {
            Some(to) => (
                Some(to),
                format!(
                    "the store agent may have printed it offline (LAN task {lan_task_id}, in doubt): a person decides"
                ),
            ),
            None => (None, format!("the store agent may have printed it offline as LAN task {lan_task_id} (in doubt)")),
        },
        OfflineOutcome::Failed | OfflineOutcome::Pending => (
            None,
            format!(
                "the store agent accepted it offline as LAN task {lan_task_id} ({}); merged into this task, which \
                 carries on",
                outcome.as_str()
            ),
        ),
    };
    MergeDecision { kind: AliasKind::Merged, to, reason }
}

/// A printer of a station, as the choice of where a new task goes sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StationMember<'a> {
    pub printer_id: &'a str,
    pub enabled: bool,
    /// Driven by the store agent (transport `agent`), which can print to it offline.
    pub agent: bool,
}

/// The printer a new task for a station goes to, `members` in the station's order
/// (primary first). A task submitted to the broker goes to the first enabled printer. A
/// task taken by the store agent's LAN listener (`via_lan`) goes to the first enabled
/// printer the agent drives, falling back to the first enabled one: that is where the
/// agent prints it when it accepts it offline, so the broker's task and the agent's
/// offline one, should both exist (a forward answered after the agent gave up waiting),
/// share one printer and one delivery key, and the agent's journal prints it once. The
/// agent and the broker both call this, never a copy of it. `None`: every printer is
/// disabled (or there is none).
pub fn station_printer<'a>(members: &[StationMember<'a>], via_lan: bool) -> Option<&'a str> {
    let enabled = || members.iter().filter(|m| m.enabled);
    let first = if via_lan { enabled().find(|m| m.agent).or_else(|| enabled().next()) } else { enabled().next() };
    first.map(|m| m.printer_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_decision_is_a_legal_transition_or_none() {
        for existing in TaskState::ALL {
            for outcome in OfflineOutcome::ALL {
                for same in [true, false] {
                    let d = decide(existing, same, outcome, "L1");
                    if let Some(to) = d.to {
                        assert!(existing.can_go_to(to), "{existing} -> {to} ({outcome:?}, same {same})");
                        assert!(!existing.is_final());
                    }
                    assert!(d.reason.contains("L1"), "{d:?}");
                    assert_eq!(d.kind == AliasKind::Conflict, !same);
                }
            }
        }
    }

    #[test]
    fn the_rules_of_the_wire_spec() {
        use OfflineOutcome as O;
        use TaskState as S;
        let to = |existing, same, outcome| decide(existing, same, outcome, "L").to;
        // Rule 2: printed by the agent settles a task that is not final.
        for s in [S::Pending, S::Sent, S::Retrying, S::Failed, S::InDoubt] {
            assert_eq!(to(s, true, O::Printed), Some(S::Printed), "{s}");
        }
        assert_eq!(to(S::Printed, true, O::Printed), None);
        assert_eq!(to(S::Cancelled, true, O::Printed), None);
        // In doubt: to the attention list unless final or there already.
        for s in [S::Pending, S::Sent, S::Retrying, S::Failed] {
            assert_eq!(to(s, true, O::InDoubt), Some(S::InDoubt), "{s}");
        }
        assert_eq!(to(S::InDoubt, true, O::InDoubt), None);
        assert_eq!(to(S::Printed, true, O::InDoubt), None);
        // Pending and failed: the broker's task carries on.
        for s in TaskState::ALL {
            assert_eq!(to(s, true, O::Pending), None);
            assert_eq!(to(s, true, O::Failed), None);
        }
        // Rule 3: other content holds a task that is not final, whatever the agent did.
        for o in OfflineOutcome::ALL {
            assert_eq!(to(S::Pending, false, o), Some(S::InDoubt));
            assert_eq!(to(S::Sent, false, o), Some(S::InDoubt));
            assert_eq!(to(S::Printed, false, o), None);
            assert_eq!(to(S::InDoubt, false, o), None);
        }
        assert!(decide(S::Pending, false, O::Printed, "L9").reason.starts_with("conflicting content under one key"));
    }

    #[test]
    fn spellings_round_trip() {
        for o in OfflineOutcome::ALL {
            assert_eq!(OfflineOutcome::parse(o.as_str()), Some(o));
            assert_eq!(o.state().as_str(), o.as_str());
        }
        for k in [AliasKind::Merged, AliasKind::Conflict, AliasKind::Renamed] {
            assert_eq!(AliasKind::parse(k.as_str()), Some(k));
        }
        for r in JOURNAL_STATES {
            assert!(journal_state(r).is_some(), "{r}");
        }
        assert_eq!(journal_state("bogus"), None);
    }

    #[test]
    fn a_station_task_from_the_lan_goes_to_the_first_printer_the_agent_drives() {
        let m = |printer_id, enabled, agent| StationMember { printer_id, enabled, agent };
        let kitchen = [m("cloud", true, false), m("lan-1", false, true), m("lan-2", true, true)];
        assert_eq!(station_printer(&kitchen, false), Some("cloud"), "from the cloud: the primary");
        assert_eq!(station_printer(&kitchen, true), Some("lan-2"), "from the LAN: the first enabled agent printer");
        let cloud_only = [m("c1", false, false), m("c2", true, false)];
        assert_eq!(station_printer(&cloud_only, true), Some("c2"), "no agent printer: the first enabled");
        assert_eq!(station_printer(&[m("x", false, true)], true), None);
        assert_eq!(station_printer(&[], false), None);
    }
}
