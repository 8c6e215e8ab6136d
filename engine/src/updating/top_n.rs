//! Top-N per partition over rows that only append: `row_number() OVER
//! (PARTITION BY ...) <= N` (NEXMark q18's latest row per key, q19's top
//! ten). A row that is not among a partition's first N now never will be:
//! rows only come, and each new one can only push it further down. So once
//! an epoch has computed a key's result, the key's kept input rows are cut
//! to the rows of that result, and a key holds at most N rows per
//! partition instead of every row it ever had.

use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{BinaryExpr, Column, Literal};
use datafusion::physical_expr::window::StandardWindowExpr;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::windows::{BoundedWindowAggExec, WindowAggExec, WindowUDFExpr};

use super::split::trace;
use crate::context::InputEdge;
use crate::error::Result;
use crate::exec::passes_batches_through;

/// How to cut a top-N stage's kept rows to its result.
#[derive(Debug, Clone)]
pub struct TopN {
    /// The input edge whose rows are cut.
    pub edge: u32,
    /// Per column of the edge's rows, the column of the core's output that
    /// holds it.
    columns: Vec<usize>,
}

impl TopN {
    /// The cut for `core` fed by `edges`, if `core` is a row-number filter
    /// over one edge that only appends, every input column in its output.
    pub fn of(
        core: &Arc<dyn ExecutionPlan>,
        edges: &[InputEdge],
        leaf_width: usize,
    ) -> Option<Self> {
        let [edge] = edges else { return None };
        if edge.updating {
            return None;
        }
        let mut node = core.clone();
        while node.downcast_ref::<ProjectionExec>().is_some() || passes_batches_through(&node) {
            node = node.children().first().copied()?.clone();
        }
        let filter = node.downcast_ref::<FilterExec>()?;
        let mut below = filter.input().clone();
        while passes_batches_through(&below) {
            below = below.children().first().copied()?.clone();
        }
        let (window_exprs, input_width) = match (
            below.downcast_ref::<BoundedWindowAggExec>(),
            below.downcast_ref::<WindowAggExec>(),
        ) {
            (Some(w), _) => (w.window_expr(), w.input().schema().fields().len()),
            (_, Some(w)) => (w.window_expr(), w.input().schema().fields().len()),
            _ => return None,
        };
        // One window function, row_number, and the filter bounds it alone.
        let [only] = window_exprs else { return None };
        let standard = only.as_any().downcast_ref::<StandardWindowExpr>()?;
        let udf = standard
            .get_standard_func_expr()
            .as_any()
            .downcast_ref::<WindowUDFExpr>()?;
        if udf.fun().name() != "row_number" || !bounds(filter.predicate(), input_width) {
            return None;
        }
        let width = core.schema().fields().len();
        let columns = (0..leaf_width)
            .map(|c| (0..width).find(|j| trace(core, *j) == Some((edge.shuffle_id, c))))
            .collect::<Option<Vec<usize>>>()?;
        Some(TopN {
            edge: edge.shuffle_id,
            columns,
        })
    }

    /// The input rows that make `result` (the core's output for some keys).
    pub fn kept(&self, result: &RecordBatch) -> Result<RecordBatch> {
        Ok(result.project(&self.columns)?)
    }
}

/// Whether `predicate` is `rn <= N`, `rn < N` or `rn = 1` (or the same
/// turned around) on the window's output column `rn` (the first after the
/// input's).
fn bounds(predicate: &Arc<dyn PhysicalExpr>, rn: usize) -> bool {
    let Some(b) = predicate.downcast_ref::<BinaryExpr>() else {
        return false;
    };
    let is_rn =
        |e: &Arc<dyn PhysicalExpr>| e.downcast_ref::<Column>().is_some_and(|c| c.index() == rn);
    let is_lit = |e: &Arc<dyn PhysicalExpr>| e.downcast_ref::<Literal>().is_some();
    let is_one = |e: &Arc<dyn PhysicalExpr>| {
        e.downcast_ref::<Literal>()
            .is_some_and(|l| l.value().to_string() == "1")
    };
    match b.op() {
        // Only the first row: `rn = 5` would keep the fifth and drop the
        // four a later row must be ranked against.
        Operator::Eq => is_rn(b.left()) && is_one(b.right()),
        Operator::LtEq | Operator::Lt => is_rn(b.left()) && is_lit(b.right()),
        Operator::GtEq | Operator::Gt => is_lit(b.left()) && is_rn(b.right()),
        _ => false,
    }
}
