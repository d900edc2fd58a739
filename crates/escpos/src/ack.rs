//! The printed-ACK: `GS ( H` fn 48, "transmit process ID response".
//!
//! Request: `1D 28 48 06 00 30 30 d1 d2 d3 d4`. After the printer has processed everything
//! sent before the request (printed and cut), it answers `37 22 d1 d2 d3 d4 00`. The four
//! id bytes must be printable ASCII (0x20–0x7E); onceprint makes them unique per delivery
//! attempt so a late reply can never be credited to another job.

/// The request for process ID `id`.
pub fn request(id: [u8; 4]) -> [u8; 11] {
    [0x1D, 0x28, 0x48, 0x06, 0x00, 0x30, 0x30, id[0], id[1], id[2], id[3]]
}

/// The printer's reply for process ID `id`.
pub fn reply(id: [u8; 4]) -> [u8; 7] {
    [0x37, 0x22, id[0], id[1], id[2], id[3], 0x00]
}

/// Whether `id` is a valid process ID (four printable ASCII bytes).
pub fn is_valid_id(id: [u8; 4]) -> bool {
    id.iter().all(|b| (0x20..=0x7E).contains(b))
}

/// A process ID from a number: base-95 over the printable range, so 95⁴ ≈ 81 million
/// distinct ids before a repeat.
pub fn id_from(n: u64) -> [u8; 4] {
    let mut id = [0x20u8; 4];
    let mut v = n % 95u64.pow(4);
    for slot in id.iter_mut().rev() {
        *slot = 0x20 + (v % 95) as u8;
        v /= 95;
    }
    id
}

/// Finds a process ID reply in bytes read from the printer. Returns the id and how many
/// bytes up to the end of the reply were consumed; bytes before it (status bytes pushed
/// by the printer, noise) are skipped. `None` while no complete reply is in `buf`.
pub fn find_reply(buf: &[u8]) -> Option<([u8; 4], usize)> {
    let mut i = 0;
    while i + 7 <= buf.len() {
        if buf[i] == 0x37 && buf[i + 1] == 0x22 && buf[i + 6] == 0x00 {
            let id = [buf[i + 2], buf[i + 3], buf[i + 4], buf[i + 5]];
            if is_valid_id(id) {
                return Some((id, i + 7));
            }
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_and_reply_bytes_match_the_manual() {
        let id = *b"AB12";
        assert_eq!(request(id), [0x1D, 0x28, 0x48, 0x06, 0x00, 0x30, 0x30, b'A', b'B', b'1', b'2']);
        assert_eq!(reply(id), [0x37, 0x22, b'A', b'B', b'1', b'2', 0x00]);
    }

    #[test]
    fn ids_are_printable_and_distinct() {
        let mut seen = std::collections::HashSet::new();
        for n in 0..10_000 {
            let id = id_from(n);
            assert!(is_valid_id(id));
            assert!(seen.insert(id));
        }
    }

    #[test]
    fn replies_are_found_behind_noise_and_split_reads() {
        let id = id_from(123_456);
        let mut buf = vec![0x12, 0x12];
        buf.extend_from_slice(&reply(id));
        assert_eq!(find_reply(&buf), Some((id, 9)));
        assert_eq!(find_reply(&buf[..8]), None, "incomplete reply");
    }
}
