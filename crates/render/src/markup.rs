//! The tag markup of Chinese printer clouds (`<CB>`, `<B>`, `<C>`, `<BR>`, `<QR>` …),
//! read into a [`Document`] so merchants can move their templates over unchanged.
//! `MARKUP.md` documents every tag and where onceprint differs from the clouds.
//!
//! The reader is lenient where the clouds are (unknown tags and stray `<` are text,
//! an unmatched closing tag is ignored, an unclosed one ends with the input) and strict
//! where a silent guess would print the wrong thing (a QR code or barcode that cannot be
//! printed, an image that is not a PNG): those are errors with a line and column.

use base64::Engine as _;

use crate::doc::{
    self, Align, Barcode, BarcodeKind, Block, Cut, Document, Drawer, EcLevel, Hri, Image, Logo, Qr, Span, Style, Text,
};
use crate::error::RenderError;
use crate::{barcode, image, qr};

/// Longest markup accepted; the clouds stop around 12 KB.
pub const MAX_MARKUP_BYTES: usize = 64 * 1024;

/// Style tags, which wrap text and nest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Container {
    /// `<C>`: centred.
    Center,
    /// `<RIGHT>`: right-aligned.
    Right,
    /// `<CB>`: centred, double width and height, bold.
    CenterBig,
    /// `<B>`: double width and height.
    Big,
    /// `<L>`: double height.
    Tall,
    /// `<W>`: double width.
    Wide,
    /// `<BOLD>`: bold.
    Bold,
}

/// Tags whose content is data, read up to their closing tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DataTag {
    Qr,
    Code128A,
    Code128C,
    Ean13,
    Img,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tag {
    Open(Container),
    Close(Container),
    Data(DataTag),
    Br,
    Cut,
    Logo,
    Plugin,
}

fn tag_named(name: &str, closing: bool) -> Option<Tag> {
    let upper = name.to_ascii_uppercase();
    let container = match upper.as_str() {
        "C" => Some(Container::Center),
        "RIGHT" => Some(Container::Right),
        "CB" => Some(Container::CenterBig),
        "B" => Some(Container::Big),
        "L" => Some(Container::Tall),
        "W" => Some(Container::Wide),
        "BOLD" => Some(Container::Bold),
        _ => None,
    };
    if let Some(c) = container {
        return Some(if closing { Tag::Close(c) } else { Tag::Open(c) });
    }
    if closing {
        return None;
    }
    Some(match upper.as_str() {
        "BR" | "BR/" => Tag::Br,
        "CUT" => Tag::Cut,
        "LOGO" => Tag::Logo,
        "PLUGIN" => Tag::Plugin,
        "QR" => Tag::Data(DataTag::Qr),
        "BC128_A" => Tag::Data(DataTag::Code128A),
        "BC128_C" => Tag::Data(DataTag::Code128C),
        "EAN13" => Tag::Data(DataTag::Ean13),
        "IMG" => Tag::Data(DataTag::Img),
        _ => return None,
    })
}

fn data_tag_name(t: DataTag) -> &'static str {
    match t {
        DataTag::Qr => "QR",
        DataTag::Code128A => "BC128_A",
        DataTag::Code128C => "BC128_C",
        DataTag::Ean13 => "EAN13",
        DataTag::Img => "IMG",
    }
}

/// The tag starting at `s[0] == '<'`, and its length in bytes, if it is one we know.
fn read_tag(s: &str) -> Option<(Tag, usize)> {
    let end = s.get(1..)?.find('>')? + 1;
    let inner = s.get(1..end)?;
    // Tag names are short; anything longer is text that happens to contain `<` and `>`.
    if inner.len() > 8 || inner.is_empty() {
        return None;
    }
    let (closing, name) = match inner.strip_prefix('/') {
        Some(name) => (true, name),
        None => (false, inner),
    };
    Some((tag_named(name.trim_end(), closing)?, end + 1))
}

