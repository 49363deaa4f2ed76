//! Shared helpers of the integration tests: a running server, hickory clients, `dig`.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)] // test helpers: a failed step is a failed test

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use tokio::process::Command;

use baton_dns::{DnsName, DnsServer, DnsServerHandle, RecordStore, ServerConfig};
use hickory_net::client::{Client, ClientHandle};
use hickory_net::runtime::TokioRuntimeProvider;
use hickory_net::tcp::TcpClientStream;
use hickory_net::udp::UdpClientStream;
use hickory_proto::op::DnsResponse;
use hickory_proto::rr::{DNSClass, Name, RData, RecordType};
use tokio_util::sync::CancellationToken;

pub const ZONE: &str = "c1.example.com";
pub const BOOTSTRAP: &str = "192.0.2.10";
pub const FIP: &str = "203.0.113.5";

pub fn name(s: &str) -> DnsName {
    s.parse().unwrap()
}

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

pub fn api() -> DnsName {
    name("api.c1.example.com")
}

pub fn api_int() -> DnsName {
    name("api-int.c1.example.com")
}

/// A store with api and api-int → bootstrap IP + FIP, both healthy.
pub fn bootstrap_store() -> RecordStore {
    let store = RecordStore::new();
    for n in [api(), api_int()] {
        store.set_name(n, [(ip(BOOTSTRAP), true), (ip(FIP), true)]);
    }
    store
}

pub struct Running {
    pub handle: DnsServerHandle,
    pub addr: SocketAddr,
    pub store: RecordStore,
    _token: CancellationToken,
}

pub async fn start(store: RecordStore) -> Running {
    let mut config = ServerConfig::new(name(ZONE), vec!["127.0.0.1:0".parse().unwrap()]);
    config.udp_workers = 2;
    let token = CancellationToken::new();
    let handle = DnsServer::start(config, store.clone(), &token).await.unwrap();
    let addr = handle.udp_addrs()[0];
    assert_eq!(addr, handle.tcp_addrs()[0], "UDP and TCP share the port");
    Running {
        handle,
        addr,
        store,
        _token: token,
    }
}

pub async fn udp_client(addr: SocketAddr) -> Client<TokioRuntimeProvider> {
    let stream = UdpClientStream::builder(addr, TokioRuntimeProvider::default())
        .with_timeout(Some(Duration::from_secs(2)))
        .build();
    let (client, bg) = Client::<TokioRuntimeProvider>::from_sender(stream);
    tokio::spawn(bg);
    client
}

pub async fn tcp_client(addr: SocketAddr) -> Client<TokioRuntimeProvider> {
    let (stream, sender) = TcpClientStream::new(
        addr,
        None,
        Some(Duration::from_secs(2)),
        TokioRuntimeProvider::default(),
    );
    let (client, bg) = Client::<TokioRuntimeProvider>::new(stream.await.unwrap(), sender);
    tokio::spawn(bg);
    client
}

pub async fn query(client: &mut Client<TokioRuntimeProvider>, qname: &str, qtype: RecordType) -> DnsResponse {
    client
        .query(Name::from_ascii(qname).unwrap(), DNSClass::IN, qtype)
        .await
        .unwrap()
}

/// The A/AAAA addresses of the answer section, in order.
pub fn addresses(response: &DnsResponse) -> Vec<IpAddr> {
    response
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            RData::AAAA(a) => Some(IpAddr::V6(a.0)),
            _ => None,
        })
        .collect()
}

/// Runs `dig` (Debian package bind9-dnsutils); fails the test with a clear message if missing.
pub async fn dig(addr: SocketAddr, args: &[&str]) -> String {
    let output = Command::new("dig")
        .arg(format!("@{}", addr.ip()))
        .args(["-p", &addr.port().to_string(), "+time=2", "+tries=1"])
        .args(args)
        .output()
        .await
        .unwrap_or_else(|e| panic!("cannot run `dig` ({e}); install the Debian package bind9-dnsutils"));
    let out = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        !out.contains("communications error"),
        "dig could not reach {addr}:\n{out}"
    );
    out
}

/// The `flags:` of a dig header line, e.g. `["qr", "aa", "rd"]`.
pub fn dig_flags(out: &str) -> Vec<String> {
    let line = out
        .lines()
        .find(|l| l.contains(";; flags:"))
        .unwrap_or_else(|| panic!("no flags in:\n{out}"));
    let flags = line.split(";; flags:").nth(1).unwrap().split(';').next().unwrap();
    flags.split_whitespace().map(str::to_owned).collect()
}

/// The `status:` of a dig header, e.g. `NOERROR`.
pub fn dig_status(out: &str) -> String {
    let line = out
        .lines()
        .find(|l| l.contains("status:"))
        .unwrap_or_else(|| panic!("no status in:\n{out}"));
    line.split("status: ")
        .nth(1)
        .unwrap()
        .split(',')
        .next()
        .unwrap()
        .to_owned()
}
