//! The console's two languages, English and Chinese: which one a request gets (the
//! `op_lang` cookie set by the switch, else the first of `Accept-Language` that the
//! console speaks, else English) and every text the pages show.

use axum::http::HeaderMap;

use super::auth::cookie;

/// A language of the console.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lang {
    En,
    Zh,
}

/// The cookie that remembers the language a person chose with the switch.
pub const LANG_COOKIE: &str = "op_lang";

impl Lang {
    pub fn code(self) -> &'static str {
        match self {
            Lang::En => "en",
            Lang::Zh => "zh",
        }
    }

    /// The `lang` attribute of the page.
    pub fn html_lang(self) -> &'static str {
        match self {
            Lang::En => "en",
            Lang::Zh => "zh-CN",
        }
    }

    pub fn parse(s: &str) -> Option<Lang> {
        match s {
            "en" => Some(Lang::En),
            "zh" => Some(Lang::Zh),
            _ => None,
        }
    }

    pub fn other(self) -> Lang {
        match self {
            Lang::En => Lang::Zh,
            Lang::Zh => Lang::En,
        }
    }

    /// The language of a request.
    pub fn of(headers: &HeaderMap) -> Lang {
        if let Some(l) = cookie(headers, LANG_COOKIE).and_then(|v| Lang::parse(&v)) {
            return l;
        }
        let accept = headers.get(axum::http::header::ACCEPT_LANGUAGE).and_then(|v| v.to_str().ok()).unwrap_or("");
        // The highest-weighted tag that is English or Chinese wins; ties keep their order.
        let mut best: Option<(f32, Lang)> = None;
        for part in accept.split(',') {
            let mut pieces = part.trim().split(';');
            let tag = pieces.next().unwrap_or("").trim().to_ascii_lowercase();
            let q = pieces.find_map(|p| p.trim().strip_prefix("q=").and_then(|q| q.parse::<f32>().ok())).unwrap_or(1.0);
            let lang = if tag == "zh" || tag.starts_with("zh-") {
                Lang::Zh
            } else if tag == "en" || tag.starts_with("en-") {
                Lang::En
            } else {
                continue;
            };
            if best.is_none_or(|(bq, _)| q > bq) {
                best = Some((q, lang));
            }
        }
        best.map_or(Lang::En, |(_, l)| l)
    }

    /// The text under `key`; the key itself when there is none (a gap shows, not a panic).
    pub fn t(self, key: &'static str) -> &'static str {
        // The set-up pages keep their texts in a table of their own (`setup::TEXTS`).
        match TEXTS.iter().chain(super::setup::TEXTS).find(|(k, _, _)| *k == key) {
            Some((_, en, zh)) => match self {
                Lang::En => en,
                Lang::Zh => zh,
            },
            None => key,
        }
    }

    /// "3 min ago" / "3 min前".
    pub fn ago(self, age: &str) -> String {
        match self {
            Lang::En => format!("{age} ago"),
            Lang::Zh => format!("{age}前"),
        }
    }

    /// A task state in words.
    pub fn state(self, state: &str) -> &'static str {
        match state {
            "pending" => self.t("state.pending"),
            "sent" => self.t("state.sent"),
            "retrying" => self.t("state.retrying"),
            "printed" => self.t("state.printed"),
            "failed" => self.t("state.failed"),
            "in_doubt" => self.t("state.in_doubt"),
            "transferred" => self.t("state.transferred"),
            "cancelled" => self.t("state.cancelled"),
            "closed" => self.t("state.closed"),
            _ => self.t("state.unknown"),
        }
    }

    /// A printer's (or a ticket's) last error as a person reads it: what is wrong and
    /// what to do about it.
    pub fn reason(self, last_error: &str) -> String {
        let key = match last_error.split(':').next().unwrap_or("").trim() {
            "no_paper" => "why.no_paper",
            "cover_open" => "why.cover_open",
            "paper_jam" => "why.paper_jam",
            "offline" => "why.offline",
            "agent offline" => "why.agent_offline",
            "in_doubt" => "why.in_doubt",
            "unrenderable" => "why.unrenderable",
            "refused" => "why.refused",
            "error" => "why.printer_error",
            _ => return format!("{}: {last_error}", self.t("why.error")),
        };
        self.t(key).to_owned()
    }
}

