//! What `onceprint bench e2e` reports, and how it is printed.

use std::fmt::Write as _;

use serde::Serialize;

use super::check::DeliveryCheck;
use crate::procs::ThreadGroup;
use crate::report::{finish_text, Percentiles};

/// One figure for each process of the run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PerProcess {
    pub broker: Option<f64>,
    /// Both lives of the agent when it was killed and restarted (peak: the higher one;
    /// CPU: the sum).
    pub agent: Option<f64>,
    pub printer_sim: Option<f64>,
    /// The bench itself (load generator and paper-log reader).
    pub bench: Option<f64>,
}

/// The `--kill-agent-at` measurement.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AgentRestart {
    /// Tasks on paper when the agent was killed; `None` when printing never got that far.
    pub killed_after_printed: Option<usize>,
    /// Tasks the broker had handed to the killed agent (`sent`): their jobs may have been
    /// cut off, and their paper lines do not count as the restarted agent's.
    pub in_flight_at_kill: usize,
    /// From the restart until the first job the restarted agent printed, by the paper
    /// log's own time stamps.
    pub resume_ms: Option<f64>,
}

/// The whole machine's CPU from the first submission to the end of the run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MachineCpu {
    pub busy_seconds: f64,
    pub idle_seconds: f64,
    /// Busy time outside the broker, agent, simulator and bench: PostgreSQL's server
    /// processes, kernel threads, and anything else that ran on the machine meanwhile
    /// (approximate: the four processes' figures include their start-up).
    pub other_busy_seconds: f64,
}

/// The agent's requests to the broker during the run, from the broker's own `/metrics`
/// (`onceprint_http_request_duration_seconds` of the agent routes, every status): where a
/// printer's cycle spends its time on the broker's side. With acks that hand out the next
/// job, each printer's cycle is one ack request; the agent sends one at a time.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct AgentTraffic {
    pub ack_requests: u64,
    /// Tasks of the run per ack request (how many printers' acks one request carried).
    pub tasks_per_ack_request: f64,
    /// The broker's mean time to answer an ack request (read, write, commit, hand-out).
    pub ack_answer_ms_mean: f64,
    pub poll_requests: u64,
}

impl AgentTraffic {
    /// From the text of `/metrics` at the end of a run of `tasks` tasks; `None` when the
    /// broker counted no ack request.
    pub fn from_metrics(text: &str, tasks: usize) -> Option<AgentTraffic> {
        let (acks, ack_seconds) = route_totals(text, "/v1/agent/acks");
        let (polls, _) = route_totals(text, "/v1/agent/poll");
        (acks > 0).then(|| AgentTraffic {
            ack_requests: acks,
            tasks_per_ack_request: tasks as f64 / acks as f64,
            ack_answer_ms_mean: ack_seconds * 1000.0 / acks as f64,
            poll_requests: polls,
        })
    }
}

/// Requests and seconds of one route in `/metrics`' request histogram, every method and
/// status summed.
fn route_totals(text: &str, route: &str) -> (u64, f64) {
    crate::report::request_counts(text)
        .into_iter()
        .filter(|(k, _)| k.route == route)
        .fold((0, 0.0), |(n, s), (_, (count, seconds))| (n + count, s + seconds))
}

/// The one broker's threads from the first submission to the end of the run (printing,
/// then the bench's own checks of the broker's answers), by name: whether its SQLite
/// writer, the one thread every write goes through, was busy, waiting for a core, or idle
/// while the ack loop waited on something else.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct BrokerThreads {
    pub window_seconds: f64,
    /// Busiest first; threads that ended inside the window (short-lived blocking threads)
    /// are not counted.
    pub groups: Vec<ThreadGroup>,
}

impl BrokerThreads {
    /// One line: the four busiest names with at least 50 ms on a CPU.
    fn render_line(&self) -> String {
        let shown: Vec<String> = self
            .groups
            .iter()
            .filter(|g| g.on_cpu_seconds >= 0.05)
            .take(4)
            .map(|g| {
                let times = if g.threads > 1 { format!(" ×{}", g.threads) } else { String::new() };
                format!("{}{times} {:.1} s on CPU + {:.1} s waiting", g.name, g.on_cpu_seconds, g.waiting_seconds)
            })
            .collect();
        format!(
            "broker threads ({:.1} s from the first submission): {}",
            self.window_seconds,
            if shown.is_empty() { "none measured".to_string() } else { shown.join("; ") }
        )
    }
}

