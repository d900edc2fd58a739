//! Retention through the engine's own services on a real store (SQLite, and
//! PostgreSQL when `ONCEPRINT_TEST_POSTGRES` names a server): intake, the manual channel,
//! reconciliation and the retention job, with the job's clock moved by hand.
//!
//! Tasks are submitted now (intake stamps them with the wall clock); the job's clock is set
//! 89 and then 91 days ahead, so the same tasks are first too young and then old enough.

use std::sync::Arc;

use onceprint_core::manual::ManualAction;
use onceprint_core::{Content, TaskState};
use onceprint_engine::clock::{now_ms, Clock, ManualClock};
use onceprint_engine::reconcile::reconcile;
use onceprint_engine::{
    ActionRequest, Actor, Directory, Intake, IntakeConfig, IntakeError, Operations, OperationsConfig, RecentTasks,
    Retention, RetentionConfig, Shared, StoreSignals, SubmitAnswer, SubmitKind, SubmitRequest,
};
use onceprint_store::testing::Harness;
use onceprint_store::{NewPrinter, NewStore, NewTenant, PrinterEnabled, SetupAudit, Store, Transition};

const DAY: i64 = 86_400_000;

async fn setup(s: &dyn Store) {
    let now = now_ms();
    s.create_tenant(NewTenant {
        id: "acme".into(),
        name: "Acme".into(),
        api_key_hash: "h".into(),
        now,
        api_key_id: "key-acme".into(),
        audit: SetupAudit::default(),
    })
    .await
    .expect("tenant");
    s.create_store(NewStore {
        tenant_id: "acme".into(),
        id: "s1".into(),
        name: "Main".into(),
        timezone: "Asia/Shanghai".into(),
        now,
        audit: SetupAudit::default(),
    })
    .await
    .expect("store");
    for p in ["p1", "p2"] {
        s.create_printer(NewPrinter {
            tenant_id: "acme".into(),
            id: p.into(),
            store_id: "s1".into(),
            name: p.into(),
            transport: r#"{"kind":"agent","address":"tcp://127.0.0.1:9100"}"#.into(),
            credential: None,
            now,
            audit: SetupAudit::default(),
        })
        .await
        .expect("printer");
    }
}

fn request(biz_no: &str, text: &str) -> SubmitRequest {
    SubmitRequest {
        tenant_id: "acme".into(),
        biz_no: Some(biz_no.into()),
        printer_id: Some("p1".into()),
        station_id: None,
        print_type: None,
        content: Some(Content::Text { text: text.into() }),
        ..Default::default()
    }
}

/// Sends a pending task and has it printed, telling the gate, as the lane engine would.
async fn print(s: &dyn Store, gate: &RecentTasks, task_id: &str) {
    let t = s.get_task("acme", task_id).await.expect("read").expect("task");
    let now = now_ms();
    let send = Transition {
        task_id: t.task_id.clone(),
        from: TaskState::Pending,
        expected_attempts: t.attempts,
        to: TaskState::Sent,
        attempts: t.attempts + 1,
        last_error: None,
        next_attempt_at: Some(now + 30_000),
        actor: "engine".into(),
        reason: "dispatched".into(),
        now,
        sent_to: Some("agent:a1".into()),
        sent_session: Some("s".into()),
        may_have_printed: false,
        event: None,
        refused: false,
    };
    assert!(s.transition(&send).await.expect("send"));
    let printed = Transition {
        from: TaskState::Sent,
        expected_attempts: t.attempts + 1,
        to: TaskState::Printed,
        next_attempt_at: None,
        actor: "agent:a1".into(),
        reason: "printed".into(),
        ..send
    };
    assert!(s.transition(&printed).await.expect("printed"));
    gate.set_state(task_id, TaskState::Printed);
}

fn intake(store: &Arc<dyn Store>) -> Intake {
    let directory = Arc::new(Directory::new(store.clone()));
    Intake::start(store.clone(), directory, Arc::new(StoreSignals::default()), IntakeConfig::default())
}

fn duplicate(a: &SubmitAnswer) -> (SubmitKind, &str, TaskState, bool) {
    (a.kind, a.task_id.as_str(), a.state, a.pruned)
}

