//! The layout shared by every renderer: which characters go on which line, at which
//! column, in which style.
//!
//! Widths are in columns of font A ([`char_width`]); a double-width character takes
//! twice its width. Text wraps at spaces and next to CJK characters, a word longer than
//! the line is broken, and spaces at a wrap are dropped. Alignment is done here with
//! blank columns rather than left to the printer (`ESC a`), so the three renderers
//! place every character identically and a row's columns stay put whatever the
//! alignment; only QR codes, barcodes and stored logos, whose width the printer decides,
//! use `ESC a`. Lines borrow their text from the document: laying out a receipt
//! allocates a few vectors, not a string per line.

use std::borrow::Cow;
use std::ops::Range;

use crate::barcode::{self, Symbol};
use crate::doc::{Align, Block, Column, Document, EcLevel, Hri, Row, Style, Text};
use crate::error::{RenderError, WarningKind, Warnings};
use crate::image::{self, Bitmap};
use crate::profile::{Encoding, Profile};
use crate::qr;
use crate::width::{ascii_width, char_width, str_width};

/// Which renderer the layout is for: text does not need images decoded, nor barcodes
/// and QR codes that fit the paper.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    EscPos,
    Png,
    Text,
}

/// Where a piece of text came from, for warnings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Part {
    Span(u16),
    Column(u16),
    Rule,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Origin {
    pub block: u32,
    pub part: Part,
}

impl Origin {
    pub fn path(self) -> String {
        let b = self.block;
        match self.part {
            Part::Span(i) => format!("blocks[{b}].spans[{i}].text"),
            Part::Column(j) => format!("blocks[{b}].columns[{j}].text"),
            Part::Rule => format!("blocks[{b}].char"),
        }
    }
}

/// Text in one style, after `pad` blank columns.
#[derive(Debug, Clone)]
pub(crate) struct Run<'a> {
    /// Blank columns before the text (always printed single width).
    pub pad: u16,
    /// The style of those blanks: a row's underline and invert run through its gaps.
    pub pad_style: Style,
    pub text: Cow<'a, str>,
    pub style: Style,
    pub origin: Origin,
}

/// One thing printed, in order.
#[derive(Debug, Clone)]
pub(crate) enum Item<'a> {
    /// A line of text: `runs` index [`Layout::runs`]; `trail` blank columns in
    /// `trail_style` follow (a row's invert or underline reaching the right edge).
    Line {
        runs: Range<usize>,
        trail: u16,
        trail_style: Style,
        tall: bool,
    },
    Feed(u8),
    Qr {
        data: &'a str,
        ec: EcLevel,
        size: u8,
        align: Align,
    },
    Barcode {
        symbol: Symbol,
        module: u8,
        height: u8,
        hri: Hri,
        align: Align,
    },
    /// `bitmap` is `None` for the text renderer, which does not decode images.
    Image {
        bitmap: Option<Bitmap>,
        x: u16,
        block: u32,
    },
    Logo {
        key: u8,
        align: Align,
    },
    Cut {
        partial: bool,
        feed: u8,
    },
    Drawer {
        pin: u8,
        on: u8,
        off: u8,
    },
    /// A block the text renderer could not lay out (an invalid barcode in a document
    /// built by hand); the other renderers return an error instead.
    Invalid {
        message: String,
    },
}

pub(crate) struct Layout<'a> {
    pub items: Vec<Item<'a>>,
    pub runs: Vec<Run<'a>>,
    pub warnings: Warnings,
    pub columns: u16,
    pub dots: u16,
    pub encoding: Encoding,
}

/// A piece of a wrapped line: text from one span.
#[derive(Debug, Clone, Copy)]
struct Piece<'a> {
    text: &'a str,
    style: Style,
    width: u16,
    part: Part,
}

/// A segment of a paragraph: the part of one span between line breaks.
#[derive(Debug, Clone, Copy)]
struct Seg<'a> {
    text: &'a str,
    style: Style,
    part: Part,
}

/// A position in a paragraph: segment and byte offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Pos {
    seg: usize,
    byte: usize,
}

