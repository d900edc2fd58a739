//! The shop's LAN path in the simulated world runs the store agent's own LAN glue
//! (`onceprint_agent::simulation::Lan`): the LAN listener's `POST /v1/print-tasks`
//! handler, driven in-process (forward to the broker while it answers, accept into the
//! agent's outbox while it does not, answer retries from the outbox and the remembered
//! forwards), the local lane that hands offline tickets to the agent's real worker and
//! routes their acks, and the upload (`sync_once`) with its refresh of the saved
//! directory. The broker behind it is the real engine (intake, `Offline::sync`, the
//! directory, the listener claim), reached over a simulated network (`Wire`) that may
//! lose a request, lose the answer after the broker acted, or answer past the agent's
//! offline threshold.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use onceprint_agent::broker::{BrokerError, Forwarded};
use onceprint_agent::upstream::Upstream;
use onceprint_core::content::Content;
use onceprint_engine::offline::{JournalRecord, OfflineReport, SyncResult};
use onceprint_engine::{IntakeError, SubmitKind, SubmitRequest};
use serde_json::{json, Value};
use tokio::sync::{oneshot, Notify};

use super::{engine_err, Fail, World, STORE, TENANT};
use crate::schedule::{AgentPrint, LanFault};

/// The LAN POS's targets: the agent's printers, its station, and (drawn by the moved
/// orders' steps only) the station `st-x` across transports, whose first printer `c1`
/// polls the broker and whose second `a1` the agent drives.
pub(super) const LAN_TARGETS: [(&str, bool); 4] = [("a1", false), ("a2", false), ("st-a", true), ("st-x", true)];
/// The agent that holds the LAN listener (the first).
pub(super) const LISTENER: usize = 0;
/// The store's LAN key the shop's POS sends, its id, and the SHA-256 of the key (what
/// the broker lists to the agent).
const LAN_KEY: &str = "opl_simulated_shop_key";
const LAN_KEY_ID: &str = "lan-pos";
const LAN_KEY_SHA256: &str = "07588ec9a1d742c72414faf967efa486fd72fc6e6be4e1e929693955fc9ee994";
/// The agent's `--offline-after-ms` (its default).
pub(super) const OFFLINE_AFTER: Duration = Duration::from_millis(2_000);

/// One LAN submission and every id a POS was answered for its key.
pub(super) struct LanSub {
    pub target: String,
    pub station: bool,
    pub name: String,
    pub biz_no: String,
    pub print_type: String,
    pub text: String,
    /// Answers for this key, through the LAN or the cloud: LAN task ids or broker ids.
    pub answers: Vec<String>,
    /// The LAN listener answered it (200 or 201) before.
    pub lan_answered: bool,
}

impl LanSub {
    fn key(&self) -> (String, String, String) {
        (self.target.clone(), self.biz_no.clone(), self.print_type.clone())
    }

    /// The same order through the cloud API.
    fn request(&self) -> SubmitRequest {
        SubmitRequest {
            tenant_id: TENANT.into(),
            biz_no: Some(self.biz_no.clone()),
            printer_id: (!self.station).then(|| self.name.clone()),
            station_id: self.station.then(|| self.name.clone()),
            print_type: Some(self.print_type.clone()),
            content: Some(Content::Text { text: self.text.clone() }),
            store_scope: None,
            lan_printer: None,
            actor: None,
        }
    }

    /// The body the shop's POS posts to the LAN listener (docs/API.md).
    fn body(&self) -> Vec<u8> {
        let target = if self.station { "station_id" } else { "printer_id" };
        let body = json!({
            "biz_no": self.biz_no,
            target: self.name,
            "print_type": self.print_type,
            "content": {"type": "text", "text": self.text},
        });
        body.to_string().into_bytes()
    }
}

