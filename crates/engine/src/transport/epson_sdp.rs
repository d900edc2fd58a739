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
//! reports per `printjobid`, classified by Epson's table (`onceprint_core::results::epson`,
//! docs/RESULT-CODES.md): `success="true"` printed; a code that can follow printing
//! (`EPTR_CUTTER`, `EPTR_MECHANICAL`, …) or that no document lists may have printed, and
//! the job goes to a person; `EPTR_REC_EMPTY` and `EPTR_COVER_OPEN` pause the lane and may
//! have cut the slip short, unless the printer had already stopped before the job went out.
//! A Version 3.00 answer that the printer could not use the print data at all is about the
//! job it was just given and proves nothing printed: that job fails with the printer's
//! reason. A `ResponseFile` that cannot be read is refused (400) and noted on the job in
//! flight.

use std::sync::Arc;

use onceprint_core::results::epson;
use onceprint_core::{Outcome, Proof};
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

/// A `ResponseFile` as read: the printer's per-job results, or (Version 3.00) its refusal
/// of the print data as a whole.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ResponseFile {
    pub results: Vec<JobResult>,
    /// `<ServerDirectPrint><Response Success="false">`: `ErrorSummary: ErrorDetail`.
    pub data_refused: Option<String>,
}

/// What one result means for its job and its printer, by Epson's table: the outcome, what
/// it proves about paper, and the detail for the audit trail (the code's meaning and the
/// status bits in words).
pub fn outcome_of(r: &JobResult) -> (Outcome, Proof, String) {
    let c = epson::job_result(r.success, &r.code);
    let status = epson::describe_status(&r.status);
    let detail = match c.row {
        _ if r.success => format!("the printer reported success ({status})"),
        Some(row) => format!("the printer reported {} ({}; {status})", r.code, row.meaning),
        None => format!("the printer reported {:?}, a code Epson does not document ({status})", r.code),
    };
    (c.outcome, c.proof, detail)
}

fn attr(e: &quick_xml::events::BytesStart<'_>, name: &[u8]) -> Option<String> {
    e.attributes()
        .flatten()
        .find(|a| a.key.local_name().as_ref() == name)
        .and_then(|a| a.unescape_value().ok().map(|v| v.into_owned()))
}

/// Reads a `PrintResponseInfo` document: one result per `ePOSPrint` (a Version 1.00
/// document has one `response` and no job id), or the Version 3.00 refusal of the data.
/// Anything else is refused with what is wrong: no document, another root element (a
/// SOAP envelope is not part of Server Direct Print), XML that is not well formed or ends
/// early, a document without any result.
pub fn parse_response_file(xml: &str) -> Result<ResponseFile, String> {
    if xml.trim().is_empty() {
        return Err("ResponseFile is empty".into());
    }
    let mut reader = quick_xml::Reader::from_str(xml);
    reader.config_mut().trim_text(true);
    let mut file = ResponseFile::default();
    let mut current = JobResult::default();
    let mut in_job_id = false;
    let mut saw_response = false;
    let mut open: Vec<String> = Vec::new();
    let mut root: Option<String> = None;
    // Inside `<ServerDirectPrint><Response Success="false">`: its error texts.
    let mut refused: Option<(String, String)> = None;
    let mut text_of: Option<&'static str> = None;
    loop {
        let event = reader.read_event().map_err(|e| format!("ResponseFile is not readable XML: {e}"))?;
        match event {
            Event::Start(ref e) | Event::Empty(ref e) => {
                let name = String::from_utf8_lossy(e.local_name().as_ref()).into_owned();
                if root.is_none() {
                    if name != "PrintResponseInfo" {
                        return Err(format!(
                            "ResponseFile's root element is <{name}>, not <PrintResponseInfo> (Server Direct Print sends \
                             no SOAP envelope)"
                        ));
                    }
                    root = Some(name.clone());
                } else if open.is_empty() {
                    return Err(format!("ResponseFile has <{name}> after its <PrintResponseInfo> ended"));
                }
                match name.as_str() {
                    "printjobid" => in_job_id = true,
                    "response" => {
                        current.success = matches!(attr(e, b"success").as_deref(), Some("true" | "1"));
                        current.code = attr(e, b"code").unwrap_or_default();
                        current.status = attr(e, b"status").unwrap_or_default();
                        saw_response = true;
                    }
                    "Response" if open.last().map(String::as_str) == Some("ServerDirectPrint") => {
                        let ok = matches!(attr(e, b"Success").as_deref(), Some("true" | "1"));
                        if !ok {
                            refused = Some((String::new(), String::new()));
                        } else {
                            file.data_refused = None;
                        }
                    }
                    "ErrorSummary" if refused.is_some() => text_of = Some("summary"),
                    "ErrorDetail" if refused.is_some() => text_of = Some("detail"),
                    _ => {}
                }
                if matches!(event, Event::Start(_)) {
                    open.push(name);
                } else if name == "Response" {
                    if let Some((summary, detail)) = refused.take() {
                        file.data_refused = Some(refusal_text(&summary, &detail));
                    }
                }
            }
            Event::Text(t) => {
                let text =
                    t.unescape().map_err(|e| format!("ResponseFile is not readable XML: {e}"))?.trim().to_owned();
                if root.is_none() || open.is_empty() {
                    if !text.is_empty() {
                        return Err("ResponseFile is not an XML document".into());
                    }
                    continue;
                }
                if in_job_id {
                    current.printjobid = Some(text.clone());
                }
                match (text_of, refused.as_mut()) {
                    (Some("summary"), Some((summary, _))) => *summary = text,
                    (Some("detail"), Some((_, detail))) => *detail = text,
                    _ => {}
                }
            }
            Event::End(e) => {
                let name = String::from_utf8_lossy(e.local_name().as_ref()).into_owned();
                if open.pop().as_deref() != Some(name.as_str()) {
                    return Err(format!("ResponseFile is not well formed: </{name}> closes nothing open"));
                }
                match name.as_str() {
                    "printjobid" => in_job_id = false,
                    "ErrorSummary" | "ErrorDetail" => text_of = None,
                    "Response" => {
                        if let Some((summary, detail)) = refused.take() {
                            file.data_refused = Some(refusal_text(&summary, &detail));
                        }
                    }
                    "ePOSPrint" => {
                        if saw_response {
                            file.results.push(std::mem::take(&mut current));
                        }
                        current = JobResult::default();
                        saw_response = false;
                    }
                    _ => {}
                }
            }
            Event::Eof => break,
            _ => {}
        }
    }
    if root.is_none() {
        return Err("ResponseFile is not an XML document".into());
    }
    if let Some(name) = open.last() {
        return Err(format!("ResponseFile ends inside <{name}> (truncated)"));
    }
    if saw_response {
        file.results.push(current);
    }
    if file.results.is_empty() && file.data_refused.is_none() {
        return Err("ResponseFile holds no result (no <response>, no <ServerDirectPrint><Response>)".into());
    }
    Ok(file)
}

