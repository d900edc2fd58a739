//! Per-printer workers: each printer gets one task that handles its deliveries one at a
//! time in arrival order, so one slow or dead printer never holds up the others and
//! no printer is ever sent two jobs at once.
//!
//! The worker also owns its printer's link ([`PrinterLink`]: a TCP connection, or the open
//! device of a USB or serial printer): it stays open from one job to the next and is
//! closed once the printer has had no job for `--printer-idle-ms`, so that a printer that
//! serves one client at a time is free again for others while the agent has nothing for
//! it.

use crate::journal::{Journal, Record, RecordState};
use crate::outbox::Outbox;
use crate::printer::{
    print_job_on, Confirmation, DriverConfig, Job, PrinterAddress, PrinterConnection, PrinterLink, ProcessIds,
};
use crate::protocol::{Ack, Delivery, Outcome};
use base64::Engine as _;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit};
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
/// The start of the ack detail for a task whose idempotency key this agent printed under
/// another task id (the detail goes on to name that task).
pub const KEY_ALREADY_PRINTED: &str = "already printed under the same idempotency key (journal)";
/// The start of the ack detail for a task whose idempotency key another task id may have
/// printed (started and never confirmed, or in doubt): a person decides, nothing prints.
pub const KEY_IN_DOUBT: &str = "another task with the same idempotency key may have printed (journal); not printed";

/// The start of the ack detail for a task whose idempotency key this agent printed for a
/// ticket accepted on the LAN while offline, when the broker has not said (by the sync)
/// that the two are one ticket: the content may differ, so the broker's task is in doubt
/// until the sync settles it (same content: printed; other content: a person decides).
pub const KEY_PRINTED_OFFLINE: &str =
    "the same idempotency key was printed offline for a ticket accepted on the LAN; not printed";

