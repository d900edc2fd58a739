//! The agent's state directory: an exclusive lock, the persisted agent id and the journal.

use crate::fsutil::write_atomic;
use crate::AgentError;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

const AGENT_ID_FILE: &str = "agent-id";
const LOCK_FILE: &str = "lock";

/// An open, locked state directory. The lock is released when this is dropped (or the
/// process dies: the kernel releases `flock` locks with the last descriptor).
#[derive(Debug)]
pub(crate) struct StateDir {
    path: PathBuf,
    _lock: File,
}

impl StateDir {
    /// Creates the directory if needed and locks it. Two agents sharing one journal would
    /// each believe they alone decide what was printed, and one's compaction would erase
    /// the other's records; a restart that overlaps the old process's shutdown is the
    /// usual way this happens, so it is refused rather than trusted not to happen.
    pub(crate) fn open(path: &Path) -> Result<StateDir, AgentError> {
        let err = |source| AgentError::StateDir { path: path.to_owned(), source };
        fs::create_dir_all(path).map_err(err)?;
        let lock =
            OpenOptions::new().create(true).truncate(false).write(true).open(path.join(LOCK_FILE)).map_err(err)?;
        match try_lock_exclusive(&lock) {
            Ok(true) => {}
            Ok(false) => return Err(AgentError::Locked(path.to_owned())),
            Err(source) => return Err(err(source)),
        }
        Ok(StateDir { path: path.to_owned(), _lock: lock })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The agent id: the one given, else the one persisted here, else a new random one
    /// that is persisted before it is used, so a restarted agent is the same agent to the
    /// broker and gets its unconfirmed deliveries back.
    pub(crate) fn agent_id(&self, given: Option<&str>) -> Result<String, AgentError> {
        if let Some(id) = given {
            return validate_agent_id(id).map(|()| id.to_owned());
        }
        let file = self.path.join(AGENT_ID_FILE);
        let err = |source| AgentError::StateDir { path: file.clone(), source };
        match fs::read_to_string(&file) {
            Ok(s) => {
                let id = s.trim();
                validate_agent_id(id).map_err(|_| AgentError::AgentIdFile {
                    path: file.clone(),
                    reason: format!("{id:?} is not a valid agent id"),
                })?;
                Ok(id.to_owned())
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let id = new_agent_id();
                write_atomic(&file, format!("{id}\n").as_bytes()).map_err(err)?;
                tracing::info!(agent_id = %id, path = %file.display(), "generated a new agent id");
                Ok(id)
            }
            Err(e) => Err(err(e)),
        }
    }
}

/// Ids are 1–64 characters of `A-Za-z0-9._:-` (docs/API.md).
pub(crate) fn validate_agent_id(id: &str) -> Result<(), AgentError> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(AgentError::AgentId(id.to_owned()))
    }
}

fn new_agent_id() -> String {
    use rand::Rng;
    let bytes: [u8; 10] = rand::thread_rng().gen();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("agent-{hex}")
}

#[cfg(unix)]
#[allow(unsafe_code)]
fn try_lock_exclusive(file: &File) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: `flock` only reads the descriptor number, which `file` keeps open for the
    // duration of the call.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.kind() == io::ErrorKind::WouldBlock {
        Ok(false)
    } else {
        Err(e)
    }
}

#[cfg(not(unix))]
fn try_lock_exclusive(_file: &File) -> io::Result<bool> {
    // No portable advisory lock before Rust 1.89's `File::try_lock`; other platforms rely
    // on the operator running one agent per state directory.
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_ids_follow_the_id_alphabet() {
        assert!(validate_agent_id(&new_agent_id()).is_ok());
        assert!(validate_agent_id("store-1.front:a_b").is_ok());
        for bad in ["", "a b", "ä", &"x".repeat(65)] {
            assert!(validate_agent_id(bad).is_err(), "{bad:?}");
        }
    }
}
