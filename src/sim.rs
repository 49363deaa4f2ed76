//! `baton sim`: the command line of the cloud API simulator (the `baton-sim` crate): Cherry
//! Servers by default, Hetzner Cloud with `--cloud hetzner`.
//!
//! ```text
//!  flags / BATON_SIM_* ── SimArgs ── into_options ──► baton_sim::serve(options, shutdown)
//!                                                         ▲
//!                                     crate::signal::shutdown (SIGTERM / SIGINT)
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;

use std::collections::BTreeMap;

use baton_sim::{CloudKind, Faults, HetznerSettings, Latency, Reassign, RouteFaults, SimError, SimOptions};
use tracing::info;

/// `baton sim` arguments. Every flag also reads a `BATON_SIM_*` variable.
#[derive(Debug, Clone, clap::Args)]
pub struct SimArgs {
    /// Address to serve the API (and the `/_sim` admin endpoint) on.
    #[arg(long, env = "BATON_SIM_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// The API to speak: `cherry` (Cherry Servers) or `hetzner` (Hetzner Cloud).
    #[arg(long, env = "BATON_SIM_CLOUD", value_name = "CLOUD", default_value = "cherry")]
    pub cloud: CloudKind,
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
    /// TCP ports spliced from a targeted FIP to its server, comma-separated (overrides the
    /// topology's; default none). For labs without nodes only: the server then sees
    /// connections to its own address, a path no real node has. An empty value
    /// (`--forward-ports ''`, or the flag alone) disables the splice.
    #[arg(
        long,
        env = "BATON_SIM_FORWARD_PORTS",
        value_name = "P,..",
        num_args = 0..=1,
        default_missing_value = "",
        value_parser = parse_ports
    )]
    pub forward_ports: Option<PortList>,
    /// Route every targeted FIP through this network device, as the cloud does: `<fip>/32 via
    /// <server primary IP> dev DEV` in the simulator's network namespace (the lab's hub, e.g.
    /// `baton0`); packets keep the FIP as their destination. Needs iproute2 and CAP_NET_ADMIN.
    #[arg(long, env = "BATON_SIM_ROUTE_FIPS", value_name = "DEV")]
    pub route_fips: Option<String>,
    /// How long every API request takes, in milliseconds: `N`, `P50,P99` (a log-normal with
    /// that median and 99th percentile), or percentiles `p50:300,p90:800,p99:2000`.
    #[arg(long, env = "BATON_SIM_LATENCY_MS", value_name = "SPEC", default_value = "0")]
    pub latency_ms: Latency,
    /// A route's own latency, `ROUTE=SPEC` with the route as `/_sim/stats` names it, e.g.
    /// `'POST /v1/projects/{id}/ips=300,2000'`; repeatable (`;`-separated in the variable).
    #[arg(
        long,
        env = "BATON_SIM_ROUTE_LATENCY_MS",
        value_name = "ROUTE=SPEC",
        value_delimiter = ';',
        value_parser = parse_route_latency
    )]
    pub route_latency_ms: Vec<(String, Latency)>,
    /// Fraction (0..=1) of each request's latency spent before it takes effect (the server's
    /// processing time); the rest before the answer. A request takes effect once received,
    /// whether its client still waits or not.
    #[arg(long, env = "BATON_SIM_PROCESSING_RATIO", default_value_t = 0.0)]
    pub processing_ratio: f64,
    /// The IP list does not show IP writes of the last this many milliseconds (an eventually
    /// consistent list); reads of one IP are current.
    #[arg(long, env = "BATON_SIM_LIST_LAG_MS", default_value_t = 0)]
    pub list_lag_ms: u64,
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
    /// Routes injected errors are limited to (`METHOD /v1/path/{id}`, comma-separated, e.g.
    /// `GET /v1/servers/{id}`); none: every API request.
    #[arg(long, env = "BATON_SIM_ERROR_ROUTES", value_delimiter = ',')]
    pub error_routes: Vec<String>,
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
    /// Let DELETE remove a FIP that is still targeted to a server. By default it answers 400
    /// "Attached IP address cannot be deleted", as the real API does.
    #[arg(long, env = "BATON_SIM_ALLOW_DELETE_ATTACHED")]
    pub allow_delete_attached: bool,
    /// Seed of the fault dice.
    #[arg(long, env = "BATON_SIM_SEED")]
    pub seed: Option<u64>,
    /// For this many milliseconds after a FIP retarget, new connections to the FIP still
    /// follow the old route (the API answers at once).
    #[arg(long, env = "BATON_SIM_RETARGET_DELAY_MS", default_value_t = 0)]
    pub retarget_delay_ms: u64,
    /// Hetzner: how long an assign or unassign action runs before it ends, in milliseconds
    /// (`N`, `P50,P99` or percentiles, as `--latency-ms`); the FIP moves when it succeeds.
    #[arg(long, env = "BATON_SIM_ACTION_MS", value_name = "SPEC", default_value = "500")]
    pub action_ms: Latency,
    /// Hetzner: fraction (0..=1) of assign/unassign actions that end in `error`, leaving the
    /// FIP where it was.
    #[arg(long, env = "BATON_SIM_ACTION_ERROR_RATE", default_value_t = 0.0)]
    pub action_error_rate: f64,
    /// Hetzner: servers (names or ids, comma-separated) every assign action to which ends in
    /// `error`.
    #[arg(
        long,
        env = "BATON_SIM_ACTION_FAIL_SERVERS",
        value_name = "NAME,..",
        value_delimiter = ','
    )]
    pub action_fail_servers: Vec<String>,
    /// Hetzner: an assign of a FIP assigned to another server moves it (`direct`) or answers
    /// 422 `floating_ip_assigned` (`refuse`: unassign first).
    #[arg(
        long,
        env = "BATON_SIM_REASSIGN",
        value_name = "MODE",
        default_value = "direct"
    )]
    pub reassign: Reassign,
    /// Hetzner: requests in each API token's rate-limit bucket; 0 disables the limit.
    #[arg(
        long,
        env = "BATON_SIM_HETZNER_BUCKET",
        value_name = "N",
        default_value_t = 3_600
    )]
    pub hetzner_bucket: u64,
    /// Hetzner: requests added to a bucket per second; 0 disables the limit.
    #[arg(
        long,
        env = "BATON_SIM_HETZNER_REFILL_PER_S",
        value_name = "F",
        default_value_t = 1.0
    )]
    pub hetzner_refill_per_s: f64,
}

