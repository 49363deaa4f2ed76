//! The Hetzner dialect's state and API semantics, without HTTP: Floating IPs, the servers and
//! locations of the topology, and the assign/unassign actions. Each operation takes the parsed
//! request and the wall-clock time and returns the object the API would send back, or a
//! [`HetznerErr`] (status, code, message, details).
//!
//! ```text
//!  POST .../actions/assign ─► assign() ─► Action { running }     (the FIP's `server` unchanged)
//!                                               │ after the action time (the HTTP layer's timer)
//!  finish_action() ─► success: FIP.server = S; the route follows  │ error: the FIP stays put
//! ```
//!
//! The JSON objects are `baton-cloud`'s [`baton_cloud::hetzner::model`]: the simulator and the
//! client cannot disagree on a payload.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};

use baton_cloud::hetzner::model::{
    Action, ActionError, ActionResource, CreateFloatingIpRequest, DnsPtr, FloatingIp, FloatingIpProtection,
    HetznerServer, Labels, Location, ServerPrivateNet, ServerPublicIpv4, ServerPublicIpv6, ServerPublicNet,
    ServerType, UpdateFloatingIpRequest, codes,
};
use baton_cloud::model::IpAddress;

use super::Reassign;
use super::labels::{Selector, check_labels};
use crate::topology::{Ipv4Net, Topology};
use crate::world::TagCensus;

/// An API error of the Hetzner dialect: `{"error": {"code", "message", "details"}}` with a status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HetznerErr {
    pub(crate) status: u16,
    pub(crate) code: &'static str,
    pub(crate) message: String,
    pub(crate) details: Option<serde_json::Value>,
}

impl HetznerErr {
    pub(crate) fn new(status: u16, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            details: None,
        }
    }

    /// 404 `not_found`: `"floating_ip with ID '7' not found"`.
    pub(crate) fn not_found(what: &str, id: impl std::fmt::Display) -> Self {
        Self::new(404, codes::NOT_FOUND, format!("{what} with ID '{id}' not found"))
    }

    /// 422 `invalid_input` naming the field (the status of Hetzner's error table, and what the
    /// API answers; `details.fields[]` as hcloud-go reads it).
    pub(crate) fn invalid(field: &str, messages: Vec<String>) -> Self {
        let messages = serde_json::Value::from(messages);
        Self {
            details: Some(serde_json::json!({
                "fields": [{ "name": field, "messages": messages }]
            })),
            ..Self::new(
                422,
                codes::INVALID_INPUT,
                format!("invalid input in field '{field}'"),
            )
        }
    }

    /// 409 `uniqueness_error` naming the field.
    fn uniqueness(field: &str) -> Self {
        Self {
            details: Some(serde_json::json!({ "fields": [{ "name": field }] })),
            ..Self::new(409, codes::UNIQUENESS_ERROR, format!("{field} is already used"))
        }
    }

    /// 423 `locked`: an action runs on the Floating IP.
    fn locked(fip: u64) -> Self {
        Self::new(
            423,
            codes::LOCKED,
            format!("floating_ip with ID '{fip}' is locked: another action is running"),
        )
    }
}

type Res<T> = Result<T, HetznerErr>;

/// One of Hetzner's locations: id, name, description, country, city, latitude, longitude,
/// network zone.
struct Place(
    u64,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    f64,
    f64,
    &'static str,
);

/// Hetzner's locations, as `GET /v1/locations` lists them.
const LOCATIONS: [Place; 6] = [
    Place(
        1,
        "fsn1",
        "Falkenstein DC Park 1",
        "DE",
        "Falkenstein",
        50.476_12,
        12.370_071,
        "eu-central",
    ),
    Place(
        2,
        "nbg1",
        "Nuremberg DC Park 1",
        "DE",
        "Nuremberg",
        49.452_102,
        11.076_665,
        "eu-central",
    ),
    Place(
        3,
        "hel1",
        "Helsinki DC Park 1",
        "FI",
        "Helsinki",
        60.169_855,
        24.938_379,
        "eu-central",
    ),
    Place(
        4,
        "ash",
        "Ashburn, VA",
        "US",
        "Ashburn, VA",
        39.045_821,
        -77.487_073,
        "us-east",
    ),
    Place(
        5,
        "hil",
        "Hillsboro, OR",
        "US",
        "Hillsboro, OR",
        45.542_22,
        -122.951_84,
        "us-west",
    ),
    Place(
        6,
        "sin",
        "Singapore",
        "SG",
        "Singapore",
        1.283_333,
        103.833_333,
        "ap-southeast",
    ),
];

