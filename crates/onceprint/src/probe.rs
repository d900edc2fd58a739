//! `onceprint probe URL`: one HTTP GET that exits 0 on a 2xx answer and 1 otherwise.
//!
//! It exists for container health checks: the slim runtime image has no curl or wget, and
//! the binary already carries an HTTP client, so the image's `HEALTHCHECK` asks the broker's
//! `/readyz` through the broker's own executable instead of installing a tool for it.

use std::time::Duration;

use anyhow::Context as _;

/// `onceprint probe` options.
#[derive(clap::Args, Debug)]
pub struct ProbeArgs {
    /// The URL to GET, e.g. http://127.0.0.1:8080/readyz.
    url: String,
    /// Give up (and fail) when no complete answer came within this many milliseconds,
    /// connecting included.
    #[arg(long, default_value_t = 3_000, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..=600_000))]
    timeout_ms: u64,
    /// Accept any TLS certificate of an https URL. A broker with a certificate for its
    /// public name is probed on 127.0.0.1, where the name cannot match; the probe reads
    /// only a status code, so nothing secret is at stake.
    #[arg(long)]
    insecure: bool,
}

/// Sends the GET and says whether the answer was a 2xx. An answer outside 2xx is `Ok(false)`
/// with a line on stderr; no answer at all (refused, timed out, not HTTP) is an error.
pub async fn run(args: ProbeArgs) -> anyhow::Result<bool> {
    let timeout = Duration::from_millis(args.timeout_ms);
    let client = reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout)
        // A health check must judge the URL it was given, not wherever it redirects to.
        .redirect(reqwest::redirect::Policy::none())
        .danger_accept_invalid_certs(args.insecure)
        .build()
        .context("cannot set up the HTTP client")?;
    let response = client.get(&args.url).send().await.with_context(|| format!("GET {} failed", args.url))?;
    let status = response.status();
    if status.is_success() {
        Ok(true)
    } else {
        eprintln!("GET {} answered {status}", args.url);
        Ok(false)
    }
}
