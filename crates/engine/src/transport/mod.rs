//! Printer transports: how the broker reaches a printer, one module per kind on
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
//!   lanes by `claim`; the agent prints to a raw TCP 9100, USB or serial printer and
//!   acknowledges.
//! - `webhook` ([`webhook`]): push. The broker POSTs each job to an HTTP endpoint (a vendor
//!   cloud or the merchant's own bridge) through the shared push driver ([`push`]); a
//!   signed callback or the status URL reports what happened.
//! - `cloudprnt` ([`cloudprnt`]) and `epson_sdp` ([`epson_sdp`]): the printer polls the
//!   broker over HTTP with its own login. Both are thin protocol adapters on the shared
//!   polling mechanism ([`polled`]: the printer's status, its one lane, "fetched",
//!   confirmation by job token, offline detection).
//!
//! Adding a transport is one module here: its config variant, its encoding, its driver or
//! routes, and its tests. The lanes, the state machine and the ack rules stay the same.

pub mod agent;
pub mod cloudprnt;
pub mod epson_sdp;
pub mod polled;
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

/// `agent`: a store agent prints to an ESC/POS printer on raw TCP 9100, USB or a serial
/// port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// `tcp://HOST:PORT`, `usb:///PATH` or `serial:///PATH[?baud=N][&flow=rtscts]`, as
    /// seen from the store agent's machine.
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

/// `cloudprnt`: a Star printer polls the broker's `/cloudprnt` URL over HTTP.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CloudPrntConfig {
    /// The printer's MAC address, as it sends it in `printerMAC` (kept in lower case).
    pub mac: String,
    /// How often the printer is set to poll (its CloudPRNT settings page); it is offline
    /// after 2 × this + 5 s without a poll. Default 5 s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poll_interval_s: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
}

/// Which device protocol an MQTT printer speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MqttProtocol {
    /// Star CloudPRNT Version MQTT (Full MQTT), addressed by MAC.
    Cloudprnt,
    /// onceprint's own device protocol (docs/MQTT.md), addressed by device id.
    Onceprint,
}

/// `mqtt`: jobs are published to the printer through the MQTT server the broker uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MqttConfig {
    pub protocol: MqttProtocol,
    /// For `cloudprnt`: the printer's MAC (kept in lower case).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// For `onceprint`: the device id its firmware uses in topics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
}

impl MqttConfig {
    /// The device's address in its topics: the MAC or the device id.
    pub fn device(&self) -> &str {
        match self.protocol {
            MqttProtocol::Cloudprnt => self.mac.as_deref().unwrap_or_default(),
            MqttProtocol::Onceprint => self.device_id.as_deref().unwrap_or_default(),
        }
    }
}

/// `epson_sdp`: an Epson TM printer polls with Server Direct Print.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EpsonSdpConfig {
    /// The device id the printer sends as `ID=` (its Server Direct Print settings); when
    /// absent, any id is taken from the authenticated printer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub printer_id: Option<String>,
    /// The printer's polling interval (its settings page); offline after 2 × this + 5 s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poll_interval_s: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
}

/// How the broker reaches one printer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TransportConfig {
    Agent(AgentConfig),
    Webhook(WebhookConfig),
    Cloudprnt(CloudPrntConfig),
    Mqtt(MqttConfig),
    EpsonSdp(EpsonSdpConfig),
}

/// The kinds, for routing lanes to the module that serves them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransportKind {
    Agent,
    Webhook,
    Cloudprnt,
    Mqtt,
    EpsonSdp,
}

impl TransportKind {
    pub const ALL: [TransportKind; 5] = [
        TransportKind::Agent,
        TransportKind::Webhook,
        TransportKind::Cloudprnt,
        TransportKind::Mqtt,
        TransportKind::EpsonSdp,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TransportKind::Agent => "agent",
            TransportKind::Webhook => "webhook",
            TransportKind::Cloudprnt => "cloudprnt",
            TransportKind::Mqtt => "mqtt",
            TransportKind::EpsonSdp => "epson_sdp",
        }
    }

    /// Whether the printer logs in to the broker (or to its MQTT server) itself, with a
    /// login the broker makes when the printer is created.
    pub fn has_login(self) -> bool {
        matches!(self, TransportKind::Cloudprnt | TransportKind::Mqtt | TransportKind::EpsonSdp)
    }
}

