//! Time as the domain sees it: milliseconds since the Unix epoch, always passed in by the
//! caller. The domain never reads a clock, so tests can drive time explicitly.

/// Milliseconds since 1970-01-01T00:00:00Z.
pub type Millis = i64;
