//! The offline side of the agent: the local lane that prints tasks accepted on the LAN
//! while the broker was unreachable (through the same per-printer workers and journal as
//! the broker's deliveries), the routing of their outcomes to the outbox instead of the
//! broker, the upload of those tasks once the broker answers again, and the device-log
//! digest of the journal.
//!
//! The agent decides retries only here, and only for what it accepted itself while it
//! could not ask: a printer that says it cannot print (no paper, cover open, offline,
//! jam) gets the task again after a pause; anything that may have printed is never tried
//! again (in doubt, for a person). A task not printed when the broker answers again is
//! handed over and prints only through the broker from then on.

use crate::broker::BrokerClient;
use crate::cache::OfflineCache;
use crate::journal::{Journal, RecordState};
use crate::outbox::{HistoryEntry, LocalState, OfflineTask, Outbox};
use crate::protocol::{Ack, Delivery, Outcome};
use crate::upstream::Upstream;
use crate::worker::Feeder;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch, Notify};

/// How often the local lane looks for tasks whose pause is over.
const LANE_TICK: Duration = Duration::from_secs(1);
/// How often the sync loop looks for offline tasks to upload.
const SYNC_TICK: Duration = Duration::from_secs(2);
/// Tasks per upload.
const SYNC_BATCH: usize = 200;
/// Records per digest upload.
const DIGEST_BATCH: usize = 5000;
/// The longest pause before a printer that could not print is tried again.
const MAX_PAUSE_MS: i64 = 30_000;

/// The (task id, attempt) pairs given to the workers by the local lane: their acks go to
/// the outbox, every other ack to the broker.
pub(crate) type LocalAttempts = Arc<Mutex<HashSet<(String, u32)>>>;

/// Gives due offline tasks to their printers' workers until `stopping`.
pub(crate) async fn run_local_lane(
    outbox: Outbox,
    cache: OfflineCache,
    feeder: Feeder,
    local: LocalAttempts,
    wake: Arc<Notify>,
    mut stopping: watch::Receiver<bool>,
) {
    loop {
        if *stopping.borrow() {
            return;
        }
        match outbox.due(crate::lan::now_ms()).await {
            Ok(due) => {
                for t in due {
                    dispatch_one(&outbox, &cache, &|d| feeder.dispatch(d), &local, t).await;
                }
            }
            Err(e) => tracing::error!(error = %e, "offline outbox: cannot read due tasks"),
        }
        tokio::select! {
            _ = stopping.changed() => {}
            _ = wake.notified() => {}
            _ = tokio::time::sleep(LANE_TICK) => {}
        }
    }
}

/// Hands the offline task `t` to its printer's worker through `dispatch` (unless it is
/// already with it), or fails it when it cannot be printed at all.
pub(crate) async fn dispatch_one(
    outbox: &Outbox,
    cache: &OfflineCache,
    dispatch: &(dyn Fn(Delivery) + std::marker::Sync),
    local: &LocalAttempts,
    t: OfflineTask,
) {
    let in_worker = |attempt: u32| local.lock().map(|l| l.contains(&(t.task_id.clone(), attempt))).unwrap_or(true);
    let attempt = match t.state {
        // Left `printing` by a crash (or still with its worker): once per process, with
        // the same attempt, so the journal answers for what may have happened.
        LocalState::Printing if in_worker(t.attempt) => return,
        LocalState::Printing => t.attempt,
        _ => match outbox.start(&t.task_id).await {
            Ok(Some(a)) => a,
            Ok(None) => return,
            Err(e) => {
                tracing::error!(task_id = %t.task_id, error = %e, "offline outbox: cannot start the task");
                return;
            }
        },
    };
    let directory = cache.directory();
    let limits = directory.as_ref().map(|d| d.content_limits()).unwrap_or_default();
    let printer = directory.and_then(|d| d.printers.into_iter().find(|p| p.printer_id == t.printer_id));
    let Some(printer) = printer else {
        let why = format!("printer {:?} is no longer in the store's directory", t.printer_id);
        return fail_before_printing(outbox, &t, attempt, &why).await;
    };
    let data = match render(&t, printer.profile.as_deref(), limits) {
        Ok(d) => d,
        Err(why) => return fail_before_printing(outbox, &t, attempt, &format!("cannot render: {why}")).await,
    };
    if let Ok(mut l) = local.lock() {
        l.insert((t.task_id.clone(), attempt));
    }
    let delivery = Delivery {
        task_id: t.task_id.clone(),
        attempt,
        printer_id: printer.printer_id.clone(),
        printer_address: printer.printer_address.clone(),
        idempotency_key: t.delivery_key.clone(),
        content_type: "escpos".into(),
        data: base64::engine::general_purpose::STANDARD.encode(data),
        reprint: false,
    };
    tracing::info!(task_id = %t.task_id, attempt, printer_id = %printer.printer_id, "printing an offline task");
    dispatch(delivery);
}

