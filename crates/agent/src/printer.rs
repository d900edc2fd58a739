//! Printing one job to an ESC/POS printer, with the journal writes that make it safe to
//! crash at any point.
//!
//! A printer is reached through a byte link (`ByteLink`): a raw TCP connection
//! (`tcp://`), a USB printer-class device or a serial port (`usb://`, `serial://`, see
//! [`crate::address`]), or, in the simulation only, an in-process stream a [`Connector`]
//! opens. Whatever carries the bytes, the sequence is this one: connect or
//! open (or reuse the printer's open link, see [`PrinterLink`]); ask `DLE EOT 1, 2, 4`
//! and refuse to send anything to a printer that reports a blocker; make `started`
//! durable; send the job followed by `GS ( H` with a process id unique to this attempt;
//! wait for the matching `37 22 id 00`. Only that reply proves the printer processed the
//! job, so only then is `printed` journaled. Every failure before `started` is a
//! recoverable outcome (nothing was sent); every failure after it is `in_doubt`, because
//! some or all of the job may be on paper and sending it again could print a second copy.
//!
//! A printer that does not answer the status requests within `status_timeout` is
//! reported `offline` and nothing is sent to it, whatever its link: the agent cannot know
//! whether it has paper or its cover is shut, and a job sent to a printer without paper
//! may come out much later, after the task was given up or printed elsewhere. Some USB
//! printers cannot answer at all (their interface has no way back); they are refused the
//! same way, on every attempt, rather than printed to blind.
//!
//! Printers that ignore `GS ( H` ("clones") are confirmed by a status check after sending
//! instead ([`Confirmation::StatusOnly`]). That is weaker: a real-time status answer says
//! the printer is online and has no blocker, not that this job came out of it, and a job
//! cut short by a power cut of the printer after the status answer is not noticed.

use crate::journal::{Journal, Record, RecordState};
use crate::protocol::Outcome;
use onceprint_escpos::{ack, status};
use status::PrinterStatus;
use std::io;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout, Instant};

/// The detail of a printed ack for a printer confirmed by status only.
pub const STATUS_ONLY_DETAIL: &str = "confirmed by status only (printer does not support GS ( H)";

/// The real-time status requests asked before (and, for clones, after) a job.
const STATUS_REQUESTS: [u8; 3] = [1, 2, 4];

pub use crate::address::{FlowControl, PrinterAddress};

/// Timeouts of one print.
#[derive(Debug, Clone, Copy)]
pub struct DriverConfig {
    /// TCP connect (including name resolution), or opening a device.
    pub connect_timeout: Duration,
    /// The answer to one `DLE EOT n`.
    pub status_timeout: Duration,
    /// Sending the job and receiving the `GS ( H` reply (or the status after a job).
    pub print_timeout: Duration,
}

impl Default for DriverConfig {
    fn default() -> Self {
        DriverConfig {
            connect_timeout: Duration::from_secs(3),
            status_timeout: Duration::from_secs(3),
            print_timeout: Duration::from_secs(15),
        }
    }
}

/// How the end of a job is confirmed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confirmation {
    /// `GS ( H` process id reply: the printer's own statement that it processed the job.
    ProcessId,
    /// A real-time status check after sending, for printers that ignore `GS ( H`. Weaker;
    /// see the module doc.
    StatusOnly,
}

/// One attempt to print.
#[derive(Debug, Clone, Copy)]
pub struct Job<'a> {
    pub task_id: &'a str,
    pub attempt: u32,
    /// The delivery's idempotency key, journaled with every record of the job (may be
    /// empty).
    pub key: &'a str,
    pub data: &'a [u8],
    /// Must differ from the ids of other recent jobs on the same printer.
    pub process_id: [u8; 4],
}

/// What became of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    pub outcome: Outcome,
    pub detail: String,
}

