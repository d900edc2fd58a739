//! The paper log: what the simulated printers really printed. It is the ground truth of
//! `bench e2e` — a task counts as printed when a line of this file carries its marker,
//! never because the broker says so.
//!
//! `printer-sim` appends one JSON line per printed job (`{"printer","seq","at","text",…}`),
//! each written whole. [`PaperWatcher`] tails the file from a thread of its own while the
//! run goes on, so the bench sees printing progress as it happens (for the completion
//! wait and the agent-restart measurement) without re-reading the file.

use std::collections::HashMap;
use std::io::Read as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Deserialize;
use tokio::sync::watch;

/// Every bench task's text has a line `E2E <n>`; `n` is the task's number.
pub const MARKER_PREFIX: &str = "E2E ";

/// How often the watcher looks for new lines when there were none.
const TAIL_INTERVAL: Duration = Duration::from_millis(5);

/// The marker numbers in a printed job's text: every line that is exactly `E2E <n>`
/// (surrounding blanks aside). A job normally has one.
pub fn markers_in(text: &str) -> Vec<u32> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix(MARKER_PREFIX))
        .filter_map(|n| if n.bytes().all(|b| b.is_ascii_digit()) { n.parse().ok() } else { None })
        .collect()
}

/// An RFC 3339 time (`2026-11-29T10:11:12.123456Z`) as µs since the Unix epoch.
pub fn rfc3339_to_unix_us(s: &str) -> Option<i64> {
    let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()?;
    i64::try_from(t.unix_timestamp_nanos() / 1000).ok()
}

/// Now, as µs since the Unix epoch (the clock the simulator's `at` uses).
pub fn unix_now_us() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as i64).unwrap_or(0)
}

/// The fields of a paper-log line the bench uses; the rest is ignored.
#[derive(Deserialize)]
struct RawJob {
    printer: String,
    at: String,
    text: String,
    /// The job's name on the wire, where the printer has one (an MQTT job token).
    #[serde(default)]
    job: Option<String>,
    /// A polling printer's poll times since its previous job (µs since the epoch).
    #[serde(default)]
    polls_us: Vec<i64>,
    /// An MQTT device's start on the job (µs since the epoch).
    #[serde(default)]
    started_us: Option<i64>,
}

/// One printed job as the bench keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct PaperLine {
    pub printer: String,
    /// The job's `at` in µs since the epoch, or when the bench read the line if `at`
    /// could not be parsed.
    pub at_us: i64,
    pub at_parsed: bool,
    pub markers: Vec<u32>,
    /// The task id of a job without a readable marker whose job token names its task
    /// (`TASKID.ATTEMPT`: a picture a Star printer printed); resolved to its task's marker
    /// once the broker's task list is read ([`Tally::resolve_jobs`]).
    pub job_task: Option<String>,
    /// A polling printer's poll times since its previous job, the last the one that
    /// announced this job (µs since the epoch); empty for other printers.
    pub polls_us: Vec<i64>,
    /// When an MQTT device began the job (it had arrived), µs since the epoch.
    pub started_us: Option<i64>,
}

impl PaperLine {
    /// A line of `printer` at `at_us` carrying `markers`, with nothing else said (what the
    /// benches' own checks are tested with).
    pub fn marked(printer: &str, at_us: i64, markers: Vec<u32>) -> PaperLine {
        PaperLine {
            printer: printer.to_owned(),
            at_us,
            at_parsed: true,
            markers,
            job_task: None,
            polls_us: Vec::new(),
            started_us: None,
        }
    }
}

/// Parses one line of the paper log. `read_at_us` stands in for an unparsable `at`.
pub fn parse_line(line: &[u8], read_at_us: i64) -> Result<PaperLine, String> {
    let raw: RawJob = serde_json::from_slice(line)
        .map_err(|e| format!("{e}: {}", String::from_utf8_lossy(&line[..line.len().min(200)])))?;
    let at = rfc3339_to_unix_us(&raw.at);
    let markers = markers_in(&raw.text);
    let job_task = match (&raw.job, markers.is_empty()) {
        (Some(job), true) => job.rsplit_once('.').map(|(task, _)| task.to_owned()),
        _ => None,
    };
    Ok(PaperLine {
        markers,
        printer: raw.printer,
        at_us: at.unwrap_or(read_at_us),
        at_parsed: at.is_some(),
        job_task,
        polls_us: raw.polls_us,
        started_us: raw.started_us,
    })
}