/// The ESC/POS bytes of an offline task, rendered as the broker renders them, within the
/// broker's content limits (those it was accepted under).
fn render(t: &OfflineTask, profile: Option<&str>, limits: onceprint_core::ContentLimits) -> Result<Vec<u8>, String> {
    let value: serde_json::Value = serde_json::from_str(&t.request).map_err(|e| e.to_string())?;
    let content: onceprint_core::Content =
        serde_json::from_value(value.get("content").cloned().unwrap_or_default()).map_err(|e| e.to_string())?;
    let canonical = content.canonicalize(limits).map_err(|e| e.to_string())?;
    let (bytes, _warnings) =
        onceprint_render::stored::escpos_for(canonical.content_type, canonical.bytes, None, profile)?;
    Ok(bytes)
}

async fn fail_before_printing(outbox: &Outbox, t: &OfflineTask, attempt: u32, why: &str) {
    let entry = HistoryEntry { at: crate::lan::now_ms(), attempt, state: "error".into(), detail: why.into() };
    if let Err(e) = outbox.finish(&t.task_id, attempt, LocalState::Failed, 0, entry).await {
        tracing::error!(task_id = %t.task_id, error = %e, "offline outbox: cannot record the failure");
    }
}

/// Routes the workers' acks: those of the local lane's attempts to the outbox, the others
/// to the broker's ack sender. Ends when every worker is gone.
pub(crate) async fn route_acks(
    mut from_workers: mpsc::UnboundedReceiver<Ack>,
    to_broker: mpsc::UnboundedSender<Ack>,
    outbox: Outbox,
    local: LocalAttempts,
    wake: Arc<Notify>,
) {
    while let Some(ack) = from_workers.recv().await {
        let mine = local.lock().map(|mut l| l.remove(&(ack.task_id.clone(), ack.attempt))).unwrap_or(false);
        if !mine {
            if to_broker.send(ack).is_err() {
                tracing::error!("ack queue closed; the broker will redeliver and the journal will answer");
            }
            continue;
        }
        route_local_ack(&outbox, ack, &wake).await;
    }
}

/// Records the outcome of a local lane's attempt in the outbox: printed, in doubt or
/// failed for good, or (nothing came out) due again after a pause.
pub(crate) async fn route_local_ack(outbox: &Outbox, ack: Ack, wake: &Notify) {
    let now = crate::lan::now_ms();
    let (to, retry_at) = match ack.outcome {
        Outcome::Printed => (LocalState::Printed, 0),
        Outcome::InDoubt => (LocalState::InDoubt, 0),
        Outcome::Error => (LocalState::Failed, 0),
        // Nothing came out: try again after a pause that grows with the attempts.
        _ => {
            let pause = (1000i64 << ack.attempt.min(5).saturating_sub(1)).min(MAX_PAUSE_MS);
            (LocalState::Accepted, now + pause)
        }
    };
    let entry = HistoryEntry { at: now, attempt: ack.attempt, state: ack.outcome.as_str().into(), detail: ack.detail };
    match outbox.finish(&ack.task_id, ack.attempt, to, retry_at, entry).await {
        Ok(_) => {
            if to == LocalState::Accepted {
                wake.notify_one();
            }
        }
        Err(e) => tracing::error!(task_id = %ack.task_id, error = %e, "offline outbox: cannot record the outcome"),
    }
}

