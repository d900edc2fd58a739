//! The day in pictures, on the day's page (reconciliation): tickets per hour, the time from
//! the order to paper (median and the time 95 % of tickets were printed within, per hour
//! and for the day), and the tickets that failed or were in doubt by reason and by
//! printer. Figures come from the tasks created that business day in the store's time zone
//! (the kept ones: a pruned task no longer has its times), drawn by `charts`.

use std::collections::BTreeMap;

use onceprint_core::TaskState;
use onceprint_engine::tz::Zone;
use onceprint_store::{Printer, Task};

use super::charts::{self, Bar};
use super::html::{age, esc};
use super::i18n::Lang;
use super::pages::{name_of, printer_names, Shop};
use super::ConsoleError;
use crate::AppState;

/// The figures of one day.
#[derive(Debug, Default, PartialEq)]
pub struct Figures {
    /// Tickets from the order system (no reprints or moved copies), by the local hour
    /// they came in.
    pub per_hour: [u64; 24],
    /// Milliseconds from submission to paper of each printed ticket from the order system,
    /// with the hour it came in.
    pub to_paper: Vec<(usize, i64)>,
    /// Tickets that did not print by themselves (failed or in doubt now, resolved by a
    /// person since, or moved on after a failure), by reason (its key) and by printer.
    pub trouble_by_reason: BTreeMap<String, u64>,
    pub trouble_by_printer: BTreeMap<String, u64>,
}

/// Whether a ticket needed a person or a move: failed or in doubt now, closed (which only
/// a person's action after a failure or doubt does), or moved or cancelled after an error.
fn troubled(t: &Task) -> bool {
    match t.state {
        TaskState::Failed | TaskState::InDoubt | TaskState::Closed => true,
        TaskState::Transferred | TaskState::Cancelled => t.last_error.is_some(),
        _ => false,
    }
}

/// The reason a troubled ticket is counted under: the kind of its last error (the part
/// `Lang::reason` reads), or its state when it has none.
fn reason_key(t: &Task) -> String {
    match &t.last_error {
        Some(e) => e.split(':').next().unwrap_or("").trim().to_owned(),
        None if t.state == TaskState::InDoubt => "in_doubt".to_owned(),
        None => "error".to_owned(),
    }
}

pub fn figures(tasks: &[Task], zone: &Zone) -> Figures {
    let mut f = Figures::default();
    for t in tasks {
        let hour = zone.local_hour(t.created_at).map_or(0, usize::from).min(23);
        if t.origin_kind.is_none() {
            f.per_hour[hour] += 1;
            if let Some(p) = t.printed_at {
                f.to_paper.push((hour, (p - t.created_at).max(0)));
            }
        }
        if troubled(t) {
            *f.trouble_by_reason.entry(reason_key(t)).or_default() += 1;
            *f.trouble_by_printer.entry(t.printer_id.clone()).or_default() += 1;
        }
    }
    f
}

/// The value below which `p` of the sorted values lie (nearest rank), `None` for none.
pub fn percentile(sorted: &[i64], p: f64) -> Option<i64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

/// A time to paper for people: tenths of a second under a minute ("2.4 s", "2.4 秒"),
/// else as the console writes durations.
fn duration(lang: Lang, ms: i64) -> String {
    if ms < 60_000 {
        let unit = match lang {
            Lang::En => "s",
            Lang::Zh => "秒",
        };
        format!("{:.1} {unit}", ms as f64 / 1000.0)
    } else {
        age(lang, ms)
    }
}

fn hours(h: usize) -> String {
    format!("{h:02}:00–{:02}:00", h + 1)
}

/// Bars longest first, for the reason and printer charts.
fn ranked(counts: impl IntoIterator<Item = (String, String, u64)>, lang: Lang) -> Vec<Bar> {
    let mut v: Vec<(String, String, u64)> = counts.into_iter().collect();
    v.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| a.1.cmp(&b.1)));
    v.into_iter()
        .map(|(key, label, n)| Bar {
            title: format!("{label}: {n} {}", lang.t("day.tickets")),
            key,
            label,
            value: n as f64,
            shown: n.to_string(),
            inner: None,
        })
        .collect()
}

