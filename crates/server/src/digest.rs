//! HTTP Digest sign-in of printers (RFC 7616), beside Basic: what Epson's Server Direct
//! Print User's Manual describes for a TM printer's authentication (a first request
//! without credentials, a 401 challenge, then the request with user ID and password as a
//! Digest answer).
//!
//! The challenge offers SHA-256 first and MD5 second (TM printers may know only MD5), both
//! with `qop="auth"`. A Digest answer never carries the password, so it is checked against
//! the `HA1` (`H(username:realm:password)`) kept with the login since Digest was offered
//! (`onceprint_engine::secrets::digest_ha1`); a login made earlier has none and is told to
//! rotate.
//!
//! Nonces are stateless: the time of issue and 8 random bytes, with an HMAC-SHA256 of both
//! under a key drawn once per process. A nonce is good for [`DEFAULT_NONCE_TTL_MS`]; a
//! valid answer with an expired nonce, or one this process did not issue (another node's,
//! or one from before a restart), is answered `stale=true`, so that the printer answers the
//! new challenge without asking anyone for the password. Each (nonce, nc, cnonce) is taken
//! once: a replayed answer is refused, which stops a captured request from being sent again
//! (a replayed GetRequest would take the printer's next job).
//!
//! Answers without `qop` (RFC 2069) are refused: without the client's nonce and count they
//! cannot be told from a replay while the nonce lives, and the challenge always asks for
//! `qop="auth"`, which RFC 7616 requires of clients.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{LazyLock, Mutex};

use axum::http::HeaderValue;
use base64::Engine as _;
use hmac::{Hmac, Mac as _};
use onceprint_engine::secrets::{self, DigestAlgorithm, DIGEST_REALM};
use rand::RngCore as _;
use sha2::{Digest as _, Sha256};

/// How long a nonce is good for, unless configured otherwise.
pub const DEFAULT_NONCE_TTL_MS: u64 = 5 * 60 * 1000;

/// How many used (nonce, nc, cnonce) are remembered at most. Only answers that passed the
/// password check are remembered, so this bounds what genuine printers can fill in one
/// nonce lifetime (about 800 Digest requests a second for 5 minutes); past it the oldest
/// are forgotten first, which are the nearest to expiring anyway.
const MAX_REMEMBERED_ANSWERS: usize = 250_000;

/// How often at most the broker's log repeats that one login has no Digest key.
const NO_KEY_LOG_EVERY_MS: i64 = 10 * 60 * 1000;

/// The per-process key of the nonces' HMAC. A process-wide value rather than a field of
/// the server's state, because every 401 answer to a printer carries a fresh challenge,
/// including those made from an error far from the state.
static NONCE_KEY: LazyLock<[u8; 32]> = LazyLock::new(|| {
    let mut key = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut key);
    key
});

type HmacSha256 = Hmac<Sha256>;

fn mac(data: &[u8]) -> [u8; 32] {
    // HMAC takes a key of any length, so this cannot fail.
    let Ok(mut m) = HmacSha256::new_from_slice(&*NONCE_KEY) else { return [0u8; 32] };
    m.update(data);
    m.finalize().into_bytes().into()
}

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// A new nonce issued at `now_ms`: base64url of the time (8 bytes), 8 random bytes and the
/// first 16 bytes of their HMAC.
fn mint_nonce(now_ms: i64) -> String {
    let mut body = [0u8; 32];
    body[..8].copy_from_slice(&now_ms.to_be_bytes());
    rand::rngs::OsRng.fill_bytes(&mut body[8..16]);
    let tag = mac(&body[..16]);
    body[16..].copy_from_slice(&tag[..16]);
    B64.encode(body)
}

/// When a nonce of this process was issued; `None` for one it did not issue.
fn nonce_issued_at(nonce: &str) -> Option<i64> {
    let body = B64.decode(nonce).ok()?;
    let body: [u8; 32] = body.try_into().ok()?;
    let tag = mac(&body[..16]);
    let expected = secrets::to_hex(&tag[..16]);
    if !secrets::hashes_equal(&secrets::to_hex(&body[16..]), &expected) {
        return None;
    }
    let mut at = [0u8; 8];
    at.copy_from_slice(&body[..8]);
    Some(i64::from_be_bytes(at))
}

/// The `opaque` of the challenges. RFC 7616 lets a server send it for the client to return
/// unchanged; the nonce already proves that this process issued the challenge, so a
/// missing or different `opaque` changes nothing.
fn opaque() -> &'static str {
    static OPAQUE: LazyLock<String> = LazyLock::new(|| secrets::to_hex(&mac(b"opaque")[..16]));
    &OPAQUE
}

