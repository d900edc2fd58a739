//! The wall clock, read in one place so the domain crate never has to. The lane engine and
//! the agent registry read it through [`Clock`], so that tests can move time by hand.

use std::sync::atomic::{AtomicI64, Ordering};

use onceprint_core::Millis;

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> Millis {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as Millis).unwrap_or(0)
}

/// RFC 3339 UTC with milliseconds, e.g. `2026-11-29T09:53:36.123Z`.
pub fn rfc3339(ms: Millis) -> String {
    let nanos = i128::from(ms) * 1_000_000;
    time::OffsetDateTime::from_unix_timestamp_nanos(nanos)
        .ok()
        .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_else(|| ms.to_string())
}

/// A source of the current time.
pub trait Clock: Send + Sync + 'static {
    fn now_ms(&self) -> Millis;
}

/// The system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> Millis {
        now_ms()
    }
}

/// A clock that only moves when told to (tests and models).
#[derive(Debug, Default)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    pub fn new(start: Millis) -> ManualClock {
        ManualClock(AtomicI64::new(start))
    }

    pub fn advance(&self, ms: Millis) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }

    pub fn set(&self, ms: Millis) {
        self.0.store(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> Millis {
        self.0.load(Ordering::SeqCst)
    }
}

/// The system's wall clock moved by a fixed amount. The broker gives it to the retention
/// job when a test of the real binary asks for it (`serve` with the hidden setting
/// `ONCEPRINT_TEST_RETENTION_CLOCK_OFFSET_MS`), so that tasks just submitted look as old
/// to the job as that test needs; nothing else in the broker sees the moved time.
#[derive(Debug, Default, Clone, Copy)]
pub struct OffsetClock {
    pub offset_ms: Millis,
}

impl Clock for OffsetClock {
    fn now_ms(&self) -> Millis {
        now_ms().saturating_add(self.offset_ms)
    }
}
