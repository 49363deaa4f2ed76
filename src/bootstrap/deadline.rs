//! The time limit of a waiting step (`timeouts.*` in the bootstrap config): every step that
//! retries until something is ready checks it the same way and fails with the same error.

use std::time::Duration;

use tokio::time::Instant;

use super::error::BootstrapError;

/// A step's time limit, started when the step starts.
#[derive(Debug, Clone, Copy)]
pub(super) struct Deadline {
    timeout: Duration,
    at: Instant,
}

impl Deadline {
    /// `timeout` from now.
    pub(super) fn after(timeout: Duration) -> Self {
        Self {
            timeout,
            at: Instant::now() + timeout,
        }
    }

    /// `Ok` while time is left; once it ran out, the timeout error waiting for `what` (called
    /// only then), with the last failure seen.
    pub(super) fn check(
        &self,
        what: impl FnOnce() -> String,
        last: Option<String>,
    ) -> Result<(), BootstrapError> {
        if Instant::now() < self.at {
            return Ok(());
        }
        Err(BootstrapError::Timeout {
            what: what(),
            after: self.timeout,
            last,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn time_is_left_until_the_timeout_then_the_error_names_what_and_the_last_failure() {
        let d = Deadline::after(Duration::from_secs(2));
        assert!(d.check(|| unreachable!("only named on timeout"), None).is_ok());
        tokio::time::sleep(Duration::from_millis(1999)).await;
        assert!(d.check(|| unreachable!("only named on timeout"), None).is_ok());
        tokio::time::sleep(Duration::from_millis(1)).await;
        let e = d
            .check(|| "the API".into(), Some("refused".into()))
            .expect_err("timed out");
        assert!(matches!(e, BootstrapError::Timeout { .. }));
        assert_eq!(
            e.to_string(),
            "timed out after 2s waiting for the API (last: refused)"
        );
    }
}
