//! Work that must happen once per cluster: leases with fencing tokens.
//!
//! Several `onceprint serve` nodes may share one PostgreSQL. Most of a node's work answers
//! requests and may run anywhere, but some background jobs must run on one node at a
//! time: the sweeper, each push driver (webhook, MQTT), alert delivery, retention, the
//! planner statistics, the offline check of printers that poll, and the alerts of the
//! watchdog and the agent watch. Each such job has a named lease in the store's `leases`
//! table. A node's [`Leases`] keeper takes or renews every lease it knows about every
//! `renew_every_ms` (about a second) for `ttl_ms` (about five seconds), so a dead node's
//! leases are taken over by another within seconds.
//!
//! A job asks its [`Lease`] before each round of work ([`Lease::is_held`]) and carries the
//! [`Lease::token`] where a stale holder could do harm (a push driver's claimant session
//! names it, so deliveries claimed under an older token are known to be another run's).
//! A node steps down at once when a renewal fails or is refused, and also when the lease
//! ran out by its own clock while a renewal was still on its way: the store's expiry is
//! computed from the same node's clock at the start of the renewal, so the local view
//! always ends no later than the store's, and another node can take the lease only after
//! that. This holds as long as the nodes' clocks agree to well within the lease's time to
//! live (NTP), which the deployment must ensure.
//!
//! With SQLite (one node) the same code runs and the lease is simply always won.
//!
//! This module must never decide what a job does with its work: it only says whether this
//! node may do it now, and under which token.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use onceprint_core::Millis;
use onceprint_store::Store;
use rand::Rng;
use tokio::sync::watch;

use crate::clock::Clock;
use crate::signals::StoreSignals;

/// The names of the leases of the jobs that run once per cluster.
pub mod names {
    pub const SWEEPER: &str = "sweeper";
    pub const PUSH_WEBHOOK: &str = "push:webhook";
    /// The MQTT link, its push driver and its inbox (one client id for the cluster).
    pub const MQTT: &str = "mqtt";
    pub const ALERTS: &str = "alerts";
    pub const RETENTION: &str = "retention";
    pub const STATISTICS: &str = "statistics";
    pub const POLLED_OFFLINE: &str = "polled-offline";
    pub const WATCHDOG_ALERTS: &str = "watchdog-alerts";
    pub const AGENT_WATCH: &str = "agent-watch";
}

/// Timing of the lease keeper.
#[derive(Debug, Clone, Copy)]
pub struct LeaseConfig {
    /// How often every lease is renewed (or taken, when free).
    pub renew_every_ms: u64,
    /// How long a lease lasts after each renewal: a dead node's leases go to another node
    /// this long after its last renewal.
    pub ttl_ms: i64,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        LeaseConfig { renew_every_ms: 1_000, ttl_ms: 5_000 }
    }
}

/// A new random node id (`node-` and 10 characters), unless one was given.
pub fn new_node_id() -> String {
    const ALPHABET: &[u8] = b"0123456789abcdefghijkmnpqrstuvwxyz";
    let mut rng = rand::thread_rng();
    let tail: String = (0..10).map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char).collect();
    format!("node-{tail}")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    /// The fencing token (0: not held).
    token: i64,
    /// Held until then by this node's clock.
    until: Millis,
}

struct Inner {
    name: String,
    clock: Arc<dyn Clock>,
    held: Mutex<Held>,
    /// Tells waiting jobs that the lease was won or lost.
    changed: watch::Sender<Held>,
}

/// One named lease as this node sees it. Cheap to clone; every clone sees the same state.
#[derive(Clone)]
pub struct Lease {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease").field("name", &self.inner.name).field("token", &self.token()).finish()
    }
}

impl Lease {
    fn new(name: &str, clock: Arc<dyn Clock>, held: Held) -> Lease {
        let (changed, _) = watch::channel(held);
        Lease { inner: Arc::new(Inner { name: name.to_owned(), clock, held: Mutex::new(held), changed }) }
    }

    /// A lease that is always held, with token 1 (a job run on its own, outside a node:
    /// tests, tools).
    pub fn always(name: &str) -> Lease {
        Lease::new(name, Arc::new(crate::clock::SystemClock), Held { token: 1, until: Millis::MAX })
    }

    pub fn name(&self) -> &str {
        &self.inner.name
    }

    fn held(&self) -> Held {
        *self.inner.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether this node holds the lease now: won at the last renewal, and not run out by
    /// this node's clock since.
    pub fn is_held(&self) -> bool {
        let h = self.held();
        h.token > 0 && self.inner.clock.now_ms() < h.until
    }

    /// The fencing token while the lease is held.
    pub fn token(&self) -> Option<i64> {
        let h = self.held();
        (h.token > 0 && self.inner.clock.now_ms() < h.until).then_some(h.token)
    }

    fn set(&self, held: Held) {
        let before = {
            let mut h = self.inner.held.lock().unwrap_or_else(PoisonError::into_inner);
            std::mem::replace(&mut *h, held)
        };
        if before.token != held.token {
            self.inner.changed.send_replace(held);
        }
    }

    /// Waits until this node holds the lease.
    pub async fn until_held(&self) {
        let mut rx = self.inner.changed.subscribe();
        loop {
            if self.is_held() {
                return;
            }
            // Renewals come every second; a missed notification costs at most that long.
            let _ = tokio::time::timeout(Duration::from_millis(500), rx.changed()).await;
        }
    }

    /// Waits until this node no longer holds the lease (lost at a renewal, or run out by
    /// this node's clock while a renewal is slow).
    pub async fn until_lost(&self) {
        let mut rx = self.inner.changed.subscribe();
        loop {
            let h = self.held();
            let now = self.inner.clock.now_ms();
            if h.token == 0 || now >= h.until {
                return;
            }
            let left = Duration::from_millis((h.until - now).clamp(1, 100) as u64);
            let _ = tokio::time::timeout(left, rx.changed()).await;
        }
    }
}

/// A node's leases and the keeper that renews them.
pub struct Leases {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    node_id: String,
    config: LeaseConfig,
    leases: Mutex<BTreeMap<String, Lease>>,
}

impl Leases {
    pub fn new(store: Arc<dyn Store>, clock: Arc<dyn Clock>, node_id: String, config: LeaseConfig) -> Arc<Leases> {
        Arc::new(Leases { store, clock, node_id, config, leases: Mutex::default() })
    }

    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    pub fn config(&self) -> LeaseConfig {
        self.config
    }

