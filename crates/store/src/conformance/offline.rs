//! Conformance cases of offline operation: LAN keys kept by the agent-token
//! mechanism, a store's stations, and [`Store::merge_offline`] with its four merge rules.

use std::sync::Arc;

use onceprint_core::offline::{decide, AliasKind, OfflineOutcome};
use onceprint_core::TaskState;

use super::{by, manual_transition, new_task, print, prune_of, second_printer, send, successor_of, tenant, NOW};
use crate::*;

fn token(tenant: &str, id: &str, kind: TokenKind, hash: &str) -> NewAgentToken {
    NewAgentToken {
        id: id.into(),
        kind,
        token_hash: hash.into(),
        tenant_id: tenant.into(),
        store_id: "s1".into(),
        now: NOW,
        audit: by(&format!("create {id}")),
    }
}

pub async fn lan_keys_share_the_agent_token_mechanism_and_authenticate_nothing(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    s.create_agent_token(token("acme", "t1", TokenKind::Agent, "h-agent")).await.unwrap();
    s.create_agent_token(token("acme", "k1", TokenKind::Lan, "lan:h-lan")).await.unwrap();
    // Ids are one namespace for both kinds, so a revocation can never name the wrong one.
    let dup = s.create_agent_token(token("acme", "k1", TokenKind::Agent, "h-other")).await;
    assert!(matches!(dup, Err(StoreError::AlreadyExists(_))), "{dup:?}");

    // A LAN key authenticates nothing at the broker, whatever hash is asked for.
    assert_eq!(s.agent_by_token_hash("lan:h-lan").await.unwrap(), None);
    assert!(s.agent_by_token_hash("h-agent").await.unwrap().is_some());

    let ids = |list: Vec<AgentToken>| list.into_iter().map(|t| t.id).collect::<Vec<_>>();
    assert_eq!(ids(s.list_agent_tokens("acme", "s1", TokenKind::Agent).await.unwrap()), ["t1"]);
    assert_eq!(ids(s.list_agent_tokens("acme", "s1", TokenKind::Lan).await.unwrap()), ["k1"]);
    assert_eq!(
        s.active_token_hashes("acme", "s1", TokenKind::Lan).await.unwrap(),
        vec![TokenHash { id: "k1".into(), hash: "lan:h-lan".into() }]
    );
    assert!(s.active_token_hashes("acme", "s9", TokenKind::Lan).await.unwrap().is_empty());

    let revoke = |id: &str, kind: TokenKind| RevokeAgentToken {
        tenant_id: "acme".into(),
        store_id: "s1".into(),
        id: id.into(),
        kind,
        now: NOW + 5,
        audit: by(&format!("revoke {id}")),
    };
    // Each kind is revoked through its own path only.
    assert_eq!(s.revoke_agent_token(revoke("k1", TokenKind::Agent)).await.unwrap(), None);
    assert_eq!(s.revoke_agent_token(revoke("t1", TokenKind::Lan)).await.unwrap(), None);
    let r = s.revoke_agent_token(revoke("k1", TokenKind::Lan)).await.unwrap().unwrap();
    assert_eq!((r.row.revoked_at, r.hash.as_str()), (Some(NOW + 5), "lan:h-lan"));
    assert!(s.active_token_hashes("acme", "s1", TokenKind::Lan).await.unwrap().is_empty());
    let listed = s.list_agent_tokens("acme", "s1", TokenKind::Lan).await.unwrap();
    assert_eq!(listed.iter().map(|t| t.revoked_at).collect::<Vec<_>>(), [Some(NOW + 5)]);
    assert!(s.agent_by_token_hash("h-agent").await.unwrap().is_some(), "the agent token is untouched");

    let events = s.setup_events("acme", 10, None).await.unwrap();
    let lan: Vec<(&str, &str)> =
        events.iter().filter(|e| e.object_id == "k1").map(|e| (e.object_kind.as_str(), e.action.as_str())).collect();
    assert_eq!(lan, [("lan_key", "revoke"), ("lan_key", "create")]);
}

