//! Behaviour specific to the PostgreSQL backend: connecting, migrating, and the error
//! messages of writes that the shared conformance suite does not pin down.

mod common;

use common::{fresh_store, printer, tenant_with_store};
use onceprint_store::conformance::{new_task, NOW};
use onceprint_store::{NewPrinter, NewStation, NewStore, NewTenant, SetupAudit, Store, StoreError};
use onceprint_store_postgres::{migrations, testing, PostgresStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brokers_starting_at_once_migrate_the_schema_once() {
    let Some(schema) = testing::fresh_schema().await else {
        return;
    };
    let url = schema.url().to_owned();
    let starts: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { PostgresStore::connect(&url, 2).await })
        })
        .collect();
    for start in starts {
        let store = start.await.unwrap().unwrap();
        assert_eq!(store.schema_version().await.unwrap(), migrations::LATEST_VERSION);
    }
    // A later start finds everything applied and changes nothing.
    let store = PostgresStore::connect(&url, 2).await.unwrap();
    assert_eq!(store.schema_version().await.unwrap(), migrations::LATEST_VERSION);
    store.ping().await.unwrap();
    drop(store);
    drop(schema);
}

#[tokio::test]
async fn an_unreachable_server_is_unavailable() {
    // Port 1 on the loopback interface refuses connections at once.
    let err = PostgresStore::connect("postgres://postgres@127.0.0.1:1/test", 1).await.err();
    match err {
        Some(StoreError::Unavailable(message)) => {
            assert!(message.contains("127.0.0.1:1/test"), "{message}")
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    let err = PostgresStore::connect("postgres://[not a url", 1).await.err();
    assert!(matches!(err, Some(StoreError::Backend(_))), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_name_what_exists_or_is_missing() {
    let h = fresh_store!();
    let s = h.store.as_ref();
    tenant_with_store(s, "acme").await;

    let same_key = s
        .create_tenant(NewTenant {
            id: "other".into(),
            name: "x".into(),
            api_key_hash: "hash-acme".into(),
            now: NOW,
            api_key_id: "key-other".into(),
            audit: SetupAudit::default(),
        })
        .await;
    assert!(matches!(&same_key, Err(StoreError::AlreadyExists(m)) if !m.contains("hash-acme")), "{same_key:?}");
    let same_id = s
        .create_tenant(NewTenant {
            id: "acme".into(),
            name: "x".into(),
            api_key_hash: "new".into(),
            now: NOW,
            api_key_id: "key-acme".into(),
            audit: SetupAudit::default(),
        })
        .await;
    assert_eq!(same_id, Err(StoreError::AlreadyExists("tenant acme".into())));

    let no_tenant = s
        .create_store(NewStore {
            tenant_id: "ghost".into(),
            id: "s1".into(),
            name: "x".into(),
            timezone: "UTC".into(),
            now: NOW,
            audit: SetupAudit::default(),
        })
        .await;
    assert_eq!(no_tenant, Err(StoreError::NotFound("tenant ghost".into())));
    let no_store = s
        .create_printer(NewPrinter {
            tenant_id: "acme".into(),
            id: "p1".into(),
            store_id: "s9".into(),
            name: "x".into(),
            transport: "{}".into(),
            credential: None,
            now: NOW,
            audit: SetupAudit::default(),
        })
        .await;
    assert_eq!(no_store, Err(StoreError::NotFound("store s9".into())));

    let no_printer = s
        .create_station(NewStation {
            tenant_id: "acme".into(),
            id: "hot".into(),
            store_id: "s1".into(),
            printers: vec!["p7".into()],
            now: NOW,
            audit: SetupAudit::default(),
            failover_after_ms: None,
        })
        .await;
    assert_eq!(no_printer, Err(StoreError::NotFound("printer p7".into())));

    // A batch naming a printer the tenant does not have fails whole, naming the printer.
    let mut task = new_task("acme", "X1", "x", 1);
    task.printer_id = "p8".into();
    let failed = s.submit_batch(vec![task]).await;
    assert_eq!(failed, Err(StoreError::NotFound("printer p8".into())));
    drop(h);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_batch_keeps_input_order() {
    let h = fresh_store!();
    let s = h.store.as_ref();
    tenant_with_store(s, "acme").await;
    printer(s, "acme", "p1").await;
    // Keys in descending order, so that the store's sorting cannot line up with the input.
    let first: Vec<_> = (0..300u64).rev().map(|i| new_task("acme", &format!("K{i:04}"), "x", 1000 + i)).collect();
    let out = s.submit_batch(first.clone()).await.unwrap();
    for (t, o) in first.iter().zip(&out) {
        assert!(matches!(o, onceprint_store::SubmitOutcome::Created(_)), "{o:?}");
        assert_eq!(o.task().task_id, t.task_id);
    }
    // Half old keys, half new, interleaved.
    let second: Vec<_> = (0..300u64).map(|i| new_task("acme", &format!("K{:04}", i * 2), "y", 5000 + i)).collect();
    let out = s.submit_batch(second.clone()).await.unwrap();
    for (t, o) in second.iter().zip(&out) {
        assert_eq!(o.task().biz_no, t.biz_no);
        let old = t.biz_no[1..].parse::<u32>().unwrap() < 300;
        assert_eq!(matches!(o, onceprint_store::SubmitOutcome::Existing(_)), old, "{o:?}");
        assert_eq!(o.task().fingerprint, if old { "fp-x" } else { "fp-y" });
    }
    drop(h);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_concurrent_batches_neither_deadlock_nor_duplicate() {
    let h = fresh_store!();
    let s = h.store.clone();
    tenant_with_store(s.as_ref(), "acme").await;
    printer(s.as_ref(), "acme", "p1").await;
    // Eight writers submit the same 120 keys, each in its own order (a different stride
    // through the keys), in batches of 40. Without a stable lock order inside the store
    // two of them would soon wait on each other's keys.
    let writers: Vec<_> = (0..8u64)
        .map(|w| {
            let s = s.clone();
            tokio::spawn(async move {
                let stride = [1u64, 7, 11, 13, 17, 19, 23, 29][w as usize];
                let order: Vec<u64> = (0..120u64).map(|i| (i * stride + w) % 120).collect();
                let mut created = Vec::new();
                for (b, chunk) in order.chunks(40).enumerate() {
                    let batch: Vec<_> = chunk
                        .iter()
                        .map(|k| new_task("acme", &format!("D{k:03}"), "x", w * 1_000_000 + b as u64 * 1000 + k))
                        .collect();
                    for out in s.submit_batch(batch).await.unwrap() {
                        if let onceprint_store::SubmitOutcome::Created(t) = out {
                            created.push(t.biz_no);
                        }
                    }
                }
                created
            })
        })
        .collect();
    let mut created = Vec::new();
    for w in writers {
        created.extend(w.await.unwrap());
    }
    created.sort();
    let expected: Vec<String> = (0..120).map(|k| format!("D{k:03}")).collect();
    assert_eq!(created, expected, "every key created exactly once");
    drop(h);
}