/// Cuts appended bytes into complete lines, keeping an unfinished last line for the next
/// read (the simulator may be half-way through writing it).
#[derive(Debug, Default)]
pub struct LineSplitter {
    partial: Vec<u8>,
}

impl LineSplitter {
    /// Calls `f` with every line completed by `bytes` (without its `\n`); empty lines are
    /// skipped.
    pub fn push(&mut self, bytes: &[u8], mut f: impl FnMut(&[u8])) {
        let mut rest = bytes;
        while let Some(pos) = rest.iter().position(|&b| b == b'\n') {
            let (head, tail) = rest.split_at(pos);
            if self.partial.is_empty() {
                if !head.is_empty() {
                    f(head);
                }
            } else {
                self.partial.extend_from_slice(head);
                let line = std::mem::take(&mut self.partial);
                f(&line);
            }
            rest = &tail[1..];
        }
        self.partial.extend_from_slice(rest);
    }

    /// Bytes of an unfinished line.
    pub fn pending(&self) -> usize {
        self.partial.len()
    }
}

/// Per-marker counts over the paper log, for tasks numbered `0..tasks`.
#[derive(Debug, Clone)]
pub struct Tally {
    /// How many jobs carried each marker.
    pub counts: Vec<u32>,
    /// `at` (µs) of the first job carrying each marker; `i64::MIN` while none did.
    pub first_at_us: Vec<i64>,
    /// Markers printed at least once.
    pub distinct: usize,
    pub lines: usize,
    /// Jobs without any marker: printed paper no bench task explains.
    pub unmarked: usize,
    /// Markers outside `0..tasks`.
    pub foreign: usize,
    /// Lines that are not a paper-log job.
    pub malformed: usize,
    pub malformed_example: Option<String>,
    /// Lines whose `at` did not parse (their read time was used).
    pub bad_times: usize,
    /// Latest `at` of any job, µs.
    pub last_at_us: Option<i64>,
    /// Jobs per printer address.
    pub per_printer: HashMap<String, usize>,
    /// Jobs known only by the task their job token names (not yet counted by marker), per
    /// task id, with the first `at`.
    pub by_job_task: HashMap<String, (u32, i64)>,
    /// The poll times of the first job carrying each marker, where a polling printer
    /// printed it.
    pub first_polls_us: HashMap<u32, Vec<i64>>,
    /// When the printer began the first job carrying each marker, where it says so.
    pub first_started_us: HashMap<u32, i64>,
}

impl Tally {
    pub fn new(tasks: usize) -> Self {
        Self {
            counts: vec![0; tasks],
            first_at_us: vec![i64::MIN; tasks],
            distinct: 0,
            lines: 0,
            unmarked: 0,
            foreign: 0,
            malformed: 0,
            malformed_example: None,
            bad_times: 0,
            last_at_us: None,
            per_printer: HashMap::new(),
            by_job_task: HashMap::new(),
            first_polls_us: HashMap::new(),
            first_started_us: HashMap::new(),
        }
    }

    pub fn add(&mut self, line: &PaperLine) {
        self.lines += 1;
        if !line.at_parsed {
            self.bad_times += 1;
        }
        self.last_at_us = Some(self.last_at_us.map_or(line.at_us, |l| l.max(line.at_us)));
        *self.per_printer.entry(line.printer.clone()).or_default() += 1;
        if let Some(task) = &line.job_task {
            let e = self.by_job_task.entry(task.clone()).or_insert((0, line.at_us));
            e.0 += 1;
            return;
        }
        if line.markers.is_empty() {
            self.unmarked += 1;
        }
        self.count_markers(&line.markers, line.at_us, &line.polls_us, line.started_us);
    }

