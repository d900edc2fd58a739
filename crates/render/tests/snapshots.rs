//! Snapshot tests of rendered documents: the ESC/POS bytes as a transcript (decoded with
//! the printer-side parser of `onceprint-escpos`), the plain text, and the PNG preview,
//! whose files are checked in next to the snapshots (`tests/snapshots/*.snap.png`).
//!
//! After a deliberate change, review and accept with `cargo insta review` or
//! `INSTA_UPDATE=always cargo test -p onceprint-render --test snapshots`, then look at
//! the PNGs.

use std::fmt::Write as _;

use onceprint_escpos::parse::{coalesce, Event, Parser};
use onceprint_escpos::text::decode_text;
use onceprint_escpos::transcript::{transcript, DoubleByteCharset, Options};
use onceprint_render::{parse_document, parse_markup, to_escpos, to_png, to_text, Block, Document, Encoding, Profile};

fn fixture(name: &str) -> String {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn document(name: &str) -> Document {
    let value: serde_json::Value = serde_json::from_str(&fixture(name)).expect("fixture is JSON");
    parse_document(&value).expect("fixture is a valid document")
}

fn profile(name: &str) -> Profile {
    Profile::builtin(name).expect("built-in profile")
}

/// The transcript of the ESC/POS output, followed by the warnings.
fn escpos_snapshot(doc: &Document, profile: &Profile) -> String {
    let rendered = to_escpos(doc, profile).expect("renders");
    let charset = match profile.encoding {
        Encoding::Big5 => DoubleByteCharset::Big5,
        Encoding::ShiftJis => DoubleByteCharset::ShiftJis,
        _ => DoubleByteCharset::Gb18030,
    };
    let mut t = format!("profile: {} ({} bytes)\n", profile.name, rendered.bytes.len());
    t.push_str(&transcript(&rendered.bytes, Options { charset, double_byte_default: false }));
    if !rendered.warnings.is_empty() {
        t.push_str("--- warnings\n");
        for w in &rendered.warnings {
            let _ = writeln!(t, "{w}");
        }
    }
    t
}

/// The text output framed at the paper width, so alignment can be reviewed by eye.
fn text_snapshot(doc: &Document, profile: &Profile) -> String {
    let text = to_text(doc, profile);
    let width = usize::from(profile.columns);
    let mut out = format!("+{}+\n", "-".repeat(width));
    for line in text.lines() {
        let shown = onceprint_render::display_width(line);
        let _ = writeln!(out, "|{line}{}|", " ".repeat(width.saturating_sub(shown)));
    }
    let _ = writeln!(out, "+{}+", "-".repeat(width));
    out
}

fn check_all(name: &str, doc: &Document, profile: &Profile) {
    insta::assert_snapshot!(format!("{name}.escpos"), escpos_snapshot(doc, profile));
    insta::assert_snapshot!(format!("{name}.text"), text_snapshot(doc, profile));
    let png = to_png(doc, profile).expect("renders to PNG");
    insta::assert_binary_snapshot!(&format!("{name}.png"), png);
}

#[test]
fn latin_receipt() {
    check_all("latin_receipt", &document("latin-receipt.json"), &profile("escpos-80-cp858"));
}

#[test]
fn kitchen_ticket_58mm() {
    check_all("kitchen_ticket_58", &document("kitchen-ticket.json"), &profile("escpos-58-gb18030"));
}

#[test]
fn kitchen_ticket_80mm() {
    check_all("kitchen_ticket_80", &document("kitchen-ticket.json"), &profile("escpos-80-gb18030"));
}

#[test]
fn qr_barcode_and_logo() {
    check_all("codes_receipt", &document("codes-receipt.json"), &profile("escpos-80-gb18030"));
}

#[test]
fn markup_ticket() {
    let doc = parse_markup(&fixture("markup-ticket.txt")).expect("markup reads");
    insta::assert_json_snapshot!("markup_ticket.document", doc);
    check_all("markup_ticket", &doc, &profile("escpos-58-gb18030"));
}

/// The characters of every text in `doc`, without white space (wrapping removes spaces).
fn document_chars(doc: &Document) -> String {
    let mut s = String::new();
    for block in &doc.blocks {
        match block {
            Block::Text(t) => t.spans.iter().for_each(|sp| s.push_str(&sp.text)),
            Block::Row(r) => r.columns.iter().for_each(|c| s.push_str(&c.text)),
            _ => {}
        }
    }
    s.chars().filter(|c| !c.is_whitespace()).collect()
}

#[test]
fn a_chinese_ticket_decodes_back_to_its_characters() {
    let doc = document("kitchen-ticket.json");
    for name in ["escpos-58-gb18030", "escpos-80-gb18030", "escpos-80-gbk"] {
        let rendered = to_escpos(&doc, &profile(name)).expect("renders");
        assert!(rendered.warnings.is_empty(), "{name}: {:?}", rendered.warnings);
        // Read the bytes as a printer would: the parser follows FS &, and its text
        // events decode as GB18030 in double-byte mode.
        let mut parser = Parser::new();
        let events = coalesce(parser.push(&rendered.bytes));
        assert!(parser.double_byte());
        let mut printed = String::new();
        for e in &events {
            match e {
                Event::Text(bytes) => printed.push_str(&decode_text(bytes, true)),
                Event::Unknown { .. } | Event::Control(_) => panic!("{name}: unexpected {e:?}"),
                _ => {}
            }
        }
        assert!(!printed.contains('\u{FFFD}'), "{name}: {printed}");
        // Rows interleave their columns line by line, so compare the characters as a
        // multiset; the rules are the only characters added.
        let mut got: Vec<char> = printed.chars().filter(|c| !c.is_whitespace() && *c != '-').collect();
        let mut want: Vec<char> = document_chars(&doc).chars().filter(|c| *c != '-').collect();
        got.sort_unstable();
        want.sort_unstable();
        assert_eq!(got, want, "{name}");
        assert!(printed.contains("备注：14号桌客人对花生过敏"), "{name}: {printed}");
    }
}

#[test]
fn unencodable_characters_become_question_marks_with_warnings() {
    let doc = parse_document(&serde_json::json!({"blocks": [
        {"type": "text", "text": "Tea → 宫 é"},
        {"type": "row", "columns": [{"text": "😀"}, {"text": "€", "width": 3}]}
    ]}))
    .unwrap();
    let latin = to_escpos(&doc, &profile("escpos-58-cp437")).unwrap();
    let t = transcript(&latin.bytes, Options::default());
    // → is one column wide: one ?; 宫 and 😀 are two: ??; é is in PC437; € is not.
    assert!(t.contains("\"Tea ? ?? é\""), "{t}");
    assert!(t.contains("\"??   "), "{t}");
    let codes: Vec<String> = latin.warnings.iter().map(|w| format!("{} {:?}", w.path, w.kind)).collect();
    assert_eq!(codes.len(), 4, "{codes:?}");
    assert!(codes[0].starts_with("blocks[0].spans[0].text Unencodable { ch: '→'"), "{codes:?}");
    assert!(codes[3].starts_with("blocks[1].columns[1].text Unencodable { ch: '€'"), "{codes:?}");
    // On a GB18030 printer (GBK has the arrow) only the emoji is missing.
    let chinese = to_escpos(&doc, &profile("escpos-58-gb18030")).unwrap();
    let missing: Vec<char> = chinese
        .warnings
        .iter()
        .filter_map(|w| match w.kind {
            onceprint_render::WarningKind::Unencodable { ch, .. } => Some(ch),
            _ => None,
        })
        .collect();
    assert_eq!(missing, ['😀']);
}

#[test]
fn double_width_words_stay_whole_in_the_text_output() {
    // The markup ticket's header is printed double width (`<CB>`); its text must still
    // contain the restaurant's name as one word, so the text of a ticket can be searched.
    let doc = onceprint_render::parse_markup(&fixture("markup-ticket.txt")).expect("markup");
    let text = onceprint_render::to_text(&doc, &profile("escpos-58-gb18030"));
    assert!(text.contains("*老王川菜馆*"), "{text}");
    // Columns still line up: no line is wider than the paper.
    for line in text.lines() {
        assert!(onceprint_render::display_width(line) <= 32, "{line:?} in\n{text}");
    }
}
