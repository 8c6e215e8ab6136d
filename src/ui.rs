//! `skein ui [--listen 127.0.0.1:8080]`: wires the page (`skein_ui`) to
//! this binary's table kinds and the environment's Lambda endpoint.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use crate::registry::registries;

#[derive(Args, Debug)]
pub struct UiArgs {
    /// Where to listen. It has no authentication: keep it on a loopback
    /// address unless a proxy in front of it authenticates.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Where local queries keep their checkpoint directories (and those
    /// without one say they run); the queries the page starts use it too.
    #[arg(long, env = crate::run::checkpoint_dir::ROOT_ENV, default_value = crate::run::checkpoint_dir::DEFAULT_ROOT)]
    pub checkpoint_root: PathBuf,
    /// The Lambda deployment's store, where standing queries' specs are.
    #[arg(long, env = "SKEIN_STORE", default_value = "s3://skein")]
    pub store: String,
    /// A Kafka cluster whose topics the page lists and samples, as
    /// bootstrap servers (host:port,...).
    #[arg(long, env = "SKEIN_KAFKA_BROKERS", value_name = "BROKERS")]
    pub kafka: Option<String>,
    /// The schema registry of that cluster's Avro and Protobuf topics.
    #[arg(long, env = "SKEIN_SCHEMA_REGISTRY", value_name = "URL")]
    pub schema_registry: Option<String>,
    /// Do not list the Kinesis streams of the AWS endpoint the environment
    /// names (listed by default when it names one).
    #[arg(long)]
    pub no_kinesis: bool,
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

/// The clusters the page lists the streams of.
/// Kafka when `--kafka` names brokers; Kinesis when the environment names
/// an AWS endpoint, region or profile (as for Lambda), unless `--no-kinesis`.
fn source_clusters(args: &UiArgs) -> Vec<skein_ui::sources::SourceCluster> {
    let registry: BTreeMap<String, String> = args
        .schema_registry
        .iter()
        .map(|url| ("schema.registry.url".to_string(), url.clone()))
        .collect();
    let mut clusters = vec![];
    if let Some(brokers) = &args.kafka {
        let mut options = registry.clone();
        options.insert("bootstrap.servers".into(), brokers.clone());
        clusters.push(skein_ui::sources::SourceCluster {
            kind: skein_connectors::kafka::KIND.into(),
            name: brokers.clone(),
            options,
        });
    }
    if !args.no_kinesis && aws_configured() {
        let endpoint = std::env::var("AWS_ENDPOINT_URL")
            .or_else(|_| std::env::var("AWS_REGION"))
            .or_else(|_| std::env::var("AWS_DEFAULT_REGION"))
            .unwrap_or_else(|_| "the AWS profile's region".into());
        clusters.push(skein_ui::sources::SourceCluster {
            kind: skein_connectors::kinesis::KIND.into(),
            name: endpoint,
            options: registry,
        });
    }
    clusters
}

pub async fn ui(args: UiArgs) -> Result<()> {
    let sources = source_clusters(&args);
    let lambda_store = (!args.no_lambda && aws_configured()).then_some(args.store);
    skein_ui::serve(skein_ui::UiOptions {
        listen: args.listen,
        checkpoint_root: args.checkpoint_root,
        lambda_store,
        catalog: registries().catalog,
        launcher: std::env::current_exe().context("finding this skein binary")?,
        sources,
    })
    .await?;
    Ok(())
}
