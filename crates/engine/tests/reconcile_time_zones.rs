//! Reconciliation of a store with an IANA time zone across a daylight saving change, on a
//! real (SQLite) store. Tasks are written with ids and times chosen by the test, which the
//! HTTP surface cannot do: the broker stamps a task with the moment it arrives.

use onceprint_core::TaskId;
use onceprint_engine::reconcile::{reconcile, ReconcileError};
use onceprint_store::conformance::new_task;
use onceprint_store::{NewPrinter, NewStore, NewTask, NewTenant, SetupAudit, Store};

const MINUTE: i64 = 60_000;
const HOUR: i64 = 60 * MINUTE;
/// 2026-10-25 00:00 in Europe/Berlin (+02:00), i.e. 2026-10-24T22:00:00Z:
/// `date -d 'TZ="Europe/Berlin" 2026-10-25 00:00' +%s`.
const BERLIN_OCT_25: i64 = 1_792_879_200_000;

/// A submission of tenant acme at store "berlin", created at `at` (its id carries that time).
fn task(biz_no: &str, at: i64, n: u8) -> NewTask {
    let mut t = new_task("acme", biz_no, biz_no, u64::from(n));
    t.task_id = TaskId::from_parts(at, [n; 10]).into_string();
    t.store_id = "berlin".into();
    t.now = at;
    t
}

async fn berlin_store(s: &dyn Store) {
    let now = BERLIN_OCT_25;
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
        id: "berlin".into(),
        name: "Berlin".into(),
        timezone: "Europe/Berlin".into(),
        now,
        audit: SetupAudit::default(),
    })
    .await
    .expect("store");
    s.create_printer(NewPrinter {
        tenant_id: "acme".into(),
        id: "p1".into(),
        store_id: "berlin".into(),
        name: "Kitchen".into(),
        transport: r#"{"kind":"agent","address":"tcp://127.0.0.1:9100"}"#.into(),
        credential: None,
        now,
        audit: SetupAudit::default(),
    })
    .await
    .expect("printer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_long_autumn_day_counts_an_order_at_half_past_eleven_at_night() {
    let Some(h) = onceprint_store_sqlite::testing::fresh_store().await else { return };
    let s = h.store.as_ref();
    berlin_store(s).await;
    // Clocks go back from 03:00 to 02:00 on 2026-10-25, so that day lasts 25 hours: from
    // 22:00 UTC the day before to 23:00 UTC. 23:30 local time is 22:30 UTC, an hour and a
    // half after a day computed with the summer offset (+02:00) would have ended.
    let tasks = vec![
        task("BEFORE", BERLIN_OCT_25 - 30 * MINUTE, 1), // 2026-10-24 23:30 +02:00
        task("EARLY", BERLIN_OCT_25 + 30 * MINUTE, 2),  // 2026-10-25 00:30 +02:00
        task("LATE", BERLIN_OCT_25 + 24 * HOUR + 30 * MINUTE, 3), // 2026-10-25 23:30 +01:00
        task("NEXT", BERLIN_OCT_25 + 25 * HOUR + 30 * MINUTE, 4), // 2026-10-26 00:30 +01:00
    ];
    s.submit_batch(tasks).await.expect("submit");
    let expected: Vec<String> = vec!["EARLY".into(), "LATE".into()];

    let day = reconcile(s, "acme", "berlin", "2026-10-25", Some(&expected)).await.expect("report");
    assert_eq!(day.timezone, "Europe/Berlin");
    assert_eq!((day.counts.submitted, day.counts.open, day.ledger.charges), (2, 2, 2), "{day:?}");
    // Neither was printed, so both are missing from paper; nothing else was on the day.
    assert_eq!(day.expected_not_printed, vec!["EARLY", "LATE"]);

    let before = reconcile(s, "acme", "berlin", "2026-10-24", None).await.expect("report");
    assert_eq!((before.counts.submitted, before.ledger.charges), (1, 1), "{before:?}");
    let next = reconcile(s, "acme", "berlin", "2026-10-26", None).await.expect("report");
    assert_eq!((next.counts.submitted, next.ledger.charges), (1, 1), "{next:?}");
    drop(h);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_zone_the_broker_does_not_know_is_an_error_not_a_wrong_day() {
    let Some(h) = onceprint_store_sqlite::testing::fresh_store().await else { return };
    let s = h.store.as_ref();
    berlin_store(s).await;
    // The store layer keeps the text as it is given; only the API checks it. A row that
    // somehow holds an unknown zone must not be reconciled in some other zone.
    s.create_store(NewStore {
        tenant_id: "acme".into(),
        id: "mars".into(),
        name: "Mars".into(),
        timezone: "Mars/Olympus".into(),
        now: BERLIN_OCT_25,
        audit: SetupAudit::default(),
    })
    .await
    .expect("store");
    let err = reconcile(s, "acme", "mars", "2026-10-25", None).await.expect_err("unknown zone");
    assert!(matches!(err, ReconcileError::StoreZone { .. }), "{err:?}");
    drop(h);
}