impl Finished {
    fn new(outcome: Outcome, detail: impl Into<String>) -> Finished {
        Finished { outcome, detail: detail.into() }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("cannot connect to {address}: {source}")]
    Connect { address: String, source: io::Error },
    #[error("connecting to {address} timed out after {ms} ms")]
    ConnectTimeout { address: String, ms: u128 },
    #[error("cannot open {address}: {source}")]
    Open { address: String, source: io::Error },
    #[error("opening {address} timed out after {ms} ms")]
    OpenTimeout { address: String, ms: u128 },
    #[error("{0}")]
    Timeout(String),
    #[error("the printer closed the connection (or its device went away)")]
    Closed,
    #[error("connection to the printer failed: {0}")]
    Io(#[from] io::Error),
}

/// The byte link to one printer: whatever carries ESC/POS to it and its answers back.
/// The print sequence above is written once against this; only opening, reading and
/// writing differ.
enum ByteLink {
    Tcp(TcpStream),
    /// A USB printer-class device or a serial port.
    #[cfg(unix)]
    Device(crate::device::DeviceFile),
    /// An in-process byte stream a [`Connector`] opened (the simulation's printers).
    Stream(Box<dyn PrinterStream>),
}

impl ByteLink {
    /// Connects to, or opens, the printer at `address`.
    async fn open(address: &PrinterAddress, within: Duration) -> Result<ByteLink, DriverError> {
        match address {
            PrinterAddress::Tcp { host, port } => {
                let stream = match timeout(within, TcpStream::connect((host.as_str(), *port))).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(source)) => return Err(DriverError::Connect { address: address.to_string(), source }),
                    Err(_) => {
                        return Err(DriverError::ConnectTimeout {
                            address: address.to_string(),
                            ms: within.as_millis(),
                        })
                    }
                };
                // Status requests are three bytes; without this they could wait for Nagle.
                stream.set_nodelay(true)?;
                Ok(ByteLink::Tcp(stream))
            }
            #[cfg(unix)]
            PrinterAddress::Usb { .. } | PrinterAddress::Serial { .. } => {
                Ok(ByteLink::Device(crate::device::DeviceFile::open(address, within).await?))
            }
            #[cfg(not(unix))]
            PrinterAddress::Usb { .. } | PrinterAddress::Serial { .. } => Err(DriverError::Open {
                address: address.to_string(),
                source: io::Error::new(io::ErrorKind::Unsupported, "USB and serial printers need a Unix system"),
            }),
        }
    }

    async fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self {
            ByteLink::Tcp(s) => {
                s.write_all(bytes).await?;
                s.flush().await
            }
            #[cfg(unix)]
            ByteLink::Device(d) => d.write_all(bytes).await,
            ByteLink::Stream(s) => {
                s.write_all(bytes).await?;
                s.flush().await
            }
        }
    }

    /// Waits for bytes from the printer; `Ok(0)` when the link was closed or hung up.
    async fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            ByteLink::Tcp(s) => s.read(buf).await,
            #[cfg(unix)]
            ByteLink::Device(d) => d.read(buf).await,
            ByteLink::Stream(s) => s.read(buf).await,
        }
    }

    /// Takes bytes the printer already sent, without waiting (`WouldBlock` when none).
    fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            ByteLink::Tcp(s) => s.try_read(buf),
            #[cfg(unix)]
            ByteLink::Device(d) => d.try_read(buf),
            ByteLink::Stream(s) => {
                // One poll without a waker to call: what is there now, or `WouldBlock`.
                let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
                let mut read = tokio::io::ReadBuf::new(buf);
                match std::pin::Pin::new(s).poll_read(&mut cx, &mut read) {
                    std::task::Poll::Ready(Ok(())) => Ok(read.filled().len()),
                    std::task::Poll::Ready(Err(e)) => Err(e),
                    std::task::Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
                }
            }
        }
    }

    /// Ends the link politely; errors do not matter any more at this point.
    async fn close(self) {
        match self {
            ByteLink::Tcp(mut s) => {
                let _ = s.shutdown().await;
            }
            // A device has nothing to say goodbye with; dropping it closes it.
            #[cfg(unix)]
            ByteLink::Device(d) => drop(d),
            ByteLink::Stream(mut s) => {
                let _ = s.shutdown().await;
            }
        }
    }
}

