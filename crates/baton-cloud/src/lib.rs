//! baton's cloud layer: the [`Cloud`] trait and its production implementation [`CloudClient`],
//! which speaks the Cherry Servers API or the Hetzner Cloud API ([`CloudKind`], chosen by
//! [`ClientConfig::cloud`]). The simulator of both APIs, which the same client talks to over HTTP,
//! is the `baton-sim` crate.
//!
//! ```text
//!  controllers / bootstrap ──► Arc<dyn Cloud>
//!                                  │
//!                         CloudClient (rate gate, IP store, retries, fence, read-back)
//!                          │ cherry: PUT /v1/ips/{id}   │ hetzner: POST …/actions/assign, GET /v1/actions/{id}
//!                    ┌─────┴────────────────────────────┴─────┐
//!      api.cherryservers.com · api.hetzner.cloud        baton-sim (same routes, codes, quirks;
//!                                                       routes a FIP to its server in the lab)
//! ```
//!
//! [`model`] holds the objects baton works with (Cherry's JSON objects; [`hetzner`] converts
//! Hetzner's to them); [`tags`] the FIP tags baton shares with the Cherry CCM.

pub mod client;
pub mod cloud;
pub mod error;
pub mod fence;
pub mod hetzner;
pub mod model;
pub mod provider;
pub mod tags;
pub mod term;

mod limiter;
mod store;

pub use client::{Attempt, CallObserver, ClientConfig, CloudClient};

/// The client, as Cherry Servers users and tests have always named it (a [`CloudClient`] whose
/// configuration says [`CloudKind::Cherry`], the default).
pub type CherryClient = CloudClient;
pub use cloud::Cloud;
pub use error::{ActionFailure, CloudError, Op};
pub use fence::{CallTerm, Fence, InFlight, Lead, Sending};
pub use limiter::Priority;
pub use provider::CloudKind;
pub use term::Leadership;
