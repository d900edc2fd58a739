//! Recovery of the agent's journal (`onceprint_agent::journal::Journal::open`) from a file
//! with a torn or corrupted tail, or made of arbitrary bytes.
//!
//! The input describes records written intact, then damage: a torn last line, garbage or
//! a run of NUL bytes after them, one byte overwritten anywhere, or a whole file of fuzz
//! bytes. The file is written into a directory, the journal opened, and then:
//! - it never panics, and never fails with an IO error;
//! - it opens exactly when the module's rules say it must: only the last line may be
//!   unreadable (torn), lines of NUL bytes are ignored anywhere, any other unreadable line
//!   fails the open with `Corrupt` naming that line, and then the file is left untouched;
//! - when the damage only touches the last line (torn, garbage without a line break, NUL
//!   bytes), the journal opens and every record that was intact before the damage is
//!   found: each task id answers its latest record, for the last `capacity` task ids;
//! - after an open, the file holds only complete record lines, so a record appended,
//!   the journal closed and opened again is found with all the others.

#![no_main]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Wake, Waker};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use onceprint_agent::journal::{Journal, JournalError, Record, RecordState, FILE_NAME};

#[derive(Debug, Arbitrary)]
enum TaskId {
    /// One of a few ids, so that ids are written again and evicted.
    Few(u8),
    Any(String),
}

#[derive(Debug, Arbitrary)]
struct Rec {
    task: TaskId,
    attempt: u32,
    state: u8,
    at: bool,
    detail: String,
}

impl Rec {
    fn record(&self) -> Record {
        const STATES: [RecordState; 8] = [
            RecordState::Started,
            RecordState::Printed,
            RecordState::InDoubt,
            RecordState::NoPaper,
            RecordState::CoverOpen,
            RecordState::Offline,
            RecordState::PaperJam,
            RecordState::Error,
        ];
        Record {
            task_id: match &self.task {
                TaskId::Few(n) => format!("01JF{:02}", n % 12),
                TaskId::Any(s) => s.clone(),
            },
            attempt: self.attempt,
            state: STATES[usize::from(self.state) % STATES.len()],
            at: if self.at { "2026-01-02T03:04:05Z".into() } else { String::new() },
            detail: self.detail.clone(),
        }
    }
}

#[derive(Debug, Arbitrary)]
enum Damage {
    None,
    /// The last line loses its last `cut` bytes (at least its newline).
    Torn {
        cut: u16,
    },
    /// Bytes after the last complete line.
    Garbage(Vec<u8>),
    /// Torn, then bytes.
    TornGarbage {
        cut: u16,
        garbage: Vec<u8>,
    },
    /// NUL bytes where unsynced data was, optionally followed by a newline.
    Nul {
        len: u16,
        newline: bool,
    },
    /// One byte anywhere overwritten.
    Overwrite {
        at: u16,
        byte: u8,
    },
    /// The whole file is these bytes.
    Whole(Vec<u8>),
}

#[derive(Debug, Arbitrary)]
struct Input {
    capacity: u8,
    records: Vec<Rec>,
    damage: Damage,
    appended: Rec,
}

fn line(r: &Record) -> Vec<u8> {
    let mut v = serde_json::to_vec(r).expect("a record serializes");
    v.push(b'\n');
    v
}

/// The file, and how many of the records are intact when the damage is confined to the
/// last line (or to lines of NUL bytes); `None` for damage anywhere.
fn file_bytes(input: &Input) -> (Vec<u8>, Option<usize>) {
    let mut bytes: Vec<u8> = input.records.iter().flat_map(|r| line(&r.record())).collect();
    let all = input.records.len();
    let torn = all.saturating_sub(1);
    let tear = |bytes: &mut Vec<u8>, cut: u16| {
        let last_line = bytes[..bytes.len().saturating_sub(1)].iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let len = bytes.len() - last_line;
        let cut = 1 + usize::from(cut) % len.max(1);
        bytes.truncate(bytes.len() - cut.min(len));
    };
    match &input.damage {
        Damage::None => (bytes, Some(all)),
        Damage::Torn { cut } => {
            tear(&mut bytes, *cut);
            (bytes, Some(torn))
        }
        Damage::Garbage(g) => {
            bytes.extend_from_slice(g);
            let last_line_only = !g.contains(&b'\n') || g.iter().all(|&b| b == 0 || b == b'\n');
            (bytes, last_line_only.then_some(all))
        }
        Damage::TornGarbage { cut, garbage } => {
            tear(&mut bytes, *cut);
            bytes.extend_from_slice(garbage);
            (bytes, (!garbage.contains(&b'\n')).then_some(torn))
        }
        Damage::Nul { len, newline } => {
            bytes.extend(std::iter::repeat_n(0, usize::from(*len % 4096)));
            if *newline {
                bytes.push(b'\n');
            }
            (bytes, Some(all))
        }
        Damage::Overwrite { at, byte } => {
            if !bytes.is_empty() {
                let i = usize::from(*at) % bytes.len();
                bytes[i] = *byte;
            }
            (bytes, None)
        }
        Damage::Whole(w) => (w.clone(), None),
    }
}

