//! A read-through cache of the set-up objects that every request needs: tenants by API
//! key hash, agent identities by token hash, printer logins by password hash and (for
//! HTTP Digest) by user name, printers (with their transport parsed once, here),
//! stations, and each store's count of agent printers (its agent's rate budget).
//!
//! Entries are forgotten when this process changes the object (set-up calls
//! [`Directory::forget_printer`] and friends after the change is durable), when another
//! broker node on the same database says it changed one (`crate::cluster`: the same
//! forgets, heard within milliseconds) and, as a safety net for a word that got lost,
//! after a short time to live. Misses always ask the database, so an object created
//! elsewhere is found on first use.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use onceprint_store::{
    AgentIdentity, Printer, PrinterCredential, PrinterDigestLogin, Station, Store, StoreResult, TenantKey,
};

use crate::cluster::{Outbox, Word};
use crate::transport::TransportConfig;

/// How long a cached answer is trusted before the database is asked again.
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);

/// A printer with its transport parsed.
#[derive(Debug, Clone)]
pub struct PrinterInfo {
    pub row: Printer,
    /// `None` when the stored configuration is not one this version can read: such a
    /// printer is served by no transport.
    pub transport: Option<TransportConfig>,
}

impl PrinterInfo {
    pub fn new(row: Printer) -> PrinterInfo {
        let transport = TransportConfig::from_stored(&row.transport);
        PrinterInfo { row, transport }
    }
}

struct Cache<K, V> {
    map: RwLock<HashMap<K, (Instant, V)>>,
}

impl<K: std::hash::Hash + Eq, V: Clone> Cache<K, V> {
    fn new() -> Self {
        Cache { map: RwLock::default() }
    }

    fn get(&self, k: &K, ttl: Duration) -> Option<V> {
        let map = self.map.read().ok()?;
        map.get(k).filter(|(at, _)| at.elapsed() < ttl).map(|(_, v)| v.clone())
    }

    fn put(&self, k: K, v: V) {
        if let Ok(mut m) = self.map.write() {
            m.insert(k, (Instant::now(), v));
        }
    }

    fn forget(&self, k: &K) {
        if let Ok(mut m) = self.map.write() {
            m.remove(k);
        }
    }

    fn clear(&self) {
        if let Ok(mut m) = self.map.write() {
            m.clear();
        }
    }

    fn forget_where(&self, f: impl Fn(&K, &V) -> bool) {
        if let Ok(mut m) = self.map.write() {
            m.retain(|k, (_, v)| !f(k, v));
        }
    }
}

/// Reads how many enabled agent printers the store `k` has and keeps the count.
async fn count_agent_printers(
    store: &dyn Store,
    counts: &Cache<(String, String), usize>,
    k: &(String, String),
) -> Option<usize> {
    match store.list_printers(&k.0, Some(&k.1)).await {
        Ok(printers) => {
            let n = printers
                .iter()
                .filter(|p| p.enabled)
                .filter(|p| matches!(TransportConfig::from_stored(&p.transport), Some(TransportConfig::Agent(_))))
                .count();
            counts.put(k.clone(), n);
            Some(n)
        }
        // The count is only a budget: until a read succeeds the agent has the configured
        // limit, and a later request reads again.
        Err(e) => {
            tracing::debug!(tenant_id = %k.0, store_id = %k.1, error = %e, "cannot count the store's agent printers");
            None
        }
    }
}