fn locations() -> Vec<Location> {
    LOCATIONS
        .iter()
        .map(
            |&Place(id, name, description, country, city, latitude, longitude, zone)| Location {
                id,
                name: name.into(),
                description: description.into(),
                country: country.into(),
                city: city.into(),
                latitude,
                longitude,
                network_zone: zone.into(),
            },
        )
        .collect()
}

/// How many finished actions are kept (the oldest go first).
const ACTIONS_KEPT: usize = 10_000;

/// The private network every server of the topology is attached to.
const PRIVATE_NETWORK_ID: u64 = 1;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ServerRec {
    id: u64,
    name: String,
    location: String,
    status: String,
    server_type: String,
    primary_ip: Ipv4Addr,
    private_ip: Option<Ipv4Addr>,
    labels: Labels,
    created: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct FipRec {
    id: u64,
    name: String,
    description: Option<String>,
    ip: IpAddr,
    home_location: String,
    server: Option<u64>,
    labels: Labels,
    protection: FloatingIpProtection,
    created: String,
}

/// What an action does to the world when it succeeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Effect {
    Assign { fip: u64, server: u64 },
    Unassign { fip: u64 },
}

impl Effect {
    fn fip(self) -> u64 {
        match self {
            Self::Assign { fip, .. } | Self::Unassign { fip } => fip,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ActionRec {
    action: Action,
    /// `None`: the action had its effect when it was created (`change_protection`).
    effect: Option<Effect>,
    /// Decided when the action starts: it ends in `error` and leaves the world as it was.
    fails: bool,
}

/// A Floating IP list's filters (`label_selector`, `name`).
#[derive(Debug, Clone, Default)]
pub(crate) struct FipFilter {
    pub(crate) selector: Selector,
    pub(crate) name: Option<String>,
}

/// A server list's filters (`label_selector`, `name`, `status`).
#[derive(Debug, Clone, Default)]
pub(crate) struct ServerFilter {
    pub(crate) selector: Selector,
    pub(crate) name: Option<String>,
    pub(crate) status: Vec<String>,
}

/// A wall-clock time as Hetzner writes it: RFC 3339 in UTC, `2025-01-30T12:00:00+00:00`.
pub(crate) fn stamp(unix_secs: u64) -> String {
    let days = unix_secs / 86_400;
    let secs = unix_secs % 86_400;
    // Days to a civil date (H. Hinnant's algorithm, for days since 1970-01-01 ≥ 0).
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}+00:00",
        secs / 3_600,
        secs / 60 % 60,
        secs % 60
    )
}

/// `static.<ip>.clients.your-server.de`: the reverse name Hetzner gives its addresses.
fn default_ptr(ip: IpAddr) -> String {
    format!("static.{ip}.clients.your-server.de")
}

/// Everything the Hetzner dialect knows; serialized as the `--state` file, with
/// `"cloud": "hetzner"` so that it is not taken for a Cherry world.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct HetznerWorld {
    /// Always `hetzner`.
    cloud: String,
    pub(crate) api_key: String,
    locations: Vec<Location>,
    servers: Vec<ServerRec>,
    fips: Vec<FipRec>,
    actions: VecDeque<ActionRec>,
    fip_pool: String,
    pub(crate) forward_ports: Vec<u16>,
    next_fip_id: u64,
    next_action_id: u64,
    /// How many FIPs carry each label set, now and at most (duplicates).
    #[serde(skip)]
    census: TagCensus,
}

/// The Hetzner location a topology region becomes: itself when its slug is a location's name
/// (`fsn1`), else the one at its position among the topology's regions (fsn1, nbg1, hel1, ash,
/// hil, sin, then fsn1 again).
fn location_of_region(topo: &Topology, region: &str) -> Option<&'static str> {
    if let Some(l) = LOCATIONS.iter().find(|l| l.1 == region) {
        return Some(l.1);
    }
    let index = topo
        .regions
        .iter()
        .position(|r| r.slug == region || r.name == region || r.legacy_names.iter().any(|n| n == region))?;
    Some(LOCATIONS[index % LOCATIONS.len()].1)
}

