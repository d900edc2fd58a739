//! The shared gate against a real `redis-server` started on a free port: claims,
//! remembered tasks, prefixes, expiry of a dead node's claim, and a Redis killed with
//! SIGKILL and started again (through the engine's guard, as intake uses it).

use std::sync::Arc;
use std::time::Duration;

use onceprint_core::{IdempotencyKey, Target};
use onceprint_engine::{GuardedSharedGate, SharedEntry, SharedGate, SharedGateConfig};
use onceprint_redis_gate::testing::RedisServer;
use onceprint_redis_gate::{RedisGate, RedisGateSettings};

fn key(biz_no: &str) -> IdempotencyKey {
    IdempotencyKey::new("t1", &Target::Printer("p1".into()), biz_no, "receipt")
}

fn gate(server: &RedisServer, prefix: &str, claim_ttl: Duration) -> RedisGate {
    let mut s = RedisGateSettings::new(&server.url());
    s.prefix = prefix.to_owned();
    s.claim_ttl = claim_ttl;
    // Generous: these tests are about what the gate says, not how fast (and CI is slow).
    s.timeout = Duration::from_secs(2);
    RedisGate::new(s).expect("settings")
}

/// One call, never longer than a few seconds (a hang fails the test instead of stalling it).
async fn bounded<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), f).await.expect("the call came back")
}

#[tokio::test]
async fn first_sighting_is_claimed_then_the_remembered_task_is_answered() {
    let Some(server) = RedisServer::start() else { return };
    let g = gate(&server, "t1:", Duration::from_secs(30));
    let k = key("A1");
    assert_eq!(bounded(g.claim(&k)).await.expect("claim"), SharedEntry::Claimed);
    assert_eq!(bounded(g.claim(&k)).await.expect("claim"), SharedEntry::ClaimedElsewhere, "a claim has no task yet");
    bounded(g.remember(&k, "01TASK", "f00d")).await.expect("remember");
    assert_eq!(
        bounded(g.claim(&k)).await.expect("claim"),
        SharedEntry::Known { task_id: "01TASK".into(), fingerprint: "f00d".into() }
    );
    // Another key, and the same key under another prefix (another cluster), are untouched.
    assert_eq!(bounded(g.claim(&key("A2"))).await.expect("claim"), SharedEntry::Claimed);
    let other = gate(&server, "t2:", Duration::from_secs(30));
    assert_eq!(bounded(other.claim(&k)).await.expect("claim"), SharedEntry::Claimed);
}

#[tokio::test]
async fn a_claim_left_by_a_dead_node_expires() {
    let Some(server) = RedisServer::start() else { return };
    let g = gate(&server, "exp:", Duration::from_secs(1));
    let k = key("B1");
    assert_eq!(bounded(g.claim(&k)).await.expect("claim"), SharedEntry::Claimed);
    // The claiming node "dies" here: it never remembers a task. Once the claim's time is
    // up the next sighting claims the key afresh.
    let mut reclaimed = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if bounded(g.claim(&k)).await.expect("claim") == SharedEntry::Claimed {
            reclaimed = true;
            break;
        }
    }
    assert!(reclaimed, "the claim expired");
}

#[tokio::test]
async fn a_killed_redis_is_bypassed_and_used_again_once_it_is_back() {
    let Some(mut server) = RedisServer::start() else { return };
    let inner: Arc<dyn SharedGate> = Arc::new(gate(&server, "kill:", Duration::from_secs(30)));
    let guarded = GuardedSharedGate::new(
        inner,
        SharedGateConfig { timeout: Duration::from_millis(500), backoff: Duration::from_millis(100) },
    );
    let k = key("C1");
    assert_eq!(bounded(guarded.claim(&k)).await, Some(SharedEntry::Claimed));
    bounded(guarded.remember(&k, "01C1", "ab")).await;

    server.kill();
    // Every call comes back (bounded by the guard), answering nothing while Redis is gone.
    for _ in 0..5 {
        assert_eq!(bounded(guarded.claim(&k)).await, None);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let down = guarded.stats();
    assert!(!down.up && down.failures >= 1 && down.bypassed >= 5, "{down:?}");

    // Redis comes back empty (no persistence): the gate is used again.
    server.restart();
    let mut back = None;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Some(e) = bounded(guarded.claim(&key("C2"))).await {
            back = Some(e);
            break;
        }
    }
    assert_eq!(back, Some(SharedEntry::Claimed), "the gate was used again after the restart");
    assert!(guarded.stats().up);
}

#[tokio::test]
async fn redis_down_at_start_delays_nothing_and_is_used_once_it_comes_up() {
    let Some(mut server) = RedisServer::start() else { return };
    server.kill();
    let g = gate(&server, "late:", Duration::from_secs(30));
    assert!(bounded(g.claim(&key("D1"))).await.is_err(), "nothing listens yet");
    server.restart();
    let mut ok = false;
    for _ in 0..100 {
        if bounded(g.claim(&key("D1"))).await.is_ok() {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ok, "the gate connected once Redis was up");
}
