//! Schedules the simulation found or that name a defect once fixed, kept as they were
//! shrunk: each must keep the promise, and each broke it before its fix.

use onceprint_core::Outcome;
use onceprint_sim::schedule::{AgentPrint, CloudPrint, DevicePrint, EpsonPrint, LanFault, MqttOp, Op, StarPrint};
use onceprint_sim::{run_schedule, Options};

fn holds(ops: &[Op]) {
    match run_schedule(ops, &Options::default()).expect("the simulation runs") {
        Ok(_) => {}
        Err(v) => panic!("broke the promise at {:?}: {}", v.step, v.what),
    }
}

/// A CloudPRNT printer confirms a fetched job with a code that does not prove nothing
/// printed (Star's 4xx): the ticket goes to a person, never to the printer again.
#[test]
fn a_vendor_code_after_the_fetch_never_prints_a_second_copy() {
    holds(&[
        Op::Submit { target: 4, kind: 0 },
        Op::CloudPoll { status: 0 },
        Op::CloudFetch { lost: false },
        Op::CloudPrint { print: CloudPrint::Code { code: "421", paper: true } },
    ]);
}

/// A CloudPRNT printer that never polls at all: its station's ticket moves on by time.
#[test]
fn a_printer_that_never_calls_in_lets_its_station_move_on() {
    holds(&[Op::CloudDies, Op::Submit { target: 2, kind: 2 }, Op::Submit { target: 4, kind: 1 }]);
}

/// A reprint of a ticket in doubt, whose printer then dies, prints on the station's
/// backup with its banner.
#[test]
fn a_reprint_that_fails_over_keeps_its_banner() {
    holds(&[
        Op::Submit { target: 4, kind: 0 },
        Op::CloudPoll { status: 0 },
        Op::CloudFetch { lost: false },
        Op::CloudPrint { print: CloudPrint::Code { code: "430", paper: true } },
        Op::Manual { pick: 5, action: 1, to: 1 },
        Op::CloudDies,
    ]);
}

/// A kitchen ticket (reprints on doubt) whose first copy may have come out waits for its
/// marked reprint; an operator's transfer of it is refused, so no unmarked copy follows.
#[test]
fn a_ticket_that_may_have_printed_is_never_transferred() {
    holds(&[
        Op::Submit { target: 0, kind: 2 },
        Op::Poll { agent: 0, answer_lost: false },
        Op::Handle { agent: 0, print: AgentPrint::LostAfterPaper },
        Op::SendAcks { agent: 0, next: false },
        Op::Deliver { pick: 0, dup: false, answer_lost: false },
        Op::Manual { pick: 5, action: 3, to: 1 },
    ]);
}

/// A printer out of paper before the job proves nothing printed: the ticket waits and
/// prints once after the refill.
#[test]
fn paper_out_before_the_job_prints_once_after_the_refill() {
    holds(&[
        Op::Submit { target: 0, kind: 1 },
        Op::Poll { agent: 0, answer_lost: false },
        Op::Handle { agent: 0, print: AgentPrint::Blocked(Outcome::NoPaper) },
        Op::SendAcks { agent: 0, next: true },
        Op::Deliver { pick: 0, dup: true, answer_lost: false },
        Op::Advance { ms: 1_000 },
    ]);
}

/// After a broker restart a store agent's late acks reach the new process before any poll
/// of it, and take the next ticket with them; the other agent's poll must not judge the
/// agent gone (it was heard a moment ago) and put that ticket in doubt.
#[test]
fn an_agent_heard_only_through_its_acks_is_not_gone() {
    holds(&[
        Op::Submit { target: 0, kind: 0 },
        Op::Poll { agent: 1, answer_lost: false },
        Op::RestartBroker,
        Op::Handle { agent: 1, print: AgentPrint::Printed },
        Op::SendAcks { agent: 1, next: true },
        Op::Submit { target: 0, kind: 0 },
        Op::Advance { ms: 2492 },
        Op::RestartAgent { agent: 1 },
        Op::Advance { ms: 2840 },
    ]);
}

