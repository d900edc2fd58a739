//! CPU cost of the SQLite writer thread per new task, without HTTP or intake in the way:
//! batches of new tasks for 100 printers go straight to `Store::submit_batch`, one after
//! the other, and the process's CPU time (nearly all of it the writer thread's) is divided
//! by the tasks created. Intake on SQLite is bound by this thread (docs/BENCHMARKS.md), so
//! this figure, unlike intake's, is steady enough to compare two builds of the writer.
//!
//! `cargo run --release -p onceprint-store-sqlite --example writer_cost -- [TASKS] [BATCH]`

use std::sync::Arc;
use std::time::Instant;

use onceprint_store::{NewPrinter, NewStore, NewTask, NewTenant, SetupAudit, Store, SubmitOutcome};
use onceprint_store_sqlite::SqliteStore;

fn cpu_seconds() -> f64 {
    // utime and stime, in clock ticks (100 per second on Linux), fields 14 and 15.
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let tick = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let tasks: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(200_000);
    let batch: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(100);
    let dir = std::env::temp_dir().join(format!("onceprint-writer-cost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch folder");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(dir.join("bench.db")).expect("a fresh database"));
    let now = 1_764_000_000_000;
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
    for p in 0..100 {
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
    let task = |n: usize| NewTask {
        task_id: format!("{:020}", n),
        tenant_id: "t".into(),
        store_id: "s".into(),
        printer_id: format!("p{}", n % 100),
        station_id: None,
        target: format!("printer:p{}", n % 100),
        biz_no: format!("B{n}"),
        print_type: "receipt".into(),
        priority: 10,
        content_type: "text".into(),
        content: format!("Order B{n}\n1 x Noodles  12.00\n").into_bytes(),
        fingerprint: format!("{n:064x}"),
        actor: "tenant:t".into(),
        charge: 1,
        now: now + n as i64,
        origin: None,
    };
    // Built before the clock starts: only the store's work is measured.
    let groups: Vec<Vec<NewTask>> =
        (0..tasks).step_by(batch.max(1)).map(|n| (n..(n + batch).min(tasks)).map(task).collect()).collect();
    let (cpu0, wall0) = (cpu_seconds(), Instant::now());
    let mut created = 0;
    for group in groups {
        let out = store.submit_batch(group).await.expect("a committed batch");
        created += out.iter().filter(|o| matches!(o, SubmitOutcome::Created(_))).count();
    }
    let (cpu, wall) = (cpu_seconds() - cpu0, wall0.elapsed().as_secs_f64());
    println!(
        "{created} tasks in batches of {batch}: {:.2} µs CPU per task, {:.0} tasks/s ({:.1} s CPU, {:.1} s wall)",
        cpu * 1e6 / created as f64,
        created as f64 / wall,
        cpu,
        wall
    );
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}
