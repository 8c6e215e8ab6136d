//! `ysb bench`: the drain throughput against a raw rdkafka drain
//! (`--events`), or YSB's window latency under a steady load (`--rate`).
//! The steps run here, in one process (the publisher is `skein gen`'s, the
//! query `ysb run`'s); what is measured and how is `skein_ysb`'s.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::json;
use skein_sinks::kafka::ensure_topic;
use skein_engine::epochs::default_checkpoint_interval;
use skein_ysb::bench::{LatencyBench, fresh_topic, load_avg, raw_drain};
use skein_ysb::check::{check_report, check_windows};
use skein_ysb::latency::latencies;
use skein_ysb::{default_dead_letter_topic, now_ms};

use super::run::{RunOutcome, run_query};
use super::setup::{generate, setup};
use super::{BenchArgs, GenerateArgs, LoadEnd, YsbArgs, YsbRunArgs};

pub(super) async fn bench(a: BenchArgs) -> Result<()> {
    match (a.rate, a.duration) {
        (Some(rate), Some(duration)) => latency_bench(&a, rate, duration).await,
        _ => drain_bench(&a, a.events.unwrap_or(5_000_000)).await,
    }
}

/// A bench's arguments on a fresh topic unless one is named (so it reads
/// exactly the events of this run), and the same, quiet, for the steps.
fn bench_topic(a: &BenchArgs) -> (YsbArgs, YsbArgs) {
    let mut common = a.common.clone();
    if common.topic == "ad-events" {
        common.topic = fresh_topic();
        // A fresh topic's checkpoints are of no use after the bench.
        common.checkpoint_dir.get_or_insert_with(|| {
            std::env::temp_dir().join(format!("skein-{}-checkpoints", common.topic))
        });
    }
    let quiet = YsbArgs {
        quiet: true,
        ..common.clone()
    };
    (common, quiet)
}

/// `ysb run` as a bench runs it: until drained, or with `load`, as a
/// standing query stopped once it has read the whole load.
fn run_args(
    a: &BenchArgs,
    quiet: &YsbArgs,
    interval: Duration,
    load: Option<Arc<LoadEnd>>,
) -> YsbRunArgs {
    let checkpoint_every = a.checkpoint_every.unwrap_or(if load.is_some() {
        default_checkpoint_interval(true, interval)
    } else {
        1
    });
    YsbRunArgs {
        common: quiet.clone(),
        until_drained: load.is_none(),
        duration: None,
        interval,
        parallelism: a.parallelism,
        max_records: 250_000,
        group_size: a.group_size,
        checkpoint_every,
        dead_letter_topic: None,
        metrics: a.metrics,
        load,
    }
}

