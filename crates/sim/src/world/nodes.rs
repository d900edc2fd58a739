//! The broker as several nodes on one database behind a load balancer, as
//! docs/DEPLOYMENT.md "Deploying onceprint on several nodes" describes them: each node is
//! a whole broker process of its own (first gate, directory cache, agent registry, the
//! polled printers' memory, its group committer), and only the store is shared.
//!
//! The balancer sends each step's request to the node the schedule drew for it
//! (`Op::Via`); `World::broker` is the node serving now, the others wait here. The jobs
//! that must run once per cluster (the sweeper and the paused-printer sweep, the push
//! driver, the polled printers' offline check, retention) run on the node that holds
//! their lease, through the engine's real `Leases` on the store's `leases` table. Every
//! node renews its leases and syncs its agent registry through `agent_sessions` once a
//! second of the time that really passed, as `onceprint serve` does on PostgreSQL, and
//! now and then between two steps where the schedule draws it (`Op::SyncRegistry`), so
//! that nodes hold views of the agents as stale as the documented lag allows. Each node's
//! clock is the broker's wall clock off by a few tens of milliseconds (NTP).
//!
//! A node's kill -9 (`Op::RestartBroker` under `Op::Via`) drops every object of that node
//! alone; the new process has a new node id, as a node without `--node-id` does, so the
//! leases the dead one held pass to whichever node takes them once they expire. A node
//! may also stay down for a while (`Op::NodeDown`, `Op::NodeUp`): the balancer then sends
//! its requests to the nodes up. The node link (LISTEN/NOTIFY) is taken as instant: a
//! node reads the store's LAN listener again whenever the balancer turns to it.

use std::sync::Arc;

use onceprint_engine::clock::{Clock, ManualClock};
use onceprint_engine::lease::{names, LeaseConfig};
use onceprint_engine::Leases;

use super::{Broker, Fail, World};
use crate::schedule::{Op, MAX_NODES};

/// How often a node renews its leases and syncs its agent registry, in the time that
/// really passed (`lease_renew_ms`, `agent_sync_interval_ms`).
const TICK_MS: i64 = 1_000;
/// What a node allows for the lag of what it learns from the others (2 × the sync
/// interval, as `onceprint serve` sets it on a shared database).
pub(super) const REMOTE_LAG_MS: i64 = 2 * TICK_MS;

/// A node's clock: the broker's wall clock, off by what NTP leaves.
struct Skewed {
    base: Arc<ManualClock>,
    skew_ms: i64,
}

impl Clock for Skewed {
    fn now_ms(&self) -> i64 {
        self.base.now_ms() + self.skew_ms
    }
}

/// One node's process as far as the cluster's machinery goes.
struct Node {
    /// The node's broker while another node is the one serving (`World::broker`).
    parked: Option<Broker>,
    id: String,
    clock: Arc<dyn Clock>,
    leases: Arc<Leases>,
    /// The next time (really passed) its lease keeper and registry sync run.
    next_tick: i64,
    /// Killed and not started again: the balancer sends it nothing, it runs nothing.
    down: bool,
}

/// The nodes of a run; empty while the broker is alone (the common case).
#[derive(Default)]
pub(super) struct Nodes {
    nodes: Vec<Node>,
    /// The node `World::broker` is.
    current: usize,
    skew_ms: [i64; MAX_NODES],
    /// Processes started so far (names new node ids).
    started: u64,
    /// A job is running on its lease's holder: the step is not dispatched again.
    in_job: bool,
    /// A node's round that hung while time passed, reported at the next step.
    pub(super) fault: Option<Fail>,
}

impl Nodes {
    /// How far apart the nodes' clocks may be: the world allows that much when it judges
    /// whether a node could have given up on a silent holder.
    pub(super) fn clock_spread(&self) -> i64 {
        let skews = &self.skew_ms[..self.nodes.len().min(MAX_NODES)];
        skews.iter().max().copied().unwrap_or(0) - skews.iter().min().copied().unwrap_or(0)
    }

    pub(super) fn several(&self) -> bool {
        !self.nodes.is_empty()
    }
}

/// The lease of a job that must run once per cluster, if the step is one.
fn lease_of(op: &Op) -> Option<&'static str> {
    match op {
        Op::Sweep | Op::SweepPaused => Some(names::SWEEPER),
        Op::OfflineCheck => Some(names::POLLED_OFFLINE),
        Op::HookPass => Some(names::PUSH_WEBHOOK),
        Op::Prune => Some(names::RETENTION),
        _ => None,
    }
}

