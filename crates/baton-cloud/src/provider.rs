//! Which cloud baton talks to: `--cloud cherry|hetzner` (`BATON_CLOUD`, config key `cloud`).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A cloud baton can drive. Cherry Servers is the default, so existing configurations keep
/// working unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CloudKind {
    /// Cherry Servers (`api.cherryservers.com`): a `PUT` retargets a Floating IP, BGP available.
    #[default]
    Cherry,
    /// Hetzner Cloud (`api.hetzner.cloud`): an assign action moves a Floating IP, no BGP.
    Hetzner,
}

impl CloudKind {
    /// Every cloud, in the order the help text names them.
    pub const ALL: [Self; 2] = [Self::Cherry, Self::Hetzner];

    /// The name used on the command line, in variables and in the config file.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cherry => "cherry",
            Self::Hetzner => "hetzner",
        }
    }
}

impl fmt::Display for CloudKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown cloud name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown cloud {0:?} (expected cherry or hetzner)")]
pub struct UnknownCloud(pub String);

impl FromStr for CloudKind {
    type Err = UnknownCloud;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cherry" | "cherryservers" => Ok(Self::Cherry),
            "hetzner" | "hcloud" => Ok(Self::Hetzner),
            _ => Err(UnknownCloud(s.to_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_names_and_refuses_others() {
        assert_eq!("cherry".parse(), Ok(CloudKind::Cherry));
        assert_eq!("Hetzner".parse(), Ok(CloudKind::Hetzner));
        assert_eq!("hcloud".parse(), Ok(CloudKind::Hetzner));
        assert_eq!(
            "aws".parse::<CloudKind>().unwrap_err().to_string(),
            "unknown cloud \"aws\" (expected cherry or hetzner)"
        );
        assert_eq!(CloudKind::default(), CloudKind::Cherry);
    }
}
