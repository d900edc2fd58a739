//! Several broker nodes for the benches (`--nodes N`, `--redis`): N `serve` processes on
//! one PostgreSQL database, each on a fixed port so that a restarted node comes back where
//! the load balancer looks for it, the in-process load balancer ([`crate::lb`]) in front
//! of them, and optionally a `redis-server` of the run's own on a free port.
//!
//! It must never talk to anything but the processes it started on loopback; the Redis it
//! starts keeps nothing on disk (`--save '' --appendonly no`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::broker::{Broker, Launch};
use crate::lb::LoadBalancer;
use crate::procs::Proc;
use crate::sim::free_port_run;
use crate::BenchError;

/// How many nodes a bench may start (all on this machine).
pub const MAX_NODES: usize = 8;

/// Checks `--nodes`: 1 to [`MAX_NODES`], and more than one only on PostgreSQL (the nodes
/// share one database; SQLite is one process's file).
pub fn validate_nodes(nodes: usize, database: Option<&str>) -> Result<(), BenchError> {
    if nodes == 0 || nodes > MAX_NODES {
        return Err(BenchError::InvalidOptions(format!("nodes must be 1–{MAX_NODES}")));
    }
    if nodes > 1 && !database.is_some_and(|d| d.starts_with("postgres")) {
        return Err(BenchError::InvalidOptions(
            "--nodes above 1 needs --database postgres://… (the nodes share one database)".into(),
        ));
    }
    Ok(())
}

/// The launch of node `i` (0-based): its own fixed free port and its own log.
pub fn node_launch(
    exe: &Path,
    database_url: &str,
    admin_token: &str,
    dir: &Path,
    i: usize,
    config: Option<&Path>,
    extra_args: &[String],
) -> Result<Launch, BenchError> {
    let port = free_port_run(1)?;
    let log = if i == 0 { dir.join("broker.log") } else { dir.join(format!("broker-{}.log", i + 1)) };
    Ok(Launch {
        exe: exe.to_path_buf(),
        database_url: database_url.to_string(),
        admin_token: admin_token.to_string(),
        log_path: log,
        listen: SocketAddr::from(([127, 0, 0, 1], port)),
        config: config.map(Path::to_path_buf),
        extra_args: extra_args.to_vec(),
        default_rate_limits: false,
    })
}

/// Starts `n` nodes, one after the other (the first migrates the schema; the others find
/// it migrated), each on a fresh port, trying a port again a few times should it be taken.
pub async fn start_nodes(
    n: usize,
    exe: &Path,
    database_url: &str,
    admin_token: &str,
    dir: &Path,
    config: Option<&Path>,
    extra_args: &[String],
) -> Result<Vec<(Broker, Launch)>, BenchError> {
    let mut nodes = Vec::with_capacity(n);
    for i in 0..n {
        let mut last = None;
        for _ in 0..3 {
            let launch = node_launch(exe, database_url, admin_token, dir, i, config, extra_args)?;
            match Broker::launch(&launch).await {
                Ok(b) => {
                    last = None;
                    nodes.push((b, launch));
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        if let Some(e) = last {
            return Err(e);
        }
    }
    Ok(nodes)
}

/// A balancer over the nodes' addresses.
pub async fn balance(launches: &[Launch]) -> Result<LoadBalancer, BenchError> {
    let addrs: Vec<SocketAddr> = launches.iter().map(|l| l.listen).collect();
    LoadBalancer::start(SocketAddr::from(([127, 0, 0, 1], 0)), &addrs).await
}

/// A `redis-server` of the run's own.
pub struct Redis {
    pub port: u16,
    exe: PathBuf,
    log: PathBuf,
    pub proc: Option<Proc>,
}

impl Redis {
    /// Starts `redis-server` on a free port and waits until it listens.
    pub async fn start(dir: &Path) -> Result<Redis, BenchError> {
        let exe = ["/usr/bin/redis-server", "/usr/local/bin/redis-server", "/usr/sbin/redis-server"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
            .ok_or_else(|| {
                BenchError::InvalidOptions("--redis needs redis-server (apt-get install redis-server)".into())
            })?;
        let port = free_port_run(1)?;
        let mut r = Redis { port, exe, log: dir.join("redis.log"), proc: None };
        r.restart().await?;
        Ok(r)
    }

    /// `redis://127.0.0.1:PORT`, for `serve --redis-url`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts it (again) on its port, empty.
    pub async fn restart(&mut self) -> Result<(), BenchError> {
        let args: Vec<String> =
            ["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
                .iter()
                .map(|s| s.to_string())
                .collect();
        let proc = Proc::spawn("redis-server", &self.exe, &args, &self.log)?;
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if started.elapsed() > Duration::from_secs(10) {
                return Err(BenchError::Protocol {
                    context: "starting redis-server".into(),
                    detail: format!("it did not listen on {} within 10 s\n{}", self.port, proc.log_tail()),
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.proc = Some(proc);
        Ok(())
    }

    /// `kill -9`, the crash the fault run inflicts.
    pub async fn kill9(&mut self) -> Result<(), BenchError> {
        if let Some(p) = self.proc.take() {
            p.kill9().await?;
        }
        Ok(())
    }

    pub async fn stop(&mut self) {
        if let Some(p) = self.proc.take() {
            // Its exit status after SIGTERM is not under test.
            let _ = p.stop().await;
        }
    }
}
