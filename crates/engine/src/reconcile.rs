//! Daily reconciliation: a store's business day of tasks and ledger entries against
//! the orders the merchant expected, with the differences listed.
//!
//! The computation is a pure function of the day's rows ([`compute`]), so it is tested on
//! hand-built days; [`reconcile`] only fetches the rows.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use onceprint_core::{delivery_key, Millis, TaskId, TaskState};
use onceprint_store::{DeviceLogRecord, DeviceLogState, LedgerEntry, OriginKind, Store, StoreError, Task};
use serde::Serialize;

use crate::transport::{TransportConfig, TransportKind};
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
pub(crate) fn parse_date(date: &str) -> Option<jiff::civil::Date> {
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

/// Whether the store's agents reported a device log for the day.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeviceLogPresence {
    /// No agent of the store uploaded a record for a task of the day: the device side
    /// cannot be compared, so `broker_printed_device_not` is left empty (and its count
    /// null) rather than listing every printed task.
    None,
    /// Records for the day's tasks were uploaded and compared.
    Present,
}

/// Counts of the comparison with the device log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct DeviceCounts {
    /// Device log records of the day's tasks (one per task: its latest).
    pub records: u64,
    /// Of those, the ones saying `printed`.
    pub device_printed: u64,
    /// Tasks of the day `printed` at the broker on printers the store agent drives
    /// (transport `agent`).
    pub broker_printed: u64,
    /// Entries of `device_printed_broker_not`.
    pub device_printed_broker_not: u64,
    /// Entries of `broker_printed_device_not`; null when there is no device log for the day.
    pub broker_printed_device_not: Option<u64>,
}

/// One task on which the device log and the broker disagree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct DeviceDifference {
    pub task_id: String,
    /// The idempotency key the job carried: as the device reported it, or, for a task the
    /// device log does not have, as the broker sends it (`biz_no#printer_id`…).
    pub key: String,
    pub printer_id: String,
    /// What the device log says (`printed`, `in_doubt`, `failed`); null when it has no
    /// record of the task.
    pub device_state: Option<String>,
    /// The broker's state of the task; null when the broker has no task of this store's
    /// day under this id.
    pub broker_state: Option<String>,
}

/// What the device side of a day looks like, as [`compute`] reads it.
#[derive(Debug, Clone, Copy)]
pub struct DeviceDay<'a> {
    /// The device log records of the day's tasks (their ids in the day's range).
    pub records: &'a [DeviceLogRecord],
    /// The store's printers driven by the store agent: the only ones whose printed tasks
    /// the device log can speak of.
    pub agent_printers: &'a BTreeSet<String>,
}

impl DeviceDay<'static> {
    /// A day without device log (and so without agent printers to compare).
    pub fn none() -> DeviceDay<'static> {
        static NO_PRINTERS: BTreeSet<String> = BTreeSet::new();
        DeviceDay { records: &[], agent_printers: &NO_PRINTERS }
    }
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
    /// Whether the store's agents uploaded a device log for the day's tasks.
    pub device_log: DeviceLogPresence,
    pub device_counts: DeviceCounts,
    /// Tasks the device log says printed whose broker task is not `printed` (or that the
    /// broker has no task of this day under), by task id.
    pub device_printed_broker_not: Vec<DeviceDifference>,
    /// Tasks `printed` at the broker on the store agent's printers that the device log
    /// does not report printed (no record, or in doubt or failed), by task id. Empty when
    /// `device_log` is `none`.
    pub broker_printed_device_not: Vec<DeviceDifference>,
}

impl Report {
    /// Whether anything needs a person's attention.
    pub fn has_differences(&self) -> bool {
        !self.expected_not_printed.is_empty()
            || !self.printed_not_expected.is_empty()
            || !self.printed_more_than_once.is_empty()
            || !self.device_printed_broker_not.is_empty()
            || !self.broker_printed_device_not.is_empty()
    }
}

