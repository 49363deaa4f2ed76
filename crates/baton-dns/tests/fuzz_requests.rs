//! Property-based fuzzing of the request path: arbitrary and mutated packets never panic, and a
//! server fed garbage keeps answering.

// Test helpers outside #[test] fns: a failed step is a failed test.
#![allow(clippy::unwrap_used)]

mod common;

use baton_dns::fuzzing::Zone;
use common::{addresses, bootstrap_store, name, query, start, udp_client};
use hickory_proto::op::{Edns, Message, Query};
use hickory_proto::rr::{Name, RecordType};
use proptest::prelude::*;

fn zone() -> Zone {
    Zone::new(&name("c1.example.com"), &bootstrap_store().snapshot()).unwrap()
}

fn valid_query(edns: bool) -> Vec<u8> {
    let mut m = Message::query();
    m.add_query(Query::query(
        Name::from_ascii("api.c1.example.com.").unwrap(),
        RecordType::A,
    ));
    if edns {
        m.set_edns(Edns::new());
    }
    m.to_vec().unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(packet in prop::collection::vec(any::<u8>(), 0..600)) {
        let z = zone();
        let mut out = Vec::new();
        let _ = z.respond_udp(&packet, &mut out);
        let _ = z.respond_slow(&packet, &mut out);
    }

    #[test]
    fn mutated_queries_never_panic_and_replies_parse(
        edns in any::<bool>(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let z = zone();
        let mut packet = valid_query(edns);
        for (at, byte) in flips {
            let i = at.index(packet.len());
            packet[i] ^= byte;
        }
        if truncate {
            packet.truncate(cut.index(packet.len() + 1));
        }
        let mut out = Vec::new();
        if z.respond_udp(&packet, &mut out) {
            prop_assert!(out.len() >= 12);
            prop_assert!(out.len() <= 1232);
            // Our own replies must be well-formed DNS.
            prop_assert!(Message::from_vec(&out).is_ok(), "undecodable reply to {packet:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_fed_garbage_keeps_answering() {
    let server = start(bootstrap_store()).await;
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    for i in 0..2000_usize {
        let len = i % 300;
        let mut packet = Vec::with_capacity(len);
        for _ in 0..len {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            packet.push(seed.to_le_bytes()[0]);
        }
        socket.send_to(&packet, server.addr).await.unwrap();
    }
    let mut client = udp_client(server.addr).await;
    let r = query(&mut client, "api.c1.example.com.", RecordType::A).await;
    assert_eq!(addresses(&r).len(), 2);
    server.handle.shutdown().await;
}
