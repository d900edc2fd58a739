//! Child processes other than the broker (the store agent and the printer simulator), and
//! what the bench reads about any of its children from `/proc` while they run.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::process::{Child, Command};

use crate::BenchError;

/// How long a graceful stop may take before the bench kills the process.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// One child process started from the `onceprint` executable, logging to a file.
pub struct Proc {
    /// What it is, for messages ("agent", "printer-sim").
    pub name: &'static str,
    child: Child,
    pid: u32,
    log_path: PathBuf,
}

impl Proc {
    /// Starts `<exe> <args…>` with `RUST_LOG=warn` (per-job info lines would measure the
    /// logger; `ONCEPRINT_BENCH_CHILD_LOG` overrides it, to look behind a finding), stdout and stderr appended to `log_path` (a restarted process appends to
    /// its predecessor's log), and kill-on-drop so an erroring bench leaves nothing behind.
    pub fn spawn(name: &'static str, exe: &Path, args: &[String], log_path: &Path) -> Result<Self, BenchError> {
        let open = || {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log_path)
                .map_err(|e| BenchError::io(format!("opening {}", log_path.display()), e))
        };
        let (out, err) = (open()?, open()?);
        let mut command = Command::new(exe);
        command
            .args(args)
            .env("RUST_LOG", std::env::var("ONCEPRINT_BENCH_CHILD_LOG").unwrap_or_else(|_| "warn".into()))
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .kill_on_drop(true);
        die_with_parent(&mut command);
        let child = command.spawn().map_err(|e| BenchError::io(format!("starting {} {name}", exe.display()), e))?;
        let pid = child.id().unwrap_or(0);
        Ok(Self { name, child, pid, log_path: log_path.to_path_buf() })
    }

    /// `Some(status)` once the process has exited (it is then reaped).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Peak RSS and CPU time so far, read while the process still runs.
    pub fn stats(&self) -> ProcStats {
        ProcStats::of(self.pid)
    }

    /// `kill -9` and reap: the crash the bench simulates.
    pub async fn kill9(mut self) -> Result<(), BenchError> {
        self.child.start_kill().map_err(|e| BenchError::io(format!("killing the {}", self.name), e))?;
        self.child.wait().await.map_err(|e| BenchError::io(format!("reaping the {}", self.name), e))?;
        Ok(())
    }

    /// SIGTERM (the contract's graceful shutdown) and wait; SIGKILL after
    /// [`STOP_TIMEOUT`]. `None` when it had to be killed.
    pub async fn stop(mut self) -> Result<Option<ExitStatus>, BenchError> {
        if let Some(status) = self.exited() {
            return Ok(Some(status));
        }
        sigterm(self.pid);
        match tokio::time::timeout(STOP_TIMEOUT, self.child.wait()).await {
            Ok(Ok(status)) => Ok(Some(status)),
            Ok(Err(e)) => Err(BenchError::io(format!("waiting for the {} to exit", self.name), e)),
            Err(_) => {
                let _ = self.child.kill().await;
                Ok(None)
            }
        }
    }

    pub fn log_tail(&self) -> String {
        log_tail(&self.log_path, 40)
    }
}

/// Asks the kernel to SIGKILL the child when the bench dies. `kill_on_drop` covers a
/// bench that returns or unwinds; this covers one that is itself killed (Ctrl-C, kill -9,
/// a CI timeout), which never runs a destructor. Linux sends the signal when the thread
/// that spawned the child exits: children are spawned from async code, i.e. from the
/// runtime's worker threads or the thread blocking on the runtime, which live as long as
/// the bench does.
pub fn die_with_parent(command: &mut Command) {
    #[cfg(target_os = "linux")]
    // SAFETY: the closure runs in the forked child before exec and only calls prctl(2),
    // which is async-signal-safe and touches no memory of the parent.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    #[cfg(not(target_os = "linux"))]
    let _ = command;
}

/// Adds what went wrong when a process was stopped at the end of a run to `problems`:
/// anything but exit 0 after SIGTERM breaks the contract's graceful shutdown.
pub fn note_stop(name: &str, stopped: Result<Option<ExitStatus>, BenchError>, problems: &mut Vec<String>) {
    match stopped {
        Ok(Some(status)) if status.success() => {}
        Ok(Some(status)) => {
            problems.push(format!("the {name} exited with {status} after SIGTERM (the contract asks for exit 0)"))
        }
        Ok(None) => problems.push(format!("the {name} did not exit within 30 s of SIGTERM and was killed")),
        Err(e) => problems.push(format!("stopping the {name}: {e}")),
    }
}

