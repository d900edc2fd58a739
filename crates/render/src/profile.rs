//! Printer profiles: what the renderer must know about a printer to produce bytes it
//! prints correctly — its width in columns and dots, and the characters it understands.

use std::sync::OnceLock;

use encoding_rs::{BIG5, GB18030, SHIFT_JIS};
use onceprint_escpos::codepage;
use serde::Serialize;

use crate::doc::Paper;
use crate::width::char_width;

/// The name of the profile used when none is given: an 80 mm Chinese printer, since
/// GB18030 encodes every character a receipt has and ASCII is the same in it.
pub const DEFAULT_PROFILE: &str = "escpos-80-gb18030";

/// A printer as the renderer sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Profile {
    /// Built-in name (`escpos-80-gb18030`, …) or a name chosen by whoever built it.
    pub name: String,
    /// Columns of font A (12×24 dots) per line: 32 on 58 mm paper, 48 on 80 mm.
    pub columns: u16,
    /// Printable dots per line: 384 on 58 mm, 576 on 80 mm.
    pub dots: u16,
    /// How text is encoded, and how the printer is switched to it.
    pub encoding: Encoding,
    /// The `n` of `ESC t n` for single-byte encodings, when the printer numbers its code
    /// pages differently from Epson (`None`: Epson's number, [`Encoding::esc_t`]).
    pub code_table: Option<u8>,
}

/// The character encoding of a printer, and with it the mode it is put in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    /// Mainland Chinese printers: `FS &` (double-byte mode), GBK two-byte codes plus the
    /// GB18030 four-byte codes of CJK Extension A.
    Gb18030,
    /// Older mainland Chinese printers: `FS &`, GBK two-byte codes only.
    Gbk,
    /// Traditional Chinese printers: `FS &`, Big5.
    Big5,
    /// Japanese printers: `FS &` and `FS C 1` (Shift_JIS).
    ShiftJis,
    /// Western printers' power-on code page, `ESC t 0`.
    Cp437,
    /// Multilingual Latin 1, `ESC t 2`.
    Cp850,
    /// Multilingual Latin 1 with the euro sign, `ESC t 19`.
    Cp858,
}

impl Encoding {
    /// Every encoding, for tests and listings.
    pub const ALL: [Encoding; 7] = [
        Encoding::Gb18030,
        Encoding::Gbk,
        Encoding::Big5,
        Encoding::ShiftJis,
        Encoding::Cp437,
        Encoding::Cp850,
        Encoding::Cp858,
    ];

