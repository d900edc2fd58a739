//! The verdict of a fault run: the paper log first, the broker's records second.
//!
//! Paper is the truth. After faults, kills and retry storms, and once every lane has
//! drained, the promise is: no task on paper twice; every accepted task either printed —
//! on paper exactly once and `printed` at the broker — or handed to a person (`in_doubt`
//! when it may have printed, at most once on paper; `failed` when it cannot have, never on
//! paper); nothing left `pending`, `sent` or `retrying`; no sheet that no accepted task
//! explains; and an audit trail per task that ends where the task is.
//!
//! Findings are plain sentences in `problems` plus the tasks behind them (capped, counted
//! in full), so a broken broker gets a report of everything that went wrong and which
//! tasks and printers to look at.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::schedule::priority_of;
use crate::e2e::marker_of;
use crate::paper::Tally;
use crate::verify::{ListedTask, ACTIVE_STATES};

/// How many tasks a finding keeps in the report (the count is always complete).
const KEEP: usize = 200;
/// How many examples a problem sentence names.
const EXAMPLES: usize = 8;
/// How many tasks a stalled lane lists besides its in-flight and retrying ones.
const LANE_HEAD: usize = 3;

/// A task behind a finding.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TaskFinding {
    pub biz_no: String,
    /// Empty when the broker holds no task for the key.
    pub task_id: String,
    pub printer_id: String,
    pub state: String,
    /// Sheets of paper carrying its marker.
    pub sheets: u32,
}

/// A list of tasks behind one finding: the first [`KEEP`] and the full count.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Findings {
    pub count: usize,
    pub tasks: Vec<TaskFinding>,
}

impl Findings {
    fn add(&mut self, t: TaskFinding) {
        self.count += 1;
        if self.tasks.len() < KEEP {
            self.tasks.push(t);
        }
    }

    fn examples(&self) -> String {
        let mut s: Vec<String> = self
            .tasks
            .iter()
            .take(EXAMPLES)
            .map(|t| {
                let id = if t.task_id.is_empty() { "no task".to_string() } else { t.task_id.clone() };
                format!("{} ({id}, {}, {}, on paper ×{})", t.biz_no, t.printer_id, t.state, t.sheets)
            })
            .collect();
        if self.count > EXAMPLES {
            s.push(format!("… {} more", self.count - EXAMPLES));
        }
        s.join("; ")
    }
}

/// One task of a lane that did not drain.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LaneTask {
    pub task_id: String,
    pub biz_no: String,
    pub state: String,
    pub print_type: String,
    pub attempts: i64,
    pub last_error: Option<String>,
}

/// A printer whose lane still had work when the drain ended.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StalledLane {
    pub printer_id: String,
    /// Tasks left (`pending`, `sent`, `retrying`).
    pub left: usize,
    pub by_state: BTreeMap<String, usize>,
    /// In lane order (priority, then id): every `sent` and `retrying` task, and the first
    /// few `pending` ones — what the dispatcher sees when it looks at the lane.
    pub tasks: Vec<LaneTask>,
}

/// Tasks handed to a person.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Attention {
    pub in_doubt: usize,
    /// Of those, on paper (once: the doubt was whether it printed, and it did).
    pub in_doubt_on_paper: usize,
    pub failed: usize,
    pub failed_on_paper: usize,
}

/// What the paper log and the broker's task list say, side by side.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Verdict {
    pub paper_jobs: usize,
    /// Tasks on paper at least once.
    pub on_paper: usize,
    /// Tasks per state at the broker.
    pub states: BTreeMap<String, usize>,
    /// Tasks on paper more than once (must be none).
    pub duplicates: Findings,
    /// Sheets beyond the first, over all tasks.
    pub extra_sheets: usize,
    /// Accepted tasks printed at the broker but not on paper, not finished, or without a
    /// task at all (must be none).
    pub lost: Findings,
    pub attention: Attention,
    /// `failed` tasks that are on paper: the broker tells staff nothing printed when it did.
    pub failed_on_paper: Findings,
    /// Tasks in states nothing in the run should cause (`cancelled`, `closed`, and
    /// `transferred` without a successor).
    pub unexpected_states: Findings,
    /// Sheets without a marker, with a marker of no task of the run, or unreadable.
    pub stray_jobs: usize,
    /// Task numbers on paper whose submission was never accepted.
    pub unaccepted_on_paper: Vec<String>,
    /// Lanes that did not drain, by printer id.
    pub stalled: Vec<StalledLane>,
}

