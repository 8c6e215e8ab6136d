//! Plan nodes of our own: the table that wraps a [`Source`], its scan, and
//! the leaf that stands for a stage's input once the plan is cut.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{Session, TableProvider, TableProviderFactory};
use datafusion::common::{DataFusionError, Result as DfResult, project_schema};
use datafusion::datasource::TableType;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{CreateExternalTable, Expr};
use datafusion::physical_expr::{EquivalenceProperties, Partitioning};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::memory::MemoryStream;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use serde::{Deserialize, Serialize};

use crate::source::{EpochSpec, Source, SourceConfig, SourceRegistry};

pub use crate::watermark::{OPT_EVENT_TIME, OPT_LATENESS_MS};

/// The `ExecutionPlan` methods of a node without expressions of its own.
#[macro_export]
#[doc(hidden)]
macro_rules! no_expressions_method {
    () => {
        fn apply_expressions(
            &self,
            _f: &mut dyn FnMut(
                &std::sync::Arc<dyn datafusion::physical_expr::PhysicalExpr>,
            ) -> datafusion::common::Result<
                datafusion::common::tree_node::TreeNodeRecursion,
            >,
        ) -> datafusion::common::Result<datafusion::common::tree_node::TreeNodeRecursion> {
            Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
        }
    };
}

/// The `ExecutionPlan` methods of a leaf: no children, no expressions.
#[macro_export]
#[doc(hidden)]
macro_rules! leaf_node_methods {
    () => {
        fn children(&self) -> Vec<&std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
            vec![]
        }
        $crate::no_expressions_method!();
        fn with_new_children(
            self: std::sync::Arc<Self>,
            _: Vec<std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>>,
        ) -> datafusion::common::Result<std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>>
        {
            Ok(self)
        }
    };
}

/// A streaming table: a declared schema and the source that fills it.
#[derive(Debug)]
pub struct SourceTable {
    /// The table's name.
    pub name: String,
    /// The table's declaration.
    pub config: SourceConfig,
    /// The source it reads.
    pub source: Arc<dyn Source>,
}

impl SourceTable {
    /// A table reading `source`.
    pub fn new(name: impl Into<String>, config: SourceConfig, source: Arc<dyn Source>) -> Self {
        SourceTable {
            name: name.into(),
            config,
            source,
        }
    }
}

#[async_trait]
impl TableProvider for SourceTable {
    fn schema(&self) -> SchemaRef {
        self.source.schema()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(SourceScanExec::new(
            self.name.clone(),
            self.config.clone(),
            self.source.clone(),
            projection.cloned(),
        )?))
    }
}

/// `CREATE EXTERNAL TABLE t (...) STORED AS <KIND> LOCATION '...' OPTIONS (...)`
/// for every kind in the registry.
#[derive(Clone)]
pub struct SourceTableFactory {
    /// The source kinds tables can be declared with.
    pub registry: SourceRegistry,
}

impl fmt::Debug for SourceTableFactory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SourceTableFactory({:?})", self.registry.kinds())
    }
}

#[async_trait]
impl TableProviderFactory for SourceTableFactory {
    async fn create(
        &self,
        _state: &dyn Session,
        cmd: &CreateExternalTable,
    ) -> DfResult<Arc<dyn TableProvider>> {
        let options: BTreeMap<String, String> = cmd
            .options
            .iter()
            // DataFusion prefixes options it does not know with "format.".
            .map(|(k, v)| {
                (
                    k.strip_prefix("format.").unwrap_or(k).to_string(),
                    v.clone(),
                )
            })
            .collect();
        let config = SourceConfig {
            kind: cmd.file_type.to_ascii_uppercase(),
            location: cmd.locations.first().cloned().unwrap_or_default(),
            options,
        };
        let schema: SchemaRef = Arc::new(cmd.schema.as_arrow().clone());
        if crate::lookup::LookupOptions::declared(&config) {
            // Opened here only to check it: the join opens its own.
            self.registry
                .create_lookup(&config, &schema)
                .map_err(|e| DataFusionError::Plan(format!("table {}: {e}", cmd.name)))?;
            return Ok(Arc::new(crate::lookup::exec::LookupTable {
                name: cmd.name.to_string(),
                config,
                schema,
            }));
        }
        let source = self
            .registry
            .create(&config, schema)
            .map_err(|e| DataFusionError::Plan(format!("table {}: {e}", cmd.name)))?;
        // Event-time options are checked here, so a typo fails the
        // CREATE TABLE rather than a function later.
        let event_time = crate::watermark::EventTimeOptions::from_config(&config, &source.schema())
            .map_err(|e| DataFusionError::Plan(format!("table {}: {e}", cmd.name)))?;
        if event_time.late == crate::watermark::LatePolicy::DeadLetter
            && self
                .registry
                .dead_letters(&config)
                .map_err(|e| DataFusionError::Plan(format!("table {}: {e}", cmd.name)))?
                .is_none()
        {
            return Err(DataFusionError::Plan(format!(
                "table {}: 'late' 'dead-letter' needs a dead-letter destination \
                 (for Kafka, 'dead.letter.topic'); {} tables declare none here",
                cmd.name, config.kind
            )));
        }
        Ok(Arc::new(SourceTable::new(
            cmd.name.to_string(),
            config,
            source,
        )))
    }
}

