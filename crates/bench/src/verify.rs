//! Checks that every answer, and the broker's stored tasks afterwards, obey the intake
//! contract: one task per key, the first answer 201 and every other 200 with the same
//! task id.
//!
//! Findings are collected as plain sentences rather than returned as errors: a broken
//! broker should still get a full report of everything that went wrong.

use std::collections::{BTreeMap, HashMap, HashSet};

use hyper::header::HeaderValue;
use hyper::Method;
use serde_json::Value;

use crate::http::{pct_encode, snippet, Conn};
use crate::load::Outcome;
use crate::plan::Plan;
use crate::BenchError;

/// How many examples a finding lists.
const EXAMPLES: usize = 5;

/// Counts and a few examples of one kind of violation.
#[derive(Default)]
struct Finding {
    count: usize,
    examples: Vec<String>,
}

impl Finding {
    fn add(&mut self, example: impl FnOnce() -> String) {
        self.count += 1;
        if self.examples.len() < EXAMPLES {
            self.examples.push(example());
        }
    }

    fn report(self, what: &str, problems: &mut Vec<String>) {
        if self.count > 0 {
            problems.push(format!("{} {what}, e.g. {}", self.count, self.examples.join("; ")));
        }
    }
}

/// Checks the answers of one run (`label` names it in findings). Returns the task id
/// answered for each `biz_no`, for the listing check.
///
/// `unseen_201` holds the keys one of whose requests was sent but never answered (the
/// connection died while the broker was killed) and then retried: the broker may have
/// created the task and lost only the answer, so such a key may rightly have no 201 at
/// all (its retries answer 200). Every other key must have exactly one.
pub fn check_answers(
    label: &str,
    plan: &Plan,
    outcomes: &[Outcome],
    unseen_201: &HashSet<u32>,
    problems: &mut Vec<String>,
) -> HashMap<String, Box<str>> {
    // Statuses other than 201/200, each with the first few bodies.
    let mut unexpected: BTreeMap<u16, Finding> = BTreeMap::new();
    let mut bad_shape = Finding::default();
    let mut mismatched = Finding::default();
    let mut created_twice = Finding::default();
    let mut created_late = Finding::default();

    // Earliest moment any request of each key was answered: a 201 sent after that moment
    // means the broker created a second task for a key it had already answered for.
    let mut first_answer_end: HashMap<u32, u64> = HashMap::with_capacity(plan.distinct_keys);
    for (req, out) in plan.requests.iter().zip(outcomes) {
        if out.status == 200 || out.status == 201 {
            let e = first_answer_end.entry(req.key).or_insert(u64::MAX);
            *e = (*e).min(out.end_us);
        }
    }

    let mut task_of_key: HashMap<u32, Box<str>> = HashMap::with_capacity(plan.distinct_keys);
    let mut created_per_key: HashMap<u32, usize> = HashMap::new();
    let mut mismatched_keys: HashSet<u32> = HashSet::new();
    let mut accepted = 0usize;
    for (i, (req, out)) in plan.requests.iter().zip(outcomes).enumerate() {
        let biz = || plan.biz_no(req.key);
        match out.status {
            200 | 201 => {}
            status => {
                unexpected
                    .entry(status)
                    .or_default()
                    .add(|| format!("{}: {}", biz(), out.detail.as_deref().unwrap_or("")));
                continue;
            }
        }
        let created = out.status == 201;
        let Some(task_id) = out.task_id.as_ref() else {
            bad_shape
                .add(|| format!("{} ({}): no task_id: {}", biz(), out.status, out.detail.as_deref().unwrap_or("")));
            continue;
        };
        if out.duplicate != Some(!created) {
            bad_shape.add(|| format!("{} answered {} with duplicate={:?}", biz(), out.status, out.duplicate));
        }
        match task_of_key.get(&req.key) {
            // Count each key once, however many of its answers disagree.
            Some(first) if first != task_id && mismatched_keys.insert(req.key) => {
                mismatched.add(|| format!("{}: {first} and {task_id}", biz()))
            }
            Some(_) => {}
            None => {
                task_of_key.insert(req.key, task_id.clone());
            }
        }
        if created {
            accepted += 1;
            let n = created_per_key.entry(req.key).or_default();
            *n += 1;
            if *n == 2 {
                created_twice.add(biz);
            }
            if first_answer_end.get(&req.key).is_some_and(|&end| end < out.start_us) {
                created_late.add(|| format!("{} (request #{i})", biz()));
            }
        }
    }

    for (status, finding) in unexpected {
        let what = if status == 0 {
            format!("{label} requests got no HTTP answer")
        } else {
            format!("{label} answers had status {status}")
        };
        finding.report(&what, problems);
    }
    bad_shape.report(&format!("{label} answers were malformed"), problems);
    mismatched.report(&format!("{label} keys were answered with different task ids"), problems);
    created_twice.report(&format!("{label} keys got more than one 201"), problems);
    created_late.report(
        &format!("{label} 201 answers came for a key whose earlier request had already been answered"),
        problems,
    );
    if unseen_201.is_empty() {
        if accepted != plan.distinct_keys {
            problems.push(format!(
                "{label}: {accepted} answers were 201 but the plan has {} distinct keys",
                plan.distinct_keys
            ));
        }
    } else {
        let mut never_created = Finding::default();
        let mut keys: Vec<u32> = task_of_key.keys().copied().collect();
        keys.sort_unstable();
        for key in keys {
            if !created_per_key.contains_key(&key) && !unseen_201.contains(&key) {
                never_created.add(|| plan.biz_no(key));
            }
        }
        never_created.report(&format!("{label} keys were answered only 200, never 201, with no answer lost"), problems);
    }

    task_of_key.into_iter().map(|(key, task)| (plan.biz_no(key), task)).collect()
}

