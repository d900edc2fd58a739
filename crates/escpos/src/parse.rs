//! A streaming ESC/POS command parser that never loses its place.
//!
//! [`Parser::push`] takes bytes as they arrive from a socket, in any chunking, and returns
//! the [`Event`]s completed by them. A command cut off at the end of a chunk stays
//! buffered until the rest arrives, so the events of a stream do not depend on how it was
//! split — except that a run of text may come out as several [`Event::Text`] pieces, one
//! per chunk it arrived in (text is handed out as soon as it arrives rather than held back
//! until the next command). [`coalesce`] joins such pieces when that matters.
//!
//! How the parser keeps its place in an arbitrary stream:
//! - Every command it knows is read with its exact length: fixed parameters, a length
//!   prefix (`GS ( x pL pH`, `GS k m n`, `GS 8 L`), a size computed from a header (raster
//!   and bit images), or a terminator (`GS k` m 0–6, `ESC D`). Image data it does not need
//!   is skipped without being buffered; only commands whose contents matter (QR data,
//!   barcodes, `GS ( H`) are buffered, and they are at most 64 KiB long.
//! - An unknown `ESC`, `GS` or `FS` sub-command gives [`Event::Unknown`] and consumes only
//!   the prefix and the sub-command byte; whatever follows is parsed as usual. A real
//!   printer would swallow an unknown command's parameters, but their number is unknown,
//!   and guessing wrong would eat the next command, which may be the `GS ( H` whose reply
//!   onceprint waits for. One exception: when the byte after the prefix is itself a
//!   prefix (`DLE`, `ESC`, `FS`, `GS`), only the first prefix is dropped (as
//!   [`Event::Control`]), so `ESC ESC @` still initialises.
//! - `DLE` followed by anything but `EOT`, `ENQ` or `DC4` is a lone control byte.
//! - In double-byte mode (after `FS &`) a GB18030 lead byte (0x81–0xFE) is always returned
//!   together with its trail byte (two-byte form) or its three trail bytes (four-byte
//!   form). A lead byte whose next byte cannot continue a character is returned alone, so
//!   a malformed character never swallows the command after it.
//!
//! Real printers also interpret real-time commands (`DLE EOT`, `DLE ENQ`, `DLE DC4`) found
//! inside the data of other commands, such as image bytes that happen to read `10 04 01`.
//! This parser does not: data announced by a command is data. onceprint never sends such
//! streams on purpose, and treating data as data is the only reading that does not depend
//! on printer model settings.

use crate::ack;

const DLE: u8 = 0x10;
const ESC: u8 = 0x1B;
const FS: u8 = 0x1C;
const GS: u8 = 0x1D;
const HT: u8 = 0x09;
const LF: u8 = 0x0A;
const CR: u8 = 0x0D;

/// Longest data of `GS k` m 0–6 (NUL-terminated barcodes). No symbology accepts more, and
/// the cap keeps a missing NUL from swallowing the rest of the stream.
const MAX_NUL_BARCODE: usize = 255;
/// Most tab positions `ESC D` takes before the printer stops reading them.
const MAX_TABS: usize = 32;

/// One parsed piece of an ESC/POS stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Printable bytes, including `LF`, `CR` and `HT`. In double-byte mode GB18030
    /// characters are never split between two events.
    Text(Vec<u8>),
    /// A single-byte control other than `LF`, `CR`, `HT` (for example `FF`, `CAN`, `NUL`),
    /// or a prefix byte dropped on its own (see the module documentation).
    Control(u8),
    /// `ESC @`.
    Init,
    /// A known command that is not one of the events below, such as style and layout
    /// commands (`ESC ! n`, `ESC a n`, `GS ! n`, …), with its parameter bytes.
    /// `name` is the command in manual notation, e.g. `"ESC !"`.
    Command { name: &'static str, params: Vec<u8> },
    /// A command carrying data the parser skips unread (graphics, user-defined
    /// characters, setup blocks). `len` is the whole command, header and data.
    Skipped { name: &'static str, len: usize },
    /// `FS &` (true) or `FS .` (false): enter or leave double-byte character mode.
    DoubleByte(bool),
    /// `DLE EOT n`: real-time status request.
    StatusRequest(u8),
    /// `GS ( H` fn 48 with a valid process ID: the printed-acknowledgement request.
    ProcessIdRequest([u8; 4]),
    /// `GS V` (or `ESC i` / `ESC m`, both partial).
    Cut { partial: bool },
    /// `GS ( k` cn 49 fn 80: store QR code data.
    Qr { data: Vec<u8> },
    /// `GS k m`: a barcode of symbology `kind` (m as sent: 0–6 or 65–79).
    Barcode { kind: u8, data: Vec<u8> },
    /// `GS v 0 m xL xH yL yH` with its `data_len` bytes of raster data (skipped).
    Raster { width_bytes: u16, height: u16, data_len: usize },
    /// `ESC p m t1 t2`: pulse to open the cash drawer.
    CashDrawer { pin: u8, on: u8, off: u8 },
    /// An `ESC`, `GS` or `FS` sub-command this parser does not know; only the prefix and
    /// the sub-command byte were consumed.
    Unknown { prefix: u8, command: u8 },
}

/// Joins adjacent [`Event::Text`] pieces, which is how the events of a stream compare
/// independently of its chunking.
pub fn coalesce(events: impl IntoIterator<Item = Event>) -> Vec<Event> {
    let mut out: Vec<Event> = Vec::new();
    for event in events {
        match (out.last_mut(), event) {
            (Some(Event::Text(prev)), Event::Text(more)) => prev.extend_from_slice(&more),
            (_, event) => out.push(event),
        }
    }
    out
}

/// A multi-part command in progress: after one part (and its skipped data) the next part
/// is read in this state instead of as a new command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cont {
    /// `FS q n`: `left` NV images still to come, each `xL xH yL yH` + data.
    FsQ { left: u8 },
    /// `ESC & y c1 c2`: `left` character definitions still to come, each `x` + y·x bytes.
    EscAmp { y: u8, left: u16 },
}

