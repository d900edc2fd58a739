//! The one middleware every route runs in: the request's id, span and access line
//! (`request_id`), its latency under the route template (`metrics`), and the agent
//! protocol check with the range on every answer (`agent_protocol`).
//!
//! They are one layer rather than three because axum wraps every route in each layer
//! separately, and each layer costs a waiting request its own boxed futures: with three
//! layers an idle agent's long poll held about 6 KiB more than with none, 60 MiB for
//! 10,000 agents (docs/BENCHMARKS.md, "Many idle agents"). The parts keep their rules in
//! their own modules; this only puts them in order.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument as _;

use crate::metrics::Timed;
use crate::request_id::Tag;
use crate::{agent_protocol, AppState};

/// Outermost the request's span (every log line of the request, the refusal's included,
/// names it), then the latency (refusals are answers and are counted), then the agent
/// protocol check, then the route's handler.
pub(crate) async fn around(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let tag = Tag::begin(&req);
    let timed = Timed::begin(&req);
    let mut res = async move {
        match agent_protocol::refuse(&req) {
            Some(refusal) => refusal,
            None => next.run(req).await,
        }
    }
    .instrument(tag.span().clone())
    .await;
    agent_protocol::stamp(&mut res);
    timed.finish(&st, res.status());
    tag.finish(&mut res);
    res
}
