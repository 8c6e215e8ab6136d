//! `skein bench ...`: benchmarks as commands that print figures. Each run
//! measures its own baseline; times are medians of repeated runs.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use datafusion::arrow::record_batch::RecordBatch;
use object_store::memory::InMemory;
use serde_json::json;
use skein_engine::driver::run_local;
use skein_engine::local::LocalRuntime;
use skein_engine::payload::{
    Encoding, Payload, PayloadHeader, SYNC_PAYLOAD_LIMIT, encode_payloads, ipc_bytes,
};
use skein_engine::planner::{PlanOptions, plan_query, session};
use skein_generators::nexmark::{EventRef, JsonLayout, NexmarkConfig, NexmarkGenerator};

use crate::measure::{EpochSeries, median, plot_file, throughput};
use crate::registry::registries;

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Payload codec throughput, bytes on the wire per NEXMark bid, source
    /// records decoded per second per format (JSON, Avro, Protobuf), and
    /// invocations/s of the in-process runtime.
    Codec(CodecArgs),
    /// NEXMark queries: events/s per core, generation included (as Flink's
    /// nexmark reports). Pin to one core: `taskset -c 0 skein bench nexmark`.
    Nexmark(NexmarkBenchArgs),
    /// Durable state: NEXMark q5, q7, q8 with checkpoints off and on (cost
    /// ratio, checkpoint bytes per epoch).
    State(crate::bench_state::StateBenchArgs),
    /// Lambda backend: query launch time and per-hop invocation overhead,
    /// or (--exchange) payloads vs S3 between two functions.
    Lambda(crate::lambda::bench::BenchLambdaArgs),
}

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
    #[arg(long)]
    json: bool,
    /// Draw throughput and state bytes per epoch of the first run of each
    /// query to this SVG (FILE-q5.svg, ... with several queries).
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct CodecArgs {
    /// NEXMark events to draw bids from.
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1..))]
    events: u64,
    /// Repetitions per figure (the median is reported).
    #[arg(long, default_value_t = 7, value_parser = crate::positive)]
    repeat: usize,
    /// Epochs of the runtime benchmark (each is one round of invocations).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..))]
    epochs: u64,
    #[arg(long)]
    json: bool,
}

pub async fn bench(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Codec(args) => codec(args).await,
        BenchCommand::Nexmark(args) => nexmark(args).await,
        BenchCommand::Lambda(args) => crate::lambda::bench::bench(args).await,
        BenchCommand::State(args) => crate::bench_state::state(args).await,
    }
}

/// Bids as Arrow batches and as the JSON records a publisher would send.
fn bids(events: u64) -> Result<(Vec<RecordBatch>, usize)> {
    let config = NexmarkConfig {
        max_events: Some(events),
        ..Default::default()
    };
    let mut generator = NexmarkGenerator::new(config.clone())?;
    let mut batches = vec![];
    while let Some(b) = generator.next_batches(8192)? {
        batches.push(b.bid);
    }
    let mut generator = NexmarkGenerator::new(config)?;
    let mut json_bytes = 0;
    let mut buf = Vec::with_capacity(256);
    while let Some(ev) = generator.next_event() {
        if let EventRef::Bid(_) = ev {
            buf.clear();
            ev.write_json(JsonLayout::Flat, &mut buf);
            json_bytes += buf.len() + 1; // newline-delimited
        }
    }
    Ok((batches, json_bytes))
}

