//! Content as onceprint stores it (a type tag and canonical bytes: `text`, `escpos`,
//! `doc`, `markup`) to the receipt document and to printer bytes. It lives here, beside
//! the renderers, rather than in the broker's engine because the store agent renders too:
//! a task it accepts on the shop's LAN while the broker is unreachable must print exactly
//! as the broker would have printed it.

use crate::{parse_document, parse_markup, Document, Profile, RenderError, Warning};

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

/// The bytes for an ESC/POS printer, with the warnings of the rendering (substituted
/// characters and the like, for the caller to log). A reprint carries a visible banner
/// line at the top, so a reprinted slip can never pass for the original. The broker's
/// dispatcher and the store agent's offline path both print through this function, so a
/// ticket printed on the shop's LAN while the broker is unreachable has the same bytes as
/// the same ticket printed through the broker.
pub fn escpos_for(
    content_type: &str,
    content: Vec<u8>,
    banner: Option<&str>,
    profile: Option<&str>,
) -> Result<(Vec<u8>, Vec<Warning>), String> {
    let mut out = match banner {
        Some(b) => onceprint_escpos::text::header_line(b),
        None => Vec::new(),
    };
    let mut warnings = Vec::new();
    match content_type {
        "escpos" => out.extend_from_slice(&content),
        "text" => {
            let text = String::from_utf8(content).map_err(|_| "stored text is not UTF-8".to_owned())?;
            out.extend_from_slice(&onceprint_escpos::text::text_job(&text));
        }
        "doc" | "markup" => {
            let doc = document_of(content_type, &content).map_err(|e| e.to_string())?.ok_or("no document")?;
            let rendered = crate::to_escpos(&doc, &profile_for(profile, Some(&doc))).map_err(|e| e.to_string())?;
            warnings = rendered.warnings;
            out.extend_from_slice(&rendered.bytes);
        }
        other => return Err(format!("content type {other:?} cannot be rendered")),
    }
    Ok((out, warnings))
}
