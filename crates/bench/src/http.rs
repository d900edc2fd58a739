//! One HTTP/1.1 keep-alive connection to the broker.
//!
//! The bench drives hyper's connection-level client directly rather than a pooled client:
//! each load worker owns exactly one connection, so "concurrency" means what it says and
//! no pool logic sits between the measurement and the socket.

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1;
use hyper::header::{HeaderMap, HeaderValue, AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Longest the bench waits for one answer before it counts the request as lost. Far
/// above any sane latency; it only keeps a hung broker from hanging the bench.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

pub struct Conn {
    sender: http1::SendRequest<Full<Bytes>>,
    host: HeaderValue,
}

impl Conn {
    pub async fn connect(addr: SocketAddr) -> Result<Self, String> {
        let stream = TcpStream::connect(addr).await.map_err(|e| format!("connect to {addr}: {e}"))?;
        // Requests are small and latency is what we measure: don't let Nagle hold them.
        stream.set_nodelay(true).map_err(|e| format!("TCP_NODELAY: {e}"))?;
        let (sender, connection) =
            http1::handshake(TokioIo::new(stream)).await.map_err(|e| format!("HTTP handshake with {addr}: {e}"))?;
        // The connection future does the actual IO; its errors also surface on the next
        // send_request, which is where the caller handles them.
        tokio::spawn(async move {
            let _ = connection.await;
        });
        let host = HeaderValue::from_str(&addr.to_string()).map_err(|e| e.to_string())?;
        Ok(Self { sender, host })
    }

    /// Sends one request and reads the whole answer. Errors are strings because the
    /// caller only reports them (a lost request is a finding, not a crash).
    pub async fn request(
        &mut self,
        method: Method,
        path: &str,
        auth: &HeaderValue,
        body: Option<Bytes>,
    ) -> Result<(StatusCode, Bytes), String> {
        self.request_within(method, path, auth, body, REQUEST_TIMEOUT).await
    }

    /// [`Conn::request`] with a time limit of its own (a long poll may rightly take
    /// longer than [`REQUEST_TIMEOUT`]).
    pub async fn request_within(
        &mut self,
        method: Method,
        path: &str,
        auth: &HeaderValue,
        body: Option<Bytes>,
        limit: Duration,
    ) -> Result<(StatusCode, Bytes), String> {
        self.request_with_headers(method, path, auth, body, limit).await.map(|(status, _, bytes)| (status, bytes))
    }

    /// [`Conn::request_within`] that also returns the answer's headers (`bench offline`
    /// tells the store agent's offline answers by one).
    pub async fn request_with_headers(
        &mut self,
        method: Method,
        path: &str,
        auth: &HeaderValue,
        body: Option<Bytes>,
        limit: Duration,
    ) -> Result<(StatusCode, HeaderMap, Bytes), String> {
        let fut = async {
            let mut builder = Request::builder()
                .method(method)
                .uri(path)
                .header(HOST, self.host.clone())
                .header(AUTHORIZATION, auth.clone());
            if body.is_some() {
                builder = builder.header(CONTENT_TYPE, "application/json");
            }
            let req =
                builder.body(Full::new(body.unwrap_or_default())).map_err(|e| format!("building request: {e}"))?;
            self.sender.ready().await.map_err(|e| format!("connection not ready: {e}"))?;
            let resp = self.sender.send_request(req).await.map_err(|e| format!("sending request: {e}"))?;
            let (parts, body) = resp.into_parts();
            let bytes = body.collect().await.map_err(|e| format!("reading answer body: {e}"))?.to_bytes();
            Ok((parts.status, parts.headers, bytes))
        };
        match tokio::time::timeout(limit, fut).await {
            Ok(result) => result,
            Err(_) => Err(format!("no answer within {limit:?}")),
        }
    }
}

/// `Authorization: Bearer <token>` as a header value.
pub fn bearer(token: &str) -> Result<HeaderValue, String> {
    HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| "token is not a valid header value".to_string())
}

/// Percent-encodes a query-string value (the list cursor is opaque to us and may hold
/// `+`, `/`, `=` or anything else).
pub fn pct_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The first `max` characters of a body, for error messages.
pub fn snippet(body: &[u8], max: usize) -> String {
    let text = String::from_utf8_lossy(body);
    let mut s: String = text.chars().take(max).collect();
    if text.chars().count() > max {
        s.push('…');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pct_encode_keeps_unreserved_and_escapes_the_rest() {
        assert_eq!(pct_encode("abc-_.~09"), "abc-_.~09");
        assert_eq!(pct_encode("a+b/c=="), "a%2Bb%2Fc%3D%3D");
        assert_eq!(pct_encode("é"), "%C3%A9");
    }

    #[test]
    fn snippet_truncates_on_characters() {
        assert_eq!(snippet(b"hello", 10), "hello");
        assert_eq!(snippet("héllo".as_bytes(), 2), "hé…");
    }
}