/// The day's tasks against the device log: what one side says printed and the other does
/// not. Tasks are matched by task id.
///
/// The records come keyed by the broker's task id: [`reconcile`] has already put a record
/// under a LAN task id that the broker merged into another task (`task_aliases`) under
/// that task's id.
fn compare_device_log(
    tasks: &[Task],
    by_id: &HashMap<&str, &Task>,
    device: DeviceDay<'_>,
) -> (DeviceLogPresence, DeviceCounts, Vec<DeviceDifference>, Vec<DeviceDifference>) {
    let records: HashMap<&str, &DeviceLogRecord> = device.records.iter().map(|r| (r.task_id.as_str(), r)).collect();
    let mut device_printed_broker_not: Vec<DeviceDifference> = device
        .records
        .iter()
        .filter(|r| r.state == DeviceLogState::Printed)
        .filter_map(|r| {
            let broker = by_id.get(r.task_id.as_str()).map(|t| t.state);
            (broker != Some(TaskState::Printed)).then(|| DeviceDifference {
                task_id: r.task_id.clone(),
                key: r.key.clone(),
                printer_id: r.printer_id.clone(),
                device_state: Some(r.state.as_str().to_owned()),
                broker_state: broker.map(|s| s.as_str().to_owned()),
            })
        })
        .collect();
    device_printed_broker_not.sort_by(|a, b| a.task_id.cmp(&b.task_id));
    let broker_printed: Vec<&Task> = tasks
        .iter()
        .filter(|t| t.state == TaskState::Printed && device.agent_printers.contains(&t.printer_id))
        .collect();
    let presence = if device.records.is_empty() { DeviceLogPresence::None } else { DeviceLogPresence::Present };
    let mut broker_printed_device_not: Vec<DeviceDifference> = match presence {
        DeviceLogPresence::None => Vec::new(),
        DeviceLogPresence::Present => broker_printed
            .iter()
            .filter_map(|t| {
                let rec = records.get(t.task_id.as_str());
                (rec.map(|r| r.state) != Some(DeviceLogState::Printed)).then(|| DeviceDifference {
                    task_id: t.task_id.clone(),
                    key: rec
                        .map(|r| r.key.clone())
                        .unwrap_or_else(|| delivery_key(&t.biz_no, &t.printer_id, &t.target, &t.print_type)),
                    printer_id: t.printer_id.clone(),
                    device_state: rec.map(|r| r.state.as_str().to_owned()),
                    broker_state: Some(t.state.as_str().to_owned()),
                })
            })
            .collect(),
    };
    broker_printed_device_not.sort_by(|a, b| a.task_id.cmp(&b.task_id));
    let counts = DeviceCounts {
        records: device.records.len() as u64,
        device_printed: device.records.iter().filter(|r| r.state == DeviceLogState::Printed).count() as u64,
        broker_printed: broker_printed.len() as u64,
        device_printed_broker_not: device_printed_broker_not.len() as u64,
        broker_printed_device_not: match presence {
            DeviceLogPresence::None => None,
            DeviceLogPresence::Present => Some(broker_printed_device_not.len() as u64),
        },
    };
    (presence, counts, device_printed_broker_not, broker_printed_device_not)
}

/// Computes the report from the day's tasks and ledger entries.
pub fn compute(
    store_id: &str,
    date: &str,
    timezone: &str,
    tasks: &[Task],
    ledger: &[LedgerEntry],
    expected: Option<&[String]>,
    device: DeviceDay<'_>,
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
    let (device_log, device_counts, device_printed_broker_not, broker_printed_device_not) =
        compare_device_log(tasks, &by_id, device);
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
        device_log,
        device_counts,
        device_printed_broker_not,
        broker_printed_device_not,
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
    // a day's report is the same before and after retention. One read, so that a
    // prune running meanwhile cannot count a task twice or not at all.
    let (mut tasks, pruned) = store.tasks_and_tombstones_created_between(tenant_id, store_id, &from_id, &to_id).await?;
    tasks.extend(pruned.into_iter().map(|b| b.task));
    let ledger = store.ledger_between(tenant_id, store_id, window.from, window.to).await?;
    // The device log of the same tasks: records under the day's id range. Which printers
    // the agent drives is read as they are set up now; a printer moved to another
    // transport during the day is judged by its new one.
    let mut records = store.device_log_between(tenant_id, store_id, &from_id, &to_id).await?;
    resolve_aliases(store, tenant_id, &tasks, &mut records).await?;
    add_aliases_outside_the_day(store, tenant_id, store_id, &tasks, &mut records).await?;
    let agent_printers: BTreeSet<String> = store
        .list_printers(tenant_id, Some(store_id))
        .await?
        .into_iter()
        .filter(|p| TransportConfig::from_stored(&p.transport).is_some_and(|t| t.kind() == TransportKind::Agent))
        .map(|p| p.id)
        .collect();
    let device = DeviceDay { records: &records, agent_printers: &agent_printers };
    Ok(compute(store_id, date, zone.name(), &tasks, &ledger, expected, device))
}

