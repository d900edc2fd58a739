//! What a fault run will do, decided from its seed before anything starts: every
//! submission with its moment and its repeats, every printer fault, every kill.
//!
//! Submissions and chaos draw from separate random streams, so that changing a fault rate
//! or the number of kills does not change which tasks are submitted, and a run can be
//! replayed exactly (as far as the processes' own timing allows) from its seed. Within the
//! chaos one stream serves the printer faults, then the agent kills, then the broker
//! kills, in that order: changing one of them moves the draws of those after it.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::e2e::task_body_for;
use crate::plan::{Plan, PlannedRequest, SplitMix64};

/// The print types of a fault run: name, priority (lower goes first) and how often a task
/// gets it (weights out of 100). Four priorities, so that higher-priority work keeps
/// arriving on lanes that have lower-priority work in flight.
pub const PRINT_TYPES: [(&str, i32, u32); 4] =
    [("refund", 0, 10), ("receipt", 10, 45), ("kitchen", 20, 35), ("prebill", 40, 10)];

/// Share of repeats sent at the same moment as their original, racing it on another
/// connection; the others follow it by up to [`LATE_REPEAT_MAX_MS`].
const RACING_SHARE: f64 = 0.4;
const LATE_REPEAT_MAX_MS: u64 = 5_000;
/// A repeated submission is sent this many more times (1 to 4).
const MAX_REPEATS: usize = 4;

/// The priority of a print type of [`PRINT_TYPES`] (unknown names sort last).
pub fn priority_of(print_type: &str) -> i32 {
    PRINT_TYPES.iter().find(|(name, _, _)| *name == print_type).map_or(i32::MAX, |(_, p, _)| *p)
}

/// The submissions of a run. `plan.requests` are in sending order; the key of a request is
/// its task number `n` (`biz_no` `E<n>`, marker `E2E <n>`).
#[derive(Debug, Clone)]
pub struct Submissions {
    pub plan: Plan,
    /// When each request goes out, in ms after the fault phase began.
    pub send_at_ms: Vec<u64>,
    /// Whether each request is a repeat sent together with its original.
    pub racing: Vec<bool>,
    /// Per task: its printer index and print type.
    pub printer_of: Vec<usize>,
    pub print_type_of: Vec<&'static str>,
}

impl Submissions {
    pub fn repeats(&self) -> usize {
        self.plan.repeats()
    }

    pub fn racing_repeats(&self) -> usize {
        self.racing.iter().filter(|&&r| r).count()
    }
}

fn weighted_print_type(rng: &mut SplitMix64) -> &'static str {
    let total: u32 = PRINT_TYPES.iter().map(|(_, _, w)| w).sum();
    let mut pick = rng.below(total as usize) as u32;
    for (name, _, weight) in PRINT_TYPES {
        if pick < weight {
            return name;
        }
        pick -= weight;
    }
    "receipt"
}

/// The station of a fault run with calling-in printers: its primary is the first
/// CloudPRNT printer, its backup the agent's `p0`, so that its tickets cross transports
/// when the primary falls silent.
pub const STATION_ID: &str = "bench-hot";
/// The station's own failover threshold.
pub const STATION_FAILOVER_AFTER_MS: i64 = 2_000;
/// Share of tasks submitted to the station rather than to a printer.
const STATION_SHARE: f64 = 0.08;

/// `tasks` tasks over `printers` printers, originals spread evenly over `window_ms`; a
/// share `repeat_share` of them sent 1–4 more times. With `station` (the index of its
/// primary printer), a share of the tasks goes to [`STATION_ID`] instead (their printer is
/// the primary's).
pub fn submissions(
    tasks: usize,
    printers: usize,
    repeat_share: f64,
    window_ms: u64,
    seed: u64,
    station: Option<usize>,
) -> Submissions {
    submissions_spread(tasks, printers, repeat_share, window_ms, seed, station, Spread::Random)
}

