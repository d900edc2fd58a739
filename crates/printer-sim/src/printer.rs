//! One simulated printer: an accept loop (or a pseudo-terminal, see [`run_pty`]), a task
//! per connection, and one printing task.
//!
//! A connection task reads the socket (or the pty), parses it with the ESC/POS parser and
//! answers `DLE EOT n` itself, at once, from the current faults — real printers answer
//! real-time status even while a job prints or paper is out. Every other event goes, in order, into
//! the printer's queue. The printing task takes events from the queue one by one and
//! stops taking them while a fault blocks printing; the queue is then the printer's
//! receive buffer, and it survives the connection that filled it: a job sent to a printer
//! without paper prints when paper goes in, even if the sender hung up long ago. That is
//! the field behaviour onceprint must survive, so the simulator reproduces it.
//!
//! Because the printing task handles events in arrival order, a `GS ( H` reply is sent
//! only after every job before it was printed and its paper-log line written.
//!
//! A TCP connection and a pseudo-terminal are served by the same code ([`serve_stream`]):
//! only what a crash looks like differs (a reset connection, a device that vanishes).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use onceprint_escpos::ack;
use onceprint_escpos::parse::{Event, Parser};
use onceprint_escpos::text::decode_text;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use crate::faults::FaultsHandle;
use crate::jobs::{Barcode, Cut, PrintedJob, Recorder};

/// What one printer needs to know about the simulator.
pub(crate) struct PrinterCtx {
    pub(crate) index: usize,
    /// The printer's name in the paper log and in `GET /faults`.
    pub(crate) name: String,
    pub(crate) faults: FaultsHandle,
    pub(crate) recorder: Arc<Recorder>,
}

/// From connection tasks to the printing task.
enum Work {
    /// A connection opened; its replies go to `reply`.
    Open {
        conn: u64,
        reply: mpsc::UnboundedSender<Reply>,
    },
    Event {
        conn: u64,
        event: Event,
        len: usize,
    },
    /// The connection's input ended (the peer closed or the socket failed).
    End {
        conn: u64,
    },
}

/// From the printing task to a connection task.
enum Reply {
    Bytes(Vec<u8>),
    /// Drop the connection now, as a printer that reboots mid-job.
    Crash,
    /// Everything the connection sent was processed after its input ended.
    Done,
}

/// Resolves when the simulator stops (or its stop sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|&s| s).await;
}

