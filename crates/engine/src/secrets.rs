//! API keys, agent tokens, the admin token and printer passwords: generated from the OS
//! random source and stored only as SHA-256 hashes. The secrets are 256-bit random strings
//! (printer passwords 180 bits, what fits in the 30 characters a TM printer holds), so a
//! fast hash is enough; a slow password hash would only add latency to every request. HTTP
//! Digest's `HA1` of a printer login is kept beside its SHA-256 for the printers that
//! sign in with Digest.

use md5::Digest as _;
use rand::RngCore;
use sha2::{Digest, Sha256};

/// A new random secret with a readable prefix (`opk_` tenant key, `opa_` agent token,
/// `opadm_` admin token) so a leaked string is recognisable in logs and scanners.
pub fn generate(prefix: &str) -> String {
    random_hex::<32>(prefix)
}

/// A new random id with a readable prefix (`key_` API keys, `tok_` agent tokens): 64
/// random bits, enough that ids never collide in practice (the database's unique key
/// refuses one that would), and nothing about the secret it names.
pub fn short_id(prefix: &str) -> String {
    random_hex::<8>(prefix)
}

/// `prefix` followed by `N` random bytes from the OS random source, in hex.
fn random_hex<const N: usize>(prefix: &str) -> String {
    let mut bytes = [0u8; N];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    let mut out = String::with_capacity(prefix.len() + 2 * N);
    out.push_str(prefix);
    for b in bytes {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// The symbols of a printer password: letters, digits, `_` and `-`. Exactly 64, so that
/// six bits of a random byte pick one without bias; every one of them is among those TM
/// Web Config accepts in a password (letters, digits, `_`, `.`, `-`).
const PRINTER_PASSWORD_ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-";

/// The length of a printer password: the most TM Web Config takes (30 characters).
pub const PRINTER_PASSWORD_LEN: usize = 30;

/// A new printer password: [`PRINTER_PASSWORD_LEN`] symbols of `[A-Za-z0-9_-]` from the OS
/// random source, 180 random bits, without a prefix (a prefix would spend characters a
/// TM printer does not have to spare). The alphabet has 64 symbols and 256 is a multiple
/// of 64, so taking the low six bits of each random byte favours no symbol.
pub fn printer_password() -> String {
    let mut bytes = [0u8; PRINTER_PASSWORD_LEN];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    bytes.iter().map(|b| char::from(PRINTER_PASSWORD_ALPHABET[usize::from(b & 63)])).collect()
}

/// The realm of HTTP Digest sign-in (RFC 7616). It is part of every stored `HA1`, so it
/// never changes: a new realm would turn every printer's Digest login away.
pub const DIGEST_REALM: &str = "onceprint";

/// The hash of an HTTP Digest exchange (RFC 7616 §3.3, `algorithm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DigestAlgorithm {
    Md5,
    Sha256,
}

impl DigestAlgorithm {
    /// As the `algorithm` parameter names it.
    pub fn name(self) -> &'static str {
        match self {
            DigestAlgorithm::Md5 => "MD5",
            DigestAlgorithm::Sha256 => "SHA-256",
        }
    }

    /// The algorithm a parameter value names (case-insensitive, as RFC 7616 compares
    /// tokens); `None` for any other, the `-sess` variants among them.
    pub fn from_name(name: &str) -> Option<DigestAlgorithm> {
        if name.eq_ignore_ascii_case("MD5") {
            Some(DigestAlgorithm::Md5)
        } else if name.eq_ignore_ascii_case("SHA-256") {
            Some(DigestAlgorithm::Sha256)
        } else {
            None
        }
    }

    /// `H(data)` in lowercase hex, as RFC 7616 §3.4.1 writes every hash of the exchange.
    pub fn hex(self, data: &str) -> String {
        match self {
            DigestAlgorithm::Md5 => to_hex(&md5::Md5::digest(data.as_bytes())),
            DigestAlgorithm::Sha256 => to_hex(&Sha256::digest(data.as_bytes())),
        }
    }
}

/// RFC 7616's `HA1 = H(username ":" realm ":" password)` of a printer login in the
/// [`DIGEST_REALM`]: what the broker keeps to check Digest answers without the password.
pub fn digest_ha1(algorithm: DigestAlgorithm, username: &str, password: &str) -> String {
    algorithm.hex(&format!("{username}:{DIGEST_REALM}:{password}"))
}

/// Bytes in lowercase hex.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Hex SHA-256 of a secret, the only form in which secrets are stored.
pub fn hash(secret: &str) -> String {
    to_hex(&Sha256::digest(secret.as_bytes()))
}