    fn count_markers(&mut self, markers: &[u32], at_us: i64, polls_us: &[i64], started_us: Option<i64>) {
        for &m in markers {
            let Some(count) = self.counts.get_mut(m as usize) else {
                self.foreign += 1;
                continue;
            };
            *count += 1;
            if *count == 1 {
                self.distinct += 1;
                self.first_at_us[m as usize] = at_us;
                if !polls_us.is_empty() {
                    self.first_polls_us.insert(m, polls_us.to_vec());
                }
                if let Some(started) = started_us {
                    self.first_started_us.insert(m, started);
                }
            }
        }
    }

    /// Counts the jobs known only by their task id under their task's marker, now that
    /// `marker_of_task` can say it (from the broker's task list); a task id it does not
    /// know is a job no task of the run explains.
    pub fn resolve_jobs(&mut self, marker_of_task: impl Fn(&str) -> Option<u32>) {
        for (task, (times, at_us)) in std::mem::take(&mut self.by_job_task) {
            match marker_of_task(&task) {
                Some(m) => {
                    for _ in 0..times {
                        self.count_markers(&[m], at_us, &[], None);
                    }
                }
                None => self.unmarked += times as usize,
            }
        }
    }

    pub fn add_malformed(&mut self, detail: String) {
        self.lines += 1;
        self.malformed += 1;
        self.malformed_example.get_or_insert(detail);
    }

    /// Markers printed more than once, with their counts, in marker order.
    pub fn duplicates(&self) -> Vec<(u32, u32)> {
        self.counts.iter().enumerate().filter(|(_, &c)| c > 1).map(|(m, &c)| (m as u32, c)).collect()
    }

    /// Extra sheets: prints beyond the first, over all markers.
    pub fn extra_prints(&self) -> usize {
        self.counts.iter().map(|&c| c.saturating_sub(1) as usize).sum()
    }

    /// Adds a finding for each kind of sheet no task of the run explains: jobs without a
    /// marker, markers of no task of the run, unreadable lines.
    pub fn report_strays(&self, problems: &mut Vec<String>) {
        if self.unmarked > 0 {
            problems.push(format!("{} jobs on paper carry no task marker", self.unmarked));
        }
        if self.foreign > 0 {
            problems.push(format!("{} markers on paper belong to no task of this run", self.foreign));
        }
        if self.malformed > 0 {
            problems.push(format!(
                "{} paper-log lines are unreadable, e.g. {}",
                self.malformed,
                self.malformed_example.as_deref().unwrap_or("")
            ));
        }
    }

    /// Markers never printed, in order.
    pub fn missing(&self) -> Vec<u32> {
        self.counts.iter().enumerate().filter(|(_, &c)| c == 0).map(|(m, _)| m as u32).collect()
    }
}

#[cfg(test)]
impl Tally {
    /// A tally of tasks `0..tasks` where each `(marker, times)` was printed that often,
    /// for the verdicts' tests.
    pub fn with_prints(prints: &[(u32, u32)], tasks: usize) -> Tally {
        let mut t = Tally::new(tasks);
        for &(m, times) in prints {
            for _ in 0..times {
                t.add(&PaperLine::marked("x", 1, vec![m]));
            }
        }
        t
    }
}

/// Printing progress, published on every batch of new lines.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    pub lines: usize,
    pub distinct: usize,
}

/// One job in reading order, as the restart measurement needs it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub at_us: i64,
    pub markers: Vec<u32>,
    pub read: Instant,
}

struct Shared {
    tally: Tally,
    seen: Vec<Seen>,
    error: Option<String>,
}

