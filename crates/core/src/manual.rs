//! The manual channel (R26): what an operator may do to a task in which state. "The system
//! solves 99 %, people solve 1 %" — and the 1 % must never create a duplicate or lose the
//! paper trail, so each action is allowed only where it cannot do either.

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

/// An action the task's state does not allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{action} is not possible for a task in state {state}; it is possible from: {allowed}")]
pub struct NotAllowed {
    pub action: &'static str,
    pub state: TaskState,
    pub allowed: String,
}

/// What the action does to the task itself: `Some(state)` moves it there, `None` leaves it
/// unchanged (a reprint of a printed task).
pub fn original_goes_to(action: ManualAction, from: TaskState) -> Result<Option<TaskState>, NotAllowed> {
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
            allowed: allowed.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "),
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

    #[test]
    fn every_allowed_move_is_a_legal_transition() {
        for a in ACTIONS {
            for s in TaskState::ALL {
                if let Ok(Some(to)) = original_goes_to(a, s) {
                    assert!(s.can_go_to(to), "{} from {s} -> {to}", a.as_str());
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
    fn the_rules_of_the_issue() {
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
