//! onceprint's MQTT transport (IoT printers over MQTT).
//!
//! This crate owns the broker's connection to an existing MQTT server (`serve
//! --mqtt-url`; [`link`]), the one MQTT driver on the lane engine — the `mqtt`
//! [`transport::MqttTransport`] on the shared push driver, and the [`inbox`] that applies
//! what devices publish — serving two device protocols ([`protocol`]: Star CloudPRNT
//! Version MQTT and onceprint's own, docs/MQTT.md), and the MQTT server's password and ACL
//! files written from the database ([`acl`]).
//!
//! It must never decide what an answer does to a task (that is `LaneEngine::ack` and
//! `onceprint_core::ack`), never acknowledge an incoming message before its effect is
//! durable, never send a job again under a new token or key of its own making (a re-send
//! is the same attempt, which the device prints once), and never take a device's word
//! about a task that is not its own printer's.
//!
//! It is a crate of its own so that the MQTT client and its dependencies stay out of the
//! engine, which every other transport and the agent build on.
//!
//! Where things are: `link.rs`, the connection (QoS 1, persistent session, reconnects,
//! PUBACK waits matched by packet id), and the `Connection` trait through which the
//! transport and the inbox use it (the simulation, docs/SIMULATION.md, stands in for the
//! MQTT server there); `protocol.rs`, both device protocols on the wire;
//! `transport.rs`, `MqttTransport` on the shared push driver (send = publish + PUBACK,
//! queries answered from what the broker knows, reachability); `inbox.rs`, results through
//! `LaneEngine::ack` and statuses into the printer row, PUBACK only after the change is
//! durable, foreign results refused and audited; `devices.rs`, which printer each device is;
//! `acl.rs`, Mosquitto's password and ACL files; `settings.rs`, the MQTT server as the broker
//! and as printers reach it; `job_url.rs`, where a Star printer fetches its `url` jobs (the
//! job GET itself is the CloudPRNT route's, `onceprint_engine::transport::cloudprnt`).

pub mod acl;
pub mod devices;
pub mod inbox;
pub mod job_url;
pub mod link;
pub mod protocol;
pub mod settings;
pub mod transport;

use std::sync::Arc;
use std::time::Duration;

use onceprint_engine::{Claimant, LaneEngine, Lease, PushConfig, PushDriver};

pub use job_url::JobUrl;
pub use settings::{MqttSettings, PrinterFacing};

/// Why the MQTT transport cannot start.
#[derive(Debug, thiserror::Error)]
pub enum MqttError {
    #[error("--mqtt-url {0}")]
    Url(String),
    #[error("--mqtt-printer-url {0}")]
    PrinterUrl(String),
    #[error("the MQTT password and ACL files need the broker's own MQTT login: give --mqtt-username and --mqtt-password (or user:password in --mqtt-url)")]
    NoBrokerLogin,
}

