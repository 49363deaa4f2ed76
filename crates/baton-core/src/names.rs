//! Kubernetes name rules (apimachinery `validation`): labels, label keys/values, annotations.

/// A DNS-1123 label: `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63 characters.
pub fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A DNS-1123 subdomain: dot-separated labels, at most 253 characters.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

/// A qualified name (the name part of a label or annotation key): at most 63 characters,
/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`.
pub fn is_qualified_name_part(s: &str) -> bool {
    let ok = |b: u8| b.is_ascii_alphanumeric();
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| ok(b) || matches!(b, b'-' | b'_' | b'.'))
        && s.bytes().next().is_some_and(ok)
        && s.bytes().last().is_some_and(ok)
}

/// A label or annotation key: `[prefix/]name`, prefix a DNS-1123 subdomain.
pub fn is_qualified_key(s: &str) -> bool {
    match s.split_once('/') {
        Some((prefix, name)) => is_dns1123_subdomain(prefix) && is_qualified_name_part(name),
        None => is_qualified_name_part(s),
    }
}

/// A label value: empty, or a qualified name part.
pub fn is_label_value(s: &str) -> bool {
    s.is_empty() || is_qualified_name_part(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case("metallb-system", true)]
    #[case("a", true)]
    #[case("-a", false)]
    #[case("A", false)]
    #[case("a_b", false)]
    #[case("", false)]
    fn dns1123_label(#[case] s: &str, #[case] ok: bool) {
        assert_eq!(is_dns1123_label(s), ok);
    }

    #[rstest]
    #[case("cherryservers.com/bgp-peers-0-node-asn", true)]
    #[case("kube-vip.io/loadbalancerIPs", true)]
    #[case("node-role.kubernetes.io/control-plane", true)]
    #[case("plain_key.x", true)]
    #[case("Bad Prefix/x", false)]
    #[case("a/b/c", false)]
    #[case("x/", false)]
    fn qualified_key(#[case] s: &str, #[case] ok: bool) {
        assert_eq!(is_qualified_key(s), ok);
    }
}
