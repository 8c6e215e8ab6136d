//! `skein bench state`: what durable state costs. Each NEXMark query runs
//! with checkpoints off and on (a local directory, every epoch), in the same
//! process and with the same input; the figures are medians of the runs.

use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use object_store::ObjectStore;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use serde_json::json;
use skein_engine::checkpoint::CheckpointStore;
use skein_engine::context::CheckpointSpec;
use skein_engine::driver::run_local;
use skein_engine::local::LocalRuntime;
use skein_engine::planner::{PlanOptions, plan_query, session};

use crate::bench::median;
use crate::registry::registries;

#[derive(Args, Debug)]
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
}

/// One run: seconds, and bytes written to the checkpoint store.
async fn run_once(query: u32, args: &StateBenchArgs, checkpoint: bool) -> Result<(f64, u64)> {
    let sql = crate::run::nexmark_sql(query, args.events, args.rate, 1)?;
    let regs = registries();
    let ctx = session(&regs.sources, args.group_size);
    let mut options = PlanOptions {
        group_size: args.group_size,
        ..Default::default()
    };
    let plan = plan_query(&ctx, &sql, &options)
        .await
        .with_context(|| format!("planning NEXMark q{query}"))?;
    let runtime = LocalRuntime::new(regs.sources, regs.sinks, Arc::new(InMemory::new()));
    let dir = std::env::temp_dir().join(format!(
        "skein-bench-state-{}-{}",
        std::process::id(),
        plan.query_code
    ));
    let store = if checkpoint {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let fs: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(&dir)?);
        let cs = CheckpointStore::open(fs, object_store::path::Path::from(""), &plan.query_code)
            .await
            .map_err(anyhow::Error::msg)?;
        options.run = cs.manifest().run.clone();
        options.checkpoint = Some(CheckpointSpec { interval: 1 });
        let cs = Arc::new(cs);
        runtime.set_checkpoints(Some(cs.clone()));
        Some(cs)
    } else {
        None
    };
    let report = run_local(&plan, &runtime, &options, args.epochs, |_, _| {})
        .await
        .with_context(|| format!("running NEXMark q{query}"))?;
    let written = store.as_ref().map_or(0, |s| s.bytes_written());
    let _ = std::fs::remove_dir_all(&dir);
    Ok((report.elapsed_s, written))
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
    for &query in &args.queries {
        let (mut off, mut on, mut bytes) = (vec![], vec![], 0);
        // Alternate the settings so drift on a noisy machine hits both.
        for _ in 0..args.repeat {
            off.push(run_once(query, &args, false).await?.0);
            let (s, b) = run_once(query, &args, true).await?;
            on.push(s);
            bytes = b;
        }
        let (off, on) = (median(off), median(on));
        let events = args.events as f64;
        rows.push(json!({
            "query": query,
            "events_per_s_off": (events / off).round(),
            "events_per_s_on": (events / on).round(),
            "cost_ratio": on / off,
            "checkpoint_bytes_per_epoch": bytes / args.epochs,
        }));
    }
    let report = json!({
        "events": args.events, "rate": args.rate, "epochs": args.epochs,
        "group_size": args.group_size, "repeat": args.repeat,
        "peak_rss_mb": peak_rss_mb(), "queries": rows,
    });
    if args.json {
        println!("{report}");
        return Ok(());
    }
    println!(
        "{} events at {}/s of event time, {} epochs, group size {}, median of {}",
        args.events, args.rate, args.epochs, args.group_size, args.repeat
    );
    println!("query  events/s off  events/s on  on/off time  checkpoint bytes/epoch");
    for r in &rows {
        println!(
            "q{:<5} {:>12} {:>12} {:>11.2}x {:>22}",
            r["query"],
            r["events_per_s_off"],
            r["events_per_s_on"],
            r["cost_ratio"].as_f64().unwrap_or_default(),
            r["checkpoint_bytes_per_epoch"]
        );
    }
    if let Some(mb) = report["peak_rss_mb"].as_f64() {
        println!("peak RSS of the whole process: {mb:.0} MB");
    }
    Ok(())
}
