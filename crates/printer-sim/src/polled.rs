//! A simulated printer that polls a broker over HTTP, as Star CloudPRNT and Epson Server
//! Direct Print printers do, writing what it prints to the same paper log as the TCP
//! printers.
//!
//! One loop per printer: poll (reporting its state: `410 Out of Paper`, `420 Cover Open`
//! or `200 OK`; Epson's GetRequest says nothing), fetch the job it is told about, print
//! it (a paper-log line) and confirm by job token. The faults are the TCP printer's,
//! read the moment they matter:
//! - `paper_out` / `cover_open`: polls report it, and a job fetched while it holds is
//!   confirmed with that error instead of printing;
//! - `offline`: the printer stops polling (the broker must notice it went silent);
//! - `crash_mid_job`: the next N jobs print and then the printer forgets them before
//!   confirming (a reboot), and polls again idle;
//! - `slow_ms`: printing takes this long (CloudPRNT polls meanwhile say so);
//! - `duplicate_confirm`: the next N confirmations are sent twice;
//! - `lost_result`: the next N confirmations are lost and sent again only after the
//!   next poll (a late result);
//! - `error_after_print`: the next N jobs print and are then confirmed with an error that
//!   can follow printing (Epson `EPTR_CUTTER`, "the autocutter failed"; CloudPRNT a code Star
//!   does not list, `599`);
//! - `clone` has no meaning here.
//!
//! The simulator never confirms a job whose paper-log line was not written.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use quick_xml::events::Event;
use tokio::sync::watch;

use crate::faults::{Faults, FaultsHandle};
use crate::jobs::{Cut, PrintedJob, Recorder};

/// Which protocol the printer speaks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Protocol {
    /// Star CloudPRNT (HTTP): `mac` is sent in every request; `media_type` is asked for
    /// in the job GET when the poll offers it (`text/plain` lets the paper log show the
    /// text), else the first type offered; `print_width_mm` × 8 dots per millimetre is the
    /// print width it reports with the GET and the only image width it prints (72 mm, 576
    /// dots, on an 80 mm roll; 48 mm, 384 dots, on 58 mm).
    CloudPrnt { mac: String, media_type: String, print_width_mm: u16 },
    /// Epson Server Direct Print: `id` is the `ID` form field.
    EpsonSdp { id: Option<String> },
}

/// One printer that polls.
#[derive(Debug, Clone)]
pub struct PolledPrinter {
    /// The broker's URL for the protocol (`https://broker/cloudprnt`, `…/epson-sdp`).
    pub url: String,
    pub username: String,
    pub password: String,
    pub protocol: Protocol,
    pub poll_interval: Duration,
}

impl PolledPrinter {
    /// The printer's name in the paper log and the fault list.
    pub fn name(&self) -> String {
        match &self.protocol {
            Protocol::CloudPrnt { mac, .. } => format!("cloudprnt:{mac}"),
            Protocol::EpsonSdp { id } => format!("epson_sdp:{}", id.as_deref().unwrap_or(&self.username)),
        }
    }
}

/// What one fetched job printed, as the paper log records it.
struct Printout {
    text: String,
    bytes: usize,
    images: usize,
    cut: Cut,
    /// The printer could not use the data: nothing printed, and it confirms with this
    /// code of Star's table instead.
    refused: Option<&'static str>,
}

impl Printout {
    fn printed(text: String, bytes: usize, images: usize, cut: Cut) -> Printout {
        Printout { text, bytes, images, cut, refused: None }
    }

    fn refused(code: &'static str, why: String, name: &str) -> Printout {
        tracing::warn!(printer = %name, code, "{why}: the printer refuses the job, nothing printed");
        Printout { text: String::new(), bytes: 0, images: 0, cut: Cut::Uncut, refused: Some(code) }
    }
}

/// Dots per millimetre of a Star thermal printer's head (203 dpi).
pub(crate) const STAR_DOTS_PER_MM: u16 = 8;