/// YSB as YSB measures it: a load at a fixed rate, the query running beside
/// it, and the latency of every window from Redis afterwards.
async fn latency_bench(a: &BenchArgs, rate: u64, duration: Duration) -> Result<()> {
    let (common, quiet) = bench_topic(a);
    setup(&quiet).await?;
    ensure_topic(&common.brokers, &common.topic, 4, &[])
        .await
        .context("creating the bench's topic")?;
    let load_end = Arc::new(LoadEnd::default());
    let gen_args = crate::r#gen::GenArgs {
        benchmark: crate::r#gen::Benchmark::Ysb,
        to: format!("kafka://{}/{}", common.brokers, common.topic),
        events: None,
        rate: Some(rate),
        event_rate: None,
        duration: Some(duration),
        table: crate::r#gen::NexmarkTable::All,
        seed: common.seed,
        partitions: 4,
        in_flight: 4,
        format: "json".into(),
        options: vec![],
        json: common.json,
    };
    let ended = load_end.clone();
    // The publisher of `skein gen ysb`, beside the query in this process.
    let load = tokio::spawn(async move {
        let report = crate::r#gen::publish(&gen_args).await;
        let stopped_ms = now_ms();
        ended.ended(report.as_ref().map_or(0, |r| r.events));
        report.map(|r| (r, stopped_ms, Instant::now()))
    });
    let run = run_query(&run_args(a, &quiet, a.interval, Some(load_end))).await;
    if run.is_err() {
        // Let the load end with the run rather than after it.
        load.abort();
    }
    let RunOutcome {
        report, measured, ..
    } = run?;
    let finished = Instant::now();
    let (published, stopped_ms, stopped) = load.await.context("the load task")??;
    let (check, found) =
        check_windows(&quiet.workload(), &default_dead_letter_topic(&common.topic)).await?;
    let latency = latencies(&found, Some(stopped_ms));
    let line = LatencyBench {
        target_rate: rate,
        duration_s: duration.as_secs_f64(),
        events: published.events,
        achieved_events_per_s: published.events_per_s.round(),
        lag_events: published.lag_events,
        events_read: report.events,
        windows: latency.windows,
        closings: latency.closings,
        latency_ms_p50: latency.p50,
        latency_ms_p90: latency.p90,
        latency_ms_p99: latency.p99,
        latency_ms_max: latency.max,
        exact: check.exact && report.events == published.events,
        drain_after_load_s: finished.saturating_duration_since(stopped).as_secs_f64(),
        epochs: report.epochs,
        load_avg_1m: load_avg(),
        topic: common.topic.clone(),
        cost: crate::cost::report::section(&measured, Some(rate as f64), &Default::default())?,
    };
    if let Some(file) = &a.plot {
        skein_ysb::plot::latency_plot(file, &found, &report, stopped_ms, rate)?;
    }
    if common.json {
        println!("{}", serde_json::to_string(&line)?);
    } else {
        println!(
            "{} events at {:.0}/s (target {rate}/s) over {:.0} s; {} windows ended under load \
             in {} closings{}: latency p50 {} ms, p90 {} ms, p99 {} ms, max {} ms; counts {}",
            line.events,
            line.achieved_events_per_s,
            line.duration_s,
            line.windows,
            line.closings,
            if line.closings < 30 {
                " (under 30: give --duration 300s or more for the tail)"
            } else {
                ""
            },
            line.latency_ms_p50,
            line.latency_ms_p90,
            line.latency_ms_p99,
            line.latency_ms_max,
            if line.exact { "exact" } else { "DIFFERENT" }
        );
        println!("{}", crate::cost::report::one_line(&line.cost));
    }
    if !line.exact {
        bail!("the Skein run's counts differ from the topic recounted");
    }
    Ok(())
}

/// Pre-load a fresh topic, then time a raw rdkafka drain and Skein's drain.
async fn drain_bench(a: &BenchArgs, events: u64) -> Result<()> {
    let (common, quiet) = bench_topic(a);
    eprintln!(
        "setting up and publishing {} events to {}",
        events, common.topic
    );
    setup(&quiet).await?;
    generate(&GenerateArgs {
        common: quiet.clone(),
        events,
        rate: 100_000,
        partitions: 4,
        malformed_percent: 0.0,
    })
    .await?;
    let (brokers, topic) = (common.brokers.clone(), common.topic.clone());
    let (raw_events, raw_s) =
        tokio::task::spawn_blocking(move || raw_drain(&brokers, &topic)).await??;
    let raw_rate = raw_events as f64 / raw_s;
    let RunOutcome { report, .. } =
        run_query(&run_args(a, &quiet, Duration::from_millis(1), None)).await?;
    let check = check_report(&quiet.workload()).await?;
    let skein_rate = report.events_per_s;
    let line = json!({
        "events": events,
        "raw_drain_events_per_s": raw_rate.round(),
        "skein_events_per_s": skein_rate.round(),
        "ratio": (skein_rate / raw_rate * 1000.0).round() / 1000.0,
        "correct": check.exact && report.events == events,
        "skein_elapsed_s": report.elapsed_s,
        "raw_elapsed_s": raw_s,
        "latency_ms_p50": check.latency_ms_p50,
        "latency_ms_p99": check.latency_ms_p99,
        "topic": common.topic,
    });
    if common.json {
        println!("{line}");
    } else {
        println!(
            "{} events: raw rdkafka drain {:.0} events/s, Skein {:.0} events/s (ratio {:.3}); counts {}",
            events,
            raw_rate,
            skein_rate,
            skein_rate / raw_rate,
            if check.exact { "exact" } else { "DIFFERENT" }
        );
    }
    if !check.exact {
        bail!("the Skein run's counts differ from the ground truth");
    }
    Ok(())
}
