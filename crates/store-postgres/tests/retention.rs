//! Retention on PostgreSQL where the shared conformance suite cannot reach: a submission
//! racing the prune of its own key. The prune is played by a plain connection that holds
//! its transaction open at the worst moment — task deleted and tombstone written, not yet
//! committed — while intake inserts the same key, whose insert then waits for the prune.

mod common;

use std::time::Duration;

use common::{fresh_store, raw, send, tenant};
use onceprint_core::TaskState;
use onceprint_store::conformance::{new_task, NOW};
use onceprint_store::{SubmitOutcome, Transition};

/// The prune's statements (`retention.rs`), left uncommitted.
const PRUNE_UNCOMMITTED: &str = "
BEGIN;
INSERT INTO task_tombstones (task_id, tenant_id, store_id, printer_id, station_id, target, biz_no, print_type,
                             priority, content_type, fingerprint, state, attempts, last_error, created_at,
                             updated_at, printed_at, origin_task_id, origin_kind, reprint_no, successor_task_id,
                             may_have_printed, business_day, pruned_at)
SELECT id, tenant_id, store_id, printer_id, station_id, target, biz_no, print_type, priority, content_type,
       fingerprint, state, attempts, last_error, created_at, updated_at, printed_at, origin_task_id, origin_kind,
       reprint_no, successor_task_id, may_have_printed, '2025-11-24', 0
FROM tasks WHERE biz_no = 'RACE';
DELETE FROM task_events WHERE task_id IN (SELECT id FROM tasks WHERE biz_no = 'RACE');
DELETE FROM tasks WHERE biz_no = 'RACE';";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_racing_the_prune_of_its_key_creates_nothing() {
    let h = fresh_store!();
    let s = h.store.clone();
    tenant(s.as_ref(), "acme").await;
    let t = new_task("acme", "RACE", "x", 1);
    s.submit_batch(vec![t.clone()]).await.unwrap();
    assert!(s.transition(&send(&t, "a1")).await.unwrap());
    let printed = Transition {
        from: TaskState::Sent,
        expected_attempts: 1,
        to: TaskState::Printed,
        now: NOW + 2,
        ..send(&t, "a1")
    };
    assert!(s.transition(&printed).await.unwrap());

    let pruner = raw(&h.url).await;
    pruner.batch_execute(PRUNE_UNCOMMITTED).await.unwrap();
    // The replay's insert meets the key of a row the prune is deleting, and waits for it.
    let replay = new_task("acme", "RACE", "x", 2);
    let submit = {
        let s = s.clone();
        let replay = replay.clone();
        tokio::spawn(async move { s.submit_batch(vec![replay]).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!submit.is_finished(), "the insert waits for the prune that holds the key");
    pruner.batch_execute("COMMIT").await.unwrap();

    let out = tokio::time::timeout(Duration::from_secs(10), submit).await.unwrap().unwrap().unwrap();
    match &out[0] {
        SubmitOutcome::Pruned(b) => {
            assert_eq!((b.task.task_id.as_str(), b.task.state), (t.task_id.as_str(), TaskState::Printed))
        }
        other => panic!("a replay racing the prune must be answered from the tombstone, got {other:?}"),
    }
    assert_eq!(s.get_task("acme", &replay.task_id).await.unwrap(), None, "no second task");
    assert!(s.ledger_entries(&replay.task_id).await.unwrap().is_empty(), "no second charge");
    let count: i64 = pruner.query_one("SELECT count(*) FROM tasks", &[]).await.unwrap().get(0);
    assert_eq!(count, 0);
    let events: i64 = pruner.query_one("SELECT count(*) FROM task_events", &[]).await.unwrap().get(0);
    assert_eq!(events, 0, "no creation event of a task that was never made");
    drop(h);
}
