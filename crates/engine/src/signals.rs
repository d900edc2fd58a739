//! Wake-ups for long polls: intake, acks, manual actions and set-up changes signal a store
//! when its lanes may have new work, and every poll of that store waiting in this process
//! re-checks at once. With several nodes on one database (`crate::cluster`), the signal
//! also goes to the other nodes, whose waiting polls re-check when they hear of it. Polls
//! also re-check on a timer, so work is found even when a signal is lost.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};

use tokio::sync::{watch, Notify};

use crate::cluster::{Outbox, Word};

/// One `Notify` per (tenant, store).
pub struct StoreSignals {
    map: Mutex<HashMap<(String, String), Arc<Notify>>>,
    shutdown: Notify,
    shutting_down: std::sync::atomic::AtomicBool,
    /// Where signals for the other nodes go, once the cluster link is attached.
    outbox: OnceLock<Arc<Outbox>>,
    /// Moves on every signal, for loops that serve many stores (push drivers).
    activity: watch::Sender<u64>,
    /// How many times each store was signalled, for readers that remember a store's lanes
    /// were empty and need to know whether that may have changed ([`Self::epoch`]).
    epochs: Mutex<HashMap<(String, String), u64>>,
    /// How many times every store was signalled at once.
    everyone: std::sync::atomic::AtomicU64,
    /// Readers that take the stores signalled since they last looked ([`Self::signalled`]).
    watchers: Mutex<Vec<Weak<Signalled>>>,
}

/// The stores signalled since its reader last took them, for a loop that serves many
/// stores and looks only at those whose lanes may have new work (a push driver with
/// thousands of idle printers). A store is recorded before the signal's wake-up goes out,
/// so a reader woken by [`StoreSignals::activity`] finds it; one signalled while the reader
/// works is there at its next take.
#[derive(Default)]
pub struct Signalled {
    inner: Mutex<Taken>,
}

/// What [`Signalled::take`] hands over.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Taken {
    /// (tenant, store) pairs signalled.
    pub stores: HashSet<(String, String)>,
    /// Every store was signalled at once (signals may have been lost): look at them all.
    pub everyone: bool,
}

impl Signalled {
    /// What was signalled since the last take.
    pub fn take(&self) -> Taken {
        std::mem::take(&mut *self.inner.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn store(&self, tenant_id: &str, store_id: &str) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if !inner.everyone {
            inner.stores.insert((tenant_id.to_owned(), store_id.to_owned()));
        }
    }

    fn everyone(&self) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.everyone = true;
        inner.stores.clear();
    }
}

impl Default for StoreSignals {
    fn default() -> Self {
        StoreSignals {
            map: Mutex::default(),
            shutdown: Notify::new(),
            shutting_down: std::sync::atomic::AtomicBool::new(false),
            outbox: OnceLock::new(),
            activity: watch::Sender::new(0),
            epochs: Mutex::default(),
            everyone: std::sync::atomic::AtomicU64::new(0),
            watchers: Mutex::default(),
        }
    }
}

impl StoreSignals {
    pub fn get(&self, tenant_id: &str, store_id: &str) -> Arc<Notify> {
        let Ok(mut map) = self.map.lock() else { return Arc::new(Notify::new()) };
        map.entry((tenant_id.to_owned(), store_id.to_owned())).or_default().clone()
    }

    /// From now on, signals are also queued for the other broker nodes.
    pub(crate) fn attach(&self, outbox: Arc<Outbox>) {
        let _ = self.outbox.set(outbox);
    }

    /// Wakes every poll waiting on this store, on this node and on the others.
    pub fn notify(&self, tenant_id: &str, store_id: &str) {
        self.notify_here(tenant_id, store_id);
        if let Some(outbox) = self.outbox.get() {
            outbox.push(Word::Wake { tenant_id: tenant_id.to_owned(), store_id: store_id.to_owned() });
        }
    }

    /// Where this store's signals stand: it changes with every signal of the store (on this
    /// node or heard from another) and with every signal of all stores. Every write that
    /// can give a lane of the store work signals the store after it commits, so a reader
    /// that takes the epoch *before* it reads a lane and finds the lane empty knows the
    /// lane is still empty while the epoch has not changed, as far as this node has heard.
    pub fn epoch(&self, tenant_id: &str, store_id: &str) -> (u64, u64) {
        let store = self
            .epochs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&(tenant_id.to_owned(), store_id.to_owned()))
            .copied()
            .unwrap_or(0);
        (store, self.everyone.load(std::sync::atomic::Ordering::SeqCst))
    }

    /// Wakes every poll waiting on this store in this process only.
    pub fn notify_here(&self, tenant_id: &str, store_id: &str) {
        {
            let mut map = self.epochs.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let n = map.entry((tenant_id.to_owned(), store_id.to_owned())).or_default();
            *n = n.wrapping_add(1);
        }
        self.each_watcher(|w| w.store(tenant_id, store_id));
        self.get(tenant_id, store_id).notify_waiters();
        self.activity.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Wakes every waiting poll of this process (signals from other nodes may have been
    /// lost).
    pub fn notify_everyone_here(&self) {
        let all: Vec<Arc<Notify>> = match self.map.lock() {
            Ok(map) => map.values().cloned().collect(),
            Err(_) => Vec::new(),
        };
        self.everyone.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.each_watcher(Signalled::everyone);
        for n in all {
            n.notify_waiters();
        }
        self.activity.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// From now on, every store signalled (on this node or heard from another) is recorded
    /// in the returned set until its reader takes it; dropping it ends that.
    pub fn signalled(&self) -> Arc<Signalled> {
        let s = Arc::new(Signalled::default());
        self.watchers.lock().unwrap_or_else(PoisonError::into_inner).push(Arc::downgrade(&s));
        s
    }

    fn each_watcher(&self, f: impl Fn(&Signalled)) {
        let mut watchers = self.watchers.lock().unwrap_or_else(PoisonError::into_inner);
        watchers.retain(|w| match w.upgrade() {
            Some(s) => {
                f(&s);
                true
            }
            None => false,
        });
    }

    /// Changes whenever any store is signalled (on this node, or heard from another).
    pub fn activity(&self) -> watch::Receiver<u64> {
        self.activity.subscribe()
    }

    /// Ends every long poll now and makes new ones return at once (graceful shutdown).
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, std::sync::atomic::Ordering::SeqCst);
        self.shutdown.notify_waiters();
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Resolves when shutdown begins.
    pub async fn shutdown(&self) {
        let wait = self.shutdown.notified();
        if self.is_shutting_down() {
            return;
        }
        wait.await
    }
}
