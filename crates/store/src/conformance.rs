//! The one storage test suite, run against every backend (SQLite and PostgreSQL).
//!
//! A backend's test file calls [`conformance_tests!`](crate::conformance_tests) with an
//! async factory returning a fresh, empty, migrated store wrapped in a [`Harness`] (or
//! `None` when the backend is not available on this machine, in which case the factory
//! has already said so on stderr). Each case below becomes one `#[tokio::test]` in the
//! backend crate, so a failure names both the case and the backend.
//!
//! Besides these examples, [`idempotency_property_test!`](crate::idempotency_property_test)
//! generates one property test of the intake's idempotency contract (see
//! [`idempotency_property`]); a backend adds it in a test file of its own.

use std::sync::Arc;

use onceprint_core::{IdempotencyKey, TaskState};

use crate::*;

pub use crate::testing::Harness;

mod device_log;
mod idempotency;
mod offline;

pub use device_log::{device_log_is_read_by_store_and_task_id_range, device_log_keeps_the_latest_record_per_task};

pub use idempotency::{idempotency_property, HarnessFactory, IDEMPOTENCY_CASES};
pub use offline::{
    a_known_key_keeps_the_lan_id_as_an_alias_and_merges_by_the_rules,
    a_lan_copy_merges_into_the_task_the_order_lives_on, a_renamed_task_is_found_under_its_lan_id,
    an_offline_task_joins_the_lane_in_the_order_it_was_merged, an_unknown_key_becomes_a_task_under_the_lan_id,
    device_records_under_lan_ids_are_found_from_the_task_they_were_merged_into,
    lan_keys_share_the_agent_token_mechanism_and_authenticate_nothing, stations_are_listed_per_store,
};

/// Generates one test per conformance case for a backend factory.
#[macro_export]
macro_rules! conformance_tests {
    ($factory:path) => {
        $crate::conformance_tests!(@cases $factory;
            settings_round_trip, setup_objects_and_isolation, submit_writes_task_event_and_charge,
            duplicates_return_the_existing_task, duplicates_inside_one_batch_collapse,
            a_large_batch_writes_one_event_and_one_charge_per_created_task,
            concurrent_identical_submissions_create_one_task, tasks_are_tenant_scoped,
            list_tasks_filters_and_pages, task_lists_filter_by_printer_type_and_time_and_page_both_ways,
            business_numbers_are_found_by_their_start, transition_is_compare_and_set, count_by_state_counts,
            lanes_show_the_task_in_flight_and_the_first_waiting, lanes_follow_insertion_not_ids,
            lane_heads_and_an_ack_that_hands_out_the_next_in_one_change,
            the_may_have_printed_mark_stays,
            manual_changes_apply_whole_or_not_at_all, one_task_in_flight_per_printer,
            batches_apply_as_one_change_after_the_other, due_tasks_use_the_deadline, printer_status_is_recorded,
            last_seen_refreshes_touch_only_last_seen_of_online_printers, silent_polled_printers_are_found_by_their_interval,
            a_paused_printer_alerts_once_and_its_report_of_ready_resumes_the_lane, refusals_are_counted,
            the_waiting_tickets_of_paused_printers_are_found_in_lane_order,
            cancel_refunds_exactly_once, reprints_hang_on_the_original, transfer_links_the_successor,
            attention_lists_failed_and_in_doubt_oldest_first, day_reads_for_reconciliation,
            alerts_go_through_the_outbox_with_the_change,
            a_test_message_goes_to_its_endpoint_alone_in_its_format,
            api_keys_are_listed_added_and_revoked_but_never_the_last, agent_tokens_are_listed_and_revoked,
            printers_are_edited_as_compare_and_set_and_disabled, stations_get_new_printer_lists,
            setup_changes_are_audited_per_tenant_newest_first, printer_logins_are_found_by_hash_and_rotated,
            digest_keys_of_printer_logins_are_found_by_user_name,
            operators_log_in_with_sessions_that_can_be_revoked,
            operators_are_disabled_enabled_and_given_new_passwords,
            retention_prunes_finished_tasks_into_tombstones, a_pruned_key_never_creates_a_task_again,
            one_holder_of_a_lease_at_a_time, expired_leases_go_to_the_next_holder_with_a_higher_token,
            agent_sessions_merge_what_every_node_heard,
            lan_keys_share_the_agent_token_mechanism_and_authenticate_nothing, stations_are_listed_per_store,
            an_unknown_key_becomes_a_task_under_the_lan_id,
            a_known_key_keeps_the_lan_id_as_an_alias_and_merges_by_the_rules,
            a_lan_copy_merges_into_the_task_the_order_lives_on,
            an_offline_task_joins_the_lane_in_the_order_it_was_merged, a_renamed_task_is_found_under_its_lan_id,
            device_records_under_lan_ids_are_found_from_the_task_they_were_merged_into,
            device_log_keeps_the_latest_record_per_task, device_log_is_read_by_store_and_task_id_range);
    };
    (@cases $factory:path; $($case:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let Some(h) = $factory().await else { return };
                $crate::conformance::$case(h.store.clone()).await;
                drop(h);
            }
        )*
    };
}

pub const NOW: i64 = 1_764_000_000_000;

/// Printer p2 of tenant acme, in store s1 next to p1 (also driven by the store agent).
pub(crate) async fn second_printer(s: &Arc<dyn Store>) {
    s.create_printer(NewPrinter {
        tenant_id: "acme".into(),
        id: "p2".into(),
        store_id: "s1".into(),
        name: "x".into(),
        transport: r#"{"kind":"agent","address":"tcp://127.0.0.1:9101"}"#.into(),
        credential: None,
        now: NOW,
        audit: SetupAudit::default(),
    })
    .await
    .unwrap();
}

async fn tenant(s: &Arc<dyn Store>, id: &str) {
    s.create_tenant(NewTenant {
        id: id.into(),
        name: format!("Tenant {id}"),
        api_key_hash: format!("hash-{id}"),
        now: NOW,
        api_key_id: format!("key-{id}"),
        audit: SetupAudit::default(),
    })
    .await
    .unwrap();
    s.create_store(NewStore {
        tenant_id: id.into(),
        id: "s1".into(),
        name: "Main".into(),
        // An IANA name, so that the round trip below shows the text is kept as it is.
        timezone: "Europe/Berlin".into(),
        now: NOW,
        audit: SetupAudit::default(),
    })
    .await
    .unwrap();
    s.create_printer(NewPrinter {
        tenant_id: id.into(),
        id: "p1".into(),
        store_id: "s1".into(),
        name: "Kitchen".into(),
        transport: r#"{"kind":"agent","address":"tcp://127.0.0.1:9100"}"#.into(),
        credential: None,
        now: NOW,
        audit: SetupAudit::default(),
    })
    .await
    .unwrap();
}

/// A submission for tenant `t`, printer p1, with content `c`.
pub fn new_task(t: &str, biz_no: &str, c: &str, seq: u64) -> NewTask {
    NewTask {
        task_id: format!("{seq:020}-{t}"),
        tenant_id: t.into(),
        store_id: "s1".into(),
        printer_id: "p1".into(),
        station_id: None,
        target: "printer:p1".into(),
        biz_no: biz_no.into(),
        print_type: "receipt".into(),
        priority: 10,
        content_type: "text".into(),
        content: c.as_bytes().to_vec(),
        fingerprint: format!("fp-{c}"),
        actor: format!("tenant:{t}"),
        charge: 1,
        now: NOW + seq as i64,
        origin: None,
    }
}

fn key(t: &str, biz_no: &str) -> IdempotencyKey {
    IdempotencyKey {
        tenant_id: t.into(),
        target: "printer:p1".into(),
        biz_no: biz_no.into(),
        print_type: "receipt".into(),
    }
}

pub async fn settings_round_trip(s: Arc<dyn Store>) {
    assert_eq!(s.get_setting("admin_token_hash").await.unwrap(), None);
    s.put_setting("admin_token_hash", "a").await.unwrap();
    s.put_setting("admin_token_hash", "b").await.unwrap();
    assert_eq!(s.get_setting("admin_token_hash").await.unwrap().as_deref(), Some("b"));
    s.ping().await.unwrap();
}

pub async fn setup_objects_and_isolation(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    tenant(&s, "other").await;
    let dup = s
        .create_tenant(NewTenant {
            id: "acme".into(),
            name: "x".into(),
            api_key_hash: "h2".into(),
            now: NOW,
            api_key_id: "key-acme".into(),
            audit: SetupAudit::default(),
        })
        .await;
    assert!(matches!(dup, Err(StoreError::AlreadyExists(_))), "{dup:?}");
    let key = s.tenant_by_key_hash("hash-acme").await.unwrap().unwrap();
    assert_eq!((key.tenant.id.as_str(), key.key_id.as_str()), ("acme", "key-acme"));
    assert_eq!(s.tenant_by_key_hash("nope").await.unwrap(), None);

    let dup = s
        .create_store(NewStore {
            tenant_id: "acme".into(),
            id: "s1".into(),
            name: "x".into(),
            timezone: "UTC".into(),
            now: NOW,
            audit: SetupAudit::default(),
        })
        .await;
    assert!(matches!(dup, Err(StoreError::AlreadyExists(_))), "{dup:?}");
    let st = s.get_store("acme", "s1").await.unwrap().unwrap();
    assert_eq!((st.name.as_str(), st.timezone.as_str()), ("Main", "Europe/Berlin"));
    assert_eq!(s.get_store("acme", "s9").await.unwrap(), None);
    assert_eq!(s.list_stores("acme").await.unwrap().len(), 1);
    let fixed = s
        .create_store(NewStore {
            tenant_id: "acme".into(),
            id: "s3".into(),
            name: "Offset".into(),
            timezone: "-05:30".into(),
            now: NOW,
            audit: SetupAudit::default(),
        })
        .await
        .unwrap();
    assert_eq!(fixed.timezone, "-05:30");
    let zones: Vec<(String, String)> =
        s.list_stores("acme").await.unwrap().into_iter().map(|st| (st.id, st.timezone)).collect();
    assert_eq!(zones, vec![("s1".to_string(), "Europe/Berlin".to_string()), ("s3".to_string(), "-05:30".to_string())]);

    let bad = s
        .create_printer(NewPrinter {
            tenant_id: "acme".into(),
            id: "p2".into(),
            store_id: "nowhere".into(),
            name: "x".into(),
            transport: "{}".into(),
            credential: None,
            now: NOW,
            audit: SetupAudit::default(),
        })
        .await;
    assert!(matches!(bad, Err(StoreError::NotFound(_))), "{bad:?}");
    let dup = s
        .create_printer(NewPrinter {
            tenant_id: "acme".into(),
            id: "p1".into(),
            store_id: "s1".into(),
            name: "x".into(),
            transport: "{}".into(),
            credential: None,
            now: NOW,
            audit: SetupAudit::default(),
        })
        .await;
    assert!(matches!(dup, Err(StoreError::AlreadyExists(_))), "{dup:?}");
    let p = s.get_printer("acme", "p1").await.unwrap().unwrap();
    assert_eq!((p.store_id.as_str(), p.online, p.last_seen_at), ("s1", false, None));
    assert!(p.transport.contains("9100"));
    assert_eq!(s.list_printers("acme", Some("s1")).await.unwrap().len(), 1);
    assert_eq!(s.list_printers("acme", Some("s2")).await.unwrap().len(), 0);
    assert_eq!(s.list_printers("acme", None).await.unwrap().len(), 1);
    // Across tenants: both have a p1 with an agent transport.
    assert_eq!(s.printers_with_id("p1").await.unwrap().len(), 2);
    assert_eq!(s.printers_by_transport("agent").await.unwrap().len(), 2);
    assert!(s.printers_by_transport("webhook").await.unwrap().is_empty());

    s.create_printer(NewPrinter {
        tenant_id: "acme".into(),
        id: "p2".into(),
        store_id: "s1".into(),
        name: "Backup".into(),
        transport: "{}".into(),
        credential: None,
        now: NOW,
        audit: SetupAudit::default(),
    })
    .await
    .unwrap();
    let st = s
        .create_station(NewStation {
            tenant_id: "acme".into(),
            id: "hot".into(),
            store_id: "s1".into(),
            printers: vec!["p2".into(), "p1".into()],
            now: NOW,
            audit: SetupAudit::default(),
            failover_after_ms: None,
        })
        .await
        .unwrap();
    assert_eq!(st.printers, vec!["p2".to_string(), "p1".to_string()]);
    assert_eq!(s.get_station("acme", "hot").await.unwrap().unwrap().printers, st.printers);
    assert_eq!(s.get_station("other", "hot").await.unwrap(), None);
    let dup = s
        .create_station(NewStation {
            tenant_id: "acme".into(),
            id: "hot".into(),
            store_id: "s1".into(),
            printers: vec!["p1".into()],
            now: NOW,
            audit: SetupAudit::default(),
            failover_after_ms: None,
        })
        .await;
    assert!(matches!(dup, Err(StoreError::AlreadyExists(_))), "{dup:?}");

    s.create_agent_token(NewAgentToken {
        token_hash: "tok".into(),
        tenant_id: "acme".into(),
        store_id: "s1".into(),
        now: NOW,
        id: "tok-1".into(),
        kind: TokenKind::Agent,
        audit: SetupAudit::default(),
    })
    .await
    .unwrap();
    assert_eq!(
        s.agent_by_token_hash("tok").await.unwrap(),
        Some(AgentIdentity { tenant_id: "acme".into(), store_id: "s1".into() })
    );
    assert_eq!(s.agent_by_token_hash("nope").await.unwrap(), None);

    // The other tenant has its own p1 and s1, and sees none of acme's printers.
    assert_eq!(s.get_printer("other", "p2").await.unwrap(), None);
}

pub async fn submit_writes_task_event_and_charge(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    let t = new_task("acme", "A1001", "hello", 1);
    let out = s.submit_batch(vec![t.clone()]).await.unwrap();
    let SubmitOutcome::Created(task) = &out[0] else { panic!("{out:?}") };
    assert_eq!(task.task_id, t.task_id);
    assert_eq!(task.state, TaskState::Pending);
    assert_eq!((task.attempts, task.printed_at, task.created_at), (0, None, t.now));
    assert_eq!(task.fingerprint, "fp-hello");
    let got = s.get_task("acme", &t.task_id).await.unwrap().unwrap();
    assert_eq!(&got, task);
    let many = s.get_tasks("acme", &[t.task_id.clone(), "nope".into()]).await.unwrap();
    assert_eq!(many, vec![got.clone()]);
    assert!(s.get_tasks("other", std::slice::from_ref(&t.task_id)).await.unwrap().is_empty());
    assert_eq!(s.find_task(&key("acme", "A1001")).await.unwrap().unwrap().task_id, t.task_id);
    let content = s.task_content(&t.task_id).await.unwrap().unwrap();
    let many = s.task_contents(&[t.task_id.clone(), "nope".into()]).await.unwrap();
    assert_eq!(many, vec![(t.task_id.clone(), content.clone())]);
    assert_eq!((content.content_type.as_str(), content.content.as_slice()), ("text", &b"hello"[..]));
    let events = s.task_events("acme", &t.task_id).await.unwrap().unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!((events[0].from, events[0].to, events[0].actor.as_str()), (None, TaskState::Pending, "tenant:acme"));
    let ledger = s.ledger_entries(&t.task_id).await.unwrap();
    assert_eq!(ledger.len(), 1);
    assert_eq!((ledger[0].kind.as_str(), ledger[0].amount), ("charge", 1));
}

pub async fn duplicates_return_the_existing_task(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    let first = new_task("acme", "A1", "x", 1);
    s.submit_batch(vec![first.clone()]).await.unwrap();
    // Same key, new task id (a retry generates a fresh id): the existing task answers.
    let again = s.submit_batch(vec![new_task("acme", "A1", "x", 2)]).await.unwrap();
    let SubmitOutcome::Existing(t) = &again[0] else { panic!("{again:?}") };
    assert_eq!(t.task_id, first.task_id);
    // Same key, other content: still the existing row; the caller sees the fingerprint differ.
    let other = s.submit_batch(vec![new_task("acme", "A1", "y", 3)]).await.unwrap();
    let SubmitOutcome::Existing(t) = &other[0] else { panic!("{other:?}") };
    assert_eq!((t.task_id.as_str(), t.fingerprint.as_str()), (first.task_id.as_str(), "fp-x"));
    assert_eq!(s.ledger_entries(&first.task_id).await.unwrap().len(), 1);
    assert_eq!(s.task_events("acme", &first.task_id).await.unwrap().unwrap().len(), 1);
    let all = s.list_tasks(&TaskQuery { tenant_id: "acme".into(), limit: 100, ..Default::default() }).await.unwrap();
    assert_eq!(all.len(), 1);
}

pub async fn duplicates_inside_one_batch_collapse(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    let batch = vec![
        new_task("acme", "B1", "x", 1),
        new_task("acme", "B2", "x", 2),
        new_task("acme", "B1", "x", 3),
        new_task("acme", "B1", "other", 4),
    ];
    let out = s.submit_batch(batch.clone()).await.unwrap();
    assert_eq!(out.len(), 4);
    assert!(matches!(out[0], SubmitOutcome::Created(_)));
    assert!(matches!(out[1], SubmitOutcome::Created(_)));
    assert!(matches!(out[2], SubmitOutcome::Existing(_)));
    assert!(matches!(out[3], SubmitOutcome::Existing(_)));
    assert_eq!(out[2].task().task_id, batch[0].task_id);
    assert_eq!(out[3].task().fingerprint, "fp-x");
    let all = s.list_tasks(&TaskQuery { tenant_id: "acme".into(), limit: 100, ..Default::default() }).await.unwrap();
    assert_eq!(all.len(), 2);
}

