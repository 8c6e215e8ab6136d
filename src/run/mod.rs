//! `skein run`, `skein explain` and `skein nexmark`, in-process. Where a
//! run keeps its durable state is [`checkpoint_dir`], how a standing query
//! stops on a signal [`standing`], the built-in NEXMark queries [`nexmark`];
//! `skein run --backend lambda` is `lambda/run.rs`.

pub mod checkpoint_dir;
pub mod nexmark;
pub mod standing;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use datafusion::arrow::record_batch::RecordBatch;
use indicatif::{ProgressBar, ProgressStyle};
use object_store::memory::InMemory;
use skein_engine::checkpoint::fresh_run;
use skein_engine::driver::{RunReport, StopAfter, run_local_until};
use skein_engine::epochs::Stopped;
use skein_engine::local::LocalRuntime;
use skein_engine::planner::{plan_query, session};
use skein_engine::query::{Prepared, prepare};
use skein_engine::verify::{Comparison, compare, single_process};

use nexmark::nexmark_sql_to;

use crate::PlanArgs;
use crate::args::read_sql;

// What a caller of `run_report` needs beside it.
pub use crate::args::CommonRunArgs;
pub use nexmark::nexmark_sql;
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

pub async fn explain(file: &Path, plan_args: &PlanArgs, as_json: bool) -> Result<()> {
    let sql = read_sql(file)?;
    explain_sql(&sql, plan_args, as_json)
        .await
        .with_context(|| format!("planning {}", file.display()))
}

async fn explain_sql(sql: &str, plan_args: &PlanArgs, as_json: bool) -> Result<()> {
    let regs = registries();
    let ctx = session(&regs.catalog, plan_args.group_size());
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
    let mut common = args.common;
    if common.name.is_none() {
        common.name = skein_engine::query::declared_name(&sql);
    }
    if common.name.is_none() {
        common.name = args
            .file
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned());
        common.name_from_stem = true;
    }
    let report = run_sql(&sql, &common, None).await?;
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
    let mut regs = registries();
    checkpoint_dir::pin_sources(&mut regs.catalog, sql, &args.checkpoint_request())?;
    let opts = args.options();
    let prepared = prepare(&regs.catalog, sql, &opts)
        .await
        .context("planning the query")?;
    run_prepared(regs, prepared, args, nexmark_query).await
}

/// Run a prepared query (planned from SQL text or built as a DataFrame,
/// `crate::dataframe`) on the in-process runtime of `regs`' catalog; see
/// [`run_report`].
pub(crate) async fn run_prepared(
    regs: Registries,
    prepared: Prepared,
    args: &CommonRunArgs,
    nexmark_query: Option<u32>,
) -> Result<(Report, Option<Comparison>)> {
    let Registries { catalog, collect } = regs;
    let opts = args.options();
    let Prepared { plan, ctx, .. } = prepared;
    let name = args
        .name
        .clone()
        .or_else(|| skein_engine::query::declared_name(&plan.sql));
    if let Some(addr) = args.metrics {
        serve_metrics(addr, &plan.query_code, name.as_deref())?;
    }
    let runtime = LocalRuntime::new(catalog.clone(), Arc::new(InMemory::new()));
    let mut opts = opts;
    let request = args.checkpoint_request();
    let held =
        checkpoint_dir::open(&catalog, &plan, &request, name.clone(), !args.name_from_stem).await?;
    if held.is_none() {
        checkpoint_dir::note_if_at_least_once(&catalog, &plan, &request);
    }
    // A query on a live source without a store says in a file that it
    // runs, so `skein ui` lists it (generated inputs end on their own).
    let live = skein_engine::query::reads_live_source(&catalog, &plan);
    let _registered = match held {
        None if live => Some(checkpoint_dir::register_running(
            &plan,
            name,
            !args.name_from_stem,
        )?),
        _ => None,
    };
    let discards = catalog.sink_capabilities(&plan.sink.kind).discards_rows;
    if discards && args.verify {
        bail!(
            "--verify compares result rows, and a {} table keeps none",
            plan.sink.kind.to_ascii_uppercase()
        );
    }
    if args.verify {
        // Verification reads back what this query wrote: only this run's rows.
        catalog
            .forget_written(&plan.sink, &plan.query_code)
            .await
            .context("forgetting what an earlier run wrote")?;
    }

    // A live source and no bound: a standing query, stopped by a signal.
    let (stop, signal) =
        if args.unbounded() && skein_engine::query::reads_live_source(&catalog, &plan) {
            if args.verify {
                bail!(
                    "--verify compares a whole input with its result: give a standing query a \
                 bound (--epochs, --duration or --until-drained)"
                );
            }
            let (stop, signal) = standing::until_signalled(args.interval(&plan)?)?;
            (stop, Some(signal))
        } else {
            (args.stop(&plan)?, None)
        };
    match &held {
        Some(h) => h.attach(&runtime, &mut opts, args.checkpoint_interval(&stop)),
        None => opts.run = fresh_run(&plan.query_code),
    }
    if let Some(range) = args.autoscale {
        if held.is_none() {
            bail!(
                "--autoscale moves a group's state through the query's checkpoint store, \
                 and this run keeps none: give it --checkpoint-dir (and no --no-checkpoint)"
            );
        }
        opts.autoscale = Some(skein_engine::autoscale::AutoscaleSpec {
            range,
            interval: args.interval(&plan)?,
        });
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
    if args.verify {
        // The reference reads what the run's sources read.
        skein_engine::verify::tap::start(&plan.query_code);
    }
    let cpu_before = crate::cost::report::process_cpu_s();
    let ran = run_local_until(&plan, &runtime, &opts, stop, |epoch, events| {
        bar.set_position(epoch + 1);
        bar.set_message(format!("{events} events"));
    })
    .await;
    if ran.is_err() {
        // A failed run is not verified: what its sources read goes.
        skein_engine::verify::tap::take(&plan.query_code);
    }
    let mut report: RunReport = ran.context("running the query")?;
    bar.finish_and_clear();
    let measured = crate::cost::report::measured(&report, crate::cost::report::process_cpu_s() - cpu_before);
    let cost = crate::cost::report::section(&measured, None, &Default::default())?;
    let signalled = signal.is_some_and(|s| s.is_raised());

    // Rows a sink can read back (files) are read back; collected rows are
    // in memory; other sinks keep theirs.
    let read_back = catalog
        .read_back(&plan.sink, &plan.query_code, &plan.output_schema)
        .await
        .context("reading back the rows the query wrote")?;
    let results: Vec<RecordBatch> = match read_back {
        Some(rows) => rows,
        None => {
            let batches = collect.sink(&plan.query_code).batches();
            skein_engine::query::in_query_order(&plan, batches).await?
        }
    };
    report.result_rows = results.iter().map(|b| b.num_rows()).sum();
    // A sink that keeps no rows says how many it dropped.
    let discarded = catalog.take_sink_summary(&plan.sink, &plan.query_code);
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

/// Serve what the engine measures as Prometheus text at `addr`/metrics,
/// every series labelled with the query's code (`query`) and its name
/// (`query_name`), where it has one.
pub fn serve_metrics(addr: std::net::SocketAddr, code: &str, name: Option<&str>) -> Result<()> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    let mut builder = PrometheusBuilder::new().add_global_label("query", code);
    if let Some(name) = name {
        builder = builder.add_global_label("query_name", name);
    }
    builder
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
