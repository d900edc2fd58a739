//! The `cloudprnt` transport: Star CloudPRNT (Version HTTP) as a thin adapter on the
//! polled mechanism ([`super::polled`]). It owns the protocol's words: the printer's
//! status codes, the media types the broker offers, the job token on the wire, and what
//! a confirmation's `code` means. Everything about lanes, "fetched" and doubt is the
//! polled mechanism's, and through it the lane engine's.
//!
//! One URL for every printer: `POST /cloudprnt` polls, `GET /cloudprnt?mac=&type=&token=`
//! fetches the job (no side effect the printer can see, repeatable; the broker remembers
//! the fetch), `DELETE /cloudprnt?mac=&code=&token=` (or `GET …&delete`) confirms. A
//! printer authenticates with HTTP Basic (its login from the printer's creation) and
//! must send its own MAC; anything else is refused and changes nothing.

use std::sync::Arc;

use onceprint_core::results::{star, Condition};
use onceprint_core::{Outcome, Proof};

use super::polled::{Fetched, Health, JobToken, PollReport, Polled};
use crate::claimant::Claimant;
use crate::directory::PrinterInfo;
use crate::lanes::{AckResult, DeliveryError};
use crate::transport::{Encoding, MqttProtocol, TransportConfig, TransportKind};

/// How a CloudPRNT printer takes its jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// CloudPRNT Version HTTP: it polls, fetches and confirms over HTTP.
    Http,
    /// CloudPRNT Version MQTT (Full MQTT / Pass URL): jobs and results go over MQTT; it
    /// reads the server-setting file and fetches `url` jobs over HTTP.
    Mqtt,
}

/// The media types the broker offers, in its order of preference: the print area as an
/// image for every job, and plain text only for a job that is plain ASCII text (a Star
/// printer prints `text/plain` as it is, in its own font and code page: Star CloudPRNT
/// Protocol Guide, "Print job requests (GET)"; docs/PRINTERS.md). The text type carries no
/// parameter: some firmware refuses
/// `; charset=…` in it.
pub const MEDIA_TYPES: [&str; 2] = ["image/png", "text/plain"];

/// Why a CloudPRNT request was refused.
#[derive(Debug, thiserror::Error)]
pub enum CloudPrntError {
    /// Wrong MAC for this login (or a login of a printer that is not a CloudPRNT printer).
    #[error("{0}")]
    Unauthorized(String),
    /// No such job or token for this printer.
    #[error("{0}")]
    NoSuchJob(String),
    /// A media type the broker does not offer, or cannot render this job in.
    #[error("{0}")]
    UnsupportedMedia(String),
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Delivery(#[from] DeliveryError),
}

/// A poll as the printer sent it (the JSON body of `POST /cloudprnt`).
#[derive(Debug, Clone, Default)]
pub struct PollIn {
    /// `statusCode`, URL-encoded as the printer sends it (`200%20OK`).
    pub status_code: String,
    pub mac: Option<String>,
    pub job_token: Option<String>,
    pub printing_in_progress: Option<bool>,
}

/// The answer to a poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PollOut {
    pub job_ready: bool,
    pub media_types: Vec<&'static str>,
    pub job_token: Option<String>,
}

/// A fetched job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobData {
    pub content_type: &'static str,
    pub bytes: Vec<u8>,
    pub idempotency_key: String,
    /// The value of the `X-Star-Cut` response header: how the slip ends (Star CloudPRNT
    /// Protocol Guide, "Print job requests (GET)", "Response (GET)"), for an image. Plain
    /// text ends with the printer's own cut.
    pub cut: Option<&'static str>,
}

/// `%XX` escapes decoded (`200%20OK` → `200 OK`); a malformed escape is kept as it is.
pub fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1).copied().and_then(hex), bytes.get(i + 2).copied().and_then(hex)) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What a poll's `statusCode` says about the printer (Star's status codes,
/// `onceprint_core::results::star`): 2xx ready; 41x paper (411 a jam), 42x its cover;
/// other codes are faults that hold its lane.
pub fn health_of(status: &str) -> Health {
    let status = percent_decode(status).trim().to_owned();
    let detail = format!("the printer reports {status}");
    match star::condition(&status) {
        Condition::Ready => Health::Ready,
        Condition::Stopped(outcome) => Health::Blocked { outcome, detail },
        Condition::Fault if status.bytes().take_while(u8::is_ascii_digit).count() >= 3 => Health::Fault(status),
        Condition::Fault => Health::Fault(format!("unreadable status {status:?}")),
    }
}

/// What a confirmation's `code` means for the job it confirms, by Star's table
/// (`onceprint_core::results::star`, docs/RESULT-CODES.md): `OK`, `200 OK` or any 2xx
/// printed; 520 a download that did not complete, printed nothing; 510–512 and 521 data
/// the printer cannot use, printed nothing and fails; a stop (410, 411, 420) or any other
/// code after the printer fetched the job may have printed.
pub fn outcome_of_code(code: &str) -> (Outcome, Proof, String) {
    let code = percent_decode(code).trim().to_owned();
    let c = star::job_result(&code);
    let detail = match c.row {
        Some(r) if r.code == "OK" => "the printer confirmed OK".to_owned(),
        Some(r) => format!("the printer confirmed with {code} ({})", r.meaning),
        None => format!("the printer confirmed with {code:?}, a code Star does not document"),
    };
    (c.outcome, c.proof, detail)
}

