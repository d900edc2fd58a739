//! Bulk actions from the tickets page: the ticked tickets reprinted (each a numbered copy
//! with the REPRINT banner, on its own printer or one picked for all) or marked printed,
//! with one reason typed for all of them.
//!
//! There is no bulk mechanism underneath: each ticket goes, one after the other, through
//! exactly what the single-ticket action does — the store check (`task_of`), the rule of
//! `core::manual` and the engine's action (`engine::Operations::act`), audited as the
//! operator with the reason. A ticket that is refused (its state moved on, the printer is
//! disabled, it is not a ticket of the store) leaves the others alone; the page the
//! browser is sent back to says how many were done and, for each refused ticket, why.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::Response;
use onceprint_core::manual::ManualAction;
use onceprint_core::TaskId;
use onceprint_engine::{ActionRequest, Actor};
use onceprint_store::Printer;

use super::auth::ConsoleUser;
use super::html::{esc, url_encode};
use super::i18n::Lang;
use super::pages::{form_pairs, shop, state_badge, task_of};
use super::tickets::{tasks_named, TicketSearch, PAGE};
use super::ConsoleError;
use crate::error::ApiError;
use crate::AppState;

/// The actions offered in bulk, in the order of their buttons. Cancel and transfer are
/// left to the ticket's own page: they end a ticket without paper, one at a time.
pub const ACTIONS: [ManualAction; 2] = [ManualAction::Reprint, ManualAction::MarkPrinted];

/// Why a ticket was refused, as a word of the result page's address. Only these words
/// are read back, so the address cannot put text of its own on the page.
const WHY: [(&str, &str); 5] = [
    ("state", "bulk.why.state"),
    ("printer", "bulk.why.printer"),
    ("unknown", "bulk.why.unknown"),
    ("reason", "bulk.why.reason"),
    ("other", "bulk.why.other"),
];

fn why_of(e: &ApiError) -> &'static str {
    match e.code {
        "invalid_transition" => "state",
        "printer_disabled" => "printer",
        "not_found" => "unknown",
        "invalid_request" => "reason",
        _ => "other",
    }
}

fn label_key(a: ManualAction) -> &'static str {
    match a {
        ManualAction::MarkPrinted => "bulk.mark_printed",
        _ => "bulk.reprint",
    }
}

/// The controls under the list: the reason (once, for all), the printer a reprint goes
/// to, and one button per action.
pub fn controls(lang: Lang, printers: &[Printer]) -> String {
    let mut out = format!(
        "<fieldset class=\"card bulk\" id=\"bulk-controls\"><legend>{legend}</legend>\
         <label>{reason_l}<input name=\"reason\" id=\"bulk-reason\" required maxlength=\"500\" autocomplete=\"off\"></label>\
         <label>{printer_l}<select name=\"printer_id\" id=\"bulk-printer\"><option value=\"\">{own}</option>",
        legend = esc(lang.t("bulk.title")),
        reason_l = esc(lang.t("bulk.reason")),
        printer_l = esc(lang.t("bulk.printer")),
        own = esc(lang.t("bulk.own_printer")),
    );
    for p in printers.iter().filter(|p| p.enabled) {
        out.push_str(&format!("<option value=\"{}\">{}</option>", esc(&p.id), esc(&p.name)));
    }
    out.push_str("</select></label><div class=\"actions\">");
    for a in ACTIONS {
        out.push_str(&format!(
            "<button type=\"submit\" name=\"action\" value=\"{name}\" id=\"bulk-{name}\">{label}</button>",
            name = a.as_str(),
            label = esc(lang.t(label_key(a))),
        ));
    }
    out.push_str("</div></fieldset>");
    out
}

