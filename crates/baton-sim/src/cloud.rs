//! The simulated cloud's state in the dialect the simulator speaks: Cherry Servers' [`World`] or
//! Hetzner Cloud's [`HetznerWorld`], behind one lock. What both dialects share (routes of the
//! assigned FIPs, the duplicate census, the state file, the harness's peeks) is asked of this
//! enum; each dialect's HTTP layer takes its own world out of it.
//!
//! ```text
//!  topology ─► CloudWorld::from_topology(kind) ─┬─ Cherry(World)
//!  state file ─► CloudWorld::load (by "cloud") ─┘─ Hetzner(HetznerWorld) ─► forward_map, save, peek
//! ```
//!
//! The state file of a Cherry world is the `World` itself, unchanged; a Hetzner world's carries
//! `"cloud": "hetzner"`.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use baton_cloud::CloudKind;
use baton_cloud::model::IpAddress;

use crate::hetzner::world::HetznerWorld;
use crate::topology::Topology;
use crate::world::World;

/// The world of one dialect.
#[derive(Debug)]
pub(crate) enum CloudWorld {
    /// Cherry Servers.
    Cherry(World),
    /// Hetzner Cloud.
    Hetzner(HetznerWorld),
}

/// Seconds since the Unix epoch (0 if the clock is before it).
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl CloudWorld {
    /// The world of `topology` in the dialect `kind`.
    pub(crate) fn from_topology(kind: CloudKind, topology: &Topology) -> Result<Self, String> {
        match kind {
            CloudKind::Cherry => World::from_topology(topology).map(Self::Cherry),
            CloudKind::Hetzner => HetznerWorld::from_topology(topology, unix_now()).map(Self::Hetzner),
        }
    }

    /// Reads a state file written by [`Self::save`]; refuses one of the other dialect.
    pub(crate) fn load(path: &Path, kind: CloudKind) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
        let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        let found = if value.get("cloud").and_then(serde_json::Value::as_str) == Some("hetzner") {
            CloudKind::Hetzner
        } else {
            CloudKind::Cherry
        };
        if found != kind {
            return Err(format!(
                "it holds a {found} world, and the simulator speaks {kind} (--cloud {found}, or another state file)"
            ));
        }
        match kind {
            // As before the Hetzner dialect existed: the same parse, the same errors.
            CloudKind::Cherry => serde_json::from_str(&text).map(Self::Cherry),
            CloudKind::Hetzner => serde_json::from_value::<HetznerWorld>(value).map(|mut world| {
                // The timers of the actions that ran when it was saved are gone: they end now.
                world.complete_all(unix_now());
                Self::Hetzner(world)
            }),
        }
        .map_err(|e| e.to_string())
    }

    /// Writes the state atomically (temp file + rename).
    pub(crate) fn save(&self, path: &Path) -> Result<(), String> {
        let text = self.to_json().map_err(|e| e.to_string())?;
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).map_err(|e| e.to_string())?;
        std::fs::rename(&tmp, path).map_err(|e| e.to_string())
    }

    fn to_json(&self) -> serde_json::Result<Vec<u8>> {
        match self {
            Self::Cherry(world) => serde_json::to_vec_pretty(world),
            Self::Hetzner(world) => serde_json::to_vec_pretty(world),
        }
    }

    /// The whole state as JSON (`/_sim/state`).
    pub(crate) fn to_value(&self) -> serde_json::Result<serde_json::Value> {
        match self {
            Self::Cherry(world) => serde_json::to_value(world),
            Self::Hetzner(world) => serde_json::to_value(world),
        }
    }

    pub(crate) fn kind(&self) -> CloudKind {
        match self {
            Self::Cherry(_) => CloudKind::Cherry,
            Self::Hetzner(_) => CloudKind::Hetzner,
        }
    }

    pub(crate) fn api_key(&self) -> &str {
        match self {
            Self::Cherry(world) => &world.api_key,
            Self::Hetzner(world) => &world.api_key,
        }
    }

    /// Cherry's project id; 0 for Hetzner (a token is its project).
    pub(crate) fn project_id(&self) -> u64 {
        match self {
            Self::Cherry(world) => world.project_id(),
            Self::Hetzner(_) => 0,
        }
    }

    pub(crate) fn forward_ports(&self) -> Vec<u16> {
        match self {
            Self::Cherry(world) => world.forward_ports.clone(),
            Self::Hetzner(world) => world.forward_ports.clone(),
        }
    }

    /// FIP address → the primary IP of the server it is routed to.
    pub(crate) fn forward_map(&self) -> BTreeMap<IpAddr, IpAddr> {
        match self {
            Self::Cherry(world) => world.forward_map(),
            Self::Hetzner(world) => world.forward_map(),
        }
    }

    /// Starts counting duplicates afresh from the FIPs that exist now.
    pub(crate) fn reset_census(&mut self) {
        match self {
            Self::Cherry(world) => world.reset_census(),
            Self::Hetzner(world) => world.reset_census(),
        }
    }

    pub(crate) fn duplicate_fips(&self) -> u64 {
        match self {
            Self::Cherry(world) => world.duplicate_fips(),
            Self::Hetzner(world) => world.duplicate_fips(),
        }
    }

    pub(crate) fn fips_created_deleted(&self) -> (u64, u64) {
        match self {
            Self::Cherry(world) => world.fips_created_deleted(),
            Self::Hetzner(world) => world.fips_created_deleted(),
        }
    }

    /// How far Cherry's IP list lags behind the writes (the Hetzner dialect's lists do not lag).
    pub(crate) fn set_list_lag(&mut self, lag: Duration) {
        if let Self::Cherry(world) = self {
            world.list_lag = lag;
        }
    }

    /// An IP as the world holds it now, in the shared model.
    pub(crate) fn peek_ip(&self, id: &str) -> Option<IpAddress> {
        match self {
            Self::Cherry(world) => world.get_ip(id).ok(),
            Self::Hetzner(world) => world.peek_ip(id),
        }
    }

    /// Every IP (Cherry) or Floating IP (Hetzner) as the world holds it now, in the shared model.
    pub(crate) fn peek_ips(&self) -> Vec<IpAddress> {
        match self {
            Self::Cherry(world) => world.current_ips(),
            Self::Hetzner(world) => world.peek_ips(),
        }
    }

    /// Replaces a Cherry region's BGP route servers; false if no such region (or Hetzner).
    pub(crate) fn set_region_bgp_hosts(&mut self, slug: &str, hosts: Vec<String>) -> bool {
        match self {
            Self::Cherry(world) => world.set_region_bgp_hosts(slug, hosts),
            Self::Hetzner(_) => false,
        }
    }
}
