//! The preview's font: WenQuanYi Micro Hei Mono, subset to what receipts print, compiled
//! in (see `fonts/README.md`), rasterised into the printer's character cells.
//!
//! A thermal printer prints a bitmap font at one size: 12×24 dots per column of font A,
//! 24×24 for a double-byte character, doubled for double width or height. The preview
//! does the same: each character is rasterised once into its cell, thresholded to
//! black and white (a thermal head has no grey), cached, and scaled by pixel doubling.
//! There is no system font lookup: the same bytes draw the same pixels everywhere.

use std::collections::HashMap;
use std::sync::{OnceLock, RwLock};

use ab_glyph::{point, Font, FontRef, PxScale, ScaleFont};

static FONT_BYTES: &[u8] = include_bytes!("../fonts/wqy-microhei-mono-subset.ttf");

/// Most glyphs cached besides ASCII: bounds the memory an adversarial document full of
/// distinct characters can pin (each glyph is about 100 bytes).
const MAX_CACHED: usize = 20_000;

/// A character rasterised into its cell: row `y` has bit 31 for the leftmost pixel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Glyph {
    pub rows: [u32; 24],
}

fn font() -> Option<&'static FontRef<'static>> {
    static FONT: OnceLock<Option<FontRef<'static>>> = OnceLock::new();
    FONT.get_or_init(|| FontRef::try_from_slice(FONT_BYTES).ok()).as_ref()
}

type Key = (char, u8, bool);

fn cache() -> &'static RwLock<HashMap<Key, Glyph>> {
    static CACHE: OnceLock<RwLock<HashMap<Key, Glyph>>> = OnceLock::new();
    CACHE.get_or_init(|| RwLock::new(HashMap::new()))
}

fn ascii_12() -> &'static [Glyph; 128] {
    static ASCII: OnceLock<Box<[Glyph; 128]>> = OnceLock::new();
    ASCII.get_or_init(|| {
        let mut table = Box::new([Glyph { rows: [0; 24] }; 128]);
        for (i, g) in table.iter_mut().enumerate().skip(0x20) {
            *g = rasterize(char::from(i as u8), 12, false);
        }
        table
    })
}

/// The glyph of `c` in a cell `cell_w` pixels wide per column (`2 * cell_w` tall), two
/// columns wide when `wide`.
pub(crate) fn glyph(c: char, cell_w: u8, wide: bool) -> Glyph {
    if cell_w == 12 && !wide && c.is_ascii() {
        return ascii_12()[c as usize];
    }
    let key = (c, cell_w, wide);
    // A poisoned lock only means another thread panicked mid-insert; the map itself is
    // still a valid cache, so keep using it.
    if let Some(g) = cache().read().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return *g;
    }
    let g = rasterize(c, cell_w, wide);
    let mut map = cache().write().unwrap_or_else(|e| e.into_inner());
    if map.len() < MAX_CACHED {
        map.insert(key, g);
    }
    g
}

/// A box outline: what the preview shows for a character the font does not have.
fn tofu(box_w: usize, cell_h: usize) -> Glyph {
    let mut rows = [0u32; 24];
    let (x0, x1, y0, y1) = (2, box_w.saturating_sub(3), 3, cell_h.saturating_sub(3));
    for (y, row) in rows.iter_mut().enumerate().take(y1 + 1).skip(y0) {
        for x in x0..=x1 {
            if y == y0 || y == y1 || x == x0 || x == x1 {
                *row |= 1 << (31 - x);
            }
        }
    }
    Glyph { rows }
}

fn rasterize(c: char, cell_w: u8, wide: bool) -> Glyph {
    let cell_w = usize::from(cell_w.clamp(6, 12));
    let cell_h = cell_w * 2;
    let box_w = cell_w * if wide { 2 } else { 1 };
    let mut rows = [0u32; 24];
    if c == ' ' || c == '\u{3000}' {
        return Glyph { rows };
    }
    let Some(font) = font() else { return tofu(box_w, cell_h) };
    let id = font.glyph_id(c);
    if id.0 == 0 {
        return tofu(box_w, cell_h);
    }
    // The em is 90% of the cell height and the baseline at 80%: ideographs then fill
    // the 24×24 cell with a dot of air around them, like a printer's font, and Latin
    // descenders stay inside.
    let px = cell_h as f32 * 0.9;
    let scale = PxScale::from(px);
    let scaled = font.as_scaled(scale);
    let advance = scaled.h_advance(id);
    let x0 = ((box_w as f32 - advance) / 2.0).max(0.0);
    let baseline = cell_h as f32 * 0.8;
    let Some(outline) = font.outline_glyph(id.with_scale_and_position(scale, point(x0, baseline))) else {
        return Glyph { rows };
    };
    let bounds = outline.px_bounds();
    outline.draw(|x, y, coverage| {
        // Thermal heads print dots or nothing: a pixel at least 45% covered is a dot,
        // which keeps thin strokes of small Latin letters from breaking up.
        if coverage < 0.45 {
            return;
        }
        let px = bounds.min.x as i64 + i64::from(x);
        let py = bounds.min.y as i64 + i64::from(y);
        if (0..box_w as i64).contains(&px) && (0..cell_h as i64).contains(&py) {
            rows[py as usize] |= 1 << (31 - px);
        }
    });
    Glyph { rows }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ink(g: &Glyph) -> u32 {
        g.rows.iter().map(|r| r.count_ones()).sum()
    }

    #[test]
    fn the_font_has_latin_and_cjk() {
        assert!(font().is_some());
        for c in ['A', 'g', '宫', '鸡', '€', 'é', '¥', '，', 'ア'] {
            let wide = !c.is_ascii();
            let g = glyph(c, 12, wide);
            assert!(ink(&g) > 10, "{c} has no ink");
            assert_ne!(g, tofu(if wide { 24 } else { 12 }, 24), "{c} is missing from the font");
        }
        assert_eq!(ink(&glyph(' ', 12, false)), 0);
        // Narrow glyphs stay in their 12-pixel cell.
        assert!(glyph('W', 12, false).rows.iter().all(|r| r & 0x000F_FFFF == 0));
        // Not in the subset: a box.
        assert_eq!(glyph('\u{10FFFD}', 12, true), tofu(24, 24));
    }
}
