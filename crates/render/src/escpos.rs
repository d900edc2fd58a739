//! The ESC/POS renderer.
//!
//! The stream starts with `ESC @` (nothing left over from an earlier job) and puts the
//! printer in the profile's character mode: `FS &` for the double-byte encodings (plus
//! `FS C 1` for Shift_JIS), `ESC t n` for the single-byte code pages. Styles are sent
//! only when they change (`ESC E` bold, `ESC -` underline — and `FS -` in double-byte
//! mode, where it is a separate setting for Kanji —, `GS B` invert, `GS !` size).
//! Text is encoded one character at a time with the profile's encoding; a character it
//! cannot encode becomes `?` (see [`crate::width::replacement`]) with a warning, and
//! control characters never reach the printer, so no text can smuggle in a command.

use crate::doc::{Align, Document, EcLevel, Hri, Style};
use crate::error::{RenderError, Warning, WarningKind, Warnings};
use crate::layout::{layout, Item, Layout, Run, Target};
use crate::profile::{Encoding, Profile};
use crate::width::{char_width, is_silent, replacement};

const ESC: u8 = 0x1B;
const GS: u8 = 0x1D;
const FS: u8 = 0x1C;
const LF: u8 = 0x0A;

/// Rows per `GS v 0` command: cheap printers have small receive buffers, and a
/// command per band keeps each one well inside them.
const RASTER_BAND: usize = 256;

/// ESC/POS bytes and what did not come out exactly as the document says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    pub bytes: Vec<u8>,
    pub warnings: Vec<Warning>,
}

/// Renders `doc` for a printer described by `profile`.
///
/// Errors are the document's (an image that does not decode, a barcode or QR code
/// wider than the paper) and name the field. A printable document always renders;
/// characters the profile cannot encode are replaced and listed in the warnings.
pub fn to_escpos(doc: &Document, profile: &Profile) -> Result<Rendered, RenderError> {
    let layout = layout(doc, profile, Target::EscPos)?;
    let mut w = Writer {
        out: Vec::with_capacity(64 + layout.runs.len() * 24),
        encoding: layout.encoding,
        style: Style::default(),
        align: Align::Left,
        warnings: Warnings::default(),
    };
    w.out.extend_from_slice(&[ESC, b'@']);
    if layout.encoding.double_byte() {
        w.out.extend_from_slice(&[FS, b'&']);
        if layout.encoding == Encoding::ShiftJis {
            w.out.extend_from_slice(&[FS, b'C', 1]);
        }
    } else if let Some(n) = profile.esc_t() {
        w.out.extend_from_slice(&[ESC, b't', n]);
    }
    w.items(&layout);
    let mut warnings = layout.warnings;
    warnings.extend(w.warnings);
    Ok(Rendered { bytes: w.out, warnings: warnings.into_vec() })
}

struct Writer {
    out: Vec<u8>,
    encoding: Encoding,
    /// The printer's style settings after what was written so far.
    style: Style,
    align: Align,
    warnings: Warnings,
}

impl Writer {
    fn items(&mut self, layout: &Layout<'_>) {
        for item in &layout.items {
            match item {
                Item::Line { runs, trail, trail_style, .. } => {
                    self.set_align(Align::Left);
                    for run in &layout.runs[runs.clone()] {
                        self.run(run);
                    }
                    if *trail > 0 {
                        self.set_blank_style(*trail_style);
                        self.spaces(*trail);
                    }
                    self.out.push(LF);
                }
                Item::Feed(n) => self.out.extend_from_slice(&[ESC, b'd', *n]),
                Item::Qr { data, ec, size, align } => {
                    self.set_style(Style::default());
                    self.set_align(*align);
                    self.qr(data.as_bytes(), *ec, *size);
                }
                Item::Barcode { symbol, module, height, hri, align } => {
                    self.set_style(Style::default());
                    self.set_align(*align);
                    let hri = match hri {
                        Hri::None => 0,
                        Hri::Above => 1,
                        Hri::Below => 2,
                        Hri::Both => 3,
                    };
                    self.out.extend_from_slice(&[GS, b'h', *height, GS, b'w', *module, GS, b'H', hri, GS, b'f', 0]);
                    // Symbol data is at most 130 bytes (64 characters plus escapes).
                    let n = u8::try_from(symbol.data.len()).unwrap_or(u8::MAX);
                    self.out.extend_from_slice(&[GS, b'k', symbol.m, n]);
                    self.out.extend_from_slice(&symbol.data[..usize::from(n)]);
                }
                Item::Image { bitmap: Some(bitmap), x, .. } => {
                    self.set_style(Style::default());
                    // The image is shifted right inside the raster rather than aligned
                    // with ESC a, which not every printer applies to GS v 0.
                    self.set_align(Align::Left);
                    self.raster(bitmap, usize::from(*x));
                }
                Item::Image { bitmap: None, .. } | Item::Invalid { .. } => {}
                Item::Logo { key, align } => {
                    self.set_style(Style::default());
                    self.set_align(*align);
                    self.out.extend_from_slice(&[FS, b'p', *key, 0]);
                }
                Item::Cut { partial, feed } => {
                    if *feed > 0 {
                        self.out.extend_from_slice(&[ESC, b'd', *feed]);
                    }
                    // GS V 66/65 n: feed to the cutter, then cut partially/fully.
                    self.out.extend_from_slice(&[GS, b'V', if *partial { 66 } else { 65 }, 0]);
                }
                Item::Drawer { pin, on, off } => {
                    let m = if *pin == 5 { 1 } else { 0 };
                    self.out.extend_from_slice(&[ESC, b'p', m, *on, *off]);
                }
            }
        }
    }

