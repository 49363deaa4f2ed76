//! The simulator's state and the API semantics, without HTTP: each operation takes the parsed
//! request and returns the object the API would send back, or an `ApiErr` (status + message).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use tokio::time::Instant;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::topology::{Ipv4Net, Topology};
use baton_cloud::model::{
    CreateIpRequest, IpAddress, IpId, IpType, Plan, Project, ProjectBgp, Region, RegionBgp, Server,
    ServerBgp, ServerId, ServerSummary, Tags, UpdateIpRequest, UpdateProjectRequest, UpdateServerRequest,
};

/// An API error: HTTP status and the `message` of `{code, message}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApiErr {
    pub(crate) status: u16,
    pub(crate) message: String,
}

impl ApiErr {
    pub(crate) fn new(status: u16, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }
}

type Res<T> = Result<T, ApiErr>;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ProjectRec {
    id: u64,
    name: String,
    bgp_enabled: bool,
    local_asn: u32,
    asn_on_enable: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct RegionRec {
    region: Region,
    legacy_names: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ServerRec {
    id: u64,
    hostname: String,
    region_id: u64,
    plan: Plan,
    state: String,
    tags: Tags,
    bgp_enabled: bool,
    primary_ip: String,
    private_ip: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct IpRec {
    id: String,
    address: Ipv4Addr,
    ip_type: IpType,
    cidr: String,
    gateway: Option<String>,
    region_id: u64,
    owner: Option<u64>,
    target: Option<u64>,
    ptr_record: Option<String>,
    a_record: Option<String>,
    tags: Tags,
    vlan_id: Option<u32>,
}

/// Everything the simulator knows; serialized as the `--state` file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct World {
    pub(crate) api_key: String,
    project: ProjectRec,
    regions: Vec<RegionRec>,
    servers: Vec<ServerRec>,
    ips: Vec<IpRec>,
    fip_pool: String,
    pub(crate) forward_ports: Vec<u16>,
    /// The IP writes of the last `list_lag` (what each changed), so that a lagging list can
    /// show the IPs as they were.
    #[serde(skip)]
    history: VecDeque<IpChange>,
    /// How far the IP list lags behind the writes (`Faults::list_lag_ms`).
    #[serde(skip)]
    pub(crate) list_lag: Duration,
    /// How many FIPs carry each tag set, now and at most (duplicates).
    #[serde(skip)]
    census: TagCensus,
}

/// One IP write: the IP as it was before (`None`: it did not exist).
#[derive(Debug, Clone)]
struct IpChange {
    at: Instant,
    id: String,
    before: Option<IpRec>,
}

/// For each set of tags carried by FIPs: how many FIPs carry it now, and at most since the last
/// reset. A Service's FIP is found by its tags, so two FIPs with the same tags at once are a
/// duplicate.
#[derive(Debug, Clone, Default)]
pub(crate) struct TagCensus {
    by_tags: HashMap<Tags, (u64, u64)>,
    pub(crate) created: u64,
    pub(crate) deleted: u64,
}

impl TagCensus {
    pub(crate) fn add(&mut self, tags: &Tags) {
        if tags.is_empty() {
            return;
        }
        let (now, peak) = self.by_tags.entry(tags.clone()).or_default();
        *now += 1;
        *peak = (*peak).max(*now);
    }

    pub(crate) fn remove(&mut self, tags: &Tags) {
        if let Some((now, _)) = self.by_tags.get_mut(tags) {
            *now = now.saturating_sub(1);
        }
    }

    /// Peaks start again from what exists now.
    pub(crate) fn reset<'a>(&mut self, fips: impl Iterator<Item = &'a Tags>) {
        self.by_tags.clear();
        self.created = 0;
        self.deleted = 0;
        for tags in fips {
            self.add(tags);
        }
    }

    /// Σ over tag sets of (the most FIPs that carried it at once − 1).
    pub(crate) fn duplicates(&self) -> u64 {
        self.by_tags
            .values()
            .map(|(_, peak)| peak.saturating_sub(1))
            .sum()
    }
}

/// A stable UUID-shaped id derived from a name (so the same topology gives the same ids).
fn derived_uuid(name: &str) -> String {
    let digest = Sha256::digest(name.as_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_random_bytes(bytes).into_uuid().to_string()
}

fn normalize_ptr(ptr: &str) -> String {
    if ptr.is_empty() || ptr.ends_with('.') {
        ptr.to_owned()
    } else {
        format!("{ptr}.")
    }
}

fn a_record_fqdn(name: &str) -> String {
    let name = name.trim_end_matches('.');
    if name.is_empty() || name.ends_with(".cloud.cherryservers.net") {
        format!("{name}.")
    } else {
        format!("{name}.cloud.cherryservers.net.")
    }
}

impl World {
    #[allow(clippy::too_many_lines)] // one linear translation of the topology file
    pub(crate) fn from_topology(topo: &Topology) -> Result<Self, String> {
        let public = Ipv4Net::parse(&topo.public_network)?;
        let private = Ipv4Net::parse(&topo.private_network)?;
        Ipv4Net::parse(&topo.fip_pool)?;
        let regions: Vec<RegionRec> = topo
            .regions
            .iter()
            .map(|r| RegionRec {
                region: Region {
                    id: r.id.into(),
                    name: r.name.clone(),
                    slug: r.slug.clone(),
                    region_iso_2: r.region_iso_2.clone(),
                    location: r.location.clone(),
                    href: format!("/regions/{}", r.id),
                    bgp: RegionBgp {
                        hosts: r.bgp_hosts.clone(),
                        asn: r.bgp_asn,
                    },
                },
                legacy_names: r.legacy_names.clone(),
            })
            .collect();
        let mut world = Self {
            api_key: topo.api_key.clone(),
            project: ProjectRec {
                id: topo.project.id,
                name: topo.project.name.clone(),
                bgp_enabled: topo.project.bgp_enabled,
                local_asn: if topo.project.bgp_enabled {
                    topo.project.local_asn
                } else {
                    0
                },
                asn_on_enable: topo.project.local_asn,
            },
            regions,
            servers: Vec::new(),
            ips: Vec::new(),
            fip_pool: topo.fip_pool.clone(),
            forward_ports: topo.forward_ports.clone(),
            history: VecDeque::new(),
            list_lag: Duration::ZERO,
            census: TagCensus::default(),
        };
        let mut seen = HashSet::new();
        for s in &topo.servers {
            if !seen.insert(s.id) {
                return Err(format!("server id {} appears twice", s.id));
            }
            let region_id = world
                .resolve_region(&s.region)
                .map_err(|_| format!("server {}: unknown region {:?}", s.id, s.region))?;
            let primary_id = derived_uuid(&format!("{}/primary", s.id));
            world.ips.push(IpRec {
                id: primary_id.clone(),
                address: s.primary_ip,
                ip_type: IpType::PrimaryIp,
                cidr: public.to_string(),
                gateway: Some(public.first_host().to_string()),
                region_id,
                owner: Some(s.id),
                target: None,
                ptr_record: None,
                a_record: None,
                tags: Tags::new(),
                vlan_id: None,
            });
            let private_id = s.private_ip.map(|addr| {
                let id = derived_uuid(&format!("{}/private", s.id));
                world.ips.push(IpRec {
                    id: id.clone(),
                    address: addr,
                    ip_type: IpType::PrivateIp,
                    cidr: private.to_string(),
                    gateway: None,
                    region_id,
                    owner: Some(s.id),
                    target: None,
                    ptr_record: None,
                    a_record: None,
                    tags: Tags::new(),
                    vlan_id: Some(2897),
                });
                id
            });
            world.servers.push(ServerRec {
                id: s.id,
                hostname: s.hostname.clone(),
                region_id,
                plan: Plan {
                    id: 1095,
                    slug: s.plan.clone(),
                    name: s.plan.to_uppercase().replace('-', " "),
                    plan_type: "baremetal".into(),
                },
                state: s.state.clone(),
                tags: s.tags.clone(),
                bgp_enabled: s.bgp_enabled,
                primary_ip: primary_id,
                private_ip: private_id,
            });
        }
        for f in &topo.floating_ips {
            let region_id = world
                .resolve_region(&f.region)
                .map_err(|_| format!("FIP: unknown region {:?}", f.region))?;
            let address = match f.address {
                Some(a) => a,
                None => world.allocate().map_err(|e| e.message)?,
            };
            if let Some(t) = f.targeted_to
                && world.server_rec(t).is_none()
            {
                return Err(format!("FIP {address}: unknown server {t}"));
            }
            world.ips.push(IpRec {
                id: f
                    .id
                    .clone()
                    .unwrap_or_else(|| derived_uuid(&format!("fip/{address}"))),
                address,
                ip_type: IpType::FloatingIp,
                cidr: format!("{address}/32"),
                gateway: None,
                region_id,
                owner: None,
                target: f.targeted_to,
                ptr_record: None,
                a_record: None,
                tags: f.tags.clone(),
                vlan_id: None,
            });
        }
        Ok(world)
    }

    pub(crate) fn project_id(&self) -> u64 {
        self.project.id
    }

    /// Starts counting duplicates afresh from the FIPs that exist now.
    pub(crate) fn reset_census(&mut self) {
        let fips = self
            .ips
            .iter()
            .filter(|ip| ip.ip_type == IpType::FloatingIp)
            .map(|ip| &ip.tags);
        self.census.reset(fips);
    }

    /// Σ over the tag sets FIPs carried since the last reset of (the most FIPs that carried
    /// one at the same time − 1): FIPs that a tag look-up would find twice.
    pub(crate) fn duplicate_fips(&self) -> u64 {
        self.census.duplicates()
    }

    /// FIPs created and deleted since the last reset (whatever became of the answers).
    pub(crate) fn fips_created_deleted(&self) -> (u64, u64) {
        (self.census.created, self.census.deleted)
    }

    /// Remembers an IP write for lagging lists (kept while `list_lag` is above 0).
    fn changed(&mut self, id: &str, before: Option<IpRec>) {
        let now = Instant::now();
        while self
            .history
            .front()
            .is_some_and(|c| now.duration_since(c.at) > self.list_lag)
        {
            self.history.pop_front();
        }
        if !self.list_lag.is_zero() {
            self.history.push_back(IpChange {
                at: now,
                id: id.to_owned(),
                before,
            });
        }
    }

    /// The IPs as a list lagging `list_lag` behind the writes shows them: the writes of the
    /// last `list_lag` undone, newest first.
    fn listed_ips(&self) -> std::borrow::Cow<'_, [IpRec]> {
        let now = Instant::now();
        let recent: Vec<&IpChange> = self
            .history
            .iter()
            .filter(|c| now.duration_since(c.at) <= self.list_lag)
            .collect();
        if recent.is_empty() {
            return std::borrow::Cow::Borrowed(&self.ips);
        }
        let mut view: Vec<Option<IpRec>> = self.ips.iter().cloned().map(Some).collect();
        let mut at: HashMap<String, usize> = self
            .ips
            .iter()
            .enumerate()
            .map(|(i, ip)| (ip.id.clone(), i))
            .collect();
        for change in recent.into_iter().rev() {
            match (at.get(&change.id), &change.before) {
                (Some(&i), before) => view[i].clone_from(before),
                (None, Some(before)) => {
                    at.insert(change.id.clone(), view.len());
                    view.push(Some(before.clone()));
                }
                (None, None) => {}
            }
        }
        std::borrow::Cow::Owned(view.into_iter().flatten().collect())
    }

    /// FIP address → the primary IP of the server it is targeted to.
    pub(crate) fn forward_map(&self) -> BTreeMap<IpAddr, IpAddr> {
        self.ips
            .iter()
            .filter(|ip| ip.ip_type == IpType::FloatingIp)
            .filter_map(|ip| {
                let server = self.server_rec(ip.target?)?;
                let primary = self.ip_rec(&server.primary_ip)?;
                Some((IpAddr::V4(ip.address), IpAddr::V4(primary.address)))
            })
            .collect()
    }

    // ---- lookups -------------------------------------------------------------------------

    fn server_rec(&self, id: u64) -> Option<&ServerRec> {
        self.servers.iter().find(|s| s.id == id)
    }

    fn ip_rec(&self, id: &str) -> Option<&IpRec> {
        self.ips.iter().find(|ip| ip.id == id)
    }

    fn region_rec(&self, id: u64) -> Option<&Region> {
        self.regions.iter().map(|r| &r.region).find(|r| r.id.0 == id)
    }

    /// Slug (canonical), legacy name or numeric id; case-sensitive.
    pub(crate) fn resolve_region(&self, key: &str) -> Res<u64> {
        self.regions
            .iter()
            .find(|r| {
                r.region.slug == key
                    || r.region.name == key
                    || r.legacy_names.iter().any(|n| n == key)
                    || key.parse::<u64>().is_ok_and(|id| id == r.region.id.0)
            })
            .map(|r| r.region.id.0)
            .ok_or_else(|| ApiErr::new(400, format!("Region {key} not found")))
    }

    fn check_project(&self, pid: u64) -> Res<()> {
        if pid == self.project.id {
            Ok(())
        } else {
            Err(ApiErr::new(404, "Project not found"))
        }
    }

    fn allocate(&self) -> Res<Ipv4Addr> {
        let pool = Ipv4Net::parse(&self.fip_pool).map_err(|e| ApiErr::new(500, e))?;
        let used: HashSet<Ipv4Addr> = self.ips.iter().map(|ip| ip.address).collect();
        pool.hosts()
            .find(|a| !used.contains(a))
            .ok_or_else(|| ApiErr::new(400, "No free floating IP addresses in the region"))
    }

    // ---- rendering -----------------------------------------------------------------------

    fn render_project(&self) -> Project {
        Project {
            id: self.project.id.into(),
            name: self.project.name.clone(),
            bgp: ProjectBgp {
                enabled: self.project.bgp_enabled,
                local_asn: self.project.local_asn,
            },
            href: format!("/projects/{}", self.project.id),
        }
    }

    fn render_server_bgp(&self, s: &ServerRec) -> ServerBgp {
        let fips = u32::try_from(
            self.ips
                .iter()
                .filter(|i| i.ip_type == IpType::FloatingIp)
                .count(),
        )
        .unwrap_or(u32::MAX);
        if s.bgp_enabled {
            ServerBgp {
                enabled: true,
                available: true,
                status: "Established".into(),
                routers: 2,
                connected: 2,
                limit: fips,
                active: 0,
                routes: Vec::new(),
                updated: None,
            }
        } else {
            ServerBgp {
                enabled: false,
                available: true,
                status: "Disabled".into(),
                ..ServerBgp::default()
            }
        }
    }

    fn render_summary(&self, s: &ServerRec) -> ServerSummary {
        ServerSummary {
            id: ServerId(s.id),
            name: Some(s.plan.name.clone()),
            href: format!("/servers/{}", s.id),
            hostname: s.hostname.clone(),
            image: Some("Ubuntu 24.04 64bit".into()),
            region: self.region_rec(s.region_id).cloned(),
            state: Some(s.state.clone()),
            spot_instance: false,
            project: Some(self.render_project()),
            bgp: Some(self.render_server_bgp(s)),
        }
    }

    fn render_ip(&self, ip: &IpRec, top_level: bool) -> IpAddress {
        let target = ip.target.and_then(|t| self.server_rec(t));
        // A server's own primary and private IPs show `targeted_to` = that server (and no
        // `routed_to`), as in the real payloads (cherrygo `testdata/allow_bmc.json`).
        let shown_target = match ip.ip_type {
            IpType::FloatingIp => target,
            _ => ip.owner.and_then(|o| self.server_rec(o)),
        };
        IpAddress {
            id: IpId(ip.id.clone()),
            address: IpAddr::V4(ip.address),
            address_family: 4,
            cidr: ip.cidr.clone(),
            gateway: ip.gateway.clone(),
            ip_type: ip.ip_type.clone(),
            region: self.region_rec(ip.region_id).cloned().map(Box::new),
            // A targeted FIP shows the server's primary IP object and the server summary.
            routed_to: target
                .and_then(|s| self.ip_rec(&s.primary_ip))
                .map(|primary| Box::new(self.render_ip(primary, false))),
            assigned_to: ip
                .owner
                .and_then(|o| self.server_rec(o))
                .map(|s| Box::new(self.render_summary(s))),
            targeted_to: shown_target.map(|s| Box::new(self.render_summary(s))),
            project: top_level.then(|| self.render_project()),
            ptr_record: ip.ptr_record.clone(),
            a_record: ip.a_record.clone(),
            tags: ip.tags.clone(),
            ddos_scrubbing: false,
            href: format!("/ips/{}", ip.id),
            vlan_id: ip.vlan_id,
        }
    }

    fn render_server(&self, s: &ServerRec, with_ips: bool) -> Server {
        let ip_addresses = if with_ips {
            self.ips
                .iter()
                .filter(|ip| ip.owner == Some(s.id))
                .map(|ip| self.render_ip(ip, false))
                .collect()
        } else {
            Vec::new()
        };
        Server {
            id: ServerId(s.id),
            name: s.plan.name.clone(),
            href: format!("/servers/{}", s.id),
            hostname: s.hostname.clone(),
            image: Some("Ubuntu 24.04 64bit".into()),
            spot_instance: false,
            region: self.region_rec(s.region_id).cloned(),
            state: s.state.clone(),
            status: "deployed".into(),
            bgp: self.render_server_bgp(s),
            plan: Some(s.plan.clone()),
            ip_addresses,
            tags: s.tags.clone(),
            project: Some(self.render_project()),
            created_at: None,
        }
    }

    // ---- operations ----------------------------------------------------------------------

    pub(crate) fn get_project(&self, pid: u64) -> Res<Project> {
        self.check_project(pid)?;
        Ok(self.render_project())
    }

    pub(crate) fn update_project(&mut self, pid: u64, req: UpdateProjectRequest) -> Res<Project> {
        self.check_project(pid)?;
        if let Some(name) = req.name {
            if name.trim().is_empty() {
                return Err(ApiErr::new(400, "Project name cannot be empty"));
            }
            self.project.name = name;
        }
        if let Some(bgp) = req.bgp {
            self.project.bgp_enabled = bgp;
            self.project.local_asn = if bgp { self.project.asn_on_enable } else { 0 };
        }
        Ok(self.render_project())
    }

    /// The project's servers; `search` (the `search` query parameter, as cherryctl's
    /// `server list --search` sends it: "hostname or public IP phrase") keeps those whose
    /// hostname contains it (case-insensitively) or whose primary IP address contains it.
    pub(crate) fn list_servers(&self, pid: u64, search: Option<&str>) -> Res<Vec<Server>> {
        self.check_project(pid)?;
        let phrase = search
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(str::to_lowercase);
        Ok(self
            .servers
            .iter()
            .filter(|s| phrase.as_deref().is_none_or(|p| self.server_matches(s, p)))
            .map(|s| self.render_server(s, true))
            .collect())
    }

    /// Whether `phrase` (lower case) is part of the server's hostname or primary IP address.
    fn server_matches(&self, s: &ServerRec, phrase: &str) -> bool {
        s.hostname.to_lowercase().contains(phrase)
            || self
                .ip_rec(&s.primary_ip)
                .is_some_and(|ip| ip.address.to_string().contains(phrase))
    }

    pub(crate) fn get_server(&self, id: u64) -> Res<Server> {
        let s = self
            .server_rec(id)
            .ok_or_else(|| ApiErr::new(404, "Server not found"))?;
        Ok(self.render_server(s, true))
    }

    /// Returns the server without `ip_addresses`, as the real PUT does.
    pub(crate) fn update_server(&mut self, id: u64, req: UpdateServerRequest) -> Res<Server> {
        let s = self
            .servers
            .iter_mut()
            .find(|s| s.id == id)
            .ok_or_else(|| ApiErr::new(404, "Server not found"))?;
        if let Some(hostname) = req.hostname {
            s.hostname = hostname;
        }
        if let Some(name) = req.name {
            s.plan.name = name;
        }
        if let Some(tags) = req.tags {
            s.tags = tags;
        }
        if let Some(bgp) = req.bgp {
            s.bgp_enabled = bgp;
        }
        let s = self
            .server_rec(id)
            .ok_or_else(|| ApiErr::new(404, "Server not found"))?;
        Ok(self.render_server(s, false))
    }

    pub(crate) fn list_ips(&self, pid: u64, types: &[String]) -> Res<Vec<IpAddress>> {
        self.check_project(pid)?;
        let wanted: Vec<IpType> = types
            .iter()
            .map(|t| serde_json::from_value(serde_json::Value::String(t.clone())).unwrap_or(IpType::Unknown))
            .collect();
        Ok(self
            .listed_ips()
            .iter()
            .filter(|ip| wanted.is_empty() || wanted.contains(&ip.ip_type))
            .map(|ip| self.render_ip(ip, true))
            .collect())
    }

    /// Every IP as it is now (not lagging).
    pub(crate) fn current_ips(&self) -> Vec<IpAddress> {
        self.ips.iter().map(|ip| self.render_ip(ip, true)).collect()
    }

    pub(crate) fn get_ip(&self, id: &str) -> Res<IpAddress> {
        let ip = self
            .ip_rec(id)
            .ok_or_else(|| ApiErr::new(404, "IP address not found"))?;
        Ok(self.render_ip(ip, true))
    }

    fn check_target(&self, server: u64, region_id: u64) -> Res<()> {
        let s = self
            .server_rec(server)
            .ok_or_else(|| ApiErr::new(400, format!("Server {server} not found")))?;
        if s.region_id != region_id {
            return Err(ApiErr::new(400, "Server and IP address are in different regions"));
        }
        Ok(())
    }

    pub(crate) fn create_ip(&mut self, pid: u64, req: CreateIpRequest) -> Res<IpAddress> {
        self.check_project(pid)?;
        if req.region.trim().is_empty() {
            return Err(ApiErr::new(400, "region is required"));
        }
        let region_id = self.resolve_region(&req.region)?;
        let target = req.targeted_to.and_then(|t| t.0).map(|s| s.0);
        if let Some(t) = target {
            self.check_target(t, region_id)?;
        }
        let address = self.allocate()?;
        let rec = IpRec {
            id: uuid::Uuid::new_v4().to_string(),
            address,
            ip_type: IpType::FloatingIp,
            cidr: format!("{address}/32"),
            gateway: None,
            region_id,
            owner: None,
            target,
            ptr_record: req.ptr_record.as_deref().map(normalize_ptr),
            a_record: req.a_record.as_deref().map(a_record_fqdn),
            tags: req.tags,
            vlan_id: None,
        };
        let out = self.render_ip(&rec, true);
        self.census.add(&rec.tags);
        self.census.created += 1;
        self.changed(&rec.id, None);
        self.ips.push(rec);
        Ok(out)
    }

    pub(crate) fn update_ip(&mut self, id: &str, req: UpdateIpRequest) -> Res<IpAddress> {
        let idx = self
            .ips
            .iter()
            .position(|ip| ip.id == id)
            .ok_or_else(|| ApiErr::new(404, "IP address not found"))?;
        let current = self.ips[idx].clone();
        // Quirk: resending the current ptr_record makes the API fail with a 500.
        if let Some(ptr) = &req.ptr_record
            && current.ptr_record.as_deref() == Some(normalize_ptr(ptr).as_str())
        {
            return Err(ApiErr::new(500, "Internal Server Error"));
        }
        let routes = req.targeted_to.is_some() || req.routed_to.is_some();
        if routes && current.ip_type != IpType::FloatingIp {
            return Err(ApiErr::new(400, "Only floating IP addresses can be assigned"));
        }
        if req.targeted_to.is_some() && req.routed_to.is_some() {
            return Err(ApiErr::new(
                400,
                "targeted_to and routed_to are mutually exclusive",
            ));
        }
        let mut target = current.target;
        if let Some(t) = req.targeted_to {
            target = t.0.map(|s| s.0);
            if let Some(server) = target {
                self.check_target(server, current.region_id)?;
            }
        }
        if let Some(routed) = &req.routed_to {
            let to = self
                .ip_rec(routed.as_str())
                .ok_or_else(|| ApiErr::new(400, format!("IP address {routed} not found")))?;
            if to.ip_type != IpType::PrimaryIp {
                return Err(ApiErr::new(
                    400,
                    "A floating IP can only be routed to a primary IP",
                ));
            }
            let owner = to
                .owner
                .ok_or_else(|| ApiErr::new(400, "The IP address is not assigned"))?;
            self.check_target(owner, current.region_id)?;
            target = Some(owner);
        }
        self.changed(id, Some(current.clone()));
        let ip = &mut self.ips[idx];
        ip.target = target;
        if let Some(tags) = req.tags {
            if ip.ip_type == IpType::FloatingIp {
                self.census.remove(&current.tags);
                self.census.add(&tags);
            }
            ip.tags = tags; // wholesale replacement
        }
        if let Some(ptr) = req.ptr_record {
            ip.ptr_record = Some(normalize_ptr(&ptr));
        }
        if let Some(a) = req.a_record {
            ip.a_record = Some(a_record_fqdn(&a));
        }
        let ip = self.ips[idx].clone();
        Ok(self.render_ip(&ip, true))
    }

    pub(crate) fn delete_ip(&mut self, id: &str, reject_attached: bool) -> Res<()> {
        let idx = self
            .ips
            .iter()
            .position(|ip| ip.id == id)
            .ok_or_else(|| ApiErr::new(404, "IP address not found"))?;
        let ip = &self.ips[idx];
        if ip.ip_type != IpType::FloatingIp {
            return Err(ApiErr::new(400, "Only floating IP addresses can be deleted"));
        }
        if reject_attached && ip.target.is_some() {
            return Err(ApiErr::new(400, "Attached IP address cannot be deleted"));
        }
        let gone = self.ips.remove(idx);
        self.census.remove(&gone.tags);
        self.census.deleted += 1;
        self.changed(id, Some(gone));
        Ok(())
    }

    /// Replaces a region's BGP route servers (Cherry renumbering them); false if no such region.
    pub(crate) fn set_region_bgp_hosts(&mut self, slug: &str, hosts: Vec<String>) -> bool {
        match self.regions.iter_mut().find(|r| r.region.slug == slug) {
            Some(r) => {
                r.region.bgp.hosts = hosts;
                true
            }
            None => false,
        }
    }

    pub(crate) fn regions(&self) -> Vec<Region> {
        self.regions.iter().map(|r| r.region.clone()).collect()
    }

    pub(crate) fn region(&self, key: &str) -> Res<Region> {
        let id = self
            .resolve_region(key)
            .map_err(|_| ApiErr::new(404, "Region not found"))?;
        self.region_rec(id)
            .cloned()
            .ok_or_else(|| ApiErr::new(404, "Region not found"))
    }
}

#[cfg(test)]
mod tests;
