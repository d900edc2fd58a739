//! A simulated ESC/POS printer, for demos, tests and benchmarks.
//!
//! This crate owns `onceprint printer-sim`: one or more printers listening on raw TCP
//! (port 9100 by default), or with `--pty` on pseudo-terminals that stand in for printers
//! on a serial port or a USB printer-class device, that parse what they receive with
//! [`onceprint_escpos::parse::Parser`], answer real-time status (`DLE EOT n`) and the
//! printed-acknowledgement (`GS ( H`) the way real printers do, and write every printed
//! job as one JSON line to a paper log — the ground truth a fault-injection test counts
//! duplicates and losses against. Faults can be set at start-up and changed at run time
//! through [`FaultsHandle`] or the optional HTTP control endpoint: paper out and cover
//! open (input is buffered and printed when the fault clears, as real printers do),
//! offline, crash after a job, slow printing, and clone printers that ignore `GS ( H`.
//!
//! It can also be a printer that polls a broker over HTTP (`--cloudprnt URL`, Star
//! CloudPRNT, or `--epson-sdp URL`, Epson Server Direct Print; [`PolledPrinter`]), as such
//! printers do: it speaks only the printer's side of those protocols, with the same paper
//! log and faults (see the `polled` module). With `--mqtt` it is an MQTT printer instead
//! ([`mqtt`]): a Star printer in CloudPRNT Version MQTT mode or a device of onceprint's
//! device protocol, on the same paper log and faults. Such printers see job tokens or
//! idempotency keys, as real ones do.
//!
//! It must never know about tasks beyond what its protocol carries: it is a printer, and
//! only sees bytes, images, job tokens and its own topics. It must never acknowledge a job
//! whose paper-log line was not written: an
//! acknowledgement that the log does not back would hide exactly the losses it exists to
//! reveal.
//!
//! The whole stream of a connection is handled in order, so the reply to a `GS ( H`
//! comes after every job before it was logged. A job is everything up to a cut (`GS V`,
//! `ESC i`, `ESC m`); printable content left without a cut when a connection ends is
//! logged too, with `"cut": "none"`.
//!
//! A pseudo-terminal printer is the same printer behind a different byte stream: status,
//! jobs, the paper log and every fault are handled by the same code. Its device stays
//! open between the agent's opens (so it has no "connections" of its own); a crash makes
//! the device vanish, and the printer comes back shortly after as a new pty (the current
//! path: [`Simulator::pty_path`], and a line on standard output from the command). It is
//! named `pty:N` in the paper log and the control endpoint.
//!
//! Where things are: `polled.rs`, the CloudPRNT and Epson printers that poll; `digest.rs`,
//! the Epson printer's HTTP Digest sign-in (SHA-256 preferred, MD5 when alone; a password TM
//! Web Config would not take is refused); `mqtt.rs`, the Star CloudPRNT MQTT printer and the
//! onceprint device, written from docs/MQTT.md, not from the broker's code.

mod control;
mod digest;
mod faults;
mod jobs;
pub mod mqtt;
mod polled;
mod printer;
#[cfg(unix)]
mod pty;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use faults::{FaultUpdate, Faults, FaultsHandle, PrinterFaults};
pub use jobs::{Barcode, Cut, Jobs, PrintedJob};
pub use polled::{PolledPrinter, Protocol};

/// Why the simulator could not start.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("--count must be at least 1")]
    NoPrinters,
    #[error("{count} printers from port {first} would go past port 65535")]
    PortRange { first: u16, count: usize },
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("cannot open the paper log {}: {source}", path.display())]
    PaperLog { path: PathBuf, source: std::io::Error },
    #[error("no printer {0}")]
    UnknownPrinter(String),
    #[error("cannot create a pseudo-terminal: {0}")]
    Pty(std::io::Error),
    #[error("{0}")]
    Usage(String),
    #[error("--mqtt {0:?} is not mqtt://HOST:PORT")]
    MqttUrl(String),
    #[error("--mqtt needs --device (the device id, or the MAC for cloudprnt)")]
    NoDevice,
}

