//! Prometheus metrics: submissions by outcome, tasks by state (read from the database at
//! scrape time, so it is true across restarts and nodes), and request latency by route.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::http::StatusCode;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::AppState;

/// Outcome label of `onceprint_submissions_total`.
#[derive(Debug, Clone, Copy)]
pub enum SubmitOutcomeLabel {
    Created,
    /// Duplicate found by the database (unique key).
    Duplicate,
    /// Duplicate answered from the in-process first gate.
    DuplicateGate,
    /// Duplicate answered from the shared gate (Redis): another node's task, read by id.
    DuplicateSharedGate,
    Mismatch,
    /// Refused with 429: the tenant is over its rate limit.
    RateLimited,
    Rejected,
    Error,
}

impl SubmitOutcomeLabel {
    fn as_str(self) -> &'static str {
        match self {
            SubmitOutcomeLabel::Created => "created",
            SubmitOutcomeLabel::Duplicate => "duplicate",
            SubmitOutcomeLabel::DuplicateGate => "duplicate_gate",
            SubmitOutcomeLabel::DuplicateSharedGate => "duplicate_shared_gate",
            SubmitOutcomeLabel::Mismatch => "mismatch",
            SubmitOutcomeLabel::RateLimited => "rate_limited",
            SubmitOutcomeLabel::Rejected => "rejected",
            SubmitOutcomeLabel::Error => "error",
        }
    }
}

type Labels = Vec<(&'static str, String)>;

/// The metric handles. Cheap to share.
pub struct Metrics {
    registry: Registry,
    submissions: Family<Labels, Counter>,
    tasks: Family<Labels, Gauge>,
    latency: Family<Labels, Histogram>,
    lane_waiting: Family<Labels, Gauge>,
    lane_oldest: Family<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    lane_in_flight: Family<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    lane_stalled: Family<Labels, Gauge>,
    /// Rows retention pruned since the process started, by kind (`task`, `event`).
    pruned: Family<Labels, Counter>,
    retention_runs: Counter,
    /// The shared gate's counters (`serve --redis-url`), caught up at scrape time.
    shared_gate_answers: Counter,
    shared_gate_bypassed: Counter,
    shared_gate_failures: Counter,
    shared_gate_up: Gauge,
    /// Two scrapes at once must not both add the same catch-up.
    retention_sync: std::sync::Mutex<()>,
    /// 1 for each once-per-cluster job whose lease this node holds, labelled with the
    /// lease's name and this node's id.
    lease_held: Family<Labels, Gauge>,
    /// Console live views (server-sent event streams) open now.
    console_live: Gauge,
}

/// Counts one open console live view for as long as it lives: the stream holds it, so
/// the count goes down when the stream ends for any reason, a browser that went away
/// included.
pub struct LiveViewGuard(Gauge);

impl Drop for LiveViewGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

fn latency_histogram() -> Histogram {
    // 100 µs to ~1.6 s: intake answers in well under a millisecond when healthy, so the
    // low buckets carry the information.
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(0.0001, 2.0, 15))
}

impl Metrics {
    pub fn new() -> Arc<Metrics> {
        let mut registry = Registry::default();
        let submissions = Family::<Labels, Counter>::default();
        let tasks = Family::<Labels, Gauge>::default();
        let latency = Family::<Labels, Histogram>::new_with_constructor(latency_histogram as fn() -> Histogram);
        registry.register("onceprint_submissions", "Print task submissions by outcome", submissions.clone());
        registry.register("onceprint_tasks", "Print tasks in the database by state", tasks.clone());
        registry.register(
            "onceprint_http_request_duration_seconds",
            "HTTP request latency by route, method and status",
            latency.clone(),
        );
        let lane_waiting = Family::<Labels, Gauge>::default();
        let lane_oldest = Family::<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        let lane_in_flight = Family::<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        let lane_stalled = Family::<Labels, Gauge>::default();
        let pruned = Family::<Labels, Counter>::default();
        let retention_runs = Counter::default();
        registry.register(
            "onceprint_retention_pruned",
            "Rows pruned by retention since start: finished tasks (their tombstones kept) and their audit events",
            pruned.clone(),
        );
        registry.register("onceprint_retention_runs", "Retention runs since start", retention_runs.clone());
        let shared_gate_answers = Counter::default();
        let shared_gate_bypassed = Counter::default();
        let shared_gate_failures = Counter::default();
        let shared_gate_up = Gauge::default();
        registry.register(
            "onceprint_shared_gate_answers",
            "Submissions answered from the shared gate (Redis) without a database write: duplicates and mismatches",
            shared_gate_answers.clone(),
        );
        registry.register(
            "onceprint_shared_gate_bypassed",
            "Shared gate calls not made or given up (failed, timed out, or during the back-off after a failure): \
             the database judged",
            shared_gate_bypassed.clone(),
        );
        registry.register(
            "onceprint_shared_gate_failures",
            "Shared gate calls that failed or timed out",
            shared_gate_failures.clone(),
        );
        registry.register(
            "onceprint_shared_gate_up",
            "1 when the last shared gate call reached Redis, 0 when it is bypassed, -1 without --redis-url",
            shared_gate_up.clone(),
        );
        registry.register("onceprint_lane_waiting_tasks", "Tasks waiting in a printer's lane", lane_waiting.clone());
        registry.register(
            "onceprint_lane_oldest_waiting_seconds",
            "Age of the oldest task waiting in a printer's lane",
            lane_oldest.clone(),
        );
        registry.register(
            "onceprint_lane_in_flight_seconds",
            "How long the task in flight of a printer's lane has been out",
            lane_in_flight.clone(),
        );
        registry.register(
            "onceprint_lane_stalled",
            "1 when a printer's lane has work and no progress past stall_after_ms",
            lane_stalled.clone(),
        );
        let lease_held = Family::<Labels, Gauge>::default();
        registry.register(
            "onceprint_lease_held",
            "1 when this node holds the lease of a job that runs once per cluster (node_id names the node)",
            lease_held.clone(),
        );
        let console_live = Gauge::default();
        registry.register(
            "onceprint_console_live_streams",
            "Console live views (server-sent event streams) open now",
            console_live.clone(),
        );
        Arc::new(Metrics {
            console_live,
            lease_held,
            registry,
            submissions,
            tasks,
            latency,
            lane_waiting,
            lane_oldest,
            lane_in_flight,
            lane_stalled,
            pruned,
            retention_runs,
            shared_gate_answers,
            shared_gate_bypassed,
            shared_gate_failures,
            shared_gate_up,
            retention_sync: std::sync::Mutex::new(()),
        })
    }

