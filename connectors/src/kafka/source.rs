//! The Kafka source: `CREATE EXTERNAL TABLE t (...) STORED AS KAFKA LOCATION
//! '<topic>' OPTIONS (...)`.
//!
//! Each source instance owns the partitions `p` with `index(p) % instances ==
//! instance` and assigns them directly (no consumer-group rebalancing, so the
//! split is deterministic). A pull reads its partitions up to the high
//! watermark seen when the pull began, or until a record / byte budget or a
//! time limit is reached, decodes the records into Arrow with the declared
//! schema and reports the next offset of every owned partition. Records that
//! do not decode go to the dead-letter topic, if one is configured, and are
//! always counted.
//!
//! Options (all optional except `bootstrap.servers`):
//!
//! | option                 | meaning                                               |
//! |------------------------|-------------------------------------------------------|
//! | `format`               | `json` (default), `csv`, `raw`, `avro`, `avro-confluent`, `protobuf`, `protobuf-confluent`, `debezium-json`, `debezium-avro-confluent` (docs/formats.md, with their options) |
//! | `parallelism`          | source instances (default 1)                          |
//! | `startup`              | `earliest` (default), `latest`, `committed`, `offsets`, `checkpoint` (the offsets the query's sink committed; see `skein run`) |
//! | `offsets`              | `partition:offset,...` for `startup = offsets`; partitions not listed start at the earliest |
//! | `max.records.per.pull` | record budget of one pull (default 200000)            |
//! | `max.bytes.per.pull`   | byte budget of one pull (default 64 MiB), checked between batches of up to 1024 records |
//! | `max.record.bytes`     | larger records are dead letters (default 1 MiB)       |
//! | `pull.timeout.ms`      | time limit of one pull (default 2000)                 |
//! | `dead.letter.topic`    | where undecodable records go                          |
//!
//! Every other option with a dot in its name is a librdkafka property and is
//! passed through (`bootstrap.servers`, `security.protocol`, ...).
//!
//! Records are read in batches ([`BatchConsumer`], librdkafka's
//! `rd_kafka_consume_batch_queue`) and decoded into Arrow as they arrive,
//! without being copied first; the fetch defaults in [`FETCH_DEFAULTS`] keep
//! librdkafka fetching while a backlog is drained.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use rdkafka::bindings as rd;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;
use skein_engine::error::{EngineError, Result as EngineResult};
use skein_engine::payload::SourceOffset;
use skein_engine::source::{
    DeadLetter as LateLetter, DeadLetterSink, EpochSpec, MicroBatch, PartitionProgress, ReplayMode,
    Source, SourceConfig, SourceFactory, TableOptions,
};
use tracing::{debug, warn};

use super::options::{SOURCE_OPTIONS, client_properties};
use crate::decode::{Format, LetterRecord, RecordDecoder};
use crate::error::{ConnectorError, Result};
use crate::options;

/// Records sent to a dead-letter topic (or dropped for want of one) by every
/// Kafka source of this process.
pub static DEAD_LETTERS: AtomicU64 = AtomicU64::new(0);

const METADATA_TIMEOUT: Duration = Duration::from_secs(10);
/// librdkafka fetch settings used unless the table's options set them.
///
/// librdkafka stops fetching a partition once its local queue holds
/// `queued.min.messages` records (default 100 000) or
/// `queued.max.messages.kbytes`, and then waits `fetch.queue.backoff.ms`
/// (default 1000) before it looks again. A consumer that drains a backlog
/// faster than that empties the queue well within the second and then
/// idles: with 16 MiB fetches per partition (one fetch overshoots 100 000
/// records) a drain of YSB events fell to ~0.2 M records/s. A 10 ms backoff
/// and a larger record threshold (the 64 MiB byte limit still bounds memory)
/// keep the fetches flowing.
///
/// `fetch.wait.max.ms` (default 500) is how long the broker holds a fetch
/// that finds nothing new; requests for the high watermark queue behind it
/// on the same connection, so a pull at the end of the topic waited up to
/// that long per partition. 100 ms keeps idle fetches cheap enough.
pub const FETCH_DEFAULTS: &[(&str, &str)] = &[
    ("fetch.queue.backoff.ms", "10"),
    ("queued.min.messages", "1000000"),
    ("fetch.wait.max.ms", "100"),
];