/// Command-line flags of `onceprint printer-sim`.
#[derive(clap::Args, Debug, Clone)]
pub struct SimArgs {
    /// Address of the (first) printer.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9100")]
    pub listen: SocketAddr,
    /// Number of printers, on consecutive ports from the listen port (with port 0, each
    /// gets its own ephemeral port).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub count: usize,
    /// Serve each printer on a pseudo-terminal instead of TCP, like a printer on a serial
    /// port or a USB printer device: prints `pty:N PATH` for each on standard output
    /// (again when one comes back after a crash); point the agent at `serial://PATH` or
    /// `usb://PATH`.
    #[arg(long, conflicts_with = "listen")]
    pub pty: bool,
    /// Append one JSON line per printed job to FILE.
    #[arg(long, value_name = "FILE")]
    pub paper_log: Option<PathBuf>,
    /// Serve the HTTP control endpoint (GET/PUT /faults, GET /jobs, GET /healthz) on ADDR.
    #[arg(long, value_name = "ADDR")]
    pub control: Option<SocketAddr>,
    /// Start out of paper: jobs are buffered and print when paper goes in.
    #[arg(long)]
    pub paper_out: bool,
    /// Start with the cover open (blocks like --paper-out).
    #[arg(long)]
    pub cover_open: bool,
    /// Start offline: connections are reset.
    #[arg(long)]
    pub offline: bool,
    /// The next N jobs print, then the connection drops before the GS ( H reply.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub crash_mid_job: u32,
    /// Wait MS milliseconds before printing (and acknowledging) each job.
    #[arg(long, value_name = "MS", default_value_t = 0, conflicts_with = "fast")]
    pub slow_ms: u64,
    /// Ignore GS ( H, like many clone printers; real-time status still answers.
    #[arg(long)]
    pub clone: bool,
    /// MQTT devices: the next N jobs print, but their result is never published.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub lose_result: u32,
    /// MQTT devices: the next N results are published twice.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub duplicate_result: u32,
    /// MQTT devices: the next N jobs are received, then the connection drops before they
    /// print or are acknowledged.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub disconnect_mid_job: u32,
    /// MQTT devices: the next N jobs arrive twice, as a QoS 1 redelivery would.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub receive_twice: u32,
    /// Star MQTT printers: a crash is a power cycle that also loses the last ten job
    /// tokens, so a token sent again after it is printed again.
    #[arg(long)]
    pub power_cycle_forgets: bool,
    /// The next N jobs print, then end with an error that can follow printing (Epson
    /// EPTR_CUTTER; CloudPRNT and Star MQTT a code Star does not list; onceprint devices
    /// `error`).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub error_after_print: u32,
    /// Be an MQTT printer instead of a TCP one: an onceprint device on this MQTT server
    /// (mqtt://HOST:PORT), or with --protocol cloudprnt a Star printer, given no URL here
    /// (it learns its MQTT server from the CloudPRNT server's settings, see --server-url):
    /// --crash-mid-job then means "print, then drop the connection before the result" (a
    /// Star printer acknowledges the job first, as at a power cut after printing).
    #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = "")]
    pub mqtt: Option<String>,
    /// MQTT, cloudprnt: the CloudPRNT server URL set on the Star printer
    /// (`http://broker/cloudprnt`); with --username and --password, its HTTP login.
    #[arg(long, value_name = "URL", requires = "mqtt")]
    pub server_url: Option<String>,
    /// MQTT: the device protocol, cloudprnt (Star CloudPRNT Version MQTT) or onceprint.
    #[arg(long, value_parser = ["cloudprnt", "onceprint"], default_value = "onceprint", requires = "mqtt")]
    pub protocol: String,
    /// MQTT: the device id (onceprint) or MAC (cloudprnt) in the topics; also the client id.
    #[arg(long, value_name = "ID", requires = "mqtt", conflicts_with = "fleet")]
    pub device: Option<String>,
    /// Run many printers in this one process, one per line of FILE: the device id (MQTT,
    /// onceprint), MAC (MQTT cloudprnt, or --cloudprnt) or Server Direct Print ID
    /// (--epson-sdp), its username and its password, separated by tabs. They share the
    /// paper log; each behaves as one simulator started with --device, --mac or --id and
    /// that login would. Printers that poll share the control endpoint (faults by printer
    /// name); MQTT devices have none (faults are off).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["username", "password", "mac", "id"])]
    pub fleet: Option<PathBuf>,
    /// No artificial delays. This is already the default (there are none unless
    /// --slow-ms is given); the flag exists so scripts can say so explicitly.
    #[arg(long)]
    pub fast: bool,
    /// Be a Star CloudPRNT printer polling this URL (`https://broker/cloudprnt`) instead
    /// of listening on TCP; needs --username, --password and --mac.
    #[arg(long, value_name = "URL", conflicts_with = "epson_sdp")]
    pub cloudprnt: Option<String>,
    /// Be an Epson Server Direct Print printer polling this URL (`https://broker/epson-sdp`);
    /// needs --username and --password, and --id when the printer is configured with one.
    /// It signs in as a TM printer does, by HTTP Digest after the server's challenge, and
    /// refuses a password TM Web Config would not take (more than 30 characters, or others
    /// than letters, digits, `_`, `.` and `-`).
    #[arg(long, value_name = "URL")]
    pub epson_sdp: Option<String>,
    /// The printer's login (from the broker's answer when the printer was created), for
    /// --cloudprnt, --epson-sdp and --mqtt (a Star MQTT printer's HTTP login).
    #[arg(long, value_name = "USER")]
    pub username: Option<String>,
    /// Printer passwords may begin with `-`, so a value that does is taken as the value.
    #[arg(
        long,
        value_name = "PASSWORD",
        env = "ONCEPRINT_PRINTER_PASSWORD",
        hide_env_values = true,
        allow_hyphen_values = true
    )]
    pub password: Option<String>,
    /// The CloudPRNT printer's MAC address.
    #[arg(long, value_name = "MAC")]
    pub mac: Option<String>,
    /// The Server Direct Print ID.
    #[arg(long, value_name = "ID")]
    pub id: Option<String>,
    /// How often a polling printer polls.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    pub poll_interval_ms: u64,
    /// The media type a CloudPRNT printer asks for when the poll offers it (text/plain
    /// shows the text in the paper log; image/png as most Star printers do); otherwise it
    /// takes the first type offered.
    #[arg(long, value_name = "TYPE", default_value = "text/plain")]
    pub media_type: String,
    /// A CloudPRNT printer's print width in millimetres (72 on an 80 mm roll, 48 on 58 mm),
    /// polling or in MQTT mode: reported with each job GET at 8 dots per millimetre, and
    /// the only image width it prints.
    #[arg(long, value_name = "MM", default_value_t = 72, value_parser = clap::value_parser!(u16).range(40..=112))]
    pub print_width_mm: u16,
    /// A polling printer confirms the next N jobs twice.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub duplicate_confirm: u32,
    /// A polling printer's confirmations of the next N jobs are lost and sent again late.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub lost_result: u32,
}

