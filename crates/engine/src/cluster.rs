//! Word between the broker nodes that share one database: what one node did
//! that the others should act on at once rather than at their next re-check.
//!
//! - **Wake-ups.** A task committed, a lane freed by an ack, a manual action, a set-up
//!   change: [`StoreSignals::notify`] wakes this node's long polls of the store and also
//!   queues the store for the other nodes, whose waiting polls (and push drivers) look
//!   again when they hear of it.
//! - **Directory forgets.** After a set-up change the directory forgets the object here
//!   and queues the same forget for the other nodes, so that a disabled printer or a
//!   revoked key is seen everywhere within milliseconds; the directory's TTL stays as the
//!   safety net for a word that got lost.
//!
//! The publisher sends what was queued in one message batch per round, at most one round
//! every [`ClusterConfig::linger`]: under load the words of many commits go out together,
//! and the database's global NOTIFY lock is taken by this one small transaction, never by
//! intake's or an ack's. The listener ignores the node's own messages; when it (re)starts
//! listening, messages may have been lost, so it wakes every waiting poll and empties the
//! directory once.
//!
//! Messages are text, one line per word after a header naming the sending node:
//! `op1 NODE`, then `w TENANT STORE` (wake), `p TENANT PRINTER`, `s TENANT STATION`,
//! `t TENANT` (forget everything of the tenant: a revoked key or agent token) or `*`
//! (everything). Ids never contain blanks (they are checked at set-up); a word that could
//! not be written plainly goes out as `*`, and a line a node cannot read counts as `*` too.
//!
//! This module must never be needed for correctness: every word may be lost, and nothing
//! but latency depends on it.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use onceprint_store::{Heard, NodeLink};
use rand::Rng;
use tokio::sync::Notify;

use crate::{Directory, StoreSignals};

/// How the word between nodes is sent.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// The least time between two rounds of the publisher: what is queued meanwhile goes
    /// out together. The first word after a quiet spell goes at once.
    pub linger: Duration,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig { linger: Duration::from_millis(20) }
    }
}

/// What one node tells the others.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Word {
    /// The store's lanes may have work: polls waiting on it look again.
    Wake { tenant_id: String, store_id: String },
    /// Forget the cached printer (and its login).
    Printer { tenant_id: String, printer_id: String },
    /// Forget the cached station.
    Station { tenant_id: String, station_id: String },
    /// Forget everything cached of the tenant (its keys, agent tokens, printers, stations).
    Tenant { tenant_id: String },
    /// Forget everything and wake every waiting poll.
    Everything,
}

const HEADER: &str = "op1";

fn plain(s: &str) -> bool {
    !s.is_empty() && !s.chars().any(|c| c.is_whitespace())
}

impl Word {
    fn line(&self) -> String {
        let (tag, a, b) = match self {
            Word::Wake { tenant_id, store_id } => ("w", tenant_id.as_str(), Some(store_id.as_str())),
            Word::Printer { tenant_id, printer_id } => ("p", tenant_id.as_str(), Some(printer_id.as_str())),
            Word::Station { tenant_id, station_id } => ("s", tenant_id.as_str(), Some(station_id.as_str())),
            Word::Tenant { tenant_id } => ("t", tenant_id.as_str(), None),
            Word::Everything => return "*".into(),
        };
        match b {
            Some(b) if plain(a) && plain(b) => format!("{tag} {a} {b}"),
            None if plain(a) => format!("{tag} {a}"),
            _ => "*".into(),
        }
    }

    fn parse(line: &str) -> Word {
        let parts: Vec<&str> = line.split(' ').collect();
        let two = |f: fn(String, String) -> Word| match parts.as_slice() {
            [_, a, b] if plain(a) && plain(b) => f((*a).to_owned(), (*b).to_owned()),
            _ => Word::Everything,
        };
        match parts.first().copied() {
            Some("w") => two(|tenant_id, store_id| Word::Wake { tenant_id, store_id }),
            Some("p") => two(|tenant_id, printer_id| Word::Printer { tenant_id, printer_id }),
            Some("s") => two(|tenant_id, station_id| Word::Station { tenant_id, station_id }),
            Some("t") => match parts.as_slice() {
                [_, a] if plain(a) => Word::Tenant { tenant_id: (*a).to_owned() },
                _ => Word::Everything,
            },
            _ => Word::Everything,
        }
    }
}

/// The messages that carry `words` from `node`, each at most `max_bytes` long.
pub fn encode(node: &str, words: &[Word], max_bytes: usize) -> Vec<String> {
    let header = format!("{HEADER} {node}");
    let mut out = Vec::new();
    let mut current = header.clone();
    for w in words {
        let line = w.line();
        if current.len() + 1 + line.len() > max_bytes && current.len() > header.len() {
            out.push(std::mem::replace(&mut current, header.clone()));
        }
        current.push('\n');
        current.push_str(&line);
    }
    if current.len() > header.len() {
        out.push(current);
    }
    out
}

/// The sender and the words of a message; `None` for a message of another kind.
pub fn decode(message: &str) -> Option<(String, Vec<Word>)> {
    let mut lines = message.split('\n');
    let node = lines.next()?.strip_prefix(HEADER)?.strip_prefix(' ')?;
    Some((node.to_owned(), lines.map(Word::parse).collect()))
}

/// Words waiting for the publisher.
#[derive(Default)]
pub struct Outbox {
    words: Mutex<HashSet<Word>>,
    ready: Notify,
}

