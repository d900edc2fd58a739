//! Devices isolated on the MQTT server: Mosquitto's password file (`mosquitto_passwd`
//! format) and ACL file, written from the printers in the database.
//!
//! Each `mqtt` printer logs in with its own login (made when the printer was created or
//! its login rotated; the database keeps Mosquitto's `$7$` hash of it) and may read only
//! its own `…/to-device/{device}/#` topics and publish only on its own
//! `…/to-server/{device}/#` ones. The broker's own login reads every `to-server` topic and
//! writes every `to-device` one. Mosquitto reads both files again on SIGHUP.
//!
//! The files are written whole to a temporary file and renamed into place, so Mosquitto
//! never reads half of one. The password file is readable by its owner and group only:
//! give the directory Mosquitto's group with the set-group-id bit (`chgrp mosquitto DIR;
//! chmod 2750 DIR`) so that Mosquitto can read what onceprint writes.

use std::path::{Path, PathBuf};

use onceprint_engine::transport::{TransportConfig, TransportKind};
use onceprint_store::{Store, StoreResult};

use crate::protocol::{DeviceAddr, DEVICE_TO_DEVICE, DEVICE_TO_SERVER, STAR_TO_DEVICE, STAR_TO_SERVER};

/// The password file's name in the directory.
pub const PASSWORD_FILE: &str = "passwd";
/// The ACL file's name in the directory.
pub const ACL_FILE: &str = "acl";

/// The broker's own line in the password file.
#[derive(Clone)]
pub struct BrokerLogin {
    pub username: String,
    /// Mosquitto's `$7$` hash of the broker's password.
    pub hash: String,
}

/// Both files' contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AclFiles {
    pub passwords: String,
    pub acl: String,
}

/// The files for every `mqtt` printer of every tenant that has an MQTT login. A printer
/// made before its login carried an MQTT hash is left out (with a warning) until its login
/// is rotated.
pub async fn render(store: &dyn Store, broker: &BrokerLogin) -> StoreResult<AclFiles> {
    let printers = store.printers_by_transport(TransportKind::Mqtt.as_str()).await?;
    let mut devices = std::collections::HashMap::new();
    for p in &printers {
        if let Some(TransportConfig::Mqtt(m)) = TransportConfig::from_stored(&p.transport) {
            devices.insert((p.tenant_id.clone(), p.id.clone()), DeviceAddr::new(m.protocol, m.device()));
        }
    }
    let mut passwords = format!("{}:{}\n", broker.username, broker.hash);
    let mut acl = String::from(
        "# Written by onceprint from its database (onceprint mqtt-acl); changes here are overwritten.\n\n",
    );
    acl.push_str(&format!("# the broker\nuser {}\n", broker.username));
    for (to_device, to_server) in [(STAR_TO_DEVICE, STAR_TO_SERVER), (DEVICE_TO_DEVICE, DEVICE_TO_SERVER)] {
        acl.push_str(&format!("topic write {to_device}/#\ntopic read {to_server}/#\n"));
    }
    let mut with_login = std::collections::HashSet::new();
    for login in store.mqtt_logins().await? {
        let Some(addr) = devices.get(&(login.tenant_id.clone(), login.printer_id.clone())) else { continue };
        if !valid_username(&login.username) {
            tracing::warn!(username = %login.username, "an MQTT login name that does not fit the files; left out");
            continue;
        }
        with_login.insert((login.tenant_id.clone(), login.printer_id.clone()));
        passwords.push_str(&format!("{}:{}\n", login.username, login.mqtt_hash));
        acl.push_str(&format!(
            "\n# {} / {}\nuser {}\ntopic read {}\ntopic write {}\n",
            login.tenant_id,
            login.printer_id,
            login.username,
            addr.to_device_filter(),
            addr.to_server_filter()
        ));
    }
    for (tenant, printer) in devices.keys().filter(|k| !with_login.contains(*k)) {
        tracing::warn!(%tenant, %printer, "MQTT printer without an MQTT login: rotate its credentials to give it one");
    }
    Ok(AclFiles { passwords, acl })
}

/// User names go into the files as they are: nothing that would break a line.
fn valid_username(u: &str) -> bool {
    !u.is_empty() && u.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '@'))
}

