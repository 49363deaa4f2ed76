//! The `Cloud` trait: everything baton asks of a cloud. Controllers hold an `Arc<dyn Cloud>`.

use std::collections::BTreeSet;
use std::net::IpAddr;

use async_trait::async_trait;

use crate::error::CloudError;
use crate::model::{
    CreateIpRequest, IpAddress, IpId, IpList, IpType, Project, Region, Server, ServerId, Tags,
};

/// A cloud's API, as baton uses it.
///
/// Implementations share one rate limit and one IP list between all clones; reads of
/// [`Cloud::ips`], [`Cloud::ips_tagged`] and [`Cloud::cached_ip`] are served from it, and every
/// write's answer is applied to it (a write never causes a list call).
#[async_trait]
pub trait Cloud: Send + Sync + std::fmt::Debug {
    /// The configured project.
    async fn project(&self) -> Result<Project, CloudError>;

    /// Enables Local BGP on the project if it is not enabled yet; returns the project (with its
    /// `local_asn`).
    async fn enable_project_bgp(&self) -> Result<Project, CloudError>;

    /// One server.
    async fn server(&self, id: ServerId) -> Result<Server, CloudError>;

    /// All servers of the project.
    async fn servers(&self) -> Result<Vec<Server>, CloudError>;

    /// Sets BGP on a server (a no-op when it already is in that state); returns the server.
    async fn update_server_bgp(&self, id: ServerId, enabled: bool) -> Result<Server, CloudError>;

    /// All IP addresses of the project, from the shared list (one list call serves everyone).
    async fn ips(&self) -> Result<IpList, CloudError>;

    /// The Floating IPs carrying every one of `tags`, in list order, from the shared list (an
    /// index: no pass over the list).
    async fn ips_tagged(&self, tags: &Tags) -> Result<Vec<IpAddress>, CloudError> {
        Ok(self
            .ips()
            .await?
            .iter()
            .filter(|ip| ip.ip_type == IpType::FloatingIp && ip.has_tags(tags))
            .map(|ip| IpAddress::clone(ip))
            .collect())
    }

    /// The IPs (of any type) with any of `addresses`, in list order, from the shared list (an
    /// index: no pass over the list).
    async fn ips_at(&self, addresses: &BTreeSet<IpAddr>) -> Result<Vec<IpAddress>, CloudError> {
        Ok(self
            .ips()
            .await?
            .iter()
            .filter(|ip| addresses.contains(&ip.address))
            .map(|ip| IpAddress::clone(ip))
            .collect())
    }

    /// One IP as the shared list shows it; `None` if the list does not show it.
    async fn cached_ip(&self, id: &IpId) -> Result<Option<IpAddress>, CloudError> {
        Ok(self
            .ips()
            .await?
            .iter()
            .find(|ip| &ip.id == id)
            .map(|ip| IpAddress::clone(ip)))
    }

    /// One IP address, read from the API (and refreshed in the cache).
    async fn ip(&self, id: &IpId) -> Result<IpAddress, CloudError>;

    /// Reserves a Floating IP, idempotently by its tags: an existing FIP carrying all of
    /// `request.tags` is returned instead of creating another one.
    async fn create_ip(&self, request: CreateIpRequest) -> Result<IpAddress, CloudError>;

    /// Routes a FIP to a server in one call (`targeted_to`); returns the IP as the API now shows it.
    async fn retarget_ip(&self, id: &IpId, server: ServerId) -> Result<IpAddress, CloudError>;

    /// Stops routing a FIP (`targeted_to: "0"`).
    async fn unassign_ip(&self, id: &IpId) -> Result<IpAddress, CloudError>;

    /// Releases a FIP.
    async fn delete_ip(&self, id: &IpId) -> Result<(), CloudError>;

    /// All regions.
    async fn regions(&self) -> Result<Vec<Region>, CloudError>;

    /// The next read of the shared list uses a list fetched from now on (the API's truth, for
    /// a caller that doubts the list: a route that does not work as the list says).
    fn invalidate_ips(&self);

    /// The first Floating IP carrying every one of `tags` (from the shared list).
    async fn find_ip_by_tags(&self, tags: &Tags) -> Result<Option<IpAddress>, CloudError> {
        Ok(self.ips_tagged(tags).await?.into_iter().next())
    }
}