/// The outcome of trying to read one item at the start of the buffer.
enum Step {
    /// The item is not complete yet.
    NeedMore,
    /// `used` bytes were read from the buffer; `skip` more bytes of announced data follow
    /// in the stream and are discarded; `cont` is the state after them.
    Done { event: Event, used: usize, skip: usize, cont: Option<Cont> },
}

fn done(event: Event, used: usize) -> Step {
    Step::Done { event, used, skip: 0, cont: None }
}

fn skipped(name: &'static str, header: usize, data: usize) -> Step {
    Step::Done {
        event: Event::Skipped { name, len: header.saturating_add(data) },
        used: header,
        skip: data,
        cont: None,
    }
}

fn command(name: &'static str, buf: &[u8], len: usize) -> Step {
    match buf.get(2..len) {
        Some(params) => done(Event::Command { name, params: params.to_vec() }, len),
        None => Step::NeedMore,
    }
}

fn le16(lo: u8, hi: u8) -> usize {
    usize::from(lo) | usize::from(hi) << 8
}

/// The streaming parser. See the module documentation for how it stays in sync.
#[derive(Debug, Clone, Default)]
pub struct Parser {
    /// Bytes received but not yet parsed: the start of an incomplete command.
    pending: Vec<u8>,
    /// Bytes of announced data still to discard before parsing goes on.
    skip: usize,
    cont: Option<Cont>,
    double_byte: bool,
    /// The mode `ESC @` returns to: the printer's power-on setting.
    default_double_byte: bool,
}

impl Parser {
    /// A parser for a printer that starts in single-byte mode.
    pub fn new() -> Parser {
        Parser::default()
    }

    /// A parser for a printer whose power-on (and `ESC @`) character mode is double-byte
    /// when `on`, as many Chinese models are configured.
    pub fn with_double_byte_default(on: bool) -> Parser {
        Parser { double_byte: on, default_double_byte: on, ..Parser::default() }
    }

    /// Whether double-byte mode is on after everything pushed so far.
    pub fn double_byte(&self) -> bool {
        self.double_byte
    }

    /// Bytes held back because the command they start is not complete yet.
    pub fn buffered(&self) -> usize {
        self.pending.len()
    }

    /// Parses `bytes`, returning the events they complete.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<Event> {
        self.push_sized(bytes).into_iter().map(|(event, _)| event).collect()
    }

    /// Like [`Parser::push`], with the number of stream bytes each event stands for:
    /// the whole command, including data it announces (for [`Event::Raster`] and
    /// [`Event::Skipped`] that data follows in later bytes and produces no events).
    pub fn push_sized(&mut self, bytes: &[u8]) -> Vec<(Event, usize)> {
        let mut input = bytes;
        // Announced data is discarded before it is copied anywhere, so a large image costs
        // no memory.
        if self.pending.is_empty() && self.skip > 0 {
            let n = self.skip.min(input.len());
            self.skip -= n;
            input = &input[n..];
        }
        self.pending.extend_from_slice(input);

        let mut out = Vec::new();
        let mut pos = 0;
        loop {
            if self.skip > 0 {
                let n = self.skip.min(self.pending.len() - pos);
                self.skip -= n;
                pos += n;
                if self.skip > 0 {
                    break;
                }
            }
            if pos == self.pending.len() {
                break;
            }
            let buf = &self.pending[pos..];
            let step = match self.cont {
                Some(cont) => continuation(cont, buf),
                None => self.item(buf),
            };
            match step {
                Step::NeedMore => break,
                Step::Done { event, used, skip, cont } => {
                    debug_assert!(used > 0 && used <= self.pending.len() - pos, "{event:?} used {used}");
                    match event {
                        Event::Init => self.double_byte = self.default_double_byte,
                        Event::DoubleByte(on) => self.double_byte = on,
                        _ => {}
                    }
                    pos += used;
                    self.skip = skip;
                    self.cont = cont;
                    out.push((event, used.saturating_add(skip)));
                }
            }
        }
        self.pending.drain(..pos);
        out
    }

    /// Reads one item (a text run or a command) at the start of `buf`, which is not empty.
    fn item(&self, buf: &[u8]) -> Step {
        match buf[0] {
            DLE => dle(buf),
            ESC => esc(buf),
            FS => fs(buf),
            GS => gs(buf),
            b if b < 0x20 && b != HT && b != LF && b != CR => done(Event::Control(b), 1),
            _ => self.text(buf),
        }
    }

    /// A run of printable bytes. Stops before a control byte, and before a double-byte
    /// character whose bytes have not all arrived.
    fn text(&self, buf: &[u8]) -> Step {
        let mut i = 0;
        while i < buf.len() {
            let b = buf[i];
            if b < 0x20 && b != HT && b != LF && b != CR {
                break;
            }
            if self.double_byte && (0x81..=0xFE).contains(&b) {
                match gb18030_len(&buf[i..]) {
                    Some(n) => i += n,
                    None => break,
                }
            } else {
                i += 1;
            }
        }
        if i == 0 {
            // Only reachable when the first character is incomplete.
            return Step::NeedMore;
        }
        done(Event::Text(buf[..i].to_vec()), i)
    }
}