    /// The lease `name`, which the keeper takes and renews from now on. Not held until the
    /// next renewal wins it.
    pub fn lease(&self, name: &str) -> Lease {
        let mut all = self.leases.lock().unwrap_or_else(PoisonError::into_inner);
        all.entry(name.to_owned())
            .or_insert_with(|| Lease::new(name, self.clock.clone(), Held { token: 0, until: 0 }))
            .clone()
    }

    /// Every lease with whether this node holds it (for `/metrics`).
    pub fn held(&self) -> Vec<(String, bool)> {
        let all = self.leases.lock().unwrap_or_else(PoisonError::into_inner);
        all.values().map(|l| (l.name().to_owned(), l.is_held())).collect()
    }

    fn all(&self) -> Vec<Lease> {
        self.leases.lock().unwrap_or_else(PoisonError::into_inner).values().cloned().collect()
    }

    /// Takes or renews every lease once. A lease whose renewal fails or is refused is given
    /// up at once.
    ///
    /// The renewals run at once, not one after another: on SQLite the single writer then
    /// commits the ones waiting in its queue together (a round costs a commit or two
    /// instead of one per lease, which matters on an idle shop PC or a Raspberry Pi), and
    /// on PostgreSQL they go over the pool in parallel, so a slow round trip delays no
    /// other lease.
    pub async fn renew_once(self: &Arc<Self>) {
        let mut renewals = tokio::task::JoinSet::new();
        for lease in self.all() {
            let this = self.clone();
            renewals.spawn(async move { this.renew(lease).await });
        }
        while renewals.join_next().await.is_some() {}
    }

    async fn renew(&self, lease: Lease) {
        let start = self.clock.now_ms();
        // A renewal slower than the lease itself cannot win anything usable.
        let limit = Duration::from_millis(self.config.ttl_ms.max(1) as u64);
        let got = tokio::time::timeout(
            limit,
            self.store.acquire_lease(lease.name(), &self.node_id, start, self.config.ttl_ms),
        )
        .await;
        let before = lease.held();
        match got {
            Ok(Ok(Some(token))) => {
                lease.set(Held { token, until: start + self.config.ttl_ms });
                if before.token != token {
                    tracing::info!(lease = lease.name(), token, node_id = %self.node_id, "lease taken: this node runs the job");
                }
            }
            Ok(Ok(None)) => {
                lease.set(Held { token: 0, until: 0 });
                if before.token != 0 {
                    tracing::warn!(lease = lease.name(), node_id = %self.node_id, "lease lost to another node: stepping down");
                }
            }
            Ok(Err(e)) => {
                lease.set(Held { token: 0, until: 0 });
                if before.token != 0 {
                    tracing::warn!(lease = lease.name(), error = %e, "lease renewal failed: stepping down");
                }
            }
            Err(_) => {
                lease.set(Held { token: 0, until: 0 });
                if before.token != 0 {
                    tracing::warn!(lease = lease.name(), "lease renewal timed out: stepping down");
                }
            }
        }
    }

    /// Gives up every lease held (at shutdown), so that another node takes over at once.
    pub async fn release_all(&self) {
        for lease in self.all() {
            if lease.held().token == 0 {
                continue;
            }
            lease.set(Held { token: 0, until: 0 });
            if let Err(e) = self.store.release_lease(lease.name(), &self.node_id, self.clock.now_ms()).await {
                tracing::debug!(lease = lease.name(), error = %e, "lease not released; it expires by itself");
            }
        }
    }

    /// Renews every `renew_every_ms` until shutdown. It does not release the leases: the
    /// caller does that with [`Leases::release_all`] once the jobs have stopped, so that no
    /// other node starts a job while this one is still finishing its round.
    pub fn spawn(self: &Arc<Self>, signals: Arc<StoreSignals>) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(this.config.renew_every_ms.max(10)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => this.renew_once().await,
                    _ = signals.shutdown() => return,
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    #[test]
    fn an_always_held_lease_is_held() {
        let l = Lease::always("x");
        assert!(l.is_held());
        assert_eq!(l.token(), Some(1));
    }

    #[test]
    fn a_lease_runs_out_by_the_local_clock_without_a_renewal() {
        let clock = Arc::new(ManualClock::new(10_000));
        let l = Lease::new("x", clock.clone(), Held { token: 7, until: 15_000 });
        assert_eq!(l.token(), Some(7));
        clock.advance(4_999);
        assert!(l.is_held());
        clock.advance(1);
        assert!(!l.is_held(), "held until its expiry by this node's clock, not a moment longer");
        assert_eq!(l.token(), None);
    }
}