/// A byte stream to a printer that is neither a socket nor a device: what a [`Connector`]
/// opens.
pub trait PrinterStream: AsyncRead + AsyncWrite + Send + Unpin {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin> PrinterStream for T {}

/// Opens byte streams to printers in place of TCP, USB and serial, for a [`PrinterLink`]
/// made with [`PrinterLink::with_connector`]. It exists so that the simulation drives the
/// real print sequence (status check, `started`, job, `GS ( H`, confirmation) against
/// printers simulated in the same process; the agent itself never sets one.
pub trait Connector: Send + Sync {
    /// A new stream to the printer at `address`, or why it cannot be reached (a printer
    /// switched off refuses the connection).
    fn open(&self, address: &PrinterAddress) -> io::Result<Box<dyn PrinterStream>>;
}

/// A link to a printer with the bytes it sent that were not consumed yet.
pub struct PrinterConnection {
    stream: ByteLink,
    buf: Vec<u8>,
    /// Reused for each write that joins several pieces (status requests, a job and its
    /// `GS ( H`), so that they leave in one segment without a fresh allocation per job.
    out: Vec<u8>,
}

impl PrinterConnection {
    /// Connects to (or opens) the printer at `address`.
    pub async fn connect(
        address: &PrinterAddress,
        connect_timeout: Duration,
    ) -> Result<PrinterConnection, DriverError> {
        let stream = ByteLink::open(address, connect_timeout).await?;
        Ok(PrinterConnection { stream, buf: Vec::new(), out: Vec::new() })
    }

    /// Asks `DLE EOT n` for each `n` in `requests` and decodes the answers. The requests go
    /// out together in one write (real-time commands are answered one byte each, in the
    /// order received), and each answer may take up to `each_timeout`. Bytes that are not
    /// status bytes (pushed status blocks, noise) are skipped, and so is every byte of a
    /// `GS ( H` reply (whose id bytes can look like status bytes).
    pub async fn status(&mut self, requests: &[u8], each_timeout: Duration) -> Result<PrinterStatus, DriverError> {
        let mut out = std::mem::take(&mut self.out);
        out.clear();
        for &n in requests {
            out.extend_from_slice(&status::request(n));
        }
        let written = self.stream.write_all(&out).await;
        self.out = out;
        written?;
        let mut st = PrinterStatus::default();
        for &n in requests {
            let byte = match timeout(each_timeout, self.next_status_byte()).await {
                Ok(r) => r?,
                Err(_) => {
                    return Err(DriverError::Timeout(format!(
                        "no answer to DLE EOT {n} within {} ms",
                        each_timeout.as_millis()
                    )))
                }
            };
            st.apply(n, byte);
        }
        Ok(st)
    }

    async fn next_status_byte(&mut self) -> Result<u8, DriverError> {
        loop {
            match scan_status(&self.buf) {
                Scan::Found(pos) => {
                    let b = self.buf[pos];
                    self.buf.drain(..=pos);
                    return Ok(b);
                }
                Scan::NeedMore(keep_from) => {
                    self.buf.drain(..keep_from);
                }
            }
            self.fill().await?;
        }
    }

    /// Throws away whatever the printer sent that nobody asked for yet (a late or repeated
    /// reply to an earlier job, pushed status), so that it cannot be read as an answer to
    /// the next request. Does not wait. `Err` when the printer has closed or reset the
    /// connection, which is then unusable.
    pub fn discard_unread(&mut self) -> Result<(), DriverError> {
        if !self.buf.is_empty() {
            tracing::debug!(bytes = self.buf.len(), "discarding unread bytes from the printer");
            self.buf.clear();
        }
        let mut chunk = [0u8; 512];
        loop {
            match self.stream.try_read(&mut chunk) {
                Ok(0) => return Err(DriverError::Closed),
                Ok(n) => tracing::debug!(bytes = n, "discarding unread bytes from the printer"),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(DriverError::Io(e)),
            }
        }
    }

    /// Sends bytes to the printer.
    pub async fn send(&mut self, bytes: &[u8]) -> Result<(), DriverError> {
        self.stream.write_all(bytes).await?;
        Ok(())
    }

