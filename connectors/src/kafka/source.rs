//! The Kafka source: `CREATE EXTERNAL TABLE t (...) STORED AS KAFKA LOCATION
//! '<topic>' OPTIONS (...)`.
//!
//! Each source instance owns the partitions `p` with `index(p) % instances ==
//! instance` and assigns them directly (no consumer-group rebalancing, so the
//! split is deterministic). A pull reads its partitions up to the high
//! watermark seen when the pull began, or until a record / byte budget or a
//! time limit is reached (each partition reads an equal share of the record
//! budget from a queue of its own), decodes the records into Arrow with the declared
//! schema and reports the next offset of every owned partition. Records that
//! do not decode go to the dead-letter topic, if one is configured, and are
//! always counted.
//!
//! Options (all optional except `bootstrap.servers`):
//!
//! | option                 | meaning                                               |
//! |------------------------|-------------------------------------------------------|
//! | `format`               | `json` (default), `csv`, `raw`, `avro`, `avro-confluent`, `protobuf`, `protobuf-confluent`, `debezium-json`, `debezium-avro-confluent` (docs/formats.md, with their options) |
//! | `parallelism`          | source instances (default: the fewer of the topic's partitions and the cores, or the group size on Lambda) |
//! | `startup`              | `earliest` (default), `latest`, `committed`, `offsets`, `checkpoint` (the offsets the query's sink committed; see `skein run`) |
//! | `offsets`              | `partition:offset,...` for `startup = offsets`; partitions not listed start at the earliest |
//! | `max.records.per.pull` | record budget of one pull (default 200000), shared equally by the partitions behind their ends |
//! | `max.bytes.per.pull`   | byte budget of one pull (default 64 MiB), checked between batches of up to 1024 records |
//! | `max.record.bytes`     | larger records are dead letters (default 1 MiB)       |
//! | `pull.timeout.ms`      | time limit of one pull (default 2000)                 |
//! | `dead.letter.topic`    | where undecodable records go                          |
//! | `offsets.log`          | `kafka` (default): a checkpointing query keeps its offsets log between checkpoints in Kafka, in a transaction; `store`: in the checkpoint store every epoch (for brokers without transactions) |
//!
//! Every other option with a dot in its name is a librdkafka property and is
//! passed through (`bootstrap.servers`, `security.protocol`, ...).
//!
//! A checkpointing query's member keeps its offsets log between checkpoints
//! in Kafka, not in the checkpoint store (`log_note.rs`; docs/sources.md).
//!
//! The pull engine is `reader.rs`; records are read in batches
//! ([`super::BatchConsumer`], librdkafka's
//! `rd_kafka_consume_batch_queue`) and decoded into Arrow as they arrive,
//! without being copied first; the fetch defaults of a consumer
//! ([`skein_clients::kafka::FETCH_DEFAULTS`]) keep
//! librdkafka fetching while a backlog is drained.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use skein_engine::dead_letter::DeadLetterSink;
use skein_engine::error::{EngineError, Result as EngineResult};
use skein_engine::payload::SourceOffset;
use skein_engine::source::{
    EpochSpec, MicroBatch, ReplayMode, Source, SourceCapabilities, SourceConfig, SourceFactory,
    TableOptions,
};

use super::config::{KafkaSourceConfig, source_options};
use super::dead_letters::KafkaDeadLetters;
use super::log_note::{MAX_NOTE_BYTES, NoteKeeper};
use super::offsets::format_offsets;
use super::reader::{PartitionReader, latest_offsets};
use crate::error::{ConnectorError, Result};
use skein_formats::decode::RecordDecoder;

pub struct KafkaSource {
    config: Arc<KafkaSourceConfig>,
    decoder: Arc<RecordDecoder>,
    /// Opened on the first pull: planning must not need a broker.
    reader: tokio::sync::Mutex<Option<Arc<PartitionReader>>>,
    /// The member's offsets note (`log_note.rs`), opened on first use.
    note: tokio::sync::Mutex<Option<Arc<NoteKeeper>>>,
}

impl std::fmt::Debug for KafkaSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KafkaSource({})", self.config.topic)
    }
}

impl KafkaSource {
    pub fn new(config: KafkaSourceConfig, schema: SchemaRef) -> Result<Self> {
        let decoder = RecordDecoder::new(schema, config.format.clone(), config.max_record_bytes)?;
        Ok(KafkaSource {
            config: Arc::new(config),
            decoder: Arc::new(decoder),
            reader: tokio::sync::Mutex::new(None),
            note: tokio::sync::Mutex::new(None),
        })
    }

