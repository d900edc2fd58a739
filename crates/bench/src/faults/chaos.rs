//! Carrying out the chaos of [`super::schedule::Chaos`]: printer faults through the
//! simulator's control endpoint, and `kill -9` plus restart of the agent and the broker.
//!
//! Each driver owns the process it kills for the length of the fault phase (through a
//! `&mut Option<…>` of the run, so whatever is running when the bench fails is still
//! stopped by the run's clean-up, and killed on drop if that fails too).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use super::schedule::{FaultEvent, Kill};
use crate::broker::{Broker, Launch};
use crate::http::Conn;
use crate::procs::Proc;
use crate::sim::put_faults;
use crate::BenchError;

/// A restarted broker that fails to start is tried again this often (its port may be
/// held for a moment by the dying process's sockets).
const BROKER_RESTART_TRIES: usize = 5;

/// One kill as it happened.
#[derive(Debug, Clone, Default, Serialize)]
pub struct KillRecord {
    /// Seconds after the fault phase began.
    pub at_s: f64,
    /// From the kill until the process was back (the broker: listening again; the agent:
    /// started again).
    pub down_ms: f64,
}

/// A span of the fault phase (µs after it began) in which the broker was down: from just
/// before its kill until it listened again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outage {
    pub from_us: u64,
    pub to_us: u64,
}

/// Applies the printer fault events at their moments. `target` names printer `i`: the
/// control endpoint of the simulator that plays it, and its name there. Returns the faults
/// injected per kind.
pub async fn printer_faults(
    target: impl Fn(usize) -> (SocketAddr, String),
    events: &[FaultEvent],
    t0: Instant,
) -> Result<BTreeMap<String, usize>, BenchError> {
    let mut injected = BTreeMap::new();
    let mut conns: HashMap<SocketAddr, Option<Conn>> = HashMap::new();
    for e in events {
        tokio::time::sleep_until((t0 + Duration::from_millis(e.at_ms)).into()).await;
        let (control, name) = target(e.printer);
        let mut body = e.kind.fields(e.on);
        if let Value::Object(map) = &mut body {
            map.insert("printer".into(), Value::String(name));
        }
        put(conns.entry(control).or_default(), control, &body).await?;
        if e.on {
            *injected.entry(e.kind.name().to_string()).or_default() += 1;
        }
    }
    Ok(injected)
}

/// `PUT /faults` on `conn` (opened or reopened as needed; one retry on a fresh connection,
/// since the simulator never goes away on its own and a second failure means it is gone).
pub async fn put(conn: &mut Option<Conn>, control: SocketAddr, body: &Value) -> Result<(), BenchError> {
    let mut last = String::new();
    for _ in 0..2 {
        if conn.is_none() {
            match Conn::connect(control).await {
                Ok(c) => *conn = Some(c),
                Err(e) => {
                    last = e;
                    continue;
                }
            }
        }
        if let Some(c) = conn.as_mut() {
            match put_faults(c, body).await {
                Ok(()) => return Ok(()),
                Err(e) => {
                    last = e;
                    *conn = None;
                }
            }
        }
    }
    Err(BenchError::Protocol { context: "changing printer faults".into(), detail: last })
}

/// What restarting the agent needs.
pub struct AgentCtx<'a> {
    pub exe: &'a Path,
    pub args: &'a [String],
    pub log: &'a Path,
    /// The wall clock of each life, off the machine's by this much, in turn (`[]`: the
    /// machine's).
    pub clocks: &'a [i64],
    lives: std::sync::atomic::AtomicUsize,
}

