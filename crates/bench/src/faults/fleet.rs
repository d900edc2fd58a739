//! The mixed fleet of a fault run: besides the store agent's TCP printers, printers that
//! call the broker — Star CloudPRNT and Epson Server Direct Print printers polling over
//! HTTP, devices of onceprint's MQTT protocol and Star CloudPRNT printers in MQTT mode on a
//! Mosquitto the run starts itself. The polling printers of each kind share one
//! `printer-sim --fleet` process (one control endpoint, faults by printer name), so a
//! fleet of hundreds costs one process, not hundreds; every MQTT printer is a process of
//! its own. Each printer has its own login, and all write the one paper log, so the verdict judges
//! every printer alike by what came out (a Star MQTT printer's picture by the job token it
//! came with). Every other Star MQTT printer forgets its remembered job tokens when it
//! loses power, as Star does not say they survive.
//!
//! Printers are numbered as in the rest of the run: the agent's first (`p0…`), then the
//! CloudPRNT, Epson, MQTT device and Star MQTT printers, in that order. A printer fault of
//! the plan goes to the control endpoint of the process that simulates that printer.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hyper::header::HeaderValue;
use serde_json::json;

use crate::http::Conn;
use crate::procs::Proc;
use crate::setup::setup_call;
use crate::sim::free_port_run;
use crate::{BenchError, STORE_ID};

/// How often a simulated polling printer polls unless told otherwise: short, so a few of
/// them carry a fair share of a run's tasks (a real printer polls every few seconds).
pub const DEFAULT_POLL_INTERVAL_MS: u64 = 100;

/// Printers of each calling-in kind, beside the agent's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fleet {
    pub cloudprnt: usize,
    pub epson: usize,
    /// Devices of onceprint's MQTT protocol.
    pub mqtt: usize,
    /// Star CloudPRNT printers in MQTT mode ("Full MQTT").
    pub mqtt_star: usize,
}

impl Fleet {
    pub fn total(&self) -> usize {
        self.cloudprnt + self.epson + self.mqtt + self.mqtt_star
    }
}

/// What simulates one calling-in printer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Cloudprnt,
    Epson,
    Mqtt,
    MqttStar,
}

/// One calling-in printer as registered.
struct Caller {
    printer_id: String,
    /// MAC, Epson ID or MQTT device id.
    device: String,
    username: String,
    password: String,
}

/// The TOML lines the broker needs for the fleet (its MQTT server).
pub fn broker_config(mqtt: Option<u16>) -> String {
    match mqtt {
        Some(port) => format!("mqtt_url = \"mqtt://127.0.0.1:{port}\"\n"),
        None => String::new(),
    }
}

