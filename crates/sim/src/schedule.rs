//! A fault schedule: the steps of one simulated run, drawn from a seed. Every step names
//! what it acts on by small indexes that the world resolves at that moment (the n-th
//! submission, the n-th message on the network), so that a schedule with steps removed
//! still means something: that is what shrinking relies on.

use std::fmt;

use onceprint_core::Outcome;

use crate::rng::Rng;

/// What a store agent's printer does with a job (the agent follows its own rules first:
/// its journal answers for anything already started or printed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentPrint {
    /// Paper out, `GS ( H` confirmed.
    Printed,
    /// The status check before the job (`DLE EOT`) showed the printer could not print:
    /// nothing was sent, nothing printed.
    Blocked(Outcome),
    /// The job went out and paper came out, but the confirmation never came: `in_doubt`.
    LostAfterPaper,
    /// The agent process dies after journaling `started`, with or without paper out.
    Crash { paper: bool },
}

/// What the shop's network does to the store agent's next forward of a LAN submission to
/// the broker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LanFault {
    /// The request never reaches the broker; the agent waits out its offline threshold.
    RequestLost,
    /// The broker takes the ticket (201) and the answer is lost on the way back.
    AnswerLost,
    /// The broker takes the ticket, and its answer comes after the agent stopped waiting.
    Slow,
    /// Not a forward: the agent's next upload of its offline tickets is answered 503 (the
    /// broker took none of it).
    UploadRefused,
}