/// One task of `POST /v1/agent/offline-tasks`.
#[derive(Debug, Serialize)]
struct UploadTask {
    task_id: String,
    biz_no: serde_json::Value,
    printer_id: serde_json::Value,
    station_id: serde_json::Value,
    print_type: String,
    content: serde_json::Value,
    accepted_at: i64,
    lan_key_id: String,
    printed_on: String,
    outcome: &'static str,
    attempts: u32,
    detail: String,
    history: Vec<HistoryEntry>,
    /// How long ago the task was accepted by the machine's clock since boot, when it was
    /// accepted in this boot (agent protocol 4).
    #[serde(skip_serializing_if = "Option::is_none")]
    age_ms: Option<i64>,
}

#[derive(Debug, Serialize)]
struct UploadRequest<'a> {
    agent_id: &'a str,
    /// This agent's clock now (agent protocol 4), so the broker can tell how far off it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    sent_at: Option<i64>,
    tasks: Vec<UploadTask>,
}

#[derive(Debug, Deserialize)]
struct UploadResult {
    task_id: String,
    result: String,
    #[serde(default)]
    broker_task_id: Option<String>,
    #[serde(default)]
    detail: Option<String>,
}

#[derive(Debug, Deserialize)]
struct UploadAnswer {
    #[serde(default)]
    results: Vec<UploadResult>,
}

fn upload_task(t: OfflineTask, protocol_4: bool) -> UploadTask {
    let (origin, clock_ms) = crate::boot_clock();
    let age_ms = (protocol_4 && !t.clock_origin.is_empty() && t.clock_origin == origin)
        .then_some(clock_ms - t.clock_ms)
        .filter(|age| *age >= 0);
    let value: serde_json::Value = serde_json::from_str(&t.request).unwrap_or_default();
    let outcome = match t.state {
        LocalState::Printed => "printed",
        LocalState::InDoubt => "in_doubt",
        LocalState::Failed => "failed",
        _ => "pending",
    };
    UploadTask {
        task_id: t.task_id,
        biz_no: value.get("biz_no").cloned().unwrap_or_default(),
        printer_id: value.get("printer_id").cloned().unwrap_or_default(),
        station_id: value.get("station_id").cloned().unwrap_or_default(),
        print_type: t.print_type,
        content: value.get("content").cloned().unwrap_or_default(),
        accepted_at: t.accepted_at,
        lan_key_id: t.lan_key_id,
        printed_on: t.printer_id,
        outcome,
        attempts: t.attempt,
        detail: t.detail,
        history: t.history,
        age_ms,
    }
}

/// What the upload of offline tasks needs; shared by the sync loop and the poll loop.
#[derive(Clone)]
pub(crate) struct Sync {
    pub client: BrokerClient,
    pub agent_id: String,
    pub outbox: Outbox,
    pub cache: OfflineCache,
    /// One upload at a time: the poll loop's and the sync loop's must not interleave.
    pub running: Arc<tokio::sync::Mutex<()>>,
}

impl Sync {
    /// Uploads what the broker does not have yet, if anything. The poll loop calls this
    /// before every poll, so that once the broker is back it learns what was printed
    /// offline before it hands out a cloud task of the same key (the journal's key check
    /// would still keep that from printing twice, but the broker could not tell a
    /// conflict under one key from a repeat).
    pub(crate) async fn pending(&self) {
        match self.outbox.unsynced().await {
            Ok(0) => {}
            Ok(_) => {
                let _one = self.running.lock().await;
                sync_once(&self.client, &self.agent_id, &self.outbox, &self.cache).await
            }
            Err(e) => tracing::error!(error = %e, "offline outbox: cannot count the tasks to sync"),
        }
    }
}

/// Uploads offline tasks while the broker answers, until `stopping` (after one last try).
pub(crate) async fn run_sync(sync: Sync, mut stopping: watch::Receiver<bool>) {
    loop {
        sync.pending().await;
        if *stopping.borrow() {
            return;
        }
        tokio::select! {
            _ = stopping.changed() => {}
            _ = tokio::time::sleep(SYNC_TICK) => {}
        }
    }
}

