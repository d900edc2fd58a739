//! What the store examples share: the process's CPU time, a fresh database with one
//! tenant, one store and its printers, and the new tasks they submit.

use std::path::PathBuf;
use std::sync::Arc;

use onceprint_store::{NewPrinter, NewStore, NewTask, NewTenant, SetupAudit, Store};
use onceprint_store_sqlite::SqliteStore;

/// The time the examples' databases are made at (a fixed clock keeps runs alike).
pub const NOW: i64 = 1_764_000_000_000;

pub fn cpu_seconds() -> f64 {
    // utime and stime, in clock ticks (100 per second on Linux), fields 14 and 15.
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let tick = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}

/// A scratch folder named after `example` and this process, with a fresh database in it
/// holding tenant `t`, store `s` and printers `p0`… Remove the folder when done.
pub async fn fresh_store(example: &str, printers: usize) -> (PathBuf, Arc<dyn Store>) {
    let dir = std::env::temp_dir().join(format!("onceprint-{example}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch folder");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(dir.join("bench.db")).expect("a fresh database"));
    let now = NOW;
    let audit = SetupAudit::default;
    store
        .create_tenant(NewTenant {
            id: "t".into(),
            name: "T".into(),
            api_key_hash: "h".into(),
            now,
            api_key_id: "k".into(),
            audit: audit(),
        })
        .await
        .expect("tenant");
    store
        .create_store(NewStore {
            tenant_id: "t".into(),
            id: "s".into(),
            name: "S".into(),
            timezone: "UTC".into(),
            now,
            audit: audit(),
        })
        .await
        .expect("store");
    for p in 0..printers {
        store
            .create_printer(NewPrinter {
                tenant_id: "t".into(),
                id: format!("p{p}"),
                store_id: "s".into(),
                name: format!("P{p}"),
                transport: r#"{"kind":"agent","address":"tcp://127.0.0.1:9100"}"#.into(),
                credential: None,
                now,
                audit: audit(),
            })
            .await
            .expect("printer");
    }
    (dir, store)
}

/// Prints what a run cost per task (`what` names the run) and removes its scratch folder
/// once the store is closed.
pub fn finish(dir: PathBuf, store: Arc<dyn Store>, what: &str, tasks: usize, cpu: f64, wall: f64) {
    println!(
        "{what}: {:.2} µs CPU per task, {:.0} tasks/s ({cpu:.1} s CPU, {wall:.1} s wall)",
        cpu * 1e6 / tasks.max(1) as f64,
        tasks as f64 / wall
    );
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}

/// New task number `n`, round-robin over `printers` printers.
pub fn new_task(n: usize, printers: usize) -> NewTask {
    NewTask {
        task_id: format!("{:020}", n),
        tenant_id: "t".into(),
        store_id: "s".into(),
        printer_id: format!("p{}", n % printers),
        station_id: None,
        target: format!("printer:p{}", n % printers),
        biz_no: format!("B{n}"),
        print_type: "receipt".into(),
        priority: 10,
        content_type: "text".into(),
        content: format!("Order B{n}\n1 x Noodles  12.00\n").into_bytes(),
        fingerprint: format!("{n:064x}"),
        actor: "tenant:t".into(),
        charge: 1,
        now: NOW + n as i64,
        origin: None,
    }
}
