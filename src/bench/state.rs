//! `skein bench state`: what durable state costs. Each NEXMark query runs
//! with checkpoints off and on (a local directory, every epoch), in the same
//! process and with the same input; the figures are medians of the runs.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use object_store::memory::InMemory;
use serde_json::json;
use skein_engine::checkpoint::CheckpointStore;
use skein_engine::driver::run_local;
use skein_engine::local::LocalRuntime;
use skein_engine::planner::{PlanOptions, QueryPlan, plan_query, session};

use super::measure::{EpochSeries, median, plot_file, throughput};
use crate::registry::registries;

#[derive(Args, Debug, Clone)]
pub struct StateBenchArgs {
    /// Queries to run.
    #[arg(long, value_delimiter = ',', default_values_t = [5, 7, 8])]
    queries: Vec<u32>,
    /// Events of the NEXMark stream.
    #[arg(long, default_value_t = 2_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    events: u64,
    /// Event-time rate of the generator (events per second of event time).
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    rate: u64,
    /// Epochs the events are split into; each is checkpointed.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    epochs: u64,
    /// Members of each function group.
    #[arg(long, default_value_t = 2, value_parser = crate::positive)]
    group_size: usize,
    /// Runs per query and setting (the median is reported).
    #[arg(long, default_value_t = 3, value_parser = crate::positive)]
    repeat: usize,
    #[arg(long)]
    json: bool,
    /// Draw throughput and checkpoint bytes per epoch of one checkpointed
    /// run of each query to this SVG (FILE-q5.svg, ... with several queries).
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// Keep the checkpointed runs' stores under this directory (a fresh
    /// one per run, removed after it) [default: the temporary directory].
    /// What a file system charges for creating and deleting files is part
    /// of the figure.
    #[arg(long, value_name = "DIR")]
    checkpoint_dir: Option<PathBuf>,
}

/// A query planned onto a fresh in-process runtime; with `dir`, it
/// checkpoints there every epoch.
struct Setup {
    plan: QueryPlan,
    runtime: Arc<LocalRuntime>,
    options: PlanOptions,
    store: Option<Arc<CheckpointStore>>,
}

async fn setup(query: u32, args: &StateBenchArgs, dir: Option<&Path>) -> Result<Setup> {
    let sql = crate::run::nexmark_sql(query, args.events, args.rate, 1)?;
    let mut regs = registries();
    regs.catalog.register_sink(
        skein_engine::sink::COLLECT_KIND,
        Arc::new(skein_sinks::blackhole::BlackholeSinkFactory::default()),
    );
    let ctx = session(&regs.catalog, args.group_size);
    let mut options = PlanOptions {
        group_size: args.group_size,
        ..Default::default()
    };
    let plan = plan_query(&ctx, &sql, &options)
        .await
        .with_context(|| format!("planning NEXMark q{query}"))?;
    let runtime = LocalRuntime::new(regs.catalog, Arc::new(InMemory::new()));
    let store = match dir {
        Some(dir) => {
            Some(crate::run::checkpoint_dir::scratch(dir, &plan, &runtime, &mut options, 1).await?)
        }
        None => None,
    };
    Ok(Setup {
        plan,
        runtime,
        options,
        store,
    })
}

