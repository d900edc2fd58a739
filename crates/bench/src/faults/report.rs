//! What `onceprint bench faults` reports, and how it is printed.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::chaos::KillRecord;
use super::check::{describe_lanes, Verdict};
use crate::report::finish_text;

/// The submissions of the run and what it took to get them answered.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SubmissionStats {
    /// Planned submissions: one original per task plus the repeats.
    pub planned: usize,
    /// Repeats of a task's submission (the client retry storm), and of those the ones
    /// sent at the same moment as the original, racing it on another connection.
    pub repeats: usize,
    pub racing_repeats: usize,
    /// HTTP attempts in all, and the ones that had to be retried: no answer (connection
    /// refused or reset) or a 5xx/429 answer.
    pub attempts: u64,
    pub retried_no_answer: usize,
    pub retried_5xx: usize,
    /// Retried attempts that no broker kill explains (must be 0).
    pub retried_while_up: usize,
    /// Final answers: 201, 200, anything else (including none by the deadline).
    pub created: usize,
    pub duplicate: usize,
    pub other: usize,
    /// Tasks whose submission was accepted (a 201 or 200 for the key).
    pub accepted_tasks: usize,
    /// From the first submission to the last answer.
    pub seconds: f64,
}

/// The sample of audit trails checked.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AuditCheck {
    pub checked: usize,
    pub inconsistent: usize,
    pub examples: Vec<String>,
}

/// Everything `onceprint bench faults` reports. Serialize it for `--json`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FaultsReport {
    /// `sqlite` or `postgres`.
    pub backend: String,
    pub machine: String,
    pub seed: u64,
    pub tasks: usize,
    pub printers: usize,
    /// The printers by transport (`8 agent, 2 cloudprnt, …`).
    pub fleet: String,
    pub concurrency: usize,
    /// Length of the fault phase as planned; submissions are spread over it.
    pub fault_window_seconds: f64,
    pub repeat_share: f64,
    pub fault_every_ms: u64,
    pub submissions: SubmissionStats,
    pub agent_kills: Vec<KillRecord>,
    pub broker_kills: Vec<KillRecord>,
    /// Broker nodes behind the load balancer (1: one broker, no balancer); the broker
    /// kills go to them in turn.
    pub nodes: usize,
    /// Whether the nodes had a Redis, and when it was killed (seconds into the phase).
    pub redis: bool,
    pub redis_killed_at_s: Option<f64>,
    /// Printer faults switched on, per kind (`paper_out`, `cover_open`, `offline`,
    /// `crash_mid_job`, `slow_ms`, `error_after_print`).
    pub faults_injected: BTreeMap<String, usize>,
    /// From the first submission until faults stopped (every submission answered, every
    /// planned fault and kill done).
    pub fault_phase_seconds: f64,
    /// Whether every lane drained within the drain timeout, and how long it took from
    /// the moment faults stopped.
    pub drained: bool,
    pub drain_seconds: f64,
    pub drain_timeout_seconds: f64,
    /// The lanes as `/metrics` showed them during the run (the lane watchdog, from outside).
    pub lanes: crate::faults::watch::LaneWatch,
    pub verdict: Verdict,
    /// Every `in_doubt`, by the cause its reason names, and those that nothing the run
    /// injected explains (must be none).
    pub doubt: super::check::DoubtCheck,
    /// The task events the run's webhook received ("one event id per change").
    pub events: super::events::EventCheck,
    pub audit: AuditCheck,
    /// From the first submission to the last sheet of paper.
    pub print_seconds: f64,
    /// Tasks on paper / `print_seconds`.
    pub printed_per_sec: f64,
    /// The whole run, start-up and verdict included.
    pub total_seconds: f64,
    /// Where the run's files are, when they were kept (`--keep-dir`).
    pub kept_dir: Option<String>,
    /// Everything that broke the promise; empty means the run verified.
    pub problems: Vec<String>,
}