/// What the module documentation says opening `bytes` gives: the records read, in order,
/// or the 1-based line that makes the file corrupt.
fn expected(bytes: &[u8]) -> Result<Vec<Record>, usize> {
    let lines: Vec<&[u8]> = bytes.split(|&b| b == b'\n').collect();
    let last = lines.iter().rposition(|l| !l.is_empty());
    let mut records = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if l.is_empty() {
            continue;
        }
        match serde_json::from_slice::<Record>(l) {
            Ok(r) => records.push(r),
            Err(_) if Some(i) == last || l.iter().all(|&b| b == 0) => {}
            Err(_) => return Err(i + 1),
        }
    }
    Ok(records)
}

/// The latest record of each of the last `capacity` task ids written, by task id.
fn last_n(records: &[Record], capacity: usize) -> Vec<(String, Record)> {
    let mut latest: Vec<(usize, &Record)> = Vec::new();
    for (seq, r) in records.iter().enumerate() {
        latest.retain(|(_, old)| old.task_id != r.task_id);
        latest.push((seq, r));
    }
    let skip = latest.len().saturating_sub(capacity);
    latest.into_iter().skip(skip).map(|(_, r)| (r.task_id.clone(), r.clone())).collect()
}

fn check_index(journal: &Journal, records: &[Record], capacity: usize, all_ids: &[&str]) {
    let live = last_n(records, capacity);
    assert_eq!(journal.len(), live.len(), "task ids remembered");
    for (id, r) in &live {
        assert_eq!(journal.lookup(id).as_ref(), Some(r), "latest record of {id:?}");
    }
    for id in all_ids {
        if !live.iter().any(|(l, _)| l == id) {
            assert_eq!(journal.lookup(id), None, "{id:?} is not among the last {capacity}");
        }
    }
}

fn block_on<F: Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

/// One directory per process, in memory where the machine has it.
fn dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = if Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
        // libFuzzer ends the process without running destructors, so each run removes
        // what the runs before it left, where it can tell that their process is gone.
        const PREFIX: &str = "onceprint-fuzz-journal-";
        if Path::new("/proc/self").exists() {
            for entry in std::fs::read_dir(&base).into_iter().flatten().flatten() {
                let name = entry.file_name();
                let pid = name.to_str().and_then(|n| n.strip_prefix(PREFIX));
                if pid.is_some_and(|pid| !Path::new("/proc").join(pid).exists()) {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
        let dir = base.join(format!("{PREFIX}{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        dir
    })
}

fn open(dir: &Path, capacity: usize) -> Result<Journal, JournalError> {
    Journal::open(dir, capacity)
}

fuzz_target!(|input: Input| {
    let capacity = usize::from(input.capacity % 8) + 1;
    let dir = dir();
    let path = dir.join(FILE_NAME);
    let _ = std::fs::remove_file(dir.join(format!("{FILE_NAME}.tmp")));
    let (bytes, intact_len) = file_bytes(&input);
    std::fs::write(&path, &bytes).expect("write the journal file");

    let want = expected(&bytes);
    let intact: Vec<Record> = input.records.iter().map(Rec::record).collect();
    let mut ids: Vec<String> = intact.iter().map(|r| r.task_id.clone()).collect();
    ids.push(input.appended.record().task_id);

    let journal = match (open(dir, capacity), want) {
        (Err(JournalError::Corrupt { line, .. }), Err(want_line)) => {
            assert!(intact_len.is_none(), "damage of the last line only made the journal corrupt");
            assert_eq!(line, want_line, "the corrupt line named");
            assert_eq!(std::fs::read(&path).expect("read"), bytes, "a corrupt journal was changed");
            return;
        }
        (Err(e), want) => panic!("open failed with {e} where {want:?} was expected"),
        (Ok(_), Err(line)) => panic!("opened a journal whose line {line} is damage"),
        (Ok(journal), Ok(records)) => {
            let id_refs: Vec<&str> = ids.iter().map(String::as_str).collect();
            check_index(&journal, &records, capacity, &id_refs);
            if let Some(n) = intact_len {
                // Every record intact before the damage was read, in order (and the
                // index holds the latest of each of the last `capacity` task ids read).
                assert!(records.len() >= n && records[..n] == intact[..n], "intact records lost: {records:?}");
            }
            // After open the file is whole lines of records, each one of those read.
            let now = std::fs::read(&path).expect("read");
            assert!(now.is_empty() || now.ends_with(b"\n"), "the journal does not end with a line break");
            let lines = expected(&now).expect("the file after open is readable");
            assert!(now.split(|&b| b == b'\n').filter(|l| !l.is_empty()).count() == lines.len());
            assert!(lines.iter().all(|r| records.contains(r)));
            (journal, records)
        }
    };
    let (journal, mut records) = journal;

    let appended = input.appended.record();
    block_on(journal.append(appended.clone())).expect("append after recovery");
    block_on(journal.close()).expect("close");
    drop(journal);
    records.push(appended);
    let again = open(dir, capacity).expect("a recovered journal opens again after an append");
    let id_refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    check_index(&again, &records, capacity, &id_refs);
    block_on(again.close()).expect("close");
});
