//! The printer driver against a fake ESC/POS printer on a real socket.

mod common;

use common::{Behaviour, FakePrinter};
use onceprint_agent::journal::{Journal, RecordState};
use onceprint_agent::printer::{
    print_job, print_job_on, Confirmation, DriverConfig, Finished, Job, PrinterAddress, PrinterLink, STATUS_ONLY_DETAIL,
};
use onceprint_agent::Outcome;
use std::time::Duration;

const DATA: &[u8] = b"\x1b@Table 5\n1 x Noodles\n";

fn cfg() -> DriverConfig {
    DriverConfig {
        connect_timeout: Duration::from_millis(500),
        status_timeout: Duration::from_millis(500),
        print_timeout: Duration::from_millis(700),
    }
}

async fn print(journal: &Journal, address: &str, task: &str, confirmation: Confirmation) -> Finished {
    let address: PrinterAddress = address.parse().expect("address");
    let job = Job { task_id: task, attempt: 1, key: "", data: DATA, process_id: *b"ab12" };
    print_job(journal, &address, &job, &cfg(), confirmation).await
}

#[tokio::test]
async fn a_healthy_printer_prints_and_the_journal_says_so() {
    let dir = tempfile::tempdir().expect("tempdir");
    let journal = Journal::open(dir.path(), 100).expect("journal");
    let printer = FakePrinter::start(Behaviour::Healthy).await;
    let f = print(&journal, &printer.address(), "T1", Confirmation::ProcessId).await;
    assert_eq!(f.outcome, Outcome::Printed, "{f:?}");
    assert_eq!(printer.jobs(), vec![DATA.to_vec()]);
    assert_eq!(journal.lookup("T1").map(|r| r.state), Some(RecordState::Printed));
    journal.close().await.expect("close");
}

#[tokio::test]
async fn a_late_reply_for_another_job_is_not_taken_for_this_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let journal = Journal::open(dir.path(), 100).expect("journal");
    let printer = FakePrinter::start(Behaviour::WrongIdFirst).await;
    let f = print(&journal, &printer.address(), "T1", Confirmation::ProcessId).await;
    assert_eq!(f.outcome, Outcome::Printed, "{f:?}");
    journal.close().await.expect("close");
}

#[tokio::test]
async fn paper_out_prints_nothing_and_starts_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let journal = Journal::open(dir.path(), 100).expect("journal");
    let printer = FakePrinter::start(Behaviour::PaperOut).await;
    let f = print(&journal, &printer.address(), "T1", Confirmation::ProcessId).await;
    assert_eq!(f.outcome, Outcome::NoPaper, "{f:?}");
    assert_eq!(printer.job_count(), 0);
    assert_eq!(journal.lookup("T1"), None, "nothing was started");
    journal.close().await.expect("close");
}

#[tokio::test]
async fn a_connection_lost_after_sending_is_in_doubt() {
    let dir = tempfile::tempdir().expect("tempdir");
    let journal = Journal::open(dir.path(), 100).expect("journal");
    let printer = FakePrinter::start(Behaviour::DropAfterJob).await;
    let f = print(&journal, &printer.address(), "T1", Confirmation::ProcessId).await;
    assert_eq!(f.outcome, Outcome::InDoubt, "{f:?}");
    assert!(f.detail.contains("closed the connection"), "{}", f.detail);
    assert_eq!(printer.job_count(), 1, "the job did reach the paper");
    assert_eq!(journal.lookup("T1").map(|r| r.state), Some(RecordState::InDoubt));
    journal.close().await.expect("close");
}

