//! Where an updating stage compares its result: the plan below the point
//! whose output still carries the key (the core), and the row-by-row
//! operators above it (the tail), which run on the changes alone.
//!
//! Rows are hash-partitioned by key between stages, and a plan that is
//! right for any partitioning computes the result rows of a key from the
//! input rows of that key alone. So after an epoch only the keys it touched
//! need computing again, provided each result row says which key it came
//! from: the core's output must carry the key columns of an input edge.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::JoinType;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::windows::{BoundedWindowAggExec, WindowAggExec};

use super::aggregate::AggregatePlan;
use super::join::IncrementalJoin;
use super::top_n::TopN;
use crate::context::InputEdge;
use crate::error::Result;
use crate::exec::{StageInput, StageInputExec, passes_batches_through, recompute};

/// The leaf that stands for the core's output in the tail.
pub const CORE_OUTPUT: u32 = u32::MAX - 1;

/// An updating stage's plan, split for computing changes.
#[derive(Debug)]
pub struct UpdatingPlan {
    /// Computes the result of the keys whose input rows it is given.
    pub core: Arc<dyn ExecutionPlan>,
    /// Row-by-row operators over the core's output (a leaf for it), if any.
    pub tail: Option<Arc<dyn ExecutionPlan>>,
    /// Per input edge: the key columns its rows are kept by, `None` when
    /// the stage keeps everything as one group.
    pub edge_keys: BTreeMap<u32, Option<Vec<usize>>>,
    /// The key columns of the core's output (`None`: one group).
    pub out_key: Option<Vec<usize>>,
    /// The columns of the rows the state keeps beyond its inputs' (what it
    /// emitted, an aggregate's groups) that hold the key its senders hash,
    /// in their order: how a rescale finds a kept row's key group. `None`
    /// when the state is one group.
    pub state_key: Option<Vec<usize>>,
    /// The core as accumulators, when it is an aggregate that can run so
    /// (then no input row is kept).
    pub aggregate: Option<Arc<AggregatePlan>>,
    /// A top-N whose kept rows are cut to its result after each emission.
    pub top_n: Option<TopN>,
    /// An inner join of two streams: each epoch joins its changed rows
    /// only, and keeps nothing it emitted.
    pub join: Option<IncrementalJoin>,
}

impl UpdatingPlan {
    /// Split `plan`, whose input edges are `edges` with leaf schemas
    /// `schemas`.
    pub fn new(
        plan: &Arc<dyn ExecutionPlan>,
        edges: &[InputEdge],
        schemas: &BTreeMap<u32, SchemaRef>,
    ) -> Result<Self> {
        let keyed = edge_keys(edges, schemas);
        let senders_keys = keyed.clone();
        // A repartition on top makes the partitions routing needs: it stays
        // above the core whatever happens.
        let mut core = plan.clone();
        let mut above: Vec<Arc<dyn ExecutionPlan>> = vec![];
        if core.downcast_ref::<RepartitionExec>().is_some() {
            above.push(core.clone());
            core = core.children()[0].clone();
        }
        let top = core.clone();
        let above_top = above.clone();
        let found = keyed.as_ref().and_then(|keys| {
            loop {
                if let Some(out) = key_in_output(&core, keys) {
                    return Some(out);
                }
                // A join that projects its key away: the key is there before
                // the projection, which then runs on the changes.
                if let Some((projection, join)) = unembed_projection(&core) {
                    above.push(projection);
                    core = join;
                    continue;
                }
                if !is_row_by_row(&core) || core.children().len() != 1 {
                    return None;
                }
                above.push(core.clone());
                core = core.children()[0].clone();
            }
        });
        let (core, above, out_key, edge_keys) = match (found, keyed) {
            (Some(out), Some(keys)) => (
                core,
                above,
                Some(out),
                keys.into_iter().map(|(e, k)| (e, Some(k))).collect(),
            ),
            _ => (
                top,
                above_top,
                None,
                edges.iter().map(|e| (e.shuffle_id, None)).collect(),
            ),
        };
        // An aggregate under operators that reshape its rows one at a time
        // runs on accumulators; those operators then run on its changes.
        let (core, above, aggregate) = {
            let mut node = core.clone();
            let mut peeled = vec![];
            while node.downcast_ref::<AggregateExec>().is_none()
                && is_row_by_row(&node)
                && node.children().len() == 1
            {
                peeled.push(node.clone());
                node = node.children()[0].clone();
            }
            match AggregatePlan::of(&node, edges) {
                Some(agg) => {
                    let mut above = above;
                    above.extend(peeled);
                    (node, above, Some(Arc::new(agg)))
                }
                None => (core, above, None),
            }
        };
        let tail = rebuild_over_leaf(&above, &core)?;
        let top_n = match (&out_key, edges) {
            (Some(_), [edge]) => schemas
                .get(&edge.shuffle_id)
                .and_then(|s| TopN::of(&core, edges, s.fields().len())),
            _ => None,
        };
        let join = IncrementalJoin::of(&core, edges, true);
        // An aggregate's groups (and what it emits) are its output rows;
        // the key is where its group columns trace to the senders' key.
        let state_key = match (&aggregate, &senders_keys) {
            (Some(_), Some(keys)) if out_key.is_some() => key_in_output(&core, keys),
            (Some(_), _) => None,
            (None, _) => out_key.clone(),
        };
        Ok(UpdatingPlan {
            core,
            tail,
            edge_keys,
            out_key,
            state_key,
            aggregate,
            top_n,
            join,
        })
    }

