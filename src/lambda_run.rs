//! `skein run FILE.sql --backend lambda`: deploy for this run, drive the
//! epochs with the engine's epoch loop (the local driver's), read the
//! results back, optionally verify.
//!
//! A query that checkpoints keeps its state on S3 (by default
//! `<store>/skein/checkpoints/<query-code>`): a second run resumes after the
//! last commit, an instance recycled between epochs loads the last commit,
//! and a failed epoch is run again from it after every instance is replaced.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use async_trait::async_trait;
use datafusion::arrow::record_batch::RecordBatch;
use object_store::ObjectStoreExt;
use skein_connectors::results;
use skein_engine::checkpoint::{CheckpointStore, fresh_run};
use skein_engine::context::CheckpointSpec;
use skein_engine::epochs::Stopped;
use skein_engine::epochs::{EpochLog, run_epochs};
use skein_engine::planner::{PlanOptions, QueryPlan};
use skein_engine::usage::MeteredInvoker;
use skein_engine::verify::{Comparison, compare, single_process};
use skein_lambda::checkpoints::{self, CHECKPOINTS_ENV};
use skein_lambda::deploy::Deployed;
use skein_lambda::epochs::{LambdaEpochs, Redeploy};
use skein_lambda::{LambdaInvoker, ServiceOptions, dead_letter};

use crate::checkpoint_dir::{self, Location};
use crate::lambda_cmd::{
    Connection, LambdaArgs, connect, deploy_stages, object_keys, plan, pushed_sources,
    service_options,
};
use crate::report::{OnLambda, Report};
use crate::run::{CommonRunArgs, read_sql};

/// A query's checkpoint location on Lambda and its store, opened.
pub(crate) struct Checkpoints {
    pub(crate) url: String,
    pub(crate) store: Arc<CheckpointStore>,
}

/// Open the query's checkpoint location when it checkpoints: the same rule
/// as a local run, with S3 for a directory.
pub(crate) async fn open_checkpoints(
    b: &Connection,
    plan: &QueryPlan,
    request: &checkpoint_dir::Request,
    invoke_async: bool,
) -> Result<Option<Checkpoints>> {
    let request = request.clone();
    let url = match checkpoint_dir::location(plan, &request)? {
        Some(Location::Given(dir)) => {
            let url = dir.to_string_lossy().to_string();
            checkpoints::check_url(&url)?;
            let sdk = &b.sdk;
            skein_lambda::store::ensure_bucket(sdk, &url).await?;
            url
        }
        Some(Location::Default) => checkpoints::default_url(&b.store_url, &plan.query_code),
        None => {
            checkpoint_dir::note_if_at_least_once(plan, &request);
            return Ok(None);
        }
    };
    if invoke_async {
        bail!(
            "checkpoints on Lambda need synchronous hops (an epoch is complete when its \
             triggers return); drop --invoke-async, or run with --no-checkpoint"
        );
    }
    let store = checkpoints::open(&url, &plan.query_code).await?;
    tracing::info!(%url, "checkpointing");
    Ok(Some(Checkpoints {
        url,
        store: Arc::new(store),
    }))
}

/// Everything a deployment of this run needs, to deploy it again.
struct Deployment<'a> {
    b: &'a Connection,
    service: ServiceOptions,
    plan: &'a QueryPlan,
    options: PlanOptions,
    epochs: Option<u64>,
    env: BTreeMap<String, String>,
}

impl Deployment<'_> {
    async fn deploy(&self) -> Result<Vec<Deployed>> {
        deploy_stages(
            self.b,
            &self.service,
            self.plan,
            &self.options,
            self.epochs,
            &self.env,
        )
        .await
    }
}

#[async_trait]
impl Redeploy for Deployment<'_> {
    async fn redeploy(&self) -> skein_engine::Result<()> {
        let started = Instant::now();
        self.deploy().await.map_err(|e| {
            skein_engine::EngineError::Context(format!(
                "redeploying: {}",
                skein_engine::error::one_line(e.as_ref())
            ))
        })?;
        tracing::info!(
            secs = started.elapsed().as_secs_f64(),
            "every instance replaced"
        );
        Ok(())
    }
}

/// `skein run FILE.sql --backend lambda`: the report (crate::report) of
/// [`run_sql`], then a failure if any invocation was dead-lettered or the
/// rows were not verified.
pub async fn run(file: &Path, common: &CommonRunArgs, args: &LambdaArgs) -> Result<()> {
    let sql = read_sql(file)?;
    let run = run_sql(&sql, common, args).await?;
    println!("{}", run.report.render(common.json, common.show)?);
    run.failures()
}

/// A query's run on Lambda: its report, and what makes it a failure.
pub(crate) struct LambdaRun {
    pub(crate) report: Report,
    dead_letters: Vec<serde_json::Value>,
    diff: Option<Comparison>,
}

