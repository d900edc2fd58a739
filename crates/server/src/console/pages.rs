//! The console's pages: stores, a store's printers, the attention list with its actions,
//! ticket search, a ticket with its timeline, chain and preview, the day's reconciliation,
//! and operators (managers).
//!
//! Each store page first checks that the operator may see the store (a staff member of
//! store A gets "not found" for store B, exactly as for an unknown store), renders its
//! content, and answers either the whole page or, for the live view's refresh
//! (`X-Console-Fragment: 1`), only what is inside `<main>`.

use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::Form;
use onceprint_core::manual::{original_goes_to, ManualAction, ManualTask};
use onceprint_core::{TaskId, TaskState};
use onceprint_engine::operators::OperatorSpec;
use onceprint_engine::reconcile::reconcile;
use onceprint_engine::tz::{self, Zone};
use onceprint_engine::{ActionRequest, Actor, Creator};
use onceprint_store::{OperatorRole, OriginKind, Printer, StoreRow, Task, TaskQuery};
use serde::Deserialize;

use super::auth::ConsoleUser;
use super::html::{self, age, esc, url_encode, Frame};
use super::i18n::Lang;
use super::ConsoleError;
use crate::error::ApiError;
use crate::AppState;

/// The actions the console offers, in the order it shows them.
pub(super) const ACTIONS: [ManualAction; 4] =
    [ManualAction::MarkPrinted, ManualAction::Reprint, ManualAction::Cancel, ManualAction::Transfer];

pub(super) fn now_ms() -> i64 {
    onceprint_engine::clock::now_ms()
}

pub(super) fn action_key(a: ManualAction) -> &'static str {
    match a {
        ManualAction::MarkPrinted => "action.mark_printed",
        ManualAction::Reprint => "action.reprint",
        ManualAction::Cancel => "action.cancel",
        ManualAction::Transfer => "action.transfer",
    }
}

/// A store the operator may see, with its zone.
pub(super) struct Shop {
    pub(super) row: StoreRow,
    pub(super) zone: Zone,
    /// How many tickets need attention now (at most [`ATTENTION_COUNTED`]), for the badge
    /// on every page of the store.
    pub(super) attention: usize,
}

/// The most tickets the attention badge counts; beyond it the badge says "99+".
const ATTENTION_COUNTED: i64 = 100;

pub(super) async fn shop(st: &AppState, user: &ConsoleUser, store_id: &str) -> Result<Shop, ConsoleError> {
    let not_found = || ConsoleError::Api(ApiError::not_found(format!("no store {store_id:?}")));
    if !user.operator().may_see_store(store_id) {
        return Err(not_found());
    }
    let row = st.store.get_store(&user.operator().tenant_id, store_id).await?.ok_or_else(not_found)?;
    let zone = tz::parse(&row.timezone).unwrap_or_else(|_| Zone::utc());
    let attention = st.store.attention(&row.tenant_id, &row.id, ATTENTION_COUNTED).await?.len();
    Ok(Shop { row, zone, attention })
}

/// A task of the store, or "not found" (another store's task, another tenant's, no task).
pub(super) async fn task_of(
    st: &AppState,
    user: &ConsoleUser,
    shop: &Shop,
    task_id: &str,
) -> Result<Task, ConsoleError> {
    let not_found = || ConsoleError::Api(ApiError::not_found(format!("no task {task_id:?}")));
    let id = TaskId::parse(task_id).ok_or_else(not_found)?;
    match st.store.get_task(&user.operator().tenant_id, id.as_str()).await? {
        Some(t) if t.store_id == shop.row.id => Ok(t),
        _ => Err(not_found()),
    }
}

fn wants_fragment(headers: &HeaderMap) -> bool {
    headers.get("x-console-fragment").is_some_and(|v| v == "1")
}

pub(super) fn here(headers: &HeaderMap, path: &str) -> String {
    // The path as the browser asked for it (with its query), for the language switch.
    headers.get("x-console-here").and_then(|v| v.to_str().ok()).map(str::to_owned).unwrap_or_else(|| path.to_owned())
}

pub(super) struct Render<'a> {
    pub(super) user: &'a ConsoleUser,
    pub(super) shop: Option<&'a Shop>,
    pub(super) title: &'a str,
    pub(super) current: &'a str,
    pub(super) here: String,
    pub(super) live: bool,
}

pub(super) fn render(r: Render<'_>, headers: &HeaderMap, body: &str) -> Response {
    let no_store = [(header::CACHE_CONTROL, "no-store")];
    if wants_fragment(headers) {
        let mut res = (no_store, Html(html::fragment(r.title, body))).into_response();
        if let Some(v) = r.shop.and_then(|s| header::HeaderValue::from_str(&s.attention.to_string()).ok()) {
            res.headers_mut().insert("x-console-attention", v);
        }
        return res;
    }
    let frame = Frame {
        lang: r.user.lang,
        title: r.title,
        here: &r.here,
        csrf: &r.user.session.csrf_token,
        operator_name: &r.user.operator().name,
        store: r.shop.map(|s| (s.row.id.as_str(), s.row.name.as_str())),
        current: r.current,
        is_manager: r.user.operator().role == OperatorRole::Manager,
        live: r.shop.filter(|_| r.live).map(|s| format!("/console/stores/{}/live", url_encode(&s.row.id))),
        attention: r.shop.map(|s| s.attention),
    };
    (no_store, Html(html::page(&frame, body))).into_response()
}

/// Printer names by id: people know their printers by name ("Kitchen left"), not by id.
pub(super) fn printer_names(printers: &[Printer]) -> HashMap<&str, &str> {
    printers.iter().map(|p| (p.id.as_str(), p.name.as_str())).collect()
}

/// The name of printer `id`, or the id of a printer no longer in the list.
pub(super) fn name_of<'a>(names: &HashMap<&str, &'a str>, id: &'a str) -> &'a str {
    names.get(id).copied().unwrap_or(id)
}

/// Lines of a ticket shown in a list, and the characters of each.
const FIRST_LINES: usize = 2;
const LINE_CHARS: usize = 48;

