//! Several nodes on one database, through the engine's own services on a real
//! store (SQLite, and PostgreSQL when `ONCEPRINT_TEST_POSTGRES` names a server), with the
//! nodes' clock moved by hand: the lease keeper of two nodes, and two agent registries
//! that share what they heard.

use std::sync::Arc;

use onceprint_core::lane::Holder;
use onceprint_core::{PolicyTable, TaskState};
use onceprint_engine::clock::ManualClock;
use onceprint_engine::gate::RecentTasks;
use onceprint_engine::{
    AgentRegistry, AgentTransport, DeliveryConfig, Directory, Intake, IntakeConfig, LaneEngine, LeaseConfig, Leases,
    RegistryConfig, Shared, StoreSignals, SubmitRequest,
};
use onceprint_store::testing::Harness;

const START: i64 = 1_764_000_000_000;
const CONFIG: LeaseConfig = LeaseConfig { renew_every_ms: 1_000, ttl_ms: 5_000 };

async fn one_node_holds_a_lease_and_another_takes_it_once_it_ran_out(h: Harness) {
    let clock = Arc::new(ManualClock::new(START));
    let a = Leases::new(h.store.clone(), clock.clone(), "node-a".into(), CONFIG);
    let b = Leases::new(h.store.clone(), clock.clone(), "node-b".into(), CONFIG);
    let (la, lb) = (a.lease("sweeper"), b.lease("sweeper"));
    assert!(!la.is_held(), "not held before the keeper won it");
    a.renew_once().await;
    b.renew_once().await;
    assert!(la.is_held() && !lb.is_held(), "one node at a time");
    let first = la.token().expect("token");

    // Renewals keep it with node a, with the same token.
    clock.advance(1_000);
    a.renew_once().await;
    b.renew_once().await;
    assert_eq!((la.token(), lb.is_held()), (Some(first), false));

    // Node a stops renewing (it hangs, or died): by its own clock it steps down when the
    // lease runs out, and only then can node b take it, with a higher token.
    clock.advance(4_999);
    assert!(la.is_held());
    b.renew_once().await;
    assert!(!lb.is_held(), "not before the lease ran out");
    clock.advance(1);
    assert!(!la.is_held(), "node a stepped down by its own clock");
    b.renew_once().await;
    let second = lb.token().expect("node b took over");
    assert!(second > first, "{first} then {second}");
    a.renew_once().await;
    assert!(!la.is_held(), "the stale holder's renewal fails");

    // A node that stops releases its leases: the other takes them at once.
    b.release_all().await;
    assert!(!lb.is_held());
    a.renew_once().await;
    assert!(la.token().expect("released lease") > second);
}

fn registry(clock: &Arc<ManualClock>) -> Arc<AgentRegistry> {
    let r = AgentRegistry::new(
        clock.clone(),
        RegistryConfig { gone_after_ms: 10_000, takeover_quiet_ms: 3_000, remote_lag_ms: 2_000 },
    );
    r.expect_sync();
    r
}

async fn an_agent_heard_on_one_node_is_live_on_the_other(h: Harness) {
    let clock = Arc::new(ManualClock::new(START));
    let (a, b) = (registry(&clock), registry(&clock));
    let s = h.store.as_ref();
    let session = onceprint_core::ids::agent_session_id(START, 1);
    let other = onceprint_core::ids::agent_session_id(START, 2);
    drop(a.begin_poll("t", "s1", "agent-1", Some(&session), None).expect("poll"));
    // Node b also serves another agent of the store, so agent-1 could be replaced.
    let _b_poll = b.begin_poll("t", "s1", "agent-2", Some(&other), None).expect("poll");
    clock.advance(11_000);
    // Before its first sync node b calls nobody gone, whatever its uptime.
    assert_eq!(b.holder("t", "s1", "agent-1", Some(&session), None), Holder::Other { gone: false });
    // Agent-1 keeps polling node a; both nodes sync every second.
    for _ in 0..20 {
        drop(a.begin_poll("t", "s1", "agent-1", Some(&session), None).expect("poll"));
        a.sync_once(s, "node-a").await.expect("sync a");
        b.sync_once(s, "node-b").await.expect("sync b");
        assert_eq!(
            b.holder("t", "s1", "agent-1", Some(&session), None),
            Holder::Other { gone: false },
            "heard on node a, so live on node b"
        );
        clock.advance(1_000);
    }
    // Agent-1 stops: node b calls it gone only after "gone" and the sync lag.
    let stopped = START + 11_000 + 19_000;
    loop {
        a.sync_once(s, "node-a").await.expect("sync a");
        b.sync_once(s, "node-b").await.expect("sync b");
        let gone = b.holder("t", "s1", "agent-1", Some(&session), None) == (Holder::Other { gone: true });
        let silent = clock_now(&clock) - stopped;
        if gone {
            assert!(silent > 10_000 + 2_000, "gone after {silent} ms, before gone_after + lag");
            break;
        }
        assert!(silent <= 10_000 + 2_000 + 1_000, "still not gone after {silent} ms");
        clock.advance(500);
    }
    // A sync that keeps failing makes the picture stale: nobody is called gone then.
    clock.advance(2_001);
    assert_eq!(b.holder("t", "s1", "agent-1", Some(&session), None), Holder::Other { gone: false });
}

