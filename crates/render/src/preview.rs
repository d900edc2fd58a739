//! The PNG preview: the slip as the printer would print it, dot for dot.
//!
//! The print area is `profile.dots` wide; text is drawn in the printer's cells (12×24
//! per column, 24×24 for a two-column character, doubled by pixel doubling like the
//! printer does), with the characters the printer would print — a character the profile
//! cannot encode shows as the same `?` the printer gets. QR codes and barcodes are
//! drawn at the printer's module size, images as their dithered raster. Around the
//! print area is white paper margin and, outside the paper, a grey background; a cut
//! shows as a gap in the paper (a partial cut keeps a small bridge). The file is a
//! 2-bit indexed PNG: paper, ink, background and the cut edge.

use crate::barcode::Symbol;
use crate::doc::{Align, Document, Hri, Style};
use crate::error::RenderError;
use crate::font;
use crate::image::Bitmap;
use crate::layout::{layout, Item, Layout, Run, Target};
use crate::profile::Profile;
use crate::qr;
use crate::width::{char_width, replacement};

/// Blank dots between lines (the printers' default line spacing is 30 dots for a
/// 24-dot line).
const LINE_GAP: usize = 6;
/// Tallest preview in dots; a longer document is refused rather than allocated.
const MAX_HEIGHT: usize = 60_000;
/// Grey outside the paper, on each side and above and below.
const BACKGROUND: usize = 16;
/// White paper outside the print area, left and right.
const PAPER_MARGIN: usize = 24;
/// White paper above the first line.
const PAPER_TOP: usize = 16;
/// Height of the gap a cut leaves.
const CUT_GAP: usize = 14;
/// Height of the placeholder of a logo stored in the printer.
const LOGO_HEIGHT: usize = 72;

// Paper is index 0, so blank paper is zero bytes, which the fast deflate compresses best.
const PAPER: u8 = 0;
const INK: u8 = 1;
const GREY: u8 = 2;
const EDGE: u8 = 3;
const PALETTE: [u8; 12] = [0xFF, 0xFF, 0xFF, 0x1A, 0x1A, 0x1A, 0xD9, 0xDC, 0xE0, 0x9A, 0x9E, 0xA4];

/// Renders `doc` as a PNG of the slip a printer described by `profile` would print.
///
/// Errors are the document's, as for [`crate::to_escpos`], plus a document so long
/// its picture would be taller than 60,000 dots (about 7.5 m of paper).
pub fn to_png(doc: &Document, profile: &Profile) -> Result<Vec<u8>, RenderError> {
    let layout = layout(doc, profile, Target::Png)?;
    let cell_w = usize::from(layout.dots / layout.columns).clamp(6, 12);
    let width = usize::from(layout.dots).max(usize::from(layout.columns) * cell_w).next_multiple_of(8);
    let mut p = Painter { canvas: Canvas::new(width), cell_w, y: 0, cuts: Vec::new(), layout: &layout };
    p.paint()?;
    let Painter { canvas, cuts, y, .. } = p;
    write_png(&canvas, y, &cuts)
}

/// The slip as a 1-bit raster of the print area only (no paper margin, no cut gaps): what
/// a printer that takes images prints, such as Epson's ePOS-Print `<image>`.
pub(crate) struct Raster {
    /// Dots per row, a multiple of 8.
    pub width: usize,
    pub height: usize,
    /// Rows of `width / 8` bytes, most significant bit leftmost, 1 = ink.
    pub bits: Vec<u8>,
    /// Where the document cuts the paper (the row below the feed), and whether partially.
    pub cuts: Vec<(usize, bool)>,
}

/// Renders `doc` as the raster [`to_png`] draws its slip from.
pub(crate) fn to_raster(doc: &Document, profile: &Profile) -> Result<Raster, RenderError> {
    let layout = layout(doc, profile, Target::Png)?;
    let cell_w = usize::from(layout.dots / layout.columns).clamp(6, 12);
    let width = usize::from(layout.dots).max(usize::from(layout.columns) * cell_w).next_multiple_of(8);
    let mut p = Painter { canvas: Canvas::new(width), cell_w, y: 0, cuts: Vec::new(), layout: &layout };
    p.paint()?;
    let Painter { mut canvas, y, cuts, .. } = p;
    canvas.grow(y);
    let stride = canvas.stride;
    canvas.bits.truncate(y * stride);
    Ok(Raster { width: canvas.width, height: y, bits: canvas.bits, cuts })
}

