//! The control-plane FIP tag, `key=value` (`CHERRY_FIP_TAG` / `fipTag`).

use std::fmt;
use std::str::FromStr;

/// A tag that identifies a Floating IP: `key=value`, split on the first `=`.
///
/// As in cloud-provider-cherry, a value may be empty (`key=` or just `key`), the key may not.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FipTag {
    key: String,
    value: String,
}

/// Why a FIP tag was rejected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FipTagError {
    #[error("the tag key is empty (expected key=value)")]
    EmptyKey,
    #[error("the tag contains a control character")]
    ControlCharacter,
}

impl FipTag {
    /// The tag's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The tag's value.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// Whether a FIP's tags carry this tag.
    pub fn matches<'a>(&self, mut tags: impl Iterator<Item = (&'a str, &'a str)>) -> bool {
        tags.any(|(k, v)| k == self.key && v == self.value)
    }
}

impl FromStr for FipTag {
    type Err = FipTagError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.chars().any(char::is_control) {
            return Err(FipTagError::ControlCharacter);
        }
        let (key, value) = s.split_once('=').unwrap_or((s, ""));
        let key = key.trim();
        if key.is_empty() {
            return Err(FipTagError::EmptyKey);
        }
        Ok(Self {
            key: key.to_owned(),
            value: value.trim().to_owned(),
        })
    }
}

impl fmt::Display for FipTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.key, self.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case("cluster=my-cp", "cluster", "my-cp")]
    #[case("a=b=c", "a", "b=c")]
    #[case("role", "role", "")]
    #[case("role=", "role", "")]
    fn parses(#[case] input: &str, #[case] key: &str, #[case] value: &str) {
        let tag: FipTag = input.parse().unwrap();
        assert_eq!((tag.key(), tag.value()), (key, value));
    }

    #[rstest]
    #[case("", FipTagError::EmptyKey)]
    #[case("=value", FipTagError::EmptyKey)]
    #[case("a\n=b", FipTagError::ControlCharacter)]
    fn rejects(#[case] input: &str, #[case] err: FipTagError) {
        assert_eq!(input.parse::<FipTag>().unwrap_err(), err);
    }

    #[test]
    fn matches_key_and_value() {
        let tag: FipTag = "cluster=a".parse().unwrap();
        assert!(tag.matches([("x", "y"), ("cluster", "a")].into_iter()));
        assert!(!tag.matches([("cluster", "b")].into_iter()));
    }
}
