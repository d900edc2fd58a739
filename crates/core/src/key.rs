//! The idempotency key (R2) and the content fingerprint (R4).
//!
//! Two submissions are "the same request" when they share tenant, target, `biz_no` and
//! print type. Whether a repeat is a harmless retry or a client bug is decided by the
//! fingerprint: same key with the same content is a duplicate (200), same key with other
//! content is a mismatch (422).

use sha2::{Digest, Sha256};

use crate::{ids::validate_id, CoreError};

/// What a task is addressed to: one printer, or a failover station (R25).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    Printer(String),
    Station(String),
}

impl Target {
    /// Builds the target from the two optional request fields; exactly one must be set.
    pub fn from_request(printer_id: Option<&str>, station_id: Option<&str>) -> Result<Target, CoreError> {
        match (printer_id, station_id) {
            (Some(p), None) => {
                validate_id("printer_id", p)?;
                Ok(Target::Printer(p.to_owned()))
            }
            (None, Some(s)) => {
                validate_id("station_id", s)?;
                Ok(Target::Station(s.to_owned()))
            }
            (Some(_), Some(_)) => {
                Err(CoreError::invalid("printer_id", "give exactly one of printer_id and station_id, not both"))
            }
            (None, None) => Err(CoreError::invalid("printer_id", "one of printer_id and station_id is required")),
        }
    }

    /// The spelling stored in the unique key column. The prefix keeps a printer and a
    /// station with the same id from colliding.
    pub fn key_part(&self) -> String {
        match self {
            Target::Printer(p) => format!("printer:{p}"),
            Target::Station(s) => format!("station:{s}"),
        }
    }
}

/// tenant + target + biz_no + print_type: at most one task exists per key (R2, R5).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey {
    pub tenant_id: String,
    pub target: String,
    pub biz_no: String,
    pub print_type: String,
}

impl IdempotencyKey {
    pub fn new(tenant_id: &str, target: &Target, biz_no: &str, print_type: &str) -> Self {
        IdempotencyKey {
            tenant_id: tenant_id.to_owned(),
            target: target.key_part(),
            biz_no: biz_no.to_owned(),
            print_type: print_type.to_owned(),
        }
    }
}

/// SHA-256 of the canonical content, hex encoded.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub String);

impl Fingerprint {
    /// Fingerprints canonical content bytes under a type tag, so that the text "abc" and
    /// the raw bytes "abc" are different content.
    pub fn of(content_type: &str, canonical: &[u8]) -> Fingerprint {
        let mut h = Sha256::new();
        h.update(content_type.as_bytes());
        h.update([0u8]);
        h.update(canonical);
        let digest = h.finalize();
        let mut out = String::with_capacity(64);
        for b in digest {
            out.push(char::from(b"0123456789abcdef"[(b >> 4) as usize]));
            out.push(char::from(b"0123456789abcdef"[(b & 15) as usize]));
        }
        Fingerprint(out)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exactly_one_target() {
        assert_eq!(Target::from_request(Some("p1"), None), Ok(Target::Printer("p1".into())));
        assert_eq!(Target::from_request(None, Some("hot")), Ok(Target::Station("hot".into())));
        assert!(Target::from_request(Some("p1"), Some("hot")).is_err());
        assert!(Target::from_request(None, None).is_err());
        assert!(Target::from_request(Some("bad id"), None).is_err());
    }

    #[test]
    fn printer_and_station_with_the_same_id_are_different_keys() {
        let a = IdempotencyKey::new("t", &Target::Printer("x".into()), "A1", "receipt");
        let b = IdempotencyKey::new("t", &Target::Station("x".into()), "A1", "receipt");
        assert_ne!(a, b);
    }

    #[test]
    fn fingerprint_depends_on_type_and_bytes() {
        assert_eq!(Fingerprint::of("text", b"abc"), Fingerprint::of("text", b"abc"));
        assert_ne!(Fingerprint::of("text", b"abc"), Fingerprint::of("escpos", b"abc"));
        assert_ne!(Fingerprint::of("text", b"abc"), Fingerprint::of("text", b"abd"));
        assert_eq!(Fingerprint::of("text", b"").as_str().len(), 64);
    }
}
