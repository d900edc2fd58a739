//! `onceprint demo`: the whole promise in one command, for a newcomer.
//!
//! It starts a broker on a temporary SQLite file, a printer simulator with two printers
//! (`kitchen` and `bar`), and a store agent, as real processes on loopback (the same
//! launchers as the benches); sets up a tenant `demo` with store `main` and an operator for
//! the console; sends a lunch rush of tickets (receipts and kitchen tickets, Chinese and
//! Latin, with a POS that retries some of them and sends some twice); runs the bar printer
//! out of paper after a few tickets and refills it a little later; prints a live progress
//! line; and ends with the day's reconciliation, the paper count of the simulator, and the
//! console's URL with the demo operator's login. It then keeps running until Ctrl-C (or
//! stops at once with `--exit`), and removes its temporary directory when it stops.
//!
//! It must never talk to anything but the processes it started on 127.0.0.1, and never
//! leave one of them running.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use hyper::body::Bytes;
use hyper::header::HeaderValue;
use hyper::Method;
use serde_json::{json, Value};

use crate::broker::{Broker, Launch};
use crate::http::{bearer, Conn};
use crate::procs::{agent_args, Proc};
use crate::setup::setup_call;
use crate::sim::{put_faults, start_sim};
use crate::BenchError;

/// The demo's login for the console.
pub const DEMO_TENANT: &str = "demo";
pub const DEMO_OPERATOR: &str = "demo";
pub const DEMO_PASSWORD: &str = "lunch rush demo";

/// What the demo does.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// The `onceprint` executable for the broker, the agent and the simulator.
    pub exe: PathBuf,
    /// The broker's port on 127.0.0.1 (the console's URL); 0 picks a free one.
    pub port: u16,
    /// Tickets of the lunch rush.
    pub tickets: usize,
    /// The bar printer runs out of paper after this many tickets…
    pub paper_out_after: usize,
    /// …and is refilled this long after.
    pub refill_after: Duration,
    /// Stop after the report instead of waiting for Ctrl-C.
    pub exit: bool,
}

impl DemoOptions {
    pub fn new(exe: impl Into<PathBuf>) -> DemoOptions {
        DemoOptions {
            exe: exe.into(),
            port: 8080,
            tickets: 30,
            paper_out_after: 6,
            refill_after: Duration::from_secs(8),
            exit: false,
        }
    }
}

/// What the demo saw.
#[derive(Debug, Clone, Default)]
pub struct DemoReport {
    pub tickets: usize,
    /// POS retries the broker answered as duplicates (nothing created, nothing charged).
    pub duplicates_answered: usize,
    pub printed: u64,
    /// Jobs on the simulated paper.
    pub paper_jobs: usize,
    pub failed: u64,
    pub in_doubt: u64,
    /// The day's reconciliation, as the broker answered it.
    pub reconciliation: Value,
    pub console_url: String,
}

impl DemoReport {
    /// Whether the promise held: every ticket printed, once.
    pub fn held(&self) -> bool {
        self.printed as usize == self.tickets
            && self.paper_jobs == self.tickets
            && self.reconciliation["printed_more_than_once"].as_array().is_some_and(|a| a.is_empty())
    }
}

/// One ticket of the rush: (business number, printer, print type, content).
fn ticket(i: usize) -> (String, &'static str, &'static str, Value) {
    const DISHES: [&str; 5] =
        ["牛肉面 Beef noodles", "宫保鸡丁 Kung pao chicken", "饺子 Dumplings", "炒饭 Fried rice", "豆浆 Soy milk"];
    let dish = DISHES[i % DISHES.len()];
    if i.is_multiple_of(2) {
        let doc = json!({"paper": "80mm", "blocks": [
            {"type": "text", "text": "Noodle Bar 面馆", "align": "center", "bold": true, "double_width": true},
            {"type": "text", "text": format!("Order A{:04}", 1000 + i)},
            {"type": "rule"},
            {"type": "row", "columns": [{"text": format!("1 x {dish}")}, {"text": "32.00", "align": "right"}]},
            {"type": "rule"},
            {"type": "row", "columns": [{"text": "Total"}, {"text": "32.00", "align": "right"}]},
            {"type": "qr", "data": format!("https://example.invalid/order/A{:04}", 1000 + i)},
            {"type": "cut"}
        ]});
        (format!("A{:04}", 1000 + i), "bar", "receipt", json!({"type": "doc", "doc": doc}))
    } else {
        let text = format!("厨房 KITCHEN  #{:04}\n1 x {dish}\n少辣 less spicy\n", 1000 + i);
        (format!("A{:04}", 1000 + i), "kitchen", "kitchen", json!({"type": "text", "text": text}))
    }
}