/// The Digest challenges of a 401 answer to a printer, most preferred first (RFC 7616
/// §3.7): SHA-256, then MD5. `stale`: the answer was right but its nonce was not.
pub fn challenges(stale: bool) -> Vec<HeaderValue> {
    let now = onceprint_engine::clock::now_ms();
    [DigestAlgorithm::Sha256, DigestAlgorithm::Md5]
        .into_iter()
        .filter_map(|algorithm| {
            let value = format!(
                "Digest realm=\"{DIGEST_REALM}\", qop=\"auth\", algorithm={}, nonce=\"{}\", opaque=\"{}\"{}",
                algorithm.name(),
                mint_nonce(now),
                opaque(),
                if stale { ", stale=true" } else { "" },
            );
            HeaderValue::from_str(&value).ok()
        })
        .collect()
}

/// The parameters of a Digest `Authorization` header (RFC 7616 §3.4).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Answer {
    params: HashMap<String, String>,
}

impl Answer {
    /// Reads the part after `Digest `: comma-separated `name=token` or `name="quoted"`
    /// (with `\` escapes). A name given twice is refused: two values leave it unclear which
    /// one the client meant.
    pub fn parse(text: &str) -> Result<Answer, String> {
        let mut params = HashMap::new();
        let mut rest = text.trim_start();
        while !rest.is_empty() {
            let eq = rest.find('=').ok_or_else(|| format!("a parameter without a value at {rest:?}"))?;
            let name = rest[..eq].trim().to_ascii_lowercase();
            if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
                return Err(format!("a parameter name that is not a token: {name:?}"));
            }
            rest = rest[eq + 1..].trim_start();
            let value;
            if let Some(quoted) = rest.strip_prefix('"') {
                let mut out = String::new();
                let mut chars = quoted.char_indices();
                let mut end = None;
                while let Some((i, c)) = chars.next() {
                    match c {
                        '\\' => match chars.next() {
                            Some((_, escaped)) => out.push(escaped),
                            None => break,
                        },
                        '"' => {
                            end = Some(i);
                            break;
                        }
                        c => out.push(c),
                    }
                }
                let end = end.ok_or_else(|| format!("the value of {name} has no closing quote"))?;
                value = out;
                rest = quoted[end + 1..].trim_start();
            } else {
                let end = rest.find(',').unwrap_or(rest.len());
                value = rest[..end].trim().to_owned();
                rest = &rest[end..];
            }
            if params.insert(name.clone(), value).is_some() {
                return Err(format!("{name} is given twice"));
            }
            rest = match rest.strip_prefix(',') {
                Some(r) => r.trim_start(),
                None if rest.is_empty() => rest,
                None => return Err(format!("a comma expected before {rest:?}")),
            };
        }
        Ok(Answer { params })
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.params.get(name).map(String::as_str)
    }

    fn required(&self, name: &str) -> Result<&str, Refusal> {
        self.get(name).filter(|v| !v.is_empty()).ok_or_else(|| {
            Refusal::plain(format!("the Digest answer has no {name}: answer the challenge with every field"))
        })
    }
}

/// Why a Digest answer was not taken.
#[derive(Debug, PartialEq, Eq)]
pub struct Refusal {
    pub message: String,
    /// The answer was right but its nonce is no longer (or never was) good: the client
    /// answers the new challenge with the same password (RFC 7616 §3.3, `stale`).
    pub stale: bool,
}

impl Refusal {
    fn plain(message: impl Into<String>) -> Refusal {
        Refusal { message: message.into(), stale: false }
    }

    fn stale(message: impl Into<String>) -> Refusal {
        Refusal { message: message.into(), stale: true }
    }
}

/// What a checked answer says, before its user is looked up.
pub struct Checked<'a> {
    answer: &'a Answer,
    pub username: &'a str,
    pub algorithm: DigestAlgorithm,
}

/// Checks everything of an answer that does not need the login: the fields are there,
/// the realm, `qop`, algorithm and `uri` are this broker's and this request's. `method`
/// and `request_uri` (path and query as the request line has them) are the request's.
pub fn check_form<'a>(answer: &'a Answer, request_uri: &str) -> Result<Checked<'a>, Refusal> {
    let Some(qop) = answer.get("qop") else {
        return Err(Refusal::plain(
            "a Digest answer without qop (RFC 2069) is not accepted: answer the challenge with qop=auth",
        ));
    };
    if !qop.eq_ignore_ascii_case("auth") {
        return Err(Refusal::plain(format!("qop {qop:?} is not offered: answer with qop=auth")));
    }
    for name in ["username", "realm", "nonce", "uri", "response", "nc", "cnonce"] {
        answer.required(name)?;
    }
    if answer.get("userhash").is_some_and(|u| u.eq_ignore_ascii_case("true")) {
        return Err(Refusal::plain("userhash is not offered: send the user name itself"));
    }
    let algorithm = match answer.get("algorithm") {
        // RFC 7616 §3.3: no algorithm means MD5.
        None => DigestAlgorithm::Md5,
        Some(name) => DigestAlgorithm::from_name(name)
            .ok_or_else(|| Refusal::plain(format!("algorithm {name:?} is not offered: use SHA-256 or MD5")))?,
    };
    let realm = answer.required("realm")?;
    if realm != DIGEST_REALM {
        return Err(Refusal::plain(format!("realm {realm:?} is not this broker's ({DIGEST_REALM:?})")));
    }
    let uri = answer.required("uri")?;
    if !same_target(uri, request_uri) {
        return Err(Refusal::plain(format!(
            "the Digest answer is for uri {uri:?}, not for this request's {request_uri:?}"
        )));
    }
    let nc = answer.required("nc")?;
    if nc.len() != 8 || !nc.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Refusal::plain(format!("nc {nc:?} is not 8 hexadecimal digits")));
    }
    Ok(Checked { answer, username: answer.required("username")?, algorithm })
}

