//! The Source trait: how a source stage pulls its micro-batch for an epoch.
//! Connectors (Kafka, Kinesis, generators) implement it in their own crates
//! and register a [`SourceFactory`] for their kind in the
//! [`Catalog`](crate::catalog::Catalog).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use serde::{Deserialize, Serialize};

use crate::dead_letter::DeadLetterSink;
use crate::error::{EngineError, Result};
use crate::payload::SourceOffset;

/// The options a factory declares (defined with the catalog's other options).
pub use crate::table_options::TableOptions;

/// A table's source as declared in SQL: its kind (`KAFKA`, `NEXMARK`, ...)
/// and options. It travels in the cloud context, so it must stay small.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceConfig {
    /// The source kind (`STORED AS`).
    pub kind: String,
    /// Its location (`LOCATION`).
    pub location: String,
    /// Its options.
    #[serde(default)]
    pub options: BTreeMap<String, String>,
}

impl SourceConfig {
    /// The option `key`, if given.
    pub fn option(&self, key: &str) -> Option<&str> {
        self.options.get(key).map(String::as_str)
    }
}

/// Which slice of which epoch to pull.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochSpec {
    /// This instance among the stage's instances.
    pub instance: usize,
    /// How many instances read the table.
    pub instances: usize,
    /// The epoch.
    pub epoch: u64,
    /// The run's number of epochs, when it is bounded.
    pub epochs: Option<u64>,
}

/// One pull: the data plus what travels with it to the sink.
#[derive(Debug, Default)]
pub struct MicroBatch {
    /// The rows pulled.
    pub batches: Vec<RecordBatch>,
    /// Where this instance now stands in its partitions.
    pub offsets: Vec<SourceOffset>,
    /// Per partition (Kafka partition, Kinesis shard) the instance owns:
    /// which batches came from it and how far the pull got. Event time is
    /// tracked per partition from this. A source that leaves it empty is
    /// taken as one partition holding every batch (see [`MicroBatch::progress`]).
    pub partitions: Vec<PartitionProgress>,
    /// Pushed records (by index into what `decode_pushed` was given) that
    /// were not decoded and had no dead-letter destination to go to.
    pub rejected: Vec<(usize, String)>,
    /// Records this pull sent to the table's dead-letter destination.
    pub dead_letters: u64,
    /// Why the last of them was set aside (where it was, what was wrong).
    pub dead_letter_reason: Option<String>,
}

/// How far one pull got in one partition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartitionProgress {
    /// The partition's name: a Kafka partition number, a shard id.
    pub partition: String,
    /// Indexes into [`MicroBatch::batches`] of the batches read from it.
    pub batches: Vec<usize>,
    /// The pull reached the end of what the partition holds right now.
    pub caught_up: bool,
    /// The partition reached the end it had when the source was opened
    /// (what `--until-drained` waits for).
    pub drained: bool,
    /// Nothing will ever come again (a bounded source that is exhausted).
    pub finished: bool,
    /// Records between where the pull stopped and the partition's end, if
    /// the source knows it.
    pub lag: Option<u64>,
}

impl MicroBatch {
    /// The per-partition progress, or, for a source that does not report
    /// partitions, one partition holding every batch that is caught up (and
    /// drained) when the pull found nothing.
    pub fn progress(&self) -> Vec<PartitionProgress> {
        if !self.partitions.is_empty() {
            return self.partitions.clone();
        }
        let empty = self.batches.iter().all(|b| b.num_rows() == 0);
        vec![PartitionProgress {
            partition: "0".into(),
            batches: (0..self.batches.len()).collect(),
            caught_up: empty,
            drained: empty,
            finished: false,
            lag: None,
        }]
    }

    /// One partition holding every batch, with the given state: for sources
    /// that read one partition per instance (the generators).
    pub fn single_partition(
        batches: Vec<RecordBatch>,
        offsets: Vec<SourceOffset>,
        partition: impl Into<String>,
        finished: bool,
    ) -> Self {
        let progress = PartitionProgress {
            partition: partition.into(),
            batches: (0..batches.len()).collect(),
            caught_up: finished,
            drained: finished,
            finished,
            lag: None,
        };
        MicroBatch {
            batches,
            offsets,
            partitions: vec![progress],
            ..Default::default()
        }
    }
}

/// How a source reads an epoch again after a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayMode {
    /// Its pull is a function of the epoch (a generator): pull again.
    ByEpoch,
    /// It reads partitions by offset: the offsets log says from where to where.
    Offsets,
    /// It cannot: a query reading it does not checkpoint.
    Unsupported,
}

/// A table that is read in micro-batches, one per epoch per instance; connectors implement it.
#[async_trait]
pub trait Source: Send + Sync + std::fmt::Debug {
    /// The full (unprojected) schema of the records.
    fn schema(&self) -> SchemaRef;

    /// How many instances read this source in parallel.
    fn parallelism(&self) -> usize;

    /// Pull the micro-batch of `spec.epoch` for instance `spec.instance`.
    async fn pull(&self, spec: EpochSpec) -> Result<MicroBatch>;

