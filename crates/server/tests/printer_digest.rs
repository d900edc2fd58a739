//! HTTP Digest sign-in (RFC 7616) of Epson Server Direct Print printers through the public
//! interface, on SQLite and PostgreSQL: the real server, answered over real sockets as a
//! TM printer does (a first request without credentials, the 401 challenge, then the
//! request with the Digest answer).

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{job_id, printer_with_login, wait_state, TestApp};
use onceprint_engine::secrets::{digest_ha1, DigestAlgorithm};
use onceprint_store::{PrinterSecret, PrinterSecretChange, SetupAudit};
use reqwest::StatusCode;
use serde_json::{json, Value};

/// Nonces good for 1.5 s, so that a test can see one expire.
fn short_nonces() -> onceprint_server::HttpConfig {
    onceprint_server::HttpConfig { printer_nonce_ttl_ms: 1_500, ..common::fast_polled() }
}

both_backends!(
    config = crate::short_nonces;
    a_tm_printer_signs_in_with_digest_sha_256_or_md5_and_prints,
    wrong_or_incomplete_digest_answers_are_challenged_again,
    replayed_and_expired_nonces_are_stale,
    basic_still_signs_in_and_a_login_from_before_digest_is_told_to_rotate,
    only_epson_routes_and_logins_take_digest,
    the_simulated_tm_printer_signs_in_with_digest_and_prints_once,
);

/// One challenge of a `WWW-Authenticate` header: the scheme and its parameters.
fn challenges(headers: &reqwest::header::HeaderMap) -> Vec<(String, HashMap<String, String>)> {
    headers
        .get_all("www-authenticate")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(|v| {
            let (scheme, rest) = v.split_once(' ').unwrap_or((v, ""));
            let params = rest
                .split(", ")
                .filter_map(|p| p.split_once('='))
                .map(|(k, v)| (k.trim().to_owned(), v.trim_matches('"').to_owned()))
                .collect();
            (scheme.to_owned(), params)
        })
        .collect()
}

/// The Digest challenge for `algorithm` in a 401 answer.
fn challenge_for(headers: &reqwest::header::HeaderMap, algorithm: &str) -> HashMap<String, String> {
    challenges(headers)
        .into_iter()
        .find(|(s, p)| s == "Digest" && p.get("algorithm").map(String::as_str) == Some(algorithm))
        .map(|(_, p)| p)
        .unwrap_or_else(|| panic!("no Digest {algorithm} challenge in {headers:?}"))
}

/// A TM printer's HTTP client with a Digest answer of its own making.
struct Tm {
    base: String,
    user: String,
    pass: String,
    http: reqwest::Client,
}

/// The fields of one Digest answer, each of which a test may change.
#[derive(Clone)]
struct Fields {
    username: String,
    realm: String,
    nonce: String,
    uri: String,
    algorithm: String,
    qop: Option<String>,
    nc: String,
    cnonce: String,
    opaque: String,
    /// The password the response is computed with.
    password: String,
}

impl Fields {
    fn header(&self, method: &str, leave_out: Option<&str>) -> String {
        let alg = DigestAlgorithm::from_name(&self.algorithm).expect("an offered algorithm");
        let ha1 = alg.hex(&format!("{}:{}:{}", self.username, self.realm, self.password));
        let ha2 = alg.hex(&format!("{method}:{}", self.uri));
        let response = match &self.qop {
            Some(qop) => alg.hex(&format!("{ha1}:{}:{}:{}:{qop}:{ha2}", self.nonce, self.nc, self.cnonce)),
            None => alg.hex(&format!("{ha1}:{}:{ha2}", self.nonce)),
        };
        let mut parts = vec![
            ("username", format!("\"{}\"", self.username)),
            ("realm", format!("\"{}\"", self.realm)),
            ("nonce", format!("\"{}\"", self.nonce)),
            ("uri", format!("\"{}\"", self.uri)),
            ("algorithm", self.algorithm.clone()),
            ("nc", self.nc.clone()),
            ("cnonce", format!("\"{}\"", self.cnonce)),
            ("response", format!("\"{response}\"")),
            ("opaque", format!("\"{}\"", self.opaque)),
        ];
        if let Some(qop) = &self.qop {
            parts.push(("qop", qop.clone()));
        }
        parts.retain(|(k, _)| Some(*k) != leave_out);
        let list: Vec<String> = parts.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
        format!("Digest {}", list.join(", "))
    }
}

