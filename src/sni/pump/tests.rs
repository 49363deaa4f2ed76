//! The pump on loopback sockets, copying and splicing: both ways, half-close, reset, the idle
//! and stall timeouts, and the per-thread pools giving back what a connection took.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;

/// A connected pair of TCP streams on loopback.
async fn pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (a, b) = tokio::join!(TcpStream::connect(addr), listener.accept());
    (a.unwrap(), b.unwrap().0)
}

/// Awaits `f` for at most 5 s: a lost end-of-stream fails the test instead of hanging it.
async fn within<T, E: std::fmt::Debug>(f: impl Future<Output = Result<T, E>>, what: &str) -> T {
    tokio::time::timeout(Duration::from_secs(5), f)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
        .unwrap()
}

const LONG: Timeouts = Timeouts {
    idle: Duration::from_secs(60),
    stall: Duration::from_secs(60),
};

#[tokio::test]
async fn bytes_cross_both_ways_and_a_half_close_passes_through_copied() {
    crosses_both_ways(Transfer::Copy).await;
    let kept = BUFFERS.with(|b| b.borrow().free.len());
    assert!(
        kept >= 1,
        "the bytes went through a pooled buffer, kept for reuse"
    );
    assert_eq!(PIPES.with(|p| p.borrow().free.len()), 0, "no pipe was made");
}

#[tokio::test]
async fn bytes_cross_both_ways_and_a_half_close_passes_through_spliced() {
    crosses_both_ways(Transfer::Splice).await;
    let kept = PIPES.with(|p| p.borrow().free.len());
    assert!(
        kept >= 1,
        "the bytes went through a pooled pipe (splice), kept for reuse"
    );
}

async fn crosses_both_ways(transfer: Transfer) {
    // client <-> (proxy_client | proxy_backend) <-> backend, all on this thread.
    let (mut client, proxy_client) = pair().await;
    let (proxy_backend, mut backend) = pair().await;
    let (to_backend, to_client) = (Counter::default(), Counter::default());
    let (tb, tc) = (to_backend.clone(), to_client.clone());
    let proxy =
        tokio::spawn(async move { both_ways(&proxy_client, &proxy_backend, LONG, transfer, &tb, &tc).await });

    // More than a pipe's and a buffer's worth, so several chunks cross.
    let big: Vec<u8> = (0..5 * CHUNK + 17)
        .map(|i| u8::try_from(i % 251).unwrap())
        .collect();
    let writer = {
        let big = big.clone();
        tokio::spawn(async move {
            client.write_all(&big).await.unwrap();
            client.shutdown().await.unwrap();
            client
        })
    };
    let mut got = Vec::new();
    within(
        backend.read_to_end(&mut got),
        "the client's end to reach the backend",
    )
    .await;
    assert!(got == big, "every byte, in order, then the client's end");
    let mut client = writer.await.unwrap();

    // The backend still answers after the client half-closed.
    backend.write_all(b"answer").await.unwrap();
    backend.shutdown().await.unwrap();
    let mut answer = Vec::new();
    within(client.read_to_end(&mut answer), "the backend's answer and end").await;
    assert_eq!(answer, b"answer");

    within(proxy, "the splice to end").await.unwrap();
    assert_eq!(
        (to_backend.get(), to_client.get()),
        (big.len() as u64, 6),
        "bytes counted as they went"
    );
    assert_eq!(in_use(), (0, 0), "the splice gave back every pipe and buffer");
}

#[tokio::test]
async fn a_reset_side_ends_the_splice() {
    let (client, proxy_client) = pair().await;
    let (proxy_backend, _backend) = pair().await;
    let proxy = tokio::spawn(async move {
        let c = Counter::default();
        both_ways(&proxy_client, &proxy_backend, LONG, Transfer::Copy, &c, &c).await
    });
    // RST instead of FIN: SO_LINGER 0 (dropping a socket with linger 0 does not block).
    socket2::SockRef::from(&client)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(client);
    let ended = tokio::time::timeout(Duration::from_secs(5), proxy).await;
    assert!(
        ended.is_ok_and(|r| r.unwrap().is_err()),
        "the splice ends, with an error, when one side is reset and the backend is idle"
    );
}

