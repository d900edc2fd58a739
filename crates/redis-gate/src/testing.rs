//! A `redis-server` of a test's own, on a free port, that the test may kill with SIGKILL
//! and start again on the same port.
//!
//! When `redis-server` is not installed, [`RedisServer::start`] says so on stderr and
//! returns `None`, and the test skips; with `ONCEPRINT_REDIS_TESTS=required` (as CI sets
//! it, after installing Redis) it fails instead. The module is always compiled (it
//! needs nothing but the standard library), so that the tests of the binary can use it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running (or killed) `redis-server` without persistence.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl RedisServer {
    /// Starts a server on a free port; `None` (with a line on stderr) when `redis-server`
    /// is not installed. Panics when it is installed but does not come up.
    pub fn start() -> Option<RedisServer> {
        if Command::new("redis-server").arg("--version").stdout(Stdio::null()).status().is_err() {
            assert!(
                std::env::var("ONCEPRINT_REDIS_TESTS").as_deref() != Ok("required"),
                "redis-server is not installed, and ONCEPRINT_REDIS_TESTS=required"
            );
            eprintln!("SKIPPED: redis-server is not installed (apt-get install redis-server)");
            return None;
        }
        let port = free_port().expect("a free port");
        let mut server = RedisServer { child: None, port };
        server.restart();
        Some(server)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `kill -9` of the server, as a crash would end it; waits until it is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server (again) on its port and waits until it answers `PING`.
    pub fn restart(&mut self) {
        self.kill();
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
        let start = Instant::now();
        while !self.answers_ping() {
            assert!(start.elapsed() < Duration::from_secs(10), "redis-server on port {} did not come up", self.port);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn answers_ping(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else { return false };
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        if s.write_all(b"PING\r\n").is_err() {
            return false;
        }
        let mut buf = [0u8; 7];
        s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