/// What a transport's printers take: the bytes a delivery carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Encoding {
    /// ESC/POS for a thermal printer, documents rendered with this profile (or the default).
    EscPos { profile: Option<String> },
    /// The print area as a 1-bit PNG (CloudPRNT's `image/png`): `dots` wide as the printer
    /// reports its own width, else the profile's; no frame, the cut told apart. Such
    /// printers cannot take raw ESC/POS.
    Png { profile: Option<String>, dots: Option<u16> },
    /// Plain text the printer prints as it is, in its own font and code page (CloudPRNT's
    /// `text/plain`): only `text` content of printable ASCII, with a reprint's banner line.
    Text { profile: Option<String> },
    /// Epson ePOS-Print XML (`<epos-print>`: text, or a raster image of the receipt, then
    /// a cut), the print data of Server Direct Print.
    EposXml { profile: Option<String> },
}

impl Encoding {
    /// The render profile configured for the printer (`None`: the default one).
    pub fn profile(&self) -> Option<&str> {
        match self {
            Encoding::EscPos { profile }
            | Encoding::Png { profile, .. }
            | Encoding::Text { profile }
            | Encoding::EposXml { profile } => profile.as_deref(),
        }
    }

    /// Whether content of this type can be printed in this encoding; the error says why
    /// not and what to send instead.
    pub fn accepts(&self, content_type: &str) -> Result<(), String> {
        match (self, content_type) {
            (Encoding::EscPos { .. }, _) => Ok(()),
            (_, "escpos") => Err("raw ESC/POS bytes cannot be printed by this printer (it takes rendered \
                 receipts, not printer commands); send a receipt document (doc), markup or text"
                .into()),
            _ => Ok(()),
        }
    }
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
        Ok(t.normalized())
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
            TransportConfig::Cloudprnt(_) => TransportKind::Cloudprnt,
            TransportConfig::Mqtt(_) => TransportKind::Mqtt,
            TransportConfig::EpsonSdp(_) => TransportKind::EpsonSdp,
        }
    }

    /// The bytes this printer's deliveries carry.
    pub fn encoding(&self) -> Encoding {
        match self {
            TransportConfig::Agent(a) => Encoding::EscPos { profile: a.profile.clone() },
            TransportConfig::Webhook(w) => Encoding::EscPos { profile: w.profile.clone() },
            TransportConfig::Cloudprnt(c) => Encoding::Png { profile: c.profile.clone(), dots: None },
            // A Star printer over MQTT gets the same rendering as over HTTP; an onceprint
            // device's firmware prints ESC/POS.
            TransportConfig::Mqtt(m) => match m.protocol {
                MqttProtocol::Cloudprnt => Encoding::Png { profile: m.profile.clone(), dots: None },
                MqttProtocol::Onceprint => Encoding::EscPos { profile: m.profile.clone() },
            },
            TransportConfig::EpsonSdp(e) => Encoding::EposXml { profile: e.profile.clone() },
        }
    }

    /// The same configuration in its canonical spelling (a MAC in lower case), so that
    /// what is stored and compared does not depend on how a client wrote it.
    pub fn normalized(mut self) -> TransportConfig {
        match &mut self {
            TransportConfig::Cloudprnt(c) => c.mac = c.mac.to_ascii_lowercase(),
            TransportConfig::Mqtt(m) => m.mac = m.mac.take().map(|m| m.to_ascii_lowercase()),
            _ => {}
        }
        self
    }

    /// Checks what serde cannot: addresses, URLs, secret length, the render profile.
    pub fn validate(&self) -> Result<(), CoreError> {
        let profile = match self {
            TransportConfig::Agent(a) => {
                check_agent_address(&a.address)?;
                &a.profile
            }
            TransportConfig::Webhook(w) => {
                check_url("transport.url", &w.url)?;
                if let Some(s) = &w.status_url {
                    check_url("transport.status_url", s)?;
                }
                // Characters, as the OpenAPI document's `minLength` and `maxLength` count
                // them (a short secret of multi-byte characters is refused by both alike).
                if !(16..=500).contains(&w.secret.expose().chars().count()) {
                    return Err(CoreError::invalid(
                        "transport.secret",
                        "16–500 characters, shared with the receiver to sign jobs and callbacks",
                    ));
                }
                &w.profile
            }
            TransportConfig::Cloudprnt(c) => {
                check_mac("transport.mac", &c.mac)?;
                check_poll_interval(c.poll_interval_s)?;
                &c.profile
            }
            TransportConfig::Mqtt(m) => {
                match m.protocol {
                    MqttProtocol::Cloudprnt => match (&m.mac, &m.device_id) {
                        (Some(mac), None) => check_mac("transport.mac", mac)?,
                        _ => {
                            return Err(CoreError::invalid(
                                "transport.mac",
                                "a CloudPRNT MQTT printer is addressed by its mac (and takes no device_id)",
                            ))
                        }
                    },
                    MqttProtocol::Onceprint => match (&m.device_id, &m.mac) {
                        (Some(id), None) => check_device_id("transport.device_id", id)?,
                        _ => {
                            return Err(CoreError::invalid(
                                "transport.device_id",
                                "an onceprint MQTT device is addressed by its device_id (and takes no mac)",
                            ))
                        }
                    },
                }
                &m.profile
            }
            TransportConfig::EpsonSdp(e) => {
                if let Some(id) = &e.printer_id {
                    check_device_id("transport.printer_id", id)?;
                }
                check_poll_interval(e.poll_interval_s)?;
                &e.profile
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

/// The printer addresses a store agent takes: `tcp://HOST:PORT`, `usb:///ABSOLUTE/PATH`
/// (a USB printer device) and `serial:///ABSOLUTE/PATH[?baud=N][&flow=rtscts]`. The
/// agent parses the same forms (`onceprint_agent::address`); the baud rates here must be
/// its `BAUD_RATES`, so that every printer accepted here can be reached there.
fn check_agent_address(address: &str) -> Result<(), CoreError> {
    const FORMS: &str =
        "tcp://HOST:PORT (port 1–65535), usb:///ABSOLUTE/PATH or serial:///ABSOLUTE/PATH[?baud=N][&flow=rtscts]";
    const BAUD_RATES: [u32; 11] = [1200, 2400, 4800, 9600, 19200, 38400, 57600, 115200, 230400, 460800, 921600];
    let bad = |why: &str| {
        CoreError::invalid("transport.address", format!("{address:?} {why}; a printer address is one of {FORMS}"))
    };
    let check_path = |path: &str| {
        let path_ok = path.starts_with('/')
            // Characters, as the OpenAPI document's pattern counts them (the agent too).
            && (2..=1024).contains(&path.chars().count())
            && !path.chars().any(|c| c.is_control() || c.is_whitespace() || c == '?' || c == '#');
        if path_ok {
            Ok(())
        } else {
            Err(bad("has no absolute device path (without spaces, '?' or '#')"))
        }
    };
    if let Some(rest) = address.strip_prefix("tcp://") {
        let (host, port) = rest.rsplit_once(':').ok_or_else(|| bad("has no port"))?;
        let port_ok = port.parse::<u16>().map(|p| p > 0).unwrap_or(false);
        let host_ok = !host.is_empty()
            && host.len() <= 253
            && host.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '[' | ']' | ':'));
        if port_ok && host_ok {
            Ok(())
        } else {
            Err(bad("is not tcp://HOST:PORT with a port 1–65535"))
        }
    } else if let Some(path) = address.strip_prefix("usb://") {
        check_path(path)
    } else if let Some(rest) = address.strip_prefix("serial://") {
        let (path, query) = match rest.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (rest, None),
        };
        check_path(path)?;
        let (mut baud, mut flow) = (false, false);
        for pair in query.into_iter().flat_map(|q| q.split('&')) {
            match pair.split_once('=') {
                Some(("baud", rate)) if !baud => {
                    baud = true;
                    if !rate.parse::<u32>().is_ok_and(|r| BAUD_RATES.contains(&r)) {
                        return Err(bad(&format!("asks for baud {rate:?}, which is not one of {BAUD_RATES:?}")));
                    }
                }
                Some(("flow", "rtscts" | "none")) if !flow => flow = true,
                _ => {
                    return Err(bad(&format!(
                        "has the serial setting {pair:?}; the settings are baud=N and flow=rtscts (or none), each once"
                    )))
                }
            }
        }
        Ok(())
    } else {
        Err(bad("is not a printer address the agent takes"))
    }
}

