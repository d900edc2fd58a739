//! Printer transports (R15, R33): how the broker reaches a printer, one module per kind on
//! the one lane engine (`crate::lanes`).
//!
//! A printer's transport is a typed, serde-tagged [`TransportConfig`], parsed once where
//! it enters (the set-up API, and the directory when it reads a stored printer), checked by
//! [`TransportConfig::validate`], and shown through [`TransportConfig::redacted`]. Secrets
//! are of type [`Secret`], whose serialization is `"***"` everywhere except when the
//! configuration is written to the database ([`TransportConfig::to_stored_json`]); so a
//! new secret field (an MQTT password, say) cannot be echoed by accident: redaction is by
//! type, not by guessing key names.
//!
//! The kinds:
//! - `agent` ([`agent`]): pull. The store agent long-polls the broker, which hands out
//!   lanes by `claim`; the agent prints to a raw TCP 9100 printer and acknowledges.
//! - `webhook` ([`webhook`]): push. The broker POSTs each job to an HTTP endpoint (a vendor
//!   cloud or the merchant's own bridge) through the shared push driver ([`push`]); a
//!   signed callback or the status URL reports what happened.
//!
//! Adding a transport is one module here: its config variant, its encoding, its driver or
//! routes, and its tests. The lanes, the state machine and the ack rules stay the same.

pub mod agent;
pub mod push;
pub mod webhook;

use std::cell::Cell;

use onceprint_core::CoreError;
use serde::{Deserialize, Serialize};

thread_local! {
    /// Set only while [`TransportConfig::to_stored_json`] runs.
    static EXPOSE_SECRETS: Cell<bool> = const { Cell::new(false) };
}

/// A secret in a printer's configuration (a signing key, a password). It is kept as given,
/// since the broker needs it to sign or to log in, but is serialized as `"***"` except for
/// storage, and never printed by `Debug`.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The secret itself, for signing or logging in.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if EXPOSE_SECRETS.with(Cell::get) {
            s.serialize_str(&self.0)
        } else {
            s.serialize_str("***")
        }
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// `agent`: a store agent prints to a raw TCP 9100 ESC/POS printer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// `tcp://HOST:PORT`, as seen from the store agent's machine.
    pub address: String,
    /// Render profile for receipt documents (paper width, character encoding).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
}

/// `webhook`: jobs are POSTed to an HTTP endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    pub url: String,
    /// Signs jobs, and the endpoint's callbacks (at least 16 characters).
    pub secret: Secret,
    /// Optional: `GET status_url?task_id=…&idempotency_key=…` answers
    /// `{"status": "printed" | "pending" | "unknown" | "failed" | an ack outcome}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
}

/// How the broker reaches one printer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TransportConfig {
    Agent(AgentConfig),
    Webhook(WebhookConfig),
}

/// The kinds, for routing lanes to the module that serves them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransportKind {
    Agent,
    Webhook,
}

impl TransportKind {
    pub const ALL: [TransportKind; 2] = [TransportKind::Agent, TransportKind::Webhook];

    pub fn as_str(self) -> &'static str {
        match self {
            TransportKind::Agent => "agent",
            TransportKind::Webhook => "webhook",
        }
    }
}

/// What a transport's printers take: the bytes a delivery carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Encoding {
    /// ESC/POS for a thermal printer, documents rendered with this profile (or the default).
    EscPos { profile: Option<String> },
}

impl TransportConfig {
    /// Parses a transport object as a client sends it; the message names the field.
    pub fn from_request(value: serde_json::Value) -> Result<TransportConfig, CoreError> {
        let t: TransportConfig = serde_json::from_value(value).map_err(|e| {
            let msg = e.to_string();
            let msg =
                if msg.starts_with("unknown variant") { format!("{msg}; supported kinds: {}", kinds()) } else { msg };
            CoreError::invalid("transport", msg)
        })?;
        t.validate()?;
        Ok(t)
    }

    /// Parses a transport as stored; `None` for a configuration this version cannot read
    /// (such a printer is reached by no transport until it is set up again).
    pub fn from_stored(json: &str) -> Option<TransportConfig> {
        serde_json::from_str(json).ok()
    }

