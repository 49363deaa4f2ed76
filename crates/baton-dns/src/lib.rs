//! baton's DNS: the record model, the embedded authoritative server and the RFC 2136 publisher.
//!
//! ```text
//!                     set_name / set_health / remove_address
//!   bootstrap phase ─────────────────────────────────────────▶ model::RecordStore
//!                                                                │ (watch of Arc<Snapshot>)
//!                          ┌─────────────────────────────────────┴───────────────────┐
//!                          ▼                                                         ▼
//!   server::DnsServer (embedded, default)                      rfc2136::Rfc2136Publisher
//!     answer::Compiled per generation:                           replaces the RRsets on the
//!     AA answers, rotation, health filter,                       site's server (TSIG), then
//!     REFUSED outside the zone / AXFR / UPDATE                   verifies them by querying it
//! ```
//!
//! `model` and `name` are free of hickory types; `answer`, `wire`, `server` and `rfc2136`
//! translate to and from the wire. The `baton dns serve|push` command line lives in the `baton`
//! binary: it builds a [`Snapshot`] and a [`ServerConfig`] or [`PushTarget`] and calls
//! [`DnsServer::serve`] (with its shutdown signal) or [`Rfc2136Publisher::push`].

mod answer;
mod model;
mod name;
mod rfc2136;
mod server;
mod tsig;
mod wire;

use std::net::SocketAddr;

pub use model::{Address, NameRecords, RecordStore, Snapshot};
pub use name::{DnsName, NameError};
pub use rfc2136::{PushOutcome, PushTarget, Rfc2136Publisher};
pub use server::{DnsServer, DnsServerHandle, ServerConfig};
pub use tsig::{TsigKey, TsigKeyError};

#[doc(hidden)]
pub mod fuzzing {
    //! Entry points for the fuzz/property tests of the request path. Not a stable API.
    use crate::answer::{Compiled, ZoneSettings};
    use crate::{DnsError, DnsName, Snapshot};

    /// A compiled zone over `snapshot`, as the server builds it.
    pub struct Zone(Compiled);

    impl Zone {
        /// Compiles `snapshot` for `origin` with TTL 30 and no NS glue.
        pub fn new(origin: &DnsName, snapshot: &Snapshot) -> Result<Self, DnsError> {
            let settings = ZoneSettings {
                origin: origin.clone(),
                ttl: 30,
                ns_name: DnsName::relative_to("ns1", origin)?,
                ns_addresses: Vec::new(),
                serial_base: 1,
            };
            Compiled::compile(&settings, snapshot).map(Self)
        }

        /// The UDP request path: fast path, else hickory's parser. Returns whether to reply.
        pub fn respond_udp(&self, packet: &[u8], out: &mut Vec<u8>) -> bool {
            self.0.respond_udp(packet, out)
        }

        /// The reference (slow) path only.
        pub fn respond_slow(&self, packet: &[u8], out: &mut Vec<u8>) -> bool {
            self.0.respond_slow(packet, out, true)
        }
    }
}

/// Errors of the DNS component. Variants name the failed step; none ever carries a secret.
#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    /// Invalid configuration or command-line input (the message names the flag and value).
    #[error("invalid DNS configuration: {0}")]
    Config(String),
    /// A domain name is invalid.
    #[error(transparent)]
    Name(#[from] NameError),
    /// Binding a listen address failed.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
    /// The TSIG key file could not be read or parsed.
    #[error(transparent)]
    TsigKey(#[from] TsigKeyError),
    /// The server rejected our TSIG signature (wrong key, unknown key name, clock skew), or its
    /// answer was not signed with our key.
    #[error("DNS update to {server} was not authenticated: {reason}")]
    AuthFailed {
        /// The server.
        server: SocketAddr,
        /// What the server said (BADSIG, BADKEY, BADTIME, NOTAUTH, unsigned reply…).
        reason: String,
    },
    /// The server refused or failed the update for another reason.
    #[error("DNS update of zone {zone} on {server} failed: {rcode}")]
    UpdateRejected {
        /// The server.
        server: SocketAddr,
        /// The zone.
        zone: String,
        /// The response code.
        rcode: String,
    },
    /// A network exchange with a DNS server failed (timeout, I/O, undecodable reply).
    #[error("DNS exchange with {server} failed during {step}: {reason}")]
    Exchange {
        /// The server.
        server: SocketAddr,
        /// What we were doing ("query api.c1.example.com. A", "update").
        step: String,
        /// Why it failed.
        reason: String,
    },
    /// After a push, the server does not answer with the records we pushed.
    #[error("verification after the update failed: {name} answers {actual:?}, expected {expected:?}")]
    VerifyMismatch {
        /// The name.
        name: String,
        /// What we pushed.
        expected: Vec<std::net::IpAddr>,
        /// What the server answers.
        actual: Vec<std::net::IpAddr>,
    },
    /// A bug: a condition that valid inputs cannot produce.
    #[error("internal DNS error: {0}")]
    Internal(String),
}

impl DnsError {
    /// A short, stable label for metrics and Events.
    pub fn category(&self) -> &'static str {
        match self {
            Self::Config(_) | Self::Name(_) => "config",
            Self::Bind { .. } => "bind",
            Self::TsigKey(_) => "tsig-key",
            Self::AuthFailed { .. } => "auth",
            Self::UpdateRejected { .. } => "update-rejected",
            Self::Exchange { .. } => "exchange",
            Self::VerifyMismatch { .. } => "verify",
            Self::Internal(_) => "internal",
        }
    }
}
