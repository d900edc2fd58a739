//! The broker's MQTT settings: which MQTT server, as whom, and where the server's password
//! and ACL files go.

use std::path::PathBuf;

use crate::MqttError;

/// Where and how the broker connects to its MQTT server.
#[derive(Clone, PartialEq, Eq)]
pub struct MqttSettings {
    pub host: String,
    pub port: u16,
    /// The broker's own login on the MQTT server (also written to the password file).
    pub username: Option<String>,
    pub password: Option<String>,
    /// Stable across restarts: the MQTT server keeps the broker's session (its
    /// subscriptions and the results published while it was away) under this id.
    pub client_id: String,
    /// When set, the password and ACL files are kept here, written again whenever the
    /// printers in the database change.
    pub acl_dir: Option<PathBuf>,
    /// When set, the MQTT server whose pid this file holds gets SIGHUP after the files
    /// change, so that it reads them again.
    pub reload_pid_file: Option<PathBuf>,
    /// How often the files are compared with the database (milliseconds).
    pub acl_interval_ms: u64,
    /// An onceprint device that has not answered a job this long is sent it again (same
    /// attempt, same key), which it answers from its journal (milliseconds).
    pub resend_after_ms: i64,
    /// A Star printer's job whose fate the broker cannot know (published by an earlier
    /// broker process, never confirmed by the MQTT server, or in flight when the broker's
    /// session was lost) goes to a person when no result came this long after it was sent
    /// (milliseconds): it is never sent again.
    pub star_unknown_after_ms: i64,
    /// The MQTT server as printers reach it, which a Star printer learns from the
    /// server-setting file (`GET /cloudprnt-setting.json`): by default the host and port
    /// the broker itself uses, without TLS.
    pub for_printers: PrinterFacing,
}

/// Where printers reach the MQTT server (`serve --mqtt-printer-url`): it may differ from
/// where the broker does (another name, a TLS listener in front of Mosquitto).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrinterFacing {
    pub host: String,
    pub port: u16,
    /// Printers connect with TLS (`mqtts://`).
    pub tls: bool,
}

impl PrinterFacing {
    /// Parses `mqtt://HOST[:PORT]` (port 1883 by default) or `mqtts://HOST[:PORT]` (8883).
    /// No login: each printer uses its own, which it sends with the setting request.
    pub fn from_url(url: &str) -> Result<PrinterFacing, MqttError> {
        let bad = |why: &str| {
            MqttError::PrinterUrl(format!("{url:?}: {why}; expected mqtt://HOST:PORT or mqtts://HOST:PORT"))
        };
        let (rest, tls, default_port) = if let Some(r) = url.strip_prefix("mqtt://") {
            (r, false, 1883)
        } else if let Some(r) = url.strip_prefix("mqtts://") {
            (r, true, 8883)
        } else {
            return Err(bad("the scheme must be mqtt:// or mqtts://"));
        };
        let rest = rest.trim_end_matches('/');
        if rest.contains('/') || rest.contains('?') || rest.contains('@') {
            return Err(bad("no login, path or query is taken"));
        }
        let (host, port) = match rest.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => {
                (h.trim_start_matches('[').trim_end_matches(']'), p.parse::<u16>().map_err(|_| bad("bad port"))?)
            }
            _ => (rest, default_port),
        };
        if host.is_empty() || port == 0 {
            return Err(bad("a host and a port 1–65535 are needed"));
        }
        Ok(PrinterFacing { host: host.to_owned(), port, tls })
    }
}

impl std::fmt::Debug for MqttSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MqttSettings")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("client_id", &self.client_id)
            .field("acl_dir", &self.acl_dir)
            .field("reload_pid_file", &self.reload_pid_file)
            .finish()
    }
}

/// The client id the broker uses unless told otherwise.
pub const DEFAULT_CLIENT_ID: &str = "onceprint-broker";

