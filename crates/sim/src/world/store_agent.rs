//! The store agents of the simulated world run the agent's real code: each process has
//! the agent's journal (`onceprint_agent::journal::Journal`, a file in the agent's own
//! state directory, kept across restarts) and hands each delivery to the worker's own
//! `handle_delivery`, which asks the journal by task id and by idempotency key, checks the
//! printer's status, journals `started`, sends the job with `GS ( H`, waits for the
//! confirmation and journals `printed` or `in_doubt` before the ack goes out. The printers
//! on the other end of the byte stream are simulated here from the ESC/POS command
//! reference (`DLE EOT n`, `GS ( H` fn 48), not from the agent's code.
//!
//! The worker runs on a runtime of its own whose clock is paused: a wait for a reply that
//! never comes (the driver's status and print timeouts) ends as soon as nothing else can
//! happen, without real seconds passing, and at the same point in every run.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use base64::Engine as _;
use onceprint_agent::journal::Journal;
use onceprint_agent::outbox::Outbox;
use onceprint_agent::printer::{Connector, DriverConfig, PrinterAddress, PrinterLink, PrinterStream, ProcessIds};
use onceprint_agent::simulation::Worker;
use onceprint_core::Outcome;
use onceprint_engine::{AckIn, AgentDelivery};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::runtime::Runtime;
use tokio::sync::Notify;

use super::{engine_err, Fail, World};
use crate::schedule::AgentPrint;

/// The store's ESC/POS printers, by printer id and the address the broker hands out
/// (`set_up`). The second is a printer that ignores `GS ( H`, which the agent is told
/// (`--no-printed-ack`): it confirms jobs by a status check after sending.
pub(super) const PRINTERS: [(&str, &str, bool); 2] =
    [("a1", "tcp://127.0.0.1:9101", true), ("a2", "tcp://127.0.0.1:9102", false)];

/// The journal keeps this many task ids (far more than a run has).
const JOURNAL_CAPACITY: usize = 10_000;

/// The runtime the agents' code runs on: one thread, the clock paused, so that a wait
/// for a printer that stays silent ends at once (tokio moves a paused clock to the next
/// timer when nothing else can run) and the order of everything is the program's.
pub(super) fn runtime() -> Result<Runtime, Fail> {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .map_err(|e| format!("cannot build the agents' runtime: {e}"))
}

/// What an agent process holds; a kill -9 drops all of it but the files.
pub(super) struct Process {
    /// Its state directory: the journal's file (and, for the LAN listener, the outbox's).
    dir: PathBuf,
    outbox: Outbox,
    journal: Arc<Journal>,
    worker: Worker,
    /// Each printer's worker state: its `GS ( H` process ids and its kept connection.
    links: HashMap<String, (ProcessIds, PrinterLink)>,
}

impl Process {
    /// Starts an agent process on the state directory `dir`.
    pub(super) fn start(dir: &Path, outbox: Outbox) -> Result<Process, Fail> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let journal = Arc::new(Journal::open(dir, JOURNAL_CAPACITY).map_err(|e| engine_err("journal", e))?);
        let no_printed_ack: HashSet<String> =
            PRINTERS.iter().filter(|(_, _, ids)| !ids).map(|(id, _, _)| (*id).to_owned()).collect();
        let worker = Worker::new(journal.clone(), outbox.clone(), DriverConfig::default(), no_printed_ack);
        Ok(Process { dir: dir.to_owned(), outbox, journal, worker, links: HashMap::new() })
    }

    /// kill -9 and a new process: the journal's file stays and is read again (a write the
    /// old process had not finished is not in it: the kill only lands while the worker
    /// waits for the printer, with no write of its own under way), and so is the offline
    /// outbox, whose opening settles what the old process left half done (tickets it had
    /// handed to an upload whose answer it never heard).
    pub(super) fn restart(&mut self, rt: &Runtime) -> Result<(), Fail> {
        // The old writer has nothing queued; closing it lets the new process open the file
        // alone, as the next process after a kill does.
        let _ = rt.block_on(self.journal.close());
        let outbox = Outbox::open(&self.dir).map_err(|e| engine_err("outbox", e))?;
        *self = Process::start(&self.dir.clone(), outbox)?;
        Ok(())
    }

    /// The process's offline outbox (the LAN listener's is the world's).
    pub(super) fn outbox(&self) -> Outbox {
        self.outbox.clone()
    }
}

