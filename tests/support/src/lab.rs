//! The lab: a private network namespace in which the documentation ranges are local.
//!
//! Kubernetes refuses loopback addresses in Endpoints/EndpointSlices and as an API server's
//! advertise address, so simulated servers cannot live on 127.0.0.0/8. Inside a lab:
//!
//! ```text
//!   198.51.100.0/24  servers' public ("primary") IPs      ┐
//!   192.0.2.0/24     servers' private IPs                  ├ local on `lo`, reachable only here
//!   203.0.113.0/24   Floating IPs (the simulator binds)    │
//!   2001:db8::/32    IPv6 documentation range              ┘
//! ```
//!
//! Nothing inside reaches outside and nothing outside reaches in.
//!
//! Network namespaces belong to a thread, so [`run`] spawns a dedicated thread, moves it into a
//! new namespace (`unshare(CLONE_NEWNET)`, which needs root), and runs a tokio runtime there: every
//! worker thread and every child process started from it inherits the lab. Tests therefore run in
//! parallel, each in its own lab, and the lab vanishes when the thread ends.
//!
//! Without root, run the whole test binary inside one lab instead (`scripts/lab cargo test --
//! --test-threads=1`); `scripts/lab` sets `BATON_LAB=1`, and [`run`] then uses the current namespace.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;

use anyhow::{Context as _, bail};

/// The servers' public (primary) range.
pub const PUBLIC_RANGE: &str = "198.51.100.0/24";
/// The servers' private range.
pub const PRIVATE_RANGE: &str = "192.0.2.0/24";
/// The Floating IP range.
pub const FIP_RANGE: &str = "203.0.113.0/24";
/// The IPv6 documentation range.
pub const V6_RANGE: &str = "2001:db8::/32";

/// `198.51.100.<n>`: a public address in the lab.
pub fn public_ip(n: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(198, 51, 100, n))
}

/// `192.0.2.<n>`: a private address in the lab.
pub fn private_ip(n: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(192, 0, 2, n))
}

/// The private twin of a lab public address (`198.51.100.<n>` → `192.0.2.<n>`, as the
/// simulator's topology pairs a server's two addresses); `None` for any other address.
pub fn private_twin(ip: IpAddr) -> Option<IpAddr> {
    match ip {
        IpAddr::V4(v4) if v4.octets()[..3] == [198, 51, 100] => Some(private_ip(v4.octets()[3])),
        _ => None,
    }
}

/// `203.0.113.<n>`: a Floating IP address in the lab.
pub fn fip(n: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(203, 0, 113, n))
}

/// Runs `f` to completion on a multi-threaded tokio runtime inside a fresh lab.
///
/// Panics in `f` propagate to the caller (so `#[test]` fails as usual) after the runtime, its
/// tasks and the namespace are gone.
pub fn run<F, Fut, T>(f: F) -> T
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = T>,
    T: Send + 'static,
{
    crate::init_tracing();
    let handle = std::thread::Builder::new()
        .name("lab".into())
        .spawn(move || {
            enter().expect("cannot enter a lab network namespace");
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("tokio runtime");
            let out = rt.block_on(f());
            rt.shutdown_timeout(std::time::Duration::from_secs(5));
            out
        })
        .expect("spawn lab thread");
    match handle.join() {
        Ok(v) => v,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// Moves the calling thread into a new lab namespace (or, under `scripts/lab`, keeps the
/// current one, which is already a lab).
pub fn enter() -> anyhow::Result<()> {
    if std::env::var_os("BATON_LAB").is_some() {
        return Ok(());
    }
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "the lab needs a private network namespace: run as root, or run the tests inside one lab with \
             `scripts/lab cargo test -- --test-threads=1`"
        );
    }
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).context("unshare(CLONE_NEWNET)")?;
    configure()
}

/// Brings `lo` up and makes the lab ranges local. Idempotent.
pub fn configure() -> anyhow::Result<()> {
    ip(&["link", "set", "lo", "up"])?;
    for range in [PUBLIC_RANGE, PRIVATE_RANGE, FIP_RANGE] {
        ip(&["route", "replace", "local", range, "dev", "lo", "table", "local"])?;
    }
    ip(&[
        "-6", "route", "replace", "local", V6_RANGE, "dev", "lo", "table", "local",
    ])?;
    Ok(())
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running `ip` (iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lab_addresses_are_local_and_private() {
        let seen = run(|| async {
            let a = tokio::net::TcpListener::bind((public_ip(11), 0)).await.unwrap();
            let b = tokio::net::TcpListener::bind((fip(5), 6443)).await.unwrap();
            let addr = a.local_addr().unwrap();
            let accept = tokio::spawn(async move { a.accept().await.map(|(_, peer)| peer) });
            tokio::net::TcpStream::connect(addr).await.unwrap();
            drop(b);
            accept.await.unwrap().unwrap()
        });
        assert_eq!(seen.ip(), public_ip(11));
        // Two labs are independent: the same address and port bind in both at once.
        let t1 = std::thread::spawn(|| {
            run(|| async { tokio::net::TcpListener::bind((fip(7), 6443)).await.is_ok() })
        });
        let t2 = std::thread::spawn(|| {
            run(|| async { tokio::net::TcpListener::bind((fip(7), 6443)).await.is_ok() })
        });
        assert!(t1.join().unwrap() && t2.join().unwrap());
    }

    #[test]
    fn outside_a_lab_the_ranges_are_not_local() {
        // The test process itself is not in a lab: binding a lab address fails here.
        if std::env::var_os("BATON_LAB").is_some() {
            return;
        }
        assert!(std::net::TcpListener::bind((public_ip(250), 0)).is_err());
    }
}
