//! The simulated world of one run: the real broker (intake, lane engine, agent transport,
//! CloudPRNT and Epson adapters on the polled mechanism, the push driver, manual channel,
//! sweeps, offline sync, retention) on a real store, under a clock only the schedule
//! moves; around it a POS, two store agents running the agent's own worker and journal
//! (`store_agent`), their ESC/POS printers, a CloudPRNT printer, an Epson printer and a
//! webhook receiver simulated by their documented rules, the shop's LAN path (`lan`), an
//! onceprint MQTT device and a Star printer in CloudPRNT Version MQTT behind a simulated
//! MQTT server, on the broker's real MQTT transport and inbox (`mqtt`), and
//! a network of requests that may be lost, repeated, reordered or lose their answers. The
//! world knows what the broker cannot: what came out on paper. `check` compares the two
//! after every step.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use onceprint_core::content::Content;
use onceprint_core::manual::ManualAction;
use onceprint_core::results::epson;
use onceprint_core::results::star;
use onceprint_core::{Outcome, PolicyTable, Proof, TaskState};
use onceprint_engine::clock::{Clock, ManualClock};
use onceprint_engine::retention::{Retention, RetentionConfig};
use onceprint_engine::transport::cloudprnt::{CloudPrnt, CloudPrntError, PollIn};
use onceprint_engine::transport::epson_sdp::EpsonSdp;
use onceprint_engine::transport::polled::{Polled, PolledConfig};
use onceprint_engine::transport::push::{Asked, PushConfig, PushDriver, PushTransport, Sent};
use onceprint_engine::transport::TransportKind;
use onceprint_engine::Claimant;
use onceprint_engine::{
    AckIn, ActionError, ActionRequest, Actor, AgentDelivery, AgentRegistry, AgentTransport, DeliveryConfig, Directory,
    Intake, IntakeConfig, IntakeError, LaneEngine, Operations, OperationsConfig, PollError, RegistryConfig, Shared,
    StoreSignals, SubmitKind, SubmitRequest,
};
use onceprint_store::testing::Harness;
use onceprint_store::{
    AgentIdentity, NewPrinter, NewStation, NewStore, NewTenant, OriginKind, SetupAudit, Store, Task, TaskQuery,
};
use tokio::runtime::Runtime;

use crate::schedule::{AgentPrint, CloudPrint, EpsonPrint, Op, AGENTS, SILENCE_MS, WEBHOOK_STATUS};

mod lan;
mod mqtt;
mod nodes;
mod store_agent;

const TENANT: &str = "t";
/// The store agents' ids; the first holds the store's LAN listener once the shop's POS
/// uses it.
const AGENT_IDS: [&str; AGENTS] = ["agent-1", "agent-2"];
const STORE: &str = "s";
const AGENT_PRINTERS: [&str; 2] = ["a1", "a2"];
const CLOUD: &str = "c1";
const CLOUD_MAC: &str = "00:11:62:00:00:01";
const EPSON: &str = "e1";
const HOOK: &str = "w1";
/// Printers a transfer names, by the schedule's index (the MQTT printers last).
const TRANSFER_TO: [&str; crate::schedule::PRINTERS + crate::schedule::MQTT_PRINTERS] =
    ["a1", "a2", "c1", "e1", "w1", mqtt::PRINTERS[0], mqtt::PRINTERS[1]];
/// The schedule's targets (see `schedule::TARGETS`, then `schedule::MQTT_TARGETS`): the
/// name, and whether it is a station.
const TARGETS: [(&str, bool); crate::schedule::TARGETS + crate::schedule::MQTT_TARGETS] = [
    ("a1", false),
    ("a2", false),
    ("c1", false),
    ("st-a", true),
    ("st-x", true),
    ("e1", false),
    ("st-y", true),
    ("w1", false),
    mqtt::TARGETS[0],
    mqtt::TARGETS[1],
    mqtt::TARGETS[2],
    mqtt::TARGETS[3],
];
/// Print types of three priorities; `kitchen` reprints on doubt.
pub const TYPES: [(&str, i32); 4] = [("refund", 0), ("receipt", 10), ("kitchen", 20), ("prebill", 40)];
const MAX_ATTEMPTS: u32 = 3;
/// How long a ticket may wait for a paused printer (the default is ten minutes).
const MAX_WAIT_MS: i64 = 30_000;
/// Simulated time starts here (2027-01-15), whatever the machine's clock says.
const START: i64 = 1_800_000_000_000;
/// The simulated broker's settings that decide when silence lets it give up on a
/// delivery: a store agent is gone after 5 s; the CloudPRNT printer (polling every 2 s) is
/// offline after 2 × 2 s + 5 s; a job it fetched must be answered within 30 s.
const AGENT_GONE_MS: i64 = 5_000;
const CLOUD_OFFLINE_MS: i64 = 9_000;
const CLOUD_ANSWER_WITHIN_MS: i64 = 30_000;
/// A webhook delivery without an answer this long goes to a person.
const PUSH_DOUBT_AFTER_MS: i64 = 20_000;
/// Simulated seconds the lanes get to drain once faults stop, beyond any backward clock
/// steps of the run.
const DRAIN_ROUNDS: i64 = 120;

/// A broken promise or an engine error, at a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The step after which it was seen (`None`: while draining after the last step).
    pub step: Option<usize>,
    pub what: String,
}

/// What a run did, for the report.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub steps: u64,
    pub tasks: u64,
    pub printed: u64,
    pub in_doubt: u64,
    pub failed: u64,
    pub copies: u64,
    pub faults: u64,
    /// Tasks retention pruned to their tombstones.
    pub pruned: u64,
}

impl std::ops::AddAssign for Tally {
    fn add_assign(&mut self, o: Tally) {
        self.steps += o.steps;
        self.tasks += o.tasks;
        self.printed += o.printed;
        self.in_doubt += o.in_doubt;
        self.failed += o.failed;
        self.copies += o.copies;
        self.faults += o.faults;
        self.pruned += o.pruned;
    }
}

type Fail = String;

/// The broker process: everything that a kill -9 loses is in here.
struct Broker {
    lanes: Arc<LaneEngine>,
    agents: AgentTransport,
    intake: Intake,
    operations: Operations,
    cloudprnt: CloudPrnt,
    epson: EpsonSdp,
    push: PushDriver,
    offline: onceprint_engine::Offline,
    retention: Arc<Retention>,
}

/// Retention's clock: the simulated wall clock two days on, so that with
/// `retention_days = 1` every task finished by now is due, even one stamped by the clock
/// before it stepped back (a run's steps add up to far less than a day).
struct DaysLater(Arc<dyn Clock>);

impl Clock for DaysLater {
    fn now_ms(&self) -> i64 {
        self.0.now_ms() + 2 * 86_400_000
    }
}

impl Broker {
    /// Must run inside the runtime (intake starts its group committer there).
    fn start(store: &Arc<dyn Store>, clock: &Arc<ManualClock>, policies: &PolicyTable, hook: &Arc<SimHook>) -> Broker {
        Broker::start_on(store, clock.clone(), policies, hook, 0, None)
    }

    /// A broker process on `clock`; a node of several allows `remote_lag_ms` for what the
    /// other nodes heard and pushes only under `push_lease`.
    fn start_on(
        store: &Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        policies: &PolicyTable,
        hook: &Arc<SimHook>,
        remote_lag_ms: i64,
        push_lease: Option<onceprint_engine::Lease>,
    ) -> Broker {
        let config = DeliveryConfig {
            redeliver_after_ms: SILENCE_MS,
            agent_gone_after_ms: AGENT_GONE_MS,
            takeover_quiet_ms: 1_000,
            station_failover_after_ms: 5_000,
            ..DeliveryConfig::default()
        };
        let registry = AgentRegistry::new(
            clock.clone() as Arc<dyn Clock>,
            RegistryConfig {
                gone_after_ms: config.agent_gone_after_ms,
                takeover_quiet_ms: config.takeover_quiet_ms,
                remote_lag_ms,
            },
        );
        let directory = Arc::new(Directory::new(store.clone()));
        let intake_config = IntakeConfig { policies: policies.clone(), ..IntakeConfig::default() };
        // One process's signals, shared by intake and the lanes as `onceprint serve` shares
        // them. Nodes do not pass them to each other: the node link's notifications of new
        // work are taken as lost, and a polled printer's lane found empty on one node is
        // read again by the lanes' own safety net.
        let signals = Arc::new(StoreSignals::default());
        let intake =
            Intake::start(store.clone(), directory.clone(), signals.clone(), intake_config).with_clock(clock.clone());
        let shared = Shared {
            store: store.clone(),
            directory,
            gate: intake.gate().clone(),
            signals,
            policies: policies.clone(),
        };
        let offline = onceprint_engine::Offline::new(
            store.clone(),
            shared.directory.clone(),
            shared.gate.clone(),
            shared.signals.clone(),
            onceprint_engine::OfflineConfig {
                policies: policies.clone(),
                content_limits: onceprint_core::content::ContentLimits::default(),
                charge: 1,
            },
        )
        .with_clock(clock.clone());
        let lanes = Arc::new(LaneEngine::new(shared.clone(), config, clock.clone(), registry));
        let polled = Polled::new(
            lanes.clone(),
            TransportKind::Cloudprnt,
            PolledConfig { answer_within_ms: CLOUD_ANSWER_WITHIN_MS, ..PolledConfig::default() },
        );
        let epson = Polled::new(
            lanes.clone(),
            TransportKind::EpsonSdp,
            PolledConfig { answer_within_ms: CLOUD_ANSWER_WITHIN_MS, ..PolledConfig::default() },
        );
        let mut push = PushDriver::new(
            lanes.clone(),
            hook.clone() as Arc<dyn PushTransport>,
            PushConfig { recheck_after_ms: SILENCE_MS, doubt_after_ms: PUSH_DOUBT_AFTER_MS, ..PushConfig::default() },
        );
        if let Some(lease) = push_lease {
            push = push.with_lease(lease);
        }
        let retention = Retention::new(
            store.clone(),
            shared.gate.clone(),
            Arc::new(DaysLater(clock.clone())),
            RetentionConfig { days: 1, ..RetentionConfig::default() },
        );
        Broker {
            push,
            offline,
            retention,
            agents: AgentTransport::new(lanes.clone()),
            cloudprnt: CloudPrnt::new(polled),
            epson: EpsonSdp::new(epson),
            operations: Operations::new(shared, OperationsConfig::default()).with_clock(clock.clone()),
            intake,
            lanes,
        }
    }
}

