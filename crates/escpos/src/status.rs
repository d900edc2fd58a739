//! Real-time status: `DLE EOT n` (`10 04 n`), answered with one byte even while a job
//! prints. Every status byte has bit 1 and bit 4 set and bits 0 and 7 clear (fixed bits
//! `0x12`), which is how a status byte is told apart from other replies.

/// `DLE EOT n`.
pub fn request(n: u8) -> [u8; 3] {
    [0x10, 0x04, n]
}

/// Whether `b` has the fixed bits of a real-time status byte.
pub fn is_status_byte(b: u8) -> bool {
    b & 0x93 == 0x12
}

/// What the four real-time status requests report, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PrinterStatus {
    /// n=1 bit 3.
    pub offline: bool,
    /// n=2 bit 2.
    pub cover_open: bool,
    /// n=2 bit 5: printing stopped because the paper ran out.
    pub paper_end_stop: bool,
    /// n=2 bit 6.
    pub error: bool,
    /// n=3 bit 3.
    pub cutter_error: bool,
    /// n=3 bit 5.
    pub unrecoverable_error: bool,
    /// n=3 bit 6.
    pub auto_recoverable_error: bool,
    /// n=4 bits 2–3.
    pub paper_near_end: bool,
    /// n=4 bits 5–6.
    pub paper_end: bool,
}

/// Why a printer cannot print right now, in the agent protocol's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blocker {
    NoPaper,
    CoverOpen,
    PaperJam,
    Offline,
}

impl Blocker {
    /// The ack outcome (docs/API.md, "The store agent protocol") for this blocker.
    pub fn outcome(self) -> &'static str {
        match self {
            Blocker::NoPaper => "no_paper",
            Blocker::CoverOpen => "cover_open",
            Blocker::PaperJam => "paper_jam",
            Blocker::Offline => "offline",
        }
    }
}

impl PrinterStatus {
    /// Folds one answer to `DLE EOT n` into the status. Unknown `n` or a byte without the
    /// fixed bits changes nothing and returns `false`.
    pub fn apply(&mut self, n: u8, byte: u8) -> bool {
        if !is_status_byte(byte) {
            return false;
        }
        let bit = |i: u8| byte & (1 << i) != 0;
        match n {
            1 => self.offline = bit(3),
            2 => {
                self.cover_open = bit(2);
                self.paper_end_stop = bit(5);
                self.error = bit(6);
            }
            3 => {
                self.cutter_error = bit(3);
                self.unrecoverable_error = bit(5);
                self.auto_recoverable_error = bit(6);
            }
            4 => {
                self.paper_near_end = bit(2) || bit(3);
                self.paper_end = bit(5) || bit(6);
            }
            _ => return false,
        }
        true
    }

    /// The reason this printer cannot print, most specific first; `None` when it can.
    pub fn blocker(&self) -> Option<Blocker> {
        if self.paper_end || self.paper_end_stop {
            Some(Blocker::NoPaper)
        } else if self.cover_open {
            Some(Blocker::CoverOpen)
        } else if self.cutter_error || self.unrecoverable_error || self.auto_recoverable_error {
            Some(Blocker::PaperJam)
        } else if self.offline || self.error {
            Some(Blocker::Offline)
        } else {
            None
        }
    }

    /// The byte a printer in this state answers to `DLE EOT n` (used by the simulator).
    pub fn encode(&self, n: u8) -> u8 {
        let set = |cond: bool, mask: u8| if cond { mask } else { 0 };
        0x12 | match n {
            1 => set(self.offline, 0x08),
            2 => set(self.cover_open, 0x04) | set(self.paper_end_stop, 0x20) | set(self.error, 0x40),
            3 => {
                set(self.cutter_error, 0x08)
                    | set(self.unrecoverable_error, 0x20)
                    | set(self.auto_recoverable_error, 0x40)
            }
            4 => set(self.paper_near_end, 0x0C) | set(self.paper_end, 0x60),
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_paper_answers_0x7e_to_n4() {
        let mut s = PrinterStatus::default();
        assert!(s.apply(4, 0x7E));
        assert!(s.paper_end && s.paper_near_end);
        assert_eq!(s.blocker(), Some(Blocker::NoPaper));
        assert_eq!(s.encode(4), 0x7E);
    }

    #[test]
    fn healthy_printer_answers_fixed_bits_only() {
        let s = PrinterStatus::default();
        for n in 1..=4 {
            assert_eq!(s.encode(n), 0x12);
        }
        assert_eq!(s.blocker(), None);
    }

    #[test]
    fn every_field_round_trips_through_its_byte() {
        let all = PrinterStatus {
            offline: true,
            cover_open: true,
            paper_end_stop: true,
            error: true,
            cutter_error: true,
            unrecoverable_error: true,
            auto_recoverable_error: true,
            paper_near_end: true,
            paper_end: true,
        };
        let mut back = PrinterStatus::default();
        for n in 1..=4 {
            assert!(back.apply(n, all.encode(n)));
        }
        assert_eq!(back, all);
        assert!(!back.apply(1, 0x00), "a byte without the fixed bits is not a status");
    }

    #[test]
    fn cover_open_and_offline_are_told_apart() {
        let mut s = PrinterStatus::default();
        s.apply(2, 0x16);
        assert_eq!(s.blocker(), Some(Blocker::CoverOpen));
        let mut s = PrinterStatus::default();
        s.apply(1, 0x1A);
        assert_eq!(s.blocker(), Some(Blocker::Offline));
    }
}
