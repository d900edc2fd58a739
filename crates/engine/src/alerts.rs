//! Alerts: events written to the outbox in the same transaction as the change they
//! report, delivered to the tenant's webhook endpoints with retries and backoff, each
//! signed with HMAC-SHA256 over `timestamp.body` so receivers can check who sent it and
//! refuse replays, each with a unique id so receivers can drop duplicates.
//!
//! Delivery is at least once: an endpoint may see an event twice (a 2xx lost on the way
//! back), never zero times while the broker runs, and must deduplicate on the event id.
//!
//! An endpoint may also be a chat group's bot, where the shop's staff already are: the
//! event is then written as the bot's text message in plain words, in Chinese and English
//! ([`AlertFormat`], docs/OPERATIONS.md "Alerts"), signed the way that bot checks
//! signatures, and counted as delivered only when the bot's answer says it took the
//! message (WeCom and DingTalk answer 200 with an `errcode` even when they refuse one).

use std::sync::Arc;
use std::time::Duration;

use hmac::{Hmac, Mac};
use onceprint_core::{Millis, TaskId};
use onceprint_store::{OutboxEvent, Store, Task, WebhookAttempt};
use rand::RngCore;
use sha2::Sha256;

use crate::clock::{now_ms, rfc3339};
use crate::StoreSignals;

/// Header carrying `t=UNIX_SECONDS,v1=HEX_HMAC`.
pub const SIGNATURE_HEADER: &str = "x-onceprint-signature";
pub const EVENT_ID_HEADER: &str = "x-onceprint-event-id";
pub const EVENT_TYPE_HEADER: &str = "x-onceprint-event-type";

/// Event kinds an endpoint can subscribe to.
/// `printer.refused_message`: a printer's device (MQTT) sent an answer about a task that
/// is not its printer's; it was refused.
/// `printer.paused` / `printer.resumed`: a printer's own state (no paper, cover open, paper
/// jam, offline) started or stopped holding its lane, once per printer.
/// `offline_task.rejected`: the broker could not take a task a store agent accepted on
/// its shop's LAN while the broker was unreachable; the agent keeps it for a person.
pub const EVENT_KINDS: [&str; 11] = [
    "task.failed",
    "task.in_doubt",
    "task.printed",
    "printer.offline",
    "printer.online",
    "printer.stalled",
    "printer.paused",
    "printer.resumed",
    "printer.refused_message",
    "agent.offline",
    "offline_task.rejected",
];

/// The event of a test message a person asked for (`POST /v1/webhooks/{id}/test`); sent
/// to that endpoint alone.
pub const TEST_EVENT: &str = "webhook.test";

/// How an endpoint's events are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlertFormat {
    /// The event as JSON, signed with HMAC-SHA256 (`x-onceprint-signature`).
    Onceprint,
    /// A WeCom (企业微信) group robot: `{"msgtype":"text","text":{"content":…}}`; the answer's
    /// `errcode` must be 0. WeCom takes at most 2048 bytes of content.
    Wecom,
    /// A DingTalk (钉钉) custom robot: the same message; with a signing secret (`SEC…`), the
    /// URL carries `timestamp` (ms) and `sign` = Base64(HMAC-SHA256(secret,
    /// `timestamp + "\n" + secret`)), URL-encoded; the answer's `errcode` must be 0.
    Dingtalk,
    /// A Feishu/Lark (飞书) custom bot: `{"msg_type":"text","content":{"text":…}}`; with a
    /// signing secret, `timestamp` (s) and `sign` = Base64(HMAC-SHA256 keyed with
    /// `timestamp + "\n" + secret` over nothing) in the body; the answer's `code` must be 0.
    Feishu,
    /// A Slack incoming webhook: `{"text":…}`; any 2xx.
    Slack,
}

