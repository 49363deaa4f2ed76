//! The one kubeconfig loader: a named file, or (without one) the in-cluster / `KUBECONFIG`
//! inference of kube-rs.

use std::path::{Path, PathBuf};

use kube::config::{InferConfigError, KubeConfigOptions, Kubeconfig, KubeconfigError};

/// Why no client configuration could be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file cannot be read or parsed.
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: KubeconfigError,
    },
    /// The file reads, but its current context does not make a client configuration.
    #[error("{source}")]
    Context {
        path: PathBuf,
        #[source]
        source: KubeconfigError,
    },
    /// No file given, and neither the in-cluster nor the default configuration works.
    #[error("{0}")]
    Infer(#[source] InferConfigError),
}

impl LoadError {
    /// The error with the kubeconfig's path in front, whatever the step.
    pub fn with_path(&self) -> String {
        match self {
            Self::Read { path, source } | Self::Context { path, source } => {
                format!("{}: {source}", path.display())
            }
            Self::Infer(e) => e.to_string(),
        }
    }
}

/// The client configuration of `path`'s current context, or the inferred one when `path` is
/// `None` (in-cluster service account, then `~/.kube/config`).
pub async fn load(path: Option<&Path>) -> Result<kube::Config, LoadError> {
    let Some(path) = path else {
        return kube::Config::infer().await.map_err(LoadError::Infer);
    };
    let kc = Kubeconfig::read_from(path).map_err(|source| LoadError::Read {
        path: path.to_owned(),
        source,
    })?;
    kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|source| LoadError::Context {
            path: path.to_owned(),
            source,
        })
}

/// The first path of a `KUBECONFIG`-style list (`a:b:c`): the file that names the API server.
pub fn first_path(list: &Path) -> Option<PathBuf> {
    list.to_str()
        .and_then(|s| s.split(':').find(|s| !s.is_empty()))
        .map(PathBuf::from)
}
