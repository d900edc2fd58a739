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

/// The state of an [`Uplink`]: up or down, and how many times it changed, so that a
/// connection can tell whether it lived through a cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkState {
    pub up: bool,
    /// Number of changes so far (even: up, as at the start).
    pub changes: u64,
}

/// The switch of a balancer's simulated internet connection (see the module docs).
/// Clones share the switch.
#[derive(Debug, Clone)]
pub struct Uplink {
    state: Arc<watch::Sender<LinkState>>,
}

impl Default for Uplink {
    fn default() -> Self {
        Self { state: Arc::new(watch::Sender::new(LinkState { up: true, changes: 0 })) }
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
            *s = LinkState { up, changes: s.changes + 1 };
            true
        });
    }

    pub fn is_up(&self) -> bool {
        self.state.borrow().up
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
        tokio::spawn(carry(client, backends.clone(), start, counters.clone(), uplink.as_ref().map(Uplink::subscribe)));
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
    link: Option<watch::Receiver<LinkState>>,
) {
    let born = link.as_ref().map(|l| *l.borrow());
    if let (Some(link), Some(born)) = (link.clone(), born) {
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
                    (Some(link), Some(born)) => through_uplink(client, server, link, born).await,
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
async fn swallow(client: TcpStream, link: watch::Receiver<LinkState>, born: LinkState) {
    let (mut read, _write) = client.into_split();
    pump(&mut read, None, link, born).await;
}

/// Copies both ways while the uplink is up, drops what either side sends while it is
/// down, and closes both connections once it is up again after a cut (module docs).
async fn through_uplink(client: TcpStream, server: TcpStream, link: watch::Receiver<LinkState>, born: LinkState) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    tokio::join!(
        pump(&mut client_read, Some(&mut server_write), link.clone(), born),
        pump(&mut server_read, Some(&mut client_write), link, born),
    );
}

/// One direction of a connection behind an uplink: bytes from `from` go to `to` while the
/// uplink is up and are dropped while it is down. Ends at the end of `from` (passing the
/// end on), on an error, or when the uplink is up again after a change since `born`.
async fn pump(
    from: &mut tokio::net::tcp::OwnedReadHalf,
    mut to: Option<&mut tokio::net::tcp::OwnedWriteHalf>,
    mut link: watch::Receiver<LinkState>,
    born: LinkState,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => {
                    if let Some(to) = to.as_mut() {
                        let _ = to.shutdown().await;
                    }
                    return;
                }
                Ok(n) => {
                    let now = *link.borrow();
                    // The state is read after the bytes arrived: bytes that come while the
                    // line is down never reach the other side, whenever they were sent.
                    if now.up && now.changes == born.changes {
                        if let Some(to) = to.as_mut() {
                            if to.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    } else if now.up {
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
