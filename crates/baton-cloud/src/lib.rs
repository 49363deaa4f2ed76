//! baton's cloud layer: the [`Cloud`] trait and its production implementation [`CherryClient`]
//! (the Cherry Servers API). The simulator of that API, which the same client talks to over HTTP,
//! is the `baton-sim` crate.
//!
//! ```text
//!  controllers / bootstrap ──► Arc<dyn Cloud>
//!                                  │
//!                         CherryClient (rate gate, IP store, retries)
//!                                  │  HTTP(S), Authorization: Bearer
//!                    ┌─────────────┴──────────────┐
//!          api.cherryservers.com           baton-sim (same routes, codes, quirks;
//!                                            forwards TCP sent to a FIP to its server)
//! ```
//!
//! [`model`] holds the API's JSON objects, used by both sides; [`tags`] the FIP tags baton shares
//! with the Cherry CCM.

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

pub use client::{Attempt, CallObserver, CloudClient, ClientConfig};

/// The client, as Cherry Servers users and tests have always named it (a [`CloudClient`] whose
/// configuration says [`CloudKind::Cherry`], the default).
pub type CherryClient = CloudClient;
pub use cloud::Cloud;
pub use error::{CloudError, Op};
pub use fence::{CallTerm, Fence, InFlight, Lead, Sending};
pub use limiter::Priority;
pub use provider::CloudKind;
pub use term::Leadership;
