use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use rstest::rstest;

use super::*;

fn ips(list: &str) -> BTreeSet<IpAddr> {
    list.split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.trim().parse().unwrap())
        .collect()
}

/// `fip>to,fip>to`.
fn pairs(list: &str) -> BTreeMap<IpAddr, IpAddr> {
    list.split(',')
        .filter(|s| !s.is_empty())
        .map(|p| {
            let (fip, to) = p.split_once('>').unwrap();
            (fip.trim().parse().unwrap(), to.trim().parse().unwrap())
        })
        .collect()
}

fn want(fips: &str, held: &str) -> Wanted {
    Wanted {
        fips: ips(fips),
        held: pairs(held),
    }
}

/// A kernel holding baton's tables with these FIPs and output rules (both chains ours in each
/// family that has a FIP).
fn kernel_with(list: &str, held: &str) -> Observed {
    let mut out = Observed::new();
    for ip in ips(list) {
        out.entry(Family::of(ip))
            .or_insert_with(|| TableState {
                prerouting: Chain::Ours,
                output: Chain::Ours,
                ..TableState::default()
            })
            .fips
            .insert(ip, 0);
    }
    for (fip, to) in pairs(held) {
        out.get_mut(&Family::of(fip))
            .unwrap()
            .local
            .insert(fip, Local { to, connections: 0 });
    }
    out
}

fn kernel(list: &str) -> Observed {
    kernel_with(list, "")
}

/// A FIP table naming FIPs and holders (`fip>holder`).
fn services(fips: &str, holders: &str) -> FipSet {
    let mut set = FipSet {
        fips: ips(fips),
        ..FipSet::default()
    };
    for (fip, to) in pairs(holders) {
        set.holders.entry(fip).or_default().insert(to);
    }
    set
}

const HERE: &str = "127.0.0.1,198.51.100.11,192.0.2.11,2001:db8::11";

#[rstest]
#[case::static_only("203.0.113.1", None, "", "203.0.113.1")]
#[case::before_listing_keeps_what_was_there(
    "203.0.113.1",
    None,
    "203.0.113.5,203.0.113.6",
    "203.0.113.1,203.0.113.5,203.0.113.6"
)]
#[case::after_listing_services_replace_it(
    "203.0.113.1",
    Some("203.0.113.7"),
    "203.0.113.5",
    "203.0.113.1,203.0.113.7"
)]
#[case::listed_and_empty("", Some(""), "203.0.113.5", "")]
#[case::overlap("203.0.113.1", Some("203.0.113.1,2001:db8::1"), "", "203.0.113.1,2001:db8::1")]
fn wanted_fips(#[case] fixed: &str, #[case] listed: Option<&str>, #[case] held: &str, #[case] expect: &str) {
    let listed = listed.map(|l| services(l, ""));
    let at_start = want(held, "");
    let source = listed
        .as_ref()
        .map_or(Source::HeldAtStart(&at_start), Source::Table);
    assert_eq!(wanted(&ips(fixed), &source, &ips(HERE)), want(expect, ""));
}

#[rstest]
#[case::the_holder_is_this_node("203.0.113.5", "203.0.113.5>198.51.100.11", "203.0.113.5>198.51.100.11")]
#[case::by_its_private_address("203.0.113.5", "203.0.113.5>192.0.2.11", "203.0.113.5>192.0.2.11")]
#[case::another_node_holds_it("203.0.113.5", "203.0.113.5>198.51.100.12", "")]
#[case::nobody_named("203.0.113.5", "", "")]
#[case::two_fips_one_held(
    "203.0.113.5,203.0.113.6",
    "203.0.113.5>198.51.100.12,203.0.113.6>198.51.100.11",
    "203.0.113.6>198.51.100.11"
)]
#[case::ipv6(
    "203.0.113.5,2001:db8::5",
    "203.0.113.5>198.51.100.11,2001:db8::5>2001:db8::11",
    "203.0.113.5>198.51.100.11,2001:db8::5>2001:db8::11"
)]
#[case::an_address_of_the_other_family_is_no_target("2001:db8::5", "2001:db8::5>198.51.100.11", "")]
#[case::a_holder_for_a_fip_not_accepted("203.0.113.5", "203.0.113.9>198.51.100.11", "")]
fn which_fips_are_held_here(#[case] fips: &str, #[case] holders: &str, #[case] expect: &str) {
    let set = services(fips, holders);
    assert_eq!(held_here(&set.fips, &set.holders, &ips(HERE)), pairs(expect));
}