/// Reads markup into a document; see `MARKUP.md` for the tags.
pub fn parse_markup(s: &str) -> Result<Document, RenderError> {
    if s.len() > MAX_MARKUP_BYTES {
        return Err(RenderError::Markup {
            line: 1,
            column: 1,
            message: format!("longer than {MAX_MARKUP_BYTES} bytes"),
        });
    }
    let mut r = Reader {
        src: s,
        blocks: Vec::new(),
        positions: Vec::new(),
        stack: Vec::new(),
        line: Line::default(),
        after_block: false,
    };
    r.run()?;
    let doc = Document { paper: None, blocks: r.blocks };
    if doc.blocks.len() > doc::MAX_BLOCKS {
        return Err(too_many_blocks());
    }
    // The same checks as a JSON document's; the tags were checked as they were read, so
    // this is a safety net whose error points at the block's tag.
    doc::validate(&doc).map_err(|e| {
        let block = e.path().and_then(block_index).unwrap_or(0);
        let (line, column) = r.positions.get(block).copied().unwrap_or((1, 1));
        RenderError::Markup { line, column, message: e.to_string() }
    })?;
    Ok(doc)
}

fn too_many_blocks() -> RenderError {
    RenderError::Markup { line: 1, column: 1, message: format!("more than {} lines and codes", doc::MAX_BLOCKS) }
}

/// `N` of a path `blocks[N]…`.
fn block_index(path: &str) -> Option<usize> {
    path.strip_prefix("blocks[")?.split(']').next()?.parse().ok()
}

/// The line being collected: spans and the alignment it started with.
#[derive(Default)]
struct Line {
    spans: Vec<Span>,
    align: Option<Align>,
    start: Option<(usize, usize)>,
}

struct Reader<'s> {
    src: &'s str,
    blocks: Vec<Block>,
    /// Line and column of the source of each block.
    positions: Vec<(usize, usize)>,
    stack: Vec<Container>,
    line: Line,
    /// Whether the last thing read was a code, logo or cut: a `<BR>` right after one
    /// ends it rather than adding an empty line (templates write `<QR>…</QR><BR>`).
    after_block: bool,
}