/// Length of the GB18030 character starting with a lead byte at `buf[0]`: 2 or 4, or 1 when
/// the next bytes cannot continue it; `None` while the deciding bytes have not arrived.
fn gb18030_len(buf: &[u8]) -> Option<usize> {
    let second = *buf.get(1)?;
    match second {
        0x30..=0x39 => {
            let third = *buf.get(2)?;
            if !(0x81..=0xFE).contains(&third) {
                return Some(1);
            }
            let fourth = *buf.get(3)?;
            Some(if (0x30..=0x39).contains(&fourth) { 4 } else { 1 })
        }
        0x40..=0x7E | 0x80..=0xFE => Some(2),
        _ => Some(1),
    }
}

fn is_prefix(b: u8) -> bool {
    matches!(b, DLE | ESC | FS | GS)
}

/// The unknown-command rule shared by `ESC`, `FS` and `GS`.
fn unknown(prefix: u8, command: u8) -> Step {
    if is_prefix(command) {
        done(Event::Control(prefix), 1)
    } else {
        done(Event::Unknown { prefix, command }, 2)
    }
}

fn dle(buf: &[u8]) -> Step {
    let Some(&cmd) = buf.get(1) else { return Step::NeedMore };
    match cmd {
        // DLE EOT n; n 7 and 8 take one more parameter (ink and peeler status).
        0x04 => match buf.get(2) {
            None => Step::NeedMore,
            Some(7 | 8) => command("DLE EOT", buf, 4),
            Some(&n) => done(Event::StatusRequest(n), 3),
        },
        0x05 => command("DLE ENQ", buf, 3),
        0x14 => {
            let Some(&function) = buf.get(2) else { return Step::NeedMore };
            // DLE DC4 fn …: 1 = pulse (m t), 2 = power off (1 8), 7 = status transmission
            // (m), 8 = clear buffers (1 3 20 1 6 2 8).
            let len = match function {
                1 | 2 => 5,
                7 => 4,
                8 => 10,
                _ => 3,
            };
            command("DLE DC4", buf, len)
        }
        _ => done(Event::Control(DLE), 1),
    }
}

fn esc(buf: &[u8]) -> Step {
    let Some(&cmd) = buf.get(1) else { return Step::NeedMore };
    let fixed = |name: &'static str, params: usize| command(name, buf, 2 + params);
    match cmd {
        b'@' => done(Event::Init, 2),
        b'i' | b'm' => done(Event::Cut { partial: true }, 2),
        b'p' => match buf.get(2..5) {
            Some(&[pin, on, off]) => done(Event::CashDrawer { pin, on, off }, 5),
            _ => Step::NeedMore,
        },
        0x0C => fixed("ESC FF", 0),
        b'2' => fixed("ESC 2", 0),
        b'<' => fixed("ESC <", 0),
        b'L' => fixed("ESC L", 0),
        b'S' => fixed("ESC S", 0),
        b'v' => fixed("ESC v", 0),
        b' ' => fixed("ESC SP", 1),
        b'!' => fixed("ESC !", 1),
        b'%' => fixed("ESC %", 1),
        b'-' => fixed("ESC -", 1),
        b'3' => fixed("ESC 3", 1),
        b'=' => fixed("ESC =", 1),
        b'?' => fixed("ESC ?", 1),
        b'E' => fixed("ESC E", 1),
        b'G' => fixed("ESC G", 1),
        b'J' => fixed("ESC J", 1),
        b'K' => fixed("ESC K", 1),
        b'M' => fixed("ESC M", 1),
        b'R' => fixed("ESC R", 1),
        b'T' => fixed("ESC T", 1),
        b'U' => fixed("ESC U", 1),
        b'V' => fixed("ESC V", 1),
        b'a' => fixed("ESC a", 1),
        b'd' => fixed("ESC d", 1),
        b'e' => fixed("ESC e", 1),
        b'r' => fixed("ESC r", 1),
        b't' => fixed("ESC t", 1),
        b'u' => fixed("ESC u", 1),
        b'{' => fixed("ESC {", 1),
        b'$' => fixed("ESC $", 2),
        b'\\' => fixed("ESC \\", 2),
        b'c' => fixed("ESC c", 2),
        b'W' => fixed("ESC W", 8),
        b'*' => {
            // ESC * m nL nH d1…dk: k = n for 8-dot modes, 3n for 24-dot modes.
            let Some(&[m, lo, hi]) = buf.get(2..5) else { return Step::NeedMore };
            let n = le16(lo, hi);
            match m {
                0 | 1 => skipped("ESC *", 5, n),
                32 | 33 => skipped("ESC *", 5, 3 * n),
                _ => command("ESC *", buf, 5),
            }
        }
        b'&' => {
            // ESC & y c1 c2 [x d1…d(y·x)] for each character c1..=c2.
            let Some(&[y, c1, c2]) = buf.get(2..5) else { return Step::NeedMore };
            let count = if c2 >= c1 { u16::from(c2 - c1) + 1 } else { 0 };
            let cont = (count > 0).then_some(Cont::EscAmp { y, left: count });
            Step::Done { event: Event::Command { name: "ESC &", params: vec![y, c1, c2] }, used: 5, skip: 0, cont }
        }
        b'D' => {
            // ESC D n1…nk NUL: tab positions, at most 32.
            let params = &buf[2..];
            match params.iter().take(MAX_TABS + 1).position(|&b| b == 0) {
                Some(end) => done(Event::Command { name: "ESC D", params: params[..end].to_vec() }, 2 + end + 1),
                None if params.len() > MAX_TABS => {
                    done(Event::Command { name: "ESC D", params: params[..MAX_TABS].to_vec() }, 2 + MAX_TABS)
                }
                None => Step::NeedMore,
            }
        }
        b'(' => paren(buf, |x| match x {
            b'A' => "ESC ( A",
            b'Y' => "ESC ( Y",
            _ => "ESC ( ?",
        }),
        _ => unknown(ESC, cmd),
    }
}

