//! A small TCP round-robin load balancer for tests and benches (`onceprint bench lb`),
//! standing in for haproxy or nginx in front of several `onceprint serve` nodes
//! (docs/DEPLOYMENT.md has their real configurations).
//!
//! One client connection goes to one backend, for its whole life; the next connection
//! goes to the next backend. A backend whose connect fails is skipped for that connection
//! (the next one is tried), and every backend's `GET /readyz` is checked every
//! [`HEALTH_EVERY`], so a node that was killed, or is not ready, gets no new connections
//! until it answers 200 again. With every backend unhealthy, all are still tried, so a
//! health check that lags a restarted node never makes the balancer refuse everything.
//!
//! It must never retry a request on another backend: it does not look into the bytes it
//! carries, so a connection cut by a dying node is cut for the client too, exactly as a
//! real load balancer configured without retries of POSTs does. Connections already open
//! to a backend are left alone when its health check fails (long polls end on their own).
//!
//! Started with an [`Uplink`] ([`LoadBalancer::start_with_uplink`], one backend: a plain
//! proxy), it also plays a shop's internet connection that `bench offline` takes down and
//! brings back. While the uplink is down the balancer still accepts connections, but every
//! byte either side sends is read and dropped, so a request through it times out, as it
//! does when a shop's line is dead, rather than being refused (a refused connection would
//! tell the client at once, which a dead line never does). When the uplink comes back,
//! every connection that lived through the cut is closed, as a router that reconnects
//! (and usually gets a new public address) forgets them; the bytes they lost would
//! otherwise leave both ends waiting forever. Connections opened after that are carried
//! normally.
//!
//! While the line is up it can also be slow or fail one kind of request, the two ways a
//! shop's line misbehaves short of dropping: [`Uplink::set_hold`] makes every answer reach
//! the client that much later (the broker has done the work; only its answer is late),
//! and [`Uplink::set_fail_uploads`] makes the proxy answer `502` itself to every
//! `POST /v1/agent/offline-tasks` (a gateway failing one large request), closing that
//! connection, while every other request passes. For that the proxy follows the HTTP/1.1
//! requests the client sends (their heads and `Content-Length` bodies); a connection that
//! carries anything else is passed through untouched.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::BenchError;

/// How often each backend's `/readyz` is asked.
pub const HEALTH_EVERY: Duration = Duration::from_millis(300);
/// How long a connect to a backend (or a health check) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

struct Backend {
    addr: SocketAddr,
    healthy: AtomicBool,
}

/// Counts of what the balancer did, for reports and tests.
#[derive(Debug, Default)]
pub struct LbCounters {
    /// Client connections carried to a backend.
    pub connections: AtomicU64,
    /// Connects to a backend that failed (another backend was tried).
    pub connect_failures: AtomicU64,
    /// Client connections dropped because no backend could be connected.
    pub refused: AtomicU64,
}

/// The path whose `POST`s an [`Uplink`] can fail: the store agent's upload of the tasks it
/// accepted offline.
pub const UPLOAD_PATH: &str = "/v1/agent/offline-tasks";

/// The state of an [`Uplink`]: up or down, and how many times it changed, so that a
/// connection can tell whether it lived through a cut; and, while up, how late answers
/// arrive and whether uploads fail. Only `up` counts as a change: a slow line or a failing
/// upload closes no connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkState {
    pub up: bool,
    /// Number of changes of `up` so far (even: up, as at the start).
    pub changes: u64,
    /// Every answer (the bytes from the backend) reaches the client this many ms after it
    /// left the backend.
    pub hold_ms: u64,
    /// `POST` [`UPLOAD_PATH`] is answered `502` by the proxy and never reaches the backend.
    pub fail_uploads: bool,
}

/// What an [`Uplink`] did to the requests it follows.
#[derive(Debug, Default)]
pub struct UplinkCounters {
    /// Uploads ([`UPLOAD_PATH`]) answered `502` by the proxy.
    pub uploads_failed: AtomicU64,
    /// Uploads carried to the backend.
    pub uploads_passed: AtomicU64,
}

/// The switch of a balancer's simulated internet connection (see the module docs).
/// Clones share the switch and the counters.
#[derive(Debug, Clone)]
pub struct Uplink {
    state: Arc<watch::Sender<LinkState>>,
    pub counters: Arc<UplinkCounters>,
}

