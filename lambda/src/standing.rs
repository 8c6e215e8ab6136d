//! A standing query on Lambda with no local process: `skein deploy` writes
//! a [`StandingSpec`] to the deployment's store, deploys a driver function
//! (the same bootstrap, with [`DRIVER_ENV`] naming the query) and a
//! schedule that invokes it every minute. Each invocation is a tick
//! ([`tick`]): it takes the query's lease, runs epochs through the engine's
//! epoch loop at the query's interval until shortly before the next tick,
//! commits, and gives the lease back. Everything a later tick needs is in
//! the offsets log and the state store.

use std::sync::Arc;
use std::time::Duration;

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};
use skein_engine::autoscale::{AutoscaleRange, AutoscaleSpec};
use skein_engine::epochs::{EpochLog, StopAfter, run_epochs, stop_signal};
use skein_engine::payload::Encoding;
use skein_engine::planner::{PlanShape, QueryPlan};
use skein_engine::usage::MeteredInvoker;
use skein_sinks::results;

use crate::epoch_runtime::{LambdaEpochs, Redeploy};
use crate::lease::{LEASE_FILE, Lease, LeaseError};
use crate::rescale::GroupSizes;
use crate::{LambdaFunctionService, LambdaInvoker, RUN_ENV};

/// Set on a driver function: the query code it drives (it serves no other).
pub const DRIVER_ENV: &str = "SKEIN_DRIVER";

/// Under the deployment's store: one spec per standing query.
const SPEC_PREFIX: &str = "skein/standing";

/// How long a lease lives unless renewed; renewed every third of it, so a
/// crashed driver's lease is free well before the next tick but one.
pub const LEASE_TTL: Duration = Duration::from_secs(30);

/// What a tick stops short of the next tick (or the function's timeout):
/// the epoch in flight, its commit and the lease's release fit in it.
pub const SAFETY_MARGIN: Duration = Duration::from_secs(10);

/// The time between ticks (the schedule's rate).
pub const TICK: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum StandingError {
    #[error("standing query {query}: {reason}")]
    Spec { query: String, reason: String },
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error(transparent)]
    Checkpoints(#[from] crate::checkpoints::CheckpointError),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error("standing query {query}: {source}")]
    Engine {
        query: String,
        source: skein_engine::EngineError,
    },
}

/// Everything a driver needs to plan and run the query: written by
/// `skein deploy`, read by every tick.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StandingSpec {
    pub query_code: String,
    /// The query text the functions were planned from.
    pub sql: String,
    pub group_size: usize,
    pub encoding: Encoding,
    /// Time between epochs, ms.
    pub interval_ms: u64,
    /// Epochs between commits.
    pub checkpoint_interval: u64,
    /// The checkpoint location (`s3://bucket/prefix`).
    pub checkpoints: String,
    /// The deployment's store (results, dead letters).
    pub store: String,
    /// How long a tick runs epochs, ms: the shorter of the tick and the
    /// function's timeout, less [`SAFETY_MARGIN`].
    pub run_for_ms: u64,
    /// The plan's stages and members, which is all a tick needs of the
    /// plan: the function binary has no SQL front end to plan `sql` with.
    /// Absent from specs deployed before it was written (deploy again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<PlanShape>,
    /// `--autoscale`: the sizes the driver keeps each group within.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscale: Option<AutoscaleRange>,
}

impl StandingSpec {
    /// How long a tick runs for a function timeout of `timeout_s`.
    pub fn run_for(timeout_s: i32) -> Duration {
        TICK.min(Duration::from_secs(timeout_s.max(1) as u64))
            .saturating_sub(SAFETY_MARGIN)
            .max(Duration::from_secs(1))
    }
}

/// The spec's key in the deployment's store.
pub fn spec_key(query_code: &str) -> Path {
    Path::from(format!("{SPEC_PREFIX}/{query_code}.json"))
}

