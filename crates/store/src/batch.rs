//! Group commit for intake.
//!
//! One durable commit costs a disk flush (≈ 200 µs here); paying it per request caps a
//! broker at a few thousand tasks per second. The [`GroupCommitter`] collects the
//! submissions that arrive while the previous batch is being committed and hands them to
//! [`Store::submit_batch`] together: one transaction, one flush, every caller answered only
//! after that commit. Durability per request is unchanged; only the flush is shared.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::{NewTask, Store, StoreError, SubmitOutcome};

/// Tuning of the group committer.
#[derive(Debug, Clone, Copy)]
pub struct GroupCommitConfig {
    /// Most submissions in one transaction.
    pub max_batch: usize,
    /// Batches committing at once. SQLite has one writer, which takes every job waiting
    /// into its next commit: 3 lets two batches form while one commits, and they share
    /// the next flush. PostgreSQL commits concurrent transactions in parallel.
    pub max_in_flight: usize,
}

impl Default for GroupCommitConfig {
    fn default() -> Self {
        GroupCommitConfig { max_batch: 512, max_in_flight: 3 }
    }
}

type Reply = oneshot::Sender<Result<SubmitOutcome, StoreError>>;

/// What one caller hands the collecting loop: one task, or the tasks of one batch request,
/// which always go into the same transaction, in their order.
// A single task stays unboxed: it is the hot path, and the channel's slots were already as
// large before groups existed.
#[allow(clippy::large_enum_variant)]
enum Item {
    One(NewTask, Reply),
    Group(Vec<(NewTask, Reply)>),
}

/// Handle for submitting tasks through the group committer. Cheap to clone.
#[derive(Clone)]
pub struct GroupCommitter {
    tx: mpsc::Sender<Item>,
}

impl GroupCommitter {
    /// Starts the collecting loop on the current tokio runtime. The loop ends when every
    /// handle has been dropped and the last batch has been answered.
    pub fn start(store: Arc<dyn Store>, config: GroupCommitConfig) -> GroupCommitter {
        let max_batch = config.max_batch.max(1);
        let (tx, mut rx) = mpsc::channel::<Item>(max_batch * 8);
        let permits = Arc::new(Semaphore::new(config.max_in_flight.max(1)));
        tokio::spawn(async move {
            loop {
                // Wait for a commit slot first: submissions keep queueing in the channel
                // meanwhile, which is exactly what makes the next batch large under load.
                let Ok(permit) = permits.clone().acquire_owned().await else { break };
                let Some(first) = rx.recv().await else { break };
                let mut batch = Vec::with_capacity(64);
                let take = |batch: &mut Vec<(NewTask, Reply)>, item: Item| match item {
                    Item::One(task, reply) => batch.push((task, reply)),
                    // A group is never split: its tasks are created in one transaction, in
                    // the order the caller gave, so a batch may exceed `max_batch` by one group.
                    Item::Group(group) => batch.extend(group),
                };
                take(&mut batch, first);
                while batch.len() < max_batch {
                    match rx.try_recv() {
                        Ok(item) => take(&mut batch, item),
                        Err(_) => break,
                    }
                }
                let store = store.clone();
                tokio::spawn(async move {
                    let (tasks, replies): (Vec<NewTask>, Vec<Reply>) = batch.into_iter().unzip();
                    let n = tasks.len();
                    match store.submit_batch(tasks).await {
                        Ok(outcomes) if outcomes.len() == n => {
                            for (reply, outcome) in replies.into_iter().zip(outcomes) {
                                let _ = reply.send(Ok(outcome));
                            }
                        }
                        Ok(outcomes) => {
                            let err = StoreError::Backend(format!(
                                "backend answered {} outcomes for {n} submissions",
                                outcomes.len()
                            ));
                            for reply in replies {
                                let _ = reply.send(Err(err.clone()));
                            }
                        }
                        Err(err) => {
                            tracing::warn!(error = %err, batch = n, "intake batch failed");
                            for reply in replies {
                                let _ = reply.send(Err(err.clone()));
                            }
                        }
                    }
                    drop(permit);
                });
            }
        });
        GroupCommitter { tx }
    }

    /// Submits one task and waits until its batch is durable.
    pub async fn submit(&self, task: NewTask) -> Result<SubmitOutcome, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.tx.send(Item::One(task, reply)).await.map_err(|_| shutting_down())?;
        answer.await.map_err(|_| dropped())?
    }

    /// Submits several tasks that go into one transaction, created in the order given,
    /// and waits until it is durable. One outcome per task, in the same order.
    pub async fn submit_group(&self, tasks: Vec<NewTask>) -> Vec<Result<SubmitOutcome, StoreError>> {
        if tasks.is_empty() {
            return Vec::new();
        }
        let n = tasks.len();
        let mut answers = Vec::with_capacity(n);
        let mut group = Vec::with_capacity(n);
        for task in tasks {
            let (reply, answer) = oneshot::channel();
            group.push((task, reply));
            answers.push(answer);
        }
        if self.tx.send(Item::Group(group)).await.is_err() {
            return (0..n).map(|_| Err(shutting_down())).collect();
        }
        let mut outcomes = Vec::with_capacity(n);
        for answer in answers {
            outcomes.push(answer.await.unwrap_or_else(|_| Err(dropped())));
        }
        outcomes
    }
}

fn shutting_down() -> StoreError {
    StoreError::Unavailable("intake is shutting down".into())
}

fn dropped() -> StoreError {
    StoreError::Unavailable("intake batch was dropped".into())
}