/// Records taken from librdkafka's queue per call.
const BATCH: usize = 1024;

/// One item of a consumer's queue.
pub enum Fetched<'a> {
    Record {
        partition: i32,
        offset: i64,
        payload: &'a [u8],
    },
    /// A consumer error (broker down, partition error, ...).
    Error(RDKafkaErrorCode),
}

/// A [`BaseConsumer`] read through librdkafka's batch API
/// (`rd_kafka_consume_batch_queue`) rather than one `poll` per record: one
/// queue lock, clock read and FFI round trip per batch instead of per
/// record, which more than doubles what one thread drains (≈0.55 M to
/// ≈1.5 M YSB records/s on the 2-core development VM).
///
/// Only for consumers with assigned partitions (no group rebalancing, no
/// offset commits): those would come back through this queue as events the
/// batch API does not serve. librdkafka's log lines go to its own log
/// callback (stderr) instead of `tracing` while records are read this way.
pub struct BatchConsumer {
    /// A reference to the consumer's queue, released before the consumer.
    queue: *mut rd::rd_kafka_queue_t,
    consumer: BaseConsumer,
}

// SAFETY: librdkafka queues are thread-safe; the pointer is only used
// through librdkafka's API and released once, in `drop`.
unsafe impl Send for BatchConsumer {}
unsafe impl Sync for BatchConsumer {}

impl BatchConsumer {
    pub fn new(consumer: BaseConsumer) -> Self {
        // SAFETY: the client pointer is valid while `consumer` lives, which
        // is longer than the queue reference (see `drop`).
        let queue = unsafe { rd::rd_kafka_queue_get_consumer(consumer.client().native_ptr()) };
        assert!(!queue.is_null(), "a BaseConsumer has a consumer queue");
        BatchConsumer { queue, consumer }
    }

    pub fn consumer(&self) -> &BaseConsumer {
        &self.consumer
    }

    /// The low and high watermarks of a partition as the last fetch
    /// response reported them (no request to the broker), if known.
    pub fn cached_watermarks(&self, topic: &str, partition: i32) -> Option<(i64, i64)> {
        let topic = std::ffi::CString::new(topic).ok()?;
        let (mut low, mut high) = (-1i64, -1i64);
        // SAFETY: valid client and NUL-terminated topic; librdkafka writes
        // the two offsets.
        let err = unsafe {
            rd::rd_kafka_get_watermark_offsets(
                self.consumer.client().native_ptr(),
                topic.as_ptr(),
                partition,
                &mut low,
                &mut high,
            )
        };
        (err == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR && low >= 0 && high >= 0)
            .then_some((low, high))
    }

    /// Hand up to `max` queued items to `f`: waits up to `wait` for the
    /// first one, then takes only what is already queued. Returns how many
    /// items `f` saw.
    pub fn read(&self, wait: Duration, max: usize, mut f: impl FnMut(Fetched<'_>)) -> usize {
        let mut slots: [*mut rd::rd_kafka_message_t; BATCH] = [std::ptr::null_mut(); BATCH];
        let max = max.clamp(1, BATCH);
        // The batch call waits until its batch is full or the time is up, so
        // ask for one record with a wait, then for the rest without.
        let wait_ms = wait.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: `slots` has room for the requested count; the queue is valid.
        let mut n =
            unsafe { rd::rd_kafka_consume_batch_queue(self.queue, 0, slots.as_mut_ptr(), max) };
        if n == 0 && wait_ms > 0 {
            n = unsafe {
                rd::rd_kafka_consume_batch_queue(self.queue, wait_ms, slots.as_mut_ptr(), 1)
            };
            if n == 1 && max > 1 {
                let more = unsafe {
                    rd::rd_kafka_consume_batch_queue(
                        self.queue,
                        0,
                        slots.as_mut_ptr().add(1),
                        max - 1,
                    )
                };
                n += more.max(0);
            }
        }
        let n = n.max(0) as usize;
        for &m in &slots[..n] {
            // SAFETY: librdkafka returned `n` valid messages; each is read,
            // then destroyed exactly once, and its payload is not used after.
            unsafe {
                let msg = &*m;
                if msg.err == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                    let payload = if msg.payload.is_null() {
                        &[][..]
                    } else {
                        std::slice::from_raw_parts(msg.payload as *const u8, msg.len)
                    };
                    f(Fetched::Record {
                        partition: msg.partition,
                        offset: msg.offset,
                        payload,
                    });
                } else {
                    f(Fetched::Error(msg.err.into()));
                }
                rd::rd_kafka_message_destroy(m);
            }
        }
        n
    }
}

