//! The router on loopback: real sockets, echo backends, a raw ClientHello as the client.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::*;
use crate::sni::admission::Caps;
use crate::sni::hello::fixtures::{client_hello, records};
use crate::sni::pump::Timeouts;
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
    /// A second SNI listener (another port: port routes).
    sni2: SocketAddr,
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
    let sni2 = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (first_addr, second_addr, proxy_addr) = (
        sni.local_addr().unwrap(),
        sni2.local_addr().unwrap(),
        proxy.local_addr().unwrap(),
    );
    tokio::spawn(Arc::clone(&router).serve(sni, Kind::Sni, stop.clone(), tracker.clone()));
    tokio::spawn(Arc::clone(&router).serve(sni2, Kind::Sni, stop.clone(), tracker.clone()));
    tokio::spawn(router.serve(proxy, Kind::Proxy, stop.clone(), tracker));
    Running {
        sni: first_addr,
        sni2: second_addr,
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

/// Reads until the router closes (a FIN or a reset); returns what it sent.
async fn closed(mut s: TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out))
        .await
        .expect("the router closes the connection");
    out
}

/// Whether the router reset the connection (rather than closing it normally).
async fn was_reset(mut s: TcpStream) -> bool {
    let mut out = Vec::new();
    let r = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out))
        .await
        .expect("the router closes the connection");
    matches!(r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset)
}

/// The value of the first metric line starting with `prefix`.
fn metric(text: &str, prefix: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

/// Waits until `cond` holds (at most 5 s).
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
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
        ..Limits::default()
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
async fn a_tenant_whose_backends_are_down_is_refused_at_once_until_a_trial_connects() {
    let dead = dead_addr().await;
    let r = start(&spec(&[format!("one.example={dead}")]), Limits::default()).await;
    let hello = records(&client_hello(Some("one.example")), 16_384);
    // The first connection tries the backend and fails.
    let mut s = TcpStream::connect(r.sni).await.unwrap();
    s.write_all(&hello).await.unwrap();
    assert!(closed(s).await.is_empty());
    // The next ones, within the hold-down, are refused without a connect (fail fast).
    for _ in 0..5 {
        let mut s = TcpStream::connect(r.sni).await.unwrap();
        s.write_all(&hello).await.unwrap();
        assert!(was_reset(s).await);
    }
    let text = r.metrics.encode();
    assert_eq!(
        metric(&text, "baton_sni_rejected_total{reason=\"connect_failed\"}"),
        1,
        "{text}"
    );
    assert_eq!(
        metric(&text, "baton_sni_rejected_total{reason=\"no_healthy_backend\"}"),
        5,
        "{text}"
    );
    assert_eq!(
        metric(
            &text,
            &format!("baton_sni_backend_connect_failures_total{{host=\"one.example\",backend=\"{dead}\"}}")
        ),
        1,
        "one connect, not one per connection: {text}"
    );
    // The backend comes back: after the hold-down one trial connects and all follow.
    let back = TcpListener::bind(dead).await.unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = back.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let _ = s.write_all(b"up").await;
                let (mut rd, mut wr) = s.split();
                let _ = tokio::io::copy(&mut rd, &mut wr).await;
            });
        }
    });
    tokio::time::sleep(crate::sni::routes::DOWN_FOR).await;
    for _ in 0..3 {
        assert_eq!(exchange(r.sni, &hello, &hello).await.0, "up");
    }
}