impl Default for Uplink {
    fn default() -> Self {
        let state = LinkState { up: true, changes: 0, hold_ms: 0, fail_uploads: false };
        Self { state: Arc::new(watch::Sender::new(state)), counters: Arc::default() }
    }
}

impl Uplink {
    /// Takes the line down (`false`) or brings it back (`true`); setting the state it
    /// already has changes nothing.
    pub fn set_up(&self, up: bool) {
        self.state.send_if_modified(|s| {
            if s.up == up {
                return false;
            }
            *s = LinkState { up, changes: s.changes + 1, ..*s };
            true
        });
    }

    pub fn is_up(&self) -> bool {
        self.state.borrow().up
    }

    /// Makes every answer arrive `hold` late from now on (zero: as it comes). Bytes
    /// already on their way keep the delay they were given.
    pub fn set_hold(&self, hold: Duration) {
        let hold_ms = u64::try_from(hold.as_millis()).unwrap_or(u64::MAX);
        self.state.send_if_modified(|s| std::mem::replace(&mut s.hold_ms, hold_ms) != hold_ms);
    }

    pub fn hold(&self) -> Duration {
        Duration::from_millis(self.state.borrow().hold_ms)
    }

    /// Answers every upload ([`UPLOAD_PATH`]) whose request head arrives from now on with
    /// `502` (`true`), or carries them again (`false`).
    pub fn set_fail_uploads(&self, fail: bool) {
        self.state.send_if_modified(|s| std::mem::replace(&mut s.fail_uploads, fail) != fail);
    }

    pub fn fails_uploads(&self) -> bool {
        self.state.borrow().fail_uploads
    }

    fn subscribe(&self) -> watch::Receiver<LinkState> {
        self.state.subscribe()
    }
}

/// A running balancer; dropping it stops it (open connections are cut).
pub struct LoadBalancer {
    pub addr: SocketAddr,
    backends: Arc<Vec<Backend>>,
    pub counters: Arc<LbCounters>,
    tasks: Vec<JoinHandle<()>>,
}

impl LoadBalancer {
    /// Listens on `listen` (port 0: any free port) and balances over `backends`.
    pub async fn start(listen: SocketAddr, backends: &[SocketAddr]) -> Result<LoadBalancer, BenchError> {
        Self::start_inner(listen, backends, None).await
    }

    /// [`LoadBalancer::start`] behind a simulated internet connection that `uplink` takes
    /// down and brings back (module docs).
    pub async fn start_with_uplink(
        listen: SocketAddr,
        backends: &[SocketAddr],
        uplink: Uplink,
    ) -> Result<LoadBalancer, BenchError> {
        Self::start_inner(listen, backends, Some(uplink)).await
    }

