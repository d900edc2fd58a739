//! The receipt document: its types and its validation.
//!
//! Documents are read from JSON by hand ([`parse_document`]) rather than with
//! `#[derive(Deserialize)]`: serde cannot follow the path into an internally tagged
//! enum, and the point of validation here is an error that names the field
//! (`blocks[3].columns[1].width`), plus rules serde has no words for (widths that must fit
//! the paper, a QR payload that must fit a symbol, an EAN-13 check digit). Serialization is
//! derived and produces the normal form of the schema: text blocks as `spans`.

use base64::Engine as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use crate::error::RenderError;
use crate::{barcode, image, qr};

/// Most blocks in one document.
pub const MAX_BLOCKS: usize = 1000;
/// Most characters in one text, span or column.
pub const MAX_TEXT_CHARS: usize = 4096;
/// Most spans in one text block.
pub const MAX_SPANS: usize = 64;
/// Most columns in one row.
pub const MAX_COLUMNS: usize = 8;
/// Most bytes of base64 in one image.
pub const MAX_IMAGE_BASE64: usize = 1 << 20;

/// A receipt: the paper it was designed for and what is printed on it, top to bottom.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Document {
    /// The paper the author laid the receipt out for. Rendering always uses the
    /// printer profile's width (wider fixed columns are scaled down to fit); this width
    /// checks fixed column widths when the document is read and is what a preview without
    /// a printer uses ([`crate::Profile::for_document`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paper: Option<Paper>,
    pub blocks: Vec<Block>,
}

/// Paper width: the usual two rolls, or a printer's own columns and dots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Paper {
    /// 58 mm: 32 columns, 384 dots.
    Mm58,
    /// 80 mm: 48 columns, 576 dots.
    Mm80,
    /// Columns of font A (8–128) and printable dots (at least 8 per column, at most 2048).
    Custom { columns: u16, dots: u16 },
}

impl Paper {
    pub fn columns(self) -> u16 {
        match self {
            Paper::Mm58 => 32,
            Paper::Mm80 => 48,
            Paper::Custom { columns, .. } => columns,
        }
    }

    pub fn dots(self) -> u16 {
        match self {
            Paper::Mm58 => 384,
            Paper::Mm80 => 576,
            Paper::Custom { dots, .. } => dots,
        }
    }
}

impl Serialize for Paper {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Paper::Mm58 => s.serialize_str("58mm"),
            Paper::Mm80 => s.serialize_str("80mm"),
            Paper::Custom { columns, dots } => serde_json::json!({ "columns": columns, "dots": dots }).serialize(s),
        }
    }
}

/// One block of the document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block {
    Text(Text),
    Row(Row),
    Rule(Rule),
    Feed(Feed),
    Qr(Qr),
    Barcode(Barcode),
    Image(Image),
    Logo(Logo),
    Cut(Cut),
    Drawer(Drawer),
}

/// Horizontal alignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Align {
    #[default]
    Left,
    Center,
    Right,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// Character styles. Double width doubles the columns each character takes; double
/// height doubles the line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize)]
pub struct Style {
    #[serde(skip_serializing_if = "is_false")]
    pub bold: bool,
    #[serde(skip_serializing_if = "is_false")]
    pub underline: bool,
    /// White on black.
    #[serde(skip_serializing_if = "is_false")]
    pub invert: bool,
    #[serde(skip_serializing_if = "is_false")]
    pub double_width: bool,
    #[serde(skip_serializing_if = "is_false")]
    pub double_height: bool,
}

impl Style {
    /// Columns per character column: 2 in double width.
    pub(crate) fn width_factor(self) -> u16 {
        1 + u16::from(self.double_width)
    }
}

/// Text, wrapped at the paper width (at spaces, and between CJK characters), with
/// `\n` as a line break. An empty text prints an empty line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Text {
    pub spans: Vec<Span>,
    pub align: Align,
}

/// A piece of a text with its own style.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Span {
    pub text: String,
    #[serde(flatten)]
    pub style: Style,
}

/// A line of columns, such as item / qty / price. A cell wraps inside its column; the
/// row is as many lines as its tallest cell.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Row {
    pub columns: Vec<Column>,
    /// Blank columns between two columns.
    pub gap: u8,
    #[serde(flatten)]
    pub style: Style,
}