/// Runs one printer until the simulator stops.
pub(crate) async fn run(listener: TcpListener, ctx: Arc<PrinterCtx>, mut stop: watch::Receiver<bool>) {
    let (work_tx, work_rx) = mpsc::unbounded_channel();
    let printing = tokio::spawn(printing(ctx.clone(), work_rx, stop.clone()));
    let mut conns = JoinSet::new();
    let mut next_conn = 0u64;
    loop {
        tokio::select! {
            _ = stopped(&mut stop) => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    if ctx.faults.current(ctx.index).offline {
                        // An offline printer refuses: the connection is reset at once, so the
                        // peer's first read or write fails, as when nothing listens.
                        let _ = stream.set_zero_linger();
                        drop(stream);
                        tracing::debug!(printer = %ctx.name, %peer, "offline: connection reset");
                        continue;
                    }
                    next_conn += 1;
                    tracing::debug!(printer = %ctx.name, %peer, conn = next_conn, "connection");
                    conns.spawn(connection(stream, next_conn, ctx.clone(), work_tx.clone(), stop.clone()));
                }
                Err(e) => {
                    // Usually out of file descriptors; accepting again at once would spin.
                    tracing::warn!(printer = %ctx.name, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    drop(listener);
    drop(work_tx);
    while conns.join_next().await.is_some() {}
    let _ = printing.await;
}

/// Serves one TCP connection; a crash resets it.
async fn connection(
    mut stream: TcpStream,
    conn: u64,
    ctx: Arc<PrinterCtx>,
    work: mpsc::UnboundedSender<Work>,
    mut stop: watch::Receiver<bool>,
) {
    let end = {
        let (rd, wr) = stream.split();
        serve_stream(rd, wr, conn, &ctx, &work, &mut stop).await
    };
    let crashed = end == StreamEnd::Crashed;
    if crashed {
        // A reset rather than a clean close: the peer sees the connection lost, the way a
        // printer that reboots or loses power looks from the network.
        let _ = stream.set_zero_linger();
    }
    tracing::debug!(printer = %ctx.name, conn, crashed, "connection closed");
}

/// Why [`serve_stream`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StreamEnd {
    /// The simulator stops.
    Stopped,
    /// The printer crashed (the `crash_mid_job` fault, or a paper log it cannot write).
    Crashed,
    /// The peer went away, or reading or writing failed.
    Closed,
}

/// Reads one stream (a TCP connection, a pseudo-terminal). Real-time status is answered
/// here; everything else is queued for the printing task, whose replies are written back
/// here.
async fn serve_stream<R, W>(
    mut rd: R,
    mut wr: W,
    conn: u64,
    ctx: &PrinterCtx,
    work: &mpsc::UnboundedSender<Work>,
    stop: &mut watch::Receiver<bool>,
) -> StreamEnd
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let (reply_tx, mut reply_rx) = mpsc::unbounded_channel();
    if work.send(Work::Open { conn, reply: reply_tx }).is_err() {
        return StreamEnd::Stopped;
    }
    let mut parser = Parser::new();
    let mut buf = vec![0u8; 16 * 1024];
    let mut input_open = true;
    let end = loop {
        tokio::select! {
            _ = stopped(stop) => break StreamEnd::Stopped,
            read = rd.read(&mut buf), if input_open => match read {
                Ok(0) => {
                    // The peer may have only shut down its sending side and still wait
                    // for replies, so the connection stays open until `Done`.
                    input_open = false;
                    let _ = work.send(Work::End { conn });
                }
                Ok(n) => {
                    let mut status = Vec::new();
                    for (event, len) in parser.push_sized(&buf[..n]) {
                        match event {
                            Event::StatusRequest(k @ 1..=4) => {
                                status.push(ctx.faults.current(ctx.index).status().encode(k));
                            }
                            // Printers do not answer status functions they do not have.
                            Event::StatusRequest(_) => {}
                            event => {
                                let _ = work.send(Work::Event { conn, event, len });
                            }
                        }
                    }
                    if !status.is_empty() && wr.write_all(&status).await.is_err() {
                        break StreamEnd::Closed;
                    }
                }
                Err(_) => break StreamEnd::Closed,
            },
            reply = reply_rx.recv() => match reply {
                Some(Reply::Bytes(bytes)) => {
                    if wr.write_all(&bytes).await.is_err() {
                        break StreamEnd::Closed;
                    }
                }
                Some(Reply::Crash) => break StreamEnd::Crashed,
                Some(Reply::Done) | None => break StreamEnd::Closed,
            },
        }
    };
    if input_open {
        let _ = work.send(Work::End { conn });
    }
    end
}

/// Runs one pseudo-terminal printer until the simulator stops. The pty is the printer's
/// one "connection" for as long as it lives (whoever opens the slave side talks to the
/// same printer, like a device on a USB or serial port); a crash makes the device vanish,
/// as when a USB printer reboots, and after [`REBOOT`] the printer comes back as a new
/// pty, whose path is published on `path`.
#[cfg(unix)]
pub(crate) async fn run_pty(
    first: crate::pty::Pty,
    ctx: Arc<PrinterCtx>,
    path: watch::Sender<Option<std::path::PathBuf>>,
    mut stop: watch::Receiver<bool>,
) {
    let (work_tx, work_rx) = mpsc::unbounded_channel();
    let printing = tokio::spawn(printing(ctx.clone(), work_rx, stop.clone()));
    let mut pty = Some(first);
    let mut conn = 0u64;
    loop {
        let current = match pty.take() {
            Some(p) => p,
            None => match crate::pty::Pty::open() {
                Ok(p) => p,
                Err(e) => {
                    tracing::error!(printer = %ctx.name, error = %e, "cannot create a pseudo-terminal; trying again");
                    tokio::select! {
                        _ = stopped(&mut stop) => break,
                        _ = tokio::time::sleep(REBOOT) => continue,
                    }
                }
            },
        };
        conn += 1;
        tracing::info!(printer = %ctx.name, path = %current.path().display(), "pseudo-terminal printer ready");
        // Published only when it changed: the first pty's path is there from the start.
        path.send_if_modified(|published| {
            let now = Some(current.path().to_owned());
            let changed = *published != now;
            *published = now;
            changed
        });
        let end = serve_stream(&current, &current, conn, &ctx, &work_tx, &mut stop).await;
        path.send_replace(None);
        // Closing the master side is the device vanishing: whoever holds the slave open
        // gets an I/O error or end of file from then on, and the path goes away.
        drop(current);
        tracing::info!(printer = %ctx.name, ?end, "pseudo-terminal printer gone");
        if end == StreamEnd::Stopped {
            break;
        }
        tokio::select! {
            _ = stopped(&mut stop) => break,
            _ = tokio::time::sleep(REBOOT) => {}
        }
    }
    drop(work_tx);
    let _ = printing.await;
}

/// How long a pseudo-terminal printer stays away after a crash before it comes back.
#[cfg(unix)]
const REBOOT: Duration = Duration::from_millis(200);

/// The job being received on one connection.
#[derive(Default)]
struct JobBuilder {
    text: String,
    bytes: usize,
    qr: Vec<String>,
    barcodes: Vec<Barcode>,
    images: usize,
}

impl JobBuilder {
    fn has_content(&self) -> bool {
        !self.text.is_empty() || !self.qr.is_empty() || !self.barcodes.is_empty() || self.images > 0
    }

    fn finish(self, printer: &str, seq: u64, cut: Cut) -> PrintedJob {
        PrintedJob {
            printer: printer.to_owned(),
            seq,
            at: now_rfc3339(),
            text: self.text,
            bytes: self.bytes,
            qr: self.qr,
            barcodes: self.barcodes,
            images: self.images,
            cut,
            device: None,
            job: None,
            polls_us: Vec::new(),
            started_us: None,
        }
    }
}

pub(crate) fn now_rfc3339() -> String {
    // Formatting a current UTC time as RFC 3339 cannot fail (the year is in range); the
    // fallback only keeps this free of panics.
    time::OffsetDateTime::now_utc().format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
}

struct ConnState {
    reply: mpsc::UnboundedSender<Reply>,
    job: JobBuilder,
    double_byte: bool,
    /// After a crash the rest of the connection's input is lost with it.
    crashed: bool,
}

/// The printing mechanism: takes queued events in order while nothing blocks printing.
async fn printing(ctx: Arc<PrinterCtx>, mut work_rx: mpsc::UnboundedReceiver<Work>, mut stop: watch::Receiver<bool>) {
    let Some(mut faults_rx) = ctx.faults.subscribe(ctx.index) else { return };
    let mut conns: HashMap<u64, ConnState> = HashMap::new();
    let mut seq = 0u64;
    loop {
        // While blocked, received work stays in the queue: that is the receive buffer.
        loop {
            if !faults_rx.borrow_and_update().blocks_printing() {
                break;
            }
            tokio::select! {
                _ = stopped(&mut stop) => return,
                changed = faults_rx.changed() => if changed.is_err() { return },
            }
        }
        let work = tokio::select! {
            _ = stopped(&mut stop) => return,
            work = work_rx.recv() => match work {
                Some(work) => work,
                None => return,
            },
        };
        match work {
            Work::Open { conn, reply } => {
                conns.insert(conn, ConnState { reply, job: JobBuilder::default(), double_byte: false, crashed: false });
            }
            Work::End { conn } => {
                let Some(state) = conns.remove(&conn) else { continue };
                if !state.crashed && state.job.has_content() {
                    seq += 1;
                    let job = state.job.finish(&ctx.name, seq, Cut::Uncut);
                    if let Err(e) = ctx.recorder.record(job).await {
                        tracing::error!(printer = %ctx.name, error = %e, "cannot write the paper log");
                    }
                }
                let _ = state.reply.send(Reply::Done);
            }
            Work::Event { conn, event, len } => {
                let Some(state) = conns.get_mut(&conn) else { continue };
                if state.crashed {
                    continue;
                }
                match event {
                    Event::ProcessIdRequest(id) => {
                        if !ctx.faults.current(ctx.index).clone {
                            let _ = state.reply.send(Reply::Bytes(ack::reply(id).to_vec()));
                        }
                    }
                    Event::Cut { partial } => {
                        state.job.bytes += len;
                        let slow_ms = ctx.faults.current(ctx.index).slow_ms;
                        if slow_ms > 0 {
                            tokio::select! {
                                _ = stopped(&mut stop) => return,
                                _ = tokio::time::sleep(Duration::from_millis(slow_ms)) => {}
                            }
                        }
                        seq += 1;
                        let cut = if partial { Cut::Partial } else { Cut::Full };
                        let job = std::mem::take(&mut state.job).finish(&ctx.name, seq, cut);
                        if let Err(e) = ctx.recorder.record(job).await {
                            // The job has no line, so it must not be acknowledged either:
                            // the connection goes down as in a crash and the sender is left
                            // in doubt, which is the truth.
                            tracing::error!(printer = %ctx.name, error = %e, "cannot write the paper log");
                            state.crashed = true;
                            let _ = state.reply.send(Reply::Crash);
                            continue;
                        }
                        let mut crash = false;
                        ctx.faults.modify(ctx.index, |f| {
                            if f.crash_mid_job > 0 {
                                f.crash_mid_job -= 1;
                                crash = true;
                            }
                        });
                        if crash {
                            tracing::info!(printer = %ctx.name, seq, "crash after printing the job");
                            state.crashed = true;
                            let _ = state.reply.send(Reply::Crash);
                        }
                    }
                    Event::Init => {
                        state.double_byte = false;
                        state.job.bytes += len;
                    }
                    Event::DoubleByte(on) => {
                        state.double_byte = on;
                        state.job.bytes += len;
                    }
                    Event::Text(bytes) => {
                        state.job.text.push_str(&decode_text(&bytes, state.double_byte));
                        state.job.bytes += len;
                    }
                    Event::Qr { data } => {
                        state.job.qr.push(String::from_utf8_lossy(&data).into_owned());
                        state.job.bytes += len;
                    }
                    Event::Barcode { kind, data } => {
                        state.job.barcodes.push(Barcode { kind, data: String::from_utf8_lossy(&data).into_owned() });
                        state.job.bytes += len;
                    }
                    Event::Raster { .. } => {
                        state.job.images += 1;
                        state.job.bytes += len;
                    }
                    _ => state.job.bytes += len,
                }
            }
        }
    }
}