/// 1-based line and column (in characters) of byte `offset` of `src`.
fn position(src: &str, offset: usize) -> (usize, usize) {
    let before = src.get(..offset).unwrap_or(src);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

impl Reader<'_> {
    fn error(&self, offset: usize, message: impl Into<String>) -> RenderError {
        let (line, column) = position(self.src, offset);
        RenderError::Markup { line, column, message: message.into() }
    }

    fn style(&self) -> (Style, Align) {
        let mut style = Style::default();
        let mut align = Align::Left;
        for c in &self.stack {
            match c {
                Container::Center => align = Align::Center,
                Container::Right => align = Align::Right,
                Container::CenterBig => {
                    align = Align::Center;
                    style.bold = true;
                    style.double_width = true;
                    style.double_height = true;
                }
                Container::Big => {
                    style.double_width = true;
                    style.double_height = true;
                }
                Container::Tall => style.double_height = true,
                Container::Wide => style.double_width = true,
                Container::Bold => style.bold = true,
            }
        }
        (style, align)
    }

    fn push_text(&mut self, text: &str, offset: usize) {
        if text.is_empty() {
            return;
        }
        let (style, align) = self.style();
        if self.line.align.is_none() {
            self.line.align = Some(align);
            self.line.start = Some(position(self.src, offset));
        }
        match self.line.spans.last_mut() {
            Some(last) if last.style == style => last.text.push_str(text),
            _ => self.line.spans.push(Span { text: text.to_string(), style }),
        }
        self.after_block = false;
    }

    /// Ends the current line; an empty one is printed as an empty line only when asked.
    fn end_line(&mut self, offset: usize, keep_empty: bool) {
        let line = std::mem::take(&mut self.line);
        if line.spans.is_empty() && !keep_empty {
            return;
        }
        let (style, align) = self.style();
        let spans = if line.spans.is_empty() { vec![Span { text: String::new(), style }] } else { line.spans };
        self.blocks.push(Block::Text(Text { spans, align: line.align.unwrap_or(align) }));
        self.positions.push(line.start.unwrap_or_else(|| position(self.src, offset)));
    }

    fn push_block(&mut self, block: Block, offset: usize) {
        self.end_line(offset, false);
        self.blocks.push(block);
        self.positions.push(position(self.src, offset));
        self.after_block = true;
    }

    fn run(&mut self) -> Result<(), RenderError> {
        let src = self.src;
        let mut i = 0;
        let mut text_start = 0;
        while i < src.len() {
            // Past the limit the document is refused anyway; stopping here keeps the work
            // linear, since each block's position costs a scan of the source before it.
            if self.blocks.len() > doc::MAX_BLOCKS {
                return Err(too_many_blocks());
            }
            let rest = &src[i..];
            let b = rest.as_bytes()[0];
            if b == b'\n' {
                self.push_text(&src[text_start..i], text_start);
                self.line_break(i);
                i += 1;
                text_start = i;
                continue;
            }
            if b == b'\r' {
                self.push_text(&src[text_start..i], text_start);
                i += 1;
                text_start = i;
                continue;
            }
            if b != b'<' {
                // Advance by whole characters so slices stay on boundaries.
                i += rest.chars().next().map_or(1, char::len_utf8);
                continue;
            }
            let Some((tag, len)) = read_tag(rest) else {
                i += 1;
                continue;
            };
            self.push_text(&src[text_start..i], text_start);
            let tag_at = i;
            i += len;
            match tag {
                Tag::Open(c) => self.stack.push(c),
                Tag::Close(c) => {
                    if let Some(k) = self.stack.iter().rposition(|&open| open == c) {
                        self.stack.remove(k);
                    }
                }
                Tag::Br => self.line_break(tag_at),
                Tag::Cut => self.push_block(Block::Cut(Cut { partial: true, feed: 3 }), tag_at),
                Tag::Logo => {
                    let (_, align) = self.style();
                    let align = if align == Align::Left { Align::Center } else { align };
                    self.push_block(Block::Logo(Logo { key: 1, align }), tag_at);
                }
                Tag::Plugin => self.push_block(Block::Drawer(Drawer { pin: 2, on_ms: 50, off_ms: 500 }), tag_at),
                Tag::Data(d) => {
                    let close = format!("</{}>", data_tag_name(d));
                    let body_start = i;
                    let Some(end) = find_ignore_case(&src[i..], &close) else {
                        return Err(self.error(tag_at, format!("<{}> is not closed with {close}", data_tag_name(d))));
                    };
                    let body = src[body_start..body_start + end].trim();
                    i = body_start + end + close.len();
                    let block = self.data_block(d, body, tag_at)?;
                    self.push_block(block, tag_at);
                }
            }
            text_start = i;
        }
        self.push_text(&src[text_start..], text_start);
        self.end_line(src.len(), false);
        if !matches!(self.blocks.last(), Some(Block::Cut(_))) {
            self.blocks.push(Block::Cut(Cut { partial: true, feed: 3 }));
            self.positions.push(position(src, src.len()));
        }
        Ok(())
    }

    fn line_break(&mut self, offset: usize) {
        if self.after_block && self.line.spans.is_empty() {
            self.after_block = false;
            return;
        }
        self.end_line(offset, true);
    }

    fn data_block(&self, tag: DataTag, body: &str, at: usize) -> Result<Block, RenderError> {
        let (_, align) = self.style();
        // Codes are centred unless a <C> or <RIGHT> around them says otherwise.
        let align = if align == Align::Left { Align::Center } else { align };
        let name = data_tag_name(tag);
        Ok(match tag {
            DataTag::Qr => {
                qr::check(body, EcLevel::M).map_err(|m| self.error(at, format!("<QR>: {m}")))?;
                Block::Qr(Qr { data: body.to_string(), size: 6, ec: EcLevel::M, align })
            }
            DataTag::Code128A | DataTag::Code128C | DataTag::Ean13 => {
                let kind = if tag == DataTag::Ean13 { BarcodeKind::Ean13 } else { BarcodeKind::Code128 };
                barcode::encode(kind, body).map_err(|m| self.error(at, format!("<{name}>: {m}")))?;
                Block::Barcode(Barcode { kind, data: body.to_string(), height: 80, module: 2, hri: Hri::Below, align })
            }
            DataTag::Img => {
                let png = base64::engine::general_purpose::STANDARD
                    .decode(body)
                    .map_err(|e| self.error(at, format!("<IMG>: not base64: {e}")))?;
                image::check(&png).map_err(|m| self.error(at, format!("<IMG>: {m}")))?;
                Block::Image(Image { png, width: None, align, dither: doc::Dither::Threshold })
            }
        })
    }
}

