//! Moving bytes between a client and its backend once a connection is spliced.
//!
//! `tokio::io::copy_bidirectional` gives every connection two 8 KiB buffers for its whole life,
//! so 10,000 idle TLS connections hold 160 MiB of buffers that are almost never used. Here a
//! direction takes a buffer only when its socket is readable, keeps it while bytes keep coming,
//! and gives it back as soon as a read would block: an idle connection holds no buffer (the way
//! HAProxy allocates its buffers). Buffers come from a small per-thread pool, so a busy
//! connection does not pay an allocation per burst.
//!
//! ```text
//!  readable ─► take buffer ─► try_read ─┬─ n > 0 ─► write_all to the other side ─► try_read …
//!                                       ├─ would block ─► give the buffer back ─► readable …
//!                                       └─ 0 (end) ─► shut the other side's write half, done
//! ```

use std::cell::RefCell;
use std::io;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::net::tcp::{ReadHalf, WriteHalf};

/// Bytes read at once: HAProxy's `tune.bufsize` is 16 KiB; twice that halves the system calls
/// of a bulk transfer, and only connections that are moving bytes hold one.
pub const BUFFER: usize = 32 * 1024;

/// Buffers kept per thread for the next burst.
const POOL: usize = 64;

thread_local! {
    static FREE: RefCell<Vec<Box<[u8]>>> = const { RefCell::new(Vec::new()) };
}

/// A buffer of [`BUFFER`] bytes, back to this thread's pool when dropped.
struct Buffer(Option<Box<[u8]>>);

impl Buffer {
    fn take() -> Self {
        let pooled = FREE.try_with(|f| f.borrow_mut().pop()).ok().flatten();
        Self(Some(pooled.unwrap_or_else(|| vec![0; BUFFER].into_boxed_slice())))
    }

    fn bytes(&mut self) -> &mut [u8] {
        self.0.as_deref_mut().unwrap_or_default()
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if let Some(buf) = self.0.take() {
            let _ = FREE.try_with(|f| {
                let mut free = f.borrow_mut();
                if free.len() < POOL {
                    free.push(buf);
                }
            });
        }
    }
}

/// Copies `from` to `to` until `from` ends, then shuts `to`'s write half (the other direction
/// goes on: a half-close is passed through). Returns the bytes copied.
async fn pump(from: ReadHalf<'_>, mut to: WriteHalf<'_>) -> io::Result<u64> {
    let mut copied = 0u64;
    loop {
        from.readable().await?;
        let mut buf = Buffer::take();
        loop {
            match from.try_read(buf.bytes()) {
                Ok(0) => {
                    drop(buf);
                    to.shutdown().await?;
                    return Ok(copied);
                }
                Ok(n) => {
                    to.write_all(&buf.bytes()[..n]).await?;
                    copied += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
    }
}

/// Copies both ways until both sides have ended, or either fails (then both are dropped, which
/// closes them). Returns the bytes copied to `b` and to `a`.
pub async fn both_ways(a: &mut TcpStream, b: &mut TcpStream) -> io::Result<(u64, u64)> {
    let (a_read, a_write) = a.split();
    let (b_read, b_write) = b.split();
    tokio::try_join!(pump(a_read, b_write), pump(b_read, a_write))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    /// A connected pair of TCP streams on loopback.
    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (a, b) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (a.unwrap(), b.unwrap().0)
    }

    /// Awaits `f` for at most 5 s: a lost end-of-stream fails the test instead of hanging it.
    async fn within<T, E: std::fmt::Debug>(f: impl Future<Output = Result<T, E>>, what: &str) -> T {
        tokio::time::timeout(std::time::Duration::from_secs(5), f)
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
            .unwrap()
    }

    #[tokio::test]
    async fn bytes_cross_both_ways_and_a_half_close_passes_through() {
        // client <-> (proxy_client | proxy_backend) <-> backend
        let (mut client, mut proxy_client) = pair().await;
        let (mut proxy_backend, mut backend) = pair().await;
        let proxy = tokio::spawn(async move { both_ways(&mut proxy_client, &mut proxy_backend).await });

        let big: Vec<u8> = (0..3 * BUFFER + 17)
            .map(|i| u8::try_from(i % 251).unwrap())
            .collect();
        client.write_all(&big).await.unwrap();
        client.shutdown().await.unwrap();
        let mut got = Vec::new();
        within(
            backend.read_to_end(&mut got),
            "the client's end to reach the backend",
        )
        .await;
        assert_eq!(got, big, "every byte, in order, then the client's end");

        // The backend still answers after the client half-closed.
        backend.write_all(b"answer").await.unwrap();
        backend.shutdown().await.unwrap();
        let mut answer = Vec::new();
        within(client.read_to_end(&mut answer), "the backend's answer and end").await;
        assert_eq!(answer, b"answer");

        let (to_backend, to_client) = within(proxy, "the splice to end").await.unwrap();
        assert_eq!((to_backend, to_client), (big.len() as u64, 6));
    }

    #[tokio::test]
    async fn a_reset_side_ends_the_splice() {
        let (client, mut proxy_client) = pair().await;
        let (mut proxy_backend, _backend) = pair().await;
        let proxy = tokio::spawn(async move { both_ways(&mut proxy_client, &mut proxy_backend).await });
        // RST instead of FIN: SO_LINGER 0 (dropping a socket with linger 0 does not block).
        #[allow(deprecated)]
        client.set_linger(Some(std::time::Duration::ZERO)).unwrap();
        drop(client);
        let ended = tokio::time::timeout(std::time::Duration::from_secs(5), proxy).await;
        assert!(
            ended.is_ok(),
            "the splice ends when one side is reset, the backend idle"
        );
    }
}