/// One column of a row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Column {
    pub text: String,
    /// Width in columns; `None` shares what the fixed columns and gaps leave.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub width: Option<u16>,
    pub align: Align,
}

/// A line of one character repeated across the paper.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rule {
    pub char: char,
}

/// Blank lines.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Feed {
    pub lines: u8,
}

/// QR error-correction level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize)]
pub enum EcLevel {
    L,
    #[default]
    M,
    Q,
    H,
}

/// A QR code, printed by the printer (`GS ( k`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Qr {
    pub data: String,
    /// Module size in dots, 1–16.
    pub size: u8,
    pub ec: EcLevel,
    pub align: Align,
}

/// Barcode symbologies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BarcodeKind {
    /// Printable ASCII; all-digit data of even length uses the compact code set C.
    Code128,
    /// 12 digits (the check digit is added) or 13 with a correct check digit.
    Ean13,
}

/// Where the human-readable text of a barcode goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Hri {
    None,
    Above,
    #[default]
    Below,
    Both,
}

/// A one-dimensional barcode, printed by the printer (`GS k`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Barcode {
    pub kind: BarcodeKind,
    pub data: String,
    /// Bar height in dots, 1–255.
    pub height: u8,
    /// Width of the narrowest bar in dots, 2–6.
    pub module: u8,
    pub hri: Hri,
    pub align: Align,
}

/// How an image becomes black and white.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Dither {
    /// Error diffusion: photos and greys.
    #[default]
    FloydSteinberg,
    /// Darker than middle grey is black: logos and line art.
    Threshold,
}

/// A PNG image printed as a raster (`GS v 0`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Image {
    /// The PNG file.
    #[serde(serialize_with = "base64_bytes")]
    pub png: Vec<u8>,
    /// Width to print in dots; `None`: the image's own width, at most the paper's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub width: Option<u16>,
    pub align: Align,
    pub dither: Dither,
}

fn base64_bytes<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// A logo stored in the printer's own memory (NV graphics, `FS p n`), as the clouds'
/// `<LOGO>` prints it. The preview shows a placeholder: the picture is in the printer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Logo {
    /// The stored image's number, 1–255.
    pub key: u8,
    pub align: Align,
}

/// Feed past the cutter and cut.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Cut {
    /// Partial (one point left uncut, the receipt stays hanging) or full.
    #[serde(rename = "mode", serialize_with = "cut_mode")]
    pub partial: bool,
    /// Lines fed before cutting, 0–255.
    pub feed: u8,
}

fn cut_mode<S: Serializer>(partial: &bool, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(if *partial { "partial" } else { "full" })
}

/// A pulse that opens the cash drawer (`ESC p`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Drawer {
    /// Connector pin, 2 or 5.
    pub pin: u8,
    /// Pulse on-time in milliseconds, 2–510 (sent in 2 ms steps).
    pub on_ms: u16,
    /// Off-time after the pulse in milliseconds, 2–510.
    pub off_ms: u16,
}

impl<'de> Deserialize<'de> for Document {
    /// Reads a document through [`parse_document`], so a DTO embedding one gets the same
    /// validation; the error message carries the field path.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Document, D::Error> {
        let value = Value::deserialize(d)?;
        parse_document(&value).map_err(serde::de::Error::custom)
    }
}

// ---------------------------------------------------------------------------------------
// Field names, shared with the schema test so the schema cannot drift from the parser.

pub(crate) const DOCUMENT_FIELDS: &[&str] = &["paper", "blocks"];
pub(crate) const PAPER_FIELDS: &[&str] = &["columns", "dots"];
#[cfg(test)]
pub(crate) const STYLE_FIELDS: &[&str] = &["bold", "underline", "invert", "double_width", "double_height"];
pub(crate) const TEXT_FIELDS: &[&str] =
    &["type", "text", "spans", "align", "bold", "underline", "invert", "double_width", "double_height"];
pub(crate) const SPAN_FIELDS: &[&str] = &["text", "bold", "underline", "invert", "double_width", "double_height"];
pub(crate) const ROW_FIELDS: &[&str] =
    &["type", "columns", "gap", "bold", "underline", "invert", "double_width", "double_height"];
