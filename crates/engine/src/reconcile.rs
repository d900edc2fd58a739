//! Daily reconciliation (R28): a store's business day of tasks and ledger entries against
//! the orders the merchant expected, with the differences listed.
//!
//! The computation is a pure function of the day's rows ([`compute`]), so it is tested on
//! hand-built days; [`reconcile`] only fetches the rows.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use onceprint_core::{Millis, TaskId, TaskState};
use onceprint_store::{LedgerEntry, OriginKind, Store, StoreError, Task};
use serde::Serialize;

use crate::tz::{self, Zone};

/// A business day of a store, in milliseconds since the epoch: from the start of the local
/// day (inclusive) to the start of the next local day (exclusive).
///
/// The window is usually 24 hours long, but not always: on the day a store's clocks spring
/// forward it is 23 hours, on the day they fall back 25, and a task printed at 23:30 local
/// time on such a day still belongs to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DayWindow {
    pub from: Millis,
    pub to: Millis,
}

/// A civil date written `YYYY-MM-DD`, from 1970 on; `None` for anything else, including
/// impossible dates such as 2026-02-30.
fn parse_date(date: &str) -> Option<jiff::civil::Date> {
    let mut parts = date.split('-');
    let (y, m, d) = (parts.next()?, parts.next()?, parts.next()?);
    let digits = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_digit());
    if parts.next().is_some() || !digits(y, 4) || !digits(m, 2) || !digits(d, 2) {
        return None;
    }
    let year: i16 = y.parse().ok()?;
    if year < 1970 {
        return None;
    }
    jiff::civil::Date::new(year, m.parse().ok()?, d.parse().ok()?).ok()
}

/// The window of `date` (`YYYY-MM-DD`) in the store's time zone `zone`; `None` when the
/// date is not a date.
pub fn day_window(date: &str, zone: &Zone) -> Option<DayWindow> {
    let day = parse_date(date)?;
    // The start of a day is its first instant, which is usually midnight. Where midnight
    // falls into a gap (clocks jump forward at 00:00) the conversion moves it forward past
    // the gap, and where midnight happens twice (clocks fall back to 00:00) it takes the
    // earlier one: in both cases the first instant that belongs to the day.
    let start = |d: jiff::civil::Date| d.to_zoned(zone.rules().clone()).ok().map(|z| z.timestamp().as_millisecond());
    let from = start(day)?;
    let to = start(day.tomorrow().ok()?)?;
    Some(DayWindow { from, to })
}

/// Counts of the day.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct DayCounts {
    /// Tasks submitted by the order system (reprints and successors not counted).
    pub submitted: u64,
    /// Submitted tasks whose work came out of a printer (directly, or via the task it
    /// was transferred or failed over to).
    pub printed: u64,
    /// Reprints created this day.
    pub reprinted: u64,
    pub failed: u64,
    pub in_doubt: u64,
    pub transferred: u64,
    pub cancelled: u64,
    /// Closed by an operator without printing ("mark printed").
    pub closed: u64,
    /// Still pending, sent or retrying.
    pub open: u64,
}

/// Ledger sums of the day.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct LedgerSums {
    pub charges: u64,
    pub charged_amount: i64,
    pub refunds: u64,
    pub refunded_amount: i64,
}

/// The reconciliation report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Report {
    pub store_id: String,
    pub date: String,
    /// The store's time zone the day was computed in, as stored: an IANA name
    /// (`Europe/Berlin`), a fixed UTC offset (`+08:00`), or `UTC`.
    pub timezone: String,
    pub counts: DayCounts,
    pub ledger: LedgerSums,
    /// Number of expected business numbers given, if any.
    pub expected: Option<u64>,
    /// Expected business numbers with no printed (or operator-closed) task this day.
    pub expected_not_printed: Vec<String>,
    /// Business numbers printed this day that were not expected (only with expectations).
    pub printed_not_expected: Vec<String>,
    /// Keys (`biz_no` + print type) printed by more than one task, reprints aside. Must
    /// be empty: anything here is a duplicate print.
    pub printed_more_than_once: Vec<String>,
}

impl Report {
    /// Whether anything needs a person's attention.
    pub fn has_differences(&self) -> bool {
        !self.expected_not_printed.is_empty()
            || !self.printed_not_expected.is_empty()
            || !self.printed_more_than_once.is_empty()
    }
}

