//! Deploying a planned query to a function service and driving its epochs.
//! Locally the driver is the source trigger (a timer in spirit); there is no
//! coordinator beyond it: data moves function to function.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::future::join_all;
use object_store::ObjectStore;
use serde::{Deserialize, Serialize};

use crate::autoscale::{Autoscaling, GroupNow};
use crate::checkpoint::{CheckpointStore, Layout, RescaleRequest};
use crate::context::function_name;
use crate::epochs::{EpochLog, EpochRuntime, not_committed, run_epochs};
use crate::error::{EngineError, Result};
use crate::function::{Request, Response, Trigger};
use crate::invoke::{FunctionService, FunctionSpec, InvocationType, Invoker, invoke_with_retry};
use crate::local::{LocalRuntime, environment};
use crate::payload::SourceOffset;
use crate::planner::{PlanOptions, PlanShape, QueryPlan};
use crate::sink_health::BoundNow;

pub use crate::epochs::{DrainCheck, EpochFire, EpochOutcome, StopAfter};

/// One deployed function.
#[derive(Debug, Clone)]
pub struct Deployed {
    /// Its name.
    pub name: String,
    /// Its reserved concurrency.
    pub concurrency: usize,
    /// Whether its context was spilled to the object store.
    pub spilled: bool,
}

/// Create (or refresh) every function of the query, in-process or on
/// Lambda. `other_env` is what the service adds to each function's
/// environment: it counts toward the limit past which a context is spilled
/// to `store`.
pub async fn deploy(
    plan: &QueryPlan,
    service: &dyn FunctionService,
    store: &Arc<dyn ObjectStore>,
    options: &PlanOptions,
    epochs: Option<u64>,
    other_env: &BTreeMap<String, String>,
) -> Result<Vec<Deployed>> {
    let other: usize = other_env.iter().map(|(k, v)| k.len() + v.len()).sum();
    let mut out = vec![];
    for (ctx, concurrency) in plan.contexts(options, epochs)? {
        let name = ctx.function_name();
        let value = ctx.to_env(store, other).await?;
        let spilled = value.starts_with(crate::context::STORE_REF);
        service
            .create(FunctionSpec {
                name: name.clone(),
                environment: environment(value),
                concurrency,
            })
            .await?;
        out.push(Deployed {
            name,
            concurrency,
            spilled,
        });
    }
    Ok(out)
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
    let fire = EpochFire {
        epoch,
        last,
        ..Default::default()
    };
    Ok(fire_epoch(&plan.shape(), invoker, fire).await?.events)
}