impl SimArgs {
    /// The simulator's options: the world overrides as given, the fault flags as [`Faults`]
    /// (a rate limit or `Retry-After` of 0 means none).
    pub fn into_options(self) -> SimOptions {
        let Self {
            listen,
            cloud,
            topology,
            state,
            api_key,
            fip_pool,
            forward_ports,
            route_fips,
            latency_ms,
            route_latency_ms,
            processing_ratio,
            list_lag_ms,
            error_rate,
            error_statuses,
            error_routes,
            non_json_ratio,
            lost_response_ratio,
            rate_limit,
            retry_after,
            hang_rate,
            allow_delete_attached,
            seed,
            retarget_delay_ms,
            action_ms,
            action_error_rate,
            action_fail_servers,
            reassign,
            hetzner_bucket,
            hetzner_refill_per_s,
        } = self;
        let routes: BTreeMap<String, RouteFaults> = route_latency_ms
            .into_iter()
            .map(|(route, latency)| {
                let faults = RouteFaults {
                    latency_ms: Some(latency),
                    ..RouteFaults::default()
                };
                (route, faults)
            })
            .collect();
        let faults = Faults {
            latency_ms,
            processing_ratio,
            list_lag_ms,
            routes,
            error_rate,
            error_statuses,
            error_routes,
            non_json_ratio,
            lost_response_ratio,
            rate_limit: (rate_limit > 0.0).then_some(rate_limit),
            retry_after_secs: (retry_after > 0).then_some(retry_after),
            hang_rate,
            reject_delete_attached: !allow_delete_attached,
            seed,
            retarget_delay_ms,
        };
        let hetzner = HetznerSettings {
            action_ms,
            action_error_rate,
            action_fail_servers,
            reassign,
            bucket: hetzner_bucket,
            refill_per_s: hetzner_refill_per_s,
        };
        SimOptions {
            listen,
            cloud,
            hetzner,
            topology,
            state,
            api_key,
            fip_pool,
            forward_ports: forward_ports.map(|p| p.0),
            route_fips,
            faults,
        }
    }
}

/// A comma-separated list of TCP ports; the empty list is allowed (no forwarding).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortList(pub Vec<u16>);

/// Parses `6443,443` (spaces around commas allowed); `""` is the empty list. A bad entry is
/// named in the error.
fn parse_ports(text: &str) -> Result<PortList, String> {
    if text.trim().is_empty() {
        return Ok(PortList(Vec::new()));
    }
    text.split(',')
        .map(|p| {
            let p = p.trim();
            match p.parse::<u16>() {
                Ok(port) if port != 0 => Ok(port),
                _ => Err(format!("{p:?} is not a TCP port (1-65535)")),
            }
        })
        .collect::<Result<Vec<_>, _>>()
        .map(PortList)
}

/// Parses `ROUTE=SPEC`: a route key as `/_sim/stats` shows it (`METHOD /v1/...`) and a
/// latency ([`Latency`]).
fn parse_route_latency(text: &str) -> Result<(String, Latency), String> {
    let (route, spec) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not ROUTE=SPEC"))?;
    let route = route.trim();
    let valid = route
        .split_once(' ')
        .is_some_and(|(method, path)| !method.is_empty() && path.starts_with("/v1/"));
    if !valid {
        return Err(format!(
            "route {route:?} is not \"METHOD /v1/...\" as /_sim/stats names it"
        ));
    }
    Ok((route.to_owned(), spec.parse()?))
}

/// Runs `baton sim` until SIGINT or SIGTERM.
pub async fn run(args: SimArgs) -> Result<(), SimError> {
    let signal = crate::signal::shutdown();
    let shutdown = async {
        signal.await;
        info!("signal received; stopping the simulator");
    };
    baton_sim::serve(args.into_options(), shutdown).await
}

#[cfg(test)]
mod tests;
