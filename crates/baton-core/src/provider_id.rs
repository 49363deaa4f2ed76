//! Kubernetes provider IDs of the servers baton knows: Cherry Servers' `cherryservers://<id>`, or a
//! bare `<id>` (the Cherry CCM's `serverIDFromProviderID` accepts both), and Hetzner Cloud's
//! `hcloud://<id>` (hcloud-cloud-controller-manager's form). Any other scheme is refused.

use std::fmt;
use std::str::FromStr;

/// The provider name, and the provider ID scheme, of Cherry Servers.
pub const PROVIDER_NAME: &str = "cherryservers";
/// The provider ID scheme of Hetzner Cloud servers.
pub const HCLOUD_SCHEME: &str = "hcloud";

/// A server's provider ID: its cloud's scheme and the server id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProviderId {
    id: u64,
    hcloud: bool,
}

/// Why a provider ID was rejected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProviderIdError {
    #[error("provider ID is empty")]
    Empty,
    #[error(
        "provider ID {0:?} belongs to another provider (expected cherryservers://<server id> or hcloud://<server id>)"
    )]
    OtherProvider(String),
    #[error("provider ID {0:?} does not end in a server id (a positive number)")]
    NotAServerId(String),
}

impl ProviderId {
    /// The server id.
    pub fn server_id(self) -> u64 {
        self.id
    }

    /// A Hetzner Cloud server's provider ID, `hcloud://<id>`.
    pub fn hcloud(id: u64) -> Self {
        Self { id, hcloud: true }
    }

    /// Whether it names a Hetzner Cloud server.
    pub fn is_hcloud(self) -> bool {
        self.hcloud
    }
}

/// A Cherry Servers server's provider ID.
impl From<u64> for ProviderId {
    fn from(id: u64) -> Self {
        Self { id, hcloud: false }
    }
}

impl FromStr for ProviderId {
    type Err = ProviderIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.is_empty() {
            return Err(ProviderIdError::Empty);
        }
        let (id, hcloud) = match s.split_once("://") {
            Some((scheme, rest)) if scheme == PROVIDER_NAME => (rest.trim_start_matches('/'), false),
            Some((scheme, rest)) if scheme == HCLOUD_SCHEME => (rest.trim_start_matches('/'), true),
            Some(_) => return Err(ProviderIdError::OtherProvider(s.to_owned())),
            None => (s, false),
        };
        match id.parse::<u64>() {
            Ok(n) if n > 0 && id.chars().all(|c| c.is_ascii_digit()) => Ok(Self { id: n, hcloud }),
            _ => Err(ProviderIdError::NotAServerId(s.to_owned())),
        }
    }
}

impl fmt::Display for ProviderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.hcloud { HCLOUD_SCHEME } else { PROVIDER_NAME };
        write!(f, "{scheme}://{}", self.id)
    }
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    #[rstest]
    #[case("cherryservers://600101", Ok(600_101))]
    #[case("600101", Ok(600_101))]
    #[case(" cherryservers://42 ", Ok(42))]
    #[case("cherryservers:///42", Ok(42))]
    #[case("", Err(ProviderIdError::Empty))]
    #[case("aws:///eu-west-1a/i-123", Err(ProviderIdError::OtherProvider("aws:///eu-west-1a/i-123".into())))]
    #[case("equinixmetal://abc", Err(ProviderIdError::OtherProvider("equinixmetal://abc".into())))]
    #[case("cherryservers://", Err(ProviderIdError::NotAServerId("cherryservers://".into())))]
    #[case("cherryservers://0", Err(ProviderIdError::NotAServerId("cherryservers://0".into())))]
    #[case("cherryservers://+5", Err(ProviderIdError::NotAServerId("cherryservers://+5".into())))]
    #[case("node-1", Err(ProviderIdError::NotAServerId("node-1".into())))]
    #[case("hcloud://12345", Ok(12_345))]
    #[case("hcloud://", Err(ProviderIdError::NotAServerId("hcloud://".into())))]
    fn parse(#[case] input: &str, #[case] want: Result<u64, ProviderIdError>) {
        assert_eq!(input.parse::<ProviderId>().map(ProviderId::server_id), want);
    }

    #[test]
    fn display_round_trips() {
        let id = ProviderId::from(600_101);
        assert_eq!(id.to_string(), "cherryservers://600101");
        assert_eq!(id.to_string().parse::<ProviderId>(), Ok(id));
        let h = ProviderId::hcloud(12_345);
        assert_eq!(h.to_string(), "hcloud://12345");
        assert_eq!(h.to_string().parse::<ProviderId>(), Ok(h));
        assert!(h.is_hcloud() && !id.is_hcloud());
    }
}
