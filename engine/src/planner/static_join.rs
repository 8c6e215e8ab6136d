//! A join of a stream with a bounded input (a `VALUES` list, a
//! `generate_series`, a table in memory) needs no state: each epoch's
//! stream rows meet the whole bounded side and are answered at once, so the
//! result only appends (NEXMark q13's side input).
//!
//! DataFusion plans such a join like any other, both sides hash-exchanged.
//! Cut as it stands, the bounded side would become a stage of its own that
//! sends its rows once, and the join would keep them, and every stream row
//! ever seen, as updating state. Instead the join builds its hash table from
//! the bounded side inside the stage that probes it, each epoch: the bounded
//! side is no stage and the join holds nothing across epochs
//! (see [`is_static_build`]).
//!
//! Only joins whose result never holds an unmatched row of the bounded side
//! qualify (inner, and outer, semi or anti joins that keep the stream's
//! side): those rows could not be told once, at the right moment.

use std::sync::Arc;

use datafusion::common::JoinType;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;

use datafusion::common::Result as DfResult;

use crate::error::Result;
use crate::exec::{SourceScanExec, StageInputExec, recompute};

/// Whether a sub-plan reads no stream: no source table and no stage input.
fn is_bounded(plan: &Arc<dyn ExecutionPlan>) -> bool {
    let mut streams = false;
    let _ = plan.apply(|node| {
        if node.downcast_ref::<SourceScanExec>().is_some()
            || node.downcast_ref::<StageInputExec>().is_some()
        {
            streams = true;
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    !streams
}

/// A bounded side without its hash exchange, if it then is one partition
/// (the build side of a collect-left join is read whole).
fn unexchanged(plan: &Arc<dyn ExecutionPlan>) -> Option<Arc<dyn ExecutionPlan>> {
    let inner = match plan.downcast_ref::<RepartitionExec>() {
        Some(r) => r.input().clone(),
        None => plan.clone(),
    };
    (inner.properties().output_partitioning().partition_count() == 1).then_some(inner)
}

/// Whether a join that builds from its left side drops the build side's
/// unmatched rows: each output row then comes from one probe-side row.
fn keeps_only_probe_rows(join_type: JoinType) -> bool {
    matches!(
        join_type,
        JoinType::Inner | JoinType::Right | JoinType::RightSemi | JoinType::RightAnti
    )
}

/// The join rebuilt to build from its (bounded) left side in place.
fn build_from_left(join: &HashJoinExec) -> DfResult<Option<Arc<dyn ExecutionPlan>>> {
    let Some(left) = unexchanged(join.left()) else {
        return Ok(None);
    };
    let rebuilt = join
        .builder()
        .reset_state()
        .with_partition_mode(PartitionMode::CollectLeft)
        .with_new_children(vec![left, join.right().clone()])?
        .recompute_properties()
        .build_exec()?;
    Ok(Some(rebuilt))
}

/// [`build_from_left`] on a join whose sides were swapped: the swap may put
/// a projection over it to keep the columns' order.
fn build_swapped(swapped: Arc<dyn ExecutionPlan>) -> DfResult<Option<Arc<dyn ExecutionPlan>>> {
    if let Some(join) = swapped.downcast_ref::<HashJoinExec>() {
        return build_from_left(join);
    }
    let Some(join) = swapped
        .downcast_ref::<ProjectionExec>()
        .and_then(|p| p.input().downcast_ref::<HashJoinExec>())
    else {
        return Ok(None);
    };
    match build_from_left(join)? {
        Some(built) => Ok(Some(swapped.replace_children(vec![built], recompute())?)),
        None => Ok(None),
    }
}

/// Every stream-with-bounded-input hash join in `plan` built from its
/// bounded side in place (see the module).
pub(super) fn build_bounded_sides_in_place(
    plan: Arc<dyn ExecutionPlan>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let rewritten = plan.transform_up(|node| {
        let Some(join) = node.downcast_ref::<HashJoinExec>() else {
            return Ok(Transformed::no(node));
        };
        let built = match (is_bounded(join.left()), is_bounded(join.right())) {
            (true, false) if keeps_only_probe_rows(*join.join_type()) => build_from_left(join)?,
            (false, true) if keeps_only_probe_rows(join.join_type().swap()) => {
                // A dynamic filter built for the old order forbids the swap.
                let fresh = join.builder().reset_state().build()?;
                build_swapped(fresh.swap_inputs(*join.partition_mode())?)?
            }
            _ => None,
        };
        Ok(match built {
            Some(plan) => Transformed::yes(plan),
            None => Transformed::no(node),
        })
    })?;
    Ok(rewritten.data)
}

/// Whether `plan` is a join that builds from a bounded side in place: it
/// holds nothing across epochs, and its build side is no state either.
pub fn is_static_build(plan: &Arc<dyn ExecutionPlan>) -> bool {
    plan.downcast_ref::<HashJoinExec>().is_some_and(|j| {
        *j.partition_mode() == PartitionMode::CollectLeft
            && keeps_only_probe_rows(*j.join_type())
            && is_bounded(j.left())
            && !is_bounded(j.right())
    })
}
