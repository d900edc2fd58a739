//! Operators' actions on PostgreSQL: what one transaction undoes when a part of it fails,
//! and refunds under concurrent actions.

mod common;

use std::sync::Arc;

use common::{events, fresh_store, task_on, tenant};
use onceprint_core::TaskState;
use onceprint_store::conformance::NOW;
use onceprint_store::{ManualChange, NewTask, Origin, OriginKind, Store, StoreError, SubmitOutcome, Transition};

fn change(t: &NewTask, from: TaskState, attempts: i32, to: TaskState) -> Transition {
    Transition {
        task_id: t.task_id.clone(),
        from,
        expected_attempts: attempts,
        to,
        attempts,
        last_error: None,
        next_attempt_at: None,
        actor: "operator:alice".into(),
        reason: "by hand".into(),
        now: NOW + 10,
        sent_to: None,
        sent_session: None,
        may_have_printed: false,
        event: None,
        refused: false,
    }
}

fn successor(t: &NewTask, kind: OriginKind, printer: &str, seq: u64) -> NewTask {
    let mut s = task_on(printer, &t.biz_no, seq);
    s.target = format!("{}:{}", kind.as_str(), t.task_id);
    s.charge = 0;
    s.origin = Some(Origin { task_id: t.task_id.clone(), kind, reprint_no: None, reason: "moved".into() });
    s
}

