//! The shared first gate of several broker nodes: a key → task map that all broker nodes
//! of one database consult after their own [`crate::RecentTasks`] missed, so that a retry
//! landing on another node than the first submission is answered without a database
//! write. The engine only defines the [`SharedGate`] trait and the guard around it
//! ([`GuardedSharedGate`]); the Redis client lives in the `onceprint-redis-gate` crate, so
//! the engine never links a Redis client.
//!
//! What the shared gate may say is limited on purpose. It holds a task id only after the
//! commit that made the task durable ([`SharedGate::remember`] is called after commit), and
//! intake reads the task by that id from the store before it answers, so the shared gate
//! can never invent a task nor answer a stale state. A claim without a task id means
//! "another submission of this key may be committing now" and changes nothing: the
//! submission goes on to the database, whose unique constraint stays the final judge.
//!
//! The guard makes the gate optional at run time: every call is bounded by a short
//! timeout, and after a failure the gate is bypassed for a back-off before it is tried
//! again, so a slow or dead gate costs intake at most one timeout per back-off period and
//! never fails a submission.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use onceprint_core::IdempotencyKey;

/// What the shared gate holds under a key when it is asked to claim it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SharedEntry {
    /// Nothing was there: this call claimed the key's first sighting (the claim expires
    /// by itself if this node dies before it remembers the task).
    Claimed,
    /// Another submission claimed the key and has not remembered a task yet: it may be
    /// committing it right now, or its node died. The database decides.
    ClaimedElsewhere,
    /// A task that was durable when it was remembered.
    Known { task_id: String, fingerprint: String },
}

/// A failure of the shared gate (unreachable, refused, garbled answer).
#[derive(Debug, Clone, thiserror::Error)]
#[error("shared gate: {0}")]
pub struct SharedGateError(pub String);

/// A key → task map shared by the nodes of one database.
#[async_trait::async_trait]
pub trait SharedGate: Send + Sync + 'static {
    /// Claims the key's first sighting if nobody did, else tells what is there; one
    /// round trip.
    async fn claim(&self, key: &IdempotencyKey) -> Result<SharedEntry, SharedGateError>;

    /// Remembers the task durable under `key`. Call only after the commit that made it
    /// durable (or after reading it from the database).
    async fn remember(&self, key: &IdempotencyKey, task_id: &str, fingerprint: &str) -> Result<(), SharedGateError>;

    /// Where the gate is, for log lines (never with a password).
    fn describe(&self) -> String;
}

/// Bounds of the guard.
#[derive(Debug, Clone, Copy)]
pub struct SharedGateConfig {
    /// Longest wait for one call; past it the call counts as failed.
    pub timeout: Duration,
    /// How long the gate is bypassed after a failure before it is tried again.
    pub backoff: Duration,
}

impl Default for SharedGateConfig {
    fn default() -> Self {
        SharedGateConfig { timeout: Duration::from_millis(25), backoff: Duration::from_secs(1) }
    }
}

/// Counters of the shared gate since the process started (for `/metrics`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SharedGateStats {
    /// Submissions answered from the shared gate (duplicates and mismatches).
    pub answers: u64,
    /// Calls not made or given up: failed, timed out, or skipped during a back-off.
    pub bypassed: u64,
    /// Calls that failed or timed out (each starts a back-off).
    pub failures: u64,
    /// Whether the last call reached the gate.
    pub up: bool,
}

/// The shared gate as intake uses it: bounded, bypassed after failures, counted.
pub struct GuardedSharedGate {
    inner: Arc<dyn SharedGate>,
    config: SharedGateConfig,
    /// Start of the process's monotonic time line for `bypass_until_ms`.
    epoch: Instant,
    /// Until when (ms after `epoch`) the gate is bypassed; 0: not bypassed.
    bypass_until_ms: AtomicU64,
    /// Whether the gate is taken to be down (for one log line per change, not per call).
    down: AtomicBool,
    answers: AtomicU64,
    bypassed: AtomicU64,
    failures: AtomicU64,
}