    /// The note kept under `key`, opened (fencing earlier writers) on the
    /// first call.
    async fn note_keeper(&self, key: &str) -> Result<Arc<NoteKeeper>> {
        let mut slot = self.note.lock().await;
        if let Some(k) = slot.as_ref().filter(|k| k.key() == key) {
            return Ok(k.clone());
        }
        let (config, key) = (self.config.clone(), key.to_string());
        let k = tokio::task::spawn_blocking(move || NoteKeeper::open(&config, &key))
            .await
            .map_err(|e| ConnectorError::Task("opening the offsets note", e))??;
        let k = Arc::new(k);
        *slot = Some(k.clone());
        Ok(k)
    }

    async fn reader(&self, spec: EpochSpec) -> Result<Arc<PartitionReader>> {
        let mut slot = self.reader.lock().await;
        if let Some(r) = slot.as_ref() {
            return Ok(r.clone());
        }
        let config = self.config.clone();
        let r = tokio::task::spawn_blocking(move || PartitionReader::open(&config, spec))
            .await
            .map_err(|e| ConnectorError::Task("opening the reader", e))??;
        let r = Arc::new(r);
        *slot = Some(r.clone());
        Ok(r)
    }
}

#[async_trait]
impl Source for KafkaSource {
    fn schema(&self) -> SchemaRef {
        self.decoder.schema().clone()
    }

    fn parallelism(&self) -> usize {
        self.config.parallelism
    }

    fn changelog(&self) -> bool {
        self.decoder.changelog()
    }

    async fn problems(&self) -> Vec<String> {
        RecordDecoder::problems(&self.decoder).await
    }

    async fn pull(&self, spec: EpochSpec) -> EngineResult<MicroBatch> {
        self.pull_to(spec, None).await
    }

    fn replay_mode(&self) -> ReplayMode {
        ReplayMode::Offsets
    }

    async fn position(&self, spec: EpochSpec) -> EngineResult<Vec<SourceOffset>> {
        let reader = self.reader(spec).await.map_err(|e| self.error(e))?;
        Ok(reader.offsets(&self.config.topic))
    }

    async fn latest(&self) -> EngineResult<Vec<SourceOffset>> {
        let config = self.config.clone();
        tokio::task::spawn_blocking(move || latest_offsets(&config))
            .await
            .map_err(|e| self.error(ConnectorError::Task("latest offsets", e)))?
            .map_err(|e| self.error(e))
    }

    fn keeps_notes(&self) -> bool {
        self.config.log_in_kafka
    }

    async fn keep_note(&self, spec: EpochSpec, key: &str, note: &str) -> EngineResult<bool> {
        if !self.config.log_in_kafka || note.len() > MAX_NOTE_BYTES {
            return Ok(false);
        }
        let reader = self.reader(spec).await.map_err(|e| self.error(e))?;
        let topic = self.config.topic.clone();
        let at = self.owned_offsets(&reader.offsets(&topic));
        if at.is_empty() {
            return Ok(false);
        }
        let keeper = self.note_keeper(key).await.map_err(|e| self.error(e))?;
        let note = note.to_string();
        tokio::task::spawn_blocking(move || keeper.keep(&topic, &at, &note))
            .await
            .map_err(|e| self.error(ConnectorError::Task("keeping the offsets note", e)))?
            .map_err(|e| self.error(e))?;
        Ok(true)
    }

    async fn kept_note(&self, spec: EpochSpec, key: &str) -> EngineResult<Option<String>> {
        if !self.config.log_in_kafka {
            return Ok(None);
        }
        let reader = self.reader(spec).await.map_err(|e| self.error(e))?;
        let topic = self.config.topic.clone();
        let partitions: Vec<i32> = self
            .owned_offsets(&reader.offsets(&topic))
            .into_keys()
            .collect();
        if partitions.is_empty() {
            return Ok(None);
        }
        let keeper = self.note_keeper(key).await.map_err(|e| self.error(e))?;
        tokio::task::spawn_blocking(move || keeper.read(&topic, &partitions))
            .await
            .map_err(|e| self.error(ConnectorError::Task("reading the offsets note", e)))?
            .map_err(|e| self.error(e))
    }

    async fn seek(&self, spec: EpochSpec, at: &[SourceOffset]) -> EngineResult<()> {
        let reader = self.reader(spec).await.map_err(|e| self.error(e))?;
        let at = self.owned_offsets(at);
        let topic = self.config.topic.clone();
        tokio::task::spawn_blocking(move || reader.seek(&topic, &at))
            .await
            .map_err(|e| self.error(ConnectorError::Task("seek", e)))?
            .map_err(|e| self.error(e))
    }

    async fn replay(
        &self,
        spec: EpochSpec,
        from: &[SourceOffset],
        to: &[SourceOffset],
    ) -> EngineResult<MicroBatch> {
        self.seek(spec, from).await?;
        self.pull_to(spec, Some(self.owned_offsets(to))).await
    }
}