impl FaultsReport {
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }

    /// The human-readable report, lines separated by `\n`, without a final newline.
    pub fn render_text(&self) -> String {
        let mut s = String::new();
        let (sub, v) = (&self.submissions, &self.verdict);
        let kills = |k: &[KillRecord]| {
            let at: Vec<String> = k.iter().map(|k| format!("{:.1} s (down {:.0} ms)", k.at_s, k.down_ms)).collect();
            if at.is_empty() {
                "none".to_string()
            } else {
                format!("{} at {}", k.len(), at.join(", "))
            }
        };
        // Writing to a String cannot fail, hence the ignored results.
        let _ = writeln!(s, "onceprint bench faults — backend {}, seed {}", self.backend, self.seed);
        let _ = writeln!(s, "machine:      {}", self.machine);
        let _ = writeln!(
            s,
            "load:         {} tasks over {} printers ({}), {} submit connections, spread over {:.0} s",
            self.tasks, self.printers, self.fleet, self.concurrency, self.fault_window_seconds
        );
        let _ = writeln!(
            s,
            "submissions:  {} planned ({} repeats, {} racing the original); {} attempts, retried {} without answer + {} × 5xx ({} while the broker was up)",
            sub.planned,
            sub.repeats,
            sub.racing_repeats,
            sub.attempts,
            sub.retried_no_answer,
            sub.retried_5xx,
            sub.retried_while_up
        );
        let _ = writeln!(
            s,
            "answers:      {} × 201, {} × 200, {} other; {} tasks accepted in {:.1} s",
            sub.created, sub.duplicate, sub.other, sub.accepted_tasks, sub.seconds
        );
        let faults: Vec<String> = self.faults_injected.iter().map(|(k, n)| format!("{k} {n}")).collect();
        let _ = writeln!(
            s,
            "faults:       {} (one printer fault every ~{} ms per printer)",
            if faults.is_empty() { "none".to_string() } else { faults.join(", ") },
            self.fault_every_ms
        );
        let _ = writeln!(s, "agent kills:  {}", kills(&self.agent_kills));
        let _ = writeln!(s, "broker kills: {}", kills(&self.broker_kills));
        let e = &self.events;
        let _ = writeln!(
            s,
            "events:       {} deliveries of {} event ids for {} changes; {} changes with two events; {} printed without event",
            e.deliveries, e.events, e.changes, e.changes_with_two_events, e.printed_without_event
        );
        if self.nodes > 1 || self.redis {
            let redis = match (self.redis, self.redis_killed_at_s) {
                (true, Some(at)) => format!("redis kill -9 at {at:.1} s"),
                (true, None) => "redis, not killed".to_string(),
                (false, _) => "no redis".to_string(),
            };
            let _ = writeln!(s, "nodes: {} behind the load balancer (kills in turn); {redis}", self.nodes);
        }
        let _ = writeln!(
            s,
            "drain:        {} after faults stopped at {:.1} s",
            if self.drained {
                format!("every lane drained in {:.1} s", self.drain_seconds)
            } else {
                format!("NOT DRAINED within {:.0} s", self.drain_timeout_seconds)
            },
            self.fault_phase_seconds
        );
        let _ = writeln!(
            s,
            "lanes:        longest in flight {:.1} s{}; stalled {} ({} reads of /metrics)",
            self.lanes.longest_in_flight_s,
            self.lanes.longest_in_flight_printer.as_deref().map(|p| format!(" ({p})")).unwrap_or_default(),
            if self.lanes.stalled.is_empty() {
                "none".to_string()
            } else {
                self.lanes.stalled.iter().cloned().collect::<Vec<_>>().join(", ")
            },
            self.lanes.samples
        );
        let states: Vec<String> = v.states.iter().map(|(k, n)| format!("{k} {n}")).collect();
        let _ = writeln!(s, "broker says:  {}", states.join(", "));
        let _ = writeln!(
            s,
            "paper:        {} jobs, {} tasks on paper; duplicates {} ({} extra sheets); lost {}; stray {}",
            v.paper_jobs, v.on_paper, v.duplicates.count, v.extra_sheets, v.lost.count, v.stray_jobs
        );
        let a = &v.attention;
        let _ = writeln!(
            s,
            "attention:    {} (in_doubt {}, of them on paper {}; failed {}, of them on paper {})",
            a.in_doubt + a.failed,
            a.in_doubt,
            a.in_doubt_on_paper,
            a.failed,
            a.failed_on_paper
        );
        if !self.doubt.by_cause.is_empty() {
            let causes: Vec<String> = self.doubt.by_cause.iter().map(|(k, n)| format!("{k} {n}")).collect();
            let _ = writeln!(
                s,
                "in doubt:     {}; {} not explained by an injected fault",
                causes.join(", "),
                self.doubt.unexplained.len()
            );
        }
        if !v.stalled.is_empty() {
            let _ = writeln!(s, "stalled:      {}", describe_lanes(&v.stalled));
        }
        let _ = writeln!(
            s,
            "audit:        {} trails checked, {} inconsistent",
            self.audit.checked, self.audit.inconsistent
        );
        let _ = writeln!(
            s,
            "throughput:   {:.0} tasks/s on paper ({:.1} s first submission → last sheet); total {:.1} s",
            self.printed_per_sec, self.print_seconds, self.total_seconds
        );
        if let Some(dir) = &self.kept_dir {
            let _ = writeln!(
                s,
                "kept:         {dir} (broker.log, agent.log, sim.log, paper.jsonl, the agent's journal in agent/, bench.db on SQLite)"
            );
        }
        finish_text(s, &self.problems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faults::check::StalledLane;

    #[test]
    fn text_report_shows_kills_drain_and_problems() {
        let mut r = FaultsReport {
            backend: "sqlite".into(),
            tasks: 10,
            printers: 2,
            drained: true,
            drain_seconds: 3.25,
            agent_kills: vec![KillRecord { at_s: 1.5, down_ms: 120.0 }],
            ..FaultsReport::default()
        };
        r.faults_injected.insert("paper_out".into(), 3);
        let text = r.render_text();
        assert!(text.contains("agent kills:  1 at 1.5 s (down 120 ms)"), "{text}");
        assert!(text.contains("broker kills: none"), "{text}");
        assert!(text.contains("every lane drained in 3.2 s") || text.contains("every lane drained in 3.3 s"), "{text}");
        assert!(text.contains("paper_out 3"), "{text}");
        assert!(text.ends_with("verification: ok"), "{text}");
        r.drained = false;
        r.drain_timeout_seconds = 120.0;
        r.verdict.stalled.push(StalledLane { printer_id: "p1".into(), left: 4, ..StalledLane::default() });
        r.problems.push("boom".into());
        let text = r.render_text();
        assert!(text.contains("NOT DRAINED within 120 s") && text.contains("stalled:      p1: 4 left"), "{text}");
        assert!(text.ends_with("  - boom") && !r.ok());
    }
}
