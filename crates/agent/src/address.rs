//! The printer addresses the agent takes: a delivery's `printer_address`, as the broker's
//! printer set-up stores it.
//!
//! - `tcp://HOST:PORT`: a network printer on raw TCP (port 9100 on most printers).
//! - `usb:///dev/usb/lp0`: a USB printer-class device (Linux `usblp`), or any character
//!   device that takes ESC/POS as it is: the path is opened for reading and writing and
//!   nothing about it is configured.
//! - `serial:///dev/ttyUSB0?baud=19200&flow=rtscts`: a serial port (RS-232, or a USB
//!   serial adapter), set to raw 8N1 at `baud` (default 9600), without flow control
//!   unless `flow=rtscts` asks for RTS/CTS.
//!
//! Device paths are absolute. The broker checks the same forms when a printer is set up
//! (`engine::transport`, `check_agent_address`); the two lists of baud rates must stay
//! the same, so that a printer the broker accepted can always be reached by the agent.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

/// Baud rates a serial printer address may ask for: the standard rates receipt printers
/// and USB serial adapters support. A typo such as `1920` is refused rather than set.
pub const BAUD_RATES: [u32; 11] = [1200, 2400, 4800, 9600, 19200, 38400, 57600, 115200, 230400, 460800, 921600];

/// The baud rate of a `serial://` address that does not name one; the factory setting of
/// most serial receipt printers.
pub const DEFAULT_BAUD: u32 = 9600;

/// The longest device path taken (Linux's own limit is 4096; device paths are short).
const MAX_PATH: usize = 1024;

/// Hardware flow control of a serial port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FlowControl {
    /// None: the printer's buffer must take what is sent (the factory setting of most).
    #[default]
    None,
    /// RTS/CTS: the printer holds CTS low while its buffer is full.
    RtsCts,
}

/// Where a printer is, as the agent reaches it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrinterAddress {
    /// `tcp://HOST:PORT`.
    Tcp { host: String, port: u16 },
    /// `usb:///ABSOLUTE/PATH`.
    Usb { path: String },
    /// `serial:///ABSOLUTE/PATH[?baud=N][&flow=rtscts]`.
    Serial { path: String, baud: u32, flow: FlowControl },
}

impl PrinterAddress {
    /// The device path of a USB or serial printer; `None` for a network printer.
    pub fn device_path(&self) -> Option<&Path> {
        match self {
            PrinterAddress::Tcp { .. } => None,
            PrinterAddress::Usb { path } | PrinterAddress::Serial { path, .. } => Some(Path::new(path)),
        }
    }
}

impl FromStr for PrinterAddress {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(rest) = s.strip_prefix("tcp://") {
            parse_tcp(s, rest)
        } else if let Some(rest) = s.strip_prefix("usb://") {
            Ok(PrinterAddress::Usb { path: device_path(s, rest)?.to_owned() })
        } else if let Some(rest) = s.strip_prefix("serial://") {
            parse_serial(s, rest)
        } else {
            Err(format!(
                "printer address {s:?} is none of tcp://HOST:PORT, usb:///PATH, serial:///PATH[?baud=N][&flow=rtscts]"
            ))
        }
    }
}

fn parse_tcp(s: &str, rest: &str) -> Result<PrinterAddress, String> {
    let rest = rest.trim_end_matches('/');
    let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
        let (host, after) = v6.split_once(']').ok_or_else(|| format!("printer address {s:?}: unclosed '['"))?;
        let port = after.strip_prefix(':').ok_or_else(|| format!("printer address {s:?} has no port"))?;
        (host, port)
    } else {
        rest.rsplit_once(':').ok_or_else(|| format!("printer address {s:?} has no port"))?
    };
    if host.is_empty() {
        return Err(format!("printer address {s:?} has no host"));
    }
    let port: u16 = port.parse().map_err(|_| format!("printer address {s:?}: bad port {port:?}"))?;
    if port == 0 {
        return Err(format!("printer address {s:?}: port 0"));
    }
    Ok(PrinterAddress::Tcp { host: host.to_owned(), port })
}

/// The absolute device path after `usb://` or `serial://` (so `usb:///dev/usb/lp0` has
/// the path `/dev/usb/lp0`).
fn device_path<'a>(s: &str, path: &'a str) -> Result<&'a str, String> {
    if !path.starts_with('/') || path.len() < 2 {
        return Err(format!("printer address {s:?}: the device path must be absolute, like usb:///dev/usb/lp0"));
    }
    // Characters, as the broker counts them when it takes the printer's address.
    if path.chars().count() > MAX_PATH {
        return Err(format!("printer address {s:?}: the device path is longer than {MAX_PATH} characters"));
    }
    if path.chars().any(|c| c.is_control() || c.is_whitespace() || c == '?' || c == '#') {
        return Err(format!("printer address {s:?}: the device path has a space, control character, '?' or '#'"));
    }
    Ok(path)
}

