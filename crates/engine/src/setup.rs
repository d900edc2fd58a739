//! Set-up: tenants, stores, printers, stations, agent tokens, LAN keys and API keys —
//! created, changed, disabled and revoked through this one service, which the HTTP layer
//! only calls.
//!
//! Every input is checked here, by one function per kind of value that creation and
//! change share: ids, names, time zones, transports (`TransportConfig::from_request`, so
//! an edited transport is checked exactly like a new one), station printer lists (all of
//! the station's store). Every change is written together with its row of the set-up
//! audit (who: `admin` or `api_key:ID`; what; a detail that never holds a secret, the
//! transport appearing only as `TransportConfig::redacted` shows it), and once it is
//! durable the directory forgets what it cached about the object, so that the next
//! request on this node sees the change. Other nodes see it when their cached entry
//! expires ([`crate::directory::DEFAULT_TTL`]).
//!
//! What changes do to tasks:
//! - A printer's new name or transport applies from its next delivery: the delivery in
//!   flight (which may be printing) is not taken back, and its acknowledgement applies as
//!   usual, because acks go by task id and attempt.
//! - A disabled printer's lane is handed out to nobody (`LaneEngine::claim`): its waiting
//!   tasks stay waiting, visible, and may be transferred by an operator; the task in flight
//!   is not taken back and its ack still applies. New submissions to it are refused
//!   (`IntakeError::PrinterDisabled`), duplicates of existing tasks are answered as before;
//!   a station sends new tasks to its first enabled printer.
//! - A station's new printer list applies to tasks created afterwards; tasks keep the
//!   printer they were given.
//! - A revoked agent token or API key is refused from the next request on (401).

use std::sync::Arc;

use onceprint_core::{validate_id, CoreError};
use onceprint_store::{
    AgentToken, ApiKey, KeyRevocation, NewAgentToken, NewApiKey, NewPrinter, NewStation, NewStore, NewTenant, Printer,
    PrinterEnabled, PrinterSecret, PrinterSecretChange, PrinterUpdate, RevokeAgentToken, RevokeApiKey, SetupAudit,
    SetupEvent, Station, StationUpdate, Store, StoreError, StoreRow, Tenant, TokenHash, TokenKind,
};
use serde_json::{json, Value};

use crate::clock::now_ms;
use crate::transport::{TransportConfig, TransportKind};
use crate::tz::{self, ZoneError};
use crate::{secrets, Directory};

/// What a LAN key's stored hash starts with. A broker of the release before LAN keys
/// looks agent tokens up by the bare SHA-256 of the token it was sent and does not know
/// their `kind` column; with the prefix no such look-up can ever match a LAN key, so even
/// an older node of a cluster in a rolling upgrade never takes one for an agent token.
pub const LAN_KEY_HASH_PREFIX: &str = "lan:";

/// The stored hash of a LAN key.
fn lan_key_hash(key: &str) -> String {
    format!("{LAN_KEY_HASH_PREFIX}{}", secrets::hash(key))
}

/// Most printers of one station.
const MAX_STATION_PRINTERS: usize = 16;
/// How often an edit is tried again when the object changed between reading and writing.
const EDIT_ATTEMPTS: usize = 3;

/// Why a set-up call was refused.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// Input that can never be right; the message names the field.
    #[error(transparent)]
    Invalid(#[from] CoreError),
    #[error(transparent)]
    Zone(#[from] ZoneError),
    /// The object named (in the path, or referenced in the body) is not the tenant's.
    #[error("{0}")]
    NotFound(String),
    /// Revoking the tenant's last active API key would lock it out of its own set-up.
    #[error(
        "API key {0:?} is the tenant's last active key; create another key (POST /v1/api-keys) before revoking this one"
    )]
    LastApiKey(String),
    /// The object kept changing under concurrent edits.
    #[error("{0}")]
    Conflict(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Who calls tenant set-up: a tenant's API key (the audit names it `api_key:ID`) or a
/// manager on the staff console (`operator:ID`). Both go through the same checks; only
/// the name in the audit differs, so that a change made at the counter says who made it.
#[derive(Debug, Clone, Copy)]
pub struct Caller<'a> {
    pub tenant_id: &'a str,
    by: CallerKind<'a>,
}

