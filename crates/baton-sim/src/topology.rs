//! What the simulator starts with: a project, regions, servers and pre-reserved FIPs.
//! Loaded from YAML or JSON (`--topology FILE`); [`Topology::default`] is the lab's topology.

use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

use baton_cloud::model::Tags;

/// A whole simulated account.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Topology {
    /// The bearer token the API accepts.
    pub api_key: String,
    /// The project.
    pub project: TopoProject,
    /// Regions.
    pub regions: Vec<TopoRegion>,
    /// Servers, each with a primary (public) and optionally a private IP.
    pub servers: Vec<TopoServer>,
    /// FIPs that exist from the start (e.g. the installer's reservations).
    pub floating_ips: Vec<TopoFip>,
    /// Where new FIPs are allocated (IPv4 CIDR).
    pub fip_pool: String,
    /// The network of the servers' primary IPs (their `cidr`; gateway = first address).
    pub public_network: String,
    /// The network of the servers' private IPs.
    pub private_network: String,
    /// TCP ports spliced from a targeted FIP to its server's primary IP: an explicit opt-in for
    /// labs without nodes (a node namespace per server), where no node could accept a routed
    /// FIP. Empty by default: with lab nodes the FIP is routed ([`crate::SimBuilder::route_fips`]).
    pub forward_ports: Vec<u16>,
}

/// The project.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TopoProject {
    /// Numeric id.
    pub id: u64,
    /// Name.
    pub name: String,
    /// Whether Local BGP starts enabled.
    pub bgp_enabled: bool,
    /// The ASN the project gets when BGP is enabled (private range; Cherry's is unpublished).
    pub local_asn: u32,
}

/// A region.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TopoRegion {
    /// Numeric id.
    pub id: u64,
    /// Canonical input form (`LT-Siauliai`).
    pub slug: String,
    /// Display name (`Lithuania`).
    pub name: String,
    /// Older names the API still accepts as input (`EU-Nord-1`, `eu_nord_1`).
    pub legacy_names: Vec<String>,
    /// ISO code.
    pub region_iso_2: String,
    /// Free text.
    pub location: String,
    /// BGP route servers.
    pub bgp_hosts: Vec<String>,
    /// Their ASN.
    pub bgp_asn: u32,
}

/// A server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TopoServer {
    /// Numeric id.
    pub id: u64,
    /// Hostname (also the Kubernetes node name in the lab).
    pub hostname: String,
    /// Region slug.
    pub region: String,
    /// Public address (type `primary-ip`); FIP traffic is forwarded here.
    pub primary_ip: Ipv4Addr,
    /// Private address (type `private-ip`).
    pub private_ip: Option<Ipv4Addr>,
    /// Plan slug.
    pub plan: String,
    /// `active` or `inactive`.
    pub state: String,
    /// Tags.
    pub tags: Tags,
    /// Whether BGP starts enabled.
    pub bgp_enabled: bool,
}

/// A FIP present from the start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TopoFip {
    /// UUID (generated when absent).
    pub id: Option<String>,
    /// Address (allocated from the pool when absent).
    pub address: Option<Ipv4Addr>,
    /// Region slug.
    pub region: String,
    /// Tags.
    pub tags: Tags,
    /// Server it is targeted to.
    pub targeted_to: Option<u64>,
}

impl Default for TopoProject {
    fn default() -> Self {
        Self {
            id: 123_456,
            name: "baton-lab".into(),
            bgp_enabled: false,
            local_asn: 65_000,
        }
    }
}

impl Default for TopoRegion {
    fn default() -> Self {
        // The values the real API returns for its Lithuanian region (id 1, slug `LT-Siauliai`,
        // legacy names `EU-Nord-1` / `eu_nord_1`, BGP ASN 16125); only the BGP route
        // servers are moved into the lab's public range.
        Self {
            id: 1,
            slug: "LT-Siauliai".into(),
            name: "Lithuania".into(),
            legacy_names: vec!["EU-Nord-1".into(), "eu_nord_1".into()],
            region_iso_2: "LT".into(),
            location: "Lithuania, Šiauliai".into(),
            bgp_hosts: vec!["198.51.100.2".into(), "198.51.100.3".into()],
            bgp_asn: 16_125,
        }
    }
}

