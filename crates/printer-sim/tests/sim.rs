//! The simulator over real TCP sockets: printing, acknowledgements, status and every fault.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use onceprint_escpos::{ack, status, text::text_job};
use onceprint_printer_sim::{Cut, FaultUpdate, Faults, PrintedJob, SimArgs, SimConfig, Simulator};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const WAIT: Duration = Duration::from_secs(10);

struct Fixture {
    sim: Simulator,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

async fn start(faults: Faults, count: usize) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("paper.jsonl");
    let sim = Simulator::start(SimConfig {
        count,
        paper_log: Some(log.clone()),
        control: Some("127.0.0.1:0".parse().unwrap()),
        faults,
        ..SimConfig::ephemeral()
    })
    .await
    .unwrap();
    Fixture { sim, log, _dir: dir }
}

impl Fixture {
    fn printer(&self) -> SocketAddr {
        self.sim.printers()[0]
    }

    fn paper_log(&self) -> Vec<PrintedJob> {
        read_log(&self.log)
    }
}

fn read_log(path: &Path) -> Vec<PrintedJob> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad line {l:?}: {e}"))).collect()
}

/// Reads until `want` bytes arrived, the peer closed, or `within` passed.
async fn read_some(stream: &mut TcpStream, want: usize, within: Duration) -> (Vec<u8>, ReadEnd) {
    let deadline = Instant::now() + within;
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    while got.len() < want {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Err(_) => return (got, ReadEnd::Timeout),
            Ok(Ok(0)) => return (got, ReadEnd::Closed),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Ok(Err(_)) => return (got, ReadEnd::Closed),
        }
    }
    (got, ReadEnd::Complete)
}

#[derive(Debug, PartialEq)]
enum ReadEnd {
    Complete,
    Closed,
    Timeout,
}

async fn status_of(stream: &mut TcpStream, n: u8) -> u8 {
    stream.write_all(&status::request(n)).await.unwrap();
    let (bytes, end) = read_some(stream, 1, WAIT).await;
    assert_eq!(end, ReadEnd::Complete, "no status answer");
    bytes[0]
}

