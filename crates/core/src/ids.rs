//! Identifiers: the allowed alphabet for caller-chosen ids and the broker-generated task id.

use crate::CoreError;

/// Longest caller-chosen id (docs/API.md: 1–64 characters).
pub const MAX_ID_LEN: usize = 64;

/// Checks a caller-chosen id (tenant, store, printer, station, print type): 1–64
/// characters of `A-Za-z0-9._:-`. The alphabet keeps ids safe in URLs, logs, CSV exports
/// and the `biz_no#printer_id` delivery key without any escaping.
pub fn validate_id(field: &str, value: &str) -> Result<(), CoreError> {
    if value.is_empty() {
        return Err(CoreError::invalid(field, "must not be empty"));
    }
    if value.len() > MAX_ID_LEN {
        return Err(CoreError::invalid(field, format!("must be at most {MAX_ID_LEN} characters, got {}", value.len())));
    }
    if let Some(bad) = value.chars().find(|c| !is_id_char(*c)) {
        return Err(CoreError::invalid(
            field,
            format!("character {bad:?} is not allowed (allowed: A-Z a-z 0-9 . _ : -)"),
        ));
    }
    Ok(())
}

fn is_id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-')
}

/// Longest accepted `biz_no`. Business numbers are chosen by order systems and may carry
/// suffixes such as `#kitchen`, so they get a wider alphabet than ids, but a bound keeps
/// the unique index small and rejects pasted garbage.
pub const MAX_BIZ_NO_LEN: usize = 128;

/// Checks a business number. Empty means missing. Control characters are refused
/// because they break logs and CSV reconciliation exports.
pub fn validate_biz_no(value: Option<&str>) -> Result<&str, CoreError> {
    let value = match value {
        None => return Err(CoreError::MissingBizNo),
        Some(v) if v.trim().is_empty() => return Err(CoreError::MissingBizNo),
        Some(v) => v,
    };
    // Characters, as the OpenAPI document's `maxLength` counts them.
    let len = value.chars().count();
    if len > MAX_BIZ_NO_LEN {
        return Err(CoreError::invalid("biz_no", format!("must be at most {MAX_BIZ_NO_LEN} characters, got {len}")));
    }
    if value.chars().any(char::is_control) {
        return Err(CoreError::invalid("biz_no", "must not contain control characters"));
    }
    Ok(value)
}

/// A store agent's session id: one per agent process, `t` + 12 hex digits of the
/// process's start in milliseconds + `-` + 16 hex digits of randomness. The start time
/// lets the broker tell, even after it restarted itself, which of two live processes with
/// one agent id is the newer (it wins; the older is told to stop).
pub fn agent_session_id(started_ms: crate::Millis, random: u64) -> String {
    format!("t{:012x}-{random:016x}", started_ms.max(0))
}

/// The start time an [`agent_session_id`] carries; `None` for other session ids (an older
/// agent's), which the broker orders by when it first saw them.
pub fn agent_session_started_at(session: &str) -> Option<crate::Millis> {
    let rest = session.strip_prefix('t')?;
    let (ms, _) = rest.split_once('-')?;
    if ms.len() != 12 {
        return None;
    }
    i64::from_str_radix(ms, 16).ok()
}

/// A broker-generated task id: 26 characters of Crockford base32 encoding 48 bits of
/// creation time (ms) and 80 random bits, like a ULID. Ids sort by creation time, which
/// gives list pagination a stable order without a second column.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId(String);

const CROCKFORD: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

impl TaskId {
    /// Builds an id from the creation time and 10 random bytes supplied by the caller.
    pub fn from_parts(now_ms: crate::Millis, random: [u8; 10]) -> TaskId {
        let mut value: u128 = (now_ms.max(0) as u128 & 0xFFFF_FFFF_FFFF) << 80;
        for (i, b) in random.iter().enumerate() {
            value |= (*b as u128) << (8 * (9 - i));
        }
        let mut out = [0u8; 26];
        for (i, slot) in out.iter_mut().enumerate() {
            let shift = 5 * (25 - i);
            *slot = CROCKFORD[((value >> shift) & 0x1F) as usize];
        }
        // The alphabet is ASCII, so this cannot fail; fall back defensively anyway.
        TaskId(String::from_utf8_lossy(&out).into_owned())
    }

    /// Accepts an id that came back from a client, checking its shape so that a malformed
    /// id is a clean 404 rather than a database error.
    pub fn parse(s: &str) -> Option<TaskId> {
        (s.len() == 26 && s.bytes().all(|b| CROCKFORD.contains(&b))).then(|| TaskId(s.to_owned()))
    }

    /// The creation time (ms) and the 80 random bits of an id in this format; `None` for
    /// any other string (ids of the conformance tests, say).
    pub fn parts(s: &str) -> Option<(crate::Millis, u128)> {
        let id = TaskId::parse(s)?;
        let mut value: u128 = 0;
        for b in id.0.bytes() {
            let digit = CROCKFORD.iter().position(|c| *c == b)? as u128;
            value = (value << 5) | digit;
        }
        Some(((value >> 80) as crate::Millis, value & ((1u128 << 80) - 1)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

impl std::fmt::Display for TaskId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_come_apart_into_what_built_them() {
        let id = TaskId::from_parts(1_800_000_000_123, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
        let (ms, random) = TaskId::parts(id.as_str()).expect("parts");
        assert_eq!(ms, 1_800_000_000_123);
        assert_eq!(random, 0x0102_0304_0506_0708_090a);
        assert_eq!(TaskId::parts("00000000000000000001-acme"), None);
    }

    #[test]
    fn ids_accept_the_contract_alphabet_only() {
        assert!(validate_id("id", "p1").is_ok());
        assert!(validate_id("id", "Store_1.main:front-2").is_ok());
        assert!(validate_id("id", &"a".repeat(64)).is_ok());
        assert!(validate_id("id", "").is_err());
        assert!(validate_id("id", &"a".repeat(65)).is_err());
        assert!(validate_id("id", "a b").is_err());
        assert!(validate_id("id", "a/b").is_err());
        assert!(validate_id("id", "打印机").is_err());
    }

    #[test]
    fn biz_no_missing_or_blank_is_the_red_line() {
        assert_eq!(validate_biz_no(None), Err(CoreError::MissingBizNo));
        assert_eq!(validate_biz_no(Some("")), Err(CoreError::MissingBizNo));
        assert_eq!(validate_biz_no(Some("   ")), Err(CoreError::MissingBizNo));
        assert_eq!(validate_biz_no(Some("A1001#kitchen")), Ok("A1001#kitchen"));
        assert!(validate_biz_no(Some("a\nb")).is_err());
    }

    #[test]
    fn task_ids_sort_by_time_and_round_trip() {
        let a = TaskId::from_parts(1_700_000_000_000, [0xFF; 10]);
        let b = TaskId::from_parts(1_700_000_000_001, [0; 10]);
        assert!(a < b);
        assert_eq!(a.as_str().len(), 26);
        assert_eq!(TaskId::parse(a.as_str()), Some(a.clone()));
        assert_eq!(TaskId::parse("not-an-id"), None);
    }
}
