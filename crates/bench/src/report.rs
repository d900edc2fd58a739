//! The numbers a run produces and how they are printed.

use std::fmt::Write as _;

use serde::Serialize;

use crate::load::Outcome;

/// Latency percentiles of one group of answers, in milliseconds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Percentiles {
    pub count: usize,
    pub p50: f64,
    pub p90: f64,
    pub p95: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

impl Percentiles {
    /// From latencies in µs (any order).
    pub fn from_micros(mut us: Vec<u64>) -> Self {
        us.sort_unstable();
        let ms = |q: f64| percentile(&us, q) as f64 / 1000.0;
        Self {
            count: us.len(),
            p50: ms(0.50),
            p90: ms(0.90),
            p95: ms(0.95),
            p99: ms(0.99),
            p999: ms(0.999),
            max: us.last().copied().unwrap_or(0) as f64 / 1000.0,
        }
    }
}

/// A route and answer status of the broker's request histogram in `/metrics`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct RouteStatus {
    pub route: String,
    pub status: String,
}

/// Requests and seconds per route and status (methods summed) from the text of the
/// broker's `/metrics` (`onceprint_http_request_duration_seconds_count` and `_sum`).
pub fn request_counts(text: &str) -> std::collections::BTreeMap<RouteStatus, (u64, f64)> {
    let mut out = std::collections::BTreeMap::<RouteStatus, (u64, f64)>::new();
    for line in text.lines() {
        let Some((name, value)) = line.rsplit_once(' ') else { continue };
        let (labels, is_count) = if let Some(l) = name.strip_prefix("onceprint_http_request_duration_seconds_count{") {
            (l, true)
        } else if let Some(l) = name.strip_prefix("onceprint_http_request_duration_seconds_sum{") {
            (l, false)
        } else {
            continue;
        };
        let label = |k: &str| {
            labels
                .trim_end_matches('}')
                .split(',')
                .find_map(|kv| kv.strip_prefix(k).and_then(|v| v.strip_prefix("=\"")))
                .map(|v| v.trim_end_matches('"').to_owned())
                .unwrap_or_default()
        };
        let entry = out.entry(RouteStatus { route: label("route"), status: label("status") }).or_default();
        if is_count {
            entry.0 += value.trim().parse::<u64>().unwrap_or(0);
        } else {
            entry.1 += value.trim().parse::<f64>().unwrap_or(0.0);
        }
    }
    out
}

/// Nearest-rank percentile of an ascending slice: the smallest value with at least
/// `q` of the samples at or below it. No interpolation, so the answer is always a latency
/// that was actually measured. 0 for an empty slice.
pub fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct LatencyReport {
    /// Every request that got an HTTP answer, whatever its status.
    pub all: Percentiles,
    /// 201 answers (new tasks).
    pub accepted: Percentiles,
    /// 200 answers (duplicates).
    pub duplicate: Percentiles,
}

impl LatencyReport {
    pub fn from_outcomes(outcomes: &[Outcome]) -> Self {
        let pick = |f: &dyn Fn(u16) -> bool| {
            Percentiles::from_micros(outcomes.iter().filter(|o| f(o.status)).map(Outcome::latency_us).collect())
        };
        Self { all: pick(&|s| s != 0), accepted: pick(&|s| s == 201), duplicate: pick(&|s| s == 200) }
    }
}

