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

pub mod secret;
pub mod types;

pub use secret::Secret;
