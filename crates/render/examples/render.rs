//! Renders a document file until `onceprint render` exists:
//! `cargo run -p onceprint-render --example render -- escpos|text|png FILE [PROFILE] > OUT`.
//! FILE is a JSON document, or markup when it ends in `.txt`; PROFILE a built-in name.

use std::io::Write as _;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(to), Some(file)) = (args.first(), args.get(1)) else {
        eprintln!("usage: render escpos|text|png FILE [PROFILE]");
        std::process::exit(2);
    };
    let result = std::fs::read_to_string(file).map_err(|e| e.to_string()).and_then(|src| {
        let doc = if file.ends_with(".txt") {
            onceprint_render::parse_markup(&src)
        } else {
            let value: serde_json::Value = serde_json::from_str(&src).map_err(|e| e.to_string())?;
            onceprint_render::parse_document(&value)
        }
        .map_err(|e| e.to_string())?;
        let profile = match args.get(2) {
            Some(name) => onceprint_render::Profile::builtin(name).ok_or(format!("no profile {name}"))?,
            None => onceprint_render::Profile::for_document(&doc),
        };
        match to.as_str() {
            "escpos" => onceprint_render::to_escpos(&doc, &profile).map(|r| {
                for w in &r.warnings {
                    eprintln!("warning: {w}");
                }
                r.bytes
            }),
            "text" => Ok(onceprint_render::to_text(&doc, &profile).into_bytes()),
            _ => onceprint_render::to_png(&doc, &profile),
        }
        .map_err(|e| e.to_string())
    });
    match result {
        Ok(bytes) => {
            let _ = std::io::stdout().write_all(&bytes);
        }
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}
