//! The console's set-up pages, for a manager: a store's printers (add one of any kind,
//! rename and change its settings, disable and enable, a new login for a printer that logs
//! in, a test print) and stations, and the tenant's alert targets (add one, send a test).
//!
//! Every change goes through the mechanism the HTTP API uses — `engine::Setup` for
//! printers and stations, intake for the test print, the webhook routes' own functions for
//! alert targets — with the operator named in the audit (`operator:ID`). Staff see a
//! store's printers and stations but no form; a set-up request of theirs is refused (403).
//!
//! A printer's login (the password a Star or Epson printer presents) is shown once: on
//! the answer to the form that made it, never on a later load of the page. Actions that
//! show nothing new answer with a redirect to the page with `?done=`, so that a reload
//! does not do them again.

use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;
use onceprint_core::{Content, TaskId};
use onceprint_engine::setup::{PrinterChange, PrinterLogin, PrinterSpec, Reason};
use onceprint_engine::transport::{MqttProtocol, TransportConfig};
use onceprint_engine::{Caller, SubmitRequest};
use onceprint_store::{OperatorRole, Printer, Station, Webhook};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::auth::ConsoleUser;
use super::html::{esc, url_encode};
use super::i18n::Lang;
use super::pages::{form_pairs, here, render, shop, Render, Shop};
use super::ConsoleError;
use crate::error::ApiError;
use crate::AppState;

fn is_manager(user: &ConsoleUser) -> bool {
    user.operator().role == OperatorRole::Manager
}

fn manager_only(user: &ConsoleUser) -> Result<(), ConsoleError> {
    if is_manager(user) {
        Ok(())
    } else {
        Err(ConsoleError::Api(ApiError::forbidden("only a manager changes the set-up of printers and alerts")))
    }
}

/// The engine's caller for a change made on the console: the operator, named in the audit.
fn caller(user: &ConsoleUser) -> Caller<'_> {
    Caller::operator(&user.operator().tenant_id, &user.operator().id)
}

fn setup_error(e: onceprint_engine::SetupError) -> ConsoleError {
    ConsoleError::Api(e.into())
}

/// The form's fields (one value each) after the CSRF check.
fn fields_of(user: &ConsoleUser, body: &[u8]) -> Result<HashMap<String, String>, ConsoleError> {
    let fields: HashMap<String, String> = form_pairs(body).into_iter().collect();
    user.check_csrf(fields.get("csrf").map_or("", String::as_str))?;
    Ok(fields)
}

fn field<'a>(fields: &'a HashMap<String, String>, name: &str) -> &'a str {
    fields.get(name).map_or("", |v| v.trim())
}

fn csrf_input(user: &ConsoleUser) -> String {
    format!("<input type=\"hidden\" name=\"csrf\" value=\"{}\">", esc(&user.session.csrf_token))
}

/// The kinds of printer a manager can add, each with the fields its form asks for, in the
/// order shown. The key of each is the `kind` of the API's transport object; an MQTT
/// printer is split in two (a Star printer, an onceprint device) so that each form asks
/// only for what that printer needs.
const ADD_KINDS: &[(&str, &[&str])] = &[
    ("agent", &["address", "profile"]),
    ("cloudprnt", &["mac", "poll_interval_s", "profile"]),
    ("epson_sdp", &["printer_id", "poll_interval_s", "profile"]),
    ("mqtt_cloudprnt", &["mac", "profile"]),
    ("mqtt_onceprint", &["device_id", "profile"]),
    ("webhook", &["url", "secret", "status_url", "profile"]),
];

/// The form key of a printer's transport (see [`ADD_KINDS`]).
fn form_kind(t: &TransportConfig) -> &'static str {
    match t {
        TransportConfig::Agent(_) => "agent",
        TransportConfig::Webhook(_) => "webhook",
        TransportConfig::Cloudprnt(_) => "cloudprnt",
        TransportConfig::EpsonSdp(_) => "epson_sdp",
        TransportConfig::Mqtt(m) if m.protocol == MqttProtocol::Cloudprnt => "mqtt_cloudprnt",
        TransportConfig::Mqtt(_) => "mqtt_onceprint",
    }
}

fn fields_of_kind(kind: &str) -> &'static [&'static str] {
    ADD_KINDS.iter().find(|(k, _)| *k == kind).map_or(&[], |(_, f)| f)
}

/// The transport object of a form: `base` (the printer's stored transport when editing,
/// so that a secret left empty stays as it was) with the form's fields of `kind` on top.
/// An empty optional field is removed; a number that does not parse is passed on as text,
/// so that the engine's own check names the field.
fn transport_of(kind: &str, fields: &HashMap<String, String>, base: Option<Value>) -> Value {
    let mut obj = match base {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    };
    let (api_kind, protocol) = match kind {
        "mqtt_cloudprnt" => ("mqtt", Some("cloudprnt")),
        "mqtt_onceprint" => ("mqtt", Some("onceprint")),
        k => (k, None),
    };
    obj.insert("kind".into(), json!(api_kind));
    if let Some(p) = protocol {
        obj.insert("protocol".into(), json!(p));
    }
    for name in fields_of_kind(kind) {
        let value = field(fields, name);
        if value.is_empty() {
            // A secret is required and never shown: empty on an edit means "keep it".
            if *name != "secret" {
                obj.remove(*name);
            }
            continue;
        }
        let v = match *name {
            "poll_interval_s" => value.parse::<u32>().map_or_else(|_| json!(value), |n| json!(n)),
            _ => json!(value),
        };
        obj.insert((*name).into(), v);
    }
    Value::Object(obj)
}

/// The broker's address as a printer reaches it: `serve --public-url` when set, else the
/// address this page was asked for (a manager sets printers up on the broker they use).
fn broker_url(st: &AppState, headers: &HeaderMap) -> String {
    if let Some(u) = &st.config.public_url {
        return u.trim_end_matches('/').to_owned();
    }
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("BROKER");
    let https = headers.get("x-forwarded-proto").is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"https"));
    format!("{}://{host}", if https { "https" } else { "http" })
}

/// A printer's kind in plain words for the list, which staff read too: how it is
/// connected, without the names of protocols (the forms, for a manager, name them as the
/// printer's own settings page does).
fn kind_words(lang: Lang, t: Option<&TransportConfig>) -> &'static str {
    match t.map(form_kind) {
        Some(k) => lang.t(match k {
            "agent" => "setup.plain.agent",
            "webhook" => "setup.plain.webhook",
            "cloudprnt" | "mqtt_cloudprnt" => "setup.plain.star",
            "epson_sdp" => "setup.plain.epson",
            _ => "setup.plain.device",
        }),
        None => lang.t("setup.kind.unknown"),
    }
}

fn state_words(lang: Lang, p: &Printer) -> (&'static str, &'static str) {
    if !p.enabled {
        ("disabled", lang.t("printer.disabled"))
    } else if p.online && p.last_error.is_none() {
        ("ok", lang.t("printer.online"))
    } else if p.online {
        ("warn", lang.t("printer.online"))
    } else {
        ("bad", lang.t("printer.offline"))
    }
}

