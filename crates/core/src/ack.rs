//! What an acknowledgement from a printer transport does to a task: only the printer's
//! word prints it, and what may have printed goes to a person (docs/GUARANTEES.md G3, G4).
//!
//! The decision is a pure function of the task's state and attempt, the ack, and the print
//! type's policy, so it is unit- and property-tested here and the engine only carries it
//! out with a compare-and-set. An ack for an older attempt or a finished task changes
//! nothing; a repeated ack is recognised as a duplicate; a late PRINTED for a task that
//! is waiting to retry (or waiting for a human) closes it, since paper did come out.
//!
//! The one rule for doubt: an ack carries what it proves about paper
//! ([`crate::proof::Proof`], from the vendor tables of [`crate::results`]). Only a report
//! that proves nothing printed leads to another attempt; one that may have printed puts
//! the ticket in doubt (or reprints it with a banner, where the print type says so),
//! whatever it says about the printer.

use serde::{Deserialize, Serialize};

use crate::proof::Proof;
use crate::{Millis, PrintTypePolicy, TaskState};

/// The outcomes of the agent protocol (docs/API.md), shared by the broker and the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Printed,
    NoPaper,
    CoverOpen,
    Offline,
    PaperJam,
    InDoubt,
    Error,
}

impl Outcome {
    pub const ALL: [Outcome; 7] = [
        Outcome::Printed,
        Outcome::NoPaper,
        Outcome::CoverOpen,
        Outcome::Offline,
        Outcome::PaperJam,
        Outcome::InDoubt,
        Outcome::Error,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Printed => "printed",
            Outcome::NoPaper => "no_paper",
            Outcome::CoverOpen => "cover_open",
            Outcome::Offline => "offline",
            Outcome::PaperJam => "paper_jam",
            Outcome::InDoubt => "in_doubt",
            Outcome::Error => "error",
        }
    }

    pub fn parse(s: &str) -> Option<Outcome> {
        Outcome::ALL.into_iter().find(|o| o.as_str() == s)
    }

    /// Outcomes that describe the printer, not the ticket: the printer cannot print
    /// anything until a person (or the network) fixes it. Reported for a job that printed
    /// nothing ([`Proof::NotPrinted`]) they pause the printer's lane instead of spending
    /// the ticket's attempts; reported after the job may have printed, the ticket goes to
    /// a person and the lane still pauses (the printer row says why).
    pub fn pauses_lane(self) -> bool {
        matches!(self, Outcome::NoPaper | Outcome::CoverOpen | Outcome::Offline | Outcome::PaperJam)
    }

    /// Outcomes after which another attempt may print, when the report proves that
    /// nothing of this one did.
    pub fn is_recoverable(self) -> bool {
        matches!(self, Outcome::NoPaper | Outcome::CoverOpen | Outcome::Offline | Outcome::PaperJam | Outcome::Error)
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The change an ack asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct AckChange {
    pub from: TaskState,
    pub to: TaskState,
    /// Attempts after the change (unchanged by acks).
    pub attempts: i32,
    pub last_error: Option<String>,
    pub next_attempt_at: Option<Millis>,
    pub reason: String,
    /// The attempt this ack reports on may have put paper out (it does not prove that
    /// nothing printed). Once any attempt of a task may have printed, the task is never
    /// moved to another printer automatically.
    pub may_have_printed: bool,
    /// The ack was a status refusal ([`Outcome::pauses_lane`]) that waits for the printer:
    /// the task's refusal count grows, so that the offer is not counted against
    /// `max_attempts`.
    pub refused: bool,
}

impl AckChange {
    /// Whether a station task may fail over to its next printer after this change: it
    /// failed, and neither this attempt nor any earlier one (`earlier_may_have_printed`)
    /// can have printed. A task that may have printed goes to a person instead.
    pub fn allows_failover(&self, earlier_may_have_printed: bool) -> bool {
        self.to == TaskState::Failed && !self.may_have_printed && !earlier_may_have_printed
    }
}

/// What to do with one ack.
#[derive(Debug, Clone, PartialEq)]
pub enum AckDecision {
    /// Apply this compare-and-set change (expected attempts = the task's current attempts).
    Apply(AckChange),
    /// The same ack was already applied; nothing to do.
    Duplicate,
    /// For an older attempt or a finished task; changes nothing.
    Stale,
}

/// One acknowledgement as the transport reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ack {
    pub attempt: i32,
    /// What the report says about the printer.
    pub outcome: Outcome,
    pub detail: String,
    /// What the report proves about the attempt's paper.
    pub proof: Proof,
}