/// How a plan's tasks are spread over the printers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spread {
    /// Each task to a printer drawn at random (seeded): printers get bursts and lulls.
    Random,
    /// Task `n` to printer `n mod printers`: each printer gets one task every
    /// `printers` tasks, at an even pace.
    RoundRobin,
}

/// [`submissions`] with the tasks spread over the printers as `spread` says; every
/// other draw of the plan is the same either way.
pub fn submissions_spread(
    tasks: usize,
    printers: usize,
    repeat_share: f64,
    window_ms: u64,
    seed: u64,
    station: Option<usize>,
    spread: Spread,
) -> Submissions {
    let mut rng = SplitMix64::new(seed ^ 0x5355_424D_4954);
    // (send time, order of drawing, request): the drawing order breaks ties, so a racing
    // repeat is queued right after its original and taken by the next free connection.
    let mut timed: Vec<(u64, usize, PlannedRequest, bool)> = Vec::with_capacity(tasks * 2);
    let mut printer_of = Vec::with_capacity(tasks);
    let mut print_type_of = Vec::with_capacity(tasks);
    for n in 0..tasks {
        let at = (n as u64 * window_ms) / tasks.max(1) as u64;
        let drawn = rng.below(printers);
        let printer = match spread {
            Spread::Random => drawn,
            Spread::RoundRobin => n % printers.max(1),
        };
        let print_type = weighted_print_type(&mut rng);
        // Drawn for every task, so that adding a station changes nothing else of the plan.
        let to_station = rng.next_f64() < STATION_SHARE;
        let (printer, body) = match station {
            Some(primary) if to_station => (primary, station_body_for(n as u32, print_type)),
            _ => (printer, task_body_for(n as u32, printer, print_type)),
        };
        printer_of.push(printer);
        print_type_of.push(print_type);
        let key = n as u32;
        timed.push((at, timed.len(), PlannedRequest { key, repeat: false, body: body.clone() }, false));
        if rng.next_f64() < repeat_share {
            for _ in 0..1 + rng.below(MAX_REPEATS) {
                let racing = rng.next_f64() < RACING_SHARE;
                let when = if racing { at } else { at + 1 + rng.below(LATE_REPEAT_MAX_MS as usize) as u64 };
                timed.push((when, timed.len(), PlannedRequest { key, repeat: true, body: body.clone() }, racing));
            }
        }
    }
    timed.sort_by_key(|(at, order, _, _)| (*at, *order));
    let mut send_at_ms = Vec::with_capacity(timed.len());
    let mut racing = Vec::with_capacity(timed.len());
    let mut requests = Vec::with_capacity(timed.len());
    for (at, _, req, race) in timed {
        send_at_ms.push(at);
        racing.push(race);
        requests.push(req);
    }
    Submissions {
        plan: Plan { prefix: "E", requests, distinct_keys: tasks },
        send_at_ms,
        racing,
        printer_of,
        print_type_of,
    }
}

/// The body of task `n` submitted to [`STATION_ID`], marked like every task of the run.
fn station_body_for(n: u32, print_type: &str) -> hyper::body::Bytes {
    hyper::body::Bytes::from(format!(
        r#"{{"biz_no":"E{n}","station_id":"{STATION_ID}","print_type":"{print_type}","content":{{"type":"text","text":"E2E {n}\n1 x Noodles  12.00\n"}}}}"#
    ))
}

/// A printer fault the run injects through the simulator's control API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    PaperOut,
    CoverOpen,
    Offline,
    /// The next job prints, then the printer drops the connection before confirming it
    /// (a Star MQTT printer: a power cut after it acknowledged the job).
    CrashMidJob,
    /// Every job waits this many ms before it prints.
    Slow(u64),
    /// The next job prints, then ends with an error that can follow printing (calling-in
    /// printers: Epson `EPTR_CUTTER`, a Star code Star does not list, a device `error`).
    ErrorAfterPrint,
}

