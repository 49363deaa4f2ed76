use super::*;

fn api(status: u16) -> CloudError {
    CloudError::Api {
        op: Op::GetIp,
        object: Object("ip abc".into()),
        status,
        code: i64::from(status),
        message: "nope".into(),
        retry_after: None,
    }
}

#[test]
fn retryable_statuses() {
    for s in [408, 429, 502, 503, 504] {
        assert!(api(s).is_retryable(), "{s}");
    }
    for s in [400, 401, 403, 404, 500] {
        assert!(!api(s).is_retryable(), "{s}");
    }
}

#[test]
fn outcome_unknown_only_when_the_server_may_have_acted() {
    assert!(api(500).outcome_unknown());
    assert!(api(503).outcome_unknown());
    assert!(api(408).outcome_unknown());
    assert!(!api(429).outcome_unknown());
    assert!(!api(400).outcome_unknown());
}

#[test]
fn message_names_op_object_and_api_text() {
    let text = api(404).to_string();
    assert!(text.contains("get_ip"), "{text}");
    assert!(text.contains("ip abc"), "{text}");
    assert!(text.contains("nope"), "{text}");
    assert!(api(404).is_not_found());
    assert_eq!(api(404).category(), "not_found");
    assert_eq!(api(429).category(), "rate_limited");
}

#[test]
fn only_create_is_not_idempotent() {
    assert!(!Op::CreateIp.is_idempotent());
    assert!(Op::RetargetIp.is_idempotent());
    assert!(Op::DeleteIp.is_idempotent());
}
