//! Printers watched while idle: what store agents report about their printers
//! between jobs, and printers whose agent fell silent.
//!
//! Without this, a printer's status is learnt only from the acknowledgement of a job, so
//! "out of paper" shows up when the next ticket fails. Agents therefore ask each idle
//! printer for its real-time status every few seconds and report it (and at once when it
//! changes); this module turns the reports into the printer rows the console and the API
//! show (`online`, `last_seen_at`, `last_error`), writing only what differs from the
//! printer's row and, for a printer that stays the same, a refresh of `last_seen_at` every
//! ten seconds, so a store full of idle printers costs the database one read per report.
//!
//! A store whose agents all fell silent (none polled, acked or reported within the agent
//! registry's `gone_after_ms`) has its agent printers shown `offline` with `last_error`
//! [`AGENT_OFFLINE`], and one `agent.offline` alert goes to the outbox; the store's next
//! report from an agent puts the printers' own status back. Silence is known only for
//! stores that an agent reached since this broker process started (the registry is in
//! memory): after a restart, a store whose agent never comes back keeps the status it had.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use onceprint_core::Millis;
use onceprint_store::{pauses_lane, AgentIdentity, OutboxEvent, Printer, PrinterStatusUpdate, Store, StoreError};

use crate::claimant::AgentRegistry;
use crate::clock::{now_ms, rfc3339};
use crate::transport::TransportConfig;
use crate::StoreSignals;

/// `last_error` of the printers of a store whose agents fell silent.
pub const AGENT_OFFLINE: &str = "agent offline";
/// An unchanged status is written again after this long, to keep `last_seen_at` fresh.
const REFRESH_MS: Millis = 10_000;
/// Most printer reports in one request.
pub const MAX_REPORTS: usize = 256;

/// What an agent found when it asked an idle printer (`DLE EOT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdleStatus {
    Ready,
    NoPaper,
    CoverOpen,
    PaperJam,
    /// No connection, or no answer to the status request.
    Offline,
}

impl IdleStatus {
    pub fn parse(s: &str) -> Option<IdleStatus> {
        Some(match s {
            "ready" => IdleStatus::Ready,
            "no_paper" => IdleStatus::NoPaper,
            "cover_open" => IdleStatus::CoverOpen,
            "paper_jam" => IdleStatus::PaperJam,
            "offline" => IdleStatus::Offline,
            _ => return None,
        })
    }

    /// `(online, last_error)` as the printer row keeps them, spelled like the ack outcomes
    /// so that the console explains both the same way.
    fn as_row(self) -> (bool, Option<&'static str>) {
        match self {
            IdleStatus::Ready => (true, None),
            IdleStatus::NoPaper => (true, Some("no_paper")),
            IdleStatus::CoverOpen => (true, Some("cover_open")),
            IdleStatus::PaperJam => (true, Some("paper_jam")),
            IdleStatus::Offline => (false, Some("offline")),
        }
    }
}

/// A printer the agent should watch: one of its store's enabled agent printers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watched {
    pub printer_id: String,
    /// `tcp://HOST:PORT`.
    pub address: String,
}

type StoreKey = (String, String);

/// The watch. Share it behind an `Arc`.
pub struct PrinterWatch {
    store: Arc<dyn Store>,
    registry: Arc<AgentRegistry>,
    signals: Arc<StoreSignals>,
    /// Stores an agent reached, with when it was last heard and whether it is marked
    /// offline now.
    stores: Mutex<HashMap<StoreKey, (Millis, bool)>>,
}

impl PrinterWatch {
    pub fn new(store: Arc<dyn Store>, registry: Arc<AgentRegistry>, signals: Arc<StoreSignals>) -> Arc<PrinterWatch> {
        Arc::new(PrinterWatch { store, registry, signals, stores: Mutex::new(HashMap::new()) })
    }

    /// The enabled agent printers of `who`'s store: what an agent watches.
    pub async fn watched(&self, who: &AgentIdentity) -> Result<Vec<Watched>, StoreError> {
        Ok(self.agent_printers(who).await?.into_iter().map(|(w, _)| w).collect())
    }

    async fn agent_printers(&self, who: &AgentIdentity) -> Result<Vec<(Watched, Printer)>, StoreError> {
        let printers = self.store.list_printers(&who.tenant_id, Some(&who.store_id)).await?;
        Ok(printers.into_iter().filter(|p| p.enabled).filter_map(|p| agent_address(&p).map(|w| (w, p))).collect())
    }

