use std::time::Duration;

use super::{BootstrapError, exit};
use crate::bootstrap::state::Step;

#[test]
fn exit_codes_are_distinct_per_cause() {
    let timeout = BootstrapError::Timeout {
        what: "x".into(),
        after: Duration::from_secs(1),
        last: Some("connection refused".into()),
    };
    assert_eq!(timeout.exit_code(), exit::TIMEOUT);
    assert!(timeout.to_string().contains("connection refused"), "{timeout}");
    assert_eq!(BootstrapError::CloudState("x".into()).exit_code(), exit::CLOUD);
    assert_eq!(
        BootstrapError::Interrupted(Step::Handoff).exit_code(),
        exit::INTERRUPTED
    );
    let field = BootstrapError::Field {
        path: "b.yaml".into(),
        field: "cloud.region".into(),
        message: "unknown".into(),
    };
    assert_eq!(field.exit_code(), exit::CONFIG);
    assert!(field.to_string().contains("cloud.region"));
    let codes = [
        exit::COMPLETE,
        exit::FAILURE,
        exit::CONFIG,
        exit::TIMEOUT,
        exit::CLOUD,
        exit::KUBERNETES,
        exit::DNS,
        exit::INTERRUPTED,
    ];
    let unique: std::collections::BTreeSet<u8> = codes.iter().copied().collect();
    assert_eq!(unique.len(), codes.len());
    assert!(
        !codes.contains(&3),
        "3 is reserved (it once meant a subcommand not built yet)"
    );
}