pub(crate) const COLUMN_FIELDS: &[&str] = &["text", "width", "align"];
pub(crate) const RULE_FIELDS: &[&str] = &["type", "char"];
pub(crate) const FEED_FIELDS: &[&str] = &["type", "lines"];
pub(crate) const QR_FIELDS: &[&str] = &["type", "data", "size", "ec", "align"];
pub(crate) const BARCODE_FIELDS: &[&str] = &["type", "kind", "data", "height", "module", "hri", "align"];
pub(crate) const IMAGE_FIELDS: &[&str] = &["type", "png", "width", "align", "dither"];
pub(crate) const LOGO_FIELDS: &[&str] = &["type", "key", "align"];
pub(crate) const CUT_FIELDS: &[&str] = &["type", "mode", "feed"];
pub(crate) const DRAWER_FIELDS: &[&str] = &["type", "pin", "on_ms", "off_ms"];

/// Every block type with its fields, in schema order.
pub(crate) const BLOCK_TYPES: &[(&str, &[&str])] = &[
    ("text", TEXT_FIELDS),
    ("row", ROW_FIELDS),
    ("rule", RULE_FIELDS),
    ("feed", FEED_FIELDS),
    ("qr", QR_FIELDS),
    ("barcode", BARCODE_FIELDS),
    ("image", IMAGE_FIELDS),
    ("logo", LOGO_FIELDS),
    ("cut", CUT_FIELDS),
    ("drawer", DRAWER_FIELDS),
];

const ALIGNS: &[&str] = &["left", "center", "right"];

fn align_of(i: usize) -> Align {
    match i {
        1 => Align::Center,
        2 => Align::Right,
        _ => Align::Left,
    }
}

// ---------------------------------------------------------------------------------------
// Reading JSON with paths.

/// The fields of one JSON object, with the path that names it in errors.
struct Fields<'v> {
    map: &'v Map<String, Value>,
    path: String,
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl<'v> Fields<'v> {
    /// `value` must be an object with no fields but `allowed`.
    fn new(value: &'v Value, path: String, allowed: &[&str]) -> Result<Fields<'v>, RenderError> {
        let Value::Object(map) = value else {
            return Err(RenderError::invalid(path, format!("expected an object, got {}", type_name(value))));
        };
        for key in map.keys() {
            if !allowed.contains(&key.as_str()) {
                let path = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
                return Err(RenderError::invalid(
                    path,
                    format!("unknown field; expected one of: {}", allowed.join(", ")),
                ));
            }
        }
        Ok(Fields { map, path })
    }

    fn path(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    fn err(&self, key: &str, message: impl Into<String>) -> RenderError {
        RenderError::invalid(self.path(key), message)
    }

    /// A present, non-null field.
    fn get(&self, key: &str) -> Option<&'v Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn string(&self, key: &str) -> Result<Option<&'v str>, RenderError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.err(key, format!("expected a string, got {}", type_name(v)))),
        }
    }

    fn required_string(&self, key: &str) -> Result<&'v str, RenderError> {
        self.string(key)?.ok_or_else(|| self.err(key, "required"))
    }

    /// A text field: at most [`MAX_TEXT_CHARS`] characters.
    fn text(&self, key: &str) -> Result<Option<&'v str>, RenderError> {
        let s = self.string(key)?;
        if let Some(s) = s {
            if s.chars().nth(MAX_TEXT_CHARS).is_some() {
                return Err(self.err(key, format!("longer than {MAX_TEXT_CHARS} characters")));
            }
        }
        Ok(s)
    }

    fn boolean(&self, key: &str) -> Result<Option<bool>, RenderError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.err(key, format!("expected true or false, got {}", type_name(v)))),
        }
    }

    fn integer(&self, key: &str, min: u64, max: u64) -> Result<Option<u64>, RenderError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if (min..=max).contains(&n) => Ok(Some(n)),
                _ => Err(self.err(key, format!("must be an integer from {min} to {max}"))),
            },
        }
    }

    fn u8(&self, key: &str, min: u8, max: u8, default: u8) -> Result<u8, RenderError> {
        // In range by construction, so the conversion cannot fail.
        Ok(self.integer(key, min.into(), max.into())?.map_or(default, |n| u8::try_from(n).unwrap_or(default)))
    }

    fn u16(&self, key: &str, min: u16, max: u16) -> Result<Option<u16>, RenderError> {
        Ok(self.integer(key, min.into(), max.into())?.and_then(|n| u16::try_from(n).ok()))
    }

    /// One of `options`, as its index.
    fn choice(&self, key: &str, options: &[&str]) -> Result<Option<usize>, RenderError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => match options.iter().position(|o| o == s) {
                Some(i) => Ok(Some(i)),
                None => Err(self.err(key, format!("{s:?} is not one of: {}", options.join(", ")))),
            },
            Some(v) => Err(self.err(key, format!("expected one of {}, got {}", options.join(", "), type_name(v)))),
        }
    }

    fn align(&self, default: Align) -> Result<Align, RenderError> {
        Ok(self.choice("align", ALIGNS)?.map_or(default, align_of))
    }

    fn array(&self, key: &str) -> Result<Option<&'v Vec<Value>>, RenderError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(v) => Err(self.err(key, format!("expected an array, got {}", type_name(v)))),
        }
    }

    /// Style flags present in this object, over `base`.
    fn style(&self, base: Style) -> Result<Style, RenderError> {
        Ok(Style {
            bold: self.boolean("bold")?.unwrap_or(base.bold),
            underline: self.boolean("underline")?.unwrap_or(base.underline),
            invert: self.boolean("invert")?.unwrap_or(base.invert),
            double_width: self.boolean("double_width")?.unwrap_or(base.double_width),
            double_height: self.boolean("double_height")?.unwrap_or(base.double_height),
        })
    }
}