pub async fn a_large_batch_writes_one_event_and_one_charge_per_created_task(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    // 90 submissions, 87 of them new: a backend writing events and charges several rows
    // per statement crosses its chunk sizes (SQLite: 64 + 16 + 4 + 1 + 1 + 1).
    let mut batch: Vec<NewTask> = (0..88u64).map(|i| new_task("acme", &format!("L{i}"), "x", 1000 + i)).collect();
    batch[5].charge = 0;
    batch[7].actor = "operator:ann".into();
    batch.push(new_task("acme", "L3", "x", 2000));
    batch.push(new_task("acme", "L80", "x", 2001));
    let out = s.submit_batch(batch.clone()).await.unwrap();
    assert_eq!(out.len(), 90);
    assert!(out[..88].iter().all(|o| matches!(o, SubmitOutcome::Created(_))));
    assert!(matches!(out[88], SubmitOutcome::Existing(_)) && matches!(out[89], SubmitOutcome::Existing(_)));
    for (i, t) in batch.iter().take(88).enumerate() {
        let events = s.task_events("acme", &t.task_id).await.unwrap().unwrap();
        let expected_actor = if i == 7 { "operator:ann".to_owned() } else { "tenant:acme".to_owned() };
        assert_eq!(
            events.iter().map(|e| (e.at, e.from, e.to, e.actor.clone(), e.reason.as_str())).collect::<Vec<_>>(),
            vec![(t.now, None, TaskState::Pending, expected_actor, "submitted")],
            "task {i}"
        );
        let ledger = s.ledger_entries(&t.task_id).await.unwrap();
        if i == 5 {
            assert!(ledger.is_empty(), "no charge of 0 is written");
        } else {
            assert_eq!(
                ledger.iter().map(|l| (l.tenant_id.as_str(), l.kind.as_str(), l.amount, l.at)).collect::<Vec<_>>(),
                vec![("acme", "charge", 1, t.now)],
                "task {i}"
            );
        }
    }
    // The repeats wrote nothing of their own.
    assert!(s.task_events("acme", &batch[88].task_id).await.unwrap().is_none());
    assert!(s.ledger_entries(&batch[89].task_id).await.unwrap().is_empty());

    // A second batch: 70 keys that exist (answered with their tasks as stored) among 20
    // new ones, interleaved.
    let mut second = Vec::new();
    for i in 0..90u64 {
        second.push(if i % 9 < 7 {
            new_task("acme", &format!("L{i}"), "x", 3000 + i)
        } else {
            new_task("acme", &format!("M{i}"), "x", 3000 + i)
        });
    }
    let out2 = s.submit_batch(second.clone()).await.unwrap();
    for (i, (o, t)) in out2.iter().zip(&second).enumerate() {
        if i % 9 < 7 {
            assert!(matches!(o, SubmitOutcome::Existing(_)), "item {i}: {o:?}");
            assert_eq!(o.task().task_id, batch[i].task_id, "item {i}");
            assert!(s.task_events("acme", &t.task_id).await.unwrap().is_none(), "item {i}");
        } else {
            assert!(matches!(o, SubmitOutcome::Created(_)), "item {i}: {o:?}");
            assert_eq!(s.task_events("acme", &t.task_id).await.unwrap().unwrap().len(), 1, "item {i}");
            assert_eq!(s.ledger_entries(&t.task_id).await.unwrap().len(), 1, "item {i}");
        }
    }
    let all = s.list_tasks(&TaskQuery { tenant_id: "acme".into(), limit: 500, ..Default::default() }).await.unwrap();
    assert_eq!(all.len(), 88 + 20);

    // A task for a printer that does not exist, deep in a batch: the whole batch is
    // refused, naming that printer, and nothing of it is written.
    let mut third: Vec<NewTask> = (0..70u64).map(|i| new_task("acme", &format!("N{i}"), "x", 4000 + i)).collect();
    third[41].printer_id = "p404".into();
    let refused = s.submit_batch(third.clone()).await;
    assert_eq!(refused, Err(StoreError::NotFound("printer p404".into())));
    for t in &third {
        assert!(s.task_events("acme", &t.task_id).await.unwrap().is_none());
    }
    let all = s.list_tasks(&TaskQuery { tenant_id: "acme".into(), limit: 500, ..Default::default() }).await.unwrap();
    assert_eq!(all.len(), 88 + 20, "nothing of the refused batch was written");
}

pub async fn concurrent_identical_submissions_create_one_task(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    // Half go through the group committer, half as separate concurrent batches, so both
    // the in-batch collapse and the unique constraint across transactions are exercised.
    let gc = GroupCommitter::start(s.clone(), GroupCommitConfig { max_batch: 16, max_in_flight: 4 });
    let mut handles = Vec::new();
    for i in 0..64u64 {
        let s = s.clone();
        let gc = gc.clone();
        handles.push(tokio::spawn(async move {
            let t = new_task("acme", "RACE", "same", 100 + i);
            if i % 2 == 0 {
                gc.submit(t).await.unwrap()
            } else {
                s.submit_batch(vec![t]).await.unwrap().remove(0)
            }
        }));
    }
    let mut created = 0;
    let mut ids = std::collections::BTreeSet::new();
    for h in handles {
        let out = h.await.unwrap();
        if matches!(out, SubmitOutcome::Created(_)) {
            created += 1;
        }
        ids.insert(out.task().task_id.clone());
    }
    assert_eq!(created, 1);
    assert_eq!(ids.len(), 1, "every answer names the same task");
    let id = ids.into_iter().next().unwrap();
    assert_eq!(s.ledger_entries(&id).await.unwrap().len(), 1);
    let all = s.list_tasks(&TaskQuery { tenant_id: "acme".into(), limit: 100, ..Default::default() }).await.unwrap();
    assert_eq!(all.len(), 1);
}

pub async fn tasks_are_tenant_scoped(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    tenant(&s, "other").await;
    let a = new_task("acme", "A1", "x", 1);
    let b = new_task("other", "A1", "x", 2);
    let out = s.submit_batch(vec![a.clone(), b.clone()]).await.unwrap();
    assert!(out.iter().all(|o| matches!(o, SubmitOutcome::Created(_))), "same biz_no, other tenant: {out:?}");
    assert_eq!(s.get_task("other", &a.task_id).await.unwrap(), None);
    assert_eq!(s.task_events("other", &a.task_id).await.unwrap(), None);
    let theirs = s.list_tasks(&TaskQuery { tenant_id: "other".into(), limit: 10, ..Default::default() }).await.unwrap();
    assert_eq!(theirs.iter().map(|t| t.task_id.clone()).collect::<Vec<_>>(), vec![b.task_id]);
}

/// Store `s2` of tenant `acme` with its printer `p9`, beside the `tenant` fixture's store.
async fn second_store(s: &Arc<dyn Store>) {
    s.create_store(NewStore {
        tenant_id: "acme".into(),
        id: "s2".into(),
        name: "Two".into(),
        timezone: "UTC".into(),
        now: NOW,
        audit: SetupAudit::default(),
    })
    .await
    .unwrap();
    s.create_printer(NewPrinter {
        tenant_id: "acme".into(),
        id: "p9".into(),
        store_id: "s2".into(),
        name: "x".into(),
        transport: "{}".into(),
        credential: None,
        now: NOW,
        audit: SetupAudit::default(),
    })
    .await
    .unwrap();
}

/// The console's ticket list: a store's tasks filtered by printer, print type, state and a
/// range of ids (a time range), paged newest first with a cursor to the next page and one
/// back to the previous page, each keeping the filters.
pub async fn task_lists_filter_by_printer_type_and_time_and_page_both_ways(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    second_store(&s).await;
    s.create_printer(NewPrinter {
        tenant_id: "acme".into(),
        id: "p2".into(),
        store_id: "s1".into(),
        name: "Bar".into(),
        transport: "{}".into(),
        credential: None,
        now: NOW,
        audit: SetupAudit::default(),
    })
    .await
    .unwrap();
    // Ten tasks: even ones on p1, odd ones on p2; every third a kitchen ticket.
    let batch: Vec<NewTask> = (0..10)
        .map(|i| {
            let mut t = new_task("acme", &format!("F{i}"), "x", 100 + i);
            if i % 2 == 1 {
                t.printer_id = "p2".into();
                t.target = "printer:p2".into();
            }
            if i % 3 == 0 {
                t.print_type = "kitchen".into();
            }
            t
        })
        .collect();
    let ids: Vec<String> = batch.iter().map(|t| t.task_id.clone()).collect();
    let mut elsewhere = new_task("acme", "F-s2", "x", 150);
    elsewhere.store_id = "s2".into();
    elsewhere.printer_id = "p9".into();
    elsewhere.target = "printer:p9".into();
    let mut all = batch.clone();
    all.push(elsewhere);
    s.submit_batch(all).await.unwrap();
    let query = |f: &dyn Fn(&mut TaskQuery)| {
        let mut q =
            TaskQuery { tenant_id: "acme".into(), store_id: Some("s1".into()), limit: 100, ..Default::default() };
        f(&mut q);
        q
    };
    let list = |q: TaskQuery| {
        let s = s.clone();
        async move { s.list_tasks(&q).await.unwrap().into_iter().map(|t| t.task_id).collect::<Vec<_>>() }
    };
    let newest_first = |picked: &[usize]| picked.iter().rev().map(|&i| ids[i].clone()).collect::<Vec<_>>();

    assert_eq!(list(query(&|q| q.printer_id = Some("p2".into()))).await, newest_first(&[1, 3, 5, 7, 9]));
    assert_eq!(list(query(&|q| q.print_type = Some("kitchen".into()))).await, newest_first(&[0, 3, 6, 9]));
    assert_eq!(
        list(query(&|q| {
            q.printer_id = Some("p2".into());
            q.print_type = Some("kitchen".into());
        }))
        .await,
        newest_first(&[3, 9])
    );
    // A time range is a range of ids: from is included, to is not.
    assert_eq!(
        list(query(&|q| {
            q.id_from = Some(ids[2].clone());
            q.id_to = Some(ids[6].clone());
        }))
        .await,
        newest_first(&[2, 3, 4, 5])
    );
    assert!(list(query(&|q| q.state = Some(TaskState::Printed))).await.is_empty());
    assert_eq!(
        list(query(&|q| {
            q.state = Some(TaskState::Pending);
            q.printer_id = Some("p1".into());
        }))
        .await,
        newest_first(&[0, 2, 4, 6, 8])
    );
    assert!(list(query(&|q| q.printer_id = Some("p9".into()))).await.is_empty(), "another store's printer");

    // Pages of three, forwards with `cursor` and back with `after`, filters kept.
    let page = |cursor: Option<String>, after: Option<String>| {
        query(&move |q| {
            q.limit = 3;
            q.print_type = Some("receipt".into());
            q.cursor = cursor.clone();
            q.after = after.clone();
        })
    };
    let first = list(page(None, None)).await;
    assert_eq!(first, newest_first(&[5, 7, 8]));
    let second = list(page(first.last().cloned(), None)).await;
    assert_eq!(second, newest_first(&[1, 2, 4]));
    let back = list(page(None, second.first().cloned())).await;
    assert_eq!(back, first, "the page before the second is the first, newest first");
    let back_from_middle = list(page(None, Some(ids[1].clone()))).await;
    assert_eq!(back_from_middle, newest_first(&[2, 4, 5]), "the three just above, newest first");
    assert!(list(page(None, Some(ids[8].clone()))).await.is_empty(), "nothing above the newest");
}