/// The command line of a store agent for `server` with its state in `state_dir`. With
/// `agent_id` the id is given explicitly (it would otherwise be generated once and kept in
/// the state directory); either way a restart with the same directory is the same agent.
pub fn agent_args(server: SocketAddr, token: &str, state_dir: &Path, agent_id: Option<&str>) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "agent".into(),
        "--server".into(),
        format!("http://{server}"),
        "--token".into(),
        token.into(),
        "--state-dir".into(),
        state_dir.display().to_string(),
        "--max-deliveries".into(),
        "256".into(),
    ];
    if let Some(id) = agent_id {
        args.extend(["--agent-id".to_string(), id.to_string()]);
    }
    // Extra agent options for an experiment (`ONCEPRINT_BENCH_AGENT_ARGS="--poll-linger-ms 0"`),
    // like `ONCEPRINT_BENCH_CHILD_LOG`: the benches' own settings stay the default.
    if let Ok(extra) = std::env::var("ONCEPRINT_BENCH_AGENT_ARGS") {
        args.extend(extra.split_whitespace().map(str::to_owned));
    }
    args
}

/// Sends SIGTERM to a child the caller owns and has not reaped (so the pid cannot have
/// been reused by another process).
/// Elsewhere there is no SIGTERM: the caller's later kill ends the child.
pub fn sigterm(pid: u32) {
    #[cfg(unix)]
    if pid != 0 {
        // SAFETY: kill(2) takes plain integers; the pid is our own unreaped child.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGTERM);
        }
    }
    #[cfg(not(unix))]
    let _ = pid;
}

/// Clock ticks per second of `/proc`'s CPU times; 0 where there is no such thing (the
/// figures are then left out).
fn clock_ticks() -> f64 {
    #[cfg(unix)]
    {
        // SAFETY: sysconf only reads a configuration value.
        unsafe { libc::sysconf(libc::_SC_CLK_TCK) as f64 }
    }
    #[cfg(not(unix))]
    {
        0.0
    }
}

/// What `/proc` tells about one process.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProcStats {
    /// `VmHWM` in KiB.
    pub peak_rss_kib: Option<u64>,
    /// User + system CPU time of all its threads, in seconds.
    pub cpu_seconds: Option<f64>,
}

impl ProcStats {
    pub fn of(pid: u32) -> Self {
        Self::at(&format!("/proc/{pid}"))
    }

    /// This process (the bench itself).
    pub fn own() -> Self {
        Self::at("/proc/self")
    }

    fn at(dir: &str) -> Self {
        let peak_rss_kib = std::fs::read_to_string(format!("{dir}/status")).ok().and_then(|s| parse_vm_hwm(&s));
        let cpu_seconds = std::fs::read_to_string(format!("{dir}/stat")).ok().and_then(|s| {
            let ticks = clock_ticks();
            parse_cpu_ticks(&s).filter(|_| ticks > 0.0).map(|t| t as f64 / ticks)
        });
        Self { peak_rss_kib, cpu_seconds }
    }

    /// Two lives of one role (an agent before and after its restart): the higher peak and
    /// the summed CPU time.
    pub fn merge(self, other: ProcStats) -> ProcStats {
        let max = match (self.peak_rss_kib, other.peak_rss_kib) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        let cpu = match (self.cpu_seconds, other.cpu_seconds) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        ProcStats { peak_rss_kib: max, cpu_seconds: cpu }
    }
}

/// Whole-machine CPU time so far, from the first line of `/proc/stat`, in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MachineTimes {
    /// user + nice + system + irq + softirq + steal.
    pub busy: f64,
    /// idle + iowait.
    pub idle: f64,
}

impl MachineTimes {
    pub fn now() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let ticks = clock_ticks();
        let (busy, idle) = parse_machine_ticks(&stat)?;
        (ticks > 0.0).then(|| Self { busy: busy as f64 / ticks, idle: idle as f64 / ticks })
    }
}

