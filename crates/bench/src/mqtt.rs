//! `onceprint bench mqtt`: what thousands of MQTT printers cost one broker node. It starts
//! a Mosquitto of its own (or uses one given by `--mqtt-port`), a broker on a fresh
//! database, registers N `mqtt` printers of one protocol (onceprint's device protocol, or
//! Star CloudPRNT in MQTT mode), `--per-store` of them in each store, and runs all N
//! devices in ONE `printer-sim --fleet` process (the simulator's own device logic, one
//! task per device, one paper log).
//!
//! Once the broker sees every device online, it measures the broker's CPU (share of one
//! core) and RSS over an idle window. Then every device gets exactly one ticket: first
//! `--latency-samples` of them one at a time (an idle broker, an idle device), then the
//! others in batches as fast as the broker takes them. For each ticket it takes the time
//! the broker answered its submission (the task is committed before the answer) and the
//! time the device put it on paper (the paper log's `at`), on the same wall clock:
//! commit → publish → MQTT server → device → paper, an upper bound of commit → publish.
//! It reports those latencies (p50/p95/p99/max), printed/s of the batch phase, the
//! broker's CPU over it, and counts as problems any device without its ticket on paper or
//! with it twice, and any sheet it did not ask for.
//!
//! It must never talk to anything but the broker, the MQTT server and the database it was
//! handed (inside a schema it creates and drops), all on 127.0.0.1 but the database.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hyper::body::Bytes;
use hyper::header::HeaderValue;
use hyper::Method;
use serde::Serialize;
use serde_json::{json, Value};
use time::OffsetDateTime;

use crate::broker::{Broker, Launch};
use crate::http::{snippet, Conn};
use crate::procs::{note_stop, Proc};
use crate::report::{finish_text, machine_line};
use crate::setup::{setup_call, tenant};
use crate::{random_hex, run_dir, BenchError};

/// Which device protocol the bench's devices speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MqttBenchProtocol {
    /// onceprint's device protocol (docs/MQTT.md).
    Onceprint,
    /// Star CloudPRNT Version MQTT, Full MQTT / Pass URL (`url` jobs fetched over HTTP).
    Star,
}

/// What `run_mqtt` should do.
#[derive(Debug, Clone)]
pub struct MqttBenchOptions {
    /// The `onceprint` executable that runs the device simulator (this one).
    pub exe: PathBuf,
    /// The broker under test (`serve`).
    pub broker_exe: PathBuf,
    /// `None`: a fresh SQLite file; `postgres://…`: a fresh schema there.
    pub database: Option<String>,
    pub devices: usize,
    pub protocol: MqttBenchProtocol,
    /// Devices per store.
    pub per_store: usize,
    /// How long the idle broker is measured.
    pub idle_secs: f64,
    /// Tickets sent one at a time, `gap` apart, to idle devices.
    pub latency_samples: usize,
    pub gap: Duration,
    /// Tickets per `POST /v1/print-task-batches` in the batch phase.
    pub batch: usize,
    /// An MQTT server already listening on 127.0.0.1 at this port; `None` starts one.
    pub mqtt_port: Option<u16>,
    /// Longest wait for every ticket to be on paper.
    pub drain_timeout: Duration,
}

/// Latencies in milliseconds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Latency {
    pub count: usize,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

impl Latency {
    fn of(mut us: Vec<u64>) -> Latency {
        us.sort_unstable();
        let q = |p: f64| crate::report::percentile(&us, p) as f64 / 1000.0;
        Latency { count: us.len(), p50: q(0.50), p95: q(0.95), p99: q(0.99), max: q(1.0) }
    }
}