    /// Counts a console live view until the returned guard is dropped.
    pub fn live_view(&self) -> LiveViewGuard {
        self.console_live.inc();
        LiveViewGuard(self.console_live.clone())
    }

    pub fn submission(&self, outcome: SubmitOutcomeLabel) {
        self.submissions.get_or_create(&vec![("outcome", outcome.as_str().to_owned())]).inc();
    }

    /// Refreshes the per-state gauge from the database and renders the text format.
    pub async fn render(&self, state: &AppState) -> String {
        match state.store.count_by_state().await {
            Ok(counts) => {
                for s in onceprint_core::TaskState::ALL {
                    let n = counts.iter().find(|(st, _)| *st == s).map(|(_, n)| *n).unwrap_or(0);
                    self.tasks.get_or_create(&vec![("state", s.as_str().to_owned())]).set(n);
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot count tasks for metrics"),
        }
        // The lanes as the watchdog last measured them (every few seconds): a scrape does
        // not look at every lane itself. Lanes that drained since are left out.
        self.lane_waiting.clear();
        self.lane_oldest.clear();
        self.lane_in_flight.clear();
        self.lane_stalled.clear();
        for a in state.watchdog.snapshot() {
            let labels =
                vec![("tenant", a.tenant_id.clone()), ("store", a.store_id.clone()), ("printer", a.printer_id.clone())];
            self.lane_waiting.get_or_create(&labels).set(a.waiting);
            if let Some(ms) = a.oldest_waiting_ms {
                self.lane_oldest.get_or_create(&labels).set(ms as f64 / 1000.0);
            }
            if let Some(ms) = a.in_flight_ms {
                self.lane_in_flight.get_or_create(&labels).set(ms as f64 / 1000.0);
            }
            self.lane_stalled.get_or_create(&labels).set(i64::from(a.stalled));
        }
        // The retention job counts for itself; the counters catch up with its totals.
        {
            let _one_at_a_time = self.retention_sync.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let totals = state.retention.totals();
            for (kind, total) in [("task", totals.tasks), ("event", totals.events)] {
                let c = self.pruned.get_or_create(&vec![("kind", kind.to_owned())]);
                c.inc_by(total.saturating_sub(c.get()));
            }
            self.retention_runs.inc_by(totals.runs.saturating_sub(self.retention_runs.get()));
            match state.intake.shared_gate().map(|g| g.stats()) {
                Some(s) => {
                    for (c, total) in [
                        (&self.shared_gate_answers, s.answers),
                        (&self.shared_gate_bypassed, s.bypassed),
                        (&self.shared_gate_failures, s.failures),
                    ] {
                        c.inc_by(total.saturating_sub(c.get()));
                    }
                    self.shared_gate_up.set(i64::from(s.up));
                }
                None => {
                    self.shared_gate_up.set(-1);
                }
            }
        }
        let node_id = state.leases.node_id().to_owned();
        for (name, held) in state.leases.held() {
            self.lease_held.get_or_create(&vec![("name", name), ("node_id", node_id.clone())]).set(i64::from(held));
        }
        let mut out = String::new();
        if let Err(e) = encode(&mut out, &self.registry) {
            tracing::warn!(error = %e, "cannot encode metrics");
        }
        out
    }
}

/// The labels and start of a request's latency, taken before it is handed on; the
/// latency is recorded under its route template by [`Timed::finish`].
pub(crate) struct Timed {
    route: Option<MatchedPath>,
    method: axum::http::Method,
    start: Instant,
}

impl Timed {
    pub(crate) fn begin(req: &Request) -> Timed {
        Timed {
            route: req.extensions().get::<MatchedPath>().cloned(),
            method: req.method().clone(),
            start: Instant::now(),
        }
    }

    pub(crate) fn finish(self, st: &AppState, status: StatusCode) {
        let route = self.route.map_or_else(|| "unmatched".to_owned(), |m| m.as_str().to_owned());
        let labels = vec![
            ("route", route),
            ("method", self.method.as_str().to_owned()),
            ("status", status.as_u16().to_string()),
        ];
        st.metrics.latency.get_or_create(&labels).observe(self.start.elapsed().as_secs_f64());
    }
}