    /// The JSON kept in the database: the only serialization with the secrets in it.
    pub fn to_stored_json(&self) -> String {
        struct Reset;
        impl Drop for Reset {
            fn drop(&mut self) {
                EXPOSE_SECRETS.with(|e| e.set(false));
            }
        }
        EXPOSE_SECRETS.with(|e| e.set(true));
        let _reset = Reset;
        // Serializing plain strings and options into JSON cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The configuration as the API shows it: every [`Secret`] as `"***"`.
    pub fn redacted(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }

    pub fn kind(&self) -> TransportKind {
        match self {
            TransportConfig::Agent(_) => TransportKind::Agent,
            TransportConfig::Webhook(_) => TransportKind::Webhook,
        }
    }

    /// The bytes this printer's deliveries carry.
    pub fn encoding(&self) -> Encoding {
        match self {
            TransportConfig::Agent(a) => Encoding::EscPos { profile: a.profile.clone() },
            TransportConfig::Webhook(w) => Encoding::EscPos { profile: w.profile.clone() },
        }
    }

    /// Checks what serde cannot: addresses, URLs, secret length, the render profile.
    pub fn validate(&self) -> Result<(), CoreError> {
        let profile = match self {
            TransportConfig::Agent(a) => {
                check_tcp_address(&a.address)?;
                &a.profile
            }
            TransportConfig::Webhook(w) => {
                check_url("transport.url", &w.url)?;
                if let Some(s) = &w.status_url {
                    check_url("transport.status_url", s)?;
                }
                if w.secret.expose().len() < 16 || w.secret.expose().len() > 500 {
                    return Err(CoreError::invalid(
                        "transport.secret",
                        "16–500 characters, shared with the receiver to sign jobs and callbacks",
                    ));
                }
                &w.profile
            }
        };
        if let Some(p) = profile {
            crate::content::check_profile(p).map_err(|e| CoreError::invalid("transport.profile", e))?;
        }
        Ok(())
    }
}

fn kinds() -> String {
    TransportKind::ALL.map(TransportKind::as_str).join(", ")
}

fn check_tcp_address(address: &str) -> Result<(), CoreError> {
    let bad =
        || CoreError::invalid("transport.address", format!("{address:?} is not tcp://HOST:PORT with a port 1–65535"));
    let rest = address.strip_prefix("tcp://").ok_or_else(bad)?;
    let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
    let port_ok = port.parse::<u16>().map(|p| p > 0).unwrap_or(false);
    let host_ok = !host.is_empty()
        && host.len() <= 253
        && host.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '[' | ']' | ':'));
    if port_ok && host_ok {
        Ok(())
    } else {
        Err(bad())
    }
}

fn check_url(field: &str, url: &str) -> Result<(), CoreError> {
    if !(url.starts_with("http://") || url.starts_with("https://"))
        || url.len() > 2000
        || url.contains(char::is_whitespace)
    {
        return Err(CoreError::invalid(field, "must be an http:// or https:// URL"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn secrets_are_kept_for_storage_and_hidden_everywhere_else() {
        let t = TransportConfig::from_request(json!({
            "kind": "webhook", "url": "https://cloud.example/jobs", "secret": "0123456789abcdef-secret"
        }))
        .expect("valid");
        assert_eq!(t.redacted()["secret"], "***");
        assert!(!format!("{t:?}").contains("0123456789abcdef"));
        assert!(!serde_json::to_string(&t).unwrap_or_default().contains("0123456789abcdef"));
        let stored = t.to_stored_json();
        assert!(stored.contains("0123456789abcdef-secret"), "{stored}");
        assert_eq!(TransportConfig::from_stored(&stored), Some(t.clone()));
        // The flag does not outlive the storage call.
        assert_eq!(t.redacted()["secret"], "***");
    }

    #[test]
    fn stored_forms_of_earlier_versions_still_read() {
        let agent = TransportConfig::from_stored(r#"{"kind":"agent","address":"tcp://10.0.0.5:9100"}"#);
        assert_eq!(
            agent.map(|t| t.kind()),
            Some(TransportKind::Agent),
            "printers registered before the typed model keep working"
        );
        assert_eq!(TransportConfig::from_stored("{}"), None);
    }

    #[test]
    fn bad_transports_name_the_field() {
        for (value, field) in [
            (json!({"kind": "carrier-pigeon"}), "supported kinds: agent, webhook"),
            (json!({"kind": "agent", "address": "10.0.0.5:9100"}), "transport.address"),
            (json!({"kind": "agent", "address": "tcp://host:0"}), "transport.address"),
            (json!({"kind": "agent", "address": "tcp://h:1", "url": "http://x"}), "unknown field `url`"),
            (json!({"kind": "webhook", "url": "ftp://x", "secret": "0123456789abcdef"}), "transport.url"),
            (json!({"kind": "webhook", "url": "http://x", "secret": "short"}), "transport.secret"),
            (json!({"kind": "agent", "address": "tcp://h:1", "profile": "nope"}), "transport.profile"),
        ] {
            let e = TransportConfig::from_request(value.clone()).expect_err("refused").to_string();
            assert!(e.contains(field), "{value}: {e}");
        }
    }
}