/// The CloudPRNT transport.
pub struct CloudPrnt {
    polled: Arc<Polled>,
}

impl CloudPrnt {
    pub fn new(polled: Arc<Polled>) -> CloudPrnt {
        CloudPrnt { polled }
    }

    pub fn polled(&self) -> &Arc<Polled> {
        &self.polled
    }

    /// The printer may speak for `mac`: it is a CloudPRNT printer with that MAC. The poll
    /// may leave its MAC out (`required` false); a fetch or confirmation may not.
    pub fn check(&self, printer: &PrinterInfo, mac: Option<&str>, required: bool) -> Result<(), CloudPrntError> {
        let Some(TransportConfig::Cloudprnt(c)) = &printer.transport else {
            return Err(CloudPrntError::Unauthorized("this login is not a CloudPRNT printer's".into()));
        };
        Self::check_mac(&c.mac, mac, required)
    }

    fn check_mac(own: &str, mac: Option<&str>, required: bool) -> Result<(), CloudPrntError> {
        match mac {
            Some(m) if percent_decode(m).trim().eq_ignore_ascii_case(own) => Ok(()),
            Some(_) => Err(CloudPrntError::Unauthorized("the MAC is not this printer's".into())),
            None if required => Err(CloudPrntError::Unauthorized("mac is required".into())),
            None => Ok(()),
        }
    }

    /// How a printer whose login reached the CloudPRNT routes takes its jobs: by polling
    /// (CloudPRNT Version HTTP) or over MQTT (a Star printer in CloudPRNT Version MQTT,
    /// which uses the same server URL and login for the server-setting file and for the
    /// job GET of a `url` print-job). Any other login, or another printer's MAC, is
    /// refused.
    pub fn mode(&self, printer: &PrinterInfo, mac: Option<&str>, required: bool) -> Result<Mode, CloudPrntError> {
        match &printer.transport {
            Some(TransportConfig::Cloudprnt(c)) => Self::check_mac(&c.mac, mac, required).map(|()| Mode::Http),
            Some(TransportConfig::Mqtt(m)) if m.protocol == MqttProtocol::Cloudprnt => {
                Self::check_mac(m.device(), mac, required).map(|()| Mode::Mqtt)
            }
            _ => Err(CloudPrntError::Unauthorized("this login is not a CloudPRNT printer's".into())),
        }
    }

    fn profile(printer: &PrinterInfo) -> Option<String> {
        match &printer.transport {
            Some(TransportConfig::Cloudprnt(c)) => c.profile.clone(),
            Some(TransportConfig::Mqtt(m)) => m.profile.clone(),
            _ => None,
        }
    }

    /// `POST /cloudprnt`.
    pub async fn poll(&self, printer: &PrinterInfo, poll: &PollIn) -> Result<PollOut, CloudPrntError> {
        if self.mode(printer, poll.mac.as_deref(), false)? == Mode::Mqtt {
            // A printer in CloudPRNT Version MQTT takes its jobs as MQTT print-jobs and
            // reports its state with client-status; a poll it still makes is answered,
            // never with a job.
            return Ok(PollOut { job_ready: false, media_types: Vec::new(), job_token: None });
        }
        let report = PollReport {
            health: health_of(&poll.status_code),
            token: poll.job_token.clone().filter(|t| !t.is_empty()),
            printing: poll.printing_in_progress,
            idle_while_starting: true,
        };
        let job = self.polled.poll(printer, &report, false).await?;
        Ok(match job {
            Some(j) => {
                let text = Encoding::Text { profile: Self::profile(printer) };
                let media_types = if self.polled.renders_as(&j.task, &text).await? {
                    MEDIA_TYPES.to_vec()
                } else {
                    vec![MEDIA_TYPES[0]]
                };
                PollOut { job_ready: true, media_types, job_token: Some(j.token.to_string()) }
            }
            None => PollOut { job_ready: false, media_types: Vec::new(), job_token: None },
        })
    }