pub async fn stations_are_listed_per_store(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    for id in ["st2", "st1"] {
        s.create_station(NewStation {
            tenant_id: "acme".into(),
            id: id.into(),
            store_id: "s1".into(),
            printers: vec!["p1".into()],
            now: NOW,
            audit: SetupAudit::default(),
            failover_after_ms: None,
        })
        .await
        .unwrap();
    }
    let ids: Vec<String> = s.list_stations("acme", "s1").await.unwrap().into_iter().map(|st| st.id).collect();
    assert_eq!(ids, ["st1", "st2"]);
    assert_eq!(s.list_stations("acme", "s1").await.unwrap()[0].printers, ["p1"]);
    assert!(s.list_stations("acme", "s9").await.unwrap().is_empty());
    assert!(s.list_stations("other", "s1").await.unwrap().is_empty());
}

/// A report of tenant `t` for biz_no `biz_no` with content `c` (fingerprint `fp-{c}`, as
/// [`new_task`]), under LAN id `lan`, accepted at `at`, with `outcome`.
fn report(t: &str, lan: &str, biz_no: &str, c: &str, at: i64, outcome: OfflineOutcome) -> OfflineTask {
    let mut task = new_task(t, biz_no, c, 0);
    task.task_id = lan.into();
    task.now = at;
    task.actor = "lan:k1@agent:s1".into();
    let state = outcome.state();
    let history = match outcome {
        OfflineOutcome::Pending => vec![],
        _ => vec![
            TaskEvent {
                at: at + 10,
                from: Some(TaskState::Pending),
                to: TaskState::Sent,
                attempt: 1,
                actor: "agent:a1".into(),
                reason: "journal: started".into(),
            },
            TaskEvent {
                at: at + 20,
                from: Some(TaskState::Sent),
                to: state,
                attempt: 1,
                actor: "agent:a1".into(),
                reason: format!("journal: {}", outcome.as_str()),
            },
        ],
    };
    OfflineTask {
        lan_id: task.task_id.clone(),
        task,
        reason: "accepted on the shop LAN".into(),
        state,
        attempts: if outcome == OfflineOutcome::Pending { 0 } else { 1 },
        last_error: None,
        updated_at: at + 20,
        printed_at: (outcome == OfflineOutcome::Printed).then_some(at + 20),
        may_have_printed: outcome == OfflineOutcome::InDoubt,
        history,
        now: NOW + 1000,
    }
}

/// A planner as the engine's: the rules of `onceprint_core::offline::decide`, as a
/// compare-and-set from the task as read, or a record.
fn planner(o: &OfflineTask, outcome: OfflineOutcome) -> MergePlanner {
    let (fingerprint, lan, now) = (o.task.fingerprint.clone(), o.task.task_id.clone(), o.now);
    Arc::new(move |t: &Task| {
        let d = decide(t.state, t.fingerprint == fingerprint, outcome, &lan);
        MergeStep {
            kind: d.kind,
            transition: d.to.map(|to| Transition {
                task_id: t.task_id.clone(),
                from: t.state,
                expected_attempts: t.attempts,
                to,
                attempts: t.attempts,
                last_error: None,
                next_attempt_at: None,
                actor: "agent:a1".into(),
                reason: d.reason.clone(),
                now,
                sent_to: t.sent_to.clone(),
                sent_session: t.sent_session.clone(),
                may_have_printed: to == TaskState::InDoubt,
                event: None,
                refused: false,
            }),
            note: d.to.is_none().then(|| TaskEvent {
                at: now,
                from: Some(t.state),
                to: t.state,
                attempt: t.attempts,
                actor: "agent:a1".into(),
                reason: d.reason.clone(),
            }),
        }
    })
}

async fn merge(s: &Arc<dyn Store>, o: &OfflineTask, outcome: OfflineOutcome) -> OfflineMerge {
    s.merge_offline(o.clone(), planner(o, outcome)).await.unwrap()
}