#[tokio::test]
async fn an_empty_tenant_is_refused_at_once() {
    let mut routes = RouteSpec::default();
    routes.tenants.push((vec!["one.example".into()], vec![]));
    let r = start(&routes, Limits::default()).await;
    let mut s = TcpStream::connect(r.sni).await.unwrap();
    s.write_all(&records(&client_hello(Some("one.example")), 16_384))
        .await
        .unwrap();
    assert!(was_reset(s).await);
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

#[tokio::test]
async fn a_source_gets_at_most_its_pending_connections_the_rest_are_reset() {
    let b1 = backend("b1").await;
    let limits = Limits {
        caps: Caps {
            pending_per_source: 2,
            ..Caps::default()
        },
        ..Limits::default()
    };
    let r = start(&spec(&[format!("one.example={b1}")]), limits).await;
    // Two silent connections (a 5-byte record header each) take the source's pending slots.
    let header = [22u8, 3, 1, 0x3f, 0xfb];
    let mut silent = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(r.sni).await.unwrap();
        s.write_all(&header).await.unwrap();
        silent.push(s);
    }
    until("two pending", || {
        metric(&r.metrics.encode(), "baton_sni_pending_connections") == 2
    })
    .await;
    let third = TcpStream::connect(r.sni).await.unwrap();
    assert!(
        was_reset(third).await,
        "a third pending connection from the source is reset"
    );
    assert!(r.metrics.encode().contains("reason=\"source_pending_limit\"} 1"));
    // A routed connection frees its pending slot: the source may open more then.
    drop(silent.pop());
    let hello = records(&client_hello(Some("one.example")), 16_384);
    assert_eq!(exchange(r.sni, &hello, &hello).await.0, "b1");
    let (held_name, _held) = exchange(r.sni, &hello, &hello).await;
    assert_eq!(held_name, "b1", "spliced connections are not pending");
}

#[tokio::test]
async fn a_full_pending_queue_evicts_the_oldest_and_routes_the_newcomer() {
    let b1 = backend("b1").await;
    let limits = Limits {
        caps: Caps {
            max_pending: 3,
            ..Caps::default()
        },
        ..Limits::default()
    };
    let r = start(&spec(&[format!("one.example={b1}")]), limits).await;
    let mut silent = Vec::new();
    for _ in 0..3 {
        let mut s = TcpStream::connect(r.sni).await.unwrap();
        s.write_all(&[22, 3, 1]).await.unwrap();
        silent.push(s);
        // In order: the first is the oldest.
        let n = silent.len();
        until("pending", || {
            metric(&r.metrics.encode(), "baton_sni_pending_connections") == n as u64
        })
        .await;
    }
    let hello = records(&client_hello(Some("one.example")), 16_384);
    assert_eq!(
        exchange(r.sni, &hello, &hello).await.0,
        "b1",
        "the newcomer is served"
    );
    assert!(
        was_reset(silent.remove(0)).await,
        "the oldest pending connection was evicted"
    );
    assert!(r.metrics.encode().contains("reason=\"evicted\"} 1"));
}

#[tokio::test]
async fn with_every_slot_taken_the_router_accepts_nothing_until_one_frees() {
    let b1 = backend("b1").await;
    let limits = Limits {
        caps: Caps {
            max_connections: 2,
            ..Caps::default()
        },
        ..Limits::default()
    };
    let r = start(&spec(&[format!("one.example={b1}")]), limits).await;
    let hello = records(&client_hello(Some("one.example")), 16_384);
    let (_, first) = exchange(r.sni, &hello, &hello).await;
    let (_, _second) = exchange(r.sni, &hello, &hello).await;
    // The third connects (the kernel's backlog) and sends its hello; nothing answers.
    let mut third = TcpStream::connect(r.sni).await.unwrap();
    third.write_all(&hello).await.unwrap();
    let mut name = [0u8; 2];
    assert!(
        tokio::time::timeout(Duration::from_millis(300), third.read_exact(&mut name))
            .await
            .is_err(),
        "not accepted while every slot is taken"
    );
    assert!(metric(&r.metrics.encode(), "baton_sni_accept_waits_total") >= 1);
    drop(first);
    tokio::time::timeout(Duration::from_secs(5), third.read_exact(&mut name))
        .await
        .expect("accepted once a slot is free")
        .unwrap();
    assert_eq!(&name, b"b1");
}