impl Tm {
    async fn new(app: &TestApp, key: &str, printer: &str) -> Tm {
        let (user, pass) = printer_with_login(app, key, printer, json!({"kind": "epson_sdp"})).await;
        Tm { base: app.base.clone(), user, pass, http: reqwest::Client::new() }
    }

    /// A GetRequest signed in with HTTP Basic: its status.
    async fn basic_get_request(&self) -> StatusCode {
        let url = format!("{}/epson-sdp", self.base);
        let req = self.http.post(url).basic_auth(&self.user, Some(&self.pass)).form(&get_request());
        req.send().await.expect("post").status()
    }

    /// The first request, without credentials: 401 with the challenges.
    async fn challenge(&self) -> reqwest::header::HeaderMap {
        let res = self.http.post(format!("{}/epson-sdp", self.base)).form(&get_request()).send().await.expect("post");
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
        res.headers().clone()
    }

    /// A fresh answer to a fresh challenge for `algorithm`.
    async fn fields(&self, algorithm: &str) -> Fields {
        let c = challenge_for(&self.challenge().await, algorithm);
        assert_eq!((c["realm"].as_str(), c["qop"].as_str()), ("onceprint", "auth"), "{c:?}");
        Fields {
            username: self.user.clone(),
            realm: c["realm"].clone(),
            nonce: c["nonce"].clone(),
            uri: "/epson-sdp".into(),
            algorithm: algorithm.into(),
            qop: Some("auth".into()),
            nc: "00000001".into(),
            cnonce: format!("cn-{}", c["nonce"].len()),
            opaque: c["opaque"].clone(),
            password: self.pass.clone(),
        }
    }

    /// A request with this Authorization header: status, headers and body.
    async fn send(&self, path: &str, authorization: &str, form: &[(&str, &str)]) -> Answer {
        let res = self
            .http
            .post(format!("{}{path}", self.base))
            .header("authorization", authorization)
            .form(form)
            .send()
            .await
            .expect("post");
        let (status, headers) = (res.status(), res.headers().clone());
        let body = res.text().await.expect("body");
        Answer { status, headers, body }
    }

    async fn get_request(&self, f: &Fields) -> Answer {
        self.send("/epson-sdp", &f.header("POST", None), &get_request()).await
    }
}

struct Answer {
    status: StatusCode,
    headers: reqwest::header::HeaderMap,
    body: String,
}

impl Answer {
    fn message(&self) -> String {
        serde_json::from_str::<Value>(&self.body)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
            .unwrap_or_default()
    }

    /// A 401 with the Digest (SHA-256, then MD5) and Basic challenges, `stale` as given.
    fn assert_challenged(&self, stale: bool, what: &str) {
        assert_eq!(self.status, StatusCode::UNAUTHORIZED, "{what}: {}", self.body);
        let c = challenges(&self.headers);
        let order: Vec<(String, Option<String>)> =
            c.iter().map(|(s, p)| (s.clone(), p.get("algorithm").cloned())).collect();
        assert_eq!(
            order,
            vec![
                ("Digest".to_owned(), Some("SHA-256".to_owned())),
                ("Digest".to_owned(), Some("MD5".to_owned())),
                ("Basic".to_owned(), None)
            ],
            "{what}"
        );
        for (_, p) in c.iter().take(2) {
            assert_eq!(p.get("stale").map(String::as_str), stale.then_some("true"), "{what}: {p:?}");
            assert!(p.contains_key("nonce") && p.contains_key("opaque"), "{what}: {p:?}");
        }
    }
}

fn get_request() -> Vec<(&'static str, &'static str)> {
    vec![("ConnectionType", "GetRequest")]
}

fn set_response(jobid: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"utf-8\"?>\n<PrintResponseInfo Version=\"2.00\"><ePOSPrint><Parameter>\
         <devid>local_printer</devid><printjobid>{jobid}</printjobid></Parameter><PrintResponse><response \
         xmlns=\"http://www.epson-pos.com/schemas/2011/03/epos-print\" success=\"true\" code=\"\" \
         status=\"251658262\" battery=\"0\"/></PrintResponse></ePOSPrint></PrintResponseInfo>"
    )
}