/// What the LAN side knows.
#[derive(Default)]
pub(super) struct LanFacts {
    pub subs: Vec<LanSub>,
    /// The LAN tasks of each key (target, biz_no, print_type): ids the agent answered a
    /// POS with for a ticket it accepted itself.
    pub lan_ids: HashMap<(String, String, String), Vec<String>>,
    /// The LAN listener was claimed (the store has LAN orders).
    pub claimed: bool,
    /// What the network does to the agent's next forward of a LAN submission.
    pub forward_fault: Option<LanFault>,
    /// The next upload's answer is lost (the broker acted on it).
    pub upload_answer_lost: bool,
    /// The next upload is answered 503 (the broker took none of it).
    pub upload_refused: bool,
    /// Orders (biz_no, print_type) whose copy the agent printed on its own lane while a
    /// broker task of the order on another printer (carried on by a person or a failover,
    /// or placed on another printer of a station a person changed) was handed out to its
    /// printer (or printed), both before the agent's upload reached the broker:
    /// two copies the broker could not have prevented, as it could not know of the
    /// agent's (the documented limit of one order through both paths, docs/OPERATIONS.md).
    /// Each such order is allowed one copy more. A carried-on copy handed out after the
    /// upload is still a second copy.
    pub raced: std::collections::HashSet<(String, String)>,
    /// Orders (biz_no, print_type) that also came through the cloud API: the broker placed
    /// that copy as a cloud order, on a station's first printer, which need not be the
    /// printer the agent chose for its own.
    pub through_cloud: std::collections::HashSet<(String, String)>,
    /// A person changed the LAN station during the run: a forward may then have been placed
    /// by the station as the broker had it, not as the agent's saved directory had it.
    pub station_edited: bool,
    /// Orders (biz_no, print_type) an upload of the agent reached the broker with.
    pub uploaded: std::collections::HashSet<(String, String)>,
    /// The printer the agent's own copy of each order (biz_no, print_type) is for.
    pub lan_printer: HashMap<(String, String), String>,
}

/// A request of the agent's LAN glue to the broker, on its way.
pub(super) enum Call {
    Forward { body: Vec<u8>, lan_printer: Option<String> },
    Get { path: String },
    Post { path: String, body: Value },
}

/// What comes back to the agent.
pub(super) enum Reply {
    Forwarded(Forwarded),
    Value(Value),
    Failed(BrokerError),
    /// No answer within the request's timeout (the agent waits it out on its clock).
    TimedOut,
}

/// The simulated network between the agent's LAN glue and the broker: the agent's code
/// posts each request here and waits; the world answers it between two polls of the
/// agent's future (`World::drive`), on the broker's runtime.
/// A request on its way, with where its answer goes.
type Pending = (Call, oneshot::Sender<Reply>);

#[derive(Clone, Default)]
pub(super) struct Wire {
    calls: Arc<Mutex<VecDeque<Pending>>>,
    posted: Arc<Notify>,
}

impl Wire {
    fn take(&self) -> Option<Pending> {
        self.calls.lock().unwrap_or_else(PoisonError::into_inner).pop_front()
    }

    async fn call(&self, call: Call, timeout: Duration) -> Result<Reply, BrokerError> {
        let (tx, rx) = oneshot::channel();
        self.calls.lock().unwrap_or_else(PoisonError::into_inner).push_back((call, tx));
        self.posted.notify_one();
        match rx.await {
            Ok(Reply::TimedOut) => {
                tokio::time::sleep(timeout).await;
                Err(BrokerError::Transport("operation timed out".into()))
            }
            Ok(r) => Ok(r),
            Err(_) => Err(BrokerError::Transport("the simulated network went away".into())),
        }
    }
}

/// The broker as the agent's LAN glue reaches it in the simulation.
pub(super) struct SimUpstream(pub Wire);

#[async_trait::async_trait]
impl Upstream for SimUpstream {
    async fn forward_submission(
        &self,
        body: Vec<u8>,
        lan_printer: Option<&str>,
        timeout: Duration,
    ) -> Result<Forwarded, BrokerError> {
        match self.0.call(Call::Forward { body, lan_printer: lan_printer.map(str::to_owned) }, timeout).await? {
            Reply::Forwarded(f) => Ok(f),
            Reply::Failed(e) => Err(e),
            _ => Err(BrokerError::Decode("not a forward's answer".into())),
        }
    }

    async fn get_value(&self, path: &str) -> Result<Value, BrokerError> {
        match self.0.call(Call::Get { path: path.to_owned() }, Duration::from_secs(10)).await? {
            Reply::Value(v) => Ok(v),
            Reply::Failed(e) => Err(e),
            _ => Err(BrokerError::Decode("not a JSON answer".into())),
        }
    }

    async fn post_value(&self, path: &str, body: Value, timeout: Duration) -> Result<Value, BrokerError> {
        match self.0.call(Call::Post { path: path.to_owned(), body }, timeout).await? {
            Reply::Value(v) => Ok(v),
            Reply::Failed(e) => Err(e),
            _ => Err(BrokerError::Decode("not a JSON answer".into())),
        }
    }