/// A store agent: the broker-facing side (its session, the deliveries it holds, its acks)
/// here, its process running the agent's real worker and journal (`store_agent`).
struct SimAgent {
    id: &'static str,
    session: String,
    /// How far the shop PC's wall clock is from the broker's.
    clock_offset: i64,
    /// When this process started, in the time that really passed (its monotonic clock).
    started: i64,
    inbox: VecDeque<AgentDelivery>,
    outbox: Vec<AckIn>,
    /// The process: its journal (a file kept across restarts), its printer links.
    process: store_agent::Process,
}

/// A request of an agent on its way to the broker.
#[derive(Clone)]
struct Msg {
    agent: usize,
    session: String,
    acks: Vec<AckIn>,
    next: bool,
}

/// A CloudPRNT printer as Star's protocol reference describes it: it polls, GETs the job
/// it was offered, prints, and confirms with a DELETE and a result code.
#[derive(Default)]
struct SimCloud {
    offered: Option<String>,
    /// The token of the job it fetched, and the job's data.
    fetched: Option<(String, Vec<u8>)>,
    /// Switched off for good.
    dead: bool,
}

/// An Epson TM printer with Server Direct Print as Epson's manuals describe it: it asks for
/// work (GetRequest), the answer carries the job; it prints and reports the result
/// (SetResponse).
#[derive(Default)]
struct SimEpson {
    /// The job it holds: its `printjobid` and its ePOS-Print data.
    job: Option<(String, Vec<u8>)>,
    /// The roll is empty, or the cover open: nothing comes out, and the printer says
    /// which (`EPTR_REC_EMPTY`, `EPTR_COVER_OPEN`) until a person fixes it.
    stopped: Option<&'static str>,
    /// A person has just put in a new roll: it cannot run out within the next ticket.
    fresh_roll: bool,
    dead: bool,
}

/// A webhook printer's receiver as the README's webhook transport describes it: it takes a
/// job (`POST` with the idempotency key), prints each key once however often it is sent,
/// calls back with a status word, and answers the status URL. It is the push driver's
/// `PushTransport` here, so the driver's own code sends, asks and sends again.
#[derive(Default)]
pub struct SimHook(std::sync::Mutex<HookState>);

#[derive(Default)]
struct HookState {
    /// 0 up, 1 refusing connections, 2 breaking while a job is handed over.
    mode: usize,
    /// With mode 2: whether the job gets there all the same.
    arrives: bool,
    /// Jobs by idempotency key: the task and attempt first sent under it, its data, and
    /// its status word once printed.
    jobs: BTreeMap<String, HookJob>,
    /// Keys in the order they arrived.
    order: Vec<String>,
}

#[derive(Clone)]
struct HookJob {
    task_id: String,
    attempt: i32,
    data: Vec<u8>,
    done: Option<&'static str>,
}

impl SimHook {
    fn state(&self) -> std::sync::MutexGuard<'_, HookState> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[async_trait::async_trait]
impl PushTransport for SimHook {
    fn kind(&self) -> TransportKind {
        TransportKind::Webhook
    }

    async fn send(&self, d: &onceprint_engine::lanes::Delivery) -> Sent {
        let mut st = self.state();
        let arrives = match st.mode {
            0 => true,
            1 => {
                return Sent::Failed {
                    outcome: Outcome::Offline,
                    proof: Proof::NotPrinted,
                    detail: "connection refused".into(),
                }
            }
            _ => st.arrives,
        };
        if arrives && !st.jobs.contains_key(&d.idempotency_key) {
            st.order.push(d.idempotency_key.clone());
            st.jobs.insert(
                d.idempotency_key.clone(),
                HookJob { task_id: d.task.task_id.clone(), attempt: d.attempt, data: d.data.clone(), done: None },
            );
        }
        if st.mode == 2 {
            Sent::NotNow { detail: "the connection broke while the job was sent".into() }
        } else {
            Sent::Accepted
        }
    }