/// Starts a Mosquitto of the run's own on a free port (anonymous, no persistence: the
/// devices' logins are checked by onceprint's ACL files in production; here only the
/// delivery guarantees are under test).
pub async fn start_mosquitto(dir: &Path) -> Result<(Proc, u16), BenchError> {
    let exe =
        ["/usr/sbin/mosquitto", "/usr/bin/mosquitto"].into_iter().map(PathBuf::from).find(|p| p.exists()).ok_or_else(
            || BenchError::InvalidOptions("--mqtt printers need mosquitto (apt-get install mosquitto)".into()),
        )?;
    let port = free_port_run(1)?;
    let conf = dir.join("mosquitto.conf");
    // Mosquitto queues at most 1,000 QoS 1 messages for a client by default and drops the
    // rest: thousands of devices announcing themselves at once would lose their status
    // messages on the way to the broker (`bench mqtt`). 0 is no limit. Without
    // `set_tcp_nodelay`, a message Mosquitto writes right after another to the same client
    // waits for that client's delayed ACK (Nagle's algorithm, up to 40 ms; docs/MQTT.md).
    std::fs::write(
        &conf,
        format!(
            "listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nmax_queued_messages 0\nset_tcp_nodelay true\n"
        ),
    )
    .map_err(|e| BenchError::io(format!("writing {}", conf.display()), e))?;
    let args = vec!["-c".to_string(), conf.display().to_string()];
    let proc = Proc::spawn("mosquitto", &exe, &args, &dir.join("mosquitto.log"))?;
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if started.elapsed() > Duration::from_secs(10) {
            return Err(BenchError::Protocol {
                context: "starting mosquitto".into(),
                detail: format!("it did not listen on {port} within 10 s\n{}", proc.log_tail()),
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok((proc, port))
}

/// Where the fleet's simulators run and write.
pub struct Place<'a> {
    /// The `onceprint` executable.
    pub exe: &'a Path,
    pub broker: SocketAddr,
    pub mqtt_port: Option<u16>,
    pub paper_log: &'a Path,
    /// The run's directory (one log per simulator).
    pub dir: &'a Path,
    /// How often the printers that poll poll.
    pub poll_interval_ms: u64,
}

/// The fleet once started: its simulator processes, and each printer's control endpoint
/// and name there, in the printers' order.
pub struct Started {
    pub procs: Vec<Proc>,
    pub printers: Vec<(SocketAddr, String)>,
}

/// Registers the fleet's printers (numbered from `first`) and starts their simulators: the
/// CloudPRNT printers in one process and the Epson printers in another (`printer-sim
/// --fleet`, one control endpoint each, faults by printer name), every MQTT printer in a
/// process of its own.
pub async fn start(
    conn: &mut Conn,
    auth: &HeaderValue,
    fleet: Fleet,
    first: usize,
    place: Place<'_>,
) -> Result<Started, BenchError> {
    let Place { exe, broker, mqtt_port, paper_log, dir, poll_interval_ms } = place;
    let kinds = std::iter::repeat_n(Kind::Cloudprnt, fleet.cloudprnt)
        .chain(std::iter::repeat_n(Kind::Epson, fleet.epson))
        .chain(std::iter::repeat_n(Kind::Mqtt, fleet.mqtt))
        .chain(std::iter::repeat_n(Kind::MqttStar, fleet.mqtt_star));
    let mut procs: Vec<(Proc, SocketAddr)> = Vec::new();
    let mut printers = Vec::with_capacity(fleet.total());
    // The printers that poll, by kind: their fleet file's lines, then one process each.
    let mut polled: [(Kind, String, Vec<String>); 2] =
        [(Kind::Cloudprnt, String::new(), Vec::new()), (Kind::Epson, String::new(), Vec::new())];
    // A port is free when it is picked, but the simulator given it binds it only later:
    // every port picked here is kept apart from the next picks (hundreds of simulators
    // would otherwise draw the same port now and then).
    let mut picked = std::collections::HashSet::new();
    let mut pick = || -> Result<SocketAddr, BenchError> {
        loop {
            let port = free_port_run(1)?;
            if picked.insert(port) {
                return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
            }
        }
    };
    let unused = SocketAddr::from(([127, 0, 0, 1], 0));
    let polled_control =
        [if fleet.cloudprnt > 0 { pick()? } else { unused }, if fleet.epson > 0 { pick()? } else { unused }];
    for (j, kind) in kinds.enumerate() {
        let index = first + j;
        let caller = register(conn, auth, kind, index, poll_interval_ms).await?;
        let slot = match kind {
            Kind::Cloudprnt => Some(0),
            Kind::Epson => Some(1),
            Kind::Mqtt | Kind::MqttStar => None,
        };
        if let Some(slot) = slot {
            let (_, lines, names) = &mut polled[slot];
            lines.push_str(&format!("{}\t{}\t{}\n", caller.device, caller.username, caller.password));
            let name =
                if slot == 0 { format!("cloudprnt:{}", caller.device) } else { format!("epson_sdp:{}", caller.device) };
            names.push(name.clone());
            printers.push((polled_control[slot], name));
            continue;
        }
        let control = pick()?;
        let mut args: Vec<String> = vec!["printer-sim".into()];
        let name = if kind == Kind::Mqtt {
            let port = mqtt_port.ok_or_else(|| BenchError::InvalidOptions("MQTT printers need mosquitto".into()))?;
            args.extend([
                "--mqtt".into(),
                format!("mqtt://127.0.0.1:{port}"),
                "--protocol".into(),
                "onceprint".into(),
                "--device".into(),
                caller.device.clone(),
            ]);
            // An onceprint device is named by its MQTT server's address in the paper
            // log and in its simulator's fault list.
            format!("127.0.0.1:{port}")
        } else {
            // A Star printer is given the CloudPRNT server URL and its HTTP login; it
            // takes its MQTT server from the broker's settings answer.
            args.extend([
                "--mqtt".into(),
                "--protocol".into(),
                "cloudprnt".into(),
                "--server-url".into(),
                format!("http://{broker}/cloudprnt"),
                "--device".into(),
                caller.device.clone(),
            ]);
            if index.is_multiple_of(2) {
                args.push("--power-cycle-forgets".into());
            }
            // Named `cloudprnt-mqtt:MAC` in the paper log and its fault list: its MQTT
            // server is known only once the settings answer came.
            format!("cloudprnt-mqtt:{}", caller.device)
        };
        args.extend([
            "--username".into(),
            caller.username.clone(),
            "--password".into(),
            caller.password.clone(),
            "--paper-log".into(),
            paper_log.display().to_string(),
            "--control".into(),
            control.to_string(),
        ]);
        let log = dir.join(format!("sim-{}.log", caller.printer_id));
        procs.push((Proc::spawn("printer-sim", exe, &args, &log)?, control));
        printers.push((control, name));
    }
    for (slot, (kind, lines, _)) in polled.iter().enumerate() {
        if lines.is_empty() {
            continue;
        }
        let (flag, path, label) = match kind {
            Kind::Cloudprnt => ("--cloudprnt", format!("http://{broker}/cloudprnt"), "cloudprnt"),
            _ => ("--epson-sdp", format!("http://{broker}/epson-sdp"), "epson"),
        };
        let file = dir.join(format!("fleet-{label}.tsv"));
        std::fs::write(&file, lines).map_err(|e| BenchError::io(format!("writing {}", file.display()), e))?;
        let mut args: Vec<String> = vec!["printer-sim".into(), flag.into(), path, "--fleet".into()];
        args.push(file.display().to_string());
        if *kind == Kind::Cloudprnt {
            args.extend(["--media-type".into(), "text/plain".into()]);
        }
        args.extend([
            "--poll-interval-ms".into(),
            poll_interval_ms.to_string(),
            "--paper-log".into(),
            paper_log.display().to_string(),
            "--control".into(),
            polled_control[slot].to_string(),
        ]);
        let log = dir.join(format!("sim-{label}-fleet.log"));
        procs.push((Proc::spawn("printer-sim", exe, &args, &log)?, polled_control[slot]));
    }
    // Every simulator must answer on its control endpoint before faults are sent to it.
    for (proc, control) in procs.iter_mut() {
        let started = Instant::now();
        loop {
            if let Some(status) = proc.exited() {
                return Err(BenchError::Protocol {
                    context: "starting a calling-in printer-sim".into(),
                    detail: format!("it exited with {status}:\n{}", proc.log_tail()),
                });
            }
            if crate::sim::healthy(*control).await {
                break;
            }
            if started.elapsed() > Duration::from_secs(15) {
                return Err(BenchError::Protocol {
                    context: "starting a calling-in printer-sim".into(),
                    detail: format!("its control endpoint {control} did not answer within 15 s\n{}", proc.log_tail()),
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(Started { procs: procs.into_iter().map(|(p, _)| p).collect(), printers })
}

/// `POST /v1/printers` for printer `p{index}` of `kind`; its login from the answer.
async fn register(
    conn: &mut Conn,
    auth: &HeaderValue,
    kind: Kind,
    index: usize,
    poll_interval_ms: u64,
) -> Result<Caller, BenchError> {
    let printer_id = format!("p{index}");
    // The broker's offline threshold follows the interval it is told (whole seconds).
    let poll_interval_s = poll_interval_ms.div_ceil(1000).max(1);
    let (device, transport) = match kind {
        Kind::Cloudprnt => {
            let mac = format!("00:11:62:00:{:02x}:{:02x}", (index >> 8) & 0xff, index & 0xff);
            (mac.clone(), json!({"kind": "cloudprnt", "mac": mac, "poll_interval_s": poll_interval_s}))
        }
        Kind::Epson => {
            let id = format!("tm{index}");
            (id.clone(), json!({"kind": "epson_sdp", "printer_id": id, "poll_interval_s": poll_interval_s}))
        }
        Kind::Mqtt => {
            let id = format!("dev{index}");
            (id.clone(), json!({"kind": "mqtt", "protocol": "onceprint", "device_id": id}))
        }
        Kind::MqttStar => {
            let mac = format!("00:11:62:01:{:02x}:{:02x}", (index >> 8) & 0xff, index & 0xff);
            (mac.clone(), json!({"kind": "mqtt", "protocol": "cloudprnt", "mac": mac}))
        }
    };
    let body =
        json!({"id": printer_id, "store_id": STORE_ID, "name": format!("Bench {printer_id}"), "transport": transport});
    let answer = setup_call(conn, auth, "/v1/printers", body).await?;
    let field = |k: &str| answer["credentials"][k].as_str().map(str::to_owned);
    match (field("username"), field("password")) {
        (Some(username), Some(password)) => Ok(Caller { printer_id, device, username, password }),
        _ => Err(BenchError::Protocol {
            context: format!("registering {printer_id}"),
            detail: format!("no credentials in {}", crate::http::snippet(answer.to_string().as_bytes(), 300)),
        }),
    }
}

/// A short description for the report: `8 agent, 2 cloudprnt, 2 epson_sdp, 2 mqtt`.
pub fn describe(agent: usize, fleet: Fleet) -> String {
    let mut parts = vec![format!("{agent} agent")];
    for (n, k) in [
        (fleet.cloudprnt, "cloudprnt"),
        (fleet.epson, "epson_sdp"),
        (fleet.mqtt, "mqtt"),
        (fleet.mqtt_star, "mqtt cloudprnt"),
    ] {
        if n > 0 {
            parts.push(format!("{n} {k}"));
        }
    }
    parts.join(", ")
}