fn scratch_dir(args: &StateBenchArgs, query: u32, what: &str) -> PathBuf {
    let parent = args
        .checkpoint_dir
        .clone()
        .unwrap_or_else(std::env::temp_dir);
    let dir = parent.join(format!(
        "skein-bench-state-{}-q{query}-{what}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// One run: seconds, bytes written to the checkpoint store, result rows
/// (counted, not kept), the series, and what the cost model takes.
struct Run {
    seconds: f64,
    written: u64,
    rows: u64,
    series: EpochSeries,
    measured: skein_cost::Measured,
}

async fn run_once(query: u32, args: &StateBenchArgs, checkpoint: bool) -> Result<Run> {
    let dir = checkpoint.then(|| scratch_dir(args, query, "run"));
    let s = setup(query, args, dir.as_deref()).await?;
    let started = std::time::Instant::now();
    let cpu_before = crate::cost::report::process_cpu_s();
    let mut series = vec![];
    let store = s.store.clone();
    let report = run_local(&s.plan, &s.runtime, &s.options, args.epochs, |_, events| {
        let bytes = store.as_ref().map_or(0, |s| s.bytes_written());
        series.push((started.elapsed().as_secs_f64(), events, bytes));
    })
    .await
    .with_context(|| format!("running NEXMark q{query}"))?;
    let written = s.store.as_ref().map_or(0, |s| s.bytes_written());
    let dropped = s.runtime.catalog().take_sink_summary(&s.plan.sink, &s.plan.query_code);
    let rows = dropped.unwrap_or_default().rows;
    if let Some(dir) = dir {
        let _ = std::fs::remove_dir_all(dir);
    }
    // Per event of the whole stream, as the throughput is.
    let measured = skein_cost::Measured {
        events: args.events,
        ..crate::cost::report::measured(&report, crate::cost::report::process_cpu_s() - cpu_before)
    };
    Ok(Run {
        seconds: report.elapsed_s,
        written,
        rows,
        series,
        measured,
    })
}

/// Throughput and checkpoint bytes of each epoch of one run, drawn.
fn plot(file: &Path, query: u32, args: &StateBenchArgs, series: &EpochSeries) -> Result<()> {
    let throughput = throughput(series);
    let mut bytes = vec![];
    let mut last = 0;
    for &(t, _, written) in series {
        bytes.push((t, written.saturating_sub(last) as f64));
        last = written;
    }
    let title = format!(
        "NEXMark q{query}, {} events at {}/s of event time, checkpoint every epoch",
        args.events, args.rate
    );
    skein_plot::write_svg(
        file,
        &title,
        &[
            skein_plot::Series {
                name: "events/s, per epoch".into(),
                points: throughput,
            },
            skein_plot::Series {
                name: "checkpoint bytes written, per epoch".into(),
                points: bytes,
            },
        ],
    )?;
    Ok(())
}

/// Recovery time: a run is killed midway (its own tokio runtime is shut
/// down with every task in it, as a crash would stop them), then a fresh
/// runtime on the same checkpoint directory resumes. Seconds from the
/// resume's start until it has finished its first epoch: deploying,
/// restoring each member's state and re-running the epoch after the commit.
async fn recovery_once(query: u32, args: &StateBenchArgs) -> Result<f64> {
    let dir = scratch_dir(args, query, "recovery");
    let kill_at = args.epochs / 2;
    let (killed_dir, bench) = (dir.clone(), args.clone());
    std::thread::spawn(move || -> Result<()> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let (tx, rx) = std::sync::mpsc::channel();
        rt.block_on(async {
            let s = setup(query, &bench, Some(&killed_dir)).await?;
            tokio::spawn(async move {
                let _ = run_local(&s.plan, &s.runtime, &s.options, bench.epochs, |e, _| {
                    if e >= kill_at {
                        let _ = tx.send(());
                    }
                })
                .await;
            });
            anyhow::Ok(())
        })?;
        let _ = rx.recv();
        // Wait until its worker has stopped: a task in the middle of a poll
        // runs on until it yields, and a crashed process would not. Resuming
        // beside a run that still writes is two writers on one directory,
        // which the engine refuses ("in the offsets log already").
        rt.shutdown_timeout(std::time::Duration::from_secs(60));
        Ok(())
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the killed run panicked"))??;
    let s = setup(query, args, Some(&dir)).await?;
    let started = std::time::Instant::now();
    let mut first = None;
    let report = run_local(&s.plan, &s.runtime, &s.options, args.epochs, |_, _| {
        first.get_or_insert_with(|| started.elapsed().as_secs_f64());
    })
    .await
    .with_context(|| format!("resuming NEXMark q{query}"))?;
    let _ = std::fs::remove_dir_all(&dir);
    if report.resumed_after.is_none() {
        anyhow::bail!("q{query}: the resumed run found no commit to resume after");
    }
    first.ok_or_else(|| anyhow::anyhow!("q{query}: the resumed run ran no epoch"))
}

/// The process's peak resident set (VmHWM), in MB, where Linux says it.
fn peak_rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

pub async fn state(args: StateBenchArgs) -> Result<()> {
    let mut rows = vec![];
    let mut costs = vec![];
    for &query in &args.queries {
        let (mut off, mut on, mut bytes, mut recovery) = (vec![], vec![], 0, vec![]);
        let mut rows_per_setting = None;
        let mut measured = None;
        // Alternate the settings so drift on a noisy machine hits both.
        for i in 0..args.repeat {
            let unsaved = run_once(query, &args, false).await?;
            off.push(unsaved.seconds);
            let run = run_once(query, &args, true).await?;
            on.push(run.seconds);
            // Both settings must give the same result, or a ratio of their
            // times compares different work.
            if unsaved.rows != run.rows {
                anyhow::bail!(
                    "q{query}: {} result rows without checkpoints, {} with",
                    unsaved.rows,
                    run.rows
                );
            }
            rows_per_setting = Some(run.rows);
            bytes = run.written;
            if let (Some(file), 0) = (&args.plot, i) {
                plot(
                    &plot_file(file, query, args.queries.len()),
                    query,
                    &args,
                    &run.series,
                )?;
            }
            measured = Some(run.measured);
            recovery.push(recovery_once(query, &args).await?);
        }
        let (off, on, recovery) = (median(off), median(on), median(recovery));
        let cost = measured
            .map(|m| crate::cost::report::section(&m, None, &Default::default()))
            .transpose()?;
        let events = args.events as f64;
        rows.push(json!({
            "query": query,
            "events_per_s_off": (events / off).round(),
            "events_per_s_on": (events / on).round(),
            "cost_ratio": on / off,
            "checkpoint_bytes_per_epoch": bytes / args.epochs,
            "result_rows": rows_per_setting,
            "recovery_s": recovery,
            // The last checkpointed run priced per million events (docs/cost.md).
            "cost": cost.as_ref().map(crate::cost::report::to_json),
        }));
        costs.extend(cost.map(|c| (query, c)));
    }
    let report = json!({
        "events": args.events, "rate": args.rate, "epochs": args.epochs,
        "group_size": args.group_size, "repeat": args.repeat,
        "peak_rss_mb": peak_rss_mb(), "allocator": crate::ALLOCATOR_NAME, "queries": rows,
    });
    if args.json {
        println!("{report}");
        return Ok(());
    }
    println!(
        "{} events at {}/s of event time, {} epochs, group size {}, median of {}",
        args.events, args.rate, args.epochs, args.group_size, args.repeat
    );
    println!("query  events/s off  events/s on  on/off time  checkpoint bytes/epoch  recovery s");
    for r in &rows {
        println!(
            "q{:<5} {:>12} {:>12} {:>11.2}x {:>22} {:>11.3}",
            r["query"],
            r["events_per_s_off"],
            r["events_per_s_on"],
            r["cost_ratio"].as_f64().unwrap_or_default(),
            r["checkpoint_bytes_per_epoch"],
            r["recovery_s"].as_f64().unwrap_or_default()
        );
    }
    for (query, c) in &costs {
        println!("q{query} checkpointed, {}", crate::cost::report::one_line(c));
    }
    if let Some(mb) = report["peak_rss_mb"].as_f64() {
        println!(
            "peak RSS of the whole process: {mb:.0} MB ({} allocator)",
            crate::ALLOCATOR_NAME
        );
    }
    Ok(())
}
