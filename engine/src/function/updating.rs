//! Stages that send a changelog: an updating stage's epoch (keep the
//! input, compute the touched keys again, send what changed), and a
//! stateless stage over a changelog (run the plan on the retractions and on
//! the inserts apart, and tag what comes out).

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::physical_plan::ExecutionPlan;
use futures::future::try_join_all;

use super::{StageFunction, StageOutput, StageState, bind_leaves};
use crate::arena::EpochInput;
use crate::changelog::{self, INSERT, RETRACT};
use crate::error::{EngineError, Result};
use crate::exec::StageInput;
use crate::payload::PayloadHeader;
use crate::updating::keyed::concat;
use crate::updating::split::CORE_OUTPUT;
use crate::updating::state::Due;

/// Partial rows of one key past which an updating stage merges them.
const MERGE_AT_ROWS: usize = 8;

/// A changelog as it leaves a stage: per output partition, its batches.
type Parts = Vec<Vec<RecordBatch>>;

impl StageFunction {
    /// Whether a stateless stage's input is a changelog on some edge.
    pub(super) fn takes_changes(&self) -> bool {
        self.ctx.inputs.iter().any(|e| e.updating)
    }

    /// One epoch of an updating stage.
    pub(super) async fn run_updating(
        &self,
        state: &mut StageState,
        input: EpochInput,
        header: PayloadHeader,
    ) -> Result<u64> {
        let plan = self
            .updating
            .clone()
            .ok_or_else(|| EngineError::Context(format!("{}: no updating plan", self.name)))?;
        let spec = self.ctx.updating.clone().unwrap_or_default();
        let epoch = input.epoch;
        let updating_edges: BTreeMap<u32, bool> = self
            .ctx
            .inputs
            .iter()
            .map(|e| (e.shuffle_id, e.updating))
            .collect();
        let u = state
            .updating
            .as_mut()
            .ok_or_else(|| EngineError::Context(format!("{}: no updating state", self.name)))?;
        u.begin_epoch(epoch);
        for (edge, arrived) in input.edges {
            let updating = updating_edges.get(&edge).copied().unwrap_or(false);
            for b in crate::payload::batches_of(arrived) {
                u.take_input(edge, b, updating)?;
            }
        }
        let expired = u.expire()?;
        if expired > 0 {
            tracing::debug!(stage = %self.name, rows = expired, "state TTL expired rows");
        }
        let emit_now = input.last || epoch.is_multiple_of(spec.emit_every.max(1));
        let due = if emit_now { u.take_due() } else { Due::Nothing };
        let changes = match &due {
            Due::Nothing => None,
            due => {
                let mut bound = BTreeMap::new();
                for edge in plan.edge_keys.keys() {
                    bound.insert(*edge, u.input_rows(*edge, due)?);
                }
                let core = bind_leaves(&plan.core, &mut |leaf| match leaf {
                    StageInput::Shuffle { shuffle_id } => Ok(bound
                        .remove(shuffle_id)
                        .map(|b| vec![b])
                        .unwrap_or_default()),
                    StageInput::Source { table, .. } => Err(EngineError::plan(format!(
                        "stage {} has a source leaf {table} beside exchanges",
                        self.name
                    ))),
                })?;
                let result = self.execute(&core).await?;
                let schema = plan.core.schema();
                let result = concat(&schema, &result.into_iter().flatten().collect::<Vec<_>>())?;
                let changes = u.emit(due, result)?;
                // Partial aggregates of a key pile up one per epoch it is
                // touched: merged into one once there are a few.
                for (edge, compactor) in &self.compactors {
                    let keys = u.to_merge(*edge, due, MERGE_AT_ROWS);
                    if keys.is_empty() {
                        continue;
                    }
                    let rows = u.rows_of(*edge, &keys)?;
                    let merged = compactor
                        .merge(vec![rows.clone()], self.task_ctx.clone())
                        .await?;
                    let schema = rows.schema();
                    u.replace(*edge, &keys, concat(&schema, &merged)?)?;
                }
                Some(changes)
            }
        };
        crate::metrics::state_bytes(&self.name, u.bytes());
        crate::metrics::state_rows(&self.ctx.stage_name(), self.ctx.member, u.rows());
        let to_save = self.state_to_save(state, epoch, input.last || input.checkpoint)?;
        let output = &self.outputs[0];
        let run = async {
            let Some((retract, insert)) = changes else {
                self.route_changes(output, header, None).await?;
                return Ok(0);
            };
            let (schema, parts) = match &plan.tail {
                None => (
                    retract.schema(),
                    vec![vec![
                        changelog::tag(&retract, RETRACT)?,
                        changelog::tag(&insert, INSERT)?,
                    ]],
                ),
                Some(tail) => {
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
                    (tail.schema(), self.tagged(&r, &i).await?)
                }
            };
            let rows = parts.iter().flatten().map(|b| b.num_rows() as u64).sum();
            self.route_changes(output, header, Some((schema, parts)))
                .await?;
            Ok(rows)
        };
        let (written, rows) = tokio::join!(self.write_state(to_save), run);
        if let Some(w) = written? {
            state.saved.note(w);
        }
        rows
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
            let updating = self
                .ctx
                .inputs
                .iter()
                .any(|e| e.shuffle_id == edge && e.updating);
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
                StageInput::Source { table, .. } => Err(EngineError::plan(format!(
                    "stage {} has a source leaf {table} beside exchanges",
                    self.name
                ))),
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
        let partitions = plan.properties().output_partitioning().partition_count();
        Ok(try_join_all((0..partitions).map(|i| {
            let plan = plan.clone();
            let ctx = self.task_ctx.clone();
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
