use std::collections::BTreeSet;
use std::net::IpAddr;

use hickory_proto::op::{Edns, Message, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};
use proptest::prelude::*;

use super::{Compiled, ZoneSettings};
use crate::DnsName;
use crate::model::{NameRecords, Snapshot};

fn n(s: &str) -> DnsName {
    s.parse().unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn zone_with(names: Vec<(&str, Vec<IpAddr>)>) -> Compiled {
    let snapshot = Snapshot::from_names(
        names
            .into_iter()
            .map(|(name, ips)| (n(name), NameRecords::new(ips.into_iter().map(|i| (i, true))))),
    );
    let settings = ZoneSettings {
        origin: n("c1.example.com"),
        ttl: 30,
        ns_name: n("ns1.c1.example.com"),
        ns_addresses: vec![ip("192.0.2.53")],
        serial_base: 7,
    };
    Compiled::compile(&settings, &snapshot).unwrap()
}

fn zone() -> Compiled {
    zone_with(vec![
        (
            "api.c1.example.com",
            vec![
                ip("192.0.2.10"),
                ip("203.0.113.5"),
                ip("2001:db8::1"),
                ip("2001:db8::2"),
            ],
        ),
        (
            "api-int.c1.example.com",
            vec![ip("192.0.2.10"), ip("203.0.113.5"), ip("203.0.113.6")],
        ),
        ("a.b.c1.example.com", vec![ip("192.0.2.99")]),
    ])
}

fn request(name: &str, qtype: RecordType, edns: Option<u16>, id: u16, rd: bool, cd: bool) -> Vec<u8> {
    let mut m = Message::query();
    m.metadata.id = id;
    m.metadata.recursion_desired = rd;
    m.metadata.checking_disabled = cd;
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
    if let Some(payload) = edns {
        let mut e = Edns::new();
        e.set_max_payload(payload);
        m.set_edns(e);
    }
    m.to_vec().unwrap()
}

fn respond(zone: &Compiled, packet: &[u8], fast: bool) -> Message {
    let mut out = Vec::new();
    let sent = if fast {
        zone.respond_udp(packet, &mut out)
    } else {
        zone.respond_slow(packet, &mut out, true)
    };
    assert!(sent);
    Message::from_vec(&out).unwrap()
}

fn answer_set(m: &Message) -> BTreeSet<String> {
    // Names compare case-insensitively: the fast path's answers point at the question name
    // (compression), so they carry the client's spelling; both are correct DNS.
    m.answers
        .iter()
        .map(|r| format!("{} {} {}", r.name, r.ttl, r.data).to_ascii_lowercase())
        .collect()
}

#[test]
fn fast_path_is_used_for_simple_queries() {
    let z = zone();
    let packet = request("api.c1.example.com.", RecordType::A, None, 1, true, false);
    assert!(crate::wire::SimpleQuery::parse(&packet).is_some());
    assert!(
        z.fast_template(&crate::wire::SimpleQuery::parse(&packet).unwrap(), &packet)
            .is_some()
    );
}

#[test]
fn rotation_cycles_through_every_address() {
    let z = zone();
    let packet = request("api-int.c1.example.com.", RecordType::A, None, 1, false, false);
    let firsts: Vec<_> = (0..3)
        .map(|_| respond(&z, &packet, true).answers[0].data.clone())
        .collect();
    let distinct: BTreeSet<_> = firsts.iter().map(ToString::to_string).collect();
    assert_eq!(distinct.len(), 3, "{firsts:?}");
    // Slow and fast paths share the counter.
    let next_slow = respond(&z, &packet, false).answers[0].data.clone();
    assert_eq!(next_slow, firsts[0]);
}

#[test]
fn empty_non_terminal_is_nodata_not_nxdomain() {
    let z = zone();
    let r = respond(
        &z,
        &request("b.c1.example.com.", RecordType::A, None, 1, false, false),
        true,
    );
    assert_eq!(r.metadata.response_code, ResponseCode::NoError);
    let r = respond(
        &z,
        &request("x.b.c1.example.com.", RecordType::A, None, 1, false, false),
        true,
    );
    assert_eq!(r.metadata.response_code, ResponseCode::NXDomain);
}

#[test]
fn large_rrsets_truncate_without_edns_and_fit_with_it() {
    let many: Vec<IpAddr> = (1..=40_u16)
        .map(|i| IpAddr::from([0x2001, 0xdb8, 0, 0, 0, 0, 0, i]))
        .collect();
    let z = zone_with(vec![("big.c1.example.com", many)]);
    let plain = respond(
        &z,
        &request("big.c1.example.com.", RecordType::AAAA, None, 1, false, false),
        true,
    );
    assert!(plain.metadata.truncation, "40 AAAA do not fit in 512 bytes");
    assert!(plain.answers.is_empty());
    let edns = respond(
        &z,
        &request(
            "big.c1.example.com.",
            RecordType::AAAA,
            Some(1232),
            1,
            false,
            false,
        ),
        true,
    );
    assert!(!edns.metadata.truncation);
    assert_eq!(edns.answers.len(), 40);
}

#[test]
fn future_edns_version_gets_badvers_and_soa_serial_follows_generation() {
    let z = zone();
    let mut m = Message::query();
    m.add_query(Query::query(
        Name::from_ascii("api.c1.example.com.").unwrap(),
        RecordType::A,
    ));
    let mut e = Edns::new();
    e.set_version(1);
    m.set_edns(e);
    let r = respond(&z, &m.to_vec().unwrap(), true);
    // BADVERS and BADSIG share code 16; hickory decodes it as BADSIG.
    assert_eq!(u16::from(r.metadata.response_code), 16);
    assert!(r.edns.is_some(), "an extended rcode needs the OPT RR");
    let soa = respond(
        &z,
        &request("c1.example.com.", RecordType::SOA, None, 1, false, false),
        true,
    );
    let RData::SOA(soa) = &soa.answers[0].data else {
        panic!("no SOA")
    };
    assert_eq!(soa.serial, 7 + u32::try_from(z.generation).unwrap());
}

fn spelling() -> impl Strategy<Value = String> {
    (
        prop::sample::select(vec!["api", "api-int", "a.b", "ns1", "@"]),
        any::<u64>(),
    )
        .prop_map(|(label, bits)| {
            let base = if label == "@" {
                "c1.example.com.".to_owned()
            } else {
                format!("{label}.c1.example.com.")
            };
            base.chars()
                .enumerate()
                .map(|(i, c)| {
                    if bits >> (i % 64) & 1 == 1 {
                        c.to_ascii_uppercase()
                    } else {
                        c
                    }
                })
                .collect()
        })
}

proptest! {
    /// The precomputed fast path answers exactly what the reference path answers (up to the
    /// rotation, which both advance).
    #[test]
    fn fast_path_agrees_with_reference(
        name in spelling(),
        qtype in prop::sample::select(vec![RecordType::A, RecordType::AAAA, RecordType::TXT, RecordType::ANY]),
        edns in prop::option::of(prop::sample::select(vec![0_u16, 512, 1232, 4096])),
        id in any::<u16>(), rd in any::<bool>(), cd in any::<bool>(),
    ) {
        let z = zone();
        let packet = request(&name, qtype, edns, id, rd, cd);
        let fast = respond(&z, &packet, true);
        let slow = respond(&z, &packet, false);
        prop_assert_eq!(fast.metadata, slow.metadata);
        prop_assert_eq!(&fast.queries, &slow.queries);
        prop_assert_eq!(fast.queries[0].name().to_ascii(), name);
        prop_assert_eq!(answer_set(&fast), answer_set(&slow));
        prop_assert_eq!(&fast.authorities, &slow.authorities);
        prop_assert_eq!(&fast.additionals, &slow.additionals);
        prop_assert_eq!(&fast.edns, &slow.edns);
    }
}
