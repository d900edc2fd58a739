//! Property test of the idempotency contract of [`Store::submit_batch`], run against every
//! backend.
//!
//! The example-based cases in the parent module each check one scenario. Here proptest
//! generates whole sequences of submissions — single ones, batches with repeats, and
//! submissions racing each other both as separate transactions and through the
//! [`GroupCommitter`] — over a deliberately tiny pool of keys and contents, so that
//! repeats, repeats with other content and races for a new key happen in almost every
//! case. After every step it checks what the HTTP layer builds on: a key is created
//! exactly once, every answer for a key names the same task, and the fingerprint in an
//! answer equals the submitted content's fingerprint exactly when the content is the one
//! that created the task (that comparison is how a repeat becomes 200 or 422
//! `idempotency_mismatch`). After every step it also checks that nothing else was
//! written: one task per key in `list_tasks`, one ledger charge and one audit event per
//! task, and the stored content is the creator's.
//!
//! The reference model cannot know everything in advance: task ids are chosen per
//! submission, and which of several racing submissions creates a new key is decided by
//! the backend. So the work is split in two. The reference state (proptest's
//! `ReferenceStateMachine`) records which keys must exist and which contents may have
//! created each of them — one content when the winner is determined, several after a
//! race. The system under test keeps the record of what was actually created (key →
//! task id and content), learns it from the single `Created` answer for a new key, and
//! checks that record against the reference state after every step.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use onceprint_core::{Fingerprint, IdempotencyKey, TaskState};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::{Config, RngSeed, TestError, TestRunner};
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};
use tokio::runtime::Runtime;

use super::{tenant, NOW};
use crate::testing::Harness;
use crate::{GroupCommitConfig, GroupCommitter, NewTask, Store, SubmitOutcome, TaskQuery};

/// Cases a backend runs by default. Each case is a fresh database and up to 19 steps,
/// which keeps the test at a few seconds on SQLite; `PROPTEST_CASES` overrides it for a
/// longer hunt.
pub const IDEMPOTENCY_CASES: u32 = 32;

/// Longest a step's store calls may take. Far above what any backend needs for a
/// handful of submissions, even on a loaded CI machine.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);

/// An async factory of fresh, empty, migrated stores, as every backend's
/// `testing::fresh_store` is, boxed so that it can be passed as a plain function pointer.
pub type HarnessFactory = fn() -> Pin<Box<dyn Future<Output = Option<Harness>> + Send>>;

/// Generates `#[test] fn idempotency_contract_holds()` running [`idempotency_property`]
/// against a backend factory (an `async fn() -> Option<Harness>`).
///
/// It is a plain `#[test]` rather than a `#[tokio::test]` because the property test builds
/// its own runtime per case, and a runtime cannot be dropped inside another one.
#[macro_export]
macro_rules! idempotency_property_test {
    ($factory:path) => {
        #[test]
        fn idempotency_contract_holds() {
            fn factory() -> ::std::pin::Pin<
                ::std::boxed::Box<
                    dyn ::std::future::Future<Output = ::std::option::Option<$crate::testing::Harness>>
                        + ::std::marker::Send,
                >,
            > {
                ::std::boxed::Box::pin($factory())
            }
            $crate::conformance::idempotency_property(factory, $crate::conformance::IDEMPOTENCY_CASES);
        }
    };
}

/// The factory of the run in progress. `StateMachineTest::init_test` is a static function
/// without parameters, so this is the only way to hand it the backend. A static rather
/// than a thread-local, because proptest runs a case on another thread when
/// `PROPTEST_TIMEOUT` is set.
static FACTORY: Mutex<Option<HarnessFactory>> = Mutex::new(None);

/// Held for a whole run so that two runs in one process cannot swap each other's factory.
static RUN: Mutex<()> = Mutex::new(());