/// How a CloudPRNT printer's print of a fetched job ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloudPrint {
    /// Paper out, confirmed with this code (`OK`, `200 OK`).
    Printed { code: &'static str },
    /// Confirmed with a code of Star's table or an undocumented one; `paper` says whether
    /// anything came out, which the simulated printer only may do where the code's row
    /// allows it (a code that proves nothing printed never comes with paper).
    Code { code: &'static str, paper: bool },
    /// Paper out, the confirmation lost on the way; the printer forgets the job.
    ConfirmLost,
    /// Paper out, confirmed twice (a retried DELETE).
    ConfirmTwice,
}

/// How an Epson TM printer's print of the job it was handed ends (ePOS-Print XML User's
/// Manual, `<response>`; Server Direct Print User's Manual, SetResponse).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EpsonPrint {
    /// Paper out, `success="true"`.
    Printed,
    /// `success="false"` with a code of Epson's table or an undocumented one; paper only
    /// where the code's row allows it. A printer whose roll is empty prints nothing and
    /// answers `EPTR_REC_EMPTY`, whatever is drawn here.
    Code { code: &'static str, paper: bool },
    /// Paper out, the SetResponse lost; the printer forgets the job.
    ResultLost,
    /// Paper out, the SetResponse sent twice.
    ResultTwice,
}

/// One step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// The POS submits a new ticket (a new key) to target `target` with print type `kind`.
    Submit { target: usize, kind: usize },
    /// The POS retries an earlier submission: same key, same content.
    Retry { pick: usize },
    /// The POS sends an earlier key with other content (a bug at the POS): refused.
    Conflict { pick: usize },
    /// A store agent polls; the answer may be lost on the way back.
    Poll { agent: usize, answer_lost: bool },
    /// A store agent's worker takes its next delivery to the printer.
    Handle { agent: usize, print: AgentPrint },
    /// A store agent sends its acks (with `next`: asking for the next deliveries, protocol
    /// 2); the request goes onto the network.
    SendAcks { agent: usize, next: bool },
    /// A request on the network reaches the broker (the `pick`-th in flight); it may stay
    /// on the network to arrive again (`dup`), and its answer may be lost.
    Deliver { pick: usize, dup: bool, answer_lost: bool },
    /// A request on the network is lost.
    Drop { pick: usize },
    /// kill -9 of a store agent, and it starts again: memory gone, the journal kept.
    RestartAgent { agent: usize },
    /// The CloudPRNT printer polls, reporting its state: 0 ready, 1 out of paper, 2 cover
    /// open.
    CloudPoll { status: usize },
    /// The CloudPRNT printer GETs the job it was offered; the data may be lost on the way.
    CloudFetch { lost: bool },
    /// The CloudPRNT printer prints the job it fetched and confirms.
    CloudPrint { print: CloudPrint },
    /// The CloudPRNT printer loses power: the job it held, printed or not, is forgotten.
    CloudPowerCycle { paper: bool },
    /// The CloudPRNT printer is switched off for good: it never polls again, not even
    /// once faults stop. Its station's tickets must move on, and its own must end, by time.
    CloudDies,
    /// The Epson printer sends a GetRequest; the answer (with the job's data) may be lost.
    EpsonGet { lost: bool },
    /// The Epson printer prints the job it was handed and sends its SetResponse.
    EpsonPrint { print: EpsonPrint },
    /// The Epson printer's roll runs out, or is replaced.
    EpsonPaper { empty: bool },
    /// The Epson printer loses power: the job it held, printed or not, is forgotten.
    EpsonPowerCycle { paper: bool },
    /// The Epson printer is switched off for good.
    EpsonDies,
    /// The push driver's round: the webhook printer's jobs sent, asked about, sent again.
    HookPass,
    /// The webhook receiver prints its next job and calls back with the status word
    /// `WEBHOOK_STATUS[status]`; paper only where the word allows it; the callback may be
    /// lost.
    HookPrint { status: usize, paper: bool, callback_lost: bool },
    /// The webhook receiver's reachability: 0 up, 1 refusing connections (nothing
    /// arrives), 2 a connection that breaks while the job is handed over (it arrives or
    /// not, and the driver cannot tell).
    HookMode { mode: usize, arrives: bool },
    /// The shop's line to the broker goes down or comes back: the store agent that holds
    /// the LAN listener (the first) can no longer reach the broker, nor it the agent.
    Line { up: bool },
    /// A POS in the shop submits a new ticket to the agent's LAN listener: to `a1`, `a2`
    /// or the station `st-a` (`target` 0–2), or the station `st-x` across transports
    /// (3, drawn only among the moved orders' steps), print type `kind`.
    LanSubmit { target: usize, kind: usize },
    /// The shop's POS retries an earlier LAN submission (same key, same content).
    LanRetry { pick: usize },
    /// The same order as an earlier LAN submission arrives through the cloud API (an
    /// online ordering channel, or a POS that falls back to the cloud).
    LanToCloud { pick: usize },
    /// The agent prints the next ticket it accepted offline that is due.
    LocalPrint { print: AgentPrint },
    /// The agent uploads its offline tickets; the answer may be lost.
    Sync { answer_lost: bool },
    /// The shop's network strikes the store agent's next forward of a LAN submission.
    LanNet { fault: LanFault },
    /// A person edits the station `st-a` (the LAN POS's station): its printers become
    /// `a1, a2` (as set up), `a2` alone, or `a2, a1` (`printers` 0–2). The agent learns of
    /// it at its next refresh.
    StationEdit { printers: usize },
    /// The broker looks for printers that poll and fell silent.
    OfflineCheck,
    /// Time passes.
    Advance { ms: i64 },
    /// The broker's wall clock steps (NTP), forwards or backwards.
    StepClock { ms: i64 },
    /// A shop PC's wall clock steps (NTP, a dead CMOS battery): what the agent's next
    /// process names its session with. Its monotonic clock, which measures the process's
    /// age, does not step.
    StepAgentClock { agent: usize, ms: i64 },
    /// The sweeper's round: deliveries of agents gone.
    Sweep,
    /// The paused printers' round: station tickets moved on by time.
    SweepPaused,
    /// kill -9 of the broker and a new process on the same database.
    RestartBroker,
    /// An operator's action on the `pick`-th task: 0 cancel, 1 reprint, 2 mark printed,
    /// 3 transfer to printer `to`.
    Manual { pick: usize, action: usize, to: usize },
    /// The same action on the newest ticket that is open or needs attention: the first
    /// the console lists, where a person looks when the shop calls about the order it
    /// just placed.
    ManualNewest { action: usize, to: usize },
    /// Retention runs as if two days had passed, with `retention_days = 1`: every task in an
    /// end state is pruned to its tombstone. Later retries of its key, uploads of the
    /// shop's offline copies and operators all meet the tombstone.
    Prune,
    /// A step of the MQTT printers and their MQTT server.
    Mqtt(MqttOp),
    /// The broker runs as `nodes` identical nodes on the one database, node `i`'s clock
    /// off by `skew_ms[i]` (what NTP leaves). The first step of such a schedule; without
    /// it the broker is alone.
    Nodes { nodes: usize, skew_ms: [i64; MAX_NODES] },
    /// The load balancer sends this step's request to node `node` (a node's kill -9 too:
    /// `RestartBroker` under `Via` restarts that node alone).
    Via { node: usize, op: Box<Op> },
    /// Node `node` syncs its agent registry with the others through the database (it
    /// also does so every second by itself).
    SyncRegistry { node: usize },
    /// kill -9 of node `node`, which stays down (the balancer sends its requests to the
    /// others) until `NodeUp`. The last node up stays up.
    NodeDown { node: usize },
    /// A node that is down starts again.
    NodeUp { node: usize },
}