/// The section of pictures for the day's page.
pub fn section(lang: Lang, f: &Figures, printers: &[Printer]) -> String {
    let mut out = format!("<section class=\"card day\" id=\"day-pictures\"><h2>{}</h2>", esc(lang.t("day.title")));
    let total: u64 = f.per_hour.iter().sum();
    // Tickets per hour.
    out.push_str(&format!("<h3>{}</h3>", esc(lang.t("day.per_hour"))));
    if total == 0 {
        out.push_str(&format!("<p class=\"muted\">{}</p>", esc(lang.t("day.no_tickets"))));
    } else {
        let bars: Vec<Bar> = f
            .per_hour
            .iter()
            .enumerate()
            .map(|(h, &n)| Bar {
                key: h.to_string(),
                label: h.to_string(),
                value: n as f64,
                shown: n.to_string(),
                title: format!("{}: {n} {}", hours(h), lang.t("day.tickets")),
                inner: None,
            })
            .collect();
        let desc = format!("{total} {}", lang.t("day.tickets"));
        out.push_str(&charts::columns("chart-hours", lang.t("day.per_hour"), &desc, &bars, 3));
    }
    // Time from the order to paper: the day's figures in words, then per hour.
    out.push_str(&format!("<h3>{}</h3>", esc(lang.t("day.to_paper"))));
    let mut all: Vec<i64> = f.to_paper.iter().map(|(_, ms)| *ms).collect();
    all.sort_unstable();
    match (percentile(&all, 0.5), percentile(&all, 0.95)) {
        (Some(median), Some(p95)) => {
            out.push_str(&format!(
                "<dl class=\"grid\" id=\"to-paper\"><dt>{}</dt><dd data-figure=\"median\">{}</dd>\
                 <dt>{}</dt><dd data-figure=\"p95\">{}</dd><dt>{}</dt><dd data-figure=\"printed\">{}</dd></dl>",
                esc(lang.t("day.median")),
                esc(&duration(lang, median)),
                esc(lang.t("day.p95")),
                esc(&duration(lang, p95)),
                esc(lang.t("day.printed")),
                all.len(),
            ));
            let mut by_hour: BTreeMap<usize, Vec<i64>> = BTreeMap::new();
            for (h, ms) in &f.to_paper {
                by_hour.entry(*h).or_default().push(*ms);
            }
            let bars: Vec<Bar> = (0..24)
                .map(|h| {
                    let mut v = by_hour.remove(&h).unwrap_or_default();
                    v.sort_unstable();
                    match (percentile(&v, 0.5), percentile(&v, 0.95)) {
                        (Some(m), Some(p)) => Bar {
                            key: h.to_string(),
                            label: h.to_string(),
                            value: p as f64,
                            inner: Some(m as f64),
                            shown: duration(lang, p),
                            title: format!(
                                "{}: {} {}, {} {} ({} {})",
                                hours(h),
                                lang.t("day.median"),
                                duration(lang, m),
                                lang.t("day.p95"),
                                duration(lang, p),
                                v.len(),
                                lang.t("day.printed")
                            ),
                        },
                        _ => Bar {
                            key: h.to_string(),
                            label: h.to_string(),
                            shown: String::new(),
                            title: format!("{}: –", hours(h)),
                            ..Default::default()
                        },
                    }
                })
                .collect();
            let desc = format!(
                "{} {}, {} {}",
                lang.t("day.median"),
                duration(lang, median),
                lang.t("day.p95"),
                duration(lang, p95)
            );
            out.push_str(&charts::columns("chart-to-paper", lang.t("day.to_paper"), &desc, &bars, 3));
            out.push_str(&format!("<p class=\"muted\">{}</p>", esc(lang.t("day.to_paper_legend"))));
        }
        _ => out.push_str(&format!("<p class=\"muted\">{}</p>", esc(lang.t("day.no_prints")))),
    }
    // Failures and doubts, by reason and by printer.
    out.push_str(&format!("<h3>{}</h3>", esc(lang.t("day.trouble"))));
    let troubled: u64 = f.trouble_by_reason.values().sum();
    if troubled == 0 {
        out.push_str(&format!("<p class=\"fine\">{}</p>", esc(lang.t("day.no_trouble"))));
    } else {
        let desc = format!("{troubled} {}", lang.t("day.tickets"));
        let reasons = ranked(
            f.trouble_by_reason.iter().map(|(k, n)| {
                // The reason in words without what to do: "Out of paper", "Offline".
                let words = lang.reason(k);
                let short = words.split(" — ").next().unwrap_or(&words).to_owned();
                (k.clone(), short, *n)
            }),
            lang,
        );
        out.push_str(&format!("<h4>{}</h4>", esc(lang.t("day.by_reason"))));
        out.push_str(&charts::rows("chart-reasons", lang.t("day.by_reason"), &desc, &reasons));
        let names = printer_names(printers);
        let by_printer =
            ranked(f.trouble_by_printer.iter().map(|(id, n)| (id.clone(), name_of(&names, id).to_owned(), *n)), lang);
        out.push_str(&format!("<h4>{}</h4>", esc(lang.t("day.by_printer"))));
        out.push_str(&charts::rows("chart-printers", lang.t("day.by_printer"), &desc, &by_printer));
    }
    out.push_str("</section>");
    out
}

