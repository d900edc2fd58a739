//! The one mechanism behind every printer that polls the broker over HTTP with its own
//! login (Star CloudPRNT, Epson Server Direct Print). It owns what such printers have in
//! common, on the lane engine:
//!
//! - the printer's health from its polls: `online`, `last_seen_at` and `last_error` on
//!   the printer row (written when something changes; otherwise only `last_seen_at` is
//!   refreshed, at most once per poll interval and half the offline grace less a second,
//!   for all printers due in one store call a second), and the lane's reaction to it: a
//!   printer that reports it cannot print
//!   (no paper, cover open, paper jam) gets no job; the attempt it holds unfetched, or a
//!   job that is due, ends at once with that outcome, as an agent's does when its status
//!   check says so, so retries, attempt limits and failover work as for every printer;
//! - its one lane (`Scope::Printer` claims; a lane found empty is answered from memory
//!   until its store is signalled): a job handed out and not fetched yet is named
//!   again on every poll with the same attempt and token (nothing printed, nothing
//!   written); a job fetched is remembered durably before its data leaves
//!   ([`LaneEngine::mark_fetched`]) and never offered again: it ends with the printer's
//!   confirmation, or in doubt when the printer polls again idle, goes silent, or does not
//!   confirm before its deadline;
//! - confirmation by job token ([`JobToken`]: task and attempt, checked against the
//!   authenticated printer), applied with [`LaneEngine::ack`], so a token of an older
//!   attempt is stale and changes nothing, and a late result is credited to its own job;
//! - offline detection: a printer silent for 2 × its poll interval + a grace is offline
//!   (`printer.offline`), and the job it had fetched goes to a person.
//!
//! The protocol adapters (`cloudprnt`, `epson_sdp`) only translate their wire formats to
//! [`PollReport`]s and outcomes. Requests of one printer are handled one at a time on a
//! node (a lock per printer), so that what a poll reads and what it writes cannot
//! interleave with that printer's fetch or confirmation; a printer sends its requests one
//! after the other, so on several nodes they do not overlap either, and every change is a
//! compare-and-set on (state, attempt) in any case.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use onceprint_core::{delivery_key, Millis, Outcome, Proof};
use onceprint_store::{AgentIdentity, PrinterSeen, PrinterStatusUpdate, SilenceQuery, StoreError, Task};

use crate::claimant::{Claimant, ClaimantKind, FETCHED};
use crate::directory::PrinterInfo;
use crate::lanes::{AckIn, AckResult, ClaimRules, DeliveryError, LaneEngine, Scope};
use crate::transport::{Encoding, TransportConfig, TransportKind};

/// Tuning of the polled transports.
#[derive(Debug, Clone)]
pub struct PolledConfig {
    /// The poll interval of a printer whose configuration names none (seconds).
    pub default_poll_interval_s: u32,
    /// A printer is offline after 2 × its poll interval + this without a poll.
    pub offline_grace_ms: i64,
    /// A job handed out and fetched must be confirmed within this long, or it goes to a
    /// person (or is reprinted, where the print type says so).
    pub answer_within_ms: i64,
    /// How often each node looks for printers that went silent, and writes the
    /// `last_seen_at` refreshes of the printers that polled it meanwhile.
    pub check_interval_ms: u64,
}

impl Default for PolledConfig {
    fn default() -> Self {
        PolledConfig {
            default_poll_interval_s: 5,
            offline_grace_ms: 5_000,
            answer_within_ms: 300_000,
            check_interval_ms: 1_000,
        }
    }
}

/// What a printer says about itself when it polls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// It can print.
    Ready,
    /// It cannot print: `outcome` is `no_paper`, `cover_open` or `paper_jam`.
    Blocked { outcome: Outcome, detail: String },
    /// It reports another error; it gets no job until it reports itself ready again.
    Fault(String),
    /// It says nothing about its state (Epson's GetRequest): it is online, and its last
    /// error stays what its last result said.
    Unknown,
}

