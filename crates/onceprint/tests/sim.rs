//! `onceprint sim` through the real binary: a range of seeds reports what it ran and
//! exits 0 when every schedule kept the promise; one seed replays step by step; bad input
//! is refused by the command line.

use std::process::Command;

fn sim(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_onceprint")).arg("sim").args(args).output().expect("run onceprint sim")
}

#[test]
fn a_range_of_seeds_reports_its_schedules_and_a_seed_replays_step_by_step() {
    let out = sim(&["--seeds", "12", "--first-seed", "0", "--threads", "2"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("12 schedules from seed 0"), "{stdout}");
    assert!(stdout.contains("schedules/s"), "{stdout}");
    assert!(stdout.contains("every schedule kept the promise"), "{stdout}");

    let out = sim(&["--seed", "3"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    // Every step is printed with the simulated clock, then the tasks after it, then drain.
    assert!(stdout.lines().any(|l| l.starts_with("   0  ") && l.contains("(clock +")), "{stdout}");
    assert!(stdout.lines().any(|l| l.starts_with("drain")), "{stdout}");
    assert!(stdout.contains("1 schedules from seed 3"), "{stdout}");
}

#[test]
fn bad_input_is_refused() {
    for args in
        [&["--seeds", "0"][..], &["--max-steps", "2"], &["--backend", "redis"], &["--seed", "1", "--seeds", "5"]]
    {
        let out = sim(args);
        assert!(!out.status.success(), "{args:?} must be refused");
        assert_eq!(out.status.code(), Some(2), "{args:?}: a usage error");
    }
}