/// A place a line may end (`end`) and where the next one then starts (`resume`, with
/// the line's width up to it).
#[derive(Debug, Clone, Copy)]
struct Break {
    end: Pos,
    resume: Pos,
    resume_width: u16,
}

struct Builder<'a> {
    out: Layout<'a>,
    target: Target,
    /// Wrapped lines of the block being laid out: ranges of `pieces` and their widths.
    pieces: Vec<Piece<'a>>,
    lines: Vec<(Range<usize>, u16)>,
    segs: Vec<Seg<'a>>,
}

/// Lays `doc` out for `profile`. Errors only for what cannot be printed at all (an
/// undecodable image, a barcode wider than the paper), never for the text renderer.
pub(crate) fn layout<'a>(doc: &'a Document, profile: &Profile, target: Target) -> Result<Layout<'a>, RenderError> {
    let mut b = Builder {
        out: Layout {
            items: Vec::with_capacity(doc.blocks.len() + 8),
            runs: Vec::with_capacity(doc.blocks.len() * 2),
            warnings: Warnings::default(),
            // A profile built by hand may say anything; a line of at least one column
            // and a few dots keeps every computation below meaningful.
            columns: profile.columns.clamp(1, 1024),
            dots: profile.dots.clamp(8, 4096),
            encoding: profile.encoding,
        },
        target,
        pieces: Vec::new(),
        lines: Vec::new(),
        segs: Vec::new(),
    };
    for (i, block) in doc.blocks.iter().enumerate() {
        let index = u32::try_from(i).unwrap_or(u32::MAX);
        b.block(index, block)?;
    }
    Ok(b.out)
}

fn align_offset(align: Align, free: u16) -> u16 {
    match align {
        Align::Left => 0,
        Align::Center => free / 2,
        Align::Right => free,
    }
}

/// Blanks are printed single width: only the styles that show on a blank carry over.
fn blank_style(style: Style) -> Style {
    Style { double_width: false, double_height: false, bold: false, ..style }
}

/// Characters a line must not start with (closing brackets and CJK punctuation):
/// CJK text does not break before them.
#[rustfmt::skip]
fn no_break_before(c: char) -> bool {
    matches!(c,
        '、' | '。' | '，' | '．' | '：' | '；' | '？' | '！' | '）' | '〕' | '］' | '｝' | '〉' | '》'
        | '」' | '』' | '】' | '〙' | '〗' | '〟' | '’' | '”' | '｠' | '»' | 'ー' | '・' | '…' | '‥'
        | '％' | 'ゝ' | 'ゞ' | 'ぁ' | 'ぃ' | 'ぅ' | 'ぇ' | 'ぉ' | 'っ' | 'ゃ' | 'ゅ' | 'ょ' | 'ゎ' | 'ァ'
        | 'ィ' | 'ゥ' | 'ェ' | 'ォ' | 'ッ' | 'ャ' | 'ュ' | 'ョ' | 'ヮ' | 'ヵ' | 'ヶ'
        | ',' | '.' | ':' | ';' | '!' | '?' | ')' | ']' | '}' | '%')
}

/// Characters a line must not end with (opening brackets): no break after them.
#[rustfmt::skip]
fn no_break_after(c: char) -> bool {
    matches!(c,
        '（' | '〔' | '［' | '｛' | '〈' | '《' | '「' | '『' | '【' | '〘' | '〖' | '〝' | '‘' | '“'
        | '｟' | '«' | '(' | '[' | '{')
}

