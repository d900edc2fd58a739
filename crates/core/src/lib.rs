//! The onceprint domain: everything that can be decided without touching the outside world.
//!
//! This crate owns the vocabulary the rest of the broker speaks — identifiers and their
//! validation, the task state machine (every legal transition is listed in one table), the
//! idempotency key and the content fingerprint that decide whether a submission is new, and
//! the per-print-type policies (priority, backoff, attempt limit) the engine applies.
//!
//! It must never do IO, read the clock or draw random numbers itself: callers pass the
//! current time and random bytes in. That keeps every rule here deterministic and testable
//! by property tests, and keeps the storage and HTTP layers from growing their own copies
//! of the rules.

pub mod ack;
pub mod content;
pub mod error;
pub mod ids;
pub mod key;
pub mod lane;
pub mod manual;
pub mod offline;
pub mod policy;
pub mod proof;
pub mod results;
pub mod state;
pub mod time;

pub use ack::{Ack, AckDecision, AckTask, Outcome};
pub use content::{Content, ContentLimits};
pub use error::CoreError;
pub use ids::{validate_id, TaskId};
pub use key::{delivery_key, Fingerprint, IdempotencyKey, Target};
pub use policy::{Backoff, PolicyTable, PrintTypePolicy, DEFAULT_MAX_WAIT_MS};
pub use proof::Proof;
pub use state::{TaskState, TransitionError};
pub use time::Millis;
