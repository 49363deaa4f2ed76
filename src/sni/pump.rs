//! Moving bytes between a client and its backend once a connection is spliced.
//!
//! A direction takes a 32 KiB buffer from a per-thread pool only when its socket is readable,
//! keeps it while bytes keep coming and gives it back as soon as a read would block: an idle
//! connection holds no buffer, only its two sockets and its task.
//!
//! With [`Transfer::Splice`] (`--splice`), a burst goes through a pipe with splice(2) instead:
//! socket → pipe → socket, moved page by page inside the kernel, never copied into this process
//! (as sozu and HAProxy's `option splice-*` do), pipes from a per-thread pool (no pipe2/close per
//! burst). Where a pipe cannot be had (the thread's [`PIPES_PER_THREAD`] are all in use, or
//! splice is not supported), the burst takes a buffer. It is not the default: on loopback,
//! through TLS, it moved fewer bytes a second than copying and no more connections
//! (docs/benchmarks.md, "SNI router").
//!
//! ```text
//!  readable ─► take buffer (or pipe) ─► read (splice socket→pipe) ─┬─ n > 0 ─► write to the other socket
//!                                                                  │           (waits ≤ stall while the
//!                                                                  │            other side takes nothing)
//!                                                                  ├─ would block ─► give it back ─► readable …
//!                                                                  └─ 0 (end) ─► shut the other side's write
//!                                                                                half; this direction is done
//!  watchdog: no byte either way for `idle` ─► the connection ends (IdleTimeout)
//! ```
//!
//! What a stalled peer (one that stops reading) can pin is bounded: one buffer (or pipe) per
//! direction, at most [`BUFFERS_PER_THREAD`] buffers and [`PIPES_PER_THREAD`] pipes per thread
//! (a burst waits for one beyond that), each for at most the stall timeout.

use std::cell::{Cell, RefCell};
use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use nix::fcntl::{OFlag, SpliceFFlags, splice};
use prometheus_client::metrics::counter::Counter;
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Bytes read at once into a buffer (the fallback when no pipe is to be had).
pub const BUFFER: usize = 32 * 1024;
/// Bytes spliced at once: a pipe's default capacity (16 pages).
const CHUNK: usize = 64 * 1024;
/// Pipes and buffers kept per thread for the next burst.
const KEPT: usize = 64;
/// The most pipes one thread has in use at once (two descriptors each).
pub const PIPES_PER_THREAD: usize = 128;
/// The most fallback buffers one thread has in use at once.
pub const BUFFERS_PER_THREAD: usize = 256;
/// How long a burst waits before it looks for a pipe or buffer again, when all are in use.
const RETRY: Duration = Duration::from_millis(5);

/// How long a spliced connection may go without progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// No byte in either direction for this long ends the connection.
    pub idle: Duration,
    /// A peer that takes none of the bytes waiting for it for this long ends the connection.
    pub stall: Duration,
}

/// How a spliced connection's bytes are moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transfer {
    /// read(2) into a pooled buffer, write(2) out of it (the default: `Limits::default`).
    Copy,
    /// splice(2) through a pooled pipe (a buffer where no pipe is to be had).
    Splice,
}

/// Why a splice ended other than by both sides closing.
#[derive(Debug, thiserror::Error)]
pub enum PumpError {
    #[error("no bytes in either direction for {0:?}")]
    Idle(Duration),
    #[error("a peer took none of the bytes waiting for it for {0:?}")]
    Stalled(Duration),
    #[error(transparent)]
    Io(#[from] io::Error),
}

impl PumpError {
    /// A stable label for metrics (`closed_total{reason}`).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Idle(_) => "idle_timeout",
            Self::Stalled(_) => "stall_timeout",
            Self::Io(_) => "error",
        }
    }
}

thread_local! {
    static PIPES: RefCell<Pool<Pipe>> = const { RefCell::new(Pool::new()) };
    static BUFFERS: RefCell<Pool<Box<[u8]>>> = const { RefCell::new(Pool::new()) };
    /// False once splice(2) was refused on this thread (EINVAL, ENOSYS): buffers only.
    static SPLICE_WORKS: Cell<bool> = const { Cell::new(true) };
}

/// A per-thread pool: idle items kept for reuse, and how many are out.
struct Pool<T> {
    free: Vec<T>,
    in_use: usize,
}

impl<T> Pool<T> {
    const fn new() -> Self {
        Self {
            free: Vec::new(),
            in_use: 0,
        }
    }

    /// An item from the pool, else a new one from `make`, unless `limit` are out already.
    fn take(&mut self, limit: usize, make: impl FnOnce() -> Option<T>) -> Option<T> {
        if self.in_use >= limit {
            return None;
        }
        let item = self.free.pop().or_else(make)?;
        self.in_use += 1;
        Some(item)
    }