/// Tails the paper log from its own thread until [`PaperWatcher::finish`].
pub struct PaperWatcher {
    shared: Arc<Mutex<Shared>>,
    progress: watch::Receiver<Progress>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl PaperWatcher {
    /// Starts tailing `path` (which may not exist yet) for tasks numbered `0..tasks`.
    pub fn start(path: PathBuf, tasks: usize) -> std::io::Result<Self> {
        let shared = Arc::new(Mutex::new(Shared { tally: Tally::new(tasks), seen: Vec::new(), error: None }));
        let (tx, progress) = watch::channel(Progress::default());
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::Builder::new().name("paper-watcher".into()).spawn({
            let (shared, stop) = (shared.clone(), stop.clone());
            move || tail(path, shared, tx, stop)
        })?;
        Ok(Self { shared, progress, stop, thread: Some(thread) })
    }

    pub fn progress(&self) -> watch::Receiver<Progress> {
        self.progress.clone()
    }

    /// Runs `f` on the jobs read so far, in reading order.
    pub fn with_seen<T>(&self, f: impl FnOnce(&[Seen]) -> T) -> T {
        let shared = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        f(&shared.seen)
    }

    /// Whether marker `m` is on paper already.
    pub fn printed(&self, m: u32) -> bool {
        let shared = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        shared.tally.counts.get(m as usize).is_some_and(|&c| c > 0)
    }

    /// Reads the file one last time and returns the final tally, or the error that
    /// stopped the reading.
    pub fn finish(mut self) -> Result<Tally, String> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let mut shared = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        match shared.error.take() {
            Some(e) => Err(e),
            None => Ok(shared.tally.clone()),
        }
    }
}