/// The first lines of each ticket as it prints (laid out as text), so that staff can tell
/// "did it come out?" without opening it. Raw ESC/POS has no text to show.
pub(super) async fn first_lines(st: &AppState, tasks: &[Task]) -> Result<HashMap<String, String>, ConsoleError> {
    let ids: Vec<String> = tasks.iter().map(|t| t.task_id.clone()).collect();
    let mut out = HashMap::new();
    for chunk in ids.chunks(500) {
        for (id, content) in st.store.task_contents(chunk).await? {
            let Ok(Some(doc)) = onceprint_render::stored::document_of(&content.content_type, &content.content) else {
                continue;
            };
            let text = onceprint_render::to_text(&doc, &onceprint_render::stored::profile_for(None, Some(&doc)));
            let lines: Vec<String> = text
                .lines()
                .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
                .filter(|l| !l.is_empty() && !l.chars().all(|c| "-=*_ .".contains(c)))
                .take(FIRST_LINES)
                .map(|l| {
                    if l.chars().count() > LINE_CHARS {
                        format!("{}…", l.chars().take(LINE_CHARS).collect::<String>())
                    } else {
                        l
                    }
                })
                .collect();
            if !lines.is_empty() {
                out.insert(id, lines.join("\n"));
            }
        }
    }
    Ok(out)
}

pub(super) fn lines_of(lines: &HashMap<String, String>, task_id: &str) -> String {
    lines.get(task_id).map(|l| format!("<p class=\"lines\">{}</p>", esc(l))).unwrap_or_default()
}

pub(super) fn store_base(shop: &Shop) -> String {
    format!("/console/stores/{}", url_encode(&shop.row.id))
}

pub(super) fn state_badge(lang: Lang, state: TaskState) -> String {
    format!("<span class=\"badge s-{}\">{}</span>", state.as_str(), esc(lang.state(state.as_str())))
}

/// `/console/`: the stores the operator may see (straight to the store when there is one).
pub async fn home(State(st): State<AppState>, user: ConsoleUser, headers: HeaderMap) -> Result<Response, ConsoleError> {
    let lang = user.lang;
    let stores: Vec<StoreRow> = st
        .store
        .list_stores(&user.operator().tenant_id)
        .await?
        .into_iter()
        .filter(|s| user.operator().may_see_store(&s.id))
        .collect();
    if let [only] = stores.as_slice() {
        return Err(ConsoleError::Redirect(format!("/console/stores/{}/", url_encode(&only.id))));
    }
    // Each store with what is wrong there, so that a manager of several shops sees at a
    // glance where to look: tickets needing attention and printers with a problem.
    let printers = st.store.list_printers(&user.operator().tenant_id, None).await?;
    let mut body = String::from("<ul class=\"cards\" id=\"stores\">");
    for s in &stores {
        let attention = st.store.attention(&s.tenant_id, &s.id, ATTENTION_COUNTED).await?.len();
        let bad = printers
            .iter()
            .filter(|p| p.store_id == s.id && p.enabled)
            .filter(|p| p.last_error.is_some() || (!p.online && p.last_seen_at.is_some()))
            .count();
        let mut problems = Vec::new();
        if attention > 0 {
            problems.push(format!("{} {}", html::attention_badge(attention, None), esc(lang.t("stores.attention"))));
        }
        if bad > 0 {
            problems.push(format!("<strong>{bad}</strong> {}", esc(lang.t("stores.printers_bad"))));
        }
        let state = if problems.is_empty() {
            format!("<span class=\"fine\">{}</span>", esc(lang.t("stores.fine")))
        } else {
            problems.join(" · ")
        };
        body.push_str(&format!(
            "<li class=\"card\" data-store=\"{id}\" data-attention=\"{attention}\" data-printers-bad=\"{bad}\">\
             <a href=\"/console/stores/{url}/\">{name}</a> <span class=\"muted\">{id}</span><p class=\"reason\">{state}</p></li>",
            url = url_encode(&s.id),
            name = esc(&s.name),
            id = esc(&s.id),
        ));
    }
    body.push_str("</ul>");
    let r = Render {
        user: &user,
        shop: None,
        title: lang.t("stores.title"),
        current: "stores",
        here: here(&headers, "/console/"),
        live: false,
    };
    Ok(render(r, &headers, &body))
}

fn printer_reason(lang: Lang, p: &Printer) -> String {
    match (&p.last_error, p.online) {
        (Some(e), _) => lang.reason(e),
        (None, false) if p.last_seen_at.is_some() => lang.reason("offline"),
        (None, _) => lang.t("printer.ready").to_owned(),
    }
}