    async fn query(&self, d: &onceprint_engine::lanes::Delivery) -> Asked {
        let st = self.state();
        if st.mode != 0 {
            return Asked::Unknown;
        }
        match st.jobs.get(&d.idempotency_key).map(|j| j.done) {
            Some(Some(word)) => match onceprint_core::results::webhook::status(word) {
                Some(c) => Asked::Done { outcome: c.outcome, proof: c.proof, detail: format!("status {word}") },
                None => Asked::Unknown,
            },
            Some(None) => Asked::Pending,
            None => Asked::Unknown,
        }
    }
}

/// One submission of the POS and the task its answer named.
struct Submission {
    req: SubmitRequest,
    task_id: String,
}

/// What the world knows that the broker does not.
#[derive(Default)]
struct Facts {
    /// Copies on paper per task id.
    paper: BTreeMap<String, u32>,
    /// Of those, copies without a reprint banner (`*** REPRINT …`): a ticket may come out
    /// unmarked once, whatever else happens.
    unmarked: BTreeMap<String, u32>,
    /// Tasks an operator marked printed.
    marked: HashSet<String>,
    /// Tasks that were in flight when a fault struck, or went unanswered past a silence:
    /// only they may end `in_doubt`.
    exposed: HashSet<String>,
    /// Keys (target, biz_no, print_type) a fault of the LAN path struck: the broker's task
    /// under such a key may end in doubt.
    exposed_keys: HashSet<(String, String, String)>,
    /// When each task in flight was first seen `sent`, by the broker's clock.
    sent_since: HashMap<String, (i64, i64)>,
    /// When the broker last heard from each store agent (a poll or acks reached it), and
    /// from the CloudPRNT printer, by the broker's clock.
    heard: HashMap<&'static str, (i64, i64)>,
    /// Time that really passed in the run (the broker's clock also steps).
    elapsed: i64,
    /// (printer, priority) → the last task handed out there for the first time.
    first_out: HashMap<(String, i32), ((u64, String), String)>,
    /// The order in which the world first saw each task in the store (then by id): the
    /// order of creation, which a lane keeps within a priority. Task ids cannot tell it:
    /// a task the agent accepted offline carries the shop PC's time.
    created: HashMap<String, (u64, String)>,
    /// Observations so far.
    looks: u64,
    seen: HashSet<String>,
}

/// One run's world.
pub struct World {
    rt: Runtime,
    _harness: Harness,
    store: Arc<dyn Store>,
    clock: Arc<ManualClock>,
    broker: Broker,
    agents: Vec<SimAgent>,
    cloud: SimCloud,
    epson: SimEpson,
    hook: Arc<SimHook>,
    net: Vec<Msg>,
    pos: Vec<Submission>,
    facts: Facts,
    sessions: u64,
    back_steps: i64,
    policies: PolicyTable,
    tally: Tally,
    /// Print each step and the tasks after it (a replay).
    trace: bool,
    /// Whether the shop's line to the broker is up.
    line_up: bool,
    /// The LAN listener's agent's offline outbox (the agent's own code, on a file).
    outbox: onceprint_agent::outbox::Outbox,
    lan: lan::LanFacts,
    /// The LAN listener's agent's state directory.
    agent_dir: std::path::PathBuf,
    /// The network between the LAN listener's agent and the broker.
    wire: lan::Wire,
    /// The LAN glue of the LAN listener's agent's current process (the agent's own code).
    lan_process: Arc<onceprint_agent::simulation::Lan>,
    /// The runtime the agents' own code runs on (its clock paused).
    agent_rt: Runtime,
    /// The ESC/POS printers the agents print to.
    printers: store_agent::Printers,
    /// The MQTT printers, their MQTT server and the broker's MQTT transport.
    mqtt: mqtt::MqttWorld,
    /// The broker's nodes when it runs as several (`broker` is the one serving now).
    nodes: nodes::Nodes,
}

fn policies() -> PolicyTable {
    let mut p = PolicyTable::default();
    p.types.retain(|name, _| TYPES.iter().any(|(t, _)| t == name));
    for (name, prio) in TYPES {
        let t = p.types.get_mut(name).expect("the default policies have every print type used here");
        t.priority = prio;
        t.max_attempts = MAX_ATTEMPTS;
        t.reprint_on_doubt = name == "kitchen";
        // A printer that is gone fails its own tickets within the drain's bound.
        t.max_wait_ms = MAX_WAIT_MS;
        // No jitter: the seed alone decides every time in the run.
        t.backoff = onceprint_core::Backoff { initial_ms: 100, factor: 2.0, cap_ms: 1_000, jitter: 0.0 };
    }
    p
}

fn engine_err(what: &str, e: impl std::fmt::Display) -> Fail {
    format!("engine error in {what}: {e}")
}

impl World {
    /// A world on the store `harness` holds (fresh and migrated).
    pub fn new(rt: Runtime, harness: Harness, trace: bool, agent_dir: &std::path::Path) -> Result<World, Fail> {
        let store = harness.store.clone();
        let outbox = onceprint_agent::outbox::Outbox::open(agent_dir).map_err(|e| engine_err("outbox", e))?;
        let mut processes = Vec::new();
        for (i, id) in AGENT_IDS.iter().enumerate() {
            // The LAN listener's state directory is the one its outbox is in.
            let (dir, outbox) = if i == lan::LISTENER {
                (agent_dir.to_owned(), outbox.clone())
            } else {
                let dir = agent_dir.join(id);
                std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
                let outbox = onceprint_agent::outbox::Outbox::open(&dir).map_err(|e| engine_err("outbox", e))?;
                (dir, outbox)
            };
            processes.push(store_agent::Process::start(&dir, outbox)?);
        }
        let clock = Arc::new(ManualClock::new(START));
        rt.block_on(set_up(&store)).map_err(|e| engine_err("set-up", e))?;
        let policies = policies();
        let hook = Arc::new(SimHook::default());
        let broker = rt.block_on(async { Broker::start(&store, &clock, &policies, &hook) });
        let wire = lan::Wire::default();
        let mut w = World {
            rt,
            _harness: harness,
            store,
            clock,
            broker,
            agents: Vec::new(),
            cloud: SimCloud::default(),
            epson: SimEpson::default(),
            hook,
            net: Vec::new(),
            pos: Vec::new(),
            facts: Facts::default(),
            sessions: 0,
            back_steps: 0,
            policies,
            tally: Tally::default(),
            trace,
            line_up: true,
            outbox: outbox.clone(),
            lan: lan::LanFacts::default(),
            agent_dir: agent_dir.to_owned(),
            wire: wire.clone(),
            lan_process: Arc::new(onceprint_agent::simulation::Lan::new(
                Arc::new(lan::SimUpstream(wire)),
                agent_dir,
                AGENT_IDS[lan::LISTENER],
                outbox,
                lan::OFFLINE_AFTER,
            )),
            agent_rt: store_agent::runtime()?,
            printers: store_agent::Printers::new()?,
            mqtt: mqtt::MqttWorld::default(),
            nodes: nodes::Nodes::default(),
        };
        for (id, process) in AGENT_IDS.into_iter().zip(processes) {
            let session = w.new_session(0);
            w.agents.push(SimAgent {
                id,
                session,
                clock_offset: 0,
                started: 0,
                inbox: VecDeque::new(),
                outbox: Vec::new(),
                process,
            });
        }
        w.mqtt_start()?;
        Ok(w)
    }

    /// Runs the steps, checking after each; then faults stop and every lane must drain.
    pub fn run(mut self, ops: &[Op]) -> Result<Tally, Violation> {
        for (i, op) in ops.iter().enumerate() {
            let result = self.step(op).and_then(|()| self.check());
            if self.trace {
                self.print_trace(&format!("{i:>4}  {op}"));
            }
            result.map_err(|what| Violation { step: Some(i), what })?;
        }
        if self.trace {
            self.print_trace("drain");
        }
        self.drain().map_err(|what| Violation { step: None, what })?;
        self.after_retention().map_err(|what| Violation { step: None, what })?;
        if self.trace {
            self.print_trace("after retention, every order sent again");
        }
        self.final_check().map_err(|what| Violation { step: None, what })?;
        self.tally.steps = ops.len() as u64;
        Ok(self.tally)
    }

    fn print_trace(&self, head: &str) {
        println!("{head}  (clock +{} ms)", self.clock.now_ms() - START);
        if let Some(nodes) = self.nodes_trace() {
            println!("        nodes: {nodes}");
        }
        for t in self.tasks().unwrap_or_default() {
            let paper = self.facts.paper.get(&t.task_id).copied().unwrap_or(0);
            println!(
                "        {} {:<8} {:<11} {} attempt {} paper {paper}{}{}",
                t.task_id,
                t.biz_no,
                t.state.as_str(),
                t.printer_id,
                t.attempts,
                t.origin_kind
                    .map(|k| format!(" {} of {}", k.as_str(), t.origin_task_id.as_deref().unwrap_or("?")))
                    .unwrap_or_default(),
                t.last_error.as_deref().map(|e| format!(" ({e})")).unwrap_or_default(),
            );
            if matches!(t.state, TaskState::InDoubt | TaskState::Failed) {
                let events =
                    self.block_on(self.store.task_events(TENANT, &t.task_id)).ok().and_then(|e| e.ok()).flatten();
                if let Some(e) = events.and_then(|e| e.last().cloned()) {
                    println!("            by {}: {}", e.actor, e.reason);
                }
            }
        }
    }

    fn clock_now(&self) -> i64 {
        self.clock.now_ms()
    }

    /// Time passes: the broker's clock and the time that really passed.
    fn advance(&mut self, ms: i64) {
        // The agents' monotonic clock (tokio's, paused) moves with the time that passes.
        let d = Duration::from_millis(u64::try_from(ms).unwrap_or(0));
        self.agent_rt.block_on(tokio::time::advance(d));
        if self.nodes.several() {
            if let Err(e) = self.advance_nodes(ms) {
                self.nodes.fault.get_or_insert(e);
            }
            return;
        }
        self.clock.advance(ms);
        self.mqtt.monotonic.advance(ms);
        self.facts.elapsed += ms;
    }

    /// (the broker's clock, the time that really passed)
    fn times(&self) -> (i64, i64) {
        (self.clock.now_ms(), self.facts.elapsed)
    }

    /// A new process's session id, named by the shop PC's wall clock as the real agent
    /// names it.
    fn new_session(&mut self, clock_offset: i64) -> String {
        self.sessions += 1;
        onceprint_core::ids::agent_session_id(self.clock.now_ms() + clock_offset, self.sessions)
    }

    fn block_on<F: std::future::Future>(&self, f: F) -> Result<F::Output, Fail> {
        self.rt
            .block_on(async { tokio::time::timeout(Duration::from_secs(30), f).await })
            .map_err(|_| "a step took longer than 30 s of real time (a hang)".to_owned())
    }

    fn who() -> AgentIdentity {
        AgentIdentity { tenant_id: TENANT.into(), store_id: STORE.into() }
    }

    /// Every task, the pruned ones as their tombstones keep them.
    fn tasks(&self) -> Result<Vec<Task>, Fail> {
        let q = TaskQuery { tenant_id: TENANT.into(), limit: 100_000, ..TaskQuery::default() };
        let mut tasks = self.block_on(self.store.list_tasks(&q))?.map_err(|e| engine_err("list_tasks", e))?;
        if self.tally.pruned > 0 {
            // Task ids are ASCII letters and digits: "~" sorts after every one of them.
            let (_, tombstones) = self
                .block_on(self.store.tasks_and_tombstones_created_between(TENANT, STORE, "", "~"))?
                .map_err(|e| engine_err("tasks_and_tombstones_created_between", e))?;
            tasks.extend(tombstones.into_iter().map(|b| b.task));
        }
        Ok(tasks)
    }