/// The lane stall of the delivery core: a low-priority ticket in flight when its agent
/// restarts while a higher-priority ticket arrives. The ticket in flight is offered to the
/// new process, then the other prints.
#[test]
fn a_restart_with_a_higher_priority_ticket_waiting_never_stalls_the_lane() {
    holds(&[
        Op::Submit { target: 0, kind: 3 },
        Op::Poll { agent: 0, answer_lost: false },
        Op::RestartAgent { agent: 0 },
        Op::Submit { target: 0, kind: 0 },
        Op::Advance { ms: 1_500 },
        Op::Poll { agent: 0, answer_lost: false },
    ]);
}

/// An Epson printer reports an autocutter error for the job it was handed (the slip is
/// printed, not cut): the ticket goes to a person, never to the printer again.
#[test]
fn an_epson_error_after_the_hand_out_never_prints_a_second_copy() {
    holds(&[
        Op::Submit { target: 5, kind: 1 },
        Op::EpsonGet { lost: false },
        Op::EpsonPrint { print: EpsonPrint::Code { code: "EPTR_CUTTER", paper: true } },
        Op::Advance { ms: 500 },
        Op::EpsonGet { lost: false },
    ]);
}

/// An Epson printer whose roll is empty prints nothing and says so; the ticket prints once
/// after the refill, and a ticket for its station moves on meanwhile.
#[test]
fn an_empty_epson_roll_prints_nothing_and_the_ticket_once_after_the_refill() {
    holds(&[
        Op::EpsonPaper { empty: true },
        Op::Submit { target: 5, kind: 1 },
        Op::Submit { target: 6, kind: 0 },
        Op::EpsonGet { lost: false },
        Op::EpsonPrint { print: EpsonPrint::Printed },
        Op::Advance { ms: 3_000 },
        Op::SweepPaused,
        Op::EpsonPaper { empty: false },
    ]);
}

/// A webhook job whose hand-over broke arrives all the same; the driver asks, sends it
/// again under the same key, and the receiver prints the key once; a lost callback is made
/// up for by the status URL.
#[test]
fn a_webhook_job_sent_twice_under_one_key_prints_once() {
    holds(&[
        Op::HookMode { mode: 2, arrives: true },
        Op::Submit { target: 7, kind: 1 },
        Op::HookPass,
        Op::HookMode { mode: 0, arrives: true },
        Op::Advance { ms: 2_500 },
        Op::HookPass,
        Op::HookPrint { status: 0, paper: true, callback_lost: true },
        Op::Advance { ms: 2_500 },
        Op::HookPass,
    ]);
}

/// A LAN order taken offline and printed by the agent, sent again through the cloud while
/// the line is down, then uploaded: one task for the key, one copy on paper.
#[test]
fn a_lan_order_printed_offline_and_sent_through_the_cloud_prints_once() {
    holds(&[
        Op::Line { up: false },
        Op::LanSubmit { target: 0, kind: 1 },
        Op::LocalPrint { print: AgentPrint::Printed },
        Op::LanToCloud { pick: 0 },
        Op::Poll { agent: 0, answer_lost: false },
        Op::Line { up: true },
        Op::Sync { answer_lost: false },
        Op::LanRetry { pick: 0 },
    ]);
}

/// An upload whose answer is lost: the tickets go back to the agent's lane, the broker has
/// them too; the journal by key keeps them to one copy.
#[test]
fn an_upload_whose_answer_is_lost_prints_each_ticket_once() {
    holds(&[
        Op::Line { up: false },
        Op::LanSubmit { target: 2, kind: 0 },
        Op::LanSubmit { target: 1, kind: 1 },
        Op::Line { up: true },
        Op::Sync { answer_lost: true },
        Op::LocalPrint { print: AgentPrint::Printed },
        Op::Poll { agent: 0, answer_lost: false },
        Op::Handle { agent: 0, print: AgentPrint::Printed },
        Op::Sync { answer_lost: false },
    ]);
}

/// A delivery held by the agent that then stands by (the other takes the store's LAN
/// orders) goes to a person once overdue, and the lane moves on.
#[test]
fn a_delivery_held_by_an_agent_that_stands_by_never_holds_the_lane() {
    holds(&[
        Op::Submit { target: 3, kind: 3 },
        Op::Poll { agent: 1, answer_lost: true },
        Op::LanSubmit { target: 1, kind: 3 },
    ]);
}

