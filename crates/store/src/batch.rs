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
    /// Batches committing at once. SQLite has one writer, so 2 lets the next batch form
    /// while one commits; PostgreSQL commits concurrent transactions in parallel.
    pub max_in_flight: usize,
}

impl Default for GroupCommitConfig {
    fn default() -> Self {
        GroupCommitConfig { max_batch: 512, max_in_flight: 2 }
    }
}

type Reply = oneshot::Sender<Result<SubmitOutcome, StoreError>>;

/// Handle for submitting tasks through the group committer. Cheap to clone.
#[derive(Clone)]
pub struct GroupCommitter {
    tx: mpsc::Sender<(NewTask, Reply)>,
}

impl GroupCommitter {
    /// Starts the collecting loop on the current tokio runtime. The loop ends when every
    /// handle has been dropped and the last batch has been answered.
    pub fn start(store: Arc<dyn Store>, config: GroupCommitConfig) -> GroupCommitter {
        let max_batch = config.max_batch.max(1);
        let (tx, mut rx) = mpsc::channel::<(NewTask, Reply)>(max_batch * 8);
        let permits = Arc::new(Semaphore::new(config.max_in_flight.max(1)));
        tokio::spawn(async move {
            loop {
                // Wait for a commit slot first: submissions keep queueing in the channel
                // meanwhile, which is exactly what makes the next batch large under load.
                let Ok(permit) = permits.clone().acquire_owned().await else { break };
                let Some(first) = rx.recv().await else { break };
                let mut batch = Vec::with_capacity(64);
                batch.push(first);
                while batch.len() < max_batch {
                    match rx.try_recv() {
                        Ok(item) => batch.push(item),
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
        self.tx.send((task, reply)).await.map_err(|_| StoreError::Unavailable("intake is shutting down".into()))?;
        answer.await.map_err(|_| StoreError::Unavailable("intake batch was dropped".into()))?
    }
}