/// How a delivery's print ended, as the world saw it.
pub(super) struct Handled {
    /// The ack the agent sends; `None` when the process died before it.
    pub ack: Option<AckIn>,
    /// Copies that came out of the printer, with the bytes that made them.
    pub paper: Vec<Vec<u8>>,
    /// The job's data reached the printer (the worker passed its `started`).
    pub sent: bool,
}

/// Hands `d` to the process's real worker, the printer meeting `print`.
pub(super) fn handle(
    rt: &Runtime,
    process: &mut Process,
    printers: &Printers,
    d: &AgentDelivery,
    print: AgentPrint,
) -> Result<Handled, Fail> {
    let delivery = onceprint_agent::Delivery {
        task_id: d.task_id.clone(),
        attempt: u32::try_from(d.attempt).map_err(|_| format!("attempt {} of {}", d.attempt, d.task_id))?,
        printer_id: d.printer_id.clone(),
        printer_address: d.printer_address.clone(),
        idempotency_key: d.idempotency_key.clone(),
        content_type: d.content_type.to_owned(),
        data: base64::engine::general_purpose::STANDARD.encode(&d.data),
        reprint: d.reprint,
    };
    let done = run(rt, process, printers, &delivery, print)?;
    let ack = done.ack.map(|a| AckIn::agent(a.task_id, d.attempt, a.outcome, a.detail));
    Ok(Handled { ack, paper: done.paper, sent: done.sent })
}

/// How the worker's print of one delivery ended, with the agent's own ack.
pub(super) struct Ran {
    /// The ack the worker returns; `None` when the process died before it.
    pub ack: Option<onceprint_agent::Ack>,
    pub paper: Vec<Vec<u8>>,
    pub sent: bool,
}

/// Hands the agent's delivery `delivery` (the broker's, or one of the local lane's) to the
/// process's real worker, the printer meeting `print`.
pub(super) fn run(
    rt: &Runtime,
    process: &mut Process,
    printers: &Printers,
    delivery: &onceprint_agent::Delivery,
    print: AgentPrint,
) -> Result<Ran, Fail> {
    let slot = printers.slot(&delivery.printer_id);
    if let Some(i) = slot {
        printers.prepare(i, print);
    }
    let crash = printers.0.crash.clone();
    let (ids, link) = process
        .links
        .entry(delivery.printer_id.clone())
        .or_insert_with(|| (ProcessIds::default(), PrinterLink::with_connector(Arc::new(printers.clone()))));
    let worker = &process.worker;
    let ack = rt.block_on(async {
        tokio::select! {
            biased;
            // The printer took the job and the process dies: whatever the worker would have
            // done next (read the confirmation, journal it, ack) never happens.
            () = crash.notified() => None,
            ack = worker.handle_delivery(delivery, ids, link) => Some(ack),
        }
    });
    let (paper, sent) = match slot {
        Some(i) => printers.settle(i),
        None => (Vec::new(), false),
    };
    Ok(Ran { ack, paper, sent })
}

/// Why a printer cannot print, as its status bytes say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    PaperEnd,
    CoverOpen,
    /// A paper jam at the autocutter.
    Jam,
}

/// What the next job meets at a printer: the schedule's draw for one delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    None,
    /// The status bytes report a stop; nothing prints.
    Stopped(Stop),
    /// Switched off: connections are refused, and those made before are gone.
    Off,
    /// Connected, but it answers nothing, not even `DLE EOT` (a printer that hangs).
    Silent,
    /// It prints what it is sent, and from then on nothing it says gets back.
    AnswerLost,
    /// It takes the job (printing it or not) and the agent process is killed at that
    /// moment.
    Kill {
        paper: bool,
    },
}

struct EscPos {
    /// Answers `GS ( H` fn 48; a printer without it skips the command.
    process_ids: bool,
    fault: Fault,
    /// Bumped at every power-off: a connection of an older power-on is dead.
    power: u64,
    /// Print data received and not yet finished as a copy.
    job: Vec<u8>,
    /// Copies out since the world last looked.
    out: Vec<Vec<u8>>,
    /// Print data reached the printer since the world last looked.
    received: bool,
}

impl EscPos {
    /// The data received so far comes out as one copy.
    fn finish_job(&mut self) {
        if !self.job.is_empty() {
            self.out.push(std::mem::take(&mut self.job));
        }
    }