/// What an onceprint MQTT device does with a job it takes (docs/MQTT.md, "The journal"):
/// its journal answers first for a key it has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DevicePrint {
    /// Journal `started`, paper out, journal `printed`, result `printed`.
    Printed,
    /// Result `error` after `started`: paper may or may not have come out.
    Error { paper: bool },
    /// Result `rejected`: the device cannot use the job's data; nothing printed.
    Rejected,
    /// The device loses power after journaling `started` (with or without paper), or after
    /// journaling `printed`, before its result got out: no result and no PUBACK, so the
    /// MQTT server delivers the job again once it is back.
    PowerLoss { paper: bool, journaled: bool },
    /// Printed and answered, but the job's PUBACK is lost: the job comes again.
    AckLost,
}

/// What a Star printer in CloudPRNT Version MQTT does with a `url` print-job it took (Star
/// CloudPRNT Protocol Guide, "MQTT Message Payload Specification").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StarPrint {
    /// Paper out, `print-result` with `printSucceeded: true`.
    Printed,
    /// `printSucceeded: false` with a code of Star's table or an undocumented one; paper
    /// only where the code's row allows it.
    Code { code: &'static str, paper: bool },
    /// The printer loses power after it fetched the job, with or without paper: no result.
    PowerLoss { paper: bool },
    /// Paper out, the `print-result` published twice.
    Twice,
}

/// A step of the MQTT printers' world (`world/mqtt.rs`): the onceprint device `m1`, the
/// Star printer `s1`, and the MQTT server between them and the broker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MqttOp {
    /// The push driver's round for `mqtt` printers. What the MQTT server does with the
    /// jobs published in it: 0 takes them and confirms (PUBACK); 1 takes them, the PUBACK
    /// lost (the broker's client sends them again at its next connection); 2 never gets
    /// them (they stay with the client, unconfirmed, until its next connection).
    Pass { publish: usize },
    /// The MQTT server hands the broker the oldest message devices published: 0 applied
    /// and acknowledged; 1 applied, its PUBACK lost (delivered again at the next
    /// connection); 2 the broker process killed after the message's effect was durable,
    /// before its PUBACK.
    Deliver { fault: usize },
    /// The broker's connection to the MQTT server breaks (`up` false), or is made again;
    /// `kept`: whether the server kept the broker's session (else what was queued for the
    /// broker and what its client had not had confirmed is gone).
    Link { up: bool, kept: bool },
    /// The onceprint device takes its next message.
    Device { print: DevicePrint },
    /// The onceprint device's mechanism: 0 ready, 1 out of paper, 2 cover open.
    DeviceState { state: usize },
    /// The onceprint device is switched off (its last will) or on (a new connection).
    DevicePower { on: bool },
    /// The Star printer takes its next message; the data of a job's GET may be lost.
    Star { print: StarPrint, fetch_lost: bool },
    /// The Star printer's state: 0 ready, 1 out of paper, 2 cover open.
    StarState { state: usize },
    /// The Star printer is switched off (its last will) or on.
    StarPower { on: bool },
    /// The Star printer (`star`) or the onceprint device switched off for good.
    Dies { star: bool },
}

impl MqttOp {
    /// See [`Op::is_fault`].
    pub fn is_fault(&self) -> bool {
        matches!(
            self,
            MqttOp::Pass { publish: 1 | 2 }
                | MqttOp::Deliver { fault: 1 | 2 }
                | MqttOp::Link { .. }
                | MqttOp::Device {
                    print: DevicePrint::Error { .. } | DevicePrint::PowerLoss { .. } | DevicePrint::AckLost
                }
                | MqttOp::DevicePower { on: false }
                | MqttOp::Star { print: StarPrint::Code { .. } | StarPrint::PowerLoss { .. }, .. }
                | MqttOp::Star { fetch_lost: true, .. }
                | MqttOp::StarPower { on: false }
                | MqttOp::Dies { .. }
        )
    }
}

