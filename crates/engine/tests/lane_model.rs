//! A model test of the lane engine (issue 8): random interleavings of submissions in three
//! priorities, polls and acks of every outcome by simulated store agents, agent crashes and
//! restarts, lost acks and lost answers, deadlines passing, sweeps and operators' actions,
//! on a real store (SQLite always, PostgreSQL when `ONCEPRINT_TEST_POSTGRES` is set) with
//! a clock the test moves.
//!
//! The simulated agents follow the real agent's rules (crates/agent/src/worker.rs): a
//! journal per agent id that survives restarts, `started` before the paper, `printed`
//! before the ack, a journal answer for anything already printed or started, and the
//! paper counted by the test itself. After every step the test checks what the promise
//! says: at most one task in flight per printer; no task on paper twice unless its print
//! type reprints on doubt (and then at most `max_attempts` times); `printed` only with
//! paper; failed tasks of the other print types never printed; tasks handed out in id
//! order within a priority. After the last step faults stop, the agents keep polling and
//! printing, and **every lane must drain** within a bound of simulated time: no task is
//! left `pending`, `sent` or `retrying`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use onceprint_core::manual::ManualAction;
use onceprint_core::{Outcome, PolicyTable, TaskState};
use onceprint_engine::clock::{Clock, ManualClock};
use onceprint_engine::{
    AckIn, ActionRequest, AgentDelivery, AgentRegistry, AgentTransport, DeliveryConfig, Directory, LaneEngine,
    Operations, OperationsConfig, RecentTasks, RegistryConfig, Shared, StoreSignals,
};
use onceprint_store::conformance::HarnessFactory;
use onceprint_store::testing::Harness;
use onceprint_store::{AgentIdentity, NewPrinter, NewStore, NewTask, NewTenant, SetupAudit, Store, TaskQuery};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};
use tokio::runtime::Runtime;

const PRINTERS: [&str; 2] = ["p1", "p2"];
const AGENTS: [&str; 2] = ["a", "b"];
/// Print types of three priorities; `kitchen` reprints on doubt.
const TYPES: [(&str, i32); 4] = [("refund", 0), ("receipt", 10), ("kitchen", 20), ("prebill", 40)];
const MAX_ATTEMPTS: u32 = 3;
const START: i64 = 1_800_000_000_000;

/// What a simulated agent does with a delivery it prints.
#[derive(Clone, Copy, Debug)]
enum Print {
    Printed,
    Blocked(Outcome),
    /// The job went out and paper came out, but the connection died before the
    /// confirmation: `in_doubt`.
    LostAfterPaper,
    /// The agent process dies after journaling `started`, with or without paper out.
    Crash {
        paper: bool,
    },
}

#[derive(Clone, Debug)]
enum Op {
    Submit {
        printer: usize,
        kind: usize,
    },
    Poll {
        agent: usize,
    },
    Handle {
        agent: usize,
        print: Print,
    },
    /// Sends the agent's acks; the request or only the answer may be lost (the agent
    /// keeps them and sends them again either way). With `next` (agent protocol 2) the
    /// answer hands out the next task of each lane the acks free; a lost answer loses
    /// those deliveries too.
    SendAcks {
        agent: usize,
        request_lost: bool,
        answer_lost: bool,
        next: bool,
    },
    Restart {
        agent: usize,
    },
    Advance {
        ms: i64,
    },
    Sweep,
    Manual {
        pick: usize,
        action: usize,
    },
}

fn print() -> impl Strategy<Value = Print> {
    prop_oneof![
        6 => Just(Print::Printed),
        1 => Just(Print::Blocked(Outcome::NoPaper)),
        1 => Just(Print::Blocked(Outcome::CoverOpen)),
        1 => Just(Print::Blocked(Outcome::Offline)),
        1 => Just(Print::Blocked(Outcome::Error)),
        1 => Just(Print::LostAfterPaper),
        1 => any::<bool>().prop_map(|paper| Print::Crash { paper }),
    ]
}

struct Model;

impl ReferenceStateMachine for Model {
    type State = ();
    type Transition = Op;

    fn init_state() -> BoxedStrategy<()> {
        Just(()).boxed()
    }

