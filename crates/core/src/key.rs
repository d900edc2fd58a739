//! The idempotency key and the content fingerprint.
//!
//! Two submissions are "the same request" when they share tenant, target, `biz_no` and
//! print type. Whether a repeat is a harmless retry or a client bug is decided by the
//! fingerprint: same key with the same content is a duplicate (200), same key with other
//! content is a mismatch (422).

use sha2::{Digest, Sha256};

use crate::{ids::validate_id, CoreError};

/// What a task is addressed to: one printer, or a failover station.
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

/// tenant + target + biz_no + print_type: at most one task exists per key.
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

/// The idempotency key every delivery of a task carries to the printer side
/// (docs/API.md): the same on every redelivery of the task, and never the same for two
/// tasks of one printer, so a receiver that prints once per key prints every task once.
///
/// `biz_no#printer_id` for a task submitted to the printer itself with the default print
/// type. Otherwise suffixes, each `#name=value`, say what else tells the task apart:
/// `#type=T` (a print type other than `receipt`), `#station=S` (submitted to a station),
/// `#reprint=N#origin=TASK` (reprint N of a task), `#transfer=TASK` / `#failover=TASK`
/// (the task carrying on another one's work). In `biz_no`, `%` and `#` are written `%25`
/// and `%23`, so a `#` inside a business number can never pass for a separator; printer
/// ids, print types and task ids cannot contain `#` or `=`. Since a task's (target,
/// `biz_no`, print type) is unique per tenant and the key spells all of them (the target
/// through the suffixes), two tasks of one printer never share a key.
pub fn delivery_key(biz_no: &str, printer_id: &str, target: &str, print_type: &str) -> String {
    let mut key = String::with_capacity(biz_no.len() + printer_id.len() + 8);
    for c in biz_no.chars() {
        match c {
            '%' => key.push_str("%25"),
            '#' => key.push_str("%23"),
            c => key.push(c),
        }
    }
    key.push('#');
    key.push_str(printer_id);
    if print_type != crate::policy::DEFAULT_PRINT_TYPE {
        key.push_str("#type=");
        key.push_str(print_type);
    }
    let suffix = match target.split_once(':') {
        Some(("printer", p)) if p == printer_id => String::new(),
        Some(("printer", p)) => format!("#printer={p}"),
        Some(("station", s)) => format!("#station={s}"),
        Some(("reprint", rest)) => match rest.rsplit_once(':') {
            Some((origin, n)) => format!("#reprint={n}#origin={origin}"),
            None => format!("#reprint={rest}"),
        },
        Some(("transfer", origin)) => format!("#transfer={origin}"),
        Some(("failover", origin)) => format!("#failover={origin}"),
        // Not a target this version writes; spelled out whole so it still tells tasks apart.
        _ => format!("#target={}", target.replace('%', "%25").replace('#', "%23")),
    };
    key.push_str(&suffix);
    key
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
    fn delivery_keys_spell_the_simple_case_as_the_contract_says() {
        assert_eq!(delivery_key("A1001", "p1", "printer:p1", "receipt"), "A1001#p1");
        assert_eq!(delivery_key("A1001#kitchen", "p1", "printer:p1", "receipt"), "A1001%23kitchen#p1");
        assert_eq!(delivery_key("A1", "p1", "printer:p1", "prebill"), "A1#p1#type=prebill");
        assert_eq!(delivery_key("A1", "p1", "station:hot", "receipt"), "A1#p1#station=hot");
        assert_eq!(delivery_key("A1", "p1", "reprint:T1:2", "receipt"), "A1#p1#reprint=2#origin=T1");
        assert_eq!(delivery_key("A1", "p2", "failover:T1", "kitchen"), "A1#p2#type=kitchen#failover=T1");
    }

    fn any_id() -> impl proptest::strategy::Strategy<Value = String> {
        proptest::string::string_regex("[a-z0-9:.]{1,4}").expect("regex")
    }

    fn any_target() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        prop_oneof![
            any_id().prop_map(|p| format!("printer:{p}")),
            any_id().prop_map(|s| format!("station:{s}")),
            ("[A-Z0-9]{1,3}", 1u8..4).prop_map(|(o, n)| format!("reprint:{o}:{n}")),
            "[A-Z0-9]{1,3}".prop_map(|o| format!("transfer:{o}")),
            "[A-Z0-9]{1,3}".prop_map(|o| format!("failover:{o}")),
        ]
    }

    proptest::proptest! {
        /// Tasks of one printer are unique by (target, biz_no, print type); their delivery
        /// keys must be too, whatever `#`, `%` or `=` their business numbers contain.
        #[test]
        fn no_two_tasks_of_one_printer_share_a_delivery_key(
            a in (any_target(), "[A#%=1]{0,4}", proptest::sample::select(vec!["receipt", "kitchen", "type=x"])),
            b in (any_target(), "[A#%=1]{0,4}", proptest::sample::select(vec!["receipt", "kitchen", "type=x"])),
        ) {
            let printer = "p1";
            let ka = delivery_key(&a.1, printer, &a.0, a.2);
            let kb = delivery_key(&b.1, printer, &b.0, b.2);
            if a != b {
                proptest::prop_assert_ne!(ka, kb, "{:?} and {:?}", a, b);
            } else {
                proptest::prop_assert_eq!(ka, kb);
            }
        }
    }

    #[test]
    fn fingerprint_depends_on_type_and_bytes() {
        assert_eq!(Fingerprint::of("text", b"abc"), Fingerprint::of("text", b"abc"));
        assert_ne!(Fingerprint::of("text", b"abc"), Fingerprint::of("escpos", b"abc"));
        assert_ne!(Fingerprint::of("text", b"abc"), Fingerprint::of("text", b"abd"));
        assert_eq!(Fingerprint::of("text", b"").as_str().len(), 64);
    }
}