/// A kitchen order taken offline and printed by the agent, the same order through the
/// cloud, and the cloud task moved to another printer by an operator: once the line is
/// back, the upload of the LAN copy settles the task the order lives on (the moved one)
/// before it prints.
#[test]
fn the_upload_of_a_lan_copy_settles_the_task_the_order_lives_on() {
    holds(&[
        Op::Line { up: false },
        Op::LanSubmit { target: 2, kind: 2 },
        Op::LanToCloud { pick: 0 },
        Op::Manual { pick: 5, action: 3, to: 2 },
    ]);
}

/// The same, with retention run while the shop is still cut off: the moved-from task (an
/// end state) is pruned to its tombstone, its successor still waits. The upload finds the
/// key in the tombstone and follows the chain from there to the task the order lives on.
#[test]
fn the_upload_of_a_lan_copy_follows_the_chain_through_a_pruned_task() {
    holds(&[
        Op::Line { up: false },
        Op::LanSubmit { target: 0, kind: 3 },
        Op::LanToCloud { pick: 35065 },
        Op::Manual { pick: 2868, action: 3, to: 4 },
        Op::Prune,
    ]);
}

/// The shop's upload is merged by the broker, its answer lost; an operator then moves the
/// order's cloud task to another printer. The agent does not print the uploaded tickets
/// on its own lane while the broker may have taken them: it uploads them again and learns
/// the broker has them, so the moved task is the order's only copy.
#[test]
fn an_upload_whose_answer_is_lost_stays_with_the_broker_when_the_order_is_moved() {
    holds(&[
        Op::Line { up: false },
        Op::Submit { target: 1, kind: 0 },
        Op::Submit { target: 7, kind: 2 },
        Op::Submit { target: 4, kind: 3 },
        Op::LanSubmit { target: 1, kind: 0 },
        Op::Submit { target: 4, kind: 1 },
        Op::Submit { target: 4, kind: 0 },
        Op::LanSubmit { target: 1, kind: 1 },
        Op::LanToCloud { pick: 962 },
        Op::LanToCloud { pick: 49477 },
        Op::Submit { target: 5, kind: 0 },
        Op::Submit { target: 6, kind: 3 },
        Op::Line { up: true },
        Op::Sync { answer_lost: true },
        Op::Manual { pick: 27960, action: 3, to: 4 },
    ]);
}

/// A Star printer in CloudPRNT Version MQTT answers the status request a new broker
/// process sends every device only after that process published it a job: the answer,
/// the first the process hears from it, says it is online, not that it left and came back,
/// so the job waits for its result instead of going to a person.
#[test]
fn a_star_printers_first_status_after_a_restart_leaves_its_job_alone() {
    holds(&[
        Op::Mqtt(MqttOp::Device { print: DevicePrint::Printed }),
        Op::Mqtt(MqttOp::Deliver { fault: 2 }),
        Op::Submit { target: 9, kind: 3 },
        Op::Mqtt(MqttOp::Pass { publish: 0 }),
        Op::Mqtt(MqttOp::Star { print: StarPrint::Printed, fetch_lost: false }),
        Op::Advance { ms: 1655 },
    ]);
}

/// An onceprint device prints a job, loses power after journaling it and before its
/// result got out, and the broker dies between applying a status and its PUBACK: the job
/// comes again after both restarts and is answered from the journal, one copy.
#[test]
fn an_mqtt_device_answers_a_job_it_printed_from_its_journal() {
    holds(&[
        Op::Submit { target: 8, kind: 2 },
        Op::Mqtt(MqttOp::Device { print: DevicePrint::Printed }),
        Op::Mqtt(MqttOp::Pass { publish: 0 }),
        Op::Mqtt(MqttOp::Device { print: DevicePrint::PowerLoss { paper: true, journaled: true } }),
        Op::Mqtt(MqttOp::Deliver { fault: 2 }),
        Op::Mqtt(MqttOp::DevicePower { on: true }),
        Op::Advance { ms: 12_000 },
        Op::Mqtt(MqttOp::Pass { publish: 0 }),
    ]);
}

