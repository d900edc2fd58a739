//! Task ids that are strictly increasing within this process.
//!
//! A task id carries its creation millisecond and 80 random bits. Ids order the task list
//! and a day's range of tasks, so two tickets submitted in the same millisecond still get
//! ids in submission order: within one millisecond (or if the clock steps back) the next
//! id is the previous one plus one, like a monotonic ULID. At start the generator is
//! seeded with the greatest id in the database ([`observe`]), so a clock that stepped back
//! across a restart cannot mint ids that sort before tasks already waiting. Ids from
//! several broker nodes are ordered only as well as their clocks agree, which is why lanes
//! order by the database's insertion sequence (`seq`, migration 14), not by id.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Mutex;

use onceprint_core::{Millis, TaskId};
use rand::RngCore;

/// The last id handed out, as (millisecond, random part).
struct Generator {
    last: (Millis, u128),
}

const MAX80: u128 = (1u128 << 80) - 1;

impl Generator {
    const fn new() -> Generator {
        Generator { last: (0, 0) }
    }

    fn observe(&mut self, id: &str) {
        if let Some(seen) = TaskId::parts(id) {
            if seen > self.last {
                self.last = seen;
            }
        }
    }

    fn next(&mut self, now: Millis, random: u128) -> TaskId {
        let (ms, rand) = if now > self.last.0 {
            // A fresh millisecond: leave room above the random part so increments within
            // the millisecond cannot overflow into the time bits.
            (now, random >> 1)
        } else if self.last.1 < MAX80 {
            (self.last.0, self.last.1 + 1)
        } else {
            (self.last.0 + 1, random >> 1)
        };
        self.last = (ms, rand);
        TaskId::from_parts(ms, to_bytes(rand))
    }
}

static GENERATOR: Mutex<Generator> = Mutex::new(Generator::new());

/// Tests of the real binary only (`ONCEPRINT_TEST_ID_CLOCK_OFFSET_MS`): ids are minted as
/// if the clock were this many milliseconds off, like a node whose clock is wrong.
static CLOCK_OFFSET_MS: AtomicI64 = AtomicI64::new(0);

/// Mints ids as if the clock were `ms` off (tests; 0 in production).
pub fn set_clock_offset(ms: Millis) {
    CLOCK_OFFSET_MS.store(ms, Ordering::Relaxed);
}

/// The 80 random bits as a number.
fn random80() -> u128 {
    let mut bytes = [0u8; 10];
    rand::thread_rng().fill_bytes(&mut bytes);
    bytes.iter().fold(0u128, |acc, b| (acc << 8) | u128::from(*b))
}

fn to_bytes(v: u128) -> [u8; 10] {
    let mut out = [0u8; 10];
    for (i, slot) in out.iter_mut().enumerate() {
        *slot = (v >> (8 * (9 - i))) as u8;
    }
    out
}

/// Makes every later id greater than `id` (the greatest task id in the database).
pub fn observe(id: &str) {
    GENERATOR.lock().unwrap_or_else(std::sync::PoisonError::into_inner).observe(id);
}

/// The next task id for a task created at `now`.
pub fn next_task_id(now: Millis) -> TaskId {
    let now = now.saturating_add(CLOCK_OFFSET_MS.load(Ordering::Relaxed));
    let random = random80();
    GENERATOR.lock().unwrap_or_else(std::sync::PoisonError::into_inner).next(now, random)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_increase_within_one_millisecond_and_when_the_clock_steps_back() {
        let mut g = Generator::new();
        let mut prev = g.next(1_800_000_000_000, random80());
        for now in [1_800_000_000_000, 1_800_000_000_000, 1_799_999_999_000, 1_800_000_000_001] {
            for _ in 0..1000 {
                let id = g.next(now, random80());
                assert!(id > prev, "{id} after {prev}");
                prev = id;
            }
        }
    }

    #[test]
    fn ids_stay_above_an_observed_id_from_a_clock_that_ran_ahead() {
        let mut g = Generator::new();
        let ahead = Generator::new().next(1_900_000_000_000, random80()).into_string();
        g.observe(&ahead);
        g.observe("not an id");
        let next = g.next(1_800_000_000_000, random80()).into_string();
        assert!(next > ahead, "{next} after {ahead}");
        assert_eq!(TaskId::parts(&next).map(|p| p.0), Some(1_900_000_000_000), "the later day, not the earlier");
    }
}