    /// Sends a job followed by `GS ( H` with `id`, in one write when the job is small.
    pub async fn send_with_process_id(&mut self, data: &[u8], id: [u8; 4]) -> Result<(), DriverError> {
        let request = ack::request(id);
        if data.len() > 64 * 1024 {
            self.send(data).await?;
            return self.send(&request).await;
        }
        let mut out = std::mem::take(&mut self.out);
        out.clear();
        out.extend_from_slice(data);
        out.extend_from_slice(&request);
        let sent = self.send(&out).await;
        if out.capacity() > 64 * 1024 + 64 {
            // A rare big job need not stay in memory for the life of the connection.
            out = Vec::new();
        }
        self.out = out;
        sent
    }

    /// Waits for the `GS ( H` reply carrying `id`; replies with other ids (late answers to
    /// earlier jobs) and other bytes are skipped.
    pub async fn wait_for_process_id(&mut self, id: [u8; 4]) -> Result<(), DriverError> {
        loop {
            while let Some((got, used)) = ack::find_reply(&self.buf) {
                self.buf.drain(..used);
                if got == id {
                    return Ok(());
                }
                tracing::debug!(expected = ?id, got = ?got, "ignoring a process id reply for another job");
            }
            // No complete reply: only the last 6 bytes can still be the start of one.
            if self.buf.len() > 4096 {
                let keep = self.buf.len() - 6;
                self.buf.drain(..keep);
            }
            self.fill().await?;
        }
    }

    async fn fill(&mut self) -> Result<(), DriverError> {
        let mut chunk = [0u8; 512];
        let n = self.stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(DriverError::Closed);
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }

    /// Closes the link politely; errors do not matter any more at this point.
    pub async fn close(self) {
        self.stream.close().await;
    }
}

/// Where the next status byte is in bytes read from a printer.
#[derive(Debug, PartialEq, Eq)]
enum Scan {
    /// At this index.
    Found(usize),
    /// Not there yet; bytes before this index can be dropped (the rest may be the start
    /// of a `GS ( H` reply still arriving).
    NeedMore(usize),
}

/// Finds the first status byte that is not part of a `GS ( H` reply (`37 22 d1 d2 d3 d4
/// 00`, whose printable id bytes can have a status byte's fixed bits). A possible reply
/// cut off at the end of `buf` is kept until the rest arrives.
fn scan_status(buf: &[u8]) -> Scan {
    let mut i = 0;
    while i < buf.len() {
        if buf[i] == 0x37 {
            match reply_at(&buf[i..]) {
                ReplyAt::Complete => {
                    i += 7;
                    continue;
                }
                ReplyAt::Partial => return Scan::NeedMore(i),
                ReplyAt::No => {}
            }
        }
        if status::is_status_byte(buf[i]) {
            return Scan::Found(i);
        }
        i += 1;
    }
    Scan::NeedMore(buf.len())
}

enum ReplyAt {
    Complete,
    Partial,
    No,
}

/// Whether `b` starts with a `GS ( H` reply, or with what can still become one.
fn reply_at(b: &[u8]) -> ReplyAt {
    for (k, &byte) in b.iter().enumerate().take(7) {
        let fits = match k {
            0 => byte == 0x37,
            1 => byte == 0x22,
            2..=5 => (0x20..=0x7E).contains(&byte),
            _ => byte == 0x00,
        };
        if !fits {
            return ReplyAt::No;
        }
    }
    if b.len() >= 7 {
        ReplyAt::Complete
    } else {
        ReplyAt::Partial
    }
}

/// One printer's connection (for a USB or serial printer: its open device), kept open
/// across jobs by the printer's worker so that a job costs no TCP handshake and teardown
/// (and the printer no accept), or no device open and serial port set-up.
///
/// A connection is reused only while every exchange on it went as expected: any IO error,
/// timeout or doubt drops it, and the next job opens a new one. Before a reused
/// connection carries a new job's status request, whatever the printer sent unasked is
/// thrown away ([`PrinterConnection::discard_unread`]); a reply that still arrives late
/// cannot be taken for this job's, since status answers skip `GS ( H` replies and process
/// ids differ per attempt. A reused connection the printer has closed or reset in the
/// meantime (it rebooted, or it drops idle clients) is replaced by a new one at once:
/// only status requests had been sent on it for this job, so that is safe.
///
/// The printer's worker closes it after `--printer-idle-ms` without a job (see
/// [`PrinterLink::idle_deadline`]), so that a printer that serves one client at a time is
/// not held by an idle agent forever (a USB printer device can only be open in one
/// program at a time, a print spooler's for instance).
#[derive(Default)]
pub struct PrinterLink {
    conn: Option<(PrinterAddress, PrinterConnection)>,
    last_used: Option<Instant>,
    opened: u64,
    /// Opens the link's connections instead of TCP, USB or serial (see [`Connector`]).
    connector: Option<std::sync::Arc<dyn Connector>>,
}

impl PrinterLink {
    pub fn new() -> PrinterLink {
        PrinterLink::default()
    }