/// A minimal HTTP/1.1 client for the control endpoint.
async fn http(addr: SocketAddr, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: sim\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    tokio::time::timeout(WAIT, stream.read_to_end(&mut response)).await.unwrap().unwrap();
    let response = String::from_utf8(response).unwrap();
    let status = response[9..12].parse().unwrap();
    let (_, body) = response.split_once("\r\n\r\n").unwrap();
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

fn receipt(text: &str) -> Vec<u8> {
    let mut bytes = text_job(text);
    // A QR code and a Code128 barcode before the feed and cut at the end of the text job.
    let cut_at = bytes.len() - 7;
    let mut codes = vec![0x1D, 0x28, 0x6B, 12, 0x00, 0x31, 0x50, 0x30];
    codes.extend_from_slice(b"https://x");
    codes.extend_from_slice(&[0x1D, 0x6B, 73, 6]);
    codes.extend_from_slice(b"{BA100");
    bytes.splice(cut_at..cut_at, codes);
    bytes
}

#[tokio::test]
async fn a_job_is_printed_logged_and_then_acknowledged() {
    let f = start(Faults::default(), 1).await;
    let mut stream = TcpStream::connect(f.printer()).await.unwrap();
    let job = receipt("宫保鸡丁 x1\nTable 5\n");
    let mut bytes = job.clone();
    bytes.extend_from_slice(&ack::request(*b"A001"));
    stream.write_all(&bytes).await.unwrap();
    let (reply, end) = read_some(&mut stream, 7, WAIT).await;
    assert_eq!(end, ReadEnd::Complete);
    assert_eq!(ack::find_reply(&reply), Some((*b"A001", 7)));

    // The reply comes only after the line is written, so no waiting is needed here.
    let log = f.paper_log();
    assert_eq!(log.len(), 1);
    let line = &log[0];
    assert_eq!(line.printer, f.printer().to_string());
    assert_eq!(line.seq, 1);
    assert_eq!(line.text, "宫保鸡丁 x1\nTable 5\n");
    assert_eq!(line.qr, vec!["https://x".to_string()]);
    assert_eq!(line.barcodes.len(), 1);
    assert_eq!((line.barcodes[0].kind, line.barcodes[0].data.as_str()), (73, "{BA100"));
    assert_eq!(line.cut, Cut::Partial);
    assert_eq!(line.bytes, job.len());
    assert!(line.at.ends_with('Z') && line.at.contains('T'), "RFC 3339 UTC: {}", line.at);
    assert_eq!(f.sim.jobs().all(), log);

    // The raw line uses the contract's field names and values.
    let raw: Value = serde_json::from_str(std::fs::read_to_string(&f.log).unwrap().lines().next().unwrap()).unwrap();
    assert_eq!(raw["printer"], json!(f.printer().to_string()));
    assert_eq!(raw["cut"], json!("partial"));
    assert_eq!(raw["images"], json!(0));

    // A second job on the same connection gets the next sequence number.
    let mut bytes = text_job("second");
    bytes.extend_from_slice(&ack::request(*b"A002"));
    stream.write_all(&bytes).await.unwrap();
    let (reply, _) = read_some(&mut stream, 7, WAIT).await;
    assert_eq!(ack::find_reply(&reply), Some((*b"A002", 7)));
    let log = f.paper_log();
    assert_eq!((log.len(), log[1].seq, log[1].text.as_str()), (2, 2, "second"));
}

#[tokio::test]
async fn a_job_dribbled_byte_by_byte_prints_the_same() {
    let f = start(Faults::default(), 1).await;
    let mut stream = TcpStream::connect(f.printer()).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let mut bytes = text_job("宫保鸡丁 x1");
    bytes.extend_from_slice(&ack::request(*b"B001"));
    for b in &bytes {
        stream.write_all(std::slice::from_ref(b)).await.unwrap();
    }
    let (reply, _) = read_some(&mut stream, 7, WAIT).await;
    assert_eq!(ack::find_reply(&reply), Some((*b"B001", 7)));
    assert_eq!(f.paper_log()[0].text, "宫保鸡丁 x1");
}

#[tokio::test]
async fn real_time_status_reflects_paper_out_and_cover_open() {
    let f = start(Faults::default(), 1).await;
    let mut stream = TcpStream::connect(f.printer()).await.unwrap();
    for n in 1..=4 {
        assert_eq!(status_of(&mut stream, n).await, 0x12, "healthy n={n}");
    }
    f.sim.faults().update_all(FaultUpdate { paper_out: Some(true), ..FaultUpdate::default() });
    assert_eq!(status_of(&mut stream, 4).await, 0x7E);
    let mut s = status::PrinterStatus::default();
    for n in 1..=4 {
        assert!(s.apply(n, status_of(&mut stream, n).await));
    }
    assert_eq!(s.blocker(), Some(status::Blocker::NoPaper));

    f.sim.faults().update_all(FaultUpdate { paper_out: Some(false), cover_open: Some(true), ..FaultUpdate::default() });
    assert_eq!(status_of(&mut stream, 2).await, 0x16);
    assert_eq!(status_of(&mut stream, 4).await, 0x12);
    let mut s = status::PrinterStatus::default();
    for n in 1..=4 {
        assert!(s.apply(n, status_of(&mut stream, n).await));
    }
    assert_eq!(s.blocker(), Some(status::Blocker::CoverOpen));
}

#[tokio::test]
async fn paper_out_buffers_the_job_until_paper_goes_in() {
    let f = start(Faults { paper_out: true, ..Faults::default() }, 1).await;
    let control = f.sim.control_addr().unwrap();
    let mut stream = TcpStream::connect(f.printer()).await.unwrap();
    let mut bytes = text_job("Table 9\n");
    bytes.extend_from_slice(&ack::request(*b"P001"));
    stream.write_all(&bytes).await.unwrap();

    // Nothing prints and the ACK is withheld, but real-time status still answers.
    let (reply, end) = read_some(&mut stream, 1, Duration::from_millis(300)).await;
    assert_eq!((reply.len(), end), (0, ReadEnd::Timeout));
    assert_eq!(status_of(&mut stream, 4).await, 0x7E);
    assert_eq!(f.sim.jobs().count(), 0);
    assert!(f.paper_log().is_empty());

    let (code, body) = http(control, "PUT", "/faults", Some(json!({"paper_out": false}))).await;
    assert_eq!(code, 200);
    assert_eq!(body["printers"][0]["paper_out"], json!(false));
    assert_eq!(body["printers"][0]["printer"], json!(f.printer().to_string()));

    let (reply, _) = read_some(&mut stream, 7, WAIT).await;
    assert_eq!(ack::find_reply(&reply), Some((*b"P001", 7)));
    let log = f.paper_log();
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].text, "Table 9\n");
}