/// Whether the answer's `uri` names the request's target (RFC 7616 §3.4.6): the same
/// path and query, given as the request line has them or as an absolute URI.
fn same_target(uri: &str, request_uri: &str) -> bool {
    if uri == request_uri {
        return true;
    }
    match uri.parse::<axum::http::Uri>() {
        Ok(u) if u.scheme().is_some() => u.path_and_query().is_some_and(|pq| pq.as_str() == request_uri),
        _ => false,
    }
}

/// The `response` an answer must carry for this `ha1` (RFC 7616 §3.4.1, `qop=auth`).
fn expected_response(checked: &Checked<'_>, ha1: &str, method: &str) -> String {
    let a = checked.answer;
    let field = |n: &str| a.get(n).unwrap_or_default();
    let ha2 = checked.algorithm.hex(&format!("{method}:{}", field("uri")));
    checked.algorithm.hex(&format!(
        "{ha1}:{}:{}:{}:{}:{ha2}",
        field("nonce"),
        field("nc"),
        field("cnonce"),
        field("qop").to_ascii_lowercase()
    ))
}

/// The per-server part of Digest sign-in: the nonce lifetime, the answers already taken
/// and when a login without a Digest key was last logged.
pub struct DigestAuth {
    nonce_ttl_ms: i64,
    used: Mutex<Used>,
    no_key_logged: Mutex<HashMap<String, i64>>,
}

#[derive(Default)]
struct Used {
    seen: HashSet<[u8; 16]>,
    order: VecDeque<(i64, [u8; 16])>,
}

impl DigestAuth {
    pub fn new(nonce_ttl_ms: u64) -> DigestAuth {
        DigestAuth {
            nonce_ttl_ms: i64::try_from(nonce_ttl_ms).unwrap_or(i64::MAX),
            used: Mutex::default(),
            no_key_logged: Mutex::default(),
        }
    }

    /// Checks the answer's `response` against the login's `ha1`, then its nonce, then
    /// that it was not taken before. The response is checked first so that `stale` is
    /// said only to a client that knows the password.
    pub fn verify(&self, checked: &Checked<'_>, ha1: &str, method: &str, now_ms: i64) -> Result<(), Refusal> {
        let a = checked.answer;
        let given = a.get("response").unwrap_or_default().to_ascii_lowercase();
        if !secrets::hashes_equal(&given, &expected_response(checked, ha1, method)) {
            return Err(Refusal::plain("unknown printer login"));
        }
        let nonce = a.get("nonce").unwrap_or_default();
        let fresh = nonce_issued_at(nonce).is_some_and(|at| at <= now_ms && now_ms - at <= self.nonce_ttl_ms);
        if !fresh {
            return Err(Refusal::stale(
                "the Digest nonce has expired or was not issued here: answer the new challenge",
            ));
        }
        let key = answer_key(nonce, a.get("nc").unwrap_or_default(), a.get("cnonce").unwrap_or_default());
        if !self.first_use(key, now_ms) {
            return Err(Refusal::stale(
                "this Digest answer was taken before (same nonce, nc and cnonce): answer the new challenge",
            ));
        }
        Ok(())
    }

    /// Records an answer; `false` when it was recorded before.
    fn first_use(&self, key: [u8; 16], now_ms: i64) -> bool {
        let Ok(mut used) = self.used.lock() else { return false };
        // Answers whose nonce can no longer be fresh need not be remembered.
        while used.order.front().is_some_and(|(at, _)| now_ms - at > self.nonce_ttl_ms) {
            if let Some((_, old)) = used.order.pop_front() {
                used.seen.remove(&old);
            }
        }
        if !used.seen.insert(key) {
            return false;
        }
        used.order.push_back((now_ms, key));
        while used.order.len() > MAX_REMEMBERED_ANSWERS {
            if let Some((_, old)) = used.order.pop_front() {
                used.seen.remove(&old);
            }
        }
        true
    }