async fn submit(app: &TestApp, key: &str, printer: &str, biz_no: &str) -> String {
    let a = app
        .submit(key, json!({"biz_no": biz_no, "printer_id": printer, "content": {"type": "text", "text": "order\n"}}))
        .await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    a.body["task_id"].as_str().expect("task_id").to_owned()
}

async fn a_tm_printer_signs_in_with_digest_sha_256_or_md5_and_prints(app: &TestApp) {
    let key = app.tenant("acme").await;
    let tm = Tm::new(app, &key, "tm").await;
    let first = tm.send("/epson-sdp", "", &get_request()).await;
    first.assert_challenged(false, "the first request, without credentials");
    let id = submit(app, &key, "tm", "A1").await;
    for algorithm in ["SHA-256", "MD5"] {
        let f = tm.fields(algorithm).await;
        let got = tm.get_request(&f).await;
        assert_eq!(got.status, StatusCode::OK, "{algorithm}: {}", got.body);
        if algorithm == "SHA-256" {
            let jobid = job_id(&got.body);
            // The same nonce serves the next request with the next count (RFC 7616 §3.4).
            let next = Fields { nc: "00000002".into(), ..f.clone() };
            let file = set_response(&jobid);
            let form = [("ConnectionType", "SetResponse"), ("ResponseFile", file.as_str())];
            let done = tm.send("/epson-sdp", &next.header("POST", None), &form).await;
            assert_eq!(done.status, StatusCode::OK, "{}", done.body);
            let t = app.get(&format!("/v1/print-tasks/{id}"), &key).await.body;
            assert_eq!(t["state"], "printed", "{t}");
        } else {
            assert_eq!(got.body, "", "nothing left to print");
        }
    }
    // Without an algorithm the answer is MD5's (RFC 7616 §3.3), and the scheme's name is
    // case-insensitive (RFC 7235 §2.1).
    let f = tm.fields("MD5").await;
    let header = f.header("POST", Some("algorithm")).replacen("Digest ", "digest ", 1);
    let ok = tm.send("/epson-sdp", &header, &get_request()).await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.body);
}

async fn wrong_or_incomplete_digest_answers_are_challenged_again(app: &TestApp) {
    let key = app.tenant("acme").await;
    let tm = Tm::new(app, &key, "tm").await;
    let id = submit(app, &key, "tm", "A1").await;
    let good = tm.fields("SHA-256").await;
    let cases: Vec<(&str, Fields, &str)> = vec![
        ("wrong password", Fields { password: "wrong".into(), ..good.clone() }, "unknown printer login"),
        ("wrong user", Fields { username: "prn_0000000000000000".into(), ..good.clone() }, "unknown printer login"),
        ("tampered uri", Fields { uri: "/epson-sdp?x=1".into(), ..good.clone() }, "uri"),
        ("another realm", Fields { realm: "elsewhere".into(), ..good.clone() }, "realm"),
        ("no qop (RFC 2069)", Fields { qop: None, ..good.clone() }, "RFC 2069"),
        ("another qop", Fields { qop: Some("auth-int".into()), ..good.clone() }, "qop"),
        ("a bad count", Fields { nc: "1".into(), ..good.clone() }, "nc"),
    ];
    for (what, f, says) in cases {
        let a = tm.get_request(&f).await;
        a.assert_challenged(false, what);
        assert!(a.message().contains(says), "{what}: {}", a.message());
    }
    // A response computed for another uri than the one it names: the digest does not match.
    let tampered = good.header("POST", None).replace("uri=\"/epson-sdp\"", "uri=\"/epson-sdp?x=1\"");
    let a = tm.send("/epson-sdp?x=1", &tampered, &get_request()).await;
    a.assert_challenged(false, "uri changed after the response was computed");
    // Another method than the one the response was computed for.
    let a = tm.send("/epson-sdp", &good.header("GET", None), &get_request()).await;
    a.assert_challenged(false, "response for GET sent with POST");
    for field in ["username", "realm", "nonce", "uri", "response", "nc", "cnonce"] {
        let a = tm.send("/epson-sdp", &good.header("POST", Some(field)), &get_request()).await;
        a.assert_challenged(false, field);
        assert!(a.message().contains(&format!("no {field}")), "{field}: {}", a.message());
    }
    let a = tm.send("/epson-sdp", "Digest username=\"unterminated", &get_request()).await;
    a.assert_challenged(false, "malformed");
    let a = tm
        .send(
            "/epson-sdp",
            &format!("{}, algorithm=SHA-256-sess", good.header("POST", Some("algorithm"))),
            &get_request(),
        )
        .await;
    a.assert_challenged(false, "a -sess algorithm");
    assert!(a.message().contains("not offered"), "{}", a.message());
    // Nothing moved, and the right answer still works.
    let t = app.get(&format!("/v1/print-tasks/{id}"), &key).await.body;
    assert_eq!(t["state"], "pending", "{t}");
    let ok = tm.get_request(&good).await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.body);
}