/// Computes the report from the day's tasks and ledger entries.
pub fn compute(
    store_id: &str,
    date: &str,
    timezone: &str,
    tasks: &[Task],
    ledger: &[LedgerEntry],
    expected: Option<&[String]>,
) -> Report {
    let by_id: HashMap<&str, &Task> = tasks.iter().map(|t| (t.task_id.as_str(), t)).collect();
    let mut counts = DayCounts::default();
    // Business numbers whose paper exists (printed, or closed by an operator who saw it).
    let mut on_paper: BTreeSet<String> = BTreeSet::new();
    let mut printed_by_key: BTreeMap<(String, String), u64> = BTreeMap::new();
    for t in tasks {
        match t.state {
            TaskState::Failed => counts.failed += 1,
            TaskState::InDoubt => counts.in_doubt += 1,
            TaskState::Transferred => counts.transferred += 1,
            TaskState::Cancelled => counts.cancelled += 1,
            TaskState::Closed => counts.closed += 1,
            TaskState::Pending | TaskState::Sent | TaskState::Retrying => counts.open += 1,
            TaskState::Printed => {}
        }
        if matches!(t.state, TaskState::Printed | TaskState::Closed) {
            on_paper.insert(t.biz_no.clone());
        }
        if t.state == TaskState::Printed && t.origin_kind != Some(OriginKind::Reprint) {
            *printed_by_key.entry((t.biz_no.clone(), t.print_type.clone())).or_default() += 1;
        }
        match t.origin_kind {
            None => {
                counts.submitted += 1;
                // Follow transfers and failovers to the task that carried the work.
                let mut cur = t;
                for _ in 0..32 {
                    match cur.successor_task_id.as_deref().and_then(|s| by_id.get(s)) {
                        Some(next) => cur = next,
                        None => break,
                    }
                }
                if cur.state == TaskState::Printed {
                    counts.printed += 1;
                }
            }
            Some(OriginKind::Reprint) => counts.reprinted += 1,
            Some(_) => {}
        }
    }
    let mut sums = LedgerSums::default();
    for e in ledger {
        match e.kind.as_str() {
            "charge" => {
                sums.charges += 1;
                sums.charged_amount += e.amount;
            }
            "refund" => {
                sums.refunds += 1;
                sums.refunded_amount += e.amount;
            }
            _ => {}
        }
    }
    let (expected_not_printed, printed_not_expected) = match expected {
        Some(list) => {
            let want: BTreeSet<String> = list.iter().map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()).collect();
            let printed: BTreeSet<String> =
                tasks.iter().filter(|t| t.state == TaskState::Printed).map(|t| t.biz_no.clone()).collect();
            (want.difference(&on_paper).cloned().collect(), printed.difference(&want).cloned().collect())
        }
        None => (Vec::new(), Vec::new()),
    };
    Report {
        store_id: store_id.to_owned(),
        date: date.to_owned(),
        timezone: timezone.to_owned(),
        counts,
        ledger: sums,
        expected: expected.map(|e| e.len() as u64),
        expected_not_printed,
        printed_not_expected,
        printed_more_than_once: printed_by_key
            .into_iter()
            .filter(|(_, n)| *n > 1)
            .map(|((biz, pt), n)| format!("{biz} ({pt}) × {n}"))
            .collect(),
    }
}

/// Why a reconciliation could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("no store {0:?}")]
    NoStore(String),
    #[error("date: {0:?} is not a date like 2026-11-29")]
    BadDate(String),
    /// The store's stored time zone is not one this broker knows. Stores are only
    /// created with zones that parse, so this means the row was changed by other means
    /// (or by a broker with a newer time zone database).
    #[error("store {store_id:?} has a time zone this broker does not know: {error}")]
    StoreZone { store_id: String, error: tz::ZoneError },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Fetches the day's rows and computes the report.