#[tokio::test]
async fn the_routers_own_health_check_is_answered_whatever_the_routes() {
    let d = backend("dd").await;
    let mut routes = RouteSpec::default();
    routes.set_default(&d.to_string()).unwrap();
    let r = start(&routes, Limits::default()).await;
    let mut s = TcpStream::connect(r.sni).await.unwrap();
    s.write_all(&records(&client_hello(Some(HEALTH_NAME)), 16_384))
        .await
        .unwrap();
    assert_eq!(
        closed(s).await,
        UNRECOGNIZED_NAME,
        "answered by the router, not the default"
    );
    let text = r.metrics.encode();
    assert_eq!(metric(&text, "baton_sni_health_checks_total"), 1, "{text}");
    assert!(!text.contains("reason=\"unknown_sni\""), "{text}");
}

#[tokio::test]
async fn the_proxy_listener_routes_by_the_tenant_tlv_first() {
    let (b1, b2) = (backend("b1").await, backend("b2").await);
    let mut routes = spec(&[format!("one.example={b1}"), format!("two.example={b2}")]);
    routes.add_destination("10.96.0.1=one.example").unwrap();
    let r = start(&routes, Limits::default()).await;
    let hello = records(&client_hello(None), 16_384);
    // Destination mapped to one.example, but the TLV (0xE0) names two.example: the TLV wins.
    let name = b"two.example";
    let mut v2 = b"\r\n\r\n\0\r\nQUIT\n\x21\x11".to_vec();
    v2.extend_from_slice(&u16::try_from(12 + 3 + name.len()).unwrap().to_be_bytes());
    v2.extend_from_slice(&[10, 244, 0, 5, 10, 96, 0, 1, 0x9c, 0x40, 1, 0xbb]);
    v2.extend_from_slice(&[0xE0, 0, u8::try_from(name.len()).unwrap()]);
    v2.extend_from_slice(name);
    v2.extend_from_slice(&hello);
    assert_eq!(exchange(r.proxy, &v2, &hello).await.0, "b2");
    // A TLV naming no tenant is refused, not sent elsewhere.
    let mut bad = v2.clone();
    let at = bad.len() - hello.len() - name.len();
    bad[at..at + name.len()].copy_from_slice(b"six.example");
    let mut s = TcpStream::connect(r.proxy).await.unwrap();
    s.write_all(&bad).await.unwrap();
    assert_eq!(closed(s).await, UNRECOGNIZED_NAME);
}

#[tokio::test]
async fn a_second_port_goes_to_the_tenants_backends_for_that_port() {
    let (api, konn) = (backend("ap").await, backend("kn").await);
    let r = start(&RouteSpec::default(), Limits::default()).await;
    // The `--route HOST:PORT=ADDR` form (Services make the same table).
    let routes = spec(&[
        format!("one.example={api}"),
        format!("one.example:{}={konn}", r.sni2.port()),
    ]);
    r.routes.send_replace(Arc::new(routes.build(&r.health)));
    let hello = records(&client_hello(Some("one.example")), 16_384);
    assert_eq!(exchange(r.sni, &hello, &hello).await.0, "ap");
    assert_eq!(exchange(r.sni2, &hello, &hello).await.0, "kn");
    assert!(r.metrics.encode().contains(&format!(
        "baton_sni_connections_total{{host=\"one.example:{}\"}} 1",
        r.sni2.port()
    )));
}

#[tokio::test]
async fn a_spliced_connection_silent_both_ways_is_closed_after_the_idle_timeout() {
    let b1 = backend("b1").await;
    let limits = Limits {
        timeouts: Timeouts {
            idle: Duration::from_millis(300),
            stall: Duration::from_secs(60),
        },
        ..Limits::default()
    };
    let r = start(&spec(&[format!("one.example={b1}")]), limits).await;
    let hello = records(&client_hello(Some("one.example")), 16_384);
    let (_, s) = exchange(r.sni, &hello, &hello).await;
    let started = Instant::now();
    closed(s).await;
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "{:?}",
        started.elapsed()
    );
    let text = r.metrics.encode();
    assert_eq!(
        metric(&text, "baton_sni_closed_total{reason=\"idle_timeout\"}"),
        1,
        "{text}"
    );
    assert_eq!(
        metric(
            &text,
            "baton_sni_bytes_total{host=\"one.example\",direction=\"to_client\"}"
        ),
        (2 + hello.len()) as u64,
        "bytes counted as they went: {text}"
    );
}

