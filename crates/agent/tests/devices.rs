//! Printers on a serial port or a USB printer device, through the agent's public
//! interface: the printer simulator serves a pseudo-terminal (a character device path
//! like `/dev/pts/3`), the agent is pointed at it with `serial://` or `usb://`, and the
//! simulator's paper log says what came out.

#![cfg(unix)]

mod common;

use common::{args, delivery, FakeBroker, RunningAgent};
use onceprint_agent::journal::{Journal, RecordState};
use onceprint_agent::printer::{print_job, Confirmation, DriverConfig, Finished, Job, PrinterAddress};
use onceprint_agent::{Outcome, ALREADY_IN_DOUBT, ALREADY_PRINTED};
use onceprint_escpos::text::text_job;
use onceprint_printer_sim::{FaultUpdate, Faults, PrintedJob, SimConfig, Simulator};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

const WITHIN: Duration = Duration::from_secs(10);

/// A simulated printer on a pseudo-terminal, with its paper log.
struct PtyPrinter {
    sim: Simulator,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl PtyPrinter {
    async fn start(faults: Faults) -> PtyPrinter {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("paper.jsonl");
        let config = SimConfig { pty: true, paper_log: Some(log.clone()), faults, ..SimConfig::ephemeral() };
        let sim = Simulator::start(config).await.expect("pty printer");
        PtyPrinter { sim, log, _dir: dir }
    }

    /// The device path now (`/dev/pts/N`).
    fn path(&self) -> PathBuf {
        self.sim.pty_path(0).expect("the printer is there")
    }

    fn serial(&self) -> String {
        format!("serial://{}?baud=19200", self.path().display())
    }

    /// The paper log as the simulator wrote it to its file.
    fn paper(&self) -> Vec<PrintedJob> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad line {l:?}: {e}"))).collect()
    }

    fn texts(&self) -> Vec<String> {
        self.paper().into_iter().map(|j| j.text).collect()
    }
}