fn refusal_text(summary: &str, detail: &str) -> String {
    match (summary.is_empty(), detail.is_empty()) {
        (true, true) => "the printer could not use the print data".into(),
        (false, true) => summary.to_owned(),
        (true, false) => detail.to_owned(),
        (false, false) => format!("{summary}: {detail}"),
    }
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
        let report =
            PollReport { health: Health::Unknown, token: None, printing: Some(false), idle_while_starting: false };
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

    /// `ConnectionType=SetResponse`: each result credited to the job its id names. A
    /// `ResponseFile` that cannot be read is refused with what is wrong, and the refusal
    /// is written to the audit trail of the job the printer holds, so that a person who
    /// later finds it in doubt sees why.
    pub async fn set_response(
        &self,
        printer: &PrinterInfo,
        id: Option<&str>,
        response_file: &str,
    ) -> Result<Vec<Credited>, EpsonSdpError> {
        self.check(printer, id)?;
        let file = match parse_response_file(response_file) {
            Ok(f) => f,
            Err(why) => {
                self.note_on_job_in_flight(printer, &format!("a SetResponse was refused: {why}")).await?;
                return Err(EpsonSdpError::Invalid(why));
            }
        };
        let mut credited = Vec::with_capacity(file.results.len() + 1);
        if let Some(why) = &file.data_refused {
            // Version 3.00: the printer could not use the data of the job it was given;
            // the document names no job, and the printer holds one at a time.
            if let Some(task) = self.job_in_flight(printer).await? {
                let token = JobToken::of(&task);
                let detail = format!("the printer could not use the print data: {why}");
                let result = self.polled.confirm(printer, &token, Outcome::Error, Proof::Refused, detail).await?;
                credited.push(Credited { printjobid: token.to_string(), result });
            } else {
                tracing::warn!(printer = %printer.row.id, %why, "Server Direct Print refused print data, but no job is in flight");
            }
        }
        for r in file.results {
            let Some(jobid) = r.printjobid.clone() else {
                // A result without a job id cannot be credited to any job safely (it
                // might be the previous one's); the job in flight goes to a person by the
                // polling rules if it is never confirmed.
                tracing::warn!(printer = %printer.row.id, code = %r.code, "Server Direct Print result without printjobid");
                let (_, _, detail) = outcome_of(&r);
                self.note_on_job_in_flight(printer, &format!("a result without printjobid was not credited: {detail}"))
                    .await?;
                continue;
            };
            let result = match JobToken::parse(&jobid) {
                Some(token) => {
                    let (outcome, proof, detail) = outcome_of(&r);
                    self.polled.confirm(printer, &token, outcome, proof, detail).await?
                }
                None => None,
            };
            credited.push(Credited { printjobid: jobid, result });
        }
        Ok(credited)
    }

    /// The job this printer was handed and has not confirmed.
    async fn job_in_flight(&self, printer: &PrinterInfo) -> Result<Option<onceprint_store::Task>, EpsonSdpError> {
        let lanes = self.polled.lanes();
        let lane = lanes.store().lane(&printer.row.tenant_id, &printer.row.id).await.map_err(DeliveryError::from)?;
        let mine = crate::claimant::Claimant::printer(crate::transport::TransportKind::EpsonSdp.as_str()).sent_to();
        Ok(lane.in_flight.filter(|t| t.sent_to.as_deref() == Some(mine.as_str())))
    }

    async fn note_on_job_in_flight(&self, printer: &PrinterInfo, reason: &str) -> Result<(), EpsonSdpError> {
        if let Some(task) = self.job_in_flight(printer).await? {
            let actor = crate::claimant::Claimant::printer(crate::transport::TransportKind::EpsonSdp.as_str()).actor();
            self.polled.lanes().note_in_flight(&task, actor, format!("attempt {}: {reason}", task.attempts)).await?;
        }
        Ok(())
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
        let r = parse_response_file(xml).expect("parses").results;
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].printjobid.as_deref(), r[0].success), (Some("A.1"), true));
        assert_eq!(
            (r[1].printjobid.as_deref(), r[1].success, r[1].code.as_str()),
            (Some("B.2"), false, "EPTR_REC_EMPTY")
        );
        assert_eq!(outcome_of(&r[0]).0, Outcome::Printed);
        let (o, p, d) = outcome_of(&r[1]);
        assert_eq!((o, p), (Outcome::NoPaper, Proof::MayHavePrinted));
        assert!(d.contains("EPTR_REC_EMPTY") && d.contains("no response from the TM printer"), "{d}");
        let cover = JobResult { code: "EPTR_COVER_OPEN".into(), ..JobResult::default() };
        assert_eq!(outcome_of(&cover).0, Outcome::CoverOpen);
        let cutter = JobResult { code: "EPTR_CUTTER".into(), ..JobResult::default() };
        assert_eq!(outcome_of(&cutter).1, Proof::MayHavePrinted);
        let timeout = JobResult { code: "EX_TIMEOUT".into(), ..JobResult::default() };
        assert_eq!(outcome_of(&timeout).1, Proof::MayHavePrinted);
        assert!(parse_response_file("<a><b></a>").is_err());
    }

    #[test]
    fn what_cannot_be_read_is_refused_with_what_is_wrong() {
        let cases = [
            ("", "empty"),
            ("   ", "empty"),
            ("success=true", "not an XML document"),
            ("<soap:Envelope xmlns:soap=\"x\"><soap:Body><PrintResponseInfo/></soap:Body></soap:Envelope>", "SOAP"),
            ("<PrintResponseInfo Version=\"2.00\"><ePOSPrint><Parameter>", "truncated"),
            ("<PrintResponseInfo Version=\"2.00\"></PrintResponseInfo>", "no result"),
            ("<PrintResponseInfo><a></b></PrintResponseInfo>", "XML"),
        ];
        for (xml, what) in cases {
            let e = parse_response_file(xml).expect_err(xml);
            assert!(e.contains(what), "{xml:?}: {e}");
        }
    }

    #[test]
    fn a_version_three_refusal_of_the_data_is_read() {
        let xml = r#"<?xml version="1.0" encoding="utf-8"?>
<PrintResponseInfo Version="3.00"><ServerDirectPrint><Response Success="false">
<ErrorSummary>Invalid XML format</ErrorSummary><ErrorDetail>Entity: line 99: parser error</ErrorDetail>
</Response></ServerDirectPrint></PrintResponseInfo>"#;
        let f = parse_response_file(xml).expect("parses");
        assert_eq!(f.data_refused.as_deref(), Some("Invalid XML format: Entity: line 99: parser error"));
        assert!(f.results.is_empty());
        let ok = r#"<PrintResponseInfo Version="3.00"><ServerDirectPrint><Response Success="true"/></ServerDirectPrint>
<ePOSPrint><Parameter><printjobid>A.1</printjobid></Parameter><PrintResponse><response success="true" code="" status="2"/></PrintResponse></ePOSPrint></PrintResponseInfo>"#;
        let f = parse_response_file(ok).expect("parses");
        assert_eq!((f.data_refused, f.results.len()), (None, 1));
    }

    #[test]
    fn a_version_one_result_has_no_job_id() {
        let xml =
            r#"<PrintResponseInfo Version="1.00"><response success="true" code="" status="1"/></PrintResponseInfo>"#;
        let r = parse_response_file(xml).expect("parses").results;
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
