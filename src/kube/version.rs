//! The Kubernetes version floor of control-plane endpoints: 1.30.
//!
//! baton tells kube-proxy to keep away from a control-plane FIP by `ipMode: Proxy` on the
//! endpoint Service's ingress (docs/controller.md). That field exists from Kubernetes 1.30 on;
//! an older API server drops it, and kube-proxy then DNATs the FIP itself in PREROUTING (the
//! same priority as the agent's chain: which rule wins depends on registration order) and in
//! OUTPUT (every node's probe of the FIP is answered locally, so a broken route is never seen).
//! So below 1.30 the controller and the agent refuse to manage control-plane endpoints.
//!
//! ```text
//!  GET /version ─► major, minor ("30", or "30+" on some distributions) ─► check ─► Ok | TooOld
//! ```

use std::time::Duration;

/// The lowest Kubernetes version whose control-plane endpoints baton manages.
pub const FLOOR: (u32, u32) = (1, 30);

/// The API server's version is below [`FLOOR`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "Kubernetes {version} is below 1.30: control-plane endpoints are not managed (their Services' status.loadBalancer.ingress[].ipMode: Proxy needs 1.30; without it kube-proxy DNATs the Floating IP itself, racing the node agent's rules and answering every node's probe of the FIP locally); upgrade the control plane to 1.30 or later"
)]
pub struct TooOld {
    /// The server's version as it reports it (`gitVersion`, else `major.minor`).
    pub version: String,
}

/// Checks the version `GET /version` answered. A version that cannot be read as numbers (a
/// distribution's own scheme) passes: the floor refuses only what it knows to be too old.
pub fn check(major: &str, minor: &str, git_version: &str) -> Result<(), TooOld> {
    let number = |s: &str| {
        let digits: String = s.trim().chars().take_while(char::is_ascii_digit).collect();
        digits.parse::<u32>().ok()
    };
    let (Some(major_n), Some(minor_n)) = (number(major), number(minor)) else {
        return Ok(());
    };
    if (major_n, minor_n) >= FLOOR {
        return Ok(());
    }
    let version = if git_version.trim().is_empty() {
        format!("{major}.{minor}")
    } else {
        git_version.trim().to_owned()
    };
    Err(TooOld { version })
}

/// Reads the server's version and checks it; a failed read is retried (200 ms doubling to 5 s)
/// until it succeeds: cancel the future to give up.
pub async fn read_and_check(client: &kube::Client) -> Result<(), TooOld> {
    let mut wait = Duration::from_millis(200);
    loop {
        match client.apiserver_version().await {
            Ok(info) => return check(&info.major, &info.minor, &info.git_version),
            Err(error) => {
                tracing::warn!(%error, retry_in = ?wait, "cannot read the Kubernetes version yet");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    #[rstest]
    #[case::the_floor("1", "30", "v1.30.0", true)]
    #[case::newer("1", "35", "v1.35.1", true)]
    #[case::a_distributions_plus("1", "30+", "v1.30.4-gke.1", true)]
    #[case::below("1", "29", "v1.29.9", false)]
    #[case::below_with_plus("1", "28+", "v1.28.3-eks-1", false)]
    #[case::much_older("1", "19", "", false)]
    #[case::a_major_two("2", "0", "v2.0.0", true)]
    #[case::unreadable("", "", "v0.0.0-master+$Format:%H$", true)]
    fn the_floor_is_1_30(#[case] major: &str, #[case] minor: &str, #[case] git: &str, #[case] ok: bool) {
        assert_eq!(check(major, minor, git).is_ok(), ok, "{major}.{minor} {git}");
    }

    #[test]
    fn the_refusal_names_the_version_and_the_reason() {
        let e = check("1", "29", "v1.29.9").unwrap_err().to_string();
        assert!(
            e.contains("v1.29.9") && e.contains("1.30") && e.contains("ipMode"),
            "{e}"
        );
        let e = check("1", "19", "").unwrap_err().to_string();
        assert!(e.contains("1.19"), "{e}");
    }
}
