//! Single-byte code pages of ESC/POS printers (`ESC t n`): which character each byte in
//! 0x80–0xFF prints as, and back.
//!
//! Western printers start in PC437; receipts in euro countries need PC858 (PC850 with
//! the euro sign at 0xD5). The number `n` of `ESC t n` differs between manufacturers;
//! [`CodePage::epson_number`] is Epson's numbering, which most clones copy for these
//! three pages.

/// A single-byte code page whose bytes 0x00–0x7F are ASCII.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CodePage {
    /// IBM PC437, the power-on page (`ESC t 0`).
    Pc437,
    /// IBM PC850, Multilingual Latin 1 (`ESC t 2`).
    Pc850,
    /// IBM PC858: PC850 with `€` at 0xD5 instead of `ı` (`ESC t 19`).
    Pc858,
}

impl CodePage {
    /// The `n` of `ESC t n` selecting this page on Epson printers and their clones.
    pub fn epson_number(self) -> u8 {
        match self {
            CodePage::Pc437 => 0,
            CodePage::Pc850 => 2,
            CodePage::Pc858 => 19,
        }
    }

    /// The page an `ESC t n` selects, in Epson's numbering, when it is one of ours.
    pub fn from_epson_number(n: u8) -> Option<CodePage> {
        match n {
            0 => Some(CodePage::Pc437),
            2 => Some(CodePage::Pc850),
            19 => Some(CodePage::Pc858),
            _ => None,
        }
    }

    /// Lower-case name, as used in transcripts and profiles: `cp437`, `cp850`, `cp858`.
    pub fn name(self) -> &'static str {
        match self {
            CodePage::Pc437 => "cp437",
            CodePage::Pc850 => "cp850",
            CodePage::Pc858 => "cp858",
        }
    }

    fn high(self) -> &'static [char; 128] {
        match self {
            CodePage::Pc437 => &CP437_HIGH,
            CodePage::Pc850 => &CP850_HIGH,
            CodePage::Pc858 => &CP858_HIGH,
        }
    }

    /// The character byte `b` prints as. Bytes below 0x80 are ASCII (control bytes
    /// included: deciding what is a command is the parser's job, not the code page's).
    pub fn decode(self, b: u8) -> char {
        match b.checked_sub(0x80) {
            None => char::from(b),
            Some(i) => self.high()[usize::from(i)],
        }
    }

    /// The byte printing `c`, if this page has it. ASCII maps to itself.
    pub fn encode(self, c: char) -> Option<u8> {
        if c.is_ascii() {
            // Lossless: an ASCII char is below 0x80.
            return u8::try_from(u32::from(c)).ok();
        }
        // A linear scan of 128 entries: only non-ASCII characters get here, and receipts
        // have few of them, so a reverse index is not worth its memory.
        let i = self.high().iter().position(|&h| h == c)?;
        u8::try_from(i + 0x80).ok()
    }
}

/// The upper half (0x80–0xFF) of code page 437.
pub const CP437_HIGH: [char; 128] = [
    'Ç', 'ü', 'é', 'â', 'ä', 'à', 'å', 'ç', 'ê', 'ë', 'è', 'ï', 'î', 'ì', 'Ä', 'Å', //
    'É', 'æ', 'Æ', 'ô', 'ö', 'ò', 'û', 'ù', 'ÿ', 'Ö', 'Ü', '¢', '£', '¥', '₧', 'ƒ', //
    'á', 'í', 'ó', 'ú', 'ñ', 'Ñ', 'ª', 'º', '¿', '⌐', '¬', '½', '¼', '¡', '«', '»', //
    '░', '▒', '▓', '│', '┤', '╡', '╢', '╖', '╕', '╣', '║', '╗', '╝', '╜', '╛', '┐', //
    '└', '┴', '┬', '├', '─', '┼', '╞', '╟', '╚', '╔', '╩', '╦', '╠', '═', '╬', '╧', //
    '╨', '╤', '╥', '╙', '╘', '╒', '╓', '╫', '╪', '┘', '┌', '█', '▄', '▌', '▐', '▀', //
    'α', 'ß', 'Γ', 'π', 'Σ', 'σ', 'µ', 'τ', 'Φ', 'Θ', 'Ω', 'δ', '∞', 'φ', 'ε', '∩', //
    '≡', '±', '≥', '≤', '⌠', '⌡', '÷', '≈', '°', '∙', '·', '√', 'ⁿ', '²', '■', '\u{00A0}', //
];

/// The upper half (0x80–0xFF) of code page 850.
pub const CP850_HIGH: [char; 128] = [
    'Ç', 'ü', 'é', 'â', 'ä', 'à', 'å', 'ç', 'ê', 'ë', 'è', 'ï', 'î', 'ì', 'Ä', 'Å', //
    'É', 'æ', 'Æ', 'ô', 'ö', 'ò', 'û', 'ù', 'ÿ', 'Ö', 'Ü', 'ø', '£', 'Ø', '×', 'ƒ', //
    'á', 'í', 'ó', 'ú', 'ñ', 'Ñ', 'ª', 'º', '¿', '®', '¬', '½', '¼', '¡', '«', '»', //
    '░', '▒', '▓', '│', '┤', 'Á', 'Â', 'À', '©', '╣', '║', '╗', '╝', '¢', '¥', '┐', //
    '└', '┴', '┬', '├', '─', '┼', 'ã', 'Ã', '╚', '╔', '╩', '╦', '╠', '═', '╬', '¤', //
    'ð', 'Ð', 'Ê', 'Ë', 'È', 'ı', 'Í', 'Î', 'Ï', '┘', '┌', '█', '▄', '¦', 'Ì', '▀', //
    'Ó', 'ß', 'Ô', 'Ò', 'õ', 'Õ', 'µ', 'þ', 'Þ', 'Ú', 'Û', 'Ù', 'ý', 'Ý', '¯', '´', //
    '\u{00AD}', '±', '‗', '¾', '¶', '§', '÷', '¸', '°', '¨', '·', '¹', '³', '²', '■', '\u{00A0}', //
];

/// The upper half (0x80–0xFF) of code page 858: code page 850 with `€` at 0xD5.
pub const CP858_HIGH: [char; 128] = {
    let mut t = CP850_HIGH;
    t[0xD5 - 0x80] = '€';
    t
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_round_trips() {
        for page in [CodePage::Pc437, CodePage::Pc850, CodePage::Pc858] {
            for b in 0x20..=0xFFu8 {
                assert_eq!(page.encode(page.decode(b)), Some(b), "{page:?} {b:#04X}");
            }
            assert_eq!(CodePage::from_epson_number(page.epson_number()), Some(page));
        }
    }

    #[test]
    fn the_euro_is_only_in_858() {
        assert_eq!(CodePage::Pc858.encode('€'), Some(0xD5));
        assert_eq!(CodePage::Pc850.encode('€'), None);
        assert_eq!(CodePage::Pc850.encode('ı'), Some(0xD5));
        assert_eq!(CodePage::Pc437.encode('é'), Some(0x82));
        assert_eq!(CodePage::Pc437.encode('宫'), None);
    }
}
