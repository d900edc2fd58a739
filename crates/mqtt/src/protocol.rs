//! The two device protocols on the wire: topics and JSON payloads (docs/MQTT.md).
//!
//! - Star CloudPRNT Version MQTT (Full MQTT): `star/cloudprnt/to-device/{mac}/print-job`
//!   and `…/request-client-status` out; `star/cloudprnt/to-server/{mac}/print-result`,
//!   `…/client-status` and `…/client-will` in. A job's `jobToken` names one task and
//!   attempt; the printer answers a token it has seen among its last ten with a
//!   "duplicate, not printed" result.
//! - onceprint's device protocol: `onceprint/v1/to-device/{device}/job` and
//!   `…/status-request` out; `onceprint/v1/to-server/{device}/result` and `…/status` (also
//!   the device's last will) in. A job carries the task id, the attempt and the
//!   idempotency key; the device keeps a journal of keys and prints each key once.
//!
//! Everything here is pure: topics and bytes in, typed messages out.

use base64::Engine as _;
use onceprint_core::results::{self, Condition};
use onceprint_core::{Outcome, Proof};
use onceprint_engine::transport::MqttProtocol;
use serde::{Deserialize, Serialize};

pub const STAR_TO_DEVICE: &str = "star/cloudprnt/to-device";
pub const STAR_TO_SERVER: &str = "star/cloudprnt/to-server";
pub const DEVICE_TO_DEVICE: &str = "onceprint/v1/to-device";
pub const DEVICE_TO_SERVER: &str = "onceprint/v1/to-server";

/// What the broker subscribes to: everything every device publishes.
pub fn subscriptions() -> Vec<String> {
    vec![format!("{STAR_TO_SERVER}/#"), format!("{DEVICE_TO_SERVER}/#")]
}

/// A device as its topics name it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DeviceAddr {
    pub protocol: MqttProtocol,
    /// The MAC in lower case (CloudPRNT) or the device id (onceprint).
    pub device: String,
}

impl DeviceAddr {
    pub fn new(protocol: MqttProtocol, device: &str) -> DeviceAddr {
        let device = match protocol {
            MqttProtocol::Cloudprnt => device.to_ascii_lowercase(),
            MqttProtocol::Onceprint => device.to_owned(),
        };
        DeviceAddr { protocol, device }
    }

    /// The topics the device may read (`…/to-device/{dev}/#`).
    pub fn to_device_filter(&self) -> String {
        format!("{}/{}/#", self.to_device_prefix(), self.device)
    }

    /// The topics the device may publish on (`…/to-server/{dev}/#`).
    pub fn to_server_filter(&self) -> String {
        let prefix = match self.protocol {
            MqttProtocol::Cloudprnt => STAR_TO_SERVER,
            MqttProtocol::Onceprint => DEVICE_TO_SERVER,
        };
        format!("{prefix}/{}/#", self.device)
    }

    fn to_device_prefix(&self) -> &'static str {
        match self.protocol {
            MqttProtocol::Cloudprnt => STAR_TO_DEVICE,
            MqttProtocol::Onceprint => DEVICE_TO_DEVICE,
        }
    }

    /// Where a job goes.
    pub fn job_topic(&self) -> String {
        match self.protocol {
            MqttProtocol::Cloudprnt => format!("{STAR_TO_DEVICE}/{}/print-job", self.device),
            MqttProtocol::Onceprint => format!("{DEVICE_TO_DEVICE}/{}/job", self.device),
        }
    }

    /// A request for the device to publish its status now, with its payload.
    pub fn status_request(&self) -> (String, Vec<u8>) {
        match self.protocol {
            MqttProtocol::Cloudprnt => (
                format!("{STAR_TO_DEVICE}/{}/request-client-status", self.device),
                br#"{"title":"request-client-status"}"#.to_vec(),
            ),
            MqttProtocol::Onceprint => {
                (format!("{DEVICE_TO_DEVICE}/{}/status-request", self.device), br#"{"v":1}"#.to_vec())
            }
        }
    }
}

/// What a device said, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// The outcome of one job.
    Result(JobResult),
    /// How the device is (its last will included: `online: false`).
    Status(Status),
    /// A method the broker has no use for (logged, acknowledged).
    Ignored(String),
}

