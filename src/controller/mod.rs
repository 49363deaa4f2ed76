//! The in-cluster controller (`baton controller`): pieces built so far.
//!
//! ```text
//!  default/kubernetes (Service + EndpointSlices + Endpoints)
//!        │ watch
//!        ▼
//!  mirror::desired_*  ── pure ──►  kube-system/<prefix>-kubernetes-external
//!                                   Service (LoadBalancer, FIP, ipMode Proxy)
//!                                   EndpointSlice + Endpoints (same addresses)
//! ```

pub mod context;
pub mod endpoint;
pub mod lease;
pub mod metrics;
pub mod mirror;
pub mod probe;
pub mod run;

pub use context::{Context, LeaderGate};

/// The server-side-apply field manager of every object baton writes.
pub const FIELD_MANAGER: &str = "baton";