/// How a printed image ends: what a printer that takes a picture and cuts on a separate
/// instruction (Star CloudPRNT's `X-Star-Cut` response header) is told to do after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinalCut {
    /// The document ends without a cut.
    None,
    Full,
    Partial,
}

impl FinalCut {
    /// The value of Star's `X-Star-Cut` header (Star CloudPRNT Protocol Guide, "Print job
    /// requests (GET)", "Response (GET)": `none`, `full`, `partial`).
    pub fn star_header(self) -> &'static str {
        match self {
            FinalCut::None => "none",
            FinalCut::Full => "full",
            FinalCut::Partial => "partial",
        }
    }
}

/// What a printer that prints pictures gets: the print area as an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrintImage {
    /// A 1-bit greyscale PNG of the print area only: exactly the profile's dots wide (a
    /// multiple of 8), no paper margin, no frame, no cut drawn.
    pub png: Vec<u8>,
    pub width: usize,
    pub height: usize,
    /// How the document ends. A cut inside the document cannot be told to such a printer:
    /// its feed stays as blank paper, and the slip is cut once, at its end.
    pub cut: FinalCut,
}

/// Renders `doc` as the image a printer that prints pictures prints: the print area at
/// `profile.dots`, one bit per dot, and how it ends (Star CloudPRNT's `image/png` job,
/// Star CloudPRNT Protocol Guide, "Response (GET)": the print area only, the cut as a header).
pub fn to_print_png(doc: &Document, profile: &Profile) -> Result<PrintImage, RenderError> {
    let raster = to_raster(doc, profile)?;
    let cut = match raster.cuts.last() {
        Some(&(y, partial)) if y >= raster.height => {
            if partial {
                FinalCut::Partial
            } else {
                FinalCut::Full
            }
        }
        _ => FinalCut::None,
    };
    // A PNG must have at least one row.
    let height = raster.height.max(1);
    let stride = raster.width / 8;
    let mut rows = raster.bits;
    rows.resize(height * stride, 0);
    // In 1-bit greyscale 0 is black: ink is a cleared bit.
    for b in rows.iter_mut() {
        *b = !*b;
    }
    let mut out = Vec::with_capacity(rows.len() / 8);
    {
        let err = |e: png::EncodingError| RenderError::Encode(e.to_string());
        let mut enc = png::Encoder::new(&mut out, raster.width as u32, height as u32);
        enc.set_color(png::ColorType::Grayscale);
        enc.set_depth(png::BitDepth::One);
        enc.set_compression(png::Compression::Fast);
        enc.set_filter(png::Filter::Up);
        let mut writer = enc.write_header().map_err(err)?;
        writer.write_image_data(&rows).map_err(err)?;
        writer.finish().map_err(err)?;
    }
    Ok(PrintImage { png: out, width: raster.width, height, cut })
}

/// A 1-bit drawing surface that grows downwards: rows of bytes, most significant bit
/// leftmost, 1 = ink — the layout of a printer's raster.
struct Canvas {
    width: usize,
    stride: usize,
    bits: Vec<u8>,
}

impl Canvas {
    fn new(width: usize) -> Canvas {
        Canvas { width, stride: width.div_ceil(8), bits: Vec::with_capacity(width / 8 * 1200) }
    }

    fn height(&self) -> usize {
        self.bits.len() / self.stride
    }

    fn grow(&mut self, rows: usize) {
        if rows > self.height() {
            self.bits.resize(rows * self.stride, 0);
        }
    }

    fn row_mut(&mut self, y: usize) -> &mut [u8] {
        self.grow(y + 1);
        &mut self.bits[y * self.stride..(y + 1) * self.stride]
    }

    /// ORs `bits` (MSB-first, `len` pixels) into row `y` at `x`; what falls off the right
    /// edge is dropped.
    fn or_bits(&mut self, x: usize, y: usize, bits: u64, len: usize) {
        if bits == 0 || x >= self.width {
            return;
        }
        let shift = x % 8;
        let first = x / 8;
        let stride = self.stride;
        let row = self.row_mut(y);
        // Up to 64 pixels plus the shift span at most 9 bytes.
        let wide = u128::from(bits) << 64 >> shift;
        for k in 0..(len + shift).div_ceil(8).min(9) {
            if first + k >= stride {
                break;
            }
            row[first + k] |= (wide >> (120 - 8 * k)) as u8;
        }
    }

    fn fill(&mut self, x: usize, y: usize, w: usize, h: usize) {
        for yy in y..y + h {
            let mut xx = x;
            while xx < x + w {
                let n = (x + w - xx).min(64);
                self.or_bits(xx, yy, u64::MAX << (64 - n), n);
                xx += n;
            }
        }
    }

