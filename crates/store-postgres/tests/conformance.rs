//! The shared storage conformance suite, run against PostgreSQL. Skipped (with a line on
//! stderr) unless `ONCEPRINT_TEST_POSTGRES` names a server.

onceprint_store::conformance_tests!(onceprint_store_postgres::testing::fresh_store);