    /// A link whose connections `connector` opens, whatever the address says: how the
    /// simulation puts its printers behind the real print sequence.
    pub fn with_connector(connector: std::sync::Arc<dyn Connector>) -> PrinterLink {
        PrinterLink { connector: Some(connector), ..PrinterLink::default() }
    }

    /// A new connection to `address`, through the connector when the link has one. Takes
    /// no borrow of the link across the wait, so the worker's future stays `Send`.
    async fn connect(
        connector: Option<std::sync::Arc<dyn Connector>>,
        address: &PrinterAddress,
        within: Duration,
    ) -> Result<PrinterConnection, DriverError> {
        match connector {
            None => PrinterConnection::connect(address, within).await,
            Some(c) => {
                let stream =
                    c.open(address).map_err(|source| DriverError::Connect { address: address.to_string(), source })?;
                Ok(PrinterConnection { stream: ByteLink::Stream(stream), buf: Vec::new(), out: Vec::new() })
            }
        }
    }

    /// Whether a connection is open now.
    pub fn is_open(&self) -> bool {
        self.conn.is_some()
    }

    /// How many connections this link has opened so far.
    pub fn connections_opened(&self) -> u64 {
        self.opened
    }

    /// When an open connection becomes idle for `idle`; `None` when none is open.
    pub fn idle_deadline(&self, idle: Duration) -> Option<Instant> {
        match (&self.conn, self.last_used) {
            (Some(_), Some(t)) => Some(t + idle),
            (Some(_), None) => Some(Instant::now()),
            _ => None,
        }
    }

    /// Closes the connection politely, if one is open.
    pub async fn close(&mut self) {
        if let Some((_, conn)) = self.conn.take() {
            conn.close().await;
        }
    }

    /// Drops the connection without ceremony (after an error or doubt on it).
    fn discard(&mut self) {
        self.conn = None;
    }