#[derive(Debug, Clone, Copy)]
enum CallerKind<'a> {
    ApiKey(&'a str),
    Operator(&'a str),
}

impl<'a> Caller<'a> {
    /// The tenant's API key `key_id`.
    pub fn api_key(tenant_id: &'a str, key_id: &'a str) -> Caller<'a> {
        Caller { tenant_id, by: CallerKind::ApiKey(key_id) }
    }

    /// An operator of the tenant. Whether the operator may change the set-up (a manager)
    /// is the console's check, as the API key's is the API's.
    pub fn operator(tenant_id: &'a str, operator_id: &'a str) -> Caller<'a> {
        Caller { tenant_id, by: CallerKind::Operator(operator_id) }
    }

    /// The audit's name of the caller: `api_key:ID` or `operator:ID`.
    pub fn actor(&self) -> String {
        match self.by {
            CallerKind::ApiKey(id) => format!("api_key:{id}"),
            CallerKind::Operator(id) => format!("operator:{id}"),
        }
    }

    fn audit(&self, detail: Value) -> SetupAudit {
        SetupAudit { actor: self.actor(), detail }
    }
}

/// A new tenant and its first API key (the key is shown once).
#[derive(Debug, Clone)]
pub struct TenantCreated {
    pub tenant: Tenant,
    pub api_key_id: String,
    pub api_key: String,
}

/// A printer's login, as shown once when it is made: the user name and the password the
/// printer presents (HTTP Basic on `/cloudprnt` and `/epson-sdp`, HTTP Digest too on
/// `/epson-sdp`, or on the MQTT server). Only the password's SHA-256 is kept, and for an
/// Epson Server Direct Print printer its Digest `HA1`s.
#[derive(Clone, PartialEq, Eq)]
pub struct PrinterLogin {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for PrinterLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrinterLogin").field("username", &self.username).field("password", &"***").finish()
    }
}

impl PrinterLogin {
    /// A new login: a random user name (`prn_` and 16 hex digits, unique across tenants,
    /// so that it alone says whose printer calls) and a random password of 30 characters
    /// of `[A-Za-z0-9_-]` (180 bits, [`secrets::printer_password`]): TM Web Config takes
    /// at most 30 characters of letters, digits, `_`, `.` and `-`, and every kind of
    /// printer gets the same kind of password. Logins made earlier (`opp_` and 64 hex
    /// digits) keep working until they are rotated.
    pub fn generate() -> PrinterLogin {
        PrinterLogin { username: secrets::short_id("prn_"), password: secrets::printer_password() }
    }

    /// The login as kept: the SHA-256 the broker checks, for a printer that logs in to
    /// the MQTT server the hash that server checks (written to its password file), and for
    /// an Epson Server Direct Print printer, which may sign in with HTTP Digest, the `HA1`s
    /// that Digest answers are checked with. Those are password equivalents for Digest, so
    /// no other kind of printer gets them.
    fn stored(&self, kind: TransportKind) -> PrinterSecret {
        let digest = kind == TransportKind::EpsonSdp;
        let ha1 = |algorithm| digest.then(|| secrets::digest_ha1(algorithm, &self.username, &self.password));
        PrinterSecret {
            username: self.username.clone(),
            secret_hash: secrets::hash(&self.password),
            mqtt_hash: (kind == TransportKind::Mqtt).then(|| secrets::mosquitto_hash(&self.password)),
            ha1_md5: ha1(secrets::DigestAlgorithm::Md5),
            ha1_sha256: ha1(secrets::DigestAlgorithm::Sha256),
        }
    }
}

/// A printer as the caller wants it registered.
#[derive(Debug, Clone)]
pub struct PrinterSpec {
    pub id: String,
    pub store_id: String,
    /// Defaults to the id.
    pub name: Option<String>,
    /// The transport object as the client sent it.
    pub transport: Value,
}

/// A change of a printer: whatever is `Some`. The store cannot change; naming the
/// printer's own store is allowed (a client may send back what it read), another one is
/// refused.
#[derive(Debug, Clone, Default)]
pub struct PrinterChange {
    pub name: Option<String>,
    pub transport: Option<Value>,
    pub store_id: Option<String>,
}

/// Who disables or enables a printer, and why (as for the manual actions).
#[derive(Debug, Clone)]
pub struct Reason {
    pub operator: String,
    pub reason: String,
}

/// A page of the set-up audit.
#[derive(Debug, Clone)]
pub struct SetupPage {
    pub events: Vec<SetupEvent>,
    /// The cursor of the next page; `None` on the last.
    pub next_cursor: Option<String>,
}

