//! `skein bench nexmark`: NEXMark queries on the in-process runtime, events
//! per second per core with generation included (as Flink's nexmark
//! reports), against Flink's per-core figures; times are medians of
//! repeated runs.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use object_store::memory::InMemory;
use serde_json::json;
use skein_engine::driver::run_local;
use skein_engine::local::LocalRuntime;
use skein_engine::planner::{PlanOptions, plan_query, session};

use super::measure::{EpochSeries, median, plot_file, throughput};
use crate::registry::registries;

#[derive(Args, Debug)]
pub struct NexmarkBenchArgs {
    /// Queries to run, e.g. 0,1,2 (default: all of q0..q22).
    #[arg(long, value_delimiter = ',', default_values_t = 0..=22)]
    queries: Vec<u32>,
    /// Events of the NEXMark stream (persons, auctions and bids together).
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    events: u64,
    /// Event-time rate of the generator (events per second of event time).
    /// The default spreads 1 M events over 1,000 s of event time, so 10 s
    /// windows close a hundred times during a run; Flink's nexmark workload
    /// uses 10 M/s, which puts 1 M events in one window.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..))]
    rate: u64,
    /// Epochs (micro-batches) the events are split into.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    epochs: u64,
    /// Generator instances per table.
    #[arg(long, default_value_t = 1, value_parser = crate::positive)]
    sources: usize,
    /// Members of each function group.
    #[arg(long, default_value_t = 2, value_parser = crate::positive)]
    group_size: usize,
    /// Runs per query (the median is reported).
    #[arg(long, default_value_t = 3, value_parser = crate::positive)]
    repeat: usize,
    /// Bytes of an updating aggregate's groups each member keeps in memory
    /// before the cold ones go to local disk, or `unlimited` [default: 16MiB].
    #[arg(long, value_parser = crate::memory_budget)]
    state_memory: Option<crate::MemoryBudget>,
    #[arg(long)]
    json: bool,
    /// Draw throughput and state bytes per epoch of the first run of each
    /// query to this SVG (FILE-q5.svg, ... with several queries).
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
}

/// Flink 2.x nexmark V2 throughput per core, the figures we compare with.
const FLINK_PER_CORE: [(u32, f64); 10] = [
    (0, 380e3),
    (5, 75e3),
    (7, 23e3),
    (12, 195e3),
    // nexmark V2's figures for the queries beyond the original suite.
    (15, 168e3),
    (16, 45e3),
    (17, 161e3),
    (18, 65e3),
    (19, 43e3),
    (20, 18e3),
];

/// One bounded NEXMark run on a fresh in-process runtime: wall time,
/// rows written (an updating query's changelog rows), and what the cost
/// model takes; with `series`, the run's
/// events and state bytes after each epoch.
async fn nexmark_run_seconds(
    query: u32,
    args: &NexmarkBenchArgs,
    series: Option<&mut EpochSeries>,
) -> Result<(f64, usize, skein_cost::Measured)> {
    let sql = crate::run::nexmark_sql(query, args.events, args.rate, args.sources)?;
    let mut regs = registries();
    // Results are counted and dropped: held, an updating query's changelog
    // would grow the process with every epoch and be what its RSS measures.
    regs.catalog.register_sink(
        skein_engine::sink::COLLECT_KIND,
        Arc::new(skein_sinks::blackhole::BlackholeSinkFactory::default()),
    );
    let ctx = session(&regs.catalog, args.group_size);
    let mut options = PlanOptions {
        group_size: args.group_size,
        ..Default::default()
    };
    if let Some(crate::MemoryBudget(budget)) = args.state_memory {
        options.state_memory = budget;
    }
    let plan = plan_query(&ctx, &sql, &options)
        .await
        .with_context(|| format!("planning NEXMark q{query}"))?;
    let runtime = LocalRuntime::new(regs.catalog, Arc::new(InMemory::new()));
    let cpu_before = crate::cost::report::process_cpu_s();
    let started = Instant::now();
    let mut series = series;
    let report = run_local(&plan, &runtime, &options, args.epochs, |_, events| {
        if let Some(series) = series.as_deref_mut() {
            // Between epochs the runtime is idle: no instance is busy.
            let bytes = runtime.state_bytes();
            series.push((started.elapsed().as_secs_f64(), events, bytes));
        }
    })
    .await
    .with_context(|| format!("running NEXMark q{query}"))?;
    // Per event of the whole stream, as the throughput is.
    let measured = skein_cost::Measured {
        events: args.events,
        ..crate::cost::report::measured(&report, crate::cost::report::process_cpu_s() - cpu_before)
    };
    let dropped = runtime.catalog().take_sink_summary(&plan.sink, &plan.query_code);
    let rows = dropped.unwrap_or_default().rows as usize;
    Ok((report.elapsed_s, rows, measured))
}