/// Fire every source instance of the plan `shape` for one epoch.
pub async fn fire_epoch(
    shape: &PlanShape,
    invoker: &dyn Invoker,
    fire: EpochFire,
) -> Result<EpochOutcome> {
    let calls = shape.source_functions().into_iter().map(|(_, name)| {
        let req = Request::Trigger(Trigger {
            qid: shape.query_code.clone(),
            epoch: fire.epoch,
            last: fire.last,
            checkpoint: fire.checkpoint,
            fresh: fire.fresh,
            committed: fire.committed,
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
            serde_json::from_slice::<Response>(&answer).map_err(|e| {
                EngineError::invocation_failed(
                    name.clone(),
                    format!("answer is not a response: {e}"),
                )
            })
        }
    });
    // Every call is waited for, failed or not: nothing of this epoch is
    // still running when the driver goes on (or runs it again).
    let answers = join_all(calls)
        .await
        .into_iter()
        .collect::<Result<Vec<_>>>()?;
    let lags: Vec<u64> = answers.iter().filter_map(|r| r.lag).collect();
    Ok(EpochOutcome {
        events: answers.iter().map(|r| r.events).sum(),
        drained: answers.iter().all(|r| r.drained || r.finished),
        finished: answers.iter().all(|r| r.finished),
        lag: (!lags.is_empty()).then(|| lags.iter().sum()),
        watermark_ms: answers.iter().filter_map(|r| r.watermark_ms).min(),
        newest_event_ms: answers.iter().filter_map(|r| r.newest_event_ms).max(),
    })
}

/// The summary line of `skein run --json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunReport {
    /// The query's code.
    pub query_code: String,
    /// How many stages ran.
    pub stages: usize,
    /// How many functions ran.
    pub functions: usize,
    /// How many epochs were fired.
    pub epochs: u64,
    /// Function invocations, all stages.
    pub invocations: u64,
    /// Bytes of payloads sent between functions.
    pub payload_bytes: u64,
    /// Events the sources read.
    pub events: u64,
    /// Wall time of the run, in seconds.
    pub elapsed_s: f64,
    /// `events / elapsed_s`.
    pub events_per_s: f64,
    /// Rows the query produced (collected results).
    pub result_rows: usize,
    /// Whether the results matched a reference run, when one was asked for.
    pub verified: Option<bool>,
    /// Rows that came after their window was emitted (dropped or
    /// dead-lettered), in all and per source table.
    pub late_rows: u64,
    /// Late rows, per source table.
    pub late_rows_by_table: std::collections::BTreeMap<String, u64>,
    /// The committed epoch a checkpointed run resumed after, if any.
    pub resumed_after: Option<u64>,
    /// Invocation time as Lambda bills it (each rounded up to 1 ms), summed.
    pub billed_ms: u64,
    /// Objects the run wrote to the checkpoint store (S3 PUT requests).
    pub checkpoint_puts: u64,
    /// Bytes of those objects.
    pub checkpoint_bytes: u64,
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

/// Run a planned query in-process until `stop` says so, and report.
pub async fn run_local_until(
    plan: &QueryPlan,
    runtime: &Arc<LocalRuntime>,
    options: &PlanOptions,
    stop: StopAfter,
    on_epoch: impl FnMut(u64, u64),
) -> Result<RunReport> {
    run_local_drained_by(plan, runtime, options, stop, on_epoch, None).await
}

/// [`run_local_until`] where `drain` (when given) decides when a
/// [`StopAfter::Drained`] run has drained, asked after each committed epoch.
pub async fn run_local_drained_by<'a>(
    plan: &'a QueryPlan,
    runtime: &'a Arc<LocalRuntime>,
    options: &'a PlanOptions,
    stop: StopAfter,
    on_epoch: impl FnMut(u64, u64),
    drain: Option<&'a mut (dyn DrainCheck + 'a)>,
) -> Result<RunReport> {
    let store = runtime.store();
    // Groups keep the size the last commit ran them at (a rescale survives
    // a restart).
    // A rescale after that commit records the layout the epochs after it
    // ran in: they run in it again.
    let plan = match runtime.checkpoints() {
        Some(cs) => match cs.next_layout().await? {
            Some(layout) => plan.with_layout(&layout)?,
            None => plan.clone(),
        },
        None => plan.clone(),
    };
    let plan = &plan;
    runtime.set_bound(BoundNow {
        deadline: match &stop {
            StopAfter::Duration { duration, .. } => Some(Instant::now() + *duration),
            _ => None,
        },
        retry_writes: !matches!(stop, StopAfter::Epochs(_)),
    });
    let names = deploy(
        plan,
        runtime.as_ref(),
        &store,
        options,
        stop.bounded(),
        &BTreeMap::new(),
    )
    .await?;
    let before_inv = runtime.stats().invocations.load(Ordering::Relaxed);
    let before_bytes = runtime.stats().payload_bytes.load(Ordering::Relaxed);
    let before_billed = runtime.stats().billed_ms.load(Ordering::Relaxed);
    let checkpoint_puts = || runtime.checkpoints().map_or(0, |c| c.puts());
    let checkpoint_bytes = || runtime.checkpoints().map_or(0, |c| c.bytes_written());
    let (before_puts, before_bytes_written) = (checkpoint_puts(), checkpoint_bytes());
    let before_late = runtime.late_rows();
    let start = Instant::now();
    let log = EpochLog::new(
        runtime.checkpoints(),
        options.checkpoint.as_ref().map_or(1, |c| c.interval),
    );
    let bounded = stop.bounded();
    let local = LocalEpochs {
        shape: plan.shape(),
        runtime,
        failed_before: runtime.dead_letters().len(),
        drain: drain.map(tokio::sync::Mutex::new),
        plan: std::sync::Mutex::new(plan.clone()),
        options,
        epochs: bounded,
        autoscale: options
            .autoscale
            .map(|spec| std::sync::Mutex::new(Autoscaling::new(spec))),
    };
    let run = run_epochs(&local, &log, stop, on_epoch).await?;
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
        return Err(EngineError::invocation_failed(
            failed[0].function.clone(),
            format!(
                "{} async invocations failed; first: {}",
                failed.len(),
                failed[0].error
            ),
        ));
    }
    Ok(RunReport {
        query_code: plan.query_code.clone(),
        stages: plan.stages.len(),
        functions: names.len(),
        epochs: run.epochs,
        invocations: runtime.stats().invocations.load(Ordering::Relaxed) - before_inv,
        payload_bytes: runtime.stats().payload_bytes.load(Ordering::Relaxed) - before_bytes,
        events: run.events,
        elapsed_s: elapsed,
        events_per_s: if elapsed > 0.0 {
            run.events as f64 / elapsed
        } else {
            0.0
        },
        result_rows: 0,
        verified: None,
        late_rows: late_by_table.values().sum(),
        late_rows_by_table: late_by_table,
        resumed_after: run.resumed.map(|c| c.epoch),
        billed_ms: runtime.stats().billed_ms.load(Ordering::Relaxed) - before_billed,
        checkpoint_puts: checkpoint_puts() - before_puts,
        checkpoint_bytes: checkpoint_bytes() - before_bytes_written,
    })
}