/// The directory cache. Cheap to share behind an `Arc`.
pub struct Directory {
    store: Arc<dyn Store>,
    ttl: Duration,
    tenants: Cache<String, TenantKey>,
    agents: Cache<String, AgentIdentity>,
    printers: Cache<(String, String), Arc<PrinterInfo>>,
    stations: Cache<(String, String), Station>,
    logins: Cache<String, PrinterCredential>,
    /// Printer logins by user name, with their Digest keys (HTTP Digest names the user).
    digest_logins: Cache<String, PrinterDigestLogin>,
    /// The agent holding each store's LAN listener (`None`: no agent does).
    lan_listeners: Cache<(String, String), Option<String>>,
    /// How many enabled agent printers each store has: what its agent's rate budget grows
    /// with. Read in the background (see [`Directory::agent_printer_count`]).
    agent_printer_counts: Arc<Cache<(String, String), usize>>,
    /// The stores whose count is being read now, so that a busy agent starts one read.
    counting: Arc<Mutex<HashSet<(String, String)>>>,
    /// Where forgets for the other nodes go, once the cluster link is attached.
    outbox: OnceLock<Arc<Outbox>>,
}

impl Directory {
    pub fn new(store: Arc<dyn Store>) -> Directory {
        Directory::with_ttl(store, DEFAULT_TTL)
    }

    pub fn with_ttl(store: Arc<dyn Store>, ttl: Duration) -> Directory {
        Directory {
            store,
            ttl,
            tenants: Cache::new(),
            agents: Cache::new(),
            printers: Cache::new(),
            stations: Cache::new(),
            logins: Cache::new(),
            digest_logins: Cache::new(),
            lan_listeners: Cache::new(),
            agent_printer_counts: Arc::new(Cache::new()),
            counting: Arc::default(),
            outbox: OnceLock::new(),
        }
    }

    /// From now on, forgets are also queued for the other broker nodes.
    pub(crate) fn attach(&self, outbox: Arc<Outbox>) {
        let _ = self.outbox.set(outbox);
    }

    fn tell_others(&self, word: Word) {
        if let Some(outbox) = self.outbox.get() {
            outbox.push(word);
        }
    }

    /// The printer that logs in with `username` and `password` (CloudPRNT, Epson Server
    /// Direct Print, MQTT): `None` for a wrong pair, an unknown or a replaced login. One
    /// SHA-256 and, while cached, no database read: printers poll every few seconds.
    pub async fn printer_by_login(&self, username: &str, password: &str) -> StoreResult<Option<Arc<PrinterInfo>>> {
        let hash = crate::secrets::hash(password);
        let login = match self.logins.get(&hash, self.ttl) {
            Some(l) => Some(l),
            None => {
                let found = self.store.printer_by_secret_hash(&hash).await?;
                if let Some(l) = &found {
                    self.logins.put(hash.clone(), l.clone());
                }
                found
            }
        };
        let Some(login) = login else { return Ok(None) };
        // The hash alone finds the login; the user name must be its own too.
        if !crate::secrets::hashes_equal(&login.username, username) {
            return Ok(None);
        }
        self.printer_info(&login.tenant_id, &login.printer_id).await
    }

    /// The login named `username` with its Digest keys, and its printer (HTTP Digest
    /// sign-in, which never sends the password): `None` for an unknown or replaced login.
    /// Cached like [`Self::printer_by_login`]; an unknown name is asked again each time.
    pub async fn printer_by_digest_username(
        &self,
        username: &str,
    ) -> StoreResult<Option<(PrinterDigestLogin, Arc<PrinterInfo>)>> {
        let login = match self.digest_logins.get(&username.to_owned(), self.ttl) {
            Some(l) => l,
            None => match self.store.printer_login_by_username(username).await? {
                Some(l) => {
                    self.digest_logins.put(username.to_owned(), l.clone());
                    l
                }
                None => return Ok(None),
            },
        };
        let printer = self.printer_info(&login.tenant_id, &login.printer_id).await?;
        Ok(printer.map(|p| (login, p)))
    }

    /// The tenant of an active API key, and which key it is.
    pub async fn tenant_by_key_hash(&self, hash: &str) -> StoreResult<Option<TenantKey>> {
        if let Some(t) = self.tenants.get(&hash.to_owned(), self.ttl) {
            return Ok(Some(t));
        }
        let found = self.store.tenant_by_key_hash(hash).await?;
        if let Some(t) = &found {
            self.tenants.put(hash.to_owned(), t.clone());
        }
        Ok(found)
    }

