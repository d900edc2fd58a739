//! Conformance cases of the device log digest: store agents' latest journal record per
//! task, and the reconciliation read.

use std::sync::Arc;

use super::{tenant, NOW};
use crate::*;

fn record(tenant_id: &str, store_id: &str, task_id: &str, state: DeviceLogState, at: i64) -> DeviceLogRecord {
    DeviceLogRecord {
        tenant_id: tenant_id.into(),
        store_id: store_id.into(),
        task_id: task_id.into(),
        key: format!("B-{task_id}#p1"),
        printer_id: "p1".into(),
        state,
        at,
        agent_id: "a1".into(),
        received_at: NOW,
    }
}

async fn all(s: &Arc<dyn Store>, tenant_id: &str, store_id: &str) -> Vec<(String, DeviceLogState, i64)> {
    s.device_log_between(tenant_id, store_id, "", "~")
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.task_id, r.state, r.at))
        .collect()
}

pub async fn device_log_keeps_the_latest_record_per_task(s: Arc<dyn Store>) {
    use DeviceLogState::*;
    tenant(&s, "acme").await;
    let first = vec![record("acme", "s1", "T1", Printed, 100), record("acme", "s1", "T2", Failed, 100)];
    assert_eq!(s.put_device_log(&first).await.unwrap(), 2);
    assert_eq!(s.put_device_log(&first).await.unwrap(), 0, "the same records again change nothing");
    assert_eq!(s.put_device_log(&[]).await.unwrap(), 0);

    // A weaker or older record loses; a stronger one wins, with everything it says.
    assert_eq!(s.put_device_log(&[record("acme", "s1", "T1", InDoubt, 90)]).await.unwrap(), 0);
    assert_eq!(s.put_device_log(&[record("acme", "s1", "T1", InDoubt, 190)]).await.unwrap(), 0, "printed stays");
    let mut later = record("acme", "s1", "T2", Printed, 200);
    later.key = "B-T2#p2".into();
    later.printer_id = "p2".into();
    later.agent_id = "a2".into();
    later.received_at = NOW + 5;
    assert_eq!(s.put_device_log(std::slice::from_ref(&later)).await.unwrap(), 1);
    assert_eq!(all(&s, "acme", "s1").await, vec![("T1".into(), Printed, 100), ("T2".into(), Printed, 200)]);
    let stored = s.device_log_between("acme", "s1", "T2", "T3").await.unwrap();
    assert_eq!(stored, vec![later]);

    // At one instant the stronger word wins, whichever arrives first and also inside
    // one call; what is stored does not depend on the order of uploads.
    assert_eq!(s.put_device_log(&[record("acme", "s1", "T1", InDoubt, 100)]).await.unwrap(), 0);
    let same_instant = [record("acme", "s1", "T3", InDoubt, 50), record("acme", "s1", "T3", Printed, 50)];
    assert_eq!(s.put_device_log(&same_instant).await.unwrap(), 1);
    let reversed = [same_instant[1].clone(), same_instant[0].clone()];
    assert_eq!(s.put_device_log(&reversed).await.unwrap(), 0);
    let mut steps = vec![
        record("acme", "s1", "T4", Failed, 10),
        record("acme", "s1", "T4", InDoubt, 30),
        record("acme", "s1", "T4", Printed, 20),
        record("acme", "s1", "T4", Failed, 30),
    ];
    for r in &steps {
        s.put_device_log(std::slice::from_ref(r)).await.unwrap();
    }
    steps.reverse();
    for r in &steps {
        s.put_device_log(std::slice::from_ref(r)).await.unwrap();
    }
    assert_eq!(s.put_device_log(&steps).await.unwrap(), 0);
    let t3_t4 = s.device_log_between("acme", "s1", "T3", "T5").await.unwrap();
    assert_eq!(
        t3_t4.iter().map(|r| (r.state, r.at)).collect::<Vec<_>>(),
        vec![(Printed, 50), (Printed, 20)],
        "the printer's confirmation, whatever the agent's clock said of the other records"
    );
    // Within one state the later record wins.
    let failed = [record("acme", "s1", "T5", Failed, 10), record("acme", "s1", "T5", Failed, 40)];
    assert_eq!(s.put_device_log(&failed).await.unwrap(), 1);
    assert_eq!(s.put_device_log(&[record("acme", "s1", "T5", Failed, 20)]).await.unwrap(), 0);
    let t5 = s.device_log_between("acme", "s1", "T5", "T6").await.unwrap();
    assert_eq!(t5.iter().map(|r| (r.state, r.at)).collect::<Vec<_>>(), vec![(Failed, 40)]);
    // The rule of the backends is the Rust one.
    assert!(record("t", "s", "x", InDoubt, 30).supersedes(&record("t", "s", "x", Failed, 30)));
    assert!(record("t", "s", "x", Printed, 20).supersedes(&record("t", "s", "x", InDoubt, 30)));
    assert!(!record("t", "s", "x", Failed, 90).supersedes(&record("t", "s", "x", InDoubt, 30)));
}

pub async fn device_log_is_read_by_store_and_task_id_range(s: Arc<dyn Store>) {
    use DeviceLogState::*;
    tenant(&s, "acme").await;
    tenant(&s, "other").await;
    s.create_store(NewStore {
        tenant_id: "acme".into(),
        id: "s2".into(),
        name: "Second".into(),
        timezone: "UTC".into(),
        now: NOW,
        audit: SetupAudit::default(),
    })
    .await
    .unwrap();
    let id = |n: u64| format!("{n:020}-x");
    let mut batch: Vec<DeviceLogRecord> = (3..10).map(|n| record("acme", "s1", &id(n), Printed, n as i64)).collect();
    // The same task ids in another store of the tenant and in another tenant's s1.
    batch.push(record("acme", "s2", &id(5), Failed, 1));
    batch.push(record("other", "s1", &id(6), InDoubt, 1));
    assert_eq!(s.put_device_log(&batch).await.unwrap(), 9);
    let got = s.device_log_between("acme", "s1", &id(5), &id(8)).await.unwrap();
    assert_eq!(got.iter().map(|r| r.task_id.clone()).collect::<Vec<_>>(), vec![id(5), id(6), id(7)]);
    assert!(got.iter().all(|r| r.state == Printed && r.tenant_id == "acme" && r.store_id == "s1"));
    assert_eq!(all(&s, "acme", "s2").await, vec![(id(5), Failed, 1)]);
    assert_eq!(all(&s, "other", "s1").await, vec![(id(6), InDoubt, 1)]);
    assert!(s.device_log_between("acme", "nope", "", "~").await.unwrap().is_empty());

    // A record for a store that does not exist is refused, and with it the whole call.
    let mixed = [record("acme", "s1", "Z1", Printed, 1), record("acme", "nope", "Z2", Printed, 1)];
    assert!(matches!(s.put_device_log(&mixed).await, Err(StoreError::NotFound(_))), "unknown store");
    assert!(s.device_log_between("acme", "s1", "Z", "~").await.unwrap().is_empty(), "nothing of it was written");
}