impl Drop for BatchConsumer {
    fn drop(&mut self) {
        // SAFETY: the reference taken in `new`, released once, before the
        // consumer itself is dropped (fields drop after this).
        unsafe { rd::rd_kafka_queue_destroy(self.queue) };
    }
}
/// How long a pull waits for an unreachable broker before it fails.
const BROKER_WAIT: Duration = Duration::from_secs(120);

/// Where a partition starts when the source first reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Startup {
    Earliest,
    Latest,
    /// The consumer group's committed offsets (`group.id` must be set).
    Committed,
    /// Explicit next offsets per partition; others start at the earliest.
    Offsets(BTreeMap<i32, i64>),
    /// The offsets the query's exactly-once sink committed under its
    /// `checkpoint`. The runner (`skein run`) reads them from the sink and
    /// turns this into `Offsets` before the query starts.
    Checkpoint,
}

#[derive(Debug, Clone)]
pub struct KafkaSourceConfig {
    pub topic: String,
    pub format: Format,
    pub parallelism: usize,
    pub startup: Startup,
    pub max_records_per_pull: usize,
    pub max_bytes_per_pull: usize,
    pub max_record_bytes: usize,
    pub pull_timeout: Duration,
    pub dead_letter_topic: Option<String>,
    /// librdkafka properties.
    pub client: BTreeMap<String, String>,
}

impl KafkaSourceConfig {
    pub fn from_source_config(config: &SourceConfig) -> Result<Self> {
        let number = |k: &str, default: usize| options::number(config, k, default);
        options::require_location(config, "topic")?;
        let client = client_properties(&config.options);
        if !client.contains_key("bootstrap.servers") {
            return Err(ConnectorError::Config(
                "option 'bootstrap.servers' is required".into(),
            ));
        }
        let startup = match config.option("startup").unwrap_or("earliest") {
            "earliest" => Startup::Earliest,
            "latest" => Startup::Latest,
            "committed" => Startup::Committed,
            "offsets" => Startup::Offsets(parse_offsets(config.option("offsets").unwrap_or(""))?),
            "checkpoint" => Startup::Checkpoint,
            other => return Err(options::bad("startup", other)),
        };
        let parallelism = options::parallelism(config)?;
        Ok(KafkaSourceConfig {
            topic: config.location.clone(),
            format: Format::from_options(&config.options, &config.location)?,
            parallelism,
            startup,
            max_records_per_pull: number("max.records.per.pull", 200_000)?.max(1),
            max_bytes_per_pull: number("max.bytes.per.pull", 64 << 20)?.max(1),
            max_record_bytes: number("max.record.bytes", 1 << 20)?,
            pull_timeout: Duration::from_millis(number("pull.timeout.ms", 2000)? as u64),
            dead_letter_topic: config
                .option("dead.letter.topic")
                .filter(|t| !t.is_empty())
                .map(str::to_string),
            client,
        })
    }

    fn client_config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        for (k, v) in &self.client {
            c.set(k, v);
        }
        c
    }
}

/// `"0:120,1:98"` -> {0: 120, 1: 98}.
pub fn parse_offsets(s: &str) -> Result<BTreeMap<i32, i64>> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (part, off) = p.split_once(':').ok_or_else(|| {
                ConnectorError::Config(format!("offsets: {p:?} is not partition:offset"))
            })?;
            let part = part
                .trim()
                .parse()
                .map_err(|_| ConnectorError::Config(format!("offsets: bad partition in {p:?}")))?;
            let off = off
                .trim()
                .parse()
                .map_err(|_| ConnectorError::Config(format!("offsets: bad offset in {p:?}")))?;
            Ok((part, off))
        })
        .collect()
}

