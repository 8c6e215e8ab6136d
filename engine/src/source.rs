//! The Source trait: how a source stage pulls its micro-batch for an epoch.
//! Connectors (Kafka, Kinesis, generators) implement it in their own crates
//! and are found through a [`SourceRegistry`] by the `kind` of their config.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};
use crate::interval::{EPOCH_INTERVAL_OPTION, table_interval};
use crate::payload::SourceOffset;
use crate::watermark::EVENT_TIME_OPTIONS;

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

/// A record a query could not use, on its way to its table's dead-letter
/// destination.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// The table (and so the source) the record came from.
    pub table: String,
    /// Why it was set aside, e.g. `late`.
    pub reason: String,
    /// For a late row: the window it belongs to, `[start, end)` in ms.
    pub window: Option<(i64, i64)>,
    /// The row as a JSON object.
    pub row: String,
    /// Names the letter; a replay produces the same key, so a compacted
    /// destination keeps one copy.
    pub key: String,
    /// Where the sending source member's partitions stood after the epoch
    /// that set the row aside, if it knows (a reader can tell from them
    /// whether that epoch is committed).
    #[serde(default)]
    pub offsets: Vec<SourceOffset>,
}

/// Where a source's dead letters go (a topic, a stream).
#[async_trait]
pub trait DeadLetterSink: Send + Sync + std::fmt::Debug {
    /// Deliver the letters; returns once the destination has them.
    async fn send(&self, letters: &[DeadLetter]) -> Result<()>;
}

/// Table option: how long an updating stage keeps the rows of a key of
/// this table that nothing touched (`'state.ttl' '1h'`; default forever).
pub const STATE_TTL_OPTION: &str = "state.ttl";
/// Sink table option: how often an updating query emits its changes
/// (`'emit.interval' '10s'`; default every epoch).
pub const EMIT_INTERVAL_OPTION: &str = "emit.interval";
/// Options every table kind takes, read by the engine and never handed to
/// a factory.
pub const ENGINE_OPTIONS: [&str; 3] = [
    EPOCH_INTERVAL_OPTION,
    STATE_TTL_OPTION,
    EMIT_INTERVAL_OPTION,
];

/// A duration option of the engine's, if the table sets it; zero or a
/// malformed value is an error naming the option.
pub fn duration_option(config: &SourceConfig, name: &str) -> Result<Option<std::time::Duration>> {
    let Some(text) = config.option(name) else {
        return Ok(None);
    };
    match crate::interval::parse_duration(text) {
        Ok(d) if !d.is_zero() => Ok(Some(d)),
        Ok(_) => Err(EngineError::plan(format!(
            "option '{name}' = {text:?} must be longer than zero"
        ))),
        Err(e) => Err(EngineError::plan(format!(
            "option '{name}' = {text:?}: {e}"
        ))),
    }
}

/// The options a table kind takes, declared once next to where they are
/// parsed. The event-time options ([`EVENT_TIME_OPTIONS`]) are taken by every
/// kind and need not be listed.
#[derive(Debug, Clone, Copy)]
pub struct TableOptions {
    /// The options the kind takes.
    pub names: &'static [&'static str],
    /// Where options with a dot that are not in `names` go as they are, if
    /// anywhere (Kafka: "librdkafka property"); without it they are unknown.
    pub dotted_passthrough: Option<&'static str>,
}

impl TableOptions {
    /// Exactly these options.
    pub const fn only(names: &'static [&'static str]) -> Self {
        TableOptions {
            names,
            dotted_passthrough: None,
        }
    }
}

/// Builds sources from their config. One factory per kind.
pub trait SourceFactory: Send + Sync {
    /// The options this kind's tables take; others are refused at CREATE TABLE.
    fn options(&self) -> TableOptions;

    /// A source for `config`, producing rows of `schema`.
    fn create(&self, config: &SourceConfig, schema: SchemaRef) -> Result<Arc<dyn Source>>;

    /// The table's dead-letter destination, if it declares one. Stages
    /// after the source use it for rows they reject (late rows).
    fn dead_letters(&self, config: &SourceConfig) -> Result<Option<Arc<dyn DeadLetterSink>>> {
        let _ = config;
        Ok(None)
    }
}