/// Throughput and state bytes after each epoch of one run, drawn; state
/// only for a query that holds some.
fn plot(file: &Path, query: u32, args: &NexmarkBenchArgs, series: &EpochSeries) -> Result<()> {
    let state: Vec<(f64, f64)> = series.iter().map(|&(t, _, b)| (t, b as f64)).collect();
    let mut drawn = vec![skein_plot::Series {
        name: "events/s, per epoch".into(),
        points: throughput(series),
    }];
    if state.iter().any(|&(_, b)| b > 0.0) {
        drawn.push(skein_plot::Series {
            name: "state bytes held after the epoch".into(),
            points: state,
        });
    }
    let title = format!(
        "NEXMark q{query}, {} events at {}/s of event time, {} epochs, group size {}",
        args.events, args.rate, args.epochs, args.group_size
    );
    skein_plot::write_svg(file, &title, &drawn)?;
    Ok(())
}

pub async fn nexmark(args: NexmarkBenchArgs) -> Result<()> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut rows_out = vec![];
    for &query in &args.queries {
        let mut seconds = vec![];
        let mut result_rows = 0;
        let mut failure = None;
        let mut measured = None;
        let mut series = EpochSeries::new();
        for i in 0..args.repeat.max(1) {
            let drawn = (i == 0 && args.plot.is_some()).then_some(&mut series);
            match nexmark_run_seconds(query, &args, drawn).await {
                Ok((s, rows, m)) => {
                    seconds.push(s);
                    result_rows = rows;
                    measured = Some(m);
                }
                Err(e) => {
                    // One query that cannot run must not hide the others' figures.
                    failure = Some(skein_engine::error::one_line(e.as_ref()));
                    break;
                }
            }
        }
        if let Some(error) = failure {
            rows_out.push(json!({ "query": query, "error": error }));
            continue;
        }
        if let Some(file) = &args.plot {
            let file = plot_file(file, query, args.queries.len());
            plot(&file, query, &args, &series)?;
        }
        let median_s = median(seconds);
        // Like Flink's nexmark: all events of the stream over the time (and
        // cores) taken, whichever of the three tables the query reads.
        let per_core = args.events as f64 / median_s / cores as f64;
        let flink = FLINK_PER_CORE
            .iter()
            .find(|(q, _)| *q == query)
            .map(|(_, f)| *f);
        rows_out.push(json!({
            "query": query,
            "events": args.events,
            "seconds": (median_s * 1000.0).round() / 1000.0,
            "events_per_s_per_core": per_core.round(),
            "result_rows": result_rows,
            "flink_per_core": flink,
            "ratio_to_flink": flink.map(|f| (per_core / f * 100.0).round() / 100.0),
            // The last run priced per million events (docs/cost.md).
            "cost": match &measured {
                Some(m) => crate::cost::report::to_json(&crate::cost::report::section(m, None, &Default::default())?),
                None => serde_json::Value::Null,
            },
        }));
    }
    if args.json {
        println!(
            "{}",
            json!({ "cores": cores, "repeat": args.repeat, "rate": args.rate,
                    "epochs": args.epochs, "group_size": args.group_size, "queries": rows_out })
        );
        return Ok(());
    }
    println!(
        "NEXMark, {} events at {} events/s of event time, {} epochs, group size {}, \
         {} core(s) visible; medians of {} runs",
        args.events, args.rate, args.epochs, args.group_size, cores, args.repeat
    );
    println!(
        "{:<6} {:>9} {:>16} {:>12} {:>16} {:>9}",
        "query", "seconds", "events/s/core", "rows written", "Flink/core", "ratio"
    );
    for r in &rows_out {
        if let Some(error) = r["error"].as_str() {
            let first_line = error.lines().next().unwrap_or("");
            println!(
                "q{:<5} failed: {}",
                r["query"].as_u64().unwrap_or(0),
                first_line.chars().take(160).collect::<String>()
            );
            continue;
        }
        let number = |key: &str| r[key].as_f64().unwrap_or(0.0);
        println!(
            "q{:<5} {:>9.3} {:>16.0} {:>12.0} {:>16} {:>9}",
            r["query"].as_u64().unwrap_or(0),
            number("seconds"),
            number("events_per_s_per_core"),
            number("result_rows"),
            r["flink_per_core"]
                .as_f64()
                .map_or("-".to_string(), |f| format!("{f:.0}")),
            r["ratio_to_flink"]
                .as_f64()
                .map_or("-".to_string(), |f| format!("{f:.2}x")),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn nexmark_plot_draws_throughput_and_state() {
        let file =
            std::env::temp_dir().join(format!("skein-bench-plot-{}.svg", std::process::id()));
        let args = NexmarkBenchArgs {
            queries: vec![5],
            events: 3_000,
            rate: 100,
            epochs: 6,
            sources: 1,
            group_size: 2,
            repeat: 1,
            state_memory: None,
            json: true,
            plot: Some(file.clone()),
        };
        nexmark(args).await.unwrap();
        let svg = std::fs::read_to_string(&file).unwrap();
        std::fs::remove_file(&file).unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("NEXMark q5"), "{svg}");
        assert!(svg.contains("events/s, per epoch"), "{svg}");
        assert!(svg.contains("state bytes held after the epoch"), "{svg}");
        // One line per panel, in the plot's first two colours.
        for colour in ["#1F77B4", "#D62728"] {
            let lines = svg
                .lines()
                .filter(|l| l.starts_with("<polyline") && l.contains(colour))
                .count();
            assert_eq!(lines, 1, "{colour}: {svg}");
        }
    }
}