/// The outcome of one job as the device reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobResult {
    pub task_id: String,
    pub attempt: i32,
    pub outcome: Outcome,
    /// What the result proves about paper (the protocol's table in
    /// `onceprint_core::results`).
    pub proof: Proof,
    pub detail: String,
    /// The idempotency key the device printed under (onceprint devices), checked against
    /// the task's.
    pub key: Option<String>,
}

/// A device's status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub online: bool,
    /// What the status says about the printer, in ack outcomes (`Printed` = ready), so it
    /// is recorded with the spellings every other path uses.
    pub condition: Outcome,
    pub detail: String,
    /// Changes on every connection of an onceprint device.
    pub connection: Option<String>,
}

/// Splits `…/to-server/{device}/{method}` into the device and the method.
pub fn parse_topic(topic: &str) -> Option<(DeviceAddr, &str)> {
    let (protocol, rest) = if let Some(rest) = topic.strip_prefix(STAR_TO_SERVER) {
        (MqttProtocol::Cloudprnt, rest)
    } else if let Some(rest) = topic.strip_prefix(DEVICE_TO_SERVER) {
        (MqttProtocol::Onceprint, rest)
    } else {
        return None;
    };
    let rest = rest.strip_prefix('/')?;
    let (device, method) = rest.split_once('/')?;
    if device.is_empty() || method.is_empty() || method.contains('/') {
        return None;
    }
    Some((DeviceAddr::new(protocol, device), method))
}

/// The CloudPRNT job token of one attempt of a task: `{task_id}.{attempt}`. Every attempt
/// has its own token (a printer that could not print a job must be sent a new one, and
/// remembers tokens it refused); every re-send of one attempt has the same token, which
/// the printer refuses to print twice.
pub fn job_token(task_id: &str, attempt: i32) -> String {
    format!("{task_id}.{attempt}")
}

/// The task and attempt a job token names.
pub fn parse_token(token: &str) -> Option<(String, i32)> {
    let (task, attempt) = token.rsplit_once('.')?;
    let attempt = attempt.parse::<i32>().ok().filter(|a| *a > 0)?;
    (!task.is_empty()).then(|| (task.to_owned(), attempt))
}

/// A job as it goes out.
pub struct Job<'a> {
    pub task_id: &'a str,
    pub attempt: i32,
    pub key: &'a str,
    pub reprint: bool,
    /// ESC/POS (onceprint devices); a Star printer fetches its job's data instead.
    pub data: &'a [u8],
    /// Where a Star printer fetches the job (the broker's `/cloudprnt` as it reaches it).
    pub url: Option<&'a str>,
}

/// What a Star printer is offered in a `url` print-job: the print area as an image, at
/// its own width (the printer sends `X-Star-Print-Width` with its GET).
pub const STAR_URL_JOB_MEDIA: [&str; 1] = ["image/png"];

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StarPrintJob {
    title: &'static str,
    job_token: String,
    job_type: &'static str,
    media_types: [&'static str; 1],
    print_data: String,
}

#[derive(Serialize)]
struct DeviceJob<'a> {
    v: u32,
    task_id: &'a str,
    attempt: i32,
    key: &'a str,
    reprint: bool,
    content_type: &'static str,
    data: String,
}