/// Pages through `GET /v1/print-tasks?store_id=…` and returns `(biz_no, task_id)` of every
/// task the broker holds for the store whose id is greater than `floor`: a preloaded history
/// (module `preload`), all older than the run, is not paged through.
pub async fn list_tasks_above(
    conn: &mut Conn,
    auth: &HeaderValue,
    store_id: &str,
    expected: usize,
    floor: Option<&str>,
) -> Result<Vec<(String, String)>, BenchError> {
    let query = format!("store_id={}", pct_encode(store_id));
    let pick = |item: &Value| (str_field(item, "biz_no"), str_field(item, "task_id"));
    list_pages_above(conn, auth, &query, expected, floor, pick).await
}

/// A string field of a listed task, empty when absent.
pub fn str_field(item: &Value, name: &str) -> String {
    item.get(name).and_then(Value::as_str).unwrap_or_default().to_string()
}

/// Pages through `GET /v1/print-tasks?<query>` (the query already encoded, without
/// `limit` and `cursor`) with pages of 500 and returns `pick` of every listed task (one
/// page of JSON at a time is kept, not the whole list). `expected` is only a hint for the
/// allocation and the page limit. The listing ends at the first task whose id is not
/// greater than `floor` (the list runs newest first, so every task after it is older too).
pub async fn list_pages_above<T>(
    conn: &mut Conn,
    auth: &HeaderValue,
    query: &str,
    expected: usize,
    floor: Option<&str>,
    mut pick: impl FnMut(&Value) -> T,
) -> Result<Vec<T>, BenchError> {
    let mut tasks = Vec::with_capacity(expected);
    let mut cursor: Option<String> = None;
    // A broken cursor could loop forever; no honest listing needs more pages than this.
    let max_pages = expected / 10 + 100;
    for _ in 0..max_pages {
        let mut path = format!("/v1/print-tasks?{query}&limit=500");
        if let Some(c) = &cursor {
            path.push_str("&cursor=");
            path.push_str(&pct_encode(c));
        }
        let context = || format!("listing tasks ({path})");
        let (status, body) = conn
            .request(Method::GET, &path, auth, None)
            .await
            .map_err(|detail| BenchError::Http { context: context(), detail })?;
        if status.as_u16() != 200 {
            return Err(BenchError::Protocol {
                context: context(),
                detail: format!("HTTP {status}: {}", snippet(&body, 300)),
            });
        }
        let page: Value = serde_json::from_slice(&body).map_err(|e| BenchError::Protocol {
            context: context(),
            detail: format!("not JSON ({e}): {}", snippet(&body, 300)),
        })?;
        let Some(items) = page.get("tasks").and_then(Value::as_array) else {
            return Err(BenchError::Protocol {
                context: context(),
                detail: format!("no `tasks` array: {}", snippet(&body, 300)),
            });
        };
        let above = |item: &&Value| floor.is_none_or(|f| item.get("task_id").and_then(Value::as_str) > Some(f));
        let kept = items.iter().take_while(above).count();
        tasks.extend(items.iter().take(kept).map(&mut pick));
        if kept < items.len() {
            return Ok(tasks);
        }
        let next = match page.get("next_cursor") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s.is_empty() => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(other) => Some(other.to_string()),
        };
        match next {
            None => return Ok(tasks),
            Some(n) if cursor.as_ref() == Some(&n) => {
                return Err(BenchError::Protocol {
                    context: context(),
                    detail: format!("next_cursor {n:?} repeats the cursor just used"),
                })
            }
            Some(n) => cursor = Some(n),
        }
    }
    Err(BenchError::Protocol {
        context: format!("listing tasks ({query})"),
        detail: format!("still more pages after {max_pages} pages of up to 500 for {expected} tasks"),
    })
}