/// Runs the demo; `say` gets every line for the person watching (the progress line
/// starts with `\r` and has no newline).
pub async fn run_demo(options: &DemoOptions, mut say: impl FnMut(&str)) -> Result<DemoReport, BenchError> {
    let dir = tempfile::Builder::new()
        .prefix("onceprint-demo-")
        .tempdir()
        .map_err(|e| BenchError::io("creating the demo's directory", e))?;
    let admin = crate::random_hex(16)?;
    let sim = start_sim(&options.exe, 2, dir.path()).await?;
    let launch = Launch {
        exe: options.exe.clone(),
        database_url: format!("sqlite://{}", dir.path().join("demo.db").display()),
        admin_token: admin.clone(),
        log_path: dir.path().join("broker.log"),
        listen: SocketAddr::from(([127, 0, 0, 1], options.port)),
        config: None,
        extra_args: Vec::new(),
        default_rate_limits: false,
    };
    let broker = Broker::launch(&launch).await?;
    let base = broker.addr;
    say(&format!("broker on http://{base} (SQLite {}), printer simulator with 2 printers", dir.path().display()));

    let mut conn = Conn::connect(base).await.map_err(|detail| BenchError::Http { context: "demo".into(), detail })?;
    let admin_auth = bearer(&admin).map_err(BenchError::InvalidOptions)?;
    let tenant =
        setup_call(&mut conn, &admin_auth, "/v1/tenants", json!({"id": DEMO_TENANT, "name": "Noodle Bar"})).await?;
    let key = tenant["api_key"].as_str().unwrap_or_default().to_owned();
    let auth = bearer(&key).map_err(BenchError::InvalidOptions)?;
    setup_call(&mut conn, &auth, "/v1/stores", json!({"id": "main", "name": "Noodle Bar, Main Street"})).await?;
    for (i, name) in ["kitchen", "bar"].iter().enumerate() {
        let address = format!("tcp://127.0.0.1:{}", sim.first_port + i as u16);
        let body =
            json!({"id": name, "store_id": "main", "name": name, "transport": {"kind": "agent", "address": address}});
        setup_call(&mut conn, &auth, "/v1/printers", body).await?;
    }
    let token = setup_call(&mut conn, &auth, "/v1/stores/main/agent-tokens", json!({})).await?;
    let token = token["token"].as_str().unwrap_or_default().to_owned();
    setup_call(
        &mut conn,
        &auth,
        "/v1/operators",
        json!({"id": DEMO_OPERATOR, "name": "Demo Manager", "role": "manager", "password": DEMO_PASSWORD}),
    )
    .await?;
    let mut args = agent_args(base, &token, &dir.path().join("agent"), None);
    args.extend(["--status-interval-ms".to_string(), "1000".to_string()]);
    let agent = Proc::spawn("agent", &options.exe, &args, &dir.path().join("agent.log"))?;
    say("store agent started; the lunch rush begins");

    let mut control =
        Conn::connect(sim.control).await.map_err(|detail| BenchError::Http { context: "demo".into(), detail })?;
    let bar = format!("127.0.0.1:{}", sim.first_port + 1);
    let mut report = DemoReport { tickets: options.tickets, ..DemoReport::default() };
    let started = Instant::now();
    let mut paper_out_at: Option<Instant> = None;
    let mut refilled = false;
    let mut i = 0;
    let deadline = Duration::from_secs(120) + options.refill_after;
    loop {
        if i < options.tickets {
            let (biz_no, printer, print_type, content) = ticket(i);
            let body = json!({"biz_no": biz_no, "printer_id": printer, "print_type": print_type, "content": content});
            // Every third ticket the POS sends again (a retry after a timeout it thought it had).
            let sends = if i % 3 == 2 { 2 } else { 1 };
            for _ in 0..sends {
                let (status, answer) = conn
                    .request(Method::POST, "/v1/print-tasks", &auth, Some(Bytes::from(body.to_string())))
                    .await
                    .map_err(|detail| BenchError::Http { context: format!("submitting {biz_no}"), detail })?;
                match status.as_u16() {
                    201 => {}
                    200 => report.duplicates_answered += 1,
                    other => {
                        return Err(BenchError::Protocol {
                            context: format!("submitting {biz_no}"),
                            detail: format!("HTTP {other}: {}", String::from_utf8_lossy(&answer)),
                        })
                    }
                }
            }
            i += 1;
            if i == options.paper_out_after && paper_out_at.is_none() {
                put_faults(&mut control, &json!({"printer": bar, "paper_out": true}))
                    .await
                    .map_err(|detail| BenchError::Protocol { context: "paper out".into(), detail })?;
                paper_out_at = Some(Instant::now());
                say("\n-- the bar printer ran out of paper --");
            }
        }
        if !refilled && paper_out_at.is_some_and(|at| at.elapsed() >= options.refill_after) {
            put_faults(&mut control, &json!({"printer": bar, "paper_out": false}))
                .await
                .map_err(|detail| BenchError::Protocol { context: "refill".into(), detail })?;
            refilled = true;
            say("\n-- the bar printer has a new roll --");
        }
        let counts = state_counts(&mut conn, &auth).await;
        let open = counts.total.saturating_sub(counts.printed + counts.failed + counts.in_doubt);
        say(&format!(
            "\r{:>5.1} s  submitted {i}/{}  printed {}  waiting {open}  retries answered {}  failed {}  in doubt {}   ",
            started.elapsed().as_secs_f64(),
            options.tickets,
            counts.printed,
            report.duplicates_answered,
            counts.failed,
            counts.in_doubt
        ));
        report.printed = counts.printed;
        report.failed = counts.failed;
        report.in_doubt = counts.in_doubt;
        if i >= options.tickets && (paper_out_at.is_none() || refilled) && open == 0 {
            break;
        }
        if started.elapsed() > deadline {
            say("\nnot every ticket finished in time; see the report");
            break;
        }
        tokio::time::sleep(Duration::from_millis(if i < options.tickets { 250 } else { 500 })).await;
    }
    say("\n");

    let date = time::OffsetDateTime::now_utc().date();
    let (_, day) = conn
        .request(Method::GET, &format!("/v1/stores/main/reconciliation?date={date}"), &auth, None)
        .await
        .map_err(|detail| BenchError::Http { context: "reconciliation".into(), detail })?;
    report.reconciliation = serde_json::from_slice(&day).unwrap_or(Value::Null);
    // One line per job that came out of a printer (the simulator's paper log).
    report.paper_jobs = std::fs::read_to_string(&sim.paper_log)
        .map(|log| log.lines().filter(|l| !l.trim().is_empty()).count())
        .unwrap_or(0);
    report.console_url = format!("http://{base}/console/");
    let r = &report.reconciliation;
    say(&format!("The day ({date}, store main):"));
    say(&format!(
        "  submitted {}  printed {}  failed {}  in doubt {}  charged {} times",
        r["counts"]["submitted"],
        r["counts"]["printed"],
        r["counts"]["failed"],
        r["counts"]["in_doubt"],
        r["ledger"]["charges"]
    ));
    say(&format!(
        "  POS retries answered without a new task: {}; jobs on paper: {}; printed more than once: {}",
        report.duplicates_answered,
        report.paper_jobs,
        r["printed_more_than_once"].as_array().map(|a| a.len()).unwrap_or(0)
    ));
    say(if report.held() {
        "  Every ticket printed exactly once, through a paper-out and the POS's retries."
    } else {
        "  Not every ticket printed exactly once: see the console's attention list."
    });
    say(&format!(
        "Console: {}  (tenant {DEMO_TENANT}, operator {DEMO_OPERATOR}, password \"{DEMO_PASSWORD}\")",
        report.console_url
    ));
    say(&format!("Tenant API key for curl: {key}"));

    if !options.exit {
        say("The demo keeps running for the console; Ctrl-C stops it and removes its files.");
        let _ = tokio::signal::ctrl_c().await;
    }
    let mut problems = Vec::new();
    crate::procs::note_stop("agent", agent.stop().await, &mut problems);
    crate::procs::note_stop("broker", broker.stop().await, &mut problems);
    crate::procs::note_stop("printer-sim", sim.proc.stop().await, &mut problems);
    for p in problems {
        say(&format!("note: {p}"));
    }
    Ok(report)
}

#[derive(Default)]
struct Counts {
    total: u64,
    printed: u64,
    failed: u64,
    in_doubt: u64,
}

/// The store's tasks by state (the demo's few dozen fit in one page).
async fn state_counts(conn: &mut Conn, auth: &HeaderValue) -> Counts {
    let Ok((_, body)) = conn.request(Method::GET, "/v1/print-tasks?store_id=main&limit=500", auth, None).await else {
        return Counts::default();
    };
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let mut c = Counts::default();
    for t in v["tasks"].as_array().into_iter().flatten() {
        c.total += 1;
        match t["state"].as_str() {
            Some("printed") => c.printed += 1,
            Some("failed") => c.failed += 1,
            Some("in_doubt") => c.in_doubt += 1,
            _ => {}
        }
    }
    c
}
