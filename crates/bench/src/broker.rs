//! The broker under test: a child process the bench starts, watches and stops.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};

use crate::BenchError;

/// How long the broker may take to migrate its database and start listening.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a graceful stop may take before the bench kills the broker.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
const READY_PREFIX: &str = "listening on http://";

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
        let log = std::fs::File::create(log_path)
            .map_err(|e| BenchError::io(format!("creating {}", log_path.display()), e))?;
        let mut child = Command::new(exe)
            .args(["serve", "--listen", "127.0.0.1:0", "--database", database_url])
            .args(["--admin-token", admin_token])
            // Keep the broker's log quiet: logging every request would measure the logger.
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            // Never leave a broker behind if the bench errors out or is cancelled.
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| BenchError::io(format!("starting {}", exe.display()), e))?;
        let pid = child.id().unwrap_or(0);
        let stdout = child.stdout.take().expect("stdout is piped");
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
                return Err(BenchError::BrokerStart { reason, stderr: log_tail(log_path) });
            }
            Err(_) => {
                let _ = child.kill().await;
                return Err(BenchError::BrokerStart {
                    reason: format!("no `{READY_PREFIX}…` line within {START_TIMEOUT:?}"),
                    stderr: log_tail(log_path),
                });
            }
        };
        let addr: SocketAddr = addr_text.parse().map_err(|_| BenchError::BrokerStart {
            reason: format!("cannot parse the address in `{READY_PREFIX}{addr_text}`"),
            stderr: log_tail(log_path),
        })?;
        // The bench promises to talk to nothing but the broker it started on loopback.
        if !addr.ip().is_loopback() {
            let _ = child.kill().await;
            return Err(BenchError::BrokerStart {
                reason: format!("broker announced {addr}, which is not a loopback address"),
                stderr: log_tail(log_path),
            });
        }
        // Keep reading stdout so the broker never blocks on a full pipe.
        tokio::spawn(drain(lines));
        Ok(Self { child, pid, addr, log_path: log_path.to_path_buf() })
    }

    /// Peak RSS and CPU time so far, read while the broker still runs.
    pub fn stats(&self) -> crate::procs::ProcStats {
        crate::procs::ProcStats::of(self.pid)
    }

    /// The broker's peak resident set size in KiB (`VmHWM`), read while it still runs.
    pub fn peak_rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).ok()?;
        parse_vm_hwm(&status)
    }

    /// Stops the broker with SIGTERM (the contract's graceful shutdown) and waits; kills
    /// it if it has not exited within [`STOP_TIMEOUT`]. Returns the exit status, or
    /// `None` when it had to be killed.
    pub async fn stop(mut self) -> Result<Option<ExitStatus>, BenchError> {
        if self.pid != 0 {
            // SAFETY: kill(2) on the pid of our own child, which has not been reaped yet
            // (we still own `self.child` and have not waited on it), so the pid cannot
            // have been reused by another process.
            unsafe {
                libc::kill(self.pid as libc::pid_t, libc::SIGTERM);
            }
        }
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
        log_tail(&self.log_path)
    }
}

async fn drain(mut lines: tokio::io::Lines<BufReader<ChildStdout>>) {
    while let Ok(Some(_)) = lines.next_line().await {}
}

/// The last 40 lines of the broker's stderr log, for error messages.
fn log_tail(path: &Path) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            let start = lines.len().saturating_sub(40);
            if lines.is_empty() {
                "(empty)".to_string()
            } else {
                lines[start..].join("\n")
            }
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

fn parse_vm_hwm(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_hwm_is_parsed_in_kib() {
        let status = "Name:\tonceprint\nVmPeak:\t  100 kB\nVmHWM:\t   45678 kB\nVmRSS:\t 40000 kB\n";
        assert_eq!(parse_vm_hwm(status), Some(45678));
        assert_eq!(parse_vm_hwm("Name: x\n"), None);
    }
}
