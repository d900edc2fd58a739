//! The task state machine. Every legal transition is listed once, in [`TRANSITIONS`];
//! storage backends and the engine ask [`TaskState::check`] before they write, and the
//! stores additionally compare-and-set on (state, attempt) so that a stale actor can never
//! move a task that someone else already moved.

use serde::{Deserialize, Serialize};

/// Where a task is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    /// Accepted and durable, waiting for its printer's lane.
    Pending,
    /// Handed to a transport; only a PRINTED acknowledgement completes it.
    Sent,
    /// A recoverable failure happened; waits until `next_attempt_at`, then is sent again.
    Retrying,
    /// The printer confirmed paper came out. End state.
    Printed,
    /// Attempts exhausted; needs a human.
    Failed,
    /// The printer may have printed but never said so; waits for a human.
    InDoubt,
    /// Failover moved the work to another printer's task. End state.
    Transferred,
    /// Cancelled by an operator, ledger refunded. End state.
    Cancelled,
    /// Resolved by an operator without printing ("mark printed"). End state.
    Closed,
}

/// Every legal (from, to) pair, with the reason it exists. Anything not listed is illegal.
pub const TRANSITIONS: &[(TaskState, TaskState, &str)] = {
    use TaskState::*;
    &[
        (Pending, Sent, "dispatched to the printer's transport"),
        (Sent, Sent, "offered again to the same agent, which answers from its journal"),
        (Pending, Cancelled, "cancelled before it was sent"),
        (Pending, Transferred, "failover before it was sent"),
        (Pending, Failed, "waited past its print type's max_wait_ms for a printer that is paused or silent"),
        (Sent, Printed, "the printer acknowledged paper out"),
        (Sent, Retrying, "recoverable failure, another attempt is due"),
        (Sent, Failed, "attempts exhausted"),
        (Sent, InDoubt, "the printer may have printed but cannot prove it"),
        (Retrying, Sent, "next attempt dispatched"),
        (Retrying, Failed, "attempts exhausted while waiting"),
        (Retrying, Cancelled, "cancelled while waiting to retry"),
        (Retrying, Transferred, "failover while waiting to retry"),
        (Retrying, Printed, "a late acknowledgement proved the earlier attempt printed"),
        (Failed, Printed, "a late acknowledgement proved paper came out"),
        (Failed, Closed, "an operator marked it printed"),
        (Failed, Cancelled, "an operator cancelled it"),
        (Failed, Transferred, "an operator or failover moved it to another printer"),
        (Failed, Retrying, "an operator asked for another attempt"),
        (InDoubt, Printed, "a late acknowledgement proved paper came out"),
        (InDoubt, Closed, "an operator marked it printed"),
        (InDoubt, Cancelled, "an operator cancelled it"),
        (InDoubt, Retrying, "reprint on doubt (policy) or an operator's decision"),
        // The store agent accepted the same order on the shop's LAN while the
        // broker was unreachable and reports it when it is back (`crate::offline`). Its
        // journal proves paper came out, or says it may have, for a task the broker had
        // not sent yet or was retrying; and a task the LAN accepted with other content
        // under the same key must not print until a person looked.
        (Pending, Printed, "the store agent printed it offline under its own LAN task id (offline sync)"),
        (Pending, InDoubt, "the store agent may have printed it offline, or took other content under its key"),
        (Retrying, InDoubt, "the store agent may have printed it offline, or took other content under its key"),
        (Failed, InDoubt, "the store agent may have printed it offline, or took other content under its key"),
    ]
};

/// A transition that the table does not allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a task cannot go from {from} to {to}")]
pub struct TransitionError {
    pub from: TaskState,
    pub to: TaskState,
}

impl TaskState {
    /// All states, in lifecycle order (for metrics and documentation).
    pub const ALL: [TaskState; 9] = [
        TaskState::Pending,
        TaskState::Sent,
        TaskState::Retrying,
        TaskState::Printed,
        TaskState::Failed,
        TaskState::InDoubt,
        TaskState::Transferred,
        TaskState::Cancelled,
        TaskState::Closed,
    ];

