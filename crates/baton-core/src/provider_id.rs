//! Kubernetes provider IDs of Cherry Servers servers: `cherryservers://<id>`, or a bare `<id>`
//! (the Cherry CCM's `serverIDFromProviderID` accepts both and rejects any other scheme).

use std::fmt;
use std::str::FromStr;

/// The provider name, and the provider ID scheme.
pub const PROVIDER_NAME: &str = "cherryservers";

/// A server's provider ID.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProviderId(u64);

/// Why a provider ID was rejected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProviderIdError {
    #[error("provider ID is empty")]
    Empty,
    #[error("provider ID {0:?} belongs to another provider (expected cherryservers://<server id>)")]
    OtherProvider(String),
    #[error("provider ID {0:?} does not end in a server id (a positive number)")]
    NotAServerId(String),
}

impl ProviderId {
    /// The server id.
    pub fn server_id(self) -> u64 {
        self.0
    }
}

impl From<u64> for ProviderId {
    fn from(id: u64) -> Self {
        Self(id)
    }
}

impl FromStr for ProviderId {
    type Err = ProviderIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.is_empty() {
            return Err(ProviderIdError::Empty);
        }
        let id = match s.split_once("://") {
            Some((scheme, rest)) if scheme == PROVIDER_NAME => rest.trim_start_matches('/'),
            Some(_) => return Err(ProviderIdError::OtherProvider(s.to_owned())),
            None => s,
        };
        match id.parse::<u64>() {
            Ok(n) if n > 0 && id.chars().all(|c| c.is_ascii_digit()) => Ok(Self(n)),
            _ => Err(ProviderIdError::NotAServerId(s.to_owned())),
        }
    }
}

impl fmt::Display for ProviderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PROVIDER_NAME}://{}", self.0)
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
    fn parse(#[case] input: &str, #[case] want: Result<u64, ProviderIdError>) {
        assert_eq!(input.parse::<ProviderId>().map(ProviderId::server_id), want);
    }

    #[test]
    fn display_round_trips() {
        let id = ProviderId::from(600_101);
        assert_eq!(id.to_string(), "cherryservers://600101");
        assert_eq!(id.to_string().parse::<ProviderId>(), Ok(id));
    }
}