impl GuardedSharedGate {
    pub fn new(inner: Arc<dyn SharedGate>, config: SharedGateConfig) -> GuardedSharedGate {
        GuardedSharedGate {
            inner,
            config,
            epoch: Instant::now(),
            bypass_until_ms: AtomicU64::new(0),
            down: AtomicBool::new(false),
            answers: AtomicU64::new(0),
            bypassed: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether a call may be made now; counts the bypass when not.
    fn open(&self) -> bool {
        if self.now_ms() < self.bypass_until_ms.load(Ordering::Acquire) {
            self.bypassed.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        true
    }

    fn succeeded(&self) {
        if self.down.swap(false, Ordering::AcqRel) {
            tracing::info!(gate = %self.inner.describe(), "shared gate reachable again; duplicates across nodes are answered from it");
        }
    }

    fn failed(&self, op: &str, why: &str) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        self.bypassed.fetch_add(1, Ordering::Relaxed);
        let backoff_ms = u64::try_from(self.config.backoff.as_millis()).unwrap_or(u64::MAX);
        self.bypass_until_ms.store(self.now_ms().saturating_add(backoff_ms), Ordering::Release);
        if !self.down.swap(true, Ordering::AcqRel) {
            tracing::warn!(
                gate = %self.inner.describe(), op, error = why, backoff_ms,
                "shared gate unreachable: bypassed, the database judges duplicates until it is back"
            );
        }
    }

    /// Runs one call under the timeout; `None` when it failed, timed out or was skipped.
    async fn call<T>(&self, op: &str, fut: impl std::future::Future<Output = Result<T, SharedGateError>>) -> Option<T> {
        if !self.open() {
            return None;
        }
        match tokio::time::timeout(self.config.timeout, fut).await {
            Ok(Ok(v)) => {
                self.succeeded();
                Some(v)
            }
            Ok(Err(e)) => {
                self.failed(op, &e.0);
                None
            }
            Err(_) => {
                self.failed(op, &format!("no answer within {} ms", self.config.timeout.as_millis()));
                None
            }
        }
    }

    /// Claims the key or tells what is there; `None` when the gate is bypassed.
    pub async fn claim(&self, key: &IdempotencyKey) -> Option<SharedEntry> {
        self.call("claim", self.inner.claim(key)).await
    }

    /// Remembers a durable task; a failure only starts a back-off.
    pub async fn remember(&self, key: &IdempotencyKey, task_id: &str, fingerprint: &str) {
        let _ = self.call("remember", self.inner.remember(key, task_id, fingerprint)).await;
    }

    /// Counts a submission answered from the shared gate.
    pub fn record_answer(&self) {
        self.answers.fetch_add(1, Ordering::Relaxed);
    }

    pub fn stats(&self) -> SharedGateStats {
        SharedGateStats {
            answers: self.answers.load(Ordering::Relaxed),
            bypassed: self.bypassed.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
            up: !self.down.load(Ordering::Acquire),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use onceprint_core::Target;
    use std::sync::Mutex;

    /// A gate that fails, hangs or answers as told.
    struct Scripted {
        mode: Mutex<&'static str>,
        calls: AtomicU64,
    }

    #[async_trait::async_trait]
    impl SharedGate for Scripted {
        async fn claim(&self, _key: &IdempotencyKey) -> Result<SharedEntry, SharedGateError> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            let mode = *self.mode.lock().unwrap();
            match mode {
                "fail" => Err(SharedGateError("refused".into())),
                "hang" => {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    Ok(SharedEntry::Claimed)
                }
                _ => Ok(SharedEntry::Claimed),
            }
        }
        async fn remember(&self, _: &IdempotencyKey, _: &str, _: &str) -> Result<(), SharedGateError> {
            Ok(())
        }
        fn describe(&self) -> String {
            "scripted".into()
        }
    }

    fn key() -> IdempotencyKey {
        IdempotencyKey::new("t", &Target::Printer("p".into()), "B1", "receipt")
    }

    #[tokio::test]
    async fn a_failure_bypasses_the_gate_for_the_backoff_then_it_is_tried_again() {
        let inner = Arc::new(Scripted { mode: Mutex::new("fail"), calls: AtomicU64::new(0) });
        let gate = GuardedSharedGate::new(
            inner.clone(),
            SharedGateConfig { timeout: Duration::from_millis(50), backoff: Duration::from_millis(200) },
        );
        assert_eq!(gate.claim(&key()).await, None);
        assert_eq!(gate.claim(&key()).await, None, "bypassed during the back-off");
        assert_eq!(inner.calls.load(Ordering::Relaxed), 1, "the back-off made no call");
        let s = gate.stats();
        assert_eq!((s.failures, s.bypassed, s.up), (1, 2, false));
        *inner.mode.lock().unwrap() = "ok";
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(gate.claim(&key()).await, Some(SharedEntry::Claimed));
        assert!(gate.stats().up);
    }

    #[tokio::test]
    async fn a_hanging_gate_is_given_up_after_the_timeout() {
        let inner = Arc::new(Scripted { mode: Mutex::new("hang"), calls: AtomicU64::new(0) });
        let gate = GuardedSharedGate::new(
            inner,
            SharedGateConfig { timeout: Duration::from_millis(20), backoff: Duration::from_secs(60) },
        );
        assert_eq!(gate.claim(&key()).await, None);
        assert_eq!(gate.stats().failures, 1);
    }
}
