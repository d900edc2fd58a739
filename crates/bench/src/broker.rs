//! The broker under test: a child process the bench starts, watches, kills and stops.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};

use crate::procs::{die_with_parent, log_tail, parse_vm_hwm, ProcStats};
use crate::BenchError;

/// How long the broker may take to migrate its database and start listening.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a graceful stop may take before the bench kills the broker.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
const READY_PREFIX: &str = "listening on http://";

/// How to start a broker: everything `serve` gets on its command line.
#[derive(Debug, Clone)]
pub struct Launch {
    pub exe: PathBuf,
    pub database_url: String,
    pub admin_token: String,
    /// stdout is read for the ready line; stderr is appended here (a restarted broker
    /// appends to its predecessor's log, so one file tells the whole run).
    pub log_path: PathBuf,
    /// `127.0.0.1:0` lets the OS pick a port; a fixed port lets a restarted broker come
    /// back where its clients (the agent, the submitters) still look for it.
    pub listen: SocketAddr,
    /// A TOML file for `--config`.
    pub config: Option<PathBuf>,
    /// More `serve` flags (they win over the environment and the TOML file).
    pub extra_args: Vec<String>,
    /// Keep the broker's default rate limits (per tenant, per store agent), as a shop
    /// runs it; otherwise they are off (a bench measuring what the broker can do).
    pub default_rate_limits: bool,
}

pub struct Broker {
    child: Child,
    pid: u32,
    pub addr: SocketAddr,
    log_path: PathBuf,
}

impl Broker {
    /// Starts `<exe> serve --listen 127.0.0.1:0 --database <url> --admin-token <token>`
    /// and waits for its `listening on http://…` line. Port 0 lets the OS pick a free
    /// port, so parallel runs never collide; the broker tells us which one it got.
    pub async fn start(exe: &Path, database_url: &str, admin_token: &str, log_path: &Path) -> Result<Self, BenchError> {
        Self::launch(&Launch {
            exe: exe.to_path_buf(),
            database_url: database_url.to_string(),
            admin_token: admin_token.to_string(),
            log_path: log_path.to_path_buf(),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            config: None,
            extra_args: Vec::new(),
            default_rate_limits: false,
        })
        .await
    }

    /// Starts `serve` as `launch` says and waits until it listens.
    pub async fn launch(launch: &Launch) -> Result<Self, BenchError> {
        let log_path = launch.log_path.as_path();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log_path)
            .map_err(|e| BenchError::io(format!("opening {}", log_path.display()), e))?;
        let mut command = Command::new(&launch.exe);
        command
            .args(["serve", "--listen", &launch.listen.to_string(), "--database", &launch.database_url])
            .args(["--admin-token", &launch.admin_token]);
        if let Some(config) = &launch.config {
            command.arg("--config").arg(config);
        }
        command.args(&launch.extra_args);
        if launch.default_rate_limits {
            // A figure a shop sees is measured with the limits a shop has.
            command.env_remove("ONCEPRINT_TENANT_RATE_LIMIT").env_remove("ONCEPRINT_AGENT_RATE_LIMIT");
        } else {
            // Benchmarks that measure what the broker can do turn its rate limits off,
            // unless they set them with `extra_args` (the fairness bench does).
            command.env("ONCEPRINT_TENANT_RATE_LIMIT", "0").env("ONCEPRINT_AGENT_RATE_LIMIT", "0");
        }
        command
            // Keep the broker's log quiet: logging every request would measure the logger.
            // `ONCEPRINT_BENCH_CHILD_LOG` overrides it, as for the other children.
            .env("RUST_LOG", std::env::var("ONCEPRINT_BENCH_CHILD_LOG").unwrap_or_else(|_| "warn".into()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            // Never leave a broker behind if the bench errors out or is cancelled.
            .kill_on_drop(true);
        die_with_parent(&mut command);
        let mut child = command.spawn().map_err(|e| BenchError::io(format!("starting {}", launch.exe.display()), e))?;
        let pid = child.id().unwrap_or(0);
        let Some(stdout) = child.stdout.take() else {
            let _ = child.kill().await;
            return Err(BenchError::BrokerStart { reason: "no stdout pipe".into(), stderr: log_tail(log_path, 40) });
        };
        let mut lines = BufReader::new(stdout).lines();

        let found = tokio::time::timeout(START_TIMEOUT, async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(rest) = line.trim().strip_prefix(READY_PREFIX) {
                    return Some(rest.trim_end_matches('/').to_string());
                }
            }
            None
        })
        .await;