/// One poll, as the protocol adapter understood it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PollReport {
    pub health: Health,
    /// The job token the printer says it works on (CloudPRNT's `jobToken`), if it says.
    pub token: Option<String>,
    /// Whether it says it is printing (CloudPRNT's `printingInProgress`), if it says.
    pub printing: Option<bool>,
    /// Whether idle polls right after the fetch are the printer's way of working. An
    /// Epson printer asks for work (GetRequest) only once it has reported the result of
    /// the job it holds (SetResponse), so asking again without one means the result was
    /// lost: `false`, such a poll ends the job at once. A Star printer may poll idle
    /// between downloading a job and printing it, and Star says "a server can assume that
    /// the print is in progress after the GET, until a DELETE, or POST with error code is
    /// received" (CloudPRNT Protocol Guide, "Polling the server (POST)",
    /// `printingInProgress`): `true`, idle polls end its fetched job only once they go on
    /// past the printer's offline threshold after the fetch (2 × its poll interval + the
    /// offline grace), when it is polling but not printing (it lost power, say) and its
    /// lane must move on rather than wait for the answer deadline.
    pub idle_while_starting: bool,
}

impl PollReport {
    /// The printer says it is not working on `token`. A printer that says neither whether
    /// it prints nor which job it has (firmware without these fields) says nothing: its
    /// fetched job waits for its confirmation or its deadline.
    fn idle_for(&self, token: &str) -> bool {
        if self.printing == Some(true) || self.token.as_deref() == Some(token) {
            return false;
        }
        self.printing == Some(false) || self.token.is_some()
    }
}

/// A job's name on the wire: the task and the attempt, `TASKID.ATTEMPT` (at most 30
/// characters of `0-9A-Z.`, so it also fits Epson's `printjobid`). It is only ever
/// honoured for the printer whose task it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobToken {
    pub task_id: String,
    pub attempt: i32,
}

impl JobToken {
    pub fn of(task: &Task) -> JobToken {
        JobToken { task_id: task.task_id.clone(), attempt: task.attempts }
    }

    /// `None` for anything that is not a token this broker made.
    pub fn parse(s: &str) -> Option<JobToken> {
        let (task, attempt) = s.trim().rsplit_once('.')?;
        let task = onceprint_core::TaskId::parse(task)?;
        let attempt: i32 = attempt.parse().ok().filter(|a| *a > 0)?;
        Some(JobToken { task_id: task.as_str().to_owned(), attempt })
    }
}

impl std::fmt::Display for JobToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.task_id, self.attempt)
    }
}

/// A job the printer is told about.
#[derive(Debug, Clone)]
pub struct Job {
    pub token: JobToken,
    pub idempotency_key: String,
    /// The job's data in the transport's encoding, when this poll handed it out (a
    /// printer that fetches separately asks for it by token).
    pub data: Option<Vec<u8>>,
    /// The task as it is in flight (what the job's media types depend on).
    pub task: Task,
}

/// What a fetch found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fetched {
    /// The data, now remembered as fetched, and for an image how the slip ends (the
    /// printer is told apart from the image).
    Data { bytes: Vec<u8>, idempotency_key: String, cut: Option<onceprint_render::FinalCut> },
    /// The token names no job of this printer that is in flight at this attempt.
    NoSuchJob,
    /// The job cannot be rendered in the encoding asked for.
    Unrenderable(String),
}

/// What the broker last wrote about a printer's health, on this node.
#[derive(Debug, Clone)]
struct Written {
    /// When `last_seen_at` was last written, or queued to be written with the next batch
    /// of refreshes ([`Polled::flush_seen`]).
    at: Millis,
    online: bool,
    last_error: Option<String>,
}

type PrinterKey = (String, String);

/// The polled mechanism for one transport kind. Share it behind an `Arc`.
pub struct Polled {
    lanes: Arc<LaneEngine>,
    kind: TransportKind,
    config: PolledConfig,
    claimant: Claimant,
    locks: Mutex<HashMap<PrinterKey, Arc<tokio::sync::Mutex<()>>>>,
    written: Mutex<HashMap<PrinterKey, Written>>,
    /// The `last_seen_at` refreshes of printers that polled with nothing new to say,
    /// written for all of them in one store call by [`Polled::flush_seen`].
    seen: Mutex<HashMap<PrinterKey, Millis>>,
    /// When this node last heard each printer (a poll or a fetch), written or not: the
    /// row's `last_seen_at` may be up to [`Polled::refresh_ms`] older, and the offline
    /// check judges a printer this node heard by this time instead.
    heard: Mutex<HashMap<PrinterKey, Millis>>,
}