/// Puts each device record whose task id is no task of the day but a LAN task id the broker
/// merged into one of them (the order reached the cloud and the shop) under that
/// task's id, so that the device's "printed" under its own id counts for the broker's
/// task. Only the few records that match no task are looked up. Of two records that end
/// up under one task, the one that says most is kept (printed over in doubt over failed).
async fn resolve_aliases(
    store: &dyn Store,
    tenant_id: &str,
    tasks: &[Task],
    records: &mut Vec<DeviceLogRecord>,
) -> Result<(), ReconcileError> {
    let known: std::collections::HashSet<&str> = tasks.iter().map(|t| t.task_id.as_str()).collect();
    let mut moved = false;
    let mut elsewhere: std::collections::HashSet<String> = std::collections::HashSet::new();
    for r in records.iter_mut() {
        if known.contains(r.task_id.as_str()) {
            continue;
        }
        if let Some(alias) = store.task_alias(tenant_id, &r.task_id).await? {
            if known.contains(alias.task_id.as_str()) {
                r.task_id = alias.task_id;
                moved = true;
            } else {
                // Merged into a task of another day (the agent's clock was off): it counts
                // on that task's day (`add_aliases_outside_the_day`), not as a print the
                // broker does not know.
                elsewhere.insert(r.task_id.clone());
            }
        }
    }
    if !elsewhere.is_empty() {
        records.retain(|r| !elsewhere.contains(&r.task_id));
    }
    if moved {
        records.sort_by(|a, b| a.task_id.cmp(&b.task_id).then(b.state.cmp(&a.state)));
        records.dedup_by(|later, kept| later.task_id == kept.task_id);
    }
    Ok(())
}