    async fn start_inner(
        listen: SocketAddr,
        backends: &[SocketAddr],
        uplink: Option<Uplink>,
    ) -> Result<LoadBalancer, BenchError> {
        if backends.is_empty() {
            return Err(BenchError::InvalidOptions("the load balancer needs at least one backend".into()));
        }
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|e| BenchError::io(format!("binding the load balancer to {listen}"), e))?;
        let addr = listener.local_addr().map_err(|e| BenchError::io("the load balancer's address", e))?;
        // Healthy until the first check says otherwise: the nodes are started (and ready)
        // before the balancer is.
        let backends: Arc<Vec<Backend>> =
            Arc::new(backends.iter().map(|&addr| Backend { addr, healthy: AtomicBool::new(true) }).collect());
        let counters = Arc::new(LbCounters::default());
        let mut tasks = vec![tokio::spawn(accept_loop(listener, backends.clone(), counters.clone(), uplink))];
        for i in 0..backends.len() {
            tasks.push(tokio::spawn(health_loop(backends.clone(), i)));
        }
        Ok(LoadBalancer { addr, backends, counters, tasks })
    }

    /// The backends' health as the last checks saw it, in the order given.
    pub fn health(&self) -> Vec<(SocketAddr, bool)> {
        self.backends.iter().map(|b| (b.addr, b.healthy.load(Ordering::Relaxed))).collect()
    }

    /// The balancer's base URL, for clients.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for LoadBalancer {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    backends: Arc<Vec<Backend>>,
    counters: Arc<LbCounters>,
    uplink: Option<Uplink>,
) {
    let next = Arc::new(AtomicUsize::new(0));
    loop {
        let Ok((client, _)) = listener.accept().await else {
            // Out of file descriptors and the like: pause instead of spinning.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let _ = client.set_nodelay(true);
        let start = next.fetch_add(1, Ordering::Relaxed);
        let link = uplink.as_ref().map(|u| (u.subscribe(), u.counters.clone()));
        tokio::spawn(carry(client, backends.clone(), start, counters.clone(), link));
    }
}

/// Connects `client` to the first backend from `start` on that is healthy and accepts
/// the connection (any that accepts, when none is healthy), and copies bytes both ways
/// until either side closes. Behind an uplink (`link`), a connection that arrives while it
/// is down is swallowed (module docs), and one carried is copied through [`through_uplink`].
async fn carry(
    mut client: TcpStream,
    backends: Arc<Vec<Backend>>,
    start: usize,
    counters: Arc<LbCounters>,
    link: Option<(watch::Receiver<LinkState>, Arc<UplinkCounters>)>,
) {
    let born = link.as_ref().map(|(l, _)| *l.borrow());
    if let (Some((link, _)), Some(born)) = (link.clone(), born) {
        if !born.up {
            // The connection reaches the shop's router, and nothing beyond it.
            swallow(client, link, born).await;
            return;
        }
    }
    let n = backends.len();
    let order = (0..n).map(|i| &backends[(start + i) % n]);
    let any_healthy = backends.iter().any(|b| b.healthy.load(Ordering::Relaxed));
    for b in order {
        if any_healthy && !b.healthy.load(Ordering::Relaxed) {
            continue;
        }
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(b.addr)).await {
            Ok(Ok(mut server)) => {
                counters.connections.fetch_add(1, Ordering::Relaxed);
                let _ = server.set_nodelay(true);
                match (link, born) {
                    (Some((link, uplink)), Some(born)) => through_uplink(client, server, link, born, &uplink).await,
                    _ => {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                }
                return;
            }
            _ => {
                counters.connect_failures.fetch_add(1, Ordering::Relaxed);
                // Leave it out until its health check says it is back.
                b.healthy.store(false, Ordering::Relaxed);
            }
        }
    }
    counters.refused.fetch_add(1, Ordering::Relaxed);
}

/// Reads and drops what `client` sends until the uplink has changed since `born` and is
/// up again; then closes it.
async fn swallow(client: TcpStream, mut link: watch::Receiver<LinkState>, born: LinkState) {
    let (mut read, _write) = client.into_split();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        tokio::select! {
            got = read.read(&mut buf) => match got {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    let now = *link.borrow();
                    if now.up && now.changes != born.changes {
                        return;
                    }
                }
            },
            changed = link.changed() => {
                let now = *link.borrow_and_update();
                if changed.is_err() || (now.up && now.changes != born.changes) {
                    return;
                }
            }
        }
    }
}

/// Copies both ways while the uplink is up, drops what either side sends while it is
/// down, and closes both connections once it is up again after a cut (module docs). The
/// client's requests go through [`upstream`] (which may answer an upload `502` itself),
/// the backend's answers through [`downstream`] (which holds them while the line is slow).
async fn through_uplink(
    client: TcpStream,
    server: TcpStream,
    link: watch::Receiver<LinkState>,
    born: LinkState,
    counters: &UplinkCounters,
) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let intercepted = {
        let up = upstream(&mut client_read, &mut server_write, link.clone(), born, counters);
        let down = downstream(&mut server_read, &mut client_write, link, born);
        tokio::pin!(up, down);
        tokio::select! {
            end = &mut up => match end {
                // The client sent all it will send; its last answer may still be coming.
                UpstreamEnd::Closed => {
                    down.await;
                    false
                }
                UpstreamEnd::Reset => false,
                UpstreamEnd::Intercepted => true,
            },
            () = &mut down => false,
        }
    };
    if intercepted {
        // HTTP/1.1 clients send a request only once the answer to the one before has
        // arrived, so no answer of the backend is owed on this connection: the proxy's own
        // answer goes out alone, and the connection ends with it.
        let body = r#"{"error":{"code":"bad_gateway","message":"the shop's line failed this upload (bench proxy)"}}"#;
        let answer = format!(
            "HTTP/1.1 502 Bad Gateway\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = client_write.write_all(answer.as_bytes()).await;
        let _ = client_write.shutdown().await;
    }
}

