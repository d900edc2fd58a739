//! The ack sender: one task that batches the acks of all printer workers into one POST and
//! retries it with backoff until the broker answers 200. While the process lives an ack is
//! never dropped; if the process dies first, the broker redelivers the unconfirmed task to
//! this agent (same agent id) and the journal answers it without printing.

use crate::backoff::Backoff;
use crate::broker::{BrokerClient, BrokerError};
use crate::protocol::Ack;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;

/// At most this many acks go into one POST.
const MAX_BATCH: usize = 256;

/// Runs until `rx` is closed and every ack taken from it has been accepted by the broker.
/// `unsent` always holds the number of acks taken but not yet accepted, for the shutdown
/// report when the final flush is cut short.
pub(crate) async fn run_ack_sender(
    client: BrokerClient,
    mut rx: mpsc::UnboundedReceiver<Ack>,
    unsent: Arc<AtomicUsize>,
) {
    let mut pending: Vec<Ack> = Vec::new();
    let mut backoff = Backoff::default();
    loop {
        if pending.is_empty() {
            match rx.recv().await {
                Some(a) => pending.push(a),
                None => return,
            }
        }
        while let Ok(a) = rx.try_recv() {
            pending.push(a);
        }
        unsent.store(pending.len(), Ordering::Relaxed);
        let n = pending.len().min(MAX_BATCH);
        match client.send_acks(&pending[..n]).await {
            Ok(results) => {
                if backoff.failures() > 0 {
                    tracing::info!("acks reach the broker again");
                }
                backoff.reset();
                for r in &results {
                    tracing::debug!(task_id = %r.task_id, result = %r.result, "ack taken by the broker");
                }
                pending.drain(..n);
                unsent.store(pending.len(), Ordering::Relaxed);
            }
            Err(e) => {
                let delay = e.retry_delay(&mut backoff);
                log_failure(&e, n, delay, backoff.failures());
                tokio::time::sleep(delay).await;
            }
        }
    }
}

fn log_failure(e: &BrokerError, n: usize, delay: std::time::Duration, failures: u32) {
    let delay_ms = delay.as_millis() as u64;
    match e {
        BrokerError::Unauthorized => tracing::error!(error = %e, acks = n, delay_ms, "acks refused; retrying"),
        _ => tracing::warn!(error = %e, acks = n, delay_ms, failures, "could not send acks; retrying"),
    }
}
