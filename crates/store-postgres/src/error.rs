//! Translation of PostgreSQL and pool failures into [`StoreError`].
//!
//! The callers above the store only distinguish four cases (already exists, not found,
//! unavailable, anything else), so this module decides which SQLSTATEs fall into which
//! case. The names in the messages ("store s1") are chosen by the caller, who knows what
//! it was writing.

use deadpool_postgres::PoolError;
use onceprint_store::StoreError;
use tokio_postgres::error::SqlState;

/// A constraint violation the callers translate into a domain-level answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Violation<'a> {
    /// SQLSTATE 23505; carries the constraint name so that callers can tell which unique
    /// key collided (a tenant's id or its API key hash).
    Unique(&'a str),
    /// SQLSTATE 23503.
    ForeignKey(&'a str),
}

/// Classifies a unique or foreign-key violation; `None` for every other failure.
pub(crate) fn violation(e: &tokio_postgres::Error) -> Option<Violation<'_>> {
    let db = e.as_db_error()?;
    let constraint = db.constraint().unwrap_or("");
    if *db.code() == SqlState::UNIQUE_VIOLATION {
        Some(Violation::Unique(constraint))
    } else if *db.code() == SqlState::FOREIGN_KEY_VIOLATION {
        Some(Violation::ForeignKey(constraint))
    } else {
        None
    }
}

/// Maps a failed statement to [`StoreError::Unavailable`] when the connection or the
/// server is the problem, and to [`StoreError::Backend`] otherwise.
pub(crate) fn pg_error(e: tokio_postgres::Error) -> StoreError {
    if is_unavailable(&e) {
        StoreError::Unavailable(describe(&e))
    } else {
        StoreError::Backend(describe(&e))
    }
}

/// Maps a failure to check out a pooled connection. Every such failure means the database
/// could not be reached or refused us (a wrong password included), so all of them are
/// `Unavailable` except a misconfigured pool, which is a bug on our side.
pub(crate) fn pool_error(e: PoolError) -> StoreError {
    match e {
        PoolError::Timeout(kind) => {
            StoreError::Unavailable(format!("timed out getting a PostgreSQL connection ({kind:?})"))
        }
        PoolError::Backend(e) => StoreError::Unavailable(describe(&e)),
        PoolError::Closed => StoreError::Unavailable("the PostgreSQL connection pool is closed".into()),
        PoolError::PostCreateHook(e) => {
            StoreError::Unavailable(format!("setting up a PostgreSQL connection failed: {e}"))
        }
        PoolError::NoRuntimeSpecified => StoreError::Backend("the PostgreSQL pool was built without a runtime".into()),
    }
}

/// Whether a failure is about reaching the database rather than about the statement.
fn is_unavailable(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.code() {
        // Class 08 is "connection exception"; 57P0x are shutdowns and "cannot connect
        // now" during startup or recovery; 53300 is "too many connections".
        Some(code) => {
            let code = code.code();
            code.starts_with("08") || code.starts_with("57P") || code == "53300"
        }
        // Without a SQLSTATE the server never answered: an IO error or a timeout while
        // connecting or talking to it.
        None => {
            let source = std::error::Error::source(e);
            source.is_some_and(|s| s.is::<std::io::Error>()) || e.to_string().contains("timeout")
        }
    }
}

/// A one-line description for logs: the server's message and SQLSTATE when there is one.
fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let mut out = format!("{} (SQLSTATE {})", db.message(), db.code().code());
            if let Some(detail) = db.detail() {
                out.push_str(": ");
                out.push_str(detail);
            }
            out
        }
        None => with_causes(e),
    }
}

/// An error's message followed by its causes ("error connecting to server: Connection
/// refused"). tokio-postgres keeps the useful part, the IO error, in the source chain.
pub(crate) fn with_causes(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        // Some wrappers already repeat their cause in their own message.
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cause = c.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_timeouts_are_unavailable() {
        let e = pool_error(PoolError::Timeout(deadpool_postgres::TimeoutType::Wait));
        assert!(matches!(e, StoreError::Unavailable(_)), "{e:?}");
        assert!(matches!(pool_error(PoolError::Closed), StoreError::Unavailable(_)));
    }
}