pub(crate) async fn sync_once(client: &dyn Upstream, agent_id: &str, outbox: &Outbox, cache: &OfflineCache) {
    // Only once the broker answers is anything handed over: a task marked for the broker
    // no longer prints here.
    if cache.refresh(client).await.is_err() {
        return;
    }
    loop {
        let (batch, handed_now) = match outbox.take_for_sync_marked(SYNC_BATCH).await {
            Ok((b, _)) if b.is_empty() => return,
            Ok(b) => b,
            Err(e) => {
                tracing::error!(error = %e, "offline outbox: cannot read the tasks to sync");
                return;
            }
        };
        // The broker takes at most 1 MiB per request: a batch of large tickets goes in
        // several requests.
        let protocol_4 = client.speaks(4);
        let chunks = chunks_by_size(batch.into_iter().map(|t| upload_task(t, protocol_4)).collect(), MAX_BODY_BYTES);
        // What goes back to the local lane should the upload fail: only what this round
        // handed over. A task handed to an earlier upload whose answer was lost stays with
        // the broker, which may have it, whatever becomes of this upload.
        let mut left: Vec<String> =
            chunks.iter().flatten().map(|t| t.task_id.clone()).filter(|id| handed_now.contains(id)).collect();
        let mut failed = false;
        for chunk in chunks {
            let ids: Vec<String> = chunk.iter().map(|t| t.task_id.clone()).collect();
            let sent_at = client.speaks(4).then(crate::lan::now_ms);
            let body = UploadRequest { agent_id, sent_at, tasks: chunk };
            let posted = crate::upstream::post::<UploadAnswer>(
                client,
                "/v1/agent/offline-tasks",
                &body,
                Duration::from_secs(30),
            );
            match posted.await {
                Ok(answer) => {
                    let mut done = Vec::with_capacity(answer.results.len());
                    for r in answer.results {
                        if r.result == "rejected" {
                            tracing::error!(task_id = %r.task_id, detail = ?r.detail, "the broker could not take an offline task; it is kept here (LAN /healthz: offline_tasks_rejected) and, if it did not print, it does not print: a person decides");
                        } else if r.result == "conflict" {
                            tracing::warn!(task_id = %r.task_id, result = %r.result, detail = ?r.detail, "offline task synced: the broker could not take it as it was");
                        } else {
                            tracing::info!(task_id = %r.task_id, result = %r.result, broker_task_id = ?r.broker_task_id, "offline task synced");
                        }
                        done.push((r.task_id, r.result, r.broker_task_id));
                    }
                    let answered: HashSet<String> = done.iter().map(|d| d.0.clone()).collect();
                    left.retain(|id| !answered.contains(id));
                    if let Err(e) = outbox.synced(done).await {
                        tracing::error!(error = %e, "offline outbox: cannot record the sync; it is sent again");
                    }
                    if ids.iter().any(|id| !answered.contains(id)) {
                        failed = true;
                        break;
                    }
                }
                Err(e) if e.answer_lost() => {
                    // The broker may have taken these and given them to a printer (or a
                    // person may have moved them): printing them here as well could make a
                    // second copy. They stay handed to the broker, print only through it,
                    // and go in the next upload, whose answer is the first one's.
                    tracing::warn!(error = %e, tasks = ids.len(), "the upload of offline tasks got no answer; the broker may have taken them: they wait for its answer and do not print here");
                    left.retain(|id| !ids.contains(id));
                    failed = true;
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not upload offline tasks; trying again");
                    failed = true;
                    break;
                }
            }
        }
        if !left.is_empty() {
            if let Err(e) = outbox.sync_failed(left).await {
                tracing::error!(error = %e, "offline outbox: cannot give the tasks back to the local lane");
            }
            return;
        }
        if failed {
            return;
        }
    }
}

/// The broker's body limit (1 MiB), with room for the envelope.
const MAX_BODY_BYTES: usize = 900 * 1024;

/// `items` in consecutive groups whose JSON stays under `max_bytes` (an item larger than
/// that goes alone: the broker then says what it thinks of it).
fn chunks_by_size<T: Serialize>(items: Vec<T>, max_bytes: usize) -> Vec<Vec<T>> {
    let mut out: Vec<Vec<T>> = Vec::new();
    let mut size = 0;
    for item in items {
        let n = serde_json::to_vec(&item).map(|v| v.len() + 1).unwrap_or(0);
        match out.last_mut() {
            Some(last) if !last.is_empty() && size + n <= max_bytes => {
                size += n;
                last.push(item);
            }
            _ => {
                size = n;
                out.push(vec![item]);
            }
        }
    }
    out
}

