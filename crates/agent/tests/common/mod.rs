//! Test doubles on real sockets: a fake ESC/POS printer and a fake broker.

#![allow(dead_code)]

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use onceprint_agent::{Ack, AgentArgs, Delivery};
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, Notify};
use tokio::task::JoinHandle;

pub const TOKEN: &str = "test-agent-token";

/// How the fake printer behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// Answers status with 0x12 and GS ( H with the matching reply.
    Healthy,
    /// Answers DLE EOT 4 with 0x7E (paper end), everything else like `Healthy`.
    PaperOut,
    /// Takes the job and closes the connection when GS ( H arrives, without replying.
    DropAfterJob,
    /// A clone: prints, answers status, never answers GS ( H.
    Clone,
    /// Answers GS ( H with a reply for another id first, then the right one.
    WrongIdFirst,
    /// Accepts connections and never answers anything.
    Silent,
    /// Healthy, but answers GS ( H only after half a second (a long receipt).
    Slow,
    /// A clone that runs out of paper while printing: healthy until job data arrived,
    /// then DLE EOT 4 answers 0x7E.
    PaperOutAfterJob,
    /// Healthy, but 50 ms after each GS ( H reply it sends three unasked bytes `3A` that
    /// look like status bytes reporting offline (noise, a pushed status).
    NoiseAfterReply,
    /// Healthy, but after a job it puts a stray GS ( H reply for id `::::` (whose id
    /// bytes look like status bytes reporting offline) in front of its next status answer.
    StaleReplyBeforeStatus,
}

pub struct FakePrinter {
    pub addr: SocketAddr,
    jobs: Arc<Mutex<Vec<Vec<u8>>>>,
    connections: Arc<AtomicUsize>,
    open: Arc<AtomicUsize>,
    /// Bumped to make the printer close every connection it has (a reboot, an idle
    /// timeout on the printer's side).
    kick: tokio::sync::watch::Sender<u64>,
    task: JoinHandle<()>,
}

impl Drop for FakePrinter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakePrinter {
    pub async fn start(behaviour: Behaviour) -> FakePrinter {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind fake printer");
        let addr = listener.local_addr().expect("local addr");
        let jobs = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(AtomicUsize::new(0));
        let open = Arc::new(AtomicUsize::new(0));
        let (kick, kicked) = tokio::sync::watch::channel(0u64);
        let (j, c, o) = (jobs.clone(), connections.clone(), open.clone());
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                c.fetch_add(1, Ordering::SeqCst);
                let (j, o, mut kicked) = (j.clone(), o.clone(), kicked.clone());
                let _ = kicked.borrow_and_update();
                o.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    tokio::select! {
                        _ = serve_printer(stream, behaviour, j) => {}
                        _ = kicked.changed() => {}
                    }
                    o.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        FakePrinter { addr, jobs, connections, open, kick, task }
    }

