//! Property tests: any document, any markup and any JSON are handled without a panic;
//! text never overflows the paper, on screen or on the printer; rendered bytes never
//! contain a command the document did not ask for; invalid documents name the field.

use onceprint_escpos::parse::{coalesce, Event, Parser};
use onceprint_render::{
    display_width, parse_document, parse_markup, to_escpos, to_png, to_text, Align, Barcode, BarcodeKind, Block,
    Column, Cut, Dither, Document, Drawer, EcLevel, Encoding, Feed, Hri, Image, Logo, Paper, Profile, Qr, Row, Rule,
    Span, Style, Text,
};
use proptest::prelude::*;
use serde_json::{json, Value};

const LOGO: &[u8] = include_bytes!("fixtures/logo.png");

/// Text that mixes what receipts hold with what breaks naive renderers: CJK, emoji,
/// combining marks, control characters and whole ESC/POS commands.
fn text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        4 => "[a-zA-Z0-9 .,:-]{0,14}",
        3 => "[宫保鸡丁水煮牛肉麻婆豆腐（），。：！ ]{0,8}",
        2 => prop::sample::select(vec![
            "\n", "\t", "\r\n", "\u{1b}@", "\u{1d}V\u{0}", "\u{1d}(H\u{6}\u{0}00AAAA", "\u{10}\u{4}\u{1}", "é", "€", "¥",
            "😀", "e\u{301}", "\u{200b}", "ｱｲ", "한국", "\u{E000}", "㐀", "—", "“q”", "  ", "{", "Ω", "\u{7f}", "\u{85}",
        ])
        .prop_map(String::from),
        1 => prop::collection::vec(any::<char>(), 0..4).prop_map(|v| v.into_iter().collect()),
    ];
    prop::collection::vec(piece, 0..6).prop_map(|v| v.concat())
}

fn style() -> impl Strategy<Value = Style> {
    any::<[bool; 5]>().prop_map(|[bold, underline, invert, double_width, double_height]| Style {
        bold,
        underline,
        invert,
        double_width,
        double_height,
    })
}

fn align() -> impl Strategy<Value = Align> {
    prop::sample::select(vec![Align::Left, Align::Center, Align::Right])
}

/// Any block, including values [`parse_document`] would refuse: renderers get documents
/// built in code too and must cope.
fn block() -> impl Strategy<Value = Block> {
    let span = (text(), style()).prop_map(|(text, style)| Span { text, style });
    let column =
        (text(), prop::option::of(0u16..70), align()).prop_map(|(text, width, align)| Column { text, width, align });
    prop_oneof![
        6 => (prop::collection::vec(span, 0..4), align()).prop_map(|(spans, align)| Block::Text(Text { spans, align })),
        6 => (prop::collection::vec(column, 0..5), 0u8..12, style())
            .prop_map(|(columns, gap, style)| Block::Row(Row { columns, gap, style })),
        1 => any::<char>().prop_map(|char| Block::Rule(Rule { char })),
        1 => any::<u8>().prop_map(|lines| Block::Feed(Feed { lines })),
        1 => (text(), any::<u8>(), prop::sample::select(vec![EcLevel::L, EcLevel::M, EcLevel::Q, EcLevel::H]), align())
            .prop_map(|(data, size, ec, align)| Block::Qr(Qr { data, size, ec, align })),
        1 => (prop_oneof![text(), "[0-9]{12,13}"], any::<bool>(), any::<u8>(), any::<u8>(), align()).prop_map(
            |(data, ean, height, module, align)| Block::Barcode(Barcode {
                kind: if ean { BarcodeKind::Ean13 } else { BarcodeKind::Code128 },
                data,
                height,
                module,
                hri: Hri::Both,
                align,
            })
        ),
        1 => (any::<bool>(), prop::option::of(0u16..1000), align()).prop_map(|(real, width, align)| Block::Image(Image {
            png: if real { LOGO.to_vec() } else { b"\x89PNG not really".to_vec() },
            width,
            align,
            dither: if width.unwrap_or(0) % 2 == 0 { Dither::FloydSteinberg } else { Dither::Threshold },
        })),
        1 => (any::<u8>(), align()).prop_map(|(key, align)| Block::Logo(Logo { key, align })),
        1 => (any::<bool>(), any::<u8>()).prop_map(|(partial, feed)| Block::Cut(Cut { partial, feed })),
        1 => (any::<u8>(), any::<u16>(), any::<u16>()).prop_map(|(pin, on_ms, off_ms)| Block::Drawer(Drawer { pin, on_ms, off_ms })),
    ]
}

fn document() -> impl Strategy<Value = Document> {
    prop::collection::vec(block(), 0..10).prop_map(|blocks| Document { paper: None, blocks })
}

