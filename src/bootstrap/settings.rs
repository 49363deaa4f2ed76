//! What `baton bootstrap` runs with: the bootstrap config file with the command line over it,
//! and the cloud settings layered as in every subcommand (flag > env > `--cloud-config` >
//! `cloud.configFile` > the `cloud:` section > default, by [`crate::config`]).

use std::path::PathBuf;

use tracing::warn;

use super::args::BootstrapArgs;
use super::config::BootstrapConfig;
use super::error::BootstrapError;
use crate::config::{Config, Env, Section};

/// The settings of one run, checked.
#[derive(Debug)]
pub struct Settings {
    /// The bootstrap config file, `--state-file` applied.
    pub cfg: BootstrapConfig,
    /// The cloud settings.
    pub cloud: Config,
    /// The kubeconfig of the bootstrap API server (`--kubeconfig` / `KUBECONFIG` over
    /// `kubernetes.kubeconfig`).
    pub kubeconfig: PathBuf,
}

impl Settings {
    /// Reads and checks everything a run needs before it touches anything.
    pub fn resolve(args: &BootstrapArgs, env: &dyn Env) -> Result<Self, BootstrapError> {
        let mut cfg = BootstrapConfig::load(&args.config)?;
        if let Some(p) = &args.state_file {
            cfg.state_file.clone_from(p);
        }
        let cloud = Config::resolve_with_section(&args.cloud, env, cloud_section(&cfg)?)?;
        for key in &cloud.unknown_file_keys {
            warn!(key, "unknown cloud setting in the config is ignored");
        }
        // Required now, so a bad config fails before anything happens.
        cloud.cloud_client_config()?;
        if cfg.reserves() && cloud.region.is_none() {
            return Err(BootstrapError::Field {
                path: cfg.path.clone(),
                field: "cloud.region".into(),
                message:
                    "required when an endpoint has fip.reserve: true (or set --region / CHERRY_REGION_NAME)"
                        .into(),
            });
        }
        let kubeconfig = args
            .kubeconfig
            .as_deref()
            // KUBECONFIG may be a list; the first entry names the bootstrap API server.
            .and_then(crate::kube::config::first_path)
            .or_else(|| cfg.kubernetes.kubeconfig.clone());
        let Some(kubeconfig) = kubeconfig else {
            return Err(BootstrapError::Field {
                path: cfg.path.clone(),
                field: "kubernetes.kubeconfig".into(),
                message: "required (or --kubeconfig / KUBECONFIG)".into(),
            });
        };
        Ok(Self {
            cfg,
            cloud,
            kubeconfig,
        })
    }
}

/// The `cloud:` section of the bootstrap config as a layer of the cloud settings; its
/// `configFile` (a `cloud-sa.json`, relative to the bootstrap config) is taken out of the keys.
fn cloud_section(cfg: &BootstrapConfig) -> Result<Section, BootstrapError> {
    let mut object = cfg.cloud.clone();
    let config_file = match object.remove("configFile") {
        None => None,
        Some(file) => {
            let Some(file) = file.as_str().filter(|f| !f.is_empty()) else {
                return Err(BootstrapError::Field {
                    path: cfg.path.clone(),
                    field: "cloud.configFile".into(),
                    message: "must be a path".into(),
                });
            };
            let file = PathBuf::from(file);
            Some(if file.is_absolute() {
                file
            } else {
                cfg.path.parent().map_or(file.clone(), |d| d.join(&file))
            })
        }
    };
    Ok(Section {
        origin: cfg.path.clone(),
        object,
        config_file,
    })
}
