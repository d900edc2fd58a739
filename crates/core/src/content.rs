//! Print content as submitted (`content.type` = `text`, `escpos`, `doc`), its validation
//! and its canonical bytes. The canonical bytes are what gets stored and fingerprinted, so
//! the same receipt sent with re-ordered JSON keys is still the same content.

use base64::Engine as _;
use serde::Deserialize;

use crate::{CoreError, Fingerprint};

/// Limits applied to content before anything is stored.
#[derive(Debug, Clone, Copy)]
pub struct ContentLimits {
    /// Largest payload after decoding (text bytes, ESC/POS bytes, document JSON bytes).
    pub max_bytes: usize,
}

impl Default for ContentLimits {
    fn default() -> Self {
        // Printer clouds cap content near 12 KB; raster logos make real jobs larger, so the
        // default leaves room while still refusing accidental uploads of whole files.
        ContentLimits { max_bytes: 256 * 1024 }
    }
}

/// The largest request body the broker takes by default (`max_body_bytes`), and the store
/// agent's LAN listener with it: the listener takes what the broker would.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1024 * 1024;

/// The message of a 413 `payload_too_large` answer, the same from the broker and from
/// the store agent's LAN listener.
pub fn body_too_large_message(limit: usize) -> String {
    format!("the request body is larger than the limit of {limit} bytes")
}

/// Content as it arrives on the wire.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Content {
    /// Plain text, printed as is with a cut at the end.
    Text { text: String },
    /// Raw ESC/POS bytes, base64 encoded, passed through untouched.
    Escpos { data: String },
    /// A receipt document. Its schema is validated by the renderer.
    Doc { doc: serde_json::Value },
    /// The tag markup of Chinese printer clouds (`<CB>`, `<BR>`, `<QR>` …), for migration.
    Markup { markup: String },
}

/// Validated content: a type tag and the canonical bytes to store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CanonicalContent {
    pub content_type: &'static str,
    pub bytes: Vec<u8>,
}

impl CanonicalContent {
    pub fn fingerprint(&self) -> Fingerprint {
        Fingerprint::of(self.content_type, &self.bytes)
    }
}

impl Content {
    /// Validates the content and produces its canonical bytes.
    pub fn canonicalize(&self, limits: ContentLimits) -> Result<CanonicalContent, CoreError> {
        let (content_type, bytes) = match self {
            Content::Text { text } => {
                if text.is_empty() {
                    return Err(CoreError::invalid("content.text", "must not be empty"));
                }
                ("text", text.as_bytes().to_vec())
            }
            Content::Escpos { data } => {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(data.as_bytes())
                    .map_err(|e| CoreError::invalid("content.data", format!("is not valid base64: {e}")))?;
                if bytes.is_empty() {
                    return Err(CoreError::invalid("content.data", "must not be empty"));
                }
                ("escpos", bytes)
            }
            Content::Doc { doc } => {
                if !doc.is_object() {
                    return Err(CoreError::invalid("content.doc", "must be a JSON object"));
                }
                // serde_json's default map is ordered by key, so this is canonical.
                ("doc", serde_json::to_vec(doc).map_err(|e| CoreError::invalid("content.doc", e.to_string()))?)
            }
            Content::Markup { markup } => {
                if markup.trim().is_empty() {
                    return Err(CoreError::invalid("content.markup", "must not be empty"));
                }
                ("markup", markup.as_bytes().to_vec())
            }
        };
        if bytes.len() > limits.max_bytes {
            return Err(CoreError::invalid(
                "content",
                format!("is {} bytes, the limit is {} bytes", bytes.len(), limits.max_bytes),
            ));
        }
        Ok(CanonicalContent { content_type, bytes })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: serde_json::Value) -> Content {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn text_and_escpos_canonicalize() {
        let t = parse(json!({"type":"text","text":"hi\n"})).canonicalize(ContentLimits::default()).unwrap();
        assert_eq!(t.content_type, "text");
        assert_eq!(t.bytes, b"hi\n");
        let e = parse(json!({"type":"escpos","data":"G0A="})).canonicalize(ContentLimits::default()).unwrap();
        assert_eq!(e.bytes, vec![0x1b, 0x40]);
    }

    #[test]
    fn doc_key_order_does_not_change_the_fingerprint() {
        let a: Content = serde_json::from_str(r#"{"type":"doc","doc":{"a":1,"b":[1,2]}}"#).unwrap();
        let b: Content = serde_json::from_str(r#"{"type":"doc","doc":{"b":[1,2],"a":1}}"#).unwrap();
        let l = ContentLimits::default();
        assert_eq!(a.canonicalize(l).unwrap().fingerprint(), b.canonicalize(l).unwrap().fingerprint());
    }

    #[test]
    fn bad_content_names_the_field() {
        let l = ContentLimits::default();
        let e = parse(json!({"type":"escpos","data":"!!"})).canonicalize(l).unwrap_err();
        assert!(e.to_string().starts_with("content.data"), "{e}");
        let e = parse(json!({"type":"text","text":""})).canonicalize(l).unwrap_err();
        assert!(e.to_string().starts_with("content.text"), "{e}");
        let big = "x".repeat(11);
        let e = parse(json!({"type":"text","text":big})).canonicalize(ContentLimits { max_bytes: 10 }).unwrap_err();
        assert!(e.to_string().contains("limit"), "{e}");
        assert!(serde_json::from_value::<Content>(json!({"type":"pdf"})).is_err());
    }
}