    /// Whether the stage keeps everything as one group (no key to narrow
    /// an epoch's work to).
    pub fn whole(&self) -> bool {
        self.out_key.is_none()
    }

    /// How the stage computes its changes and what it keeps, emitting
    /// every `emit_every` epochs.
    pub fn path(&self, emit_every: u64) -> super::StatePath {
        let (incremental, operator, keeps) = if let Some(agg) = &self.aggregate {
            let sides = if agg.join.is_some() {
                "both sides' rows by join key, "
            } else {
                ""
            };
            (
                true,
                format!("aggregate: {}", agg.describe()),
                if emit_every <= 1 {
                    format!(
                        "{sides}one entry per group (what it emitted is read from them); \
                         past --state-memory, groups idle a while go to local disk"
                    )
                } else {
                    format!("{sides}one entry per group, and the rows it emitted")
                },
            )
        } else if let Some(join) = &self.join {
            let kind = match (&join.outer, &join.exists) {
                (Some(_), _) => "outer join",
                (_, Some(side)) if side.anti => "anti join",
                (_, Some(_)) => "semi join",
                _ => "inner join",
            };
            let operator = if join.retracts {
                format!("{kind} over a changelog: joins each epoch's changed rows, retractions too")
            } else {
                format!("{kind} of two streams that append: joins each epoch's new rows")
            };
            (
                true,
                operator,
                "both sides' rows by join key; nothing it emitted".into(),
            )
        } else if self.top_n.is_some() {
            (
                false,
                "top-N over rows that append, per touched key".into(),
                "the rows in each key's result only".into(),
            )
        } else if self.whole() {
            (
                false,
                "of the whole result every epoch".into(),
                "every input row, and the rows it emitted".into(),
            )
        } else {
            (
                false,
                "per touched key".into(),
                "every input row of its keys, and the rows it emitted".into(),
            )
        };
        super::StatePath {
            incremental,
            operator,
            keeps,
            grows: !incremental && self.top_n.is_none(),
        }
    }
}

/// The key columns of every input edge, if each has one and all have the
/// same types (so a key is encoded the same on every edge).
fn edge_keys(
    edges: &[InputEdge],
    schemas: &BTreeMap<u32, SchemaRef>,
) -> Option<BTreeMap<u32, Vec<usize>>> {
    let mut out = BTreeMap::new();
    let mut types: Option<Vec<DataType>> = None;
    for e in edges {
        let key = e.key.clone()?;
        let schema = schemas.get(&e.shuffle_id)?;
        let t: Vec<DataType> = key
            .iter()
            .map(|i| schema.fields().get(*i).map(|f| f.data_type().clone()))
            .collect::<Option<_>>()?;
        match &types {
            Some(known) if *known != t => return None,
            _ => types = Some(t),
        }
        out.insert(e.shuffle_id, key);
    }
    (!out.is_empty()).then_some(out)
}

/// Columns of `plan`'s output that are the key columns of one input edge.
fn key_in_output(
    plan: &Arc<dyn ExecutionPlan>,
    keys: &BTreeMap<u32, Vec<usize>>,
) -> Option<Vec<usize>> {
    let width = plan.schema().fields().len();
    let traced: Vec<Option<(u32, usize)>> = (0..width).map(|j| trace(plan, j)).collect();
    keys.iter().find_map(|(edge, cols)| {
        cols.iter()
            .map(|c| traced.iter().position(|t| *t == Some((*edge, *c))))
            .collect()
    })
}

