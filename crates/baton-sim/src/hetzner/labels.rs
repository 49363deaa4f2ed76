//! Hetzner's label rules and label selectors, without HTTP: [`check_labels`] validates a label
//! set as the API does on create and update, [`Selector`] parses `label_selector` and matches
//! label sets.
//!
//! ```text
//!  "env=prod,tier!=db,!legacy,role in (cp,lb)"
//!        │ Selector::parse (split on commas outside parentheses)
//!        ▼
//!  [Eq(env,prod), NotEq(tier,db), Absent(legacy), In(role,{cp,lb})] ── matches(&labels): all hold
//! ```
//!
//! Keys and values follow Kubernetes' rules, as Hetzner's reference states them: a key is an
//! optional DNS-subdomain prefix and `/`, then a name of at most 63 characters that starts and
//! ends with an alphanumeric and has `-`, `_`, `.` and alphanumerics between; a value is empty
//! or such a name. The `hetzner.cloud/` prefix is reserved.

use std::collections::BTreeSet;

use baton_cloud::hetzner::model::Labels;

/// The prefix Hetzner keeps for itself.
const RESERVED_PREFIX: &str = "hetzner.cloud";

/// Whether `name` is a label name: 1–63 characters, alphanumeric at both ends, `-_.` and
/// alphanumerics between.
fn is_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    let (Some(first), Some(last)) = (bytes.first(), bytes.last()) else {
        return false;
    };
    bytes.len() <= 63
        && first.is_ascii_alphanumeric()
        && last.is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Whether `prefix` is a DNS subdomain (RFC 1123 labels, lower case, at most 253 characters).
fn is_dns_subdomain(prefix: &str) -> bool {
    prefix.len() <= 253
        && prefix.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty()
                && b.len() <= 63
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && b[0] != b'-'
                && b[b.len() - 1] != b'-'
        })
}

/// Why `key` is not a valid label key (`None`: it is).
pub(crate) fn key_error(key: &str) -> Option<String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        if !is_dns_subdomain(prefix) {
            return Some(format!("label key {key:?}: the prefix must be a DNS subdomain"));
        }
        if prefix == RESERVED_PREFIX {
            return Some(format!(
                "label key {key:?}: the prefix {RESERVED_PREFIX}/ is reserved"
            ));
        }
    }
    if is_name(name) {
        None
    } else {
        Some(format!(
            "label key {key:?}: the name must be 1-63 characters, alphanumeric at both ends, with '-', '_', '.' and alphanumerics between"
        ))
    }
}

/// Why `value` is not a valid label value (`None`: it is).
pub(crate) fn value_error(value: &str) -> Option<String> {
    if value.is_empty() || is_name(value) {
        None
    } else {
        Some(format!(
            "label value {value:?}: must be empty or 1-63 characters, alphanumeric at both ends, with '-', '_', '.' and alphanumerics between"
        ))
    }
}

/// Every problem of a label set (empty: valid), one message per bad key or value.
pub(crate) fn check_labels(labels: &Labels) -> Vec<String> {
    labels
        .iter()
        .flat_map(|(k, v)| [key_error(k), value_error(v)])
        .flatten()
        .collect()
}

/// One requirement of a selector.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    /// `k=v`, `k==v`.
    Eq(String, String),
    /// `k!=v` (also true when `k` is absent).
    NotEq(String, String),
    /// `k`.
    Present(String),
    /// `!k`.
    Absent(String),
    /// `k in (a,b)`.
    In(String, BTreeSet<String>),
    /// `k notin (a,b)` (also true when `k` is absent).
    NotIn(String, BTreeSet<String>),
}

impl Requirement {
    fn holds(&self, labels: &Labels) -> bool {
        match self {
            Self::Eq(k, v) => labels.get(k) == Some(v),
            Self::NotEq(k, v) => labels.get(k) != Some(v),
            Self::Present(k) => labels.contains_key(k),
            Self::Absent(k) => !labels.contains_key(k),
            Self::In(k, set) => labels.get(k).is_some_and(|v| set.contains(v)),
            Self::NotIn(k, set) => labels.get(k).is_none_or(|v| !set.contains(v)),
        }
    }

