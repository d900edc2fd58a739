//! Alerts on PostgreSQL: a batch or an operator's action writes exactly the alerts of the
//! changes that apply, printer reports alert once per flip (also when they race), and an
//! endpoint's history.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{fresh_store, raw, task_on, tenant};
use onceprint_core::TaskState;
use onceprint_store::conformance::NOW;
use onceprint_store::{
    ManualChange, NewTask, NewWebhook, OutboxEvent, PrinterStatusUpdate, Store, StoreError, Transition, WebhookAttempt,
};

async fn webhook(s: &dyn Store, tenant: &str, id: &str, events: &[&str]) {
    s.create_webhook(NewWebhook {
        tenant_id: tenant.into(),
        id: id.into(),
        url: format!("http://127.0.0.1:9/{id}"),
        secret: "shh".into(),
        format: "onceprint".into(),
        events: events.iter().map(|e| e.to_string()).collect(),
        now: NOW,
    })
    .await
    .unwrap();
}

fn alert(id: &str, kind: &str) -> Option<OutboxEvent> {
    Some(OutboxEvent {
        event_id: id.into(),
        tenant_id: "acme".into(),
        kind: kind.into(),
        payload: format!(r#"{{"id":"{id}"}}"#),
        now: NOW + 5,
    })
}

/// A send with an alert of kind `task.sent` (the store does not care what kinds mean).
fn send(t: &NewTask, event_id: &str) -> Transition {
    Transition { event: alert(event_id, "task.sent"), ..common::send(t, "agent") }
}

fn report(printer: &str, online: bool, n: i64) -> PrinterStatusUpdate {
    PrinterStatusUpdate {
        tenant_id: "acme".into(),
        printer_id: printer.into(),
        online,
        last_error: None,
        now: NOW + n,
        event_id: format!("evt-{printer}-{n}"),
    }
}

/// `(event_id, kind)` of every alert in the outbox, in id order.
async fn outbox(db: &tokio_postgres::Client) -> Vec<(String, String)> {
    db.query("SELECT event_id, kind FROM outbox ORDER BY event_id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

fn ids(rows: &[(String, String)]) -> Vec<&str> {
    rows.iter().map(|(id, _)| id.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_changes_that_apply_write_their_alerts() {
    let h = fresh_store!();
    let s = h.store.as_ref();
    let db = raw(&h.url).await;
    tenant(s, "acme").await;
    webhook(s, "acme", "ops", &["task.sent", "task.cancelled"]).await;
    webhook(s, "acme", "audit", &["task.sent"]).await;
    let (a, b, c) = (task_on("p1", "A", 1), task_on("p1", "B", 2), task_on("p2", "C", 3));
    s.submit_batch(vec![a.clone(), b.clone(), c.clone()]).await.unwrap();

    let changes = vec![
        send(&a, "e1"),                                        // applies
        send(&b, "e2"),                                        // refused: A is in flight on p1
        Transition { expected_attempts: 5, ..send(&c, "e3") }, // loses its compare-and-set
        send(&c, "e4"),                                        // applies
        Transition { event: None, ..send(&b, "unused") },      // refused again, without an alert
    ];
    assert_eq!(s.apply_transitions(&changes).await.unwrap(), vec![true, false, false, true, false]);
    assert_eq!(ids(&outbox(&db).await), vec!["e1", "e4"]);
    // One delivery per endpoint that wants the kind, due at once.
    let due = s.due_webhooks(NOW + 5, 10).await.unwrap();
    let mut pairs: Vec<(&str, &str)> = due.iter().map(|d| (d.event_id.as_str(), d.webhook_id.as_str())).collect();
    pairs.sort();
    assert_eq!(pairs, vec![("e1", "audit"), ("e1", "ops"), ("e4", "audit"), ("e4", "ops")]);
    assert!(s.due_webhooks(NOW + 4, 10).await.unwrap().is_empty(), "due from the alert's time");

    // An operator's action: losing the compare-and-set, or failing later in the
    // transaction, writes no alert; applying writes it.
    let cancel = |event_id: &str| Transition {
        from: TaskState::Pending,
        to: TaskState::Cancelled,
        attempts: 0,
        event: alert(event_id, "task.cancelled"),
        ..send(&b, "")
    };
    let action = ManualChange {
        task_id: b.task_id.clone(),
        transitions: vec![Transition { expected_attempts: 3, ..cancel("e5") }],
        refund: Some(b.task_id.clone()),
        successor: None,
        now: NOW + 10,
    };
    assert!(!s.apply_manual(&action).await.unwrap());
    // A successor under A's key, which is taken.
    let mut taken = task_on("p2", "A", 9);
    taken.target = a.target.clone();
    let out = s
        .apply_manual(&ManualChange { transitions: vec![cancel("e6")], successor: Some(taken), ..action.clone() })
        .await;
    assert!(matches!(out, Err(StoreError::AlreadyExists(_))), "{out:?}");
    assert!(s.apply_manual(&ManualChange { transitions: vec![cancel("e7")], ..action }).await.unwrap());
    assert_eq!(
        outbox(&db).await,
        vec![
            ("e1".into(), "task.sent".into()),
            ("e4".into(), "task.sent".into()),
            ("e7".into(), "task.cancelled".into())
        ]
    );
    let ops = s.webhook_deliveries("acme", "ops", 10).await.unwrap().unwrap();
    assert_eq!(ops.len(), 3);
    assert_eq!(s.webhook_deliveries("acme", "audit", 10).await.unwrap().unwrap().len(), 2);

    // An event id used twice is an error, and the change is not applied without it.
    let d = task_on("p2", "D", 4);
    s.submit_batch(vec![d.clone()]).await.unwrap();
    let again = Transition { from: TaskState::Pending, to: TaskState::Cancelled, attempts: 0, ..send(&d, "e1") };
    assert!(matches!(s.transition(&again).await, Err(StoreError::Backend(_))));
    assert_eq!(s.get_task("acme", &d.task_id).await.unwrap().unwrap().state, TaskState::Pending);
    drop(db);
    drop(h);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_in_one_call_alert_on_every_flip() {
    let h = fresh_store!();
    let s = h.store.as_ref();
    let db = raw(&h.url).await;
    tenant(s, "acme").await;
    webhook(s, "acme", "ops", &["printer.offline"]).await;
    webhook(s, "acme", "audit", &["printer.online", "printer.offline"]).await;
    // Printers start offline. The reports apply in order, as if one after the other.
    let mut unknown = report("p9", true, 1);
    unknown.event_id = "evt-unknown".into();
    s.update_printer_status(&[
        report("p1", true, 1),  // flips: online
        unknown,                // no such printer: ignored
        report("p2", false, 2), // no flip
        report("p1", true, 3),  // no flip
        report("p1", false, 4), // flips: offline
        report("p1", false, 5), // no flip
        report("p1", true, 6),  // flips: online
    ])
    .await
    .unwrap();
    assert_eq!(
        outbox(&db).await,
        vec![
            ("evt-p1-1".into(), "printer.online".into()),
            ("evt-p1-4".into(), "printer.offline".into()),
            ("evt-p1-6".into(), "printer.online".into()),
        ]
    );
    let p1 = s.get_printer("acme", "p1").await.unwrap().unwrap();
    assert_eq!((p1.online, p1.last_seen_at), (true, Some(NOW + 6)), "the last report wins");
    assert_eq!(s.get_printer("acme", "p2").await.unwrap().unwrap().last_seen_at, Some(NOW + 2));
    // Each endpoint gets the kinds it asked for, with the alert's body.
    let due = s.due_webhooks(NOW + 100, 10).await.unwrap();
    let mut pairs: Vec<(&str, &str)> = due.iter().map(|d| (d.event_id.as_str(), d.webhook_id.as_str())).collect();
    pairs.sort();
    assert_eq!(pairs, vec![("evt-p1-1", "audit"), ("evt-p1-4", "audit"), ("evt-p1-4", "ops"), ("evt-p1-6", "audit")]);
    let offline = due.iter().find(|d| d.webhook_id == "ops").expect("ops delivery");
    assert_eq!(
        offline.payload,
        r#"{"created_at_ms":1764000000004,"data":{"last_error":null,"online":false,"printer_id":"p1"},"id":"evt-p1-4","tenant_id":"acme","type":"printer.offline"}"#
    );
    s.update_printer_status(&[]).await.unwrap();

    // A flip of a tenant without endpoints writes no alert at all: nobody would read it.
    tenant(s, "solo").await;
    let mut solo = report("p1", true, 7);
    solo.tenant_id = "solo".into();
    solo.event_id = "evt-solo".into();
    s.update_printer_status(&[solo]).await.unwrap();
    assert!(s.get_printer("solo", "p1").await.unwrap().unwrap().online, "the flip itself is recorded");
    assert_eq!(outbox(&db).await.len(), 3, "no alert for nobody");
    drop(db);
    drop(h);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_reports_alert_once_and_never_deadlock() {
    let h = fresh_store!();
    let s: Arc<dyn Store> = h.store.clone();
    let mut gate = raw(&h.url).await;
    tenant(s.as_ref(), "acme").await;
    webhook(s.as_ref(), "acme", "ops", &["printer.online", "printer.offline"]).await;
    for round in 0..20i64 {
        let online = round % 2 == 0; // every round flips both printers
                                     // The rows are locked while both reports start, so that they surely race; they
                                     // name the printers in opposite orders.
        let tx = gate.transaction().await.unwrap();
        tx.query("SELECT 1 FROM printers FOR UPDATE", &[]).await.unwrap();
        let one = tokio::spawn({
            let (s, r) = (s.clone(), [report("p1", online, 100 * round), report("p2", online, 100 * round)]);
            async move { s.update_printer_status(&r).await }
        });
        let two = tokio::spawn({
            let (s, r) = (s.clone(), [report("p2", online, 100 * round + 1), report("p1", online, 100 * round + 1)]);
            async move { s.update_printer_status(&r).await }
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
        tx.commit().await.unwrap();
        one.await.unwrap().unwrap();
        two.await.unwrap().unwrap();

        let flips: i64 = gate
            .query_one("SELECT count(*) FROM outbox WHERE created_at >= $1", &[&(NOW + 100 * round)])
            .await
            .unwrap()
            .get(0);
        assert_eq!(flips, 2, "round {round}: one alert per printer");
        for p in ["p1", "p2"] {
            assert_eq!(s.get_printer("acme", p).await.unwrap().unwrap().online, online);
        }
    }
    drop(gate);
    drop(h);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoints_history_is_its_own_newest_first() {
    let h = fresh_store!();
    let s = h.store.as_ref();
    tenant(s, "acme").await;
    tenant(s, "other").await;
    webhook(s, "other", "theirs", &["task.sent"]).await;
    webhook(s, "acme", "ops", &["task.sent"]).await;
    assert_eq!(s.webhook_deliveries("acme", "theirs", 10).await.unwrap(), None);
    assert_eq!(s.webhook_deliveries("acme", "ops", 10).await.unwrap(), Some(vec![]));
    let missing = s
        .create_webhook(NewWebhook {
            tenant_id: "nobody".into(),
            id: "x".into(),
            url: "http://x".into(),
            secret: "s".into(),
            format: "onceprint".into(),
            events: vec![],
            now: NOW,
        })
        .await;
    assert!(matches!(missing, Err(StoreError::NotFound(_))), "{missing:?}");
    let hooks = s.list_webhooks("acme").await.unwrap();
    assert_eq!(hooks.len(), 1);
    assert_eq!((hooks[0].id.as_str(), hooks[0].events.as_slice()), ("ops", ["task.sent".to_string()].as_slice()));

    // Two alerts at the same time, one later: newest first, ties by event id.
    let (a, b, c) = (task_on("p1", "A", 1), task_on("p2", "B", 2), task_on("p1", "C", 3));
    s.submit_batch(vec![a.clone(), b.clone(), c.clone()]).await.unwrap();
    let changes = [send(&b, "evt-b"), send(&a, "evt-a")];
    assert_eq!(s.apply_transitions(&changes).await.unwrap(), vec![true, true]);
    let cancel = Transition {
        from: TaskState::Pending,
        to: TaskState::Cancelled,
        attempts: 0,
        event: Some(OutboxEvent { now: NOW + 50, ..alert("evt-0", "task.sent").unwrap() }),
        ..send(&c, "")
    };
    assert!(s.transition(&cancel).await.unwrap());
    let seen = s.webhook_deliveries("acme", "ops", 10).await.unwrap().unwrap();
    assert_eq!(seen.iter().map(|d| d.event_id.as_str()).collect::<Vec<_>>(), vec!["evt-0", "evt-b", "evt-a"]);
    assert_eq!(s.webhook_deliveries("acme", "ops", 2).await.unwrap().unwrap().len(), 2);
    assert_eq!(s.webhook_deliveries("acme", "ops", 0).await.unwrap(), Some(vec![]));

    // Giving up: attempted once, never due again.
    s.record_webhook_attempt(&WebhookAttempt {
        event_id: "evt-a".into(),
        webhook_id: "ops".into(),
        delivered: false,
        status: None,
        error: Some("connection refused".into()),
        next_attempt_at: None,
        now: NOW + 60,
    })
    .await
    .unwrap();
    let due = s.due_webhooks(i64::MAX, 10).await.unwrap();
    assert_eq!(due.iter().map(|d| d.event_id.as_str()).collect::<Vec<_>>(), vec!["evt-b", "evt-0"]);
    assert_eq!(s.due_webhooks(i64::MAX, 1).await.unwrap().len(), 1);
    let a_row = s.webhook_deliveries("acme", "ops", 10).await.unwrap().unwrap().pop().unwrap();
    assert_eq!(
        (a_row.event_id.as_str(), a_row.attempts, a_row.next_attempt_at, a_row.delivered_at, a_row.last_status),
        ("evt-a", 1, None, None, None)
    );
    assert_eq!(a_row.last_error.as_deref(), Some("connection refused"));
    drop(h);
}