impl Default for TopoServer {
    fn default() -> Self {
        Self {
            id: 0,
            hostname: String::new(),
            region: "LT-Siauliai".into(),
            primary_ip: Ipv4Addr::UNSPECIFIED,
            private_ip: None,
            plan: "amd-ryzen-9950x".into(),
            state: "active".into(),
            tags: Tags::new(),
            bgp_enabled: false,
        }
    }
}

impl Default for TopoFip {
    fn default() -> Self {
        Self {
            id: None,
            address: None,
            region: "LT-Siauliai".into(),
            tags: Tags::new(),
            targeted_to: None,
        }
    }
}

impl Default for Topology {
    /// The lab: project 123456, key `sim-token`, region `LT-Siauliai`, a bootstrap server, three
    /// control-plane servers and two workers (primary IPs in 198.51.100.0/24, private IPs in
    /// 192.0.2.0/24), FIPs from 203.0.113.0/24, nothing spliced.
    fn default() -> Self {
        let server = |id: u64, hostname: &str, host: u8, role: &str| TopoServer {
            id,
            hostname: hostname.into(),
            primary_ip: Ipv4Addr::new(198, 51, 100, host),
            private_ip: Some(Ipv4Addr::new(192, 0, 2, host)),
            tags: Tags::from([("role".to_owned(), role.to_owned())]),
            ..TopoServer::default()
        };
        Self {
            api_key: "sim-token".into(),
            project: TopoProject::default(),
            regions: vec![TopoRegion::default()],
            servers: vec![
                server(600_100, "bootstrap", 10, "bootstrap"),
                server(600_101, "cp-0", 11, "control-plane"),
                server(600_102, "cp-1", 12, "control-plane"),
                server(600_103, "cp-2", 13, "control-plane"),
                server(600_111, "worker-0", 21, "worker"),
                server(600_112, "worker-1", 22, "worker"),
            ],
            floating_ips: Vec::new(),
            fip_pool: "203.0.113.0/24".into(),
            public_network: "198.51.100.0/24".into(),
            private_network: "192.0.2.0/24".into(),
            forward_ports: Vec::new(),
        }
    }
}

impl Topology {
    /// Parses YAML or JSON.
    pub fn from_text(text: &str) -> Result<Self, String> {
        serde_yaml_ng::from_str(text).map_err(|e| e.to_string())
    }
}

/// An IPv4 network, `a.b.c.d/len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ipv4Net {
    pub(crate) network: Ipv4Addr,
    pub(crate) prefix: u8,
}

impl Ipv4Net {
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let (addr, len) = text
            .split_once('/')
            .ok_or_else(|| format!("{text:?} is not a CIDR"))?;
        let addr: Ipv4Addr = addr.parse().map_err(|e| format!("{text:?}: {e}"))?;
        let prefix: u8 = len.parse().map_err(|e| format!("{text:?}: {e}"))?;
        if prefix > 32 {
            return Err(format!("{text:?}: prefix longer than 32"));
        }
        let mask = if prefix == 0 { 0 } else { u32::MAX << (32 - prefix) };
        Ok(Self {
            network: Ipv4Addr::from(u32::from(addr) & mask),
            prefix,
        })
    }

    /// Usable host addresses (network and broadcast excluded below /31).
    pub(crate) fn hosts(self) -> impl Iterator<Item = Ipv4Addr> {
        let base = u32::from(self.network);
        let size: u64 = 1u64 << (32 - u32::from(self.prefix));
        let (first, last) = if size <= 2 { (0, size) } else { (1, size - 1) };
        (first..last).filter_map(move |i| u32::try_from(i).ok().map(|i| Ipv4Addr::from(base + i)))
    }

    pub(crate) fn first_host(self) -> Ipv4Addr {
        self.hosts().next().unwrap_or(self.network)
    }
}

impl std::fmt::Display for Ipv4Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}
