//! PostgreSQL's node link (LISTEN/NOTIFY between broker nodes): what is sent is heard, and a
//! listening connection the server ends (a restart, a failover, an administrator's
//! `pg_terminate_backend`) is made again, says so with `Heard::Reconnected` — after which the
//! engine wakes every waiting poll and empties its directory, since messages may have been
//! missed — and hears what is sent afterwards.

use std::time::Duration;

use onceprint_store::Heard;
use tokio::sync::mpsc::Receiver;

async fn next(rx: &mut Receiver<Heard>) -> Heard {
    tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .expect("heard something within 20 s")
        .expect("the listener is still open")
}

/// Waits for `message`, skipping anything else (a test's own earlier sends).
async fn until_message(rx: &mut Receiver<Heard>, message: &str) {
    loop {
        if next(rx).await == Heard::Message(message.to_owned()) {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_whose_connection_is_ended_listens_again_and_says_so() {
    let Some(h) = onceprint_store_postgres::testing::fresh_store().await else { return };
    let link = h.store.node_link().expect("PostgreSQL has a node link");
    let mut heard = link.listen();
    assert_eq!(next(&mut heard).await, Heard::Reconnected, "listening begins with Reconnected");
    link.send(&["first".to_owned()]).await.expect("send");
    until_message(&mut heard, "first").await;

    // End the listening connection from the server's side.
    let (client, connection) = tokio_postgres::connect(&h.url, tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(connection);
    let channel: String = client
        .query_one(
            "SELECT 'onceprint_' || CASE WHEN current_schema() ~ '^[a-z0-9_]{1,40}$'
                    THEN current_schema() ELSE md5(coalesce(current_schema(), '')) END",
            &[],
        )
        .await
        .expect("channel")
        .get(0);
    let ended = client
        .query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
              WHERE pid <> pg_backend_pid() AND query = $1",
            &[&format!("LISTEN \"{channel}\"")],
        )
        .await
        .expect("terminate");
    assert_eq!(ended.len(), 1, "exactly one connection listens on {channel}");

    // The listener notices (its connection ends, or at the latest its next ping fails),
    // listens again, says so, and hears what is sent from then on.
    // Nothing is sent meanwhile, so the next thing heard must be the reconnection.
    if let Heard::Message(m) = next(&mut heard).await {
        panic!("heard {m:?} before the reconnection");
    }
    link.send(&["after".to_owned()]).await.expect("send after the reconnection");
    until_message(&mut heard, "after").await;
    drop(h);
}
