//! The word between broker nodes that share one database: a backend that several nodes can
//! share (PostgreSQL) carries short messages from one node to all the others, so that a
//! task committed on one node wakes a long poll waiting on another, and a set-up change is
//! forgotten by every node's directory cache at once. What the messages say is the
//! engine's business (`onceprint_engine::cluster`); the backend only carries text.
//!
//! Delivery is best effort: a message may be lost (while a node's listening connection is
//! down), so a listener is told when it (re)starts listening, and every node still
//! re-checks on its own timers. Nothing that must happen depends on a message arriving.

use async_trait::async_trait;

use crate::StoreResult;

/// What a listening node hears.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Heard {
    /// A message some node sent (this node's own included).
    Message(String),
    /// Listening (re)started: messages sent while it was down are lost, so everything the
    /// messages would have said must be assumed.
    Reconnected,
}

/// A channel from every node to every node, provided by the shared database.
#[async_trait]
pub trait NodeLink: Send + Sync + 'static {
    /// The largest message, in bytes, the link carries.
    fn max_message_bytes(&self) -> usize;

    /// Sends the messages to every listening node, in one round trip when it can. An error
    /// means they may not have arrived.
    async fn send(&self, messages: &[String]) -> StoreResult<()>;

    /// Starts listening; what is heard arrives on the receiver, the first thing being
    /// [`Heard::Reconnected`] once listening has begun. Dropping the receiver stops it.
    fn listen(&self) -> tokio::sync::mpsc::Receiver<Heard>;
}