async fn ledger_kinds(s: &dyn Store, t: &NewTask) -> Vec<String> {
    s.ledger_entries(&t.task_id).await.unwrap().into_iter().map(|e| e.kind).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_successor_undoes_the_whole_action() {
    let h = fresh_store!();
    let s = h.store.as_ref();
    tenant(s, "acme").await;
    let t = task_on("p1", "T1", 1);
    s.submit_batch(vec![t.clone()]).await.unwrap();

    // The successor's key is taken already: the cancel and the refund before it are undone.
    let mut taken = successor(&t, OriginKind::Transfer, "p2", 2);
    s.submit_batch(vec![taken.clone()]).await.unwrap();
    taken.task_id = format!("{}-again", taken.task_id);
    let action = ManualChange {
        task_id: t.task_id.clone(),
        transitions: vec![change(&t, TaskState::Pending, 0, TaskState::Transferred)],
        refund: Some(t.task_id.clone()),
        successor: Some(taken.clone()),
        now: NOW + 10,
    };
    let out = s.apply_manual(&action).await;
    assert!(matches!(&out, Err(StoreError::AlreadyExists(_))), "{out:?}");
    // Its printer does not exist: the store names it, and again nothing is written.
    let mut lost = successor(&t, OriginKind::Failover, "p9", 3);
    lost.target = format!("elsewhere:{}", t.task_id);
    let out = s.apply_manual(&ManualChange { successor: Some(lost.clone()), ..action.clone() }).await;
    assert_eq!(out, Err(StoreError::NotFound("printer p9".into())));

    let row = s.get_task("acme", &t.task_id).await.unwrap().unwrap();
    assert_eq!((row.state, row.successor_task_id), (TaskState::Pending, None));
    assert_eq!(events(s, &t).await, 1);
    assert_eq!(ledger_kinds(s, &t).await, vec!["charge"]);
    assert_eq!(s.get_task("acme", &taken.task_id).await.unwrap(), None);
    assert_eq!(s.get_task("acme", &lost.task_id).await.unwrap(), None);

    // The pool's connections are still usable afterwards, and the same action applies.
    let moved = successor(&t, OriginKind::Failover, "p2", 4);
    assert!(s.apply_manual(&ManualChange { successor: Some(moved.clone()), ..action }).await.unwrap());
    let row = s.get_task("acme", &t.task_id).await.unwrap().unwrap();
    assert_eq!((row.state, row.successor_task_id.as_deref()), (TaskState::Transferred, Some(moved.task_id.as_str())));
    assert_eq!(ledger_kinds(s, &t).await, vec!["charge", "refund"]);
    drop(h);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_action_refused_by_the_printer_lane_writes_nothing() {
    let h = fresh_store!();
    let s = h.store.as_ref();
    tenant(s, "acme").await;
    let (a, b) = (task_on("p1", "A", 1), task_on("p1", "B", 2));
    s.submit_batch(vec![a.clone(), b.clone()]).await.unwrap();
    let send = |t: &NewTask| Transition { attempts: 1, ..change(t, TaskState::Pending, 0, TaskState::Sent) };
    assert!(s.transition(&send(&a)).await.unwrap());
    // B cannot go in flight beside A; the unique index aborts the action's transaction.
    let action = ManualChange {
        task_id: b.task_id.clone(),
        transitions: vec![send(&b)],
        refund: Some(b.task_id.clone()),
        successor: None,
        now: NOW,
    };
    assert!(!s.apply_manual(&action).await.unwrap());
    assert_eq!(s.get_task("acme", &b.task_id).await.unwrap().unwrap().state, TaskState::Pending);
    assert_eq!(events(s, &b).await, 1);
    assert_eq!(ledger_kinds(s, &b).await, vec!["charge"]);
    drop(h);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_actions_refund_once() {
    let h = fresh_store!();
    let s: Arc<dyn Store> = h.store.clone();
    tenant(s.as_ref(), "acme").await;
    for round in 0..10u64 {
        let t = task_on("p1", &format!("R{round}"), round);
        s.submit_batch(vec![t.clone()]).await.unwrap();
        // Two cancels and two bare refunds at once: one cancel wins, one refund is written.
        let cancel = ManualChange {
            task_id: t.task_id.clone(),
            transitions: vec![change(&t, TaskState::Pending, 0, TaskState::Cancelled)],
            refund: Some(t.task_id.clone()),
            successor: None,
            now: NOW + 10,
        };
        let bare = ManualChange { transitions: vec![], ..cancel.clone() };
        let runs: Vec<_> = [cancel.clone(), bare.clone(), cancel, bare]
            .into_iter()
            .map(|m| {
                let s = s.clone();
                tokio::spawn(async move { (!m.transitions.is_empty(), s.apply_manual(&m).await.unwrap()) })
            })
            .collect();
        let mut cancels_won = 0;
        for r in runs {
            let (is_cancel, applied) = r.await.unwrap();
            if is_cancel {
                cancels_won += usize::from(applied);
            } else {
                assert!(applied, "a bare refund has no compare-and-set to lose");
            }
        }
        assert_eq!(cancels_won, 1, "round {round}");
        assert_eq!(ledger_kinds(s.as_ref(), &t).await, vec!["charge", "refund"], "round {round}");
        assert_eq!(events(s.as_ref(), &t).await, 2, "round {round}");
    }
    drop(h);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn created_tasks_read_back_as_returned() {
    let h = fresh_store!();
    let s = h.store.as_ref();
    tenant(s, "acme").await;
    let t = task_on("p1", "O1", 1);
    let mut reprint = successor(&t, OriginKind::Reprint, "p1", 2);
    reprint.charge = 3;
    reprint.origin.as_mut().unwrap().reprint_no = Some(2);
    // A plain submission and one with an origin, in one batch: the rows the intake
    // returns are the rows stored, origin included.
    let out = s.submit_batch(vec![t.clone(), reprint.clone()]).await.unwrap();
    for (o, n) in out.iter().zip([&t, &reprint]) {
        let SubmitOutcome::Created(created) = o else { panic!("{o:?}") };
        assert_eq!(Some(created), s.get_task("acme", &n.task_id).await.unwrap().as_ref());
    }
    let stored = out[1].task();
    assert_eq!(
        (stored.origin_task_id.as_deref(), stored.origin_kind, stored.reprint_no),
        (Some(t.task_id.as_str()), Some(OriginKind::Reprint), Some(2))
    );
    let ev = s.task_events("acme", &reprint.task_id).await.unwrap().unwrap();
    assert_eq!(ev[0].reason, "moved");
    assert_eq!(s.task_events("acme", &t.task_id).await.unwrap().unwrap()[0].reason, "submitted");
    let amounts: Vec<_> = s.ledger_entries(&reprint.task_id).await.unwrap().iter().map(|e| e.amount).collect();
    assert_eq!(amounts, vec![3]);
    assert_eq!(s.reprint_count(&t.task_id).await.unwrap(), 1);
    // A free task in a batch gets no charge; its neighbours keep theirs.
    let (mut free, paid) = (task_on("p1", "F1", 3), task_on("p1", "F2", 4));
    free.charge = 0;
    s.submit_batch(vec![free.clone(), paid.clone()]).await.unwrap();
    assert_eq!(ledger_kinds(s, &free).await, Vec::<String>::new());
    assert_eq!(ledger_kinds(s, &paid).await, vec!["charge"]);
    drop(h);
}