/// The driver function of `query_code`.
pub fn driver_name(query_code: &str) -> String {
    format!("{query_code}-driver")
}

/// The input the schedule invokes the driver with.
pub fn drive_input(query_code: &str) -> String {
    serde_json::json!({ skein_engine::request::DRIVE_KEY: { "query": query_code } }).to_string()
}

/// Where the results of a query without `INSERT INTO` go on Lambda.
pub fn results_location(store_url: &str) -> String {
    format!("{}/skein/results", store_url.trim_end_matches('/'))
}

/// A plan whose sink is the in-memory collector writes to the `RESULTS`
/// sink in the deployment's store instead (functions cannot hand rows back).
pub fn route_collect(plan: &mut QueryPlan, store_url: &str) {
    if plan
        .sink
        .kind
        .eq_ignore_ascii_case(skein_engine::sink::COLLECT_KIND)
    {
        plan.sink = results::config(&results_location(store_url));
    }
}

pub async fn put_spec(
    store: &Arc<dyn ObjectStore>,
    spec: &StandingSpec,
) -> Result<(), StandingError> {
    let key = spec_key(&spec.query_code);
    let body = serde_json::to_vec_pretty(spec).expect("a spec serializes");
    store
        .put(&key, PutPayload::from(body))
        .await
        .map_err(|e| spec_err(&spec.query_code, format!("writing {key}: {e}")))?;
    Ok(())
}

/// The spec of `query_code`; `None` when it was never deployed standing.
pub async fn get_spec(
    store: &Arc<dyn ObjectStore>,
    query_code: &str,
) -> Result<Option<StandingSpec>, StandingError> {
    let key = spec_key(query_code);
    let bytes = match store.get(&key).await {
        Ok(got) => got
            .bytes()
            .await
            .map_err(|e| spec_err(query_code, format!("reading {key}: {e}")))?,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(spec_err(query_code, format!("reading {key}: {e}"))),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| spec_err(query_code, format!("{key} is not a spec: {e}")))
}

pub async fn delete_spec(
    store: &Arc<dyn ObjectStore>,
    query_code: &str,
) -> Result<(), StandingError> {
    match store.delete(&spec_key(query_code)).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
        Err(e) => Err(spec_err(query_code, format!("deleting its spec: {e}"))),
    }
}

fn spec_err(query: &str, reason: String) -> StandingError {
    StandingError::Spec {
        query: query.to_string(),
        reason,
    }
}

/// The lease's key and store for a checkpoint location.
pub fn lease_location(
    checkpoints_url: &str,
) -> Result<(Arc<dyn ObjectStore>, Path), StandingError> {
    let (store, root) = crate::checkpoints::locate(checkpoints_url)?;
    Ok((store, root.clone().join(LEASE_FILE)))
}

/// Replaces every instance of the query's functions by changing their
/// `SKEIN_RUN` in place (the driver has no code zip to redeploy with).
struct RefreshInstances {
    service: LambdaFunctionService,
    functions: Vec<String>,
}

#[async_trait::async_trait]
impl Redeploy for RefreshInstances {
    async fn redeploy(&self) -> skein_engine::Result<()> {
        let run = format!("{}-driver", crate::lease::now_ms());
        let updates = self
            .functions
            .iter()
            .map(|name| self.service.set_env_var(name, RUN_ENV, &run));
        for done in futures::future::join_all(updates).await {
            done?;
        }
        tracing::info!(functions = self.functions.len(), "every instance replaced");
        Ok(())
    }
}

/// What one tick did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TickReport {
    pub query_code: String,
    /// Another driver holds the lease: this tick ran nothing.
    pub held_by: Option<String>,
    /// The previous holder did not give the lease back; every instance was
    /// replaced before the first epoch.
    pub took_over: bool,
    pub resumed_after: Option<u64>,
    pub epochs: u64,
    pub events: u64,
    pub recoveries: u32,
    /// The lease was lost mid-tick (it expired and another driver took it).
    pub lost_lease: bool,
}