fn key(p: &PrinterInfo) -> PrinterKey {
    (p.row.tenant_id.clone(), p.row.id.clone())
}

fn who(p: &PrinterInfo) -> AgentIdentity {
    AgentIdentity { tenant_id: p.row.tenant_id.clone(), store_id: p.row.store_id.clone() }
}

impl Polled {
    pub fn new(lanes: Arc<LaneEngine>, kind: TransportKind, config: PolledConfig) -> Arc<Polled> {
        let claimant = Claimant::printer(kind.as_str());
        Arc::new(Polled {
            lanes,
            kind,
            config,
            claimant,
            locks: Mutex::default(),
            written: Mutex::default(),
            seen: Mutex::default(),
            heard: Mutex::default(),
        })
    }

    pub fn kind(&self) -> TransportKind {
        self.kind
    }

    pub fn lanes(&self) -> &Arc<LaneEngine> {
        &self.lanes
    }

    pub fn config(&self) -> &PolledConfig {
        &self.config
    }

    /// Whether `printer` is served by this transport (a login of a printer that was moved
    /// to another transport logs in to nothing here).
    pub fn serves(&self, printer: &PrinterInfo) -> bool {
        printer.transport.as_ref().map(TransportConfig::kind) == Some(self.kind)
    }

    /// The printer's configured poll interval, in milliseconds.
    fn interval_ms(&self, printer: &PrinterInfo) -> i64 {
        let s = match &printer.transport {
            Some(TransportConfig::Cloudprnt(c)) => c.poll_interval_s,
            Some(TransportConfig::EpsonSdp(e)) => e.poll_interval_s,
            _ => None,
        };
        i64::from(s.unwrap_or(self.config.default_poll_interval_s)) * 1000
    }

    async fn lock(&self, printer: &PrinterInfo) -> tokio::sync::OwnedMutexGuard<()> {
        let m = self.locks.lock().unwrap_or_else(PoisonError::into_inner).entry(key(printer)).or_default().clone();
        m.lock_owned().await
    }

    /// One poll of `printer`: records its health and says which job, if any, it should
    /// print now. With `fetched_on_hand_out` (Epson) a job handed out is fetched at once,
    /// since the answer carries its data.
    pub async fn poll(
        &self,
        printer: &PrinterInfo,
        report: &PollReport,
        fetched_on_hand_out: bool,
    ) -> Result<Option<Job>, DeliveryError> {
        let _turn = self.lock(printer).await;
        self.record_health(printer, &report.health).await?;
        if matches!(report.health, Health::Fault(_)) {
            return Ok(None);
        }
        let rules = ClaimRules {
            max: 1,
            answer_within_ms: self.config.answer_within_ms,
            give_up_after_ms: None,
            fetched_on_hand_out,
        };
        let blocked = match &report.health {
            Health::Blocked { outcome, detail } => Some((*outcome, detail.clone())),
            _ => None,
        };
        let scope = Scope::Printer { printer_id: &printer.row.id, store_id: &printer.row.store_id, kind: self.kind };
        // A job settled in this poll (in doubt after an idle poll) frees the lane, so the
        // next one may go in the same answer; a few rounds at most.
        for _round in 0..3 {
            let claimed = self.lanes.claim(&self.claimant, &printer.row.tenant_id, scope, rules).await?;
            if let Some(d) = claimed.deliveries.into_iter().next() {
                let token = JobToken { task_id: d.task.task_id.clone(), attempt: d.attempt };
                if let Some((outcome, detail)) = blocked {
                    // Nothing can print now: the attempt ends before anything was sent.
                    self.ack(printer, &token, outcome, Proof::NotPrinted, detail).await?;
                    return Ok(None);
                }
                return Ok(Some(Job { token, idempotency_key: d.idempotency_key, data: Some(d.data), task: d.task }));
            }
            let Some(task) = claimed.held.into_iter().next() else { return Ok(None) };
            let token = JobToken::of(&task);
            let text = token.to_string();
            let fetched = task.sent_session.as_deref() == Some(FETCHED);
            let names_it = report.token.as_deref() == Some(text.as_str());
            match (&blocked, fetched) {
                // Offered and not fetched: nothing printed; the printer cannot take it now.
                (Some((outcome, detail)), false) => {
                    self.ack(printer, &token, *outcome, Proof::NotPrinted, detail.clone()).await?;
                    return Ok(None);
                }
                // The printer reports a stop on the job it fetched: printing it did not
                // succeed (Star's "POST with an error code"), and a roll that ended or a
                // cover opened in the middle of it leaves part of it on paper. It goes to
                // a person (docs/RESULT-CODES.md); the lane pauses for the printer.
                (Some((outcome, detail)), true) if names_it => {
                    let detail = format!("{detail}, while printing the job it fetched");
                    self.ack(printer, &token, *outcome, Proof::MayHavePrinted, detail).await?;
                    return Ok(None);
                }
                (None, false) => {
                    let idempotency_key = delivery_key(&task.biz_no, &task.printer_id, &task.target, &task.print_type);
                    return Ok(Some(Job { token, idempotency_key, data: None, task: task.clone() }));
                }
                (_, true) if report.idle_for(&text) && self.idle_settles(printer, &task, report) => {
                    let detail = format!(
                        "the printer fetched attempt {} and then polled again idle (not printing, not naming \
                         its job) without confirming it",
                        token.attempt
                    );
                    self.lanes.settle_in_doubt(&self.claimant, &task, detail).await?;
                }
                // Fetched and still being worked on, or the printer does not say.
                (_, true) => return Ok(None),
            }
        }
        Ok(None)
    }