/// A Star job body the printer can print.
pub(crate) enum StarJob {
    /// `text/plain`: printed as it is.
    Text(String),
    /// `image/png`, exactly the print width.
    Png,
}

/// How a slip ends, from the `X-Star-Cut` response header (Star CloudPRNT Protocol Guide,
/// "Print job requests (GET)", "Response (GET)": `full`, `partial` or `none`); a full cut
/// when it is left out.
pub(crate) fn star_cut(header: Option<&str>) -> Cut {
    match header {
        Some("partial") => Cut::Partial,
        Some("none") => Cut::Uncut,
        _ => Cut::Full,
    }
}

/// What a Star printer makes of a downloaded job body, as Star documents it (Star
/// CloudPRNT Protocol Guide, "Print job requests (GET)", "Response (GET)": the body is
/// "encoded in the requested format, and with the requested format as the specified
/// content type"; "Printer Status Codes" for the refusals; Star's sample server,
/// `ExampleServers/php_queue`). The content type must be the media type asked for,
/// without parameters (some
/// firmware refuses `; charset=…`), else `510`; an image must decode, else `511`, and be
/// exactly `dots` wide (stricter than a printer, which would scale or crop it: a server
/// that does not render for the printer shows here), else `511`; a media type other than
/// `text/plain` and `image/png` is not one this printer takes, `510`.
pub(crate) fn read_star_job(
    asked: &str,
    content_type: &str,
    bytes: &[u8],
    dots: usize,
) -> Result<StarJob, (&'static str, String)> {
    if content_type != asked {
        return Err(("510", format!("asked for {asked}, got content type {content_type:?}")));
    }
    match asked {
        "text/plain" => Ok(StarJob::Text(String::from_utf8_lossy(bytes).into_owned())),
        "image/png" => match png_width(bytes) {
            Err(e) => Err(("511", format!("the image does not decode: {e}"))),
            Ok(w) if w != dots => Err(("511", format!("the image is {w} dots wide; this printer prints {dots}"))),
            Ok(_) => Ok(StarJob::Png),
        },
        other => Err(("510", format!("{other} is not a media type this printer takes"))),
    }
}

struct Ctx {
    printer: PolledPrinter,
    name: String,
    /// The printer's place in `faults` (a fleet keeps many printers in one simulator).
    index: usize,
    faults: FaultsHandle,
    recorder: Arc<Recorder>,
    http: reqwest::Client,
    seq: std::sync::atomic::AtomicU64,
    /// An Epson printer's HTTP Digest sign-in (its challenge and count).
    digest: crate::digest::Session,
    /// When the polls since the last printed job were sent (Unix µs), for the paper log.
    polls: std::sync::Mutex<Vec<i64>>,
}

/// Poll times kept for one paper-log line.
const POLLS_KEPT: usize = 32;

/// A confirmation that still has to go out.
enum Confirmation {
    CloudPrnt { token: String, code: String },
    Epson { jobid: String, success: bool, code: String },
}

/// Runs one polling printer, number `index` of `faults`, until `stop`.
pub(crate) async fn run(
    printer: PolledPrinter,
    index: usize,
    faults: FaultsHandle,
    recorder: Arc<Recorder>,
    mut stop: watch::Receiver<bool>,
) {
    let http = match reqwest::Client::builder().timeout(Duration::from_secs(10)).build() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "cannot build the HTTP client of the polling printer");
            return;
        }
    };
    let name = printer.name();
    // TM Web Config does not take a longer password or other characters, so a real
    // printer could never have been set up with one.
    if let Protocol::EpsonSdp { .. } = printer.protocol {
        if let Err(e) = crate::digest::check_password(&printer.password) {
            tracing::error!(printer = %name, error = %e, "the Epson printer's password cannot be set on a TM printer");
            return;
        }
    }
    let ctx = Ctx {
        printer,
        name,
        index,
        faults,
        recorder,
        http,
        seq: std::sync::atomic::AtomicU64::new(0),
        digest: crate::digest::Session::default(),
        polls: std::sync::Mutex::new(Vec::new()),
    };
    let mut late: Vec<Confirmation> = Vec::new();
    loop {
        let sleep = tokio::time::sleep(ctx.printer.poll_interval);
        let f = ctx.faults.current(ctx.index);
        if !f.offline {
            if let Err(e) = ctx.round(f, &mut late).await {
                tracing::warn!(printer = %ctx.name, error = %e, "poll round failed");
            }
        }
        tokio::select! {
            _ = stop.wait_for(|&s| s) => return,
            _ = sleep => {}
        }
    }
}