    fn speaks(&self, version: u32) -> bool {
        version <= 4
    }

    fn reachability(&self) -> onceprint_agent::broker::Reachability {
        onceprint_agent::broker::Reachability { reachable: None, last_answer_ago: None, last_error: None }
    }
}

impl World {
    /// The agent's wall clock (the shop PC's).
    fn agent_now(&self) -> i64 {
        self.clock_now() + self.agents[LISTENER].clock_offset
    }

    /// A new process's LAN glue for the LAN listener's agent, on its state directory.
    pub(super) fn lan_glue(&self) -> Arc<onceprint_agent::simulation::Lan> {
        let upstream: Arc<dyn Upstream> = Arc::new(SimUpstream(self.wire.clone()));
        Arc::new(onceprint_agent::simulation::Lan::new(
            upstream,
            &self.agent_dir,
            super::AGENT_IDS[LISTENER],
            self.outbox.clone(),
            OFFLINE_AFTER,
        ))
    }

    /// Runs a future of the agent's LAN glue on the agents' runtime (its clock paused),
    /// answering each request it makes of the broker in turn, until it ends.
    pub(super) fn drive<T>(&mut self, fut: impl std::future::Future<Output = T>) -> Result<T, Fail> {
        onceprint_agent::simulation::set_clocks(Some((self.agent_now(), self.facts.elapsed)));
        let wire = self.wire.clone();
        let mut fut = std::pin::pin!(fut);
        loop {
            let step = self.agent_rt.block_on(async {
                // An hour of the agent's paused clock passes at once if nothing can move.
                tokio::time::timeout(Duration::from_secs(3_600), async {
                    tokio::select! {
                        biased;
                        out = &mut fut => Some(out),
                        () = wire.posted.notified() => None,
                    }
                })
                .await
            });
            match step {
                Err(_) => return Err("the agent's LAN code waited an hour for nothing (a hang)".into()),
                Ok(Some(out)) => return Ok(out),
                Ok(None) => {
                    while let Some((call, reply)) = wire.take() {
                        let answer = self.answer_agent(call)?;
                        let _ = reply.send(answer);
                    }
                }
            }
        }
    }

    /// The broker's answer to a request of the agent's LAN glue, through the network.
    fn answer_agent(&mut self, call: Call) -> Result<Reply, Fail> {
        if !self.line_up {
            return Ok(Reply::Failed(BrokerError::Unreachable("the shop's line is down".into())));
        }
        match call {
            Call::Forward { body, lan_printer } => self.forward(&body, lan_printer),
            Call::Get { path } if path == "/v1/agent/directory" => {
                let d = self.block_on(self.broker.offline.directory(&Self::who()))?;
                let d = d.map_err(|e| engine_err("directory", e))?;
                Ok(Reply::Value(json!({
                    "store_id": d.store_id,
                    "printers": d.printers.iter().map(|p| json!({
                        "printer_id": p.printer_id,
                        "printer_address": p.printer_address,
                        "enabled": p.enabled,
                        "agent": p.agent,
                        "profile": p.profile,
                    })).collect::<Vec<_>>(),
                    "stations": d.stations.iter().map(|s| json!({
                        "station_id": s.station_id,
                        "printers": s.printers,
                    })).collect::<Vec<_>>(),
                    "print_types": d.print_types,
                    "default_print_type": d.default_print_type,
                    "max_content_bytes": d.max_content_bytes,
                })))
            }
            Call::Get { path } if path == "/v1/agent/lan-keys" => {
                Ok(Reply::Value(json!({"keys": [{"id": LAN_KEY_ID, "sha256": LAN_KEY_SHA256}]})))
            }
            Call::Post { path, body } if path == "/v1/agent/lan-listener" => {
                let agent_id = body["agent_id"].as_str().unwrap_or_default().to_owned();
                let claim = self.block_on(self.broker.offline.claim_lan_listener(&Self::who(), &agent_id))?;
                match claim.map_err(|e| engine_err("claim_lan_listener", e))? {
                    onceprint_engine::offline::LanClaim::Held => {
                        Ok(Reply::Value(json!({"store_id": STORE, "agent_id": agent_id})))
                    }
                    onceprint_engine::offline::LanClaim::TakenBy(holder) => {
                        let message = format!("store agent {holder:?} takes the LAN orders of store {STORE:?}");
                        let body = json!({"error": {"code": "lan_listener_taken", "message": message}});
                        Ok(Reply::Failed(BrokerError::Status { status: 409, body: body.to_string() }))
                    }
                }
            }
            Call::Post { path, body } if path == "/v1/agent/offline-tasks" => self.upload(&body),
            Call::Get { path } | Call::Post { path, .. } => Err(format!("the agent asked the broker for {path}")),
        }
    }