/// Runs the idempotency property `cases` times (or `PROPTEST_CASES` times when that is
/// set) against stores made by `factory`, each case on a fresh store. Returns without
/// testing anything when the factory yields `None`: the backend is not configured here,
/// and the factory has already said so.
///
/// Panics with the shrunk, minimal failing sequence of steps when the contract is broken.
/// Must not be called from inside a tokio runtime.
pub fn idempotency_property(factory: HarnessFactory, cases: u32) {
    let _run = RUN.lock().unwrap_or_else(PoisonError::into_inner);

    // Ask once up front, so that an unconfigured backend skips instead of failing in the
    // middle of proptest's machinery.
    {
        let rt = runtime();
        let Some(probe) = rt.block_on(factory()) else { return };
        rt.block_on(async move { drop(probe) });
    }

    *FACTORY.lock().unwrap_or_else(PoisonError::into_inner) = Some(factory);
    let _clear = ClearFactory;

    let cases = match std::env::var("PROPTEST_CASES") {
        Ok(v) => v.parse().unwrap_or_else(|_| panic!("PROPTEST_CASES={v} is not a number")),
        Err(_) => cases,
    };
    let defaults = Config::default();
    // Fix the seed ourselves so that it can be printed on failure.
    let rng_seed = match defaults.rng_seed {
        RngSeed::Random => {
            let nanos =
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
            RngSeed::Fixed(nanos as u64)
        }
        fixed => fixed,
    };
    let config = Config {
        cases,
        // A regression file would land in this crate's source tree and be shared by all
        // backends; the panic message below carries the minimal case instead.
        failure_persistence: None,
        rng_seed,
        ..defaults
    };
    let seed = config.rng_seed;

    let mut runner = TestRunner::new(config.clone());
    let result = runner.run(&Model::sequential_strategy(1..20), |(initial, steps, seen)| {
        IdempotencyTest::test_sequential(config.clone(), initial, steps, seen);
        Ok(())
    });
    match result {
        Ok(()) => {}
        Err(TestError::Fail(reason, (_, steps, _))) => {
            let listed: Vec<String> = steps.iter().map(|s| format!("  {s:?}")).collect();
            panic!(
                "the idempotency contract does not hold: {reason}\n\
                 minimal failing sequence ({} steps, on a fresh store with tenants t1 and t2):\n{}\n\
                 rerun with PROPTEST_RNG_SEED={seed} (concurrent steps make a rerun likely, \
                 not certain, to fail the same way)",
                steps.len(),
                listed.join("\n")
            );
        }
        Err(TestError::Abort(reason)) => panic!("the idempotency property test aborted: {reason}"),
    }
}

/// Forgets the factory when the run ends, also when it ends in a panic.
struct ClearFactory;

impl Drop for ClearFactory {
    fn drop(&mut self) {
        *FACTORY.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("cannot build a tokio runtime: {e}"))
}

// The pools are small on purpose: 12 keys and 2 contents make repeats, mismatching
// repeats and races for one key frequent even in short sequences.
static TENANTS: [&str; 2] = ["t1", "t2"];
static BIZ_NOS: [&str; 3] = ["B1", "B2", "B3"];
static PRINT_TYPES: [&str; 2] = ["receipt", "kitchen"];
static CONTENTS: [&str; 2] = ["x", "y"];

/// One idempotency key of the pool; every tenant has the one printer p1.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    tenant: &'static str,
    biz_no: &'static str,
    print_type: &'static str,
}

impl Key {
    fn idempotency_key(&self) -> IdempotencyKey {
        IdempotencyKey {
            tenant_id: self.tenant.into(),
            target: "printer:p1".into(),
            biz_no: self.biz_no.into(),
            print_type: self.print_type.into(),
        }
    }
}

// Compact on purpose: shrunk failing sequences are printed with these.
impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.tenant, self.biz_no, self.print_type)
    }
}

/// One submission: a key and the content sent with it.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Submission {
    key: Key,
    content: &'static str,
}

impl fmt::Debug for Submission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}={}", self.key, self.content)
    }
}