/// The pictures of `date` (a business day of the store), read from the store.
pub async fn pictures(st: &AppState, shop: &Shop, lang: Lang, date: &str) -> Result<String, ConsoleError> {
    let Some(window) = onceprint_engine::reconcile::day_window(date, &shop.zone) else {
        return Ok(String::new());
    };
    let id = |ms: i64| onceprint_core::TaskId::from_parts(ms, [0; 10]).into_string();
    let tasks =
        st.store.tasks_created_between(&shop.row.tenant_id, &shop.row.id, &id(window.from), &id(window.to)).await?;
    let printers = st.store.list_printers(&shop.row.tenant_id, Some(&shop.row.id)).await?;
    Ok(section(lang, &figures(&tasks, &shop.zone), &printers))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<i64> = (1..=20).map(|i| i * 100).collect();
        assert_eq!(percentile(&v, 0.5), Some(1000));
        assert_eq!(percentile(&v, 0.95), Some(1900));
        assert_eq!(percentile(&[700], 0.95), Some(700));
        assert_eq!(percentile(&[], 0.5), None);
        assert_eq!(duration(Lang::En, 2_340), "2.3 s");
        assert_eq!(duration(Lang::Zh, 2_340), "2.3 秒");
        assert_eq!(duration(Lang::En, 180_000), "3 min");
    }

    #[test]
    fn the_words_of_the_pictures_list_and_bulk_are_in_both_languages() {
        let keys = [
            "day.title",
            "day.tickets",
            "day.per_hour",
            "day.no_tickets",
            "day.to_paper",
            "day.median",
            "day.p95",
            "day.printed",
            "day.no_prints",
            "day.to_paper_legend",
            "day.trouble",
            "day.no_trouble",
            "day.by_reason",
            "day.by_printer",
            "tickets.from",
            "tickets.to",
            "tickets.newer",
            "tickets.older",
            "bulk.pick",
            "bulk.title",
            "bulk.reason",
            "bulk.printer",
            "bulk.own_printer",
            "bulk.reprint",
            "bulk.mark_printed",
            "bulk.done",
            "bulk.none",
            "bulk.refused",
            "bulk.unknown_ticket",
            "bulk.why.state",
            "bulk.why.printer",
            "bulk.why.unknown",
            "bulk.why.reason",
            "bulk.why.other",
        ];
        for k in keys {
            assert_ne!(Lang::En.t(k), k, "{k} in English");
            assert_ne!(Lang::Zh.t(k), k, "{k} in Chinese");
            assert_ne!(Lang::En.t(k), Lang::Zh.t(k), "{k} is translated");
        }
    }

    #[test]
    fn a_day_is_counted_by_hour_outcome_reason_and_printer() {
        let zone = onceprint_engine::tz::parse("Asia/Shanghai").expect("zone");
        // 2026-12-06 10:15 in Shanghai is 02:15 UTC.
        let at = zone.instant_at("2026-12-06", 10, 15).expect("instant");
        let task = |id: &str, state: TaskState, printer: &str, error: Option<&str>, printed: Option<i64>| Task {
            task_id: id.into(),
            printer_id: printer.into(),
            state,
            last_error: error.map(Into::into),
            created_at: at,
            printed_at: printed.map(|p| at + p),
            ..test_task()
        };
        let tasks = vec![
            task("a", TaskState::Printed, "p0", None, Some(1_000)),
            task("b", TaskState::Printed, "p0", None, Some(3_000)),
            task("c", TaskState::Failed, "p1", Some("offline"), None),
            task("d", TaskState::InDoubt, "p1", Some("in_doubt: no answer"), None),
            task("e", TaskState::Pending, "p0", None, None),
        ];
        let f = figures(&tasks, &zone);
        assert_eq!(f.per_hour[10], 5);
        assert_eq!(f.per_hour.iter().sum::<u64>(), 5);
        assert_eq!(f.to_paper, vec![(10, 1_000), (10, 3_000)]);
        assert_eq!(f.trouble_by_reason.get("offline"), Some(&1));
        assert_eq!(f.trouble_by_reason.get("in_doubt"), Some(&1));
        assert_eq!(f.trouble_by_printer.get("p1"), Some(&2));
        let html = section(Lang::En, &f, &[]);
        assert!(html.contains("id=\"chart-hours\""), "{html}");
        assert!(html.contains("data-figure=\"median\">1.0 s"), "{html}");
        assert!(html.contains("data-figure=\"p95\">3.0 s"), "{html}");
        assert!(html.contains(">Offline</text>"), "{html}");
    }

    fn test_task() -> Task {
        Task {
            task_id: String::new(),
            tenant_id: "t".into(),
            store_id: "s".into(),
            printer_id: String::new(),
            station_id: None,
            target: String::new(),
            biz_no: "B".into(),
            print_type: "receipt".into(),
            priority: 10,
            content_type: "text".into(),
            fingerprint: String::new(),
            state: TaskState::Pending,
            attempts: 0,
            last_error: None,
            next_attempt_at: None,
            created_at: 0,
            updated_at: 0,
            printed_at: None,
            sent_to: None,
            sent_session: None,
            sent_at: None,
            may_have_printed: false,
            refusals: 0,
            origin_task_id: None,
            origin_kind: None,
            reprint_no: None,
            successor_task_id: None,
        }
    }
}
