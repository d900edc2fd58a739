//! Retention: finished tasks older than `retention_days` are pruned, so that the
//! database does not grow for ever, while everything a person or an order system may
//! still ask about them stays true.
//!
//! A task is prunable when it is in an end state (`core::state`: `printed`,
//! `transferred`, `cancelled`, `closed`; `failed` and `in_doubt` still wait for a person
//! and are never pruned) and both its creation and its last change lie before the cutoff
//! (now − `retention_days`, by this job's [`Clock`]). Pruning deletes the task's content
//! and audit events and replaces its row by a tombstone, in one transaction per batch of
//! at most `batch_size` tasks, pausing between batches so that intake and deliveries,
//! which share the database (and on SQLite its one writer), are never held up for longer
//! than one small batch. The ledger is never pruned.
//!
//! What stays true afterwards:
//! - a late replay of the submission is a duplicate answered from the tombstone with the
//!   task id and final state and `pruned` (intake, `SubmitOutcome::Pruned`), never a new
//!   task or a second charge; different content under the key is still a mismatch;
//! - a day's reconciliation is the same report (the tombstone keeps every field it reads,
//!   and ledger entries stay);
//! - the first gate of this process marks the pruned tasks it remembers, so its answers
//!   say `pruned` too. (Other nodes' gates learn it when their entry is answered from the
//!   database again; their answers' task id and final state were true all along.)
//!
//! Each run logs one line with what it pruned; the totals are kept for `/metrics`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use onceprint_core::{Millis, TaskId, TaskState};
use onceprint_store::{PruneTask, Store, StoreError};

use crate::clock::Clock;
use crate::tz::{self, Zone};
use crate::{RecentTasks, StoreSignals};

const DAY_MS: Millis = 86_400_000;

/// Settings of retention.
#[derive(Debug, Clone)]
pub struct RetentionConfig {
    /// Finished tasks whose last change is older than this many days are pruned; 0 keeps
    /// every task for ever (retention off).
    pub days: u32,
    /// Tasks pruned per transaction.
    pub batch_size: usize,
    /// The pause between two batches of one run, in which other work has the database.
    pub pause: Duration,
    /// Time between two runs. The first run starts this long after the broker, at most a
    /// minute.
    pub interval: Duration,
}

impl RetentionConfig {
    /// The default of `retention_days`.
    pub const DEFAULT_DAYS: u32 = 90;
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig {
            days: RetentionConfig::DEFAULT_DAYS,
            batch_size: 500,
            pause: Duration::from_millis(50),
            interval: Duration::from_secs(3600),
        }
    }
}

/// What one run pruned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunReport {
    /// Tasks last changed before this instant were due.
    pub cutoff: Millis,
    pub tasks: u64,
    pub events: u64,
    pub batches: u64,
    /// Prunable tasks left alone because their store's time zone could not be read (their
    /// business day is part of the tombstone).
    pub skipped: u64,
}

/// Totals since the process started, for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetentionTotals {
    pub runs: u64,
    pub tasks: u64,
    pub events: u64,
}

/// The retention job of one broker process.
pub struct Retention {
    store: Arc<dyn Store>,
    gate: Arc<RecentTasks>,
    clock: Arc<dyn Clock>,
    config: RetentionConfig,
    runs: AtomicU64,
    tasks: AtomicU64,
    events: AtomicU64,
}

impl Retention {
    pub fn new(
        store: Arc<dyn Store>,
        gate: Arc<RecentTasks>,
        clock: Arc<dyn Clock>,
        config: RetentionConfig,
    ) -> Arc<Retention> {
        Arc::new(Retention {
            store,
            gate,
            clock,
            config,
            runs: AtomicU64::new(0),
            tasks: AtomicU64::new(0),
            events: AtomicU64::new(0),
        })
    }

    pub fn config(&self) -> &RetentionConfig {
        &self.config
    }

    pub fn totals(&self) -> RetentionTotals {
        RetentionTotals {
            runs: self.runs.load(Ordering::Relaxed),
            tasks: self.tasks.load(Ordering::Relaxed),
            events: self.events.load(Ordering::Relaxed),
        }
    }

