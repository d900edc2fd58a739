//! The first gate: an in-process map of recently seen idempotency keys to their task,
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

use std::collections::VecDeque;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use hashbrown::HashTable;
use onceprint_core::{IdempotencyKey, TaskState};

const SHARDS: usize = 16;

/// What the gate knows about one task.
#[derive(Debug)]
pub struct GateEntry {
    pub task_id: String,
    pub fingerprint: String,
    state: AtomicU8,
    /// Retention pruned the task: only its tombstone is left.
    pruned: AtomicBool,
    /// The key's parts joined by NUL (see [`key_is`]), and its hash and the task id's, so
    /// that eviction finds both table slots without hashing or comparing strings again.
    key: Box<str>,
    key_hash: u64,
    task_hash: u64,
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
    by_key: HashTable<Arc<GateEntry>>,
    /// Insertion order for eviction (oldest first).
    order: VecDeque<Arc<GateEntry>>,
}

/// Bounded, sharded map key → task. Eviction is first-in-first-out: retries cluster in
/// the minutes after a submission, so the oldest keys are the least useful.
///
/// Every submission that reaches the database passes here twice (a look-up before, a
/// remembered answer after), so the map hashes each key once, with the process's random
/// SipHash keys (biz_no values come from outside: no hash flooding), and keeps that hash
/// with the entry: shard, slot and eviction all reuse it.
pub struct RecentTasks {
    shards: Vec<Mutex<Shard>>,
    by_task: Vec<Mutex<HashTable<Arc<GateEntry>>>>,
    per_shard: usize,
    hasher: std::collections::hash_map::RandomState,
}

/// The four parts joined by NUL. NUL cannot occur in any of them (ids have a restricted
/// alphabet, biz_no refuses control characters), so the joined string is unambiguous.
fn flat_key(k: &IdempotencyKey) -> Box<str> {
    let mut s = String::with_capacity(k.tenant_id.len() + k.target.len() + k.biz_no.len() + k.print_type.len() + 3);
    for (i, part) in [&k.tenant_id, &k.target, &k.biz_no, &k.print_type].into_iter().enumerate() {
        if i > 0 {
            s.push('\0');
        }
        s.push_str(part);
    }
    s.into_boxed_str()
}

/// Whether `flat` is [`flat_key`] of `k`, without building it.
fn key_is(flat: &str, k: &IdempotencyKey) -> bool {
    let mut rest = flat;
    for (i, part) in [&k.tenant_id, &k.target, &k.biz_no, &k.print_type].into_iter().enumerate() {
        if i > 0 {
            let Some(r) = rest.strip_prefix('\0') else { return false };
            rest = r;
        }
        let Some(r) = rest.strip_prefix(part.as_str()) else { return false };
        rest = r;
    }
    rest.is_empty()
}

/// The shard of a hash. The table inside a shard places entries by the low bits and tags
/// them with the top seven, so the shard takes four bits from neither end.
fn shard_index(hash: u64) -> usize {
    ((hash >> 40) as usize) % SHARDS
}