impl Op {
    /// Steps that make a delivery's fate unknown to the broker: an `in_doubt` must follow
    /// one of them.
    pub fn is_fault(&self) -> bool {
        matches!(
            self,
            Op::Poll { answer_lost: true, .. }
                | Op::Handle { print: AgentPrint::LostAfterPaper | AgentPrint::Crash { .. }, .. }
                | Op::Deliver { answer_lost: true, .. }
                | Op::Drop { .. }
                | Op::RestartAgent { .. }
                | Op::CloudFetch { lost: true }
                | Op::CloudPrint { print: CloudPrint::Code { .. } | CloudPrint::ConfirmLost }
                | Op::CloudPowerCycle { .. }
                | Op::CloudDies
                | Op::EpsonGet { lost: true }
                | Op::EpsonPrint { print: EpsonPrint::Code { .. } | EpsonPrint::ResultLost }
                | Op::EpsonPowerCycle { .. }
                | Op::EpsonDies
                | Op::HookPrint { callback_lost: true, .. }
                | Op::HookMode { mode: 2, .. }
                | Op::Line { up: false }
                | Op::LocalPrint { print: AgentPrint::LostAfterPaper | AgentPrint::Crash { .. } }
                | Op::Sync { answer_lost: true }
                | Op::LanNet { .. }
                | Op::RestartBroker
                | Op::NodeDown { .. }
                | Op::StepClock { .. }
                | Op::StepAgentClock { .. }
        ) || matches!(self, Op::Advance { ms } if *ms >= SILENCE_MS)
            || matches!(self, Op::Mqtt(m) if m.is_fault())
            || matches!(self, Op::Via { op, .. } if op.is_fault())
    }
}

/// Time without a word that counts as a participant falling silent (a store agent's
/// delivery is offered again after 2 s in the simulated broker's settings).
pub const SILENCE_MS: i64 = 2_000;

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}")
    }
}

/// The result codes a simulated CloudPRNT printer draws from: Star's table (a row's class
/// written as a code of it) and one code no document covers.
pub const STAR_CODES: [&str; 12] =
    ["410", "411", "412", "413", "420", "421", "430", "510", "511", "520", "521", "599 Undocumented"];

/// The status words a webhook receiver calls back with (docs/RESULT-CODES.md, webhooks).
pub const WEBHOOK_STATUS: [&str; 7] =
    ["printed", "no_paper", "cover_open", "paper_jam", "offline", "error", "in_doubt"];

/// The result codes a simulated Epson printer draws from: Epson's table and one code no
/// document covers.
pub const EPSON_CODES: [&str; 13] = [
    "EPTR_AUTOMATICAL",
    "EPTR_COVER_OPEN",
    "EPTR_CUTTER",
    "EPTR_MECHANICAL",
    "EPTR_REC_EMPTY",
    "EPTR_UNRECOVERABLE",
    "SchemaError",
    "DeviceNotFound",
    "PrintSystemError",
    "EX_TIMEOUT",
    "EX_DEVICE_BUSY",
    "ERROR_WAIT_EJECT",
    "EPTR_SOMETHING_NEW",
];

fn epson_print(r: &mut Rng) -> EpsonPrint {
    match r.weighted(&[10, 3, 1, 1]) {
        0 => EpsonPrint::Printed,
        1 => EpsonPrint::Code { code: EPSON_CODES[r.below(EPSON_CODES.len() as u64) as usize], paper: r.chance(50) },
        2 => EpsonPrint::ResultLost,
        _ => EpsonPrint::ResultTwice,
    }
}

fn agent_print(r: &mut Rng) -> AgentPrint {
    match r.weighted(&[10, 1, 1, 1, 1, 1, 1, 1, 1]) {
        0 => AgentPrint::Printed,
        1 => AgentPrint::Blocked(Outcome::NoPaper),
        2 => AgentPrint::Blocked(Outcome::CoverOpen),
        3 => AgentPrint::Blocked(Outcome::Offline),
        4 => AgentPrint::Blocked(Outcome::PaperJam),
        5 => AgentPrint::Blocked(Outcome::Error),
        6 => AgentPrint::LostAfterPaper,
        7 => AgentPrint::Crash { paper: true },
        _ => AgentPrint::Crash { paper: false },
    }
}

fn cloud_print(r: &mut Rng) -> CloudPrint {
    match r.weighted(&[10, 3, 1, 1]) {
        0 => CloudPrint::Printed { code: if r.chance(50) { "OK" } else { "200 OK" } },
        1 => CloudPrint::Code { code: STAR_CODES[r.below(STAR_CODES.len() as u64) as usize], paper: r.chance(50) },
        2 => CloudPrint::ConfirmLost,
        _ => CloudPrint::ConfirmTwice,
    }
}

/// Targets the POS submits to: agent printers `a1`, `a2`, the CloudPRNT printer `c1`, the
/// station `st-a` (`a1`, then `a2`), the station `st-x` (`c1`, then `a1`: across
/// transports), the Epson printer `e1` and the station `st-y` (`e1`, then `c1`: two
/// vendors' printers that both poll), and the webhook printer `w1`.
pub const TARGETS: usize = 8;
/// Print types (see `world::TYPES`).
pub const KINDS: usize = 4;
/// Store agents of the one store (two processes compete for it, as after a replacement).
pub const AGENTS: usize = 2;
/// Printers a transfer may name.
pub const PRINTERS: usize = 5;
/// Broker nodes at most.
pub const MAX_NODES: usize = 3;