/// A store's printers: online or not, last seen, what is wrong and what to do, the lane.
pub async fn overview(
    State(st): State<AppState>,
    user: ConsoleUser,
    headers: HeaderMap,
    Path(store_id): Path<String>,
) -> Result<Response, ConsoleError> {
    let lang = user.lang;
    let shop = shop(&st, &user, &store_id).await?;
    let tenant = &user.operator().tenant_id;
    let printers = st.store.list_printers(tenant, Some(&shop.row.id)).await?;
    let lanes: HashMap<String, onceprint_store::LaneStats> = st
        .store
        .lane_stats()
        .await?
        .into_iter()
        .filter(|l| &l.tenant_id == tenant && l.store_id == shop.row.id)
        .map(|l| (l.printer_id.clone(), l))
        .collect();
    let now = now_ms();
    let mut body = String::new();
    if printers.is_empty() {
        body.push_str(&format!("<p class=\"empty\">{}</p>", esc(lang.t("printer.none"))));
    }
    body.push_str("<ul class=\"printers\">");
    for p in &printers {
        let (class, word) = if !p.enabled {
            ("disabled", lang.t("printer.disabled"))
        } else if p.online && p.last_error.is_none() {
            ("ok", lang.t("printer.online"))
        } else if p.online {
            ("warn", lang.t("printer.online"))
        } else {
            ("bad", lang.t("printer.offline"))
        };
        let seen = match p.last_seen_at {
            Some(t) => format!("{} ({})", shop.zone.local_time(t), lang.ago(&age(lang, now - t))),
            None => lang.t("printer.never").to_owned(),
        };
        let lane = match lanes.get(&p.id) {
            Some(l) => {
                let oldest = l
                    .oldest_waiting_at
                    .map(|t| format!(", {} {}", esc(lang.t("printer.oldest")), age(lang, now - t)))
                    .unwrap_or_default();
                let flying = if l.in_flight_since.is_some() {
                    format!(", {}", esc(lang.t("printer.in_flight")))
                } else {
                    String::new()
                };
                // A printer whose own state holds its lane says so, with for how long:
                // its tickets wait without spending attempts.
                let paused = p
                    .paused_since
                    .map(|t| format!(", {} {}", esc(lang.t("printer.paused_for")), age(lang, now - t)))
                    .unwrap_or_default();
                format!("{}{oldest}{flying}{paused}", l.waiting)
            }
            None => "0".to_owned(),
        };
        body.push_str(&format!(
            "<li class=\"card printer {class}\" data-printer=\"{id}\">\
             <div class=\"row\"><strong>{name}</strong> <span class=\"dot\" aria-hidden=\"true\"></span>\
             <span class=\"status\" data-status>{word}</span></div>\
             <p class=\"reason\" data-reason>{reason}</p>\
             <dl><dt>{seen_l}</dt><dd>{seen}</dd><dt>{lane_l}</dt><dd data-lane>{lane}</dd></dl></li>",
            id = esc(&p.id),
            name = esc(&p.name),
            word = esc(word),
            reason = esc(&printer_reason(lang, p)),
            seen_l = esc(lang.t("printer.last_seen")),
            seen = esc(&seen),
            lane_l = esc(lang.t("printer.lane")),
        ));
    }
    body.push_str("</ul>");
    let path = format!("{}/", store_base(&shop));
    let r = Render {
        user: &user,
        shop: Some(&shop),
        title: lang.t("overview.title"),
        current: "overview",
        here: here(&headers, &path),
        live: true,
    };
    Ok(render(r, &headers, &body))
}

/// The forms of the actions `task`'s state allows (and no others), each asking for a
/// reason; a reprint may go to another printer of the store, a transfer must.
fn action_forms(lang: Lang, csrf: &str, shop: &Shop, task: &Task, printers: &[Printer], back: &str) -> String {
    let allowed: Vec<ManualAction> = ACTIONS
        .iter()
        .copied()
        .filter(|a| {
            original_goes_to(*a, ManualTask { state: task.state, may_have_printed: task.may_have_printed }).is_ok()
        })
        .collect();
    if allowed.is_empty() {
        return format!("<p class=\"muted\">{}</p>", esc(lang.t("ticket.no_actions")));
    }
    let others: Vec<&Printer> = printers.iter().filter(|p| p.id != task.printer_id && p.enabled).collect();
    let mut out = String::from("<div class=\"actions\">");
    for a in allowed {
        let printer_field = match a {
            ManualAction::Reprint if !others.is_empty() => {
                let mut sel = format!(
                    "<label>{}<select name=\"printer_id\"><option value=\"\">{} ({})</option>",
                    esc(lang.t("action.on_printer")),
                    esc(lang.t("action.same_printer")),
                    esc(printers
                        .iter()
                        .find(|p| p.id == task.printer_id)
                        .map_or(task.printer_id.as_str(), |p| &p.name))
                );
                for p in &others {
                    sel.push_str(&format!("<option value=\"{}\">{}</option>", esc(&p.id), esc(&p.name)));
                }
                sel.push_str("</select></label>");
                sel
            }
            ManualAction::Transfer => {
                if others.is_empty() {
                    continue;
                }
                let mut sel =
                    format!("<label>{}<select name=\"printer_id\" required>", esc(lang.t("action.on_printer")));
                for p in &others {
                    sel.push_str(&format!("<option value=\"{}\">{}</option>", esc(&p.id), esc(&p.name)));
                }
                sel.push_str("</select></label>");
                sel
            }
            _ => String::new(),
        };
        out.push_str(&format!(
            "<details class=\"action\" data-action=\"{name}\"><summary>{label}</summary>\
             <form method=\"post\" action=\"{base}/tickets/{task}/{name}\">\
             <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\"><input type=\"hidden\" name=\"back\" value=\"{back}\">\
             <label>{reason_l}<input name=\"reason\" required maxlength=\"500\" autocomplete=\"off\"></label>{printer_field}\
             <button type=\"submit\">{confirm}</button></form></details>",
            name = a.as_str(),
            label = esc(lang.t(action_key(a))),
            base = store_base(shop),
            task = esc(&task.task_id),
            csrf = esc(csrf),
            back = esc(back),
            reason_l = esc(lang.t("action.reason")),
            confirm = esc(lang.t("action.confirm")),
        ));
    }
    out.push_str("</div>");
    out
}

/// Failed and in-doubt tickets, oldest first, with their reasons, ages and actions.
pub async fn attention(
    State(st): State<AppState>,
    user: ConsoleUser,
    headers: HeaderMap,
    Path(store_id): Path<String>,
) -> Result<Response, ConsoleError> {
    let lang = user.lang;
    let shop = shop(&st, &user, &store_id).await?;
    let tenant = &user.operator().tenant_id;
    let tasks = st.store.attention(tenant, &shop.row.id, 200).await?;
    let printers = st.store.list_printers(tenant, Some(&shop.row.id)).await?;
    let names = printer_names(&printers);
    let lines = first_lines(&st, &tasks).await?;
    let now = now_ms();
    let path = format!("{}/attention", store_base(&shop));
    let mut body = String::new();
    if tasks.is_empty() {
        body.push_str(&format!(
            "<p class=\"empty fine\" id=\"attention-empty\">{}</p>",
            esc(lang.t("attention.empty"))
        ));
    }
    body.push_str("<ul class=\"tickets\" id=\"attention\">");
    for t in &tasks {
        let reason = t.last_error.as_deref().map(|e| lang.reason(e)).unwrap_or_default();
        body.push_str(&format!(
            "<li class=\"card ticket\" data-task=\"{id}\" data-state=\"{state}\">\
             <div class=\"row\"><a href=\"{base}/tickets/{id}\"><strong>{biz}</strong></a> {badge}\
             <span class=\"muted\">{printer} · {for_l} {age}</span></div>{lines}<p class=\"reason\">{reason}</p>{forms}</li>",
            id = esc(&t.task_id),
            state = t.state.as_str(),
            base = store_base(&shop),
            biz = esc(&t.biz_no),
            badge = state_badge(lang, t.state),
            printer = esc(name_of(&names, &t.printer_id)),
            lines = lines_of(&lines, &t.task_id),
            for_l = esc(lang.t("attention.age")),
            age = age(lang, now - t.updated_at),
            reason = esc(&reason),
            forms = action_forms(lang, &user.session.csrf_token, &shop, t, &printers, &path),
        ));
    }
    body.push_str("</ul>");
    let r = Render {
        user: &user,
        shop: Some(&shop),
        title: lang.t("attention.title"),
        current: "attention",
        here: here(&headers, &path),
        live: true,
    };
    Ok(render(r, &headers, &body))
}

