//! The updating step of a payload stage: keep the input (or the
//! accumulators, or a join's sides) by key, and each epoch compute the
//! changes of the result for the keys it touched.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::record_batch::RecordBatch;

use super::payload_stage::Outgoing;
use super::{StageFunction, bind_leaves};
use crate::changelog;
use crate::compaction::Compactor;
use crate::error::Result;
use crate::exec::StageInput;
use crate::payload::{Arrived, batches_of};
use crate::updating::aggregate::AggregatePlan;
use crate::updating::keyed::concat;
use crate::updating::state::Due;
use crate::updating::{UpdatingPlan, UpdatingState};

/// Partial rows of one key past which an updating stage merges them.
const MERGE_AT_ROWS: usize = 8;

/// An updating stage's plan, split to compute changes, and its state.
pub(super) struct UpdatingStep {
    plan: Arc<UpdatingPlan>,
    pub(super) state: UpdatingState,
    /// Per input edge of partial aggregate rows: how to merge them.
    compactors: BTreeMap<u32, Compactor>,
}

impl UpdatingStep {
    /// The key columns of the rows this state keeps beyond its input
    /// edges' (what it emitted, an aggregate's groups): the same values,
    /// in the same order, as the key its senders hash. `None`: the state
    /// is one group, and its rows have no key.
    pub(super) fn kept_keys(&self) -> Option<Vec<usize>> {
        self.plan.state_key.clone()
    }

    pub(super) fn new(
        plan: Arc<UpdatingPlan>,
        state: UpdatingState,
        compactors: BTreeMap<u32, Compactor>,
    ) -> Self {
        UpdatingStep {
            plan,
            state,
            compactors,
        }
    }

    pub(super) fn bytes(&self) -> usize {
        self.state.bytes()
    }

    /// One epoch: take its rows, drop what outlived its TTL, and compute
    /// the changes when they are due.
    pub(super) async fn take(
        &mut self,
        f: &StageFunction,
        epoch: u64,
        edges: BTreeMap<u32, Vec<Arrived>>,
        last: bool,
    ) -> Result<Outgoing> {
        let spec = f.ctx.updating.clone().unwrap_or_default();
        self.state.begin_epoch(epoch);
        let joined = self.take_epoch(f, edges, spec.emit_every).await?;
        let expired = self.state.expire()?;
        if expired > 0 {
            tracing::debug!(stage = %f.name, rows = expired, "state TTL expired rows");
        }
        let emit_now = last || epoch.is_multiple_of(spec.emit_every.max(1));
        let due = if emit_now {
            self.state.take_due()
        } else {
            Due::Nothing
        };
        let changes = match (&due, joined) {
            (_, Some(changes)) => Some(changes),
            (Due::Nothing, None) => None,
            (due, None) if self.state.aggregates() => {
                let result = self.state.aggregate_result(due)?;
                Some(self.state.emit(due, result)?)
            }
            (due, None) => Some(self.recompute(f, due).await?),
        };
        let spilled = self.state.spill_cold()?;
        if spilled > 0 {
            tracing::debug!(stage = %f.name, groups = spilled, "cold groups moved to local disk");
        }
        crate::metrics::state_bytes(&f.name, self.state.bytes());
        let rows = self.state.rows();
        crate::metrics::state_rows(&f.ctx.stage_name(), f.ctx.member, rows);
        if let Some(on_disk) = self.state.spilled_rows() {
            crate::metrics::state_spilled_rows(&f.ctx.stage_name(), f.ctx.member, on_disk);
        }
        if let Some(on_disk) = self.state.spilled_values() {
            crate::metrics::state_spilled_values(&f.ctx.stage_name(), f.ctx.member, on_disk);
        }
        Ok(Outgoing::Changes(self.plan.clone(), changes))
    }

