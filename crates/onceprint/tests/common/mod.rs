//! What the tests of the real binary share: reading a child process's announcement lines,
//! (`broker`) a broker process that is restarted and talked to, and (`world`) a broker,
//! an agent and a printer simulator with a chaos proxy and a POS, for delivery tests.

pub mod broker;
pub mod world;

use std::io::{BufRead, BufReader};
use std::process::Child;

/// Waits for a stdout line starting with `prefix` (a process says where it listens this
/// way); returns the rest of it. The rest of stdout is drained on a thread of its own, so
/// the child never blocks on a full pipe.
pub fn wait_line(child: &mut Child, prefix: &str) -> String {
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    loop {
        match lines.next() {
            Some(Ok(line)) => {
                if let Some(rest) = line.strip_prefix(prefix) {
                    std::thread::spawn(move || for _ in lines {});
                    return rest.trim().to_owned();
                }
            }
            _ => panic!("process exited before printing {prefix:?}"),
        }
    }
}
