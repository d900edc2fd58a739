//! The fault run's webhook receiver: it subscribes to the task events (`task.printed`,
//! `task.failed`, `task.in_doubt`) and checks "one event id per change" — an event may be
//! delivered more than once (at least once, the same id each time), but one change of a
//! task (its state with its attempt count) must never produce two events with different
//! ids, whichever node made or delivered it.
//!
//! The receiver answers every POST with 200 at once and keeps the bodies; it looks at
//! nothing but the JSON fields it judges.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::BenchError;

/// The kinds the run subscribes to.
pub const KINDS: [&str; 3] = ["task.printed", "task.failed", "task.in_doubt"];

/// What the receiver saw, judged.
#[derive(Debug, Clone, Default, Serialize)]
pub struct EventCheck {
    /// POSTs received (deliveries, repeats included).
    pub deliveries: usize,
    /// Distinct event ids.
    pub events: usize,
    /// Distinct changes (task, kind, attempts) the events name.
    pub changes: usize,
    /// Changes named by more than one event id (must be 0), with examples.
    pub changes_with_two_events: usize,
    pub examples: Vec<String>,
    /// Printed tasks (by the broker's list) with no `task.printed` event received.
    pub printed_without_event: usize,
}

pub struct EventSink {
    pub addr: SocketAddr,
    bodies: Arc<Mutex<Vec<Value>>>,
    task: JoinHandle<()>,
}

impl Drop for EventSink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl EventSink {
    pub async fn start() -> Result<EventSink, BenchError> {
        let listener =
            TcpListener::bind("127.0.0.1:0").await.map_err(|e| BenchError::io("binding the webhook receiver", e))?;
        let addr = listener.local_addr().map_err(|e| BenchError::io("the webhook receiver's address", e))?;
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let b = bodies.clone();
        let task = tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                tokio::spawn(serve(s, b.clone()));
            }
        });
        Ok(EventSink { addr, bodies, task })
    }

    pub fn url(&self) -> String {
        format!("http://{}/events", self.addr)
    }

    /// Every body received so far, in arrival order.
    pub fn bodies(&self) -> Vec<Value> {
        self.bodies.lock().map(|b| b.clone()).unwrap_or_default()
    }

    /// Distinct `task.printed` event task ids received so far.
    pub fn printed_tasks(&self) -> BTreeSet<String> {
        let bodies = self.bodies.lock().map(|b| b.clone()).unwrap_or_default();
        bodies
            .iter()
            .filter(|v| v["type"] == "task.printed")
            .filter_map(|v| v["data"]["task_id"].as_str().map(str::to_owned))
            .collect()
    }

    /// Judges what arrived against the tasks the broker says are printed.
    pub fn check(&self, printed: &BTreeSet<String>) -> EventCheck {
        let bodies = self.bodies.lock().map(|b| b.clone()).unwrap_or_default();
        let mut ids = BTreeSet::new();
        let mut by_change: BTreeMap<(String, String, i64), BTreeSet<String>> = BTreeMap::new();
        for v in &bodies {
            let id = v["id"].as_str().unwrap_or_default().to_owned();
            let change = (
                v["data"]["task_id"].as_str().unwrap_or_default().to_owned(),
                v["type"].as_str().unwrap_or_default().to_owned(),
                v["data"]["attempts"].as_i64().unwrap_or(-1),
            );
            ids.insert(id.clone());
            by_change.entry(change).or_default().insert(id);
        }
        let doubled: Vec<_> = by_change.iter().filter(|(_, ids)| ids.len() > 1).collect();
        let seen = self.printed_tasks();
        EventCheck {
            deliveries: bodies.len(),
            events: ids.len(),
            changes: by_change.len(),
            changes_with_two_events: doubled.len(),
            examples: doubled
                .iter()
                .take(5)
                .map(|((task, kind, attempts), ids)| format!("{task} {kind} (attempts {attempts}): {ids:?}"))
                .collect(),
            printed_without_event: printed.iter().filter(|t| !seen.contains(*t)).count(),
        }
    }
}

/// One connection: requests one after the other (keep-alive), each answered 200.
async fn serve(mut s: TcpStream, bodies: Arc<Mutex<Vec<Value>>>) {
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        // The head, then as many body bytes as Content-Length says.
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
        let len = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(0);
        while buf.len() < head_end + len {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        if let Ok(v) = serde_json::from_slice::<Value>(&buf[head_end..head_end + len]) {
            if let Ok(mut b) = bodies.lock() {
                b.push(v);
            }
        }
        buf.drain(..head_end + len);
        if s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await.is_err() {
            return;
        }
    }
}
