//! The bench's cluster pieces on real sockets: the load balancer (round robin per connection, a backend whose
//! connect fails skipped, one whose `/readyz` fails left out until it answers again) and the run's own Redis.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use onceprint_bench::lb::LoadBalancer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A backend that answers every HTTP request on a connection with its name in the body
/// and `/readyz` with 200 while `ready` holds, 503 otherwise.
async fn backend(
    name: &'static str,
    ready: Arc<std::sync::atomic::AtomicBool>,
) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let ready = ready.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let Ok(n) = s.read(&mut buf).await else { return };
                let head = String::from_utf8_lossy(&buf[..n]);
                let ok = !head.starts_with("GET /readyz") || ready.load(std::sync::atomic::Ordering::SeqCst);
                let status = if ok { "200 OK" } else { "503 Service Unavailable" };
                let answer =
                    format!("HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{name}", name.len());
                let _ = s.write_all(answer.as_bytes()).await;
            });
        }
    });
    (addr, task)
}

/// One request over a new connection through the balancer: the body (the backend's name).
async fn ask(lb: SocketAddr) -> String {
    let mut s = TcpStream::connect(lb).await.expect("connect to the balancer");
    s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n").await.expect("write");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out).await;
    out.rsplit("\r\n\r\n").next().unwrap_or_default().to_owned()
}

fn flag(v: bool) -> Arc<std::sync::atomic::AtomicBool> {
    Arc::new(std::sync::atomic::AtomicBool::new(v))
}

