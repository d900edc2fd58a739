//! HTTP handlers, one module per area.

pub mod agent;
pub mod meta;
pub mod setup;
pub mod tasks;
