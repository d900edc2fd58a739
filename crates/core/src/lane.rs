//! What a printer's lane does next.
//!
//! A printer's lane is its active tasks: at most one in flight (`sent`, enforced by the
//! database) and the others waiting (`pending`, `retrying`) in (priority, insertion) order. The
//! next step of a lane is decided from the pair (task in flight, first waiting task), and
//! never from the waiting head alone: a task in flight is always looked at, whatever its
//! priority, so it can be offered again to a restarted claimant or settled as in doubt
//! when its claimant went away. Deciding from the waiting head alone is how a lane
//! stalled for good once a higher-priority ticket arrived while another one was in
//! flight: the in-flight task was no longer "the head", so nobody ever looked at it again.
//!
//! The function here is pure: who holds a delivery, whether that holder can still answer
//! and what time it is are facts the engine gathers and passes in.

use crate::Millis;

/// Who holds a lane's delivery in flight, as seen by whoever looks at the lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    /// The claimant that is asking, in the same session: it has the delivery and will
    /// answer it, unless its answer is overdue.
    Me,
    /// The same claimant in an earlier session (a restarted agent process). `quiet` says
    /// whether that earlier session has certainly stopped working on it (it was not heard
    /// from for a while and was never heard after the new session appeared); while it may
    /// still be printing, the delivery stays with it.
    EarlierSession { quiet: bool },
    /// Another claimant. `gone` says it went away while someone else (the asker, or
    /// another live claimant) serves the printer now, so it will never answer.
    Other { gone: bool },
}

/// The lane's delivery in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InFlight {
    /// When its answer is due; past it, the delivery is offered again to its holder.
    pub deadline: Option<Millis>,
    pub holder: Holder,
}

/// The lane's first waiting task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiting {
    Pending,
    /// Waits for its retry time (`None`: due now).
    Retrying {
        due: Option<Millis>,
    },
}

/// Why a delivery in flight is handed out again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reoffer {
    /// The claimant restarted: its earlier session will never answer.
    Restarted,
    /// No answer before the deadline.
    Overdue,
}

/// What to do with a lane now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Hand the first waiting task to the asker as its next attempt.
    Claim,
    /// Hand the task in flight to the asker again, as a new attempt (the attempt number is
    /// the fencing token: answers for the older attempt can no longer move the task).
    Reoffer(Reoffer),
    /// The delivery in flight can never be answered by its holder and nobody can know
    /// whether it printed: settle it as in doubt (through the ack rules, which bound
    /// "reprint on doubt" by the attempt limit).
    Doubt,
    /// Nothing to do for now; look again at `until`, or when something happens (`None`).
    Wait { until: Option<Millis> },
}

/// The next step of a lane with `in_flight` and `waiting` at `now`.
///
/// While a task is in flight nothing else of the lane is handed out (one job at a time per
/// printer); a waiting task that is due goes now, one waiting for its retry keeps the
/// lane waiting (later tickets do not overtake it).
pub fn next_step(in_flight: Option<&InFlight>, waiting: Option<&Waiting>, now: Millis) -> Step {
    if let Some(f) = in_flight {
        return match f.holder {
            Holder::Me => match f.deadline {
                Some(d) if d <= now => Step::Reoffer(Reoffer::Overdue),
                d => Step::Wait { until: d },
            },
            Holder::EarlierSession { quiet: true } => Step::Reoffer(Reoffer::Restarted),
            Holder::EarlierSession { quiet: false } => Step::Wait { until: None },
            Holder::Other { gone: true } => Step::Doubt,
            Holder::Other { gone: false } => Step::Wait { until: None },
        };
    }
    match waiting {
        Some(Waiting::Pending) => Step::Claim,
        Some(Waiting::Retrying { due: None }) => Step::Claim,
        Some(Waiting::Retrying { due: Some(t) }) if *t <= now => Step::Claim,
        Some(Waiting::Retrying { due }) => Step::Wait { until: *due },
        None => Step::Wait { until: None },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn flight(holder: Holder, deadline: Option<Millis>) -> InFlight {
        InFlight { deadline, holder }
    }

    #[test]
    fn a_task_in_flight_is_looked_at_whatever_waits_behind_it() {
        // The stall: a refund waits (it would be "the head" by priority) while a prebill is
        // in flight at an agent that restarted. The step concerns the prebill.
        let waiting = Waiting::Pending;
        let f = flight(Holder::EarlierSession { quiet: true }, Some(100));
        assert_eq!(next_step(Some(&f), Some(&waiting), 50), Step::Reoffer(Reoffer::Restarted));
        let f = flight(Holder::Me, Some(100));
        assert_eq!(next_step(Some(&f), Some(&waiting), 100), Step::Reoffer(Reoffer::Overdue));
        assert_eq!(next_step(Some(&f), Some(&waiting), 99), Step::Wait { until: Some(100) });
        let f = flight(Holder::Other { gone: true }, Some(100));
        assert_eq!(next_step(Some(&f), Some(&waiting), 0), Step::Doubt);
    }

    #[test]
    fn waiting_tasks_go_when_due_and_hold_the_lane_otherwise() {
        assert_eq!(next_step(None, Some(&Waiting::Pending), 0), Step::Claim);
        assert_eq!(next_step(None, Some(&Waiting::Retrying { due: Some(10) }), 10), Step::Claim);
        assert_eq!(next_step(None, Some(&Waiting::Retrying { due: Some(10) }), 9), Step::Wait { until: Some(10) });
        assert_eq!(next_step(None, None, 0), Step::Wait { until: None });
    }

    fn any_holder() -> impl Strategy<Value = Holder> {
        prop_oneof![
            Just(Holder::Me),
            any::<bool>().prop_map(|quiet| Holder::EarlierSession { quiet }),
            any::<bool>().prop_map(|gone| Holder::Other { gone }),
        ]
    }

    proptest! {
        /// While a task is in flight, the waiting task is never handed out; and a lane
        /// always has a way forward: every state either acts or names something it waits
        /// for that the engine can observe change (a time, or a holder becoming quiet or
        /// gone).
        #[test]
        fn one_job_at_a_time_and_always_a_way_forward(
            holder in proptest::option::of(any_holder()),
            deadline in proptest::option::of(0i64..100),
            waiting in proptest::option::of(prop_oneof![
                Just(Waiting::Pending),
                proptest::option::of(0i64..100).prop_map(|due| Waiting::Retrying { due }),
            ]),
            now in 0i64..100,
        ) {
            let f = holder.map(|h| flight(h, deadline));
            let step = next_step(f.as_ref(), waiting.as_ref(), now);
            if f.is_some() {
                prop_assert_ne!(step, Step::Claim);
            }
            if let Step::Wait { until: Some(t) } = step {
                prop_assert!(t > now, "waits for a time that has come: {t} at {now}");
            }
            // Once time has passed every deadline and retry time, and every earlier
            // session is quiet and every absent holder gone, the lane moves.
            let settled = f.map(|mut f| {
                f.deadline = Some(0);
                f.holder = match f.holder {
                    Holder::EarlierSession { .. } => Holder::EarlierSession { quiet: true },
                    Holder::Other { .. } => Holder::Other { gone: true },
                    Holder::Me => Holder::Me,
                };
                f
            });
            let later = next_step(settled.as_ref(), waiting.as_ref(), 1_000);
            if settled.is_some() || waiting.is_some() {
                prop_assert!(!matches!(later, Step::Wait { .. }), "{later:?}");
            }
        }
    }
}
