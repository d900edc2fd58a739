//! Fault state of each simulated printer, changeable at run time.
//!
//! Each printer's faults live in a `tokio::sync::watch` channel: the printing task of a
//! blocked printer sleeps on it and wakes the moment paper goes back in, and connection
//! tasks read the current value to answer real-time status requests.
//!
//! Printers are named as in the paper log: a TCP printer by its listening address
//! (`127.0.0.1:9100`), a pseudo-terminal printer by `pty:N`.

use std::fmt::Display;
use std::sync::Arc;

use onceprint_escpos::status::PrinterStatus;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::SimError;

/// The faults of one printer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Faults {
    /// Out of paper: nothing prints, received bytes are buffered, `GS ( H` is not
    /// answered; when paper goes back in, the buffer prints.
    pub paper_out: bool,
    /// Cover open: blocks like `paper_out`.
    pub cover_open: bool,
    /// Offline: new TCP connections are reset at once, existing ones (and a
    /// pseudo-terminal printer's device) read offline status and nothing prints until it
    /// clears.
    pub offline: bool,
    /// The next this many jobs print and are logged, then the connection drops (a
    /// pseudo-terminal printer's device vanishes and comes back as a new one) before
    /// anything after the cut (such as the `GS ( H` reply) is answered.
    pub crash_mid_job: u32,
    /// Delay before each job is printed (and so before its acknowledgement).
    pub slow_ms: u64,
    /// Behave like a clone printer that ignores `GS ( H` (real-time status still works).
    pub clone: bool,
    /// Printers that poll: the next this many jobs are confirmed twice.
    #[serde(default)]
    pub duplicate_confirm: u32,
    /// Printers that poll: the confirmations of the next this many printed jobs are lost
    /// on the way and sent again only after the printer's next poll (a late result).
    #[serde(default)]
    pub lost_result: u32,
    /// MQTT devices: the next this many jobs print, but their result is never published
    /// (lost on the way).
    #[serde(default)]
    pub lose_result: u32,
    /// MQTT devices: the next this many results are published twice.
    #[serde(default)]
    pub duplicate_result: u32,
    /// MQTT devices: the next this many jobs are received, then the connection drops
    /// before anything is printed or acknowledged (the MQTT server delivers it again).
    #[serde(default)]
    pub disconnect_mid_job: u32,
    /// MQTT devices: the next this many jobs arrive twice (as a QoS 1 redelivery would).
    #[serde(default)]
    pub receive_twice: u32,
    /// Star MQTT printers: a crash (`crash_mid_job`, `disconnect_mid_job`) is a power
    /// cycle that also loses the last ten job tokens (Star does not say whether they
    /// survive one), so a job token sent again after it is printed again.
    #[serde(default)]
    pub power_cycle_forgets: bool,
    /// The next this many jobs print, then end with an error that can follow printing:
    /// Epson `EPTR_CUTTER` (printed, not cut), a CloudPRNT confirmation and a Star MQTT
    /// `print-result` with a code Star does not document (`599`), an onceprint device's
    /// `error`. The paper log has the job.
    #[serde(default)]
    pub error_after_print: u32,
}

impl Faults {
    /// Whether the printer holds its input instead of printing.
    pub fn blocks_printing(&self) -> bool {
        self.paper_out || self.cover_open || self.offline
    }

    /// The status a real printer reports in this state. Paper-out and cover-open also set
    /// the offline bit of `DLE EOT 1`, as Epson printers do: a printer that cannot print
    /// is offline, and the n=2/n=4 answers tell why.
    pub fn status(&self) -> PrinterStatus {
        PrinterStatus {
            offline: self.offline || self.paper_out || self.cover_open,
            cover_open: self.cover_open,
            paper_end_stop: self.paper_out,
            paper_near_end: self.paper_out,
            paper_end: self.paper_out,
            ..PrinterStatus::default()
        }
    }
}