/// The set-up service. Share it behind an `Arc`.
pub struct Setup {
    store: Arc<dyn Store>,
    directory: Arc<Directory>,
    /// Whether this broker is connected to an MQTT server (`serve --mqtt-url`): without
    /// one, an `mqtt` printer could never be reached, so it is refused at set-up.
    mqtt: bool,
    /// Wakes the store of a changed printer, whose lane may move now (an enabled printer,
    /// a new transport).
    signals: Option<Arc<crate::StoreSignals>>,
}

/// Lengths count characters, as the OpenAPI document's `maxLength` does.
fn check_name(field: &str, name: &str) -> Result<(), CoreError> {
    if name.trim().is_empty() || name.chars().count() > 200 || name.chars().any(char::is_control) {
        return Err(CoreError::invalid(field, "must be 1–200 characters without control characters"));
    }
    Ok(())
}

/// The transport as the API shows it (secrets as `"***"`), for the audit; a stored
/// configuration this version cannot read shows as `null`, never as stored.
fn shown_transport(stored: &str) -> Value {
    TransportConfig::from_stored(stored).map(|t| t.redacted()).unwrap_or(Value::Null)
}

/// Longest station failover threshold: a day. A station that should never fail over on
/// a pause has one printer, or relies on the print types' `max_wait_ms`.
const MAX_FAILOVER_AFTER_MS: i64 = 86_400_000;

/// Checks a station's own failover threshold.
fn check_failover_after(ms: Option<i64>) -> Result<(), SetupError> {
    match ms {
        Some(ms) if !(0..=MAX_FAILOVER_AFTER_MS).contains(&ms) => Err(CoreError::invalid(
            "failover_after_ms",
            format!("must be between 0 and {MAX_FAILOVER_AFTER_MS} (a day), or null for the broker's; got {ms}"),
        )
        .into()),
        _ => Ok(()),
    }
}

/// Checks a station's printer list as given, before anything is looked up.
fn check_printer_list(printers: &[String]) -> Result<(), CoreError> {
    if printers.is_empty() || printers.len() > MAX_STATION_PRINTERS {
        return Err(CoreError::invalid(
            "printers",
            format!("give 1–{MAX_STATION_PRINTERS} printer ids, the primary first"),
        ));
    }
    for (i, p) in printers.iter().enumerate() {
        validate_id(&format!("printers[{i}]"), p)?;
        if printers[..i].contains(p) {
            return Err(CoreError::invalid(format!("printers[{i}]"), format!("{p:?} is listed twice")));
        }
    }
    Ok(())
}

impl Setup {
    pub fn new(store: Arc<dyn Store>, directory: Arc<Directory>) -> Setup {
        Setup { store, directory, mqtt: false, signals: None }
    }

    /// Wakes the waiting polls of a printer's store after the printer changed.
    pub fn with_signals(mut self, signals: Arc<crate::StoreSignals>) -> Setup {
        self.signals = Some(signals);
        self
    }

    fn wake(&self, p: &Printer) {
        if let Some(s) = &self.signals {
            s.notify(&p.tenant_id, &p.store_id);
        }
    }

    /// Says whether the broker has an MQTT server to reach `mqtt` printers through.
    pub fn with_mqtt(mut self, enabled: bool) -> Setup {
        self.mqtt = enabled;
        self
    }

    /// What a transport needs beyond its own fields: an `mqtt` printer needs the broker's
    /// MQTT server, and its device address (MAC or device id) must be no other printer's,
    /// of any tenant, since the MQTT server's topics are shared by everyone on it and a
    /// device's results must name exactly one printer.
    async fn check_transport_here(
        &self,
        tenant_id: &str,
        printer_id: &str,
        transport: &TransportConfig,
    ) -> Result<(), SetupError> {
        let TransportConfig::Mqtt(m) = transport else { return Ok(()) };
        if !self.mqtt {
            return Err(CoreError::invalid(
                "transport.kind",
                "mqtt printers need the broker to be connected to an MQTT server: start `onceprint serve` with \
                 --mqtt-url mqtt://HOST:PORT (or ONCEPRINT_MQTT_URL, or mqtt_url in the configuration file)",
            )
            .into());
        }
        for other in self.store.printers_by_transport(TransportKind::Mqtt.as_str()).await? {
            if other.tenant_id == tenant_id && other.id == printer_id {
                continue;
            }
            if let Some(TransportConfig::Mqtt(o)) = TransportConfig::from_stored(&other.transport) {
                if o.protocol == m.protocol && o.device() == m.device() {
                    let field = match m.protocol {
                        crate::transport::MqttProtocol::Cloudprnt => "transport.mac",
                        crate::transport::MqttProtocol::Onceprint => "transport.device_id",
                    };
                    return Err(CoreError::invalid(
                        field,
                        format!("{:?} is already registered as another printer on this broker", m.device()),
                    )
                    .into());
                }
            }
        }
        Ok(())
    }

