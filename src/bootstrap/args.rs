//! The command line of `baton bootstrap`.

use std::path::PathBuf;

use clap::Args;

use super::progress::OutputMode;
use crate::config::ConfigArgs;

/// `baton bootstrap` arguments. Cloud settings come as in every subcommand (flag > env >
/// `--cloud-config` file > the config file's `cloud:` section > default).
#[derive(Debug, Args)]
pub struct BootstrapArgs {
    /// The bootstrap config file (YAML or JSON; see docs/bootstrap.md).
    #[arg(long, short = 'c', env = "BATON_BOOTSTRAP_CONFIG", value_name = "PATH")]
    pub config: PathBuf,
    /// Where progress is saved, so a rerun continues (overrides `stateFile`).
    #[arg(long, env = "BATON_BOOTSTRAP_STATE_FILE", value_name = "PATH")]
    pub state_file: Option<PathBuf>,
    /// Also write the current step and each Service's progress to this JSON file.
    #[arg(long, env = "BATON_BOOTSTRAP_STATUS_FILE", value_name = "PATH")]
    pub status_file: Option<PathBuf>,
    /// Progress output: a live view on a terminal, timestamped lines, or JSON events on stdout.
    #[arg(long, env = "BATON_BOOTSTRAP_OUTPUT", value_enum, default_value_t = OutputMode::Auto)]
    pub output: OutputMode,
    /// Exit once complete, instead of serving DNS until stopped.
    #[arg(long, env = "BATON_BOOTSTRAP_EXIT_WHEN_COMPLETE")]
    pub exit_when_complete: bool,
    /// Kubeconfig of the bootstrap API server (overrides `kubernetes.kubeconfig`).
    #[arg(long, env = "KUBECONFIG", value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// Validate the config file (and the cloud settings) and exit, touching nothing.
    #[arg(long)]
    pub check_config: bool,
    #[command(flatten)]
    pub cloud: ConfigArgs,
}