    /// One run: prunes every task due now, batch by batch. With retention off it does
    /// nothing. `stop` is looked at between batches (graceful shutdown ends a long run
    /// after the batch in progress).
    pub async fn run_once(&self, stop: &(dyn Fn() -> bool + Sync)) -> Result<RunReport, StoreError> {
        if self.config.days == 0 {
            return Ok(RunReport::default());
        }
        let started = Instant::now();
        let now = self.clock.now_ms();
        let cutoff = now.saturating_sub(Millis::from(self.config.days) * DAY_MS);
        let mut report = RunReport { cutoff, ..RunReport::default() };
        // Task ids begin with their creation time: no task created after the cutoff can
        // have changed before it, and the scan of the primary key ends there.
        let before_id = TaskId::from_parts(cutoff.max(0), [0; 10]).into_string();
        let end_states: Vec<TaskState> = TaskState::ALL.into_iter().filter(|s| s.is_final()).collect();
        let limit = self.config.batch_size.max(1);
        let mut zones: HashMap<(String, String), Option<Zone>> = HashMap::new();
        let mut after: Option<String> = None;
        loop {
            let found =
                self.store.prunable_tasks(&end_states, &before_id, cutoff, after.as_deref(), limit as i64).await?;
            let Some(last) = found.last() else { break };
            after = Some(last.task_id.clone());
            let mut batch = Vec::with_capacity(found.len());
            for t in &found {
                let key = (t.tenant_id.clone(), t.store_id.clone());
                if !zones.contains_key(&key) {
                    let zone = self.zone(&t.tenant_id, &t.store_id).await?;
                    zones.insert(key.clone(), zone);
                }
                match zones.get(&key).and_then(Option::as_ref) {
                    Some(zone) => batch.push(PruneTask {
                        task_id: t.task_id.clone(),
                        state: t.state,
                        updated_at: t.updated_at,
                        business_day: zone.local_date(t.created_at),
                    }),
                    None => report.skipped += 1,
                }
            }
            if !batch.is_empty() {
                let pruned = self.store.prune_tasks(&batch, self.clock.now_ms()).await?;
                // Only after the commit: the gate answers from committed facts alone.
                for id in &pruned.task_ids {
                    self.gate.mark_pruned(id);
                }
                report.tasks += pruned.task_ids.len() as u64;
                report.events += pruned.events;
                report.batches += 1;
                self.tasks.fetch_add(pruned.task_ids.len() as u64, Ordering::Relaxed);
                self.events.fetch_add(pruned.events, Ordering::Relaxed);
            }
            if found.len() < limit || stop() {
                break;
            }
            // Other work gets the database between two batches.
            tokio::time::sleep(self.config.pause).await;
        }
        self.runs.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            retention_days = self.config.days,
            cutoff = %crate::clock::rfc3339(cutoff),
            tasks = report.tasks,
            events = report.events,
            batches = report.batches,
            skipped = report.skipped,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "retention run: finished tasks pruned"
        );
        Ok(report)
    }

    /// The store's time zone, or `None` (logged) when it cannot be read: its tasks wait
    /// for a run that can name their business day.
    async fn zone(&self, tenant_id: &str, store_id: &str) -> Result<Option<Zone>, StoreError> {
        let Some(shop) = self.store.get_store(tenant_id, store_id).await? else {
            tracing::warn!(tenant_id, store_id, "retention: the store of prunable tasks is gone; they are kept");
            return Ok(None);
        };
        match tz::parse(&shop.timezone) {
            Ok(zone) => Ok(Some(zone)),
            Err(error) => {
                tracing::warn!(tenant_id, store_id, %error, "retention: the store's time zone is unknown; its tasks are kept");
                Ok(None)
            }
        }
    }

    /// Runs until shutdown: the first run shortly after start, then every `interval`.
    /// Nothing is spawned with retention off.
    /// A run starts only while this node holds `lease` (one retention job per cluster) and
    /// stops between batches once it is lost.
    pub fn spawn(
        self: &Arc<Self>,
        signals: Arc<StoreSignals>,
        lease: crate::Lease,
    ) -> Option<tokio::task::JoinHandle<()>> {
        if self.config.days == 0 {
            tracing::info!("retention off (retention_days = 0): finished tasks are kept for ever");
            return None;
        }
        let this = self.clone();
        Some(tokio::spawn(async move {
            let mut wait = this.config.interval.min(Duration::from_secs(60));
            loop {
                tokio::select! {
                    _ = signals.shutdown() => return,
                    _ = tokio::time::sleep(wait) => {}
                }
                if !lease.is_held() {
                    // Another node runs it; look again soon in case it dies.
                    wait = Duration::from_secs(5).min(this.config.interval.max(Duration::from_millis(100)));
                    continue;
                }
                let stopping = || signals.is_shutting_down() || !lease.is_held();
                if let Err(e) = this.run_once(&stopping).await {
                    tracing::warn!(error = %e, "retention run failed; trying again at the next run");
                }
                wait = this.config.interval.max(Duration::from_millis(100));
            }
        }))
    }
}
