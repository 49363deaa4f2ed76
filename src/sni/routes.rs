//! The route table: host name → backend set, original destination → host name, and an
//! optional default. Immutable once built; a change builds a new table and publishes it
//! (`tokio::sync::watch`), so a connection keeps the backend it was spliced to.
//!
//! Backend health outlives tables: a backend that refused a connection (or did not answer
//! within the connect timeout) is skipped for [`DOWN_FOR`]; after that ONE connection at a time
//! tries it (a trial: up again if it connects, down for another [`DOWN_FOR`] if not), and one an
//! active health check (`health.rs`) says is Down is skipped until it is Up again. While a
//! tenant has no backend to try, its connections are refused at once (fail fast) instead of
//! each waiting out connect timeouts. The state lives in [`Health`], keyed by address, so a
//! reload does not forget it.
//!
//! A tenant may have routes per listening port (a Service's `port` 8132 for konnectivity beside
//! its `https` port): a connection to local port P takes the tenant's port-P backends if it
//! has them, else its default ones.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::hello::normalize_host;
use super::metrics::{Metrics, TenantMetrics};

/// How long a backend that failed a connect is skipped.
pub const DOWN_FOR: Duration = Duration::from_secs(2);

/// Bad route specifications, naming the flag and the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} {value:?}: {why}")]
pub struct RouteError {
    pub field: &'static str,
    pub value: String,
    pub why: String,
}

impl RouteError {
    fn new(field: &'static str, value: &str, why: impl Into<String>) -> Self {
        Self {
            field,
            value: value.to_owned(),
            why: why.into(),
        }
    }
}

/// One backend address and its passive health.
#[derive(Debug)]
pub struct Backend {
    pub addr: SocketAddr,
    /// Milliseconds since [`Health`]'s epoch until which the backend is skipped; 0: up.
    down_until: AtomicU64,
    /// A connection is trying the backend after its hold-down (one at a time).
    trial: AtomicBool,
    /// An active health check says Down (`health.rs`); false while none runs.
    probed_down: AtomicBool,
}

impl Backend {
    /// Whether the backend is up at `now_ms`: no failed connect within the hold-down and no
    /// active health check saying Down.
    pub fn is_up(&self, now_ms: u64) -> bool {
        !self.probed_down.load(Ordering::Relaxed) && self.down_until.load(Ordering::Relaxed) <= now_ms
    }

    /// Records an active health check's verdict; returns whether it changed.
    pub fn set_probed_down(&self, down: bool) -> bool {
        self.probed_down.swap(down, Ordering::Relaxed) != down
    }

    /// Whether a connection may try the backend now: it is up, or its hold-down is over and no
    /// other connection is trying it (then this one is its trial).
    fn claim(self: &Arc<Self>, now_ms: u64) -> Option<Attempt> {
        if self.probed_down.load(Ordering::Relaxed) {
            return None;
        }
        match self.down_until.load(Ordering::Relaxed) {
            0 => Some(Attempt {
                backend: Arc::clone(self),
                trial: false,
            }),
            until if until <= now_ms => self
                .trial
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
                .then(|| Attempt {
                    backend: Arc::clone(self),
                    trial: true,
                }),
            _ => None,
        }
    }
}

/// A backend one connection may try. A trial's claim ends when the attempt is dropped, whatever
/// happened (a connection closed mid-connect does not keep the backend claimed).
#[derive(Debug)]
pub struct Attempt {
    pub backend: Arc<Backend>,
    /// Whether this is the one trial after a hold-down.
    pub trial: bool,
}

impl Drop for Attempt {
    fn drop(&mut self) {
        if self.trial {
            self.backend.trial.store(false, Ordering::Release);
        }
    }
}

/// The health of every backend ever routed to, shared by every table.
#[derive(Debug)]
pub struct Health {
    epoch: Instant,
    backends: Mutex<HashMap<SocketAddr, Arc<Backend>>>,
}

impl Default for Health {
    fn default() -> Self {
        Self {
            epoch: Instant::now(),
            backends: Mutex::default(),
        }
    }
}

impl Health {
    /// The backend for `addr`, the same one every table built from this `Health` shares.
    pub fn backend(&self, addr: SocketAddr) -> Arc<Backend> {
        let mut map = self
            .backends
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.entry(addr)
            .or_insert_with(|| {
                Arc::new(Backend {
                    addr,
                    down_until: AtomicU64::new(0),
                    trial: AtomicBool::new(false),
                    probed_down: AtomicBool::new(false),
                })
            })
            .clone()
    }

    /// Milliseconds since this `Health` was made (never 0, which means "up").
    pub fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// Records a failed connect.
    pub fn mark_down(&self, backend: &Backend) {
        let until = self.now_ms() + u64::try_from(DOWN_FOR.as_millis()).unwrap_or(u64::MAX);
        backend.down_until.store(until, Ordering::Relaxed);
    }

