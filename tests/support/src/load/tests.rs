#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use rstest::rstest;

use super::*;

#[test]
fn metrics_are_summed_per_priority_level() {
    let text = r#"# HELP apiserver_flowcontrol_current_inqueue_requests [BETA] Number of requests currently pending in queues of the API Priority and Fairness subsystem
# TYPE apiserver_flowcontrol_current_inqueue_requests gauge
apiserver_flowcontrol_current_inqueue_requests{flow_schema="service-accounts",priority_level="workload-low"} 12
apiserver_flowcontrol_current_inqueue_requests{flow_schema="global-default",priority_level="global-default"} 0
apiserver_flowcontrol_current_inqueue_requests{flow_schema="other",priority_level="workload-low"} 3
apiserver_flowcontrol_current_inqueue_requests_total{flow_schema="x",priority_level="workload-low"} 100
apiserver_flowcontrol_current_inqueue_seats{flow_schema="service-accounts",priority_level="workload-low"} 40
"#;
    let got = sum_by_priority_level(text, "apiserver_flowcontrol_current_inqueue_requests");
    assert_eq!(got.len(), 2, "{got:?}");
    assert!((got["workload-low"] - 15.0).abs() < f64::EPSILON);
    assert!(got["global-default"].abs() < f64::EPSILON);
}

#[rstest]
#[case::median(0.5, 50)]
#[case::p99(0.99, 99)]
#[case::max(1.0, 100)]
#[case::min(0.0, 1)]
fn quantiles_by_nearest_rank(#[case] q: f64, #[case] want_ms: u64) {
    let samples: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
    assert_eq!(quantile(&samples, q), Duration::from_millis(want_ms));
    assert_eq!(quantile(&[], q), Duration::ZERO);
}

#[test]
fn load_users_look_like_service_accounts() {
    assert_eq!(workload_users().len(), USERS);
    let u = &workload_users()[3];
    assert_eq!(u.name, "system:serviceaccount:baton-load:workload-3");
    assert_eq!(
        u.groups,
        ["system:serviceaccounts", "system:serviceaccounts:baton-load"]
    );
    let k = &kube_system_users()[0];
    assert_eq!(k.name, "system:serviceaccount:kube-system:load-0");
    assert!(
        k.groups
            .contains(&"system:serviceaccounts:kube-system".to_owned())
    );
    // Every token is distinct (one user each in the token file).
    let tokens: std::collections::BTreeSet<&str> = all_users().map(|u| u.token.as_str()).collect();
    assert_eq!(tokens.len(), 2 * USERS);
}