    /// An item back (`Some`: kept for reuse if there is room; `None`: it was dropped).
    fn give(&mut self, item: Option<T>) {
        self.in_use = self.in_use.saturating_sub(1);
        if let Some(item) = item
            && self.free.len() < KEPT
        {
            self.free.push(item);
        }
    }
}

/// Pipes and buffers this thread has in use now (for tests and metrics).
pub fn in_use() -> (usize, usize) {
    (
        PIPES.with(|p| p.borrow().in_use),
        BUFFERS.with(|b| b.borrow().in_use),
    )
}

/// A pipe's two ends.
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl Pipe {
    fn new() -> Option<Self> {
        let (read, write) = nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC).ok()?;
        Some(Self { read, write })
    }
}

/// A pipe taken from this thread's pool, back to it when dropped — unless bytes may still be
/// in it (an error mid-burst), then it is closed.
struct PipeLease {
    pipe: Option<Pipe>,
    /// Bytes spliced into the pipe and not yet out of it.
    held: usize,
}

impl PipeLease {
    fn take() -> Option<Self> {
        if !SPLICE_WORKS.with(Cell::get) {
            return None;
        }
        let pipe = PIPES
            .try_with(|p| p.borrow_mut().take(PIPES_PER_THREAD, Pipe::new))
            .ok()
            .flatten()?;
        Some(Self {
            pipe: Some(pipe),
            held: 0,
        })
    }
}

impl Drop for PipeLease {
    fn drop(&mut self) {
        let pipe = self.pipe.take().filter(|_| self.held == 0);
        let _ = PIPES.try_with(|p| p.borrow_mut().give(pipe));
    }
}

/// A buffer of [`BUFFER`] bytes from this thread's pool, back to it when dropped.
struct Buffer(Option<Box<[u8]>>);

impl Buffer {
    fn take() -> Option<Self> {
        let buf = BUFFERS
            .try_with(|b| {
                b.borrow_mut()
                    .take(BUFFERS_PER_THREAD, || Some(vec![0; BUFFER].into_boxed_slice()))
            })
            .ok()
            .flatten()?;
        Some(Self(Some(buf)))
    }

    fn bytes(&mut self) -> &mut [u8] {
        self.0.as_deref_mut().unwrap_or_default()
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let buf = self.0.take();
        let _ = BUFFERS.try_with(|b| b.borrow_mut().give(buf));
    }
}

/// When either direction last moved a byte, and since when each waits for its peer to take
/// bytes, in milliseconds since the splice began (+1: 0 is "not waiting"). One timer per
/// connection watches them all (a timer per direction would make every connection's task
/// larger, idle or not).
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
    blocked_ms: [AtomicU64; 2],
}

impl Activity {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
            blocked_ms: [AtomicU64::new(0), AtomicU64::new(0)],
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn at(&self, ms: u64) -> Instant {
        self.start + Duration::from_millis(ms)
    }

    fn touch(&self) {
        self.last_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// Direction `dir` waits for its peer to take bytes (`true`) or does not any more.
    fn blocked(&self, dir: usize, waiting: bool) {
        let v = if waiting { self.now_ms() + 1 } else { 0 };
        self.blocked_ms[dir].store(v, Ordering::Relaxed);
    }

    /// Returns once nothing has moved for `t.idle`, or a direction has waited `t.stall` for
    /// its peer. Wakes at least every `t.stall` (a direction may start waiting meanwhile).
    async fn watch(&self, t: Timeouts) -> PumpError {
        loop {
            let now = Instant::now();
            let last = self.at(self.last_ms.load(Ordering::Relaxed));
            if now.saturating_duration_since(last) >= t.idle {
                return PumpError::Idle(t.idle);
            }
            let mut next = (last + t.idle).min(now + t.stall);
            for b in &self.blocked_ms {
                let since = b.load(Ordering::Relaxed);
                if since != 0 {
                    let since = self.at(since - 1);
                    if now.saturating_duration_since(since) >= t.stall {
                        return PumpError::Stalled(t.stall);
                    }
                    next = next.min(since + t.stall);
                }
            }
            tokio::time::sleep_until(next).await;
        }
    }
}

/// How a burst ended.
enum Burst {
    /// The socket would block: wait until it is readable again.
    More,
    /// The peer closed its sending side.
    End,
}

/// Copies both ways (by `transfer`) until both sides have ended, either fails, no byte moves
/// either way for `timeouts.idle`, or a peer takes nothing for `timeouts.stall`. Bytes are
/// added to `to_b` / `to_a` as they go (so a long watch shows in the counters while it runs).
pub async fn both_ways(
    a: &TcpStream,
    b: &TcpStream,
    timeouts: Timeouts,
    transfer: Transfer,
    to_b: &Counter,
    to_a: &Counter,
) -> Result<(), PumpError> {
    let activity = Activity::new();
    let pumps = async {
        tokio::try_join!(
            pump(a, b, Direction(&activity, 0), transfer, to_b),
            pump(b, a, Direction(&activity, 1), transfer, to_a)
        )
    };
    tokio::select! {
        done = pumps => done.map(|_| ()),
        ended = activity.watch(timeouts) => Err(ended),
    }
}

/// One direction of a connection's [`Activity`].
#[derive(Clone, Copy)]
struct Direction<'a>(&'a Activity, usize);