    fn xor(&mut self, x: usize, y: usize, w: usize, h: usize) {
        let end = (x + w).min(self.width);
        for yy in y..y + h {
            let row = self.row_mut(yy);
            for xx in x..end {
                row[xx / 8] ^= 0x80 >> (xx % 8);
            }
        }
    }
}

/// Spreads each of the low 32 bits (MSB-first from bit 31) to two bits, for double width.
fn double_bits(v: u32) -> u64 {
    let mut out = 0u64;
    for i in 0..32 {
        if v & (1 << (31 - i)) != 0 {
            out |= 0b11 << (62 - 2 * i);
        }
    }
    out
}

struct Painter<'l, 'a> {
    canvas: Canvas,
    cell_w: usize,
    /// Top of the next line.
    y: usize,
    /// Where the paper is cut, and whether partially.
    cuts: Vec<(usize, bool)>,
    layout: &'l Layout<'a>,
}

impl Painter<'_, '_> {
    fn cell_h(&self) -> usize {
        self.cell_w * 2
    }

    fn dots(&self) -> usize {
        usize::from(self.layout.dots)
    }

    fn aligned(&self, align: Align, width: usize) -> usize {
        let free = self.dots().saturating_sub(width);
        match align {
            Align::Left => 0,
            Align::Center => free / 2,
            Align::Right => free,
        }
    }

    fn check_height(&self) -> Result<(), RenderError> {
        if self.y > MAX_HEIGHT {
            return Err(RenderError::invalid("blocks", format!("the preview would be taller than {MAX_HEIGHT} dots")));
        }
        Ok(())
    }

    fn paint(&mut self) -> Result<(), RenderError> {
        let layout = self.layout;
        for item in &layout.items {
            self.check_height()?;
            match item {
                Item::Line { runs, trail, trail_style, tall } => {
                    let line_h = self.cell_h() * if *tall { 2 } else { 1 };
                    let mut col = 0usize;
                    for run in &layout.runs[runs.clone()] {
                        col = self.run(run, col, line_h);
                    }
                    if *trail > 0 {
                        self.decorate(*trail_style, col, usize::from(*trail), line_h);
                    }
                    self.y += line_h + LINE_GAP;
                }
                Item::Feed(n) => self.y += usize::from(*n) * (self.cell_h() + LINE_GAP),
                Item::Qr { data, ec, size, align } => {
                    if let Some((modules, dark)) = qr::matrix(data, *ec) {
                        let s = usize::from(*size);
                        let x0 = self.aligned(*align, modules * s);
                        for (i, _) in dark.iter().enumerate().filter(|(_, &d)| d) {
                            self.canvas.fill(x0 + (i % modules) * s, self.y + (i / modules) * s, s, s);
                        }
                        self.y += modules * s;
                    }
                }
                Item::Barcode { symbol, module, height, hri, align } => {
                    self.barcode(symbol, usize::from(*module), usize::from(*height), *hri, *align)
                }
                Item::Image { bitmap: Some(bitmap), x, .. } => self.image(bitmap, usize::from(*x)),
                Item::Image { bitmap: None, .. } | Item::Invalid { .. } | Item::Drawer { .. } => {}
                Item::Logo { key, align } => self.logo(*key, *align),
                Item::Cut { partial, feed } => {
                    self.y += usize::from(*feed) * (self.cell_h() + LINE_GAP);
                    self.cuts.push((self.y, *partial));
                }
            }
        }
        self.check_height()?;
        self.canvas.grow(self.y);
        Ok(())
    }

    /// Draws a run starting at column `col` of the current line; returns the column
    /// after it.
    fn run(&mut self, run: &Run<'_>, col: usize, line_h: usize) -> usize {
        let mut col = col;
        if run.pad > 0 {
            self.decorate(run.pad_style, col, usize::from(run.pad), line_h);
            col += usize::from(run.pad);
        }
        let start = col;
        let factor = usize::from(run.style.width_factor());
        let enc = self.layout.encoding;
        for c in run.text.chars() {
            let unit = usize::from(char_width(enc, c));
            if unit == 0 {
                continue;
            }
            if c == '\t' || enc.can_encode(c) {
                let c = if c == '\t' { ' ' } else { c };
                self.glyph(c, unit == 2, col, line_h, run.style);
            } else {
                for (k, q) in replacement(c, unit as u16).chars().enumerate() {
                    self.glyph(q, false, col + k * factor, line_h, run.style);
                }
            }
            col += unit * factor;
        }
        self.decorate(run.style, start, col - start, line_h);
        col
    }