impl Ack {
    /// An ack whose proof follows from its outcome as the agent protocol defines it
    /// ([`Proof::of_agent_outcome`]).
    pub fn agent(attempt: i32, outcome: Outcome, detail: impl Into<String>) -> Ack {
        Ack { attempt, outcome, detail: detail.into(), proof: Proof::of_agent_outcome(outcome) }
    }

    /// What the ack proves, made consistent with its outcome: `printed` is the printer's
    /// word for paper whatever else is said, and `in_doubt` never proves anything.
    pub fn proof(&self) -> Proof {
        match (self.outcome, self.proof) {
            (Outcome::Printed, _) => Proof::Printed,
            (Outcome::InDoubt, _) | (_, Proof::Printed) => Proof::MayHavePrinted,
            (_, p) => p,
        }
    }
}

/// What an ack decision needs to know about the task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckTask {
    pub state: TaskState,
    /// Offers so far (the attempt number of the last one).
    pub attempts: i32,
    /// How many of those offers the printer refused with a status that pauses its lane;
    /// `attempts - refusals` offers reached the printer, and only those count against
    /// `max_attempts`.
    pub refusals: i32,
    /// When the task was submitted: the start of its `max_wait_ms` budget.
    pub created_at: Millis,
}

/// Decides what an ack does to `task`. `jitter_unit` is a random sample in [0, 1) for
/// the backoff.
///
/// What the ack proves about paper decides first:
/// - printed: the task is printed (also late, from `retrying`, `failed` or `in_doubt`);
/// - may have printed: in doubt, waiting for a person, or another attempt marked as a
///   reprint where the print type reprints on doubt (within its attempts);
/// - refused (nothing printed, and the same data would be refused again): failed;
/// - nothing printed: a status refusal (no paper, cover open, paper jam, offline) pauses
///   the lane: the task waits for its printer, checked again on a backoff of its
///   refusals and at once when the printer reports that it is ready, until
///   `max_wait_ms` after its submission, after which it fails with the printer's
///   reason. An error spends one of `max_attempts`.
pub fn decide(task: &AckTask, ack: &Ack, policy: &PrintTypePolicy, now: Millis, jitter_unit: f64) -> AckDecision {
    let (state, attempts) = (task.state, task.attempts);
    let (ack_attempt, outcome, detail) = (ack.attempt, ack.outcome, ack.detail.as_str());
    let proof = ack.proof();
    let reason = |what: &str| {
        if detail.is_empty() {
            format!("attempt {ack_attempt}: {what}")
        } else {
            format!("attempt {ack_attempt}: {what} ({detail})")
        }
    };
    let may_have_printed = proof == Proof::MayHavePrinted;
    let change_refused = |to: TaskState, last_error: Option<String>, next: Option<Millis>, why: String, refused| {
        AckDecision::Apply(AckChange {
            from: state,
            to,
            attempts,
            last_error,
            next_attempt_at: next,
            reason: why,
            may_have_printed,
            refused,
        })
    };
    let change = |to, last_error, next, why| change_refused(to, last_error, next, why, false);
    // Offers that reached the printer (never negative, whatever a row says).
    let delivered = (attempts - task.refusals.max(0)).max(0);
    let current = ack_attempt == attempts && ack_attempt > 0;
    // What the printer said, when it said more than "in doubt" (a stop, an error code).
    let said = if outcome == Outcome::InDoubt { String::new() } else { format!("{}; ", outcome.as_str()) };
    match (state, proof) {
        (TaskState::Sent, Proof::Printed) if ack_attempt <= attempts && ack_attempt > 0 => {
            let why = if current {
                reason("the printer confirmed it printed")
            } else {
                reason("late confirmation that it printed")
            };
            change(TaskState::Printed, None, None, why)
        }
        (TaskState::Sent, Proof::MayHavePrinted) if current => {
            if policy.reprint_on_doubt && delivered < policy.max_attempts as i32 {
                let delay = policy.backoff.delay_ms(delivered.max(1) as u32, jitter_unit);
                change(
                    TaskState::Retrying,
                    Some("in_doubt".into()),
                    Some(now + delay),
                    reason(&format!(
                        "{said}the printer may have printed it; the print type's policy is to reprint on doubt (marked as a reprint)"
                    )),
                )
            } else {
                change(
                    TaskState::InDoubt,
                    Some("in_doubt".into()),
                    None,
                    reason(&format!("{said}the printer may have printed it but cannot prove it; waiting for a person")),
                )
            }
        }
        (TaskState::Sent, Proof::Refused) if current => change(
            TaskState::Failed,
            Some("refused".into()),
            None,
            reason(&format!("{said}the printer refused the data and printed nothing; sending it again would not help")),
        ),
        (TaskState::Sent, Proof::NotPrinted) if current && outcome.pauses_lane() => {
            let o = outcome;
            let waited = (now - task.created_at).max(0);
            if waited >= policy.max_wait_ms {
                change(
                    TaskState::Failed,
                    Some(o.as_str().to_owned()),
                    None,
                    reason(&format!(
                        "{}; waited {} s for the printer, past the print type's max_wait_ms ({} ms)",
                        o.as_str(),
                        waited / 1000,
                        policy.max_wait_ms
                    )),
                )
            } else {
                let refusals = task.refusals.max(0) + 1;
                let delay = policy.backoff.delay_ms(refusals as u32, jitter_unit);
                // Never past the budget: the check at its end is what fails the ticket.
                let next = (now + delay).min(task.created_at + policy.max_wait_ms).max(now);
                change_refused(
                    TaskState::Retrying,
                    Some(o.as_str().to_owned()),
                    Some(next),
                    reason(&format!(
                        "{}; the printer's lane waits for it (asked again in {} ms, or when it reports ready)",
                        o.as_str(),
                        next - now
                    )),
                    true,
                )
            }
        }
        (TaskState::Sent, Proof::NotPrinted) if current && outcome.is_recoverable() => {
            let o = outcome;
            if delivered >= policy.max_attempts as i32 {
                change(
                    TaskState::Failed,
                    Some(o.as_str().to_owned()),
                    None,
                    reason(&format!("{}; nothing printed; no attempts left", o.as_str())),
                )
            } else {
                let delay = policy.backoff.delay_ms(delivered.max(1) as u32, jitter_unit);
                change(
                    TaskState::Retrying,
                    Some(o.as_str().to_owned()),
                    Some(now + delay),
                    reason(&format!("{}; nothing printed; retry in {} ms", o.as_str(), delay)),
                )
            }
        }
        // Paper came out after all: close a task that waits for a retry or for a person.
        (TaskState::Retrying | TaskState::Failed | TaskState::InDoubt, Proof::Printed)
            if ack_attempt <= attempts && ack_attempt > 0 =>
        {
            change(TaskState::Printed, None, None, reason("late confirmation that it printed"))
        }
        (TaskState::Printed, Proof::Printed) => AckDecision::Duplicate,
        (TaskState::Retrying | TaskState::Failed, Proof::NotPrinted) if current && outcome.is_recoverable() => {
            AckDecision::Duplicate
        }
        (TaskState::Failed, Proof::Refused) if current => AckDecision::Duplicate,
        (TaskState::InDoubt, Proof::MayHavePrinted) if current => AckDecision::Duplicate,
        (TaskState::Retrying, Proof::MayHavePrinted) if current && policy.reprint_on_doubt => AckDecision::Duplicate,
        _ => AckDecision::Stale,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PolicyTable;
    use proptest::prelude::*;

    fn ack(attempt: i32, outcome: Outcome, detail: &str) -> Ack {
        Ack::agent(attempt, outcome, detail)
    }

    fn report(attempt: i32, outcome: Outcome, proof: Proof) -> Ack {
        Ack { attempt, outcome, detail: String::new(), proof }
    }

    /// A task submitted at 0 that no printer refused yet.
    fn t(state: TaskState, attempts: i32) -> AckTask {
        AckTask { state, attempts, refusals: 0, created_at: 0 }
    }

    fn policy() -> PrintTypePolicy {
        PolicyTable::default().types["receipt"].clone()
    }

    #[test]
    fn printed_completes_a_sent_task() {
        let d = decide(&t(TaskState::Sent, 1), &ack(1, Outcome::Printed, ""), &policy(), 0, 0.0);
        let AckDecision::Apply(c) = d else { panic!("{d:?}") };
        assert_eq!((c.from, c.to, c.attempts), (TaskState::Sent, TaskState::Printed, 1));
        assert_eq!(
            decide(&t(TaskState::Printed, 1), &ack(1, Outcome::Printed, ""), &policy(), 0, 0.0),
            AckDecision::Duplicate
        );
    }

    #[test]
    fn errors_retry_with_backoff_until_the_limit() {
        let p = policy();
        let AckDecision::Apply(c) = decide(&t(TaskState::Sent, 1), &ack(1, Outcome::Error, ""), &p, 1000, 0.0) else {
            panic!()
        };
        assert_eq!(
            (c.to, c.last_error.as_deref(), c.next_attempt_at),
            (TaskState::Retrying, Some("error"), Some(2000))
        );
        assert!(!c.refused, "an error spends an attempt");
        let last = p.max_attempts as i32;
        let AckDecision::Apply(c) = decide(&t(TaskState::Sent, last), &ack(last, Outcome::Error, ""), &p, 0, 0.0)
        else {
            panic!()
        };
        assert_eq!((c.to, c.last_error.as_deref()), (TaskState::Failed, Some("error")));
        assert_eq!(
            decide(&t(TaskState::Retrying, 1), &ack(1, Outcome::NoPaper, ""), &p, 0, 0.0),
            AckDecision::Duplicate
        );
    }

    #[test]
    fn a_printer_that_cannot_print_pauses_the_ticket_without_spending_attempts() {
        let p = policy();
        let last = p.max_attempts as i32;
        // Far past max_attempts offers, all refused: it still waits, on the refusals' backoff.
        for o in [Outcome::NoPaper, Outcome::CoverOpen, Outcome::PaperJam, Outcome::Offline] {
            let task = AckTask { state: TaskState::Sent, attempts: 3 * last, refusals: 3 * last - 1, created_at: 0 };
            let AckDecision::Apply(c) = decide(&task, &ack(3 * last, o, ""), &p, 60_000, 0.0) else { panic!("{o}") };
            assert_eq!((c.to, c.last_error.as_deref()), (TaskState::Retrying, Some(o.as_str())), "{o}");
            assert!(c.refused);
            assert_eq!(c.next_attempt_at, Some(60_000 + p.backoff.cap_ms));
        }
        // The first refusal waits the backoff's first step.
        let AckDecision::Apply(c) = decide(&t(TaskState::Sent, 1), &ack(1, Outcome::NoPaper, ""), &p, 1000, 0.0) else {
            panic!()
        };
        assert_eq!(c.next_attempt_at, Some(2000));
        // The next check never lies past the budget, and at the budget the ticket fails.
        let near = p.max_wait_ms - 10;
        let AckDecision::Apply(c) = decide(&t(TaskState::Sent, 1), &ack(1, Outcome::NoPaper, ""), &p, near, 0.0) else {
            panic!()
        };
        assert_eq!(c.next_attempt_at, Some(p.max_wait_ms));
        let AckDecision::Apply(c) =
            decide(&t(TaskState::Sent, 2), &ack(2, Outcome::CoverOpen, ""), &p, p.max_wait_ms, 0.0)
        else {
            panic!()
        };
        assert_eq!((c.to, c.last_error.as_deref(), c.refused), (TaskState::Failed, Some("cover_open"), false));
        assert!(c.reason.contains("max_wait_ms"), "{}", c.reason);
    }

    #[test]
    fn only_deliveries_that_reached_the_printer_count_against_the_attempts() {
        let p = policy();
        let last = p.max_attempts as i32;
        // Ten refusals, then errors: the attempt limit counts the errors only.
        let task = |attempts| AckTask { state: TaskState::Sent, attempts, refusals: 10, created_at: 0 };
        let AckDecision::Apply(c) = decide(&task(10 + last - 1), &ack(10 + last - 1, Outcome::Error, ""), &p, 5, 0.0)
        else {
            panic!()
        };
        assert_eq!(c.to, TaskState::Retrying);
        let AckDecision::Apply(c) = decide(&task(10 + last), &ack(10 + last, Outcome::Error, ""), &p, 5, 0.0) else {
            panic!()
        };
        assert_eq!(c.to, TaskState::Failed);
    }

    #[test]
    fn doubt_waits_for_a_person_unless_the_policy_reprints() {
        let mut p = policy();
        let AckDecision::Apply(c) = decide(&t(TaskState::Sent, 1), &ack(1, Outcome::InDoubt, ""), &p, 0, 0.0) else {
            panic!()
        };
        assert_eq!(c.to, TaskState::InDoubt);
        p.reprint_on_doubt = true;
        let AckDecision::Apply(c) = decide(&t(TaskState::Sent, 1), &ack(1, Outcome::InDoubt, ""), &p, 0, 0.0) else {
            panic!()
        };
        assert_eq!(c.to, TaskState::Retrying);
        // Reprinting on doubt is bounded by the attempt limit like any retry.
        let last = p.max_attempts as i32;
        let AckDecision::Apply(c) = decide(&t(TaskState::Sent, last), &ack(last, Outcome::InDoubt, ""), &p, 0, 0.0)
        else {
            panic!()
        };
        assert_eq!(c.to, TaskState::InDoubt);
    }

    #[test]
    fn late_printed_closes_waiting_tasks_and_old_attempts_change_nothing_else() {
        let p = policy();
        for s in [TaskState::Retrying, TaskState::Failed, TaskState::InDoubt] {
            let AckDecision::Apply(c) = decide(&t(s, 2), &ack(1, Outcome::Printed, ""), &p, 0, 0.0) else {
                panic!("{s}")
            };
            assert_eq!(c.to, TaskState::Printed);
        }
        assert_eq!(decide(&t(TaskState::Sent, 2), &ack(1, Outcome::NoPaper, ""), &p, 0, 0.0), AckDecision::Stale);
        assert_eq!(decide(&t(TaskState::Cancelled, 1), &ack(1, Outcome::Printed, ""), &p, 0, 0.0), AckDecision::Stale);
        assert_eq!(
            decide(&t(TaskState::Sent, 1), &ack(2, Outcome::Printed, ""), &p, 0, 0.0),
            AckDecision::Stale,
            "from the future"
        );
    }

    #[test]
    fn only_attempts_that_prove_nothing_printed_allow_failover() {
        let p = policy();
        let last = p.max_attempts as i32;
        let AckDecision::Apply(c) =
            decide(&t(TaskState::Sent, last), &ack(last, Outcome::NoPaper, ""), &p, p.max_wait_ms, 0.0)
        else {
            panic!()
        };
        assert_eq!(c.to, TaskState::Failed);
        assert!(c.allows_failover(false));
        assert!(!c.allows_failover(true), "an earlier attempt may have printed");
        // An agent's error is reported only for a job it sent nothing of.
        let AckDecision::Apply(c) = decide(&t(TaskState::Sent, last), &ack(last, Outcome::Error, ""), &p, 0, 0.0)
        else {
            panic!()
        };
        assert_eq!(c.to, TaskState::Failed);
        assert!(c.allows_failover(false), "nothing was sent");
        // An error that may have printed never fails (or fails over): it is in doubt.
        let AckDecision::Apply(c) =
            decide(&t(TaskState::Sent, last), &report(last, Outcome::Error, Proof::MayHavePrinted), &p, 0, 0.0)
        else {
            panic!()
        };
        assert_eq!(c.to, TaskState::InDoubt);
        assert!(!c.allows_failover(false), "it may have printed");
    }

    #[test]
    fn a_report_that_may_have_printed_never_retries_whatever_it_says_about_the_printer() {
        let p = policy();
        for o in Outcome::ALL.into_iter().filter(|o| *o != Outcome::Printed) {
            let AckDecision::Apply(c) =
                decide(&t(TaskState::Sent, 1), &report(1, o, Proof::MayHavePrinted), &p, 0, 0.0)
            else {
                panic!("{o}")
            };
            assert_eq!(c.to, TaskState::InDoubt, "{o}");
            assert!(c.may_have_printed && !c.refused, "{o}");
            assert!(!c.allows_failover(false));
            // The same report again is a duplicate, not a second doubt.
            let again = AckTask { state: TaskState::InDoubt, ..t(TaskState::Sent, 1) };
            assert_eq!(decide(&again, &report(1, o, Proof::MayHavePrinted), &p, 0, 0.0), AckDecision::Duplicate);
        }
        // An ESC/POS "no paper" after the job left says what the printer is, and the reason
        // keeps it.
        let AckDecision::Apply(c) =
            decide(&t(TaskState::Sent, 2), &report(2, Outcome::NoPaper, Proof::MayHavePrinted), &p, 0, 0.0)
        else {
            panic!()
        };
        assert!(c.reason.contains("no_paper") && c.reason.contains("may have printed"), "{}", c.reason);
    }

    #[test]
    fn refused_data_fails_at_once_and_may_fail_over() {
        let p = policy();
        let AckDecision::Apply(c) =
            decide(&t(TaskState::Sent, 1), &report(1, Outcome::Error, Proof::Refused), &p, 0, 0.0)
        else {
            panic!()
        };
        assert_eq!((c.to, c.last_error.as_deref()), (TaskState::Failed, Some("refused")));
        assert!(c.allows_failover(false), "nothing printed");
        let failed = AckTask { state: TaskState::Failed, ..t(TaskState::Sent, 1) };
        assert_eq!(decide(&failed, &report(1, Outcome::Error, Proof::Refused), &p, 0, 0.0), AckDecision::Duplicate);
    }

    #[test]
    fn printed_and_in_doubt_outcomes_mean_what_they_say_whatever_proof_is_attached() {
        let a = report(1, Outcome::Printed, Proof::NotPrinted);
        assert_eq!(a.proof(), Proof::Printed);
        assert_eq!(report(1, Outcome::InDoubt, Proof::NotPrinted).proof(), Proof::MayHavePrinted);
        assert_eq!(report(1, Outcome::Error, Proof::Printed).proof(), Proof::MayHavePrinted);
    }

    /// A delivery's life after its data may have reached the printer, one report after the
    /// other: what the lane does with the task at each point.
    #[derive(Debug, Clone)]
    struct Reported {
        attempt_offset: i32,
        outcome: Outcome,
        proof: Proof,
    }

    fn any_report() -> impl Strategy<Value = Reported> {
        (-1i32..2, proptest::sample::select(Outcome::ALL.to_vec()), proptest::sample::select(Proof::ALL.to_vec()))
            .prop_map(|(attempt_offset, outcome, proof)| Reported { attempt_offset, outcome, proof })
    }

    proptest! {
        /// No sequence of reports after a job's data left produces a second delivery of the
        /// same data unless one of them proved that nothing printed: the task is in the
        /// lane again (`pending`/`retrying`, so a claim hands it out) only after a
        /// `NotPrinted` report, or as the print type's reprint on doubt, which is marked
        /// (`last_error` = `in_doubt`, the reprint banner).
        #[test]
        fn no_second_delivery_after_a_fetch_without_proof(
            reports in proptest::collection::vec(any_report(), 1..12),
            reprint in any::<bool>(), unit in 0.0f64..1.0, attempt in 1i32..4,
        ) {
            let mut p = policy();
            p.reprint_on_doubt = reprint;
            // Attempt `attempt` is out, its data fetched: from here on it may have printed.
            let mut task = AckTask { state: TaskState::Sent, attempts: attempt, refusals: 0, created_at: 0 };
            let mut last_error: Option<String> = None;
            let mut proved_nothing = false;
            for (i, r) in reports.iter().enumerate() {
                let a = Ack { attempt: attempt + r.attempt_offset, outcome: r.outcome, detail: String::new(), proof: r.proof };
                if let AckDecision::Apply(c) = decide(&task, &a, &p, i as i64 * 1000, unit) {
                    if a.proof() == Proof::NotPrinted && c.to != TaskState::Printed {
                        proved_nothing = true;
                    }
                    task.state = c.to;
                    task.refusals += i32::from(c.refused);
                    last_error = c.last_error;
                }
                if task.state.in_lane() && task.state != TaskState::Sent {
                    let marked_reprint = reprint && last_error.as_deref() == Some("in_doubt");
                    prop_assert!(proved_nothing || marked_reprint,
                        "handed out again without proof after {:?}: {:?} ({:?})", &reports[..=i], task.state, last_error);
                }
            }
        }
    }

    fn any_state() -> impl Strategy<Value = TaskState> {
        proptest::sample::select(TaskState::ALL.to_vec())
    }
    fn any_outcome() -> impl Strategy<Value = Outcome> {
        proptest::sample::select(Outcome::ALL.to_vec())
    }
    fn any_proof() -> impl Strategy<Value = Proof> {
        proptest::sample::select(Proof::ALL.to_vec())
    }

    proptest! {
        /// Every change an ack asks for is in the transition table, never leaves an end
        /// state, and keeps the attempt count.
        #[test]
        fn acks_only_ask_for_legal_transitions(
            state in any_state(), attempts in 0i32..8, ack_attempt in -1i32..9, refusals in -1i32..9,
            outcome in any_outcome(), proof in any_proof(), reprint in any::<bool>(), unit in 0.0f64..1.0,
            now in 0i64..1_000_000,
        ) {
            let mut p = policy();
            p.reprint_on_doubt = reprint;
            let task = AckTask { state, attempts, refusals, created_at: 0 };
            let a = Ack { attempt: ack_attempt, outcome, detail: "d".into(), proof };
            match decide(&task, &a, &p, now, unit) {
                AckDecision::Apply(c) => {
                    prop_assert!(state.can_go_to(c.to), "{} -> {}", state, c.to);
                    prop_assert_eq!(c.from, state);
                    prop_assert_eq!(c.attempts, attempts);
                    prop_assert!(ack_attempt >= 1 && ack_attempt <= attempts);
                    if c.to == TaskState::Retrying { prop_assert!(c.next_attempt_at.is_some()); }
                    // A refusal pauses, within the budget, and never ends the ticket early.
                    prop_assert_eq!(c.refused, outcome.pauses_lane() && c.to == TaskState::Retrying
                        && a.proof() == Proof::NotPrinted);
                    prop_assert_eq!(c.may_have_printed, a.proof() == Proof::MayHavePrinted);
                    if c.refused {
                        prop_assert!(now < p.max_wait_ms);
                        prop_assert!(c.next_attempt_at.is_some_and(|n| n >= now && n <= p.max_wait_ms));
                    }
                    if outcome.pauses_lane() && a.proof() == Proof::NotPrinted && c.to == TaskState::Failed {
                        prop_assert!(now >= p.max_wait_ms, "failed a paused ticket inside its budget");
                    }
                }
                AckDecision::Duplicate | AckDecision::Stale => {}
            }
        }
    }
}
