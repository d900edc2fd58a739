//! Plain text as ESC/POS: the bytes the broker sends for `content.type = "text"`, and the
//! way back from printed bytes to text (used by the simulator's paper log).
//!
//! Chinese printers expect GB18030 (or its GBK subset) in double-byte mode, entered with
//! `FS &`; Western printers start in a single-byte code page, PC437 by default. A text
//! that is pure ASCII is the same in both, so it is sent as is and prints on either kind;
//! any other text switches to double-byte mode and GB18030, which can encode every
//! Unicode character.

use encoding_rs::GB18030;

/// `ESC @`: initialise the printer, so no style left over from an earlier job leaks in.
const INIT: [u8; 2] = [0x1B, 0x40];
/// `FS &`: enter double-byte (Kanji/Hanzi) character mode.
const DOUBLE_BYTE_ON: [u8; 2] = [0x1C, 0x26];
/// `ESC d 3`: print the buffer and feed three lines, so the last line clears the cutter.
const FEED_3: [u8; 3] = [0x1B, 0x64, 0x03];
/// `GS V 66 0`: feed to the cutting position and cut partially (one point left), the
/// usual receipt cut.
const PARTIAL_CUT: [u8; 4] = [0x1D, 0x56, 0x42, 0x00];

/// The ESC/POS bytes of a plain-text job: `ESC @`, then the text (GB18030 after `FS &`
/// when it contains anything but ASCII), `ESC d 3` and a partial cut with feed.
///
/// Line feeds stay `LF` and tabs stay `HT`. Every other control character (C0, DEL, C1)
/// is removed, `CR` included: the printer would execute such a byte as a command, so a
/// text holding a stray `GS V` would cut in the middle of a receipt and one holding a
/// `GS ( H` could even forge the printed-acknowledgement of another job. GB18030 encodes
/// every non-ASCII character with bytes of 0x30 and above, so the encoded text itself
/// can never contain a command.
pub fn text_job(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len() * 2 + INIT.len() + DOUBLE_BYTE_ON.len() + 7);
    out.extend_from_slice(&INIT);
    push_text(&mut out, text);
    out.extend_from_slice(&FEED_3);
    out.extend_from_slice(&PARTIAL_CUT);
    out
}

/// `ESC @` and one line of text (cleaned and encoded as in [`text_job`]), leaving the
/// printer in single-byte mode, for a header printed in front of another job (the
/// "REPRINT n" banner). No feed, no cut.
pub fn header_line(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len() * 2 + 8);
    out.extend_from_slice(&INIT);
    let double = push_text(&mut out, text);
    out.push(b'\n');
    if double {
        out.extend_from_slice(&[0x1C, 0x2E]); // FS . leaves double-byte mode
    }
    out
}

/// Appends cleaned, encoded text; returns whether double-byte mode was entered.
fn push_text(out: &mut Vec<u8>, text: &str) -> bool {
    let clean: String = text.chars().filter(|&c| c == '\n' || c == '\t' || !c.is_control()).collect();
    if clean.is_ascii() {
        out.extend_from_slice(clean.as_bytes());
        false
    } else {
        out.extend_from_slice(&DOUBLE_BYTE_ON);
        // GB18030 covers all of Unicode, so the encoder never substitutes anything and
        // its "had errors" flag can be ignored.
        let (encoded, _, _) = GB18030.encode(&clean);
        out.extend_from_slice(&encoded);
        true
    }
}

/// Decodes printable bytes as the printer would render them: GB18030 in double-byte
/// mode, otherwise code page PC437 (ASCII as is, the upper half as its PC437 glyphs).
/// Malformed GB18030 sequences become U+FFFD.
pub fn decode_text(bytes: &[u8], double_byte: bool) -> String {
    if double_byte {
        GB18030.decode_without_bom_handling(bytes).0.into_owned()
    } else {
        bytes
            .iter()
            .map(|&b| if b < 0x80 { char::from(b) } else { crate::codepage::CP437_HIGH[usize::from(b - 0x80)] })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ascii_text_is_sent_as_is() {
        let job = text_job("Table 5\n1 x Noodles\n");
        let mut want = vec![0x1B, 0x40];
        want.extend_from_slice(b"Table 5\n1 x Noodles\n");
        want.extend_from_slice(&[0x1B, 0x64, 0x03, 0x1D, 0x56, 0x42, 0x00]);
        assert_eq!(job, want);
    }

    #[test]
    fn chinese_text_enters_double_byte_mode_and_is_gb18030() {
        let job = text_job("宫保鸡丁 x1");
        assert_eq!(&job[..4], &[0x1B, 0x40, 0x1C, 0x26]);
        // 宫 = B9AC, 保 = B1A3, 鸡 = BCA6, 丁 = B6A1 in GB2312/GBK/GB18030.
        assert_eq!(&job[4..12], &[0xB9, 0xAC, 0xB1, 0xA3, 0xBC, 0xA6, 0xB6, 0xA1]);
        assert_eq!(&job[12..15], b" x1");
        assert_eq!(&job[15..], &[0x1B, 0x64, 0x03, 0x1D, 0x56, 0x42, 0x00]);
        assert_eq!(decode_text(&job[4..15], true), "宫保鸡丁 x1");
    }

    #[test]
    fn control_characters_cannot_smuggle_commands() {
        let job = text_job("a\x1d(H\x06\x0000AAAA\x1dV\x00b\r\n\tc\x7f\u{85}");
        assert_eq!(&job[2..job.len() - 7], b"a(H00AAAAVb\n\tc");
    }

    #[test]
    fn single_byte_decoding_is_pc437() {
        assert_eq!(decode_text(b"Caf\x82 \x9c1", false), "Café £1");
        assert_eq!(decode_text(&[0xFF], false), "\u{A0}");
    }
}
