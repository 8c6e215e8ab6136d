//! The Sink trait: where the last stage writes its results. Sinks live in
//! their own crate and register a [`SinkFactory`] for their kind in the
//! [`Catalog`](crate::catalog::Catalog); the engine only knows the trait
//! and an in-memory collector.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::payload::SourceOffset;
use crate::table_options::TableOptions;

/// A sink as a table declares it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SinkConfig {
    /// The sink kind (`STORED AS`).
    pub kind: String,
    /// Its location (`LOCATION`).
    pub location: String,
    /// Its options.
    #[serde(default)]
    pub options: BTreeMap<String, String>,
}

/// The kind of the in-memory collector a plain SELECT writes to.
pub const COLLECT_KIND: &str = "COLLECT";

impl SinkConfig {
    /// The in-memory collector named `name` (results of a plain SELECT).
    pub fn collect(name: &str) -> Self {
        SinkConfig {
            kind: COLLECT_KIND.into(),
            location: name.into(),
            options: BTreeMap::new(),
        }
    }
}

/// One write: everything a member emits for one epoch. `(query, epoch,
/// member)` identifies it, so a sink can make a replay idempotent.
#[derive(Debug)]
pub struct SinkWrite<'a> {
    /// The query code.
    pub query: &'a str,
    /// The run's lineage (see `CloudContext::run`): a sink keys what it
    /// remembers of written epochs by (run, member), never by query alone.
    pub run: &'a str,
    /// The epoch.
    pub epoch: u64,
    /// The stage member writing.
    pub member: u32,
    /// The schema of the rows: the table's, never with the op column.
    pub schema: SchemaRef,
    /// The rows: appended, or an updating result's changes.
    pub rows: SinkRows,
    /// Source offsets read up to, for sinks that store them with the rows.
    pub offsets: Vec<SourceOffset>,
    /// The run's last epoch.
    pub last: bool,
}

/// The rows of one write. A result that only grows hands over rows to
/// append; an updating result hands over its changes, which a sink applies
/// as retractions first, then inserts (an update of a key is the
/// retraction of its old row and its new row).
#[derive(Debug, Clone)]
pub enum SinkRows {
    /// Rows added to the result.
    Append(Vec<RecordBatch>),
    /// Changes of the result: rows taken back, and rows added. A row in
    /// both (taken back and added again within the write) is neither.
    Changes {
        /// Rows taken back.
        retract: Vec<RecordBatch>,
        /// Rows added.
        insert: Vec<RecordBatch>,
    },
}

impl SinkRows {
    /// The rows of batches of `schema` as a stage emits them: a changelog
    /// (the op column last) is split by kind once, here, and what it takes
    /// back and adds again within the write cancels out.
    pub fn from_stage(schema: &SchemaRef, batches: Vec<RecordBatch>) -> Result<(SchemaRef, Self)> {
        if !crate::changelog::is_changelog(schema) {
            return Ok((schema.clone(), SinkRows::Append(batches)));
        }
        let plain = crate::changelog::without_op(schema);
        let (mut retract, mut insert) = (vec![], vec![]);
        for b in batches.iter().filter(|b| b.num_rows() > 0) {
            let (r, i) = crate::changelog::split(b)?;
            retract.push(r);
            insert.push(i);
        }
        let rows = |bs: &[RecordBatch]| bs.iter().map(|b| b.num_rows()).sum::<usize>();
        if rows(&retract) == 0 || rows(&insert) == 0 {
            return Ok((plain, SinkRows::Changes { retract, insert }));
        }
        let encoder = crate::changelog::row_key::RowEncoder::whole(&plain)?;
        let r = datafusion::arrow::compute::concat_batches(&plain, &retract)?;
        let i = datafusion::arrow::compute::concat_batches(&plain, &insert)?;
        let (r, i) = crate::changelog::diff(&encoder, &r, &i)?;
        let changes = SinkRows::Changes {
            retract: vec![r],
            insert: vec![i],
        };
        Ok((plain, changes))
    }

