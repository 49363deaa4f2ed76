//! The Cherry Servers API objects, as the API sends and receives them.
//!
//! One set of types serves both sides: the client deserializes them and the simulator serializes
//! them, so the simulator cannot drift from what the client expects. Field names and optionality
//! follow the payloads the real API sends for IP addresses, servers, projects and regions:
//! nested objects it leaves out are `Option`s, `tags` may be `null`, unknown fields are ignored.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Tags of an IP address or server: a string map, replaced wholesale on update.
pub type Tags = BTreeMap<String, String>;

/// Whether `have` contains every `(key, value)` pair of `wanted`. An empty `wanted` matches
/// nothing: a lookup by no tags would select an arbitrary IP.
pub fn matches_all(have: &Tags, wanted: &Tags) -> bool {
    !wanted.is_empty() && wanted.iter().all(|(k, v)| have.get(k) == Some(v))
}

macro_rules! int_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub u64);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl From<u64> for $name {
            fn from(value: u64) -> Self {
                Self(value)
            }
        }

        impl std::str::FromStr for $name {
            type Err = std::num::ParseIntError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                s.parse().map(Self)
            }
        }
    };
}

int_id!(
    /// A project id (an integer in the API).
    ProjectId
);
int_id!(
    /// A server id (an integer in the API; `cherryservers://<id>` is its provider ID).
    ServerId
);
int_id!(
    /// A region id (an integer in the API).
    RegionId
);

/// An IP address object id: a UUID string in the API.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct IpId(pub String);

impl IpId {
    /// The id as sent in paths.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IpId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for IpId {
    fn from(value: &str) -> Self {
        Self(value.to_owned())
    }
}

impl From<String> for IpId {
    fn from(value: String) -> Self {
        Self(value)
    }
}

/// `{"code": 404, "message": "..."}`: the body of every API error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiErrorBody {
    /// Usually the HTTP status again.
    pub code: i64,
    /// Human-readable text.
    pub message: String,
}

/// BGP facts of a region: the two route servers and their ASN.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RegionBgp {
    /// Route server addresses (two per region).
    #[serde(default)]
    pub hosts: Vec<String>,
    /// The route servers' ASN.
    #[serde(default)]
    pub asn: u32,
}

/// A region (`GET /v1/regions`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Region {
    /// Numeric id.
    pub id: RegionId,
    /// Display name, e.g. `Lithuania` (formerly `EU-Nord-1`).
    #[serde(default)]
    pub name: String,
    /// The canonical input form, e.g. `LT-Siauliai`.
    #[serde(default)]
    pub slug: String,
    /// ISO country code.
    #[serde(default)]
    pub region_iso_2: String,
    /// Free text, e.g. `Lithuania, Šiauliai`.
    #[serde(default)]
    pub location: String,
    /// `/regions/<id>`.
    #[serde(default)]
    pub href: String,
    /// BGP route servers of the region.
    #[serde(default)]
    pub bgp: RegionBgp,
}

/// Project-level BGP.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ProjectBgp {
    /// Whether Local BGP is enabled on the project.
    #[serde(default)]
    pub enabled: bool,
    /// The project's ASN (0 until enabled).
    #[serde(default)]
    pub local_asn: u32,
}

/// A project (`GET /v1/projects/{id}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Project {
    /// Numeric id.
    pub id: ProjectId,
    /// Display name.
    #[serde(default)]
    pub name: String,
    /// BGP state.
    #[serde(default)]
    pub bgp: ProjectBgp,
    /// `/projects/<id>`.
    #[serde(default)]
    pub href: String,
}

/// Server-level BGP state.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ServerBgp {
    /// Whether BGP is enabled on the server.
    #[serde(default)]
    pub enabled: bool,
    /// Whether BGP can be enabled.
    #[serde(default)]
    pub available: bool,
    /// Session state text (`Disabled`, `Established`, ...).
    #[serde(default)]
    pub status: String,
    /// Route servers configured.
    #[serde(default)]
    pub routers: u32,
    /// Route servers with an established session.
    #[serde(default)]
    pub connected: u32,
    /// Prefix limit.
    #[serde(default)]
    pub limit: u32,
    /// Prefixes announced.
    #[serde(default)]
    pub active: u32,
    /// Announced routes (shape undocumented; kept opaque).
    #[serde(default)]
    pub routes: Vec<serde_json::Value>,
    /// Last change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated: Option<String>,
}