impl FaultKind {
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::PaperOut => "paper_out",
            FaultKind::CoverOpen => "cover_open",
            FaultKind::Offline => "offline",
            FaultKind::CrashMidJob => "crash_mid_job",
            FaultKind::Slow(_) => "slow_ms",
            FaultKind::ErrorAfterPrint => "error_after_print",
        }
    }

    /// The `PUT /faults` fields that switch it on or off (a crash or an error after
    /// printing has no off: the simulator counts it down itself).
    pub fn fields(self, on: bool) -> Value {
        match self {
            FaultKind::CrashMidJob => json!({"crash_mid_job": u32::from(on)}),
            FaultKind::ErrorAfterPrint => json!({"error_after_print": u32::from(on)}),
            FaultKind::Slow(ms) => json!({"slow_ms": if on { ms } else { 0 }}),
            other => json!({ other.name(): on }),
        }
    }
}

/// The body of `PUT /faults` (without `printer`) that clears every fault.
pub fn clear_all_fields() -> Value {
    json!({"paper_out": false, "cover_open": false, "offline": false, "crash_mid_job": 0, "slow_ms": 0,
           "error_after_print": 0})
}

/// One change of one printer's faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultEvent {
    pub at_ms: u64,
    pub printer: usize,
    pub kind: FaultKind,
    pub on: bool,
}

/// A `kill -9` of the agent or the broker, and how long the process stays down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kill {
    pub at_ms: u64,
    pub down_ms: u64,
}

/// Everything the run does to the processes while tasks flow.
#[derive(Debug, Clone, Default)]
pub struct Chaos {
    /// In time order.
    pub printer_events: Vec<FaultEvent>,
    pub agent_kills: Vec<Kill>,
    pub broker_kills: Vec<Kill>,
}

impl Chaos {
    /// Faults switched on, per kind.
    pub fn injected(&self) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for e in self.printer_events.iter().filter(|e| e.on) {
            *out.entry(e.kind.name().to_string()).or_default() += 1;
        }
        out
    }
}

/// How long a toggled fault (paper out, cover open, offline) lasts: 0.3–3 s, short
/// enough for the retry policy (10 attempts over ~7.5 s) to outlast it.
const TOGGLE_MS: (u64, u64) = (300, 3_000);
/// How long a printer stays slow, and how slow.
const SLOW_FOR_MS: (u64, u64) = (1_000, 5_000);
const SLOW_MS: (u64, u64) = (20, 200);
/// How long a killed agent / broker stays down before the bench starts it again.
const AGENT_DOWN_MS: (u64, u64) = (0, 500);
const BROKER_DOWN_MS: (u64, u64) = (200, 1_500);
/// A restarted process runs at least this long before it is killed again, so that each
/// kill hits a process that has resumed work rather than one still starting.
const MIN_UPTIME_MS: u64 = 1_500;

fn between(rng: &mut SplitMix64, (low, high): (u64, u64)) -> u64 {
    low + rng.below((high - low + 1) as usize) as u64
}

/// What [`chaos`] draws for.
#[derive(Debug, Clone, Copy)]
pub struct ChaosPlan {
    pub printers: usize,
    /// Printers from this index on call the broker (CloudPRNT, Epson, MQTT): they also get
    /// errors after printing.
    pub callers_from: usize,
    /// The station's primary (a printer that polls): it gets no other fault, and falls
    /// silent once for [`SILENCE_MS`] from a quarter of the window on, longer than its
    /// offline threshold plus the station's failover threshold.
    pub silent: Option<usize>,
    pub window_ms: u64,
    pub fault_every_ms: u64,
    pub agent_kills: usize,
    pub broker_kills: usize,
    pub seed: u64,
}

/// How long the station's primary falls silent (its offline threshold is 2 × its 1 s poll
/// interval + 5 s; the station's failover threshold 2 s after that).
pub const SILENCE_MS: u64 = 15_000;

