//! The printer addresses the broker accepts for `agent` printers: the three forms the
//! store agent can reach (`tcp://`, `usb://`, `serial://`), and a 400 naming them for
//! anything else.

use onceprint_core::CoreError;
use onceprint_engine::transport::TransportConfig;
use serde_json::json;

fn check(address: &str) -> Result<TransportConfig, CoreError> {
    TransportConfig::from_request(json!({"kind": "agent", "address": address}))
}

#[test]
fn tcp_usb_and_serial_addresses_are_accepted() {
    for address in [
        "tcp://10.0.0.5:9100",
        "tcp://printer.local:9100",
        "tcp://[::1]:9100",
        "usb:///dev/usb/lp0",
        "usb:///dev/pts/3",
        "serial:///dev/ttyUSB0",
        "serial:///dev/ttyUSB0?baud=19200",
        "serial:///dev/ttyS0?baud=115200&flow=rtscts",
        "serial:///dev/ttyS0?flow=rtscts&baud=9600",
        "serial:///dev/ttyS0?flow=none",
        "serial:///dev/serial/by-id/usb-Prolific_Technology_Inc._USB-Serial_Controller-if00-port0?baud=38400",
    ] {
        let t = check(address).unwrap_or_else(|e| panic!("{address}: {e}"));
        assert_eq!(t.redacted()["address"], address, "kept as given");
    }
}

#[test]
fn other_addresses_are_refused_with_the_three_forms_named() {
    for (address, why) in [
        ("10.0.0.5:9100", "is not a printer address the agent takes"),
        ("tcp://host:0", "port 1–65535"),
        ("tcp://host", "has no port"),
        ("lpt:///dev/lp0", "is not a printer address"),
        ("usb://dev/usb/lp0", "absolute device path"),
        ("usb:///", "absolute device path"),
        ("usb:///dev/usb/lp0?baud=9600", "absolute device path"),
        ("usb:///dev/my printer", "absolute device path"),
        ("serial://ttyUSB0", "absolute device path"),
        ("serial:///dev/ttyUSB0?baud=1920", "not one of"),
        ("serial:///dev/ttyUSB0?baud=", "not one of"),
        ("serial:///dev/ttyUSB0?baud=9600&baud=19200", "each once"),
        ("serial:///dev/ttyUSB0?flow=xonxoff", "serial setting"),
        ("serial:///dev/ttyUSB0?parity=none", "serial setting"),
        ("serial:///dev/ttyUSB0?", "serial setting"),
    ] {
        let e = check(address).expect_err(address);
        let CoreError::Invalid { field, message } = &e else { panic!("{address}: {e:?}") };
        assert_eq!(field, "transport.address", "{address}");
        assert!(message.contains(why), "{address}: {message}");
        for form in ["tcp://HOST:PORT", "usb:///ABSOLUTE/PATH", "serial:///ABSOLUTE/PATH[?baud=N][&flow=rtscts]"] {
            assert!(message.contains(form), "{address}: the message names {form}: {message}");
        }
    }
    let long = format!("usb:///{}", "d".repeat(2000));
    assert!(check(&long).is_err(), "an overlong path");
}