/// One task as `GET /v1/print-tasks` lists it, with the fields the delivery verdicts use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListedTask {
    pub biz_no: String,
    pub task_id: String,
    pub printer_id: String,
    pub state: String,
    pub print_type: String,
    pub attempts: i64,
    pub last_error: Option<String>,
    /// The task a failover or transfer successor carries on (`None` for a submission's).
    pub moved_from: Option<String>,
}

/// Lists tasks (`query` as for [`list_pages_above`]) as [`ListedTask`]s.
pub async fn list_states(
    conn: &mut Conn,
    auth: &HeaderValue,
    query: &str,
    expected: usize,
) -> Result<Vec<ListedTask>, BenchError> {
    list_states_above(conn, auth, query, expected, None).await
}

/// [`list_states`] of the tasks whose id is greater than `floor` only.
pub async fn list_states_above(
    conn: &mut Conn,
    auth: &HeaderValue,
    query: &str,
    expected: usize,
    floor: Option<&str>,
) -> Result<Vec<ListedTask>, BenchError> {
    list_pages_above(conn, auth, query, expected, floor, |t| ListedTask {
        biz_no: str_field(t, "biz_no"),
        task_id: str_field(t, "task_id"),
        printer_id: str_field(t, "printer_id"),
        state: str_field(t, "state"),
        print_type: str_field(t, "print_type"),
        attempts: t.get("attempts").and_then(Value::as_i64).unwrap_or(-1),
        last_error: t.get("last_error").and_then(Value::as_str).map(str::to_string),
        moved_from: match t.get("origin_kind").and_then(Value::as_str) {
            Some("failover" | "transfer") => t.get("origin_task_id").and_then(Value::as_str).map(str::to_string),
            _ => None,
        },
    })
    .await
}

/// The states a task has not finished in: a lane with one of these still has work.
pub const ACTIVE_STATES: [&str; 3] = ["pending", "sent", "retrying"];