fn blocking_code(f: &Faults) -> Option<(&'static str, &'static str)> {
    if f.paper_out {
        Some(("410 Out of Paper", "EPTR_REC_EMPTY"))
    } else if f.cover_open {
        Some(("420 Cover Open", "EPTR_COVER_OPEN"))
    } else {
        None
    }
}

impl Ctx {
    async fn round(&self, f: Faults, late: &mut Vec<Confirmation>) -> Result<(), String> {
        let held: Vec<Confirmation> = std::mem::take(late);
        if let Ok(mut polls) = self.polls.lock() {
            if polls.len() == POLLS_KEPT {
                polls.remove(0);
            }
            polls.push(unix_now_us());
        }
        let fetched = match &self.printer.protocol {
            Protocol::CloudPrnt { mac, media_type, print_width_mm } => {
                self.cloudprnt_fetch(&f, mac, media_type, *print_width_mm).await?
            }
            Protocol::EpsonSdp { id } => self.epson_fetch(id.as_deref()).await?,
        };
        // Confirmations lost last round go out now, after this poll: late.
        for c in held {
            self.confirm(&c).await?;
        }
        let Some((jobid, printout)) = fetched else { return Ok(()) };
        let take = |field: fn(&mut Faults) -> &mut u32| {
            let mut hit = false;
            self.faults.modify(self.index, |f| {
                let n = field(f);
                if *n > 0 {
                    *n -= 1;
                    hit = true;
                }
            });
            hit
        };
        if f.slow_ms > 0 {
            tokio::time::sleep(Duration::from_millis(f.slow_ms)).await;
        }
        let now = self.faults.current(self.index);
        let confirmation = if let Some(code) = printout.refused {
            // Data it cannot use: nothing printed (Star's 5xx codes, CloudPRNT Protocol
            // Guide "Printer Status Codes"; Epson's `SchemaError`, ePOS-Print XML User's
            // Manual).
            self.result(&jobid, false, code, code)
        } else if let Some((star, epson)) = blocking_code(&now) {
            // Out of paper (or the cover open) before anything printed.
            self.result(&jobid, false, star, epson)
        } else {
            self.record(printout).await.map_err(|e| format!("cannot write the paper log: {e}"))?;
            if take(|f| &mut f.crash_mid_job) {
                tracing::info!(printer = %self.name, job = %jobid, "crash after printing, before confirming");
                return Ok(());
            }
            if take(|f| &mut f.error_after_print) {
                self.result(&jobid, false, "599 Error after printing", "EPTR_CUTTER")
            } else {
                self.result(&jobid, true, "200 OK", "")
            }
        };
        if take(|f| &mut f.lost_result) {
            tracing::info!(printer = %self.name, job = %jobid, "the confirmation is lost; sent again later");
            late.push(confirmation);
            return Ok(());
        }
        self.confirm(&confirmation).await?;
        if take(|f| &mut f.duplicate_confirm) {
            self.confirm(&confirmation).await?;
        }
        Ok(())
    }

    fn result(&self, jobid: &str, success: bool, star: &str, epson: &str) -> Confirmation {
        match self.printer.protocol {
            Protocol::CloudPrnt { .. } => Confirmation::CloudPrnt { token: jobid.to_owned(), code: star.to_owned() },
            Protocol::EpsonSdp { .. } => {
                Confirmation::Epson { jobid: jobid.to_owned(), success, code: epson.to_owned() }
            }
        }
    }

