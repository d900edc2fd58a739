//! The manual channel: what an operator may do to a task in which state. "The system
//! solves 99 %, people solve 1 %" — and the 1 % must never create a duplicate or lose the
//! paper trail, so each action is allowed only where it cannot do either.
//!
//! Manual actions follow the one rule for doubt: a ticket that may have printed
//! (any of its attempts ended without proof that nothing came out: `may_have_printed`)
//! is printed again only as a numbered reprint with a banner, never moved unmarked to
//! another printer.

use crate::TaskState;

/// An operator's action on a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManualAction {
    /// Print again, as a numbered reprint attached to the original.
    Reprint,
    /// Close a failed or in-doubt task without printing (the paper is known to exist).
    MarkPrinted,
    /// Stop a task that has not printed and refund its charge.
    Cancel,
    /// Move an unprinted task to another printer of the same store.
    Transfer,
}

impl ManualAction {
    pub fn as_str(self) -> &'static str {
        match self {
            ManualAction::Reprint => "reprint",
            ManualAction::MarkPrinted => "mark-printed",
            ManualAction::Cancel => "cancel",
            ManualAction::Transfer => "transfer",
        }
    }
}

/// An action the task does not allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{action} is not possible for a task in state {state}: {why}")]
pub struct NotAllowed {
    pub action: &'static str,
    pub state: TaskState,
    /// Why, and what is possible instead.
    pub why: String,
}

/// What an action needs to know about the task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ManualTask {
    pub state: TaskState,
    /// An attempt of it may have printed (`tasks.may_have_printed`).
    pub may_have_printed: bool,
}

/// What the action does to the task itself: `Some(state)` moves it there, `None` leaves it
/// unchanged (a reprint of a printed task).
pub fn original_goes_to(action: ManualAction, task: ManualTask) -> Result<Option<TaskState>, NotAllowed> {
    let from = task.state;
    use TaskState::*;
    let (allowed, to): (&[TaskState], Option<TaskState>) = match action {
        // A printed or closed task keeps its state; a failed or doubtful one is resolved by
        // the reprint. Never while it may still be printing (pending, sent, retrying).
        ManualAction::Reprint => match from {
            Printed | Closed => (&[Printed, Closed, Failed, InDoubt], None),
            _ => (&[Printed, Closed, Failed, InDoubt], Some(Closed)),
        },
        ManualAction::MarkPrinted => (&[Failed, InDoubt], Some(Closed)),
        // Not while `sent`: the job may be on its way to the paper right now.
        ManualAction::Cancel => (&[Pending, Retrying, Failed, InDoubt], Some(Cancelled)),
        // Not in doubt: it may have printed; reprint or mark printed decide that case.
        ManualAction::Transfer => (&[Pending, Retrying, Failed], Some(Transferred)),
    };
    if !allowed.contains(&from) {
        return Err(NotAllowed {
            action: action.as_str(),
            state: from,
            why: format!("it is possible from: {}", allowed.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")),
        });
    }
    if action == ManualAction::Transfer && task.may_have_printed {
        // The successor would print the ticket a second time, unmarked, on another printer.
        return Err(NotAllowed {
            action: action.as_str(),
            state: from,
            why: "an attempt of it may have printed (it ended without proof that nothing came out); \
                  reprint it instead (a numbered copy with a REPRINT banner, on any printer of the store), \
                  or mark it printed if the paper is there"
                .into(),
        });
    }
    if let Some(to) = to {
        // Every move an action makes is in the one transition table.
        debug_assert!(from.can_go_to(to), "{from} -> {to}");
    }
    Ok(to)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ACTIONS: [ManualAction; 4] =
        [ManualAction::Reprint, ManualAction::MarkPrinted, ManualAction::Cancel, ManualAction::Transfer];

    fn t(state: TaskState) -> ManualTask {
        ManualTask { state, may_have_printed: false }
    }

    fn original_goes_to(a: ManualAction, s: TaskState) -> Result<Option<TaskState>, NotAllowed> {
        super::original_goes_to(a, t(s))
    }

    #[test]
    fn every_allowed_move_is_a_legal_transition() {
        for a in ACTIONS {
            for s in TaskState::ALL {
                for may in [false, true] {
                    if let Ok(Some(to)) = super::original_goes_to(a, ManualTask { state: s, may_have_printed: may }) {
                        assert!(s.can_go_to(to), "{} from {s} -> {to}", a.as_str());
                    }
                }
            }
        }
    }

    #[test]
    fn nothing_is_done_to_a_task_that_may_be_printing() {
        for a in ACTIONS {
            let e = original_goes_to(a, TaskState::Sent).unwrap_err();
            assert_eq!(e.state, TaskState::Sent);
            assert!(e.to_string().contains("sent"), "{e}");
        }
    }

    #[test]
    fn a_ticket_that_may_have_printed_is_never_moved_unmarked() {
        for s in TaskState::ALL {
            let may = ManualTask { state: s, may_have_printed: true };
            let e = super::original_goes_to(ManualAction::Transfer, may).expect_err("never a transfer");
            if original_goes_to(ManualAction::Transfer, s).is_ok() {
                assert!(e.to_string().contains("reprint"), "{e}");
            }
            // Everything else is as for any task in that state.
            for a in [ManualAction::Reprint, ManualAction::MarkPrinted, ManualAction::Cancel] {
                assert_eq!(super::original_goes_to(a, may), original_goes_to(a, s), "{} from {s}", a.as_str());
            }
        }
    }

    #[test]
    fn each_action_goes_where_the_manual_channel_allows() {
        use TaskState::*;
        assert_eq!(original_goes_to(ManualAction::MarkPrinted, InDoubt), Ok(Some(Closed)));
        assert!(original_goes_to(ManualAction::MarkPrinted, Printed).is_err());
        assert_eq!(original_goes_to(ManualAction::Cancel, Pending), Ok(Some(Cancelled)));
        assert!(original_goes_to(ManualAction::Cancel, Printed).is_err());
        assert_eq!(original_goes_to(ManualAction::Reprint, Printed), Ok(None));
        assert_eq!(original_goes_to(ManualAction::Reprint, InDoubt), Ok(Some(Closed)));
        assert!(original_goes_to(ManualAction::Reprint, Pending).is_err());
        assert_eq!(original_goes_to(ManualAction::Transfer, Failed), Ok(Some(Transferred)));
        assert!(original_goes_to(ManualAction::Transfer, InDoubt).is_err());
        assert!(original_goes_to(ManualAction::Transfer, Cancelled).is_err());
    }
}