    /// `POST /v1/agent/print-tasks`: the forwarded LAN submission through intake, with
    /// the agent's store scope and the printer it named, as the broker's route takes it.
    fn forward(&mut self, body: &[u8], lan_printer: Option<String>) -> Result<Reply, Fail> {
        let fault = self.lan.forward_fault.take();
        if fault == Some(LanFault::RequestLost) {
            return Ok(Reply::TimedOut);
        }
        let v: Value = serde_json::from_slice(body).map_err(|e| format!("a forwarded LAN body: {e}"))?;
        let text = |f: &str| v[f].as_str().map(str::to_owned);
        let content: Option<Content> =
            serde_json::from_value(v["content"].clone()).map_err(|e| format!("a forwarded LAN body: {e}"))?;
        let req = SubmitRequest {
            tenant_id: TENANT.into(),
            biz_no: text("biz_no"),
            printer_id: text("printer_id"),
            station_id: text("station_id"),
            print_type: text("print_type"),
            content,
            store_scope: Some(STORE.to_owned()),
            lan_printer,
            actor: Some(format!("agent:{}", super::AGENT_IDS[LISTENER])),
        };
        let (status, body) = match self.block_on(self.broker.intake.submit(req))? {
            Ok(a) => {
                let created = a.kind == SubmitKind::Created;
                let body = json!({
                    "task_id": a.task_id,
                    "state": a.state.as_str(),
                    "duplicate": !created,
                    "message": "",
                    "biz_no": text("biz_no"),
                    "print_type": text("print_type"),
                    "pruned": a.pruned,
                });
                (if created { 201 } else { 200 }, body)
            }
            Err(IntakeError::Mismatch { task_id }) => {
                (422, json!({"error": {"code": "idempotency_mismatch", "message": format!("task {task_id}")}}))
            }
            Err(e) => return Err(format!("a LAN submission forwarded to the broker was refused: {e}")),
        };
        let location = body["task_id"].as_str().map(|id| format!("/v1/print-tasks/{id}"));
        let forwarded = Forwarded { status, location, body: body.to_string().into_bytes() };
        Ok(match fault {
            // The broker took it; the answer never reaches the agent.
            Some(LanFault::AnswerLost) => {
                Reply::Failed(BrokerError::Transport("connection reset before the answer".into()))
            }
            // The broker took it; its answer comes after the agent stopped waiting.
            Some(LanFault::Slow) => Reply::TimedOut,
            Some(LanFault::RequestLost | LanFault::UploadRefused) | None => Reply::Forwarded(forwarded),
        })
    }

    /// `POST /v1/agent/offline-tasks`: the upload through the broker's real
    /// `Offline::sync`, its tasks read as the broker's route reads them.
    fn upload(&mut self, body: &Value) -> Result<Reply, Fail> {
        let answer_lost = std::mem::take(&mut self.lan.upload_answer_lost);
        if std::mem::take(&mut self.lan.upload_refused) {
            let body = json!({"error": {"code": "unavailable", "message": "the broker cannot serve now"}});
            return Ok(Reply::Failed(BrokerError::Status { status: 503, body: body.to_string() }));
        }
        let agent_id = body["agent_id"].as_str().unwrap_or_default().to_owned();
        let sent_at = body["sent_at"].as_i64();
        let tasks = body["tasks"].as_array().cloned().unwrap_or_default();
        let reports: Vec<OfflineReport> = tasks.iter().map(report).collect::<Result<_, Fail>>()?;
        let keys: Vec<(String, String, String)> = reports.iter().map(report_key).collect();
        let outcomes: Vec<String> = reports.iter().map(|r| r.outcome.clone()).collect();
        self.note_raced_at_upload(&keys, &outcomes)?;
        let answers = self.block_on(self.broker.offline.sync(&Self::who(), &agent_id, reports, sent_at))?;
        let answers = answers.map_err(|e| engine_err("sync", e))?;
        self.lan.uploaded.extend(keys.iter().map(|k| (k.1.clone(), k.2.clone())));
        for (outcome, a) in outcomes.iter().zip(&answers) {
            // A merge settles the broker's task by what the agent reports: a doubt there
            // comes from the LAN side's own.
            if let Some(id) = &a.broker_task_id {
                if outcome == "in_doubt" || a.result == SyncResult::Conflict {
                    self.facts.exposed.insert(id.clone());
                }
            }
        }
        if answer_lost {
            // The broker took them; the agent does not know what became of them.
            self.facts.exposed_keys.extend(keys);
            return Ok(Reply::Failed(BrokerError::Transport("connection reset before the answer".into())));
        }
        let results: Vec<Value> = answers
            .iter()
            .map(|a| {
                json!({
                    "task_id": a.task_id,
                    "result": a.result.as_str(),
                    "broker_task_id": a.broker_task_id,
                    "state": a.state.map(|s| s.as_str()),
                    "detail": a.detail,
                })
            })
            .collect();
        Ok(Reply::Value(json!({ "results": results })))
    }

