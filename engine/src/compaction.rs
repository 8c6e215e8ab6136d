//! Merging what an aggregating stage holds for its open windows.
//!
//! An aggregating stage receives partial aggregate rows (the accumulators'
//! state, one row per window and group key per sender per epoch) and holds
//! them until the watermark closes their window. Held as they came, they
//! grow with the number of epochs a window spans. A [`Compactor`] merges
//! them into one row per window and key with the stage's own aggregate
//! expressions in DataFusion's `PartialReduce` mode (state in, state out),
//! so what a member holds is bounded by open windows times keys.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::execution::TaskContext;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};

use crate::error::Result;
use crate::exec::{StageInput, StageInputExec, as_stage_input};

/// Held batches of one edge past which they are merged: each epoch adds
/// about one per sender, so a merge comes every few dozen epochs.
const MERGE_AT_BATCHES: usize = 32;

/// Merges the partial rows of one input edge.
#[derive(Debug)]
pub struct Compactor {
    edge: u32,
    leaf: Arc<StageInputExec>,
    plan: Arc<dyn ExecutionPlan>,
}

impl Compactor {
    /// One compactor per input edge that feeds a final aggregate directly
    /// (its rows are partial states): edges of joins and window functions
    /// hold rows and have none.
    pub fn for_plan(plan: &Arc<dyn ExecutionPlan>) -> BTreeMap<u32, Compactor> {
        let mut out = BTreeMap::new();
        collect(plan, &mut out);
        out
    }

    /// Whether the held batches are many enough to be worth a merge.
    pub fn wants(&self, held_batches: usize) -> bool {
        held_batches > MERGE_AT_BATCHES
    }

    /// The input edge this compactor merges.
    pub fn edge(&self) -> u32 {
        self.edge
    }

    /// The held partial rows merged into one row per window and key.
    pub async fn merge(
        &self,
        batches: Vec<RecordBatch>,
        ctx: Arc<TaskContext>,
    ) -> Result<Vec<RecordBatch>> {
        let bound: Arc<dyn ExecutionPlan> = Arc::new(self.leaf.bind(batches));
        let plan = self
            .plan
            .clone()
            .replace_children(vec![bound], crate::exec::recompute())?;
        let stream = plan.execute(0, ctx)?;
        Ok(datafusion::physical_plan::common::collect(stream).await?)
    }
}

fn collect(plan: &Arc<dyn ExecutionPlan>, out: &mut BTreeMap<u32, Compactor>) {
    if let Some(c) = compactor_at(plan) {
        out.insert(c.edge, c);
    }
    for child in plan.children() {
        collect(child, out);
    }
}

/// A compactor for the edge under this node, if it is a final aggregate
/// reading the edge unchanged and merging gives rows of the same schema.
fn compactor_at(plan: &Arc<dyn ExecutionPlan>) -> Option<Compactor> {
    let agg = plan.downcast_ref::<AggregateExec>()?;
    if !matches!(
        agg.mode(),
        AggregateMode::Final | AggregateMode::FinalPartitioned
    ) || !agg.group_expr().is_single()
    {
        return None;
    }
    let input = agg.input();
    let leaf = as_stage_input(input)?;
    let StageInput::Shuffle { shuffle_id } = leaf.input else {
        return None;
    };
    let merge = AggregateExec::try_new(
        AggregateMode::PartialReduce,
        agg.group_expr().clone(),
        agg.aggr_expr().to_vec(),
        agg.filter_expr().to_vec(),
        input.clone(),
        agg.input_schema(),
    )
    .ok()?;
    // Merged rows stand in for received ones: same columns, same types.
    let same = |a: &datafusion::arrow::datatypes::Schema,
                b: &datafusion::arrow::datatypes::Schema| {
        a.fields().len() == b.fields().len()
            && a.fields()
                .iter()
                .zip(b.fields())
                .all(|(x, y)| x.name() == y.name() && x.data_type() == y.data_type())
    };
    if !same(&merge.schema(), &input.schema()) {
        tracing::debug!(
            edge = shuffle_id,
            "partial rows of this edge are not merged: the merged schema differs"
        );
        return None;
    }
    Some(Compactor {
        edge: shuffle_id,
        leaf: Arc::new(StageInputExec::new(leaf.input.clone(), input.schema())),
        plan: Arc::new(merge),
    })
}
