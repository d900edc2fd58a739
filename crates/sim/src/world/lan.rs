//! The shop's LAN path in the simulated world: the store agent that holds the LAN
//! listener takes the shop POS's tickets, forwards them to the broker while the line is
//! up and accepts them into its outbox (the agent's real `Outbox`, on a file) while it is
//! down, prints what it accepted, and uploads it through the broker's real
//! `Offline::sync` once the line is back, as README "When the internet is down" and
//! "Offline sync" describe the agent.

use std::collections::HashMap;

use onceprint_agent::journal::RecordState;
use onceprint_agent::outbox::{Forwarded, HistoryEntry, Inserted, LocalState, OfflineTask};
use onceprint_core::content::{Content, ContentLimits};
use onceprint_core::ids::TaskId;
use onceprint_core::offline::{station_printer, StationMember};
use onceprint_core::{delivery_key, Outcome};
use onceprint_engine::offline::{JournalRecord, OfflineReport, SyncResult};
use onceprint_engine::{SubmitKind, SubmitRequest};

use super::{engine_err, Fail, World, STORE, TENANT};
use crate::schedule::AgentPrint;

/// The LAN POS's targets: the agent's printers and its station.
const LAN_TARGETS: [(&str, bool); 3] = [("a1", false), ("a2", false), ("st-a", true)];
/// The agent that holds the LAN listener (the first).
pub(super) const LISTENER: usize = 0;
const LAN_KEY: &str = "lan-pos";

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
}

impl LanSub {
    fn key(&self) -> (String, String, String) {
        (self.target.clone(), self.biz_no.clone(), self.print_type.clone())
    }

    fn request(&self, lan: bool) -> SubmitRequest {
        SubmitRequest {
            tenant_id: TENANT.into(),
            biz_no: Some(self.biz_no.clone()),
            printer_id: (!self.station).then(|| self.name.clone()),
            station_id: self.station.then(|| self.name.clone()),
            print_type: Some(self.print_type.clone()),
            content: Some(Content::Text { text: self.text.clone() }),
            store_scope: lan.then(|| STORE.to_owned()),
            // Where the agent would print it offline: the station's first printer it drives.
            lan_printer: (lan && self.station).then(|| self.printer().to_owned()),
            actor: lan.then(|| format!("agent:{}", super::AGENT_IDS[LISTENER])),
        }
    }

    /// The printer the agent prints it on offline.
    fn printer(&self) -> &str {
        if !self.station {
            return &self.name;
        }
        let members = [
            StationMember { printer_id: "a1", enabled: true, agent: true },
            StationMember { printer_id: "a2", enabled: true, agent: true },
        ];
        station_printer(&members, true).unwrap_or("a1")
    }
}

/// What the LAN side knows.
#[derive(Default)]
pub(super) struct LanFacts {
    pub subs: Vec<LanSub>,
    /// The agent's journal records of what it printed offline, by delivery key: the LAN
    /// task and whether paper may have come out without proof.
    pub printed_keys: HashMap<String, (String, bool)>,
    /// The LAN tasks of each key (target, biz_no, print_type).
    pub lan_ids: HashMap<(String, String, String), Vec<String>>,
    /// The LAN listener was claimed (the store has LAN orders).
    pub claimed: bool,
}

impl World {
    /// The agent's wall clock (the shop PC's).
    fn agent_now(&self) -> i64 {
        self.clock_now() + self.agents[LISTENER].clock_offset
    }

    async fn claim_listener(&self) -> Result<(), Fail> {
        self.broker
            .offline
            .claim_lan_listener(&Self::who(), super::AGENT_IDS[LISTENER])
            .await
            .map(|_| ())
            .map_err(|e| engine_err("claim_lan_listener", e))
    }

