//! The `epson_sdp` transport: Epson Server Direct Print as a thin adapter on the polled
//! mechanism ([`super::polled`]). It owns the protocol's words: the form fields of the
//! printer's requests, the `PrintRequestInfo` answer (no SOAP envelope: printers drop
//! it silently) and the `PrintResponseInfo` result file.
//!
//! `POST /epson-sdp` with `ConnectionType=GetRequest&ID=…` asks for work. The answer
//! carries the job itself (ePOS-Print XML in `PrintData`), so a job handed out is fetched
//! at once; at most one at a time (the printer's lane), always with `printjobid` = the
//! attempt's [`JobToken`], so that a late result is credited to its own job. A
//! GetRequest while a job is unconfirmed means the printer is done with it without
//! saying how: in doubt, as for CloudPRNT. `ConnectionType=SetResponse&ResponseFile=…`
//! reports per `printjobid`: success printed, `EPTR_REC_EMPTY` no paper,
//! `EPTR_COVER_OPEN` cover open, anything else an error.

use std::sync::Arc;

use onceprint_core::Outcome;
use quick_xml::events::Event;

use super::polled::{Health, JobToken, PollReport, Polled};
use crate::directory::PrinterInfo;
use crate::lanes::{AckResult, DeliveryError};
use crate::transport::TransportConfig;

/// The device id of the printer itself in ePOS-Print (`Parameter/devid`).
pub const DEVICE_ID: &str = "local_printer";
/// How long the printer may take to print one job (`Parameter/timeout`, milliseconds).
pub const PRINT_TIMEOUT_MS: u32 = 60_000;

/// Why a Server Direct Print request was refused.
#[derive(Debug, thiserror::Error)]
pub enum EpsonSdpError {
    /// The login is not an Epson SDP printer's, or `ID` is not the configured one.
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Delivery(#[from] DeliveryError),
}

/// One job's result in a `ResponseFile`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct JobResult {
    pub printjobid: Option<String>,
    pub success: bool,
    pub code: String,
    pub status: String,
}

/// What the broker did with one job's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credited {
    pub printjobid: String,
    /// `None` when the id names no job of this printer.
    pub result: Option<AckResult>,
}

/// The outcome of one result: success printed; paper end and cover open as such;
/// everything else (timeouts, mechanical errors, a bad document) an error.
pub fn outcome_of(r: &JobResult) -> (Outcome, String) {
    if r.success {
        return (Outcome::Printed, "the printer reported success".into());
    }
    let detail = format!("the printer reported {} (status {})", r.code, r.status);
    let outcome = match r.code.as_str() {
        "EPTR_REC_EMPTY" => Outcome::NoPaper,
        "EPTR_COVER_OPEN" => Outcome::CoverOpen,
        _ => Outcome::Error,
    };
    (outcome, detail)
}

fn attr(e: &quick_xml::events::BytesStart<'_>, name: &[u8]) -> Option<String> {
    e.attributes()
        .flatten()
        .find(|a| a.key.local_name().as_ref() == name)
        .and_then(|a| a.unescape_value().ok().map(|v| v.into_owned()))
}

/// The results in a `PrintResponseInfo` document, one per `ePOSPrint` (a version 1.00
/// document has one `response` and no job id).
pub fn parse_response_file(xml: &str) -> Result<Vec<JobResult>, String> {
    let mut reader = quick_xml::Reader::from_str(xml);
    reader.config_mut().trim_text(true);
    let mut results = Vec::new();
    let mut current = JobResult::default();
    let mut in_job_id = false;
    let mut saw_response = false;
    loop {
        match reader.read_event() {
            Ok(Event::Start(e)) | Ok(Event::Empty(e)) => match e.local_name().as_ref() {
                b"printjobid" => in_job_id = true,
                b"response" => {
                    current.success = matches!(attr(&e, b"success").as_deref(), Some("true" | "1"));
                    current.code = attr(&e, b"code").unwrap_or_default();
                    current.status = attr(&e, b"status").unwrap_or_default();
                    saw_response = true;
                }
                _ => {}
            },
            Ok(Event::Text(t)) if in_job_id => {
                current.printjobid = t.unescape().ok().map(|s| s.trim().to_owned());
            }
            Ok(Event::End(e)) => match e.local_name().as_ref() {
                b"printjobid" => in_job_id = false,
                b"ePOSPrint" => {
                    if saw_response {
                        results.push(std::mem::take(&mut current));
                    }
                    current = JobResult::default();
                    saw_response = false;
                }
                _ => {}
            },
            Ok(Event::Eof) => break,
            Ok(_) => {}
            Err(e) => return Err(format!("ResponseFile is not readable XML: {e}")),
        }
    }
    if saw_response {
        results.push(current);
    }
    Ok(results)
}

/// The answer to a GetRequest that hands out `job` (ePOS-Print XML): one `ePOSPrint`
/// with the device, the timeout and the job id.
pub fn print_request_info(printjobid: &str, epos_print: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"utf-8\"?>\n<PrintRequestInfo Version=\"2.00\"><ePOSPrint><Parameter>\
         <devid>{DEVICE_ID}</devid><timeout>{PRINT_TIMEOUT_MS}</timeout><printjobid>{printjobid}</printjobid>\
         </Parameter><PrintData>{epos_print}</PrintData></ePOSPrint></PrintRequestInfo>"
    )
}

/// A job handed out by a GetRequest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handed {
    /// The `PrintRequestInfo` document.
    pub xml: String,
    pub printjobid: String,
    pub idempotency_key: String,
}

