//! baton's cloud layer: the [`Cloud`] trait, its production implementation [`CherryClient`] (the
//! Cherry Servers API), and [`sim`], a simulator of that API the same client talks to over HTTP.
//!
//! ```text
//!  controllers / bootstrap ──► Arc<dyn Cloud>
//!                                  │
//!                         CherryClient (rate gate, IP cache, retries)
//!                                  │  HTTP(S), Authorization: Bearer
//!                    ┌─────────────┴──────────────┐
//!          api.cherryservers.com           baton sim (same routes, codes, quirks;
//!                                            forwards TCP sent to a FIP to its server)
//! ```
//!
//! [`model`] holds the API's JSON objects, used by both sides.

pub mod cherry;
pub mod cloud;
pub mod error;
pub mod fence;
pub mod model;
pub mod sim;
pub mod tags;

mod cache;
mod limiter;

pub use cherry::{CherryClient, ClientConfig};
pub use cloud::Cloud;
pub use error::{CloudError, Op};
pub use fence::Fence;
pub use limiter::Priority;