    /// A tenant and its first API key (admin).
    pub async fn create_tenant(&self, id: String, name: String) -> Result<TenantCreated, SetupError> {
        validate_id("id", &id)?;
        check_name("name", &name)?;
        let api_key = secrets::generate("opk_");
        let api_key_id = secrets::short_id("key_");
        let tenant = self
            .store
            .create_tenant(NewTenant {
                audit: SetupAudit { actor: "admin".into(), detail: json!({ "name": name, "api_key_id": api_key_id }) },
                id,
                name,
                api_key_id: api_key_id.clone(),
                api_key_hash: secrets::hash(&api_key),
                now: now_ms(),
            })
            .await?;
        Ok(TenantCreated { tenant, api_key_id, api_key })
    }

    /// A store of the tenant. `timezone`: an IANA name or a fixed offset (default UTC).
    pub async fn create_store(
        &self,
        caller: Caller<'_>,
        id: String,
        name: String,
        timezone: Option<&str>,
    ) -> Result<StoreRow, SetupError> {
        validate_id("id", &id)?;
        check_name("name", &name)?;
        // The canonical text is what the store keeps.
        let zone = tz::parse(timezone.unwrap_or_default())?;
        let timezone = zone.name().to_owned();
        Ok(self
            .store
            .create_store(NewStore {
                audit: caller.audit(json!({ "name": name, "timezone": timezone })),
                tenant_id: caller.tenant_id.to_owned(),
                id,
                name,
                timezone,
                now: now_ms(),
            })
            .await?)
    }

    /// A printer bound to one store of the tenant. A printer that calls the broker
    /// (CloudPRNT, Epson Server Direct Print, MQTT) gets its own login, returned once.
    pub async fn create_printer(
        &self,
        caller: Caller<'_>,
        spec: PrinterSpec,
    ) -> Result<(Printer, Option<PrinterLogin>), SetupError> {
        validate_id("id", &spec.id)?;
        validate_id("store_id", &spec.store_id)?;
        let name = spec.name.unwrap_or_else(|| spec.id.clone());
        check_name("name", &name)?;
        let transport = TransportConfig::from_request(spec.transport)?;
        self.check_transport_here(caller.tenant_id, &spec.id, &transport).await?;
        let kind = transport.kind();
        let login = kind.has_login().then(PrinterLogin::generate);
        let printer = self
            .store
            .create_printer(NewPrinter {
                credential: login.as_ref().map(|l| l.stored(kind)),
                audit: caller.audit(json!({
                    "store_id": spec.store_id, "name": name, "transport": transport.redacted(),
                })),
                tenant_id: caller.tenant_id.to_owned(),
                id: spec.id,
                store_id: spec.store_id,
                name,
                transport: transport.to_stored_json(),
                now: now_ms(),
            })
            .await?;
        // Nothing was cached under the new id (misses are not cached); forgetting anyway
        // keeps "every change forgets its object" without exceptions.
        self.directory.forget_printer(&printer.tenant_id, &printer.id);
        Ok((printer, login))
    }

    /// Gives a printer a new login (shown once); the old one stops working at once.
    pub async fn rotate_printer_login(&self, caller: Caller<'_>, printer_id: &str) -> Result<PrinterLogin, SetupError> {
        let not_found = || SetupError::NotFound(format!("no printer {printer_id:?}"));
        let printer = self.store.get_printer(caller.tenant_id, printer_id).await?.ok_or_else(not_found)?;
        let kind = TransportConfig::from_stored(&printer.transport).map(|t| t.kind());
        // A printer the broker reaches itself has no login: there is nothing to rotate, as
        // for a printer that does not exist.
        let Some(kind) = kind.filter(|k| k.has_login()) else {
            return Err(SetupError::NotFound(format!(
                "printer {printer_id:?} has no login: only cloudprnt, epson_sdp and mqtt printers log in to the broker"
            )));
        };
        let login = PrinterLogin::generate();
        let changed = self
            .store
            .set_printer_secret(PrinterSecretChange {
                tenant_id: caller.tenant_id.to_owned(),
                printer_id: printer_id.to_owned(),
                secret: login.stored(kind),
                now: now_ms(),
                audit: caller.audit(json!({ "username": login.username })),
            })
            .await?;
        if !changed {
            return Err(not_found());
        }
        self.directory.forget_printer(caller.tenant_id, printer_id);
        Ok(login)
    }