    /// Whether the broker could have placed an order's first task on another printer than
    /// the agent's copy without a fault of its own: the order also came through the cloud
    /// (a station's first printer), or a person changed the LAN station meanwhile. A
    /// forward alone names the agent's printer, and the broker keeps to it.
    fn placed_apart(&self, key: &(String, String)) -> bool {
        self.lan.station_edited || self.lan.through_cloud.contains(key)
    }

    /// Notes the orders whose LAN copy came out while the agent had not uploaded it and a
    /// task carrying the broker's copy on has printed too (`LanFacts::raced`).
    pub(super) fn note_raced(&mut self, tasks: &[onceprint_store::Task]) {
        let mut found = Vec::new();
        for ((_, biz, ptype), ids) in &self.lan.lan_ids {
            let key = (biz.clone(), ptype.clone());
            if self.lan.raced.contains(&key) || !ids.iter().any(|id| self.facts.paper.contains_key(id)) {
                continue;
            }
            let lan_printer = self.lan.lan_printer.get(&key);
            let placed_apart = self.placed_apart(&key);
            let carried_on_printed = tasks.iter().any(|t| {
                t.biz_no == *biz
                    && t.print_type == *ptype
                    && elsewhere(t, lan_printer, placed_apart)
                    && self.facts.paper.get(&t.task_id).is_some_and(|n| *n > 0)
            });
            if carried_on_printed && !self.lan.uploaded.contains(&key) {
                found.push(key);
            }
        }
        self.lan.raced.extend(found);
    }

    /// At an upload that first brings the broker a LAN copy the agent printed: an order
    /// whose task carried on elsewhere was already handed out there (the broker cannot
    /// take back a job a printer holds) is `LanFacts::raced`.
    fn note_raced_at_upload(&mut self, keys: &[(String, String, String)], outcomes: &[String]) -> Result<(), Fail> {
        let fresh: Vec<(String, String)> = keys
            .iter()
            .zip(outcomes)
            .filter(|(_, o)| *o == "printed" || *o == "in_doubt")
            .map(|((_, b, p), _)| (b.clone(), p.clone()))
            .filter(|k| !self.lan.uploaded.contains(k) && !self.lan.raced.contains(k))
            .collect();
        if fresh.is_empty() {
            return Ok(());
        }
        let tasks = self.tasks()?;
        for (biz, ptype) in fresh {
            let lan_printer = self.lan.lan_printer.get(&(biz.clone(), ptype.clone()));
            let placed_apart = self.placed_apart(&(biz.clone(), ptype.clone()));
            let handed_out = tasks.iter().any(|t| {
                t.biz_no == biz && t.print_type == ptype && elsewhere(t, lan_printer, placed_apart) && t.attempts > 0
            });
            if handed_out {
                self.lan.raced.insert((biz, ptype));
            }
        }
        Ok(())
    }

    /// The first LAN order: the agent has reached the broker once (its directory, the
    /// store's LAN keys, the listener claimed), as it does at start while the line is up.
    fn first_refresh(&mut self) -> Result<(), Fail> {
        let up = std::mem::replace(&mut self.line_up, true);
        let lan = self.lan_process.clone();
        let refreshed = self.drive(async move { lan.refresh().await });
        self.line_up = up;
        refreshed?.map_err(|e| engine_err("the agent's first refresh", e))?;
        self.lan.claimed = true;
        Ok(())
    }

