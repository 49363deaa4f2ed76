//! [`DnsName`]: a validated, lower-cased, absolute domain name, free of hickory types.

use std::fmt;
use std::str::FromStr;

/// Why a string is not a usable domain name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// The name is empty (or only `.`), which would be the root.
    #[error("empty domain name")]
    Empty,
    /// A label is empty (`a..b`).
    #[error("empty label in {0:?}")]
    EmptyLabel(String),
    /// A label is longer than 63 bytes.
    #[error("label longer than 63 bytes in {0:?}")]
    LabelTooLong(String),
    /// The whole name is longer than 253 characters.
    #[error("domain name longer than 253 characters: {0:?}")]
    TooLong(String),
    /// A character outside letters, digits, `-` and `_`.
    #[error("invalid character {ch:?} in domain name {name:?} (letters, digits, '-' and '_' only)")]
    InvalidChar {
        /// The offending character.
        ch: char,
        /// The whole input.
        name: String,
    },
    /// A relative name resolved against a zone does not lie inside it.
    #[error("{name} is not inside zone {zone}")]
    OutsideZone {
        /// The name.
        name: String,
        /// The zone.
        zone: String,
    },
}

/// An absolute domain name, normalised to lower case and stored without the trailing dot.
///
/// Built only through [`FromStr`] / [`DnsName::relative_to`], so it is always valid (RFC 1035
/// lengths; letters, digits, `-`, `_`).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DnsName(String);

impl DnsName {
    /// The name without the trailing dot (`api.c1.example.com`).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name with the trailing dot (`api.c1.example.com.`).
    pub fn fqdn(&self) -> String {
        format!("{}.", self.0)
    }

    /// Whether `self` equals `zone` or lies below it.
    pub fn is_within(&self, zone: &Self) -> bool {
        self.0 == zone.0
            || (self.0.len() > zone.0.len()
                && self.0.ends_with(zone.0.as_str())
                && self.0.as_bytes()[self.0.len() - zone.0.len() - 1] == b'.')
    }

    /// Resolves `name` against `zone`, as the CLI's `--a NAME=…` does:
    /// `@` is the apex, a name ending in `.` is absolute (and must lie inside the zone), anything
    /// else is relative to the zone.
    pub fn relative_to(name: &str, zone: &Self) -> Result<Self, NameError> {
        let name = name.trim();
        let absolute = if name == "@" {
            return Ok(zone.clone());
        } else if let Some(abs) = name.strip_suffix('.') {
            abs.parse::<Self>()?
        } else {
            format!("{name}.{}", zone.0).parse::<Self>()?
        };
        if absolute.is_within(zone) {
            Ok(absolute)
        } else {
            Err(NameError::OutsideZone {
                name: absolute.fqdn(),
                zone: zone.fqdn(),
            })
        }
    }

    /// The labels, left to right.
    pub fn labels(&self) -> impl Iterator<Item = &str> {
        self.0.split('.')
    }
}

impl FromStr for DnsName {
    type Err = NameError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let trimmed = s.trim();
        let body = trimmed.strip_suffix('.').unwrap_or(trimmed);
        if body.is_empty() {
            return Err(NameError::Empty);
        }
        if body.len() > 253 {
            return Err(NameError::TooLong(s.to_owned()));
        }
        for label in body.split('.') {
            if label.is_empty() {
                return Err(NameError::EmptyLabel(s.to_owned()));
            }
            if label.len() > 63 {
                return Err(NameError::LabelTooLong(s.to_owned()));
            }
            if let Some(ch) = label
                .chars()
                .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
            {
                return Err(NameError::InvalidChar {
                    ch,
                    name: s.to_owned(),
                });
            }
        }
        Ok(Self(body.to_ascii_lowercase()))
    }
}

impl fmt::Display for DnsName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.", self.0)
    }
}

impl fmt::Debug for DnsName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DnsName({}.)", self.0)
    }
}

#[cfg(test)]
mod tests;