impl World {
    /// The broker becomes `n` nodes: node 0 starts again as a node of the cluster, the
    /// others start beside it.
    pub(super) fn start_nodes(&mut self, n: usize, skew_ms: [i64; MAX_NODES]) -> Result<(), Fail> {
        let n = n.clamp(1, MAX_NODES);
        self.nodes = Nodes { skew_ms, ..Nodes::default() };
        for i in 0..n {
            let (broker, node) = self.start_node(i)?;
            if i == 0 {
                self.broker = broker;
                self.nodes.nodes.push(node);
            } else {
                self.nodes.nodes.push(Node { parked: Some(broker), ..node });
            }
        }
        self.nodes.current = 0;
        Ok(())
    }

    /// A new process of node `i`: its broker, its leases (taken now where free, as the
    /// keeper's first round does), its registry synced once (the sync's first round).
    fn start_node(&mut self, i: usize) -> Result<(Broker, Node), Fail> {
        self.nodes.started += 1;
        let id = format!("node-{i}-{}", self.nodes.started);
        let clock: Arc<dyn Clock> =
            Arc::new(Skewed { base: self.clock.clone(), skew_ms: self.nodes.skew_ms[i % MAX_NODES] });
        let leases = Leases::new(self.store.clone(), clock.clone(), id.clone(), LeaseConfig::default());
        for name in [names::SWEEPER, names::POLLED_OFFLINE, names::PUSH_WEBHOOK, names::RETENTION] {
            leases.lease(name);
        }
        let push = leases.lease(names::PUSH_WEBHOOK);
        let broker = self.rt.block_on(async {
            Broker::start_on(&self.store, clock.clone(), &self.policies, &self.hook, REMOTE_LAG_MS, Some(push))
        });
        // Until its first sync a node calls no agent gone and no session quiet.
        broker.lanes.agents().expect_sync();
        let node = Node { parked: None, id, clock, leases, next_tick: self.facts.elapsed + TICK_MS, down: false };
        self.node_round(&broker, &node)?;
        Ok((broker, node))
    }

    /// One round of a node's lease keeper and registry sync. A failed sync is tried again
    /// at the next round, as the node's own loop does (it then calls no agent gone).
    fn node_round(&self, broker: &Broker, node: &Node) -> Result<(), Fail> {
        self.block_on(node.leases.renew_once())?;
        let _ = self.block_on(broker.lanes.agents().sync_once(self.store.as_ref(), &node.id))?;
        Ok(())
    }

    /// The balancer sends what follows to node `node`.
    pub(super) fn route(&mut self, node: usize) {
        if self.nodes.nodes.is_empty() {
            return;
        }
        let n = self.nodes.nodes.len();
        // The balancer's health check has taken a node that is down out: the request goes
        // to the next one up (one always is).
        let Some(to) = (0..n).map(|k| (node + k) % n).find(|&k| !self.nodes.nodes[k].down) else { return };
        if to == self.nodes.current {
            return;
        }
        let Some(next) = self.nodes.nodes[to].parked.take() else { return };
        let was = std::mem::replace(&mut self.broker, next);
        let from = self.nodes.current;
        self.nodes.nodes[from].parked = Some(was);
        self.nodes.current = to;
        // The nodes tell each other of set-up changes over the node link (LISTEN/NOTIFY)
        // within milliseconds: the one such change a run makes, the store's LAN listener
        // taken, has reached this node by the time a request does.
        self.broker.lanes.directory().forget_lan_listener(super::TENANT, super::STORE);
        self.broker.lanes.directory().forget_station(super::TENANT, "st-a");
    }

    /// kill -9 of the node serving now, and a new process in its place.
    pub(super) fn restart_node(&mut self) -> Result<(), Fail> {
        let i = self.nodes.current;
        let (broker, node) = self.start_node(i)?;
        self.broker = broker;
        self.nodes.nodes[i] = node;
        Ok(())
    }