    /// The name used in profile names: `gb18030`, `cp858`, `shift-jis`, …
    pub fn name(self) -> &'static str {
        match self {
            Encoding::Gb18030 => "gb18030",
            Encoding::Gbk => "gbk",
            Encoding::Big5 => "big5",
            Encoding::ShiftJis => "shift-jis",
            Encoding::Cp437 => "cp437",
            Encoding::Cp850 => "cp850",
            Encoding::Cp858 => "cp858",
        }
    }

    fn from_name(name: &str) -> Option<Encoding> {
        Encoding::ALL.into_iter().find(|e| e.name() == name)
    }

    /// Whether the printer is used in double-byte mode (`FS &`).
    pub fn double_byte(self) -> bool {
        matches!(self, Encoding::Gb18030 | Encoding::Gbk | Encoding::Big5 | Encoding::ShiftJis)
    }

    /// Epson's `ESC t n` number for a single-byte code page.
    pub fn esc_t(self) -> Option<u8> {
        self.code_page().map(codepage::CodePage::epson_number)
    }

    pub(crate) fn code_page(self) -> Option<codepage::CodePage> {
        match self {
            Encoding::Cp437 => Some(codepage::CodePage::Pc437),
            Encoding::Cp850 => Some(codepage::CodePage::Pc850),
            Encoding::Cp858 => Some(codepage::CodePage::Pc858),
            _ => None,
        }
    }

    /// Whether the printer can print `c` as itself (or its full-width form), in the
    /// columns the layout gives it. Characters of width 0 are never printable.
    pub fn can_encode(self, c: char) -> bool {
        if char_width(self, c) == 0 {
            return false;
        }
        if c.is_ascii() {
            return true;
        }
        let mut buf = [0u8; 8];
        self.encode_char(c, &mut buf).is_some()
    }

    /// The bytes of one non-ASCII character, or `None` when the printer cannot print it.
    pub(crate) fn encode_char(self, c: char, buf: &mut [u8; 8]) -> Option<usize> {
        if c.is_ascii() {
            buf[0] = c as u8;
            return Some(1);
        }
        match self.encode_exact(c, buf) {
            Some(n) => Some(n),
            // Double-byte fonts print the Latin-1 currency and sign characters they lack
            // in their full-width forms: the same character, in the two columns it takes
            // there anyway.
            None if self.double_byte() => self.encode_exact(fullwidth_equivalent(c)?, buf),
            None => None,
        }
    }

    fn encode_exact(self, c: char, buf: &mut [u8; 8]) -> Option<usize> {
        match self {
            Encoding::Gb18030 | Encoding::Gbk => {
                // Private-use characters map to GBK's user-defined areas, which print as
                // whatever the printer happens to have there: not printable.
                if matches!(c, '\u{E000}'..='\u{F8FF}') {
                    return None;
                }
                if let Some(n) = table_lookup(GB18030, c, buf) {
                    return Some(n);
                }
                // Four-byte codes: printer fonts that claim GB18030 carry CJK Extension A
                // and nothing else of that range (no emoji, no other scripts).
                if self == Encoding::Gb18030 && matches!(c, '\u{3400}'..='\u{4DBF}') {
                    return encode_with(GB18030, c, buf).filter(|&n| n == 4);
                }
                None
            }
            Encoding::Big5 => {
                table_lookup(BIG5, c, buf).or_else(|| encode_with(BIG5, c, buf).filter(|_| c > '\u{FFFF}'))
            }
            Encoding::ShiftJis => table_lookup(SHIFT_JIS, c, buf),
            Encoding::Cp437 | Encoding::Cp850 | Encoding::Cp858 => {
                let b = self.code_page()?.encode(c)?;
                buf[0] = b;
                Some(1)
            }
        }
    }
}

