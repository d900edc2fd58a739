//! The first gate (R5): an in-process map of recently seen idempotency keys to their task,
//! fingerprint and current state. A retry storm for a task this process has seen is
//! answered from memory; everything else falls through to the database, whose unique
//! constraint stays the final judge. The map only ever holds facts that are durable (it is
//! filled after commit), so a hit can never invent a task.
//!
//! Whoever changes a task's state in this process calls [`RecentTasks::set_state`], so the
//! state in a duplicate answer is current. Several broker nodes on one PostgreSQL each
//! keep their own gate; a node's gate then lags other nodes' transitions, which the
//! README documents for multi-node set-ups. With `--redis-url` the nodes also share a
//! gate (`crate::shared_gate`), consulted after this one misses; its answers are read by
//! task id and so never lag, and intake then reads a hit of this gate that is not in an
//! end state again by id before answering.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use onceprint_core::{IdempotencyKey, TaskState};

const SHARDS: usize = 16;

/// What the gate knows about one task.
#[derive(Debug)]
pub struct GateEntry {
    pub task_id: String,
    pub fingerprint: String,
    state: AtomicU8,
    /// Retention pruned the task: only its tombstone is left (R39).
    pruned: AtomicBool,
}

impl GateEntry {
    pub fn state(&self) -> TaskState {
        TaskState::ALL[self.state.load(Ordering::Acquire) as usize % TaskState::ALL.len()]
    }

    /// Whether the task was pruned since it was remembered: a duplicate answered from the
    /// gate then says so, as one answered from the database does.
    pub fn pruned(&self) -> bool {
        self.pruned.load(Ordering::Acquire)
    }
}

fn state_index(s: TaskState) -> u8 {
    TaskState::ALL.iter().position(|x| *x == s).unwrap_or(0) as u8
}

struct Shard {
    by_key: HashMap<String, Arc<GateEntry>>,
    /// Insertion order for eviction (oldest first).
    order: VecDeque<String>,
}

/// Bounded, sharded map key → task. Eviction is first-in-first-out: retries cluster in
/// the minutes after a submission, so the oldest keys are the least useful.
pub struct RecentTasks {
    shards: Vec<Mutex<Shard>>,
    by_task: Vec<Mutex<HashMap<String, Arc<GateEntry>>>>,
    per_shard: usize,
    hasher: std::collections::hash_map::RandomState,
}

fn flat_key(k: &IdempotencyKey) -> String {
    // NUL cannot occur in any of the parts (ids have a restricted alphabet, biz_no refuses
    // control characters), so the joined string is unambiguous.
    let mut s = String::with_capacity(k.tenant_id.len() + k.target.len() + k.biz_no.len() + k.print_type.len() + 3);
    s.push_str(&k.tenant_id);
    s.push('\0');
    s.push_str(&k.target);
    s.push('\0');
    s.push_str(&k.biz_no);
    s.push('\0');
    s.push_str(&k.print_type);
    s
}

