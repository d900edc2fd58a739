//! The whole agent: fake broker (axum) ↔ agent ↔ fake printer, all on real sockets.

mod common;

use common::{args, delivery, Behaviour, FakeBroker, FakePrinter, RunningAgent, TOKEN};
use onceprint_agent::journal::{Journal, Record, RecordState};
use onceprint_agent::{
    Outcome, ALREADY_IN_DOUBT, ALREADY_PRINTED, ALREADY_REPORTED, KEY_ALREADY_PRINTED, KEY_IN_DOUBT,
    KEY_PRINTED_OFFLINE, STARTED_BEFORE_CRASH,
};
use std::sync::atomic::Ordering;
use std::time::Duration;

const WITHIN: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_is_printed_once_and_acked_and_a_redelivery_is_answered_from_the_journal() {
    let broker = FakeBroker::start().await;
    let printer = FakePrinter::start(Behaviour::Healthy).await;
    let state = tempfile::tempdir().expect("tempdir");
    let agent = RunningAgent::start(args(&broker.url(), state.path()));

    broker.state.push(delivery("T1", 1, "p1", &printer.address(), b"receipt 1\n"));
    let acks = broker.state.wait_acks(1, WITHIN).await;
    assert_eq!(acks[0].task_id, "T1");
    assert_eq!(acks[0].outcome, Outcome::Printed, "{:?}", acks[0]);
    assert_eq!(printer.jobs(), vec![b"receipt 1\n".to_vec()]);

    // The broker did not see the ack (or its sweeper fired) and delivers again, same
    // attempt and next attempt: answered from the journal, no second print.
    broker.state.push(delivery("T1", 1, "p1", &printer.address(), b"receipt 1\n"));
    broker.state.push(delivery("T1", 2, "p1", &printer.address(), b"receipt 1\n"));
    let acks = broker.state.wait_acks(3, WITHIN).await;
    for a in &acks[1..] {
        assert_eq!((a.outcome, a.detail.as_str()), (Outcome::Printed, ALREADY_PRINTED), "{a:?}");
    }
    assert_eq!(printer.job_count(), 1, "printed exactly once");
    agent.stop().await;

    // A restarted agent is the same agent (same id) and still remembers.
    let agent = RunningAgent::start(args(&broker.url(), state.path()));
    broker.state.push(delivery("T1", 3, "p1", &printer.address(), b"receipt 1\n"));
    let acks = broker.state.wait_acks(4, WITHIN).await;
    assert_eq!((acks[3].outcome, acks[3].detail.as_str()), (Outcome::Printed, ALREADY_PRINTED));
    assert_eq!(printer.job_count(), 1);
    agent.stop().await;
    let ids = broker.state.agent_ids.lock().expect("ids").clone();
    assert!(!ids.is_empty());
    assert!(ids.iter().all(|i| i == &ids[0] && i.starts_with("agent-")), "one persisted agent id: {ids:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_restarted_after_a_crash_mid_print_answers_in_doubt_without_printing() {
    let broker = FakeBroker::start().await;
    let printer = FakePrinter::start(Behaviour::Healthy).await;
    let state = tempfile::tempdir().expect("tempdir");
    // What a crash between `started` and the printer's reply leaves behind.
    {
        let j = Journal::open(state.path(), 1000).expect("journal");
        j.append(Record::new("T7", 1, RecordState::Started, printer.address())).await.expect("append");
        j.close().await.expect("close");
    }
    let agent = RunningAgent::start(args(&broker.url(), state.path()));
    broker.state.push(delivery("T7", 2, "p1", &printer.address(), b"kitchen\n"));
    let acks = broker.state.wait_acks(1, WITHIN).await;
    assert_eq!(
        (acks[0].outcome, acks[0].detail.as_str(), acks[0].attempt),
        (Outcome::InDoubt, STARTED_BEFORE_CRASH, 2)
    );

    // Asked again, it stays in doubt.
    broker.state.push(delivery("T7", 3, "p1", &printer.address(), b"kitchen\n"));
    let acks = broker.state.wait_acks(2, WITHIN).await;
    assert_eq!((acks[1].outcome, acks[1].detail.as_str()), (Outcome::InDoubt, ALREADY_IN_DOUBT));
    assert_eq!(printer.connections(), 0, "the printer was not even contacted");
    assert_eq!(printer.job_count(), 0);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_printer_is_reported_and_a_later_attempt_prints() {
    let broker = FakeBroker::start().await;
    let empty = FakePrinter::start(Behaviour::PaperOut).await;
    let state = tempfile::tempdir().expect("tempdir");
    let agent = RunningAgent::start(args(&broker.url(), state.path()));
    broker.state.push(delivery("T1", 1, "p1", &empty.address(), b"x\n"));
    let acks = broker.state.wait_acks(1, WITHIN).await;
    assert_eq!(acks[0].outcome, Outcome::NoPaper);
    assert_eq!(empty.job_count(), 0);

    // Paper went in (here: the printer moved to a working one); the broker retries.
    let fixed = FakePrinter::start(Behaviour::Healthy).await;
    broker.state.push(delivery("T1", 2, "p1", &fixed.address(), b"x\n"));
    let acks = broker.state.wait_acks(2, WITHIN).await;
    assert_eq!(acks[1].outcome, Outcome::Printed, "{:?}", acks[1]);
    assert_eq!(fixed.job_count(), 1);

    // Nothing listening at all.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    broker.state.push(delivery("T2", 1, "p2", &format!("tcp://127.0.0.1:{port}"), b"y\n"));
    let acks = broker.state.wait_acks(3, WITHIN).await;
    assert_eq!(acks[2].outcome, Outcome::Offline);

    // Undecodable data is an error and nothing is sent.
    let mut bad = delivery("T3", 1, "p1", &fixed.address(), b"z\n");
    bad.data = "%%% not base64".into();
    broker.state.push(bad);
    let acks = broker.state.wait_acks(4, WITHIN).await;
    assert_eq!(acks[3].outcome, Outcome::Error);
    assert_eq!(fixed.job_count(), 1);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_printer_prints_in_arrival_order_and_clones_are_confirmed_by_status() {
    let broker = FakeBroker::start().await;
    let a = FakePrinter::start(Behaviour::Healthy).await;
    let clone = FakePrinter::start(Behaviour::Clone).await;
    let state = tempfile::tempdir().expect("tempdir");
    let mut agent_args = args(&broker.url(), state.path());
    agent_args.no_printed_ack = vec!["clone".into()];
    let agent = RunningAgent::start(agent_args);
    for i in 0..6 {
        broker.state.push(delivery(&format!("A{i}"), 1, "a", &a.address(), format!("a{i}\n").as_bytes()));
        broker.state.push(delivery(&format!("C{i}"), 1, "clone", &clone.address(), format!("c{i}\n").as_bytes()));
    }
    let acks = broker.state.wait_acks(12, WITHIN).await;
    assert!(acks.iter().all(|x| x.outcome == Outcome::Printed), "{acks:?}");
    let expected_a: Vec<Vec<u8>> = (0..6).map(|i| format!("a{i}\n").into_bytes()).collect();
    let expected_c: Vec<Vec<u8>> = (0..6).map(|i| format!("c{i}\n").into_bytes()).collect();
    assert_eq!(a.jobs(), expected_a);
    assert_eq!(clone.jobs(), expected_c);
    assert!(acks.iter().filter(|x| x.task_id.starts_with('C')).all(|x| x.detail.contains("status only")));
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_are_retried_until_the_broker_takes_them() {
    let broker = FakeBroker::start().await;
    broker.state.fail_acks.store(2, Ordering::SeqCst);
    let printer = FakePrinter::start(Behaviour::Healthy).await;
    let state = tempfile::tempdir().expect("tempdir");
    let agent = RunningAgent::start(args(&broker.url(), state.path()));
    broker.state.push(delivery("T1", 1, "p1", &printer.address(), b"once\n"));
    let acks = broker.state.wait_acks(1, WITHIN).await;
    assert_eq!(acks.len(), 1);
    assert_eq!(acks[0].outcome, Outcome::Printed);
    assert_eq!(broker.state.fail_acks.load(Ordering::SeqCst), 0, "both failures were retried");
    assert_eq!(printer.job_count(), 1);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_backs_off_while_the_broker_is_down_and_recovers() {
    // A "broker" that accepts connections and drops them at once, like one that crashes
    // on every request.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = accepted.clone();
    let dropper = tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            drop(s);
        }
    });
    let printer = FakePrinter::start(Behaviour::Healthy).await;
    let state = tempfile::tempdir().expect("tempdir");
    let agent = RunningAgent::start(args(&format!("http://{addr}"), state.path()));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let tries = accepted.load(Ordering::SeqCst);
    // 0.5 s doubling with jitter: about 4 tries in 3 s; without backoff it would be
    // hundreds. reqwest may open a second connection for one try, hence the slack.
    assert!((2..=10).contains(&tries), "{tries} connections in 3 s");
    dropper.abort();
    let _ = dropper.await;

    // The broker comes back on the same address.
    let broker = FakeBroker::start_on(addr).await;
    broker.state.push(delivery("T1", 1, "p1", &printer.address(), b"after the outage\n"));
    let acks = broker.state.wait_acks(1, Duration::from_secs(20)).await;
    assert_eq!(acks[0].outcome, Outcome::Printed);
    assert_eq!(printer.job_count(), 1);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_token_is_retried_slowly_and_shutdown_still_works() {
    let broker = FakeBroker::start().await;
    let state = tempfile::tempdir().expect("tempdir");
    let mut a = args(&broker.url(), state.path());
    a.token = "wrong".into();
    let agent = RunningAgent::start(a);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(broker.state.polls.load(Ordering::SeqCst), 1, "one try, then a slow pace");
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_agent_on_the_same_state_dir_is_refused() {
    let broker = FakeBroker::start().await;
    let state = tempfile::tempdir().expect("tempdir");
    let first = RunningAgent::start(args(&broker.url(), state.path()));
    common::eventually(WITHIN, "first agent polls", || broker.state.polls.load(Ordering::SeqCst) > 0).await;
    let second = onceprint_agent::run(args(&broker.url(), state.path()), std::future::pending()).await;
    assert!(matches!(second, Err(onceprint_agent::AgentError::Locked(_))), "{second:?}");
    first.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_the_print_in_flight_finish_and_flushes_its_ack() {
    let broker = FakeBroker::start().await;
    let printer = FakePrinter::start(Behaviour::Slow).await;
    let state = tempfile::tempdir().expect("tempdir");
    let agent = RunningAgent::start(args(&broker.url(), state.path()));
    broker.state.push(delivery("T1", 1, "p1", &printer.address(), b"long receipt\n"));
    common::eventually(WITHIN, "the job reaches the printer", || printer.connections() > 0).await;
    agent.stop().await;
    // `run` returned only after the print finished and its ack was taken.
    let acks = broker.state.acks();
    assert_eq!(acks.len(), 1, "{acks:?}");
    assert_eq!(acks[0].outcome, Outcome::Printed);
    assert_eq!(printer.job_count(), 1);
    let j = Journal::open(state.path(), 1000).expect("journal after shutdown");
    assert_eq!(j.lookup("T1").map(|r| r.state), Some(RecordState::Printed));
    j.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_is_obeyed_for_as_long_as_retry_after_says() {
    let broker = FakeBroker::start().await;
    broker.state.rate_limit_polls.store(1, Ordering::SeqCst);
    let printer = FakePrinter::start(Behaviour::Healthy).await;
    broker.state.push(delivery("T1", 1, "p1", &printer.address(), b"x\n"));
    let state = tempfile::tempdir().expect("tempdir");
    let started = tokio::time::Instant::now();
    let agent = RunningAgent::start(args(&broker.url(), state.path()));
    let acks = broker.state.wait_acks(1, WITHIN).await;
    assert_eq!(acks[0].outcome, Outcome::Printed);
    assert!(started.elapsed() >= Duration::from_millis(950), "waited only {:?}", started.elapsed());
    assert!(broker.state.polls.load(Ordering::SeqCst) >= 2);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_printer_connection_is_kept_across_jobs_and_closed_when_idle() {
    let broker = FakeBroker::start().await;
    let printer = FakePrinter::start(Behaviour::Healthy).await;
    let state = tempfile::tempdir().expect("tempdir");
    let mut a = args(&broker.url(), state.path());
    a.printer_idle_ms = 700;
    let agent = RunningAgent::start(a);
    for i in 0..5 {
        broker.state.push(delivery(&format!("T{i}"), 1, "p1", &printer.address(), format!("r{i}\n").as_bytes()));
    }
    let acks = broker.state.wait_acks(5, WITHIN).await;
    assert!(acks.iter().all(|x| x.outcome == Outcome::Printed), "{acks:?}");
    assert_eq!(printer.job_count(), 5);
    assert_eq!(printer.connections(), 1, "five jobs over one connection");
    assert_eq!(printer.open_connections(), 1, "kept open after the jobs");

    // No job for --printer-idle-ms: the agent lets go of the printer.
    common::eventually(WITHIN, "the idle connection is closed", || printer.open_connections() == 0).await;
    broker.state.push(delivery("T5", 1, "p1", &printer.address(), b"r5\n"));
    let acks = broker.state.wait_acks(6, WITHIN).await;
    assert_eq!(acks[5].outcome, Outcome::Printed, "{:?}", acks[5]);
    assert_eq!(printer.connections(), 2, "a new connection after the idle close");
    agent.stop().await;
    common::eventually(WITHIN, "closed at shutdown", || printer.open_connections() == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_printer_idle_zero_every_job_gets_its_own_connection() {
    let broker = FakeBroker::start().await;
    let printer = FakePrinter::start(Behaviour::Healthy).await;
    let state = tempfile::tempdir().expect("tempdir");
    let mut a = args(&broker.url(), state.path());
    a.printer_idle_ms = 0;
    let agent = RunningAgent::start(a);
    for i in 0..3 {
        broker.state.push(delivery(&format!("T{i}"), 1, "p1", &printer.address(), format!("r{i}\n").as_bytes()));
    }
    let acks = broker.state.wait_acks(3, WITHIN).await;
    assert!(acks.iter().all(|x| x.outcome == Outcome::Printed), "{acks:?}");
    assert_eq!((printer.job_count(), printer.connections()), (3, 3));
    common::eventually(WITHIN, "nothing kept open", || printer.open_connections() == 0).await;
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_load_the_poll_lingers_so_one_poll_fetches_several_deliveries() {
    let broker = FakeBroker::start().await;
    let slow = FakePrinter::start(Behaviour::Slow).await;
    let healthy = FakePrinter::start(Behaviour::Healthy).await;
    let state = tempfile::tempdir().expect("tempdir");
    let mut a = args(&broker.url(), state.path());
    a.poll_linger_ms = 250;
    let agent = RunningAgent::start(a);
    // One delivery keeps a slot busy for half a second...
    broker.state.push(delivery("A", 1, "slow", &slow.address(), b"long\n"));
    common::eventually(WITHIN, "A reaches its printer", || slow.connections() > 0).await;
    let polls_before = broker.state.polls.load(Ordering::SeqCst);
    // ...while three more trickle in, 20 ms apart. Without the linger each would have a
    // poll of its own; with it, they wait for the next poll together.
    for i in 0..3 {
        broker.state.push(delivery(&format!("B{i}"), 1, &format!("p{i}"), &healthy.address(), b"short\n"));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let acks = broker.state.wait_acks(3, WITHIN).await;
    assert!(acks.iter().all(|x| x.task_id.starts_with('B') && x.outcome == Outcome::Printed), "{acks:?}");
    let polls = broker.state.polls.load(Ordering::SeqCst) - polls_before;
    assert!(polls <= 2, "{polls} polls for three deliveries: one fetched them, the next waits");
    broker.state.wait_acks(4, WITHIN).await;
    agent.stop().await;
}

/// An attempt the agent answered already (here: "no paper") and that the broker offers
/// again, because the answer was lost, is answered the same way from the journal and not
/// printed: printing it would let the retried "no paper" undo the print on the broker.
/// The next attempt prints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_already_answered_is_answered_again_not_printed() {
    let broker = FakeBroker::start().await;
    let empty = FakePrinter::start(Behaviour::PaperOut).await;
    let fixed = FakePrinter::start(Behaviour::Healthy).await;
    let state = tempfile::tempdir().expect("tempdir");
    let agent = RunningAgent::start(args(&broker.url(), state.path()));
    broker.state.push(delivery("T1", 1, "p1", &empty.address(), b"x\n"));
    assert_eq!(broker.state.wait_acks(1, WITHIN).await[0].outcome, Outcome::NoPaper);
    broker.state.push(delivery("T1", 1, "p1", &fixed.address(), b"x\n"));
    let acks = broker.state.wait_acks(2, WITHIN).await;
    assert_eq!(acks[1].outcome, Outcome::NoPaper, "{:?}", acks[1]);
    assert!(acks[1].detail.starts_with(ALREADY_REPORTED), "{:?}", acks[1]);
    assert_eq!(fixed.job_count(), 0, "not printed");
    broker.state.push(delivery("T1", 2, "p1", &fixed.address(), b"x\n"));
    assert_eq!(broker.state.wait_acks(3, WITHIN).await[2].outcome, Outcome::Printed);
    assert_eq!(fixed.job_count(), 1);
    // Every ack says who sent it: the agent id and the session of this process's polls.
    let senders = broker.state.ack_senders.lock().expect("senders").clone();
    let polled = broker.state.poll_sessions.lock().expect("sessions").clone();
    assert!(!senders.is_empty());
    for (id, session) in &senders {
        assert!(id.as_deref().is_some_and(|i| i.starts_with("agent-")), "{senders:?}");
        assert_eq!(session.as_deref(), polled.first().map(String::as_str), "{senders:?} {polled:?}");
    }
    assert!(
        polled.first().and_then(|s| onceprint_core::ids::agent_session_started_at(s)).is_some(),
        "the session carries the process's start: {polled:?}"
    );
    agent.stop().await;
}

/// Told by the broker that a newer process with its agent id took over, the agent stops
/// by itself, with an error saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_superseded_agent_stops_and_says_why() {
    let broker = FakeBroker::start().await;
    broker.state.supersede.store(true, Ordering::SeqCst);
    let state = tempfile::tempdir().expect("tempdir");
    let agent = RunningAgent::start(args(&broker.url(), state.path()));
    let result = agent.ended(Duration::from_secs(20)).await;
    let e = result.expect_err("it stops with an error");
    assert!(matches!(e, onceprint_agent::AgentError::Superseded(_)), "{e}");
    assert!(e.to_string().contains("newer process"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_names_the_agent_protocol_version() {
    let broker = FakeBroker::start().await;
    let printer = FakePrinter::start(Behaviour::Healthy).await;
    let state = tempfile::tempdir().expect("tempdir");
    let agent = RunningAgent::start(args(&broker.url(), state.path()));
    broker.state.push(delivery("T1", 1, "p1", &printer.address(), b"versioned\n"));
    broker.state.wait_acks(1, Duration::from_secs(10)).await;
    agent.stop().await;
    let headers = broker.state.protocol_headers.lock().expect("headers").clone();
    assert!(headers.len() >= 2, "a poll and an ack at least: {headers:?}");
    // A broker that names no range (a release before versioning) hears the oldest version.
    let want = onceprint_agent::broker::OLDEST_PROTOCOL.to_string();
    assert!(headers.iter().all(|h| h.as_deref() == Some(want.as_str())), "{headers:?}");
    assert!(broker.state.ack_nexts.lock().expect("nexts").iter().all(Option::is_none), "no `next` for it");
}

/// A broker that serves agent protocol 2 hands out a printer's next job with the answer
/// to the ack of its last one: the agent names 2 once it heard the broker's range, asks
/// for `next` with its acks, and prints what the answer carries without polling for it,
/// in order, once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_broker_that_serves_2_the_next_job_comes_with_the_ack() {
    let broker = FakeBroker::start().await;
    *broker.state.protocols.lock().expect("protocols") = Some((1, 2));
    let printer = FakePrinter::start(Behaviour::Healthy).await;
    for (id, text) in [("N2", b"second\n".as_slice()), ("N3", b"third\n".as_slice())] {
        broker.state.with_acks.lock().expect("with_acks").push_back(delivery(id, 1, "p1", &printer.address(), text));
    }
    let state = tempfile::tempdir().expect("tempdir");
    let agent = RunningAgent::start(args(&broker.url(), state.path()));
    broker.state.push(delivery("N1", 1, "p1", &printer.address(), b"first\n"));
    let acks = broker.state.wait_acks(3, Duration::from_secs(10)).await;
    let polls = broker.state.polls.load(Ordering::SeqCst);
    agent.stop().await;
    let printed: Vec<(&str, Outcome)> = acks.iter().map(|a| (a.task_id.as_str(), a.outcome)).collect();
    assert_eq!(printed, [("N1", Outcome::Printed), ("N2", Outcome::Printed), ("N3", Outcome::Printed)]);
    let jobs = printer.jobs();
    assert_eq!(jobs.len(), 3, "each printed once");
    for (job, text) in jobs.iter().zip([b"first\n".as_slice(), b"second\n", b"third\n"]) {
        assert!(job.windows(text.len()).any(|w| w == text), "in order");
    }
    let nexts = broker.state.ack_nexts.lock().expect("nexts").clone();
    assert!(nexts.len() >= 3 && nexts.iter().all(|n| n.is_some_and(|n| n >= 1)), "{nexts:?}");
    let headers = broker.state.protocol_headers.lock().expect("headers").clone();
    assert_eq!(headers.first().cloned().flatten().as_deref(), Some("1"), "before the broker named its range");
    assert!(headers.iter().skip(1).all(|h| h.as_deref() == Some("2")), "{headers:?}");
    assert!(polls <= 4, "N2 and N3 came with the acks, not from polls ({polls} polls)");
}

/// An agent older (or newer) than the broker serves is told so by the broker's 426; the
/// agent names both sides' versions and waits instead of polling hard or printing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_that_does_not_speak_the_agents_protocol_is_reported_and_waited_for() {
    let broker = FakeBroker::start().await;
    *broker.state.protocols.lock().expect("protocols") = Some((3, 4));
    let client =
        onceprint_agent::broker::BrokerClient::new(&broker.url(), TOKEN, Duration::from_secs(1), None).expect("client");
    let req = onceprint_agent::protocol::PollRequest {
        agent_id: "a".into(),
        wait_ms: 0,
        max: 1,
        session: "s".into(),
        session_age_ms: None,
    };
    match client.poll(&req).await {
        Err(e @ onceprint_agent::broker::BrokerError::ProtocolUnsupported { .. }) => {
            let text = e.to_string();
            assert!(text.contains("agent protocol 1") && text.contains("3-4"), "{text}");
            assert!(text.contains("upgrade the agent"), "the broker's advice is passed on: {text}");
        }
        other => panic!("expected ProtocolUnsupported, got {other:?}"),
    }

    let state = tempfile::tempdir().expect("tempdir");
    let agent = RunningAgent::start(args(&broker.url(), state.path()));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(broker.state.polls.load(Ordering::SeqCst), 2, "the client's poll, then the agent's one try and a wait");
    agent.stop().await;
}

/// Two brokers: the first fails (500 to acks, then 503 to everything: a node going
/// down); the agent moves to the second with the same agent id and session, the ack the
/// first refused is taken by the second, and the polls follow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_fails_over_to_the_next_broker_with_the_same_session() {
    let a = FakeBroker::start().await;
    let b = FakeBroker::start().await;
    let printer = FakePrinter::start(Behaviour::Healthy).await;
    let state = tempfile::tempdir().expect("tempdir");
    let mut agent_args = args(&a.url(), state.path());
    agent_args.server.push(b.url());
    let agent = RunningAgent::start(agent_args);
    a.state.push(delivery("T1", 1, "p1", &printer.address(), b"on a\n"));
    a.state.wait_acks(1, Duration::from_secs(10)).await;
    assert_eq!(b.state.polls.load(Ordering::SeqCst), 0, "the first broker is used while it answers");

    // A hands out T2 but refuses its ack, and then everything.
    a.state.fail_acks.store(1_000, Ordering::SeqCst);
    a.state.push(delivery("T2", 1, "p1", &printer.address(), b"from a, acked on b\n"));
    let acks = b.state.wait_acks(1, Duration::from_secs(20)).await;
    assert_eq!((acks[0].task_id.as_str(), acks[0].outcome), ("T2", Outcome::Printed));
    a.state.unavailable.store(true, Ordering::SeqCst);
    b.state.push(delivery("T3", 1, "p1", &printer.address(), b"on b\n"));
    let acks = b.state.wait_acks(2, Duration::from_secs(20)).await;
    assert_eq!((acks[1].task_id.as_str(), acks[1].outcome), ("T3", Outcome::Printed));
    agent.stop().await;
    assert_eq!(printer.job_count(), 3);
    let on_a = a.state.poll_sessions.lock().expect("sessions").clone();
    let on_b = b.state.poll_sessions.lock().expect("sessions").clone();
    assert!(!on_b.is_empty() && on_b.iter().all(|s| *s == on_a[0]), "one session on both: {on_a:?} {on_b:?}");
    let senders = b.state.ack_senders.lock().expect("senders").clone();
    assert!(senders.iter().all(|(_, s)| s.as_deref() == Some(on_a[0].as_str())), "{senders:?}");
    let ids_a = a.state.agent_ids.lock().expect("ids").clone();
    let ids_b = b.state.agent_ids.lock().expect("ids").clone();
    assert_eq!(ids_a[0], ids_b[0], "one agent id on both");
}

/// The same ticket under another task id (same idempotency key: an order the broker got
/// twice, a task accepted offline and again in the cloud, a broker restored from an
/// older backup) is answered from the journal and never printed again, also after a
/// restart; a crash mid-print makes the other task id in doubt; a receipt and a prebill
/// of one order (two keys) are two tickets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_journal_answers_by_idempotency_key_under_another_task_id() {
    let broker = FakeBroker::start().await;
    let printer = FakePrinter::start(Behaviour::Healthy).await;
    let state = tempfile::tempdir().expect("tempdir");
    // A crash between `started` and the printer's reply left order B7's ticket in doubt.
    {
        let j = Journal::open(state.path(), 1000).expect("journal");
        j.append(Record::new("T7", 1, RecordState::Started, printer.address()).keyed("B7#p1")).await.expect("append");
        j.close().await.expect("close");
    }
    let agent = RunningAgent::start(args(&broker.url(), state.path()));
    let keyed = |task: &str, key: &str, data: &[u8]| {
        let mut d = delivery(task, 1, "p1", &printer.address(), data);
        d.idempotency_key = key.into();
        d
    };

    broker.state.push(keyed("T1", "A1#p1", b"receipt A1\n"));
    let acks = broker.state.wait_acks(1, WITHIN).await;
    assert_eq!(acks[0].outcome, Outcome::Printed, "{:?}", acks[0]);

    // Order A1's receipt again, under task id T2; then its prebill (another print type,
    // another key), which must print; then order B7's ticket under task id T8.
    broker.state.push(keyed("T2", "A1#p1", b"receipt A1\n"));
    broker.state.push(keyed("T3", "A1#p1#prebill", b"prebill A1\n"));
    broker.state.push(keyed("T8", "B7#p1", b"kitchen B7\n"));
    let acks = broker.state.wait_acks(4, WITHIN).await;
    let by_task = |t: &str| acks.iter().find(|a| a.task_id == t).cloned().expect("ack");
    let t2 = by_task("T2");
    assert_eq!(t2.outcome, Outcome::Printed, "{t2:?}");
    assert!(t2.detail.starts_with(KEY_ALREADY_PRINTED) && t2.detail.contains("task T1"), "{t2:?}");
    assert_eq!(by_task("T3").outcome, Outcome::Printed);
    let t8 = by_task("T8");
    assert_eq!(t8.outcome, Outcome::InDoubt, "{t8:?}");
    assert!(t8.detail.starts_with(KEY_IN_DOUBT) && t8.detail.contains("task T7"), "{t8:?}");
    assert_eq!(printer.jobs(), vec![b"receipt A1\n".to_vec(), b"prebill A1\n".to_vec()]);
    agent.stop().await;

    // After a restart: T2 is answered under its own id now, and a third task id with
    // order A1's receipt key still does not print.
    let agent = RunningAgent::start(args(&broker.url(), state.path()));
    broker.state.push(keyed("T2", "A1#p1", b"receipt A1\n"));
    broker.state.push(keyed("T4", "A1#p1", b"receipt A1\n"));
    let acks = broker.state.wait_acks(6, WITHIN).await;
    let again = acks[4..].iter().find(|a| a.task_id == "T2").expect("T2 again");
    assert_eq!((again.outcome, again.detail.as_str()), (Outcome::Printed, ALREADY_PRINTED));
    let t4 = acks[4..].iter().find(|a| a.task_id == "T4").expect("T4");
    assert!(t4.outcome == Outcome::Printed && t4.detail.starts_with(KEY_ALREADY_PRINTED), "{t4:?}");
    assert_eq!(printer.job_count(), 2, "order A1's receipt on paper once");
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_printed_for_a_lan_ticket_leaves_the_cloud_task_in_doubt_until_the_sync_merges_them() {
    use onceprint_agent::outbox::{HistoryEntry, LocalState, OfflineTask, Outbox};
    let broker = FakeBroker::start().await;
    let printer = FakePrinter::start(Behaviour::Healthy).await;
    let state = tempfile::tempdir().expect("tempdir");
    // Order M1's ticket was accepted on the LAN while the broker was out of reach, and
    // printed; the broker has not seen it yet (this fake broker takes no sync).
    {
        let outbox = Outbox::open(state.path()).expect("outbox");
        let lan = OfflineTask {
            task_id: "L1".into(),
            target: "printer:p1".into(),
            biz_no: "M1".into(),
            print_type: "receipt".into(),
            fingerprint: "lan-content".into(),
            request: "{}".into(),
            printer_id: "p1".into(),
            delivery_key: "M1#p1".into(),
            lan_key_id: "k1".into(),
            accepted_at: 1_000,
            state: LocalState::Accepted,
            attempt: 0,
            next_at: 1_000,
            detail: String::new(),
            history: Vec::new(),
            synced: false,
            clock_origin: String::new(),
            clock_ms: 0,
        };
        outbox.insert(lan).await.expect("insert");
        assert_eq!(outbox.start("L1").await.expect("start"), Some(1));
        let printed = HistoryEntry { at: 2_000, attempt: 1, state: "printed".into(), detail: String::new() };
        outbox.finish("L1", 1, LocalState::Printed, 0, printed).await.expect("finish");
        let j = Journal::open(state.path(), 1000).expect("journal");
        j.append(Record::new("L1", 1, RecordState::Printed, "confirmed").keyed("M1#p1")).await.expect("append");
        j.close().await.expect("close");
    }
    let keyed = |task: &str, attempt: u32, reprint: bool| {
        let mut d = delivery(task, attempt, "p1", &printer.address(), b"cloud M1\n");
        d.idempotency_key = "M1#p1".into();
        d.reprint = reprint;
        d
    };

    // The cloud's task under the same key, whose content may differ: in doubt, not printed
    // and not "printed" either, which would overrule the sync's verdict on the content.
    let agent = RunningAgent::start(args(&broker.url(), state.path()));
    broker.state.push(keyed("T9", 1, false));
    let acks = broker.state.wait_acks(1, WITHIN).await;
    assert_eq!(acks[0].outcome, Outcome::InDoubt, "{:?}", acks[0]);
    assert!(acks[0].detail.starts_with(KEY_PRINTED_OFFLINE) && acks[0].detail.contains("LAN task L1"), "{:?}", acks[0]);
    // A reprint on doubt of that task still does not print: the key stays with the
    // LAN ticket that printed it, not with the task that was only in doubt over it.
    broker.state.push(keyed("T9", 2, true));
    let acks = broker.state.wait_acks(2, WITHIN).await;
    assert_eq!(acks[1].outcome, Outcome::InDoubt, "{:?}", acks[1]);
    assert!(acks[1].detail.starts_with(KEY_PRINTED_OFFLINE), "{:?}", acks[1]);
    agent.stop().await;

    // Once the sync merged the LAN ticket into a broker task (same content), that task's
    // delivery is answered printed, without paper.
    Outbox::open(state.path())
        .expect("outbox")
        .synced(vec![("L1".into(), "merged".into(), Some("T10".into()))])
        .await
        .expect("synced");
    let agent = RunningAgent::start(args(&broker.url(), state.path()));
    broker.state.push(keyed("T10", 1, false));
    let acks = broker.state.wait_acks(3, WITHIN).await;
    assert_eq!(acks[2].outcome, Outcome::Printed, "{:?}", acks[2]);
    assert!(acks[2].detail.starts_with(KEY_ALREADY_PRINTED) && acks[2].detail.contains("task L1"), "{:?}", acks[2]);
    assert_eq!(printer.job_count(), 0, "order M1 is on paper once, from the LAN");
    agent.stop().await;
}