pub async fn an_unknown_key_becomes_a_task_under_the_lan_id(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    tenant(&s, "other").await;
    let at = NOW - 3_600_000;
    let printed = report("acme", "LAN-0001", "L1", "x", at, OfflineOutcome::Printed);
    let task = match merge(&s, &printed, OfflineOutcome::Printed).await {
        OfflineMerge::Created { task, again: false, pruned: false } => task,
        other => panic!("{other:?}"),
    };
    assert_eq!((task.task_id.as_str(), task.state, task.attempts), ("LAN-0001", TaskState::Printed, 1));
    // Its business day is the agent's acceptance time: created, and charged, then.
    assert_eq!((task.created_at, task.updated_at, task.printed_at), (at, at + 20, Some(at + 20)));
    assert_eq!(s.get_task("acme", "LAN-0001").await.unwrap(), Some(task.clone()));
    let events = s.task_events("acme", "LAN-0001").await.unwrap().unwrap();
    let trail: Vec<(Option<TaskState>, TaskState, &str)> =
        events.iter().map(|e| (e.from, e.to, e.actor.as_str())).collect();
    assert_eq!(
        trail,
        [
            (None, TaskState::Pending, "lan:k1@agent:s1"),
            (Some(TaskState::Pending), TaskState::Sent, "agent:a1"),
            (Some(TaskState::Sent), TaskState::Printed, "agent:a1"),
        ]
    );
    assert_eq!((events[0].at, events[0].reason.as_str()), (at, "accepted on the shop LAN"));
    let charges = |id: &str| {
        let s = s.clone();
        let id = id.to_owned();
        async move { s.ledger_entries(&id).await.unwrap().into_iter().map(|e| (e.kind, e.at)).collect::<Vec<_>>() }
    };
    assert_eq!(charges("LAN-0001").await, [("charge".to_string(), at)]);
    // The day's ledger (reconciliation) finds the charge at the acceptance time.
    assert_eq!(s.ledger_between("acme", "s1", at, at + 1).await.unwrap().len(), 1);

    // The same report again answers as before and writes nothing.
    match merge(&s, &printed, OfflineOutcome::Printed).await {
        OfflineMerge::Created { task: again, again: true, pruned: false } => assert_eq!(again, task),
        other => panic!("{other:?}"),
    }
    assert_eq!(s.task_events("acme", "LAN-0001").await.unwrap().unwrap().len(), 3);
    assert_eq!(charges("LAN-0001").await.len(), 1, "one charge");

    // A task accepted but not printed joins its printer's lane like any new task.
    let waiting = report("acme", "LAN-0002", "L2", "x", at + 5, OfflineOutcome::Pending);
    assert!(matches!(merge(&s, &waiting, OfflineOutcome::Pending).await, OfflineMerge::Created { again: false, .. }));
    let lane = s.lane("acme", "p1").await.unwrap();
    assert_eq!(lane.waiting.map(|t| (t.task_id, t.state)), Some(("LAN-0002".into(), TaskState::Pending)));

    // A LAN id that names another key's task, or another tenant's, is taken: nothing written.
    let other_key = report("acme", "LAN-0001", "L9", "x", at, OfflineOutcome::Printed);
    assert_eq!(merge(&s, &other_key, OfflineOutcome::Printed).await, OfflineMerge::IdTaken);
    let foreign = report("other", "LAN-0001", "L1", "x", at, OfflineOutcome::Printed);
    assert_eq!(merge(&s, &foreign, OfflineOutcome::Printed).await, OfflineMerge::IdTaken);
    for (t, b) in [("acme", "L9"), ("other", "L1")] {
        let key = onceprint_core::IdempotencyKey {
            tenant_id: t.into(),
            target: "printer:p1".into(),
            biz_no: b.into(),
            print_type: "receipt".into(),
        };
        assert_eq!(s.find_task(&key).await.unwrap(), None);
    }
    assert_eq!(s.get_task("other", "LAN-0001").await.unwrap(), None);

    // A printer that does not exist (deleted since, say) is `NotFound`, nothing written.
    let mut gone = report("acme", "LAN-0003", "L3", "x", at, OfflineOutcome::Printed);
    gone.task.printer_id = "p9".into();
    let out = s.merge_offline(gone.clone(), planner(&gone, OfflineOutcome::Printed)).await;
    assert!(matches!(out, Err(StoreError::NotFound(_))), "{out:?}");
    assert_eq!(s.get_task("acme", "LAN-0003").await.unwrap(), None);
}