impl<'a> Builder<'a> {
    fn block(&mut self, index: u32, block: &'a Block) -> Result<(), RenderError> {
        let invalid = |field: &str, message: String| RenderError::invalid(format!("blocks[{index}].{field}"), message);
        let dots = self.out.dots;
        match block {
            Block::Text(t) => self.text(index, t),
            Block::Row(r) => self.row(index, r),
            Block::Rule(r) => {
                let (ch, w) = match char_width(self.out.encoding, r.char) {
                    0 => ('-', 1),
                    w => (r.char, w),
                };
                let count = self.out.columns / w;
                let start = self.out.runs.len();
                if count > 0 {
                    self.out.runs.push(Run {
                        pad: 0,
                        pad_style: Style::default(),
                        text: Cow::Owned(ch.to_string().repeat(usize::from(count))),
                        style: Style::default(),
                        origin: Origin { block: index, part: Part::Rule },
                    });
                }
                let runs = start..self.out.runs.len();
                self.out.items.push(Item::Line { runs, trail: 0, trail_style: Style::default(), tall: false });
            }
            Block::Feed(f) => self.out.items.push(Item::Feed(f.lines)),
            Block::Qr(q) => {
                let mut size = q.size.clamp(1, 16);
                if self.target != Target::Text {
                    qr::check(&q.data, q.ec).map_err(|m| invalid("data", m))?;
                    let modules = qr::modules(q.data.len(), q.ec).unwrap_or(177);
                    while size > 1 && modules * usize::from(size) > usize::from(dots) {
                        size -= 1;
                    }
                    if modules * usize::from(size) > usize::from(dots) {
                        return Err(invalid(
                            "data",
                            format!("the QR code is {modules} modules wide; the paper has {dots} dots"),
                        ));
                    }
                    if size != q.size {
                        self.warn(
                            format!("blocks[{index}].size"),
                            WarningKind::QrShrunk { requested: q.size, used: size },
                        );
                    }
                }
                self.out.items.push(Item::Qr { data: &q.data, ec: q.ec, size, align: q.align });
            }
            Block::Barcode(bc) => {
                let symbol = match barcode::encode(bc.kind, &bc.data) {
                    Ok(s) => s,
                    Err(m) if self.target == Target::Text => {
                        self.out.items.push(Item::Invalid { message: m });
                        return Ok(());
                    }
                    Err(m) => return Err(invalid("data", m)),
                };
                let mut module = bc.module.clamp(2, 6);
                if self.target != Target::Text {
                    while module > 2 && symbol.modules() * usize::from(module) > usize::from(dots) {
                        module -= 1;
                    }
                    let width = symbol.modules() * usize::from(module);
                    if width > usize::from(dots) {
                        return Err(invalid(
                            "data",
                            format!("the barcode is {width} dots wide at the narrowest bars; the paper has {dots}"),
                        ));
                    }
                    if module != bc.module {
                        let kind = WarningKind::BarcodeShrunk { requested: bc.module, used: module };
                        self.warn(format!("blocks[{index}].module"), kind);
                    }
                }
                let height = bc.height.max(1);
                self.out.items.push(Item::Barcode { symbol, module, height, hri: bc.hri, align: bc.align });
            }
            Block::Image(img) => {
                let bitmap = match self.target {
                    Target::Text => None,
                    _ => Some(image::to_bitmap(&img.png, img.width, dots, img.dither).map_err(|m| invalid("png", m))?),
                };
                let width = bitmap.as_ref().map_or(0, |b| b.width);
                let x = align_offset(img.align, dots.saturating_sub(width));
                self.out.items.push(Item::Image { bitmap, x, block: index });
            }
            Block::Logo(l) => self.out.items.push(Item::Logo { key: l.key.max(1), align: l.align }),
            Block::Cut(c) => self.out.items.push(Item::Cut { partial: c.partial, feed: c.feed }),
            Block::Drawer(d) => {
                // ESC p counts in 2 ms steps, 1–255.
                let steps = |ms: u16| u8::try_from((ms / 2).clamp(1, 255)).unwrap_or(255);
                let pin = if d.pin == 5 { 5 } else { 2 };
                self.out.items.push(Item::Drawer { pin, on: steps(d.on_ms), off: steps(d.off_ms) });
            }
        }
        Ok(())
    }

    fn warn(&mut self, path: String, kind: WarningKind) {
        self.out.warnings.push(path, kind);
    }