/// The input edge and column an output column of `plan` is, unchanged and
/// never null-padded, if it is one.
pub(super) fn trace(plan: &Arc<dyn ExecutionPlan>, j: usize) -> Option<(u32, usize)> {
    if let Some(leaf) = plan.downcast_ref::<StageInputExec>() {
        return match leaf.input {
            StageInput::Shuffle { shuffle_id } => Some((shuffle_id, j)),
            StageInput::Source { .. } => None,
        };
    }
    if let Some(p) = plan.downcast_ref::<ProjectionExec>() {
        let c = p.expr().get(j)?.expr.downcast_ref::<Column>()?;
        return trace(p.input(), c.index());
    }
    if let Some(f) = plan.downcast_ref::<FilterExec>() {
        let i = match f.projection() {
            Some(p) => *p.get(j)?,
            None => j,
        };
        return trace(f.input(), i);
    }
    if let Some(a) = plan.downcast_ref::<AggregateExec>() {
        if !a.group_expr().is_single() {
            return None;
        }
        let (e, _) = a.group_expr().expr().get(j)?;
        return trace(a.input(), e.downcast_ref::<Column>()?.index());
    }
    if let Some(h) = plan.downcast_ref::<HashJoinExec>() {
        let jj = match &h.projection {
            Some(p) => *p.get(j)?,
            None => j,
        };
        let left = h.left().schema().fields().len();
        return match h.join_type() {
            JoinType::Inner if jj < left => trace(h.left(), jj),
            JoinType::Inner => trace(h.right(), jj - left),
            JoinType::Left | JoinType::LeftMark if jj < left => trace(h.left(), jj),
            JoinType::Right if jj >= left => trace(h.right(), jj - left),
            // A null-aware anti join (NOT IN) is not key by key: one null
            // on the other side empties the result.
            JoinType::LeftAnti | JoinType::RightAnti if h.null_aware => None,
            JoinType::LeftSemi | JoinType::LeftAnti => trace(h.left(), jj),
            JoinType::RightSemi | JoinType::RightAnti | JoinType::RightMark => trace(h.right(), jj),
            // Null-padded on this side, or on both (a full join).
            _ => None,
        };
    }
    let window_input = plan
        .downcast_ref::<BoundedWindowAggExec>()
        .map(|w| w.input())
        .or_else(|| plan.downcast_ref::<WindowAggExec>().map(|w| w.input()));
    if let Some(input) = window_input {
        return (j < input.schema().fields().len())
            .then(|| trace(input, j))
            .flatten();
    }
    // A limit, or a sort that keeps the first N (TopK), picks rows across
    // keys: which rows of a key it keeps depends on the other keys' rows,
    // so no key can be computed apart through it.
    let same_columns = passes_batches_through(plan)
        || plan
            .downcast_ref::<SortExec>()
            .is_some_and(|s| s.fetch().is_none())
        || plan.downcast_ref::<CoalescePartitionsExec>().is_some()
        || plan.downcast_ref::<RepartitionExec>().is_some();
    if same_columns && plan.children().len() == 1 {
        return trace(plan.children()[0], j);
    }
    None
}

/// A hash join with a projection of its own as a projection over the
/// same join without one.
fn unembed_projection(
    plan: &Arc<dyn ExecutionPlan>,
) -> Option<(Arc<dyn ExecutionPlan>, Arc<dyn ExecutionPlan>)> {
    let h = plan.downcast_ref::<HashJoinExec>()?;
    let keep = h.projection.clone()?;
    let join: Arc<dyn ExecutionPlan> =
        Arc::new(h.builder().with_projection_ref(None).build().ok()?);
    let schema = join.schema();
    let exprs: Vec<(Arc<dyn PhysicalExpr>, String)> = keep
        .iter()
        .map(|i| {
            let name = schema.field(*i).name().clone();
            (
                Arc::new(Column::new(&name, *i)) as Arc<dyn PhysicalExpr>,
                name,
            )
        })
        .collect();
    let projection = ProjectionExec::try_new(exprs, join.clone()).ok()?;
    Some((Arc::new(projection), join))
}

/// Operators whose output row depends on one input row alone: they may run
/// on changes instead of on the whole result.
fn is_row_by_row(plan: &Arc<dyn ExecutionPlan>) -> bool {
    plan.downcast_ref::<ProjectionExec>().is_some()
        || plan.downcast_ref::<FilterExec>().is_some()
        || plan.downcast_ref::<RepartitionExec>().is_some()
        || passes_batches_through(plan)
}

/// The operators `above` (top first) rebuilt over a leaf standing for
/// `core`'s output; `None` when there are none.
fn rebuild_over_leaf(
    above: &[Arc<dyn ExecutionPlan>],
    core: &Arc<dyn ExecutionPlan>,
) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    if above.is_empty() {
        return Ok(None);
    }
    let mut plan: Arc<dyn ExecutionPlan> = Arc::new(StageInputExec::new(
        StageInput::Shuffle {
            shuffle_id: CORE_OUTPUT,
        },
        core.schema(),
    ));
    for node in above.iter().rev() {
        plan = node.clone().replace_children(vec![plan], recompute())?;
    }
    Ok(Some(plan))
}
