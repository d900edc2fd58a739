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
//!
//! Where things are: ids and their alphabet, `TaskId` (time-sortable, 26 characters) and agent
//! session ids; the state machine (`state::TRANSITIONS`, the one list of legal transitions);
//! what a lane does next (`lane::next_step`); what an ack does (`ack::decide`, failover
//! eligibility); what a report proves about paper (`proof::Proof`: printed, not printed,
//! refused, may have printed; the one rule for doubt); every vendor's result codes classified
//! with their sources (`results`: Star CloudPRNT, Epson ePOS-Print / Server Direct Print,
//! onceprint MQTT devices, the store agent, webhooks; docs/RESULT-CODES.md is these tables);
//! the idempotency key and the delivery key (`key::delivery_key`); the content fingerprint;
//! print-type policies (priority, backoff with jitter, attempt limit, reprint on doubt); the
//! offline merge rules (`offline::decide`: what a task the store agent took offline does to
//! the broker's task under the same key; the journal's records as task states;
//! `offline::station_printer`, where a station's new task goes, used by the agent and the
//! broker alike).

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
