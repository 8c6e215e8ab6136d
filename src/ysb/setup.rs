//! `ysb setup` and `ysb generate`: `skein_ysb::setup`, printed.

use anyhow::Result;
use serde_json::json;
use skein_ysb::setup::GenerateSpec;

use super::{GenerateArgs, YsbArgs};

/// Campaigns and ads into Redis, and the topic's checkpoint directory
/// removed, so that the next `ysb run` starts afresh.
pub(super) async fn setup(a: &YsbArgs) -> Result<()> {
    let report = skein_ysb::setup::setup(&a.workload()).await?;
    crate::run::checkpoint_dir::remove(&a.checkpoint_dir())?;
    if a.quiet {
        // `bench` prints one line of its own.
    } else if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "{} campaigns, {} ads in Redis; mapping in {}; {} old keys removed",
            report.campaigns,
            report.ads,
            report.mapping.display(),
            report.cleared_keys
        );
    }
    Ok(())
}

/// Events into the topic; the ground truth into `<dir>/truth.csv`.
pub(super) async fn generate(a: &GenerateArgs) -> Result<()> {
    let c = &a.common;
    let spec = GenerateSpec {
        events: a.events,
        rate: a.rate,
        partitions: a.partitions,
        malformed_percent: a.malformed_percent,
    };
    let g = skein_ysb::setup::generate(&c.workload(), &spec).await?;
    let elapsed = g.elapsed_s;
    if c.quiet {
        // `bench` prints one line of its own.
    } else if c.json {
        println!(
            "{}",
            json!({"events": g.events, "malformed": g.malformed, "views": g.views, "elapsed_s": elapsed, "events_per_s": (g.events as f64 / elapsed).round()})
        );
    } else {
        println!(
            "{} events ({} views) and {} malformed records to {} in {elapsed:.2} s; truth in {}",
            g.events,
            g.views,
            g.malformed,
            c.topic,
            c.dir.join("truth.csv").display()
        );
    }
    Ok(())
}
