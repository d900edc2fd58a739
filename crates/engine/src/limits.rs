//! Rate limits: one token bucket per caller (a tenant, a store's agent), so that one
//! caller's retry storm is refused cheaply, in memory, before it reaches the database
//! that every other caller shares.
//!
//! A bucket holds at most `burst` tokens and gains `per_second` tokens a second; each
//! request takes one. An empty bucket answers with the seconds until the next token, for
//! `Retry-After`. Buckets live in memory per process: with several nodes each node limits
//! on its own (a tenant may reach N × the limit across N nodes), which is the usual
//! trade-off of local limiting and keeps the check free of IO.

use std::collections::HashMap;
use std::sync::Mutex;

use onceprint_core::Millis;

/// A limit: sustained requests per second and the burst allowed on top.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    pub per_second: f64,
    pub burst: f64,
}

impl RateLimit {
    /// A limit of `per_second` with a burst of `burst` (at least one request).
    pub fn new(per_second: f64, burst: f64) -> RateLimit {
        RateLimit { per_second: per_second.max(0.001), burst: burst.max(1.0) }
    }

    /// This limit raised to at least `per_unit` × `units` a second, the burst raised in the
    /// same proportion: the budget of a caller whose honest traffic grows with what it
    /// serves (a store agent with its printers). Never below this limit.
    pub fn at_least_per_unit(self, per_unit: f64, units: usize) -> RateLimit {
        let wanted = per_unit.max(0.0) * units as f64;
        if !wanted.is_finite() || wanted <= self.per_second {
            return self;
        }
        let factor = wanted / self.per_second;
        RateLimit { per_second: wanted, burst: self.burst * factor }
    }
}

/// The caller is over its limit; a token is back after this many whole seconds (≥ 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limited {
    pub retry_after_secs: u64,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Millis,
    /// The limit the caller had at its last request (a caller's limit may change, e.g.
    /// with the printers its store has), so that a trim judges "full" by its own burst.
    limit: RateLimit,
}

/// Buckets are spread over shards so that callers on different cores rarely wait for the
/// same lock; the work under a lock is a few arithmetic operations.
const SHARDS: usize = 16;
/// A shard with more buckets than this drops the ones that are full again (a full bucket
/// is the same as no bucket), so memory follows the callers active lately.
const SHARD_TRIM_AT: usize = 4096;

/// Token buckets keyed by caller.
#[derive(Debug)]
pub struct RateLimiter {
    limit: RateLimit,
    shards: Vec<Mutex<HashMap<String, Bucket>>>,
}

impl RateLimiter {
    pub fn new(limit: RateLimit) -> RateLimiter {
        RateLimiter { limit, shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect() }
    }

    pub fn limit(&self) -> RateLimit {
        self.limit
    }

    fn shard(&self, key: &str) -> &Mutex<HashMap<String, Bucket>> {
        // FNV-1a: cheap, and the keys are ours (tenant and store ids), not an attacker's
        // choice of hash flooding input beyond ids they were given.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in key.as_bytes() {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
        &self.shards[(h % SHARDS as u64) as usize]
    }

    fn refill(limit: RateLimit, b: &mut Bucket, now: Millis) {
        let elapsed = (now - b.at).max(0) as f64 / 1000.0;
        b.tokens = (b.tokens + elapsed * limit.per_second).min(limit.burst);
        b.at = now.max(b.at);
    }

    /// Takes one token from `key`'s bucket at time `now`.
    pub fn check(&self, key: &str, now: Millis) -> Result<(), Limited> {
        self.check_with(key, now, self.limit)
    }