fn profile() -> impl Strategy<Value = Profile> {
    prop_oneof![
        3 => prop::sample::select(Profile::builtin_names()).prop_map(|n| Profile::builtin(&n).unwrap_or_default()),
        1 => (0u16..100, 0u16..1200, prop::sample::select(Encoding::ALL.to_vec())).prop_map(|(columns, dots, e)| {
            Profile { columns, dots, ..Profile::new(Paper::Mm80, e) }
        }),
    ]
}

/// Printed columns of each line of an ESC/POS stream, as a GB18030 or single-byte
/// printer counts them: a multi-byte character is two columns, `GS !` multiplies.
fn printed_line_widths(bytes: &[u8]) -> Vec<usize> {
    let mut parser = Parser::new();
    let mut widths = vec![0usize];
    let mut factor = 1;
    for event in coalesce(parser.push(bytes)) {
        match event {
            Event::Command { name: "GS !", params } => factor = usize::from(params[0] >> 4) + 1,
            Event::DoubleByte(_) | Event::Init => {}
            Event::Text(t) => {
                let mut i = 0;
                while i < t.len() {
                    let b = t[i];
                    if b == b'\n' {
                        widths.push(0);
                        i += 1;
                        continue;
                    }
                    let (len, cols) = if b < 0x80 || !parser_double_byte(bytes) {
                        (1, 1)
                    } else if t.get(i + 1).is_some_and(|n| (0x30..=0x39).contains(n)) {
                        (4, 2)
                    } else {
                        (2, 2)
                    };
                    if let Some(w) = widths.last_mut() {
                        *w += cols * factor;
                    }
                    i += len;
                }
            }
            _ => {}
        }
    }
    widths
}

fn parser_double_byte(bytes: &[u8]) -> bool {
    bytes.get(2..4) == Some(&[0x1C, 0x26][..])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn any_document_renders_without_panic(doc in document(), profile in profile()) {
        let _ = to_escpos(&doc, &profile);
        let _ = to_text(&doc, &profile);
    }

    #[test]
    fn text_lines_never_exceed_the_paper(doc in document(), profile in profile()) {
        let columns = usize::from(profile.columns.max(1));
        for line in to_text(&doc, &profile).lines() {
            prop_assert!(display_width(line) <= columns, "{} > {columns}: {line:?}", display_width(line));
        }
    }

    #[test]
    fn printed_lines_never_exceed_the_paper(doc in document(), profile in profile()) {
        // Big5 and Shift_JIS have single-byte characters above 0x80; the width check
        // below counts like a GB18030 or code-page printer.
        prop_assume!(!matches!(profile.encoding, Encoding::Big5 | Encoding::ShiftJis));
        if let Ok(rendered) = to_escpos(&doc, &profile) {
            let columns = usize::from(profile.columns.max(1));
            for w in printed_line_widths(&rendered.bytes) {
                prop_assert!(w <= columns, "{w} > {columns}");
            }
        }
    }

    #[test]
    fn document_text_never_becomes_a_command(doc in document(), profile in profile()) {
        if let Ok(rendered) = to_escpos(&doc, &profile) {
            let events = Parser::new().push(&rendered.bytes);
            let cuts = doc.blocks.iter().filter(|b| matches!(b, Block::Cut(_))).count();
            let mut seen_cuts = 0;
            for e in &events {
                match e {
                    Event::Unknown { .. } | Event::Control(_) | Event::StatusRequest(_) | Event::ProcessIdRequest(_) => {
                        prop_assert!(false, "unexpected {e:?}");
                    }
                    Event::Cut { .. } => seen_cuts += 1,
                    _ => {}
                }
            }
            prop_assert_eq!(seen_cuts, cuts);
        }
    }

    #[test]
    fn any_markup_reads_or_fails_cleanly(s in markup()) {
        if let Ok(doc) = parse_markup(&s) {
            let profile = Profile::builtin("escpos-58-gb18030").unwrap_or_default();
            let _ = to_escpos(&doc, &profile);
            for line in to_text(&doc, &profile).lines() {
                prop_assert!(display_width(line) <= 32);
            }
        }
    }

    #[test]
    fn any_json_reads_or_fails_cleanly(v in json_value()) {
        let _ = parse_document(&v);
        let _ = parse_document(&json!({"blocks": [v]}));
    }

    #[test]
    fn invalid_documents_name_the_field(
        blocks in prop::collection::vec(prop::sample::select(valid_blocks()), 1..6),
        which in any::<prop::sample::Index>(),
        bad in any::<prop::sample::Index>(),
    ) {
        let i = which.index(blocks.len());
        let mut blocks = blocks;
        let kind = blocks[i]["type"].as_str().unwrap_or_default().to_string();
        let options = mutations(&kind);
        let (field, value) = options[bad.index(options.len())].clone();
        set(&mut blocks[i], &field, value);
        let doc = json!({"paper": "80mm", "blocks": blocks});
        match parse_document(&doc) {
            Err(e) => {
                let want = format!("blocks[{i}].{field}");
                prop_assert_eq!(e.path(), Some(want.as_str()), "{}", e);
            }
            Ok(_) => prop_assert!(false, "accepted {field} in {doc}"),
        }
    }
}

