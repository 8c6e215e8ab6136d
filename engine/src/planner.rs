//! From SQL to a stage DAG.
//!
//! DataFusion plans the query for `group_size` partitions. We then cut the
//! physical plan where data must move between functions:
//! * a hash `RepartitionExec` ends the stage below it, which keeps the
//!   repartition on top and sends partition i to member i (by the ring) of
//!   a function group above it;
//! * `CoalescePartitionsExec` and `SortPreservingMergeExec` end the stage
//!   below and feed a single function (the merge becomes a sort there);
//! * round-robin repartitions only spread work over threads and are dropped.
//!
//! Each cut leaves a [`StageInputExec`] leaf in the stage above. Source scans
//! become leaves too: a source stage pulls its micro-batch each epoch.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::logical_expr::{DmlStatement, LogicalPlan, WriteOp};
use datafusion::physical_expr::Partitioning;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::limit::GlobalLimitExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
use datafusion::physical_plan::{ExecutionPlan, displayable};
use datafusion::prelude::SessionContext;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::codec::{plan_to_bytes, schema_to_bytes};
use crate::context::{
    CheckpointSpec, CloudContext, EdgeWindow, ExtraOutput, InputEdge, NextHop, SourceBinding,
    StageMode, function_name,
};
use crate::error::{EngineError, Result};
use crate::exec::{SourceScanExec, SourceTable, StageInput, StageInputExec, rewrite_leaves};
use crate::exec::{passes_batches_through, recompute};
use crate::payload::Encoding;
pub use crate::session::session;
use crate::sink::SinkConfig;
use crate::source::SourceConfig;
use crate::watermark::OPT_LATE;
use crate::window::{
    SessionSpec, WINDOW_START, WindowColumn, find_window_column, has_session_column,
    literal_interval_ms, session_gap_ms,
};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::windows::{BoundedWindowAggExec, WindowAggExec};

/// Concurrency of source functions: each trigger is independent.
pub const STATELESS_CONCURRENCY: usize = 1000;
pub const DEFAULT_GROUP_SIZE: usize = 8;

/// How a stage's output leaves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Exchange {
    /// Hash-partitioned into this many partitions, one group member each.
    Hash(usize),
    /// Gathered into one function.
    Single,
    /// Written to the sink.
    Sink,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StageKind {
    /// Pulls micro-batches from its tables' sources.
    Source,
    /// A function group fed by a hash exchange.
    Group,
    /// One function fed by a gathering exchange.
    Single,
}

#[derive(Debug, Clone)]
pub struct SourceLeaf {
    pub table: String,
    pub config: SourceConfig,
    pub schema: SchemaRef,
    pub parallelism: usize,
}

#[derive(Debug, Clone)]
pub struct Stage {
    pub id: u32,
    pub kind: StageKind,
    pub plan: Arc<dyn ExecutionPlan>,
    pub members: u32,
    /// Upstream stage ids and the exchange they send with.
    pub inputs: Vec<(u32, Exchange)>,
    pub sources: Vec<SourceLeaf>,
    pub output: Exchange,
    /// The stage that consumes this one's output (None for the sink stage).
    pub consumer: Option<u32>,
    pub stateful: bool,
    pub mode: StageMode,
    pub concurrency: usize,
    pub windows: Vec<Option<EdgeWindow>>,
    /// Per input edge: the source tables its rows come from.
    pub input_tables: Vec<Vec<SourceLeaf>>,
    /// A source stage's further outputs from the same read (other stages
    /// that scanned the same table, merged into this one).
    pub extra_outputs: Vec<MergedOutput>,
}

/// The output of a source stage merged into another that reads the same
/// table: its id stays the edge id its consumer knows.
#[derive(Debug, Clone)]
pub struct MergedOutput {
    pub shuffle_id: u32,
    pub plan: Arc<dyn ExecutionPlan>,
    pub output: Exchange,
    pub consumer: Option<u32>,
}

