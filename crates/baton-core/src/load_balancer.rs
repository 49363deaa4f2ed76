//! The `loadbalancer` setting (`CHERRY_LOAD_BALANCER`): which load-balancer implementation
//! receives workload Service FIPs, as a URL: the same setting and URL forms as the Cherry CCM
//! (cloud-provider-cherry), so an existing configuration keeps working.
//!
//! - `kube-vip://`
//! - `metallb:///<namespace>/?bgp-peer-mode=native|frr|none` (namespace default `metallb-system`)
//! - `empty://?ip-annotation=<annotation>` (default `cherryservers.com/loadBalancerIPs`)

use std::fmt;
use std::str::FromStr;

/// The default MetalLB namespace.
pub const DEFAULT_METALLB_NAMESPACE: &str = "metallb-system";
/// The default Service annotation of the `empty` implementation.
pub const DEFAULT_EMPTY_IP_ANNOTATION: &str = "cherryservers.com/loadBalancerIPs";

/// A configured load-balancer implementation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LoadBalancerMode {
    /// kube-vip: Service annotation `kube-vip.io/loadbalancerIPs` plus node BGP annotations.
    KubeVip,
    /// MetalLB (v0.13.2+ CRDs) in `namespace`.
    MetalLb {
        namespace: String,
        peer_mode: BgpPeerMode,
    },
    /// No implementation: the IP goes in `ip_annotation`, plus node BGP annotations.
    Empty { ip_annotation: String },
}

/// How MetalLB BGPPeers are managed (`bgp-peer-mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum BgpPeerMode {
    /// One peer per node and region router (the default).
    #[default]
    Native,
    /// One peer per region router, multi-hop (FRR mode rejects duplicate peer addresses).
    Frr,
    /// baton manages no BGPPeers.
    None,
}

/// Why a `loadbalancer` value was rejected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LoadBalancerError {
    #[error("expected <type>://<detail> with type kube-vip, metallb or empty")]
    NotAUrl,
    #[error("unknown load balancer type {0:?} (expected kube-vip, metallb or empty)")]
    UnknownType(String),
    #[error("unknown option {0:?} for this load balancer type")]
    UnknownOption(String),
    #[error("bgp-peer-mode {0:?} is not one of native, frr, none")]
    BadPeerMode(String),
    #[error("invalid MetalLB namespace {0:?} (must be a DNS-1123 label)")]
    BadNamespace(String),
    #[error("ip-annotation must not be empty")]
    EmptyAnnotation,
}

impl FromStr for LoadBalancerMode {
    type Err = LoadBalancerError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (scheme, rest) = s.trim().split_once("://").ok_or(LoadBalancerError::NotAUrl)?;
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let options: Vec<(&str, &str)> = query
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| p.split_once('=').unwrap_or((p, "")))
            .collect();
        match scheme {
            "kube-vip" => {
                if let Some((k, _)) = options.first() {
                    return Err(LoadBalancerError::UnknownOption((*k).to_owned()));
                }
                Ok(Self::KubeVip)
            }
            "metallb" => {
                // metallb:///<ns>/ — the namespace is the path (the host part is empty).
                let namespace = path.trim_matches('/');
                let namespace = if namespace.is_empty() {
                    DEFAULT_METALLB_NAMESPACE
                } else {
                    namespace
                };
                if !crate::names::is_dns1123_label(namespace) {
                    return Err(LoadBalancerError::BadNamespace(namespace.to_owned()));
                }
                let mut peer_mode = BgpPeerMode::default();
                for (k, v) in options {
                    match k {
                        "bgp-peer-mode" => {
                            peer_mode = match v {
                                "native" | "" => BgpPeerMode::Native,
                                "frr" => BgpPeerMode::Frr,
                                "none" => BgpPeerMode::None,
                                other => return Err(LoadBalancerError::BadPeerMode(other.to_owned())),
                            }
                        }
                        other => return Err(LoadBalancerError::UnknownOption(other.to_owned())),
                    }
                }
                Ok(Self::MetalLb {
                    namespace: namespace.to_owned(),
                    peer_mode,
                })
            }
            "empty" => {
                let mut ip_annotation = DEFAULT_EMPTY_IP_ANNOTATION.to_owned();
                for (k, v) in options {
                    match k {
                        "ip-annotation" if v.is_empty() => return Err(LoadBalancerError::EmptyAnnotation),
                        "ip-annotation" => v.clone_into(&mut ip_annotation),
                        other => return Err(LoadBalancerError::UnknownOption(other.to_owned())),
                    }
                }
                Ok(Self::Empty { ip_annotation })
            }
            other => Err(LoadBalancerError::UnknownType(other.to_owned())),
        }
    }
}

impl fmt::Display for LoadBalancerMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::KubeVip => f.write_str("kube-vip://"),
            Self::MetalLb { namespace, peer_mode } => {
                let mode = match peer_mode {
                    BgpPeerMode::Native => "native",
                    BgpPeerMode::Frr => "frr",
                    BgpPeerMode::None => "none",
                };
                write!(f, "metallb:///{namespace}/?bgp-peer-mode={mode}")
            }
            Self::Empty { ip_annotation } => write!(f, "empty://?ip-annotation={ip_annotation}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn metallb(ns: &str, peer_mode: BgpPeerMode) -> LoadBalancerMode {
        LoadBalancerMode::MetalLb {
            namespace: ns.into(),
            peer_mode,
        }
    }

    #[rstest]
    #[case("kube-vip://", LoadBalancerMode::KubeVip)]
    #[case("metallb:///", metallb("metallb-system", BgpPeerMode::Native))]
    #[case("metallb:///metallb-system/", metallb("metallb-system", BgpPeerMode::Native))]
    #[case("metallb:///foonamespace/", metallb("foonamespace", BgpPeerMode::Native))]
    #[case("metallb:///lb/?bgp-peer-mode=frr", metallb("lb", BgpPeerMode::Frr))]
    #[case(
        "metallb:///?bgp-peer-mode=none",
        metallb("metallb-system", BgpPeerMode::None)
    )]
    #[case("empty://", LoadBalancerMode::Empty { ip_annotation: DEFAULT_EMPTY_IP_ANNOTATION.into() })]
    #[case("empty://?ip-annotation=example.com/ips", LoadBalancerMode::Empty { ip_annotation: "example.com/ips".into() })]
    fn parses_the_seed_forms(#[case] input: &str, #[case] want: LoadBalancerMode) {
        assert_eq!(input.parse::<LoadBalancerMode>().unwrap(), want);
        // Display round-trips.
        assert_eq!(want.to_string().parse::<LoadBalancerMode>().unwrap(), want);
    }

    #[rstest]
    #[case("metallb", LoadBalancerError::NotAUrl)]
    #[case("haproxy://", LoadBalancerError::UnknownType("haproxy".into()))]
    #[case("metallb:///ns/?bgp-peer-mode=bird", LoadBalancerError::BadPeerMode("bird".into()))]
    #[case("metallb:///Bad_NS/", LoadBalancerError::BadNamespace("Bad_NS".into()))]
    #[case("metallb:///ns/?peer-mode=frr", LoadBalancerError::UnknownOption("peer-mode".into()))]
    #[case("kube-vip://?x=1", LoadBalancerError::UnknownOption("x".into()))]
    #[case("empty://?ip-annotation=", LoadBalancerError::EmptyAnnotation)]
    fn rejects(#[case] input: &str, #[case] err: LoadBalancerError) {
        assert_eq!(input.parse::<LoadBalancerMode>().unwrap_err(), err);
    }
}
