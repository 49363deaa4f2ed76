use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use rstest::rstest;
use serde_json::json;

use super::*;

fn ips(list: &[&str]) -> BTreeSet<IpAddr> {
    list.iter().map(|s| s.parse().unwrap()).collect()
}

fn holders(list: &[(&str, &[&str])]) -> BTreeMap<IpAddr, BTreeSet<IpAddr>> {
    list.iter()
        .map(|(fip, addrs)| (fip.parse().unwrap(), ips(addrs)))
        .collect()
}

/// The table text the controller writes for these rows.
fn table(rows: &[(&str, Option<&str>)]) -> String {
    let rows: Vec<_> = rows
        .iter()
        .map(|(a, h)| match h {
            Some(h) => json!({"address": a, "holder": h}),
            None => json!({"address": a}),
        })
        .collect();
    json!({ "fips": rows }).to_string()
}

#[rstest]
#[case::one_held(&[("203.0.113.10", Some("198.51.100.11"))], &["203.0.113.10"], &[("203.0.113.10", &["198.51.100.11"][..])])]
#[case::holder_unknown(&[("203.0.113.10", None)], &["203.0.113.10"], &[])]
#[case::two_fips_one_holder(
    &[("203.0.113.10", Some("198.51.100.11")), ("203.0.113.11", Some("198.51.100.11"))],
    &["203.0.113.10", "203.0.113.11"],
    &[("203.0.113.10", &["198.51.100.11"][..]), ("203.0.113.11", &["198.51.100.11"][..])]
)]
// The node's packets to an IPv6 FIP cannot be delivered to an IPv4 holder.
#[case::only_holders_of_the_fips_family(&[("2001:db8::10", Some("198.51.100.11"))], &["2001:db8::10"], &[])]
#[case::empty(&[], &[], &[])]
fn the_table_gives_the_fips_and_their_holders(
    #[case] rows: &[(&str, Option<&str>)],
    #[case] want_fips: &[&str],
    #[case] want_holders: &[(&str, &[&str])],
) {
    let got = fip_set(Some(&table(rows)));
    assert_eq!(got.fips, ips(want_fips));
    assert_eq!(got.holders, holders(want_holders));
    assert!(got.problems.is_empty(), "{:?}", got.problems);
}

#[rstest]
#[case::loopback(
    "127.0.0.1",
    "FIP table: address 127.0.0.1 cannot be a Floating IP (loopback)"
)]
#[case::unspecified("0.0.0.0", "FIP table: address 0.0.0.0 cannot be a Floating IP (unspecified)")]
#[case::multicast("ff02::1", "FIP table: address ff02::1 cannot be a Floating IP (multicast)")]
#[case::broadcast(
    "255.255.255.255",
    "FIP table: address 255.255.255.255 cannot be a Floating IP (broadcast)"
)]
fn an_unusable_address_is_named_and_skipped(#[case] bad: &str, #[case] problem: &str) {
    let got = fip_set(Some(&table(&[(bad, None), ("203.0.113.11", None)])));
    assert_eq!(got.fips, ips(&["203.0.113.11"]));
    assert_eq!(got.problems.len(), 1, "{:?}", got.problems);
    assert_eq!(got.problems[0].to_string(), problem);
}

#[rstest]
#[case::loopback(
    "127.0.0.1",
    "FIP table: the holder 127.0.0.1 of 203.0.113.10 cannot be a server's address (loopback)"
)]
#[case::unspecified(
    "0.0.0.0",
    "FIP table: the holder 0.0.0.0 of 203.0.113.10 cannot be a server's address (unspecified)"
)]
fn a_bad_holder_is_named_and_the_fip_still_accepted(#[case] holder: &str, #[case] problem: &str) {
    let got = fip_set(Some(&table(&[("203.0.113.10", Some(holder))])));
    assert_eq!(got.fips, ips(&["203.0.113.10"]));
    assert!(got.holders.is_empty(), "{:?}", got.holders);
    assert_eq!(got.problems.len(), 1, "{:?}", got.problems);
    assert_eq!(got.problems[0].to_string(), problem);
}

#[rstest]
#[case::no_key(None, "the FIP table has no key fips.json")]
#[case::not_json(Some("203.0.113.10"), "the FIP table's fips.json is not valid")]
#[case::an_address_that_does_not_parse(
    Some(r#"{"fips":[{"address":"not-an-ip"}]}"#),
    "the FIP table's fips.json is not valid"
)]
#[case::wrong_shape(Some(r#"["203.0.113.10"]"#), "the FIP table's fips.json is not valid")]
fn a_table_that_cannot_be_read_accepts_nothing_and_says_why(
    #[case] data: Option<&str>,
    #[case] problem: &str,
) {
    let got = fip_set(data);
    assert!(got.fips.is_empty() && got.holders.is_empty());
    assert_eq!(got.problems.len(), 1, "{:?}", got.problems);
    assert!(
        got.problems[0].to_string().starts_with(problem),
        "{}",
        got.problems[0]
    );
}

#[test]
fn the_table_the_controller_writes_is_the_table_the_agent_reads() {
    let written = crate::names::FipTable {
        fips: vec![
            crate::names::FipEntry {
                address: "203.0.113.10".parse().unwrap(),
                holder: Some("198.51.100.11".parse().unwrap()),
            },
            crate::names::FipEntry {
                address: "203.0.113.11".parse().unwrap(),
                holder: None,
            },
        ],
    };
    let got = fip_set(Some(&serde_json::to_string(&written).unwrap()));
    assert_eq!(got.fips, ips(&["203.0.113.10", "203.0.113.11"]));
    assert_eq!(got.holders, holders(&[("203.0.113.10", &["198.51.100.11"][..])]));
}
