//! The `onceprint` binary: parses the command line and wires the crates together. It holds
//! no logic of its own beyond choosing the database backend from the URL.

mod backup;
mod config;
mod probe;
mod reconcile;

/// mimalloc instead of the system allocator: intake allocates many small, short-lived
/// objects per request across threads, where it measured faster (docs/BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use onceprint_server::AdminToken;
use onceprint_store::Store;

#[derive(Parser)]
#[command(name = "onceprint", version, about = "Self-hosted print-task broker: print exactly once, lose nothing.")]
struct Cli {
    /// Log lines as text (default) or as JSON, one object per line with the request's
    /// span (request_id, method, path, task_id) for log collectors.
    #[arg(long, global = true, env = "ONCEPRINT_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the broker: HTTP API, the lane engine (agent long polls, the webhook push driver,
    /// the sweeper and the lane watchdog), alert delivery.
    Serve(config::ServeArgs),
    /// The store agent: pulls deliveries for its store's printers, prints, acknowledges.
    Agent {
        #[command(flatten)]
        args: onceprint_agent::AgentArgs,
        /// Threads that run the agent's async work: its printers' connections, its HTTP to
        /// the broker and on the shop's LAN (default 1: a printed ticket costs the agent
        /// well under a millisecond, and on a shop's small machine, or beside the broker,
        /// more threads only wait for each other; the journal has a thread of its own).
        #[arg(long, env = "ONCEPRINT_AGENT_WORKER_THREADS", value_name = "N", default_value_t = 1,
              value_parser = clap::value_parser!(u16).range(1..=1024))]
        worker_threads: u16,
    },
    /// A simulated ESC/POS network printer (or several) with a paper log and faults; with
    /// --mqtt, a simulated MQTT printer (Star CloudPRNT or onceprint device protocol).
    PrinterSim {
        #[command(flatten)]
        args: onceprint_printer_sim::SimArgs,
        /// Threads that run the simulated printers (default 1, like a printer's own
        /// controller; more only compete with the broker and agent on a test machine).
        #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1024))]
        worker_threads: u16,
    },
    /// Write the MQTT server's password file (DIR/passwd) and ACL file (DIR/acl) from the
    /// printers in the database, for Mosquitto's password_file and acl_file; reload it
    /// with SIGHUP afterwards. Takes the same settings as serve (database, MQTT login).
    MqttAcl {
        #[command(flatten)]
        serve: config::ServeArgs,
        /// The directory to write the files into.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// Render a receipt document (JSON) or cloud markup to ESC/POS, text or a PNG preview.
    Render {
        /// escpos, text or png.
        #[arg(long, value_parser = ["escpos", "text", "png"])]
        to: String,
        /// A built-in profile, e.g. escpos-58-gb18030 (default: the document's paper at
        /// escpos-80-gb18030).
        #[arg(long)]
        profile: Option<String>,
        /// The file is cloud markup (<CB>, <BR>, <QR> …), not a JSON document. Files ending
        /// in .txt are taken as markup too.
        #[arg(long)]
        markup: bool,
        /// Write here instead of standard output.
        #[arg(long, short)]
        out: Option<PathBuf>,
        /// The document or markup file ("-" for standard input).
        file: PathBuf,
    },
    /// A store's daily reconciliation; exits 1 when the day has differences (for cron).
    Reconcile(reconcile::ReconcileArgs),
    /// A consistent copy of the broker's SQLite database, taken while it runs (SQLite's
    /// online backup API). For PostgreSQL use pg_dump.
    Backup(backup::BackupArgs),
    /// One HTTP GET of URL: exits 0 on a 2xx answer, 1 otherwise (no answer within the
    /// timeout included). For health checks where no curl is installed, e.g. the container
    /// image's HEALTHCHECK on /readyz.
    Probe(probe::ProbeArgs),
    /// The whole promise in one command: a broker on a temporary SQLite file, two simulated
    /// printers (one runs out of paper during the rush), a store agent, a lunch rush of
    /// tickets with retries, a live progress line, the day's reconciliation and the
    /// console's URL with a demo login. Runs until Ctrl-C (or --exit); removes its files.
    Demo {
        /// The broker's port on 127.0.0.1 (the console's URL); 0 picks a free one.
        #[arg(long, default_value_t = 8080)]
        port: u16,
        /// Tickets in the lunch rush.
        #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=1000))]
        tickets: u64,
        /// Stop after the report instead of keeping the broker up for the console.
        #[arg(long)]
        exit: bool,
    },
    /// Simulation testing: fault schedules drawn from seeds, played against the real
    /// broker code (intake, lanes, transports, manual actions, failover) under a simulated
    /// clock and network, checked against the promise after every step. Exits 1 with the
    /// failing seed and a shrunk schedule when a run breaks the promise (docs/SIMULATION.md).
    Sim(onceprint_sim::cli::SimArgs),
    /// Benchmarks against a fresh broker started by this command.
    Bench {
        #[command(subcommand)]
        which: BenchCommand,
    },
}

/// A full database for `bench submit` and `bench e2e` (whose cost must stay flat).
#[derive(clap::Args, Debug, Clone, Copy)]
struct PreloadArgs {
    /// Finished tasks (printed, some failed or cancelled, with their audit events and
    /// ledger entries) written into the fresh database before the measured run, created
    /// over the past days on the bench store and other stores. Not measured.
    #[arg(long, default_value_t = 0, value_name = "N")]
    preload_finished: usize,
    /// Waiting (pending) tasks written before the measured run, on printers of other
    /// stores that nobody polls. Not measured.
    #[arg(long, default_value_t = 0, value_name = "M")]
    preload_waiting: usize,
}

