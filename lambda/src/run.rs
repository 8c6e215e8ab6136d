//! Running a query on Lambda for one run (`skein run --backend lambda`):
//! deploy its functions, drive its epochs with the engine's epoch loop (the
//! local driver's), read the results back and, if asked, compare them with
//! single-process DataFusion.
//!
//! A query that checkpoints keeps its state on S3 (by default
//! `<store>/skein/checkpoints/<query-code>`): a second run resumes after the
//! last commit, an instance recycled between epochs loads the last commit,
//! and a failed epoch is run again from it after every instance is replaced.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use datafusion::arrow::record_batch::RecordBatch;
use object_store::ObjectStoreExt;
use serde_json::Value;
use skein_engine::autoscale::{AutoscaleRange, AutoscaleSpec};
use skein_engine::checkpoint::fresh_run;
use skein_engine::context::CheckpointSpec;
use skein_engine::driver::Deployed;
use skein_engine::epochs::{EpochLog, EpochsRun, run_epochs};
use skein_engine::planner::{PlanOptions, QueryPlan};
use skein_engine::query::{CheckpointRequest, RunBound};
use skein_engine::usage::{MeteredInvoker, Usage};
use skein_engine::verify::{Comparison, compare, single_process};
use skein_sinks::results;

use crate::checkpoints::CHECKPOINTS_ENV;
use crate::deployment::{Deployment, pushed_sources};
use crate::epoch_runtime::{LambdaEpochs, Redeploy};
use crate::error::{LambdaError, Result};
use crate::lease::KeptLease;
use crate::rescale::GroupSizes;
use crate::{LambdaInvoker, ServiceOptions, dead_letter};

/// How one run goes.
#[derive(Debug, Clone)]
pub struct RunRequest {
    /// How the query is planned.
    pub plan: PlanOptions,
    /// When the run stops.
    pub bound: RunBound,
    /// Checkpoints, as asked.
    pub checkpoint: CheckpointRequest,
    /// Epochs between commits (default: the engine's for the bound).
    pub checkpoint_interval: Option<u64>,
    /// Compare the rows with single-process DataFusion.
    pub verify: bool,
    /// `--autoscale`: the sizes the driver keeps each group within.
    pub autoscale: Option<AutoscaleRange>,
}

/// What a run on Lambda did.
pub struct LambdaRun {
    /// The plan it ran.
    pub plan: QueryPlan,
    /// The functions deployed.
    pub deployed: Vec<Deployed>,
    /// How long deploying took, s.
    pub deploy_s: f64,
    /// The epoch loop's account.
    pub epochs: EpochsRun,
    /// How long the epochs took, s.
    pub elapsed_s: f64,
    /// The query's rows, when it has no INSERT INTO (read back from the store).
    pub rows: Vec<RecordBatch>,
    /// Async invocations that failed every retry.
    pub dead_letters: Vec<Value>,
    /// What every invocation reported (the functions' own usage).
    pub usage: Usage,
    /// Objects the driver wrote to the checkpoint store.
    pub driver_puts: u64,
    /// The checkpoint location, when the query checkpoints.
    pub checkpoints: Option<String>,
    /// With `verify`: the comparison with single-process DataFusion.
    pub comparison: Option<Comparison>,
}

impl LambdaRun {
    /// An error if an invocation was dead-lettered or verification failed.
    pub fn failures(&self) -> Result<()> {
        if let Some(first) = self.dead_letters.first() {
            return Err(dead_lettered(&self.dead_letters, first));
        }
        if let Some(cmp) = self.comparison.as_ref().filter(|c| !c.equal) {
            return Err(LambdaError::refused(format!(
                "verification failed: {} rows expected, {} produced; first differences:\n{}",
                cmp.expected_rows,
                cmp.got_rows,
                cmp.differences.join("\n")
            )));
        }
        Ok(())
    }
}

fn dead_lettered(all: &[Value], first: &Value) -> LambdaError {
    LambdaError::refused(format!(
        "{} async invocations failed every retry and were dead-lettered; first: {}",
        all.len(),
        first["responsePayload"]
    ))
}

/// Everything a deployment of this run needs, to deploy it again.
struct Redeployment<'a> {
    deployment: &'a Deployment,
    service: ServiceOptions,
    plan: &'a QueryPlan,
    options: PlanOptions,
    epochs: Option<u64>,
    env: BTreeMap<String, String>,
}