    /// A task, or its tombstone once retention pruned it.
    fn task(&self, id: &str) -> Result<Option<Task>, Fail> {
        if let Some(t) = self.block_on(self.store.get_task(TENANT, id))?.map_err(|e| engine_err("get_task", e))? {
            return Ok(Some(t));
        }
        Ok(self
            .block_on(self.store.get_tombstone(TENANT, id))?
            .map_err(|e| engine_err("get_tombstone", e))?
            .map(|b| b.task))
    }

    fn step(&mut self, op: &Op) -> Result<(), Fail> {
        if let Op::Via { node, op } = op {
            self.route(*node);
            return self.step(op);
        }
        if let Some(result) = self.run_on_lease_holder(op) {
            return result;
        }
        self.observe()?;
        if op.is_fault() {
            self.tally.faults += 1;
        }
        match *op {
            Op::Submit { target, kind } => {
                let n = self.pos.len();
                let (name, station) = TARGETS[target];
                let req = SubmitRequest {
                    tenant_id: TENANT.into(),
                    biz_no: Some(format!("B{n}")),
                    printer_id: (!station).then(|| name.to_owned()),
                    station_id: station.then(|| name.to_owned()),
                    print_type: Some(TYPES[kind].0.to_owned()),
                    content: Some(Content::Text { text: format!("ticket B{n}\n") }),
                    ..SubmitRequest::default()
                };
                self.submit(req, None)?;
            }
            Op::Retry { pick } => {
                if !self.pos.is_empty() {
                    let s = &self.pos[pick % self.pos.len()];
                    let (req, id) = (s.req.clone(), s.task_id.clone());
                    self.submit(req, Some(id))?;
                }
            }
            Op::Conflict { pick } => {
                if !self.pos.is_empty() {
                    let s = &self.pos[pick % self.pos.len()];
                    let mut req = s.req.clone();
                    let id = s.task_id.clone();
                    req.content = Some(Content::Text { text: "another order under the same number\n".into() });
                    match self.block_on(self.broker.intake.submit(req))? {
                        Err(IntakeError::Mismatch { task_id }) if task_id == id => {}
                        other => return Err(format!("a key sent again with other content was answered {other:?}")),
                    }
                }
            }
            Op::Poll { agent, answer_lost } => self.poll(agent, answer_lost)?,
            Op::Handle { agent, print } => self.handle(agent, print)?,
            Op::SendAcks { agent, next } => {
                let a = &self.agents[agent];
                if !a.outbox.is_empty() {
                    self.net.push(Msg { agent, session: a.session.clone(), acks: a.outbox.clone(), next });
                }
            }
            Op::Deliver { pick, dup, answer_lost } => {
                if !self.net.is_empty() {
                    let i = pick % self.net.len();
                    if self.net[i].agent == lan::LISTENER && !self.line_up {
                        // The shop's line is down: it waits on the agent's side.
                        return Ok(());
                    }
                    let msg = if dup { self.net[i].clone() } else { self.net.remove(i) };
                    self.deliver(msg, answer_lost)?;
                }
            }
            Op::Drop { pick } => {
                if !self.net.is_empty() {
                    let i = pick % self.net.len();
                    self.net.remove(i);
                }
            }
            Op::RestartAgent { agent } => self.restart_agent(agent)?,
            Op::CloudPoll { .. } | Op::CloudFetch { .. } | Op::CloudPrint { .. } | Op::CloudPowerCycle { .. }
                if self.cloud.dead => {}
            Op::CloudPoll { status } => self.cloud_poll(status)?,
            Op::CloudFetch { lost } => self.cloud_fetch(lost)?,
            Op::CloudPrint { print } => self.cloud_print(print)?,
            Op::CloudDies => {
                // What it held is gone with it; it may have printed.
                if let Some((token, _)) = self.cloud.fetched.take() {
                    self.facts.exposed.insert(token_task(&token));
                }
                self.cloud = SimCloud { dead: true, ..SimCloud::default() };
            }
            Op::CloudPowerCycle { paper } => {
                if let Some((token, data)) = self.cloud.fetched.take() {
                    self.facts.exposed.insert(token_task(&token));
                    if paper {
                        self.paper(&token_task(&token), &data);
                    }
                }
                self.cloud.offered = None;
            }
            Op::EpsonGet { .. } | Op::EpsonPrint { .. } | Op::EpsonPaper { .. } | Op::EpsonPowerCycle { .. }
                if self.epson.dead => {}
            Op::EpsonGet { lost } => self.epson_get(lost)?,
            Op::EpsonPrint { print } => self.epson_print(print)?,
            Op::EpsonPaper { empty } => {
                // The roll runs out between tickets, or a person puts in a new one (and
                // closes the cover).
                self.epson.stopped = empty.then_some("EPTR_REC_EMPTY");
                self.epson.fresh_roll = !empty;
            }
            Op::EpsonPowerCycle { paper } => {
                if let Some((jobid, data)) = self.epson.job.take() {
                    self.facts.exposed.insert(token_task(&jobid));
                    if paper && self.epson.stopped.is_none() {
                        self.paper(&token_task(&jobid), &data);
                    }
                }
            }
            Op::EpsonDies => {
                if let Some((jobid, _)) = self.epson.job.take() {
                    self.facts.exposed.insert(token_task(&jobid));
                }
                self.epson = SimEpson { dead: true, ..SimEpson::default() };
            }
            Op::HookPass => {
                self.block_on(self.broker.push.pass())?.map_err(|e| engine_err("push pass", e))?;
            }
            Op::HookPrint { status, paper, callback_lost } => self.hook_print(status, paper, callback_lost)?,
            Op::HookMode { mode, arrives } => {
                let mut st = self.hook.state();
                st.mode = mode;
                st.arrives = arrives;
            }
            Op::Line { up } => self.line_up = up,
            Op::LanSubmit { target, kind } => self.lan_submit(target, kind)?,
            Op::LanRetry { pick } => self.lan_retry(pick)?,
            Op::LanToCloud { pick } => self.lan_to_cloud(pick)?,
            Op::LocalPrint { print } => {
                self.local_print(print)?;
            }
            Op::Sync { answer_lost } => self.sync(answer_lost)?,
            Op::LanNet { fault } => self.lan_fault(fault),
            Op::StationEdit { printers } => self.station_edit(printers)?,
            Op::OfflineCheck => {
                self.block_on(self.broker.cloudprnt.polled().check_offline_once())?
                    .map_err(|e| engine_err("check_offline_once", e))?;
                self.block_on(self.broker.epson.polled().check_offline_once())?
                    .map_err(|e| engine_err("check_offline_once", e))?;
            }
            Op::Advance { ms } => self.advance(ms),
            Op::StepClock { ms } => {
                // The broker judges silence by its own clock: after a step, a delivery in
                // flight may look abandoned to it. Doubt is then a safe answer.
                for t in self.tasks()? {
                    if t.state == TaskState::Sent {
                        self.facts.exposed.insert(t.task_id);
                    }
                }
                if ms < 0 {
                    self.back_steps += -ms;
                }
                self.clock.advance(ms);
            }
            Op::StepAgentClock { agent, ms } => self.agents[agent].clock_offset += ms,
            Op::Sweep => {
                self.block_on(self.broker.lanes.sweep_once())?.map_err(|e| engine_err("sweep_once", e))?;
            }
            Op::SweepPaused => {
                self.block_on(self.broker.lanes.sweep_paused())?.map_err(|e| engine_err("sweep_paused", e))?;
            }
            Op::RestartBroker if self.nodes.several() => self.restart_node()?,
            Op::RestartBroker => {
                // What was in the process's memory is gone; the database stays. Requests
                // on the network reach the new process.
                let broker =
                    self.rt.block_on(async { Broker::start(&self.store, &self.clock, &self.policies, &self.hook) });
                self.broker = broker;
                self.mqtt_restart()?;
            }
            Op::Manual { pick, action, to } => self.manual(pick, action, to)?,
            Op::ManualNewest { action, to } => self.manual_newest(action, to)?,
            Op::Prune => {
                let report = self
                    .block_on(self.broker.retention.run_once(&|| false))?
                    .map_err(|e| engine_err("retention", e))?;
                self.tally.pruned += report.tasks;
            }
            Op::Mqtt(ref m) => self.mqtt_step(m)?,
            Op::Nodes { nodes, skew_ms } => self.start_nodes(nodes, skew_ms)?,
            Op::SyncRegistry { node } => self.sync_registry(node)?,
            Op::NodeDown { node } => self.node_down(node),
            Op::NodeUp { node } => self.node_up(node)?,
            // Taken apart before the step is observed.
            Op::Via { .. } => {}
        }
        Ok(())
    }

