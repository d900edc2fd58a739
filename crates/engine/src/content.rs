//! Print content to printer bytes and previews: plain text, raw ESC/POS passthrough, and
//! receipt documents and cloud markup through `onceprint-render` (R32).

use onceprint_render::{parse_document, parse_markup, Document, Profile, RenderError};

/// Why content cannot be rendered.
#[derive(Debug, thiserror::Error)]
pub enum ContentError {
    /// The document or markup is wrong; the message names the field or position.
    #[error("{0}")]
    Invalid(String),
    #[error("content type {0:?} has no preview (raw ESC/POS is passed through untouched)")]
    NoPreview(String),
    #[error("rendering failed: {0}")]
    Render(String),
}

impl From<RenderError> for ContentError {
    fn from(e: RenderError) -> Self {
        match e {
            RenderError::Encode(m) => ContentError::Render(m),
            other => ContentError::Invalid(other.to_string()),
        }
    }
}

/// The receipt document of stored content, if it is one (text becomes a one-block
/// document, so it previews like it prints).
pub fn document_of(content_type: &str, content: &[u8]) -> Result<Option<Document>, ContentError> {
    match content_type {
        "doc" => {
            let value: serde_json::Value =
                serde_json::from_slice(content).map_err(|e| ContentError::Invalid(format!("content.doc: {e}")))?;
            Ok(Some(parse_document(&value).map_err(|e| ContentError::Invalid(format!("content.doc.{e}")))?))
        }
        "markup" => {
            let text =
                std::str::from_utf8(content).map_err(|_| ContentError::Invalid("content.markup: not UTF-8".into()))?;
            Ok(Some(parse_markup(text).map_err(|e| ContentError::Invalid(format!("content.markup: {e}")))?))
        }
        "text" => {
            let text =
                std::str::from_utf8(content).map_err(|_| ContentError::Invalid("content.text: not UTF-8".into()))?;
            let value = serde_json::json!({"blocks": [{"type": "text", "text": text}]});
            Ok(Some(parse_document(&value)?))
        }
        _ => Ok(None),
    }
}

/// Checks document and markup content at intake, so a task that could never print is
/// refused with the field named instead of failing later on the printer.
pub fn validate(content_type: &str, content: &[u8]) -> Result<(), ContentError> {
    match content_type {
        "doc" | "markup" => document_of(content_type, content).map(|_| ()),
        _ => Ok(()),
    }
}

/// The profile for a printer: its configured built-in profile, else the default at the
/// document's paper width.
pub fn profile_for(name: Option<&str>, doc: Option<&Document>) -> Profile {
    if let Some(p) = name.and_then(Profile::builtin) {
        return p;
    }
    match doc {
        Some(d) => Profile::for_document(d),
        None => Profile::default(),
    }
}

/// The bytes for the printer. A reprint carries a visible banner line at the top, so a
/// reprinted slip can never pass for the original.
pub fn render_for(
    content_type: &str,
    content: Vec<u8>,
    banner: Option<&str>,
    profile: Option<&str>,
) -> Result<Vec<u8>, String> {
    let mut out = match banner {
        Some(b) => onceprint_escpos::text::header_line(b),
        None => Vec::new(),
    };
    match content_type {
        "escpos" => out.extend_from_slice(&content),
        "text" => {
            let text = String::from_utf8(content).map_err(|_| "stored text is not UTF-8".to_owned())?;
            out.extend_from_slice(&onceprint_escpos::text::text_job(&text));
        }
        "doc" | "markup" => {
            let doc = document_of(content_type, &content).map_err(|e| e.to_string())?.ok_or("no document")?;
            let rendered =
                onceprint_render::to_escpos(&doc, &profile_for(profile, Some(&doc))).map_err(|e| e.to_string())?;
            for w in &rendered.warnings {
                tracing::warn!(warning = ?w, "rendered with a substitution");
            }
            out.extend_from_slice(&rendered.bytes);
        }
        other => return Err(format!("content type {other:?} cannot be rendered")),
    }
    Ok(out)
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

/// The PNG image a rendered-receipt printer prints (CloudPRNT's `image/png`).
pub fn render_png_for(
    content_type: &str,
    content: &[u8],
    banner: Option<&str>,
    profile: Option<&str>,
) -> Result<Vec<u8>, String> {
    let doc = document_for(content_type, content, banner)?;
    onceprint_render::to_png(&doc, &profile_for(profile, Some(&doc))).map_err(|e| e.to_string())
}

/// Plain text of a receipt (CloudPRNT's `text/plain`).
pub fn render_text_for(
    content_type: &str,
    content: &[u8],
    banner: Option<&str>,
    profile: Option<&str>,
) -> Result<String, String> {
    let doc = document_for(content_type, content, banner)?;
    Ok(onceprint_render::to_text(&doc, &profile_for(profile, Some(&doc))))
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