/// (busy, idle) ticks of the aggregate `cpu` line of `/proc/stat`.
fn parse_machine_ticks(stat: &str) -> Option<(u64, u64)> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line.split_whitespace().skip(1).map(|f| f.parse().unwrap_or(0)).collect();
    let at = |i: usize| v.get(i).copied().unwrap_or(0);
    // user nice system idle iowait irq softirq steal (guest time is already in user).
    (v.len() >= 4).then(|| (at(0) + at(1) + at(2) + at(5) + at(6) + at(7), at(3) + at(4)))
}

/// A running process's resident set now (`VmRSS`), in KiB.
pub fn vm_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// `VmHWM` of a `/proc/PID/status` text, in KiB.
pub fn parse_vm_hwm(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// `utime + stime` (clock ticks) of a `/proc/PID/stat` line. The command name in
/// parentheses may hold spaces, so fields are counted from the last `)`.
fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: field 3 (state) is index 0, so utime (14) and stime (15) are 11, 12.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Where one process's threads spent their time, by thread, from
/// `/proc/PID/task/*/schedstat` (nanoseconds on a CPU, then nanoseconds runnable but
/// waiting for one). The run's CPU time alone cannot tell a thread that is busy from one
/// that holds the chain up: the SQLite writer of the broker both works and waits for a
/// core on a machine whose other processes wake in bursts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ThreadTimes {
    /// Thread id → (name, on-CPU ns, waiting ns).
    by_tid: std::collections::BTreeMap<u32, (String, u64, u64)>,
}

/// One name's threads over a window of a run.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct ThreadGroup {
    /// The threads' name (`sqlite-writer`, `tokio-rt-worker`, …).
    pub name: String,
    pub threads: usize,
    pub on_cpu_seconds: f64,
    /// Runnable but waiting for a CPU (the kernel's run-queue delay).
    pub waiting_seconds: f64,
}

impl ThreadTimes {
    /// The threads of `pid` now; `None` where `/proc` has no such figures (no process, a
    /// kernel without schedstats).
    pub fn of(pid: u32) -> Option<Self> {
        let mut by_tid = std::collections::BTreeMap::new();
        for entry in std::fs::read_dir(format!("/proc/{pid}/task")).ok()?.flatten() {
            let Some(tid) = entry.file_name().to_str().and_then(|t| t.parse::<u32>().ok()) else { continue };
            // A thread that ended between the listing and the reads is simply left out.
            let (Ok(name), Ok(sched)) = (
                std::fs::read_to_string(entry.path().join("comm")),
                std::fs::read_to_string(entry.path().join("schedstat")),
            ) else {
                continue;
            };
            if let Some((run, wait)) = parse_schedstat(&sched) {
                by_tid.insert(tid, (name.trim().to_owned(), run, wait));
            }
        }
        (!by_tid.is_empty()).then_some(Self { by_tid })
    }

    /// The time of the threads alive now since `earlier`, summed by name, busiest first.
    /// A thread born since counts from its start; one that ended since is not counted
    /// (short-lived blocking threads), so the groups are a lower bound of the process's.
    pub fn since(&self, earlier: &ThreadTimes) -> Vec<ThreadGroup> {
        let mut groups: Vec<ThreadGroup> = Vec::new();
        for (tid, (name, run, wait)) in &self.by_tid {
            let (run0, wait0) = earlier.by_tid.get(tid).map_or((0, 0), |(_, r, w)| (*r, *w));
            let at = match groups.iter().position(|g| &g.name == name) {
                Some(at) => at,
                None => {
                    groups.push(ThreadGroup { name: name.clone(), ..ThreadGroup::default() });
                    groups.len() - 1
                }
            };
            let g = &mut groups[at];
            g.threads += 1;
            g.on_cpu_seconds += run.saturating_sub(run0) as f64 / 1e9;
            g.waiting_seconds += wait.saturating_sub(wait0) as f64 / 1e9;
        }
        groups.sort_by(|a, b| b.on_cpu_seconds.total_cmp(&a.on_cpu_seconds).then_with(|| a.name.cmp(&b.name)));
        groups
    }
}

/// (on-CPU ns, waiting ns) of a `/proc/PID/task/TID/schedstat` line.
fn parse_schedstat(text: &str) -> Option<(u64, u64)> {
    let mut fields = text.split_whitespace();
    let run = fields.next()?.parse().ok()?;
    let wait = fields.next()?.parse().ok()?;
    Some((run, wait))
}