/// How errors name a Kafka source: by kind and topic.
fn source_name(topic: &str) -> String {
    format!("kafka topic {topic}")
}

impl KafkaSource {
    fn error(&self, e: ConnectorError) -> EngineError {
        e.for_source(source_name(&self.config.topic))
    }

    /// This topic's offsets among `offsets`, per partition.
    fn owned_offsets(&self, offsets: &[SourceOffset]) -> BTreeMap<i32, i64> {
        offsets
            .iter()
            .filter(|o| o.source == self.config.topic)
            .map(|o| (o.partition, o.offset))
            .collect()
    }

    /// A pull: up to the partitions' ends (within the pull's budget), or
    /// exactly up to `targets` (a replay).
    async fn pull_to(
        &self,
        spec: EpochSpec,
        targets: Option<BTreeMap<i32, i64>>,
    ) -> EngineResult<MicroBatch> {
        let reader = self.reader(spec).await.map_err(|e| self.error(e))?;
        let config = self.config.clone();
        let decoder = self.decoder.clone();
        tokio::task::spawn_blocking(move || reader.pull(&config, &decoder, targets.as_ref()))
            .await
            .map_err(|e| self.error(ConnectorError::Task("pull", e)))?
            .map_err(|e| self.error(e))
    }
}

/// Builds [`KafkaSource`]s from `STORED AS KAFKA` tables.
#[derive(Debug, Default)]
pub struct KafkaSourceFactory;

#[async_trait]
impl SourceFactory for KafkaSourceFactory {
    fn options(&self) -> TableOptions {
        source_options()
    }

    fn capabilities(&self) -> SourceCapabilities {
        SourceCapabilities {
            replay: ReplayMode::Offsets,
            live: true,
        }
    }

    /// `'startup' 'checkpoint'`.
    fn resumes_from_sink(&self, config: &SourceConfig) -> bool {
        config.option("startup") == Some("checkpoint")
    }

    fn starting_at(&self, config: &SourceConfig, offsets: &BTreeMap<i32, i64>) -> SourceConfig {
        let mut config = config.clone();
        config.options.insert("startup".into(), "offsets".into());
        config
            .options
            .insert("offsets".into(), format_offsets(offsets));
        config
    }

    fn dead_letters(&self, config: &SourceConfig) -> EngineResult<Option<Arc<dyn DeadLetterSink>>> {
        let kafka = KafkaSourceConfig::from_source_config(config)
            .map_err(|e| e.for_source(source_name(&config.location)))?;
        Ok(kafka.dead_letter_topic.clone().map(|topic| {
            Arc::new(KafkaDeadLetters::new(topic, kafka.client.clone())) as Arc<dyn DeadLetterSink>
        }))
    }

    fn create(&self, config: &SourceConfig, schema: SchemaRef) -> EngineResult<Arc<dyn Source>> {
        let kafka = KafkaSourceConfig::from_source_config(config)
            .map_err(|e| e.for_source(source_name(&config.location)))?;
        let source = KafkaSource::new(kafka, schema)
            .map_err(|e| e.for_source(source_name(&config.location)))?;
        Ok(Arc::new(source))
    }

    async fn partitions(&self, config: &SourceConfig) -> EngineResult<Option<usize>> {
        let name = source_name(&config.location);
        let kafka = KafkaSourceConfig::from_source_config(config)
            .map_err(|e| e.for_source(name.clone()))?;
        let count = tokio::task::spawn_blocking(move || super::reader::partition_count(&kafka))
            .await
            .map_err(|e| {
                ConnectorError::Task("reading the partitions", e).for_source(name.clone())
            })?
            .map_err(|e| e.for_source(name))?;
        Ok(Some(count))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_kafka_table_says_when_its_registry_does_not_answer() {
        use skein_engine::source::{Source, SourceConfig};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let config = SourceConfig {
            kind: "KAFKA".into(),
            location: "t".into(),
            options: [
                ("bootstrap.servers", "127.0.0.1:1"),
                ("format", "avro-confluent"),
                ("schema.registry.url", &format!("http://{addr}")),
            ]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        };
        let schema = Arc::new(datafusion::arrow::datatypes::Schema::new(vec![
            datafusion::arrow::datatypes::Field::new(
                "id",
                datafusion::arrow::datatypes::DataType::Int64,
                true,
            ),
        ]));
        // Planning needs no registry when the table declares its columns.
        let kafka = KafkaSourceConfig::from_source_config(&config).unwrap();
        let source = KafkaSource::new(kafka, schema).unwrap();
        let problems = source.problems().await;
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].contains(&format!("schema registry http://{addr}")),
            "{problems:?}"
        );
    }
}