/// Compares the paper log (`tally`, for tasks `0..tally.counts.len()`) with the broker's
/// list of the store's tasks. `accepted` maps the `biz_no` of every key that got a
/// 201/200 to the task id it was answered with. Findings go to `problems`.
pub fn check(
    tally: &Tally,
    listed: &[ListedTask],
    accepted: &HashMap<String, Box<str>>,
    problems: &mut Vec<String>,
) -> Verdict {
    let mut v = Verdict {
        paper_jobs: tally.lines,
        on_paper: tally.distinct,
        extra_sheets: tally.extra_prints(),
        stray_jobs: tally.unmarked + tally.foreign + tally.malformed,
        ..Verdict::default()
    };
    let sheets = |biz: &str| marker_of(biz).and_then(|m| tally.counts.get(m as usize).copied()).unwrap_or(0);
    let mut by_biz: HashMap<&str, &ListedTask> = HashMap::with_capacity(listed.len());
    for t in listed {
        *v.states.entry(t.state.clone()).or_default() += 1;
        // A ticket that failed over is `transferred` and its key lives on in its
        // successor (same business number): the end of the chain is what counts.
        let e = by_biz.entry(t.biz_no.as_str()).or_insert(t);
        if e.state == "transferred" && t.state != "transferred" {
            *e = t;
        }
    }
    let finding = |t: &ListedTask| TaskFinding {
        biz_no: t.biz_no.clone(),
        task_id: t.task_id.clone(),
        printer_id: t.printer_id.clone(),
        state: t.state.clone(),
        sheets: sheets(&t.biz_no),
    };

    // Every sheet more than one for a task is a duplicate, whatever the broker says.
    for (m, count) in tally.duplicates() {
        let biz = format!("E{m}");
        let f = match by_biz.get(biz.as_str()) {
            Some(t) => finding(t),
            None => TaskFinding { biz_no: biz, sheets: count, ..TaskFinding::default() },
        };
        v.duplicates.add(f);
    }

    // Every accepted key, in task order: where did it end?
    let mut keys: Vec<&String> = accepted.keys().collect();
    keys.sort_by_key(|b| (marker_of(b), b.to_string()));
    for biz in keys {
        let Some(t) = by_biz.get(biz.as_str()) else {
            v.lost.add(TaskFinding { biz_no: biz.clone(), sheets: sheets(biz), ..TaskFinding::default() });
            continue;
        };
        let f = finding(t);
        match t.state.as_str() {
            "printed" if f.sheets == 0 => v.lost.add(f),
            "printed" => {}
            "in_doubt" => {
                v.attention.in_doubt += 1;
                v.attention.in_doubt_on_paper += usize::from(f.sheets > 0);
            }
            "failed" => {
                v.attention.failed += 1;
                if f.sheets > 0 {
                    v.attention.failed_on_paper += 1;
                    v.failed_on_paper.add(f);
                }
            }
            s if ACTIVE_STATES.contains(&s) => v.lost.add(f),
            _ => v.unexpected_states.add(f),
        }
    }

    // Sheets no accepted task explains.
    for (m, &count) in tally.counts.iter().enumerate() {
        let biz = format!("E{m}");
        if count > 0 && !accepted.contains_key(&biz) {
            v.unaccepted_on_paper.push(biz);
        }
    }

    v.stalled = stalled_lanes(listed);

    if v.duplicates.count > 0 {
        problems.push(format!(
            "duplicates: {} tasks are on paper more than once ({} extra sheets): {}",
            v.duplicates.count,
            v.extra_sheets,
            v.duplicates.examples()
        ));
    }
    if v.lost.count > 0 {
        problems.push(format!(
            "lost: {} accepted tasks ({}): {}",
            v.lost.count,
            lost_causes(&v.lost),
            v.lost.examples()
        ));
    }
    if !v.stalled.is_empty() {
        problems.push(format!("stalled lanes: {}", describe_lanes(&v.stalled)));
    }
    if v.failed_on_paper.count > 0 {
        problems.push(format!(
            "{} tasks are `failed` (the broker says nothing printed) but on paper: {}",
            v.failed_on_paper.count,
            v.failed_on_paper.examples()
        ));
    }
    if v.unexpected_states.count > 0 {
        problems.push(format!(
            "{} tasks ended in a state nothing in the run causes: {}",
            v.unexpected_states.count,
            v.unexpected_states.examples()
        ));
    }
    if !v.unaccepted_on_paper.is_empty() {
        problems.push(format!(
            "{} tasks are on paper although their submission was never accepted, e.g. {}",
            v.unaccepted_on_paper.len(),
            v.unaccepted_on_paper.iter().take(EXAMPLES).cloned().collect::<Vec<_>>().join(", ")
        ));
    }
    tally.report_strays(problems);
    v
}