    async fn record(&self, p: Printout) -> std::io::Result<()> {
        let seq = self.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let job = PrintedJob {
            printer: self.name.clone(),
            seq,
            at: crate::printer::now_rfc3339(),
            text: p.text,
            bytes: p.bytes,
            qr: Vec::new(),
            barcodes: Vec::new(),
            images: p.images,
            cut: p.cut,
            device: None,
            job: None,
            polls_us: self.polls.lock().map(|mut p| std::mem::take(&mut *p)).unwrap_or_default(),
            started_us: None,
        };
        self.recorder.record(job).await
    }

    /// CloudPRNT: one poll and, when a job is ready, its GET.
    /// The job GET and what the printer makes of the answer, as Star documents it (Star
    /// CloudPRNT Protocol Guide, "Print job requests (GET)" and "Client HTTP Request
    /// Headers"): it says its print width; an
    /// answer other than 200 is confirmed with 520 (nothing printed); the body must be of
    /// the media type asked for, without parameters (some firmware refuses `; charset=…`),
    /// else 510; an image must decode, else 511, and be exactly its print width (stricter
    /// than a printer, which would scale or crop it: a server that does not render for the
    /// printer shows here), else 511; plain text prints as it is; the `X-Star-Cut` header
    /// says how the slip ends (`full` when it is left out).
    async fn cloudprnt_fetch(
        &self,
        f: &Faults,
        mac: &str,
        media: &str,
        print_width_mm: u16,
    ) -> Result<Option<(String, Printout)>, String> {
        let status = blocking_code(f).map_or("200 OK", |(s, _)| s);
        let body = serde_json::json!({
            "statusCode": status.replace(' ', "%20"),
            "printerMAC": mac,
            "printingInProgress": false,
        });
        let res = self
            .http
            .post(&self.printer.url)
            .basic_auth(&self.printer.username, Some(&self.printer.password))
            .json(&body)
            .send()
            .await
            .map_err(|e| format!("poll: {e}"))?;
        if !res.status().is_success() {
            return Err(format!("poll answered {}", res.status()));
        }
        let answer: serde_json::Value = res.json().await.map_err(|e| format!("poll answer: {e}"))?;
        if answer["jobReady"] != true || blocking_code(f).is_some() {
            return Ok(None);
        }
        let token = answer["jobToken"].as_str().unwrap_or_default().to_owned();
        // A Star printer picks the job's media type from those the server offers
        // (CloudPRNT Protocol Guide, "Polling the server (POST)", `mediaTypes`): the one it
        // is set to prefer when offered, else the server's first.
        let offered: Vec<&str> =
            answer["mediaTypes"].as_array().map(|a| a.iter().filter_map(|m| m.as_str()).collect()).unwrap_or_default();
        let media = if offered.is_empty() || offered.contains(&media) { media } else { offered[0] };
        let dots = usize::from(print_width_mm) * usize::from(STAR_DOTS_PER_MM);
        let res = self
            .http
            .get(&self.printer.url)
            .header("X-Star-Print-Width", print_width_mm.to_string())
            .header("X-Star-Horizontal-Resolution", STAR_DOTS_PER_MM.to_string())
            .basic_auth(&self.printer.username, Some(&self.printer.password))
            .query(&[("mac", mac), ("type", media), ("token", token.as_str())])
            .send()
            .await
            .map_err(|e| format!("job GET: {e}"))?;
        let name = &self.name;
        if res.status() != reqwest::StatusCode::OK {
            return Ok(Some((token, Printout::refused("520", format!("the job GET answered {}", res.status()), name))));
        }
        let content_type = res.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
        let cut = star_cut(res.headers().get("x-star-cut").and_then(|v| v.to_str().ok()));
        let bytes = res.bytes().await.map_err(|e| format!("job GET body: {e}"))?;
        let printout = match read_star_job(media, &content_type, &bytes, dots) {
            Ok(StarJob::Text(text)) => Printout::printed(text, bytes.len(), 0, cut),
            Ok(StarJob::Png) => Printout::printed(String::new(), bytes.len(), 1, cut),
            Err((code, why)) => Printout::refused(code, why, name),
        };
        Ok(Some((token, printout)))
    }

