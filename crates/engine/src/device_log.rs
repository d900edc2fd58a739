//! The device log digest: what a store agent's journal says of each task in the
//! end, uploaded with `POST /v1/agent/journal-digest` and compared with the broker's own
//! state in the store's reconciliation report ([`crate::reconcile`]).
//!
//! The digest changes no task. A printer's confirmation reaches the broker as an ack; the
//! digest is the agent's second account of the same facts, kept so that a day's report can
//! show where the two disagree (an ack lost for good, a task printed on the shop's LAN the
//! broker never heard of, a journal that lost a record).

use onceprint_core::{validate_id, CoreError, Millis, TaskId};
use onceprint_store::{AgentIdentity, DeviceLogRecord, DeviceLogState, Store, StoreError};

/// Most records in one upload (the wire format's limit).
pub const MAX_RECORDS: usize = 5000;

/// Longest accepted idempotency key: a `biz_no` of 128 bytes with every character escaped
/// takes 384, a printer id 64, and the suffixes of a reprint of a station task with a print
/// type of its own about 200 more; the bound leaves room and still refuses garbage.
pub const MAX_KEY_LEN: usize = 1024;

/// One record as the agent sends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DigestRecord {
    pub task_id: String,
    pub key: String,
    pub printer_id: String,
    pub state: String,
    pub at: Millis,
}

/// What an upload did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DigestAccepted {
    /// Records in the upload, all of them checked and taken into account.
    pub accepted: u64,
    /// Stored records that the upload added or replaced with a later one; 0 for an upload
    /// the broker had already seen.
    pub changed: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum DigestError {
    /// The upload is malformed; nothing of it was stored.
    #[error(transparent)]
    Invalid(#[from] CoreError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Checks every record of an upload before anything is stored, so that an upload is taken
/// whole or refused whole (the agent sends it again unchanged after fixing nothing, so a
/// partly stored upload would only hide the problem). Returns each record's state.
fn check(agent_id: &str, records: &[DigestRecord]) -> Result<Vec<DeviceLogState>, CoreError> {
    validate_id("agent_id", agent_id)?;
    if records.len() > MAX_RECORDS {
        return Err(CoreError::invalid(
            "records",
            format!("at most {MAX_RECORDS} per request, got {}; send the rest in another request", records.len()),
        ));
    }
    let mut states = Vec::with_capacity(records.len());
    for (i, r) in records.iter().enumerate() {
        if TaskId::parse(&r.task_id).is_none() {
            return Err(CoreError::invalid(
                format!("records[{i}].task_id"),
                format!("{:?} is not a task id (26 characters of Crockford base32)", r.task_id),
            ));
        }
        // Characters, as the OpenAPI document's `maxLength` counts them.
        if r.key.trim().is_empty() || r.key.chars().count() > MAX_KEY_LEN || r.key.chars().any(char::is_control) {
            return Err(CoreError::invalid(
                format!("records[{i}].key"),
                format!("must be 1 to {MAX_KEY_LEN} characters without control characters, not blank"),
            ));
        }
        validate_id(&format!("records[{i}].printer_id"), &r.printer_id)?;
        let state = DeviceLogState::parse(&r.state).ok_or_else(|| {
            CoreError::invalid(
                format!("records[{i}].state"),
                format!("{:?} is not one of {}", r.state, DeviceLogState::ALL.map(DeviceLogState::as_str).join(", ")),
            )
        })?;
        if r.at < 0 {
            return Err(CoreError::invalid(format!("records[{i}].at"), "must be milliseconds since the epoch"));
        }
        states.push(state);
    }
    Ok(states)
}

/// Stores an upload of the agent `who` (its token's tenant and store) for its store, after
/// checking all of it. Records are kept per (tenant, store, task id), the latest winning
/// ([`DeviceLogRecord::supersedes`]), so an upload sent again changes nothing.
///
/// The records are not checked against the broker's tasks or printers: the device log is
/// the device's account, and a task or printer the broker does not know is exactly the
/// kind of difference reconciliation must show. They are only ever read back for the
/// agent's own store, so naming another store's task reveals and changes nothing.
pub async fn accept_digest(
    store: &dyn Store,
    who: &AgentIdentity,
    agent_id: &str,
    records: &[DigestRecord],
    now: Millis,
) -> Result<DigestAccepted, DigestError> {
    let states = check(agent_id, records)?;
    let rows: Vec<DeviceLogRecord> = records
        .iter()
        .zip(states)
        .map(|(r, state)| DeviceLogRecord {
            tenant_id: who.tenant_id.clone(),
            store_id: who.store_id.clone(),
            task_id: r.task_id.clone(),
            key: r.key.clone(),
            printer_id: r.printer_id.clone(),
            state,
            at: r.at,
            agent_id: agent_id.to_owned(),
            received_at: now,
        })
        .collect();
    let changed = store.put_device_log(&rows).await?;
    Ok(DigestAccepted { accepted: records.len() as u64, changed })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok() -> DigestRecord {
        DigestRecord {
            task_id: TaskId::from_parts(1_764_650_000_000, [7; 10]).into_string(),
            key: "A1#p1".into(),
            printer_id: "p1".into(),
            state: "printed".into(),
            at: 1_764_650_000_300,
        }
    }

    #[test]
    fn uploads_are_checked_field_by_field() {
        assert!(check("a1", &[ok()]).is_ok());
        assert!(check("a1", &[]).is_ok());
        let field = |r: DigestRecord| match check("a1", &[ok(), r]) {
            Err(CoreError::Invalid { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(field(DigestRecord { task_id: "T1".into(), ..ok() }), "records[1].task_id");
        assert_eq!(field(DigestRecord { task_id: ok().task_id.to_lowercase(), ..ok() }), "records[1].task_id");
        assert_eq!(field(DigestRecord { key: String::new(), ..ok() }), "records[1].key");
        assert_eq!(field(DigestRecord { key: "  ".into(), ..ok() }), "records[1].key");
        assert_eq!(field(DigestRecord { key: "a\nb".into(), ..ok() }), "records[1].key");
        assert_eq!(field(DigestRecord { key: "k".repeat(MAX_KEY_LEN + 1), ..ok() }), "records[1].key");
        assert!(check("a1", &[DigestRecord { key: "k".repeat(MAX_KEY_LEN), ..ok() }]).is_ok());
        assert_eq!(field(DigestRecord { printer_id: "p 1".into(), ..ok() }), "records[1].printer_id");
        assert_eq!(field(DigestRecord { state: "started".into(), ..ok() }), "records[1].state");
        assert_eq!(field(DigestRecord { at: -1, ..ok() }), "records[1].at");
        for state in ["printed", "in_doubt", "failed"] {
            assert!(check("a1", &[DigestRecord { state: state.into(), ..ok() }]).is_ok(), "{state}");
        }
        assert!(matches!(check("", &[ok()]), Err(CoreError::Invalid { field, .. }) if field == "agent_id"));
        assert!(check("a1", &vec![ok(); MAX_RECORDS]).is_ok());
        assert!(
            matches!(check("a1", &vec![ok(); MAX_RECORDS + 1]), Err(CoreError::Invalid { field, .. }) if field == "records")
        );
    }
}
