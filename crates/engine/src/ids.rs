//! Task ids that are strictly increasing within this process.
//!
//! A task id carries its creation millisecond and 80 random bits. Lanes hand out tasks in
//! (priority, id) order, so two tickets submitted in the same millisecond must still get
//! ids in submission order: within one millisecond (or if the clock steps back) the next
//! id is the previous one plus one, like a monotonic ULID. Ids from several broker nodes
//! in the same millisecond are ordered arbitrarily between nodes.

use std::sync::Mutex;

use onceprint_core::{Millis, TaskId};
use rand::RngCore;

static LAST: Mutex<(Millis, u128)> = Mutex::new((0, 0));

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

/// The next task id for a task created at `now`.
pub fn next_task_id(now: Millis) -> TaskId {
    const MAX80: u128 = (1u128 << 80) - 1;
    let mut last = LAST.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let (ms, rand) = if now > last.0 {
        // A fresh millisecond: leave room above the random part so increments within the
        // millisecond cannot overflow into the time bits.
        (now, random80() >> 1)
    } else if last.1 < MAX80 {
        (last.0, last.1 + 1)
    } else {
        (last.0 + 1, random80() >> 1)
    };
    *last = (ms, rand);
    TaskId::from_parts(ms, to_bytes(rand))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_increase_within_one_millisecond_and_when_the_clock_steps_back() {
        let mut prev = next_task_id(1_800_000_000_000);
        for now in [1_800_000_000_000, 1_800_000_000_000, 1_799_999_999_000, 1_800_000_000_001] {
            for _ in 0..1000 {
                let id = next_task_id(now);
                assert!(id > prev, "{id} after {prev}");
                prev = id;
            }
        }
    }
}
