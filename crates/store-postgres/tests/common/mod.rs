//! Set-up shared by the PostgreSQL backend's own tests: a fresh store per test, tenants
//! with a store and printers, tasks on a given printer, sends, and a plain connection.
//! The task builder and the clock come from the shared conformance suite.

#![allow(dead_code)]

use onceprint_core::TaskState;
use onceprint_store::conformance::{new_task, NOW};
use onceprint_store::{NewPrinter, NewStore, NewTask, NewTenant, SetupAudit, Store, Transition};
use tokio_postgres::NoTls;

/// A fresh, empty store for this test, or returns from the test (skipping it, as
/// `testing::fresh_store` has said on stderr) when no server is configured.
macro_rules! fresh_store {
    () => {
        match onceprint_store_postgres::testing::fresh_store().await {
            Some(h) => h,
            None => return,
        }
    };
}
pub(crate) use fresh_store;

/// Tenant `id` (its API key hash `hash-{id}`) with store s1.
pub async fn tenant_with_store(s: &dyn Store, id: &str) {
    s.create_tenant(NewTenant {
        id: id.into(),
        name: id.into(),
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
        timezone: "UTC".into(),
        now: NOW,
        audit: SetupAudit::default(),
    })
    .await
    .unwrap();
}

/// Printer `id` of `tenant` in store s1.
pub async fn printer(s: &dyn Store, tenant: &str, id: &str) {
    s.create_printer(NewPrinter {
        tenant_id: tenant.into(),
        id: id.into(),
        store_id: "s1".into(),
        name: id.into(),
        transport: "{}".into(),
        credential: None,
        now: NOW,
        audit: SetupAudit::default(),
    })
    .await
    .unwrap();
}

/// Tenant `id` with store s1 and printers p1 and p2.
pub async fn tenant(s: &dyn Store, id: &str) {
    tenant_with_store(s, id).await;
    for p in ["p1", "p2"] {
        printer(s, id, p).await;
    }
}

/// A submission of tenant acme for `printer`.
pub fn task_on(printer: &str, biz_no: &str, seq: u64) -> NewTask {
    let mut t = new_task("acme", biz_no, "x", seq);
    t.printer_id = printer.into();
    t.target = format!("printer:{printer}");
    t
}

/// The engine sending a pending task to `agent`, without an alert.
pub fn send(t: &NewTask, agent: &str) -> Transition {
    Transition {
        task_id: t.task_id.clone(),
        from: TaskState::Pending,
        expected_attempts: 0,
        to: TaskState::Sent,
        attempts: 1,
        last_error: None,
        next_attempt_at: Some(NOW + 30_000),
        actor: "engine".into(),
        reason: "dispatched".into(),
        now: NOW + 1,
        sent_to: Some(agent.into()),
        sent_session: Some(format!("{agent}-session")),
        may_have_printed: false,
        event: None,
        refused: false,
    }
}

/// A plain connection to the test schema, e.g. standing in for another broker.
pub async fn raw(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

/// How many events the acme task `t` has.
pub async fn events(s: &dyn Store, t: &NewTask) -> usize {
    s.task_events("acme", &t.task_id).await.unwrap().unwrap().len()
}