    /// Whether these are an updating result's changes.
    pub fn updates(&self) -> bool {
        matches!(self, SinkRows::Changes { .. })
    }

    /// Rows in the write.
    pub fn num_rows(&self) -> usize {
        let count = |bs: &[RecordBatch]| bs.iter().map(|b| b.num_rows()).sum::<usize>();
        match self {
            SinkRows::Append(b) => count(b),
            SinkRows::Changes { retract, insert } => count(retract) + count(insert),
        }
    }

    /// Whether the write has no row.
    pub fn is_empty(&self) -> bool {
        self.num_rows() == 0
    }

    /// `(retractions, inserts)`: appended rows are all inserts.
    pub fn by_kind(&self) -> (&[RecordBatch], &[RecordBatch]) {
        match self {
            SinkRows::Append(b) => (&[], b),
            SinkRows::Changes { retract, insert } => (retract, insert),
        }
    }

    /// Every row as one stream of batches, for a sink that keeps a
    /// changelog as it is (a file of results): appended rows as they are,
    /// changes tagged with the op column, retractions first.
    pub fn tagged(&self) -> Result<Vec<RecordBatch>> {
        match self {
            SinkRows::Append(b) => Ok(b.clone()),
            SinkRows::Changes { retract, insert } => {
                let tag = |bs: &[RecordBatch], op| {
                    bs.iter()
                        .filter(|b| b.num_rows() > 0)
                        .map(|b| crate::changelog::tag(b, op))
                        .collect::<Result<Vec<_>>>()
                };
                let mut out = tag(retract, crate::changelog::RETRACT)?;
                out.extend(tag(insert, crate::changelog::INSERT)?);
                Ok(out)
            }
        }
    }
}

/// Where a query's results go; connectors implement it.
#[async_trait]
pub trait Sink: Send + Sync {
    /// Write one member's output of one epoch; in an exactly-once sink a
    /// replay of the same write changes nothing.
    async fn write(&self, write: SinkWrite<'_>) -> Result<()>;
}

/// What the sinks of a kind can do, whatever their options.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SinkCapabilities {
    /// A replayed write changes nothing: a query that checkpoints is
    /// exactly once into it across restarts.
    pub exactly_once: bool,
    /// It stores the source offsets each write covers (under its
    /// `'checkpoint'` option) and hands them back
    /// ([`SinkFactory::committed_offsets`]), for a source that resumes from
    /// its sink (`'startup' 'checkpoint'`).
    pub keeps_offsets: bool,
    /// It drops every row and only counts them (a benchmark's sink): a
    /// run has no result to verify.
    pub discards_rows: bool,
}

impl SinkCapabilities {
    /// Exactly once, and keeps the offsets each write covers.
    pub const EXACTLY_ONCE_WITH_OFFSETS: Self = SinkCapabilities {
        exactly_once: true,
        keeps_offsets: true,
        discards_rows: false,
    };
}

/// What a sink that keeps no rows was given and dropped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Discarded {
    /// Rows dropped.
    pub rows: u64,
    /// Non-empty record batches.
    pub batches: u64,
}

impl Discarded {
    /// The two counts added.
    pub fn plus(self, other: Discarded) -> Discarded {
        Discarded {
            rows: self.rows + other.rows,
            batches: self.batches + other.batches,
        }
    }
}

/// Builds sinks of one kind from their config.
#[async_trait]
pub trait SinkFactory: Send + Sync {
    /// The options this kind's sink takes; the catalog refuses those no
    /// one declares at CREATE TABLE, and hands the factory only these (and
    /// options with a dot no one else declares, if it takes them).
    fn options(&self) -> TableOptions;

    /// What its sinks can do.
    fn capabilities(&self) -> SinkCapabilities {
        SinkCapabilities::default()
    }

    /// Forget what an earlier run of `query` wrote to the table, where this
    /// process can read it back, so [`SinkFactory::read_back`] returns this
    /// run's rows only.
    async fn forget_written(&self, _config: &SinkConfig, _query: &str) -> Result<()> {
        Ok(())
    }