    fn transitions(_: &()) -> BoxedStrategy<Op> {
        prop_oneof![
            4 => (0..PRINTERS.len(), 0..TYPES.len()).prop_map(|(printer, kind)| Op::Submit { printer, kind }),
            4 => (0..AGENTS.len()).prop_map(|agent| Op::Poll { agent }),
            5 => (0..AGENTS.len(), print()).prop_map(|(agent, print)| Op::Handle { agent, print }),
            3 => (0..AGENTS.len(), prop::bool::weighted(0.2), prop::bool::weighted(0.2), any::<bool>())
                .prop_map(|(agent, request_lost, answer_lost, next)| Op::SendAcks { agent, request_lost, answer_lost, next }),
            1 => (0..AGENTS.len()).prop_map(|agent| Op::Restart { agent }),
            3 => (50i64..3_000).prop_map(|ms| Op::Advance { ms }),
            1 => Just(Op::Sweep),
            1 => (0usize..64, 0usize..3).prop_map(|(pick, action)| Op::Manual { pick, action }),
        ]
        .boxed()
    }

    fn apply(state: (), _: &Op) {
        state
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Journal {
    Started,
    Printed,
    InDoubt,
    Blocked(Outcome),
}

/// A store agent as the real one behaves, without sockets.
struct SimAgent {
    id: &'static str,
    session: String,
    inbox: VecDeque<AgentDelivery>,
    outbox: Vec<AckIn>,
    /// Kept across restarts (the state directory).
    journal: HashMap<String, (i32, Journal)>,
}

/// What the test knows that the broker does not: the paper.
#[derive(Default)]
struct Facts {
    paper: BTreeMap<String, u32>,
    /// (printer, priority) → the last task id handed out for the first time.
    first_out: HashMap<(String, i32), String>,
    seen: std::collections::HashSet<String>,
}

struct Sut {
    rt: Runtime,
    _harness: Harness,
    store: Arc<dyn Store>,
    clock: Arc<ManualClock>,
    lanes: Arc<LaneEngine>,
    agents_api: AgentTransport,
    operations: Operations,
    agents: Vec<SimAgent>,
    facts: Facts,
    restarts: u64,
    policies: PolicyTable,
    who: AgentIdentity,
}

static FACTORY: Mutex<Option<HarnessFactory>> = Mutex::new(None);
static RUN: Mutex<()> = Mutex::new(());

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

fn policies() -> PolicyTable {
    let mut p = PolicyTable::default();
    p.types.retain(|name, _| TYPES.iter().any(|(t, _)| t == name));
    for (name, prio) in TYPES {
        let t = p.types.get_mut(name).expect("type");
        t.priority = prio;
        t.max_attempts = MAX_ATTEMPTS;
        t.reprint_on_doubt = name == "kitchen";
        t.backoff = onceprint_core::Backoff { initial_ms: 100, factor: 2.0, cap_ms: 1_000, jitter: 0.0 };
    }
    p
}

impl Sut {
    fn new() -> Sut {
        let factory = FACTORY.lock().unwrap_or_else(PoisonError::into_inner).expect("factory");
        let rt = runtime();
        let harness = rt.block_on(factory()).expect("backend");
        let store = harness.store.clone();
        let clock = Arc::new(ManualClock::new(START));
        rt.block_on(async {
            store
                .create_tenant(NewTenant {
                    id: "t".into(),
                    name: "t".into(),
                    api_key_hash: "h".into(),
                    api_key_id: "key-t".into(),
                    now: START,
                    audit: SetupAudit::default(),
                })
                .await
                .expect("tenant");
            store
                .create_store(NewStore {
                    tenant_id: "t".into(),
                    id: "s".into(),
                    name: "s".into(),
                    timezone: "UTC".into(),
                    now: START,
                    audit: SetupAudit::default(),
                })
                .await
                .expect("store");
            for p in PRINTERS {
                store
                    .create_printer(NewPrinter {
                        tenant_id: "t".into(),
                        id: p.into(),
                        store_id: "s".into(),
                        name: p.into(),
                        transport: r#"{"kind":"agent","address":"tcp://127.0.0.1:9"}"#.into(),
                        credential: None,
                        now: START,
                        audit: SetupAudit::default(),
                    })
                    .await
                    .expect("printer");
            }
        });
        let config = DeliveryConfig {
            redeliver_after_ms: 2_000,
            agent_gone_after_ms: 5_000,
            takeover_quiet_ms: 1_000,
            ..DeliveryConfig::default()
        };
        let registry = AgentRegistry::new(
            clock.clone() as Arc<dyn Clock>,
            RegistryConfig {
                gone_after_ms: config.agent_gone_after_ms,
                takeover_quiet_ms: config.takeover_quiet_ms,
                remote_lag_ms: 0,
            },
        );
        let directory = Arc::new(Directory::new(store.clone()));
        let gate = Arc::new(RecentTasks::new(0));
        let signals = Arc::new(StoreSignals::default());
        let policies = policies();
        let shared = Shared { store: store.clone(), directory, gate, signals, policies: policies.clone() };
        let lanes = Arc::new(LaneEngine::new(shared.clone(), config, clock.clone(), registry));
        let operations = Operations::new(shared, OperationsConfig::default());
        let mut sut = Sut {
            rt,
            _harness: harness,
            store,
            clock,
            agents_api: AgentTransport::new(lanes.clone()),
            lanes,
            operations,
            agents: Vec::new(),
            facts: Facts::default(),
            restarts: 0,
            policies,
            who: AgentIdentity { tenant_id: "t".into(), store_id: "s".into() },
        };
        for id in AGENTS {
            let session = sut.new_session();
            sut.agents.push(SimAgent {
                id,
                session,
                inbox: VecDeque::new(),
                outbox: Vec::new(),
                journal: HashMap::new(),
            });
        }
        sut
    }

    fn new_session(&mut self) -> String {
        self.restarts += 1;
        onceprint_core::ids::agent_session_id(self.clock.now_ms(), self.restarts)
    }

    fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt
            .block_on(async { tokio::time::timeout(Duration::from_secs(20), f).await })
            .expect("a step took longer than 20 s")
    }

    fn tasks(&self) -> Vec<onceprint_store::Task> {
        let q = TaskQuery { tenant_id: "t".into(), limit: 10_000, ..TaskQuery::default() };
        self.block_on(self.store.list_tasks(&q)).expect("list")
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Submit { printer, kind } => {
                let (print_type, priority) = TYPES[kind];
                let now = self.clock.now_ms();
                let id = onceprint_engine::ids::next_task_id(now).into_string();
                let task = NewTask {
                    task_id: id.clone(),
                    tenant_id: "t".into(),
                    store_id: "s".into(),
                    printer_id: PRINTERS[printer].into(),
                    station_id: None,
                    target: format!("printer:{}", PRINTERS[printer]),
                    biz_no: id.clone(),
                    print_type: print_type.into(),
                    priority,
                    content_type: "text".into(),
                    content: b"x\n".to_vec(),
                    fingerprint: "f".into(),
                    actor: "tenant:t".into(),
                    charge: 1,
                    now,
                    origin: None,
                };
                self.block_on(self.store.submit_batch(vec![task])).expect("submit");
            }
            Op::Poll { agent } => self.poll(agent),
            Op::Handle { agent, print } => self.handle(agent, print),
            Op::SendAcks { agent, request_lost, answer_lost, next } => {
                // A lost request, or a lost answer to an applied one: the agent keeps the
                // acks and sends them again later.
                if !request_lost {
                    self.send_acks(agent, answer_lost, next);
                }
            }
            Op::Restart { agent } => self.restart(agent),
            Op::Advance { ms } => self.clock.advance(ms),
            Op::Sweep => {
                self.block_on(self.lanes.sweep_once()).expect("sweep");
            }
            Op::Manual { pick, action } => {
                let tasks = self.tasks();
                if tasks.is_empty() {
                    return;
                }
                let t = &tasks[pick % tasks.len()];
                let action = [ManualAction::Cancel, ManualAction::Reprint, ManualAction::MarkPrinted][action];
                let req = ActionRequest {
                    tenant_id: "t".into(),
                    task_id: t.task_id.clone(),
                    actor: onceprint_engine::Actor::Operator("op".into()),
                    reason: "model".into(),
                    printer_id: None,
                };
                // Refused actions (a task in flight, a finished one) are part of the test too.
                let _ = self.block_on(self.operations.act(action, req));
            }
        }
    }

