//! The onceprint store agent (`onceprint agent`).
//!
//! This crate owns the device side of printing: it long-polls the broker for the
//! deliveries of its store's printers (outbound HTTP only, so it works behind NAT),
//! prints each to an ESC/POS printer on raw TCP 9100, a USB printer device or a serial
//! port ([`address`]) through one worker per printer (one job at a time per printer, in
//! arrival order), keeps the durable journal of the last N task ids in its state
//! directory, and acknowledges every outcome through one batching ack sender that
//! retries until the broker has taken the ack.
//!
//! It must never print a task id a second time once it may have printed it. The journal
//! makes `started` durable before the first byte goes to a printer and `printed` durable
//! before the ack, so after a crash, power loss or lost ack: a task the journal says was
//! printed is acknowledged `printed` without printing; one that was started but cannot be
//! proven finished is acknowledged `in_doubt` and left to a person; and a job whose
//! connection (or device) breaks between sending and the printer's confirmation is
//! `in_doubt`, never retried by the agent. "Printed" means the printer's own `GS ( H`
//! process-id reply, never "the write succeeded". The sequence is one and the same
//! for every kind of printer link ([`printer`]). A printer that does not answer its status
//! requests is reported `offline` and never printed to; some USB printers cannot answer
//! at all, and are refused that way rather than printed to blind.
//!
//! Each worker keeps its printer's TCP connection (or device) open from one job to the
//! next (a new connection per job cost the agent and the printer more than the job
//! itself), drops it on any error, timeout or doubt, and closes it after
//! `--printer-idle-ms` (30 s) without a job, so that a printer that serves one client at a
//! time is not held by an idle agent; `--printer-idle-ms 0` restores one connection per
//! job. Under load the poll loop lingers briefly (`--poll-linger-ms`, 5 ms) so that one
//! poll fetches several deliveries.
//!
//! Between jobs the agent watches its store's printers (`--status-interval-ms`, 3 s): it
//! asks each idle printer for its real-time status and reports it to the broker, which
//! learns "out of paper" before the next ticket fails and tells the agent which printers
//! to watch (see `watch`).
//!
//! Printers that ignore `GS ( H` can be listed with `--no-printed-ack`; they are confirmed
//! by a real-time status check after the job instead. That is weaker: it shows the printer
//! is online and has no blocker after the job reached it, not that this job came out of
//! it. Use it only for printers known not to answer `GS ( H`; without it such a printer's
//! every job ends `in_doubt` after `--print-timeout-ms`.
//!
//! It must also never decide anything that belongs to the broker (retries, failover,
//! reprints): an outcome is reported and the broker's engine decides what follows. The
//! ESC/POS bytes and their meaning come from `onceprint-escpos`.
//!
//! Where things are: `broker.rs`, the broker client (one or more brokers, `--server`
//! repeated, used one at a time and failed over on no connection, a timeout, a 5xx or a 426;
//! shared by every clone so that one process is one session; the agent protocol version on
//! every request; the broker's reachability and the probes that end a poll back-off early);
//! `printer.rs`, the one print sequence over a byte link that is a TCP stream or a device
//! file; `address.rs`, `tcp://`, `usb://` and `serial://` addresses; `device.rs`, character
//! devices only, serial ports set to raw 8N1 with termios; `watch.rs`, status probes of idle
//! printers through each printer's worker; `lan.rs`, the shop's LAN intake (`--listen`) with
//! its `/healthz`; `outbox.rs`, the offline outbox (SQLite in the state directory, one task
//! per key, durable before the LAN answer, with the broker's answers to forwards);
//! `cache.rs`, the saved directory, LAN-key hashes and LAN listener claim; `offline.rs`, the
//! local lane, the ack router, the upload of offline tasks and the device-log digest.
//!
//! It must also never answer `printed` for a key printed by a ticket it accepted on the LAN
//! that the sync has not merged into that very task (the content may differ: `in_doubt`);
//! never write to anything but a character device; never print an offline task while it is
//! in an upload the broker may have taken, or one the broker rejected; and never take LAN
//! orders while another agent holds the store's LAN listener.

//!
//! `simulation` (hidden from the documentation) opens the worker's handling of one delivery
//! and printer links over in-process streams to the deterministic simulation
//! (docs/SIMULATION.md), so that it runs the agent's own code rather than a model of it.

#![deny(unsafe_code)]

