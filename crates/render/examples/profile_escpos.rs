//! A loop to profile under `perf`:
//! `cargo run --release -p onceprint-render --example profile_escpos -- [zh|latin] [png] [qr]`.

fn main() {
    let chinese = std::env::args().nth(1).as_deref() != Some("latin");
    let png = std::env::args().nth(2).as_deref() == Some("png");
    let doc =
        onceprint_render::parse_document(&onceprint_render::bench::sample_receipt(chinese, false)).expect("valid");
    let profile = onceprint_render::Profile::default();
    let start = std::time::Instant::now();
    let mut n = 0u64;
    while start.elapsed().as_secs_f64() < 3.0 {
        for _ in 0..100 {
            if png {
                std::hint::black_box(onceprint_render::to_png(&doc, &profile).map(|b| b.len()).unwrap_or(0));
            } else {
                std::hint::black_box(onceprint_render::to_escpos(&doc, &profile).map(|r| r.bytes.len()).unwrap_or(0));
            }
        }
        n += 100;
    }
    println!("{:.0}/s", n as f64 / start.elapsed().as_secs_f64());
}