pub(crate) fn leaf_properties(schema: SchemaRef, partitions: usize) -> Arc<PlanProperties> {
    Arc::new(PlanProperties::new(
        EquivalenceProperties::new(schema),
        Partitioning::UnknownPartitioning(partitions.max(1)),
        EmissionType::Incremental,
        Boundedness::Bounded,
    ))
}

/// Scans a whole source as a bounded table: one partition per source
/// instance. Used by single-process runs (`--verify`); a staged run replaces
/// it with a [`StageInputExec`] fed per epoch.
#[derive(Debug)]
pub struct SourceScanExec {
    /// The table scanned.
    pub table: String,
    /// The table's declaration.
    pub config: SourceConfig,
    /// The source it reads.
    pub source: Arc<dyn Source>,
    /// The columns scanned, if not all.
    pub projection: Option<Vec<usize>>,
    schema: SchemaRef,
    props: Arc<PlanProperties>,
}

impl SourceScanExec {
    /// A scan of `source` with one partition per source instance.
    pub fn new(
        table: String,
        config: SourceConfig,
        source: Arc<dyn Source>,
        projection: Option<Vec<usize>>,
    ) -> DfResult<Self> {
        let schema = project_schema(&source.schema(), projection.as_ref())?;
        let props = leaf_properties(schema.clone(), source.parallelism());
        Ok(SourceScanExec {
            table,
            config,
            source,
            projection,
            schema,
            props,
        })
    }
}

impl DisplayAs for SourceScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "SourceScanExec: table={} kind={} instances={}",
            self.table,
            self.config.kind,
            self.source.parallelism()
        )
    }
}

impl ExecutionPlan for SourceScanExec {
    fn name(&self) -> &str {
        "SourceScanExec"
    }
    fn properties(&self) -> &Arc<PlanProperties> {
        &self.props
    }
    crate::leaf_node_methods!();
    fn execute(
        &self,
        partition: usize,
        _ctx: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let source = self.source.clone();
        let projection = self.projection.clone();
        let instances = source.parallelism();
        let schema = self.schema.clone();
        let fut = async move {
            let spec = EpochSpec {
                instance: partition,
                instances,
                epoch: 0,
                epochs: Some(1),
            };
            let mb = source
                .pull(spec)
                .await
                .map_err(|e| DataFusionError::External(Box::new(e)))?;
            let batches = mb
                .batches
                .into_iter()
                .map(|b| match &projection {
                    Some(p) => b.project(p).map_err(DataFusionError::from),
                    None => Ok(b),
                })
                .collect::<DfResult<Vec<_>>>()?;
            Ok::<_, DataFusionError>(futures::stream::iter(batches.into_iter().map(Ok)))
        };
        use futures::TryStreamExt;
        let stream = futures::stream::once(fut).try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

/// What feeds a stage leaf.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StageInput {
    /// The micro-batch a source instance pulls for its table.
    Source {
        /// The table.
        table: String,
        /// The columns read, if not all.
        projection: Option<Vec<usize>>,
    },
    /// Payloads that arrive on exchange edge `shuffle_id`.
    Shuffle {
        /// The edge id: the sending stage.
        shuffle_id: u32,
    },
}

/// A leaf that stands for a stage's input. Before running, the function
/// binds it to the batches of the epoch ([`StageInputExec::bind`]).
#[derive(Debug)]
pub struct StageInputExec {
    /// What the leaf stands for.
    pub input: StageInput,
    schema: SchemaRef,
    bound: Option<Vec<datafusion::arrow::record_batch::RecordBatch>>,
    props: Arc<PlanProperties>,
}

impl StageInputExec {
    /// A leaf for `input`, producing `schema`.
    pub fn new(input: StageInput, schema: SchemaRef) -> Self {
        let props = leaf_properties(schema.clone(), 1);
        StageInputExec {
            input,
            schema,
            bound: None,
            props,
        }
    }