pub async fn a_known_key_keeps_the_lan_id_as_an_alias_and_merges_by_the_rules(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    tenant(&s, "other").await;
    let cloud = |biz_no: &str, seq: u64| new_task("acme", biz_no, "x", seq);
    let (k1, k2, k3, k4) = (cloud("K1", 1), cloud("K2", 2), cloud("K3", 3), cloud("K4", 4));
    s.submit_batch(vec![k1.clone(), k2.clone(), k3.clone(), k4.clone()]).await.unwrap();

    // Rule 2: the agent printed the same order; the cloud task had not gone out yet.
    let a = report("acme", "LAN-A", "K1", "x", NOW - 50, OfflineOutcome::Printed);
    match merge(&s, &a, OfflineOutcome::Printed).await {
        OfflineMerge::Aliased { kind: AliasKind::Merged, task, pruned: false, changed: true, again: false } => {
            assert_eq!((task.task_id.as_str(), task.state), (k1.task_id.as_str(), TaskState::Printed));
        }
        other => panic!("{other:?}"),
    }
    let alias = s.task_alias("acme", "LAN-A").await.unwrap().expect("alias");
    assert_eq!((alias.task_id.as_str(), alias.kind, alias.created_at), (k1.task_id.as_str(), AliasKind::Merged, a.now));
    assert_eq!(s.task_alias("other", "LAN-A").await.unwrap(), None, "aliases are the tenant's");
    assert_eq!(s.get_task("acme", "LAN-A").await.unwrap(), None, "no second task");
    assert!(s.ledger_entries("LAN-A").await.unwrap().is_empty(), "no second charge");
    assert_eq!(s.ledger_entries(&k1.task_id).await.unwrap().len(), 1);
    let last = s.task_events("acme", &k1.task_id).await.unwrap().unwrap().pop().unwrap();
    assert_eq!((last.from, last.to), (Some(TaskState::Pending), TaskState::Printed));
    assert!(last.reason.contains("printed offline by the store agent (LAN task LAN-A)"), "{last:?}");
    // Again: the same answer, nothing written.
    match merge(&s, &a, OfflineOutcome::Printed).await {
        OfflineMerge::Aliased { kind: AliasKind::Merged, task, changed: false, again: true, .. } => {
            assert_eq!(task.state, TaskState::Printed)
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(s.task_events("acme", &k1.task_id).await.unwrap().unwrap().len(), 2);

    // Rule 3: other content under K2, whose task is in flight: held for a person.
    assert!(s.transition(&send(&k2, 0, NOW)).await.unwrap());
    let b = report("acme", "LAN-B", "K2", "other", NOW - 40, OfflineOutcome::Printed);
    match merge(&s, &b, OfflineOutcome::Printed).await {
        OfflineMerge::Aliased { kind: AliasKind::Conflict, task, changed: true, .. } => {
            assert_eq!((task.state, task.may_have_printed), (TaskState::InDoubt, true));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(s.task_alias("acme", "LAN-B").await.unwrap().map(|a| a.kind), Some(AliasKind::Conflict));
    let attention: Vec<String> = s.attention("acme", "s1", 10).await.unwrap().into_iter().map(|t| t.task_id).collect();
    assert_eq!(attention, vec![k2.task_id.clone()]);
    assert!(s.ledger_entries("LAN-B").await.unwrap().is_empty());

    // Pending under the same key: an alias and a record; the broker's task carries on.
    let c = report("acme", "LAN-C", "K3", "x", NOW - 30, OfflineOutcome::Pending);
    match merge(&s, &c, OfflineOutcome::Pending).await {
        OfflineMerge::Aliased { kind: AliasKind::Merged, task, changed: false, again: false, .. } => {
            assert_eq!(task.state, TaskState::Pending)
        }
        other => panic!("{other:?}"),
    }
    let last = s.task_events("acme", &k3.task_id).await.unwrap().unwrap().pop().unwrap();
    assert_eq!((last.from, last.to, last.at), (Some(TaskState::Pending), TaskState::Pending, c.now));

    // Rule 4: a tombstone counts as known.
    print(&s, &k4, NOW + 10).await;
    let done = s.get_task("acme", &k4.task_id).await.unwrap().unwrap();
    s.prune_tasks(&[prune_of(&done, "2025-11-24")], NOW + 50).await.unwrap();
    let d = report("acme", "LAN-D", "K4", "x", NOW - 20, OfflineOutcome::Printed);
    match merge(&s, &d, OfflineOutcome::Printed).await {
        OfflineMerge::Aliased { kind: AliasKind::Merged, task, pruned: true, changed: false, .. } => {
            assert_eq!((task.task_id.as_str(), task.state), (k4.task_id.as_str(), TaskState::Printed))
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(s.task_alias("acme", "LAN-D").await.unwrap().map(|a| a.task_id), Some(k4.task_id.clone()));
    match merge(&s, &d, OfflineOutcome::Printed).await {
        OfflineMerge::Aliased { pruned: true, again: true, .. } => {}
        other => panic!("{other:?}"),
    }
    assert!(s.ledger_entries("LAN-D").await.unwrap().is_empty());
    assert_eq!(s.find_task(&super::key("acme", "K4")).await.unwrap(), None, "no task comes back from a tombstone");
}

/// The order a LAN copy belongs to was moved to another printer (a transfer, a failover)
/// while the shop was cut off: the upload settles the task the order lives on now, the
/// live end of the chain, not the original that moved.
pub async fn a_lan_copy_merges_into_the_task_the_order_lives_on(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    second_printer(&s).await;
    // Order `biz` submitted as lane entry `seq` and moved to `p2`: the task and its successor.
    let moved_order = |biz: &'static str, seq: u64| {
        let s = s.clone();
        async move {
            let t = new_task("acme", biz, "x", seq);
            s.submit_batch(vec![t.clone()]).await.unwrap();
            let moved = manual_transition(&t, TaskState::Pending, 0, TaskState::Transferred, NOW + 5);
            let succ = successor_of(&t, crate::OriginKind::Transfer, None, "p2", seq + 1);
            let m = ManualChange {
                task_id: t.task_id.clone(),
                transitions: vec![moved],
                refund: None,
                successor: Some(succ.clone()),
                now: NOW + 5,
            };
            assert!(s.apply_manual(&m).await.unwrap());
            (t, succ)
        }
    };
    let (t, succ) = moved_order("M1", 1).await;
    let a = report("acme", "LAN-M", "M1", "x", NOW - 50, OfflineOutcome::Printed);
    match merge(&s, &a, OfflineOutcome::Printed).await {
        OfflineMerge::Aliased { kind: AliasKind::Merged, task, changed: true, .. } => {
            assert_eq!((task.task_id.as_str(), task.state), (succ.task_id.as_str(), TaskState::Printed));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(s.task_alias("acme", "LAN-M").await.unwrap().map(|a| a.task_id), Some(succ.task_id.clone()));
    let orig = s.get_task("acme", &t.task_id).await.unwrap().unwrap();
    assert_eq!(orig.state, TaskState::Transferred, "the original stays as it was");

    // The same, once retention pruned the original (an end state) while its successor
    // still waits: the key is found in the tombstone, and the chain followed from there.
    let (t2, succ2) = moved_order("M2", 3).await;
    let orig2 = s.get_task("acme", &t2.task_id).await.unwrap().unwrap();
    let pruned = s.prune_tasks(&[prune_of(&orig2, "2025-11-24")], NOW + 50).await.unwrap();
    assert_eq!(pruned.task_ids, vec![t2.task_id.clone()]);
    let b = report("acme", "LAN-M2", "M2", "x", NOW - 50, OfflineOutcome::Printed);
    match merge(&s, &b, OfflineOutcome::Printed).await {
        OfflineMerge::Aliased { kind: AliasKind::Merged, task, pruned: false, changed: true, .. } => {
            assert_eq!((task.task_id.as_str(), task.state), (succ2.task_id.as_str(), TaskState::Printed));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(s.task_alias("acme", "LAN-M2").await.unwrap().map(|a| a.task_id), Some(succ2.task_id.clone()));
}

/// A task the agent accepted offline and did not print joins its printer's lane behind
/// what was waiting there when the broker learnt of it, and before what comes after: lanes
/// follow the order in which the broker took tasks in, whichever path brought them.
pub async fn an_offline_task_joins_the_lane_in_the_order_it_was_merged(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    let first = new_task("acme", "C1", "x", 1);
    s.submit_batch(vec![first.clone()]).await.unwrap();
    let offline = report("acme", "LAN-0001", "L1", "x", NOW - 60_000, OfflineOutcome::Pending);
    assert!(matches!(merge(&s, &offline, OfflineOutcome::Pending).await, OfflineMerge::Created { again: false, .. }));
    let last = new_task("acme", "C2", "x", 2);
    s.submit_batch(vec![last.clone()]).await.unwrap();

    let mut left = Vec::new();
    for _ in 0..3 {
        let head = s.lane("acme", "p1").await.unwrap().waiting.expect("a waiting task");
        let mut t = new_task("acme", &head.biz_no, "x", 0);
        t.task_id = head.task_id.clone();
        print(&s, &t, NOW + 100).await;
        left.push(head.biz_no);
    }
    assert_eq!(left, ["C1", "L1", "C2"]);
    assert!(s.lane("acme", "p1").await.unwrap().waiting.is_none());
}

/// A task whose LAN id the broker did not keep (the shop PC's clock was far off) is kept
/// under the broker's id, and the LAN id names it: asked again, the same report answers
/// as the first did; a LAN id another tenant's alias holds already is taken.
pub async fn a_renamed_task_is_found_under_its_lan_id(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    tenant(&s, "other").await;
    let mut o = report("acme", "LAN-SKEW-1", "R1", "x", NOW - 10_000, OfflineOutcome::Printed);
    o.task.task_id = "BRK-0001".into();
    let task = match merge(&s, &o, OfflineOutcome::Printed).await {
        OfflineMerge::Created { task, again: false, pruned: false } => task,
        other => panic!("{other:?}"),
    };
    assert_eq!((task.task_id.as_str(), task.state), ("BRK-0001", TaskState::Printed));
    let alias = s.task_alias("acme", "LAN-SKEW-1").await.unwrap().expect("the LAN id is kept");
    assert_eq!((alias.task_id.as_str(), alias.kind), ("BRK-0001", AliasKind::Renamed));
    assert_eq!(s.get_task("acme", "LAN-SKEW-1").await.unwrap(), None, "no second task under the LAN id");

    // Uploaded again (with an id minted afresh): the first answer, nothing written.
    let mut again = o.clone();
    again.task.task_id = "BRK-0002".into();
    match merge(&s, &again, OfflineOutcome::Printed).await {
        OfflineMerge::Created { task: t, again: true, pruned: false } => assert_eq!(t, task),
        other => panic!("{other:?}"),
    }
    assert_eq!(s.get_task("acme", "BRK-0002").await.unwrap(), None);
    assert_eq!(s.ledger_entries("BRK-0001").await.unwrap().len(), 1, "one charge");

    // Another tenant's report under the same LAN id cannot take it.
    let mut foreign = report("other", "LAN-SKEW-1", "R9", "x", NOW - 10_000, OfflineOutcome::Printed);
    foreign.task.task_id = "BRK-0003".into();
    assert_eq!(merge(&s, &foreign, OfflineOutcome::Printed).await, OfflineMerge::IdTaken);
    assert_eq!(s.get_task("other", "BRK-0003").await.unwrap(), None, "nothing written");
}

/// What a store agent reports under a LAN task id that was merged into a cloud task is
/// found from the cloud task's id, whatever the LAN id's time (a shop PC's clock far off
/// puts it on another day).
pub async fn device_records_under_lan_ids_are_found_from_the_task_they_were_merged_into(s: Arc<dyn Store>) {
    tenant(&s, "acme").await;
    tenant(&s, "other").await;
    let cloud = new_task("acme", "K1", "x", 1);
    s.submit_batch(vec![cloud.clone()]).await.unwrap();
    // The agent's clock was a day behind: its LAN id sorts on the day before.
    let lan = report("acme", "LAN-OLD-1", "K1", "x", NOW - 86_400_000, OfflineOutcome::Printed);
    assert!(matches!(merge(&s, &lan, OfflineOutcome::Printed).await, OfflineMerge::Aliased { .. }));
    let device = |tenant: &str, task_id: &str| DeviceLogRecord {
        tenant_id: tenant.into(),
        store_id: "s1".into(),
        task_id: task_id.into(),
        key: "K1#p1".into(),
        printer_id: "p1".into(),
        state: DeviceLogState::Printed,
        at: NOW - 86_400_000,
        agent_id: "a1".into(),
        received_at: NOW,
    };
    s.put_device_log(&[device("acme", "LAN-OLD-1"), device("other", "LAN-OLD-1")]).await.unwrap();
    let found = s.device_log_of_aliases("acme", "s1", std::slice::from_ref(&cloud.task_id)).await.unwrap();
    assert_eq!(
        found.iter().map(|r| (r.task_id.as_str(), r.state)).collect::<Vec<_>>(),
        [(cloud.task_id.as_str(), DeviceLogState::Printed)]
    );
    assert!(s.device_log_of_aliases("acme", "s9", std::slice::from_ref(&cloud.task_id)).await.unwrap().is_empty());
    assert!(s.device_log_of_aliases("other", "s1", std::slice::from_ref(&cloud.task_id)).await.unwrap().is_empty());
    assert!(s.device_log_of_aliases("acme", "s1", &[]).await.unwrap().is_empty());
}
