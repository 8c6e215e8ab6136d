//! A join of two streams, run on each epoch's changes.
//!
//! Inner: the change of `L ⋈ R` when `L` gains `ΔL` and `R` gains `ΔR` is
//! `ΔL ⋈ (R + ΔR) + L ⋈ ΔR`: each changed row meets the other side's rows
//! of its key. Over streams that only append every change is an insert and
//! so is every pair: the result only appends. Over a changelog a retracted
//! row's pairs are retracted (a retraction joined with an insert is one;
//! two retractions do not meet, as the formula joins the old `L` with
//! `ΔR`).
//!
//! Left or right outer, with `P` the side whose unmatched rows are padded
//! with nulls and `O` the other: `P ⟕ O = P ⋈ O + pad(P, O)`, so the change
//! is `ΔP ⟕ (O + ΔO) + P ⋈ ΔO + pad(P, O + ΔO) - pad(P, O)`. The padding of
//! the old `P` rows changes only for keys whose `O` rows went from none to
//! some or back (for any key `ΔO` touched, when the join has a filter
//! beyond its keys): for those keys alone it is worked out whole, from
//! both versions of their `O` rows.
//!
//! Semi or anti, with `P` the side whose rows come out (kept where the
//! other side `O` has a match, or where it has none) and `O` the other: the
//! result is a function of each `P` row and the `O` rows of its key, one
//! row at a time in `P`, so the change is `ΔP ⋉ (O + ΔO)` plus, for the old
//! `P` rows of the keys where whether a match exists may have changed,
//! `P ⋉ (O + ΔO) - P ⋉ O` worked out whole for those keys alone. Without a
//! filter beyond the keys those are the keys whose `O` rows went from none
//! to some or back; with one, every key `ΔO` touched. A null-aware anti
//! join (`NOT IN`) is not key by key (one null on `O` empties the result)
//! and is not run this way.
//!
//! Where a stage keeps each side's rows under one key rather than by join
//! key (a stage of one member gets its input gathered), whether that key
//! has rows says nothing of a row's match: padding and matches are worked
//! out again for every change of `O`, as with a filter.
//!
//! Every way the stage keeps both sides' rows by key, and nothing of what
//! it emitted.

use std::sync::Arc;

use datafusion::common::JoinType;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::projection::ProjectionExec;

use super::aggregate_plan::leaf_below;
use crate::context::InputEdge;
use crate::exec::passes_batches_through;

/// The two edges of a join run on its changes.
#[derive(Debug, Clone)]
pub struct IncrementalJoin {
    /// The edge of the join's left (build) side.
    pub left: u32,
    /// The edge of its right (probe) side.
    pub right: u32,
    /// A side is a changelog: the join's changes retract too.
    pub retracts: bool,
    /// A left or right outer join: which side is padded, and how.
    pub outer: Option<OuterSide>,
    /// A semi or anti join: which side's rows come out.
    pub exists: Option<ExistsSide>,
}

/// What a semi or anti join needs beyond an inner one.
#[derive(Debug, Clone)]
pub struct ExistsSide {
    /// The edge whose rows come out, kept or dropped by the other's.
    pub preserved: u32,
    /// The other edge.
    pub other: u32,
    /// The join has a filter beyond its keys, so whether a row has a
    /// match can change while its key keeps rows on the other side.
    pub filtered: bool,
    /// Anti (rows without a match) rather than semi.
    pub anti: bool,
}

/// What an outer join needs beyond an inner one.
#[derive(Debug, Clone)]
pub struct OuterSide {
    /// The edge whose unmatched rows come out padded with nulls.
    pub preserved: u32,
    /// The other edge.
    pub other: u32,
    /// The stage's core with the join made inner: the pairs alone.
    pub pairs_only: Arc<dyn ExecutionPlan>,
    /// The join has a filter beyond its keys, so a row can be unmatched
    /// while its key has rows on the other side.
    pub filtered: bool,
}

impl IncrementalJoin {
    /// The join `core` is, if it is a hash join (under operators that
    /// reshape rows one at a time) of two edges: inner, or when `others`
    /// allows left or right outer, semi or anti (not null-aware).
    pub fn of(core: &Arc<dyn ExecutionPlan>, edges: &[InputEdge], others: bool) -> Option<Self> {
        let [a, b] = edges else { return None };
        if a.shuffle_id == b.shuffle_id {
            return None;
        }
        let mut node = core.clone();
        while row_by_row(&node) {
            node = node.children().first().copied()?.clone();
        }
        let join = node.downcast_ref::<HashJoinExec>()?;
        let (left, _) = leaf_below(join.left())?;
        let (right, _) = leaf_below(join.right())?;
        if left == right {
            return None;
        }
        let filtered = join.filter().is_some();
        let exists = |preserved, other, anti| {
            Some(ExistsSide {
                preserved,
                other,
                filtered,
                anti,
            })
        };
        let (preserved, other, exists) = match join.join_type() {
            JoinType::Inner => (None, None, None),
            JoinType::Left if others => (Some(left), Some(right), None),
            JoinType::Right if others => (Some(right), Some(left), None),
            JoinType::LeftSemi if others => (None, None, exists(left, right, false)),
            JoinType::RightSemi if others => (None, None, exists(right, left, false)),
            JoinType::LeftAnti if others && !join.null_aware => {
                (None, None, exists(left, right, true))
            }
            JoinType::RightAnti if others && !join.null_aware => {
                (None, None, exists(right, left, true))
            }
            _ => return None,
        };
        let outer = match (preserved, other) {
            (Some(preserved), Some(other)) => Some(OuterSide {
                preserved,
                other,
                pairs_only: made_inner(core)?,
                filtered,
            }),
            _ => None,
        };
        Some(IncrementalJoin {
            left,
            right,
            retracts: a.updating || b.updating,
            outer,
            exists,
        })
    }
}

fn row_by_row(node: &Arc<dyn ExecutionPlan>) -> bool {
    node.downcast_ref::<ProjectionExec>().is_some()
        || node.downcast_ref::<FilterExec>().is_some()
        || passes_batches_through(node)
}

/// `plan` with its hash join (under operators that reshape rows one at a
/// time) made an inner join.
fn made_inner(plan: &Arc<dyn ExecutionPlan>) -> Option<Arc<dyn ExecutionPlan>> {
    if let Some(join) = plan.downcast_ref::<HashJoinExec>() {
        return join
            .builder()
            .with_type(JoinType::Inner)
            .recompute_properties()
            .build_exec()
            .ok();
    }
    if !row_by_row(plan) {
        return None;
    }
    let child = made_inner(plan.children().first()?)?;
    plan.clone()
        .replace_children(vec![child], crate::exec::recompute())
        .ok()
}
