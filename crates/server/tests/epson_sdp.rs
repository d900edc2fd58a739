//! Epson Server Direct Print through the public interface, on SQLite and PostgreSQL: the
//! real server, a TM printer played over HTTP (form posts, as the printer sends them) or
//! the printer simulator in its Epson mode.

mod common;

use std::time::Duration;

use common::{events_of, job_id, printer_with_login, wait_state, TestApp};
use onceprint_printer_sim::{FaultUpdate, Faults, PolledPrinter, Protocol, SimConfig, Simulator};
use reqwest::StatusCode;
use serde_json::{json, Value};

both_backends!(
    config = crate::common::fast_polled;
    a_get_request_hands_out_epos_xml_with_a_job_id_and_its_result_prints_it,
    paper_end_puts_one_ticket_in_doubt_and_the_others_wait_for_the_paper,
    errors_after_the_data_left_go_to_a_person_never_to_the_printer_again,
    unreadable_results_are_refused_and_a_refusal_of_the_data_fails_the_job,
    a_get_request_while_a_job_is_unconfirmed_puts_it_in_doubt,
    wrong_logins_and_ids_are_refused_and_raw_escpos_is_refused,
    the_simulated_tm_printer_prints_every_task_once,
    a_strict_simulated_tm_printer_prints_documents_markup_and_text_once,
);

/// A TM printer played over HTTP.
struct Tm {
    url: String,
    user: String,
    pass: String,
    id: Option<String>,
    http: reqwest::Client,
}

impl Tm {
    async fn new(app: &TestApp, key: &str, printer: &str, id: Option<&str>) -> Tm {
        let mut transport = json!({"kind": "epson_sdp"});
        if let Some(id) = id {
            transport["printer_id"] = json!(id);
        }
        let (user, pass) = printer_with_login(app, key, printer, transport).await;
        Tm {
            url: format!("{}/epson-sdp", app.base),
            user,
            pass,
            id: id.map(str::to_owned),
            http: reqwest::Client::new(),
        }
    }

    async fn post(&self, form: &[(&str, &str)]) -> (StatusCode, reqwest::header::HeaderMap, String) {
        let mut form: Vec<(&str, &str)> = form.to_vec();
        if let Some(id) = &self.id {
            form.push(("ID", id));
        }
        let res =
            self.http.post(&self.url).basic_auth(&self.user, Some(&self.pass)).form(&form).send().await.expect("post");
        let (s, h) = (res.status(), res.headers().clone());
        (s, h, res.text().await.expect("body"))
    }

    /// A GetRequest; the PrintRequestInfo (empty when there is nothing to print).
    async fn get_request(&self) -> String {
        let (s, h, body) = self.post(&[("ConnectionType", "GetRequest")]).await;
        assert_eq!(s, StatusCode::OK, "{body}");
        assert!(h.get("content-type").and_then(|v| v.to_str().ok()).is_some_and(|c| c.starts_with("text/xml")));
        body
    }

    /// Results as a TM printer reports them: (printjobid, success, code).
    async fn set_response(&self, results: &[(&str, bool, &str)]) -> String {
        let mut file = String::from("<?xml version=\"1.0\" encoding=\"utf-8\"?>\n<PrintResponseInfo Version=\"2.00\">");
        for (id, ok, code) in results {
            file.push_str(&format!(
                "<ePOSPrint><Parameter><devid>local_printer</devid><printjobid>{id}</printjobid></Parameter>\
                 <PrintResponse><response xmlns=\"http://www.epson-pos.com/schemas/2011/03/epos-print\" \
                 success=\"{ok}\" code=\"{code}\" status=\"251658262\" battery=\"0\"/></PrintResponse></ePOSPrint>"
            ));
        }
        file.push_str("</PrintResponseInfo>");
        let (s, h, body) = self.post(&[("ConnectionType", "SetResponse"), ("ResponseFile", &file)]).await;
        assert_eq!(s, StatusCode::OK, "{body}");
        h.get("x-onceprint-results").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned()
    }
}

/// The `printjobid` of a PrintRequestInfo.
async fn submit(app: &TestApp, key: &str, printer: &str, biz_no: &str) -> String {
    let a = app
        .submit(key, json!({"biz_no": biz_no, "printer_id": printer, "content": {"type": "text", "text": format!("order {biz_no}\n")}}))
        .await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    a.body["task_id"].as_str().expect("task_id").to_owned()
}

