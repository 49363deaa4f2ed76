use std::time::Duration;

use http::HeaderValue;
use url::Url;

use super::*;

#[test]
fn base_url_keeps_prefix_and_drops_v1() {
    for (input, want) in [
        ("https://api.cherryservers.com", "https://api.cherryservers.com/"),
        (
            "https://api.cherryservers.com/v1/",
            "https://api.cherryservers.com/",
        ),
        ("http://127.0.0.1:8080/v1", "http://127.0.0.1:8080/"),
        ("http://proxy/cherry/", "http://proxy/cherry/"),
    ] {
        assert_eq!(
            normalize_base(Url::parse(input).unwrap()).unwrap().as_str(),
            want,
            "{input}"
        );
    }
    assert!(normalize_base(Url::parse("ftp://x/").unwrap()).is_err());
}

#[test]
fn urls_encode_segments() {
    let mut cfg = ClientConfig::new(Secret::new("k"), 1);
    cfg.base_url = Url::parse("http://h/p/v1").unwrap();
    let c = CherryClient::new(cfg).unwrap();
    assert_eq!(c.url(&["ips", "a/b?c"]).as_str(), "http://h/p/v1/ips/a%2Fb%3Fc");
    assert_eq!(
        c.url(&["projects", "1", "ips"]).as_str(),
        "http://h/p/v1/projects/1/ips"
    );
}

#[test]
fn retry_after_forms() {
    assert_eq!(
        parse_retry_after(&HeaderValue::from_static("3")),
        Some(Duration::from_secs(3))
    );
    assert_eq!(
        parse_retry_after(&HeaderValue::from_static("0.5")),
        Some(Duration::from_millis(500))
    );
    assert_eq!(
        parse_retry_after(&HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT")),
        Some(Duration::ZERO),
        "a date in the past means now"
    );
    assert_eq!(parse_retry_after(&HeaderValue::from_static("soon")), None);
}

#[test]
fn backoff_grows_with_jitter_and_cap() {
    let mut cfg = ClientConfig::new(Secret::new("k"), 1);
    cfg.backoff_base = Duration::from_secs(1);
    cfg.backoff_cap = Duration::from_secs(30);
    let c = CherryClient::new(cfg).unwrap();
    for attempt in 0..10 {
        let full = Duration::from_secs(1u64 << attempt).min(Duration::from_secs(30));
        let d = c.backoff(attempt);
        assert!(d >= full / 2 && d < full, "attempt {attempt}: {d:?}");
    }
}

#[test]
fn config_is_validated_and_debug_hides_the_key() {
    assert!(CherryClient::new(ClientConfig::new(Secret::new(""), 1)).is_err());
    let mut cfg = ClientConfig::new(Secret::new("k"), 1);
    cfg.requests_per_second = Some(0.0);
    assert!(CherryClient::new(cfg).is_err());
    let mut cfg = ClientConfig::new(Secret::new("super-secret-key-123"), 1);
    cfg.extra_ca_pem = Some(b"not a pem".to_vec());
    let err = CherryClient::new(cfg.clone()).unwrap_err();
    assert!(!format!("{err} {err:?}").contains("super-secret-key-123"));
    cfg.extra_ca_pem = None;
    assert!(!format!("{cfg:?}").contains("super-secret-key-123"));
    let c = CherryClient::new(cfg).unwrap();
    assert!(!format!("{c:?}").contains("super-secret-key-123"));
}
