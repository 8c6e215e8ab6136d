//! The arguments several commands share: how a query runs (`CommonRunArgs`)
//! and reading its SQL file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use skein_engine::driver::StopAfter;
use skein_engine::planner::QueryPlan;
use skein_engine::query::RunBound;

use crate::PlanArgs;
pub use skein_engine::interval::parse_duration;

#[derive(Args, Debug)]
pub struct CommonRunArgs {
    /// Number of epochs (micro-batches) to split a bounded input into
    /// [default: 10]. In-process, a query that reads Kafka or Kinesis given
    /// no --epochs, --duration or --until-drained is a standing query: one
    /// epoch per --interval until SIGINT or SIGTERM.
    #[arg(long, conflicts_with_all = ["duration", "until_drained"], value_parser = positive_epochs)]
    pub epochs: Option<u64>,
    /// Run for this long instead (e.g. 30s, 2m), one epoch per --interval.
    #[arg(long, value_parser = parse_duration, conflicts_with = "until_drained")]
    pub duration: Option<Duration>,
    /// Run until every source partition (Kafka partition, Kinesis shard) has
    /// reached the end it had when the run started, one epoch per --interval.
    #[arg(long)]
    pub until_drained: bool,
    /// Time between epochs of a --duration, --until-drained or standing run
    /// [default: the shortest 'epoch.interval' option of the query's source
    /// tables, else 1s].
    #[arg(long, value_parser = parse_duration)]
    pub interval: Option<Duration>,
    #[command(flatten)]
    pub plan: PlanArgs,
    /// Also run the query in one process with plain DataFusion and compare.
    #[arg(long)]
    pub verify: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics while the query runs
    /// (e.g. 127.0.0.1:9898); docs/metrics.md lists them.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<std::net::SocketAddr>,
    /// Keep the query's durable state (offsets log, member state, commits)
    /// here; a restart resumes from it. Default: .skein/checkpoints/<query>
    /// for a query that reads Kafka or Kinesis and writes Kafka, Redis or files.
    /// On Lambda: s3://bucket/prefix (default <store>/skein/checkpoints/<query>).
    #[arg(long, value_name = "DIR", conflicts_with = "no_checkpoint")]
    pub checkpoint_dir: Option<PathBuf>,
    /// Do not checkpoint: a restart starts afresh (at least once).
    #[arg(long)]
    pub no_checkpoint: bool,
    /// Commit every N epochs (a restart re-runs at most N-1 epochs)
    /// [default: every epoch; a standing query: 10 s of epochs].
    #[arg(long, value_parser = crate::positive)]
    pub checkpoint_interval: Option<usize>,
    /// Print one JSON summary line instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Result rows to print (text mode).
    #[arg(long, default_value_t = 20)]
    pub show: usize,
    /// Size each stateful function group within MIN..MAX members (e.g.
    /// 1..8) from its measured work, while the query runs: it grows when
    /// its members are busy more than half of each epoch interval and
    /// shrinks when they idle (docs/lambda.md, "Autoscaling"). On Lambda
    /// it stays within the --group-size deployed. The query needs its
    /// checkpoint store.
    #[arg(long, value_name = "MIN..MAX")]
    pub autoscale: Option<skein_engine::autoscale::AutoscaleRange>,
    /// The query's name, shown by `skein status`, the page and `--json`
    /// [default: a `-- name:` line in the SQL, else the file's stem]. Two
    /// running queries may not share one.
    #[arg(long)]
    pub name: Option<String>,
    /// The name is the file's stem, not one the user gave.
    #[arg(skip)]
    pub name_from_stem: bool,
}

/// [`CommonRunArgs`] parsed alone, for [`CommonRunArgs::from_flags`].
#[derive(clap::Parser)]
struct FlagsOnly {
    #[command(flatten)]
    common: CommonRunArgs,
}

impl CommonRunArgs {
    /// The arguments `skein run` would take from `flags` (e.g.
    /// `["--epochs", "5", "--verify"]`), for callers of [`run_report`].
    pub fn from_flags<I, T>(flags: I) -> Result<Self>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        use clap::Parser;
        let argv = std::iter::once(std::ffi::OsString::from("skein-run"))
            .chain(flags.into_iter().map(Into::into));
        Ok(FlagsOnly::try_parse_from(argv)
            .map_err(|e| anyhow::anyhow!("{}", e.render().to_string().trim()))?
            .common)
    }

    /// How the query is planned: `--group-size`, `--encoding`, ... and
    /// the epoch `--interval`.
    pub fn options(&self) -> skein_engine::planner::PlanOptions {
        let mut options = self.plan.options();
        options.interval = self.interval;
        options
    }

    /// When the run stops, as asked.
    pub fn bound(&self) -> RunBound {
        RunBound {
            epochs: self.epochs,
            duration: self.duration,
            until_drained: self.until_drained,
            interval: self.interval,
        }
    }

    /// No --epochs, --duration or --until-drained.
    pub fn unbounded(&self) -> bool {
        self.bound().unbounded()
    }

    /// Time between epochs: --interval, the tables' 'epoch.interval' or 1 s.
    pub fn interval(&self, plan: &QueryPlan) -> Result<Duration> {
        Ok(self.bound().interval(plan)?)
    }

    /// When a bounded run stops.
    pub fn stop(&self, plan: &QueryPlan) -> Result<StopAfter> {
        Ok(self.bound().stop(plan)?)
    }

    /// Epochs between commits of a run that stops as `stop` says:
    /// --checkpoint-interval, else the engine's default for it.
    pub fn checkpoint_interval(&self, stop: &StopAfter) -> u64 {
        match self.checkpoint_interval {
            Some(n) => n as u64,
            None => stop.default_checkpoint_interval(),
        }
    }

    /// What the user asked of checkpoints.
    pub fn checkpoint_request(&self) -> skein_engine::query::CheckpointRequest {
        skein_engine::query::CheckpointRequest {
            dir: self.checkpoint_dir.clone(),
            off: self.no_checkpoint,
        }
    }
}

pub fn read_sql(file: &Path) -> Result<String> {
    std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))
}

/// `--epochs`: zero epochs would run nothing (and ran one before).
fn positive_epochs(s: &str) -> std::result::Result<u64, String> {
    crate::positive(s).map(|n| n as u64)
}