async fn task(app: &TestApp, key: &str, id: &str) -> Value {
    app.get(&format!("/v1/print-tasks/{id}"), key).await.body
}

async fn a_get_request_hands_out_epos_xml_with_a_job_id_and_its_result_prints_it(app: &TestApp) {
    let key = app.tenant("acme").await;
    let tm = Tm::new(app, &key, "tm", Some("TM-1")).await;
    assert_eq!(tm.get_request().await, "", "nothing to print: an empty answer");
    let id = submit(app, &key, "tm", "A1").await;
    let xml = tm.get_request().await;
    assert!(xml.starts_with("<?xml"), "{xml}");
    assert!(!xml.contains("Envelope"), "no SOAP envelope: {xml}");
    assert!(
        xml.contains("<PrintRequestInfo Version=\"2.00\"><ePOSPrint><Parameter><devid>local_printer</devid>"),
        "{xml}"
    );
    assert!(xml.contains("<timeout>"), "{xml}");
    assert_eq!(xml.matches("<ePOSPrint>").count(), 1);
    assert!(xml.contains("<epos-print xmlns=\"http://www.epson-pos.com/schemas/2011/03/epos-print\">"), "{xml}");
    assert!(xml.contains("<text>order A1&#10;") && xml.contains("<cut type=\"feed\"/>"), "{xml}");
    let jobid = job_id(&xml);
    assert!(jobid.starts_with(&id) && jobid.len() <= 30, "{jobid}");
    let t = task(app, &key, &id).await;
    assert_eq!((t["state"].as_str(), t["attempts"].as_i64()), (Some("sent"), Some(1)));
    let events = events_of(app, &key, &id).await;
    assert!(events.iter().any(|e| e.2.contains("with its data (fetched)")), "{events:?}");
    let results = tm.set_response(&[(&jobid, true, "")]).await;
    assert_eq!(results, format!("{jobid}=applied"));
    let t = task(app, &key, &id).await;
    assert_eq!(t["state"], "printed", "{t}");
    assert_eq!(tm.set_response(&[(&jobid, true, "")]).await, format!("{jobid}=duplicate"));
    assert_eq!(tm.get_request().await, "");
    let p = app.get("/v1/printers/tm", &key).await.body;
    assert_eq!((p["online"].as_bool(), p["last_error"].is_null()), (Some(true), true), "{p}");
}