#[derive(Debug, Clone)]
pub struct QueryPlan {
    pub sql: String,
    pub query_code: String,
    pub group_size: usize,
    pub stages: Vec<Stage>,
    pub sink: SinkConfig,
    pub output_schema: SchemaRef,
    /// The logical plan of the query's result, for single-process checks.
    pub logical: LogicalPlan,
    /// Whether the result has an ORDER BY (order matters when comparing).
    pub ordered: bool,
}

/// Options of the planning session.
#[derive(Debug, Clone)]
pub struct PlanOptions {
    pub group_size: usize,
    pub encoding: Encoding,
    pub invoke_async: bool,
    /// The run's lineage (see [`CloudContext::run`]).
    pub run: String,
    /// Checkpointing, if the query checkpoints.
    pub checkpoint: Option<CheckpointSpec>,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            group_size: DEFAULT_GROUP_SIZE,
            encoding: Encoding::Zstd,
            invoke_async: false,
            // Every plan is a lineage of its own unless a checkpoint store
            // says which one it continues.
            run: crate::checkpoint::fresh_run("run"),
            checkpoint: None,
        }
    }
}

/// The query code: a digest of the query text, used in function names.
pub fn query_code(sql: &str) -> String {
    format!(
        "q{}",
        &hex::encode(Sha256::digest(sql.trim().as_bytes()))[..10]
    )
}

