//! Printer transports (R15). Each printer names how the broker reaches it; engines for the
//! kinds live beside this file:
//!
//! - `agent`: the store agent pulls deliveries over HTTP and drives a raw TCP 9100 printer
//!   (`delivery.rs`). Send = hand out on poll, query = offer again to the same agent which
//!   answers from its journal, verify = the agent's token.
//! - `webhook`: the broker pushes each job to an HTTP endpoint — a vendor cloud or the
//!   merchant's own bridge — with an `Idempotency-Key` (`webhook.rs`). Send = POST (a 2xx
//!   means accepted, not printed), query = GET of the optional status URL, verify = an
//!   HMAC-signed callback.
//!
//! New transports add a kind here and an engine beside the others; the lanes, the state
//! machine and the ack rules stay the same.

use serde::Deserialize;

/// A printer's transport, as stored (JSON) on the printer.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Transport {
    Agent {
        /// `tcp://HOST:PORT` as seen from the agent.
        address: String,
    },
    Webhook {
        url: String,
        secret: String,
        /// Optional: `GET status_url?task_id=…&idempotency_key=…` answers
        /// `{"status": "printed" | "pending" | "failed" | an ack outcome}`.
        #[serde(default)]
        status_url: Option<String>,
    },
}

impl Transport {
    /// Parses the stored JSON; `None` for anything this version does not know.
    pub fn parse(json: &str) -> Option<Transport> {
        serde_json::from_str(json).ok()
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Transport::Agent { .. } => "agent",
            Transport::Webhook { .. } => "webhook",
        }
    }
}