    /// Epson: a form POST signed in as a TM printer signs in, by HTTP Digest (Epson Server
    /// Direct Print User's Manual, authentication): without credentials until challenged.
    async fn epson_post<T: serde::Serialize + ?Sized>(&self, form: &T) -> Result<reqwest::Response, String> {
        let p = &self.printer;
        self.digest.post_form(&self.http, &p.url, &p.username, &p.password, form).await
    }

    /// Epson: one GetRequest, and the job it carries, if any.
    async fn epson_fetch(&self, id: Option<&str>) -> Result<Option<(String, Printout)>, String> {
        let mut form = vec![("ConnectionType", "GetRequest")];
        if let Some(id) = id {
            form.push(("ID", id));
        }
        let res = self.epson_post(&form).await.map_err(|e| format!("GetRequest: {e}"))?;
        if !res.status().is_success() {
            return Err(format!("GetRequest answered {}", res.status()));
        }
        let xml = res.text().await.map_err(|e| format!("GetRequest answer: {e}"))?;
        if xml.trim().is_empty() {
            return Ok(None);
        }
        let (jobid, printout) = parse_print_request(&xml)?;
        Ok(Some((jobid, printout)))
    }

    async fn confirm(&self, c: &Confirmation) -> Result<(), String> {
        let req = match c {
            Confirmation::CloudPrnt { token, code } => {
                let mac = match &self.printer.protocol {
                    Protocol::CloudPrnt { mac, .. } => mac.as_str(),
                    Protocol::EpsonSdp { .. } => "",
                };
                self.http.delete(&self.printer.url).query(&[("mac", mac), ("code", code), ("token", token)])
            }
            Confirmation::Epson { jobid, success, code } => {
                let file = format!(
                    "<?xml version=\"1.0\" encoding=\"utf-8\"?><PrintResponseInfo Version=\"2.00\"><ePOSPrint>\
                     <Parameter><devid>local_printer</devid><printjobid>{jobid}</printjobid></Parameter><PrintResponse>\
                     <response xmlns=\"http://www.epson-pos.com/schemas/2011/03/epos-print\" success=\"{success}\" \
                     code=\"{code}\" status=\"251658262\" battery=\"0\"/></PrintResponse></ePOSPrint></PrintResponseInfo>"
                );
                let mut form = vec![("ConnectionType", "SetResponse".to_owned()), ("ResponseFile", file)];
                if let Protocol::EpsonSdp { id: Some(id) } = &self.printer.protocol {
                    form.push(("ID", id.clone()));
                }
                let res = self.epson_post(&form).await.map_err(|e| format!("confirmation: {e}"))?;
                if !res.status().is_success() {
                    return Err(format!("confirmation answered {}", res.status()));
                }
                return Ok(());
            }
        };
        let res = req
            .basic_auth(&self.printer.username, Some(&self.printer.password))
            .send()
            .await
            .map_err(|e| format!("confirmation: {e}"))?;
        if !res.status().is_success() {
            return Err(format!("confirmation answered {}", res.status()));
        }
        Ok(())
    }
}

/// Now, in microseconds since the Unix epoch.
fn unix_now_us() -> i64 {
    (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000) as i64
}

/// The width of a PNG, read by decoding it whole, as a printer must to print it.
fn png_width(bytes: &[u8]) -> Result<usize, String> {
    let mut reader = png::Decoder::new(std::io::Cursor::new(bytes)).read_info().map_err(|e| e.to_string())?;
    let size = reader.output_buffer_size().ok_or("an image too large to hold")?;
    let mut buf = vec![0; size];
    let info = reader.next_frame(&mut buf).map_err(|e| e.to_string())?;
    Ok(info.width as usize)
}

/// The namespace of ePOS-Print XML (ePOS-Print XML User's Manual, `epos-print`).
const EPOS_PRINT_NS: &str = "http://www.epson-pos.com/schemas/2011/03/epos-print";