impl Drop for PaperWatcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn tail(path: PathBuf, shared: Arc<Mutex<Shared>>, tx: watch::Sender<Progress>, stop: Arc<AtomicBool>) {
    let mut file: Option<std::fs::File> = None;
    let mut splitter = LineSplitter::default();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        // Read the stop flag before reading the file, so the last pass sees everything
        // written before `finish` was called.
        let last_pass = stop.load(Ordering::SeqCst);
        if file.is_none() {
            file = std::fs::File::open(&path).ok();
        }
        let mut grew = false;
        if let Some(f) = file.as_mut() {
            loop {
                // Reads go on from where the last one stopped, also after an end of file:
                // the simulator only appends.
                let n = match f.read(&mut buf) {
                    Ok(n) => n,
                    Err(e) => {
                        let mut s = shared.lock().unwrap_or_else(PoisonError::into_inner);
                        s.error = Some(format!("reading {}: {e}", path.display()));
                        return;
                    }
                };
                if n == 0 {
                    break;
                }
                grew = true;
                let read = Instant::now();
                let read_us = unix_now_us();
                let mut s = shared.lock().unwrap_or_else(PoisonError::into_inner);
                let Shared { tally, seen, .. } = &mut *s;
                splitter.push(&buf[..n], |line| match parse_line(line, read_us) {
                    Ok(job) => {
                        tally.add(&job);
                        seen.push(Seen { at_us: job.at_us, markers: job.markers, read });
                    }
                    Err(detail) => tally.add_malformed(detail),
                });
                let p = Progress { lines: tally.lines, distinct: tally.distinct };
                drop(s);
                tx.send_replace(p);
            }
        }
        if last_pass {
            if splitter.pending() > 0 {
                let mut s = shared.lock().unwrap_or_else(PoisonError::into_inner);
                s.tally.add_malformed(format!("{} bytes of an unfinished last line", splitter.pending()));
            }
            return;
        }
        if !grew {
            std::thread::sleep(TAIL_INTERVAL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(printer: &str, at: &str, text: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "printer": printer, "seq": 1, "at": at, "text": text, "bytes": 10,
            "qr": [], "barcodes": [], "images": 0, "cut": "partial"
        }))
        .unwrap()
    }

    #[test]
    fn markers_are_whole_lines() {
        assert_eq!(markers_in("E2E 12\n1 x Noodles  12.00\n"), vec![12]);
        assert_eq!(markers_in("  E2E 7  \n\n\n"), vec![7]);
        assert_eq!(markers_in("E2E 1\nE2E 2\n"), vec![1, 2]);
        assert!(markers_in("Order E2E 12\n").is_empty());
        assert!(markers_in("E2E 12x\nE2E -1\nE2E \n").is_empty());
        assert!(markers_in("").is_empty());
    }

    #[test]
    fn rfc3339_times_parse_to_microseconds() {
        assert_eq!(rfc3339_to_unix_us("1970-01-01T00:00:01Z"), Some(1_000_000));
        assert_eq!(rfc3339_to_unix_us("1970-01-01T00:00:01.5Z"), Some(1_500_000));
        assert_eq!(rfc3339_to_unix_us("2026-11-29T10:11:12.123456789Z"), Some(1_795_947_072_123_456));
        assert_eq!(rfc3339_to_unix_us("2026-11-29T11:11:12.123456+01:00"), Some(1_795_947_072_123_456));
        assert_eq!(rfc3339_to_unix_us("yesterday"), None);
    }

    #[test]
    fn a_paper_line_parses_with_a_fallback_time() {
        let l = parse_line(&job("127.0.0.1:9100", "1970-01-01T00:00:02Z", "E2E 3\nx\n"), 99).unwrap();
        assert_eq!((l.printer.as_str(), l.at_us, l.at_parsed, l.markers), ("127.0.0.1:9100", 2_000_000, true, vec![3]));
        let l = parse_line(&job("p", "not a time", "E2E 3\n"), 99).unwrap();
        assert_eq!((l.at_us, l.at_parsed), (99, false));
        assert!(parse_line(b"{\"printer\":1}", 0).is_err());
    }

    #[test]
    fn splitter_keeps_unfinished_lines_for_the_next_read() {
        let mut s = LineSplitter::default();
        let mut got: Vec<String> = Vec::new();
        let mut push = |s: &mut LineSplitter, b: &[u8]| s.push(b, |l| got.push(String::from_utf8_lossy(l).into()));
        push(&mut s, b"one\ntw");
        assert_eq!(s.pending(), 2);
        push(&mut s, b"o\n\nthr");
        push(&mut s, b"ee");
        push(&mut s, b"\n");
        assert_eq!(s.pending(), 0);
        assert_eq!(got, ["one", "two", "three"]);
    }

    fn line(markers: &[u32], at: i64) -> PaperLine {
        PaperLine::marked("p", at, markers.to_vec())
    }

    #[test]
    fn tally_finds_duplicates_missing_and_strays() {
        let mut t = Tally::new(5);
        t.add(&line(&[0], 10));
        t.add(&line(&[1], 20));
        t.add(&line(&[1], 30)); // a second sheet for task 1
        t.add(&line(&[3], 5));
        t.add(&line(&[], 40)); // paper nobody asked for
        t.add(&line(&[9], 50)); // a marker of no task of this run
        t.add(&line(&[3], 60));
        t.add(&line(&[3], 70));
        t.add_malformed("garbage".into());
        assert_eq!(t.duplicates(), vec![(1, 2), (3, 3)]);
        assert_eq!(t.extra_prints(), 3);
        assert_eq!(t.missing(), vec![2, 4]);
        assert_eq!(t.distinct, 3);
        assert_eq!((t.lines, t.unmarked, t.foreign, t.malformed), (9, 1, 1, 1));
        assert_eq!(t.first_at_us[1], 20, "the first print counts for latency");
        assert_eq!(t.first_at_us[3], 5);
        assert_eq!(t.last_at_us, Some(70));
    }

    #[test]
    fn a_clean_tally_has_nothing_to_report() {
        let mut t = Tally::new(3);
        for m in 0..3 {
            t.add(&line(&[m], i64::from(m)));
        }
        assert!(t.duplicates().is_empty() && t.missing().is_empty());
        assert_eq!((t.extra_prints(), t.distinct, t.unmarked, t.foreign), (0, 3, 0, 0));
    }

    #[test]
    fn the_watcher_reads_lines_appended_in_pieces() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("paper.jsonl");
        let w = PaperWatcher::start(path.clone(), 3).unwrap();
        let mut all = Vec::new();
        for m in [0u32, 1, 1] {
            all.extend(job("p", "1970-01-01T00:00:01Z", &format!("E2E {m}\n")));
            all.push(b'\n');
        }
        let cut = all.len() - 7;
        std::fs::write(&path, &all[..cut]).unwrap();
        std::thread::sleep(Duration::from_millis(30));
        use std::io::Write as _;
        std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(&all[cut..]).unwrap();
        let t = w.finish().unwrap();
        assert_eq!((t.lines, t.malformed, t.distinct), (3, 0, 2));
        assert_eq!(t.duplicates(), vec![(1, 2)]);
        assert_eq!(t.missing(), vec![2]);
    }
}