/// What every worker shares.
pub(crate) struct WorkerContext {
    pub journal: Arc<Journal>,
    /// Tells a task accepted on the LAN from one the broker handed out (step 1b).
    pub outbox: Outbox,
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

/// What a worker is asked to do: print a delivery, or look at its idle printer.
enum Work {
    Deliver(Item),
    /// Ask the printer for its status, unless it printed within `quiet_for` (then the
    /// job's own answer said how it is, and a probe would only cost a reconnection).
    Probe {
        address: PrinterAddress,
        quiet_for: Duration,
        reply: oneshot::Sender<Option<IdleStatus>>,
    },
}

type Workers = Arc<Mutex<HashMap<String, mpsc::UnboundedSender<Work>>>>;

/// Routes deliveries to per-printer workers, starting a worker on a printer's first
/// delivery (or its first status probe).
pub(crate) struct Dispatcher {
    ctx: Arc<WorkerContext>,
    workers: Workers,
    handles: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Dispatcher {
    pub(crate) fn new(ctx: WorkerContext) -> Dispatcher {
        Dispatcher { ctx: Arc::new(ctx), workers: Arc::default(), handles: Arc::default() }
    }

    /// A handle for asking idle printers about their status (the status reporter).
    pub(crate) fn prober(&self) -> Prober {
        Prober { ctx: self.ctx.clone(), workers: self.workers.clone(), handles: self.handles.clone() }
    }

    /// A handle that hands deliveries to the same workers (the offline lane).
    pub(crate) fn feeder(&self) -> Feeder {
        Feeder { ctx: self.ctx.clone(), workers: self.workers.clone(), handles: self.handles.clone() }
    }

    pub(crate) fn dispatch(&mut self, delivery: Delivery, permit: Option<OwnedSemaphorePermit>) {
        let printer_id = delivery.printer_id.clone();
        let task_id = delivery.task_id.clone();
        if !send_work(
            &self.ctx,
            &self.workers,
            &self.handles,
            &printer_id,
            Work::Deliver(Item { delivery, _permit: permit }),
        ) {
            tracing::error!(task_id = %task_id, "no worker could take the delivery; the broker will redeliver it");
        }
    }

    /// Closes every queue and waits for the workers: each finishes the delivery it is
    /// printing and leaves the queued ones (see [`WorkerContext::stopping`]).
    pub(crate) async fn finish(self) {
        let Dispatcher { ctx, workers, handles } = self;
        if let Ok(mut w) = workers.lock() {
            w.clear();
        }
        drop(ctx);
        let handles = handles.lock().map(|mut h| std::mem::take(&mut *h)).unwrap_or_default();
        for h in handles {
            if let Err(e) = h.await {
                tracing::error!(error = %e, "a printer worker ended abnormally");
            }
        }
    }
}

/// Sends `work` to `printer_id`'s worker, starting one when there is none. A worker only
/// stops by panicking (or at shutdown); its queue is then closed and a fresh worker takes
/// the printer over. `false` when no worker could take it.
fn send_work(
    ctx: &Arc<WorkerContext>,
    workers: &Workers,
    handles: &Arc<Mutex<Vec<JoinHandle<()>>>>,
    printer_id: &str,
    mut work: Work,
) -> bool {
    for _ in 0..2 {
        let tx = {
            let Ok(mut map) = workers.lock() else { return false };
            match map.get(printer_id) {
                Some(tx) => tx.clone(),
                None => {
                    let (tx, rx) = mpsc::unbounded_channel();
                    let span = tracing::info_span!("printer", printer_id = %printer_id);
                    let handle = tokio::spawn(run_worker(ctx.clone(), rx).instrument(span));
                    if let Ok(mut h) = handles.lock() {
                        h.push(handle);
                    }
                    map.insert(printer_id.to_owned(), tx.clone());
                    tx
                }
            }
        };
        match tx.send(work) {
            Ok(()) => return true,
            Err(mpsc::error::SendError(back)) => {
                if let Ok(mut map) = workers.lock() {
                    map.remove(printer_id);
                }
                work = back;
            }
        }
    }
    false
}

/// Hands deliveries of the offline lane to the printers' workers, behind the broker's
/// deliveries already queued for the same printer: one worker per printer, one job at a
/// time, whoever the delivery came from. Dropped before [`Dispatcher::finish`].
#[derive(Clone)]
pub(crate) struct Feeder {
    ctx: Arc<WorkerContext>,
    workers: Workers,
    handles: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Feeder {
    pub(crate) fn dispatch(&self, delivery: Delivery) {
        if let Err(task_id) = self.send(delivery, None) {
            tracing::error!(task_id = %task_id, "no worker could take the offline task; it is tried again after a restart");
        }
    }

    /// A delivery of the broker's that came with the answer to acks, holding `permit` as
    /// a polled one does.
    pub(crate) fn dispatch_with(&self, delivery: Delivery, permit: Option<OwnedSemaphorePermit>) {
        if let Err(task_id) = self.send(delivery, permit) {
            tracing::error!(task_id = %task_id, "no worker could take the delivery; the broker will redeliver it");
        }
    }

    /// Queues `delivery` at its printer's worker; the task id when no worker could take it.
    fn send(&self, delivery: Delivery, permit: Option<OwnedSemaphorePermit>) -> Result<(), String> {
        let printer_id = delivery.printer_id.clone();
        let task_id = delivery.task_id.clone();
        let work = Work::Deliver(Item { delivery, _permit: permit });
        if send_work(&self.ctx, &self.workers, &self.handles, &printer_id, work) {
            Ok(())
        } else {
            Err(task_id)
        }
    }
}

/// Asks printers' workers about their idle printers (see [`crate::watch`]).
#[derive(Clone)]
pub(crate) struct Prober {
    ctx: Arc<WorkerContext>,
    workers: Workers,
    handles: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Prober {
    /// The status of `printer_id` at `address`, asked by its worker between jobs; `None`
    /// when it printed within `quiet_for`, is busy past the probe's patience, or the agent
    /// is stopping.
    pub(crate) async fn probe(
        &self,
        printer_id: &str,
        address: PrinterAddress,
        quiet_for: Duration,
    ) -> Option<IdleStatus> {
        if *self.ctx.stopping.borrow() {
            return None;
        }
        let (reply, answer) = oneshot::channel();
        if !send_work(&self.ctx, &self.workers, &self.handles, printer_id, Work::Probe { address, quiet_for, reply }) {
            return None;
        }
        // A worker in the middle of a slow job answers after it; a probe that has waited
        // this long is of no use, the job's ack will tell.
        let patience = self.ctx.driver.connect_timeout + self.ctx.driver.status_timeout * 2 + Duration::from_secs(1);
        tokio::time::timeout(patience, answer).await.ok().and_then(Result::ok).flatten()
    }
}

/// What an idle printer says about itself, in the words of the status report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IdleStatus {
    Ready,
    Blocked(onceprint_escpos::status::Blocker),
    Offline,
}

impl IdleStatus {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            IdleStatus::Ready => "ready",
            IdleStatus::Blocked(b) => b.outcome(),
            IdleStatus::Offline => "offline",
        }
    }
}

/// Asks the printer on a connection of its own, closed afterwards. The worker's kept
/// connection is closed first: a printer that serves one client at a time would not
/// answer a second one.
async fn probe_printer(ctx: &WorkerContext, link: &mut PrinterLink, address: &PrinterAddress) -> IdleStatus {
    link.close().await;
    let mut conn = match PrinterConnection::connect(address, ctx.driver.connect_timeout).await {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!(error = %e, "status probe: cannot connect");
            return IdleStatus::Offline;
        }
    };
    let status = conn.status(&[1, 2, 4], ctx.driver.status_timeout).await;
    conn.close().await;
    match status {
        Ok(st) => match st.blocker() {
            Some(onceprint_escpos::status::Blocker::Offline) => IdleStatus::Offline,
            Some(b) => IdleStatus::Blocked(b),
            None => IdleStatus::Ready,
        },
        Err(e) => {
            tracing::debug!(error = %e, "status probe: no answer");
            IdleStatus::Offline
        }
    }
}

