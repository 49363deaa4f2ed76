//! The Hetzner Cloud API objects baton uses, as the API sends and receives them
//! (`api.hetzner.cloud/v1`: Floating IPs, actions, servers, locations, errors, pagination).
//!
//! As with Cherry's [`crate::model`], one set of types serves both sides: the client
//! deserializes them and the simulator (`baton sim --cloud hetzner`) serializes them. Field
//! names follow Hetzner's reference and the official Go client's `hcloud/schema` package;
//! unknown fields are ignored, nullable fields are `Option`s.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Labels of a Floating IP or server: replaced as a whole by `PUT`.
pub type Labels = BTreeMap<String, String>;

/// A location (`GET /v1/locations`, and nested as a Floating IP's `home_location` or a server's
/// `location`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Location {
    /// Numeric id.
    pub id: u64,
    /// Short name, e.g. `fsn1` (the input form of `home_location`).
    pub name: String,
    /// e.g. `Falkenstein DC Park 1`.
    #[serde(default)]
    pub description: String,
    /// ISO country code.
    #[serde(default)]
    pub country: String,
    /// City.
    #[serde(default)]
    pub city: String,
    /// Latitude.
    #[serde(default)]
    pub latitude: f64,
    /// Longitude.
    #[serde(default)]
    pub longitude: f64,
    /// e.g. `eu-central`: a Floating IP can be assigned to any server of its home location's zone.
    #[serde(default)]
    pub network_zone: String,
}

/// `protection` of a Floating IP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct FloatingIpProtection {
    /// Delete protection.
    #[serde(default)]
    pub delete: bool,
}

/// One reverse DNS entry of a Floating IP.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DnsPtr {
    /// The address.
    pub ip: String,
    /// The PTR name.
    pub dns_ptr: String,
}

/// A Floating IP (`GET /v1/floating_ips/{id}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FloatingIp {
    /// Numeric id.
    pub id: u64,
    /// Unique name in the project.
    #[serde(default)]
    pub name: String,
    /// Free text (nullable).
    #[serde(default)]
    pub description: Option<String>,
    /// The address; an IPv6 Floating IP is a /64 and reads `2001:db8:1::/64`.
    pub ip: String,
    /// `ipv4` or `ipv6`.
    #[serde(rename = "type")]
    pub ip_type: String,
    /// The server it is assigned to (null: unassigned).
    #[serde(default)]
    pub server: Option<u64>,
    /// Reverse DNS entries.
    #[serde(default)]
    pub dns_ptr: Vec<DnsPtr>,
    /// The location it is homed in.
    pub home_location: Location,
    /// Blocked by Hetzner (abuse).
    #[serde(default)]
    pub blocked: bool,
    /// Protection.
    #[serde(default)]
    pub protection: FloatingIpProtection,
    /// Labels.
    #[serde(default)]
    pub labels: Labels,
    /// Creation time (RFC 3339).
    #[serde(default)]
    pub created: String,
}

/// A resource an action works on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActionResource {
    /// Its id.
    pub id: u64,
    /// `floating_ip`, `server`, ...
    #[serde(rename = "type")]
    pub resource_type: String,
}

/// Why an action ended in `error`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActionError {
    /// Machine-readable code.
    pub code: String,
    /// Human-readable text.
    pub message: String,
}

/// An asynchronous action (`GET /v1/actions/{id}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Action {
    /// Numeric id.
    pub id: u64,
    /// e.g. `assign_floating_ip`, `unassign_floating_ip`.
    pub command: String,
    /// `running`, `success` or `error`.
    pub status: String,
    /// 0–100.
    #[serde(default)]
    pub progress: u8,
    /// Start time (RFC 3339).
    pub started: String,
    /// End time (RFC 3339); null while running.
    #[serde(default)]
    pub finished: Option<String>,
    /// What it works on.
    #[serde(default)]
    pub resources: Vec<ActionResource>,
    /// Set when `status` is `error`.
    #[serde(default)]
    pub error: Option<ActionError>,
}

/// `status` of a running action.
pub const ACTION_RUNNING: &str = "running";
/// `status` of an action that succeeded.
pub const ACTION_SUCCESS: &str = "success";
/// `status` of an action that failed (see its `error`).
pub const ACTION_ERROR: &str = "error";