    /// Changes a printer's name and/or transport; the next delivery goes by them.
    pub async fn update_printer(
        &self,
        caller: Caller<'_>,
        printer_id: &str,
        change: PrinterChange,
    ) -> Result<Printer, SetupError> {
        if change.name.is_none() && change.transport.is_none() {
            return Err(CoreError::invalid("name", "give a new name and/or transport").into());
        }
        if let Some(name) = &change.name {
            check_name("name", name)?;
        }
        let transport = change.transport.map(TransportConfig::from_request).transpose()?;
        if let Some(t) = &transport {
            self.check_transport_here(caller.tenant_id, printer_id, t).await?;
        }
        for _ in 0..EDIT_ATTEMPTS {
            let current = self.printer_of(caller, printer_id).await?;
            // `store_id` names the store the printer is looked up in: a printer never moves
            // to another store, so in any other store (known or not) there is no such printer.
            if let Some(store_id) = change.store_id.as_deref().filter(|s| *s != current.store_id) {
                return Err(SetupError::NotFound(format!(
                    "no printer {printer_id:?} in store {store_id:?}: a printer stays in the store it was \
                     registered in; register a new printer in that store instead"
                )));
            }
            let name = change.name.clone().unwrap_or_else(|| current.name.clone());
            let stored = transport.as_ref().map_or_else(|| current.transport.clone(), |t| t.to_stored_json());
            if name == current.name && stored == current.transport {
                return Ok(current);
            }
            let detail = json!({
                "before": { "name": current.name, "transport": shown_transport(&current.transport) },
                "after": { "name": name, "transport": shown_transport(&stored) },
            });
            let update = PrinterUpdate {
                tenant_id: caller.tenant_id.to_owned(),
                id: printer_id.to_owned(),
                expected_name: current.name,
                expected_transport: current.transport,
                name,
                transport: stored,
                now: now_ms(),
                audit: caller.audit(detail),
            };
            if let Some(p) = self.store.update_printer(update).await? {
                self.directory.forget_printer(caller.tenant_id, printer_id);
                self.wake(&p);
                return Ok(p);
            }
            // Changed between the read and the write: read it again.
        }
        Err(SetupError::Conflict(format!("printer {printer_id:?} kept changing while being edited; try again")))
    }

    /// Disables (`enabled = false`) or enables a printer. Setting the state it has is
    /// answered with the printer as it is, and audits nothing.
    pub async fn set_printer_enabled(
        &self,
        caller: Caller<'_>,
        printer_id: &str,
        enabled: bool,
        why: Reason,
    ) -> Result<Printer, SetupError> {
        crate::operations::check_text("operator", &why.operator, 200)?;
        crate::operations::check_text("reason", &why.reason, 2000)?;
        let change = PrinterEnabled {
            tenant_id: caller.tenant_id.to_owned(),
            id: printer_id.to_owned(),
            enabled,
            now: now_ms(),
            audit: caller.audit(json!({ "operator": why.operator, "reason": why.reason })),
        };
        let printer = self.store.set_printer_enabled(change).await?.ok_or_else(|| no_printer(printer_id))?;
        self.directory.forget_printer(caller.tenant_id, printer_id);
        self.wake(&printer);
        Ok(printer)
    }

    /// A failover station: a primary and backups, all of one store of the tenant,
    /// with its own failover threshold or the broker's (`failover_after_ms`).
    pub async fn create_station(
        &self,
        caller: Caller<'_>,
        id: String,
        store_id: String,
        printers: Vec<String>,
        failover_after_ms: Option<i64>,
    ) -> Result<Station, SetupError> {
        validate_id("id", &id)?;
        validate_id("store_id", &store_id)?;
        check_printer_list(&printers)?;
        check_failover_after(failover_after_ms)?;
        self.store_of(caller, &store_id).await?;
        self.check_printers_in_store(caller, &store_id, &printers).await?;
        let station = self
            .store
            .create_station(NewStation {
                audit: caller.audit(json!({
                    "store_id": store_id, "printers": printers, "failover_after_ms": failover_after_ms,
                })),
                tenant_id: caller.tenant_id.to_owned(),
                id,
                store_id,
                printers,
                failover_after_ms,
                now: now_ms(),
            })
            .await?;
        self.directory.forget_station(&station.tenant_id, &station.id);
        Ok(station)
    }

