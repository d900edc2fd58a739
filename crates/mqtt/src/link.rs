//! The broker's one connection to its MQTT server: MQTT 3.1.1, QoS 1 both ways, a
//! persistent session under a stable client id, reconnection with backoff.
//!
//! Publishing waits for the server's PUBACK: rumqttc does not tell which PUBACK answers
//! which publish, so the link keeps the order itself. Publishes are handed to rumqttc one
//! at a time under a lock, and rumqttc sends its requests in that order; the first
//! `Outgoing::Publish` with a packet id not seen before belongs to the oldest publish
//! still waiting for one (a packet id already waiting for its PUBACK is a retransmission
//! after a reconnect). When the server did not keep the session, everything not yet
//! acknowledged is lost with it, and every waiter is told so.
//!
//! Incoming messages are never acknowledged here (`manual_acks`): the inbox sends the
//! PUBACK once what the message says is durable.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rumqttc::{AsyncClient, ConnectReturnCode, Event, EventLoop, MqttOptions, Outgoing, Packet, Publish, QoS};
use tokio::sync::{mpsc, oneshot, watch};

use crate::settings::MqttSettings;

/// What a publish came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Published {
    /// The MQTT server has it (PUBACK).
    Acked,
    /// Nothing was handed over: the link is down.
    NotSent,
    /// Handed over, but no PUBACK came in time or the connection broke: it may still
    /// arrive (rumqttc sends it again on a resumed session), or it may be lost.
    Unknown,
}

/// What the link hands to the inbox.
#[derive(Debug)]
pub enum Incoming {
    /// A message on a subscribed topic; acknowledge it with [`Link::ack`].
    Message(Publish),
    /// The link is (again) connected and subscribed. `resumed` says whether the server
    /// kept the session (queued messages will follow) or started a new one.
    Connected { resumed: bool },
}

/// The order of publishes waiting for their packet id and PUBACK.
#[derive(Default)]
struct Waiters {
    /// Handed to rumqttc, no packet id seen yet, oldest first.
    unassigned: VecDeque<oneshot::Sender<Published>>,
    /// Packet id → waiter (the waiter may be gone; the id is still unacknowledged).
    assigned: HashMap<u16, Option<oneshot::Sender<Published>>>,
    /// Packet ids sent and not yet acknowledged.
    unacked: HashSet<u16>,
}

impl Waiters {
    fn fail_all(&mut self) {
        for w in self.unassigned.drain(..) {
            let _ = w.send(Published::Unknown);
        }
        for (_, w) in self.assigned.drain() {
            if let Some(w) = w {
                let _ = w.send(Published::Unknown);
            }
        }
        self.unacked.clear();
    }
}

/// What the transport and the inbox need of the connection to the MQTT server: publish
/// with QoS 1 and learn what became of it, acknowledge what arrived, and know whether the
/// server is reachable and kept the broker's session. [`Link`] is the connection the broker
/// runs; the simulation stands in for the MQTT server with its own, without sockets, so that
/// it can lose, repeat and delay messages and their PUBACKs deterministically.
#[async_trait::async_trait]
pub trait Connection: Send + Sync + 'static {
    /// Whether the MQTT server can be reached now.
    fn is_connected(&self) -> bool;
    /// How many sessions the MQTT server has not kept so far.
    fn lost_sessions(&self) -> u64;
    /// Publishes with QoS 1 (never retained) and waits for the server's PUBACK.
    async fn publish(&self, topic: &str, payload: Vec<u8>) -> Published;
    /// Sends the PUBACK of an incoming message (call once its effect is durable).
    async fn ack(&self, message: &Publish);
}

/// A running link. Cheap to share behind an `Arc`.
pub struct Link {
    client: AsyncClient,
    waiters: Arc<Mutex<Waiters>>,
    /// Held while a publish is handed to rumqttc, so that hand-over order is queue order.
    send_lock: tokio::sync::Mutex<()>,
    connected: watch::Receiver<bool>,
    /// Counts the sessions the MQTT server did not keep: a change means messages in flight
    /// either way may have been lost.
    lost_sessions: Arc<AtomicU64>,
    publish_timeout: Duration,
}