/// The elements an `epos-print` document may hold (ePOS-Print XML User's Manual, the
/// print elements); anything else is a schema error.
const EPOS_ELEMENTS: [&str; 22] = [
    "text",
    "feed",
    "image",
    "logo",
    "barcode",
    "symbol",
    "hline",
    "vline-begin",
    "vline-end",
    "page",
    "area",
    "direction",
    "position",
    "line",
    "rectangle",
    "cut",
    "pulse",
    "sound",
    "command",
    "layout",
    "recovery",
    "reset",
];

/// The job id and what prints of the first `ePOSPrint` of a `PrintRequestInfo`, read as
/// a TM printer reads it (Epson Server Direct Print User's Manual, "Print Data
/// Configuration" and "Print Data Details"): a `Parameter` with `devid`, a numeric
/// `timeout` and a `printjobid` of 1 to 30 letters, digits, `_`, `-` and `.`; `PrintData`
/// holding one `epos-print` document in Epson's namespace, whose elements are the manual's
/// and whose `image` data is `width` / 8 × `height` bytes. A job id that cannot be read
/// is an error (there is nothing to answer under); any other deviation is refused with
/// `SchemaError` ("there is a syntax error in the XML"), nothing printed.
fn parse_print_request(xml: &str) -> Result<(String, Printout), String> {
    let mut reader = quick_xml::Reader::from_str(xml);
    let mut path: Vec<String> = Vec::new();
    let (mut jobid, mut devid, mut timeout) = (None::<String>, None::<String>, None::<String>);
    let mut text = String::new();
    let (mut images, mut bytes, mut documents) = (0usize, 0usize, 0usize);
    let mut image_size: Option<usize> = None;
    let mut schema: Option<String> = None;
    let mut fault = |why: String| {
        schema.get_or_insert(why);
    };
    loop {
        let event = reader.read_event().map_err(|e| format!("PrintRequestInfo is not readable XML: {e}"))?;
        let (start, name) = match &event {
            Event::Start(e) => (Some(e), String::from_utf8_lossy(e.local_name().as_ref()).into_owned()),
            Event::Empty(e) => (Some(e), String::from_utf8_lossy(e.local_name().as_ref()).into_owned()),
            _ => (None, String::new()),
        };
        if let Some(e) = start {
            let parent = path.last().map(String::as_str).unwrap_or("");
            match (parent, name.as_str()) {
                ("", "PrintRequestInfo")
                | ("PrintRequestInfo", "ePOSPrint")
                | ("ePOSPrint", "Parameter" | "PrintData") => {}
                ("Parameter", "devid" | "timeout" | "printjobid") => {}
                ("PrintData", "epos-print") => {
                    documents += 1;
                    let ns = e
                        .attributes()
                        .flatten()
                        .find(|a| a.key.as_ref() == b"xmlns")
                        .map(|a| String::from_utf8_lossy(&a.value).into_owned());
                    if ns.as_deref() != Some(EPOS_PRINT_NS) {
                        fault(format!("epos-print in namespace {ns:?}"));
                    }
                }
                ("epos-print", element) if EPOS_ELEMENTS.contains(&element) => {
                    if element == "image" {
                        images += 1;
                        let attr = |k: &[u8]| {
                            e.attributes()
                                .flatten()
                                .find(|a| a.key.as_ref() == k)
                                .and_then(|a| String::from_utf8_lossy(&a.value).parse::<usize>().ok())
                        };
                        match (attr(b"width"), attr(b"height")) {
                            (Some(w), Some(h)) if w > 0 && h > 0 => image_size = Some(w.div_ceil(8) * h),
                            _ => fault("an image without its width and height".into()),
                        }
                    }
                }
                (_, element) if path.iter().any(|p| p == "epos-print") => {
                    fault(format!("<{element}> is not an element of ePOS-Print XML"))
                }
                (parent, element) => fault(format!("<{element}> inside <{parent}>")),
            }
        }
        match event {
            Event::Start(_) => path.push(name),
            Event::Text(t) => {
                let s = t.unescape().map_err(|e| format!("print data: {e}"))?;
                match path.last().map(String::as_str) {
                    Some("printjobid") => jobid = Some(s.trim().to_owned()),
                    Some("devid") => devid = Some(s.trim().to_owned()),
                    Some("timeout") => timeout = Some(s.trim().to_owned()),
                    Some("text") => text.push_str(&s),
                    Some("image") => {
                        let data = base64::engine::general_purpose::STANDARD.decode(s.trim()).unwrap_or_default();
                        if image_size != Some(data.len()) {
                            fault(format!("image data of {} bytes for {image_size:?}", data.len()));
                        }
                        bytes += data.len();
                    }
                    _ => {}
                }
            }
            Event::End(e) => {
                path.pop();
                if e.local_name().as_ref() == b"ePOSPrint" {
                    break;
                }
            }
            Event::Eof => break,
            _ => {}
        }
    }
    let jobid = jobid.ok_or("a print request without printjobid")?;
    if jobid.is_empty()
        || jobid.len() > 30
        || !jobid.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    {
        return Err(format!("printjobid {jobid:?} is not 1 to 30 letters, digits, _, - and ."));
    }
    if devid.as_deref().is_none_or(str::is_empty) {
        fault("no devid".into());
    }
    if timeout.as_deref().and_then(|t| t.parse::<u64>().ok()).is_none() {
        fault(format!("timeout {timeout:?} is not a number of milliseconds"));
    }
    if documents != 1 {
        fault(format!("{documents} epos-print documents in PrintData"));
    }
    if let Some(why) = schema {
        return Ok((jobid, Printout::refused("SchemaError", why, "epson_sdp")));
    }
    bytes += text.len();
    Ok((jobid, Printout::printed(text, bytes, images, Cut::Full)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn print_requests_are_read_like_a_tm_printer() {
        let xml =
            "<?xml version=\"1.0\" encoding=\"utf-8\"?>\n<PrintRequestInfo Version=\"2.00\"><ePOSPrint><Parameter>\
                   <devid>local_printer</devid><timeout>60000</timeout><printjobid>T.1</printjobid></Parameter>\
                   <PrintData><epos-print xmlns=\"http://www.epson-pos.com/schemas/2011/03/epos-print\">\
                   <text>Table 5&#10;1 x Noodles &amp; rice&#10;</text><feed line=\"3\"/><cut type=\"feed\"/>\
                   </epos-print></PrintData></ePOSPrint></PrintRequestInfo>";
        let (id, p) = parse_print_request(xml).expect("parses");
        assert_eq!((id.as_str(), p.text.as_str(), p.images), ("T.1", "Table 5\n1 x Noodles & rice\n", 0));
        assert!(parse_print_request("<PrintRequestInfo><ePOSPrint></ePOSPrint></PrintRequestInfo>").is_err());
        // What a TM printer would refuse: nothing prints, and it answers SchemaError.
        let refused = |from: &str, to: &str| {
            let bad = xml.replace(from, to);
            let (id, p) = parse_print_request(&bad).expect("a job id to answer under");
            assert_eq!((id.as_str(), p.refused), ("T.1", Some("SchemaError")), "{bad}");
        };
        refused("<feed line=\"3\"/>", "<blink/>");
        refused("2011/03/epos-print", "2011/03/other");
        refused("<timeout>60000</timeout>", "<timeout>soon</timeout>");
        refused("<devid>local_printer</devid>", "");
        refused("<text>Table 5", "<image width=\"16\" height=\"2\">AAAA</image><text>Table 5");
        // A job id Epson does not allow cannot be answered at all.
        assert!(parse_print_request(&xml.replace("T.1", "T 1")).is_err());
        let image = xml.replace("<text>Table 5", "<image width=\"16\" height=\"2\">AAAAAA==</image><text>Table 5");
        assert_eq!(parse_print_request(&image).expect("parses").1.images, 1, "4 bytes for 16 × 2 dots");
    }
}