#[tokio::test]
async fn with_every_descriptor_taken_the_oldest_silent_connection_makes_room() {
    let b1 = backend("b1").await;
    let limits = Limits {
        caps: Caps {
            max_connections: 2, // four descriptors
            ..Caps::default()
        },
        ..Limits::default()
    };
    let r = start(&spec(&[format!("one.example={b1}")]), limits).await;
    let hello = records(&client_hello(Some("one.example")), 16_384);
    // One spliced (two descriptors), one silent (one): one descriptor left.
    let (_, _spliced) = exchange(r.sni, &hello, &hello).await;
    let mut silent = TcpStream::connect(r.sni).await.unwrap();
    silent.write_all(&[22, 3, 1]).await.unwrap();
    until("the silent one pending", || {
        metric(&r.metrics.encode(), "baton_sni_pending_connections") == 1
    })
    .await;
    // A client takes the last descriptor; routed, it needs one more for its backend: the
    // silent connection gives its own.
    let (name, _second) = exchange(r.sni, &hello, &hello).await;
    assert_eq!(name, "b1");
    assert!(was_reset(silent).await);
    assert!(r.metrics.encode().contains("reason=\"evicted\"} 1"));
    // Now every descriptor is a spliced connection's: a silent newcomer evicts nobody routed.
    let mut late = TcpStream::connect(r.sni).await.unwrap();
    late.write_all(&hello).await.unwrap();
    let mut name = [0u8; 2];
    assert!(
        tokio::time::timeout(Duration::from_millis(300), late.read_exact(&mut name))
            .await
            .is_err(),
        "spliced connections keep their descriptors"
    );
}

#[test]
fn connections_not_yet_routed_get_at_most_half_the_descriptors() {
    let caps = |max_connections, max_pending| Caps {
        max_connections,
        max_pending,
        ..Caps::default()
    };
    assert_eq!(pending_cap(&caps(100_000, 20_000)), 20_000);
    assert_eq!(pending_cap(&caps(8_848, 10_000)), 8_848);
    assert_eq!(pending_cap(&caps(1, 10_000)), 1);
}

/// What an idle spliced connection holds is mostly its task: the state of `handle`, the splice
/// (a burst's state is boxed, allocated only while bytes flow) and the one timer. A regression
/// that puts a buffer, a timer per direction or a burst's state back into it shows here.
#[tokio::test]
async fn a_connections_task_stays_small() {
    let router = Arc::new(Router::new(
        watch::channel(Arc::new(RouteTable::default())).1,
        Arc::new(Health::default()),
        Limits::default(),
        Arc::new(Metrics::default()),
    ));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
    let peer = client.local_addr().unwrap();
    let admission = Admission {
        slot: Arc::clone(&router.slots).try_acquire_owned().unwrap(),
        source: router.sources.admit(peer.ip()).unwrap(),
    };
    let handle = router.handle(client, peer, Kind::Sni, 1, admission);
    let (one, two) = (
        TcpStream::connect(listener.local_addr().unwrap()).await.unwrap(),
        listener.accept().await.unwrap().0,
    );
    let bytes = prometheus_client::metrics::counter::Counter::<u64>::default();
    let limits = Limits::default();
    let splice = pump::both_ways(&one, &two, limits.timeouts, limits.transfer, &bytes, &bytes);
    let (handle, splice) = (std::mem::size_of_val(&handle), std::mem::size_of_val(&splice));
    assert!(splice <= 1024, "the splice's state is {splice} bytes");
    assert!(handle <= 1536, "a connection's task state is {handle} bytes");
}
