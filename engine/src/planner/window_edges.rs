//! Window edges: which column of an exchange edge carries windows or
//! sessions, so an accumulating stage knows when to release rows.

use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::sorts::sort::SortExec;

use crate::exec::passes_batches_through;
use crate::exec::{StageInput, StageInputExec};
use crate::window::{
    SessionSpec, WINDOW_START, WindowColumn, find_window_column, literal_interval_ms,
    session_gap_ms,
};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::windows::{BoundedWindowAggExec, WindowAggExec};

/// The window column of an exchange schema: a field with window metadata,
/// or else (metadata does not survive every operator, e.g. `unnest`) a
/// timestamp column named `window_start` when the query uses one window size.
pub(super) fn edge_window(schema: &SchemaRef, window_sizes: &[i64]) -> Option<WindowColumn> {
    if let Some(w) = find_window_column(schema) {
        return Some(w);
    }
    let [size_ms] = window_sizes else { return None };
    let index = schema.index_of(WINDOW_START).ok()?;
    matches!(schema.field(index).data_type(), DataType::Timestamp(_, _)).then_some(WindowColumn {
        index,
        size_ms: *size_ms,
    })
}

/// A `session(...) OVER (PARTITION BY ...)` computed directly over shuffle
/// edge `shuffle`'s rows: its key and time columns in the edge's schema.
pub(super) fn session_over_leaf(
    plan: &Arc<dyn ExecutionPlan>,
    shuffle: u32,
) -> Option<SessionSpec> {
    let exprs = if let Some(w) = plan.downcast_ref::<WindowAggExec>() {
        Some(w.window_expr().to_vec())
    } else {
        plan.downcast_ref::<BoundedWindowAggExec>()
            .map(|w| w.window_expr().to_vec())
    };
    if let Some(exprs) = exprs {
        let input = plan.children()[0];
        if reaches_leaf_unchanged(input, shuffle) {
            for e in exprs {
                if !e.name().starts_with("session(") {
                    continue;
                }
                let args = e.expressions();
                let time = args.first()?.downcast_ref::<Column>()?.index();
                let keys = e
                    .partition_by()
                    .iter()
                    .map(|k| k.downcast_ref::<Column>().map(Column::index))
                    .collect::<Option<Vec<_>>>()?;
                return Some(SessionSpec {
                    keys,
                    time,
                    gap_ms: session_gap_ms(&args)?,
                });
            }
        }
    }
    plan.children()
        .into_iter()
        .find_map(|c| session_over_leaf(c, shuffle))
}

/// Whether `plan` passes edge `shuffle`'s rows through with their schema
/// unchanged (sorts and batch coalescing only).
pub(super) fn reaches_leaf_unchanged(plan: &Arc<dyn ExecutionPlan>, shuffle: u32) -> bool {
    if let Some(leaf) = plan.downcast_ref::<StageInputExec>() {
        return leaf.input
            == StageInput::Shuffle {
                shuffle_id: shuffle,
            };
    }
    (plan.downcast_ref::<SortExec>().is_some() || passes_batches_through(plan))
        && plan.children().len() == 1
        && plan.children()[0].schema() == plan.schema()
        && reaches_leaf_unchanged(plan.children()[0], shuffle)
}

/// The distinct window sizes of the `tumble` and `hop` calls in a plan.
pub(super) fn window_sizes(plan: &LogicalPlan) -> Vec<i64> {
    let mut sizes = vec![];
    let _ = plan.apply_with_subqueries(|node| {
        for e in node.expressions() {
            let _ = e.apply(|e| {
                if let Expr::ScalarFunction(f) = e {
                    let size_arg = match f.func.name() {
                        "tumble" => f.args.get(1),
                        "hop" => f.args.get(2),
                        _ => None,
                    };
                    if let Some(Expr::Literal(v, _)) = size_arg
                        && let Some(ms) = literal_interval_ms(v)
                    {
                        sizes.push(ms);
                    }
                }
                Ok(TreeNodeRecursion::Continue)
            });
        }
        Ok(TreeNodeRecursion::Continue)
    });
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

pub(super) fn leaf_schema(plan: &Arc<dyn ExecutionPlan>, shuffle: u32) -> Option<SchemaRef> {
    if let Some(leaf) = plan.downcast_ref::<StageInputExec>() {
        return (leaf.input
            == StageInput::Shuffle {
                shuffle_id: shuffle,
            })
        .then(|| plan.schema());
    }
    plan.children()
        .into_iter()
        .find_map(|c| leaf_schema(c, shuffle))
}

/// Every one-step aggregate (`Single`, `SinglePartitioned`: DataFusion
/// plans them where its input needs no exchange, at group size 1 for one)
/// whose group key holds expressions gets a projection below it that
/// computes them as columns. So a window start (`tumble(ts, ...)`) exists
/// as a column before the stage that aggregates: a stateful stage that
/// reads a source directly is split at the top of its stateless part, and
/// its edge then carries the window the stage waits on.
pub(super) fn project_group_keys(
    plan: Arc<dyn ExecutionPlan>,
) -> datafusion::common::Result<Arc<dyn ExecutionPlan>> {
    use datafusion::physical_expr::PhysicalExpr;
    use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode, PhysicalGroupBy};
    use datafusion::physical_plan::projection::ProjectionExec;
    let children = plan
        .children()
        .into_iter()
        .map(|c| project_group_keys(c.clone()))
        .collect::<datafusion::common::Result<Vec<_>>>()?;
    let plan = if children.is_empty() {
        plan
    } else {
        plan.replace_children(children, crate::exec::recompute())?
    };
    let Some(agg) = plan.downcast_ref::<AggregateExec>() else {
        return Ok(plan);
    };
    let one_step = matches!(
        agg.mode(),
        AggregateMode::Single | AggregateMode::SinglePartitioned
    );
    let computed = agg
        .group_expr()
        .expr()
        .iter()
        .any(|(e, _)| e.downcast_ref::<Column>().is_none());
    if !one_step || !computed || !agg.group_expr().is_single() {
        return Ok(plan);
    }
    let input = agg.input().clone();
    let schema = input.schema();
    let mut exprs = every_column(&schema);
    let mut group_by = vec![];
    for (e, name) in agg.group_expr().expr() {
        if e.downcast_ref::<Column>().is_some() {
            group_by.push((e.clone(), name.clone()));
            continue;
        }
        let column = format!("__skein_key_{}", exprs.len());
        let index = exprs.len();
        exprs.push((e.clone(), column.clone()));
        group_by.push((
            Arc::new(Column::new(&column, index)) as Arc<dyn PhysicalExpr>,
            name.clone(),
        ));
    }
    let projected: Arc<dyn ExecutionPlan> = Arc::new(ProjectionExec::try_new(exprs, input)?);
    let rows = projected.schema();
    Ok(Arc::new(AggregateExec::try_new(
        *agg.mode(),
        PhysicalGroupBy::new_single(group_by),
        agg.aggr_expr().to_vec(),
        agg.filter_expr().to_vec(),
        projected,
        rows,
    )?))
}

/// Every column of `schema` as a projection expression with its name: the
/// start of a projection that passes its input through and adds to it.
pub(super) fn every_column(
    schema: &datafusion::arrow::datatypes::Schema,
) -> Vec<(Arc<dyn datafusion::physical_expr::PhysicalExpr>, String)> {
    schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| {
            (
                Arc::new(Column::new(f.name(), i))
                    as Arc<dyn datafusion::physical_expr::PhysicalExpr>,
                f.name().clone(),
            )
        })
        .collect()
}
