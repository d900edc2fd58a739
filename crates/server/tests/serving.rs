//! The accept loop (`server::http1`) as a client sees it: requests on one kept-alive
//! connection, and a stop that answers the long polls waiting in it, returns, and leaves
//! no listener behind.

mod common;

use std::time::{Duration, Instant};

use common::{Agent, Backend, TestApp};
use reqwest::StatusCode;
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_answers_the_waiting_long_polls_and_closes_the_listener() {
    let Some(app) = TestApp::spawn(Backend::Sqlite).await else { return };
    let key = app.tenant("acme").await;
    let agent = Agent::new(&app, &key, "a1", "s1").await;
    // One client, one connection: the set-up calls above and the poll below share it.
    let (base, http, token) = (app.base.clone(), app.http.clone(), agent.token.clone());
    let poll = tokio::spawn(async move {
        let started = Instant::now();
        let res = http
            .post(format!("{base}/v1/agent/poll"))
            .bearer_auth(token)
            .json(&json!({"agent_id": "a1", "session": "s1", "wait_ms": 20_000, "max": 16}))
            .send()
            .await
            .expect("the waiting poll is answered, not cut off");
        let status = res.status();
        (status, res.json::<Value>().await.expect("a JSON answer"), started.elapsed())
    });
    // Long enough for the poll to be waiting in the broker (it has nothing to deliver).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!poll.is_finished(), "the poll waits for work");

    let base = app.base.clone();
    tokio::time::timeout(Duration::from_secs(10), app.stop())
        .await
        .expect("the broker stops within 10 s although a poll asked to wait 20 s");
    let (status, body, waited) = poll.await.expect("poll task");
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["deliveries"], json!([]), "{body}");
    assert!(waited < Duration::from_secs(10), "answered at the stop, after {waited:?}");

    // Nothing listens any more: a new connection is refused rather than left hanging.
    let after = reqwest::Client::new().get(format!("{base}/healthz")).timeout(Duration::from_secs(5)).send().await;
    let err = after.expect_err("no answer after the stop");
    assert!(err.is_connect(), "refused at connect, not timed out: {err:?}");
}
