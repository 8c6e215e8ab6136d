//! The plan nodes of lookup tables: the table as DataFusion sees it, the
//! scan it plans (which only a join with a stream may consume), and the
//! join that runs in the stream's stage.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch, StringArray, UInt32Array};
use datafusion::arrow::compute::kernels::cast::{CastOptions, cast_with_options};
use datafusion::arrow::compute::{cast, filter_record_batch, take};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::{DataFusionError, Result as DfResult, project_schema};
use datafusion::datasource::TableType;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::EmissionType;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use super::cache::LookupCache;
use super::set_aside::SetAside;
use super::{Lookup, LookupOptions, LookupRow, MissingPolicy};
use crate::clock::Clock;
use crate::dead_letter::DeadLetterSink;
use crate::error::{EngineError, Result};
use crate::exec::leaf_properties;
use crate::metrics;
use crate::source::SourceConfig;

/// A table declared with `lookup.key`: it has a schema and a lookup, and
/// cannot be read as a stream.
#[derive(Debug)]
pub struct LookupTable {
    /// The table's name.
    pub name: String,
    /// The table's declaration.
    pub config: SourceConfig,
    /// The table's schema.
    pub schema: SchemaRef,
}

#[async_trait]
impl TableProvider for LookupTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
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
        let projection = projection
            .cloned()
            .unwrap_or_else(|| (0..self.schema.fields().len()).collect());
        Ok(Arc::new(LookupScanExec {
            table: self.name.clone(),
            config: self.config.clone(),
            table_schema: self.schema.clone(),
            props: leaf_properties(project_schema(&self.schema, Some(&projection))?, 1),
            projection,
        }))
    }
}

/// What the planner finds where a lookup table is scanned. It is replaced by
/// a [`LookupJoinExec`] when it is one side of an equi-join with a stream;
/// anywhere else it fails, saying so.
#[derive(Debug)]
pub struct LookupScanExec {
    /// The table's name.
    pub table: String,
    /// The table's declaration.
    pub config: SourceConfig,
    /// The table's full schema.
    pub table_schema: SchemaRef,
    /// Columns of the table the plan reads.
    pub projection: Vec<usize>,
    props: Arc<PlanProperties>,
}

impl DisplayAs for LookupScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "LookupScanExec: table={}", self.table)
    }
}

impl ExecutionPlan for LookupScanExec {
    fn name(&self) -> &str {
        "LookupScanExec"
    }
    fn properties(&self) -> &Arc<PlanProperties> {
        &self.props
    }
    crate::leaf_node_methods!();
    fn execute(&self, _: usize, _: Arc<TaskContext>) -> DfResult<SendableRecordBatchStream> {
        Err(not_a_stream(&self.table))
    }
}

pub(super) fn not_a_stream(table: &str) -> DataFusionError {
    DataFusionError::Plan(format!(
        "lookup table {table} can only be joined with a stream \
         (JOIN {table} ON <stream column> = {table}.<its lookup.key>), not read"
    ))
}

/// Which rows of the stream a lookup join keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LookupJoinType {
    /// Rows with a match.
    Inner,
    /// Every row; the table's columns are NULL where there is no match.
    Outer,
}

/// What a lookup join needs besides its input; travels in the plan codec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LookupSpec {
    /// The lookup table's name.
    pub table: String,
    /// Its declaration.
    pub config: SourceConfig,
    /// Its lookup options (key, cache, missing keys).
    pub options: LookupOptions,
    /// The table's columns the join outputs, after the stream's.
    pub projection: Vec<usize>,
    /// The stream's key column (an index into the input's schema).
    pub stream_key: usize,
    /// Inner or outer: whether a stream row without a match is kept.
    pub join_type: LookupJoinType,
    /// With `'lookup.missing' 'dead-letter'`: the stream table whose
    /// dead-letter destination takes rows without a match.
    pub letters_to: Option<(String, SourceConfig)>,
}

