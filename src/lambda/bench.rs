//! `skein bench lambda`: a query's launch time and the overhead of one hop
//! on Lambda, and the payload-vs-S3 exchange comparison (Flock's Table 2).

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use serde_json::json;
use skein_engine::driver::{StopAfter, destroy as destroy_functions};
use skein_engine::epochs::{EpochLog, run_epochs};
use skein_engine::invoke::{FunctionService, FunctionSpec};
use skein_engine::usage::MeteredInvoker;
use skein_lambda::bench_scope::{BENCH_ENV, BenchScope};
use skein_lambda::deployment::{Deployment, run_id};
use skein_lambda::epoch_runtime::LambdaEpochs;
use skein_lambda::{LambdaFunctionService, LambdaInvoker, RUN_ENV, STORE_ENV, ServiceOptions};

use super::LambdaArgs;
use crate::PlanArgs;

#[derive(Args, Debug)]
pub struct BenchLambdaArgs {
    /// NEXMark query whose launch is timed.
    #[arg(long, default_value_t = 5)]
    pub query: u32,
    /// Members of each function group.
    #[arg(long, default_value_t = 4, value_parser = crate::positive)]
    pub group_size: usize,
    /// Warm invocations to time.
    #[arg(long, default_value_t = 30)]
    pub warm: usize,
    /// Epochs of the query run on the deployed functions (10,000 events),
    /// whose invocations are priced in the report's cost section.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    pub epochs: u64,
    /// Instead of the launch and hop figures: the exchange comparison of the
    /// Flock paper's Table 2, payloads (sync and async) vs S3 between two functions.
    #[arg(long)]
    pub exchange: bool,
    /// Bytes moved by --exchange, one figure per size.
    #[arg(long, value_delimiter = ',', default_values_t = [1_500, 15_000, 150_000, 1_500_000, 15_000_000])]
    pub sizes: Vec<usize>,
    /// Timed repetitions per size and method for --exchange (after one
    /// untimed warm-up); medians are reported.
    #[arg(long, default_value_t = 5)]
    pub repeat: usize,
    /// --exchange: one JSON line per size instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub lambda: LambdaArgs,
}

/// `skein bench lambda`: query launch time (deploy of every function of a
/// NEXMark query, cold = create, warm = re-deploy; code uploaded beforehand,
/// no compilation) and the overhead of one hop (a probe invocation through
/// the Lambda API: the first after a deploy starts an instance, later ones
/// reuse it). Prints one JSON line; leaves nothing deployed.
pub async fn bench(args: BenchLambdaArgs) -> Result<()> {
    if args.exchange {
        return exchange_bench(args).await;
    }
    let sql = crate::run::nexmark_sql(args.query, 10_000, 1_000, 2)?;
    let b = args.lambda.connect().await?;
    let p = PlanArgs {
        group_size: Some(args.group_size),
        encoding: Default::default(),
        invoke_async: false,
        state_ttl: None,
        state_memory: None,
    }
    .options();
    let (plan, _) = b.plan(&sql, &p).await?;
    let lister = LambdaFunctionService::new(&b.sdk, None);
    destroy_functions(&plan.query_code, &lister).await?;
    b.code().await?; // upload once, outside the timings

    let t = Instant::now();
    let deployed = b.deploy_plan(&plan, &p, None).await?;
    let deploy_cold_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    // Sources cut their input into the epochs of the run below.
    b.deploy_plan(&plan, &p, Some(args.epochs)).await?;
    let deploy_warm_s = t.elapsed().as_secs_f64();

    let invoker = LambdaInvoker::new(&b.sdk);
    let target = &deployed.last().context("no functions deployed")?.name;
    let probe = || async {
        let t = Instant::now();
        skein_engine::invoke::invoke_with_retry(
            &invoker,
            target,
            br#"{"probe": true}"#.to_vec(),
            skein_engine::invoke::InvocationType::Sync,
            std::time::Duration::from_millis(200),
            50,
        )
        .await?;
        Ok::<f64, anyhow::Error>(t.elapsed().as_secs_f64() * 1000.0)
    };
    let cold_ms = probe().await?;
    let mut warm = vec![];
    for _ in 0..args.warm.max(1) {
        warm.push(probe().await?);
    }
    warm.sort_by(|a, b| a.total_cmp(b));
    let run = priced_run(&plan, &invoker, &b, args.epochs).await;
    destroy_functions(&plan.query_code, &lister).await?;
    let (events, cost) = run?;
    println!(
        "{}",
        json!({
            "query": args.query,
            "functions": deployed.len() + 1,
            "deploy_cold_s": deploy_cold_s,
            "deploy_warm_s": deploy_warm_s,
            "hop_cold_ms": cold_ms,
            "hop_warm_ms_median": warm[warm.len() / 2],
            "hop_warm_ms_p90": warm[warm.len() * 9 / 10],
            "epochs": args.epochs,
            "events": events,
            "cost": crate::cost::report::to_json(&cost),
        })
    );
    Ok(())
}