    /// A job that must run once per cluster runs on the node that holds its lease by its
    /// own clock (none while a dead node's lease has not expired; two for the moment two
    /// nodes' clocks disagree on an expiry). `None`: not such a job, or the broker is
    /// alone, and the step runs where it was sent.
    pub(super) fn run_on_lease_holder(&mut self, op: &Op) -> Option<Result<(), Fail>> {
        if self.nodes.in_job || self.nodes.nodes.is_empty() {
            return None;
        }
        let name = lease_of(op)?;
        let holders: Vec<usize> = (0..self.nodes.nodes.len())
            .filter(|&i| !self.nodes.nodes[i].down && self.nodes.nodes[i].leases.lease(name).is_held())
            .collect();
        let back = self.nodes.current;
        self.nodes.in_job = true;
        let mut result = Ok(());
        for i in holders {
            self.route(i);
            result = self.step(op);
            if result.is_err() {
                break;
            }
        }
        self.nodes.in_job = false;
        self.route(back);
        Some(result)
    }

    /// kill -9 of node `node`, which stays down: the balancer sends the requests to the
    /// others, and its leases pass on once they expire. The last node up is never taken
    /// down.
    pub(super) fn node_down(&mut self, node: usize) {
        let n = self.nodes.nodes.len();
        if n == 0 || self.nodes.nodes.iter().filter(|x| !x.down).count() <= 1 {
            return;
        }
        let i = node % n;
        if self.nodes.nodes[i].down {
            return;
        }
        self.nodes.nodes[i].down = true;
        if i == self.nodes.current {
            self.route(i + 1);
        }
        // Every object of its process is gone.
        self.nodes.nodes[i].parked = None;
    }

    /// A down node starts again: a new process with a new node id.
    pub(super) fn node_up(&mut self, node: usize) -> Result<(), Fail> {
        let n = self.nodes.nodes.len();
        if n == 0 || !self.nodes.nodes[node % n].down {
            return Ok(());
        }
        let i = node % n;
        let (broker, started) = self.start_node(i)?;
        self.nodes.nodes[i] = Node { parked: Some(broker), ..started };
        Ok(())
    }

    /// Lets time pass until some node up holds retention's lease (once a dead holder's
    /// lease has expired, the next keeper round takes it), so that the run's final prune
    /// runs somewhere.
    pub(super) fn until_retention_runs(&mut self) {
        for _ in 0..10 {
            let held = self.nodes.nodes.iter().any(|n| !n.down && n.leases.lease(names::RETENTION).is_held());
            if self.nodes.nodes.is_empty() || held {
                return;
            }
            self.advance(TICK_MS);
        }
    }

    /// Node `node` syncs its agent registry now.
    pub(super) fn sync_registry(&mut self, node: usize) -> Result<(), Fail> {
        if self.nodes.nodes.is_empty() {
            return Ok(());
        }
        let i = node % self.nodes.nodes.len();
        let n = &self.nodes.nodes[i];
        if n.down {
            return Ok(());
        }
        let broker = n.parked.as_ref().unwrap_or(&self.broker);
        let _ = self.block_on(broker.lanes.agents().sync_once(self.store.as_ref(), &n.id))?;
        Ok(())
    }

    /// Time passes for several nodes: each renews its leases and syncs its registry every
    /// second of it, each at its own moment.
    pub(super) fn advance_nodes(&mut self, ms: i64) -> Result<(), Fail> {
        let end = self.facts.elapsed + ms.max(0);
        loop {
            let due = self.nodes.nodes.iter().map(|n| n.next_tick).min().unwrap_or(i64::MAX);
            let to = due.min(end);
            if to > self.facts.elapsed {
                self.clock.advance(to - self.facts.elapsed);
                self.facts.elapsed = to;
            }
            if due > end {
                return Ok(());
            }
            for i in 0..self.nodes.nodes.len() {
                if self.nodes.nodes[i].next_tick <= self.facts.elapsed {
                    let n = &self.nodes.nodes[i];
                    if !n.down {
                        let broker = n.parked.as_ref().unwrap_or(&self.broker);
                        self.node_round(broker, n)?;
                    }
                    self.nodes.nodes[i].next_tick += TICK_MS;
                }
            }
        }
    }

    /// The node ids and which leases each holds, for a replay's trace.
    pub(super) fn nodes_trace(&self) -> Option<String> {
        if self.nodes.nodes.is_empty() {
            return None;
        }
        let list: Vec<String> = self
            .nodes
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let held: Vec<String> = n.leases.held().into_iter().filter(|(_, h)| *h).map(|(l, _)| l).collect();
                let here = if n.down {
                    "down "
                } else if i == self.nodes.current {
                    "*"
                } else {
                    ""
                };
                format!("{here}{} ({} ms) [{}]", n.id, n.clock.now_ms() - self.clock.now_ms(), held.join(", "))
            })
            .collect();
        Some(list.join("; "))
    }
}