impl SimArgs {
    /// The simulator configuration these flags describe.
    pub fn config(&self) -> SimConfig {
        SimConfig {
            listen: self.listen,
            count: self.count,
            pty: self.pty,
            paper_log: self.paper_log.clone(),
            control: self.control,
            faults: Faults {
                paper_out: self.paper_out,
                cover_open: self.cover_open,
                offline: self.offline,
                crash_mid_job: self.crash_mid_job,
                slow_ms: if self.fast { 0 } else { self.slow_ms },
                clone: self.clone,
                duplicate_confirm: self.duplicate_confirm,
                lost_result: self.lost_result,
                lose_result: self.lose_result,
                duplicate_result: self.duplicate_result,
                disconnect_mid_job: self.disconnect_mid_job,
                receive_twice: self.receive_twice,
                power_cycle_forgets: self.power_cycle_forgets,
                error_after_print: self.error_after_print,
            },
        }
    }

    /// The polling printers these flags describe, when they ask for some: the one of
    /// [`SimArgs::polled`], or those of the fleet file.
    pub fn polled_fleet(&self) -> Result<Option<Vec<PolledPrinter>>, SimError> {
        let Some(file) = &self.fleet else { return Ok(self.polled()?.map(|p| vec![p])) };
        let (url, cloudprnt) = match (&self.mqtt, &self.cloudprnt, &self.epson_sdp) {
            (Some(_), _, _) => return Ok(None),
            (None, Some(url), _) => (url, true),
            (None, None, Some(url)) => (url, false),
            (None, None, None) => {
                return Err(SimError::Usage("--fleet is for --mqtt, --cloudprnt or --epson-sdp printers".into()))
            }
        };
        let poll_interval = std::time::Duration::from_millis(self.poll_interval_ms.max(10));
        let mut out = Vec::new();
        for (device, username, password) in read_fleet_file(file)? {
            let protocol = if cloudprnt {
                Protocol::CloudPrnt {
                    mac: device,
                    media_type: self.media_type.clone(),
                    print_width_mm: self.print_width_mm,
                }
            } else {
                digest::check_password(&password).map_err(|e| SimError::Usage(format!("{}: {e}", file.display())))?;
                Protocol::EpsonSdp { id: Some(device) }
            };
            out.push(PolledPrinter { url: url.clone(), username, password, protocol, poll_interval });
        }
        Ok(Some(out))
    }

    /// The polling printer these flags describe, when they ask for one.
    pub fn polled(&self) -> Result<Option<PolledPrinter>, SimError> {
        let need = |v: &Option<String>, flag: &str| {
            v.clone().ok_or_else(|| SimError::Usage(format!("{flag} is needed for a printer that polls")))
        };
        let (url, protocol) = match (&self.cloudprnt, &self.epson_sdp) {
            (Some(url), _) => {
                let protocol = Protocol::CloudPrnt {
                    mac: need(&self.mac, "--mac")?,
                    media_type: self.media_type.clone(),
                    print_width_mm: self.print_width_mm,
                };
                (url.clone(), protocol)
            }
            (None, Some(url)) => {
                if let Some(password) = &self.password {
                    digest::check_password(password).map_err(SimError::Usage)?;
                }
                (url.clone(), Protocol::EpsonSdp { id: self.id.clone() })
            }
            (None, None) => return Ok(None),
        };
        Ok(Some(PolledPrinter {
            url,
            username: need(&self.username, "--username")?,
            password: need(&self.password, "--password")?,
            protocol,
            poll_interval: std::time::Duration::from_millis(self.poll_interval_ms.max(10)),
        }))
    }
}