/// How the client's side of a connection behind an uplink ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UpstreamEnd {
    /// The client closed (or the connection broke); the end was passed on.
    Closed,
    /// The uplink came back after a cut: the connection is forgotten.
    Reset,
    /// An upload was swallowed whole while the uplink fails them: the proxy answers it.
    Intercepted,
}

/// The client's bytes to the backend while the uplink is up (dropped while it is down),
/// following its requests with a [`RequestFramer`] so that an upload can be failed.
async fn upstream(
    from: &mut tokio::net::tcp::OwnedReadHalf,
    to: &mut tokio::net::tcp::OwnedWriteHalf,
    mut link: watch::Receiver<LinkState>,
    born: LinkState,
    counters: &UplinkCounters,
) -> UpstreamEnd {
    let mut buf = vec![0u8; 16 * 1024];
    let mut framer = RequestFramer::default();
    loop {
        tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => {
                    let _ = to.shutdown().await;
                    return UpstreamEnd::Closed;
                }
                Ok(n) => {
                    // The state is read after the bytes arrived: bytes that come while the
                    // line is down never reach the other side, whenever they were sent.
                    let now = *link.borrow();
                    if now.up && now.changes == born.changes {
                        let fed = framer.feed(&buf[..n], now.fail_uploads);
                        counters.uploads_passed.fetch_add(fed.uploads_passed, Ordering::Relaxed);
                        if !fed.pass.is_empty() && to.write_all(&fed.pass).await.is_err() {
                            return UpstreamEnd::Closed;
                        }
                        if fed.intercepted {
                            counters.uploads_failed.fetch_add(1, Ordering::Relaxed);
                            return UpstreamEnd::Intercepted;
                        }
                    } else if now.up {
                        return UpstreamEnd::Reset;
                    }
                }
            },
            changed = link.changed() => {
                let now = *link.borrow_and_update();
                if changed.is_err() || (now.up && now.changes != born.changes) {
                    return UpstreamEnd::Reset;
                }
            }
        }
    }
}

/// The backend's bytes to the client while the uplink is up, each chunk [`LinkState::hold_ms`]
/// after it arrived (as the uplink said when it arrived), in order; dropped while the
/// uplink is down, also a chunk held into a cut. Ends at the backend's end (passed on once
/// every held chunk is out), on an error, or when the uplink is up again after a cut.
async fn downstream(
    from: &mut tokio::net::tcp::OwnedReadHalf,
    to: &mut tokio::net::tcp::OwnedWriteHalf,
    mut link: watch::Receiver<LinkState>,
    born: LinkState,
) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut held: VecDeque<(tokio::time::Instant, Vec<u8>)> = VecDeque::new();
    let mut ended = false;
    loop {
        if ended && held.is_empty() {
            let _ = to.shutdown().await;
            return;
        }
        let due = held.front().map(|(at, _)| *at);
        tokio::select! {
            read = from.read(&mut buf), if !ended => match read {
                Ok(0) | Err(_) => ended = true,
                Ok(n) => {
                    let now = *link.borrow();
                    if now.up && now.changes == born.changes {
                        if now.hold_ms == 0 && held.is_empty() {
                            if to.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        } else {
                            let at = tokio::time::Instant::now() + Duration::from_millis(now.hold_ms);
                            held.push_back((at, buf[..n].to_vec()));
                        }
                    } else if now.up {
                        return;
                    }
                }
            },
            _ = tokio::time::sleep_until(due.unwrap_or_else(tokio::time::Instant::now)), if due.is_some() => {
                let Some((_, bytes)) = held.pop_front() else { continue };
                let now = *link.borrow();
                if now.up && now.changes == born.changes {
                    if to.write_all(&bytes).await.is_err() {
                        return;
                    }
                } else if now.up {
                    return;
                }
            },
            changed = link.changed() => {
                let now = *link.borrow_and_update();
                if changed.is_err() || (now.up && now.changes != born.changes) {
                    return;
                }
            }
        }
    }
}

/// The longest request head the framer waits for before it gives up following a
/// connection.
const MAX_HEAD: usize = 64 * 1024;