/// Everything `onceprint bench e2e` reports. Serialize it for `--json`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct E2eReport {
    /// `sqlite` or `postgres`.
    pub backend: String,
    /// Cores and CPU model of the machine every process of the run shared.
    pub machine: String,
    pub printers: usize,
    pub tasks: usize,
    pub concurrency: usize,
    /// Tasks per HTTP request: 1 is one `POST /v1/print-tasks` each, more is
    /// `POST /v1/print-task-batches` with up to this many.
    pub batch: usize,
    /// HTTP requests that carried the `tasks` submissions (`tasks` with `batch` 1).
    pub requests_http: usize,
    pub kill_agent_at: Option<f64>,
    /// From the first submission sent to the last answer.
    pub submit_seconds: f64,
    pub submitted_per_sec: f64,
    /// Submissions answered anything but 201.
    pub submit_failures: usize,
    /// Submission answer times (201 only), per task: with `batch` > 1 every task of a batch
    /// has its request's.
    pub submit_latency_ms: Percentiles,
    /// HTTP requests answered (whatever their status) / `submit_seconds`.
    pub requests_http_per_sec: f64,
    /// Answer time per HTTP request (answered ones, whatever their results).
    pub http_latency_ms: Percentiles,
    /// From the first submission sent to the last job on paper.
    pub print_seconds: f64,
    /// Tasks on paper / `print_seconds`.
    pub printed_per_sec: f64,
    /// From each task's 201 answer to its first job on paper (`at` of the paper log).
    pub printed_latency_ms: Percentiles,
    /// Tasks whose paper line is time-stamped before the bench had read their 201 answer
    /// (their latency counts as 0).
    pub printed_before_answer: usize,
    /// Did every task reach paper (or an allowed `in_doubt`) before the timeout.
    pub completed: bool,
    pub agent_restart: Option<AgentRestart>,
    pub delivery: DeliveryCheck,
    pub peak_rss_mib: PerProcess,
    pub cpu_seconds: PerProcess,
    /// Broker nodes (behind the bench's load balancer when more than one).
    pub nodes: usize,
    /// CPU time (user + system, from /proc) per task: of every process of the run (the
    /// nodes, agent, printer simulator and the bench), and of the broker nodes alone.
    pub cpu_ms_per_task: Option<f64>,
    pub broker_cpu_ms_per_task: Option<f64>,
    pub machine_cpu: Option<MachineCpu>,
    /// The agent's ack and poll requests as the broker counted them (one broker only).
    pub agent_traffic: Option<AgentTraffic>,
    /// The broker's threads (one broker only, where `/proc` has schedstats).
    pub broker_threads: Option<BrokerThreads>,
    /// Everything that broke the contract or the targets; empty means the run verified.
    /// What was preloaded into the database before the run, if anything.
    pub preload: Option<crate::PreloadReport>,
    pub problems: Vec<String>,
}