/// Split a script into statements at `;` outside quotes.
pub fn split_statements(sql: &str) -> Vec<String> {
    let mut out = vec![];
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (None, '-') if chars.peek() == Some(&'-') => {
                // Comment to end of line.
                for c in chars.by_ref() {
                    if c == '\n' {
                        break;
                    }
                }
                cur.push('\n');
                continue;
            }
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, ';') => {
                if !cur.trim().is_empty() {
                    out.push(cur.trim().to_string());
                }
                cur.clear();
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

/// Sink option: `updates` makes every stage emit per epoch (see [`plan_query`]).
pub const EMIT_OPTION: &str = "emit";
pub const EMIT_UPDATES: &str = "updates";

/// Run the script's DDL in `ctx` and plan its one query into stages.
pub async fn plan_query(
    ctx: &SessionContext,
    sql: &str,
    options: &PlanOptions,
) -> Result<QueryPlan> {
    if options.group_size == 0 {
        return Err(EngineError::plan("the group size must be at least 1"));
    }
    let statements = split_statements(sql);
    let (query, ddl) = statements
        .split_last()
        .ok_or_else(|| EngineError::plan("the SQL file holds no statement"))?;
    for stmt in ddl {
        ctx.sql(stmt).await?.collect().await?;
    }
    let logical = ctx.state().create_logical_plan(query).await?;
    let (logical, sink) = match logical {
        LogicalPlan::Dml(DmlStatement {
            table_name,
            op: WriteOp::Insert(_),
            input,
            ..
        }) => {
            let sink = sink_config_for(ctx, &table_name.to_string()).await?;
            (Arc::unwrap_or_clone(input), sink)
        }
        LogicalPlan::Dml(_) => {
            return Err(EngineError::plan(
                "only INSERT INTO a sink table is supported",
            ));
        }
        plan => (plan, SinkConfig::collect(&query_code(sql))),
    };
    let ordered = is_ordered(&logical);
    let state = ctx.state();
    let optimized = state.optimize(&logical)?;
    // An optimizer rule's error (a lookup join that cannot be placed)
    // comes wrapped in the rule's name: the cause alone reads better.
    let physical = state
        .create_physical_plan(&optimized)
        .await
        .map_err(|e| match e {
            datafusion::error::DataFusionError::Context(_, cause) => *cause,
            e => e,
        })?;
    let output_schema = physical.schema();
    let mut cutter = Cutter::default();
    cutter.build_stage(physical, Exchange::Sink, false)?;
    let mut stages = cutter.finish(&window_sizes(&optimized))?;
    // A sink declared with `'emit' 'updates'` takes each epoch's aggregates
    // as they are (deltas it merges itself, e.g. with HINCRBY) instead of
    // whole windows once the watermark closes them. No state then outlives an
    // epoch, so the offsets of a write cover exactly the rows it carries.
    if sink
        .options
        .get(EMIT_OPTION)
        .is_some_and(|v| v == EMIT_UPDATES)
    {
        for s in &mut stages {
            s.mode = StageMode::Stream;
        }
    }
    Ok(QueryPlan {
        sql: sql.to_string(),
        query_code: query_code(sql),
        group_size: options.group_size,
        stages,
        sink,
        output_schema,
        logical,
        ordered,
    })
}

fn is_ordered(plan: &LogicalPlan) -> bool {
    match plan {
        LogicalPlan::Sort(_) => true,
        LogicalPlan::Projection(p) => is_ordered(&p.input),
        LogicalPlan::Limit(l) => is_ordered(&l.input),
        _ => false,
    }
}

/// A sink table is declared like a source (`CREATE EXTERNAL TABLE ... STORED
/// AS REDIS ...`); its config becomes the sink's.
async fn sink_config_for(ctx: &SessionContext, table: &str) -> Result<SinkConfig> {
    let provider = ctx.table_provider(table).await?;
    let any: &dyn std::any::Any = provider.as_ref();
    let t = any
        .downcast_ref::<SourceTable>()
        .ok_or_else(|| EngineError::plan(format!("{table} is not a table Skein can write to")))?;
    Ok(SinkConfig {
        kind: t.config.kind.clone(),
        location: t.config.location.clone(),
        options: t.config.options.clone(),
    })
}

#[derive(Default)]
struct Cutter {
    stages: BTreeMap<u32, Stage>,
    next_id: u32,
}

struct Collected {
    inputs: Vec<(u32, Exchange)>,
    sources: Vec<SourceLeaf>,
}

impl Cutter {
    /// Make a stage whose output leaves by `output`. `keep_top`: the top node
    /// is the hash repartition that stays in this stage.
    fn build_stage(
        &mut self,
        top: Arc<dyn ExecutionPlan>,
        output: Exchange,
        keep_top: bool,
    ) -> Result<u32> {
        let mut found = Collected {
            inputs: vec![],
            sources: vec![],
        };
        let body = if keep_top {
            let children = top
                .children()
                .into_iter()
                .map(|c| self.cut(c.clone(), &mut found))
                .collect::<Result<Vec<_>>>()?;
            top.replace_children(children, recompute())?
        } else {
            self.cut(top, &mut found)?
        };
        self.next_id += 1;
        let id = self.next_id;
        let stage = Stage {
            id,
            kind: StageKind::Source,
            plan: body,
            members: 1,
            inputs: found.inputs,
            sources: found.sources,
            output,
            consumer: None,
            stateful: false,
            mode: StageMode::Stream,
            concurrency: STATELESS_CONCURRENCY,
            windows: vec![],
            input_tables: vec![],
            extra_outputs: vec![],
        };
        self.stages.insert(id, stage);
        Ok(id)
    }

    fn cut(
        &mut self,
        plan: Arc<dyn ExecutionPlan>,
        found: &mut Collected,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if let Some(r) = plan.downcast_ref::<RepartitionExec>() {
            return match r.partitioning() {
                Partitioning::Hash(_, n) => {
                    let n = *n;
                    let child = self.build_stage(plan.clone(), Exchange::Hash(n), true)?;
                    found.inputs.push((child, Exchange::Hash(n)));
                    Ok(Arc::new(StageInputExec::new(
                        StageInput::Shuffle { shuffle_id: child },
                        plan.schema(),
                    )))
                }
                _ => self.cut(r.input().clone(), found),
            };
        }
        if let Some(c) = plan.downcast_ref::<CoalescePartitionsExec>() {
            let fetch = c.fetch();
            let leaf = self.gather(c.input().clone(), found)?;
            return Ok(match fetch {
                Some(n) => Arc::new(GlobalLimitExec::new(leaf, 0, Some(n))),
                None => leaf,
            });
        }
        if let Some(m) = plan.downcast_ref::<SortPreservingMergeExec>() {
            let (expr, fetch) = (m.expr().clone(), m.fetch());
            let leaf = self.gather(m.input().clone(), found)?;
            return Ok(Arc::new(SortExec::new(expr, leaf).with_fetch(fetch)));
        }
        if let Some(scan) = plan.downcast_ref::<SourceScanExec>() {
            found.sources.push(SourceLeaf {
                table: scan.table.clone(),
                config: scan.config.clone(),
                schema: scan.source.schema(),
                parallelism: scan.source.parallelism(),
            });
            return Ok(Arc::new(StageInputExec::new(
                StageInput::Source {
                    table: scan.table.clone(),
                    projection: scan.projection.clone(),
                },
                plan.schema(),
            )));
        }
        if plan.children().is_empty() {
            return Ok(plan);
        }
        let children = plan
            .children()
            .into_iter()
            .map(|c| self.cut(c.clone(), found))
            .collect::<Result<Vec<_>>>()?;
        Ok(plan.replace_children(children, recompute())?)
    }

    fn gather(
        &mut self,
        input: Arc<dyn ExecutionPlan>,
        found: &mut Collected,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let schema = input.schema();
        let child = self.build_stage(input, Exchange::Single, false)?;
        found.inputs.push((child, Exchange::Single));
        Ok(Arc::new(StageInputExec::new(
            StageInput::Shuffle { shuffle_id: child },
            schema,
        )))
    }

    /// Classify stages, split what a function cannot run, and link consumers.
    fn finish(mut self, window_sizes: &[i64]) -> Result<Vec<Stage>> {
        // A stateful source stage would keep per-epoch state in many
        // instances; instead its scans become stages of their own that gather
        // into it. Same for scans beside exchanges in a gathering stage.
        let ids: Vec<u32> = self.stages.keys().copied().collect();
        for id in ids {
            let (needs_split, has_hash_input) = {
                let s = &self.stages[&id];
                let mixed = !s.sources.is_empty() && !s.inputs.is_empty();
                let stateful_source =
                    !s.sources.is_empty() && s.inputs.is_empty() && is_stateful(&s.plan);
                (
                    mixed || stateful_source,
                    s.inputs.iter().any(|(_, e)| matches!(e, Exchange::Hash(_))),
                )
            };
            if needs_split {
                if has_hash_input {
                    return Err(EngineError::plan(format!(
                        "stage {id} reads a source next to a hash exchange; this plan shape is not supported:\n{}",
                        displayable(self.stages[&id].plan.as_ref()).indent(true)
                    )));
                }
                self.split_scans(id)?;
            }
        }
        // Consumers.
        let links: Vec<(u32, u32)> = self
            .stages
            .values()
            .flat_map(|s| s.inputs.iter().map(move |(up, _)| (*up, s.id)))
            .collect();
        for (up, down) in links {
            self.stages.get_mut(&up).expect("stage").consumer = Some(down);
        }
        // Kinds, sizes, state.
        let ids: Vec<u32> = self.stages.keys().copied().collect();
        for id in &ids {
            let s = self.stages.get_mut(id).expect("stage");
            s.stateful = is_stateful(&s.plan);
            if !s.sources.is_empty() {
                let p = s.sources[0].parallelism;
                if s.sources.iter().any(|x| x.parallelism != p) {
                    return Err(EngineError::plan(format!(
                        "stage {id} reads sources of different parallelism: {:?}",
                        s.sources
                            .iter()
                            .map(|x| (&x.table, x.parallelism))
                            .collect::<Vec<_>>()
                    )));
                }
                s.kind = StageKind::Source;
                s.members = p as u32;
            } else if s.inputs.iter().all(|(_, e)| matches!(e, Exchange::Hash(_)))
                && !s.inputs.is_empty()
            {
                let n = match s.inputs[0].1 {
                    Exchange::Hash(n) => n,
                    _ => unreachable!("all inputs are hash exchanges"),
                };
                if s.inputs.iter().any(|(_, e)| *e != Exchange::Hash(n)) {
                    return Err(EngineError::plan(format!(
                        "stage {id} has hash inputs of different sizes"
                    )));
                }
                s.kind = StageKind::Group;
                s.members = n as u32;
            } else if s.inputs.iter().all(|(_, e)| *e == Exchange::Single) && !s.inputs.is_empty() {
                s.kind = StageKind::Single;
                s.members = 1;
            } else if s.inputs.is_empty() {
                // Constant input (VALUES, generate_series, SELECT 1): one
                // function, triggered like a source; it emits its rows in
                // the first epoch and nothing after.
                s.kind = StageKind::Source;
                s.members = 1;
                s.stateful = false;
            } else {
                return Err(EngineError::plan(format!(
                    "stage {id} mixes hash and gathering inputs"
                )));
            }
            // A function that receives payloads collects each epoch in its
            // arena, which lives in one instance: a second instance would
            // hold part of an epoch that never completes. Only source
            // functions, which receive triggers, can run many at once.
            s.concurrency = if s.kind == StageKind::Source {
                STATELESS_CONCURRENCY
            } else {
                1
            };
        }
        // Window columns of each input edge, from the leaves' schemas.
        for id in &ids {
            let s = self.stages.get_mut(id).expect("stage");
            let mut windows = vec![];
            for (up, _) in &s.inputs {
                let schema = leaf_schema(&s.plan, *up);
                let fixed = schema
                    .as_ref()
                    .and_then(|sch| edge_window(sch, window_sizes))
                    .map(EdgeWindow::Fixed);
                let window = fixed
                    .or_else(|| session_over_leaf(&s.plan, *up).map(EdgeWindow::Session))
                    .or_else(|| {
                        schema
                            .filter(|sch| has_session_column(sch))
                            .map(|_| EdgeWindow::SessionStarts)
                    });
                windows.push(window);
            }
            s.windows = windows;
        }
        // Modes: a stateful stage accumulates unless every input already
        // arrives as whole windows, i.e. comes from a path through a stateful
        // stage (which only emits windows the watermark has closed).
        for id in &ids {
            let inputs = self.stages[id].inputs.clone();
            let all_complete = !inputs.is_empty()
                && inputs.iter().all(|(up, _)| {
                    let s = &self.stages[up];
                    s.mode != StageMode::Stream
                        || self.any_upstream(*up, &|x| x.mode != StageMode::Stream)
                });
            let s = self.stages.get_mut(id).expect("stage");
            s.mode = match (s.stateful, all_complete) {
                (false, _) => StageMode::Stream,
                (true, false) => StageMode::Accumulate,
                (true, true) => StageMode::Complete,
            };
            if s.kind == StageKind::Source && s.stateful {
                return Err(EngineError::plan(format!("source stage {id} is stateful")));
            }
        }
        for id in &ids {
            let tables = self.stages[id]
                .inputs
                .iter()
                .map(|(up, _)| self.tables_behind(*up))
                .collect();
            self.stages.get_mut(id).expect("stage").input_tables = tables;
        }
        self.merge_scans_of_one_table();
        Ok(self.stages.into_values().collect())
    }

    /// The source tables whose rows reach stage `id`'s output.
    fn tables_behind(&self, id: u32) -> Vec<SourceLeaf> {
        let s = &self.stages[&id];
        let mut out = s.sources.clone();
        for (up, _) in &s.inputs {
            for t in self.tables_behind(*up) {
                if !out.iter().any(|o| o.table == t.table) {
                    out.push(t);
                }
            }
        }
        out
    }

    /// A table scanned in several places (a self-join) would otherwise be
    /// pulled by several source stages, each with a consumer of its own that
    /// stops at different offsets: windows would split between epochs, and
    /// events would be counted twice. Source stages that read the same table
    /// become one, which pulls once and feeds every consumer.
    fn merge_scans_of_one_table(&mut self) {
        let mut by_table: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        for s in self.stages.values() {
            let mergeable = s.kind == StageKind::Source
                && s.inputs.is_empty()
                && s.sources.len() == 1
                && s.consumer.is_some()
                && s.output != Exchange::Sink;
            if mergeable {
                let src = &s.sources[0];
                let key = format!("{}\u{1f}{:?}", src.table, src.config);
                by_table.entry(key).or_default().push(s.id);
            }
        }
        for ids in by_table.into_values().filter(|ids| ids.len() > 1) {
            let (primary, others) = ids.split_first().expect("two or more");
            for other in others {
                let s = self.stages.remove(other).expect("stage");
                let p = self.stages.get_mut(primary).expect("stage");
                p.extra_outputs.push(MergedOutput {
                    shuffle_id: s.id,
                    plan: s.plan,
                    output: s.output,
                    consumer: s.consumer,
                });
            }
        }
    }

    /// Stages are created children-first, so upstream modes are known.
    fn any_upstream(&self, id: u32, pred: &dyn Fn(&Stage) -> bool) -> bool {
        self.stages[&id]
            .inputs
            .iter()
            .any(|(up, _)| pred(&self.stages[up]) || self.any_upstream(*up, pred))
    }

    fn split_scans(&mut self, id: u32) -> Result<()> {
        let stage = self.stages.remove(&id).expect("stage");
        let mut inputs = stage.inputs.clone();
        let mut new_stages = vec![];
        let plan = replace_source_leaves(&stage.plan, &mut |leaf, schema| {
            self.next_id += 1;
            let scan_id = self.next_id;
            let source = stage
                .sources
                .iter()
                .find(|s| matches!(&leaf.input, StageInput::Source { table, .. } if *table == s.table))
                .cloned()
                .expect("leaf of a known source");
            new_stages.push(Stage {
                id: scan_id,
                kind: StageKind::Source,
                plan: Arc::new(StageInputExec::new(leaf.input.clone(), schema.clone())),
                members: 1,
                inputs: vec![],
                sources: vec![source],
                output: Exchange::Single,
                consumer: Some(id),
                stateful: false,
                mode: StageMode::Stream,
                concurrency: STATELESS_CONCURRENCY,
                windows: vec![],
                input_tables: vec![],
                extra_outputs: vec![],
            });
            inputs.push((scan_id, Exchange::Single));
            Arc::new(StageInputExec::new(
                StageInput::Shuffle {
                    shuffle_id: scan_id,
                },
                schema,
            ))
        })?;
        for s in new_stages {
            self.stages.insert(s.id, s);
        }
        self.stages.insert(
            id,
            Stage {
                plan,
                inputs,
                sources: vec![],
                ..stage
            },
        );
        Ok(())
    }
}

fn replace_source_leaves(
    plan: &Arc<dyn ExecutionPlan>,
    f: &mut dyn FnMut(&StageInputExec, SchemaRef) -> Arc<dyn ExecutionPlan>,
) -> Result<Arc<dyn ExecutionPlan>> {
    rewrite_leaves::<EngineError>(plan, &mut |leaf, node| {
        Ok(match leaf.input {
            StageInput::Source { .. } => f(leaf, node.schema()),
            StageInput::Shuffle { .. } => node.clone(),
        })
    })
}

fn describe_output(output: Exchange, consumer: Option<u32>, sink: &str) -> String {
    match (output, consumer) {
        (Exchange::Hash(n), Some(c)) => format!("hash exchange -> stage {c} ({n} members)"),
        (Exchange::Single, Some(c)) => format!("gather -> stage {c}"),
        _ => format!("sink {sink}"),
    }
}

/// The window column of an exchange schema: a field with window metadata,
/// or else (metadata does not survive every operator, e.g. `unnest`) a
/// timestamp column named `window_start` when the query uses one window size.
fn edge_window(schema: &SchemaRef, window_sizes: &[i64]) -> Option<WindowColumn> {
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
fn session_over_leaf(plan: &Arc<dyn ExecutionPlan>, shuffle: u32) -> Option<SessionSpec> {
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
fn reaches_leaf_unchanged(plan: &Arc<dyn ExecutionPlan>, shuffle: u32) -> bool {
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
fn window_sizes(plan: &LogicalPlan) -> Vec<i64> {
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

fn leaf_schema(plan: &Arc<dyn ExecutionPlan>, shuffle: u32) -> Option<SchemaRef> {
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

/// Whether a sub-plan holds state beyond one batch (and so beyond one epoch).
pub fn is_stateful(plan: &Arc<dyn ExecutionPlan>) -> bool {
    use datafusion::physical_plan::empty::EmptyExec;
    use datafusion::physical_plan::filter::FilterExec;
    use datafusion::physical_plan::placeholder_row::PlaceholderRowExec;
    use datafusion::physical_plan::projection::ProjectionExec;
    use datafusion::physical_plan::union::UnionExec;
    use datafusion::physical_plan::unnest::UnnestExec;
    let stateless = plan.downcast_ref::<ProjectionExec>().is_some()
        || plan.downcast_ref::<FilterExec>().is_some()
        || plan.downcast_ref::<StageInputExec>().is_some()
        || plan.downcast_ref::<RepartitionExec>().is_some()
        || plan.downcast_ref::<UnnestExec>().is_some()
        || plan.downcast_ref::<UnionExec>().is_some()
        || plan.downcast_ref::<EmptyExec>().is_some()
        || plan.downcast_ref::<PlaceholderRowExec>().is_some()
        // Fetches by key per batch; its cache is no state of the query.
        || plan.downcast_ref::<crate::lookup::exec::LookupJoinExec>().is_some()
        || passes_batches_through(plan);
    let own = if let Some(agg) = plan.downcast_ref::<AggregateExec>() {
        *agg.mode() != AggregateMode::Partial
    } else {
        !stateless
    };
    own || plan.children().into_iter().any(is_stateful)
}

impl QueryPlan {
    pub fn stage(&self, id: u32) -> &Stage {
        self.stages
            .iter()
            .find(|s| s.id == id)
            .expect("stage id from this plan")
    }

    /// The stage that sends on edge `shuffle_id`: the stage of that id, or
    /// the source stage one of whose merged outputs it is.
    pub fn sender(&self, shuffle_id: u32) -> &Stage {
        self.stages
            .iter()
            .find(|s| {
                s.id == shuffle_id || s.extra_outputs.iter().any(|o| o.shuffle_id == shuffle_id)
            })
            .expect("edge id from this plan")
    }

    pub fn source_stages(&self) -> impl Iterator<Item = &Stage> {
        self.stages.iter().filter(|s| s.kind == StageKind::Source)
    }

    pub fn function_count(&self) -> usize {
        self.stages.iter().map(|s| s.members as usize).sum()
    }

    /// The cloud context of every function, by name, with its concurrency.
    pub fn contexts(
        &self,
        options: &PlanOptions,
        epochs: Option<u64>,
    ) -> Result<Vec<(CloudContext, usize)>> {
        let mut out = vec![];
        for s in &self.stages {
            let plan = plan_to_bytes(s.plan.clone())?;
            let next = self.next_hop(s.output, s.consumer);
            let extra_outputs = s
                .extra_outputs
                .iter()
                .map(|o| {
                    Ok(ExtraOutput {
                        shuffle_id: o.shuffle_id,
                        plan: plan_to_bytes(o.plan.clone())?,
                        next: self.next_hop(o.output, o.consumer),
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            let inputs = s
                .inputs
                .iter()
                .enumerate()
                .map(|(i, (up, _))| {
                    let tables = s.input_tables.get(i).cloned().unwrap_or_default();
                    let late_letters = tables
                        .iter()
                        .find(|t| t.config.option(OPT_LATE) == Some("dead-letter"))
                        .map(|t| t.config.clone());
                    InputEdge {
                        shuffle_id: *up,
                        senders: self.sender(*up).members,
                        window: s.windows.get(i).cloned().flatten(),
                        tables: tables.into_iter().map(|t| t.table).collect(),
                        late_letters,
                    }
                })
                .collect();
            let sources = s
                .sources
                .iter()
                .map(|src| {
                    Ok(SourceBinding {
                        table: src.table.clone(),
                        config: src.config.clone(),
                        schema: schema_to_bytes(&src.schema)?,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            for member in 0..s.members {
                out.push((
                    CloudContext {
                        query_code: self.query_code.clone(),
                        stage: s.id,
                        member,
                        members: s.members,
                        mode: s.mode,
                        plan: plan.clone(),
                        inputs: Vec::clone(&inputs),
                        sources: sources.clone(),
                        next: next.clone(),
                        extra_outputs: extra_outputs.clone(),
                        encoding: options.encoding,
                        invoke_async: options.invoke_async,
                        epochs,
                        run: options.run.clone(),
                        checkpoint: options.checkpoint.clone(),
                    },
                    s.concurrency,
                ));
            }
        }
        Ok(out)
    }

    fn next_hop(&self, output: Exchange, consumer: Option<u32>) -> NextHop {
        match (output, consumer) {
            (Exchange::Sink, _) | (_, None) => NextHop::Sink(self.sink.clone()),
            (Exchange::Hash(n), Some(c)) => NextHop::Group {
                stage: c,
                members: n as u32,
            },
            (Exchange::Single, Some(c)) => NextHop::Single { stage: c },
        }
    }

    /// `skein explain`: the DAG in words.
    pub fn explain(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "query {}: {} stages, {} functions, group size {}, sink {} {}",
            self.query_code,
            self.stages.len(),
            self.function_count(),
            self.group_size,
            self.sink.kind,
            self.sink.location
        );
        for s in &self.stages {
            let names: Vec<String> = (0..s.members)
                .map(|m| function_name(&self.query_code, s.id, m))
                .collect();
            let names = if names.len() > 3 {
                format!("{} .. {}", names[0], names[names.len() - 1])
            } else {
                names.join(", ")
            };
            let output = describe_output(s.output, s.consumer, &self.sink.kind);
            let _ = writeln!(
                out,
                "\nstage {:02} [{:?}, {:?}] members {} concurrency {} -> {}\n  functions: {}",
                s.id, s.kind, s.mode, s.members, s.concurrency, output, names
            );
            for (i, w) in s.windows.iter().enumerate() {
                let edge = s.inputs[i].0;
                let _ = match w {
                    Some(EdgeWindow::Fixed(w)) => writeln!(
                        out,
                        "  input {edge}: window column #{} size {} ms",
                        w.index, w.size_ms
                    ),
                    Some(EdgeWindow::Session(spec)) => writeln!(
                        out,
                        "  input {edge}: session windows over column #{} keyed by {:?}, gap {} ms",
                        spec.time, spec.keys, spec.gap_ms
                    ),
                    Some(EdgeWindow::SessionStarts) => {
                        writeln!(out, "  input {edge}: whole sessions")
                    }
                    None => Ok(()),
                };
            }
            for line in displayable(s.plan.as_ref())
                .indent(true)
                .to_string()
                .lines()
            {
                let _ = writeln!(out, "    {line}");
            }
            for o in &s.extra_outputs {
                let _ = writeln!(
                    out,
                    "  from the same read, edge {} -> {}",
                    o.shuffle_id,
                    describe_output(o.output, o.consumer, &self.sink.kind)
                );
                for line in displayable(o.plan.as_ref())
                    .indent(true)
                    .to_string()
                    .lines()
                {
                    let _ = writeln!(out, "    {line}");
                }
            }
        }
        out
    }

    /// A JSON description of the DAG for scripts.
    pub fn explain_json(&self) -> serde_json::Value {
        serde_json::json!({
            "query_code": self.query_code,
            "group_size": self.group_size,
            "functions": self.function_count(),
            "stages": self.stages.iter().map(|s| serde_json::json!({
                "id": s.id,
                "kind": s.kind,
                "mode": s.mode,
                "members": s.members,
                "concurrency": s.concurrency,
                "output": s.output,
                "consumer": s.consumer,
                "extra_outputs": s.extra_outputs.iter().map(|o| serde_json::json!({
                    "edge": o.shuffle_id,
                    "output": o.output,
                    "consumer": o.consumer,
                })).collect::<Vec<_>>(),
                "functions": (0..s.members).map(|m| function_name(&self.query_code, s.id, m)).collect::<Vec<_>>(),
                "operators": displayable(s.plan.as_ref()).indent(true).to_string().lines().map(|l| l.trim().to_string()).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        })
    }
}