#[tokio::test]
async fn a_clone_without_gs_h_is_in_doubt_unless_confirmed_by_status() {
    let dir = tempfile::tempdir().expect("tempdir");
    let journal = Journal::open(dir.path(), 100).expect("journal");
    let printer = FakePrinter::start(Behaviour::Clone).await;

    let f = print(&journal, &printer.address(), "T1", Confirmation::ProcessId).await;
    assert_eq!(f.outcome, Outcome::InDoubt, "{f:?}");
    assert!(f.detail.contains("--no-printed-ack"), "the detail points at the fix: {}", f.detail);

    let f = print(&journal, &printer.address(), "T2", Confirmation::StatusOnly).await;
    assert_eq!(f.outcome, Outcome::Printed, "{f:?}");
    assert_eq!(f.detail, STATUS_ONLY_DETAIL);
    assert_eq!(journal.lookup("T2").map(|r| r.state), Some(RecordState::Printed));
    journal.close().await.expect("close");
}

#[tokio::test]
async fn a_status_only_printer_that_reports_paper_out_after_the_job_is_in_doubt() {
    let dir = tempfile::tempdir().expect("tempdir");
    let journal = Journal::open(dir.path(), 100).expect("journal");
    // Out of paper after the job reached it: the printer keeps the job in its buffer and
    // may print it when paper goes in, so this is doubt, not a failure to retry.
    let printer = FakePrinter::start(Behaviour::PaperOutAfterJob).await;
    let f = print(&journal, &printer.address(), "T1", Confirmation::StatusOnly).await;
    assert_eq!(f.outcome, Outcome::InDoubt, "{f:?}");
    assert!(f.detail.contains("no_paper"), "{}", f.detail);
    assert_eq!(journal.lookup("T1").map(|r| r.state), Some(RecordState::InDoubt));
    journal.close().await.expect("close");
}

#[tokio::test]
async fn nothing_listening_is_offline() {
    let dir = tempfile::tempdir().expect("tempdir");
    let journal = Journal::open(dir.path(), 100).expect("journal");
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let f = print(&journal, &format!("tcp://127.0.0.1:{port}"), "T1", Confirmation::ProcessId).await;
    assert_eq!(f.outcome, Outcome::Offline, "{f:?}");
    assert_eq!(journal.lookup("T1"), None);
    journal.close().await.expect("close");
}

#[tokio::test]
async fn a_printer_that_never_answers_status_is_offline() {
    let dir = tempfile::tempdir().expect("tempdir");
    let journal = Journal::open(dir.path(), 100).expect("journal");
    let printer = FakePrinter::start(Behaviour::Silent).await;
    let f = print(&journal, &printer.address(), "T1", Confirmation::ProcessId).await;
    assert_eq!(f.outcome, Outcome::Offline, "{f:?}");
    assert!(f.detail.contains("DLE EOT 1"), "{}", f.detail);
    assert_eq!(printer.job_count(), 0);
    assert_eq!(journal.lookup("T1"), None);
    journal.close().await.expect("close");
}

async fn print_on(link: &mut PrinterLink, journal: &Journal, address: &str, task: &str, id: &[u8; 4]) -> Finished {
    let address: PrinterAddress = address.parse().expect("address");
    let job = Job { task_id: task, attempt: 1, key: "", data: DATA, process_id: *id };
    print_job_on(link, journal, &address, &job, &cfg(), Confirmation::ProcessId).await
}

