//! A readable transcript of an ESC/POS command stream, for snapshot tests and debugging.
//!
//! [`transcript`] runs the stream through the same [`Parser`] the printer simulator
//! reads its input with, so what a test compares is what a printer-side parse sees, and
//! prints one token per event:
//!
//! ```text
//! [INIT]
//! [DOUBLE-BYTE on]
//! "    " [BOLD on] [SIZE 2x2] "TOTAL" [LF]
//! [ALIGN center] [QR "https://example.com/r/1" size=6 ec=M]
//! [FEED 3]
//! [CUT partial]
//! ```
//!
//! Text is decoded the way the printer would print it: in double-byte mode (`FS &`) with
//! the printer's double-byte character set, which is a property of the model and not in
//! the stream ([`Options::charset`]; `FS C 1` switches to Shift_JIS), otherwise with the
//! single-byte code page selected by `ESC t` (PC437 at power-on). Settings that only
//! matter to a later command are folded into it: barcode height, module width and HRI
//! position (`GS h`, `GS w`, `GS H`) show up in `[BARCODE …]`, QR model, module size and
//! error correction (`GS ( k` fn 65/67/69) in `[QR …]`, which is printed where fn 81
//! prints the symbol. Raster images show their size and an FNV-1a hash of their data, so
//! a change in dithering changes the snapshot. Everything else is shown, unknown commands
//! included; a new line starts after each command that moves the paper.

use std::fmt::Write as _;

use encoding_rs::{Encoding, BIG5, GB18030, SHIFT_JIS};

use crate::codepage::CodePage;
use crate::parse::{Event, Parser};

/// The character set of double-byte mode on the printer being described.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DoubleByteCharset {
    /// Mainland Chinese models: GB18030 (GBK is a subset).
    #[default]
    Gb18030,
    /// Traditional Chinese models.
    Big5,
    /// Japanese models in Shift_JIS mode.
    ShiftJis,
}

impl DoubleByteCharset {
    fn encoding(self) -> &'static Encoding {
        match self {
            DoubleByteCharset::Gb18030 => GB18030,
            DoubleByteCharset::Big5 => BIG5,
            DoubleByteCharset::ShiftJis => SHIFT_JIS,
        }
    }
}

/// How to read the stream: what the printer model does that the bytes do not say.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Options {
    /// The character set of double-byte mode.
    pub charset: DoubleByteCharset,
    /// Whether the printer is in double-byte mode at power-on and after `ESC @`.
    pub double_byte_default: bool,
}

/// The transcript of `bytes`; see the module documentation for its format.
pub fn transcript(bytes: &[u8], options: Options) -> String {
    let mut parser = Parser::with_double_byte_default(options.double_byte_default);
    let events = parser.push_sized(bytes);
    let mut t = Transcript::new(options);
    let mut offset = 0usize;
    for (event, size) in events {
        let data = bytes.get(offset..offset.saturating_add(size).min(bytes.len())).unwrap_or_default();
        t.event(event, data, size);
        offset = offset.saturating_add(size);
    }
    if parser.buffered() > 0 {
        t.token(&format!("[INCOMPLETE {} bytes]", parser.buffered()));
    }
    t.finish()
}

/// Barcode and QR settings waiting for the command that uses them.
struct Settings {
    barcode_height: u8,
    barcode_module: u8,
    hri: u8,
    qr_model: u8,
    qr_size: u8,
    qr_ec: u8,
    qr_data: Option<Vec<u8>>,
}

impl Default for Settings {
    /// The printers' power-on values.
    fn default() -> Settings {
        Settings { barcode_height: 162, barcode_module: 3, hri: 0, qr_model: 2, qr_size: 3, qr_ec: 48, qr_data: None }
    }
}

struct Transcript {
    out: String,
    /// Whether the current output line has a token yet.
    in_line: bool,
    options: Options,
    charset: DoubleByteCharset,
    double_byte: bool,
    code_page: CodePage,
    settings: Settings,
}

impl Transcript {
    fn new(options: Options) -> Transcript {
        Transcript {
            out: String::new(),
            in_line: false,
            options,
            charset: options.charset,
            double_byte: options.double_byte_default,
            code_page: CodePage::Pc437,
            settings: Settings::default(),
        }
    }

    fn token(&mut self, token: &str) {
        if self.in_line {
            self.out.push(' ');
        }
        self.out.push_str(token);
        self.in_line = true;
    }

    fn end_line(&mut self) {
        if self.in_line {
            self.out.push('\n');
            self.in_line = false;
        }
    }

