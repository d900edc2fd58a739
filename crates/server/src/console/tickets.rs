//! The tickets page: search by business number or text, filters (state, printer, print
//! type, a day and a time range within it), pages of [`PAGE`] tickets newest first with
//! keyset cursors to the next and the previous page, and the check boxes and controls of
//! the bulk actions (done by `bulk`).
//!
//! Paging never counts or skips rows: "next" is the tickets below the last id shown,
//! "previous" the ones just above the first (`TaskQuery::cursor`, `TaskQuery::after`), so
//! the hundredth page of a busy store costs what the first does. Each filter is a
//! condition of the store's query, read through an index (docs/CONSOLE.md, *Tickets*).

use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use onceprint_core::manual::{original_goes_to, ManualTask};
use onceprint_core::{TaskId, TaskState};
use onceprint_store::{Printer, Task, TaskQuery};
use serde::Deserialize;

use super::auth::ConsoleUser;
use super::html::{esc, url_encode};
use super::i18n::Lang;
use super::pages::{
    containing, first_lines, here, lines_of, name_of, now_ms, printer_names, render, shop, state_badge, store_base,
    Render, Shop,
};
use super::ConsoleError;
use crate::error::ApiError;
use crate::AppState;

/// Tickets on one page of the list.
pub const PAGE: usize = 100;

/// The query of the tickets page. Every field is text as the form sends it; empty means
/// "not given".
#[derive(Debug, Deserialize, Default)]
pub struct TicketSearch {
    pub q: Option<String>,
    pub state: Option<String>,
    pub printer: Option<String>,
    #[serde(rename = "type")]
    pub print_type: Option<String>,
    /// A business day of the store, `YYYY-MM-DD`.
    pub day: Option<String>,
    /// `HH:MM` on that day (today when no day is given), included.
    pub from: Option<String>,
    /// `HH:MM` on that day, not included.
    pub to: Option<String>,
    /// The next page: tickets older than this one.
    pub before: Option<String>,
    /// The previous page: the tickets just newer than this one.
    pub after: Option<String>,
    /// After a bulk action: which one, how many were done, and the refused ones as
    /// `TASK.why` separated by commas (see `bulk`).
    pub bulk: Option<String>,
    pub done: Option<String>,
    pub refused: Option<String>,
}

/// The filters of a request, checked.
#[derive(Debug, Default, Clone)]
pub struct Filters {
    pub text: String,
    pub state: Option<TaskState>,
    pub printer: Option<String>,
    pub print_type: Option<String>,
    pub day: Option<String>,
    pub from: Option<String>,
    pub to: Option<String>,
}

fn given(v: &Option<String>) -> Option<String> {
    v.as_deref().map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned)
}

/// `HH:MM` (or `HH:MM:SS`, which some browsers send) as hour and minute.
fn hour_minute(s: &str) -> Option<(i8, i8)> {
    let mut parts = s.split(':');
    let h: i8 = parts.next()?.parse().ok()?;
    let m: i8 = parts.next()?.parse().ok()?;
    ((0..24).contains(&h) && (0..60).contains(&m)).then_some((h, m))
}

impl Filters {
    pub fn of(q: &TicketSearch) -> Filters {
        Filters {
            text: q.q.as_deref().unwrap_or("").trim().to_owned(),
            state: given(&q.state).as_deref().and_then(TaskState::parse),
            printer: given(&q.printer),
            print_type: given(&q.print_type),
            day: given(&q.day),
            from: given(&q.from),
            to: given(&q.to),
        }
    }

    /// The filters as a query string (without `?`), for the links to other pages and the
    /// way back after a bulk action.
    pub fn query(&self) -> String {
        let mut parts = Vec::new();
        let mut add = |k: &str, v: Option<&str>| {
            if let Some(v) = v.filter(|v| !v.is_empty()) {
                parts.push(format!("{k}={}", url_encode(v)));
            }
        };
        add("q", Some(&self.text));
        add("state", self.state.map(TaskState::as_str));
        add("printer", self.printer.as_deref());
        add("type", self.print_type.as_deref());
        add("day", self.day.as_deref());
        add("from", self.from.as_deref());
        add("to", self.to.as_deref());
        parts.join("&")
    }