fn fs(buf: &[u8]) -> Step {
    let Some(&cmd) = buf.get(1) else { return Step::NeedMore };
    let fixed = |name: &'static str, params: usize| command(name, buf, 2 + params);
    match cmd {
        b'&' => done(Event::DoubleByte(true), 2),
        b'.' => done(Event::DoubleByte(false), 2),
        b'!' => fixed("FS !", 1),
        b'-' => fixed("FS -", 1),
        b'C' => fixed("FS C", 1),
        b'W' => fixed("FS W", 1),
        b'S' => fixed("FS S", 2),
        b'?' => fixed("FS ?", 2),
        b'p' => fixed("FS p", 2),
        // FS 2 c1 c2 d1…d72: one user-defined 24×24 double-byte character.
        b'2' if buf.len() < 4 => Step::NeedMore,
        b'2' => skipped("FS 2", 4, 72),
        b'q' => {
            let Some(&n) = buf.get(2) else { return Step::NeedMore };
            let cont = (n > 0).then_some(Cont::FsQ { left: n });
            Step::Done { event: Event::Command { name: "FS q", params: vec![n] }, used: 3, skip: 0, cont }
        }
        b'(' => paren(buf, |x| match x {
            b'A' => "FS ( A",
            b'C' => "FS ( C",
            b'E' => "FS ( E",
            b'L' => "FS ( L",
            _ => "FS ( ?",
        }),
        _ => unknown(FS, cmd),
    }
}

