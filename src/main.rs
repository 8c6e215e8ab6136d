//! `skein`: plan, explain, run and benchmark streaming SQL queries that run
//! as a DAG of functions passing Arrow data in their payloads.

mod bench;
mod registry;
mod run;

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use skein_engine::payload::Encoding;

#[derive(Parser)]
#[command(
    name = "skein",
    version,
    about = "Serverless streaming SQL: queries as payload-chained function DAGs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print a query's stage DAG: stages, operators, exchanges, functions.
    Explain {
        file: PathBuf,
        #[command(flatten)]
        plan: PlanArgs,
        /// One JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Run a query on the in-process function runtime.
    Run(run::RunArgs),
    /// Run one NEXMark query on the built-in generator.
    Nexmark(run::NexmarkArgs),
    /// Benchmarks that print figures (see docs/benchmarks.md).
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

/// How a query is planned.
#[derive(Args, Clone, Debug)]
pub struct PlanArgs {
    /// Members of each function group (hash partitions of a shuffle).
    #[arg(long, default_value_t = skein_engine::planner::DEFAULT_GROUP_SIZE)]
    pub group_size: usize,
    /// Compression of payload data: zstd, lz4 or none.
    #[arg(long, default_value = "zstd")]
    pub encoding: Encoding,
    /// Invoke the next stage asynchronously (Event) instead of synchronously.
    #[arg(long)]
    pub invoke_async: bool,
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Explain { file, plan, json } => run::explain(&file, &plan, json).await,
        Command::Run(args) => run::run(args).await,
        Command::Nexmark(args) => run::nexmark(args).await,
        Command::Bench(cmd) => bench::bench(cmd).await,
    }
}
