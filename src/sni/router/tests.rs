//! The router on loopback: real sockets, echo backends, a raw ClientHello as the client.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::*;
use crate::sni::hello::fixtures::{client_hello, records};
use crate::sni::routes::RouteSpec;

/// An echo server that prefixes everything with its name; returns its address.
async fn backend(name: &'static str) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else { return };
            tokio::spawn(async move {
                let _ = s.write_all(name.as_bytes()).await;
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

/// An address nothing listens on.
async fn dead_addr() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap()
}

struct Running {
    sni: SocketAddr,
    proxy: SocketAddr,
    routes: watch::Sender<Arc<RouteTable>>,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn start(spec: &RouteSpec, limits: Limits) -> Running {
    let health = Arc::new(Health::default());
    let metrics = Arc::new(Metrics::default());
    let (tx, rx) = watch::channel(Arc::new(spec.build(&health)));
    let router = Arc::new(Router::new(rx, Arc::clone(&health), limits, Arc::clone(&metrics)));
    let stop = CancellationToken::new();
    let tracker = TaskTracker::new();
    let sni = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (sni_addr, proxy_addr) = (sni.local_addr().unwrap(), proxy.local_addr().unwrap());
    tokio::spawn(Arc::clone(&router).serve(sni, Kind::Sni, stop.clone(), tracker.clone()));
    tokio::spawn(router.serve(proxy, Kind::Proxy, stop.clone(), tracker));
    Running {
        sni: sni_addr,
        proxy: proxy_addr,
        routes: tx,
        health,
        metrics,
        stop,
    }
}

/// Sends `first`, then reads the backend's name and the echo of `first`.
async fn exchange(to: SocketAddr, first: &[u8], echoed: &[u8]) -> (String, TcpStream) {
    let mut s = TcpStream::connect(to).await.unwrap();
    s.write_all(first).await.unwrap();
    let mut name = [0u8; 2];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut name))
        .await
        .unwrap()
        .unwrap();
    let mut echo = vec![0u8; echoed.len()];
    s.read_exact(&mut echo).await.unwrap();
    assert_eq!(echo, echoed, "the backend got the bytes as sent");
    (String::from_utf8(name.to_vec()).unwrap(), s)
}

/// Reads until the router closes; returns what it sent.
async fn closed(mut s: TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out))
        .await
        .unwrap()
        .unwrap();
    out
}

fn spec(routes: &[String]) -> RouteSpec {
    let mut spec = RouteSpec::default();
    for r in routes {
        spec.add_route(r).unwrap();
    }
    spec
}