async fn run_worker(ctx: Arc<WorkerContext>, mut rx: mpsc::UnboundedReceiver<Work>) {
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
        let Some(work) = item else { break };
        let item = match work {
            Work::Deliver(item) => item,
            Work::Probe { address, quiet_for, reply } => {
                let recent = link.idle_deadline(Duration::ZERO).is_some_and(|used| used.elapsed() < quiet_for);
                let status = if recent || *ctx.stopping.borrow() {
                    None
                } else {
                    Some(probe_printer(&ctx, &mut link, &address).await)
                };
                let _ = reply.send(status);
                continue;
            }
        };
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

/// Why the journal's `printed` record of `other` does not prove that the broker's task
/// `task_id` is on paper: `other` is a ticket accepted on the LAN that the sync has not
/// merged into `task_id`. `None`: it proves it (a task the broker handed out, or a LAN
/// ticket the broker merged into this very task, so with the same content).
async fn offline_twin_unsettled(ctx: &WorkerContext, other: &str, task_id: &str) -> Option<String> {
    match ctx.outbox.handover(other).await {
        Ok(None) => None,
        Ok(Some(h)) if h.result.as_deref() == Some("merged") && h.broker_task_id.as_deref() == Some(task_id) => None,
        Ok(Some(h)) if !h.synced => {
            Some("not synced yet: the sync settles it (same content: printed; other content: a person decides)".into())
        }
        Ok(Some(h)) => Some(format!(
            "synced as {}{}, not merged into this task",
            h.result.as_deref().unwrap_or("unknown"),
            h.broker_task_id.map(|b| format!(" (broker task {b})")).unwrap_or_default()
        )),
        Err(e) => Some(format!("the offline outbox could not be read ({e})")),
    }
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
    // sent to a printer again, whatever the broker asks.
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
                let rec = Record::new(&d.task_id, d.attempt, RecordState::InDoubt, STARTED_BEFORE_CRASH)
                    .keyed(&d.idempotency_key);
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

    // (1b) The same ticket under another task id (the idempotency key: business number,
    // printer, print type, reprint number): an order that reached the broker twice, a task
    // accepted offline and again in the cloud, a broker restored from an older backup.
    // Printed there → printed here, without paper; possibly printed there → in doubt.
    if let Some(r) = ctx.journal.lookup_key(&d.idempotency_key).filter(|r| r.task_id != d.task_id) {
        let decided = match r.state {
            RecordState::Printed => Some((Outcome::Printed, RecordState::Printed, KEY_ALREADY_PRINTED)),
            RecordState::Started | RecordState::InDoubt => Some((Outcome::InDoubt, RecordState::InDoubt, KEY_IN_DOUBT)),
            // A blocker or an error there: nothing came out of the printer for that task.
            _ => None,
        };
        if let Some((mut outcome, mut state, why)) = decided {
            let mut detail = format!("{why}: task {} (attempt {}, {})", r.task_id, r.attempt, r.at);
            // Printed for a ticket accepted on the LAN: the key is the same, but only the
            // sync tells whether the content is. Answering `printed` here would settle a
            // task whose other content never came out, and overrule the sync's conflict
            // (a late `printed` ends a doubt); `in_doubt` lets the sync decide either way.
            if outcome == Outcome::Printed {
                if let Some(why_not) = offline_twin_unsettled(ctx, &r.task_id, &d.task_id).await {
                    outcome = Outcome::InDoubt;
                    state = RecordState::InDoubt;
                    detail = format!("{KEY_PRINTED_OFFLINE}: LAN task {} ({}); {why_not}", r.task_id, r.at);
                }
            }
            tracing::warn!(task_id = %d.task_id, key = %d.idempotency_key, other = %r.task_id, %outcome, "same idempotency key as a task this agent journaled; not printed");
            // Journaled under this task id too, so that its redeliveries are answered by
            // step (1) even once the other task id has left the journal.
            let rec = Record::new(&d.task_id, d.attempt, state, detail.clone()).keyed(&d.idempotency_key);
            if let Err(e) = ctx.journal.append(rec).await {
                tracing::error!(task_id = %d.task_id, error = %e, "could not journal the answer by idempotency key");
            }
            return ack(outcome, detail);
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
    let job = Job {
        task_id: &d.task_id,
        attempt: d.attempt,
        key: &d.idempotency_key,
        data: &data,
        process_id: ids.next(&d.task_id, d.attempt),
    };
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
    let rec = Record::new(&d.task_id, d.attempt, RecordState::from(outcome), detail.clone()).keyed(&d.idempotency_key);
    if let Err(e) = ctx.journal.append(rec).await {
        tracing::warn!(task_id = %d.task_id, error = %e, "could not journal the outcome");
    }
    Ack { task_id: d.task_id.clone(), attempt: d.attempt, outcome, detail }
}
