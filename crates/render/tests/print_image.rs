//! The image a printer that prints pictures gets (Star CloudPRNT's `image/png`): the print
//! area only, one bit per dot, exactly the printer's width, and how the slip ends; read
//! back with a PNG decoder, as a printer would.

use onceprint_render::{parse_document, parse_markup, to_print_png, FinalCut, Profile};

/// Width, height and the rows (1 = ink) of a 1-bit greyscale PNG.
fn decode(png: &[u8]) -> (u32, u32, Vec<Vec<bool>>) {
    let decoder = png::Decoder::new(std::io::Cursor::new(png));
    let mut reader = decoder.read_info().expect("a PNG");
    let info = reader.info().clone();
    assert_eq!((info.color_type, info.bit_depth), (png::ColorType::Grayscale, png::BitDepth::One));
    let mut buf = vec![0; reader.output_buffer_size().expect("size")];
    reader.next_frame(&mut buf).expect("frame");
    let stride = info.width.div_ceil(8) as usize;
    let rows = (0..info.height as usize)
        .map(|y| (0..info.width as usize).map(|x| buf[y * stride + x / 8] & (0x80 >> (x % 8)) == 0).collect())
        .collect();
    (info.width, info.height, rows)
}

fn profile(name: &str) -> Profile {
    Profile::builtin(name).expect("built-in profile")
}

#[test]
fn the_print_area_at_the_printers_width_without_a_frame() {
    let doc = parse_markup("[center]Table 4\n1 x fish soup\n").expect("markup");
    for (name, dots) in [("escpos-80-cp437", 576), ("escpos-58-cp437", 384)] {
        let image = to_print_png(&doc, &profile(name)).expect("renders");
        let (w, h, rows) = decode(&image.png);
        assert_eq!((w as usize, h as usize), (dots, image.height), "{name}");
        // Ink, and none of the preview's grey frame: the first and last columns and the
        // first row are paper.
        assert!(rows.iter().flatten().any(|&ink| ink), "{name}: nothing printed");
        assert!(rows.iter().all(|r| !r[0] && !r[dots - 1]), "{name}: a frame at the edges");
        assert!(rows[0].iter().all(|&ink| !ink), "{name}: a frame on top");
        // Markup ends with a partial cut, told apart, not drawn.
        assert_eq!(image.cut, FinalCut::Partial, "{name}");
        assert_eq!(image.cut.star_header(), "partial");
    }
}

#[test]
fn the_printers_own_width_wins_and_a_document_without_a_cut_says_none() {
    let doc = parse_document(&serde_json::json!({
        "blocks": [{"type": "text", "text": "Order 17"}, {"type": "feed", "lines": 2}]
    }))
    .expect("document");
    let at_58 = profile("escpos-80-gb18030").at_dots(384);
    let image = to_print_png(&doc, &at_58).expect("renders");
    assert_eq!(decode(&image.png).0, 384);
    assert_eq!(image.cut, FinalCut::None);

    let cut = parse_document(&serde_json::json!({
        "blocks": [{"type": "text", "text": "Order 17"}, {"type": "cut", "mode": "full"}]
    }))
    .expect("document");
    assert_eq!(to_print_png(&cut, &profile("escpos-80-gb18030")).expect("renders").cut, FinalCut::Full);
    // Widths no roll has are not taken from the printer.
    assert_eq!(profile("escpos-80-gb18030").at_dots(100).dots, 576);
}
