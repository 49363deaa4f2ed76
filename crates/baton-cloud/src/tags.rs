//! The FIP tags the Cherry CCM puts on per-Service Floating IPs, which baton keeps (compatibility
//! promise): `usage=cloud-provider-cherry-auto`, `service=base64(sha256("ns/name"))`,
//! `cluster=<kube-system namespace UID>`.

use base64::Engine as _;
use sha2::{Digest, Sha256};

use crate::model::Tags;
pub use crate::model::matches_all;

/// Tag key naming who manages a FIP.
pub const USAGE_KEY: &str = "usage";
/// The `usage` value on FIPs created for Services.
pub const USAGE_VALUE: &str = "cloud-provider-cherry-auto";
/// Tag key carrying the Service hash.
pub const SERVICE_KEY: &str = "service";
/// Tag key carrying the cluster id (the kube-system namespace UID).
pub const CLUSTER_KEY: &str = "cluster";

/// `base64(sha256("<namespace>/<name>"))`, standard alphabet with padding (44 characters), as the
/// Cherry CCM computes it (its README says only "sha256 hash"; existing FIPs carry this form).
pub fn service_tag(namespace: &str, name: &str) -> String {
    let digest = Sha256::digest(format!("{namespace}/{name}").as_bytes());
    base64::engine::general_purpose::STANDARD.encode(digest)
}

/// The `service` tag on `cloud`: [`service_tag`] on Cherry Servers; on Hetzner Cloud, whose label
/// values allow only `[A-Za-z0-9._-]` and 63 characters, the first 62 hex digits of the same
/// SHA-256.
pub fn service_tag_on(cloud: crate::CloudKind, namespace: &str, name: &str) -> String {
    match cloud {
        crate::CloudKind::Cherry => service_tag(namespace, name),
        crate::CloudKind::Hetzner => {
            let digest = Sha256::digest(format!("{namespace}/{name}").as_bytes());
            let hex = digest.iter().fold(String::with_capacity(64), |mut hex, b| {
                use std::fmt::Write as _;
                let _ = write!(hex, "{b:02x}");
                hex
            });
            hex[..62].to_owned()
        }
    }
}

/// The three tags (Hetzner: labels) of a Service's FIP on `cloud`.
pub fn service_fip_tags_on(cloud: crate::CloudKind, namespace: &str, name: &str, cluster_uid: &str) -> Tags {
    let mut tags = service_fip_tags(namespace, name, cluster_uid);
    tags.insert(SERVICE_KEY.to_owned(), service_tag_on(cloud, namespace, name));
    tags
}

/// The three tags of a Service's FIP.
pub fn service_fip_tags(namespace: &str, name: &str, cluster_uid: &str) -> Tags {
    Tags::from([
        (USAGE_KEY.to_owned(), USAGE_VALUE.to_owned()),
        (SERVICE_KEY.to_owned(), service_tag(namespace, name)),
        (CLUSTER_KEY.to_owned(), cluster_uid.to_owned()),
    ])
}

#[cfg(test)]
mod tests;
