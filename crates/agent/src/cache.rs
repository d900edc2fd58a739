//! What the agent keeps of the broker for offline use: its store's directory (printers,
//! stations, print types) and the hashes of the store's LAN keys, fetched while the broker
//! answers and saved in the state directory, so that a restarted agent can still take LAN
//! submissions while the broker is unreachable.

use crate::broker::{BrokerClient, BrokerError};
use crate::fsutil::write_atomic;
use crate::upstream::Upstream;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

const DIRECTORY_FILE: &str = "directory.json";
const LAN_KEYS_FILE: &str = "lan-keys.json";
const LISTENER_FILE: &str = "lan-listener.json";

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
    /// The broker's body limit; `None` from a broker that does not say (the default then).
    #[serde(default)]
    pub max_body_bytes: Option<usize>,
    /// The broker's content limit after decoding; `None`: the default.
    #[serde(default)]
    pub max_content_bytes: Option<usize>,
}

impl StoreDirectory {
    /// The largest LAN request body taken: the broker's.
    pub fn body_limit(&self) -> usize {
        self.max_body_bytes.unwrap_or(onceprint_core::content::DEFAULT_MAX_BODY_BYTES)
    }

    /// The content limits a task accepted offline is held to: the broker's.
    pub fn content_limits(&self) -> onceprint_core::ContentLimits {
        let mut limits = onceprint_core::ContentLimits::default();
        if let Some(n) = self.max_content_bytes {
            limits.max_bytes = n;
        }
        limits
    }
}

/// Who takes the store's LAN orders, as the broker last answered this agent's claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "listener", rename_all = "snake_case")]
pub enum ListenerClaim {
    /// This agent holds the store's LAN listener (or the broker predates the claim).
    Held,
    /// Another agent does; `message` is the broker's, naming it.
    TakenBy { agent_id: String, message: String },
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
    /// `None` until the broker listed them once (in this run or an earlier one).
    keys: Arc<RwLock<Option<Vec<LanKey>>>>,
    /// The agent id to claim the store's LAN listener for (`None`: no listener).
    claim_for: Option<String>,
    /// The broker's answer to the claim, kept across restarts.
    listener: Arc<RwLock<Option<ListenerClaim>>>,
}

impl OfflineCache {
    /// Loads what an earlier run saved (nothing yet on a first start). With `claim_for`
    /// (the agent runs a LAN listener), every refresh also claims the store's LAN
    /// listener for that agent id.
    pub fn load(dir: &Path, claim_for: Option<String>) -> OfflineCache {
        let directory = std::fs::read(dir.join(DIRECTORY_FILE)).ok().and_then(|b| serde_json::from_slice(&b).ok());
        let keys = std::fs::read(dir.join(LAN_KEYS_FILE))
            .ok()
            .and_then(|b| serde_json::from_slice::<LanKeys>(&b).ok())
            .map(|k| k.keys);
        let listener = std::fs::read(dir.join(LISTENER_FILE)).ok().and_then(|b| serde_json::from_slice(&b).ok());
        OfflineCache {
            dir: dir.to_owned(),
            directory: Arc::new(RwLock::new(directory)),
            keys: Arc::new(RwLock::new(keys)),
            claim_for,
            listener: Arc::new(RwLock::new(listener)),
        }
    }

    /// The broker's last answer to this agent's claim of the store's LAN listener.
    pub fn listener(&self) -> Option<ListenerClaim> {
        self.listener.read().ok().and_then(|l| l.clone())
    }

    /// Claims the store's LAN listener (`POST /v1/agent/lan-listener`) and keeps the
    /// answer. A broker that does not know the claim (404) leaves the listener to this
    /// agent, as before there was one.
    async fn claim(&self, client: &dyn Upstream, agent_id: &str) -> Result<(), BrokerError> {
        #[derive(Serialize)]
        struct Claim<'a> {
            agent_id: &'a str,
        }
        let body = Claim { agent_id };
        let answer = crate::upstream::post::<serde_json::Value>(
            client,
            "/v1/agent/lan-listener",
            &body,
            Duration::from_secs(10),
        );
        let claim = match answer.await {
            Ok(_) => ListenerClaim::Held,
            Err(BrokerError::Status { status: 404, .. }) => ListenerClaim::Held,
            Err(BrokerError::Status { status: 409, body }) => {
                let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
                let message = v["error"]["message"].as_str().unwrap_or("another store agent takes them").to_owned();
                let agent_id = message.split('"').nth(1).unwrap_or_default().to_owned();
                ListenerClaim::TakenBy { agent_id, message }
            }
            Err(e) => return Err(e),
        };
        let changed = self.listener() != Some(claim.clone());
        if changed {
            match &claim {
                ListenerClaim::Held => tracing::info!("this agent takes the store's LAN orders"),
                ListenerClaim::TakenBy { message, .. } => {
                    tracing::error!(reason = %message, "the LAN listener refuses orders: another store agent takes them")
                }
            }
            let path = self.dir.join(LISTENER_FILE);
            let bytes = serde_json::to_vec(&claim).unwrap_or_default();
            let saved = tokio::task::spawn_blocking(move || write_atomic(&path, &bytes)).await;
            if !matches!(saved, Ok(Ok(()))) {
                tracing::warn!("could not save the LAN listener claim");
            }
        }
        if let Ok(mut w) = self.listener.write() {
            *w = Some(claim);
        }
        Ok(())
    }

    pub fn directory(&self) -> Option<StoreDirectory> {
        self.directory.read().ok().and_then(|d| d.clone())
    }

    /// Whether the agent knows the store's LAN keys: a new agent that never reached the
    /// broker cannot tell a good key from a wrong one.
    pub fn knows_lan_keys(&self) -> bool {
        self.keys.read().map(|k| k.is_some()).unwrap_or(false)
    }

    /// The id of the LAN key `presented` is, if it is one of the store's live keys.
    pub fn lan_key_id(&self, presented: &str) -> Option<String> {
        let digest = Sha256::digest(presented.as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        let keys = self.keys.read().ok()?;
        keys.as_ref()?.iter().find(|k| constant_time_eq(k.sha256.as_bytes(), hex.as_bytes())).map(|k| k.id.clone())
    }

    /// Fetches both from the broker and saves them; the old copies stay on any failure.
    pub async fn refresh(&self, client: &dyn Upstream) -> Result<(), BrokerError> {
        let directory: StoreDirectory = crate::upstream::get(client, "/v1/agent/directory").await?;
        let keys: LanKeys = crate::upstream::get(client, "/v1/agent/lan-keys").await?;
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
            *w = Some(keys.keys);
        }
        if let Some(agent_id) = &self.claim_for {
            self.claim(client, agent_id).await?;
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
