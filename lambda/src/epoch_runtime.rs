//! Lambda under the engine's epoch loop (`skein_engine::epochs`): an epoch
//! is fired with synchronous triggers, which return once the chain below
//! them has run; it is complete when no async invocation was dead-lettered
//! and no function that takes payloads waits for input (each is asked with
//! a probe, which reports its stage's pending inputs); a failed epoch is
//! run again from the last commit after every instance is replaced by a
//! redeployment.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::join_all;
use object_store::ObjectStore;
use serde::Deserialize;
use skein_engine::epochs::{EpochFire, EpochOutcome, EpochRuntime, not_committed};
use skein_engine::invoke::{InvocationType, Invoker, invoke_with_retry};
use skein_engine::planner::PlanShape;
use skein_engine::usage::{MeteredInvoker, Usage};
use skein_engine::{EngineError, Result};

use crate::dead_letter;
use crate::rescale::GroupSizes;

/// Replaces every function instance of the query (a redeployment with a
/// new run id): fresh instances load the last committed state.
#[async_trait]
pub trait Redeploy: Send + Sync {
    async fn redeploy(&self) -> Result<()>;
}

/// What a probe says about a function's stage (the bootstrap's report).
#[derive(Debug, Default, Deserialize)]
pub struct ProbeAnswer {
    /// What the stage waits for; empty when nothing is pending or the
    /// instance has not built its stage yet.
    #[serde(default)]
    pub pending: Vec<String>,
}

pub struct LambdaEpochs<'a> {
    shape: PlanShape,
    invoker: &'a dyn Invoker,
    /// The deployment's store, where dead letters are recorded.
    store: Arc<dyn ObjectStore>,
    /// Functions that take payloads: the ones that can wait for input
    /// (those of each group's size now).
    receivers: std::sync::Mutex<Vec<String>>,
    redeploy: Option<&'a dyn Redeploy>,
    /// A checkpointing query's group sizes, which a rescale changes.
    sizes: Option<&'a GroupSizes>,
    /// Sums the usage the triggers' answers report, when given.
    metered: Option<&'a MeteredInvoker<'a>>,
}

impl<'a> LambdaEpochs<'a> {
    /// The runtime of the query whose plan has `shape`.
    pub fn new(
        shape: PlanShape,
        invoker: &'a dyn Invoker,
        store: Arc<dyn ObjectStore>,
        redeploy: Option<&'a dyn Redeploy>,
    ) -> Self {
        let receivers = shape.receivers();
        LambdaEpochs {
            shape,
            invoker,
            store,
            receivers: std::sync::Mutex::new(receivers),
            redeploy,
            sizes: None,
            metered: None,
        }
    }

    /// Run the groups at `sizes`, and carry out the rescales asked of it
    /// after each commit (which needs `redeploy`).
    pub fn sized(mut self, sizes: &'a GroupSizes) -> Self {
        *self.receivers.lock().expect("receivers") = sizes.shape().receivers();
        self.sizes = Some(sizes);
        self
    }

    /// Fire through `metered`, whose totals are this runtime's usage.
    pub fn metered(mut self, metered: &'a MeteredInvoker<'a>) -> Self {
        self.invoker = metered;
        self.metered = Some(metered);
        self
    }

    /// What every function that takes payloads still waits for.
    pub async fn pending(&self) -> Result<Vec<String>> {
        let receivers = self.receivers.lock().expect("receivers").clone();
        let probes = receivers.iter().map(|name| async move {
            let answer = invoke_with_retry(
                self.invoker,
                name,
                br#"{"probe":{}}"#.to_vec(),
                InvocationType::Sync,
                Duration::from_secs(2),
                100,
            )
            .await?;
            serde_json::from_slice::<ProbeAnswer>(&answer)
                .map(|a| a.pending)
                .map_err(|e| {
                    EngineError::invocation_failed(
                        name.clone(),
                        format!("the probe's answer is not a report: {e}"),
                    )
                })
        });
        let mut out = vec![];
        for answer in join_all(probes).await {
            out.extend(answer?);
        }
        Ok(out)
    }
}

#[async_trait]
impl EpochRuntime for LambdaEpochs<'_> {
    fn window_step_ms(&self) -> Option<i64> {
        self.shape.window_step_ms
    }

    async fn run_epoch(&self, fire: EpochFire) -> Result<EpochOutcome> {
        skein_engine::driver::fire_epoch(&self.shape, self.invoker, fire).await
    }

    async fn check_complete(&self, epoch: u64) -> Result<()> {
        let dead = dead_letter::list(&self.store, &self.shape.query_code)
            .await
            .map_err(|e| not_committed(epoch, format!("reading dead letters: {e}")))?;
        if let Some(first) = dead.first() {
            return Err(not_committed(
                epoch,
                format!(
                    "{} async invocations were dead-lettered; first: {}",
                    dead.len(),
                    first["responsePayload"]
                ),
            ));
        }
        let pending = self.pending().await?;
        if !pending.is_empty() {
            return Err(not_committed(epoch, pending.join("; ")));
        }
        Ok(())
    }

    async fn committed(&self, epoch: u64, last_ran: &EpochOutcome) -> Result<()> {
        let (Some(sizes), Some(redeploy)) = (self.sizes, self.redeploy) else {
            return Ok(());
        };
        let before = sizes.layout();
        if !sizes.rescale_if_asked(epoch, redeploy).await? {
            sizes
                .autoscale(epoch, &self.usage().await, last_ran, redeploy)
                .await?;
        }
        if sizes.layout() != before {
            *self.receivers.lock().expect("receivers") = sizes.shape().receivers();
        }
        Ok(())
    }

    fn layout(&self) -> skein_engine::checkpoint::Layout {
        self.sizes.map(GroupSizes::layout).unwrap_or_default()
    }

    async fn usage(&self) -> Usage {
        self.metered.map(MeteredInvoker::total).unwrap_or_default()
    }

    async fn replace_instances(&self) -> Result<bool> {
        let Some(r) = self.redeploy else {
            return Ok(false);
        };
        r.redeploy().await?;
        // The failures of the attempt that was given up are run again from
        // the last commit; left in place they would hold up every commit.
        let moved = dead_letter::set_aside(&self.store, &self.shape.query_code).await?;
        if moved > 0 {
            tracing::warn!(moved, "dead letters of the failed attempt set aside");
        }
        Ok(true)
    }
}