    pub(super) fn lan_submit(&mut self, target: usize, kind: usize) -> Result<(), Fail> {
        let (name, station) = LAN_TARGETS[target.min(LAN_TARGETS.len() - 1)];
        let n = self.lan.subs.len();
        let sub = LanSub {
            target: format!("{}:{name}", if station { "station" } else { "printer" }),
            station,
            name: name.to_owned(),
            biz_no: format!("L{n}"),
            print_type: super::TYPES[kind % super::TYPES.len()].0.to_owned(),
            text: format!("LAN ticket L{n}\n"),
            answers: Vec::new(),
            lan_answered: false,
        };
        self.lan.subs.push(sub);
        self.lan_send(n)
    }

    pub(super) fn lan_retry(&mut self, pick: usize) -> Result<(), Fail> {
        if self.lan.subs.is_empty() {
            return Ok(());
        }
        self.lan_send(pick % self.lan.subs.len())
    }

    /// The shop's POS sends submission `i` to the agent's LAN listener, whose own handler
    /// answers it; a 200 or 201 is the id the POS keeps for the order.
    pub(super) fn lan_send(&mut self, i: usize) -> Result<(), Fail> {
        if !self.lan.claimed {
            self.first_refresh()?;
        }
        let body = self.lan.subs[i].body();
        let lan = self.lan_process.clone();
        let (status, offline, answer) = self.drive(async move { lan.submit(LAN_KEY, body).await })?;
        let sub = &self.lan.subs[i];
        let Some(id) = answer["task_id"].as_str().filter(|_| status == 200 || status == 201) else {
            return Err(format!("the LAN listener answered order {} with {status}: {answer}", sub.biz_no));
        };
        // A retry of an order the LAN listener answered is a duplicate (200), whichever way
        // that answer came (the broker's remembered, or the agent's own), never a new task.
        if status == 201 && sub.lan_answered {
            return Err(format!("a retry of LAN order {} was answered 201, a new task {id}", sub.biz_no));
        }
        let id = id.to_owned();
        if offline {
            // A ticket the agent holds itself (rather than the broker's answer it kept).
            let (target, biz, ptype) = sub.key();
            let outbox = self.outbox.clone();
            let own = self.block_on(outbox.find(&target, &biz, &ptype))?.map_err(|e| engine_err("outbox", e))?;
            if let Some(t) = own.filter(|t| t.task_id == id) {
                self.lan.lan_printer.insert((biz.clone(), ptype.clone()), t.printer_id);
                let ids = self.lan.lan_ids.entry((target, biz, ptype)).or_default();
                if !ids.contains(&id) {
                    ids.push(id.clone());
                }
            }
        }
        self.lan.subs[i].answers.push(id);
        self.lan.subs[i].lan_answered = true;
        Ok(())
    }

    /// The same order through the cloud API: one task for the key, whichever way it came.
    pub(super) fn lan_to_cloud(&mut self, pick: usize) -> Result<(), Fail> {
        if self.lan.subs.is_empty() {
            return Ok(());
        }
        let i = pick % self.lan.subs.len();
        let req = self.lan.subs[i].request();
        let answer = self.block_on(self.broker.intake.submit(req))?;
        let answer = answer.map_err(|e| format!("the cloud copy of a LAN order was refused: {e}"))?;
        if !matches!(answer.kind, SubmitKind::Created | SubmitKind::Duplicate) {
            return Err(format!("the cloud copy of a LAN order was answered {:?}", answer.kind));
        }
        let key = (self.lan.subs[i].biz_no.clone(), self.lan.subs[i].print_type.clone());
        self.lan.through_cloud.insert(key);
        self.lan.subs[i].answers.push(answer.task_id);
        Ok(())
    }

    /// The agent's local lane hands its next due offline ticket to the printer's worker
    /// (the agent's own), the printer meeting `print`; the ack goes where the agent
    /// routes it. Whether a ticket was due.
    pub(super) fn local_print(&mut self, print: AgentPrint) -> Result<bool, Fail> {
        // Before the first LAN order the agent has no LAN listener (so nothing offline).
        if !self.lan.claimed {
            return Ok(false);
        }
        let lan = self.lan_process.clone();
        let now = self.agent_now();
        let next = self.drive(async move { lan.next_local(now).await })?;
        let Some(d) = next.map_err(|e| engine_err("outbox", e))? else { return Ok(false) };
        let outbox = self.outbox.clone();
        let t = self.block_on(outbox.get(&d.task_id))?.map_err(|e| engine_err("outbox", e))?;
        let key = t.map(|t| (t.target, t.biz_no, t.print_type));
        let done =
            super::store_agent::run(&self.agent_rt, &mut self.agents[LISTENER].process, &self.printers, &d, print)?;
        for copy in &done.paper {
            self.paper(&d.task_id, copy);
        }
        let doubt = match &done.ack {
            None => true,
            Some(a) => a.outcome == onceprint_core::Outcome::InDoubt,
        };
        if doubt || (done.sent && matches!(print, AgentPrint::LostAfterPaper | AgentPrint::Crash { .. })) {
            if let Some(k) = key {
                self.facts.exposed_keys.insert(k);
            }
        }
        match done.ack {
            Some(ack) => {
                let lan = self.lan_process.clone();
                if !self.drive(async move { lan.route_ack(ack).await })? {
                    return Err(format!("the ack of the local lane's {} went to the broker", d.task_id));
                }
            }
            // The process dies with the task `printing`; the outbox and journal stay.
            None => self.restart_agent(LISTENER)?,
        }
        Ok(true)
    }

