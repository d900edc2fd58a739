//! A read-through cache of the set-up objects that every request needs: tenants by API
//! key hash, agent identities by token hash, printers and stations. These objects are
//! created rarely and never deleted or moved between stores, so positive answers can be
//! kept for the life of the process; misses always ask the database, so an object created
//! by another broker node is found on first use.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use onceprint_store::{AgentIdentity, Printer, Station, Store, StoreResult, Tenant};

/// The directory cache. Cheap to share behind an `Arc`.
pub struct Directory {
    store: Arc<dyn Store>,
    tenants: RwLock<HashMap<String, Tenant>>,
    agents: RwLock<HashMap<String, AgentIdentity>>,
    printers: RwLock<HashMap<(String, String), Printer>>,
    stations: RwLock<HashMap<(String, String), Station>>,
}

fn cached<K: std::hash::Hash + Eq, V: Clone>(map: &RwLock<HashMap<K, V>>, k: &K) -> Option<V> {
    map.read().ok().and_then(|m| m.get(k).cloned())
}

fn remember<K: std::hash::Hash + Eq, V>(map: &RwLock<HashMap<K, V>>, k: K, v: V) {
    if let Ok(mut m) = map.write() {
        m.insert(k, v);
    }
}

impl Directory {
    pub fn new(store: Arc<dyn Store>) -> Directory {
        Directory {
            store,
            tenants: RwLock::default(),
            agents: RwLock::default(),
            printers: RwLock::default(),
            stations: RwLock::default(),
        }
    }

    pub async fn tenant_by_key_hash(&self, hash: &str) -> StoreResult<Option<Tenant>> {
        if let Some(t) = cached(&self.tenants, &hash.to_owned()) {
            return Ok(Some(t));
        }
        let found = self.store.tenant_by_key_hash(hash).await?;
        if let Some(t) = &found {
            remember(&self.tenants, hash.to_owned(), t.clone());
        }
        Ok(found)
    }

    pub async fn agent_by_token_hash(&self, hash: &str) -> StoreResult<Option<AgentIdentity>> {
        if let Some(a) = cached(&self.agents, &hash.to_owned()) {
            return Ok(Some(a));
        }
        let found = self.store.agent_by_token_hash(hash).await?;
        if let Some(a) = &found {
            remember(&self.agents, hash.to_owned(), a.clone());
        }
        Ok(found)
    }

    pub async fn printer(&self, tenant_id: &str, printer_id: &str) -> StoreResult<Option<Printer>> {
        let k = (tenant_id.to_owned(), printer_id.to_owned());
        if let Some(p) = cached(&self.printers, &k) {
            return Ok(Some(p));
        }
        let found = self.store.get_printer(tenant_id, printer_id).await?;
        if let Some(p) = &found {
            remember(&self.printers, k, p.clone());
        }
        Ok(found)
    }

    pub async fn station(&self, tenant_id: &str, station_id: &str) -> StoreResult<Option<Station>> {
        let k = (tenant_id.to_owned(), station_id.to_owned());
        if let Some(s) = cached(&self.stations, &k) {
            return Ok(Some(s));
        }
        let found = self.store.get_station(tenant_id, station_id).await?;
        if let Some(s) = &found {
            remember(&self.stations, k, s.clone());
        }
        Ok(found)
    }
}