/// A lookup table opened for a join: the connector's lookup, the cache, and
/// where rows without a match go. Shared by every copy of the join node in
/// a function instance, so the cache outlives an epoch.
pub struct LookupHandle {
    /// What to open.
    pub spec: LookupSpec,
    /// The table's schema.
    pub table_schema: SchemaRef,
    lookup: Arc<dyn Lookup>,
    cache: Mutex<LookupCache>,
    /// What the cache's TTL is measured against.
    clock: Arc<dyn Clock>,
    pub(super) dead_letters: Option<Arc<dyn DeadLetterSink>>,
}

impl fmt::Debug for LookupHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LookupHandle({})", self.spec.table)
    }
}

impl LookupHandle {
    /// A handle on `lookup` (opened by the catalog, `Catalog::open_lookup`)
    /// whose cache reads the time from `clock`; `dead_letters` gives a
    /// stream table's dead-letter destination.
    pub fn open(
        spec: LookupSpec,
        table_schema: SchemaRef,
        lookup: Arc<dyn Lookup>,
        clock: Arc<dyn Clock>,
        dead_letters: impl FnOnce(&SourceConfig) -> Result<Option<Arc<dyn DeadLetterSink>>>,
    ) -> Result<Self> {
        let dead_letters = match (&spec.options.missing, &spec.letters_to) {
            (MissingPolicy::Join, _) => None,
            (MissingPolicy::DeadLetter, Some((stream, config))) => {
                Some(dead_letters(config)?.ok_or_else(|| {
                    EngineError::plan(format!(
                        "lookup table {}: 'lookup.missing' 'dead-letter' sends rows without a match \
                         to the dead-letter destination of {stream}, which declares none \
                         (for Kafka, 'dead.letter.topic')",
                        spec.table
                    ))
                })?)
            }
            (MissingPolicy::DeadLetter, None) => {
                return Err(EngineError::plan(format!(
                    "lookup table {}: 'lookup.missing' 'dead-letter' needs the join's stream \
                     to come from one table",
                    spec.table
                )));
            }
        };
        let cache = LookupCache::new(
            spec.options.cache_size,
            Duration::from_millis(spec.options.cache_ttl_ms),
        );
        Ok(LookupHandle {
            spec,
            table_schema,
            lookup,
            cache: Mutex::new(cache),
            clock,
            dead_letters,
        })
    }

    /// The rows of `keys` (distinct), from the cache or one request.
    async fn rows(&self, keys: Vec<&str>) -> Result<HashMap<String, Option<LookupRow>>> {
        let now = self.clock.now();
        let mut known = HashMap::with_capacity(keys.len());
        let mut ask = vec![];
        {
            let cache = self.cache.lock().expect("lookup cache");
            for k in keys {
                match cache.get(k, now) {
                    Some(row) => {
                        known.insert(k.to_string(), row.clone());
                    }
                    None => ask.push(k.to_string()),
                }
            }
        }
        metrics::lookup_cache_hits(&self.spec.table, known.len());
        if ask.is_empty() {
            return Ok(known);
        }
        let started = Instant::now();
        let prefix = &self.spec.options.key_prefix;
        let found = if prefix.is_empty() {
            self.lookup.get(&ask).await?
        } else {
            let asked: Vec<String> = ask.iter().map(|k| format!("{prefix}{k}")).collect();
            self.lookup.get(&asked).await?
        };
        if found.len() != ask.len() {
            return Err(EngineError::source_failed(
                self.spec.table.clone(),
                format!("asked for {} keys, got {} answers", ask.len(), found.len()),
            ));
        }
        let not_found = found.iter().filter(|r| r.is_none()).count();
        metrics::lookup_request(&self.spec.table, ask.len(), not_found, started.elapsed());
        let mut cache = self.cache.lock().expect("lookup cache");
        for (k, row) in ask.into_iter().zip(found) {
            cache.insert(k.clone(), row.clone(), now);
            known.insert(k, row);
        }
        Ok(known)
    }
}