/// Everything `onceprint bench submit` reports. Serialize it for `--json`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SubmitReport {
    /// `sqlite` or `postgres`.
    pub backend: String,
    /// Cores and CPU model of the machine the run shared with the broker.
    pub machine: String,
    /// Measured submissions (one task each), however many went per HTTP request.
    pub requests: usize,
    /// Submissions per HTTP request: 1 is one `POST /v1/print-tasks` each, more is
    /// `POST /v1/print-task-batches` with up to this many (warm-up batched alike).
    pub batch: usize,
    /// HTTP requests of the measured run: `requests` with `batch` 1, else
    /// `ceil(requests / batch)`.
    pub requests_http: usize,
    pub warmup: usize,
    pub concurrency: usize,
    pub printers: usize,
    /// Share of repeats asked for.
    pub duplicate_share: f64,
    /// Share of repeats in the generated plan.
    pub duplicate_share_actual: f64,
    pub distinct_keys: usize,
    pub wall_seconds: f64,
    /// 201 answers.
    pub accepted: usize,
    /// 200 answers.
    pub duplicates: usize,
    /// Any other status, or no answer.
    pub other: usize,
    pub accepted_per_sec: f64,
    pub duplicates_per_sec: f64,
    pub answers_per_sec: f64,
    /// HTTP requests answered (whatever their status) per second of the measured run.
    pub requests_http_per_sec: f64,
    /// Answer time per submission: with `batch` > 1 every submission of a batch has its
    /// request's, so these weigh each request by its tasks.
    pub latency_ms: LatencyReport,
    /// Answer time per HTTP request (answered ones); with `batch` 1 the same as
    /// `latency_ms.all`.
    pub http_latency_ms: Percentiles,
    /// Broker's peak resident set (`VmHWM`) over the whole run, set-up and listing included.
    pub broker_peak_rss_mib: Option<f64>,
    /// Broker nodes behind the bench's load balancer (1: one broker, no balancer); the
    /// peak RSS above is then the highest node's.
    pub nodes: usize,
    /// The nodes' CPU time (user + system, summed, from /proc) during the measured run,
    /// per measured submission (not per HTTP request when `batch` > 1).
    pub broker_cpu_ms_per_request: Option<f64>,
    /// What was preloaded into the database before the warm-up, if anything.
    pub preload: Option<crate::PreloadReport>,
    /// Everything that broke the contract; empty means the run verified.
    pub problems: Vec<String>,
}

impl SubmitReport {
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }

    /// The human-readable report, lines separated by `\n`, without a final newline
    /// (print it with `println!`).
    pub fn render_text(&self) -> String {
        let mut s = String::new();
        let l = &self.latency_ms;
        // Writing to a String cannot fail, hence the ignored results.
        let _ = writeln!(s, "onceprint bench submit — backend {}", self.backend);
        let _ = writeln!(s, "machine:      {}", self.machine);
        // Batch 1 prints exactly what the bench printed before batches existed.
        let batched = self.batch > 1;
        let requests = if batched {
            format!(
                "{} submissions in {} HTTP requests (batches of {}, POST /v1/print-task-batches)",
                self.requests, self.requests_http, self.batch
            )
        } else {
            format!("{} requests", self.requests)
        };
        let _ = writeln!(
            s,
            "load:         {requests} (+{} warm-up), {} connections, {} printers, duplicate share {:.2} (plan {:.3}), {} distinct keys",
            self.warmup,
            self.concurrency,
            self.printers,
            self.duplicate_share,
            self.duplicate_share_actual,
            self.distinct_keys
        );
        let _ = writeln!(s, "wall time:    {:.2} s", self.wall_seconds);
        let _ = writeln!(s, "accepted:     {:>8} × 201  {:>10.0} tasks/s", self.accepted, self.accepted_per_sec);
        let _ = writeln!(s, "duplicates:   {:>8} × 200  {:>10.0} answers/s", self.duplicates, self.duplicates_per_sec);
        if self.other > 0 {
            let _ = writeln!(s, "other:        {:>8}", self.other);
        }
        let _ = writeln!(
            s,
            "all answers:  {:>8}        {:>10.0} answers/s",
            self.accepted + self.duplicates + self.other,
            self.answers_per_sec
        );
        if batched {
            let h = &self.http_latency_ms;
            let _ = writeln!(
                s,
                "HTTP:         {:>8} requests {:>8.0} requests/s  p50 {:.3}  p99 {:.3}  max {:.3} ms per request",
                self.requests_http, self.requests_http_per_sec, h.p50, h.p99, h.max
            );
            let _ = writeln!(s, "latency ms per submission (its batch request's answer time):");
        }
        let _ = writeln!(
            s,
            "latency ms:   all  p50 {:.3}  p90 {:.3}  p99 {:.3}  p99.9 {:.3}  max {:.3}",
            l.all.p50, l.all.p90, l.all.p99, l.all.p999, l.all.max
        );
        let _ = writeln!(s, "              201  p50 {:.3}  p99 {:.3}", l.accepted.p50, l.accepted.p99);
        let _ = writeln!(s, "              200  p50 {:.3}  p99 {:.3}", l.duplicate.p50, l.duplicate.p99);
        match self.broker_peak_rss_mib {
            Some(mib) => {
                let _ = writeln!(s, "broker RSS:   {mib:.1} MiB peak");
            }
            None => {
                let _ = writeln!(s, "broker RSS:   unknown");
            }
        }
        if let Some(ms) = self.broker_cpu_ms_per_request {
            let nodes = if self.nodes > 1 {
                format!(" ({} nodes summed, behind the load balancer)", self.nodes)
            } else {
                String::new()
            };
            let per = if batched { "submission" } else { "request" };
            let _ = writeln!(s, "broker CPU:   {ms:.3} ms per {per}{nodes}");
        }
        if let Some(p) = &self.preload {
            let _ = writeln!(s, "{}", p.render_line());
        }
        finish_text(s, &self.problems)
    }
}