/// The in-process runtime under the epoch loop. It cannot replace
/// instances mid-run (a failed epoch fails the run; a restart resumes).
struct LocalEpochs<'a> {
    shape: PlanShape,
    runtime: &'a Arc<LocalRuntime>,
    /// Async invocations that had failed before the run.
    failed_before: usize,
    drain: Option<tokio::sync::Mutex<&'a mut (dyn DrainCheck + 'a)>>,
    /// The plan as deployed now: its groups' sizes change with a rescale.
    plan: std::sync::Mutex<QueryPlan>,
    options: &'a PlanOptions,
    /// Epochs of a bounded run (the functions' contexts carry it).
    epochs: Option<u64>,
    /// `--autoscale`: the sizing rule, and each group's billed time at the
    /// last observation.
    autoscale: Option<std::sync::Mutex<Autoscaling>>,
}

impl LocalEpochs<'_> {
    /// Carry out a rescale `skein rescale` left in the store, right after
    /// a commit: nothing runs, and every member's state is in the commit.
    /// The stage's functions are deployed at the new size with those of
    /// its neighbours (their contexts name its size); the cold instances
    /// take their key groups' state from the commit. A request that cannot
    /// be carried out is refused in the log and dropped; the run goes on.
    /// Returns whether a request was waiting (carried out now or before,
    /// or refused).
    async fn rescale_if_asked(&self, epoch: u64) -> Result<bool> {
        let Some(cs) = self.runtime.checkpoints() else {
            return Ok(false);
        };
        let Some(ask) = cs.rescale_request().await? else {
            return Ok(false);
        };
        let current = self.plan.lock().expect("plan").clone();
        let before = current
            .layout()
            .get(&ask.stage)
            .copied()
            .unwrap_or_default();
        // Carried out, and the commit just made ran at the new size: done.
        // (Dropped only now, so that a crash between the rescale and that
        // commit, which resumes at the old size, carries it out again.)
        if before == ask.members {
            cs.rescale_done().await?;
            return Ok(true);
        }
        let next = match current.with_layout(&Layout::from([(ask.stage, ask.members)])) {
            Ok(next) => next,
            Err(e) => {
                tracing::warn!(epoch, error = %crate::error::one_line(&e), "rescale refused");
                cs.rescale_done().await?;
                return Ok(true);
            }
        };
        let started = Instant::now();
        cs.put_layout_from(epoch + 1, &next.layout()).await?;
        let store = self.runtime.store();
        deploy(
            &next,
            self.runtime.as_ref(),
            &store,
            self.options,
            self.epochs,
            &BTreeMap::new(),
        )
        .await?;
        for member in ask.members..before {
            let name = function_name(&next.query_code, ask.stage, member);
            self.runtime.delete(&name).await?;
        }
        *self.plan.lock().expect("plan") = next;
        crate::metrics::rescale(ask.stage, ask.members);
        tracing::info!(
            epoch,
            stage = ask.stage,
            from = before,
            to = ask.members,
            ms = started.elapsed().as_millis() as u64,
            "group rescaled after the commit; its members take their key groups from it"
        );
        Ok(true)
    }

    /// `--autoscale`, at a commit with no request waiting: each group's
    /// work since the last commit is weighed, and a group whose size is
    /// wrong gets a request, carried out at once as a hand-made one is.
    async fn autoscale(&self, epoch: u64, last_ran: &EpochOutcome) -> Result<()> {
        let (Some(scaling), Some(cs)) = (&self.autoscale, self.runtime.checkpoints()) else {
            return Ok(());
        };
        let asked = {
            let plan = self.plan.lock().expect("plan");
            // The groups that can change size, and their most members, are
            // the planned shape's; their members now are the plan's.
            let now = self.shape.stages.iter().filter_map(|s| {
                let most = s.max_members?;
                let members = plan.stages.iter().find(|p| p.id == s.id)?.members;
                Some(GroupNow {
                    stage: s.id,
                    members,
                    key_groups: most,
                    busy_ms: (0..members)
                        .map(|m| {
                            self.runtime
                                .busy_ms_of(&function_name(&plan.query_code, s.id, m))
                        })
                        .sum(),
                })
            });
            scaling
                .lock()
                .expect("autoscaling")
                .at_commit(epoch, last_ran, now)
                .map(|(stage, members)| RescaleRequest { stage, members })
        };
        if let Some(request) = asked {
            cs.ask_rescale(request).await?;
            self.rescale_if_asked(epoch).await?;
        }
        Ok(())
    }
}