    /// Take an epoch's rows into the state, as the stage's path wants
    /// them; the changes of an incremental join's pairs, if it is one.
    async fn take_epoch(
        &mut self,
        f: &StageFunction,
        edges: BTreeMap<u32, Vec<Arrived>>,
        emit_every: u64,
    ) -> Result<Option<(RecordBatch, RecordBatch)>> {
        let plan = self.plan.clone();
        // An incremental join emits what its changed rows join to; with an
        // emit interval, changes wait, and only the recompute path can tell
        // after a restart what waited.
        let join = plan.join.as_ref().filter(|_| emit_every <= 1);
        match (&plan.aggregate, join) {
            (Some(agg), _) => self.take_aggregate_input(f, agg, edges).await?,
            (None, Some(join)) => {
                return Ok(Some(self.join_changes(f, &plan.core, join, edges).await?));
            }
            (None, None) => {
                for (edge, arrived) in edges {
                    let batches = batches_of(arrived);
                    // Kept as one batch: an epoch's payloads can be many
                    // small batches, each with buffers of its own.
                    if let Some(first) = batches.first() {
                        let batch = concat(&first.schema(), &batches)?;
                        self.state.take_input(edge, batch, f.edge_updates(edge))?;
                    }
                }
            }
        }
        Ok(None)
    }

    /// An incremental aggregate's rows into its accumulators: a join's new
    /// pairs, or the rows as the operators below the aggregate make them.
    async fn take_aggregate_input(
        &mut self,
        f: &StageFunction,
        agg: &AggregatePlan,
        edges: BTreeMap<u32, Vec<Arrived>>,
    ) -> Result<()> {
        if let (Some(join), Some(below)) = (&agg.join, &agg.input) {
            let (retract, insert) = self.join_changes(f, below, join, edges).await?;
            self.state.forget_touched_rows();
            return self.state.take_aggregate_input(retract, insert);
        }
        let (mut retract, mut insert) = (vec![], vec![]);
        for (edge, arrived) in edges {
            for b in batches_of(arrived) {
                if f.edge_updates(edge) {
                    let (r, i) = changelog::split(&b)?;
                    retract.push(r);
                    insert.push(i);
                } else {
                    insert.push(b);
                }
            }
        }
        let retract = aggregate_input(f, agg, retract).await?;
        let insert = aggregate_input(f, agg, insert).await?;
        self.state.take_aggregate_input(retract, insert)
    }

    /// The recompute path: the core run again over the due keys' rows,
    /// what changed since it last emitted, and the kept rows trimmed (a
    /// top-N cut to its result, partial aggregates merged).
    async fn recompute(
        &mut self,
        f: &StageFunction,
        due: &Due,
    ) -> Result<(RecordBatch, RecordBatch)> {
        let plan = self.plan.clone();
        let mut bound = BTreeMap::new();
        for edge in plan.edge_keys.keys() {
            bound.insert(*edge, self.state.input_rows(*edge, due)?);
        }
        let core = bind_leaves(&plan.core, &mut |leaf| match leaf {
            StageInput::Shuffle { shuffle_id } => Ok(bound
                .remove(shuffle_id)
                .map(|b| vec![b])
                .unwrap_or_default()),
            StageInput::Source { table, .. } => Err(f.source_beside_exchanges(table)),
        })?;
        let result = f.execute(&core).await?;
        let schema = plan.core.schema();
        let result = concat(&schema, &result.into_iter().flatten().collect::<Vec<_>>())?;
        let kept = match &plan.top_n {
            Some(top_n) => Some((top_n.edge, top_n.kept(&result)?)),
            None => None,
        };
        let changes = self.state.emit(due, result)?;
        if let Some((edge, kept)) = kept {
            self.state.keep_only(edge, due, kept)?;
        }
        self.merge_partials(f, due).await?;
        Ok(changes)
    }

    /// Partial aggregates of a key pile up one per epoch it is touched:
    /// merged into one once there are a few.
    async fn merge_partials(&mut self, f: &StageFunction, due: &Due) -> Result<()> {
        for (edge, compactor) in &self.compactors {
            let keys = self.state.to_merge(*edge, due, MERGE_AT_ROWS);
            if keys.is_empty() {
                continue;
            }
            let rows = self.state.rows_of(*edge, &keys)?;
            let merged = compactor
                .merge(vec![rows.clone()], f.task_ctx.clone())
                .await?;
            let schema = rows.schema();
            self.state
                .replace(*edge, &keys, concat(&schema, &merged)?)?;
        }
        Ok(())
    }
}

/// An aggregate's input rows from its edge's `batches`: the operators
/// between the edge and the aggregate run on them, if there are any.
async fn aggregate_input(
    f: &StageFunction,
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
            f.execute(&bound).await?.into_iter().flatten().collect()
        }
    };
    let rows = concat(&agg.input_schema, &rows)?;
    // The schema a checkpoint reads it back with.
    Ok(rows
        .clone()
        .with_schema(agg.input_schema.clone())
        .unwrap_or(rows))
}
