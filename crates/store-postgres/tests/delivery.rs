//! Delivery on PostgreSQL: the one-in-flight-per-printer rule against concurrent
//! transactions, and batches of transitions that go on after a refused change.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{events, fresh_store, raw, send, task_on, tenant};
use onceprint_core::TaskState;
use onceprint_store::conformance::NOW;
use onceprint_store::{NewTask, Store, Transition};

fn printed(t: &NewTask) -> Transition {
    Transition {
        from: TaskState::Sent,
        expected_attempts: 1,
        to: TaskState::Printed,
        next_attempt_at: None,
        reason: "printed".into(),
        now: NOW + 2,
        ..send(t, "agent")
    }
}

async fn state(s: &dyn Store, t: &NewTask) -> TaskState {
    s.get_task("acme", &t.task_id).await.unwrap().unwrap().state
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_waits_for_the_other_transaction_and_then_decides() {
    let h = fresh_store!();
    let s = h.store.clone();
    tenant(s.as_ref(), "acme").await;
    let (a, b) = (task_on("p1", "A", 1), task_on("p1", "B", 2));
    let (c, d) = (task_on("p2", "C", 3), task_on("p2", "D", 4));
    s.submit_batch(vec![a.clone(), b.clone(), c.clone(), d.clone()]).await.unwrap();

    // Another transaction has put A in flight and not committed yet: sending B must wait
    // for it, and once it commits, B is refused.
    let mut other = raw(&h.url).await;
    let tx = other.transaction().await.unwrap();
    tx.execute("UPDATE tasks SET state = 'sent', attempts = 1 WHERE id = $1", &[&a.task_id]).await.unwrap();
    let waiting = tokio::spawn({
        let (s, b) = (s.clone(), send(&b, "agent-2"));
        async move { s.transition(&b).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "the send must wait for the uncommitted one");
    tx.commit().await.unwrap();
    assert!(!waiting.await.unwrap().unwrap(), "the first in flight wins");
    assert_eq!(state(s.as_ref(), &b).await, TaskState::Pending);
    assert_eq!(events(s.as_ref(), &b).await, 1, "a refused change writes no event");

    // The same in a batch, where the other transaction rolls back: D goes through, and the
    // change after it in the batch too.
    let tx = other.transaction().await.unwrap();
    tx.execute("UPDATE tasks SET state = 'sent', attempts = 1 WHERE id = $1", &[&c.task_id]).await.unwrap();
    let waiting = tokio::spawn({
        let (s, changes) = (s.clone(), vec![send(&d, "agent-2"), printed(&d)]);
        async move { s.apply_transitions(&changes).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "the batch must wait for the uncommitted one");
    tx.rollback().await.unwrap();
    assert_eq!(waiting.await.unwrap().unwrap(), vec![true, true]);
    assert_eq!(state(s.as_ref(), &c).await, TaskState::Pending);
    assert_eq!(state(s.as_ref(), &d).await, TaskState::Printed);
    drop(other);
    drop(h);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_sends_to_one_printer_never_both_succeed() {
    let h = fresh_store!();
    let s: Arc<dyn Store> = h.store.clone();
    tenant(s.as_ref(), "acme").await;
    let mut gate = raw(&h.url).await;
    for round in 0..20u64 {
        let a = task_on("p1", &format!("A{round}"), 10 * round + 1);
        let b = task_on("p1", &format!("B{round}"), 10 * round + 2);
        s.submit_batch(vec![a.clone(), b.clone()]).await.unwrap();

        // Both rows are locked while the two sends start, so that they are surely running
        // at the same time when the lock goes; then they race for the printer.
        let tx = gate.transaction().await.unwrap();
        tx.query("SELECT 1 FROM tasks WHERE id = ANY($1) FOR UPDATE", &[&vec![&a.task_id, &b.task_id]]).await.unwrap();
        // One as a single transition, one as a batch, alternating which goes first.
        let (first, second) = if round % 2 == 0 { (&a, &b) } else { (&b, &a) };
        let single = tokio::spawn({
            let (s, change) = (s.clone(), send(first, "agent-1"));
            async move { s.transition(&change).await }
        });
        let batch = tokio::spawn({
            let (s, change) = (s.clone(), send(second, "agent-2"));
            async move { s.apply_transitions(&[change]).await }
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
        tx.commit().await.unwrap();
        let single = single.await.unwrap().unwrap();
        let batch = batch.await.unwrap().unwrap();
        assert_eq!(batch.len(), 1);
        assert!(single != batch[0], "round {round}: exactly one send succeeds ({single}, {batch:?})");

        let (winner, loser) = if single { (first, second) } else { (second, first) };
        assert_eq!(state(s.as_ref(), winner).await, TaskState::Sent);
        assert_eq!(state(s.as_ref(), loser).await, TaskState::Pending);
        assert_eq!(events(s.as_ref(), winner).await, 2);
        assert_eq!(events(s.as_ref(), loser).await, 1);
        let in_flight = gate
            .query_one("SELECT count(*) FROM tasks WHERE printer_id = 'p1' AND state = 'sent'", &[])
            .await
            .unwrap()
            .get::<_, i64>(0);
        assert_eq!(in_flight, 1);
        // Free the printer for the next round; the loser stays pending behind.
        assert!(s.transition(&printed(winner)).await.unwrap());
        assert!(s.transition(&Transition { to: TaskState::Cancelled, ..send(loser, "x") }).await.unwrap());
    }
    drop(gate);
    drop(h);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_goes_on_after_refused_changes() {
    let h = fresh_store!();
    let s = h.store.clone();
    tenant(s.as_ref(), "acme").await;
    let (a, b, c) = (task_on("p1", "A", 1), task_on("p1", "B", 2), task_on("p1", "C", 3));
    let d = task_on("p2", "D", 4);
    s.submit_batch(vec![a.clone(), b.clone(), c.clone(), d.clone()]).await.unwrap();

    let stale = Transition { expected_attempts: 5, ..send(&c, "agent-1") };
    let changes = vec![
        send(&a, "agent-1"), // applies
        send(&b, "agent-1"), // refused: A is in flight on p1
        stale,               // loses its compare-and-set
        send(&d, "agent-1"), // applies: another printer
        printed(&a),         // applies, freeing p1
        send(&c, "agent-1"), // applies now
        send(&b, "agent-1"), // refused again: C is in flight
        printed(&d),         // applies
        printed(&b),         // loses its compare-and-set: B never left pending
    ];
    let results = s.apply_transitions(&changes).await.unwrap();
    assert_eq!(results, vec![true, false, false, true, true, true, false, true, false]);

    assert_eq!(state(s.as_ref(), &a).await, TaskState::Printed);
    assert_eq!(state(s.as_ref(), &b).await, TaskState::Pending);
    assert_eq!(state(s.as_ref(), &c).await, TaskState::Sent);
    assert_eq!(state(s.as_ref(), &d).await, TaskState::Printed);
    assert_eq!([events(s.as_ref(), &a).await, events(s.as_ref(), &b).await, events(s.as_ref(), &c).await], [3, 1, 2]);
    let c_row = s.get_task("acme", &c.task_id).await.unwrap().unwrap();
    assert_eq!((c_row.sent_to.as_deref(), c_row.sent_session.as_deref()), (Some("agent-1"), Some("agent-1-session")));
    assert_eq!(s.apply_transitions(&[]).await.unwrap(), Vec::<bool>::new());
    drop(h);
}
