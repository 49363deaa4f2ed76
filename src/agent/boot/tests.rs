use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use rstest::rstest;

use super::*;
use crate::names::FipEntry;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn ips(list: &[&str]) -> BTreeSet<IpAddr> {
    list.iter().map(|s| ip(s)).collect()
}

fn pairs(list: &[(&str, &str)]) -> BTreeMap<IpAddr, IpAddr> {
    list.iter().map(|(a, b)| (ip(a), ip(b))).collect()
}

fn file(fips: &[(&str, Option<&str>)], node: Option<&str>) -> NodeFile {
    NodeFile {
        fips: fips
            .iter()
            .map(|(a, h)| FipEntry {
                address: ip(a),
                holder: h.map(ip),
            })
            .collect(),
        node_address: node.map(ip),
    }
}

fn table(rows: &[(&str, &[&str])]) -> FipSet {
    FipSet {
        fips: rows.iter().map(|(f, _)| ip(f)).collect(),
        holders: rows
            .iter()
            .filter(|(_, h)| !h.is_empty())
            .map(|(f, h)| (ip(f), ips(h)))
            .collect(),
        problems: Vec::new(),
    }
}

const NODE: &str = "198.51.100.12";
const LOCAL: &[&str] = &["198.51.100.12", "192.0.2.12", "127.0.0.1"];

#[rstest]
// Every FIP of the file is accepted, and the node's own packets for each go to its own API server,
// whoever held it.
#[case::every_fip_delivered_here(
    file(&[("203.0.113.10", Some("198.51.100.11")), ("203.0.113.11", Some("198.51.100.12"))], Some(NODE)),
    &[],
    &["203.0.113.10", "203.0.113.11"],
    &[("203.0.113.10", NODE), ("203.0.113.11", NODE)]
)]
// --fip addresses are restored too.
#[case::static_fips_too(file(&[], Some(NODE)), &["203.0.113.5"], &["203.0.113.5"], &[("203.0.113.5", NODE)])]
// Without an address (an agent whose API server was named by a host name), accepted only.
#[case::no_address_accept_only(file(&[("203.0.113.10", None)], None), &[], &["203.0.113.10"], &[])]
// An address that is not this node's any more (renumbered): accepted only.
#[case::address_not_here(file(&[("203.0.113.10", None)], Some("198.51.100.99")), &[], &["203.0.113.10"], &[])]
// An IPv6 FIP cannot be delivered to an IPv4 address: accepted only.
#[case::other_family(
    file(&[("203.0.113.10", None), ("2001:db8::10", None)], Some(NODE)),
    &[],
    &["203.0.113.10", "2001:db8::10"],
    &[("203.0.113.10", NODE)]
)]
// A hand-edited file with a loopback "FIP" restores nothing for it.
#[case::unusable_skipped(file(&[("127.0.0.1", None), ("203.0.113.10", None)], Some(NODE)), &[], &["203.0.113.10"], &[("203.0.113.10", NODE)])]
fn what_boot_restores(
    #[case] f: NodeFile,
    #[case] fixed: &[&str],
    #[case] fips: &[&str],
    #[case] delivered: &[(&str, &str)],
) {
    let (want, marker) = boot_wanted(&f, &ips(fixed), &ips(LOCAL));
    assert_eq!(want.fips, ips(fips));
    assert_eq!(want.held, pairs(delivered));
    assert_eq!(marker.delivered, pairs(delivered));
}

const FIP: &str = "203.0.113.10";

#[rstest]
#[case::table_not_read(None, &[], Fate::Keep(Why::NotListed))]
#[case::no_holder_named(Some(table(&[(FIP, &[])])), &[], Fate::Keep(Why::NoHolder))]
#[case::holder_silent(
    Some(table(&[(FIP, &["198.51.100.11"])])),
    &[],
    Fate::Keep(Why::HolderSilent(vec![ip("198.51.100.11")]))
)]
#[case::holder_answers(
    Some(table(&[(FIP, &["198.51.100.11"])])),
    &["198.51.100.11"],
    Fate::End(Why::HolderAnswers(ip("198.51.100.11")))
)]
// The controller moved the FIP here: the holder rule delivers (no probe needed).
#[case::held_here(Some(table(&[(FIP, &[NODE])])), &[], Fate::End(Why::HeldHere(ip(NODE))))]
// Held by this node under its other address.
#[case::held_by_other_local_address(Some(table(&[(FIP, &["192.0.2.12"])])), &[], Fate::End(Why::HeldHere(ip("192.0.2.12"))))]
#[case::not_in_table(Some(table(&[("203.0.113.11", &["198.51.100.11"])])), &[], Fate::End(Why::NotInTable))]
// Another holder answering is enough.
#[case::one_of_two_holders_answers(
    Some(table(&[(FIP, &["198.51.100.11", "198.51.100.13"])])),
    &["198.51.100.13"],
    Fate::End(Why::HolderAnswers(ip("198.51.100.13")))
)]
fn when_a_boot_delivery_ends(#[case] t: Option<FipSet>, #[case] up: &[&str], #[case] want: Fate) {
    let up = ips(up);
    let fates = resolve(&pairs(&[(FIP, NODE)]), t.as_ref(), &ips(LOCAL), |h| {
        up.contains(&h)
    });
    assert_eq!(fates, BTreeMap::from([(ip(FIP), want)]));
}

#[test]
fn a_delivery_to_an_address_gone_ends_whatever_the_table() {
    let fates = resolve(&pairs(&[(FIP, "198.51.100.99")]), None, &ips(LOCAL), |_| false);
    assert_eq!(fates[&ip(FIP)], Fate::End(Why::AddressGone(ip("198.51.100.99"))));
}

#[rstest]
// A standing delivery adds an output rule for a wanted FIP this node does not hold.
#[case::adds(&[FIP], &[], &[(FIP, NODE)], &[(FIP, NODE)])]
// The holder rule wins over a boot delivery.
#[case::holder_rule_wins(&[FIP], &[(FIP, "192.0.2.12")], &[(FIP, NODE)], &[(FIP, "192.0.2.12")])]
// A FIP no longer wanted is not delivered.
#[case::not_wanted(&[], &[], &[(FIP, NODE)], &[])]
// An address that is not this node's any more is not used.
#[case::address_gone(&[FIP], &[], &[(FIP, "198.51.100.99")], &[])]
fn boot_deliveries_on_top_of_the_table(
    #[case] fips: &[&str],
    #[case] held: &[(&str, &str)],
    #[case] delivered: &[(&str, &str)],
    #[case] want: &[(&str, &str)],
) {
    let base = Wanted {
        fips: ips(fips),
        held: pairs(held),
    };
    let got = with_boot(base, &pairs(delivered), &ips(LOCAL));
    assert_eq!(got.fips, ips(fips));
    assert_eq!(got.held, pairs(want));
}

#[test]
fn reasons_read_as_sentences() {
    assert_eq!(
        Why::HolderSilent(vec![ip("198.51.100.11")]).to_string(),
        "its holder 198.51.100.11 does not answer /readyz"
    );
    assert_eq!(
        Why::HeldHere(ip(NODE)).to_string(),
        "this node (198.51.100.12) holds it"
    );
}
