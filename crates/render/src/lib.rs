//! Receipt documents: one description of a receipt that prints correctly on any
//! thermal printer and shows up as a picture for staff.
//!
//! This crate owns
//! - the receipt document ([`Document`]): its serde types, its JSON Schema
//!   (`schema/receipt-document.schema.json`, [`schema()`]) and its validation
//!   ([`parse_document`]), whose errors name the offending field
//!   (`blocks[3].columns[1].width`);
//! - printer profiles ([`Profile`]): columns, dots and the character encoding a printer
//!   expects (GB18030/GBK/Big5/Shift_JIS in double-byte mode, PC437/PC850/PC858 selected
//!   with `ESC t`), with named built-ins;
//! - the renderers: ESC/POS bytes ([`to_escpos`]), plain text ([`to_text`]) and a PNG
//!   preview that looks like the printed slip ([`to_png`]), drawn with a CJK font that
//!   ships inside this crate (`fonts/`, see `fonts/README.md`);
//! - the tag markup of Chinese printer clouds as a second input ([`parse_markup`],
//!   documented in `MARKUP.md`);
//! - a benchmark of the renderers ([`mod@bench`]).
//!
//! All three renderers share one layout (the private `layout` module): wrapping, column
//! widths and alignment are computed once, in display columns of the printer's font A
//! (a CJK character takes two), so the text, the picture and the printed slip agree.
//!
//! Characters a profile cannot encode are never sent as bytes a printer would misread.
//! A Latin-1 sign a double-byte printer lacks (`¥`, `£`, `¢`) prints in its full-width
//! form, the same character; on a single-byte code page, typographic dashes, quotes and
//! bullets become their ASCII look-alike; anything else becomes `?`, one per column the
//! character takes, so columns stay aligned. Every replacement but the full-width forms is
//! reported in [`Rendered::warnings`] with the field it is in; the PNG preview shows
//! exactly what prints.
//!
//! It must never do IO (no files, no sockets, no font lookup on the system, no
//! download): everything it needs, the font included, is compiled in, so rendering
//! works the same on every machine and in every test. It must never panic on any
//! input, and never emit a byte sequence from document text that a printer would take
//! as a command: text is encoded character by character and control characters are
//! dropped.

mod barcode;
pub mod bench;
mod doc;
mod epos;
mod error;
mod escpos;
mod font;
mod image;
mod layout;
mod markup;
mod preview;
mod profile;
mod qr;
mod schema;
pub mod stored;
mod text;
mod width;

pub use doc::{
    parse_document, Align, Barcode, BarcodeKind, Block, Column, Cut, Dither, Document, Drawer, EcLevel, Feed, Hri,
    Image, Logo, Paper, Qr, Row, Rule, Span, Style, Text,
};
pub use epos::{to_epos_xml, EPOS_PRINT_NS};
pub use error::{RenderError, Warning, WarningKind};
pub use escpos::{to_escpos, Rendered};
pub use markup::parse_markup;
pub use preview::{to_png, to_print_png, FinalCut, PrintImage};
pub use profile::{Encoding, Profile, DEFAULT_PROFILE};
pub use schema::{schema, schema_with_ref_prefix};
pub use text::to_text;
pub use width::display_width;