/// The transitions of the state machine.
#[derive(Clone, Debug)]
enum Step {
    /// One `submit_batch` call with one task.
    Submit(Submission),
    /// One `submit_batch` call with several tasks, repeats included.
    Batch(Vec<Submission>),
    /// Submissions started at the same moment: the even-numbered ones each as their own
    /// `submit_batch` call in its own tokio task, the odd-numbered ones together through
    /// a [`GroupCommitter`]; all awaited before the step ends.
    Concurrent(Vec<Submission>),
}

/// The reference state: every key that must exist, with the contents that may have
/// created it (exactly one unless the key was born in a race between contents).
#[derive(Clone, Debug, Default)]
struct Expected {
    keys: BTreeMap<Key, BTreeSet<&'static str>>,
}

struct Model;

fn submission() -> impl Strategy<Value = Submission> {
    (select(&TENANTS[..]), select(&BIZ_NOS[..]), select(&PRINT_TYPES[..]), select(&CONTENTS[..])).prop_map(
        |(tenant, biz_no, print_type, content)| Submission { key: Key { tenant, biz_no, print_type }, content },
    )
}

impl ReferenceStateMachine for Model {
    type State = Expected;
    type Transition = Step;

    fn init_state() -> BoxedStrategy<Expected> {
        Just(Expected::default()).boxed()
    }

    fn transitions(_: &Expected) -> BoxedStrategy<Step> {
        prop_oneof![
            3 => submission().prop_map(Step::Submit),
            2 => vec(submission(), 2..6).prop_map(Step::Batch),
            2 => vec(submission(), 2..8).prop_map(Step::Concurrent),
        ]
        .boxed()
    }

    fn apply(mut state: Expected, step: &Step) -> Expected {
        match step {
            Step::Submit(s) => {
                state.keys.entry(s.key).or_insert_with(|| BTreeSet::from([s.content]));
            }
            // Within one call the first submission of a key creates it: the trait says a
            // key that exists "earlier in the same batch" is not created again.
            Step::Batch(subs) => {
                for s in subs {
                    state.keys.entry(s.key).or_insert_with(|| BTreeSet::from([s.content]));
                }
            }
            // Racing submissions of a new key may each win; any of their contents may be
            // the one the task was created with.
            Step::Concurrent(subs) => {
                let new: BTreeSet<Key> = subs.iter().map(|s| s.key).filter(|k| !state.keys.contains_key(k)).collect();
                for s in subs.iter().filter(|s| new.contains(&s.key)) {
                    state.keys.entry(s.key).or_default().insert(s.content);
                }
            }
        }
        state
    }
}

fn fingerprint(content: &str) -> String {
    Fingerprint::of("text", content.as_bytes()).0
}

/// Names a fingerprint by the pool content it belongs to, so that failure messages read
/// `fingerprint of "x"` instead of 64 hex digits.
fn fingerprint_name(fp: &str) -> String {
    match CONTENTS.iter().find(|c| fingerprint(c) == fp) {
        Some(c) => format!("fingerprint of {c:?}"),
        None => format!("unknown fingerprint {fp:?}"),
    }
}

/// What the backend actually created for a key.
#[derive(Clone, Debug)]
struct Created {
    task_id: String,
    content: &'static str,
}

/// The system under test: a fresh store on its own runtime, a group committer in front of
/// it, and the record of what it has created so far.
struct Sut {
    // Options so that `Drop` can take them apart in the right order.
    rt: Option<Runtime>,
    harness: Option<Harness>,
    committer: Option<GroupCommitter>,
    /// References to the store held by the harness itself; used at teardown to wait until
    /// the committer's tasks have let go of theirs.
    own_refs: usize,
    created: BTreeMap<Key, Created>,
    next_seq: u64,
}

impl Sut {
    fn new() -> Sut {
        let factory = FACTORY
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .expect("the idempotency property test runs only through idempotency_property()");
        let rt = runtime();
        let harness =
            rt.block_on(factory()).expect("the backend was available when the run started but not for this case");
        let own_refs = Arc::strong_count(&harness.store);
        rt.block_on(async {
            for t in TENANTS {
                tenant(&harness.store, t).await;
            }
        });
        // Batches of at most two with two in flight, so that the committer's share of a
        // concurrent step (up to four submissions) is split into batches that commit at
        // the same time as each other and as the separate submit_batch calls.
        let committer = {
            let _ctx = rt.enter();
            GroupCommitter::start(harness.store.clone(), GroupCommitConfig { max_batch: 2, max_in_flight: 2 })
        };
        Sut {
            rt: Some(rt),
            harness: Some(harness),
            committer: Some(committer),
            own_refs,
            created: BTreeMap::new(),
            next_seq: 0,
        }
    }