/// `{0: 120, 1: 98}` -> `"0:120,1:98"`, the form of the `offsets` option.
pub fn format_offsets(offsets: &BTreeMap<i32, i64>) -> String {
    offsets
        .iter()
        .map(|(p, o)| format!("{p}:{o}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// What goes to the dead-letter topic for one undecodable record.
#[derive(Debug, Serialize)]
pub struct DeadLetter<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub reason: &'a str,
    /// The record, as text (invalid UTF-8 replaced); only its first
    /// [`crate::decode::DEAD_LETTER_PREFIX_BYTES`] when `truncated`.
    pub payload: String,
    /// The record's size in bytes.
    pub size: usize,
    pub truncated: bool,
}

impl<'a> DeadLetter<'a> {
    pub fn new(
        topic: &'a str,
        partition: i32,
        offset: i64,
        reason: &'a str,
        record: &[u8],
    ) -> Self {
        let LetterRecord {
            record,
            size,
            truncated,
        } = LetterRecord::new(record);
        DeadLetter {
            topic,
            partition,
            offset,
            reason,
            payload: record,
            size,
            truncated,
        }
    }
}

pub struct KafkaSource {
    config: Arc<KafkaSourceConfig>,
    decoder: Arc<RecordDecoder>,
    /// Opened on the first pull: planning must not need a broker.
    reader: tokio::sync::Mutex<Option<Arc<PartitionReader>>>,
    dead_letters: Arc<AtomicU64>,
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
            dead_letters: Arc::new(AtomicU64::new(0)),
        })
    }

    /// Undecodable records this source has seen.
    pub fn dead_letters(&self) -> u64 {
        self.dead_letters.load(Ordering::Relaxed)
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
        let counter = self.dead_letters.clone();
        tokio::task::spawn_blocking(move || {
            reader.pull(&config, &decoder, &counter, targets.as_ref())
        })
        .await
        .map_err(|e| self.error(ConnectorError::Task("pull", e)))?
        .map_err(|e| self.error(e))
    }
}

/// The consumer of one source instance and where it stands.
struct PartitionReader {
    consumer: BatchConsumer,
    /// Next offset to read, per owned partition.
    positions: Mutex<BTreeMap<i32, i64>>,
    /// Each owned partition's end offset when the reader was opened: what
    /// `--until-drained` reads up to.
    ends_at_open: BTreeMap<i32, i64>,
    /// Polled by `flush` when dead letters are sent (no thread of its own).
    dead_letter_producer: Option<BaseProducer>,
}

/// An undecodable record, kept until it is sent to the dead-letter topic.
struct Undecodable {
    partition: i32,
    offset: i64,
    reason: String,
    payload: Vec<u8>,
}

/// The high watermark of every partition of the topic.
fn latest_offsets(config: &KafkaSourceConfig) -> Result<Vec<SourceOffset>> {
    let consumer: BaseConsumer = config.client_config().create()?;
    let metadata = consumer.fetch_metadata(Some(&config.topic), METADATA_TIMEOUT)?;
    let mut out = vec![];
    for topic in metadata
        .topics()
        .iter()
        .filter(|t| t.name() == config.topic)
    {
        for p in topic.partitions() {
            let (_, high) = consumer.fetch_watermarks(&config.topic, p.id(), METADATA_TIMEOUT)?;
            out.push(SourceOffset {
                source: config.topic.clone(),
                partition: p.id(),
                offset: high,
                position: None,
            });
        }
    }
    out.sort_by_key(|o| o.partition);
    Ok(out)
}