/// A partial change of faults: fields left out keep their value. This is also the body
/// of `PUT /faults` (with an optional `printer`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultUpdate {
    pub paper_out: Option<bool>,
    pub cover_open: Option<bool>,
    pub offline: Option<bool>,
    pub crash_mid_job: Option<u32>,
    pub slow_ms: Option<u64>,
    pub clone: Option<bool>,
    #[serde(default)]
    pub duplicate_confirm: Option<u32>,
    #[serde(default)]
    pub lost_result: Option<u32>,
    pub lose_result: Option<u32>,
    #[serde(default)]
    pub duplicate_result: Option<u32>,
    #[serde(default)]
    pub disconnect_mid_job: Option<u32>,
    #[serde(default)]
    pub receive_twice: Option<u32>,
    #[serde(default)]
    pub power_cycle_forgets: Option<bool>,
    #[serde(default)]
    pub error_after_print: Option<u32>,
}

impl FaultUpdate {
    /// Applies the fields that are set.
    pub fn apply(&self, faults: &mut Faults) {
        if let Some(v) = self.paper_out {
            faults.paper_out = v;
        }
        if let Some(v) = self.cover_open {
            faults.cover_open = v;
        }
        if let Some(v) = self.offline {
            faults.offline = v;
        }
        if let Some(v) = self.crash_mid_job {
            faults.crash_mid_job = v;
        }
        if let Some(v) = self.slow_ms {
            faults.slow_ms = v;
        }
        if let Some(v) = self.clone {
            faults.clone = v;
        }
        if let Some(v) = self.duplicate_confirm {
            faults.duplicate_confirm = v;
        }
        if let Some(v) = self.lost_result {
            faults.lost_result = v;
        }
        if let Some(v) = self.lose_result {
            faults.lose_result = v;
        }
        if let Some(v) = self.duplicate_result {
            faults.duplicate_result = v;
        }
        if let Some(v) = self.disconnect_mid_job {
            faults.disconnect_mid_job = v;
        }
        if let Some(v) = self.receive_twice {
            faults.receive_twice = v;
        }
        if let Some(v) = self.power_cycle_forgets {
            faults.power_cycle_forgets = v;
        }
        if let Some(v) = self.error_after_print {
            faults.error_after_print = v;
        }
    }
}

impl From<Faults> for FaultUpdate {
    fn from(f: Faults) -> FaultUpdate {
        FaultUpdate {
            paper_out: Some(f.paper_out),
            cover_open: Some(f.cover_open),
            offline: Some(f.offline),
            crash_mid_job: Some(f.crash_mid_job),
            slow_ms: Some(f.slow_ms),
            clone: Some(f.clone),
            duplicate_confirm: Some(f.duplicate_confirm),
            lost_result: Some(f.lost_result),
            lose_result: Some(f.lose_result),
            duplicate_result: Some(f.duplicate_result),
            disconnect_mid_job: Some(f.disconnect_mid_job),
            receive_twice: Some(f.receive_twice),
            power_cycle_forgets: Some(f.power_cycle_forgets),
            error_after_print: Some(f.error_after_print),
        }
    }
}

/// One printer's name (its listening address, or `cloudprnt:MAC` / `epson_sdp:ID` for a
/// printer that polls) and faults, as `GET /faults` lists them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrinterFaults {
    pub printer: String,
    #[serde(flatten)]
    pub faults: Faults,
}

struct Cell {
    name: String,
    faults: watch::Sender<Faults>,
}

/// Reads and changes the faults of the simulator's printers. Cheap to clone.
#[derive(Clone)]
pub struct FaultsHandle {
    cells: Arc<[Cell]>,
}

impl std::fmt::Debug for FaultsHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.all()).finish()
    }
}

impl FaultsHandle {
    pub(crate) fn new(names: &[String], initial: Faults) -> FaultsHandle {
        let cells = names.iter().map(|name| Cell { name: name.clone(), faults: watch::Sender::new(initial) }).collect();
        FaultsHandle { cells }
    }

