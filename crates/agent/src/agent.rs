//! The agent's main loop: start-up, long polling with backoff, and graceful shutdown.

use crate::acks::{run_ack_sender, NextDeliveries};
use crate::backoff::Backoff;
use crate::broker::{BrokerClient, BrokerError};
use crate::cache::OfflineCache;
use crate::journal::Journal;
use crate::offline::{self, LocalAttempts};
use crate::outbox::Outbox;
use crate::printer::DriverConfig;
use crate::protocol::PollRequest;
use crate::state_dir::StateDir;
use crate::worker::{Dispatcher, WorkerContext};
use crate::{AgentArgs, AgentError};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch, Notify, Semaphore};
use tokio::time::Instant;

/// How long shutdown waits for the last acks to reach the broker. Unsent acks are not
/// lost work: the broker redelivers those tasks and the journal answers them.
const ACK_FLUSH_TIMEOUT: Duration = Duration::from_secs(10);

/// An empty poll answer faster than this means the broker is not long-polling (an old or
/// misconfigured broker); pausing keeps the agent from spinning on it.
const MIN_EMPTY_POLL: Duration = Duration::from_millis(250);

/// Runs the store agent until `shutdown` completes, then stops polling, lets the prints in
/// flight finish, flushes the acks (bounded) and the journal, and returns `Ok`. Errors are
/// returned only for problems at start-up (bad arguments, unusable state directory,
/// damaged journal) and for a journal that fails to flush at the end; the broker being
/// unreachable is never an error, the agent keeps trying.
pub async fn run(args: AgentArgs, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<(), AgentError> {
    let connect_timeout = Duration::from_millis(args.connect_timeout_ms);
    let client =
        BrokerClient::with_brokers(&args.server, args.token.as_str(), connect_timeout, args.ca_cert.as_deref())
            .map_err(|reason| AgentError::Server { url: args.server.join(","), reason })?;

    crate::CLOCK_OFFSET_MS.store(args.test_clock_offset_ms, std::sync::atomic::Ordering::Relaxed);
    // The LAN address is taken first: a wrong or busy one is a start-up error, before
    // anything else runs.
    let listener = match args.listen {
        Some(addr) => Some((
            addr,
            tokio::net::TcpListener::bind(addr).await.map_err(|source| AgentError::Listen { addr, source })?,
        )),
        None => None,
    };

    // Opening the state directory and reading the journal is blocking file IO.
    let state_path = args.state_dir.clone();
    let given_id = args.agent_id.clone();
    let capacity = usize::try_from(args.journal_size).unwrap_or(usize::MAX);
    let listening = args.listen.is_some();
    let (state, agent_id, journal, outbox, cache) = tokio::task::spawn_blocking(move || -> Result<_, AgentError> {
        let state = StateDir::open(&state_path)?;
        let agent_id = state.agent_id(given_id.as_deref())?;
        let journal = Journal::open(state.path(), capacity)?;
        let outbox = Outbox::open(state.path())?;
        let cache = OfflineCache::load(state.path(), listening.then(|| agent_id.clone()));
        Ok((state, agent_id, journal, outbox, cache))
    })
    .await
    .map_err(|e| AgentError::Internal(format!("start-up task: {e}")))??;
    let journal = Arc::new(journal);
    tracing::info!(
        agent_id = %agent_id,
        server = %args.server.join(","),
        state_dir = %state.path().display(),
        journal_task_ids = journal.len(),
        no_printed_ack = ?args.no_printed_ack,
        "store agent started"
    );

    // New at every start: tells the broker that deliveries handed to an earlier session of
    // this agent id will never be acknowledged by that process, so it offers them again
    // once that process is quiet. It carries the start time as a name only: which of two
    // processes with one agent id is the newer the broker decides on its own clock, from
    // the session's age that the polls report (a shop PC's clock may be set back).
    let started_ms = crate::wall_ms();
    let session = onceprint_core::ids::agent_session_id(started_ms, rand::random::<u64>());
    let client = client.identified(&agent_id, &session);

    let (ack_tx, ack_rx) = mpsc::unbounded_channel();
    let unsent_acks = Arc::new(AtomicUsize::new(0));
    // The workers' acks pass a router: those of offline tasks go to the outbox, not to the
    // broker, which does not know those tasks yet.
    let (worker_ack_tx, worker_ack_rx) = mpsc::unbounded_channel();
    let local = LocalAttempts::default();
    let wake = Arc::new(Notify::new());
    tokio::spawn(offline::route_acks(worker_ack_rx, ack_tx, outbox.clone(), local.clone(), wake.clone()));

    let (stopping_tx, stopping_rx) = watch::channel(false);
    let driver = DriverConfig {
        connect_timeout,
        status_timeout: connect_timeout,
        print_timeout: Duration::from_millis(args.print_timeout_ms),
    };
    let mut dispatcher = Dispatcher::new(WorkerContext {
        journal: journal.clone(),
        outbox: outbox.clone(),
        driver,
        printer_idle: Duration::from_millis(args.printer_idle_ms),
        no_printed_ack: args.no_printed_ack.iter().cloned().collect(),
        acks: worker_ack_tx,
        stopping: stopping_rx.clone(),
    });

    // `--max-deliveries`: the permits of every delivery the agent holds, whether a poll
    // or the answer to acks brought it.
    let max = usize::try_from(args.max_deliveries).unwrap_or(usize::MAX).max(1);
    let capacity = Arc::new(Semaphore::new(max));
    let next =
        NextDeliveries { capacity: capacity.clone(), feeder: dispatcher.feeder(), stopping: stopping_rx.clone() };
    let mut ack_task = tokio::spawn(run_ack_sender(client.clone(), ack_rx, unsent_acks.clone(), next));

    let sync = offline::Sync {
        client: client.clone(),
        agent_id: agent_id.clone(),
        outbox: outbox.clone(),
        cache: cache.clone(),
        running: Arc::default(),
    };
    // The offline side: the local lane of tasks accepted on the LAN, their upload, the
    // saved directory and LAN keys, the device-log digest, and the LAN listener.
    let mut background = vec![
        tokio::spawn(offline::run_local_lane(
            outbox.clone(),
            cache.clone(),
            dispatcher.feeder(),
            local,
            wake.clone(),
            stopping_rx.clone(),
        )),
        tokio::spawn(offline::run_sync(sync.clone(), stopping_rx.clone())),
        tokio::spawn(cache.clone().run_refresher(
            client.clone(),
            Duration::from_millis(args.directory_refresh_ms),
            stopping_rx.clone(),
        )),
    ];
    let digest = (args.digest_interval_ms > 0).then(|| {
        tokio::spawn(offline::run_digest(
            client.clone(),
            agent_id.clone(),
            journal.clone(),
            Duration::from_millis(args.digest_interval_ms),
            stopping_rx.clone(),
        ))
    });
    if let Some((addr, listener)) = listener {
        let bound = listener.local_addr().unwrap_or(addr);
        tracing::info!(listen = %bound, "LAN intake listening");
        let app = crate::lan::router(crate::lan::LanState {
            client: Arc::new(client.clone()),
            cache: cache.clone(),
            outbox: outbox.clone(),
            offline_after: Duration::from_millis(args.offline_after_ms),
            down_until: Arc::default(),
            wake: wake.clone(),
        });
        let mut stop = stopping_rx.clone();
        background.push(tokio::spawn(async move {
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stop.wait_for(|s| *s).await;
                })
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "the LAN listener failed");
            }
        }));
    }

    let reporter = (args.status_interval_ms > 0).then(|| {
        tokio::spawn(crate::watch::run_status_reporter(
            client.clone(),
            dispatcher.prober(),
            Duration::from_millis(args.status_interval_ms),
            stopping_rx.clone(),
        ))
    });

    let polling =
        Polling { wait_ms: args.poll_wait_ms, max, capacity, linger: Duration::from_millis(args.poll_linger_ms), sync };
    let ended = poll_loop(&client, &agent_id, &session, &polling, &mut dispatcher, shutdown).await;
    if let PollEnd::Superseded(why) = &ended {
        tracing::error!(
            error = %why,
            "another agent process with this agent id took over; stopping (finishing prints in flight, \
             sending their acks)"
        );
    }

    // Shutdown: no new deliveries are taken; queued ones are left for the broker to
    // redeliver (to this agent id, whose journal then answers); the job each printer is
    // printing now runs to its end, which its timeouts bound.
    tracing::info!("shutting down: no new deliveries; letting prints in flight finish");
    let _ = stopping_tx.send(true);
    if let Some(r) = reporter {
        let _ = r.await;
    }
    for task in background {
        let _ = task.await;
    }
    dispatcher.finish().await;
    if let Some(digest) = digest {
        if let Ok(mark) = digest.await {
            offline::send_final_digest(&client, &agent_id, &journal, mark).await;
        }
    }

    // Every worker is gone, so the ack queue is closed and the sender stops once it is
    // empty.
    match tokio::time::timeout(ACK_FLUSH_TIMEOUT, &mut ack_task).await {
        Ok(Ok(())) => tracing::info!("all acks delivered"),
        Ok(Err(e)) => tracing::error!(error = %e, "the ack sender ended abnormally"),
        Err(_) => {
            ack_task.abort();
            tracing::warn!(
                unsent = unsent_acks.load(Ordering::Relaxed),
                "the broker did not take the last acks in time; it will redeliver those tasks \
                 and the journal will answer them without printing"
            );
        }
    }

    journal.close().await?;
    drop(state);
    tracing::info!("store agent stopped");
    match ended {
        PollEnd::Shutdown => Ok(()),
        PollEnd::Superseded(why) => Err(AgentError::Superseded(why)),
    }
}