    fn submit(&mut self, req: SubmitRequest, earlier: Option<String>) -> Result<(), Fail> {
        let answer = self.block_on(self.broker.intake.submit(req.clone()))?;
        let answer = answer.map_err(|e| format!("a valid submission was refused: {e}"))?;
        match earlier {
            // The same task, or (README, "Failover") the live task of its chain when it
            // was transferred.
            Some(id) if answer.kind != SubmitKind::Duplicate || !self.chain(&id)?.contains(&answer.task_id) => {
                return Err(format!(
                    "a retry of {:?} was answered {:?} {} instead of the task {id} or its successors",
                    req.biz_no, answer.kind, answer.task_id
                ));
            }
            Some(_) => {}
            None => {
                if answer.kind != SubmitKind::Created {
                    return Err(format!("a new key {:?} was answered {:?}", req.biz_no, answer.kind));
                }
                // A 201 means durable: the task is there.
                if self.task(&answer.task_id)?.is_none() {
                    return Err(format!("201 for {} but no such task", answer.task_id));
                }
                self.pos.push(Submission { req, task_id: answer.task_id });
            }
        }
        Ok(())
    }

    /// A task and its successors (transfers, failovers), in order.
    fn chain(&self, id: &str) -> Result<Vec<String>, Fail> {
        let mut chain = vec![id.to_owned()];
        while let Some(next) = self.task(chain.last().map_or(id, |s| s.as_str()))?.and_then(|t| t.successor_task_id) {
            if chain.contains(&next) || chain.len() > 16 {
                return Err(format!("the successors of {id} go round: {chain:?}"));
            }
            chain.push(next);
        }
        Ok(chain)
    }

    fn poll(&mut self, agent: usize, answer_lost: bool) -> Result<(), Fail> {
        if agent == lan::LISTENER && !self.line_up {
            return Ok(());
        }
        let (id, session) = (self.agents[agent].id, self.agents[agent].session.clone());
        self.facts.heard.insert(id, self.times());
        // The process's age on its monotonic clock (agent protocol 3).
        let age = (self.facts.elapsed - self.agents[agent].started).max(0) as u64;
        let answer = self.block_on(self.broker.agents.poll(
            &Self::who(),
            id,
            Some(&session),
            Some(age),
            Duration::from_millis(0),
            16,
        ))?;
        let deliveries = match answer {
            Ok(d) => d,
            // A newer process of this agent took over: this one stops and starts again.
            Err(PollError::Superseded(_)) => {
                self.restart_agent(agent)?;
                return Ok(());
            }
            Err(e) => return Err(engine_err("poll", e)),
        };
        if answer_lost {
            // The broker offers them again when they are overdue; nothing may be in doubt
            // for it.
            return Ok(());
        }
        self.receive(agent, deliveries)
    }

    fn first_out(&mut self, task: &Task) -> Result<(), Fail> {
        if self.facts.seen.insert(task.task_id.clone()) {
            let k = (task.printer_id.clone(), task.priority);
            let looks = self.facts.looks;
            let order =
                self.facts.created.entry(task.task_id.clone()).or_insert_with(|| (looks, task.task_id.clone())).clone();
            if let Some((prev, prev_id)) = self.facts.first_out.get(&k) {
                // Tasks first seen in one look were made by one step (an upload of several,
                // say), in an order only the store's sequence knows: no verdict between them.
                if prev.0 > order.0 {
                    return Err(format!(
                        "FIFO within a priority broken on {}: {} handed out after {prev_id}, which came later",
                        task.printer_id, task.task_id
                    ));
                }
            }
            self.facts.first_out.insert(k, (order, task.task_id.clone()));
        }
        Ok(())
    }

    /// Deliveries reach an agent (from a poll, or with the answer to its acks).
    fn receive(&mut self, agent: usize, deliveries: Vec<AgentDelivery>) -> Result<(), Fail> {
        for d in deliveries {
            if let Some(t) = self.task(&d.task_id)? {
                self.first_out(&t)?;
            }
            self.agents[agent].inbox.push_back(d);
        }
        Ok(())
    }

    fn paper(&mut self, task_id: &str, data: &[u8]) {
        *self.facts.paper.entry(task_id.to_owned()).or_default() += 1;
        if !contains(data, b"*** REPRINT") {
            *self.facts.unmarked.entry(task_id.to_owned()).or_default() += 1;
        }
        self.tally.copies += 1;
    }

    fn deliver(&mut self, msg: Msg, answer_lost: bool) -> Result<(), Fail> {
        let id = self.agents[msg.agent].id;
        self.facts.heard.insert(id, self.times());
        let next = if msg.next { 16 } else { 0 };
        let answer = self.block_on(self.broker.agents.ack_and_take(
            &Self::who(),
            id,
            Some(&msg.session),
            msg.acks.clone(),
            next,
        ))?;
        let (_, deliveries) = answer.map_err(|e| engine_err("ack_and_take", e))?;
        if answer_lost || self.agents[msg.agent].session != msg.session {
            // The answer reaches nobody: its deliveries are offered again when overdue.
            return Ok(());
        }
        let a = &mut self.agents[msg.agent];
        a.outbox.retain(|x| !msg.acks.iter().any(|y| y.task_id == x.task_id && y.attempt == x.attempt));
        self.receive(msg.agent, deliveries)
    }

    /// kill -9 and start again: what was in memory is gone, the journal stays.
    fn restart_agent(&mut self, agent: usize) -> Result<(), Fail> {
        let session = self.new_session(self.agents[agent].clock_offset);
        let elapsed = self.facts.elapsed;
        let a = &mut self.agents[agent];
        a.started = elapsed;
        // Deliveries it had not started are offered to the new process; its journal
        // answers for what it had.
        a.inbox.clear();
        a.outbox.clear();
        a.session = session;
        a.process.restart(&self.agent_rt)?;
        if agent == lan::LISTENER {
            self.outbox = self.agents[agent].process.outbox();
            self.lan_process = self.lan_glue();
        }
        Ok(())
    }

    /// The broker counts a polling printer's polls as its sign of life (docs/ARCHITECTURE.md:
    /// offline when silent past 2 × its interval + the grace).
    fn cloud_heard(&mut self) {
        self.facts.heard.insert(CLOUD, self.times());
    }

    /// A printer as the broker's directory has it (what a printer's login finds).
    async fn printer_info(&self, id: &str) -> Result<Arc<onceprint_engine::directory::PrinterInfo>, Fail> {
        self.broker
            .lanes
            .directory()
            .printer_info(TENANT, id)
            .await
            .map_err(|e| engine_err("printer_info", e))?
            .ok_or_else(|| format!("printer {id} is gone"))
    }

    fn cloud_poll(&mut self, status: usize) -> Result<(), Fail> {
        self.cloud_heard();
        let printing = self.cloud.fetched.as_ref().map(|(token, _)| token.clone());
        let status_code = match (printing.is_some(), status) {
            // A printer at work reports itself busy with its job.
            (true, _) | (false, 0) => "200%20OK",
            (false, 1) => "410%20Out%20of%20Paper",
            (false, _) => "420%20Cover%20Open",
        };
        let poll = PollIn {
            status_code: status_code.into(),
            mac: Some(CLOUD_MAC.into()),
            job_token: printing.clone(),
            printing_in_progress: Some(printing.is_some()),
        };
        let answer = self.block_on(async {
            let info = self.printer_info(CLOUD).await?;
            self.broker.cloudprnt.poll(&info, &poll).await.map_err(|e| engine_err("CloudPRNT poll", e))
        })??;
        if let Some(token) = answer.job_token.filter(|_| answer.job_ready) {
            if let Some(t) = self.task(&token_task(&token))? {
                self.first_out(&t)?;
            }
            self.cloud.offered = Some(token);
        }
        Ok(())
    }

    fn cloud_fetch(&mut self, lost: bool) -> Result<(), Fail> {
        if self.cloud.fetched.is_some() {
            return Ok(());
        }
        let Some(token) = self.cloud.offered.clone() else { return Ok(()) };
        let got = self.block_on(async {
            let info = self.printer_info(CLOUD).await?;
            Ok::<_, Fail>(
                self.broker.cloudprnt.fetch(&info, Some(CLOUD_MAC), Some("text/plain"), Some(&token), None).await,
            )
        })??;
        match got {
            Ok(_) if lost => self.facts.exposed.insert(token_task(&token)),
            Ok(job) => {
                self.cloud.fetched = Some((token, job.bytes));
                self.cloud.offered = None;
                true
            }
            Err(CloudPrntError::NoSuchJob(_)) => {
                self.cloud.offered = None;
                false
            }
            Err(e) => return Err(engine_err("CloudPRNT fetch", e)),
        };
        Ok(())
    }