/// The server status a topology state reads as: Cherry's `active`/`inactive` become
/// `running`/`off`; a Hetzner status is kept.
fn status_of_state(state: &str) -> String {
    match state {
        "active" => "running".into(),
        "inactive" => "off".into(),
        other => other.into(),
    }
}

impl HetznerWorld {
    /// The world of `topo` at `now` (Unix seconds): its servers and reserved FIPs, the regions
    /// mapped onto locations.
    pub(crate) fn from_topology(topo: &Topology, now: u64) -> Result<Self, String> {
        Ipv4Net::parse(&topo.fip_pool)?;
        let mut world = Self {
            cloud: "hetzner".into(),
            api_key: topo.api_key.clone(),
            locations: locations(),
            servers: Vec::new(),
            fips: Vec::new(),
            actions: VecDeque::new(),
            fip_pool: topo.fip_pool.clone(),
            forward_ports: topo.forward_ports.clone(),
            next_fip_id: 1,
            next_action_id: 1,
            census: TagCensus::default(),
        };
        let mut seen = HashSet::new();
        for s in &topo.servers {
            if !seen.insert(s.id) {
                return Err(format!("server id {} appears twice", s.id));
            }
            let location = location_of_region(topo, &s.region)
                .ok_or_else(|| format!("server {}: unknown region {:?}", s.id, s.region))?;
            world.servers.push(ServerRec {
                id: s.id,
                name: s.hostname.clone(),
                location: location.into(),
                status: status_of_state(&s.state),
                server_type: s.plan.clone(),
                primary_ip: s.primary_ip,
                private_ip: s.private_ip,
                labels: s.tags.clone(),
                created: stamp(now),
            });
        }
        for f in &topo.floating_ips {
            world.reserve(topo, f, now)?;
        }
        world.next_fip_id = world.fips.iter().map(|f| f.id).max().unwrap_or(0).max(100_000) + 1;
        world.reset_census();
        Ok(world)
    }

    /// Adds a FIP of the topology (assigned from the start when it names a server).
    fn reserve(&mut self, topo: &Topology, f: &crate::TopoFip, now: u64) -> Result<(), String> {
        let location = location_of_region(topo, &f.region)
            .ok_or_else(|| format!("FIP: unknown region {:?}", f.region))?;
        let address = match f.address {
            Some(a) => a,
            None => self.allocate().map_err(|e| e.message)?,
        };
        if let Some(t) = f.targeted_to
            && self.server(t).is_none()
        {
            return Err(format!("FIP {address}: unknown server {t}"));
        }
        let id = match &f.id {
            Some(id) => id
                .parse()
                .map_err(|_| format!("FIP {address}: id {id:?} is not a number (Hetzner ids are)"))?,
            None => self.fips.iter().map(|f| f.id).max().unwrap_or(100_000) + 1,
        };
        if self.fip(id).is_some() {
            return Err(format!("FIP id {id} appears twice"));
        }
        self.fips.push(FipRec {
            id,
            name: format!("floating-ip-{id}"),
            description: None,
            ip: IpAddr::V4(address),
            home_location: location.into(),
            server: f.targeted_to,
            labels: f.tags.clone(),
            protection: FloatingIpProtection::default(),
            created: stamp(now),
        });
        Ok(())
    }

    // ---- counters ------------------------------------------------------------------------

    /// Starts counting duplicates afresh from the FIPs that exist now.
    pub(crate) fn reset_census(&mut self) {
        self.census.reset(self.fips.iter().map(|f| &f.labels));
    }

    pub(crate) fn duplicate_fips(&self) -> u64 {
        self.census.duplicates()
    }

    pub(crate) fn fips_created_deleted(&self) -> (u64, u64) {
        (self.census.created, self.census.deleted)
    }

    // ---- lookups -------------------------------------------------------------------------

    fn server(&self, id: u64) -> Option<&ServerRec> {
        self.servers.iter().find(|s| s.id == id)
    }

    fn fip(&self, id: u64) -> Option<&FipRec> {
        self.fips.iter().find(|f| f.id == id)
    }

