//! Who may hold a printer's delivery: claimants, and what the broker knows about the ones
//! that are store agents.
//!
//! A claimant is an agent session (a store agent process), a push driver (the broker
//! itself, pushing to webhook printers), or, with the printer transports that poll the
//! broker, a printer. A task handed out is recorded with `sent_to` = the claimant
//! (`agent:ID`, `push:webhook`, `printer:cloudprnt`) and `sent_session` (for a printer:
//! [`OFFERED`] or [`FETCHED`]).
//!
//! The [`AgentRegistry`] answers the questions the lane engine asks about agents: is the
//! session that holds a delivery still working on it, or did its process end (a restart),
//! and is an agent gone while another one serves its store. It also fences: of two live
//! processes with one agent id (`--agent-id` reused, a copied state directory) the newest
//! session wins and the older is told to stop; its deliveries stay with it until it
//! answers them or falls silent, so two processes never print one task.
//!
//! "Newest" is decided on the broker's clock, never on the agent's: a session starts
//! when this broker first hears it, less the process's age that the agent reports with its
//! polls (`session_age_ms`, agent protocol 3, measured on a monotonic clock). A shop PC
//! whose wall clock was set back (NTP, a dead CMOS battery) or runs an hour ahead
//! therefore restarts its agent into the newest session like any other; the start time a
//! session id carries is only a name. Ties are broken by the session id, so that every
//! node decides alike.
//!
//! The registry is in memory. What it does not know after a broker restart it treats as
//! unknown, never as gone: an agent not yet seen counts as gone only once the broker has
//! been up longer than `agent_gone_after_ms`, and an earlier session only once the broker
//! has been up long enough for a live one to have polled.
//!
//! With several broker nodes (PostgreSQL), an agent's polls may reach any node. Each node
//! then syncs its registry about once a second ([`AgentRegistry::sync_once`]): it writes
//! the sessions it heard since the last sync to the store's `agent_sessions` and merges
//! what the other nodes wrote. What a node learned from others is at most a sync or two
//! old, so every decision that would take a delivery from its holder (gone, quiet) waits
//! `remote_lag_ms` longer for that part of its knowledge, and none is taken while the
//! node's last successful sync is older than that (its picture of the others is stale).
//! A newer session seen anywhere supersedes the older one everywhere.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use onceprint_core::lane::Holder;
use onceprint_core::Millis;
use onceprint_store::{AgentSessionRow, Store, StoreError};

use crate::clock::Clock;

/// What kind of thing holds a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClaimantKind {
    /// A store agent (pull).
    Agent,
    /// The broker's push driver for one transport kind.
    Push,
    /// A printer that polls the broker for its own lane (CloudPRNT, Epson Server Direct
    /// Print). Its claims are scoped to that one printer, so the transport kind names it.
    Printer,
}

/// The session of a delivery held by a printer that polls: handed out (the printer was
/// told a job is ready) but not fetched yet. Such a delivery printed nothing and may be
/// offered again with the same attempt and token.
pub const OFFERED: &str = "offered";
/// The session of a delivery whose data the printer has fetched: it may have printed, so it
/// is never offered again; it ends with the printer's answer or in doubt.
pub const FETCHED: &str = "fetched";

/// One claimant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimant {
    pub kind: ClaimantKind,
    pub id: String,
    /// The process (agent) or run of the driver; a new session of the same id is a restart.
    pub session: Option<String>,
}

impl Claimant {
    pub fn agent(id: &str, session: Option<&str>) -> Claimant {
        Claimant { kind: ClaimantKind::Agent, id: id.to_owned(), session: session.map(str::to_owned) }
    }

    /// The push driver of a transport kind (`webhook`).
    pub fn push(transport: &str) -> Claimant {
        Claimant { kind: ClaimantKind::Push, id: transport.to_owned(), session: Some("push".into()) }
    }

    /// The push driver of a transport kind in the run whose lease token is `token`: its
    /// deliveries carry the session `run:TOKEN`, so that a driver can tell its own from
    /// those of a run on another node before it (an older token) or after it (a newer).
    pub fn push_run(transport: &str, token: i64) -> Claimant {
        Claimant { kind: ClaimantKind::Push, id: transport.to_owned(), session: Some(format!("run:{token}")) }
    }