    pub(super) fn lan_submit(&mut self, target: usize, kind: usize) -> Result<(), Fail> {
        let (name, station) = LAN_TARGETS[target % LAN_TARGETS.len()];
        let n = self.lan.subs.len();
        let sub = LanSub {
            target: format!("{}:{name}", if station { "station" } else { "printer" }),
            station,
            name: name.to_owned(),
            biz_no: format!("L{n}"),
            print_type: super::TYPES[kind % super::TYPES.len()].0.to_owned(),
            text: format!("LAN ticket L{n}\n"),
            answers: Vec::new(),
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

    /// The agent's LAN listener answers submission `i`: from its outbox when it accepted
    /// the key offline, forwarded to the broker while the line is up, accepted offline
    /// (or answered from a remembered forward) while it is down.
    pub(super) fn lan_send(&mut self, i: usize) -> Result<(), Fail> {
        if !self.lan.claimed {
            self.block_on(self.claim_listener())??;
            self.lan.claimed = true;
        }
        let (target, biz, ptype) = self.lan.subs[i].key();
        let outbox = self.outbox.clone();
        if let Some(t) = self.block_on(outbox.find(&target, &biz, &ptype))?.map_err(|e| engine_err("outbox", e))? {
            self.lan.subs[i].answers.push(t.task_id);
            return Ok(());
        }
        if self.line_up {
            let req = self.lan.subs[i].request(true);
            let answer = self.block_on(self.broker.intake.submit(req))?;
            let answer = answer.map_err(|e| format!("a LAN submission forwarded to the broker was refused: {e}"))?;
            let fingerprint = self.lan_fingerprint(i)?;
            let f = Forwarded {
                target,
                biz_no: biz,
                print_type: ptype,
                fingerprint,
                task_id: answer.task_id.clone(),
                state: answer.state.as_str().to_owned(),
                at: self.agent_now(),
            };
            self.block_on(outbox.remember_forwarded(f))?.map_err(|e| engine_err("outbox", e))?;
            self.lan.subs[i].answers.push(answer.task_id);
            return Ok(());
        }
        if let Some(f) = self.block_on(outbox.forwarded(&target, &biz, &ptype))?.map_err(|e| engine_err("outbox", e))? {
            self.lan.subs[i].answers.push(f.task_id);
            return Ok(());
        }
        // Offline: durable in the outbox before the answer.
        let now = self.agent_now();
        self.sessions += 1;
        let mut random = [0u8; 10];
        random[..8].copy_from_slice(&self.sessions.to_be_bytes());
        let id = TaskId::from_parts(now, random).into_string();
        let sub = &self.lan.subs[i];
        let printer = sub.printer().to_owned();
        let task = OfflineTask {
            task_id: id,
            target: target.clone(),
            biz_no: biz.clone(),
            print_type: ptype.clone(),
            fingerprint: self.lan_fingerprint(i)?,
            request: sub.text.clone(),
            delivery_key: delivery_key(&biz, &printer, &target, &ptype),
            printer_id: printer,
            lan_key_id: LAN_KEY.into(),
            accepted_at: now,
            state: LocalState::Accepted,
            attempt: 0,
            next_at: now,
            detail: String::new(),
            history: Vec::new(),
            synced: false,
            clock_origin: String::new(),
            clock_ms: 0,
        };
        let inserted = self.block_on(outbox.insert(task))?.map_err(|e| engine_err("outbox", e))?;
        let (Inserted::Created(t) | Inserted::Existing(t)) = inserted;
        self.lan.lan_ids.entry((target, biz, ptype)).or_default().push(t.task_id.clone());
        self.lan.subs[i].answers.push(t.task_id);
        Ok(())
    }

    fn lan_fingerprint(&self, i: usize) -> Result<String, Fail> {
        let content = Content::Text { text: self.lan.subs[i].text.clone() };
        let canonical = content.canonicalize(ContentLimits::default()).map_err(|e| format!("content: {e}"))?;
        Ok(canonical.fingerprint().0)
    }

    /// The same order through the cloud API: one task for the key, whichever way it came.
    pub(super) fn lan_to_cloud(&mut self, pick: usize) -> Result<(), Fail> {
        if self.lan.subs.is_empty() {
            return Ok(());
        }
        let i = pick % self.lan.subs.len();
        let req = self.lan.subs[i].request(false);
        let answer = self.block_on(self.broker.intake.submit(req))?;
        let answer = answer.map_err(|e| format!("the cloud copy of a LAN order was refused: {e}"))?;
        if !matches!(answer.kind, SubmitKind::Created | SubmitKind::Duplicate) {
            return Err(format!("the cloud copy of a LAN order was answered {:?}", answer.kind));
        }
        self.lan.subs[i].answers.push(answer.task_id);
        Ok(())
    }

    /// The agent's local lane: its next due offline ticket goes to its printer, after the
    /// journal (a task left `printing` by a crash may have printed: in doubt).
    pub(super) fn local_print(&mut self, print: AgentPrint) -> Result<(), Fail> {
        let outbox = self.outbox.clone();
        let now = self.agent_now();
        let due = self.block_on(outbox.due(now))?.map_err(|e| engine_err("outbox", e))?;
        let Some(t) = due.into_iter().next() else { return Ok(()) };
        let entry = |attempt: u32, state: &str| HistoryEntry {
            at: now,
            attempt,
            state: state.to_owned(),
            detail: format!("simulated: {state}"),
        };
        if t.state == LocalState::Printing {
            self.facts.exposed_keys.insert((t.target.clone(), t.biz_no.clone(), t.print_type.clone()));
            self.lan.printed_keys.insert(t.delivery_key.clone(), (t.task_id.clone(), true));
            let e = entry(t.attempt, "in_doubt");
            self.block_on(outbox.finish(&t.task_id, t.attempt, LocalState::InDoubt, 0, e))?
                .map_err(|e| engine_err("outbox", e))?;
            return Ok(());
        }
        let Some(attempt) = self.block_on(outbox.start(&t.task_id))?.map_err(|e| engine_err("outbox", e))? else {
            return Ok(());
        };
        // The journal answers for a key the agent printed (or started) for the broker.
        let known = self.agents[LISTENER].process.journal().lookup_key(&t.delivery_key).map(|r| r.state);
        let answered = match known {
            Some(RecordState::Printed) => Some(LocalState::Printed),
            Some(RecordState::Started | RecordState::InDoubt) => Some(LocalState::InDoubt),
            Some(_) | None => None,
        };
        if let Some(to) = answered {
            let e = entry(attempt, if to == LocalState::Printed { "printed" } else { "in_doubt" });
            self.block_on(outbox.finish(&t.task_id, attempt, to, 0, e))?.map_err(|e| engine_err("outbox", e))?;
            if to == LocalState::InDoubt {
                self.facts.exposed_keys.insert((t.target.clone(), t.biz_no.clone(), t.print_type.clone()));
            }
            return Ok(());
        }
        let key = (t.target.clone(), t.biz_no.clone(), t.print_type.clone());
        let data = t.request.as_bytes().to_vec();
        let (to, paper, word) = match print {
            AgentPrint::Printed => (Some(LocalState::Printed), true, "printed"),
            AgentPrint::Blocked(o) => (Some(LocalState::Accepted), false, o.as_str()),
            AgentPrint::LostAfterPaper => (Some(LocalState::InDoubt), true, Outcome::InDoubt.as_str()),
            AgentPrint::Crash { paper } => (None, paper, "started"),
        };
        if paper {
            self.paper(&t.task_id, &data);
        }
        if to != Some(LocalState::Accepted) {
            let doubt = to != Some(LocalState::Printed);
            self.lan.printed_keys.insert(t.delivery_key.clone(), (t.task_id.clone(), doubt));
            if doubt {
                self.facts.exposed_keys.insert(key);
            }
        }
        match to {
            Some(to) => {
                let retry_at = if to == LocalState::Accepted { now + 1_000 } else { 0 };
                self.block_on(outbox.finish(&t.task_id, attempt, to, retry_at, entry(attempt, word)))?
                    .map_err(|e| engine_err("outbox", e))?;
            }
            // The process dies with the task `printing`; the outbox and journal stay.
            None => self.restart_agent(LISTENER)?,
        }
        Ok(())
    }

    /// The agent's upload of what it accepted offline (only while the line is up).
    pub(super) fn sync(&mut self, answer_lost: bool) -> Result<(), Fail> {
        if !self.line_up {
            return Ok(());
        }
        let outbox = self.outbox.clone();
        let tasks = self.block_on(outbox.take_for_sync(200))?.map_err(|e| engine_err("outbox", e))?;
        if tasks.is_empty() {
            return Ok(());
        }
        let reports: Vec<OfflineReport> = tasks.iter().map(report).collect();
        let sent_at = Some(self.agent_now());
        let answers =
            self.block_on(self.broker.offline.sync(&Self::who(), super::AGENT_IDS[LISTENER], reports, sent_at))?;
        let answers = answers.map_err(|e| engine_err("sync", e))?;
        for (t, a) in tasks.iter().zip(&answers) {
            // A merge settles the broker's task by what the agent reports: a doubt there
            // comes from the LAN side's own.
            if let Some(id) = &a.broker_task_id {
                if self.lan.printed_keys.get(&t.delivery_key).is_some_and(|(_, doubt)| *doubt)
                    || a.result == SyncResult::Conflict
                {
                    self.facts.exposed.insert(id.clone());
                }
            }
        }
        if answer_lost {
            // The broker took them, the agent does not know: as crates/agent/src/offline.rs
            // does, they stay handed to the broker (never printed here) and go in the next
            // upload, whose answer is this one's.
            for t in &tasks {
                self.facts.exposed_keys.insert((t.target.clone(), t.biz_no.clone(), t.print_type.clone()));
            }
            return Ok(());
        }
        let results =
            answers.iter().map(|a| (a.task_id.clone(), a.result.as_str().to_owned(), a.broker_task_id.clone()));
        self.block_on(outbox.synced(results.collect()))?.map_err(|e| engine_err("outbox", e))?;
        Ok(())
    }

    /// What the agent answers for a broker delivery of a key it printed offline: printed
    /// when the sync merged that very print into this task, else in doubt (the content
    /// may differ; the sync settles it). `None`: the key is not in its LAN journal.
    pub(super) fn lan_journal_answer(&mut self, key: &str, task_id: &str) -> Result<Option<Outcome>, Fail> {
        let Some((lan_id, doubt)) = self.lan.printed_keys.get(key).cloned() else { return Ok(None) };
        let outbox = self.outbox.clone();
        let handover = self.block_on(outbox.handover(&lan_id))?.map_err(|e| engine_err("outbox", e))?;
        let merged_here = lan_id == task_id || handover.is_some_and(|h| h.broker_task_id.as_deref() == Some(task_id));
        Ok(Some(if merged_here && !doubt {
            Outcome::Printed
        } else {
            self.facts.exposed.insert(task_id.to_owned());
            Outcome::InDoubt
        }))
    }

    /// At the end: every id a POS was answered for a key stands for one broker task (or is
    /// kept by the agent, rejected, for a person), and it is the same task for every
    /// answer of the key.
    pub(super) fn lan_final_check(&mut self) -> Result<(), Fail> {
        let outbox = self.outbox.clone();
        for s in &self.lan.subs {
            let mut live: Option<String> = None;
            for id in &s.answers {
                let broker_id = match self.task(id)? {
                    Some(_) => id.clone(),
                    None => {
                        let h = self.block_on(outbox.handover(id))?.map_err(|e| engine_err("outbox", e))?;
                        match h {
                            Some(h) if h.result.as_deref() == Some("rejected") => continue,
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

/// The upload of one offline task, as the agent builds it.
fn report(t: &OfflineTask) -> OfflineReport {
    let (kind, name) = t.target.split_once(':').unwrap_or(("printer", &t.target));
    let outcome = match t.state {
        LocalState::Printed => "printed",
        LocalState::InDoubt => "in_doubt",
        LocalState::Failed => "failed",
        _ => "pending",
    };
    OfflineReport {
        task_id: t.task_id.clone(),
        biz_no: Some(t.biz_no.clone()),
        printer_id: (kind == "printer").then(|| name.to_owned()),
        station_id: (kind == "station").then(|| name.to_owned()),
        print_type: Some(t.print_type.clone()),
        content: Some(Content::Text { text: t.request.clone() }),
        accepted_at: t.accepted_at,
        lan_key_id: t.lan_key_id.clone(),
        printed_on: (outcome != "pending").then(|| t.printer_id.clone()),
        outcome: outcome.to_owned(),
        attempts: t.attempt as i32,
        detail: t.detail.clone(),
        history: t
            .history
            .iter()
            .map(|h| JournalRecord {
                at: h.at,
                attempt: h.attempt as i32,
                state: h.state.clone(),
                detail: h.detail.clone(),
            })
            .collect(),
        unreadable: None,
        age_ms: None,
    }
}
