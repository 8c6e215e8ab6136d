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
//! Each cut leaves a [`StageInputExec`](crate::exec::StageInputExec) leaf in the stage above. Source scans
//! become leaves too: a source stage pulls its micro-batch each epoch.
//!
//! Here: the plan types and [`plan_query`]; `cut.rs` cuts the plan into
//! stages, `classify.rs` gives each its kind and mode, `window_edges.rs`
//! finds the window or session column of each exchange edge, and
//! `explain.rs` prints the result.

use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::logical_expr::{DmlStatement, LogicalPlan, WriteOp};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::codec::{plan_to_bytes, schema_to_bytes};
use crate::context::{
    CheckpointSpec, CloudContext, EdgeWindow, ExtraOutput, InputEdge, NextHop, SourceBinding,
    StageMode, UpdatingSpec,
};
use crate::error::{EngineError, Result};
use crate::payload::Encoding;
pub use crate::session::session;
use crate::sink::SinkConfig;
use crate::source::SourceConfig;
use crate::watermark::OPT_LATE;

mod classify;
mod cut;
mod explain;
#[cfg(feature = "sql")]
mod insert;
mod rescale;
mod shape;
mod static_join;
mod updating;
mod window_edges;

use classify::is_ordered;
pub use classify::is_stateful;
use cut::Cutter;
pub use rescale::Layout;
pub use shape::{PlanShape, StageShape};
use window_edges::window_sizes;

/// Concurrency of source functions: each trigger is independent.
pub const STATELESS_CONCURRENCY: usize = 1000;
/// Members of a function group when not given.
pub const DEFAULT_GROUP_SIZE: usize = 8;
/// Bytes of an aggregate's groups a member keeps in memory when not given
/// (`--state-memory`); past them, cold groups go to local disk.
pub const DEFAULT_STATE_MEMORY: u64 = 16 << 20;

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

/// What feeds a stage: sources, a hash exchange or a gathering one.
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

/// A source table a stage reads.
#[derive(Debug, Clone)]
pub struct SourceLeaf {
    /// The table's name.
    pub table: String,
    /// Its declaration.
    pub config: SourceConfig,
    /// Its schema.
    pub schema: SchemaRef,
    /// How many instances read it (its source's partitioning).
    pub parallelism: usize,
    /// Why that many (a default sized from partitions and cores, the
    /// table's own option, its checkpoint); none for a kind not sized so.
    pub parallelism_why: Option<String>,
    /// Its rows are a changelog (a change-data-capture source).
    pub changelog: bool,
}

/// A piece of the plan one function (or group of them) runs.
#[derive(Debug, Clone)]
pub struct Stage {
    /// The stage id, also the id of its output edge.
    pub id: u32,
    /// What feeds it.
    pub kind: StageKind,
    /// Its sub-plan, with leaves for its inputs.
    pub plan: Arc<dyn ExecutionPlan>,
    /// How many functions run it.
    pub members: u32,
    /// Upstream stage ids and the exchange they send with.
    pub inputs: Vec<(u32, Exchange)>,
    /// The source tables it reads.
    pub sources: Vec<SourceLeaf>,
    /// How its output leaves it.
    pub output: Exchange,
    /// The stage that consumes this one's output (None for the sink stage).
    pub consumer: Option<u32>,
    /// Whether it holds state across epochs.
    pub stateful: bool,
    /// When it runs.
    pub mode: StageMode,
    /// Its output is a changelog: it updates (see [`StageMode::Updating`]),
    /// or passes on the changes of an input that does.
    pub updating: bool,
    /// How many instances of each function may run at once.
    pub concurrency: usize,
    /// The window column of each input edge, in input order.
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
    /// The edge id its consumer knows.
    pub shuffle_id: u32,
    /// Its sub-plan.
    pub plan: Arc<dyn ExecutionPlan>,
    /// How it leaves.
    pub output: Exchange,
    /// The stage it feeds, if not the sink.
    pub consumer: Option<u32>,
}

/// A query cut into stages: what `skein explain` prints and the backends deploy.
#[derive(Debug, Clone)]
pub struct QueryPlan {
    /// The query text.
    pub sql: String,
    /// Its code (see [`query_code`]).
    pub query_code: String,
    /// Members of each function group.
    pub group_size: usize,
    /// The stages, by id.
    pub stages: Vec<Stage>,
    /// Where the results go.
    pub sink: SinkConfig,
    /// The schema of the results.
    pub output_schema: SchemaRef,
    /// The logical plan of the query's result, for single-process checks.
    pub logical: LogicalPlan,
    /// Whether the result has an ORDER BY (order matters when comparing).
    pub ordered: bool,
}