    fn poll(&mut self, agent: usize) {
        let (id, session) = (self.agents[agent].id, self.agents[agent].session.clone());
        let answer =
            self.block_on(self.agents_api.poll(&self.who, id, Some(&session), None, Duration::from_millis(0), 16));
        let deliveries = match answer {
            Ok(d) => d,
            // A newer process took over: this one stops (it is restarted as a newer one).
            Err(onceprint_engine::PollError::Superseded(_)) => {
                self.restart(agent);
                return;
            }
            Err(e) => panic!("poll failed: {e}"),
        };
        self.receive(agent, deliveries);
    }

    /// Deliveries reach the agent (from a poll, or with the answer to its acks): they
    /// must leave each lane in order within a priority.
    fn receive(&mut self, agent: usize, deliveries: Vec<AgentDelivery>) {
        for d in deliveries {
            let prio = self.policies.policy_for(&self.task_type(&d.task_id)).priority;
            if self.facts.seen.insert(d.task_id.clone()) {
                let k = (d.printer_id.clone(), prio);
                if let Some(prev) = self.facts.first_out.get(&k) {
                    assert!(
                        *prev < d.task_id,
                        "FIFO within a priority broken on {}: {} handed out after {}",
                        d.printer_id,
                        d.task_id,
                        prev
                    );
                }
                self.facts.first_out.insert(k, d.task_id.clone());
            }
            self.agents[agent].inbox.push_back(d);
        }
    }

