//! The shared property test of the intake's idempotency contract, run against PostgreSQL.
//! Skipped (with a line on stderr) unless `ONCEPRINT_TEST_POSTGRES` names a server.

onceprint_store::idempotency_property_test!(onceprint_store_postgres::testing::fresh_store);
