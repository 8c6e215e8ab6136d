//! `skein bench rescale`: what an epoch costs that changes a group's size.
//! An updating aggregate keyed by (auction, bidder), about one key per
//! NEXMark bid, runs in-process with a checkpoint every epoch; one run
//! rescales its group after epoch `--at`, a baseline on the same input
//! does not. The figure is the time of the two epochs the rescale spans
//! (the commit it follows carries out the deploy; the next restores each
//! new member's key groups from the old members' states) against the same
//! two epochs of the baseline, medians of `--repeat` runs.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use object_store::memory::InMemory;
use serde_json::json;
use skein_engine::checkpoint::{CheckpointStore, Layout, RescaleRequest};
use skein_engine::driver::run_local;
use skein_engine::local::LocalRuntime;
use skein_engine::planner::{PlanOptions, QueryPlan, plan_query, session};

use super::measure::median;
use crate::registry::registries;

#[derive(Args, Debug, Clone)]
pub struct RescaleBenchArgs {
    /// Events of the NEXMark stream (about 92% are bids, each about one key).
    #[arg(long, default_value_t = 2_400_000, value_parser = clap::value_parser!(u64).range(1..))]
    events: u64,
    /// Epochs the events are split into; each is committed.
    #[arg(long, default_value_t = 24, value_parser = clap::value_parser!(u64).range(4..))]
    epochs: u64,
    /// The epoch after whose commit the group is asked to change size.
    #[arg(long, default_value_t = 11)]
    at: u64,
    /// The group's size before.
    #[arg(long, default_value_t = 4, value_parser = crate::positive)]
    from: usize,
    /// Its size after.
    #[arg(long, default_value_t = 2, value_parser = crate::positive)]
    to: usize,
    /// Runs of each kind (the median is reported).
    #[arg(long, default_value_t = 3, value_parser = crate::positive)]
    repeat: usize,
    #[arg(long)]
    json: bool,
}

const QUERY: &str = "SELECT auction, bidder, count(*) AS n, max(price) AS top FROM bid \
                     GROUP BY auction, bidder;";

/// The query planned onto a fresh runtime, checkpointing every epoch into
/// a scratch directory.
async fn setup(args: &RescaleBenchArgs, dir: &std::path::Path) -> Result<Setup> {
    let tables = skein_generators::table::nexmark_ddl(args.events, 10_000_000, 1);
    let sql = format!("{tables}\n{QUERY}");
    let mut regs = registries();
    regs.catalog.register_sink(
        skein_engine::sink::COLLECT_KIND,
        Arc::new(skein_sinks::blackhole::BlackholeSinkFactory::default()),
    );
    // Key groups for the larger of the two sizes; the run starts at --from.
    let groups = args.from.max(args.to);
    let ctx = session(&regs.catalog, groups);
    let mut options = PlanOptions {
        group_size: groups,
        ..Default::default()
    };
    let planned = plan_query(&ctx, &sql, &options)
        .await
        .context("planning the benchmark's query")?;
    let stage = *planned
        .layout()
        .keys()
        .next_back()
        .context("the query has no function group")?;
    let plan = planned.with_layout(&Layout::from([(stage, args.from as u32)]))?;
    let runtime = LocalRuntime::new(regs.catalog, Arc::new(InMemory::new()));
    let _ = std::fs::remove_dir_all(dir);
    let store = crate::run::checkpoint_dir::scratch(dir, &plan, &runtime, &mut options, 1).await?;
    Ok(Setup {
        plan,
        stage,
        runtime,
        options,
        store,
    })
}

struct Setup {
    plan: QueryPlan,
    /// The group that changes size.
    stage: u32,
    runtime: Arc<LocalRuntime>,
    options: PlanOptions,
    store: Arc<CheckpointStore>,
}

/// One run: the seconds of each epoch, and whether it rescaled.
async fn run_once(args: &RescaleBenchArgs, rescale: bool) -> Result<Vec<f64>> {
    let dir = std::env::temp_dir().join(format!(
        "skein-bench-rescale-{}-{}",
        std::process::id(),
        if rescale { "rescaled" } else { "baseline" }
    ));
    let s = setup(args, &dir).await?;
    let stage = s.stage;
    s.plan.check_rescale(stage, args.to as u32)?;
    let mut times = vec![Instant::now()];
    let store = s.store.clone();
    let mut asked: Option<Result<()>> = None;
    run_local(&s.plan, &s.runtime, &s.options, args.epochs, |epoch, _| {
        times.push(Instant::now());
        if rescale && epoch == args.at {
            let ask = RescaleRequest {
                stage,
                members: args.to as u32,
            };
            // A local directory's request is a plain file: no await pends.
            asked = Some(futures::executor::block_on(store.ask_rescale(ask)).map_err(Into::into));
        }
    })
    .await
    .context("running the benchmark's query")?;
    if let Some(Err(e)) = asked {
        return Err(e.context("asking for the rescale"));
    }
    let layout = s.store.committed_in().await?.map(|(_, l)| l);
    let _ = std::fs::remove_dir_all(&dir);
    let size = layout.and_then(|l| l.get(&stage).copied());
    let want = if rescale { args.to } else { args.from } as u32;
    if size != Some(want) {
        bail!("the run ended at {size:?} members, not {want}");
    }
    Ok(times.windows(2).map(|w| (w[1] - w[0]).as_secs_f64()).collect())
}

pub async fn rescale(args: RescaleBenchArgs) -> Result<()> {
    if args.to == args.from || args.at + 3 > args.epochs {
        bail!(
            "--to {} must differ from --from {}, and --at {} be at least 3 epochs before the \
             end ({} epochs)",
            args.to,
            args.from,
            args.at,
            args.epochs
        );
    }
    // Epoch index `at` ends with the request; `at + 1` with its commit and
    // the deploy; `at + 2` restores the new members.
    let span = |epochs: &[f64]| -> f64 {
        let i = args.at as usize + 1;
        epochs.get(i..=i + 1).map_or(f64::NAN, |s| s.iter().sum())
    };
    let (mut base, mut moved, mut typical) = (vec![], vec![], vec![]);
    for _ in 0..args.repeat {
        let b = run_once(&args, false).await?;
        let r = run_once(&args, true).await?;
        base.push(span(&b));
        moved.push(span(&r));
        typical.push(median(b.clone()));
    }
    let bids_before = args.events * (args.at + 1) / args.epochs * 46 / 50;
    let (b, r) = (median(base), median(moved));
    if args.json {
        println!(
            "{}",
            json!({"events": args.events, "epochs": args.epochs, "at": args.at,
                   "from": args.from, "to": args.to, "bids_before": bids_before,
                   "baseline_two_epochs_s": b, "rescaled_two_epochs_s": r,
                   "ratio": r / b, "baseline_epoch_median_s": median(typical)})
        );
    } else {
        println!(
            "rescale {} -> {} members after epoch {} of {} ({} events; state of about {} \
             keys, one per bid)",
            args.from, args.to, args.at, args.epochs, args.events, bids_before
        );
        println!("  two epochs, baseline   {b:>8.3} s (median of {})", args.repeat);
        println!("  two epochs, rescaling  {r:>8.3} s ({:.2}x)", r / b);
        println!("  one epoch, baseline    {:>8.3} s", median(typical));
    }
    Ok(())
}
