//! A pseudo-terminal as a simulated printer's device: what a printer on a serial port or
//! a USB printer-class device looks like to the agent, a character device path such as
//! `/dev/pts/3` to open, write jobs to and read status bytes from.
//!
//! The simulator holds the master side and serves it with the same code as a TCP
//! connection. It also keeps the slave side open itself, for two reasons: without any
//! slave open, a read on the master fails with an I/O error (and polls ready forever), so
//! an agent closing its idle device would look like the device vanishing; and the line
//! settings (raw mode, below) belong to the terminal and last only as long as someone has
//! it open.
//!
//! The terminal is put in raw mode at once: no echo, no line editing, no translation of
//! `\n` to `\r\n`. A real printer port moves bytes unchanged, and an agent that opens the
//! path as a USB device (`usb://`) does not configure a terminal at all, so the defaults
//! of a fresh pty (cooked mode with echo) would corrupt every job.

use std::ffi::OsString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use rustix::fs::{Mode, OFlags};
use rustix::pty::OpenptFlags;
use rustix::termios;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// One pseudo-terminal; dropping it makes the device vanish.
pub(crate) struct Pty {
    master: AsyncFd<File>,
    /// Kept open for the life of the pty; see the module doc.
    _slave: OwnedFd,
    path: PathBuf,
}

impl Pty {
    /// Creates a new pty in raw mode. Must be called inside a Tokio runtime.
    pub(crate) fn open() -> io::Result<Pty> {
        let master = rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
        rustix::pty::grantpt(&master)?;
        rustix::pty::unlockpt(&master)?;
        let name = rustix::pty::ptsname(&master, Vec::new())?;
        let path = PathBuf::from(OsString::from_vec(name.into_bytes()));
        // `NOCTTY`: the simulator must not make the printer its controlling terminal.
        let slave = rustix::fs::open(&path, OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC, Mode::empty())?;
        let mut settings = termios::tcgetattr(&slave)?;
        settings.make_raw();
        termios::tcsetattr(&slave, termios::OptionalActions::Now, &settings)?;
        rustix::io::ioctl_fionbio(&master, true)?;
        let master = register(File::from(master))?;
        Ok(Pty { master, _slave: slave, path })
    }

    /// The slave side's path, which the agent opens.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

/// Registers the master side with the runtime's reactor.
fn register(master: File) -> io::Result<AsyncFd<File>> {
    // SAFETY: a `File` owns its descriptor: it stays open and refers to the same open file
    // until the `AsyncFd` is dropped (nothing here takes the `File` back or swaps it), and
    // `as_raw_fd` always returns that descriptor.
    unsafe { AsyncFd::register(master) }.map_err(io::Error::from)
}

impl AsyncRead for &Pty {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let pty: &Pty = self.get_mut();
        loop {
            let mut guard = ready!(pty.master.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match guard.try_io(|fd| fd.get_ref().read(unfilled)) {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                // Readiness was stale; `try_io` cleared it, so the next poll waits.
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for &Pty {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let pty: &Pty = self.get_mut();
        loop {
            let mut guard = ready!(pty.master.poll_write_ready(cx))?;
            match guard.try_io(|fd| fd.get_ref().write(data)) {
                Ok(result) => return Poll::Ready(result),
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Nothing is buffered here: every write went to the kernel.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
