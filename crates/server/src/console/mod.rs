//! The staff console at `/console/`: the pages where the people who solve
//! the one per cent see what is wrong and fix it, on a phone or the shop's tablet.
//!
//! This module owns the console's routes, its login sessions in cookies with CSRF tokens
//! (`auth`), its two languages (`i18n`), the HTML it renders on the server (`html`,
//! `pages`), the server-sent events that keep the printers and the attention list live
//! (`live`), and its static assets (`assets/`: one stylesheet and one small script,
//! compiled into the binary with `include_str!`, so nothing is fetched from a CDN, nothing
//! is built with Node.js and nothing is downloaded at run time).
//!
//! It must never hold business rules: what an operator may see is
//! `Operator::may_see_store`, which actions a state allows is `core::manual`, the actions
//! themselves are `engine::Operations`, the day is `engine::reconcile`. Failures become
//! answers through the one mapping of `crate::error` (to [`ApiError`]); this module only
//! renders an `ApiError` as a page instead of JSON.
//!
//! Every route but the login page, the language switch and the assets needs a live console
//! session; without one a browser is sent to the login page. Every form that changes
//! something carries the session's CSRF token.

mod auth;
mod bulk;
mod charts;
mod day;
mod html;
mod i18n;
mod live;
mod pages;
mod setup;
mod tickets;

use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use crate::error::ApiError;
use crate::AppState;

pub use auth::SESSION_COOKIE;
pub use i18n::Lang;

/// Settings of the console.
#[derive(Debug, Clone)]
pub struct ConsoleConfig {
    /// Mark cookies `Secure` on every answer. Without it they are `Secure` whenever a
    /// TLS-terminating proxy says the request came over HTTPS (`X-Forwarded-Proto`).
    pub secure_cookies: bool,
    /// How often the live view looks for changes (default 1000 ms).
    pub live_interval_ms: u64,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        ConsoleConfig { secure_cookies: false, live_interval_ms: 1000 }
    }
}

/// Why a console request did not get its page.
#[derive(Debug)]
pub enum ConsoleError {
    /// To the login page (or wherever the path says).
    Redirect(String),
    /// A failure, shown as a page with the status and message of the one error mapping.
    Api(ApiError),
}

macro_rules! through_api_error {
    ($($t:ty),*) => {$(
        impl From<$t> for ConsoleError {
            fn from(e: $t) -> Self {
                ConsoleError::Api(e.into())
            }
        }
    )*};
}

through_api_error!(
    ApiError,
    onceprint_store::StoreError,
    onceprint_engine::OperatorError,
    onceprint_engine::ActionError,
    onceprint_core::CoreError
);

impl IntoResponse for ConsoleError {
    fn into_response(self) -> Response {
        match self {
            ConsoleError::Redirect(to) => {
                // A target that cannot be a header value (a control character that came
                // in through a query) would leave a 303 without `Location`, which no
                // browser can follow; the console's start page is the safe place instead.
                let location = header::HeaderValue::from_str(&to).unwrap_or_else(|_| {
                    tracing::warn!("console redirect target is not a valid header value; going to /console/");
                    header::HeaderValue::from_static("/console/")
                });
                let mut res = StatusCode::SEE_OTHER.into_response();
                res.headers_mut().insert(header::LOCATION, location);
                res.headers_mut().insert(header::CACHE_CONTROL, header::HeaderValue::from_static("no-store"));
                res
            }
            ConsoleError::Api(e) => {
                // Error pages are English and Chinese at once: the request's language is
                // not known here, and the message comes from the one error mapping.
                let body = format!(
                    "<section class=\"card\"><h1>{} / {}</h1><p class=\"alert\" role=\"alert\" data-code=\"{}\">{}</p>\
                     <p><a href=\"/console/\">{} / {}</a></p></section>",
                    html::esc(Lang::En.t("error.title")),
                    html::esc(Lang::Zh.t("error.title")),
                    html::esc(e.code),
                    html::esc(&e.message),
                    html::esc(Lang::En.t("error.back")),
                    html::esc(Lang::Zh.t("error.back")),
                );
                let mut res =
                    (e.status, Html(html::bare_page(Lang::En, Lang::En.t("error.title"), "/console/", &body)))
                        .into_response();
                if let Some(s) = e.retry_after.and_then(|s| header::HeaderValue::from_str(&s.to_string()).ok()) {
                    res.headers_mut().insert(header::RETRY_AFTER, s);
                }
                res
            }
        }
    }
}

/// The content security policy of every console answer. The console is served from the
/// broker itself and uses no inline script, inline style, plugin or foreign origin, so
/// everything but its own files is refused; `frame-ancestors 'none'` (with
/// `X-Frame-Options: DENY` for older browsers) keeps other sites from framing its
/// buttons under a decoy (clickjacking).
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
     img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; \
     object-src 'none'";

