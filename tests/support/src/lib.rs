//! baton's test harness: a private lab network and a real Kubernetes control plane in it.
//!
//! ```text
//!  lab::run(|| async { ... })          a thread in a fresh network namespace + tokio runtime
//!     └─ ControlPlane::start(opts)     etcd on 127.0.0.1 + N kube-apiservers on lab addresses
//!          ├─ apiserver 198.51.100.11:6443 ─┐
//!          ├─ apiserver 198.51.100.12:6443 ─┼─ one etcd, each advertising its own address,
//!          └─ apiserver 198.51.100.13:6443 ─┘  so default/kubernetes lists all of them
//! ```
//!
//! With `Options::kubelets`, every control-plane server is a lab node instead ([`node`]): its
//! own network namespace on a lab bridge, its API server, a kubelet with containerd + runc,
//! kube-controller-manager and kube-scheduler, so Deployments really run as pods.
//!
//! Grey failures ([`ControlPlane::stall_etcd`], [`SlowApi`], [`Options::apf`] with a
//! [`LoadGen`]): a dependency that is slow, not dead.
//!
//! Binaries come from `scripts/testenv` (built once from Go modules, cached outside the repo).
//! Every process is killed when its handle drops, and with `--pdeathsig` when the lab thread
//! ends, so a panicking test leaves nothing behind.

pub mod lab;

static TRACING: std::sync::Once = std::sync::Once::new();

/// Installs a test-writer tracing subscriber once (`RUST_LOG` filters it).
pub fn init_tracing() {
    TRACING.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,kube=warn,hyper=warn"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
    });
}

pub mod control_plane;
pub mod fault;
pub mod latency;
pub mod load;
pub mod node;
pub mod slow_api;
mod tls_server;

pub use control_plane::{
    ADMIN_TOKEN, APF_MAX_MUTATING_REQUESTS_INFLIGHT, APF_MAX_REQUESTS_INFLIGHT, APISERVER_PORT, ControlPlane,
    Options, ServingCert, TokenUser,
};
pub use fault::Fault;
pub use latency::Latency;
pub use load::{Load, LoadGen, LoadStats, Work};
pub use node::{BootUnit, NodeImage, baton_image};
pub use slow_api::{HeldWrite, Profile, SlowApi, SlowApiStats};

/// An HTTPS client that trusts only `ca_der` (or nothing, for plain HTTP), using rustls + ring.
pub fn http_client(ca_der: Option<&[u8]>) -> anyhow::Result<reqwest::Client> {
    let mut roots = rustls::RootCertStore::empty();
    if let Some(der) = ca_der {
        roots.add(rustls::pki_types::CertificateDer::from(der.to_vec()))?;
    }
    let tls = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .connect_timeout(std::time::Duration::from_secs(2))
        .build()?)
}