impl MqttSettings {
    /// Parses `mqtt://[USER[:PASSWORD]@]HOST[:PORT]` (port 1883 by default; user and
    /// password may be percent-encoded). `username`/`password` given separately win over
    /// the ones in the URL.
    pub fn from_url(url: &str, username: Option<String>, password: Option<String>) -> Result<MqttSettings, MqttError> {
        let bad = |why: &str| MqttError::Url(format!("{url:?}: {why}; expected mqtt://[USER:PASSWORD@]HOST:PORT"));
        let rest = url.strip_prefix("mqtt://").ok_or_else(|| {
            if url.starts_with("mqtts://") {
                bad("TLS (mqtts://) is not supported yet")
            } else {
                bad("the scheme must be mqtt://")
            }
        })?;
        let rest = rest.trim_end_matches('/');
        if rest.contains('/') || rest.contains('?') {
            return Err(bad("no path or query is taken"));
        }
        let (auth, hostport) = match rest.rsplit_once('@') {
            Some((a, h)) => (Some(a), h),
            None => (None, rest),
        };
        let (url_user, url_pass) = match auth {
            Some(a) => match a.split_once(':') {
                Some((u, p)) => (
                    Some(decode(u).ok_or_else(|| bad("bad percent-encoding"))?),
                    Some(decode(p).ok_or_else(|| bad("bad percent-encoding"))?),
                ),
                None => (Some(decode(a).ok_or_else(|| bad("bad percent-encoding"))?), None),
            },
            None => (None, None),
        };
        let (host, port) = match hostport.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => {
                (h.trim_start_matches('[').trim_end_matches(']'), p.parse::<u16>().map_err(|_| bad("bad port"))?)
            }
            _ => (hostport, 1883),
        };
        if host.is_empty() || port == 0 {
            return Err(bad("a host and a port 1–65535 are needed"));
        }
        Ok(MqttSettings {
            host: host.to_owned(),
            port,
            username: username.or(url_user).filter(|u| !u.is_empty()),
            password: password.or(url_pass),
            client_id: DEFAULT_CLIENT_ID.into(),
            acl_dir: None,
            reload_pid_file: None,
            acl_interval_ms: 2_000,
            resend_after_ms: 30_000,
            star_unknown_after_ms: 20_000,
            for_printers: PrinterFacing { host: host.to_owned(), port, tls: false },
        })
    }
}

/// Percent-decoding of a URL's user or password.
fn decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_host_port_and_login() {
        let s = MqttSettings::from_url("mqtt://127.0.0.1:1884", None, None).expect("valid");
        assert_eq!((s.host.as_str(), s.port, s.username.as_deref()), ("127.0.0.1", 1884, None));
        let s = MqttSettings::from_url("mqtt://broker:p%40ss@mq.example", None, None).expect("valid");
        assert_eq!((s.host.as_str(), s.port), ("mq.example", 1883));
        assert_eq!((s.username.as_deref(), s.password.as_deref()), (Some("broker"), Some("p@ss")));
        let s = MqttSettings::from_url("mqtt://a:b@h:1", Some("c".into()), Some("d".into())).expect("valid");
        assert_eq!((s.username.as_deref(), s.password.as_deref()), (Some("c"), Some("d")), "flags win");
        assert!(!format!("{s:?}").contains("\"d\""), "the password is not logged");
        for bad in ["tcp://h:1", "mqtts://h:8883", "mqtt://h:0", "mqtt://h:x", "mqtt://", "mqtt://h:1/topic"] {
            assert!(MqttSettings::from_url(bad, None, None).is_err(), "{bad}");
        }
        let s = MqttSettings::from_url("mqtt://10.0.0.2:1884", None, None).expect("valid");
        assert_eq!(s.for_printers, PrinterFacing { host: "10.0.0.2".into(), port: 1884, tls: false });
    }

    #[test]
    fn printers_may_reach_the_mqtt_server_elsewhere() {
        let p = PrinterFacing::from_url("mqtts://mq.example.com").expect("valid");
        assert_eq!(p, PrinterFacing { host: "mq.example.com".into(), port: 8883, tls: true });
        let p = PrinterFacing::from_url("mqtt://192.168.1.5:1883/").expect("valid");
        assert_eq!(p, PrinterFacing { host: "192.168.1.5".into(), port: 1883, tls: false });
        for bad in ["http://h", "mqtt://u:p@h:1", "mqtt://h:1/x", "mqtts://", "mqtt://h:0"] {
            assert!(PrinterFacing::from_url(bad).is_err(), "{bad}");
        }
    }
}