    fn task_type(&self, id: &str) -> String {
        self.block_on(self.store.get_task("t", id)).expect("read").map(|t| t.print_type).unwrap_or_default()
    }

    fn handle(&mut self, agent: usize, print: Print) {
        let Some(d) = self.agents[agent].inbox.pop_front() else { return };
        let ack = |outcome| AckIn::agent(d.task_id.clone(), d.attempt, outcome, String::new());
        let journal = &mut self.agents[agent].journal;
        if let Some((attempt, j)) = journal.get(&d.task_id).copied() {
            let authorised = d.reprint && attempt < d.attempt;
            let answer = match j {
                Journal::Printed => Some(Outcome::Printed),
                Journal::Started | Journal::InDoubt if authorised => None,
                Journal::Started => {
                    journal.insert(d.task_id.clone(), (d.attempt, Journal::InDoubt));
                    Some(Outcome::InDoubt)
                }
                Journal::InDoubt => Some(Outcome::InDoubt),
                Journal::Blocked(o) if attempt >= d.attempt => Some(o),
                Journal::Blocked(_) => None,
            };
            if let Some(o) = answer {
                self.agents[agent].outbox.push(ack(o));
                return;
            }
        }
        let (record, paper, reply) = match print {
            Print::Printed => (Journal::Printed, true, Some(Outcome::Printed)),
            Print::Blocked(o) => (Journal::Blocked(o), false, Some(o)),
            Print::LostAfterPaper => (Journal::InDoubt, true, Some(Outcome::InDoubt)),
            Print::Crash { paper } => (Journal::Started, paper, None),
        };
        self.agents[agent].journal.insert(d.task_id.clone(), (d.attempt, record));
        if paper {
            *self.facts.paper.entry(d.task_id.clone()).or_default() += 1;
        }
        match reply {
            Some(o) => self.agents[agent].outbox.push(ack(o)),
            None => self.restart(agent),
        }
    }

    fn send_acks(&mut self, agent: usize, keep: bool, next: bool) {
        let a = &self.agents[agent];
        if a.outbox.is_empty() {
            return;
        }
        let (id, session, acks) = (a.id, a.session.clone(), a.outbox.clone());
        let next = if next { 16 } else { 0 };
        let (_, deliveries) =
            self.block_on(self.agents_api.ack_and_take(&self.who, id, Some(&session), acks, next)).expect("acks");
        if !keep {
            self.agents[agent].outbox.clear();
            self.receive(agent, deliveries);
        }
    }

