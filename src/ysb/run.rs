//! `ysb run`: queries/ysb.sql at the default group size through the engine's
//! checkpointed driver. Exactly once comes from the engine: the offsets log
//! and commits in the topic's checkpoint directory, and the YSB_REDIS sink's
//! epoch marker per (run, member) in each MULTI/EXEC. When a run has drained
//! is YSB's own (`skein_ysb::drained`).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::{Context, Result};
use object_store::memory::InMemory;
use serde_json::json;
use skein_engine::driver::{RunReport, StopAfter, run_local_drained_by};
use skein_engine::epochs::stop_signal;
use skein_engine::local::LocalRuntime;
use skein_engine::lookup::LOOKUP_MISSES_SET_ASIDE as UNKNOWN_AD_VIEWS;
use skein_engine::planner::PlanOptions;
use skein_engine::query::prepare;
use skein_ysb::default_dead_letter_topic;
use skein_ysb::drained::DrainedTest;
use skein_ysb::query::{
    QueryParams, announce_run, committed_topic_offsets, create_dead_letter_topic, ysb_sql,
};

use super::YsbRunArgs;
use crate::registry::{Registries, registries};

pub(super) async fn run(a: &YsbRunArgs) -> Result<()> {
    let RunOutcome {
        report,
        dead_letters: dead,
        unknown_ad_views,
        resumed,
        measured,
    } = run_query(a).await?;
    let cost = crate::cost::report::section(&measured, None, &Default::default())?;
    if a.common.json {
        println!(
            "{}",
            json!({
                "events": report.events,
                "dead_letters": dead,
                "unknown_ad_views": unknown_ad_views,
                "epochs": report.epochs,
                "elapsed_s": report.elapsed_s,
                "events_per_s": report.events_per_s.round(),
                "invocations": report.invocations,
                "payload_bytes": report.payload_bytes,
                "resumed_from": resumed,
                "resumed_after": report.resumed_after,
                "functions": report.functions,
                "cost": crate::cost::report::to_json(&cost),
            })
        );
    } else {
        println!(
            "{} records read ({} dead letters, {} views of ads without a campaign) in {} epochs, {:.2} s, {:.0} records/s; resumed at {resumed} records",
            report.events,
            dead,
            unknown_ad_views,
            report.epochs,
            report.elapsed_s,
            report.events_per_s
        );
        println!("{}", crate::cost::report::one_line(&cost));
    }
    Ok(())
}

/// What one `ysb run` did.
pub(super) struct RunOutcome {
    pub report: RunReport,
    /// Undecodable records sent to the dead-letter topic.
    pub dead_letters: u64,
    /// Views of ads without a campaign (sent to the dead-letter topic).
    pub unknown_ad_views: u64,
    /// Records already committed when the run started.
    pub resumed: i64,
    /// What the cost model takes from the run (CPU time includes a load
    /// published from the same process).
    pub measured: skein_cost::Measured,
}

/// Run the query until drained (or `--duration`), from the topic's
/// checkpoint directory.
pub(super) async fn run_query(a: &YsbRunArgs) -> Result<RunOutcome> {
    let c = &a.common;
    let params = QueryParams {
        parallelism: a.parallelism,
        max_records: a.max_records,
        dead_letter_topic: a
            .dead_letter_topic
            .clone()
            .unwrap_or_else(|| default_dead_letter_topic(&c.topic)),
    };
    create_dead_letter_topic(&c.brokers, &params.dead_letter_topic).await?;
    let workload = c.workload();
    let sql = ysb_sql(&workload, &params);
    let Registries { catalog, .. } = registries();
    let mut options = PlanOptions {
        group_size: a.group_size,
        ..PlanOptions::default()
    };
    let plan = prepare(&catalog, &sql, &options)
        .await
        .context("planning queries/ysb.sql")?
        .plan;
    if let Some(addr) = a.metrics {
        crate::run::serve_metrics(addr, &plan.query_code, Some("ysb"))?;
    }
    let runtime = LocalRuntime::new(catalog.clone(), Arc::new(InMemory::new()));
    let request = crate::run::checkpoint_dir::Request {
        dir: Some(c.checkpoint_dir()),
        off: false,
    };
    let held = crate::run::checkpoint_dir::open(&catalog, &plan, &request, None, false)
        .await?
        .context("the YSB query cannot checkpoint")?;
    held.attach(&runtime, &mut options, a.checkpoint_every);
    let resumed: i64 = committed_topic_offsets(&plan, &held.store, &c.topic)
        .await?
        .values()
        .sum();
    announce_run(&workload, &plan, &options.run).await?;
    let (handle, signal) = stop_signal();
    let stop = match (&a.load, a.duration) {
        (Some(_), _) => StopAfter::Signalled {
            interval: a.interval,
            signal,
        },
        (None, Some(duration)) => StopAfter::Duration {
            duration,
            interval: a.interval,
        },
        (None, None) => StopAfter::Drained {
            interval: a.interval,
        },
    };
    // The members' tally in the checkpoint store counts dead letters since
    // the query started: this run's are the difference.
    let dead_before = held.store.tally().await?.dead_letters;
    let unknown_before = UNKNOWN_AD_VIEWS.load(Ordering::Relaxed);
    let mut drained = DrainedTest::new(&c.brokers, &c.topic, &plan, held.store.clone());
    // A standing run beside a load stops once it has read all of it.
    let load = a.load.clone();
    let on_epoch = move |_, read: u64| {
        if load.as_ref().is_some_and(|l| l.read_all(read)) {
            handle.stop();
        }
    };
    let cpu_before = crate::cost::report::process_cpu_s();
    let report = run_local_drained_by(
        &plan,
        &runtime,
        &options,
        stop,
        on_epoch,
        Some(&mut drained),
    )
    .await
    .context("running queries/ysb.sql")?;
    let cpu_s = crate::cost::report::process_cpu_s() - cpu_before;
    let dead_letters = held.store.tally().await?.dead_letters - dead_before;
    Ok(RunOutcome {
        measured: crate::cost::report::measured(&report, cpu_s),
        report,
        dead_letters,
        unknown_ad_views: UNKNOWN_AD_VIEWS.load(Ordering::Relaxed) - unknown_before,
        resumed,
    })
}
