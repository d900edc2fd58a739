//! QR codes: whether a payload fits a symbol, how big the printer's symbol will be, and
//! the modules of the symbol for the preview.

use crate::doc::EcLevel;

/// Bytes a QR symbol holds in byte mode, by error-correction level (L, M, Q, H) and
/// version (1–40). Computed with the `qrcode` crate's bit-stream builder; byte mode is
/// the worst case, so a symbol never needs more modules than this table says.
const BYTE_CAPACITY: [[u16; 40]; 4] = [
    [
        17, 32, 53, 78, 106, 134, 154, 192, 230, 271, 321, 367, 425, 458, 520, 586, 644, 718, 792, 858, 929, 1003,
        1091, 1171, 1273, 1367, 1465, 1528, 1628, 1732, 1840, 1952, 2068, 2188, 2303, 2431, 2563, 2699, 2809, 2953,
    ],
    [
        14, 26, 42, 62, 84, 106, 122, 152, 180, 213, 251, 287, 331, 362, 412, 450, 504, 560, 624, 666, 711, 779, 857,
        911, 997, 1059, 1125, 1190, 1264, 1370, 1452, 1538, 1628, 1722, 1809, 1911, 1989, 2099, 2213, 2331,
    ],
    [
        11, 20, 32, 46, 60, 74, 86, 108, 130, 151, 177, 203, 241, 258, 292, 322, 364, 394, 442, 482, 509, 565, 611,
        661, 715, 751, 805, 868, 908, 982, 1030, 1112, 1168, 1228, 1283, 1351, 1423, 1499, 1579, 1663,
    ],
    [
        7, 14, 24, 34, 44, 58, 64, 84, 98, 119, 137, 155, 177, 194, 220, 250, 280, 310, 338, 382, 403, 439, 461, 511,
        535, 593, 625, 658, 698, 742, 790, 842, 898, 958, 983, 1051, 1093, 1139, 1219, 1273,
    ],
];

fn level_index(ec: EcLevel) -> usize {
    match ec {
        EcLevel::L => 0,
        EcLevel::M => 1,
        EcLevel::Q => 2,
        EcLevel::H => 3,
    }
}

/// Whether `data` fits a QR symbol at `ec`.
pub(crate) fn check(data: &str, ec: EcLevel) -> Result<(), String> {
    if data.is_empty() {
        return Err("must not be empty".into());
    }
    let max = BYTE_CAPACITY[level_index(ec)][39];
    if data.len() > usize::from(max) {
        return Err(format!("{} bytes; a QR code at error correction {ec:?} holds at most {max}", data.len()));
    }
    Ok(())
}

/// Modules per side of the symbol the printer makes of `len` bytes: the printer picks
/// the version, and byte mode is the largest it can need. `None` when it does not fit.
pub(crate) fn modules(len: usize, ec: EcLevel) -> Option<usize> {
    let caps = &BYTE_CAPACITY[level_index(ec)];
    let version = caps.iter().position(|&cap| usize::from(cap) >= len)? + 1;
    Some(17 + 4 * version)
}

/// The symbol's modules (row-major, `true` = dark) and its width, for the preview.
pub(crate) fn matrix(data: &str, ec: EcLevel) -> Option<(usize, Vec<bool>)> {
    let level = match ec {
        EcLevel::L => qrcode::EcLevel::L,
        EcLevel::M => qrcode::EcLevel::M,
        EcLevel::Q => qrcode::EcLevel::Q,
        EcLevel::H => qrcode::EcLevel::H,
    };
    let code = qrcode::QrCode::with_error_correction_level(data.as_bytes(), level).ok()?;
    let width = code.width();
    let dark = code.to_colors().into_iter().map(|c| c == qrcode::Color::Dark).collect();
    Some((width, dark))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_matches_the_encoder() {
        for ec in [EcLevel::L, EcLevel::M, EcLevel::Q, EcLevel::H] {
            for len in [1, 14, 15, 100, 1000, 1273] {
                let data = "é".repeat(len / 2) + &"x".repeat(len % 2);
                let (width, _) = matrix(&data, ec).unwrap_or((0, Vec::new()));
                // The encoder may do better than byte mode, never worse.
                let estimate = modules(data.len(), ec).unwrap_or(0);
                assert!(width > 0 && width <= estimate, "{ec:?} {len}: {width} > {estimate}");
            }
        }
        assert_eq!(modules(17, EcLevel::L), Some(21));
        assert_eq!(modules(18, EcLevel::L), Some(25));
        assert_eq!(modules(2954, EcLevel::L), None);
        assert!(check("", EcLevel::M).is_err());
        assert!(check(&"a".repeat(2331), EcLevel::M).is_ok());
        assert!(check(&"a".repeat(2332), EcLevel::M).is_err());
    }
}
