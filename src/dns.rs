//! `baton dns serve` and `baton dns push`: the command line of the `baton-dns` crate.
//!
//! ```text
//!  flags / BATON_DNS_* ── parse_records ──► Snapshot ─┬─ serve: DnsServer::serve(config, store, shutdown)
//!                                                     │          shutdown = crate::signal::shutdown
//!                                                     └─ push:  Rfc2136Publisher::push (TSIG), then verify
//! ```

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use baton_dns::{
    DnsError, DnsName, DnsServer, NameRecords, PushOutcome, PushTarget, RecordStore, Rfc2136Publisher,
    ServerConfig, Snapshot, TsigKey,
};
use clap::{Args, Subcommand};
use tracing::info;

/// Serve or push the DNS records of the API names.
#[derive(Debug, Args)]
pub struct DnsArgs {
    #[command(subcommand)]
    pub command: DnsCommand,
}

/// The `dns` subcommands.
#[derive(Debug, Subcommand)]
pub enum DnsCommand {
    /// Run the embedded authoritative server for ZONE until SIGINT/SIGTERM.
    Serve(ServeArgs),
    /// Replace the records on an existing DNS server by RFC 2136 update (TSIG), then verify.
    Push(PushArgs),
}

/// Records given on the command line.
#[derive(Debug, Args)]
pub struct RecordArgs {
    /// The zone, e.g. `c1.example.com`.
    #[arg(long, env = "BATON_DNS_ZONE", value_name = "ZONE")]
    pub zone: DnsName,

    /// Addresses of a name: `NAME=IP[,IP…]`, NAME relative to the zone (`@` for the apex, a
    /// trailing dot for an absolute name inside it). IPv6 addresses give AAAA records.
    /// Repeat the flag for more names; in the environment variable separate them with `;`.
    #[arg(
        long = "a",
        env = "BATON_DNS_A",
        value_name = "NAME=IP[,IP…]",
        value_delimiter = ';',
        required_unless_present = "a_file"
    )]
    pub a: Vec<String>,

    /// A file of more names, one `NAME=IP[,IP…]` per line (blank lines and `#` comments
    /// ignored): for zones too large for the command line or the environment.
    #[arg(long = "a-file", env = "BATON_DNS_A_FILE", value_name = "PATH")]
    pub a_file: Option<std::path::PathBuf>,

    /// TTL of the records, in seconds.
    #[arg(long, env = "BATON_DNS_TTL", default_value_t = 30, value_name = "S")]
    pub ttl: u32,
}

/// `baton dns serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on (UDP and TCP), e.g. `192.0.2.10:53`. Repeatable; comma-separated in
    /// the environment variable. Bind specific addresses, not a wildcard.
    #[arg(
        long,
        env = "BATON_DNS_LISTEN",
        value_name = "ADDR",
        value_delimiter = ',',
        required = true
    )]
    pub listen: Vec<SocketAddr>,

    #[command(flatten)]
    pub records: RecordArgs,

    /// UDP worker threads per listen address (0: one per CPU).
    #[arg(long, env = "BATON_DNS_UDP_WORKERS", default_value_t = 0, value_name = "N")]
    pub udp_workers: usize,

    /// Name of the zone's NS record (relative to the zone); default `ns1`.
    #[arg(long, env = "BATON_DNS_NS", value_name = "NAME")]
    pub ns: Option<String>,
}

/// `baton dns push`.
#[derive(Debug, Args)]
pub struct PushArgs {
    /// The primary DNS server accepting updates: `IP` or `IP:PORT` (`[IPv6]:PORT`); port 53 by default.
    #[arg(long, env = "BATON_DNS_SERVER", value_name = "ADDR", value_parser = parse_server)]
    pub server: SocketAddr,

    #[command(flatten)]
    pub records: RecordArgs,

    /// TSIG key file in BIND format (`tsig-keygen` output): `key "NAME" { algorithm hmac-sha256; secret "…"; };`.
    #[arg(long, env = "BATON_DNS_TSIG_KEY_FILE", value_name = "FILE")]
    pub tsig_key_file: PathBuf,

