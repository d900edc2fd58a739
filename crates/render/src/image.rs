//! PNG images to the 1-bit rasters a thermal head prints.

use std::io::Cursor;

use crate::doc::Dither;

/// Largest source image side in pixels; decoding is also capped in memory.
const MAX_SOURCE_SIDE: u32 = 4096;
/// Memory the PNG decoder may use.
const MAX_DECODE_BYTES: usize = 64 << 20;
/// Tallest printed image in dots (about 50 cm at 203 dpi).
pub(crate) const MAX_HEIGHT: u32 = 4096;

/// A 1-bit image: rows of `stride` bytes, most significant bit leftmost, 1 = black —
/// the layout of `GS v 0` raster data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Bitmap {
    pub width: u16,
    pub height: u16,
    pub stride: usize,
    pub bits: Vec<u8>,
}

impl Bitmap {
    fn new(width: u16, height: u16) -> Bitmap {
        let stride = usize::from(width).div_ceil(8);
        Bitmap { width, height, stride, bits: vec![0; stride * usize::from(height)] }
    }

    #[cfg(test)]
    pub fn get(&self, x: usize, y: usize) -> bool {
        self.bits.get(y * self.stride + x / 8).is_some_and(|b| b & (0x80 >> (x % 8)) != 0)
    }

    fn set(&mut self, x: usize, y: usize) {
        if let Some(b) = self.bits.get_mut(y * self.stride + x / 8) {
            *b |= 0x80 >> (x % 8);
        }
    }
}

/// Luminance, 0 = black, with transparency composited over white paper.
struct Gray {
    width: u32,
    height: u32,
    pixels: Vec<u8>,
}

fn decode(png: &[u8]) -> Result<Gray, String> {
    let mut decoder = png::Decoder::new_with_limits(Cursor::new(png), png::Limits { bytes: MAX_DECODE_BYTES });
    decoder.set_transformations(png::Transformations::normalize_to_color8());
    let mut reader = decoder.read_info().map_err(|e| format!("not a readable PNG file: {e}"))?;
    let (width, height) = (reader.info().width, reader.info().height);
    if width == 0 || height == 0 || width > MAX_SOURCE_SIDE || height > MAX_SOURCE_SIDE {
        return Err(format!("{width}×{height} pixels; at most {MAX_SOURCE_SIDE} on each side"));
    }
    let size = reader.output_buffer_size().ok_or("the image is too large")?;
    let mut buf = vec![0; size];
    let frame = reader.next_frame(&mut buf).map_err(|e| format!("not a readable PNG file: {e}"))?;
    let channels = match reader.output_color_type().0 {
        png::ColorType::Grayscale => 1,
        png::ColorType::GrayscaleAlpha => 2,
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
        // Expanded away by `normalize_to_color8`.
        png::ColorType::Indexed => return Err("unsupported PNG colour type".into()),
    };
    let mut pixels = Vec::with_capacity(width as usize * height as usize);
    for row in buf.chunks(frame.line_size).take(height as usize) {
        for px in row.chunks_exact(channels).take(width as usize) {
            let (luma, alpha) = match *px {
                [g] => (u32::from(g), 255),
                [g, a] => (u32::from(g), u32::from(a)),
                [r, g, b] => ((299 * u32::from(r) + 587 * u32::from(g) + 114 * u32::from(b)) / 1000, 255),
                [r, g, b, a, ..] => {
                    ((299 * u32::from(r) + 587 * u32::from(g) + 114 * u32::from(b)) / 1000, u32::from(a))
                }
                _ => (255, 0),
            };
            // Over white paper: transparent is white.
            let v = (luma * alpha + 255 * (255 - alpha)) / 255;
            pixels.push(v.min(255) as u8);
        }
    }
    if pixels.len() != width as usize * height as usize {
        return Err("the PNG data is truncated".into());
    }
    Ok(Gray { width, height, pixels })
}

/// Whether `png` is an image this crate can print.
pub(crate) fn check(png: &[u8]) -> Result<(), String> {
    decode(png).map(|_| ())
}

/// The image at `width` dots (its own width when `None`), at most `max_width`, in black
/// and white.
pub(crate) fn to_bitmap(png: &[u8], width: Option<u16>, max_width: u16, dither: Dither) -> Result<Bitmap, String> {
    let src = decode(png)?;
    let out_w = u32::from(width.unwrap_or(u16::try_from(src.width).unwrap_or(u16::MAX)).min(max_width).max(1));
    let out_h = (u64::from(src.height) * u64::from(out_w)).div_ceil(u64::from(src.width)).max(1);
    if out_h > u64::from(MAX_HEIGHT) {
        return Err(format!("printed {out_w} dots wide it would be {out_h} dots tall; at most {MAX_HEIGHT}"));
    }
    let out_h = out_h as u32;
    let grey = resample(&src, out_w, out_h);
    // Both sides are at most MAX_HEIGHT / u16::MAX, checked above.
    let mut bitmap = Bitmap::new(out_w as u16, out_h as u16);
    match dither {
        Dither::Threshold => {
            for (i, &v) in grey.iter().enumerate() {
                if v < 128 {
                    bitmap.set(i % out_w as usize, i / out_w as usize);
                }
            }
        }
        Dither::FloydSteinberg => floyd_steinberg(&grey, out_w as usize, out_h as usize, &mut bitmap),
    }
    Ok(bitmap)
}