impl E2eReport {
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }

    /// The human-readable report, lines separated by `\n`, without a final newline.
    pub fn render_text(&self) -> String {
        let mut s = String::new();
        let d = &self.delivery;
        let fmt = |v: Option<f64>, unit: &str| v.map_or("?".to_string(), |v| format!("{v:.1}{unit}"));
        // Writing to a String cannot fail, hence the ignored results.
        let _ = writeln!(s, "onceprint bench e2e — backend {}", self.backend);
        let _ = writeln!(s, "machine:      {}", self.machine);
        let kill = self.kill_agent_at.map_or(String::new(), |f| format!(", agent killed at {f:.2} of the tasks"));
        // Batch 1 prints exactly what the bench printed before batches existed.
        let batched = self.batch > 1;
        let batches = if batched {
            format!(", batches of {} (POST /v1/print-task-batches, {} HTTP requests)", self.batch, self.requests_http)
        } else {
            String::new()
        };
        let _ = writeln!(
            s,
            "load:         {} tasks over {} printers (GS ( H confirmed), {} submit connections{batches}{kill}",
            self.tasks, self.printers, self.concurrency
        );
        let _ = writeln!(
            s,
            "submitted:    {:.2} s  {:>8.0} tasks/s   answer p50 {:.3}  p99 {:.3}  max {:.3} ms",
            self.submit_seconds,
            self.submitted_per_sec,
            self.submit_latency_ms.p50,
            self.submit_latency_ms.p99,
            self.submit_latency_ms.max
        );
        if batched {
            let h = &self.http_latency_ms;
            let _ = writeln!(
                s,
                "HTTP:         {:>8} requests {:>8.0} requests/s  p50 {:.3}  p99 {:.3}  max {:.3} ms per request (a task's answer is its batch's)",
                self.requests_http, self.requests_http_per_sec, h.p50, h.p99, h.max
            );
        }
        let _ = writeln!(
            s,
            "printed:      {:.2} s  {:>8.0} tasks/s   ({} on paper, first submit → last sheet){}",
            self.print_seconds,
            self.printed_per_sec,
            d.printed_on_paper,
            if self.completed { "" } else { "  — TIMED OUT" }
        );
        let l = &self.printed_latency_ms;
        let _ = writeln!(s, "submit→paper: p50 {:.1}  p90 {:.1}  p99 {:.1}  max {:.1} ms", l.p50, l.p90, l.p99, l.max);
        if let Some(r) = &self.agent_restart {
            match r.killed_after_printed {
                Some(n) => {
                    let resume = r.resume_ms.map_or("never".to_string(), |ms| format!("{ms:.0} ms"));
                    let _ = writeln!(
                        s,
                        "agent kill:   kill -9 after {n} printed, {} in flight; printing resumed {resume} after the restart",
                        r.in_flight_at_kill
                    );
                }
                None => {
                    let _ = writeln!(s, "agent kill:   not done (printing never got that far)");
                }
            }
        }
        let _ = writeln!(
            s,
            "paper:        {} jobs; duplicates {} ({} extra sheets); missing {} (of them in_doubt {}); stray {}",
            d.paper_jobs, d.duplicated_tasks, d.extra_sheets, d.missing, d.missing_in_doubt, d.stray_jobs
        );
        let states: Vec<String> = d.states.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let _ = writeln!(s, "broker says:  {}", states.join(", "));
        if !d.in_doubt.is_empty() {
            let list: Vec<String> = d
                .in_doubt
                .iter()
                .map(|t| format!("{}@{}{}", t.biz_no, t.printer_id, if t.on_paper { " (on paper)" } else { "" }))
                .collect();
            let _ = writeln!(s, "in_doubt:     {}", list.join(", "));
        }
        let (r, c) = (&self.peak_rss_mib, &self.cpu_seconds);
        let _ = writeln!(
            s,
            "peak RSS:     broker {}  agent {}  printer-sim {}  bench {}",
            fmt(r.broker, " MiB"),
            fmt(r.agent, " MiB"),
            fmt(r.printer_sim, " MiB"),
            fmt(r.bench, " MiB")
        );
        let _ = writeln!(
            s,
            "CPU time:     broker {}  agent {}  printer-sim {}  bench {}",
            fmt(c.broker, " s"),
            fmt(c.agent, " s"),
            fmt(c.printer_sim, " s"),
            fmt(c.bench, " s")
        );
        let _ = writeln!(
            s,
            "CPU per task: {} all processes, {} the broker{}",
            fmt(self.cpu_ms_per_task, " ms"),
            fmt(self.broker_cpu_ms_per_task, " ms"),
            if self.nodes > 1 {
                format!(" ({} nodes summed, behind the load balancer)", self.nodes)
            } else {
                String::new()
            }
        );
        if let Some(m) = &self.machine_cpu {
            let total = m.busy_seconds + m.idle_seconds;
            let share = if total > 0.0 { 100.0 * m.busy_seconds / total } else { 0.0 };
            let _ = writeln!(
                s,
                "machine CPU:  busy {:.1} s of {:.1} s ({share:.0} %); {:.1} s of it outside these four processes",
                m.busy_seconds, total, m.other_busy_seconds
            );
        }
        if let Some(a) = &self.agent_traffic {
            let _ = writeln!(
                s,
                "agent HTTP:   {} ack requests ({:.1} tasks each), the broker answered one in {:.2} ms on average; {} polls",
                a.ack_requests, a.tasks_per_ack_request, a.ack_answer_ms_mean, a.poll_requests
            );
        }
        if let Some(t) = &self.broker_threads {
            let _ = writeln!(s, "{}", t.render_line());
        }
        if let Some(p) = &self.preload {
            let _ = writeln!(s, "{}", p.render_line());
        }
        finish_text(s, &self.problems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::e2e::check::InDoubtTask;

    #[test]
    fn text_report_shows_the_figures_and_problems() {
        let mut r = E2eReport {
            backend: "sqlite".into(),
            tasks: 10,
            printers: 2,
            printed_per_sec: 1234.0,
            completed: true,
            kill_agent_at: Some(0.5),
            agent_restart: Some(AgentRestart {
                killed_after_printed: Some(5),
                in_flight_at_kill: 2,
                resume_ms: Some(42.0),
            }),
            ..E2eReport::default()
        };
        r.delivery.in_doubt.push(InDoubtTask {
            biz_no: "E3".into(),
            task_id: "t".into(),
            printer_id: "p1".into(),
            on_paper: true,
        });
        r.peak_rss_mib.broker = Some(12.34);
        let text = r.render_text();
        assert!(text.contains("1234 tasks/s"), "{text}");
        assert!(text.contains("resumed 42 ms"), "{text}");
        assert!(text.contains("E3@p1 (on paper)"), "{text}");
        assert!(text.contains("broker 12.3 MiB  agent ?"), "{text}");
        assert!(text.ends_with("verification: ok"), "{text}");
        assert!(!text.contains("batches of") && !text.contains("HTTP:"), "{text}");
        (r.batch, r.requests_http, r.requests_http_per_sec) = (20, 1, 50.0);
        let batched = r.render_text();
        assert!(batched.contains("batches of 20 (POST /v1/print-task-batches, 1 HTTP requests)"), "{batched}");
        assert!(batched.contains("50 requests/s"), "{batched}");
        r.problems.push("boom".into());
        assert!(r.render_text().ends_with("  - boom"));
        assert!(!r.ok());
    }

    #[test]
    fn agent_traffic_sums_every_status_of_the_agent_routes() {
        let metrics = "\
# HELP onceprint_http_request_duration_seconds HTTP request latency by route, method and status.
onceprint_http_request_duration_seconds_sum{route=\"/v1/agent/acks\",method=\"POST\",status=\"200\"} 3.0
onceprint_http_request_duration_seconds_count{route=\"/v1/agent/acks\",method=\"POST\",status=\"200\"} 300
onceprint_http_request_duration_seconds_bucket{le=\"0.0016\",route=\"/v1/agent/acks\",method=\"POST\",status=\"200\"} 41
onceprint_http_request_duration_seconds_sum{route=\"/v1/agent/acks\",method=\"POST\",status=\"503\"} 1.0
onceprint_http_request_duration_seconds_count{route=\"/v1/agent/acks\",method=\"POST\",status=\"503\"} 100
onceprint_http_request_duration_seconds_count{route=\"/v1/agent/acks-other\",method=\"POST\",status=\"200\"} 7
onceprint_http_request_duration_seconds_count{route=\"/v1/agent/poll\",method=\"POST\",status=\"200\"} 2
onceprint_http_request_duration_seconds_count{route=\"/v1/print-task-batches\",method=\"POST\",status=\"200\"} 900
";
        let a = AgentTraffic::from_metrics(metrics, 2000).expect("acks were counted");
        assert_eq!((a.ack_requests, a.poll_requests), (400, 2));
        assert!((a.tasks_per_ack_request - 5.0).abs() < 1e-9, "{a:?}");
        assert!((a.ack_answer_ms_mean - 10.0).abs() < 1e-9, "{a:?}");
        assert_eq!(AgentTraffic::from_metrics("# nothing\n", 10), None);
        let r = E2eReport { agent_traffic: Some(a), ..E2eReport::default() };
        let text = r.render_text();
        assert!(text.contains("400 ack requests (5.0 tasks each), the broker answered one in 10.00 ms"), "{text}");
    }

    #[test]
    fn broker_threads_show_the_busiest_names() {
        let group = |name: &str, threads, on_cpu_seconds, waiting_seconds| ThreadGroup {
            name: name.into(),
            threads,
            on_cpu_seconds,
            waiting_seconds,
        };
        let t = BrokerThreads {
            window_seconds: 9.87,
            groups: vec![
                group("sqlite-writer", 1, 4.81, 0.96),
                group("tokio-rt-worker", 2, 1.62, 1.1),
                group("sqlite-checkpoi", 1, 0.004, 0.0),
            ],
        };
        let r = E2eReport { broker_threads: Some(t), ..E2eReport::default() };
        let text = r.render_text();
        assert!(
            text.contains(
                "broker threads (9.9 s from the first submission): sqlite-writer 4.8 s on CPU + 1.0 s waiting; \
                 tokio-rt-worker ×2 1.6 s on CPU + 1.1 s waiting\n"
            ),
            "{text}"
        );
        let none = E2eReport { broker_threads: Some(BrokerThreads::default()), ..E2eReport::default() };
        assert!(none.render_text().contains("none measured"));
    }
}