    fn cloud_print(&mut self, print: CloudPrint) -> Result<(), Fail> {
        let Some((token, data)) = self.cloud.fetched.take() else { return Ok(()) };
        let task = token_task(&token);
        let (paper, confirms): (bool, Vec<&str>) = match print {
            CloudPrint::Printed { code } => (true, vec![code]),
            CloudPrint::Code { code, paper } => {
                // The simulated printer keeps to the table: a code that proves nothing
                // printed never comes with paper, one that says printed always does.
                let paper = match star::job_result(code).proof {
                    Proof::NotPrinted | Proof::Refused => false,
                    Proof::Printed => true,
                    Proof::MayHavePrinted => paper,
                };
                (paper, vec![code])
            }
            CloudPrint::ConfirmLost => (true, vec![]),
            CloudPrint::ConfirmTwice => (true, vec!["OK", "OK"]),
        };
        if paper {
            self.paper(&task, &data);
        }
        if confirms.is_empty() || star::job_result(confirms[0]).proof == Proof::MayHavePrinted {
            self.facts.exposed.insert(task.clone());
        }
        for code in confirms {
            let result = self.block_on(async {
                let info = self.printer_info(CLOUD).await?;
                Ok::<_, Fail>(self.broker.cloudprnt.confirm(&info, Some(CLOUD_MAC), Some(code), Some(&token)).await)
            })??;
            match result {
                Ok(_) | Err(CloudPrntError::NoSuchJob(_)) => {}
                Err(e) => return Err(engine_err("CloudPRNT confirm", e)),
            }
        }
        Ok(())
    }

    /// A GetRequest: asking for work is the printer's sign of life, and says it holds
    /// nothing (a printer that still holds a job prints it first).
    fn epson_get(&mut self, lost: bool) -> Result<(), Fail> {
        if self.epson.job.is_some() {
            return Ok(());
        }
        self.facts.heard.insert(EPSON, self.times());
        let handed = self.block_on(async {
            let info = self.printer_info(EPSON).await?;
            self.broker.epson.get_request(&info, None).await.map_err(|e| engine_err("GetRequest", e))
        })??;
        let Some(h) = handed else { return Ok(()) };
        let task = token_task(&h.printjobid);
        if let Some(t) = self.task(&task)? {
            self.first_out(&t)?;
        }
        if lost {
            // The job's data left the broker with the answer.
            self.facts.exposed.insert(task);
        } else {
            self.epson.job = Some((h.printjobid, h.xml.into_bytes()));
        }
        Ok(())
    }

    fn epson_print(&mut self, print: EpsonPrint) -> Result<(), Fail> {
        let Some((jobid, data)) = self.epson.job.take() else { return Ok(()) };
        let task = token_task(&jobid);
        let fresh_roll = std::mem::take(&mut self.epson.fresh_roll);
        let (paper, results): (bool, Vec<(bool, &str)>) = if let Some(why) = self.epson.stopped {
            // Stopped before the job: nothing comes out, and the printer says why.
            (false, vec![(false, why)])
        } else {
            match print {
                // A new roll does not run out within one ticket.
                EpsonPrint::Code { code: "EPTR_REC_EMPTY", .. } if fresh_roll => (true, vec![(true, "")]),
                EpsonPrint::Printed => (true, vec![(true, "")]),
                EpsonPrint::Code { code, paper } => {
                    let paper = match epson::job_result(false, code).proof {
                        Proof::NotPrinted | Proof::Refused => false,
                        Proof::Printed => true,
                        Proof::MayHavePrinted => paper,
                    };
                    // The roll ran out or the cover opened during the job: it stays so.
                    if matches!(code, "EPTR_REC_EMPTY" | "EPTR_COVER_OPEN") {
                        self.epson.stopped = Some(code);
                    }
                    (paper, vec![(false, code)])
                }
                EpsonPrint::ResultLost => (true, vec![]),
                EpsonPrint::ResultTwice => (true, vec![(true, ""), (true, "")]),
            }
        };
        if paper {
            self.paper(&task, &data);
        }
        if results.is_empty()
            || results.iter().any(|(ok, code)| !ok && epson::job_result(false, code).proof == Proof::MayHavePrinted)
        {
            self.facts.exposed.insert(task.clone());
        }
        for (ok, code) in results {
            let file = format!(
                "<?xml version=\"1.0\" encoding=\"utf-8\"?>\n<PrintResponseInfo Version=\"2.00\"><ePOSPrint><Parameter>\
                 <devid>local_printer</devid><printjobid>{jobid}</printjobid></Parameter><PrintResponse>\
                 <response xmlns=\"http://www.epson-pos.com/schemas/2011/03/epos-print\" success=\"{ok}\" code=\"{code}\" \
                 status=\"251658262\" battery=\"0\"/></PrintResponse></ePOSPrint></PrintResponseInfo>"
            );
            self.block_on(async {
                let info = self.printer_info(EPSON).await?;
                self.broker.epson.set_response(&info, None, &file).await.map_err(|e| engine_err("SetResponse", e))
            })??;
        }
        Ok(())
    }

    /// The webhook receiver prints the first job it has not printed and calls back.
    fn hook_print(&mut self, status: usize, paper: bool, callback_lost: bool) -> Result<(), Fail> {
        let word = WEBHOOK_STATUS[status % WEBHOOK_STATUS.len()];
        let job = {
            let mut st = self.hook.state();
            let Some(key) = st.order.iter().find(|k| st.jobs.get(*k).is_some_and(|j| j.done.is_none())).cloned() else {
                return Ok(());
            };
            let job = st.jobs.get_mut(&key).map(|j| {
                j.done = Some(word);
                j.clone()
            });
            job
        };
        let Some(job) = job else { return Ok(()) };
        let c = onceprint_core::results::webhook::status(word).ok_or_else(|| format!("unknown status {word}"))?;
        let paper = match c.proof {
            Proof::NotPrinted | Proof::Refused => false,
            Proof::Printed => true,
            Proof::MayHavePrinted => paper,
        };
        if paper {
            self.paper(&job.task_id, &job.data);
        }
        if c.proof == Proof::MayHavePrinted || callback_lost {
            self.facts.exposed.insert(job.task_id.clone());
        }
        if callback_lost {
            return Ok(());
        }
        let ack = AckIn {
            task_id: job.task_id.clone(),
            attempt: job.attempt,
            outcome: c.outcome,
            detail: format!("callback {word}"),
            proof: c.proof,
        };
        self.block_on(self.broker.lanes.ack(&Self::who(), &Claimant::push("webhook"), vec![ack]))?
            .map_err(|e| engine_err("webhook callback", e))?;
        Ok(())
    }

    fn manual(&mut self, pick: usize, action: usize, to: usize) -> Result<(), Fail> {
        // An operator acts on what is open or needs attention (what the console lists),
        // now and then on a finished ticket.
        let all = self.tasks()?;
        let open: Vec<Task> = all.iter().filter(|t| is_open(t)).cloned().collect();
        let tasks = if open.is_empty() || pick.is_multiple_of(5) { all } else { open };
        if tasks.is_empty() {
            return Ok(());
        }
        let t = tasks[(pick / 5) % tasks.len()].clone();
        self.act(&t, action, to)
    }

    /// An operator's action on the newest open ticket (the console lists newest first).
    fn manual_newest(&mut self, action: usize, to: usize) -> Result<(), Fail> {
        let newest = self
            .tasks()?
            .into_iter()
            .filter(is_open)
            .max_by(|a, b| (a.created_at, &a.task_id).cmp(&(b.created_at, &b.task_id)));
        match newest {
            Some(t) => self.act(&t, action, to),
            None => Ok(()),
        }
    }

    fn act(&mut self, t: &Task, action: usize, to: usize) -> Result<(), Fail> {
        let action = [ManualAction::Cancel, ManualAction::Reprint, ManualAction::MarkPrinted, ManualAction::Transfer]
            [action % 4];
        let req = ActionRequest {
            tenant_id: TENANT.into(),
            task_id: t.task_id.clone(),
            actor: Actor::Operator("sim".into()),
            reason: "simulated operator".into(),
            printer_id: (action == ManualAction::Transfer).then(|| TRANSFER_TO[to % TRANSFER_TO.len()].to_owned()),
        };
        match self.block_on(self.broker.operations.act(action, req))? {
            Ok(_) if action == ManualAction::MarkPrinted => {
                self.facts.marked.insert(t.task_id.clone());
            }
            Ok(_) => {}
            // Refusals (a task in flight, a finished one, a transfer of a ticket that may
            // have printed) are what the manual channel is for; they change nothing.
            Err(ActionError::NotAllowed(_) | ActionError::Raced(_) | ActionError::PrinterDisabled(_)) => {}
            // A transfer to the task's own printer, or to a printer of another store.
            Err(ActionError::Invalid(_) | ActionError::SamePrinter(_) | ActionError::UnknownPrinter(_)) => {}
            // A pruned task is only its tombstone: nothing to act on.
            Err(ActionError::NotFound(_))
                if self.block_on(self.store.get_tombstone(TENANT, &t.task_id))?.is_ok_and(|b| b.is_some()) => {}
            Err(e) => return Err(engine_err("manual action", e)),
        }
        Ok(())
    }