    fn run(&mut self, run: &Run<'_>) {
        if run.pad > 0 {
            // Bold and height do not show on a blank: take the run's, so the run itself
            // needs no further switch.
            let style = run.style;
            self.set_style(Style {
                bold: style.bold,
                double_height: style.double_height,
                double_width: false,
                ..run.pad_style
            });
            self.spaces(run.pad);
        }
        self.set_style(run.style);
        self.text(&run.text, run);
    }

    fn spaces(&mut self, n: u16) {
        self.out.resize(self.out.len() + usize::from(n), b' ');
    }

    fn set_align(&mut self, align: Align) {
        if self.align != align {
            let n = match align {
                Align::Left => 0,
                Align::Center => 1,
                Align::Right => 2,
            };
            self.out.extend_from_slice(&[ESC, b'a', n]);
            self.align = align;
        }
    }

    /// The style for blanks: single width (pads are counted in single columns), with
    /// the underline and invert asked for; bold and height, which a blank does not
    /// show, stay as they are rather than being switched back and forth.
    fn set_blank_style(&mut self, s: Style) {
        let cur = self.style;
        self.set_style(Style { bold: cur.bold, double_height: cur.double_height, double_width: false, ..s });
    }

    fn set_style(&mut self, s: Style) {
        let cur = self.style;
        if cur.bold != s.bold {
            self.out.extend_from_slice(&[ESC, b'E', u8::from(s.bold)]);
        }
        if cur.underline != s.underline {
            self.out.extend_from_slice(&[ESC, b'-', u8::from(s.underline)]);
            if self.encoding.double_byte() {
                self.out.extend_from_slice(&[FS, b'-', u8::from(s.underline)]);
            }
        }
        if cur.invert != s.invert {
            self.out.extend_from_slice(&[GS, b'B', u8::from(s.invert)]);
        }
        if (cur.double_width, cur.double_height) != (s.double_width, s.double_height) {
            self.out.extend_from_slice(&[GS, b'!', u8::from(s.double_width) << 4 | u8::from(s.double_height)]);
        }
        self.style = s;
    }

    /// Encodes the text of a run. Printable ASCII is the same in every encoding and goes
    /// out as is; anything else is looked at character by character.
    fn text(&mut self, text: &str, run: &Run<'_>) {
        if text.bytes().all(|b| (0x20..0x7F).contains(&b)) {
            self.out.extend_from_slice(text.as_bytes());
            return;
        }
        let mut buf = [0u8; 8];
        for c in text.chars() {
            let width = char_width(self.encoding, c);
            if width == 0 {
                if !is_silent(c) {
                    self.warnings.push(run.origin.path(), WarningKind::Dropped { ch: c });
                }
                continue;
            }
            if c == '\t' {
                self.out.push(b' ');
                continue;
            }
            match self.encoding.encode_char(c, &mut buf) {
                Some(n) => self.out.extend_from_slice(&buf[..n]),
                None => {
                    let replacement = replacement(c, width);
                    self.out.extend_from_slice(replacement.as_bytes());
                    let kind = WarningKind::Unencodable { ch: c, replacement: replacement.to_string() };
                    self.warnings.push(run.origin.path(), kind);
                }
            }
        }
    }

    fn qr(&mut self, data: &[u8], ec: EcLevel, size: u8) {
        let ec = match ec {
            EcLevel::L => 48,
            EcLevel::M => 49,
            EcLevel::Q => 50,
            EcLevel::H => 51,
        };
        // Model 2, module size, error correction, store the data, print.
        self.out.extend_from_slice(&[GS, b'(', b'k', 4, 0, 49, 65, 50, 0]);
        self.out.extend_from_slice(&[GS, b'(', b'k', 3, 0, 49, 67, size]);
        self.out.extend_from_slice(&[GS, b'(', b'k', 3, 0, 49, 69, ec]);
        // Data is at most 2953 bytes (checked in layout), so the length fits two bytes.
        let len = u16::try_from(data.len() + 3).unwrap_or(u16::MAX);
        let [lo, hi] = len.to_le_bytes();
        self.out.extend_from_slice(&[GS, b'(', b'k', lo, hi, 49, 80, 48]);
        self.out.extend_from_slice(&data[..usize::from(len - 3)]);
        self.out.extend_from_slice(&[GS, b'(', b'k', 3, 0, 49, 81, 48]);
    }

    /// `GS v 0` in bands, the bitmap shifted right by `x` dots.
    fn raster(&mut self, bitmap: &crate::image::Bitmap, x: usize) {
        let width_bytes = (x + usize::from(bitmap.width)).div_ceil(8);
        let Ok(xb) = u16::try_from(width_bytes) else { return };
        let shift = x % 8;
        let skip = x / 8;
        for band in (0..usize::from(bitmap.height)).step_by(RASTER_BAND) {
            let rows = (usize::from(bitmap.height) - band).min(RASTER_BAND);
            let [xl, xh] = xb.to_le_bytes();
            // `rows` is at most RASTER_BAND.
            let [yl, yh] = (rows as u16).to_le_bytes();
            self.out.extend_from_slice(&[GS, b'v', b'0', 0, xl, xh, yl, yh]);
            for y in band..band + rows {
                let src = &bitmap.bits[y * bitmap.stride..(y + 1) * bitmap.stride];
                let start = self.out.len();
                self.out.resize(start + width_bytes, 0);
                let dst = &mut self.out[start..];
                for (i, &b) in src.iter().enumerate() {
                    if let Some(d) = dst.get_mut(skip + i) {
                        *d |= b >> shift;
                    }
                    if shift > 0 {
                        if let Some(d) = dst.get_mut(skip + i + 1) {
                            *d |= b << (8 - shift);
                        }
                    }
                }
            }
        }
    }
}
