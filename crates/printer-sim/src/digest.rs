//! How a simulated Epson TM printer signs in to a Server Direct Print server: as the Epson
//! Server Direct Print User's Manual, authentication, describes it, by HTTP Digest access
//! authentication (RFC 7616) — a first request without credentials, a 401 challenge, then
//! the request with the user ID and password as a Digest answer. The printer keeps the
//! challenge and answers the next requests with it and an increasing count, and takes a
//! new challenge whenever the server sends one (an expired nonce: `stale=true`).
//!
//! Written from RFC 7616 and Epson's manual, not from the broker's code, so that the
//! simulator checks the broker rather than agreeing with it.

use std::sync::Mutex;

use md5::Digest as _;
use rand::RngCore as _;
use sha2::Digest as _;

/// The longest password TM Web Config takes (TM-i / TM Web Config password rules).
pub const MAX_PASSWORD_LEN: usize = 30;

/// Refuses a password a TM printer could not hold: TM Web Config (TM-i / TM Web Config
/// password rules) takes at most 30 characters of letters, digits, `_`, `.` and `-`.
pub fn check_password(password: &str) -> Result<(), String> {
    if password.is_empty() || password.len() > MAX_PASSWORD_LEN {
        return Err(format!(
            "an Epson TM printer takes a password of 1 to {MAX_PASSWORD_LEN} characters (TM Web Config); this one \
             has {}: rotate the printer's credentials for a password a TM printer can hold",
            password.chars().count()
        ));
    }
    if let Some(c) = password.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))) {
        return Err(format!(
            "an Epson TM printer takes only letters, digits, '_', '.' and '-' in a password (TM Web Config); this \
             one has {c:?}"
        ));
    }
    Ok(())
}

/// The hash a challenge names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Algorithm {
    Md5,
    Sha256,
}

impl Algorithm {
    fn name(self) -> &'static str {
        match self {
            Algorithm::Md5 => "MD5",
            Algorithm::Sha256 => "SHA-256",
        }
    }

    fn hex(self, data: &str) -> String {
        let bytes: Vec<u8> = match self {
            Algorithm::Md5 => md5::Md5::digest(data.as_bytes()).to_vec(),
            Algorithm::Sha256 => sha2::Sha256::digest(data.as_bytes()).to_vec(),
        };
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// A Digest challenge the printer answers.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Challenge {
    realm: String,
    nonce: String,
    opaque: Option<String>,
    algorithm: Algorithm,
}

/// The challenge to answer among a 401's `WWW-Authenticate` values: SHA-256 when offered,
/// MD5 otherwise; only `qop="auth"` challenges (a printer answers none without it).
fn choose(values: &[String]) -> Option<Challenge> {
    let mut best: Option<Challenge> = None;
    for v in values {
        let Some(rest) = v.strip_prefix("Digest ").or_else(|| v.strip_prefix("digest ")) else { continue };
        let params = params(rest);
        let get = |k: &str| params.iter().find(|(n, _)| n.eq_ignore_ascii_case(k)).map(|(_, v)| v.clone());
        let algorithm = match get("algorithm").as_deref() {
            None => Algorithm::Md5,
            Some(a) if a.eq_ignore_ascii_case("MD5") => Algorithm::Md5,
            Some(a) if a.eq_ignore_ascii_case("SHA-256") => Algorithm::Sha256,
            Some(_) => continue,
        };
        if !get("qop").is_some_and(|q| q.split(',').any(|q| q.trim().eq_ignore_ascii_case("auth"))) {
            continue;
        }
        let (Some(realm), Some(nonce)) = (get("realm"), get("nonce")) else { continue };
        let c = Challenge { realm, nonce, opaque: get("opaque"), algorithm };
        if best.as_ref().is_none_or(|b| b.algorithm == Algorithm::Md5 && c.algorithm == Algorithm::Sha256) {
            best = Some(c);
        }
    }
    best
}

/// `name=value` pairs of a challenge, values unquoted.
fn params(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = text.trim();
    while let Some(eq) = rest.find('=') {
        let name = rest[..eq].trim().trim_start_matches(',').trim().to_owned();
        rest = rest[eq + 1..].trim_start();
        let value;
        if let Some(q) = rest.strip_prefix('"') {
            let end = q.find('"').unwrap_or(q.len());
            value = q[..end].to_owned();
            rest = q.get(end + 1..).unwrap_or_default();
        } else {
            let end = rest.find(',').unwrap_or(rest.len());
            value = rest[..end].trim().to_owned();
            rest = &rest[end..];
        }
        out.push((name, value));
        rest = rest.trim_start().trim_start_matches(',').trim_start();
    }
    out
}

/// The Digest state of one printer: the challenge it answers and its count.
#[derive(Default)]
pub(crate) struct Session {
    current: Mutex<Option<(Challenge, u32)>>,
}

