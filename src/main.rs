//! `skein`: plan, explain, run and benchmark streaming SQL queries that run
//! as a DAG of functions passing Arrow data in their payloads.

mod bench;
mod bench_state;
mod checkpoint;
mod checkpoint_dir;
mod cost;
mod lambda_bench;
mod lambda_cmd;
mod lambda_run;
mod publish;
mod registry;
mod run;
mod standing;
mod ysb;

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
    /// Run a query on the in-process function runtime (or --backend lambda).
    Run {
        #[command(flatten)]
        args: run::RunArgs,
        #[command(flatten)]
        lambda: lambda_cmd::LambdaArgs,
    },
    /// Deploy a query's functions to Lambda (--backend lambda).
    Deploy(lambda_cmd::DeployArgs),
    /// Delete every Lambda function of a query (a SQL file or its query code).
    Destroy(lambda_cmd::DestroyArgs),
    /// List the queries deployed on Lambda and their functions.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Zip the skein-function binary as a Lambda package (bootstrap.zip).
    Package(lambda_cmd::PackageArgs),
    /// Run one NEXMark query on the built-in generator.
    Nexmark(run::NexmarkArgs),
    /// Benchmarks that print figures (see docs/benchmarks.md).
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Estimate what a standing query costs at a rate: Lambda, a VM, Managed Flink.
    Cost(cost::CostArgs),
    /// Publish NEXMark or YSB events to Kafka or Kinesis.
    Gen(publish::GenArgs),
    /// The Yahoo Streaming Benchmark: Kafka -> Skein -> Redis, exactly once.
    #[command(subcommand)]
    Ysb(ysb::YsbCommand),
}

/// How a query is planned.
#[derive(Args, Clone, Debug)]
pub struct PlanArgs {
    /// Members of each function group (hash partitions of a shuffle).
    #[arg(long, default_value_t = skein_engine::planner::DEFAULT_GROUP_SIZE, value_parser = positive)]
    pub group_size: usize,
    /// Compression of payload data: zstd, lz4 or none.
    #[arg(long, default_value = "zstd")]
    pub encoding: Encoding,
    /// Invoke the next stage asynchronously (Event) instead of synchronously.
    #[arg(long)]
    pub invoke_async: bool,
}

impl PlanArgs {
    /// The planner's options; the run's lineage and checkpointing are the
    /// runner's to fill in.
    pub fn options(&self) -> skein_engine::planner::PlanOptions {
        skein_engine::planner::PlanOptions {
            group_size: self.group_size,
            encoding: self.encoding,
            invoke_async: self.invoke_async,
            ..Default::default()
        }
    }
}

/// A count that must be at least one (`--group-size`, `--repeat`, ...):
/// zero would plan no members or take the median of nothing.
pub fn positive(s: &str) -> std::result::Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

#[tokio::main]
async fn main() {
    // One line, whatever RUST_BACKTRACE says: the error and its causes.
    if let Err(e) = cli().await {
        eprintln!("Error: {e:#}");
        std::process::exit(1);
    }
}

async fn cli() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Explain { file, plan, json } => run::explain(&file, &plan, json).await,
        Command::Run { args, lambda } => match lambda.backend {
            lambda_cmd::Backend::Local => run::run(args).await,
            lambda_cmd::Backend::Lambda => lambda_run::run(&args.file, &args.common, &lambda).await,
        },
        Command::Deploy(args) => lambda_cmd::deploy(args).await,
        Command::Destroy(args) => lambda_cmd::destroy(args).await,
        Command::Status { json } => lambda_cmd::status(json).await,
        Command::Package(args) => lambda_cmd::package(args),
        Command::Nexmark(args) => run::nexmark(args).await,
        Command::Bench(cmd) => bench::bench(cmd).await,
        Command::Ysb(cmd) => ysb::ysb(cmd).await,
        Command::Cost(args) => cost::cost(args).await,
        Command::Gen(args) => publish::gen_command(args).await,
    }
}
