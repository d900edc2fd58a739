//! CPU cost of the SQLite writer thread per new task, without HTTP or intake in the way:
//! batches of new tasks for 100 printers go straight to `Store::submit_batch`, one after
//! the other, and the process's CPU time (nearly all of it the writer thread's) is divided
//! by the tasks created. Intake on SQLite is bound by this thread (docs/BENCHMARKS.md), so
//! this figure, unlike intake's, is steady enough to compare two builds of the writer.
//!
//! `cargo run --release -p onceprint-store-sqlite --example writer_cost -- [TASKS] [BATCH]`

use std::time::Instant;

use onceprint_store::{NewTask, SubmitOutcome};

mod common;
use common::{cpu_seconds, finish, fresh_store, new_task};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let tasks: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(200_000);
    let batch: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(100);
    let (dir, store) = fresh_store("writer-cost", 100).await;
    let task = |n: usize| new_task(n, 100);
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
    finish(dir, store, &format!("{created} tasks in batches of {batch}"), created, cpu, wall);
}