proptest! {
    // PNG rendering is the slow renderer; fewer cases cover it.
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn any_document_renders_to_png_without_panic(doc in document(), profile in profile()) {
        if let Ok(png) = to_png(&doc, &profile) {
            prop_assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        }
    }
}

fn markup() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        3 => text(),
        3 => prop::sample::select(vec![
            "<CB>", "</CB>", "<B>", "</B>", "<C>", "</C>", "<L>", "</L>", "<W>", "</W>", "<BOLD>", "</BOLD>",
            "<RIGHT>", "</RIGHT>", "<BR>", "<br>", "<CUT>", "<LOGO>", "<PLUGIN>", "<QR>", "</QR>", "<BC128_A>",
            "</BC128_A>", "<EAN13>", "</EAN13>", "<IMG>", "</IMG>", "<", ">", "</", "<QR>https://x</QR>",
            "<EAN13>400638133393</EAN13>", "<BC128_C>1234</BC128_C>",
        ])
        .prop_map(String::from),
    ];
    prop::collection::vec(piece, 0..24).prop_map(|v| v.concat())
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        prop::sample::select(vec![
            "text", "row", "qr", "barcode", "image", "cut", "drawer", "rule", "feed", "logo", "58mm", "80mm", "left",
            "center", "code128", "ean13", "",
        ])
        .prop_map(|s| json!(s)),
        text().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        let key = prop::sample::select(vec![
            "type", "text", "spans", "columns", "width", "align", "bold", "data", "kind", "size", "ec", "png", "paper",
            "blocks", "lines", "char", "mode", "feed", "pin", "gap", "module", "hri", "dots", "x",
        ]);
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(key, inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.to_string(), v)).collect())),
        ]
    })
}

fn valid_blocks() -> Vec<Value> {
    vec![
        json!({"type": "text", "text": "hello", "align": "center", "bold": true}),
        json!({"type": "text", "spans": [{"text": "a"}, {"text": "b", "underline": true}]}),
        json!({"type": "row", "columns": [{"text": "Tea"}, {"text": "2", "width": 4, "align": "right"}, {"text": "5.00", "width": 8}]}),
        json!({"type": "rule", "char": "="}),
        json!({"type": "feed", "lines": 2}),
        json!({"type": "qr", "data": "https://example.com", "size": 5, "ec": "H"}),
        json!({"type": "barcode", "kind": "code128", "data": "A-1"}),
        json!({"type": "image", "png": "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAAAAAA6fptVAAAACklEQVR4nGNgAAAAAgABSK+kcQAAAABJRU5ErkJggg=="}),
        json!({"type": "logo", "key": 1}),
        json!({"type": "cut", "mode": "full"}),
        json!({"type": "drawer", "pin": 5}),
    ]
}

/// Fields of a block of `kind` and a value each that is wrong for it.
fn mutations(kind: &str) -> Vec<(String, Value)> {
    let common = [("type", json!("receipt")), ("colour", json!("red"))];
    let specific: Vec<(&str, Value)> = match kind {
        "text" => {
            vec![("align", json!("middle")), ("bold", json!(1)), ("double_width", json!("yes")), ("spans", json!(7))]
        }
        "row" => vec![
            ("columns[1].width", json!(0)),
            ("columns[1].width", json!(500)),
            ("columns[0].align", json!("up")),
            ("columns[2].text", json!(3)),
            ("gap", json!(99)),
            ("columns", json!([])),
        ],
        "rule" => vec![("char", json!("ab")), ("char", json!(""))],
        "feed" => vec![("lines", json!(0)), ("lines", json!(256)), ("lines", json!(-1))],
        "qr" => vec![("size", json!(0)), ("ec", json!("X")), ("data", json!("")), ("data", json!(null))],
        "barcode" => vec![("kind", json!("upc")), ("module", json!(9)), ("data", json!("ä")), ("height", json!(0))],
        "image" => {
            vec![("png", json!("!!")), ("png", json!("aGVsbG8=")), ("width", json!(0)), ("dither", json!("blur"))]
        }
        "logo" => vec![("key", json!(0)), ("align", json!(1))],
        "cut" => vec![("mode", json!("half")), ("feed", json!(256))],
        _ => vec![("pin", json!(3)), ("on_ms", json!(0)), ("off_ms", json!(999))],
    };
    common.into_iter().chain(specific).map(|(f, v)| (f.to_string(), v)).collect()
}

/// Sets `field` (`a`, or `a[i].b`) of `block` to `value`.
fn set(block: &mut Value, field: &str, value: Value) {
    match field.split_once("].") {
        Some((array_index, rest)) => {
            let (name, index) = array_index.split_once('[').unwrap_or((array_index, "0"));
            let index: usize = index.parse().unwrap_or(0);
            if let Some(item) = block.get_mut(name).and_then(|a| a.get_mut(index)) {
                item[rest] = value;
            }
        }
        None => block[field] = value,
    }
}
