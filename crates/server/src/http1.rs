//! The accept loop: every connection is served as HTTP/1.1 by hyper directly.
//!
//! `axum::serve` hands each connection to hyper-util's "auto" builder, which first reads
//! up to 24 bytes to tell an HTTP/2 preface from HTTP/1 and then replays them to hyper as
//! a read of their own. hyper's read buffer starts at 8 KiB; after that short first read
//! it asks for 8 KiB more on top of the bytes it holds, and the buffer doubles to 16 KiB,
//! with its first 8 KiB copied over (so touched) by the reallocation. The broker speaks no
//! HTTP/2, so the sniffing bought nothing, and a connection kept open by an idle agent's
//! long poll held twice the buffer it needed: with 10,000 agents that was about 80 MiB of
//! the broker's memory (docs/BENCHMARKS.md, "Many idle agents").
//!
//! What this loop must keep from `axum::serve`: accept errors (too many open files) do
//! not end the server (`Listener::accept` waits and retries), and a graceful shutdown
//! stops accepting, lets every connection finish its request in flight, and returns only
//! once all of them are closed. Each request carries its connection's peer address as a
//! [`PeerAddr`] extension (the console's login throttle counts failures per source).

use std::future::Future;
use std::net::SocketAddr;

use axum::serve::Listener;
use axum::Router;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tower::ServiceExt;

/// The address a request's connection came from (a proxy's, behind one).
#[derive(Debug, Clone, Copy)]
pub struct PeerAddr(pub SocketAddr);

/// Serves `router` on `listener` until `shutdown` resolves, then drains the open
/// connections as described in the module's documentation.
pub(crate) async fn serve<L>(mut listener: L, router: Router, shutdown: impl Future<Output = ()> + Send)
where
    L: Listener<Addr = SocketAddr>,
{
    let graceful = GracefulShutdown::new();
    let builder = hyper::server::conn::http1::Builder::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (io, peer) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        // A `Router` is a handle on a shared route table: the clone costs one reference.
        let service = TowerToHyperService::new(router.clone().map_request(
            move |mut req: axum::http::Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(PeerAddr(peer));
                req
            },
        ));
        let conn = graceful.watch(builder.serve_connection(TokioIo::new(io), service));
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::trace!(error = %e, "connection ended with an error");
            }
        });
    }
    // Stop accepting before waiting: a client that connects now is refused, not kept.
    drop(listener);
    graceful.shutdown().await;
}