    /// `GET /cloudprnt?mac=&type=&token=`: the job in the media type asked for (the
    /// broker's first choice when none is named); an image at `dots`, the print width the
    /// printer reported (`X-Star-Print-Width` × `X-Star-Horizontal-Resolution`), else at
    /// its profile's.
    pub async fn fetch(
        &self,
        printer: &PrinterInfo,
        mac: Option<&str>,
        media: Option<&str>,
        token: Option<&str>,
        dots: Option<u16>,
    ) -> Result<JobData, CloudPrntError> {
        let mode = self.mode(printer, mac, true)?;
        let media = media.map(percent_decode).unwrap_or_else(|| MEDIA_TYPES[0].to_owned());
        let profile = Self::profile(printer);
        let (content_type, encoding) = match media.trim() {
            "image/png" => ("image/png", Encoding::Png { profile, dots }),
            "text/plain" => ("text/plain", Encoding::Text { profile }),
            other => {
                return Err(CloudPrntError::UnsupportedMedia(format!(
                    "media type {other:?} is not offered; one of {}",
                    MEDIA_TYPES.join(", ")
                )))
            }
        };
        let what = content_type.split(';').next().unwrap_or(content_type);
        let (fetched, token) = match mode {
            Mode::Http => {
                let token = Self::token(token)?;
                (self.polled.fetch(printer, &token, &encoding, what).await?, token.to_string())
            }
            Mode::Mqtt => {
                let token = match token.map(percent_decode).filter(|t| !t.trim().is_empty()) {
                    Some(raw) => Some(Self::token(Some(&raw))?),
                    None => None,
                };
                let holder = Claimant::push(TransportKind::Mqtt.as_str());
                let named = token.as_ref().map_or_else(|| "in flight".to_owned(), JobToken::to_string);
                (self.polled.fetch_pushed(printer, token.as_ref(), &holder, &encoding, what).await?, named)
            }
        };
        match fetched {
            Fetched::Data { bytes, idempotency_key, cut } => Ok(JobData {
                content_type,
                bytes,
                idempotency_key,
                cut: cut.map(onceprint_render::FinalCut::star_header),
            }),
            Fetched::NoSuchJob => Err(CloudPrntError::NoSuchJob(format!("no job {token} for this printer"))),
            Fetched::Unrenderable(why) => {
                Err(CloudPrntError::UnsupportedMedia(format!("the job cannot be rendered as {what}: {why}")))
            }
        }
    }

    /// `DELETE /cloudprnt?mac=&code=&token=`: the printer's result for the job.
    pub async fn confirm(
        &self,
        printer: &PrinterInfo,
        mac: Option<&str>,
        code: Option<&str>,
        token: Option<&str>,
    ) -> Result<AckResult, CloudPrntError> {
        self.check(printer, mac, true)?;
        let token = Self::token(token)?;
        let code = code.ok_or_else(|| CloudPrntError::Invalid("code is required".into()))?;
        let (outcome, proof, detail) = outcome_of_code(code);
        self.polled
            .confirm(printer, &token, outcome, proof, detail)
            .await?
            .ok_or_else(|| CloudPrntError::NoSuchJob(format!("no job {token} for this printer")))
    }

    fn token(token: Option<&str>) -> Result<JobToken, CloudPrntError> {
        let raw = token.map(percent_decode).unwrap_or_default();
        JobToken::parse(&raw).ok_or_else(|| {
            CloudPrntError::NoSuchJob(format!(
                "no job for token {raw:?}: every job of this broker is named by the jobToken of the poll answer \
                 (CloudPRNT firmware that sends no token is not supported)"
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_follow_stars_table() {
        assert_eq!(health_of("200%20OK"), Health::Ready);
        assert_eq!(health_of("211 Paper low"), Health::Ready);
        let outcome = |s: &str| match health_of(s) {
            Health::Blocked { outcome, .. } => Some(outcome),
            _ => None,
        };
        assert_eq!(outcome("410%20Out%20of%20Paper"), Some(Outcome::NoPaper));
        assert_eq!(outcome("411 Paper Jam"), Some(Outcome::PaperJam));
        assert_eq!(outcome("420 Cover Open"), Some(Outcome::CoverOpen));
        assert!(matches!(health_of("430 Something"), Health::Fault(_)));
        assert!(matches!(health_of("nonsense"), Health::Fault(_)));
    }

    #[test]
    fn confirmation_codes() {
        for ok in ["OK", "ok", "200%20OK", "200 OK", "201", "211 Paper low"] {
            assert_eq!(outcome_of_code(ok).0, Outcome::Printed, "{ok}");
        }
        let (o, p, _) = outcome_of_code("410 Out of Paper");
        assert_eq!((o, p), (Outcome::NoPaper, Proof::MayHavePrinted));
        assert_eq!(outcome_of_code("411").0, Outcome::PaperJam);
        assert_eq!(outcome_of_code("420%20Cover%20Open").0, Outcome::CoverOpen);
        for refused in ["510", "511", "512 Unsupported media version", "521"] {
            assert_eq!(outcome_of_code(refused).1, Proof::Refused, "{refused}");
        }
        assert_eq!(outcome_of_code("520").1, Proof::NotPrinted);
        for unknown in ["599", "xyz", ""] {
            let (o, p, d) = outcome_of_code(unknown);
            assert_eq!((o, p), (Outcome::Error, Proof::MayHavePrinted), "{unknown}");
            assert!(unknown.starts_with('5') || d.contains("does not document"), "{d}");
        }
    }

    #[test]
    fn percent_decoding_keeps_what_it_cannot_read() {
        assert_eq!(percent_decode("200%20OK"), "200 OK");
        assert_eq!(percent_decode("00%3A11"), "00:11");
        assert_eq!(percent_decode("50%"), "50%");
        assert_eq!(percent_decode("%zz"), "%zz");
    }
}
