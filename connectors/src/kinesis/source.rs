//! The Kinesis source: `CREATE EXTERNAL TABLE t (...) STORED AS KINESIS
//! LOCATION '<stream>' OPTIONS ('format' 'json', ...)`.
//!
//! Source instance `i` of `N` reads the shards whose number is `i` modulo
//! `N` with GetShardIterator / GetRecords, keeping its shard iterators
//! between pulls. A pull reads each owned shard until it is caught
//! up (`MillisBehindLatest` = 0 or an empty read), the record budget is
//! spent, or the pull's time is up; records are decoded straight into Arrow
//! by the same decoders as Kafka's.
//!
//! Options:
//! - `format` (`json`, `csv`, `raw`, and Avro, Protobuf and Debezium with
//!   their options: docs/formats.md), `parallelism` (source instances; by
//!   default the fewer of the open shards and the cores, or the group size
//!   on Lambda),
//!   `max.records.per.pull` (default 100,000, shared equally by the shards),
//!   `max.record.bytes`,
//!   `pull.timeout.ms` (default 2,000);
//! - `startup`: `trim_horizon` (or `earliest`, the default), `latest`, or
//!   `at_timestamp` with `startup.timestamp.ms`;
//! - `dead.letter.stream`: undecodable records go there as JSON objects
//!   `{"stream", "shard", "sequence_number", "reason", "record"}`, and are
//!   counted; without it they are only counted and logged.
//!
//! Reshards are followed (see `shards.rs`): the shards are listed again
//! each pull and whenever a shard ends, a shard is read to its end before
//! its children start, and the offsets log marks a finished shard with
//! [`SHARD_END`] so a replay or a resume does not read it again.

use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_kinesis::types::ShardIteratorType;
use datafusion::arrow::datatypes::SchemaRef;
use skein_engine::error::{EngineError, Result as EngineResult};
use skein_engine::payload::SourceOffset;
use skein_engine::source::partition_number as shard_number;
use skein_engine::source::{
    EpochSpec, MicroBatch, PushedRecord, ReplayMode, Source, SourceCapabilities, SourceConfig,
    SourceFactory, TableOptions,
};
use tokio::sync::Mutex;

use super::config::{KinesisSourceConfig, SOURCE_OPTIONS, source_name};
use super::reader::{ShardReader, Target};
use super::shards::{SHARD_END, shard_id};
use super::stream::Stream;
use crate::error::Result;
use skein_formats::decode::RecordDecoder;

/// Reads one Kinesis stream for one source instance.
pub struct KinesisSource {
    stream: Stream,
    /// Opened on the first pull: planning must not need AWS.
    reader: Mutex<Option<ShardReader>>,
}

impl KinesisSource {
    pub fn new(config: KinesisSourceConfig, schema: SchemaRef) -> Result<Self> {
        Ok(KinesisSource {
            stream: Stream::new(config, schema)?,
            reader: Mutex::new(None),
        })
    }

    /// Undecodable records this source has seen.
    pub fn dead_letters(&self) -> u64 {
        self.stream.dead_letters()
    }
}

impl std::fmt::Debug for KinesisSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KinesisSource({})", self.stream.config.stream)
    }
}

#[async_trait]
impl Source for KinesisSource {
    fn schema(&self) -> SchemaRef {
        self.stream.decoder.schema().clone()
    }

    fn parallelism(&self) -> usize {
        self.stream.config.parallelism
    }

    fn changelog(&self) -> bool {
        self.stream.decoder.changelog()
    }

    async fn problems(&self) -> Vec<String> {
        RecordDecoder::problems(&self.stream.decoder).await
    }

    async fn pull(&self, spec: EpochSpec) -> EngineResult<MicroBatch> {
        self.stream.pull_to(&self.reader, spec, None).await
    }

    fn replay_mode(&self) -> ReplayMode {
        ReplayMode::Offsets
    }

    async fn decode_pushed(&self, records: &[PushedRecord]) -> EngineResult<MicroBatch> {
        let records: Vec<(&str, &str, &[u8])> = records
            .iter()
            .map(|r| (r.partition.as_str(), r.position.as_str(), r.data.as_slice()))
            .collect();
        self.stream.decode_records(&records, true).await
    }

    async fn position(&self, spec: EpochSpec) -> EngineResult<Vec<SourceOffset>> {
        let mut slot = self.reader.lock().await;
        let reader = self.stream.reader(&mut slot, &spec).await?;
        Ok(reader
            .shards
            .iter()
            .map(|s| SourceOffset {
                source: self.stream.config.stream.clone(),
                partition: shard_number(&s.id),
                offset: if s.finished { SHARD_END } else { 0 },
                position: s.last_sequence.clone(),
            })
            .collect())
    }