    /// Underline and invert over `cols` columns from `col`; the glyphs are drawn first
    /// so inverting turns them white.
    fn decorate(&mut self, style: Style, col: usize, cols: usize, line_h: usize) {
        let x = col * self.cell_w;
        let w = cols * self.cell_w;
        if style.underline {
            self.canvas.fill(x, self.y + line_h - 2, w, 2);
        }
        if style.invert {
            self.canvas.xor(x, self.y, w, line_h);
        }
    }

    fn glyph(&mut self, c: char, wide: bool, col: usize, line_h: usize, style: Style) {
        let g = font::glyph(c, self.cell_w as u8, wide);
        let box_w = self.cell_w * if wide { 2 } else { 1 };
        let sx = if style.double_width { 2 } else { 1 };
        let sy = if style.double_height { 2 } else { 1 };
        let x = col * self.cell_w;
        // Characters sit on the line's bottom, as a printer aligns mixed heights.
        let top = self.y + line_h - self.cell_h() * sy;
        for (r, &row) in g.rows.iter().enumerate().take(self.cell_h()) {
            if row == 0 {
                continue;
            }
            let mut bits = if sx == 2 { double_bits(row) } else { u64::from(row) << 32 };
            if style.bold {
                // Printers emphasise by striking each dot twice, one dot apart.
                bits |= bits >> 1;
            }
            for dy in 0..sy {
                self.canvas.or_bits(x, top + r * sy + dy, bits, box_w * sx + 1);
            }
        }
    }

    /// Text drawn in font A without style at `y`, for barcode digits and placeholders.
    fn label(&mut self, s: &str, align: Align, y: usize) {
        let enc = self.layout.encoding;
        let cols: usize = s.chars().map(|c| usize::from(char_width(enc, c))).sum();
        let x0 = self.aligned(align, cols * self.cell_w);
        self.label_at(s, x0, y);
    }

    fn label_at(&mut self, s: &str, x0: usize, y: usize) {
        let enc = self.layout.encoding;
        let mut x = x0;
        for c in s.chars() {
            let unit = usize::from(char_width(enc, c));
            let g = font::glyph(c, self.cell_w as u8, unit == 2);
            for (r, &row) in g.rows.iter().enumerate().take(self.cell_h()) {
                self.canvas.or_bits(x, y + r, u64::from(row) << 32, self.cell_w * unit + 1);
            }
            x += unit * self.cell_w;
        }
    }

    fn barcode(&mut self, symbol: &Symbol, module: usize, height: usize, hri: Hri, align: Align) {
        let width = symbol.modules() * module;
        let x0 = self.aligned(align, width);
        let text_h = self.cell_h() + 2;
        if matches!(hri, Hri::Above | Hri::Both) {
            self.label(&symbol.text, align, self.y);
            self.y += text_h;
        }
        let mut i = 0;
        while i < symbol.bars.len() {
            if symbol.bars[i] {
                let run = symbol.bars[i..].iter().take_while(|&&b| b).count();
                self.canvas.fill(x0 + i * module, self.y, run * module, height);
                i += run;
            } else {
                i += 1;
            }
        }
        self.y += height;
        if matches!(hri, Hri::Below | Hri::Both) {
            self.y += 2;
            self.label(&symbol.text, align, self.y);
            self.y += self.cell_h();
        }
    }

    fn image(&mut self, bitmap: &Bitmap, x: usize) {
        for row in 0..usize::from(bitmap.height) {
            let src = &bitmap.bits[row * bitmap.stride..(row + 1) * bitmap.stride];
            for (i, chunk) in src.chunks(8).enumerate() {
                let mut v = 0u64;
                for (k, &b) in chunk.iter().enumerate() {
                    v |= u64::from(b) << (56 - 8 * k);
                }
                self.canvas.or_bits(x + i * 64, self.y + row, v, chunk.len() * 8);
            }
        }
        self.y += usize::from(bitmap.height);
    }

    /// A dashed frame with `LOGO n` in it: the stored picture is only in the printer.
    fn logo(&mut self, key: u8, align: Align) {
        let w = (self.dots() / 2).clamp(64, 288);
        let x0 = self.aligned(align, w);
        let y0 = self.y;
        for x in (x0..x0 + w).step_by(8) {
            let n = (x0 + w - x).min(4);
            self.canvas.fill(x, y0, n, 2);
            self.canvas.fill(x, y0 + LOGO_HEIGHT - 2, n, 2);
        }
        for y in (y0..y0 + LOGO_HEIGHT).step_by(8) {
            let n = (y0 + LOGO_HEIGHT - y).min(4);
            self.canvas.fill(x0, y, 2, n);
            self.canvas.fill(x0 + w - 2, y, 2, n);
        }
        let text = format!("LOGO {key}");
        let x_text = x0 + (w.saturating_sub(text.len() * self.cell_w)) / 2;
        self.label_at(&text, x_text, y0 + (LOGO_HEIGHT - self.cell_h()) / 2);
        self.y += LOGO_HEIGHT;
    }
}