    /// The rows `query` wrote to the table, read back for `--verify` and the
    /// printed result, as the table `schema` declares them (a changelog
    /// added up); `None` where this process cannot read them.
    async fn read_back(
        &self,
        _config: &SinkConfig,
        _query: &str,
        _schema: &SchemaRef,
    ) -> Result<Option<Vec<RecordBatch>>> {
        Ok(None)
    }

    /// What the kind's sinks did with `query`'s rows in this process, for
    /// the run's report, where they keep a count rather than the rows;
    /// taken once, so a later run in the process starts from zero.
    fn take_summary(&self, _query: &str) -> Option<Discarded> {
        None
    }

    /// Whether a sink so configured takes a changelog (an updating query's
    /// result, see [`crate::changelog`]): its batches then end with the op
    /// column, and a retraction must take back the row it names. `Err`
    /// says in one line why not, and what would.
    fn takes_updates(&self, config: &SinkConfig) -> std::result::Result<(), String> {
        let _ = config;
        Err("it only appends rows".into())
    }

    /// The offsets of `source` (a topic) that the sink declared as `config`
    /// last committed, by partition; `None` when it keeps none (a sink
    /// without [`SinkCapabilities::keeps_offsets`], or one declared without
    /// its `'checkpoint'` option).
    async fn committed_offsets(
        &self,
        config: &SinkConfig,
        source: &str,
    ) -> Result<Option<BTreeMap<i32, i64>>> {
        let _ = (config, source);
        Ok(None)
    }

    /// Read the options as [`SinkFactory::create`] will, without opening
    /// anything, so a bad value fails the CREATE TABLE rather than the
    /// first write.
    fn check(&self, config: &SinkConfig) -> Result<()> {
        let _ = config;
        Ok(())
    }

    /// A sink for `config`.
    fn create(&self, config: &SinkConfig) -> Result<Arc<dyn Sink>>;
}

/// Collects results in memory, by name: the in-process run reads them back.
#[derive(Default, Clone)]
pub struct CollectSinkFactory {
    results: Arc<Mutex<HashMap<String, Arc<CollectSink>>>>,
}

impl CollectSinkFactory {
    /// The collector named `name`, made on first use.
    pub fn sink(&self, name: &str) -> Arc<CollectSink> {
        self.results
            .lock()
            .expect("collect sinks")
            .entry(name.to_string())
            .or_default()
            .clone()
    }
}

impl SinkFactory for CollectSinkFactory {
    fn options(&self) -> TableOptions {
        TableOptions::only(&[])
    }

    fn create(&self, config: &SinkConfig) -> Result<Arc<dyn Sink>> {
        Ok(self.sink(&config.location))
    }

    /// The collected result is consolidated into the table it adds up to.
    fn takes_updates(&self, _config: &SinkConfig) -> std::result::Result<(), String> {
        Ok(())
    }
}

/// Collects results in memory.
#[derive(Default, Debug)]
pub struct CollectSink {
    /// Writes seen, keyed by (epoch, member) so a replay replaces, not adds.
    writes: Mutex<BTreeMap<(u64, u32), Vec<RecordBatch>>>,
}

impl CollectSink {
    /// The result collected so far: the rows written, or, for a query
    /// whose result updates, the table its changelog adds up to.
    pub fn batches(&self) -> Vec<RecordBatch> {
        let written = self.changes();
        match written.first() {
            Some(b) if crate::changelog::is_changelog(&b.schema()) => {
                match crate::changelog::consolidate(&b.schema(), &written) {
                    Ok(table) => vec![table],
                    Err(e) => {
                        tracing::error!(error = %e, "consolidating the collected changelog");
                        written
                    }
                }
            }
            _ => written,
        }
    }

    /// Every batch written, in epoch and member order (a changelog as it
    /// came, for a query whose result updates).
    pub fn changes(&self) -> Vec<RecordBatch> {
        self.writes
            .lock()
            .expect("collect sink")
            .values()
            .flatten()
            .cloned()
            .collect()
    }

    /// The epochs in which something was written.
    pub fn epochs(&self) -> Vec<u64> {
        let mut e: Vec<u64> = self
            .writes
            .lock()
            .expect("collect sink")
            .keys()
            .map(|k| k.0)
            .collect();
        e.dedup();
        e
    }

