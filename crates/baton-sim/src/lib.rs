//! baton-sim: a stateful simulator of the Cherry Servers API, spoken over real HTTP. The
//! production client (`baton-cloud`'s `CherryClient`) talks to it through its ordinary base URL.
//! With [`SimBuilder::cloud`]`(CloudKind::Hetzner)` it speaks Hetzner Cloud's API instead
//! ([`hetzner`]: Floating IPs moved by actions, label selectors, pages, a per-token bucket),
//! over the same topology, faults, stats, state file and FIP routing.
//!
//! ```text
//!  client ──HTTP──► /v1/...  ─► faults layer (429 / hang / latency / 5xx) ─► World (state)
//!                   /_sim/... (stats, log, faults, state)                      │ writes
//!                                                                              ▼
//!  targeted FIPs ─► FipPaths ─► routes in the hub: <fip>/32 via <server primary IP> (the cloud's
//!                                routing; the lab's nodes accept the FIP themselves)
//!                             └► opt-in splice: TCP on <fip>:<port> ─► <server primary IP>:<port>
//! ```
//!
//! Two entry points: [`serve`] runs it from plain [`SimOptions`] until a shutdown future completes
//! (the `baton sim` command fills them from its flags and passes its signal handler), and
//! [`Sim::builder`] starts one in-process for tests and benchmarks. The routes, status codes,
//! error bodies and quirks are those of the real API (`api.cherryservers.com/v1`); the list is in
//! `docs/simulator.md`. The JSON objects are `baton-cloud`'s [`baton_cloud::model`] (and
//! [`baton_cloud::hetzner::model`]), so the simulator and the client cannot disagree on a payload.

mod cloud;
mod faults;
mod forward;
mod guard;
pub mod hetzner;
mod http;
mod latency;
mod paths;
mod route;
mod shared;
mod stats;
pub mod testing;
mod topology;
mod world;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use baton_cloud::CloudKind;
use rand::SeedableRng as _;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::info;
use url::Url;

pub use faults::{Faults, RouteFaults};
pub use hetzner::{HetznerSettings, Reassign};
pub use latency::Latency;
pub use stats::{LogEntry, RouteStats, Stats};
pub use topology::{TopoFip, TopoProject, TopoRegion, TopoServer, Topology};

use self::cloud::CloudWorld;
use self::guard::lock;
use self::shared::Shared;