impl AlertFormat {
    pub const NAMES: [&'static str; 5] = ["onceprint", "wecom", "dingtalk", "feishu", "slack"];

    pub fn parse(s: &str) -> Option<AlertFormat> {
        Some(match s {
            "onceprint" => AlertFormat::Onceprint,
            "wecom" => AlertFormat::Wecom,
            "dingtalk" => AlertFormat::Dingtalk,
            "feishu" => AlertFormat::Feishu,
            "slack" => AlertFormat::Slack,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            AlertFormat::Onceprint => "onceprint",
            AlertFormat::Wecom => "wecom",
            AlertFormat::Dingtalk => "dingtalk",
            AlertFormat::Feishu => "feishu",
            AlertFormat::Slack => "slack",
        }
    }

    /// Whether the endpoint is a chat bot, whose signing secret is optional (the bot's own,
    /// given by the person who set it up).
    pub fn is_bot(self) -> bool {
        self != AlertFormat::Onceprint
    }
}

/// One POST to an endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlertRequest {
    pub url: String,
    pub body: String,
    pub headers: Vec<(&'static str, String)>,
}

/// WeCom's limit on a text message's content, in bytes.
const WECOM_MAX_BYTES: usize = 2048;

fn hmac_sha256(key: &[u8], msg: &[u8]) -> Vec<u8> {
    match <Hmac<Sha256> as Mac>::new_from_slice(key) {
        Ok(mut mac) => {
            mac.update(msg);
            mac.finalize().into_bytes().to_vec()
        }
        // HMAC accepts keys of any length; this arm is unreachable in practice, and an
        // empty signature is refused by the bot, visibly.
        Err(_) => Vec::new(),
    }
}

fn base64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// `application/x-www-form-urlencoded` escaping of one value (DingTalk's `sign`).
fn url_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3 / 2);
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => out.push(char::from(b)),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// At most `max` bytes of `s`, cut at a character boundary, with "…" when cut.
fn cut_to_bytes(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max.saturating_sub("…".len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// The POST for one event to an endpoint of `format`, at `now`.
pub fn request_for(
    format: AlertFormat,
    url: &str,
    secret: &str,
    event_id: &str,
    payload: &str,
    now: Millis,
) -> AlertRequest {
    let mut headers = vec![("content-type", "application/json".to_owned()), (EVENT_ID_HEADER, event_id.to_owned())];
    let text = || message_text(payload);
    let (url, body) = match format {
        AlertFormat::Onceprint => {
            headers.push((SIGNATURE_HEADER, signature(secret, now / 1000, payload)));
            (url.to_owned(), payload.to_owned())
        }
        AlertFormat::Wecom => {
            let content = cut_to_bytes(&text(), WECOM_MAX_BYTES);
            (url.to_owned(), serde_json::json!({"msgtype": "text", "text": {"content": content}}).to_string())
        }
        AlertFormat::Dingtalk => {
            let body = serde_json::json!({"msgtype": "text", "text": {"content": text()}}).to_string();
            if secret.is_empty() {
                (url.to_owned(), body)
            } else {
                let sign = base64(&hmac_sha256(secret.as_bytes(), format!("{now}\n{secret}").as_bytes()));
                let sep = if url.contains('?') { '&' } else { '?' };
                (format!("{url}{sep}timestamp={now}&sign={}", url_escape(&sign)), body)
            }
        }
        AlertFormat::Feishu => {
            let mut body = serde_json::json!({"msg_type": "text", "content": {"text": text()}});
            if !secret.is_empty() {
                let ts = (now / 1000).to_string();
                body["timestamp"] = serde_json::Value::String(ts.clone());
                body["sign"] =
                    serde_json::Value::String(base64(&hmac_sha256(format!("{ts}\n{secret}").as_bytes(), b"")));
            }
            (url.to_owned(), body.to_string())
        }
        AlertFormat::Slack => (url.to_owned(), serde_json::json!({"text": text()}).to_string()),
    };
    AlertRequest { url, body, headers }
}

/// Whether an endpoint took the message, from its answer: `Err` says why not.
pub fn accepted(format: AlertFormat, status: u16, body: &str) -> Result<(), String> {
    if !(200..300).contains(&status) {
        return Err(format!("HTTP {status}"));
    }
    let field = match format {
        AlertFormat::Onceprint | AlertFormat::Slack => return Ok(()),
        AlertFormat::Wecom | AlertFormat::Dingtalk => "errcode",
        AlertFormat::Feishu => "code",
    };
    let v: serde_json::Value =
        serde_json::from_str(body).map_err(|_| format!("HTTP {status} without the bot's JSON answer"))?;
    // Feishu's older answers carry `StatusCode` instead of `code`.
    let code = v.get(field).or_else(|| v.get("StatusCode")).and_then(serde_json::Value::as_i64);
    match code {
        Some(0) => Ok(()),
        Some(c) => {
            let msg = ["errmsg", "msg", "StatusMessage"].iter().find_map(|k| v.get(*k).and_then(|m| m.as_str()));
            Err(format!("{field} {c}: {}", msg.unwrap_or("")))
        }
        None => Err(format!("HTTP {status} without {field}")),
    }
}

/// What a printer's or task's reason word means, in both languages.
fn reason_words(reason: &str) -> String {
    let zh = match reason {
        "no_paper" => "缺纸",
        "cover_open" => "纸仓盖打开",
        "paper_jam" => "卡纸",
        "offline" => "离线",
        _ => "",
    };
    let en = reason.replace('_', " ");
    if zh.is_empty() {
        en
    } else {
        format!("{zh} {en}")
    }
}

/// The event as one or two lines a person reads in a chat group: what happened, in Chinese
/// and English, then which ticket or printer. Starts with "onceprint" so that a bot that
/// only takes messages with a keyword can be set up with that word.
pub fn message_text(payload: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(payload).unwrap_or(serde_json::Value::Null);
    let kind = v["type"].as_str().unwrap_or("");
    let d = &v["data"];
    let s = |k: &str| d[k].as_str().unwrap_or("").to_owned();
    let what = match kind {
        "task.failed" => "打印失败 Ticket failed",
        "task.in_doubt" => "可能已打印，请确认 Ticket in doubt: check whether it printed",
        "task.printed" => "已打印 Ticket printed",
        "printer.offline" => "打印机离线 Printer offline",
        "printer.online" => "打印机恢复在线 Printer back online",
        "printer.paused" => "打印机暂停 Printer paused",
        "printer.resumed" => "打印机恢复正常 Printer back to normal",
        "printer.stalled" => "打印队列停滞 Printer's queue stalled",
        "printer.refused_message" => "拒绝了设备消息 Device message refused",
        "agent.offline" => "门店代理离线 Store agent offline",
        "offline_task.rejected" => "离线订单未被接受，需人工处理 Offline ticket rejected: a person decides",
        TEST_EVENT => "测试消息：告警可以送达此群 Test message: alerts reach this group",
        other => other,
    };
    let mut about = Vec::new();
    if !s("biz_no").is_empty() {
        about.push(format!("单号 ticket {}", s("biz_no")));
    }
    if !s("printer_id").is_empty() {
        about.push(format!("打印机 printer {}", s("printer_id")));
    }
    if !s("store_id").is_empty() {
        about.push(format!("门店 store {}", s("store_id")));
    }
    let reason = [s("last_error"), s("reason")].into_iter().find(|r| !r.is_empty()).map(|r| reason_words(&r));
    let mut text = format!("onceprint: {what}");
    if !about.is_empty() {
        text.push_str(&format!("\n{}", about.join(" · ")));
    }
    if let Some(r) = reason {
        text.push_str(&format!("\n{r}"));
    }
    text
}

/// A fresh, unique event id.
pub fn new_event_id(now: Millis) -> String {
    let mut random = [0u8; 10];
    rand::thread_rng().fill_bytes(&mut random);
    format!("evt_{}", TaskId::from_parts(now, random))
}

/// The alert for a task that reached `state`, if that state is alerted on.
pub fn task_event(
    task: &Task,
    state: onceprint_core::TaskState,
    last_error: Option<&str>,
    reason: &str,
    now: Millis,
) -> Option<OutboxEvent> {
    let kind = match state {
        onceprint_core::TaskState::Failed => "task.failed",
        onceprint_core::TaskState::InDoubt => "task.in_doubt",
        onceprint_core::TaskState::Printed => "task.printed",
        _ => return None,
    };
    let event_id = new_event_id(now);
    let payload = TaskAlert {
        created_at: rfc3339(now),
        data: TaskAlertData {
            attempts: task.attempts,
            biz_no: &task.biz_no,
            last_error,
            print_type: &task.print_type,
            printer_id: &task.printer_id,
            reason,
            state: state.as_str(),
            store_id: &task.store_id,
            task_id: &task.task_id,
        },
        id: &event_id,
        tenant_id: &task.tenant_id,
        kind,
    };
    // Serialising borrowed fields cannot fail; an empty payload would only mean a bug.
    let payload = serde_json::to_string(&payload).unwrap_or_default();
    Some(OutboxEvent { event_id, tenant_id: task.tenant_id.clone(), kind: kind.into(), payload, now })
}

/// A task alert's body. Typed rather than built as a `serde_json::Value`: every `printed`
/// ack builds one (the store drops it when no endpoint wants it), and the value tree's
/// allocations were about 5 % of the broker's time in delivery. The fields are in the
/// alphabetical order the `Value` map wrote them in, so the bytes sent stay the same.
#[derive(serde::Serialize)]
struct TaskAlert<'a> {
    created_at: String,
    data: TaskAlertData<'a>,
    id: &'a str,
    tenant_id: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
}

#[derive(serde::Serialize)]
struct TaskAlertData<'a> {
    attempts: i32,
    biz_no: &'a str,
    last_error: Option<&'a str>,
    print_type: &'a str,
    printer_id: &'a str,
    reason: &'a str,
    state: &'a str,
    store_id: &'a str,
    task_id: &'a str,
}

/// `t=…,v1=…` for `body` sent at `timestamp` (Unix seconds).
pub fn signature(secret: &str, timestamp: i64, body: &str) -> String {
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret.as_bytes()) {
        Ok(m) => m,
        // HMAC accepts keys of any length; this arm is unreachable in practice.
        Err(_) => return format!("t={timestamp},v1="),
    };
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body.as_bytes());
    let hex: String = mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect();
    format!("t={timestamp},v1={hex}")
}