async fn codec(args: CodecArgs) -> Result<()> {
    let (batches, json_bytes) = bids(args.events).context("generating bids")?;
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    // A handful of events may hold no bid, and the figures are per bid.
    let schema = match batches.first() {
        Some(b) if rows > 0 => b.schema(),
        _ => anyhow::bail!(
            "--events {}: no bids among them; give more events",
            args.events
        ),
    };
    let raw_ipc = ipc_bytes(&schema, &batches)?.len();
    let header = |encoding| PayloadHeader {
        qid: "bench".into(),
        seq_num: 0,
        seq_len: 1,
        epoch: 0,
        shuffle_id: 1,
        encoding,
        watermark: None,
        idle: false,
        last: false,
        checkpoint: false,
        offsets: vec![],
    };
    let mut encodings = vec![];
    for encoding in [Encoding::Zstd, Encoding::Lz4, Encoding::None] {
        let mut enc_s = vec![];
        let mut dec_s = vec![];
        let mut wire = 0;
        let mut payloads = 0;
        for _ in 0..args.repeat {
            let t = Instant::now();
            let ps = encode_payloads(&header(encoding), &schema, &batches, SYNC_PAYLOAD_LIMIT)?;
            let jsons: Vec<Vec<u8>> = ps.iter().map(Payload::to_json).collect();
            enc_s.push(t.elapsed().as_secs_f64());
            wire = jsons.iter().map(Vec::len).sum::<usize>();
            payloads = jsons.len();
            let t = Instant::now();
            let mut back = 0;
            for j in &jsons {
                let p = Payload::from_json(j)?;
                back += p
                    .decode_batches("bench", &schema)?
                    .iter()
                    .map(|b| b.num_rows())
                    .sum::<usize>();
            }
            dec_s.push(t.elapsed().as_secs_f64());
            anyhow::ensure!(back == rows, "decoded {back} rows of {rows}");
        }
        let mb = raw_ipc as f64 / 1e6;
        encodings.push(json!({
            "encoding": format!("{encoding:?}").to_lowercase(),
            "encode_mb_per_s": (mb / median(enc_s)).round(),
            "decode_mb_per_s": (mb / median(dec_s)).round(),
            "wire_bytes": wire,
            "payloads": payloads,
            "bytes_per_bid": (wire as f64 / rows as f64 * 100.0).round() / 100.0,
        }));
    }
    let records = crate::bench_formats::record_formats(&batches, args.repeat)
        .context("decoding records of each format")?;
    let (invocations_per_s, measured) = runtime_rate(args.epochs).await?;
    let cost = crate::cost::report::section(&measured, None, &Default::default())?;
    let report = json!({
        "bids": rows,
        "json_bytes_per_bid": (json_bytes as f64 / rows as f64 * 100.0).round() / 100.0,
        "arrow_ipc_bytes_per_bid": (raw_ipc as f64 / rows as f64 * 100.0).round() / 100.0,
        "encodings": encodings,
        // Source records decoded into Arrow on one thread, per format.
        "record_formats": records,
        "runtime_invocations_per_s": invocations_per_s.round(),
        // The runtime benchmark's query priced per million events.
        "cost": crate::cost::report::to_json(&cost),
    });
    if args.json {
        println!("{report}");
    } else {
        println!(
            "{rows} NEXMark bids; throughput relative to uncompressed Arrow IPC bytes; medians of {}",
            args.repeat
        );
        println!(
            "{:<8} {:>12} {:>12} {:>14} {:>9}",
            "encoding", "encode MB/s", "decode MB/s", "bytes per bid", "payloads"
        );
        for e in report["encodings"].as_array().expect("array") {
            println!(
                "{:<8} {:>12} {:>12} {:>14} {:>9}",
                e["encoding"].as_str().unwrap_or(""),
                e["encode_mb_per_s"],
                e["decode_mb_per_s"],
                e["bytes_per_bid"],
                e["payloads"]
            );
        }
        println!(
            "baseline: JSON records {} bytes per bid, Arrow IPC uncompressed {} bytes per bid",
            report["json_bytes_per_bid"], report["arrow_ipc_bytes_per_bid"]
        );
        println!(
            "\nsource records decoded into Arrow, one thread, medians of {}",
            args.repeat
        );
        println!(
            "{:<15} {:>14} {:>17} {:>8}",
            "format", "records/s", "bytes per record", "vs JSON"
        );
        for f in report["record_formats"].as_array().expect("array") {
            println!(
                "{:<15} {:>14} {:>17} {:>8}",
                f["format"].as_str().unwrap_or(""),
                f["records_per_s"],
                f["bytes_per_record"],
                f["vs_json"]
            );
        }
        println!(
            "in-process runtime: {} invocations/s",
            report["runtime_invocations_per_s"]
        );
        println!("its query's {}", crate::cost::report::one_line(&cost));
    }
    Ok(())
}

/// Invocations per second of the in-process runtime on a two-stage query
/// with tiny epochs, so per-invocation cost dominates; and what the run
/// measured, for its cost.
async fn runtime_rate(epochs: u64) -> Result<(f64, skein_cost::Measured)> {
    let regs = registries();
    let ctx = session(&regs.catalog, 4);
    let sql = format!(
        "{}\nSELECT auction, count(*) AS n FROM bid GROUP BY auction",
        skein_generators::table::nexmark_ddl(epochs * 100, 10_000, 2)
    );
    let options = PlanOptions {
        group_size: 4,
        ..Default::default()
    };
    let plan = plan_query(&ctx, &sql, &options).await?;
    let runtime = LocalRuntime::new(regs.catalog, Arc::new(InMemory::new()));
    let cpu_before = crate::cost::report::process_cpu_s();
    let report = run_local(&plan, &runtime, &options, epochs, |_, _| {}).await?;
    let measured = crate::cost::report::measured(&report, crate::cost::report::process_cpu_s() - cpu_before);
    Ok((report.invocations as f64 / report.elapsed_s, measured))
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
    let sql = crate::nexmark::nexmark_sql(query, args.events, args.rate, args.sources)?;
    let mut regs = registries();
    // Results are counted and dropped: held, an updating query's changelog
    // would grow the process with every epoch and be what its RSS measures.
    regs.catalog.register_sink(
        skein_engine::sink::COLLECT_KIND,
        Arc::new(skein_sinks::blackhole::BlackholeSinkFactory),
    );
    let ctx = session(&regs.catalog, args.group_size);
    let options = PlanOptions {
        group_size: args.group_size,
        ..Default::default()
    };
    let plan = plan_query(&ctx, &sql, &options)
        .await
        .with_context(|| format!("planning NEXMark q{query}"))?;
    let runtime = LocalRuntime::new(regs.catalog, Arc::new(InMemory::new()));
    let _ = skein_sinks::blackhole::take(&plan.query_code);
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
    let rows = skein_sinks::blackhole::take(&plan.query_code).rows as usize;
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

async fn nexmark(args: NexmarkBenchArgs) -> Result<()> {
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
