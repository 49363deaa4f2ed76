//! Label selectors in their string form (`CHERRY_BGP_NODE_SELECTOR`), as `kubectl -l` takes them:
//! `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`, comma-separated (AND).

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use crate::names::{is_label_value, is_qualified_key};

/// A parsed label selector. The empty selector matches everything.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
    source: String,
}

/// One requirement of a selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

/// Why a selector was rejected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SelectorError {
    #[error("invalid label key {0:?}")]
    BadKey(String),
    #[error("invalid label value {0:?}")]
    BadValue(String),
    #[error("cannot parse requirement {0:?}")]
    Syntax(String),
}

impl LabelSelector {
    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| match r {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|l| vs.contains(l)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|l| !vs.contains(l)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::DoesNotExist(k) => !labels.contains_key(k),
        })
    }

    /// The requirements, in input order.
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    /// Whether this selector matches everything.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }
}

/// Splits on commas that are not inside parentheses.
fn split_top_level(s: &str) -> Result<Vec<&str>, SelectorError> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err(SelectorError::Syntax(s.to_owned()));
        }
    }
    if depth != 0 {
        return Err(SelectorError::Syntax(s.to_owned()));
    }
    parts.push(&s[start..]);
    Ok(parts)
}

fn key(k: &str) -> Result<String, SelectorError> {
    let k = k.trim();
    if is_qualified_key(k) {
        Ok(k.to_owned())
    } else {
        Err(SelectorError::BadKey(k.to_owned()))
    }
}

fn value(v: &str) -> Result<String, SelectorError> {
    let v = v.trim();
    if is_label_value(v) {
        Ok(v.to_owned())
    } else {
        Err(SelectorError::BadValue(v.to_owned()))
    }
}

fn set(rest: &str, whole: &str) -> Result<Vec<String>, SelectorError> {
    let inner = rest
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| SelectorError::Syntax(whole.to_owned()))?;
    inner.split(',').map(value).collect()
}

fn requirement(part: &str) -> Result<Requirement, SelectorError> {
    let p = part.trim();
    if let Some(k) = p.strip_prefix('!') {
        return Ok(Requirement::DoesNotExist(key(k)?));
    }
    if let Some((k, v)) = p.split_once("!=") {
        return Ok(Requirement::NotEquals(key(k)?, value(v)?));
    }
    if let Some((k, v)) = p.split_once("==").or_else(|| p.split_once('=')) {
        return Ok(Requirement::Equals(key(k)?, value(v)?));
    }
    if let Some((k, rest)) = p.split_once(" notin ") {
        return Ok(Requirement::NotIn(key(k)?, set(rest, p)?));
    }
    if let Some((k, rest)) = p.split_once(" in ") {
        return Ok(Requirement::In(key(k)?, set(rest, p)?));
    }
    if p.contains(['(', ')', ' ']) {
        return Err(SelectorError::Syntax(p.to_owned()));
    }
    Ok(Requirement::Exists(key(p)?))
}

impl FromStr for LabelSelector {
    type Err = SelectorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim().is_empty() {
            return Ok(Self::default());
        }
        let requirements = split_top_level(s)?
            .into_iter()
            .map(requirement)
            .collect::<Result<_, _>>()?;
        Ok(Self {
            requirements,
            source: s.trim().to_owned(),
        })
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[rstest]
    #[case("", &[], true)]
    #[case("key1=value1,key2=value2", &[("key1", "value1"), ("key2", "value2")], true)]
    #[case("key1=value1,key2=value2", &[("key1", "value1")], false)]
    #[case("bgp!=off", &[], true)]
    #[case("bgp!=off", &[("bgp", "off")], false)]
    #[case("zone in (a, b)", &[("zone", "b")], true)]
    #[case("zone notin (a,b)", &[("zone", "c")], true)]
    #[case("zone notin (a,b)", &[], true)]
    #[case("node-role.kubernetes.io/worker", &[("node-role.kubernetes.io/worker", "")], true)]
    #[case("!node-role.kubernetes.io/control-plane", &[("node-role.kubernetes.io/control-plane", "")], false)]
    fn matches(#[case] sel: &str, #[case] l: &[(&str, &str)], #[case] want: bool) {
        let sel: LabelSelector = sel.parse().unwrap();
        assert_eq!(sel.matches(&labels(l)), want);
    }

    #[rstest]
    #[case("a b=c")]
    #[case("key=bad value")]
    #[case("zone in a,b")]
    #[case("zone in (a")]
    #[case("=x")]
    fn rejects(#[case] sel: &str) {
        assert!(
            sel.parse::<LabelSelector>().is_err(),
            "{sel:?} should be rejected"
        );
    }
}