/// The steps of the schedule named by `seed`: between `max_steps / 4` and `max_steps`, and
/// up to three runs of retention.
pub fn generate(seed: u64, max_steps: usize) -> Vec<Op> {
    let mut r = Rng::new(seed);
    let lo = (max_steps / 4).max(1) as u64;
    let n = lo + r.below(max_steps as u64 - lo + 1);
    // Each schedule leans on some kinds of step more than others, so that runs differ in
    // shape and not only in order (a run of mostly CloudPRNT, one of many restarts …).
    let mut weights: Vec<u64> = vec![
        8, 2, 1, 6, 7, 4, 5, 1, 1, 4, 3, 3, 1, 1, 4, 1, 2, 1, 1, 2, 1, 1, 4, 4, 1, 1, 3, 3, 1, 2, 4, 2, 1, 4, 2, 1,
    ];
    for w in weights.iter_mut() {
        if r.chance(25) {
            *w *= 3;
        } else if r.chance(15) {
            *w = 0;
        }
    }
    weights[0] = weights[0].max(4);
    let mut ops = (0..n)
        .map(|_| match r.weighted(&weights) {
            0 => Op::Submit { target: r.below(TARGETS as u64) as usize, kind: r.below(KINDS as u64) as usize },
            1 => Op::Retry { pick: r.below(1 << 16) as usize },
            2 => Op::Conflict { pick: r.below(1 << 16) as usize },
            3 => Op::Poll { agent: r.below(AGENTS as u64) as usize, answer_lost: r.chance(10) },
            4 => Op::Handle { agent: r.below(AGENTS as u64) as usize, print: agent_print(&mut r) },
            5 => Op::SendAcks { agent: r.below(AGENTS as u64) as usize, next: r.chance(50) },
            6 => Op::Deliver { pick: r.below(1 << 16) as usize, dup: r.chance(10), answer_lost: r.chance(10) },
            7 => Op::Drop { pick: r.below(1 << 16) as usize },
            8 => Op::RestartAgent { agent: r.below(AGENTS as u64) as usize },
            9 => Op::CloudPoll { status: if r.chance(80) { 0 } else { 1 + r.below(2) as usize } },
            10 => Op::CloudFetch { lost: r.chance(10) },
            11 => Op::CloudPrint { print: cloud_print(&mut r) },
            12 => Op::CloudPowerCycle { paper: r.chance(50) },
            13 => Op::OfflineCheck,
            14 => Op::Advance { ms: r.range(50, 3_000) },
            15 => Op::StepClock { ms: r.range(-20_000, 20_000) },
            16 => Op::Sweep,
            17 => Op::SweepPaused,
            18 => Op::RestartBroker,
            19 => Op::Manual {
                pick: r.below(1 << 16) as usize,
                action: r.below(4) as usize,
                to: r.below(PRINTERS as u64) as usize,
            },
            // Rarely: most runs keep their CloudPRNT printer.
            20 if r.chance(20) => Op::CloudDies,
            20 => Op::OfflineCheck,
            21 => Op::StepAgentClock {
                agent: r.below(AGENTS as u64) as usize,
                ms: if r.chance(50) { -3_600_000 } else { r.range(-60_000, 3_600_000) },
            },
            22 => Op::EpsonGet { lost: r.chance(10) },
            23 => Op::EpsonPrint { print: epson_print(&mut r) },
            24 => Op::EpsonPaper { empty: r.chance(50) },
            25 => Op::EpsonPowerCycle { paper: r.chance(50) },
            26 => Op::HookPass,
            27 => Op::HookPrint {
                status: if r.chance(70) { 0 } else { r.below(WEBHOOK_STATUS.len() as u64) as usize },
                paper: r.chance(50),
                callback_lost: r.chance(10),
            },
            28 => Op::HookMode { mode: if r.chance(50) { 0 } else { 1 + r.below(2) as usize }, arrives: r.chance(50) },
            29 => Op::Line { up: r.chance(50) },
            30 => Op::LanSubmit { target: r.below(3) as usize, kind: r.below(KINDS as u64) as usize },
            31 => Op::LanRetry { pick: r.below(1 << 16) as usize },
            32 => Op::LanToCloud { pick: r.below(1 << 16) as usize },
            33 => Op::LocalPrint { print: agent_print(&mut r) },
            34 => Op::Sync { answer_lost: r.chance(15) },
            // Rarely: most runs keep their Epson printer.
            _ if r.chance(20) => Op::EpsonDies,
            _ => Op::OfflineCheck,
        })
        .collect::<Vec<Op>>();
    // Retention runs in a third of the schedules, drawn from a stream of its own so that
    // the other two thirds are the very schedules their seeds named before retention was
    // simulated.
    let mut p = Rng::new(seed ^ PRUNE_STREAM);
    if p.chance(33) {
        for _ in 0..1 + p.below(3) {
            let at = p.below(ops.len() as u64 + 1) as usize;
            ops.insert(at, Op::Prune);
        }
    }
    insert_mqtt(seed, &mut ops);
    insert_lan_net(seed, &mut ops);
    insert_lan_moves(seed, &mut ops);
    spread_over_nodes(seed, ops)
}