    fn fip_index(&self, id: u64) -> Res<usize> {
        self.fips
            .iter()
            .position(|f| f.id == id)
            .ok_or_else(|| HetznerErr::not_found("floating_ip", id))
    }

    fn location(&self, name: &str) -> Option<&Location> {
        self.locations.iter().find(|l| l.name == name)
    }

    /// The name of server `id`.
    pub(crate) fn server_name(&self, id: u64) -> Option<&str> {
        self.server(id).map(|s| s.name.as_str())
    }

    /// The name of the location with this id (a client may send `home_location` as an id).
    pub(crate) fn location_name(&self, id: u64) -> Option<String> {
        self.locations.iter().find(|l| l.id == id).map(|l| l.name.clone())
    }

    /// Whether an action runs on this FIP.
    fn locked(&self, fip: u64) -> bool {
        self.actions.iter().any(|a| {
            a.action.status == baton_cloud::hetzner::model::ACTION_RUNNING
                && a.effect.is_some_and(|e| e.fip() == fip)
        })
    }

    fn allocate(&self) -> Res<Ipv4Addr> {
        let pool = Ipv4Net::parse(&self.fip_pool).map_err(|e| HetznerErr::new(500, "server_error", e))?;
        let used: HashSet<IpAddr> = self.fips.iter().map(|f| f.ip).collect();
        let primaries: HashSet<Ipv4Addr> = self.servers.iter().map(|s| s.primary_ip).collect();
        pool.hosts()
            .find(|a| !used.contains(&IpAddr::V4(*a)) && !primaries.contains(a))
            .ok_or_else(|| {
                HetznerErr::new(
                    403,
                    "resource_limit_exceeded",
                    "no free IPv4 address left for a Floating IP",
                )
            })
    }

    /// An IPv6 Floating IP's /64, from the documentation range: `2001:db8:<n>::`.
    fn allocate_v6(&self) -> Ipv6Addr {
        let n = self.fips.iter().filter(|f| f.ip.is_ipv6()).count();
        Ipv6Addr::new(
            0x2001,
            0x0db8,
            u16::try_from(n + 1).unwrap_or(u16::MAX),
            0,
            0,
            0,
            0,
            0,
        )
    }

    // ---- rendering -----------------------------------------------------------------------

    fn render_fip(&self, f: &FipRec) -> FloatingIp {
        let (ip, ip_type) = match f.ip {
            IpAddr::V4(_) => (f.ip.to_string(), "ipv4"),
            IpAddr::V6(_) => (format!("{}/64", f.ip), "ipv6"),
        };
        FloatingIp {
            id: f.id,
            name: f.name.clone(),
            description: f.description.clone(),
            ip,
            ip_type: ip_type.into(),
            server: f.server,
            dns_ptr: vec![DnsPtr {
                ip: f.ip.to_string(),
                dns_ptr: default_ptr(f.ip),
            }],
            home_location: self
                .location(&f.home_location)
                .cloned()
                .unwrap_or_else(|| locations()[0].clone()),
            blocked: false,
            protection: f.protection,
            labels: f.labels.clone(),
            created: f.created.clone(),
        }
    }

    fn render_server(&self, s: &ServerRec) -> HetznerServer {
        let index = self.servers.iter().position(|o| o.id == s.id).unwrap_or(0);
        let v6 = Ipv6Addr::new(
            0x2001,
            0x0db8,
            0xff00,
            u16::try_from(index + 1).unwrap_or(u16::MAX),
            0,
            0,
            0,
            0,
        );
        let id = s.id.to_be_bytes();
        HetznerServer {
            id: s.id,
            name: s.name.clone(),
            status: s.status.clone(),
            created: s.created.clone(),
            public_net: ServerPublicNet {
                ipv4: Some(ServerPublicIpv4 {
                    id: Some(s.id),
                    ip: s.primary_ip.to_string(),
                    blocked: false,
                    dns_ptr: default_ptr(IpAddr::V4(s.primary_ip)),
                }),
                ipv6: Some(ServerPublicIpv6 {
                    id: Some(s.id + 1),
                    ip: format!("{v6}/64"),
                    blocked: false,
                    dns_ptr: Vec::new(),
                }),
                floating_ips: self
                    .fips
                    .iter()
                    .filter(|f| f.server == Some(s.id))
                    .map(|f| f.id)
                    .collect(),
                firewalls: Vec::new(),
            },
            private_net: s
                .private_ip
                .map(|ip| ServerPrivateNet {
                    network: PRIVATE_NETWORK_ID,
                    ip: ip.to_string(),
                    alias_ips: Vec::new(),
                    mac_address: format!("86:00:{:02x}:{:02x}:{:02x}:{:02x}", id[4], id[5], id[6], id[7]),
                })
                .into_iter()
                .collect(),
            server_type: ServerType {
                id: 1,
                name: s.server_type.clone(),
                description: s.server_type.to_uppercase(),
            },
            location: self
                .location(&s.location)
                .cloned()
                .unwrap_or_else(|| locations()[0].clone()),
            labels: s.labels.clone(),
        }
    }

