//! `skein ysb ...`: the Yahoo Streaming Benchmark, Kafka -> Skein -> Redis.
//!
//! * `setup` ([`setup`]): the campaigns and their ads into Redis as YSB's
//!   setup writes them (`SET <ad> <campaign>`, `SADD campaigns <campaign>`),
//!   old results of those campaigns and the topic's checkpoints removed;
//! * `generate` ([`setup`]): events into the topic (4 partitions), the ground
//!   truth into `<dir>/truth.csv`; `--malformed-percent` mixes in
//!   undecodable records;
//! * `run` ([`run`]): `queries/ysb.sql` through the engine's checkpointed
//!   driver, resuming after the last committed epoch of its checkpoint
//!   directory, until the committed offsets reach the end of the topic (or
//!   for `--duration`, however many epochs come back empty);
//! * `check` ([`check`]): Redis against the ground truth and
//!   against counts recomputed from the topic itself, the dead-letter topic
//!   against the topic's undecodable records, and the latency
//!   `time_updated - window end` as YSB's `updated.txt` reports it;
//! * `bench` ([`bench`]): the drain throughput and the window latency.
//!
//! What YSB is lives in the `skein-ysb` crate; this module parses the
//! arguments, runs the query through the `skein` library's checkpointed
//! local run, calls `skein-ysb` and prints.

mod bench;
mod check;
mod run;
mod setup;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use clap::{Args, Subcommand};
use skein_generators::ysb::DEFAULT_SEED;
use skein_ysb::Workload;

use crate::args::parse_duration;

#[derive(Subcommand, Debug)]
pub enum YsbCommand {
    /// Campaigns and ads into Redis; clears earlier results of those campaigns.
    Setup(YsbArgs),
    /// Publish events to the topic and write the ground truth.
    Generate(GenerateArgs),
    /// Run queries/ysb.sql: Kafka -> Skein -> Redis.
    Run(YsbRunArgs),
    /// Compare Redis with the ground truth and with counts recomputed from the
    /// topic; exits non-zero on any difference.
    Check(CheckArgs),
    /// With `--rate R --duration D`: publish at R events/s while the query
    /// runs, and report the window latency (time_updated - window end).
    /// Without: pre-load `--events N` into a fresh topic, then time a raw
    /// rdkafka drain and Skein's drain.
    Bench(BenchArgs),
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub common: YsbArgs,
    /// Drain bench: events to pre-load [default: 5000000].
    #[arg(long, conflicts_with = "rate")]
    pub events: Option<u64>,
    /// Latency bench: events per second of wall-clock time, published while
    /// the query runs (needs --duration).
    #[arg(long, requires = "duration")]
    pub rate: Option<u64>,
    /// Latency bench: how long the load lasts.
    #[arg(long, value_parser = parse_duration, requires = "rate")]
    pub duration: Option<Duration>,
    /// Latency bench: time between epochs of the query.
    #[arg(long, value_parser = parse_duration, default_value = "100ms")]
    pub interval: Duration,
    /// Source instances of the Skein run.
    #[arg(long, default_value_t = 2)]
    pub parallelism: usize,
    /// Members of each function group of the Skein run.
    #[arg(long, default_value_t = skein_engine::planner::DEFAULT_GROUP_SIZE)]
    pub group_size: usize,
    /// Commit a checkpoint every this many epochs [default: every epoch for
    /// a drain bench; for a latency bench, as a standing query commits:
    /// every 10 s of epochs].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub checkpoint_every: Option<u64>,
    /// Serve Prometheus metrics at http://ADDR/metrics while the query runs.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<std::net::SocketAddr>,
    /// Latency bench: draw throughput and window latency over time to this SVG.
    #[arg(long, value_name = "FILE.svg", requires = "rate")]
    pub plot: Option<PathBuf>,
}

#[derive(Args, Debug, Clone)]
pub struct YsbArgs {
    #[arg(long, default_value = "127.0.0.1:9092", env = "SKEIN_KAFKA")]
    pub brokers: String,
    #[arg(long, default_value = "redis://127.0.0.1:6379", env = "SKEIN_REDIS")]
    pub redis: String,
    #[arg(long, default_value = "ad-events")]
    pub topic: String,
    /// Seed of the campaign and ad UUIDs and of the events.
    #[arg(long, default_value_t = DEFAULT_SEED)]
    pub seed: u64,
    /// Where the ground truth and the campaign mapping are kept.
    #[arg(long, default_value = ".skein/ysb")]
    pub dir: PathBuf,
    /// The query's durable state (offsets log, commits); a restarted run
    /// resumes from it [default: .skein/checkpoints/ysb-<topic>].
    #[arg(long, value_name = "DIR")]
    pub checkpoint_dir: Option<PathBuf>,
    /// Print one JSON line.
    #[arg(long)]
    pub json: bool,
    /// Print nothing (when `bench` runs the steps).
    #[arg(skip)]
    pub quiet: bool,
}