/// Why the tasks of `lost` count as lost, counted: `printed at the broker but not on
/// paper 2, still pending 685, still sent 2 (1 of them on paper), no task 1`. Counted over
/// the kept tasks, which are all of them unless there are more than [`KEEP`].
fn lost_causes(lost: &Findings) -> String {
    let mut causes: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for t in &lost.tasks {
        let cause = match t.state.as_str() {
            "" => "no task for the key".to_string(),
            "printed" => "printed at the broker but not on paper".to_string(),
            s => format!("still {s}"),
        };
        let e = causes.entry(cause).or_default();
        e.0 += 1;
        e.1 += usize::from(t.sheets > 0);
    }
    let mut out: Vec<String> = causes
        .into_iter()
        .map(|(cause, (n, on_paper))| {
            if on_paper > 0 && !cause.starts_with("printed") {
                format!("{cause} {n} ({on_paper} of them on paper)")
            } else {
                format!("{cause} {n}")
            }
        })
        .collect();
    if lost.count > lost.tasks.len() {
        out.push(format!("the first {} of them counted", lost.tasks.len()));
    }
    out.join(", ")
}

/// Groups the tasks still `pending`, `sent` or `retrying` by printer, each lane in the
/// order the dispatcher reads it.
pub fn stalled_lanes(listed: &[ListedTask]) -> Vec<StalledLane> {
    let mut lanes: BTreeMap<&str, Vec<&ListedTask>> = BTreeMap::new();
    for t in listed.iter().filter(|t| ACTIVE_STATES.contains(&t.state.as_str())) {
        lanes.entry(t.printer_id.as_str()).or_default().push(t);
    }
    let mut out: Vec<StalledLane> = lanes
        .into_iter()
        .map(|(printer, mut tasks)| {
            tasks.sort_by(|a, b| {
                (priority_of(&a.print_type), &a.task_id).cmp(&(priority_of(&b.print_type), &b.task_id))
            });
            let mut by_state = BTreeMap::new();
            for t in &tasks {
                *by_state.entry(t.state.clone()).or_default() += 1;
            }
            let mut pending_shown = 0;
            let shown = tasks
                .iter()
                .filter(|t| {
                    if t.state != "pending" {
                        return true;
                    }
                    pending_shown += 1;
                    pending_shown <= LANE_HEAD
                })
                .map(|t| LaneTask {
                    task_id: t.task_id.clone(),
                    biz_no: t.biz_no.clone(),
                    state: t.state.clone(),
                    print_type: t.print_type.clone(),
                    attempts: t.attempts,
                    last_error: t.last_error.clone(),
                })
                .collect();
            StalledLane { printer_id: printer.to_string(), left: tasks.len(), by_state, tasks: shown }
        })
        .collect();
    out.sort_by_key(|l| natural(&l.printer_id));
    out
}

