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
use crate::updating::aggregate::AggregatePlan;
use crate::updating::join::AppendJoin;
use crate::updating::keyed::concat;
use crate::updating::split::CORE_OUTPUT;
use crate::updating::state::Due;
use crate::updating::{UpdatingPlan, UpdatingState};

/// Partial rows of one key past which an updating stage merges them.
const MERGE_AT_ROWS: usize = 8;

/// A changelog as it leaves a stage: per output partition, its batches.
type Parts = Vec<Vec<RecordBatch>>;

impl StageFunction {
    /// Whether a stateless stage's input is a changelog on some edge.
    pub(super) fn takes_changes(&self) -> bool {
        self.ctx.inputs.iter().any(|e| e.updating)
    }

    /// One epoch of an updating stage: take its rows, drop what outlived
    /// its TTL, compute the changes when they are due, and send them on
    /// while the state is written.
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
        let u = state
            .updating
            .as_mut()
            .ok_or_else(|| EngineError::Context(format!("{}: no updating state", self.name)))?;
        u.begin_epoch(epoch);
        let joined = self
            .take_epoch(&plan, u, input.edges, spec.emit_every)
            .await?;
        let expired = u.expire()?;
        if expired > 0 {
            tracing::debug!(stage = %self.name, rows = expired, "state TTL expired rows");
        }
        let emit_now = input.last || epoch.is_multiple_of(spec.emit_every.max(1));
        let due = if emit_now { u.take_due() } else { Due::Nothing };
        let changes = match (&due, joined) {
            (_, Some(rows)) => Some((RecordBatch::new_empty(rows.schema()), rows)),
            (Due::Nothing, None) => None,
            (due, None) if u.aggregates() => {
                let result = u.aggregate_result(due)?;
                Some(u.emit(due, result)?)
            }
            (due, None) => Some(self.recompute(&plan, u, due).await?),
        };
        crate::metrics::state_bytes(&self.name, u.bytes());
        crate::metrics::state_rows(&self.ctx.stage_name(), self.ctx.member, u.rows());
        let to_save = self.state_to_save(state, epoch, input.last || input.checkpoint)?;
        let output = &self.outputs[0];
        let run = async {
            let out = match changes {
                Some((retract, insert)) => Some(self.through_tail(&plan, retract, insert).await?),
                None => None,
            };
            let rows = out
                .iter()
                .flat_map(|(_, parts)| parts.iter().flatten())
                .map(|b| b.num_rows() as u64)
                .sum();
            self.route_changes(output, header, out).await?;
            Ok(rows)
        };
        let (written, rows) = tokio::join!(self.write_state(to_save), run);
        if let Some(w) = written? {
            state.saved.note(w);
        }
        rows
    }

    /// Take an epoch's rows into the state, as the stage's path wants
    /// them; the pairs a join whose result appends made, if it is one.
    async fn take_epoch(
        &self,
        plan: &UpdatingPlan,
        u: &mut UpdatingState,
        edges: BTreeMap<u32, Vec<crate::payload::Arrived>>,
        emit_every: u64,
    ) -> Result<Option<RecordBatch>> {
        let updating = |edge: u32| {
            self.ctx
                .inputs
                .iter()
                .any(|e| e.shuffle_id == edge && e.updating)
        };
        // A join whose result appends emits what its new rows join to; with
        // an emit interval, changes wait, and only the recompute path can
        // tell after a restart what waited.
        let append_join = plan.append_join.filter(|_| emit_every <= 1);
        match (&plan.aggregate, append_join) {
            (Some(agg), _) => match (agg.join, &agg.input) {
                (Some(join), Some(below)) => {
                    let pairs = self.join_new_rows(below, join, u, edges).await?;
                    u.forget_touched_rows();
                    let none = RecordBatch::new_empty(agg.input_schema.clone());
                    u.take_aggregate_input(none, pairs)?;
                }
                _ => {
                    // The accumulators take the rows as the operators
                    // below the aggregate make them.
                    let (mut retract, mut insert) = (vec![], vec![]);
                    for (edge, arrived) in edges {
                        for b in crate::payload::batches_of(arrived) {
                            if updating(edge) {
                                let (r, i) = changelog::split(&b)?;
                                retract.push(r);
                                insert.push(i);
                            } else {
                                insert.push(b);
                            }
                        }
                    }
                    let retract = self.aggregate_input(agg, retract).await?;
                    let insert = self.aggregate_input(agg, insert).await?;
                    u.take_aggregate_input(retract, insert)?;
                }
            },
            (None, Some(join)) => {
                return Ok(Some(self.join_new_rows(&plan.core, join, u, edges).await?));
            }
            (None, None) => {
                for (edge, arrived) in edges {
                    let batches = crate::payload::batches_of(arrived);
                    // Kept as one batch: an epoch's payloads can be many
                    // small batches, each with buffers of its own.
                    if let Some(first) = batches.first() {
                        u.take_input(edge, concat(&first.schema(), &batches)?, updating(edge))?;
                    }
                }
            }
        }
        Ok(None)
    }

    /// The recompute path: the core run again over the due keys' rows,
    /// what changed since it last emitted, and the kept rows trimmed (a
    /// top-N cut to its result, partial aggregates merged).
    async fn recompute(
        &self,
        plan: &UpdatingPlan,
        u: &mut UpdatingState,
        due: &Due,
    ) -> Result<(RecordBatch, RecordBatch)> {
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
        let kept = match &plan.top_n {
            Some(top_n) => Some((top_n.edge, top_n.kept(&result)?)),
            None => None,
        };
        let changes = u.emit(due, result)?;
        if let Some((edge, kept)) = kept {
            u.keep_only(edge, due, kept)?;
        }
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
        Ok(changes)
    }

    /// The core's changes through the row-by-row operators above it, as
    /// the tagged parts the stage sends.
    async fn through_tail(
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

    /// Keep an epoch's new rows of a join whose result appends, and the
    /// pairs they make: new left rows with the right rows of their keys
    /// (kept and new), and kept left rows with the new right rows.
    async fn join_new_rows(
        &self,
        core: &Arc<dyn ExecutionPlan>,
        join: AppendJoin,
        u: &mut UpdatingState,
        edges: BTreeMap<u32, Vec<crate::payload::Arrived>>,
    ) -> Result<RecordBatch> {
        let mut new: BTreeMap<u32, Vec<RecordBatch>> = BTreeMap::new();
        for (edge, arrived) in edges {
            new.entry(edge)
                .or_default()
                .extend(crate::payload::batches_of(arrived));
        }
        let side = |edge: u32| -> Result<RecordBatch> {
            let schema = u.edge_schema(edge).ok_or_else(|| {
                EngineError::Context(format!("{}: no input edge {edge}", self.name))
            })?;
            concat(
                &schema,
                new.get(&edge).map(Vec::as_slice).unwrap_or_default(),
            )
        };
        let (new_left, new_right) = (side(join.left)?, side(join.right)?);
        let right_kept = u.rows_of(join.right, &u.keys_in(join.left, &new_left)?)?;
        let left_kept = u.rows_of(join.left, &u.keys_in(join.right, &new_right)?)?;
        u.take_input(join.left, new_left.clone(), false)?;
        u.take_input(join.right, new_right.clone(), false)?;
        let mut pairs = vec![];
        for (left, right) in [
            (vec![new_left], vec![right_kept, new_right.clone()]),
            (vec![left_kept], vec![new_right]),
        ] {
            if left.iter().chain(&right).all(|b| b.num_rows() == 0) {
                continue;
            }
            let mut sides = BTreeMap::from([(join.left, left), (join.right, right)]);
            let bound = bind_leaves(core, &mut |leaf| match leaf {
                StageInput::Shuffle { shuffle_id } => {
                    Ok(sides.remove(shuffle_id).unwrap_or_default())
                }
                StageInput::Source { table, .. } => Err(EngineError::plan(format!(
                    "stage {} has a source leaf {table} beside exchanges",
                    self.name
                ))),
            })?;
            pairs.extend(self.execute(&bound).await?.into_iter().flatten());
        }
        concat(&core.schema(), &pairs)
    }

    /// An aggregate's input rows from its edge's `batches`: the operators
    /// between the edge and the aggregate run on them, if there are any.
    async fn aggregate_input(
        &self,
        agg: &AggregatePlan,
        batches: Vec<RecordBatch>,
    ) -> Result<RecordBatch> {
        let batches: Vec<RecordBatch> = batches.into_iter().filter(|b| b.num_rows() > 0).collect();
        let rows = match &agg.input {
            _ if batches.is_empty() => vec![],
            None => batches,
            Some(below) => {
                let mut once = Some(batches);
                let bound = bind_leaves(below, &mut |_| Ok(once.take().unwrap_or_default()))?;
                self.execute(&bound).await?.into_iter().flatten().collect()
            }
        };
        let rows = concat(&agg.input_schema, &rows)?;
        // The schema a checkpoint reads it back with.
        Ok(rows
            .clone()
            .with_schema(agg.input_schema.clone())
            .unwrap_or(rows))
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