mod acks;
pub mod address;
mod agent;
pub mod backoff;
pub mod broker;
pub mod cache;
#[cfg(unix)]
mod device;
mod fsutil;
pub mod journal;
mod lan;
mod offline;
pub mod outbox;
pub mod printer;
pub mod protocol;
#[doc(hidden)]
pub mod simulation;
mod state_dir;
pub mod upstream;
mod watch;
mod worker;

pub use agent::run;
pub use journal::{Journal, JournalError, Record, RecordState};
pub use protocol::{Ack, Delivery, Outcome};
pub use worker::{
    ALREADY_IN_DOUBT, ALREADY_PRINTED, ALREADY_REPORTED, KEY_ALREADY_PRINTED, KEY_IN_DOUBT, KEY_PRINTED_OFFLINE,
    STARTED_BEFORE_CRASH,
};

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// `onceprint agent` options.
#[derive(clap::Args, Debug, Clone)]
pub struct AgentArgs {
    /// The broker's base URL (scheme http or https, host, port, optional path prefix).
    /// Repeat it (or give a comma-separated list, also in `ONCEPRINT_SERVER`) for the nodes
    /// of a cluster: the agent uses the first while it answers and fails over to the next
    /// on a connection failure, a timeout or a 5xx (see `broker`).
    #[arg(
        long,
        env = "ONCEPRINT_SERVER",
        value_name = "URL",
        required = true,
        value_delimiter = ',',
        help = "The broker's base URL, e.g. http://broker.example:8080 or https://broker.example; \
                repeat (or comma-separate) for several nodes to fail over between"
    )]
    pub server: Vec<String>,

    /// Certificate authorities (PEM) to trust for an https broker, besides the public ones
    /// built in: for a broker with a private or self-signed certificate.
    #[arg(long, env = "ONCEPRINT_CA_CERT", value_name = "FILE")]
    pub ca_cert: Option<PathBuf>,

    /// The store's agent token (from POST /v1/stores/{id}/agent-tokens).
    #[arg(long, env = "ONCEPRINT_AGENT_TOKEN", value_name = "AGENT_TOKEN", hide_env_values = true)]
    pub token: AgentToken,

    /// Directory for the journal, the agent id and the lock; created if missing.
    #[arg(long, env = "ONCEPRINT_STATE_DIR", value_name = "DIR")]
    pub state_dir: PathBuf,

    /// This agent's id towards the broker. Default: a random id generated once and kept
    /// in the state directory, so a restarted agent gets its unconfirmed deliveries back.
    #[arg(long, env = "ONCEPRINT_AGENT_ID", value_name = "ID")]
    pub agent_id: Option<String>,

    /// How many task ids the journal remembers.
    #[arg(long, default_value_t = 100_000, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub journal_size: u64,

    /// How long one long poll may wait for work, in milliseconds.
    #[arg(long, default_value_t = 25_000, value_name = "MS", value_parser = clap::value_parser!(u64).range(0..=300_000))]
    pub poll_wait_ms: u64,

    /// At most this many deliveries are in the agent (queued or printing) at once.
    #[arg(long, default_value_t = 64, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub max_deliveries: u64,

    /// While deliveries are in progress, let work gather before the next poll so that one
    /// poll fetches several deliveries under load: after waiting for a free slot, wait
    /// this long for more slots to free up; with slots free, poll at most once per this
    /// many milliseconds. Adds at most this much latency; 0 polls at once.
    #[arg(long, env = "ONCEPRINT_POLL_LINGER_MS", default_value_t = 5, value_name = "MS", value_parser = clap::value_parser!(u64).range(0..=1_000))]
    pub poll_linger_ms: u64,

    /// Close a printer's connection (or device) after this long without a job. It is kept
    /// open between jobs to save a TCP handshake (or device open) per job; a printer that
    /// accepts only one client at a time, and a USB printer device, is busy for others
    /// while it is open. 0 closes it after every job.
    #[arg(long, env = "ONCEPRINT_PRINTER_IDLE_MS", default_value_t = 30_000, value_name = "MS", value_parser = clap::value_parser!(u64).range(0..=3_600_000))]
    pub printer_idle_ms: u64,

    /// How long to wait for a printer's GS ( H reply after sending a job, in milliseconds.
    #[arg(long, default_value_t = 15_000, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    pub print_timeout_ms: u64,

    /// Timeout for connecting to a printer (or opening its device) and for each status
    /// answer, in milliseconds.
    #[arg(long, default_value_t = 3_000, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    pub connect_timeout_ms: u64,

    /// Ask idle printers for their status (DLE EOT) this often and report it to the broker,
    /// so that "out of paper" shows before the next ticket fails; a printer that printed
    /// within this time is not asked (its job's answer told). 0 turns it off.
    #[arg(long, env = "ONCEPRINT_STATUS_INTERVAL_MS", default_value_t = 3_000, value_name = "MS", value_parser = clap::value_parser!(u64).range(0..=3_600_000))]
    pub status_interval_ms: u64,

    /// A printer that does not answer GS ( H (many clones): confirm its jobs by a status
    /// check after sending instead. Weaker; repeat for several printers.
    #[arg(long = "no-printed-ack", value_name = "PRINTER_ID")]
    pub no_printed_ack: Vec<String>,

    /// Serve the task submission API (`POST /v1/print-tasks`, with the store's LAN keys)
    /// to the shop's LAN on this address, e.g. `0.0.0.0:8181`: forwarded to the broker
    /// while it answers, accepted and printed here while it does not (docs/OPERATIONS.md, "When the
    /// internet is down").
    #[arg(long, env = "ONCEPRINT_AGENT_LISTEN", value_name = "ADDR")]
    pub listen: Option<std::net::SocketAddr>,

    /// A LAN submission the broker has not answered within this many milliseconds (or
    /// answered 5xx) is accepted offline by the agent.
    #[arg(long, env = "ONCEPRINT_OFFLINE_AFTER_MS", default_value_t = 2_000, value_name = "MS", value_parser = clap::value_parser!(u64).range(50..=60_000))]
    pub offline_after_ms: u64,

    /// How often the store's directory and LAN keys are fetched and saved for offline use.
    #[arg(long, env = "ONCEPRINT_DIRECTORY_REFRESH_MS", default_value_t = 60_000, value_name = "MS", value_parser = clap::value_parser!(u64).range(100..=86_400_000))]
    pub directory_refresh_ms: u64,

    /// How often the journal's new records are uploaded as the device log the store's
    /// reconciliation compares with the broker's (`POST /v1/agent/journal-digest`); 0 off.
    #[arg(long, env = "ONCEPRINT_DIGEST_INTERVAL_MS", default_value_t = 600_000, value_name = "MS", value_parser = clap::value_parser!(u64).range(0..=86_400_000))]
    pub digest_interval_ms: u64,

    /// Tests of the real binary only: this process's wall clock is this many milliseconds
    /// off the machine's (negative: behind), like a shop PC whose clock is wrong.
    #[arg(
        long,
        env = "ONCEPRINT_TEST_AGENT_CLOCK_OFFSET_MS",
        hide = true,
        allow_hyphen_values = true,
        default_value_t = 0
    )]
    pub test_clock_offset_ms: i64,
}