async fn retention_keeps_what_matters(h: Harness) {
    let store = h.store.clone();
    setup(store.as_ref()).await;
    let first = intake(&store);
    let shared = Shared {
        store: store.clone(),
        directory: Arc::new(Directory::new(store.clone())),
        gate: first.gate().clone(),
        signals: Arc::new(StoreSignals::default()),
        policies: first.policies().clone(),
    };
    let operations = Operations::new(shared, OperationsConfig { charge: 1 });
    let act = |action, task_id: &str, printer_id: Option<&str>| {
        operations.act(
            action,
            ActionRequest {
                tenant_id: "acme".into(),
                task_id: task_id.into(),
                actor: Actor::ApiKey { key_id: "key-acme".into(), name: Some("Ann".into()) },
                reason: "test".into(),
                printer_id: printer_id.map(str::to_owned),
            },
        )
    };

    // PRINTED prints; CANCELLED is cancelled (refunded); MOVED is transferred to p2, whose
    // successor prints; OPEN stays pending; DOUBT fails to a person (not an end state).
    let printed = first.submit(request("PRINTED", "one")).await.expect("submit").task_id;
    print(store.as_ref(), first.gate(), &printed).await;
    let cancelled = first.submit(request("CANCELLED", "two")).await.expect("submit").task_id;
    act(ManualAction::Cancel, &cancelled, None).await.expect("cancel");
    let moved = first.submit(request("MOVED", "three")).await.expect("submit").task_id;
    let successor =
        act(ManualAction::Transfer, &moved, Some("p2")).await.expect("transfer").created.expect("successor");
    print(store.as_ref(), first.gate(), &successor.task_id).await;
    let open = first.submit(request("OPEN", "four")).await.expect("submit").task_id;
    let day = onceprint_engine::tz::parse("Asia/Shanghai").expect("zone").local_date(now_ms());
    let before = reconcile(store.as_ref(), "acme", "s1", &day, None).await.expect("report");
    assert_eq!((before.counts.submitted, before.counts.printed, before.counts.open), (4, 2, 1), "{before:?}");

    // A replay before any pruning is answered from the gate, not pruned.
    let replay = first.submit(request("PRINTED", "one")).await.expect("replay");
    assert!(replay.from_gate);
    assert_eq!(duplicate(&replay), (SubmitKind::Duplicate, printed.as_str(), TaskState::Printed, false));

    let clock = Arc::new(ManualClock::new(now_ms() + 89 * DAY));
    let config = RetentionConfig { days: 90, batch_size: 2, ..RetentionConfig::default() };
    let job = Retention::new(store.clone(), first.gate().clone(), clock.clone() as Arc<dyn Clock>, config);
    let young = job.run_once(&|| false).await.expect("run");
    assert_eq!(young.tasks, 0, "nothing is 90 days old yet: {young:?}");
    assert!(store.get_task("acme", &printed).await.expect("read").is_some());

    clock.set(now_ms() + 91 * DAY);
    let run = job.run_once(&|| false).await.expect("run");
    assert_eq!(run.tasks, 4, "printed, cancelled, transferred and its printed successor: {run:?}");
    assert!(run.batches >= 2, "in batches of two: {run:?}");
    assert!(run.events >= 8, "their audit events went with them: {run:?}");
    assert_eq!(job.totals().tasks, 4);
    assert_eq!(job.totals().runs, 2);
    for id in [&printed, &cancelled, &moved, &successor.task_id] {
        assert_eq!(store.get_task("acme", id).await.expect("read"), None, "{id} pruned");
        assert!(store.get_tombstone("acme", id).await.expect("read").is_some(), "{id} has its tombstone");
        assert_eq!(store.task_content(id).await.expect("read"), None, "the content of {id} is gone");
    }
    let tombstone = store.get_tombstone("acme", &printed).await.expect("read").expect("tombstone");
    assert_eq!(tombstone.business_day, day, "the day in the store's zone");
    assert!(store.get_task("acme", &open).await.expect("read").is_some(), "an open task is never pruned");
    assert_eq!(job.run_once(&|| false).await.expect("run").tasks, 0, "a second run finds nothing");

    // The day's report is the same.
    let after = reconcile(store.as_ref(), "acme", "s1", &day, None).await.expect("report");
    assert_eq!(after, before);

    // This process's gate knew the printed task: it now says pruned.
    let replay = first.submit(request("PRINTED", "one")).await.expect("replay");
    assert!(replay.from_gate);
    assert_eq!(duplicate(&replay), (SubmitKind::Duplicate, printed.as_str(), TaskState::Printed, true));

    // A broker that never saw these tasks (a fresh gate) answers from the tombstones.
    let restarted = intake(&store);
    let replay = restarted.submit(request("PRINTED", "one")).await.expect("replay");
    assert!(!replay.from_gate);
    assert_eq!(duplicate(&replay), (SubmitKind::Duplicate, printed.as_str(), TaskState::Printed, true));
    let replay = restarted.submit(request("CANCELLED", "two")).await.expect("replay");
    assert_eq!(duplicate(&replay), (SubmitKind::Duplicate, cancelled.as_str(), TaskState::Cancelled, true));
    // A transferred task answers with the task that carried its work, pruned as well.
    let replay = restarted.submit(request("MOVED", "three")).await.expect("replay");
    assert_eq!(duplicate(&replay), (SubmitKind::Duplicate, successor.task_id.as_str(), TaskState::Printed, true));
    let replay = restarted.submit(request("OPEN", "four")).await.expect("replay");
    assert_eq!(duplicate(&replay), (SubmitKind::Duplicate, open.as_str(), TaskState::Pending, false));
    // Different content under a pruned key is still the client's bug.
    match restarted.submit(request("PRINTED", "not one")).await {
        Err(IntakeError::Mismatch { task_id }) => assert_eq!(task_id, printed),
        other => panic!("expected a mismatch, got {other:?}"),
    }
    // A disabled printer still answers retries of its pruned tasks.
    store
        .set_printer_enabled(PrinterEnabled {
            tenant_id: "acme".into(),
            id: "p1".into(),
            enabled: false,
            now: now_ms(),
            audit: SetupAudit::default(),
        })
        .await
        .expect("disable");
    let replay = intake(&store).submit(request("PRINTED", "one")).await.expect("replay");
    assert_eq!(duplicate(&replay), (SubmitKind::Duplicate, printed.as_str(), TaskState::Printed, true));

    // No replay created a task or a charge: the report is still the same.
    let again = reconcile(store.as_ref(), "acme", "s1", &day, None).await.expect("report");
    assert_eq!(again, before);
    let charges = store.ledger_entries(&printed).await.expect("ledger");
    assert_eq!(charges.iter().map(|e| e.kind.as_str()).collect::<Vec<_>>(), vec!["charge"]);
    drop(h);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_keeps_replays_reports_and_the_ledger_sqlite() {
    let Some(h) = onceprint_store_sqlite::testing::fresh_store().await else { return };
    retention_keeps_what_matters(h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_keeps_replays_reports_and_the_ledger_postgres() {
    let Some(h) = onceprint_store_postgres::testing::fresh_store().await else { return };
    retention_keeps_what_matters(h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_off_keeps_everything() {
    let Some(h) = onceprint_store_sqlite::testing::fresh_store().await else { return };
    let store = h.store.clone();
    setup(store.as_ref()).await;
    let first = intake(&store);
    let id = first.submit(request("A", "a")).await.expect("submit").task_id;
    print(store.as_ref(), first.gate(), &id).await;
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(now_ms() + 10_000 * DAY));
    let gate = Arc::new(RecentTasks::new(10));
    let job = Retention::new(store.clone(), gate, clock, RetentionConfig { days: 0, ..RetentionConfig::default() });
    assert_eq!(job.run_once(&|| false).await.expect("run").tasks, 0);
    assert!(
        job.spawn(Arc::new(StoreSignals::default()), onceprint_engine::Lease::always("retention")).is_none(),
        "no job runs with retention off"
    );
    assert!(store.get_task("acme", &id).await.expect("read").is_some());
    drop(h);
}