/// Reads and validates a receipt document (see `schema/receipt-document.schema.json`).
///
/// Every error names the field it is about, e.g. `blocks[3].columns[1].width`, in
/// [`RenderError::Invalid`]. Besides the shape, it checks what the printer needs:
/// fixed column widths and gaps fit the document's paper (80 mm when it names none),
/// a QR payload fits a symbol at its error-correction level, barcode data is valid for
/// its symbology and fits the paper, and images are PNG files of reasonable size.
pub fn parse_document(value: &Value) -> Result<Document, RenderError> {
    let top = Fields::new(value, String::new(), DOCUMENT_FIELDS)?;
    let paper = match top.get("paper") {
        None => None,
        Some(v) => Some(parse_paper(v)?),
    };
    let blocks_json = top.array("blocks")?.ok_or_else(|| RenderError::invalid("blocks", "required"))?;
    if blocks_json.len() > MAX_BLOCKS {
        return Err(RenderError::invalid("blocks", format!("more than {MAX_BLOCKS} blocks")));
    }
    let mut blocks = Vec::with_capacity(blocks_json.len());
    for (i, b) in blocks_json.iter().enumerate() {
        blocks.push(parse_block(b, format!("blocks[{i}]"))?);
    }
    let doc = Document { paper, blocks };
    validate(&doc)?;
    Ok(doc)
}

fn parse_paper(v: &Value) -> Result<Paper, RenderError> {
    match v {
        Value::String(s) => match s.as_str() {
            "58mm" => Ok(Paper::Mm58),
            "80mm" => Ok(Paper::Mm80),
            _ => Err(RenderError::invalid("paper", format!("{s:?} is not one of: 58mm, 80mm"))),
        },
        Value::Object(_) => {
            let f = Fields::new(v, "paper".into(), PAPER_FIELDS)?;
            let columns = f.u16("columns", 8, 128)?.ok_or_else(|| f.err("columns", "required"))?;
            let dots = f.u16("dots", 64, 2048)?.unwrap_or(columns.saturating_mul(12).min(2048));
            if dots < columns.saturating_mul(8) {
                return Err(f.err("dots", format!("{columns} columns need at least {} dots", columns * 8)));
            }
            Ok(Paper::Custom { columns, dots })
        }
        _ => Err(RenderError::invalid(
            "paper",
            format!("expected \"58mm\", \"80mm\" or {{\"columns\", \"dots\"}}, got {}", type_name(v)),
        )),
    }
}