/// A server's plan (hardware type).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Plan {
    /// Numeric id.
    #[serde(default)]
    pub id: u64,
    /// The instance type, e.g. `amd-ryzen-9950x`.
    #[serde(default)]
    pub slug: String,
    /// Display name.
    #[serde(default)]
    pub name: String,
    /// `baremetal`, `vps`, ...
    #[serde(default, rename = "type")]
    pub plan_type: String,
}

/// A server summary as nested in an IP's `targeted_to` / `assigned_to`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerSummary {
    /// The server id; `0` means "not assigned" in some payloads.
    pub id: ServerId,
    /// Plan-like display name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `/servers/<id>`.
    #[serde(default)]
    pub href: String,
    /// Hostname.
    #[serde(default)]
    pub hostname: String,
    /// OS image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Region.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<Region>,
    /// `active`, `inactive`, ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Spot instance flag.
    #[serde(default)]
    pub spot_instance: bool,
    /// Project summary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<Project>,
    /// BGP state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bgp: Option<ServerBgp>,
}

/// A server (`GET /v1/servers/{id}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Server {
    /// Numeric id.
    pub id: ServerId,
    /// Plan-like display name.
    #[serde(default)]
    pub name: String,
    /// `/servers/<id>`.
    #[serde(default)]
    pub href: String,
    /// Hostname (matches the Kubernetes node name in the CCM's fallback lookup).
    #[serde(default)]
    pub hostname: String,
    /// OS image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Spot instance flag.
    #[serde(default)]
    pub spot_instance: bool,
    /// Region (with its BGP route servers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<Region>,
    /// `active`, `inactive`, ...
    #[serde(default)]
    pub state: String,
    /// `deployed`, ...
    #[serde(default)]
    pub status: String,
    /// BGP state.
    #[serde(default)]
    pub bgp: ServerBgp,
    /// Plan.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<Plan>,
    /// The server's IPs. Absent from `PUT` responses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ip_addresses: Vec<IpAddress>,
    /// Tags.
    #[serde(default, deserialize_with = "null_as_default")]
    pub tags: Tags,
    /// Project summary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<Project>,
    /// Creation time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
}

impl Server {
    /// The provider ID Kubernetes uses for this server.
    pub fn provider_id(&self) -> String {
        format!("cherryservers://{}", self.id)
    }

    /// The first IPv4 address of the given type.
    pub fn first_ipv4(&self, kind: &IpType) -> Option<IpAddr> {
        self.ip_addresses
            .iter()
            .find(|ip| &ip.ip_type == kind && ip.address.is_ipv4())
            .map(|ip| ip.address)
    }
}

/// The kind of an IP address object.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IpType {
    /// A Floating IP (movable between servers).
    FloatingIp,
    /// A server's public address.
    PrimaryIp,
    /// A server's private address.
    PrivateIp,
    /// A routed subnet.
    Subnet,
    /// A type this version does not know.
    #[serde(other)]
    Unknown,
}

/// The project's IP list as the shared cache hands it out: each IP behind its own `Arc`, so that
/// recording one write in a list that readers still hold copies pointers, not every IP (with
/// 10,000 FIPs, copying the IPs on every FIP created was quadratic).
pub type IpList = std::sync::Arc<Vec<std::sync::Arc<IpAddress>>>;

/// The IPs of a list held either way: an [`IpList`]'s `Arc`s or plain IPs (pure code takes both).
pub fn each_ip<B: std::borrow::Borrow<IpAddress>>(ips: &[B]) -> impl Iterator<Item = &IpAddress> {
    ips.iter().map(<B as std::borrow::Borrow<IpAddress>>::borrow)
}