    /// Replaces a station's printers (primary first), checked like at creation, and/or its
    /// failover threshold (`Some(None)`: back to the broker's). Tasks already created keep
    /// their printer.
    pub async fn update_station(
        &self,
        caller: Caller<'_>,
        station_id: &str,
        printers: Option<Vec<String>>,
        failover_after_ms: Option<Option<i64>>,
    ) -> Result<Station, SetupError> {
        if let Some(p) = &printers {
            check_printer_list(p)?;
        }
        if let Some(t) = failover_after_ms {
            check_failover_after(t)?;
        }
        for _ in 0..EDIT_ATTEMPTS {
            let current = self
                .store
                .get_station(caller.tenant_id, station_id)
                .await?
                .ok_or_else(|| SetupError::NotFound(format!("no station {station_id:?}")))?;
            let printers = printers.clone().unwrap_or_else(|| current.printers.clone());
            let threshold = failover_after_ms.unwrap_or(current.failover_after_ms);
            if current.printers == printers && current.failover_after_ms == threshold {
                return Ok(current);
            }
            self.check_printers_in_store(caller, &current.store_id, &printers).await?;
            let update = StationUpdate {
                tenant_id: caller.tenant_id.to_owned(),
                id: station_id.to_owned(),
                audit: caller.audit(json!({
                    "before": { "printers": current.printers, "failover_after_ms": current.failover_after_ms },
                    "after": { "printers": printers, "failover_after_ms": threshold },
                })),
                expected_printers: current.printers,
                printers,
                failover_after_ms: threshold,
                now: now_ms(),
            };
            if let Some(s) = self.store.update_station(update).await? {
                self.directory.forget_station(caller.tenant_id, station_id);
                return Ok(s);
            }
        }
        Err(SetupError::Conflict(format!("station {station_id:?} kept changing while being edited; try again")))
    }

    /// A token for a store agent (shown once), which may serve only that store's printers.
    pub async fn create_agent_token(
        &self,
        caller: Caller<'_>,
        store_id: &str,
    ) -> Result<(AgentToken, String), SetupError> {
        self.create_store_token(caller, store_id, TokenKind::Agent, None).await
    }

    /// A store's agent tokens, active and revoked, oldest first.
    pub async fn agent_tokens(&self, caller: Caller<'_>, store_id: &str) -> Result<Vec<AgentToken>, SetupError> {
        self.store_tokens(caller, store_id, TokenKind::Agent).await
    }

    /// Revokes an agent token: from the next request on this node it is refused.
    pub async fn revoke_agent_token(
        &self,
        caller: Caller<'_>,
        store_id: &str,
        token_id: &str,
    ) -> Result<AgentToken, SetupError> {
        self.revoke_store_token(caller, store_id, token_id, TokenKind::Agent).await
    }

    /// A LAN key of the store (shown once): the store agent accepts submissions
    /// on its LAN listener with it, also while the broker is unreachable. `id` names it
    /// (generated when `None`). It authenticates nothing at the broker.
    pub async fn create_lan_key(
        &self,
        caller: Caller<'_>,
        store_id: &str,
        id: Option<String>,
    ) -> Result<(AgentToken, String), SetupError> {
        if let Some(id) = &id {
            validate_id("id", id)?;
        }
        self.create_store_token(caller, store_id, TokenKind::Lan, id).await
    }

    /// A store's LAN keys, active and revoked, oldest first (never a key or its hash).
    pub async fn lan_keys(&self, caller: Caller<'_>, store_id: &str) -> Result<Vec<AgentToken>, SetupError> {
        self.store_tokens(caller, store_id, TokenKind::Lan).await
    }

    /// Revokes a LAN key: the store agent refuses it once it fetched the store's keys again.
    pub async fn revoke_lan_key(
        &self,
        caller: Caller<'_>,
        store_id: &str,
        key_id: &str,
    ) -> Result<AgentToken, SetupError> {
        self.revoke_store_token(caller, store_id, key_id, TokenKind::Lan).await
    }