    /// How often a printer that keeps polling with nothing new to say has its `last_seen_at`
    /// refreshed: once per poll interval and half the offline grace, less the time a
    /// refresh waits for its batch ([`Self::flush_ms`]). The offline check judges it
    /// silent only after 2 × its interval + the grace; the row lags at most this long plus
    /// one interval (the first poll past it) plus the wait for the batch, so half the
    /// grace is left for late polls, while an idle printer costs a row in a batch every
    /// few polls instead of a write of its own on every one.
    fn refresh_ms(&self, printer: &PrinterInfo) -> i64 {
        let interval = self.interval_ms(printer);
        (interval + self.config.offline_grace_ms / 2 - self.flush_ms()).max(interval)
    }

    /// How long a queued refresh waits at most before it is written: one tick of the
    /// loop that writes them ([`Self::spawn`]).
    fn flush_ms(&self) -> i64 {
        i64::try_from(self.check_interval_ms()).unwrap_or(i64::MAX)
    }

    fn check_interval_ms(&self) -> u64 {
        self.config.check_interval_ms.max(50)
    }

    /// The silence after which a printer is offline: 2 × its poll interval + the grace.
    fn offline_after_ms(&self, printer: &PrinterInfo) -> i64 {
        2 * self.interval_ms(printer) + self.config.offline_grace_ms
    }

    /// Whether an idle poll ends the fetched `task` now (see
    /// [`PollReport::idle_while_starting`]). The fetch was the task's last change, so its
    /// `updated_at` says when it happened.
    fn idle_settles(&self, printer: &PrinterInfo, task: &Task, report: &PollReport) -> bool {
        !report.idle_while_starting || self.lanes.now() - task.updated_at >= self.offline_after_ms(printer)
    }

    /// The data of the job `token` names, in `encoding`, for the printer that holds it;
    /// remembered durably as fetched (`what` names the media type in the audit) before it
    /// is returned. Fetching again is allowed and changes nothing more.
    pub async fn fetch(
        &self,
        printer: &PrinterInfo,
        token: &JobToken,
        encoding: &Encoding,
        what: &str,
    ) -> Result<Fetched, DeliveryError> {
        let _turn = self.lock(printer).await;
        self.note_heard(&key(printer), self.lanes.now());
        self.fetch_held(printer, token, encoding, what, &self.claimant).await
    }

    /// Notes that this node heard the printer `k` at `now` (see `heard`); the key is
    /// copied only the first time, as this runs on every poll.
    fn note_heard(&self, k: &PrinterKey, now: Millis) {
        let mut heard = self.heard.lock().unwrap_or_else(PoisonError::into_inner);
        match heard.get_mut(k) {
            Some(at) => *at = (*at).max(now),
            None => {
                heard.insert(k.clone(), now);
            }
        }
    }