async fn replayed_and_expired_nonces_are_stale(app: &TestApp) {
    let key = app.tenant("acme").await;
    let tm = Tm::new(app, &key, "tm").await;
    let f = tm.fields("SHA-256").await;
    assert_eq!(tm.get_request(&f).await.status, StatusCode::OK);
    // The same answer again (a captured request sent a second time).
    let replay = tm.get_request(&f).await;
    replay.assert_challenged(true, "replayed");
    assert!(replay.message().contains("taken before"), "{}", replay.message());
    // A nonce this broker did not issue (another process's, or made up): stale for a
    // client that knows the password, so that it answers the new challenge.
    let foreign = Fields { nonce: "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA".into(), ..f.clone() };
    tm.get_request(&foreign).await.assert_challenged(true, "a nonce not issued here");
    // ... but not for one that does not.
    let guess = Fields { password: "guess".into(), ..foreign };
    tm.get_request(&guess).await.assert_challenged(false, "a nonce not issued here, wrong password");
    // Past the nonce's lifetime (1.5 s here).
    let f = tm.fields("MD5").await;
    tokio::time::sleep(Duration::from_millis(1_700)).await;
    let late = tm.get_request(&f).await;
    late.assert_challenged(true, "expired");
    assert!(late.message().contains("expired"), "{}", late.message());
    // The new challenge's nonce works.
    let fresh = Fields { nonce: challenge_for(&late.headers, "MD5")["nonce"].clone(), ..f };
    assert_eq!(tm.get_request(&fresh).await.status, StatusCode::OK);
}

async fn basic_still_signs_in_and_a_login_from_before_digest_is_told_to_rotate(app: &TestApp) {
    let key = app.tenant("acme").await;
    let tm = Tm::new(app, &key, "tm").await;
    assert_eq!(tm.basic_get_request().await, StatusCode::OK, "Basic");
    // A login made before the broker kept Digest keys: the same password, no HA1.
    let old = PrinterSecret {
        username: tm.user.clone(),
        secret_hash: onceprint_engine::secrets::hash(&tm.pass),
        mqtt_hash: None,
        ha1_md5: None,
        ha1_sha256: None,
    };
    let change = PrinterSecretChange {
        tenant_id: "acme".into(),
        printer_id: "tm".into(),
        secret: old,
        now: 1,
        audit: SetupAudit::default(),
    };
    assert!(app.store.set_printer_secret(change).await.expect("store"));
    // (No Digest answer was looked up yet, so the broker has cached no Digest keys.)
    let f = tm.fields("SHA-256").await;
    let a = tm.get_request(&f).await;
    a.assert_challenged(false, "a login without Digest keys");
    assert!(a.message().contains("rotate the printer's credentials"), "{}", a.message());
    assert!(a.message().contains("/credentials"), "{}", a.message());
    assert_eq!(tm.basic_get_request().await, StatusCode::OK, "Basic still works for the older login");
    // Rotating gives the login its keys.
    let c = app.post("/v1/printers/tm/credentials", &key, json!({})).await;
    assert_eq!(c.status, StatusCode::OK, "{c:?}");
    let rotated = Tm {
        base: tm.base.clone(),
        user: c.body["username"].as_str().expect("username").into(),
        pass: c.body["password"].as_str().expect("password").into(),
        http: tm.http.clone(),
    };
    for algorithm in ["SHA-256", "MD5"] {
        let f = rotated.fields(algorithm).await;
        assert_eq!(rotated.get_request(&f).await.status, StatusCode::OK, "{algorithm} after rotation");
    }
    // The old login is gone, by either scheme.
    let f = Fields { username: tm.user.clone(), password: tm.pass.clone(), ..rotated.fields("SHA-256").await };
    tm.get_request(&f).await.assert_challenged(false, "the replaced login");
    // The HA1 is the one the API's documentation names.
    assert_eq!(
        digest_ha1(DigestAlgorithm::Md5, &rotated.user, &rotated.pass),
        DigestAlgorithm::Md5.hex(&format!("{}:onceprint:{}", rotated.user, rotated.pass))
    );
}

