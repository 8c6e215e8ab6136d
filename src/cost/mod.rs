//! `skein cost FILE.sql --rate R`: what a standing query would cost,
//! measured on generated input at that rate (in-process, or on Lambda with
//! `--backend lambda`: the epochs run through `skein run --backend
//! lambda`'s path, checkpointed every epoch to a scratch location that is
//! deleted afterwards, as are the functions).
//!
//! The cost section every report carries is [`report`]; the sweep over
//! epoch and checkpoint intervals is `sweep.rs`.

mod day;
pub mod report;
mod sweep;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use object_store::memory::InMemory;
use serde_json::json;
use skein_cost::{CostReport, Measured, estimate};
use skein_engine::driver::run_local;
use skein_engine::local::LocalRuntime;
use skein_engine::planner::{plan_query, session};
use skein_lambda::LambdaFunctionService;

use report::{
    ModelArgs, ONE_VCPU_MB, dollars, lambda_note, measured, positive_rate, process_cpu_s,
    thousands, to_json,
};

use crate::PlanArgs;
use crate::args::CommonRunArgs;
use crate::lambda::{Backend, LambdaArgs};
use crate::registry::registries;

#[derive(Args, Debug, Clone)]
pub struct CostArgs {
    /// A SQL file whose tables are generators (STORED AS NEXMARK or YSB):
    /// their 'events' and 'rate' options are set to what is measured.
    #[arg(required_unless_present = "nexmark")]
    pub file: Option<PathBuf>,
    /// Instead of a file: NEXMark query N over the built-in generator.
    #[arg(long, value_name = "N", conflicts_with = "file")]
    pub nexmark: Option<u32>,
    /// Events per second of the standing query.
    #[arg(long, value_parser = positive_rate)]
    pub rate: f64,
    /// Seconds of event time to measure (one epoch per --interval of it).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..))]
    pub seconds: u64,
    /// The standing query's epoch interval: each measured epoch carries
    /// rate × interval events.
    #[arg(long, value_parser = crate::args::parse_duration, default_value = "1s")]
    pub interval: Duration,
    /// Commit every N epochs, as the standing query would [default: 10 s
    /// of epochs, a standing query's default].
    #[arg(long, value_parser = crate::positive)]
    pub checkpoint_interval: Option<usize>,
    /// Epoch intervals to price the query at too, each measured in a run
    /// of its own at commits every epoch, every 10 s and every 60 s
    /// (in-process only; empty: none).
    #[arg(long, default_value = "1s,2s,5s,10s", value_name = "1s,10s,...")]
    pub sweep_intervals: String,
    /// The input the generator stands for: kafka (source members keep
    /// their offsets log between commits in the consumer group's committed
    /// offsets) or kinesis (one object-store write per source member every
    /// epoch).
    #[arg(long, value_enum, default_value = "kafka")]
    pub input: sweep::Input,
    /// Price a day instead: --rate most of it, and a peak of this many
    /// times --rate for --peak-hours, under a fixed group (sized for the
    /// peak) and an elastic one (sized for each part's load).
    #[arg(long, value_name = "TIMES")]
    pub peak: Option<f64>,
    /// Hours of the day at the peak.
    #[arg(long, default_value_t = 4.0, requires = "peak")]
    pub peak_hours: f64,
    #[command(flatten)]
    pub plan: PlanArgs,
    #[command(flatten)]
    pub model: ModelArgs,
    /// --backend lambda measures on Lambda (the endpoint from the
    /// environment, as `skein run --backend lambda`); --memory is then the
    /// functions' memory as well as the priced one.
    #[command(flatten)]
    pub lambda: LambdaArgs,
    /// One JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

impl CostArgs {
    /// Epochs between commits: --checkpoint-interval, else a standing
    /// query's default at --interval.
    pub fn checkpoint_interval(&self) -> u64 {
        match self.checkpoint_interval {
            Some(n) => n as u64,
            None => skein_engine::epochs::default_checkpoint_interval(true, self.interval),
        }
    }
}

/// The query with every generator table at `rate` for `events` events.
fn at_rate(sql: &str, rate: f64, events: u64) -> String {
    let rate = format!("{}", rate.round() as u64);
    let events = events.to_string();
    let sql = set_option(sql, "events", &events);
    set_option(&sql, "rate", &rate)
}

/// Replace the value of every `'key' 'value'` option pair.
fn set_option(sql: &str, key: &str, value: &str) -> String {
    let needle = format!("'{key}'");
    let mut out = String::with_capacity(sql.len());
    let mut rest = sql;
    while let Some(i) = rest.find(&needle) {
        let after = &rest[i + needle.len()..];
        let trimmed = after.trim_start();
        let gap = after.len() - trimmed.len();
        let value_end = trimmed
            .strip_prefix('\'')
            .and_then(|v| v.find('\''))
            .map(|j| j + 2);
        out.push_str(&rest[..i + needle.len()]);
        match value_end {
            Some(end) if gap > 0 => {
                out.push_str(&after[..gap]);
                out.push_str(&format!("'{value}'"));
                rest = &trimmed[end..];
            }
            _ => rest = after,
        }
    }
    out.push_str(rest);
    out
}

pub async fn cost(mut args: CostArgs) -> Result<()> {
    let (sql, name) = match (&args.file, args.nexmark) {
        (Some(file), _) => (crate::args::read_sql(file)?, file.display().to_string()),
        (None, Some(q)) => (
            crate::run::nexmark_sql(q, 1, 1, 2)?,
            format!("NEXMark q{q}"),
        ),
        (None, None) => bail!("give a SQL file or --nexmark N"),
    };
    let memory = args.lambda.memory.unwrap_or(ONE_VCPU_MB as i32);
    args.lambda.memory = Some(memory);
    args.model.memory = memory as u32;
    let prices = args.model.prices()?;
    if args.interval.is_zero() {
        bail!("--interval must be longer than zero");
    }
    if let Some(peak) = args.peak {
        return day::cost_day(&sql, &name, &args, peak).await;
    }
    let k = args.checkpoint_interval();
    // Without --group-size, the group is sized from the query's work: a
    // probe at one member per group, in-process.
    let mut probe = None;
    let mut sized = None;
    if args.plan.group_size.is_none() {
        args.plan.group_size = Some(1);
        let run = measure_local(&sql, &name, &args, args.interval, args.seconds, k).await?;
        let busy_ms = run.busy_ms_per_epoch();
        let members = members_for(busy_ms, args.interval);
        args.plan.group_size = Some(members);
        sized = Some(GroupSizing { members, busy_ms });
        if members == 1 {
            probe = Some(run);
        }
    }
    if args.lambda.backend == Backend::Lambda {
        let epochs = ((args.seconds as f64 / args.interval.as_secs_f64()).round() as u64).max(1);
        let events = (args.rate * args.seconds as f64).round().max(1.0) as u64;
        let sql = at_rate(&sql, args.rate, events);
        let plan = plan_generated(&sql, &name, &args, events).await?;
        let (m, functions) = measure_on_lambda(&sql, &args, epochs).await?;
        let m = Measured { events, ..m };
        let on = Some(lambda_note(args.plan.invoke_async));
        let shape = (epochs, functions, plan.query_code.as_str());
        return print_cost(&args, &name, m, on, shape, sized, None);
    }
    let run = match probe {
        Some(run) => run,
        None => measure_local(&sql, &name, &args, args.interval, args.seconds, k).await?,
    };
    let model = args.model.options(Some(args.rate));
    let mut sweep = vec![];
    for interval in sweep::intervals(&args.sweep_intervals)? {
        if interval == args.interval {
            sweep.extend(sweep::rows(&run, interval, &prices, &model));
            continue;
        }
        // At least two epochs, each of rate × interval events.
        let seconds = args.seconds.max(2 * interval.as_secs_f64().ceil() as u64);
        let k = skein_engine::epochs::default_checkpoint_interval(true, interval);
        let other = measure_local(&sql, &name, &args, interval, seconds, k).await?;
        sweep.extend(sweep::rows(&other, interval, &prices, &model));
    }
    let shape = (run.epochs, run.functions, run.query_code.as_str());
    print_cost(
        &args,
        &name,
        run.steady(k),
        None,
        shape,
        sized,
        Some((&run, k, sweep)),
    )
}

/// How busy a member may be in an epoch: the share `--autoscale` sizes
/// running groups by, so a priced size is the size a run would take.
pub(super) use skein_engine::autoscale::BUSY_SHARE;

/// A group size chosen from measured work.
#[derive(Debug, Clone, Copy)]
struct GroupSizing {
    members: usize,
    /// Billed milliseconds of all functions per epoch with one member per
    /// group: an upper bound on what any one member does.
    busy_ms: f64,
}

/// Members per group so that none is busy more than [`BUSY_SHARE`] of an
/// epoch, given the whole query's billed time per epoch at one member
/// (sources included, so this errs towards more members). Every member
/// is invoked by every source member each epoch, so a member more than
/// the work needs costs requests for nothing.
pub(super) fn members_for(busy_ms: f64, interval: Duration) -> usize {
    let budget_ms = interval.as_secs_f64() * 1000.0 * BUSY_SHARE;
    ((busy_ms / budget_ms).ceil() as usize).max(1)
}

/// `sql` planned, every table a generator set to `events`.
async fn plan_generated(
    sql: &str,
    name: &str,
    args: &CostArgs,
    events: u64,
) -> Result<skein_engine::planner::QueryPlan> {
    let regs = registries();
    let ctx = session(&regs.catalog, args.plan.group_size());
    let plan = plan_query(&ctx, sql, &args.plan.options())
        .await
        .with_context(|| format!("planning {name}"))?;
    check_generated(&regs.catalog, &plan, &events.to_string())?;
    Ok(plan)
}

/// Print the cost report: one JSON object or tables.
fn print_cost(
    args: &CostArgs,
    name: &str,
    m: Measured,
    measured_on: Option<String>,
    (epochs, functions, query_code): (u64, usize, &str),
    sized: Option<GroupSizing>,
    local: Option<(
        &sweep::LocalRun,
        u64,
        Vec<sweep::SweepRow>,
    )>,
) -> Result<()> {
    if m.events == 0 {
        bail!(
            "{name}: the measured run read no events, so there is nothing to price (are its tables empty?)"
        );
    }
    let prices = args.model.prices()?;
    let mut c = estimate(&m, &prices, &args.model.options(Some(args.rate)));
    c.measured_on = measured_on;
    if args.json {
        let mut v = to_json(&c);
        v["query"] = json!(name);
        v["epochs"] = json!(epochs);
        v["interval_s"] = json!(args.interval.as_secs_f64());
        v["functions"] = json!(functions);
        v["query_code"] = json!(query_code);
        v["group_size"] = json!(args.plan.group_size());
        if let Some(g) = sized {
            v["group_sized_from"] = json!({
                "busy_ms_per_epoch_at_one_member": g.busy_ms,
                "interval_ms": args.interval.as_secs_f64() * 1000.0,
                "busy_share": BUSY_SHARE,
            });
        }
        v["backend"] = json!(match args.lambda.backend {
            Backend::Local => "local",
            Backend::Lambda => "lambda",
        });
        if let Some((run, k, sweep)) = &local {
            v["checkpoint_interval"] = json!(k);
            v["input"] = json!(run.input);
            v["checkpoint_puts_per_epoch"] = json!(run.puts_per_epoch(*k));
            v["checkpoint_puts_in_run"] = json!(run.puts);
            v["sweep"] = json!(sweep);
        }
        println!("{v}");
    } else {
        print!("{}", table(name, &c, epochs, functions));
        match sized {
            Some(g) => println!(
                "group size {}: sized from the work measured at one member per group \
                 ({:.1} billed ms per {:.0} ms epoch; no member busy over {:.0}% of an epoch); \
                 --group-size N prices another",
                g.members,
                g.busy_ms,
                args.interval.as_secs_f64() * 1000.0,
                BUSY_SHARE * 100.0
            ),
            None => println!("group size {} (--group-size)", args.plan.group_size()),
        }
        if let Some((run, k, sweep)) = &local {
            println!(
                "checkpoint writes: {:.2} per epoch at a commit every {k} epochs ({} log entries, \
                 {} states, {} driver objects in the run's {epochs} epochs); {}",
                run.puts_per_epoch(*k),
                run.puts.entries,
                run.puts.states,
                run.puts.driver,
                match run.input {
                    sweep::Input::Kafka => {
                        "priced as Kafka input: log entries between commits ride in Kafka's \
                         committed offsets (--input kinesis: one per source member every epoch)"
                    }
                    sweep::Input::Kinesis => {
                        "priced as Kinesis input: a log entry per source member every epoch"
                    }
                }
            );
            if !sweep.is_empty() {
                print!("{}", sweep::table(sweep));
            }
        }
    }
    Ok(())
}

/// Run the query in-process over `seconds` of generated input at the
/// rate, one epoch per `interval`, committing every `k` epochs to a
/// scratch directory, as a standing query does.
pub(super) async fn measure_local(
    sql: &str,
    name: &str,
    args: &CostArgs,
    interval: Duration,
    seconds: u64,
    k: u64,
) -> Result<sweep::LocalRun> {
    let epochs = ((seconds as f64 / interval.as_secs_f64()).round() as u64).max(1);
    let events = (args.rate * seconds as f64).round().max(1.0) as u64;
    let sql = at_rate(sql, args.rate, events);
    let plan = plan_generated(&sql, name, args, events).await?;
    let mut options = args.plan.options();
    let regs = registries();
    let runtime = LocalRuntime::new(regs.catalog, Arc::new(InMemory::new()));
    let scratch = std::env::temp_dir().join(format!("skein-cost-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    let store = crate::run::checkpoint_dir::scratch(&scratch, &plan, &runtime, &mut options, k).await?;
    let cpu_before = process_cpu_s();
    let report = run_local(&plan, &runtime, &options, epochs, |_, _| {}).await;
    let cpu_s = process_cpu_s() - cpu_before;
    let _ = std::fs::remove_dir_all(&scratch);
    let report = report.context("running the query")?;
    // Per event of the whole stream the rate is of, also where the query
    // reads only part of it (NEXMark q5 reads the bids).
    Ok(sweep::LocalRun {
        measured: Measured {
            events,
            ..measured(&report, cpu_s)
        },
        epochs,
        functions: report.functions,
        checkpoint_interval: k,
        puts: store.put_counts(),
        query_code: plan.query_code.clone(),
        input: args.input,
    })
}

/// Every source a generator (generated epoch by epoch, bounded) with the
/// events set: the measurement must be on the input it was asked for.
fn check_generated(
    catalog: &skein_engine::catalog::Catalog,
    plan: &skein_engine::planner::QueryPlan,
    events: &str,
) -> Result<()> {
    for leaf in plan.stages.iter().flat_map(|s| s.sources.iter()) {
        let generated = catalog.source_capabilities(&leaf.config.kind)
            == skein_engine::source::SourceCapabilities {
                replay: skein_engine::source::ReplayMode::ByEpoch,
                live: false,
            };
        if !generated {
            bail!(
                "skein cost measures a query over generated input, and table {} is {}: \
                 declare it STORED AS NEXMARK or YSB (queries/cost/ysb.sql is YSB's query that way)",
                leaf.table,
                leaf.config.kind.to_ascii_uppercase()
            );
        }
        if leaf.config.option("events") != Some(events) {
            bail!(
                "table {} has no 'events' option for skein cost to set: add \
                 'events' '1' and 'rate' '1' to its OPTIONS",
                leaf.table
            );
        }
    }
    Ok(())
}

fn table(name: &str, c: &CostReport, epochs: u64, functions: usize) -> String {
    let m = &c.measured;
    let rate = c.rate.unwrap_or(0.0);
    let mut out = format!(
        "{name} at {} events/s (us-east-1 prices of {})\n\
         measured {}: {} events in {epochs} epochs, {functions} functions, \
         {} invocations, {} billed ms, {} checkpoint PUTs, {:.2} s CPU\n{}\n",
        thousands(&format!("{}", rate.round() as u64)),
        c.prices,
        match &c.measured_on {
            Some(_) => "on Lambda",
            None => "in-process",
        },
        m.events,
        m.invocations,
        m.billed_ms,
        m.checkpoint_puts,
        m.cpu_s,
        c.measured_on
            .as_ref()
            .map_or(String::new(), |on| format!("({on})\n")),
    );
    out.push_str(&format!(
        "{:<34} {:>14} {:>14}\n",
        "where", "$/M events", "$/month"
    ));
    let row = |what: String, pm: f64, month: Option<f64>| {
        format!(
            "{what:<34} {:>14} {:>14}\n",
            dollars(pm),
            month.map_or("-".into(), dollars)
        )
    };
    for l in &c.lambda {
        out.push_str(&row(
            format!("Lambda {:?} {} MB", l.arch, l.memory_mb)
                .replace("X86_64", "x86_64")
                .replace("Arm64", "arm64"),
            l.usd_per_million_events,
            l.usd_per_month,
        ));
    }
    out.push_str(&row(
        format!("{} × {}", c.vm.unit, c.vm.units.unwrap_or(1)),
        c.vm.usd_per_million_events,
        c.vm.usd_per_month,
    ));
    out.push_str(&row(
        format!(
            "Managed Flink {} KPU ({:.0} ev/s/KPU)",
            c.flink.units.unwrap_or(1),
            c.flink.events_per_vcpu_s
        ),
        c.flink.usd_per_million_events,
        c.flink.usd_per_month,
    ));
    if let Some(shards) = c.kinesis_shards {
        out.push_str(&format!(
            "(each includes the Kinesis input: {shards} shards, ${} per million events)\n",
            dollars(c.kinesis_usd_per_million_events)
        ));
    }
    out
}

/// Run `sql` (generator tables already at the rate) for `epochs` on
/// Lambda: what its functions reported, and how many there were.
async fn measure_on_lambda(sql: &str, args: &CostArgs, epochs: u64) -> Result<(Measured, usize)> {
    let scratch = format!(
        "{}/skein/cost-scratch/{}",
        args.lambda.store.trim_end_matches('/'),
        skein_lambda::deployment::run_id()
    );
    let common = CommonRunArgs {
        epochs: Some(epochs),
        duration: None,
        until_drained: false,
        interval: None,
        plan: args.plan.clone(),
        verify: false,
        metrics: None,
        checkpoint_dir: Some(scratch.clone().into()),
        no_checkpoint: false,
        checkpoint_interval: Some(args.checkpoint_interval() as usize),
        json: true,
        show: 0,
        autoscale: None,
        name: None,
        name_from_stem: false,
    };
    let run = crate::lambda::run::run_sql(sql, &common, &args.lambda).await;
    let cleaned = clean_up(&scratch, &skein_engine::planner::query_code(sql)).await;
    let (report, run) = run?;
    run.failures()?;
    cleaned?;
    Ok((report.cost.measured.clone(), report.functions))
}

/// Delete the scratch checkpoints and the query's functions.
async fn clean_up(scratch: &str, query_code: &str) -> Result<()> {
    let (store, root) = skein_lambda::checkpoints::locate(scratch)?;
    skein_lambda::deploy::delete_under(&store, &root).await?;
    let sdk = skein_lambda::sdk_config().await;
    skein_engine::driver::destroy(query_code, &LambdaFunctionService::new(&sdk, None))
        .await
        .context("deleting the measured query's functions")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_has_the_members_its_work_needs() {
        let second = Duration::from_secs(1);
        assert_eq!(members_for(0.0, second), 1);
        assert_eq!(members_for(120.0, second), 1);
        assert_eq!(members_for(500.0, second), 1);
        assert_eq!(members_for(501.0, second), 2);
        assert_eq!(members_for(3_900.0, second), 8);
        assert_eq!(members_for(3_900.0, Duration::from_secs(10)), 1);
    }

    #[test]
    fn generator_options_are_set() {
        let sql = "CREATE EXTERNAL TABLE bid STORED AS NEXMARK LOCATION 'bid' \
                   OPTIONS ('events' '1000', 'rate'  '10', 'partitions' '2');";
        let out = at_rate(sql, 50_000.0, 1_000_000);
        assert!(out.contains("'events' '1000000'"), "{out}");
        assert!(out.contains("'rate'  '50000'"), "{out}");
        assert!(out.contains("'partitions' '2'"), "{out}");
    }
}