    /// A connection to `address` whose status says the printer can take a job, or why not.
    /// Nothing of the job is sent here.
    async fn status(&mut self, address: &PrinterAddress, cfg: &DriverConfig) -> Result<PrinterStatus, String> {
        if self.conn.as_ref().is_some_and(|(a, _)| a != address) {
            // The printer moved: the old connection is of no use any more.
            self.close().await;
        }
        if let Some((_, conn)) = self.conn.as_mut() {
            let reused = match conn.discard_unread() {
                Ok(()) => conn.status(&STATUS_REQUESTS, cfg.status_timeout).await,
                Err(e) => Err(e),
            };
            match reused {
                Ok(st) => {
                    self.last_used = Some(Instant::now());
                    return Ok(st);
                }
                // No answer on a connection that still looks open: the printer is there
                // but silent; a new connection would most likely wait as long again.
                Err(e @ DriverError::Timeout(_)) => {
                    self.discard();
                    return Err(status_failed(address, e));
                }
                Err(e) => {
                    tracing::debug!(error = %e, "the kept printer connection is gone; opening a new one");
                    self.discard();
                }
            }
        }
        let mut conn = PrinterLink::connect(self.connector.clone(), address, cfg.connect_timeout)
            .await
            .map_err(|e| e.to_string())?;
        self.opened += 1;
        match conn.status(&STATUS_REQUESTS, cfg.status_timeout).await {
            Ok(st) => {
                self.conn = Some((address.clone(), conn));
                self.last_used = Some(Instant::now());
                Ok(st)
            }
            Err(e) => Err(status_failed(address, e)),
        }
    }
}

/// Why a printer cannot take a job when its status check failed; nothing was sent.
fn status_failed(address: &PrinterAddress, e: DriverError) -> String {
    match (&e, address.device_path()) {
        // A silent network printer is most likely busy or wedged; a silent device may be
        // one that cannot answer at all, which deserves saying, since it will never print.
        (DriverError::Timeout(_), Some(_)) => format!(
            "status check failed: {e}; a printer that does not answer DLE EOT is not printed to, since \
             its paper and cover cannot be checked (some USB printers cannot answer at all)"
        ),
        _ => format!("status check failed: {e}"),
    }
}

/// Prints `job` once on a connection of its own, which is closed afterwards. See
/// [`print_job_on`].
pub async fn print_job(
    journal: &Journal,
    address: &PrinterAddress,
    job: &Job<'_>,
    cfg: &DriverConfig,
    confirmation: Confirmation,
) -> Finished {
    let mut link = PrinterLink::new();
    let finished = print_job_on(&mut link, journal, address, job, cfg, confirmation).await;
    link.close().await;
    finished
}

/// Prints `job` once: status check, `started`, send, confirmation, `printed` or
/// `in_doubt`, using (and leaving open for the next job) the connection of `link`. The
/// caller has already checked the journal for this task id.
pub async fn print_job_on(
    link: &mut PrinterLink,
    journal: &Journal,
    address: &PrinterAddress,
    job: &Job<'_>,
    cfg: &DriverConfig,
    confirmation: Confirmation,
) -> Finished {
    // (1) Reach the printer and ask how it is. Nothing has been sent, so any failure here
    // is safe to retry later.
    match link.status(address, cfg).await {
        Ok(st) => {
            if let Some(b) = st.blocker() {
                // The connection is fine; the next job asks again.
                return Finished::new(
                    crate::protocol::outcome_of_blocker(b),
                    format!("printer status before sending: {}", b.outcome()),
                );
            }
        }
        Err(detail) => return Finished::new(Outcome::Offline, detail),
    }

    // `status` leaves a connection open whenever it answers `Ok`.
    let Some((_, conn)) = link.conn.as_mut() else {
        return Finished::new(Outcome::Offline, "no connection to the printer after the status check");
    };

    // (2) The point of no return is made durable before it is crossed.
    let started = Record::new(job.task_id, job.attempt, RecordState::Started, address.to_string()).keyed(job.key);
    if let Err(e) = journal.append(started).await {
        return Finished::new(Outcome::Error, format!("journal: {e}; nothing was sent"));
    }

    // (3) Send and confirm. From here on, any failure is in doubt.
    let result = match confirmation {
        Confirmation::ProcessId => send_with_process_id(conn, job, cfg).await,
        Confirmation::StatusOnly => send_with_status_check(conn, job, cfg).await,
    };
    let finished = match result {
        Ok(detail) => {
            link.last_used = Some(Instant::now());
            Finished::new(Outcome::Printed, detail)
        }
        Err(reason) => {
            // A reply may still be on its way, or the connection is broken: start afresh.
            link.discard();
            Finished::new(Outcome::InDoubt, format!("{reason}; not printed again, a person must check the paper"))
        }
    };

    // (4) Record the end. If this write fails the truth is still what the printer said, so
    // it is reported as it is; the journal keeps `started`, so a redelivery after a
    // restart is answered in doubt rather than printed again.
    let end = Record::new(job.task_id, job.attempt, RecordState::from(finished.outcome), finished.detail.clone())
        .keyed(job.key);
    if let Err(e) = journal.append(end).await {
        tracing::error!(task_id = job.task_id, error = %e, "could not journal the end of a print");
    }
    finished
}

async fn send_with_process_id(
    conn: &mut PrinterConnection,
    job: &Job<'_>,
    cfg: &DriverConfig,
) -> Result<String, String> {
    let id = job.process_id;
    let deadline = Instant::now() + cfg.print_timeout;
    let work = async {
        conn.send_with_process_id(job.data, id).await?;
        conn.wait_for_process_id(id).await
    };
    match tokio::time::timeout_at(deadline, work).await {
        Ok(Ok(())) => Ok("confirmed by the printer (GS ( H process id reply)".into()),
        Ok(Err(DriverError::Closed)) => {
            Err("the printer closed the connection (or its device went away) before confirming the job".into())
        }
        Ok(Err(e)) => Err(format!("{e} before the printer confirmed the job")),
        Err(_) => Err(format!(
            "no GS ( H reply within {} ms (if this printer does not support GS ( H, \
             run the agent with --no-printed-ack for it)",
            cfg.print_timeout.as_millis()
        )),
    }
}

async fn send_with_status_check(
    conn: &mut PrinterConnection,
    job: &Job<'_>,
    cfg: &DriverConfig,
) -> Result<String, String> {
    let deadline = Instant::now() + cfg.print_timeout;
    let work = async {
        conn.send(job.data).await?;
        conn.status(&STATUS_REQUESTS, cfg.status_timeout).await
    };
    match tokio::time::timeout_at(deadline, work).await {
        Ok(Ok(st)) => match st.blocker() {
            None => Ok(STATUS_ONLY_DETAIL.into()),
            // A printer that ran out of paper or was opened keeps the job in its buffer
            // and may print it later, so this is doubt, not a failure to retry.
            Some(b) => Err(format!("printer status after sending: {}", b.outcome())),
        },
        Ok(Err(DriverError::Closed)) => {
            Err("the printer closed the connection (or its device went away) after the job was sent".into())
        }
        Ok(Err(e)) => Err(format!("status check after sending failed: {e}")),
        Err(_) => Err(format!("no status answer within {} ms after sending", cfg.print_timeout.as_millis())),
    }
}

/// Picks `GS ( H` process ids for one printer: derived from the task id and attempt (so a
/// retry of a task gets a different id from its first attempt), and bumped past any id
/// used on this printer recently, so that a late reply can never be taken for another
/// job's.
#[derive(Debug, Default)]
pub struct ProcessIds {
    recent: std::collections::VecDeque<[u8; 4]>,
}

impl ProcessIds {
    const REMEMBER: usize = 256;

