//! Printers on a device file: a USB printer-class device (`usb://`) or a serial port
//! (`serial://`), opened for reading and writing and driven without blocking through
//! Tokio's reactor, so that a device that never answers costs a timeout, not a thread.
//!
//! Only character devices are used. The address comes from the broker's printer set-up,
//! so a mistaken (or malicious) path such as a regular file must never be written to:
//! the opened file is checked before anything is sent, and a file is never created.
//!
//! A serial port is set to raw 8N1 (no echo, no line editing, no translation of line
//! ends: ESC/POS is binary), at the address's baud rate, with RTS/CTS only when the
//! address asks for it, and `CLOCAL` so that a printer without carrier detect can be
//! opened at all. Bytes left in its input queue by an earlier holder are flushed, so
//! they cannot be read as answers to this agent's status requests. A `usb://` device is
//! not configured: the `usblp` driver moves bytes as they are.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::time::Duration;

use rustix::termios::{self, ControlModes, InputModes, OptionalActions, QueueSelector, SpecialCodeIndex};
use tokio::io::unix::AsyncFd;

use crate::address::{FlowControl, PrinterAddress};
use crate::printer::DriverError;

/// An open printer device.
pub(crate) struct DeviceFile {
    /// `None` only while being dropped.
    fd: Option<AsyncFd<File>>,
}

impl DeviceFile {
    /// Opens the device of a `usb://` or `serial://` address (and configures a serial
    /// port), within `within`.
    pub(crate) async fn open(address: &PrinterAddress, within: Duration) -> Result<DeviceFile, DriverError> {
        let (path, serial) = match address {
            PrinterAddress::Usb { path } => (path.clone(), None),
            PrinterAddress::Serial { path, baud, flow } => (path.clone(), Some((*baud, *flow))),
            PrinterAddress::Tcp { .. } => {
                return Err(DriverError::Open {
                    address: address.to_string(),
                    source: io::Error::new(io::ErrorKind::InvalidInput, "not a device address"),
                })
            }
        };
        let open_error = |source| DriverError::Open { address: address.to_string(), source };
        // open(2) and the terminal ioctls are quick on a healthy device but can block on
        // a wedged driver, so they run off the runtime's threads. A call that outlives the
        // timeout finishes in the background and its file is closed there.
        let opening = tokio::task::spawn_blocking(move || open_blocking(&path, serial));
        let file = match tokio::time::timeout(within, opening).await {
            Ok(Ok(Ok(file))) => file,
            Ok(Ok(Err(e))) => return Err(open_error(e)),
            Ok(Err(join)) => return Err(open_error(io::Error::other(join.to_string()))),
            Err(_) => return Err(DriverError::OpenTimeout { address: address.to_string(), ms: within.as_millis() }),
        };
        let fd = register(file).map_err(open_error)?;
        Ok(DeviceFile { fd: Some(fd) })
    }

    fn fd(&self) -> io::Result<&AsyncFd<File>> {
        self.fd.as_ref().ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "device closed"))
    }

    /// Reads what the printer sent, waiting until there is something. `Ok(0)` means the
    /// device hung up.
    pub(crate) async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        let fd = self.fd()?;
        loop {
            let mut guard = fd.readable().await?;
            match guard.try_io(|f| {
                let mut file: &File = f.get_ref();
                file.read(buf)
            }) {
                Ok(result) => return result,
                // The readiness was stale; `try_io` cleared it, so the next wait is real.
                Err(_would_block) => continue,
            }
        }
    }

    /// Reads what the printer sent without waiting; `WouldBlock` when there is nothing.
    pub(crate) fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        let mut file: &File = self.fd()?.get_ref();
        file.read(buf)
    }

    /// Writes all of `bytes`, waiting whenever the driver's buffer is full (a serial
    /// port at 9600 baud takes about a kilobyte a second).
    pub(crate) async fn write_all(&self, mut bytes: &[u8]) -> io::Result<()> {
        let fd = self.fd()?;
        while !bytes.is_empty() {
            let mut guard = fd.writable().await?;
            match guard.try_io(|f| {
                let mut file: &File = f.get_ref();
                file.write(bytes)
            }) {
                Ok(Ok(0)) => return Err(io::Error::new(io::ErrorKind::WriteZero, "the device took no bytes")),
                Ok(Ok(n)) => bytes = &bytes[n..],
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
        Ok(())
    }
}

impl Drop for DeviceFile {
    fn drop(&mut self) {
        let Some(fd) = self.fd.take() else { return };
        let file = fd.into_inner();
        // Closing a serial port waits until its output has drained (up to the driver's
        // closing wait, 30 s by default), which a printer holding CTS low after a failed
        // job can make long. That wait must not stall a runtime thread that serves every
        // other printer, so the file is closed on a blocking thread.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn_blocking(move || drop(file));
            }
            Err(_) => drop(file),
        }
    }
}

/// Registers an open device with the runtime's reactor.
#[allow(unsafe_code)]
fn register(file: File) -> io::Result<AsyncFd<File>> {
    // SAFETY: a `File` owns its descriptor: it stays open and refers to the same open file
    // until the `AsyncFd` is dropped or hands the `File` back (`into_inner`, only in
    // `Drop` above), nothing here swaps it, and `as_raw_fd` always returns that descriptor.
    unsafe { AsyncFd::register(file) }.map_err(io::Error::from)
}

/// Opens `path` for reading and writing without blocking, refuses anything but a
/// character device, and configures a serial port.
fn open_blocking(path: &str, serial: Option<(u32, FlowControl)>) -> io::Result<File> {
    // `O_NONBLOCK`: reads and writes go through the reactor, and the open itself does not
    // wait for a serial port's carrier detect. `O_NOCTTY`: a serial port must never become
    // the agent's controlling terminal (whose hang-up would signal the agent).
    let file = OpenOptions::new().read(true).write(true).custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY).open(path)?;
    if !file.metadata()?.file_type().is_char_device() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a character device; the agent only writes to printer devices",
        ));
    }
    if let Some((baud, flow)) = serial {
        configure_serial(&file, baud, flow)?;
    }
    Ok(file)
}

fn configure_serial(file: &File, baud: u32, flow: FlowControl) -> io::Result<()> {
    let mut t = termios::tcgetattr(file).map_err(|e| {
        if e == rustix::io::Errno::NOTTY {
            io::Error::new(io::ErrorKind::InvalidInput, "not a serial port (not a terminal device)")
        } else {
            io::Error::from(e)
        }
    })?;
    t.make_raw();
    t.control_modes -= ControlModes::CSIZE | ControlModes::PARENB | ControlModes::CSTOPB | ControlModes::CRTSCTS;
    t.control_modes |= ControlModes::CS8 | ControlModes::CREAD | ControlModes::CLOCAL;
    if flow == FlowControl::RtsCts {
        t.control_modes |= ControlModes::CRTSCTS;
    }
    // No software flow control: the terminal would take XON/XOFF bytes in the printer's
    // binary answers (pushed status blocks) for itself, and send its own to the printer
    // between the bytes of a job.
    t.input_modes -= InputModes::IXON | InputModes::IXOFF | InputModes::IXANY;
    // A read returns as soon as one byte is there. With VMIN 0 a read without data
    // would return 0, which looks like a hang-up.
    t.special_codes[SpecialCodeIndex::VMIN] = 1;
    t.special_codes[SpecialCodeIndex::VTIME] = 0;
    t.set_speed(baud)?;
    termios::tcsetattr(file, OptionalActions::Now, &t)?;
    termios::tcflush(file, QueueSelector::IFlush)?;
    Ok(())
}
