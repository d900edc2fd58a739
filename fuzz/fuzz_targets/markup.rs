//! `parse_markup` on any text (bytes that are not UTF-8 are read lossily).
//!
//! Checks: a refusal is a `Markup` error whose line and column are inside the input; an
//! accepted document ends with a cut, has at most `MAX_BLOCKS` blocks, no line break or
//! carriage return inside a span, reads back unchanged from its JSON normal form (when
//! it is within the JSON document's limits, see docs/FUZZING.md), and prints (see
//! `onceprint_fuzz::check_prints`).

#![no_main]

use libfuzzer_sys::fuzz_target;
use onceprint_fuzz::{builtin_profile, check_prints, check_round_trip};
use onceprint_render::{parse_markup, Block, Document, RenderError};

/// Limits a JSON document has that markup, with its own 64 KiB limit, does not: a line of
/// markup may hold more spans or characters than one JSON text block.
const MAX_SPANS: usize = 64;
const MAX_TEXT_CHARS: usize = 4096;

fn within_json_limits(doc: &Document) -> bool {
    doc.blocks.iter().all(|b| match b {
        Block::Text(t) => {
            t.spans.len() <= MAX_SPANS && t.spans.iter().all(|s| s.text.chars().count() <= MAX_TEXT_CHARS)
        }
        _ => true,
    })
}

fuzz_target!(|data: &[u8]| {
    let src = String::from_utf8_lossy(data);
    match parse_markup(&src) {
        Err(RenderError::Markup { line, column, message }) => {
            let lines: Vec<&str> = src.split('\n').collect();
            assert!(line >= 1 && line <= lines.len(), "line {line} of {}: {message}", lines.len());
            let chars = lines[line - 1].chars().count();
            assert!(column >= 1 && column <= chars + 1, "column {column} of a {chars}-character line: {message}");
        }
        Err(other) => panic!("markup refused with a non-markup error: {other:?}"),
        Ok(doc) => {
            assert!(matches!(doc.blocks.last(), Some(Block::Cut(_))), "a markup document always ends with a cut");
            assert!(doc.blocks.len() <= 1000);
            for b in &doc.blocks {
                if let Block::Text(t) = b {
                    assert!(!t.spans.is_empty());
                    for s in &t.spans {
                        assert!(!s.text.contains(['\n', '\r']), "a line break inside a span: {:?}", s.text);
                    }
                }
            }
            if within_json_limits(&doc) {
                check_round_trip(&doc);
            }
            check_prints(&doc, &builtin_profile(data.len()));
        }
    }
});
