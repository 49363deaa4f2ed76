use rstest::rstest;

use super::{DnsName, NameError};

fn n(s: &str) -> DnsName {
    s.parse().unwrap()
}

#[rstest]
#[case("api.c1.example.com", "api.c1.example.com.")]
#[case("API.C1.Example.com.", "api.c1.example.com.")]
#[case("_dns.c1.example.com", "_dns.c1.example.com.")]
fn parses_and_normalises(#[case] input: &str, #[case] fqdn: &str) {
    assert_eq!(n(input).fqdn(), fqdn);
}

#[rstest]
#[case("")]
#[case(".")]
#[case("a..b")]
#[case("a b.example")]
#[case("a/b.example")]
fn rejects(#[case] input: &str) {
    assert!(input.parse::<DnsName>().is_err(), "{input:?} should be rejected");
}

#[test]
fn rejects_long_labels_and_names() {
    let label = "a".repeat(64);
    assert!(matches!(
        label.parse::<DnsName>(),
        Err(NameError::LabelTooLong(_))
    ));
    let long = ["abcdefghi"; 30].join(".");
    assert!(matches!(long.parse::<DnsName>(), Err(NameError::TooLong(_))));
}

#[rstest]
#[case("api", "api.c1.example.com.")]
#[case("@", "c1.example.com.")]
#[case("api-int.c1.example.com.", "api-int.c1.example.com.")]
#[case("x.y", "x.y.c1.example.com.")]
fn relative_to_zone(#[case] input: &str, #[case] fqdn: &str) {
    assert_eq!(
        DnsName::relative_to(input, &n("c1.example.com")).unwrap().fqdn(),
        fqdn
    );
}

#[test]
fn relative_to_rejects_names_outside_the_zone() {
    let err = DnsName::relative_to("www.example.org.", &n("c1.example.com")).unwrap_err();
    assert!(matches!(err, NameError::OutsideZone { .. }), "{err}");
    // A suffix match that is not a label boundary is outside too.
    assert!(!n("xc1.example.com").is_within(&n("c1.example.com")));
    assert!(n("a.c1.example.com").is_within(&n("c1.example.com")));
    assert!(n("c1.example.com").is_within(&n("c1.example.com")));
}