/// One paper change, one item for a person (docs/RESULT-CODES.md): the ticket the printer
/// was printing when the roll ended may be partly on paper and goes to a person; the ones
/// handed to it while it is known to be out of paper are answered "before printing" and
/// wait for the paper, in order.
async fn paper_end_puts_one_ticket_in_doubt_and_the_others_wait_for_the_paper(app: &TestApp) {
    let key = app.tenant("acme").await;
    let tm = Tm::new(app, &key, "tm", None).await;
    let a1 = submit(app, &key, "tm", "A1").await;
    let a2 = submit(app, &key, "tm", "A2").await;
    let a3 = submit(app, &key, "tm", "A3").await;
    let first = job_id(&tm.get_request().await);
    assert!(first.starts_with(&a1));
    assert_eq!(tm.set_response(&[(&first, false, "EPTR_REC_EMPTY")]).await, format!("{first}=applied"));
    let t = task(app, &key, &a1).await;
    assert_eq!((t["state"].as_str(), t["last_error"].as_str()), (Some("in_doubt"), Some("in_doubt")), "{t}");
    assert_eq!(app.get("/v1/printers/tm", &key).await.body["last_error"], "no_paper");
    // The next ticket meets a printer known to be out of paper: nothing printed, it waits.
    let second = job_id(&tm.get_request().await);
    assert!(second.starts_with(&a2), "{second}");
    assert_eq!(tm.set_response(&[(&second, false, "EPTR_REC_EMPTY")]).await, format!("{second}=applied"));
    let t = task(app, &key, &a2).await;
    assert_eq!((t["state"].as_str(), t["last_error"].as_str()), (Some("retrying"), Some("no_paper")), "{t}");
    // The lane waits for the paper: until the retry is due (50 ms here, which a loaded
    // machine may take to ask again) nothing goes out, and then the waiting ticket again
    // (a new job id), never the next one.
    let mut next = tm.get_request().await;
    if next.is_empty() {
        tokio::time::sleep(Duration::from_millis(250)).await;
        next = tm.get_request().await;
    }
    let third = job_id(&next);
    assert!(third.starts_with(&a2) && third != second, "{third}");
    // The second job's result again, late (the printer resent it): stale, credited to it.
    assert_eq!(tm.set_response(&[(&second, false, "EPTR_COVER_OPEN")]).await, format!("{second}=stale"));
    assert_eq!(tm.set_response(&[(&third, true, "")]).await, format!("{third}=applied"));
    assert_eq!(task(app, &key, &a2).await["state"], "printed");
    assert!(app.get("/v1/printers/tm", &key).await.body["last_error"].is_null());
    let fourth = job_id(&tm.get_request().await);
    assert!(fourth.starts_with(&a3), "{fourth}");
    assert_eq!(tm.set_response(&[(&fourth, true, "")]).await, format!("{fourth}=applied"));
    // One item on the attention list; the first ticket was never handed out again.
    let attention = app.get("/v1/stores/s1/attention", &key).await.body;
    let items: Vec<&str> = attention["tasks"]
        .as_array()
        .map(|a| a.iter().filter_map(|t| t["task_id"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(items, vec![a1.as_str()], "{attention}");
    assert_eq!(task(app, &key, &a1).await["attempts"], 1);
    // A job id that names nothing of this printer is credited to nothing.
    assert_eq!(tm.set_response(&[("GARBAGE", true, "")]).await, "GARBAGE=unknown");
}

/// Codes that can follow printing, and codes Epson does not document, may have printed:
/// the ticket goes to a person and its data is never handed out again.
async fn errors_after_the_data_left_go_to_a_person_never_to_the_printer_again(app: &TestApp) {
    let key = app.tenant("acme").await;
    let tm = Tm::new(app, &key, "tm", None).await;
    for (n, code) in ["EPTR_CUTTER", "EPTR_AUTOMATICAL", "EPTR_MECHANICAL", "EPTR_UNRECOVERABLE", "EPTR_NEW_CODE"]
        .into_iter()
        .enumerate()
    {
        let id = submit(app, &key, "tm", &format!("C{n}")).await;
        let job = job_id(&tm.get_request().await);
        assert!(job.starts_with(&id), "{job}");
        assert_eq!(tm.set_response(&[(&job, false, code)]).await, format!("{job}=applied"));
        let t = task(app, &key, &id).await;
        assert_eq!((t["state"].as_str(), t["attempts"].as_i64()), (Some("in_doubt"), Some(1)), "{code}: {t}");
        let events = events_of(app, &key, &id).await;
        assert!(events.last().is_some_and(|e| e.2.contains(code)), "{events:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(tm.get_request().await, "", "{code}: never handed out again");
    }
}

/// A ResponseFile that cannot be read is refused with the reason and noted on the job in
/// flight; Epson's own refusal of the print data fails the job (nothing printed).
async fn unreadable_results_are_refused_and_a_refusal_of_the_data_fails_the_job(app: &TestApp) {
    let key = app.tenant("acme").await;
    let tm = Tm::new(app, &key, "tm", None).await;
    let id = submit(app, &key, "tm", "X1").await;
    let job = job_id(&tm.get_request().await);
    let cases = [
        ("", "empty"),
        ("OK", "not an XML document"),
        (
            "<soap:Envelope xmlns:soap=\"http://schemas.xmlsoap.org/soap/envelope/\"><soap:Body/></soap:Envelope>",
            "SOAP",
        ),
        ("<PrintResponseInfo Version=\"2.00\"><ePOSPrint><Parameter><printjobid>", "truncated"),
    ];
    for (file, what) in cases {
        let (s, _, body) = tm.post(&[("ConnectionType", "SetResponse"), ("ResponseFile", file)]).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{file:?}: {body}");
        let v: Value = serde_json::from_str(&body).expect("the JSON error body");
        assert_eq!(v["error"]["code"], "invalid_request");
        assert!(v["error"]["message"].as_str().unwrap_or_default().contains(what), "{v}");
    }
    let t = task(app, &key, &id).await;
    assert_eq!((t["state"].as_str(), t["attempts"].as_i64()), (Some("sent"), Some(1)), "nothing applied: {t}");
    let events = events_of(app, &key, &id).await;
    assert_eq!(events.iter().filter(|e| e.2.contains("a SetResponse was refused")).count(), 4, "{events:?}");
    // Version 3.00: the printer could not use the print data at all.
    let refused = r#"<?xml version="1.0" encoding="utf-8"?><PrintResponseInfo Version="3.00"><ServerDirectPrint>
<Response Success="false"><ErrorSummary>Invalid XML format</ErrorSummary><ErrorDetail>Entity: line 9: parser error</ErrorDetail></Response>
</ServerDirectPrint></PrintResponseInfo>"#;
    let (s, h, _) = tm.post(&[("ConnectionType", "SetResponse"), ("ResponseFile", refused)]).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(h.get("x-onceprint-results").and_then(|v| v.to_str().ok()), Some(format!("{job}=applied").as_str()));
    let t = task(app, &key, &id).await;
    assert_eq!((t["state"].as_str(), t["last_error"].as_str()), (Some("failed"), Some("refused")), "{t}");
    let events = events_of(app, &key, &id).await;
    assert!(events.last().is_some_and(|e| e.2.contains("Invalid XML format")), "{events:?}");
}

async fn a_get_request_while_a_job_is_unconfirmed_puts_it_in_doubt(app: &TestApp) {
    let key = app.tenant("acme").await;
    let tm = Tm::new(app, &key, "tm", None).await;
    let first = submit(app, &key, "tm", "A1").await;
    let second = submit(app, &key, "tm", "A2").await;
    let job1 = job_id(&tm.get_request().await);
    assert!(job1.starts_with(&first));
    // The printer asks again without a result for the first job: it may have printed.
    let xml = tm.get_request().await;
    let t = task(app, &key, &first).await;
    assert_eq!(t["state"], "in_doubt", "{t}");
    let job2 = job_id(&xml);
    assert!(job2.starts_with(&second), "the lane moves on: {xml}");
    // The first job's late success is credited to it, never to the second.
    assert_eq!(tm.set_response(&[(&job1, true, "")]).await, format!("{job1}=applied"));
    assert_eq!(task(app, &key, &first).await["state"], "printed");
    let t = task(app, &key, &second).await;
    assert_eq!((t["state"].as_str(), t["attempts"].as_i64()), (Some("sent"), Some(1)), "{t}");
    assert_eq!(tm.set_response(&[(&job2, true, "")]).await, format!("{job2}=applied"));
    assert_eq!(task(app, &key, &second).await["state"], "printed");
}

async fn wrong_logins_and_ids_are_refused_and_raw_escpos_is_refused(app: &TestApp) {
    let key = app.tenant("acme").await;
    let tm = Tm::new(app, &key, "tm", Some("TM-1")).await;
    let id = submit(app, &key, "tm", "A1").await;
    let form = [("ConnectionType", "GetRequest"), ("ID", "TM-2")];
    let res = tm.http.post(&tm.url).basic_auth(&tm.user, Some(&tm.pass)).form(&form).send().await.expect("post");
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "another ID");
    let form = [("ConnectionType", "GetRequest"), ("ID", "TM-1")];
    let res = tm.http.post(&tm.url).basic_auth(&tm.user, Some("wrong")).form(&form).send().await.expect("post");
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "wrong password");
    assert!(res.headers().get("www-authenticate").is_some());
    let res = tm.http.post(&tm.url).form(&form).send().await.expect("post");
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "no login");
    assert_eq!(task(app, &key, &id).await["state"], "pending", "nothing moved");
    // A CloudPRNT printer's login is not an Epson printer's.
    let (user, pass) =
        printer_with_login(app, &key, "star", json!({"kind": "cloudprnt", "mac": "00:11:62:aa:bb:cc"})).await;
    let res = tm.http.post(&tm.url).basic_auth(&user, Some(&pass)).form(&form).send().await.expect("post");
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let (s, _, body) = tm.post(&[("ConnectionType", "Subscribe")]).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(task(app, &key, &id).await["state"], "pending", "nothing moved");
    let a = app
        .submit(
            &key,
            json!({"biz_no": "E1", "printer_id": "tm", "content": {"type": "escpos", "data": "G0AKSGkKHVYA"}}),
        )
        .await;
    assert_eq!((a.status, a.code()), (StatusCode::BAD_REQUEST, "invalid_content"), "{a:?}");
    assert!(a.body["error"]["message"].as_str().is_some_and(|m| m.contains("epson_sdp")), "{a:?}");
}

/// Printer `tm` (`TM-1`) and the simulated TM printer that polls for it.
async fn simulated_tm(app: &TestApp, key: &str, poll: Duration, faults: Faults) -> Simulator {
    let (user, pass) = printer_with_login(app, key, "tm", json!({"kind": "epson_sdp", "printer_id": "TM-1"})).await;
    let printer = PolledPrinter {
        url: format!("{}/epson-sdp", app.base),
        username: user,
        password: pass,
        protocol: Protocol::EpsonSdp { id: Some("TM-1".into()) },
        poll_interval: poll,
    };
    Simulator::start_polled(printer, SimConfig { faults, ..SimConfig::ephemeral() }).await.expect("sim")
}

async fn the_simulated_tm_printer_prints_every_task_once(app: &TestApp) {
    let key = app.tenant("acme").await;
    let faults = Faults { paper_out: true, ..Faults::default() };
    let sim = simulated_tm(app, &key, Duration::from_millis(200), faults).await;
    // The broker cannot know the roll is empty before the first job's result: that ticket
    // goes to a person (nothing came out: a reprint settles it). The next one meets a
    // printer known to be empty and waits for the paper.
    let a1 = submit(app, &key, "tm", "A1").await;
    wait_state(app, &key, &a1, "in_doubt", Duration::from_secs(5)).await;
    let a2 = submit(app, &key, "tm", "A2").await;
    wait_state(app, &key, &a2, "retrying", Duration::from_secs(5)).await;
    sim.faults().update_all(FaultUpdate { paper_out: Some(false), ..FaultUpdate::default() });
    wait_state(app, &key, &a2, "printed", Duration::from_secs(5)).await;
    // A result lost on the way comes late: after the next GetRequest put the job in doubt,
    // it still closes its own job.
    sim.faults().update_all(FaultUpdate { lost_result: Some(1), ..FaultUpdate::default() });
    let a3 = submit(app, &key, "tm", "A3").await;
    wait_state(app, &key, &a3, "printed", Duration::from_secs(5)).await;
    let events = events_of(app, &key, &a3).await;
    assert!(events.iter().any(|e| e.1 == "in_doubt"), "{events:?}");
    let jobs = sim.jobs().all();
    for (biz, copies) in [("A1", 0), ("A2", 1), ("A3", 1)] {
        assert_eq!(jobs.iter().filter(|j| j.text.contains(&format!("order {biz}\n"))).count(), copies, "{jobs:?}");
    }
    assert_eq!(task(app, &key, &a1).await["state"], "in_doubt");
    assert!(jobs.iter().all(|j| j.printer == "epson_sdp:TM-1"));
    sim.shutdown().await;
}

/// The simulated TM printer reads the print request as Epson's manuals define it and
/// refuses anything else with `SchemaError` (nothing printed): a receipt document and
/// Chinese markup print once each as one raster image, an ASCII text ticket as text.
async fn a_strict_simulated_tm_printer_prints_documents_markup_and_text_once(app: &TestApp) {
    let key = app.tenant("acme").await;
    let sim = simulated_tm(app, &key, Duration::from_millis(100), Faults::default()).await;
    let doc = json!({"type": "doc", "doc": {"blocks": [
        {"type": "text", "text": "Table 7", "bold": true}, {"type": "cut", "mode": "full"}]}});
    let mut ids = Vec::new();
    for (biz, content) in [
        ("D1", doc),
        ("M1", json!({"type": "markup", "markup": "[center]桌 7\n1 x 鱼汤\n"})),
        ("T1", json!({"type": "text", "text": "order T1\n"})),
    ] {
        let a = app.submit(&key, json!({"biz_no": biz, "printer_id": "tm", "content": content})).await;
        assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
        ids.push(a.body["task_id"].as_str().expect("task_id").to_owned());
    }
    for t in &ids {
        wait_state(app, &key, t, "printed", Duration::from_secs(10)).await;
    }
    let jobs = sim.jobs().all();
    assert_eq!(jobs.len(), 3, "each ticket once: {jobs:?}");
    assert_eq!(jobs.iter().filter(|j| j.images == 1).count(), 2, "{jobs:?}");
    assert!(jobs.iter().any(|j| j.images == 0 && j.text == "order T1\n"), "{jobs:?}");
}