    /// The agent's upload of what it accepted offline: its own `sync_once` (nothing while
    /// the line is down, as its refresh then fails).
    pub(super) fn sync(&mut self, answer_lost: bool) -> Result<(), Fail> {
        // Before the first LAN order the agent has no LAN listener, and its refresh claims
        // none.
        if !self.lan.claimed {
            return Ok(());
        }
        self.lan.upload_answer_lost = answer_lost;
        let lan = self.lan_process.clone();
        let synced = self.drive(async move { lan.sync().await });
        self.lan.upload_answer_lost = false;
        synced
    }

    /// A person edits the station `st-a` through the set-up (its printers), as
    /// `Setup::update_station` does: a compare-and-set on the list read, then the node's
    /// directory forgets the station (the others hear of it over the node link).
    pub(super) fn station_edit(&mut self, printers: usize) -> Result<(), Fail> {
        let list: &[&str] = match printers % 3 {
            0 => &["a1", "a2"],
            1 => &["a2"],
            _ => &["a2", "a1"],
        };
        let current =
            self.block_on(self.store.get_station(TENANT, "st-a"))?.map_err(|e| engine_err("get_station", e))?;
        let Some(current) = current else { return Err("station st-a is gone".into()) };
        let update = onceprint_store::StationUpdate {
            tenant_id: TENANT.into(),
            id: "st-a".into(),
            expected_printers: current.printers,
            printers: list.iter().map(|p| (*p).to_owned()).collect(),
            failover_after_ms: current.failover_after_ms,
            now: self.clock_now(),
            audit: onceprint_store::SetupAudit::default(),
        };
        self.block_on(self.store.update_station(update))?.map_err(|e| engine_err("update_station", e))?;
        self.broker.lanes.directory().forget_station(TENANT, "st-a");
        self.lan.station_edited = true;
        Ok(())
    }

    /// What the network does to the agent's next forward of a LAN submission.
    pub(super) fn lan_fault(&mut self, fault: LanFault) {
        match fault {
            LanFault::UploadRefused => self.lan.upload_refused = true,
            f => self.lan.forward_fault = Some(f),
        }
    }

    /// A ticket the agent accepted offline either prints on its own lane or is known to
    /// the broker: one the agent handed to an upload (and so no longer prints itself) whose
    /// key the broker has no task of was in an upload the broker never took, and would
    /// wait, unprinted, for the next upload that works.
    pub(super) fn lan_handed_check(
        &self,
        keys_seen: &std::collections::HashSet<(String, String, String)>,
    ) -> Result<(), Fail> {
        for (target, biz, ptype) in self.lan.lan_ids.keys() {
            if keys_seen.contains(&(target.clone(), biz.clone(), ptype.clone())) {
                continue;
            }
            let t = self.block_on(self.outbox.find(target, biz, ptype))?.map_err(|e| engine_err("outbox", e))?;
            if let Some(t) = t.filter(|t| t.state == onceprint_agent::outbox::LocalState::Handed && !t.synced) {
                return Err(format!(
                    "LAN ticket {} of {biz} is handed to the broker, which has no task of it: it prints nowhere",
                    t.task_id
                ));
            }
        }
        Ok(())
    }

