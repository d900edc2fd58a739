//! The lane watchdog: no printer that can be reached may have a lane with work and
//! no progress for longer than a limit. The watchdog measures every lane with work (how
//! many tasks wait, how old the oldest is, how long the task in flight has been out),
//! keeps the figures for `/metrics`, and raises `printer.stalled` once per stall.
//!
//! A lane is stalled when
//! - a task has been in flight (`sent_at`, which offering it again does not move) for
//!   longer than `stall_after_ms` while its printer can be reached, or
//! - nothing is in flight, the first waiting task is due (pending, or a retry whose time
//!   has come), and the lane has looked like that, with the same first task, for longer
//!   than `stall_after_ms` while its printer can be reached and is not paused by its own
//!   state (no paper, cover open, paper jam, offline).
//!
//! A lane waiting for a scheduled retry is not stalled, nor one whose printer nobody can
//! reach (an agent printer in a store without a live agent): that is `agent offline`, a
//! different alarm; nor a disabled printer's, which waits because a person said so. With the lane engine working, a stall means a defect or a claimant
//! that holds a delivery without ever answering it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use onceprint_core::{Millis, TaskState};
use onceprint_store::{LaneStats, OutboxEvent, StoreError};

use crate::clock::rfc3339;
use crate::lanes::LaneEngine;
use crate::transport::TransportKind;

/// One lane's figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneAge {
    pub tenant_id: String,
    pub store_id: String,
    pub printer_id: String,
    pub waiting: i64,
    /// Milliseconds since the oldest waiting task was created.
    pub oldest_waiting_ms: Option<Millis>,
    /// Milliseconds the task in flight has been out.
    pub in_flight_ms: Option<Millis>,
    pub stalled: bool,
}

#[derive(Default)]
struct State {
    /// (tenant, printer) → (the first waiting task, since when the lane has looked so).
    idle_heads: HashMap<(String, String), (String, Millis)>,
    stalled: HashSet<(String, String)>,
    last: Vec<LaneAge>,
}

/// The watchdog of one broker process.
pub struct Watchdog {
    lanes: Arc<LaneEngine>,
    state: Mutex<State>,
    /// `printer.stalled` alerts are raised only while this node holds it (the figures for
    /// `/metrics` are measured on every node); unset: always.
    alerts: std::sync::OnceLock<crate::Lease>,
}

impl Watchdog {
    pub fn new(lanes: Arc<LaneEngine>) -> Arc<Watchdog> {
        Arc::new(Watchdog { lanes, state: Mutex::default(), alerts: std::sync::OnceLock::new() })
    }

    /// Raises alerts only while this node holds `lease` (one alert per stall for the
    /// cluster). Set once; later calls change nothing.
    pub fn alert_only_with(&self, lease: crate::Lease) {
        let _ = self.alerts.set(lease);
    }

