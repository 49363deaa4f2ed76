//! Reaching Kubernetes, the same way on both sides: the kubeconfig loader, the cluster CA and the
//! TLS rules of every probe, and the controller's failover client.
//!
//! ```text
//!   --kubeconfig / KUBECONFIG ──▶ config::load ──▶ kube::Config ──┬─▶ client::client (failover, time limits)
//!                                                                 └─▶ bootstrap: kube::Client (one server)
//!   --cluster-ca / clusterCA  ──▶ tls::read_ca ──▶ DER ──▶ tls::client_config ──▶ crate::probe
//! ```

pub mod args;
pub mod client;
pub mod config;
pub mod tls;
pub mod version;
