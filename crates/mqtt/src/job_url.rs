//! Where a Star printer in CloudPRNT Version MQTT fetches a `url` print-job: the broker's
//! `/cloudprnt` URL as the printer reaches it.
//!
//! Star's printers take the job's data over HTTP ("Print job requests (GET)", "For
//! CloudPRNT Version MQTT (Full MQTT / Pass URL)"), so the print-job must name a URL the
//! printer can reach. `serve --public-url` says it for every printer. Without it, the URL
//! is the one each printer used for its server-setting request (the printer is set up with
//! the broker's CloudPRNT URL and asks for `cloudprnt-setting.json` beside it before it
//! connects to MQTT), kept in the database's settings so that it outlives a restart of the
//! broker and is known to every node; a proxy that rewrites paths needs `--public-url`.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};

use onceprint_store::{Store, StoreResult};

/// The CloudPRNT URL of each printer's jobs. Share it behind an `Arc`.
pub struct JobUrl {
    /// `{public_url}/cloudprnt`, when the broker was told its public URL.
    configured: Option<String>,
    store: Arc<dyn Store>,
    /// (tenant, printer id) → the CloudPRNT URL that printer used, as read or written.
    learned: RwLock<HashMap<(String, String), String>>,
}

fn setting_key(tenant_id: &str, printer_id: &str) -> String {
    format!("cloudprnt_job_url/{tenant_id}/{printer_id}")
}

impl JobUrl {
    /// `public_url` is the broker's base URL as printers reach it (`https://print.example`).
    pub fn new(store: Arc<dyn Store>, public_url: Option<&str>) -> JobUrl {
        let configured = public_url.map(|u| format!("{}/cloudprnt", u.trim_end_matches('/')));
        JobUrl { configured, store, learned: RwLock::default() }
    }

    fn cached(&self, tenant_id: &str, printer_id: &str) -> Option<String> {
        let learned = self.learned.read().unwrap_or_else(PoisonError::into_inner);
        learned.get(&(tenant_id.to_owned(), printer_id.to_owned())).cloned()
    }

    /// Remembers the CloudPRNT URL a printer used (from its server-setting request),
    /// durably; written only when it changed.
    pub async fn learn(&self, tenant_id: &str, printer_id: &str, url: String) -> StoreResult<()> {
        if self.cached(tenant_id, printer_id).as_deref() == Some(url.as_str()) {
            return Ok(());
        }
        self.store.put_setting(&setting_key(tenant_id, printer_id), &url).await?;
        let mut learned = self.learned.write().unwrap_or_else(PoisonError::into_inner);
        learned.insert((tenant_id.to_owned(), printer_id.to_owned()), url);
        Ok(())
    }

    /// The URL in a print-job for this printer, if one is known.
    pub async fn for_printer(&self, tenant_id: &str, printer_id: &str) -> StoreResult<Option<String>> {
        if let Some(c) = &self.configured {
            return Ok(Some(c.clone()));
        }
        if let Some(u) = self.cached(tenant_id, printer_id) {
            return Ok(Some(u));
        }
        let Some(url) = self.store.get_setting(&setting_key(tenant_id, printer_id)).await? else { return Ok(None) };
        let mut learned = self.learned.write().unwrap_or_else(PoisonError::into_inner);
        learned.insert((tenant_id.to_owned(), printer_id.to_owned()), url.clone());
        Ok(Some(url))
    }
}