    /// The data of a job a push transport sent to a printer that then fetches it over HTTP
    /// (a Star printer in CloudPRNT Version MQTT takes a `url` print-job and GETs it: Star
    /// CloudPRNT Protocol Guide, "Print job requests (GET)", "For CloudPRNT Version MQTT
    /// (Full MQTT / Pass URL)"). The delivery stays the push driver's, under its run's
    /// session: the fetch is written to its audit trail with a compare-and-set before the
    /// data is returned, and a delivery that moved meanwhile is no job any more. The push
    /// transport already counts such a job as may-have-printed from the moment the MQTT
    /// server took it, so the fetch changes no rule, only what a person reads.
    pub async fn fetch_pushed(
        &self,
        printer: &PrinterInfo,
        token: Option<&JobToken>,
        holder: &Claimant,
        encoding: &Encoding,
        what: &str,
    ) -> Result<Fetched, DeliveryError> {
        let _turn = self.lock(printer).await;
        let token = match token {
            Some(t) => t.clone(),
            // Firmware that does not send the token (Star: "present if one was provided by
            // the server") asks for the one job in flight on its lane.
            None => match self.lanes.store().lane(&printer.row.tenant_id, &printer.row.id).await?.in_flight {
                Some(t) => JobToken::of(&t),
                None => return Ok(Fetched::NoSuchJob),
            },
        };
        self.fetch_held(printer, &token, encoding, what, holder).await
    }

    async fn fetch_held(
        &self,
        printer: &PrinterInfo,
        token: &JobToken,
        encoding: &Encoding,
        what: &str,
        holder: &Claimant,
    ) -> Result<Fetched, DeliveryError> {
        let store = self.lanes.store();
        let Some(task) = store.get_task(&printer.row.tenant_id, &token.task_id).await? else {
            return Ok(Fetched::NoSuchJob);
        };
        let ours = task.printer_id == printer.row.id
            && task.state == onceprint_core::TaskState::Sent
            && task.attempts == token.attempt
            && task.sent_to.as_deref() == Some(holder.sent_to().as_str());
        if !ours {
            return Ok(Fetched::NoSuchJob);
        }
        let Some(content) = store.task_content(&task.task_id).await? else { return Ok(Fetched::NoSuchJob) };
        let cut = match encoding {
            Encoding::Png { .. } => match crate::content::final_cut_for(&content.content_type, &content.content) {
                Ok(cut) => Some(cut),
                Err(why) => return Ok(Fetched::Unrenderable(why)),
            },
            _ => None,
        };
        // Rendered before it is marked fetched: a job whose data never left cannot have
        // printed.
        let bytes = match self.lanes.render_as(&task, content, encoding) {
            Ok(b) => b,
            Err(why) => return Ok(Fetched::Unrenderable(why)),
        };
        let marked = if holder.kind == ClaimantKind::Printer {
            self.lanes.mark_fetched(holder, &task, token.attempt, what, self.config.answer_within_ms).await?
        } else {
            let reason = format!("attempt {} fetched by the printer over HTTP as {what}", token.attempt);
            self.lanes.note_in_flight(&task, holder.actor(), reason).await?
        };
        if !marked {
            return Ok(Fetched::NoSuchJob);
        }
        let idempotency_key = delivery_key(&task.biz_no, &task.printer_id, &task.target, &task.print_type);
        Ok(Fetched::Data { bytes, idempotency_key, cut })
    }

    /// Whether `task` can be rendered in `encoding` (a media type a printer may be offered
    /// for it). Reads the task's content; nothing is written.
    pub async fn renders_as(&self, task: &Task, encoding: &Encoding) -> Result<bool, DeliveryError> {
        let Some(content) = self.lanes.store().task_content(&task.task_id).await? else { return Ok(false) };
        Ok(self.lanes.render_as(task, content, encoding).is_ok())
    }