    /// Connections open now (as the printer sees them).
    pub fn open_connections(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    /// Closes every connection from the printer's side.
    pub fn kick(&self) {
        self.kick.send_modify(|g| *g += 1);
    }

    pub fn address(&self) -> String {
        format!("tcp://{}", self.addr)
    }

    /// Jobs that reached the paper, in order.
    pub fn jobs(&self) -> Vec<Vec<u8>> {
        self.jobs.lock().expect("jobs lock").clone()
    }

    pub fn job_count(&self) -> usize {
        self.jobs.lock().expect("jobs lock").len()
    }

    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

async fn serve_printer(mut stream: TcpStream, behaviour: Behaviour, jobs: Arc<Mutex<Vec<Vec<u8>>>>) {
    let mut buf: Vec<u8> = Vec::new();
    let mut payload: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 1024];
    // Whether a job reached this printer (for the out-of-paper-after-a-job printer) and
    // whether one was completed since the last status answer.
    let mut had_job = false;
    let mut job_since_status = false;
    loop {
        let n = match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if behaviour == Behaviour::Silent {
            continue;
        }
        buf.extend_from_slice(&chunk[..n]);
        loop {
            if buf.len() >= 3 && buf[0] == 0x10 && buf[1] == 0x04 {
                let n = buf[2];
                buf.drain(..3);
                // A job without GS ( H (the status-only path) is on paper once its data
                // arrived; the status request after it ends it.
                if !payload.is_empty() {
                    jobs.lock().expect("jobs lock").push(std::mem::take(&mut payload));
                    had_job = true;
                    job_since_status = true;
                }
                let out = behaviour == Behaviour::PaperOut || (behaviour == Behaviour::PaperOutAfterJob && had_job);
                let mut answer = Vec::new();
                if behaviour == Behaviour::StaleReplyBeforeStatus && std::mem::take(&mut job_since_status) {
                    answer.extend_from_slice(&onceprint_escpos::ack::reply(*b"::::"));
                }
                answer.push(if out && n == 4 { 0x7E } else { 0x12 });
                if stream.write_all(&answer).await.is_err() {
                    return;
                }
            } else if buf.len() >= 11 && buf[..7] == GS_H {
                let id = [buf[7], buf[8], buf[9], buf[10]];
                buf.drain(..11);
                if !payload.is_empty() {
                    jobs.lock().expect("jobs lock").push(std::mem::take(&mut payload));
                    had_job = true;
                    job_since_status = true;
                }
                let mut reply = Vec::new();
                match behaviour {
                    Behaviour::Healthy | Behaviour::PaperOut | Behaviour::StaleReplyBeforeStatus => {
                        reply.extend_from_slice(&onceprint_escpos::ack::reply(id))
                    }
                    Behaviour::NoiseAfterReply => {
                        if stream.write_all(&onceprint_escpos::ack::reply(id)).await.is_err() {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        reply.extend_from_slice(&[0x3A, 0x3A, 0x3A]);
                    }
                    Behaviour::Slow => {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        reply.extend_from_slice(&onceprint_escpos::ack::reply(id));
                    }
                    Behaviour::WrongIdFirst => {
                        reply.extend_from_slice(&onceprint_escpos::ack::reply(*b"zzzz"));
                        reply.push(0x12);
                        reply.extend_from_slice(&onceprint_escpos::ack::reply(id));
                    }
                    Behaviour::DropAfterJob => return,
                    Behaviour::Clone | Behaviour::Silent | Behaviour::PaperOutAfterJob => {}
                }
                if stream.write_all(&reply).await.is_err() {
                    return;
                }
            } else if is_partial_command(&buf) {
                // The start of a command split across reads; wait for the rest.
                break;
            } else if let Some(b) = buf.first().copied() {
                payload.push(b);
                buf.remove(0);
            } else {
                break;
            }
        }
    }
    // A job without GS ( H (the status-only path) is on paper once the data arrived.
    if !payload.is_empty() {
        jobs.lock().expect("jobs lock").push(payload);
    }
}

const GS_H: [u8; 7] = [0x1D, 0x28, 0x48, 0x06, 0x00, 0x30, 0x30];

fn is_partial_command(buf: &[u8]) -> bool {
    let prefix_of = |cmd: &[u8], full: usize| buf.len() < full && cmd.starts_with(&buf[..buf.len().min(cmd.len())]);
    !buf.is_empty() && (prefix_of(&[0x10, 0x04], 3) || prefix_of(&GS_H, 11))
}

/// The broker side of the agent protocol, in memory.
#[derive(Default)]
pub struct BrokerState {
    pub queue: Mutex<VecDeque<Delivery>>,
    pub work: Notify,
    pub acks: Mutex<Vec<Ack>>,
    pub ack_arrived: Notify,
    pub polls: AtomicUsize,
    pub agent_ids: Mutex<Vec<String>>,
    /// Answer this many ack POSTs with 500 before taking any.
    pub fail_acks: AtomicUsize,
    /// Answer this many polls with 429 and `Retry-After: 1`.
    pub rate_limit_polls: AtomicUsize,
    /// Answer every poll with 409 `agent_superseded` (a newer process took over).
    pub supersede: std::sync::atomic::AtomicBool,
    /// The `(agent_id, session)` of every ack POST and the sessions of the polls.
    pub ack_senders: Mutex<Vec<(Option<String>, Option<String>)>>,
    pub poll_sessions: Mutex<Vec<String>>,
    /// Answer everything with 503 (a node that is going down or cannot reach its database).
    pub unavailable: std::sync::atomic::AtomicBool,
    /// The agent protocol versions this broker serves, `(min, max)`; `None`: any (and no
    /// range header, like a broker of a release before versioning).
    pub protocols: Mutex<Option<(u32, u32)>>,
    /// The `Onceprint-Agent-Protocol` header of every request (poll and ack), in order.
    pub protocol_headers: Mutex<Vec<Option<String>>>,
    /// Deliveries handed out only with the answer to acks that ask for `next` (agent
    /// protocol 2), at most `next` of them per answer.
    pub with_acks: Mutex<VecDeque<Delivery>>,
    /// The `next` of every ack POST (`None`: not asked).
    pub ack_nexts: Mutex<Vec<Option<u64>>>,
}

impl BrokerState {
    pub fn push(&self, d: Delivery) {
        self.queue.lock().expect("queue lock").push_back(d);
        self.work.notify_waiters();
    }

    pub fn acks(&self) -> Vec<Ack> {
        self.acks.lock().expect("acks lock").clone()
    }

    /// Waits until at least `n` acks arrived.
    pub async fn wait_acks(&self, n: usize, within: Duration) -> Vec<Ack> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let acks = self.acks();
            if acks.len() >= n {
                return acks;
            }
            let wait = self.ack_arrived.notified();
            if tokio::time::timeout_at(deadline, wait).await.is_err() {
                let acks = self.acks();
                assert!(acks.len() >= n, "expected {n} acks within {within:?}, got {acks:?}");
                return acks;
            }
        }
    }
}

