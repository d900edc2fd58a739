//! Console logins: the session cookie, the CSRF token every form carries, logging in and
//! out, and the language switch.
//!
//! The session cookie holds a random 256-bit secret (only its SHA-256 is stored) and is
//! `HttpOnly` (scripts cannot read it), `SameSite=Strict` (other sites' pages cannot send
//! it), `Path=/console` and, behind TLS, `Secure`. Every login makes a new secret, and a
//! session the browser still held is revoked, so a session id planted before the login is
//! worth nothing (no fixation). Every state-changing request carries the session's CSRF
//! token in a form field and is refused without it; the login form, which has no session
//! yet, is protected the same way by a token in a short-lived cookie of its own (so another
//! site cannot log a browser in to an account of its choosing).

use axum::extract::{FromRequestParts, Query, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Form;
use onceprint_engine::secrets;
use onceprint_engine::OperatorError;
use onceprint_store::{OperatorSession, SessionKind};
use serde::Deserialize;

use super::html::{self, esc};
use super::i18n::{Lang, LANG_COOKIE};
use super::ConsoleError;
use crate::error::ApiError;
use crate::AppState;

pub const SESSION_COOKIE: &str = "op_session";
const LOGIN_CSRF_COOKIE: &str = "op_login_csrf";

/// The value of cookie `name` in the request, if any.
pub fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim().to_owned())
}

/// Whether cookies must be `Secure`: always when configured (the broker is only reached
/// over TLS), and for any request a TLS-terminating proxy marks as HTTPS.
fn secure(st: &AppState, headers: &HeaderMap) -> bool {
    st.config.console.secure_cookies
        || headers
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("https"))
}

/// A `Set-Cookie` value with the console's flags.
fn set_cookie(name: &str, value: &str, max_age_s: Option<i64>, http_only: bool, secure: bool) -> String {
    let mut c = format!("{name}={value}; Path=/console; SameSite=Strict");
    if http_only {
        c.push_str("; HttpOnly");
    }
    if secure {
        c.push_str("; Secure");
    }
    if let Some(age) = max_age_s {
        c.push_str(&format!("; Max-Age={age}"));
    }
    c
}

/// A person logged in to the console, with their language.
pub struct ConsoleUser {
    pub session: OperatorSession,
    pub lang: Lang,
    /// The cookie's secret, for looking the session up again (the live view does, so that
    /// a revoked or expired session ends an open page too).
    pub(crate) secret: String,
}

impl ConsoleUser {
    pub fn operator(&self) -> &onceprint_store::Operator {
        &self.session.operator
    }

    /// Refuses a form whose CSRF token is not this session's.
    pub fn check_csrf(&self, given: &str) -> Result<(), ConsoleError> {
        if secrets::hashes_equal(given, &self.session.csrf_token) {
            Ok(())
        } else {
            Err(csrf_refused())
        }
    }
}

fn csrf_refused() -> ConsoleError {
    ConsoleError::Api(ApiError::new(
        StatusCode::FORBIDDEN,
        "csrf",
        "this form was not sent from a page of this console (missing or wrong CSRF token); reload the page and try again",
    ))
}

/// Where a page that needs a login sends a browser without one.
///
/// A page asked for with GET is asked for again after the login. A form sent with POST
/// cannot be: its URL only takes POST, and the form's fields are gone. So after the login
/// the browser lands on the page the form was on (the `Referer`, when it is a page of this
/// console on this host), and the login page says that the action was not done.
fn to_login(parts: &Parts, expired: bool) -> ConsoleError {
    if parts.method == Method::GET || parts.method == Method::HEAD {
        let next = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/console/");
        return ConsoleError::Redirect(login_target(next, expired, false));
    }
    let from = referer_path(&parts.headers).unwrap_or_else(|| "/console/".to_owned());
    // Logging out of a session that already ended leaves nothing undone.
    let undone = parts.uri.path() != "/console/logout";
    ConsoleError::Redirect(login_target(&from, expired, undone))
}

/// The login page's URL that comes back to `next` (a console path) afterwards; with
/// `undone`, it says that an action was not done.
pub fn login_target(next: &str, expired: bool, undone: bool) -> String {
    let mut target = format!("/console/login?next={}", html::url_encode(&safe_next(Some(next))));
    if expired {
        target.push_str("&expired=1");
    }
    if undone {
        target.push_str("&undone=1");
    }
    target
}

/// The path and query of the request's `Referer` when it is a page of this console on
/// the host the request was sent to; anything else (another site, no header) is `None`.
fn referer_path(headers: &HeaderMap) -> Option<String> {
    let referer = headers.get(header::REFERER)?.to_str().ok()?;
    let host = headers.get(header::HOST)?.to_str().ok()?;
    let rest = referer.strip_prefix("http://").or_else(|| referer.strip_prefix("https://"))?;
    let path = rest.strip_prefix(host)?;
    let path = path.split('#').next().unwrap_or("");
    (safe_next(Some(path)) == path).then(|| path.to_owned())
}