    /// The printer's result for the job `token` names, as the protocol's table classified
    /// it. `None` when the token names no task of this printer (another printer's job is
    /// refused, never credited).
    pub async fn confirm(
        &self,
        printer: &PrinterInfo,
        token: &JobToken,
        outcome: Outcome,
        proof: Proof,
        detail: String,
    ) -> Result<Option<AckResult>, DeliveryError> {
        let _turn = self.lock(printer).await;
        let task = self.lanes.store().get_task(&printer.row.tenant_id, &token.task_id).await?;
        if task.is_none_or(|t| t.printer_id != printer.row.id) {
            return Ok(None);
        }
        let result = self.ack(printer, token, outcome, proof, detail).await?;
        Ok(Some(result))
    }

    async fn ack(
        &self,
        printer: &PrinterInfo,
        token: &JobToken,
        outcome: Outcome,
        proof: Proof,
        detail: String,
    ) -> Result<AckResult, DeliveryError> {
        let ack = AckIn { task_id: token.task_id.clone(), attempt: token.attempt, outcome, detail, proof };
        let results = self.lanes.ack(&who(printer), &self.claimant, vec![ack]).await?;
        // An applied ack wrote what it says about the printer; the next poll writes its
        // own health again rather than trusting what this node wrote before.
        self.written.lock().unwrap_or_else(PoisonError::into_inner).remove(&key(printer));
        Ok(results.into_iter().next().unwrap_or(AckResult::Stale))
    }

    /// Writes the printer's health when it changed, when the printer was offline or may
    /// have been judged so, and otherwise queues a refresh of its `last_seen_at` once per
    /// [`Self::refresh_ms`] (so that the row shows it is alive on every node).
    async fn record_health(&self, printer: &PrinterInfo, health: &Health) -> Result<(), StoreError> {
        let now = self.lanes.now();
        let k = key(printer);
        self.note_heard(&k, now);
        let reported: Option<Option<String>> = match health {
            Health::Ready => Some(None),
            Health::Blocked { outcome, .. } => Some(Some(outcome.as_str().to_owned())),
            Health::Fault(d) => Some(Some(format!("error: {d}"))),
            Health::Unknown => None,
        };
        {
            let mut written = self.written.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(w) = written.get_mut(&k) {
                // Written whole: a change, a clock that went back, or a printer that was
                // silent long enough that the check (of any node) may have marked it
                // offline since this node last wrote it.
                let whole = !w.online
                    || now < w.at
                    || now - w.at >= self.offline_after_ms(printer)
                    || reported.as_ref().is_some_and(|e| *e != w.last_error);
                if !whole {
                    if now - w.at >= self.refresh_ms(printer) {
                        w.at = now;
                        self.seen.lock().unwrap_or_else(PoisonError::into_inner).insert(k, now);
                    }
                    return Ok(());
                }
            }
        }
        let last_error = match reported {
            Some(e) => e,
            // Keep what the row says now (an ack of this or another node may have set it).
            None => self
                .lanes
                .store()
                .get_printer(&printer.row.tenant_id, &printer.row.id)
                .await?
                .and_then(|p| p.last_error)
                .filter(|e| e != "offline"),
        };
        let update = PrinterStatusUpdate {
            tenant_id: printer.row.tenant_id.clone(),
            printer_id: printer.row.id.clone(),
            online: true,
            last_error: last_error.clone(),
            now,
            event_id: crate::alerts::new_event_id(now),
        };
        self.lanes.store().update_printer_status(&[update]).await?;
        self.written
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(k, Written { at: now, online: true, last_error });
        Ok(())
    }

    /// Writes the queued `last_seen_at` refreshes in one store call. It touches only
    /// `last_seen_at`, and only of printers the row holds online, so an `online` or
    /// `last_error` written meanwhile (by an ack, or by the offline check of another node)
    /// stays. A printer the row holds offline is forgotten here, and its next poll writes
    /// its health whole, online again with its alert. When the write fails, every printer
    /// of the batch is forgotten the same way, so none goes without a write for long.
    ///
    /// A crash loses at most the refreshes of one tick: each is at most
    /// [`Self::refresh_ms`] + one interval + one tick behind the printer's last poll,
    /// which the offline threshold (2 × interval + grace) still covers with half the grace
    /// to spare; after a restart a printer's first poll writes its health whole, since the
    /// new process has written nothing yet.
    pub async fn flush_seen(&self) -> Result<(), StoreError> {
        let batch: Vec<PrinterSeen> = std::mem::take(&mut *self.seen.lock().unwrap_or_else(PoisonError::into_inner))
            .into_iter()
            .map(|((tenant_id, printer_id), at)| PrinterSeen { tenant_id, printer_id, at })
            .collect();
        if batch.is_empty() {
            return Ok(());
        }
        let forget = |keys: Vec<PrinterKey>| {
            let mut written = self.written.lock().unwrap_or_else(PoisonError::into_inner);
            for k in keys {
                written.remove(&k);
            }
        };
        match self.lanes.store().touch_printers_seen(&batch).await {
            Ok(untouched) => {
                forget(untouched);
                Ok(())
            }
            Err(e) => {
                forget(batch.into_iter().map(|p| (p.tenant_id, p.printer_id)).collect());
                Err(e)
            }
        }
    }

