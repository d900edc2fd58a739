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

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
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
        let mut tasks = vec![tokio::spawn(accept_loop(listener, backends.clone(), counters.clone()))];
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

async fn accept_loop(listener: TcpListener, backends: Arc<Vec<Backend>>, counters: Arc<LbCounters>) {
    let next = Arc::new(AtomicUsize::new(0));
    loop {
        let Ok((client, _)) = listener.accept().await else {
            // Out of file descriptors and the like: pause instead of spinning.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let _ = client.set_nodelay(true);
        let start = next.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(carry(client, backends.clone(), start, counters.clone()));
    }
}

/// Connects `client` to the first backend from `start` on that is healthy and accepts
/// the connection (any that accepts, when none is healthy), and copies bytes both ways
/// until either side closes.
async fn carry(mut client: TcpStream, backends: Arc<Vec<Backend>>, start: usize, counters: Arc<LbCounters>) {
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
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
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
