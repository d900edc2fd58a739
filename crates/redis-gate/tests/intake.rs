//! Intake with the shared gate on a real Redis and a real PostgreSQL: several `Intake`s on
//! one store stand for several broker nodes (each with its own in-process gate and group
//! committer), sharing one Redis. What the shared gate answers is checked against the
//! database: current state, mismatches, pruned tasks, a gate that names a task this
//! database does not have, and Redis gone.

use std::sync::Arc;
use std::time::Duration;

use onceprint_core::manual::ManualAction;
use onceprint_core::{Content, TaskState};
use onceprint_engine::clock::{now_ms, Clock, ManualClock};
use onceprint_engine::{
    ActionRequest, Actor, Directory, Intake, IntakeConfig, IntakeError, Operations, OperationsConfig, Retention,
    RetentionConfig, Shared, SharedGate, SharedGateConfig, StoreSignals, SubmitKind, SubmitRequest,
};
use onceprint_redis_gate::testing::RedisServer;
use onceprint_redis_gate::{RedisGate, RedisGateSettings};
use onceprint_store::{NewPrinter, NewStore, NewTenant, SetupAudit, Store};

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
        timezone: "UTC".into(),
        now,
        audit: SetupAudit::default(),
    })
    .await
    .expect("store");
    s.create_printer(NewPrinter {
        tenant_id: "acme".into(),
        id: "p1".into(),
        store_id: "s1".into(),
        name: "p1".into(),
        transport: r#"{"kind":"agent","address":"tcp://127.0.0.1:9100"}"#.into(),
        credential: None,
        now,
        audit: SetupAudit::default(),
    })
    .await
    .expect("printer");
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

fn redis_gate(server: &RedisServer) -> RedisGate {
    let mut s = RedisGateSettings::new(&server.url());
    s.prefix = "intake-test:".into();
    RedisGate::new(s).expect("settings")
}

/// A broker node: its own intake (own in-process gate) on the shared store and Redis.
fn node(store: &Arc<dyn Store>, server: &RedisServer) -> Intake {
    let directory = Arc::new(Directory::new(store.clone()));
    Intake::start(store.clone(), directory, Arc::new(StoreSignals::default()), IntakeConfig::default())
        .with_shared_gate(
            Arc::new(redis_gate(server)),
            // Generous bounds: this test is about what is answered, not how fast.
            SharedGateConfig { timeout: Duration::from_secs(2), backoff: Duration::from_millis(200) },
        )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_gate_answers_only_what_the_database_holds() {
    let Some(h) = onceprint_store_postgres::testing::fresh_store().await else { return };
    let Some(mut server) = RedisServer::start() else { return };
    let store = h.store.clone();
    setup(store.as_ref()).await;

    // Node A commits; node B answers the retry from the shared gate; other content is a
    // mismatch there too.
    let a = node(&store, &server);
    let created = a.submit(request("A1", "one")).await.expect("submit");
    assert_eq!((created.kind, created.from_shared_gate), (SubmitKind::Created, false));
    let b = node(&store, &server);
    let dup = b.submit(request("A1", "one")).await.expect("duplicate");
    assert!(dup.from_shared_gate && !dup.from_gate, "{dup:?}");
    assert_eq!(
        (dup.kind, dup.task_id.as_str(), dup.state),
        (SubmitKind::Duplicate, created.task_id.as_str(), TaskState::Pending)
    );
    match node(&store, &server).submit(request("A1", "other")).await {
        Err(IntakeError::Mismatch { task_id }) => assert_eq!(task_id, created.task_id),
        other => panic!("expected a mismatch, got {other:?}"),
    }
    assert_eq!(b.shared_gate().map(|g| g.stats().answers), Some(1));

    // The state is read by task id: after node A cancels it, a node that never saw the
    // task answers `cancelled`.
    let operations = Operations::new(
        Shared {
            store: store.clone(),
            directory: Arc::new(Directory::new(store.clone())),
            gate: a.gate().clone(),
            signals: Arc::new(StoreSignals::default()),
            policies: a.policies().clone(),
        },
        OperationsConfig { charge: 1 },
    );
    operations
        .act(
            ManualAction::Cancel,
            ActionRequest {
                tenant_id: "acme".into(),
                task_id: created.task_id.clone(),
                actor: Actor::ApiKey { key_id: "key-acme".into(), name: Some("Ann".into()) },
                reason: "test".into(),
                printer_id: None,
            },
        )
        .await
        .expect("cancel");
    // Node B remembered the task in its own gate when it answered the retry; that answer
    // is not stale either: with several nodes a gate hit not in an end state is read again.
    let from_b = b.submit(request("A1", "one")).await.expect("duplicate");
    assert!(from_b.from_gate, "{from_b:?}");
    assert_eq!((from_b.task_id.as_str(), from_b.state), (created.task_id.as_str(), TaskState::Cancelled));
    let c = node(&store, &server);
    let late = c.submit(request("A1", "one")).await.expect("duplicate");
    assert!(late.from_shared_gate);
    assert_eq!(
        (late.task_id.as_str(), late.state, late.pruned),
        (created.task_id.as_str(), TaskState::Cancelled, false)
    );

    // Pruned by retention: a node that never saw it answers from the tombstone, through
    // the shared gate.
    let clock = Arc::new(ManualClock::new(now_ms() + 91 * DAY));
    let job = Retention::new(
        store.clone(),
        a.gate().clone(),
        clock as Arc<dyn Clock>,
        RetentionConfig { days: 90, ..RetentionConfig::default() },
    );
    assert_eq!(job.run_once(&|| false).await.expect("retention").tasks, 1);
    let d = node(&store, &server);
    let pruned = d.submit(request("A1", "one")).await.expect("duplicate");
    assert!(pruned.from_shared_gate);
    assert_eq!(
        (pruned.task_id.as_str(), pruned.state, pruned.pruned),
        (created.task_id.as_str(), TaskState::Cancelled, true)
    );

    // A gate entry naming a task this database does not have (a Redis left over from
    // another database) is not believed: the submission creates its task, and the gate
    // then holds the real one.
    let raw = redis_gate(&server);
    let stale_key =
        onceprint_core::IdempotencyKey::new("acme", &onceprint_core::Target::Printer("p1".into()), "S1", "receipt");
    raw.remember(&stale_key, "01NOSUCHTASK0000000000000", "f").await.expect("remember");
    let fresh = node(&store, &server).submit(request("S1", "stale")).await.expect("submit");
    assert_eq!((fresh.kind, fresh.from_shared_gate), (SubmitKind::Created, false));
    let now_known = node(&store, &server).submit(request("S1", "stale")).await.expect("duplicate");
    assert!(now_known.from_shared_gate);
    assert_eq!(now_known.task_id, fresh.task_id);

    // Redis gone: intake goes on, the database judges duplicates.
    server.kill();
    let e = node(&store, &server);
    let made = e.submit(request("K1", "down")).await.expect("submit while Redis is down");
    assert_eq!(made.kind, SubmitKind::Created);
    let f = node(&store, &server);
    let again = f.submit(request("K1", "down")).await.expect("duplicate while Redis is down");
    assert_eq!(
        (again.kind, again.task_id.as_str(), again.from_shared_gate),
        (SubmitKind::Duplicate, made.task_id.as_str(), false)
    );
    let stats = f.shared_gate().map(|g| g.stats()).expect("stats");
    assert!(!stats.up && stats.bypassed >= 1, "{stats:?}");
    drop(h);
}