/// An IP address object (`GET /v1/ips/{id}`). The large optional parts are boxed: a list of a
/// few thousand of these is kept in memory (the IP cache), and most are FIPs without them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpAddress {
    /// UUID.
    pub id: IpId,
    /// The address itself.
    pub address: IpAddr,
    /// 4 or 6.
    #[serde(default)]
    pub address_family: u8,
    /// `x.x.x.x/32` for FIPs, the network for primary/private IPs.
    #[serde(default)]
    pub cidr: String,
    /// Gateway (primary/private IPs only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// The kind.
    #[serde(rename = "type")]
    pub ip_type: IpType,
    /// Region.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<Box<Region>>,
    /// For a routed FIP: the IP object it is routed to (the target server's primary IP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routed_to: Option<Box<Self>>,
    /// The server a primary/private IP belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assigned_to: Option<Box<ServerSummary>>,
    /// For a routed FIP: the server it is targeted to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub targeted_to: Option<Box<ServerSummary>>,
    /// Project summary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<Project>,
    /// Reverse DNS (returned with a trailing dot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ptr_record: Option<String>,
    /// `<name>.cloud.cherryservers.net.`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub a_record: Option<String>,
    /// Tags (`null` reads as empty).
    #[serde(default, deserialize_with = "null_as_default")]
    pub tags: Tags,
    /// Deprecated upstream; always `false`.
    #[serde(default)]
    pub ddos_scrubbing: bool,
    /// `/ips/<uuid>`.
    #[serde(default)]
    pub href: String,
    /// VLAN of a private IP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan_id: Option<u32>,
}

impl IpAddress {
    /// The server this IP is targeted to, if any. A `targeted_to` with id 0 means "none"
    /// (the CCM reads it that way).
    pub fn target(&self) -> Option<ServerId> {
        self.targeted_to.as_ref().map(|s| s.id).filter(|id| id.0 != 0)
    }

    /// Whether every `(key, value)` of `wanted` is among this IP's tags.
    pub fn has_tags(&self, wanted: &Tags) -> bool {
        matches_all(&self.tags, wanted)
    }
}

/// `targeted_to` as sent in a request: the API accepts a server id as a string or a number;
/// `0` / `"0"` unassigns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetedTo(pub Option<ServerId>);

impl TargetedTo {
    /// Unassign.
    pub const NONE: Self = Self(None);
}

impl Serialize for TargetedTo {
    // cherrygo sends the id as a string; so do we.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&self.0.map_or(0, |s| s.0))
    }
}

impl<'de> Deserialize<'de> for TargetedTo {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Num(u64),
            Str(String),
        }
        let id = match Raw::deserialize(deserializer)? {
            Raw::Num(n) => n,
            Raw::Str(s) => s.trim().parse::<u64>().map_err(|_| {
                serde::de::Error::custom(format!("targeted_to must be a server id, got {s:?}"))
            })?,
        };
        Ok(Self((id != 0).then_some(ServerId(id))))
    }
}

/// `POST /v1/projects/{id}/ips`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CreateIpRequest {
    /// Region slug (the simulator also accepts the legacy name and the id).
    pub region: String,
    /// Tags; creation is idempotent by these. `null` (the official Python SDK sends it when
    /// no tags are given) reads as none.
    #[serde(
        default,
        skip_serializing_if = "Tags::is_empty",
        deserialize_with = "null_as_default"
    )]
    pub tags: Tags,
    /// Optionally target a server at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub targeted_to: Option<TargetedTo>,
    /// Reverse DNS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ptr_record: Option<String>,
    /// A record name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub a_record: Option<String>,
}

/// `PUT /v1/ips/{id}`: every field optional; `tags` replaces the whole map.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct UpdateIpRequest {
    /// Retarget (`Some(server)`) or unassign (`TargetedTo::NONE`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub targeted_to: Option<TargetedTo>,
    /// Route to another IP object (primary IP or subnet) by UUID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routed_to: Option<IpId>,
    /// New tags (wholesale replacement).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<Tags>,
    /// Reverse DNS. Never resend an unchanged value: the API answers 500.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ptr_record: Option<String>,
    /// A record name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub a_record: Option<String>,
}

/// `PUT /v1/projects/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct UpdateProjectRequest {
    /// Name (the CCM resends the current one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Enable/disable Local BGP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bgp: Option<bool>,
}

/// `PUT /v1/servers/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct UpdateServerRequest {
    /// Display name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Hostname.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// Tags (the CCM resends the existing ones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<Tags>,
    /// Enable/disable BGP on the server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bgp: Option<bool>,
}

fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

#[cfg(test)]
mod tests;