/// The Server Direct Print transport.
pub struct EpsonSdp {
    polled: Arc<Polled>,
}

impl EpsonSdp {
    pub fn new(polled: Arc<Polled>) -> EpsonSdp {
        EpsonSdp { polled }
    }

    pub fn polled(&self) -> &Arc<Polled> {
        &self.polled
    }

    /// The printer may speak with `id`: it is an Epson SDP printer, and `ID` is the one it
    /// was configured with (any, when none was).
    pub fn check(&self, printer: &PrinterInfo, id: Option<&str>) -> Result<(), EpsonSdpError> {
        let Some(TransportConfig::EpsonSdp(e)) = &printer.transport else {
            return Err(EpsonSdpError::Unauthorized("this login is not an Epson Server Direct Print printer's".into()));
        };
        match (&e.printer_id, id) {
            (Some(want), Some(got)) if want == got => Ok(()),
            (Some(_), _) => Err(EpsonSdpError::Unauthorized("ID is not this printer's".into())),
            (None, _) => Ok(()),
        }
    }

    /// `ConnectionType=GetRequest`: the next job, if one may go now.
    pub async fn get_request(&self, printer: &PrinterInfo, id: Option<&str>) -> Result<Option<Handed>, EpsonSdpError> {
        self.check(printer, id)?;
        // Asking for work says the printer is not working on anything it was given.
        let report = PollReport { health: Health::Unknown, token: None, printing: Some(false) };
        let Some(job) = self.polled.poll(printer, &report, true).await? else { return Ok(None) };
        let printjobid = job.token.to_string();
        let Some(data) = job.data else { return Ok(None) };
        let epos = String::from_utf8(data).map_err(|_| EpsonSdpError::Invalid("print data is not UTF-8".into()))?;
        Ok(Some(Handed {
            xml: print_request_info(&printjobid, &epos),
            printjobid,
            idempotency_key: job.idempotency_key,
        }))
    }

    /// `ConnectionType=SetResponse`: each result credited to the job its id names.
    pub async fn set_response(
        &self,
        printer: &PrinterInfo,
        id: Option<&str>,
        response_file: &str,
    ) -> Result<Vec<Credited>, EpsonSdpError> {
        self.check(printer, id)?;
        let results = parse_response_file(response_file).map_err(EpsonSdpError::Invalid)?;
        let mut credited = Vec::with_capacity(results.len());
        for r in results {
            let Some(jobid) = r.printjobid.clone() else {
                // A result without a job id cannot be credited to any job safely (it
                // might be the previous one's); the job in flight goes to a person by the
                // polling rules if it is never confirmed.
                tracing::warn!(printer = %printer.row.id, code = %r.code, "Server Direct Print result without printjobid");
                continue;
            };
            let result = match JobToken::parse(&jobid) {
                Some(token) => {
                    let (outcome, detail) = outcome_of(&r);
                    self.polled.confirm(printer, &token, outcome, detail).await?
                }
                None => None,
            };
            credited.push(Credited { printjobid: jobid, result });
        }
        Ok(credited)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_are_read_per_job_id() {
        let xml = r#"<?xml version="1.0" encoding="utf-8"?>
<PrintResponseInfo Version="2.00">
<ePOSPrint><Parameter><devid>local_printer</devid><printjobid>A.1</printjobid></Parameter>
<PrintResponse><response xmlns="http://www.epson-pos.com/schemas/2011/03/epos-print" success="true" code="" status="251658262" battery="0"/></PrintResponse></ePOSPrint>
<ePOSPrint><Parameter><devid>local_printer</devid><printjobid>B.2</printjobid></Parameter>
<PrintResponse><response xmlns="http://www.epson-pos.com/schemas/2011/03/epos-print" success="false" code="EPTR_REC_EMPTY" status="1" battery="0"/></PrintResponse></ePOSPrint>
</PrintResponseInfo>"#;
        let r = parse_response_file(xml).expect("parses");
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].printjobid.as_deref(), r[0].success), (Some("A.1"), true));
        assert_eq!(
            (r[1].printjobid.as_deref(), r[1].success, r[1].code.as_str()),
            (Some("B.2"), false, "EPTR_REC_EMPTY")
        );
        assert_eq!(outcome_of(&r[0]).0, Outcome::Printed);
        assert_eq!(outcome_of(&r[1]).0, Outcome::NoPaper);
        let cover = JobResult { code: "EPTR_COVER_OPEN".into(), ..JobResult::default() };
        assert_eq!(outcome_of(&cover).0, Outcome::CoverOpen);
        let timeout = JobResult { code: "EX_TIMEOUT".into(), ..JobResult::default() };
        assert_eq!(outcome_of(&timeout).0, Outcome::Error);
        assert!(parse_response_file("<a><b></a>").is_err());
    }

    #[test]
    fn a_version_one_result_has_no_job_id() {
        let xml =
            r#"<PrintResponseInfo Version="1.00"><response success="true" code="" status="1"/></PrintResponseInfo>"#;
        let r = parse_response_file(xml).expect("parses");
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].printjobid, None);
    }

    #[test]
    fn the_request_info_has_no_soap_envelope_and_always_a_job_id() {
        let xml = print_request_info("T.1", "<epos-print/>");
        assert!(xml.contains("<PrintRequestInfo Version=\"2.00\"><ePOSPrint><Parameter><devid>local_printer</devid>"));
        assert!(xml.contains("<printjobid>T.1</printjobid>") && xml.contains("<PrintData><epos-print/></PrintData>"));
        assert!(!xml.contains("Envelope"));
    }
}
