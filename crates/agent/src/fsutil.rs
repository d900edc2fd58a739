//! Small durable-file functions shared by the journal and the state directory.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;

/// Makes the directory entries of `dir` durable. A rename or a newly created file is only
/// guaranteed to survive power loss once its directory has been synced, not when the file
/// itself has been.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        File::open(dir)?.sync_all()
    }
    #[cfg(not(unix))]
    {
        // Other platforms cannot open a directory as a file; there the rename itself is
        // the best durability we can get.
        let _ = dir;
        Ok(())
    }
}

/// Replaces `path` with `bytes` so that a crash leaves either the old or the new content,
/// never a mixture: write a temporary file, sync it, rename it over, sync the directory.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(".tmp");
    let tmp = Path::new(&tmp_name);
    {
        let mut f = File::create(tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    fs::rename(tmp, path)?;
    sync_dir(dir)
}

/// The current time in RFC 3339 UTC, as every time in onceprint is written.
pub(crate) fn now_rfc3339() -> String {
    let now = time::OffsetDateTime::now_utc();
    now.format(&time::format_description::well_known::Rfc3339).unwrap_or_else(|_| format!("@{}", now.unix_timestamp()))
}