/// Waits (bounded) until the balancer's health view of `addr` is `healthy`.
async fn until_health(lb: &LoadBalancer, addr: SocketAddr, healthy: bool) {
    for _ in 0..100 {
        if lb.health().iter().any(|(a, h)| *a == addr && *h == healthy) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{addr} never became {}: {:?}", if healthy { "healthy" } else { "unhealthy" }, lb.health());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_go_round_robin_and_an_unready_or_dead_backend_is_left_out() {
    let (a_ready, b_ready) = (flag(true), flag(true));
    let (a, _a_task) = backend("a", a_ready.clone()).await;
    let (b, b_task) = backend("b", b_ready.clone()).await;
    let lb = LoadBalancer::start("127.0.0.1:0".parse().expect("addr"), &[a, b]).await.expect("balancer");

    let mut names: Vec<String> = Vec::new();
    for _ in 0..4 {
        names.push(ask(lb.addr).await);
    }
    names.sort();
    assert_eq!(names, ["a", "a", "b", "b"], "one connection each in turn");

    // b says it is not ready: it gets nothing until it is again.
    b_ready.store(false, std::sync::atomic::Ordering::SeqCst);
    until_health(&lb, b, false).await;
    for _ in 0..4 {
        assert_eq!(ask(lb.addr).await, "a");
    }
    b_ready.store(true, std::sync::atomic::Ordering::SeqCst);
    until_health(&lb, b, true).await;

    // b dies (its port refuses connections): every connection still reaches a, also
    // those that tried b before its health check noticed.
    b_task.abort();
    let _ = b_task.await;
    for _ in 0..4 {
        assert_eq!(ask(lb.addr).await, "a");
    }
    until_health(&lb, b, false).await;
    assert_eq!(lb.counters.refused.load(std::sync::atomic::Ordering::Relaxed), 0);
}

/// The fault run's own Redis (`bench faults --redis`): it starts on a free port, dies with
/// kill -9, and comes back on the same port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runs_own_redis_starts_dies_and_comes_back_on_its_port() {
    if !std::path::Path::new("/usr/bin/redis-server").exists() {
        eprintln!("skipping: no /usr/bin/redis-server");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let mut redis = onceprint_bench::cluster::Redis::start(dir.path()).await.expect("redis starts");
    let ping = |port: u16| async move {
        let mut s = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        s.write_all(b"PING\r\n").await.ok()?;
        let mut buf = [0u8; 16];
        let n = s.read(&mut buf).await.ok()?;
        Some(String::from_utf8_lossy(&buf[..n]).into_owned())
    };
    assert_eq!(ping(redis.port).await.as_deref(), Some("+PONG\r\n"));
    redis.kill9().await.expect("kill -9");
    assert_eq!(ping(redis.port).await, None, "down after the kill");
    redis.restart().await.expect("restart");
    assert_eq!(ping(redis.port).await.as_deref(), Some("+PONG\r\n"));
    assert!(redis.url().starts_with("redis://127.0.0.1:"));
    redis.stop().await;
}

/// A backend that echoes every byte back, on every connection.
async fn echo() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// Writes `msg` and reads as many bytes back within `wait`: `None` when they did not come.
async fn round_trip(s: &mut TcpStream, msg: &[u8], wait: Duration) -> Option<Vec<u8>> {
    s.write_all(msg).await.ok()?;
    let mut got = vec![0u8; msg.len()];
    match tokio::time::timeout(wait, s.read_exact(&mut got)).await {
        Ok(Ok(_)) => Some(got),
        _ => None,
    }
}

/// `bench offline`'s shop line: while it is down, connections are taken and their bytes
/// dropped both ways (the client waits, it is not refused); when it is back, connections
/// that lived through the cut are closed and new ones are carried.
#[tokio::test]
async fn an_uplink_cut_swallows_traffic_and_closes_its_connections_when_back() {
    use onceprint_bench::lb::Uplink;
    let uplink = Uplink::default();
    let lb = LoadBalancer::start_with_uplink("127.0.0.1:0".parse().unwrap(), &[echo().await], uplink.clone())
        .await
        .expect("balancer");
    let wait = Duration::from_millis(300);
    let mut before = TcpStream::connect(lb.addr).await.expect("connect");
    assert_eq!(round_trip(&mut before, b"hello", wait).await.as_deref(), Some(&b"hello"[..]));

    uplink.set_up(false);
    assert!(!uplink.is_up());
    assert_eq!(round_trip(&mut before, b"lost", wait).await, None, "bytes through a cut line are dropped");
    let mut during = TcpStream::connect(lb.addr).await.expect("a connection is taken while the line is down");
    assert_eq!(round_trip(&mut during, b"void", wait).await, None);

    uplink.set_up(true);
    for s in [&mut before, &mut during] {
        let mut buf = [0u8; 16];
        let end = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await.expect("closed, not hanging");
        assert!(matches!(end, Ok(0) | Err(_)), "{end:?}");
    }
    let mut after = TcpStream::connect(lb.addr).await.expect("connect");
    assert_eq!(round_trip(&mut after, b"again", wait).await.as_deref(), Some(&b"again"[..]));
}

/// The shop line's other misbehaviours: while it holds answers they arrive that much
/// later (and in order), and while it fails uploads `POST /v1/agent/offline-tasks` gets
/// the proxy's own 502 (the backend never sees it) while every other request passes.
#[tokio::test]
async fn an_uplink_holds_answers_and_fails_uploads_only() {
    use onceprint_bench::lb::{Uplink, UPLOAD_PATH};
    use std::sync::atomic::Ordering;
    let uplink = Uplink::default();
    let lb = LoadBalancer::start_with_uplink("127.0.0.1:0".parse().unwrap(), &[echo().await], uplink.clone())
        .await
        .expect("balancer");
    let mut s = TcpStream::connect(lb.addr).await.expect("connect");
    let started = tokio::time::Instant::now();
    assert_eq!(round_trip(&mut s, b"fast", Duration::from_secs(1)).await.as_deref(), Some(&b"fast"[..]));
    assert!(started.elapsed() < Duration::from_millis(200));
    uplink.set_hold(Duration::from_millis(300));
    let started = tokio::time::Instant::now();
    assert_eq!(round_trip(&mut s, b"slow", Duration::from_secs(2)).await.as_deref(), Some(&b"slow"[..]));
    assert!(started.elapsed() >= Duration::from_millis(300), "{:?}", started.elapsed());
    uplink.set_hold(Duration::ZERO);
    assert_eq!(uplink.hold(), Duration::ZERO);

    let (named, _task) = backend("broker", flag(true)).await;
    let lb = LoadBalancer::start_with_uplink("127.0.0.1:0".parse().unwrap(), &[named], uplink.clone())
        .await
        .expect("balancer");
    let send = |request: String| async move {
        let mut s = TcpStream::connect(lb.addr).await.expect("connect");
        s.write_all(request.as_bytes()).await.expect("write");
        let mut out = String::new();
        let _ = tokio::time::timeout(Duration::from_secs(2), s.read_to_string(&mut out)).await;
        out
    };
    let upload = format!("POST {UPLOAD_PATH} HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{{}}");
    uplink.set_fail_uploads(true);
    assert!(uplink.fails_uploads());
    let failed = send(upload.clone()).await;
    assert!(failed.starts_with("HTTP/1.1 502") && failed.contains("bad_gateway"), "{failed}");
    assert!(send("GET / HTTP/1.1\r\nhost: x\r\n\r\n".into()).await.ends_with("broker"));
    uplink.set_fail_uploads(false);
    assert!(send(upload).await.ends_with("broker"));
    assert_eq!(uplink.counters.uploads_failed.load(Ordering::Relaxed), 1);
    assert_eq!(uplink.counters.uploads_passed.load(Ordering::Relaxed), 1);
}
