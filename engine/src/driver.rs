//! Deploying a planned query to a function service and driving its epochs.
//! Locally the driver is the source trigger (a timer in spirit); there is no
//! coordinator beyond it: data moves function to function.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::future::try_join_all;
use object_store::ObjectStore;
use serde::Serialize;

use crate::checkpoint::{CheckpointStore, Commit, EpochPlan};
use crate::context::function_name;
use crate::error::{EngineError, Result};
use crate::function::{Request, Response, Trigger};
use crate::invoke::{FunctionService, FunctionSpec, InvocationType, Invoker, invoke_with_retry};
use crate::local::{LocalRuntime, environment};
use crate::payload::SourceOffset;
use crate::planner::{PlanOptions, QueryPlan};

/// Create (or refresh) every function of the query. Returns their names.
pub async fn deploy(
    plan: &QueryPlan,
    service: &dyn FunctionService,
    store: &Arc<dyn ObjectStore>,
    options: &PlanOptions,
    epochs: Option<u64>,
) -> Result<Vec<String>> {
    let mut names = vec![];
    for (ctx, concurrency) in plan.contexts(options, epochs)? {
        let name = ctx.function_name();
        let env = ctx.to_env(store).await?;
        service
            .create(FunctionSpec {
                name: name.clone(),
                environment: environment(env),
                concurrency,
            })
            .await?;
        names.push(name);
    }
    Ok(names)
}

/// Delete every function of the query.
pub async fn destroy(query_code: &str, service: &dyn FunctionService) -> Result<usize> {
    let names = service.list(&format!("{query_code}-")).await?;
    for n in &names {
        service.delete(n).await?;
    }
    Ok(names.len())
}

/// Fire every source instance for one epoch; returns the events they pulled.
pub async fn trigger_epoch(
    plan: &QueryPlan,
    invoker: &dyn Invoker,
    epoch: u64,
    last: bool,
) -> Result<u64> {
    Ok(fire_epoch(plan, invoker, epoch, last).await?.events)
}

/// What the source instances said about one epoch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EpochOutcome {
    /// Records pulled, each source record once.
    pub events: u64,
    /// Every source partition reached the end it had when the run started.
    pub drained: bool,
    /// Every source is exhausted for good (bounded sources).
    pub finished: bool,
}

/// Fire every source instance for one epoch.
pub async fn fire_epoch(
    plan: &QueryPlan,
    invoker: &dyn Invoker,
    epoch: u64,
    last: bool,
) -> Result<EpochOutcome> {
    let calls = plan
        .source_stages()
        .flat_map(|s| (0..s.members).map(move |m| (s.id, m)))
        .map(|(stage, m)| {
            let name = function_name(&plan.query_code, stage, m);
            let req = Request::Trigger(Trigger {
                qid: plan.query_code.clone(),
                epoch,
                last,
            })
            .to_json();
            async move {
                let answer = invoke_with_retry(
                    invoker,
                    &name,
                    req,
                    InvocationType::Sync,
                    Duration::from_secs(2),
                    100,
                )
                .await?;
                serde_json::from_slice::<Response>(&answer).map_err(|e| EngineError::Invocation {
                    name: name.clone(),
                    reason: format!("answer is not a response: {e}"),
                })
            }
        });
    let answers = try_join_all(calls).await?;
    Ok(EpochOutcome {
        events: answers.iter().map(|r| r.events).sum(),
        drained: answers.iter().all(|r| r.drained || r.finished),
        finished: answers.iter().all(|r| r.finished),
    })
}

/// The driver's side of checkpoints: its decisions are written before an
/// epoch fires (a restart makes the same ones), and an epoch is committed
/// once every function has finished it.
struct EpochLog {
    store: Option<Arc<CheckpointStore>>,
    interval: u64,
    /// Async invocations that had failed before the run.
    failed_before: usize,
}

impl EpochLog {
    /// Whether `epoch` is the last: as decided the first time it fired.
    async fn decide(&self, epoch: u64, last: bool) -> Result<bool> {
        let Some(cs) = &self.store else {
            return Ok(last);
        };
        match cs.epoch_plan(epoch).await? {
            Some(plan) => Ok(plan.last),
            None => {
                cs.put_epoch_plan(epoch, EpochPlan { last }).await?;
                Ok(last)
            }
        }
    }