    /// One look for printers of this transport that went silent: each is marked offline
    /// (a `printer.offline` alert, `last_seen_at` kept at its last poll), and a job it had
    /// fetched without confirming goes to a person. Returns how many went offline.
    ///
    /// Only candidates are read: the database compares every printer's `last_seen_at`
    /// (else `created_at`) with its own threshold and returns those past it
    /// ([`onceprint_store::Store::silent_printers`]), so a check where every printer
    /// polls reads no printer row. The database's `last_seen_at` is the truth for the
    /// check, whichever node a printer polls: the check runs on one node (the lease
    /// holder), and each node writes the refreshes of the printers that poll it within a
    /// tick, soon enough that a polling printer's row never lags past its threshold (see
    /// [`Self::refresh_ms`] and [`Self::flush_seen`]). This node writes its own queued
    /// refreshes first, so what it reads includes every poll it answered. A candidate is
    /// read again under its lock before it is marked, since a poll on any node may have
    /// come in since the query; what is left is a poll answered by another node in the
    /// last tick and not written yet, which the margin of half the grace covers.
    pub async fn check_offline_once(&self) -> Result<usize, DeliveryError> {
        self.flush_seen().await?;
        let now = self.lanes.now();
        let query = SilenceQuery {
            kind: self.kind.as_str().to_owned(),
            now,
            default_interval_ms: i64::from(self.config.default_poll_interval_s) * 1000,
            grace_ms: self.config.offline_grace_ms,
        };
        let printers = self.lanes.store().silent_printers(&query).await?;
        let mut offline = 0;
        for row in printers {
            // A printer that never polled counts as last seen when it was set up: one that
            // was never switched on, or never given the broker's URL, holds its station's
            // tickets no longer than one that fell silent.
            let (seen, ever_seen) = match row.last_seen_at {
                Some(at) => (at, true),
                None => (row.created_at, false),
            };
            let judged = if ever_seen { !row.online } else { row.last_error.as_deref() == Some("offline") };
            if judged {
                continue;
            }
            let last_seen_at = row.last_seen_at;
            let printer = PrinterInfo::new(row);
            let silent_for = now - seen;
            if silent_for <= self.offline_after_ms(&printer) {
                continue;
            }
            // The row's `last_seen_at` lags the printer's last poll by up to the refresh
            // time (a poll soon after a written one is not written). A printer this node
            // heard is judged by when it heard it; one it did not (it polls another node,
            // or this process is new) only once the row is older than the threshold and
            // that lag together, so that a printer is never taken for silent before it
            // was silent past 2 × its interval + the grace.
            let heard_here = self.heard.lock().unwrap_or_else(PoisonError::into_inner).get(&key(&printer)).copied();
            let (silent_for, limit) = match heard_here {
                Some(h) if h >= seen => (now - h, self.offline_after_ms(&printer)),
                _ => (silent_for, self.offline_after_ms(&printer) + self.refresh_ms(&printer)),
            };
            if silent_for <= limit {
                continue;
            }
            let _turn = self.lock(&printer).await;
            // A poll of this node queued since the refreshes were written shows it is alive.
            if self.seen.lock().unwrap_or_else(PoisonError::into_inner).contains_key(&key(&printer)) {
                continue;
            }
            // A poll may have come in since the list was read.
            let fresh = self.lanes.store().get_printer(&printer.row.tenant_id, &printer.row.id).await?;
            if fresh.is_none_or(|p| p.last_seen_at != last_seen_at || (ever_seen && !p.online)) {
                continue;
            }
            offline += 1;
            tracing::warn!(
                tenant = %printer.row.tenant_id, printer = %printer.row.id, silent_ms = silent_for,
                transport = self.kind.as_str(), "printer stopped polling: offline"
            );
            // The job it fetched may have printed: it goes to a person. A job it was only
            // told about never left the broker: that attempt ends as "offline", and the
            // ticket waits with the printer's paused lane (a station's failover and the
            // print type's budget then move it on by time, `LaneEngine::sweep_paused`).
            let lane = self.lanes.store().lane(&printer.row.tenant_id, &printer.row.id).await?;
            if let Some(task) = lane.in_flight {
                let ours = task.sent_to.as_deref() == Some(self.claimant.sent_to().as_str());
                if ours && task.sent_session.as_deref() == Some(FETCHED) {
                    let detail = format!(
                        "the printer fetched attempt {} and then went silent for {} s without confirming it",
                        task.attempts,
                        silent_for / 1000
                    );
                    self.lanes.settle_in_doubt(&self.claimant, &task, detail).await?;
                } else if ours {
                    let detail = format!(
                        "the printer was told about attempt {} and went silent for {} s without fetching it",
                        task.attempts,
                        silent_for / 1000
                    );
                    self.lanes.settle(&self.claimant, &task, Outcome::Offline, Proof::NotPrinted, detail).await?;
                }
            }
            let update = PrinterStatusUpdate {
                tenant_id: printer.row.tenant_id.clone(),
                printer_id: printer.row.id.clone(),
                online: false,
                last_error: Some("offline".into()),
                // The printer was last seen when it last polled, not now.
                now: seen,
                event_id: crate::alerts::new_event_id(now),
            };
            self.lanes.store().update_printer_status(&[update]).await?;
            self.written
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(key(&printer), Written { at: now, online: false, last_error: Some("offline".into()) });
        }
        Ok(offline)
    }

