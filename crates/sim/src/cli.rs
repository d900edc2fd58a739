//! `onceprint sim`: runs seeds on a few threads and reports schedules per second, or
//! replays one seed step by step.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use crate::world::Tally;
use crate::{run_seed, Backend, Failure, Options, SimError};

/// Simulation testing: fault schedules drawn from seeds, played against the real broker
/// code under a simulated clock and network, checked against the promise after each step.
#[derive(Debug, Clone, clap::Args)]
pub struct SimArgs {
    /// How many seeds to run, from --first-seed on.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub seeds: u64,
    /// The first seed of the range (default: one drawn from the clock, printed so that a
    /// range can be run again).
    #[arg(long, value_name = "SEED")]
    pub first_seed: Option<u64>,
    /// Replay this one seed, printing each step and the tasks after it (what a failure
    /// report names).
    #[arg(long, value_name = "SEED", conflicts_with_all = ["seeds", "first_seed"])]
    pub seed: Option<u64>,
    /// Most steps of a schedule (each has between a quarter of this and this many).
    #[arg(long, default_value_t = 80, value_parser = clap::value_parser!(u64).range(4..=10_000))]
    pub max_steps: u64,
    /// Where each run's store lives.
    #[arg(long, value_enum, default_value_t = Backend::Sqlite)]
    pub backend: Backend,
    /// Runs at the same time (default: the machine's cores).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=256))]
    pub threads: Option<u16>,
    /// Report a failing schedule as it was drawn, without shrinking it.
    #[arg(long)]
    pub no_shrink: bool,
}

/// What a range of seeds did.
#[derive(Debug, Default)]
pub struct Report {
    pub first_seed: u64,
    pub schedules: u64,
    pub seconds: f64,
    pub tally: Tally,
    pub failure: Option<Box<Failure>>,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = &self.tally;
        writeln!(
            f,
            "{} schedules from seed {} in {:.1} s: {:.0} schedules/s, {:.0} steps/s",
            self.schedules,
            self.first_seed,
            self.seconds,
            self.schedules as f64 / self.seconds.max(1e-9),
            t.steps as f64 / self.seconds.max(1e-9)
        )?;
        writeln!(
            f,
            "{} steps ({} faults), {} tasks: {} printed, {} in doubt, {} failed; {} copies on paper; {} pruned",
            t.steps, t.faults, t.tasks, t.printed, t.in_doubt, t.failed, t.copies, t.pruned
        )?;
        match &self.failure {
            Some(fail) => write!(f, "FAILED\n{fail}"),
            None => write!(f, "every schedule kept the promise"),
        }
    }
}

/// Runs `args`; the report says whether a seed failed.
pub fn run(args: &SimArgs) -> Result<Report, SimError> {
    let options = Options {
        backend: args.backend,
        max_steps: args.max_steps as usize,
        shrink: !args.no_shrink,
        trace: args.seed.is_some(),
    };
    if let Some(seed) = args.seed {
        return run_range(seed, 1, 1, &options);
    }
    let first = args.first_seed.unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0) << 20
    });
    let threads = args
        .threads
        .map(usize::from)
        .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
    run_range(first, args.seeds, threads, &options)
}

/// Runs seeds `first .. first + count` on `threads` threads; stops at the first failure.
pub fn run_range(first: u64, count: u64, threads: usize, options: &Options) -> Result<Report, SimError> {
    let started = Instant::now();
    let next = AtomicU64::new(0);
    let done = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let tally = Mutex::new(Tally::default());
    let failure: Mutex<Option<Box<Failure>>> = Mutex::new(None);
    let error: Mutex<Option<SimError>> = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= count {
                        break;
                    }
                    match run_seed(first.wrapping_add(i), options) {
                        Ok(Ok(t)) => {
                            *tally.lock().unwrap_or_else(std::sync::PoisonError::into_inner) += t;
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(Err(f)) => {
                            stop.store(true, Ordering::Relaxed);
                            done.fetch_add(1, Ordering::Relaxed);
                            let mut slot = failure.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                            // The lowest failing seed is the one reported, whatever the
                            // threads' order.
                            if slot.as_ref().is_none_or(|g| f.seed < g.seed) {
                                *slot = Some(f);
                            }
                        }
                        Err(e) => {
                            stop.store(true, Ordering::Relaxed);
                            *error.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(e);
                        }
                    }
                }
            });
        }
    });
    if let Some(e) = error.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner) {
        return Err(e);
    }
    Ok(Report {
        first_seed: first,
        schedules: done.load(Ordering::Relaxed),
        seconds: started.elapsed().as_secs_f64(),
        tally: tally.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner),
        failure: failure.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner),
    })
}
