//! The shared store conformance suite, run against a real SQLite file.

onceprint_store::conformance_tests!(onceprint_store_sqlite::testing::fresh_store);