/// Draws the chaos of a run: per printer, faults one after the other with exponentially
/// distributed quiet gaps of mean `fault_every_ms` (so a printer has at most one fault at
/// a time), within `window_ms`; the station primary's one silence; and `agent_kills` /
/// `broker_kills` kills at random moments between 5 % and 90 % of the window.
pub fn chaos(plan: ChaosPlan) -> Chaos {
    let ChaosPlan { printers, callers_from, silent, window_ms, fault_every_ms, agent_kills, broker_kills, seed } = plan;
    let mut rng = SplitMix64::new(seed ^ 0x0043_4841_4F53);
    let mut events = Vec::new();
    let gap = |rng: &mut SplitMix64| (-(fault_every_ms as f64) * (1.0 - rng.next_f64()).ln()) as u64;
    for printer in 0..printers {
        let mut t = gap(&mut rng);
        while t < window_ms {
            let pick = rng.below(100);
            let kind = match pick {
                0..=29 => FaultKind::PaperOut,
                30..=49 => FaultKind::CoverOpen,
                50..=74 => FaultKind::Offline,
                75..=84 => FaultKind::CrashMidJob,
                85..=92 if printer >= callers_from => FaultKind::ErrorAfterPrint,
                _ => FaultKind::Slow(between(&mut rng, SLOW_MS)),
            };
            let lasts = match kind {
                FaultKind::CrashMidJob | FaultKind::ErrorAfterPrint => 0,
                FaultKind::Slow(_) => between(&mut rng, SLOW_FOR_MS),
                _ => between(&mut rng, TOGGLE_MS),
            };
            if silent != Some(printer) {
                events.push(FaultEvent { at_ms: t, printer, kind, on: true });
                if lasts > 0 {
                    events.push(FaultEvent { at_ms: (t + lasts).min(window_ms), printer, kind, on: false });
                }
            }
            t += lasts + gap(&mut rng);
        }
    }
    if let Some(printer) = silent {
        let from = window_ms / 4;
        events.push(FaultEvent { at_ms: from, printer, kind: FaultKind::Offline, on: true });
        events.push(FaultEvent { at_ms: from + SILENCE_MS, printer, kind: FaultKind::Offline, on: false });
    }
    events.sort_by_key(|e| (e.at_ms, e.printer, e.on));
    let mut kills = |count: usize, down: (u64, u64)| {
        let low = window_ms / 20;
        let span = (window_ms * 9 / 10).saturating_sub(low).max(1);
        let mut at: Vec<u64> = (0..count).map(|_| low + rng.below(span as usize) as u64).collect();
        at.sort_unstable();
        let mut out: Vec<Kill> = Vec::with_capacity(count);
        for a in at {
            let earliest = out.last().map_or(0, |k| k.at_ms + k.down_ms + MIN_UPTIME_MS);
            out.push(Kill { at_ms: a.max(earliest), down_ms: between(&mut rng, down) });
        }
        out
    };
    let agent = kills(agent_kills, AGENT_DOWN_MS);
    let broker = kills(broker_kills, BROKER_DOWN_MS);
    Chaos { printer_events: events, agent_kills: agent, broker_kills: broker }
}

/// The broker's configuration for a fault run: short timings, so that what the faults
/// leave behind resolves in seconds, and the print types of [`PRINT_TYPES`] with a fast
/// backoff and enough attempts that transient faults rarely exhaust them. No print type
/// reprints on doubt: a doubt must end `in_doubt`, never as a second sheet. A lane counts
/// as stalled after 30 s without progress: longer than any delivery can legitimately take
/// here (the agent gives a printer 15 s to confirm a job), far shorter than the run.
pub fn broker_config() -> String {
    broker_config_with(PRINT_TYPES.iter().map(|(name, priority, _)| (*name, *priority)))
}