/// The query's epochs on its deployed functions, priced from the usage
/// they report: (events, cost section).
async fn priced_run(
    plan: &skein_engine::planner::QueryPlan,
    invoker: &LambdaInvoker,
    b: &Deployment,
    epochs: u64,
) -> Result<(u64, skein_cost::CostReport)> {
    let metered = MeteredInvoker::new(invoker);
    let runtime = LambdaEpochs::new(plan.shape(), &metered, b.store.clone(), None);
    let run = run_epochs(
        &runtime,
        &EpochLog::new(None, 1),
        StopAfter::Epochs(epochs),
        |_, _| {},
    )
    .await
    .context("running the query on Lambda")?;
    let measured = crate::cost::report::measured_on_lambda(run.events, &metered.total(), 0);
    let mut cost = crate::cost::report::section(&measured, None, &Default::default())?;
    cost.measured_on = Some(crate::cost::report::lambda_note(false));
    Ok((run.events, cost))
}

/// Names of the two functions of `skein bench lambda --exchange`.
const EXCHANGE_SENDER: &str = "skein-bench-exchange-send";
const EXCHANGE_RECEIVER: &str = "skein-bench-exchange-recv";

/// `skein bench lambda --exchange`: Flock's Table 2 on our functions. Two
/// functions (the same bootstrap) are deployed; the command asks the sender
/// to move each size to the receiver by each method (see
/// `skein_lambda::exchange` for what is timed, all inside the sender) and
/// reports medians. Methods alternate within each repetition so that a
/// noisy moment hits all three alike. Leaves nothing deployed.
async fn exchange_bench(args: BenchLambdaArgs) -> Result<()> {
    use skein_lambda::exchange::{ExchangeReport, ExchangeRequest, Method};

    let b = args.lambda.connect().await?;
    let (code, code_sha256) = b.code().await?;
    let memory_mb = args.lambda.memory_mb().max(1024);
    let options = ServiceOptions {
        code,
        code_sha256,
        role: args.lambda.role.clone(),
        memory_mb,
        timeout_s: args.lambda.timeout,
        arch: args.lambda.arch.lambda(),
        extra_env: BTreeMap::from([
            (STORE_ENV.to_string(), b.store_url.clone()),
            (RUN_ENV.to_string(), run_id()),
        ]),
        on_failure: None,
        tags: BTreeMap::new(),
    };
    let service = LambdaFunctionService::new(&b.sdk, Some(options));
    // Only these two serve exchange requests: the sender may invoke the
    // receiver, both only touch this run's keys (bench_scope.rs).
    let run = run_id();
    for (name, peers) in [
        (EXCHANGE_SENDER, vec![EXCHANGE_RECEIVER.to_string()]),
        (EXCHANGE_RECEIVER, vec![]),
    ] {
        let scope = BenchScope {
            run: run.clone(),
            peers,
            record_prefix: None,
        };
        service
            .create(FunctionSpec {
                name: name.to_string(),
                environment: BTreeMap::from([(BENCH_ENV.to_string(), scope.to_json())]),
                concurrency: skein_engine::planner::STATELESS_CONCURRENCY,
            })
            .await
            .with_context(|| format!("deploying {name}"))?;
    }
    let invoker = LambdaInvoker::new(&b.sdk);
    let repeat = args.repeat.max(1);
    let total = (args.sizes.len() * Method::ALL.len() * (repeat + 1)) as u64;
    let bar = indicatif::ProgressBar::new(total).with_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} exchanges {msg} [{elapsed}]")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let mut counter = 0u64;
    let result: Result<Vec<serde_json::Value>> = async {
        let mut lines = vec![];
        for &bytes in &args.sizes {
            bar.set_message(format!("{bytes} bytes"));
            let mut times: BTreeMap<&str, Vec<ExchangeReport>> = BTreeMap::new();
            // Repetition 0 warms both functions up for this size; not timed.
            for rep in 0..=repeat {
                for method in Method::ALL {
                    counter += 1;
                    let request = ExchangeRequest::Send {
                        bytes,
                        method,
                        to: EXCHANGE_RECEIVER.to_string(),
                        tag: format!("{run}/{counter}"),
                    };
                    let answer = skein_engine::invoke::invoke_with_retry(
                        &invoker,
                        EXCHANGE_SENDER,
                        request.to_json(),
                        skein_engine::invoke::InvocationType::Sync,
                        std::time::Duration::from_millis(500),
                        50,
                    )
                    .await
                    .with_context(|| format!("{} exchange of {bytes} bytes", method.name()))?;
                    let report: ExchangeReport = serde_json::from_slice(&answer)
                        .context("the sender's answer is not an exchange report")?;
                    tracing::debug!(?report, rep, "exchange");
                    if rep > 0 {
                        times.entry(method.name()).or_default().push(report);
                    }
                    bar.inc(1);
                }
            }
            lines.push(exchange_line(bytes, repeat, &times, memory_mb));
        }
        Ok(lines)
    }
    .await;
    bar.finish_and_clear();
    for name in [EXCHANGE_SENDER, EXCHANGE_RECEIVER] {
        service.delete(name).await?;
    }
    let lines = result?;
    if args.json {
        for l in &lines {
            println!("{l}");
        }
        return Ok(());
    }
    println!("payload vs S3 between two functions, medians of {repeat} (ms); ratio = payload / S3");
    println!(
        "{:>10} {:>9} {:>9} {:>9} {:>12} {:>10} {:>11} {:>9}",
        "bytes", "sync", "async", "s3", "s3 put+get", "sync/s3", "async/s3", "fragments"
    );
    for l in &lines {
        let f = |k: &str| l[k].as_f64().unwrap_or(f64::NAN);
        println!(
            "{:>10} {:>9.1} {:>9.1} {:>9.1} {:>12.1} {:>10.2} {:>11.2} {:>9}",
            l["bytes"].as_u64().unwrap_or(0),
            f("sync_ms"),
            f("async_ms"),
            f("s3_ms"),
            f("s3_put_get_ms"),
            f("ratio_sync_s3"),
            f("ratio_async_s3"),
            format!("{}/{}", l["sync_fragments"], l["async_fragments"]),
        );
    }
    println!(
        "$ per million exchanges, x86_64 (arm64), prices of {}:",
        skein_cost::PRICES_DATE
    );
    for l in &lines {
        let usd = |m: &str, arch: &str| {
            l["cost"][m][format!("usd_per_million_{arch}")]
                .as_f64()
                .map_or("-".to_string(), |x| format!("{x:.2}"))
        };
        println!(
            "{:>10}  sync {} ({})  async {} ({})  s3 {} ({})",
            l["bytes"].as_u64().unwrap_or(0),
            usd("sync", "x86_64"),
            usd("sync", "arm64"),
            usd("async", "x86_64"),
            usd("async", "arm64"),
            usd("s3", "x86_64"),
            usd("s3", "arm64"),
        );
    }
    Ok(())
}