    /// Whether the broker's log should say (again) that `username` has no Digest key: at
    /// most every ten minutes per login, since the printer asks every few seconds.
    pub fn log_missing_key(&self, username: &str, now_ms: i64) -> bool {
        let Ok(mut logged) = self.no_key_logged.lock() else { return false };
        logged.retain(|_, at| now_ms - *at < NO_KEY_LOG_EVERY_MS);
        if logged.contains_key(username) {
            return false;
        }
        logged.insert(username.to_owned(), now_ms);
        true
    }
}

/// One answer's identity, for the replay check: the nonce with the client's count (as a
/// number, so that `0000000a` and `0000000A` are one) and nonce.
fn answer_key(nonce: &str, nc: &str, cnonce: &str) -> [u8; 16] {
    let count = u32::from_str_radix(nc, 16).unwrap_or(u32::MAX);
    let digest = Sha256::digest(format!("{nonce}\n{count}\n{cnonce}").as_bytes());
    let mut key = [0u8; 16];
    key.copy_from_slice(&digest[..16]);
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7616 §3.9.1, with the example's realm in place of this broker's.
    fn rfc_answer(algorithm: &str, response: &str) -> Answer {
        Answer::parse(&format!(
            "username=\"Mufasa\", realm=\"{DIGEST_REALM}\", uri=\"/dir/index.html\", algorithm={algorithm}, \
             nonce=\"7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v\", nc=00000001, \
             cnonce=\"f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ\", qop=auth, response=\"{response}\", \
             opaque=\"FQhe/qaU925kfnzjCev0ciny7QMkPqMAFRtzCUYo5tdS\""
        ))
        .expect("parses")
    }

    #[test]
    fn responses_are_computed_as_rfc_7616_shows() {
        // The example's HA1s, computed with its realm "http-auth@example.org".
        let ha1_md5 = DigestAlgorithm::Md5.hex("Mufasa:http-auth@example.org:Circle of Life");
        let ha1_sha = DigestAlgorithm::Sha256.hex("Mufasa:http-auth@example.org:Circle of Life");
        let md5 = rfc_answer("MD5", "8ca523f5e9506fed4657c9700eebdbec");
        let checked = check_form(&md5, "/dir/index.html").expect("well formed");
        assert_eq!(expected_response(&checked, &ha1_md5, "GET"), "8ca523f5e9506fed4657c9700eebdbec");
        let sha = rfc_answer("SHA-256", "753927fa0e85d155564e2e272a28d1802ca10daf4496794697cf8db5856cb6c1");
        let checked = check_form(&sha, "/dir/index.html").expect("well formed");
        assert_eq!(checked.algorithm, DigestAlgorithm::Sha256);
        assert_eq!(
            expected_response(&checked, &ha1_sha, "GET"),
            "753927fa0e85d155564e2e272a28d1802ca10daf4496794697cf8db5856cb6c1"
        );
    }

    #[test]
    fn nonces_are_this_process_s_and_dated() {
        let n = mint_nonce(1_000);
        assert_eq!(nonce_issued_at(&n), Some(1_000));
        assert_ne!(mint_nonce(1_000), n, "two nonces of one millisecond differ");
        let mut forged = B64.decode(&n).expect("base64");
        forged[7] ^= 1;
        assert_eq!(nonce_issued_at(&B64.encode(&forged)), None, "a changed time breaks the tag");
        assert_eq!(nonce_issued_at("not a nonce"), None);
    }

    #[test]
    fn answers_are_parsed_strictly() {
        let a = Answer::parse(r#"username="a\"b", nc=00000001 , qop=auth"#).expect("parses");
        assert_eq!(a.get("username"), Some("a\"b"));
        assert_eq!(a.get("nc"), Some("00000001"));
        assert!(Answer::parse(r#"username="a", username="b""#).is_err());
        assert!(Answer::parse(r#"username="a"#).is_err());
        assert!(Answer::parse("username").is_err());
        let no_qop =
            Answer::parse(r#"username="u", realm="onceprint", nonce="n", uri="/", response="r""#).expect("parses");
        assert!(check_form(&no_qop, "/").is_err_and(|r| r.message.contains("RFC 2069")));
    }

    #[test]
    fn an_answer_is_taken_once() {
        let auth = DigestAuth::new(1_000);
        let key = answer_key("n", "00000001", "c");
        assert!(auth.first_use(key, 10));
        assert!(!auth.first_use(key, 20));
        assert!(auth.first_use(answer_key("n", "00000002", "c"), 20));
        assert_eq!(answer_key("n", "0000000a", "c"), answer_key("n", "0000000A", "c"));
    }
}
