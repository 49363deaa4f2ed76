//! The flags by which `baton controller` and `baton status` reach the cluster: the same names,
//! environment variables and defaults for both (flattened into each command's flags).

use std::path::PathBuf;

use clap::Args;

/// The name every API server's certificate carries whatever address it is reached on: the
/// probes of the controller, `baton status` and the agent verify it.
pub const API_SERVER_NAME: &str = "kubernetes.default.svc";

#[derive(Debug, Clone, Args)]
pub struct ClusterArgs {
    /// kubeconfig to use; in-cluster configuration when unset. Point it at the local API server
    /// or list every control-plane API server (below) — never at the FIP.
    #[arg(long, env = "KUBECONFIG", value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,

    /// Every control-plane API server (`https://IP:6443`, comma-separated): requests fail over
    /// between them on the client side. Credentials and CA come from the kubeconfig / in-cluster
    /// configuration; its own server is used when this is empty.
    #[arg(long, env = "BATON_API_SERVERS", value_delimiter = ',', value_name = "URL")]
    pub api_servers: Vec<String>,

    /// Namespace of the controller's leader Lease.
    #[arg(long, env = "BATON_LEASE_NAMESPACE", default_value = "kube-system")]
    pub lease_namespace: String,

    /// TLS server name expected on the API servers' certificates when probing them by address.
    #[arg(
        long,
        env = "BATON_HEALTH_CHECK_SERVER_NAME",
        default_value = API_SERVER_NAME
    )]
    pub health_check_server_name: String,

    /// Cluster CA (PEM) for the probes; by default the CA of the Kubernetes client configuration.
    #[arg(long, env = "BATON_CLUSTER_CA", value_name = "PATH")]
    pub cluster_ca: Option<PathBuf>,
}