        let addr_text = match found {
            Ok(Some(text)) => text,
            Ok(None) => {
                // stdout closed: the broker exited (or closed stdout) without listening.
                let status = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
                let reason = match status {
                    Ok(Ok(s)) => format!("broker exited with {s} before it was listening"),
                    _ => "broker closed its stdout before it was listening".to_string(),
                };
                return Err(BenchError::BrokerStart { reason, stderr: log_tail(log_path, 40) });
            }
            Err(_) => {
                let _ = child.kill().await;
                return Err(BenchError::BrokerStart {
                    reason: format!("no `{READY_PREFIX}…` line within {START_TIMEOUT:?}"),
                    stderr: log_tail(log_path, 40),
                });
            }
        };
        let addr: SocketAddr = addr_text.parse().map_err(|_| BenchError::BrokerStart {
            reason: format!("cannot parse the address in `{READY_PREFIX}{addr_text}`"),
            stderr: log_tail(log_path, 40),
        })?;
        // The bench promises to talk to nothing but the broker it started on loopback.
        if !addr.ip().is_loopback() {
            let _ = child.kill().await;
            return Err(BenchError::BrokerStart {
                reason: format!("broker announced {addr}, which is not a loopback address"),
                stderr: log_tail(log_path, 40),
            });
        }
        // Keep reading stdout so the broker never blocks on a full pipe.
        tokio::spawn(drain(lines));
        Ok(Self { child, pid, addr, log_path: log_path.to_path_buf() })
    }

    /// Peak RSS and CPU time so far, read while the broker still runs.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn stats(&self) -> ProcStats {
        ProcStats::of(self.pid)
    }

    /// The broker's peak resident set size in KiB (`VmHWM`), read while it still runs.
    pub fn peak_rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).ok()?;
        parse_vm_hwm(&status)
    }

    /// `Some(status)` once the broker has exited on its own (it is then reaped).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// `kill -9` and reap: the crash the fault run inflicts.
    pub async fn kill9(mut self) -> Result<(), BenchError> {
        self.child.start_kill().map_err(|e| BenchError::io("killing the broker", e))?;
        self.child.wait().await.map_err(|e| BenchError::io("reaping the broker", e))?;
        Ok(())
    }

    /// Stops the broker with SIGTERM (the contract's graceful shutdown) and waits; kills
    /// it if it has not exited within [`STOP_TIMEOUT`]. Returns the exit status, or
    /// `None` when it had to be killed.
    pub async fn stop(mut self) -> Result<Option<ExitStatus>, BenchError> {
        if let Some(status) = self.exited() {
            return Ok(Some(status));
        }
        crate::procs::sigterm(self.pid);
        match tokio::time::timeout(STOP_TIMEOUT, self.child.wait()).await {
            Ok(Ok(status)) => Ok(Some(status)),
            Ok(Err(e)) => Err(BenchError::io("waiting for the broker to exit", e)),
            Err(_) => {
                let _ = self.child.kill().await;
                Ok(None)
            }
        }
    }

    pub fn log_tail(&self) -> String {
        log_tail(&self.log_path, 40)
    }
}

async fn drain(mut lines: tokio::io::Lines<BufReader<ChildStdout>>) {
    while let Ok(Some(_)) = lines.next_line().await {}
}
