//! `skein cost ... --peak N [--peak-hours H]`: a day at --rate with a peak
//! of N times it for H hours, priced under a fixed group and an elastic
//! one. Each part of the day is measured in-process at its own rate and
//! group size: the trough at the fixed group's size and at the size its
//! own work needs, and the peak.

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail};
use serde_json::json;
use skein_cost::{DayCost, LoadCurve, PricedPart, estimate, price_day};

use super::report::dollars;
use super::sweep::LocalRun;
use super::{BUSY_SHARE, CostArgs, measure_local, members_for};
use crate::lambda::Backend;

/// Measure and print the day.
pub(super) async fn cost_day(sql: &str, name: &str, args: &CostArgs, peak: f64) -> Result<()> {
    if args.lambda.backend == Backend::Lambda {
        bail!("--peak prices a day from in-process runs; it does not take --backend lambda");
    }
    let curve = LoadCurve::new(args.rate, peak, args.peak_hours).context("the load curve")?;
    let k = args.checkpoint_interval();
    let rate = |at_peak: bool| if at_peak { curve.peak_rate() } else { curve.trough_rate };

    // One run per (part of the day, group size), each measured once: the
    // probes at one member say what each part's work needs.
    let mut runs: BTreeMap<(bool, usize), LocalRun> = BTreeMap::new();
    for at_peak in [false, true] {
        runs.insert((at_peak, 1), measure(sql, name, args, rate(at_peak), 1, k).await?);
    }
    let needs = |at_peak: bool| members_for(runs[&(at_peak, 1)].busy_ms_per_epoch(), args.interval);
    // The fixed group is what a deployment for the peak has all day:
    // --group-size when given, else the size the peak's work needs. The
    // elastic one has, in each part, the size that part's work needs.
    let fixed = args.plan.group_size.unwrap_or(needs(true));
    let wanted = [(false, fixed), (true, fixed), (false, needs(false)), (true, needs(true))];
    for (at_peak, size) in wanted {
        if !runs.contains_key(&(at_peak, size)) {
            let run = measure(sql, name, args, rate(at_peak), size, k).await?;
            runs.insert((at_peak, size), run);
        }
    }

    let prices = args.model.prices()?;
    let mut costs = vec![];
    for (at_peak, size) in wanted {
        let m = runs[&(at_peak, size)].steady(k);
        if m.events == 0 {
            bail!("{name}: the measured run read no events, so there is nothing to price");
        }
        costs.push((estimate(&m, &prices, &args.model.options(Some(rate(at_peak)))), size));
    }
    let part = |i: usize| PricedPart {
        cost: &costs[i].0,
        group_size: costs[i].1,
    };
    let day = price_day(curve, (part(0), part(1)), (part(2), part(3)));
    if args.json {
        let mut v = json!(day);
        v["query"] = json!(name);
        v["prices"] = json!(prices.date);
        v["interval_s"] = json!(args.interval.as_secs_f64());
        v["checkpoint_interval"] = json!(k);
        v["busy_share"] = json!(BUSY_SHARE);
        v["lambda"] = json!("arm64, checkpoints on S3 Standard");
        println!("{v}");
    } else {
        print!("{}", table(name, &day, &prices.date));
    }
    Ok(())
}

/// `sql` at `rate` with `group_size` members per group.
async fn measure(
    sql: &str,
    name: &str,
    args: &CostArgs,
    rate: f64,
    group_size: usize,
    k: u64,
) -> Result<LocalRun> {
    tracing::info!("skein cost --peak: measuring {rate} events/s at {group_size} members per group");
    let mut at = args.clone();
    at.rate = rate;
    at.plan.group_size = Some(group_size);
    measure_local(sql, name, &at, at.interval, at.seconds, k)
        .await
        .with_context(|| format!("measuring {rate} events/s at {group_size} members per group"))
}

fn table(name: &str, day: &DayCost, prices: &str) -> String {
    let c = &day.curve;
    let mut out = format!(
        "{name}: a day at {} events/s with {} h at {}× it ({} events/s); Lambda arm64, \
         checkpoints on S3 Standard (us-east-1 prices of {prices})\n",
        c.trough_rate.round(),
        trim(c.peak_hours),
        trim(c.peak),
        c.peak_rate().round(),
    );
    out.push_str(&format!(
        "{:<9} {:>14} {:>12} {:>14} {:>12} {:>12} {:>12}\n",
        "group", "members", "rescales", "$/h trough", "$/h peak", "$/day", "$/M events"
    ));
    for (what, p) in [("fixed", &day.fixed), ("elastic", &day.elastic)] {
        out.push_str(&format!(
            "{what:<9} {:>14} {:>12} {:>14} {:>12} {:>12} {:>12}\n",
            format!("{} / {}", p.trough_group_size, p.peak_group_size),
            p.rescales_per_day,
            dollars(p.trough_usd_per_hour),
            dollars(p.peak_usd_per_hour),
            dollars(p.usd_per_day),
            dollars(p.usd_per_million_events),
        ));
    }
    out.push_str(&format!(
        "elastic / fixed: {:.3}×; Managed Flink sized for the peak all day: ${} a day\n\
         (fixed: the deployment's size all day; elastic: each part at the size its work \
         needs, a figure only: a deployed query keeps its group size, docs/cost.md)\n",
        day.elastic_over_fixed,
        dollars(day.flink_usd_per_day)
    ));
    out
}

fn trim(x: f64) -> String {
    let s = format!("{x:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}