    fn line_token(&mut self, token: &str) {
        self.token(token);
        self.end_line();
    }

    fn finish(mut self) -> String {
        if let Some(data) = self.settings.qr_data.take() {
            let token = format!("[QR-STORED-NOT-PRINTED {}]", quote(&String::from_utf8_lossy(&data)));
            self.token(&token);
        }
        self.end_line();
        self.out
    }

    fn event(&mut self, event: Event, data: &[u8], size: usize) {
        match event {
            Event::Text(bytes) => self.text(&bytes),
            Event::Control(b) => self.token(&format!("[CTRL 0x{b:02X}]")),
            Event::Init => {
                self.double_byte = self.options.double_byte_default;
                self.charset = self.options.charset;
                self.code_page = CodePage::Pc437;
                self.settings = Settings::default();
                self.line_token("[INIT]");
            }
            Event::Command { name, params } => self.command(name, &params),
            Event::Skipped { name, len } => self.token(&format!("[{name} len={len}]")),
            Event::DoubleByte(on) => {
                self.double_byte = on;
                self.line_token(if on { "[DOUBLE-BYTE on]" } else { "[DOUBLE-BYTE off]" });
            }
            Event::StatusRequest(n) => self.token(&format!("[STATUS {n}]")),
            Event::ProcessIdRequest(id) => {
                let token = format!("[ACK-REQUEST {}]", quote(&String::from_utf8_lossy(&id)));
                self.line_token(&token);
            }
            Event::Cut { partial } => self.line_token(if partial { "[CUT partial]" } else { "[CUT full]" }),
            Event::Qr { data } => self.settings.qr_data = Some(data),
            Event::Barcode { kind, data } => {
                let s = &self.settings;
                let token = format!(
                    "[BARCODE {} {} h={} w={} hri={}]",
                    barcode_name(kind),
                    quote(&barcode_text(kind, &data)),
                    s.barcode_height,
                    s.barcode_module,
                    hri_name(s.hri)
                );
                self.line_token(&token);
            }
            Event::Raster { width_bytes, height, data_len } => {
                // The parser reports the header; the data is the rest of this event's bytes.
                let pixels = data.get(8..).unwrap_or_default();
                let complete = if pixels.len() == data_len && size == data.len() { "" } else { " (truncated)" };
                let token =
                    format!("[RASTER {}x{} fnv={:08x}{complete}]", u32::from(width_bytes) * 8, height, fnv1a(pixels));
                self.line_token(&token);
            }
            Event::CashDrawer { pin, on, off } => {
                let pin = if pin & 1 == 0 { 2 } else { 5 };
                let token = format!("[DRAWER pin={pin} on={}ms off={}ms]", u32::from(on) * 2, u32::from(off) * 2);
                self.token(&token);
            }
            Event::Unknown { prefix, command } => {
                let token = format!("[UNKNOWN {} 0x{command:02X}]", prefix_name(prefix));
                self.token(&token);
            }
        }
    }

    fn text(&mut self, bytes: &[u8]) {
        // LF, CR and HT are never part of a multi-byte character in any of the supported
        // character sets (trail bytes start at 0x30), so splitting on them first is safe.
        for piece in bytes.split_inclusive(|&b| matches!(b, b'\n' | b'\r' | b'\t')) {
            let (body, end) = match piece.split_last() {
                Some((&last, body)) if matches!(last, b'\n' | b'\r' | b'\t') => (body, Some(last)),
                _ => (piece, None),
            };
            if !body.is_empty() {
                let decoded = self.decode(body);
                self.token(&quote(&decoded));
            }
            match end {
                Some(b'\n') => self.line_token("[LF]"),
                Some(b'\r') => self.token("[CR]"),
                Some(_) => self.token("[HT]"),
                None => {}
            }
        }
    }

    fn decode(&self, bytes: &[u8]) -> String {
        if self.double_byte {
            self.charset.encoding().decode_without_bom_handling(bytes).0.into_owned()
        } else {
            bytes.iter().map(|&b| self.code_page.decode(b)).collect()
        }
    }