/// Palette indices of 4 pixels in one byte, 2 bits each, leftmost highest.
fn pack4(px: [u8; 4]) -> u8 {
    px[0] << 6 | px[1] << 4 | px[2] << 2 | px[3]
}

fn write_png(canvas: &Canvas, content_h: usize, cuts: &[(usize, bool)]) -> Result<Vec<u8>, RenderError> {
    let side = BACKGROUND + PAPER_MARGIN;
    let total_w = side * 2 + canvas.width;
    let row_bytes = total_w / 4;
    // One canvas byte (8 pixels) becomes two PNG bytes.
    let mut table = [[0u8; 2]; 256];
    for (b, entry) in table.iter_mut().enumerate() {
        let px = |i: usize| if b & (0x80 >> i) != 0 { INK } else { PAPER };
        *entry = [pack4([px(0), px(1), px(2), px(3)]), pack4([px(4), px(5), px(6), px(7)])];
    }
    let grey_row = vec![pack4([GREY; 4]); row_bytes];
    let mut paper_row = grey_row.clone();
    paper_row[BACKGROUND / 4..(total_w - BACKGROUND) / 4].fill(pack4([PAPER; 4]));
    let mut edge_row = grey_row.clone();
    edge_row[BACKGROUND / 4..(total_w - BACKGROUND) / 4].fill(pack4([EDGE; 4]));
    // A partial cut leaves a bridge of paper in the middle.
    let mut bridge_row = grey_row.clone();
    let mid = row_bytes / 2;
    bridge_row[mid - 2..mid + 2].fill(pack4([PAPER; 4]));

    let ends_with_cut = cuts.last().is_some_and(|&(y, _)| y >= content_h);
    let mut rows: Vec<u8> = Vec::with_capacity((content_h + 120) * row_bytes);
    let push = |rows: &mut Vec<u8>, row: &[u8]| rows.extend_from_slice(row);
    for _ in 0..BACKGROUND {
        push(&mut rows, &grey_row);
    }
    for _ in 0..PAPER_TOP {
        push(&mut rows, &paper_row);
    }
    let mut cut_iter = cuts.iter().peekable();
    for y in 0..content_h {
        while let Some(&&(cy, partial)) = cut_iter.peek() {
            if cy != y {
                break;
            }
            cut_iter.next();
            push(&mut rows, &edge_row);
            for _ in 0..CUT_GAP - 2 {
                push(&mut rows, if partial { &bridge_row } else { &grey_row });
            }
            push(&mut rows, &edge_row);
        }
        let start = rows.len();
        rows.extend_from_slice(&paper_row);
        let line = &mut rows[start + side / 4..start + side / 4 + canvas.width / 4];
        let src = canvas.bits.get(y * canvas.stride..(y + 1) * canvas.stride).unwrap_or_default();
        for (i, &b) in src.iter().enumerate() {
            line[2 * i..2 * i + 2].copy_from_slice(&table[usize::from(b)]);
        }
    }
    if ends_with_cut {
        push(&mut rows, &edge_row);
    } else {
        for _ in 0..PAPER_TOP {
            push(&mut rows, &paper_row);
        }
    }
    for _ in 0..BACKGROUND {
        push(&mut rows, &grey_row);
    }
    let height = rows.len() / row_bytes;
    let mut out = Vec::with_capacity(rows.len() / 8);
    {
        let err = |e: png::EncodingError| RenderError::Encode(e.to_string());
        let mut enc = png::Encoder::new(&mut out, total_w as u32, height as u32);
        enc.set_color(png::ColorType::Indexed);
        enc.set_depth(png::BitDepth::Two);
        enc.set_palette(&PALETTE[..]);
        enc.set_compression(png::Compression::Fast);
        // "Up" turns every row equal to the one above (most of a receipt: blank paper
        // between lines, the margins) into zeros.
        enc.set_filter(png::Filter::Up);
        let mut writer = enc.write_header().map_err(err)?;
        writer.write_image_data(&rows).map_err(err)?;
        writer.finish().map_err(err)?;
    }
    Ok(out)
}
