//! Watching idle printers: every `--status-interval-ms` the agent asks each of
//! its store's printers that is not busy for its real-time status (`DLE EOT`, through the
//! printer's own worker, so a probe never overlaps a job) and reports what it found to the
//! broker (`POST /v1/agent/status`). The broker's answer names the printers to watch, so
//! the agent knows them before it has a job for any of them.
//!
//! A report goes out every interval even when nothing changed: it tells the broker the
//! agent and its printers are there, and the broker writes only changes. A broker that
//! does not know the endpoint (an older version) gets asked again only every minute.

use std::collections::HashMap;
use std::time::Duration;

use tokio::sync::watch;

use crate::broker::{BrokerClient, BrokerError};
use crate::printer::PrinterAddress;
use crate::protocol::{PrinterStatusReport, WatchedPrinter};
use crate::worker::Prober;

/// Pause after the broker refused or did not know the status endpoint.
const REFUSED_PAUSE: Duration = Duration::from_secs(60);

/// Runs until `stopping` turns true.
pub(crate) async fn run_status_reporter(
    client: BrokerClient,
    prober: Prober,
    every: Duration,
    mut stopping: watch::Receiver<bool>,
) {
    let mut watched: Vec<WatchedPrinter> = Vec::new();
    let mut last: HashMap<String, String> = HashMap::new();
    let mut first = true;
    loop {
        if !first {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = stopping.changed() => {}
            }
        }
        first = false;
        if *stopping.borrow() {
            return;
        }
        let mut reports = Vec::new();
        for w in &watched {
            let Ok(address) = w.printer_address.parse::<PrinterAddress>() else { continue };
            if let Some(status) = prober.probe(&w.printer_id, address, every).await {
                let status = status.as_str().to_owned();
                if last.get(&w.printer_id) != Some(&status) {
                    tracing::info!(printer_id = %w.printer_id, status = %status, "printer status changed");
                }
                last.insert(w.printer_id.clone(), status.clone());
                reports.push(PrinterStatusReport { printer_id: w.printer_id.clone(), status });
            }
        }
        match client.send_status(&reports).await {
            Ok(list) => watched = list,
            Err(e @ (BrokerError::Unauthorized | BrokerError::Status { .. })) => {
                tracing::warn!(error = %e, "the broker did not take the printer status report");
                tokio::select! {
                    _ = tokio::time::sleep(REFUSED_PAUSE) => {}
                    _ = stopping.changed() => {}
                }
            }
            Err(e) => tracing::debug!(error = %e, "printer status report failed; trying again"),
        }
    }
}
