//! Deploying a planned query to a function service and driving its epochs.
//! Locally the driver is the source trigger (a timer in spirit); there is no
//! coordinator beyond it: data moves function to function.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::future::try_join_all;
use object_store::ObjectStore;
use serde::Serialize;

use crate::context::function_name;
use crate::error::{EngineError, Result};
use crate::function::{Request, Response, Trigger};
use crate::invoke::{FunctionService, FunctionSpec, InvocationType, Invoker, invoke_with_retry};
use crate::local::{LocalRuntime, environment};
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
                let r: Response =
                    serde_json::from_slice(&answer).map_err(|e| EngineError::Invocation {
                        name: name.clone(),
                        reason: format!("answer is not a response: {e}"),
                    })?;
                Ok::<u64, EngineError>(r.events)
            }
        });
    Ok(try_join_all(calls).await?.into_iter().sum())
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
}

/// When a run stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopAfter {
    /// A bounded run: the input is split into this many epochs.
    Epochs(u64),
    /// Fire an epoch every `interval` until `duration` has passed (or the
    /// sources run dry), then one last epoch that flushes all state.
    Duration {
        duration: Duration,
        interval: Duration,
    },
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
    mut on_epoch: impl FnMut(u64, u64),
) -> Result<RunReport> {
    let bounded = match stop {
        StopAfter::Epochs(n) => Some(n.max(1)),
        StopAfter::Duration { .. } => None,
    };
    let store = runtime.store();
    let names = deploy(plan, runtime.as_ref(), &store, options, bounded).await?;
    let before_inv = runtime.stats().invocations.load(Ordering::Relaxed);
    let before_bytes = runtime.stats().payload_bytes.load(Ordering::Relaxed);
    let start = Instant::now();
    let mut events = 0;
    let mut epoch = 0;
    loop {
        let last = match stop {
            StopAfter::Epochs(n) => epoch + 1 >= n,
            StopAfter::Duration { duration, .. } => start.elapsed() >= duration,
        };
        let fired = Instant::now();
        let pulled = trigger_epoch(plan, runtime.as_ref(), epoch, last).await?;
        runtime.wait_idle().await;
        events += pulled;
        on_epoch(epoch, events);
        epoch += 1;
        if last {
            break;
        }
        if let StopAfter::Duration { interval, .. } = stop {
            if pulled == 0 {
                // The sources ran dry: one more (empty) epoch flushes the state.
                trigger_epoch(plan, runtime.as_ref(), epoch, true).await?;
                runtime.wait_idle().await;
                epoch += 1;
                break;
            }
            tokio::time::sleep(interval.saturating_sub(fired.elapsed())).await;
        }
    }
    let epochs = epoch;
    let elapsed = start.elapsed().as_secs_f64();
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
    })
}