#[derive(Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub common: YsbArgs,
    #[arg(long, default_value_t = 1_000_000)]
    pub events: u64,
    /// Events per second of event time.
    #[arg(long, default_value_t = 100_000)]
    pub rate: u64,
    #[arg(long, default_value_t = 4)]
    pub partitions: i32,
    /// Percent of extra, undecodable records mixed into the topic.
    #[arg(long, default_value_t = 0.0)]
    pub malformed_percent: f64,
}

#[derive(Args, Debug)]
pub struct YsbRunArgs {
    #[command(flatten)]
    pub common: YsbArgs,
    /// Stop once an epoch finds nothing new and the committed offsets have
    /// reached the end of every partition (the default).
    #[arg(long, conflicts_with = "duration")]
    pub until_drained: bool,
    /// Run this long, pulling whatever arrives meanwhile (an empty epoch does
    /// not end the run).
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Time between epochs.
    #[arg(long, value_parser = parse_duration, default_value = "100ms")]
    pub interval: Duration,
    /// Source instances (partitions are spread over them).
    #[arg(long, default_value_t = 2)]
    pub parallelism: usize,
    /// Records one source instance reads per epoch at most.
    #[arg(long, default_value_t = 250_000)]
    pub max_records: usize,
    /// Members of each function group.
    #[arg(long, default_value_t = skein_engine::planner::DEFAULT_GROUP_SIZE)]
    pub group_size: usize,
    /// Commit a checkpoint every this many epochs.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub checkpoint_every: u64,
    /// Where undecodable records and views of ads without a campaign go
    /// (default: `<topic>-dead-letters`).
    #[arg(long)]
    pub dead_letter_topic: Option<String>,
    /// Serve Prometheus metrics at http://ADDR/metrics while the query runs
    /// (docs/metrics.md).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<std::net::SocketAddr>,
    /// Set by `bench --rate`: the query runs as a standing query (deciding
    /// its epochs through the next checkpoint, as a deployed one does) and
    /// is stopped once the load beside it has ended and all it published
    /// has been read.
    #[arg(skip)]
    pub load: Option<Arc<LoadEnd>>,
}

/// The end of a load published beside the query: how many events it
/// published, once it has stopped (0 if it failed, so the run stops too).
#[derive(Debug, Default)]
pub struct LoadEnd(std::sync::OnceLock<u64>);

impl LoadEnd {
    pub fn ended(&self, published: u64) {
        let _ = self.0.set(published);
    }

    /// Whether a run that has read `read` events has read the whole load.
    fn read_all(&self, read: u64) -> bool {
        self.0.get().is_some_and(|&published| read >= published)
    }
}

#[derive(Args, Debug)]
pub struct CheckArgs {
    #[command(flatten)]
    pub common: YsbArgs,
    /// The dead-letter topic to compare with the topic's undecodable records
    /// (default: `<topic>-dead-letters`, as `ysb run` uses).
    #[arg(long)]
    pub dead_letter_topic: Option<String>,
}

pub async fn ysb(cmd: YsbCommand) -> Result<()> {
    match cmd {
        YsbCommand::Setup(a) => setup::setup(&a).await,
        YsbCommand::Generate(a) => setup::generate(&a).await,
        YsbCommand::Run(a) => run::run(&a).await,
        YsbCommand::Check(a) => check::check(&a).await,
        YsbCommand::Bench(a) => bench::bench(a).await,
    }
}

impl YsbArgs {
    /// Where `ysb run` keeps the topic's checkpoints.
    fn checkpoint_dir(&self) -> PathBuf {
        self.checkpoint_dir.clone().unwrap_or_else(|| {
            crate::run::checkpoint_dir::root()
                .join(format!("ysb-{}", self.topic))
        })
    }

    /// The workload these arguments name.
    fn workload(&self) -> Workload {
        Workload {
            brokers: self.brokers.clone(),
            redis: self.redis.clone(),
            topic: self.topic.clone(),
            seed: self.seed,
            dir: self.dir.clone(),
        }
    }
}