/// Why the poll loop ended.
enum PollEnd {
    Shutdown,
    /// The broker said a newer process with this agent id took over.
    Superseded(String),
}

struct Polling {
    wait_ms: u64,
    /// `--max-deliveries`.
    max: usize,
    /// Its permits, shared with the ack sender.
    capacity: Arc<Semaphore>,
    /// `--poll-linger-ms`.
    linger: Duration,
    /// Offline tasks go to the broker before the next poll.
    sync: offline::Sync,
}

async fn poll_loop(
    client: &BrokerClient,
    agent_id: &str,
    session: &str,
    polling: &Polling,
    dispatcher: &mut Dispatcher,
    shutdown: impl Future<Output = ()>,
) -> PollEnd {
    let Polling { wait_ms, max, ref capacity, linger, ref sync } = *polling;
    let mut backoff = Backoff::default();
    tokio::pin!(shutdown);
    let mut last_poll: Option<Instant> = None;
    // A broker that does not speak this agent's protocol is logged once per spell, not at
    // every retry a minute apart.
    let mut protocol_refused = false;
    loop {
        let slot_was_free = capacity.available_permits() > 0;
        // Take as much capacity as is free, waiting for at least one slot: the broker marks
        // what it hands out as sent, so the agent asks only for what it can start soon.
        let mut permits = tokio::select! {
            _ = &mut shutdown => return PollEnd::Shutdown,
            p = capacity.clone().acquire_owned() => match p {
                Ok(p) => p,
                // The semaphore is never closed; should it be, there is nothing to poll for.
                Err(_) => return PollEnd::Shutdown,
            },
        };
        // Under load, printers finish one by one, and polling at each would cost the broker
        // a look at every lane for one delivery. So while other slots are still busy (with
        // every slot free there is nothing to wait for), the poll lingers to let more work
        // gather: after waiting for a free slot, `linger` for more slots to free up; with
        // slots free already, until `linger` after the previous poll went out, so polls
        // are at most one per `linger` and one that took that long anyway waits no more.
        if !linger.is_zero() && capacity.available_permits() + 1 < max {
            let until = if slot_was_free { last_poll.map(|t| t + linger) } else { Some(Instant::now() + linger) };
            if let Some(until) = until.filter(|u| *u > Instant::now()) {
                tokio::select! {
                    _ = &mut shutdown => return PollEnd::Shutdown,
                    _ = tokio::time::sleep_until(until) => {}
                }
            }
        }
        let free = capacity.available_permits().min(max - 1);
        if free > 0 {
            if let Ok(more) = capacity.clone().try_acquire_many_owned(free as u32) {
                permits.merge(more);
            }
        }
        tokio::select! {
            _ = &mut shutdown => return PollEnd::Shutdown,
            _ = sync.pending() => {}
        }
        let req = PollRequest {
            agent_id: agent_id.to_owned(),
            wait_ms,
            max: permits.num_permits(),
            session: session.to_owned(),
            session_age_ms: None,
        };
        let began = Instant::now();
        last_poll = Some(began);
        // Dropping an unanswered poll at shutdown may leave deliveries the broker already
        // handed out unread; they stay unconfirmed and come back to this agent id.
        let answer = tokio::select! {
            _ = &mut shutdown => return PollEnd::Shutdown,
            a = client.poll(&req) => a,
        };
        let pause = match answer {
            Ok(deliveries) => {
                if backoff.failures() > 0 || protocol_refused {
                    tracing::info!(broker = %client.current_broker(), "the broker is reachable again");
                }
                backoff.reset();
                protocol_refused = false;
                let empty = deliveries.is_empty();
                for d in deliveries {
                    tracing::info!(
                        task_id = %d.task_id,
                        attempt = d.attempt,
                        printer_id = %d.printer_id,
                        idempotency_key = %d.idempotency_key,
                        "delivery received"
                    );
                    let permit = if permits.num_permits() > 0 { permits.split(1) } else { None };
                    dispatcher.dispatch(d, permit);
                }
                drop(permits);
                if empty && began.elapsed() < MIN_EMPTY_POLL {
                    Some((MIN_EMPTY_POLL, false))
                } else {
                    None
                }
            }
            Err(BrokerError::Superseded(why)) => return PollEnd::Superseded(why),
            Err(e) => {
                drop(permits);
                let delay = e.retry_delay(&mut backoff);
                let delay_ms = delay.as_millis() as u64;
                match &e {
                    BrokerError::Unauthorized => tracing::error!(error = %e, delay_ms, "poll refused"),
                    // The agent waits rather than stops: the broker (or another node of the
                    // list) may be upgraded, and a stopped agent would need a person to
                    // start it again. It prints nothing meanwhile.
                    BrokerError::ProtocolUnsupported { .. } if !protocol_refused => {
                        protocol_refused = true;
                        tracing::error!(
                            error = %e,
                            agent_protocol = crate::broker::PROTOCOL_VERSION,
                            "the broker cannot serve this agent's protocol version: upgrade the older of the two \
                             (see the broker's message); waiting and asking again every minute"
                        )
                    }
                    BrokerError::ProtocolUnsupported { .. } => tracing::debug!(error = %e, "still refused"),
                    _ => {
                        tracing::warn!(error = %e, delay_ms, failures = backoff.failures(), "poll failed; backing off")
                    }
                }
                // Probed only when no broker answered: one that answered (a 426, a 429)
                // is there, and said how long to wait.
                let unanswered = match &e {
                    BrokerError::Unreachable(_) | BrokerError::Transport(_) => true,
                    BrokerError::Status { status, .. } => *status >= 500,
                    _ => false,
                };
                Some((delay, unanswered))
            }
        };
        match pause {
            // The broker did not answer: the pause ends early once it answers again, to
            // this loop's probes or to any other request of the agent.
            Some((pause, true)) => tokio::select! {
                _ = &mut shutdown => return PollEnd::Shutdown,
                _ = until_answered(client, pause) => {}
            },
            Some((pause, false)) => tokio::select! {
                _ = &mut shutdown => return PollEnd::Shutdown,
                _ = tokio::time::sleep(pause) => {}
            },
            None => {}
        }
    }
}

/// How often a poll loop that backs off asks whether the broker answers again.
const PROBE_EVERY: Duration = Duration::from_secs(2);

/// Waits `pause`, or less: until the broker answers a request again (a probe sent every
/// [`PROBE_EVERY`] with a little jitter, or any other request of the agent, such as the
/// upload of offline tasks). The backoff still spaces the polls of a broker that answers
/// probes but fails polls; a broker that is back gets its agents' polls within seconds.
async fn until_answered(client: &BrokerClient, pause: Duration) {
    let end = Instant::now() + pause;
    loop {
        let jitter = Duration::from_millis(rand::random::<u64>() % 500);
        let next = (Instant::now() + PROBE_EVERY + jitter).min(end);
        tokio::select! {
            _ = client.answered_again() => return,
            _ = tokio::time::sleep_until(next) => {}
        }
        if Instant::now() >= end || client.probe().await {
            return;
        }
    }
}