impl PartitionReader {
    fn open(config: &KafkaSourceConfig, spec: EpochSpec) -> Result<Self> {
        let mut client = config.client_config();
        // Larger fetches than librdkafka's defaults: a pull drains a backlog.
        for (key, value) in FETCH_DEFAULTS {
            if !config.client.contains_key(*key) {
                client.set(*key, *value);
            }
        }
        client.set("enable.auto.commit", "false");
        client.set("enable.auto.offset.store", "false");
        if !config.client.contains_key("group.id") {
            client.set("group.id", format!("skein-{}", config.topic));
        }
        let consumer: BaseConsumer = client.create()?;
        let metadata = consumer.fetch_metadata(Some(&config.topic), METADATA_TIMEOUT)?;
        let topic = metadata
            .topics()
            .iter()
            .find(|t| t.name() == config.topic)
            .ok_or_else(|| ConnectorError::Other(format!("topic {} not found", config.topic)))?;
        if let Some(e) = topic.error() {
            return Err(ConnectorError::Other(format!(
                "topic {}: {e:?}",
                config.topic
            )));
        }
        let mut all: Vec<i32> = topic.partitions().iter().map(|p| p.id()).collect();
        all.sort_unstable();
        let instances = spec.instances.max(1);
        let owned: Vec<i32> = all
            .iter()
            .enumerate()
            .filter(|(i, _)| i % instances == spec.instance)
            .map(|(_, p)| *p)
            .collect();
        let committed = if config.startup == Startup::Committed {
            let mut tpl = TopicPartitionList::new();
            for p in &owned {
                tpl.add_partition(&config.topic, *p);
            }
            Some(consumer.committed_offsets(tpl, METADATA_TIMEOUT)?)
        } else {
            None
        };
        if config.startup == Startup::Checkpoint {
            return Err(ConnectorError::Config(format!(
                "topic {}: 'startup' 'checkpoint' was not resolved to the offsets the sink \
                 committed; run the query with `skein run`, which reads them",
                config.topic
            )));
        }
        let mut positions = BTreeMap::new();
        let mut ends_at_open = BTreeMap::new();
        let mut assignment = TopicPartitionList::new();
        for &p in &owned {
            let (low, high) = consumer.fetch_watermarks(&config.topic, p, METADATA_TIMEOUT)?;
            ends_at_open.insert(p, high);
            let start = match &config.startup {
                Startup::Earliest => low,
                Startup::Latest => high,
                Startup::Offsets(map) => map.get(&p).copied().unwrap_or(low),
                // Refused above, before any partition is assigned.
                Startup::Checkpoint => low,
                Startup::Committed => committed
                    .as_ref()
                    .and_then(|c| c.find_partition(&config.topic, p))
                    .and_then(|e| match e.offset() {
                        Offset::Offset(n) => Some(n),
                        _ => None,
                    })
                    .unwrap_or(low),
            };
            positions.insert(p, start);
            assignment.add_partition_offset(&config.topic, p, Offset::Offset(start))?;
        }
        consumer.assign(&assignment)?;
        debug!(topic = %config.topic, instance = spec.instance, ?positions, "kafka source assigned");
        let dead_letter_producer = match &config.dead_letter_topic {
            Some(_) => Some(dead_letter_producer(&config.client["bootstrap.servers"])?),
            None => None,
        };
        Ok(PartitionReader {
            consumer: BatchConsumer::new(consumer),
            positions: Mutex::new(positions),
            ends_at_open,
            dead_letter_producer,
        })
    }

    /// Where the reader stands, as source offsets.
    fn offsets(&self, topic: &str) -> Vec<SourceOffset> {
        self.positions
            .lock()
            .expect("positions")
            .iter()
            .map(|(p, o)| SourceOffset {
                source: topic.to_string(),
                partition: *p,
                offset: *o,
                position: None,
            })
            .collect()
    }

    /// Stand at `at` for the partitions it names (a restart from the
    /// offsets log); the others stay where they are.
    fn seek(&self, topic: &str, at: &BTreeMap<i32, i64>) -> Result<()> {
        let mut positions = self.positions.lock().expect("positions");
        if at.iter().all(|(p, o)| positions.get(p) == Some(o)) {
            return Ok(());
        }
        let mut assignment = TopicPartitionList::new();
        for (p, pos) in positions.iter_mut() {
            if let Some(o) = at.get(p) {
                *pos = *o;
            }
            assignment.add_partition_offset(topic, *p, Offset::Offset(*pos))?;
        }
        self.consumer.consumer().assign(&assignment)?;
        debug!(%topic, ?positions, "kafka source moved to the checkpoint's offsets");
        Ok(())
    }

