//! Print-type policies: priority, retry backoff, attempt limit and what to
//! do when a delivery's outcome is unknown. The engine reads them; intake only needs the
//! priority and to know that the print type exists.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{ids::validate_id, CoreError};

/// Exponential backoff with a cap and jitter: attempt 1 waits `initial_ms`, each further
/// attempt multiplies by `factor` until `cap_ms`. `jitter` (0..=1) is the share of the delay
/// that is randomised away so that a store full of printers coming back does not retry in
/// lock step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Backoff {
    pub initial_ms: i64,
    pub factor: f64,
    pub cap_ms: i64,
    pub jitter: f64,
}

impl Backoff {
    /// The wait before retry number `attempt` (1-based). `unit` is a random sample in
    /// [0, 1) supplied by the caller, since this crate draws no random numbers.
    pub fn delay_ms(&self, attempt: u32, unit: f64) -> i64 {
        let exp = attempt.saturating_sub(1).min(62) as i32;
        let raw = (self.initial_ms as f64) * self.factor.powi(exp);
        let base = raw.min(self.cap_ms as f64).max(0.0);
        let jitter = self.jitter.clamp(0.0, 1.0) * unit.clamp(0.0, 1.0);
        (base * (1.0 - jitter)).round() as i64
    }
}

/// What the engine does with one print type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PrintTypePolicy {
    /// Lower runs first within a printer's lane.
    pub priority: i32,
    pub backoff: Backoff,
    pub max_attempts: u32,
    /// Kitchen tickets may prefer a second copy to a missing dish; the default is to
    /// stop and ask a human.
    pub reprint_on_doubt: bool,
    /// How long a ticket may wait for its printer to come back from a state that proves
    /// nothing printed (no paper, cover open, paper jam, offline), counted from its
    /// submission. Such refusals pause the printer's lane without spending
    /// `max_attempts`, which limits deliveries that reached the printer; past this budget
    /// the ticket fails with the printer's reason, as it did after its attempts before.
    #[serde(default = "default_max_wait_ms")]
    pub max_wait_ms: i64,
}

/// Ten minutes: a paper change at lunch, not a printer that is gone for the day.
pub const DEFAULT_MAX_WAIT_MS: i64 = 600_000;

fn default_max_wait_ms() -> i64 {
    DEFAULT_MAX_WAIT_MS
}

/// The configured print types. Unknown print types are refused at intake, so a typo in a
/// POS integration surfaces on the first request instead of silently using defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyTable {
    pub types: BTreeMap<String, PrintTypePolicy>,
}

/// The print type used when a request names none.
pub const DEFAULT_PRINT_TYPE: &str = "receipt";

impl Default for PolicyTable {
    fn default() -> Self {
        let fast = Backoff { initial_ms: 1_000, factor: 2.0, cap_ms: 30_000, jitter: 0.2 };
        let slow = Backoff { initial_ms: 30_000, factor: 2.0, cap_ms: 300_000, jitter: 0.2 };
        let p = |priority, backoff: &Backoff, max_attempts, reprint_on_doubt| PrintTypePolicy {
            priority,
            backoff: backoff.clone(),
            max_attempts,
            reprint_on_doubt,
            max_wait_ms: DEFAULT_MAX_WAIT_MS,
        };
        let mut types = BTreeMap::new();
        types.insert("refund".into(), p(0, &fast, 5, false));
        types.insert("receipt".into(), p(10, &fast, 5, false));
        types.insert("kitchen".into(), p(20, &fast, 5, false));
        types.insert("label".into(), p(30, &fast, 5, false));
        types.insert("prebill".into(), p(40, &slow, 4, false));
        types.insert("reprint".into(), p(50, &slow, 4, false));
        PolicyTable { types }
    }
}

impl PolicyTable {
    /// The policy of a stored task's print type. A type removed from the configuration
    /// after tasks were accepted falls back to the default type's policy, and, failing
    /// that, to a conservative built-in one (never reprint on doubt).
    pub fn policy_for(&self, print_type: &str) -> PrintTypePolicy {
        self.types.get(print_type).or(self.types.get(DEFAULT_PRINT_TYPE)).cloned().unwrap_or(PrintTypePolicy {
            priority: 100,
            backoff: Backoff { initial_ms: 1_000, factor: 2.0, cap_ms: 30_000, jitter: 0.2 },
            max_attempts: 5,
            reprint_on_doubt: false,
            max_wait_ms: DEFAULT_MAX_WAIT_MS,
        })
    }

    /// Resolves the print type of a request: absent means [`DEFAULT_PRINT_TYPE`].
    pub fn resolve<'a>(&'a self, print_type: Option<&'a str>) -> Result<(&'a str, &'a PrintTypePolicy), CoreError> {
        let name = print_type.unwrap_or(DEFAULT_PRINT_TYPE);
        validate_id("print_type", name)?;
        match self.types.get_key_value(name) {
            Some((k, v)) => Ok((k.as_str(), v)),
            None => Err(CoreError::invalid(
                "print_type",
                format!(
                    "unknown print type {name:?}; configured: {}",
                    self.types.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_the_cap() {
        let b = Backoff { initial_ms: 1000, factor: 2.0, cap_ms: 30_000, jitter: 0.0 };
        let d: Vec<i64> = (1..=7).map(|a| b.delay_ms(a, 0.5)).collect();
        assert_eq!(d, vec![1000, 2000, 4000, 8000, 16000, 30000, 30000]);
        assert_eq!(b.delay_ms(1000, 0.0), 30_000);
    }

    #[test]
    fn jitter_only_shortens_within_its_share() {
        let b = Backoff { initial_ms: 1000, factor: 2.0, cap_ms: 30_000, jitter: 0.2 };
        assert_eq!(b.delay_ms(1, 0.0), 1000);
        assert_eq!(b.delay_ms(1, 1.0), 800);
        assert!((800..=1000).contains(&b.delay_ms(1, 0.37)));
    }

    #[test]
    fn print_types_resolve_with_a_default() {
        let t = PolicyTable::default();
        assert_eq!(t.resolve(None).unwrap().0, "receipt");
        assert!(t.resolve(Some("refund")).unwrap().1.priority < t.resolve(Some("prebill")).unwrap().1.priority);
        assert!(t.resolve(Some("nope")).unwrap_err().to_string().contains("unknown print type"));
    }
}