/// The tickets among `tasks` whose business number or printed text contains `text`,
/// ignoring case. The text is the stored content read as UTF-8 (plain text, or the markup
/// document with its strings), fetched in batches.
pub(super) async fn containing(st: &AppState, tasks: Vec<Task>, text: &str) -> Result<Vec<Task>, ConsoleError> {
    let needle = text.to_lowercase();
    let mut by_text = std::collections::HashSet::new();
    let ids: Vec<String> = tasks.iter().map(|t| t.task_id.clone()).collect();
    for chunk in ids.chunks(500) {
        for (id, content) in st.store.task_contents(chunk).await? {
            if String::from_utf8_lossy(&content.content).to_lowercase().contains(&needle) {
                by_text.insert(id);
            }
        }
    }
    Ok(tasks
        .into_iter()
        .filter(|t| t.biz_no.to_lowercase().contains(&needle) || by_text.contains(&t.task_id))
        .collect())
}

/// The chain a ticket belongs to: the original and every reprint, transfer and failover
/// hanging on it (they share the business number), in creation order.
async fn chain_of(st: &AppState, task: &Task) -> Result<Vec<Task>, ConsoleError> {
    let same = st
        .store
        .list_tasks(&TaskQuery {
            tenant_id: task.tenant_id.clone(),
            store_id: Some(task.store_id.clone()),
            state: None,
            biz_no: Some(task.biz_no.clone()),
            biz_no_prefix: None,
            limit: 200,
            ..Default::default()
        })
        .await?;
    let by_id: HashMap<&str, &Task> = same.iter().map(|t| (t.task_id.as_str(), t)).collect();
    let root_of = |t: &Task| -> String {
        let mut cur = t;
        // Chains are as long as the moves made; the bound guards against a cycle only.
        for _ in 0..64 {
            match cur.origin_task_id.as_deref().and_then(|o| by_id.get(o)) {
                Some(parent) => cur = parent,
                None => break,
            }
        }
        cur.task_id.clone()
    };
    let root = root_of(task);
    let mut chain: Vec<Task> = same.iter().filter(|t| root_of(t) == root).cloned().collect();
    chain.sort_by(|a, b| a.task_id.cmp(&b.task_id));
    Ok(chain)
}