    // ---- reads ---------------------------------------------------------------------------

    /// The FIPs that pass `filter`, by id.
    pub(crate) fn list_fips(&self, filter: &FipFilter) -> Vec<FloatingIp> {
        let mut fips: Vec<&FipRec> = self
            .fips
            .iter()
            .filter(|f| filter.name.as_ref().is_none_or(|n| *n == f.name))
            .filter(|f| filter.selector.matches(&f.labels))
            .collect();
        fips.sort_by_key(|f| f.id);
        fips.into_iter().map(|f| self.render_fip(f)).collect()
    }

    pub(crate) fn get_fip(&self, id: u64) -> Res<FloatingIp> {
        let f = self
            .fip(id)
            .ok_or_else(|| HetznerErr::not_found("floating_ip", id))?;
        Ok(self.render_fip(f))
    }

    /// The servers that pass `filter`, by id.
    pub(crate) fn list_servers(&self, filter: &ServerFilter) -> Vec<HetznerServer> {
        let mut servers: Vec<&ServerRec> = self
            .servers
            .iter()
            .filter(|s| filter.name.as_ref().is_none_or(|n| *n == s.name))
            .filter(|s| filter.status.is_empty() || filter.status.contains(&s.status))
            .filter(|s| filter.selector.matches(&s.labels))
            .collect();
        servers.sort_by_key(|s| s.id);
        servers.into_iter().map(|s| self.render_server(s)).collect()
    }

    pub(crate) fn get_server(&self, id: u64) -> Res<HetznerServer> {
        let s = self
            .server(id)
            .ok_or_else(|| HetznerErr::not_found("server", id))?;
        Ok(self.render_server(s))
    }

    /// The locations, or the one named `name`.
    pub(crate) fn list_locations(&self, name: Option<&str>) -> Vec<Location> {
        self.locations
            .iter()
            .filter(|l| name.is_none_or(|n| n == l.name))
            .cloned()
            .collect()
    }

    pub(crate) fn get_location(&self, id: u64) -> Res<Location> {
        self.locations
            .iter()
            .find(|l| l.id == id)
            .cloned()
            .ok_or_else(|| HetznerErr::not_found("location", id))
    }

    pub(crate) fn get_action(&self, id: u64) -> Res<Action> {
        self.actions
            .iter()
            .find(|a| a.action.id == id)
            .map(|a| a.action.clone())
            .ok_or_else(|| HetznerErr::not_found("action", id))
    }

    /// The actions with these ids (unknown ones left out), by id.
    pub(crate) fn actions_by_id(&self, ids: &[u64]) -> Vec<Action> {
        let mut out: Vec<Action> = self
            .actions
            .iter()
            .filter(|a| ids.contains(&a.action.id))
            .map(|a| a.action.clone())
            .collect();
        out.sort_by_key(|a| a.id);
        out
    }

    /// The actions on one FIP (404 when the FIP does not exist), by id.
    pub(crate) fn fip_actions(&self, fip: u64) -> Res<Vec<Action>> {
        self.fip(fip)
            .ok_or_else(|| HetznerErr::not_found("floating_ip", fip))?;
        Ok(self
            .actions
            .iter()
            .filter(|a| {
                a.action
                    .resources
                    .iter()
                    .any(|r| r.id == fip && r.resource_type == "floating_ip")
            })
            .map(|a| a.action.clone())
            .collect())
    }

