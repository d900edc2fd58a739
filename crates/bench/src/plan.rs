//! The request plan: which key each request carries, decided before the clock starts.
//!
//! Generating every body up front keeps JSON formatting and random draws out of the
//! measured loop, and makes a run repeatable: the same seed gives the same plan.

use hyper::body::Bytes;

/// How far back a repeat may reach, counted in distinct keys. Small enough that many
/// repeats are sent while the original is still in flight on another connection (the
/// race the broker's idempotency check must win), large enough that most are not.
pub const RECENT_WINDOW: usize = 1000;

/// SplitMix64. Kept here instead of using `rand` so that a plan for a given seed stays
/// identical whatever `rand` version the workspace moves to; the bench needs
/// repeatability, not cryptographic quality.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`, from the top 53 bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `0..n` (modulo bias is negligible for the small `n` used here).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// One planned submission.
#[derive(Debug, Clone)]
pub struct PlannedRequest {
    /// The key number: the request's `biz_no` is `<prefix><key>`.
    pub key: u32,
    /// True when an earlier request in the plan already carried this key.
    pub repeat: bool,
    /// The exact JSON body. Repeats share the original's buffer, so their content is
    /// byte-identical (a different content would rightly get 422, not 200).
    pub body: Bytes,
}

/// A whole plan. Keys are numbered `0..distinct_keys` in the order they first appear.
#[derive(Debug, Clone)]
pub struct Plan {
    pub prefix: &'static str,
    pub requests: Vec<PlannedRequest>,
    pub distinct_keys: usize,
}

impl Plan {
    pub fn biz_no(&self, key: u32) -> String {
        format!("{}{}", self.prefix, key)
    }

    pub fn repeats(&self) -> usize {
        self.requests.iter().filter(|r| r.repeat).count()
    }
}

/// The body for key `n`. The prefix is one of our own constants and `n` a number, so
/// nothing here needs JSON escaping; `\n` is written as the JSON escape.
pub fn body_for(prefix: &str, n: u32, printers: usize) -> Bytes {
    let printer = n as usize % printers;
    Bytes::from(format!(
        r#"{{"biz_no":"{prefix}{n}","printer_id":"p{printer}","print_type":"receipt","content":{{"type":"text","text":"Order {prefix}{n}\n1 x Noodles  12.00\n"}}}}"#
    ))
}

/// Builds a plan of `requests` submissions: each is a new key with probability
/// `1 - duplicate_share`, otherwise a repeat of one of the last [`RECENT_WINDOW`] keys.
/// The first request is always new (there is nothing to repeat yet).
pub fn build_plan(prefix: &'static str, requests: usize, duplicate_share: f64, printers: usize, seed: u64) -> Plan {
    let mut rng = SplitMix64::new(seed);
    // Bodies of every key created so far, indexed by key number; repeats clone the Bytes
    // handle (a reference count), not the data.
    let mut bodies: Vec<Bytes> = Vec::new();
    let mut planned = Vec::with_capacity(requests);
    for _ in 0..requests {
        let repeat = !bodies.is_empty() && rng.next_f64() < duplicate_share;
        let key = if repeat {
            let window_start = bodies.len().saturating_sub(RECENT_WINDOW);
            window_start + rng.below(bodies.len() - window_start)
        } else {
            let n = bodies.len();
            bodies.push(body_for(prefix, n as u32, printers));
            n
        };
        planned.push(PlannedRequest { key: key as u32, repeat, body: bodies[key].clone() });
    }
    Plan { prefix, requests: planned, distinct_keys: bodies.len() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn duplicate_share_is_roughly_what_was_asked() {
        for share in [0.0, 0.1, 0.3, 0.5, 0.9] {
            let plan = build_plan("B", 50_000, share, 10, 7);
            let actual = plan.repeats() as f64 / plan.requests.len() as f64;
            assert!((actual - share).abs() < 0.01, "asked {share}, got {actual}");
            assert_eq!(plan.distinct_keys + plan.repeats(), plan.requests.len());
        }
    }

    #[test]
    fn repeats_reuse_identical_bodies_and_recent_keys() {
        let plan = build_plan("B", 20_000, 0.3, 10, 1);
        let mut first_body: HashMap<u32, &Bytes> = HashMap::new();
        let mut created = 0usize;
        for r in &plan.requests {
            if r.repeat {
                let original = first_body.get(&r.key).expect("repeat of an unknown key");
                assert_eq!(*original, &r.body);
                assert!(created - r.key as usize <= RECENT_WINDOW, "repeat reaches too far back");
            } else {
                assert_eq!(r.key as usize, created, "new keys are numbered in order");
                assert!(first_body.insert(r.key, &r.body).is_none());
                created += 1;
            }
        }
        assert_eq!(created, plan.distinct_keys);
    }

    #[test]
    fn plan_is_deterministic_and_seed_dependent() {
        let a = build_plan("B", 5_000, 0.3, 10, 42);
        let b = build_plan("B", 5_000, 0.3, 10, 42);
        let c = build_plan("B", 5_000, 0.3, 10, 43);
        let keys = |p: &Plan| p.requests.iter().map(|r| r.key).collect::<Vec<_>>();
        assert_eq!(keys(&a), keys(&b));
        assert_ne!(keys(&a), keys(&c));
    }

    #[test]
    fn first_request_is_new_and_zero_share_has_no_repeats() {
        let plan = build_plan("B", 1_000, 0.0, 3, 5);
        assert!(!plan.requests[0].repeat);
        assert_eq!(plan.repeats(), 0);
        assert_eq!(plan.distinct_keys, 1_000);
        let plan = build_plan("B", 1, 1.0, 3, 5);
        assert!(!plan.requests[0].repeat);
    }

    #[test]
    fn body_is_the_contract_shape() {
        let body = body_for("B", 12, 10);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["biz_no"], "B12");
        assert_eq!(v["printer_id"], "p2");
        assert_eq!(v["print_type"], "receipt");
        assert_eq!(v["content"]["type"], "text");
        assert_eq!(v["content"]["text"], "Order B12\n1 x Noodles  12.00\n");
    }
}