#[test]
fn two_holders_of_one_fip_deliver_locally_if_either_names_this_node() {
    // A FIP with two holders (two rows of the table for one FIP): both nodes deliver their own
    // packets locally.
    let mut set = services("203.0.113.5", "203.0.113.5>198.51.100.12");
    set.holders
        .entry("203.0.113.5".parse().unwrap())
        .or_default()
        .insert("198.51.100.11".parse().unwrap());
    assert_eq!(
        held_here(&set.fips, &set.holders, &ips(HERE)),
        pairs("203.0.113.5>198.51.100.11")
    );
}

#[test]
fn a_static_fip_is_held_only_when_a_service_of_it_names_this_node() {
    // --fip alone: nobody says who holds it.
    let none = services("", "");
    let w = wanted(&ips("203.0.113.1"), &Source::Table(&none), &ips(HERE));
    assert_eq!(w, want("203.0.113.1", ""));
    // A Service of the same FIP names this node.
    let named = services("203.0.113.1", "203.0.113.1>198.51.100.11");
    let w = wanted(&ips("203.0.113.1"), &Source::Table(&named), &ips(HERE));
    assert_eq!(w, want("203.0.113.1", "203.0.113.1>198.51.100.11"));
}

#[rstest]
#[case::kept_while_the_address_is_still_here(HERE, "203.0.113.5>198.51.100.11")]
#[case::dropped_when_the_address_is_gone("127.0.0.1,198.51.100.12", "")]
fn before_listing_the_held_fips_stay_while_their_address_is_local(#[case] local: &str, #[case] expect: &str) {
    let at_start = want("203.0.113.5", "203.0.113.5>198.51.100.11");
    let w = wanted(&BTreeSet::new(), &Source::HeldAtStart(&at_start), &ips(local));
    assert_eq!(w, want("203.0.113.5", expect));
}

#[test]
fn once_listed_the_services_say_who_holds_it_not_the_kernel() {
    let at_start = want("203.0.113.5", "203.0.113.5>198.51.100.11");
    let moved = services("203.0.113.5", "203.0.113.5>198.51.100.12");
    assert_eq!(
        wanted(&BTreeSet::new(), &Source::Table(&moved), &ips(HERE)),
        want("203.0.113.5", "")
    );
    assert_eq!(
        wanted(&BTreeSet::new(), &Source::HeldAtStart(&at_start), &ips(HERE)),
        want("203.0.113.5", "203.0.113.5>198.51.100.11")
    );
}

#[rstest]
#[case::nothing_wanted_nothing_there(want("", ""), kernel(""))]
#[case::exactly_there(want("203.0.113.5,203.0.113.6", ""), kernel("203.0.113.5,203.0.113.6"))]
#[case::both_families(want("203.0.113.5,2001:db8::5", ""), kernel("203.0.113.5,2001:db8::5"))]
#[case::held(
    want(
        "203.0.113.5,2001:db8::5",
        "203.0.113.5>198.51.100.11,2001:db8::5>2001:db8::11"
    ),
    kernel_with(
        "203.0.113.5,2001:db8::5",
        "203.0.113.5>198.51.100.11,2001:db8::5>2001:db8::11"
    )
)]
fn in_sync(#[case] want: Wanted, #[case] observed: Observed) {
    assert_eq!(plan(&want, &observed), Plan::InSync);
}

#[rstest]
#[case::flushed_away("203.0.113.5", Observed::new(), &[Family::V4], "203.0.113.5", "", "table ip baton is missing")]
#[case::a_new_fip("203.0.113.5,203.0.113.6", kernel("203.0.113.5"), &[Family::V4], "203.0.113.6", "", "table ip baton lacks [203.0.113.6] and has [] too many")]
#[case::a_gone_fip("203.0.113.5", kernel("203.0.113.5,203.0.113.6"), &[Family::V4], "", "203.0.113.6", "table ip baton lacks [] and has [203.0.113.6] too many")]
#[case::last_fip_gone("", kernel("203.0.113.5"), &[Family::V4], "", "203.0.113.5", "table ip baton exists but no ip FIP is wanted")]
#[case::only_v6_changes("203.0.113.5,2001:db8::6", kernel("203.0.113.5,2001:db8::5"), &[Family::V6], "2001:db8::6", "2001:db8::5", "table ip6 baton lacks [2001:db8::6] and has [2001:db8::5] too many")]
#[case::v6_appears("203.0.113.5,2001:db8::6", kernel("203.0.113.5"), &[Family::V6], "2001:db8::6", "", "table ip6 baton is missing")]
fn replace(
    #[case] fips: &str,
    #[case] observed: Observed,
    #[case] families: &[Family],
    #[case] added: &str,
    #[case] removed: &str,
    #[case] reason: &str,
) {
    assert_eq!(
        plan(&want(fips, ""), &observed),
        Plan::Replace {
            families: families.to_vec(),
            added: ips(added),
            removed: ips(removed),
            now_held: BTreeSet::new(),
            no_longer_held: BTreeSet::new(),
            reasons: vec![reason.to_owned()],
        }
    );
}

