//! `onceprint backup` with the real binary: a copy of the SQLite
//! database taken while clients keep submitting, restored as the README says (broker
//! stopped, file copied into place, broker started), holds every task that was answered
//! 201 before the backup began and nothing no client was told about; the restored broker
//! starts cleanly and answers retries of those tasks as duplicates. For PostgreSQL the
//! command refuses and names pg_dump.

mod common;

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::broker::{temp_dir, Api, Broker, BIN};
use serde_json::Value;

/// biz_no → task id of every submission answered 201, in the order the answers came.
type Told = Arc<Mutex<Vec<(String, String)>>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_taken_under_load_restores_every_answered_task() {
    let dir = temp_dir("backup");
    let db = dir.join("broker.db");
    let database = format!("sqlite://{}", db.display());
    let log = dir.join("broker.log");
    let broker = Broker::start(&database, &[], &[], &log);
    let api = Api::tenant(&broker.base, "shop", "UTC", &["p1"]).await;

    let told: Told = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..4)
        .map(|c| {
            let (api, told, stop) = (api.clone(), told.clone(), stop.clone());
            tokio::spawn(async move {
                let mut n = 0u32;
                while !stop.load(Ordering::SeqCst) {
                    let biz = format!("B{c}-{n}");
                    let (status, body) = api.submit(&biz, "p1", &format!("order {biz}\n")).await;
                    if status == 429 {
                        // A broker with per-tenant rate limits slows the storm down; the
                        // same submission is tried again, as a client would.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                    assert_eq!(status, 201, "{body}");
                    told.lock().expect("lock").push((biz, body["task_id"].as_str().expect("id").to_owned()));
                    n += 1;
                }
            })
        })
        .collect();
    let start = Instant::now();
    while told.lock().expect("lock").len() < 300 {
        assert!(start.elapsed() < Duration::from_secs(60), "the clients got too few answers");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Everything answered before the backup begins must be in it.
    let before: Vec<(String, String)> = told.lock().expect("lock").clone();
    let copy = dir.join("backup.db");
    let out = Command::new(BIN)
        .args(["backup", "--to", &copy.display().to_string(), "--db", &database])
        .output()
        .expect("onceprint backup");
    assert!(
        out.status.success(),
        "backup failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.starts_with("backup written to "), "{said}");
    // The clients kept going during the backup, and still do.
    let during = told.lock().expect("lock").len();
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.await.expect("client");
    }
    let all: BTreeMap<String, String> = told.lock().expect("lock").iter().cloned().collect();
    assert!(all.len() > during, "submissions went on while and after the backup ran");
    assert!(!dir.join("backup.db.partial").exists(), "no partial file left");
    assert!(broker.stop().success(), "SIGTERM → exit 0");

    // Restore: the broker is stopped; the copy goes into place of a broker's database.
    let restored_dir = dir.join("restored");
    std::fs::create_dir_all(&restored_dir).expect("dir");
    std::fs::copy(&copy, restored_dir.join("broker.db")).expect("copy into place");
    let restored_db = format!("sqlite://{}", restored_dir.join("broker.db").display());
    let restored = Broker::start(&restored_db, &[], &[], &dir.join("restored.log"));
    let api = api.on(&restored.base);
    let ready = reqwest::get(format!("{}/readyz", restored.base)).await.expect("readyz");
    assert_eq!(ready.status(), 200);

    for (biz, id) in &before {
        let (status, task) = api.get(&format!("/v1/print-tasks/{id}")).await;
        assert_eq!(
            (status, task["biz_no"].as_str()),
            (200, Some(biz.as_str())),
            "task {id} of {biz} is not in the backup"
        );
    }
    let (status, events) = api.get(&format!("/v1/print-tasks/{}/events", before[0].1)).await;
    assert_eq!((status, events["events"][0]["to"].as_str()), (200, Some("pending")), "{events}");
    // Nothing in the copy that no client was told about, and no key twice.
    let mut seen = 0usize;
    let mut cursor = String::new();
    loop {
        let (status, page) = api.get(&format!("/v1/print-tasks?limit=500&cursor={cursor}")).await;
        assert_eq!(status, 200, "{page}");
        for t in page["tasks"].as_array().expect("tasks") {
            let biz = t["biz_no"].as_str().expect("biz_no");
            assert_eq!(all.get(biz).map(String::as_str), t["task_id"].as_str(), "{t} was never answered");
            seen += 1;
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = c.to_owned(),
            None => break,
        }
    }
    assert!(seen >= before.len(), "{seen} tasks restored, {} answered before the backup", before.len());
    // A retry of a task from before the backup is a duplicate on the restored broker.
    let (biz, id) = &before[before.len() / 2];
    let (status, body) = api.submit(biz, "p1", &format!("order {biz}\n")).await;
    assert_eq!((status, body["task_id"].as_str(), &body["duplicate"]), (200, Some(id.as_str()), &Value::Bool(true)));
    // And it takes new work.
    let (status, _) = api.submit("AFTER-RESTORE", "p1", "order\n").await;
    assert_eq!(status, 201);
    assert!(restored.stop().success(), "the restored broker stops cleanly too");
    eprintln!(
        "backup under load: {} tasks answered before the backup, {seen} in the copy, {} answered in all",
        before.len(),
        all.len()
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn postgres_databases_are_left_to_pg_dump() {
    let out = Command::new(BIN)
        .args(["backup", "--to", "/tmp/never-written.db", "--database", "postgres://postgres@127.0.0.1:1/none"])
        .output()
        .expect("onceprint backup");
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("pg_dump"), "{said}");
    assert!(!std::path::Path::new("/tmp/never-written.db").exists());
}

#[test]
fn a_missing_database_is_an_error_not_an_empty_backup() {
    let dir = temp_dir("backup-missing");
    let copy = dir.join("copy.db");
    let out = Command::new(BIN)
        .args(["backup", "--to", &copy.display().to_string(), "--db", &format!("sqlite://{}/none.db", dir.display())])
        .output()
        .expect("onceprint backup");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("none.db"), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!copy.exists() && !dir.join("none.db").exists(), "nothing created");
    let _ = std::fs::remove_dir_all(dir);
}
