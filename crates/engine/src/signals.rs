//! Wake-ups for long polls: intake and acks signal a store when its lanes may have new
//! work, and every poll of that store waiting in this process re-checks at once. Polls
//! also re-check on a timer, so work created by another broker node is found without a
//! signal.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// One `Notify` per (tenant, store).
#[derive(Default)]
pub struct StoreSignals {
    map: Mutex<HashMap<(String, String), Arc<Notify>>>,
    shutdown: Notify,
    shutting_down: std::sync::atomic::AtomicBool,
}

impl StoreSignals {
    pub fn get(&self, tenant_id: &str, store_id: &str) -> Arc<Notify> {
        let Ok(mut map) = self.map.lock() else { return Arc::new(Notify::new()) };
        map.entry((tenant_id.to_owned(), store_id.to_owned())).or_default().clone()
    }

    /// Wakes every poll waiting on this store.
    pub fn notify(&self, tenant_id: &str, store_id: &str) {
        self.get(tenant_id, store_id).notify_waiters();
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