impl RecentTasks {
    /// A gate remembering about `capacity` keys (0 disables it).
    pub fn new(capacity: usize) -> RecentTasks {
        RecentTasks {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(Shard { by_key: HashTable::new(), order: VecDeque::new() }))
                .collect(),
            by_task: (0..SHARDS).map(|_| Mutex::new(HashTable::new())).collect(),
            per_shard: capacity.div_ceil(SHARDS),
            hasher: Default::default(),
        }
    }

    /// The hash of a key: of its parts as [`flat_key`] joins them, without joining them.
    fn key_hash(&self, k: &IdempotencyKey) -> u64 {
        let mut h = self.hasher.build_hasher();
        for (i, part) in [&k.tenant_id, &k.target, &k.biz_no, &k.print_type].into_iter().enumerate() {
            if i > 0 {
                h.write_u8(0);
            }
            h.write(part.as_bytes());
        }
        h.finish()
    }

    fn task_hash(&self, task_id: &str) -> u64 {
        let mut h = self.hasher.build_hasher();
        h.write(task_id.as_bytes());
        h.finish()
    }

    /// The task this process knows under `key`, if any.
    pub fn get(&self, key: &IdempotencyKey) -> Option<Arc<GateEntry>> {
        if self.per_shard == 0 {
            return None;
        }
        let hash = self.key_hash(key);
        let shard = self.shards[shard_index(hash)].lock().ok()?;
        shard.by_key.find(hash, |e| e.key_hash == hash && key_is(&e.key, key)).cloned()
    }

    /// Remembers a durable task. Call only after the commit that made it durable.
    pub fn insert(&self, key: &IdempotencyKey, task_id: &str, fingerprint: &str, state: TaskState) {
        if self.per_shard == 0 {
            return;
        }
        let hash = self.key_hash(key);
        let Ok(mut shard) = self.shards[shard_index(hash)].lock() else { return };
        if shard.by_key.find(hash, |e| e.key_hash == hash && key_is(&e.key, key)).is_some() {
            return;
        }
        while shard.order.len() >= self.per_shard {
            let Some(old) = shard.order.pop_front() else { break };
            if let Ok(found) = shard.by_key.find_entry(old.key_hash, |e| Arc::ptr_eq(e, &old)) {
                found.remove();
            }
            if let Ok(mut t) = self.by_task[shard_index(old.task_hash)].lock() {
                if let Ok(found) = t.find_entry(old.task_hash, |e| Arc::ptr_eq(e, &old)) {
                    found.remove();
                }
            }
        }
        let entry = Arc::new(GateEntry {
            task_id: task_id.to_owned(),
            fingerprint: fingerprint.to_owned(),
            state: AtomicU8::new(state_index(state)),
            pruned: AtomicBool::new(false),
            key: flat_key(key),
            key_hash: hash,
            task_hash: self.task_hash(task_id),
        });
        shard.order.push_back(entry.clone());
        shard.by_key.insert_unique(hash, entry.clone(), |e| e.key_hash);
        // One task is remembered under one key at most: intake remembers a task under the
        // key it was found by, and a task has exactly one key. A second entry for the task
        // id (a damaged database answering two keys with one task) would only shadow the
        // first for `set_state`, never answer a key wrongly.
        if let Ok(mut t) = self.by_task[shard_index(entry.task_hash)].lock() {
            let task_hash = entry.task_hash;
            t.insert_unique(task_hash, entry, |e| e.task_hash);
        }
    }

    /// The entry of a task id, if the gate knows it.
    fn with_task(&self, task_id: &str, f: impl FnOnce(&GateEntry)) {
        let hash = self.task_hash(task_id);
        if let Ok(t) = self.by_task[shard_index(hash)].lock() {
            if let Some(e) = t.find(hash, |e| e.task_hash == hash && *e.task_id == *task_id) {
                f(e);
            }
        }
    }

    /// Records a state change of a task, if the gate knows it.
    pub fn set_state(&self, task_id: &str, state: TaskState) {
        self.with_task(task_id, |e| e.state.store(state_index(state), Ordering::Release));
    }

    /// Records that retention pruned a task, if the gate knows it. Called once the prune
    /// committed; the entry stays (its key, task and final state are still true), so that
    /// a retry storm for an old task is still answered from memory, now with `pruned`.
    /// (A duplicate read from the database just before the prune and remembered just
    /// after this call keeps `pruned` false until it is evicted; its task id and final
    /// state are true all the same.)
    pub fn mark_pruned(&self, task_id: &str) {
        self.with_task(task_id, |e| e.pruned.store(true, Ordering::Release));
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
    fn keys_that_join_alike_stay_apart() {
        // The same characters split differently between the parts are different keys.
        let a =
            IdempotencyKey { tenant_id: "t".into(), target: "p:1".into(), biz_no: "B1".into(), print_type: "r".into() };
        let b =
            IdempotencyKey { tenant_id: "t".into(), target: "p:1B".into(), biz_no: "1".into(), print_type: "r".into() };
        let g = RecentTasks::new(64);
        g.insert(&a, "TA", "fa", TaskState::Pending);
        assert!(g.get(&b).is_none());
        g.insert(&b, "TB", "fb", TaskState::Pending);
        assert_eq!(g.get(&a).map(|e| e.task_id.clone()), Some("TA".into()));
        assert_eq!(g.get(&b).map(|e| e.task_id.clone()), Some("TB".into()));
        assert!(key_is(&flat_key(&a), &a));
        assert!(!key_is(&flat_key(&a), &b));
        let mut longer = a.clone();
        longer.print_type.push('x');
        assert!(!key_is(&flat_key(&a), &longer) && !key_is(&flat_key(&longer), &a));
    }

    #[test]
    fn a_second_insert_of_a_key_keeps_the_first_task() {
        let g = RecentTasks::new(64);
        g.insert(&key(1), "T1", "f", TaskState::Pending);
        g.insert(&key(1), "T2", "g", TaskState::Printed);
        let hit = g.get(&key(1)).expect("remembered");
        assert_eq!((hit.task_id.as_str(), hit.fingerprint.as_str(), hit.state()), ("T1", "f", TaskState::Pending));
        assert_eq!(g.len(), 1);
    }

    #[test]
    fn evicted_tasks_take_no_state_changes() {
        let g = RecentTasks::new(16);
        for n in 0..200 {
            g.insert(&key(n), &format!("T{n}"), "f", TaskState::Pending);
            // Every task id in the by-task index still has its key in the key index.
            g.set_state(&format!("T{n}"), TaskState::Sent);
        }
        for n in 0..200 {
            g.set_state(&format!("T{n}"), TaskState::Printed);
        }
        let by_task: usize = g.by_task.iter().map(|s| s.lock().unwrap().len()).sum();
        assert_eq!(by_task, g.len(), "both indexes hold the same entries");
        assert_eq!(g.get(&key(199)).map(|e| e.state()), Some(TaskState::Printed));
        assert!(g.get(&key(0)).is_none());
    }

    #[test]
    fn capacity_zero_disables_the_gate() {
        let g = RecentTasks::new(0);
        g.insert(&key(1), "T1", "f", TaskState::Pending);
        assert!(g.get(&key(1)).is_none());
    }
}
