//! Hetzner Cloud: the API's objects ([`model`]) and how they read as the objects the rest of baton
//! uses ([`crate::model`]'s `IpAddress`, `Server`, `Region`). The client speaks the API through
//! the same machinery as Cherry's (rate gate, IP store, fence, read-back): [`crate::CloudClient`]
//! with [`crate::CloudKind::Hetzner`].
//!
//! | Hetzner                         | baton                                              |
//! |---------------------------------|----------------------------------------------------|
//! | Floating IP `id` (a number)     | `IpId` (the number as text)                        |
//! | `server` (assigned to)          | `targeted_to` (what baton retargets)               |
//! | `labels`                        | `tags` (ownership, looked up by label)             |
//! | `home_location` / `location`    | `region` (`slug` = the location's name, `fsn1`)    |
//! | server `public_net.ipv4.ip`     | its primary IP; `private_net[].ip`: private IPs    |

pub mod model;

use std::net::IpAddr;

use crate::model::{IpAddress, IpId, IpType, Region, RegionId, Server, ServerId, ServerSummary};

use self::model::{FloatingIp, HetznerServer, Location};

/// The public API endpoint.
pub const DEFAULT_BASE_URL: &str = "https://api.hetzner.cloud/v1";

/// The provider ID scheme of Hetzner Cloud servers (hcloud-cloud-controller-manager's).
pub const PROVIDER_SCHEME: &str = "hcloud";

/// A location as a region: `slug` and `name` are the location's name (the form
/// `home_location` takes), `location` its city.
pub fn region_of(location: &Location) -> Region {
    Region {
        id: RegionId(location.id),
        name: location.name.clone(),
        slug: location.name.clone(),
        region_iso_2: location.country.clone(),
        location: location.city.clone(),
        href: format!("/locations/{}", location.id),
        bgp: crate::model::RegionBgp::default(),
    }
}

/// The address part of a Floating IP's `ip` (`2001:db8:1::/64` for IPv6) and its prefix length.
fn address_of(ip: &str) -> Option<(IpAddr, u8)> {
    let (addr, len) = match ip.split_once('/') {
        Some((addr, len)) => (addr, len.parse().ok()?),
        None => (ip, if ip.contains(':') { 64 } else { 32 }),
    };
    Some((addr.trim().parse().ok()?, len))
}

/// A Floating IP as baton's IP object; `None` if its `ip` is not an address.
pub fn ip_of(fip: &FloatingIp) -> Option<IpAddress> {
    let (address, len) = address_of(&fip.ip)?;
    let region = region_of(&fip.home_location);
    Some(IpAddress {
        id: IpId(fip.id.to_string()),
        address,
        address_family: if address.is_ipv4() { 4 } else { 6 },
        cidr: format!("{address}/{len}"),
        gateway: None,
        ip_type: IpType::FloatingIp,
        region: Some(Box::new(region)),
        routed_to: None,
        assigned_to: None,
        targeted_to: fip.server.map(|id| Box::new(assigned_to(ServerId(id)))),
        project: None,
        ptr_record: fip.dns_ptr.first().map(|p| p.dns_ptr.clone()),
        a_record: None,
        tags: fip.labels.clone(),
        ddos_scrubbing: false,
        href: format!("/floating_ips/{}", fip.id),
        vlan_id: None,
    })
}

/// The server a Floating IP is assigned to, as baton's `targeted_to` (Hetzner names only its id).
pub fn assigned_to(id: ServerId) -> ServerSummary {
    ServerSummary {
        id,
        name: None,
        href: format!("/servers/{id}"),
        hostname: String::new(),
        image: None,
        region: None,
        state: None,
        spot_instance: false,
        project: None,
        bgp: None,
    }
}

/// One address a server owns, as an IP object of `kind`.
fn owned_ip(server: &HetznerServer, kind: IpType, address: IpAddr, id: String) -> IpAddress {
    IpAddress {
        id: IpId(id),
        address,
        address_family: if address.is_ipv4() { 4 } else { 6 },
        cidr: format!("{address}/{}", if address.is_ipv4() { 32 } else { 64 }),
        gateway: None,
        ip_type: kind,
        region: Some(Box::new(region_of(&server.location))),
        routed_to: None,
        assigned_to: None,
        targeted_to: None,
        project: None,
        ptr_record: None,
        a_record: None,
        tags: crate::model::Tags::new(),
        ddos_scrubbing: false,
        href: String::new(),
        vlan_id: None,
    }
}