    /// The lease token a push driver's session names (`None`: a session of a broker
    /// before leases, `push`, or not a push driver's).
    pub fn run_token(session: Option<&str>) -> Option<i64> {
        session?.strip_prefix("run:")?.parse().ok()
    }

    /// A printer that polls the broker with this transport kind (`cloudprnt`,
    /// `epson_sdp`). Its deliveries start [`OFFERED`].
    pub fn printer(transport: &str) -> Claimant {
        Claimant { kind: ClaimantKind::Printer, id: transport.to_owned(), session: Some(OFFERED.into()) }
    }

    /// The `sent_to` column of a task handed to this claimant.
    pub fn sent_to(&self) -> String {
        match self.kind {
            ClaimantKind::Agent => format!("agent:{}", self.id),
            ClaimantKind::Push => format!("push:{}", self.id),
            ClaimantKind::Printer => format!("printer:{}", self.id),
        }
    }

    /// The claimant a task's `sent_to` names. Before claimants were typed, `sent_to` held
    /// an agent id as it is, or `webhook` for the pusher.
    pub fn holder_of(sent_to: &str) -> (ClaimantKind, &str) {
        match sent_to.split_once(':') {
            Some(("agent", id)) => (ClaimantKind::Agent, id),
            Some(("push", id)) => (ClaimantKind::Push, id),
            Some(("printer", id)) => (ClaimantKind::Printer, id),
            _ if sent_to == "webhook" => (ClaimantKind::Push, "webhook"),
            _ => (ClaimantKind::Agent, sent_to),
        }
    }

    /// The actor in the audit trail.
    pub fn actor(&self) -> String {
        match self.kind {
            ClaimantKind::Agent => format!("agent:{}", self.id),
            ClaimantKind::Push => format!("transport:{}", self.id),
            ClaimantKind::Printer => format!("printer:{}", self.id),
        }
    }
}

/// Timing of the registry.
#[derive(Debug, Clone, Copy)]
pub struct RegistryConfig {
    /// An agent not heard of for this long (no poll open, no ack) is gone.
    pub gone_after_ms: i64,
    /// An earlier session of an agent id that has not been heard of for this long, and was
    /// never heard after a newer session appeared, has stopped: its deliveries go to the
    /// newer session. A live agent always has a poll open or acks as it prints, so this is
    /// only the time for a restarted agent to come back. An earlier session that was still
    /// heard after the newer one appeared is a second live process: its deliveries wait
    /// for it until it has been silent for `gone_after_ms`.
    pub takeover_quiet_ms: i64,
    /// How stale what this node learns from other nodes may be (about 2 × the sync
    /// interval; 0 for a broker that is alone, which never syncs).
    pub remote_lag_ms: i64,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        RegistryConfig { gone_after_ms: 60_000, takeover_quiet_ms: 3_000, remote_lag_ms: 0 }
    }
}

/// "Never heard here": a session known only from other nodes. Far enough in the past to be
/// older than any threshold, far enough from `i64::MIN` for plain subtraction.
const NEVER: Millis = i64::MIN / 4;

/// A session was replaced by a newer process with the same agent id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "agent {agent_id}: a newer process with the same agent id (session {newer}) has taken over; this one \
     must stop (two agent processes with one agent id: --agent-id reused, or a copied state directory)"
)]
pub struct Superseded {
    pub agent_id: String,
    pub newer: String,
}

#[derive(Debug, Clone)]
struct SessionState {
    /// Orders sessions of one agent id (then the session id): when the process started on
    /// the broker's clock — first heard, less the age its agent reported.
    started: Millis,
    /// Last heard by this node ([`NEVER`] when only other nodes heard it).
    heard: Millis,
    /// Last heard by another node, as the sync reported it ([`NEVER`]: no node did).
    heard_remote: Millis,
    /// Heard here since this node's last sync wrote it.
    dirty: bool,
    open_polls: u32,
    superseded: bool,
    /// Heard (a poll or an ack) after a newer session appeared: a second live process.
    heard_after_superseded: bool,
}

#[derive(Debug, Default)]
struct AgentState {
    current: Option<String>,
    sessions: HashMap<String, SessionState>,
    /// When acks of this agent id last reached this broker process, from any session,
    /// known here or not. Only polls make a session known (and decide which one is
    /// current), but an agent whose acks arrive is not gone: after a broker restart an
    /// agent busy printing may ack (and take its next jobs with the acks) before it polls.
    acked: Option<Millis>,
}