    /// The writes of epochs after `epoch` (all, for `None`), per epoch in
    /// order, each epoch's members in order: what a watcher has not seen.
    pub fn writes_after(&self, epoch: Option<u64>) -> Vec<(u64, Vec<RecordBatch>)> {
        let writes = self.writes.lock().expect("collect sink");
        let mut out: Vec<(u64, Vec<RecordBatch>)> = vec![];
        for ((e, _), batches) in writes.iter() {
            if epoch.is_some_and(|seen| *e <= seen) {
                continue;
            }
            match out.last_mut() {
                Some((last, all)) if last == e => all.extend(batches.iter().cloned()),
                _ => out.push((*e, batches.clone())),
            }
        }
        out
    }

    /// Rows collected so far.
    pub fn rows(&self) -> usize {
        self.batches().iter().map(|b| b.num_rows()).sum()
    }

    /// Forget what was collected.
    pub fn clear(&self) {
        self.writes.lock().expect("collect sink").clear();
    }
}

#[async_trait]
impl Sink for CollectSink {
    async fn write(&self, write: SinkWrite<'_>) -> Result<()> {
        let batches: Vec<RecordBatch> = write
            .rows
            .tagged()?
            .into_iter()
            .filter(|b| b.num_rows() > 0)
            .collect();
        let mut w = self.writes.lock().expect("collect sink");
        if batches.is_empty() {
            w.remove(&(write.epoch, write.member));
        } else {
            w.insert((write.epoch, write.member), batches);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int8Array, Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    fn tagged(keys: &[&str], values: &[i64], ops: &[i8]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, false),
            Field::new("n", DataType::Int64, false),
        ]));
        let b = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(keys.to_vec())),
                Arc::new(Int64Array::from(values.to_vec())),
            ],
        )
        .unwrap();
        crate::changelog::tag_each(&b, Int8Array::from(ops.to_vec())).unwrap()
    }

    fn keys(batches: &[RecordBatch]) -> Vec<(String, i64)> {
        let mut out = vec![];
        for b in batches {
            let k = b.column(0).as_any().downcast_ref::<StringArray>().unwrap();
            let n = b.column(1).as_any().downcast_ref::<Int64Array>().unwrap();
            for i in 0..b.num_rows() {
                out.push((k.value(i).to_string(), n.value(i)));
            }
        }
        out.sort();
        out
    }

    #[test]
    fn a_write_splits_a_changelog_once_and_what_it_takes_back_and_adds_again_cancels() {
        // a: created and deleted within the write (a CDC topic's c then d);
        // b: 1 -> 2; c: deleted; d: created.
        let first = tagged(&["a", "b", "c"], &[7, 1, 3], &[1, -1, -1]);
        let second = tagged(&["a", "b", "d"], &[7, 2, 4], &[-1, 1, 1]);
        let schema = first.schema();
        let (plain, rows) = SinkRows::from_stage(&schema, vec![first, second]).unwrap();
        assert!(!crate::changelog::is_changelog(&plain));
        let (retract, insert) = rows.by_kind();
        assert_eq!(keys(retract), [("b".into(), 1), ("c".into(), 3)]);
        assert_eq!(keys(insert), [("b".into(), 2), ("d".into(), 4)]);
        assert_eq!(rows.num_rows(), 4);
        let tagged = rows.tagged().unwrap();
        assert!(
            tagged
                .iter()
                .all(|b| crate::changelog::is_changelog(&b.schema()))
        );
    }

    #[test]
    fn rows_without_the_op_column_are_appended_as_they_are() {
        let b = crate::changelog::strip(&tagged(&["a"], &[1], &[1])).unwrap();
        let (plain, rows) = SinkRows::from_stage(&b.schema(), vec![b.clone()]).unwrap();
        assert_eq!(plain, b.schema());
        assert!(!rows.updates());
        assert_eq!(keys(rows.by_kind().1), [("a".into(), 1)]);
    }
}
