//! The in-cluster controller (`baton controller`): control-plane FIP failover, a FIP per
//! LoadBalancer Service, BGP and MetalLB / kube-vip, node initialisation.
//!
//! ```text
//!  run ── lease (leader Lease) ──► LeaderGate ─┬─► cloud fence (no write after the lease)
//!   │                                          └─► every controller: only the leader acts
//!   └─ watches: one shared watch per kind (Services, Nodes, default/kubernetes EndpointSlices)
//!        │ stores + change counters + subscriptions
//!        ├─► endpoint   probe the API servers and FIPs ─► failover::decide ─► retarget (urgent)
//!        │               └─ mirror: kube-system/<prefix>-kubernetes-external and its endpoints
//!        ├─► service    plan (scope, requested IP, decide) + budget ─► FIP per Service
//!        ├─► bgp        service::budget + bgp::plan ─► project/server BGP, node annotations, MetalLB
//!        ├─► node       plan (addresses, labels, lifecycle) ─► Node initialised / tainted / deleted
//!        └─► routing    (Hetzner: no BGP) Service FIPs ─► a healthy node (kube-proxy /healthz)
//!
//!  kit: timed writes, the leader check, the retry rule, backoff; context: client, cloud, config,
//!  Events, metrics; health: supervised tasks, /health and /ready.
//! ```
//!
//! Each controller module keeps its decisions in a pure `plan` (unit-tested without a server) and
//! its I/O in the module file. `standalone` runs the Service and node controllers alone (hidden
//! `baton controller-services`, for the crash test and the benchmark).

pub mod bgp;
pub mod context;
pub mod endpoint;
pub mod health;
pub mod kit;
pub mod lease;
pub mod metrics;
pub mod mirror;
pub mod node;
pub mod routing;
pub mod run;
pub mod service;
pub mod standalone;
pub mod standby;
pub mod succession;
pub mod trust;
pub mod watches;

pub use crate::names::FIELD_MANAGER;
pub use context::{Context, LeaderGate};