    /// Commit `epoch` if it is complete everywhere and the interval (or
    /// the end of the run) says so; then drop what no restart needs.
    async fn commit(&self, runtime: &Arc<LocalRuntime>, epoch: u64, last: bool) -> Result<()> {
        let Some(cs) = &self.store else {
            return Ok(());
        };
        // An epoch that lost an invocation or left a member waiting is not
        // complete: the run fails below, and a restart re-runs the epoch.
        let failed = runtime.dead_letters();
        if failed.len() > self.failed_before {
            return Err(EngineError::Invocation {
                name: failed[self.failed_before].function.clone(),
                reason: format!(
                    "epoch {epoch} is not committed: {}",
                    failed[self.failed_before].error
                ),
            });
        }
        let pending = runtime.pending().await;
        if !pending.is_empty() {
            return Err(EngineError::Incomplete(format!(
                "epoch {epoch} is not committed: {}",
                pending.join("; ")
            )));
        }
        if last || epoch.is_multiple_of(self.interval) {
            cs.commit(Commit { epoch, last }).await?;
            cs.forget_before(epoch).await?;
            let recycled = runtime.recycle_some().await;
            if recycled > 0 {
                tracing::debug!(epoch, recycled, "fault injection: instances recycled");
            }
        }
        Ok(())
    }
}

/// The summary line of `skein run --json`.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub query_code: String,
    pub stages: usize,
    pub functions: usize,
    pub epochs: u64,
    pub invocations: u64,
    pub payload_bytes: u64,
    pub events: u64,
    pub elapsed_s: f64,
    pub events_per_s: f64,
    pub result_rows: usize,
    pub verified: Option<bool>,
    /// Rows that came after their window was emitted (dropped or
    /// dead-lettered), in all and per source table.
    pub late_rows: u64,
    pub late_rows_by_table: std::collections::BTreeMap<String, u64>,
    /// The committed epoch a checkpointed run resumed after, if any.
    pub resumed_after: Option<u64>,
}

/// When a run stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopAfter {
    /// A bounded run: the input is split into this many epochs.
    Epochs(u64),
    /// Fire an epoch every `interval` until `duration` has passed (or every
    /// source is exhausted for good), then one last epoch that flushes all
    /// state. A live source that is merely quiet does not end the run.
    Duration {
        duration: Duration,
        interval: Duration,
    },
    /// Fire an epoch every `interval` until every source partition has
    /// reached the end it had when the run started, then one last epoch.
    Drained { interval: Duration },
}

/// Deploy to an in-process runtime and run until `stop`; the last epoch
/// flushes all state. Fails if any function is left waiting for input.
pub async fn run_local(
    plan: &QueryPlan,
    runtime: &Arc<LocalRuntime>,
    options: &PlanOptions,
    epochs: u64,
    on_epoch: impl FnMut(u64, u64),
) -> Result<RunReport> {
    run_local_until(
        plan,
        runtime,
        options,
        StopAfter::Epochs(epochs.max(1)),
        on_epoch,
    )
    .await
}

pub async fn run_local_until(
    plan: &QueryPlan,
    runtime: &Arc<LocalRuntime>,
    options: &PlanOptions,
    stop: StopAfter,
    on_epoch: impl FnMut(u64, u64),
) -> Result<RunReport> {
    run_local_drained_by(
        plan,
        runtime,
        options,
        stop,
        on_epoch,
        async |_, outcome| Ok(outcome.drained),
    )
    .await
}