/// Ends a report's text: `verification: ok`, or the problems one per line; without a
/// final newline (print it with `println!`).
pub fn finish_text(mut s: String, problems: &[String]) -> String {
    // Writing to a String cannot fail, hence the ignored results.
    if problems.is_empty() {
        let _ = writeln!(s, "verification: ok");
    } else {
        let _ = writeln!(s, "verification: {} problem(s)", problems.len());
        for p in problems {
            let _ = writeln!(s, "  - {p}");
        }
    }
    s.truncate(s.trim_end().len());
    s
}

/// `N cores, <model name>` of this machine.
pub fn machine_line() -> String {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".to_string());
    format!("{cores} cores, {model}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.50), 50);
        assert_eq!(percentile(&v, 0.90), 90);
        assert_eq!(percentile(&v, 0.99), 99);
        assert_eq!(percentile(&v, 0.999), 100);
        assert_eq!(percentile(&v, 1.0), 100);
        assert_eq!(percentile(&v, 0.0), 1);
        assert_eq!(percentile(&[7], 0.5), 7);
        assert_eq!(percentile(&[], 0.5), 0);
        // Between ranks it rounds up to a sample that exists.
        assert_eq!(percentile(&[10, 20, 30, 40], 0.5), 20);
        assert_eq!(percentile(&[10, 20, 30, 40], 0.51), 30);
    }

    #[test]
    fn percentiles_sort_and_convert_to_ms() {
        let p = Percentiles::from_micros(vec![3000, 1000, 2000, 4000]);
        assert_eq!(p.count, 4);
        assert_eq!(p.p50, 2.0);
        assert_eq!(p.max, 4.0);
        let empty = Percentiles::from_micros(Vec::new());
        assert_eq!(empty.count, 0);
        assert_eq!(empty.max, 0.0);
    }

    #[test]
    fn text_report_tells_requests_from_submissions_only_when_batched() {
        let mut r = SubmitReport {
            backend: "sqlite".into(),
            requests: 1_000,
            batch: 1,
            requests_http: 1_000,
            broker_cpu_ms_per_request: Some(0.5),
            ..SubmitReport::default()
        };
        let text = r.render_text();
        assert!(text.contains("load:         1000 requests (+0 warm-up)"), "{text}");
        assert!(text.contains("ms per request") && !text.contains("HTTP:"), "{text}");
        (r.batch, r.requests_http, r.requests_http_per_sec) = (50, 20, 400.0);
        r.http_latency_ms.p50 = 12.5;
        let text = r.render_text();
        assert!(text.contains("1000 submissions in 20 HTTP requests (batches of 50"), "{text}");
        assert!(text.contains("400 requests/s  p50 12.500"), "{text}");
        assert!(text.contains("ms per submission"), "{text}");
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!((json["batch"].as_u64(), json["requests_http"].as_u64()), (Some(50), Some(20)));
        assert_eq!(json["http_latency_ms"]["p50"], 12.5);
    }

    #[test]
    fn latency_groups_by_status() {
        let o = |status, lat| Outcome { status, start_us: 0, end_us: lat, ..Outcome::default() };
        let l = LatencyReport::from_outcomes(&[o(201, 1000), o(200, 2000), o(0, 99_000), o(500, 3000)]);
        assert_eq!(l.all.count, 3);
        assert_eq!(l.all.max, 3.0);
        assert_eq!(l.accepted.count, 1);
        assert_eq!(l.duplicate.p50, 2.0);
    }
}
