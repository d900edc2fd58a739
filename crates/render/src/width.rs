//! How many columns of font A a character takes on a given printer.
//!
//! This is the printer's width, not a terminal's: in double-byte mode a Chinese printer
//! prints every character it gets as two bytes from its 24-dot font, `é` and `€` included,
//! so every non-ASCII character takes two columns there; a single-byte code page prints
//! every character it has in one column. A character the profile cannot encode is
//! printed as that many `?` ([`replacement`]), so the width never depends on whether
//! the printer has the character. The width is never smaller than the Unicode display
//! width (East Asian Wide = 2), so plain text laid out with it never overflows a
//! terminal line either.

use unicode_width::UnicodeWidthChar;

use crate::profile::Encoding;

/// Characters that are invisible by design (format controls, variation selectors, byte
/// order mark): left out without a warning, like control characters.
pub(crate) fn is_ignorable(c: char) -> bool {
    matches!(c,
        '\u{200B}'..='\u{200F}'
        | '\u{2028}'..='\u{202E}'
        | '\u{2060}'..='\u{206F}'
        | '\u{FE00}'..='\u{FE0F}'
        | '\u{FEFF}'
        | '\u{E0000}'..='\u{E007F}'
        | '\u{E0100}'..='\u{E01EF}')
}

/// Whether `c` is left out of the output without a word: control characters other
/// than tab (line breaks are handled before characters are measured) and [`is_ignorable`].
pub(crate) fn is_silent(c: char) -> bool {
    (c.is_control() && c != '\t') || is_ignorable(c)
}

/// The columns `c` takes on a printer with `encoding`: 0 for characters that are left out.
#[inline]
pub(crate) fn char_width(encoding: Encoding, c: char) -> u16 {
    if c.is_ascii() {
        // Tab prints as a space; other ASCII controls are dropped.
        return u16::from(c == '\t' || (' '..='~').contains(&c));
    }
    // The bulk of Chinese text, answered without the Unicode tables.
    if matches!(c, '\u{4E00}'..='\u{9FFF}' | '\u{FF01}'..='\u{FF60}') {
        return 2;
    }
    if is_silent(c) {
        return 0;
    }
    let unicode = UnicodeWidthChar::width(c).unwrap_or(0);
    if unicode == 0 {
        // Combining marks and the like: no printer font places them, so they are
        // dropped (with a warning when rendered).
        return 0;
    }
    match encoding {
        Encoding::Gb18030 | Encoding::Gbk | Encoding::Big5 => 2,
        // Half-width katakana, and the two JIS-Roman characters at 0x5C and 0x7E, are
        // single bytes in Shift_JIS and print half-width.
        Encoding::ShiftJis if matches!(c, '\u{FF61}'..='\u{FF9F}' | '¥' | '‾') => 1,
        Encoding::ShiftJis => 2,
        Encoding::Cp437 | Encoding::Cp850 | Encoding::Cp858 => match encoding.code_page() {
            Some(page) if page.encode(c).is_some() => 1,
            // Narrow or wide per Unicode: that many `?` are printed.
            _ => unicode.min(2) as u16,
        },
    }
}

/// The printed width of `s`: the sum of [`char_width`].
pub(crate) fn str_width(encoding: Encoding, s: &str) -> u16 {
    if let Some(w) = ascii_width(s) {
        return w;
    }
    s.chars().fold(0u16, |w, c| w.saturating_add(char_width(encoding, c)))
}

/// The width of a string of printable ASCII (the common case, one column per byte),
/// or `None` when `s` holds anything else.
#[inline]
pub(crate) fn ascii_width(s: &str) -> Option<u16> {
    if s.bytes().all(|b| (0x20..0x7F).contains(&b)) {
        u16::try_from(s.len()).ok()
    } else {
        None
    }
}

/// What is printed instead of a character the profile cannot encode, of the same
/// width so the layout does not move: an ASCII look-alike for common typographic
/// punctuation in one column (dashes, curly quotes, bullet, no-break space), otherwise
/// one `?` per column. Either way the caller reports it.
pub(crate) fn replacement(c: char, width: u16) -> &'static str {
    match width {
        0 => "",
        1 => match c {
            '\u{2010}'..='\u{2015}' | '\u{2212}' => "-",
            '\u{2018}'..='\u{201B}' | '\u{2032}' => "'",
            '\u{201C}'..='\u{201F}' | '\u{2033}' => "\"",
            '\u{2022}' | '\u{2027}' => "*",
            '\u{00A0}' | '\u{2000}'..='\u{200A}' | '\u{202F}' | '\u{205F}' => " ",
            _ => "?",
        },
        _ => "??",
    }
}

/// The Unicode display width of `s` as a terminal shows it (East Asian Wide = 2).
/// Used by tests and by the text renderer to pad lines to the printer's columns.
pub fn display_width(s: &str) -> usize {
    s.chars().map(|c| if c.is_control() { 0 } else { UnicodeWidthChar::width(c).unwrap_or(0) }).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widths_follow_the_printer() {
        assert_eq!(char_width(Encoding::Gb18030, 'a'), 1);
        assert_eq!(char_width(Encoding::Gb18030, '宫'), 2);
        assert_eq!(char_width(Encoding::Gb18030, 'é'), 2);
        assert_eq!(char_width(Encoding::Cp858, 'é'), 1);
        assert_eq!(char_width(Encoding::Cp858, '€'), 1);
        assert_eq!(char_width(Encoding::Cp437, '€'), 1);
        assert_eq!(char_width(Encoding::Cp858, '宫'), 2);
        assert_eq!(char_width(Encoding::ShiftJis, 'ｱ'), 1);
        assert_eq!(char_width(Encoding::ShiftJis, 'あ'), 2);
        assert_eq!(char_width(Encoding::Gb18030, '\u{301}'), 0);
        assert_eq!(char_width(Encoding::Gb18030, '\u{FEFF}'), 0);
        assert_eq!(char_width(Encoding::Cp858, '\u{1B}'), 0);
        assert_eq!(char_width(Encoding::Cp858, '\t'), 1);
        assert_eq!(str_width(Encoding::Gb18030, "宫保 x1"), 7);
    }

    #[test]
    fn printer_width_is_never_below_display_width() {
        for enc in Encoding::ALL {
            for c in ['a', 'é', '€', '宫', '😀', '─', '×', 'ｱ', '¥', 'Ω', '한', '\u{301}'] {
                assert!(usize::from(char_width(enc, c)) >= display_width(&c.to_string()), "{enc:?} {c}");
            }
        }
    }
}