    /// The wire and database spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Pending => "pending",
            TaskState::Sent => "sent",
            TaskState::Retrying => "retrying",
            TaskState::Printed => "printed",
            TaskState::Failed => "failed",
            TaskState::InDoubt => "in_doubt",
            TaskState::Transferred => "transferred",
            TaskState::Cancelled => "cancelled",
            TaskState::Closed => "closed",
        }
    }

    /// Parses the wire and database spelling.
    pub fn parse(s: &str) -> Option<TaskState> {
        TaskState::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// End states never change again.
    pub fn is_final(self) -> bool {
        matches!(self, TaskState::Printed | TaskState::Transferred | TaskState::Cancelled | TaskState::Closed)
    }

    /// Whether a task in this state is in its printer's lane (waiting or in flight): the
    /// states of the lane index. A task leaving them frees its lane for the next.
    pub fn in_lane(self) -> bool {
        matches!(self, TaskState::Pending | TaskState::Sent | TaskState::Retrying)
    }

    /// Whether `self → to` is in the transition table.
    pub fn can_go_to(self, to: TaskState) -> bool {
        TRANSITIONS.iter().any(|(f, t, _)| *f == self && *t == to)
    }

    /// Like [`TaskState::can_go_to`] but as a `Result` for `?`.
    pub fn check(self, to: TaskState) -> Result<(), TransitionError> {
        if self.can_go_to(to) {
            Ok(())
        } else {
            Err(TransitionError { from: self, to })
        }
    }
}

impl std::fmt::Display for TaskState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn final_states_have_no_way_out() {
        for (from, to, _) in TRANSITIONS {
            assert!(!from.is_final(), "{from} -> {to} leaves an end state");
            // The one self-loop is a redelivery of the same attempt, audited as sent → sent.
            assert!(from != to || *from == TaskState::Sent, "self-loop {from}");
        }
    }

    #[test]
    fn spelling_round_trips() {
        for s in TaskState::ALL {
            assert_eq!(TaskState::parse(s.as_str()), Some(s));
            assert_eq!(serde_json::to_value(s).unwrap(), serde_json::json!(s.as_str()));
        }
        assert_eq!(TaskState::parse("PENDING"), None);
    }

    #[test]
    fn printed_is_reachable_only_through_an_acknowledgement_path() {
        assert!(TaskState::Sent.can_go_to(TaskState::Printed));
        assert!(!TaskState::Printed.can_go_to(TaskState::Sent));
        // A task that was never sent prints only by the store agent's own proof, reported
        // by the offline sync; that is the one reason the table gives.
        let unsent: Vec<&str> = TRANSITIONS
            .iter()
            .filter(|(f, t, _)| *f == TaskState::Pending && *t == TaskState::Printed)
            .map(|(_, _, why)| *why)
            .collect();
        assert_eq!(unsent.len(), 1);
        assert!(unsent[0].contains("offline"), "{unsent:?}");
    }

    fn any_state() -> impl Strategy<Value = TaskState> {
        proptest::sample::select(TaskState::ALL.to_vec())
    }

    proptest! {
        /// Walking any sequence of requested transitions through `check` never leaves an
        /// end state and never performs a transition missing from the table.
        #[test]
        fn random_walks_respect_the_table(steps in proptest::collection::vec(any_state(), 0..64)) {
            let mut cur = TaskState::Pending;
            for to in steps {
                let was_final = cur.is_final();
                match cur.check(to) {
                    Ok(()) => {
                        prop_assert!(!was_final);
                        prop_assert!(TRANSITIONS.iter().any(|(f, t, _)| *f == cur && *t == to));
                        cur = to;
                    }
                    Err(e) => prop_assert_eq!(e, TransitionError { from: cur, to }),
                }
            }
        }
    }
}
