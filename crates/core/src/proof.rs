//! What a report about one delivery attempt proves about paper: the one rule for doubt on
//! every transport.
//!
//! Once an attempt's data may have reached the printer, the only report that allows
//! another delivery of the same ticket is one that proves nothing of it printed. Every
//! transport classifies what its printers say with the tables of [`crate::results`] (one
//! row per documented code, unknown codes may have printed) into an [`Outcome`] — what
//! the report says about the *printer*, which decides whether its lane pauses — and a
//! [`Proof`] — what it says about the *paper*, which decides what happens to the ticket
//! (`crate::ack::decide`). The two are separate because one report can say both: "out
//! of paper" after the printer took the job pauses the lane *and* may have cut a slip
//! short.

use serde::{Deserialize, Serialize};

use crate::ack::Outcome;
use crate::Millis;

/// What a report proves about the paper of the attempt it is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Proof {
    /// The printer says this attempt printed.
    Printed,
    /// Nothing of this attempt reached paper, and another attempt may print it: the
    /// printer stopped before the job began, the data never left the broker, a download
    /// that did not complete. Only such a report leads to another delivery.
    NotPrinted,
    /// Nothing of this attempt reached paper, and another attempt with the same data would
    /// fail the same way: the printer refused the data (a media type it does not take, a
    /// document it cannot read, data over its size limit). The ticket fails at once; since
    /// nothing printed, a station may fail it over.
    Refused,
    /// Anything else, and every code a vendor does not document: the attempt's data may
    /// have reached paper, in whole or in part. The ticket goes to a person (`in_doubt`),
    /// or is reprinted with a banner where its print type says so; never delivered again
    /// unmarked.
    MayHavePrinted,
}

impl Proof {
    pub const ALL: [Proof; 4] = [Proof::Printed, Proof::NotPrinted, Proof::Refused, Proof::MayHavePrinted];

    pub fn as_str(self) -> &'static str {
        match self {
            Proof::Printed => "printed",
            Proof::NotPrinted => "not_printed",
            Proof::Refused => "refused",
            Proof::MayHavePrinted => "may_have_printed",
        }
    }

    /// What a store agent's outcome proves (docs/API.md, "The store agent protocol"). The
    /// agent reads the printer's status before it sends a byte of a job and reports every failure
    /// after the first byte as `in_doubt` (`docs/RESULT-CODES.md`, "Store agent"), so each
    /// of its other outcomes is reported only for a job it sent nothing of.
    pub fn of_agent_outcome(outcome: Outcome) -> Proof {
        match outcome {
            Outcome::Printed => Proof::Printed,
            Outcome::InDoubt => Proof::MayHavePrinted,
            Outcome::NoPaper | Outcome::CoverOpen | Outcome::PaperJam | Outcome::Offline | Outcome::Error => {
                Proof::NotPrinted
            }
        }
    }

    /// A printer that reports it stopped for paper, its cover or a jam after it was given
    /// a job may have cut that job short ([`Proof::MayHavePrinted`] in the vendor tables).
    /// When the printer had already reported itself stopped *before* the job was handed to
    /// it, and nothing cleared that since, the job met a printer that could not print: it
    /// answers with an error before printing (Epson, ePOS-Print XML User's Manual,
    /// `<response>`: "An error occurred: Return an error response before printing"), and
    /// the report proves nothing printed. This is how a printer with an empty roll gets one
    /// ticket in doubt (the one it was printing when the roll ended) and not one per
    /// ticket handed to it until the paper is changed.
    ///
    /// `stopped_since` is when the printer's current stop was first reported (`None`: it
    /// is not stopped), `handed_out_at` when this attempt was handed out. A stop reported
    /// in the same millisecond counts as after the hand-out.
    pub fn given_stop_before_hand_out(
        self,
        outcome: Outcome,
        stopped_since: Option<Millis>,
        handed_out_at: Option<Millis>,
    ) -> Proof {
        let stops = matches!(outcome, Outcome::NoPaper | Outcome::CoverOpen | Outcome::PaperJam);
        match (self, stopped_since, handed_out_at) {
            (Proof::MayHavePrinted, Some(stopped), Some(handed)) if stops && stopped < handed => Proof::NotPrinted,
            (p, _, _) => p,
        }
    }
}

impl std::fmt::Display for Proof {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_reports_everything_after_the_first_byte_as_doubt() {
        for o in Outcome::ALL {
            let p = Proof::of_agent_outcome(o);
            match o {
                Outcome::Printed => assert_eq!(p, Proof::Printed),
                Outcome::InDoubt => assert_eq!(p, Proof::MayHavePrinted),
                _ => assert_eq!(p, Proof::NotPrinted, "{o}"),
            }
        }
    }

    #[test]
    fn a_stop_proves_nothing_printed_only_when_it_was_known_before_the_hand_out() {
        let may = Proof::MayHavePrinted;
        assert_eq!(may.given_stop_before_hand_out(Outcome::NoPaper, Some(10), Some(20)), Proof::NotPrinted);
        assert_eq!(may.given_stop_before_hand_out(Outcome::CoverOpen, Some(10), Some(20)), Proof::NotPrinted);
        // Reported after (or in the same millisecond as) the hand-out: the roll ended in the job.
        assert_eq!(may.given_stop_before_hand_out(Outcome::NoPaper, Some(20), Some(20)), may);
        assert_eq!(may.given_stop_before_hand_out(Outcome::NoPaper, Some(30), Some(20)), may);
        assert_eq!(may.given_stop_before_hand_out(Outcome::NoPaper, None, Some(20)), may);
        // Only stops: an autocutter or mechanical error proves nothing, whenever it began.
        assert_eq!(may.given_stop_before_hand_out(Outcome::Error, Some(10), Some(20)), may);
        assert_eq!(may.given_stop_before_hand_out(Outcome::InDoubt, Some(10), Some(20)), may);
        // Nothing else is changed.
        for p in [Proof::Printed, Proof::NotPrinted, Proof::Refused] {
            assert_eq!(p.given_stop_before_hand_out(Outcome::NoPaper, Some(10), Some(20)), p);
        }
    }
}