/// `p10` after `p9`.
fn natural(id: &str) -> (usize, String) {
    let digits: String = id.chars().filter(char::is_ascii_digit).collect();
    (digits.parse().unwrap_or(usize::MAX), id.to_string())
}

/// One line per stalled lane: `p3: 412 left (pending 411, sent 1): E17 01J… sent receipt
/// attempt 2; E88 01J… pending refund attempt 0 …`.
pub fn describe_lanes(lanes: &[StalledLane]) -> String {
    lanes
        .iter()
        .map(|l| {
            let states: Vec<String> = l.by_state.iter().map(|(s, n)| format!("{s} {n}")).collect();
            let tasks: Vec<String> = l
                .tasks
                .iter()
                .map(|t| {
                    let err = t.last_error.as_deref().map_or(String::new(), |e| format!(", last error {e}"));
                    format!("{} {} {} {} attempt {}{err}", t.biz_no, t.task_id, t.state, t.print_type, t.attempts)
                })
                .collect();
            format!("{}: {} left ({}): {}", l.printer_id, l.left, states.join(", "), tasks.join("; "))
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

/// A task the broker left `in_doubt`, as its audit trail tells it (µs since the epoch).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DoubtCase {
    pub task_id: String,
    pub biz_no: String,
    pub printer: usize,
    pub created_us: i64,
    pub doubted_us: i64,
    /// The reason of the change into `in_doubt`.
    pub reason: String,
}

/// What the run did that can leave a ticket in doubt, in µs since the epoch.
#[derive(Debug, Clone, Default)]
pub struct Injected {
    /// Per printer: the spans in which a stop (paper out, cover open, offline) held, and
    /// the moments of crashes and errors after printing.
    pub spans: HashMap<usize, Vec<(i64, i64)>>,
    pub moments: HashMap<usize, Vec<i64>>,
    pub agent_kills_us: Vec<i64>,
    pub broker_kills_us: Vec<i64>,
    /// Printers from this index on call the broker (the agent's are below).
    pub callers_from: usize,
}

/// Every `in_doubt` explained by a fault the run injected (or not), by the cause its
/// reason names.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DoubtCheck {
    pub by_cause: BTreeMap<String, usize>,
    pub unexplained: Vec<DoubtCase>,
}

/// A doubt can follow a fault up to this long before the ticket was submitted (a crash
/// waits for the printer's next job) and a kill up to this long after the doubt began
/// (its effects are seen a moment later).
const DOUBT_SLACK_US: i64 = 30_000_000;
const KILL_SLACK_US: i64 = 3_000_000;

/// The cause an in-doubt reason names, in a few words for the report.
pub fn doubt_cause(reason: &str) -> &'static str {
    let has = |w: &str| reason.contains(w);
    if has("started before") || has("went away") || has("earlier process") {
        "agent stopped mid-job"
    } else if has("no_paper") || has("cover_open") || has("paper_jam") {
        "stop while printing"
    } else if has("EPTR_") || has("does not document") || has("599") || has("error after printing") {
        "error after printing (vendor code)"
    } else if has("came back without a result") || has("went silent") || has("polled again idle") {
        "printer lost power or went silent after taking the job"
    } else if has("had this key already") || has("repeated token") {
        "device restarted after taking the job"
    } else if has("after sending")
        || has("before the printer confirmed")
        || has("closed the connection")
        || has("GS ( H")
        || has("did not confirm")
    {
        "printer failed after the job was sent"
    } else {
        "other"
    }
}

/// Whether something the run injected can have put `c` in doubt: a stop holding on its
/// printer, a crash or error after printing on it, a kill of the agent (its printers) or
/// of the broker (any), while the ticket was alive.
pub fn explained(c: &DoubtCase, injected: &Injected) -> bool {
    let (from, to) = (c.created_us - DOUBT_SLACK_US, c.doubted_us);
    let spans = injected.spans.get(&c.printer).is_some_and(|v| v.iter().any(|&(a, b)| a <= to && b >= from));
    let moments = injected.moments.get(&c.printer).is_some_and(|v| v.iter().any(|&m| m >= from && m <= to));
    let near = |kills: &[i64]| kills.iter().any(|&k| k >= c.created_us - KILL_SLACK_US && k <= to + KILL_SLACK_US);
    let agent = c.printer < injected.callers_from && near(&injected.agent_kills_us);
    spans || moments || agent || near(&injected.broker_kills_us)
}