impl SimArgs {
    /// The MQTT printer these flags describe, when they ask for one: an onceprint device
    /// needs the MQTT server's URL; a Star printer needs its CloudPRNT server URL and no
    /// MQTT URL (a Star printer cannot be told one: it takes its MQTT server from the
    /// server's settings).
    pub fn mqtt_config(&self) -> Result<Option<mqtt::MqttSimConfig>, SimError> {
        let Some(url) = &self.mqtt else { return Ok(None) };
        // A fleet names its devices in its file; each takes this one's place.
        let device = match (&self.device, &self.fleet) {
            (Some(d), _) => d.clone(),
            (None, Some(_)) => String::new(),
            (None, None) => return Err(SimError::NoDevice),
        };
        let config = self.config();
        let mut sim = if self.protocol == "cloudprnt" {
            if !url.is_empty() {
                return Err(SimError::Usage(
                    "a Star CloudPRNT printer takes its MQTT server from the server's settings: give --server-url, not an --mqtt URL".into(),
                ));
            }
            let server_url = self.server_url.clone().ok_or_else(|| {
                SimError::Usage("--protocol cloudprnt needs --server-url (the CloudPRNT server URL)".into())
            })?;
            mqtt::MqttSimConfig {
                print_width_mm: self.print_width_mm,
                username: self.username.clone(),
                password: self.password.clone(),
                ..mqtt::MqttSimConfig::cloudprnt(&server_url, &device, "", "")
            }
        } else {
            if self.server_url.is_some() {
                return Err(SimError::Usage("--server-url is for --protocol cloudprnt".into()));
            }
            let (host, port) = mqtt::parse_url(url).ok_or_else(|| SimError::MqttUrl(url.clone()))?;
            mqtt::MqttSimConfig {
                username: self.username.clone(),
                password: self.password.clone(),
                ..mqtt::MqttSimConfig::onceprint(&host, port, &device, "", "")
            }
        };
        sim.paper_log = config.paper_log;
        sim.faults = config.faults;
        Ok(Some(sim))
    }
}

/// What [`Simulator::start`] starts.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Address of the first printer; port 0 gives every printer an ephemeral port.
    pub listen: SocketAddr,
    /// Number of printers.
    pub count: usize,
    /// Printers on pseudo-terminals instead of TCP (`listen` is then not used).
    pub pty: bool,
    pub paper_log: Option<PathBuf>,
    /// Address of the HTTP control endpoint, if any (port 0 is fine).
    pub control: Option<SocketAddr>,
    /// Initial faults of every printer.
    pub faults: Faults,
}

impl SimConfig {
    /// One healthy printer on an ephemeral loopback port, no paper log, no control
    /// endpoint: the usual start for a test, adjusted with struct update syntax.
    pub fn ephemeral() -> SimConfig {
        SimConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            count: 1,
            pty: false,
            paper_log: None,
            control: None,
            faults: Faults::default(),
        }
    }
}

/// A running simulator. Dropping it stops it without waiting; [`Simulator::shutdown`]
/// stops it and waits until every task has ended.
pub struct Simulator {
    /// The TCP printers' addresses; empty for pseudo-terminal printers.
    printers: Vec<SocketAddr>,
    /// Every printer's name, as in the paper log.
    names: Vec<String>,
    /// The current path of each pseudo-terminal printer (`None` while it is away).
    ptys: Vec<watch::Receiver<Option<PathBuf>>>,
    control: Option<SocketAddr>,
    faults: FaultsHandle,
    jobs: Jobs,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Simulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Simulator").field("printers", &self.names).field("control", &self.control).finish()
    }
}

impl Simulator {
    /// Binds every printer (or creates its pseudo-terminal, and the control endpoint) and
    /// starts serving. Must be called inside a Tokio runtime.
    pub async fn start(config: SimConfig) -> Result<Simulator, SimError> {
        let printers = if config.pty { Printers::ptys(config.count)? } else { Printers::bind(&config).await? };
        let control = match config.control {
            Some(addr) => {
                let listener = TcpListener::bind(addr).await.map_err(|source| SimError::Bind { addr, source })?;
                let local = listener.local_addr().map_err(|source| SimError::Bind { addr, source })?;
                Some((listener, local))
            }
            None => None,
        };
        let recorder = Arc::new(jobs::Recorder::open(config.paper_log.as_deref()).await?);
        let names = printers.names();
        let faults = FaultsHandle::new(&names, config.faults);
        let jobs = recorder.jobs();
        let (stop, stop_rx) = watch::channel(false);

        let mut tasks = Vec::with_capacity(names.len() + 1);
        let mut addrs = Vec::new();
        let mut ptys = Vec::new();
        let ctx = |index: usize| {
            Arc::new(printer::PrinterCtx {
                index,
                name: names[index].clone(),
                faults: faults.clone(),
                recorder: recorder.clone(),
            })
        };
        match printers {
            Printers::Tcp(listeners) => {
                for (index, (listener, addr)) in listeners.into_iter().enumerate() {
                    addrs.push(addr);
                    tasks.push(tokio::spawn(printer::run(listener, ctx(index), stop_rx.clone())));
                }
            }
            #[cfg(unix)]
            Printers::Pty(first) => {
                for (index, pty) in first.into_iter().enumerate() {
                    let (path_tx, path_rx) = watch::channel(Some(pty.path().to_owned()));
                    ptys.push(path_rx);
                    tasks.push(tokio::spawn(printer::run_pty(pty, ctx(index), path_tx, stop_rx.clone())));
                }
            }
        }
        let control = control.map(|(listener, local)| {
            tasks.push(tokio::spawn(control::serve(listener, faults.clone(), jobs.clone(), stop_rx.clone())));
            local
        });
        tracing::info!(
            printers = ?names,
            control = ?control,
            paper_log = ?config.paper_log,
            faults = ?config.faults,
            "printer simulator started"
        );
        Ok(Simulator { printers: addrs, names, ptys, control, faults, jobs, stop, tasks })
    }

