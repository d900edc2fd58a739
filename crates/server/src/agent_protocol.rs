//! The agent protocol version (README, "Agent protocol versions"): the agent names the
//! version it speaks in `Onceprint-Agent-Protocol` on every request to `/v1/agent/…`, and
//! the broker names the range it serves in `Onceprint-Agent-Protocols: MIN-MAX` on every
//! answer, so that either side can tell its user which one to upgrade.
//!
//! A request without the header comes from an agent of a release before versioning, which
//! spoke version 1, and is served as 1. A version outside the range is refused before any
//! handler runs, with `426 agent_protocol_unsupported` and a message saying which side to
//! upgrade; nothing of the request (poll, ack, status) takes effect.

use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::ApiError;

/// The request header with the agent's protocol version.
pub const AGENT_HEADER: HeaderName = HeaderName::from_static("onceprint-agent-protocol");
/// The answer header with the range of agent protocol versions this broker serves.
pub const BROKER_HEADER: HeaderName = HeaderName::from_static("onceprint-agent-protocols");
/// The oldest agent protocol this broker serves. Raised only after a release that served
/// both the old and the new version, so that agents can be upgraded first.
pub const MIN: u32 = 1;
/// The newest agent protocol this broker serves. Version 2: acks may ask for the next
/// deliveries (`next`), and their answer carries them (`deliveries`); an agent uses it
/// only with a broker that names 2 in its range. Version 3: a poll may say how long the
/// agent process has been running (`session_age_ms`), so that the broker orders an agent
/// id's sessions on its own clock; an agent sends it only to a broker that names 3.
/// Version 4: the upload of offline tasks may say the agent's clock (`sent_at`), so that
/// the broker corrects the times of a shop PC whose clock is far off; an agent sends it
/// only to a broker that names 4.
pub const MAX: u32 = 4;

/// The version a request names: the header's, or 1 without one. `Err` for a header that
/// is not a number (an answer naming the range is as useful for it as for a wrong number).
fn requested(req: &Request) -> Result<u32, String> {
    match req.headers().get(&AGENT_HEADER) {
        None => Ok(1),
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .ok_or_else(|| format!("{AGENT_HEADER} must be a version number, got {v:?}")),
    }
}

/// The refusal of version `v` (or of an unreadable header), naming what to do.
fn refusal(v: Result<u32, String>) -> ApiError {
    let range = if MIN == MAX { format!("{MIN}") } else { format!("{MIN} to {MAX}") };
    let what = match v {
        Ok(v) if v < MIN => format!(
            "this agent speaks agent protocol {v}, which this broker no longer serves (it serves {range}): \
             upgrade the agent to a release that speaks {range}"
        ),
        Ok(v) => format!(
            "this agent speaks agent protocol {v}, newer than this broker serves ({range}): upgrade the broker \
             to the agent's release or later, or run an agent release that speaks {range}"
        ),
        Err(why) => format!("{why}; this broker serves agent protocol {range}"),
    };
    ApiError::new(StatusCode::UPGRADE_REQUIRED, "agent_protocol_unsupported", what)
}

/// The refusal of an agent request of a version outside `MIN..=MAX`, before any handler
/// runs; `None` for every other request.
pub(crate) fn refuse(req: &Request) -> Option<Response> {
    if !req.uri().path().starts_with("/v1/agent/") {
        return None;
    }
    match requested(req) {
        Ok(v) if (MIN..=MAX).contains(&v) => None,
        other => Some(refusal(other).into_response()),
    }
}

/// Puts the range this broker serves on an answer (every answer carries it).
pub(crate) fn stamp(resp: &mut Response) {
    resp.headers_mut().insert(BROKER_HEADER, HeaderValue::from_static(RANGE));
}

/// `MIN-MAX` as the header carries it; a test below keeps it in step with the constants.
const RANGE: &str = "1-4";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_range_header_matches_the_constants() {
        assert_eq!(RANGE, format!("{MIN}-{MAX}"));
    }
}