/// The offset of this process's wall clock (`--test-clock-offset-ms`), set once at start.
static CLOCK_OFFSET_MS: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);

thread_local! {
    /// The wall clock the simulation sets for the agent code it runs on this thread
    /// (`simulation::set_wall_clock`); never set in the agent itself.
    pub(crate) static SIM_WALL_MS: std::cell::Cell<Option<i64>> = const { std::cell::Cell::new(None) };
    /// The same for the machine's clock since boot (`boot_clock`).
    pub(crate) static SIM_BOOT_MS: std::cell::Cell<Option<i64>> = const { std::cell::Cell::new(None) };
}

/// This process's wall clock, in milliseconds since the Unix epoch: the machine's, unless a
/// test moved it. Nothing the broker orders by comes from it (session order is decided on
/// the broker's clock); it names sessions, dates offline tickets and journal records.
pub(crate) fn wall_ms() -> i64 {
    if let Some(ms) = SIM_WALL_MS.with(std::cell::Cell::get) {
        return ms;
    }
    let now =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0);
    now + CLOCK_OFFSET_MS.load(std::sync::atomic::Ordering::Relaxed)
}

/// The machine's clock since boot in milliseconds, with the boot it counts from: a clock
/// that no setting of the wall clock moves. On Linux it is `CLOCK_BOOTTIME` under the
/// kernel's boot id, so it also holds across restarts of the agent; elsewhere, this
/// process's monotonic clock under an id of the process. Offline tickets record it when
/// they are accepted, so that the upload can say how long ago that was (`age_ms`) and the
/// broker place the acceptance on its own clock exactly, whatever the wall clock did.
pub(crate) fn boot_clock() -> (&'static str, i64) {
    if let Some(ms) = SIM_BOOT_MS.with(std::cell::Cell::get) {
        return ("simulated", ms);
    }
    boot::now()
}