/// A line of a ticket's history in plain words: what happened, who did it, and the words
/// a person typed as their reason (if any). The audit trail itself keeps the engine's
/// exact wording for the API; the console never shows that wording, because it names
/// protocols and internal ids that mean nothing at a counter.
pub struct PlainEvent {
    pub what: String,
    pub who: String,
    pub note: Option<String>,
}

impl Lang {
    /// One audit event in plain words.
    pub fn event(self, e: &onceprint_store::TaskEvent) -> PlainEvent {
        use onceprint_core::TaskState as S;
        let r = e.reason.as_str();
        let key = match (e.from, e.to) {
            (None, _) if r.starts_with("reprint") => "ev.created_reprint",
            (None, _) if r.starts_with("transferred from") => "ev.created_transfer",
            (None, _) if r.starts_with("failover") => "ev.created_failover",
            (None, _) => "ev.submitted",
            (_, S::Sent) if r.contains("fetched by the printer") => "ev.fetched",
            (_, S::Sent) if r.contains("again") => "ev.sent_again",
            (_, S::Sent) if r.contains("agent:") => "ev.sent_agent",
            (_, S::Sent) => "ev.sent",
            (_, S::Printed) if r.contains("status only") => "ev.printed_status",
            (_, S::Printed) => "ev.printed",
            (_, S::InDoubt) => "ev.in_doubt",
            (_, S::Retrying) => "ev.retrying",
            (_, S::Failed) => "ev.failed",
            (_, S::Closed) => "ev.closed",
            (_, S::Cancelled) => "ev.cancelled",
            (_, S::Transferred) => "ev.transferred",
            (_, S::Pending) => "ev.pending",
        };
        let mut what = self.t(key).to_owned();
        // A printer problem named in the reason is said the way the printers page says it.
        if matches!(e.to, S::Retrying | S::Failed | S::InDoubt) {
            if let Some(why) = self.problem(r) {
                what.push_str(" — ");
                what.push_str(&why);
            }
        }
        let person = e.actor.starts_with("operator:") || e.actor.starts_with("api_key:");
        PlainEvent { what, who: self.actor(&e.actor), note: person.then(|| typed_reason(&e.actor, r)).flatten() }
    }

    /// Who did something, as a person names them.
    pub fn actor(self, actor: &str) -> String {
        match actor.split_once(':') {
            Some(("operator", id)) => format!("{} {id}", self.t("who.operator")),
            Some(("api_key", _)) => self.t("who.api").to_owned(),
            Some(("agent", _)) => self.t("who.agent").to_owned(),
            Some(("printer", _)) => self.t("who.printer").to_owned(),
            // The engine, and anything else that is not a person: the system did it.
            _ => self.t("who.engine").to_owned(),
        }
    }

    /// A printer problem named anywhere in an audit reason, in plain words.
    fn problem(self, reason: &str) -> Option<String> {
        let r = reason.to_ascii_lowercase();
        let key = [
            ("no_paper", "why.no_paper"),
            ("cover_open", "why.cover_open"),
            ("paper_jam", "why.paper_jam"),
            ("agent offline", "why.agent_offline"),
            ("offline", "why.offline"),
            ("render", "why.unrenderable"),
            ("refused", "why.refused"),
            ("deadline", "ev.no_answer"),
            ("timed out", "ev.no_answer"),
            ("timeout", "ev.no_answer"),
        ]
        .into_iter()
        .find(|(needle, _)| r.contains(needle))?
        .1;
        Some(self.t(key).to_owned())
    }
}

/// The words a person typed as the reason of an action, without the prefix the engine
/// puts before them ("mark-printed: …", "reprint 1 of … by operator:amy: …").
fn typed_reason(actor: &str, reason: &str) -> Option<String> {
    let after_actor = format!("{actor}: ");
    let words = if let Some(i) = reason.find(&after_actor) {
        &reason[i + after_actor.len()..]
    } else {
        ["mark-printed: ", "reprint: ", "cancel: ", "transfer: "]
            .into_iter()
            .find_map(|p| reason.strip_prefix(p))
            .unwrap_or(reason)
    };
    let words = words.trim();
    (!words.is_empty()).then(|| words.to_owned())
}