    pub async fn agent_by_token_hash(&self, hash: &str) -> StoreResult<Option<AgentIdentity>> {
        if let Some(a) = self.agents.get(&hash.to_owned(), self.ttl) {
            return Ok(Some(a));
        }
        let found = self.store.agent_by_token_hash(hash).await?;
        if let Some(a) = &found {
            self.agents.put(hash.to_owned(), a.clone());
        }
        Ok(found)
    }

    /// A printer of the tenant with its transport parsed.
    pub async fn printer_info(&self, tenant_id: &str, printer_id: &str) -> StoreResult<Option<Arc<PrinterInfo>>> {
        let k = (tenant_id.to_owned(), printer_id.to_owned());
        if let Some(p) = self.printers.get(&k, self.ttl) {
            return Ok(Some(p));
        }
        let found = self.store.get_printer(tenant_id, printer_id).await?.map(|p| Arc::new(PrinterInfo::new(p)));
        if let Some(p) = &found {
            self.printers.put(k, p.clone());
        }
        Ok(found)
    }

    pub async fn printer(&self, tenant_id: &str, printer_id: &str) -> StoreResult<Option<Printer>> {
        Ok(self.printer_info(tenant_id, printer_id).await?.map(|p| p.row.clone()))
    }

    pub async fn station(&self, tenant_id: &str, station_id: &str) -> StoreResult<Option<Station>> {
        let k = (tenant_id.to_owned(), station_id.to_owned());
        if let Some(s) = self.stations.get(&k, self.ttl) {
            return Ok(Some(s));
        }
        let found = self.store.get_station(tenant_id, station_id).await?;
        if let Some(s) = &found {
            self.stations.put(k, s.clone());
        }
        Ok(found)
    }

    /// The store agent holding the store's LAN listener, if one does (a released lease
    /// holds nothing). Asked on every agent poll, so cached like the rest.
    pub async fn lan_listener(&self, tenant_id: &str, store_id: &str) -> StoreResult<Option<String>> {
        let k = (tenant_id.to_owned(), store_id.to_owned());
        if let Some(holder) = self.lan_listeners.get(&k, self.ttl) {
            return Ok(holder);
        }
        let name = crate::offline::lan_listener_lease(tenant_id, store_id);
        let now = crate::clock::now_ms();
        let holder = self.store.lease_row(&name).await?.filter(|l| l.expires_at > now).map(|l| l.holder);
        self.lan_listeners.put(k, holder.clone());
        Ok(holder)
    }

    /// How many enabled agent printers the store has: what its agent's rate budget grows
    /// with, looked at on every metered agent request. Only the first look at a store
    /// waits for the database (a miss, like every directory miss); after that the count
    /// comes from memory, and a stale one is read again in the background (needs a Tokio
    /// runtime) while the previous count answers, so that a busy agent's requests never
    /// wait for it. `None` when the database could not be read.
    pub async fn agent_printer_count(&self, tenant_id: &str, store_id: &str) -> Option<usize> {
        let k = (tenant_id.to_owned(), store_id.to_owned());
        let known = match self.agent_printer_counts.map.read() {
            Ok(m) => m.get(&k).map(|(at, n)| (at.elapsed() < self.ttl, *n)),
            Err(_) => None,
        };
        match known {
            Some((true, n)) => Some(n),
            Some((false, n)) => {
                self.recount_in_background(k);
                Some(n)
            }
            None => count_agent_printers(self.store.as_ref(), &self.agent_printer_counts, &k).await,
        }
    }

