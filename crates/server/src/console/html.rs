//! HTML building blocks of the console: escaping (every text from the database or the
//! request goes through [`esc`]), and the page frame with its navigation, language switch,
//! logout form and the live region that `console.js` refreshes.

use super::i18n::Lang;

/// Escapes text for HTML element content and quoted attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Percent-encodes a query value (everything but unreserved characters).
pub fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// What the frame of a store page needs.
pub struct Frame<'a> {
    pub lang: Lang,
    pub title: &'a str,
    /// The current path with query, for the language switch to come back to.
    pub here: &'a str,
    pub csrf: &'a str,
    pub operator_name: &'a str,
    /// `(store id, store name)` when the page belongs to a store.
    pub store: Option<(&'a str, &'a str)>,
    /// Which navigation entry is current.
    pub current: &'a str,
    pub is_manager: bool,
    /// The server-sent events URL that makes this page live, if it is.
    pub live: Option<String>,
    /// How many of the store's tickets need attention (a store's pages only).
    pub attention: Option<usize>,
}

/// The badge on "Needs attention": the count, or nothing when there is none. The live
/// view updates it from the `X-Console-Attention` header of each refresh.
pub fn attention_badge(count: usize, id: Option<&str>) -> String {
    let shown = if count > 99 { "99+".to_owned() } else { count.to_string() };
    let id = id.map(|i| format!(" id=\"{}\"", esc(i))).unwrap_or_default();
    format!("<span class=\"count\"{id}{}>{shown}</span>", if count == 0 { " hidden" } else { "" })
}

fn head(lang: Lang, title: &str) -> String {
    format!(
        "<!doctype html><html lang=\"{}\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{} · {}</title><link rel=\"stylesheet\" href=\"/console/assets/console.css\">\
         <script src=\"/console/assets/console.js\" defer></script></head>",
        lang.html_lang(),
        esc(title),
        esc(lang.t("app")),
    )
}

fn lang_link(lang: Lang, here: &str) -> String {
    format!(
        "<a class=\"lang\" id=\"lang\" href=\"/console/lang?to={}&amp;next={}\" lang=\"{}\">{}</a>",
        lang.other().code(),
        url_encode(here),
        lang.other().html_lang(),
        esc(lang.t("lang.switch"))
    )
}

/// A page without navigation (login, errors before login).
pub fn bare_page(lang: Lang, title: &str, here: &str, body: &str) -> String {
    format!(
        "{}<body><header class=\"top\"><span class=\"brand\">{}</span>{}</header>\
         <main id=\"main\" class=\"narrow\">{body}</main></body></html>",
        head(lang, title),
        esc(lang.t("app")),
        lang_link(lang, here),
    )
}