    fn text(&mut self, index: u32, t: &'a Text) {
        let columns = self.out.columns;
        self.segs.clear();
        self.pieces.clear();
        self.lines.clear();
        // Split the spans into paragraphs at line breaks and wrap each.
        for (i, span) in t.spans.iter().enumerate() {
            let part = Part::Span(u16::try_from(i).unwrap_or(u16::MAX));
            let mut parts = span.text.split('\n');
            if let Some(first) = parts.next() {
                self.segs.push(Seg { text: first, style: span.style, part });
            }
            for rest in parts {
                self.wrap_segs(index, columns);
                self.segs.clear();
                self.segs.push(Seg { text: rest, style: span.style, part });
            }
        }
        self.wrap_segs(index, columns);
        for li in 0..self.lines.len() {
            let (range, width) = self.lines[li].clone();
            let offset = align_offset(t.align, columns.saturating_sub(width));
            let start = self.out.runs.len();
            let mut tall = false;
            for (k, p) in self.pieces[range].iter().enumerate() {
                tall |= p.style.double_height;
                self.out.runs.push(Run {
                    pad: if k == 0 { offset } else { 0 },
                    pad_style: Style::default(),
                    text: Cow::Borrowed(p.text),
                    style: p.style,
                    origin: Origin { block: index, part: p.part },
                });
            }
            let runs = start..self.out.runs.len();
            self.out.items.push(Item::Line { runs, trail: 0, trail_style: Style::default(), tall });
        }
    }

    fn row(&mut self, index: u32, row: &'a Row) {
        let total = self.out.columns;
        let factor = row.style.width_factor();
        let (widths, gap) = column_widths(&row.columns, u16::from(row.gap), total, factor);
        self.pieces.clear();
        self.lines.clear();
        // Lines of each column: a range of `self.lines`.
        let mut col_lines: Vec<Range<usize>> = Vec::with_capacity(row.columns.len());
        for (j, (col, &w)) in row.columns.iter().zip(&widths).enumerate() {
            let start = self.lines.len();
            if w > 0 {
                let part = Part::Column(u16::try_from(j).unwrap_or(u16::MAX));
                // A line break in a cell starts a new line inside the column.
                for paragraph in col.text.split('\n') {
                    self.segs.clear();
                    self.segs.push(Seg { text: paragraph, style: row.style, part });
                    self.wrap_segs(index, w);
                }
            }
            col_lines.push(start..self.lines.len());
        }
        let height = col_lines.iter().map(|r| r.len()).max().unwrap_or(0).max(1);
        let pad_style = blank_style(row.style);
        for i in 0..height {
            let start = self.out.runs.len();
            let mut cursor = 0u16;
            let mut col_start = 0u16;
            for (j, lines) in col_lines.iter().enumerate() {
                let w = widths[j];
                if let Some((range, line_width)) = lines.clone().nth(i).and_then(|li| self.lines.get(li)).cloned() {
                    let align = row.columns[j].align;
                    let mut pad =
                        (col_start + align_offset(align, w.saturating_sub(line_width))).saturating_sub(cursor);
                    for p in &self.pieces[range] {
                        self.out.runs.push(Run {
                            pad,
                            pad_style,
                            text: Cow::Borrowed(p.text),
                            style: p.style,
                            origin: Origin { block: index, part: p.part },
                        });
                        cursor += pad + p.width;
                        pad = 0;
                    }
                }
                col_start += w + gap;
            }
            let trail = if row.style.invert || row.style.underline { total.saturating_sub(cursor) } else { 0 };
            let runs = start..self.out.runs.len();
            self.out.items.push(Item::Line { runs, trail, trail_style: pad_style, tall: row.style.double_height });
        }
    }