/// One ticket: its facts, the audit trail as a timeline, its chain, its preview, and the
/// actions its state allows.
pub async fn ticket(
    State(st): State<AppState>,
    user: ConsoleUser,
    headers: HeaderMap,
    Path((store_id, task_id)): Path<(String, String)>,
) -> Result<Response, ConsoleError> {
    let lang = user.lang;
    let shop = shop(&st, &user, &store_id).await?;
    let task = task_of(&st, &user, &shop, &task_id).await?;
    let tenant = &user.operator().tenant_id;
    let events = st.store.task_events(tenant, &task.task_id).await?.unwrap_or_default();
    let printers = st.store.list_printers(tenant, Some(&shop.row.id)).await?;
    let chain = chain_of(&st, &task).await?;
    let names = printer_names(&printers);
    let base = store_base(&shop);
    let path = format!("{base}/tickets/{}", url_encode(&task.task_id));
    let z = &shop.zone;
    let mut body = format!(
        "<section class=\"card facts\"><dl>\
         <dt>{biz_l}</dt><dd id=\"biz\">{biz}</dd><dt>{state_l}</dt><dd id=\"ticket-state\" data-state=\"{state}\">{badge}</dd>\
         <dt>{printer_l}</dt><dd>{printer}</dd><dt>{type_l}</dt><dd>{ptype}</dd>\
         <dt>{att_l}</dt><dd>{attempts}</dd><dt>{created_l}</dt><dd>{created}</dd><dt>{updated_l}</dt><dd>{updated}</dd>",
        biz_l = esc(lang.t("ticket.biz_no")),
        biz = esc(&task.biz_no),
        state_l = esc(lang.t("ticket.state")),
        state = task.state.as_str(),
        badge = state_badge(lang, task.state),
        printer_l = esc(lang.t("ticket.printer")),
        printer = esc(name_of(&names, &task.printer_id)),
        type_l = esc(lang.t("ticket.type")),
        ptype = esc(&task.print_type),
        att_l = esc(lang.t("ticket.attempts")),
        attempts = task.attempts,
        created_l = esc(lang.t("ticket.created")),
        created = esc(&z.local_time(task.created_at)),
        updated_l = esc(lang.t("ticket.updated")),
        updated = esc(&z.local_time(task.updated_at)),
    );
    if let Some(p) = task.printed_at {
        body.push_str(&format!("<dt>{}</dt><dd>{}</dd>", esc(lang.t("ticket.printed_at")), esc(&z.local_time(p))));
    }
    if let Some(e) = &task.last_error {
        body.push_str(&format!("<dt>{}</dt><dd>{}</dd>", esc(lang.t("ticket.reason")), esc(&lang.reason(e))));
    }
    body.push_str(&format!("</dl><p class=\"muted\">{} {}</p></section>", esc(lang.t("time.store")), esc(z.name())));
    body.push_str(&format!(
        "<section class=\"card\"><h2>{}</h2>{}</section>",
        esc(lang.t("ticket.actions")),
        action_forms(lang, &user.session.csrf_token, &shop, &task, &printers, &path)
    ));
    body.push_str(&format!(
        "<section class=\"card\"><h2>{}</h2><ol class=\"chain\" id=\"chain\">",
        esc(lang.t("ticket.chain"))
    ));
    for t in &chain {
        let kind = match (t.origin_kind, t.reprint_no) {
            (Some(OriginKind::Reprint), Some(n)) => format!("{} {n}", lang.t("chain.reprint")),
            (Some(OriginKind::Reprint), None) => lang.t("chain.reprint").to_owned(),
            (Some(OriginKind::Transfer), _) => lang.t("chain.transfer").to_owned(),
            (Some(OriginKind::Failover), _) => lang.t("chain.failover").to_owned(),
            (None, _) => lang.t("chain.original").to_owned(),
        };
        let this = if t.task_id == task.task_id {
            format!(" <em>({})</em>", esc(lang.t("chain.this")))
        } else {
            String::new()
        };
        body.push_str(&format!(
            "<li data-task=\"{id}\" data-kind=\"{kind_attr}\"><a href=\"{base}/tickets/{id}\">{kind}</a> {badge} \
             <span class=\"muted\">{printer} · {at}</span>{this}</li>",
            id = esc(&t.task_id),
            kind_attr = t.origin_kind.map_or("original", |k| k.as_str()),
            kind = esc(&kind),
            badge = state_badge(lang, t.state),
            printer = esc(name_of(&names, &t.printer_id)),
            at = esc(&z.local_time(t.created_at)),
        ));
    }
    body.push_str("</ol></section>");
    body.push_str(&format!(
        "<section class=\"card\"><h2>{}</h2><ol class=\"timeline\" id=\"timeline\">",
        esc(lang.t("ticket.timeline"))
    ));
    for e in &events {
        let plain = lang.event(e);
        let note = plain.note.map(|n| format!("<p class=\"note\">{}</p>", esc(&n))).unwrap_or_default();
        body.push_str(&format!(
            "<li data-to=\"{to_attr}\"><time>{at}</time> {badge} <span class=\"actor\">{who}</span>\
             <p>{what}</p>{note}</li>",
            to_attr = e.to.as_str(),
            at = esc(&z.local_time(e.at)),
            badge = state_badge(lang, e.to),
            who = esc(&plain.who),
            what = esc(&plain.what),
        ));
    }
    body.push_str("</ol></section>");
    body.push_str(&format!(
        "<section class=\"card\"><h2>{}</h2><img class=\"preview\" id=\"preview\" src=\"{path}/preview.png\" alt=\"{}\" \
         loading=\"lazy\" width=\"288\"></section>",
        esc(lang.t("ticket.preview")),
        esc(lang.t("ticket.preview_alt")),
    ));
    let title = format!("{} {}", lang.t("ticket"), task.biz_no);
    let r = Render {
        user: &user,
        shop: Some(&shop),
        title: &title,
        current: "tickets",
        here: here(&headers, &path),
        live: false,
    };
    Ok(render(r, &headers, &body))
}

/// The ticket's preview image.
pub async fn preview(
    State(st): State<AppState>,
    user: ConsoleUser,
    Path((store_id, task_id)): Path<(String, String)>,
) -> Result<Response, ConsoleError> {
    let shop = shop(&st, &user, &store_id).await?;
    let task = task_of(&st, &user, &shop, &task_id).await?;
    let png = crate::routes::render::task_png(&st, &task).await?;
    Ok(([(header::CONTENT_TYPE, "image/png"), (header::CACHE_CONTROL, "private, max-age=60")], png).into_response())
}

#[derive(Debug, Deserialize)]
pub struct ActForm {
    #[serde(default)]
    pub csrf: String,
    #[serde(default)]
    pub reason: String,
    pub printer_id: Option<String>,
    pub back: Option<String>,
}

/// A manual action from a console form, recorded as the logged-in operator.
///
/// When the session ended before the form came (expired, logged out elsewhere, revoked),
/// the login sends the browser back to the page the form was on (its `back` field, a page
/// of the same store), never to the action's URL, which only takes POST; the login page
/// says that the action was not done.
pub async fn act(
    State(st): State<AppState>,
    user: Result<ConsoleUser, ConsoleError>,
    Path((store_id, task_id, action)): Path<(String, String, String)>,
    Form(f): Form<ActForm>,
) -> Result<Response, ConsoleError> {
    let user = match user {
        Ok(user) => user,
        Err(ConsoleError::Redirect(to)) => {
            let store_prefix = format!("/console/stores/{}/", url_encode(&store_id));
            let back = f.back.as_deref().filter(|b| b.starts_with(&store_prefix));
            return Err(ConsoleError::Redirect(match back {
                Some(b) => super::auth::login_target(b, true, true),
                None => to,
            }));
        }
        Err(e) => return Err(e),
    };
    user.check_csrf(&f.csrf)?;
    let shop = shop(&st, &user, &store_id).await?;
    let task = task_of(&st, &user, &shop, &task_id).await?;
    let action = ACTIONS
        .into_iter()
        .find(|a| a.as_str() == action)
        .ok_or_else(|| ApiError::not_found(format!("no action {action:?}")))?;
    st.operations
        .act(
            action,
            ActionRequest {
                tenant_id: user.operator().tenant_id.clone(),
                task_id: task.task_id.clone(),
                actor: Actor::Operator(user.operator().id.clone()),
                reason: f.reason,
                printer_id: f.printer_id.filter(|p| !p.is_empty()),
            },
        )
        .await?;
    let base = store_base(&shop);
    let back = f
        .back
        .filter(|b| b.starts_with(&format!("{base}/")) && !b.contains("//"))
        .unwrap_or_else(|| format!("{base}/tickets/{}", url_encode(&task.task_id)));
    Err(ConsoleError::Redirect(back))
}

