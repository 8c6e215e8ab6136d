//! `skein run`, `skein explain` and `skein nexmark`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::prelude::SessionContext;
use indicatif::{ProgressBar, ProgressStyle};
use object_store::memory::InMemory;
use skein_engine::checkpoint::fresh_run;
use skein_engine::driver::{RunReport, StopAfter, run_local_until};
use skein_engine::epochs::Stopped;
use skein_engine::local::LocalRuntime;
use skein_engine::planner::{QueryPlan, plan_query, session};
use skein_engine::verify::{Comparison, compare, single_process};

use crate::PlanArgs;
use crate::registry::{Registries, registries};
use crate::report::Report;

#[derive(Args, Debug)]
pub struct RunArgs {
    /// A SQL file: CREATE EXTERNAL TABLE statements, then one query.
    pub file: PathBuf,
    #[command(flatten)]
    pub common: CommonRunArgs,
}

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
}

/// Epochs of a bounded run given no bound.
const DEFAULT_EPOCHS: u64 = 10;

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

    /// No --epochs, --duration or --until-drained.
    pub fn unbounded(&self) -> bool {
        self.epochs.is_none() && self.duration.is_none() && !self.until_drained
    }

    /// Time between epochs: --interval, the tables' 'epoch.interval' or 1 s.
    pub fn interval(&self, plan: &QueryPlan) -> Result<Duration> {
        Ok(skein_engine::interval::effective_interval(
            self.interval,
            plan,
        )?)
    }

    /// When a bounded run stops.
    pub fn stop(&self, plan: &QueryPlan) -> Result<StopAfter> {
        let interval = self.interval(plan)?;
        Ok(match (self.duration, self.until_drained) {
            (_, true) => StopAfter::Drained { interval },
            (Some(duration), false) => StopAfter::Duration { duration, interval },
            (None, false) => StopAfter::Epochs(self.epochs.unwrap_or(DEFAULT_EPOCHS)),
        })
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
    pub fn checkpoint_request(&self) -> crate::checkpoint_dir::Request {
        crate::checkpoint_dir::Request {
            dir: self.checkpoint_dir.clone(),
            off: self.no_checkpoint,
        }
    }
}

#[derive(Args, Debug)]
pub struct NexmarkArgs {
    /// Query number, 0..=22.
    #[arg(long)]
    pub query: u32,
    /// Events to generate.
    #[arg(long, default_value_t = 100_000)]
    pub events: u64,
    /// Event rate (events per second of event time).
    #[arg(long, default_value_t = 10_000)]
    pub rate: u64,
    /// Generator instances (source parallelism).
    #[arg(long, default_value_t = 2)]
    pub sources: usize,
    /// Print the stage DAG instead of running.
    #[arg(long)]
    pub explain: bool,
    /// Where q10 writes its files: file:///dir or s3://bucket/prefix
    /// (default: skein-nexmark-q10 in the temporary directory).
    #[arg(long)]
    pub output: Option<String>,
    #[command(flatten)]
    pub common: CommonRunArgs,
}

pub fn read_sql(file: &Path) -> Result<String> {
    std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))
}

pub async fn explain(file: &Path, plan_args: &PlanArgs, as_json: bool) -> Result<()> {
    let sql = read_sql(file)?;
    explain_sql(&sql, plan_args, as_json)
        .await
        .with_context(|| format!("planning {}", file.display()))
}

async fn explain_sql(sql: &str, plan_args: &PlanArgs, as_json: bool) -> Result<()> {
    let regs = registries();
    let ctx = session(&regs.sources, plan_args.group_size);
    let plan = plan_query(&ctx, sql, &plan_args.options()).await?;
    if as_json {
        println!("{}", plan.explain_json());
    } else {
        print!("{}", plan.explain());
    }
    Ok(())
}

pub async fn run(args: RunArgs) -> Result<()> {
    let sql = read_sql(&args.file)?;
    let report = run_sql(&sql, &args.common, None).await?;
    println!("{}", report);
    Ok(())
}