fn receipt(text: &str) -> Vec<u8> {
    text_job(text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_to_a_serial_port_prints_once_and_the_paper_log_has_it() {
    let printer = PtyPrinter::start(Faults::default()).await;
    let broker = FakeBroker::start().await;
    let state = tempfile::tempdir().expect("tempdir");
    let agent = RunningAgent::start(args(&broker.url(), state.path()));
    let address = printer.serial();
    assert!(address.starts_with("serial:///dev/pts/"), "{address}");

    broker.state.push(delivery("T1", 1, "p1", &address, &receipt("Table 5\n1 x Noodles\n")));
    let acks = broker.state.wait_acks(1, WITHIN).await;
    assert_eq!(acks[0].outcome, Outcome::Printed, "{:?}", acks[0]);
    assert!(acks[0].detail.contains("GS ( H"), "confirmed by the printer itself: {:?}", acks[0]);
    let paper = printer.paper();
    assert_eq!(paper.len(), 1, "{paper:?}");
    assert_eq!(paper[0].printer, "pty:0");
    assert!(paper[0].text.contains("1 x Noodles"), "{:?}", paper[0].text);

    // Redelivered (a lost ack, the sweeper): answered from the journal, not printed again.
    broker.state.push(delivery("T1", 1, "p1", &address, &receipt("Table 5\n1 x Noodles\n")));
    broker.state.push(delivery("T1", 2, "p1", &address, &receipt("Table 5\n1 x Noodles\n")));
    let acks = broker.state.wait_acks(3, WITHIN).await;
    for a in &acks[1..] {
        assert_eq!((a.outcome, a.detail.as_str()), (Outcome::Printed, ALREADY_PRINTED), "{a:?}");
    }
    // The next task goes over the device the agent kept open.
    broker.state.push(delivery("T2", 1, "p1", &address, &receipt("Table 6\n")));
    assert_eq!(broker.state.wait_acks(4, WITHIN).await[3].outcome, Outcome::Printed);
    agent.stop().await;
    let texts = printer.texts();
    assert_eq!(texts.len(), 2, "T1 once, then T2: {texts:?}");
    assert!(texts[1].contains("Table 6"));

    let journal = Journal::open(state.path(), 1000).expect("journal");
    assert_eq!(journal.lookup("T1").map(|r| r.state), Some(RecordState::Printed));
    journal.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paper_out_on_a_serial_printer_is_recoverable_and_nothing_is_sent() {
    let printer = PtyPrinter::start(Faults { paper_out: true, ..Faults::default() }).await;
    let broker = FakeBroker::start().await;
    let state = tempfile::tempdir().expect("tempdir");
    let agent = RunningAgent::start(args(&broker.url(), state.path()));
    let address = printer.serial();

    broker.state.push(delivery("T1", 1, "p1", &address, &receipt("refund\n")));
    let acks = broker.state.wait_acks(1, WITHIN).await;
    assert_eq!(acks[0].outcome, Outcome::NoPaper, "{:?}", acks[0]);
    assert!(acks[0].detail.contains("before sending"), "{:?}", acks[0]);

    // Nothing was sent: a printer out of paper keeps what it receives and prints it when
    // paper goes in, and here nothing comes out when it does.
    printer.sim.faults().update_all(FaultUpdate { paper_out: Some(false), ..FaultUpdate::default() });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(printer.paper().is_empty(), "{:?}", printer.paper());

    // The broker retries (a recoverable outcome); now it prints, once.
    broker.state.push(delivery("T1", 2, "p1", &address, &receipt("refund\n")));
    let acks = broker.state.wait_acks(2, WITHIN).await;
    assert_eq!(acks[1].outcome, Outcome::Printed, "{:?}", acks[1]);
    agent.stop().await;
    assert_eq!(printer.texts().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serial_printer_that_vanishes_after_started_is_in_doubt_and_never_printed_twice() {
    // The printer prints the job, then its device goes away before it confirms (a USB
    // serial adapter pulled, a printer that reboots).
    let printer = PtyPrinter::start(Faults { crash_mid_job: 1, ..Faults::default() }).await;
    let broker = FakeBroker::start().await;
    let state = tempfile::tempdir().expect("tempdir");
    let agent = RunningAgent::start(args(&broker.url(), state.path()));
    let address = printer.serial();
    let mut paths = printer.sim.watch_pty(0).expect("pty printer");
    paths.borrow_and_update();

    broker.state.push(delivery("T1", 1, "p1", &address, &receipt("kitchen 12\n")));
    let acks = broker.state.wait_acks(1, WITHIN).await;
    assert_eq!(acks[0].outcome, Outcome::InDoubt, "{:?}", acks[0]);
    assert!(acks[0].detail.contains("device went away) before confirming"), "{:?}", acks[0]);
    assert!(acks[0].detail.contains("a person must check the paper"), "{:?}", acks[0]);
    assert_eq!(printer.texts().len(), 1, "it did print");
    agent.stop().await;
    {
        let journal = Journal::open(state.path(), 1000).expect("journal");
        assert_eq!(journal.lookup("T1").map(|r| r.state), Some(RecordState::InDoubt));
        journal.close().await.expect("close");
    }

    // The agent restarts and the broker offers the task again, at the address the printer
    // is back at: the journal answers, the printer gets nothing.
    // (It may come back at the same path: the kernel reuses a free pty number.)
    let back = tokio::time::timeout(WITHIN, async {
        loop {
            paths.changed().await.expect("the simulator runs");
            if let Some(path) = paths.borrow_and_update().clone() {
                return path;
            }
        }
    })
    .await
    .expect("the printer comes back");
    let address = format!("serial://{}", back.display());
    let agent = RunningAgent::start(args(&broker.url(), state.path()));
    broker.state.push(delivery("T1", 2, "p1", &address, &receipt("kitchen 12\n")));
    let acks = broker.state.wait_acks(2, WITHIN).await;
    assert_eq!((acks[1].outcome, acks[1].detail.as_str()), (Outcome::InDoubt, ALREADY_IN_DOUBT), "{:?}", acks[1]);

    // The printer itself is fine again: the next task prints there.
    broker.state.push(delivery("T2", 1, "p1", &address, &receipt("kitchen 13\n")));
    assert_eq!(broker.state.wait_acks(3, WITHIN).await[2].outcome, Outcome::Printed);
    agent.stop().await;
    let texts = printer.texts();
    assert_eq!(texts.iter().filter(|t| t.contains("kitchen 12")).count(), 1, "T1 printed once: {texts:?}");
    assert_eq!(texts.len(), 2, "{texts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_usb_device_path_opens_and_prints() {
    // A USB printer-class device is a character device the agent opens as it is; the
    // simulator's pty is one too.
    let printer = PtyPrinter::start(Faults::default()).await;
    let broker = FakeBroker::start().await;
    let state = tempfile::tempdir().expect("tempdir");
    let agent = RunningAgent::start(args(&broker.url(), state.path()));
    let address = format!("usb://{}", printer.path().display());
    for (task, text) in [("U1", "usb receipt 1\n"), ("U2", "usb receipt 2\n")] {
        broker.state.push(delivery(task, 1, "lp0", &address, &receipt(text)));
    }
    let acks = broker.state.wait_acks(2, WITHIN).await;
    assert!(acks.iter().all(|a| a.outcome == Outcome::Printed), "{acks:?}");
    agent.stop().await;
    let texts = printer.texts();
    assert_eq!(texts.len(), 2, "{texts:?}");
    assert!(texts[0].contains("usb receipt 1") && texts[1].contains("usb receipt 2"), "in order: {texts:?}");
}

fn cfg() -> DriverConfig {
    DriverConfig {
        connect_timeout: Duration::from_millis(500),
        status_timeout: Duration::from_millis(300),
        print_timeout: Duration::from_millis(700),
    }
}

async fn print_to(journal: &Journal, address: &str, task: &str) -> Finished {
    let address: PrinterAddress = address.parse().expect("address");
    let job = Job { task_id: task, attempt: 1, key: "", data: b"\x1b@must not print\n", process_id: *b"dv01" };
    print_job(journal, &address, &job, &cfg(), Confirmation::ProcessId).await
}

/// A pty whose master side nobody answers: a USB printer that cannot send anything back.
struct MutePrinter {
    master: std::fs::File,
    path: PathBuf,
}

impl MutePrinter {
    fn open() -> MutePrinter {
        use rustix::pty::OpenptFlags;
        let master = rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC).expect("pty");
        rustix::pty::grantpt(&master).expect("grantpt");
        rustix::pty::unlockpt(&master).expect("unlockpt");
        let name = rustix::pty::ptsname(&master, Vec::new()).expect("ptsname");
        let path = PathBuf::from(name.to_str().expect("utf-8 path"));
        let mut t = rustix::termios::tcgetattr(&master).expect("termios");
        t.make_raw();
        rustix::termios::tcsetattr(&master, rustix::termios::OptionalActions::Now, &t).expect("raw");
        rustix::io::ioctl_fionbio(&master, true).expect("nonblocking");
        MutePrinter { master: std::fs::File::from(master), path }
    }

    /// Everything the agent wrote to the device so far.
    fn received(&mut self) -> Vec<u8> {
        let mut got = Vec::new();
        let mut buf = [0u8; 256];
        while let Ok(n @ 1..) = self.master.read(&mut buf) {
            got.extend_from_slice(&buf[..n]);
        }
        got
    }
}

#[tokio::test]
async fn a_device_that_never_answers_status_is_offline_and_gets_no_job() {
    let dir = tempfile::tempdir().expect("tempdir");
    let journal = Journal::open(dir.path(), 100).expect("journal");
    let mut mute = MutePrinter::open();
    for address in [format!("usb://{}", mute.path.display()), format!("serial://{}", mute.path.display())] {
        let f = print_to(&journal, &address, "M1").await;
        assert_eq!(f.outcome, Outcome::Offline, "{address}: {f:?}");
        assert!(f.detail.contains("DLE EOT 1") && f.detail.contains("cannot answer"), "{}", f.detail);
        // Only the three status requests reached the device, not a byte of the job.
        assert_eq!(mute.received(), [0x10, 0x04, 1, 0x10, 0x04, 2, 0x10, 0x04, 4], "{address}");
    }
    assert_eq!(journal.lookup("M1"), None, "nothing was started");
    journal.close().await.expect("close");
}

#[tokio::test]
async fn a_path_that_is_not_a_printer_device_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().expect("tempdir");
    let journal = Journal::open(dir.path(), 100).expect("journal");
    let file = dir.path().join("not-a-printer");
    std::fs::write(&file, b"keep me").expect("write");
    let missing = dir.path().join("gone");
    for (address, why) in [
        (format!("usb://{}", file.display()), "not a character device"),
        (format!("serial://{}", file.display()), "not a character device"),
        (format!("usb://{}", missing.display()), "No such file"),
        // A character device, but not a terminal: no serial port settings to make.
        ("serial:///dev/null".to_owned(), "not a serial port"),
    ] {
        let f = print_to(&journal, &address, "X1").await;
        assert_eq!(f.outcome, Outcome::Offline, "{address}: {f:?}");
        assert!(f.detail.contains("cannot open") && f.detail.contains(why), "{address}: {}", f.detail);
    }
    assert_eq!(std::fs::read(&file).expect("read"), b"keep me", "not written to");
    assert!(!Path::new(&missing).exists(), "not created");
    assert_eq!(journal.lookup("X1"), None);
    journal.close().await.expect("close");
}
