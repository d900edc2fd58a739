//! Per-printer workers: each printer gets one task that handles its deliveries one at a
//! time in arrival order (R23), so one slow or dead printer never holds up the others and
//! no printer is ever sent two jobs at once.
//!
//! The worker also owns its printer's link ([`PrinterLink`]: a TCP connection, or the open
//! device of a USB or serial printer): it stays open from one job to the next and is
//! closed once the printer has had no job for `--printer-idle-ms`, so that a printer that
//! serves one client at a time is free again for others while the agent has nothing for
//! it.

use crate::journal::{Journal, Record, RecordState};
use crate::printer::{print_job_on, Confirmation, DriverConfig, Job, PrinterAddress, PrinterLink, ProcessIds};
use crate::protocol::{Ack, Delivery, Outcome};
use base64::Engine as _;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit};
use tokio::task::JoinHandle;
use tracing::Instrument as _;

/// The ack detail for a task the journal says was printed.
pub const ALREADY_PRINTED: &str = "already printed (journal)";
/// The ack detail for a task that was started but never finished before a crash.
pub const STARTED_BEFORE_CRASH: &str = "printing started before a crash; not printed again";
/// The ack detail for an attempt the agent answered already (its journal says how).
pub const ALREADY_REPORTED: &str = "attempt already answered (journal); not printed";
/// The ack detail for a task the journal already holds in doubt.
pub const ALREADY_IN_DOUBT: &str = "in doubt since an earlier attempt (journal); not printed again";

/// What every worker shares.
pub(crate) struct WorkerContext {
    pub journal: Arc<Journal>,
    pub driver: DriverConfig,
    /// An open printer connection (or device) is closed after this long without a job;
    /// zero closes it after every job.
    pub printer_idle: Duration,
    /// Printers confirmed by status only (they ignore `GS ( H`).
    pub no_printed_ack: HashSet<String>,
    pub acks: mpsc::UnboundedSender<Ack>,
    /// Becomes `true` at shutdown: queued deliveries are then left for the broker to
    /// redeliver instead of being started.
    pub stopping: watch::Receiver<bool>,
}

struct Item {
    delivery: Delivery,
    /// Held until the delivery is handled, so the poll loop never asks for more work than
    /// `--max-deliveries` in the agent at once.
    _permit: Option<OwnedSemaphorePermit>,
}

/// Routes deliveries to per-printer workers, starting a worker on a printer's first
/// delivery.
pub(crate) struct Dispatcher {
    ctx: Arc<WorkerContext>,
    workers: HashMap<String, mpsc::UnboundedSender<Item>>,
    handles: Vec<JoinHandle<()>>,
}

impl Dispatcher {
    pub(crate) fn new(ctx: WorkerContext) -> Dispatcher {
        Dispatcher { ctx: Arc::new(ctx), workers: HashMap::new(), handles: Vec::new() }
    }

    pub(crate) fn dispatch(&mut self, delivery: Delivery, permit: Option<OwnedSemaphorePermit>) {
        let mut item = Item { delivery, _permit: permit };
        // A worker only stops by panicking (or at shutdown, which is not now); its queue is
        // then closed and a fresh worker takes the printer over.
        for _ in 0..2 {
            let tx = match self.workers.get(&item.delivery.printer_id) {
                Some(tx) => tx.clone(),
                None => self.spawn(item.delivery.printer_id.clone()),
            };
            match tx.send(item) {
                Ok(()) => return,
                Err(mpsc::error::SendError(back)) => {
                    self.workers.remove(&back.delivery.printer_id);
                    item = back;
                }
            }
        }
        tracing::error!(task_id = %item.delivery.task_id, "no worker could take the delivery; the broker will redeliver it");
    }

    fn spawn(&mut self, printer_id: String) -> mpsc::UnboundedSender<Item> {
        let (tx, rx) = mpsc::unbounded_channel();
        let ctx = self.ctx.clone();
        let span = tracing::info_span!("printer", printer_id = %printer_id);
        self.handles.push(tokio::spawn(run_worker(ctx, rx).instrument(span)));
        self.workers.insert(printer_id, tx.clone());
        tx
    }

    /// Closes every queue and waits for the workers: each finishes the delivery it is
    /// printing and leaves the queued ones (see [`WorkerContext::stopping`]).
    pub(crate) async fn finish(self) {
        let Dispatcher { ctx, workers, handles } = self;
        drop(workers);
        drop(ctx);
        for h in handles {
            if let Err(e) = h.await {
                tracing::error!(error = %e, "a printer worker ended abnormally");
            }
        }
    }
}

async fn run_worker(ctx: Arc<WorkerContext>, mut rx: mpsc::UnboundedReceiver<Item>) {
    let mut ids = ProcessIds::default();
    let mut link = PrinterLink::new();
    loop {
        let item = match rx.try_recv() {
            Ok(item) => Some(item),
            Err(_) => match link.idle_deadline(ctx.printer_idle) {
                Some(idle_at) => tokio::select! {
                    item = rx.recv() => item,
                    _ = tokio::time::sleep_until(idle_at) => {
                        tracing::debug!("closing the idle printer connection");
                        link.close().await;
                        continue;
                    }
                },
                None => rx.recv().await,
            },
        };
        let Some(item) = item else { break };
        let d = item.delivery;
        if *ctx.stopping.borrow() {
            tracing::info!(task_id = %d.task_id, attempt = d.attempt, "shutting down: not started; the broker will redeliver it");
            continue;
        }
        let ack = handle_delivery(&ctx, &d, &mut ids, &mut link).await;
        if ctx.printer_idle.is_zero() {
            link.close().await;
        }
        tracing::info!(
            task_id = %d.task_id,
            attempt = d.attempt,
            printer_id = %d.printer_id,
            outcome = %ack.outcome,
            detail = %ack.detail,
            "delivery handled"
        );
        if ctx.acks.send(ack).is_err() {
            // Only possible if the ack sender is gone, i.e. the agent is being torn down;
            // the journal still answers the redelivery.
            tracing::error!(task_id = %d.task_id, "ack queue closed; the broker will redeliver and the journal will answer");
        }
    }
    link.close().await;
}