    /// The faults of every printer, in the order of start-up.
    pub fn all(&self) -> Vec<PrinterFaults> {
        self.cells.iter().map(|c| PrinterFaults { printer: c.name.clone(), faults: *c.faults.borrow() }).collect()
    }

    /// The faults of one printer, by its name (a listening address, for instance).
    pub fn get(&self, printer: impl Display) -> Option<Faults> {
        let name = printer.to_string();
        self.cells.iter().find(|c| c.name == name).map(|c| *c.faults.borrow())
    }

    /// Changes the faults of one printer, or of all when `printer` is `None`, and returns
    /// the new state of the printers changed. A printer that was blocked starts printing
    /// its buffer as soon as nothing blocks it any more.
    pub fn update<P: Display>(&self, printer: Option<P>, update: FaultUpdate) -> Result<Vec<PrinterFaults>, SimError> {
        let printer = printer.map(|p| p.to_string());
        if let Some(name) = &printer {
            if !self.cells.iter().any(|c| &c.name == name) {
                return Err(SimError::UnknownPrinter(name.clone()));
            }
        }
        let mut changed = Vec::new();
        for cell in self.cells.iter().filter(|c| printer.as_ref().is_none_or(|n| *n == c.name)) {
            cell.faults.send_modify(|f| update.apply(f));
            changed.push(PrinterFaults { printer: cell.name.clone(), faults: *cell.faults.borrow() });
        }
        Ok(changed)
    }

    /// Changes every printer's faults.
    pub fn update_all(&self, update: FaultUpdate) -> Vec<PrinterFaults> {
        // No printer is named, so no printer can be unknown.
        self.update(None::<&str>, update).unwrap_or_default()
    }

    pub(crate) fn current(&self, index: usize) -> Faults {
        self.cells.get(index).map(|c| *c.faults.borrow()).unwrap_or_default()
    }

    pub(crate) fn subscribe(&self, index: usize) -> Option<watch::Receiver<Faults>> {
        self.cells.get(index).map(|c| c.faults.subscribe())
    }

    /// Changes one printer's faults and returns what `f` returned (the MQTT device counts
    /// its faults down with it).
    pub(crate) fn take(&self, index: usize, f: impl FnOnce(&mut Faults) -> bool) -> bool {
        let mut out = false;
        if let Some(cell) = self.cells.get(index) {
            cell.faults.send_modify(|x| out = f(x));
        }
        out
    }

    pub(crate) fn modify(&self, index: usize, f: impl FnOnce(&mut Faults)) {
        if let Some(cell) = self.cells.get(index) {
            cell.faults.send_modify(f);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_bytes_match_the_field_notes() {
        let paper_out = Faults { paper_out: true, ..Faults::default() }.status();
        assert_eq!(paper_out.encode(4), 0x7E);
        assert_eq!(paper_out.encode(2), 0x32);
        assert_eq!(paper_out.encode(1), 0x1A);
        let cover = Faults { cover_open: true, ..Faults::default() }.status();
        assert_eq!(cover.encode(2), 0x16);
        assert_eq!(cover.blocker(), Some(onceprint_escpos::status::Blocker::CoverOpen));
        assert_eq!(Faults::default().status().encode(4), 0x12);
    }

    #[test]
    fn updates_touch_only_the_fields_given() {
        let mut f = Faults { slow_ms: 5, ..Faults::default() };
        let u: FaultUpdate = serde_json::from_str(r#"{"paper_out":true}"#).unwrap();
        u.apply(&mut f);
        assert_eq!(f, Faults { paper_out: true, slow_ms: 5, ..Faults::default() });
        assert!(serde_json::from_str::<FaultUpdate>(r#"{"paperout":true}"#).is_err(), "typos are refused");
    }
}
