//! The property test of the idempotency contract, run against real SQLite files.

onceprint_store::idempotency_property_test!(onceprint_store_sqlite::testing::fresh_store);
