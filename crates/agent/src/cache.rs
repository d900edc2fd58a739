//! What the agent keeps of the broker for offline use: its store's directory (printers,
//! stations, print types) and the hashes of the store's LAN keys, fetched while the broker
//! answers and saved in the state directory, so that a restarted agent can still take LAN
//! submissions while the broker is unreachable.

use crate::broker::{BrokerClient, BrokerError};
use crate::fsutil::write_atomic;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

const DIRECTORY_FILE: &str = "directory.json";
const LAN_KEYS_FILE: &str = "lan-keys.json";

/// `GET /v1/agent/directory`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreDirectory {
    pub store_id: String,
    #[serde(default)]
    pub printers: Vec<DirPrinter>,
    #[serde(default)]
    pub stations: Vec<DirStation>,
    #[serde(default)]
    pub print_types: Vec<String>,
    #[serde(default = "default_print_type")]
    pub default_print_type: String,
}

fn default_print_type() -> String {
    onceprint_core::policy::DEFAULT_PRINT_TYPE.to_owned()
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirPrinter {
    pub printer_id: String,
    #[serde(default)]
    pub printer_address: String,
    #[serde(default)]
    pub enabled: bool,
    /// Driven by this agent (transport `agent`): the only printers it can print to offline.
    #[serde(default)]
    pub agent: bool,
    #[serde(default)]
    pub profile: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirStation {
    pub station_id: String,
    #[serde(default)]
    pub printers: Vec<String>,
}

/// One LAN key as the broker lists it: its id and the SHA-256 of the key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LanKey {
    pub id: String,
    pub sha256: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct LanKeys {
    keys: Vec<LanKey>,
}

/// The cached directory and keys, shared by the LAN listener and the refresher.
#[derive(Clone)]
pub struct OfflineCache {
    dir: PathBuf,
    directory: Arc<RwLock<Option<StoreDirectory>>>,
    keys: Arc<RwLock<Vec<LanKey>>>,
}

impl OfflineCache {
    /// Loads what an earlier run saved (nothing yet on a first start).
    pub fn load(dir: &Path) -> OfflineCache {
        let directory = std::fs::read(dir.join(DIRECTORY_FILE)).ok().and_then(|b| serde_json::from_slice(&b).ok());
        let keys = std::fs::read(dir.join(LAN_KEYS_FILE))
            .ok()
            .and_then(|b| serde_json::from_slice::<LanKeys>(&b).ok())
            .map(|k| k.keys)
            .unwrap_or_default();
        OfflineCache {
            dir: dir.to_owned(),
            directory: Arc::new(RwLock::new(directory)),
            keys: Arc::new(RwLock::new(keys)),
        }
    }

    pub fn directory(&self) -> Option<StoreDirectory> {
        self.directory.read().ok().and_then(|d| d.clone())
    }

    /// The id of the LAN key `presented` is, if it is one of the store's live keys.
    pub fn lan_key_id(&self, presented: &str) -> Option<String> {
        let digest = Sha256::digest(presented.as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        let keys = self.keys.read().ok()?;
        keys.iter().find(|k| constant_time_eq(k.sha256.as_bytes(), hex.as_bytes())).map(|k| k.id.clone())
    }

    /// Fetches both from the broker and saves them; the old copies stay on any failure.
    pub async fn refresh(&self, client: &BrokerClient) -> Result<(), BrokerError> {
        let directory: StoreDirectory = client.get_json("/v1/agent/directory").await?;
        let keys: LanKeys = client.get_json("/v1/agent/lan-keys").await?;
        let dir = self.dir.clone();
        let (d, k) = (directory.clone(), keys.clone());
        // Saved before it is used, so what the agent answers offline after a restart is
        // what it answered before it.
        let saved = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            write_atomic(&dir.join(DIRECTORY_FILE), &serde_json::to_vec(&d).unwrap_or_default())?;
            write_atomic(&dir.join(LAN_KEYS_FILE), &serde_json::to_vec(&k).unwrap_or_default())
        })
        .await;
        match saved {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "could not save the offline directory"),
            Err(e) => tracing::warn!(error = %e, "could not save the offline directory"),
        }
        if let Ok(mut w) = self.directory.write() {
            *w = Some(directory);
        }
        if let Ok(mut w) = self.keys.write() {
            *w = keys.keys;
        }
        Ok(())
    }

    /// Refreshes every `every` until `stopping`; at once at start.
    pub async fn run_refresher(
        self,
        client: BrokerClient,
        every: Duration,
        mut stopping: tokio::sync::watch::Receiver<bool>,
    ) {
        let mut logged_failure = false;
        loop {
            match self.refresh(&client).await {
                Ok(()) => {
                    if logged_failure {
                        tracing::info!("offline directory and LAN keys refreshed again");
                    }
                    logged_failure = false;
                }
                Err(e) if !logged_failure => {
                    logged_failure = true;
                    tracing::warn!(error = %e, "could not refresh the offline directory and LAN keys; keeping the saved copy");
                }
                Err(_) => {}
            }
            // After a failure, try again soon: the LAN listener needs the keys.
            let pause = if logged_failure { every.min(Duration::from_secs(5)) } else { every };
            tokio::select! {
                _ = stopping.changed() => return,
                _ = tokio::time::sleep(pause) => {}
            }
            if *stopping.borrow() {
                return;
            }
        }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
