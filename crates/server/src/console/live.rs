//! The live view: server-sent events that tell an open overview or attention page to
//! refresh itself when something it shows changed (a printer went offline or ran out of
//! paper, a ticket landed in doubt, a lane grew).
//!
//! Each stream looks at the store every `live_interval_ms` and sends a `change` event
//! when the digest of what those pages show differs from the last one sent; the page's
//! script then fetches its own content again and swaps it in. Looking is cheap (the
//! printers of one store, its attention list and lane figures) and only as frequent as a
//! person could notice; sending only changes keeps an idle page quiet except for the
//! keep-alive comments that hold the connection open through proxies and tell the
//! server, by a failed write, that the browser went away (the stream then ends).

use std::collections::hash_map::DefaultHasher;
use std::convert::Infallible;
use std::hash::{Hash, Hasher};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream;

use super::auth::ConsoleUser;
use super::ConsoleError;
use crate::error::ApiError;
use crate::AppState;

/// How often an idle stream writes a keep-alive comment (see `events`).
const KEEP_ALIVE: Duration = Duration::from_secs(3);

/// One open live view.
struct Live {
    st: AppState,
    tenant: String,
    store: String,
    secret: String,
    last: u64,
    hello: bool,
    /// Keeps the open-streams gauge up while the stream lives.
    _counted: crate::metrics::LiveViewGuard,
}

/// What the live pages show of a store, hashed.
async fn digest(st: &AppState, tenant_id: &str, store_id: &str) -> Result<u64, ConsoleError> {
    let mut h = DefaultHasher::new();
    for p in st.store.list_printers(tenant_id, Some(store_id)).await? {
        (p.id, p.enabled, p.online, p.last_error, p.last_seen_at).hash(&mut h);
    }
    for t in st.store.attention(tenant_id, store_id, 200).await? {
        (t.task_id, t.state.as_str(), t.updated_at).hash(&mut h);
    }
    for l in st.store.lane_stats().await? {
        if l.tenant_id == tenant_id && l.store_id == store_id {
            (l.printer_id, l.waiting, l.oldest_waiting_at, l.in_flight_since).hash(&mut h);
        }
    }
    Ok(h.finish())
}

/// `GET /console/stores/{store}/live`: `change` events for the store's live pages.
pub async fn events(
    State(st): State<AppState>,
    user: ConsoleUser,
    Path(store_id): Path<String>,
) -> Result<Response, ConsoleError> {
    let tenant_id = user.operator().tenant_id.clone();
    if !user.operator().may_see_store(&store_id) || st.store.get_store(&tenant_id, &store_id).await?.is_none() {
        return Err(ConsoleError::Api(ApiError::not_found(format!("no store {store_id:?}"))));
    }
    let every = Duration::from_millis(st.config.console.live_interval_ms.max(100));
    let first = digest(&st, &tenant_id, &store_id).await?;
    // The stream says `expired` once the session expired or was revoked, so a page left
    // open does not outlive its login: the script then reloads and lands on the login page.
    let counted = st.metrics.live_view();
    let seed = Live {
        st,
        tenant: tenant_id,
        store: store_id,
        secret: user.secret.clone(),
        last: first,
        hello: true,
        _counted: counted,
    };
    let s = stream::unfold(seed, move |mut l| async move {
        if l.hello {
            l.hello = false;
            let ev = Event::default().event("hello").data(l.last.to_string());
            return Some((Ok::<Event, Infallible>(ev), l));
        }
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = l.st.lanes.signals().shutdown() => return None,
            }
            if !matches!(l.st.operators.authenticate(&l.secret).await, Ok(Some(_))) {
                let ev = Event::default().event("expired").data("login");
                return Some((Ok(ev), l));
            }
            match digest(&l.st, &l.tenant, &l.store).await {
                Ok(d) if d != l.last => {
                    l.last = d;
                    let ev = Event::default().event("change").data(d.to_string());
                    return Some((Ok(ev), l));
                }
                Ok(_) => {}
                Err(_) => tracing::warn!(store_id = %l.store, "live view: cannot read the store"),
            }
        }
    });
    // The server learns that a browser went away only when a write fails, so the stream
    // writes a keep-alive comment every few seconds even when nothing changed: a page
    // that was closed, navigated away from or put in the back/forward cache without
    // closing its stream frees its connection and its store reads within seconds.
    Ok(Sse::new(s).keep_alive(KeepAlive::new().interval(KEEP_ALIVE)).into_response())
}