impl AgentState {
    fn last_heard(&self) -> Option<Millis> {
        self.sessions.values().map(|s| s.heard).chain(self.acked).max()
    }

    fn last_heard_remote(&self) -> Millis {
        self.sessions.values().map(|s| s.heard_remote).max().unwrap_or(NEVER)
    }

    fn has_open_poll(&self) -> bool {
        self.sessions.values().any(|s| s.open_polls > 0)
    }
}

type Key = (String, String);

pub use onceprint_core::ids::{agent_session_id as new_session_id, agent_session_started_at as session_started_at};

/// The most of an agent process's reported age that is believed (a year): a start earlier
/// than that would only be a broken report.
const MAX_SESSION_AGE_MS: u64 = 365 * 86_400_000;

/// What the broker knows about the store agents that talk to it.
pub struct AgentRegistry {
    clock: Arc<dyn Clock>,
    config: RegistryConfig,
    started_at: Millis,
    agents: Mutex<HashMap<Key, HashMap<String, AgentState>>>,
    /// When the last sync with the other nodes succeeded (`None`: never, or a broker that
    /// is alone and does not sync).
    synced: Mutex<SyncState>,
}

#[derive(Debug, Default, Clone, Copy)]
struct SyncState {
    /// The sync runs (several nodes).
    on: bool,
    /// When the last successful sync read what the others wrote.
    at: Option<Millis>,
    /// Read from here at the next sync.
    read_from: Option<Millis>,
    /// When this node last deleted long silent sessions from the store.
    forgotten_at: Option<Millis>,
}

/// How often a node deletes the store's rows of sessions nobody heard for long.
const FORGET_EVERY_MS: i64 = 3_600_000;
/// Rows of sessions nobody heard for this long are deleted.
const FORGET_AFTER_MS: i64 = 86_400_000;

/// Held while a poll is open; the session counts as live until it is dropped (the poll
/// answered, or its connection closed).
pub struct PollGuard {
    registry: Arc<AgentRegistry>,
    key: Key,
    agent_id: String,
    session: String,
    /// This poll's session replaced an earlier one of the agent id (a restart, or a second
    /// process): polls of the earlier one should look again, and learn they must stop.
    pub took_over: bool,
}

impl Drop for PollGuard {
    fn drop(&mut self) {
        let now = self.registry.clock.now_ms();
        let mut all = self.registry.agents.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(s) = all
            .get_mut(&self.key)
            .and_then(|a| a.get_mut(&self.agent_id))
            .and_then(|a| a.sessions.get_mut(&self.session))
        {
            s.open_polls = s.open_polls.saturating_sub(1);
            s.heard = s.heard.max(now);
            s.dirty = true;
        }
    }
}

impl AgentRegistry {
    pub fn new(clock: Arc<dyn Clock>, config: RegistryConfig) -> Arc<AgentRegistry> {
        let started_at = clock.now_ms();
        Arc::new(AgentRegistry { clock, config, started_at, agents: Mutex::default(), synced: Mutex::default() })
    }