/// `00:11:62:AA:BB:CC` (either case; `-` separators are not what CloudPRNT sends).
fn check_mac(field: &str, mac: &str) -> Result<(), CoreError> {
    let parts: Vec<&str> = mac.split(':').collect();
    if parts.len() == 6 && parts.iter().all(|p| p.len() == 2 && p.chars().all(|c| c.is_ascii_hexdigit())) {
        Ok(())
    } else {
        Err(CoreError::invalid(field, format!("{mac:?} is not a MAC address like 00:11:62:AA:BB:CC")))
    }
}

/// A device id used in MQTT topics and Epson's `ID=`: no topic separators or wildcards.
fn check_device_id(field: &str, id: &str) -> Result<(), CoreError> {
    if !id.is_empty()
        && id.len() <= 64
        && id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'))
    {
        Ok(())
    } else {
        Err(CoreError::invalid(field, "1–64 characters of A–Z, a–z, 0–9, '-', '_', '.', ':'"))
    }
}

fn check_poll_interval(s: Option<u32>) -> Result<(), CoreError> {
    match s {
        Some(s) if !(1..=3600).contains(&s) => {
            Err(CoreError::invalid("transport.poll_interval_s", "1–3600 seconds, as set on the printer"))
        }
        _ => Ok(()),
    }
}