#[async_trait]
impl EpochRuntime for LocalEpochs<'_> {
    fn window_step_ms(&self) -> Option<i64> {
        self.shape.window_step_ms
    }

    async fn run_epoch(&self, fire: EpochFire) -> Result<EpochOutcome> {
        let outcome = fire_epoch(&self.shape, self.runtime.as_ref(), fire).await?;
        self.runtime.wait_idle().await;
        Ok(outcome)
    }

    async fn check_complete(&self, epoch: u64) -> Result<()> {
        let failed = self.runtime.dead_letters();
        if let Some(first) = failed.get(self.failed_before) {
            return Err(EngineError::invocation_failed(
                first.function.clone(),
                format!("epoch {epoch} is not committed: {}", first.error),
            ));
        }
        let pending = self.runtime.pending().await;
        if !pending.is_empty() {
            return Err(not_committed(epoch, pending.join("; ")));
        }
        Ok(())
    }

    async fn usage(&self) -> crate::usage::Usage {
        // Checkpoint writes are counted by the store handle the driver
        // shares with the functions here.
        let stats = self.runtime.stats();
        crate::usage::Usage {
            invocations: stats.invocations.load(Ordering::Relaxed),
            billed_ms: stats.billed_ms.load(Ordering::Relaxed),
            payload_bytes: stats.payload_bytes.load(Ordering::Relaxed),
            ..Default::default()
        }
    }

    async fn committed(&self, epoch: u64, last_ran: &EpochOutcome) -> Result<()> {
        let recycled = self.runtime.recycle_some().await;
        if recycled > 0 {
            tracing::debug!(epoch, recycled, "fault injection: instances recycled");
        }
        if !self.rescale_if_asked(epoch).await? {
            self.autoscale(epoch, last_ran).await?;
        }
        Ok(())
    }

    fn layout(&self) -> Layout {
        self.plan.lock().expect("plan").layout()
    }

    async fn drained(&self, epoch: u64, outcome: EpochOutcome) -> Result<bool> {
        match &self.drain {
            Some(d) => d.lock().await.drained(epoch, outcome).await,
            None => Ok(outcome.drained),
        }
    }
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