    pub fn next(&mut self, task_id: &str, attempt: u32) -> [u8; 4] {
        let mut n = fnv1a(task_id.as_bytes(), attempt);
        let mut id = ack::id_from(n);
        while self.recent.contains(&id) {
            n = n.wrapping_add(1);
            id = ack::id_from(n);
        }
        if self.recent.len() == Self::REMEMBER {
            self.recent.pop_front();
        }
        self.recent.push_back(id);
        id
    }
}

/// FNV-1a over the task id, a separator and the attempt: stable across builds and
/// platforms (unlike the standard library's hasher), which keeps ids reproducible in logs.
fn fnv1a(task_id: &[u8], attempt: u32) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in task_id.iter().chain(&[0u8]).chain(&attempt.to_le_bytes()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_answers_are_found_past_noise_and_process_id_replies() {
        // `::::` are printable id bytes that also have a status byte's fixed bits.
        let stale = ack::reply(*b"::::");
        assert!(stale[2..6].iter().all(|b| status::is_status_byte(*b)));
        let mut buf = stale.to_vec();
        buf.push(0x12);
        assert_eq!(scan_status(&buf), Scan::Found(7), "the whole reply is skipped");
        // Pushed status (ASB) and other noise without the fixed bits are skipped.
        assert_eq!(scan_status(&[0x10, 0x00, 0x00, 0x00, 0x16]), Scan::Found(4));
        // A reply still arriving is kept until it is complete...
        assert_eq!(scan_status(&[0x01, 0x37, 0x22, b':', b':']), Scan::NeedMore(1));
        assert_eq!(scan_status(&[0x37]), Scan::NeedMore(0));
        // ...but what cannot become one is not waited for.
        assert_eq!(scan_status(&[0x37, 0x12]), Scan::Found(1));
        assert_eq!(scan_status(&[0x37, 0x22, 0x12]), Scan::Found(2));
        assert_eq!(scan_status(&[0x37, 0x22, b':', b':', b':', b':', 0x12]), Scan::Found(2));
        assert_eq!(scan_status(&[0x01, 0x80]), Scan::NeedMore(2));
    }

    /// Opens one in-process stream per connection, or refuses when there is none left.
    struct Streams(std::sync::Mutex<Vec<tokio::io::DuplexStream>>);

    impl Connector for Streams {
        fn open(&self, _: &PrinterAddress) -> io::Result<Box<dyn PrinterStream>> {
            match self.0.lock().map(|mut v| v.pop()) {
                Ok(Some(s)) => Ok(Box::new(s)),
                _ => Err(io::ErrorKind::ConnectionRefused.into()),
            }
        }
    }

    #[tokio::test]
    async fn a_link_with_a_connector_prints_over_its_stream_and_journals_as_over_tcp() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let journal = Journal::open(dir.path(), 100).expect("a journal");
        let (agent_side, mut printer) = tokio::io::duplex(1024);
        // The printer: three status bytes of a ready printer, then the job and its
        // `GS ( H`, answered once the job is in.
        let printer = tokio::spawn(async move {
            let mut req = [0u8; 9];
            printer.read_exact(&mut req).await.expect("the status requests");
            assert_eq!(req, [0x10, 0x04, 1, 0x10, 0x04, 2, 0x10, 0x04, 4]);
            printer.write_all(&[0x12, 0x12, 0x12]).await.expect("the status answers");
            let mut job = vec![0u8; 4 + 11];
            printer.read_exact(&mut job).await.expect("the job");
            assert_eq!(&job[..4], b"hi\n\n");
            let id = [job[11], job[12], job[13], job[14]];
            printer.write_all(&ack::reply(id)).await.expect("the reply");
            printer
        });
        let connector = std::sync::Arc::new(Streams(std::sync::Mutex::new(vec![agent_side])));
        let mut link = PrinterLink::with_connector(connector);
        let address: PrinterAddress = "tcp://192.0.2.1:9100".parse().expect("an address");
        let job = Job { task_id: "T1", attempt: 1, key: "K#p1", data: b"hi\n\n", process_id: *b"abcd" };
        let cfg = DriverConfig::default();
        let done = print_job_on(&mut link, &journal, &address, &job, &cfg, Confirmation::ProcessId).await;
        assert_eq!(done.outcome, Outcome::Printed, "{}", done.detail);
        assert_eq!(journal.lookup("T1").map(|r| r.state), Some(RecordState::Printed));
        let _printer = printer.await.expect("the printer's task");
        // No stream is left: the next connection is refused, and nothing is started.
        link.discard();
        let again = Job { task_id: "T2", ..job };
        let done = print_job_on(&mut link, &journal, &address, &again, &cfg, Confirmation::ProcessId).await;
        assert_eq!(done.outcome, Outcome::Offline, "{}", done.detail);
        assert_eq!(journal.lookup("T2"), None);
    }

    #[test]
    fn process_ids_differ_between_attempts_tasks_and_recent_jobs() {
        let mut ids = ProcessIds::default();
        let a1 = ids.next("T1", 1);
        let a2 = ids.next("T1", 2);
        let b1 = ids.next("T2", 1);
        assert_ne!(a1, a2);
        assert_ne!(a1, b1);
        assert!(ack::is_valid_id(a1));
        // The same attempt again (a redelivery that reaches the printer) still gets a
        // fresh id, since the first one may still have a reply on its way.
        let a1_again = ids.next("T1", 1);
        assert_ne!(a1, a1_again);
        let mut seen = std::collections::HashSet::new();
        let mut many = ProcessIds::default();
        for i in 0..ProcessIds::REMEMBER {
            assert!(seen.insert(many.next("same", i as u32 % 3)));
        }
    }
}