fn check_url(field: &str, url: &str) -> Result<(), CoreError> {
    if !(url.starts_with("http://") || url.starts_with("https://"))
        || url.chars().count() > 2000
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
    fn macs_are_kept_in_one_spelling() {
        let t = TransportConfig::from_request(json!({"kind": "cloudprnt", "mac": "00:11:62:AA:BB:CC"})).expect("valid");
        assert_eq!(t.redacted()["mac"], "00:11:62:aa:bb:cc");
        assert_eq!(t.encoding().accepts("escpos").map_err(|e| e.contains("raw ESC/POS")), Err(true));
        assert_eq!(t.encoding().accepts("doc"), Ok(()));
        let e = TransportConfig::from_request(json!({"kind": "epson_sdp"})).expect("valid");
        assert_eq!(e.encoding(), Encoding::EposXml { profile: None });
        assert!(e.encoding().accepts("escpos").is_err(), "an Epson SDP printer takes no raw ESC/POS either");
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
            (json!({"kind": "carrier-pigeon"}), "supported kinds: agent, webhook, cloudprnt, mqtt, epson_sdp"),
            (json!({"kind": "cloudprnt", "mac": "00:11:62"}), "transport.mac"),
            (json!({"kind": "cloudprnt", "mac": "00:11:62:aa:bb:cc", "poll_interval_s": 0}), "poll_interval_s"),
            (json!({"kind": "mqtt", "protocol": "cloudprnt", "device_id": "x"}), "transport.mac"),
            (json!({"kind": "mqtt", "protocol": "onceprint", "device_id": "a/b"}), "transport.device_id"),
            (json!({"kind": "mqtt", "protocol": "zigbee", "device_id": "a"}), "unknown variant"),
            (json!({"kind": "epson_sdp", "printer_id": "#"}), "transport.printer_id"),
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