/// Why the simulator could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// The topology file cannot be read or is invalid.
    #[error("topology {path}: {reason}")]
    Topology {
        /// The file (or `<default>`).
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// The state file cannot be read or parsed.
    #[error("state file {path}: {reason}")]
    State {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A fault setting is out of range.
    #[error("invalid fault setting: {0}")]
    Faults(String),
    /// A Hetzner setting is out of range, or the simulator does not speak Hetzner.
    #[error("invalid Hetzner setting: {0}")]
    Hetzner(String),
    /// The listen address cannot be bound.
    #[error("cannot listen on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The listener is unusable.
    #[error("the simulator listener failed")]
    Listener(#[source] std::io::Error),
}

/// Entry point of the in-process simulator.
#[derive(Debug)]
pub struct Sim;

impl Sim {
    /// A builder with the default (lab) topology and default faults (only the 4 req/s limit).
    pub fn builder() -> SimBuilder {
        SimBuilder {
            cloud: CloudKind::Cherry,
            hetzner: HetznerSettings::default(),
            topology: Topology::default(),
            faults: Faults::default(),
            state_file: None,
            log_capacity: 10_000,
            route_dev: None,
        }
    }
}

/// Configures and starts a simulator.
#[derive(Debug, Clone)]
#[must_use]
pub struct SimBuilder {
    cloud: CloudKind,
    hetzner: HetznerSettings,
    topology: Topology,
    faults: Faults,
    state_file: Option<PathBuf>,
    log_capacity: usize,
    route_dev: Option<String>,
}

impl SimBuilder {
    /// The API it speaks: Cherry Servers (the default) or Hetzner Cloud.
    pub fn cloud(mut self, cloud: CloudKind) -> Self {
        self.cloud = cloud;
        self
    }

    /// The Hetzner dialect's settings (action time and outcome, reassign, rate-limit bucket);
    /// ignored by the Cherry dialect.
    pub fn hetzner(mut self, settings: HetznerSettings) -> Self {
        self.hetzner = settings;
        self
    }

    /// Routes every targeted FIP as the cloud does: `<fip>/32 via <server primary IP> dev
    /// <dev>` in the simulator's network namespace (the lab's hub), so packets keep the FIP as
    /// their destination ([`route`] module). Off by default.
    pub fn route_fips(mut self, dev: impl Into<String>) -> Self {
        self.route_dev = Some(dev.into());
        self
    }

    /// Starts from this topology (ignored when the state file exists).
    pub fn topology(mut self, topology: Topology) -> Self {
        self.topology = topology;
        self
    }

    /// Initial faults.
    pub fn faults(mut self, faults: Faults) -> Self {
        self.faults = faults;
        self
    }

    /// Persist state in this file after every write, and start from it if it exists.
    pub fn state_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.state_file = Some(path.into());
        self
    }

    /// How many requests the log keeps.
    pub fn log_capacity(mut self, entries: usize) -> Self {
        self.log_capacity = entries.max(1);
        self
    }

    /// Binds `addr` and starts.
    pub async fn bind(self, addr: SocketAddr) -> Result<SimHandle, SimError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| SimError::Bind { addr, source })?;
        self.start(listener).await
    }

    /// Serves on `listener` until [`SimHandle::shutdown`].
    #[allow(clippy::unused_async)] // async so a later version can load state without blocking
    pub async fn start(self, listener: TcpListener) -> Result<SimHandle, SimError> {
        let Self {
            cloud,
            hetzner,
            topology,
            faults,
            state_file,
            log_capacity,
            route_dev,
        } = self;
        faults.validate().map_err(SimError::Faults)?;
        hetzner.validate().map_err(SimError::Hetzner)?;
        let mut world = match &state_file {
            Some(path) if path.exists() => {
                CloudWorld::load(path, cloud).map_err(|reason| SimError::State {
                    path: path.clone(),
                    reason,
                })?
            }
            _ => CloudWorld::from_topology(cloud, &topology).map_err(|reason| SimError::Topology {
                path: "<given>".into(),
                reason,
            })?,
        };
        let addr = listener.local_addr().map_err(SimError::Listener)?;
        let shutdown = CancellationToken::new();
        let rng = match faults.seed {
            Some(seed) => rand::rngs::StdRng::seed_from_u64(seed),
            None => rand::rngs::StdRng::from_os_rng(),
        };
        world.reset_census();
        world.set_list_lag(Duration::from_millis(faults.list_lag_ms));
        let api_key = world.api_key().to_owned();
        let project_id = world.project_id();
        let paths = paths::FipPaths::new(world.forward_ports(), route_dev, shutdown.clone());
        paths.sync(&world.forward_map(), Duration::ZERO);
        if let Some(path) = &state_file
            && let Err(reason) = world.save(path)
        {
            return Err(SimError::State {
                path: path.clone(),
                reason,
            });
        }
        let shared = Arc::new(Shared {
            world: Mutex::new(world),
            faults: Mutex::new(faults),
            rng: Mutex::new(rng),
            limiter: Mutex::new(faults::RateLimiter::default()),
            hetzner: (cloud == CloudKind::Hetzner).then(|| hetzner::Runtime::new(hetzner)),
            recorder: Mutex::new(stats::Recorder::new(log_capacity)),
            paths,
            state_file,
            started: tokio::time::Instant::now(),
            shutdown: shutdown.clone(),
        });
        let app = http::router(shared.clone()).into_make_service_with_connect_info::<SocketAddr>();
        let token = shutdown.clone();
        let server = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(token.cancelled_owned())
                .await
        });
        match cloud {
            CloudKind::Cherry => info!(%addr, project = project_id, "Cherry Servers API simulator listening"),
            CloudKind::Hetzner => info!(%addr, "Hetzner Cloud API simulator listening"),
        }
        Ok(SimHandle {
            addr,
            api_key,
            project_id,
            shared,
            shutdown,
            server: Some(server),
        })
    }
}