    /// Marks the deliveries in flight that silence has exposed: the broker may give up on
    /// them from now on. Runs before every step and every check, so that no sweep or poll
    /// acts on a silence the world has not noted.
    fn observe(&mut self) -> Result<(), Fail> {
        if let Some(e) = self.nodes.fault.take() {
            return Err(e);
        }
        // With several nodes, one whose clock is ahead judges silence that much earlier.
        let now = self.clock.now_ms() + self.nodes.clock_spread();
        let mut sent_now = HashSet::new();
        self.facts.looks += 1;
        let looks = self.facts.looks;
        for t in self.tasks()? {
            self.facts.created.entry(t.task_id.clone()).or_insert_with(|| (looks, t.task_id.clone()));
            if t.state != TaskState::Sent {
                continue;
            }
            sent_now.insert(t.task_id.clone());
            let times = self.times();
            let since = *self.facts.sent_since.entry(t.task_id.clone()).or_insert(times);
            // Silence the broker may act on: a store agent not heard for its gone
            // time holds the delivery; a polling printer not heard past its offline
            // threshold, or not answering a job it fetched within the answer time.
            let holder = match t.sent_to.as_deref().and_then(|s| s.strip_prefix("agent:")) {
                Some(agent) => self.agents.iter().map(|a| a.id).find(|id| *id == agent),
                None if t.printer_id == CLOUD => Some(CLOUD),
                None if t.printer_id == EPSON => Some(EPSON),
                None if t.printer_id == HOOK => Some(HOOK),
                // An MQTT printer's job, like a webhook's, goes to a person after the push
                // driver's doubt time without an answer.
                None if mqtt::is_mqtt(&t.printer_id) => Some(HOOK),
                None => None,
            };
            let (heard, limit) = match holder {
                Some(CLOUD) | Some(EPSON) => (self.facts.heard.get(holder.unwrap_or(CLOUD)).copied(), CLOUD_OFFLINE_MS),
                // A receiver is never silent: the driver asks it; only no answer for the
                // doubt time lets the broker give up.
                Some(HOOK) => (Some(since), PUSH_DOUBT_AFTER_MS),
                Some(agent) => (self.facts.heard.get(agent).copied(), AGENT_GONE_MS),
                None => (None, 0),
            };
            // Past a limit by the broker's clock (which may have stepped forwards) or by
            // the time that really passed (when it stepped backwards).
            let past =
                |(clock, real): (i64, i64), limit: i64| now - clock >= limit || self.facts.elapsed - real >= limit;
            let silent = heard.is_none_or(|h| past(h, limit));
            // Once the first agent takes the store's LAN orders the other stands by: a
            // delivery it holds is never offered to it again, and goes to a person.
            let stands_by =
                self.lan.claimed && holder.is_some_and(|h| AGENT_IDS.contains(&h) && h != AGENT_IDS[lan::LISTENER]);
            let polled = matches!(holder, Some(CLOUD) | Some(EPSON));
            if silent || stands_by || (polled && past(since, CLOUD_ANSWER_WITHIN_MS)) {
                self.facts.exposed.insert(t.task_id.clone());
            }
        }
        self.facts.sent_since.retain(|id, _| sent_now.contains(id));
        Ok(())
    }

    /// The promise, as far as it can be seen after any step.
    fn check(&mut self) -> Result<(), Fail> {
        self.observe()?;
        let tasks = self.tasks()?;
        let mut in_flight: HashMap<&str, usize> = HashMap::new();
        let by_id: HashMap<&str, &Task> = tasks.iter().map(|t| (t.task_id.as_str(), t)).collect();
        // Copies on paper and copies allowed, per original ticket (a transfer, failover or
        // reprint hangs on its original).
        let mut copies: HashMap<&str, (u32, u32)> = HashMap::new();
        let mut unmarked: HashMap<&str, u32> = HashMap::new();
        // What came out on the LAN path, by key, and which keys the broker has a task of.
        let lan_copies = |ids: &[String], except: &str, of: &BTreeMap<String, u32>| -> u32 {
            ids.iter().filter(|id| id.as_str() != except).map(|id| of.get(id).copied().unwrap_or(0)).sum()
        };
        let mut keys_seen: HashSet<(String, String, String)> = HashSet::new();
        self.note_raced(&tasks);
        for t in &tasks {
            if t.state == TaskState::Sent {
                *in_flight.entry(t.printer_id.as_str()).or_default() += 1;
            }
            let mut root = t;
            while let Some(o) = root.origin_task_id.as_deref().and_then(|id| by_id.get(id)) {
                root = o;
            }
            // A LAN copy belongs to the order under its key: it counts once in the
            // original's tree, and as the paper of whichever task of the chain the order
            // lives on (an upload settles that one).
            let key = (root.target.clone(), root.biz_no.clone(), root.print_type.clone());
            let lan_ids: &[String] = self.lan.lan_ids.get(&key).map_or(&[], |v| v.as_slice());
            keys_seen.insert(key.clone());
            let is_root = t.origin_task_id.is_none();
            let (lan_paper, lan_unmarked) = if is_root {
                (
                    lan_copies(lan_ids, &t.task_id, &self.facts.paper),
                    lan_copies(lan_ids, &t.task_id, &self.facts.unmarked),
                )
            } else {
                (0, 0)
            };
            let chain_lan_paper = if t.state != TaskState::Transferred && t.origin_kind != Some(OriginKind::Reprint) {
                lan_copies(lan_ids, &root.task_id, &self.facts.paper)
            } else {
                0
            };
            let own = self.facts.paper.get(&t.task_id).copied().unwrap_or(0);
            // Counted once per order (the LAN copy with the original); judged per task.
            let counted = own + lan_paper;
            let paper = own + lan_paper.max(chain_lan_paper);
            let policy = self.policies.policy_for(&t.print_type);
            let mut allowed = u32::from(t.origin_kind == Some(OriginKind::Reprint) || t.origin_task_id.is_none());
            if policy.reprint_on_doubt {
                allowed += (t.attempts - t.refusals - 1).max(0) as u32;
            }
            // The documented limit of one order through both paths (`LanFacts::raced`).
            if is_root && self.lan.raced.contains(&(t.biz_no.clone(), t.print_type.clone())) {
                allowed += 1;
            }
            let c = copies.entry(root.task_id.as_str()).or_default();
            c.0 += counted;
            c.1 += allowed;
            *unmarked.entry(root.task_id.as_str()).or_default() +=
                self.facts.unmarked.get(&t.task_id).copied().unwrap_or(0) + lan_unmarked;
            if t.state == TaskState::Printed && paper == 0 && !self.facts.marked.contains(&t.task_id) {
                return Err(format!("{} is printed, but nothing of it came out on paper", t.task_id));
            }
            if t.state == TaskState::Failed && paper > 0 && !policy.reprint_on_doubt {
                return Err(format!("{} failed although {paper} copies of it came out", t.task_id));
            }
            let exposed = self.facts.exposed.contains(&t.task_id)
                || (t.origin_task_id.is_none() && self.facts.exposed_keys.contains(&key));
            if t.state == TaskState::InDoubt && !exposed {
                return Err(format!(
                    "{} is in doubt, but no fault struck it and nothing went unanswered ({:?})",
                    t.task_id, t.last_error
                ));
            }
        }
        self.lan_handed_check(&keys_seen)?;
        // Tickets only the agent has so far.
        for (key, ids) in &self.lan.lan_ids {
            if !keys_seen.contains(key) && lan_copies(ids, "", &self.facts.unmarked) > 1 {
                return Err(format!("LAN order {} came out more than once without a reprint banner", key.1));
            }
        }
        for (root, (paper, allowed)) in copies {
            if paper > allowed {
                return Err(format!(
                    "ticket {root} came out {paper} times; {allowed} allowed (reprints asked for, doubt reprints)"
                ));
            }
        }
        for (root, n) in unmarked {
            let raced =
                by_id.get(root).is_some_and(|t| self.lan.raced.contains(&(t.biz_no.clone(), t.print_type.clone())));
            if n > 1 + u32::from(raced) {
                return Err(format!("ticket {root} came out {n} times without a reprint banner"));
            }
        }
        for (p, n) in in_flight {
            if n > 1 {
                return Err(format!("{n} tasks in flight on {p}"));
            }
        }
        Ok(())
    }