    fn command(&mut self, name: &'static str, params: &[u8]) {
        let first = params.first().copied().unwrap_or(0);
        let on_off = |n: u8| if n & 1 == 1 { "on" } else { "off" };
        match name {
            "ESC E" => self.token(&format!("[BOLD {}]", on_off(first))),
            "ESC G" => self.token(&format!("[DOUBLE-STRIKE {}]", on_off(first))),
            "ESC -" | "FS -" => {
                let which = if name == "FS -" { "KANJI-UNDERLINE" } else { "UNDERLINE" };
                let state = match first {
                    0 | 48 => "off",
                    1 | 49 => "on",
                    2 | 50 => "thick",
                    _ => "?",
                };
                self.token(&format!("[{which} {state}]"));
            }
            "GS B" => self.token(&format!("[INVERT {}]", on_off(first))),
            "GS !" => self.token(&format!("[SIZE {}x{}]", (first >> 4) + 1, (first & 0x0F) + 1)),
            "ESC a" => {
                let align = match first {
                    0 | 48 => "left",
                    1 | 49 => "center",
                    2 | 50 => "right",
                    _ => "?",
                };
                self.token(&format!("[ALIGN {align}]"));
            }
            "ESC d" => self.line_token(&format!("[FEED {first}]")),
            "ESC J" => self.line_token(&format!("[FEED-DOTS {first}]")),
            "ESC t" => {
                let token = match CodePage::from_epson_number(first) {
                    Some(page) => {
                        self.code_page = page;
                        format!("[CODEPAGE {}]", page.name())
                    }
                    None => format!("[CODEPAGE {first} (unknown, read as {})]", self.code_page.name()),
                };
                self.line_token(&token);
            }
            "FS C" => {
                let code = match first {
                    0 | 48 => "jis",
                    1 | 49 => {
                        self.charset = DoubleByteCharset::ShiftJis;
                        "shift_jis"
                    }
                    2 | 50 => "shift_jis_2004",
                    _ => "?",
                };
                self.line_token(&format!("[KANJI-CODE {code}]"));
            }
            "GS h" => self.settings.barcode_height = first,
            "GS w" => self.settings.barcode_module = first,
            "GS H" => self.settings.hri = first,
            "GS f" => {}
            "FS p" => {
                let token = format!("[NV-IMAGE {} mode={}]", first, params.get(1).copied().unwrap_or(0));
                self.line_token(&token);
            }
            "GS ( k" => self.two_d(params),
            _ => self.token(&generic(name, params)),
        }
    }

    /// `GS ( k` bodies other than "store QR data" (which is [`Event::Qr`]).
    fn two_d(&mut self, body: &[u8]) {
        match body {
            [49, 65, n, ..] => self.settings.qr_model = n.wrapping_sub(48),
            [49, 67, n] => self.settings.qr_size = *n,
            [49, 69, n] => self.settings.qr_ec = *n,
            [49, 81, ..] => {
                let s = &mut self.settings;
                let ec = match s.qr_ec {
                    48 => "L",
                    49 => "M",
                    50 => "Q",
                    51 => "H",
                    _ => "?",
                };
                let data = match s.qr_data.take() {
                    Some(data) => quote(&String::from_utf8_lossy(&data)),
                    None => "(no data)".to_string(),
                };
                let model = if s.qr_model == 2 { String::new() } else { format!(" model={}", s.qr_model) };
                let token = format!("[QR {data} size={} ec={ec}{model}]", s.qr_size);
                self.line_token(&token);
            }
            _ => self.token(&generic("GS ( k", body)),
        }
    }
}

fn generic(name: &str, params: &[u8]) -> String {
    let mut s = format!("[{name}");
    for b in params {
        // Writing to a String cannot fail.
        let _ = write!(s, " {b:02X}");
    }
    s.push(']');
    s
}

/// `"…"` with `\` and `"` escaped and control characters as `\u{…}`, so a transcript
/// line always reads unambiguously.
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:X}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn prefix_name(prefix: u8) -> &'static str {
    match prefix {
        0x1B => "ESC",
        0x1C => "FS",
        0x1D => "GS",
        _ => "DLE",
    }
}

fn hri_name(n: u8) -> &'static str {
    match n {
        0 | 48 => "none",
        1 | 49 => "above",
        2 | 50 => "below",
        3 | 51 => "both",
        _ => "?",
    }
}

fn barcode_name(kind: u8) -> String {
    // m 0–6 (NUL-terminated) and 65–71 are the same symbologies in the same order.
    let index = if kind >= 65 { kind - 65 } else { kind };
    let name = match index {
        0 => "upc-a",
        1 => "upc-e",
        2 => "ean13",
        3 => "ean8",
        4 => "code39",
        5 => "itf",
        6 => "codabar",
        7 if kind >= 65 => "code93",
        8 if kind >= 65 => "code128",
        _ => return format!("m={kind}"),
    };
    name.to_string()
}

