//! The shared store conformance suite, run against a real SQLite file.

onceprint_store::conformance_tests!(onceprint_store_sqlite::testing::fresh_store);

/// An ack batch's reads (`Store::read_for_acks`) go to the writer's connection only when
/// it has nothing waiting; with the writer busy they go to a pooled reader, and must
/// answer the same.
#[tokio::test]
async fn acks_are_read_alike_from_a_reader_when_the_writer_is_busy() {
    let h = onceprint_store_sqlite::testing::fresh_store_with_a_busy_writer().await.expect("a store");
    onceprint_store::conformance::lane_heads_and_an_ack_that_hands_out_the_next_in_one_change(h.store.clone()).await;
}
