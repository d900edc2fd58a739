//! Which printer each device on the MQTT server is, and what the broker knows about its
//! connection: online or not, and how many times it came and went (its epoch), so that a
//! job in flight is sent again (same attempt, same token or key) once the device is back.

use std::collections::HashMap;
use std::sync::{PoisonError, RwLock};

use onceprint_engine::transport::{TransportConfig, TransportKind};
use onceprint_store::{Store, StoreResult};

use crate::protocol::DeviceAddr;

/// The printer a device is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub tenant_id: String,
    pub store_id: String,
    pub printer_id: String,
}

#[derive(Debug, Clone)]
struct Entry {
    /// `None` when two printers name this device (set-up refuses that; a race between two
    /// nodes could still make it): such a device's messages name no printer and are
    /// refused.
    owner: Option<Owner>,
    /// `None` until the device was heard since this process started.
    online: Option<bool>,
    epoch: u64,
    connection: Option<String>,
}

/// The devices of every `mqtt` printer. Share it behind an `Arc`.
#[derive(Default)]
pub struct Devices {
    map: RwLock<HashMap<DeviceAddr, Entry>>,
}

impl Devices {
    /// Reads the `mqtt` printers again; returns the devices not known before (the broker
    /// asks them for their status).
    pub async fn refresh(&self, store: &dyn Store) -> StoreResult<Vec<DeviceAddr>> {
        let mut fresh: HashMap<DeviceAddr, Option<Owner>> = HashMap::new();
        for p in store.printers_by_transport(TransportKind::Mqtt.as_str()).await? {
            let Some(TransportConfig::Mqtt(m)) = TransportConfig::from_stored(&p.transport) else { continue };
            let addr = DeviceAddr::new(m.protocol, m.device());
            let owner = Owner { tenant_id: p.tenant_id, store_id: p.store_id, printer_id: p.id };
            fresh
                .entry(addr)
                .and_modify(|o| {
                    tracing::error!(?owner, "two printers name one MQTT device; its messages are refused");
                    *o = None;
                })
                .or_insert(Some(owner));
        }
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        let mut new = Vec::new();
        map.retain(|addr, _| fresh.contains_key(addr));
        for (addr, owner) in fresh {
            match map.get_mut(&addr) {
                Some(e) => e.owner = owner,
                None => {
                    new.push(addr.clone());
                    map.insert(addr, Entry { owner, online: None, epoch: 0, connection: None });
                }
            }
        }
        Ok(new)
    }

    /// Every known device.
    pub fn all(&self) -> Vec<DeviceAddr> {
        self.map.read().unwrap_or_else(PoisonError::into_inner).keys().cloned().collect()
    }

    /// The printer `addr` is; `None` for an unknown or ambiguous device.
    pub fn owner(&self, addr: &DeviceAddr) -> Option<Owner> {
        self.map.read().unwrap_or_else(PoisonError::into_inner).get(addr).and_then(|e| e.owner.clone())
    }

    /// Whether the device is online: as last heard, else as the printer row says
    /// (`stored`, what it was when this process had not yet heard from it).
    pub fn online(&self, addr: &DeviceAddr, stored: bool) -> bool {
        self.map.read().unwrap_or_else(PoisonError::into_inner).get(addr).and_then(|e| e.online).unwrap_or(stored)
    }

    /// The device's epoch: it changes whenever the device went away or came back.
    pub fn epoch(&self, addr: &DeviceAddr) -> u64 {
        self.map.read().unwrap_or_else(PoisonError::into_inner).get(addr).map_or(0, |e| e.epoch)
    }

    /// Records a status; returns whether the device came (back) online with it.
    pub fn heard(&self, addr: &DeviceAddr, online: bool, connection: Option<&str>) -> bool {
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        let Some(e) = map.get_mut(addr) else { return false };
        let new_connection = connection.is_some() && e.connection.as_deref() != connection;
        let came = online && (e.online != Some(true) || new_connection);
        if came || (!online && e.online != Some(false)) {
            e.epoch += 1;
        }
        e.online = Some(online);
        if connection.is_some() {
            e.connection = connection.map(str::to_owned);
        }
        came
    }
}