/// (key, English, Chinese).
const TEXTS: &[(&str, &str, &str)] = &[
    ("app", "onceprint console", "onceprint 控制台"),
    ("skip", "Skip to content", "跳到正文"),
    ("login.title", "Log in", "登录"),
    ("login.tenant", "Tenant", "租户"),
    ("login.operator", "Operator", "操作员"),
    ("login.password", "Password", "密码"),
    ("login.submit", "Log in", "登录"),
    ("login.bad", "Wrong tenant, operator or password.", "租户、操作员或密码错误。"),
    ("login.disabled", "This login is disabled. Ask a manager to enable it.", "此登录已停用。请联系经理重新启用。"),
    ("login.throttled", "Too many failed logins. Wait and try again in", "登录失败次数过多。请稍后再试，等待"),
    ("login.expired", "Your session ended. Please log in again.", "会话已结束，请重新登录。"),
    (
        "login.undone",
        "Your session ended before your action reached the server: it was NOT done. Log in, check the ticket and do it again if it is still needed.",
        "操作提交前会话已结束：该操作未执行。请重新登录，查看小票，如仍需要请再操作一次。",
    ),
    ("stop", ".", "。"),
    ("logout", "Log out", "退出"),
    ("lang.switch", "中文", "English"),
    ("nav.overview", "Printers", "打印机"),
    ("nav.attention", "Needs attention", "待处理"),
    ("nav.tickets", "Tickets", "小票"),
    ("nav.reconciliation", "Day's reconciliation", "日对账"),
    ("nav.operators", "Operators", "操作员"),
    ("nav.stores", "Stores", "门店"),
    ("stores.title", "Your stores", "您的门店"),
    ("stores.attention", "need attention", "张需要处理"),
    ("stores.printers_bad", "printers with a problem", "台打印机有问题"),
    ("stores.fine", "All fine", "一切正常"),
    ("overview.title", "Printers", "打印机"),
    ("printer", "Printer", "打印机"),
    ("printer.online", "online", "在线"),
    ("printer.offline", "offline", "离线"),
    ("printer.disabled", "disabled", "已停用"),
    ("printer.ready", "Ready", "就绪"),
    ("printer.last_seen", "Last seen", "最后在线"),
    ("printer.never", "never", "从未"),
    ("printer.paused_for", "tickets wait for it, paused for", "票据等待中，已暂停"),
    ("printer.lane", "Waiting", "排队"),
    ("printer.oldest", "oldest", "最早"),
    ("printer.in_flight", "printing now", "正在打印"),
    ("printer.none", "No printers in this store yet.", "此门店还没有打印机。"),
    ("why.no_paper", "Out of paper — refill, then it prints by itself", "缺纸 — 装纸后会自动继续打印"),
    ("why.cover_open", "Cover open — close it, then it prints by itself", "盖子打开 — 合上后会自动继续打印"),
    ("why.paper_jam", "Paper jam — clear the jam and close the cover", "卡纸 — 清除卡纸并合上盖子"),
    ("why.offline", "Offline — check the power and the network cable", "离线 — 检查电源和网线"),
    (
        "why.agent_offline",
        "Agent offline — check the shop computer that runs the onceprint agent",
        "代理离线 — 检查店里运行 onceprint 代理的电脑",
    ),
    (
        "why.in_doubt",
        "Not confirmed — look whether the ticket came out, then decide",
        "未确认 — 请查看小票是否已打出，再做处理",
    ),
    ("why.unrenderable", "The content cannot be printed on this printer", "此内容无法在该打印机上打印"),
    (
        "why.refused",
        "The printer refused the ticket and printed nothing — check the printer's settings",
        "打印机拒收了小票，没有打印 — 请检查打印机设置",
    ),
    ("why.printer_error", "The printer reported an error — look at the printer", "打印机报告了错误 — 请查看打印机"),
    ("why.error", "Error", "错误"),
    ("attention.title", "Needs attention", "待处理"),
    ("attention.empty", "Nothing needs attention. Every ticket is fine.", "没有待处理的小票，一切正常。"),
    ("attention.age", "for", "已持续"),
    ("attention.new_doubt", "New ticket in doubt — look at it now", "有新的存疑小票 — 请立即查看"),
    ("ticket", "Ticket", "小票"),
    ("ticket.biz_no", "Order number", "单号"),
    ("ticket.state", "State", "状态"),
    ("ticket.printer", "Printer", "打印机"),
    ("ticket.type", "Print type", "打印类型"),
    ("ticket.attempts", "Attempts", "尝试次数"),
    ("ticket.created", "Created", "创建时间"),
    ("ticket.updated", "Changed", "更新时间"),
    ("ticket.printed_at", "Printed", "打印时间"),
    ("ticket.reason", "Reason", "原因"),
    ("ticket.timeline", "What happened", "处理记录"),
    ("ticket.chain", "Attempts, reprints and transfers", "重打与转移"),
    ("ticket.preview", "How it prints", "打印预览"),
    ("ticket.preview_alt", "Preview of the ticket as printed", "小票打印效果预览"),
    ("ticket.actions", "What you can do", "可执行的操作"),
    ("ticket.no_actions", "No action is possible in this state.", "此状态下不能执行任何操作。"),
    ("chain.original", "original", "原始"),
    ("chain.reprint", "reprint", "重打"),
    ("chain.transfer", "transfer", "转移"),
    ("chain.failover", "failover", "自动切换"),
    ("chain.this", "this ticket", "当前小票"),
    ("action.mark_printed", "Mark printed", "标记为已打印"),
    ("action.reprint", "Reprint", "重新打印"),
    ("action.cancel", "Cancel and refund", "取消并退款"),
    ("action.transfer", "Move to another printer", "转到其他打印机"),
    ("action.reason", "Reason (required)", "原因（必填）"),
    ("action.on_printer", "On printer", "打印机"),
    ("action.same_printer", "its own printer", "原打印机"),
    ("action.confirm", "Confirm", "确认"),
    ("action.done", "Done.", "已完成。"),
    ("tickets.title", "Tickets", "小票"),
    ("tickets.search", "Search", "搜索"),
    (
        "tickets.query",
        "Order number (or its start), or a table or dish of the day",
        "单号（或开头部分），或当天的桌号、菜品",
    ),
    ("tickets.any", "any", "全部"),
    ("tickets.day", "Day", "日期"),
    ("tickets.none", "No ticket matches.", "没有符合条件的小票。"),
    ("tickets.open", "Open", "查看"),
    ("tickets.from", "From (time)", "开始时间"),
    ("tickets.to", "Until (time)", "结束时间"),
    ("tickets.newer", "← Newer", "← 较新"),
    ("tickets.older", "Older →", "较早 →"),
    ("bulk.pick", "Select", "选择"),
    ("bulk.title", "With the ticked tickets", "对已勾选的小票"),
    ("bulk.reason", "Reason, for all of them (required)", "原因，适用于全部（必填）"),
    ("bulk.printer", "Reprint on", "重打到"),
    ("bulk.own_printer", "each on its own printer", "各自原来的打印机"),
    ("bulk.reprint", "Reprint each (marked REPRINT)", "逐张重打（标有“重打”）"),
    ("bulk.mark_printed", "Mark each printed", "逐张标记为已打印"),
    ("bulk.done", "done", "张已完成"),
    ("bulk.none", "No ticket was ticked.", "没有勾选任何小票。"),
    ("bulk.refused", "Not done:", "未完成："),
    ("bulk.unknown_ticket", "a ticket not of this store", "不属于本店的小票"),
    ("bulk.why.state", "its state does not allow this (any more)", "当前状态不允许此操作"),
    ("bulk.why.printer", "that printer is disabled", "该打印机已停用"),
    ("bulk.why.unknown", "not a ticket of this store", "不是本店的小票"),
    ("bulk.why.reason", "the reason is missing or too long", "原因为空或过长"),
    ("bulk.why.other", "it could not be done now; try again on the ticket's page", "暂时无法完成，请在该小票页面重试"),
    ("recon.title", "Day's reconciliation", "日对账"),
    ("recon.show", "Show", "查看"),
    ("recon.csv", "Download CSV", "下载 CSV"),
    ("recon.counts", "Tickets", "小票"),
    ("recon.ledger", "Charges and refunds", "计费与退款"),
    ("recon.differences", "Differences", "差异"),
    ("recon.submitted", "submitted", "提交"),
    ("recon.open", "still waiting or printing", "仍在等待或打印中"),
    ("recon.charges", "charges (amount)", "计费（金额）"),
    ("recon.refunds", "refunds (amount)", "退款（金额）"),
    ("recon.no_differences", "No differences.", "没有差异。"),
    ("recon.twice", "Printed more than once", "重复打印"),
    ("recon.expected_not_printed", "Expected but not printed", "应打未打"),
    ("recon.printed_not_expected", "Printed but not expected", "多打"),
    (
        "recon.device_printed_broker_not",
        "Printed by the device, not by the broker's account",
        "设备已打印，平台未记为已打印",
    ),
    (
        "recon.broker_printed_device_not",
        "Printed by the broker's account, not in the device log",
        "平台记为已打印，设备日志未记录",
    ),
    (
        "recon.no_device_log",
        "The store's agents uploaded no device log for this day.",
        "门店代理未上传当日的设备日志。",
    ),
    ("recon.timezone", "Time zone", "时区"),
    ("day.title", "The day in pictures", "当天概览图"),
    ("day.tickets", "tickets", "张小票"),
    ("day.per_hour", "Tickets per hour", "每小时小票数"),
    ("day.no_tickets", "No tickets this day.", "当天没有小票。"),
    ("day.to_paper", "Time from order to paper", "从下单到出纸的时间"),
    ("day.median", "half printed within", "一半在此时间内出纸"),
    ("day.p95", "95 % printed within", "95% 在此时间内出纸"),
    ("day.printed", "printed", "已打印"),
    ("day.no_prints", "Nothing printed this day yet.", "当天还没有打印完成的小票。"),
    (
        "day.to_paper_legend",
        "Per hour: the narrow bar is the time half the tickets were printed within, the wide bar the time 95 % were.",
        "每小时：窄条是一半小票的出纸时间，宽条是 95% 小票的出纸时间。",
    ),
    ("day.trouble", "Failed or in doubt", "失败或存疑"),
    ("day.no_trouble", "Nothing failed or was in doubt this day.", "当天没有失败或存疑的小票。"),
    ("day.by_reason", "By reason", "按原因"),
    ("day.by_printer", "By printer", "按打印机"),
    ("operators.title", "Operators", "操作员"),
    ("operators.create", "New operator", "新建操作员"),
    ("operators.id", "Login name", "登录名"),
    ("operators.name", "Name", "姓名"),
    ("operators.role", "Role", "角色"),
    ("operators.stores", "Stores", "门店"),
    ("operators.password", "Password (at least 10 characters)", "密码（至少 10 个字符）"),
    ("operators.created", "Operator created.", "操作员已创建。"),
    ("operators.disabled", "login disabled", "登录已停用"),
    ("operators.locked", "locked out after failed logins until", "因登录失败被锁定，直到"),
    ("operators.you", "you", "本人"),
    ("operators.disable", "Disable login", "停用登录"),
    ("operators.enable", "Enable login", "启用登录"),
    ("operators.unlock", "Unlock", "解除锁定"),
    ("operators.sign_out", "Sign out everywhere", "在所有设备上退出"),
    ("operators.new_password", "New password", "新密码"),
    ("operators.set_password", "Set password", "设置密码"),
    ("operators.done.disable", "Login disabled; every session has ended.", "登录已停用，所有会话已结束。"),
    ("operators.done.enable", "Login enabled again.", "登录已重新启用。"),
    ("operators.done.unlock", "Lock-out lifted: the operator can log in again.", "已解除锁定，该操作员可以重新登录。"),
    ("operators.done.sign_out", "Signed out everywhere.", "已在所有设备上退出。"),
    ("operators.done.password", "Password set; every session has ended.", "密码已设置，所有会话已结束。"),
    ("role.staff", "staff", "店员"),
    ("role.manager", "manager", "经理"),
    ("error.title", "Something is wrong", "出错了"),
    ("error.back", "Back", "返回"),
    ("state.pending", "waiting", "等待中"),
    ("state.sent", "printing", "打印中"),
    ("state.retrying", "will retry", "等待重试"),
    ("state.printed", "printed", "已打印"),
    ("state.failed", "failed", "失败"),
    ("state.in_doubt", "in doubt", "存疑"),
    ("state.transferred", "moved", "已转移"),
    ("state.cancelled", "cancelled", "已取消"),
    ("state.closed", "closed", "已关闭"),
    ("state.unknown", "unknown", "未知"),
    ("live.on", "Live", "实时"),
    ("live.off", "Reconnecting…", "正在重连…"),
    ("time.store", "store time", "门店时间"),
    ("ev.submitted", "Received from the order system", "已收到点单系统的打印请求"),
    ("ev.created_reprint", "Created as a reprint", "作为重打创建"),
    ("ev.created_transfer", "Moved here from another printer", "从其他打印机转到这里"),
    ("ev.created_failover", "Continued here because its printer could not print", "原打印机无法打印，转到这里继续"),
    ("ev.fetched", "The printer picked the ticket up", "打印机已取走小票"),
    ("ev.sent_again", "Sent again: no answer came in time", "未及时收到回应，已重新发送"),
    ("ev.sent_agent", "Sent to the shop's print agent", "已发送到门店的打印代理"),
    ("ev.sent", "Sent to the printer", "已发送到打印机"),
    ("ev.printed", "The printer confirmed it printed", "打印机已确认打印"),
    (
        "ev.printed_status",
        "The printer took it and reported no problem (this printer cannot confirm each ticket)",
        "打印机已接收且未报告问题（此打印机无法逐张确认）",
    ),
    ("ev.in_doubt", "No confirmation came: it may or may not have printed", "未收到确认：可能已打印，也可能没有"),
    ("ev.retrying", "It did not print; it will be tried again", "未打印，稍后会再试"),
    ("ev.failed", "Given up: it did not print", "已放弃：未打印"),
    ("ev.closed", "Marked as printed by hand", "已手动标记为已打印"),
    ("ev.cancelled", "Cancelled and refunded", "已取消并退款"),
    ("ev.transferred", "Moved to another printer", "已转到其他打印机"),
    ("ev.pending", "Waiting for its printer", "等待打印机"),
    ("ev.no_answer", "no answer in time", "未及时回应"),
    ("who.operator", "by", "操作员"),
    ("who.api", "by the order system", "点单系统"),
    ("who.agent", "by the shop's print agent", "门店打印代理"),
    ("who.printer", "by the printer", "打印机"),
    ("who.engine", "automatically", "系统自动"),
];

