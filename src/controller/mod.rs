//! The in-cluster controller (`baton controller`): pieces built so far.
//!
//! ```text
//!  default/kubernetes (Service + EndpointSlices + Endpoints)
//!        │ watch
//!        ▼
//!  mirror::desired_*  ── pure ──►  kube-system/<prefix>-kubernetes-external
//!                                   Service (LoadBalancer, FIP, ipMode Proxy)
//!                                   EndpointSlice + Endpoints (same addresses)
//!
//!  Services type=LoadBalancer ── service::reconcile ──► FIP per Service (tags), annotations, ingress
//!  Nodes (uninitialized taint) ── node::reconcile ────► providerID, addresses, labels; lifecycle
//!  Nodes + Services ── bgp::run_bgp ──► project/server BGP, node BGP annotations, MetalLB objects
//! ```
//!
//! `service::run_services` and `node::run_nodes` run those controllers until a shutdown future
//! resolves; `standalone` runs them alone (hidden `baton controller-services`).

pub mod bgp;
pub mod context;
pub mod endpoint;
pub mod health;
pub mod kit;
pub mod lease;
pub mod metrics;
pub mod mirror;
pub mod node;
pub mod run;
pub mod service;
pub mod standalone;
pub mod watches;

pub use crate::names::FIELD_MANAGER;
pub use context::{Context, LeaderGate};