/// Does the ticked tickets' action, one ticket at a time through the single-ticket
/// action, then sends the browser back to the list it came from with the result.
pub async fn bulk(
    State(st): State<AppState>,
    user: Result<ConsoleUser, ConsoleError>,
    Path(store_id): Path<String>,
    body: Bytes,
) -> Result<Response, ConsoleError> {
    let mut tasks: Vec<String> = Vec::new();
    let (mut csrf, mut reason, mut printer, mut action, mut back) =
        (String::new(), String::new(), String::new(), String::new(), String::new());
    for (k, v) in form_pairs(&body) {
        match k.as_str() {
            "task" => tasks.push(v),
            "csrf" => csrf = v,
            "reason" => reason = v,
            "printer_id" => printer = v,
            "action" => action = v,
            "back" => back = v,
            _ => {}
        }
    }
    let list = format!("/console/stores/{}/tickets", url_encode(&store_id));
    // Only the list of this store, as the form sent it: never another site or page.
    let back =
        if (back == list || back.starts_with(&format!("{list}?"))) && !back.contains("//") { back } else { list };
    let user = match user {
        Ok(user) => user,
        // The session ended before the form came: nothing is done, and after the login
        // the browser lands on the list, with the login page saying so.
        Err(ConsoleError::Redirect(_)) => {
            return Err(ConsoleError::Redirect(super::auth::login_target(&back, true, true)));
        }
        Err(e) => return Err(e),
    };
    user.check_csrf(&csrf)?;
    let shop = shop(&st, &user, &store_id).await?;
    let action = ACTIONS
        .into_iter()
        .find(|a| a.as_str() == action)
        .ok_or_else(|| ApiError::not_found(format!("no bulk action {action:?}")))?;
    if tasks.len() > PAGE {
        return Err(ApiError::invalid(format!("at most {PAGE} tickets at once (one page)")).into());
    }
    let mut seen = std::collections::HashSet::new();
    tasks.retain(|t| seen.insert(t.clone()));
    let printer_id = Some(printer).filter(|p| !p.is_empty() && action == ManualAction::Reprint);
    let mut done = 0usize;
    let mut refused: Vec<(String, &'static str)> = Vec::new();
    for id in tasks {
        let task = match task_of(&st, &user, &shop, &id).await {
            Ok(t) => t,
            Err(ConsoleError::Api(e)) => {
                refused.push((id, why_of(&e)));
                continue;
            }
            Err(e) => return Err(e),
        };
        let req = ActionRequest {
            tenant_id: user.operator().tenant_id.clone(),
            task_id: task.task_id.clone(),
            actor: Actor::Operator(user.operator().id.clone()),
            reason: reason.clone(),
            printer_id: printer_id.clone(),
        };
        match st.operations.act(action, req).await {
            Ok(_) => done += 1,
            Err(e) => {
                let e: ApiError = e.into();
                tracing::info!(task = %task.task_id, code = e.code, "bulk action refused: {}", e.message);
                refused.push((task.task_id, why_of(&e)));
            }
        }
    }
    // Refused ids that are not task ids (typed into a forged form) are named as unknown
    // without repeating what was typed.
    let refused: Vec<String> = refused
        .into_iter()
        .map(|(id, why)| match TaskId::parse(&id) {
            Some(id) => format!("{}.{why}", id.as_str()),
            None => format!("-.{why}"),
        })
        .collect();
    let sep = if back.contains('?') { '&' } else { '?' };
    Err(ConsoleError::Redirect(format!(
        "{back}{sep}bulk={}&done={done}&refused={}",
        action.as_str(),
        url_encode(&refused.join(","))
    )))
}

/// The bulk action's address opened as a page (a bookmark, a login that came back to
/// the form's address): it takes only POST, so the browser is sent to the list.
pub async fn by_get(_user: ConsoleUser, Path(store_id): Path<String>) -> ConsoleError {
    ConsoleError::Redirect(format!("/console/stores/{}/tickets", url_encode(&store_id)))
}

/// The note at the top of the list after a bulk action: how many were done, and each
/// refused ticket with its business number, its state now and why.
pub async fn result_note(
    st: &AppState,
    user: &ConsoleUser,
    lang: Lang,
    q: &TicketSearch,
) -> Result<String, ConsoleError> {
    let Some(action) = q.bulk.as_deref().and_then(|b| ACTIONS.into_iter().find(|a| a.as_str() == b)) else {
        return Ok(String::new());
    };
    let done: usize = q.done.as_deref().and_then(|d| d.parse().ok()).unwrap_or(0);
    let refused: Vec<(Option<String>, &'static str)> = q
        .refused
        .as_deref()
        .unwrap_or("")
        .split(',')
        .filter_map(|r| r.split_once('.'))
        .take(PAGE)
        .map(|(id, why)| {
            let key = WHY.iter().find(|(w, _)| *w == why).map_or("bulk.why.other", |(_, k)| k);
            (TaskId::parse(id).map(TaskId::into_string), key)
        })
        .collect();
    let ids: Vec<String> = refused.iter().filter_map(|(id, _)| id.clone()).collect();
    let numbers = tasks_named(st, user, &ids).await?;
    let mut out = format!(
        "<section class=\"card note\" id=\"bulk-result\" role=\"status\" data-done=\"{done}\" data-refused=\"{}\">\
         <p><strong>{}</strong>: {done} {}</p>",
        refused.len(),
        esc(lang.t(label_key(action))),
        esc(lang.t("bulk.done")),
    );
    if done == 0 && refused.is_empty() {
        out.push_str(&format!("<p>{}</p>", esc(lang.t("bulk.none"))));
    }
    if !refused.is_empty() {
        out.push_str(&format!("<p>{}</p><ul id=\"refused\">", esc(lang.t("bulk.refused"))));
        for (id, key) in &refused {
            let who = match id.as_ref().and_then(|id| numbers.get(id)) {
                Some(t) => format!(
                    "<a href=\"/console/stores/{store}/tickets/{url}\"><strong>{biz}</strong></a> {badge}",
                    store = url_encode(&t.store_id),
                    url = url_encode(&t.task_id),
                    biz = esc(&t.biz_no),
                    badge = state_badge(lang, t.state),
                ),
                None => format!("<strong>{}</strong>", esc(lang.t("bulk.unknown_ticket"))),
            };
            out.push_str(&format!(
                "<li data-task=\"{}\" data-why=\"{}\">{who} — {}</li>",
                esc(id.as_deref().unwrap_or("")),
                esc(key.trim_start_matches("bulk.why.")),
                esc(lang.t(key)),
            ));
        }
        out.push_str("</ul>");
    }
    out.push_str("</section>");
    Ok(out)
}