    /// Writes the queued `last_seen_at` refreshes once a tick on every node, and looks for
    /// silent printers while this node holds `lease` (one check per cluster; the printers'
    /// `last_seen_at` is in the database, whichever node they polled), until shutdown,
    /// which writes the refreshes still queued.
    pub fn spawn(self: &Arc<Self>, lease: crate::Lease) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            let signals = this.lanes.signals().clone();
            let mut tick = tokio::time::interval(Duration::from_millis(this.check_interval_ms()));
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        if !lease.is_held() {
                            if let Err(e) = this.flush_seen().await {
                                tracing::warn!(error = %e, transport = this.kind.as_str(), "last-seen refresh failed");
                            }
                            continue;
                        }
                        if let Err(e) = this.check_offline_once().await {
                            tracing::warn!(error = %e, transport = this.kind.as_str(), "offline check failed");
                        }
                    }
                    _ = signals.shutdown() => {
                        if let Err(e) = this.flush_seen().await {
                            tracing::warn!(error = %e, transport = this.kind.as_str(), "last-seen refresh failed");
                        }
                        return;
                    }
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_name_task_and_attempt_and_fit_epson_job_ids() {
        let id = onceprint_core::TaskId::from_parts(1_700_000_000_000, [7; 10]);
        let t = JobToken { task_id: id.as_str().to_owned(), attempt: 12 };
        let text = t.to_string();
        assert!(text.len() <= 30, "{text}");
        assert_eq!(JobToken::parse(&text), Some(t));
        for bad in ["", "x.1", &format!("{}.0", id.as_str()), &format!("{}.-1", id.as_str()), id.as_str()] {
            assert_eq!(JobToken::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_poll_is_idle_only_when_the_printer_says_so() {
        let r = |token: Option<&str>, printing: Option<bool>| PollReport {
            health: Health::Ready,
            token: token.map(str::to_owned),
            printing,
            idle_while_starting: false,
        };
        assert!(r(None, Some(false)).idle_for("T"));
        assert!(r(Some("OLD"), None).idle_for("T"));
        assert!(!r(Some("T"), Some(false)).idle_for("T"), "it names the job");
        assert!(!r(None, Some(true)).idle_for("T"), "it is printing");
        assert!(!r(None, None).idle_for("T"), "firmware that says nothing");
    }
}