/// Whether the bench store has any task `pending`, `sent` or `retrying`: one page of one
/// task per state, cheap enough to ask every few hundred milliseconds.
pub async fn any_active(conn: &mut Conn, auth: &HeaderValue) -> Result<bool, BenchError> {
    for state in ACTIVE_STATES {
        let path = format!("/v1/print-tasks?store_id={}&state={state}&limit=1", crate::STORE_ID);
        let (status, body) = conn
            .request(Method::GET, &path, auth, None)
            .await
            .map_err(|detail| BenchError::Http { context: format!("listing ({path})"), detail })?;
        let page: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let Some(items) = page.get("tasks").and_then(Value::as_array).filter(|_| status.is_success()) else {
            return Err(BenchError::Protocol {
                context: format!("listing ({path})"),
                detail: format!("HTTP {status}: {}", snippet(&body, 300)),
            });
        };
        if !items.is_empty() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Checks the broker holds exactly one task per key, with the id it answered.
pub fn check_listing(expected: &HashMap<String, Box<str>>, listed: &[(String, String)], problems: &mut Vec<String>) {
    let mut seen: HashMap<&str, usize> = HashMap::with_capacity(listed.len());
    let mut unknown = Finding::default();
    let mut wrong_id = Finding::default();
    for (biz, task) in listed {
        *seen.entry(biz.as_str()).or_default() += 1;
        match expected.get(biz) {
            None => unknown.add(|| format!("{biz} ({task})")),
            Some(answered) if **answered != **task => {
                wrong_id.add(|| format!("{biz}: stored {task}, answered {answered}"))
            }
            Some(_) => {}
        }
    }
    let mut doubled = Finding::default();
    for (biz, n) in &seen {
        if *n > 1 {
            doubled.add(|| format!("{biz} ×{n}"));
        }
    }
    let mut missing = Finding::default();
    for biz in expected.keys() {
        if !seen.contains_key(biz.as_str()) {
            missing.add(|| biz.clone());
        }
    }
    if listed.len() != expected.len() {
        problems.push(format!(
            "the broker lists {} tasks for the store, expected {} (one per distinct key)",
            listed.len(),
            expected.len()
        ));
    }
    doubled.report("keys are stored more than once", problems);
    missing.report("answered keys are missing from the task list", problems);
    unknown.report("listed tasks have a biz_no the bench never answered for", problems);
    wrong_id.report("listed tasks have a different task_id than answered", problems);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::build_plan;

    fn ok(status: u16, task: &str, start: u64, end: u64) -> Outcome {
        Outcome {
            status,
            start_us: start,
            end_us: end,
            task_id: Some(task.into()),
            duplicate: Some(status == 200),
            offline: false,
            detail: None,
        }
    }

    /// A well-behaved broker's answers for a plan: the first request of each key is 201.
    fn honest(plan: &Plan) -> Vec<Outcome> {
        let mut t = 0;
        plan.requests
            .iter()
            .map(|r| {
                t += 10;
                ok(if r.repeat { 200 } else { 201 }, &format!("t{}", r.key), t, t + 5)
            })
            .collect()
    }

    #[test]
    fn honest_answers_pass() {
        let plan = build_plan("B", 2_000, 0.3, 10, 3);
        let mut problems = Vec::new();
        let map = check_answers("run", &plan, &honest(&plan), &HashSet::new(), &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(map.len(), plan.distinct_keys);
        let listed: Vec<_> = map.iter().map(|(b, t)| (b.clone(), t.to_string())).collect();
        check_listing(&map, &listed, &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
    }

    #[test]
    fn second_create_and_mismatch_are_found() {
        let plan = build_plan("B", 2_000, 0.3, 10, 3);
        let mut outcomes = honest(&plan);
        let i = plan.requests.iter().position(|r| r.repeat).unwrap();
        outcomes[i] = ok(201, "other", outcomes[i].start_us, outcomes[i].end_us);
        let mut problems = Vec::new();
        check_answers("run", &plan, &outcomes, &HashSet::new(), &mut problems);
        let all = problems.join("\n");
        assert!(all.contains("different task ids"), "{all}");
        assert!(all.contains("more than one 201"), "{all}");
        assert!(all.contains("already been answered"), "{all}");
        assert!(all.contains("distinct keys"), "{all}");
    }

    #[test]
    fn a_key_whose_answer_was_lost_may_have_no_201() {
        let plan = build_plan("B", 200, 0.0, 10, 3);
        let mut outcomes = honest(&plan);
        // Key 7's 201 was lost and its retry answered 200; key 9 got 200 with nothing lost.
        for k in [7usize, 9] {
            outcomes[k] = ok(200, &format!("t{k}"), outcomes[k].start_us, outcomes[k].end_us);
        }
        let mut problems = Vec::new();
        check_answers("run", &plan, &outcomes, &HashSet::from([7]), &mut problems);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("B9") && !problems[0].contains("B7"), "{problems:?}");
    }

    #[test]
    fn other_statuses_are_counted() {
        let plan = build_plan("B", 100, 0.0, 10, 3);
        let mut outcomes = honest(&plan);
        outcomes[5] = Outcome { status: 500, detail: Some("boom".into()), ..Outcome::default() };
        let mut problems = Vec::new();
        check_answers("run", &plan, &outcomes, &HashSet::new(), &mut problems);
        assert!(problems.iter().any(|p| p.contains("status 500") && p.contains("boom")), "{problems:?}");
    }

    #[test]
    fn listing_finds_doubles_and_missing() {
        let expected: HashMap<String, Box<str>> =
            [("B0".to_string(), "t0".into()), ("B1".to_string(), "t1".into())].into();
        let listed = vec![("B0".to_string(), "t0".to_string()), ("B0".to_string(), "tx".to_string())];
        let mut problems = Vec::new();
        check_listing(&expected, &listed, &mut problems);
        let all = problems.join("\n");
        assert!(all.contains("more than once"), "{all}");
        assert!(all.contains("missing"), "{all}");
        assert!(all.contains("different task_id"), "{all}");
    }
}