async fn only_epson_routes_and_logins_take_digest(app: &TestApp) {
    let key = app.tenant("acme").await;
    let tm = Tm::new(app, &key, "tm").await;
    let f = tm.fields("SHA-256").await;
    // CloudPRNT takes Basic only, and challenges for Basic only, as before.
    let a = tm.send("/cloudprnt", &Fields { uri: "/cloudprnt".into(), ..f.clone() }.header("POST", None), &[]).await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{}", a.body);
    let schemes: Vec<String> = challenges(&a.headers).into_iter().map(|(s, _)| s).collect();
    assert_eq!(schemes, vec!["Basic".to_owned()]);
    // A CloudPRNT printer's login has no Digest keys: it is told to use Basic.
    let (user, pass) =
        printer_with_login(app, &key, "star", json!({"kind": "cloudprnt", "mac": "00:11:62:aa:bb:cc"})).await;
    let star = Fields { username: user, password: pass, ..tm.fields("SHA-256").await };
    let a = tm.get_request(&star).await;
    a.assert_challenged(false, "a CloudPRNT login by Digest");
    assert!(a.message().contains("Epson Server Direct Print printers only"), "{}", a.message());
}

/// The printer simulator in its Epson mode signs in as a TM printer does (first request
/// without credentials, then Digest); it has no Basic path, so a login without Digest keys
/// leaves its tickets unprinted.
async fn the_simulated_tm_printer_signs_in_with_digest_and_prints_once(app: &TestApp) {
    use onceprint_printer_sim::{PolledPrinter, Protocol, SimConfig, Simulator};
    let key = app.tenant("acme").await;
    let (user, pass) = printer_with_login(app, &key, "tm", json!({"kind": "epson_sdp"})).await;
    let printer = |user: &str, pass: &str| PolledPrinter {
        url: format!("{}/epson-sdp", app.base),
        username: user.into(),
        password: pass.into(),
        protocol: Protocol::EpsonSdp { id: None },
        poll_interval: Duration::from_millis(100),
    };
    let sim = Simulator::start_polled(printer(&user, &pass), SimConfig::ephemeral()).await.expect("sim");
    let ids = [submit(app, &key, "tm", "A1").await, submit(app, &key, "tm", "A2").await];
    for id in &ids {
        wait_state(app, &key, id, "printed", Duration::from_secs(5)).await;
    }
    assert_eq!(sim.jobs().all().len(), 2, "each ticket once");
    sim.shutdown().await;
    // The same password without Digest keys (a login as made before Digest was offered).
    let (user, pass) = printer_with_login(app, &key, "old", json!({"kind": "epson_sdp"})).await;
    let old = PrinterSecret {
        username: user.clone(),
        secret_hash: onceprint_engine::secrets::hash(&pass),
        mqtt_hash: None,
        ha1_md5: None,
        ha1_sha256: None,
    };
    let change = PrinterSecretChange {
        tenant_id: "acme".into(),
        printer_id: "old".into(),
        secret: old,
        now: 1,
        audit: SetupAudit::default(),
    };
    assert!(app.store.set_printer_secret(change).await.expect("store"));
    let sim = Simulator::start_polled(printer(&user, &pass), SimConfig::ephemeral()).await.expect("sim");
    let id = submit(app, &key, "old", "B1").await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let t = app.get(&format!("/v1/print-tasks/{id}"), &key).await.body;
    assert_eq!(t["state"], "pending", "{t}");
    assert!(sim.jobs().all().is_empty());
    sim.shutdown().await;
}