impl FromRequestParts<AppState> for ConsoleUser {
    type Rejection = ConsoleError;

    async fn from_request_parts(parts: &mut Parts, st: &AppState) -> Result<Self, Self::Rejection> {
        let lang = Lang::of(&parts.headers);
        let Some(secret) = cookie(&parts.headers, SESSION_COOKIE).filter(|s| !s.is_empty()) else {
            return Err(to_login(parts, false));
        };
        match st.operators.authenticate(&secret).await.map_err(|e| ConsoleError::Api(e.into()))? {
            Some(session) if session.kind == SessionKind::Console => Ok(ConsoleUser { session, lang, secret }),
            _ => Err(to_login(parts, true)),
        }
    }
}

#[derive(Debug, Deserialize)]
pub struct LoginQuery {
    pub next: Option<String>,
    pub expired: Option<String>,
    /// Set when the session ended while an action was being sent: it was not done.
    pub undone: Option<String>,
}

/// Only paths of the console itself are followed after login or a language switch (no
/// open redirect), and only in the characters a URL is made of: a decoded control
/// character, space or non-ASCII letter could not be sent back in `Location`, so such a
/// target becomes the console's start page.
pub fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(n)
            if n.starts_with("/console/")
                && !n.contains("//")
                && !n.contains('\\')
                && n.bytes().all(|b| b.is_ascii_graphic()) =>
        {
            n.to_owned()
        }
        _ => "/console/".to_owned(),
    }
}

fn login_page(lang: Lang, next: &str, csrf: &str, message: Option<String>, tenant: &str, operator: &str) -> String {
    let mut body = String::new();
    body.push_str(&format!("<section class=\"login card\"><h1>{}</h1>", esc(lang.t("login.title"))));
    if let Some(m) = message {
        body.push_str(&format!("<p class=\"alert\" role=\"alert\">{}</p>", esc(&m)));
    }
    body.push_str(&format!(
        "<form method=\"post\" action=\"/console/login\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\"><input type=\"hidden\" name=\"next\" value=\"{next}\">\
         <label>{tl}<input name=\"tenant\" id=\"tenant\" required autocomplete=\"organization\" value=\"{tenant}\"></label>\
         <label>{ol}<input name=\"operator\" id=\"operator\" required autocomplete=\"username\" value=\"{operator}\"></label>\
         <label>{pl}<input name=\"password\" id=\"password\" type=\"password\" required autocomplete=\"current-password\"></label>\
         <button type=\"submit\" id=\"login\">{sl}</button></form></section>",
        csrf = esc(csrf),
        next = esc(next),
        tenant = esc(tenant),
        operator = esc(operator),
        tl = esc(lang.t("login.tenant")),
        ol = esc(lang.t("login.operator")),
        pl = esc(lang.t("login.password")),
        sl = esc(lang.t("login.submit")),
    ));
    html::bare_page(lang, lang.t("login.title"), &format!("/console/login?next={}", html::url_encode(next)), &body)
}

/// The login form. Sets a fresh login CSRF cookie each time it is shown.
pub async fn login_form(State(st): State<AppState>, headers: HeaderMap, Query(q): Query<LoginQuery>) -> Response {
    let lang = Lang::of(&headers);
    let next = safe_next(q.next.as_deref());
    let csrf = secrets::generate("lcsrf_");
    let message = if q.undone.is_some() {
        Some(lang.t("login.undone").to_owned())
    } else {
        q.expired.is_some().then(|| lang.t("login.expired").to_owned())
    };
    let page = login_page(lang, &next, &csrf, message, "", "");
    let cookie = set_cookie(LOGIN_CSRF_COOKIE, &csrf, Some(3600), true, secure(&st, &headers));
    with_cookies(StatusCode::OK, &[cookie], page)
}

#[derive(Debug, Deserialize)]
pub struct LoginForm {
    #[serde(default)]
    pub csrf: String,
    #[serde(default)]
    pub next: String,
    #[serde(default)]
    pub tenant: String,
    #[serde(default)]
    pub operator: String,
    #[serde(default)]
    pub password: String,
}

fn with_cookies(status: StatusCode, cookies: &[String], page: String) -> Response {
    let mut res = (status, axum::response::Html(page)).into_response();
    for c in cookies {
        if let Ok(v) = HeaderValue::from_str(c) {
            res.headers_mut().append(header::SET_COOKIE, v);
        }
    }
    res
}