impl Link {
    /// Connects (in the background, retrying with backoff until `shutdown`), subscribes to
    /// `subscriptions` on every connection, and forwards incoming messages to the returned
    /// receiver.
    pub fn start(
        settings: &MqttSettings,
        subscriptions: Vec<String>,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> (Arc<Link>, mpsc::UnboundedReceiver<Incoming>, tokio::task::JoinHandle<()>) {
        let mut options = MqttOptions::new(settings.client_id.clone(), settings.host.clone(), settings.port);
        options.set_keep_alive(Duration::from_secs(10));
        // The server keeps the broker's subscriptions and the results published to it while
        // it is away; the broker acknowledges each one only once it is durable.
        options.set_clean_session(false);
        options.set_manual_acks(true);
        options.set_max_packet_size(4 * 1024 * 1024, 4 * 1024 * 1024);
        if let Some(user) = &settings.username {
            options.set_credentials(user.clone(), settings.password.clone().unwrap_or_default());
        }
        let (client, mut eventloop) = AsyncClient::new(options, 64);
        // Without TCP_NODELAY a job published right after the PUBACK of a result waits, by
        // Nagle's algorithm, for the MQTT server to acknowledge the PUBACK's segment: up to
        // its delayed-ACK time (40 ms on Linux) on every ticket that follows a result.
        let mut network = rumqttc::NetworkOptions::new();
        network.set_tcp_nodelay(true);
        eventloop.set_network_options(network);
        let waiters = Arc::new(Mutex::new(Waiters::default()));
        let (connected_tx, connected) = watch::channel(false);
        let lost_sessions = Arc::new(AtomicU64::new(0));
        let (in_tx, in_rx) = mpsc::unbounded_channel();
        let link = Arc::new(Link {
            client: client.clone(),
            waiters: waiters.clone(),
            send_lock: tokio::sync::Mutex::new(()),
            connected,
            lost_sessions: lost_sessions.clone(),
            publish_timeout: Duration::from_secs(10),
        });
        let task =
            tokio::spawn(run(eventloop, client, subscriptions, waiters, connected_tx, lost_sessions, in_tx, shutdown));
        (link, in_rx, task)
    }

    pub fn is_connected(&self) -> bool {
        *self.connected.borrow()
    }

    /// A watch of [`Link::is_connected`].
    pub fn connected(&self) -> watch::Receiver<bool> {
        self.connected.clone()
    }

    /// How many sessions the MQTT server has not kept so far.
    pub fn lost_sessions(&self) -> u64 {
        self.lost_sessions.load(Ordering::SeqCst)
    }

    /// Publishes with QoS 1 (never retained) and waits for the server's PUBACK.
    pub async fn publish(&self, topic: &str, payload: Vec<u8>) -> Published {
        if !self.is_connected() {
            // rumqttc would queue it for the next connection; the caller should know now
            // that nothing went out.
            return Published::NotSent;
        }
        let rx = {
            let _order = self.send_lock.lock().await;
            let (tx, rx) = oneshot::channel();
            self.waiters.lock().unwrap_or_else(PoisonError::into_inner).unassigned.push_back(tx);
            if self.client.publish(topic, QoS::AtLeastOnce, false, payload).await.is_err() {
                // The event loop is gone (shutdown): take the waiter back out.
                let mut w = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
                w.unassigned.pop_back();
                return Published::NotSent;
            }
            rx
        };
        match tokio::time::timeout(self.publish_timeout, rx).await {
            Ok(Ok(p)) => p,
            Ok(Err(_)) | Err(_) => Published::Unknown,
        }
    }

    /// Sends the PUBACK of an incoming message (call once its effect is durable).
    pub async fn ack(&self, message: &Publish) {
        if let Err(e) = self.client.ack(message).await {
            tracing::debug!(error = %e, "PUBACK not sent: the link is stopping");
        }
    }
}

#[async_trait::async_trait]
impl Connection for Link {
    fn is_connected(&self) -> bool {
        Link::is_connected(self)
    }