    /// One action of one FIP.
    pub(crate) fn fip_action(&self, fip: u64, action: u64) -> Res<Action> {
        self.fip_actions(fip)?
            .into_iter()
            .find(|a| a.id == action)
            .ok_or_else(|| HetznerErr::not_found("action", action))
    }

    /// FIP address → the primary IP of the server it is assigned to (IPv4 FIPs; an IPv6 /64 is
    /// not routed by the simulator).
    pub(crate) fn forward_map(&self) -> BTreeMap<IpAddr, IpAddr> {
        self.fips
            .iter()
            .filter(|f| f.ip.is_ipv4())
            .filter_map(|f| {
                let server = self.server(f.server?)?;
                Some((f.ip, IpAddr::V4(server.primary_ip)))
            })
            .collect()
    }

    // ---- the shared model (harnesses) ----------------------------------------------------

    /// A FIP as `baton-cloud`'s shared model reads it, converted as the client converts what the
    /// API sends ([`baton_cloud::hetzner::ip_of`]: the id as text, the labels as tags, the home
    /// location as the region, the assigned server as `targeted_to`), with the server's name as
    /// `targeted_to.hostname`.
    fn as_ip_address(&self, f: &FipRec) -> Option<IpAddress> {
        let mut ip = baton_cloud::hetzner::ip_of(&self.render_fip(f))?;
        if let Some(target) = ip.targeted_to.as_mut()
            && let Some(s) = self.server(target.id.0)
        {
            target.hostname.clone_from(&s.name);
            target.state = Some(s.status.clone());
        }
        Some(ip)
    }

    /// One FIP in the shared model (`id` is the numeric id as text).
    pub(crate) fn peek_ip(&self, id: &str) -> Option<IpAddress> {
        self.as_ip_address(self.fip(id.parse().ok()?)?)
    }

    /// Every FIP in the shared model, by id.
    pub(crate) fn peek_ips(&self) -> Vec<IpAddress> {
        let mut fips: Vec<&FipRec> = self.fips.iter().collect();
        fips.sort_by_key(|f| f.id);
        fips.into_iter().filter_map(|f| self.as_ip_address(f)).collect()
    }

    // ---- writes --------------------------------------------------------------------------

    fn check_name_free(&self, name: &str, except: Option<u64>) -> Res<()> {
        if self.fips.iter().any(|f| f.name == name && Some(f.id) != except) {
            Err(HetznerErr::uniqueness("name"))
        } else {
            Ok(())
        }
    }

    fn check_labels(labels: &Labels) -> Res<()> {
        let problems = check_labels(labels);
        if problems.is_empty() {
            Ok(())
        } else {
            Err(HetznerErr::invalid("labels", problems))
        }
    }

    /// `POST /v1/floating_ips`. With `server`, the FIP is created unassigned and an assign action
    /// starts (returned too): it is assigned when the action succeeds.
    pub(crate) fn create_fip(
        &mut self,
        req: CreateFloatingIpRequest,
        now: u64,
        fails: bool,
    ) -> Res<(FloatingIp, Option<Action>)> {
        let v6 = match req.ip_type.as_str() {
            "ipv4" => false,
            "ipv6" => true,
            other => {
                return Err(HetznerErr::invalid(
                    "type",
                    vec![format!("{other:?} is not one of ipv4, ipv6")],
                ));
            }
        };
        let server = match req.server {
            Some(id) => Some(
                self.server(id)
                    .ok_or_else(|| HetznerErr::not_found("server", id))?,
            ),
            None => None,
        };
        let home = match (&req.home_location, server) {
            (Some(name), _) => self
                .location(name)
                .ok_or_else(|| {
                    HetznerErr::invalid("home_location", vec![format!("location {name:?} not found")])
                })?
                .name
                .clone(),
            (None, Some(s)) => s.location.clone(),
            (None, None) => {
                return Err(HetznerErr::invalid(
                    "home_location",
                    vec!["home_location or server is required".into()],
                ));
            }
        };
        let labels = req.labels.unwrap_or_default();
        Self::check_labels(&labels)?;
        let id = self.next_fip_id;
        let name = req.name.unwrap_or_else(|| format!("floating-ip-{id}"));
        self.check_name_free(&name, None)?;
        if let Some(s) = server {
            self.check_zone(&home, s)?;
        }
        let server = server.map(|s| s.id);
        let ip = if v6 {
            IpAddr::V6(self.allocate_v6())
        } else {
            IpAddr::V4(self.allocate()?)
        };
        self.next_fip_id += 1;
        let rec = FipRec {
            id,
            name,
            description: req.description,
            ip,
            home_location: home,
            server: None,
            labels,
            protection: FloatingIpProtection::default(),
            created: stamp(now),
        };
        self.census.add(&rec.labels);
        self.census.created += 1;
        self.fips.push(rec);
        let action = server.map(|server| {
            self.start(
                "assign_floating_ip",
                Some(Effect::Assign { fip: id, server }),
                vec![(id, "floating_ip"), (server, "server")],
                now,
                fails,
            )
        });
        Ok((self.get_fip(id)?, action))
    }