/// [`broker_config`]'s timings and policies with other print types (`(name, priority)`;
/// `bench offline` uses the receipt, kitchen and label of a shop).
pub fn broker_config_with<'a>(print_types: impl IntoIterator<Item = (&'a str, i32)>) -> String {
    let mut toml = String::from(
        "redeliver_after_ms = 2000\nagent_gone_after_ms = 3000\nsweep_interval_ms = 200\nstall_after_ms = 30000\n",
    );
    for (name, priority) in print_types {
        toml.push_str(&format!(
            "\n[print_types.{name}]\npriority = {priority}\nmax_attempts = 10\nreprint_on_doubt = false\n\
             backoff = {{ initial_ms = 100, factor = 2.0, cap_ms = 1000, jitter = 0.2 }}\n"
        ));
    }
    toml
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn round_robin_gives_each_printer_its_turn_and_changes_nothing_else() {
        let random = submissions(1_000, 7, 0.3, 10_000, 7, None);
        let even = submissions_spread(1_000, 7, 0.3, 10_000, 7, None, Spread::RoundRobin);
        assert!((0..1_000).all(|n| even.printer_of[n] == n % 7));
        assert_ne!(random.printer_of, even.printer_of);
        let plan = |s: &Submissions| s.plan.requests.iter().map(|r| (r.key, r.repeat)).collect::<Vec<_>>();
        assert_eq!(plan(&random), plan(&even));
        assert_eq!(random.send_at_ms, even.send_at_ms);
    }

    #[test]
    fn submissions_are_seeded_spread_and_repeat_identical_bodies() {
        let a = submissions(2_000, 8, 0.3, 10_000, 7, None);
        let b = submissions(2_000, 8, 0.3, 10_000, 7, None);
        let c = submissions(2_000, 8, 0.3, 10_000, 8, None);
        let keys = |s: &Submissions| s.plan.requests.iter().map(|r| r.key).collect::<Vec<_>>();
        assert_eq!(keys(&a), keys(&b));
        assert_ne!(keys(&a), keys(&c));
        assert_eq!(a.plan.distinct_keys, 2_000);
        assert!(a.send_at_ms.windows(2).all(|w| w[0] <= w[1]), "sending order is time order");
        let originals = a.plan.requests.iter().filter(|r| !r.repeat).count();
        assert_eq!(originals, 2_000);
        // About 30 % of tasks are repeated, 1–4 times (2.5 on average).
        let repeated: std::collections::HashSet<u32> =
            a.plan.requests.iter().filter(|r| r.repeat).map(|r| r.key).collect();
        assert!((500..700).contains(&repeated.len()), "{}", repeated.len());
        assert!(a.racing_repeats() > 0 && a.racing_repeats() < a.repeats());
        let mut first: HashMap<u32, (&hyper::body::Bytes, u64)> = HashMap::new();
        for (i, r) in a.plan.requests.iter().enumerate() {
            if r.repeat {
                let (body, at) = first[&r.key];
                assert_eq!(body, &r.body, "a repeat is byte-identical");
                assert!(a.send_at_ms[i] >= at);
                if a.racing[i] {
                    assert_eq!(a.send_at_ms[i], at);
                }
            } else {
                first.insert(r.key, (&r.body, a.send_at_ms[i]));
            }
        }
        assert!(a.plan.requests.iter().all(|r| !String::from_utf8_lossy(&r.body).contains(STATION_ID)));
        let types: std::collections::HashSet<&str> = a.print_type_of.iter().copied().collect();
        assert_eq!(types.len(), 4, "every print type is used");
        assert!(a.printer_of.iter().all(|&p| p < 8));
    }

    #[test]
    fn chaos_keeps_one_fault_per_printer_at_a_time_and_spaces_the_kills() {
        let plan = |seed| ChaosPlan {
            printers: 8,
            callers_from: 6,
            silent: Some(7),
            window_ms: 30_000,
            fault_every_ms: 4_000,
            agent_kills: 5,
            broker_kills: 3,
            seed,
        };
        let c = chaos(plan(1));
        assert!(c.printer_events.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
        assert!(c.printer_events.iter().all(|e| e.at_ms <= 30_000 && e.printer < 8));
        for p in 0..8 {
            let mut on: Option<FaultKind> = None;
            for e in c.printer_events.iter().filter(|e| e.printer == p) {
                match (e.on, e.kind) {
                    (true, FaultKind::CrashMidJob | FaultKind::ErrorAfterPrint) => assert!(on.is_none()),
                    (true, k) => {
                        assert!(on.is_none(), "printer {p}: {k:?} while {on:?}");
                        on = Some(k);
                    }
                    (false, k) => {
                        assert_eq!(on, Some(k));
                        on = None;
                    }
                }
            }
            assert!(on.is_none(), "every toggled fault is switched off again");
        }
        let injected = c.injected();
        assert!(injected.values().sum::<usize>() > 20, "{injected:?}");
        for kills in [&c.agent_kills, &c.broker_kills] {
            for w in kills.windows(2) {
                assert!(w[1].at_ms >= w[0].at_ms + w[0].down_ms + MIN_UPTIME_MS);
            }
            assert!(kills.first().is_some_and(|k| k.at_ms >= 1_500));
        }
        assert_eq!((c.agent_kills.len(), c.broker_kills.len()), (5, 3));
        assert_eq!(chaos(plan(1)).printer_events, c.printer_events, "seeded");
        // Errors after printing only on printers that call in; the station primary only
        // falls silent, once, for longer than its offline and failover thresholds.
        assert!(c.printer_events.iter().all(|e| e.kind != FaultKind::ErrorAfterPrint || e.printer >= 6));
        let silent: Vec<&FaultEvent> = c.printer_events.iter().filter(|e| e.printer == 7).collect();
        assert_eq!(silent.len(), 2, "{silent:?}");
        assert!(silent.iter().all(|e| e.kind == FaultKind::Offline));
        assert_eq!(silent[1].at_ms - silent[0].at_ms, SILENCE_MS);
    }

    #[test]
    fn fault_fields_are_the_simulators() {
        assert_eq!(FaultKind::PaperOut.fields(true), json!({"paper_out": true}));
        assert_eq!(FaultKind::Offline.fields(false), json!({"offline": false}));
        assert_eq!(FaultKind::CrashMidJob.fields(true), json!({"crash_mid_job": 1}));
        assert_eq!(FaultKind::Slow(40).fields(true), json!({"slow_ms": 40}));
        assert_eq!(FaultKind::Slow(40).fields(false), json!({"slow_ms": 0}));
        assert_eq!(FaultKind::ErrorAfterPrint.fields(true), json!({"error_after_print": 1}));
    }

    #[test]
    fn a_share_of_the_tasks_goes_to_the_station_and_the_rest_of_the_plan_stays() {
        let plain = submissions(2_000, 8, 0.3, 10_000, 7, None);
        let with = submissions(2_000, 8, 0.3, 10_000, 7, Some(6));
        let to_station: Vec<usize> = with
            .plan
            .requests
            .iter()
            .filter(|r| !r.repeat && String::from_utf8_lossy(&r.body).contains(STATION_ID))
            .map(|r| r.key as usize)
            .collect();
        assert!((100..250).contains(&to_station.len()), "{}", to_station.len());
        assert!(to_station.iter().all(|&n| with.printer_of[n] == 6));
        assert_eq!(plain.print_type_of, with.print_type_of);
        assert_eq!(plain.send_at_ms, with.send_at_ms);
    }

    #[test]
    fn the_config_has_every_print_type_in_priority_order() {
        let cfg = broker_config();
        for (name, priority, _) in PRINT_TYPES {
            assert!(cfg.contains(&format!("[print_types.{name}]\npriority = {priority}\n")), "{cfg}");
        }
        assert!(cfg.contains("reprint_on_doubt = false") && !cfg.contains("reprint_on_doubt = true"));
        assert_eq!(priority_of("refund"), 0);
        assert_eq!(priority_of("nope"), i32::MAX);
    }
}