/// A page of the console with the navigation of its store.
pub fn page(f: &Frame<'_>, body: &str) -> String {
    let lang = f.lang;
    let mut nav = String::new();
    if let Some((id, _)) = f.store {
        let base = format!("/console/stores/{}", url_encode(id));
        for (key, path, name) in [
            ("overview", "/", "nav.overview"),
            ("attention", "/attention", "nav.attention"),
            ("tickets", "/tickets", "nav.tickets"),
            ("reconciliation", "/reconciliation", "nav.reconciliation"),
        ] {
            let current = if f.current == key { " aria-current=\"page\"" } else { "" };
            let badge = match f.attention {
                Some(n) if key == "attention" => format!(" {}", attention_badge(n, Some("attention-count"))),
                _ => String::new(),
            };
            nav.push_str(&format!(
                "<a href=\"{base}{path}\" id=\"nav-{key}\"{current}>{}{badge}</a>",
                esc(lang.t(name))
            ));
        }
    }
    // Set-up of the store's printers, for a manager (staff reach the list by its address).
    if let (Some((id, _)), true) = (f.store, f.is_manager) {
        let current = if f.current == "setup" { " aria-current=\"page\"" } else { "" };
        nav.push_str(&format!(
            "<a href=\"/console/stores/{}/printers\" id=\"nav-setup\"{current}>{}</a>",
            url_encode(id),
            esc(lang.t("nav.setup"))
        ));
    }
    let stores_current = if f.current == "stores" { " aria-current=\"page\"" } else { "" };
    nav.push_str(&format!("<a href=\"/console/\"{stores_current}>{}</a>", esc(lang.t("nav.stores"))));
    if f.is_manager {
        let current = if f.current == "operators" { " aria-current=\"page\"" } else { "" };
        nav.push_str(&format!(
            "<a href=\"/console/operators\" id=\"nav-operators\"{current}>{}</a>",
            esc(lang.t("nav.operators"))
        ));
        let current = if f.current == "alerts" { " aria-current=\"page\"" } else { "" };
        nav.push_str(&format!(
            "<a href=\"/console/alerts\" id=\"nav-alerts\"{current}>{}</a>",
            esc(lang.t("nav.alerts"))
        ));
    }
    let store_name = f.store.map(|(_, n)| format!("<span class=\"store\">{}</span>", esc(n))).unwrap_or_default();
    let live = match &f.live {
        Some(url) => format!(
            " data-live=\"{}\" data-live-on=\"{}\" data-live-off=\"{}\" data-cue=\"{}\"",
            esc(url),
            esc(lang.t("live.on")),
            esc(lang.t("live.off")),
            esc(lang.t("attention.new_doubt"))
        ),
        None => String::new(),
    };
    format!(
        "{head}<body><a class=\"skip\" href=\"#main\">{skip}</a>\
         <header class=\"top\"><span class=\"brand\">{app}</span>{store_name}\
         <span class=\"who\">{who}</span>{lang_link}\
         <form method=\"post\" action=\"/console/logout\" class=\"logout\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\"><button type=\"submit\" id=\"logout\">{logout}</button></form>\
         </header><nav class=\"nav\" aria-label=\"{app}\">{nav}</nav>\
         <div id=\"cue\" class=\"cue\" role=\"status\" aria-live=\"assertive\" hidden></div>\
         <p id=\"live-state\" class=\"live-state\" aria-live=\"polite\"></p>\
         <main id=\"main\" tabindex=\"-1\"{live}><h1>{title}</h1>{body}</main></body></html>",
        head = head(lang, f.title),
        skip = esc(lang.t("skip")),
        app = esc(lang.t("app")),
        who = esc(f.operator_name),
        lang_link = lang_link(lang, f.here),
        csrf = esc(f.csrf),
        logout = esc(lang.t("logout")),
        title = esc(f.title),
    )
}

/// The part of a page that live updates replace: everything inside `<main>`.
pub fn fragment(title: &str, body: &str) -> String {
    format!("<h1>{}</h1>{body}", esc(title))
}

/// A duration for people, in the page's language: "3 min", "2 h 5 min", "45 s" in
/// English, "3 分钟", "2 小时 5 分钟", "45 秒" in Chinese.
pub fn age(lang: Lang, ms: i64) -> String {
    let s = (ms / 1000).max(0);
    let (sec, min, hour) = match lang {
        Lang::En => ("s", "min", "h"),
        Lang::Zh => ("秒", "分钟", "小时"),
    };
    match s {
        0..=59 => format!("{s} {sec}"),
        60..=3599 => format!("{} {min}", s / 60),
        _ => format!("{} {hour} {} {min}", s / 3600, (s % 3600) / 60),
    }
}

/// How long a person must wait, in the page's language: seconds under a minute, else
/// whole minutes rounded up ("15 min", "15 分钟"), so the wait shown is never too short.
pub fn wait(lang: Lang, secs: u64) -> String {
    let (sec, min) = match lang {
        Lang::En => ("s", "min"),
        Lang::Zh => ("秒", "分钟"),
    };
    match secs {
        0..=59 => format!("{secs} {sec}"),
        _ => format!("{} {min}", secs.div_ceil(60)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_cannot_become_markup() {
        assert_eq!(esc("<script>alert('x')</script>&\""), "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;");
        assert_eq!(url_encode("/console/x?a=b&c"), "%2Fconsole%2Fx%3Fa%3Db%26c");
        let en = (age(Lang::En, 5_000), age(Lang::En, 180_000), age(Lang::En, 7_500_000));
        assert_eq!(en, ("5 s".into(), "3 min".into(), "2 h 5 min".into()));
        let zh = (age(Lang::Zh, 5_000), age(Lang::Zh, 180_000), age(Lang::Zh, 7_500_000));
        assert_eq!(zh, ("5 秒".into(), "3 分钟".into(), "2 小时 5 分钟".into()));
        let waits = (wait(Lang::En, 45), wait(Lang::En, 60), wait(Lang::En, 873), wait(Lang::Zh, 900));
        assert_eq!(waits, ("45 s".into(), "1 min".into(), "15 min".into(), "15 分钟".into()));
    }
}