/// Byte offset of `needle` (ASCII) in `haystack`, ignoring ASCII case.
fn find_ignore_case(haystack: &str, needle: &str) -> Option<usize> {
    let h = haystack.as_bytes();
    let n = needle.as_bytes();
    (0..=h.len().checked_sub(n.len())?).find(|&i| h[i..i + n.len()].eq_ignore_ascii_case(n))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(doc: &Document) -> Vec<String> {
        doc.blocks
            .iter()
            .map(|b| match b {
                Block::Text(t) => {
                    let s: String = t.spans.iter().map(|s| s.text.as_str()).collect();
                    format!("{:?}:{s}", t.align)
                }
                Block::Qr(q) => format!("QR:{}", q.data),
                Block::Cut(_) => "CUT".into(),
                Block::Barcode(b) => format!("BC:{}", b.data),
                Block::Logo(_) => "LOGO".into(),
                Block::Drawer(_) => "DRAWER".into(),
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_cloud_ticket_reads() {
        let doc = parse_markup(
            "<CB>测试打印</CB><BR>名称　　　　　 单价  数量 金额<BR>--------------------------------<BR>\
             饭　　　　　　 1.0    1   1.0<BR><RIGHT>合计：1.0元</RIGHT><BR><BOLD>备注：加辣</BOLD><BR>\
             <QR>http://www.example.com</QR><BR>a<b and <x> stays<CUT>",
        )
        .unwrap();
        assert_eq!(
            texts(&doc),
            [
                "Center:测试打印",
                "Left:名称　　　　　 单价  数量 金额",
                "Left:--------------------------------",
                "Left:饭　　　　　　 1.0    1   1.0",
                "Right:合计：1.0元",
                "Left:备注：加辣",
                "QR:http://www.example.com",
                "Left:a<b and <x> stays",
                "CUT",
            ]
        );
        let Block::Text(t) = &doc.blocks[0] else { panic!() };
        assert!(t.spans[0].style.bold && t.spans[0].style.double_width && t.spans[0].style.double_height);
    }

    #[test]
    fn styles_nest_and_mix_in_a_line() {
        let doc = parse_markup("<C>Table <B>5</B></C>\n\n<L>tall</L><W>wide</W><CUT>").unwrap();
        let Block::Text(t) = &doc.blocks[0] else { panic!() };
        assert_eq!(t.align, Align::Center);
        assert_eq!(t.spans.len(), 2);
        assert!(!t.spans[0].style.double_width && t.spans[1].style.double_width);
        assert_eq!(texts(&doc), ["Center:Table 5", "Left:", "Left:tallwide", "CUT"]);
    }

    #[test]
    fn broken_codes_are_errors_with_a_position() {
        let err = parse_markup("ok<BR>\n  <QR>unclosed").unwrap_err();
        assert_eq!(err, RenderError::Markup { line: 2, column: 3, message: "<QR> is not closed with </QR>".into() });
        assert!(matches!(parse_markup("<BC128_A>é</BC128_A>"), Err(RenderError::Markup { line: 1, column: 1, .. })));
        assert!(parse_markup("<IMG>aGk=</IMG>").is_err());
        assert!(parse_markup(&"x".repeat(MAX_MARKUP_BYTES + 1)).is_err());
    }

    #[test]
    fn too_many_lines_are_refused_without_reading_them_all() {
        // Found with the fuzz target: 64 KiB of line breaks took minutes, since every block
        // recorded its position by scanning the source before it. Reading stops at the
        // block limit now; without that this test takes a minute, with it microseconds.
        for src in ["\n".repeat(MAX_MARKUP_BYTES), "a\n".repeat(MAX_MARKUP_BYTES / 2), "<CUT>".repeat(13_000)] {
            let start = std::time::Instant::now();
            let err = parse_markup(&src).unwrap_err();
            assert!(matches!(&err, RenderError::Markup { message, .. } if message.contains("more than 1000")), "{err}");
            assert!(start.elapsed() < std::time::Duration::from_secs(2), "took {:?}", start.elapsed());
        }
        let just_enough = "\n".repeat(doc::MAX_BLOCKS - 1);
        assert_eq!(parse_markup(&just_enough).map(|d| d.blocks.len()), Ok(doc::MAX_BLOCKS));
    }

    #[test]
    fn logo_plugin_and_barcodes() {
        let doc = parse_markup("<LOGO><BC128_A>A-123</BC128_A><EAN13>400638133393</EAN13><PLUGIN>").unwrap();
        assert_eq!(texts(&doc), ["LOGO", "BC:A-123", "BC:400638133393", "DRAWER", "CUT"]);
    }
}
