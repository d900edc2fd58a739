//! Bar charts drawn on the server as inline SVG: the console's content security policy
//! allows no script library and no foreign origin, and a picture made of `rect` and `text`
//! needs neither.
//!
//! Every chart reads without colour: each bar has its value written beside it and a
//! `<title>` (what a screen reader and a hovering mouse get), the chart a `<title>` and
//! `<desc>` named by `aria-labelledby`, and a second value (the 95 % time behind a median)
//! differs in shape (a wide bar behind a narrow one), not only in shade. Charts scale to
//! their box (`viewBox` with `width="100%"`), so they fit a 375 px phone. Colours come from
//! `console.css` (classes), since inline style is refused.

use super::html::esc;

/// One bar: its label under (or beside) it, its length, the value written on it, and the
/// sentence of its `<title>`.
#[derive(Debug, Clone, Default)]
pub struct Bar {
    /// What the bar stands for, as the data attribute `data-key` (an hour, a reason).
    pub key: String,
    pub label: String,
    pub value: f64,
    /// A second, smaller value drawn as a narrow bar inside this one (a median inside
    /// the 95 % time).
    pub inner: Option<f64>,
    pub shown: String,
    pub title: String,
}

fn num(v: f64) -> String {
    format!("{v:.1}")
}

fn head(kind: &str, id: &str, title: &str, desc: &str, w: u32, h: u32) -> String {
    format!(
        "<svg class=\"chart {kind}\" id=\"{id}\" viewBox=\"0 0 {w} {h}\" width=\"100%\" role=\"img\" \
         aria-labelledby=\"{id}-title {id}-desc\" xmlns=\"http://www.w3.org/2000/svg\">\
         <title id=\"{id}-title\">{title}</title><desc id=\"{id}-desc\">{desc}</desc>",
        id = esc(id),
        title = esc(title),
        desc = esc(desc),
    )
}

/// Columns side by side (the hours of a day), a label under every `label_every`-th.
pub fn columns(id: &str, title: &str, desc: &str, bars: &[Bar], label_every: usize) -> String {
    // Narrow enough that its text stays legible on a 375 px phone, where it is drawn at
    // about 0.9 of these units.
    const W: f64 = 360.0;
    const TOP: f64 = 14.0;
    const AREA: f64 = 110.0;
    const H: f64 = TOP + AREA + 20.0;
    let max = bars.iter().map(|b| b.value).fold(0.0_f64, f64::max).max(f64::MIN_POSITIVE);
    let slot = W / bars.len().max(1) as f64;
    let mut out = head("columns", id, title, desc, W as u32, H as u32);
    out.push_str(&format!("<line class=\"axis\" x1=\"0\" y1=\"{y}\" x2=\"{W}\" y2=\"{y}\"/>", y = num(TOP + AREA)));
    for (i, b) in bars.iter().enumerate() {
        let x = slot * i as f64;
        let h = AREA * b.value / max;
        out.push_str(&format!(
            "<g class=\"bar\" data-key=\"{key}\" data-value=\"{value}\"><title>{t}</title>",
            key = esc(&b.key),
            value = esc(&b.shown),
            t = esc(&b.title),
        ));
        if b.value > 0.0 {
            out.push_str(&format!(
                "<rect class=\"b\" x=\"{x}\" y=\"{y}\" width=\"{w}\" height=\"{h}\"/>",
                x = num(x + slot * 0.15),
                y = num(TOP + AREA - h),
                w = num(slot * 0.7),
                h = num(h),
            ));
            if let Some(inner) = b.inner {
                let ih = AREA * inner / max;
                out.push_str(&format!(
                    "<rect class=\"b inner\" x=\"{x}\" y=\"{y}\" width=\"{w}\" height=\"{h}\"/>",
                    x = num(x + slot * 0.35),
                    y = num(TOP + AREA - ih),
                    w = num(slot * 0.3),
                    h = num(ih),
                ));
            }
            out.push_str(&format!(
                "<text class=\"v\" x=\"{x}\" y=\"{y}\" text-anchor=\"middle\">{v}</text>",
                x = num(x + slot / 2.0),
                y = num(TOP + AREA - h - 3.0),
                v = esc(&b.shown),
            ));
        }
        if label_every > 0 && i % label_every == 0 {
            out.push_str(&format!(
                "<text class=\"l\" x=\"{x}\" y=\"{y}\" text-anchor=\"middle\">{l}</text>",
                x = num(x + slot / 2.0),
                y = num(H - 4.0),
                l = esc(&b.label),
            ));
        }
        out.push_str("</g>");
    }
    out.push_str("</svg>");
    out
}