    /// The store agent holding the store's LAN listener (the only one that takes the
    /// store's LAN orders), if one does.
    pub async fn lan_listener(&self, caller: Caller<'_>, store_id: &str) -> Result<Option<String>, SetupError> {
        self.store_of(caller, store_id).await?;
        let name = crate::offline::lan_listener_lease(caller.tenant_id, store_id);
        Ok(self.store.lease_row(&name).await?.filter(|l| l.expires_at > now_ms()).map(|l| l.holder))
    }

    /// Frees the store's LAN listener, so that another store agent may take it (a shop PC
    /// replaced, say); answers the agent that held it. The agent that held it refuses LAN
    /// orders from its next refresh of the store's set-up on, or takes the listener
    /// again if it asks first: stop it (or its `--listen`) before releasing.
    pub async fn release_lan_listener(&self, caller: Caller<'_>, store_id: &str) -> Result<Option<String>, SetupError> {
        self.store_of(caller, store_id).await?;
        let name = crate::offline::lan_listener_lease(caller.tenant_id, store_id);
        let now = now_ms();
        let Some(held) = self.store.lease_row(&name).await?.filter(|l| l.expires_at > now) else { return Ok(None) };
        if self.store.release_lease(&name, &held.holder, now).await? {
            self.directory.forget_lan_listener(caller.tenant_id, store_id);
            tracing::info!(
                tenant_id = caller.tenant_id,
                store_id,
                agent_id = %held.holder,
                "the store's LAN listener was released"
            );
        }
        Ok(Some(held.holder))
    }

    /// The active LAN keys of an agent's store, as the agent checks them: each key's id and
    /// the SHA-256 (hex) of the whole key string.
    pub async fn lan_key_hashes(&self, tenant_id: &str, store_id: &str) -> Result<Vec<TokenHash>, SetupError> {
        let keys = self.store.active_token_hashes(tenant_id, store_id, TokenKind::Lan).await?;
        Ok(keys
            .into_iter()
            .filter_map(|k| {
                let hash = k.hash.strip_prefix(LAN_KEY_HASH_PREFIX)?.to_owned();
                Some(TokenHash { id: k.id, hash })
            })
            .collect())
    }

    /// One mechanism for both kinds of store credentials: a random secret shown once,
    /// its hash stored with the set-up audit row.
    async fn create_store_token(
        &self,
        caller: Caller<'_>,
        store_id: &str,
        kind: TokenKind,
        id: Option<String>,
    ) -> Result<(AgentToken, String), SetupError> {
        self.store_of(caller, store_id).await?;
        let (secret, token_hash, id) = match kind {
            TokenKind::Agent => {
                let t = secrets::generate("opa_");
                (t.clone(), secrets::hash(&t), id.unwrap_or_else(|| secrets::short_id("tok_")))
            }
            TokenKind::Lan => {
                let k = secrets::generate("opl_");
                (k.clone(), lan_key_hash(&k), id.unwrap_or_else(|| secrets::short_id("lan_")))
            }
        };
        let created = self
            .store
            .create_agent_token(NewAgentToken {
                id,
                kind,
                token_hash,
                tenant_id: caller.tenant_id.to_owned(),
                store_id: store_id.to_owned(),
                now: now_ms(),
                audit: caller.audit(json!({ "store_id": store_id })),
            })
            .await?;
        Ok((created, secret))
    }

    async fn store_tokens(
        &self,
        caller: Caller<'_>,
        store_id: &str,
        kind: TokenKind,
    ) -> Result<Vec<AgentToken>, SetupError> {
        self.store_of(caller, store_id).await?;
        Ok(self.store.list_agent_tokens(caller.tenant_id, store_id, kind).await?)
    }

    async fn revoke_store_token(
        &self,
        caller: Caller<'_>,
        store_id: &str,
        token_id: &str,
        kind: TokenKind,
    ) -> Result<AgentToken, SetupError> {
        let what = match kind {
            TokenKind::Agent => "agent token",
            TokenKind::Lan => "LAN key",
        };
        let revoked = self
            .store
            .revoke_agent_token(RevokeAgentToken {
                tenant_id: caller.tenant_id.to_owned(),
                store_id: store_id.to_owned(),
                id: token_id.to_owned(),
                kind,
                now: now_ms(),
                audit: caller.audit(json!({ "store_id": store_id })),
            })
            .await?
            .ok_or_else(|| SetupError::NotFound(format!("no {what} {token_id:?} in store {store_id:?}")))?;
        // LAN keys are never cached by the broker (it never checks them); forgetting the
        // hash anyway keeps one path for both kinds.
        self.directory.forget_agent_token(caller.tenant_id, &revoked.hash);
        Ok(revoked.row)
    }

