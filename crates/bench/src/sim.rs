//! The printer simulator of a delivery run (`printer-sim` as a child process): starting
//! it on free loopback ports, and its HTTP control endpoint (health, faults).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hyper::body::Bytes;
use hyper::header::HeaderValue;
use hyper::Method;
use serde_json::Value;

use crate::http::{snippet, Conn};
use crate::procs::Proc;
use crate::{random_hex, BenchError};

/// Most printers a run may simulate (consecutive ports below the ephemeral range).
pub const MAX_PRINTERS: usize = 5_000;

/// A running simulator: `count` printers on consecutive ports from `first_port`, its
/// control endpoint on the port after them, one paper log.
pub struct Sim {
    pub proc: Proc,
    pub first_port: u16,
    pub control: SocketAddr,
    pub paper_log: PathBuf,
}

/// Starts `printer-sim` with `printers` printers on consecutive free ports (and its
/// control endpoint on the port after them), writing `dir/paper.jsonl`, and waits until
/// it answers. Free ports are found by binding them; should another process take one
/// before the simulator does, it fails to start and the bench tries other ports.
pub async fn start_sim(exe: &Path, printers: usize, dir: &Path) -> Result<Sim, BenchError> {
    let paper = dir.join("paper.jsonl");
    let mut last_failure = String::new();
    for _ in 0..5 {
        let first = free_port_run(printers + 1)?;
        let control: SocketAddr = ([127, 0, 0, 1], first + printers as u16).into();
        let args: Vec<String> = vec![
            "printer-sim".into(),
            "--count".into(),
            printers.to_string(),
            "--listen".into(),
            format!("127.0.0.1:{first}"),
            "--paper-log".into(),
            paper.display().to_string(),
            "--control".into(),
            control.to_string(),
            "--fast".into(),
        ];
        let mut proc = Proc::spawn("printer-sim", exe, &args, &dir.join("sim.log"))?;
        let started = Instant::now();
        loop {
            if let Some(status) = proc.exited() {
                last_failure = format!("printer-sim exited with {status}:\n{}", proc.log_tail());
                break;
            }
            if healthy(control).await {
                return Ok(Sim { proc, first_port: first, control, paper_log: paper });
            }
            if started.elapsed() > Duration::from_secs(15) {
                let tail = proc.log_tail();
                let _ = proc.kill9().await;
                return Err(BenchError::Protocol {
                    context: "starting printer-sim".into(),
                    detail: format!("its control endpoint {control} did not answer within 15 s\n{tail}"),
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Err(BenchError::Protocol { context: "starting printer-sim".into(), detail: last_failure })
}

/// The control endpoint takes no authentication; [`Conn::request`] wants a header anyway.
fn no_auth() -> HeaderValue {
    HeaderValue::from_static("Bearer none")
}

pub(crate) async fn healthy(control: SocketAddr) -> bool {
    let Ok(mut conn) = Conn::connect(control).await else { return false };
    matches!(conn.request(Method::GET, "/healthz", &no_auth(), None).await, Ok((s, _)) if s.is_success())
}

/// `PUT /faults` with `body` (the simulator's `FaultUpdate` fields, and `printer` to
/// change one printer instead of all) on an open connection to the control endpoint.
pub async fn put_faults(conn: &mut Conn, body: &Value) -> Result<(), String> {
    let (status, answer) =
        conn.request(Method::PUT, "/faults", &no_auth(), Some(Bytes::from(body.to_string()))).await?;
    if status.is_success() {
        Ok(())
    } else {
        Err(format!("PUT /faults {body}: HTTP {status}: {}", snippet(&answer, 300)))
    }
}

/// `count` consecutive ports on 127.0.0.1 that are free now, below the ephemeral range
/// (so outgoing connections of this machine never take one meanwhile).
pub fn free_port_run(count: usize) -> Result<u16, BenchError> {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|n| n.parse::<usize>().ok()))
        .unwrap_or(32_768);
    let low = 10_000usize;
    let high = ephemeral_low.saturating_sub(count).max(low + 1);
    let seed = random_hex(8)?;
    let mut rng = crate::plan::SplitMix64::new(u64::from_str_radix(&seed, 16).unwrap_or(1));
    for _ in 0..200 {
        let x = rng.next_u64();
        let first = low + (x as usize % (high - low));
        if first + count > usize::from(u16::MAX) {
            continue;
        }
        let all_free = (first..first + count).all(|p| std::net::TcpListener::bind(("127.0.0.1", p as u16)).is_ok());
        if all_free {
            return Ok(first as u16);
        }
    }
    Err(BenchError::InvalidOptions(format!("found no {count} consecutive free ports on 127.0.0.1")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_below_the_ephemeral_range() {
        let first = free_port_run(3).unwrap();
        assert!(first >= 10_000);
        for p in first..first + 3 {
            assert!(std::net::TcpListener::bind(("127.0.0.1", p)).is_ok());
        }
    }
}