/// The running MQTT transport.
pub struct Running {
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Running {
    /// Waits for every task to end (after the lane engine's shutdown signal).
    pub async fn join(self) {
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// Starts the MQTT transport on `lanes` until the lane engine's shutdown signal.
///
/// The link, the push driver for `mqtt` printers, the inbox and the refresher that learns
/// of new MQTT printers run only while this node holds `lease` (with several broker nodes,
/// one of them speaks MQTT for the cluster): they start when the lease is won and stop
/// when it is lost, and the link then disconnects cleanly. The MQTT server keeps the
/// broker's persistent session under its one client id, so the node that takes the lease
/// over resumes that session with the results queued in it. The ACL writer, when
/// `settings.acl_dir` is set, runs on every node (the files are the node's own).
pub fn start(
    lanes: Arc<LaneEngine>,
    settings: &MqttSettings,
    push: PushConfig,
    lease: Lease,
    job_url: Arc<JobUrl>,
) -> Result<Running, MqttError> {
    let broker_login = match (&settings.acl_dir, &settings.username) {
        (None, _) => None,
        (Some(_), None) => return Err(MqttError::NoBrokerLogin),
        (Some(_), Some(u)) => Some(acl::BrokerLogin {
            username: u.clone(),
            hash: onceprint_engine::secrets::mosquitto_hash(settings.password.as_deref().unwrap_or_default()),
        }),
    };
    let shutdown = {
        let signals = lanes.signals().clone();
        move || {
            let signals = signals.clone();
            async move { signals.shutdown().await }
        }
    };
    let mut tasks = Vec::new();
    {
        let (lanes, settings, lease, signals) = (lanes.clone(), settings.clone(), lease, lanes.signals().clone());
        let job_url = job_url.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = lease.until_held() => {}
                    _ = signals.shutdown() => return,
                }
                tracing::info!(lease = lease.name(), "this node runs the MQTT transport");
                let stop = {
                    let (lease, signals) = (lease.clone(), signals.clone());
                    move || {
                        let (lease, signals) = (lease.clone(), signals.clone());
                        async move {
                            tokio::select! {
                                _ = lease.until_lost() => {}
                                _ = signals.shutdown() => {}
                            }
                        }
                    }
                };
                for t in run_term(&lanes, &settings, push.clone(), lease.clone(), job_url.clone(), stop) {
                    let _ = t.await;
                }
                if signals.is_shutting_down() {
                    return;
                }
                tracing::warn!(lease = lease.name(), "lease lost: the MQTT transport stopped on this node");
            }
        }));
    }
    if let (Some(dir), Some(login)) = (&settings.acl_dir, broker_login) {
        tasks.push(acl::spawn_writer(
            lanes.store().clone(),
            login,
            dir.clone(),
            settings.reload_pid_file.clone(),
            Duration::from_millis(settings.acl_interval_ms),
            shutdown(),
        ));
    }
    Ok(Running { tasks })
}

/// The link, inbox, push driver and refresher of one term of the lease, until `stop`.
fn run_term<F, Fut>(
    lanes: &Arc<LaneEngine>,
    settings: &MqttSettings,
    push: PushConfig,
    lease: Lease,
    job_url: Arc<JobUrl>,
    stop: F,
) -> Vec<tokio::task::JoinHandle<()>>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (link, incoming, link_task) = link::Link::start(settings, protocol::subscriptions(), stop());
    let devices = Arc::new(devices::Devices::default());
    let transport = Arc::new(transport::MqttTransport::new(
        link.clone(),
        devices.clone(),
        Duration::from_millis(settings.resend_after_ms.max(100) as u64),
        settings.star_unknown_after_ms.max(100),
        job_url,
    ));
    let inbox = Arc::new(inbox::Inbox {
        lanes: lanes.clone(),
        link: link.clone(),
        devices: devices.clone(),
        transport: transport.clone(),
        claimant: Claimant::push(onceprint_engine::transport::TransportKind::Mqtt.as_str()),
    });
    vec![
        link_task,
        tokio::spawn(inbox.run(incoming)),
        PushDriver::new(lanes.clone(), transport.clone(), push).with_lease(lease).spawn_until(stop()),
        spawn_refresher(lanes.clone(), link, devices, Duration::from_millis(settings.acl_interval_ms), stop()),
    ]
}

/// Reads the MQTT printers every `interval` and asks a device that was not known before
/// for its status (it may have connected before its printer was created).
fn spawn_refresher(
    lanes: Arc<LaneEngine>,
    link: Arc<link::Link>,
    devices: Arc<devices::Devices>,
    interval: Duration,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        tokio::pin!(shutdown);
        let mut tick = tokio::time::interval(interval);
        let mut first = true;
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tick.tick() => {}
            }
            match devices.refresh(lanes.store().as_ref()).await {
                // At start every device is new; the inbox asks them all once connected.
                Ok(_) if first => first = false,
                Ok(new) => {
                    for addr in new {
                        let (topic, payload) = addr.status_request();
                        let _ = link.publish(&topic, payload).await;
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot read the MQTT printers"),
            }
        }
    })
}
