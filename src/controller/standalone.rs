//! `baton controller-services` (hidden): runs only the cloud-controller duties — the
//! Service FIP controller and, with `--nodes`, the node controller — against the cluster in
//! `KUBECONFIG` (or in-cluster) and the configured cloud, with no leader election (one replica).
//!
//! It exists for the crash test and the benchmark, which need a process they can kill; in
//! production these controllers run inside `baton controller`.

use std::sync::Arc;

use baton_cloud::CherryClient;
use clap::Args;
use tracing::info;

use super::watches::Watches;
use super::{Context, node, service};
use crate::config::{Config, ConfigArgs, ProcessEnv};
use crate::error::{Error, subcommand_error};

/// Arguments of `baton controller-services`.
#[derive(Debug, Args)]
pub struct StandaloneArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Also run the node controller (initialisation, deletion of Nodes whose server is gone).
    #[arg(long)]
    pub nodes: bool,
    /// Do not run the Service FIP controller.
    #[arg(long)]
    pub no_services: bool,
}

/// Runs the selected controllers until SIGINT or SIGTERM.
pub async fn run(args: StandaloneArgs) -> Result<(), Error> {
    let StandaloneArgs {
        config,
        nodes,
        no_services,
    } = args;
    // Before anything waits on the API (the cluster id is retried until it is read): a signal
    // then stops the process cleanly, also during that wait.
    let shutdown = tokio_util::sync::CancellationToken::new();
    let on_signal = shutdown.clone();
    let signal = crate::signal::shutdown();
    tokio::spawn(async move {
        signal.await;
        info!("signal received; stopping");
        on_signal.cancel();
    });
    let config = Config::resolve(&config, &ProcessEnv)?;
    let cloud = CherryClient::new(config.cloud_client_config()?).map_err(subcommand_error)?;
    let client = kube::Client::try_default().await.map_err(subcommand_error)?;
    let ctx = Context::unelected(client, Arc::new(cloud), Arc::new(config));
    let ctx = tokio::select! {
        () = shutdown.cancelled() => return Ok(()),
        ctx = ctx => Arc::new(ctx.map_err(subcommand_error)?),
    };
    info!(version = env!("CARGO_PKG_VERSION"), cluster = %ctx.cluster_id, services = !no_services, nodes, "cloud controllers starting");
    let mut watches = Watches::new(&ctx.client);
    let services = (!no_services)
        .then(|| service::run_services(ctx.clone(), &mut watches, shutdown.clone().cancelled_owned()));
    let nodes = nodes.then(|| node::run_nodes(ctx.clone(), &mut watches, shutdown.clone().cancelled_owned()));
    // Boxed: the controllers' futures are large.
    Box::pin(async {
        tokio::join!(
            async {
                if let Some(services) = services {
                    services.await;
                }
            },
            async {
                if let Some(nodes) = nodes {
                    nodes.await;
                }
            },
            watches.run(shutdown.clone().cancelled_owned()),
        );
    })
    .await;
    Ok(())
}