    /// The answer to `DLE EOT n` (ESC/POS "Transmit real-time status"): one byte with
    /// bits 1 and 4 set and bits 0 and 7 clear. n = 1, printer status: bit 3 offline (a
    /// printer stopped for paper, an open cover or an error is offline). n = 2, offline
    /// cause: bit 2 cover open, bit 5 printing stopped by a paper end, bit 6 an error
    /// occurred. n = 3, error cause: bit 3 autocutter error. n = 4, roll paper sensor:
    /// bits 2–3 near end, bits 5–6 paper end. Other n are not answered here.
    fn status(&self, n: u8) -> Option<u8> {
        let stop = match self.fault {
            Fault::Stopped(s) => Some(s),
            _ => None,
        };
        let bits = match n {
            1 if stop.is_some() => 0x08,
            1 => 0,
            2 => match stop {
                Some(Stop::PaperEnd) => 0x20,
                Some(Stop::CoverOpen) => 0x04,
                Some(Stop::Jam) => 0x40,
                None => 0,
            },
            3 if stop == Some(Stop::Jam) => 0x08,
            3 => 0,
            4 if stop == Some(Stop::PaperEnd) => 0x6C,
            4 => 0,
            _ => return None,
        };
        Some(0x12 | bits)
    }
}

/// The simulated printers, shared by both agents (each opens its own connections), and
/// the signal that kills the agent process whose job a printer just took.
#[derive(Clone)]
pub(super) struct Printers(Arc<Shared>);

