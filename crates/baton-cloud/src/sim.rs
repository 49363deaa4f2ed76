//! `baton sim`: a stateful simulator of the Cherry Servers API, spoken over real HTTP.
//!
//! ```text
//!  client ──HTTP──► /v1/...  ─► faults layer (429 / hang / latency / 5xx) ─► World (state)
//!                   /_sim/... (stats, log, faults, state)                      │ writes
//!                                                                              ▼
//!  TCP to <fip>:6443 ◄── Forwarder (one listener per targeted FIP) ──► <server primary IP>:6443
//! ```
//!
//! Used from the CLI ([`run`]) and in-process by tests ([`Sim::builder`]). The routes, status
//! codes, error bodies and quirks follow reference/cherry-api.md §9; see `docs/simulator.md`.

mod faults;
mod forward;
mod http;
mod stats;
mod topology;
mod world;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::SeedableRng as _;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::info;
use url::Url;

pub use faults::Faults;
pub use stats::{LogEntry, RouteStats, Stats};
pub use topology::{TopoFip, TopoProject, TopoRegion, TopoServer, Topology};

use self::http::{Shared, lock};
use self::world::World;

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
            topology: Topology::default(),
            faults: Faults::default(),
            state_file: None,
            log_capacity: 10_000,
        }
    }
}

/// Configures and starts a simulator.
#[derive(Debug, Clone)]
#[must_use]
pub struct SimBuilder {
    topology: Topology,
    faults: Faults,
    state_file: Option<PathBuf>,
    log_capacity: usize,
}