/// Writes the files into `dir` if they differ from what is there; `true` when something
/// was written.
pub fn write(dir: &Path, files: &AclFiles) -> std::io::Result<bool> {
    std::fs::create_dir_all(dir)?;
    let mut changed = false;
    for (name, content, mode) in [(PASSWORD_FILE, &files.passwords, 0o640), (ACL_FILE, &files.acl, 0o644)] {
        let path = dir.join(name);
        if std::fs::read_to_string(&path).is_ok_and(|c| c == *content) {
            continue;
        }
        let tmp = dir.join(format!(".{name}.tmp"));
        {
            use std::io::Write as _;
            let mut options = std::fs::OpenOptions::new();
            options.write(true).create(true).truncate(true);
            // The password file must not be readable by everyone. Other systems have no
            // mode bits; there the directory's permissions have to protect it.
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, mode);
            #[cfg(not(unix))]
            let _ = mode;
            let mut f = options.open(&tmp)?;
            f.write_all(content.as_bytes())?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, &path)?;
        changed = true;
    }
    Ok(changed)
}

/// Sends SIGHUP to the process whose pid `pid_file` holds (Mosquitto's `pid_file`).
#[cfg(unix)]
pub fn reload(pid_file: &Path) -> std::io::Result<()> {
    let text = std::fs::read_to_string(pid_file)?;
    let pid: libc::pid_t = text
        .trim()
        .parse()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| std::io::Error::other(format!("{}: no pid in it", pid_file.display())))?;
    // SAFETY: kill(2) with a pid read from the MQTT server's pid file and a fixed signal;
    // it touches no memory of this process.
    let rc = unsafe { libc::kill(pid, libc::SIGHUP) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Other systems have no signals to reload the MQTT server with; the files are still
/// written, and the server has to be reloaded some other way.
#[cfg(not(unix))]
pub fn reload(pid_file: &Path) -> std::io::Result<()> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        format!("cannot signal the process of {}: reloading by SIGHUP needs a Unix system", pid_file.display()),
    ))
}

/// Keeps the files in `dir` in step with the database until `shutdown`.
pub fn spawn_writer(
    store: std::sync::Arc<dyn Store>,
    broker: BrokerLogin,
    dir: PathBuf,
    reload_pid_file: Option<PathBuf>,
    interval: std::time::Duration,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        tokio::pin!(shutdown);
        let mut tick = tokio::time::interval(interval);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tick.tick() => {}
            }
            let files = match render(store.as_ref(), &broker).await {
                Ok(f) => f,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the MQTT logins");
                    continue;
                }
            };
            let dir2 = dir.clone();
            match tokio::task::spawn_blocking(move || write(&dir2, &files)).await {
                Ok(Ok(true)) => {
                    tracing::info!(dir = %dir.display(), "MQTT password and ACL files written");
                    if let Some(pid_file) = &reload_pid_file {
                        if let Err(e) = reload(pid_file) {
                            tracing::warn!(error = %e, pid_file = %pid_file.display(), "cannot tell the MQTT server to reload");
                        }
                    }
                }
                Ok(Ok(false)) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, dir = %dir.display(), "cannot write the MQTT files"),
                Err(e) => tracing::warn!(error = %e, "MQTT file writer failed"),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The password file holds hashes of every printer's MQTT password: it must not be
    /// readable by everyone, and a second write of the same content changes nothing.
    #[cfg(unix)]
    #[test]
    fn files_are_written_with_their_modes_and_only_when_changed() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("temp dir");
        let files = AclFiles { passwords: "broker:$7$hash\n".into(), acl: "user broker\ntopic readwrite #\n".into() };
        assert!(write(dir.path(), &files).expect("write"));
        let mode =
            |name: &str| std::fs::metadata(dir.path().join(name)).expect("metadata").permissions().mode() & 0o777;
        // The process's umask may only take bits away.
        assert_eq!(mode(PASSWORD_FILE) & !0o640, 0, "passwd mode {:o}", mode(PASSWORD_FILE));
        assert_eq!(mode(ACL_FILE) & !0o644, 0, "acl mode {:o}", mode(ACL_FILE));
        assert!(!write(dir.path(), &files).expect("second write"), "unchanged files are not rewritten");
    }

    #[cfg(unix)]
    #[test]
    fn reload_refuses_a_pid_file_without_a_pid() {
        let dir = tempfile::tempdir().expect("temp dir");
        let pid_file = dir.path().join("mosquitto.pid");
        std::fs::write(&pid_file, "not a pid\n").expect("write pid file");
        assert!(reload(&pid_file).is_err());
    }
}
