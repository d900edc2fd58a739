//! LISTEN/NOTIFY between the broker nodes of one schema: the [`NodeLink`] of PostgreSQL.
//!
//! `NOTIFY` takes a lock that is global to the database while its transaction commits, so
//! it is never part of intake's or an ack's transaction: the engine collects what to say
//! for a few milliseconds and sends it here, on a connection of its own outside the pool,
//! as one `SELECT pg_notify(…) FROM unnest(…)` statement (one short transaction for all
//! of it). Each node also holds one listening connection, reconnected with a back-off when
//! it breaks; after every (re)connection the engine hears [`Heard::Reconnected`], because
//! notifications sent while it was down are lost.
//!
//! Channel names are per database, not per schema, while every schema is its own broker
//! cluster (tests run in parallel in one database, a schema each): the channel is named
//! after the schema, `onceprint_SCHEMA` when that is a short plain name, else
//! `onceprint_` and the MD5 of the schema's name.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use onceprint_store::{Heard, NodeLink, StoreError, StoreResult};
use tokio::sync::{mpsc, Mutex};
use tokio_postgres::{AsyncMessage, NoTls};

use crate::error::pg_error;

/// PostgreSQL refuses a payload of 8000 bytes or more.
const MAX_PAYLOAD: usize = 7_900;
/// How often the listening connection is checked (a half-open TCP connection would
/// otherwise go unnoticed until the kernel gives up on it).
const PING_EVERY: Duration = Duration::from_secs(10);
/// How long a check or a connection attempt may take.
const DEADLINE: Duration = Duration::from_secs(5);

/// The channel of the schema the URL selects, as the database computes it.
pub(crate) const CHANNEL: &str = "SELECT 'onceprint_' || CASE WHEN current_schema() ~ '^[a-z0-9_]{1,40}$'
                                         THEN current_schema() ELSE md5(coalesce(current_schema(), '')) END";

/// The link of one node: a sending connection opened on first use and a listener.
pub struct PgLink {
    config: tokio_postgres::Config,
    channel: String,
    sender: Mutex<Option<tokio_postgres::Client>>,
}

impl PgLink {
    /// The link on `channel` (from [`CHANNEL`]); nothing is connected before first use.
    pub(crate) fn new(config: tokio_postgres::Config, channel: String) -> Arc<PgLink> {
        Arc::new(PgLink { config, channel, sender: Mutex::new(None) })
    }

    /// The channel this link sends and listens on.
    pub fn channel(&self) -> &str {
        &self.channel
    }

    async fn send_once(&self, messages: &[String]) -> StoreResult<()> {
        let mut sender = self.sender.lock().await;
        let client = match sender.take() {
            Some(c) if !c.is_closed() => c,
            _ => connect(&self.config, None).await?,
        };
        let stmt = "SELECT pg_notify($1, m) FROM unnest($2::text[]) AS m";
        let sent = tokio::time::timeout(DEADLINE, client.execute(stmt, &[&self.channel, &messages]))
            .await
            .map_err(|_| StoreError::Unavailable("NOTIFY took too long".into()))?;
        sent.map_err(pg_error)?;
        // Only a connection that just worked is kept for the next time.
        *sender = Some(client);
        Ok(())
    }
}

#[async_trait]
impl NodeLink for PgLink {
    fn max_message_bytes(&self) -> usize {
        MAX_PAYLOAD
    }

    async fn send(&self, messages: &[String]) -> StoreResult<()> {
        if messages.is_empty() {
            return Ok(());
        }
        // A connection broken since its last use fails at once; one more try on a new one.
        match self.send_once(messages).await {
            Ok(()) => Ok(()),
            Err(_) => self.send_once(messages).await,
        }
    }

    fn listen(&self) -> mpsc::Receiver<Heard> {
        let (tx, rx) = mpsc::channel(4096);
        let config = self.config.clone();
        let channel = self.channel.clone();
        tokio::spawn(async move {
            let mut pause = Duration::from_millis(100);
            while !tx.is_closed() {
                match listen_once(&config, &channel, &tx, &mut pause).await {
                    Ok(()) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, channel = %channel, "not listening to the other broker nodes; retrying");
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = tx.closed() => return,
                }
                pause = (pause * 2).min(Duration::from_secs(5));
            }
        });
        rx
    }
}

/// A connection of its own (not from the pool), driven by a task that forwards the
/// notifications on `channel` to `notes`.
async fn connect(
    config: &tokio_postgres::Config,
    notes: Option<(String, mpsc::UnboundedSender<String>)>,
) -> StoreResult<tokio_postgres::Client> {
    let (client, mut connection) = tokio::time::timeout(DEADLINE, config.connect(NoTls))
        .await
        .map_err(|_| StoreError::Unavailable("connecting for LISTEN/NOTIFY took too long".into()))?
        .map_err(pg_error)?;
    tokio::spawn(async move {
        while let Some(m) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            match m {
                Ok(AsyncMessage::Notification(n)) => {
                    if let Some((channel, notes)) = &notes {
                        if n.channel() == channel && notes.send(n.payload().to_owned()).is_err() {
                            return;
                        }
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "LISTEN/NOTIFY connection ended");
                    return;
                }
            }
        }
    });
    Ok(client)
}

/// Listens until the connection breaks (an error) or nobody wants to hear more (`Ok`).
/// Once listening has begun, the next reconnection starts again from a short `pause`.
async fn listen_once(
    config: &tokio_postgres::Config,
    channel: &str,
    tx: &mpsc::Sender<Heard>,
    pause: &mut Duration,
) -> StoreResult<()> {
    let (notes_tx, mut notes) = mpsc::unbounded_channel();
    let client = connect(config, Some((channel.to_owned(), notes_tx))).await?;
    // The channel is an identifier here; it is made of [a-z0-9_] only (see `CHANNEL`).
    client.batch_execute(&format!("LISTEN \"{channel}\"")).await.map_err(pg_error)?;
    *pause = Duration::from_millis(100);
    if tx.send(Heard::Reconnected).await.is_err() {
        return Ok(());
    }
    let mut ping = tokio::time::interval(PING_EVERY);
    ping.tick().await;
    loop {
        tokio::select! {
            note = notes.recv() => match note {
                Some(m) => {
                    if tx.send(Heard::Message(m)).await.is_err() {
                        return Ok(());
                    }
                }
                None => return Err(StoreError::Unavailable("the listening connection ended".into())),
            },
            _ = ping.tick() => {
                match tokio::time::timeout(DEADLINE, client.simple_query("SELECT 1")).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => return Err(pg_error(e)),
                    Err(_) => return Err(StoreError::Unavailable("the listening connection stopped answering".into())),
                }
            }
            _ = tx.closed() => return Ok(()),
        }
    }
}