/// The last `n` lines of a log file, for error messages.
pub fn log_tail(path: &Path, n: usize) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            if lines.is_empty() {
                "(empty)".to_string()
            } else {
                lines[lines.len().saturating_sub(n)..].join("\n")
            }
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_times_are_summed_by_name_from_the_window_start() {
        assert_eq!(parse_schedstat("2000000000 500000000 17\n"), Some((2_000_000_000, 500_000_000)));
        assert_eq!(parse_schedstat("garbage"), None);
        let times = |rows: &[(u32, &str, u64, u64)]| ThreadTimes {
            by_tid: rows.iter().map(|(t, n, r, w)| (*t, ((*n).to_owned(), *r, *w))).collect(),
        };
        let start = times(&[(1, "main", 5_000_000_000, 0), (2, "sqlite-writer", 1_000_000_000, 1_000_000_000)]);
        let end = times(&[
            (1, "main", 5_100_000_000, 0),
            (2, "sqlite-writer", 4_000_000_000, 1_500_000_000),
            // Born inside the window: counted from its start.
            (3, "tokio-rt-worker", 300_000_000, 100_000_000),
            (4, "tokio-rt-worker", 200_000_000, 0),
        ]);
        let groups = end.since(&start);
        let names: Vec<&str> = groups.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(names, ["sqlite-writer", "tokio-rt-worker", "main"]);
        assert_eq!(groups[0].threads, 1);
        assert!((groups[0].on_cpu_seconds - 3.0).abs() < 1e-9 && (groups[0].waiting_seconds - 0.5).abs() < 1e-9);
        assert_eq!(groups[1].threads, 2);
        assert!((groups[1].on_cpu_seconds - 0.5).abs() < 1e-9 && (groups[1].waiting_seconds - 0.1).abs() < 1e-9);
        assert!((groups[2].on_cpu_seconds - 0.1).abs() < 1e-9);
    }

    #[test]
    fn own_threads_are_readable() {
        // Every Linux kernel the bench runs on has schedstats; elsewhere the figure is left out.
        if let Some(t) = ThreadTimes::of(std::process::id()) {
            let groups = t.since(&ThreadTimes::default());
            assert!(groups.iter().map(|g| g.threads).sum::<usize>() >= 1, "{groups:?}");
            assert!(groups.iter().any(|g| g.on_cpu_seconds > 0.0), "{groups:?}");
        }
    }

    #[test]
    fn vm_hwm_is_parsed_in_kib() {
        let status = "Name:\tonceprint\nVmPeak:\t  100 kB\nVmHWM:\t   45678 kB\nVmRSS:\t 40000 kB\n";
        assert_eq!(parse_vm_hwm(status), Some(45678));
        assert_eq!(parse_vm_hwm("Name: x\n"), None);
    }

    #[test]
    fn cpu_ticks_are_counted_after_the_command_name() {
        let stat = "1234 (tokio (rt) x) S 1 1234 1234 0 -1 4194304 500 0 0 0 250 75 0 0 20 0 9 0 100 0 0";
        assert_eq!(parse_cpu_ticks(stat), Some(325));
        assert_eq!(parse_cpu_ticks("garbage"), None);
        assert_eq!(parse_cpu_ticks("1 (x) S 1 2"), None);
    }

    #[test]
    fn machine_ticks_split_busy_from_idle() {
        let stat = "cpu  100 5 50 1000 20 3 7 2 0 0\ncpu0 50 2 25 500 10 1 3 1 0 0\nintr 1\n";
        assert_eq!(parse_machine_ticks(stat), Some((167, 1020)));
        assert_eq!(parse_machine_ticks("intr 1\n"), None);
        assert!(MachineTimes::now().is_some_and(|t| t.busy > 0.0 && t.idle >= 0.0));
    }

    #[test]
    fn own_stats_are_readable() {
        let s = ProcStats::own();
        assert!(s.peak_rss_kib.is_some_and(|k| k > 0));
        assert!(s.cpu_seconds.is_some());
    }

    #[test]
    fn merged_lives_take_the_higher_peak_and_the_summed_cpu() {
        let a = ProcStats { peak_rss_kib: Some(100), cpu_seconds: Some(1.5) };
        let b = ProcStats { peak_rss_kib: Some(80), cpu_seconds: Some(2.0) };
        assert_eq!(a.merge(b), ProcStats { peak_rss_kib: Some(100), cpu_seconds: Some(3.5) });
        assert_eq!(ProcStats::default().merge(b), b);
    }
}
