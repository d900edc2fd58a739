//! The journal on real files: reopen, torn tails, compaction, group commit.

use onceprint_agent::journal::{Journal, JournalError, Record, RecordState, FILE_NAME};
use std::io::Write;
use std::sync::Arc;

fn rec(task: &str, attempt: u32, state: RecordState) -> Record {
    Record::new(task, attempt, state, "test")
}

fn lines(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(dir.join(FILE_NAME)).expect("read journal").lines().map(str::to_owned).collect()
}

#[tokio::test]
async fn records_survive_reopen_and_the_latest_wins() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let j = Journal::open(dir.path(), 100).expect("open");
        assert!(j.is_empty());
        j.append(rec("T1", 1, RecordState::Started)).await.expect("append");
        j.append(rec("T1", 1, RecordState::Printed)).await.expect("append");
        j.append(rec("T2", 1, RecordState::Started)).await.expect("append");
        j.append(rec("T3", 2, RecordState::NoPaper)).await.expect("append");
        assert_eq!(j.lookup("T1").map(|r| r.state), Some(RecordState::Printed));
        j.close().await.expect("close");
        assert!(matches!(j.append(rec("T4", 1, RecordState::Started)).await, Err(JournalError::Closed)));
    }
    let j = Journal::open(dir.path(), 100).expect("reopen");
    assert_eq!(j.len(), 3);
    assert_eq!(j.lookup("T1").map(|r| r.state), Some(RecordState::Printed));
    assert_eq!(j.lookup("T2").map(|r| r.state), Some(RecordState::Started));
    let t3 = j.lookup("T3").expect("T3");
    assert_eq!((t3.attempt, t3.state, t3.detail.as_str()), (2, RecordState::NoPaper, "test"));
    assert!(t3.at.ends_with('Z'), "RFC 3339 UTC: {}", t3.at);
    assert_eq!(j.lookup("T9"), None);
    j.close().await.expect("close");
}

#[tokio::test]
async fn a_torn_last_line_is_ignored_and_cleaned_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let j = Journal::open(dir.path(), 100).expect("open");
        j.append(rec("T1", 1, RecordState::Printed)).await.expect("append");
        j.append(rec("T2", 1, RecordState::Started)).await.expect("append");
        j.close().await.expect("close");
    }
    // Power loss in the middle of the next write.
    let mut f = std::fs::OpenOptions::new().append(true).open(dir.path().join(FILE_NAME)).expect("open file");
    f.write_all(br#"{"task_id":"T3","attempt":1,"sta"#).expect("write torn");
    drop(f);

    let j = Journal::open(dir.path(), 100).expect("a torn tail must not stop the agent");
    assert_eq!(j.len(), 2);
    assert_eq!(j.lookup("T2").map(|r| r.state), Some(RecordState::Started));
    assert_eq!(j.lookup("T3"), None);
    // The next append must start on a clean line, not be glued to the torn one.
    j.append(rec("T4", 1, RecordState::Printed)).await.expect("append");
    j.close().await.expect("close");
    let j = Journal::open(dir.path(), 100).expect("reopen");
    assert_eq!(j.len(), 3);
    assert_eq!(j.lookup("T4").map(|r| r.state), Some(RecordState::Printed));
    j.close().await.expect("close");
    for l in lines(dir.path()) {
        assert!(serde_json::from_str::<Record>(&l).is_ok(), "unreadable line left behind: {l}");
    }
}

#[tokio::test]
async fn nul_filled_tail_and_unterminated_record_are_handled() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = serde_json::to_string(&rec("T1", 1, RecordState::Started)).expect("json");
    let last = serde_json::to_string(&rec("T2", 1, RecordState::Started)).expect("json");
    // What some file systems leave after power loss: the size grew, the data did not land.
    let mut content = format!("{good}\n").into_bytes();
    content.extend_from_slice(&[0u8; 300]);
    content.push(b'\n');
    content.extend_from_slice(last.as_bytes()); // a record whose newline did not land
    std::fs::write(dir.path().join(FILE_NAME), content).expect("write");
    let j = Journal::open(dir.path(), 100).expect("open");
    assert_eq!(j.lookup("T1").map(|r| r.state), Some(RecordState::Started));
    assert_eq!(j.lookup("T2").map(|r| r.state), Some(RecordState::Started), "a complete record is kept");
    j.append(rec("T3", 1, RecordState::Printed)).await.expect("append");
    j.close().await.expect("close");
    assert_eq!(lines(dir.path()).len(), 3);
}