/// An input of a printer form, pre-filled with `value`.
fn input(lang: Lang, name: &str, value: &str, required: bool) -> String {
    let (label, hint, kind) = match name {
        "address" => ("setup.f.address", "setup.h.address", "text"),
        "mac" => ("setup.f.mac", "setup.h.mac", "text"),
        "poll_interval_s" => ("setup.f.poll", "setup.h.poll", "number"),
        "printer_id" => ("setup.f.epson_id", "setup.h.epson_id", "text"),
        "device_id" => ("setup.f.device_id", "setup.h.device_id", "text"),
        "url" => ("setup.f.url", "setup.h.url", "url"),
        "secret" => ("setup.f.secret", "setup.h.secret", "password"),
        "status_url" => ("setup.f.status_url", "setup.h.status_url", "url"),
        // Every field of `ADD_KINDS` has its words above; another name is a programming slip
        // that shows the generic word rather than breaking the page.
        _ => ("setup.f.other", "setup.f.other", "text"),
    };
    if name == "profile" {
        let mut sel = format!(
            "<label>{}<select name=\"profile\"><option value=\"\">{}</option>",
            esc(lang.t("setup.f.profile")),
            esc(lang.t("setup.f.profile_default"))
        );
        for p in onceprint_render::Profile::builtin_names() {
            let selected = if p == value { " selected" } else { "" };
            sel.push_str(&format!("<option value=\"{p}\"{selected}>{p}</option>", p = esc(&p)));
        }
        sel.push_str("</select></label>");
        return sel;
    }
    let required = if required { " required" } else { "" };
    let extra = match name {
        "poll_interval_s" => " min=\"1\" max=\"3600\"",
        "secret" => " minlength=\"16\" autocomplete=\"new-password\"",
        _ => " autocomplete=\"off\"",
    };
    format!(
        "<label>{label}<input name=\"{name}\" type=\"{kind}\" value=\"{value}\"{required}{extra}>\
         <small class=\"muted\">{hint}</small></label>",
        label = esc(lang.t(label)),
        hint = esc(lang.t(hint)),
        value = esc(value),
    )
}

/// Which fields a new printer of `kind` must have.
fn required_field(kind: &str, name: &str) -> bool {
    matches!((kind, name), ("agent", "address") | ("webhook", "url" | "secret") | (_, "mac" | "device_id"))
}

/// The page's note after an action (`?done=`), from a fixed list: the query cannot put
/// words on the page.
const DONE: &[(&str, &str)] = &[
    ("edit", "setup.done.edit"),
    ("disable", "setup.done.disable"),
    ("enable", "setup.done.enable"),
    ("test-print", "setup.done.test_print"),
    ("station", "setup.done.station"),
    ("station-edit", "setup.done.station_edit"),
    ("printer", "setup.done.printer"),
];

/// After an action on the printers page.
#[derive(Debug, Deserialize)]
pub struct DoneQuery {
    done: Option<String>,
    task: Option<String>,
}

/// What the printers page shows once, above the list: a new printer's login, a note.
#[derive(Default)]
struct Once {
    note: Option<String>,
    /// The printer and the login made for it just now.
    login: Option<(Printer, PrinterLogin)>,
    /// The test ticket sent just now.
    test_task: Option<String>,
}

/// The steps to enter a printer's login on the printer, with the login itself: shown on
/// the answer that made it and never again.
fn login_card(lang: Lang, base: &str, p: &Printer, login: &PrinterLogin) -> String {
    let t = TransportConfig::from_stored(&p.transport);
    let (path, steps) = match t.as_ref().map(form_kind) {
        Some("epson_sdp") => ("/epson-sdp", "setup.login.steps_epson"),
        Some("mqtt_onceprint") => ("", "setup.login.steps_device"),
        _ => ("/cloudprnt", "setup.login.steps_star"),
    };
    let url = if path.is_empty() {
        String::new()
    } else {
        format!(
            "<dt>{}</dt><dd><code data-server-url>{}</code></dd>",
            esc(lang.t("setup.login.url")),
            esc(&format!("{base}{path}"))
        )
    };
    format!(
        "<section class=\"card login-once\" id=\"printer-login\" data-printer=\"{id}\" role=\"status\">\
         <h2>{title} {name}</h2><p class=\"alert\">{once}</p>\
         <dl>{url}<dt>{user_l}</dt><dd><code data-login-username>{user}</code></dd>\
         <dt>{pw_l}</dt><dd><code data-login-password>{pw}</code></dd></dl>\
         <p>{steps}</p><p class=\"muted\">{more}</p></section>",
        id = esc(&p.id),
        title = esc(lang.t("setup.login.title")),
        name = esc(&p.name),
        once = esc(lang.t("setup.login.once")),
        user_l = esc(lang.t("setup.login.username")),
        user = esc(&login.username),
        pw_l = esc(lang.t("setup.login.password")),
        pw = esc(&login.password),
        steps = esc(lang.t(steps)),
        more = esc(lang.t("setup.login.more")),
    )
}

/// One printer of the list, with (for a manager) its forms.
fn printer_card(lang: Lang, user: &ConsoleUser, base: &str, p: &Printer) -> String {
    let t = TransportConfig::from_stored(&p.transport);
    let (class, word) = state_words(lang, p);
    let mut card = format!(
        "<li class=\"card printer {class}\" data-setup-printer=\"{id}\"><div class=\"row\"><strong>{name}</strong> \
         <span class=\"muted\">{id}</span> <span class=\"dot\" aria-hidden=\"true\"></span>\
         <span class=\"status\" data-status>{word}</span></div><p class=\"muted\" data-kind>{kind}</p>",
        id = esc(&p.id),
        name = esc(&p.name),
        word = esc(word),
        kind = esc(kind_words(lang, t.as_ref())),
    );
    if !is_manager(user) {
        card.push_str("</li>");
        return card;
    }
    let action = |a: &str| format!("{base}/printers/{}/{a}", url_encode(&p.id));
    let csrf = csrf_input(user);
    card.push_str("<div class=\"actions\">");
    // The test print first: it is what a manager does right after adding a printer.
    if p.enabled {
        card.push_str(&format!(
            "<form method=\"post\" action=\"{}\" data-action=\"test-print\">{csrf}\
             <button type=\"submit\">{}</button></form>",
            action("test-print"),
            esc(lang.t("setup.test_print"))
        ));
    }
    // Edit: the name and the settings of the printer's kind (the kind itself stays; a
    // printer of another kind is a new printer).
    let mut edit = format!(
        "<details class=\"action\" data-action=\"edit\"><summary>{}</summary>\
         <form method=\"post\" action=\"{}\">{csrf}<label>{}<input name=\"name\" value=\"{}\" required maxlength=\"200\"></label>",
        esc(lang.t("setup.edit")),
        action("edit"),
        esc(lang.t("setup.f.name")),
        esc(&p.name),
    );
    if let Some(t) = &t {
        let kind = form_kind(t);
        let shown = t.redacted();
        edit.push_str(&format!("<input type=\"hidden\" name=\"kind\" value=\"{kind}\">"));
        for name in fields_of_kind(kind) {
            let value = match shown.get(*name) {
                Some(Value::String(s)) if *name != "secret" => s.clone(),
                Some(Value::Number(n)) => n.to_string(),
                _ => String::new(),
            };
            edit.push_str(&input(lang, name, &value, required_field(kind, name) && *name != "secret"));
        }
    }
    edit.push_str(&format!("<button type=\"submit\">{}</button></form></details>", esc(lang.t("setup.save"))));
    card.push_str(&edit);
    let (switch, label) = if p.enabled { ("disable", "setup.disable") } else { ("enable", "setup.enable") };
    card.push_str(&format!(
        "<details class=\"action\" data-action=\"{switch}\"><summary>{label}</summary>\
         <form method=\"post\" action=\"{}\">{csrf}<label>{reason}<input name=\"reason\" required maxlength=\"2000\"></label>\
         <button type=\"submit\">{label}</button></form></details>",
        action(switch),
        label = esc(lang.t(label)),
        reason = esc(lang.t("action.reason")),
    ));
    if t.as_ref().is_some_and(|t| t.kind().has_login()) {
        card.push_str(&format!(
            "<details class=\"action\" data-action=\"rotate\"><summary>{label}</summary>\
             <form method=\"post\" action=\"{}\">{csrf}<p class=\"muted\">{warn}</p>\
             <button type=\"submit\">{label}</button></form></details>",
            action("rotate"),
            label = esc(lang.t("setup.rotate")),
            warn = esc(lang.t("setup.rotate_warn")),
        ));
    }
    card.push_str("</div></li>");
    card
}

