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

/// A kernel holding baton's tables with these FIPs (our chain in each family that has one).
fn kernel(list: &str) -> Observed {
    let mut out = Observed::new();
    for ip in ips(list) {
        out.entry(Family::of(ip))
            .or_insert_with(|| TableState {
                chain: Chain::Ours,
                ..TableState::default()
            })
            .fips
            .insert(ip, 0);
    }
    out
}

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
fn wanted_fips(#[case] fixed: &str, #[case] services: Option<&str>, #[case] held: &str, #[case] want: &str) {
    let services = services.map(ips);
    assert_eq!(wanted(&ips(fixed), services.as_ref(), &ips(held)), ips(want));
}

#[rstest]
#[case::nothing_wanted_nothing_there("", kernel(""))]
#[case::exactly_there("203.0.113.5,203.0.113.6", kernel("203.0.113.5,203.0.113.6"))]
#[case::both_families("203.0.113.5,2001:db8::5", kernel("203.0.113.5,2001:db8::5"))]
fn in_sync(#[case] want: &str, #[case] observed: Observed) {
    assert_eq!(plan(&ips(want), &observed), Plan::InSync);
}

#[rstest]
#[case::flushed_away("203.0.113.5", Observed::new(), &[Family::V4], "203.0.113.5", "", "table ip baton is missing")]
#[case::a_new_fip("203.0.113.5,203.0.113.6", kernel("203.0.113.5"), &[Family::V4], "203.0.113.6", "", "table ip baton lacks [203.0.113.6] and has [] too many")]
#[case::a_gone_fip("203.0.113.5", kernel("203.0.113.5,203.0.113.6"), &[Family::V4], "", "203.0.113.6", "table ip baton lacks [] and has [203.0.113.6] too many")]
#[case::last_fip_gone("", kernel("203.0.113.5"), &[Family::V4], "", "203.0.113.5", "table ip baton exists but no ip FIP is wanted")]
#[case::only_v6_changes("203.0.113.5,2001:db8::6", kernel("203.0.113.5,2001:db8::5"), &[Family::V6], "2001:db8::6", "2001:db8::5", "table ip6 baton lacks [2001:db8::6] and has [2001:db8::5] too many")]
#[case::v6_appears("203.0.113.5,2001:db8::6", kernel("203.0.113.5"), &[Family::V6], "2001:db8::6", "", "table ip6 baton is missing")]
fn replace(
    #[case] want: &str,
    #[case] observed: Observed,
    #[case] families: &[Family],
    #[case] added: &str,
    #[case] removed: &str,
    #[case] reason: &str,
) {
    assert_eq!(
        plan(&ips(want), &observed),
        Plan::Replace {
            families: families.to_vec(),
            added: ips(added),
            removed: ips(removed),
            reasons: vec![reason.to_owned()],
        }
    );
}

#[test]
fn a_table_someone_changed_is_replaced() {
    let want = ips("203.0.113.5");
    // Our FIP is there, but so is a rule of someone else.
    let mut observed = kernel("203.0.113.5");
    observed.get_mut(&Family::V4).unwrap().other = vec!["a rule of expressions [immediate]".into()];
    let Plan::Replace {
        families,
        added,
        removed,
        reasons,
    } = plan(&want, &observed)
    else {
        panic!("in sync")
    };
    assert_eq!(families, vec![Family::V4]);
    assert!(added.is_empty() && removed.is_empty());
    assert!(reasons[0].contains("rules of others"), "{reasons:?}");

    // The chain is there but hooked elsewhere: its rules do not count as accepted.
    let mut observed = kernel("203.0.113.5");
    observed.get_mut(&Family::V4).unwrap().chain = Chain::Different("type filter".into());
    let Plan::Replace { added, reasons, .. } = plan(&want, &observed) else {
        panic!("in sync")
    };
    assert_eq!(added, want);
    assert!(reasons[0].contains("type filter"), "{reasons:?}");

    // An empty table (its chain deleted).
    let observed: Observed = BTreeMap::from([(Family::V4, TableState::default())]);
    assert!(matches!(plan(&want, &observed), Plan::Replace { .. }));
}