    /// Records a successful connect.
    pub fn mark_up(backend: &Backend) {
        backend.down_until.store(0, Ordering::Relaxed);
    }
}

/// Why a backend set gave no backend to try.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoBackend {
    /// The set has no backends (a tenant without a ready endpoint).
    Empty,
    /// Every backend is down and none is due for a trial: fail fast.
    NoneHealthy,
    /// The set has its most connects in flight.
    Busy,
}

/// The backends of one tenant (or of the default route).
#[derive(Debug)]
pub struct BackendSet {
    /// The name used in logs and metric labels: the first host name (with `:PORT` for a
    /// port's own backends), or `default`.
    pub name: String,
    pub backends: Vec<Arc<Backend>>,
    /// Round-robin start.
    next: AtomicUsize,
    /// Connects in flight now.
    connecting: AtomicUsize,
    /// The tenant's metric handles, looked up on first use.
    metrics: OnceLock<TenantMetrics>,
}

impl BackendSet {
    fn new(name: String, backends: Vec<Arc<Backend>>) -> Self {
        Self {
            name,
            backends,
            next: AtomicUsize::new(0),
            connecting: AtomicUsize::new(0),
            metrics: OnceLock::new(),
        }
    }

    /// This set's metric handles in `metrics` (looked up once per set, not per connection).
    pub fn metrics(&self, metrics: &Metrics) -> &TenantMetrics {
        self.metrics.get_or_init(|| metrics.tenant(&self.name))
    }