/// Box-filter resampling: each output pixel is the mean of the source pixels it covers
/// (at least one), which keeps thin lines of a downscaled logo grey instead of dropping
/// them.
fn resample(src: &Gray, out_w: u32, out_h: u32) -> Vec<u8> {
    if src.width == out_w && src.height == out_h {
        return src.pixels.clone();
    }
    let (sw, sh) = (u64::from(src.width), u64::from(src.height));
    let span = |i: u32, out: u32, len: u64| {
        let a = u64::from(i) * len / u64::from(out);
        let b = (u64::from(i + 1) * len / u64::from(out)).max(a + 1).min(len);
        (a as usize, b as usize)
    };
    let mut out = Vec::with_capacity(out_w as usize * out_h as usize);
    for y in 0..out_h {
        let (y0, y1) = span(y, out_h, sh);
        for x in 0..out_w {
            let (x0, x1) = span(x, out_w, sw);
            let mut sum = 0u64;
            for row in y0..y1 {
                let base = row * src.width as usize;
                sum += src.pixels[base + x0..base + x1].iter().map(|&p| u64::from(p)).sum::<u64>();
            }
            let n = ((y1 - y0) * (x1 - x0)).max(1) as u64;
            out.push((sum / n) as u8);
        }
    }
    out
}

/// Floyd–Steinberg error diffusion, left to right on every row.
fn floyd_steinberg(grey: &[u8], w: usize, h: usize, bitmap: &mut Bitmap) {
    // Two rows of accumulated error are all the algorithm needs.
    let mut cur = vec![0i32; w + 2];
    let mut next = vec![0i32; w + 2];
    for y in 0..h {
        for x in 0..w {
            let v = i32::from(grey[y * w + x]) + cur[x + 1] / 16;
            let (ink, err) = if v < 128 { (true, v) } else { (false, v - 255) };
            if ink {
                bitmap.set(x, y);
            }
            cur[x + 2] += err * 7;
            next[x] += err * 3;
            next[x + 1] += err * 5;
            next[x + 2] += err;
        }
        std::mem::swap(&mut cur, &mut next);
        next.iter_mut().for_each(|e| *e = 0);
    }
}

/// Encodes a greyscale image as PNG (for tests and fixtures).
#[cfg(test)]
pub(crate) fn encode_gray(width: u32, height: u32, pixels: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut out, width, height);
        enc.set_color(png::ColorType::Grayscale);
        enc.set_depth(png::BitDepth::Eight);
        let mut w = enc.write_header().expect("header");
        w.write_image_data(pixels).expect("data");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grey_ramp_dithers_to_matching_density() {
        let (w, h) = (64u32, 16u32);
        let pixels: Vec<u8> = (0..w * h).map(|i| ((i % w) * 255 / (w - 1)) as u8).collect();
        let png = encode_gray(w, h, &pixels);
        let bmp = to_bitmap(&png, None, 576, Dither::FloydSteinberg).unwrap();
        assert_eq!((bmp.width, bmp.height), (64, 16));
        let dark_left = (0..16).map(|y| (0..16).filter(|&x| bmp.get(x, y)).count()).sum::<usize>();
        let dark_right = (0..16).map(|y| (48..64).filter(|&x| bmp.get(x, y)).count()).sum::<usize>();
        assert!(dark_left > 200 && dark_right < 56, "{dark_left} {dark_right}");
        let half = to_bitmap(&png, Some(32), 576, Dither::Threshold).unwrap();
        assert_eq!((half.width, half.height, half.stride), (32, 8, 4));
        assert!(half.get(0, 0) && !half.get(31, 7));
        let narrow = to_bitmap(&png, None, 20, Dither::Threshold).unwrap();
        assert_eq!(narrow.width, 20);
    }

    #[test]
    fn bad_images_are_refused() {
        assert!(check(b"hello").is_err());
        let png = encode_gray(4, 4, &[0; 16]);
        assert!(check(&png).is_ok());
        assert!(check(&png[..png.len() - 20]).is_err());
        let tall = encode_gray(1, 4096, &[0; 4096]);
        assert!(to_bitmap(&tall, Some(2), 576, Dither::Threshold).is_err());
    }
}
