//! Where a lookup join goes: a physical optimizer rule that replaces a hash
//! join of a stream with a lookup table by a [`LookupJoinExec`] over the
//! stream side alone. It runs before DataFusion enforces distributions, so
//! no exchange is planned for the join and it stays in the stage that reads
//! the stream (the source stage, for a join straight after the scan).

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{DataFusionError, JoinType, Result as DfResult};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{CastExpr, Column, TryCastExpr};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;

use super::exec::{LookupJoinExec, LookupJoinType, LookupScanExec, LookupSpec, not_a_stream};
use super::{LookupOptions, can_be_key};
use crate::catalog::Catalog;
use crate::exec::SourceScanExec;
use crate::source::SourceConfig;

/// The rule's name; it runs right after DataFusion's `join_selection`.
pub const RULE_NAME: &str = "place_lookup_joins";
/// The DataFusion rule this one runs after.
pub const RUNS_AFTER: &str = "join_selection";

/// The physical optimizer rule that replaces a hash join of a stream with a
/// lookup table by a lookup join.
pub struct PlaceLookupJoins {
    catalog: Catalog,
}

impl PlaceLookupJoins {
    /// The rule, opening lookups through `catalog`.
    pub fn new(catalog: Catalog) -> Self {
        PlaceLookupJoins { catalog }
    }
}

impl std::fmt::Debug for PlaceLookupJoins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PlaceLookupJoins({:?})", self.catalog.lookup_kinds())
    }
}