#[tokio::test]
async fn routes_by_server_name_and_replays_the_hello() {
    let (b1, b2) = (backend("b1").await, backend("b2").await);
    let r = start(
        &spec(&[format!("one.example={b1}"), format!("two.example={b2}")]),
        Limits::default(),
    )
    .await;
    for (host, want) in [("one.example", "b1"), ("TWO.example", "b2")] {
        // The hello split into small records and written in pieces.
        let hello = records(&client_hello(Some(host)), 50);
        let mut s = TcpStream::connect(r.sni).await.unwrap();
        for part in hello.chunks(33) {
            s.write_all(part).await.unwrap();
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let mut name = [0u8; 2];
        s.read_exact(&mut name).await.unwrap();
        assert_eq!(&name, want.as_bytes());
        let mut echo = vec![0u8; hello.len()];
        s.read_exact(&mut echo).await.unwrap();
        assert_eq!(echo, hello);
        s.write_all(b"after").await.unwrap();
        let mut after = [0u8; 5];
        s.read_exact(&mut after).await.unwrap();
        assert_eq!(&after, b"after");
    }
    let text = r.metrics.encode();
    assert!(
        text.contains("baton_sni_connections_total{host=\"one.example\"} 1"),
        "{text}"
    );
}

#[tokio::test]
async fn unknown_or_missing_names_get_an_alert_and_are_counted_unless_a_default_is_set() {
    let b1 = backend("b1").await;
    let mut routes = spec(&[format!("one.example={b1}")]);
    let r = start(&routes, Limits::default()).await;
    for sni in [Some("other.example"), None] {
        let mut s = TcpStream::connect(r.sni).await.unwrap();
        s.write_all(&records(&client_hello(sni), 16_384)).await.unwrap();
        assert_eq!(closed(s).await, UNRECOGNIZED_NAME);
    }
    let text = r.metrics.encode();
    assert!(
        text.contains("baton_sni_rejected_total{reason=\"unknown_sni\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("baton_sni_rejected_total{reason=\"no_sni\"} 1"),
        "{text}"
    );
    // With a default, both go there.
    let d = backend("dd").await;
    routes.set_default(&d.to_string()).unwrap();
    r.routes.send_replace(Arc::new(routes.build(&r.health)));
    for sni in [Some("other.example"), None] {
        let hello = records(&client_hello(sni), 16_384);
        assert_eq!(exchange(r.sni, &hello, &hello).await.0, "dd");
    }
}

#[tokio::test]
async fn garbage_oversized_and_slow_hellos_cost_no_more_than_their_bounds() {
    let b1 = backend("b1").await;
    let limits = Limits {
        max_hello: 1024,
        hello_timeout: Duration::from_millis(300),
        connect_timeout: Duration::from_secs(1),
    };
    let r = start(&spec(&[format!("one.example={b1}")]), limits).await;
    // Not TLS: closed with nothing sent.
    let mut s = TcpStream::connect(r.sni).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: one.example\r\n\r\n")
        .await
        .unwrap();
    assert!(closed(s).await.is_empty());
    // A hello larger than the bound: refused as soon as its header says so.
    let mut s = TcpStream::connect(r.sni).await.unwrap();
    let big = records(
        &client_hello(Some(&format!("{}.example", "a".repeat(60)))),
        16_384,
    );
    let mut padded = big[..9].to_vec();
    padded[6..9].copy_from_slice(&[0, 8, 0]); // handshake length 2048
    s.write_all(&padded).await.unwrap();
    assert!(closed(s).await.is_empty());
    // Slow: half a hello, then silence; closed after the time limit.
    let started = std::time::Instant::now();
    let mut s = TcpStream::connect(r.sni).await.unwrap();
    s.write_all(&big[..20]).await.unwrap();
    assert!(closed(s).await.is_empty());
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(3),
        "{took:?}"
    );
    let text = r.metrics.encode();
    for reason in ["not_tls", "too_large", "hello_timeout"] {
        assert!(
            text.contains(&format!("reason=\"{reason}\"}} 1")),
            "{reason}: {text}"
        );
    }
}

#[tokio::test]
async fn a_backend_that_refuses_is_skipped_for_the_next() {
    let dead = dead_addr().await;
    let b2 = backend("b2").await;
    let r = start(&spec(&[format!("one.example={dead},{b2}")]), Limits::default()).await;
    let hello = records(&client_hello(Some("one.example")), 16_384);
    for _ in 0..4 {
        assert_eq!(exchange(r.sni, &hello, &hello).await.0, "b2");
    }
    let text = r.metrics.encode();
    assert!(
        text.contains(&format!(
            "baton_sni_backend_up{{host=\"one.example\",backend=\"{dead}\"}} 0"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "baton_sni_backend_connect_failures_total{{host=\"one.example\",backend=\"{dead}\"}} 1"
        )),
        "the down backend is not retried within its hold-down: {text}"
    );
}

#[tokio::test]
async fn no_backend_closes_the_connection() {
    let dead = dead_addr().await;
    let r = start(&spec(&[format!("one.example={dead}")]), Limits::default()).await;
    let mut s = TcpStream::connect(r.sni).await.unwrap();
    s.write_all(&records(&client_hello(Some("one.example")), 16_384))
        .await
        .unwrap();
    assert!(closed(s).await.is_empty());
    assert!(r.metrics.encode().contains("reason=\"no_backend\"} 1"));
}

#[tokio::test]
async fn a_route_change_leaves_established_connections_alone() {
    let (b1, b2) = (backend("b1").await, backend("b2").await);
    let r = start(&spec(&[format!("one.example={b1}")]), Limits::default()).await;
    let hello = records(&client_hello(Some("one.example")), 16_384);
    let (name, mut held) = exchange(r.sni, &hello, &hello).await;
    assert_eq!(name, "b1");
    // Move the tenant to b2 and add another; new connections follow, the old one stays on b1.
    let moved = spec(&[format!("one.example={b2}"), format!("two.example={b1}")]);
    r.routes.send_replace(Arc::new(moved.build(&r.health)));
    assert_eq!(exchange(r.sni, &hello, &hello).await.0, "b2");
    held.write_all(b"still here").await.unwrap();
    let mut buf = [0u8; 10];
    held.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"still here");
}

#[tokio::test]
async fn the_proxy_listener_routes_by_original_destination_else_by_name() {
    let (b1, b2) = (backend("b1").await, backend("b2").await);
    let mut routes = spec(&[format!("one.example={b1}"), format!("two.example={b2}")]);
    routes.add_destination("10.96.0.1:443=two.example").unwrap();
    let r = start(&routes, Limits::default()).await;
    // No SNI at all, destination mapped: routed by destination; the header is not forwarded.
    let hello = records(&client_hello(None), 16_384);
    let v1 = [
        b"PROXY TCP4 10.244.0.5 10.96.0.1 40000 443\r\n".as_slice(),
        &hello,
    ]
    .concat();
    assert_eq!(exchange(r.proxy, &v1, &hello).await.0, "b2");
    // v2 with an unmapped destination: the ClientHello decides.
    let mut v2 = b"\r\n\r\n\0\r\nQUIT\n\x21\x11\x00\x0c".to_vec();
    v2.extend_from_slice(&[10, 244, 0, 5, 10, 96, 0, 9, 0x9c, 0x40, 1, 0xbb]);
    let hello1 = records(&client_hello(Some("one.example")), 16_384);
    v2.extend_from_slice(&hello1);
    assert_eq!(exchange(r.proxy, &v2, &hello1).await.0, "b1");
    // No PROXY header on the PROXY port: refused.
    let mut s = TcpStream::connect(r.proxy).await.unwrap();
    s.write_all(&hello1).await.unwrap();
    assert!(closed(s).await.is_empty());
    assert!(r.metrics.encode().contains("reason=\"proxy_header\"} 1"));
}