/// One record of `POST /v1/agent/journal-digest`.
#[derive(Debug, Serialize)]
struct DigestRecord {
    task_id: String,
    key: String,
    printer_id: String,
    state: &'static str,
    at: i64,
}

#[derive(Debug, Serialize)]
struct DigestRequest<'a> {
    agent_id: &'a str,
    records: &'a [DigestRecord],
}

/// The printer id inside a delivery key (`biz_no#printer_id…`; a `#` in the business
/// number is written `%23`, so the first `#` ends it).
fn printer_of_key(key: &str) -> Option<&str> {
    let rest = key.split_once('#')?.1;
    Some(rest.split('#').next().unwrap_or(rest)).filter(|p| !p.is_empty())
}

/// Uploads the journal's latest record per task every `every` (the device log the store's
/// reconciliation compares with the broker's), until `stopping`; answers the mark to send
/// the final digest from ([`send_final_digest`], once the prints in flight have ended).
pub(crate) async fn run_digest(
    client: BrokerClient,
    agent_id: String,
    journal: Arc<Journal>,
    every: Duration,
    mut stopping: watch::Receiver<bool>,
) -> u64 {
    let mut mark = 0u64;
    loop {
        mark = send_digest(&client, &agent_id, &journal, mark, Duration::from_secs(10)).await;
        tokio::select! {
            _ = stopping.changed() => {}
            _ = tokio::time::sleep(every) => {}
        }
        if *stopping.borrow() {
            return mark;
        }
    }
}

/// The digest sent at shutdown, after the last prints ended: what printed just before
/// the agent stopped is in the device log without waiting for its next start.
pub(crate) async fn send_final_digest(client: &BrokerClient, agent_id: &str, journal: &Journal, mark: u64) {
    let next = send_digest(client, agent_id, journal, mark, FINAL_DIGEST_TIMEOUT).await;
    if next == mark && !journal.latest_since(mark).0.is_empty() {
        tracing::warn!("could not send the device-log digest at shutdown; it goes at the next start");
    }
}

/// How long the digest sent at shutdown may take per request: a broker that does not
/// answer must not hold the agent's exit for long (the next start sends it all again).
const FINAL_DIGEST_TIMEOUT: Duration = Duration::from_secs(3);