pub async fn nexmark(args: NexmarkArgs) -> Result<()> {
    let sql = match &args.output {
        Some(output) => nexmark_sql_to(args.query, args.events, args.rate, args.sources, output)?,
        None => nexmark_sql(args.query, args.events, args.rate, args.sources)?,
    };
    if args.explain {
        return explain_sql(&sql, &args.common.plan, args.common.json).await;
    }
    let report = run_sql(&sql, &args.common, Some(args.query)).await?;
    println!("{}", report);
    Ok(())
}

/// The NEXMark tables over the built-in generator, then query N; q10's
/// files go to the default output.
pub fn nexmark_sql(query: u32, events: u64, rate: u64, sources: usize) -> Result<String> {
    let output = format!(
        "file://{}",
        std::env::temp_dir().join("skein-nexmark-q10").display()
    );
    nexmark_sql_to(query, events, rate, sources, &output)
}

/// The NEXMark queries, built into the binary so that an installed `skein`
/// runs them anywhere.
const NEXMARK_QUERIES: [&str; 23] = [
    include_str!("../queries/nexmark/q0.sql"),
    include_str!("../queries/nexmark/q1.sql"),
    include_str!("../queries/nexmark/q2.sql"),
    include_str!("../queries/nexmark/q3.sql"),
    include_str!("../queries/nexmark/q4.sql"),
    include_str!("../queries/nexmark/q5.sql"),
    include_str!("../queries/nexmark/q6.sql"),
    include_str!("../queries/nexmark/q7.sql"),
    include_str!("../queries/nexmark/q8.sql"),
    include_str!("../queries/nexmark/q9.sql"),
    include_str!("../queries/nexmark/q10.sql"),
    include_str!("../queries/nexmark/q11.sql"),
    include_str!("../queries/nexmark/q12.sql"),
    include_str!("../queries/nexmark/q13.sql"),
    include_str!("../queries/nexmark/q14.sql"),
    include_str!("../queries/nexmark/q15.sql"),
    include_str!("../queries/nexmark/q16.sql"),
    include_str!("../queries/nexmark/q17.sql"),
    include_str!("../queries/nexmark/q18.sql"),
    include_str!("../queries/nexmark/q19.sql"),
    include_str!("../queries/nexmark/q20.sql"),
    include_str!("../queries/nexmark/q21.sql"),
    include_str!("../queries/nexmark/q22.sql"),
];

/// [`nexmark_sql`] with the location a query writing files (q10) writes to.
pub fn nexmark_sql_to(
    query: u32,
    events: u64,
    rate: u64,
    sources: usize,
    output: &str,
) -> Result<String> {
    let body = NEXMARK_QUERIES
        .get(query as usize)
        .with_context(|| format!("NEXMark query {query}: there are q0 to q22"))?
        .replace("{{output}}", output);
    let tables = skein_generators::table::nexmark_ddl(events, rate, sources);
    Ok(format!("{tables}\n{body}"))
}

/// Plan, run on the in-process runtime, optionally verify; returns the text
/// to print (a JSON line with `--json`).
pub async fn run_sql(
    sql: &str,
    args: &CommonRunArgs,
    nexmark_query: Option<u32>,
) -> Result<String> {
    let (report, mismatch) = run_report(sql, args, nexmark_query).await?;
    let out = report.render(args.json, args.show)?;
    if let Some(cmp) = mismatch {
        eprintln!("{out}");
        bail!(
            "verification failed: {} rows expected, {} produced; first differences:\n{}",
            cmp.expected_rows,
            cmp.got_rows,
            cmp.differences.join("\n")
        );
    }
    Ok(out)
}

