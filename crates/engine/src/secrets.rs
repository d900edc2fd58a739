//! API keys, agent tokens and the admin token: generated from the OS random source and
//! stored only as SHA-256 hashes. The secrets are 256-bit random strings, so a fast hash
//! is enough; a slow password hash would only add latency to every request.

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

/// Hex SHA-256 of a secret, the only form in which secrets are stored.
pub fn hash(secret: &str) -> String {
    let digest = Sha256::digest(secret.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
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
}