    fn pull(
        &self,
        config: &KafkaSourceConfig,
        decoder: &RecordDecoder,
        dead_letters: &AtomicU64,
        targets: Option<&BTreeMap<i32, i64>>,
    ) -> Result<MicroBatch> {
        let mut positions = self.positions.lock().expect("positions");
        let consumer = self.consumer.consumer();
        // Read up to where each partition ended when the pull began, so that
        // a pull ends even while producers keep writing.
        // While the broker is away, wait for it (up to BROKER_WAIT): an
        // empty pull would otherwise look like a drained topic.
        // The high watermark of the last fetch response is used when it
        // shows records to read (it never exceeds the true end); otherwise
        // the broker is asked, which is slower: the request waits behind any
        // fetch the broker is holding for `fetch.wait.max.ms`.
        // Per owned partition: (partition, next offset, target).
        let started = Instant::now();
        let mut parts: Vec<(i32, i64, i64)> = Vec::with_capacity(positions.len());
        let waiting_since = Instant::now();
        for (&p, &pos) in positions.iter() {
            if let Some(targets) = targets {
                // A replay reads exactly what the logged pull read.
                parts.push((p, pos, targets.get(&p).copied().unwrap_or(pos)));
                continue;
            }
            if let Some((_, high)) = self.consumer.cached_watermarks(&config.topic, p)
                && high > pos
            {
                parts.push((p, pos, high));
                continue;
            }
            loop {
                match consumer.fetch_watermarks(&config.topic, p, METADATA_TIMEOUT) {
                    Ok((_, high)) => {
                        parts.push((p, pos, high));
                        break;
                    }
                    Err(e) if waiting_since.elapsed() < BROKER_WAIT => {
                        warn!(topic = %config.topic, partition = p, "high watermark unknown, retrying: {e}");
                        std::thread::sleep(Duration::from_millis(500));
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        let mut lagging = parts.iter().filter(|(_, pos, high)| pos < high).count();
        // One builder per partition, so event time is tracked per partition.
        let mut builders: Vec<_> = parts
            .iter()
            .map(|(_, pos, high)| {
                decoder.builder(((high - pos).max(0) as usize).min(config.max_records_per_pull))
            })
            .collect();
        // The offset of each record pushed, per partition, where the
        // decoder may reject a record only when it builds the batch (Avro).
        let late = decoder.rejects_late();
        let mut pushed: Vec<Vec<i64>> = vec![vec![]; parts.len()];
        let targets_known = started.elapsed();
        let mut undecodable: Vec<Undecodable> = Vec::new();
        let (mut records, mut bytes) = (0usize, 0usize);
        // A replay has no budget: it must read all it read before.
        let (max_records, max_bytes, deadline) = match targets {
            Some(_) => (usize::MAX, usize::MAX, Instant::now() + BROKER_WAIT),
            None => (
                config.max_records_per_pull,
                config.max_bytes_per_pull,
                Instant::now() + config.pull_timeout,
            ),
        };
        // Records are decoded straight from librdkafka's buffers, a batch at
        // a time; the byte budget is checked between batches.
        while lagging > 0 && records < max_records && bytes < max_bytes {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            let wait = (deadline - now).min(Duration::from_millis(100));
            let budget = (max_records - records).min(config.max_records_per_pull);
            let seen = self.consumer.read(wait, budget, |fetched| match fetched {
                Fetched::Error(e) => warn!(topic = %config.topic, "kafka consumer: {e}"),
                Fetched::Record {
                    partition,
                    offset,
                    payload,
                } => {
                    let Some(i) = parts.iter().position(|(p, _, _)| *p == partition) else {
                        return;
                    };
                    let part = &mut parts[i];
                    if offset < part.1 {
                        return; // already read (a refetch after a reconnect)
                    }
                    if targets.is_some() && offset >= part.2 {
                        return; // past what the replayed pull read
                    }
                    let was_behind = part.1 < part.2;
                    part.1 = offset + 1;
                    if was_behind && part.1 >= part.2 {
                        lagging -= 1;
                    }
                    records += 1;
                    bytes += payload.len();
                    if late {
                        pushed[i].push(offset);
                    }
                    if let Some(reason) = builders[i].push(payload) {
                        undecodable.push(Undecodable {
                            partition,
                            offset,
                            reason: reason.to_string(),
                            payload: payload.to_vec(),
                        });
                    }
                }
            });
            if seen == 0 {
                lagging = self.step_over_markers(config, &mut parts);
            }
        }
        for (p, pos, _) in &parts {
            positions.insert(*p, *pos);
        }
        if targets.is_some() {
            if let Some((p, pos, target)) = parts.iter().find(|(_, pos, target)| pos < target) {
                return Err(ConnectorError::Other(format!(
                    "replaying an epoch from the checkpoint: partition {p} of {} gave offsets \
                     up to {pos} only, not {target} (deleted by retention?)",
                    config.topic
                )));
            }
            // Records past the targets were taken from librdkafka's queue
            // and skipped: fetch them again from where the replay ends.
            let mut assignment = TopicPartitionList::new();
            for (p, pos) in positions.iter() {
                assignment.add_partition_offset(&config.topic, *p, Offset::Offset(*pos))?;
            }
            consumer.assign(&assignment)?;
        }
        let mut batches: Vec<RecordBatch> = vec![];
        let mut partitions = Vec::with_capacity(parts.len());
        for (((p, pos, high), builder), offsets) in parts.iter().zip(builders).zip(&pushed) {
            let (batch, rejected) = builder.finish()?;
            for r in rejected {
                if let (Some(payload), Some(&offset)) = (r.record, offsets.get(r.index)) {
                    undecodable.push(Undecodable {
                        partition: *p,
                        offset,
                        reason: r.reason,
                        payload,
                    });
                }
            }
            let mut progress = PartitionProgress {
                partition: p.to_string(),
                lag: Some((high - pos).max(0) as u64),
                caught_up: pos >= high,
                drained: self.ends_at_open.get(p).is_none_or(|end| pos >= end),
                ..Default::default()
            };
            if batch.num_rows() > 0 {
                progress.batches.push(batches.len());
                batches.push(batch);
            }
            partitions.push(progress);
        }
        debug!(
            topic = %config.topic,
            records,
            bytes,
            rejected = undecodable.len(),
            watermarks_ms = targets_known.as_millis() as u64,
            pull_ms = started.elapsed().as_millis() as u64,
            "kafka pull"
        );
        if !undecodable.is_empty() {
            dead_letters.fetch_add(undecodable.len() as u64, Ordering::Relaxed);
            DEAD_LETTERS.fetch_add(undecodable.len() as u64, Ordering::Relaxed);
            skein_engine::metrics::dead_letters(&config.topic, undecodable.len() as u64);
            self.send_dead_letters(config, &undecodable)?;
        }
        let offsets = positions
            .iter()
            .map(|(p, o)| SourceOffset {
                source: config.topic.clone(),
                partition: *p,
                offset: *o,
                position: None,
            })
            .collect();
        Ok(MicroBatch {
            batches,
            offsets,
            partitions,
            dead_letters: undecodable.len() as u64,
            dead_letter_reason: undecodable.last().map(|u| {
                format!(
                    "partition {} offset {}: {}",
                    u.partition, u.offset, u.reason
                )
            }),
            ..Default::default()
        })
    }

    /// A partition written by a transactional producer ends in a commit
    /// marker, a record the consumer never hands out: its position cannot
    /// reach the end offset by reading. librdkafka's position does step
    /// over markers, so a partition that gave nothing takes its position
    /// from there. Returns how many partitions still lag.
    fn step_over_markers(
        &self,
        config: &KafkaSourceConfig,
        parts: &mut [(i32, i64, i64)],
    ) -> usize {
        if let Ok(tpl) = self.consumer.consumer().position() {
            for part in parts.iter_mut().filter(|(_, pos, high)| pos < high) {
                if let Some(Offset::Offset(n)) = tpl
                    .find_partition(&config.topic, part.0)
                    .map(|e| e.offset())
                    && n > part.1
                {
                    part.1 = n.min(part.2);
                }
            }
        }
        parts.iter().filter(|(_, pos, high)| pos < high).count()
    }

    /// Publish the rejected records and wait until the broker has them: the
    /// offsets that pass them must not be committed before.
    fn send_dead_letters(
        &self,
        config: &KafkaSourceConfig,
        rejected: &[Undecodable],
    ) -> Result<()> {
        let (Some(producer), Some(dlt)) = (&self.dead_letter_producer, &config.dead_letter_topic)
        else {
            for r in rejected {
                warn!(topic = %config.topic, partition = r.partition, offset = r.offset, reason = %r.reason, "undecodable record dropped (no dead.letter.topic)");
            }
            return Ok(());
        };
        publish_letters(
            producer,
            dlt,
            rejected.iter().map(|r| {
                let (partition, offset) = (r.partition, r.offset);
                let letter =
                    DeadLetter::new(&config.topic, partition, offset, &r.reason, &r.payload);
                let value = serde_json::to_vec(&letter).expect("dead letter serializes");
                (format!("{}/{partition}/{offset}", config.topic), value)
            }),
        )
    }
}

/// The producer of a dead-letter topic: idempotent, so a retried send is
/// not written twice.
fn dead_letter_producer(brokers: &str) -> Result<BaseProducer> {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers);
    c.set("enable.idempotence", "true");
    Ok(c.create()?)
}

/// Send keyed letters to `topic` and wait until the broker has them all:
/// the offsets (or epoch) that pass them must not be committed before.
fn publish_letters(
    producer: &BaseProducer,
    topic: &str,
    letters: impl IntoIterator<Item = (String, Vec<u8>)>,
) -> Result<()> {
    for (key, value) in letters {
        let mut record = BaseRecord::to(topic).key(&key).payload(&value);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                // Queue full: let deliveries drain, then retry.
                Err((e, back)) if e.rdkafka_error_code() == Some(RDKafkaErrorCode::QueueFull) => {
                    producer.poll(Duration::from_millis(10));
                    record = back;
                }
                Err((e, _)) => return Err(e.into()),
            }
        }
    }
    producer.flush(Duration::from_secs(30))?;
    Ok(())
}

/// A Kafka table's dead-letter topic as the destination of rows a later
/// stage rejects (late rows). The producer is opened on the first letter.
pub struct KafkaDeadLetters {
    topic: String,
    brokers: String,
    producer: std::sync::OnceLock<BaseProducer>,
}

impl std::fmt::Debug for KafkaDeadLetters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KafkaDeadLetters({})", self.topic)
    }
}