fn parse_block(v: &Value, path: String) -> Result<Block, RenderError> {
    let Value::Object(map) = v else {
        return Err(RenderError::invalid(path, format!("expected an object, got {}", type_name(v))));
    };
    let kind = match map.get("type") {
        Some(Value::String(s)) => s.as_str(),
        Some(other) => {
            return Err(RenderError::invalid(
                format!("{path}.type"),
                format!("expected a string, got {}", type_name(other)),
            ))
        }
        None => return Err(RenderError::invalid(format!("{path}.type"), "required")),
    };
    let Some(&(_, fields)) = BLOCK_TYPES.iter().find(|(name, _)| *name == kind) else {
        let names: Vec<&str> = BLOCK_TYPES.iter().map(|(n, _)| *n).collect();
        return Err(RenderError::invalid(
            format!("{path}.type"),
            format!("unknown block type {kind:?}; expected one of: {}", names.join(", ")),
        ));
    };
    let f = Fields::new(v, path, fields)?;
    Ok(match kind {
        "text" => Block::Text(parse_text(&f)?),
        "row" => Block::Row(parse_row(&f)?),
        "rule" => {
            let char = match f.string("char")? {
                None => '-',
                Some(s) => {
                    let mut chars = s.chars();
                    match (chars.next(), chars.next()) {
                        (Some(c), None) if !crate::width::is_silent(c) && crate::width::display_width(s) > 0 => c,
                        _ => return Err(f.err("char", "must be exactly one printable character")),
                    }
                }
            };
            Block::Rule(Rule { char })
        }
        "feed" => Block::Feed(Feed { lines: f.u8("lines", 1, 255, 1)? }),
        "qr" => Block::Qr(Qr {
            data: f.required_string("data")?.to_string(),
            size: f.u8("size", 1, 16, 6)?,
            ec: f.choice("ec", &["L", "M", "Q", "H"])?.map_or(EcLevel::M, |i| match i {
                0 => EcLevel::L,
                2 => EcLevel::Q,
                3 => EcLevel::H,
                _ => EcLevel::M,
            }),
            align: f.align(Align::Center)?,
        }),
        "barcode" => Block::Barcode(Barcode {
            kind: match f.choice("kind", &["code128", "ean13"])? {
                Some(0) => BarcodeKind::Code128,
                Some(_) => BarcodeKind::Ean13,
                None => return Err(f.err("kind", "required")),
            },
            data: f.required_string("data")?.to_string(),
            height: f.u8("height", 1, 255, 80)?,
            module: f.u8("module", 2, 6, 2)?,
            hri: f.choice("hri", &["none", "above", "below", "both"])?.map_or(Hri::Below, |i| match i {
                0 => Hri::None,
                1 => Hri::Above,
                3 => Hri::Both,
                _ => Hri::Below,
            }),
            align: f.align(Align::Center)?,
        }),
        "image" => {
            let b64 = f.required_string("png")?;
            if b64.len() > MAX_IMAGE_BASE64 {
                return Err(f.err("png", format!("longer than {MAX_IMAGE_BASE64} bytes of base64")));
            }
            let png = base64::engine::general_purpose::STANDARD
                .decode(b64.trim())
                .map_err(|e| f.err("png", format!("not base64: {e}")))?;
            Block::Image(Image {
                png,
                width: f.u16("width", 1, 2048)?,
                align: f.align(Align::Center)?,
                dither: match f.choice("dither", &["floyd_steinberg", "threshold"])? {
                    Some(1) => Dither::Threshold,
                    _ => Dither::FloydSteinberg,
                },
            })
        }
        "logo" => Block::Logo(Logo { key: f.u8("key", 1, 255, 1)?, align: f.align(Align::Center)? }),
        "cut" => Block::Cut(Cut {
            partial: f.choice("mode", &["partial", "full"])? != Some(1),
            feed: f.u8("feed", 0, 255, 3)?,
        }),
        "drawer" => {
            let pin = match f.integer("pin", 2, 5)? {
                None | Some(2) => 2,
                Some(5) => 5,
                Some(_) => return Err(f.err("pin", "must be 2 or 5")),
            };
            Block::Drawer(Drawer {
                pin,
                on_ms: f.u16("on_ms", 2, 510)?.unwrap_or(50),
                off_ms: f.u16("off_ms", 2, 510)?.unwrap_or(500),
            })
        }
        // Unreachable: `kind` was found in BLOCK_TYPES above.
        _ => return Err(RenderError::invalid(f.path("type"), "unknown block type")),
    })
}

