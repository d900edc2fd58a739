//! Pseudo-terminal printers: the same printer as over TCP (status, `GS ( H`, the paper
//! log, faults), reached through a character device path the way the agent reaches a
//! printer on a serial port or a USB printer device.

#![cfg(unix)]

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use onceprint_escpos::{ack, status, text::text_job};
use onceprint_printer_sim::{FaultUpdate, Faults, PrintedJob, SimConfig, Simulator};
use rustix::fs::{Mode, OFlags};
use rustix::termios;

const WAIT: Duration = Duration::from_secs(10);

struct Fixture {
    sim: Simulator,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

async fn start(faults: Faults) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("paper.jsonl");
    let sim = Simulator::start(SimConfig { pty: true, paper_log: Some(log.clone()), faults, ..SimConfig::ephemeral() })
        .await
        .unwrap();
    Fixture { sim, log, _dir: dir }
}

impl Fixture {
    fn path(&self) -> PathBuf {
        self.sim.pty_path(0).expect("the pty printer is there")
    }

    fn paper_log(&self) -> Vec<PrintedJob> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad line {l:?}: {e}"))).collect()
    }
}

/// The test's side of the device, with blocking reads that give up after a tenth of a
/// second each (`VTIME`), so a missing answer cannot hang the test. The test bodies run
/// on a multi-threaded runtime, so blocking here does not stop the simulator.
struct Device(File);

impl Device {
    fn open(path: &Path) -> Device {
        let fd = rustix::fs::open(path, OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC, Mode::empty())
            .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
        let mut t = termios::tcgetattr(&fd).unwrap();
        t.special_codes[termios::SpecialCodeIndex::VMIN] = 0;
        t.special_codes[termios::SpecialCodeIndex::VTIME] = 1;
        termios::tcsetattr(&fd, termios::OptionalActions::Now, &t).unwrap();
        Device(File::from(fd))
    }

    fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.0.write_all(bytes)
    }

    /// Reads until `want` bytes arrived or `within` passed; `Err` once the device is gone.
    fn read(&mut self, want: usize, within: Duration) -> std::io::Result<Vec<u8>> {
        let deadline = Instant::now() + within;
        let mut got = Vec::new();
        let mut buf = [0u8; 256];
        while got.len() < want && Instant::now() < deadline {
            match self.0.read(&mut buf) {
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(got)
    }

    fn status(&mut self, n: u8) -> u8 {
        self.send(&status::request(n)).unwrap();
        let got = self.read(1, WAIT).unwrap();
        assert_eq!(got.len(), 1, "no answer to DLE EOT {n}");
        got[0]
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pty_printer_answers_status_prints_and_confirms_like_a_tcp_printer() {
    let f = start(Faults::default()).await;
    assert_eq!(f.sim.names(), ["pty:0"]);
    assert!(f.sim.printers().is_empty(), "no TCP printers");
    let path = f.path();
    assert!(path.starts_with("/dev/pts"), "{}", path.display());

    let mut dev = Device::open(&path);
    assert_eq!([dev.status(1), dev.status(2), dev.status(4)], [0x12; 3]);
    // Line feeds in the job must reach the printer unchanged (a pty in its default mode
    // would turn them into CR LF and echo the printer's answers back to it).
    let job = text_job("Table 5\n1 x Noodles\n");
    let mut out = job.clone();
    out.extend_from_slice(&ack::request(*b"pt01"));
    dev.send(&out).unwrap();
    assert_eq!(dev.read(7, WAIT).unwrap(), ack::reply(*b"pt01"));

    let log = f.paper_log();
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!((log[0].printer.as_str(), log[0].seq, log[0].bytes), ("pty:0", 1, job.len()));
    assert!(log[0].text.contains("1 x Noodles"), "{:?}", log[0].text);
    assert_eq!(f.sim.jobs().of("pty:0").len(), 1);

    // Whoever opens the device next talks to the same printer, as with a real port.
    drop(dev);
    let mut again = Device::open(&path);
    assert_eq!(again.status(1), 0x12);
    f.sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paper_out_on_a_pty_printer_buffers_the_job_until_paper_goes_in() {
    let f = start(Faults { paper_out: true, ..Faults::default() }).await;
    let mut dev = Device::open(&f.path());
    assert_eq!(dev.status(4), 0x7E, "paper end");
    let mut out = text_job("late\n");
    out.extend_from_slice(&ack::request(*b"pt02"));
    dev.send(&out).unwrap();
    assert!(dev.read(7, Duration::from_millis(300)).unwrap().is_empty(), "no confirmation without paper");
    assert!(f.paper_log().is_empty());

    f.sim.faults().update(Some("pty:0"), FaultUpdate { paper_out: Some(false), ..FaultUpdate::default() }).unwrap();
    assert_eq!(dev.read(7, WAIT).unwrap(), ack::reply(*b"pt02"), "the buffered job prints when paper goes in");
    assert_eq!(f.paper_log().len(), 1);
    f.sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_makes_the_device_vanish_and_the_printer_comes_back_as_a_new_pty() {
    let f = start(Faults { crash_mid_job: 1, ..Faults::default() }).await;
    let mut paths = f.sim.watch_pty(0).expect("a pty printer");
    let first = f.path();
    let mut dev = Device::open(&first);
    let mut out = text_job("crash\n");
    out.extend_from_slice(&ack::request(*b"pt03"));
    dev.send(&out).unwrap();

    // The job printed, then the device went away before the confirmation.
    let gone = dev.read(7, Duration::from_secs(2));
    assert!(gone.as_ref().map_or(true, Vec::is_empty), "no confirmation from a crashed printer: {gone:?}");
    assert_eq!(f.paper_log().len(), 1);
    let back = tokio::time::timeout(WAIT, paths.wait_for(|p| p.as_ref().is_some_and(|p| *p != first)))
        .await
        .expect("the printer comes back")
        .expect("the simulator runs")
        .clone()
        .expect("a path");
    assert!(dev.send(&status::request(1)).is_err() || dev.read(1, Duration::from_millis(300)).is_err());

    // The printer that came back works, and counts on from its first job.
    let mut dev = Device::open(&back);
    let mut out = text_job("after\n");
    out.extend_from_slice(&ack::request(*b"pt04"));
    dev.send(&out).unwrap();
    assert_eq!(dev.read(7, WAIT).unwrap(), ack::reply(*b"pt04"));
    let log = f.paper_log();
    assert_eq!(log.iter().map(|j| (j.printer.as_str(), j.seq)).collect::<Vec<_>>(), [("pty:0", 1), ("pty:0", 2)]);
    assert_eq!(f.sim.faults().get("pty:0").map(|x| x.crash_mid_job), Some(0), "the crash was used up");
    f.sim.shutdown().await;
}