/// The forms that add a printer, one per kind, each folded until opened.
fn add_forms(lang: Lang, user: &ConsoleUser, base: &str) -> String {
    let mut out = format!("<section class=\"card\" id=\"add-printer\"><h2>{}</h2>", esc(lang.t("setup.add")));
    let csrf = csrf_input(user);
    for (kind, names) in ADD_KINDS {
        let t_key = match *kind {
            "agent" => "setup.kind.agent",
            "webhook" => "setup.kind.webhook",
            "cloudprnt" => "setup.kind.cloudprnt",
            "epson_sdp" => "setup.kind.epson_sdp",
            "mqtt_cloudprnt" => "setup.kind.mqtt_cloudprnt",
            _ => "setup.kind.mqtt_onceprint",
        };
        out.push_str(&format!(
            "<details class=\"action\" data-add=\"{kind}\"><summary>{}</summary>\
             <form method=\"post\" action=\"{base}/printers\">{csrf}<input type=\"hidden\" name=\"kind\" value=\"{kind}\">\
             <label>{}<input name=\"id\" required maxlength=\"64\" pattern=\"[A-Za-z0-9._:\\-]+\" autocomplete=\"off\">\
             <small class=\"muted\">{}</small></label>\
             <label>{}<input name=\"name\" maxlength=\"200\"></label>",
            esc(lang.t(t_key)),
            esc(lang.t("setup.f.id")),
            esc(lang.t("setup.h.id")),
            esc(lang.t("setup.f.name")),
        ));
        for name in *names {
            out.push_str(&input(lang, name, "", required_field(kind, name)));
        }
        out.push_str(&format!("<button type=\"submit\">{}</button></form></details>", esc(lang.t("setup.add_button"))));
    }
    out.push_str("</section>");
    out
}

fn station_selects(lang: Lang, printers: &[Printer], chosen: &[String]) -> String {
    let slots = printers.len().clamp(1, 6);
    let mut out = String::new();
    for i in 0..slots {
        let label = if i == 0 {
            lang.t("setup.station.primary").to_owned()
        } else {
            format!("{} {i}", lang.t("setup.station.backup"))
        };
        let current = chosen.get(i).map_or("", String::as_str);
        out.push_str(&format!("<label>{}<select name=\"printer\"><option value=\"\">—</option>", esc(&label)));
        for p in printers {
            let selected = if p.id == current { " selected" } else { "" };
            out.push_str(&format!("<option value=\"{}\"{selected}>{}</option>", esc(&p.id), esc(&p.name)));
        }
        out.push_str("</select></label>");
    }
    out
}

fn failover_input(lang: Lang, ms: Option<i64>) -> String {
    format!(
        "<label>{}<input name=\"failover_after_s\" type=\"number\" min=\"0\" max=\"86400\" value=\"{}\">\
         <small class=\"muted\">{}</small></label>",
        esc(lang.t("setup.station.failover")),
        ms.map(|m| (m / 1000).to_string()).unwrap_or_default(),
        esc(lang.t("setup.station.failover_hint")),
    )
}

fn stations_section(lang: Lang, user: &ConsoleUser, base: &str, printers: &[Printer], stations: &[Station]) -> String {
    let names: HashMap<&str, &str> = printers.iter().map(|p| (p.id.as_str(), p.name.as_str())).collect();
    let mut out = format!(
        "<section class=\"card\" id=\"stations\"><h2>{}</h2><p class=\"muted\">{}</p>",
        esc(lang.t("setup.stations")),
        esc(lang.t("setup.stations_about"))
    );
    if stations.is_empty() {
        out.push_str(&format!("<p class=\"empty\">{}</p>", esc(lang.t("setup.stations_none"))));
    }
    out.push_str("<ul class=\"cards\">");
    let csrf = csrf_input(user);
    for s in stations {
        let order: Vec<String> =
            s.printers.iter().map(|p| names.get(p.as_str()).copied().unwrap_or(p).to_owned()).collect();
        out.push_str(&format!(
            "<li class=\"card\" data-station=\"{id}\"><strong>{id}</strong><p data-order>{order}</p>",
            id = esc(&s.id),
            order = esc(&order.join(" → ")),
        ));
        if is_manager(user) {
            out.push_str(&format!(
                "<details class=\"action\" data-action=\"station-edit\"><summary>{edit}</summary>\
                 <form method=\"post\" action=\"{base}/stations/{url}/edit\">{csrf}{selects}{failover}\
                 <button type=\"submit\">{save}</button></form></details>",
                edit = esc(lang.t("setup.edit")),
                url = url_encode(&s.id),
                selects = station_selects(lang, printers, &s.printers),
                failover = failover_input(lang, s.failover_after_ms),
                save = esc(lang.t("setup.save")),
            ));
        }
        out.push_str("</li>");
    }
    out.push_str("</ul>");
    if is_manager(user) && !printers.is_empty() {
        out.push_str(&format!(
            "<details class=\"action\" data-add=\"station\"><summary>{add}</summary>\
             <form method=\"post\" action=\"{base}/stations\">{csrf}\
             <label>{id_l}<input name=\"id\" required maxlength=\"64\" autocomplete=\"off\"></label>{selects}{failover}\
             <button type=\"submit\">{add}</button></form></details>",
            add = esc(lang.t("setup.station.add")),
            id_l = esc(lang.t("setup.f.id")),
            selects = station_selects(lang, printers, &[]),
            failover = failover_input(lang, None),
        ));
    }
    out.push_str("</section>");
    out
}