/// Joins each batch of a stream with a lookup table on one key column,
/// fetching the keys it needs as batches pass: the table is never scanned
/// or held whole, and the join keeps no state between batches.
///
/// Our physical optimizer rule (`lookup/plan.rs`) puts it where DataFusion
/// planned a hash join of a stream with a table declared with `lookup.key`:
/// the table side goes away, so no exchange is planned for it and the join
/// stays in the stage that reads the stream. Per input batch it casts the
/// stream's key column to text, asks the [`LookupHandle`] for the distinct
/// keys (a cache with a time to live in front of the table: only misses go
/// out, in one request per batch), and outputs the input's columns followed
/// by the table's projected ones, typed as the table declares them.
///
/// ```text
///   LookupJoinExec: table=customers kind=REDIS customer=id join=Inner missing=Join
///                 |                          |
///     input batch (stream side)    LookupHandle: cache -> Lookup::get(keys)
///       rows r1 r2 r3                 k1 -> row   k2 -> none
///                 \_______ by key ________/
///                            |
///           r1 + table columns (r2 no match: dropped for Inner, NULLs
///           for Outer, set aside with 'lookup.missing' 'dead-letter')
/// ```
///
/// # Errors
///
/// A failed fetch (the table unreachable, or fewer answers than keys asked)
/// fails the batch, and with it the invocation, so the epoch is not
/// committed. A value the table holds that does not parse as the
/// column's declared type is a [`DataFusionError::Execution`] naming the
/// table and column. Rows without a match are not errors: the join type
/// and `lookup.missing` decide (see [`MissingPolicy`]); dead-lettered rows
/// leave by the running function's side output ([`SetAside`]), which sends
/// them before the epoch's output leaves, with keys that are the same when
/// the epoch is run again.
///
/// # Ordering and partitioning
///
/// Keeps its input's partitioning and boundedness, and its order
/// (`maintains_input_order`): output rows are the input rows that survive,
/// in input order, one output batch per input batch. It adds no
/// repartition and needs none: any partition can look any key up.
#[derive(Debug)]
pub struct LookupJoinExec {
    /// The stream side.
    pub input: Arc<dyn ExecutionPlan>,
    /// The opened lookup table with its cache.
    pub handle: Arc<LookupHandle>,
    schema: SchemaRef,
    props: Arc<PlanProperties>,
}

impl LookupJoinExec {
    /// A join of `input` with the lookup table behind `handle`.
    pub fn try_new(input: Arc<dyn ExecutionPlan>, handle: Arc<LookupHandle>) -> DfResult<Self> {
        let spec = &handle.spec;
        let outer = spec.join_type == LookupJoinType::Outer;
        let mut fields: Vec<Arc<Field>> = input.schema().fields().iter().cloned().collect();
        for i in &spec.projection {
            let f = handle.table_schema.field(*i);
            fields.push(Arc::new(f.clone().with_nullable(f.is_nullable() || outer)));
        }
        let schema = Arc::new(Schema::new(fields));
        let props = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            input.properties().output_partitioning().clone(),
            EmissionType::Incremental,
            input.properties().boundedness,
        ));
        Ok(LookupJoinExec {
            input,
            handle,
            schema,
            props,
        })
    }
}

impl DisplayAs for LookupJoinExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let s = &self.handle.spec;
        write!(
            f,
            "LookupJoinExec: table={} kind={} {}={} join={:?} missing={:?}",
            s.table,
            s.config.kind,
            self.input.schema().field(s.stream_key).name(),
            s.options.key,
            s.join_type,
            s.options.missing
        )
    }
}