/// Sends the journal's records since `mark`; answers the mark to send from next time
/// (unchanged when a request failed, so nothing is skipped).
async fn send_digest(client: &BrokerClient, agent_id: &str, journal: &Journal, mark: u64, timeout: Duration) -> u64 {
    let (records, next) = journal.latest_since(mark);
    let digest: Vec<DigestRecord> = records
        .into_iter()
        .filter_map(|r| {
            let printer_id = printer_of_key(&r.key)?.to_owned();
            let state = match r.state {
                RecordState::Printed => "printed",
                RecordState::Started | RecordState::InDoubt => "in_doubt",
                _ => "failed",
            };
            let at = time::OffsetDateTime::parse(&r.at, &time::format_description::well_known::Rfc3339)
                .map(|t| (t.unix_timestamp_nanos() / 1_000_000) as i64)
                .unwrap_or(0);
            Some(DigestRecord { task_id: r.task_id, key: r.key, printer_id, state, at })
        })
        .collect();
    let mut chunks: Vec<Vec<DigestRecord>> = Vec::new();
    for part in chunks_by_size(digest, MAX_BODY_BYTES) {
        let mut part = part.into_iter().peekable();
        while part.peek().is_some() {
            chunks.push(part.by_ref().take(DIGEST_BATCH).collect());
        }
    }
    for chunk in &chunks {
        let body = DigestRequest { agent_id, records: chunk };
        if let Err(e) = client.post_json::<serde_json::Value>("/v1/agent/journal-digest", &body, timeout).await {
            tracing::debug!(error = %e, "could not upload the device-log digest; trying again later");
            return mark;
        }
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::BrokerError;

    #[test]
    fn uploads_are_split_under_the_body_limit() {
        let items: Vec<String> = (0..10).map(|i| format!("{i:0>100}")).collect();
        let chunks = chunks_by_size(items.clone(), 310);
        assert_eq!(chunks.iter().map(Vec::len).collect::<Vec<_>>(), [3, 3, 3, 1]);
        assert_eq!(chunks.concat(), items, "in order, nothing lost");
        assert_eq!(chunks_by_size(vec!["x".repeat(500)], 310).len(), 1, "a large item goes alone");
    }

    /// A broker behind the upload whose answers are scripted: the directory and keys
    /// answer, each upload takes the next of `uploads`.
    struct Scripted {
        uploads: Mutex<Vec<BrokerError>>,
    }

    #[async_trait::async_trait]
    impl Upstream for Scripted {
        async fn forward_submission(
            &self,
            _: Vec<u8>,
            _: Option<&str>,
            _: Duration,
        ) -> Result<crate::broker::Forwarded, BrokerError> {
            Err(BrokerError::Unreachable("not in this test".into()))
        }

        async fn get_value(&self, path: &str) -> Result<serde_json::Value, BrokerError> {
            Ok(match path {
                "/v1/agent/directory" => serde_json::json!({"store_id": "s1"}),
                _ => serde_json::json!({"keys": []}),
            })
        }

        async fn post_value(
            &self,
            _: &str,
            _: serde_json::Value,
            _: Duration,
        ) -> Result<serde_json::Value, BrokerError> {
            let next = self.uploads.lock().ok().and_then(|mut u| (!u.is_empty()).then(|| u.remove(0)));
            Err(next.unwrap_or(BrokerError::Unreachable("no more answers".into())))
        }

        fn speaks(&self, _: u32) -> bool {
            true
        }

        fn reachability(&self) -> crate::broker::Reachability {
            crate::broker::Reachability { reachable: None, last_answer_ago: None, last_error: None }
        }
    }

    #[tokio::test]
    async fn a_refused_upload_leaves_with_the_broker_what_an_upload_whose_answer_was_lost_handed_it() {
        let dir = tempfile::tempdir().expect("dir");
        let outbox = Outbox::open(dir.path()).expect("outbox");
        let task = OfflineTask {
            task_id: "01J0000000000000000000000A".into(),
            target: "printer:p1".into(),
            biz_no: "A1".into(),
            print_type: "receipt".into(),
            fingerprint: "f".into(),
            request: r#"{"biz_no":"A1","printer_id":"p1","content":{"type":"text","text":"x"}}"#.into(),
            printer_id: "p1".into(),
            delivery_key: "A1#p1".into(),
            lan_key_id: "k1".into(),
            accepted_at: 1,
            state: LocalState::Accepted,
            attempt: 0,
            next_at: 1,
            detail: String::new(),
            history: Vec::new(),
            synced: false,
            clock_origin: String::new(),
            clock_ms: 0,
        };
        outbox.insert(task).await.expect("insert");
        let cache = OfflineCache::load(dir.path(), None);
        // The first upload reaches the broker and its answer is lost; the next is refused.
        let broker = Scripted {
            uploads: Mutex::new(vec![
                BrokerError::Transport("connection reset".into()),
                BrokerError::Status { status: 503, body: String::new() },
            ]),
        };
        sync_once(&broker, "agent-1", &outbox, &cache).await;
        sync_once(&broker, "agent-1", &outbox, &cache).await;
        // The broker may have the ticket (and a person may have moved it): it must not
        // print here, and it goes in the next upload.
        assert_eq!(outbox.start("01J0000000000000000000000A").await.ok(), Some(None), "still with the broker");
        assert_eq!(outbox.unsynced().await.ok(), Some(1));
    }

    #[test]
    fn the_printer_is_read_from_the_delivery_key() {
        assert_eq!(printer_of_key("A1#p1"), Some("p1"));
        assert_eq!(printer_of_key("A%231#p1#type=kitchen"), Some("p1"));
        assert_eq!(printer_of_key("A1#p1#station=s"), Some("p1"));
        assert_eq!(printer_of_key("A1"), None);
    }
}
