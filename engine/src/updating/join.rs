//! An inner join of two streams that only append. Its result only appends
//! too: a pair, once matched, stays matched. So an epoch's output is the
//! pairs its new rows make, `ΔL ⋈ (R + ΔR)` and `L ⋈ ΔR`, each new row
//! meeting the other side's rows of its key; the stage keeps both sides'
//! rows by key, and nothing of what it emitted.

use std::sync::Arc;

use datafusion::common::JoinType;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::projection::ProjectionExec;

use super::aggregate_plan::leaf_below;
use crate::context::InputEdge;
use crate::exec::passes_batches_through;

/// The two edges of an inner join over rows that only append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendJoin {
    /// The edge of the join's left (build) side.
    pub left: u32,
    /// The edge of its right (probe) side.
    pub right: u32,
}

impl AppendJoin {
    /// The join `core` is, if it is an inner hash join (under operators
    /// that reshape rows one at a time) of two edges that only append.
    pub fn of(core: &Arc<dyn ExecutionPlan>, edges: &[InputEdge]) -> Option<Self> {
        let [a, b] = edges else { return None };
        if a.updating || b.updating || a.shuffle_id == b.shuffle_id {
            return None;
        }
        let mut node = core.clone();
        while node.downcast_ref::<ProjectionExec>().is_some()
            || node.downcast_ref::<FilterExec>().is_some()
            || passes_batches_through(&node)
        {
            node = node.children().first().copied()?.clone();
        }
        let join = node.downcast_ref::<HashJoinExec>()?;
        if *join.join_type() != JoinType::Inner {
            return None;
        }
        let (left, _) = leaf_below(join.left())?;
        let (right, _) = leaf_below(join.right())?;
        (left != right).then_some(AppendJoin { left, right })
    }
}
