//! The ack sender: one task that batches the acks of all printer workers into one POST and
//! retries it with backoff until the broker answers 200. While the process lives an ack is
//! never dropped; if the process dies first, the broker redelivers the unconfirmed task to
//! this agent (same agent id) and the journal answers it without printing.
//!
//! With a broker that speaks agent protocol 2 the acks also ask for the next deliveries of
//! the printers they free (`next`), as many as the agent has room for (the poll loop's
//! `--max-deliveries` permits, shared with it): a busy printer's next job then comes with
//! the answer to the ack of its last one, in the same commit at the broker, instead of
//! after a poll. The poll loop still finds work for idle printers.

use crate::backoff::Backoff;
use crate::broker::{BrokerClient, BrokerError};
use crate::protocol::Ack;
use crate::worker::Feeder;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::{mpsc, watch, Semaphore};

/// At most this many acks go into one POST.
const MAX_BATCH: usize = 256;

/// Where deliveries that come with acks go: the printers' workers, each holding one of the
/// agent's delivery permits until it is handled. No new deliveries are asked for once
/// the agent is stopping, and the feeder is dropped then: it keeps the workers' context,
/// and with it the ack queue, open, and the sender ends only once that queue closes.
pub(crate) struct NextDeliveries {
    pub capacity: Arc<Semaphore>,
    pub feeder: Feeder,
    pub stopping: watch::Receiver<bool>,
}

/// Runs until `rx` is closed and every ack taken from it has been accepted by the broker.
/// `unsent` always holds the number of acks taken but not yet accepted, for the shutdown
/// report when the final flush is cut short.
pub(crate) async fn run_ack_sender(
    client: BrokerClient,
    mut rx: mpsc::UnboundedReceiver<Ack>,
    unsent: Arc<AtomicUsize>,
    next: NextDeliveries,
) {
    let NextDeliveries { capacity, feeder, mut stopping } = next;
    let mut feeder = Some(feeder);
    let mut pending: Vec<Ack> = Vec::new();
    let mut backoff = Backoff::default();
    loop {
        if *stopping.borrow() {
            feeder = None;
        }
        if pending.is_empty() {
            tokio::select! {
                a = rx.recv() => match a {
                    Some(a) => pending.push(a),
                    None => return,
                },
                changed = stopping.changed(), if feeder.is_some() => {
                    if changed.is_err() {
                        feeder = None; // the agent is gone; no deliveries any more
                    }
                    continue;
                }
            }
        }
        while let Ok(a) = rx.try_recv() {
            pending.push(a);
        }
        unsent.store(pending.len(), Ordering::Relaxed);
        let n = pending.len().min(MAX_BATCH);
        // Room for the next job of each printer these acks free, as far as the agent has
        // it; the permits go with the deliveries, or back when none come.
        let mut permits = match &feeder {
            Some(_) if client.takes_next() => {
                let room = capacity.available_permits().min(n);
                capacity.clone().try_acquire_many_owned(room as u32).ok().filter(|p| p.num_permits() > 0)
            }
            _ => None,
        };
        let room = permits.as_ref().map_or(0, |p| p.num_permits());
        match client.send_acks(&pending[..n], room).await {
            Ok(answer) => {
                if backoff.failures() > 0 {
                    tracing::info!("acks reach the broker again");
                }
                backoff.reset();
                for r in &answer.results {
                    tracing::debug!(task_id = %r.task_id, result = %r.result, "ack taken by the broker");
                }
                pending.drain(..n);
                unsent.store(pending.len(), Ordering::Relaxed);
                for d in answer.deliveries {
                    tracing::info!(
                        task_id = %d.task_id,
                        attempt = d.attempt,
                        printer_id = %d.printer_id,
                        idempotency_key = %d.idempotency_key,
                        "delivery received with the acks"
                    );
                    let permit = permits.as_mut().and_then(|p| p.split(1));
                    match &feeder {
                        Some(f) => f.dispatch_with(d, permit),
                        // Stopping since the acks went out: the delivery is left for the
                        // broker to offer again, as a queued one is (see the workers).
                        None => tracing::info!(task_id = %d.task_id, "stopping; the delivery is left to the broker"),
                    }
                }
            }
            Err(e) => {
                drop(permits);
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