/// Options of the planning session.
#[derive(Debug, Clone)]
pub struct PlanOptions {
    /// Members of each function group.
    pub group_size: usize,
    /// How payloads are compressed.
    pub encoding: Encoding,
    /// Invoke the next hop asynchronously.
    pub invoke_async: bool,
    /// The run's lineage (see [`CloudContext::run`]).
    pub run: String,
    /// Checkpointing, if the query checkpoints.
    pub checkpoint: Option<CheckpointSpec>,
    /// The run's `--interval`, if given: updating stages turn the sink's
    /// `'emit.interval'` into a number of epochs with it.
    pub interval: Option<std::time::Duration>,
    /// `--state-ttl`: how long an updating stage keeps rows of a key nothing
    /// touched, for tables that do not set `'state.ttl'`.
    pub state_ttl: Option<std::time::Duration>,
    /// `--state-memory`: bytes of an aggregate's groups each member keeps
    /// in memory before the cold ones go to local disk; `None`, all.
    pub state_memory: Option<u64>,
    /// `--autoscale`: a standing run sizes its groups from their work.
    pub autoscale: Option<crate::autoscale::AutoscaleSpec>,
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
            interval: None,
            state_ttl: None,
            state_memory: Some(DEFAULT_STATE_MEMORY),
            autoscale: None,
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

pub use crate::table_options::{EMIT_INTERVAL_OPTION, STATE_TTL_OPTION};

/// A table's `'state.ttl'`, if it sets one.
pub fn state_ttl_option(config: &SourceConfig) -> Result<Option<std::time::Duration>> {
    crate::interval::duration_option(config, STATE_TTL_OPTION)
}

/// Sink option: `updates` makes every stage emit per epoch (see [`plan_query`]).
pub use crate::table_options::{EMIT_OPTION, EMIT_UPDATES};

/// Run the script's DDL in `ctx` and plan its one query into stages.
#[cfg(feature = "sql")]
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
    let logical = match ctx.state().create_logical_plan(query).await {
        Ok(logical) => logical,
        Err(refused) => match insert::by_position(ctx, query).await {
            Ok(Some(logical)) => logical,
            _ => return Err(refused.into()),
        },
    };
    plan_logical(ctx, logical, sql, options).await
}

/// Plan a query built with DataFusion's DataFrame API over the tables of
/// `ctx` (a [`session`] over the catalog, where the frame was built) into
/// stages, as [`plan_query`] plans SQL text. The plan's text, for its query
/// code and for what a checkpoint records, is the frame's logical plan.
pub async fn plan_dataframe(
    ctx: &SessionContext,
    frame: datafusion::dataframe::DataFrame,
    options: &PlanOptions,
) -> Result<QueryPlan> {
    if options.group_size == 0 {
        return Err(EngineError::plan("the group size must be at least 1"));
    }
    let logical = frame.into_unoptimized_plan();
    let text = format!("-- a DataFrame\n{}", logical.display_indent());
    plan_logical(ctx, logical, &text, options).await
}

/// The query of `sql` (its text, for the code), as DataFusion planned it,
/// cut into stages: a plain query goes to the collector, `INSERT INTO` to
/// its sink table.
async fn plan_logical(
    ctx: &SessionContext,
    logical: LogicalPlan,
    sql: &str,
    options: &PlanOptions,
) -> Result<QueryPlan> {
    let mut sink_table = None;
    let (logical, sink) = match logical {
        LogicalPlan::Dml(DmlStatement {
            table_name,
            op: WriteOp::Insert(_),
            input,
            ..
        }) => {
            let sink = sink_config_for(ctx, &table_name.to_string()).await?;
            sink_table = Some(table_name.to_string());
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
    let physical = window_edges::project_group_keys(physical)?;
    let physical = static_join::build_bounded_sides_in_place(physical)?;
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
            s.updating = false;
        }
    }
    let plan = QueryPlan {
        sql: sql.to_string(),
        query_code: query_code(sql),
        group_size: options.group_size,
        stages,
        sink,
        output_schema,
        logical,
        ordered,
    };
    for warning in plan.unbounded_joins(options.state_ttl) {
        tracing::warn!("{warning}");
    }
    for warning in plan.recomputing_stages(options.state_ttl) {
        tracing::warn!("{warning}");
    }
    if let (Some(table), true) = (&sink_table, plan.updates()) {
        let catalog = crate::session::catalog_of(ctx);
        if let Some(Err(reason)) = catalog.map(|c| c.sink_takes_updates(&plan.sink)) {
            return Err(EngineError::plan(format!(
                "table {table} (STORED AS {}) cannot take this query's result, which updates: \
                 {reason}; it updates because of {}",
                plan.sink.kind.to_ascii_uppercase(),
                plan.updating_cause()
            )));
        }
    }
    Ok(plan)
}

/// A sink table is declared like a source (`CREATE EXTERNAL TABLE ... STORED
/// AS REDIS ...`); its config becomes the sink's.
async fn sink_config_for(ctx: &SessionContext, table: &str) -> Result<SinkConfig> {
    let provider = ctx.table_provider(table).await?;
    let config = crate::catalog::table::declaration(provider.as_ref())
        .ok_or_else(|| EngineError::plan(format!("{table} is not a table Skein can write to")))?;
    Ok(crate::catalog::table::sink_config(config))
}

impl QueryPlan {
    /// The stage with id `id`.
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