/// The one place that lists the source kinds a binary knows.
#[derive(Clone, Default)]
pub struct SourceRegistry {
    factories: HashMap<String, Arc<dyn SourceFactory>>,
    /// Options of a kind that another part reads (a sink writing the same
    /// table, the Lambda deployer): accepted, and kept from the factory.
    extra_options: HashMap<String, Vec<&'static str>>,
    /// Kinds whose tables may be lookup tables (see [`crate::lookup`]).
    pub(crate) lookups: HashMap<String, Arc<dyn crate::lookup::LookupFactory>>,
    /// The sink kinds, for what the planner asks of the table a query
    /// writes (whether it takes updates).
    sinks: Option<crate::sink::SinkRegistry>,
}

impl SourceRegistry {
    /// Register `factory` for `kind`.
    pub fn register(&mut self, kind: &str, factory: Arc<dyn SourceFactory>) {
        self.factories.insert(kind.to_ascii_uppercase(), factory);
    }

    /// Know the sink kinds too, so planning can ask what the table a query
    /// writes can take.
    pub fn know_sinks(&mut self, sinks: &crate::sink::SinkRegistry) {
        self.sinks = Some(sinks.clone());
    }

    /// Whether the sink `config` declares takes a changelog; `None` when
    /// no sink kinds are known here.
    pub fn sink_takes_updates(
        &self,
        config: &crate::sink::SinkConfig,
    ) -> Option<std::result::Result<(), String>> {
        self.sinks.as_ref().map(|s| s.takes_updates(config))
    }

