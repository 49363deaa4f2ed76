//! The tenants' host names in DNS: every routed host name inside `--dns-zone` answers with the
//! shared address(es) (`--dns-address`, the FIP the router listens behind), from baton's embedded
//! authoritative server (`baton-dns`). The records follow the route table: a tenant added or
//! removed by a reload appears in or disappears from DNS with it.
//!
//! ```text
//!  RouteTable (watch) ─► names(table, zone) ─► RecordStore: set_name / remove_name ─► DnsServer
//! ```

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use baton_dns::{DnsError, DnsName, DnsServer, RecordStore, ServerConfig};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use super::routes::RouteTable;

/// The host names of `table` that lie in `zone` (the others are not this server's to answer).
pub fn names(table: &RouteTable, zone: &DnsName) -> BTreeSet<DnsName> {
    table
        .hosts()
        .filter_map(|h| h.parse::<DnsName>().ok())
        .filter(|n| n.is_within(zone))
        .collect()
}

/// Starts the server and keeps its records equal to the routed host names until `shutdown`.
pub async fn serve(
    zone: DnsName,
    listen: Vec<SocketAddr>,
    addresses: Vec<IpAddr>,
    mut routes: watch::Receiver<Arc<RouteTable>>,
    shutdown: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, DnsError> {
    let store = RecordStore::new();
    let server = DnsServer::start(
        ServerConfig::new(zone.clone(), listen.clone()),
        store.clone(),
        &shutdown,
    )
    .await?;
    info!(%zone, ?listen, ?addresses, "DNS for the tenants' host names serving");
    Ok(tokio::spawn(async move {
        let mut published: BTreeSet<DnsName> = BTreeSet::new();
        loop {
            let now = names(&routes.borrow_and_update(), &zone);
            for gone in published.difference(&now) {
                store.remove_name(gone);
            }
            for name in &now {
                store.set_name(name.clone(), addresses.iter().map(|ip| (*ip, true)));
            }
            debug!(names = now.len(), "tenant names published");
            published = now;
            tokio::select! {
                () = shutdown.cancelled() => break,
                changed = routes.changed() => if changed.is_err() { break },
            }
        }
        server.shutdown().await;
    }))
}