fn gs(buf: &[u8]) -> Step {
    let Some(&cmd) = buf.get(1) else { return Step::NeedMore };
    let fixed = |name: &'static str, params: usize| command(name, buf, 2 + params);
    match cmd {
        b'V' => {
            let Some(&m) = buf.get(2) else { return Step::NeedMore };
            match m {
                0 | 48 => done(Event::Cut { partial: false }, 3),
                1 | 49 => done(Event::Cut { partial: true }, 3),
                // Feed to the cutting position (by n) and cut.
                65 | 97 | 103 if buf.len() >= 4 => done(Event::Cut { partial: false }, 4),
                66 | 98 | 104 if buf.len() >= 4 => done(Event::Cut { partial: true }, 4),
                65 | 97 | 103 | 66 | 98 | 104 => Step::NeedMore,
                _ => command("GS V", buf, 3),
            }
        }
        b':' => fixed("GS :", 0),
        b'!' => fixed("GS !", 1),
        b'/' => fixed("GS /", 1),
        b'B' => fixed("GS B", 1),
        b'E' => fixed("GS E", 1),
        b'H' => fixed("GS H", 1),
        b'I' => fixed("GS I", 1),
        b'T' => fixed("GS T", 1),
        b'a' => fixed("GS a", 1),
        b'b' => fixed("GS b", 1),
        b'f' => fixed("GS f", 1),
        b'h' => fixed("GS h", 1),
        b'j' => fixed("GS j", 1),
        b'r' => fixed("GS r", 1),
        b'w' => fixed("GS w", 1),
        b'$' => fixed("GS $", 2),
        b'L' => fixed("GS L", 2),
        b'P' => fixed("GS P", 2),
        b'W' => fixed("GS W", 2),
        b'\\' => fixed("GS \\", 2),
        b'^' => fixed("GS ^", 3),
        b'z' => fixed("GS z", 3),
        b'g' => fixed("GS g", 4),
        b'k' => barcode(buf),
        b'v' => {
            let Some(&sub) = buf.get(2) else { return Step::NeedMore };
            if sub != b'0' {
                return unknown(GS, cmd);
            }
            // GS v 0 m xL xH yL yH d1…dk, k = (xL + 256·xH) · (yL + 256·yH).
            let Some(&[_m, xl, xh, yl, yh]) = buf.get(3..8) else { return Step::NeedMore };
            let width_bytes = u16::from_le_bytes([xl, xh]);
            let height = u16::from_le_bytes([yl, yh]);
            let data_len = usize::from(width_bytes) * usize::from(height);
            Step::Done { event: Event::Raster { width_bytes, height, data_len }, used: 8, skip: data_len, cont: None }
        }
        b'*' => {
            // GS * x y d1…d(x·y·8): define a downloaded bit image.
            let Some(&[x, y]) = buf.get(2..4) else { return Step::NeedMore };
            skipped("GS *", 4, usize::from(x) * usize::from(y) * 8)
        }
        b'8' => {
            // GS 8 L p1 p2 p3 p4 …: the long form of GS ( L, with a four-byte length.
            let Some(&[sub, p1, p2, p3, p4]) = buf.get(2..7) else { return Step::NeedMore };
            if sub != b'L' {
                return unknown(GS, cmd);
            }
            let len = u32::from_le_bytes([p1, p2, p3, p4]);
            skipped("GS 8 L", 7, usize::try_from(len).unwrap_or(usize::MAX))
        }
        b'(' => {
            let Some(&x) = buf.get(2) else { return Step::NeedMore };
            match x {
                b'k' => gs_paren_k(buf),
                b'H' => gs_paren_h(buf),
                _ => paren(buf, |x| match x {
                    b'A' => "GS ( A",
                    b'C' => "GS ( C",
                    b'D' => "GS ( D",
                    b'E' => "GS ( E",
                    b'K' => "GS ( K",
                    b'L' => "GS ( L",
                    b'M' => "GS ( M",
                    b'N' => "GS ( N",
                    b'P' => "GS ( P",
                    b'Q' => "GS ( Q",
                    b'z' => "GS ( z",
                    _ => "GS ( ?",
                }),
            }
        }
        _ => unknown(GS, cmd),
    }
}

/// `P ( x pL pH d1…dk` with k = pL + 256·pH, for any prefix P: skipped unread.
fn paren(buf: &[u8], name: impl Fn(u8) -> &'static str) -> Step {
    let Some(&[x, lo, hi]) = buf.get(2..5) else { return Step::NeedMore };
    skipped(name(x), 5, le16(lo, hi))
}

/// The body (after `pL pH`) of a length-prefixed `GS ( x` command, once complete.
fn paren_body(buf: &[u8]) -> Option<(&[u8], usize)> {
    let &[lo, hi] = buf.get(3..5)? else { return None };
    let end = 5 + le16(lo, hi);
    Some((buf.get(5..end)?, end))
}

/// `GS ( k pL pH cn fn …`: two-dimensional codes. Only storing QR data (cn 49, fn 80,
/// m 48) is an event of its own; the rest (model, size, error correction, print, other
/// symbologies) are commands with their whole body as parameters.
fn gs_paren_k(buf: &[u8]) -> Step {
    let Some((body, end)) = paren_body(buf) else { return Step::NeedMore };
    match body {
        [49, 80, 48, data @ ..] => done(Event::Qr { data: data.to_vec() }, end),
        _ => done(Event::Command { name: "GS ( k", params: body.to_vec() }, end),
    }
}

/// `GS ( H pL pH fn m d1 d2 d3 d4`: fn 48 m 48 with a valid id is the process ID request
/// (the printed-ACK of [`crate::ack`]); anything else is a plain command.
fn gs_paren_h(buf: &[u8]) -> Step {
    let Some((body, end)) = paren_body(buf) else { return Step::NeedMore };
    if let [48, 48, d1, d2, d3, d4] = *body {
        let id = [d1, d2, d3, d4];
        if ack::is_valid_id(id) && buf[..end] == ack::request(id) {
            return done(Event::ProcessIdRequest(id), end);
        }
    }
    done(Event::Command { name: "GS ( H", params: body.to_vec() }, end)
}

/// `GS k m …`: m 0–6 data ends with NUL; m 65–79 have a length byte n and n data bytes.
/// NUL-terminated data may only hold printable ASCII (every symbology's character set is
/// inside it); a barcode broken by any other byte, or longer than 255 bytes, is abandoned
/// the way printers do: its bytes so far become a `"GS k"` command and the offending byte
/// is parsed as usual.
fn barcode(buf: &[u8]) -> Step {
    let Some(&kind) = buf.get(2) else { return Step::NeedMore };
    match kind {
        0..=6 => {
            let data = &buf[3..];
            for (i, &b) in data.iter().enumerate() {
                if b == 0 {
                    return done(Event::Barcode { kind, data: data[..i].to_vec() }, 3 + i + 1);
                }
                if !(0x20..=0x7E).contains(&b) || i == MAX_NUL_BARCODE {
                    let mut params = vec![kind];
                    params.extend_from_slice(&data[..i]);
                    return done(Event::Command { name: "GS k", params }, 3 + i);
                }
            }
            Step::NeedMore
        }
        65..=79 => {
            let Some(&n) = buf.get(3) else { return Step::NeedMore };
            let end = 4 + usize::from(n);
            match buf.get(4..end) {
                Some(data) => done(Event::Barcode { kind, data: data.to_vec() }, end),
                None => Step::NeedMore,
            }
        }
        _ => command("GS k", buf, 3),
    }
}

