//! The broker as the agent's LAN glue sees it: the few requests the LAN listener, the
//! upload of offline tasks and the refresh of the saved directory make.
//!
//! [`crate::broker::BrokerClient`] is the one implementation the agent uses (HTTP to the
//! broker, unchanged). The trait exists so that the simulation (`onceprint sim`) can run
//! the same glue against the broker's engine in-process, over a network it simulates, and
//! so find the defects of that glue rather than of a model of it.

use crate::broker::{BrokerClient, BrokerError, Forwarded, Reachability};
use std::time::Duration;

/// The broker requests of the LAN path. Each method behaves as the HTTP request of the
/// same name: an error says no usable answer came (and, with
/// [`BrokerError::answer_lost`], that the broker may still have acted on it).
#[async_trait::async_trait]
pub trait Upstream: Send + Sync {
    /// Forwards a LAN submission's body to `POST /v1/agent/print-tasks`, naming
    /// `lan_printer`; the broker's answer as it is, or an error when none came within
    /// `timeout` or it was a 5xx.
    async fn forward_submission(
        &self,
        body: Vec<u8>,
        lan_printer: Option<&str>,
        timeout: Duration,
    ) -> Result<Forwarded, BrokerError>;

    /// `GET` of an agent path (`/v1/agent/directory`, `/v1/agent/lan-keys`), its JSON
    /// answer.
    async fn get_value(&self, path: &str) -> Result<serde_json::Value, BrokerError>;

    /// `POST` of `body` to an agent path (`/v1/agent/lan-listener`,
    /// `/v1/agent/offline-tasks`), its JSON answer; a non-2xx answer is an error.
    async fn post_value(
        &self,
        path: &str,
        body: serde_json::Value,
        timeout: Duration,
    ) -> Result<serde_json::Value, BrokerError>;

    /// Whether the broker speaks agent protocol `version`, as far as its last answer told.
    fn speaks(&self, version: u32) -> bool;

    /// Whether the broker answers, as the agent's requests found (the LAN `/healthz`).
    fn reachability(&self) -> Reachability;
}

#[async_trait::async_trait]
impl Upstream for BrokerClient {
    async fn forward_submission(
        &self,
        body: Vec<u8>,
        lan_printer: Option<&str>,
        timeout: Duration,
    ) -> Result<Forwarded, BrokerError> {
        BrokerClient::forward_submission(self, body, lan_printer, timeout).await
    }

    async fn get_value(&self, path: &str) -> Result<serde_json::Value, BrokerError> {
        self.get_json(path).await
    }

    async fn post_value(
        &self,
        path: &str,
        body: serde_json::Value,
        timeout: Duration,
    ) -> Result<serde_json::Value, BrokerError> {
        self.post_json(path, &body, timeout).await
    }

    fn speaks(&self, version: u32) -> bool {
        BrokerClient::speaks(self, version)
    }

    fn reachability(&self) -> Reachability {
        BrokerClient::reachability(self)
    }
}

/// `GET path`, read as `T` (an answer that does not read is [`BrokerError::Decode`], as
/// from the HTTP client).
pub(crate) async fn get<T: serde::de::DeserializeOwned>(up: &dyn Upstream, path: &str) -> Result<T, BrokerError> {
    serde_json::from_value(up.get_value(path).await?).map_err(|e| BrokerError::Decode(e.to_string()))
}

/// `POST body` to `path`, the answer read as `T`.
pub(crate) async fn post<T: serde::de::DeserializeOwned>(
    up: &dyn Upstream,
    path: &str,
    body: &impl serde::Serialize,
    timeout: Duration,
) -> Result<T, BrokerError> {
    let body = serde_json::to_value(body).map_err(|e| BrokerError::Decode(format!("the request: {e}")))?;
    serde_json::from_value(up.post_value(path, body, timeout).await?).map_err(|e| BrokerError::Decode(e.to_string()))
}
