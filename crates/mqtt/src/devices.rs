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
    ///
    /// The epoch changes when the device went away (its last will) and whenever it came
    /// back after that or with a new connection id; the first status this process hears
    /// from a device, online and without a connection id (a Star printer answering the
    /// status request every device is sent when the broker connects), says nothing of the
    /// device having left: had it left, its last will would have come first. Counting it
    /// would put a Star job published meanwhile in doubt for nothing.
    pub fn heard(&self, addr: &DeviceAddr, online: bool, connection: Option<&str>) -> bool {
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        let Some(e) = map.get_mut(addr) else { return false };
        let new_connection = connection.is_some() && e.connection.as_deref() != connection;
        let came = online && (e.online != Some(true) || new_connection);
        let returned = online && (e.online == Some(false) || new_connection);
        if returned || (!online && e.online != Some(false)) {
            e.epoch += 1;
        }
        e.online = Some(online);
        if connection.is_some() {
            e.connection = connection.map(str::to_owned);
        }
        came
    }
}

#[cfg(test)]
mod tests {
    use onceprint_engine::transport::MqttProtocol;

    use super::*;

    fn known(addr: &DeviceAddr) -> Devices {
        let devices = Devices::default();
        let owner = Owner { tenant_id: "t".into(), store_id: "s".into(), printer_id: "p".into() };
        devices
            .map
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(addr.clone(), Entry { owner: Some(owner), online: None, epoch: 0, connection: None });
        devices
    }

    #[test]
    fn a_star_printer_first_heard_online_has_not_left() {
        let star = DeviceAddr::new(MqttProtocol::Cloudprnt, "00:11:62:aa:bb:cc");
        let devices = known(&star);
        // The answer to the status request sent when the broker connected.
        assert!(devices.heard(&star, true, None), "it is online: its lane may move");
        assert_eq!(devices.epoch(&star), 0, "a job published before it was heard is still its own");
        // Its last will, then its return: it left, and a job in flight is in doubt.
        assert!(!devices.heard(&star, false, None));
        assert!(devices.heard(&star, true, None));
        assert_eq!(devices.epoch(&star), 2);
    }

    #[test]
    fn a_device_with_a_new_connection_is_sent_its_job_again() {
        let dev = DeviceAddr::new(MqttProtocol::Onceprint, "d1");
        let devices = known(&dev);
        assert!(devices.heard(&dev, true, Some("d1-1")));
        let first = devices.epoch(&dev);
        assert!(!devices.heard(&dev, true, Some("d1-1")), "the same connection again");
        assert_eq!(devices.epoch(&dev), first);
        assert!(devices.heard(&dev, true, Some("d1-2")), "rebooted without a last will");
        assert_eq!(devices.epoch(&dev), first + 1);
    }
}
