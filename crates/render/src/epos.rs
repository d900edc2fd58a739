//! Epson ePOS-Print XML (`<epos-print>`), the print data of Epson's Server Direct Print.
//!
//! A receipt becomes either `<text>` (plain text made only of printable ASCII, which every
//! TM printer prints in its own font) or one `<image>` raster of the slip at the profile's
//! width, drawn exactly like the PNG preview, so that CJK text, QR codes, barcodes and
//! images print as they look; either is followed by a feed and a cut. Text is escaped for
//! XML, and control characters never reach the printer: the text path only takes printable
//! ASCII and line breaks, everything else goes through the raster.

use base64::Engine as _;

use crate::doc::Document;
use crate::error::RenderError;
use crate::profile::Profile;

/// The namespace of ePOS-Print XML.
pub const EPOS_PRINT_NS: &str = "http://www.epson-pos.com/schemas/2011/03/epos-print";

/// The ePOS-Print XML of `doc` for a printer described by `profile`. With `as_text`, a
/// document whose text rendering is printable ASCII is sent as `<text>` (smaller, and in
/// the printer's own font); anything else is sent as an `<image>` raster.
pub fn to_epos_xml(doc: &Document, profile: &Profile, as_text: bool) -> Result<String, RenderError> {
    let mut out = format!("<epos-print xmlns=\"{EPOS_PRINT_NS}\">");
    let text = crate::to_text(doc, profile);
    if as_text && text.chars().all(|c| c == '\n' || (' '..='~').contains(&c)) {
        // One line break at the end: the text's own last line break would otherwise print
        // as an empty line before the feed (a text block ends its line already).
        let body = format!("{}\n", text.trim_end_matches('\n'));
        out.push_str("<text>");
        out.push_str(&escape(&body));
        out.push_str("</text>");
    } else {
        let raster = crate::preview::to_raster(doc, profile)?;
        let data = base64::engine::general_purpose::STANDARD.encode(&raster.bits);
        out.push_str(&format!(
            "<image width=\"{}\" height=\"{}\" color=\"color_1\" mode=\"mono\" align=\"left\">{data}</image>",
            raster.width, raster.height
        ));
    }
    out.push_str("<feed line=\"3\"/><cut type=\"feed\"/></epos-print>");
    Ok(out)
}

/// Text for an XML element: the five special characters as entities, and line breaks as
/// `&#10;` so that no XML processor on the way can normalise them away.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\n' => out.push_str("&#10;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_document;

    fn doc(v: serde_json::Value) -> Document {
        parse_document(&v).expect("valid document")
    }

    #[test]
    fn ascii_text_goes_as_text_with_markup_characters_escaped() {
        let d = doc(serde_json::json!({"blocks": [{"type": "text", "text": "Table 5 <A&B>\n1 x Noodles"}]}));
        let xml = to_epos_xml(&d, &Profile::default(), true).expect("renders");
        assert!(xml.starts_with(&format!("<epos-print xmlns=\"{EPOS_PRINT_NS}\"><text>")), "{xml}");
        assert!(xml.contains("Table 5 &lt;A&amp;B&gt;&#10;1 x Noodles"), "{xml}");
        assert!(xml.ends_with("<feed line=\"3\"/><cut type=\"feed\"/></epos-print>"), "{xml}");
    }

    #[test]
    fn everything_else_goes_as_one_raster_of_the_print_area() {
        let d = doc(serde_json::json!({"blocks": [{"type": "text", "text": "牛肉面 x 1"}]}));
        let p = Profile::default();
        let xml = to_epos_xml(&d, &p, true).expect("renders");
        assert!(!xml.contains("<text>"), "{xml}");
        let width = format!("<image width=\"{}\"", usize::from(p.dots).next_multiple_of(8));
        assert!(xml.contains(&width), "{xml}");
        let start = xml.find("align=\"left\">").map(|i| i + 13).unwrap_or(0);
        let end = xml.find("</image>").unwrap_or(0);
        let bits = base64::engine::general_purpose::STANDARD.decode(&xml[start..end]).expect("base64");
        assert!(bits.iter().any(|b| *b != 0), "the characters are drawn");
        let ascii = doc(serde_json::json!({"blocks": [{"type": "text", "text": "plain"}]}));
        assert!(to_epos_xml(&ascii, &p, false).expect("renders").contains("<image "), "documents go as images");
    }
}