/// Plan `sql`, run it on the in-process runtime and, with `--verify`,
/// compare its rows with single-process DataFusion: the typed report, and
/// the differences when they disagree. What `skein run` and `skein nexmark`
/// print, for callers (and tests) that want the figures, not the text.
pub async fn run_report(
    sql: &str,
    args: &CommonRunArgs,
    nexmark_query: Option<u32>,
) -> Result<(Report, Option<Comparison>)> {
    if let Some(addr) = args.metrics {
        serve_metrics(addr)?;
    }
    let Registries {
        sources,
        sinks,
        collect,
    } = registries();
    let ctx: SessionContext = session(&sources, args.plan.group_size);
    let mut opts = args.plan.options();
    opts.interval = args.interval;
    let mut plan: QueryPlan = plan_query(&ctx, sql, &opts)
        .await
        .context("planning the query")?;
    for (table, offsets) in crate::checkpoint::resume_from_sink(&mut plan).await? {
        tracing::info!(%table, %offsets, "resuming from the sink's checkpoint");
    }
    let runtime = LocalRuntime::new(sources, sinks, Arc::new(InMemory::new()));
    let mut opts = opts;
    let request = args.checkpoint_request();
    let held = crate::checkpoint_dir::open(&plan, &request).await?;
    if held.is_none() {
        crate::checkpoint_dir::note_if_at_least_once(&plan, &request);
    }
    let files_sink = plan
        .sink
        .kind
        .eq_ignore_ascii_case(skein_connectors::files::KIND);
    let blackhole = plan
        .sink
        .kind
        .eq_ignore_ascii_case(skein_connectors::blackhole::KIND);
    if blackhole && args.verify {
        bail!("--verify compares result rows, and a BLACKHOLE sink keeps none");
    }
    if files_sink && args.verify {
        // Verification reads back what this query wrote: only this run's files.
        skein_connectors::files::clear(&plan.sink.location, &plan.query_code)
            .await
            .context("clearing the files of an earlier run")?;
    }

    // A live source and no bound: a standing query, stopped by a signal.
    let (stop, signal) = if args.unbounded() && crate::checkpoint_dir::reads_live_source(&plan) {
        if args.verify {
            bail!(
                "--verify compares a whole input with its result: give a standing query a \
                 bound (--epochs, --duration or --until-drained)"
            );
        }
        let (stop, signal) = crate::standing::until_signalled(args.interval(&plan)?)?;
        (stop, Some(signal))
    } else {
        (args.stop(&plan)?, None)
    };
    match &held {
        Some(h) => h.attach(&runtime, &mut opts, args.checkpoint_interval(&stop)),
        None => opts.run = fresh_run(&plan.query_code),
    }
    let expected_epochs = match &stop {
        StopAfter::Epochs(n) => Some(*n),
        StopAfter::Duration { duration, interval } => {
            Some((duration.as_millis() / interval.as_millis().max(1)) as u64 + 1)
        }
        // Unknown in advance: the bar counts up.
        StopAfter::Drained { .. } | StopAfter::Signalled { .. } => None,
    };
    let (bar, template) = match expected_epochs {
        _ if args.json => (ProgressBar::hidden(), "{msg}"),
        Some(n) => (
            ProgressBar::new(n),
            "{spinner} epoch {pos}/{len} {wide_bar} {msg}",
        ),
        None => (
            ProgressBar::no_length(),
            "{spinner} epoch {pos} {elapsed} {msg}",
        ),
    };
    bar.set_style(ProgressStyle::with_template(template).expect("progress template"));
    bar.enable_steady_tick(Duration::from_millis(200));
    let cpu_before = crate::cost::process_cpu_s();
    let mut report: RunReport = run_local_until(&plan, &runtime, &opts, stop, |epoch, events| {
        bar.set_position(epoch + 1);
        bar.set_message(format!("{events} events"));
    })
    .await
    .context("running the query")?;
    bar.finish_and_clear();
    let measured = crate::cost::measured(&report, crate::cost::process_cpu_s() - cpu_before);
    let cost = crate::cost::section(&measured, None, &Default::default())?;
    let signalled = signal.is_some_and(|s| s.is_raised());

    // Rows INSERTed into files can be read back; other sinks keep theirs.
    let results: Vec<RecordBatch> = if files_sink {
        read_files(&plan).await?
    } else {
        let batches = collect.sink(&plan.query_code).batches();
        skein_engine::updating::in_query_order(&plan, batches).await?
    };
    report.result_rows = results.iter().map(|b| b.num_rows()).sum();
    // A blackhole keeps no rows, only their count.
    let discarded = blackhole.then(|| skein_connectors::blackhole::take(&plan.query_code));
    if let Some(d) = discarded {
        report.result_rows = d.rows as usize;
    }
    let mut diff = None;
    if args.verify {
        let expected = single_process(&ctx, &plan)
            .await
            .context("single-process DataFusion run")?;
        let cmp = compare(&expected, &results, plan.ordered)?;
        report.verified = Some(cmp.equal);
        if !cmp.equal {
            diff = Some(cmp);
        }
    }

    let report = Report {
        query: nexmark_query,
        query_code: report.query_code,
        stages: report.stages,
        functions: report.functions,
        invocations: report.invocations,
        payload_bytes: report.payload_bytes,
        events: report.events,
        events_per_s: report.events_per_s.round(),
        result_rows: report.result_rows,
        verified: report.verified,
        epochs: report.epochs,
        elapsed_s: report.elapsed_s,
        late_rows: Some(report.late_rows),
        late_rows_by_table: Some(report.late_rows_by_table),
        checkpoint_dir: held.as_ref().map(|h| h.dir.display().to_string()),
        resumed_after: report.resumed_after,
        stopped: if signalled {
            Stopped::Signal
        } else {
            Stopped::Bound
        },
        blackhole: discarded,
        lambda: None,
        cost,
        rows: results,
    };
    Ok((report, diff))
}

