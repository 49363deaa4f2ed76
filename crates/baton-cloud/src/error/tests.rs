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

#[test]
fn fenced_is_not_retried_and_knows_whether_anything_was_sent() {
    let never_sent = CloudError::Fenced {
        op: Op::RetargetIp,
        object: Object("ip abc".into()),
        after: None,
    };
    assert!(never_sent.is_fenced());
    assert!(!never_sent.is_retryable());
    assert!(!never_sent.outcome_unknown(), "nothing was sent");
    assert_eq!(never_sent.category(), "fenced");
    assert_eq!(never_sent.op(), Some(Op::RetargetIp));
    assert_eq!(never_sent.object(), Some("ip abc"));
    assert_eq!(
        never_sent.to_string(),
        "retarget_ip ip abc: not sent: this replica's leadership ended (fenced)"
    );
    assert!(std::error::Error::source(&never_sent).is_none());

    // An earlier attempt answered 503: it may have acted.
    let after_503 = CloudError::Fenced {
        op: Op::RetargetIp,
        object: Object("ip abc".into()),
        after: Some(Box::new(api(503))),
    };
    assert!(after_503.outcome_unknown());
    assert!(!after_503.is_retryable());
    assert!(
        after_503
            .to_string()
            .contains("the previous attempt failed: get_ip ip abc: API error 503")
    );
    assert!(std::error::Error::source(&after_503).is_some());
    // A 429 is a refusal: nothing happened.
    let after_429 = CloudError::Fenced {
        op: Op::RetargetIp,
        object: Object("ip abc".into()),
        after: Some(Box::new(api(429))),
    };
    assert!(!after_429.outcome_unknown());
}

#[test]
fn writes_are_the_calls_that_are_not_gets() {
    for op in [
        Op::GetProject,
        Op::GetServer,
        Op::ListServers,
        Op::ListIps,
        Op::GetIp,
        Op::ListRegions,
    ] {
        assert!(!op.is_write(), "{op}");
    }
    for op in [
        Op::EnableProjectBgp,
        Op::UpdateServerBgp,
        Op::CreateIp,
        Op::RetargetIp,
        Op::UnassignIp,
        Op::DeleteIp,
    ] {
        assert!(op.is_write(), "{op}");
    }
}
