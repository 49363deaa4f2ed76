#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use rstest::rstest;

use super::*;

#[rstest]
#[case::get(Method::GET, false)]
#[case::head(Method::HEAD, false)]
#[case::options(Method::OPTIONS, false)]
#[case::post(Method::POST, true)]
#[case::put(Method::PUT, true)]
#[case::patch(Method::PATCH, true)]
#[case::delete(Method::DELETE, true)]
fn writes_are_the_methods_that_change_state(#[case] method: Method, #[case] write: bool) {
    assert_eq!(is_write(&method), write);
}

#[test]
fn the_upstream_uri_keeps_path_and_query() {
    let uri: Uri =
        "https://198.51.100.11:40000/api/v1/namespaces/default/configmaps?watch=1&resourceVersion=5"
            .parse()
            .unwrap();
    assert_eq!(
        upstream_uri("https://198.51.100.11:6443", &uri).unwrap(),
        "https://198.51.100.11:6443/api/v1/namespaces/default/configmaps?watch=1&resourceVersion=5"
    );
    // An HTTP/1.1 request carries only the origin form.
    let uri: Uri = "/readyz".parse().unwrap();
    assert_eq!(
        upstream_uri("https://198.51.100.11:6443", &uri).unwrap(),
        "https://198.51.100.11:6443/readyz"
    );
}

#[test]
fn hop_by_hop_headers_go_and_the_rest_passes() {
    let mut h = hyper::HeaderMap::new();
    for (k, v) in [
        ("authorization", "Bearer secret-token"),
        ("content-type", "application/json"),
        ("user-agent", "controller/cp-0"),
        ("connection", "keep-alive, x-private"),
        ("x-private", "1"),
        ("keep-alive", "timeout=5"),
        ("transfer-encoding", "chunked"),
        ("host", "198.51.100.11:40000"),
        ("upgrade", "h2c"),
    ] {
        h.append(k, v.parse().unwrap());
    }
    strip_hop_by_hop(&mut h);
    let mut left: Vec<&str> = h.keys().map(hyper::header::HeaderName::as_str).collect();
    left.sort_unstable();
    assert_eq!(left, ["authorization", "content-type", "user-agent"]);
    assert_eq!(h["authorization"], "Bearer secret-token");
}

#[test]
fn profiles() {
    assert_eq!(Profile::fixed(Duration::ZERO), Profile::OFF);
    assert!(Profile::OFF.latency().is_none());
    let p = Profile::writes(Duration::from_millis(150), Duration::from_millis(600))
        .unwrap()
        .with_seed(9);
    let lat = p.latency().unwrap();
    assert_eq!(lat.quantile(0.5).as_millis(), 150);
    assert_eq!(p.with_seed(9), p);
    assert_ne!(p.with_seed(10), p);
    assert!(Profile::writes(Duration::from_millis(600), Duration::from_millis(150)).is_err());
    let fixed = Profile::fixed(Duration::from_millis(800)).latency().unwrap();
    assert_eq!(fixed.quantile(0.99).as_millis(), 800);
}