/// The password line Mosquitto's password file keeps for `password` (`$7$`: PBKDF2 with
/// HMAC-SHA512, 101 iterations, a 12-byte random salt, standard base64), exactly what
/// `mosquitto_passwd` writes. The MQTT server checks a printer's password against it, so
/// the broker keeps this next to its own SHA-256 and can write the password file again
/// from the database at any time without ever storing the password.
pub fn mosquitto_hash(password: &str) -> String {
    let mut salt = [0u8; 12];
    rand::rngs::OsRng.fill_bytes(&mut salt);
    mosquitto_hash_with_salt(password, &salt)
}

/// [`mosquitto_hash`] with a given salt (for tests against `mosquitto_passwd`).
pub fn mosquitto_hash_with_salt(password: &str, salt: &[u8]) -> String {
    use base64::Engine as _;
    use hmac::Mac as _;
    const ITERATIONS: u32 = 101;
    // One PBKDF2 block is enough: SHA-512's output is the 64 bytes Mosquitto keeps.
    let prf = |data: &[&[u8]]| -> [u8; 64] {
        // HMAC takes a key of any length, so this cannot fail.
        let mut mac = match hmac::Hmac::<sha2::Sha512>::new_from_slice(password.as_bytes()) {
            Ok(m) => m,
            Err(_) => return [0u8; 64],
        };
        for d in data {
            mac.update(d);
        }
        mac.finalize().into_bytes().into()
    };
    let mut u = prf(&[salt, &1u32.to_be_bytes()]);
    let mut out = u;
    for _ in 1..ITERATIONS {
        u = prf(&[&u]);
        for (o, x) in out.iter_mut().zip(u.iter()) {
            *o ^= x;
        }
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    format!("$7${ITERATIONS}${}${}", b64.encode(salt), b64.encode(out))
}

/// Compares two hashes in constant time, so response timing reveals nothing about how
/// much of a guessed token matched.
pub fn hashes_equal(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_prefixed_random_and_hashed() {
        let a = generate("opk_");
        let b = generate("opk_");
        assert!(a.starts_with("opk_") && a.len() == 68);
        assert_ne!(a, b);
        assert_eq!(hash(&a), hash(&a));
        assert!(hashes_equal(&hash(&a), &hash(&a)));
        assert!(!hashes_equal(&hash(&a), &hash(&b)));
    }

    #[test]
    fn printer_passwords_are_thirty_symbols_of_the_alphabet() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..200 {
            let p = printer_password();
            assert_eq!(p.len(), PRINTER_PASSWORD_LEN, "{p}");
            assert!(p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'), "{p}");
            seen.extend(p.bytes());
        }
        // 6,000 draws from 64 symbols: every symbol turns up (a miss is about 64 × e^-94).
        assert_eq!(seen.len(), 64);
    }

    #[test]
    fn digest_ha1_is_rfc_7616s() {
        // RFC 7616 §3.9.1: Mufasa in http-auth@example.org, password "Circle of Life".
        let a1 = "Mufasa:http-auth@example.org:Circle of Life";
        assert_eq!(DigestAlgorithm::Md5.hex(a1), "3d78807defe7de2157e2b0b6573a855f");
        assert_eq!(DigestAlgorithm::Sha256.hex(a1), "7987c64c30e25f1b74be53f966b49b90f2808aa92faf9a00262392d7b4794232");
        assert_eq!(digest_ha1(DigestAlgorithm::Md5, "u", "p"), DigestAlgorithm::Md5.hex("u:onceprint:p"));
        assert_eq!(DigestAlgorithm::from_name("sha-256"), Some(DigestAlgorithm::Sha256));
        assert_eq!(DigestAlgorithm::from_name("MD5-sess"), None);
    }

    #[test]
    fn mosquitto_hashes_are_what_mosquitto_passwd_writes() {
        use base64::Engine as _;
        // A line `mosquitto_passwd -b FILE alice s3cret` wrote (Mosquitto 2.0.11).
        let line = "$7$101$cPzKkzLEwu+Qfb+I$VD8SYExUPl84eSSR73PQ5358vYinBc6AH75gY7lJ6Cw1idIOwVLuDR9U6xw9APcVWBM/76p5n7D5q5ZdTouorg==";
        let salt = base64::engine::general_purpose::STANDARD.decode("cPzKkzLEwu+Qfb+I").unwrap_or_default();
        assert_eq!(mosquitto_hash_with_salt("s3cret", &salt), line);
        assert_ne!(mosquitto_hash_with_salt("s3creT", &salt), line);
        let fresh = mosquitto_hash("s3cret");
        assert!(fresh.starts_with("$7$101$") && fresh != mosquitto_hash("s3cret"), "salted: {fresh}");
    }
}