    /// The time range asked for, `[from, to)` in milliseconds: a day, or a part of one
    /// (today's when only times are given). `None` when no day and no time is given.
    fn range(&self, shop: &Shop) -> Result<Option<(i64, i64)>, ConsoleError> {
        if self.day.is_none() && self.from.is_none() && self.to.is_none() {
            return Ok(None);
        }
        let day = self.day.clone().unwrap_or_else(|| shop.zone.local_date(now_ms()));
        let window = onceprint_engine::reconcile::day_window(&day, &shop.zone)
            .ok_or_else(|| ApiError::invalid(format!("day: {day:?} is not a date YYYY-MM-DD")))?;
        let at = |field: &str, t: &Option<String>, default: i64| -> Result<i64, ConsoleError> {
            match t {
                None => Ok(default),
                Some(t) => hour_minute(t)
                    .and_then(|(h, m)| shop.zone.instant_at(&day, h, m))
                    .map(|ms| ms.clamp(window.from, window.to))
                    .ok_or_else(|| ConsoleError::Api(ApiError::invalid(format!("{field}: {t:?} is not a time HH:MM")))),
            }
        };
        Ok(Some((at("from", &self.from, window.from)?, at("to", &self.to, window.to)?)))
    }
}

fn cursor(field: &str, v: &Option<String>) -> Result<Option<String>, ConsoleError> {
    match given(v) {
        None => Ok(None),
        Some(c) => Ok(Some(
            TaskId::parse(&c)
                .ok_or_else(|| ApiError::invalid(format!("{field}: not a page of this list")))?
                .into_string(),
        )),
    }
}

/// One page of tickets, and whether there are pages before and after it.
struct PageOf {
    tasks: Vec<Task>,
    newer: bool,
    older: bool,
}

/// The page of the list without a text: every filter is a condition of the query.
async fn list_page(
    st: &AppState,
    user: &ConsoleUser,
    shop: &Shop,
    f: &Filters,
    range: Option<(i64, i64)>,
    before: Option<String>,
    after: Option<String>,
) -> Result<PageOf, ConsoleError> {
    let id = |ms: i64| TaskId::from_parts(ms, [0; 10]).into_string();
    let going_back = after.is_some();
    let mut tasks = st
        .store
        .list_tasks(&TaskQuery {
            tenant_id: user.operator().tenant_id.clone(),
            store_id: Some(shop.row.id.clone()),
            state: f.state,
            printer_id: f.printer.clone(),
            print_type: f.print_type.clone(),
            id_from: range.map(|(from, _)| id(from)),
            id_to: range.map(|(_, to)| id(to)),
            // One more than a page tells whether there is another page that way.
            limit: PAGE as i64 + 1,
            cursor: before.clone(),
            after,
            ..Default::default()
        })
        .await?;
    let more = tasks.len() > PAGE;
    if going_back {
        if more {
            tasks.remove(0);
        }
        // Came back from a page further on: that page is still there.
        Ok(PageOf { tasks, newer: more, older: true })
    } else {
        tasks.truncate(PAGE);
        Ok(PageOf { tasks, newer: before.is_some(), older: more })
    }
}

/// The tickets matching a text: the start of the business number over the whole store,
/// or any part of the business number or the printed text within one day (the one asked
/// for, else today), with the other filters applied to what was found. At most one page,
/// newest first.
async fn search_page(
    st: &AppState,
    user: &ConsoleUser,
    shop: &Shop,
    f: &Filters,
    range: Option<(i64, i64)>,
) -> Result<PageOf, ConsoleError> {
    let tenant = &user.operator().tenant_id;
    let day_tasks = |d: String| async move {
        let window = onceprint_engine::reconcile::day_window(&d, &shop.zone)
            .ok_or_else(|| ApiError::invalid(format!("day: {d:?} is not a date YYYY-MM-DD")))?;
        let from = TaskId::from_parts(window.from, [0; 10]).into_string();
        let to = TaskId::from_parts(window.to, [0; 10]).into_string();
        Ok::<Vec<Task>, ConsoleError>(st.store.tasks_created_between(tenant, &shop.row.id, &from, &to).await?)
    };
    let mut tasks = match &f.day {
        Some(d) => containing(st, day_tasks(d.clone()).await?, &f.text).await?,
        None => {
            let mut found = st
                .store
                .list_tasks(&TaskQuery {
                    tenant_id: tenant.clone(),
                    store_id: Some(shop.row.id.clone()),
                    state: f.state,
                    printer_id: f.printer.clone(),
                    print_type: f.print_type.clone(),
                    biz_no_prefix: Some(f.text.clone()),
                    limit: PAGE as i64,
                    ..Default::default()
                })
                .await?;
            let today = day_tasks(shop.zone.local_date(now_ms())).await?;
            found.extend(containing(st, today, &f.text).await?);
            found
        }
    };
    tasks.sort_by(|a, b| b.task_id.cmp(&a.task_id));
    tasks.dedup_by(|a, b| a.task_id == b.task_id);
    tasks.retain(|t| {
        f.state.is_none_or(|s| t.state == s)
            && f.printer.as_ref().is_none_or(|p| &t.printer_id == p)
            && f.print_type.as_ref().is_none_or(|p| &t.print_type == p)
            && range.is_none_or(|(from, to)| t.created_at >= from && t.created_at < to)
    });
    tasks.truncate(PAGE);
    Ok(PageOf { tasks, newer: false, older: false })
}