/// An action's URL opened as a page (a bookmark, a link shared, an old history entry): the
/// action takes only POST, so the browser is sent to the ticket instead of an error.
pub async fn action_by_get(
    _user: ConsoleUser,
    Path((store_id, task_id, _action)): Path<(String, String, String)>,
) -> ConsoleError {
    ConsoleError::Redirect(format!("/console/stores/{}/tickets/{}", url_encode(&store_id), url_encode(&task_id)))
}

#[derive(Debug, Deserialize)]
pub struct DayQuery {
    pub date: Option<String>,
}

async fn day_report(
    st: &AppState,
    user: &ConsoleUser,
    shop: &Shop,
    date: &str,
) -> Result<onceprint_engine::reconcile::Report, ConsoleError> {
    reconcile(st.store.as_ref(), &user.operator().tenant_id, &shop.row.id, date, None)
        .await
        .map_err(|e| ConsoleError::Api(crate::routes::reconcile::map_err(e)))
}

/// The store's day: counts, charges and refunds, differences, and the CSV download.
pub async fn reconciliation(
    State(st): State<AppState>,
    user: ConsoleUser,
    headers: HeaderMap,
    Path(store_id): Path<String>,
    Query(q): Query<DayQuery>,
) -> Result<Response, ConsoleError> {
    let lang = user.lang;
    let shop = shop(&st, &user, &store_id).await?;
    let date = q.date.filter(|d| !d.is_empty()).unwrap_or_else(|| shop.zone.local_date(now_ms()));
    let r = day_report(&st, &user, &shop, &date).await?;
    let base = store_base(&shop);
    let mut body = format!(
        "<form class=\"search card\" method=\"get\"><label>{day_l}<input type=\"date\" name=\"date\" id=\"date\" \
         value=\"{date}\" required></label><button type=\"submit\">{show}</button>\
         <a class=\"button\" id=\"csv\" href=\"{base}/reconciliation.csv?date={date_q}\" download>{csv}</a></form>\
         <p class=\"muted\">{tz_l}: {tz}</p>",
        day_l = esc(lang.t("tickets.day")),
        date = esc(&date),
        show = esc(lang.t("recon.show")),
        date_q = url_encode(&date),
        csv = esc(lang.t("recon.csv")),
        tz_l = esc(lang.t("recon.timezone")),
        tz = esc(&r.timezone),
    );
    let c = &r.counts;
    body.push_str(&format!(
        "<section class=\"card\"><h2>{}</h2><dl class=\"grid\" id=\"counts\">",
        esc(lang.t("recon.counts"))
    ));
    for (state, n) in [
        ("printed", c.printed),
        ("failed", c.failed),
        ("in_doubt", c.in_doubt),
        ("transferred", c.transferred),
        ("cancelled", c.cancelled),
        ("closed", c.closed),
    ] {
        body.push_str(&format!("<dt>{}</dt><dd data-count=\"{state}\">{n}</dd>", esc(lang.state(state))));
    }
    // Tickets still waiting, being sent or due for a retry: without them the counts
    // above would not add up to "submitted" during the day.
    body.push_str(&format!("<dt>{}</dt><dd data-count=\"open\">{}</dd>", esc(lang.t("recon.open")), c.open));
    body.push_str(&format!(
        "<dt>{}</dt><dd data-count=\"reprinted\">{}</dd><dt>{}</dt><dd data-count=\"submitted\">{}</dd></dl></section>",
        esc(lang.t("chain.reprint")),
        c.reprinted,
        esc(lang.t("recon.submitted")),
        c.submitted
    ));
    body.push_str(&super::day::pictures(&st, &shop, lang, &r.date).await?);
    let l = &r.ledger;
    body.push_str(&format!(
        "<section class=\"card\"><h2>{}</h2><dl class=\"grid\"><dt>{}</dt><dd>{} ({})</dd><dt>{}</dt><dd>{} ({})</dd></dl></section>",
        esc(lang.t("recon.ledger")),
        esc(lang.t("recon.charges")),
        l.charges,
        l.charged_amount,
        esc(lang.t("recon.refunds")),
        l.refunds,
        l.refunded_amount
    ));
    body.push_str(&format!("<section class=\"card\" id=\"differences\"><h2>{}</h2>", esc(lang.t("recon.differences"))));
    if !r.has_differences() {
        body.push_str(&format!("<p class=\"fine\">{}</p>", esc(lang.t("recon.no_differences"))));
    }
    for (key, list) in [
        ("recon.twice", &r.printed_more_than_once),
        ("recon.expected_not_printed", &r.expected_not_printed),
        ("recon.printed_not_expected", &r.printed_not_expected),
    ] {
        if list.is_empty() {
            continue;
        }
        body.push_str(&format!("<h3>{}</h3><ul>", esc(lang.t(key))));
        for b in list {
            body.push_str(&format!("<li>{}</li>", esc(b)));
        }
        body.push_str("</ul>");
    }
    // The device log: one line per task, with what each side says.
    for (key, list) in [
        ("recon.device_printed_broker_not", &r.device_printed_broker_not),
        ("recon.broker_printed_device_not", &r.broker_printed_device_not),
    ] {
        if list.is_empty() {
            continue;
        }
        body.push_str(&format!("<h3>{}</h3><ul>", esc(lang.t(key))));
        for d in list {
            body.push_str(&format!(
                "<li><code>{}</code> {} · {} · {} / {}</li>",
                esc(&d.task_id),
                esc(&d.key),
                esc(&d.printer_id),
                esc(d.device_state.as_deref().unwrap_or("–")),
                esc(d.broker_state.as_deref().unwrap_or("–"))
            ));
        }
        body.push_str("</ul>");
    }
    if r.device_log == onceprint_engine::reconcile::DeviceLogPresence::None {
        body.push_str(&format!("<p class=\"fine\">{}</p>", esc(lang.t("recon.no_device_log"))));
    }
    body.push_str("</section>");
    let path = format!("{base}/reconciliation?date={}", url_encode(&date));
    let rr = Render {
        user: &user,
        shop: Some(&shop),
        title: lang.t("recon.title"),
        current: "reconciliation",
        here: here(&headers, &path),
        live: false,
    };
    Ok(render(rr, &headers, &body))
}

