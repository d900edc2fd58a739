//! The plain-text renderer: the slip as text at the paper's column width.
//!
//! Lines are laid out exactly as for the printer, so every character sits in the
//! column it is printed in. Where the printer's width of a character is larger than a
//! terminal's (`é` on a Chinese printer takes two columns, a double-width character
//! twice its width) the difference follows as spaces, so columns to its right stay
//! aligned. Characters are shown as they are in the document, not as the profile's
//! substitutes: this output is for people, and says what the receipt means. Codes,
//! images and paper handling become bracketed notes (`[QR https://…]`, `[cut]`).

use std::fmt::Write as _;

use crate::doc::{Align, Document, Hri};
use crate::layout::{layout, Item, Layout, Target};
use crate::profile::Profile;
use crate::width::{char_width, display_width};

/// Renders `doc` as plain text, lines no wider than `profile.columns` display columns,
/// each ending in `\n`. Never fails: what cannot be laid out is noted in brackets.
pub fn to_text(doc: &Document, profile: &Profile) -> String {
    match layout(doc, profile, Target::Text) {
        Ok(layout) => render(&layout),
        // The text target reports problems as items; an error here is not reachable,
        // but a note is still better than a panic.
        Err(e) => format!("[{e}]\n"),
    }
}

/// A run printed at double (or larger) width: its characters stay together, so the words
/// of a ticket's header can be searched for in the text, and the columns the printer
/// spends beyond what the text shows follow the run as spaces, so what is to its right
/// stays aligned. Where those extra columns leave room, the run is marked `*like this*`,
/// since spacing no longer says that it is printed large.
fn wide_run(out: &mut String, enc: crate::profile::Encoding, text: &str, factor: usize) {
    let mut shown_text = String::with_capacity(text.len());
    let (mut printed, mut shown) = (0usize, 0usize);
    for c in text.chars() {
        let w = usize::from(char_width(enc, c)) * factor;
        if w == 0 {
            continue;
        }
        let c = if c == '\t' { ' ' } else { c };
        shown_text.push(c);
        printed += w;
        shown += display_width(c.encode_utf8(&mut [0; 4]));
    }
    let extra = printed.saturating_sub(shown);
    if extra >= 2 && !shown_text.trim().is_empty() {
        // Marks go around the words, not around the blanks beside them.
        let lead = shown_text.len() - shown_text.trim_start().len();
        let body = shown_text.trim();
        let tail = shown_text.len() - lead - body.len();
        out.extend(std::iter::repeat_n(' ', lead));
        out.push('*');
        out.push_str(body);
        out.push('*');
        out.extend(std::iter::repeat_n(' ', tail + extra - 2));
    } else {
        out.push_str(&shown_text);
        out.extend(std::iter::repeat_n(' ', extra));
    }
}

fn render(layout: &Layout<'_>) -> String {
    let columns = usize::from(layout.columns);
    let enc = layout.encoding;
    let mut out = String::with_capacity(layout.items.len() * (columns + 1));
    // A note in brackets, aligned and cut to the line.
    let note = |out: &mut String, text: &str, align: Align| {
        let mut line = String::new();
        let mut w = 0;
        for c in text.chars().filter(|c| !c.is_control()) {
            let cw = display_width(c.encode_utf8(&mut [0; 4]));
            if w + cw > columns {
                break;
            }
            line.push(c);
            w += cw;
        }
        let pad = match align {
            Align::Left => 0,
            Align::Center => (columns - w) / 2,
            Align::Right => columns - w,
        };
        out.extend(std::iter::repeat_n(' ', pad));
        out.push_str(&line);
        out.push('\n');
    };
    for item in &layout.items {
        match item {
            Item::Line { runs, .. } => {
                let start = out.len();
                for run in &layout.runs[runs.clone()] {
                    out.extend(std::iter::repeat_n(' ', usize::from(run.pad)));
                    let factor = usize::from(run.style.width_factor());
                    if factor > 1 {
                        wide_run(&mut out, enc, &run.text, factor);
                        continue;
                    }
                    for c in run.text.chars() {
                        let printed = usize::from(char_width(enc, c));
                        if printed == 0 {
                            continue;
                        }
                        let c = if c == '\t' { ' ' } else { c };
                        out.push(c);
                        let shown = display_width(c.encode_utf8(&mut [0; 4]));
                        out.extend(std::iter::repeat_n(' ', printed.saturating_sub(shown)));
                    }
                }
                // Trailing blanks carry no information in text.
                let trimmed = out[start..].trim_end_matches(' ').len();
                out.truncate(start + trimmed);
                out.push('\n');
            }
            Item::Feed(n) => out.extend(std::iter::repeat_n('\n', usize::from(*n))),
            Item::Qr { data, align, .. } => note(&mut out, &format!("[QR {data}]"), *align),
            Item::Barcode { symbol, hri, align, .. } => {
                let text = if *hri == Hri::None { String::new() } else { format!(" {}", symbol.text) };
                let kind = if symbol.m == 67 { "EAN-13" } else { "Code128" };
                note(&mut out, &format!("[{kind}{text}]"), *align);
            }
            Item::Image { block, .. } => note(&mut out, &format!("[image, block {block}]"), Align::Center),
            Item::Logo { key, align } => note(&mut out, &format!("[logo {key}]"), *align),
            Item::Cut { partial, feed } => {
                out.extend(std::iter::repeat_n('\n', usize::from(*feed).min(1)));
                let mark = if *partial { "- - - partial cut - - -" } else { "- - - - - cut - - - - -" };
                note(&mut out, mark, Align::Center);
            }
            Item::Drawer { pin, .. } => {
                let mut s = String::new();
                let _ = write!(s, "[cash drawer, pin {pin}]");
                note(&mut out, &s, Align::Left);
            }
            Item::Invalid { message } => note(&mut out, &format!("[{message}]"), Align::Left),
        }
    }
    out
}