    /// Applies an agent's report on its store's printers (others' are ignored) and
    /// answers which printers it should watch. A status is written when it differs from
    /// the printer's row (which acks change too, so the row, not a memory of this
    /// module, is what a report is compared with), or to refresh an old `last_seen_at`.
    pub async fn report(
        &self,
        who: &AgentIdentity,
        agent_id: &str,
        session: Option<&str>,
        reports: &[(String, IdleStatus)],
    ) -> Result<Vec<Watched>, StoreError> {
        let now = now_ms();
        self.registry.heard(&who.tenant_id, &who.store_id, agent_id, session);
        if let Ok(mut stores) = self.stores.lock() {
            stores.insert((who.tenant_id.clone(), who.store_id.clone()), (now, false));
        }
        let printers = self.agent_printers(who).await?;
        // A printer named twice in one report counts once, with its last status: a report
        // is a snapshot, and one change per printer keeps the batch free of rows that
        // would conflict with each other in one statement.
        let mut latest: Vec<(&String, &IdleStatus)> = Vec::with_capacity(reports.len());
        let mut seen: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
        for (printer_id, status) in reports {
            match seen.get(printer_id.as_str()) {
                Some(&i) => latest[i].1 = status,
                None => {
                    seen.insert(printer_id, latest.len());
                    latest.push((printer_id, status));
                }
            }
        }
        let mut updates = Vec::new();
        let mut resumes = false;
        for (printer_id, status) in latest {
            let Some((_, row)) = printers.iter().find(|(w, _)| &w.printer_id == printer_id) else { continue };
            let (online, last_error) = status.as_row();
            let last_error = last_error.map(str::to_owned);
            let fresh = row.last_seen_at.is_some_and(|t| now - t < REFRESH_MS);
            if row.online == online && row.last_error == last_error && fresh {
                continue;
            }
            // A printer back from no paper (or cover open, ...) makes its waiting tickets
            // due now (the store does that with the update): waiting polls must look.
            resumes |= pauses_lane(row.last_error.as_deref()) && !pauses_lane(last_error.as_deref());
            updates.push(PrinterStatusUpdate {
                tenant_id: who.tenant_id.clone(),
                printer_id: printer_id.clone(),
                online,
                last_error,
                now,
                event_id: crate::alerts::new_event_id(now),
            });
        }
        if !updates.is_empty() {
            self.store.update_printer_status(&updates).await?;
        }
        if resumes {
            self.signals.notify(&who.tenant_id, &who.store_id);
        }
        Ok(printers.into_iter().map(|(w, _)| w).collect())
    }

    /// One look at every store an agent reached: those whose agents all fell silent have
    /// their agent printers marked [`AGENT_OFFLINE`] (once) with an `agent.offline` alert.
    pub async fn check_agents_once(&self) -> Result<usize, StoreError> {
        let silent: Vec<(StoreKey, Millis)> = {
            let stores = self.stores.lock().map_err(|_| StoreError::Backend("watch lock".into()))?;
            stores
                .iter()
                .filter(|(k, (_, marked))| !marked && !self.registry.store_has_live_agent(&k.0, &k.1))
                .map(|(k, (heard, _))| (k.clone(), *heard))
                .collect()
        };
        for ((tenant_id, store_id), heard) in &silent {
            let printers = self.store.list_printers(tenant_id, Some(store_id)).await?;
            let now = now_ms();
            // `last_seen_at` stays when the agent was last heard: nothing was seen since.
            let updates: Vec<PrinterStatusUpdate> = printers
                .iter()
                .filter(|p| agent_address(p).is_some())
                .map(|p| PrinterStatusUpdate {
                    tenant_id: tenant_id.clone(),
                    printer_id: p.id.clone(),
                    online: false,
                    last_error: Some(AGENT_OFFLINE.into()),
                    now: *heard,
                    event_id: crate::alerts::new_event_id(now),
                })
                .collect();
            if !updates.is_empty() {
                self.store.update_printer_status(&updates).await?;
            }
            let event_id = crate::alerts::new_event_id(now);
            let payload = serde_json::json!({
                "id": event_id, "type": "agent.offline", "created_at": rfc3339(now), "tenant_id": tenant_id,
                "data": {
                    "store_id": store_id,
                    "last_heard_at": rfc3339(*heard),
                    "printers": updates.iter().map(|u| u.printer_id.clone()).collect::<Vec<_>>(),
                },
            });
            self.store
                .record_alert(&OutboxEvent {
                    event_id,
                    tenant_id: tenant_id.clone(),
                    kind: "agent.offline".into(),
                    payload: payload.to_string(),
                    now,
                })
                .await?;
            tracing::warn!(
                tenant_id,
                store_id,
                "every agent of the store fell silent; its printers show agent offline"
            );
            if let Ok(mut stores) = self.stores.lock() {
                if let Some(e) = stores.get_mut(&(tenant_id.clone(), store_id.clone())) {
                    // A report that arrived meanwhile wins: it set a newer time.
                    if e.0 == *heard {
                        e.1 = true;
                    }
                }
            }
        }
        Ok(silent.len())
    }

    /// Checks for silent agents every `every` until shutdown, while this node holds
    /// `lease` (one `agent.offline` alert per store for the cluster).
    pub fn spawn(self: &Arc<Self>, every: Duration, lease: crate::Lease) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        if !lease.is_held() {
                            continue;
                        }
                        if let Err(e) = this.check_agents_once().await {
                            tracing::warn!(error = %e, "agent watch pass failed");
                        }
                    }
                    _ = this.signals.shutdown() => return,
                }
            }
        })
    }
}

/// The address of an agent printer (`None` for other transports).
fn agent_address(p: &Printer) -> Option<Watched> {
    match TransportConfig::from_stored(&p.transport) {
        Some(TransportConfig::Agent(a)) => Some(Watched { printer_id: p.id.clone(), address: a.address }),
        _ => None,
    }
}
