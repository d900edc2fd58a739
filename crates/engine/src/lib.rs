//! The broker's logic between the HTTP surface and the database.
//!
//! This crate owns intake (the order of work of R3: dedup → validate → persist → charge →
//! enqueue), the in-process first gate that answers recent duplicates without a database
//! round trip (R5), the directory cache of tenants, printers, stations and agent tokens,
//! the secrets helpers (hashing and generating API keys and tokens), and delivery: per-printer
//! lanes handed to store agents by long poll, acks applied by compare-and-set, and the sweeper.
//!
//! It must never speak HTTP (status codes and JSON bodies belong to `onceprint-server`)
//! and never write SQL (that belongs to the store backends). Every decision that can be
//! made without IO is delegated to `onceprint-core`.

pub mod alerts;
pub mod clock;
pub mod content;
pub mod delivery;
pub mod directory;
pub mod gate;
pub mod ids;
pub mod intake;
pub mod operations;
pub mod reconcile;
pub mod secrets;
pub mod signals;
pub mod transport;
pub mod tz;
pub mod webhook;

pub use delivery::{AckIn, AckResult, Delivery, DeliveryConfig, DeliveryError, Dispatcher, SweepReport};
pub use directory::Directory;
pub use gate::RecentTasks;
pub use intake::{Intake, IntakeConfig, IntakeError, SubmitAnswer, SubmitKind, SubmitRequest};
pub use operations::{ActionError, ActionOutcome, ActionRequest, Operations, OperationsConfig};
pub use signals::StoreSignals;