#[tokio::test]
async fn a_connection_silent_both_ways_ends_after_the_idle_timeout_and_traffic_keeps_it_open() {
    let (mut client, proxy_client) = pair().await;
    let (proxy_backend, mut backend) = pair().await;
    let timeouts = Timeouts {
        idle: Duration::from_millis(400),
        stall: Duration::from_secs(60),
    };
    let started = Instant::now();
    let proxy = tokio::spawn(async move {
        let c = Counter::default();
        both_ways(&proxy_client, &proxy_backend, timeouts, Transfer::Copy, &c, &c).await
    });
    // A ping every 150 ms (like HTTP/2 PINGs on a watch) for a second: longer than the idle
    // timeout in all, never idle that long.
    let mut byte = [0u8; 1];
    for _ in 0..7 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        client.write_all(b"p").await.unwrap();
        backend.read_exact(&mut byte).await.unwrap();
    }
    assert!(!proxy.is_finished(), "traffic keeps the connection open");
    // Then silence: the router ends it.
    let ended = within(proxy, "the idle timeout").await;
    assert!(matches!(ended, Err(PumpError::Idle(_))), "{ended:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(1400),
        "{:?}",
        started.elapsed()
    );
    let mut rest = Vec::new();
    within(client.read_to_end(&mut rest), "the client to see the close").await;
}

#[tokio::test]
async fn a_peer_that_takes_nothing_is_cut_after_the_stall_timeout_and_pins_no_buffer_after() {
    cut_after_the_stall_timeout(Transfer::Copy).await;
}

#[tokio::test]
async fn a_peer_that_takes_nothing_is_cut_after_the_stall_timeout_and_pins_no_pipe_after() {
    cut_after_the_stall_timeout(Transfer::Splice).await;
}

async fn cut_after_the_stall_timeout(transfer: Transfer) {
    let (client, proxy_client) = pair().await;
    let (proxy_backend, mut backend) = pair().await;
    let timeouts = Timeouts {
        idle: Duration::from_secs(60),
        stall: Duration::from_millis(300),
    };
    let proxy = tokio::spawn(async move {
        let c = Counter::default();
        both_ways(&proxy_client, &proxy_backend, timeouts, transfer, &c, &c).await
    });
    // The backend sends far more than the sockets' buffers hold; the client never reads.
    let sender = tokio::spawn(async move {
        let chunk = vec![7u8; 1 << 20];
        for _ in 0..64 {
            if backend.write_all(&chunk).await.is_err() {
                return;
            }
        }
    });
    let ended = tokio::time::timeout(Duration::from_secs(10), proxy)
        .await
        .expect("the stall timeout ends the splice")
        .unwrap();
    assert!(matches!(ended, Err(PumpError::Stalled(_))), "{ended:?}");
    assert_eq!(
        in_use(),
        (0, 0),
        "the pipe or buffer holding undelivered bytes is given up"
    );
    drop(client);
    sender.abort();
}

#[test]
fn a_pool_hands_out_at_most_its_limit_and_keeps_at_most_kept() {
    let mut pool: Pool<u32> = Pool::new();
    let mut made = 0;
    let mut out = Vec::new();
    for _ in 0..3 {
        out.push(
            pool.take(3, || {
                made += 1;
                Some(made)
            })
            .unwrap(),
        );
    }
    assert_eq!(pool.take(3, || Some(99)), None, "a fourth is refused");
    pool.give(out.pop());
    assert_eq!(pool.take(3, || Some(99)), Some(3), "a given-back item is reused");
    pool.give(None); // one was closed instead of given back
    assert_eq!(pool.in_use, 2);
    for i in 0..u32::try_from(KEPT + 10).unwrap() {
        pool.in_use += 1;
        pool.give(Some(i));
    }
    assert_eq!(pool.free.len(), KEPT);
}