#[tokio::test]
async fn damage_in_the_middle_refuses_to_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = serde_json::to_string(&rec("T1", 1, RecordState::Printed)).expect("json");
    std::fs::write(dir.path().join(FILE_NAME), format!("{good}\nnot json at all\n{good}\n")).expect("write");
    match Journal::open(dir.path(), 100) {
        Err(JournalError::Corrupt { line, .. }) => assert_eq!(line, 2),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("a damaged journal must not be opened"),
    }
}

#[tokio::test]
async fn compaction_keeps_the_last_n_task_ids() {
    let dir = tempfile::tempdir().expect("tempdir");
    let n = 10;
    let j = Journal::open(dir.path(), n).expect("open");
    for i in 0..35 {
        let id = format!("T{i:02}");
        j.append(rec(&id, 1, RecordState::Started)).await.expect("append");
        j.append(rec(&id, 1, RecordState::Printed)).await.expect("append");
        // Compaction runs right after the commit that crosses 2N, before the next one.
        assert!(lines(dir.path()).len() <= 2 * n + 1, "the file never grows past 2N records");
    }
    let stats = j.stats();
    assert!(stats.compactions >= 3, "{stats:?}");
    assert_eq!(j.len(), n);
    j.close().await.expect("close");

    let j = Journal::open(dir.path(), n).expect("reopen");
    assert_eq!(j.len(), n);
    for i in 0..35 {
        let id = format!("T{i:02}");
        let expected = if i >= 35 - n { Some(RecordState::Printed) } else { None };
        assert_eq!(j.lookup(&id).map(|r| r.state), expected, "{id}");
    }
    assert!(!dir.path().join(format!("{FILE_NAME}.tmp")).exists());
    j.close().await.expect("close");
}

#[tokio::test]
async fn a_journal_over_2n_on_open_is_compacted() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let j = Journal::open(dir.path(), 1000).expect("open");
        for i in 0..50 {
            j.append(rec(&format!("T{i}"), 1, RecordState::Printed)).await.expect("append");
        }
        j.close().await.expect("close");
    }
    let j = Journal::open(dir.path(), 5).expect("reopen smaller");
    assert_eq!(j.len(), 5);
    assert_eq!(j.stats().compactions, 1);
    assert_eq!(lines(dir.path()).len(), 5);
    assert!(j.lookup("T49").is_some() && j.lookup("T44").is_none());
    j.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appends_are_group_committed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let j = Arc::new(Journal::open(dir.path(), 10_000).expect("open"));
    let writers = 400;
    let mut tasks = Vec::new();
    for i in 0..writers {
        let j = j.clone();
        tasks.push(tokio::spawn(async move { j.append(rec(&format!("T{i}"), 1, RecordState::Started)).await }));
    }
    for t in tasks {
        t.await.expect("join").expect("append");
    }
    let stats = j.stats();
    assert_eq!(stats.records, writers);
    assert!(stats.syncs < writers / 2, "expected batches to share syncs: {stats:?}");
    // Every caller was answered only after its record was durable, so all are visible.
    for i in 0..writers {
        assert_eq!(j.lookup(&format!("T{i}")).map(|r| r.state), Some(RecordState::Started));
    }
    j.close().await.expect("close");
    assert_eq!(lines(dir.path()).len(), writers as usize);
}

#[tokio::test]
async fn keys_survive_reopen_and_compaction() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let j = Journal::open(dir.path(), 4).expect("open");
        j.append(rec("T1", 1, RecordState::Started).keyed("A1#p1")).await.expect("append");
        j.append(rec("T1", 1, RecordState::Printed).keyed("A1#p1")).await.expect("append");
        j.append(rec("T2", 1, RecordState::Started).keyed("A2#p1")).await.expect("append");
        // Enough other tasks to compact the file at least once, not enough to push T1 and
        // T2 out of the last four.
        for i in 0..12 {
            j.append(rec("T3", i, RecordState::NoPaper)).await.expect("append");
        }
        assert!(j.stats().compactions >= 1, "{:?}", j.stats());
        assert_eq!(j.lookup_key("A1#p1").map(|r| (r.task_id, r.state)), Some(("T1".into(), RecordState::Printed)));
        j.close().await.expect("close");
    }
    let j = Journal::open(dir.path(), 4).expect("reopen");
    assert_eq!(j.lookup_key("A1#p1").map(|r| (r.task_id, r.state)), Some(("T1".into(), RecordState::Printed)));
    assert_eq!(j.lookup_key("A2#p1").map(|r| (r.task_id, r.state)), Some(("T2".into(), RecordState::Started)));
    assert_eq!(j.lookup_key("A3#p1"), None);
    assert_eq!(j.lookup_key(""), None, "an empty key names nothing");
    j.close().await.expect("close");
}
