//! The one error type of the crate and the warnings that come with a successful render.

use std::fmt;

use serde::Serialize;

/// Why a document could not be read or rendered.
///
/// [`RenderError::Invalid`] and [`RenderError::Markup`] are the client's fault (the
/// server answers 400 `invalid_content`, naming [`RenderError::path`]);
/// [`RenderError::Encode`] is ours (500).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// The document breaks a rule; `path` names the field, e.g. `blocks[3].columns[1].width`.
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
    /// The markup cannot be turned into a document (1-based line and column, in characters).
    #[error("markup line {line}, column {column}: {message}")]
    Markup { line: usize, column: usize, message: String },
    /// Writing the PNG failed; not caused by the document.
    #[error("PNG encoding failed: {0}")]
    Encode(String),
}

impl RenderError {
    pub(crate) fn invalid(path: impl Into<String>, message: impl Into<String>) -> RenderError {
        RenderError::Invalid { path: path.into(), message: message.into() }
    }

    /// The field an [`RenderError::Invalid`] is about.
    pub fn path(&self) -> Option<&str> {
        match self {
            RenderError::Invalid { path, .. } => Some(path),
            _ => None,
        }
    }

    /// Whether the input is at fault (HTTP 400 `invalid_content`) rather than the renderer.
    pub fn is_invalid_content(&self) -> bool {
        !matches!(self, RenderError::Encode(_))
    }
}

/// Something the output does not show exactly as the document says, though it rendered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Warning {
    /// The field of the document concerned, e.g. `blocks[2].spans[0].text`.
    pub path: String,
    #[serde(flatten)]
    pub kind: WarningKind,
}

/// What a [`Warning`] is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum WarningKind {
    /// The profile's encoding has no code for `ch`; `replacement` was printed instead.
    Unencodable { ch: char, replacement: String },
    /// A zero-width character (such as a combining accent) the printer cannot print
    /// was left out.
    Dropped { ch: char },
    /// A character wider than the column it is in was left out.
    TooWide { ch: char },
    /// The QR code would not fit the paper at the requested module size.
    QrShrunk { requested: u8, used: u8 },
    /// The barcode would not fit the paper at the requested module width.
    BarcodeShrunk { requested: u8, used: u8 },
    /// More warnings were left out.
    More { count: usize },
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            WarningKind::Unencodable { ch, replacement } => {
                write!(
                    f,
                    "{}: U+{:04X} {ch:?} cannot be printed with this profile; printed {replacement:?}",
                    self.path,
                    u32::from(*ch)
                )
            }
            WarningKind::Dropped { ch } => write!(f, "{}: zero-width U+{:04X} left out", self.path, u32::from(*ch)),
            WarningKind::TooWide { ch } => write!(f, "{}: {ch:?} is wider than its column; left out", self.path),
            WarningKind::QrShrunk { requested, used } => {
                write!(f, "{}: QR module size {requested} does not fit the paper; printed at {used}", self.path)
            }
            WarningKind::BarcodeShrunk { requested, used } => {
                write!(f, "{}: barcode module width {requested} does not fit the paper; printed at {used}", self.path)
            }
            WarningKind::More { count } => write!(f, "{count} more warnings left out"),
        }
    }
}

/// At most this many warnings are kept: a receipt full of emoji should not produce a
/// response larger than itself.
const MAX_WARNINGS: usize = 50;

/// Collects warnings, once per (path, character) and at most [`MAX_WARNINGS`].
#[derive(Debug, Default)]
pub(crate) struct Warnings {
    list: Vec<Warning>,
    dropped: usize,
}

impl Warnings {
    pub(crate) fn push(&mut self, path: String, kind: WarningKind) {
        let warning = Warning { path, kind };
        if self.list.contains(&warning) {
            return;
        }
        if self.list.len() < MAX_WARNINGS {
            self.list.push(warning);
        } else {
            self.dropped += 1;
        }
    }

    pub(crate) fn extend(&mut self, other: Warnings) {
        for w in other.list {
            self.push(w.path, w.kind);
        }
        self.dropped += other.dropped;
    }

    pub(crate) fn into_vec(mut self) -> Vec<Warning> {
        if self.dropped > 0 {
            self.list.push(Warning { path: String::new(), kind: WarningKind::More { count: self.dropped } });
        }
        self.list
    }
}