    /// The TCP printers' addresses, in port order for a fixed listen port; empty when the
    /// printers are pseudo-terminals.
    pub fn printers(&self) -> &[SocketAddr] {
        &self.printers
    }

    /// Every printer's name, as the paper log and the control endpoint name it: the
    /// listening address of a TCP printer, `pty:N` for a pseudo-terminal printer.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The path of pseudo-terminal printer `index` now (`/dev/pts/N`); `None` while it is
    /// away after a crash, or when there is no such printer.
    pub fn pty_path(&self, index: usize) -> Option<PathBuf> {
        self.ptys.get(index).and_then(|rx| rx.borrow().clone())
    }

    /// Follows the path of pseudo-terminal printer `index` as it goes and comes back.
    pub fn watch_pty(&self, index: usize) -> Option<watch::Receiver<Option<PathBuf>>> {
        self.ptys.get(index).cloned()
    }

    /// The control endpoint's address, when one was asked for.
    pub fn control_addr(&self) -> Option<SocketAddr> {
        self.control
    }

    /// Reads and changes faults at run time.
    pub fn faults(&self) -> FaultsHandle {
        self.faults.clone()
    }

    /// What was printed so far.
    pub fn jobs(&self) -> Jobs {
        self.jobs.clone()
    }

    /// Starts one printer that polls a broker (CloudPRNT or Epson Server Direct Print),
    /// with the paper log, initial faults and control endpoint of `config` (its listen
    /// address and count are not used). Its name in the paper log and the fault list is
    /// [`PolledPrinter::name`].
    pub async fn start_polled(printer: PolledPrinter, config: SimConfig) -> Result<Simulator, SimError> {
        Simulator::start_polled_fleet(vec![printer], config).await
    }

    /// Starts many polling printers in one simulator: one paper log, one control endpoint
    /// (each printer's faults by its name, all starting as `config.faults`).
    pub async fn start_polled_fleet(printers: Vec<PolledPrinter>, config: SimConfig) -> Result<Simulator, SimError> {
        if printers.is_empty() {
            return Err(SimError::NoPrinters);
        }
        let control = match config.control {
            Some(addr) => {
                let listener = TcpListener::bind(addr).await.map_err(|source| SimError::Bind { addr, source })?;
                let local = listener.local_addr().map_err(|source| SimError::Bind { addr, source })?;
                Some((listener, local))
            }
            None => None,
        };
        let recorder = Arc::new(jobs::Recorder::open(config.paper_log.as_deref()).await?);
        let names: Vec<String> = printers.iter().map(PolledPrinter::name).collect();
        let faults = FaultsHandle::new(&names, config.faults);
        let jobs = recorder.jobs();
        let (stop, stop_rx) = watch::channel(false);
        let mut tasks = Vec::with_capacity(printers.len() + 1);
        for (index, printer) in printers.into_iter().enumerate() {
            tracing::info!(printer = %printer.name(), url = %printer.url, faults = ?config.faults, "polling printer started");
            tasks.push(tokio::spawn(polled::run(printer, index, faults.clone(), recorder.clone(), stop_rx.clone())));
        }
        let control = control.map(|(listener, local)| {
            tasks.push(tokio::spawn(control::serve(listener, faults.clone(), jobs.clone(), stop_rx.clone())));
            local
        });
        Ok(Simulator { printers: Vec::new(), names, ptys: Vec::new(), control, faults, jobs, stop, tasks })
    }

    /// Stops accepting, drops every connection and waits for all tasks. Input still
    /// buffered in a blocked printer is lost, as when a printer is switched off.
    pub async fn shutdown(mut self) {
        self.stop.send_replace(true);
        for task in std::mem::take(&mut self.tasks) {
            let _ = task.await;
        }
    }
}

impl Drop for Simulator {
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}