/// The printers page of a store.
async fn printers_page(
    st: &AppState,
    user: &ConsoleUser,
    headers: &HeaderMap,
    shop: &Shop,
    once: Once,
) -> Result<Response, ConsoleError> {
    let lang = user.lang;
    let tenant = &user.operator().tenant_id;
    let printers = st.store.list_printers(tenant, Some(&shop.row.id)).await?;
    let stations = st.store.list_stations(tenant, &shop.row.id).await?;
    let base = format!("/console/stores/{}", url_encode(&shop.row.id));
    let mut body = String::new();
    if let Some(n) = &once.note {
        body.push_str(&format!("<p class=\"alert\" role=\"status\" id=\"done\">{}", esc(n)));
        if let Some(task) = &once.test_task {
            body.push_str(&format!(
                " <a href=\"{base}/tickets/{}\" id=\"test-ticket\">{}</a>",
                url_encode(task),
                esc(lang.t("setup.follow_ticket"))
            ));
        }
        body.push_str("</p>");
    }
    if let Some((p, login)) = &once.login {
        body.push_str(&login_card(lang, &broker_url(st, headers), p, login));
    }
    if !is_manager(user) {
        body.push_str(&format!("<p class=\"muted\">{}</p>", esc(lang.t("setup.staff_note"))));
    }
    if printers.is_empty() {
        body.push_str(&format!("<p class=\"empty\">{}</p>", esc(lang.t("printer.none"))));
    }
    body.push_str("<ul class=\"printers\" id=\"setup-printers\">");
    for p in &printers {
        body.push_str(&printer_card(lang, user, &base, p));
    }
    body.push_str("</ul>");
    if is_manager(user) {
        body.push_str(&add_forms(lang, user, &base));
    }
    body.push_str(&stations_section(lang, user, &base, &printers, &stations));
    let r = Render {
        user,
        shop: Some(shop),
        title: lang.t("setup.title"),
        current: "setup",
        here: here(headers, &format!("{base}/printers")),
        live: false,
    };
    Ok(render(r, headers, &body))
}

/// `GET /console/stores/{store}/printers`: the store's printers and stations; for a
/// manager with the forms that set them up.
pub async fn printers(
    State(st): State<AppState>,
    user: ConsoleUser,
    headers: HeaderMap,
    Path(store_id): Path<String>,
    Query(q): Query<DoneQuery>,
) -> Result<Response, ConsoleError> {
    let shop = shop(&st, &user, &store_id).await?;
    let lang = user.lang;
    let note = q.done.as_deref().and_then(|d| DONE.iter().find(|(k, _)| *k == d)).map(|(_, t)| lang.t(t).to_owned());
    // Only a task id goes into the link to the test ticket.
    let test_task = q.task.as_deref().and_then(TaskId::parse).map(|t| t.as_str().to_owned());
    let once = Once { note, login: None, test_task };
    printers_page(&st, &user, &headers, &shop, once).await
}

/// `POST /console/stores/{store}/printers`: adds a printer (a manager). A printer that
/// logs in gets its login, shown on this answer only.
pub async fn add_printer(
    State(st): State<AppState>,
    user: ConsoleUser,
    headers: HeaderMap,
    Path(store_id): Path<String>,
    body: axum::body::Bytes,
) -> Result<Response, ConsoleError> {
    let fields = fields_of(&user, &body)?;
    manager_only(&user)?;
    let shop = shop(&st, &user, &store_id).await?;
    let kind = field(&fields, "kind");
    if !ADD_KINDS.iter().any(|(k, _)| *k == kind) {
        return Err(ConsoleError::Api(ApiError::invalid(format!("kind: unknown {kind:?}"))));
    }
    let name = Some(field(&fields, "name").to_owned()).filter(|n| !n.is_empty());
    let spec = PrinterSpec {
        id: field(&fields, "id").to_owned(),
        store_id: shop.row.id.clone(),
        name,
        transport: transport_of(kind, &fields, None),
    };
    let (printer, login) = st.setup.create_printer(caller(&user), spec).await.map_err(setup_error)?;
    let lang = user.lang;
    let once = Once {
        note: Some(lang.t("setup.done.printer").to_owned()),
        login: login.map(|l| (printer, l)),
        test_task: None,
    };
    let mut res = printers_page(&st, &user, &headers, &shop, once).await?;
    *res.status_mut() = StatusCode::CREATED;
    Ok(res)
}

/// The store's printer `id`, or "not found" (another store's, another tenant's, none).
async fn printer_of(st: &AppState, user: &ConsoleUser, shop: &Shop, id: &str) -> Result<Printer, ConsoleError> {
    match st.store.get_printer(&user.operator().tenant_id, id).await? {
        Some(p) if p.store_id == shop.row.id => Ok(p),
        _ => Err(ConsoleError::Api(ApiError::not_found(format!("no printer {id:?}")))),
    }
}

/// The text of a test ticket: what it is, which printer, when, and who asked.
fn test_ticket(shop: &Shop, p: &Printer, who: &str, biz_no: &str, now: i64) -> String {
    format!("TEST PRINT {biz_no}\n{}\n{}\n{}\n{}\nby {who}\n", shop.row.name, p.name, p.id, shop.zone.local_time(now))
}