/// Salt of the random stream of the LAN forwards' network faults.
const LAN_NET_STREAM: u64 = 0x6c61_6e2d_6e65_7473;

/// In half of the schedules with LAN orders, faults of the agent's requests to the broker
/// (a forward's request lost, its answer lost after the broker took the ticket, its answer
/// past the agent's offline threshold; an upload refused) and, in a quarter of those, a
/// person's edits of the LAN POS's station, drawn from a stream of their own and put among the other
/// steps: the other schedules are the ones their seeds named before.
fn insert_lan_net(seed: u64, ops: &mut Vec<Op>) {
    if !ops.iter().any(|o| matches!(o, Op::LanSubmit { .. })) {
        return;
    }
    let mut r = Rng::new(seed ^ LAN_NET_STREAM);
    if !r.chance(50) {
        return;
    }
    for _ in 0..1 + r.below(4) {
        let fault = match r.below(4) {
            0 => LanFault::RequestLost,
            1 => LanFault::AnswerLost,
            2 => LanFault::Slow,
            _ => LanFault::UploadRefused,
        };
        let at = r.below(ops.len() as u64 + 1) as usize;
        ops.insert(at, Op::LanNet { fault });
    }
    // In a quarter of those, a person edits the LAN POS's station during the run.
    if r.chance(25) {
        for _ in 0..1 + r.below(2) {
            let at = r.below(ops.len() as u64 + 1) as usize;
            ops.insert(at, Op::StationEdit { printers: r.below(3) as usize });
        }
    }
}

/// Salt of the random stream of the moved LAN orders.
const LAN_MOVE_STREAM: u64 = 0x6c61_6e2d_6d6f_7665;

/// In one schedule in ten with LAN orders, drawn from a stream of its own, the steps of an
/// order that both the agent and the broker may hold (to any LAN target, the station
/// across transports among them): moved by a person after an upload whose answer was lost
/// ([`moved_after_upload`]), or printed by both before the upload ([`both_before_upload`]).
/// The windows are a few steps wide; random steps seldom hit them. Other steps may still
/// come between these, as they are put at increasing places.
fn insert_lan_moves(seed: u64, ops: &mut Vec<Op>) {
    if !ops.iter().any(|o| matches!(o, Op::LanSubmit { .. })) {
        return;
    }
    let mut r = Rng::new(seed ^ LAN_MOVE_STREAM);
    if !r.chance(10) {
        return;
    }
    let order = Op::LanSubmit { target: r.below(4) as usize, kind: r.below(KINDS as u64) as usize };
    let motif = if r.chance(50) { moved_after_upload(&mut r, order) } else { both_before_upload(&mut r, order) };
    // Increasing places: the motif keeps its order, with a step or two of the rest between.
    let mut at = r.below(ops.len() as u64 + 1) as usize;
    for op in motif {
        ops.insert(at.min(ops.len()), op);
        at += 1 + usize::from(r.chance(20));
    }
}

/// The order held by the agent offline (the line down, or a forward's answer lost or late,
/// when the broker holds it too), uploaded with the answer lost, then moved by a person to
/// another printer, whose steps follow, and the agent's local lane after them.
fn moved_after_upload(r: &mut Rng, order: Op) -> Vec<Op> {
    let to = r.below(PRINTERS as u64) as usize;
    let mut motif = match r.below(4) {
        0 | 1 => vec![Op::Line { up: false }, order, Op::Line { up: true }],
        2 => vec![Op::LanNet { fault: LanFault::AnswerLost }, order],
        _ => vec![Op::LanNet { fault: LanFault::Slow }, order],
    };
    motif.push(Op::Sync { answer_lost: true });
    // Now and then the agent is killed before it hears more: a new process reads its
    // outbox again.
    if r.chance(33) {
        motif.push(Op::RestartAgent { agent: 0 });
    }
    motif.push(Op::ManualNewest { action: 3, to });
    // The steps of the printer the order moved to (`world::TRANSFER_TO`): a1, a2, c1, e1, w1.
    motif.extend(match to {
        0 | 1 => vec![
            Op::Poll { agent: 0, answer_lost: false },
            Op::Handle { agent: 0, print: AgentPrint::Printed },
            Op::SendAcks { agent: 0, next: false },
        ],
        2 => vec![
            Op::CloudPoll { status: 0 },
            Op::CloudFetch { lost: false },
            Op::CloudPrint { print: CloudPrint::Printed { code: "OK" } },
        ],
        3 => vec![Op::EpsonGet { lost: false }, Op::EpsonPrint { print: EpsonPrint::Printed }],
        _ => vec![Op::HookPass, Op::HookPrint { status: 0, paper: true, callback_lost: false }],
    });
    motif.push(Op::LocalPrint { print: AgentPrint::Printed });
    motif
}