#[tokio::test]
async fn jobs_in_a_row_share_one_connection_and_a_dropped_one_is_reopened() {
    let dir = tempfile::tempdir().expect("tempdir");
    let journal = Journal::open(dir.path(), 100).expect("journal");
    let printer = FakePrinter::start(Behaviour::Healthy).await;
    let mut link = PrinterLink::new();

    for (task, id) in [("T1", b"id01"), ("T2", b"id02")] {
        let f = print_on(&mut link, &journal, &printer.address(), task, id).await;
        assert_eq!(f.outcome, Outcome::Printed, "{f:?}");
    }
    assert_eq!(printer.connections(), 1, "the second job went over the first job's connection");
    assert_eq!((link.connections_opened(), link.is_open()), (1, true));

    // The printer drops the connection between jobs (it rebooted, or closes idle
    // clients): the next job notices before sending anything and opens a new one.
    printer.kick();
    common::eventually(Duration::from_secs(5), "the printer closed it", || printer.open_connections() == 0).await;
    let f = print_on(&mut link, &journal, &printer.address(), "T3", b"id03").await;
    assert_eq!(f.outcome, Outcome::Printed, "{f:?}");
    // And also when it happens just before the job, before the agent could see it.
    printer.kick();
    let f = print_on(&mut link, &journal, &printer.address(), "T4", b"id04").await;
    assert_eq!(f.outcome, Outcome::Printed, "{f:?}");
    assert_eq!(printer.connections(), 3);
    assert_eq!(printer.job_count(), 4, "every job on paper once");
    for t in ["T1", "T2", "T3", "T4"] {
        assert_eq!(journal.lookup(t).map(|r| r.state), Some(RecordState::Printed), "{t}");
    }

    link.close().await;
    assert!(!link.is_open());
    common::eventually(Duration::from_secs(5), "closed on the printer's side", || printer.open_connections() == 0)
        .await;
    journal.close().await.expect("close");
}

#[tokio::test]
async fn a_connection_lost_mid_job_is_in_doubt_and_the_next_job_gets_a_new_connection() {
    let dir = tempfile::tempdir().expect("tempdir");
    let journal = Journal::open(dir.path(), 100).expect("journal");
    let dropping = FakePrinter::start(Behaviour::DropAfterJob).await;
    let mut link = PrinterLink::new();
    let f = print_on(&mut link, &journal, &dropping.address(), "T1", b"id01").await;
    assert_eq!(f.outcome, Outcome::InDoubt, "{f:?}");
    assert!(!link.is_open(), "a connection that failed mid-job is not kept");

    // The same worker's next job (here: the printer at a new address) connects afresh.
    let healthy = FakePrinter::start(Behaviour::Healthy).await;
    let f = print_on(&mut link, &journal, &healthy.address(), "T2", b"id02").await;
    assert_eq!(f.outcome, Outcome::Printed, "{f:?}");
    let f = print_on(&mut link, &journal, &healthy.address(), "T3", b"id03").await;
    assert_eq!(f.outcome, Outcome::Printed, "{f:?}");
    assert_eq!((dropping.connections(), healthy.connections()), (1, 1));
    assert_eq!(link.connections_opened(), 2);
    link.close().await;
    journal.close().await.expect("close");
}

#[tokio::test]
async fn bytes_left_over_from_an_earlier_job_are_not_taken_for_status_answers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let journal = Journal::open(dir.path(), 100).expect("journal");
    // Unasked bytes that look like "offline" status answers arrive after the first job:
    // the next job throws them away before asking.
    let noisy = FakePrinter::start(Behaviour::NoiseAfterReply).await;
    let mut link = PrinterLink::new();
    let f = print_on(&mut link, &journal, &noisy.address(), "T1", b"id01").await;
    assert_eq!(f.outcome, Outcome::Printed, "{f:?}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let f = print_on(&mut link, &journal, &noisy.address(), "T2", b"id02").await;
    assert_eq!(f.outcome, Outcome::Printed, "{f:?}");
    assert_eq!(noisy.connections(), 1);
    link.close().await;

    // A stray GS ( H reply whose id bytes look like "offline" status answers arrives in
    // front of the next status answer: it is skipped as a whole.
    let stale = FakePrinter::start(Behaviour::StaleReplyBeforeStatus).await;
    let mut link = PrinterLink::new();
    for (task, id) in [("T3", b"id03"), ("T4", b"id04"), ("T5", b"id05")] {
        let f = print_on(&mut link, &journal, &stale.address(), task, id).await;
        assert_eq!(f.outcome, Outcome::Printed, "{f:?}");
    }
    assert_eq!((stale.connections(), stale.job_count()), (1, 3));
    link.close().await;
    journal.close().await.expect("close");
}