    /// Wraps `self.segs` (one paragraph) at `max` columns into `self.lines`.
    fn wrap_segs(&mut self, index: u32, max: u16) {
        let enc = self.out.encoding;
        // The common case: one segment of plain ASCII that fits.
        if let [seg] = self.segs[..] {
            if let Some(w) = ascii_width(seg.text) {
                let w = w.saturating_mul(seg.style.width_factor());
                if w <= max {
                    let start = self.pieces.len();
                    if !seg.text.is_empty() {
                        self.pieces.push(Piece { text: seg.text, style: seg.style, width: w, part: seg.part });
                    }
                    self.lines.push((start..self.pieces.len(), w));
                    return;
                }
            }
        }
        let first_line = self.lines.len();
        let mut st = LineState::new(Some(Pos { seg: 0, byte: 0 }));
        for si in 0..self.segs.len() {
            let seg = self.segs[si];
            let factor = seg.style.width_factor();
            for (bi, c) in seg.text.char_indices() {
                let unit = char_width(enc, c);
                if unit == 0 {
                    continue;
                }
                let pos = Pos { seg: si, byte: bi };
                if st.line_start.is_none() {
                    // After a wrap, spaces at the start of the next line are dropped.
                    if is_space(c) {
                        continue;
                    }
                    st.line_start = Some(pos);
                }
                self.place(&mut st, pos, c, unit, unit * factor, max, index);
            }
        }
        let end = self.end_pos();
        match st.line_start {
            Some(start) => self.emit(start, end),
            // A paragraph of nothing (or only of dropped spaces) is an empty line.
            None if self.lines.len() == first_line => self.emit(end, end),
            None => {}
        }
    }

    fn end_pos(&self) -> Pos {
        match self.segs.last() {
            Some(seg) => Pos { seg: self.segs.len() - 1, byte: seg.text.len() },
            None => Pos { seg: 0, byte: 0 },
        }
    }

    /// Places character `c` (`unit` columns, `w` with double width) at `pos`, ending the
    /// line first when it does not fit: at the last break opportunity if there is one,
    /// else right before `c`.
    #[allow(clippy::too_many_arguments)]
    fn place(&mut self, st: &mut LineState, pos: Pos, c: char, unit: u16, w: u16, max: u16, index: u32) {
        let space = is_space(c);
        let wide = unit >= 2;
        if space {
            if st.space_start.is_none() {
                st.space_start = Some(pos);
            }
        } else if let Some(sp) = st.space_start.take() {
            if st.has_content {
                st.brk = Some(Break { end: sp, resume: pos, resume_width: st.width });
            }
        } else if (wide || st.prev_wide) && st.has_content && !no_break_before(c) && !no_break_after(st.prev) {
            // CJK text breaks between any two characters, except before closing and
            // after opening punctuation.
            st.brk = Some(Break { end: pos, resume: pos, resume_width: st.width });
        }
        if st.width.saturating_add(w) > max {
            let mut start = st.line_start.unwrap_or(pos);
            if space {
                // The line ends where this run of spaces started; the spaces are dropped.
                if st.has_content {
                    self.emit(start, st.space_start.unwrap_or(pos));
                }
                *st = LineState::new(None);
                return;
            }
            if let Some(b) = st.brk.take() {
                if b.resume > start {
                    self.emit(start, b.end);
                    start = b.resume;
                    st.line_start = Some(start);
                    st.width -= b.resume_width.min(st.width);
                    st.has_content = b.resume < pos;
                }
            }
            if st.width.saturating_add(w) > max {
                if st.width > 0 {
                    self.emit(start, pos);
                    st.line_start = Some(pos);
                    st.width = 0;
                    st.has_content = false;
                    st.brk = None;
                    st.space_start = None;
                }
                if w > max {
                    // Wider than the whole line (a CJK character in a one-column cell):
                    // it cannot be printed here at all.
                    let path = self.origin_path(index, pos);
                    self.warn(path, WarningKind::TooWide { ch: c });
                    st.line_start = Some(Pos { seg: pos.seg, byte: pos.byte + c.len_utf8() });
                    st.prev_wide = false;
                    return;
                }
            }
        }
        st.width += w;
        st.has_content |= !space;
        st.prev_wide = wide && !space;
        st.prev = c;
    }

    fn origin_path(&self, index: u32, pos: Pos) -> String {
        let part = self.segs.get(pos.seg).map_or(Part::Rule, |s| s.part);
        Origin { block: index, part }.path()
    }