    fn recount_in_background(&self, k: (String, String)) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        if !self.counting.lock().unwrap_or_else(|p| p.into_inner()).insert(k.clone()) {
            return;
        }
        let (store, counts, counting) = (self.store.clone(), self.agent_printer_counts.clone(), self.counting.clone());
        runtime.spawn(async move {
            count_agent_printers(store.as_ref(), &counts, &k).await;
            counting.lock().unwrap_or_else(|p| p.into_inner()).remove(&k);
        });
    }

    /// After a store's LAN listener was taken or freed: the next look reads it again, on
    /// every node (the others forget all they hold of the tenant).
    pub fn forget_lan_listener(&self, tenant_id: &str, store_id: &str) {
        self.lan_listeners.forget(&(tenant_id.to_owned(), store_id.to_owned()));
        self.tell_others(Word::Tenant { tenant_id: tenant_id.to_owned() });
    }

    /// After a printer changed: the next look reads it again, on every node.
    pub fn forget_printer(&self, tenant_id: &str, printer_id: &str) {
        self.forget_printer_here(tenant_id, printer_id);
        self.tell_others(Word::Printer { tenant_id: tenant_id.to_owned(), printer_id: printer_id.to_owned() });
    }

    pub(crate) fn forget_printer_here(&self, tenant_id: &str, printer_id: &str) {
        self.printers.forget(&(tenant_id.to_owned(), printer_id.to_owned()));
        // A printer added, moved or disabled changes its store's count: the next agent
        // request of the tenant's stores reads it again.
        self.agent_printer_counts.forget_where(|(t, _), _| t == tenant_id);
        // A rotated login must stop working on this node at once.
        self.logins.forget_where(|_, l| l.tenant_id == tenant_id && l.printer_id == printer_id);
        self.digest_logins.forget_where(|_, l| l.tenant_id == tenant_id && l.printer_id == printer_id);
    }

    pub fn forget_station(&self, tenant_id: &str, station_id: &str) {
        self.forget_station_here(tenant_id, station_id);
        self.tell_others(Word::Station { tenant_id: tenant_id.to_owned(), station_id: station_id.to_owned() });
    }

    pub(crate) fn forget_station_here(&self, tenant_id: &str, station_id: &str) {
        self.stations.forget(&(tenant_id.to_owned(), station_id.to_owned()));
    }

    /// After an API key of the tenant was revoked. The other nodes forget all they hold of
    /// the tenant: the key's hash is not sent between nodes.
    pub fn forget_tenant_key(&self, tenant_id: &str, key_hash: &str) {
        self.tenants.forget(&key_hash.to_owned());
        self.tell_others(Word::Tenant { tenant_id: tenant_id.to_owned() });
    }

    /// After an agent token of the tenant was revoked (on the other nodes as for a key).
    pub fn forget_agent_token(&self, tenant_id: &str, token_hash: &str) {
        self.agents.forget(&token_hash.to_owned());
        self.tell_others(Word::Tenant { tenant_id: tenant_id.to_owned() });
    }

    /// After something about a whole tenant changed.
    pub fn forget_tenant(&self, tenant_id: &str) {
        self.forget_tenant_here(tenant_id);
        self.tell_others(Word::Tenant { tenant_id: tenant_id.to_owned() });
    }

    pub(crate) fn forget_tenant_here(&self, tenant_id: &str) {
        self.tenants.forget_where(|_, k| k.tenant.id == tenant_id);
        self.agents.forget_where(|_, a| a.tenant_id == tenant_id);
        self.printers.forget_where(|(t, _), _| t == tenant_id);
        self.stations.forget_where(|(t, _), _| t == tenant_id);
        self.logins.forget_where(|_, l| l.tenant_id == tenant_id);
        self.digest_logins.forget_where(|_, l| l.tenant_id == tenant_id);
        self.lan_listeners.forget_where(|(t, _), _| t == tenant_id);
        self.agent_printer_counts.forget_where(|(t, _), _| t == tenant_id);
    }

    /// Forgets every entry of this process (forgets from other nodes may have been lost).
    pub(crate) fn forget_everything_here(&self) {
        self.tenants.clear();
        self.agents.clear();
        self.printers.clear();
        self.stations.clear();
        self.logins.clear();
        self.digest_logins.clear();
        self.lan_listeners.clear();
        self.agent_printer_counts.clear();
    }
}
