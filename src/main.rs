//! `skein`: plan, explain, run and benchmark streaming SQL queries that run
//! as a DAG of functions passing Arrow data in their payloads. The command
//! line only: every command is a call into the `skein` library.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};
use skein::{PlanArgs, bench, cost, r#gen, lambda, preview, rescale, run, status, ui, ysb};

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
    /// Run a query on its live tables to see what it produces: rows print
    /// as epochs complete; no sink is written, no offset committed.
    Preview(preview::PreviewArgs),
    /// Run a query on the in-process function runtime (or --backend lambda).
    Run {
        #[command(flatten)]
        args: run::RunArgs,
        #[command(flatten)]
        lambda: lambda::LambdaArgs,
    },
    /// Deploy a query's functions to Lambda (--backend lambda).
    Deploy(lambda::deploy::DeployArgs),
    /// Delete every Lambda function of a query (a SQL file or its query code).
    Destroy(lambda::deploy::DestroyArgs),
    /// Pause a standing query on Lambda: its schedule is disabled, its state kept.
    Stop(lambda::deploy::QueryArgs),
    /// Resume a stopped standing query on Lambda.
    Start(lambda::deploy::QueryArgs),
    /// A query's progress (lag, watermark, epochs, state), locally or on
    /// Lambda; without a query, the queries deployed on Lambda.
    Status(status::StatusArgs),
    /// Change a function group's size while its query runs: whole key
    /// groups move between members after the next commit.
    Rescale(rescale::RescaleArgs),
    /// A web page of the queries: stage graph, rates, lag, watermarks,
    /// checkpoints and cost (no authentication; binds 127.0.0.1).
    Ui(ui::UiArgs),
    /// Zip the skein-function binary as a Lambda package (bootstrap.zip).
    Package(lambda::deploy::PackageArgs),
    /// Run one NEXMark query on the built-in generator.
    Nexmark(run::NexmarkArgs),
    /// Benchmarks that print figures (see docs/benchmarks.md).
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Estimate what a standing query costs at a rate: Lambda, a VM, Managed Flink.
    Cost(cost::CostArgs),
    /// Publish NEXMark or YSB events to Kafka or Kinesis.
    Gen(r#gen::GenArgs),
    /// The Yahoo Streaming Benchmark: Kafka -> Skein -> Redis, exactly once.
    #[command(subcommand)]
    Ysb(ysb::YsbCommand),
}

#[tokio::main]
async fn main() {
    // One line, whatever RUST_BACKTRACE says: the error and its causes, each
    // once (an engine error prints its cause already).
    if let Err(e) = cli().await {
        eprintln!("Error: {}", skein_engine::error::one_line(e.as_ref()));
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
            lambda::Backend::Local => run::run(args).await,
            lambda::Backend::Lambda => lambda::run::run(&args.file, &args.common, &lambda).await,
        },
        Command::Preview(args) => preview::preview_command(args).await,
        Command::Deploy(args) => lambda::deploy::deploy(args).await,
        Command::Destroy(args) => lambda::deploy::destroy(args).await,
        Command::Stop(args) => lambda::deploy::set_running(args, false).await,
        Command::Start(args) => lambda::deploy::set_running(args, true).await,
        Command::Status(args) => status::status(args).await,
        Command::Rescale(args) => rescale::rescale(args).await,
        Command::Ui(args) => ui::ui(args).await,
        Command::Package(args) => lambda::deploy::package(args),
        Command::Nexmark(args) => run::nexmark(args).await,
        Command::Bench(cmd) => bench::bench(cmd).await,
        Command::Ysb(cmd) => ysb::ysb(cmd).await,
        Command::Cost(args) => cost::cost(args).await,
        Command::Gen(args) => r#gen::gen_command(args).await,
    }
}