/// One process's cost over a window.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Cost {
    /// Share of one core (user + system) over the window.
    pub cpu_share: Option<f64>,
    /// Resident set at the end of the window, MiB.
    pub rss_mib: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct MqttBenchReport {
    pub machine: String,
    pub backend: &'static str,
    pub protocol: MqttBenchProtocol,
    pub devices: usize,
    pub per_store: usize,
    /// From starting the simulator to the broker seeing every device online.
    pub connect_secs: f64,
    pub idle_secs: f64,
    pub idle_broker: Cost,
    pub idle_mosquitto: Cost,
    /// Submission answered → on paper, tickets sent one at a time to idle devices.
    pub idle_ticket_ms: Latency,
    /// The same for the batch phase.
    pub batch_ticket_ms: Latency,
    pub batch_tickets: usize,
    /// Batch-phase tickets per second, from its first submission to its last sheet.
    pub printed_per_second: f64,
    pub batch_broker: Cost,
    pub on_paper: usize,
    pub problems: Vec<String>,
}

impl MqttBenchReport {
    pub fn render_text(&self) -> String {
        let mut s = format!(
            "bench mqtt — {} {} devices ({} per store) on one broker node ({}, {})\n",
            self.devices,
            match self.protocol {
                MqttBenchProtocol::Onceprint => "onceprint-protocol",
                MqttBenchProtocol::Star => "Star CloudPRNT MQTT",
            },
            self.per_store,
            self.backend,
            self.machine
        );
        let cost = |c: &Cost| {
            format!(
                "CPU {} of one core, RSS {}",
                c.cpu_share.map_or("?".into(), |v| format!("{:.1} %", v * 100.0)),
                c.rss_mib.map_or("?".into(), |v| format!("{v:.0} MiB"))
            )
        };
        s.push_str(&format!("  all online after {:.1} s\n", self.connect_secs));
        s.push_str(&format!(
            "  idle for {:.0} s: broker {}; mosquitto {}\n",
            self.idle_secs,
            cost(&self.idle_broker),
            cost(&self.idle_mosquitto)
        ));
        let lat = |l: &Latency| {
            format!("{} tickets, ms p50 {:.1} p95 {:.1} p99 {:.1} max {:.1}", l.count, l.p50, l.p95, l.p99, l.max)
        };
        s.push_str(&format!("  one at a time, answer → paper: {}\n", lat(&self.idle_ticket_ms)));
        s.push_str(&format!(
            "  batches: {} tickets, {:.0} printed/s; answer → paper: {}\n  broker during the batches: {}\n",
            self.batch_tickets,
            self.printed_per_second,
            lat(&self.batch_ticket_ms),
            cost(&self.batch_broker)
        ));
        s.push_str(&format!("  on paper: {} of {}\n", self.on_paper, self.devices));
        finish_text(s, &self.problems)
    }
}

/// A registered device: its printer id and login.
struct Registered {
    printer_id: String,
    device: String,
    username: String,
    password: String,
}

pub async fn run_mqtt(opts: MqttBenchOptions) -> Result<MqttBenchReport, BenchError> {
    if opts.devices == 0 || opts.devices > 50_000 {
        return Err(BenchError::InvalidOptions("devices must be 1–50000".into()));
    }
    if opts.per_store == 0 || opts.latency_samples > opts.devices || opts.idle_secs <= 0.0 {
        return Err(BenchError::InvalidOptions(
            "per-store must be ≥ 1, latency-samples at most the devices, idle-secs > 0".into(),
        ));
    }
    crate::load::validate_batch(opts.batch)?;
    // The simulator holds a socket per device (and Star printers some more for their
    // HTTP requests while they make them); so does the run's Mosquitto. They inherit this
    // limit.
    let per_device = match opts.protocol {
        MqttBenchProtocol::Onceprint => 1.0,
        MqttBenchProtocol::Star => 1.5,
    };
    raise_open_files((opts.devices as f64 * per_device) as u64 + 1_000)?;
    crate::validate_database(opts.database.as_deref())?;
    let tmp = run_dir("onceprint-bench-mqtt-")?;
    let dir = tmp.path().to_path_buf();
    let opts = &opts;
    crate::on_database(opts.database.as_deref(), &dir.clone(), |backend, url| async move {
        run_on(opts, backend, &url, &dir).await
    })
    .await
}