    fn lost_sessions(&self) -> u64 {
        Link::lost_sessions(self)
    }

    async fn publish(&self, topic: &str, payload: Vec<u8>) -> Published {
        Link::publish(self, topic, payload).await
    }

    async fn ack(&self, message: &Publish) {
        Link::ack(self, message).await
    }
}

#[allow(clippy::too_many_arguments)]
async fn run(
    mut eventloop: EventLoop,
    client: AsyncClient,
    subscriptions: Vec<String>,
    waiters: Arc<Mutex<Waiters>>,
    connected: watch::Sender<bool>,
    lost_sessions: Arc<AtomicU64>,
    incoming: mpsc::UnboundedSender<Incoming>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    tokio::pin!(shutdown);
    let mut backoff = Duration::from_millis(100);
    let mut ever_connected = false;
    loop {
        let event = tokio::select! {
            _ = &mut shutdown => break,
            event = eventloop.poll() => event,
        };
        match event {
            Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                if ack.code != ConnectReturnCode::Success {
                    tracing::warn!(code = ?ack.code, "the MQTT server refused the broker's connection");
                    continue;
                }
                backoff = Duration::from_millis(100);
                if !ack.session_present {
                    // Whatever was in flight in the old session is gone with it.
                    waiters.lock().unwrap_or_else(PoisonError::into_inner).fail_all();
                    if ever_connected {
                        lost_sessions.fetch_add(1, Ordering::SeqCst);
                    }
                }
                ever_connected = true;
                for topic in &subscriptions {
                    // Subscribing again on a resumed session changes nothing; on a new one
                    // it is what makes the broker hear its printers.
                    // `try_`: this task is the one that drains rumqttc's request queue.
                    if let Err(e) = client.try_subscribe(topic.clone(), QoS::AtLeastOnce) {
                        tracing::warn!(error = %e, %topic, "cannot subscribe");
                    }
                }
                connected.send_replace(true);
                tracing::info!(resumed = ack.session_present, "connected to the MQTT server");
                let _ = incoming.send(Incoming::Connected { resumed: ack.session_present });
            }
            Ok(Event::Incoming(Packet::Publish(p))) => {
                let _ = incoming.send(Incoming::Message(p));
            }
            Ok(Event::Incoming(Packet::PubAck(ack))) => {
                let mut w = waiters.lock().unwrap_or_else(PoisonError::into_inner);
                w.unacked.remove(&ack.pkid);
                if let Some(Some(tx)) = w.assigned.remove(&ack.pkid) {
                    let _ = tx.send(Published::Acked);
                }
            }
            Ok(Event::Outgoing(Outgoing::Publish(pkid))) => {
                let mut w = waiters.lock().unwrap_or_else(PoisonError::into_inner);
                if w.unacked.insert(pkid) {
                    let next = w.unassigned.pop_front();
                    w.assigned.insert(pkid, next);
                }
            }
            Ok(_) => {}
            Err(e) => {
                if *connected.borrow() {
                    tracing::warn!(error = %e, "lost the connection to the MQTT server; reconnecting");
                } else {
                    tracing::debug!(error = %e, "cannot reach the MQTT server; retrying");
                }
                connected.send_replace(false);
                tokio::select! {
                    _ = &mut shutdown => break,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
    }
    connected.send_replace(false);
    // A clean disconnect, so that the server does not keep waiting for this client; the
    // session (clean session off) stays for the next start.
    let _ = client.try_disconnect();
    let _ = tokio::time::timeout(Duration::from_millis(500), async { while eventloop.poll().await.is_ok() {} }).await;
    waiters.lock().unwrap_or_else(PoisonError::into_inner).fail_all();
}