pub struct FakeBroker {
    pub addr: SocketAddr,
    pub state: Arc<BrokerState>,
    task: JoinHandle<()>,
}

impl Drop for FakeBroker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn authorized(headers: &HeaderMap) -> bool {
    headers.get("authorization").and_then(|v| v.to_str().ok()) == Some(&format!("Bearer {TOKEN}"))
}

fn unauthorized() -> (StatusCode, Json<Value>) {
    (StatusCode::UNAUTHORIZED, Json(json!({"error": {"code": "unauthorized", "message": "bad token"}})))
}

async fn poll(
    State(st): State<Arc<BrokerState>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> (StatusCode, [(&'static str, String); 2], Json<Value>) {
    st.polls.fetch_add(1, Ordering::SeqCst);
    let (code, body) = poll_inner(&st, &headers, body).await;
    let retry = if code == StatusCode::TOO_MANY_REQUESTS { "1" } else { "" };
    (code, [("retry-after", retry.into()), ("onceprint-agent-protocols", range_header(&st))], body)
}

fn range_header(st: &BrokerState) -> String {
    match *st.protocols.lock().expect("protocols lock") {
        Some((min, max)) => format!("{min}-{max}"),
        None => String::new(),
    }
}

/// The checks every endpoint makes first: down, the protocol version, the token.
fn gate(st: &BrokerState, headers: &HeaderMap) -> Option<(StatusCode, Json<Value>)> {
    let version = headers.get("onceprint-agent-protocol").and_then(|v| v.to_str().ok()).map(str::to_owned);
    st.protocol_headers.lock().expect("headers lock").push(version.clone());
    if st.unavailable.load(Ordering::SeqCst) {
        return Some((
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"error": {"code": "unavailable", "message": "going down"}})),
        ));
    }
    if let Some((min, max)) = *st.protocols.lock().expect("protocols lock") {
        let v = version.as_deref().map_or(Some(1), |v| v.parse::<u32>().ok());
        if !v.is_some_and(|v| (min..=max).contains(&v)) {
            return Some((
                StatusCode::UPGRADE_REQUIRED,
                Json(json!({"error": {"code": "agent_protocol_unsupported",
                    "message": format!("this broker serves agent protocol {min} to {max}: upgrade the agent")}})),
            ));
        }
    }
    (!authorized(headers)).then(unauthorized)
}