/// A server's public IPv4 address.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ServerPublicIpv4 {
    /// Primary IP id (null on old servers).
    #[serde(default)]
    pub id: Option<u64>,
    /// The address.
    pub ip: String,
    /// Blocked by Hetzner.
    #[serde(default)]
    pub blocked: bool,
    /// Reverse DNS name.
    #[serde(default)]
    pub dns_ptr: String,
}

/// A server's public IPv6 network.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ServerPublicIpv6 {
    /// Primary IP id.
    #[serde(default)]
    pub id: Option<u64>,
    /// The /64.
    pub ip: String,
    /// Blocked by Hetzner.
    #[serde(default)]
    pub blocked: bool,
    /// Reverse DNS entries.
    #[serde(default)]
    pub dns_ptr: Vec<DnsPtr>,
}

/// A server's public network.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ServerPublicNet {
    /// Public IPv4 (null without one).
    #[serde(default)]
    pub ipv4: Option<ServerPublicIpv4>,
    /// Public IPv6 (null without one).
    #[serde(default)]
    pub ipv6: Option<ServerPublicIpv6>,
    /// Ids of the Floating IPs assigned to it.
    #[serde(default)]
    pub floating_ips: Vec<u64>,
    /// Firewalls applied (kept opaque).
    #[serde(default)]
    pub firewalls: Vec<serde_json::Value>,
}

/// A server's address in a private network.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerPrivateNet {
    /// The network id.
    pub network: u64,
    /// The address.
    pub ip: String,
    /// Alias addresses.
    #[serde(default)]
    pub alias_ips: Vec<String>,
    /// MAC address.
    #[serde(default)]
    pub mac_address: String,
}

/// A server type (kept to what baton shows).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ServerType {
    /// Numeric id.
    #[serde(default)]
    pub id: u64,
    /// e.g. `cx22`.
    #[serde(default)]
    pub name: String,
    /// Description.
    #[serde(default)]
    pub description: String,
}

/// A server (`GET /v1/servers/{id}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HetznerServer {
    /// Numeric id (`hcloud://<id>` is its provider ID).
    pub id: u64,
    /// Name (the Kubernetes node name in the CCM's lookup by name).
    pub name: String,
    /// `running`, `off`, `initializing`, `starting`, `stopping`, `deleting`, ...
    pub status: String,
    /// Creation time (RFC 3339).
    #[serde(default)]
    pub created: String,
    /// Public network.
    #[serde(default)]
    pub public_net: ServerPublicNet,
    /// Private networks.
    #[serde(default)]
    pub private_net: Vec<ServerPrivateNet>,
    /// Its type.
    #[serde(default)]
    pub server_type: ServerType,
    /// Where it runs.
    pub location: Location,
    /// Labels.
    #[serde(default)]
    pub labels: Labels,
}

/// `details` of an `invalid_input` error: one entry per rejected field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InvalidField {
    /// The field.
    pub name: String,
    /// What is wrong with it.
    #[serde(default)]
    pub messages: Vec<String>,
}

/// The `error` object of every error answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// Machine-readable code, e.g. `locked`, `not_found`, `rate_limit_exceeded`.
    pub code: String,
    /// Human-readable text.
    pub message: String,
    /// Code-specific details (`fields` for `invalid_input`); null otherwise.
    #[serde(default)]
    pub details: Option<serde_json::Value>,
}

/// `{"error": {...}}`: the body of every error answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// `meta.pagination` of a list answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pagination {
    /// This page (from 1).
    pub page: u64,
    /// Entries per page (25 by default, at most 50).
    pub per_page: u64,
    /// The previous page, null on the first.
    #[serde(default)]
    pub previous_page: Option<u64>,
    /// The next page, null on the last.
    #[serde(default)]
    pub next_page: Option<u64>,
    /// The last page.
    #[serde(default)]
    pub last_page: Option<u64>,
    /// Entries in all pages.
    #[serde(default)]
    pub total_entries: Option<u64>,
}

/// `meta` of a list answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    /// Pagination.
    pub pagination: Pagination,
}