/// A forward whose answer is lost or late, so that the broker and the agent both hold the
/// order; both print before the agent's upload: the agent its offline copy, the broker its
/// task on the printer it chose (a CloudPRNT printer's steps and the agent's), and then the
/// upload. One copy only if both chose the same printer and the agent's journal knew it.
fn both_before_upload(r: &mut Rng, order: Op) -> Vec<Op> {
    let fault = if r.chance(50) { LanFault::AnswerLost } else { LanFault::Slow };
    vec![
        Op::LanNet { fault },
        order,
        Op::LocalPrint { print: AgentPrint::Printed },
        Op::CloudPoll { status: 0 },
        Op::CloudFetch { lost: false },
        Op::CloudPrint { print: CloudPrint::Printed { code: "OK" } },
        Op::Poll { agent: 0, answer_lost: false },
        Op::Handle { agent: 0, print: AgentPrint::Printed },
        Op::SendAcks { agent: 0, next: false },
        Op::Sync { answer_lost: false },
    ]
}

/// Salt of the random stream that places retention's runs.
const PRUNE_STREAM: u64 = 0x7265_7465_6e74_696f;

/// Salt of the random stream of the MQTT printers' steps.
const MQTT_STREAM: u64 = 0x6d71_7474_2d73_696d;

/// Targets only MQTT steps submit to (after the `TARGETS` the other steps draw): the
/// onceprint device `m1`, the Star printer `s1`, the station `st-m` (`m1`, then `s1`: the
/// two MQTT protocols) and the station `st-q` (`s1`, then `a1`: across transports).
pub const MQTT_TARGETS: usize = 4;
/// Printers only MQTT steps transfer to (after the `PRINTERS`): `m1`, `s1`.
pub const MQTT_PRINTERS: usize = 2;

/// In a quarter of the schedules, the MQTT printers' steps, drawn from a stream of their own
/// (the other schedules are the ones their seeds named before MQTT was simulated) and put
/// among the others at random places: tickets for the MQTT printers and their stations,
/// the push driver's rounds, the devices at work and failing, the MQTT server losing and
/// repeating messages, operators moving tickets to and from the MQTT printers.
fn insert_mqtt(seed: u64, ops: &mut Vec<Op>) {
    let mut m = Rng::new(seed ^ MQTT_STREAM);
    if !m.chance(25) {
        return;
    }
    let n = ops.len() as u64;
    let k = (n / 5).max(4) + m.below(n / 5 + 1);
    for _ in 0..k {
        let op = match m.weighted(&[6, 7, 7, 6, 6, 1, 1, 1, 1, 1, 1, 1, 2]) {
            0 => Op::Submit {
                target: TARGETS + m.below(MQTT_TARGETS as u64) as usize,
                kind: m.below(KINDS as u64) as usize,
            },
            1 => Op::Mqtt(MqttOp::Pass { publish: if m.chance(85) { 0 } else { 1 + m.below(2) as usize } }),
            2 => Op::Mqtt(MqttOp::Deliver { fault: if m.chance(85) { 0 } else { 1 + m.below(2) as usize } }),
            3 => Op::Mqtt(MqttOp::Device { print: device_print(&mut m) }),
            4 => Op::Mqtt(MqttOp::Star { print: star_print(&mut m), fetch_lost: m.chance(5) }),
            5 => Op::Mqtt(MqttOp::DeviceState { state: if m.chance(50) { 0 } else { 1 + m.below(2) as usize } }),
            6 => Op::Mqtt(MqttOp::StarState { state: if m.chance(50) { 0 } else { 1 + m.below(2) as usize } }),
            7 => Op::Mqtt(MqttOp::DevicePower { on: m.chance(50) }),
            8 => Op::Mqtt(MqttOp::StarPower { on: m.chance(50) }),
            9 => Op::Mqtt(MqttOp::Link { up: m.chance(50), kept: m.chance(70) }),
            10 if m.chance(15) => Op::Mqtt(MqttOp::Dies { star: m.chance(50) }),
            10 => Op::Advance { ms: m.range(50, 3_000) },
            11 => Op::Manual {
                pick: m.below(1 << 16) as usize,
                action: m.below(4) as usize,
                to: PRINTERS + m.below(MQTT_PRINTERS as u64) as usize,
            },
            _ => Op::Advance { ms: m.range(50, 3_000) },
        };
        let at = m.below(ops.len() as u64 + 1) as usize;
        ops.insert(at, op);
    }
}

