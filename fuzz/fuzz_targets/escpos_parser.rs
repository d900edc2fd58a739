//! The streaming ESC/POS parser (`onceprint_escpos::parse`) on any byte stream.
//!
//! The first byte chooses the power-on character mode (bit 0) and seeds the chunking; the
//! rest is the stream. Checks:
//! - the events do not depend on how the stream is cut into pushes (after joining text
//!   pieces), nor do the byte counts they stand for;
//! - every byte is accounted for: the events' sizes plus what is buffered cover the stream
//!   exactly, or overshoot by data a command announced that has not arrived yet, and then
//!   nothing is buffered; feeding that data yields no event and leaves nothing behind;
//! - buffering is bounded (the longest command read whole is `GS ( k` with 65535 bytes);
//! - text events are never empty and never carry a command or control byte;
//! - after a stream that ends between commands, a `GS ( H` printed-ACK request is found.

#![no_main]

use libfuzzer_sys::fuzz_target;
use onceprint_escpos::ack;
use onceprint_escpos::parse::{coalesce, Event, Parser};

/// Longest command the parser holds in memory: `GS ( k pL pH` + 65535 bytes.
const MAX_BUFFERED: usize = 5 + 65535;

fn parser(double_byte: bool) -> Parser {
    if double_byte {
        Parser::with_double_byte_default(true)
    } else {
        Parser::new()
    }
}

/// Whether a multi-part command (`ESC &`, `FS q`) still expects parts after `events`.
fn continuation_pending(events: &[Event]) -> bool {
    let mut left: u32 = 0;
    for e in events {
        match e {
            Event::Command { name: "ESC &", params } => {
                left = match params[..] {
                    [_, c1, c2] if c2 >= c1 => u32::from(c2 - c1) + 1,
                    _ => 0,
                }
            }
            Event::Command { name: "FS q", params } => left = params.first().copied().map_or(0, u32::from),
            Event::Skipped { name: "ESC & character" | "FS q image", .. } => left = left.saturating_sub(1),
            _ if left > 0 => panic!("{e:?} in the middle of a multi-part command"),
            _ => {}
        }
    }
    left > 0
}

fuzz_target!(|data: &[u8]| {
    let Some((&head, stream)) = data.split_first() else { return };
    let double_byte = head & 1 == 1;

    // The whole stream at once.
    let mut whole = parser(double_byte);
    let sized = whole.push_sized(stream);
    let buffered = whole.buffered();
    assert!(buffered <= MAX_BUFFERED, "{buffered} bytes buffered");
    let total: usize = sized.iter().map(|(_, n)| n).sum();
    assert!(
        total + buffered >= stream.len(),
        "{} bytes of {} unaccounted for",
        stream.len() - total - buffered,
        stream.len()
    );
    let announced = total + buffered - stream.len();
    if announced > 0 {
        assert_eq!(buffered, 0, "bytes buffered while announced data is still awaited");
    }
    let events: Vec<Event> = sized.iter().map(|(e, _)| e.clone()).collect();
    for e in &events {
        if let Event::Text(t) = e {
            assert!(!t.is_empty(), "an empty text event");
            assert!(
                t.iter().all(|&b| b >= 0x20 || matches!(b, b'\t' | b'\n' | b'\r')),
                "control bytes inside text: {t:02X?}"
            );
        }
    }

    // The same stream in pieces whose sizes come from a generator seeded by the head byte.
    let mut pieces = parser(double_byte);
    let mut chunked = Vec::new();
    let mut rest = stream;
    let mut state = u32::from(head) | 0x100;
    while !rest.is_empty() {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        let n = (state as usize % 17).min(rest.len());
        let (piece, after) = rest.split_at(n);
        chunked.extend(pieces.push_sized(piece));
        rest = after;
    }
    let chunked_total: usize = chunked.iter().map(|(_, n)| n).sum();
    assert_eq!(chunked_total, total, "chunking changed the byte counts");
    assert_eq!(pieces.buffered(), buffered, "chunking changed what is buffered");
    assert_eq!(pieces.double_byte(), whole.double_byte());
    let chunked: Vec<Event> = chunked.into_iter().map(|(e, _)| e).collect();
    let joined = coalesce(events.iter().cloned());
    assert_eq!(coalesce(chunked), joined, "chunking changed the events");

    // The announced data, once it arrives, is skipped unread and leaves nothing behind.
    let mut synced = announced == 0;
    if announced > 0 && announced <= 1 << 20 {
        let filler = vec![0x1D; announced];
        assert_eq!(whole.push(&filler), vec![], "announced data produced events");
        assert_eq!(whole.buffered(), 0);
        synced = true;
    }

    // Between commands, the printed-ACK request is always recognised.
    if synced && buffered == 0 && !continuation_pending(&joined) {
        let id = *b"FZ01";
        let after = whole.push(&ack::request(id));
        assert_eq!(after, vec![Event::ProcessIdRequest(id)], "the ACK request was not found after {joined:?}");
    }
});