    /// The backends one connection may try, in order: round-robin among those up, then a
    /// down one whose hold-down is over (its one trial). Empty with the reason when there is
    /// none — the connection is refused at once.
    pub fn order(&self, now_ms: u64) -> Result<Vec<Attempt>, NoBackend> {
        let n = self.backends.len();
        if n == 0 {
            return Err(NoBackend::Empty);
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        let rotated = self.backends[start..].iter().chain(&self.backends[..start]);
        let mut out: Vec<Attempt> = rotated.filter_map(|b| b.claim(now_ms)).collect();
        out.sort_by_key(|a| a.trial); // stable: the up ones first, in round-robin order
        if out.is_empty() {
            Err(NoBackend::NoneHealthy)
        } else {
            Ok(out)
        }
    }

    /// A slot for one connect, if fewer than `max` are in flight for this set.
    pub fn connecting(self: &Arc<Self>, max: usize) -> Result<ConnectSlot, NoBackend> {
        if self.connecting.fetch_add(1, Ordering::AcqRel) >= max {
            self.connecting.fetch_sub(1, Ordering::AcqRel);
            return Err(NoBackend::Busy);
        }
        Ok(ConnectSlot(Arc::clone(self)))
    }
}

/// One connect in flight for a backend set, counted until dropped.
#[derive(Debug)]
pub struct ConnectSlot(Arc<BackendSet>);

impl Drop for ConnectSlot {
    fn drop(&mut self) {
        self.0.connecting.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Where a connection goes.
#[derive(Debug, Default)]
pub struct RouteTable {
    hosts: HashMap<String, Arc<BackendSet>>,
    /// A tenant's backends for connections to one local port: host → (port, backends).
    ports: HashMap<String, Vec<(u16, Arc<BackendSet>)>>,
    default: Option<Arc<BackendSet>>,
    /// PROXY listener: original destination (address and port, or address alone) → host name.
    destinations: HashMap<SocketAddr, String>,
    destination_ips: HashMap<IpAddr, String>,
}

impl RouteTable {
    /// The backend set for a host name (already normalized), else the default.
    pub fn for_host(&self, host: Option<&str>) -> Option<&Arc<BackendSet>> {
        host.and_then(|h| self.hosts.get(h)).or(self.default.as_ref())
    }

    /// The backend set for a host name reached on local port `port`: the tenant's backends
    /// for that port, else its default ones, else the default route.
    pub fn for_host_port(&self, host: Option<&str>, port: u16) -> Option<&Arc<BackendSet>> {
        if let Some(h) = host
            && let Some(by_port) = self.ports.get(h)
            && let Some((_, set)) = by_port.iter().find(|(p, _)| *p == port)
        {
            return Some(set);
        }
        self.for_host(host)
    }

    /// The backend set of exactly `host` (no default).
    pub fn get(&self, host: &str) -> Option<&Arc<BackendSet>> {
        self.hosts.get(host)
    }

    /// Whether `host` is routed (on any port).
    pub fn is_routed(&self, host: &str) -> bool {
        self.hosts.contains_key(host) || self.ports.contains_key(host)
    }

    /// The host name an original destination is mapped to.
    pub fn host_for_destination(&self, dst: SocketAddr) -> Option<&str> {
        self.destinations
            .get(&dst)
            .or_else(|| self.destination_ips.get(&dst.ip()))
            .map(String::as_str)
    }

    /// Every distinct backend set with its host names (for metrics and logs).
    pub fn sets(&self) -> Vec<Arc<BackendSet>> {
        let mut seen: BTreeMap<String, Arc<BackendSet>> = BTreeMap::new();
        for set in self
            .hosts
            .values()
            .chain(self.ports.values().flatten().map(|(_, s)| s))
            .chain(self.default.as_ref())
        {
            seen.entry(set.name.clone()).or_insert_with(|| set.clone());
        }
        seen.into_values().collect()
    }

    /// Every host name routed (on every port or on one).
    pub fn hosts(&self) -> impl Iterator<Item = &str> {
        self.hosts.keys().map(String::as_str).chain(
            self.ports
                .keys()
                .filter(|h| !self.hosts.contains_key(*h))
                .map(String::as_str),
        )
    }

    /// Number of host names routed.
    pub fn host_count(&self) -> usize {
        self.hosts().count()
    }
}

/// The routes as configured, before they are bound to backends' health.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteSpec {
    /// (host names, backends): one entry per tenant.
    pub tenants: Vec<(Vec<String>, Vec<SocketAddr>)>,
    pub default: Vec<SocketAddr>,
    /// Original destination → host name.
    pub destinations: Vec<(Destination, String)>,
    /// (host names, local port, backends): a tenant's backends for connections to that port.
    pub ports: Vec<(Vec<String>, u16, Vec<SocketAddr>)>,
}

/// An original destination of the PROXY listener's routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Destination {
    Addr(SocketAddr),
    Ip(IpAddr),
}

impl RouteSpec {
    /// Adds a `HOST[,HOST…][:PORT]=ADDR[,ADDR…]` route (`--route`): without PORT the tenant's
    /// backends on every port, with it its backends for connections to that local port (a
    /// second listener, konnectivity's 8132 say).
    pub fn add_route(&mut self, spec: &str) -> Result<(), RouteError> {
        let bad = |why: &str| RouteError::new("--route", spec, why);
        let (hosts, addrs) = spec
            .split_once('=')
            .ok_or_else(|| bad("expected HOST[,HOST…][:PORT]=ADDR[,ADDR…]"))?;
        let (hosts, port) = match hosts.rsplit_once(':') {
            Some((hosts, port)) => {
                let port = port
                    .trim()
                    .parse::<u16>()
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or_else(|| bad(&format!("{port:?} is not a port (1-65535)")))?;
                (hosts, Some(port))
            }
            None => (hosts, None),
        };
        let hosts = hosts
            .split(',')
            .map(|h| {
                normalize_host(h.trim().as_bytes()).map_err(|_| bad(&format!("{h:?} is not a host name")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let addrs = parse_addrs("--route", spec, addrs)?;
        for h in &hosts {
            if let Some(clash) = self.clash(h, port) {
                return Err(bad(&clash));
            }
        }
        match port {
            None => self.tenants.push((hosts, addrs)),
            Some(port) => self.ports.push((hosts, port, addrs)),
        }
        Ok(())
    }

    /// The error to give when `host` already has a route on `port` (`None`: its route for
    /// every port).
    fn clash(&self, host: &str, port: Option<u16>) -> Option<String> {
        match port {
            None => self
                .tenants
                .iter()
                .any(|(hs, _)| hs.iter().any(|h| h == host))
                .then(|| format!("host {host} is routed twice")),
            Some(port) => self
                .ports
                .iter()
                .any(|(hs, p, _)| *p == port && hs.iter().any(|h| h == host))
                .then(|| format!("host {host} is routed twice on port {port}")),
        }
    }

    /// Sets the default backends (`--default ADDR[,ADDR…]`).
    pub fn set_default(&mut self, spec: &str) -> Result<(), RouteError> {
        self.default = parse_addrs("--default", spec, spec)?;
        Ok(())
    }

    /// Adds a `DST=HOST` mapping (`--proxy-route`); DST is `IP` or `IP:PORT`.
    pub fn add_destination(&mut self, spec: &str) -> Result<(), RouteError> {
        let bad = |why: &str| RouteError::new("--proxy-route", spec, why);
        let (dst, host) = spec.split_once('=').ok_or_else(|| bad("expected DSTADDR=HOST"))?;
        let dst = dst.trim();
        let dst = if let Ok(a) = dst.parse::<SocketAddr>() {
            Destination::Addr(a)
        } else {
            Destination::Ip(
                dst.trim_start_matches('[')
                    .trim_end_matches(']')
                    .parse()
                    .map_err(|_| bad(&format!("{dst:?} is not IP or IP:PORT")))?,
            )
        };
        let host = normalize_host(host.trim().as_bytes())
            .map_err(|_| bad(&format!("{host:?} is not a host name")))?;
        self.destinations.push((dst, host));
        Ok(())
    }

    /// Parses a routes file: one `HOST[,HOST…][:PORT]=ADDR[,ADDR…]` per line, `default=ADDR[,…]`,
    /// `proxy DST=HOST`; `#` starts a comment.
    pub fn parse_file(text: &str) -> Result<Self, RouteError> {
        let mut spec = Self::default();
        for line in text.lines() {
            let line = line.split('#').next().unwrap_or_default().trim();
            if line.is_empty() {
                continue;
            }
            if let Some(rest) = line.strip_prefix("default=") {
                spec.set_default(rest)?;
            } else if let Some(rest) = line.strip_prefix("proxy ") {
                spec.add_destination(rest.trim())?;
            } else {
                spec.add_route(line)?;
            }
        }
        Ok(spec)
    }

    /// Adds every route of `other` (a host routed in both, on the same port or on every port,
    /// is an error).
    pub fn merge(&mut self, other: &Self) -> Result<(), RouteError> {
        for (hosts, addrs) in &other.tenants {
            for h in hosts {
                if let Some(clash) = self.clash(h, None) {
                    return Err(RouteError::new("routes", h, clash));
                }
            }
            self.tenants.push((hosts.clone(), addrs.clone()));
        }
        for (hosts, port, addrs) in &other.ports {
            for h in hosts {
                if let Some(clash) = self.clash(h, Some(*port)) {
                    return Err(RouteError::new("routes", h, clash));
                }
            }
            self.ports.push((hosts.clone(), *port, addrs.clone()));
        }
        if !other.default.is_empty() {
            self.default.clone_from(&other.default);
        }
        self.destinations.extend(other.destinations.iter().cloned());
        Ok(())
    }

    /// Adds the tenants of `other` whose hosts are not routed yet, on any port (a tenant keeps
    /// the hosts that are free, with their port routes); returns the hosts left out.
    pub fn merge_missing(&mut self, other: &Self) -> Vec<String> {
        let mut skipped = Vec::new();
        let routed: Vec<String> = self
            .tenants
            .iter()
            .map(|(hs, _)| hs)
            .chain(self.ports.iter().map(|(hs, _, _)| hs))
            .flatten()
            .cloned()
            .collect();
        let free = |h: &String| !routed.contains(h);
        for (hosts, addrs) in &other.tenants {
            let (free, taken): (Vec<String>, Vec<String>) = hosts.iter().cloned().partition(free);
            skipped.extend(taken);
            if !free.is_empty() {
                self.tenants.push((free, addrs.clone()));
            }
        }
        for (hosts, port, addrs) in &other.ports {
            let hosts: Vec<String> = hosts.iter().filter(|h| free(h)).cloned().collect();
            if !hosts.is_empty() {
                self.ports.push((hosts, *port, addrs.clone()));
            }
        }
        skipped
    }

    /// Binds the spec to backends' shared health.
    pub fn build(&self, health: &Health) -> RouteTable {
        let set = |name: String, addrs: &[SocketAddr]| {
            Arc::new(BackendSet::new(
                name,
                addrs.iter().map(|a| health.backend(*a)).collect(),
            ))
        };
        let mut table = RouteTable::default();
        for (hosts, addrs) in &self.tenants {
            let s = set(hosts[0].clone(), addrs);
            for h in hosts {
                table.hosts.insert(h.clone(), s.clone());
            }
        }
        for (hosts, port, addrs) in &self.ports {
            let s = set(format!("{}:{port}", hosts[0]), addrs);
            for h in hosts {
                let by_port = table.ports.entry(h.clone()).or_default();
                by_port.retain(|(p, _)| p != port);
                by_port.push((*port, s.clone()));
            }
        }
        if !self.default.is_empty() {
            table.default = Some(set("default".into(), &self.default));
        }
        for (dst, host) in &self.destinations {
            match dst {
                Destination::Addr(a) => table.destinations.insert(*a, host.clone()),
                Destination::Ip(ip) => table.destination_ips.insert(*ip, host.clone()),
            };
        }
        table
    }
}

fn parse_addrs(field: &'static str, spec: &str, addrs: &str) -> Result<Vec<SocketAddr>, RouteError> {
    let out = addrs
        .split(',')
        .map(str::trim)
        .map(|a| {
            a.parse::<SocketAddr>()
                .map_err(|_| RouteError::new(field, spec, format!("{a:?} is not IP:PORT")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if out.is_empty() {
        return Err(RouteError::new(field, spec, "no backend address"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