#[tokio::test]
async fn a_buffered_job_prints_after_its_sender_gave_up() {
    let f = start(Faults { cover_open: true, ..Faults::default() }, 1).await;
    let mut stream = TcpStream::connect(f.printer()).await.unwrap();
    let mut bytes = text_job("late ticket");
    bytes.extend_from_slice(&ack::request(*b"L001"));
    stream.write_all(&bytes).await.unwrap();
    assert_eq!(status_of(&mut stream, 2).await, 0x16);
    drop(stream);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(f.sim.jobs().count(), 0);

    f.sim
        .faults()
        .update(Some(&f.printer().to_string()), FaultUpdate { cover_open: Some(false), ..FaultUpdate::default() })
        .unwrap();
    assert!(f.sim.jobs().wait_for(1, WAIT).await, "the buffered job prints when the cover closes");
    assert_eq!(f.paper_log()[0].text, "late ticket");
}

#[tokio::test]
async fn crash_mid_job_prints_then_drops_the_connection_before_the_reply() {
    let f = start(Faults { crash_mid_job: 1, ..Faults::default() }, 1).await;
    let mut stream = TcpStream::connect(f.printer()).await.unwrap();
    let mut bytes = text_job("crash me");
    bytes.extend_from_slice(&ack::request(*b"C001"));
    stream.write_all(&bytes).await.unwrap();
    let (reply, end) = read_some(&mut stream, 7, WAIT).await;
    assert_eq!(end, ReadEnd::Closed);
    assert_eq!(ack::find_reply(&reply), None);
    let log = f.paper_log();
    assert_eq!(log.len(), 1, "the job was printed before the crash");
    assert_eq!(log[0].text, "crash me");
    assert_eq!(f.sim.faults().get(f.printer()).unwrap().crash_mid_job, 0, "one crash used up");

    // The next job goes through.
    let mut stream = TcpStream::connect(f.printer()).await.unwrap();
    let mut bytes = text_job("after");
    bytes.extend_from_slice(&ack::request(*b"C002"));
    stream.write_all(&bytes).await.unwrap();
    let (reply, _) = read_some(&mut stream, 7, WAIT).await;
    assert_eq!(ack::find_reply(&reply), Some((*b"C002", 7)));
    assert_eq!(f.paper_log().len(), 2);
}

#[tokio::test]
async fn a_clone_never_answers_gs_paren_h() {
    let f = start(Faults { clone: true, ..Faults::default() }, 1).await;
    let mut stream = TcpStream::connect(f.printer()).await.unwrap();
    let mut bytes = text_job("clone");
    bytes.extend_from_slice(&ack::request(*b"K001"));
    stream.write_all(&bytes).await.unwrap();
    assert!(f.sim.jobs().wait_for(1, WAIT).await);
    let (reply, end) = read_some(&mut stream, 1, Duration::from_millis(300)).await;
    assert_eq!((reply, end), (vec![], ReadEnd::Timeout));
    assert_eq!(status_of(&mut stream, 1).await, 0x12, "status still answers");
}

