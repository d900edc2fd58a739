//! Receipt documents over HTTP: previews, validation naming the field, document and
//! markup tasks, and the schema in the OpenAPI document.

mod common;

use common::TestApp;
use reqwest::StatusCode;
use serde_json::{json, Value};

both_backends!(documents_preview_validate_and_print, the_preview_takes_a_tasks_content_as_it_is);

fn fixture(name: &str) -> String {
    let path = format!("{}/../render/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

async fn post_raw(app: &TestApp, path: &str, key: &str, ctype: &str, body: String) -> (StatusCode, String, Vec<u8>) {
    let res = app
        .http
        .post(format!("{}{path}", app.base))
        .bearer_auth(key)
        .header("content-type", ctype)
        .body(body)
        .send()
        .await
        .expect("post");
    let status = res.status();
    let mime = res.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    (status, mime, res.bytes().await.expect("body").to_vec())
}

async fn documents_preview_validate_and_print(app: &TestApp) {
    let key = app.tenant("acme").await;
    let doc = fixture("kitchen-ticket.json");
    let (status, mime, png) = post_raw(app, "/v1/render/preview", &key, "application/json", doc.clone()).await;
    assert_eq!((status, mime.as_str()), (StatusCode::OK, "image/png"));
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let (status, _, text) = post_raw(
        app,
        "/v1/render/preview?format=text&profile=escpos-58-gb18030",
        &key,
        "application/json",
        doc.clone(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let text = String::from_utf8(text).expect("utf8");
    assert!(text.contains("宫保鸡丁"), "{text}");
    assert!(text.lines().all(|l| onceprint_render::display_width(l) <= 32), "58 mm is 32 columns:\n{text}");
    let (status, _, body) = post_raw(app, "/v1/render/preview", &key, "text/plain", fixture("markup-ticket.txt")).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let (status, _, body) = post_raw(
        app,
        "/v1/render/preview",
        &key,
        "application/json",
        json!({"blocks": [{"type": "text", "text": "x"}, {"type": "bogus"}]}).to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let err: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(err["error"]["code"], "invalid_content");
    assert!(err["error"]["message"].as_str().unwrap_or("").contains("blocks[1]"), "{err}");
    let (status, _, _) = post_raw(app, "/v1/render/preview?profile=nope", &key, "application/json", doc.clone()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    // Tasks: a document and a markup ticket are accepted and preview; a bad one is refused.
    let d: Value = serde_json::from_str(&doc).expect("doc");
    let t = app.submit(&key, json!({"biz_no": "K1", "printer_id": "p1", "content": {"type": "doc", "doc": d}})).await;
    assert_eq!(t.status, StatusCode::CREATED, "{t:?}");
    let id = t.body["task_id"].as_str().expect("id").to_owned();
    let res = app
        .http
        .get(format!("{}/v1/print-tasks/{id}/preview.png", app.base))
        .bearer_auth(&key)
        .send()
        .await
        .expect("get");
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(&res.bytes().await.expect("png")[..4], b"\x89PNG");
    let m = app.submit(&key, json!({"biz_no": "M1", "printer_id": "p1", "content": {"type": "markup", "markup": fixture("markup-ticket.txt")}})).await;
    assert_eq!(m.status, StatusCode::CREATED, "{m:?}");
    let bad = app.submit(&key, json!({"biz_no": "K2", "printer_id": "p1", "content": {"type": "doc", "doc": {"blocks": [{"type": "qr"}]}}})).await;
    assert_eq!((bad.status, bad.code()), (StatusCode::BAD_REQUEST, "invalid_content"), "{bad:?}");
    assert!(bad.body["error"]["message"].as_str().unwrap_or("").contains("blocks[0]"), "{bad:?}");
    let raw = app
        .submit(&key, json!({"biz_no": "E1", "printer_id": "p1", "content": {"type": "escpos", "data": "G0A="}}))
        .await;
    let rid = raw.body["task_id"].as_str().expect("id").to_owned();
    let res = app
        .http
        .get(format!("{}/v1/print-tasks/{rid}/preview.png", app.base))
        .bearer_auth(&key)
        .send()
        .await
        .expect("get");
    assert_eq!(res.status(), StatusCode::NOT_FOUND, "raw ESC/POS has no preview");

    let api = app.call("GET", "/openapi.json", None, None).await;
    assert!(
        api.body["components"]["schemas"]["ReceiptDocument"].is_object(),
        "the document schema is in the OpenAPI document"
    );
}

/// The text preview of a JSON body.
async fn text_preview(app: &TestApp, key: &str, body: Value) -> (StatusCode, String) {
    let (status, _, out) = post_raw(
        app,
        "/v1/render/preview?format=text&profile=escpos-58-gb18030",
        key,
        "application/json",
        body.to_string(),
    )
    .await;
    (status, String::from_utf8_lossy(&out).into_owned())
}

async fn the_preview_takes_a_tasks_content_as_it_is(app: &TestApp) {
    let key = app.tenant("acme").await;
    let doc: Value = serde_json::from_str(&fixture("kitchen-ticket.json")).expect("doc");
    let markup = fixture("markup-ticket.txt");
    // Each kind of `content` a task takes, sent as it is.
    let (status, text) = text_preview(app, &key, json!({"type": "text", "text": "Table 5\n1 x Noodles\n"})).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(text.contains("1 x Noodles"), "{text}");
    let (status, text) = text_preview(app, &key, json!({"type": "markup", "markup": markup})).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(text.contains("老王川菜馆"), "{text}");
    let (status, from_content) = text_preview(app, &key, json!({"type": "doc", "doc": doc})).await;
    assert_eq!(status, StatusCode::OK, "{from_content}");
    let (_, from_doc) = text_preview(app, &key, doc.clone()).await;
    assert_eq!(from_content, from_doc, "a doc content previews as the bare document does");
    // A whole task body previews as its content.
    let task = json!({"biz_no": "A1", "printer_id": "p1", "content": {"type": "doc", "doc": doc}});
    let (status, from_task) = text_preview(app, &key, task).await;
    assert_eq!((status, from_task.as_str()), (StatusCode::OK, from_doc.as_str()));
    // Content a task could not take is refused as intake refuses it; raw bytes have no preview.
    let (status, body) = text_preview(app, &key, json!({"type": "text", "text": ""})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body) = text_preview(app, &key, json!({"type": "picture", "url": "x"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("invalid_content"), "{body}");
    let (status, body) = text_preview(app, &key, json!({"type": "escpos", "data": "G0A="})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("no preview"), "{body}");
    let (status, body) = text_preview(app, &key, json!({"type": "doc", "doc": {"blocks": [{"type": "bogus"}]}})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("invalid_content"), "{body}");
}
