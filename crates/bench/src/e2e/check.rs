//! The verdict of an end-to-end run: the paper log against the broker's task list.
//!
//! Paper is the truth. Every task must be on paper exactly once; the broker must call
//! every task `printed`. The one allowed exception is the crash the bench caused itself:
//! after `kill -9` of the agent, a job that was on its way to a printer cannot be proven
//! printed or not, and the contract says such a task is `in_doubt` (left to a person),
//! never printed a second time — at most one per printer, the one each printer had in
//! flight.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::paper::Tally;

/// How many examples a finding lists.
const EXAMPLES: usize = 5;

pub use crate::verify::ListedTask;

/// A task the broker left `in_doubt`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InDoubtTask {
    pub biz_no: String,
    pub task_id: String,
    pub printer_id: String,
    /// Whether its marker is on paper (it may well have printed: that is the doubt).
    pub on_paper: bool,
}

/// What the paper log and the task list say, side by side.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DeliveryCheck {
    /// Jobs in the paper log.
    pub paper_jobs: usize,
    /// Tasks whose marker is on paper at least once.
    pub printed_on_paper: usize,
    /// Tasks on paper more than once, and the extra sheets they took.
    pub duplicated_tasks: usize,
    pub extra_sheets: usize,
    /// Tasks not on paper at all, and how many of those the broker calls `in_doubt`.
    pub missing: usize,
    pub missing_in_doubt: usize,
    /// Jobs without a marker, markers of no task of this run, unreadable lines.
    pub stray_jobs: usize,
    /// Tasks per state in the broker's list.
    pub states: BTreeMap<String, usize>,
    pub in_doubt: Vec<InDoubtTask>,
}

