//! One-dimensional barcodes: validation, the data of `GS k`, and the bars for the preview.
//!
//! The printer draws the barcode itself from `GS k`; the bars computed here are for the
//! preview and for checking that the symbol fits the paper. Both come from the same
//! choice of code set, so the preview shows the symbol the printer prints.

use crate::doc::BarcodeKind;

/// Most characters of Code128 data: beyond that no receipt paper is wide enough.
const MAX_CODE128: usize = 64;

/// A barcode ready to print and to draw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Symbol {
    /// Modules left to right, `true` for a bar.
    pub bars: Vec<bool>,
    /// The human-readable text.
    pub text: String,
    /// `m` of `GS k m n d1…dn`.
    pub m: u8,
    /// `d1…dn` of `GS k`.
    pub data: Vec<u8>,
}

impl Symbol {
    /// Width in modules (no quiet zone: the printer adds none either).
    pub fn modules(&self) -> usize {
        self.bars.len()
    }
}

/// Checks `data` for `kind` and encodes it.
pub(crate) fn encode(kind: BarcodeKind, data: &str) -> Result<Symbol, String> {
    match kind {
        BarcodeKind::Code128 => code128(data),
        BarcodeKind::Ean13 => ean13(data),
    }
}

/// Element widths (bar, space, …) of Code128 symbol values 0–106 (106 = stop, which has
/// a seventh element).
const CODE128: [&str; 107] = [
    "212222", "222122", "222221", "121223", "121322", "131222", "122213", "122312", "132212", "221213", //
    "221312", "231212", "112232", "122132", "122231", "113222", "123122", "123221", "223211", "221132", //
    "221231", "213212", "223112", "312131", "311222", "321122", "321221", "312212", "322112", "322211", //
    "212123", "212321", "232121", "111323", "131123", "131321", "112313", "132113", "132311", "211313", //
    "231113", "231311", "112133", "112331", "132131", "113123", "113321", "133121", "313121", "211331", //
    "231131", "213113", "213311", "213131", "311123", "311321", "331121", "312113", "312311", "332111", //
    "314111", "221411", "431111", "111224", "111422", "121124", "121421", "141122", "141221", "112214", //
    "112412", "122114", "122411", "142112", "142211", "241211", "221114", "413111", "241112", "134111", //
    "111242", "121142", "121241", "114212", "124112", "124211", "411212", "421112", "421211", "212141", //
    "214121", "412121", "111143", "111341", "131141", "114113", "114311", "411113", "411311", "113141", //
    "114131", "311141", "411131", "211412", "211214", "211232", "2331112",
];
const START_B: u8 = 104;
const START_C: u8 = 105;
const STOP: u8 = 106;

fn push_pattern(bars: &mut Vec<bool>, widths: &str) {
    for (i, w) in widths.bytes().enumerate() {
        let bar = i % 2 == 0;
        for _ in 0..(w - b'0') {
            bars.push(bar);
        }
    }
}

fn code128(data: &str) -> Result<Symbol, String> {
    if data.is_empty() || data.len() > MAX_CODE128 {
        return Err(format!("Code128 data must be 1 to {MAX_CODE128} characters"));
    }
    if let Some(c) = data.chars().find(|c| !(' '..='~').contains(c)) {
        return Err(format!("Code128 prints ASCII characters from space to '~', not {c:?}"));
    }
    let bytes = data.as_bytes();
    // All digits in pairs: code set C packs two digits into one symbol, half the width.
    let set_c = bytes.len() & 1 == 0 && bytes.iter().all(u8::is_ascii_digit);
    let (start, values, escpos): (u8, Vec<u8>, Vec<u8>) = if set_c {
        let values: Vec<u8> = bytes.chunks(2).map(|p| (p[0] - b'0') * 10 + (p[1] - b'0')).collect();
        let mut escpos = b"{C".to_vec();
        escpos.extend_from_slice(&values);
        (START_C, values, escpos)
    } else {
        let values = bytes.iter().map(|b| b - b' ').collect();
        let mut escpos = b"{B".to_vec();
        for &b in bytes {
            // In GS k Code128 data `{` starts a code-set selector; a literal one is `{{`.
            if b == b'{' {
                escpos.push(b'{');
            }
            escpos.push(b);
        }
        (START_B, values, escpos)
    };
    let mut checksum = u32::from(start);
    for (i, &v) in values.iter().enumerate() {
        checksum += (i as u32 + 1) * u32::from(v);
    }
    let mut bars = Vec::with_capacity((values.len() + 3) * 11 + 2);
    push_pattern(&mut bars, CODE128[usize::from(start)]);
    for &v in &values {
        push_pattern(&mut bars, CODE128[usize::from(v)]);
    }
    push_pattern(&mut bars, CODE128[(checksum % 103) as usize]);
    push_pattern(&mut bars, CODE128[usize::from(STOP)]);
    Ok(Symbol { bars, text: data.to_string(), m: 73, data: escpos })
}

/// EAN-13 digit patterns: L (odd parity), and R (the complement of L). G is R reversed.
const EAN_L: [&str; 10] =
    ["0001101", "0011001", "0010011", "0111101", "0100011", "0110001", "0101111", "0111011", "0110111", "0001011"];