/// An onceprint device out of paper is sent its job again (no answer within the resend
/// time) and answers the first copy `no_paper`; the station moves the ticket on to the
/// Star printer, which prints it. The second copy reaches the device once its paper is
/// back and is answered from the journal's refusal, not printed (before the device
/// protocol journaled refusals, it printed a second copy).
#[test]
fn a_device_out_of_paper_does_not_print_a_repeated_job_after_its_ticket_moved_on() {
    holds(&[
        Op::Submit { target: 10, kind: 0 },
        Op::Mqtt(MqttOp::Pass { publish: 0 }),
        Op::Mqtt(MqttOp::DeviceState { state: 1 }),
        Op::Advance { ms: 10_500 },
        Op::Mqtt(MqttOp::Pass { publish: 0 }),
        Op::Mqtt(MqttOp::Device { print: DevicePrint::Printed }),
        Op::Mqtt(MqttOp::Device { print: DevicePrint::Printed }),
        Op::Mqtt(MqttOp::Deliver { fault: 0 }),
        Op::Advance { ms: 6_000 },
    ]);
}

/// Two broker nodes: a ticket handed by one node to an agent the other node has not
/// heard of yet (the sync has not carried it over) stays with that agent when the other
/// agent polls the other node. It was put in doubt with nothing wrong: the other node
/// judged the holder by its own uptime alone (the broker's clock had stepped ahead, so
/// that node had been up long enough to call an unknown agent gone).
#[test]
fn a_ticket_another_node_just_handed_out_stays_with_its_agent() {
    holds(&[
        Op::Nodes { nodes: 2, skew_ms: [44, -16, 0] },
        Op::Via { node: 0, op: Box::new(Op::StepClock { ms: 17_003 }) },
        Op::SyncRegistry { node: 0 },
        Op::Via { node: 0, op: Box::new(Op::Submit { target: 3, kind: 3 }) },
        Op::Via { node: 1, op: Box::new(Op::Poll { agent: 1, answer_lost: false }) },
        Op::Via { node: 0, op: Box::new(Op::Poll { agent: 0, answer_lost: false }) },
    ]);
}

/// Three broker nodes: the store's LAN listener, taken through one node, is known to the
/// node the other agent polls, so that agent is handed nothing while the shop prints the
/// order it took offline.
#[test]
fn a_lan_listener_taken_through_one_node_stands_the_other_agent_by_on_every_node() {
    holds(&[
        Op::Nodes { nodes: 3, skew_ms: [27, 18, -19] },
        Op::Via { node: 0, op: Box::new(Op::Line { up: false }) },
        Op::Via { node: 1, op: Box::new(Op::Poll { agent: 1, answer_lost: false }) },
        Op::Via { node: 2, op: Box::new(Op::LanSubmit { target: 2, kind: 0 }) },
        Op::Via { node: 1, op: Box::new(Op::LanToCloud { pick: 56_598 }) },
        Op::Via { node: 1, op: Box::new(Op::Poll { agent: 1, answer_lost: false }) },
    ]);
}

/// Two broker nodes: the node that holds the push driver's lease sends a webhook job
/// (the connection breaks, the job arrives) and dies. Once its lease expires the other
/// node takes the driver over, asks the receiver about the job sent under the older
/// token, and the ticket prints once.
#[test]
fn a_webhook_job_of_a_node_that_died_is_asked_about_by_the_next_holder() {
    holds(&[
        Op::Nodes { nodes: 2, skew_ms: [30, -30, 0] },
        Op::Via { node: 1, op: Box::new(Op::Submit { target: 7, kind: 2 }) },
        Op::HookMode { mode: 2, arrives: true },
        Op::HookPass,
        Op::NodeDown { node: 0 },
        Op::HookMode { mode: 0, arrives: true },
        Op::Advance { ms: 3_000 },
        Op::HookPass,
        Op::Advance { ms: 3_000 },
        Op::HookPass,
        Op::HookPrint { status: 0, paper: true, callback_lost: false },
        Op::Via { node: 1, op: Box::new(Op::HookPass) },
    ]);
}

/// A LAN order the broker answered through the agent, retried by the POS during an outage:
/// the agent answers with the broker's task (200), not a new one.
#[test]
fn a_lan_retry_during_an_outage_gets_the_task_the_broker_answered() {
    holds(&[Op::LanSubmit { target: 0, kind: 2 }, Op::Line { up: false }, Op::LanRetry { pick: 10259 }]);
}

