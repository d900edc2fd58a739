//! CPU cost of the SQLite writer per printed task, without HTTP, the agent or printers in
//! the way: the store's side of the delivery loop that `POST /v1/agent/acks` runs when
//! acks hand out the next job (docs/BENCHMARKS.md, "Printed tasks per second"). N tasks over P printers
//! are submitted first (not measured); then every printer's head is handed out
//! (`pending` → `sent`), and in rounds of K acks (K printers whose jobs just printed, as
//! one ack request carries them) the store reads what the acks are decided on with the
//! lanes' next heads (`Store::read_for_acks`) and applies `sent` → `printed` for the acked
//! tasks and `pending` → `sent` for the heads, with the printers' reports, in one write
//! (`Store::apply_transitions_with_reports`), as the lane engine does. The process's CPU
//! time (nearly all of it the writer thread's) is divided by the tasks printed.
//!
//! `cargo run --release -p onceprint-store-sqlite --example delivery_cost -- [TASKS] [PRINTERS] [K]`

use std::collections::VecDeque;
use std::time::Instant;

use onceprint_core::TaskState;
use onceprint_store::{NewTask, OutboxEvent, PrinterStatusUpdate, Task, Transition};

mod common;
use common::{cpu_seconds, finish, fresh_store, new_task, NOW};

/// The change that hands `task` out (`pending` → `sent`) or ends it printed.
fn change(task: &Task, to: TaskState, now: i64) -> Transition {
    let sent = to == TaskState::Sent;
    Transition {
        task_id: task.task_id.clone(),
        from: task.state,
        expected_attempts: task.attempts,
        to,
        attempts: if sent { task.attempts + 1 } else { task.attempts },
        last_error: None,
        // A task handed out carries its deadline for the ack, as the lane engine's do.
        next_attempt_at: sent.then_some(now + 30_000),
        actor: "agent:a".into(),
        reason: if sent { "claimed".into() } else { "printed".into() },
        now,
        sent_to: Some("agent:a".into()),
        sent_session: Some("session".into()),
        may_have_printed: false,
        refused: false,
        // A printed task raises its alert, as the engine's would (`task.printed`); the store
        // writes it only for a tenant with an endpoint that wants it, and this one has none.
        event: (!sent).then(|| OutboxEvent {
            event_id: format!("ev-{}", task.task_id),
            tenant_id: task.tenant_id.clone(),
            kind: "task.printed".into(),
            payload: "{}".into(),
            now,
        }),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let tasks: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(60_000);
    let printers: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(100).max(1);
    let per_request: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(40).max(1);
    let (dir, store) = fresh_store("delivery-cost", printers).await;
    let all: Vec<NewTask> = (0..tasks).map(|n| new_task(n, printers)).collect();
    for chunk in all.chunks(500) {
        store.submit_batch(chunk.to_vec()).await.expect("a committed batch");
    }
    let printer_ids: Vec<String> = (0..printers).map(|p| format!("p{p}")).collect();
    let mut now = NOW + tasks as i64 + 1;

    let (cpu0, wall0) = (cpu_seconds(), Instant::now());
    // Every lane's first job goes out, as the agent's first poll would take them.
    let heads = store.lane_heads("t", &printer_ids).await.expect("lane heads");
    let first: Vec<Transition> = heads.iter().map(|t| change(t, TaskState::Sent, now)).collect();
    store.apply_transitions_with_reports(&first, &[]).await.expect("hand-out");
    // The tasks in flight, in the order their printers finish them.
    let mut in_flight: VecDeque<String> = heads.into_iter().map(|t| t.task_id).collect();
    let (mut printed, mut requests) = (0usize, 0usize);
    while !in_flight.is_empty() {
        now += 1;
        let n = per_request.min(in_flight.len());
        let ids: Vec<String> = in_flight.drain(..n).collect();
        let read = store.read_for_acks("t", &ids, true).await.expect("the acks' read");
        let mut list: Vec<Transition> = read.tasks.iter().map(|t| change(t, TaskState::Printed, now)).collect();
        let reports: Vec<(usize, PrinterStatusUpdate)> = read
            .tasks
            .iter()
            .enumerate()
            .map(|(k, t)| {
                let report = PrinterStatusUpdate {
                    tenant_id: "t".into(),
                    printer_id: t.printer_id.clone(),
                    online: true,
                    last_error: None,
                    now,
                    event_id: format!("ev-p-{now}-{k}"),
                };
                (k, report)
            })
            .collect();
        list.extend(read.heads.iter().map(|t| change(t, TaskState::Sent, now)));
        let applied = store.apply_transitions_with_reports(&list, &reports).await.expect("the acks' write");
        assert!(applied.iter().all(|&ok| ok), "every change applies: nothing else moves these tasks");
        printed += read.tasks.len();
        requests += 1;
        in_flight.extend(read.heads.into_iter().map(|t| t.task_id));
    }
    let (cpu, wall) = (cpu_seconds() - cpu0, wall0.elapsed().as_secs_f64());
    let what = format!(
        "{printed} tasks printed over {printers} printers, {per_request} acks per request ({requests} requests)"
    );
    finish(dir, store, &what, printed, cpu, wall);
}