async fn poll_inner(st: &BrokerState, headers: &HeaderMap, body: Value) -> (StatusCode, Json<Value>) {
    if let Some(refused) = gate(st, headers) {
        return refused;
    }
    if st.rate_limit_polls.load(Ordering::SeqCst) > 0 {
        st.rate_limit_polls.fetch_sub(1, Ordering::SeqCst);
        return (
            StatusCode::TOO_MANY_REQUESTS,
            Json(json!({"error": {"code": "rate_limited", "message": "slow down"}})),
        );
    }
    if st.supersede.load(Ordering::SeqCst) {
        return (
            StatusCode::CONFLICT,
            Json(json!({"error": {"code": "agent_superseded", "message": "a newer process took over"}})),
        );
    }
    st.poll_sessions.lock().expect("sessions lock").push(body["session"].as_str().unwrap_or_default().to_owned());
    let agent_id = body["agent_id"].as_str().unwrap_or_default().to_owned();
    let wait_ms = body["wait_ms"].as_u64().unwrap_or(0);
    let max = body["max"].as_u64().unwrap_or(1) as usize;
    st.agent_ids.lock().expect("ids lock").push(agent_id);
    let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms);
    loop {
        let notified = st.work.notified();
        {
            let mut q = st.queue.lock().expect("queue lock");
            if !q.is_empty() {
                let n = q.len().min(max.max(1));
                let out: Vec<Delivery> = q.drain(..n).collect();
                return (StatusCode::OK, Json(json!({ "deliveries": out })));
            }
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            return (StatusCode::OK, Json(json!({ "deliveries": [] })));
        }
    }
}

