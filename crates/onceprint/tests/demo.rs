//! `onceprint demo` with the real binary: the newcomer's one command runs the lunch rush
//! through a paper-out and the POS's retries, and reports every ticket printed once.

use std::process::Command;

#[test]
fn the_demo_prints_every_ticket_once_and_names_the_console() {
    let out = Command::new(env!("CARGO_BIN_EXE_onceprint"))
        .args(["demo", "--port", "0", "--tickets", "8", "--exit"])
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run onceprint demo");
    let stdout = String::from_utf8_lossy(&out.stdout).replace('\r', "\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "demo failed: {}\n{stdout}\n{stderr}", out.status);
    assert!(stdout.contains("the bar printer ran out of paper"), "{stdout}");
    assert!(stdout.contains("the bar printer has a new roll"), "{stdout}");
    assert!(stdout.contains("submitted 8  printed 8  failed 0  in doubt 0  charged 8 times"), "{stdout}");
    assert!(stdout.contains("printed more than once: 0"), "{stdout}");
    assert!(stdout.contains("Every ticket printed exactly once"), "{stdout}");
    assert!(stdout.contains("/console/  (tenant demo, operator demo"), "{stdout}");
}