    /// Another API key of the tenant (shown once).
    pub async fn create_api_key(&self, caller: Caller<'_>) -> Result<(ApiKey, String), SetupError> {
        let api_key = secrets::generate("opk_");
        let created = self
            .store
            .create_api_key(NewApiKey {
                tenant_id: caller.tenant_id.to_owned(),
                id: secrets::short_id("key_"),
                key_hash: secrets::hash(&api_key),
                now: now_ms(),
                audit: caller.audit(json!({})),
            })
            .await?;
        Ok((created, api_key))
    }

    /// The tenant's API keys, active and revoked, oldest first.
    pub async fn api_keys(&self, caller: Caller<'_>) -> Result<Vec<ApiKey>, SetupError> {
        Ok(self.store.list_api_keys(caller.tenant_id).await?)
    }

    /// Revokes an API key (the caller's own included), unless it is the last active one.
    pub async fn revoke_api_key(&self, caller: Caller<'_>, key_id: &str) -> Result<ApiKey, SetupError> {
        let change = RevokeApiKey {
            tenant_id: caller.tenant_id.to_owned(),
            id: key_id.to_owned(),
            now: now_ms(),
            audit: caller.audit(json!({})),
        };
        match self.store.revoke_api_key(change).await? {
            KeyRevocation::Revoked(r) => {
                self.directory.forget_tenant_key(caller.tenant_id, &r.hash);
                Ok(r.row)
            }
            KeyRevocation::LastActiveKey => Err(SetupError::LastApiKey(key_id.to_owned())),
            KeyRevocation::NotFound => Err(SetupError::NotFound(format!("no API key {key_id:?}"))),
        }
    }

    /// The tenant's set-up audit, newest first. `limit` 1–500 (default 50); `cursor` is
    /// the `next_cursor` of the previous page.
    pub async fn events(
        &self,
        caller: Caller<'_>,
        limit: Option<i64>,
        cursor: Option<&str>,
    ) -> Result<SetupPage, SetupError> {
        let limit = limit.unwrap_or(50);
        if !(1..=500).contains(&limit) {
            return Err(CoreError::invalid("limit", "must be 1–500").into());
        }
        let before = match cursor.filter(|c| !c.is_empty()) {
            None => None,
            Some(c) => Some(
                c.parse::<i64>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| CoreError::invalid("cursor", "not a cursor from this API"))?,
            ),
        };
        let events = self.store.setup_events(caller.tenant_id, limit, before).await?;
        let next_cursor = if events.len() as i64 == limit { events.last().map(|e| e.id.to_string()) } else { None };
        Ok(SetupPage { events, next_cursor })
    }

    async fn printer_of(&self, caller: Caller<'_>, printer_id: &str) -> Result<Printer, SetupError> {
        self.store.get_printer(caller.tenant_id, printer_id).await?.ok_or_else(|| no_printer(printer_id))
    }

    async fn store_of(&self, caller: Caller<'_>, store_id: &str) -> Result<StoreRow, SetupError> {
        self.store
            .get_store(caller.tenant_id, store_id)
            .await?
            .ok_or_else(|| SetupError::NotFound(format!("no store {store_id:?}")))
    }

    /// Every printer of a station must be the tenant's and in the station's store (a
    /// failover can never carry a task to another store's printer). Read from the
    /// database, not the directory: set-up is rare, and must not act on a stale entry.
    async fn check_printers_in_store(
        &self,
        caller: Caller<'_>,
        store_id: &str,
        printers: &[String],
    ) -> Result<(), SetupError> {
        for (i, p) in printers.iter().enumerate() {
            match self.store.get_printer(caller.tenant_id, p).await? {
                // Another store's printer is, for a station of this store, no printer at all.
                Some(printer) if printer.store_id == store_id => {}
                _ => {
                    return Err(SetupError::NotFound(format!(
                        "printers[{i}]: no printer {p:?} in store {store_id:?}; a station's printers must all be in \
                         its store"
                    )))
                }
            }
        }
        Ok(())
    }
}

fn no_printer(printer_id: &str) -> SetupError {
    SetupError::NotFound(format!("no printer {printer_id:?}"))
}