    /// Adds the line from `start` to `end` to `self.lines`.
    fn emit(&mut self, start: Pos, end: Pos) {
        let enc = self.out.encoding;
        let first = self.pieces.len();
        if start < end {
            for si in start.seg..=end.seg.min(self.segs.len().saturating_sub(1)) {
                let seg = self.segs[si];
                let a = if si == start.seg { start.byte } else { 0 };
                let b = if si == end.seg { end.byte } else { seg.text.len() };
                let Some(text) = seg.text.get(a..b) else { continue };
                if text.is_empty() {
                    continue;
                }
                let w = str_width(enc, text).saturating_mul(seg.style.width_factor());
                self.pieces.push(Piece { text, style: seg.style, width: w, part: seg.part });
            }
        }
        let sum = self.pieces[first..].iter().fold(0u16, |a, p| a.saturating_add(p.width));
        self.lines.push((first..self.pieces.len(), sum));
    }
}

fn is_space(c: char) -> bool {
    c == ' ' || c == '\t'
}

/// The state of the line being filled.
struct LineState {
    /// Where the line starts; `None` while spaces after a wrap are being skipped.
    line_start: Option<Pos>,
    width: u16,
    /// Whether the line has anything but spaces (a break before that would leave an
    /// empty line).
    has_content: bool,
    brk: Option<Break>,
    /// Start of the run of spaces just read.
    space_start: Option<Pos>,
    prev_wide: bool,
    /// The character placed last.
    prev: char,
}

impl LineState {
    fn new(line_start: Option<Pos>) -> LineState {
        LineState {
            line_start,
            width: 0,
            has_content: false,
            brk: None,
            space_start: None,
            prev_wide: false,
            prev: ' ',
        }
    }
}