    fn rt(&self) -> &Runtime {
        self.rt.as_ref().expect("runtime is present until drop")
    }

    /// Runs one step's store calls to completion. A backend that never answers (a lock
    /// wait, a lost reply) fails the case with a message, so proptest can shrink it,
    /// instead of hanging the test run.
    fn block_on<F: Future>(&self, what: &str, future: F) -> F::Output {
        self.rt()
            .block_on(async { tokio::time::timeout(STEP_TIMEOUT, future).await })
            .unwrap_or_else(|_| panic!("{what} did not finish within {} s", STEP_TIMEOUT.as_secs()))
    }

    fn store(&self) -> Arc<dyn Store> {
        self.harness.as_ref().expect("harness is present until drop").store.clone()
    }

    /// A submission as the HTTP layer would hand it to the store: a fresh task id every
    /// time (a retry gets a new id too) and the real fingerprint of the content.
    fn new_task(&mut self, s: Submission) -> NewTask {
        self.next_seq += 1;
        let seq = self.next_seq;
        NewTask {
            task_id: format!("prop-{seq:06}"),
            tenant_id: s.key.tenant.into(),
            store_id: "s1".into(),
            printer_id: "p1".into(),
            station_id: None,
            target: "printer:p1".into(),
            biz_no: s.key.biz_no.into(),
            print_type: s.key.print_type.into(),
            priority: 10,
            content_type: "text".into(),
            content: s.content.as_bytes().to_vec(),
            fingerprint: fingerprint(s.content),
            actor: format!("tenant:{}", s.key.tenant),
            charge: 1,
            now: NOW + seq as i64,
            origin: None,
        }
    }

    fn submit_batch(&mut self, subs: &[Submission]) -> (Vec<NewTask>, Vec<SubmitOutcome>) {
        let tasks: Vec<NewTask> = subs.iter().map(|s| self.new_task(*s)).collect();
        let store = self.store();
        let batch = tasks.clone();
        let answers = self
            .block_on("submit_batch", async move { store.submit_batch(batch).await })
            .unwrap_or_else(|e| panic!("submit_batch of {subs:?} failed: {e}"));
        (tasks, answers)
    }

    fn submit_concurrently(&mut self, subs: &[Submission]) -> (Vec<NewTask>, Vec<SubmitOutcome>) {
        let tasks: Vec<NewTask> = subs.iter().map(|s| self.new_task(*s)).collect();
        let store = self.store();
        let committer = self.committer.clone().expect("committer is present until drop");
        let (direct, queued): (Vec<_>, Vec<_>) = tasks.iter().cloned().enumerate().partition(|(i, _)| i % 2 == 0);
        let n = tasks.len();
        let answers = self.block_on("the concurrent submissions", async move {
            // The barrier lines all submissions up before any of them starts, so that they
            // really overlap instead of running in spawn order. One party per direct
            // submission, one for the committer's share.
            let barrier = Arc::new(tokio::sync::Barrier::new(direct.len() + 1));
            let mut handles = Vec::new();
            for (i, task) in direct {
                let (store, barrier) = (store.clone(), barrier.clone());
                let handle = tokio::spawn(async move {
                    barrier.wait().await;
                    let answer = store.submit_batch(vec![task]).await.and_then(|mut out| match out.len() {
                        1 => Ok(out.remove(0)),
                        k => Err(crate::StoreError::Backend(format!("{k} answers for one submission"))),
                    });
                    vec![answer]
                });
                handles.push((vec![i], handle));
            }
            // The committer's share is handed over in one burst, the way requests pile up
            // on a busy server while a commit is in flight. Sent one by one from separate
            // tasks they almost always arrive singly, and the committer would then commit
            // each alone instead of batching them.
            let (idx, queued): (Vec<usize>, Vec<NewTask>) = queued.into_iter().unzip();
            let handle = tokio::spawn(async move {
                barrier.wait().await;
                join_all(queued.into_iter().map(|task| committer.submit(task)).collect()).await
            });
            handles.push((idx, handle));

            let mut answers: Vec<Option<SubmitOutcome>> = (0..n).map(|_| None).collect();
            for (idx, handle) in handles {
                let outs = handle.await.unwrap_or_else(|e| panic!("submissions {idx:?} panicked: {e}"));
                for (i, out) in idx.into_iter().zip(outs) {
                    answers[i] = Some(out.unwrap_or_else(|e| panic!("concurrent submission {i} failed: {e}")));
                }
            }
            answers.into_iter().map(|a| a.expect("every submission was answered")).collect::<Vec<_>>()
        });
        (tasks, answers)
    }