/// `POST /console/stores/{store}/printers/{printer}/{action}`: edit, disable, enable,
/// rotate (a new login, shown on this answer only) or test-print (a manager).
pub async fn printer_action(
    State(st): State<AppState>,
    user: ConsoleUser,
    headers: HeaderMap,
    Path((store_id, printer_id, action)): Path<(String, String, String)>,
    body: axum::body::Bytes,
) -> Result<Response, ConsoleError> {
    let fields = fields_of(&user, &body)?;
    manager_only(&user)?;
    let shop = shop(&st, &user, &store_id).await?;
    let printer = printer_of(&st, &user, &shop, &printer_id).await?;
    let page = format!("/console/stores/{}/printers", url_encode(&shop.row.id));
    let who = Reason { operator: user.operator().id.clone(), reason: field(&fields, "reason").to_owned() };
    match action.as_str() {
        "edit" => {
            let name = Some(field(&fields, "name").to_owned()).filter(|n| !n.is_empty() && *n != printer.name);
            let stored: Option<Value> = serde_json::from_str(&printer.transport).ok();
            let current = TransportConfig::from_stored(&printer.transport);
            let transport = match current.as_ref().map(form_kind) {
                Some(kind) if field(&fields, "kind") == kind => {
                    let t = transport_of(kind, &fields, stored.clone());
                    // Unchanged settings are not sent: the audit then says only what changed.
                    (Some(&t) != stored.as_ref()).then_some(t)
                }
                _ => None,
            };
            if name.is_some() || transport.is_some() {
                let change = PrinterChange { name, transport, store_id: None };
                st.setup.update_printer(caller(&user), &printer.id, change).await.map_err(setup_error)?;
            }
        }
        "disable" | "enable" => {
            let on = action == "enable";
            st.setup.set_printer_enabled(caller(&user), &printer.id, on, who).await.map_err(setup_error)?;
        }
        "rotate" => {
            let login = st.setup.rotate_printer_login(caller(&user), &printer.id).await.map_err(setup_error)?;
            let once = Once { note: None, login: Some((printer, login)), test_task: None };
            return printers_page(&st, &user, &headers, &shop, once).await;
        }
        "test-print" => {
            let now = onceprint_engine::clock::now_ms();
            // A business number people recognise as a test, unique to the second in the
            // store's time; a second press within that second finds the same ticket.
            let stamp: String = shop.zone.local_time(now).chars().filter(char::is_ascii_digit).collect();
            let biz_no = format!("TEST-{stamp}");
            let req = SubmitRequest {
                tenant_id: user.operator().tenant_id.clone(),
                biz_no: Some(biz_no.clone()),
                printer_id: Some(printer.id.clone()),
                content: Some(Content::Text { text: test_ticket(&shop, &printer, &user.operator().id, &biz_no, now) }),
                actor: Some(format!("operator:{}", user.operator().id)),
                ..SubmitRequest::default()
            };
            let answer = st.intake.submit(req).await.map_err(ApiError::from)?;
            return Err(ConsoleError::Redirect(format!("{page}?done=test-print&task={}", url_encode(&answer.task_id))));
        }
        _ => return Err(ConsoleError::Api(ApiError::not_found(format!("no printer action {action:?}")))),
    }
    Err(ConsoleError::Redirect(format!("{page}?done={action}")))
}

/// The printers of a station form, in order, without the empty choices.
fn chosen_printers(body: &[u8]) -> Vec<String> {
    form_pairs(body).into_iter().filter(|(k, v)| k == "printer" && !v.is_empty()).map(|(_, v)| v).collect()
}

/// The failover threshold of a station form: empty is the broker's own.
fn failover_of(fields: &HashMap<String, String>) -> Result<Option<i64>, ConsoleError> {
    let v = field(fields, "failover_after_s");
    if v.is_empty() {
        return Ok(None);
    }
    v.parse::<i64>()
        .map(|s| Some(s.saturating_mul(1000)))
        .map_err(|_| ConsoleError::Api(ApiError::invalid("failover_after_s: a whole number of seconds")))
}

/// `POST /console/stores/{store}/stations`: a new station (a manager).
pub async fn add_station(
    State(st): State<AppState>,
    user: ConsoleUser,
    Path(store_id): Path<String>,
    body: axum::body::Bytes,
) -> Result<Response, ConsoleError> {
    let fields = fields_of(&user, &body)?;
    manager_only(&user)?;
    let shop = shop(&st, &user, &store_id).await?;
    let id = field(&fields, "id").to_owned();
    let failover = failover_of(&fields)?;
    let printers = chosen_printers(&body);
    st.setup.create_station(caller(&user), id, shop.row.id.clone(), printers, failover).await.map_err(setup_error)?;
    Err(ConsoleError::Redirect(format!("/console/stores/{}/printers?done=station", url_encode(&shop.row.id))))
}