    /// A FIP homed in `home` can be assigned to server `s` only within the network zone.
    fn check_zone(&self, home: &str, s: &ServerRec) -> Res<()> {
        let zone = |name: &str| self.location(name).map(|l| l.network_zone.clone());
        if zone(home) == zone(&s.location) {
            Ok(())
        } else {
            Err(HetznerErr::invalid(
                "server",
                vec![format!(
                    "server {} is in another network zone than the Floating IP's home location {home}",
                    s.id
                )],
            ))
        }
    }

    /// `PUT /v1/floating_ips/{id}`: description, name, labels (replaced as a whole).
    pub(crate) fn update_fip(&mut self, id: u64, req: UpdateFloatingIpRequest) -> Res<FloatingIp> {
        let idx = self.fip_index(id)?;
        if let Some(labels) = &req.labels {
            Self::check_labels(labels)?;
        }
        if let Some(name) = &req.name {
            self.check_name_free(name, Some(id))?;
        }
        let f = &mut self.fips[idx];
        if let Some(description) = req.description {
            f.description = Some(description);
        }
        if let Some(name) = req.name {
            f.name = name;
        }
        if let Some(labels) = req.labels {
            self.census.remove(&f.labels);
            self.census.add(&labels);
            f.labels = labels;
        }
        self.get_fip(id)
    }

    /// `DELETE /v1/floating_ips/{id}`: unassigns (no action) and deletes; 423 while an action
    /// runs on it or with delete protection.
    pub(crate) fn delete_fip(&mut self, id: u64) -> Res<()> {
        let idx = self.fip_index(id)?;
        if self.fips[idx].protection.delete {
            return Err(HetznerErr::new(
                423,
                codes::PROTECTED,
                format!("floating_ip with ID '{id}' is protected against deletion"),
            ));
        }
        if self.locked(id) {
            return Err(HetznerErr::locked(id));
        }
        let gone = self.fips.remove(idx);
        self.census.remove(&gone.labels);
        self.census.deleted += 1;
        Ok(())
    }

    /// `POST /v1/floating_ips/{id}/actions/assign`: a running action; the FIP moves when it
    /// succeeds. An assign of a FIP assigned to another server moves it (`Reassign::Direct`)
    /// or answers 422 `floating_ip_assigned` (`Reassign::Refuse`).
    pub(crate) fn assign(
        &mut self,
        id: u64,
        server: u64,
        reassign: Reassign,
        now: u64,
        fails: bool,
    ) -> Res<Action> {
        let idx = self.fip_index(id)?;
        if self.locked(id) {
            return Err(HetznerErr::locked(id));
        }
        let s = self
            .server(server)
            .ok_or_else(|| HetznerErr::not_found("server", server))?;
        let f = &self.fips[idx];
        self.check_zone(&f.home_location, s)?;
        if reassign == Reassign::Refuse
            && let Some(current) = f.server
            && current != server
        {
            return Err(HetznerErr::new(
                422,
                codes::FLOATING_IP_ASSIGNED,
                format!("floating_ip with ID '{id}' is already assigned to server {current}"),
            ));
        }
        Ok(self.start(
            "assign_floating_ip",
            Some(Effect::Assign { fip: id, server }),
            vec![(id, "floating_ip"), (server, "server")],
            now,
            fails,
        ))
    }