    /// Whether its rows are a changelog (a change-data-capture topic): its
    /// batches then carry [`crate::changelog::OP_COLUMN`] after the
    /// columns of [`Source::schema`], and everything the query computes
    /// from them updates.
    fn changelog(&self) -> bool {
        false
    }

    /// How a checkpoint can read this source's epochs again.
    fn replay_mode(&self) -> ReplayMode {
        ReplayMode::Unsupported
    }

    /// Where this instance stands in its partitions: the next offset of
    /// each (`ReplayMode::Offsets` sources; others stand nowhere).
    async fn position(&self, spec: EpochSpec) -> Result<Vec<SourceOffset>> {
        let _ = spec;
        Ok(vec![])
    }

    /// The end of every partition of the source now (the next offset a
    /// write would get), for `skein status`'s lag; empty where unknown.
    async fn latest(&self) -> Result<Vec<SourceOffset>> {
        Ok(vec![])
    }

    /// How far behind the newest record each partition is when read from
    /// `committed`, in ms, for a source whose offsets are no record counts
    /// (Kinesis sequence numbers); empty where unknown.
    async fn behind_ms(&self, committed: &[SourceOffset]) -> Result<Vec<(i32, i64)>> {
        let _ = committed;
        Ok(vec![])
    }

    /// What keeps this source from reading right now, each on one line
    /// (a schema registry that does not answer), for `skein status`.
    async fn problems(&self) -> Vec<String> {
        vec![]
    }

    /// Whether this source may keep a member's offsets note
    /// ([`Source::keep_note`]); no I/O. A member none of whose sources may
    /// does not build one.
    fn keeps_notes(&self) -> bool {
        false
    }

    /// Keep `note` (a member's offsets log since the last commit) durably
    /// in the source's own system under `key`, with this instance's
    /// position, so an epoch between checkpoints writes nothing to the
    /// object store. `Ok(false)`: this source cannot keep it (it has no
    /// place, owns no partition, or the note is too long); the caller
    /// writes the entry to the object store instead.
    async fn keep_note(&self, spec: EpochSpec, key: &str, note: &str) -> Result<bool> {
        let _ = (spec, key, note);
        Ok(false)
    }

    /// The note last kept under `key`, if any. The first call fences
    /// every earlier writer of `key`: a note kept by an instance of a run
    /// that was replaced cannot land after it is read.
    async fn kept_note(&self, spec: EpochSpec, key: &str) -> Result<Option<String>> {
        let _ = (spec, key);
        Ok(None)
    }

    /// Stand at `at` (from the offsets log) before the next pull.
    async fn seek(&self, spec: EpochSpec, at: &[SourceOffset]) -> Result<()> {
        let _ = (spec, at);
        Ok(())
    }

    /// Read again exactly what an earlier pull of `spec.epoch` read, from
    /// `from` up to `to`, and stand at `to` afterwards. A source whose pull
    /// is a function of the epoch alone pulls again.
    async fn replay(
        &self,
        spec: EpochSpec,
        from: &[SourceOffset],
        to: &[SourceOffset],
    ) -> Result<MicroBatch> {
        match self.replay_mode() {
            ReplayMode::ByEpoch => self.pull(spec).await,
            _ => {
                let _ = (from, to);
                Err(EngineError::source_failed(
                    format!("{self:?}"),
                    "this source cannot read an epoch again",
                ))
            }
        }
    }

    /// Decode records a platform pushed to the function (a batch of a Lambda
    /// Kinesis event-source mapping) as a pull would have read them.
    async fn decode_pushed(&self, records: &[PushedRecord]) -> Result<MicroBatch> {
        let _ = records;
        Err(EngineError::source_failed(
            format!("{self:?}"),
            "this source does not take pushed records",
        ))
    }
}

/// The number in a partition id such as a shard id
/// (`shardId-000000000003` -> 3); -1 when there is none.
pub fn partition_number(id: &str) -> i32 {
    id.rsplit('-')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(-1)
}

/// Whether position `a` comes after `b` in a partition. Kinesis sequence
/// numbers are decimal strings of up to 128 bits: compare by length, then
/// text.
pub fn position_after(a: &str, b: &str) -> bool {
    (a.len(), a) > (b.len(), b)
}

/// One record pushed to a function, with where it came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PushedRecord {
    /// Partition or shard, e.g. `shardId-000000000000`.
    pub partition: String,
    /// Position within it, e.g. a Kinesis sequence number.
    pub position: String,
    /// The record's bytes.
    pub data: Vec<u8>,
}

/// What the sources of a kind can do, whatever their options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceCapabilities {
    /// How a checkpoint reads an epoch again (the same as
    /// [`Source::replay_mode`] of every source the kind makes).
    pub replay: ReplayMode,
    /// Live: the source has no end of its own (Kafka, Kinesis); a query
    /// reading it with no bound runs until it is stopped. Otherwise it is
    /// bounded (the generators).
    pub live: bool,
}