impl PhysicalOptimizerRule for PlaceLookupJoins {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let plan = plan
            .transform_up(|node| {
                let Some(join) = node.downcast_ref::<HashJoinExec>() else {
                    return Ok(Transformed::no(node));
                };
                match self.replace(join)? {
                    Some(replaced) => Ok(Transformed::yes(replaced)),
                    None => Ok(Transformed::no(node)),
                }
            })?
            .data;
        // A lookup table anywhere else (read on its own, in a join of
        // another kind) cannot run.
        match first_lookup_table(&plan)? {
            Some(table) => Err(not_a_stream(&table)),
            None => Ok(plan),
        }
    }

    fn name(&self) -> &str {
        RULE_NAME
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// Below operators that only move rows between partitions.
fn strip(plan: &Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
    let mut p = plan.clone();
    loop {
        let moves_rows = p.downcast_ref::<RepartitionExec>().is_some()
            || p.downcast_ref::<CoalescePartitionsExec>().is_some()
            || crate::exec::passes_batches_through(&p);
        if !moves_rows {
            return p;
        }
        p = p.children()[0].clone();
    }
}

/// The table of the first lookup scan in `plan`, if any.
fn first_lookup_table(plan: &Arc<dyn ExecutionPlan>) -> DfResult<Option<String>> {
    let mut found = None;
    plan.apply(|n| {
        if let Some(scan) = n.downcast_ref::<LookupScanExec>() {
            found = Some(scan.table.clone());
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(found)
}

/// A lookup table as one side of a join: its scan, and the projection of
/// casts that type coercion put over it (joining a VARCHAR key with an
/// integer column casts the key), if any.
struct TableSide {
    scan: Arc<dyn ExecutionPlan>,
    casts: Option<Arc<dyn ExecutionPlan>>,
}

/// The lookup table on `side`, if that side is one.
fn lookup_scan(side: &Arc<dyn ExecutionPlan>) -> DfResult<Option<TableSide>> {
    let p = strip(side);
    if p.downcast_ref::<LookupScanExec>().is_some() {
        return Ok(Some(TableSide {
            scan: p,
            casts: None,
        }));
    }
    if let Some(projection) = p.downcast_ref::<ProjectionExec>() {
        let below = strip(projection.input());
        if below.downcast_ref::<LookupScanExec>().is_some()
            && projection
                .expr()
                .iter()
                .all(|e| column_under_casts(&e.expr).is_some())
        {
            return Ok(Some(TableSide {
                scan: below,
                casts: Some(p),
            }));
        }
    }
    match first_lookup_table(&p)? {
        // A filter on the table's columns, say: the join would have to
        // see the whole table.
        Some(table) if p.children().len() == 1 => Err(DataFusionError::Plan(format!(
            "lookup table {table}: the join must take the table as it is, but the plan puts {} \
             between them (a condition on the table's columns belongs after the join)",
            p.name()
        ))),
        _ => Ok(None),
    }
}

/// The one source table under `plan`, if there is exactly one.
fn stream_table(plan: &Arc<dyn ExecutionPlan>) -> DfResult<Option<(String, SourceConfig)>> {
    let mut found: Vec<(String, SourceConfig)> = vec![];
    plan.apply(|n| {
        if let Some(scan) = n.downcast_ref::<SourceScanExec>()
            && !found.iter().any(|(t, _)| *t == scan.table)
        {
            found.push((scan.table.clone(), scan.config.clone()));
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok((found.len() == 1).then(|| found.remove(0)))
}

fn column_name(e: &Arc<dyn PhysicalExpr>) -> Option<(&str, usize)> {
    e.downcast_ref::<Column>().map(|c| (c.name(), c.index()))
}

/// The column `e` is, under any casts.
fn column_under_casts(e: &Arc<dyn PhysicalExpr>) -> Option<usize> {
    if let Some(c) = e.downcast_ref::<CastExpr>() {
        return column_under_casts(c.expr());
    }
    if let Some(c) = e.downcast_ref::<TryCastExpr>() {
        return column_under_casts(c.expr());
    }
    column_name(e).map(|(_, i)| i)
}

impl PlaceLookupJoins {
    fn replace(&self, join: &HashJoinExec) -> DfResult<Option<Arc<dyn ExecutionPlan>>> {
        let (side, lookup_left) = match (lookup_scan(join.left())?, lookup_scan(join.right())?) {
            (None, None) => return Ok(None),
            (Some(s), None) => (s, true),
            (None, Some(s)) => (s, false),
            (Some(s), Some(_)) => {
                let table = &s
                    .scan
                    .downcast_ref::<LookupScanExec>()
                    .expect("a lookup scan")
                    .table;
                return Err(DataFusionError::Plan(format!(
                    "lookup table {table} is joined with another lookup table; join it with a stream"
                )));
            }
        };
        let scan = side
            .scan
            .downcast_ref::<LookupScanExec>()
            .expect("a lookup scan");
        let table = &scan.table;
        let plan_err = |msg: String| DataFusionError::Plan(format!("lookup table {table}: {msg}"));
        let join_type = match (join.join_type(), lookup_left) {
            (JoinType::Inner, _) => LookupJoinType::Inner,
            (JoinType::Left, false) | (JoinType::Right, true) => LookupJoinType::Outer,
            (other, _) => {
                return Err(plan_err(format!(
                    "a {other} join with a stream is not supported: use JOIN or LEFT JOIN, \
                     the stream on the left"
                )));
            }
        };
        if join.filter().is_some() {
            return Err(plan_err(format!(
                "the join condition must be only <stream column> = {table}.<its lookup.key>"
            )));
        }
        let options = LookupOptions::from_config(&scan.config, &scan.table_schema)
            .map_err(|e| plan_err(e.to_string()))?;
        let [(l, r)] = join.on() else {
            return Err(plan_err(format!(
                "join on its key column {} alone, not on {} columns",
                options.key,
                join.on().len()
            )));
        };
        let (stream_expr, table_expr) = if lookup_left { (r, l) } else { (l, r) };
        // The table's column joined on, through the casts over the scan.
        let table_column = column_under_casts(table_expr).and_then(|i| match &side.casts {
            Some(casts) => {
                let casts = casts.downcast_ref::<ProjectionExec>()?;
                column_under_casts(&casts.expr().get(i)?.expr)
            }
            None => Some(i),
        });
        let table_column = table_column
            .and_then(|i| scan.projection.get(i))
            .map(|i| scan.table_schema.field(*i).name());
        match table_column {
            Some(name) if *name == options.key => {}
            _ => {
                return Err(plan_err(format!(
                    "join on its key column {} (its lookup.key), not on {table_expr}",
                    options.key
                )));
            }
        }
        let Some((_, stream_key)) = column_name(stream_expr) else {
            return Err(plan_err(format!(
                "the stream's side of the join must be a column, not {stream_expr}"
            )));
        };
        let stream = strip(if lookup_left {
            join.right()
        } else {
            join.left()
        });
        let key_field = stream.schema().field(stream_key).clone();
        if !can_be_key(key_field.data_type()) {
            return Err(plan_err(format!(
                "the stream's column {} is {}, which cannot be a lookup key \
                 (join on a VARCHAR or integer column)",
                key_field.name(),
                key_field.data_type()
            )));
        }
        let spec = LookupSpec {
            table: table.clone(),
            config: scan.config.clone(),
            options,
            projection: scan.projection.clone(),
            stream_key,
            join_type,
            letters_to: stream_table(&stream)?,
        };
        let handle = self
            .catalog
            .open_lookup(spec, scan.table_schema.clone())
            .map_err(|e| DataFusionError::Plan(e.to_string()))?;
        let stream_width = stream.schema().fields().len();
        let mut out: Arc<dyn ExecutionPlan> =
            Arc::new(LookupJoinExec::try_new(stream, Arc::new(handle))?);
        if let Some(casts) = &side.casts {
            out = cast_table_columns(out, stream_width, casts)?;
        }
        let joined = join.join_schema().clone();
        if lookup_left {
            // The join's order: the table's columns first.
            let table_width = joined.fields().len() - stream_width;
            let order = (stream_width..stream_width + table_width).chain(0..stream_width);
            out = select(out, order)?;
        }
        if let Some(p) = &join.projection {
            out = select(out, p.iter().copied())?;
        }
        Ok(Some(out))
    }
}

/// A projection of `input`'s columns at `indices`, names kept.
fn select(
    input: Arc<dyn ExecutionPlan>,
    indices: impl Iterator<Item = usize>,
) -> DfResult<Arc<dyn ExecutionPlan>> {
    let exprs = columns(&input, indices);
    Ok(Arc::new(ProjectionExec::try_new(exprs, input)?))
}

/// `input`'s columns at `indices` as projection expressions, names kept.
fn columns(
    input: &Arc<dyn ExecutionPlan>,
    indices: impl Iterator<Item = usize>,
) -> Vec<(Arc<dyn PhysicalExpr>, String)> {
    let schema = input.schema();
    indices
        .map(|i| {
            let name = schema.field(i).name().clone();
            (
                Arc::new(Column::new(&name, i)) as Arc<dyn PhysicalExpr>,
                name,
            )
        })
        .collect()
}

/// Over a lookup join's output: the stream's columns as they are, then the
/// table's through the casts that were over its scan.
fn cast_table_columns(
    join: Arc<dyn ExecutionPlan>,
    stream_width: usize,
    casts: &Arc<dyn ExecutionPlan>,
) -> DfResult<Arc<dyn ExecutionPlan>> {
    let casts = casts
        .downcast_ref::<ProjectionExec>()
        .ok_or_else(|| DataFusionError::Internal("casts are a projection".into()))?;
    let mut exprs = columns(&join, 0..stream_width);
    for e in casts.expr() {
        let moved = e
            .expr
            .clone()
            .transform(|x| match x.downcast_ref::<Column>() {
                Some(c) => Ok(Transformed::yes(Arc::new(Column::new(
                    c.name(),
                    c.index() + stream_width,
                )) as _)),
                None => Ok(Transformed::no(x)),
            })?
            .data;
        exprs.push((moved, e.alias.clone()));
    }
    Ok(Arc::new(ProjectionExec::try_new(exprs, join)?))
}

/// DataFusion's physical optimizer rules with [`PlaceLookupJoins`] after
/// `join_selection` (which has fixed the join's sides by then).
pub fn rules(catalog: &Catalog) -> Vec<Arc<dyn PhysicalOptimizerRule + Send + Sync>> {
    let mut rules = datafusion::physical_optimizer::optimizer::PhysicalOptimizer::new().rules;
    let at = rules
        .iter()
        .position(|r| r.name() == RUNS_AFTER)
        .map_or(0, |i| i + 1);
    rules.insert(at, Arc::new(PlaceLookupJoins::new(catalog.clone())));
    rules
}