fn parse_text(f: &Fields<'_>) -> Result<Text, RenderError> {
    let base = f.style(Style::default())?;
    let align = f.align(Align::Left)?;
    let spans = match (f.text("text")?, f.array("spans")?) {
        (Some(text), None) => vec![Span { text: text.to_string(), style: base }],
        (None, Some(list)) => {
            if list.len() > MAX_SPANS {
                return Err(f.err("spans", format!("more than {MAX_SPANS} spans")));
            }
            let mut spans = Vec::with_capacity(list.len());
            for (i, s) in list.iter().enumerate() {
                let sf = Fields::new(s, f.path(&format!("spans[{i}]")), SPAN_FIELDS)?;
                let text = sf.text("text")?.ok_or_else(|| sf.err("text", "required"))?;
                spans.push(Span { text: text.to_string(), style: sf.style(base)? });
            }
            spans
        }
        (Some(_), Some(_)) => return Err(f.err("spans", "give either text or spans, not both")),
        (None, None) => return Err(f.err("text", "required (or spans)")),
    };
    Ok(Text { spans, align })
}

fn parse_row(f: &Fields<'_>) -> Result<Row, RenderError> {
    let list = f.array("columns")?.ok_or_else(|| f.err("columns", "required"))?;
    if list.is_empty() || list.len() > MAX_COLUMNS {
        return Err(f.err("columns", format!("must have 1 to {MAX_COLUMNS} columns")));
    }
    let mut columns = Vec::with_capacity(list.len());
    for (i, c) in list.iter().enumerate() {
        let cf = Fields::new(c, f.path(&format!("columns[{i}]")), COLUMN_FIELDS)?;
        columns.push(Column {
            text: cf.text("text")?.unwrap_or_default().to_string(),
            width: cf.u16("width", 1, 128)?,
            align: cf.align(Align::Left)?,
        });
    }
    Ok(Row { columns, gap: f.u8("gap", 0, 8, 1)?, style: f.style(Style::default())? })
}