/// Checks the login and starts a session with a new secret.
pub async fn login(
    State(st): State<AppState>,
    peer: Option<axum::Extension<crate::http1::PeerAddr>>,
    headers: HeaderMap,
    Form(f): Form<LoginForm>,
) -> Response {
    let lang = Lang::of(&headers);
    let secure = secure(&st, &headers);
    let next = safe_next(Some(&f.next));
    let expected = cookie(&headers, LOGIN_CSRF_COOKIE).unwrap_or_default();
    if expected.is_empty() || !secrets::hashes_equal(&f.csrf, &expected) {
        return csrf_refused().into_response();
    }
    let source = crate::extract::login_source(peer.map(|p| p.0), &headers);
    match st.operators.login(f.tenant.trim(), f.operator.trim(), &f.password, SessionKind::Console, &source).await {
        Ok(login) => {
            // A session the browser still had ends here: one browser, one live session,
            // and a secret fixed before login cannot survive it.
            if let Some(old) = cookie(&headers, SESSION_COOKIE).filter(|s| !s.is_empty()) {
                if let Err(e) = st.operators.logout(&old).await {
                    tracing::warn!(error = %e, "could not end the previous console session");
                }
            }
            let ttl_s = st.operators.config().session_ttl_ms / 1000;
            let mut res = (StatusCode::SEE_OTHER, [(header::LOCATION, next)]).into_response();
            for c in [
                set_cookie(SESSION_COOKIE, &login.secret, Some(ttl_s), true, secure),
                set_cookie(LOGIN_CSRF_COOKIE, "", Some(0), true, secure),
            ] {
                if let Ok(v) = HeaderValue::from_str(&c) {
                    res.headers_mut().append(header::SET_COOKIE, v);
                }
            }
            res.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            res
        }
        Err(e) => {
            let (status, message, retry) = match &e {
                OperatorError::Throttled { retry_after_s } => (
                    StatusCode::TOO_MANY_REQUESTS,
                    format!(
                        "{} {}{}",
                        lang.t("login.throttled"),
                        super::html::wait(lang, *retry_after_s),
                        lang.t("stop")
                    ),
                    Some(*retry_after_s),
                ),
                OperatorError::Disabled(_) => (StatusCode::FORBIDDEN, lang.t("login.disabled").to_owned(), None),
                OperatorError::BadLogin | OperatorError::Invalid(_) => {
                    (StatusCode::UNAUTHORIZED, lang.t("login.bad").to_owned(), None)
                }
                _ => return ConsoleError::Api(e.into()).into_response(),
            };
            let csrf = secrets::generate("lcsrf_");
            let page = login_page(lang, &next, &csrf, Some(message), &f.tenant, &f.operator);
            let mut res = with_cookies(status, &[set_cookie(LOGIN_CSRF_COOKIE, &csrf, Some(3600), true, secure)], page);
            if let Some(s) = retry.and_then(|s| HeaderValue::from_str(&s.to_string()).ok()) {
                res.headers_mut().insert(header::RETRY_AFTER, s);
            }
            res
        }
    }
}

#[derive(Debug, Deserialize)]
pub struct CsrfForm {
    #[serde(default)]
    pub csrf: String,
}

/// Ends the session and forgets the cookie.
pub async fn logout(
    State(st): State<AppState>,
    user: ConsoleUser,
    headers: HeaderMap,
    Form(f): Form<CsrfForm>,
) -> Result<Response, ConsoleError> {
    user.check_csrf(&f.csrf)?;
    if let Some(secret) = cookie(&headers, SESSION_COOKIE) {
        st.operators.logout(&secret).await.map_err(|e| ConsoleError::Api(e.into()))?;
    }
    let mut res = (StatusCode::SEE_OTHER, [(header::LOCATION, "/console/login")]).into_response();
    if let Ok(v) = HeaderValue::from_str(&set_cookie(SESSION_COOKIE, "", Some(0), true, secure(&st, &headers))) {
        res.headers_mut().append(header::SET_COOKIE, v);
    }
    Ok(res)
}

#[derive(Debug, Deserialize)]
pub struct LangQuery {
    pub to: String,
    pub next: Option<String>,
}

/// The language switch: remembers the choice in a cookie and goes back. It changes only
/// how pages are shown, never data, so it needs neither a login nor a CSRF token.
pub async fn switch_lang(State(st): State<AppState>, headers: HeaderMap, Query(q): Query<LangQuery>) -> Response {
    let lang = Lang::parse(&q.to).unwrap_or(Lang::En);
    // The same rule as after a login (the login page itself is a console path too): a
    // target with a character that cannot go back in `Location` becomes the start page.
    let next = safe_next(q.next.as_deref());
    let mut res = (StatusCode::SEE_OTHER, [(header::LOCATION, next)]).into_response();
    let c = set_cookie(LANG_COOKIE, lang.code(), Some(365 * 24 * 3600), false, secure(&st, &headers));
    if let Ok(v) = HeaderValue::from_str(&c) {
        res.headers_mut().append(header::SET_COOKIE, v);
    }
    res
}
