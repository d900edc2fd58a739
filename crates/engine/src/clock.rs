//! The wall clock, read in one place so the domain crate never has to.

use onceprint_core::Millis;

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> Millis {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as Millis).unwrap_or(0)
}