/// Explains every doubt of the run, or lists it.
pub fn check_doubt(cases: &[DoubtCase], injected: &Injected, problems: &mut Vec<String>) -> DoubtCheck {
    let mut out = DoubtCheck::default();
    for c in cases {
        *out.by_cause.entry(doubt_cause(&c.reason).to_string()).or_default() += 1;
        if !explained(c, injected) {
            out.unexplained.push(c.clone());
        }
    }
    if !out.unexplained.is_empty() {
        let examples: Vec<String> = out
            .unexplained
            .iter()
            .take(EXAMPLES)
            .map(|c| format!("{} ({}, p{}): {}", c.biz_no, c.task_id, c.printer, c.reason))
            .collect();
        problems.push(format!(
            "{} tasks are in doubt although nothing the run injected touched their printer while they lived: {}",
            out.unexplained.len(),
            examples.join("; ")
        ));
    }
    out
}

/// One audit event: `from` (`None` for the creation) and `to`.
pub type Step = (Option<String>, String);

/// Checks that an audit trail is one unbroken chain from creation to the task's state:
/// it starts with `→ pending`, each event leaves the state the one before entered, it
/// ends in `state`, and it reaches `printed` at most once.
pub fn check_trail(state: &str, events: &[Step]) -> Result<(), String> {
    let chain = || events.iter().map(|(_, to)| to.as_str()).collect::<Vec<_>>().join(" → ");
    let Some((first_from, first_to)) = events.first() else { return Err("no events".into()) };
    if first_from.is_some() || first_to != "pending" {
        return Err(format!(
            "starts with {} → {first_to}, not the creation → pending",
            first_from.as_deref().unwrap_or("-")
        ));
    }
    for w in events.windows(2) {
        let (prev_to, (from, to)) = (&w[0].1, &w[1]);
        if from.as_deref() != Some(prev_to.as_str()) {
            return Err(format!(
                "event {} → {to} follows one that entered {prev_to}: {}",
                from.as_deref().unwrap_or("-"),
                chain()
            ));
        }
    }
    let last = events.last().map(|(_, to)| to.as_str()).unwrap_or_default();
    if last != state {
        return Err(format!("ends in {last} but the task is {state}: {}", chain()));
    }
    let printed = events.iter().filter(|(_, to)| to == "printed").count();
    if printed > 1 {
        return Err(format!("reaches printed {printed} times: {}", chain()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paper::PaperLine;

    fn tally(prints: &[(u32, u32)], tasks: usize) -> Tally {
        Tally::with_prints(prints, tasks)
    }

    fn task(n: usize, printer: usize, state: &str, print_type: &str) -> ListedTask {
        ListedTask {
            biz_no: format!("E{n}"),
            task_id: format!("t{n:03}"),
            printer_id: format!("p{printer}"),
            state: state.into(),
            print_type: print_type.into(),
            attempts: 1,
            last_error: None,
            moved_from: None,
        }
    }

    fn accepted(listed: &[ListedTask]) -> HashMap<String, Box<str>> {
        listed.iter().map(|t| (t.biz_no.clone(), t.task_id.clone().into_boxed_str())).collect()
    }

    #[test]
    fn a_clean_run_with_honest_doubt_passes() {
        // E0, E1 printed; E2 in doubt and on paper; E3 in doubt, not on paper; E4 failed.
        let listed = vec![
            task(0, 0, "printed", "receipt"),
            task(1, 1, "printed", "refund"),
            task(2, 0, "in_doubt", "kitchen"),
            task(3, 1, "in_doubt", "receipt"),
            task(4, 0, "failed", "prebill"),
        ];
        let t = tally(&[(0, 1), (1, 1), (2, 1)], 5);
        let mut problems = Vec::new();
        let v = check(&t, &listed, &accepted(&listed), &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!((v.attention.in_doubt, v.attention.in_doubt_on_paper), (2, 1));
        assert_eq!((v.attention.failed, v.attention.failed_on_paper), (1, 0));
        assert_eq!((v.duplicates.count, v.lost.count, v.on_paper), (0, 0, 3));
        assert!(v.stalled.is_empty());
    }

    #[test]
    fn a_ticket_that_failed_over_is_judged_by_its_successor() {
        let mut moved = task(0, 9, "transferred", "receipt");
        moved.task_id = "t000a".into();
        let listed = vec![moved, task(0, 0, "printed", "receipt"), task(1, 0, "printed", "receipt")];
        let t = tally(&[(0, 1), (1, 1)], 2);
        let mut problems = Vec::new();
        let v = check(&t, &listed, &accepted(&listed[1..]), &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!((v.lost.count, v.unexpected_states.count), (0, 0));
        assert_eq!(v.states.get("transferred"), Some(&1));
    }

    #[test]
    fn a_doubt_is_explained_only_by_what_touched_its_printer_while_it_lived() {
        let s = 1_000_000i64;
        let case = |printer: usize, created: i64, doubted: i64| DoubtCase {
            task_id: "t".into(),
            biz_no: "E1".into(),
            printer,
            created_us: created * s,
            doubted_us: doubted * s,
            reason: "attempt 1: error; … (the printer reported EPTR_CUTTER)".into(),
        };
        let mut injected = Injected { callers_from: 2, ..Injected::default() };
        injected.spans.insert(0, vec![(100 * s, 110 * s)]);
        injected.moments.insert(3, vec![200 * s]);
        injected.agent_kills_us.push(300 * s);
        let cases = [
            case(0, 105, 108), // a stop on its printer
            case(3, 199, 201), // an error after printing on its printer
            case(1, 299, 302), // an agent printer, the agent killed meanwhile
            case(2, 299, 302), // a printer that calls in: an agent kill does not explain it
            case(0, 150, 160), // nothing on p0 then
        ];
        let mut problems = Vec::new();
        let d = check_doubt(&cases, &injected, &mut problems);
        assert_eq!(
            d.unexplained.iter().map(|c| (c.printer, c.created_us / s)).collect::<Vec<_>>(),
            vec![(2, 299), (0, 150)]
        );
        assert_eq!(d.by_cause.get("error after printing (vendor code)"), Some(&5));
        assert!(problems.len() == 1 && problems[0].contains("2 tasks are in doubt"), "{problems:?}");
        injected.broker_kills_us.push(155 * s);
        injected.broker_kills_us.push(301 * s);
        assert!(check_doubt(&cases, &injected, &mut Vec::new()).unexplained.is_empty(), "a broker kill touches all");
        assert_eq!(doubt_cause("attempt 2: started before a crash"), "agent stopped mid-job");
        assert_eq!(doubt_cause("no_paper; the printer may have printed it"), "stop while printing");
    }

    #[test]
    fn duplicates_lost_and_failed_on_paper_are_found() {
        let listed = vec![
            task(0, 0, "printed", "receipt"),  // twice on paper
            task(1, 0, "printed", "receipt"),  // never on paper
            task(2, 0, "in_doubt", "receipt"), // twice: a doubt must not become a second sheet
            task(3, 0, "failed", "receipt"),   // on paper although failed
            task(4, 0, "closed", "receipt"),
        ];
        let mut acc = accepted(&listed);
        acc.insert("E5".into(), "t005".into()); // accepted, but the broker has no task
        let t = tally(&[(0, 2), (2, 2), (3, 1), (6, 1)], 7); // E6 never accepted
        let mut problems = Vec::new();
        let v = check(&t, &listed, &acc, &mut problems);
        let all = problems.join("\n");
        assert_eq!(v.duplicates.count, 2, "{all}");
        assert!(all.contains("duplicates: 2 tasks") && all.contains("E0 (t000, p0, printed, on paper ×2)"), "{all}");
        assert_eq!(v.lost.count, 2);
        assert!(all.contains("E1 (t001") && all.contains("E5 (no task"), "{all}");
        assert!(all.contains("(no task for the key 1, printed at the broker but not on paper 1)"), "{all}");
        assert!(all.contains("`failed`") && all.contains("E3"), "{all}");
        assert!(all.contains("state nothing in the run causes") && all.contains("E4"), "{all}");
        assert!(all.contains("never accepted, e.g. E6"), "{all}");
        assert_eq!(v.extra_sheets, 2);
    }

    #[test]
    fn unfinished_tasks_are_lost_and_their_lanes_named_in_lane_order() {
        // p1 holds a receipt in flight while refunds and more receipts wait behind it.
        let listed = vec![
            task(0, 0, "printed", "receipt"),
            task(1, 1, "sent", "receipt"),
            task(2, 1, "pending", "receipt"),
            task(3, 1, "pending", "refund"),
            task(4, 1, "pending", "kitchen"),
            task(5, 1, "pending", "receipt"),
            task(6, 1, "pending", "receipt"),
            task(7, 2, "retrying", "prebill"),
        ];
        let t = tally(&[(0, 1)], 8);
        let mut problems = Vec::new();
        let v = check(&t, &listed, &accepted(&listed), &mut problems);
        assert_eq!(v.lost.count, 7);
        assert!(problems[0].contains("(still pending 5, still retrying 1, still sent 1)"), "{problems:?}");
        assert_eq!(v.stalled.len(), 2);
        let p1 = &v.stalled[0];
        assert_eq!((p1.printer_id.as_str(), p1.left), ("p1", 6));
        assert_eq!(p1.by_state.get("pending"), Some(&5));
        let order: Vec<&str> = p1.tasks.iter().map(|t| t.biz_no.as_str()).collect();
        // The refund heads the lane; the sent receipt is listed, and three pending ones.
        assert_eq!(order, ["E3", "E1", "E2", "E5"]);
        let all = problems.join("\n");
        assert!(all.contains("stalled lanes: p1: 6 left (pending 5, sent 1): E3 t003 pending refund"), "{all}");
        assert!(all.contains("| p2: 1 left (retrying 1)"), "{all}");
    }

    #[test]
    fn stray_paper_is_a_problem() {
        let listed = vec![task(0, 0, "printed", "receipt")];
        let mut t = tally(&[(0, 1)], 1);
        t.add(&PaperLine::marked("x", 1, vec![]));
        t.add(&PaperLine::marked("x", 1, vec![9]));
        t.add_malformed("oops".into());
        let mut problems = Vec::new();
        let v = check(&t, &listed, &accepted(&listed), &mut problems);
        assert_eq!(v.stray_jobs, 3);
        assert_eq!(problems.len(), 3, "{problems:?}");
    }

    fn step(from: Option<&str>, to: &str) -> Step {
        (from.map(str::to_string), to.to_string())
    }

    #[test]
    fn trails_must_be_one_chain_ending_in_the_state() {
        let good = [
            step(None, "pending"),
            step(Some("pending"), "sent"),
            step(Some("sent"), "sent"),
            step(Some("sent"), "retrying"),
            step(Some("retrying"), "sent"),
            step(Some("sent"), "printed"),
        ];
        assert_eq!(check_trail("printed", &good), Ok(()));
        assert!(check_trail("in_doubt", &good).unwrap_err().contains("ends in printed"));
        assert!(check_trail("printed", &[]).is_err());
        assert!(check_trail("sent", &[step(Some("pending"), "sent")]).unwrap_err().contains("creation"));
        let broken = [step(None, "pending"), step(Some("retrying"), "sent")];
        assert!(check_trail("sent", &broken).unwrap_err().contains("follows one that entered pending"));
        let twice = [step(None, "pending"), step(Some("pending"), "printed"), step(Some("printed"), "printed")];
        assert!(check_trail("printed", &twice).unwrap_err().contains("2 times"));
    }
}