fn parse_serial(s: &str, rest: &str) -> Result<PrinterAddress, String> {
    let (path, query) = match rest.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (rest, None),
    };
    let path = device_path(s, path)?.to_owned();
    let (mut baud, mut flow) = (None, None);
    for pair in query.map(|q| q.split('&')).into_iter().flatten() {
        match pair.split_once('=') {
            Some(("baud", v)) if baud.is_none() => {
                let rate = v.parse::<u32>().ok().filter(|r| BAUD_RATES.contains(r));
                baud = Some(
                    rate.ok_or_else(|| format!("printer address {s:?}: baud {v:?} is not one of {BAUD_RATES:?}"))?,
                );
            }
            Some(("flow", v)) if flow.is_none() => {
                flow = Some(match v {
                    "rtscts" => FlowControl::RtsCts,
                    "none" => FlowControl::None,
                    _ => return Err(format!("printer address {s:?}: flow {v:?} is not rtscts or none")),
                });
            }
            _ => {
                return Err(format!(
                    "printer address {s:?}: {pair:?} is not a serial setting (baud=N and flow=rtscts, each once)"
                ))
            }
        }
    }
    Ok(PrinterAddress::Serial { path, baud: baud.unwrap_or(DEFAULT_BAUD), flow: flow.unwrap_or_default() })
}

impl fmt::Display for PrinterAddress {
    /// The address in a form that parses back to the same value; a serial address always
    /// says its baud rate, so that the journal and the logs show what was used.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PrinterAddress::Tcp { host, port } if host.contains(':') => write!(f, "tcp://[{host}]:{port}"),
            PrinterAddress::Tcp { host, port } => write!(f, "tcp://{host}:{port}"),
            PrinterAddress::Usb { path } => write!(f, "usb://{path}"),
            PrinterAddress::Serial { path, baud, flow } => {
                write!(f, "serial://{path}?baud={baud}")?;
                if *flow == FlowControl::RtsCts {
                    f.write_str("&flow=rtscts")?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_and_print_back() {
        for s in [
            "tcp://127.0.0.1:9100",
            "tcp://printer.local:9100",
            "tcp://[::1]:9100",
            "usb:///dev/usb/lp0",
            "serial:///dev/ttyUSB0?baud=9600",
            "serial:///dev/serial/by-id/usb-FTDI_FT232R-if00-port0?baud=115200&flow=rtscts",
        ] {
            let a: PrinterAddress = s.parse().unwrap_or_else(|e| panic!("{s}: {e}"));
            assert_eq!(a.to_string(), s);
        }
    }

    #[test]
    fn serial_settings_have_defaults_and_any_order() {
        let parse = |s: &str| s.parse::<PrinterAddress>().unwrap_or_else(|e| panic!("{s}: {e}"));
        let serial = |baud, flow| PrinterAddress::Serial { path: "/dev/ttyS0".into(), baud, flow };
        assert_eq!(parse("serial:///dev/ttyS0"), serial(9600, FlowControl::None));
        assert_eq!(parse("serial:///dev/ttyS0?baud=19200"), serial(19200, FlowControl::None));
        assert_eq!(parse("serial:///dev/ttyS0?flow=rtscts&baud=38400"), serial(38400, FlowControl::RtsCts));
        assert_eq!(parse("serial:///dev/ttyS0?flow=none"), serial(9600, FlowControl::None));
        assert_eq!(parse("usb:///dev/usb/lp0").device_path(), Some(Path::new("/dev/usb/lp0")));
        assert_eq!(parse("tcp://h:1").device_path(), None);
    }

    #[test]
    fn bad_addresses_are_refused_with_the_reason() {
        for (bad, why) in [
            ("127.0.0.1:9100", "none of tcp://"),
            ("tcp://host", "no port"),
            ("tcp://:9100", "no host"),
            ("tcp://h:0", "port 0"),
            ("tcp://h:99999", "bad port"),
            ("tcp://[::1", "unclosed"),
            ("usb://dev/usb/lp0", "absolute"),
            ("usb://", "absolute"),
            ("usb:///", "absolute"),
            ("usb:///dev/usb/lp0?baud=9600", "'?'"),
            ("usb:///dev/my printer", "space"),
            ("serial://ttyS0", "absolute"),
            ("serial:///dev/ttyS0?baud=1920", "not one of"),
            ("serial:///dev/ttyS0?baud=fast", "not one of"),
            ("serial:///dev/ttyS0?baud=9600&baud=19200", "each once"),
            ("serial:///dev/ttyS0?flow=xonxoff", "not rtscts"),
            ("serial:///dev/ttyS0?parity=even", "not a serial setting"),
            ("serial:///dev/ttyS0?", "not a serial setting"),
            ("lpt:///dev/lp0", "none of"),
        ] {
            match bad.parse::<PrinterAddress>() {
                Ok(a) => panic!("{bad} parsed as {a:?}"),
                Err(e) => assert!(e.contains(why), "{bad}: {e}"),
            }
        }
        assert!(format!("usb:///{}", "d".repeat(2000)).parse::<PrinterAddress>().is_err());
    }
}