    pub fn config(&self) -> RegistryConfig {
        self.config
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, HashMap<String, AgentState>>> {
        self.agents.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a poll of `agent_id` in `session` (`None`: an agent that sends no session
    /// is one session for ever), whose process has been running for `age_ms` by its own
    /// monotonic clock (`None`: an agent before protocol 3 says nothing, and the session
    /// starts when this broker first hears it). A session older than the agent id's current
    /// one is refused: a newer process took over.
    pub fn begin_poll(
        self: &Arc<Self>,
        tenant_id: &str,
        store_id: &str,
        agent_id: &str,
        session: Option<&str>,
        age_ms: Option<u64>,
    ) -> Result<PollGuard, Superseded> {
        let now = self.clock.now_ms();
        let key = (tenant_id.to_owned(), store_id.to_owned());
        let session = session.unwrap_or_default().to_owned();
        let started = now - age_ms.unwrap_or(0).min(MAX_SESSION_AGE_MS) as i64;
        let mut all = self.lock();
        let agent = all.entry(key.clone()).or_default().entry(agent_id.to_owned()).or_default();
        let took_over = Self::note(agent, agent_id, &session, started, now)?;
        if let Some(s) = agent.sessions.get_mut(&session) {
            s.open_polls += 1;
        }
        Self::prune(agent, now, self.config.gone_after_ms);
        drop(all);
        Ok(PollGuard { registry: self.clone(), key, agent_id: agent_id.to_owned(), session, took_over })
    }

    /// Notes that `session` of `agent_id` was heard (an ack; `None`: an agent that sends no
    /// session, heard as its current one). Acks of a superseded session are still taken
    /// (they tell the truth about its own deliveries); they keep its deliveries with it.
    /// Only polls make a session known: an ack of a session this broker has not seen yet
    /// only tells that the agent id is alive.
    pub fn heard(&self, tenant_id: &str, store_id: &str, agent_id: &str, session: Option<&str>) {
        let now = self.clock.now_ms();
        let mut all = self.lock();
        let agent =
            all.entry((tenant_id.to_owned(), store_id.to_owned())).or_default().entry(agent_id.to_owned()).or_default();
        agent.acked = agent.acked.max(Some(now));
        let name = match session {
            Some(s) => s.to_owned(),
            None => agent.current.clone().unwrap_or_default(),
        };
        if let Some(s) = agent.sessions.get_mut(&name) {
            s.heard = s.heard.max(now);
            s.dirty = true;
            if s.superseded {
                s.heard_after_superseded = true;
            }
        }
    }

    fn note(
        agent: &mut AgentState,
        agent_id: &str,
        session: &str,
        started: Millis,
        now: Millis,
    ) -> Result<bool, Superseded> {
        let current = agent.current.clone();
        if let Some(s) = agent.sessions.get_mut(session) {
            s.heard = s.heard.max(now);
            s.dirty = true;
            if s.superseded {
                s.heard_after_superseded = true;
                return Err(Superseded { agent_id: agent_id.to_owned(), newer: current.unwrap_or_default() });
            }
            return Ok(false);
        }
        let newer_exists = current
            .as_ref()
            .and_then(|c| agent.sessions.get(c).map(|st| (st.started, c.as_str())))
            .is_some_and(|c| c > (started, session));
        let state = SessionState {
            started,
            heard: now,
            heard_remote: NEVER,
            dirty: true,
            open_polls: 0,
            superseded: newer_exists,
            heard_after_superseded: newer_exists,
        };
        if newer_exists {
            agent.sessions.insert(session.to_owned(), state);
            return Err(Superseded { agent_id: agent_id.to_owned(), newer: current.unwrap_or_default() });
        }
        let took_over = match current.as_ref().and_then(|c| agent.sessions.get_mut(c)) {
            Some(old) => {
                old.superseded = true;
                true
            }
            None => false,
        };
        agent.sessions.insert(session.to_owned(), state);
        agent.current = Some(session.to_owned());
        Ok(took_over)
    }

    /// Forgets superseded sessions that have long been silent.
    fn prune(agent: &mut AgentState, now: Millis, gone_after_ms: i64) {
        if agent.sessions.len() > 4 {
            agent.sessions.retain(|_, s| {
                !s.superseded || s.open_polls > 0 || now - s.heard.max(s.heard_remote) < 2 * gone_after_ms
            });
        }
    }

    /// Whether `session` is still the current session of `agent_id` (a poll of a session
    /// that was superseded while it waited ends at once).
    pub fn is_superseded(
        &self,
        tenant_id: &str,
        store_id: &str,
        agent_id: &str,
        session: Option<&str>,
    ) -> Option<String> {
        let all = self.lock();
        let agent = all.get(&(tenant_id.to_owned(), store_id.to_owned()))?.get(agent_id)?;
        let s = agent.sessions.get(session.unwrap_or_default())?;
        s.superseded.then(|| agent.current.clone().unwrap_or_default())
    }

    /// Who holds a delivery handed to agent `holder` in `holder_session`, as seen by
    /// `asker` (an agent and its session), or by the sweeper (`None`).
    pub fn holder(
        &self,
        tenant_id: &str,
        store_id: &str,
        holder: &str,
        holder_session: Option<&str>,
        asker: Option<(&str, Option<&str>)>,
    ) -> Holder {
        let now = self.clock.now_ms();
        let all = self.lock();
        let agents = all.get(&(tenant_id.to_owned(), store_id.to_owned()));
        let holder_session = holder_session.unwrap_or_default();
        if let Some((asker_id, asker_session)) = asker {
            if asker_id == holder {
                if asker_session.unwrap_or_default() == holder_session {
                    return Holder::Me;
                }
                let state = agents.and_then(|a| a.get(holder)).and_then(|a| a.sessions.get(holder_session));
                return Holder::EarlierSession { quiet: self.quiet(state, now) };
            }
        }
        let gone = self.gone(agents.and_then(|a| a.get(holder)), now);
        // Someone must serve the store now: the asker does; for the sweeper, another agent.
        let replaced = asker.is_some()
            || agents.is_some_and(|a| a.iter().any(|(id, st)| id != holder && !self.gone(Some(st), now)));
        Holder::Other { gone: gone && replaced }
    }

    /// Whether what this node knows of the other nodes is fresh enough to call an agent
    /// gone or a session quiet: always for a broker that is alone; with several nodes, only
    /// while the last successful sync is at most `remote_lag_ms` old.
    fn picture_is_fresh(&self, now: Millis) -> bool {
        let sync = *self.synced.lock().unwrap_or_else(PoisonError::into_inner);
        !sync.on || sync.at.is_some_and(|at| now - at <= self.config.remote_lag_ms)
    }

    /// Whether a session last heard here at `local` and elsewhere at `remote` has been
    /// silent for `limit`: what came from other nodes waits `remote_lag_ms` longer.
    fn silent_for(&self, local: Millis, remote: Millis, limit: i64, now: Millis) -> bool {
        now - local >= limit && now - remote >= limit + self.config.remote_lag_ms
    }

    /// Whether an earlier session has certainly stopped working on its deliveries.
    fn quiet(&self, state: Option<&SessionState>, now: Millis) -> bool {
        if !self.picture_is_fresh(now) {
            return false;
        }
        match state {
            // Not seen by this broker process: a live one polls within moments of a broker
            // restart, so give it that long.
            None => now - self.started_at >= self.config.takeover_quiet_ms + self.config.remote_lag_ms,
            Some(s) if s.open_polls > 0 => false,
            Some(s) if s.heard_after_superseded => {
                self.silent_for(s.heard, s.heard_remote, self.config.gone_after_ms, now)
            }
            Some(s) => self.silent_for(s.heard, s.heard_remote, self.config.takeover_quiet_ms, now),
        }
    }

    fn gone(&self, state: Option<&AgentState>, now: Millis) -> bool {
        if !self.picture_is_fresh(now) {
            return false;
        }
        match state {
            // Unknown is not gone: only once the broker has been up long enough for it to
            // have polled.
            None => now - self.started_at > self.config.gone_after_ms + self.config.remote_lag_ms,
            Some(a) if a.has_open_poll() => false,
            Some(a) => {
                let local = a.last_heard().filter(|h| *h > NEVER).unwrap_or(self.started_at);
                self.silent_for(local, a.last_heard_remote(), self.config.gone_after_ms + 1, now)
            }
        }
    }

    /// Whether any agent of the store is live (polled or acked recently).
    pub fn store_has_live_agent(&self, tenant_id: &str, store_id: &str) -> bool {
        let now = self.clock.now_ms();
        let all = self.lock();
        all.get(&(tenant_id.to_owned(), store_id.to_owned()))
            .is_some_and(|a| a.values().any(|st| !self.gone(Some(st), now)))
    }

    /// When an earlier session's deliveries will go to the newer one, if it stays quiet
    /// (so a waiting poll can look again then).
    pub fn quiet_at(
        &self,
        tenant_id: &str,
        store_id: &str,
        holder: &str,
        holder_session: Option<&str>,
    ) -> Option<Millis> {
        let all = self.lock();
        let state = all
            .get(&(tenant_id.to_owned(), store_id.to_owned()))
            .and_then(|a| a.get(holder))
            .and_then(|a| a.sessions.get(holder_session.unwrap_or_default()));
        let lag = self.config.remote_lag_ms;
        match state {
            None => Some(self.started_at + self.config.takeover_quiet_ms + lag),
            Some(s) if s.open_polls > 0 => None,
            Some(s) if s.heard_after_superseded => {
                Some((s.heard + self.config.gone_after_ms).max(s.heard_remote + self.config.gone_after_ms + lag))
            }
            Some(s) => Some(
                (s.heard + self.config.takeover_quiet_ms).max(s.heard_remote + self.config.takeover_quiet_ms + lag),
            ),
        }
    }

    /// What this node heard since its last sync, as rows for the store: every session
    /// heard here since then, and every session with a poll open here (written as heard
    /// now, so that other nodes see it live while the poll waits).
    pub fn changes_to_share(&self, node_id: &str) -> Vec<AgentSessionRow> {
        let now = self.clock.now_ms();
        let mut all = self.lock();
        let mut rows = Vec::new();
        for ((tenant_id, store_id), agents) in all.iter_mut() {
            for (agent_id, agent) in agents.iter_mut() {
                for (session, s) in agent.sessions.iter_mut() {
                    if !s.dirty && s.open_polls == 0 {
                        continue;
                    }
                    s.dirty = false;
                    rows.push(AgentSessionRow {
                        tenant_id: tenant_id.clone(),
                        store_id: store_id.clone(),
                        agent_id: agent_id.clone(),
                        session: session.clone(),
                        started_at: s.started,
                        heard_at: if s.open_polls > 0 { now } else { s.heard },
                        open_poll: s.open_polls > 0,
                        node_id: node_id.to_owned(),
                    });
                }
            }
        }
        rows
    }

    /// Merges what other nodes heard: the latest hearing of each session counts, and a
    /// session that started later than an agent id's current one becomes current here too,
    /// so that polls of the older one on this node are told that they were superseded.
    pub fn merge(&self, rows: &[AgentSessionRow], node_id: &str) {
        let mut all = self.lock();
        for r in rows {
            if r.node_id == node_id {
                // Our own hearing, already known here.
                continue;
            }
            let agent = all
                .entry((r.tenant_id.clone(), r.store_id.clone()))
                .or_default()
                .entry(r.agent_id.clone())
                .or_default();
            if let Some(s) = agent.sessions.get_mut(&r.session) {
                s.heard_remote = s.heard_remote.max(r.heard_at);
                continue;
            }
            let current = agent.current.as_ref().and_then(|c| agent.sessions.get(c).map(|st| (st.started, c.clone())));
            let newer_exists =
                current.is_some_and(|(started, c)| (started, c.as_str()) > (r.started_at, r.session.as_str()));
            agent.sessions.insert(
                r.session.clone(),
                SessionState {
                    started: r.started_at,
                    heard: NEVER,
                    heard_remote: r.heard_at,
                    dirty: false,
                    open_polls: 0,
                    superseded: newer_exists,
                    heard_after_superseded: false,
                },
            );
            if !newer_exists {
                if let Some(old) = agent.current.as_ref().and_then(|c| agent.sessions.get_mut(c)) {
                    old.superseded = true;
                }
                agent.current = Some(r.session.clone());
            }
        }
    }

    /// One sync with the other nodes: writes what this node heard, then reads what the
    /// others heard since the last read (with some overlap; merging is idempotent).
    pub async fn sync_once(&self, store: &dyn Store, node_id: &str) -> Result<(), StoreError> {
        let start = self.clock.now_ms();
        let rows = self.changes_to_share(node_id);
        if let Err(e) = store.put_agent_sessions(&rows).await {
            // Written again at the next sync.
            let mut all = self.lock();
            for r in &rows {
                if let Some(s) = all
                    .get_mut(&(r.tenant_id.clone(), r.store_id.clone()))
                    .and_then(|a| a.get_mut(&r.agent_id))
                    .and_then(|a| a.sessions.get_mut(&r.session))
                {
                    s.dirty = true;
                }
            }
            return Err(e);
        }
        let from = {
            let sync = self.synced.lock().unwrap_or_else(PoisonError::into_inner);
            sync.read_from.unwrap_or(start - 2 * self.config.gone_after_ms)
        };
        let heard = store.agent_sessions_since(from).await?;
        self.merge(&heard, node_id);
        let forget = {
            let sync = self.synced.lock().unwrap_or_else(PoisonError::into_inner);
            sync.forgotten_at.is_none_or(|at| start - at >= FORGET_EVERY_MS)
        };
        if forget {
            // Any node may do it: deleting rows nobody heard for a day is the same change
            // whoever makes it, and a live session rewrites its row every sync.
            match store.forget_agent_sessions(start - FORGET_AFTER_MS.max(4 * self.config.gone_after_ms)).await {
                Ok(n) if n > 0 => tracing::debug!(sessions = n, "forgot agent sessions nobody heard for long"),
                Ok(_) => {}
                Err(e) => tracing::debug!(error = %e, "old agent sessions not forgotten; trying again later"),
            }
        }
        let mut sync = self.synced.lock().unwrap_or_else(PoisonError::into_inner);
        if forget {
            sync.forgotten_at = Some(start);
        }
        sync.at = Some(start);
        // Rows are stamped by the writing node's clock at its sync; reading back over two
        // lags covers a slow writer and a little clock skew.
        sync.read_from = Some(start - 2 * self.config.remote_lag_ms.max(1_000));
        Ok(())
    }

    /// Syncs every `every` until shutdown (several nodes only). Until the first sync
    /// succeeds, no agent is called gone and no session quiet on this node.
    pub fn spawn_sync(
        self: &Arc<Self>,
        store: Arc<dyn Store>,
        node_id: String,
        every: std::time::Duration,
        signals: Arc<crate::StoreSignals>,
    ) -> tokio::task::JoinHandle<()> {
        self.synced.lock().unwrap_or_else(PoisonError::into_inner).on = true;
        let this = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        if let Err(e) = this.sync_once(store.as_ref(), &node_id).await {
                            tracing::warn!(error = %e, "agent registry sync failed; agents are not called gone until it works again");
                        }
                    }
                    _ = signals.shutdown() => return,
                }
            }
        })
    }

    /// Turns the sync requirement on without spawning (tests drive `sync_once` by hand).
    pub fn expect_sync(&self) {
        self.synced.lock().unwrap_or_else(PoisonError::into_inner).on = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn registry() -> (Arc<ManualClock>, Arc<AgentRegistry>) {
        let clock = Arc::new(ManualClock::new(1_000_000));
        let r = AgentRegistry::new(
            clock.clone(),
            RegistryConfig { gone_after_ms: 60_000, takeover_quiet_ms: 3_000, remote_lag_ms: 0 },
        );
        (clock, r)
    }

    #[test]
    fn an_agent_whose_acks_reach_a_restarted_broker_before_its_polls_is_not_gone() {
        // A broker process that has been up past the gone time and has never seen a poll
        // of agent b: b is gone, unless its acks (which may take its next jobs) arrive.
        let (clock, r) = registry();
        clock.advance(59_000);
        r.heard("t", "s", "b", Some("old"));
        clock.advance(2_000);
        let seen_by_a = r.holder("t", "s", "b", Some("old"), Some(("a", Some("x"))));
        assert_eq!(seen_by_a, Holder::Other { gone: false }, "acked 2 s ago");
        clock.advance(60_000);
        let seen_by_a = r.holder("t", "s", "b", Some("old"), Some(("a", Some("x"))));
        assert_eq!(seen_by_a, Holder::Other { gone: true }, "silent for the gone time");
        // An ack of an unknown session decides nothing about which session is current.
        assert_eq!(r.is_superseded("t", "s", "b", Some("old")), None);
    }

    #[test]
    fn sent_to_names_the_claimant_and_reads_what_earlier_versions_wrote() {
        assert_eq!(Claimant::agent("a1", Some("s")).sent_to(), "agent:a1");
        assert_eq!(Claimant::push("webhook").sent_to(), "push:webhook");
        assert_eq!(Claimant::holder_of("agent:a1"), (ClaimantKind::Agent, "a1"));
        assert_eq!(Claimant::holder_of("push:webhook"), (ClaimantKind::Push, "webhook"));
        assert_eq!(Claimant::holder_of("webhook"), (ClaimantKind::Push, "webhook"));
        assert_eq!(Claimant::holder_of("a1"), (ClaimantKind::Agent, "a1"));
        assert_eq!(session_started_at(&new_session_id(0x1234_5678_9abc, 7)), Some(0x1234_5678_9abc));
        assert_eq!(session_started_at("s0123"), None);
    }

    #[test]
    fn push_runs_name_their_lease_token() {
        let c = Claimant::push_run("webhook", 42);
        assert_eq!((c.sent_to(), c.session.as_deref()), ("push:webhook".to_owned(), Some("run:42")));
        assert_eq!(Claimant::run_token(c.session.as_deref()), Some(42));
        // Deliveries of a broker before leases carry "push": no token, an earlier run's.
        assert_eq!(Claimant::run_token(Claimant::push("webhook").session.as_deref()), None);
        assert_eq!(Claimant::run_token(Some("run:x")), None);
    }

    #[test]
    fn a_restart_takes_over_once_the_old_process_is_quiet() {
        let (clock, r) = registry();
        let old = new_session_id(1, 1);
        let new = new_session_id(2, 2);
        drop(r.begin_poll("t", "s", "a", Some(&old), None).expect("first"));
        clock.advance(500);
        let _poll = r.begin_poll("t", "s", "a", Some(&new), None).expect("a newer process wins");
        assert_eq!(
            r.holder("t", "s", "a", Some(&old), Some(("a", Some(&new)))),
            Holder::EarlierSession { quiet: false }
        );
        clock.advance(2_500);
        assert_eq!(
            r.holder("t", "s", "a", Some(&old), Some(("a", Some(&new)))),
            Holder::EarlierSession { quiet: true }
        );
        assert_eq!(r.holder("t", "s", "a", Some(&new), Some(("a", Some(&new)))), Holder::Me);
    }

    #[test]
    fn a_second_live_process_is_fenced_and_keeps_its_deliveries_while_it_talks() {
        let (clock, r) = registry();
        let old = new_session_id(1, 1);
        let new = new_session_id(2, 2);
        let _old_poll = r.begin_poll("t", "s", "a", Some(&old), Some(1_000)).expect("first");
        let _new_poll = r.begin_poll("t", "s", "a", Some(&new), Some(10)).expect("newer wins");
        // The old process is still polling: it is told to stop, and holds on to its work.
        let e = r.begin_poll("t", "s", "a", Some(&old), Some(1_000)).err().expect("fenced");
        assert_eq!(e.newer, new);
        assert!(r.is_superseded("t", "s", "a", Some(&old)).is_some());
        clock.advance(10_000);
        assert_eq!(
            r.holder("t", "s", "a", Some(&old), Some(("a", Some(&new)))),
            Holder::EarlierSession { quiet: false }
        );
        // An older process that starts polling only now (it has run for a minute) is
        // refused too.
        let older = new_session_id(0, 3);
        assert!(r.begin_poll("t", "s", "a", Some(&older), Some(60_000)).is_err());
    }

    /// The shop PC's wall clock never orders sessions. The first process ran with its
    /// clock an hour ahead (its session id says so); once the clock is corrected, the
    /// restarted process names an earlier time, and it is still the newer session.
    #[test]
    fn session_order_is_the_brokers_not_the_shop_pcs_clock() {
        let (clock, r) = registry();
        let hour = 3_600_000;
        let ahead = new_session_id(clock.now_ms() + hour, 1);
        drop(r.begin_poll("t", "s", "a", Some(&ahead), Some(2_000)).expect("first"));
        clock.advance(30_000);
        let corrected = new_session_id(clock.now_ms() - 500, 2);
        let poll = r.begin_poll("t", "s", "a", Some(&corrected), Some(500)).expect("the restart is the newer process");
        assert!(poll.took_over);
        assert!(r.is_superseded("t", "s", "a", Some(&ahead)).is_some());
        assert!(r.begin_poll("t", "s", "a", Some(&ahead), Some(32_000)).is_err(), "the earlier process is fenced");
        // And the other way round: a clock set back an hour changes nothing either.
        clock.advance(30_000);
        let behind = new_session_id(clock.now_ms() - hour, 3);
        assert!(r.begin_poll("t", "s", "a", Some(&behind), Some(100)).is_ok());
        assert!(r.is_superseded("t", "s", "a", Some(&corrected)).is_some());
    }

    #[test]
    fn unknown_agents_are_not_gone_until_the_broker_has_been_up_long_enough() {
        let (clock, r) = registry();
        let _b = r.begin_poll("t", "s", "b", Some("x"), None).expect("b polls");
        // Agent a held a delivery before a broker restart and has not polled yet.
        assert_eq!(r.holder("t", "s", "a", Some("sa"), None), Holder::Other { gone: false });
        clock.advance(60_001);
        assert_eq!(r.holder("t", "s", "a", Some("sa"), None), Holder::Other { gone: true });
    }
}