/// One tick of `spec`'s driver, `holder` naming this invocation; `shape`
/// is the deployed plan's (the spec's).
pub async fn tick(
    spec: &StandingSpec,
    shape: &PlanShape,
    holder: &str,
) -> Result<TickReport, StandingError> {
    let code = spec.query_code.clone();
    let engine = |source| StandingError::Engine {
        query: code.clone(),
        source,
    };
    let mut report = TickReport {
        query_code: code.clone(),
        ..Default::default()
    };
    let (lease_store, lease_key) = lease_location(&spec.checkpoints)?;
    let lease = match Lease::acquire(lease_store, lease_key, holder, LEASE_TTL).await? {
        Ok(lease) => lease,
        Err(current) => {
            tracing::info!(holder = %current.holder, "another driver holds the lease");
            report.held_by = Some(current.holder);
            return Ok(report);
        }
    };
    report.took_over = lease.taken_over;
    let checkpoints = Arc::new(crate::checkpoints::open(&spec.checkpoints, &code).await?);
    let deployment_store = crate::store::open(&spec.store)?;
    let sdk = crate::sdk_config().await;
    let invoker = LambdaInvoker::new(&sdk);
    let refresh = RefreshInstances {
        service: LambdaFunctionService::new(&sdk, None),
        functions: shape.functions(),
    };
    if lease.taken_over {
        // A driver died mid-tick: an instance may hold half an epoch.
        tracing::warn!("the last driver did not release its lease; replacing every instance");
        refresh.redeploy().await.map_err(engine)?;
    }

    let (stop, signal) = stop_signal();
    let deadline = {
        let stop = stop.clone();
        let run_for = Duration::from_millis(spec.run_for_ms);
        tokio::spawn(async move {
            tokio::time::sleep(run_for).await;
            stop.stop();
        })
    };
    let kept = {
        let stop = stop.clone();
        lease.keep(move || {
            tracing::error!("lost the lease; stopping after the epoch in flight");
            stop.stop();
        })
    };
    let metered = MeteredInvoker::new(&invoker);
    let sizes = GroupSizes::open(checkpoints.clone(), shape.clone())
        .await
        .map_err(engine)?
        .autoscaled(spec.autoscale.map(|range| AutoscaleSpec {
            range,
            interval: Duration::from_millis(spec.interval_ms),
        }));
    let runtime = LambdaEpochs::new(shape.clone(), &invoker, deployment_store, Some(&refresh))
        .metered(&metered)
        .sized(&sizes);
    let log = EpochLog::new(Some(checkpoints), spec.checkpoint_interval);
    let stop_after = StopAfter::Signalled {
        interval: Duration::from_millis(spec.interval_ms),
        signal,
    };
    let run = run_epochs(&runtime, &log, stop_after, |_, _| {}).await;
    deadline.abort();
    let lease = kept.finish().await;
    // Released only after a clean run: a failed tick leaves it to expire,
    // so the next driver replaces every instance first.
    match (&run, lease) {
        (Ok(_), Some(lease)) => report.lost_lease = !lease.release().await?,
        (_, None) => report.lost_lease = true,
        (Err(_), Some(_)) => {}
    }
    let run = run.map_err(engine)?;
    report.resumed_after = run.resumed.map(|c| c.epoch);
    report.epochs = run.epochs;
    report.events = run.events;
    report.recoveries = run.recoveries;
    tracing::info!(?report, "tick done");
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tick_stops_short_of_the_next_tick_and_the_timeout() {
        assert_eq!(StandingSpec::run_for(300), Duration::from_secs(50));
        assert_eq!(StandingSpec::run_for(30), Duration::from_secs(20));
        assert_eq!(StandingSpec::run_for(5), Duration::from_secs(1));
        assert_eq!(drive_input("q1"), r#"{"drive":{"query":"q1"}}"#);
    }
}