pub async fn list_tasks_filters_and_pages(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    second_store(&s).await;
    let mut batch: Vec<NewTask> = (0..7).map(|i| new_task("acme", &format!("L{i}"), "x", i)).collect();
    let mut other_store = new_task("acme", "L-s2", "x", 50);
    other_store.store_id = "s2".into();
    other_store.printer_id = "p9".into();
    other_store.target = "printer:p9".into();
    batch.push(other_store);
    s.submit_batch(batch).await.unwrap();

    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let page = s
            .list_tasks(&TaskQuery {
                tenant_id: "acme".into(),
                store_id: Some("s1".into()),
                limit: 3,
                cursor: cursor.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
        assert!(page.len() <= 3);
        if page.is_empty() {
            break;
        }
        cursor = page.last().map(|t| t.task_id.clone());
        seen.extend(page.into_iter().map(|t| t.task_id));
    }
    assert_eq!(seen.len(), 7);
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.reverse();
    assert_eq!(seen, sorted, "newest (largest id) first");
    let by_biz = s
        .list_tasks(&TaskQuery { tenant_id: "acme".into(), biz_no: Some("L3".into()), limit: 10, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(by_biz.len(), 1);
    // One order number on several targets and print types, and in another tenant: a
    // search finds the tenant's own, on every target, newest first, and pages and filters
    // like any list.
    let l3 = by_biz[0].task_id.clone();
    let mut kitchen = new_task("acme", "L3", "x", 60);
    kitchen.print_type = "kitchen".into();
    let mut elsewhere = new_task("acme", "L3", "x", 61);
    elsewhere.store_id = "s2".into();
    elsewhere.printer_id = "p9".into();
    elsewhere.target = "printer:p9".into();
    tenant(&s, "zeta").await;
    s.submit_batch(vec![kitchen.clone(), elsewhere.clone(), new_task("zeta", "L3", "x", 62)]).await.unwrap();
    let search = |store: Option<&str>, state: Option<TaskState>, cursor: Option<&str>, limit: i64| TaskQuery {
        tenant_id: "acme".into(),
        biz_no: Some("L3".into()),
        store_id: store.map(Into::into),
        state,
        cursor: cursor.map(Into::into),
        limit,
        ..Default::default()
    };
    let ids = |tasks: Vec<Task>| tasks.into_iter().map(|t| t.task_id).collect::<Vec<_>>();
    assert_eq!(
        ids(s.list_tasks(&search(None, None, None, 10)).await.unwrap()),
        vec![elsewhere.task_id.clone(), kitchen.task_id.clone(), l3.clone()]
    );
    assert_eq!(
        ids(s.list_tasks(&search(Some("s1"), None, None, 10)).await.unwrap()),
        vec![kitchen.task_id.clone(), l3.clone()]
    );
    assert_eq!(
        ids(s.list_tasks(&search(None, Some(TaskState::Pending), Some(&elsewhere.task_id), 1)).await.unwrap()),
        vec![kitchen.task_id.clone()]
    );
    assert!(s.list_tasks(&search(None, Some(TaskState::Printed), None, 10)).await.unwrap().is_empty());
    assert!(s
        .list_tasks(&TaskQuery { biz_no: Some("L-none".into()), ..search(None, None, None, 10) })
        .await
        .unwrap()
        .is_empty());
    let none = s
        .list_tasks(&TaskQuery {
            tenant_id: "acme".into(),
            state: Some(TaskState::Printed),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(none.is_empty());
}

/// A search by the start of the business number finds every task whose number begins
/// with it (the exact number, one with a suffix such as `#kitchen`), no other, newest
/// first, within the store and state asked for; characters that are wildcards elsewhere
/// (`%`, `_`) are plain characters here, and case counts.
pub async fn business_numbers_are_found_by_their_start(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    second_store(&s).await;
    let numbers =
        ["A1003", "A1003#kitchen", "A10030", "A1004", "B1003", "a1003", "A100", "A1%3", "A1_03", "A1003\u{10FFFF}x"];
    let mut tasks: Vec<NewTask> = numbers.iter().enumerate().map(|(i, b)| new_task("acme", b, "x", i as u64)).collect();
    let mut elsewhere = new_task("acme", "A1003#bar", "x", 40);
    elsewhere.store_id = "s2".into();
    elsewhere.printer_id = "p9".into();
    elsewhere.target = "printer:p9".into();
    tasks.push(elsewhere);
    tenant(&s, "zeta").await;
    tasks.push(new_task("zeta", "A1003", "x", 41));
    s.submit_batch(tasks).await.unwrap();
    let find = |prefix: &str, store: Option<&str>, limit: i64| TaskQuery {
        tenant_id: "acme".into(),
        store_id: store.map(Into::into),
        biz_no_prefix: Some(prefix.into()),
        limit,
        ..Default::default()
    };
    let numbers_of = |tasks: Vec<Task>| tasks.into_iter().map(|t| t.biz_no).collect::<Vec<_>>();
    assert_eq!(
        numbers_of(s.list_tasks(&find("A1003", Some("s1"), 10)).await.unwrap()),
        vec!["A1003\u{10FFFF}x", "A10030", "A1003#kitchen", "A1003"],
        "newest first, the store's own"
    );
    assert_eq!(
        numbers_of(s.list_tasks(&find("A1003", None, 10)).await.unwrap()),
        vec!["A1003#bar", "A1003\u{10FFFF}x", "A10030", "A1003#kitchen", "A1003"],
        "the tenant's, every store"
    );
    assert_eq!(
        numbers_of(s.list_tasks(&find("A1003", Some("s1"), 2)).await.unwrap()),
        vec!["A1003\u{10FFFF}x", "A10030"]
    );
    assert_eq!(numbers_of(s.list_tasks(&find("A1%", Some("s1"), 10)).await.unwrap()), vec!["A1%3"]);
    assert_eq!(numbers_of(s.list_tasks(&find("A1_", Some("s1"), 10)).await.unwrap()), vec!["A1_03"]);
    assert_eq!(numbers_of(s.list_tasks(&find("a1", Some("s1"), 10)).await.unwrap()), vec!["a1003"]);
    assert!(s.list_tasks(&find("C", None, 10)).await.unwrap().is_empty());
    let by_state = TaskQuery { state: Some(TaskState::Printed), ..find("A1003", Some("s1"), 10) };
    assert!(s.list_tasks(&by_state).await.unwrap().is_empty(), "the state filter still holds");
    let exact = TaskQuery { biz_no: Some("A1003".into()), ..find("A1003", Some("s1"), 10) };
    assert_eq!(numbers_of(s.list_tasks(&exact).await.unwrap()), vec!["A1003"]);
    assert_eq!(crate::prefix_upper_bound("A1003").as_deref(), Some("A1004"));
    assert_eq!(crate::prefix_upper_bound("a\u{10FFFF}").as_deref(), Some("b"));
    assert_eq!(crate::prefix_upper_bound("\u{D7FF}").as_deref(), Some("\u{E000}"));
    assert_eq!(crate::prefix_upper_bound(""), None);
}

pub async fn transition_is_compare_and_set(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    let t = new_task("acme", "C1", "x", 1);
    s.submit_batch(vec![t.clone()]).await.unwrap();
    let send = Transition {
        task_id: t.task_id.clone(),
        from: TaskState::Pending,
        expected_attempts: 0,
        to: TaskState::Sent,
        attempts: 1,
        last_error: None,
        next_attempt_at: None,
        actor: "engine".into(),
        reason: "dispatched".into(),
        now: NOW + 10,
        sent_to: Some("agent-1".into()),
        sent_session: Some("sess-1".into()),
        may_have_printed: false,
        event: None,
        refused: false,
    };
    assert!(s.transition(&send).await.unwrap());
    assert!(!s.transition(&send).await.unwrap(), "the same CAS twice applies once");
    let stale = Transition { from: TaskState::Sent, expected_attempts: 0, to: TaskState::Printed, ..send.clone() };
    assert!(!s.transition(&stale).await.unwrap(), "an ack for an older attempt changes nothing");
    let printed = Transition {
        from: TaskState::Sent,
        expected_attempts: 1,
        to: TaskState::Printed,
        attempts: 1,
        reason: "printer acknowledged".into(),
        now: NOW + 20,
        ..send.clone()
    };
    assert!(s.transition(&printed).await.unwrap());
    let task = s.get_task("acme", &t.task_id).await.unwrap().unwrap();
    assert_eq!(
        (task.state, task.attempts, task.printed_at, task.updated_at),
        (TaskState::Printed, 1, Some(NOW + 20), NOW + 20)
    );
    let ev = s.task_events("acme", &t.task_id).await.unwrap().unwrap();
    let path: Vec<_> = ev.iter().map(|e| (e.from, e.to)).collect();
    assert_eq!(
        path,
        vec![
            (None, TaskState::Pending),
            (Some(TaskState::Pending), TaskState::Sent),
            (Some(TaskState::Sent), TaskState::Printed)
        ]
    );
    assert_eq!(ev[2].reason, "printer acknowledged");
    let retry = Transition {
        from: TaskState::Printed,
        expected_attempts: 1,
        to: TaskState::Retrying,
        last_error: Some("no_paper".into()),
        next_attempt_at: Some(NOW + 1000),
        ..send
    };
    // The store enforces CAS only; this one matches (state, attempts) but the engine would
    // never ask for it. Check that last_error and next_attempt_at are written when it does.
    assert!(s.transition(&retry).await.unwrap());
    let task = s.get_task("acme", &t.task_id).await.unwrap().unwrap();
    assert_eq!((task.last_error.as_deref(), task.next_attempt_at), (Some("no_paper"), Some(NOW + 1000)));
}

pub async fn count_by_state_counts(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    let batch: Vec<NewTask> = (0..5).map(|i| new_task("acme", &format!("N{i}"), "x", i)).collect();
    s.submit_batch(batch).await.unwrap();
    let counts = s.count_by_state().await.unwrap();
    let pending = counts.iter().find(|(st, _)| *st == TaskState::Pending).map(|(_, n)| *n);
    assert_eq!(pending, Some(5));

    // Every state, each from its own place: the backends read some states from partial
    // indexes and derive others, so each must come out right, a large one and the rare
    // ones alike. The store moves any state to any other by compare-and-set; the state
    // machine is the engine's.
    let batch: Vec<NewTask> = (0..10).map(|i| new_task("acme", &format!("M{i}"), "x", 10 + i)).collect();
    s.submit_batch(batch.clone()).await.unwrap();
    let targets = [
        TaskState::Sent,
        TaskState::Retrying,
        TaskState::Retrying,
        TaskState::Printed,
        TaskState::Printed,
        TaskState::Printed,
        TaskState::Failed,
        TaskState::InDoubt,
        TaskState::Transferred,
        TaskState::Cancelled,
    ];
    for (t, to) in batch.iter().zip(targets) {
        let change = Transition { to, next_attempt_at: Some(NOW + 500), ..send(t, 0, NOW + 100) };
        assert!(s.transition(&change).await.unwrap(), "{} to {to:?}", t.task_id);
    }
    let closed = new_task("acme", "M-closed", "x", 30);
    s.submit_batch(vec![closed.clone()]).await.unwrap();
    assert!(s.transition(&Transition { to: TaskState::Closed, ..send(&closed, 0, NOW + 100) }).await.unwrap());
    let mut counts: Vec<(TaskState, i64)> =
        s.count_by_state().await.unwrap().into_iter().filter(|(_, n)| *n != 0).collect();
    counts.sort_by_key(|(st, _)| st.as_str());
    let mut want = vec![
        (TaskState::Pending, 5),
        (TaskState::Sent, 1),
        (TaskState::Retrying, 2),
        (TaskState::Printed, 3),
        (TaskState::Failed, 1),
        (TaskState::InDoubt, 1),
        (TaskState::Transferred, 1),
        (TaskState::Cancelled, 1),
        (TaskState::Closed, 1),
    ];
    want.sort_by_key(|(st, _)| st.as_str());
    assert_eq!(counts, want);
}

fn send(t: &NewTask, attempts_before: i32, now: i64) -> Transition {
    Transition {
        task_id: t.task_id.clone(),
        from: if attempts_before == 0 { TaskState::Pending } else { TaskState::Retrying },
        expected_attempts: attempts_before,
        to: TaskState::Sent,
        attempts: attempts_before + 1,
        last_error: None,
        next_attempt_at: Some(now + 30_000),
        actor: "engine".into(),
        reason: "dispatched".into(),
        now,
        sent_to: Some("agent-1".into()),
        sent_session: Some("sess-1".into()),
        may_have_printed: false,
        event: None,
        refused: false,
    }
}

pub async fn lanes_show_the_task_in_flight_and_the_first_waiting(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    second_printer(&s).await;
    let a = new_task("acme", "A", "x", 1);
    let mut b = new_task("acme", "B", "x", 2);
    b.priority = 0; // a refund submitted later still goes first
    let mut c = new_task("acme", "C", "x", 3);
    c.printer_id = "p2".into();
    c.target = "printer:p2".into();
    s.submit_batch(vec![a.clone(), b.clone(), c.clone()]).await.unwrap();
    let ids = |lanes: &[Lane]| -> Vec<(String, Option<String>, Option<String>)> {
        lanes
            .iter()
            .map(|l| {
                (
                    l.printer_id.clone(),
                    l.in_flight.as_ref().map(|t| t.task_id.clone()),
                    l.waiting.as_ref().map(|t| t.task_id.clone()),
                )
            })
            .collect()
    };
    // A printer of another transport in the same store, with a task of its own: a claim of
    // the agent's printers does not read its lane, nor the other way round.
    s.create_printer(NewPrinter {
        tenant_id: "acme".into(),
        id: "w1".into(),
        store_id: "s1".into(),
        name: "Webhook".into(),
        transport: r#"{"kind":"webhook","url":"https://example.com/print"}"#.into(),
        credential: None,
        now: NOW,
        audit: SetupAudit::default(),
    })
    .await
    .unwrap();
    let mut w = new_task("acme", "W", "x", 0);
    w.printer_id = "w1".into();
    w.target = "printer:w1".into();
    s.submit_batch(vec![w.clone()]).await.unwrap();
    let lanes = s.lanes("acme", "s1", "agent").await.unwrap();
    assert_eq!(
        ids(&lanes),
        vec![("p1".into(), None, Some(b.task_id.clone())), ("p2".into(), None, Some(c.task_id.clone()))]
    );
    assert_eq!(ids(&s.lanes("acme", "s1", "webhook").await.unwrap()), vec![("w1".into(), None, Some(w.task_id))]);
    assert!(s.lanes("acme", "s1", "mqtt").await.unwrap().is_empty());
    assert!(s.lanes("acme", "other-store", "agent").await.unwrap().is_empty());
    assert!(s.lanes("other-tenant", "s1", "agent").await.unwrap().is_empty());

    // A in flight, then a refund D arrives: the lane shows A, whatever the priorities
    // (deciding from the waiting head alone is how a lane once stalled for good); what
    // waits behind a busy lane is not read.
    assert_eq!(s.apply_transitions(&[send(&a, 0, NOW + 5)]).await.unwrap(), vec![true]);
    let mut d = new_task("acme", "D", "x", 4);
    d.priority = 0;
    s.submit_batch(vec![d.clone()]).await.unwrap();
    let lane = s.lane("acme", "p1").await.unwrap();
    assert_eq!(
        lane.in_flight.as_ref().map(|t| (t.task_id.as_str(), t.state)),
        Some((a.task_id.as_str(), TaskState::Sent))
    );
    assert_eq!(
        lane.in_flight.as_ref().map(|t| (t.sent_to.as_deref(), t.sent_session.as_deref(), t.sent_at)),
        Some((Some("agent-1"), Some("sess-1"), Some(NOW + 5)))
    );
    assert_eq!(lane.waiting, None, "a busy lane's waiting task is not read");
    assert_eq!(s.lanes("acme", "s1", "agent").await.unwrap()[0], lane);
    assert_eq!(
        s.lane("acme", "nowhere").await.unwrap(),
        Lane { printer_id: "nowhere".into(), in_flight: None, waiting: None }
    );

    // Offering it again does not move `sent_at`: the lane has been busy since NOW + 5.
    let again =
        Transition { from: TaskState::Sent, expected_attempts: 1, attempts: 2, now: NOW + 9, ..send(&a, 0, NOW + 9) };
    assert!(s.transition(&again).await.unwrap());
    let a_now = s.get_task("acme", &a.task_id).await.unwrap().unwrap();
    assert_eq!((a_now.attempts, a_now.sent_at, a_now.updated_at), (2, Some(NOW + 5), NOW + 9));

    let stats = s.lane_stats().await.unwrap();
    let p1 = stats.iter().find(|l| l.printer_id == "p1").unwrap();
    assert_eq!(
        (p1.tenant_id.as_str(), p1.store_id.as_str(), p1.waiting, p1.oldest_waiting_at, p1.in_flight_since),
        ("acme", "s1", 2, Some(b.now), Some(NOW + 5))
    );
    assert_eq!(stats.iter().find(|l| l.printer_id == "p2").map(|l| (l.waiting, l.in_flight_since)), Some((1, None)));

    let printed = Transition {
        from: TaskState::Sent,
        expected_attempts: 2,
        attempts: 2,
        to: TaskState::Printed,
        next_attempt_at: None,
        ..send(&a, 0, NOW + 10)
    };
    assert!(s.transition(&printed).await.unwrap());
    let lane = s.lane("acme", "p1").await.unwrap();
    assert_eq!(
        (lane.in_flight, lane.waiting.map(|t| t.task_id)),
        (None, Some(b.task_id.clone())),
        "refunds first, FIFO"
    );
    assert_eq!(s.max_task_id().await.unwrap().as_deref(), Some(d.task_id.as_str()));
}

/// A lane hands out its tasks in the order they were inserted (within a priority), not in
/// id order: ids are minted by each broker node from its own clock, so a task submitted
/// later to a node whose clock is behind can have a smaller id (order per printer across nodes). Also
/// within one batch, where the batch's order decides, not its keys' (an order system's
/// tickets sent together in one batch request print in the order sent).
pub async fn lanes_follow_insertion_not_ids(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    // First A (id ...0050), then B (id ...0010) from a node whose clock is behind, then C
    // and D together in one batch, D's id the smaller.
    let a = new_task("acme", "A", "x", 50);
    let b = new_task("acme", "B", "x", 10);
    let c = new_task("acme", "C", "x", 40);
    let d = new_task("acme", "D", "x", 20);
    s.submit_batch(vec![a.clone()]).await.unwrap();
    s.submit_batch(vec![b.clone()]).await.unwrap();
    s.submit_batch(vec![c.clone(), d.clone()]).await.unwrap();
    // Then F before E in one batch: the keys sort the other way.
    let f = new_task("acme", "F", "x", 60);
    let e = new_task("acme", "E", "x", 70);
    s.submit_batch(vec![f.clone(), e.clone()]).await.unwrap();
    let all = [a, b, c, d, f, e];
    let mut left = Vec::new();
    for _ in 0..all.len() {
        let head = s.lane("acme", "p1").await.unwrap().waiting.expect("a waiting task");
        let t = all.iter().find(|t| t.task_id == head.task_id).unwrap();
        assert!(s.transition(&send(t, 0, NOW + 100)).await.unwrap());
        let printed = Transition {
            from: TaskState::Sent,
            expected_attempts: 1,
            to: TaskState::Printed,
            next_attempt_at: None,
            ..send(t, 0, NOW + 101)
        };
        assert!(s.transition(&printed).await.unwrap());
        left.push(head.biz_no);
    }
    assert_eq!(left, ["A", "B", "C", "D", "F", "E"], "insertion order, whatever the ids or keys say");
    assert!(s.lane("acme", "p1").await.unwrap().waiting.is_none());
}

/// An agent's ack may hand out the next task of the lane it frees (the agent's `next`): the
/// lane's head is read whatever is in flight, and the ack, the hand-out and the printer's
/// report go in one call. The hand-out applies only once the task before it has left
/// `sent` (the one-in-flight rule), and a report goes with its change or not at all.
pub async fn lane_heads_and_an_ack_that_hands_out_the_next_in_one_change(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    second_printer(&s).await;
    let a = new_task("acme", "A", "x", 1);
    let b = new_task("acme", "B", "x", 2);
    let mut c = new_task("acme", "C", "x", 3);
    c.priority = 0; // a refund submitted later still goes first
    let mut e = new_task("acme", "E", "x", 4);
    e.printer_id = "p2".into();
    e.target = "printer:p2".into();
    s.submit_batch(vec![a.clone(), b.clone(), c.clone(), e.clone()]).await.unwrap();
    assert!(s.transition(&send(&a, 0, NOW + 5)).await.unwrap());
    let printers = |ids: &[&str]| ids.iter().map(|p| p.to_string()).collect::<Vec<_>>();
    let heads = |tasks: Vec<Task>| tasks.into_iter().map(|t| (t.printer_id, t.task_id)).collect::<Vec<_>>();
    // p1's head is C, the refund, although A is in flight; p2's is E; p9 does not exist;
    // another tenant sees nothing.
    assert_eq!(
        heads(s.lane_heads("acme", &printers(&["p2", "p1", "p9"])).await.unwrap()),
        vec![("p1".to_string(), c.task_id.clone()), ("p2".to_string(), e.task_id.clone())]
    );
    assert!(s.lane_heads("other-tenant", &printers(&["p1"])).await.unwrap().is_empty());
    assert!(s.lane_heads("acme", &[]).await.unwrap().is_empty());

    // What acks of A (in flight on p1) and E (waiting on p2) are decided on, in one read:
    // both tasks; with heads, only p1's (the lane of a task in flight), with its content.
    let acked = printers(&[&a.task_id, &e.task_id, "no-such-task"]);
    let read = s.read_for_acks("acme", &acked, true).await.unwrap();
    let mut ids: Vec<String> = read.tasks.iter().map(|t| t.task_id.clone()).collect();
    ids.sort();
    let mut want = vec![a.task_id.clone(), e.task_id.clone()];
    want.sort();
    assert_eq!(ids, want);
    assert_eq!(heads(read.heads), vec![("p1".to_string(), c.task_id.clone())]);
    assert_eq!(
        read.contents,
        vec![(c.task_id.clone(), TaskContent { content_type: c.content_type.clone(), content: c.content.clone() })]
    );
    let read = s.read_for_acks("acme", &acked, false).await.unwrap();
    assert_eq!((read.tasks.len(), read.heads.len(), read.contents.len()), (2, 0, 0));
    assert!(s.read_for_acks("other-tenant", &acked, true).await.unwrap().tasks.is_empty());

    let printed = |t: &NewTask, now: i64| Transition {
        from: TaskState::Sent,
        expected_attempts: 1,
        to: TaskState::Printed,
        next_attempt_at: None,
        ..send(t, 0, now)
    };
    let report = |printer: &str, online: bool, now: i64| PrinterStatusUpdate {
        tenant_id: "acme".into(),
        printer_id: printer.into(),
        online,
        last_error: None,
        now,
        event_id: format!("evt-{printer}-{now}"),
    };
    // An ack of the wrong attempt does not apply, so the hand-out behind it cannot either
    // (A is still in flight), and neither report is written.
    let stale = Transition { expected_attempts: 7, ..printed(&a, NOW + 6) };
    let applied = s
        .apply_transitions_with_reports(
            &[stale, send(&c, 0, NOW + 6)],
            &[(0, report("p1", true, NOW + 6)), (1, report("p1", true, NOW + 6))],
        )
        .await
        .unwrap();
    assert_eq!(applied, vec![false, false]);
    assert_eq!(s.get_printer("acme", "p1").await.unwrap().unwrap().last_seen_at, None);
    assert_eq!(s.get_task("acme", &c.task_id).await.unwrap().unwrap().state, TaskState::Pending);

    // A printed and C handed out in one call; p1's report goes with A's change, p2's with
    // a change that does not apply (E is not in flight) and is left out.
    let not_sent = printed(&e, NOW + 7);
    let applied = s
        .apply_transitions_with_reports(
            &[printed(&a, NOW + 7), send(&c, 0, NOW + 7), not_sent],
            &[(0, report("p1", true, NOW + 7)), (2, report("p2", false, NOW + 7))],
        )
        .await
        .unwrap();
    assert_eq!(applied, vec![true, true, false]);
    let lane = s.lane("acme", "p1").await.unwrap();
    assert_eq!(lane.in_flight.map(|t| (t.task_id, t.state)), Some((c.task_id.clone(), TaskState::Sent)));
    assert_eq!(s.get_task("acme", &a.task_id).await.unwrap().unwrap().state, TaskState::Printed);
    let p1 = s.get_printer("acme", "p1").await.unwrap().unwrap();
    assert_eq!((p1.online, p1.last_seen_at), (true, Some(NOW + 7)));
    let p2 = s.get_printer("acme", "p2").await.unwrap().unwrap();
    assert_eq!(p2.last_seen_at, None, "the report of a change that did not apply is not written");
    // Every change is audited as usual.
    assert_eq!(s.task_events("acme", &c.task_id).await.unwrap().unwrap().len(), 2);
    // The head of p1 is now B, behind C in flight.
    assert_eq!(
        heads(s.lane_heads("acme", &printers(&["p1"])).await.unwrap()),
        vec![("p1".to_string(), b.task_id.clone())]
    );
}

/// The mark "may have printed" is set by a transition that carries it and never removed.
pub async fn the_may_have_printed_mark_stays(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    let a = new_task("acme", "A", "x", 1);
    s.submit_batch(vec![a.clone()]).await.unwrap();
    assert!(!s.get_task("acme", &a.task_id).await.unwrap().unwrap().may_have_printed);
    assert!(s.transition(&send(&a, 0, NOW + 5)).await.unwrap());
    let doubt = Transition {
        from: TaskState::Sent,
        expected_attempts: 1,
        to: TaskState::Retrying,
        may_have_printed: true,
        ..send(&a, 0, NOW + 6)
    };
    assert!(s.apply_transitions(&[doubt]).await.unwrap()[0]);
    assert!(s.get_task("acme", &a.task_id).await.unwrap().unwrap().may_have_printed);
    let again = Transition { from: TaskState::Retrying, expected_attempts: 1, ..send(&a, 1, NOW + 7) };
    assert!(s.apply_transitions(&[again]).await.unwrap()[0]);
    let t = s.get_task("acme", &a.task_id).await.unwrap().unwrap();
    assert_eq!((t.state, t.attempts, t.may_have_printed, t.sent_at), (TaskState::Sent, 2, true, Some(NOW + 7)));
}

/// A chain of transitions (a failover: `sent → failed → transferred` with the successor)
/// applies whole or not at all.
pub async fn manual_changes_apply_whole_or_not_at_all(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    second_printer(&s).await;
    let t = new_task("acme", "F1", "x", 1);
    s.submit_batch(vec![t.clone()]).await.unwrap();
    assert!(s.transition(&send(&t, 0, NOW + 5)).await.unwrap());
    let failed = manual_transition(&t, TaskState::Sent, 1, TaskState::Failed, NOW + 6);
    let moved = manual_transition(&t, TaskState::Failed, 1, TaskState::Transferred, NOW + 6);
    let succ = successor_of(&t, OriginKind::Failover, None, "p2", 2);
    // The second step expects the wrong attempt: nothing of the chain is written.
    let broken = ManualChange {
        task_id: t.task_id.clone(),
        transitions: vec![failed.clone(), Transition { expected_attempts: 7, ..moved.clone() }],
        refund: None,
        successor: Some(succ.clone()),
        now: NOW + 6,
    };
    assert!(!s.apply_manual(&broken).await.unwrap());
    let row = s.get_task("acme", &t.task_id).await.unwrap().unwrap();
    assert_eq!(row.state, TaskState::Sent, "the first step was undone with the chain");
    assert_eq!(s.task_events("acme", &t.task_id).await.unwrap().unwrap().len(), 2);
    assert_eq!(s.get_task("acme", &succ.task_id).await.unwrap(), None);
    let whole = ManualChange { transitions: vec![failed, moved], ..broken };
    assert!(s.apply_manual(&whole).await.unwrap());
    let row = s.get_task("acme", &t.task_id).await.unwrap().unwrap();
    assert_eq!((row.state, row.successor_task_id.as_deref()), (TaskState::Transferred, Some(succ.task_id.as_str())));
    let to: Vec<TaskState> = s.task_events("acme", &t.task_id).await.unwrap().unwrap().iter().map(|e| e.to).collect();
    assert_eq!(to, vec![TaskState::Pending, TaskState::Sent, TaskState::Failed, TaskState::Transferred]);

    // Cancelling the successor refunds the charge it names: the original's.
    let cancel = ManualChange {
        task_id: succ.task_id.clone(),
        transitions: vec![manual_transition(&succ, TaskState::Pending, 0, TaskState::Cancelled, NOW + 8)],
        refund: Some(t.task_id.clone()),
        successor: None,
        now: NOW + 8,
    };
    assert!(s.apply_manual(&cancel).await.unwrap());
    let kinds: Vec<_> =
        s.ledger_entries(&t.task_id).await.unwrap().iter().map(|e| (e.kind.clone(), e.amount)).collect();
    assert_eq!(kinds, vec![("charge".to_owned(), 1), ("refund".to_owned(), 1)]);
    assert!(s.ledger_entries(&succ.task_id).await.unwrap().is_empty());
}

pub async fn one_task_in_flight_per_printer(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    let a = new_task("acme", "A", "x", 1);
    let b = new_task("acme", "B", "x", 2);
    s.submit_batch(vec![a.clone(), b.clone()]).await.unwrap();
    // Both in one batch: the second loses, the first applies, nothing else is disturbed.
    let results = s.apply_transitions(&[send(&a, 0, NOW + 5), send(&b, 0, NOW + 5)]).await.unwrap();
    assert_eq!(results, vec![true, false]);
    assert!(!s.transition(&send(&b, 0, NOW + 6)).await.unwrap(), "still one in flight");
    let tb = s.get_task("acme", &b.task_id).await.unwrap().unwrap();
    assert_eq!(tb.state, TaskState::Pending);
    assert_eq!(s.task_events("acme", &b.task_id).await.unwrap().unwrap().len(), 1, "no audit for a refused change");
    let done = Transition {
        from: TaskState::Sent,
        expected_attempts: 1,
        to: TaskState::Printed,
        next_attempt_at: None,
        ..send(&a, 0, NOW + 7)
    };
    assert_eq!(s.apply_transitions(&[done, send(&b, 0, NOW + 8)]).await.unwrap(), vec![true, true]);
}

/// Batches as the engine makes them: a poll handing out work to several printers, then
/// their acknowledgements, one of them stale. Whatever way a backend applies a batch, the
/// answers, states and audit trails are those of the changes applied one after the other.
pub async fn batches_apply_as_one_change_after_the_other(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    second_printer(&s).await;
    let on_p2 = |mut t: NewTask| {
        t.printer_id = "p2".into();
        t.target = "printer:p2".into();
        t
    };
    let (a, b) = (new_task("acme", "A", "x", 1), on_p2(new_task("acme", "B", "x", 2)));
    let (c, d) = (new_task("acme", "C", "x", 3), on_p2(new_task("acme", "D", "x", 4)));
    s.submit_batch(vec![a.clone(), b.clone(), c.clone(), d.clone()]).await.unwrap();

    // A poll: one task for each printer.
    assert_eq!(s.apply_transitions(&[send(&a, 0, NOW + 5), send(&b, 0, NOW + 5)]).await.unwrap(), vec![true, true]);
    // The acks: A printed; the ack for B names an attempt B never had and changes nothing.
    let ack = |t: &NewTask, expected: i32, now: i64| Transition {
        from: TaskState::Sent,
        expected_attempts: expected,
        to: TaskState::Printed,
        next_attempt_at: None,
        actor: "agent:agent-1".into(),
        reason: "printed".into(),
        ..send(t, 0, now)
    };
    assert_eq!(s.apply_transitions(&[ack(&a, 1, NOW + 6), ack(&b, 7, NOW + 6)]).await.unwrap(), vec![true, false]);
    let state = |t: &NewTask| {
        let s = s.clone();
        let id = t.task_id.clone();
        async move { s.get_task("acme", &id).await.unwrap().unwrap() }
    };
    let ta = state(&a).await;
    assert_eq!((ta.state, ta.attempts, ta.printed_at), (TaskState::Printed, 1, Some(NOW + 6)));
    assert_eq!(state(&b).await.state, TaskState::Sent, "the stale ack moved nothing");
    let trail: Vec<_> = s
        .task_events("acme", &a.task_id)
        .await
        .unwrap()
        .unwrap()
        .iter()
        .map(|e| (e.from, e.to, e.actor.clone()))
        .collect();
    assert_eq!(
        trail,
        vec![
            (None, TaskState::Pending, "tenant:acme".to_owned()),
            (Some(TaskState::Pending), TaskState::Sent, "engine".to_owned()),
            (Some(TaskState::Sent), TaskState::Printed, "agent:agent-1".to_owned()),
        ]
    );
    assert_eq!(s.task_events("acme", &b.task_id).await.unwrap().unwrap().len(), 2, "no audit for the stale ack");

    // The next poll: p1 is free again, p2 still has B in flight.
    assert_eq!(s.apply_transitions(&[send(&c, 0, NOW + 7), send(&d, 0, NOW + 7)]).await.unwrap(), vec![true, false]);
    assert_eq!((state(&c).await.state, state(&d).await.state), (TaskState::Sent, TaskState::Pending));
    assert_eq!(s.task_events("acme", &d.task_id).await.unwrap().unwrap().len(), 1);
}

pub async fn due_tasks_use_the_deadline(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    let a = new_task("acme", "A", "x", 1);
    s.submit_batch(vec![a.clone()]).await.unwrap();
    assert!(s.transition(&send(&a, 0, NOW)).await.unwrap()); // deadline NOW + 30 s
    assert!(s.due_tasks(TaskState::Sent, NOW + 29_999, 10).await.unwrap().is_empty());
    let due = s.due_tasks(TaskState::Sent, NOW + 30_000, 10).await.unwrap();
    assert_eq!(due.iter().map(|t| t.task_id.clone()).collect::<Vec<_>>(), vec![a.task_id.clone()]);
    assert!(s.due_tasks(TaskState::Retrying, NOW + 60_000, 10).await.unwrap().is_empty());
}

pub async fn printer_status_is_recorded(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    s.update_printer_status(&[PrinterStatusUpdate {
        tenant_id: "acme".into(),
        printer_id: "p1".into(),
        online: true,
        last_error: Some("no_paper".into()),
        now: NOW + 1,
        event_id: "evt-1".into(),
    }])
    .await
    .unwrap();
    let p = s.get_printer("acme", "p1").await.unwrap().unwrap();
    assert_eq!((p.online, p.last_seen_at, p.last_error.as_deref()), (true, Some(NOW + 1), Some("no_paper")));
    s.update_printer_status(&[PrinterStatusUpdate {
        tenant_id: "acme".into(),
        printer_id: "p1".into(),
        online: false,
        last_error: None,
        now: NOW + 2,
        event_id: "evt-2".into(),
    }])
    .await
    .unwrap();
    let p = s.get_printer("acme", "p1").await.unwrap().unwrap();
    assert_eq!((p.online, p.last_seen_at, p.last_error), (false, Some(NOW + 2), None));
}

/// A batch of refreshes moves `last_seen_at` forward and nothing else: `last_error` set
/// meanwhile stays, an older time does not move it back, an offline printer keeps the
/// time it went silent and is answered as not touched, like a printer that does not
/// exist.
pub async fn last_seen_refreshes_touch_only_last_seen_of_online_printers(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    second_printer(&s).await;
    let report = |printer: &str, online: bool, error: Option<&str>, now: i64| PrinterStatusUpdate {
        tenant_id: "acme".into(),
        printer_id: printer.into(),
        online,
        last_error: error.map(str::to_owned),
        now,
        event_id: format!("evt-{printer}-{now}"),
    };
    s.update_printer_status(&[
        report("p1", true, Some("no_paper"), NOW + 10),
        report("p2", false, Some("offline"), NOW + 10),
    ])
    .await
    .unwrap();
    let seen = |printer: &str, at: i64| PrinterSeen { tenant_id: "acme".into(), printer_id: printer.into(), at };
    let untouched =
        s.touch_printers_seen(&[seen("p1", NOW + 20), seen("p2", NOW + 20), seen("nobody", NOW + 20)]).await.unwrap();
    let mut untouched = untouched;
    untouched.sort();
    assert_eq!(untouched, vec![("acme".to_string(), "nobody".to_string()), ("acme".to_string(), "p2".to_string())]);
    let p1 = s.get_printer("acme", "p1").await.unwrap().unwrap();
    assert_eq!((p1.online, p1.last_seen_at, p1.last_error.as_deref()), (true, Some(NOW + 20), Some("no_paper")));
    assert_eq!(p1.paused_since, Some(NOW + 10), "the pause began with the report, not with the refresh");
    let p2 = s.get_printer("acme", "p2").await.unwrap().unwrap();
    assert_eq!((p2.online, p2.last_seen_at, p2.last_error.as_deref()), (false, Some(NOW + 10), Some("offline")));
    // A refresh older than what the row holds leaves it.
    assert!(s.touch_printers_seen(&[seen("p1", NOW + 15)]).await.unwrap().is_empty());
    assert_eq!(s.get_printer("acme", "p1").await.unwrap().unwrap().last_seen_at, Some(NOW + 20));
    assert!(s.touch_printers_seen(&[]).await.unwrap().is_empty());
}

/// The offline check's question, answered by the database: printers of one transport
/// held online (or never seen and not judged) whose last sign of life is past 2 × their
/// own poll interval (or the default) + the grace. Other transports and other printers
/// are not returned.
pub async fn silent_polled_printers_are_found_by_their_interval(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    let printer = |id: &str, transport: &str| NewPrinter {
        tenant_id: "acme".into(),
        id: id.into(),
        store_id: "s1".into(),
        name: id.into(),
        transport: transport.into(),
        credential: None,
        now: NOW,
        audit: SetupAudit::default(),
    };
    // fast: 1 s interval, threshold 2 s + 1 s grace; slow: the default 10 s, threshold 21 s.
    s.create_printer(printer("fast", r#"{"kind":"cloudprnt","poll_interval_s":1}"#)).await.unwrap();
    s.create_printer(printer("slow", r#"{"kind":"cloudprnt"}"#)).await.unwrap();
    s.create_printer(printer("gone", r#"{"kind":"cloudprnt","poll_interval_s":1}"#)).await.unwrap();
    s.create_printer(printer("epson", r#"{"kind":"epson_sdp","poll_interval_s":1}"#)).await.unwrap();
    let report = |printer: &str, online: bool, error: Option<&str>, now: i64| PrinterStatusUpdate {
        tenant_id: "acme".into(),
        printer_id: printer.into(),
        online,
        last_error: error.map(str::to_owned),
        now,
        event_id: format!("evt-{printer}-{now}"),
    };
    s.update_printer_status(&[
        report("fast", true, None, NOW + 1_000),
        report("slow", true, None, NOW + 1_000),
        report("gone", false, Some("offline"), NOW + 1_000),
        report("epson", true, None, NOW + 1_000),
    ])
    .await
    .unwrap();
    let query = |now: i64| SilenceQuery { kind: "cloudprnt".into(), now, default_interval_ms: 10_000, grace_ms: 1_000 };
    let ids = |found: Vec<Printer>| found.into_iter().map(|p| p.id).collect::<Vec<_>>();
    assert!(ids(s.silent_printers(&query(NOW + 4_000)).await.unwrap()).is_empty(), "exactly at the threshold");
    assert_eq!(ids(s.silent_printers(&query(NOW + 4_001)).await.unwrap()), vec!["fast".to_string()]);
    assert_eq!(
        ids(s.silent_printers(&query(NOW + 22_001)).await.unwrap()),
        vec!["fast".to_string(), "slow".to_string()]
    );
    // A refresh puts it back under its threshold.
    s.touch_printers_seen(&[PrinterSeen { tenant_id: "acme".into(), printer_id: "fast".into(), at: NOW + 22_000 }])
        .await
        .unwrap();
    assert_eq!(ids(s.silent_printers(&query(NOW + 22_001)).await.unwrap()), vec!["slow".to_string()]);
    // Never seen: judged from when it was set up, until it is marked offline.
    s.create_printer(NewPrinter { now: NOW + 30_000, ..printer("new", r#"{"kind":"cloudprnt","poll_interval_s":1}"#) })
        .await
        .unwrap();
    assert!(!ids(s.silent_printers(&query(NOW + 33_000)).await.unwrap()).contains(&"new".to_string()));
    assert!(ids(s.silent_printers(&query(NOW + 33_001)).await.unwrap()).contains(&"new".to_string()));
    s.update_printer_status(&[report("new", false, Some("offline"), NOW + 30_000)]).await.unwrap();
    // The offline mark writes `last_seen_at`; a printer marked offline is not asked again.
    assert!(!ids(s.silent_printers(&query(NOW + 40_000)).await.unwrap()).contains(&"new".to_string()));
}

/// A printer whose state turns into one that holds its lane (no paper, ...)
/// gets `paused_since` and one `printer.paused` alert, however often it says so again
/// (with another pausing reason too); back to ready, one `printer.resumed`, `paused_since`
/// cleared, and its tickets waiting for it are due at once. Others' are not touched.
pub async fn a_paused_printer_alerts_once_and_its_report_of_ready_resumes_the_lane(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    second_printer(&s).await;
    s.create_webhook(hook("ops", &["printer.paused", "printer.resumed", "printer.online"])).await.unwrap();
    let a = new_task("acme", "A", "x", 1);
    let mut b = new_task("acme", "B", "x", 2);
    b.printer_id = "p2".into();
    b.target = "printer:p2".into();
    s.submit_batch(vec![a.clone(), b.clone()]).await.unwrap();
    // Both refused: A by p1 out of paper, B by p2, whose own pause is not resumed here.
    for t in [&a, &b] {
        assert_eq!(s.apply_transitions(&[send(t, 0, NOW + 5)]).await.unwrap(), vec![true]);
        let refused = Transition {
            from: TaskState::Sent,
            expected_attempts: 1,
            attempts: 1,
            to: TaskState::Retrying,
            last_error: Some("no_paper".into()),
            next_attempt_at: Some(NOW + 60_000),
            reason: "no paper".into(),
            refused: true,
            sent_to: None,
            sent_session: None,
            ..send(t, 1, NOW + 6)
        };
        assert_eq!(s.apply_transitions(&[refused]).await.unwrap(), vec![true]);
    }
    let report = |printer: &str, error: Option<&str>, n: i64| PrinterStatusUpdate {
        tenant_id: "acme".into(),
        printer_id: printer.into(),
        online: true,
        last_error: error.map(str::to_owned),
        now: NOW + 10 + n,
        event_id: format!("evt-{printer}-{n}"),
    };
    s.update_printer_status(&[report("p1", Some("no_paper"), 1), report("p2", Some("cover_open"), 1)]).await.unwrap();
    s.update_printer_status(&[report("p1", Some("no_paper"), 2)]).await.unwrap();
    s.update_printer_status(&[report("p1", Some("cover_open"), 3)]).await.unwrap();
    let p1 = s.get_printer("acme", "p1").await.unwrap().unwrap();
    assert_eq!((p1.last_error.as_deref(), p1.paused_since), (Some("cover_open"), Some(NOW + 11)));
    assert_eq!(s.get_task("acme", &a.task_id).await.unwrap().unwrap().next_attempt_at, Some(NOW + 60_000));
    // Ready, in one batch after one more refusal report: one recovery.
    s.update_printer_status(&[report("p1", Some("no_paper"), 4), report("p1", None, 5)]).await.unwrap();
    let p1 = s.get_printer("acme", "p1").await.unwrap().unwrap();
    assert_eq!((p1.last_error, p1.paused_since), (None, None));
    let ta = s.get_task("acme", &a.task_id).await.unwrap().unwrap();
    assert_eq!((ta.state, ta.next_attempt_at), (TaskState::Retrying, Some(NOW + 15)), "due at once");
    let tb = s.get_task("acme", &b.task_id).await.unwrap().unwrap();
    assert_eq!(tb.next_attempt_at, Some(NOW + 60_000), "p2 is still paused");
    s.update_printer_status(&[report("p1", None, 6)]).await.unwrap();
    let due = s.due_webhooks(NOW + 100, 50).await.unwrap();
    let mut kinds: Vec<(String, String)> = due
        .iter()
        .map(|d| {
            let v: serde_json::Value = serde_json::from_str(&d.payload).unwrap();
            (v["type"].as_str().unwrap_or("?").to_owned(), v["data"]["printer_id"].as_str().unwrap_or("?").to_owned())
        })
        .collect();
    kinds.sort();
    // p1 and p2 came online from never seen (printer.online each), p1 paused and resumed
    // once, p2 paused once.
    let want: Vec<(String, String)> = [
        ("printer.online", "p1"),
        ("printer.online", "p2"),
        ("printer.paused", "p1"),
        ("printer.paused", "p2"),
        ("printer.resumed", "p1"),
    ]
    .iter()
    .map(|(k, p)| (k.to_string(), p.to_string()))
    .collect();
    assert_eq!(kinds, want);
    let paused = due.iter().find(|d| d.payload.contains("printer.paused") && d.payload.contains("\"p1\"")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&paused.payload).unwrap();
    assert_eq!(v["data"]["reason"], "no_paper");
}

/// What waits on a printer whose lane is paused, with the pause, in lane order; not
/// the task in flight, not the tickets of printers that are not paused (or no longer).
pub async fn the_waiting_tickets_of_paused_printers_are_found_in_lane_order(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    second_printer(&s).await;
    let on = |mut t: NewTask, printer: &str, priority: i32| {
        t.printer_id = printer.into();
        t.target = format!("printer:{printer}");
        t.priority = priority;
        t
    };
    // p1: one in flight, three waiting (a lower priority number goes first); p2: one.
    let (a, b, c, d) = (
        new_task("acme", "A", "x", 1),
        on(new_task("acme", "B", "x", 2), "p1", 20),
        on(new_task("acme", "C", "x", 3), "p1", 5),
        on(new_task("acme", "D", "x", 4), "p1", 20),
    );
    let e = on(new_task("acme", "E", "x", 5), "p2", 10);
    s.submit_batch(vec![a.clone(), b.clone(), c.clone(), d.clone(), e.clone()]).await.unwrap();
    assert_eq!(s.apply_transitions(&[send(&a, 0, NOW + 5)]).await.unwrap(), vec![true]);
    assert!(s.waiting_on_paused_printers(100).await.unwrap().is_empty(), "nothing is paused");
    let report = |printer: &str, error: Option<&str>, at: i64| PrinterStatusUpdate {
        tenant_id: "acme".into(),
        printer_id: printer.into(),
        online: error != Some("offline"),
        last_error: error.map(str::to_owned),
        now: at,
        event_id: format!("evt-{printer}-{at}"),
    };
    s.update_printer_status(&[report("p1", Some("offline"), NOW + 7), report("p2", Some("no_paper"), NOW + 8)])
        .await
        .unwrap();
    let found = s.waiting_on_paused_printers(100).await.unwrap();
    let seen: Vec<(String, i64, Option<String>)> =
        found.iter().map(|w| (w.task.biz_no.clone(), w.paused_since, w.printer_state.clone())).collect();
    let want = |biz: &str, at: i64, state: &str| (biz.to_owned(), at, Some(state.to_owned()));
    assert_eq!(
        seen,
        vec![
            want("C", NOW + 7, "offline"),
            want("B", NOW + 7, "offline"),
            want("D", NOW + 7, "offline"),
            want("E", NOW + 8, "no_paper")
        ]
    );
    assert_eq!(s.waiting_on_paused_printers(2).await.unwrap().len(), 2, "at most the limit");
    // Ready again: its tickets are no longer waiting on a paused printer.
    s.update_printer_status(&[report("p2", None, NOW + 9)]).await.unwrap();
    let found = s.waiting_on_paused_printers(100).await.unwrap();
    assert_eq!(found.iter().map(|w| w.task.biz_no.as_str()).collect::<Vec<_>>(), vec!["C", "B", "D"]);
}

/// A refusal grows the task's refusal count; other changes leave it.
pub async fn refusals_are_counted(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    let a = new_task("acme", "A", "x", 1);
    s.submit_batch(vec![a.clone()]).await.unwrap();
    let mut attempts = 0;
    for refused in [true, true, false] {
        assert_eq!(s.apply_transitions(&[send(&a, attempts, NOW + 5)]).await.unwrap(), vec![true]);
        attempts += 1;
        let back = Transition {
            from: TaskState::Sent,
            expected_attempts: attempts,
            attempts,
            to: TaskState::Retrying,
            last_error: Some(if refused { "no_paper" } else { "error" }.into()),
            refused,
            ..send(&a, attempts, NOW + 6)
        };
        assert!(s.transition(&back).await.unwrap());
    }
    let t = s.get_task("acme", &a.task_id).await.unwrap().unwrap();
    assert_eq!((t.attempts, t.refusals), (3, 2));
}

/// An endpoint of tenant `acme` that nobody listens on, for the kinds in `events`.
fn hook(id: &str, events: &[&str]) -> NewWebhook {
    NewWebhook {
        tenant_id: "acme".into(),
        id: id.into(),
        url: format!("http://127.0.0.1:9/{id}"),
        secret: "shh".into(),
        format: "onceprint".into(),
        events: events.iter().map(|e| e.to_string()).collect(),
        now: NOW,
    }
}

pub(crate) fn manual_transition(t: &NewTask, from: TaskState, attempts: i32, to: TaskState, now: i64) -> Transition {
    Transition {
        task_id: t.task_id.clone(),
        from,
        expected_attempts: attempts,
        to,
        attempts,
        last_error: None,
        next_attempt_at: None,
        actor: "operator:alice".into(),
        reason: "customer left".into(),
        now,
        sent_to: None,
        sent_session: None,
        may_have_printed: false,
        event: None,
        refused: false,
    }
}

pub(crate) fn successor_of(t: &NewTask, kind: OriginKind, n: Option<i32>, printer: &str, seq: u64) -> NewTask {
    let mut s = new_task("acme", &t.biz_no, "x", seq);
    s.printer_id = printer.into();
    s.target = match kind {
        OriginKind::Reprint => format!("reprint:{}:{}", t.task_id, n.unwrap_or(0)),
        _ => format!("{}:{}", kind.as_str(), t.task_id),
    };
    s.actor = "operator:alice".into();
    s.charge = if kind == OriginKind::Reprint { 1 } else { 0 };
    s.origin =
        Some(Origin { task_id: t.task_id.clone(), kind, reprint_no: n, reason: format!("{} by alice", kind.as_str()) });
    s
}

pub async fn cancel_refunds_exactly_once(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    let t = new_task("acme", "C1", "x", 1);
    s.submit_batch(vec![t.clone()]).await.unwrap();
    let cancel = ManualChange {
        task_id: t.task_id.clone(),
        transitions: vec![manual_transition(&t, TaskState::Pending, 0, TaskState::Cancelled, NOW + 5)],
        refund: Some(t.task_id.clone()),
        successor: None,
        now: NOW + 5,
    };
    assert!(s.apply_manual(&cancel).await.unwrap());
    assert!(!s.apply_manual(&cancel).await.unwrap(), "the second cancel loses its compare-and-set");
    // Even a refund asked for without a transition cannot refund twice.
    assert!(s.apply_manual(&ManualChange { transitions: vec![], ..cancel.clone() }).await.unwrap());
    let ledger = s.ledger_entries(&t.task_id).await.unwrap();
    let kinds: Vec<_> = ledger.iter().map(|e| (e.kind.as_str(), e.amount)).collect();
    assert_eq!(kinds, vec![("charge", 1), ("refund", 1)]);
    let ev = s.task_events("acme", &t.task_id).await.unwrap().unwrap();
    assert_eq!(
        ev.last().map(|e| (e.to, e.actor.as_str(), e.reason.as_str())),
        Some((TaskState::Cancelled, "operator:alice", "customer left"))
    );
}

pub async fn reprints_hang_on_the_original(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    let t = new_task("acme", "P1", "x", 1);
    s.submit_batch(vec![t.clone()]).await.unwrap();
    assert_eq!(s.reprint_count(&t.task_id).await.unwrap(), 0);
    let r1 = successor_of(&t, OriginKind::Reprint, Some(1), "p1", 2);
    let m = ManualChange {
        task_id: t.task_id.clone(),
        transitions: vec![],
        refund: None,
        successor: Some(r1.clone()),
        now: NOW + 5,
    };
    assert!(s.apply_manual(&m).await.unwrap());
    assert_eq!(s.reprint_count(&t.task_id).await.unwrap(), 1);
    let got = s.get_task("acme", &r1.task_id).await.unwrap().unwrap();
    assert_eq!(
        (got.origin_task_id.as_deref(), got.origin_kind, got.reprint_no, got.state, got.biz_no.as_str()),
        (Some(t.task_id.as_str()), Some(OriginKind::Reprint), Some(1), TaskState::Pending, "P1")
    );
    let ev = s.task_events("acme", &r1.task_id).await.unwrap().unwrap();
    assert_eq!((ev[0].actor.as_str(), ev[0].reason.as_str()), ("operator:alice", "reprint by alice"));
    assert_eq!(s.ledger_entries(&r1.task_id).await.unwrap().len(), 1, "a reprint is a print and is charged");
    let again = s.apply_manual(&m).await;
    assert!(matches!(again, Err(StoreError::AlreadyExists(_))), "{again:?}");
    assert_eq!(s.reprint_count(&t.task_id).await.unwrap(), 1);
    let orig = s.get_task("acme", &t.task_id).await.unwrap().unwrap();
    assert_eq!(orig.successor_task_id, None, "a reprint is not a successor");
}

pub async fn transfer_links_the_successor(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    second_printer(&s).await;
    let t = new_task("acme", "T1", "x", 1);
    s.submit_batch(vec![t.clone()]).await.unwrap();
    let succ = successor_of(&t, OriginKind::Transfer, None, "p2", 2);
    let m = ManualChange {
        task_id: t.task_id.clone(),
        transitions: vec![manual_transition(&t, TaskState::Pending, 0, TaskState::Transferred, NOW + 5)],
        refund: None,
        successor: Some(succ.clone()),
        now: NOW + 5,
    };
    assert!(s.apply_manual(&m).await.unwrap());
    let orig = s.get_task("acme", &t.task_id).await.unwrap().unwrap();
    assert_eq!((orig.state, orig.successor_task_id.as_deref()), (TaskState::Transferred, Some(succ.task_id.as_str())));
    let next = s.get_task("acme", &succ.task_id).await.unwrap().unwrap();
    assert_eq!((next.printer_id.as_str(), next.origin_kind), ("p2", Some(OriginKind::Transfer)));
    assert!(s.ledger_entries(&succ.task_id).await.unwrap().is_empty(), "the order was charged once already");
    // A failed compare-and-set creates no successor.
    let other = successor_of(&t, OriginKind::Failover, None, "p2", 3);
    let m2 = ManualChange { successor: Some(other.clone()), ..m };
    assert!(!s.apply_manual(&m2).await.unwrap());
    assert_eq!(s.get_task("acme", &other.task_id).await.unwrap(), None);
}

pub async fn attention_lists_failed_and_in_doubt_oldest_first(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    let batch: Vec<NewTask> = (0..4).map(|i| new_task("acme", &format!("A{i}"), "x", i)).collect();
    s.submit_batch(batch.clone()).await.unwrap();
    // A0 fails last, A2 goes in doubt first, A1 and A3 stay pending.
    for (t, to, at) in [(&batch[2], TaskState::InDoubt, NOW + 10), (&batch[0], TaskState::Failed, NOW + 20)] {
        assert!(s.transition(&Transition { next_attempt_at: None, ..send(t, 0, at) }).await.unwrap());
        let mut done = manual_transition(t, TaskState::Sent, 1, to, at + 1);
        done.last_error = Some("why".into());
        assert!(s.transition(&done).await.unwrap());
    }
    let list = s.attention("acme", "s1", 100).await.unwrap();
    let ids: Vec<_> = list.iter().map(|t| t.task_id.clone()).collect();
    assert_eq!(ids, vec![batch[2].task_id.clone(), batch[0].task_id.clone()]);
    assert_eq!(list[0].last_error.as_deref(), Some("why"));
    assert!(s.attention("acme", "s2", 100).await.unwrap().is_empty());
}

pub async fn day_reads_for_reconciliation(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    // new_task ids are "{seq:020}-acme": seq 5..8 lie in ["00…05", "00…08").
    let batch: Vec<NewTask> = (3..10).map(|i| new_task("acme", &format!("D{i}"), "x", i)).collect();
    s.submit_batch(batch).await.unwrap();
    let from = format!("{:020}", 5);
    let to = format!("{:020}", 8);
    let got = s.tasks_created_between("acme", "s1", &from, &to).await.unwrap();
    let biz: Vec<_> = got.iter().map(|t| t.biz_no.clone()).collect();
    assert_eq!(biz.len(), 3, "{biz:?}");
    assert!(biz.contains(&"D5".to_string()) && biz.contains(&"D7".to_string()));
    assert!(s.tasks_created_between("acme", "s2", &from, &to).await.unwrap().is_empty());
    // Charges were written at NOW + seq.
    let ledger = s.ledger_between("acme", "s1", NOW + 4, NOW + 6).await.unwrap();
    assert_eq!(ledger.len(), 2);
    assert!(ledger.iter().all(|e| e.kind == "charge"));
    assert!(s.ledger_between("other", "s1", NOW, NOW + 100).await.unwrap().is_empty());
}

pub async fn a_test_message_goes_to_its_endpoint_alone_in_its_format(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    tenant(&s, "other").await;
    let bot = NewWebhook { format: "dingtalk".into(), secret: String::new(), ..hook("bot", &["task.failed"]) };
    let created = s.create_webhook(bot).await.unwrap();
    assert_eq!(created.format, "dingtalk");
    s.create_webhook(hook("ops", &["webhook.test", "task.failed"])).await.unwrap();
    let listed: Vec<(String, String)> =
        s.list_webhooks("acme").await.unwrap().into_iter().map(|w| (w.id, w.format)).collect();
    assert_eq!(listed, [("bot".into(), "dingtalk".into()), ("ops".into(), "onceprint".into())]);
    let event = |id: &str, tenant: &str| OutboxEvent {
        event_id: id.into(),
        tenant_id: tenant.into(),
        kind: "webhook.test".into(),
        payload: r#"{"type":"webhook.test"}"#.into(),
        now: NOW,
    };
    assert!(s.enqueue_webhook_test("bot", event("evt-test-1", "acme")).await.unwrap());
    assert!(!s.enqueue_webhook_test("nope", event("evt-test-2", "acme")).await.unwrap());
    assert!(!s.enqueue_webhook_test("bot", event("evt-test-3", "other")).await.unwrap(), "tenant-scoped");
    let due = s.due_webhooks(NOW + 1, 10).await.unwrap();
    let got: Vec<(&str, &str, &str, &str)> = due
        .iter()
        .map(|d| (d.webhook_id.as_str(), d.event_id.as_str(), d.format.as_str(), d.secret.as_str()))
        .collect();
    assert_eq!(got, [("bot", "evt-test-1", "dingtalk", "")], "to that endpoint alone, whatever the others take");
    let history = s.webhook_deliveries("acme", "bot", 10).await.unwrap().unwrap_or_default();
    assert_eq!(history.iter().map(|d| d.kind.as_str()).collect::<Vec<_>>(), ["webhook.test"]);
}

pub async fn alerts_go_through_the_outbox_with_the_change(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    s.create_webhook(hook("ops", &["task.failed", "printer.offline"])).await.unwrap();
    s.create_webhook(hook("audit", &["task.printed"])).await.unwrap();
    let dup = s.create_webhook(hook("ops", &[])).await;
    assert!(matches!(dup, Err(StoreError::AlreadyExists(_))), "{dup:?}");
    assert_eq!(s.list_webhooks("acme").await.unwrap().len(), 2);
    assert_eq!(s.webhook_deliveries("other", "ops", 10).await.unwrap(), None);

    let t = new_task("acme", "W1", "x", 1);
    s.submit_batch(vec![t.clone()]).await.unwrap();
    assert!(s.transition(&send(&t, 0, NOW + 1)).await.unwrap());
    let mut fail = manual_transition(&t, TaskState::Sent, 1, TaskState::Failed, NOW + 2);
    fail.event = Some(OutboxEvent {
        event_id: "evt-failed-1".into(),
        tenant_id: "acme".into(),
        kind: "task.failed".into(),
        payload: r#"{"type":"task.failed"}"#.into(),
        now: NOW + 2,
    });
    // Losing the compare-and-set writes no alert.
    let stale = Transition { expected_attempts: 7, ..fail.clone() };
    assert!(!s.transition(&stale).await.unwrap());
    assert!(s.due_webhooks(NOW + 10, 10).await.unwrap().is_empty());
    assert!(s.transition(&fail).await.unwrap());
    let due = s.due_webhooks(NOW + 10, 10).await.unwrap();
    assert_eq!(due.len(), 1, "only the endpoint that asked for task.failed: {due:?}");
    assert_eq!(
        (due[0].webhook_id.as_str(), due[0].event_id.as_str(), due[0].secret.as_str()),
        ("ops", "evt-failed-1", "shh")
    );
    assert_eq!(due[0].payload, r#"{"type":"task.failed"}"#);

    s.record_webhook_attempt(&WebhookAttempt {
        event_id: "evt-failed-1".into(),
        webhook_id: "ops".into(),
        delivered: false,
        status: Some(500),
        error: Some("HTTP 500".into()),
        next_attempt_at: Some(NOW + 1000),
        now: NOW + 10,
    })
    .await
    .unwrap();
    assert!(s.due_webhooks(NOW + 999, 10).await.unwrap().is_empty(), "backing off");
    assert_eq!(s.due_webhooks(NOW + 1000, 10).await.unwrap().len(), 1);
    s.record_webhook_attempt(&WebhookAttempt {
        event_id: "evt-failed-1".into(),
        webhook_id: "ops".into(),
        delivered: true,
        status: Some(200),
        error: None,
        next_attempt_at: None,
        now: NOW + 1001,
    })
    .await
    .unwrap();
    assert!(s.due_webhooks(NOW + 5000, 10).await.unwrap().is_empty());
    let seen = s.webhook_deliveries("acme", "ops", 10).await.unwrap().unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        (seen[0].attempts, seen[0].last_status, seen[0].delivered_at, seen[0].kind.as_str()),
        (2, Some(200), Some(NOW + 1001), "task.failed")
    );

    // A printer going offline alerts once; staying offline does not alert again.
    let down = |n: i64| PrinterStatusUpdate {
        tenant_id: "acme".into(),
        printer_id: "p1".into(),
        online: n < 0,
        last_error: Some("offline".into()),
        now: NOW + 20 + n.abs(),
        event_id: format!("evt-p-{n}"),
    };
    s.update_printer_status(&[down(-1)]).await.unwrap(); // false → true: printer.online (nobody asked)
    s.update_printer_status(&[down(2)]).await.unwrap(); // true → false: printer.offline
    s.update_printer_status(&[down(3)]).await.unwrap(); // still offline
    let due = s.due_webhooks(NOW + 100, 10).await.unwrap();
    assert_eq!(due.iter().map(|d| d.event_id.as_str()).collect::<Vec<_>>(), vec!["evt-p-2"]);
    assert!(due[0].payload.contains("printer.offline"));

    // An alert of its own (a stalled lane) reaches the endpoints that asked for it only.
    let stalled = |id: &str| OutboxEvent {
        event_id: id.into(),
        tenant_id: "acme".into(),
        kind: "printer.stalled".into(),
        payload: r#"{"type":"printer.stalled"}"#.into(),
        now: NOW + 30,
    };
    s.record_alert(&stalled("evt-s-1")).await.unwrap();
    assert_eq!(s.due_webhooks(NOW + 100, 10).await.unwrap().len(), 1, "nobody subscribed to printer.stalled");
    s.create_webhook(hook("watch", &["printer.stalled"])).await.unwrap();
    s.record_alert(&stalled("evt-s-2")).await.unwrap();
    let due = s.due_webhooks(NOW + 100, 10).await.unwrap();
    let stalls: Vec<_> = due.iter().filter(|d| d.webhook_id == "watch").map(|d| d.event_id.as_str()).collect();
    assert_eq!(stalls, vec!["evt-s-2"]);
}

/// A set-up audit for the cases below: `detail` names the step, so that the audit rows
/// each change wrote can be told apart.
fn by(step: &str) -> SetupAudit {
    SetupAudit { actor: "api_key:key-acme".into(), detail: serde_json::json!({ "step": step }) }
}

/// The `step` of each of the tenant's audit rows, newest first.
async fn audit_steps(s: &Arc<dyn Store>, tenant_id: &str) -> Vec<String> {
    s.setup_events(tenant_id, 500, None)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.detail["step"].as_str().unwrap_or("").to_owned())
        .collect()
}

pub async fn api_keys_are_listed_added_and_revoked_but_never_the_last(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    tenant(&s, "other").await;
    let revoke = |id: &str, tenant: &str, step: &str| RevokeApiKey {
        tenant_id: tenant.into(),
        id: id.into(),
        now: NOW + 10,
        audit: by(step),
    };
    // The key of the tenant's creation is listed with the id it was given.
    let keys = s.list_api_keys("acme").await.unwrap();
    assert_eq!(
        keys,
        vec![ApiKey { tenant_id: "acme".into(), id: "key-acme".into(), created_at: NOW, revoked_at: None }]
    );
    // The last active key cannot go, so the tenant cannot lock itself out.
    assert_eq!(s.revoke_api_key(revoke("key-acme", "acme", "x")).await.unwrap(), KeyRevocation::LastActiveKey);

    let second = NewApiKey {
        tenant_id: "acme".into(),
        id: "k2".into(),
        key_hash: "hash-k2".into(),
        now: NOW + 5,
        audit: by("add k2"),
    };
    let k2 = s.create_api_key(second.clone()).await.unwrap();
    assert_eq!((k2.id.as_str(), k2.created_at, k2.revoked_at), ("k2", NOW + 5, None));
    let dup = s.create_api_key(NewApiKey { key_hash: "hash-other".into(), ..second.clone() }).await;
    assert!(matches!(dup, Err(StoreError::AlreadyExists(_))), "{dup:?}");
    // A hash is unique across tenants: it alone says whose key it is.
    let same_hash = s.create_api_key(NewApiKey { tenant_id: "other".into(), id: "k9".into(), ..second }).await;
    assert!(matches!(same_hash, Err(StoreError::AlreadyExists(_))), "{same_hash:?}");
    let key = s.tenant_by_key_hash("hash-k2").await.unwrap().unwrap();
    assert_eq!((key.tenant.id.as_str(), key.key_id.as_str()), ("acme", "k2"));

    // Another tenant's key is not found, nor is an unknown id.
    assert_eq!(s.revoke_api_key(revoke("key-acme", "other", "x")).await.unwrap(), KeyRevocation::NotFound);
    assert_eq!(s.revoke_api_key(revoke("nope", "acme", "x")).await.unwrap(), KeyRevocation::NotFound);

    // The first key can go now that k2 is active; from then on it authenticates nobody.
    let KeyRevocation::Revoked(r) = s.revoke_api_key(revoke("key-acme", "acme", "revoke first")).await.unwrap() else {
        panic!("not revoked")
    };
    assert_eq!((r.row.id.as_str(), r.row.revoked_at, r.hash.as_str()), ("key-acme", Some(NOW + 10), "hash-acme"));
    assert_eq!(s.tenant_by_key_hash("hash-acme").await.unwrap(), None);
    assert!(s.tenant_by_key_hash("hash-k2").await.unwrap().is_some());
    // Again: the same answer, nothing changes, no second audit row.
    let again = RevokeApiKey { now: NOW + 99, ..revoke("key-acme", "acme", "revoke first again") };
    assert_eq!(s.revoke_api_key(again).await.unwrap(), KeyRevocation::Revoked(r));
    // k2 is now the last one.
    assert_eq!(s.revoke_api_key(revoke("k2", "acme", "x")).await.unwrap(), KeyRevocation::LastActiveKey);
    let listed: Vec<(String, Option<i64>)> =
        s.list_api_keys("acme").await.unwrap().into_iter().map(|k| (k.id, k.revoked_at)).collect();
    assert_eq!(listed, vec![("key-acme".to_string(), Some(NOW + 10)), ("k2".to_string(), None)]);
    assert_eq!(s.list_api_keys("other").await.unwrap().len(), 1);
    // Above the rows of the tenant's creation (which carry no step).
    assert_eq!(audit_steps(&s, "acme").await[..3], ["revoke first", "add k2", ""]);
}

pub async fn agent_tokens_are_listed_and_revoked(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    tenant(&s, "other").await;
    let new = |tenant: &str, id: &str, hash: &str| NewAgentToken {
        id: id.into(),
        kind: TokenKind::Agent,
        token_hash: hash.into(),
        tenant_id: tenant.into(),
        store_id: "s1".into(),
        now: NOW + 1,
        audit: by(&format!("create {id}")),
    };
    let t1 = s.create_agent_token(new("acme", "t1", "h1")).await.unwrap();
    assert_eq!(
        t1,
        AgentToken {
            tenant_id: "acme".into(),
            store_id: "s1".into(),
            id: "t1".into(),
            created_at: NOW + 1,
            revoked_at: None
        }
    );
    s.create_agent_token(new("acme", "t2", "h2")).await.unwrap();
    // Ids are per tenant.
    s.create_agent_token(new("other", "t1", "h3")).await.unwrap();
    let dup = s.create_agent_token(new("acme", "t1", "h4")).await;
    assert!(matches!(dup, Err(StoreError::AlreadyExists(_))), "{dup:?}");
    let no_store = s.create_agent_token(NewAgentToken { store_id: "s9".into(), ..new("acme", "t5", "h5") }).await;
    assert!(matches!(no_store, Err(StoreError::NotFound(_))), "{no_store:?}");
    let ids: Vec<String> =
        s.list_agent_tokens("acme", "s1", TokenKind::Agent).await.unwrap().into_iter().map(|t| t.id).collect();
    assert_eq!(ids, vec!["t1", "t2"]);
    assert!(s.list_agent_tokens("acme", "s9", TokenKind::Agent).await.unwrap().is_empty());

    let revoke = |tenant: &str, store: &str, id: &str, now: i64| RevokeAgentToken {
        tenant_id: tenant.into(),
        store_id: store.into(),
        id: id.into(),
        kind: TokenKind::Agent,
        now,
        audit: by(&format!("revoke {id}")),
    };
    assert_eq!(s.revoke_agent_token(revoke("acme", "s1", "t9", NOW)).await.unwrap(), None);
    assert_eq!(s.revoke_agent_token(revoke("acme", "s9", "t1", NOW)).await.unwrap(), None);
    let r = s.revoke_agent_token(revoke("acme", "s1", "t1", NOW + 7)).await.unwrap().unwrap();
    assert_eq!((r.row.revoked_at, r.hash.as_str()), (Some(NOW + 7), "h1"));
    assert_eq!(s.agent_by_token_hash("h1").await.unwrap(), None);
    // The other tenant's t1 and acme's t2 still work.
    assert!(s.agent_by_token_hash("h2").await.unwrap().is_some());
    assert_eq!(s.agent_by_token_hash("h3").await.unwrap().map(|a| a.tenant_id).as_deref(), Some("other"));
    // Revoking again changes nothing.
    assert_eq!(s.revoke_agent_token(revoke("acme", "s1", "t1", NOW + 50)).await.unwrap(), Some(r));
    let listed: Vec<(String, Option<i64>)> = s
        .list_agent_tokens("acme", "s1", TokenKind::Agent)
        .await
        .unwrap()
        .into_iter()
        .map(|t| (t.id, t.revoked_at))
        .collect();
    assert_eq!(listed, vec![("t1".to_string(), Some(NOW + 7)), ("t2".to_string(), None)]);
    assert_eq!(audit_steps(&s, "acme").await[..3], ["revoke t1", "create t2", "create t1"]);
}

pub async fn printers_are_edited_as_compare_and_set_and_disabled(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    tenant(&s, "other").await;
    let before = s.get_printer("acme", "p1").await.unwrap().unwrap();
    assert!(before.enabled, "printers start enabled");
    let edit = PrinterUpdate {
        tenant_id: "acme".into(),
        id: "p1".into(),
        expected_name: before.name.clone(),
        expected_transport: before.transport.clone(),
        name: "Hot kitchen".into(),
        transport: r#"{"kind":"agent","address":"tcp://10.0.0.9:9100"}"#.into(),
        now: NOW + 1,
        audit: by("edit"),
    };
    // Another tenant's printer of the same id is not touched.
    assert_eq!(s.update_printer(PrinterUpdate { tenant_id: "nobody".into(), ..edit.clone() }).await.unwrap(), None);
    let after = s.update_printer(edit.clone()).await.unwrap().unwrap();
    assert_eq!((after.name.as_str(), after.store_id.as_str()), ("Hot kitchen", "s1"));
    assert!(after.transport.contains("10.0.0.9"));
    assert_eq!(s.get_printer("acme", "p1").await.unwrap(), Some(after.clone()));
    assert_eq!(s.get_printer("other", "p1").await.unwrap().unwrap().transport, before.transport);
    // The same edit again expects what is no longer there: nothing is written.
    assert_eq!(s.update_printer(PrinterUpdate { audit: by("stale edit"), ..edit }).await.unwrap(), None);

    let flip = |enabled: bool, step: &str| PrinterEnabled {
        tenant_id: "acme".into(),
        id: "p1".into(),
        enabled,
        now: NOW + 2,
        audit: by(step),
    };
    let off = s.set_printer_enabled(flip(false, "disable")).await.unwrap().unwrap();
    assert!(!off.enabled);
    assert!(!s.get_printer("acme", "p1").await.unwrap().unwrap().enabled);
    assert!(!s.list_printers("acme", Some("s1")).await.unwrap()[0].enabled);
    assert!(s.get_printer("other", "p1").await.unwrap().unwrap().enabled);
    // Disabling a disabled printer changes nothing and writes no audit row.
    assert!(!s.set_printer_enabled(flip(false, "disable again")).await.unwrap().unwrap().enabled);
    assert_eq!(s.set_printer_enabled(PrinterEnabled { id: "p9".into(), ..flip(false, "x") }).await.unwrap(), None);
    // Disabling keeps the printer's tasks where they are: its lane is as it was.
    s.submit_batch(vec![new_task("acme", "A1", "x", 1)]).await.unwrap();
    assert!(s.lane("acme", "p1").await.unwrap().waiting.is_some());
    assert!(s.set_printer_enabled(flip(true, "enable")).await.unwrap().unwrap().enabled);
    assert_eq!(audit_steps(&s, "acme").await[..4], ["enable", "disable", "edit", ""]);
}

pub async fn stations_get_new_printer_lists(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    tenant(&s, "other").await;
    second_printer(&s).await;
    s.create_station(NewStation {
        tenant_id: "acme".into(),
        id: "hot".into(),
        store_id: "s1".into(),
        printers: vec!["p1".into()],
        now: NOW,
        audit: by("create hot"),
        failover_after_ms: Some(5_000),
    })
    .await
    .unwrap();
    assert_eq!(s.get_station("acme", "hot").await.unwrap().and_then(|s| s.failover_after_ms), Some(5_000));
    let change = StationUpdate {
        tenant_id: "acme".into(),
        id: "hot".into(),
        expected_printers: vec!["p1".into()],
        printers: vec!["p2".into(), "p1".into()],
        now: NOW + 1,
        audit: by("reorder"),
        failover_after_ms: Some(1_000),
    };
    // A printer the tenant does not have fails the change, which writes nothing.
    let missing = s.update_station(StationUpdate { printers: vec!["p1".into(), "p7".into()], ..change.clone() }).await;
    assert_eq!(missing, Err(StoreError::NotFound("printer p7".into())));
    assert_eq!(s.update_station(StationUpdate { tenant_id: "other".into(), ..change.clone() }).await.unwrap(), None);
    let st = s.update_station(change.clone()).await.unwrap().unwrap();
    assert_eq!((st.printers.clone(), st.store_id.as_str(), st.created_at), (vec!["p2".into(), "p1".into()], "s1", NOW));
    assert_eq!(st.failover_after_ms, Some(1_000));
    assert_eq!(s.get_station("acme", "hot").await.unwrap(), Some(st.clone()));
    assert_eq!(s.list_stations("acme", "s1").await.unwrap(), vec![st]);
    // Expecting the old list again: somebody changed it since, nothing is written.
    assert_eq!(s.update_station(StationUpdate { audit: by("stale"), ..change }).await.unwrap(), None);
    assert_eq!(audit_steps(&s, "acme").await[..2], ["reorder", "create hot"]);
}

pub async fn setup_changes_are_audited_per_tenant_newest_first(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    tenant(&s, "other").await;
    // The tenant, its store and its printer: three rows, in the order they were made.
    let all = s.setup_events("acme", 500, None).await.unwrap();
    let what: Vec<(&str, &str, &str)> =
        all.iter().map(|e| (e.object_kind.as_str(), e.object_id.as_str(), e.action.as_str())).collect();
    assert_eq!(what, vec![("printer", "p1", "create"), ("store", "s1", "create"), ("tenant", "acme", "create")]);
    assert!(all.iter().all(|e| e.tenant_id == "acme" && e.at == NOW));
    assert!(all.windows(2).all(|w| w[0].id > w[1].id), "newest first");
    // A failed change writes no audit row.
    let dup = s
        .create_printer(NewPrinter {
            tenant_id: "acme".into(),
            id: "p1".into(),
            store_id: "s1".into(),
            name: "x".into(),
            transport: "{}".into(),
            credential: None,
            now: NOW,
            audit: by("duplicate"),
        })
        .await;
    assert!(matches!(dup, Err(StoreError::AlreadyExists(_))), "{dup:?}");
    s.create_api_key(NewApiKey {
        tenant_id: "acme".into(),
        id: "k2".into(),
        key_hash: "hash-k2".into(),
        now: NOW + 1,
        audit: SetupAudit {
            actor: "api_key:key-acme".into(),
            detail: serde_json::json!({"nested": {"list": [1, "two", null]}}),
        },
    })
    .await
    .unwrap();
    let newest = s.setup_events("acme", 1, None).await.unwrap();
    assert_eq!(newest.len(), 1);
    let e = &newest[0];
    assert_eq!(
        (e.object_kind.as_str(), e.object_id.as_str(), e.action.as_str(), e.actor.as_str(), e.at),
        ("api_key", "k2", "create", "api_key:key-acme", NOW + 1)
    );
    assert_eq!(e.detail, serde_json::json!({"nested": {"list": [1, "two", null]}}), "detail round-trips as JSON");
    // Pages: below the last id of the previous page.
    let page2 = s.setup_events("acme", 2, Some(e.id)).await.unwrap();
    assert_eq!(page2.iter().map(|e| e.object_kind.as_str()).collect::<Vec<_>>(), vec!["printer", "store"]);
    let page3 = s.setup_events("acme", 2, Some(page2[1].id)).await.unwrap();
    assert_eq!(page3.iter().map(|e| e.object_kind.as_str()).collect::<Vec<_>>(), vec!["tenant"]);
    assert!(s.setup_events("acme", 2, Some(page3[0].id)).await.unwrap().is_empty());
    // The other tenant sees its own three rows only.
    let theirs = s.setup_events("other", 500, None).await.unwrap();
    assert_eq!(theirs.len(), 3);
    assert!(theirs.iter().all(|e| e.tenant_id == "other"));
    assert!(s.setup_events("nobody", 500, None).await.unwrap().is_empty());
}

pub async fn printer_logins_are_found_by_hash_and_rotated(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    tenant(&s, "other").await;
    let secret = |u: &str, h: &str| PrinterSecret {
        username: u.into(),
        secret_hash: h.into(),
        mqtt_hash: None,
        ha1_md5: None,
        ha1_sha256: None,
    };
    let cp = |t: &str, id: &str, login: PrinterSecret| NewPrinter {
        tenant_id: t.into(),
        id: id.into(),
        store_id: "s1".into(),
        name: "Star".into(),
        transport: r#"{"kind":"cloudprnt","mac":"00:11:62:aa:bb:cc"}"#.into(),
        credential: Some(login),
        now: NOW,
        audit: SetupAudit::default(),
    };
    s.create_printer(cp("acme", "star", secret("u-acme", "h-1"))).await.unwrap();
    let found = s.printer_by_secret_hash("h-1").await.unwrap();
    assert_eq!(
        found,
        Some(PrinterCredential { tenant_id: "acme".into(), printer_id: "star".into(), username: "u-acme".into() })
    );
    assert_eq!(s.printer_by_secret_hash("h-unknown").await.unwrap(), None);
    // A user name or password hash is unique across tenants, and a refused login leaves
    // no printer behind (one transaction).
    let taken = s.create_printer(cp("other", "star", secret("u-acme", "h-2"))).await;
    assert!(matches!(taken, Err(StoreError::AlreadyExists(_))), "{taken:?}");
    assert_eq!(s.get_printer("other", "star").await.unwrap(), None);
    // Rotation: the old password stops working in the same commit, and it is audited.
    let rotate = |id: &str, h: &str| PrinterSecretChange {
        tenant_id: "acme".into(),
        printer_id: id.into(),
        secret: secret("u-acme-2", h),
        now: NOW + 5,
        audit: by("rotate"),
    };
    assert!(s.set_printer_secret(rotate("star", "h-3")).await.unwrap());
    assert_eq!(s.printer_by_secret_hash("h-1").await.unwrap(), None);
    let found = s.printer_by_secret_hash("h-3").await.unwrap().expect("new login");
    assert_eq!((found.printer_id.as_str(), found.username.as_str()), ("star", "u-acme-2"));
    assert!(!s.set_printer_secret(rotate("nope", "h-4")).await.unwrap(), "no such printer");
    let events = s.setup_events("acme", 10, None).await.unwrap();
    assert_eq!((events[0].object_id.as_str(), events[0].action.as_str()), ("star", "rotate"));
    // An MQTT printer's login carries the MQTT server's hash too; only those are listed
    // for the MQTT server's password file, and a rotation replaces it.
    assert!(s.mqtt_logins().await.unwrap().is_empty(), "the CloudPRNT login has no MQTT hash");
    let mqtt = |u: &str, h: &str, m: &str| PrinterSecret { mqtt_hash: Some(m.into()), ..secret(u, h) };
    let mut p = cp("other", "dev", mqtt("u-dev", "h-5", "$7$101$a$b"));
    p.transport = r#"{"kind":"mqtt","protocol":"onceprint","device_id":"d1"}"#.into();
    s.create_printer(p).await.unwrap();
    let logins = s.mqtt_logins().await.unwrap();
    assert_eq!(
        logins,
        vec![MqttLogin {
            tenant_id: "other".into(),
            printer_id: "dev".into(),
            username: "u-dev".into(),
            mqtt_hash: "$7$101$a$b".into()
        }]
    );
    let again = PrinterSecretChange {
        tenant_id: "other".into(),
        printer_id: "dev".into(),
        secret: mqtt("u-dev-2", "h-6", "$7$101$c$d"),
        now: NOW + 6,
        audit: by("rotate"),
    };
    assert!(s.set_printer_secret(again).await.unwrap());
    let logins = s.mqtt_logins().await.unwrap();
    assert_eq!(
        logins.iter().map(|l| (l.username.as_str(), l.mqtt_hash.as_str())).collect::<Vec<_>>(),
        vec![("u-dev-2", "$7$101$c$d")]
    );
}

pub async fn digest_keys_of_printer_logins_are_found_by_user_name(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    let secret = |u: &str, h: &str, ha1: Option<(&str, &str)>| PrinterSecret {
        username: u.into(),
        secret_hash: h.into(),
        mqtt_hash: None,
        ha1_md5: ha1.map(|(m, _)| m.into()),
        ha1_sha256: ha1.map(|(_, s)| s.into()),
    };
    let epson = |id: &str, login: PrinterSecret| NewPrinter {
        tenant_id: "acme".into(),
        id: id.into(),
        store_id: "s1".into(),
        name: "TM".into(),
        transport: r#"{"kind":"epson_sdp"}"#.into(),
        credential: Some(login),
        now: NOW,
        audit: SetupAudit::default(),
    };
    s.create_printer(epson("tm", secret("u-tm", "h-1", Some(("md5-1", "sha-1"))))).await.unwrap();
    // A login made before Digest keys were kept has none; it is still found by name.
    s.create_printer(epson("old", secret("u-old", "h-2", None))).await.unwrap();
    assert_eq!(
        s.printer_login_by_username("u-tm").await.unwrap(),
        Some(PrinterDigestLogin {
            tenant_id: "acme".into(),
            printer_id: "tm".into(),
            username: "u-tm".into(),
            ha1_md5: Some("md5-1".into()),
            ha1_sha256: Some("sha-1".into()),
        })
    );
    let old = s.printer_login_by_username("u-old").await.unwrap().expect("the older login");
    assert_eq!((old.printer_id.as_str(), old.ha1_md5, old.ha1_sha256), ("old", None, None));
    assert_eq!(s.printer_login_by_username("u-nobody").await.unwrap(), None);
    // User names are compared exactly: another case is another (unknown) user.
    assert_eq!(s.printer_login_by_username("U-TM").await.unwrap(), None);
    // A rotation replaces the keys with the name: the old name finds nothing, and the
    // rotated older login now has keys.
    let rotate = |id: &str, login: PrinterSecret| PrinterSecretChange {
        tenant_id: "acme".into(),
        printer_id: id.into(),
        secret: login,
        now: NOW + 5,
        audit: by("rotate"),
    };
    assert!(s.set_printer_secret(rotate("old", secret("u-old-2", "h-3", Some(("md5-3", "sha-3"))))).await.unwrap());
    assert_eq!(s.printer_login_by_username("u-old").await.unwrap(), None);
    let rotated = s.printer_login_by_username("u-old-2").await.unwrap().expect("the rotated login");
    assert_eq!((rotated.ha1_md5.as_deref(), rotated.ha1_sha256.as_deref()), (Some("md5-3"), Some("sha-3")));
    // A rotation without keys takes the old keys away with the old password.
    assert!(s.set_printer_secret(rotate("tm", secret("u-tm-2", "h-4", None))).await.unwrap());
    let rotated = s.printer_login_by_username("u-tm-2").await.unwrap().expect("the rotated login");
    assert_eq!((rotated.ha1_md5, rotated.ha1_sha256), (None, None));
}

pub async fn operators_log_in_with_sessions_that_can_be_revoked(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    tenant(&s, "other").await;
    let op = |t: &str, id: &str, role: OperatorRole, stores: &[&str]| NewOperator {
        tenant_id: t.into(),
        id: id.into(),
        name: format!("Name of {id}"),
        role,
        store_ids: stores.iter().map(|s| s.to_string()).collect(),
        password_hash: format!("$argon2id$hash-of-{id}"),
        now: NOW,
        audit: by("operator"),
    };
    let amy = s.create_operator(op("acme", "amy", OperatorRole::Staff, &["s1"])).await.unwrap();
    assert_eq!((amy.role, amy.store_ids.clone()), (OperatorRole::Staff, vec!["s1".to_string()]));
    assert!(amy.may_see_store("s1") && !amy.may_see_store("s2"));
    s.create_operator(op("acme", "max", OperatorRole::Manager, &[])).await.unwrap();
    // Ids are per tenant; a taken id or a store of nobody writes nothing.
    s.create_operator(op("other", "amy", OperatorRole::Staff, &["s1"])).await.unwrap();
    let taken = s.create_operator(op("acme", "amy", OperatorRole::Manager, &[])).await;
    assert!(matches!(taken, Err(StoreError::AlreadyExists(_))), "{taken:?}");
    let nowhere = s.create_operator(op("acme", "zed", OperatorRole::Staff, &["s1", "s9"])).await;
    assert!(matches!(nowhere, Err(StoreError::NotFound(_))), "{nowhere:?}");
    let ids: Vec<String> = s.list_operators("acme").await.unwrap().into_iter().map(|o| o.id).collect();
    assert_eq!(ids, ["amy", "max"]);
    let (found, hash) = s.operator_login("acme", "amy").await.unwrap().expect("amy");
    assert_eq!((found, hash.as_str()), (amy.clone(), "$argon2id$hash-of-amy"));
    assert_eq!(s.operator_login("acme", "zed").await.unwrap(), None);
    assert_eq!(audit_steps(&s, "acme").await[..2], ["operator", "operator"]);

    let session = |hash: &str, id: &str, operator: &str, kind: SessionKind| NewOperatorSession {
        id: id.into(),
        token_hash: hash.into(),
        tenant_id: "acme".into(),
        operator_id: operator.into(),
        kind,
        csrf_token: format!("csrf-{id}"),
        created_at: NOW,
        expires_at: NOW + 1000,
    };
    s.create_operator_session(session("h1", "ses1", "amy", SessionKind::Console)).await.unwrap();
    s.create_operator_session(session("h2", "ses2", "amy", SessionKind::Token)).await.unwrap();
    s.create_operator_session(session("h3", "ses3", "max", SessionKind::Console)).await.unwrap();
    let nobody = s.create_operator_session(session("h4", "ses4", "zed", SessionKind::Console)).await;
    assert!(matches!(nobody, Err(StoreError::NotFound(_))), "{nobody:?}");
    let got = s.operator_session("h1").await.unwrap().expect("session");
    assert_eq!(
        (got.id.as_str(), got.kind, got.csrf_token.as_str(), got.expires_at, got.operator.id.as_str()),
        ("ses1", SessionKind::Console, "csrf-ses1", NOW + 1000, "amy")
    );
    assert_eq!(s.operator_session("h-unknown").await.unwrap(), None);
    // Logout revokes one session, once.
    assert!(s.revoke_operator_session("h1", NOW + 1).await.unwrap());
    assert!(!s.revoke_operator_session("h1", NOW + 2).await.unwrap());
    assert_eq!(s.operator_session("h1").await.unwrap(), None);
    assert!(s.operator_session("h2").await.unwrap().is_some());
    // Revoking an operator's sessions ends all of theirs (audited), no one else's.
    let revoke = |t: &str, id: &str| RevokeOperatorSessions {
        tenant_id: t.into(),
        operator_id: id.into(),
        now: NOW + 3,
        audit: by("revoke sessions"),
    };
    assert_eq!(s.revoke_operator_sessions(revoke("acme", "amy")).await.unwrap(), Some(1));
    assert_eq!(s.operator_session("h2").await.unwrap(), None);
    assert!(s.operator_session("h3").await.unwrap().is_some());
    assert_eq!(s.revoke_operator_sessions(revoke("acme", "zed")).await.unwrap(), None);
    assert_eq!(s.revoke_operator_sessions(revoke("other", "max")).await.unwrap(), None, "tenant-scoped");
    let events = s.setup_events("acme", 1, None).await.unwrap();
    assert_eq!((events[0].object_kind.as_str(), events[0].object_id.as_str()), ("operator", "amy"));
    assert_eq!(events[0].action, "revoke");
}

pub async fn operators_are_disabled_enabled_and_given_new_passwords(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    tenant(&s, "other").await;
    for (t, id) in [("acme", "amy"), ("acme", "max"), ("other", "amy")] {
        s.create_operator(NewOperator {
            tenant_id: t.into(),
            id: id.into(),
            name: id.into(),
            role: OperatorRole::Manager,
            store_ids: vec![],
            password_hash: format!("$argon2id$old-{id}"),
            now: NOW,
            audit: by("operator"),
        })
        .await
        .unwrap();
    }
    let session = |hash: &str, operator: &str| NewOperatorSession {
        id: format!("ses-{hash}"),
        token_hash: hash.into(),
        tenant_id: "acme".into(),
        operator_id: operator.into(),
        kind: SessionKind::Console,
        csrf_token: "csrf".into(),
        created_at: NOW,
        expires_at: NOW + 10_000,
    };
    let change = |t: &str, id: &str, change: OperatorChange, now: i64| ChangeOperator {
        tenant_id: t.into(),
        operator_id: id.into(),
        change,
        now,
        audit: by("change"),
    };
    s.create_operator_session(session("h1", "amy")).await.unwrap();
    s.create_operator_session(session("h2", "max")).await.unwrap();
    assert!(s.operator_login("acme", "amy").await.unwrap().expect("amy").0.disabled_at.is_none());

    // A disable ends the operator's sessions and keeps its first time; nobody else's.
    let off = s.change_operator(change("acme", "amy", OperatorChange::Disable, NOW + 1)).await.unwrap();
    assert_eq!(off.map(|o| o.disabled_at), Some(Some(NOW + 1)));
    let again = s.change_operator(change("acme", "amy", OperatorChange::Disable, NOW + 2)).await.unwrap();
    assert_eq!(again.map(|o| o.disabled_at), Some(Some(NOW + 1)));
    assert_eq!(s.operator_session("h1").await.unwrap(), None);
    assert!(s.operator_session("h2").await.unwrap().is_some());
    let other = s.operator_login("other", "amy").await.unwrap().expect("the other tenant's amy");
    assert!(other.0.disabled_at.is_none(), "tenant-scoped");
    let listed = s.list_operators("acme").await.unwrap();
    assert_eq!(listed.iter().map(|o| o.disabled_at.is_some()).collect::<Vec<_>>(), [true, false]);
    // A session started while disabled is not live either (the broker refuses the login
    // first; the store is the last line).
    s.create_operator_session(session("h3", "amy")).await.unwrap();
    assert_eq!(s.operator_session("h3").await.unwrap(), None);

    let on = s.change_operator(change("acme", "amy", OperatorChange::Enable, NOW + 3)).await.unwrap();
    assert_eq!(on.map(|o| o.disabled_at), Some(None));
    assert_eq!(s.operator_session("h1").await.unwrap(), None, "ended sessions stay ended");
    assert!(s.operator_session("h3").await.unwrap().is_some());

    // A new password replaces the hash and ends every session.
    let hash = "$argon2id$new-max".to_string();
    let pw = OperatorChange::Password { password_hash: hash.clone() };
    assert!(s.change_operator(change("acme", "max", pw, NOW + 4)).await.unwrap().is_some());
    assert_eq!(s.operator_login("acme", "max").await.unwrap().expect("max").1, hash);
    assert_eq!(s.operator_session("h2").await.unwrap(), None);
    assert_eq!(s.operator_login("other", "amy").await.unwrap().expect("amy").1, "$argon2id$old-amy");

    // An unlock changes nothing but is audited.
    let unlocked = s.change_operator(change("acme", "max", OperatorChange::Unlock, NOW + 5)).await.unwrap();
    assert_eq!(unlocked.map(|o| o.disabled_at), Some(None));
    let unknown = s.change_operator(change("acme", "zed", OperatorChange::Disable, NOW + 6)).await.unwrap();
    assert_eq!(unknown, None);
    let events = s.setup_events("acme", 10, None).await.unwrap();
    let steps: Vec<(String, String)> = events.iter().take(5).map(|e| (e.object_id.clone(), e.action.clone())).collect();
    let want = [("max", "update"), ("max", "update"), ("amy", "enable"), ("amy", "disable"), ("amy", "disable")];
    assert_eq!(steps, want.map(|(a, b)| (a.to_string(), b.to_string())));
}

/// Sends `t` (first attempt) at `at` and has it printed at `at + 1`.
async fn print(s: &Arc<dyn Store>, t: &NewTask, at: i64) {
    assert!(s.transition(&send(t, 0, at)).await.unwrap());
    let mut done = manual_transition(t, TaskState::Sent, 1, TaskState::Printed, at + 1);
    done.actor = "agent:a1".into();
    assert!(s.transition(&done).await.unwrap());
}

fn end_states() -> Vec<TaskState> {
    TaskState::ALL.into_iter().filter(|s| s.is_final()).collect()
}

fn prune_of(t: &Task, day: &str) -> PruneTask {
    PruneTask { task_id: t.task_id.clone(), state: t.state, updated_at: t.updated_at, business_day: day.into() }
}

pub async fn retention_prunes_finished_tasks_into_tombstones(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    tenant(&s, "other").await;
    // seq 1..=6, all created before the cutoff id (seq 10); one more after it.
    let printed = new_task("acme", "R1", "x", 1);
    let cancelled = new_task("acme", "R2", "x", 2);
    let failed = new_task("acme", "R3", "x", 3);
    let waiting = new_task("acme", "R4", "x", 4);
    let late = new_task("acme", "R5", "x", 5);
    let young = new_task("acme", "R6", "x", 11);
    let foreign = new_task("other", "R1", "x", 6);
    let all = [&printed, &cancelled, &failed, &waiting, &late, &young, &foreign];
    s.submit_batch(all.iter().map(|t| (*t).clone()).collect()).await.unwrap();
    print(&s, &printed, NOW + 20).await;
    print(&s, &foreign, NOW + 20).await;
    let cancel = ManualChange {
        task_id: cancelled.task_id.clone(),
        transitions: vec![manual_transition(&cancelled, TaskState::Pending, 0, TaskState::Cancelled, NOW + 21)],
        refund: Some(cancelled.task_id.clone()),
        successor: None,
        now: NOW + 21,
    };
    assert!(s.apply_manual(&cancel).await.unwrap());
    assert!(s.transition(&send(&failed, 0, NOW + 22)).await.unwrap());
    assert!(s.transition(&manual_transition(&failed, TaskState::Sent, 1, TaskState::Failed, NOW + 23)).await.unwrap());
    // Printed after the cutoff: finished, but not long enough ago.
    print(&s, &late, NOW + 60).await;
    print(&s, &young, NOW + 24).await;
    // A reprint of the printed task, printed too: pruned reprints still count.
    let reprint = successor_of(&printed, OriginKind::Reprint, Some(1), "p1", 7);
    let m = ManualChange {
        task_id: printed.task_id.clone(),
        transitions: vec![],
        refund: None,
        successor: Some(reprint.clone()),
        now: NOW + 25,
    };
    assert!(s.apply_manual(&m).await.unwrap());
    print(&s, &reprint, NOW + 26).await;

    let before_id = format!("{:020}", 10);
    let cutoff = NOW + 50;
    let due = s.prunable_tasks(&end_states(), &before_id, cutoff, None, 100).await.unwrap();
    let ids: Vec<&str> = due.iter().map(|t| t.task_id.as_str()).collect();
    assert_eq!(
        ids,
        vec![printed.task_id.as_str(), cancelled.task_id.as_str(), foreign.task_id.as_str(), reprint.task_id.as_str()],
        "end states changed before the cutoff, created before the cutoff id, by id"
    );
    // Paging through the primary key.
    let first = s.prunable_tasks(&end_states(), &before_id, cutoff, None, 1).await.unwrap();
    assert_eq!(first.len(), 1);
    let next = s.prunable_tasks(&end_states(), &before_id, cutoff, Some(&first[0].task_id), 2).await.unwrap();
    assert_eq!(next.iter().map(|t| t.task_id.clone()).collect::<Vec<_>>(), vec![ids[1].to_owned(), ids[2].to_owned()]);

    // A stale read prunes nothing (compare-and-set on state and last change).
    let mut stale = prune_of(&due[0], "2025-11-24");
    stale.updated_at -= 1;
    assert_eq!(s.prune_tasks(&[stale], NOW + 100).await.unwrap(), Pruned::default());
    assert!(s.get_task("acme", &printed.task_id).await.unwrap().is_some());

    let events_before: usize = {
        let mut n = 0;
        for t in &due {
            n += s.task_events(&t.tenant_id, &t.task_id).await.unwrap().unwrap().len();
        }
        n
    };
    let day_before = s.tasks_and_tombstones_created_between("acme", "s1", &format!("{:020}", 0), &before_id).await;
    let (kept_before, none) = day_before.unwrap();
    assert!(none.is_empty());
    let ledger_before = s.ledger_between("acme", "s1", NOW, NOW + 1_000).await.unwrap();
    let batch: Vec<PruneTask> = due.iter().map(|t| prune_of(t, "2025-11-24")).collect();
    let pruned = s.prune_tasks(&batch, NOW + 100).await.unwrap();
    assert_eq!(sorted_ids(pruned.task_ids.clone()), sorted_ids(ids.iter().map(|i| i.to_string()).collect()));
    assert_eq!(pruned.events as usize, events_before, "the audit events go with the tasks");
    // Pruning again finds nothing to do.
    assert_eq!(s.prune_tasks(&batch, NOW + 101).await.unwrap(), Pruned::default());

    // The task is gone with its content and trail; its tombstone keeps the rest.
    assert_eq!(s.get_task("acme", &printed.task_id).await.unwrap(), None);
    assert_eq!(s.task_content(&printed.task_id).await.unwrap(), None);
    assert_eq!(s.task_events("acme", &printed.task_id).await.unwrap(), None);
    let b = s.get_tombstone("acme", &printed.task_id).await.unwrap().expect("tombstone");
    let was = due.iter().find(|t| t.task_id == printed.task_id).unwrap();
    assert_eq!(
        b.task,
        Task { next_attempt_at: None, sent_to: None, sent_session: None, sent_at: None, ..was.clone() },
        "the tombstone keeps the task as it ended"
    );
    assert_eq!((b.business_day.as_str(), b.pruned_at), ("2025-11-24", NOW + 100));
    assert_eq!(s.get_tombstone("other", &printed.task_id).await.unwrap(), None, "tombstones are tenant-scoped");
    assert_eq!(
        s.find_tombstone(&key("acme", "R1")).await.unwrap().map(|b| b.task.task_id),
        Some(printed.task_id.clone())
    );
    assert_eq!(
        s.find_tombstone(&key("other", "R1")).await.unwrap().map(|b| b.task.task_id),
        Some(foreign.task_id.clone())
    );
    assert_eq!(s.find_tombstone(&key("acme", "R3")).await.unwrap(), None, "a failed task is not pruned");

    // The ledger stays, and the day still reads the same tasks (kept or tombstones).
    let kinds: Vec<_> = s.ledger_entries(&cancelled.task_id).await.unwrap().into_iter().map(|e| e.kind).collect();
    assert_eq!(kinds, vec!["charge", "refund"]);
    assert_eq!(s.ledger_between("acme", "s1", NOW, NOW + 1_000).await.unwrap(), ledger_before);
    let (kept, tombstones) =
        s.tasks_and_tombstones_created_between("acme", "s1", &format!("{:020}", 0), &before_id).await.unwrap();
    let kept_ids: Vec<_> = kept.iter().map(|t| t.task_id.clone()).collect();
    assert_eq!(kept_ids, vec![failed.task_id.clone(), waiting.task_id.clone(), late.task_id.clone()]);
    let mut together: Vec<Task> = kept.into_iter().chain(tombstones.into_iter().map(|b| b.task)).collect();
    together.sort_by(|a, b| a.task_id.cmp(&b.task_id));
    let strip = |t: &Task| (t.task_id.clone(), t.state, t.biz_no.clone(), t.origin_kind, t.successor_task_id.clone());
    assert_eq!(together.iter().map(strip).collect::<Vec<_>>(), kept_before.iter().map(strip).collect::<Vec<_>>());
    assert!(s.tasks_created_between("acme", "s1", &format!("{:020}", 0), &before_id).await.unwrap().len() == 3);
    assert_eq!(s.reprint_count(&printed.task_id).await.unwrap(), 1, "a pruned reprint still counts");
    let counts = s.count_by_state().await.unwrap();
    let printed_now = counts.iter().find(|(st, _)| *st == TaskState::Printed).map_or(0, |(_, n)| *n);
    assert_eq!(printed_now, 2, "late and young are kept");
}

fn sorted_ids(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

pub async fn a_pruned_key_never_creates_a_task_again(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    let t = new_task("acme", "K1", "x", 1);
    s.submit_batch(vec![t.clone()]).await.unwrap();
    print(&s, &t, NOW + 10).await;
    let done = s.get_task("acme", &t.task_id).await.unwrap().unwrap();
    let pruned = s.prune_tasks(&[prune_of(&done, "2025-11-24")], NOW + 50).await.unwrap();
    assert_eq!(pruned.task_ids, vec![t.task_id.clone()]);

    // A late replay under a new id, twice in one batch, beside a new task.
    let replay = new_task("acme", "K1", "x", 2);
    let other_content = new_task("acme", "K1", "y", 3);
    let fresh = new_task("acme", "K2", "x", 4);
    let out = s.submit_batch(vec![replay.clone(), fresh.clone(), other_content.clone()]).await.unwrap();
    match (&out[0], &out[1], &out[2]) {
        (SubmitOutcome::Pruned(a), SubmitOutcome::Created(c), SubmitOutcome::Pruned(b)) => {
            assert_eq!((a.task.task_id.as_str(), a.task.state), (t.task_id.as_str(), TaskState::Printed));
            assert_eq!(a.task.fingerprint, "fp-x", "the caller compares fingerprints for the mismatch answer");
            assert_eq!(b, a);
            assert_eq!(c.task_id, fresh.task_id);
        }
        other => panic!("{other:?}"),
    }
    // Nothing was written for the replays: no task, no event, no charge.
    assert_eq!(s.find_task(&key("acme", "K1")).await.unwrap(), None);
    for id in [&replay.task_id, &other_content.task_id] {
        assert_eq!(s.get_task("acme", id).await.unwrap(), None);
        assert!(s.ledger_entries(id).await.unwrap().is_empty(), "no second charge");
    }
    let kinds: Vec<_> = s.ledger_entries(&t.task_id).await.unwrap().into_iter().map(|e| e.kind).collect();
    assert_eq!(kinds, vec!["charge"], "the original's charge stays, once");
    // Again in a batch of its own, and many at once.
    let again = s.submit_batch(vec![new_task("acme", "K1", "x", 5)]).await.unwrap();
    assert!(matches!(&again[0], SubmitOutcome::Pruned(b) if b.task.task_id == t.task_id), "{again:?}");
    let storm: Vec<_> = (0..8u64)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move { s.submit_batch(vec![new_task("acme", "K1", "x", 100 + i)]).await })
        })
        .collect();
    for h in storm {
        let out = h.await.unwrap().unwrap();
        assert!(matches!(&out[0], SubmitOutcome::Pruned(_)), "{out:?}");
    }
    assert_eq!(s.find_task(&key("acme", "K1")).await.unwrap(), None);
    // A successor can never take a pruned key either.
    let t2 = new_task("acme", "K3", "x", 6);
    s.submit_batch(vec![t2.clone()]).await.unwrap();
    let mut succ = successor_of(&t2, OriginKind::Reprint, Some(1), "p1", 7);
    succ.target = t.target.clone();
    succ.biz_no = t.biz_no.clone();
    let m = ManualChange {
        task_id: t2.task_id.clone(),
        transitions: vec![],
        refund: None,
        successor: Some(succ),
        now: NOW,
    };
    assert!(s.apply_manual(&m).await.is_err(), "a pruned key is taken");
    assert_eq!(s.find_task(&key("acme", "K1")).await.unwrap(), None);
}

/// Two nodes ask for the same free lease at once: exactly one gets it, and the other's
/// attempts fail while the winner renews it (with the same token).
pub async fn one_holder_of_a_lease_at_a_time(s: Arc<dyn Store>) {
    let (a, b) = tokio::join!(
        s.acquire_lease("sweeper", "node-a", NOW, 5_000),
        s.acquire_lease("sweeper", "node-b", NOW, 5_000)
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert!(a.is_some() != b.is_some(), "exactly one node wins a free lease: {a:?} {b:?}");
    let (winner, loser, token) = match (a, b) {
        (Some(t), None) => ("node-a", "node-b", t),
        (None, Some(t)) => ("node-b", "node-a", t),
        _ => unreachable!(),
    };
    assert_eq!(s.acquire_lease("sweeper", loser, NOW + 1_000, 5_000).await.unwrap(), None);
    assert_eq!(
        s.acquire_lease("sweeper", winner, NOW + 1_000, 5_000).await.unwrap(),
        Some(token),
        "a renewal keeps the token"
    );
    // The renewal moved the expiry: at the first expiry the lease is still the winner's.
    assert_eq!(s.acquire_lease("sweeper", loser, NOW + 5_000, 5_000).await.unwrap(), None);
    // Leases are independent of each other.
    assert!(s.acquire_lease("retention", loser, NOW, 5_000).await.unwrap().is_some());
    // A release by a node that does not hold the lease changes nothing.
    assert!(!s.release_lease("sweeper", loser, NOW + 2_000).await.unwrap());
    assert_eq!(s.acquire_lease("sweeper", loser, NOW + 2_000, 5_000).await.unwrap(), None);
}

/// A lease its holder stopped renewing goes to the next node once it expired, with a
/// higher token; the old holder's renewal then fails. A released lease is free at once.
pub async fn expired_leases_go_to_the_next_holder_with_a_higher_token(s: Arc<dyn Store>) {
    let first = s.acquire_lease("push:webhook", "node-a", NOW, 5_000).await.unwrap().expect("free lease");
    assert_eq!(s.acquire_lease("push:webhook", "node-b", NOW + 4_999, 5_000).await.unwrap(), None);
    let second = s.acquire_lease("push:webhook", "node-b", NOW + 5_000, 5_000).await.unwrap().expect("expired lease");
    assert!(second > first, "a new holder gets a higher token: {first} then {second}");
    assert_eq!(
        s.acquire_lease("push:webhook", "node-a", NOW + 6_000, 5_000).await.unwrap(),
        None,
        "a stale holder's renewal fails"
    );
    assert!(s.release_lease("push:webhook", "node-b", NOW + 7_000).await.unwrap());
    let third = s.acquire_lease("push:webhook", "node-a", NOW + 7_000, 5_000).await.unwrap().expect("released lease");
    assert!(third > second, "the token moves on with every change of holder: {second} then {third}");
    // The lease as it stands names its holder, token and expiry.
    let row = s.lease_row("push:webhook").await.unwrap().expect("taken");
    assert_eq!(
        (row.name.as_str(), row.holder.as_str(), row.token, row.expires_at),
        ("push:webhook", "node-a", third, NOW + 12_000)
    );
    assert_eq!(s.lease_row("never-taken").await.unwrap(), None);
}

/// Sessions written by several nodes are merged: the latest `heard_at` wins, the start of
/// a session stays as first written, and a read returns what was heard since a time.
pub async fn agent_sessions_merge_what_every_node_heard(s: Arc<dyn Store>) {
    let row = |session: &str, heard: i64, node: &str| AgentSessionRow {
        tenant_id: "acme".into(),
        store_id: "s1".into(),
        agent_id: "a1".into(),
        session: session.into(),
        started_at: NOW - 10_000,
        heard_at: heard,
        open_poll: node == "node-a",
        node_id: node.into(),
    };
    s.put_agent_sessions(&[]).await.unwrap();
    s.put_agent_sessions(&[row("s-old", NOW, "node-a"), row("s-new", NOW + 500, "node-b")]).await.unwrap();
    // node-b heard s-old later; then node-a's older news arrives late and changes nothing.
    s.put_agent_sessions(&[row("s-old", NOW + 2_000, "node-b")]).await.unwrap();
    s.put_agent_sessions(&[AgentSessionRow { started_at: 0, ..row("s-old", NOW + 1_000, "node-a") }]).await.unwrap();
    let mut all = s.agent_sessions_since(NOW - 60_000).await.unwrap();
    all.sort_by(|a, b| a.session.cmp(&b.session));
    assert_eq!(all.len(), 2, "{all:?}");
    assert_eq!(all[0], row("s-new", NOW + 500, "node-b"));
    assert_eq!(all[1], row("s-old", NOW + 2_000, "node-b"));
    let recent = s.agent_sessions_since(NOW + 1_000).await.unwrap();
    assert_eq!(recent.iter().map(|r| r.session.as_str()).collect::<Vec<_>>(), vec!["s-old"]);
    // Sessions nobody heard for long are forgotten; the others stay.
    assert_eq!(s.forget_agent_sessions(NOW + 1_000).await.unwrap(), 1);
    let left = s.agent_sessions_since(NOW - 60_000).await.unwrap();
    assert_eq!(left.iter().map(|r| r.session.as_str()).collect::<Vec<_>>(), vec!["s-old"]);
}
