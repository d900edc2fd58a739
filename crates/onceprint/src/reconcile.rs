//! `onceprint reconcile`: the daily reconciliation from the command line, for cron jobs.
//! Exits non-zero when the day has differences, so a failing cron mail is the alert.

use std::io::BufRead as _;
use std::path::PathBuf;

use anyhow::Context as _;

/// Flags of `onceprint reconcile`.
#[derive(Debug, clap::Args)]
pub struct ReconcileArgs {
    /// The broker, e.g. http://127.0.0.1:8080.
    #[arg(long, env = "ONCEPRINT_SERVER")]
    pub server: String,
    /// A tenant API key.
    #[arg(long, env = "ONCEPRINT_API_KEY", hide_env_values = true)]
    pub token: String,
    /// The store.
    #[arg(long)]
    pub store: String,
    /// The business day, YYYY-MM-DD, in the store's time zone.
    #[arg(long)]
    pub date: String,
    /// Expected orders: a CSV file whose first column is the biz_no (a `biz_no` header
    /// line is skipped).
    #[arg(long)]
    pub expected: Option<PathBuf>,
    /// Print CSV instead of a readable summary.
    #[arg(long)]
    pub csv: bool,
    /// Print the JSON report.
    #[arg(long, conflicts_with = "csv")]
    pub json: bool,
}

/// Reads the expected business numbers with a progress bar on large files.
fn read_expected(path: &PathBuf) -> anyhow::Result<Vec<String>> {
    let file = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    // A bar only for files large enough to take a moment, and only for a person at a
    // terminal (indicatif hides itself otherwise).
    let bar = if size > 1_000_000 { indicatif::ProgressBar::new(size) } else { indicatif::ProgressBar::hidden() };
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg} {bar:40} {bytes}/{total_bytes}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_message("reading expected orders");
    let mut out = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("{}: line {}", path.display(), i + 1))?;
        bar.inc(line.len() as u64 + 1);
        let first = line.split(',').next().unwrap_or("").trim().trim_matches('"');
        if first.is_empty() || (i == 0 && first.eq_ignore_ascii_case("biz_no")) {
            continue;
        }
        out.push(first.to_owned());
    }
    bar.finish_and_clear();
    Ok(out)
}

pub async fn run(args: ReconcileArgs) -> anyhow::Result<bool> {
    let url =
        format!("{}/v1/stores/{}/reconciliation?date={}", args.server.trim_end_matches('/'), args.store, args.date);
    let client = reqwest::Client::new();
    let req = match &args.expected {
        Some(path) => client.post(&url).json(&read_expected(path)?),
        None => client.get(&url),
    };
    let req = req.bearer_auth(&args.token);
    let req = if args.csv { req.header("accept", "text/csv") } else { req };
    let res = req.send().await.with_context(|| format!("cannot reach {}", args.server))?;
    let status = res.status();
    let body = res.text().await.context("cannot read the answer")?;
    if !status.is_success() {
        anyhow::bail!("the broker answered {status}: {body}");
    }
    if args.csv {
        print!("{body}");
        // The CSV carries the lists; differences are any of their rows.
        let differs = body.lines().any(|l| {
            l.starts_with("expected_not_printed,")
                || l.starts_with("printed_not_expected,")
                || l.starts_with("printed_more_than_once,")
                || l.starts_with("device_printed_broker_not,")
                || l.starts_with("broker_printed_device_not,")
        });
        return Ok(!differs);
    }
    let report: serde_json::Value = serde_json::from_str(&body).context("the answer is not JSON")?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let c = &report["counts"];
        let l = &report["ledger"];
        println!(
            "store {} · {} ({})",
            report["store_id"].as_str().unwrap_or("?"),
            args.date,
            report["timezone"].as_str().unwrap_or("?")
        );
        println!(
            "submitted {}  printed {}  reprinted {}  failed {}  in doubt {}  transferred {}  cancelled {}  closed {}  open {}",
            c["submitted"], c["printed"], c["reprinted"], c["failed"], c["in_doubt"], c["transferred"], c["cancelled"], c["closed"], c["open"]
        );
        println!(
            "charges {} ({})  refunds {} ({})",
            l["charges"], l["charged_amount"], l["refunds"], l["refunded_amount"]
        );
        for (key, title) in [
            ("expected_not_printed", "expected but not printed"),
            ("printed_not_expected", "printed but not expected"),
            ("printed_more_than_once", "PRINTED MORE THAN ONCE"),
        ] {
            let list: Vec<&str> =
                report[key].as_array().map(|a| a.iter().filter_map(|v| v.as_str()).collect()).unwrap_or_default();
            if !list.is_empty() {
                println!("{title} ({}): {}", list.len(), list.join(", "));
            }
        }
    }
    // The device log's differences: one line per task, with what each side says.
    if !args.json {
        if report["device_log"] == "none" {
            println!("device log: none uploaded for this day");
        }
        for (key, title) in [
            ("device_printed_broker_not", "printed by the device, not by the broker"),
            ("broker_printed_device_not", "printed by the broker, not in the device log"),
        ] {
            let list = report[key].as_array().cloned().unwrap_or_default();
            if !list.is_empty() {
                println!("{title} ({}):", list.len());
            }
            for d in list {
                let text = |f: &str| d[f].as_str().unwrap_or("-").to_owned();
                println!(
                    "  {} {} on {}: device {}, broker {}",
                    text("task_id"),
                    text("key"),
                    text("printer_id"),
                    text("device_state"),
                    text("broker_state")
                );
            }
        }
    }
    let differs = [
        "expected_not_printed",
        "printed_not_expected",
        "printed_more_than_once",
        "device_printed_broker_not",
        "broker_printed_device_not",
    ]
    .iter()
    .any(|k| report[*k].as_array().is_some_and(|a| !a.is_empty()));
    Ok(!differs)
}
