//! Errors raised by the domain rules. Each names the offending field so that the HTTP
//! layer can answer with a precise message instead of a generic "bad request".

/// A rule of the domain was broken by input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoreError {
    /// `biz_no` missing or empty: the red line, checked before anything else.
    #[error("biz_no is required and must not be empty")]
    MissingBizNo,
    /// A field is present but malformed.
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
}

impl CoreError {
    /// Shorthand for [`CoreError::Invalid`].
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        CoreError::Invalid { field: field.into(), message: message.into() }
    }
}