    /// The stages that read sources.
    pub fn source_stages(&self) -> impl Iterator<Item = &Stage> {
        self.stages.iter().filter(|s| s.kind == StageKind::Source)
    }

    /// The declaration of every source table the query reads, per stage
    /// that reads it.
    pub fn source_tables(&self) -> impl Iterator<Item = &SourceConfig> {
        self.stages
            .iter()
            .flat_map(|s| s.sources.iter().map(|l| &l.config))
    }

    /// How many functions the query deploys.
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
            let inputs = self.input_edges(s);
            let updating = match s.mode {
                StageMode::Updating => Some(self.updating_spec(s, options)?),
                _ => None,
            };
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
                        key_groups: s.key_groups().unwrap_or(0),
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
                        updating: updating.clone(),
                    },
                    s.concurrency,
                ));
            }
        }
        Ok(out)
    }

    /// The sub-plan that sends on edge `shuffle_id`.
    fn output_plan(&self, shuffle_id: u32) -> &Arc<dyn ExecutionPlan> {
        let s = self.sender(shuffle_id);
        if s.id == shuffle_id {
            return &s.plan;
        }
        &s.extra_outputs
            .iter()
            .find(|o| o.shuffle_id == shuffle_id)
            .expect("edge id from this plan")
            .plan
    }

    /// Whether the query's result is a changelog: its last stage updates.
    pub fn updates(&self) -> bool {
        self.stages
            .iter()
            .any(|s| s.output == Exchange::Sink && s.updating)
    }

    /// The edges stage `s` reads, as its functions' contexts carry them.
    fn input_edges(&self, s: &Stage) -> Vec<InputEdge> {
        s.inputs
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
                    sender_stage: Some(self.sender(*up).id),
                    window: s.windows.get(i).cloned().flatten(),
                    tables: tables.into_iter().map(|t| t.table).collect(),
                    late_letters,
                    updating: self.sender(*up).updating,
                    key: updating::edge_key(self.output_plan(*up)),
                }
            })
            .collect()
    }

    /// How an updating stage computes its changes and what it keeps, in
    /// words; `None` for other stages.
    pub fn state_path(&self, s: &Stage) -> Option<crate::updating::StatePath> {
        if s.mode != StageMode::Updating {
            return None;
        }
        let schemas = crate::updating::leaf_schemas(&s.plan);
        let plan =
            crate::updating::UpdatingPlan::new(&s.plan, &self.input_edges(s), &schemas).ok()?;
        // The run's --interval is not known here: the tables' decides.
        Some(plan.path(self.emit_every(None).unwrap_or(1)))
    }

    /// Epochs of `interval` (the run's, else the tables') in `d`, at least
    /// one.
    fn epochs_in(
        &self,
        interval: Option<std::time::Duration>,
        d: std::time::Duration,
    ) -> Result<u64> {
        let epoch = crate::interval::effective_interval(interval, self.source_tables())?;
        Ok((d.as_secs_f64() / epoch.as_secs_f64().max(1e-3))
            .ceil()
            .max(1.0) as u64)
    }

    /// How many epochs an updating stage emits every: the sink's
    /// `'emit.interval'` in epochs of `interval`, else every epoch.
    fn emit_every(&self, interval: Option<std::time::Duration>) -> Result<u64> {
        match self.sink.options.get(EMIT_INTERVAL_OPTION) {
            None => Ok(1),
            Some(text) => {
                let d = crate::interval::parse_duration(text).map_err(|e| {
                    EngineError::plan(format!("option '{EMIT_INTERVAL_OPTION}' = {text:?}: {e}"))
                })?;
                self.epochs_in(interval, d)
            }
        }
    }

    fn updating_spec(&self, s: &Stage, options: &PlanOptions) -> Result<UpdatingSpec> {
        let emit_every = self.emit_every(options.interval)?;
        let mut ttl_epochs = vec![];
        for tables in &s.input_tables {
            let mut ttl: Option<std::time::Duration> = None;
            for t in tables {
                if let Some(d) = state_ttl_option(&t.config)? {
                    ttl = Some(ttl.map_or(d, |x| x.min(d)));
                }
            }
            ttl_epochs.push(
                ttl.or(options.state_ttl)
                    .map(|d| self.epochs_in(options.interval, d))
                    .transpose()?,
            );
        }
        Ok(UpdatingSpec {
            emit_every,
            ttl_epochs,
            memory: options.state_memory,
        })
    }

    fn next_hop(&self, output: Exchange, consumer: Option<u32>) -> NextHop {
        match (output, consumer) {
            (Exchange::Sink, _) | (_, None) => NextHop::Sink(self.sink.clone()),
            // The group's size, not the key groups (`n`): after a rescale
            // they differ, and the ring maps the one onto the other.
            (Exchange::Hash(_), Some(c)) => NextHop::Group {
                stage: c,
                members: self.stage(c).members,
            },
            (Exchange::Single, Some(c)) => NextHop::Single { stage: c },
        }
    }
}