#[tokio::test]
async fn an_offline_printer_refuses_connections() {
    let f = start(Faults { offline: true, ..Faults::default() }, 1).await;
    let mut stream = TcpStream::connect(f.printer()).await.unwrap();
    let _ = stream.write_all(&status::request(1)).await;
    let (reply, end) = read_some(&mut stream, 1, WAIT).await;
    assert_eq!((reply, end), (vec![], ReadEnd::Closed));

    // Back online: connections work; going offline again, an open connection reads
    // offline and its jobs wait.
    f.sim.faults().update_all(FaultUpdate { offline: Some(false), ..FaultUpdate::default() });
    let mut stream = TcpStream::connect(f.printer()).await.unwrap();
    assert_eq!(status_of(&mut stream, 1).await, 0x12);
    f.sim.faults().update_all(FaultUpdate { offline: Some(true), ..FaultUpdate::default() });
    assert_eq!(status_of(&mut stream, 1).await, 0x1A);
    stream.write_all(&text_job("while offline")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(f.sim.jobs().count(), 0);
    f.sim.faults().update_all(FaultUpdate { offline: Some(false), ..FaultUpdate::default() });
    assert!(f.sim.jobs().wait_for(1, WAIT).await);
}

#[tokio::test]
async fn slow_printers_delay_the_acknowledgement() {
    let f = start(Faults { slow_ms: 300, ..Faults::default() }, 1).await;
    let mut stream = TcpStream::connect(f.printer()).await.unwrap();
    let mut bytes = text_job("slow");
    bytes.extend_from_slice(&ack::request(*b"S001"));
    let started = Instant::now();
    stream.write_all(&bytes).await.unwrap();
    assert_eq!(status_of(&mut stream, 4).await, 0x12, "status is answered at once, even while printing");
    assert!(started.elapsed() < Duration::from_millis(300));
    let (reply, _) = read_some(&mut stream, 7, WAIT).await;
    assert_eq!(ack::find_reply(&reply), Some((*b"S001", 7)));
    assert!(started.elapsed() >= Duration::from_millis(300));
}

#[tokio::test]
async fn control_endpoint_lists_and_changes_faults() {
    let f = start(Faults::default(), 2).await;
    let control = f.sim.control_addr().unwrap();
    let [a, b] = [f.sim.printers()[0], f.sim.printers()[1]];

    assert_eq!(http(control, "GET", "/healthz", None).await.0, 200);
    let (code, body) = http(control, "GET", "/faults", None).await;
    assert_eq!(code, 200);
    assert_eq!(body["printers"].as_array().unwrap().len(), 2);
    assert_eq!(
        body["printers"][0],
        json!({"printer": a.to_string(), "paper_out": false, "cover_open": false, "offline": false,
               "crash_mid_job": 0, "slow_ms": 0, "clone": false, "duplicate_confirm": 0, "lost_result": 0, "lose_result": 0, "duplicate_result": 0,
               "disconnect_mid_job": 0, "receive_twice": 0, "power_cycle_forgets": false, "error_after_print": 0})
    );

    let (code, body) =
        http(control, "PUT", "/faults", Some(json!({"printer": b.to_string(), "slow_ms": 5, "clone": true}))).await;
    assert_eq!(code, 200);
    assert_eq!(body["printers"].as_array().unwrap().len(), 1);
    assert_eq!(f.sim.faults().get(b), Some(Faults { slow_ms: 5, clone: true, ..Faults::default() }));
    assert_eq!(f.sim.faults().get(a), Some(Faults::default()));

    let (code, body) = http(control, "PUT", "/faults", Some(json!({"printer": "127.0.0.1:1", "offline": true}))).await;
    assert_eq!((code, body["error"]["code"].as_str()), (404, Some("not_found")));
    let (code, body) = http(control, "PUT", "/faults", Some(json!({"paperout": true}))).await;
    assert_eq!((code, body["error"]["code"].as_str()), (400, Some("invalid_request")));

    let mut stream = TcpStream::connect(a).await.unwrap();
    stream.write_all(&text_job("one")).await.unwrap();
    assert!(f.sim.jobs().wait_for(1, WAIT).await);
    let (code, body) = http(control, "GET", "/jobs", None).await;
    assert_eq!((code, body), (200, json!({"jobs": 1})));
}

#[tokio::test]
async fn an_uncut_job_is_logged_when_the_connection_ends() {
    let f = start(Faults::default(), 1).await;
    let mut stream = TcpStream::connect(f.printer()).await.unwrap();
    stream.write_all(b"\x1b@no cut\n").await.unwrap();
    stream.shutdown().await.unwrap();
    let (_, end) = read_some(&mut stream, 1, WAIT).await;
    assert_eq!(end, ReadEnd::Closed, "closed after the input was processed");
    let log = f.paper_log();
    assert_eq!((log.len(), log[0].cut, log[0].text.as_str()), (1, Cut::Uncut, "no cut\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_printers_each_print_one_job() {
    let f = start(Faults::default(), 100).await;
    let printers = f.sim.printers().to_vec();
    let mut distinct = printers.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 100);

    let mut tasks = tokio::task::JoinSet::new();
    for (i, &addr) in printers.iter().enumerate() {
        tasks.spawn(async move {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            let id = ack::id_from(i as u64);
            let mut bytes = text_job(&format!("printer {i} 宫保鸡丁\n"));
            bytes.extend_from_slice(&ack::request(id));
            stream.write_all(&bytes).await.unwrap();
            let (reply, _) = read_some(&mut stream, 7, WAIT).await;
            assert_eq!(ack::find_reply(&reply), Some((id, 7)));
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    let log = f.paper_log();
    assert_eq!(log.len(), 100);
    for (i, addr) in printers.iter().enumerate() {
        let mine: Vec<_> = log.iter().filter(|j| j.printer == addr.to_string()).collect();
        assert_eq!(mine.len(), 1, "{addr}");
        assert_eq!(mine[0].text, format!("printer {i} 宫保鸡丁\n"));
        assert_eq!(mine[0].seq, 1);
    }
}

#[tokio::test]
async fn printers_take_consecutive_ports_from_the_listen_port() {
    // Find a free run of three ports; another process may take one in between, so retry.
    for _ in 0..20 {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base = probe.local_addr().unwrap().port();
        drop(probe);
        if base > 65_000 {
            continue;
        }
        let config = SimConfig { listen: SocketAddr::from(([127, 0, 0, 1], base)), count: 3, ..SimConfig::ephemeral() };
        let Ok(sim) = Simulator::start(config).await else { continue };
        let ports: Vec<u16> = sim.printers().iter().map(|a| a.port()).collect();
        assert_eq!(ports, vec![base, base + 1, base + 2]);
        let mut stream = TcpStream::connect(sim.printers()[2]).await.unwrap();
        assert_eq!(status_of(&mut stream, 1).await, 0x12);
        sim.shutdown().await;
        return;
    }
    panic!("no free run of three ports found");
}

#[tokio::test]
async fn run_serves_until_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let args = SimArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        count: 2,
        pty: false,
        paper_log: Some(dir.path().join("log.jsonl")),
        control: None,
        paper_out: false,
        cover_open: false,
        offline: false,
        crash_mid_job: 0,
        slow_ms: 0,
        clone: false,
        lose_result: 0,
        duplicate_result: 0,
        disconnect_mid_job: 0,
        receive_twice: 0,
        power_cycle_forgets: false,
        error_after_print: 0,
        mqtt: None,
        server_url: None,
        protocol: "onceprint".into(),
        device: None,
        fleet: None,
        fast: true,
        cloudprnt: None,
        epson_sdp: None,
        username: None,
        password: None,
        mac: None,
        id: None,
        poll_interval_ms: 1000,
        media_type: "text/plain".into(),
        print_width_mm: 72,
        duplicate_confirm: 0,
        lost_result: 0,
    };
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(onceprint_printer_sim::run(args, async move {
        let _ = rx.await;
    }));
    tokio::time::sleep(Duration::from_millis(50)).await;
    tx.send(()).unwrap();
    tokio::time::timeout(WAIT, running).await.unwrap().unwrap().unwrap();
    assert!(dir.path().join("log.jsonl").exists(), "the paper log is created at start-up");
}

#[tokio::test]
async fn a_paper_log_that_cannot_be_opened_is_an_error() {
    let config =
        SimConfig { paper_log: Some(PathBuf::from("/nonexistent-dir/x/paper.jsonl")), ..SimConfig::ephemeral() };
    let err = Simulator::start(config).await.unwrap_err();
    assert!(err.to_string().contains("paper log"), "{err}");
}
