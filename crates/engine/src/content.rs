//! Print content to printer bytes and previews: plain text, raw ESC/POS passthrough, and
//! receipt documents and cloud markup through `onceprint-render`.

use onceprint_render::{parse_document, Document, Profile};

pub use onceprint_render::stored::{document_of, profile_for, validate, ContentError};

/// The bytes for the printer (see [`onceprint_render::stored::escpos_for`]), its
/// rendering warnings logged.
pub fn render_for(
    content_type: &str,
    content: Vec<u8>,
    banner: Option<&str>,
    profile: Option<&str>,
) -> Result<Vec<u8>, String> {
    let (bytes, warnings) = onceprint_render::stored::escpos_for(content_type, content, banner, profile)?;
    for w in &warnings {
        tracing::warn!(warning = ?w, "rendered with a substitution");
    }
    Ok(bytes)
}

/// The receipt document of stored content with a reprint's banner line on top, for
/// transports that print rendered receipts (PNG, text, ePOS XML). Raw ESC/POS has none.
pub fn document_for(content_type: &str, content: &[u8], banner: Option<&str>) -> Result<Document, String> {
    let mut doc = document_of(content_type, content)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("content type {content_type:?} cannot be rendered for this printer"))?;
    if let Some(b) = banner {
        let head = serde_json::json!({"blocks": [{"type": "text", "text": b, "align": "center", "bold": true}]});
        let head = parse_document(&head).map_err(|e| e.to_string())?;
        doc.blocks.splice(0..0, head.blocks);
    }
    Ok(doc)
}

/// The image a printer that prints pictures prints (CloudPRNT's `image/png`): the print
/// area only, at `dots` when the printer reported its own width, else the profile's.
pub fn render_png_for(
    content_type: &str,
    content: &[u8],
    banner: Option<&str>,
    profile: Option<&str>,
    dots: Option<u16>,
) -> Result<Vec<u8>, String> {
    let doc = document_for(content_type, content, banner)?;
    let mut profile = profile_for(profile, Some(&doc));
    if let Some(dots) = dots {
        profile = profile.at_dots(dots);
    }
    onceprint_render::to_print_png(&doc, &profile).map(|i| i.png).map_err(|e| e.to_string())
}

/// How the printed image of stored content ends (Star CloudPRNT's `X-Star-Cut`); a
/// reprint's banner on top does not change it. Plain text ends with a partial cut, as it
/// does on an ESC/POS printer (`onceprint_escpos::text::text_job`); a document or markup
/// as its author wrote it.
pub fn final_cut_for(content_type: &str, content: &[u8]) -> Result<onceprint_render::FinalCut, String> {
    if content_type == "text" {
        return Ok(onceprint_render::FinalCut::Partial);
    }
    let doc = document_for(content_type, content, None)?;
    onceprint_render::to_print_png(&doc, &profile_for(None, Some(&doc))).map(|i| i.cut).map_err(|e| e.to_string())
}

/// Plain text a printer prints as it is, in its own font and code page (CloudPRNT's
/// `text/plain`): only `text` content of printable ASCII (and line breaks, tabs), with a
/// reprint's banner line on top. Anything else would come out garbled or as markup
/// characters, and is refused: such a printer gets the image.
pub fn render_text_for(content_type: &str, content: &[u8], banner: Option<&str>) -> Result<String, String> {
    let refused = || format!("{content_type} content is not plain ASCII text a printer prints in its own code page");
    if content_type != "text" {
        return Err(refused());
    }
    let text = std::str::from_utf8(content).map_err(|_| refused())?;
    let plain = |s: &str| s.chars().all(|c| c == '\n' || c == '\r' || c == '\t' || (' '..='~').contains(&c));
    if !plain(text) || banner.is_some_and(|b| !plain(b)) {
        return Err(refused());
    }
    let mut out = String::with_capacity(text.len() + 32);
    if let Some(b) = banner {
        out.push_str(b);
        out.push('\n');
    }
    out.push_str(text);
    if !out.ends_with('\n') {
        out.push('\n');
    }
    Ok(out)
}

/// Epson ePOS-Print XML of a receipt (Server Direct Print). Plain text made of printable
/// ASCII goes as `<text>`; documents, markup and other text as a raster image of the slip.
pub fn render_epos_for(
    content_type: &str,
    content: &[u8],
    banner: Option<&str>,
    profile: Option<&str>,
) -> Result<String, String> {
    let doc = document_for(content_type, content, banner)?;
    onceprint_render::to_epos_xml(&doc, &profile_for(profile, Some(&doc)), content_type == "text")
        .map_err(|e| e.to_string())
}

/// A PNG preview of stored content.
pub fn preview_png(content_type: &str, content: &[u8], profile: Option<&str>) -> Result<Vec<u8>, ContentError> {
    let doc = document_of(content_type, content)?.ok_or_else(|| ContentError::NoPreview(content_type.to_owned()))?;
    Ok(onceprint_render::to_png(&doc, &profile_for(profile, Some(&doc)))?)
}

/// Whether `name` is a built-in render profile; the error lists them.
pub fn check_profile(name: &str) -> Result<(), String> {
    if Profile::builtin(name).is_some() {
        Ok(())
    } else {
        Err(format!("unknown profile {name:?}; one of {}", Profile::builtin_names().join(", ")))
    }
}

/// A rendering of a document given directly (the preview endpoint and the CLI).
pub fn render_document(
    doc: &Document,
    profile: Option<&str>,
    to: &str,
) -> Result<(Vec<u8>, &'static str), ContentError> {
    let profile = profile_for(profile, Some(doc));
    match to {
        "png" => Ok((onceprint_render::to_png(doc, &profile)?, "image/png")),
        "text" => Ok((onceprint_render::to_text(doc, &profile).into_bytes(), "text/plain; charset=utf-8")),
        "escpos" => Ok((onceprint_render::to_escpos(doc, &profile)?.bytes, "application/octet-stream")),
        other => Err(ContentError::Invalid(format!("format: {other:?} is not png, text or escpos"))),
    }
}