/// The printers' byte streams before they are served: TCP listeners with their
/// addresses, or their first pseudo-terminals.
enum Printers {
    Tcp(Vec<(TcpListener, SocketAddr)>),
    #[cfg(unix)]
    Pty(Vec<pty::Pty>),
}

impl Printers {
    async fn bind(config: &SimConfig) -> Result<Printers, SimError> {
        let listeners = bind_printers(config.listen, config.count).await?;
        let mut bound = Vec::with_capacity(listeners.len());
        for listener in listeners {
            let addr = listener.local_addr().map_err(|source| SimError::Bind { addr: config.listen, source })?;
            bound.push((listener, addr));
        }
        Ok(Printers::Tcp(bound))
    }

    #[cfg(unix)]
    fn ptys(count: usize) -> Result<Printers, SimError> {
        if count == 0 {
            return Err(SimError::NoPrinters);
        }
        let ptys = (0..count).map(|_| pty::Pty::open()).collect::<Result<Vec<_>, _>>().map_err(SimError::Pty)?;
        Ok(Printers::Pty(ptys))
    }

    #[cfg(not(unix))]
    fn ptys(_count: usize) -> Result<Printers, SimError> {
        Err(SimError::Pty(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "pseudo-terminal printers need a Unix system",
        )))
    }

    fn names(&self) -> Vec<String> {
        match self {
            Printers::Tcp(listeners) => listeners.iter().map(|(_, addr)| addr.to_string()).collect(),
            #[cfg(unix)]
            Printers::Pty(ptys) => (0..ptys.len()).map(|i| format!("pty:{i}")).collect(),
        }
    }
}

/// Binds `count` printers: consecutive ports from `listen`, or `count` ephemeral ports
/// when its port is 0.
async fn bind_printers(listen: SocketAddr, count: usize) -> Result<Vec<TcpListener>, SimError> {
    if count == 0 {
        return Err(SimError::NoPrinters);
    }
    let first = listen.port();
    if first != 0 && usize::from(first) + count - 1 > usize::from(u16::MAX) {
        return Err(SimError::PortRange { first, count });
    }
    let mut listeners = Vec::with_capacity(count);
    for i in 0..count {
        let mut addr = listen;
        if first != 0 {
            // In range: checked above.
            addr.set_port(first + i as u16);
        }
        let listener = TcpListener::bind(addr).await.map_err(|source| SimError::Bind { addr, source })?;
        listeners.push(listener);
    }
    Ok(listeners)
}

/// The lines of a fleet file (`printer-sim --fleet`): one printer each, its device id, MAC
/// or Server Direct Print ID, its username and its password, separated by tabs; empty lines
/// are skipped.
pub fn read_fleet_file(file: &std::path::Path) -> Result<Vec<(String, String, String)>, SimError> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| SimError::Usage(format!("cannot read the fleet file {}: {e}", file.display())))?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let mut fields = line.split('\t');
        let (Some(device), Some(username), Some(password), None) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return Err(SimError::Usage(format!(
                "{} line {}: expected DEVICE<TAB>USERNAME<TAB>PASSWORD",
                file.display(),
                n + 1
            )));
        };
        out.push((device.to_owned(), username.to_owned(), password.to_owned()));
    }
    if out.is_empty() {
        return Err(SimError::Usage(format!("the fleet file {} names no printer", file.display())));
    }
    Ok(out)
}