    /// The postconditions of one step. `in_order` is true when all submissions went in one
    /// `submit_batch` call, where the first submission of a new key must be the one that
    /// creates it.
    fn check_answers(&mut self, subs: &[Submission], tasks: &[NewTask], answers: &[SubmitOutcome], in_order: bool) {
        assert_eq!(answers.len(), subs.len(), "one answer per submission");
        for (i, (s, answer)) in subs.iter().zip(answers).enumerate() {
            let t = answer.task();
            assert_eq!(
                (t.tenant_id.as_str(), t.target.as_str(), t.biz_no.as_str(), t.print_type.as_str()),
                (s.key.tenant, "printer:p1", s.key.biz_no, s.key.print_type),
                "answer {i} is for another key than submission {i} ({s:?}): each caller must get the answer for its own submission"
            );
            // Nothing in this test moves a task on, so every task is still where it began.
            assert_eq!((t.state, t.attempts), (TaskState::Pending, 0), "answer {i} ({s:?})");
        }

        let mut keys: Vec<Key> = Vec::new();
        for s in subs {
            if !keys.contains(&s.key) {
                keys.push(s.key);
            }
        }
        for key in keys {
            let idx: Vec<usize> = (0..subs.len()).filter(|&i| subs[i].key == key).collect();
            let kinds: Vec<&str> = idx.iter().map(|&i| outcome_kind(&answers[i])).collect();
            match self.created.get(&key) {
                Some(known) => {
                    for &i in &idx {
                        assert!(
                            matches!(answers[i], SubmitOutcome::Existing(_)),
                            "{key:?} already existed, yet submission {i} ({:?}) was answered {}",
                            subs[i],
                            outcome_kind(&answers[i])
                        );
                        assert_eq!(
                            answers[i].task().task_id,
                            known.task_id,
                            "submission {i} ({:?}) must be answered with the existing task",
                            subs[i]
                        );
                    }
                }
                None => {
                    let winners: Vec<usize> =
                        idx.iter().copied().filter(|&i| matches!(answers[i], SubmitOutcome::Created(_))).collect();
                    assert_eq!(
                        winners.len(),
                        1,
                        "{key:?} was new, so exactly one of its submissions {idx:?} must be Created; got {kinds:?}"
                    );
                    let w = winners[0];
                    if in_order {
                        assert_eq!(
                            w, idx[0],
                            "inside one batch the first submission of new {key:?} creates it; got {kinds:?}"
                        );
                    }
                    assert_eq!(
                        answers[w].task().task_id,
                        tasks[w].task_id,
                        "the Created answer to submission {w} must carry the task id it submitted"
                    );
                    for &i in &idx {
                        assert_eq!(
                            answers[i].task().task_id,
                            tasks[w].task_id,
                            "every answer for {key:?} must name the task that was created (submission {w})"
                        );
                    }
                    self.created.insert(key, Created { task_id: tasks[w].task_id.clone(), content: subs[w].content });
                }
            }

            // The HTTP layer answers a repeat 200 when the fingerprint in the answer equals
            // the one it computed for the request, and 422 when it differs.
            let creator = self.created[&key].content;
            for &i in &idx {
                let answered = &answers[i].task().fingerprint;
                assert_eq!(
                    fingerprint_name(answered),
                    fingerprint_name(&fingerprint(creator)),
                    "the answer to submission {i} ({:?}) must carry the fingerprint of the content {creator:?} that created the task",
                    subs[i]
                );
                assert_eq!(
                    *answered == fingerprint(subs[i].content),
                    subs[i].content == creator,
                    "submission {i} ({:?}): fingerprints must match exactly when the contents are equal",
                    subs[i]
                );
            }
        }
    }