async fn acks(
    State(st): State<Arc<BrokerState>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> (StatusCode, [(&'static str, String); 1], Json<Value>) {
    let (code, body) = acks_inner(&st, &headers, body).await;
    (code, [("onceprint-agent-protocols", range_header(&st))], body)
}

async fn acks_inner(st: &BrokerState, headers: &HeaderMap, body: Value) -> (StatusCode, Json<Value>) {
    if let Some(refused) = gate(st, headers) {
        return refused;
    }
    if st.fail_acks.load(Ordering::SeqCst) > 0 {
        st.fail_acks.fetch_sub(1, Ordering::SeqCst);
        return (StatusCode::INTERNAL_SERVER_ERROR, Json(json!({"error": {"code": "internal", "message": "boom"}})));
    }
    st.ack_senders
        .lock()
        .expect("senders lock")
        .push((body["agent_id"].as_str().map(str::to_owned), body["session"].as_str().map(str::to_owned)));
    let parsed: Vec<Ack> = serde_json::from_value(body["acks"].clone()).expect("acks body");
    let results: Vec<Value> = parsed.iter().map(|a| json!({"task_id": a.task_id, "result": "applied"})).collect();
    st.acks.lock().expect("acks lock").extend(parsed);
    st.ack_arrived.notify_waiters();
    let next = body["next"].as_u64();
    st.ack_nexts.lock().expect("nexts lock").push(next);
    match next {
        Some(n) => {
            let mut q = st.with_acks.lock().expect("with_acks lock");
            let k = q.len().min(n as usize);
            let out: Vec<Delivery> = q.drain(..k).collect();
            (StatusCode::OK, Json(json!({ "results": results, "deliveries": out })))
        }
        None => (StatusCode::OK, Json(json!({ "results": results }))),
    }
}

impl FakeBroker {
    pub async fn start() -> FakeBroker {
        FakeBroker::start_on("127.0.0.1:0".parse().expect("addr")).await
    }

    pub async fn start_on(addr: SocketAddr) -> FakeBroker {
        let listener = TcpListener::bind(addr).await.expect("bind fake broker");
        FakeBroker::serve(listener, Arc::new(BrokerState::default()))
    }

    pub fn serve(listener: TcpListener, state: Arc<BrokerState>) -> FakeBroker {
        let addr = listener.local_addr().expect("local addr");
        let app = Router::new()
            .route("/v1/agent/poll", post(poll))
            .route("/v1/agent/acks", post(acks))
            .with_state(state.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeBroker { addr, state, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

pub fn delivery(task_id: &str, attempt: u32, printer_id: &str, address: &str, data: &[u8]) -> Delivery {
    use base64::Engine as _;
    Delivery {
        task_id: task_id.into(),
        attempt,
        printer_id: printer_id.into(),
        printer_address: address.into(),
        idempotency_key: format!("{task_id}#{printer_id}"),
        content_type: "escpos".into(),
        data: base64::engine::general_purpose::STANDARD.encode(data),
        reprint: false,
    }
}

pub fn args(server: &str, state_dir: &Path) -> AgentArgs {
    AgentArgs {
        server: vec![server.into()],
        ca_cert: None,
        token: TOKEN.into(),
        state_dir: state_dir.to_owned(),
        agent_id: None,
        journal_size: 1000,
        poll_wait_ms: 300,
        max_deliveries: 16,
        poll_linger_ms: 5,
        printer_idle_ms: 30_000,
        print_timeout_ms: 1000,
        connect_timeout_ms: 500,
        // The fake broker has no status endpoint; idle watching is tested with the real one.
        status_interval_ms: 0,
        no_printed_ack: Vec::new(),
        listen: None,
        offline_after_ms: 2_000,
        directory_refresh_ms: 60_000,
        // The fake broker has no digest endpoint either.
        digest_interval_ms: 0,
        test_clock_offset_ms: 0,
    }
}

/// A running agent with a handle to stop it.
pub struct RunningAgent {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), onceprint_agent::AgentError>>,
}

impl RunningAgent {
    pub fn start(args: AgentArgs) -> RunningAgent {
        init_logs();
        let (stop, stopped) = oneshot::channel::<()>();
        let shutdown = async move {
            let _ = stopped.await;
        };
        let task = tokio::spawn(onceprint_agent::run(args, shutdown));
        RunningAgent { stop: Some(stop), task }
    }

    /// Waits for the agent to end on its own; its result.
    pub async fn ended(mut self, within: Duration) -> Result<(), onceprint_agent::AgentError> {
        let r = tokio::time::timeout(within, &mut self.task).await;
        match r {
            Ok(Ok(result)) => result,
            other => panic!("agent did not end by itself: {other:?}"),
        }
    }

    /// Asks for a graceful shutdown and expects `Ok` within a few seconds.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let r = tokio::time::timeout(Duration::from_secs(20), &mut self.task).await;
        match r {
            Ok(Ok(Ok(()))) => {}
            other => panic!("agent did not stop cleanly: {other:?}"),
        }
    }
}

/// Shows the agent's logs in a test run with `RUST_LOG=debug`.
pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// Polls `cond` until it holds or `within` passes.
pub async fn eventually<F: Fn() -> bool>(within: Duration, what: &str, cond: F) {
    let deadline = tokio::time::Instant::now() + within;
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs `f` and returns how long it took.
pub async fn timed<T>(f: impl Future<Output = T>) -> (T, Duration) {
    let start = tokio::time::Instant::now();
    let out = f.await;
    (out, start.elapsed())
}