impl<'a> AgentCtx<'a> {
    pub fn new(exe: &'a Path, args: &'a [String], log: &'a Path, clocks: &'a [i64]) -> AgentCtx<'a> {
        AgentCtx { exe, args, log, clocks, lives: std::sync::atomic::AtomicUsize::new(0) }
    }

    /// The wall clock offset of each life started so far, in ms (all 0 without clocks).
    pub fn offsets(&self) -> Vec<i64> {
        let lives = self.lives.load(std::sync::atomic::Ordering::Relaxed);
        (0..lives).map(|life| if self.clocks.is_empty() { 0 } else { self.clocks[life % self.clocks.len()] }).collect()
    }

    /// Starts the next life of the agent, with its wall clock as [`AgentCtx::clocks`] say.
    pub fn spawn(&self) -> Result<Proc, BenchError> {
        let life = self.lives.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut args = self.args.to_vec();
        if !self.clocks.is_empty() {
            args.push(format!("--test-clock-offset-ms={}", self.clocks[life % self.clocks.len()]));
        }
        Proc::spawn("agent", self.exe, &args, self.log)
    }
}

/// Kills the agent at each kill's moment and starts it again, with the same state
/// directory and agent id, after the kill's down time. An agent that had exited on its
/// own before a kill is noted in `notes` (and started again too).
pub async fn agent_kills(
    agent: &mut Option<Proc>,
    ctx: &AgentCtx<'_>,
    kills: &[Kill],
    t0: Instant,
    notes: &mut Vec<String>,
) -> Result<Vec<KillRecord>, BenchError> {
    let mut done = Vec::with_capacity(kills.len());
    for (i, k) in kills.iter().enumerate() {
        tokio::time::sleep_until((t0 + Duration::from_millis(k.at_ms)).into()).await;
        let killed_at = Instant::now();
        if let Some(mut a) = agent.take() {
            match a.exited() {
                Some(status) => notes.push(format!("the agent exited on its own with {status} before kill #{}", i + 1)),
                None => a.kill9().await?,
            }
        }
        tokio::time::sleep(Duration::from_millis(k.down_ms)).await;
        *agent = Some(ctx.spawn()?);
        done.push(KillRecord {
            at_s: killed_at.duration_since(t0).as_secs_f64(),
            down_ms: killed_at.elapsed().as_secs_f64() * 1000.0,
        });
    }
    Ok(done)
}

/// Kills the broker at each kill's moment and starts it again on the same address and
/// database after the kill's down time. Returns the kills and the outages they caused.
pub async fn broker_kills(
    brokers: &mut [Option<Broker>],
    launches: &[Launch],
    kills: &[Kill],
    t0: Instant,
    notes: &mut Vec<String>,
) -> Result<(Vec<KillRecord>, Vec<Outage>), BenchError> {
    let us = |at: Instant| at.saturating_duration_since(t0).as_micros() as u64;
    let mut done = Vec::with_capacity(kills.len());
    let mut outages = Vec::with_capacity(kills.len());
    for (i, k) in kills.iter().enumerate() {
        // With several nodes the kills go to the nodes in turn.
        let node = i % brokers.len().max(1);
        let (Some(broker), Some(launch)) = (brokers.get_mut(node), launches.get(node)) else { break };
        tokio::time::sleep_until((t0 + Duration::from_millis(k.at_ms)).into()).await;
        let killed_at = Instant::now();
        if let Some(mut b) = broker.take() {
            match b.exited() {
                Some(status) => notes.push(format!(
                    "the broker on {} exited on its own with {status} before kill #{}",
                    launch.listen,
                    i + 1
                )),
                None => b.kill9().await?,
            }
        }
        tokio::time::sleep(Duration::from_millis(k.down_ms)).await;
        *broker = Some(restart_broker(launch).await?);
        let up = Instant::now();
        done.push(KillRecord {
            at_s: killed_at.duration_since(t0).as_secs_f64(),
            down_ms: up.duration_since(killed_at).as_secs_f64() * 1000.0,
        });
        outages.push(Outage { from_us: us(killed_at), to_us: us(up) });
    }
    Ok((done, outages))
}

/// Starts the broker as `launch` says, trying again a few times if it does not come up.
pub async fn restart_broker(launch: &Launch) -> Result<Broker, BenchError> {
    let mut tries = 0;
    loop {
        tries += 1;
        match Broker::launch(launch).await {
            Ok(b) => return Ok(b),
            Err(e) if tries >= BROKER_RESTART_TRIES => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(300)).await,
        }
    }
}