impl LambdaRun {
    /// An error if an invocation was dead-lettered or verification failed.
    pub(crate) fn failures(&self) -> Result<()> {
        if let Some(first) = self.dead_letters.first() {
            bail!(
                "{} async invocations failed every retry and were dead-lettered; first: {}",
                self.dead_letters.len(),
                first["responsePayload"]
            );
        }
        if let Some(cmp) = &self.diff {
            bail!(
                "verification failed: {} rows expected, {} produced; first differences:\n{}",
                cmp.expected_rows,
                cmp.got_rows,
                cmp.differences.join("\n")
            );
        }
        Ok(())
    }
}

/// Deploy `sql`'s functions for this run, drive its epochs on Lambda, read
/// the results back and verify them if asked. The cost section prices what
/// the functions report of every invocation (skein_engine::usage).
pub(crate) async fn run_sql(
    sql: &str,
    common: &CommonRunArgs,
    args: &LambdaArgs,
) -> Result<LambdaRun> {
    let b = connect(&args.store).await?;
    let (plan, ctx) = plan(sql, &common.plan, &b.store_url).await?;
    if !pushed_sources(&plan)?.is_empty() {
        bail!(
            "this query reads a pushed Kinesis table ('mode' 'push'): its event-source mapping \
             runs it; deploy it with `skein deploy --backend lambda` and put records on the stream"
        );
    }
    let collects = plan.sink.kind == results::KIND;
    if common.plan.invoke_async && !collects {
        bail!(
            "--invoke-async on Lambda needs a query without INSERT INTO: the run knows the last \
             async hop has finished when the last stage's results of the last epoch are in the store"
        );
    }
    let stop = common.stop(&plan)?;
    let checkpoints = open_checkpoints(
        &b,
        &plan,
        &common.checkpoint_request(),
        common.plan.invoke_async,
    )
    .await?;
    let mut options = common.plan.options();
    let mut env = BTreeMap::new();
    match &checkpoints {
        Some(c) => {
            options.run = c.store.manifest().run.clone();
            options.checkpoint = Some(CheckpointSpec {
                interval: common.checkpoint_interval(&stop),
            });
            env.insert(CHECKPOINTS_ENV.to_string(), c.url.clone());
        }
        None => options.run = fresh_run(&plan.query_code),
    }
    // One driver at a time on a checkpoint location: this run or a
    // deployed standing query's driver.
    let lease = match &checkpoints {
        Some(c) => Some(take_lease(&c.url, &plan.query_code).await?),
        None => None,
    };
    let log = EpochLog::new(
        checkpoints.as_ref().map(|c| c.store.clone()),
        common.checkpoint_interval(&stop),
    );
    let resuming = log.committed().await?.is_some();

    let deploy_start = Instant::now();
    let deployment = Deployment {
        b: &b,
        service: service_options(&b, args, &plan).await?,
        plan: &plan,
        options,
        epochs: stop.bounded(),
        env,
    };
    let deployed = deployment.deploy().await?;
    let deploy_s = deploy_start.elapsed().as_secs_f64();
    // A resumed run keeps the results of the epochs before its commit.
    if collects && !resuming {
        results::clear(&plan.sink.location, &plan.query_code).await?;
    }
    for stale in object_keys(
        &b.store,
        &format!("{}/{}", dead_letter::PREFIX, plan.query_code),
    )
    .await?
    {
        b.store.delete(&stale).await?;
    }

    let lambda_invoker = LambdaInvoker::new(&b.sdk);
    let invoker = MeteredInvoker::new(&lambda_invoker);
    let redeploy = checkpoints
        .is_some()
        .then_some(&deployment as &dyn Redeploy);
    let lambda = LambdaEpochs::new(&plan, &invoker, b.store.clone(), redeploy).metered(&invoker);
    let start = Instant::now();
    let epochs_run = run_epochs(&lambda, &log, stop, |_, _| {}).await;
    // Given back only after a clean run: after a failure it expires, and
    // whoever takes it next replaces every instance first.
    if let Some(kept) = lease {
        match (kept.finish().await, &epochs_run) {
            (Some(lease), Ok(_)) => {
                lease.release().await?;
            }
            (None, _) => tracing::error!("this run lost its lease to another driver"),
            (Some(_), Err(_)) => {}
        }
    }
    let epochs_run = epochs_run.context("running the query on Lambda")?;
    if common.plan.invoke_async {
        // The triggers returned once the sources had handed their payloads
        // to Lambda; the rest of the DAG runs on its own.
        wait_for_last_epoch(
            &b,
            &plan,
            epochs_run.epochs.saturating_sub(1),
            Duration::from_secs(args.timeout.max(1) as u64),
        )
        .await?;
    } else {
        // A member that lost its instance without checkpoints waits for
        // input that never comes: fail rather than miss its rows.
        let pending = lambda.pending().await?;
        if !pending.is_empty() {
            bail!(
                "the run ended with functions waiting for input: {}",
                pending.join("; ")
            );
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let events = epochs_run.events;
    let rows: Vec<RecordBatch> = if collects {
        results::read(&plan.sink.location, &plan.query_code).await?
    } else {
        vec![]
    };
    let result_rows: usize = rows.iter().map(|b| b.num_rows()).sum();
    let dead_letters = dead_letter::list(&b.store, &plan.query_code).await?;
    let mut verified = None;
    let mut diff = None;
    if common.verify {
        if !collects {
            bail!(
                "--verify on Lambda needs a query without INSERT INTO (its rows are read back from the store)"
            );
        }
        let expected = single_process(&ctx, &plan)
            .await
            .context("single-process DataFusion run")?;
        let cmp = compare(&expected, &rows, plan.ordered)?;
        verified = Some(cmp.equal);
        if !cmp.equal {
            diff = Some(cmp);
        }
    }
    let usage = invoker.total();
    let driver_puts = checkpoints.as_ref().map_or(0, |c| c.store.puts());
    let mut cost = crate::cost::section(
        &crate::cost::measured_on_lambda(events, &usage, driver_puts),
        None,
        &Default::default(),
    )?;
    cost.measured_on = Some(crate::cost::lambda_note(common.plan.invoke_async));
    let report = Report {
        query: None,
        query_code: plan.query_code.clone(),
        stages: plan.stages.len(),
        functions: deployed.len(),
        invocations: usage.invocations,
        payload_bytes: usage.payload_bytes,
        events,
        events_per_s: Report::rate(events, elapsed).round(),
        result_rows,
        verified,
        epochs: epochs_run.epochs,
        elapsed_s: elapsed,
        late_rows: None,
        late_rows_by_table: None,
        checkpoint_dir: checkpoints.as_ref().map(|c| c.url.clone()),
        resumed_after: epochs_run.resumed.map(|c| c.epoch),
        stopped: Stopped::Bound,
        blackhole: None,
        lambda: Some(OnLambda {
            backend: "lambda",
            deploy_s,
            spilled_contexts: deployed.iter().filter(|d| d.spilled).count(),
            dead_letters: dead_letters.len(),
            recoveries: epochs_run.recoveries,
        }),
        cost,
        rows,
    };
    Ok(LambdaRun {
        report,
        dead_letters,
        diff,
    })
}

/// Wait until every member of the sink stage has written its results of
/// `epoch` (each writes once per epoch, rows or not), failing early when an
/// async invocation has been dead-lettered.
async fn wait_for_last_epoch(
    b: &Connection,
    plan: &QueryPlan,
    epoch: u64,
    timeout: Duration,
) -> Result<()> {
    let members = plan
        .stages
        .iter()
        .find(|s| s.consumer.is_none())
        .context("the plan has no sink stage")?
        .members as usize;
    let (store, prefix) = results::open(&plan.sink.location)?;
    let dir = if prefix.is_empty() {
        plan.query_code.clone()
    } else {
        format!("{prefix}/{}", plan.query_code)
    };
    // The RESULTS sink's key: <dir>/epoch-<epoch:08>-member-<member:04>.arrow.
    let marker = format!("epoch-{epoch:08}-member-");
    let start = Instant::now();
    loop {
        let written = object_keys(&store, &dir)
            .await?
            .iter()
            .filter(|k| k.filename().is_some_and(|f| f.starts_with(&marker)))
            .count();
        if written >= members {
            return Ok(());
        }
        let dead = dead_letter::list(&b.store, &plan.query_code).await?;
        if let Some(first) = dead.first() {
            bail!(
                "{} async invocations failed every retry and were dead-lettered; first: {}",
                dead.len(),
                first["responsePayload"]
            );
        }
        if start.elapsed() > timeout {
            bail!(
                "{written} of {members} members of the last stage wrote epoch {epoch} within {} s \
                 (async hops still running, or lost)",
                timeout.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Take the query's lease on its checkpoint location and keep it renewed.
/// A lease left by a killed run expires within its time to live, so that
/// long is waited; one its holder keeps renewing is a one-line refusal.
async fn take_lease(url: &str, query_code: &str) -> Result<skein_lambda::lease::KeptLease> {
    use skein_lambda::lease::{Lease, now_ms};
    let (store, key) = skein_lambda::standing::lease_location(url)?;
    let holder = format!("skein run (pid {})", std::process::id());
    let mut first_expiry = None;
    loop {
        let current = match Lease::acquire(
            store.clone(),
            key.clone(),
            &holder,
            skein_lambda::standing::LEASE_TTL,
        )
        .await?
        {
            Ok(lease) => return Ok(lease.keep(|| {})),
            Err(current) => current,
        };
        let first = *first_expiry.get_or_insert(current.expires_ms);
        if current.expires_ms > first {
            bail!(
                "query {query_code} is being driven by {} (it keeps its lease in {url}): stop \
                 it first (`skein stop {query_code}` for a deployed standing query)",
                current.holder
            );
        }
        let wait = current.expires_ms.saturating_sub(now_ms()) + 200;
        tracing::warn!(holder = %current.holder, wait_ms = wait, "waiting for the lease to expire");
        tokio::time::sleep(Duration::from_millis(wait)).await;
    }
}
