//! `skein ui [--listen 127.0.0.1:8080]`: wires the page (`skein_ui`) to
//! this binary's table kinds and the environment's Lambda endpoint.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use crate::registry::registries;

#[derive(Args, Debug)]
pub struct UiArgs {
    /// Where to listen. It has no authentication: keep it on a loopback
    /// address unless a proxy in front of it authenticates.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Where local queries keep their checkpoint directories.
    #[arg(long, default_value = crate::run::checkpoint_dir::DEFAULT_ROOT)]
    pub checkpoint_root: PathBuf,
    /// The Lambda deployment's store, where standing queries' specs are.
    #[arg(long, env = "SKEIN_STORE", default_value = "s3://skein")]
    pub store: String,
    /// Do not ask Lambda for deployed queries (by default it is asked when
    /// the environment names an AWS endpoint, region or profile).
    #[arg(long)]
    pub no_lambda: bool,
}

/// Whether the environment points at an AWS (or stand-in) endpoint.
fn aws_configured() -> bool {
    [
        "AWS_ENDPOINT_URL",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "AWS_PROFILE",
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some())
}

pub async fn ui(args: UiArgs) -> Result<()> {
    let lambda_store = (!args.no_lambda && aws_configured()).then_some(args.store);
    skein_ui::serve(skein_ui::UiOptions {
        listen: args.listen,
        checkpoint_root: args.checkpoint_root,
        lambda_store,
        catalog: registries().catalog,
    })
    .await?;
    Ok(())
}