/// The payload of a job for a device of `protocol`; `None` for a Star printer whose job
/// URL is not known.
///
/// A Star printer gets a `url` print-job (Star CloudPRNT Protocol Guide, "MQTT Message
/// Payload Specification", `print-job`): it GETs `printData` over HTTP with its own login,
/// as Star's sample server does. A `raw` job would have to carry Star's own command set or
/// plain text (Star's sample server, `mqtt_publish.php`); a raw PNG is refused (510).
pub fn job_payload(protocol: MqttProtocol, job: &Job<'_>) -> Option<Vec<u8>> {
    // Serializing these plain structs cannot fail.
    match protocol {
        MqttProtocol::Cloudprnt => serde_json::to_vec(&StarPrintJob {
            title: "print-job",
            job_token: job_token(job.task_id, job.attempt),
            job_type: "url",
            media_types: STAR_URL_JOB_MEDIA,
            print_data: job.url?.to_owned(),
        }),
        MqttProtocol::Onceprint => serde_json::to_vec(&DeviceJob {
            v: 1,
            task_id: job.task_id,
            attempt: job.attempt,
            key: job.key,
            reprint: job.reprint,
            content_type: "escpos",
            data: base64::engine::general_purpose::STANDARD.encode(job.data),
        }),
    }
    .ok()
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StarResult {
    job_token: String,
    print_succeeded: bool,
    #[serde(default)]
    status_code: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StarStatus {
    #[serde(default)]
    status_code: String,
}

#[derive(Deserialize)]
struct DeviceResult {
    task_id: String,
    attempt: i32,
    key: String,
    result: String,
    #[serde(default)]
    previous: Option<String>,
    #[serde(default)]
    detail: String,
}

#[derive(Deserialize)]
struct DeviceStatus {
    online: bool,
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    detail: String,
    #[serde(default)]
    conn: Option<String>,
}

/// Decodes what a device published on `method`. An error is a message that can never be
/// understood (it is logged and acknowledged, never retried).
pub fn decode(addr: &DeviceAddr, method: &str, payload: &[u8]) -> Result<Message, String> {
    let json = |what: &str| format!("{what}: not the documented JSON");
    match (addr.protocol, method) {
        (MqttProtocol::Cloudprnt, "print-result") => {
            let r: StarResult =
                serde_json::from_slice(payload).map_err(|e| format!("{}: {e}", json("print-result")))?;
            let (task_id, attempt) = parse_token(&r.job_token)
                .ok_or_else(|| format!("print-result: jobToken {:?} is not one of ours", r.job_token))?;
            let code = url_decoded(&r.status_code);
            let (outcome, proof, detail) = star_result_outcome(r.print_succeeded, &code);
            Ok(Message::Result(JobResult { task_id, attempt, outcome, proof, detail, key: None }))
        }
        (MqttProtocol::Cloudprnt, "client-status") => {
            let s: StarStatus =
                serde_json::from_slice(payload).map_err(|e| format!("{}: {e}", json("client-status")))?;
            let code = url_decoded(&s.status_code);
            Ok(Message::Status(Status {
                online: true,
                condition: star_status_condition(&code),
                detail: code,
                connection: None,
            }))
        }
        (MqttProtocol::Cloudprnt, "client-will") => Ok(Message::Status(Status {
            online: false,
            condition: Outcome::Offline,
            detail: "client-will: the printer left the MQTT server".into(),
            connection: None,
        })),
        (MqttProtocol::Onceprint, "result") => {
            let r: DeviceResult = serde_json::from_slice(payload).map_err(|e| format!("{}: {e}", json("result")))?;
            // The device has the key in its journal and did not print it again: the
            // journal's record is the truth. Printed under this key before: paper came
            // out once. Started and never proven: nobody knows.
            let c = results::device::result(&r.result, r.previous.as_deref())
                .ok_or_else(|| format!("result: unknown result {:?}", r.result))?;
            let detail = match (r.result.as_str(), r.previous.as_deref()) {
                ("duplicate", p) => {
                    format!(
                        "the device had this key already ({}); not printed again {}",
                        p.unwrap_or("no record"),
                        r.detail
                    )
                }
                _ => r.detail,
            };
            Ok(Message::Result(JobResult {
                task_id: r.task_id,
                attempt: r.attempt,
                outcome: c.outcome,
                proof: c.proof,
                detail: detail.trim().to_owned(),
                key: Some(r.key),
            }))
        }
        (MqttProtocol::Onceprint, "status") => {
            let s: DeviceStatus = serde_json::from_slice(payload).map_err(|e| format!("{}: {e}", json("status")))?;
            let condition = if !s.online {
                Outcome::Offline
            } else {
                match s.state.as_deref().unwrap_or("ok") {
                    "ok" | "ready" => Outcome::Printed,
                    "no_paper" => Outcome::NoPaper,
                    "cover_open" => Outcome::CoverOpen,
                    "paper_jam" => Outcome::PaperJam,
                    _ => Outcome::Error,
                }
            };
            Ok(Message::Status(Status { online: s.online, condition, detail: s.detail, connection: s.conn }))
        }
        (_, other) => Ok(Message::Ignored(other.to_owned())),
    }
}

/// `200%20OK` → `200 OK` (CloudPRNT sends status codes URL-encoded).
fn url_decoded(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What a CloudPRNT `print-result` means for the task, by Star's table
/// (`onceprint_core::results::star`, docs/RESULT-CODES.md, shared with CloudPRNT over
/// HTTP).
///
/// `printSucceeded: true` is printed. A failure's `statusCode` is looked up in the table:
/// media and download errors (510–512, 520, 521) printed nothing; a stop (410, 411, 420)
/// after the printer took the job may have cut it short; anything else — among it the
/// printer's answer to a token it has seen already ("duplicate, not printed"), whose code
/// Star does not document, and a failure with a 2xx status — says nothing about whether
/// the job (or an earlier copy of it) printed: in doubt. If a result for that attempt was
/// recorded before, the ack rules leave it standing (the attempt is no longer in flight,
/// so this one is stale); if none was, a person decides.
pub fn star_result_outcome(print_succeeded: bool, code: &str) -> (Outcome, Proof, String) {
    if print_succeeded {
        return (Outcome::Printed, Proof::Printed, format!("print-result {code}"));
    }
    let c = results::star::job_result(code);
    match c.row {
        Some(row) if c.proof != Proof::Printed => {
            (c.outcome, c.proof, format!("print-result {code} ({})", row.meaning))
        }
        _ => (
            Outcome::InDoubt,
            Proof::MayHavePrinted,
            format!(
                "print-result {code}: not printed this time, and whether an earlier copy of this job token printed is \
                 unknown (a printer answers a repeated token like this)"
            ),
        ),
    }
}

/// What a CloudPRNT `client-status` code says about the printer.
fn star_status_condition(code: &str) -> Outcome {
    match results::star::condition(code) {
        Condition::Ready => Outcome::Printed,
        Condition::Stopped(o) => o,
        Condition::Fault => Outcome::Error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_name_the_device_and_the_method() {
        let (a, m) = parse_topic("star/cloudprnt/to-server/00:11:62:AA:BB:CC/print-result").expect("star");
        assert_eq!((a.protocol, a.device.as_str(), m), (MqttProtocol::Cloudprnt, "00:11:62:aa:bb:cc", "print-result"));
        let (a, m) = parse_topic("onceprint/v1/to-server/dev-1/result").expect("device");
        assert_eq!((a.protocol, a.device.as_str(), m), (MqttProtocol::Onceprint, "dev-1", "result"));
        assert_eq!(a.job_topic(), "onceprint/v1/to-device/dev-1/job");
        assert_eq!(a.to_device_filter(), "onceprint/v1/to-device/dev-1/#");
        for bad in [
            "star/cloudprnt/to-server/x",
            "star/cloudprnt/to-device/x/print-job",
            "onceprint/v1/to-server//r",
            "other/x/y",
        ] {
            assert!(parse_topic(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn tokens_name_one_attempt() {
        assert_eq!(parse_token(&job_token("01JABC", 3)), Some(("01JABC".into(), 3)));
        assert_eq!(parse_token("foreign-token"), None);
        assert_eq!(parse_token("x.0"), None);
    }

    #[test]
    fn star_results_never_retry_what_may_have_printed() {
        let star = DeviceAddr::new(MqttProtocol::Cloudprnt, "00:11:62:aa:bb:cc");
        let result = |ok: bool, code: &str| {
            let p = format!(
                r#"{{"title":"print-result","jobToken":"T1.2","printSucceeded":{ok},"statusCode":"{code}","printerMAC":"x"}}"#
            );
            match decode(&star, "print-result", p.as_bytes()) {
                Ok(Message::Result(r)) => (r.task_id, r.attempt, r.outcome),
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(result(true, "200%20OK"), ("T1".into(), 2, Outcome::Printed));
        assert_eq!(result(false, "410%20Out%20of%20paper").2, Outcome::NoPaper);
        assert_eq!(result(false, "411").2, Outcome::PaperJam);
        assert_eq!(result(false, "420%20Cover%20open").2, Outcome::CoverOpen);
        assert_eq!(result(false, "510").2, Outcome::Error);
        // The answer to a repeated token, whatever its code: nobody knows.
        assert_eq!(result(false, "200%20OK").2, Outcome::InDoubt);
        assert_eq!(result(false, "7xx").2, Outcome::InDoubt);
        // What each proves, from the table shared with CloudPRNT over HTTP.
        let proof = |ok: bool, code: &str| star_result_outcome(ok, &url_decoded(code)).1;
        assert_eq!(proof(true, "200%20OK"), Proof::Printed);
        assert_eq!(proof(false, "410%20Out%20of%20paper"), Proof::MayHavePrinted);
        assert_eq!(proof(false, "510"), Proof::Refused);
        assert_eq!(proof(false, "520"), Proof::NotPrinted);
        assert_eq!(proof(false, "590%20Duplicate"), Proof::MayHavePrinted);
        assert_eq!(proof(false, "200%20OK"), Proof::MayHavePrinted);
        let will = decode(&star, "client-will", br#"{"title":"client-will","printerMAC":"x"}"#);
        assert!(matches!(will, Ok(Message::Status(Status { online: false, condition: Outcome::Offline, .. }))));
        let status =
            decode(&star, "client-status", br#"{"title":"client-status","statusCode":"410%20Out%20of%20paper"}"#);
        assert!(matches!(status, Ok(Message::Status(Status { online: true, condition: Outcome::NoPaper, .. }))));
    }

    #[test]
    fn device_results_answer_from_the_journal() {
        let dev = DeviceAddr::new(MqttProtocol::Onceprint, "d1");
        let result = |r: &str, previous: &str| {
            let p = format!(r#"{{"task_id":"T","attempt":1,"key":"A#p1","result":"{r}"{previous}}}"#);
            decode(&dev, "result", p.as_bytes()).map(|m| match m {
                Message::Result(r) => r.outcome,
                other => panic!("{other:?}"),
            })
        };
        assert_eq!(result("printed", ""), Ok(Outcome::Printed));
        assert_eq!(result("no_paper", ""), Ok(Outcome::NoPaper));
        assert_eq!(result("duplicate", r#","previous":"printed""#), Ok(Outcome::Printed));
        assert_eq!(result("duplicate", r#","previous":"started""#), Ok(Outcome::InDoubt));
        assert_eq!(result("duplicate", ""), Ok(Outcome::InDoubt));
        assert_eq!(result("error", ""), Ok(Outcome::Error));
        assert_eq!(result("rejected", ""), Ok(Outcome::Error));
        assert!(result("maybe", "").is_err());
        assert!(decode(&dev, "result", b"{").is_err());
        let will = decode(&dev, "status", br#"{"online":false}"#);
        assert!(matches!(will, Ok(Message::Status(Status { online: false, .. }))));
    }

    #[test]
    fn jobs_carry_token_or_key() {
        let url = Some("https://print.example/cloudprnt");
        let job = Job { task_id: "T", attempt: 2, key: "A#p1", reprint: false, data: b"\x1b@hi", url };
        let star: serde_json::Value = job_payload(MqttProtocol::Cloudprnt, &job)
            .and_then(|p| serde_json::from_slice(&p).ok())
            .unwrap_or_default();
        assert_eq!((star["title"].as_str(), star["jobToken"].as_str()), (Some("print-job"), Some("T.2")));
        assert_eq!((star["jobType"].as_str(), star["printData"].as_str()), (Some("url"), url));
        assert_eq!(star["mediaTypes"], serde_json::json!(["image/png"]));
        let dev: serde_json::Value = job_payload(MqttProtocol::Onceprint, &job)
            .and_then(|p| serde_json::from_slice(&p).ok())
            .unwrap_or_default();
        assert_eq!((dev["key"].as_str(), dev["attempt"].as_i64()), (Some("A#p1"), Some(2)));
        let nowhere = Job { url: None, ..job };
        assert!(job_payload(MqttProtocol::Cloudprnt, &nowhere).is_none(), "no URL, no Star job");
        assert!(job_payload(MqttProtocol::Onceprint, &nowhere).is_some());
    }
}