    /// `POST /v1/floating_ips/{id}/actions/unassign`: a running action; the FIP is unassigned
    /// when it succeeds.
    pub(crate) fn unassign(&mut self, id: u64, now: u64, fails: bool) -> Res<Action> {
        let idx = self.fip_index(id)?;
        if self.locked(id) {
            return Err(HetznerErr::locked(id));
        }
        let mut resources = vec![(id, "floating_ip")];
        resources.extend(self.fips[idx].server.map(|s| (s, "server")));
        Ok(self.start(
            "unassign_floating_ip",
            Some(Effect::Unassign { fip: id }),
            resources,
            now,
            fails,
        ))
    }

    /// `POST /v1/floating_ips/{id}/actions/change_protection`: applied at once; the action
    /// answered has already succeeded.
    pub(crate) fn change_protection(&mut self, id: u64, delete: Option<bool>, now: u64) -> Res<Action> {
        let idx = self.fip_index(id)?;
        if let Some(delete) = delete {
            self.fips[idx].protection.delete = delete;
        }
        let mut action = self.start("change_protection", None, vec![(id, "floating_ip")], now, false);
        self.complete(action.id, now);
        action = self.get_action(action.id)?;
        Ok(action)
    }

    /// Records a new running action.
    fn start(
        &mut self,
        command: &str,
        effect: Option<Effect>,
        resources: Vec<(u64, &str)>,
        now: u64,
        fails: bool,
    ) -> Action {
        let action = Action {
            id: self.next_action_id,
            command: command.into(),
            status: baton_cloud::hetzner::model::ACTION_RUNNING.into(),
            progress: 0,
            started: stamp(now),
            finished: None,
            resources: resources
                .into_iter()
                .map(|(id, kind)| ActionResource {
                    id,
                    resource_type: kind.into(),
                })
                .collect(),
            error: None,
        };
        self.next_action_id += 1;
        self.actions.push_back(ActionRec {
            action: action.clone(),
            effect,
            fails,
        });
        while self.actions.len() > ACTIONS_KEPT {
            let Some(oldest_done) = self
                .actions
                .iter()
                .position(|a| a.action.status != baton_cloud::hetzner::model::ACTION_RUNNING)
            else {
                break;
            };
            self.actions.remove(oldest_done);
        }
        action
    }

    /// Ends a running action at `now`: `success` with its effect, or `error`
    /// (`action_failed`) without it when it was drawn to fail. Returns whether it was running.
    pub(crate) fn complete(&mut self, id: u64, now: u64) -> bool {
        let Some(i) = self.actions.iter().position(|a| a.action.id == id) else {
            return false;
        };
        if self.actions[i].action.status != baton_cloud::hetzner::model::ACTION_RUNNING {
            return false;
        }
        let (effect, fails) = (self.actions[i].effect, self.actions[i].fails);
        // The FIP (or the server) may be gone meanwhile: the action then fails.
        let applied = !fails
            && match effect {
                Some(Effect::Assign { fip, server }) => {
                    let exists = self.server(server).is_some();
                    match self.fips.iter_mut().find(|f| f.id == fip) {
                        Some(f) if exists => {
                            f.server = Some(server);
                            true
                        }
                        _ => false,
                    }
                }
                Some(Effect::Unassign { fip }) => self
                    .fips
                    .iter_mut()
                    .find(|f| f.id == fip)
                    .map(|f| f.server = None)
                    .is_some(),
                None => true,
            };
        let action = &mut self.actions[i].action;
        action.progress = 100;
        action.finished = Some(stamp(now));
        if applied {
            action.status = baton_cloud::hetzner::model::ACTION_SUCCESS.into();
        } else {
            action.status = baton_cloud::hetzner::model::ACTION_ERROR.into();
            action.error = Some(ActionError {
                code: "action_failed".into(),
                message: "Action failed".into(),
            });
        }
        true
    }

    /// Ends every running action (a world loaded from a state file: their timers are gone).
    pub(crate) fn complete_all(&mut self, now: u64) {
        let running: Vec<u64> = self
            .actions
            .iter()
            .filter(|a| a.action.status == baton_cloud::hetzner::model::ACTION_RUNNING)
            .map(|a| a.action.id)
            .collect();
        for id in running {
            self.complete(id, now);
        }
    }
}

#[cfg(test)]
mod tests;