#[cfg(test)]
mod tests {
    use super::*;

    fn with_accept(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(axum::http::header::ACCEPT_LANGUAGE, v.parse().unwrap());
        h
    }

    #[test]
    fn accept_language_picks_the_best_spoken_language() {
        assert_eq!(Lang::of(&with_accept("zh-CN,zh;q=0.9,en;q=0.8")), Lang::Zh);
        assert_eq!(Lang::of(&with_accept("de-DE,en;q=0.5,zh;q=0.4")), Lang::En);
        assert_eq!(Lang::of(&with_accept("fr")), Lang::En);
        assert_eq!(Lang::of(&HeaderMap::new()), Lang::En);
        let mut h = with_accept("en");
        h.insert(axum::http::header::COOKIE, "op_lang=zh".parse().unwrap());
        assert_eq!(Lang::of(&h), Lang::Zh, "the switch wins");
    }

    #[test]
    fn every_key_has_both_languages() {
        for (k, en, zh) in TEXTS {
            assert!(!en.is_empty() && !zh.is_empty(), "{k}");
        }
        assert_eq!(Lang::Zh.reason("no_paper"), "缺纸 — 装纸后会自动继续打印");
        // The codes a ticket's last error holds are said in words, not shown as codes.
        for code in [
            "no_paper",
            "cover_open",
            "paper_jam",
            "offline",
            "agent offline",
            "in_doubt",
            "unrenderable",
            "refused",
            "error",
        ] {
            for lang in [Lang::En, Lang::Zh] {
                let said = lang.reason(code);
                assert!(said != code && !said.starts_with(lang.t("why.error")), "{code}: {said}");
            }
        }
    }
}
