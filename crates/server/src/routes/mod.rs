//! HTTP handlers, one module per area.

pub mod agent;
pub mod callbacks;
pub mod cloudprnt;
pub mod epson_sdp;
pub mod journal_digest;
pub mod manual;
pub mod meta;
pub mod offline;
pub mod operators;
pub mod reconcile;
pub mod render;
pub mod setup;
pub mod tasks;
pub mod webhooks;