/// An upload the broker answers 503 gives its tickets back to the agent's own lane: none is
/// left handed to a broker that never took it.
#[test]
fn a_refused_upload_gives_its_tickets_back_to_the_local_lane() {
    holds(&[
        Op::Line { up: false },
        Op::LanSubmit { target: 2, kind: 2 },
        Op::LanNet { fault: LanFault::UploadRefused },
        Op::StepClock { ms: -14_644 },
    ]);
}

/// A LAN order both the broker (its answer lost) and the agent took, whose station a person
/// changes before the upload: the broker keeps it where the agent printed it, or tells a
/// person; it never vanishes.
#[test]
fn a_station_changed_while_the_answer_was_lost_never_loses_the_ticket() {
    holds(&[
        Op::LanNet { fault: LanFault::AnswerLost },
        Op::LanSubmit { target: 2, kind: 0 },
        Op::StationEdit { printers: 1 },
    ]);
}

/// An upload whose answer was lost, the order's broker task moved by a person, then an
/// upload the broker refuses: the tickets of the first stay with the broker (it has them),
/// and the agent never prints its own copy beside the moved one.
#[test]
fn a_refused_upload_after_a_lost_answer_leaves_the_tickets_with_the_broker() {
    holds(&[
        Op::LanNet { fault: LanFault::AnswerLost },
        Op::LanSubmit { target: 1, kind: 0 },
        Op::Sync { answer_lost: true },
        Op::Manual { pick: 13720, action: 3, to: 2 },
        Op::LanNet { fault: LanFault::UploadRefused },
    ]);
}

/// A LAN order for a station whose first printer polls the broker (`st-x`: `c1`, then
/// the agent's `a1`), the forward's answer lost: the agent prints its copy on `a1`, and
/// the broker's task of the forward is on `a1` too (the printer the forward named), so
/// the agent's journal prints the order once. A broker placing it on the station's first
/// printer printed it on both.
#[test]
fn a_lan_order_for_a_station_across_transports_has_one_printer_on_both_paths() {
    holds(&[
        Op::LanNet { fault: LanFault::UploadRefused },
        Op::LanNet { fault: LanFault::AnswerLost },
        Op::LanSubmit { target: 3, kind: 0 },
    ]);
}

/// The shop's line down, a LAN order taken offline, the line back, the upload merged and
/// its answer lost, and a person moves the newest ticket (that order) to another agent
/// printer: the agent leaves the uploaded ticket with the broker, one copy.
#[test]
fn the_newest_order_moved_after_an_upload_whose_answer_was_lost_prints_once() {
    holds(&[
        Op::Line { up: false },
        Op::LanSubmit { target: 1, kind: 2 },
        Op::Line { up: true },
        Op::LanSubmit { target: 0, kind: 0 },
        Op::Sync { answer_lost: true },
        Op::ManualNewest { action: 3, to: 1 },
    ]);
}

/// As above, and the agent is killed after the upload whose answer was lost: the new
/// process reads its outbox again and leaves the handed tickets with the broker.
#[test]
fn a_restart_after_an_upload_whose_answer_was_lost_leaves_the_order_with_the_broker() {
    holds(&[
        Op::Line { up: false },
        Op::LanSubmit { target: 2, kind: 0 },
        Op::Line { up: true },
        Op::Sync { answer_lost: true },
        Op::RestartAgent { agent: 0 },
        Op::ManualNewest { action: 3, to: 3 },
    ]);
}

/// A CloudPRNT printer polls, polls again soon after (a poll the broker does not write to
/// the printer's row, which it refreshes only every few polls), fetches a ticket and is
/// quiet while it prints: the offline check judges it by when the broker last heard it,
/// not by the row, so the ticket is not put in doubt before the printer was silent past
/// 2 × its interval + the grace.
#[test]
fn a_printer_heard_since_its_row_was_written_is_not_taken_for_silent() {
    holds(&[
        Op::CloudPoll { status: 0 },
        Op::Submit { target: 4, kind: 0 },
        Op::Advance { ms: 2826 },
        Op::CloudPoll { status: 0 },
        Op::Advance { ms: 1450 },
        Op::CloudFetch { lost: false },
        Op::Advance { ms: 2579 },
        Op::Advance { ms: 2644 },
        Op::OfflineCheck,
    ]);
}
