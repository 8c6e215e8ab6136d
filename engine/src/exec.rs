//! Plan nodes of our own: the table that wraps a [`Source`], its scan, and
//! the leaf that stands for a stage's input once the plan is cut.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::{DataFusionError, Result as DfResult, project_schema};
use datafusion::datasource::TableType;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::{EquivalenceProperties, Partitioning};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::memory::MemoryStream;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use serde::{Deserialize, Serialize};

use crate::source::{EpochSpec, Source, SourceConfig};

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
    /// Declared through the catalog without `'parallelism'`: its instances
    /// are chosen (`Catalog::choose_parallelism`) when a query first reads
    /// it, not for a table only written.
    sizing: Option<SchemaRef>,
    sized: tokio::sync::OnceCell<Sized>,
}

/// What a table reads with once sized.
#[derive(Debug, Clone)]
struct Sized {
    config: SourceConfig,
    source: Arc<dyn Source>,
    /// Why it reads with as many instances as it does (`skein explain`).
    why: Option<String>,
}

impl SourceTable {
    /// A table reading `source` as it is.
    pub fn new(name: impl Into<String>, config: SourceConfig, source: Arc<dyn Source>) -> Self {
        SourceTable {
            name: name.into(),
            config,
            source,
            sizing: None,
            sized: tokio::sync::OnceCell::new(),
        }
    }

    /// A table the catalog declared from `config` and the columns of
    /// `declared`, sized by the catalog of the session that first reads it.
    pub fn declared(
        name: impl Into<String>,
        config: SourceConfig,
        source: Arc<dyn Source>,
        declared: SchemaRef,
    ) -> Self {
        SourceTable {
            sizing: Some(declared),
            ..Self::new(name, config, source)
        }
    }

    /// The declaration and source a read of the table uses.
    async fn sized(&self, state: &dyn Session) -> DfResult<Sized> {
        let as_is = || Sized {
            config: self.config.clone(),
            source: self.source.clone(),
            why: None,
        };
        let Some(declared) = &self.sizing else {
            return Ok(as_is());
        };
        let Some(catalog) = state.config().get_extension::<crate::catalog::Catalog>() else {
            return Ok(as_is());
        };
        let sized = self
            .sized
            .get_or_try_init(|| async {
                let mut config = self.config.clone();
                let why = catalog.choose_parallelism(&self.name, &mut config).await?;
                let source = if config == self.config {
                    self.source.clone()
                } else {
                    catalog.create_source(&config, declared.clone())?
                };
                Ok::<_, crate::EngineError>(Sized {
                    config,
                    source,
                    why,
                })
            })
            .await
            .map_err(|e| DataFusionError::Plan(format!("table {}: {e}", self.name)))?;
        Ok(sized.clone())
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
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let sized = self.sized(state).await?;
        let mut scan = SourceScanExec::new(
            self.name.clone(),
            sized.config,
            sized.source,
            projection.cloned(),
        )?;
        scan.parallelism_why = sized.why;
        Ok(Arc::new(scan))
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

/// Scans a whole source as one bounded table: the leaf a table of a
/// readable kind plans as.
///
/// Partition *i* is source instance *i*: it pulls that instance's share of
/// the input as a single epoch (`epoch 0 of 1`), projects the columns asked
/// for and yields the pulled batches. Single-process runs (`--verify`, and
/// what the planner sees before it cuts) execute it directly; a staged run
/// never does: the cut replaces it with a [`StageInputExec`] of
/// [`StageInput::Source`] that a source function binds to each epoch's pull.
///
/// ```text
///            SourceScanExec: table=bids kind=KAFKA instances=3
///        partition 0        partition 1        partition 2
///             |                  |                  |
///   Source::pull(instance 0/3) (1/3)              (2/3)     epoch 0 of 1
///             |                  |                  |
///      [batches, projected] [batches, ...]   [batches, ...]
/// ```
///
/// # Errors
///
/// A failed pull (the source unreachable, its data refused) ends that
/// partition's stream with the source's error wrapped as
/// [`DataFusionError::External`]; a
/// projection that does not fit the source's schema fails in [`Self::new`].
///
/// # Ordering and partitioning
///
/// Output partitioning is `UnknownPartitioning(instances)`: rows are split
/// by the source's own instances (Kafka partitions, Kinesis shards,
/// generator slices), not by any key. Within a partition rows come in the
/// order the source produced them (offset order per source partition); no
/// order across partitions, and no sort order is declared. Bounded: each
/// partition ends after its one pull.
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
    /// Why the table reads with as many instances as it does.
    pub parallelism_why: Option<String>,
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
            parallelism_why: None,
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

/// The leaf that stands for a stage's input: where a cut plan's data comes
/// in from outside the stage.
///
/// The planner leaves one where a stage reads a source table
/// ([`StageInput::Source`], in place of a [`SourceScanExec`]) or an
/// exchange from the stage below ([`StageInput::Shuffle`], in place of the
/// repartition or merge that ended that stage). It travels unbound in the
/// plan codec. Each epoch, the function makes a copy of its sub-plan whose
/// leaves are bound ([`StageInputExec::bind`]) to what arrived: the
/// batches its sources pulled, or the payloads its arena collected from
/// every sender of the edge (and, in a stateful stage, the windows the
/// watermark has closed). Running the copy yields exactly those batches.
///
/// ```text
///   stage 2 (group)                    stage 1 (source)
///   AggregateExec                      RepartitionExec: Hash([auction], 4)
///     StageInputExec: shuffle=1  <--     ProjectionExec
///       bound per epoch to the             StageInputExec: source=bids
///       payloads of edge 1                   bound per epoch to the pull
/// ```
///
/// # Errors
///
/// Executing a leaf that was never bound is a
/// [`DataFusionError::Internal`] naming the input: the function runs only
/// bound copies, so it means a plan ran outside a function. A bound leaf
/// cannot fail; decoding and schema checks happen before binding (the
/// payload is refused, naming its sender and stage).
///
/// # Ordering and partitioning
///
/// One partition (`UnknownPartitioning(1)`): a function instance is one
/// partition of its stage, and the exchange has already routed to it the
/// rows of its hash range. Batches come out in the order they were bound;
/// rows of one sender keep the order it sent them in, and no order across
/// senders is promised. No sort order is declared, so an operator that
/// needs one sorts above the leaf.
/// Bounded: the stream ends after the bound batches.
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