#[cfg(target_os = "linux")]
mod boot {
    use std::sync::OnceLock;

    static BOOT_ID: OnceLock<String> = OnceLock::new();

    pub(super) fn now() -> (&'static str, i64) {
        let id = BOOT_ID.get_or_init(|| {
            std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
                .map(|s| format!("boot:{}", s.trim()))
                .unwrap_or_else(|_| format!("process:{}:{}", std::process::id(), super::wall_ms()))
        });
        let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
        (id.as_str(), t.tv_sec.saturating_mul(1000).saturating_add(t.tv_nsec / 1_000_000))
    }
}

#[cfg(not(target_os = "linux"))]
mod boot {
    use std::sync::OnceLock;
    use std::time::Instant;

    static START: OnceLock<(String, Instant)> = OnceLock::new();

    pub(super) fn now() -> (&'static str, i64) {
        let (id, start) =
            START.get_or_init(|| (format!("process:{}:{}", std::process::id(), super::wall_ms()), Instant::now()));
        (id.as_str(), start.elapsed().as_millis() as i64)
    }
}

/// The agent token; its `Debug` output is redacted so that logging the arguments never
/// leaks it.
#[derive(Clone, PartialEq, Eq)]
pub struct AgentToken(pub String);

impl AgentToken {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for AgentToken {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(AgentToken(s.to_owned()))
    }
}

impl fmt::Debug for AgentToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AgentToken(<redacted>)")
    }
}

impl From<&str> for AgentToken {
    fn from(s: &str) -> Self {
        AgentToken(s.to_owned())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("--server {url}: {reason}")]
    Server { url: String, reason: String },
    #[error("agent id {0:?}: ids are 1-64 characters of A-Za-z0-9._:-")]
    AgentId(String),
    #[error("agent id file {path}: {reason}; fix or remove it (removing it makes this a new agent to the broker)")]
    AgentIdFile { path: PathBuf, reason: String },
    #[error("state directory {path}: {source}")]
    StateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("state directory {0} is in use by another agent process (one agent per state directory)")]
    Locked(PathBuf),
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error(transparent)]
    Outbox(#[from] outbox::OutboxError),
    #[error("--listen {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("the agent failed internally: {0}")]
    Internal(String),
    /// The broker refused this process: a newer one with the same agent id took over.
    #[error("stopped: {0}")]
    Superseded(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        agent: AgentArgs,
    }

    #[test]
    fn arguments_parse_with_the_documented_defaults() {
        let cli = Cli::try_parse_from([
            "agent",
            "--server",
            "http://127.0.0.1:8080",
            "--token",
            "secret-token",
            "--state-dir",
            "/var/lib/onceprint-agent",
            "--no-printed-ack",
            "p1",
            "--no-printed-ack",
            "p2",
        ]);
        let a = cli.map_err(|e| e.to_string()).expect("parses").agent;
        assert_eq!(a.token.as_str(), "secret-token");
        assert_eq!((a.journal_size, a.poll_wait_ms, a.max_deliveries), (100_000, 25_000, 64));
        assert_eq!((a.print_timeout_ms, a.connect_timeout_ms), (15_000, 3_000));
        assert_eq!((a.poll_linger_ms, a.printer_idle_ms), (5, 30_000));
        assert_eq!(a.no_printed_ack, ["p1", "p2"]);
        assert_eq!(a.agent_id, None);
        assert_eq!(a.server, ["http://127.0.0.1:8080"]);
        assert!(!format!("{a:?}").contains("secret-token"), "the token never shows in Debug output");
    }

    #[test]
    fn several_brokers_are_given_by_repeating_the_flag_or_as_a_list() {
        let base = ["agent", "--token", "t", "--state-dir", "d"];
        let repeated = Cli::try_parse_from(base.iter().chain(&["--server", "http://a:1", "--server", "http://b:2"]));
        let listed = Cli::try_parse_from(base.iter().chain(&["--server", "http://a:1,http://b:2"]));
        for cli in [repeated, listed] {
            assert_eq!(cli.map_err(|e| e.to_string()).expect("parses").agent.server, ["http://a:1", "http://b:2"]);
        }
        assert!(Cli::try_parse_from(base).is_err(), "at least one --server is required");
    }

    #[test]
    fn a_zero_journal_size_is_refused() {
        let cli = Cli::try_parse_from([
            "agent",
            "--server",
            "http://x:1",
            "--token",
            "t",
            "--state-dir",
            "d",
            "--journal-size",
            "0",
        ]);
        assert!(cli.is_err());
    }
}