    /// Parses one comma-free (outside parentheses) part.
    fn parse(part: &str) -> Result<Self, String> {
        let part = part.trim();
        let key = |k: &str| -> Result<String, String> {
            let k = k.trim();
            key_error(k).map_or_else(|| Ok(k.to_owned()), Err)
        };
        let value = |v: &str| -> Result<String, String> {
            let v = v.trim();
            value_error(v).map_or_else(|| Ok(v.to_owned()), Err)
        };
        if part.is_empty() {
            return Err("empty requirement".into());
        }
        if let Some(k) = part.strip_prefix('!') {
            return Ok(Self::Absent(key(k)?));
        }
        if let Some((head, rest)) = part.split_once('(') {
            let inner = rest
                .strip_suffix(')')
                .ok_or_else(|| format!("{part:?}: a set must end with ')'"))?;
            let mut words = head.split_whitespace();
            let (Some(k), Some(op), None) = (words.next(), words.next(), words.next()) else {
                return Err(format!(
                    "{part:?} is not `key in (values)` or `key notin (values)`"
                ));
            };
            let values = inner.split(',').map(value).collect::<Result<BTreeSet<_>, _>>()?;
            return match op {
                "in" => Ok(Self::In(key(k)?, values)),
                "notin" => Ok(Self::NotIn(key(k)?, values)),
                _ => Err(format!("{part:?}: unknown operator {op:?} (in, notin)")),
            };
        }
        if let Some((k, v)) = part.split_once("!=") {
            return Ok(Self::NotEq(key(k)?, value(v)?));
        }
        if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
            return Ok(Self::Eq(key(k)?, value(v)?));
        }
        Ok(Self::Present(key(part)?))
    }
}

/// A parsed `label_selector`: every requirement must hold (comma = AND). The empty selector
/// matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Selector(Vec<Requirement>);

impl Selector {
    /// Parses a selector; the error says which part is wrong.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        let mut parts = Vec::new();
        let (mut depth, mut start) = (0_i32, 0);
        for (i, c) in text.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                ',' if depth == 0 => {
                    parts.push(&text[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
            if depth < 0 {
                return Err(format!("unbalanced ')' in {text:?}"));
            }
        }
        if depth != 0 {
            return Err(format!("unbalanced '(' in {text:?}"));
        }
        parts.push(&text[start..]);
        parts
            .into_iter()
            .map(Requirement::parse)
            .collect::<Result<Vec<_>, _>>()
            .map(Self)
    }

    /// Whether `labels` satisfy every requirement.
    pub(crate) fn matches(&self, labels: &Labels) -> bool {
        self.0.iter().all(|r| r.holds(labels))
    }
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[rstest]
    #[case("env=prod", true)]
    #[case("env==prod", true)]
    #[case("env = prod", true)]
    #[case("env=dev", false)]
    #[case("env!=dev", true)]
    #[case("absent!=x", true)]
    #[case("env", true)]
    #[case("absent", false)]
    #[case("!absent", true)]
    #[case("!env", false)]
    #[case("role in (cp,lb)", true)]
    #[case("role in (lb, worker)", false)]
    #[case("absent in (a)", false)]
    #[case("role notin (lb,worker)", true)]
    #[case("absent notin (a)", true)]
    #[case("role notin (cp)", false)]
    #[case("env=prod,role in (cp,lb),!legacy", true)]
    #[case("env=prod,legacy", false)]
    #[case("example.com/team=a", true)]
    #[case("", true)]
    #[case("env=", false)] // an empty value is a value
    fn selectors_match_as_kubernetes_does(#[case] selector: &str, #[case] expected: bool) {
        let have = labels(&[("env", "prod"), ("role", "cp"), ("example.com/team", "a")]);
        let parsed = Selector::parse(selector).unwrap();
        assert_eq!(parsed.matches(&have), expected, "{selector}");
    }

    #[rstest]
    #[case(",env=prod")]
    #[case("env=prod,")]
    #[case("role in (cp")]
    #[case("role in cp)")]
    #[case("role within (cp)")]
    #[case("bad key=x")]
    #[case("env=a b")]
    #[case("!")]
    #[case("-env")]
    #[case("hetzner.cloud/x=y")]
    fn invalid_selectors_are_refused(#[case] selector: &str) {
        assert!(Selector::parse(selector).is_err(), "{selector}");
    }

    #[rstest]
    #[case("app", "", true)]
    #[case("app.kubernetes.io/name", "baton-1.2_x", true)]
    #[case("a", &"v".repeat(63), true)]
    #[case("a", &"v".repeat(64), false)]
    #[case(&"k".repeat(64), "v", false)]
    #[case("-a", "v", false)]
    #[case("a", "v-", false)]
    #[case("Example.com/a", "v", false)]
    #[case("hetzner.cloud/x", "v", false)]
    #[case("a", "base64+/=", false)]
    #[case("", "v", false)]
    fn label_rules(#[case] key: &str, #[case] value: &str, #[case] valid: bool) {
        assert_eq!(
            check_labels(&labels(&[(key, value)])).is_empty(),
            valid,
            "{key}={value}"
        );
    }
}