    /// Takes one token from `key`'s bucket at time `now`, the bucket filling at `limit`
    /// (this caller's own limit, see [`RateLimit::at_least_per_unit`]) rather than the
    /// limiter's. A bucket whose limit grows gains the extra burst at once; one whose limit
    /// shrinks keeps no more than the new burst.
    pub fn check_with(&self, key: &str, now: Millis, limit: RateLimit) -> Result<(), Limited> {
        let mut shard = self.shard(key).lock().unwrap_or_else(|p| p.into_inner());
        if shard.len() > SHARD_TRIM_AT {
            shard.retain(|_, b| {
                Self::refill(b.limit, b, now);
                b.tokens < b.limit.burst
            });
        }
        let bucket = shard.entry(key.to_owned()).or_insert(Bucket { tokens: limit.burst, at: now, limit });
        Self::refill(bucket.limit, bucket, now);
        // A raised limit gives its extra burst at once (the caller was judged by the
        // smaller one until now); a lowered one keeps no more than its burst.
        bucket.tokens = (bucket.tokens + (limit.burst - bucket.limit.burst).max(0.0)).min(limit.burst);
        bucket.limit = limit;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            let wait = (1.0 - bucket.tokens) / limit.per_second;
            Err(Limited { retry_after_secs: (wait.ceil() as u64).max(1) })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_the_sustained_rate() {
        let l = RateLimiter::new(RateLimit::new(10.0, 5.0));
        for _ in 0..5 {
            assert_eq!(l.check("t", 0), Ok(()));
        }
        assert_eq!(l.check("t", 0), Err(Limited { retry_after_secs: 1 }));
        // Another caller has a bucket of its own.
        assert_eq!(l.check("u", 0), Ok(()));
        // 100 ms later one token is back, and only one.
        assert_eq!(l.check("t", 100), Ok(()));
        assert!(l.check("t", 100).is_err());
        // Never more than the burst, however long the caller was quiet.
        for _ in 0..5 {
            assert_eq!(l.check("t", 1_000_000), Ok(()));
        }
        assert!(l.check("t", 1_000_000).is_err());
    }

    #[test]
    fn retry_after_says_when_a_token_is_back() {
        let l = RateLimiter::new(RateLimit::new(0.1, 1.0));
        assert_eq!(l.check("t", 0), Ok(()));
        assert_eq!(l.check("t", 0), Err(Limited { retry_after_secs: 10 }));
        assert_eq!(l.check("t", 5_000), Err(Limited { retry_after_secs: 5 }));
        assert_eq!(l.check("t", 10_000), Ok(()));
    }

    #[test]
    fn a_clock_that_steps_back_gives_no_tokens() {
        let l = RateLimiter::new(RateLimit::new(1.0, 1.0));
        assert_eq!(l.check("t", 10_000), Ok(()));
        assert!(l.check("t", 0).is_err());
        assert!(l.check("t", 10_500).is_err());
        assert_eq!(l.check("t", 11_000), Ok(()));
    }

    #[test]
    fn a_caller_with_a_larger_budget_is_refused_later() {
        let base = RateLimit::new(10.0, 20.0);
        assert_eq!(base.at_least_per_unit(4.0, 2), base, "a small store keeps the configured limit");
        let big = base.at_least_per_unit(4.0, 60);
        assert_eq!(big, RateLimit { per_second: 240.0, burst: 480.0 });
        let l = RateLimiter::new(base);
        let taken = (0..1000).take_while(|_| l.check_with("big", 0, big).is_ok()).count();
        assert_eq!(taken, 480);
        let taken = (0..1000).take_while(|_| l.check("small", 0).is_ok()).count();
        assert_eq!(taken, 20);
        // 100 ms later the larger budget has 24 tokens back.
        let taken = (0..1000).take_while(|_| l.check_with("big", 100, big).is_ok()).count();
        assert_eq!(taken, 24);
        // Shrunk back (printers removed): no more than the smaller burst, at its rate.
        let taken = (0..1000).take_while(|_| l.check_with("big", 1_000_000, base).is_ok()).count();
        assert_eq!(taken, 20);
        // Raised (printers added) while empty: the extra burst at once.
        let taken = (0..1000).take_while(|_| l.check_with("big", 1_000_000, big).is_ok()).count();
        assert_eq!(taken, 460);
    }

    #[test]
    fn full_buckets_are_forgotten() {
        let l = RateLimiter::new(RateLimit::new(1000.0, 2.0));
        for i in 0..(SHARDS * SHARD_TRIM_AT * 2) {
            let _ = l.check(&format!("caller-{i}"), 0);
        }
        let _ = l.check("late", 10_000);
        let total: usize = l.shards.iter().map(|s| s.lock().map(|m| m.len()).unwrap_or(0)).sum();
        assert!(total < SHARDS * SHARD_TRIM_AT * 2, "{total} buckets kept");
    }
}
