//! baton's core: plain types and pure decision logic, with no Kubernetes, DNS or cloud SDK
//! dependency.
//!
//! Edge crates translate into and out of these types:
//!
//! ```text
//!  config / CLI ──► core types (FipTag, ProviderId, LoadBalancerMode, …) ◄── cloud (Cherry API)
//!                          │
//!                          ▼
//!              pure reconcilers: (observed, desired) -> actions
//!                          │
//!                          ▼
//!             controller / bootstrap / dns apply the actions
//! ```

pub mod duration;
pub mod failover;
pub mod fip_tag;
pub mod health;
pub mod load_balancer;
pub mod names;
pub mod provider_id;
pub mod secret;
pub mod selector;

pub use fip_tag::FipTag;
pub use load_balancer::{BgpPeerMode, LoadBalancerMode};
pub use provider_id::ProviderId;
pub use secret::Secret;
pub use selector::LabelSelector;
