//! The lane watch of a fault run: the watchdog's rule (no reachable printer's lane with work and no progress),
//! measured from outside.
//! While faults happen and while the lanes drain, the broker's `/metrics` is read twice a
//! second; the run records the longest time any printer's task was in flight, and every
//! printer the broker reported as stalled (`onceprint_lane_stalled 1`, which it raises
//! once a lane with work has made no progress for `stall_after_ms` while its printer could
//! be reached). A stall is a problem of the run.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use hyper::header::HeaderValue;
use hyper::Method;
use serde::Serialize;

use crate::http::Conn;

/// How often `/metrics` is read.
const EVERY: Duration = Duration::from_millis(500);

/// What the watch saw.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct LaneWatch {
    /// Successful reads of `/metrics` (none while the broker was down).
    pub samples: u64,
    /// The longest in-flight age seen, in seconds, and on which printer.
    pub longest_in_flight_s: f64,
    pub longest_in_flight_printer: Option<String>,
    /// Printers the broker reported stalled at some point.
    pub stalled: BTreeSet<String>,
}

/// A running watch; [`Watching::finish`] stops it and returns what it saw.
pub struct Watching {
    seen: Arc<Mutex<LaneWatch>>,
    task: tokio::task::JoinHandle<()>,
}

impl Watching {
    pub fn start(addr: SocketAddr) -> Watching {
        let seen = Arc::new(Mutex::new(LaneWatch::default()));
        let into = seen.clone();
        let task = tokio::spawn(async move {
            let auth = HeaderValue::from_static("Bearer none");
            let mut conn: Option<Conn> = None;
            loop {
                tokio::time::sleep(EVERY).await;
                if conn.is_none() {
                    conn = Conn::connect(addr).await.ok();
                }
                let Some(c) = conn.as_mut() else { continue };
                match c.request(Method::GET, "/metrics", &auth, None).await {
                    Ok((status, body)) if status.is_success() => {
                        let text = String::from_utf8_lossy(&body);
                        let mut w = into.lock().unwrap_or_else(PoisonError::into_inner);
                        read_sample(&text, &mut w);
                    }
                    // The broker is being killed or restarted: connect again next time.
                    _ => conn = None,
                }
            }
        });
        Watching { seen, task }
    }

    pub fn finish(self) -> LaneWatch {
        self.task.abort();
        self.seen.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

/// Folds one `/metrics` text into what was seen.
fn read_sample(text: &str, w: &mut LaneWatch) {
    w.samples += 1;
    for line in text.lines() {
        let Some((name_labels, value)) = line.rsplit_once(' ') else { continue };
        let Ok(value) = value.trim().parse::<f64>() else { continue };
        let printer = || {
            name_labels.split_once("printer=\"").and_then(|(_, rest)| rest.split_once('"')).map(|(p, _)| p.to_owned())
        };
        if name_labels.starts_with("onceprint_lane_in_flight_seconds{") && value > w.longest_in_flight_s {
            w.longest_in_flight_s = value;
            w.longest_in_flight_printer = printer();
        } else if name_labels.starts_with("onceprint_lane_stalled{") && value >= 1.0 {
            if let Some(p) = printer() {
                w.stalled.insert(p);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_give_the_longest_flight_and_the_stalls() {
        let mut w = LaneWatch::default();
        read_sample(
            "# TYPE onceprint_lane_in_flight_seconds gauge\n\
             onceprint_lane_in_flight_seconds{tenant=\"t\",store=\"s1\",printer=\"p0\"} 1.5\n\
             onceprint_lane_in_flight_seconds{tenant=\"t\",store=\"s1\",printer=\"p3\"} 4.25\n\
             onceprint_lane_stalled{tenant=\"t\",store=\"s1\",printer=\"p0\"} 0\n\
             onceprint_lane_stalled{tenant=\"t\",store=\"s1\",printer=\"p3\"} 1\n",
            &mut w,
        );
        read_sample("onceprint_lane_in_flight_seconds{tenant=\"t\",store=\"s1\",printer=\"p1\"} 2\n", &mut w);
        assert_eq!(w.samples, 2);
        assert_eq!((w.longest_in_flight_s, w.longest_in_flight_printer.as_deref()), (4.25, Some("p3")));
        assert_eq!(w.stalled.iter().collect::<Vec<_>>(), vec!["p3"]);
    }
}