/// Adds, for the day's tasks the device log does not show printed, the records kept under
/// the LAN task ids merged into them that lie outside the day's id range: a LAN id sorts
/// by the acceptance time of the agent's clock, which a shop PC's clock far off puts on
/// another day than the task it was merged into. Of two records under one task the one
/// that says most is kept, as in [`resolve_aliases`].
async fn add_aliases_outside_the_day(
    store: &dyn Store,
    tenant_id: &str,
    store_id: &str,
    tasks: &[Task],
    records: &mut Vec<DeviceLogRecord>,
) -> Result<(), ReconcileError> {
    let printed: std::collections::HashSet<&str> =
        records.iter().filter(|r| r.state == DeviceLogState::Printed).map(|r| r.task_id.as_str()).collect();
    let open: Vec<String> =
        tasks.iter().filter(|t| !printed.contains(t.task_id.as_str())).map(|t| t.task_id.clone()).collect();
    let found = store.device_log_of_aliases(tenant_id, store_id, &open).await?;
    if found.is_empty() {
        return Ok(());
    }
    records.extend(found);
    records.sort_by(|a, b| a.task_id.cmp(&b.task_id).then(b.state.cmp(&a.state)));
    records.dedup_by(|later, kept| later.task_id == kept.task_id);
    Ok(())
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
            refusals: 0,
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
        let r = compute("s1", "2026-11-29", "+00:00", &tasks, &ledger, Some(&expected), DeviceDay::none());
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
        let r = compute("s1", "d", "+00:00", &dup, &[], None, DeviceDay::none());
        assert_eq!(r.printed_more_than_once, vec!["A1 (receipt) × 2"]);
    }

    fn device(task_id: &str, state: DeviceLogState) -> DeviceLogRecord {
        DeviceLogRecord {
            tenant_id: "t".into(),
            store_id: "s1".into(),
            task_id: task_id.into(),
            key: format!("dev-{task_id}"),
            printer_id: "p1".into(),
            state,
            at: 0,
            agent_id: "a1".into(),
            received_at: 0,
        }
    }

    #[test]
    fn the_device_log_against_the_broker() {
        use TaskState::*;
        let mut on_webhook = task("5", "W5", Printed, None, None);
        on_webhook.printer_id = "hook".into();
        let tasks = vec![
            task("1", "A1", Printed, None, None),
            task("2", "A#2", Printed, None, None),
            task("3", "A3", Sent, None, None),
            task("4", "A4", Printed, None, None),
            on_webhook,
            task("6", "A6", Closed, None, None),
        ];
        let agent_printers: BTreeSet<String> = ["p1".to_string()].into();

        // Without any record the device side is unknown, not "nothing printed".
        let r =
            compute("s1", "d", "UTC", &tasks, &[], None, DeviceDay { records: &[], agent_printers: &agent_printers });
        assert_eq!(r.device_log, DeviceLogPresence::None);
        assert!(r.broker_printed_device_not.is_empty() && r.device_printed_broker_not.is_empty());
        assert_eq!(
            r.device_counts,
            DeviceCounts {
                records: 0,
                device_printed: 0,
                broker_printed: 3,
                device_printed_broker_not: 0,
                broker_printed_device_not: None
            }
        );
        assert!(!r.has_differences());

        use DeviceLogState as D;
        // 1 agrees; 2 has no record; 3 printed on the device, sent at the broker; 4 is in
        // doubt on the device; 6 was closed by an operator; 9 is unknown to the broker; 5
        // went to a webhook printer, which no agent speaks for.
        let records = vec![
            device("1", D::Printed),
            device("3", D::Printed),
            device("4", D::InDoubt),
            device("6", D::Printed),
            device("9", D::Printed),
        ];
        let r = compute(
            "s1",
            "d",
            "UTC",
            &tasks,
            &[],
            None,
            DeviceDay { records: &records, agent_printers: &agent_printers },
        );
        assert_eq!(r.device_log, DeviceLogPresence::Present);
        let diff = |t: &str, key: &str, dev: Option<&str>, broker: Option<&str>| DeviceDifference {
            task_id: t.into(),
            key: key.into(),
            printer_id: "p1".into(),
            device_state: dev.map(str::to_owned),
            broker_state: broker.map(str::to_owned),
        };
        assert_eq!(
            r.device_printed_broker_not,
            vec![
                diff("3", "dev-3", Some("printed"), Some("sent")),
                diff("6", "dev-6", Some("printed"), Some("closed")),
                diff("9", "dev-9", Some("printed"), None),
            ]
        );
        assert_eq!(
            r.broker_printed_device_not,
            vec![
                // The broker's own key, with the `#` of the business number escaped.
                diff("2", "A%232#p1", None, Some("printed")),
                diff("4", "dev-4", Some("in_doubt"), Some("printed")),
            ]
        );
        assert_eq!(
            r.device_counts,
            DeviceCounts {
                records: 5,
                device_printed: 4,
                broker_printed: 3,
                device_printed_broker_not: 3,
                broker_printed_device_not: Some(2)
            }
        );
        assert!(r.has_differences());

        // A day on which both agree.
        let records = vec![device("1", D::Printed), device("2", D::Printed), device("4", D::Printed)];
        let r = compute(
            "s1",
            "d",
            "UTC",
            &tasks[..4],
            &[],
            None,
            DeviceDay { records: &records, agent_printers: &agent_printers },
        );
        assert!(r.device_printed_broker_not.is_empty() && r.broker_printed_device_not.is_empty(), "{r:?}");
        assert_eq!(r.device_counts.broker_printed_device_not, Some(0));
        assert!(!r.has_differences());
    }
}