    /// At the end: every id a POS was answered for a key stands for one broker task (or is
    /// kept by the agent, rejected, for a person), and it is the same task for every
    /// answer of the key.
    pub(super) fn lan_final_check(&mut self) -> Result<(), Fail> {
        let outbox = self.outbox.clone();
        // The alerts of offline tickets the broker could not take, by LAN task id.
        let due =
            self.block_on(self.store.due_webhooks(i64::MAX, 100_000))?.map_err(|e| engine_err("due_webhooks", e))?;
        let alerted: std::collections::HashSet<String> = due
            .iter()
            .filter_map(|d| serde_json::from_str::<Value>(&d.payload).ok())
            .filter(|v| v["type"] == "offline_task.rejected")
            .filter_map(|v| v["data"]["lan_task_id"].as_str().map(str::to_owned))
            .collect();
        for s in &self.lan.subs {
            let mut live: Option<String> = None;
            for id in &s.answers {
                let broker_id = match self.task(id)? {
                    Some(_) => id.clone(),
                    None => {
                        let h = self.block_on(outbox.handover(id))?.map_err(|e| engine_err("outbox", e))?;
                        match h {
                            Some(h) if h.result.as_deref() == Some("rejected") => {
                                // Kept by the agent, and a person is told.
                                if !alerted.contains(id) {
                                    return Err(format!(
                                        "LAN task {id} of {} was rejected by the broker and nobody was told",
                                        s.biz_no
                                    ));
                                }
                                continue;
                            }
                            Some(h) => h.broker_task_id.ok_or_else(|| {
                                format!("LAN task {id} of {} was never taken by the broker ({:?})", s.biz_no, h.result)
                            })?,
                            None => return Err(format!("the POS got {id} for {}, and nobody has it", s.biz_no)),
                        }
                    }
                };
                let chain = self.chain(&broker_id)?;
                let end = chain.last().cloned().unwrap_or(broker_id);
                match &live {
                    None => live = Some(end),
                    Some(l) if *l == end => {}
                    Some(l) => {
                        return Err(format!("order {} is two tasks: {l} and {end} (answers {:?})", s.biz_no, s.answers))
                    }
                }
            }
        }
        Ok(())
    }
}

/// Whether broker task `t` of an order prints on another printer than the agent's own copy
/// (on `lan_printer`), where the agent's journal cannot match them: carried on by a
/// person or a failover, or (`placed_apart`) placed on another printer as a cloud order
/// or by a station a person changed. A reprint is a copy of its own.
fn elsewhere(t: &onceprint_store::Task, lan_printer: Option<&String>, placed_apart: bool) -> bool {
    t.origin_kind != Some(onceprint_store::OriginKind::Reprint)
        && (t.origin_kind.is_some() || (placed_apart && lan_printer.is_some_and(|p| *p != t.printer_id)))
}

/// One task of an upload as the broker's route reads it (`routes/offline.rs`, `report`).
fn report(v: &Value) -> Result<OfflineReport, Fail> {
    let text = |f: &str| v[f].as_str().map(str::to_owned);
    let content: Option<Content> = match v.get("content") {
        None | Some(Value::Null) => None,
        Some(c) => Some(serde_json::from_value(c.clone()).map_err(|e| format!("an uploaded task's content: {e}"))?),
    };
    let history = v["history"]
        .as_array()
        .map(|h| {
            h.iter()
                .map(|r| JournalRecord {
                    at: r["at"].as_i64().unwrap_or(0),
                    attempt: r["attempt"].as_i64().unwrap_or(0) as i32,
                    state: r["state"].as_str().unwrap_or_default().to_owned(),
                    detail: r["detail"].as_str().unwrap_or_default().to_owned(),
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(OfflineReport {
        task_id: text("task_id").ok_or("an uploaded task without its id")?,
        biz_no: text("biz_no"),
        printer_id: text("printer_id"),
        station_id: text("station_id"),
        print_type: text("print_type"),
        content,
        accepted_at: v["accepted_at"].as_i64().unwrap_or(0),
        lan_key_id: text("lan_key_id").unwrap_or_default(),
        printed_on: text("printed_on"),
        outcome: text("outcome").unwrap_or_default(),
        attempts: v["attempts"].as_i64().unwrap_or(0) as i32,
        detail: text("detail").unwrap_or_default(),
        history,
        unreadable: None,
        age_ms: v["age_ms"].as_i64(),
    })
}

/// The key (target, biz_no, print_type) of an uploaded task.
fn report_key(r: &OfflineReport) -> (String, String, String) {
    let target = match (&r.printer_id, &r.station_id) {
        (Some(p), _) => format!("printer:{p}"),
        (None, Some(s)) => format!("station:{s}"),
        (None, None) => String::new(),
    };
    (target, r.biz_no.clone().unwrap_or_default(), r.print_type.clone().unwrap_or_default())
}