/// The longest label a row shows; the whole one is in the bar's `<title>`.
const LABEL_CHARS: usize = 16;

/// One bar per row with its label before it (reasons, printers), longest first as given.
pub fn rows(id: &str, title: &str, desc: &str, bars: &[Bar]) -> String {
    const W: f64 = 360.0;
    const ROW: f64 = 28.0;
    const LABEL: f64 = 140.0;
    const BAR: f64 = 180.0;
    let max = bars.iter().map(|b| b.value).fold(0.0_f64, f64::max).max(f64::MIN_POSITIVE);
    let h = ROW * bars.len() as f64 + 4.0;
    let mut out = head("rows", id, title, desc, W as u32, h as u32);
    for (i, b) in bars.iter().enumerate() {
        let y = ROW * i as f64 + 2.0;
        let len = (BAR * b.value / max).max(1.0);
        let label = if b.label.chars().count() > LABEL_CHARS {
            format!("{}…", b.label.chars().take(LABEL_CHARS - 1).collect::<String>())
        } else {
            b.label.clone()
        };
        out.push_str(&format!(
            "<g class=\"bar\" data-key=\"{key}\" data-value=\"{value}\"><title>{t}</title>\
             <text class=\"l\" x=\"0\" y=\"{ty}\">{label}</text>\
             <rect class=\"b\" x=\"{LABEL}\" y=\"{by}\" width=\"{len}\" height=\"{bh}\"/>\
             <text class=\"v\" x=\"{vx}\" y=\"{ty}\">{shown}</text></g>",
            key = esc(&b.key),
            value = esc(&b.shown),
            t = esc(&b.title),
            ty = num(y + ROW * 0.65),
            label = esc(&label),
            by = num(y + 3.0),
            len = num(len),
            bh = num(ROW - 8.0),
            vx = num(LABEL + len + 5.0),
            shown = esc(&b.shown),
        ));
    }
    out.push_str("</svg>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_carry_their_numbers_as_text_and_escape_labels() {
        let bars = vec![
            Bar {
                key: "9".into(),
                label: "9".into(),
                value: 4.0,
                shown: "4".into(),
                title: "9:00: 4".into(),
                ..Default::default()
            },
            Bar {
                key: "10".into(),
                label: "10".into(),
                value: 0.0,
                shown: "0".into(),
                title: "10:00: 0".into(),
                ..Default::default()
            },
        ];
        let svg = columns("c", "Tickets <per> hour", "4 tickets", &bars, 1);
        assert!(svg
            .starts_with("<svg class=\"chart columns\" id=\"c\" viewBox=\"0 0 360 144\" width=\"100%\" role=\"img\""));
        assert!(svg.contains("<title id=\"c-title\">Tickets &lt;per&gt; hour</title>"));
        assert!(svg.contains(">4</text>"), "the value is written on its bar");
        assert_eq!(svg.matches("<rect").count(), 1, "no bar for nothing");
        let long = Bar {
            key: "x".into(),
            label: "A very long printer name indeed, truly".into(),
            value: 2.0,
            shown: "2".into(),
            title: "t".into(),
            inner: None,
        };
        let svg = rows("r", "By printer", "2", &[long]);
        assert!(svg.contains(">A very long pri…</text>"), "{svg}");
        assert!(svg.contains(">2</text>"));
    }
}