    /// The figures of the last check.
    pub fn snapshot(&self) -> Vec<LaneAge> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).last.clone()
    }

    /// Measures every lane with work; alerts on lanes that stalled since the last check.
    pub async fn check_once(&self) -> Result<Vec<LaneAge>, StoreError> {
        let now = self.lanes.now();
        let limit = self.lanes.config().stall_after_ms;
        let stats = self.lanes.store().lane_stats().await?;
        let mut ages = Vec::with_capacity(stats.len());
        let mut seen_idle: HashSet<(String, String)> = HashSet::new();
        for s in stats {
            let stalled = self.is_stalled(&s, now, limit, &mut seen_idle).await?;
            ages.push(LaneAge {
                oldest_waiting_ms: s.oldest_waiting_at.map(|t| (now - t).max(0)),
                in_flight_ms: s.in_flight_since.map(|t| (now - t).max(0)),
                tenant_id: s.tenant_id,
                store_id: s.store_id,
                printer_id: s.printer_id,
                waiting: s.waiting,
                stalled,
            });
        }
        let mut newly = Vec::new();
        {
            let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            st.idle_heads.retain(|k, _| seen_idle.contains(k));
            let now_stalled: HashSet<(String, String)> =
                ages.iter().filter(|a| a.stalled).map(|a| (a.tenant_id.clone(), a.printer_id.clone())).collect();
            for a in ages.iter().filter(|a| a.stalled) {
                if !st.stalled.contains(&(a.tenant_id.clone(), a.printer_id.clone())) {
                    newly.push(a.clone());
                }
            }
            for k in st.stalled.difference(&now_stalled) {
                tracing::info!(tenant = %k.0, printer = %k.1, "lane moves again");
            }
            st.stalled = now_stalled;
            st.last = ages.clone();
        }
        let alerting = self.alerts.get().is_none_or(|l| l.is_held());
        for a in newly.into_iter().filter(|_| alerting) {
            tracing::error!(
                tenant = %a.tenant_id, store = %a.store_id, printer = %a.printer_id,
                waiting = a.waiting, in_flight_ms = ?a.in_flight_ms, "lane stalled: work and no progress"
            );
            self.lanes.store().record_alert(&stalled_event(&a, now, limit)).await?;
        }
        Ok(ages)
    }

    async fn is_stalled(
        &self,
        s: &LaneStats,
        now: Millis,
        limit: i64,
        seen_idle: &mut HashSet<(String, String)>,
    ) -> Result<bool, StoreError> {
        let in_flight_long = s.in_flight_since.is_some_and(|t| now - t > limit);
        let idle_long = s.in_flight_since.is_none() && s.oldest_waiting_at.is_some_and(|t| now - t > limit);
        if !in_flight_long && !idle_long {
            return Ok(false);
        }
        let Some(printer) = self.lanes.directory().printer_info(&s.tenant_id, &s.printer_id).await? else {
            return Ok(false);
        };
        if !printer.row.enabled {
            // Stopped on purpose by a person: not a stall.
            return Ok(false);
        }
        let reachable = match printer.transport.as_ref().map(|t| t.kind()) {
            Some(TransportKind::Agent) => self.lanes.agents().store_has_live_agent(&s.tenant_id, &s.store_id),
            Some(TransportKind::Webhook) => true,
            // Printers that call in are reachable while they do (their transport keeps
            // `online` up to date); one that stopped calling is offline, not stalled.
            Some(TransportKind::Cloudprnt | TransportKind::Mqtt | TransportKind::EpsonSdp) => printer.row.online,
            None => false,
        };
        if !reachable {
            return Ok(false);
        }
        if in_flight_long {
            return Ok(true);
        }
        // A lane waiting for its printer (no paper, cover open, ...) waits on purpose.
        if onceprint_store::pauses_lane(printer.row.last_error.as_deref()) {
            return Ok(false);
        }
        let lane = self.lanes.store().lane(&s.tenant_id, &s.printer_id).await?;
        if lane.in_flight.is_some() {
            return Ok(false);
        }
        let Some(head) = lane.waiting else { return Ok(false) };
        if head.state == TaskState::Retrying && head.next_attempt_at.is_some_and(|t| t > now) {
            return Ok(false); // waiting for its scheduled retry
        }
        let key = (s.tenant_id.clone(), s.printer_id.clone());
        seen_idle.insert(key.clone());
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let since = match st.idle_heads.get(&key) {
            Some((id, since)) if *id == head.task_id => *since,
            _ => {
                st.idle_heads.insert(key, (head.task_id.clone(), now));
                now
            }
        };
        Ok(now - since > limit)
    }

    /// Checks every `interval` until shutdown.
    pub fn spawn(self: &Arc<Self>, interval: Duration) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            let signals = this.lanes.signals().clone();
            let mut tick = tokio::time::interval(interval);
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        if let Err(e) = this.check_once().await {
                            tracing::warn!(error = %e, "watchdog pass failed");
                        }
                    }
                    _ = signals.shutdown() => return,
                }
            }
        })
    }
}

fn stalled_event(a: &LaneAge, now: Millis, limit: i64) -> OutboxEvent {
    let event_id = crate::alerts::new_event_id(now);
    let payload = serde_json::json!({
        "id": event_id,
        "type": "printer.stalled",
        "created_at": rfc3339(now),
        "tenant_id": a.tenant_id,
        "data": {
            "store_id": a.store_id,
            "printer_id": a.printer_id,
            "waiting": a.waiting,
            "oldest_waiting_ms": a.oldest_waiting_ms,
            "in_flight_ms": a.in_flight_ms,
            "stall_after_ms": limit,
        }
    });
    OutboxEvent {
        event_id,
        tenant_id: a.tenant_id.clone(),
        kind: "printer.stalled".into(),
        payload: payload.to_string(),
        now,
    }
}