/// Adds the console's security headers to an answer, whatever produced it (a page, an
/// error page, a redirect, an asset or the live stream).
async fn security_headers(mut res: Response) -> Response {
    let h = res.headers_mut();
    h.insert(header::CONTENT_SECURITY_POLICY, header::HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    h.insert(header::X_FRAME_OPTIONS, header::HeaderValue::from_static("DENY"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, header::HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, header::HeaderValue::from_static("same-origin"));
    res
}

const CSS: &str = include_str!("assets/console.css");
const JS: &str = include_str!("assets/console.js");

async fn asset_css() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8"), (header::CACHE_CONTROL, "max-age=300")], CSS).into_response()
}

async fn asset_js() -> Response {
    ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8"), (header::CACHE_CONTROL, "max-age=300")], JS)
        .into_response()
}

/// The console's routes, merged into the broker's router by `crate::router`.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/console", get(|| async { ConsoleError::Redirect("/console/".into()) }))
        .route("/console/", get(pages::home))
        .route("/console/login", get(auth::login_form).post(auth::login))
        .route("/console/logout", post(auth::logout))
        .route("/console/lang", get(auth::switch_lang))
        .route("/console/assets/console.css", get(asset_css))
        .route("/console/assets/console.js", get(asset_js))
        .route("/console/operators", get(pages::operators).post(pages::create_operator))
        .route(
            "/console/operators/{id}/{action}",
            // A GET here (a bookmark, a login that came back to the form's address) shows
            // the page instead of a bare 405.
            get(|| async { ConsoleError::Redirect("/console/operators".into()) }).post(pages::operator_action),
        )
        .route("/console/stores/{store}/", get(pages::overview))
        .route("/console/stores/{store}", get(pages::overview))
        .route("/console/stores/{store}/attention", get(pages::attention))
        .route("/console/stores/{store}/tickets", get(tickets::tickets))
        .route("/console/stores/{store}/tickets/bulk", get(bulk::by_get).post(bulk::bulk))
        .route("/console/stores/{store}/tickets/{task}", get(pages::ticket))
        .route("/console/stores/{store}/tickets/{task}/preview.png", get(pages::preview))
        .route("/console/stores/{store}/tickets/{task}/{action}", get(pages::action_by_get).post(pages::act))
        .route("/console/stores/{store}/reconciliation", get(pages::reconciliation))
        .route("/console/stores/{store}/reconciliation.csv", get(pages::reconciliation_csv))
        .route("/console/stores/{store}/live", get(live::events))
        // Set-up: a store's printers and stations, the tenant's alert targets (managers).
        .route("/console/stores/{store}/printers", get(setup::printers).post(setup::add_printer))
        .route(
            "/console/stores/{store}/printers/{printer}/{action}",
            get(|axum::extract::Path((store, _, _)): axum::extract::Path<(String, String, String)>| async move {
                ConsoleError::Redirect(format!("/console/stores/{}/printers", html::url_encode(&store)))
            })
            .post(setup::printer_action),
        )
        .route("/console/stores/{store}/stations", post(setup::add_station))
        .route("/console/stores/{store}/stations/{station}/edit", post(setup::edit_station))
        .route("/console/alerts", get(setup::alerts).post(setup::add_alert))
        .route(
            "/console/alerts/{id}/test",
            get(|| async { ConsoleError::Redirect("/console/alerts".into()) }).post(setup::test_alert),
        )
        .route("/console/{*rest}", get(pages::not_found).post(pages::not_found))
        .layer(axum::middleware::map_response(security_headers))
}

/// Every route of the console with an example path and its method, for the test that
/// checks that each one except the public ones needs a login.
pub const ROUTES: &[(&str, &str, bool)] = &[
    ("GET", "/console/", false),
    ("GET", "/console/login", true),
    ("POST", "/console/logout", false),
    ("GET", "/console/lang?to=zh", true),
    ("GET", "/console/assets/console.css", true),
    ("GET", "/console/assets/console.js", true),
    ("GET", "/console/operators", false),
    ("POST", "/console/operators", false),
    ("POST", "/console/operators/amy/disable", false),
    ("GET", "/console/stores/s1/", false),
    ("GET", "/console/stores/s1/attention", false),
    ("GET", "/console/stores/s1/tickets", false),
    ("POST", "/console/stores/s1/tickets/bulk", false),
    ("GET", "/console/stores/s1/tickets/bulk", false),
    ("GET", "/console/stores/s1/tickets/01ARZ3NDEKTSV4RRFFQ69G5FAV", false),
    ("GET", "/console/stores/s1/tickets/01ARZ3NDEKTSV4RRFFQ69G5FAV/preview.png", false),
    ("POST", "/console/stores/s1/tickets/01ARZ3NDEKTSV4RRFFQ69G5FAV/mark-printed", false),
    ("GET", "/console/stores/s1/tickets/01ARZ3NDEKTSV4RRFFQ69G5FAV/mark-printed", false),
    ("GET", "/console/stores/s1/reconciliation", false),
    ("GET", "/console/stores/s1/reconciliation.csv", false),
    ("GET", "/console/stores/s1/live", false),
    ("GET", "/console/stores/s1/printers", false),
    ("POST", "/console/stores/s1/printers", false),
    ("POST", "/console/stores/s1/printers/p1/test-print", false),
    ("POST", "/console/stores/s1/stations", false),
    ("POST", "/console/stores/s1/stations/st1/edit", false),
    ("GET", "/console/alerts", false),
    ("POST", "/console/alerts", false),
    ("POST", "/console/alerts/ops/test", false),
    ("GET", "/console/anything/else", false),
];