    /// kill -9 and start again: what was in memory is gone, the journal stays.
    fn restart(&mut self, agent: usize) {
        let session = self.new_session();
        let a = &mut self.agents[agent];
        a.inbox.clear();
        a.outbox.clear();
        a.session = session;
    }

    fn check(&self) {
        let tasks = self.tasks();
        let mut in_flight: HashMap<&str, usize> = HashMap::new();
        for t in &tasks {
            let paper = self.facts.paper.get(&t.task_id).copied().unwrap_or(0);
            if t.state == TaskState::Sent {
                *in_flight.entry(t.printer_id.as_str()).or_default() += 1;
            }
            let reprints = self.policies.policy_for(&t.print_type).reprint_on_doubt;
            if reprints {
                assert!(paper <= MAX_ATTEMPTS, "{} printed {paper} times, more than its attempts", t.task_id);
            } else {
                assert!(paper <= 1, "{} ({}) printed {paper} times", t.task_id, t.print_type);
                if t.state == TaskState::Failed {
                    assert_eq!(paper, 0, "{} failed although it printed", t.task_id);
                }
            }
            if t.state == TaskState::Printed {
                assert!(paper >= 1, "{} is printed without paper", t.task_id);
            }
        }
        for (p, n) in in_flight {
            assert!(n <= 1, "{n} tasks in flight on {p}");
        }
    }

    /// Faults stop: every agent polls, prints and acknowledges, time moves on; every lane
    /// must drain within a bound.
    fn drain(&mut self) {
        for round in 0..60 {
            let open: Vec<_> = self
                .tasks()
                .into_iter()
                .filter(|t| matches!(t.state, TaskState::Pending | TaskState::Sent | TaskState::Retrying))
                .collect();
            if open.is_empty() {
                return;
            }
            assert!(round < 59, "lanes did not drain within 60 simulated seconds: {open:#?}");
            self.clock.advance(1_000);
            self.block_on(self.lanes.sweep_once()).expect("sweep");
            for agent in 0..AGENTS.len() {
                self.poll(agent);
                while !self.agents[agent].inbox.is_empty() {
                    self.handle(agent, Print::Printed);
                }
                // The real agent asks for the next deliveries with its acks.
                self.send_acks(agent, false, true);
            }
            self.check();
        }
    }
}

struct LaneTest;

impl StateMachineTest for LaneTest {
    type SystemUnderTest = Sut;
    type Reference = Model;

    fn init_test(_: &()) -> Sut {
        Sut::new()
    }

    fn apply(mut sut: Sut, _: &(), op: Op) -> Sut {
        sut.apply(&op);
        sut
    }

    fn check_invariants(sut: &Sut, _: &()) {
        sut.check();
    }

    fn teardown(mut sut: Sut) {
        sut.drain();
    }
}

fn run(factory: HarnessFactory, cases: u32) {
    let _run = RUN.lock().unwrap_or_else(PoisonError::into_inner);
    {
        let rt = runtime();
        let Some(probe) = rt.block_on(factory()) else { return };
        rt.block_on(async move { drop(probe) });
    }
    *FACTORY.lock().unwrap_or_else(PoisonError::into_inner) = Some(factory);
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(cases);
    let config = Config { cases, failure_persistence: None, ..Config::default() };
    let mut runner = TestRunner::new(config.clone());
    let result = runner.run(&Model::sequential_strategy(1..60), |(initial, steps, seen)| {
        LaneTest::test_sequential(config.clone(), initial, steps, seen);
        Ok(())
    });
    if let Err(e) = result {
        panic!("the lane engine broke the promise: {e}");
    }
}

#[test]
fn lanes_never_print_twice_and_always_drain_on_sqlite() {
    fn factory() -> std::pin::Pin<Box<dyn std::future::Future<Output = Option<Harness>> + Send>> {
        Box::pin(onceprint_store_sqlite::testing::fresh_store())
    }
    run(factory, 48);
}

#[test]
fn lanes_never_print_twice_and_always_drain_on_postgres() {
    fn factory() -> std::pin::Pin<Box<dyn std::future::Future<Output = Option<Harness>> + Send>> {
        Box::pin(onceprint_store_postgres::testing::fresh_store())
    }
    run(factory, 16);
}