impl Session {
    /// The `Authorization` value for `method` on `uri`, when the printer has a challenge.
    fn answer(&self, method: &str, uri: &str, username: &str, password: &str) -> Option<String> {
        let mut current = self.current.lock().ok()?;
        let (c, nc) = current.as_mut()?;
        *nc += 1;
        let nc = format!("{:08x}", *nc);
        let mut raw = [0u8; 16];
        rand::rngs::OsRng.fill_bytes(&mut raw);
        let cnonce: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        let ha1 = c.algorithm.hex(&format!("{username}:{}:{password}", c.realm));
        let ha2 = c.algorithm.hex(&format!("{method}:{uri}"));
        let response = c.algorithm.hex(&format!("{ha1}:{}:{nc}:{cnonce}:auth:{ha2}", c.nonce));
        let mut value = format!(
            "Digest username=\"{username}\", realm=\"{}\", nonce=\"{}\", uri=\"{uri}\", algorithm={}, qop=auth, \
             nc={nc}, cnonce=\"{cnonce}\", response=\"{response}\"",
            c.realm,
            c.nonce,
            c.algorithm.name()
        );
        if let Some(o) = &c.opaque {
            value.push_str(&format!(", opaque=\"{o}\""));
        }
        Some(value)
    }

    /// Takes the challenge of a 401 answer; `false` when it offers no Digest the printer
    /// can answer.
    fn challenged(&self, res: &reqwest::Response) -> bool {
        let values: Vec<String> = res
            .headers()
            .get_all(reqwest::header::WWW_AUTHENTICATE)
            .iter()
            .filter_map(|v| v.to_str().ok().map(str::to_owned))
            .collect();
        let Some(c) = choose(&values) else { return false };
        if let Ok(mut current) = self.current.lock() {
            *current = Some((c, 0));
        }
        true
    }

    /// POSTs `form` to `url` as a TM printer does: with a Digest answer when the printer
    /// holds a challenge, else without credentials; a 401 with a challenge is answered once.
    pub(crate) async fn post_form<T: serde::Serialize + ?Sized>(
        &self,
        http: &reqwest::Client,
        url: &str,
        username: &str,
        password: &str,
        form: &T,
    ) -> Result<reqwest::Response, String> {
        let parsed = reqwest::Url::parse(url).map_err(|e| format!("the server URL {url:?}: {e}"))?;
        let uri = match parsed.query() {
            Some(q) => format!("{}?{q}", parsed.path()),
            None => parsed.path().to_owned(),
        };
        for _ in 0..2 {
            let mut req = http.post(url).form(form);
            if let Some(auth) = self.answer("POST", &uri, username, password) {
                req = req.header(reqwest::header::AUTHORIZATION, auth);
            }
            let res = req.send().await.map_err(|e| e.to_string())?;
            if res.status() != reqwest::StatusCode::UNAUTHORIZED {
                return Ok(res);
            }
            if !self.challenged(&res) {
                return Err("the server answered 401 without a Digest challenge this printer can answer".into());
            }
        }
        Err("the server refused the Digest answer to its fresh challenge (wrong user ID or password?)".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn web_config_password_rules() {
        assert!(check_password("abcDEF012_.-").is_ok());
        assert!(check_password(&"a".repeat(30)).is_ok());
        assert!(check_password(&"a".repeat(31)).is_err_and(|m| m.contains("31")));
        assert!(check_password("").is_err());
        assert!(check_password("no spaces").is_err_and(|m| m.contains("' '")));
        assert!(check_password("opp_0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef").is_err());
    }

    #[test]
    fn sha_256_is_preferred_and_md5_taken_when_alone() {
        let md5 = "Digest realm=\"r\", qop=\"auth\", algorithm=MD5, nonce=\"n1\", opaque=\"o\"".to_owned();
        let sha = "Digest realm=\"r\", qop=\"auth\", algorithm=SHA-256, nonce=\"n2\", opaque=\"o\"".to_owned();
        let basic = "Basic realm=\"r\"".to_owned();
        let c = choose(&[md5.clone(), sha, basic.clone()]).expect("a challenge");
        assert_eq!((c.algorithm, c.nonce.as_str()), (Algorithm::Sha256, "n2"));
        let c = choose(&[md5, basic.clone()]).expect("a challenge");
        assert_eq!(c.algorithm, Algorithm::Md5);
        assert_eq!(choose(&[basic]), None);
        let no_qop = "Digest realm=\"r\", nonce=\"n\"".to_owned();
        assert_eq!(choose(&[no_qop]), None);
    }

    #[test]
    fn answers_are_rfc_7616s() {
        // RFC 7616 §3.9.1 with its client nonce in place of a random one.
        let c = Challenge {
            realm: "http-auth@example.org".into(),
            nonce: "7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v".into(),
            opaque: None,
            algorithm: Algorithm::Sha256,
        };
        let ha1 = c.algorithm.hex("Mufasa:http-auth@example.org:Circle of Life");
        let ha2 = c.algorithm.hex("GET:/dir/index.html");
        let response = c
            .algorithm
            .hex(&format!("{ha1}:{}:00000001:f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ:auth:{ha2}", c.nonce));
        assert_eq!(response, "753927fa0e85d155564e2e272a28d1802ca10daf4496794697cf8db5856cb6c1");
    }
}