struct Shared {
    printers: Mutex<Vec<EscPos>>,
    addresses: Vec<PrinterAddress>,
    crash: Arc<Notify>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Vec<EscPos>> {
        self.printers.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Printers {
    pub(super) fn new() -> Result<Printers, Fail> {
        let mut addresses = Vec::new();
        let mut printers = Vec::new();
        for (_, address, process_ids) in PRINTERS {
            addresses.push(address.parse::<PrinterAddress>().map_err(|e| format!("{address}: {e}"))?);
            printers.push(EscPos {
                process_ids,
                fault: Fault::None,
                power: 0,
                job: Vec::new(),
                out: Vec::new(),
                received: false,
            });
        }
        Ok(Printers(Arc::new(Shared { printers: Mutex::new(printers), addresses, crash: Arc::new(Notify::new()) })))
    }

    fn slot(&self, printer_id: &str) -> Option<usize> {
        PRINTERS.iter().position(|(id, _, _)| *id == printer_id)
    }

    /// Sets what printer `i` does with the next delivery.
    fn prepare(&self, i: usize, print: AgentPrint) {
        let mut all = self.0.lock();
        let p = &mut all[i];
        p.fault = match print {
            AgentPrint::Printed => Fault::None,
            AgentPrint::Blocked(Outcome::NoPaper) => Fault::Stopped(Stop::PaperEnd),
            AgentPrint::Blocked(Outcome::CoverOpen) => Fault::Stopped(Stop::CoverOpen),
            AgentPrint::Blocked(Outcome::PaperJam) => Fault::Stopped(Stop::Jam),
            AgentPrint::Blocked(Outcome::Offline) => Fault::Off,
            AgentPrint::Blocked(_) => Fault::Silent,
            AgentPrint::LostAfterPaper => Fault::AnswerLost,
            AgentPrint::Crash { paper } => Fault::Kill { paper },
        };
        if p.fault == Fault::Off {
            p.power += 1;
        }
    }

    /// After a delivery: what came out (anything the printer still holds comes out now,
    /// as a printer prints what it received), whether job data arrived, and the printer
    /// is well again for the next one.
    fn settle(&self, i: usize) -> (Vec<Vec<u8>>, bool) {
        let mut all = self.0.lock();
        let p = &mut all[i];
        p.finish_job();
        p.fault = Fault::None;
        (std::mem::take(&mut p.out), std::mem::take(&mut p.received))
    }
}

impl Connector for Printers {
    fn open(&self, address: &PrinterAddress) -> io::Result<Box<dyn PrinterStream>> {
        let Some(printer) = self.0.addresses.iter().position(|a| a == address) else {
            return Err(io::ErrorKind::ConnectionRefused.into());
        };
        let all = self.0.lock();
        if all[printer].fault == Fault::Off {
            return Err(io::ErrorKind::ConnectionRefused.into());
        }
        let power = all[printer].power;
        drop(all);
        Ok(Box::new(Connection {
            shared: self.0.clone(),
            printer,
            power,
            pending: Vec::new(),
            replies: VecDeque::new(),
            mute: false,
        }))
    }
}

/// One connection to a simulated printer: what the printer sends back on it, and the
/// bytes of a command that has not fully arrived yet.
struct Connection {
    shared: Arc<Shared>,
    printer: usize,
    /// The power-on it was made in.
    power: u64,
    pending: Vec<u8>,
    replies: VecDeque<u8>,
    /// Nothing the printer says reaches the agent any more.
    mute: bool,
}

impl Connection {
    /// Takes what the agent wrote. Real-time commands (`DLE EOT n`, `10 04 n`) are
    /// executed as they arrive, even in the middle of other data, as the ESC/POS reference
    /// says (which is why it tells programs not to put `10 04 n` inside other commands'
    /// parameters). `GS ( H` fn 48 (`1D 28 48 06 00 30 30 d1 d2 d3 d4`, "transmit process
    /// ID response") is executed in order: once the data before it has printed, the
    /// printer sends `37 22 d1 d2 d3 d4 00`. Everything else is print data.
    fn take(&mut self, bytes: &[u8]) {
        let shared = self.shared.clone();
        let mut all = shared.lock();
        let p = &mut all[self.printer];
        self.pending.extend_from_slice(bytes);
        let mut data = Vec::new();
        let mut i = 0;
        let b = std::mem::take(&mut self.pending);
        while i < b.len() {
            let rest = &b[i..];
            if rest[0] == 0x10 && (rest.len() < 2 || rest[1] == 0x04) {
                let Some(&n) = rest.get(2) else { break };
                if let (Some(byte), false) = (p.status(n), matches!(p.fault, Fault::Silent) || self.mute) {
                    self.replies.push_back(byte);
                }
                i += 3;
                continue;
            }
            if rest[0] == 0x1D && (rest.len() < 3 || rest[1..3] == [0x28, 0x48]) {
                if rest.len() < 5 {
                    break;
                }
                let k = usize::from(rest[3]) | usize::from(rest[4]) << 8;
                if rest.len() < 5 + k {
                    break;
                }
                let params = &rest[5..5 + k];
                // Print data before the command is part of the job it confirms.
                p.job.append(&mut data);
                if p.process_ids && k == 6 && params[0] == 0x30 && params[1] == 0x30 {
                    self.job_data_done(p);
                    p.finish_job();
                    if !self.mute && !matches!(p.fault, Fault::Silent) {
                        self.replies.extend([0x37, 0x22, params[2], params[3], params[4], params[5], 0x00]);
                    }
                }
                i += 5 + k;
                continue;
            }
            data.push(rest[0]);
            i += 1;
        }
        self.pending = b[i..].to_vec();
        if !data.is_empty() {
            p.job.append(&mut data);
            self.job_data_done(p);
        }
    }

    /// Print data arrived: what the fault makes of it.
    fn job_data_done(&mut self, p: &mut EscPos) {
        if p.job.is_empty() {
            return;
        }
        p.received = true;
        match p.fault {
            Fault::AnswerLost => self.mute = true,
            Fault::Kill { paper } => {
                if !paper {
                    // The bytes never left the dying process.
                    p.job.clear();
                }
                p.finish_job();
                self.mute = true;
                self.shared.crash.notify_one();
            }
            _ => {}
        }
    }

    fn dead(&self) -> bool {
        self.shared.lock()[self.printer].power != self.power
    }
}

impl AsyncWrite for Connection {
    fn poll_write(mut self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.dead() {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        self.take(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for Connection {
    /// What the printer sent, or (for a connection of an earlier power-on) the end of the
    /// stream. A printer with nothing to say leaves the read waiting: only the driver's
    /// timeout ends it, and every reply is made while the agent's write is taken, so no
    /// wake-up is ever owed.
    fn poll_read(mut self: Pin<&mut Self>, _: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.dead() {
            return Poll::Ready(Ok(()));
        }
        if self.replies.is_empty() {
            return Poll::Pending;
        }
        while buf.remaining() > 0 {
            let Some(b) = self.replies.pop_front() else { break };
            buf.put_slice(&[b]);
        }
        Poll::Ready(Ok(()))
    }
}

impl World {
    /// A store agent's worker takes the next delivery it holds: the agent's own
    /// `handle_delivery`, with its journal, on the simulated printer meeting `print`.
    pub(super) fn handle(&mut self, agent: usize, print: AgentPrint) -> Result<(), Fail> {
        let Some(d) = self.agents[agent].inbox.pop_front() else { return Ok(()) };
        let done = handle(&self.agent_rt, &mut self.agents[agent].process, &self.printers, &d, print)?;
        for copy in &done.paper {
            self.paper(&d.task_id, copy);
        }
        // The job reached the printer and what became of it never got back: it may be on
        // paper, and the broker may rightly say so.
        if done.sent && matches!(print, AgentPrint::LostAfterPaper | AgentPrint::Crash { .. }) {
            self.facts.exposed.insert(d.task_id.clone());
        }
        // Answered in doubt without sending anything: the journal holds the key from an
        // earlier print that may have come out (a LAN ticket printed offline and not yet
        // merged into this task, or an attempt a crash cut short).
        if !done.sent && done.ack.as_ref().is_some_and(|a| a.outcome == Outcome::InDoubt) {
            self.facts.exposed.insert(d.task_id.clone());
        }
        match done.ack {
            Some(ack) => self.agents[agent].outbox.push(ack),
            None => {
                self.facts.exposed.insert(d.task_id.clone());
                self.restart_agent(agent)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connect(printers: &Printers, i: usize) -> Connection {
        Connection {
            shared: printers.0.clone(),
            printer: i,
            power: printers.0.lock()[i].power,
            pending: Vec::new(),
            replies: VecDeque::new(),
            mute: false,
        }
    }

    const STATUS: [u8; 9] = [0x10, 0x04, 1, 0x10, 0x04, 2, 0x10, 0x04, 4];
    const GS_H: [u8; 11] = [0x1D, 0x28, 0x48, 0x06, 0x00, 0x30, 0x30, b'a', b'b', b'c', b'd'];

    #[test]
    fn a_ready_printer_answers_its_status_and_confirms_a_job_once_it_printed() {
        let printers = Printers::new().expect("the printers");
        let mut c = connect(&printers, 0);
        c.take(&STATUS);
        assert_eq!(c.replies.drain(..).collect::<Vec<_>>(), [0x12, 0x12, 0x12]);
        // The job and its `GS ( H` may arrive in pieces.
        c.take(b"ticket\n\x1d(H");
        assert!(c.replies.is_empty());
        c.take(&GS_H[3..]);
        assert_eq!(c.replies.drain(..).collect::<Vec<_>>(), [0x37, 0x22, b'a', b'b', b'c', b'd', 0x00]);
        assert_eq!(printers.settle(0), (vec![b"ticket\n".to_vec()], true));
    }

    #[test]
    fn each_stop_shows_in_the_status_bytes_the_reference_gives_it() {
        let printers = Printers::new().expect("the printers");
        for (print, expected) in [
            (AgentPrint::Blocked(Outcome::NoPaper), [0x1A, 0x32, 0x7E]),
            (AgentPrint::Blocked(Outcome::CoverOpen), [0x1A, 0x16, 0x12]),
            (AgentPrint::Blocked(Outcome::PaperJam), [0x1A, 0x52, 0x12]),
        ] {
            printers.prepare(0, print);
            let mut c = connect(&printers, 0);
            c.take(&STATUS);
            let got: Vec<u8> = c.replies.drain(..).collect();
            assert_eq!(got, expected, "{print:?}");
            let mut status = onceprint_escpos::status::PrinterStatus::default();
            for (n, b) in [1, 2, 4].into_iter().zip(got) {
                assert!(status.apply(n, b));
            }
            assert!(status.blocker().is_some(), "{print:?}");
            printers.settle(0);
        }
    }

    #[test]
    fn a_printer_without_gs_h_prints_the_job_and_skips_the_command() {
        let printers = Printers::new().expect("the printers");
        let mut c = connect(&printers, 1);
        c.take(b"ticket\n");
        c.take(&GS_H);
        c.take(&STATUS);
        assert_eq!(c.replies.drain(..).collect::<Vec<_>>(), [0x12, 0x12, 0x12]);
        assert_eq!(printers.settle(1), (vec![b"ticket\n".to_vec()], true));
    }

    #[test]
    fn a_kill_as_the_printer_takes_the_job_leaves_no_answer_and_paper_only_when_drawn() {
        for paper in [true, false] {
            let printers = Printers::new().expect("the printers");
            printers.prepare(0, AgentPrint::Crash { paper });
            let mut c = connect(&printers, 0);
            c.take(&STATUS);
            c.replies.clear();
            let mut job = b"ticket\n".to_vec();
            job.extend_from_slice(&GS_H);
            c.take(&job);
            assert!(c.replies.is_empty());
            let (out, sent) = printers.settle(0);
            assert!(sent);
            assert_eq!(out.len(), usize::from(paper));
        }
    }

    #[test]
    fn a_switched_off_printer_refuses_connections_and_ends_the_ones_it_had() {
        let printers = Printers::new().expect("the printers");
        let c = connect(&printers, 0);
        printers.prepare(0, AgentPrint::Blocked(Outcome::Offline));
        assert!(c.dead());
        let address: PrinterAddress = PRINTERS[0].1.parse().expect("an address");
        assert!(printers.open(&address).is_err());
        printers.settle(0);
        assert!(printers.open(&address).is_ok(), "on again for the next delivery");
    }
}
