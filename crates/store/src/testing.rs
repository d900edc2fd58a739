//! Support shared by the tests of every crate that needs a real, empty database.
//!
//! Each backend crate offers a `testing::fresh_store()` returning `Option<Harness>`:
//! `None` means the backend is not configured on this machine and the test was skipped
//! (the backend has printed why), never a silent pass when it was required.

use std::any::Any;
use std::sync::Arc;

use crate::Store;

/// A fresh store plus whatever must live as long as it (temp dir, schema guard).
pub struct Harness {
    pub store: Arc<dyn Store>,
    /// Dropped after the test; cleans up the database it created.
    pub guard: Box<dyn Any + Send>,
    /// The URL a separately started broker process would use to open the same database.
    pub url: String,
}