impl Default for SourceCapabilities {
    fn default() -> Self {
        SourceCapabilities {
            replay: ReplayMode::Unsupported,
            live: false,
        }
    }
}

/// Builds sources from their config. One factory per kind.
#[async_trait]
pub trait SourceFactory: Send + Sync {
    /// The options this kind's source takes; the catalog refuses those no
    /// one declares at CREATE TABLE, and hands the factory only these (and
    /// options with a dot no one else declares, if it takes them).
    fn options(&self) -> TableOptions;

    /// What its sources can do.
    fn capabilities(&self) -> SourceCapabilities {
        SourceCapabilities::default()
    }

    /// Whether the table asks to start where the query's sink last
    /// committed (Kafka's `'startup' 'checkpoint'`): the sink's committed
    /// offsets are then read before the query runs ([`SourceFactory::starting_at`]).
    fn resumes_from_sink(&self, config: &SourceConfig) -> bool {
        let _ = config;
        false
    }

    /// The table's whole declaration, starting at `offsets` (partition ->
    /// next offset) instead: what a table that resumes from its sink
    /// becomes. Only the factory's own options change.
    fn starting_at(&self, config: &SourceConfig, offsets: &BTreeMap<i32, i64>) -> SourceConfig {
        let _ = offsets;
        config.clone()
    }

    /// A source for `config`, producing rows of `schema`.
    fn create(&self, config: &SourceConfig, schema: SchemaRef) -> Result<Arc<dyn Source>>;

    /// How many partitions (Kafka) or open shards (Kinesis) the table has
    /// now, from which the catalog sizes a table that does not say its
    /// `parallelism`; `None` for a kind that is not split so.
    async fn partitions(&self, config: &SourceConfig) -> Result<Option<usize>> {
        let _ = config;
        Ok(None)
    }

    /// The table's dead-letter destination, if it declares one. Stages
    /// after the source use it for rows they reject (late rows).
    fn dead_letters(&self, config: &SourceConfig) -> Result<Option<Arc<dyn DeadLetterSink>>> {
        let _ = config;
        Ok(None)
    }
}

/// Rows held in memory, split into partitions; epoch `e` of `E` reads the
/// e-th of E equal slices of each partition. For tests and examples.
#[derive(Debug)]
pub struct MemorySource {
    schema: SchemaRef,
    partitions: Vec<Vec<RecordBatch>>,
}

impl MemorySource {
    /// A source with one list of batches per partition.
    pub fn new(schema: SchemaRef, partitions: Vec<Vec<RecordBatch>>) -> Self {
        MemorySource { schema, partitions }
    }
}

#[async_trait]
impl Source for MemorySource {
    fn replay_mode(&self) -> ReplayMode {
        ReplayMode::ByEpoch
    }

    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn parallelism(&self) -> usize {
        self.partitions.len().max(1)
    }

    async fn pull(&self, spec: EpochSpec) -> Result<MicroBatch> {
        let Some(part) = self.partitions.get(spec.instance) else {
            return Ok(MicroBatch::default());
        };
        let epochs = spec.epochs.unwrap_or(1).max(1);
        let rows: usize = part.iter().map(|b| b.num_rows()).sum();
        let per = rows.div_ceil(epochs as usize);
        let (start, end) = (
            per * spec.epoch as usize,
            (per * (spec.epoch as usize + 1)).min(rows),
        );
        let mut out = vec![];
        let mut seen = 0;
        for b in part {
            let (lo, hi) = (seen, seen + b.num_rows());
            seen = hi;
            let (s, e) = (start.max(lo), end.min(hi));
            if s < e {
                out.push(b.slice(s - lo, e - s));
            }
        }
        let offsets = vec![SourceOffset {
            source: "memory".into(),
            partition: spec.instance as i32,
            offset: end as i64,
            position: None,
        }];
        Ok(MicroBatch::single_partition(
            out,
            offsets,
            spec.instance.to_string(),
            end >= rows,
        ))
    }
}

/// Serves named in-memory tables: the config's `location` names the table.
#[derive(Default)]
pub struct MemorySourceFactory {
    tables: Mutex<HashMap<String, Arc<MemorySource>>>,
}

impl MemorySourceFactory {
    /// Add the in-memory table `name`.
    pub fn insert(&self, name: &str, source: MemorySource) {
        self.tables
            .lock()
            .expect("memory tables")
            .insert(name.to_string(), Arc::new(source));
    }
}

impl SourceFactory for MemorySourceFactory {
    fn options(&self) -> TableOptions {
        TableOptions::only(&[])
    }

    fn capabilities(&self) -> SourceCapabilities {
        SourceCapabilities {
            replay: ReplayMode::ByEpoch,
            live: false,
        }
    }

    fn create(&self, config: &SourceConfig, _schema: SchemaRef) -> Result<Arc<dyn Source>> {
        let tables = self.tables.lock().expect("memory tables");
        let src = tables.get(&config.location).ok_or_else(|| {
            EngineError::source_failed(config.location.clone(), "no in-memory table of that name")
        })?;
        Ok(src.clone())
    }
}