impl PreloadArgs {
    fn options(self) -> onceprint_bench::PreloadOptions {
        onceprint_bench::PreloadOptions { finished: self.preload_finished, waiting: self.preload_waiting }
    }
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Rendering speed of a typical 40-line receipt to ESC/POS and PNG, on one core.
    Render {
        /// Seconds per measurement.
        #[arg(long, default_value_t = 2.0)]
        seconds: f64,
    },
    /// N submissions from C concurrent HTTP connections with a share of duplicates.
    Submit {
        /// Database of the fresh broker: none for a new SQLite file, or postgres://… (a
        /// fresh schema is created there and dropped afterwards).
        #[arg(long)]
        database: Option<String>,
        /// Submissions measured (one task each, however many go per HTTP request).
        #[arg(long, default_value_t = 200_000)]
        requests: usize,
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
        /// Submissions per HTTP request: 1 sends each to POST /v1/print-tasks; 2–500 send
        /// that many consecutive ones together to POST /v1/print-task-batches (warm-up too).
        #[arg(long, default_value_t = 1, value_name = "K")]
        batch: usize,
        /// Share of requests that repeat an earlier key (0.0–1.0).
        #[arg(long, default_value_t = 0.30)]
        duplicates: f64,
        #[arg(long, default_value_t = 10)]
        printers: usize,
        /// Requests sent before measuring.
        #[arg(long, default_value_t = 5_000)]
        warmup: usize,
        /// Broker nodes on the one PostgreSQL database behind the bench's load balancer.
        #[arg(long, default_value_t = 1)]
        nodes: usize,
        #[command(flatten)]
        preload: PreloadArgs,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delivery end to end: broker, store agent and simulated printers as processes; N
    /// tasks submitted concurrently and judged by the printers' paper log.
    E2e {
        /// Database of the fresh broker: none for a new SQLite file, or postgres://… (a
        /// fresh schema is created there and dropped afterwards).
        #[arg(long)]
        database: Option<String>,
        /// Simulated printers (consecutive loopback ports), tasks spread round-robin.
        #[arg(long, default_value_t = 100)]
        printers: usize,
        #[arg(long, default_value_t = 50_000)]
        tasks: usize,
        /// Submission connections.
        #[arg(long, default_value_t = 32)]
        concurrency: usize,
        /// Tasks per HTTP request: 1 sends each to POST /v1/print-tasks; 2–500 send that
        /// many consecutive ones together to POST /v1/print-task-batches.
        #[arg(long, default_value_t = 1, value_name = "K")]
        batch: usize,
        /// kill -9 the agent once this share of the tasks is printed, restart it at once,
        /// and measure until printing resumes (must be ≤ 5 s).
        #[arg(long, value_name = "FRACTION")]
        kill_agent_at: Option<f64>,
        /// Give up when submitting and printing take longer than this.
        #[arg(long, default_value_t = 600)]
        timeout_secs: u64,
        /// Broker nodes on the one PostgreSQL database behind the bench's load balancer.
        #[arg(long, default_value_t = 1)]
        nodes: usize,
        #[command(flatten)]
        preload: PreloadArgs,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// A fleet of Star CloudPRNT printers polling a fresh broker (each with its own
    /// login and connection): polls/s, poll latency, broker CPU per poll and peak RSS;
    /// with --tasks, jobs are fetched and confirmed as a printer does.
    /// Fairness under a retry storm: one tenant's submission latency alone and while
    /// another tenant sends at many times its rate limit.
    Fairness {
        /// Database of the fresh broker: none for a new SQLite file, or postgres://….
        #[arg(long)]
        database: Option<String>,
        /// The tenants' rate limit, requests per second (burst the same).
        #[arg(long, default_value_t = 100.0)]
        limit: f64,
        /// The storm sends this many times the limit.
        #[arg(long, default_value_t = 20.0)]
        storm_factor: f64,
        /// The quiet tenant's submissions per second (below the limit).
        #[arg(long, default_value_t = 50.0)]
        quiet_rate: f64,
        /// Seconds per phase.
        #[arg(long, default_value_t = 20.0)]
        seconds: f64,
        /// Connections of the storm.
        #[arg(long, default_value_t = 16)]
        storm_connections: usize,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// A TCP round-robin load balancer over several `serve` nodes, for manual runs: one
    /// connection to one backend, the next connection to the next, backends whose
    /// `/readyz` does not answer 200 left out (checked every 300 ms). No retries.
    Lb {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
        /// A node, as http://HOST:PORT; repeat for each node.
        #[arg(long = "backend", value_name = "URL", required = true)]
        backends: Vec<String>,
    },
    /// Many idle store agents long-polling one broker (one store each): the broker's
    /// memory and CPU while they wait, and intake with and without them.
    Idle {
        /// Database of the fresh broker: none for a new SQLite file, or postgres://… (a
        /// fresh schema is created there and dropped afterwards).
        #[arg(long)]
        database: Option<String>,
        #[arg(long, default_value_t = 10_000)]
        agents: usize,
        /// The agents' long-poll wait.
        #[arg(long, default_value_t = 25_000)]
        wait_ms: u64,
        /// Submissions per intake measurement (one without agents, one with).
        #[arg(long, default_value_t = 50_000)]
        requests: usize,
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
        /// Share of requests that repeat an earlier key (0.0–1.0).
        #[arg(long, default_value_t = 0.30)]
        duplicates: f64,
        /// An extra argument for the broker's `serve` (repeatable), e.g.
        /// `--serve-arg=--poll-recheck-ms=1000`.
        #[arg(long = "serve-arg", value_name = "ARG", allow_hyphen_values = true)]
        serve_args: Vec<String>,
        /// The broker executable to measure (default: this one), e.g. the previous
        /// commit's build for a side-by-side figure.
        #[arg(long, value_name = "PATH")]
        broker: Option<PathBuf>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// N MQTT printers of one protocol on one broker node, all devices in one simulator
    /// process: the broker's CPU and RSS while they are idle, then one ticket each
    /// (submission answered → on paper, percentiles; printed/s), each checked on paper
    /// exactly once.
    Mqtt {
        /// Database of the fresh broker: none for a new SQLite file, or postgres://… (a
        /// fresh schema is created there and dropped afterwards).
        #[arg(long)]
        database: Option<String>,
        #[arg(long, default_value_t = 10_000)]
        devices: usize,
        /// onceprint (the device protocol of docs/MQTT.md) or star (Star CloudPRNT in
        /// MQTT mode, `url` jobs).
        #[arg(long, value_parser = ["onceprint", "star"], default_value = "onceprint")]
        protocol: String,
        /// Devices per store.
        #[arg(long, default_value_t = 1)]
        per_store: usize,
        /// Seconds the idle broker is measured once every device is online.
        #[arg(long, default_value_t = 30.0)]
        idle_secs: f64,
        /// Tickets sent one at a time to idle devices, --gap-ms apart (their latency is
        /// reported apart from the batches').
        #[arg(long, default_value_t = 200)]
        latency_samples: usize,
        #[arg(long, default_value_t = 100)]
        gap_ms: u64,
        /// Tickets per POST /v1/print-task-batches for the other devices.
        #[arg(long, default_value_t = 100)]
        batch: usize,
        /// Use the MQTT server listening on 127.0.0.1 at this port (default: start a
        /// Mosquitto of the run's own; it needs a file descriptor per device).
        #[arg(long, value_name = "PORT")]
        mqtt_port: Option<u16>,
        /// Longest wait for every ticket to be on paper.
        #[arg(long, default_value_t = 300)]
        drain_timeout_secs: u64,
        /// The broker executable to measure (default: this one), e.g. the previous
        /// commit's build for a side-by-side figure; the devices always run on this one.
        #[arg(long, value_name = "PATH")]
        broker: Option<PathBuf>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    Polls {
        /// Database of the fresh broker: none for a new SQLite file, or postgres://… (a
        /// fresh schema is created there and dropped afterwards).
        #[arg(long)]
        database: Option<String>,
        #[arg(long, default_value_t = 1_000)]
        printers: usize,
        /// Each printer polls this often.
        #[arg(long, default_value_t = 2_000)]
        interval_ms: u64,
        /// Measured seconds (after one interval of warm-up).
        #[arg(long, default_value_t = 30.0)]
        seconds: f64,
        /// Tasks submitted while the printers poll.
        #[arg(long, default_value_t = 0)]
        tasks: usize,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Two nodes on one PostgreSQL schema: how fast a task committed on node A wakes a
    /// long poll waiting on node B (percentiles over the rounds), and intake on A with the
    /// node link off and on.
    Wakeup {
        /// The PostgreSQL database (postgres://…); a fresh schema is created there and
        /// dropped afterwards.
        #[arg(long)]
        database: String,
        #[arg(long, default_value_t = 500)]
        rounds: usize,
        /// Seconds of intake per phase (link off, link on).
        #[arg(long, default_value_t = 5.0)]
        intake_seconds: f64,
        /// Connections of the intake phases.
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// The fault run: broker, store agent and simulated printers as processes under
    /// printer faults (paper out, cover open, offline, crash mid-job, slow), kill -9 of the
    /// agent and the broker, and client retry storms; then faults stop and every lane must
    /// drain. Judged by the paper log: no task printed twice, none lost, doubt honest.
    /// Exits non-zero on any problem.
    Faults {
        /// Database of the fresh broker: none for a new SQLite file, or postgres://… (a
        /// fresh schema is created there and dropped afterwards).
        #[arg(long)]
        database: Option<String>,
        /// Tasks submitted (each once, plus the repeats).
        #[arg(long, default_value_t = 10_000)]
        tasks: usize,
        /// Simulated printers; tasks are spread over them at random (seeded).
        #[arg(long, default_value_t = 8)]
        printers: usize,
        /// Also this many Star CloudPRNT printers polling the broker (one simulator each).
        #[arg(long, default_value_t = 0)]
        cloudprnt: usize,
        /// Also this many Epson Server Direct Print printers polling the broker.
        #[arg(long, default_value_t = 0)]
        epson: usize,
        /// Also this many MQTT devices (onceprint protocol) on a Mosquitto the run starts.
        #[arg(long, default_value_t = 0)]
        mqtt: usize,
        /// Also this many Star CloudPRNT printers in MQTT mode on that Mosquitto; every
        /// other one forgets its remembered job tokens when it loses power.
        #[arg(long, default_value_t = 0)]
        mqtt_star: usize,
        /// Submission connections (keep-alive; each request retried until answered).
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
        /// Seed of the submission plan, the printer faults and the kill moments.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Share of tasks whose submission is repeated 1–4 times (some racing the original).
        #[arg(long, default_value_t = 0.30)]
        duplicates: f64,
        /// Submissions are spread over this many seconds; faults and kills fall into them.
        #[arg(long, default_value_t = 30)]
        fault_window_secs: u64,
        /// Mean quiet time between two faults of one printer, in milliseconds.
        #[arg(long, default_value_t = 4_000)]
        fault_every_ms: u64,
        /// kill -9 the agent this many times (restarted with the same state directory).
        #[arg(long, default_value_t = 5)]
        agent_kills: usize,
        /// kill -9 the broker this many times (restarted on the same database and port);
        /// with several nodes, the nodes in turn.
        #[arg(long, default_value_t = 3)]
        broker_kills: usize,
        /// Broker nodes on the one PostgreSQL database behind the bench's load balancer;
        /// the agent, the printers and the submitters talk to the balancer.
        #[arg(long, default_value_t = 1)]
        nodes: usize,
        /// Start a redis-server for the nodes (`serve --redis-url`) and kill -9 it once
        /// half-way through the fault window.
        #[arg(long)]
        redis: bool,
        /// After faults stop, every lane must drain within this many seconds.
        #[arg(long, default_value_t = 120)]
        drain_timeout_secs: u64,
        /// Submitting and the fault phase must end within this many seconds.
        #[arg(long, default_value_t = 600)]
        timeout_secs: u64,
        /// Audit trails checked: every task not printed, and printed ones up to this many.
        #[arg(long, default_value_t = 1_000)]
        audit_sample: usize,
        /// Keep the run's directory (process logs, paper log, agent journal, SQLite file)
        /// and print where it is, to look behind a finding.
        #[arg(long)]
        keep_dir: bool,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Time to paper under a lunch rush, with the broker's default settings (rate limits
    /// on): one store agent with ESC/POS printers (and optionally printers that call the
    /// broker), each printing at a set speed; tickets at an even rate, a share sent again
    /// with the same key. Reports submission → paper p50/p95/p99 per transport, the
    /// printers' own time, the time queued behind a printer's previous ticket, and the
    /// broker and agent's share (docs/BENCHMARKS.md, "Time to paper under a rush"), with
    /// the 429s the broker gave. Exits non-zero when a ticket is lost or printed twice.
    Rush {
        /// Database of the fresh broker: none for a new SQLite file, or postgres://… (a
        /// fresh schema is created there and dropped afterwards).
        #[arg(long)]
        database: Option<String>,
        /// The store agent's ESC/POS printers (one simulator).
        #[arg(long, default_value_t = 60)]
        printers: usize,
        /// Also this many Star CloudPRNT printers polling the broker (one simulator each).
        #[arg(long, default_value_t = 0)]
        cloudprnt: usize,
        /// Also this many Epson Server Direct Print printers polling the broker.
        #[arg(long, default_value_t = 0)]
        epson: usize,
        /// Also this many MQTT devices (onceprint protocol) on a Mosquitto the run starts.
        #[arg(long, default_value_t = 0)]
        mqtt: usize,
        /// How often the CloudPRNT and Epson printers poll, in ms (their wait for their
        /// next poll is reported apart from the broker's share).
        #[arg(long, default_value_t = 100)]
        poll_interval_ms: u64,
        /// Tickets a second (first submissions; the repeats come on top).
        #[arg(long, default_value_t = 75.0)]
        rate: f64,
        /// Tickets are submitted over this many seconds.
        #[arg(long, default_value_t = 20.0)]
        seconds: f64,
        /// Each printer's own time per ticket in ms: one value, or LOW-HIGH to give each
        /// printer its own time from that range.
        #[arg(long, default_value = "500", value_parser = parse_ms_range)]
        print_ms: (u64, u64),
        /// Share of tickets whose submission is repeated 1–4 times with the same key.
        #[arg(long, default_value_t = 0.30)]
        retries: f64,
        /// Send each ticket to a printer drawn at random (bursts and queues behind busy
        /// printers) instead of to the printers in turn (each printer one ticket every
        /// PRINTERS / RATE seconds).
        #[arg(long)]
        random_printers: bool,
        /// Submission connections (keep-alive; 429 and 5xx answers are retried).
        #[arg(long, default_value_t = 32)]
        concurrency: usize,
        /// Seed of the submission plan.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Start the broker with its rate limits off (what it can do, not what a shop
        /// sees); the report says so.
        #[arg(long)]
        rate_limits_off: bool,
        /// The onceprint executable whose broker, agent and printer simulators run
        /// (default: this one), to measure an earlier build with the same bench.
        #[arg(long)]
        exe: Option<PathBuf>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// A shop whose internet line keeps dropping. Broker,
    /// store agent with its LAN listener (reaching the broker through a proxy the run cuts
    /// and restores) and simulated printers as processes; orders submitted to the cloud,
    /// to the agent's LAN listener or to both, each sent again 1–3 times. Judged by the
    /// paper log, the answers and the day's reconciliation: no order printed twice, none
    /// lost, one task per order. Exits non-zero on any problem.
    Offline {
        /// Database of the fresh broker: none for a new SQLite file, or postgres://… (a
        /// fresh schema is created there and dropped afterwards).
        #[arg(long)]
        database: Option<String>,
        /// Orders submitted.
        #[arg(long, default_value_t = 5_000)]
        tasks: usize,
        /// Simulated printers of the store agent.
        #[arg(long, default_value_t = 4)]
        printers: usize,
        /// Length of each online period of the shop's line, in milliseconds.
        #[arg(long, default_value_t = 8_000)]
        online_ms: u64,
        /// Length of each offline period (the proxy drops every byte both ways).
        #[arg(long, default_value_t = 8_000)]
        offline_ms: u64,
        /// The orders' first submissions are spread evenly over this many seconds.
        #[arg(long, default_value_t = 48.0)]
        window_secs: f64,
        /// Shares of orders sent to the cloud only, to the LAN only and to both.
        #[arg(long, default_value = "40/40/20")]
        mix: onceprint_bench::offline::Mix,
        /// Each submission is sent again between this many…
        #[arg(long, default_value_t = 1)]
        min_resends: usize,
        /// …and this many times, with the same body.
        #[arg(long, default_value_t = 3)]
        max_resends: usize,
        /// SIGKILL the agent every this many seconds during the submissions (restarted at
        /// once on the same state directory and listener), whatever the line is doing.
        #[arg(long, value_name = "S", conflicts_with = "kill_agent_every_ms")]
        kill_agent_every: Option<f64>,
        /// The same in milliseconds.
        #[arg(long, value_name = "MS")]
        kill_agent_every_ms: Option<u64>,
        /// Every edge below at once (needs --kill-agent-every[-ms] for the clock skew).
        #[arg(long)]
        edges: bool,
        /// In the second half of each online period the line holds the broker's answers
        /// for --hold-ms, past the agent's patience: forwards the broker took are also
        /// accepted offline, and merged at the sync.
        #[arg(long)]
        slow_forwards: bool,
        /// How long the line holds answers in a slow period, in milliseconds.
        #[arg(long, default_value_t = 1_500)]
        hold_ms: u64,
        /// A CloudPRNT printer polling through the shop's line and the station kitchen =
        /// [that printer, p0], named by 8 % of the orders (one way each: cloud or LAN).
        #[arg(long)]
        mixed_station: bool,
        /// The station bar (one agent printer), moved to another agent printer in the
        /// middle of every cut; 8 % of the orders name it (one way each).
        #[arg(long)]
        station_change: bool,
        /// 1 % of the LAN orders carry content over 4096 bytes; the broker is restarted
        /// with max_content_bytes = 4096 in the last cut: their syncs are rejected
        /// (alerted, kept by the agent) and later sends answered 400.
        #[arg(long)]
        rejected_merges: bool,
        /// In the first half of every second online period the line answers 502 to the
        /// agent's POST /v1/agent/offline-tasks and passes everything else.
        #[arg(long)]
        failing_uploads: bool,
        /// A second agent of the store with a LAN listener; 5 % of the LAN re-sends go to
        /// it once and must be answered 503 lan_listener_taken.
        #[arg(long)]
        second_agent: bool,
        /// The agent's lives have their clock off by 0, +2 h and -1 day in turn.
        #[arg(long)]
        clock_skew: bool,
        /// Connections of each side (cloud and LAN).
        #[arg(long, default_value_t = 8)]
        concurrency: usize,
        /// Seed of the orders, their sides and their re-sends.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Once the line is back for good, everything must settle within this many seconds.
        #[arg(long, default_value_t = 180)]
        drain_timeout_secs: u64,
        /// Every submission must be answered within this many seconds after the window.
        #[arg(long, default_value_t = 300)]
        timeout_secs: u64,
        /// Keep the run's directory (process logs, paper log, agent state, SQLite file).
        #[arg(long)]
        keep_dir: bool,
        /// Also write the report as JSON to this file.
        #[arg(long, value_name = "FILE")]
        json_out: Option<PathBuf>,
        /// Print the report as JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

fn init_logging(format: LogFormat, default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    if format == LogFormat::Json {
        // One JSON object per line; the request's span (with its request_id and task_id)
        // is in "span", the chain of spans in "spans".
        tracing_subscriber::fmt()
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init();
        return;
    }
    // Colours only for a person at a terminal; log files and CI get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi).init();
}

async fn open_store(url: &str, pool_size: usize) -> anyhow::Result<Arc<dyn Store>> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let store = onceprint_store_postgres::PostgresStore::connect(url, pool_size)
            .await
            .with_context(|| "cannot open the PostgreSQL database")?;
        Ok(Arc::new(store))
    } else if url.starts_with("sqlite:") {
        let store =
            onceprint_store_sqlite::SqliteStore::open_url(url).with_context(|| "cannot open the SQLite database")?;
        Ok(Arc::new(store))
    } else {
        anyhow::bail!("--database must be sqlite://PATH or postgres://…, got {url:?}")
    }
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutdown requested: no new connections; finishing requests in flight");
}

async fn serve(cfg: config::Resolved) -> anyhow::Result<()> {
    let worker_threads = cfg.worker_threads;
    let store = open_store(&cfg.database, cfg.postgres_pool_size).await?;
    let (hash, how) = onceprint_server::settle_admin_token(store.as_ref(), cfg.admin_token.as_deref()).await?;
    let scheme = if cfg.http.tls.is_some() { "https" } else { "http" };
    let bound = onceprint_server::bind(store.clone(), hash, &cfg.listen, cfg.http).await?;
    let addr = bound.local_addr()?;
    {
        let mut out = std::io::stdout().lock();
        if let AdminToken::Generated(token) = &how {
            writeln!(out, "admin token (shown once, keep it safe): {token}")?;
        }
        // Scripts and the benchmark wait for this exact line.
        writeln!(out, "listening on {scheme}://{addr}")?;
        out.flush()?;
    }
    if how == AdminToken::Stored {
        tracing::info!("using the admin token generated at an earlier start (pass --admin-token to replace it)");
    }
    tracing::info!(%addr, backend = store.backend(), worker_threads, "onceprint serving");
    bound.serve(shutdown_signal()).await?;
    tracing::info!("stopped cleanly");
    Ok(())
}

async fn mqtt_acl(args: config::ServeArgs, out: PathBuf) -> anyhow::Result<()> {
    let cfg = config::resolve(args)?;
    let Some(mqtt) = cfg.http.mqtt else {
        anyhow::bail!("mqtt-acl needs --mqtt-url (the broker's login is written too)")
    };
    let Some(username) = mqtt.username.clone() else { return Err(onceprint_mqtt::MqttError::NoBrokerLogin.into()) };
    let store = open_store(&cfg.database, 2).await?;
    let broker = onceprint_mqtt::acl::BrokerLogin {
        username,
        hash: onceprint_engine::secrets::mosquitto_hash(mqtt.password.as_deref().unwrap_or_default()),
    };
    let files = onceprint_mqtt::acl::render(store.as_ref(), &broker).await?;
    onceprint_mqtt::acl::write(&out, &files).with_context(|| format!("cannot write into {}", out.display()))?;
    println!(
        "wrote {} and {}",
        out.join(onceprint_mqtt::acl::PASSWORD_FILE).display(),
        out.join(onceprint_mqtt::acl::ACL_FILE).display()
    );
    Ok(())
}

async fn bench(which: BenchCommand) -> anyhow::Result<()> {
    match which {
        BenchCommand::Render { seconds } => {
            let reports = tokio::task::spawn_blocking(move || {
                onceprint_render::bench::run(std::time::Duration::from_secs_f64(seconds.max(0.1)))
            })
            .await?
            .map_err(|e| anyhow::anyhow!("{e}"))?;
            for r in reports {
                println!("{r}");
            }
            Ok(())
        }
        BenchCommand::Submit {
            database,
            requests,
            concurrency,
            batch,
            duplicates,
            printers,
            warmup,
            nodes,
            preload,
            json,
        } => {
            let broker_exe: PathBuf = std::env::current_exe().context("cannot find this executable")?;
            let report = onceprint_bench::run_submit(onceprint_bench::SubmitOptions {
                broker_exe,
                database,
                requests,
                concurrency,
                batch,
                duplicate_share: duplicates,
                printers,
                warmup,
                nodes,
                preload: preload.options(),
            })
            .await?;
            print_report(json, &report, report.render_text(), report.problems.len())
        }
        BenchCommand::E2e {
            database,
            printers,
            tasks,
            concurrency,
            batch,
            kill_agent_at,
            timeout_secs,
            nodes,
            preload,
            json,
        } => {
            let exe: PathBuf = std::env::current_exe().context("cannot find this executable")?;
            let report = onceprint_bench::run_e2e(onceprint_bench::E2eOptions {
                exe,
                database,
                printers,
                tasks,
                concurrency,
                batch,
                kill_agent_at,
                timeout: std::time::Duration::from_secs(timeout_secs),
                nodes,
                preload: preload.options(),
            })
            .await?;
            print_report(json, &report, report.render_text(), report.problems.len())
        }
        BenchCommand::Fairness { database, limit, storm_factor, quiet_rate, seconds, storm_connections, json } => {
            let exe: PathBuf = std::env::current_exe().context("cannot find this executable")?;
            let report = onceprint_bench::run_fairness(onceprint_bench::FairnessOptions {
                broker_exe: exe,
                database,
                limit,
                storm_factor,
                quiet_rate,
                seconds,
                storm_connections,
            })
            .await?;
            print_report(json, &report, report.render_text(), report.problems.len())
        }
        BenchCommand::Lb { listen, backends } => {
            onceprint_bench::lb::run_lb(listen, &backends, shutdown_signal()).await?;
            Ok(())
        }
        BenchCommand::Idle {
            database,
            agents,
            wait_ms,
            requests,
            concurrency,
            duplicates,
            serve_args,
            broker,
            json,
        } => {
            let exe: PathBuf = match broker {
                Some(b) => b,
                None => std::env::current_exe().context("cannot find this executable")?,
            };
            let report = onceprint_bench::run_idle(onceprint_bench::IdleOptions {
                broker_exe: exe,
                database,
                agents,
                wait_ms,
                requests,
                concurrency,
                duplicate_share: duplicates,
                broker_args: serve_args,
            })
            .await?;
            print_report(json, &report, report.render_text(), report.problems.len())
        }
        BenchCommand::Mqtt {
            database,
            devices,
            protocol,
            per_store,
            idle_secs,
            latency_samples,
            gap_ms,
            batch,
            mqtt_port,
            drain_timeout_secs,
            broker,
            json,
        } => {
            let exe: PathBuf = std::env::current_exe().context("cannot find this executable")?;
            let report = onceprint_bench::run_mqtt(onceprint_bench::MqttBenchOptions {
                broker_exe: broker.unwrap_or_else(|| exe.clone()),
                exe,
                database,
                devices,
                protocol: if protocol == "star" {
                    onceprint_bench::MqttBenchProtocol::Star
                } else {
                    onceprint_bench::MqttBenchProtocol::Onceprint
                },
                per_store,
                idle_secs,
                latency_samples: latency_samples.min(devices),
                gap: std::time::Duration::from_millis(gap_ms),
                batch,
                mqtt_port,
                drain_timeout: std::time::Duration::from_secs(drain_timeout_secs),
            })
            .await?;
            print_report(json, &report, report.render_text(), report.problems.len())
        }
        BenchCommand::Polls { database, printers, interval_ms, seconds, tasks, json } => {
            let exe: PathBuf = std::env::current_exe().context("cannot find this executable")?;
            let report = onceprint_bench::run_polls(onceprint_bench::PollsOptions {
                broker_exe: exe,
                database,
                printers,
                interval: std::time::Duration::from_millis(interval_ms),
                seconds,
                tasks,
            })
            .await?;
            print_report(json, &report, report.render_text(), report.problems.len())
        }
        BenchCommand::Wakeup { database, rounds, intake_seconds, concurrency, json } => {
            let exe: PathBuf = std::env::current_exe().context("cannot find this executable")?;
            let report = onceprint_bench::run_wakeup(onceprint_bench::WakeupOptions {
                broker_exe: exe,
                database,
                rounds,
                intake_seconds,
                concurrency,
            })
            .await?;
            print_report(json, &report, report.render_text(), report.problems.len())
        }
        BenchCommand::Faults {
            database,
            tasks,
            printers,
            cloudprnt,
            epson,
            mqtt,
            mqtt_star,
            concurrency,
            seed,
            duplicates,
            fault_window_secs,
            fault_every_ms,
            agent_kills,
            broker_kills,
            nodes,
            redis,
            drain_timeout_secs,
            timeout_secs,
            audit_sample,
            keep_dir,
            json,
        } => {
            let exe: PathBuf = std::env::current_exe().context("cannot find this executable")?;
            let report = onceprint_bench::run_faults(onceprint_bench::FaultsOptions {
                exe,
                database,
                tasks,
                printers,
                fleet: onceprint_bench::faults::fleet::Fleet { cloudprnt, epson, mqtt, mqtt_star },
                concurrency,
                seed,
                repeat_share: duplicates,
                fault_window: std::time::Duration::from_secs(fault_window_secs),
                fault_every: std::time::Duration::from_millis(fault_every_ms),
                agent_kills,
                broker_kills,
                nodes,
                redis,
                drain_timeout: std::time::Duration::from_secs(drain_timeout_secs),
                timeout: std::time::Duration::from_secs(timeout_secs),
                audit_sample,
                keep_dir,
            })
            .await?;
            print_report(json, &report, report.render_text(), report.problems.len())
        }
        BenchCommand::Rush {
            database,
            printers,
            cloudprnt,
            epson,
            mqtt,
            poll_interval_ms,
            rate,
            seconds,
            print_ms,
            retries,
            random_printers,
            concurrency,
            seed,
            rate_limits_off,
            exe,
            json,
        } => {
            let exe = match exe {
                Some(exe) => exe,
                None => std::env::current_exe().context("cannot find this executable")?,
            };
            let report = onceprint_bench::run_rush(onceprint_bench::RushOptions {
                database,
                printers,
                fleet: onceprint_bench::faults::fleet::Fleet { cloudprnt, epson, mqtt, mqtt_star: 0 },
                rate,
                seconds,
                print_ms,
                repeat_share: retries,
                spread: if random_printers {
                    onceprint_bench::faults::schedule::Spread::Random
                } else {
                    onceprint_bench::faults::schedule::Spread::RoundRobin
                },
                concurrency,
                seed,
                rate_limits_off,
                poll_interval_ms,
                ..onceprint_bench::RushOptions::new(exe)
            })
            .await?;
            print_report(json, &report, report.render_text(), report.problems.len())
        }
        BenchCommand::Offline {
            database,
            tasks,
            printers,
            online_ms,
            offline_ms,
            window_secs,
            mix,
            min_resends,
            max_resends,
            kill_agent_every,
            kill_agent_every_ms,
            edges,
            slow_forwards,
            hold_ms,
            mixed_station,
            station_change,
            rejected_merges,
            failing_uploads,
            second_agent,
            clock_skew,
            concurrency,
            seed,
            drain_timeout_secs,
            timeout_secs,
            keep_dir,
            json_out,
            json,
        } => {
            let exe: PathBuf = std::env::current_exe().context("cannot find this executable")?;
            let secs =
                |s: f64| std::time::Duration::try_from_secs_f64(s).context("a duration in seconds must be positive");
            let report = onceprint_bench::run_offline(onceprint_bench::OfflineOptions {
                exe,
                database,
                tasks,
                printers,
                online: std::time::Duration::from_millis(online_ms),
                offline: std::time::Duration::from_millis(offline_ms),
                window: secs(window_secs)?,
                mix,
                resends: (min_resends, max_resends),
                kill_agent_every: match kill_agent_every_ms {
                    Some(ms) => Some(std::time::Duration::from_millis(ms)),
                    None => kill_agent_every.map(secs).transpose()?,
                },
                concurrency,
                seed,
                drain_timeout: std::time::Duration::from_secs(drain_timeout_secs),
                timeout: std::time::Duration::from_secs(timeout_secs),
                keep_dir,
                edges: onceprint_bench::offline::Edges {
                    slow_forwards: edges || slow_forwards,
                    mixed_station: edges || mixed_station,
                    station_change: edges || station_change,
                    rejected_merges: edges || rejected_merges,
                    failing_uploads: edges || failing_uploads,
                    second_agent: edges || second_agent,
                    clock_skew: edges || clock_skew,
                },
                hold: std::time::Duration::from_millis(hold_ms),
            })
            .await?;
            if let Some(path) = json_out {
                std::fs::write(&path, serde_json::to_vec_pretty(&report)?)
                    .with_context(|| format!("cannot write {}", path.display()))?;
            }
            print_report(json, &report, report.render_text(), report.problems.len())
        }
    }
}

fn render(to: &str, profile: Option<&str>, markup: bool, out: Option<PathBuf>, file: &PathBuf) -> anyhow::Result<()> {
    use std::io::Read as _;
    let mut input = Vec::new();
    if file.as_os_str() == "-" {
        std::io::stdin().read_to_end(&mut input)?;
    } else {
        input = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    }
    if let Some(p) = profile {
        onceprint_engine::content::check_profile(p).map_err(|e| anyhow::anyhow!("--profile: {e}"))?;
    }
    let kind = if markup || file.extension().is_some_and(|e| e == "txt") { "markup" } else { "doc" };
    let doc = onceprint_engine::content::document_of(kind, &input)
        .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?
        .ok_or_else(|| anyhow::anyhow!("no document"))?;
    let (bytes, _) =
        onceprint_engine::content::render_document(&doc, profile, to).map_err(|e| anyhow::anyhow!("{e}"))?;
    match out {
        Some(path) => std::fs::write(&path, bytes).with_context(|| format!("cannot write {}", path.display()))?,
        None => {
            let mut stdout = std::io::stdout().lock();
            stdout.write_all(&bytes)?;
            stdout.flush()?;
        }
    }
    Ok(())
}

/// Asks the kernel not to back this process's memory with transparent huge pages.
/// mimalloc marks its arenas for huge pages, so one small allocation in a fresh 2 MiB
/// region made the whole 2 MiB resident: with 10,000 agents' long polls spread over the
/// arenas, that was a third of the broker's RSS (`bench idle`). Intake measured
/// no slower without them. Only `serve` does this; failing (an old kernel) changes nothing.
fn no_transparent_huge_pages() {
    // prctl is Linux's alone; elsewhere (an agent built for Windows) there is nothing to do.
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_THP_DISABLE only sets a flag on this process's memory map.
    let _ = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
}

/// Prints a benchmark report as JSON or text; a report with problems fails the command.
/// `500` or `500-1500`: milliseconds, one value or a range.
fn parse_ms_range(s: &str) -> Result<(u64, u64), String> {
    let parse = |v: &str| v.trim().parse::<u64>().map_err(|_| format!("{v:?} is not a number of milliseconds"));
    let (lo, hi) = match s.split_once('-') {
        Some((lo, hi)) => (parse(lo)?, parse(hi)?),
        None => (parse(s)?, parse(s)?),
    };
    if lo > hi {
        return Err(format!("{s}: the range must go from low to high"));
    }
    Ok((lo, hi))
}

fn print_report(json: bool, report: &impl serde::Serialize, text: String, problems: usize) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
    } else {
        println!("{text}");
    }
    if problems > 0 {
        anyhow::bail!("the benchmark found {problems} problem(s)");
    }
    Ok(())
}

async fn demo(port: u16, tickets: u64, exit: bool) -> anyhow::Result<()> {
    use std::io::Write as _;
    let exe: PathBuf = std::env::current_exe().context("cannot find this executable")?;
    let mut options = onceprint_bench::DemoOptions::new(exe);
    options.port = port;
    options.tickets = tickets as usize;
    options.paper_out_after = options.paper_out_after.min(options.tickets);
    options.exit = exit;
    let report = onceprint_bench::run_demo(&options, |line| {
        let mut out = std::io::stdout().lock();
        if line.starts_with('\r') || line.ends_with('\n') {
            let _ = write!(out, "{line}");
        } else {
            let _ = writeln!(out, "{line}");
        }
        let _ = out.flush();
    })
    .await?;
    if !report.held() {
        anyhow::bail!("the demo did not print every ticket exactly once");
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // A simulation runs the broker's code thousands of times a second: its own report is
    // the output, the broker's log lines only with RUST_LOG.
    let default_level = if matches!(cli.command, Command::Sim(_)) { "error" } else { "info" };
    init_logging(cli.log_format, default_level);
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.enable_all();
    let command = match cli.command {
        Command::Serve(args) => {
            no_transparent_huge_pages();
            // Resolved before the runtime is built: the configuration says how many
            // threads it gets.
            let cfg = config::resolve(args)?;
            runtime.worker_threads(cfg.worker_threads);
            return runtime.build()?.block_on(serve(cfg));
        }
        Command::Sim(args) => {
            // The simulation runs a runtime of its own per run, on threads of its own.
            let report = onceprint_sim::cli::run(&args)?;
            println!("{report}");
            if report.failure.is_some() {
                std::process::exit(1);
            }
            return Ok(());
        }
        Command::Agent { worker_threads, .. } | Command::PrinterSim { worker_threads, .. } => {
            runtime.worker_threads(usize::from(worker_threads));
            cli.command
        }
        command => command,
    };
    runtime.build()?.block_on(async {
        match command {
            Command::Serve(_) | Command::Sim(_) => unreachable!("returned above"),
            Command::MqttAcl { serve, out } => mqtt_acl(serve, out).await,
            Command::Render { to, profile, markup, out, file } => render(&to, profile.as_deref(), markup, out, &file),
            Command::Reconcile(args) => {
                if reconcile::run(args).await? {
                    Ok(())
                } else {
                    std::process::exit(1)
                }
            }
            Command::Backup(args) => backup::run(args),
            Command::Probe(args) => {
                if probe::run(args).await? {
                    Ok(())
                } else {
                    std::process::exit(1)
                }
            }
            Command::Agent { args, .. } => Ok(onceprint_agent::run(args, shutdown_signal()).await?),
            Command::PrinterSim { args, .. } => Ok(onceprint_printer_sim::run(args, shutdown_signal()).await?),
            Command::Bench { which } => bench(which).await,
            Command::Demo { port, tickets, exit } => demo(port, tickets, exit).await,
        }
    })
}