    /// What the store actually created must be what the reference model allows.
    fn check_against_model(&self, expected: &Expected) {
        let created: Vec<Key> = self.created.keys().copied().collect();
        let must_exist: Vec<Key> = expected.keys.keys().copied().collect();
        assert_eq!(created, must_exist, "keys the store created vs keys the model says exist");
        for (key, c) in &self.created {
            let allowed = &expected.keys[key];
            assert!(
                allowed.contains(c.content),
                "{key:?} was created with {:?}, the model allows {allowed:?}",
                c.content
            );
        }
    }

    /// The invariants: the database holds exactly one task per created key, each with one
    /// charge, one audit event and the content of the submission that created it.
    fn check_store(&self) {
        let store = self.store();
        let created = self.created.clone();
        self.block_on("checking the store", async move {
            for t in TENANTS {
                let listed = store
                    .list_tasks(&TaskQuery { tenant_id: t.into(), limit: 1000, ..Default::default() })
                    .await
                    .unwrap_or_else(|e| panic!("list_tasks({t}) failed: {e}"));
                let got: Vec<(String, String, String)> = sorted(
                    listed
                        .iter()
                        .map(|task| (task.biz_no.clone(), task.print_type.clone(), task.task_id.clone()))
                        .collect(),
                );
                let want: Vec<(String, String, String)> = sorted(
                    created
                        .iter()
                        .filter(|(k, _)| k.tenant == t)
                        .map(|(k, c)| (k.biz_no.to_owned(), k.print_type.to_owned(), c.task_id.clone()))
                        .collect(),
                );
                assert_eq!(got, want, "list_tasks({t}) must hold exactly one task per created key");
            }
            for (key, c) in &created {
                let id = c.task_id.as_str();
                let ledger =
                    store.ledger_entries(id).await.unwrap_or_else(|e| panic!("ledger_entries({id}) failed: {e}"));
                let ledger: Vec<(&str, &str, i64)> =
                    ledger.iter().map(|l| (l.kind.as_str(), l.tenant_id.as_str(), l.amount)).collect();
                assert_eq!(ledger, vec![("charge", key.tenant, 1)], "ledger of {id} ({key:?}): exactly one charge");

                let events = store
                    .task_events(key.tenant, id)
                    .await
                    .unwrap_or_else(|e| panic!("task_events({id}) failed: {e}"))
                    .unwrap_or_else(|| panic!("task {id} ({key:?}) has no audit trail"));
                let events: Vec<_> = events.iter().map(|e| (e.from, e.to, e.actor.as_str())).collect();
                let actor = format!("tenant:{}", key.tenant);
                assert_eq!(
                    events,
                    vec![(None, TaskState::Pending, actor.as_str())],
                    "audit trail of {id} ({key:?}): exactly the creation event"
                );

                let content = store
                    .task_content(id)
                    .await
                    .unwrap_or_else(|e| panic!("task_content({id}) failed: {e}"))
                    .unwrap_or_else(|| panic!("task {id} ({key:?}) has no content"));
                assert_eq!(
                    (content.content_type.as_str(), content.content.as_slice()),
                    ("text", c.content.as_bytes()),
                    "task {id} ({key:?}) must keep the content it was created with"
                );

                let found = store
                    .find_task(&key.idempotency_key())
                    .await
                    .unwrap_or_else(|e| panic!("find_task({key:?}) failed: {e}"))
                    .map(|task| task.task_id);
                assert_eq!(found.as_deref(), Some(id), "find_task({key:?})");
            }
            let counts = store.count_by_state().await.unwrap_or_else(|e| panic!("count_by_state failed: {e}"));
            let counts: Vec<_> = counts.into_iter().filter(|(_, n)| *n != 0).collect();
            let want = if created.is_empty() { vec![] } else { vec![(TaskState::Pending, created.len() as i64)] };
            assert_eq!(counts, want, "count_by_state");
        });
    }
}