pub async fn reconcile(
    store: &dyn Store,
    tenant_id: &str,
    store_id: &str,
    date: &str,
    expected: Option<&[String]>,
) -> Result<Report, ReconcileError> {
    let shop =
        store.get_store(tenant_id, store_id).await?.ok_or_else(|| ReconcileError::NoStore(store_id.to_owned()))?;
    let zone = tz::parse(&shop.timezone)
        .map_err(|error| ReconcileError::StoreZone { store_id: store_id.to_owned(), error })?;
    let window = day_window(date, &zone).ok_or_else(|| ReconcileError::BadDate(date.to_owned()))?;
    // Task ids begin with their creation time, so the day is an id range.
    let from_id = TaskId::from_parts(window.from, [0; 10]).into_string();
    let to_id = TaskId::from_parts(window.to, [0; 10]).into_string();
    // Pruned tasks count from their tombstones, which keep every field the report reads:
    // a day's report is the same before and after retention (R39). One read, so that a
    // prune running meanwhile cannot count a task twice or not at all.
    let (mut tasks, pruned) = store.tasks_and_tombstones_created_between(tenant_id, store_id, &from_id, &to_id).await?;
    tasks.extend(pruned.into_iter().map(|b| b.task));
    let ledger = store.ledger_between(tenant_id, store_id, window.from, window.to).await?;
    Ok(compute(store_id, date, zone.name(), &tasks, &ledger, expected))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zone(name: &str) -> Zone {
        tz::parse(name).expect(name)
    }

    const HOUR: i64 = 3_600_000;

    #[test]
    fn business_days_start_at_local_midnight() {
        let utc = day_window("2026-11-29", &Zone::utc()).unwrap();
        assert_eq!(utc.from, 1_795_910_400_000); // date -u -d 2026-11-29 +%s
        assert_eq!(utc.to - utc.from, 86_400_000);
        let shanghai = day_window("2026-11-29", &zone("+08:00")).unwrap();
        assert_eq!(utc.from - shanghai.from, 8 * HOUR);
        assert_eq!(shanghai.to - shanghai.from, 24 * HOUR);
        let newfoundland_ish = day_window("2026-11-29", &zone("-03:30")).unwrap();
        assert_eq!(newfoundland_ish.from - utc.from, 3 * HOUR + HOUR / 2);
        assert_eq!(day_window("2026-11-29", &zone("Asia/Shanghai")), Some(shanghai));
        assert_eq!(day_window("1970-01-01", &Zone::utc()).unwrap().from, 0);
        assert_eq!(day_window("2024-02-29", &Zone::utc()).map(|w| w.from % 86_400_000), Some(0));
        for bad in ["2026-02-30", "2026-13-01", "2026-1-01", "yesterday", "2023-02-29", "", "1969-12-31", "2026-+1-01"]
        {
            assert!(day_window(bad, &Zone::utc()).is_none(), "{bad}");
            assert!(day_window(bad, &zone("Europe/Berlin")).is_none(), "{bad}");
        }
    }

    #[test]
    fn business_days_follow_daylight_saving_time() {
        // date -d 'TZ="Europe/Berlin" 2026-03-29 00:00' +%s → 1774738800
        let berlin = zone("Europe/Berlin");
        let spring = day_window("2026-03-29", &berlin).unwrap();
        assert_eq!(spring.from, 1_774_738_800_000);
        assert_eq!(spring.to - spring.from, 23 * HOUR, "clocks jump from 02:00 to 03:00");
        // date -d 'TZ="Europe/Berlin" 2026-10-25 00:00' +%s → 1792879200
        let autumn = day_window("2026-10-25", &berlin).unwrap();
        assert_eq!(autumn.from, 1_792_879_200_000);
        assert_eq!(autumn.to - autumn.from, 25 * HOUR, "clocks go back from 03:00 to 02:00");
        // 23:30 local time on the long day is 22:30 UTC (+01:00 after the change): inside.
        let late = autumn.from + 24 * HOUR + 30 * 60_000;
        assert!(late < autumn.to);
        // The days around a change still join without a gap or an overlap.
        assert_eq!(day_window("2026-10-24", &berlin).unwrap().to, autumn.from);
        assert_eq!(day_window("2026-10-26", &berlin).unwrap().from, autumn.to);
        assert_eq!(day_window("2026-07-01", &berlin).map(|w| w.to - w.from), Some(24 * HOUR));

        // date -d 'TZ="America/New_York" 2026-03-08 00:00' +%s → 1772946000
        let new_york = zone("America/New_York");
        let spring = day_window("2026-03-08", &new_york).unwrap();
        assert_eq!(spring.from, 1_772_946_000_000);
        assert_eq!(spring.to - spring.from, 23 * HOUR);
        // date -d 'TZ="America/New_York" 2026-11-01 00:00' +%s → 1793505600
        let autumn = day_window("2026-11-01", &new_york).unwrap();
        assert_eq!(autumn.from, 1_793_505_600_000);
        assert_eq!(autumn.to - autumn.from, 25 * HOUR);

        // A fixed offset never changes, whatever the season.
        assert_eq!(day_window("2026-10-25", &zone("+01:00")).map(|w| w.to - w.from), Some(24 * HOUR));
    }

    #[test]
    fn a_day_whose_midnight_does_not_exist_starts_after_the_gap() {
        // Brazil moved its clocks forward at midnight: on 2018-11-04 São Paulo went from
        // 00:00 -03:00 straight to 01:00 -02:00, so that day began at 01:00 local time.
        // date -u -d '2018-11-04 01:00 -0200' +%s → 1541300400
        let sao_paulo = day_window("2018-11-04", &zone("America/Sao_Paulo")).unwrap();
        assert_eq!(sao_paulo.from, 1_541_300_400_000);
        assert_eq!(sao_paulo.to - sao_paulo.from, 23 * HOUR);
    }

    fn task(id: &str, biz: &str, state: TaskState, origin: Option<OriginKind>, succ: Option<&str>) -> Task {
        Task {
            task_id: id.into(),
            tenant_id: "t".into(),
            store_id: "s1".into(),
            printer_id: "p1".into(),
            station_id: None,
            target: "printer:p1".into(),
            biz_no: biz.into(),
            print_type: "receipt".into(),
            priority: 10,
            content_type: "text".into(),
            fingerprint: "f".into(),
            state,
            attempts: 1,
            last_error: None,
            next_attempt_at: None,
            created_at: 0,
            updated_at: 0,
            printed_at: None,
            sent_to: None,
            sent_session: None,
            sent_at: None,
            may_have_printed: false,
            origin_task_id: origin.map(|_| "X".into()),
            origin_kind: origin,
            reprint_no: None,
            successor_task_id: succ.map(str::to_owned),
        }
    }

    #[test]
    fn a_hand_computed_day() {
        use TaskState::*;
        let tasks = vec![
            task("1", "A1", Printed, None, None),
            task("2", "A2", Transferred, None, Some("5")),
            task("3", "A3", InDoubt, None, None),
            task("4", "A4", Cancelled, None, None),
            task("5", "A2", Printed, Some(OriginKind::Transfer), None),
            task("6", "A1", Printed, Some(OriginKind::Reprint), None),
            task("7", "Z9", Printed, None, None),
        ];
        let ledger = vec![
            LedgerEntry { task_id: "1".into(), tenant_id: "t".into(), kind: "charge".into(), amount: 1, at: 0 },
            LedgerEntry { task_id: "4".into(), tenant_id: "t".into(), kind: "charge".into(), amount: 1, at: 0 },
            LedgerEntry { task_id: "4".into(), tenant_id: "t".into(), kind: "refund".into(), amount: 1, at: 0 },
        ];
        let expected: Vec<String> = ["A1", "A2", "A3", "A4", "A5"].iter().map(|s| s.to_string()).collect();
        let r = compute("s1", "2026-11-29", "+00:00", &tasks, &ledger, Some(&expected));
        assert_eq!(
            r.counts,
            DayCounts {
                submitted: 5,
                printed: 3,
                reprinted: 1,
                failed: 0,
                in_doubt: 1,
                transferred: 1,
                cancelled: 1,
                closed: 0,
                open: 0
            }
        );
        assert_eq!(r.ledger, LedgerSums { charges: 2, charged_amount: 2, refunds: 1, refunded_amount: 1 });
        assert_eq!(r.expected_not_printed, vec!["A3", "A4", "A5"]);
        assert_eq!(r.printed_not_expected, vec!["Z9"]);
        assert!(r.printed_more_than_once.is_empty(), "a reprint is not a duplicate");
        assert!(r.has_differences());
        let dup =
            vec![task("1", "A1", Printed, None, None), task("8", "A1", Printed, Some(OriginKind::Failover), None)];
        let r = compute("s1", "d", "+00:00", &dup, &[], None);
        assert_eq!(r.printed_more_than_once, vec!["A1 (receipt) × 2"]);
    }
}