impl Redeployment<'_> {
    async fn deploy(&self) -> Result<Vec<Deployed>> {
        self.deployment
            .deploy_stages(
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
impl Redeploy for Redeployment<'_> {
    async fn redeploy(&self) -> skein_engine::Result<()> {
        let started = Instant::now();
        self.deploy().await.map_err(|e| {
            skein_engine::EngineError::Context(format!(
                "redeploying: {}",
                skein_engine::error::one_line(&e)
            ))
        })?;
        tracing::info!(
            secs = started.elapsed().as_secs_f64(),
            "every instance replaced"
        );
        Ok(())
    }
}

/// Deploy `sql`'s functions for this run, drive its epochs on Lambda, read
/// the results back and verify them if asked.
pub async fn run(deployment: &Deployment, sql: &str, request: &RunRequest) -> Result<LambdaRun> {
    let invoke_async = request.plan.invoke_async;
    let (plan, ctx) = deployment.plan(sql, &request.plan).await?;
    if !pushed_sources(&plan)?.is_empty() {
        return Err(LambdaError::refused(
            "this query reads a pushed Kinesis table ('mode' 'push'): its event-source mapping \
             runs it; deploy it with `skein deploy --backend lambda` and put records on the stream",
        ));
    }
    let collects = plan.sink.kind == results::KIND;
    if invoke_async && !collects {
        return Err(LambdaError::refused(
            "--invoke-async on Lambda needs a query without INSERT INTO: the run knows the last \
             async hop has finished when the last stage's results of the last epoch are in the store",
        ));
    }
    if request.verify && !collects {
        return Err(LambdaError::refused(
            "--verify on Lambda needs a query without INSERT INTO (its rows are read back from the store)",
        ));
    }
    let stop = request.bound.stop(&plan)?;
    let checkpoint_interval = request
        .checkpoint_interval
        .unwrap_or_else(|| stop.default_checkpoint_interval());
    let checkpoints = deployment
        .open_checkpoints(&plan, &request.checkpoint, invoke_async)
        .await?;
    let mut options = request.plan.clone();
    let mut env = BTreeMap::new();
    match &checkpoints {
        Some(c) => {
            options.run = c.store.manifest().run.clone();
            options.checkpoint = Some(CheckpointSpec {
                interval: checkpoint_interval,
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
        checkpoint_interval,
    );
    let resuming = log.committed().await?.is_some();

    let deploy_start = Instant::now();
    let redeployment = Redeployment {
        deployment,
        service: deployment.service_options(&plan).await?,
        plan: &plan,
        options,
        epochs: stop.bounded(),
        env,
    };
    let deployed = redeployment.deploy().await?;
    let deploy_s = deploy_start.elapsed().as_secs_f64();
    // A resumed run keeps the results of the epochs before its commit.
    if collects && !resuming {
        results::clear(&plan.sink.location, &plan.query_code).await?;
    }
    let stale_letters = format!("{}/{}", dead_letter::PREFIX, plan.query_code);
    for stale in object_keys(&deployment.store, &stale_letters).await? {
        deployment
            .store
            .delete(&stale)
            .await
            .map_err(LambdaError::store(format!("deleting {stale}")))?;
    }

    let lambda_invoker = LambdaInvoker::new(&deployment.sdk);
    let invoker = MeteredInvoker::new(&lambda_invoker);
    let redeploy = checkpoints
        .is_some()
        .then_some(&redeployment as &dyn Redeploy);
    let interval = request.bound.interval(&plan)?;
    let shape = plan.shape();
    let sizes = match &checkpoints {
        Some(c) => Some(
            GroupSizes::open(c.store.clone(), shape.clone())
                .await
                .map_err(|e| LambdaError::refused(skein_engine::error::one_line(&e)))?
                .autoscaled(
                    request
                        .autoscale
                        .map(|range| AutoscaleSpec { range, interval }),
                ),
        ),
        None if request.autoscale.is_some() => {
            return Err(LambdaError::refused(
                "--autoscale moves state between members through the checkpoint store: this \
                 query has none (drop --no-checkpoint)",
            ));
        }
        None => None,
    };
    let mut lambda =
        LambdaEpochs::new(shape, &invoker, deployment.store.clone(), redeploy).metered(&invoker);
    if let Some(sizes) = &sizes {
        lambda = lambda.sized(sizes);
    }
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
    let epochs = epochs_run?;
    if invoke_async {
        // The triggers returned once the sources had handed their payloads
        // to Lambda; the rest of the DAG runs on its own.
        let timeout = Duration::from_secs(deployment.options.timeout_s.max(1) as u64);
        wait_for_last_epoch(deployment, &plan, epochs.epochs.saturating_sub(1), timeout).await?;
    } else {
        // A member that lost its instance without checkpoints waits for
        // input that never comes: fail rather than miss its rows.
        let pending = lambda.pending().await?;
        if !pending.is_empty() {
            return Err(LambdaError::refused(format!(
                "the run ended with functions waiting for input: {}",
                pending.join("; ")
            )));
        }
    }
    let elapsed_s = start.elapsed().as_secs_f64();
    let rows: Vec<RecordBatch> = if collects {
        results::read(&plan.sink.location, &plan.query_code).await?
    } else {
        vec![]
    };
    let dead_letters = dead_letter::list(&deployment.store, &plan.query_code).await?;
    let comparison = if request.verify {
        let expected = single_process(&ctx, &plan).await?;
        Some(compare(&expected, &rows, plan.ordered)?)
    } else {
        None
    };
    Ok(LambdaRun {
        deployed,
        deploy_s,
        epochs,
        elapsed_s,
        rows,
        dead_letters,
        usage: invoker.total(),
        driver_puts: checkpoints.as_ref().map_or(0, |c| c.store.puts()),
        checkpoints: checkpoints.map(|c| c.url),
        comparison,
        plan,
    })
}

/// Wait until every member of the sink stage has written its results of
/// `epoch` (each writes once per epoch, rows or not), failing early when an
/// async invocation has been dead-lettered.
async fn wait_for_last_epoch(
    deployment: &Deployment,
    plan: &QueryPlan,
    epoch: u64,
    timeout: Duration,
) -> Result<()> {
    let members = plan
        .stages
        .iter()
        .find(|s| s.consumer.is_none())
        .ok_or_else(|| LambdaError::refused("the plan has no sink stage"))?
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
        let dead = dead_letter::list(&deployment.store, &plan.query_code).await?;
        if let Some(first) = dead.first() {
            return Err(dead_lettered(&dead, first));
        }
        if start.elapsed() > timeout {
            return Err(LambdaError::refused(format!(
                "{written} of {members} members of the last stage wrote epoch {epoch} within {} s \
                 (async hops still running, or lost)",
                timeout.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Take the query's lease on its checkpoint location and keep it renewed.
/// A lease left by a killed run expires within its time to live, so that
/// long is waited; one its holder keeps renewing is a one-line refusal.
async fn take_lease(url: &str, query_code: &str) -> Result<KeptLease> {
    use crate::lease::{Lease, now_ms};
    let (store, key) = crate::standing::lease_location(url)?;
    let holder = format!("skein run (pid {})", std::process::id());
    let mut first_expiry = None;
    loop {
        let current = match Lease::acquire(
            store.clone(),
            key.clone(),
            &holder,
            crate::standing::LEASE_TTL,
        )
        .await?
        {
            Ok(lease) => return Ok(lease.keep(|| {})),
            Err(current) => current,
        };
        let first = *first_expiry.get_or_insert(current.expires_ms);
        if current.expires_ms > first {
            return Err(LambdaError::refused(format!(
                "query {query_code} is being driven by {} (it keeps its lease in {url}): stop \
                 it first (`skein stop {query_code}` for a deployed standing query)",
                current.holder
            )));
        }
        let wait = current.expires_ms.saturating_sub(now_ms()) + 200;
        tracing::warn!(holder = %current.holder, wait_ms = wait, "waiting for the lease to expire");
        tokio::time::sleep(Duration::from_millis(wait)).await;
    }
}

/// The keys of every object under `prefix`.
pub async fn object_keys(
    store: &std::sync::Arc<dyn object_store::ObjectStore>,
    prefix: &str,
) -> Result<Vec<object_store::path::Path>> {
    use futures::TryStreamExt;
    store
        .list(Some(&object_store::path::Path::from(prefix)))
        .map_ok(|m| m.location)
        .try_collect()
        .await
        .map_err(LambdaError::store(format!("listing {prefix}")))
}
