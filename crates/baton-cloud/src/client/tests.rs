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
    let c = CloudClient::new(cfg).unwrap();
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
    let c = CloudClient::new(cfg).unwrap();
    for attempt in 0..10 {
        let full = Duration::from_secs(1u64 << attempt).min(Duration::from_secs(30));
        let d = c.backoff(attempt);
        assert!(d >= full / 2 && d < full, "attempt {attempt}: {d:?}");
    }
}

#[test]
fn config_is_validated_and_debug_hides_the_key() {
    assert!(CloudClient::new(ClientConfig::new(Secret::new(""), 1)).is_err());
    let mut cfg = ClientConfig::new(Secret::new("k"), 1);
    cfg.requests_per_second = Some(0.0);
    assert!(CloudClient::new(cfg).is_err());
    let mut cfg = ClientConfig::new(Secret::new("super-secret-key-123"), 1);
    cfg.extra_ca_pem = Some(b"not a pem".to_vec());
    let err = CloudClient::new(cfg.clone()).unwrap_err();
    assert!(!format!("{err} {err:?}").contains("super-secret-key-123"));
    cfg.extra_ca_pem = None;
    assert!(!format!("{cfg:?}").contains("super-secret-key-123"));
    let c = CloudClient::new(cfg).unwrap();
    assert!(!format!("{c:?}").contains("super-secret-key-123"));
}

/// A client whose writes are never sent in these tests (fenced): nothing listens there.
fn unreachable_client() -> CloudClient {
    let mut cfg = ClientConfig::new(Secret::new("k"), 1);
    cfg.base_url = Url::parse("http://127.0.0.1:9/").unwrap();
    cfg.requests_per_second = Some(4.0);
    CloudClient::new(cfg).unwrap()
}

fn fence_at(deadline: Option<tokio::time::Instant>) -> Arc<dyn Fence> {
    Arc::new(deadline)
}

#[test]
fn handles_keep_their_priority_and_fence() {
    let c = unreachable_client();
    assert!(format!("{c:?}").contains("fence: None"));
    let f = c.with_priority(Priority::Urgent).fenced(fence_at(None));
    assert_eq!(f.priority, Priority::Urgent, "fenced keeps the priority");
    let g = f.with_priority(Priority::Normal);
    assert!(g.fence.is_some(), "with_priority keeps the fence");
    assert!(format!("{g:?}").contains("fence: Some(None)"), "{g:?}");
    assert!(Arc::ptr_eq(&c.inner, &g.inner), "same limit and cache");
}

#[tokio::test(start_paused = true)]
async fn no_deadline_refuses_at_once() {
    let c = unreachable_client();
    let start = tokio::time::Instant::now();
    for deadline in [None, Some(start)] {
        for p in [Priority::Urgent, Priority::Normal] {
            let f = c.with_priority(p).fenced(fence_at(deadline));
            let err = f.retarget_ip(&IpId("x".into()), ServerId(1)).await.unwrap_err();
            assert!(err.is_fenced(), "{err}");
            assert!(!err.outcome_unknown());
        }
    }
    assert_eq!(tokio::time::Instant::now(), start);
}

#[tokio::test(start_paused = true)]
async fn a_paused_gate_past_the_deadline() {
    let c = unreachable_client();
    let start = tokio::time::Instant::now();
    c.inner.gate.defer(start + Duration::from_secs(10)); // a Retry-After
    let deadline = Some(start + Duration::from_secs(2));
    // Urgent: the grant can only come too late; no queueing.
    let urgent = c.with_priority(Priority::Urgent).fenced(fence_at(deadline));
    let err = urgent.unassign_ip(&IpId("x".into())).await.unwrap_err();
    assert!(err.is_fenced(), "{err}");
    assert_eq!(tokio::time::Instant::now(), start);
    // Normal: waits in the queue (the deadline might be extended), gives up at the deadline.
    let normal = c.fenced(fence_at(deadline));
    let err = normal.unassign_ip(&IpId("x".into())).await.unwrap_err();
    assert!(err.is_fenced(), "{err}");
    assert_eq!(tokio::time::Instant::now(), start + Duration::from_secs(2));
}

/// Whether a call of `op` that began now on `c` would give up before waiting `delay`.
fn gives_up(c: &CloudClient, op: Op, delay: Duration) -> bool {
    c.gives_up_before_retry(c.term_for(op).as_ref(), delay)
}

#[tokio::test(start_paused = true)]
async fn only_fenced_urgent_writes_give_up_before_a_long_retry_delay() {
    let c = unreachable_client();
    let start = tokio::time::Instant::now();
    let deadline = Some(start + Duration::from_secs(1));
    let urgent = c.with_priority(Priority::Urgent).fenced(fence_at(deadline));
    let ms = Duration::from_millis;
    assert!(!gives_up(&urgent, Op::RetargetIp, ms(500)));
    assert!(
        gives_up(&urgent, Op::RetargetIp, ms(1000)),
        "would send at the deadline"
    );
    assert!(gives_up(&urgent, Op::CreateIp, ms(2000)));
    assert!(!gives_up(&urgent, Op::GetIp, ms(2000)), "reads are not fenced");
    let normal = c.fenced(fence_at(deadline));
    assert!(
        !gives_up(&normal, Op::RetargetIp, ms(2000)),
        "normal waits and re-checks"
    );
    let unfenced = c.with_priority(Priority::Urgent);
    assert!(!gives_up(&unfenced, Op::RetargetIp, ms(2000)));
    // A gate pause counts as part of the delay.
    c.inner.gate.defer(start + ms(1500));
    assert!(gives_up(&urgent, Op::RetargetIp, ms(100)));
    // An ended lease: give up whatever the delay.
    let ended = c.with_priority(Priority::Urgent).fenced(fence_at(None));
    assert!(gives_up(&ended, Op::DeleteIp, Duration::ZERO));
}