/// Which of the first six digits use G instead of L, by the leading digit.
const EAN_PARITY: [&str; 10] =
    ["LLLLLL", "LLGLGG", "LLGGLG", "LLGGGL", "LGLLGG", "LGGLLG", "LGGGLL", "LGLGLG", "LGLGGL", "LGGLGL"];

fn ean_check_digit(digits: &[u8]) -> u8 {
    let sum: u32 = digits.iter().enumerate().map(|(i, &d)| u32::from(d) * if i % 2 == 0 { 1 } else { 3 }).sum();
    ((10 - sum % 10) % 10) as u8
}

fn ean13(data: &str) -> Result<Symbol, String> {
    if !(data.len() == 12 || data.len() == 13) || !data.bytes().all(|b| b.is_ascii_digit()) {
        return Err("EAN-13 data must be 12 digits (the check digit is added) or 13 digits".into());
    }
    let mut digits: Vec<u8> = data.bytes().map(|b| b - b'0').collect();
    let check = ean_check_digit(&digits[..12]);
    if digits.len() == 13 && digits[12] != check {
        return Err(format!("wrong EAN-13 check digit {}; it should be {check}", digits[12]));
    }
    digits.truncate(12);
    digits.push(check);
    let mut bars = Vec::with_capacity(95);
    let push_bits = |bars: &mut Vec<bool>, bits: &str| bars.extend(bits.bytes().map(|b| b == b'1'));
    push_bits(&mut bars, "101");
    let parity = EAN_PARITY[usize::from(digits[0])].as_bytes();
    for (i, &d) in digits[1..7].iter().enumerate() {
        let l = EAN_L[usize::from(d)];
        if parity[i] == b'L' {
            push_bits(&mut bars, l);
        } else {
            // G: the R pattern (complement of L) reversed.
            bars.extend(l.bytes().rev().map(|b| b == b'0'));
        }
    }
    push_bits(&mut bars, "01010");
    for &d in &digits[7..13] {
        bars.extend(EAN_L[usize::from(d)].bytes().map(|b| b == b'0'));
    }
    push_bits(&mut bars, "101");
    let text: String = digits.iter().map(|d| char::from(b'0' + d)).collect();
    // The printer computes the check digit itself from the first twelve.
    Ok(Symbol { bars, text: text.clone(), m: 67, data: text.as_bytes()[..12].to_vec() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bits(s: &Symbol) -> String {
        s.bars.iter().map(|&b| if b { '1' } else { '0' }).collect()
    }

    #[test]
    fn ean13_matches_a_known_symbol() {
        // 4006381333931: a textbook example (Wikipedia's EAN-13 article).
        let s = encode(BarcodeKind::Ean13, "400638133393").unwrap();
        assert_eq!(s.text, "4006381333931");
        assert_eq!(s.modules(), 95);
        // Cross-checked with an independent implementation of the same tables.
        assert_eq!(
            bits(&s),
            "10100011010100111010111101111010001001011001101010100001010000101000010111010010000101100110101"
        );
        assert!(encode(BarcodeKind::Ean13, "4006381333931").is_ok());
        assert!(encode(BarcodeKind::Ean13, "4006381333932").is_err());
        assert!(encode(BarcodeKind::Ean13, "40063813339").is_err());
    }

    #[test]
    fn ean13_parities_are_a_code() {
        // Every leading digit but 0 puts exactly three of the six left digits in G, and
        // no two leading digits share a pattern (a scanner tells them apart by it).
        for (d, p) in EAN_PARITY.iter().enumerate() {
            let g = p.bytes().filter(|&b| b == b'G').count();
            assert_eq!(g, if d == 0 { 0 } else { 3 }, "{d}: {p}");
            assert!(p.starts_with('L'));
            assert_eq!(EAN_PARITY.iter().filter(|q| *q == p).count(), 1);
        }
        let s = encode(BarcodeKind::Ean13, "690123456789").unwrap();
        assert_eq!(s.text, "6901234567892");
        // L, G, G, G, L, L for the digits 9 0 1 2 3 4 after the leading 6.
        let left: String = bits(&s)[3..45].to_string();
        assert_eq!(left, "000101101001110110011001101101111010100011");
    }

    #[test]
    fn code128_picks_set_c_for_digit_pairs() {
        let c = encode(BarcodeKind::Code128, "123456").unwrap();
        assert_eq!(c.data, b"{C\x0c\x22\x38");
        assert_eq!(c.modules(), 11 * 6 + 2);
        let b = encode(BarcodeKind::Code128, "A{1").unwrap();
        assert_eq!(b.data, b"{BA{{1");
        // Start B, A(33), {(91), 1(17), checksum (104 + 33 + 182 + 51) % 103 = 61, stop.
        let mut want = Vec::new();
        for v in [104usize, 33, 91, 17, 61, 106] {
            push_pattern(&mut want, CODE128[v]);
        }
        assert_eq!(b.bars, want);
        assert!(encode(BarcodeKind::Code128, "é").is_err());
        assert!(encode(BarcodeKind::Code128, "").is_err());
    }
}