    /// Timeout of each exchange with the server, in seconds.
    #[arg(long, env = "BATON_DNS_TIMEOUT", default_value_t = 3, value_name = "S")]
    pub timeout: u64,
}

fn parse_server(s: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Ok(addr);
    }
    s.trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
        .map(|ip| SocketAddr::new(ip, 53))
        .map_err(|_| format!("{s:?} is not IP, IP:PORT or [IPv6]:PORT"))
}

impl RecordArgs {
    /// The records of `--a` and `--a-file`, checked.
    pub fn snapshot(&self) -> Result<Snapshot, DnsError> {
        let mut specs = self.a.clone();
        if let Some(path) = &self.a_file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| DnsError::Config(format!("--a-file {}: {e}", path.display())))?;
            specs.extend(
                text.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                    .map(str::to_owned),
            );
        }
        parse_records(&self.zone, &specs)
    }
}

/// Parses the `--a` specs into a snapshot of names inside `zone` (all addresses healthy).
pub fn parse_records(zone: &DnsName, specs: &[String]) -> Result<Snapshot, DnsError> {
    let mut names: Vec<(DnsName, Vec<(IpAddr, bool)>)> = Vec::new();
    let mut index: std::collections::HashMap<DnsName, usize> = std::collections::HashMap::new();
    for spec in specs {
        let bad = |why: String| DnsError::Config(format!("--a {spec:?}: {why}"));
        let (name, ips) = spec
            .split_once('=')
            .ok_or_else(|| bad("expected NAME=IP[,IP…]".into()))?;
        let name = DnsName::relative_to(name, zone).map_err(|e| bad(e.to_string()))?;
        let mut addresses = Vec::new();
        for ip in ips.split(',').map(str::trim) {
            let ip: IpAddr = ip
                .parse()
                .map_err(|_| bad(format!("{ip:?} is not an IP address")))?;
            addresses.push((ip, true));
        }
        if let Some(&i) = index.get(&name) {
            names[i].1.extend(addresses);
        } else {
            index.insert(name.clone(), names.len());
            names.push((name, addresses));
        }
    }
    Ok(Snapshot::from_names(
        names.into_iter().map(|(n, a)| (n, NameRecords::new(a))),
    ))
}

/// Runs `baton dns …`; `serve` stops cleanly on SIGINT/SIGTERM.
pub async fn run(args: DnsArgs) -> Result<(), DnsError> {
    match args.command {
        DnsCommand::Serve(serve) => run_serve(serve).await,
        DnsCommand::Push(push) => run_push(push).await,
    }
}

async fn run_serve(args: ServeArgs) -> Result<(), DnsError> {
    let ServeArgs {
        listen,
        records,
        udp_workers,
        ns,
    } = args;
    let snapshot = records.snapshot()?;
    let ns_name = ns
        .map(|n| DnsName::relative_to(&n, &records.zone))
        .transpose()
        .map_err(|e| DnsError::Config(format!("--ns: {e}")))?;
    let mut config = ServerConfig::new(records.zone, listen);
    config.ttl = records.ttl;
    config.udp_workers = udp_workers;
    config.ns_name = ns_name;
    let signal = crate::signal::shutdown();
    let shutdown = async {
        signal.await;
        info!("signal received; stopping the DNS server");
    };
    DnsServer::serve(config, RecordStore::with_snapshot(snapshot), shutdown).await
}

async fn run_push(args: PushArgs) -> Result<(), DnsError> {
    let PushArgs {
        server,
        records,
        tsig_key_file,
        timeout,
    } = args;
    let snapshot = records.snapshot()?;
    let key = TsigKey::from_file(&tsig_key_file)?;
    let mut target = PushTarget::new(server, records.zone);
    target.ttl = records.ttl;
    target.timeout = Duration::from_secs(timeout.max(1));
    let outcome = Rfc2136Publisher::new(target, key).push(&snapshot).await?;
    match outcome {
        PushOutcome::Changed => println!("changed: records replaced and verified on {server}"),
        PushOutcome::Unchanged => println!("unchanged: {server} already serves these records"),
    }
    Ok(())
}

#[cfg(test)]
mod tests;