/// Serve what the engine measures as Prometheus text at `addr`/metrics.
pub fn serve_metrics(addr: std::net::SocketAddr) -> Result<()> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets_for_metric(
            // Every histogram: epochs, checkpoint writes, commits.
            Matcher::Suffix("_seconds".into()),
            &[
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ],
        )
        .context("metric buckets")?
        .install()
        .with_context(|| format!("serving metrics on {addr}"))
}

pub fn limit_rows(batches: &[RecordBatch], n: usize) -> Vec<RecordBatch> {
    let mut out = vec![];
    let mut left = n;
    for b in batches {
        if left == 0 {
            break;
        }
        let take = b.num_rows().min(left);
        out.push(b.slice(0, take));
        left -= take;
    }
    out
}

pub use skein_engine::interval::parse_duration;

/// `--epochs`: zero epochs would run nothing (and ran one before).
fn positive_epochs(s: &str) -> std::result::Result<u64, String> {
    crate::positive(s).map(|n| n as u64)
}

/// The rows a query wrote to files, read back: for a changelog table, the
/// table its rows add up to.
async fn read_files(plan: &QueryPlan) -> Result<Vec<RecordBatch>> {
    use skein_connectors::files;
    let op = files::op_column(&plan.sink);
    let schema = match &op {
        Some(name) => {
            let mut fields: Vec<_> = plan.output_schema.fields().iter().cloned().collect();
            fields.push(Arc::new(datafusion::arrow::datatypes::Field::new(
                name,
                datafusion::arrow::datatypes::DataType::Utf8,
                false,
            )));
            Arc::new(datafusion::arrow::datatypes::Schema::new(fields))
        }
        None => plan.output_schema.clone(),
    };
    let rows = files::read(
        &plan.sink.location,
        &plan.query_code,
        files::format_of(&plan.sink)?,
        schema,
    )
    .await
    .context("reading back the files the query wrote")?;
    match op {
        Some(name) => Ok(vec![files::consolidate_op_text(
            &rows,
            &name,
            &plan.output_schema,
        )?]),
        None => Ok(rows),
    }
}