impl Direction<'_> {
    fn touch(self) {
        self.0.touch();
    }

    /// Waits until `to` takes bytes again (the watchdog ends the connection if that takes the
    /// stall timeout).
    async fn writable(self, to: &TcpStream) -> Result<(), PumpError> {
        self.0.blocked(self.1, true);
        let r = to.writable().await;
        self.0.blocked(self.1, false);
        Ok(r?)
    }
}

/// Copies `from` to `to` until `from` ends, then shuts `to`'s write half (the other direction
/// goes on: a half-close is passed through).
async fn pump(
    from: &TcpStream,
    to: &TcpStream,
    dir: Direction<'_>,
    transfer: Transfer,
    counted: &Counter,
) -> Result<(), PumpError> {
    loop {
        from.readable().await?;
        let pipe = match transfer {
            Transfer::Splice => PipeLease::take(),
            Transfer::Copy => None,
        };
        // A burst's state is boxed: allocated while bytes flow, not held by every idle
        // connection's task (it is most of a direction's size).
        let burst = if let Some(pipe) = pipe {
            Box::pin(splice_burst(from, to, pipe, dir, counted)).await?
        } else if let Some(buf) = Buffer::take() {
            Box::pin(copy_burst(from, to, buf, dir, counted)).await?
        } else {
            // Every pipe and buffer of this thread is out (peers that do not read): wait.
            Box::pin(tokio::time::sleep(RETRY)).await; // rare: kept out of every task's size
            Burst::More
        };
        if let Burst::End = burst {
            // ENOTCONN when the peer is already gone: nothing left to tell it.
            let _ = socket2::SockRef::from(to).shutdown(std::net::Shutdown::Write);
            return Ok(());
        }
    }
}

/// Moves what `from` has through `pipe` to `to`, until `from` would block or ends.
async fn splice_burst(
    from: &TcpStream,
    to: &TcpStream,
    mut pipe: PipeLease,
    dir: Direction<'_>,
    counted: &Counter,
) -> Result<Burst, PumpError> {
    let Some(Pipe { read, write }) = pipe.pipe.as_ref() else {
        return Ok(Burst::More);
    };
    let flags = SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK;
    loop {
        let n = match from.try_io(Interest::READABLE, || {
            splice(from, None, write, None, CHUNK, flags).map_err(io::Error::from)
        }) {
            Ok(0) => return Ok(Burst::End),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Burst::More),
            Err(e) if e.raw_os_error().is_some_and(is_unsupported) => {
                // Nothing was moved: the pipe is clean, and this thread uses buffers from now on.
                SPLICE_WORKS.with(|s| s.set(false));
                return Ok(Burst::More);
            }
            Err(e) => return Err(e.into()),
        };
        pipe.held = n;
        while pipe.held > 0 {
            match to.try_io(Interest::WRITABLE, || {
                splice(read, None, to, None, pipe.held, flags).map_err(io::Error::from)
            }) {
                Ok(m) => {
                    pipe.held -= m;
                    counted.inc_by(m as u64);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => dir.writable(to).await?,
                Err(e) => return Err(e.into()),
            }
        }
        dir.touch();
    }
}

/// Whether an errno from splice(2) means the kernel cannot splice these descriptors at all.
fn is_unsupported(errno: i32) -> bool {
    errno == nix::errno::Errno::EINVAL as i32 || errno == nix::errno::Errno::ENOSYS as i32
}

/// Moves what `from` has through `buf` to `to`, until `from` would block or ends.
async fn copy_burst(
    from: &TcpStream,
    to: &TcpStream,
    mut buf: Buffer,
    dir: Direction<'_>,
    counted: &Counter,
) -> Result<Burst, PumpError> {
    loop {
        let n = match from.try_read(buf.bytes()) {
            Ok(0) => return Ok(Burst::End),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Burst::More),
            Err(e) => return Err(e.into()),
        };
        let mut at = 0;
        while at < n {
            match to.try_write(&buf.bytes()[at..n]) {
                Ok(m) => {
                    at += m;
                    counted.inc_by(m as u64);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => dir.writable(to).await?,
                Err(e) => return Err(e.into()),
            }
        }
        dir.touch();
    }
}

#[cfg(test)]
mod tests;