/// [`run_local_until`] where the caller decides when a
/// [`StopAfter::Drained`] run has drained: `drained` is asked after each
/// epoch is committed (with the epoch and what its sources said) in place
/// of the sources' own flag, e.g. to compare the committed offsets
/// ([`committed_offsets`]) with ends that move while the run goes on.
pub async fn run_local_drained_by(
    plan: &QueryPlan,
    runtime: &Arc<LocalRuntime>,
    options: &PlanOptions,
    stop: StopAfter,
    mut on_epoch: impl FnMut(u64, u64),
    mut drained: impl AsyncFnMut(u64, EpochOutcome) -> Result<bool>,
) -> Result<RunReport> {
    let bounded = match stop {
        StopAfter::Epochs(n) => Some(n.max(1)),
        StopAfter::Duration { .. } | StopAfter::Drained { .. } => None,
    };
    let store = runtime.store();
    let names = deploy(plan, runtime.as_ref(), &store, options, bounded).await?;
    let before_inv = runtime.stats().invocations.load(Ordering::Relaxed);
    let before_bytes = runtime.stats().payload_bytes.load(Ordering::Relaxed);
    let before_late = runtime.late_rows();
    let start = Instant::now();
    let mut events = 0;
    let checkpoints = runtime.checkpoints();
    let epochs = EpochLog {
        store: checkpoints.clone(),
        interval: options.checkpoint.as_ref().map_or(1, |c| c.interval.max(1)),
        failed_before: runtime.dead_letters().len(),
    };
    let resumed = match &checkpoints {
        Some(cs) => cs.committed().await?,
        None => None,
    };
    let first_epoch = resumed.map_or(0, |c| c.epoch + 1);
    if let Some(c) = resumed {
        tracing::info!(epoch = c.epoch, "resuming after the last committed epoch");
    }
    let mut epoch = first_epoch;
    // A bounded run that already reached its last epoch has nothing to do;
    // a larger --epochs goes on where it ended.
    let bounded_and_done =
        matches!((stop, resumed), (StopAfter::Epochs(n), Some(c)) if c.epoch + 1 >= n);
    loop {
        if bounded_and_done {
            break;
        }
        let last = match stop {
            StopAfter::Epochs(n) => epoch + 1 >= n,
            StopAfter::Duration { duration, .. } => start.elapsed() >= duration,
            StopAfter::Drained { .. } => false,
        };
        let last = epochs.decide(epoch, last).await?;
        let fired = Instant::now();
        let outcome = fire_epoch(plan, runtime.as_ref(), epoch, last).await?;
        runtime.wait_idle().await;
        epochs.commit(runtime, epoch, last).await?;
        crate::metrics::epoch(fired.elapsed(), outcome.events);
        events += outcome.events;
        on_epoch(epoch, events);
        epoch += 1;
        if last {
            break;
        }
        let interval = match stop {
            StopAfter::Epochs(_) => continue,
            StopAfter::Duration { interval, .. } => interval,
            StopAfter::Drained { interval } => interval,
        };
        let done = match stop {
            StopAfter::Drained { .. } => drained(epoch - 1, outcome).await?,
            _ => outcome.finished,
        };
        if done {
            // One more epoch flushes the state (and takes what came since).
            let last = epochs.decide(epoch, true).await?;
            events += fire_epoch(plan, runtime.as_ref(), epoch, last)
                .await?
                .events;
            runtime.wait_idle().await;
            epochs.commit(runtime, epoch, last).await?;
            on_epoch(epoch, events);
            epoch += 1;
            if last {
                break;
            }
            continue;
        }
        tokio::time::sleep(interval.saturating_sub(fired.elapsed())).await;
    }
    let epochs = epoch - first_epoch;
    let elapsed = start.elapsed().as_secs_f64();
    let mut late_by_table = runtime.late_rows();
    for (table, n) in &before_late {
        if let Some(now) = late_by_table.get_mut(table) {
            *now -= n;
        }
    }
    late_by_table.retain(|_, n| *n > 0);
    let pending = runtime.pending().await;
    if !pending.is_empty() {
        return Err(EngineError::Incomplete(pending.join("; ")));
    }
    let failed = runtime.dead_letters();
    if !failed.is_empty() {
        return Err(EngineError::Invocation {
            name: failed[0].function.clone(),
            reason: format!(
                "{} async invocations failed; first: {}",
                failed.len(),
                failed[0].error
            ),
        });
    }
    Ok(RunReport {
        query_code: plan.query_code.clone(),
        stages: plan.stages.len(),
        functions: names.len(),
        epochs,
        invocations: runtime.stats().invocations.load(Ordering::Relaxed) - before_inv,
        payload_bytes: runtime.stats().payload_bytes.load(Ordering::Relaxed) - before_bytes,
        events,
        elapsed_s: elapsed,
        events_per_s: if elapsed > 0.0 {
            events as f64 / elapsed
        } else {
            0.0
        },
        result_rows: 0,
        verified: None,
        late_rows: late_by_table.values().sum(),
        late_rows_by_table: late_by_table,
        resumed_after: resumed.map(|c| c.epoch),
    })
}

/// Where the sources stood after the last committed epoch: every source
/// member's logged positions (next offset per partition) for that epoch,
/// with the epoch. `None` before the first commit.
pub async fn committed_offsets(
    plan: &QueryPlan,
    store: &CheckpointStore,
) -> Result<Option<(u64, Vec<SourceOffset>)>> {
    let Some(commit) = store.committed().await? else {
        return Ok(None);
    };
    let mut out = vec![];
    for stage in plan.source_stages() {
        for member in 0..stage.members {
            let entry = store
                .offsets(stage.id, member, commit.epoch)
                .await?
                .ok_or_else(|| {
                    EngineError::Context(format!(
                        "the offsets log has no entry of committed epoch {} for {}",
                        commit.epoch,
                        function_name(&plan.query_code, stage.id, member)
                    ))
                })?;
            out.extend(entry.tables.into_iter().flat_map(|t| t.to));
        }
    }
    Ok(Some((commit.epoch, out)))
}