/// The task number in a bench `biz_no` (`E<n>`).
pub fn marker_of(biz_no: &str) -> Option<u32> {
    let digits = biz_no.strip_prefix('E')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

fn examples<T>(items: impl IntoIterator<Item = T>, f: impl Fn(T) -> String) -> String {
    items.into_iter().take(EXAMPLES).map(f).collect::<Vec<_>>().join(", ")
}

/// Compares the paper log (`tally`, for tasks `0..tally.counts.len()`) with the broker's
/// list of the store's tasks. Findings go to `problems`. `agent_killed`: the run killed
/// the agent, so `in_doubt` tasks are allowed, one per printer at most.
pub fn check_delivery(
    tally: &Tally,
    listed: &[ListedTask],
    agent_killed: bool,
    problems: &mut Vec<String>,
) -> DeliveryCheck {
    let tasks = tally.counts.len();
    let mut out = DeliveryCheck {
        paper_jobs: tally.lines,
        printed_on_paper: tally.distinct,
        extra_sheets: tally.extra_prints(),
        stray_jobs: tally.unmarked + tally.foreign + tally.malformed,
        ..DeliveryCheck::default()
    };

    // The broker's side, by task number.
    let mut by_marker: HashMap<u32, &ListedTask> = HashMap::with_capacity(listed.len());
    let mut unknown = Vec::new();
    let mut doubled = Vec::new();
    for t in listed {
        *out.states.entry(t.state.clone()).or_default() += 1;
        match marker_of(&t.biz_no).filter(|&m| (m as usize) < tasks) {
            None => unknown.push(t.biz_no.as_str()),
            Some(m) => {
                if by_marker.insert(m, t).is_some() {
                    doubled.push(t.biz_no.as_str());
                }
            }
        }
    }
    if listed.len() != tasks {
        problems.push(format!("the broker lists {} tasks for the store, {tasks} were submitted", listed.len()));
    }
    if !unknown.is_empty() {
        problems.push(format!(
            "{} listed tasks are none of this run's, e.g. {}",
            unknown.len(),
            examples(&unknown, |b| b.to_string())
        ));
    }
    if !doubled.is_empty() {
        problems.push(format!(
            "{} biz_nos are stored twice, e.g. {}",
            doubled.len(),
            examples(&doubled, |b| b.to_string())
        ));
    }

    // Paper against the list.
    let duplicates = tally.duplicates();
    out.duplicated_tasks = duplicates.len();
    if !duplicates.is_empty() {
        problems.push(format!(
            "{} tasks were printed more than once ({} extra sheets), e.g. {}",
            duplicates.len(),
            out.extra_sheets,
            examples(&duplicates, |(m, c)| format!("E{m} ×{c}"))
        ));
    }
    let missing = tally.missing();
    out.missing = missing.len();
    let state_of = |m: u32| by_marker.get(&m).map_or("not listed", |t| t.state.as_str());
    let lost: Vec<u32> = missing.iter().copied().filter(|&m| state_of(m) != "in_doubt").collect();
    out.missing_in_doubt = missing.len() - lost.len();
    if !lost.is_empty() {
        problems.push(format!(
            "{} tasks never came out of a printer, e.g. {}",
            lost.len(),
            examples(&lost, |&m| format!("E{m} ({})", state_of(m)))
        ));
    }
    tally.report_strays(problems);

    // States: `printed` everywhere, `in_doubt` only where the bench crashed the agent.
    for (state, n) in &out.states {
        if state != "printed" && state != "in_doubt" {
            let which: Vec<&str> = listed.iter().filter(|t| &t.state == state).map(|t| t.biz_no.as_str()).collect();
            problems.push(format!("{n} tasks ended `{state}`, e.g. {}", examples(&which, |b| b.to_string())));
        }
    }
    let mut in_doubt: Vec<InDoubtTask> = listed
        .iter()
        .filter(|t| t.state == "in_doubt")
        .map(|t| InDoubtTask {
            biz_no: t.biz_no.clone(),
            task_id: t.task_id.clone(),
            printer_id: t.printer_id.clone(),
            on_paper: marker_of(&t.biz_no).is_some_and(|m| tally.counts.get(m as usize).is_some_and(|&c| c > 0)),
        })
        .collect();
    in_doubt.sort_by(|a, b| (marker_of(&a.biz_no), &a.biz_no).cmp(&(marker_of(&b.biz_no), &b.biz_no)));
    if !in_doubt.is_empty() {
        if !agent_killed {
            problems.push(format!(
                "{} tasks are in_doubt although nothing crashed, e.g. {}",
                in_doubt.len(),
                examples(&in_doubt, |t| t.biz_no.clone())
            ));
        } else {
            let mut per_printer: BTreeMap<&str, usize> = BTreeMap::new();
            for t in &in_doubt {
                *per_printer.entry(t.printer_id.as_str()).or_default() += 1;
            }
            let crowded: Vec<(&str, usize)> = per_printer.into_iter().filter(|(_, n)| *n > 1).collect();
            if !crowded.is_empty() {
                problems.push(format!(
                    "{} printers have more than one in_doubt task (at most the one in flight at the kill may be), e.g. {}",
                    crowded.len(),
                    examples(&crowded, |(p, n)| format!("{p} ×{n}"))
                ));
            }
        }
    }
    out.in_doubt = in_doubt;
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paper::PaperLine;

    fn tally(prints: &[(u32, u32)], tasks: usize) -> Tally {
        Tally::with_prints(prints, tasks)
    }

    fn listed(states: &[&str], printers: usize) -> Vec<ListedTask> {
        states
            .iter()
            .enumerate()
            .map(|(n, s)| ListedTask {
                biz_no: format!("E{n}"),
                task_id: format!("t{n}"),
                printer_id: format!("p{}", n % printers),
                state: s.to_string(),
                ..ListedTask::default()
            })
            .collect()
    }

    #[test]
    fn biz_numbers_map_to_markers() {
        assert_eq!(marker_of("E0"), Some(0));
        assert_eq!(marker_of("E49999"), Some(49_999));
        for bad in ["E", "B1", "E-1", "E1x", "e1", ""] {
            assert_eq!(marker_of(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_clean_run_passes() {
        let t = tally(&[(0, 1), (1, 1), (2, 1)], 3);
        let mut problems = Vec::new();
        let c = check_delivery(&t, &listed(&["printed"; 3], 2), false, &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!((c.printed_on_paper, c.missing, c.duplicated_tasks, c.extra_sheets), (3, 0, 0, 0));
        assert_eq!(c.states.get("printed"), Some(&3));
    }

    #[test]
    fn duplicates_and_missing_are_problems() {
        // E1 printed twice, E2 never although the broker says printed.
        let t = tally(&[(0, 1), (1, 2)], 3);
        let mut problems = Vec::new();
        let c = check_delivery(&t, &listed(&["printed"; 3], 2), false, &mut problems);
        assert_eq!((c.duplicated_tasks, c.extra_sheets, c.missing, c.missing_in_doubt), (1, 1, 1, 0));
        let all = problems.join("\n");
        assert!(all.contains("printed more than once") && all.contains("E1 ×2"), "{all}");
        assert!(all.contains("never came out") && all.contains("E2 (printed)"), "{all}");
    }

    #[test]
    fn in_doubt_is_a_problem_without_a_crash() {
        let t = tally(&[(0, 1), (1, 1)], 3);
        let mut problems = Vec::new();
        let c = check_delivery(&t, &listed(&["printed", "printed", "in_doubt"], 2), false, &mut problems);
        assert_eq!((c.missing, c.missing_in_doubt), (1, 1));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("although nothing crashed"), "{problems:?}");
    }

    #[test]
    fn after_a_crash_one_in_doubt_per_printer_is_allowed() {
        // Four tasks on two printers: E2 (p0) in doubt and not on paper, E3 (p1) in doubt
        // but printed: both fine after a kill.
        let t = tally(&[(0, 1), (1, 1), (3, 1)], 4);
        let states = ["printed", "printed", "in_doubt", "in_doubt"];
        let mut problems = Vec::new();
        let c = check_delivery(&t, &listed(&states, 2), true, &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(c.in_doubt.len(), 2);
        assert_eq!((c.in_doubt[0].biz_no.as_str(), c.in_doubt[0].on_paper), ("E2", false));
        assert_eq!((c.in_doubt[1].printer_id.as_str(), c.in_doubt[1].on_paper), ("p1", true));

        // Two in doubt on the same printer is more than one job in flight could explain.
        let states = ["in_doubt", "printed", "in_doubt", "printed"];
        let t = tally(&[(1, 1), (3, 1)], 4);
        let mut problems = Vec::new();
        check_delivery(&t, &listed(&states, 2), true, &mut problems);
        assert!(problems.iter().any(|p| p.contains("p0 ×2")), "{problems:?}");
    }

    #[test]
    fn listing_and_state_mismatches_are_found() {
        let t = tally(&[(0, 1), (1, 1)], 3);
        let mut l = listed(&["printed", "failed"], 2);
        l.push(ListedTask {
            biz_no: "X9".into(),
            task_id: "t9".into(),
            printer_id: "p0".into(),
            state: "printed".into(),
            ..ListedTask::default()
        });
        l.push(l[0].clone());
        let mut problems = Vec::new();
        check_delivery(&t, &l, true, &mut problems);
        let all = problems.join("\n");
        assert!(all.contains("lists 4 tasks"), "{all}");
        assert!(all.contains("none of this run's") && all.contains("X9"), "{all}");
        assert!(all.contains("stored twice"), "{all}");
        assert!(all.contains("ended `failed`") && all.contains("E1"), "{all}");
        assert!(all.contains("E2 (not listed)"), "{all}");
    }

    #[test]
    fn stray_paper_is_a_problem() {
        let mut t = tally(&[(0, 1)], 1);
        t.add(&PaperLine::marked("x", 1, vec![]));
        t.add(&PaperLine::marked("x", 1, vec![7]));
        t.add_malformed("oops".into());
        let mut problems = Vec::new();
        let c = check_delivery(&t, &listed(&["printed"], 1), false, &mut problems);
        assert_eq!(c.stray_jobs, 3);
        assert_eq!(problems.len(), 3, "{problems:?}");
    }
}