/// Follows the HTTP/1.1 requests of one connection, client to backend: each head (up to
/// the blank line) and its `Content-Length` body. A connection whose bytes are not such
/// requests (no method at the start, a chunked body, an oversized head) is passed through
/// untouched from there on.
#[derive(Debug, Default)]
struct RequestFramer {
    /// Bytes of a head not complete yet.
    buf: Vec<u8>,
    /// Body bytes of the current request still to come.
    body_left: usize,
    /// The current request is an upload being failed: its bytes are dropped.
    dropping: bool,
    /// Not following any more: everything passes.
    opaque: bool,
}

/// What [`RequestFramer::feed`] made of some bytes.
#[derive(Debug, Default, PartialEq, Eq)]
struct Fed {
    /// Bytes to send on to the backend.
    pass: Vec<u8>,
    /// Uploads whose head passed.
    uploads_passed: u64,
    /// An upload was swallowed whole (head and body): answer it and close.
    intercepted: bool,
}

impl RequestFramer {
    /// Takes the next bytes from the client; `fail_uploads` decides for each upload whose
    /// head completes in them.
    fn feed(&mut self, data: &[u8], fail_uploads: bool) -> Fed {
        let mut fed = Fed::default();
        self.buf.extend_from_slice(data);
        loop {
            if self.opaque {
                fed.pass.append(&mut self.buf);
                return fed;
            }
            if self.body_left > 0 {
                let k = self.body_left.min(self.buf.len());
                if k == 0 {
                    return fed;
                }
                if self.dropping {
                    self.buf.drain(..k);
                } else {
                    fed.pass.extend(self.buf.drain(..k));
                }
                self.body_left -= k;
                if self.body_left == 0 && self.dropping {
                    fed.intercepted = true;
                    return fed;
                }
                continue;
            }
            if self.buf.is_empty() {
                return fed;
            }
            if !starts_like_a_request(&self.buf) {
                self.opaque = true;
                continue;
            }
            let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4) else {
                if self.buf.len() > MAX_HEAD {
                    self.opaque = true;
                    continue;
                }
                return fed;
            };
            let head: Vec<u8> = self.buf.drain(..end).collect();
            let Some((is_upload, body_len)) = read_head(&head) else {
                self.opaque = true;
                fed.pass.extend(head);
                continue;
            };
            self.dropping = is_upload && fail_uploads;
            if !self.dropping {
                fed.uploads_passed += u64::from(is_upload);
                fed.pass.extend(head);
            }
            self.body_left = body_len;
            if self.dropping && body_len == 0 {
                fed.intercepted = true;
                return fed;
            }
        }
    }
}

/// Whether `buf` can be the start of a request: an upper-case method and a space, or the
/// beginning of one.
fn starts_like_a_request(buf: &[u8]) -> bool {
    let method_len = buf.iter().take_while(|b| b.is_ascii_uppercase()).count();
    match buf.get(method_len) {
        Some(b' ') => (1..=10).contains(&method_len),
        Some(_) => false,
        None => method_len <= 10,
    }
}

/// A request head's meaning to the framer: whether it is an upload (`POST` to
/// [`UPLOAD_PATH`]) and the length of its body; `None` for a head it cannot follow (a
/// chunked body, an unreadable length).
fn read_head(head: &[u8]) -> Option<(bool, usize)> {
    let text = std::str::from_utf8(head).ok()?;
    let mut lines = text.split("\r\n");
    let mut request = lines.next()?.split(' ');
    let (method, target) = (request.next()?, request.next()?);
    let path = target.split('?').next().unwrap_or(target);
    let mut body_len = 0usize;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else { continue };
        let name = name.trim();
        if name.eq_ignore_ascii_case("transfer-encoding") {
            return None;
        }
        if name.eq_ignore_ascii_case("content-length") {
            body_len = value.trim().parse().ok()?;
        }
    }
    Some((method == "POST" && path.ends_with(UPLOAD_PATH), body_len))
}

async fn health_loop(backends: Arc<Vec<Backend>>, i: usize) {
    let b = &backends[i];
    loop {
        let ok = matches!(tokio::time::timeout(CONNECT_TIMEOUT, ready(b.addr)).await, Ok(Ok(true)));
        b.healthy.store(ok, Ordering::Relaxed);
        tokio::time::sleep(HEALTH_EVERY).await;
    }
}