impl KafkaDeadLetters {
    fn producer(&self) -> Result<&BaseProducer> {
        if let Some(p) = self.producer.get() {
            return Ok(p);
        }
        let p = dead_letter_producer(&self.brokers)?;
        Ok(self.producer.get_or_init(|| p))
    }

    fn send_blocking(&self, letters: &[LateLetter]) -> Result<()> {
        let letters = letters.iter().map(|l| {
            let mut value = serde_json::json!({
                "table": l.table,
                "reason": l.reason,
                "key": l.key,
                "window_start_ms": l.window.map(|w| w.0),
                "window_end_ms": l.window.map(|w| w.1),
                "row": serde_json::from_str::<serde_json::Value>(&l.row)
                    .unwrap_or_else(|_| serde_json::Value::String(l.row.clone())),
            });
            if !l.offsets.is_empty() {
                // As the Redis sink stores them: `<topic>:<partition>` -> next offset.
                let to: serde_json::Map<String, serde_json::Value> = l
                    .offsets
                    .iter()
                    .map(|o| (format!("{}:{}", o.source, o.partition), o.offset.into()))
                    .collect();
                value["offsets_to"] = to.into();
            }
            let value = value.to_string();
            (l.key.clone(), value.into_bytes())
        });
        publish_letters(self.producer()?, &self.topic, letters)
    }
}