fn device_print(r: &mut Rng) -> DevicePrint {
    match r.weighted(&[10, 2, 1, 2, 1]) {
        0 => DevicePrint::Printed,
        1 => DevicePrint::Error { paper: r.chance(50) },
        2 => DevicePrint::Rejected,
        3 => {
            let journaled = r.chance(33);
            DevicePrint::PowerLoss { paper: journaled || r.chance(50), journaled }
        }
        _ => DevicePrint::AckLost,
    }
}

fn star_print(r: &mut Rng) -> StarPrint {
    match r.weighted(&[10, 3, 1, 1]) {
        0 => StarPrint::Printed,
        1 => StarPrint::Code { code: STAR_CODES[r.below(STAR_CODES.len() as u64) as usize], paper: r.chance(50) },
        2 => StarPrint::PowerLoss { paper: r.chance(50) },
        _ => StarPrint::Twice,
    }
}
/// Salt of the random stream that decides the broker's nodes.
const NODES_STREAM: u64 = 0x6e6f_6465_735f_6c62;

/// In a quarter of the schedules the broker runs as two or three nodes behind a load
/// balancer: every step goes to a node drawn for it (consecutive requests of one client
/// may reach different nodes), and now and then, between two steps, a node syncs its
/// agent registry, goes down or starts again. Drawn from a stream of its own: the other
/// schedules are the ones their seeds named before nodes were simulated.
fn spread_over_nodes(seed: u64, ops: Vec<Op>) -> Vec<Op> {
    let mut r = Rng::new(seed ^ NODES_STREAM);
    if !r.chance(25) {
        return ops;
    }
    let nodes = 2 + r.below(MAX_NODES as u64 - 1) as usize;
    let mut skew_ms = [0; MAX_NODES];
    for s in skew_ms.iter_mut().take(nodes) {
        *s = r.range(-SKEW_MS, SKEW_MS);
    }
    // Some balancers keep a client on one node for a while, some spread every request.
    let stay = r.below(80);
    let mut node = 0;
    let mut out = Vec::with_capacity(ops.len() * 5 / 4 + 1);
    out.push(Op::Nodes { nodes, skew_ms });
    for op in ops {
        if r.chance(10) {
            out.push(Op::SyncRegistry { node: r.below(nodes as u64) as usize });
        }
        if r.chance(2) {
            out.push(Op::NodeDown { node: r.below(nodes as u64) as usize });
        } else if r.chance(2) {
            out.push(Op::NodeUp { node: r.below(nodes as u64) as usize });
        }
        if !r.chance(stay) {
            node = r.below(nodes as u64) as usize;
        }
        out.push(Op::Via { node, op: Box::new(op) });
    }
    out
}

/// How far a node's clock may be off (NTP keeps servers within tens of milliseconds).
pub const SKEW_MS: i64 = 50;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_runs_in_some_schedules_only() {
        let with = (0..300).filter(|&seed| generate(seed, 80).contains(&Op::Prune)).count();
        assert!((50..150).contains(&with), "{with} of 300");
    }

    #[test]
    fn mqtt_steps_come_in_some_schedules_only() {
        let with = (0..300).filter(|&seed| generate(seed, 80).iter().any(|op| matches!(op, Op::Mqtt(_)))).count();
        assert!((50..150).contains(&with), "{with} of 300");
    }

    #[test]
    fn a_seed_names_one_schedule() {
        assert_eq!(generate(9, 80), generate(9, 80));
        assert_ne!(generate(9, 80), generate(10, 80));
        let s = generate(9, 80);
        assert!((20..=83).contains(&s.len()), "{}", s.len());
    }

    #[test]
    fn some_schedules_run_on_several_nodes() {
        let several = (0..400).filter(|&seed| matches!(generate(seed, 80).first(), Some(Op::Nodes { .. }))).count();
        assert!((60..140).contains(&several), "{several} of 400");
    }
}
