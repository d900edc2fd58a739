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
//!
//! Where things are:
//!
//! - intake and the first gate (`RecentTasks`); the shared gate's trait and its guard
//!   (`shared_gate.rs`: `SharedGate`, implemented outside the engine; `GuardedSharedGate`
//!   bounds each call by a timeout, bypasses the gate for a back-off after a failure, counts,
//!   and logs outages once);
//! - the directory cache (`directory.rs`: printers with their transport parsed once,
//!   forgotten on change and after a TTL);
//! - the lane engine (`lanes.rs`: `claim`, `ack` and `ack_and_hand_out`, which hands out the
//!   next job of each lane an ack frees in the same write, planned by the claim's
//!   `plan_lane`; `sweep_once`; failover; `lanes/paused.rs`: `sweep_paused`, the tickets of
//!   a paused printer moved on by time);
//! - claimants and the agent registry (`claimant.rs`: sessions, liveness, fencing; on
//!   PostgreSQL synced with the other nodes through `agent_sessions`); the watchdog
//!   (`watchdog.rs`);
//! - the transports (`transport/`: the typed `TransportConfig` with `Secret`s redacted by
//!   type; `agent.rs` the long poll; `push.rs` the push driver and its `PushTransport` trait,
//!   `webhook.rs` its first user; `polled.rs` the mechanism of printers that poll the broker,
//!   with `cloudprnt.rs` and `epson_sdp.rs` as thin protocol adapters on it);
//! - rate limits (`limits.rs`: token buckets per tenant and per store agent, in memory per
//!   node; intake counts a submission only after the first gate missed);
//! - `setup`: every set-up write (tenants, stores, printers, stations, agent tokens, API
//!   keys), its validation, its audit row (secrets only redacted) and the directory's
//!   `forget_*`; a delivery in flight is never taken back;
//! - `operators`: operator accounts (`staff` bound to stores, `manager`), argon2id password
//!   hashes, the login throttle, console sessions and operator tokens (random secrets,
//!   SHA-256 stored, expiring, revocable); a login answer never says which part was wrong;
//! - `printer_watch`: idle printers' status reported by agents, and stores whose agents all
//!   fell silent (printers `agent offline`, one `agent.offline` alert); it claims nothing
//!   about a store no agent reached since the process started;
//! - `lease`: leases with fencing tokens for the jobs that run once per cluster (sweeper,
//!   `push:webhook`, `mqtt`, alerts, retention, statistics, `polled-offline`,
//!   `watchdog-alerts`, `agent-watch`), renewed every `lease_renew_ms` for `lease_ttl_ms`;
//!   a node steps down at once when a renewal fails and never runs a job past its lease;
//! - the manual channel (`operations.rs`), alerts (`alerts.rs`: outbox events, signed
//!   delivery), reconciliation (`reconcile.rs`, with the device log comparison), the device
//!   log digest (`device_log.rs`: checked whole, then stored; it changes no task);
//! - offline operation (`offline.rs`: the store directory an agent takes orders with while
//!   the broker is unreachable, the store's one LAN listener, and the sync: checked like
//!   submissions, changes meanwhile recorded rather than refused, times corrected by the
//!   agent's clock, then one `Store::merge_offline` per task; rejections are alerted);
//! - retention (`retention.rs`), store time zones (`tz.rs`), wake-up signals
//!   (`signals.rs`), the word between nodes (`cluster.rs`: wake-ups and directory forgets
//!   through the store's `NodeLink`; never needed for correctness), and the clock
//!   (`clock.rs`: read through `Clock`, so that the simulation and tests move time by hand).

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
