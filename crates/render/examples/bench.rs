//! `cargo run --release -p onceprint-render --example bench [seconds per measurement]`

fn main() {
    let secs: f64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(2.0);
    match onceprint_render::bench::run(std::time::Duration::from_secs_f64(secs)) {
        Ok(reports) => {
            for r in reports {
                println!("{r}");
            }
        }
        Err(e) => {
            eprintln!("bench failed: {e}");
            std::process::exit(1);
        }
    }
}