/// Whether the bulk actions may pick this ticket: one that needs a person (failed or in
/// doubt), for which at least one of the bulk actions is allowed by `core::manual`.
pub fn pickable(t: &Task) -> bool {
    matches!(t.state, TaskState::Failed | TaskState::InDoubt)
        && super::bulk::ACTIONS
            .iter()
            .any(|a| original_goes_to(*a, ManualTask { state: t.state, may_have_printed: t.may_have_printed }).is_ok())
}

fn filter_form(lang: Lang, f: &Filters, printers: &[Printer], types: &[String]) -> String {
    let mut body = format!(
        "<form class=\"search card\" method=\"get\" role=\"search\">\
         <label>{biz_l}<input name=\"q\" id=\"q\" value=\"{text}\" inputmode=\"search\"></label>\
         <label>{state_l}<select name=\"state\" id=\"state\"><option value=\"\">{any}</option>",
        biz_l = esc(lang.t("tickets.query")),
        text = esc(&f.text),
        state_l = esc(lang.t("ticket.state")),
        any = esc(lang.t("tickets.any")),
    );
    for s in TaskState::ALL {
        let sel = if f.state == Some(s) { " selected" } else { "" };
        body.push_str(&format!("<option value=\"{}\"{sel}>{}</option>", s.as_str(), esc(lang.state(s.as_str()))));
    }
    body.push_str(&format!(
        "</select></label><label>{}<select name=\"printer\" id=\"printer\"><option value=\"\">{}</option>",
        esc(lang.t("ticket.printer")),
        esc(lang.t("tickets.any"))
    ));
    for p in printers {
        let sel = if f.printer.as_deref() == Some(p.id.as_str()) { " selected" } else { "" };
        body.push_str(&format!("<option value=\"{}\"{sel}>{}</option>", esc(&p.id), esc(&p.name)));
    }
    body.push_str(&format!(
        "</select></label><label>{}<select name=\"type\" id=\"type\"><option value=\"\">{}</option>",
        esc(lang.t("ticket.type")),
        esc(lang.t("tickets.any"))
    ));
    for t in types {
        let sel = if f.print_type.as_deref() == Some(t.as_str()) { " selected" } else { "" };
        body.push_str(&format!("<option value=\"{t}\"{sel}>{t}</option>", t = esc(t)));
    }
    body.push_str(&format!(
        "</select></label><label>{day_l}<input type=\"date\" name=\"day\" id=\"day\" value=\"{day}\"></label>\
         <label>{from_l}<input type=\"time\" name=\"from\" id=\"from\" value=\"{from}\"></label>\
         <label>{to_l}<input type=\"time\" name=\"to\" id=\"to\" value=\"{to}\"></label>\
         <button type=\"submit\" id=\"search\">{search}</button></form>",
        day_l = esc(lang.t("tickets.day")),
        day = esc(f.day.as_deref().unwrap_or("")),
        from_l = esc(lang.t("tickets.from")),
        from = esc(f.from.as_deref().unwrap_or("")),
        to_l = esc(lang.t("tickets.to")),
        to = esc(f.to.as_deref().unwrap_or("")),
        search = esc(lang.t("tickets.search")),
    ));
    body
}

/// The links to the newer and the older page, keeping the filters.
fn pager(lang: Lang, base: &str, f: &Filters, page: &PageOf) -> String {
    if !page.newer && !page.older {
        return String::new();
    }
    let filters = f.query();
    let link = |id: &str, key: &'static str, cursor: &str, task: &Task| {
        let sep = if filters.is_empty() { "" } else { "&amp;" };
        format!(
            "<a class=\"button\" id=\"{id}\" rel=\"{rel}\" href=\"{base}/tickets?{filters}{sep}{cursor}={task}\">{label}</a>",
            rel = if id == "newer" { "prev" } else { "next" },
            filters = esc(&filters),
            task = url_encode(&task.task_id),
            label = esc(lang.t(key)),
        )
    };
    let mut out = String::from("<nav class=\"pager\">");
    if let (true, Some(first)) = (page.newer, page.tasks.first()) {
        out.push_str(&link("newer", "tickets.newer", "after", first));
    }
    if let (true, Some(last)) = (page.older, page.tasks.last()) {
        out.push_str(&link("older", "tickets.older", "before", last));
    }
    out.push_str("</nav>");
    out
}

