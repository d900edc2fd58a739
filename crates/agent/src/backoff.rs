//! Exponential backoff with jitter for talking to the broker.

use rand::Rng;
use std::time::Duration;

/// 0.5 s doubling to a 30 s cap by default. Each delay is drawn uniformly from the upper
/// half of the current step ("equal jitter"), so that the agents of many stores that lost
/// the broker at the same moment do not all come back in the same instant, while none of
/// them retries much sooner than the step says.
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    failures: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new(Duration::from_millis(500), Duration::from_secs(30))
    }
}

impl Backoff {
    pub fn new(base: Duration, cap: Duration) -> Backoff {
        Backoff { base, cap, failures: 0 }
    }

    /// The delay before the next try after one more failure.
    pub fn next_delay(&mut self) -> Duration {
        let step = self.step();
        self.failures = self.failures.saturating_add(1);
        let half = step / 2;
        let extra_ms = rand::thread_rng().gen_range(0..=half.as_millis().min(u64::MAX as u128) as u64);
        half + Duration::from_millis(extra_ms)
    }

    /// The current step without jitter.
    pub fn step(&self) -> Duration {
        // 2^16 × 0.5 s is far past any sensible cap, so the shift never needs more.
        let factor = 1u32 << self.failures.min(16);
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// Failures since the last success.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_half_a_second_to_the_cap_with_jitter_in_the_upper_half() {
        let mut b = Backoff::default();
        let expected = [500u64, 1000, 2000, 4000, 8000, 16000, 30000, 30000];
        for step in expected {
            assert_eq!(b.step(), Duration::from_millis(step));
            let d = b.next_delay();
            assert!(d >= Duration::from_millis(step / 2) && d <= Duration::from_millis(step), "{d:?} for {step}");
        }
        b.reset();
        assert_eq!(b.step(), Duration::from_millis(500));
    }
}