fn clock_now(clock: &ManualClock) -> i64 {
    use onceprint_engine::clock::Clock;
    clock.now_ms()
}

async fn a_newer_session_on_one_node_supersedes_the_older_on_the_other(h: Harness) {
    let clock = Arc::new(ManualClock::new(START));
    let (a, b) = (registry(&clock), registry(&clock));
    let s = h.store.as_ref();
    let old = onceprint_core::ids::agent_session_id(START - 60_000, 1);
    let new = onceprint_core::ids::agent_session_id(START, 2);
    drop(a.begin_poll("t", "s1", "agent-1", Some(&old), None).expect("old polls node a"));
    drop(b.begin_poll("t", "s1", "agent-1", Some(&new), None).expect("new polls node b"));
    assert!(a.begin_poll("t", "s1", "agent-1", Some(&old), None).is_ok(), "node a has not heard of it yet");
    b.sync_once(s, "node-b").await.expect("sync b");
    a.sync_once(s, "node-a").await.expect("sync a");
    let e = a.begin_poll("t", "s1", "agent-1", Some(&old), None).err().expect("superseded on node a too");
    assert_eq!(e.newer, new);
    assert!(a.begin_poll("t", "s1", "agent-1", Some(&new), None).is_ok(), "the newer session is served on node a");
}

/// One broker node of several: its lane engine and agent transport, with a registry that
/// allows for the sync's lag.
fn node(h: &Harness, clock: &Arc<ManualClock>) -> (Arc<LaneEngine>, AgentTransport) {
    let directory = Arc::new(Directory::new(h.store.clone()));
    let shared = Shared {
        store: h.store.clone(),
        directory,
        gate: Arc::new(RecentTasks::new(1_000)),
        signals: Arc::new(StoreSignals::default()),
        policies: PolicyTable::default(),
    };
    let config = DeliveryConfig { agent_gone_after_ms: 10_000, ..DeliveryConfig::default() };
    let lanes = Arc::new(LaneEngine::new(shared, config, clock.clone(), registry(clock)));
    (lanes.clone(), AgentTransport::new(lanes))
}

async fn set_up_store(h: &Harness) {
    let audit = || onceprint_store::SetupAudit::default();
    h.store
        .create_tenant(onceprint_store::NewTenant {
            id: "t".into(),
            name: "Shop".into(),
            api_key_hash: "unused".into(),
            api_key_id: "key-t".into(),
            now: START,
            audit: audit(),
        })
        .await
        .expect("tenant");
    h.store
        .create_store(onceprint_store::NewStore {
            tenant_id: "t".into(),
            id: "s1".into(),
            name: "Main".into(),
            timezone: "UTC".into(),
            now: START,
            audit: audit(),
        })
        .await
        .expect("store");
    h.store
        .create_printer(onceprint_store::NewPrinter {
            tenant_id: "t".into(),
            id: "kitchen".into(),
            store_id: "s1".into(),
            name: "Kitchen".into(),
            transport: r#"{"kind":"agent","address":"tcp://127.0.0.1:9100"}"#.into(),
            credential: None,
            now: START,
            audit: audit(),
        })
        .await
        .expect("printer");
}

