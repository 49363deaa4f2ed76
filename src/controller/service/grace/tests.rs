//! The grace period's rules, with paused time.

use std::collections::BTreeMap;
use std::time::Duration;

use baton_core::LoadBalancerMode;
use rstest::rstest;
use tokio::time::Instant;

use super::*;
use crate::controller::service::{FIP_ADDRESS_ANNOTATION, FIP_ID_ANNOTATION, METALLB_IPS_ANNOTATION};

const TEN_MIN: Duration = Duration::from_secs(600);
const MIRROR: (&str, &str) = ("kube-system", "baton-kubernetes-external");

fn annotations(items: &[(&str, &str)]) -> BTreeMap<String, String> {
    items
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[rstest]
#[case::unset(&[], Ok(TEN_MIN))]
#[case::zero(&[(GRACE_ANNOTATION, "0")], Ok(Duration::ZERO))]
#[case::zero_seconds(&[(GRACE_ANNOTATION, " 0s ")], Ok(Duration::ZERO))]
#[case::longer(&[(GRACE_ANNOTATION, "1h")], Ok(Duration::from_secs(3600)))]
#[case::typo(&[(GRACE_ANNOTATION, "5 minutes")], Err("\"5 minutes\""))]
#[case::empty(&[(GRACE_ANNOTATION, "")], Err("\"\""))]
fn the_services_annotation_wins_and_a_typo_is_an_error_naming_it(
    #[case] items: &[(&str, &str)],
    #[case] want: Result<Duration, &str>,
) {
    match (grace_for(&annotations(items), TEN_MIN), want) {
        (Ok(got), Ok(want)) => assert_eq!(got, want),
        (Err(e), Err(needle)) => {
            let text = e.to_string();
            assert!(text.contains(GRACE_ANNOTATION) && text.contains(needle), "{text}");
        }
        (got, want) => panic!("got {got:?}, want {want:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_fip_is_released_only_once_unwanted_for_the_whole_grace_period() {
    let mut holds = Holds::default();
    let start = Instant::now();
    assert_eq!(
        holds.unwanted("fip-a", start, TEN_MIN),
        Verdict::Keep {
            until: start + TEN_MIN
        }
    );
    assert_eq!(holds.next_due(), Some(start + TEN_MIN));
    tokio::time::advance(Duration::from_secs(599)).await;
    // Seen unwanted again: the hold keeps its start.
    assert_eq!(
        holds.unwanted("fip-a", Instant::now(), TEN_MIN),
        Verdict::Keep {
            until: start + TEN_MIN
        }
    );
    assert!(holds.due(Instant::now()).is_empty());
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(holds.due(Instant::now()), vec!["fip-a".to_owned()]);
    assert_eq!(holds.unwanted("fip-a", Instant::now(), TEN_MIN), Verdict::Release);
}

#[tokio::test(start_paused = true)]
async fn a_service_back_within_the_grace_period_ends_the_hold_and_a_later_loss_starts_afresh() {
    let mut holds = Holds::default();
    holds.unwanted("fip-a", Instant::now(), TEN_MIN);
    tokio::time::advance(Duration::from_secs(300)).await;
    assert!(holds.wanted("fip-a"), "re-created: wanted again");
    assert!(!holds.is_held("fip-a"));
    assert_eq!(holds.next_due(), None);
    tokio::time::advance(Duration::from_secs(400)).await;
    let again = Instant::now();
    assert_eq!(
        holds.unwanted("fip-a", again, TEN_MIN),
        Verdict::Keep {
            until: again + TEN_MIN
        },
        "the earlier loss does not count"
    );
    assert!(!holds.wanted("fip-b"), "never held");
}

#[tokio::test(start_paused = true)]
async fn zero_releases_at_once_also_when_set_after_the_hold_started() {
    let mut holds = Holds::default();
    assert_eq!(
        holds.unwanted("now", Instant::now(), Duration::ZERO),
        Verdict::Release
    );
    holds.unwanted("later", Instant::now(), TEN_MIN);
    tokio::time::advance(Duration::from_secs(5)).await;
    // The Service annotated baton.dev/fip-release-grace-period: 0 afterwards.
    assert_eq!(
        holds.unwanted("later", Instant::now(), Duration::ZERO),
        Verdict::Release
    );
}

#[tokio::test(start_paused = true)]
async fn due_and_next_due_cover_every_hold() {
    let mut holds = Holds::default();
    let t0 = Instant::now();
    holds.unwanted("b", t0, Duration::from_secs(20));
    holds.unwanted("a", t0, Duration::from_secs(10));
    holds.unwanted("c", t0, Duration::from_secs(30));
    assert_eq!(holds.len(), 3);
    assert_eq!(holds.next_due(), Some(t0 + Duration::from_secs(10)));
    assert_eq!(holds.due(t0 + Duration::from_secs(25)), vec!["a", "b"]);
    holds.wanted("a");
    holds.wanted("b");
    holds.wanted("c");
    assert!(holds.is_empty());
}

fn metallb() -> LoadBalancerMode {
    "metallb:///".parse().unwrap()
}

fn svc(annotations_: &[(&str, &str)]) -> ServiceFacts {
    ServiceFacts {
        namespace: "apps".into(),
        name: "web".into(),
        type_: Some("LoadBalancer".into()),
        annotations: annotations(annotations_),
        ..ServiceFacts::default()
    }
}

const FIP: &str = "203.0.113.7";

#[rstest]
#[case::gone(None, true)]
#[case::shows_its_fip(Some(svc(&[(METALLB_IPS_ANNOTATION, FIP)])), false)]
#[case::asks_nothing(Some(svc(&[])), false)]
#[case::asks_another(Some(svc(&[(METALLB_IPS_ANNOTATION, "203.0.113.9")])), true)]
#[case::garbled(Some(svc(&[(METALLB_IPS_ANNOTATION, "203.0.113.7x")])), false)]
#[case::asks_its_recorded_address(
    Some(svc(&[(METALLB_IPS_ANNOTATION, "203.0.113.5"), (FIP_ID_ANNOTATION, "old"), (FIP_ADDRESS_ANNOTATION, "203.0.113.5")])),
    false
)]
#[case::cluster_ip(Some(ServiceFacts { type_: Some("ClusterIP".into()), ..svc(&[]) }), true)]
#[case::opted_out(Some(svc(&[("cherryservers.com/loadbalancer-managed", "false")])), true)]
#[case::deleting(Some(ServiceFacts { deleting: true, ..svc(&[]) }), true)]
fn what_still_wants_a_held_fip(#[case] svc: Option<ServiceFacts>, #[case] unwanted: bool) {
    assert_eq!(
        still_unwanted(svc.as_ref(), FIP.parse().unwrap(), Some(&metallb()), MIRROR),
        unwanted
    );
}

#[test]
fn without_a_load_balancer_live_services_keep_their_fips_and_gone_ones_do_not() {
    let ip = FIP.parse().unwrap();
    let turned = ServiceFacts {
        type_: Some("ClusterIP".into()),
        ..svc(&[])
    };
    assert!(!still_unwanted(Some(&turned), ip, None, MIRROR));
    assert!(still_unwanted(None, ip, None, MIRROR));
}

/// A delete on its way (waiting in the rate limit, say) is not due for the release loop: it would
/// send a second delete of the same FIP. A failed one is due again.
#[test]
fn a_fip_whose_delete_is_on_its_way_is_not_due_again() {
    let mut holds = Holds::default();
    let now = Instant::now();
    assert_eq!(holds.unwanted("a", now, Duration::ZERO), Verdict::Release);
    assert_eq!(holds.unwanted("b", now, Duration::ZERO), Verdict::Release);
    holds.releasing("a");
    assert_eq!(holds.due(now), ["b"]);
    assert!(!holds.is_due("a", now) && holds.is_due("b", now));
    holds.release_failed("a");
    assert!(holds.is_due("a", now));
    holds.releasing("a");
    assert!(holds.wanted("a"));
    assert!(!holds.is_held("a") && !holds.is_due("a", now));
}