/// The next part of a multi-part command.
fn continuation(cont: Cont, buf: &[u8]) -> Step {
    match cont {
        Cont::FsQ { left } => {
            // xL xH yL yH d1…dk, k = (xL + 256·xH) · (yL + 256·yH) · 8.
            let Some(&[xl, xh, yl, yh]) = buf.get(..4) else { return Step::NeedMore };
            // Up to 65535² · 8 bytes, which overflows a 32-bit usize; saturating keeps the
            // parser skipping (to the end of the stream) instead of panicking.
            let data = le16(xl, xh).saturating_mul(le16(yl, yh)).saturating_mul(8);
            let cont = (left > 1).then_some(Cont::FsQ { left: left - 1 });
            Step::Done {
                event: Event::Skipped { name: "FS q image", len: data.saturating_add(4) },
                used: 4,
                skip: data,
                cont,
            }
        }
        Cont::EscAmp { y, left } => {
            // x d1…d(y·x).
            let Some(&x) = buf.first() else { return Step::NeedMore };
            let data = usize::from(y) * usize::from(x);
            let cont = (left > 1).then_some(Cont::EscAmp { y, left: left - 1 });
            Step::Done { event: Event::Skipped { name: "ESC & character", len: data + 1 }, used: 1, skip: data, cont }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::{decode_text, text_job};
    use proptest::prelude::*;

    fn parse_all(bytes: &[u8]) -> Vec<Event> {
        coalesce(Parser::new().push(bytes))
    }

    fn text(s: &[u8]) -> Event {
        Event::Text(s.to_vec())
    }

    fn cmd(name: &'static str, params: &[u8]) -> Event {
        Event::Command { name, params: params.to_vec() }
    }

    /// The text of a stream as the printer would render it, following mode switches.
    fn rendered_text(events: &[Event]) -> String {
        let mut double_byte = false;
        let mut out = String::new();
        for event in events {
            match event {
                Event::Init => double_byte = false,
                Event::DoubleByte(on) => double_byte = *on,
                Event::Text(bytes) => out.push_str(&decode_text(bytes, double_byte)),
                _ => {}
            }
        }
        out
    }

    #[test]
    fn a_typical_receipt_parses_into_its_commands() {
        let mut s = vec![0x1B, 0x40, 0x1B, 0x61, 0x01, 0x1D, 0x21, 0x11];
        s.extend_from_slice(b"Table 5\n");
        s.extend_from_slice(&[0x1B, 0x45, 0x01, 0x1B, 0x2D, 0x02, 0x1B, 0x64, 0x02]);
        s.extend_from_slice(&[0x10, 0x04, 0x04]);
        s.extend_from_slice(&[0x1B, 0x70, 0x00, 0x19, 0xFA]);
        s.extend_from_slice(&[0x1D, 0x56, 0x41, 0x03]);
        s.extend_from_slice(&ack::request(*b"AB12"));
        assert_eq!(
            parse_all(&s),
            vec![
                Event::Init,
                cmd("ESC a", &[1]),
                cmd("GS !", &[0x11]),
                text(b"Table 5\n"),
                cmd("ESC E", &[1]),
                cmd("ESC -", &[2]),
                cmd("ESC d", &[2]),
                Event::StatusRequest(4),
                Event::CashDrawer { pin: 0, on: 0x19, off: 0xFA },
                Event::Cut { partial: false },
                Event::ProcessIdRequest(*b"AB12"),
            ]
        );
    }

    #[test]
    fn every_listed_fixed_command_has_its_length() {
        let cases: &[(&[u8], Event)] = &[
            (&[0x1B, b'!', 0x38], cmd("ESC !", &[0x38])),
            (&[0x1B, b'J', 9], cmd("ESC J", &[9])),
            (&[0x1B, b't', 0], cmd("ESC t", &[0])),
            (&[0x1B, b'M', 1], cmd("ESC M", &[1])),
            (&[0x1B, b'G', 1], cmd("ESC G", &[1])),
            (&[0x1B, b'2'], cmd("ESC 2", &[])),
            (&[0x1B, b'3', 30], cmd("ESC 3", &[30])),
            (&[0x1D, b'B', 1], cmd("GS B", &[1])),
            (&[0x1D, b'h', 80], cmd("GS h", &[80])),
            (&[0x1D, b'w', 3], cmd("GS w", &[3])),
            (&[0x1D, b'H', 2], cmd("GS H", &[2])),
            (&[0x1D, b'f', 0], cmd("GS f", &[0])),
            (&[0x1D, b'a', 0xFF], cmd("GS a", &[0xFF])),
            (&[0x1C, b'!', 4], cmd("FS !", &[4])),
            (&[0x1C, b'C', 1], cmd("FS C", &[1])),
            (&[0x1C, b'&'], Event::DoubleByte(true)),
            (&[0x1C, b'.'], Event::DoubleByte(false)),
            (&[0x1D, b'V', 0], Event::Cut { partial: false }),
            (&[0x1D, b'V', 48], Event::Cut { partial: false }),
            (&[0x1D, b'V', 1], Event::Cut { partial: true }),
            (&[0x1D, b'V', 49], Event::Cut { partial: true }),
            (&[0x1D, b'V', 66, 0], Event::Cut { partial: true }),
            (&[0x1B, b'i'], Event::Cut { partial: true }),
        ];
        for (bytes, want) in cases {
            let mut stream = bytes.to_vec();
            // A letter after each command proves exactly the command's bytes were taken.
            stream.push(b'Z');
            assert_eq!(parse_all(&stream), vec![want.clone(), text(b"Z")], "{bytes:02X?}");
        }
    }

    #[test]
    fn codes_and_images_are_reported_with_their_data() {
        let mut s = Vec::new();
        // QR: model, size, store "https://x", print.
        s.extend_from_slice(&[0x1D, 0x28, 0x6B, 0x04, 0x00, 0x31, 0x41, 0x32, 0x00]);
        s.extend_from_slice(&[0x1D, 0x28, 0x6B, 0x03, 0x00, 0x31, 0x43, 0x06]);
        s.extend_from_slice(&[0x1D, 0x28, 0x6B, 12, 0x00, 0x31, 0x50, 0x30]);
        s.extend_from_slice(b"https://x");
        s.extend_from_slice(&[0x1D, 0x28, 0x6B, 0x03, 0x00, 0x31, 0x51, 0x30]);
        // Code128 "{BA1" and a NUL-terminated CODE39 "12".
        s.extend_from_slice(&[0x1D, 0x6B, 73, 4]);
        s.extend_from_slice(b"{BA1");
        s.extend_from_slice(&[0x1D, 0x6B, 4, b'1', b'2', 0x00]);
        // A 2×3 raster whose data contains what would be a cut and a status request.
        s.extend_from_slice(&[0x1D, 0x76, 0x30, 0x00, 2, 0, 3, 0]);
        s.extend_from_slice(&[0x1D, 0x56, 0x00, 0x10, 0x04, 0x01]);
        // GS ( L graphics (skipped), then an unknown GS ( x with its length.
        s.extend_from_slice(&[0x1D, 0x28, 0x4C, 0x02, 0x00, 0x30, 0x32]);
        s.extend_from_slice(&[0x1D, 0x28, 0x7E, 0x03, 0x00, 0x1D, 0x56, 0x00]);
        s.push(b'!');
        assert_eq!(
            parse_all(&s),
            vec![
                cmd("GS ( k", &[0x31, 0x41, 0x32, 0x00]),
                cmd("GS ( k", &[0x31, 0x43, 0x06]),
                Event::Qr { data: b"https://x".to_vec() },
                cmd("GS ( k", &[0x31, 0x51, 0x30]),
                Event::Barcode { kind: 73, data: b"{BA1".to_vec() },
                Event::Barcode { kind: 4, data: b"12".to_vec() },
                Event::Raster { width_bytes: 2, height: 3, data_len: 6 },
                Event::Skipped { name: "GS ( L", len: 7 },
                Event::Skipped { name: "GS ( ?", len: 8 },
                text(b"!"),
            ]
        );
    }

    #[test]
    fn unknown_commands_skip_only_prefix_and_sub_command() {
        assert_eq!(parse_all(&[0x1B, 0x01, b'A']), vec![Event::Unknown { prefix: 0x1B, command: 0x01 }, text(b"A")]);
        assert_eq!(
            parse_all(&[0x1D, b'~', 7, b'A']),
            vec![Event::Unknown { prefix: 0x1D, command: b'~' }, Event::Control(7), text(b"A")]
        );
        assert_eq!(parse_all(&[0x1B, 0x1B, 0x40]), vec![Event::Control(0x1B), Event::Init]);
        assert_eq!(parse_all(&[0x10, b'x']), vec![Event::Control(0x10), text(b"x")]);
    }

    #[test]
    fn a_broken_barcode_does_not_swallow_the_ack_request() {
        let mut s = vec![0x1D, 0x6B, 0x04, b'1', b'2'];
        s.extend_from_slice(&ack::request(*b"ZZZZ"));
        assert_eq!(parse_all(&s), vec![cmd("GS k", &[4, b'1', b'2']), Event::ProcessIdRequest(*b"ZZZZ")]);
    }

    #[test]
    fn invalid_process_ids_are_plain_commands() {
        let s = [0x1D, 0x28, 0x48, 0x06, 0x00, 0x30, 0x30, 0x01, b'A', b'A', b'A'];
        assert_eq!(parse_all(&s), vec![cmd("GS ( H", &[0x30, 0x30, 0x01, b'A', b'A', b'A'])]);
    }

    #[test]
    fn double_byte_pairs_are_never_split() {
        let job = text_job("宫保鸡丁 x1");
        let mut parser = Parser::new();
        let mut events = Vec::new();
        for byte in &job {
            for event in parser.push(std::slice::from_ref(byte)) {
                if let Event::Text(t) = &event {
                    assert!(decode_text(t, true).chars().all(|c| c != '\u{FFFD}'), "split: {t:02X?}");
                }
                events.push(event);
            }
        }
        assert_eq!(rendered_text(&coalesce(events)), "宫保鸡丁 x1");
    }

    #[test]
    fn four_byte_gb18030_characters_stay_whole() {
        let job = text_job("😀€é");
        let events = parse_all(&job);
        assert_eq!(rendered_text(&events), "😀€é");
    }

    #[test]
    fn a_bad_lead_byte_does_not_eat_the_next_command() {
        let mut parser = Parser::new();
        let events = parser.push(&[0x1C, 0x26, 0xB9, 0x1B, 0x40, 0xB9]);
        assert_eq!(events, vec![Event::DoubleByte(true), text(&[0xB9]), Event::Init, text(&[0xB9])]);
    }

    #[test]
    fn text_jobs_round_trip() {
        for s in ["Table 5\n1 x Noodles\n", "Café crème 2,50 €\n", "宫保鸡丁 x1", "混合 mixed\n\t99.00\n"] {
            let events = parse_all(&text_job(s));
            assert_eq!(rendered_text(&events), s);
            assert_eq!(events.last(), Some(&Event::Cut { partial: true }));
            assert_eq!(events.first(), Some(&Event::Init));
        }
    }

    #[test]
    fn large_images_are_skipped_without_buffering() {
        let mut parser = Parser::new();
        let events = parser.push(&[0x1D, 0x76, 0x30, 0x00, 72, 0, 0xE8, 0x03]);
        assert_eq!(events, vec![Event::Raster { width_bytes: 72, height: 1000, data_len: 72_000 }]);
        for _ in 0..72 {
            assert_eq!(parser.push(&[0x1D; 1000]), vec![]);
            assert_eq!(parser.buffered(), 0);
        }
        assert_eq!(parser.push(b"ok"), vec![text(b"ok")]);
    }

    #[test]
    fn sizes_cover_the_whole_stream() {
        let mut s = text_job("宫保鸡丁 x1");
        s.extend_from_slice(&[0x1D, 0x76, 0x30, 0x00, 2, 0, 3, 0, 1, 2, 3, 4, 5, 6]);
        s.extend_from_slice(&ack::request(*b"0001"));
        let total: usize = Parser::new().push_sized(&s).iter().map(|(_, n)| n).sum();
        assert_eq!(total, s.len());
    }

    /// Streams biased towards command bytes, so that prefixes meet each other, lengths and
    /// terminators often: pure random bytes would mostly be text.
    fn stream() -> impl Strategy<Value = Vec<u8>> {
        let byte = prop_oneof![
            4 => any::<u8>(),
            2 => prop::sample::select(vec![0x10, 0x1B, 0x1C, 0x1D, 0x00, 0x04]),
            2 => prop::sample::select(b"@!EVkvH(&.pDq*LaB0124Pw".to_vec()),
            1 => prop::sample::select(vec![0x81, 0xB9, 0xFE, 0x30, 0x39, 0x40]),
        ];
        prop::collection::vec(byte, 0..600)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn chunking_never_changes_the_events(bytes in stream(), cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..20)) {
            let whole = Parser::new().push_sized(&bytes);
            let mut points: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
            points.push(0);
            points.push(bytes.len());
            points.sort_unstable();
            let mut parser = Parser::new();
            let mut pieces = Vec::new();
            for pair in points.windows(2) {
                pieces.extend(parser.push_sized(&bytes[pair[0]..pair[1]]));
            }
            let sizes = |events: &[(Event, usize)]| events.iter().map(|(_, n)| n).sum::<usize>();
            prop_assert_eq!(sizes(&whole), sizes(&pieces));
            let whole: Vec<Event> = whole.into_iter().map(|(e, _)| e).collect();
            let pieces: Vec<Event> = pieces.into_iter().map(|(e, _)| e).collect();
            prop_assert_eq!(coalesce(whole), coalesce(pieces));
        }

        #[test]
        fn byte_by_byte_equals_at_once(bytes in stream()) {
            let mut parser = Parser::new();
            let mut events = Vec::new();
            for b in &bytes {
                events.extend(parser.push(std::slice::from_ref(b)));
            }
            prop_assert_eq!(coalesce(events), parse_all(&bytes));
        }

        #[test]
        fn any_text_round_trips(s in "\\PC{0,60}") {
            let clean: String = s.chars().filter(|&c| c == '\n' || c == '\t' || !c.is_control()).collect();
            prop_assert_eq!(rendered_text(&parse_all(&text_job(&s))), clean);
        }

        #[test]
        fn an_ack_request_after_any_complete_job_is_found(s in "\\PC{0,40}", id in prop::array::uniform4(0x20u8..=0x7E)) {
            let mut bytes = text_job(&s);
            bytes.extend_from_slice(&ack::request(id));
            let events = parse_all(&bytes);
            prop_assert_eq!(events.last(), Some(&Event::ProcessIdRequest(id)));
        }
    }
}
