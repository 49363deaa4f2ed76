//! The pure parts of the authorizer: the header, and what is remembered for how long.

use std::time::Duration;

use axum::http::HeaderValue;
use rstest::rstest;
use tokio::time::Instant;

use super::*;

#[rstest]
#[case::bearer(Some("Bearer abc.def"), Some("abc.def"))]
#[case::any_case(Some("bearer  abc "), Some("abc"))]
#[case::basic(Some("Basic dXNlcjpwYXNz"), None)]
#[case::empty_token(Some("Bearer "), None)]
#[case::no_scheme(Some("abc"), None)]
#[case::none(None, None)]
fn the_bearer_token_of_a_header(#[case] header: Option<&str>, #[case] want: Option<&str>) {
    let value = header.map(|h| HeaderValue::from_str(h).unwrap());
    assert_eq!(bearer_token(value.as_ref()), want);
}

fn allowed() -> Verdict {
    Verdict::Allowed {
        user: "system:serviceaccount:monitoring:prometheus".into(),
    }
}

#[tokio::test(start_paused = true)]
async fn an_allowed_token_is_remembered_for_a_minute_and_a_refusal_for_ten_seconds() {
    let mut cache = ReviewCache::default();
    let t0 = Instant::now();
    cache.insert("good", "/metrics", allowed(), t0);
    cache.insert("bad", "/metrics", Verdict::Unauthenticated("token not valid"), t0);
    cache.insert(
        "other",
        "/metrics",
        Verdict::Forbidden {
            user: "system:serviceaccount:default:default".into(),
        },
        t0,
    );
    cache.insert("down", "/metrics", Verdict::Unavailable("x".into()), t0);
    assert_eq!(cache.len(), 3, "an unavailable API server's answer is not kept");
    assert_eq!(cache.get("good", "/metrics", t0), Some(allowed()));
    assert_eq!(cache.get("good", "/health", t0), None, "per path");
    let later = t0 + Duration::from_secs(10);
    assert_eq!(cache.get("bad", "/metrics", later), None);
    assert_eq!(cache.get("other", "/metrics", later), None);
    assert_eq!(cache.get("good", "/metrics", later), Some(allowed()));
    assert_eq!(cache.get("good", "/metrics", t0 + ALLOWED_TTL), None);
}

#[tokio::test(start_paused = true)]
async fn a_flood_of_tokens_keeps_the_cache_bounded() {
    let mut cache = ReviewCache::default();
    let t0 = Instant::now();
    for i in 0..(3 * CACHE_ENTRIES) {
        cache.insert(
            &format!("token-{i}"),
            "/metrics",
            Verdict::Unauthenticated("x"),
            t0,
        );
    }
    assert!(cache.len() <= CACHE_ENTRIES, "{}", cache.len());
    // Expired answers go first.
    let later = t0 + REFUSED_TTL;
    cache.insert("fresh", "/metrics", allowed(), later);
    assert_eq!(cache.len(), 1);
}