/// Decides and carries out one delivery; returns the ack to send.
pub(crate) async fn handle_delivery(
    ctx: &WorkerContext,
    d: &Delivery,
    ids: &mut ProcessIds,
    link: &mut PrinterLink,
) -> Ack {
    let ack =
        |outcome: Outcome, detail: String| Ack { task_id: d.task_id.clone(), attempt: d.attempt, outcome, detail };

    // (1) The journal first: a task this agent printed, or may have printed, is never
    // sent to a printer again, whatever the broker asks (R20, R22).
    if let Some(r) = ctx.journal.lookup(&d.task_id) {
        let authorised_reprint = d.reprint && r.attempt < d.attempt;
        match r.state {
            RecordState::Printed => return ack(Outcome::Printed, ALREADY_PRINTED.into()),
            // The broker's policy for this print type is to reprint on doubt and it has
            // moved on to a new attempt: the doubt about the older one was decided.
            RecordState::InDoubt | RecordState::Started if authorised_reprint => {
                tracing::warn!(task_id = %d.task_id, attempt = d.attempt, "reprint on doubt authorised by the broker");
            }
            RecordState::InDoubt => return ack(Outcome::InDoubt, ALREADY_IN_DOUBT.into()),
            RecordState::Started => {
                let rec = Record::new(&d.task_id, d.attempt, RecordState::InDoubt, STARTED_BEFORE_CRASH);
                if let Err(e) = ctx.journal.append(rec).await {
                    // The answer is the same either way; the `started` record keeps it so.
                    tracing::error!(task_id = %d.task_id, error = %e, "could not journal in_doubt");
                }
                return ack(Outcome::InDoubt, STARTED_BEFORE_CRASH.into());
            }
            // This very attempt (or a later one) was answered already, and the answer may
            // have been lost on the way: say the same again rather than print. Printing an
            // attempt the agent reported as "no paper" would let a retried report undo the
            // print on the broker (and a station fail over to a second printer).
            other if r.attempt >= d.attempt => {
                let outcome = match other {
                    RecordState::NoPaper => Outcome::NoPaper,
                    RecordState::CoverOpen => Outcome::CoverOpen,
                    RecordState::Offline => Outcome::Offline,
                    RecordState::PaperJam => Outcome::PaperJam,
                    _ => Outcome::Error,
                };
                return ack(outcome, format!("{ALREADY_REPORTED}: {}", r.detail));
            }
            // A blocker or error on an earlier attempt: nothing was sent then.
            _ => {}
        }
    }

    // (2) A delivery the agent cannot even try is an error; nothing is sent.
    let prepared = prepare(d);
    let (address, data) = match prepared {
        Ok(p) => p,
        Err(detail) => return finish_without_printing(ctx, d, Outcome::Error, detail).await,
    };

    // (3) Print (status check, `started`, send, confirm, `printed`/`in_doubt`).
    let confirmation =
        if ctx.no_printed_ack.contains(&d.printer_id) { Confirmation::StatusOnly } else { Confirmation::ProcessId };
    let job = Job { task_id: &d.task_id, attempt: d.attempt, data: &data, process_id: ids.next(&d.task_id, d.attempt) };
    let finished = print_job_on(link, &ctx.journal, &address, &job, &ctx.driver, confirmation).await;
    match finished.outcome {
        // `print_job` has journaled these itself, in the order that makes them safe.
        Outcome::Printed | Outcome::InDoubt => ack(finished.outcome, finished.detail),
        other => finish_without_printing(ctx, d, other, finished.detail).await,
    }
}

fn prepare(d: &Delivery) -> Result<(PrinterAddress, Vec<u8>), String> {
    if d.content_type != "escpos" {
        return Err(format!("unsupported content_type {:?}; this agent prints escpos", d.content_type));
    }
    let address: PrinterAddress = d.printer_address.parse()?;
    let data = base64::engine::general_purpose::STANDARD
        .decode(d.data.as_bytes())
        .map_err(|e| format!("data is not valid base64: {e}"))?;
    if data.is_empty() {
        return Err("data is empty".into());
    }
    Ok((address, data))
}

/// Journals an outcome reached before anything was sent, for the device-side record, and
/// returns its ack. A journal failure is only logged: nothing was printed, so there is
/// nothing the journal must remember.
async fn finish_without_printing(ctx: &WorkerContext, d: &Delivery, outcome: Outcome, detail: String) -> Ack {
    let rec = Record::new(&d.task_id, d.attempt, RecordState::from(outcome), detail.clone());
    if let Err(e) = ctx.journal.append(rec).await {
        tracing::warn!(task_id = %d.task_id, error = %e, "could not journal the outcome");
    }
    Ack { task_id: d.task_id.clone(), attempt: d.attempt, outcome, detail }
}
