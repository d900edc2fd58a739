//! The worker's handling of one delivery, opened up for the simulation (`onceprint sim`).
//!
//! This module exists so that the simulation drives the real worker: the journal's answer
//! by task id and by idempotency key, the offline outbox's say on a key printed offline,
//! and the print sequence of [`crate::printer::print_job_on`], on printers it simulates
//! behind a [`crate::printer::Connector`]. The agent itself does not use it; nothing here
//! differs from what a printer's worker does with a delivery.

use crate::journal::Journal;
use crate::outbox::Outbox;
use crate::printer::{DriverConfig, PrinterLink, ProcessIds};
use crate::protocol::{Ack, Delivery};
use crate::worker::{handle_delivery, WorkerContext};
use std::collections::HashSet;
use std::sync::Arc;
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
