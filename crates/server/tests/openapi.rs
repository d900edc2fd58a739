//! The OpenAPI document is generated from the code; this snapshot makes every change to
//! the public description visible in review.

#[test]
fn openapi_document_matches_the_snapshot() {
    let doc: serde_json::Value = serde_json::from_str(&onceprint_server::openapi::document_json()).expect("valid JSON");
    insta::assert_json_snapshot!("openapi", doc);
}
