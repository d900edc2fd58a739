//! The worker's handling of one delivery, opened up for the simulation (`onceprint sim`).
//!
//! This module exists so that the simulation drives the real worker and LAN glue: the journal's answer
//! by task id and by idempotency key, the offline outbox's say on a key printed offline,
//! and the print sequence of [`crate::printer::print_job_on`], on printers it simulates
//! behind a [`crate::printer::Connector`]. The agent itself does not use it; nothing here
//! differs from what a printer's worker does with a delivery.

use crate::broker::BrokerError;
use crate::cache::OfflineCache;
use crate::journal::Journal;
use crate::lan::{router, LanState};
use crate::offline::{dispatch_one, route_local_ack, sync_once, LocalAttempts};
use crate::outbox::{Outbox, OutboxError};
use crate::printer::{DriverConfig, PrinterLink, ProcessIds};
use crate::protocol::{Ack, Delivery};
use crate::upstream::Upstream;
use crate::worker::{handle_delivery, WorkerContext};
use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// What one agent process's printer workers share: its journal, its outbox and its
/// driver settings.
pub struct Worker {
    ctx: WorkerContext,
}

impl Worker {
    /// An agent process's workers. `no_printed_ack` names the printers confirmed by status
    /// only (`--no-printed-ack`).
    pub fn new(journal: Arc<Journal>, outbox: Outbox, driver: DriverConfig, no_printed_ack: HashSet<String>) -> Worker {
        // Acks are returned to the caller here, and nothing stops: the queue and the
        // shutdown signal of a running agent have no one at the other end.
        let (acks, _) = mpsc::unbounded_channel();
        let (_, stopping) = watch::channel(false);
        Worker {
            ctx: WorkerContext {
                journal,
                outbox,
                driver,
                printer_idle: Duration::ZERO,
                no_printed_ack,
                acks,
                stopping,
            },
        }
    }

    /// Decides and carries out one delivery as a printer's worker does, on that printer's
    /// `link` with its `ids`, and returns the ack the agent would send.
    pub async fn handle_delivery(&self, d: &Delivery, ids: &mut ProcessIds, link: &mut PrinterLink) -> Ack {
        handle_delivery(&self.ctx, d, ids, link).await
    }
}

/// The store agent's LAN glue, opened up for the simulation: the LAN listener's router
/// (its `POST /v1/print-tasks` handler, driven in-process without a socket), the local
/// lane's hand-out of offline tasks to the printers' workers and the routing of their
/// acks, and the upload of offline tasks. Each is the code the agent runs; only the
/// broker behind [`Upstream`] and the caller's scheduling are the simulation's. What one
/// process holds (the attempts with their workers, the time the broker is taken to be
/// down) goes with the value: a new process is a new `Lan` on the same state directory.
pub struct Lan {
    state: LanState,
    agent_id: String,
    local: LocalAttempts,
}

impl Lan {
    /// The LAN glue of a process of agent `agent_id` whose state directory is `dir` (the
    /// saved directory and LAN keys are read from it), answering offline after
    /// `offline_after` without a forward's answer.
    pub fn new(
        upstream: Arc<dyn Upstream>,
        dir: &Path,
        agent_id: &str,
        outbox: Outbox,
        offline_after: Duration,
    ) -> Lan {
        let cache = OfflineCache::load(dir, Some(agent_id.to_owned()));
        let state = LanState {
            client: upstream,
            cache,
            outbox,
            offline_after,
            down_until: Arc::default(),
            wake: Arc::default(),
        };
        Lan { state, agent_id: agent_id.to_owned(), local: LocalAttempts::default() }
    }

    /// Fetches the store's directory and LAN keys and claims the LAN listener, as the
    /// agent's refresher does.
    pub async fn refresh(&self) -> Result<(), BrokerError> {
        self.state.cache.refresh(self.state.client.as_ref()).await
    }

    /// A POS's `POST /v1/print-tasks` with the LAN key `lan_key`: the status, the
    /// `x-onceprint-offline` header's presence and the body of the answer.
    pub async fn submit(&self, lan_key: &str, body: Vec<u8>) -> (u16, bool, serde_json::Value) {
        use tower::ServiceExt as _;
        let request = axum::http::Request::builder()
            .method("POST")
            .uri("/v1/print-tasks")
            .header(axum::http::header::AUTHORIZATION, format!("Bearer {lan_key}"))
            .header(axum::http::header::CONTENT_TYPE, "application/json")
            .body(axum::body::Body::from(body));
        let Ok(request) = request else {
            return (0, false, serde_json::Value::Null);
        };
        let response = match router(self.state.clone()).oneshot(request).await {
            Ok(r) => r,
            Err(never) => match never {},
        };
        let status = response.status().as_u16();
        let offline = response.headers().contains_key("x-onceprint-offline");
        let bytes = http_body_util::BodyExt::collect(response.into_body()).await.map(|c| c.to_bytes());
        let body = bytes.ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default();
        (status, offline, body)
    }

    /// The local lane's next hand-out: the first task due at `now_ms` (the shop PC's
    /// clock) that goes to a printer's worker, as the delivery the worker gets.
    pub async fn next_local(&self, now_ms: i64) -> Result<Option<Delivery>, OutboxError> {
        let taken: Mutex<Option<Delivery>> = Mutex::new(None);
        let give = |d: Delivery| {
            if let Ok(mut t) = taken.lock() {
                *t = Some(d);
            }
        };
        for t in self.state.outbox.due(now_ms).await? {
            dispatch_one(&self.state.outbox, &self.state.cache, &give, &self.local, t).await;
            if let Some(d) = taken.lock().ok().and_then(|mut t| t.take()) {
                return Ok(Some(d));
            }
        }
        Ok(None)
    }

    /// Routes a worker's ack as the agent does: one of the local lane's attempts goes to
    /// the outbox (and `true` is answered), any other is the broker's.
    pub async fn route_ack(&self, ack: Ack) -> bool {
        let mine = self.local.lock().map(|mut l| l.remove(&(ack.task_id.clone(), ack.attempt))).unwrap_or(false);
        if mine {
            route_local_ack(&self.state.outbox, ack, &self.state.wake).await;
        }
        mine
    }

    /// One round of the agent's upload of its offline tasks (nothing while the broker
    /// does not answer).
    pub async fn sync(&self) {
        sync_once(self.state.client.as_ref(), &self.agent_id, &self.state.outbox, &self.state.cache).await;
    }
}

/// Sets the clocks the agent's code reads on this thread: the wall clock (the shop PC's,
/// in milliseconds since the Unix epoch) and the machine's clock since boot, or gives
/// both back to the machine with `None`. The simulation runs a world's agents on one
/// thread and sets them before each step.
pub fn set_clocks(clocks: Option<(i64, i64)>) {
    crate::SIM_WALL_MS.with(|c| c.set(clocks.map(|c| c.0)));
    crate::SIM_BOOT_MS.with(|c| c.set(clocks.map(|c| c.1)));
}