/// One size's figures: medians per method and the payload / S3 ratios.
fn exchange_line(
    bytes: usize,
    repeat: usize,
    times: &BTreeMap<&str, Vec<skein_lambda::exchange::ExchangeReport>>,
    memory_mb: i32,
) -> serde_json::Value {
    let median = |mut xs: Vec<f64>| -> Option<f64> {
        if xs.is_empty() {
            return None;
        }
        xs.sort_by(|a, b| a.total_cmp(b));
        Some(xs[xs.len() / 2])
    };
    let ms = |m: &str| {
        median(
            times
                .get(m)
                .map_or(vec![], |r| r.iter().map(|r| r.ms).collect()),
        )
    };
    let s3_parts = median(times.get("s3").map_or(vec![], |r| {
        r.iter()
            .filter_map(|r| Some(r.put_ms? + r.get_ms?))
            .collect()
    }));
    let first = |m: &str, f: fn(&skein_lambda::exchange::ExchangeReport) -> usize| {
        times.get(m).and_then(|r| r.first()).map(f)
    };
    let round = |x: Option<f64>| x.map(|x| (x * 100.0).round() / 100.0);
    let (sync, asyn, s3) = (ms("sync"), ms("async"), ms("s3"));
    let ratio = |p: Option<f64>| round(p.zip(s3).map(|(p, s)| p / s));
    // Priced per exchange: the call that starts the sender, one request per
    // fragment (or the one passing the key), S3's PUT and GET, and the
    // median time billed on both functions (the receiver's share is taken
    // as the whole exchange: an upper bound).
    let cost = |m: &str, median_ms: Option<f64>| {
        let fragments = first(m, |r| r.fragments)? as u64;
        let objects = u64::from(m == "s3");
        let usage = skein_cost::ExchangeUsage {
            requests: 1 + fragments,
            billed_ms: 2.0 * median_ms?,
            memory_mb: memory_mb.max(0) as u32,
            s3_puts: objects,
            s3_gets: objects,
        };
        Some(skein_cost::exchange_cost(
            &usage,
            &skein_cost::Prices::default(),
        ))
    };
    json!({
        "bytes": bytes,
        "repeat": repeat,
        "cost": {
            "prices": skein_cost::PRICES_DATE,
            "memory_mb": memory_mb,
            "sync": cost("sync", sync),
            "async": cost("async", asyn),
            "s3": cost("s3", s3),
        },
        "sync_ms": round(sync),
        "async_ms": round(asyn),
        "s3_ms": round(s3),
        "s3_put_get_ms": round(s3_parts),
        "ratio_sync_s3": ratio(sync),
        "ratio_async_s3": ratio(asyn),
        "sync_fragments": first("sync", |r| r.fragments),
        "async_fragments": first("async", |r| r.fragments),
        "payload_wire_bytes": first("sync", |r| r.wire_bytes),
        "object_bytes": first("s3", |r| r.wire_bytes),
    })
}