#[rstest]
#[case::becomes_the_holder(
    "203.0.113.5>198.51.100.11",
    "",
    "203.0.113.5",
    "",
    "table ip baton's chain output lacks [203.0.113.5 → 198.51.100.11] and has [] too many"
)]
#[case::no_longer_the_holder(
    "",
    "203.0.113.5>198.51.100.11",
    "",
    "203.0.113.5",
    "table ip baton's chain output lacks [] and has [203.0.113.5 → 198.51.100.11] too many"
)]
#[case::another_of_its_addresses(
    "203.0.113.5>192.0.2.11",
    "203.0.113.5>198.51.100.11",
    "203.0.113.5",
    "",
    "table ip baton's chain output lacks [203.0.113.5 → 192.0.2.11] and has [203.0.113.5 → 198.51.100.11] too many"
)]
fn the_output_chain_follows_the_holder(
    #[case] held: &str,
    #[case] there: &str,
    #[case] now_held: &str,
    #[case] no_longer_held: &str,
    #[case] reason: &str,
) {
    assert_eq!(
        plan(&want("203.0.113.5", held), &kernel_with("203.0.113.5", there)),
        Plan::Replace {
            families: vec![Family::V4],
            added: BTreeSet::new(),
            removed: BTreeSet::new(),
            now_held: ips(now_held),
            no_longer_held: ips(no_longer_held),
            reasons: vec![reason.to_owned()],
        }
    );
}

#[test]
fn a_table_someone_changed_is_replaced() {
    let want = want("203.0.113.5", "203.0.113.5>198.51.100.11");
    // Our FIP is there, but so is a rule of someone else.
    let mut observed = kernel_with("203.0.113.5", "203.0.113.5>198.51.100.11");
    observed.get_mut(&Family::V4).unwrap().other = vec!["output: a rule of expressions [immediate]".into()];
    let Plan::Replace {
        families,
        added,
        removed,
        reasons,
        ..
    } = plan(&want, &observed)
    else {
        panic!("in sync")
    };
    assert_eq!(families, vec![Family::V4]);
    assert!(added.is_empty() && removed.is_empty());
    assert!(reasons[0].contains("rules of others"), "{reasons:?}");

    // The chain is there but hooked elsewhere: its rules do not count as accepted.
    let mut observed = kernel_with("203.0.113.5", "203.0.113.5>198.51.100.11");
    observed.get_mut(&Family::V4).unwrap().prerouting = Chain::Different("type filter".into());
    let Plan::Replace { added, reasons, .. } = plan(&want, &observed) else {
        panic!("in sync")
    };
    assert_eq!(added, want.fips);
    assert!(reasons[0].contains("prerouting is type filter"), "{reasons:?}");

    // The output chain flushed away (`nft delete chain ip baton output`): put back, with its
    // rule.
    let mut observed = kernel_with("203.0.113.5", "203.0.113.5>198.51.100.11");
    let table = observed.get_mut(&Family::V4).unwrap();
    table.output = Chain::Absent;
    table.local.clear();
    let Plan::Replace {
        now_held, reasons, ..
    } = plan(&want, &observed)
    else {
        panic!("in sync")
    };
    assert_eq!(reasons, vec!["table ip baton has no chain output".to_owned()]);
    assert_eq!(now_held, ips("203.0.113.5"));

    // The output chain emptied (`nft flush chain ip baton output`).
    let observed = kernel("203.0.113.5");
    assert!(matches!(plan(&want, &observed), Plan::Replace { .. }));

    // An empty table (its chains deleted).
    let observed: Observed = BTreeMap::from([(Family::V4, TableState::default())]);
    assert!(matches!(plan(&want, &observed), Plan::Replace { .. }));
}

#[test]
fn what_the_kernel_accepts_counts_only_rules_in_chains_of_ours() {
    let mut observed = kernel_with("203.0.113.5", "203.0.113.5>198.51.100.11");
    assert_eq!(
        accepted(&observed),
        want("203.0.113.5", "203.0.113.5>198.51.100.11")
    );
    observed.get_mut(&Family::V4).unwrap().output = Chain::Different("type filter".into());
    assert_eq!(accepted(&observed), want("203.0.113.5", ""));
}

#[test]
fn pairs_read_fip_to_address() {
    assert_eq!(
        Pairs(&pairs("203.0.113.5>198.51.100.11")).to_string(),
        "203.0.113.5 → 198.51.100.11"
    );
    assert_eq!(Pairs(&BTreeMap::new()).to_string(), "-");
}