    /// Let tables of `kind` take `names` too, for a reader other than the
    /// source factory (a sink of the same kind, say).
    pub fn allow_options(&mut self, kind: &str, names: &[&'static str]) {
        let extra = self
            .extra_options
            .entry(kind.to_ascii_uppercase())
            .or_default();
        for n in names {
            if !extra.contains(n) {
                extra.push(n);
            }
        }
    }

    /// Refuse an option the table's kind does not take, naming it and
    /// listing those it does.
    pub fn check_options(&self, config: &SourceConfig) -> Result<()> {
        let factory = self.factory(config)?;
        let own = factory.options();
        let extra = self.extras(config);
        let known = |k: &str| {
            own.names.contains(&k)
                || extra.contains(&k)
                || EVENT_TIME_OPTIONS.contains(&k)
                || ENGINE_OPTIONS.contains(&k)
                || (own.dotted_passthrough.is_some() && k.contains('.'))
        };
        let Some(unknown) = config.options.keys().find(|k| !known(k)) else {
            duration_option(config, STATE_TTL_OPTION)?;
            duration_option(config, EMIT_INTERVAL_OPTION)?;
            return table_interval(config).map(drop);
        };
        let mut allowed: Vec<&str> = own.names.iter().chain(extra).copied().collect();
        allowed.sort_unstable();
        allowed.dedup();
        allowed.extend(EVENT_TIME_OPTIONS);
        allowed.extend(ENGINE_OPTIONS);
        let mut list = allowed.join(", ");
        if let Some(what) = own.dotted_passthrough {
            list.push_str(&format!(", and any {what} (a name with a dot)"));
        }
        Err(EngineError::plan(format!(
            "unknown option '{unknown}' for a {} table; it takes {list}",
            config.kind.to_ascii_uppercase()
        )))
    }

    fn extras(&self, config: &SourceConfig) -> &[&'static str] {
        self.extra_options
            .get(&config.kind.to_ascii_uppercase())
            .map(Vec::as_slice)
            .unwrap_or_default()
    }

    /// The config as the factory sees it: without the options that other
    /// readers registered (a Kafka sink's `offsets.topic` is no librdkafka
    /// property of the consumer).
    fn factory_config<'a>(&self, config: &'a SourceConfig) -> Cow<'a, SourceConfig> {
        let own = self
            .factories
            .get(&config.kind.to_ascii_uppercase())
            .map(|f| f.options().names)
            .unwrap_or_default();
        // The epoch interval, state TTL and emit interval are the engine's,
        // never the source's.
        let foreign = |k: &str| {
            ENGINE_OPTIONS.contains(&k) || (self.extras(config).contains(&k) && !own.contains(&k))
        };
        if !config.options.keys().any(|k| foreign(k)) {
            return Cow::Borrowed(config);
        }
        let mut c = config.clone();
        c.options.retain(|k, _| !foreign(k));
        Cow::Owned(c)
    }

    /// The registered kinds.
    pub fn kinds(&self) -> Vec<String> {
        let mut k: Vec<String> = self.factories.keys().cloned().collect();
        k.sort();
        k
    }

    /// The table's source; an option its kind does not take is an error.
    pub fn create(&self, config: &SourceConfig, schema: SchemaRef) -> Result<Arc<dyn Source>> {
        self.check_options(config)?;
        self.factory(config)?
            .create(&self.factory_config(config), schema)
    }

    /// The dead-letter destination a table declares, if any.
    pub fn dead_letters(&self, config: &SourceConfig) -> Result<Option<Arc<dyn DeadLetterSink>>> {
        self.factory(config)?
            .dead_letters(&self.factory_config(config))
    }

    fn factory(&self, config: &SourceConfig) -> Result<&Arc<dyn SourceFactory>> {
        self.factories
            .get(&config.kind.to_ascii_uppercase())
            .ok_or_else(|| {
                EngineError::source_failed(
                    config.location.clone(),
                    format!(
                        "unknown source kind {:?}; known: {:?}",
                        config.kind,
                        self.kinds()
                    ),
                )
            })
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

    fn create(&self, config: &SourceConfig, _schema: SchemaRef) -> Result<Arc<dyn Source>> {
        let tables = self.tables.lock().expect("memory tables");
        let src = tables.get(&config.location).ok_or_else(|| {
            EngineError::source_failed(config.location.clone(), "no in-memory table of that name")
        })?;
        Ok(src.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(TableOptions);

    impl SourceFactory for Fixed {
        fn options(&self) -> TableOptions {
            self.0
        }
        fn create(&self, config: &SourceConfig, schema: SchemaRef) -> Result<Arc<dyn Source>> {
            // Hands back what it was given, so tests see the factory's view.
            let _ = schema;
            Err(EngineError::plan(format!("{:?}", config.options)))
        }
    }

    fn config(kind: &str, options: &[(&str, &str)]) -> SourceConfig {
        SourceConfig {
            kind: kind.into(),
            location: "t".into(),
            options: options
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    fn registry() -> SourceRegistry {
        let mut r = SourceRegistry::default();
        r.register("PLAIN", Arc::new(Fixed(TableOptions::only(&["rate"]))));
        r.register(
            "DOTTED",
            Arc::new(Fixed(TableOptions {
                names: &["format"],
                dotted_passthrough: Some("client property"),
            })),
        );
        r.allow_options("dotted", &["offsets.topic", "key"]);
        r
    }

    #[test]
    fn unknown_options_are_named_with_the_allowed_ones() {
        let r = registry();
        let err = r
            .check_options(&config("PLAIN", &[("paralelism", "2")]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("unknown option 'paralelism' for a PLAIN table"),
            "{err}"
        );
        assert!(err.contains("rate, event_time, lateness_ms"), "{err}");
        assert!(
            r.check_options(&config("PLAIN", &[("rate", "1"), ("late", "drop")]))
                .is_ok()
        );
        // A dot passes only where the kind hands such options on.
        assert!(r.check_options(&config("PLAIN", &[("a.b", "1")])).is_err());
        assert!(r.check_options(&config("DOTTED", &[("a.b", "1")])).is_ok());
        let err = r
            .check_options(&config("DOTTED", &[("fromat", "json")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("format, key, offsets.topic"), "{err}");
        assert!(
            err.contains("any client property (a name with a dot)"),
            "{err}"
        );
    }

    #[test]
    fn options_registered_by_others_are_kept_from_the_factory() {
        let r = registry();
        let c = config(
            "DOTTED",
            &[("format", "json"), ("offsets.topic", "o"), ("x.y", "1")],
        );
        let seen = r.create(&c, Arc::new(datafusion::arrow::datatypes::Schema::empty()));
        let seen = seen.unwrap_err().to_string();
        assert!(seen.contains("format") && seen.contains("x.y"), "{seen}");
        assert!(!seen.contains("offsets.topic"), "{seen}");
    }

    #[test]
    fn every_kind_takes_an_epoch_interval_and_its_source_never_sees_it() {
        let r = registry();
        for kind in ["PLAIN", "DOTTED"] {
            let c = config(kind, &[("epoch.interval", "250ms")]);
            assert!(r.check_options(&c).is_ok(), "{kind}");
            let seen = r
                .create(&c, Arc::new(datafusion::arrow::datatypes::Schema::empty()))
                .unwrap_err()
                .to_string();
            assert!(!seen.contains("epoch.interval"), "{kind}: {seen}");
            assert_eq!(
                crate::interval::table_interval(&c).unwrap(),
                Some(std::time::Duration::from_millis(250))
            );
        }
        for bad in ["soon", "0s", "-1s"] {
            let err = r
                .check_options(&config("PLAIN", &[("epoch.interval", bad)]))
                .unwrap_err()
                .to_string();
            assert!(err.contains("'epoch.interval'"), "{bad}: {err}");
        }
    }
}