fn outcome_kind(o: &SubmitOutcome) -> &'static str {
    match o {
        SubmitOutcome::Created(_) => "Created",
        SubmitOutcome::Existing(_) => "Existing",
        SubmitOutcome::Pruned(_) => "Pruned",
    }
}

fn sorted<T: Ord>(mut v: Vec<T>) -> Vec<T> {
    v.sort();
    v
}

/// Polls all futures together on one task and returns their outputs in order. A few
/// lines here instead of a dependency on the `futures` crate.
async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    std::task::Poll::Ready(value) => *output = Some(value),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().map(|o| o.expect("every future completed")).collect()
}

impl Drop for Sut {
    /// Takes the case apart in an order every backend can live with, also when a check
    /// failed: the committer first, then the harness once nothing else holds the store
    /// (dropped inside the runtime, as the other conformance tests drop theirs), the
    /// runtime last. Nothing here may panic, since this also runs while unwinding.
    fn drop(&mut self) {
        drop(self.committer.take());
        if let (Some(rt), Some(harness)) = (self.rt.as_ref(), self.harness.take()) {
            // The committer's loop and batch tasks end on their own once the last handle is
            // gone; give them a moment to release their references to the store, so that
            // the harness's cleanup does not run under a store that is still open.
            let deadline = Instant::now() + Duration::from_secs(2);
            while Arc::strong_count(&harness.store) > self.own_refs && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            rt.block_on(async move { drop(harness) });
        }
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(10));
        }
    }
}

struct IdempotencyTest;

impl StateMachineTest for IdempotencyTest {
    type SystemUnderTest = Sut;
    type Reference = Model;

    fn init_test(_: &Expected) -> Sut {
        Sut::new()
    }

    fn apply(mut sut: Sut, expected: &Expected, step: Step) -> Sut {
        let (subs, in_order, (tasks, answers)) = match step {
            Step::Submit(s) => (vec![s], true, sut.submit_batch(&[s])),
            Step::Batch(subs) => {
                let out = sut.submit_batch(&subs);
                (subs, true, out)
            }
            Step::Concurrent(subs) => {
                let out = sut.submit_concurrently(&subs);
                (subs, false, out)
            }
        };
        sut.check_answers(&subs, &tasks, &answers, in_order);
        sut.check_against_model(expected);
        sut
    }

    fn check_invariants(sut: &Sut, _: &Expected) {
        sut.check_store();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unavailable() -> Pin<Box<dyn Future<Output = Option<Harness>> + Send>> {
        Box::pin(async { None })
    }

    /// A backend that is not configured on this machine must skip, not fail: its factory
    /// has already printed why.
    #[test]
    fn an_unavailable_backend_is_skipped() {
        idempotency_property(unavailable, 1);
        assert!(FACTORY.lock().unwrap_or_else(PoisonError::into_inner).is_none());
    }

    /// Racing contents for a new key all stay possible; a later repeat changes nothing.
    #[test]
    fn the_model_keeps_every_racing_content_possible() {
        let k = Key { tenant: "t1", biz_no: "B1", print_type: "receipt" };
        let race = Step::Concurrent(vec![Submission { key: k, content: "x" }, Submission { key: k, content: "y" }]);
        let state = Model::apply(Expected::default(), &race);
        assert_eq!(state.keys[&k], BTreeSet::from(["x", "y"]));
        let state = Model::apply(state, &Step::Batch(vec![Submission { key: k, content: "x" }]));
        assert_eq!(state.keys[&k], BTreeSet::from(["x", "y"]));
    }
}