/// Runs `onceprint printer-sim` until `shutdown` resolves.
pub async fn run(args: SimArgs, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<(), SimError> {
    if let (Some(config), Some(file)) = (args.mqtt_config()?, &args.fleet) {
        if args.control.is_some() {
            return Err(SimError::Usage("a fleet of MQTT devices has no control endpoint: leave out --control".into()));
        }
        let fleet = mqtt::fleet_configs(&config, file)?;
        let count = fleet.len();
        let shared = mqtt::Shared::open(config.paper_log.as_deref()).await?;
        let mut printers = Vec::with_capacity(count);
        for (n, device) in fleet.into_iter().enumerate() {
            // Started a hundred every 50 ms, as a shop's printers come on over a morning
            // rather than in one instant: ten thousand Star printers asking for their
            // settings at once would each open a connection of their own.
            if n > 0 && n % 100 == 0 {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            printers.push(mqtt::MqttPrinter::start_shared(device, &shared).await?);
        }
        tracing::info!(devices = count, "MQTT device fleet started");
        shutdown.await;
        for p in printers {
            p.shutdown().await;
        }
        return Ok(());
    }
    if let Some(config) = args.mqtt_config()? {
        let url = args.mqtt.clone().unwrap_or_default();
        let control = args.control;
        let printer = mqtt::MqttPrinter::start(config).await?;
        let (stop, stop_rx) = watch::channel(false);
        let control = match control {
            Some(addr) => {
                let listener = TcpListener::bind(addr).await.map_err(|source| SimError::Bind { addr, source })?;
                tracing::info!(control = ?listener.local_addr().ok(), "control endpoint");
                Some(tokio::spawn(control::serve(listener, printer.faults(), printer.jobs(), stop_rx)))
            }
            None => None,
        };
        tracing::info!(mqtt = %url, printer = %printer.name(), "MQTT printer simulator started");
        shutdown.await;
        stop.send_replace(true);
        if let Some(c) = control {
            let _ = c.await;
        }
        printer.shutdown().await;
        return Ok(());
    }
    let sim = match args.polled_fleet()? {
        Some(printers) => Simulator::start_polled_fleet(printers, args.config()).await?,
        None => Simulator::start(args.config()).await?,
    };
    // Pseudo-terminal paths are chosen by the kernel, so the command says where each
    // printer is (and where it is again after a crash), one `pty:N PATH` line each, for a
    // script or a person to give the agent.
    for (index, name) in sim.names().iter().enumerate() {
        let Some(mut path) = sim.watch_pty(index) else { continue };
        let name = name.clone();
        tokio::spawn(async move {
            loop {
                if let Some(p) = path.borrow_and_update().clone() {
                    println!("{name} {}", p.display());
                }
                if path.changed().await.is_err() {
                    break;
                }
            }
        });
    }
    shutdown.await;
    tracing::info!("printer simulator stopping");
    sim.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: SimArgs,
    }

    #[test]
    fn defaults_follow_the_contract() {
        let cli = Cli::try_parse_from(["sim"]).unwrap();
        let config = cli.args.config();
        assert_eq!(config.listen, "127.0.0.1:9100".parse().unwrap());
        assert_eq!(config.count, 1);
        assert!(!config.pty);
        assert_eq!(config.faults, Faults::default());
        assert!(config.paper_log.is_none() && config.control.is_none());
    }

    #[test]
    fn fault_flags_become_initial_faults() {
        let cli = Cli::try_parse_from([
            "sim",
            "--listen",
            "0.0.0.0:9200",
            "--count",
            "3",
            "--paper-log",
            "paper.jsonl",
            "--control",
            "127.0.0.1:9180",
            "--paper-out",
            "--cover-open",
            "--offline",
            "--crash-mid-job",
            "2",
            "--slow-ms",
            "40",
            "--clone",
        ])
        .unwrap();
        let config = cli.args.config();
        assert_eq!(config.count, 3);
        assert_eq!(config.paper_log, Some(PathBuf::from("paper.jsonl")));
        assert_eq!(
            config.faults,
            Faults {
                paper_out: true,
                cover_open: true,
                offline: true,
                crash_mid_job: 2,
                slow_ms: 40,
                clone: true,
                ..Faults::default()
            }
        );
        assert!(Cli::try_parse_from(["sim", "--fast", "--slow-ms", "5"]).is_err(), "--fast contradicts --slow-ms");
        assert_eq!(Cli::try_parse_from(["sim", "--fast"]).unwrap().args.config().faults.slow_ms, 0);
        let pty = Cli::try_parse_from(["sim", "--pty", "--count", "2", "--paper-out"]).unwrap().args.config();
        assert!(pty.pty && pty.faults.paper_out && pty.count == 2, "faults apply to pty printers alike");
        assert!(Cli::try_parse_from(["sim", "--pty", "--listen", "127.0.0.1:9100"]).is_err(), "a pty has no address");
    }

    #[test]
    fn polling_printers_need_their_login() {
        let cli = Cli::try_parse_from([
            "sim",
            "--cloudprnt",
            "http://b/cloudprnt",
            "--username",
            "u",
            "--password",
            "p",
            "--mac",
            "00:11:62:aa:bb:cc",
            "--lost-result",
            "2",
        ])
        .unwrap();
        let p = cli.args.polled().unwrap().unwrap();
        assert_eq!(p.name(), "cloudprnt:00:11:62:aa:bb:cc");
        assert_eq!(cli.args.config().faults.lost_result, 2);
        let no_mac =
            Cli::try_parse_from(["sim", "--cloudprnt", "http://b/cloudprnt", "--username", "u", "--password", "p"]);
        assert!(matches!(no_mac.unwrap().args.polled(), Err(SimError::Usage(m)) if m.contains("--mac")));
        let epson =
            Cli::try_parse_from(["sim", "--epson-sdp", "http://b/epson-sdp", "--username", "u", "--password", "p"]);
        assert_eq!(epson.unwrap().args.polled().unwrap().map(|p| p.name()), Some("epson_sdp:u".into()));
        // A password TM Web Config would not take is refused, as a usage error.
        for password in ["opp_0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", "with space"] {
            let args = ["sim", "--epson-sdp", "http://b/epson-sdp", "--username", "u", "--password", password];
            let refused = Cli::try_parse_from(args).expect("parses").args.polled();
            assert!(matches!(refused, Err(SimError::Usage(m)) if m.contains("TM Web Config")), "{password}");
        }
        // A password may begin with '-'.
        let args = ["sim", "--epson-sdp", "http://b/epson-sdp", "--username", "u", "--password", "-a_b.c"];
        assert!(Cli::try_parse_from(args).expect("parses").args.polled().is_ok_and(|p| p.is_some()));
        assert!(
            Cli::try_parse_from(["sim", "--cloudprnt", "a", "--epson-sdp", "b"]).is_err(),
            "one protocol at a time"
        );
        assert!(Cli::try_parse_from(["sim"]).unwrap().args.polled().unwrap().is_none());
    }

    #[test]
    fn a_star_mqtt_printer_is_given_a_server_url_not_an_mqtt_server() {
        let star = [
            "sim",
            "--mqtt",
            "--protocol",
            "cloudprnt",
            "--server-url",
            "http://b/cloudprnt",
            "--device",
            "00:11:62:aa:bb:cc",
            "--username",
            "u",
            "--password",
            "p",
            "--print-width-mm",
            "48",
        ];
        let config = Cli::try_parse_from(star).unwrap().args.mqtt_config().unwrap().unwrap();
        assert_eq!(config.protocol, mqtt::Protocol::Cloudprnt);
        assert_eq!(config.server_url.as_deref(), Some("http://b/cloudprnt"));
        assert_eq!((config.username.as_deref(), config.password.as_deref()), (Some("u"), Some("p")));
        assert_eq!(config.print_width_mm, 48);
        let with_mqtt_url = [
            "sim",
            "--mqtt",
            "mqtt://h:1883",
            "--protocol",
            "cloudprnt",
            "--server-url",
            "http://b/c",
            "--device",
            "m",
        ];
        let refused = Cli::try_parse_from(with_mqtt_url).unwrap().args.mqtt_config();
        assert!(matches!(refused, Err(SimError::Usage(m)) if m.contains("settings")));
        let no_url = ["sim", "--mqtt", "--protocol", "cloudprnt", "--device", "m"];
        let refused = Cli::try_parse_from(no_url).unwrap().args.mqtt_config();
        assert!(matches!(refused, Err(SimError::Usage(m)) if m.contains("--server-url")));
        let device = ["sim", "--mqtt", "mqtt://h:1884", "--device", "dev-1", "--username", "u", "--password", "p"];
        let config = Cli::try_parse_from(device).unwrap().args.mqtt_config().unwrap().unwrap();
        assert_eq!((config.protocol, config.host.as_str(), config.port), (mqtt::Protocol::Onceprint, "h", 1884));
        assert!(Cli::try_parse_from(["sim", "--mqtt", "--device", "d"]).unwrap().args.mqtt_config().is_err());
    }

    #[tokio::test]
    async fn port_ranges_are_checked() {
        let too_far = SocketAddr::from(([127, 0, 0, 1], 65_535));
        assert!(matches!(bind_printers(too_far, 2).await, Err(SimError::PortRange { .. })));
        assert!(matches!(bind_printers(too_far, 0).await, Err(SimError::NoPrinters)));
    }

    #[test]
    fn a_fleet_file_names_printers_that_poll() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("fleet.tsv");
        std::fs::write(&file, "00:11:62:00:00:01\tu1\tp1\n\n00:11:62:00:00:02\tu2\tp2\n").unwrap();
        let f = file.to_str().unwrap();
        let star = Cli::try_parse_from(["sim", "--cloudprnt", "http://b/cloudprnt", "--fleet", f]).unwrap();
        let printers = star.args.polled_fleet().unwrap().unwrap();
        let names: Vec<String> = printers.iter().map(PolledPrinter::name).collect();
        assert_eq!(names, ["cloudprnt:00:11:62:00:00:01", "cloudprnt:00:11:62:00:00:02"]);
        assert_eq!((printers[1].username.as_str(), printers[1].password.as_str()), ("u2", "p2"));
        // An Epson printer's ID is its first field; a password TM Web Config refuses is refused.
        std::fs::write(&file, "tm1\tu1\tgood-pass\n").unwrap();
        let epson = Cli::try_parse_from(["sim", "--epson-sdp", "http://b/epson-sdp", "--fleet", f]).unwrap();
        assert_eq!(epson.args.polled_fleet().unwrap().unwrap()[0].name(), "epson_sdp:tm1");
        std::fs::write(&file, "tm1\tu1\tbad pass!\n").unwrap();
        let bad = Cli::try_parse_from(["sim", "--epson-sdp", "http://b/epson-sdp", "--fleet", f]).unwrap();
        assert!(matches!(bad.args.polled_fleet(), Err(SimError::Usage(_))));
        // A line without all three fields, and a fleet of no kind, are refused.
        std::fs::write(&file, "tm1\tu1\n").unwrap();
        assert!(matches!(epson.args.polled_fleet(), Err(SimError::Usage(m)) if m.contains("line 1")));
        let neither = Cli::try_parse_from(["sim", "--fleet", f]).unwrap();
        assert!(matches!(neither.args.polled_fleet(), Err(SimError::Usage(_))));
    }
}