/// The human-readable content of a barcode's data. For Code128 the `{A`/`{B`/`{C` code
/// set selectors are read: set C bytes are two-digit numbers, `{{` is a literal brace.
fn barcode_text(kind: u8, data: &[u8]) -> String {
    if kind != 73 {
        return String::from_utf8_lossy(data).into_owned();
    }
    let mut out = String::new();
    let mut set_c = false;
    let mut i = 0;
    while i < data.len() {
        let b = data[i];
        if b == b'{' {
            match data.get(i + 1) {
                Some(b'C') => set_c = true,
                Some(b'A' | b'B') => set_c = false,
                Some(b'{') => out.push('{'),
                Some(&other) => {
                    let _ = write!(out, "{{{}}}", char::from(other));
                }
                None => out.push('{'),
            }
            i += 2;
            continue;
        }
        if set_c {
            let _ = write!(out, "{b:02}");
        } else {
            out.push(char::from(b));
        }
        i += 1;
    }
    out
}

/// FNV-1a (32 bit): a short, dependency-free fingerprint of raster data.
fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811C_9DC5u32, |h, &b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::text_job;

    #[test]
    fn a_text_job_reads_back() {
        let t = transcript(&text_job("Table 5\n宫保鸡丁 x1\n"), Options::default());
        assert_eq!(t, "[INIT]\n[DOUBLE-BYTE on]\n\"Table 5\" [LF]\n\"宫保鸡丁 x1\" [LF]\n[FEED 3]\n[CUT partial]\n");
    }

    #[test]
    fn styles_codes_and_images_are_named() {
        let mut s = vec![0x1B, 0x40, 0x1B, b't', 19, 0x1B, b'a', 1, 0x1B, b'E', 1, 0x1D, b'!', 0x11];
        s.extend_from_slice(b"TOTAL \xD5\n");
        s.extend_from_slice(&[0x1D, 0x28, 0x6B, 0x04, 0x00, 0x31, 0x41, 0x32, 0x00]);
        s.extend_from_slice(&[0x1D, 0x28, 0x6B, 0x03, 0x00, 0x31, 0x43, 0x06]);
        s.extend_from_slice(&[0x1D, 0x28, 0x6B, 0x03, 0x00, 0x31, 0x45, 0x31]);
        s.extend_from_slice(&[0x1D, 0x28, 0x6B, 0x0C, 0x00, 0x31, 0x50, 0x30]);
        s.extend_from_slice(b"https://x");
        s.extend_from_slice(&[0x1D, 0x28, 0x6B, 0x03, 0x00, 0x31, 0x51, 0x30]);
        s.extend_from_slice(&[0x1D, b'h', 80, 0x1D, b'w', 2, 0x1D, b'H', 2, 0x1D, b'k', 73, 7]);
        s.extend_from_slice(b"{C\x0c\x22{Bx");
        s.extend_from_slice(&[0x1D, 0x76, 0x30, 0x00, 1, 0, 2, 0, 0xF0, 0x0F]);
        s.extend_from_slice(&[0x1B, b'p', 0, 25, 250, 0x1D, b'V', 66, 0, 0x1B, 0x01]);
        let t = transcript(&s, Options::default());
        assert_eq!(
            t,
            "[INIT]\n[CODEPAGE cp858]\n[ALIGN center] [BOLD on] [SIZE 2x2] \"TOTAL €\" [LF]\n\
             [QR \"https://x\" size=6 ec=M]\n[BARCODE code128 \"1234x\" h=80 w=2 hri=below]\n\
             [RASTER 8x2 fnv=a111a520]\n[DRAWER pin=2 on=50ms off=500ms] [CUT partial]\n[UNKNOWN ESC 0x01]\n"
        );
    }

    #[test]
    fn other_charsets_and_odd_input() {
        let opts = Options { charset: DoubleByteCharset::Big5, double_byte_default: true };
        // 台北 in Big5, a quote, a tab and a truncated raster.
        let mut s = vec![0xA5, 0x78, 0xA5, 0x5F, b'"', b'\t', 0x0C];
        s.extend_from_slice(&[0x1D, 0x76, 0x30, 0x00, 1, 0, 4, 0, 0xFF]);
        assert_eq!(transcript(&s, opts), "\"台北\\\"\" [HT] [CTRL 0x0C] [RASTER 8x4 fnv=7a0b824e (truncated)]\n");
        let sjis = [0x1C, b'&', 0x1C, b'C', 1, 0x93, 0xFA, 0x96, 0x7B];
        assert_eq!(transcript(&sjis, Options::default()), "[DOUBLE-BYTE on]\n[KANJI-CODE shift_jis]\n\"日本\"\n");
    }
}