/// The codes of every character of the Basic Multilingual Plane in a double-byte
/// encoding: 0 for none (or a four-byte one), below 0x100 for a single byte, else two
/// bytes. encoding_rs searches its index for every character it encodes, which made
/// that search most of the time of rendering a Chinese receipt; this table is built
/// once per encoding, on first use, from the same encoder (128 KiB each).
fn bmp_table(encoding: &'static encoding_rs::Encoding) -> &'static [u16] {
    static GB18030_TABLE: OnceLock<Vec<u16>> = OnceLock::new();
    static BIG5_TABLE: OnceLock<Vec<u16>> = OnceLock::new();
    static SHIFT_JIS_TABLE: OnceLock<Vec<u16>> = OnceLock::new();
    let cell = if encoding == BIG5 {
        &BIG5_TABLE
    } else if encoding == SHIFT_JIS {
        &SHIFT_JIS_TABLE
    } else {
        &GB18030_TABLE
    };
    cell.get_or_init(|| {
        let mut table = vec![0u16; 0x1_0000];
        let mut buf = [0u8; 8];
        for (cp, slot) in table.iter_mut().enumerate().skip(0x80) {
            let Some(c) = u32::try_from(cp).ok().and_then(char::from_u32) else { continue };
            *slot = match encode_with(encoding, c, &mut buf) {
                // Shift_JIS prints ¥ and ‾ at 0x5C and 0x7E (JIS-Roman).
                Some(1) => u16::from(buf[0]),
                Some(2) => u16::from_be_bytes([buf[0], buf[1]]),
                _ => 0,
            };
        }
        table
    })
}

/// A BMP character's one- or two-byte code from [`bmp_table`].
fn table_lookup(encoding: &'static encoding_rs::Encoding, c: char, buf: &mut [u8; 8]) -> Option<usize> {
    let code = *bmp_table(encoding).get(usize::try_from(u32::from(c)).ok()?)?;
    match code {
        0 => None,
        1..=0xFF => {
            buf[0] = code as u8;
            Some(1)
        }
        _ => {
            buf[..2].copy_from_slice(&code.to_be_bytes());
            Some(2)
        }
    }
}

/// The full-width form of a character of Latin-1 (and the won sign), per Unicode's
/// Halfwidth and Fullwidth Forms block.
fn fullwidth_equivalent(c: char) -> Option<char> {
    Some(match c {
        '¢' => '\u{FFE0}',
        '£' => '\u{FFE1}',
        '¬' => '\u{FFE2}',
        '¯' => '\u{FFE3}',
        '¦' => '\u{FFE4}',
        '¥' => '\u{FFE5}',
        '₩' => '\u{FFE6}',
        _ => return None,
    })
}

/// One character through an encoding_rs encoder, without replacement.
fn encode_with(encoding: &'static encoding_rs::Encoding, c: char, buf: &mut [u8; 8]) -> Option<usize> {
    let mut s = [0u8; 4];
    let src = c.encode_utf8(&mut s);
    let mut encoder = encoding.new_encoder();
    let (result, _read, written) = encoder.encode_from_utf8_without_replacement(src, buf, true);
    match result {
        encoding_rs::EncoderResult::InputEmpty if written > 0 => Some(written),
        _ => None,
    }
}

impl Profile {
    /// A profile of `encoding` for `paper`, named like the built-ins
    /// (`escpos-58-gb18030`) for 58 and 80 mm, `escpos-custom-…` otherwise.
    pub fn new(paper: Paper, encoding: Encoding) -> Profile {
        let name = match paper {
            Paper::Mm58 => format!("escpos-58-{}", encoding.name()),
            Paper::Mm80 => format!("escpos-80-{}", encoding.name()),
            Paper::Custom { columns, dots } => format!("escpos-custom-{columns}x{dots}-{}", encoding.name()),
        };
        Profile { name, columns: paper.columns(), dots: paper.dots(), encoding, code_table: None }
    }

    /// This printer as one whose print area is `dots` wide (what a printer reports of its
    /// own paper, such as Star's `X-Star-Print-Width`): the same encoding, a column of
    /// font A (12 dots) per 12 dots. Widths below a 58 mm roll's 384 dots, above 1,024 or
    /// equal to this profile's give this profile back.
    pub fn at_dots(&self, dots: u16) -> Profile {
        let dots = dots - dots % 8;
        if dots == self.dots || !(384..=1024).contains(&dots) {
            return self.clone();
        }
        Profile {
            name: format!("{}@{dots}", self.name),
            columns: dots / 12,
            dots,
            encoding: self.encoding,
            code_table: self.code_table,
        }
    }

    /// A built-in profile by name: `escpos-{58|80}-{encoding}` with encoding one of
    /// `gb18030`, `gbk`, `big5`, `shift-jis`, `cp437`, `cp850`, `cp858`.
    pub fn builtin(name: &str) -> Option<Profile> {
        let rest = name.strip_prefix("escpos-")?;
        let (mm, encoding) = rest.split_once('-')?;
        let paper = match mm {
            "58" => Paper::Mm58,
            "80" => Paper::Mm80,
            _ => return None,
        };
        Some(Profile::new(paper, Encoding::from_name(encoding)?))
    }

    /// The names [`Profile::builtin`] knows.
    pub fn builtin_names() -> Vec<String> {
        let mut names = Vec::new();
        for mm in ["58", "80"] {
            for e in Encoding::ALL {
                names.push(format!("escpos-{mm}-{}", e.name()));
            }
        }
        names
    }

    /// The default profile ([`DEFAULT_PROFILE`]) at the width of `paper`: what a preview
    /// without a printer uses for a document that names its paper.
    pub fn for_paper(paper: Paper) -> Profile {
        Profile::new(paper, Encoding::Gb18030)
    }

    /// The profile to preview `doc` with when no printer is known: its own paper (80 mm
    /// when it names none) with the default encoding.
    pub fn for_document(doc: &crate::Document) -> Profile {
        Profile::for_paper(doc.paper.unwrap_or(Paper::Mm80))
    }

    /// `ESC t n` number to send, if any.
    pub(crate) fn esc_t(&self) -> Option<u8> {
        if self.encoding.double_byte() {
            return None;
        }
        self.code_table.or(self.encoding.esc_t())
    }
}

impl Default for Profile {
    fn default() -> Profile {
        Profile::new(Paper::Mm80, Encoding::Gb18030)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_parse_and_default_exists() {
        for name in Profile::builtin_names() {
            let p = Profile::builtin(&name).expect(&name);
            assert_eq!(p.name, name);
        }
        assert_eq!(Profile::builtin(DEFAULT_PROFILE), Some(Profile::default()));
        assert_eq!(
            Profile::builtin("escpos-80-cp858").map(|p| (p.columns, p.dots, p.esc_t())),
            Some((48, 576, Some(19)))
        );
        assert_eq!(Profile::builtin("escpos-58-gb18030").map(|p| (p.columns, p.dots)), Some((32, 384)));
        assert_eq!(Profile::builtin("escpos-70-gb18030"), None);
        assert_eq!(Profile::builtin("escpos-80-latin"), None);
    }

    #[test]
    fn what_each_encoding_can_print() {
        let mut buf = [0u8; 8];
        assert_eq!(Encoding::Gb18030.encode_char('宫', &mut buf), Some(2));
        assert_eq!(&buf[..2], &[0xB9, 0xAC]);
        assert_eq!(Encoding::Gb18030.encode_char('㐀', &mut buf), Some(4));
        assert_eq!(Encoding::Gbk.encode_char('㐀', &mut buf), None);
        assert_eq!(Encoding::Gb18030.encode_char('😀', &mut buf), None);
        assert_eq!(Encoding::Gb18030.encode_char('€', &mut buf), Some(2));
        assert_eq!(Encoding::Gbk.encode_char('€', &mut buf), Some(2));
        assert_eq!(Encoding::Gb18030.encode_char('\u{E000}', &mut buf), None);
        assert_eq!(Encoding::Big5.encode_char('臺', &mut buf), Some(2));
        assert_eq!(Encoding::Big5.encode_char('宫', &mut buf), None);
        assert_eq!(Encoding::ShiftJis.encode_char('日', &mut buf), Some(2));
        assert_eq!(Encoding::ShiftJis.encode_char('ｱ', &mut buf), Some(1));
        assert_eq!(Encoding::ShiftJis.encode_char('¥', &mut buf), Some(1));
        assert_eq!(buf[0], 0x5C);
        assert_eq!(Encoding::Cp858.encode_char('€', &mut buf), Some(1));
        assert_eq!(buf[0], 0xD5);
        assert_eq!(Encoding::Cp437.encode_char('€', &mut buf), None);
        assert!(!Encoding::Cp858.can_encode('\u{301}'));
        // ¥ is only a four-byte code in GB18030; printers get the full-width ￥.
        assert_eq!(Encoding::Gb18030.encode_char('¥', &mut buf), Some(2));
        assert_eq!(&buf[..2], &[0xA3, 0xA4]);
        assert_eq!(Encoding::Gbk.encode_char('£', &mut buf), Some(2));
        assert_eq!(Encoding::Gbk.encode_char('¢', &mut buf), Some(2));
        assert_eq!(Encoding::Cp437.encode_char('¥', &mut buf), Some(1));
        assert!(Encoding::Cp858.can_encode('a'));
    }
}