impl SimBuilder {
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
            topology,
            faults,
            state_file,
            log_capacity,
        } = self;
        faults.validate().map_err(SimError::Faults)?;
        let world = match &state_file {
            Some(path) if path.exists() => load_state(path)?,
            _ => World::from_topology(&topology).map_err(|reason| SimError::Topology {
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
        let api_key = world.api_key.clone();
        let project_id = world.project_id();
        let forwarder = forward::Forwarder::new(world.forward_ports.clone(), shutdown.clone());
        forwarder.sync(&world.forward_map(), Duration::ZERO);
        if let Some(path) = &state_file
            && let Err(reason) = save_state(path, &world)
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
            recorder: Mutex::new(stats::Recorder::new(log_capacity)),
            forwarder,
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
        info!(%addr, project = project_id, "Cherry Servers API simulator listening");
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

    /// The project id.
    pub fn project_id(&self) -> u64 {
        self.project_id
    }

    /// Counters since start or the last reset.
    pub fn stats(&self) -> Stats {
        lock(&self.shared.recorder).stats.clone()
    }

    /// Logged requests with `seq >= since`.
    pub fn log(&self, since: u64) -> Vec<LogEntry> {
        lock(&self.shared.recorder).log_since(since)
    }

    /// Clears counters, log and rate-limit buckets.
    pub fn reset_stats(&self) {
        lock(&self.shared.recorder).reset();
        lock(&self.shared.limiter).reset();
    }

    /// An IP address as the world holds it now, read directly: no latency, no rate limit, not
    /// logged (for harnesses that watch the cloud without using its request budget).
    pub fn peek_ip(&self, id: &str) -> Option<crate::model::IpAddress> {
        lock(&self.shared.world).get_ip(id).ok()
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

    /// Stops serving (hung requests are released) and waits for the server to finish.
    pub async fn shutdown(mut self) {
        self.shutdown.cancel();
        if let Some(server) = self.server.take() {
            let _ = server.await;
        }
    }

    /// Waits until the server stops (after the shutdown token is cancelled).
    pub async fn wait(mut self) -> Result<(), SimError> {
        if let Some(server) = self.server.take() {
            match server.await {
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
    }
}

fn load_state(path: &Path) -> Result<World, SimError> {
    let err = |reason: String| SimError::State {
        path: path.to_owned(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| err(e.to_string()))
}

/// Writes the state atomically (temp file + rename).
pub(crate) fn save_state(path: &Path, world: &World) -> Result<(), String> {
    let text = serde_json::to_vec_pretty(world).map_err(|e| e.to_string())?;
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).map_err(|e| e.to_string())?;
    std::fs::rename(&tmp, path).map_err(|e| e.to_string())
}

/// `baton sim` arguments. Every flag also reads a `BATON_SIM_*` variable.
#[derive(Debug, Clone, clap::Args)]
pub struct SimArgs {
    /// Address to serve the API (and the `/_sim` admin endpoint) on.
    #[arg(long, env = "BATON_SIM_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Topology file (YAML or JSON); without it, the lab topology (see docs/simulator.md).
    #[arg(long, env = "BATON_SIM_TOPOLOGY")]
    pub topology: Option<PathBuf>,
    /// Persist the state here after every write and resume from it on start.
    #[arg(long, env = "BATON_SIM_STATE")]
    pub state: Option<PathBuf>,
    /// The API key to accept (overrides the topology's).
    #[arg(long, env = "BATON_SIM_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// CIDR new FIPs are allocated from (overrides the topology's; default 203.0.113.0/24).
    #[arg(long, env = "BATON_SIM_FIP_POOL")]
    pub fip_pool: Option<String>,
    /// TCP ports forwarded from a targeted FIP to its server (overrides the topology's; default
    /// 6443). An empty value disables forwarding.
    #[arg(long, env = "BATON_SIM_FORWARD_PORTS", value_delimiter = ',', num_args = 0..)]
    pub forward_ports: Option<Vec<u16>>,
    /// Latency added to every API request, in milliseconds.
    #[arg(long, env = "BATON_SIM_LATENCY_MS", default_value_t = 0)]
    pub latency_ms: u64,
    /// Fraction (0..=1) of API requests answered with an injected error.
    #[arg(long, env = "BATON_SIM_ERROR_RATE", default_value_t = 0.0)]
    pub error_rate: f64,
    /// Statuses injected errors pick from.
    #[arg(
        long,
        env = "BATON_SIM_ERROR_STATUSES",
        value_delimiter = ',',
        default_value = "502,503,504"
    )]
    pub error_statuses: Vec<u16>,
    /// Fraction of injected errors with an HTML (non-JSON) body.
    #[arg(long, env = "BATON_SIM_NON_JSON_RATIO", default_value_t = 0.5)]
    pub non_json_ratio: f64,
    /// Fraction of injected errors on writes that are answered after the write took effect.
    #[arg(long, env = "BATON_SIM_LOST_RESPONSE_RATIO", default_value_t = 0.5)]
    pub lost_response_ratio: f64,
    /// Requests per second allowed per client address before 429; 0 disables the limit.
    #[arg(long, env = "BATON_SIM_RATE_LIMIT", default_value_t = 4.0)]
    pub rate_limit: f64,
    /// `Retry-After` seconds sent with a 429; 0 sends none.
    #[arg(long, env = "BATON_SIM_RETRY_AFTER", default_value_t = 1)]
    pub retry_after: u64,
    /// Fraction (0..=1) of API requests that hang.
    #[arg(long, env = "BATON_SIM_HANG_RATE", default_value_t = 0.0)]
    pub hang_rate: f64,
    /// Answer 400 to DELETE of a FIP that is targeted to a server.
    #[arg(long, env = "BATON_SIM_REJECT_DELETE_ATTACHED")]
    pub reject_delete_attached: bool,
    /// Seed of the fault dice.
    #[arg(long, env = "BATON_SIM_SEED")]
    pub seed: Option<u64>,
    /// For this many milliseconds after a FIP retarget, new connections to the FIP still
    /// follow the old route (the API answers at once).
    #[arg(long, env = "BATON_SIM_RETARGET_DELAY_MS", default_value_t = 0)]
    pub retarget_delay_ms: u64,
}

impl SimArgs {
    fn into_builder(self) -> Result<(SimBuilder, SocketAddr), SimError> {
        let Self {
            listen,
            topology,
            state,
            api_key,
            fip_pool,
            forward_ports,
            latency_ms,
            error_rate,
            error_statuses,
            non_json_ratio,
            lost_response_ratio,
            rate_limit,
            retry_after,
            hang_rate,
            reject_delete_attached,
            seed,
            retarget_delay_ms,
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
        let faults = Faults {
            latency_ms,
            error_rate,
            error_statuses,
            non_json_ratio,
            lost_response_ratio,
            rate_limit: (rate_limit > 0.0).then_some(rate_limit),
            retry_after_secs: (retry_after > 0).then_some(retry_after),
            hang_rate,
            reject_delete_attached,
            seed,
            retarget_delay_ms,
        };
        let mut builder = Sim::builder().topology(topo).faults(faults);
        if let Some(state) = state {
            builder = builder.state_file(state);
        }
        Ok((builder, listen))
    }
}

/// Runs `baton sim` until `shutdown` is cancelled.
pub async fn run(args: SimArgs, shutdown: CancellationToken) -> Result<(), SimError> {
    let (builder, listen) = args.into_builder()?;
    let handle = builder.bind(listen).await?;
    let stop = handle.shutdown_token();
    tokio::select! {
        () = shutdown.cancelled() => stop.cancel(),
        () = stop.cancelled() => {}
    }
    handle.wait().await
}

/// Runs `baton sim` until SIGINT or SIGTERM.
pub async fn run_until_signal(args: SimArgs) -> Result<(), SimError> {
    let token = CancellationToken::new();
    let on_signal = token.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        info!("signal received; stopping the simulator");
        on_signal.cancel();
    });
    run(args, token).await
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

#[cfg(test)]
mod tests;