impl Outbox {
    pub fn push(&self, word: Word) {
        let fresh = self.words.lock().unwrap_or_else(PoisonError::into_inner).insert(word);
        if fresh {
            self.ready.notify_one();
        }
    }

    fn take(&self) -> Vec<Word> {
        let mut words = self.words.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out: Vec<Word> = words.drain().collect();
        // `Everything` says it all.
        if out.contains(&Word::Everything) {
            out = vec![Word::Everything];
        }
        out
    }
}

/// A random id of this process, so that it can tell its own messages.
fn node_id() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::thread_rng();
    (0..12).map(|_| char::from(ALPHABET[rng.gen_range(0..ALPHABET.len())])).collect()
}

/// The word between nodes of one broker process.
pub struct Cluster {
    node: String,
    link: Arc<dyn NodeLink>,
    outbox: Arc<Outbox>,
    signals: Arc<StoreSignals>,
    directory: Arc<Directory>,
    config: ClusterConfig,
}

impl Cluster {
    /// Attaches the outbox to `signals` and `directory`, so that from now on their wake-ups
    /// and forgets are also queued for the other nodes.
    pub fn new(
        link: Arc<dyn NodeLink>,
        signals: Arc<StoreSignals>,
        directory: Arc<Directory>,
        config: ClusterConfig,
    ) -> Arc<Cluster> {
        let outbox = Arc::new(Outbox::default());
        signals.attach(outbox.clone());
        directory.attach(outbox.clone());
        Arc::new(Cluster { node: node_id(), link, outbox, signals, directory, config })
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    /// Starts the publisher and the listener; both end at shutdown.
    pub fn spawn(self: &Arc<Self>) -> [tokio::task::JoinHandle<()>; 2] {
        tracing::info!(node = %self.node, "telling the other broker nodes of wake-ups and set-up changes");
        let publisher = {
            let this = self.clone();
            tokio::spawn(async move { this.publish().await })
        };
        let listener = {
            let this = self.clone();
            tokio::spawn(async move { this.listen().await })
        };
        [publisher, listener]
    }

    async fn publish(&self) {
        let mut last: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                _ = self.outbox.ready.notified() => {}
                _ = self.signals.shutdown() => return,
            }
            if let Some(at) = last {
                tokio::time::sleep_until(at + self.config.linger).await;
            }
            last = Some(tokio::time::Instant::now());
            let words = self.outbox.take();
            if words.is_empty() {
                continue;
            }
            let messages = encode(&self.node, &words, self.link.max_message_bytes());
            if let Err(e) = self.link.send(&messages).await {
                // The other nodes find the work at their next re-check and the changes
                // when their cache entries expire.
                tracing::warn!(error = %e, words = words.len(), "could not tell the other broker nodes");
            }
        }
    }

    async fn listen(&self) {
        let mut heard = self.link.listen();
        loop {
            let h = tokio::select! {
                h = heard.recv() => h,
                _ = self.signals.shutdown() => return,
            };
            match h {
                None => return,
                Some(Heard::Reconnected) => self.apply(&Word::Everything),
                Some(Heard::Message(m)) => match decode(&m) {
                    Some((node, _)) if node == self.node => {}
                    Some((_, words)) => words.iter().for_each(|w| self.apply(w)),
                    None => tracing::debug!("ignored a message of another kind on the nodes' channel"),
                },
            }
        }
    }

    /// Acts on a word from another node, here only (it is not passed on).
    fn apply(&self, word: &Word) {
        match word {
            Word::Wake { tenant_id, store_id } => self.signals.notify_here(tenant_id, store_id),
            Word::Printer { tenant_id, printer_id } => self.directory.forget_printer_here(tenant_id, printer_id),
            Word::Station { tenant_id, station_id } => self.directory.forget_station_here(tenant_id, station_id),
            Word::Tenant { tenant_id } => self.directory.forget_tenant_here(tenant_id),
            Word::Everything => {
                self.directory.forget_everything_here();
                self.signals.notify_everyone_here();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_survive_the_trip_and_odd_ones_become_everything() {
        let words = vec![
            Word::Wake { tenant_id: "acme".into(), store_id: "s1".into() },
            Word::Printer { tenant_id: "acme".into(), printer_id: "p:1".into() },
            Word::Station { tenant_id: "acme".into(), station_id: "st.1".into() },
            Word::Tenant { tenant_id: "acme".into() },
            Word::Everything,
        ];
        let messages = encode("node1", &words, 7_900);
        assert_eq!(messages.len(), 1);
        assert_eq!(decode(&messages[0]), Some(("node1".into(), words)));

        let odd = encode("n", &[Word::Wake { tenant_id: "a b".into(), store_id: "s".into() }], 100);
        assert_eq!(decode(&odd[0]).map(|(_, w)| w), Some(vec![Word::Everything]));
        assert_eq!(decode("op1 n\nq what").map(|(_, w)| w), Some(vec![Word::Everything]));
        assert_eq!(decode("something else"), None);
    }

    #[test]
    fn long_batches_are_split_under_the_limit() {
        let words: Vec<Word> =
            (0..1000).map(|i| Word::Wake { tenant_id: "tenant".into(), store_id: format!("store-{i}") }).collect();
        let messages = encode("node1", &words, 200);
        assert!(messages.iter().all(|m| m.len() <= 200));
        let back: Vec<Word> = messages.iter().flat_map(|m| decode(m).map(|(_, w)| w).unwrap_or_default()).collect();
        assert_eq!(back, words);
    }
}