/// The day as CSV (the API's format), as a download.
pub async fn reconciliation_csv(
    State(st): State<AppState>,
    user: ConsoleUser,
    Path(store_id): Path<String>,
    Query(q): Query<DayQuery>,
) -> Result<Response, ConsoleError> {
    let shop = shop(&st, &user, &store_id).await?;
    let date = q.date.filter(|d| !d.is_empty()).unwrap_or_else(|| shop.zone.local_date(now_ms()));
    let r = day_report(&st, &user, &shop, &date).await?;
    let name = format!("attachment; filename=\"reconciliation-{}-{}.csv\"", shop.row.id, r.date);
    Ok((
        [(header::CONTENT_TYPE, "text/csv; charset=utf-8".to_owned()), (header::CONTENT_DISPOSITION, name)],
        crate::routes::reconcile::report_csv(&r),
    )
        .into_response())
}

/// The account actions of the operators page: the path word, the label, the note after it,
/// and whether it first opens (a `details`) so that one tap does not do it.
const OPERATOR_ACTIONS: &[(&str, &str, &str, bool)] = &[
    ("sign-out", "operators.sign_out", "operators.done.sign_out", true),
    ("disable", "operators.disable", "operators.done.disable", true),
    ("enable", "operators.enable", "operators.done.enable", false),
    ("unlock", "operators.unlock", "operators.done.unlock", false),
    ("password", "operators.set_password", "operators.done.password", true),
];

/// One operator's card: who, their state (disabled, locked out), and the actions a manager
/// has on the account.
fn operator_card(
    lang: Lang,
    csrf: &str,
    me: &str,
    o: &onceprint_store::Operator,
    lock: Option<&onceprint_engine::operators::Lockout>,
) -> String {
    let role = if o.role == OperatorRole::Manager { lang.t("role.manager") } else { lang.t("role.staff") };
    let mut card = format!(
        "<li class=\"card\" data-operator=\"{id}\"><strong>{name}</strong> <span class=\"muted\">{id} · {role} {stores}</span>",
        id = esc(&o.id),
        name = esc(&o.name),
        role = esc(role),
        stores = esc(&o.store_ids.join(", ")),
    );
    let is_me = o.id == me;
    if is_me {
        card.push_str(&format!(" <span class=\"badge\">{}</span>", esc(lang.t("operators.you"))));
    }
    if o.disabled_at.is_some() {
        card.push_str(&format!(
            " <span class=\"badge s-failed\" data-state=\"disabled\">{}</span>",
            esc(lang.t("operators.disabled"))
        ));
    }
    if let Some(l) = lock {
        let left_s = u64::try_from((l.until - now_ms()).max(1000)).unwrap_or(1000).div_ceil(1000);
        card.push_str(&format!(
            " <span class=\"badge s-pending\" data-state=\"locked\">{} {}</span>",
            esc(lang.t("operators.locked")),
            esc(&html::wait(lang, left_s))
        ));
    }
    card.push_str("<div class=\"actions\">");
    for (action, label, _, confirm) in OPERATOR_ACTIONS {
        let shown = match *action {
            "disable" => o.disabled_at.is_none() && !is_me,
            "enable" => o.disabled_at.is_some(),
            "unlock" => lock.is_some(),
            "sign-out" => o.disabled_at.is_none(),
            _ => true,
        };
        if !shown {
            continue;
        }
        let password = if *action == "password" {
            format!(
                "<label>{}<input name=\"password\" type=\"password\" required minlength=\"10\" maxlength=\"256\" \
                 autocomplete=\"new-password\"></label>",
                esc(lang.t("operators.new_password"))
            )
        } else {
            String::new()
        };
        let form = format!(
            "<form method=\"post\" action=\"/console/operators/{id}/{action}\">\
             <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">{password}<button type=\"submit\">{label}</button></form>",
            id = url_encode(&o.id),
            csrf = esc(csrf),
            label = esc(lang.t(label)),
        );
        if *confirm {
            card.push_str(&format!(
                "<details class=\"action\" data-action=\"{action}\"><summary>{}</summary>{form}</details>",
                esc(lang.t(label))
            ));
        } else {
            card.push_str(&format!("<div data-action=\"{action}\">{form}</div>"));
        }
    }
    card.push_str("</div></li>");
    card
}

#[allow(clippy::too_many_arguments)]
fn operators_body(
    st: &AppState,
    lang: Lang,
    csrf: &str,
    me: &str,
    list: &[onceprint_store::Operator],
    stores: &[StoreRow],
    note: Option<&str>,
) -> String {
    let mut body = String::new();
    if let Some(n) = note {
        body.push_str(&format!("<p class=\"alert\" role=\"status\">{}</p>", esc(n)));
    }
    body.push_str("<ul class=\"cards\" id=\"operators\">");
    for o in list {
        let lock = st.operators.lockout(&o.tenant_id, &o.id);
        body.push_str(&operator_card(lang, csrf, me, o, lock.as_ref()));
    }
    body.push_str("</ul>");
    body.push_str(&format!(
        "<section class=\"card\"><h2>{title}</h2><form method=\"post\" action=\"/console/operators\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
         <label>{id_l}<input name=\"id\" required maxlength=\"64\" autocomplete=\"off\"></label>\
         <label>{name_l}<input name=\"name\" maxlength=\"200\"></label>\
         <label>{role_l}<select name=\"role\"><option value=\"staff\">{staff}</option><option value=\"manager\">{manager}</option></select></label>\
         <fieldset><legend>{stores_l}</legend>",
        title = esc(lang.t("operators.create")),
        csrf = esc(csrf),
        id_l = esc(lang.t("operators.id")),
        name_l = esc(lang.t("operators.name")),
        role_l = esc(lang.t("operators.role")),
        staff = esc(lang.t("role.staff")),
        manager = esc(lang.t("role.manager")),
        stores_l = esc(lang.t("operators.stores")),
    ));
    for s in stores {
        body.push_str(&format!(
            "<label class=\"check\"><input type=\"checkbox\" name=\"store\" value=\"{}\"> {}</label>",
            esc(&s.id),
            esc(&s.name)
        ));
    }
    body.push_str(&format!(
        "</fieldset><label>{pw}<input name=\"password\" type=\"password\" required minlength=\"10\" autocomplete=\"new-password\"></label>\
         <button type=\"submit\">{create}</button></form></section>",
        pw = esc(lang.t("operators.password")),
        create = esc(lang.t("operators.create")),
    ));
    body
}

