//! Changelogs through a stage's plan: a stateless stage over a changelog
//! runs its plan on the retractions and on the inserts apart and tags what
//! comes out; an updating stage's changes run the same way through the
//! row-by-row operators above its core.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::execution::TaskContext;
use datafusion::physical_plan::ExecutionPlan;
use futures::future::try_join_all;

use super::{StageFunction, StageOutput, bind_leaves};
use crate::changelog::{self, INSERT, RETRACT};
use crate::error::{EngineError, Result};
use crate::exec::StageInput;
use crate::lookup::set_aside::SetAside;
use crate::payload::PayloadHeader;
use crate::updating::UpdatingPlan;
use crate::updating::split::CORE_OUTPUT;

/// A changelog as it leaves a stage: per output partition, its batches.
pub(super) type Parts = Vec<Vec<RecordBatch>>;

impl StageFunction {
    /// Whether the rows of input `edge` are a changelog.
    pub(super) fn edge_updates(&self, edge: u32) -> bool {
        self.ctx
            .inputs
            .iter()
            .any(|e| e.shuffle_id == edge && e.updating)
    }

    /// Whether a stateless stage's input is a changelog on some edge.
    pub(super) fn takes_changes(&self) -> bool {
        self.ctx.inputs.iter().any(|e| e.updating)
    }

    /// The core's changes through the row-by-row operators above it, as
    /// the tagged parts the stage sends.
    pub(super) async fn through_tail(
        &self,
        plan: &UpdatingPlan,
        retract: RecordBatch,
        insert: RecordBatch,
    ) -> Result<(SchemaRef, Parts)> {
        let Some(tail) = &plan.tail else {
            let parts = vec![vec![
                changelog::tag(&retract, RETRACT)?,
                changelog::tag(&insert, INSERT)?,
            ]];
            return Ok((retract.schema(), parts));
        };
        let over = |rows: RecordBatch| {
            bind_leaves(tail, &mut |leaf| match leaf {
                StageInput::Shuffle {
                    shuffle_id: CORE_OUTPUT,
                } => Ok(vec![rows.clone()]),
                other => Err(EngineError::Context(format!(
                    "an updating stage's tail reads {other:?}"
                ))),
            })
        };
        let (r, i) = (over(retract)?, over(insert)?);
        Ok((tail.schema(), self.tagged(&r, &i).await?))
    }

    /// A stateless stage over a changelog: its plan runs on the
    /// retractions and on the inserts of each edge apart.
    pub(super) async fn run_changes(
        &self,
        output: &StageOutput,
        edges: BTreeMap<u32, Vec<RecordBatch>>,
        header: PayloadHeader,
    ) -> Result<u64> {
        let mut retracts: BTreeMap<u32, Vec<RecordBatch>> = BTreeMap::new();
        let mut inserts: BTreeMap<u32, Vec<RecordBatch>> = BTreeMap::new();
        for (edge, batches) in edges {
            let updating = self.edge_updates(edge);
            for b in batches {
                if updating {
                    let (r, i) = changelog::split(&b)?;
                    retracts.entry(edge).or_default().push(r);
                    inserts.entry(edge).or_default().push(i);
                } else {
                    inserts.entry(edge).or_default().push(b);
                }
            }
        }
        let bind = |mut data: BTreeMap<u32, Vec<RecordBatch>>| {
            bind_leaves(&output.plan, &mut |leaf| match leaf {
                StageInput::Shuffle { shuffle_id } => {
                    Ok(data.remove(shuffle_id).unwrap_or_default())
                }
                StageInput::Source { table, .. } => Err(self.source_beside_exchanges(table)),
            })
        };
        let (r, i) = (bind(retracts)?, bind(inserts)?);
        let parts = self.tagged(&r, &i).await?;
        let rows = parts.iter().flatten().map(|b| b.num_rows() as u64).sum();
        self.route_changes(output, header, Some((output.plan.schema(), parts)))
            .await?;
        Ok(rows)
    }

    /// Run `retract` and `insert` (one plan bound to each kind of rows) and
    /// tag their output, retractions first in every partition.
    pub(super) async fn tagged(
        &self,
        retract: &Arc<dyn ExecutionPlan>,
        insert: &Arc<dyn ExecutionPlan>,
    ) -> Result<Parts> {
        let r = self.execute(retract).await?;
        let i = self.execute(insert).await?;
        let mut parts = vec![];
        for (rs, is) in r.into_iter().zip(i) {
            let mut part = vec![];
            for b in rs {
                part.push(changelog::tag(&b, RETRACT)?);
            }
            for b in is {
                part.push(changelog::tag(&b, INSERT)?);
            }
            parts.push(part);
        }
        Ok(parts)
    }

    /// Every output partition of a bound plan, collected.
    pub(super) async fn execute(&self, plan: &Arc<dyn ExecutionPlan>) -> Result<Parts> {
        self.execute_in(plan, self.task_ctx.clone()).await
    }

    /// Every output partition of a bound plan, collected, with the rows its
    /// lookup joins set aside (the function's second output).
    pub(super) async fn execute_setting_aside(
        &self,
        plan: &Arc<dyn ExecutionPlan>,
    ) -> Result<(Parts, Arc<SetAside>)> {
        let set_aside = Arc::new(SetAside::default());
        let config = self
            .task_ctx
            .session_config()
            .clone()
            .with_extension(set_aside.clone());
        let t = &self.task_ctx;
        // A context per run (its maps are a few hundred entries): runs side
        // by side keep their rows apart.
        let ctx = TaskContext::new(
            t.task_id(),
            t.session_id(),
            config,
            t.scalar_functions().clone(),
            t.higher_order_functions().clone(),
            t.aggregate_functions().clone(),
            t.window_functions().clone(),
            t.runtime_env(),
        );
        let parts = self.execute_in(plan, Arc::new(ctx)).await?;
        Ok((parts, set_aside))
    }

    async fn execute_in(
        &self,
        plan: &Arc<dyn ExecutionPlan>,
        ctx: Arc<TaskContext>,
    ) -> Result<Parts> {
        let partitions = plan.properties().output_partitioning().partition_count();
        Ok(try_join_all((0..partitions).map(|i| {
            let plan = plan.clone();
            let ctx = ctx.clone();
            async move {
                let stream = plan.execute(i, ctx)?;
                datafusion::physical_plan::common::collect(stream).await
            }
        }))
        .await?)
    }

    /// Send a changelog on: its schema (without the op column) and parts,
    /// or nothing but the metadata that lets counts downstream complete.
    pub(super) async fn route_changes(
        &self,
        output: &StageOutput,
        header: PayloadHeader,
        parts: Option<(SchemaRef, Parts)>,
    ) -> Result<()> {
        let schema = changelog::with_op(&match &parts {
            Some((s, _)) => s.clone(),
            None => output.plan.schema(),
        });
        let parts = parts.map(|(_, p)| p).unwrap_or_default();
        self.route(output, header, Some((schema, parts))).await
    }
}
