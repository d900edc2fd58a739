//! The broker's logic between the HTTP surface and the database.
//!
//! This crate owns intake (the order of work: dedup → validate → persist → charge →
//! enqueue), the in-process first gate that answers recent duplicates without a database
//! round trip, the directory cache of tenants, printers, stations and agent tokens,
//! the secrets functions, set-up (`setup`: every change of tenants, stores, printers,
//! stations, tokens and keys, validated, audited and forgotten by the directory), and
//! delivery: the one lane engine (`lanes`: claim, ack, sweep)
//! with the claimants it hands work to (`claimant`), the lane watchdog, and the printer
//! transports on top of it (`transport`: the agent's long poll, the push driver and the
//! webhook transport, and the polled mechanism of printers that call in with CloudPRNT
//! and Epson Server Direct Print as its two protocol adapters). It also owns the manual
//! channel, operators and their sessions (`operators`), idle printers' status and silent
//! agents (`printer_watch`), alerts, reconciliation, retention of finished tasks
//! (`retention`), store time zones, and the broker's side of offline operation
//! (`offline`: the store's directory for an agent taking orders on the shop's LAN, and the
//! sync of the tasks it took while the broker was unreachable).
//!
//! It must never write SQL (that belongs to the store backends) and never decide HTTP
//! answers of the broker's own API (status codes and JSON bodies belong to
//! `onceprint-server`); transports may be HTTP clients of printers and vendor clouds.
//! Every decision that can be made without IO is delegated to `onceprint-core`.

pub mod alerts;
pub mod claimant;
pub mod clock;
pub mod cluster;
pub mod content;
pub mod device_log;
pub mod directory;
pub mod gate;
pub mod ids;
pub mod intake;
pub mod lanes;
pub mod lease;
pub mod limits;
pub mod offline;
pub mod operations;
pub mod operators;
pub mod printer_watch;
pub mod reconcile;
pub mod retention;
pub mod secrets;
pub mod setup;
pub mod shared_gate;
pub mod signals;
pub mod transport;
pub mod tz;
pub mod watchdog;

/// What the broker's services share: the store, the directory cache, the first gate,
/// the wake-up signals and the print-type policies.
#[derive(Clone)]
pub struct Shared {
    pub store: std::sync::Arc<dyn onceprint_store::Store>,
    pub directory: std::sync::Arc<Directory>,
    pub gate: std::sync::Arc<RecentTasks>,
    pub signals: std::sync::Arc<StoreSignals>,
    pub policies: onceprint_core::PolicyTable,
}

pub use claimant::{AgentRegistry, Claimant, RegistryConfig, Superseded};
pub use cluster::{Cluster, ClusterConfig};
pub use directory::Directory;
pub use gate::RecentTasks;
pub use intake::{Intake, IntakeConfig, IntakeError, SubmitAnswer, SubmitKind, SubmitRequest};
pub use lanes::{
    AckIn, AckResult, Acked, ClaimRules, Delivery, DeliveryConfig, DeliveryError, HandOutNext, LaneEngine, SweepReport,
};
pub use lease::{Lease, LeaseConfig, Leases};
pub use offline::{Offline, OfflineConfig, OfflineReport, SyncAnswer, SyncResult};
pub use operations::{ActionError, ActionOutcome, ActionRequest, Actor, Operations, OperationsConfig};
pub use operators::{Creator, OperatorError, Operators, OperatorsConfig};
pub use printer_watch::PrinterWatch;
pub use retention::{Retention, RetentionConfig};
pub use setup::{Caller, Setup, SetupError};
pub use shared_gate::{GuardedSharedGate, SharedEntry, SharedGate, SharedGateConfig, SharedGateError, SharedGateStats};
pub use signals::StoreSignals;
pub use transport::agent::{AgentDelivery, AgentTransport, PollError};
pub use transport::push::{PushConfig, PushDriver};
pub use watchdog::Watchdog;