/// `POST /console/stores/{store}/stations/{station}/edit`: a station's printers, in order,
/// and its failover threshold (a manager).
pub async fn edit_station(
    State(st): State<AppState>,
    user: ConsoleUser,
    Path((store_id, station_id)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Result<Response, ConsoleError> {
    let fields = fields_of(&user, &body)?;
    manager_only(&user)?;
    let shop = shop(&st, &user, &store_id).await?;
    let not_found = || ConsoleError::Api(ApiError::not_found(format!("no station {station_id:?}")));
    match st.store.get_station(&user.operator().tenant_id, &station_id).await? {
        Some(s) if s.store_id == shop.row.id => {}
        _ => return Err(not_found()),
    }
    let failover = failover_of(&fields)?;
    let printers = chosen_printers(&body);
    st.setup.update_station(caller(&user), &station_id, Some(printers), Some(failover)).await.map_err(setup_error)?;
    Err(ConsoleError::Redirect(format!("/console/stores/{}/printers?done=station-edit", url_encode(&shop.row.id))))
}

/// The alert formats a manager picks from, with their words.
const FORMATS: &[(&str, &str)] = &[
    ("wecom", "alerts.format.wecom"),
    ("dingtalk", "alerts.format.dingtalk"),
    ("feishu", "alerts.format.feishu"),
    ("slack", "alerts.format.slack"),
    ("onceprint", "alerts.format.onceprint"),
];

/// The events a new target gets unless the manager picks others: what needs a person.
const DEFAULT_EVENTS: &[&str] = &["task.failed", "task.in_doubt", "printer.offline", "agent.offline"];

fn format_words(lang: Lang, format: &str) -> &'static str {
    FORMATS.iter().find(|(f, _)| *f == format).map_or(lang.t("setup.kind.unknown"), |(_, k)| lang.t(k))
}

/// An alert target's address without its query, path beyond the host or credentials: a
/// group bot's URL carries its key, which the page must not show.
fn shown_url(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = host.rsplit('@').next().unwrap_or(host);
    format!("{scheme}://{host}/…")
}

/// The last delivery of a target in words: delivered (when), or not yet (why).
fn last_delivery(
    lang: Lang,
    d: Option<&onceprint_store::WebhookDelivery>,
    zone: &onceprint_engine::tz::Zone,
) -> String {
    match d {
        None => esc(lang.t("alerts.never")),
        Some(d) => {
            let what = if d.kind == onceprint_engine::alerts::TEST_EVENT { lang.t("alerts.test_msg") } else { &d.kind };
            match (d.delivered_at, &d.last_error) {
                (Some(t), _) => format!(
                    "<span class=\"fine\" data-delivery=\"delivered\">{} · {} {}</span>",
                    esc(what),
                    esc(lang.t("alerts.delivered")),
                    esc(&zone.local_time(t))
                ),
                (None, Some(e)) => format!(
                    "<span class=\"bad-text\" data-delivery=\"failing\">{} · {}: {}</span>",
                    esc(what),
                    esc(lang.t("alerts.not_delivered")),
                    esc(e)
                ),
                (None, None) => {
                    format!("<span data-delivery=\"waiting\">{} · {}</span>", esc(what), esc(lang.t("alerts.sending")))
                }
            }
        }
    }
}

/// What the alerts page shows once: a note, a new target's generated signing secret.
#[derive(Default)]
struct AlertsOnce {
    note: Option<&'static str>,
    secret: Option<(String, String)>,
}

async fn alerts_page(
    st: &AppState,
    user: &ConsoleUser,
    headers: &HeaderMap,
    once: AlertsOnce,
) -> Result<Response, ConsoleError> {
    let lang = user.lang;
    let tenant = &user.operator().tenant_id;
    let hooks: Vec<Webhook> = st.store.list_webhooks(tenant).await?;
    // Times in the zone of the tenant's first store, as its people read them; UTC without one.
    let zone = match st.store.list_stores(tenant).await?.first() {
        Some(s) => onceprint_engine::tz::parse(&s.timezone).unwrap_or_else(|_| onceprint_engine::tz::Zone::utc()),
        None => onceprint_engine::tz::Zone::utc(),
    };
    let csrf = csrf_input(user);
    let mut body = format!("<p class=\"muted\">{}</p>", esc(lang.t("alerts.about")));
    if let Some(n) = once.note {
        body.push_str(&format!("<p class=\"alert\" role=\"status\" id=\"done\">{}</p>", esc(lang.t(n))));
    }
    if let Some((id, secret)) = &once.secret {
        body.push_str(&format!(
            "<section class=\"card login-once\" id=\"alert-secret\" role=\"status\"><h2>{} {}</h2>\
             <p class=\"alert\">{}</p><p><code>{}</code></p></section>",
            esc(lang.t("alerts.secret_title")),
            esc(id),
            esc(lang.t("alerts.secret_once")),
            esc(secret)
        ));
    }
    if hooks.is_empty() {
        body.push_str(&format!("<p class=\"empty\">{}</p>", esc(lang.t("alerts.none"))));
    }
    body.push_str("<ul class=\"cards\" id=\"alert-targets\">");
    for w in &hooks {
        let deliveries = st.store.webhook_deliveries(tenant, &w.id, 1).await?.unwrap_or_default();
        body.push_str(&format!(
            "<li class=\"card\" id=\"wh-{id}\" data-webhook=\"{id}\"><div class=\"row\"><strong>{id}</strong> \
             <span class=\"badge\">{format}</span></div><p class=\"muted url\">{url}</p>\
             <p data-last>{last}</p><p class=\"muted\">{events_l}: {events}</p>\
             <form method=\"post\" action=\"/console/alerts/{url_id}/test\">{csrf}\
             <button type=\"submit\" data-action=\"test\">{test}</button></form></li>",
            id = esc(&w.id),
            format = esc(format_words(lang, &w.format)),
            url = esc(&shown_url(&w.url)),
            last = last_delivery(lang, deliveries.first(), &zone),
            events_l = esc(lang.t("alerts.events")),
            events = esc(&w.events.iter().map(|e| event_words(lang, e)).collect::<Vec<_>>().join(", ")),
            url_id = url_encode(&w.id),
            test = esc(lang.t("alerts.send_test")),
        ));
    }
    body.push_str("</ul>");
    let mut formats = String::new();
    for (f, key) in FORMATS {
        formats.push_str(&format!("<option value=\"{f}\">{}</option>", esc(lang.t(key))));
    }
    let mut events = String::new();
    for e in onceprint_engine::alerts::EVENT_KINDS {
        let checked = if DEFAULT_EVENTS.contains(&e) { " checked" } else { "" };
        events.push_str(&format!(
            "<label class=\"check\"><input type=\"checkbox\" name=\"event\" value=\"{e}\"{checked}> {}</label>",
            esc(event_words(lang, e))
        ));
    }
    body.push_str(&format!(
        "<section class=\"card\" id=\"add-alert\"><h2>{title}</h2><form method=\"post\" action=\"/console/alerts\">{csrf}\
         <label>{id_l}<input name=\"id\" required maxlength=\"64\" autocomplete=\"off\"><small class=\"muted\">{id_h}</small></label>\
         <label>{format_l}<select name=\"format\">{formats}</select></label>\
         <label>{url_l}<input name=\"url\" type=\"url\" required maxlength=\"2000\" autocomplete=\"off\"><small class=\"muted\">{url_h}</small></label>\
         <label>{secret_l}<input name=\"secret\" type=\"password\" minlength=\"16\" autocomplete=\"new-password\"><small class=\"muted\">{secret_h}</small></label>\
         <fieldset><legend>{events_l}</legend>{events}</fieldset>\
         <button type=\"submit\">{add}</button></form></section>",
        title = esc(lang.t("alerts.add")),
        id_l = esc(lang.t("setup.f.id")),
        id_h = esc(lang.t("alerts.id_hint")),
        format_l = esc(lang.t("alerts.format")),
        url_l = esc(lang.t("alerts.url")),
        url_h = esc(lang.t("alerts.url_hint")),
        secret_l = esc(lang.t("alerts.secret")),
        secret_h = esc(lang.t("alerts.secret_hint")),
        events_l = esc(lang.t("alerts.events")),
        add = esc(lang.t("alerts.add")),
    ));
    let r = Render {
        user,
        shop: None,
        title: lang.t("alerts.title"),
        current: "alerts",
        here: here(headers, "/console/alerts"),
        live: false,
    };
    Ok(render(r, headers, &body))
}

/// An alert's event in words.
fn event_words(lang: Lang, e: &str) -> &'static str {
    lang.t(match e {
        "task.failed" => "event.task_failed",
        "task.in_doubt" => "event.task_in_doubt",
        "task.printed" => "event.task_printed",
        "printer.offline" => "event.printer_offline",
        "printer.online" => "event.printer_online",
        "printer.stalled" => "event.printer_stalled",
        "printer.paused" => "event.printer_paused",
        "printer.resumed" => "event.printer_resumed",
        "printer.refused_message" => "event.printer_refused",
        "agent.offline" => "event.agent_offline",
        "offline_task.rejected" => "event.offline_rejected",
        _ => "setup.kind.unknown",
    })
}

/// After an action on the alerts page.
#[derive(Debug, Deserialize)]
pub struct AlertsQuery {
    done: Option<String>,
}

/// `GET /console/alerts`: the tenant's alert targets with their last delivery (managers).
pub async fn alerts(
    State(st): State<AppState>,
    user: ConsoleUser,
    headers: HeaderMap,
    Query(q): Query<AlertsQuery>,
) -> Result<Response, ConsoleError> {
    manager_only(&user)?;
    let note = match q.done.as_deref() {
        Some("test") => Some("alerts.done.test"),
        _ => None,
    };
    alerts_page(&st, &user, &headers, AlertsOnce { note, secret: None }).await
}