    /// This leaf with `batches` as its output for one run.
    pub fn bind(&self, batches: Vec<datafusion::arrow::record_batch::RecordBatch>) -> Self {
        StageInputExec {
            input: self.input.clone(),
            schema: self.schema.clone(),
            bound: Some(batches),
            props: self.props.clone(),
        }
    }
}

impl DisplayAs for StageInputExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        match &self.input {
            StageInput::Source { table, .. } => write!(f, "StageInputExec: source={table}"),
            StageInput::Shuffle { shuffle_id } => write!(f, "StageInputExec: shuffle={shuffle_id}"),
        }
    }
}

impl ExecutionPlan for StageInputExec {
    fn name(&self) -> &str {
        "StageInputExec"
    }
    fn properties(&self) -> &Arc<PlanProperties> {
        &self.props
    }
    crate::leaf_node_methods!();
    fn execute(
        &self,
        _partition: usize,
        _ctx: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let Some(batches) = &self.bound else {
            return Err(DataFusionError::Internal(format!(
                "{:?} was not bound to its input",
                self.input
            )));
        };
        Ok(Box::pin(MemoryStream::try_new(
            batches.clone(),
            self.schema.clone(),
            None,
        )?))
    }
}

/// Our leaf, if `plan` is one.
pub fn as_stage_input(plan: &Arc<dyn ExecutionPlan>) -> Option<&StageInputExec> {
    plan.downcast_ref::<StageInputExec>()
}

/// The source scan `plan` is, if it is one.
pub fn as_source_scan(plan: &Arc<dyn ExecutionPlan>) -> Option<&SourceScanExec> {
    plan.downcast_ref::<SourceScanExec>()
}

/// What [`rewrite_leaves`] calls for each leaf: the leaf and the plan it
/// stands for, and the plan to put in its place.
pub type LeafRewrite<'a, E> =
    dyn FnMut(&StageInputExec, &Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>, E> + 'a;

/// A copy of `plan` with each [`StageInputExec`] leaf replaced by what `f`
/// returns for it. Every node above a leaf is rebuilt (so no operator state
/// is shared with the original) and other leaves are reset.
pub fn rewrite_leaves<E: From<DataFusionError>>(
    plan: &Arc<dyn ExecutionPlan>,
    f: &mut LeafRewrite<'_, E>,
) -> Result<Arc<dyn ExecutionPlan>, E> {
    if let Some(leaf) = plan.downcast_ref::<StageInputExec>() {
        return f(leaf, plan);
    }
    if plan.children().is_empty() {
        return Ok(plan.clone().reset_state()?);
    }
    let children = plan
        .children()
        .into_iter()
        .map(|c| rewrite_leaves(c, f))
        .collect::<Result<Vec<_>, E>>()?;
    // New children keep an operator's run-time state (a join's collected
    // build side); each run needs its own.
    Ok(plan
        .clone()
        .replace_children(children, recompute())?
        .reset_state()?)
}

/// Rebuild a node over new children, recomputing its properties (the
/// children's partitioning changes when a plan is cut).
pub fn recompute() -> datafusion::physical_plan::execution_plan::ReplaceChildrenOptions {
    use datafusion::physical_plan::execution_plan::{
        ChildrenPropertiesMode, ReplaceChildrenOptions,
    };
    ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute)
}

/// Batch coalescing and cooperative yielding: rows pass through unchanged,
/// schema and all.
pub fn passes_batches_through(plan: &Arc<dyn ExecutionPlan>) -> bool {
    // DataFusion no longer plans CoalesceBatchesExec, but a plan built by an
    // older planner may still hold one.
    #[allow(deprecated)]
    let coalesces = plan
        .downcast_ref::<datafusion::physical_plan::coalesce_batches::CoalesceBatchesExec>()
        .is_some();
    coalesces
        || plan
            .downcast_ref::<datafusion::physical_plan::coop::CooperativeExec>()
            .is_some()
}
