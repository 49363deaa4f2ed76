//! The embedded server, queried with real clients: hickory's client and resolver, and `dig`.

// Test helpers outside #[test] fns: a failed step is a failed test.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::{
    BOOTSTRAP, FIP, addresses, api, api_int, bootstrap_store, dig, dig_flags, dig_status, ip, query, start,
    tcp_client, udp_client,
};
use hickory_proto::op::{Message, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};
use hickory_resolver::Resolver;
use hickory_resolver::config::{NameServerConfig, ResolveHosts, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;

#[tokio::test]
async fn answers_both_addresses_authoritatively_without_recursion() {
    let server = start(bootstrap_store()).await;
    for mut client in [udp_client(server.addr).await, tcp_client(server.addr).await] {
        for qname in ["api.c1.example.com.", "API-INT.C1.example.COM."] {
            let r = query(&mut client, qname, RecordType::A).await;
            assert_eq!(r.metadata.response_code, ResponseCode::NoError);
            assert!(r.metadata.authoritative, "AA must be set");
            assert!(!r.metadata.recursion_available, "RA must be clear");
            let got: HashSet<_> = addresses(&r).into_iter().collect();
            assert_eq!(got, HashSet::from([ip(BOOTSTRAP), ip(FIP)]));
            assert!(r.answers.iter().all(|a| a.ttl == 30), "default TTL 30 s");
            // The question keeps the client's spelling.
            assert_eq!(r.queries[0].name().to_ascii(), qname);
        }
    }
    server.handle.shutdown().await;
}

#[tokio::test]
async fn rotates_the_answer_order_across_queries() {
    let server = start(bootstrap_store()).await;
    for mut client in [udp_client(server.addr).await, tcp_client(server.addr).await] {
        let mut firsts = Vec::new();
        for _ in 0..4 {
            let r = query(&mut client, "api.c1.example.com.", RecordType::A).await;
            firsts.push(addresses(&r)[0]);
        }
        assert!(
            firsts.windows(2).all(|w| w[0] != w[1]),
            "order must rotate: {firsts:?}"
        );
    }
    server.handle.shutdown().await;
}

#[tokio::test]
async fn refuses_names_outside_the_zone_without_recursion() {
    let server = start(bootstrap_store()).await;
    let mut client = udp_client(server.addr).await;
    for qname in ["www.example.org.", "example.com.", "xc1.example.com."] {
        let r = query(&mut client, qname, RecordType::A).await;
        assert_eq!(r.metadata.response_code, ResponseCode::Refused, "{qname}");
        assert!(!r.metadata.recursion_available);
        assert!(r.answers.is_empty());
    }
    server.handle.shutdown().await;
}

#[tokio::test]
async fn refuses_zone_transfers_and_updates() {
    let server = start(bootstrap_store()).await;
    let mut client = tcp_client(server.addr).await;
    for qtype in [RecordType::AXFR, RecordType::IXFR] {
        let r = query(&mut client, "c1.example.com.", qtype).await;
        assert_eq!(r.metadata.response_code, ResponseCode::Refused, "{qtype}");
        assert!(r.answers.is_empty());
    }
    let out = dig(server.addr, &["c1.example.com", "AXFR"]).await;
    assert!(out.contains("Transfer failed"), "dig AXFR must fail:\n{out}");

    // An (unsigned) UPDATE adding a record: REFUSED, and nothing changes.
    let mut update = Message::query();
    update.metadata.op_code = OpCode::Update;
    let mut zone = Query::query(Name::from_ascii("c1.example.com.").unwrap(), RecordType::SOA);
    zone.set_query_class(hickory_proto::rr::DNSClass::IN);
    update.add_query(zone);
    let reply = raw_udp(server.addr, &update.to_vec().unwrap()).await;
    let reply = Message::from_vec(&reply).unwrap();
    assert_eq!(reply.metadata.response_code, ResponseCode::Refused);
    server.handle.shutdown().await;
}

async fn raw_udp(addr: std::net::SocketAddr, packet: &[u8]) -> Vec<u8> {
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    socket.send_to(packet, addr).await.unwrap();
    let mut buf = vec![0; 4096];
    let (len, _) = tokio::time::timeout(Duration::from_secs(2), socket.recv_from(&mut buf))
        .await
        .unwrap()
        .unwrap();
    buf.truncate(len);
    buf
}

#[tokio::test]
async fn soa_ns_nxdomain_nodata_and_minimal_any() {
    let server = start(bootstrap_store()).await;
    let mut client = udp_client(server.addr).await;

    let soa = query(&mut client, "c1.example.com.", RecordType::SOA).await;
    assert!(soa.metadata.authoritative);
    assert!(matches!(soa.answers[0].data, RData::SOA(_)));

    let ns = query(&mut client, "c1.example.com.", RecordType::NS).await;
    assert!(matches!(&ns.answers[0].data, RData::NS(n) if n.0.to_ascii() == "ns1.c1.example.com."));
    // Glue: the listen address.
    assert!(
        ns.additionals
            .iter()
            .any(|r| matches!(&r.data, RData::A(a) if a.0 == std::net::Ipv4Addr::LOCALHOST))
    );

    let nx = query(&mut client, "nope.c1.example.com.", RecordType::A).await;
    assert_eq!(nx.metadata.response_code, ResponseCode::NXDomain);
    assert!(nx.metadata.authoritative);
    assert!(
        matches!(nx.authorities[0].data, RData::SOA(_)),
        "negative answers carry the SOA"
    );

    let nodata = query(&mut client, "api.c1.example.com.", RecordType::AAAA).await;
    assert_eq!(nodata.metadata.response_code, ResponseCode::NoError);
    assert!(nodata.answers.is_empty());
    assert!(matches!(nodata.authorities[0].data, RData::SOA(_)));

    let any = query(&mut client, "api.c1.example.com.", RecordType::ANY).await;
    assert_eq!(any.answers.len(), 2, "ANY: one RRset only (RFC 8482)");
    assert!(any.answers.iter().all(|r| r.record_type() == RecordType::A));
    server.handle.shutdown().await;
}

#[tokio::test]
async fn runtime_updates_are_visible_on_the_next_query() {
    let server = start(bootstrap_store()).await;
    let mut udp = udp_client(server.addr).await;
    let mut tcp = tcp_client(server.addr).await;

    // The bootstrap phase drops the bootstrap address.
    assert!(server.store.remove_address(&api(), ip(BOOTSTRAP)));
    assert_eq!(
        addresses(&query(&mut udp, "api.c1.example.com.", RecordType::A).await),
        vec![ip(FIP)]
    );
    assert_eq!(
        addresses(&query(&mut tcp, "api.c1.example.com.", RecordType::A).await),
        vec![ip(FIP)]
    );
    // api-int is untouched.
    assert_eq!(
        addresses(&query(&mut udp, "api-int.c1.example.com.", RecordType::A).await).len(),
        2
    );

    // Health: an unhealthy address is not served, unless none is healthy.
    server
        .store
        .set_name(api_int(), [(ip(BOOTSTRAP), false), (ip(FIP), true)]);
    assert_eq!(
        addresses(&query(&mut udp, "api-int.c1.example.com.", RecordType::A).await),
        vec![ip(FIP)]
    );
    server.store.set_health(&api_int(), ip(FIP), false);
    assert_eq!(
        addresses(&query(&mut udp, "api-int.c1.example.com.", RecordType::A).await).len(),
        2
    );

    // AAAA by giving IPv6 addresses.
    server
        .store
        .set_name(api(), [(ip("2001:db8::1"), true), (ip(FIP), true)]);
    let r = query(&mut udp, "api.c1.example.com.", RecordType::AAAA).await;
    assert_eq!(addresses(&r), vec![ip("2001:db8::1")]);
    server.handle.shutdown().await;
}

#[tokio::test]
async fn dig_sees_aa_rotation_refused_and_updates() {
    let server = start(bootstrap_store()).await;
    let out = dig(server.addr, &["api.c1.example.com", "A", "+norec"]).await;
    assert_eq!(dig_status(&out), "NOERROR");
    let flags = dig_flags(&out);
    assert!(flags.contains(&"aa".to_owned()), "{flags:?}");
    assert!(!flags.contains(&"ra".to_owned()), "{flags:?}");
    let short = async |extra: &[&str]| {
        let mut args = vec!["api.c1.example.com", "A", "+short"];
        args.extend_from_slice(extra);
        dig(server.addr, &args)
            .await
            .lines()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let (first, second) = (short(&[]).await, short(&["+tcp"]).await);
    assert_eq!(first.len(), 2, "{first:?}");
    assert_eq!(second.len(), 2, "{second:?}");
    let third = short(&[]).await;
    assert!(
        first[0] != third[0] || second[0] != third[0],
        "rotation seen by dig: {first:?} {second:?} {third:?}"
    );

    let refused = dig(server.addr, &["www.example.org", "A"]).await;
    assert_eq!(dig_status(&refused), "REFUSED");
    assert!(!dig_flags(&refused).contains(&"ra".to_owned()));

    server.store.remove_address(&api(), ip(BOOTSTRAP));
    assert_eq!(short(&[]).await, vec![FIP.to_owned()]);
    server.handle.shutdown().await;
}

#[tokio::test]
async fn hickory_resolver_resolves_the_api_names() {
    let server = start(bootstrap_store()).await;
    let mut ns = NameServerConfig::udp_and_tcp(server.addr.ip());
    for c in &mut ns.connections {
        c.port = server.addr.port();
    }
    let mut builder = Resolver::builder_with_config(
        ResolverConfig::from_parts(None, vec![], vec![ns]),
        TokioRuntimeProvider::default(),
    );
    let o = builder.options_mut();
    o.timeout = Duration::from_secs(2);
    o.cache_size = 0;
    o.use_hosts_file = ResolveHosts::Never;
    o.recursion_desired = false;
    let resolver = builder.build().unwrap();
    let lookup = resolver
        .lookup("api.c1.example.com.", RecordType::A)
        .await
        .unwrap();
    let got: HashSet<_> = lookup
        .answers()
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(std::net::IpAddr::V4(a.0)),
            _ => None,
        })
        .collect();
    assert_eq!(got, HashSet::from([ip(BOOTSTRAP), ip(FIP)]));
    server.handle.shutdown().await;
}

#[tokio::test]
async fn shutdown_stops_both_listeners() {
    let server = start(bootstrap_store()).await;
    let addr = server.addr;
    server.handle.shutdown().await;
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "TCP closed after shutdown"
    );
}