/// `POST /console/alerts`: a new alert target (a manager), through the API's own checks.
pub async fn add_alert(
    State(st): State<AppState>,
    user: ConsoleUser,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ConsoleError> {
    let fields = fields_of(&user, &body)?;
    manager_only(&user)?;
    let events: Vec<String> = form_pairs(&body).into_iter().filter(|(k, _)| k == "event").map(|(_, v)| v).collect();
    let secret = Some(field(&fields, "secret").to_owned()).filter(|s| !s.is_empty());
    let req = crate::dto::CreateWebhook {
        id: field(&fields, "id").to_owned(),
        url: field(&fields, "url").to_owned(),
        events,
        secret: secret.clone(),
        format: Some(field(&fields, "format").to_owned()).filter(|f| !f.is_empty()),
    };
    let (w, made) = crate::routes::webhooks::create_webhook(&st, &user.operator().tenant_id, req).await?;
    // A secret the broker made is shown once, for the receiving system to check signatures.
    let shown = (secret.is_none() && !made.is_empty()).then(|| (w.id.clone(), made));
    let mut res =
        alerts_page(&st, &user, &headers, AlertsOnce { note: Some("alerts.done.add"), secret: shown }).await?;
    *res.status_mut() = StatusCode::CREATED;
    Ok(res)
}

/// `POST /console/alerts/{id}/test`: a test message to one target (a manager); the page
/// shows how its delivery went.
pub async fn test_alert(
    State(st): State<AppState>,
    user: ConsoleUser,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<Response, ConsoleError> {
    fields_of(&user, &body)?;
    manager_only(&user)?;
    crate::routes::webhooks::queue_test(&st, &user.operator().tenant_id, &id).await?;
    Err(ConsoleError::Redirect(format!("/console/alerts?done=test#wh-{}", url_encode(&id))))
}

/// The texts of the set-up pages, English and Chinese (looked up by `Lang::t` after the
/// main table).
pub const TEXTS: &[(&str, &str, &str)] = &[
    ("nav.setup", "Set up printers", "设置打印机"),
    ("nav.alerts", "Alerts", "提醒"),
    ("setup.title", "Set up printers", "设置打印机"),
    ("setup.staff_note", "Only a manager can change printers and stations.", "只有经理可以更改打印机和工作站。"),
    ("setup.kind.agent", "Printer at the shop computer (network, USB or serial)", "连接门店电脑的打印机（网络、USB 或串口）"),
    ("setup.kind.webhook", "Printer behind a web service", "通过网络服务连接的打印机"),
    ("setup.kind.cloudprnt", "Star printer that connects by itself (CloudPRNT)", "自行联网的 Star 打印机（CloudPRNT）"),
    ("setup.kind.epson_sdp", "Epson printer that connects by itself (Server Direct Print)", "自行联网的爱普生打印机（Server Direct Print）"),
    ("setup.kind.mqtt_cloudprnt", "Star printer with CloudPRNT MQTT", "支持 CloudPRNT MQTT 的 Star 打印机"),
    ("setup.kind.mqtt_onceprint", "onceprint cloud printer device", "onceprint 云打印设备"),
    ("setup.kind.unknown", "Other", "其他"),
    ("setup.plain.agent", "Connected to the shop computer", "连接门店电脑"),
    ("setup.plain.webhook", "Connected through a web service", "通过网络服务连接"),
    ("setup.plain.star", "Star printer, goes online by itself", "Star 打印机，自行联网"),
    ("setup.plain.epson", "Epson printer, goes online by itself", "爱普生打印机，自行联网"),
    ("setup.plain.device", "Cloud printer device", "云打印设备"),
    ("setup.add", "Add a printer", "添加打印机"),
    ("setup.add_button", "Add printer", "添加打印机"),
    ("setup.f.id", "Short code (letters, digits)", "代码（字母、数字）"),
    ("setup.h.id", "Used by the ordering system; cannot be changed later.", "点单系统使用；之后不能更改。"),
    ("setup.f.name", "Name staff see", "员工看到的名称"),
    ("setup.f.address", "Address as the shop computer reaches it", "门店电脑访问打印机的地址"),
    ("setup.h.address", "e.g. tcp://192.168.1.50:9100, usb:///dev/usb/lp0 or serial:///dev/ttyUSB0", "例如 tcp://192.168.1.50:9100、usb:///dev/usb/lp0 或 serial:///dev/ttyUSB0"),
    ("setup.f.mac", "MAC address (on the printer's self-test slip)", "MAC 地址（见打印机自检单）"),
    ("setup.h.mac", "e.g. 00:11:62:AA:BB:CC", "例如 00:11:62:AA:BB:CC"),
    ("setup.f.poll", "How often it asks for tickets (seconds)", "取单间隔（秒）"),
    ("setup.h.poll", "The same number as on the printer's settings page; empty: 5.", "与打印机设置页上的数值相同；留空为 5。"),
    ("setup.f.epson_id", "Device ID (optional)", "设备 ID（可选）"),
    ("setup.h.epson_id", "When set, the printer must send exactly this ID.", "填写后，打印机必须发送完全相同的 ID。"),
    ("setup.f.device_id", "Device ID", "设备 ID"),
    ("setup.h.device_id", "As the device's firmware names itself.", "与设备固件中的名称相同。"),
    ("setup.f.url", "Address of the web service", "网络服务地址"),
    ("setup.h.url", "http:// or https://", "http:// 或 https://"),
    ("setup.f.secret", "Signing secret (16+ characters)", "签名密钥（至少 16 个字符）"),
    ("setup.h.secret", "Leave empty when editing to keep the current one.", "编辑时留空则保留当前密钥。"),
    ("setup.f.status_url", "Status address (optional)", "状态查询地址（可选）"),
    ("setup.h.status_url", "Where the broker asks whether a ticket printed.", "用于查询小票是否已打印的地址。"),
    ("setup.f.profile", "Paper and characters", "纸宽与字符编码"),
    ("setup.f.profile_default", "Default (80 mm)", "默认（80 毫米）"),
    ("setup.f.other", "Setting", "设置"),
    ("setup.edit", "Change", "修改"),
    ("setup.save", "Save", "保存"),
    ("setup.disable", "Disable", "停用"),
    ("setup.enable", "Enable", "启用"),
    ("setup.rotate", "New login for the printer", "为打印机生成新登录"),
    ("setup.rotate_warn", "The old password stops working at once: enter the new one on the printer right away.", "旧密码立即失效：请马上在打印机上输入新密码。"),
    ("setup.test_print", "Test print", "打印测试页"),
    ("setup.follow_ticket", "Follow the test ticket", "查看测试小票"),
    ("setup.done.edit", "Saved.", "已保存。"),
    ("setup.done.disable", "The printer is disabled: it gets no new tickets; waiting ones stay waiting.", "打印机已停用：不再接收新小票，等待中的小票继续等待。"),
    ("setup.done.enable", "The printer is enabled again.", "打印机已重新启用。"),
    ("setup.done.test_print", "A test ticket is on its way to the printer.", "测试小票已发往打印机。"),
    ("setup.done.station", "The station is added.", "工作站已添加。"),
    ("setup.done.station_edit", "The station is saved.", "工作站已保存。"),
    ("setup.done.printer", "The printer is added.", "打印机已添加。"),
    ("setup.login.title", "Login for", "登录信息："),
    ("setup.login.once", "Shown only now. Enter it on the printer now; if it is lost, make a new login.", "仅显示这一次。请现在在打印机上输入；如果丢失，请生成新登录。"),
    ("setup.login.url", "Server address", "服务器地址"),
    ("setup.login.username", "User name", "用户名"),
    ("setup.login.password", "Password", "密码"),
    ("setup.login.steps_star", "On the printer's web page (its IP address in a browser), open CloudPRNT settings: turn CloudPRNT on, enter the server address, the same polling interval as here, and under HTTP authentication the user name and password. Save and restart the printer.", "在浏览器中打开打印机的网页（打印机的 IP 地址），进入 CloudPRNT 设置：开启 CloudPRNT，填写服务器地址、与此处相同的取单间隔，并在 HTTP 认证中填写用户名和密码。保存并重启打印机。"),
    ("setup.login.steps_epson", "In the printer's Web Config, open Server Direct Print: turn it on, enter the server address as the URL, the device ID if you set one, the same interval as here, and under authentication the user name and password. Save.", "在打印机的 Web Config 中打开 Server Direct Print：开启该功能，把服务器地址填为 URL，如设置了设备 ID 请一并填写，间隔与此处相同，并在认证中填写用户名和密码。保存。"),
    ("setup.login.steps_device", "Enter the user name and password in the device's MQTT settings.", "在设备的 MQTT 设置中填写用户名和密码。"),
    ("setup.login.more", "Every step, per printer model: docs/PRINTERS.md in the onceprint documentation.", "各型号的详细步骤：见 onceprint 文档 docs/PRINTERS.md。"),
    ("setup.stations", "Stations", "工作站"),
    ("setup.stations_about", "A station is a main printer with backups: when the main printer stops (no paper, offline), its tickets move to the next one.", "工作站由一台主打印机和若干备用打印机组成：主打印机停止工作（缺纸、离线）时，小票会转到下一台。"),
    ("setup.stations_none", "No stations yet.", "还没有工作站。"),
    ("setup.station.add", "Add a station", "添加工作站"),
    ("setup.station.primary", "Main printer", "主打印机"),
    ("setup.station.backup", "Backup", "备用"),
    ("setup.station.failover", "Move tickets after (seconds)", "多久后转移小票（秒）"),
    ("setup.station.failover_hint", "How long the main printer may be stopped first; empty: the broker's setting.", "主打印机停止多久后转移；留空则使用系统设置。"),
    ("alerts.title", "Alerts", "提醒"),
    ("alerts.about", "Where the broker sends a message when something needs a person: a group chat bot or your own system.", "需要有人处理时，系统把消息发到这里：群聊机器人或您自己的系统。"),
    ("alerts.none", "No alert targets yet.", "还没有提醒目标。"),
    ("alerts.add", "Add alert target", "添加提醒目标"),
    ("alerts.id_hint", "A short name for this target (letters, digits).", "此目标的简短名称（字母、数字）。"),
    ("alerts.format", "Where to", "发往"),
    ("alerts.format.wecom", "WeCom group bot (企业微信)", "企业微信群机器人"),
    ("alerts.format.dingtalk", "DingTalk group bot (钉钉)", "钉钉群机器人"),
    ("alerts.format.feishu", "Feishu / Lark group bot (飞书)", "飞书群机器人"),
    ("alerts.format.slack", "Slack channel", "Slack 频道"),
    ("alerts.format.onceprint", "Your own system (signed messages)", "您自己的系统（带签名的消息）"),
    ("alerts.url", "Address (from the bot's settings)", "地址（见机器人设置）"),
    ("alerts.url_hint", "The bot's webhook address, http:// or https://", "机器人的 Webhook 地址，http:// 或 https://"),
    ("alerts.secret", "Signing secret (optional)", "签名密钥（可选）"),
    ("alerts.secret_hint", "Only if the bot has signing on (DingTalk SEC…, Feishu). For your own system, empty makes one.", "仅当机器人开启了签名校验时填写（钉钉 SEC…、飞书）。您自己的系统留空则自动生成。"),
    ("alerts.secret_title", "Signing secret of", "签名密钥："),
    ("alerts.secret_once", "Shown only now: give it to the receiving system to check the messages' signatures.", "仅显示这一次：请交给接收系统用于校验消息签名。"),
    ("alerts.events", "Sends", "发送"),
    ("alerts.send_test", "Send test message", "发送测试消息"),
    ("alerts.test_msg", "Test message", "测试消息"),
    ("alerts.never", "Nothing sent yet.", "尚未发送任何消息。"),
    ("alerts.delivered", "delivered", "已送达"),
    ("alerts.not_delivered", "not delivered yet", "尚未送达"),
    ("alerts.sending", "sending…", "发送中…"),
    ("alerts.done.test", "A test message is on its way; reload in a few seconds to see whether it arrived.", "测试消息正在发送；几秒后刷新即可看到是否送达。"),
    ("alerts.done.add", "The alert target is added.", "提醒目标已添加。"),
    ("event.task_failed", "ticket failed", "小票打印失败"),
    ("event.task_in_doubt", "ticket in doubt", "小票状态不明"),
    ("event.task_printed", "ticket printed", "小票已打印"),
    ("event.printer_offline", "printer offline", "打印机离线"),
    ("event.printer_online", "printer back online", "打印机恢复在线"),
    ("event.printer_stalled", "printer stuck", "打印机卡住"),
    ("event.printer_paused", "printer stopped (paper, cover)", "打印机暂停（纸张、机盖）"),
    ("event.printer_resumed", "printer going again", "打印机恢复工作"),
    ("event.printer_refused", "printer refused a message", "打印机拒收消息"),
    ("event.agent_offline", "shop computer offline", "门店电脑离线"),
    ("event.offline_rejected", "offline ticket refused", "离线小票被拒"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_setup_text_has_both_languages_and_a_unique_key() {
        let mut seen = std::collections::HashSet::new();
        for (k, en, zh) in TEXTS {
            assert!(!en.is_empty() && !zh.is_empty(), "{k}");
            assert!(seen.insert(*k), "{k} twice");
        }
        for e in onceprint_engine::alerts::EVENT_KINDS {
            assert_ne!(event_words(Lang::En, e), Lang::En.t("setup.kind.unknown"), "{e}");
        }
    }

    #[test]
    fn a_form_becomes_the_apis_transport_object() {
        let f: HashMap<String, String> = [("mac", "00:11:62:AA:BB:CC"), ("poll_interval_s", "5"), ("profile", "")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(
            transport_of("cloudprnt", &f, None),
            json!({"kind": "cloudprnt", "mac": "00:11:62:AA:BB:CC", "poll_interval_s": 5})
        );
        assert_eq!(
            transport_of("mqtt_onceprint", &[("device_id".to_string(), "d1".to_string())].into(), None),
            json!({"kind": "mqtt", "protocol": "onceprint", "device_id": "d1"})
        );
        // Editing a webhook printer with the secret left empty keeps the stored one.
        let stored =
            json!({"kind": "webhook", "url": "http://a", "secret": "0123456789abcdef", "status_url": "http://s"});
        let edit: HashMap<String, String> = [("url", "http://b"), ("secret", ""), ("status_url", "")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(
            transport_of("webhook", &edit, Some(stored)),
            json!({"kind": "webhook", "url": "http://b", "secret": "0123456789abcdef"})
        );
        assert_eq!(
            shown_url("https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=SECRET"),
            "https://qyapi.weixin.qq.com/…"
        );
        assert_eq!(shown_url("http://user:pw@host:8080/x"), "http://host:8080/…");
    }
}