/// `GET /v1/floating_ips`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FloatingIpList {
    /// This page's Floating IPs.
    pub floating_ips: Vec<FloatingIp>,
    /// Pagination.
    pub meta: Meta,
}

/// `GET /v1/servers`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerList {
    /// This page's servers.
    pub servers: Vec<HetznerServer>,
    /// Pagination.
    pub meta: Meta,
}

/// `GET /v1/locations`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LocationList {
    /// The locations.
    pub locations: Vec<Location>,
    /// Pagination (sent by the API on every list).
    #[serde(default)]
    pub meta: Option<Meta>,
}

/// `GET /v1/actions?id=...` (the only form left since 2025-01-30) and
/// `GET /v1/floating_ips/{id}/actions`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActionList {
    /// The actions asked for (an unknown id is left out).
    pub actions: Vec<Action>,
    /// Pagination.
    #[serde(default)]
    pub meta: Option<Meta>,
}

/// `{"floating_ip": {...}}`: `GET` and `PUT /v1/floating_ips/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FloatingIpAnswer {
    /// The Floating IP.
    pub floating_ip: FloatingIp,
}

/// `POST /v1/floating_ips`: the new Floating IP, and the assign action when it was created with a
/// `server`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreateFloatingIpAnswer {
    /// The Floating IP.
    pub floating_ip: FloatingIp,
    /// The assign action (null without `server`).
    #[serde(default)]
    pub action: Option<Action>,
}

/// `{"action": {...}}`: every action endpoint and `GET /v1/actions/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActionAnswer {
    /// The action.
    pub action: Action,
}

/// `{"server": {...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerAnswer {
    /// The server.
    pub server: HetznerServer,
}

/// `POST /v1/floating_ips`: `home_location` or `server` is required.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CreateFloatingIpRequest {
    /// `ipv4` or `ipv6`.
    #[serde(rename = "type")]
    pub ip_type: String,
    /// Location name; required without `server`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub home_location: Option<String>,
    /// Assign at once to this server (the API then also answers with the assign action).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<u64>,
    /// Free text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Unique name in the project.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<Labels>,
}

/// `PUT /v1/floating_ips/{id}`: labels replace the whole set.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct UpdateFloatingIpRequest {
    /// Free text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Labels (all of them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<Labels>,
    /// Name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// `POST /v1/floating_ips/{id}/actions/assign`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssignRequest {
    /// The server to route the Floating IP to.
    pub server: u64,
}

/// The rate-limit headers of every answer.
pub mod headers {
    /// The bucket's size (3,600 by default).
    pub const LIMIT: &str = "ratelimit-limit";
    /// Requests left in the bucket.
    pub const REMAINING: &str = "ratelimit-remaining";
    /// Unix time (seconds) at which the bucket is full again.
    pub const RESET: &str = "ratelimit-reset";
}

/// The error codes baton acts on (Hetzner's reference, "Errors").
pub mod codes {
    /// 409: the resource changed meanwhile; retry.
    pub const CONFLICT: &str = "conflict";
    /// 423: another action runs on the resource; retry later.
    pub const LOCKED: &str = "locked";
    /// 429.
    pub const RATE_LIMIT_EXCEEDED: &str = "rate_limit_exceeded";
    /// 404.
    pub const NOT_FOUND: &str = "not_found";
    /// 422: an assign of a Floating IP that is assigned already (where the API demands an unassign
    /// first).
    pub const FLOATING_IP_ASSIGNED: &str = "floating_ip_assigned";
    /// 400.
    pub const INVALID_INPUT: &str = "invalid_input";
    /// 401.
    pub const UNAUTHORIZED: &str = "unauthorized";
    /// 403.
    pub const FORBIDDEN: &str = "forbidden";
    /// 403: a read-only token asked to write.
    pub const TOKEN_READONLY: &str = "token_readonly";
    /// 423: delete protection.
    pub const PROTECTED: &str = "protected";
    /// 422.
    pub const UNIQUENESS_ERROR: &str = "uniqueness_error";
    /// 5xx codes: each worth a retry.
    pub const SERVER_ERRORS: [&str; 6] = [
        "server_error",
        "service_error",
        "maintenance",
        "timeout",
        "bad_gateway",
        "unavailable",
    ];
}