async fn poll(
    agents: &AgentTransport,
    who: &onceprint_store::AgentIdentity,
    id: &str,
    session: &str,
) -> Vec<onceprint_engine::AgentDelivery> {
    agents.poll(who, id, Some(session), Some(0), std::time::Duration::ZERO, 16).await.expect("poll")
}

/// A node that has been up for long hands a ticket to an agent it has not heard of
/// before (a new agent, or one back after an outage) while another node has not yet
/// learned of that agent from the sync: the other node must not take the delivery from
/// it (a ticket that may be printing would go to a person with nothing wrong).
async fn a_delivery_another_node_just_handed_out_stays_with_its_agent(h: Harness) {
    use onceprint_store::AgentIdentity;
    let clock = Arc::new(ManualClock::new(START));
    set_up_store(&h).await;
    let (lanes_a, agents_a) = node(&h, &clock);
    let (lanes_b, agents_b) = node(&h, &clock);
    let s = h.store.as_ref();
    let who = AgentIdentity { tenant_id: "t".into(), store_id: "s1".into() };
    let (one, two) = (onceprint_core::ids::agent_session_id(START, 1), onceprint_core::ids::agent_session_id(START, 2));
    // Both nodes have been up and syncing for long; agent-1 polls node a.
    clock.advance(60_000);
    assert!(poll(&agents_a, &who, "agent-1", &one).await.is_empty());
    lanes_a.agents().sync_once(s, "node-a").await.expect("sync a");
    lanes_b.agents().sync_once(s, "node-b").await.expect("sync b");
    // A ticket; agent-2, heard by no node so far, polls node b and takes it.
    let intake = Intake::start(
        h.store.clone(),
        lanes_a.directory().clone(),
        Arc::new(StoreSignals::default()),
        IntakeConfig::default(),
    )
    .with_clock(clock.clone());
    let answer = intake
        .submit(SubmitRequest {
            tenant_id: "t".into(),
            biz_no: Some("A1".into()),
            printer_id: Some("kitchen".into()),
            print_type: Some("receipt".into()),
            content: Some(onceprint_core::content::Content::Text { text: "1 x Noodles\n".into() }),
            ..SubmitRequest::default()
        })
        .await
        .expect("submitted");
    let got = poll(&agents_b, &who, "agent-2", &two).await;
    assert_eq!(got.len(), 1, "agent-2 took the ticket on node b");
    // Agent-1 polls node a before the next sync: the ticket stays with agent-2.
    assert!(poll(&agents_a, &who, "agent-1", &one).await.is_empty());
    lanes_a.sweep_once().await.expect("sweep on node a");
    let task = s.get_task("t", &answer.task_id).await.expect("read").expect("task");
    assert_eq!(task.state, TaskState::Sent, "{:?}", task.last_error);
    assert_eq!(task.sent_to.as_deref(), Some("agent:agent-2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_hand_out_on_another_node_sqlite() {
    let Some(h) = onceprint_store_sqlite::testing::fresh_store().await else { return };
    a_delivery_another_node_just_handed_out_stays_with_its_agent(h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_hand_out_on_another_node_postgres() {
    let Some(h) = onceprint_store_postgres::testing::fresh_store().await else { return };
    a_delivery_another_node_just_handed_out_stays_with_its_agent(h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_sqlite() {
    let Some(h) = onceprint_store_sqlite::testing::fresh_store().await else { return };
    one_node_holds_a_lease_and_another_takes_it_once_it_ran_out(h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_postgres() {
    let Some(h) = onceprint_store_postgres::testing::fresh_store().await else { return };
    one_node_holds_a_lease_and_another_takes_it_once_it_ran_out(h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_agents_postgres() {
    let Some(h) = onceprint_store_postgres::testing::fresh_store().await else { return };
    an_agent_heard_on_one_node_is_live_on_the_other(h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_agents_sqlite() {
    let Some(h) = onceprint_store_sqlite::testing::fresh_store().await else { return };
    an_agent_heard_on_one_node_is_live_on_the_other(h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn superseding_across_nodes_postgres() {
    let Some(h) = onceprint_store_postgres::testing::fresh_store().await else { return };
    a_newer_session_on_one_node_supersedes_the_older_on_the_other(h).await;
}