/// Tuning of webhook delivery.
#[derive(Debug, Clone)]
pub struct AlertConfig {
    pub poll_interval_ms: u64,
    pub timeout_ms: u64,
    /// First retry after this long, doubling to `max_backoff_ms`.
    pub first_backoff_ms: i64,
    pub max_backoff_ms: i64,
    /// Attempts before giving up on one event for one endpoint.
    pub max_attempts: i32,
}

impl Default for AlertConfig {
    fn default() -> Self {
        AlertConfig {
            poll_interval_ms: 500,
            timeout_ms: 10_000,
            first_backoff_ms: 1_000,
            max_backoff_ms: 300_000,
            max_attempts: 20,
        }
    }
}

/// Delivers due webhook deliveries until shutdown.
///
/// Only the node holding `lease` delivers, so two nodes never POST one delivery at once; it
/// looks at the lease again before each POST. A delivery POSTed just before the lease was
/// lost, whose attempt was not recorded, is POSTed again by the next holder: each event id
/// is delivered at least once, and receivers deduplicate by the event id header.
pub fn spawn_deliverer(
    store: Arc<dyn Store>,
    signals: Arc<StoreSignals>,
    config: AlertConfig,
    lease: crate::Lease,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let client = match reqwest::Client::builder().timeout(Duration::from_millis(config.timeout_ms)).build() {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "cannot build the webhook client; alerts stay in the outbox");
                return;
            }
        };
        let mut tick = tokio::time::interval(Duration::from_millis(config.poll_interval_ms));
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = signals.shutdown() => return,
            }
            if !lease.is_held() {
                continue;
            }
            let due = match store.due_webhooks(now_ms(), 100).await {
                Ok(d) => d,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read due webhooks");
                    continue;
                }
            };
            for d in due {
                if !lease.is_held() {
                    break;
                }
                let now = now_ms();
                // A format this version does not know is sent as onceprint's own event,
                // which a bot refuses visibly (the delivery history says so).
                let format = AlertFormat::parse(&d.format).unwrap_or(AlertFormat::Onceprint);
                let req = request_for(format, &d.url, &d.secret, &d.event_id, &d.payload, now);
                let mut post = client.post(&req.url).body(req.body);
                for (name, value) in &req.headers {
                    post = post.header(*name, value);
                }
                let (delivered, status, error) = match post.send().await {
                    Ok(r) => {
                        let code = r.status().as_u16();
                        // Bots answer in a small JSON body; a body that does not arrive
                        // counts as no answer, and the delivery is tried again.
                        let body = if format.is_bot() { r.text().await.unwrap_or_default() } else { String::new() };
                        match accepted(format, code, &body) {
                            Ok(()) => (true, Some(i32::from(code)), None),
                            Err(why) => (false, Some(i32::from(code)), Some(why)),
                        }
                    }
                    Err(e) => (false, None, Some(e.to_string())),
                };
                let attempts = d.attempts + 1;
                let next = if delivered || attempts >= config.max_attempts {
                    None
                } else {
                    let exp = (attempts - 1).clamp(0, 30) as u32;
                    Some(now + config.first_backoff_ms.saturating_mul(1 << exp).min(config.max_backoff_ms))
                };
                if !delivered {
                    tracing::warn!(event = %d.event_id, webhook = %d.webhook_id, attempts, error = ?error, "webhook delivery failed");
                }
                let attempt = WebhookAttempt {
                    event_id: d.event_id,
                    webhook_id: d.webhook_id,
                    delivered,
                    status,
                    error,
                    next_attempt_at: next,
                    now,
                };
                if let Err(e) = store.record_webhook_attempt(&attempt).await {
                    tracing::warn!(error = %e, "cannot record a webhook attempt");
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_alert_has_the_fields_and_bytes_of_the_value_it_replaced() {
        let task = Task {
            tenant_id: "t\"1".into(),
            biz_no: "B-é".into(),
            ..crate::offline::tests::task(onceprint_core::TaskState::Sent, "f")
        };
        for (state, error) in
            [(onceprint_core::TaskState::Printed, None), (onceprint_core::TaskState::Failed, Some("no_paper"))]
        {
            let e = task_event(&task, state, error, "why \n", 1_700_000_000_123).expect("an alerted state");
            let kind = if error.is_some() { "task.failed" } else { "task.printed" };
            let before = serde_json::json!({
                "id": e.event_id,
                "type": kind,
                "created_at": rfc3339(1_700_000_000_123),
                "tenant_id": task.tenant_id,
                "data": {
                    "task_id": task.task_id,
                    "biz_no": task.biz_no,
                    "store_id": task.store_id,
                    "printer_id": task.printer_id,
                    "print_type": task.print_type,
                    "state": state.as_str(),
                    "attempts": task.attempts,
                    "last_error": error,
                    "reason": "why \n",
                }
            });
            assert_eq!(e.payload, before.to_string());
            assert_eq!(e.kind, kind);
        }
        assert!(task_event(&task, onceprint_core::TaskState::Sent, None, "", 1).is_none());
    }

    #[test]
    fn bot_messages_are_signed_as_each_bot_checks() {
        let payload = r#"{"type":"printer.paused","data":{"printer_id":"p1","reason":"no_paper"}}"#;
        let now = 1_700_000_000_123;
        let wecom = request_for(AlertFormat::Wecom, "http://h/send?key=k", "", "evt_1", payload, now);
        assert_eq!(wecom.url, "http://h/send?key=k");
        let body: serde_json::Value = serde_json::from_str(&wecom.body).unwrap();
        assert_eq!(body["msgtype"], "text");
        assert_eq!(body["text"]["content"], "onceprint: 打印机暂停 Printer paused\n打印机 printer p1\n缺纸 no paper");
        // DingTalk: printf '%s\n%s' 1700000000123 SECabc | openssl dgst -sha256 -hmac SECabc -binary | base64
        let ding =
            request_for(AlertFormat::Dingtalk, "http://h/robot/send?access_token=t", "SECabc", "e", payload, now);
        let sign = base64(&hmac_sha256(b"SECabc", b"1700000000123\nSECabc"));
        assert_eq!(
            ding.url,
            format!("http://h/robot/send?access_token=t&timestamp=1700000000123&sign={}", url_escape(&sign))
        );
        // Feishu: the key is `timestamp\nsecret`, the message empty.
        let feishu = request_for(AlertFormat::Feishu, "http://h/hook/x", "s3cret", "e", payload, now);
        let body: serde_json::Value = serde_json::from_str(&feishu.body).unwrap();
        assert_eq!((body["msg_type"].as_str(), body["timestamp"].as_str()), (Some("text"), Some("1700000000")));
        assert_eq!(body["sign"].as_str(), Some(base64(&hmac_sha256(b"1700000000\ns3cret", b"")).as_str()));
        let slack = request_for(AlertFormat::Slack, "http://h/services/x", "", "e", payload, now);
        assert!(serde_json::from_str::<serde_json::Value>(&slack.body).unwrap()["text"].is_string());
        assert_eq!(url_escape("a+b/c=="), "a%2Bb%2Fc%3D%3D");
        let long = "长".repeat(1000);
        assert!(cut_to_bytes(&long, WECOM_MAX_BYTES).len() <= WECOM_MAX_BYTES);
    }

    #[test]
    fn a_bot_took_the_message_only_when_its_answer_says_so() {
        assert!(accepted(AlertFormat::Wecom, 200, r#"{"errcode":0,"errmsg":"ok"}"#).is_ok());
        let limited = accepted(AlertFormat::Wecom, 200, r#"{"errcode":45009,"errmsg":"api freq out of limit"}"#);
        assert_eq!(limited, Err("errcode 45009: api freq out of limit".into()));
        assert!(accepted(AlertFormat::Dingtalk, 200, r#"{"errcode":310000,"errmsg":"sign not match"}"#).is_err());
        assert!(accepted(AlertFormat::Feishu, 200, r#"{"code":0,"msg":"success"}"#).is_ok());
        assert!(accepted(AlertFormat::Feishu, 200, r#"{"StatusCode":0}"#).is_ok());
        assert!(accepted(AlertFormat::Feishu, 200, r#"{"code":19021,"msg":"sign match fail"}"#).is_err());
        assert!(accepted(AlertFormat::Wecom, 200, "not json").is_err());
        assert!(accepted(AlertFormat::Slack, 200, "ok").is_ok());
        assert!(accepted(AlertFormat::Slack, 404, "no_service").is_err());
        assert!(accepted(AlertFormat::Onceprint, 204, "").is_ok());
    }

    #[test]
    fn signature_matches_openssl() {
        // printf '%s' '1700000000.{"a":1}' | openssl dgst -sha256 -hmac secret
        assert_eq!(
            signature("secret", 1_700_000_000, r#"{"a":1}"#),
            "t=1700000000,v1=49f24e537407743fa4a0242bb63b94b9a47ee99cbbe071ccd8a22550ae411686"
        );
    }
}
