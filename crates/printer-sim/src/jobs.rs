//! What came out of the printers: the in-memory record and the paper log file.
//!
//! Every printed job is written to the paper log (one JSON line, `write_all` + `flush`)
//! and appended to the in-memory list under one lock, so lines from different printers
//! and connections never interleave, and the file and [`Jobs::all`] list jobs in the same
//! order. A job counts as printed only once its line is written: the printer task waits
//! for the write before it answers a `GS ( H` that follows the job.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::SimError;

/// How a job ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Cut {
    Partial,
    Full,
    /// The connection ended after printable content without a cut: the printer printed
    /// it, but it is still hanging out of the printer.
    #[serde(rename = "none")]
    Uncut,
}

/// A barcode as printed: the `GS k` symbology number and its data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Barcode {
    pub kind: u8,
    pub data: String,
}

/// One job as it came out of a printer; also one line of the paper log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrintedJob {
    /// The printer: its listening address, or `cloudprnt:MAC` / `epson_sdp:ID` for a
    /// printer that polls a broker.
    pub printer: String,
    /// 1 for the printer's first job since start-up, then counting up.
    pub seq: u64,
    /// When it was printed, RFC 3339 UTC.
    pub at: String,
    /// The printed text, decoded (GB18030 in double-byte mode, else PC437).
    pub text: String,
    /// ESC/POS bytes of the job as received, without real-time status requests and
    /// `GS ( H` requests (they are not part of what is printed).
    pub bytes: usize,
    /// Data of each QR code (lossy UTF-8).
    pub qr: Vec<String>,
    pub barcodes: Vec<Barcode>,
    /// Raster images (`GS v 0`).
    pub images: usize,
    pub cut: Cut,
    /// MQTT devices: the device id or MAC (`printer` is then the MQTT server's address).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// MQTT devices: the job token (CloudPRNT) or idempotency key (onceprint devices)
    /// the job came with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// Printers that poll: when each poll since the printer's previous job was sent, in
    /// microseconds since the Unix epoch (at most the last 32), the last being the poll
    /// that announced this job. A benchmark takes from it how long a ticket waited for the
    /// printer to ask, which is the printer's own time, not the server's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub polls_us: Vec<i64>,
    /// MQTT devices: when the printer began this job (it had arrived and was read), in
    /// microseconds since the Unix epoch; what came after is the printer's own time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_us: Option<i64>,
}

struct Inner {
    list: Mutex<Vec<PrintedJob>>,
    count: watch::Sender<usize>,
}

/// The jobs printed so far, by all printers. Cheap to clone.
#[derive(Clone)]
pub struct Jobs {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Jobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jobs").field("count", &self.count()).finish()
    }
}

impl Jobs {
    fn new() -> Jobs {
        Jobs { inner: Arc::new(Inner { list: Mutex::new(Vec::new()), count: watch::Sender::new(0) }) }
    }

    /// How many jobs were printed.
    pub fn count(&self) -> usize {
        *self.inner.count.borrow()
    }

    /// Every printed job, in printing order. The simulator keeps them all in memory (a
    /// few hundred bytes each), which is fine for tests, demos and benchmark runs.
    pub fn all(&self) -> Vec<PrintedJob> {
        self.inner.list.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The jobs of one printer (by its name: a listening address, for instance), in
    /// printing order.
    pub fn of(&self, printer: impl std::fmt::Display) -> Vec<PrintedJob> {
        let name = printer.to_string();
        let list = self.inner.list.lock().unwrap_or_else(PoisonError::into_inner);
        list.iter().filter(|j| j.printer == name).cloned().collect()
    }

    /// Waits until at least `n` jobs were printed; `false` if `timeout` passed first.
    pub async fn wait_for(&self, n: usize, timeout: Duration) -> bool {
        let mut rx = self.inner.count.subscribe();
        // The sender lives in `self`, so `wait_for` cannot fail with a closed channel.
        tokio::time::timeout(timeout, rx.wait_for(|&c| c >= n)).await.is_ok_and(|r| r.is_ok())
    }

    fn push(&self, job: PrintedJob) {
        let mut list = self.inner.list.lock().unwrap_or_else(PoisonError::into_inner);
        list.push(job);
        let len = list.len();
        drop(list);
        self.inner.count.send_replace(len);
    }
}

/// Writes printed jobs to the paper log and the in-memory list.
pub(crate) struct Recorder {
    // A plain file under a plain mutex: an append of one short line to the page cache
    // takes microseconds, while `tokio::fs` hands every write and flush to the blocking
    // pool, which made the paper log the simulator's bottleneck under load.
    log: std::sync::Mutex<Option<std::fs::File>>,
    jobs: Jobs,
}

impl Recorder {
    pub(crate) async fn open(path: Option<&Path>) -> Result<Recorder, SimError> {
        let file = match path {
            Some(path) => Some(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(|source| SimError::PaperLog { path: path.to_path_buf(), source })?,
            ),
            None => None,
        };
        Ok(Recorder { log: std::sync::Mutex::new(file), jobs: Jobs::new() })
    }

    pub(crate) fn jobs(&self) -> Jobs {
        self.jobs.clone()
    }

    /// Records one printed job. On an error the job is not in the list either, and the
    /// caller must not acknowledge it.
    pub(crate) async fn record(&self, job: PrintedJob) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(&job).map_err(std::io::Error::other)?;
        line.push(b'\n');
        use std::io::Write as _;
        let mut log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(file) = log.as_mut() {
            // One write of the whole line: appends never interleave.
            file.write_all(&line)?;
        }
        // Pushed while the log lock is held, so the list has the file's order.
        self.jobs.push(job);
        Ok(())
    }
}