impl RecentTasks {
    /// A gate remembering about `capacity` keys (0 disables it).
    pub fn new(capacity: usize) -> RecentTasks {
        RecentTasks {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard { by_key: HashMap::new(), order: VecDeque::new() })).collect(),
            by_task: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            per_shard: capacity.div_ceil(SHARDS),
            hasher: Default::default(),
        }
    }

    fn shard_of(&self, s: &str) -> usize {
        (self.hasher.hash_one(s) as usize) % SHARDS
    }

    /// The task this process knows under `key`, if any.
    pub fn get(&self, key: &IdempotencyKey) -> Option<Arc<GateEntry>> {
        if self.per_shard == 0 {
            return None;
        }
        let k = flat_key(key);
        let shard = self.shards[self.shard_of(&k)].lock().ok()?;
        shard.by_key.get(&k).cloned()
    }

    /// Remembers a durable task. Call only after the commit that made it durable.
    pub fn insert(&self, key: &IdempotencyKey, task_id: &str, fingerprint: &str, state: TaskState) {
        if self.per_shard == 0 {
            return;
        }
        let k = flat_key(key);
        let entry = Arc::new(GateEntry {
            task_id: task_id.to_owned(),
            fingerprint: fingerprint.to_owned(),
            state: AtomicU8::new(state_index(state)),
            pruned: AtomicBool::new(false),
        });
        let Ok(mut shard) = self.shards[self.shard_of(&k)].lock() else { return };
        if shard.by_key.contains_key(&k) {
            return;
        }
        while shard.order.len() >= self.per_shard {
            let Some(old) = shard.order.pop_front() else { break };
            if let Some(gone) = shard.by_key.remove(&old) {
                if let Ok(mut t) = self.by_task[self.shard_of(&gone.task_id)].lock() {
                    t.remove(&gone.task_id);
                }
            }
        }
        shard.order.push_back(k.clone());
        shard.by_key.insert(k, entry.clone());
        if let Ok(mut t) = self.by_task[self.shard_of(task_id)].lock() {
            t.insert(task_id.to_owned(), entry);
        }
    }

    /// Records a state change of a task, if the gate knows it.
    pub fn set_state(&self, task_id: &str, state: TaskState) {
        if let Ok(t) = self.by_task[self.shard_of(task_id)].lock() {
            if let Some(e) = t.get(task_id) {
                e.state.store(state_index(state), Ordering::Release);
            }
        }
    }

    /// Records that retention pruned a task, if the gate knows it. Called once the prune
    /// committed; the entry stays (its key, task and final state are still true), so that
    /// a retry storm for an old task is still answered from memory, now with `pruned`.
    /// (A duplicate read from the database just before the prune and remembered just
    /// after this call keeps `pruned` false until it is evicted; its task id and final
    /// state are true all the same.)
    pub fn mark_pruned(&self, task_id: &str) {
        if let Ok(t) = self.by_task[self.shard_of(task_id)].lock() {
            if let Some(e) = t.get(task_id) {
                e.pruned.store(true, Ordering::Release);
            }
        }
    }

    /// Number of remembered keys (for tests and metrics).
    pub fn len(&self) -> usize {
        self.shards.iter().filter_map(|s| s.lock().ok().map(|s| s.by_key.len())).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use onceprint_core::Target;

    fn key(n: usize) -> IdempotencyKey {
        IdempotencyKey::new("t", &Target::Printer("p".into()), &format!("B{n}"), "receipt")
    }

    #[test]
    fn remembers_updates_and_evicts_oldest() {
        let g = RecentTasks::new(32);
        g.insert(&key(0), "T0", "f0", TaskState::Pending);
        assert_eq!(g.get(&key(0)).map(|e| e.task_id.clone()), Some("T0".into()));
        g.set_state("T0", TaskState::Printed);
        assert_eq!(g.get(&key(0)).map(|e| e.state()), Some(TaskState::Printed));
        for n in 1..1000 {
            g.insert(&key(n), &format!("T{n}"), "f", TaskState::Pending);
        }
        assert!(g.len() <= 32, "bounded: {}", g.len());
        assert!(g.get(&key(0)).is_none(), "the oldest key was evicted");
        assert!(g.get(&key(999)).is_some(), "the newest key is kept");
        assert!(g.by_task.iter().map(|s| s.lock().unwrap().len()).sum::<usize>() <= 32);
    }

    #[test]
    fn a_pruned_task_is_remembered_as_pruned() {
        let g = RecentTasks::new(32);
        g.insert(&key(0), "T0", "f0", TaskState::Printed);
        assert_eq!(g.get(&key(0)).map(|e| e.pruned()), Some(false));
        g.mark_pruned("T0");
        g.mark_pruned("unknown");
        let hit = g.get(&key(0)).expect("still remembered");
        assert!(hit.pruned());
        assert_eq!((hit.task_id.as_str(), hit.state()), ("T0", TaskState::Printed));
    }

    #[test]
    fn capacity_zero_disables_the_gate() {
        let g = RecentTasks::new(0);
        g.insert(&key(1), "T1", "f", TaskState::Pending);
        assert!(g.get(&key(1)).is_none());
    }
}
