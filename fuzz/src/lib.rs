//! Checks shared by the fuzz targets (see docs/FUZZING.md).

use onceprint_escpos::parse::{Event, Parser};
use onceprint_render::{display_width, parse_document, to_escpos, to_text, Block, Document, Profile};

/// A document that was accepted (by `parse_document` or `parse_markup`) must print:
/// - with the profile for its own paper it always renders to ESC/POS;
/// - with `other`, a printer it was not laid out for, it renders or fails naming a field;
/// - the ESC/POS bytes parse completely (nothing left half-read) into exactly the commands
///   the document asked for: no unknown command, stray control byte, status or
///   printed-ACK request (document text never becomes a command), and one cut per cut
///   block;
/// - no line of the text rendering is wider than the printer's paper.
pub fn check_prints(doc: &Document, other: &Profile) {
    let own = Profile::for_document(doc);
    let rendered = match to_escpos(doc, &own) {
        Ok(r) => r,
        Err(e) => panic!("an accepted document does not render for its own paper: {e}"),
    };
    check_escpos(doc, &rendered.bytes);
    check_text(doc, &own);
    match to_escpos(doc, other) {
        Ok(r) => check_escpos(doc, &r.bytes),
        Err(e) => assert!(e.path().is_some(), "a render error that names no field: {e}"),
    }
    check_text(doc, other);
}

fn check_escpos(doc: &Document, bytes: &[u8]) {
    let mut parser = Parser::new();
    let events = parser.push_sized(bytes);
    assert_eq!(parser.buffered(), 0, "the rendered stream ends inside a command");
    let total: usize = events.iter().map(|(_, n)| n).sum();
    assert_eq!(total, bytes.len(), "the rendered stream announces data it does not carry");
    let mut cuts = 0;
    for (event, _) in &events {
        match event {
            Event::Unknown { .. } | Event::Control(_) | Event::StatusRequest(_) | Event::ProcessIdRequest(_) => {
                panic!("the rendered stream holds {event:?}, which no block asked for")
            }
            Event::Cut { .. } => cuts += 1,
            _ => {}
        }
    }
    let want = doc.blocks.iter().filter(|b| matches!(b, Block::Cut(_))).count();
    assert_eq!(cuts, want, "cuts printed vs cut blocks");
}

fn check_text(doc: &Document, profile: &Profile) {
    let columns = usize::from(profile.columns.max(1));
    for line in to_text(doc, profile).lines() {
        assert!(
            display_width(line) <= columns,
            "a text line of {} columns on {columns}: {line:?}",
            display_width(line)
        );
    }
}

/// A document's serialized normal form reads back as the same document, and serializes
/// to the same JSON again.
pub fn check_round_trip(doc: &Document) {
    let value = serde_json::to_value(doc).expect("a document serializes");
    match parse_document(&value) {
        Ok(again) => {
            assert_eq!(&again, doc, "the normal form {value} reads back differently");
            assert_eq!(serde_json::to_value(&again).expect("serializes"), value);
        }
        Err(e) => panic!("the normal form {value} of an accepted document is refused: {e}"),
    }
}

/// A built-in profile picked by `n`, so that documents also meet printers they were not
/// written for (other paper widths and encodings).
pub fn builtin_profile(n: usize) -> Profile {
    let names = Profile::builtin_names();
    names.get(n % names.len().max(1)).and_then(|name| Profile::builtin(name)).unwrap_or_default()
}