fn manager_only(user: &ConsoleUser) -> Result<(), ConsoleError> {
    if user.operator().role == OperatorRole::Manager {
        Ok(())
    } else {
        Err(ConsoleError::Api(ApiError::forbidden("only a manager manages operators")))
    }
}

/// After an account action: which note the operators page shows.
#[derive(Debug, Deserialize)]
pub struct OperatorsQuery {
    done: Option<String>,
}

/// The tenant's operators (managers only).
pub async fn operators(
    State(st): State<AppState>,
    user: ConsoleUser,
    headers: HeaderMap,
    Query(q): Query<OperatorsQuery>,
) -> Result<Response, ConsoleError> {
    manager_only(&user)?;
    let lang = user.lang;
    let tenant = &user.operator().tenant_id;
    let list = st.operators.list(tenant).await?;
    let stores = st.store.list_stores(tenant).await?;
    // Only the notes of known actions: the query cannot put words on the page.
    let note = q.done.and_then(|d| OPERATOR_ACTIONS.iter().find(|(a, ..)| *a == d)).map(|(_, _, done, _)| lang.t(done));
    let body = operators_body(&st, lang, &user.session.csrf_token, &user.operator().id, &list, &stores, note);
    let r = Render {
        user: &user,
        shop: None,
        title: lang.t("operators.title"),
        current: "operators",
        here: here(&headers, "/console/operators"),
        live: false,
    };
    Ok(render(r, &headers, &body))
}

/// An account action from the operators page (a manager): sign out everywhere, disable,
/// enable, unlock, or a new password. Answers with a redirect to the page with a note, so
/// that reloading it does not do the action again.
pub async fn operator_action(
    State(st): State<AppState>,
    user: ConsoleUser,
    Path((id, action)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Result<Response, ConsoleError> {
    let fields: HashMap<String, String> = form_pairs(&body).into_iter().collect();
    user.check_csrf(fields.get("csrf").map_or("", String::as_str))?;
    manager_only(&user)?;
    let by = Creator::Manager(user.operator());
    match action.as_str() {
        "sign-out" => {
            st.operators.revoke_sessions(by, &id).await?;
        }
        "disable" => {
            st.operators.set_enabled(by, &id, false).await?;
        }
        "enable" => {
            st.operators.set_enabled(by, &id, true).await?;
        }
        "unlock" => {
            st.operators.unlock(by, &id).await?;
        }
        "password" => {
            let password = fields.get("password").cloned().unwrap_or_default();
            st.operators.set_password(by, &id, password).await?;
        }
        _ => return Err(ConsoleError::Api(ApiError::not_found(format!("no operator action {action:?}")))),
    }
    // Signing oneself out everywhere ends this session too: the login page follows.
    Err(ConsoleError::Redirect(format!("/console/operators?done={action}")))
}

/// Creates an operator from the console's form (a manager).
pub async fn create_operator(
    State(st): State<AppState>,
    user: ConsoleUser,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ConsoleError> {
    // Several `store` fields (checkboxes) are read by hand: a struct cannot collect them.
    let mut fields: HashMap<String, String> = HashMap::new();
    let mut stores: Vec<String> = Vec::new();
    for (k, v) in form_pairs(&body) {
        if k == "store" {
            stores.push(v);
        } else {
            fields.insert(k, v);
        }
    }
    user.check_csrf(fields.get("csrf").map_or("", String::as_str))?;
    manager_only(&user)?;
    let role = fields.get("role").cloned().unwrap_or_default();
    let spec = OperatorSpec {
        id: fields.get("id").cloned().unwrap_or_default(),
        name: fields.get("name").cloned().filter(|n| !n.trim().is_empty()),
        stores: if role == "manager" { Vec::new() } else { stores },
        role,
        password: fields.get("password").cloned().unwrap_or_default(),
    };
    st.operators.create(Creator::Manager(user.operator()), spec).await?;
    let lang = user.lang;
    let tenant = &user.operator().tenant_id;
    let list = st.operators.list(tenant).await?;
    let all = st.store.list_stores(tenant).await?;
    let me = &user.operator().id;
    let page = operators_body(&st, lang, &user.session.csrf_token, me, &list, &all, Some(lang.t("operators.created")));
    let r = Render {
        user: &user,
        shop: None,
        title: lang.t("operators.title"),
        current: "operators",
        here: "/console/operators".into(),
        live: false,
    };
    let mut res = render(r, &headers, &page);
    *res.status_mut() = StatusCode::CREATED;
    Ok(res)
}

/// `application/x-www-form-urlencoded` pairs, decoded.
pub(super) fn form_pairs(body: &[u8]) -> Vec<(String, String)> {
    let decode = |s: &str| -> String {
        let bytes = s.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'+' => out.push(b' '),
                b'%' if i + 2 < bytes.len() => {
                    match u8::from_str_radix(std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("zz"), 16) {
                        Ok(b) => {
                            out.push(b);
                            i += 2;
                        }
                        Err(_) => out.push(b'%'),
                    }
                }
                b => out.push(b),
            }
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    };
    std::str::from_utf8(body)
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (decode(k), decode(v)),
            None => (decode(p), String::new()),
        })
        .collect()
}

/// Any other console path: "not found", after the login check like every page.
pub async fn not_found(_user: ConsoleUser) -> ConsoleError {
    ConsoleError::Api(ApiError::not_found("no such console page"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_bodies_decode_repeated_fields_and_escapes() {
        let pairs = form_pairs(b"id=amy&store=s1&store=s%202&name=A+B%E4%B8%AD&bad=%zz&end=%4");
        assert_eq!(
            pairs,
            vec![
                ("id".into(), "amy".into()),
                ("store".into(), "s1".into()),
                ("store".into(), "s 2".into()),
                ("name".into(), "A B中".into()),
                ("bad".into(), "%zz".into()),
                ("end".into(), "%4".into()),
            ]
        );
    }
}