/// `GET /readyz` over a fresh connection: `true` for a 200.
async fn ready(addr: SocketAddr) -> std::io::Result<bool> {
    let mut s = TcpStream::connect(addr).await?;
    s.write_all(format!("GET /readyz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes()).await?;
    let mut head = [0u8; 16];
    let mut got = 0;
    while got < head.len() {
        let n = s.read(&mut head[got..]).await?;
        if n == 0 {
            break;
        }
        got += n;
    }
    Ok(head[..got].starts_with(b"HTTP/1.1 200") || head[..got].starts_with(b"HTTP/1.0 200"))
}

/// Parses a backend given as `http://HOST:PORT` (a trailing `/` allowed) or `HOST:PORT`.
pub fn parse_backend(s: &str) -> Result<SocketAddr, BenchError> {
    let hostport = s.trim().trim_start_matches("http://").trim_end_matches('/');
    use std::net::ToSocketAddrs as _;
    hostport
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| BenchError::InvalidOptions(format!("backend {s:?}: expected http://HOST:PORT")))
}

/// `onceprint bench lb`: runs a balancer until `stop` completes, printing its address
/// and each change of a backend's health to stdout.
pub async fn run_lb(
    listen: SocketAddr,
    backends: &[String],
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), BenchError> {
    let addrs = backends.iter().map(|b| parse_backend(b)).collect::<Result<Vec<_>, _>>()?;
    let lb = LoadBalancer::start(listen, &addrs).await?;
    println!("load balancer listening on {} over {} backends", lb.url(), addrs.len());
    tokio::pin!(stop);
    let mut last = lb.health();
    loop {
        tokio::select! {
            _ = &mut stop => return Ok(()),
            _ = tokio::time::sleep(HEALTH_EVERY) => {}
        }
        let now = lb.health();
        for ((addr, was), (_, is)) in last.iter().zip(&now) {
            if was != is {
                println!("backend {addr} is {}", if *is { "healthy" } else { "down" });
            }
        }
        last = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn post(path: &str, body: &str) -> Vec<u8> {
        format!("POST {path} HTTP/1.1\r\nhost: b\r\ncontent-length: {}\r\n\r\n{body}", body.len()).into_bytes()
    }

    #[test]
    fn the_framer_passes_requests_and_swallows_a_failed_upload_whole() {
        let get = b"GET /v1/agent/directory HTTP/1.1\r\nhost: b\r\n\r\n".to_vec();
        let upload = post(UPLOAD_PATH, r#"{"tasks":[]}"#);
        let mut f = RequestFramer::default();
        let mut both = get.clone();
        both.extend(&upload);
        let fed = f.feed(&both, false);
        assert_eq!((fed.pass, fed.uploads_passed, fed.intercepted), (both.clone(), 1, false));

        // Failing: the upload's head and body never pass, in whatever pieces they come.
        let mut f = RequestFramer::default();
        let first = f.feed(&get, true);
        assert_eq!(first.pass, get);
        let (a, b) = upload.split_at(20);
        let fed = f.feed(a, true);
        assert!(fed.pass.is_empty() && !fed.intercepted, "{fed:?}");
        let (b1, b2) = b.split_at(b.len() - 3);
        let fed = f.feed(b1, true);
        assert!(fed.pass.is_empty() && !fed.intercepted, "{fed:?}");
        assert_eq!(f.feed(b2, true), Fed { pass: Vec::new(), uploads_passed: 0, intercepted: true });
    }

    #[test]
    fn the_framer_leaves_what_it_cannot_follow_alone() {
        let mut f = RequestFramer::default();
        assert_eq!(f.feed(b"hello", true).pass, b"hello");
        let chunked = b"POST /v1/agent/offline-tasks HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n";
        let mut f = RequestFramer::default();
        let fed = f.feed(chunked, true);
        assert_eq!((fed.pass.as_slice(), fed.intercepted), (&chunked[..], false));
        // Another path, or a GET of the upload path, is never failed.
        let mut f = RequestFramer::default();
        let other = post("/v1/agent/acks", "{}");
        assert_eq!(f.feed(&other, true).pass, other);
        assert!(starts_like_a_request(b"POS") && !starts_like_a_request(b"post /") && !starts_like_a_request(b" x"));
    }
}
