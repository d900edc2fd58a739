//! The store agent protocol (docs/API.md) as Rust types: the long-poll request and its
//! deliveries, the acknowledgements and the broker's per-ack results.
//!
//! Field names and outcome strings are fixed by the contract. Unknown fields in the
//! broker's answers are ignored so that the broker can add fields without breaking agents
//! already deployed in stores.

use serde::{Deserialize, Serialize};

/// `POST /v1/agent/poll` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PollRequest {
    pub agent_id: String,
    pub wait_ms: u64,
    pub max: usize,
    /// Extension: an id of this agent process, new at every start. A new session tells
    /// the broker this agent restarted, so its unconfirmed deliveries come back at once
    /// instead of after the delivery deadline.
    pub session: String,
    /// Extension (agent protocol 3): how long this process's session has been running, on
    /// its monotonic clock; filled in by the broker client for a broker that speaks 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_age_ms: Option<u64>,
}

/// `POST /v1/agent/poll` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PollResponse {
    #[serde(default)]
    pub deliveries: Vec<Delivery>,
}

/// One attempt of one task, handed to this agent for one of its store's printers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    pub task_id: String,
    pub attempt: u32,
    pub printer_id: String,
    /// `tcp://HOST:PORT`, `usb:///PATH` or `serial:///PATH[?baud=N][&flow=rtscts]`, as
    /// reachable from the agent's machine ([`crate::address`]).
    pub printer_address: String,
    /// `biz_no#printer_id` plus the suffixes of docs/API.md, "The store agent protocol".
    /// Journaled with every record: the journal answers by task id and by this key, so the same ticket under
    /// another task id is never printed twice.
    #[serde(default)]
    pub idempotency_key: String,
    /// Only `escpos` exists; anything else is acknowledged as `error`.
    pub content_type: String,
    /// Base64 of the bytes for the printer.
    pub data: String,
    /// Extension: the broker reprints on doubt for this print type and the previous
    /// attempt ended in doubt, so an older `started`/`in_doubt` journal record does not
    /// stop this attempt. A `printed` record still does.
    #[serde(default)]
    pub reprint: bool,
}

/// What became of one delivery, in the words of the contract (the broker's own type).
pub use onceprint_core::Outcome;

/// The outcome for a printer that reported it cannot print: nothing was sent.
pub fn outcome_of_blocker(b: onceprint_escpos::status::Blocker) -> Outcome {
    use onceprint_escpos::status::Blocker;
    match b {
        Blocker::NoPaper => Outcome::NoPaper,
        Blocker::CoverOpen => Outcome::CoverOpen,
        Blocker::PaperJam => Outcome::PaperJam,
        Blocker::Offline => Outcome::Offline,
    }
}

/// One acknowledgement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    pub task_id: String,
    pub attempt: u32,
    pub outcome: Outcome,
    pub detail: String,
}

/// `POST /v1/agent/acks` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcksRequest {
    pub acks: Vec<Ack>,
    /// Extension: who acknowledges (recorded in the audit trail).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    /// Extension: the acknowledging process's session, as in its polls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Agent protocol 2: the most deliveries the answer may carry, the next task of each
    /// printer whose task in flight these acks end. Sent only to a broker that speaks 2
    /// (an older one refuses fields it does not know).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<usize>,
}

/// `POST /v1/agent/acks` answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcksResponse {
    #[serde(default)]
    pub results: Vec<AckResult>,
    /// Agent protocol 2: deliveries handed out with the acks (asked for with `next`), to
    /// be printed as a poll's.
    #[serde(default)]
    pub deliveries: Vec<Delivery>,
}

/// The broker's verdict on one ack: `applied`, `duplicate` or `stale`. Kept as a string
/// because the agent only logs it and must not fail on a verdict added later.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AckResult {
    pub task_id: String,
    pub result: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_serialize_as_the_contract_spells_them() {
        for (o, s) in [
            (Outcome::Printed, "printed"),
            (Outcome::NoPaper, "no_paper"),
            (Outcome::CoverOpen, "cover_open"),
            (Outcome::Offline, "offline"),
            (Outcome::PaperJam, "paper_jam"),
            (Outcome::InDoubt, "in_doubt"),
            (Outcome::Error, "error"),
        ] {
            assert_eq!(serde_json::to_value(o).ok(), Some(serde_json::Value::String(s.into())));
            assert_eq!(o.as_str(), s);
        }
    }

    #[test]
    fn deliveries_tolerate_extra_fields() {
        let body = r#"{"deliveries":[{"task_id":"t1","attempt":2,"printer_id":"p1",
            "printer_address":"tcp://127.0.0.1:9100","idempotency_key":"A1#p1",
            "content_type":"escpos","data":"SGk=","priority":3}]}"#;
        let parsed: Result<PollResponse, _> = serde_json::from_str(body);
        let parsed = parsed.map_err(|e| e.to_string());
        assert_eq!(parsed.map(|p| p.deliveries.len()), Ok(1));
    }
}

/// `POST /v1/agent/status` body (extension): idle printers' status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusRequest {
    pub agent_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    pub printers: Vec<PrinterStatusReport>,
}

/// One idle printer's status: `ready`, `no_paper`, `cover_open`, `paper_jam` or `offline`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrinterStatusReport {
    pub printer_id: String,
    pub status: String,
}

/// `POST /v1/agent/status` answer: the printers to watch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusResponse {
    #[serde(default)]
    pub printers: Vec<WatchedPrinter>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchedPrinter {
    pub printer_id: String,
    pub printer_address: String,
}