/// Widths of a row's columns and the gap between them, fitted into `total` columns.
///
/// Fixed widths are kept when they fit; otherwise they are scaled down in proportion
/// (a document laid out for 80 mm printed on 58 mm), then the gaps are dropped, and as a
/// last resort columns at the right get no room. Flexible columns share what is left,
/// at least `min` (one character) each when possible. The sum of widths and gaps never
/// exceeds `total`.
pub(crate) fn column_widths(cols: &[Column], gap: u16, total: u16, min: u16) -> (Vec<u16>, u16) {
    let n = cols.len() as u16;
    if n == 0 {
        return (Vec::new(), gap);
    }
    let flex = cols.iter().filter(|c| c.width.is_none()).count() as u16;
    for gap in [gap, 0] {
        let gaps = gap.saturating_mul(n - 1);
        let Some(room) = total.checked_sub(gaps) else { continue };
        let fixed_room = room.saturating_sub(flex.saturating_mul(min));
        let fixed: Vec<u16> = cols.iter().filter_map(|c| c.width).collect();
        let fixed_sum: u32 = fixed.iter().map(|&w| u32::from(w)).sum();
        let scaled: Vec<u16> = if fixed_sum <= u32::from(fixed_room) {
            fixed
        } else {
            if (fixed.len() as u32) * u32::from(min) > u32::from(fixed_room) {
                continue;
            }
            let mut s: Vec<u16> = fixed
                .iter()
                .map(|&w| ((u32::from(w) * u32::from(fixed_room) / fixed_sum.max(1)) as u16).max(min))
                .collect();
            // Rounding up to `min` may overshoot: take from the widest until it fits;
            // rounding down leaves columns over: give them out from the left.
            while s.iter().map(|&w| u32::from(w)).sum::<u32>() > u32::from(fixed_room) {
                let Some(widest) = s.iter_mut().max() else { break };
                if *widest <= min {
                    break;
                }
                *widest -= 1;
            }
            let mut spare = u32::from(fixed_room).saturating_sub(s.iter().map(|&w| u32::from(w)).sum());
            for w in s.iter_mut() {
                if spare == 0 {
                    break;
                }
                *w += 1;
                spare -= 1;
            }
            s
        };
        let used: u16 = scaled.iter().sum();
        let left = room.saturating_sub(used);
        let mut fixed_iter = scaled.into_iter();
        let mut k = 0u16;
        let widths = cols
            .iter()
            .map(|c| match c.width {
                Some(_) => fixed_iter.next().unwrap_or(0),
                None => {
                    let share = left / flex.max(1) + u16::from(k < left % flex.max(1));
                    k += 1;
                    share
                }
            })
            .collect();
        return (widths, gap);
    }
    // Not even one character per column: give columns from the left what there is.
    let mut left = total;
    let widths = cols
        .iter()
        .map(|_| {
            let w = left.min(min);
            left -= w;
            w
        })
        .collect();
    (widths, 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doc::{Paper, Span};

    fn lines(doc: &Document, profile: &Profile) -> Vec<String> {
        let l = layout(doc, profile, Target::Text).unwrap();
        l.items
            .iter()
            .filter_map(|item| match item {
                Item::Line { runs, .. } => Some(
                    l.runs[runs.clone()]
                        .iter()
                        .map(|r| format!("{}{}", " ".repeat(usize::from(r.pad)), r.text))
                        .collect::<String>(),
                ),
                _ => None,
            })
            .collect()
    }

    fn text(s: &str, align: Align) -> Block {
        Block::Text(Text { spans: vec![Span { text: s.into(), style: Style::default() }], align })
    }

    fn narrow() -> Profile {
        Profile::new(Paper::Custom { columns: 10, dots: 120 }, Encoding::Gb18030)
    }

    #[test]
    fn words_wrap_at_spaces_and_long_words_break() {
        let doc = Document {
            paper: None,
            blocks: vec![text("the quick brown fox jumps", Align::Left), text("abcdefghijklmnop", Align::Left)],
        };
        assert_eq!(lines(&doc, &narrow()), ["the quick", "brown fox", "jumps", "abcdefghij", "klmnop"]);
    }

    #[test]
    fn cjk_wraps_between_characters_and_aligns() {
        let doc = Document {
            paper: None,
            blocks: vec![
                text("宫保鸡丁盖饭加辣", Align::Left),
                text("宫保 x2", Align::Right),
                text("ab", Align::Center),
            ],
        };
        assert_eq!(lines(&doc, &narrow()), ["宫保鸡丁盖", "饭加辣", "   宫保 x2", "    ab"]);
    }

    #[test]
    fn explicit_breaks_and_empty_lines() {
        let doc = Document { paper: None, blocks: vec![text("a\n\nb", Align::Left), text("", Align::Left)] };
        assert_eq!(lines(&doc, &narrow()), ["a", "", "b", ""]);
    }

    #[test]
    fn row_cells_wrap_in_their_columns() {
        let row = Row {
            columns: vec![
                Column { text: "Kung pao chicken".into(), width: None, align: Align::Left },
                Column { text: "x2".into(), width: Some(2), align: Align::Right },
                Column { text: "9.50".into(), width: Some(5), align: Align::Right },
            ],
            gap: 1,
            style: Style::default(),
        };
        let doc = Document { paper: None, blocks: vec![Block::Row(row)] };
        let p = Profile::new(Paper::Custom { columns: 20, dots: 240 }, Encoding::Cp858);
        assert_eq!(lines(&doc, &p), ["Kung pao    x2  9.50", "chicken"]);
    }

    #[test]
    fn column_widths_always_fit() {
        let col = |w: Option<u16>| Column { text: String::new(), width: w, align: Align::Left };
        let cols = vec![col(None), col(Some(8)), col(Some(10))];
        assert_eq!(column_widths(&cols, 1, 48, 1), (vec![28, 8, 10], 1));
        let (w, g) = column_widths(&cols, 1, 32, 1);
        assert!(w.iter().sum::<u16>() + g * 2 <= 32, "{w:?}");
        assert_eq!(column_widths(&[col(Some(40)), col(Some(40))], 1, 32, 1).0.iter().sum::<u16>(), 31);
        let (w, g) = column_widths(&[col(None), col(None), col(None)], 2, 3, 2);
        assert!(w.iter().sum::<u16>() + g * 2 <= 3, "{w:?} {g}");
    }
}