impl ExecutionPlan for LookupJoinExec {
    fn name(&self) -> &str {
        "LookupJoinExec"
    }
    fn properties(&self) -> &Arc<PlanProperties> {
        &self.props
    }
    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }
    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }
    crate::no_expressions_method!();
    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let [input] = <[_; 1]>::try_from(children)
            .map_err(|_| DataFusionError::Internal("a lookup join has one input".into()))?;
        Ok(Arc::new(LookupJoinExec::try_new(
            input,
            self.handle.clone(),
        )?))
    }
    fn execute(
        &self,
        partition: usize,
        ctx: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        // Rows without a match leave by the function's side output, where
        // the function running this plan gave one.
        let misses = ctx.session_config().get_extension::<SetAside>();
        let key_name = self
            .input
            .schema()
            .field(self.handle.spec.stream_key)
            .name()
            .clone();
        let input = self.input.execute(partition, ctx)?;
        let handle = self.handle.clone();
        let schema = self.schema.clone();
        let out = schema.clone();
        let stream = input.then(move |batch| {
            let (handle, schema) = (handle.clone(), out.clone());
            let (misses, key_name) = (misses.clone(), key_name.clone());
            async move {
                let set_aside = |rows| {
                    if let Some(m) = &misses {
                        m.push(handle.clone(), key_name, rows);
                    }
                };
                join_batch(&handle, set_aside, &schema, batch?).await
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

async fn join_batch(
    handle: &LookupHandle,
    set_aside: impl FnOnce(RecordBatch),
    schema: &SchemaRef,
    batch: RecordBatch,
) -> DfResult<RecordBatch> {
    let spec = &handle.spec;
    let keys = cast(batch.column(spec.stream_key), &DataType::Utf8)?;
    let keys = keys.as_string::<i32>();
    let mut distinct: Vec<&str> = keys.iter().flatten().collect();
    distinct.sort_unstable();
    distinct.dedup();
    let rows = handle
        .rows(distinct)
        .await
        .map_err(|e| DataFusionError::External(Box::new(e)))?;
    let row_of = |i: usize| -> Option<&LookupRow> {
        keys.is_valid(i)
            .then(|| rows.get(keys.value(i)))
            .flatten()
            .and_then(Option::as_ref)
    };
    let matched: Vec<bool> = (0..batch.num_rows()).map(|i| row_of(i).is_some()).collect();
    let keep_misses =
        spec.join_type == LookupJoinType::Outer && spec.options.missing == MissingPolicy::Join;
    if spec.options.missing == MissingPolicy::DeadLetter && matched.iter().any(|m| !m) {
        let mask = matched.iter().map(|m| Some(!m)).collect();
        set_aside(filter_record_batch(&batch, &mask)?);
    }
    let out_rows: Vec<u32> = (0..batch.num_rows())
        .filter(|i| keep_misses || matched[*i])
        .map(|i| i as u32)
        .collect();
    let mut columns: Vec<ArrayRef> = if out_rows.len() == batch.num_rows() {
        batch.columns().to_vec()
    } else {
        let indices = UInt32Array::from(out_rows.clone());
        batch
            .columns()
            .iter()
            .map(|c| take(c.as_ref(), &indices, None))
            .collect::<std::result::Result<_, _>>()?
    };
    for p in &spec.projection {
        let field = handle.table_schema.field(*p);
        let text: StringArray = if *field.name() == spec.options.key {
            out_rows
                .iter()
                .map(|i| row_of(*i as usize).map(|_| keys.value(*i as usize)))
                .collect()
        } else {
            let j = spec
                .options
                .values
                .iter()
                .position(|v| v == field.name())
                .ok_or_else(|| {
                    DataFusionError::Internal(format!("{} is no value column", field.name()))
                })?;
            out_rows
                .iter()
                .map(|i| row_of(*i as usize).and_then(|r| r.get(j)?.as_deref()))
                .collect()
        };
        columns.push(typed(&spec.table, field, Arc::new(text))?);
    }
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

/// The table's text values as the column's declared type; a value that is
/// not one is an error naming it.
fn typed(table: &str, field: &Field, text: ArrayRef) -> DfResult<ArrayRef> {
    if field.data_type() == &DataType::Utf8 {
        return Ok(text);
    }
    let strict = CastOptions {
        safe: false,
        ..Default::default()
    };
    cast_with_options(&text, field.data_type(), &strict).map_err(|e| {
        DataFusionError::Execution(format!(
            "lookup table {table}: column {} is {}, and a value in the table is not: {e}",
            field.name(),
            field.data_type()
        ))
    })
}