/// A server as baton's server object: `hostname` is its name, `state` `active` while it runs,
/// its public IPv4 a primary IP and its private network addresses private IPs. No BGP.
pub fn server_of(server: &HetznerServer) -> Server {
    let mut ips = Vec::new();
    if let Some(v4) = &server.public_net.ipv4
        && let Ok(address) = v4.ip.parse()
    {
        let id = v4.id.map_or_else(
            || format!("server-{}-ipv4", server.id),
            |id| format!("primary-{id}"),
        );
        ips.push(owned_ip(server, IpType::PrimaryIp, address, id));
    }
    for private in &server.private_net {
        if let Ok(address) = private.ip.parse() {
            let id = format!("server-{}-net-{}", server.id, private.network);
            ips.push(owned_ip(server, IpType::PrivateIp, address, id));
        }
    }
    Server {
        id: ServerId(server.id),
        name: server.server_type.name.clone(),
        href: format!("/servers/{}", server.id),
        hostname: server.name.clone(),
        image: None,
        spot_instance: false,
        region: Some(region_of(&server.location)),
        state: if server.status == "running" {
            "active".into()
        } else {
            server.status.clone()
        },
        status: server.status.clone(),
        bgp: crate::model::ServerBgp::default(),
        plan: None,
        ip_addresses: ips,
        tags: server.labels.clone(),
        project: None,
        created_at: (!server.created.is_empty()).then(|| server.created.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::model::{ServerPrivateNet, ServerPublicIpv4, ServerPublicNet};
    use super::*;

    fn fsn1() -> Location {
        Location {
            id: 1,
            name: "fsn1".into(),
            description: "Falkenstein DC Park 1".into(),
            country: "DE".into(),
            city: "Falkenstein".into(),
            latitude: 50.47,
            longitude: 12.37,
            network_zone: "eu-central".into(),
        }
    }

    fn fip(ip: &str, server: Option<u64>) -> FloatingIp {
        FloatingIp {
            id: 4711,
            name: "cp".into(),
            description: None,
            ip: ip.into(),
            ip_type: if ip.contains(':') { "ipv6" } else { "ipv4" }.into(),
            server,
            dns_ptr: Vec::new(),
            home_location: fsn1(),
            blocked: false,
            protection: model::FloatingIpProtection::default(),
            labels: [("cluster".to_owned(), "a".to_owned())].into(),
            created: "2026-11-29T10:00:00+00:00".into(),
        }
    }

    #[test]
    fn a_floating_ip_reads_as_a_targeted_fip_with_its_labels_as_tags() {
        let ip = ip_of(&fip("203.0.113.7", Some(42))).unwrap();
        assert_eq!(ip.id.as_str(), "4711");
        assert_eq!(ip.address.to_string(), "203.0.113.7");
        assert_eq!(ip.cidr, "203.0.113.7/32");
        assert_eq!(ip.ip_type, IpType::FloatingIp);
        assert_eq!(ip.target(), Some(ServerId(42)));
        assert_eq!(ip.tags.get("cluster").map(String::as_str), Some("a"));
        assert_eq!(ip.region.unwrap().slug, "fsn1");
        assert_eq!(ip_of(&fip("203.0.113.7", None)).unwrap().target(), None);
    }

    #[test]
    fn an_ipv6_floating_ip_is_its_network_address_and_a_bad_one_is_refused() {
        let ip = ip_of(&fip("2001:db8:1::/64", None)).unwrap();
        assert_eq!(ip.address.to_string(), "2001:db8:1::");
        assert_eq!(ip.cidr, "2001:db8:1::/64");
        assert!(ip_of(&fip("not an address", None)).is_none());
    }

    #[test]
    fn a_server_reads_with_its_name_as_hostname_and_its_addresses() {
        let server = HetznerServer {
            id: 42,
            name: "cp-1".into(),
            status: "running".into(),
            created: String::new(),
            public_net: ServerPublicNet {
                ipv4: Some(ServerPublicIpv4 {
                    id: Some(9),
                    ip: "192.0.2.11".into(),
                    blocked: false,
                    dns_ptr: String::new(),
                }),
                ..ServerPublicNet::default()
            },
            private_net: vec![ServerPrivateNet {
                network: 7,
                ip: "10.0.0.2".into(),
                alias_ips: Vec::new(),
                mac_address: String::new(),
            }],
            server_type: model::ServerType::default(),
            location: fsn1(),
            labels: model::Labels::new(),
        };
        let s = server_of(&server);
        assert_eq!(
            (s.id, s.hostname.as_str(), s.state.as_str()),
            (ServerId(42), "cp-1", "active")
        );
        assert_eq!(
            s.first_ipv4(&IpType::PrimaryIp).unwrap().to_string(),
            "192.0.2.11"
        );
        assert_eq!(s.first_ipv4(&IpType::PrivateIp).unwrap().to_string(), "10.0.0.2");
        assert!(!s.bgp.enabled);
    }
}