/// The checks that need more than one field, or the paper: shared by [`parse_document`]
/// and [`crate::parse_markup`], whose documents must be just as printable.
pub(crate) fn validate(doc: &Document) -> Result<(), RenderError> {
    let paper = doc.paper.unwrap_or(Paper::Mm80);
    for (i, block) in doc.blocks.iter().enumerate() {
        let path = |field: &str| format!("blocks[{i}].{field}");
        match block {
            Block::Row(row) => {
                let columns = usize::from(paper.columns());
                let gaps = usize::from(row.gap) * row.columns.len().saturating_sub(1);
                let factor = usize::from(row.style.width_factor());
                let mut used = gaps;
                for (j, c) in row.columns.iter().enumerate() {
                    // A flexible column needs room for at least one character.
                    used += c.width.map_or(factor, usize::from);
                    if used > columns {
                        let field =
                            if c.width.is_some() { format!("columns[{j}].width") } else { format!("columns[{j}]") };
                        return Err(RenderError::invalid(
                            path(&field),
                            format!("the row needs {used} columns by here (gaps included); the paper has {columns}"),
                        ));
                    }
                }
            }
            Block::Qr(q) => qr::check(&q.data, q.ec).map_err(|m| RenderError::invalid(path("data"), m))?,
            Block::Barcode(b) => {
                let symbol = barcode::encode(b.kind, &b.data).map_err(|m| RenderError::invalid(path("data"), m))?;
                let dots = symbol.modules().saturating_mul(2);
                if dots > usize::from(paper.dots()) {
                    return Err(RenderError::invalid(
                        path("data"),
                        format!(
                            "the barcode is {dots} dots wide at the narrowest bars; the paper has {}",
                            paper.dots()
                        ),
                    ));
                }
            }
            Block::Image(img) => {
                image::check(&img.png).map_err(|m| RenderError::invalid(path("png"), m))?;
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn err_path(v: Value) -> String {
        match parse_document(&v) {
            Err(RenderError::Invalid { path, .. }) => path,
            other => panic!("expected an error, got {other:?}"),
        }
    }

    #[test]
    fn a_small_document_reads_and_writes() {
        let v = json!({"paper": "58mm", "blocks": [
            {"type": "text", "text": "Hello", "align": "center", "bold": true},
            {"type": "row", "columns": [{"text": "Tea", "width": 20}, {"text": "2.50", "align": "right"}]},
            {"type": "rule", "char": "="},
            {"type": "qr", "data": "https://example.com"},
            {"type": "barcode", "kind": "ean13", "data": "400638133393"},
            {"type": "cut"},
            {"type": "drawer", "pin": 5}
        ]});
        let doc = parse_document(&v).unwrap();
        assert_eq!(doc.paper, Some(Paper::Mm58));
        assert_eq!(doc.blocks.len(), 7);
        let Block::Text(t) = &doc.blocks[0] else { panic!() };
        assert!(t.spans[0].style.bold);
        // The serialized normal form reads back to the same document.
        let again = parse_document(&serde_json::to_value(&doc).unwrap()).unwrap();
        assert_eq!(again, doc);
        let from_serde: Document = serde_json::from_value(v).unwrap();
        assert_eq!(from_serde, doc);
    }

    #[test]
    fn errors_name_the_field() {
        assert_eq!(err_path(json!({})), "blocks");
        assert_eq!(err_path(json!({"blocks": 3})), "blocks");
        assert_eq!(err_path(json!({"blocks": [], "colour": 1})), "colour");
        assert_eq!(err_path(json!({"paper": "70mm", "blocks": []})), "paper");
        assert_eq!(err_path(json!({"paper": {"columns": 500}, "blocks": []})), "paper.columns");
        assert_eq!(err_path(json!({"blocks": [{"type": "txt"}]})), "blocks[0].type");
        assert_eq!(err_path(json!({"blocks": [{"text": "x"}]})), "blocks[0].type");
        assert_eq!(err_path(json!({"blocks": [{"type": "text", "text": 5}]})), "blocks[0].text");
        assert_eq!(err_path(json!({"blocks": [{"type": "text", "text": "a", "align": "middle"}]})), "blocks[0].align");
        assert_eq!(
            err_path(json!({"blocks": [{"type": "text", "spans": [{"text": "a"}, {"text": "b", "bold": 1}]}]})),
            "blocks[0].spans[1].bold"
        );
        assert_eq!(
            err_path(json!({"paper": "58mm", "blocks": [{"type": "feed"}, {"type": "feed"}, {"type": "feed"},
                {"type": "row", "columns": [{"text": "a", "width": 20}, {"text": "b", "width": 20}]}]})),
            "blocks[3].columns[1].width"
        );
        assert_eq!(
            err_path(json!({"blocks": [{"type": "row", "columns": [{"text": "a", "width": 0}]}]})),
            "blocks[0].columns[0].width"
        );
        assert_eq!(err_path(json!({"blocks": [{"type": "qr", "data": "x", "size": 17}]})), "blocks[0].size");
        assert_eq!(err_path(json!({"blocks": [{"type": "qr", "data": "x".repeat(3000)}]})), "blocks[0].data");
        assert_eq!(
            err_path(json!({"blocks": [{"type": "barcode", "kind": "ean13", "data": "4006381333932"}]})),
            "blocks[0].data"
        );
        assert_eq!(err_path(json!({"blocks": [{"type": "barcode", "data": "1"}]})), "blocks[0].kind");
        assert_eq!(err_path(json!({"blocks": [{"type": "image", "png": "aGVsbG8="}]})), "blocks[0].png");
        assert_eq!(err_path(json!({"blocks": [{"type": "image", "png": "%%%"}]})), "blocks[0].png");
        assert_eq!(err_path(json!({"blocks": [{"type": "drawer", "pin": 3}]})), "blocks[0].pin");
        assert_eq!(err_path(json!({"blocks": [{"type": "rule", "char": "ab"}]})), "blocks[0].char");
        assert_eq!(err_path(json!({"blocks": [{"type": "cut", "mode": "half"}]})), "blocks[0].mode");
    }
}