/// A running simulator.
#[derive(Debug)]
pub struct SimHandle {
    addr: SocketAddr,
    api_key: String,
    project_id: u64,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    server: Option<JoinHandle<std::io::Result<()>>>,
}

impl SimHandle {
    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr>/`: the client's `base_url`.
    pub fn base_url(&self) -> Url {
        // An http URL made of a socket address always parses.
        Url::parse(&format!("http://{}/", self.addr)).unwrap_or_else(|_| unreachable!())
    }

    /// The bearer token it accepts.
    pub fn api_key(&self) -> &str {
        &self.api_key
    }

    /// The project id (0 in the Hetzner dialect: a token is its project).
    pub fn project_id(&self) -> u64 {
        self.project_id
    }

    /// The API it speaks.
    pub fn cloud(&self) -> CloudKind {
        lock(&self.shared.world).kind()
    }

    /// The Hetzner dialect's settings (`None` in the Cherry dialect).
    pub fn hetzner_settings(&self) -> Option<HetznerSettings> {
        self.shared.hetzner.as_ref().map(|rt| lock(&rt.settings).clone())
    }

    /// Replaces the Hetzner dialect's settings (as `PATCH /_sim/hetzner` does); refused by the
    /// Cherry dialect.
    pub fn set_hetzner_settings(&self, settings: HetznerSettings) -> Result<(), SimError> {
        let rt = self
            .shared
            .hetzner
            .as_ref()
            .ok_or_else(|| SimError::Hetzner("the simulator speaks Cherry".into()))?;
        hetzner::http::apply_settings(rt, settings).map_err(SimError::Hetzner)
    }

    /// Counters since start or the last reset.
    pub fn stats(&self) -> Stats {
        self.shared.stats()
    }

    /// Logged requests with `seq >= since`.
    pub fn log(&self, since: u64) -> Vec<LogEntry> {
        lock(&self.shared.recorder).log_since(since)
    }

    /// Clears counters, log and rate-limit buckets.
    pub fn reset_stats(&self) {
        self.shared.reset_stats();
    }

    /// An IP address as the world holds it now, read directly: no latency, no rate limit, not
    /// logged (for harnesses that watch the cloud without using its request budget). In the
    /// Hetzner dialect `id` is a Floating IP's numeric id as text, and the FIP reads as the
    /// shared model's: `targeted_to` is the server it is assigned to (once the assign action
    /// succeeded), `tags` its labels, `region` its home location.
    pub fn peek_ip(&self, id: &str) -> Option<baton_cloud::model::IpAddress> {
        lock(&self.shared.world).peek_ip(id)
    }

    /// Every IP address as the world holds it now (no list lag, latency or rate limit; not
    /// logged); the Floating IPs only, in the Hetzner dialect.
    pub fn peek_ips(&self) -> Vec<baton_cloud::model::IpAddress> {
        lock(&self.shared.world).peek_ips()
    }

    /// The current faults.
    pub fn faults(&self) -> Faults {
        lock(&self.shared.faults).clone()
    }

    /// Replaces the faults.
    pub fn set_faults(&self, faults: Faults) -> Result<(), SimError> {
        http::apply_faults(&self.shared, faults).map_err(SimError::Faults)
    }

    /// Replaces the BGP route servers of the region `slug` (as when Cherry renumbers them);
    /// returns whether the region exists.
    pub fn set_region_bgp_hosts(&self, slug: &str, hosts: &[&str]) -> bool {
        lock(&self.shared.world).set_region_bgp_hosts(slug, hosts.iter().map(|h| (*h).to_owned()).collect())
    }

    /// A token that stops the simulator when cancelled.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Stops serving (hung requests are released), removes the FIP routes it installed and
    /// waits for the server to finish.
    pub async fn shutdown(mut self) {
        self.shutdown.cancel();
        self.shared.paths.clear_routes();
        if let Some(server) = self.server.take() {
            let _ = server.await;
        }
    }

    /// Waits until the server stops (after the shutdown token is cancelled).
    pub async fn wait(mut self) -> Result<(), SimError> {
        if let Some(server) = self.server.take() {
            let result = server.await;
            self.shared.paths.clear_routes();
            match result {
                Ok(result) => result.map_err(SimError::Listener)?,
                Err(join) => return Err(SimError::Listener(std::io::Error::other(join))),
            }
        }
        Ok(())
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        self.shutdown.cancel();
        self.shared.paths.clear_routes();
    }
}

/// What `baton sim` runs: where to listen, the starting world and the faults. Plain options; the
/// command line that fills them lives in the `baton` binary.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// Address to serve the API (and the `/_sim` admin endpoint) on.
    pub listen: SocketAddr,
    /// The API it speaks (Cherry Servers by default).
    pub cloud: CloudKind,
    /// The Hetzner dialect's settings (ignored by the Cherry dialect).
    pub hetzner: HetznerSettings,
    /// Topology file (YAML or JSON); `None`: the lab topology ([`Topology::default`]).
    pub topology: Option<PathBuf>,
    /// Persist the state here after every write and resume from it on start.
    pub state: Option<PathBuf>,
    /// The API key to accept (overrides the topology's).
    pub api_key: Option<String>,
    /// CIDR new FIPs are allocated from (overrides the topology's).
    pub fip_pool: Option<String>,
    /// TCP ports spliced from a targeted FIP to its server (overrides the topology's; empty
    /// disables the splice). An opt-in for labs without nodes.
    pub forward_ports: Option<Vec<u16>>,
    /// Route targeted FIPs through this device of the simulator's network namespace, as the
    /// cloud does (`None`: no routes).
    pub route_fips: Option<String>,
    /// Initial faults.
    pub faults: Faults,
}

impl SimOptions {
    fn into_builder(self) -> Result<(SimBuilder, SocketAddr), SimError> {
        let Self {
            listen,
            cloud,
            hetzner,
            topology,
            state,
            api_key,
            fip_pool,
            forward_ports,
            route_fips,
            faults,
        } = self;
        let mut topo = match &topology {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| SimError::Topology {
                    path: path.display().to_string(),
                    reason: e.to_string(),
                })?;
                Topology::from_text(&text).map_err(|reason| SimError::Topology {
                    path: path.display().to_string(),
                    reason,
                })?
            }
            None => Topology::default(),
        };
        if let Some(key) = api_key {
            topo.api_key = key;
        }
        if let Some(pool) = fip_pool {
            topo.fip_pool = pool;
        }
        if let Some(ports) = forward_ports {
            topo.forward_ports = ports;
        }
        let mut builder = Sim::builder()
            .cloud(cloud)
            .hetzner(hetzner)
            .topology(topo)
            .faults(faults);
        if let Some(state) = state {
            builder = builder.state_file(state);
        }
        if let Some(dev) = route_fips {
            builder = builder.route_fips(dev);
        }
        Ok((builder, listen))
    }
}

/// Serves the simulator described by `options` until `shutdown` completes (or the simulator is
/// stopped through its own token), then waits for the server to finish.
pub async fn serve(options: SimOptions, shutdown: impl Future<Output = ()>) -> Result<(), SimError> {
    let (builder, listen) = options.into_builder()?;
    let handle = builder.bind(listen).await?;
    let stop = handle.shutdown_token();
    tokio::select! {
        () = shutdown => stop.cancel(),
        () = stop.cancelled() => {}
    }
    handle.wait().await
}

#[cfg(test)]
mod tests;