    /// Faults stop: the network delivers what it holds, agents and the printer work
    /// normally, time moves a second per round; every lane must drain.
    fn drain(&mut self) -> Result<(), Fail> {
        let rounds = DRAIN_ROUNDS + self.back_steps / 1_000 + 1;
        self.line_up = true;
        for msg in std::mem::take(&mut self.net) {
            self.deliver(msg, false)?;
        }
        for round in 0..rounds {
            let open: Vec<Task> = self
                .tasks()?
                .into_iter()
                .filter(|t| matches!(t.state, TaskState::Pending | TaskState::Sent | TaskState::Retrying))
                .collect();
            let outbox = self.outbox.clone();
            let unsynced = self.block_on(outbox.unsynced())?.map_err(|e| engine_err("outbox", e))?;
            if open.is_empty() && unsynced == 0 {
                return Ok(());
            }
            if round == rounds - 1 && unsynced > 0 {
                return Err(format!("{unsynced} tickets taken on the LAN were never uploaded"));
            }
            if round == rounds - 1 {
                let list: Vec<String> = open
                    .iter()
                    .map(|t| format!("{} {} on {} ({:?})", t.task_id, t.state, t.printer_id, t.last_error))
                    .collect();
                return Err(format!("lanes did not drain within {rounds} simulated seconds: {}", list.join("; ")));
            }
            self.advance(1_000);
            // The balancer spreads the rounds over the nodes.
            self.route(round as usize);
            // The agent finishes what its local lane holds, then uploads.
            for _ in 0..16 {
                if !self.local_print(AgentPrint::Printed)? {
                    break;
                }
            }
            if unsynced > 0 {
                self.sync(false)?;
            }
            self.step(&Op::Sweep)?;
            self.step(&Op::SweepPaused)?;
            for agent in 0..self.agents.len() {
                self.poll(agent, false)?;
                while !self.agents[agent].inbox.is_empty() {
                    self.handle(agent, AgentPrint::Printed)?;
                }
                let a = &self.agents[agent];
                if !a.outbox.is_empty() {
                    let msg = Msg { agent, session: a.session.clone(), acks: a.outbox.clone(), next: true };
                    self.deliver(msg, false)?;
                }
            }
            if !self.cloud.dead {
                self.cloud_print(CloudPrint::Printed { code: "OK" })?;
                self.cloud_poll(0)?;
                self.cloud_fetch(false)?;
                self.cloud_print(CloudPrint::Printed { code: "OK" })?;
            }
            self.hook.state().mode = 0;
            self.step(&Op::HookPass)?;
            while self.hook.state().jobs.values().any(|j| j.done.is_none()) {
                self.hook_print(0, true, false)?;
            }
            self.mqtt_drain_round(&open)?;
            if !self.epson.dead {
                self.epson.stopped = None;
                self.epson_print(EpsonPrint::Printed)?;
                self.epson_get(false)?;
                self.epson_print(EpsonPrint::Printed)?;
            }
            self.step(&Op::OfflineCheck)?;
            if self.trace {
                self.print_trace(&format!("drain round {round}"));
            }
            self.check()?;
        }
        Ok(())
    }

    /// Once the lanes drained, retention prunes every finished task, and every order is
    /// sent again, by the POS to the broker and through the shop's LAN (whose agent then
    /// uploads): each must be answered with its task, from the tombstone where it was
    /// pruned, never with a new task or a second charge (`final_check`).
    /// Sent again once to the process that pruned (its gate remembers the keys) and once
    /// to a new one (only the database does).
    fn after_retention(&mut self) -> Result<(), Fail> {
        self.until_retention_runs();
        self.step(&Op::Prune)?;
        for restart in [false, true] {
            if restart {
                self.step(&Op::RestartBroker)?;
            }
            for i in 0..self.pos.len() {
                let (req, id) = (self.pos[i].req.clone(), self.pos[i].task_id.clone());
                self.submit(req, Some(id))?;
            }
            for i in 0..self.lan.subs.len() {
                self.lan_send(i)?;
            }
            self.sync(false)?;
            self.check()?;
        }
        Ok(())
    }

    /// At the end: every answered submission has its task, each charged once.
    fn final_check(&mut self) -> Result<(), Fail> {
        self.lan_final_check()?;
        let tasks = self.tasks()?;
        for s in &self.pos {
            let t = self
                .task(&s.task_id)?
                .ok_or_else(|| format!("the POS got {} for {:?}, and it is gone", s.task_id, s.req.biz_no))?;
            if t.biz_no != *s.req.biz_no.as_ref().unwrap_or(&String::new()) {
                return Err(format!("{} answered for {:?} belongs to {}", t.task_id, s.req.biz_no, t.biz_no));
            }
        }
        let keys: HashSet<(&str, &str, &str)> = tasks
            .iter()
            .filter(|t| t.origin_task_id.is_none())
            .map(|t| (t.target.as_str(), t.biz_no.as_str(), t.print_type.as_str()))
            .collect();
        if keys.len() != tasks.iter().filter(|t| t.origin_task_id.is_none()).count() {
            return Err("two tasks under one idempotency key".into());
        }
        for t in tasks.iter().filter(|t| t.origin_task_id.is_none()) {
            let ledger =
                self.block_on(self.store.ledger_entries(&t.task_id))?.map_err(|e| engine_err("ledger_entries", e))?;
            let charges = ledger.iter().filter(|e| e.kind == "charge").count();
            if charges != 1 {
                return Err(format!("{} is charged {charges} times", t.task_id));
            }
        }
        self.tally.tasks = tasks.len() as u64;
        for t in &tasks {
            match t.state {
                TaskState::Printed => self.tally.printed += 1,
                TaskState::InDoubt => self.tally.in_doubt += 1,
                TaskState::Failed => self.tally.failed += 1,
                _ => {}
            }
        }
        Ok(())
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// The task a CloudPRNT job token names (`TASKID.ATTEMPT`).
fn token_task(token: &str) -> String {
    token.split('.').next().unwrap_or(token).to_owned()
}

async fn set_up(store: &Arc<dyn Store>) -> Result<(), onceprint_store::StoreError> {
    let now = START;
    store
        .create_tenant(NewTenant {
            id: TENANT.into(),
            name: "Simulated shop".into(),
            api_key_hash: "unused".into(),
            api_key_id: "key-t".into(),
            now,
            audit: SetupAudit::default(),
        })
        .await?;
    store
        .create_store(NewStore {
            tenant_id: TENANT.into(),
            id: STORE.into(),
            name: "Main".into(),
            timezone: "UTC".into(),
            now,
            audit: SetupAudit::default(),
        })
        .await?;
    let printers = [
        (AGENT_PRINTERS[0], r#"{"kind":"agent","address":"tcp://127.0.0.1:9101"}"#.to_owned()),
        (AGENT_PRINTERS[1], r#"{"kind":"agent","address":"tcp://127.0.0.1:9102"}"#.to_owned()),
        (CLOUD, format!(r#"{{"kind":"cloudprnt","mac":"{CLOUD_MAC}","poll_interval_s":2}}"#)),
        (EPSON, r#"{"kind":"epson_sdp","poll_interval_s":2}"#.to_owned()),
        (HOOK, r#"{"kind":"webhook","url":"http://127.0.0.1:9/jobs","secret":"simulated-receiver-secret"}"#.to_owned()),
    ];
    add_printers(store, printers, now).await?;
    add_stations(store, [("st-a", ["a1", "a2"]), ("st-x", ["c1", "a1"]), ("st-y", ["e1", "c1"])], now).await?;
    // Where a person learns of what needs them beyond the attention list: the alerts of
    // offline tickets the broker could not take (read by the final check).
    store
        .create_webhook(onceprint_store::NewWebhook {
            tenant_id: TENANT.into(),
            id: "attention".into(),
            url: "https://attention.example/hook".into(),
            secret: String::new(),
            format: "onceprint".into(),
            events: vec!["offline_task.rejected".into()],
            now,
        })
        .await?;
    mqtt::set_up(store, now).await
}

/// Printers `(id, transport JSON)` of the store, each named by its id.
async fn add_printers<const N: usize>(
    store: &Arc<dyn Store>,
    printers: [(&str, String); N],
    now: i64,
) -> Result<(), onceprint_store::StoreError> {
    for (id, transport) in printers {
        store
            .create_printer(NewPrinter {
                tenant_id: TENANT.into(),
                id: id.into(),
                store_id: STORE.into(),
                name: id.into(),
                transport,
                credential: None,
                now,
                audit: SetupAudit::default(),
            })
            .await?;
    }
    Ok(())
}

/// Stations `(id, [primary, backup])` of the store, failing over after 5 s.
async fn add_stations<const N: usize>(
    store: &Arc<dyn Store>,
    stations: [(&str, [&str; 2]); N],
    now: i64,
) -> Result<(), onceprint_store::StoreError> {
    for (id, printers) in stations {
        store
            .create_station(NewStation {
                tenant_id: TENANT.into(),
                id: id.into(),
                store_id: STORE.into(),
                printers: printers.iter().map(|p| p.to_string()).collect(),
                failover_after_ms: Some(5_000),
                now,
                audit: SetupAudit::default(),
            })
            .await?;
    }
    Ok(())
}

/// What the console lists as open or needing attention: not yet at an end.
fn is_open(t: &Task) -> bool {
    !matches!(t.state, TaskState::Printed | TaskState::Closed | TaskState::Cancelled | TaskState::Transferred)
}