#[async_trait]
impl DeadLetterSink for KafkaDeadLetters {
    async fn send(&self, letters: &[LateLetter]) -> EngineResult<()> {
        tokio::task::block_in_place(|| self.send_blocking(letters))
            .map_err(|e| e.for_source(format!("kafka dead-letter topic {}", self.topic)))
    }
}

/// Builds [`KafkaSource`]s from `STORED AS KAFKA` tables.
#[derive(Debug, Default)]
pub struct KafkaSourceFactory;

impl SourceFactory for KafkaSourceFactory {
    fn options(&self) -> TableOptions {
        TableOptions {
            names: SOURCE_OPTIONS,
            dotted_passthrough: Some("librdkafka property"),
        }
    }

    fn dead_letters(&self, config: &SourceConfig) -> EngineResult<Option<Arc<dyn DeadLetterSink>>> {
        let kafka = KafkaSourceConfig::from_source_config(config)
            .map_err(|e| e.for_source(source_name(&config.location)))?;
        Ok(kafka.dead_letter_topic.clone().map(|topic| {
            Arc::new(KafkaDeadLetters {
                topic,
                brokers: kafka.client["bootstrap.servers"].clone(),
                producer: Default::default(),
            }) as Arc<dyn DeadLetterSink>
        }))
    }

    fn create(&self, config: &SourceConfig, schema: SchemaRef) -> EngineResult<Arc<dyn Source>> {
        let kafka = KafkaSourceConfig::from_source_config(config)
            .map_err(|e| e.for_source(source_name(&config.location)))?;
        let source = KafkaSource::new(kafka, schema)
            .map_err(|e| e.for_source(source_name(&config.location)))?;
        Ok(Arc::new(source))
    }
}