    /// `MillisBehindLatest` of a one-record read just after each committed
    /// sequence number (finished shards are not behind).
    async fn behind_ms(&self, committed: &[SourceOffset]) -> EngineResult<Vec<(i32, i64)>> {
        let client = self.stream.client().await;
        let mut out = vec![];
        for o in committed {
            if o.offset == SHARD_END || o.source != self.stream.config.stream {
                continue;
            }
            let shard = shard_id(o.partition);
            let mut req = client
                .get_shard_iterator()
                .stream_name(&self.stream.config.stream)
                .shard_id(&shard);
            req = match &o.position {
                Some(seq) => req
                    .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
                    .starting_sequence_number(seq),
                None => req.shard_iterator_type(ShardIteratorType::TrimHorizon),
            };
            // A shard gone since the commit (a reshard) is not behind.
            let it = match req.send().await {
                Ok(it) => it,
                Err(e) => {
                    tracing::debug!(stream = %self.stream.config.stream, %shard, error = %e, "no iterator for the delay");
                    continue;
                }
            };
            let Some(iterator) = it.shard_iterator() else {
                continue;
            };
            let page = client
                .get_records()
                .shard_iterator(iterator)
                .limit(1)
                .send()
                .await
                .map_err(|e| self.stream.error(e))?;
            if let Some(ms) = page.millis_behind_latest() {
                out.push((o.partition, ms));
            }
        }
        Ok(out)
    }

    async fn seek(&self, spec: EpochSpec, at: &[SourceOffset]) -> EngineResult<()> {
        let mut slot = self.reader.lock().await;
        let reader = self.stream.reader(&mut slot, &spec).await?;
        for shard in reader.shards.iter_mut() {
            let Some(o) = self.stream.logged(at, &shard.id) else {
                continue;
            };
            let finished = o.offset == SHARD_END;
            if shard.last_sequence == o.position && shard.finished == finished {
                continue;
            }
            shard.last_sequence = o.position.clone();
            shard.finished = finished;
            // Fetched from `last_sequence` before the next read.
            shard.iterator = None;
        }
        Ok(())
    }

    async fn replay(
        &self,
        spec: EpochSpec,
        from: &[SourceOffset],
        to: &[SourceOffset],
    ) -> EngineResult<MicroBatch> {
        self.seek(spec, from).await?;
        self.stream.replayable(&self.reader, spec, from, to).await?;
        let targets = to
            .iter()
            .filter(|o| o.source == self.stream.config.stream)
            .map(|o| {
                let target = Target {
                    last: o.position.clone(),
                    end: o.offset == SHARD_END,
                };
                (o.partition, target)
            })
            .collect();
        self.stream.pull_to(&self.reader, spec, Some(targets)).await
    }
}

/// Builds [`KinesisSource`]s from `STORED AS KINESIS` tables.
#[derive(Debug, Default)]
pub struct KinesisSourceFactory;

#[async_trait]
impl SourceFactory for KinesisSourceFactory {
    fn options(&self) -> TableOptions {
        // Its own and its format's (Avro, Protobuf, the schema registry).
        static ALL: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
        TableOptions::only(ALL.get_or_init(|| {
            SOURCE_OPTIONS
                .iter()
                .copied()
                .chain(skein_formats::all_options())
                .collect()
        }))
    }

    fn capabilities(&self) -> SourceCapabilities {
        SourceCapabilities {
            replay: ReplayMode::Offsets,
            live: true,
        }
    }

    fn create(&self, config: &SourceConfig, schema: SchemaRef) -> EngineResult<Arc<dyn Source>> {
        let source = KinesisSourceConfig::from_source_config(config)
            .and_then(|c| KinesisSource::new(c, schema))
            .map_err(|e| e.for_source(source_name(&config.location)))?;
        Ok(Arc::new(source))
    }

    /// The open shards: a closed one is only read to its end, and its
    /// children take its place.
    async fn partitions(&self, config: &SourceConfig) -> EngineResult<Option<usize>> {
        let name = source_name(&config.location);
        let listed = async {
            let client = skein_clients::kinesis::client().await;
            super::shards::list_shards(&client, &config.location).await
        };
        // An endpoint that does not answer costs planning this, and the
        // table one instance.
        let shards = tokio::time::timeout(std::time::Duration::from_secs(5), listed)
            .await
            .map_err(|_| {
                EngineError::source_failed(name.clone(), "ListShards did not answer in 5 s")
            })?
            .map_err(|e| e.for_source(name))?;
        Ok(Some(shards.iter().filter(|s| !s.closed).count()))
    }
}