/// Ticket search, filters and pages, with the bulk actions on the tickets that need a
/// person.
pub async fn tickets(
    State(st): State<AppState>,
    user: ConsoleUser,
    headers: HeaderMap,
    Path(store_id): Path<String>,
    Query(q): Query<TicketSearch>,
) -> Result<Response, ConsoleError> {
    let lang = user.lang;
    let shop = shop(&st, &user, &store_id).await?;
    let tenant = &user.operator().tenant_id;
    let printers = st.store.list_printers(tenant, Some(&shop.row.id)).await?;
    let f = Filters::of(&q);
    let range = f.range(&shop)?;
    let page = if f.text.is_empty() {
        list_page(&st, &user, &shop, &f, range, cursor("before", &q.before)?, cursor("after", &q.after)?).await?
    } else {
        search_page(&st, &user, &shop, &f, range).await?
    };
    let base = store_base(&shop);
    let types: Vec<String> = st.intake.policies().types.keys().cloned().collect();
    let mut body = super::bulk::result_note(&st, &user, lang, &q).await?;
    body.push_str(&filter_form(lang, &f, &printers, &types));
    if page.tasks.is_empty() {
        body.push_str(&format!("<p class=\"empty\">{}</p>", esc(lang.t("tickets.none"))));
    }
    let names = printer_names(&printers);
    let lines = first_lines(&st, &page.tasks).await?;
    let pick = page.tasks.iter().any(pickable);
    let back = match f.query() {
        q if q.is_empty() => format!("{base}/tickets"),
        q => format!("{base}/tickets?{q}"),
    };
    if pick {
        // The list is the bulk form: each ticket that needs a person has a check box.
        body.push_str(&format!(
            "<form method=\"post\" action=\"{base}/tickets/bulk\" id=\"bulk\">\
             <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\"><input type=\"hidden\" name=\"back\" value=\"{back}\">",
            csrf = esc(&user.session.csrf_token),
            back = esc(&back),
        ));
    }
    body.push_str(&pager(lang, &base, &f, &page));
    body.push_str(&format!("<ul class=\"tickets\" id=\"results\" data-count=\"{}\">", page.tasks.len()));
    for t in &page.tasks {
        let check = if pickable(t) {
            format!(
                "<label class=\"check pick\"><input type=\"checkbox\" name=\"task\" value=\"{id}\"> \
                 <span class=\"sr\">{pick_l} {biz}</span></label>",
                id = esc(&t.task_id),
                pick_l = esc(lang.t("bulk.pick")),
                biz = esc(&t.biz_no),
            )
        } else {
            String::new()
        };
        body.push_str(&format!(
            "<li class=\"card ticket\" data-task=\"{id}\" data-state=\"{state}\"><div class=\"row\">{check}\
             <a href=\"{base}/tickets/{id}\"><strong>{biz}</strong></a> {badge}\
             <span class=\"muted\">{printer} · {created}</span></div>{lines}</li>",
            id = esc(&t.task_id),
            state = t.state.as_str(),
            biz = esc(&t.biz_no),
            badge = state_badge(lang, t.state),
            printer = esc(name_of(&names, &t.printer_id)),
            lines = lines_of(&lines, &t.task_id),
            created = esc(&shop.zone.local_time(t.created_at)),
        ));
    }
    body.push_str("</ul>");
    body.push_str(&pager(lang, &base, &f, &page));
    if pick {
        body.push_str(&super::bulk::controls(lang, &printers));
        body.push_str("</form>");
    }
    let path = format!("{base}/tickets");
    let r = Render {
        user: &user,
        shop: Some(&shop),
        title: lang.t("tickets.title"),
        current: "tickets",
        here: here(&headers, &path),
        live: false,
    };
    Ok(render(r, &headers, &body))
}

/// The tenant's tasks among `ids` in stores the operator may see, by id, for naming
/// tickets in a note.
pub async fn tasks_named(
    st: &AppState,
    user: &ConsoleUser,
    ids: &[String],
) -> Result<HashMap<String, Task>, ConsoleError> {
    Ok(st
        .store
        .get_tasks(&user.operator().tenant_id, ids)
        .await?
        .into_iter()
        .filter(|t| user.operator().may_see_store(&t.store_id))
        .map(|t| (t.task_id.clone(), t))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_filters_read_as_a_person_types_them() {
        assert_eq!(hour_minute("09:30"), Some((9, 30)));
        assert_eq!(hour_minute("23:59:00"), Some((23, 59)));
        assert_eq!(hour_minute("24:00"), None);
        assert_eq!(hour_minute("9"), None);
        let q = TicketSearch {
            q: Some(" A1 ".into()),
            state: Some("failed".into()),
            printer: Some("p 1".into()),
            print_type: Some(String::new()),
            ..Default::default()
        };
        assert_eq!(Filters::of(&q).query(), "q=A1&state=failed&printer=p%201");
    }
}