async fn run_on(
    opts: &MqttBenchOptions,
    backend: &'static str,
    url: &str,
    dir: &Path,
) -> Result<MqttBenchReport, BenchError> {
    let (mosquitto, port) = match opts.mqtt_port {
        Some(p) => (None, p),
        None => {
            let (m, p) = crate::faults::fleet::start_mosquitto(dir).await?;
            (Some(m), p)
        }
    };
    let config = dir.join("broker.toml");
    std::fs::write(&config, crate::faults::fleet::broker_config(Some(port)))
        .map_err(|e| BenchError::io(format!("writing {}", config.display()), e))?;
    let admin = random_hex(16)?;
    let broker = Broker::launch(&Launch {
        exe: opts.broker_exe.clone(),
        database_url: url.to_owned(),
        admin_token: admin.clone(),
        log_path: dir.join("broker.log"),
        listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        config: Some(config),
        extra_args: Vec::new(),
        // The tickets of every device come from one tenant at the rate the bench can send
        // them: the rate limits are off (docs/BENCHMARKS.md, "MQTT printers").
        default_rate_limits: false,
    })
    .await?;
    let result = drive(opts, backend, &broker, mosquitto.as_ref(), port, &admin, dir).await;
    let mut problems = Vec::new();
    let broker_log = dir.join("broker.log");
    let mut report = match result {
        Ok((report, sim)) => {
            note_stop("printer-sim", sim.stop().await, &mut problems);
            report
        }
        Err(e) => {
            let _ = broker.stop().await;
            return Err(BenchError::Protocol {
                context: "bench mqtt".into(),
                detail: format!("{e}\n--- broker log ---\n{}", crate::procs::log_tail(&broker_log, 30)),
            });
        }
    };
    note_stop("broker", broker.stop().await, &mut problems);
    if let Some(m) = mosquitto {
        note_stop("mosquitto", m.stop().await, &mut problems);
    }
    report.problems.extend(problems);
    Ok(report)
}

/// Registers the devices, starts them, measures; returns the report and the simulator.
async fn drive(
    opts: &MqttBenchOptions,
    backend: &'static str,
    broker: &Broker,
    mosquitto: Option<&Proc>,
    port: u16,
    admin: &str,
    dir: &Path,
) -> Result<(MqttBenchReport, Proc), BenchError> {
    let addr = broker.addr;
    let mut conn =
        Conn::connect(addr).await.map_err(|detail| BenchError::Http { context: "connecting".into(), detail })?;
    let auth = tenant(&mut conn, admin).await?;
    let devices = register(addr, &auth, opts).await?;

    // The fleet: one simulator process, one line per device.
    let fleet = dir.join("fleet.tsv");
    let lines: String = devices.iter().map(|d| format!("{}\t{}\t{}\n", d.device, d.username, d.password)).collect();
    std::fs::write(&fleet, lines).map_err(|e| BenchError::io(format!("writing {}", fleet.display()), e))?;
    let paper_log = dir.join("paper.jsonl");
    let mut args: Vec<String> = vec!["printer-sim".into(), "--mqtt".into()];
    match opts.protocol {
        MqttBenchProtocol::Onceprint => {
            args.extend([format!("mqtt://127.0.0.1:{port}"), "--protocol".into(), "onceprint".into()])
        }
        MqttBenchProtocol::Star => args.extend([
            "--protocol".into(),
            "cloudprnt".into(),
            "--server-url".into(),
            format!("http://{addr}/cloudprnt"),
        ]),
    }
    args.extend(["--fleet".into(), fleet.display().to_string(), "--paper-log".into(), paper_log.display().to_string()]);
    let started = Instant::now();
    let mut sim = Proc::spawn("printer-sim", &opts.exe, &args, &dir.join("sim.log"))?;

    // Every device online as the broker sees it.
    let limit = Duration::from_secs(60) + Duration::from_millis(20 * opts.devices as u64);
    loop {
        if let Some(status) = sim.exited() {
            return Err(BenchError::Protocol {
                context: "starting the device fleet".into(),
                detail: format!("it exited with {status}:\n{}", sim.log_tail()),
            });
        }
        let online = online_count(&mut conn, &auth).await?;
        if online >= opts.devices {
            break;
        }
        if started.elapsed() > limit {
            return Err(BenchError::Protocol {
                context: "connecting the devices".into(),
                detail: format!(
                    "{online} of {} online after {:.0} s\n{}",
                    opts.devices,
                    limit.as_secs_f64(),
                    sim.log_tail()
                ),
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let connect_secs = started.elapsed().as_secs_f64();
    // Let the status messages of the last devices and the set-up's signals settle.
    tokio::time::sleep(Duration::from_secs(3)).await;

    // Idle: nothing to print.
    let broker_pid = broker.pid();
    let mosquitto_pid = mosquitto.map(Proc::pid);
    let window = Window::start(broker_pid);
    let mosquitto_window = mosquitto_pid.map(Window::start);
    tokio::time::sleep(Duration::from_secs_f64(opts.idle_secs)).await;
    let idle_broker = window.end();
    let idle_mosquitto = mosquitto_window.map(Window::end).unwrap_or_default();

    // One ticket per device: the first ones alone, to idle devices.
    let mut answered: Vec<Option<OffsetDateTime>> = vec![None; devices.len()];
    let mut problems = Vec::new();
    for (i, answer) in answered.iter_mut().enumerate().take(opts.latency_samples) {
        let sent = Instant::now();
        let body = ticket(&devices[i].printer_id, i);
        let (status, text) = conn
            .request(Method::POST, "/v1/print-tasks", &auth, Some(Bytes::from(body.to_string())))
            .await
            .map_err(|detail| BenchError::Http { context: "submitting".into(), detail })?;
        *answer = Some(OffsetDateTime::now_utc());
        if status.as_u16() != 201 {
            problems.push(format!("ticket {i}: HTTP {status}: {}", snippet(&text, 200)));
        }
        tokio::time::sleep_until((sent + opts.gap).into()).await;
    }
    // Wait for the samples to be out of the way before the batches start.
    wait_for_paper(&paper_log, opts.latency_samples, Duration::from_secs(30)).await;

    // The others in batches, one after another, as fast as they are taken.
    let window = Window::start(broker_pid);
    let batch_started = OffsetDateTime::now_utc();
    let rest: Vec<usize> = (opts.latency_samples..devices.len()).collect();
    for chunk in rest.chunks(opts.batch) {
        let tasks: Vec<Value> = chunk.iter().map(|&i| ticket(&devices[i].printer_id, i)).collect();
        let (status, text) = conn
            .request(
                Method::POST,
                "/v1/print-task-batches",
                &auth,
                Some(Bytes::from(json!({"tasks": tasks}).to_string())),
            )
            .await
            .map_err(|detail| BenchError::Http { context: "submitting a batch".into(), detail })?;
        let at = OffsetDateTime::now_utc();
        if !status.is_success() {
            problems.push(format!("a batch: HTTP {status}: {}", snippet(&text, 200)));
            continue;
        }
        let v: Value = serde_json::from_slice(&text).unwrap_or(Value::Null);
        let results = v["results"].as_array().cloned().unwrap_or_default();
        for (k, &i) in chunk.iter().enumerate() {
            match results.get(k).and_then(|r| r["status"].as_u64()) {
                Some(201) => answered[i] = Some(at),
                other => problems.push(format!("ticket {i}: answered {other:?} in its batch")),
            }
        }
    }
    let all_out = wait_for_paper(&paper_log, devices.len(), opts.drain_timeout).await;
    let batch_broker = window.end();
    if !all_out {
        problems.push(format!("not every ticket was on paper within {} s", opts.drain_timeout.as_secs()));
    }
    // Anything printed twice would come soon after.
    tokio::time::sleep(Duration::from_secs(2)).await;

    // What came out, by device.
    let index: HashMap<&str, usize> = devices.iter().enumerate().map(|(i, d)| (d.device.as_str(), i)).collect();
    let mut printed: Vec<Vec<OffsetDateTime>> = vec![Vec::new(); devices.len()];
    let text = std::fs::read_to_string(&paper_log).unwrap_or_default();
    let mut on_paper = 0;
    for line in text.lines() {
        let v: Value = serde_json::from_str(line).unwrap_or(Value::Null);
        let device = v["device"].as_str().unwrap_or_default();
        let at = v["at"]
            .as_str()
            .and_then(|a| OffsetDateTime::parse(a, &time::format_description::well_known::Rfc3339).ok());
        let (Some(&i), Some(at)) = (index.get(device), at) else {
            problems.push(format!("a sheet of no ticket: {}", snippet(line.as_bytes(), 200)));
            continue;
        };
        // A Star printer prints the picture of its ticket (recorded as `png:` and a hash).
        let text = v["text"].as_str().unwrap_or_default();
        if !text.starts_with("png:") && !text.contains(&marker(i)) {
            problems.push(format!("device {device} printed another ticket than its own"));
        }
        on_paper += 1;
        printed[i].push(at);
    }
    let mut idle_us = Vec::new();
    let mut batch_us = Vec::new();
    let mut last_batch_sheet = batch_started;
    let (mut lost, mut twice) = (0, 0);
    for (i, sheets) in printed.iter().enumerate() {
        match sheets.len() {
            0 => lost += 1,
            1 => {}
            _ => twice += 1,
        }
        let (Some(first), Some(answer)) = (sheets.first(), answered[i]) else { continue };
        let us = u64::try_from((*first - answer).whole_microseconds().max(0)).unwrap_or(u64::MAX);
        if i < opts.latency_samples {
            idle_us.push(us);
        } else {
            batch_us.push(us);
            last_batch_sheet = last_batch_sheet.max(*first);
        }
    }
    if lost > 0 {
        problems.push(format!("{lost} devices never printed their ticket"));
    }
    if twice > 0 {
        problems.push(format!("{twice} devices printed their ticket more than once"));
    }
    let batch_tickets = devices.len() - opts.latency_samples;
    let batch_secs = (last_batch_sheet - batch_started).as_seconds_f64();
    let report = MqttBenchReport {
        machine: machine_line(),
        backend,
        protocol: opts.protocol,
        devices: devices.len(),
        per_store: opts.per_store,
        connect_secs,
        idle_secs: opts.idle_secs,
        idle_broker,
        idle_mosquitto,
        idle_ticket_ms: Latency::of(idle_us),
        batch_ticket_ms: Latency::of(batch_us),
        batch_tickets,
        printed_per_second: if batch_secs > 0.0 { batch_tickets as f64 / batch_secs } else { 0.0 },
        batch_broker,
        on_paper,
        problems,
    };
    Ok((report, sim))
}

/// The text each ticket carries, to tell whose it is on paper.
fn marker(i: usize) -> String {
    format!("mqtt-bench ticket {i}")
}

fn ticket(printer_id: &str, i: usize) -> Value {
    json!({"biz_no": format!("mqtt-{i}"), "printer_id": printer_id, "print_type": "receipt",
           "content": {"type": "text", "text": format!("{}\n1 x Noodles  12.00\n", marker(i))}})
}

/// Stores of `per_store` printers each, and the printers, over a few connections at once.
async fn register(
    addr: std::net::SocketAddr,
    auth: &HeaderValue,
    opts: &MqttBenchOptions,
) -> Result<Vec<Registered>, BenchError> {
    const CONNECTIONS: usize = 8;
    let stores = opts.devices.div_ceil(opts.per_store);
    let mut handles = Vec::new();
    for w in 0..CONNECTIONS {
        let (auth, opts) = (auth.clone(), opts.clone());
        handles.push(tokio::spawn(async move {
            let mut conn = Conn::connect(addr)
                .await
                .map_err(|detail| BenchError::Http { context: "connecting".into(), detail })?;
            let mut out = Vec::new();
            for s in (w..stores).step_by(CONNECTIONS) {
                let store_id = format!("s{s}");
                setup_call(&mut conn, &auth, "/v1/stores", json!({"id": store_id, "name": format!("Shop {s}")}))
                    .await?;
                for i in s * opts.per_store..((s + 1) * opts.per_store).min(opts.devices) {
                    let (device, transport) = match opts.protocol {
                        MqttBenchProtocol::Onceprint => {
                            let id = format!("bench-dev{i}");
                            (id.clone(), json!({"kind": "mqtt", "protocol": "onceprint", "device_id": id}))
                        }
                        MqttBenchProtocol::Star => {
                            let mac =
                                format!("00:11:62:{:02x}:{:02x}:{:02x}", (i >> 16) & 0xff, (i >> 8) & 0xff, i & 0xff);
                            (mac.clone(), json!({"kind": "mqtt", "protocol": "cloudprnt", "mac": mac}))
                        }
                    };
                    let printer_id = format!("p{i}");
                    let body = json!({"id": printer_id, "store_id": store_id, "name": format!("Printer {i}"),
                                      "transport": transport});
                    let answer = setup_call(&mut conn, &auth, "/v1/printers", body).await?;
                    let field = |k: &str| answer["credentials"][k].as_str().unwrap_or_default().to_owned();
                    out.push((
                        i,
                        Registered { printer_id, device, username: field("username"), password: field("password") },
                    ));
                }
            }
            Ok::<_, BenchError>(out)
        }));
    }
    let mut all = Vec::with_capacity(opts.devices);
    for h in handles {
        let part =
            h.await.map_err(|e| BenchError::Protocol { context: "registering".into(), detail: e.to_string() })??;
        all.extend(part);
    }
    all.sort_by_key(|(i, _)| *i);
    Ok(all.into_iter().map(|(_, r)| r).collect())
}

/// How many of the tenant's printers the broker holds online.
async fn online_count(conn: &mut Conn, auth: &HeaderValue) -> Result<usize, BenchError> {
    let (status, body) = conn
        .request(Method::GET, "/v1/printers", auth, None)
        .await
        .map_err(|detail| BenchError::Http { context: "listing the printers".into(), detail })?;
    if status.as_u16() != 200 {
        return Err(BenchError::Protocol {
            context: "listing the printers".into(),
            detail: format!("HTTP {status}: {}", snippet(&body, 200)),
        });
    }
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    Ok(v["printers"].as_array().map_or(0, |a| a.iter().filter(|p| p["online"] == true).count()))
}

/// Waits until the paper log has `n` lines; `false` if `timeout` passed first.
async fn wait_for_paper(path: &Path, n: usize, timeout: Duration) -> bool {
    let until = Instant::now() + timeout;
    loop {
        let lines = std::fs::read(path).map_or(0, |b| b.iter().filter(|&&c| c == b'\n').count());
        if lines >= n {
            return true;
        }
        if Instant::now() > until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A process's CPU time from the start of a window.
struct Window {
    pid: u32,
    cpu: Option<f64>,
    at: Instant,
}

impl Window {
    fn start(pid: u32) -> Window {
        Window { pid, cpu: crate::procs::ProcStats::of(pid).cpu_seconds, at: Instant::now() }
    }

    fn end(self) -> Cost {
        let cpu = crate::procs::ProcStats::of(self.pid).cpu_seconds;
        let secs = self.at.elapsed().as_secs_f64().max(1e-9);
        Cost {
            cpu_share: match (self.cpu, cpu) {
                (Some(a), Some(b)) if b >= a => Some((b - a) / secs),
                _ => None,
            },
            rss_mib: crate::procs::vm_rss_kib(self.pid).map(|k| k as f64 / 1024.0),
        }
    }
}

/// Raises this process's soft limit of open files to `needed` (its children inherit it),
/// within the hard limit.
fn raise_open_files(needed: u64) -> Result<(), BenchError> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed by pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Ok(());
    }
    if limit.rlim_cur >= needed {
        return Ok(());
    }
    if limit.rlim_max < needed {
        return Err(BenchError::InvalidOptions(format!(
            "{needed} open files are needed for this many devices, and the hard limit is {} (ulimit -Hn)",
            limit.rlim_max
        )));
    }
    limit.rlim_cur = needed;
    // SAFETY: as above.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) };
    Ok(())
}
