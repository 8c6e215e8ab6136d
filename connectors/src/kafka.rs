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
//! | `format`               | `json` (default), `csv` or `raw`                      |
//! | `parallelism`          | source instances (default 1)                          |
//! | `startup`              | `earliest` (default), `latest`, `committed`, `offsets`|
//! | `offsets`              | `partition:offset,...` for `startup = offsets`; partitions not listed start at the earliest |
//! | `max.records.per.pull` | record budget of one pull (default 200000)            |
//! | `max.bytes.per.pull`   | byte budget of one pull (default 64 MiB)              |
//! | `max.record.bytes`     | larger records are dead letters (default 1 MiB)       |
//! | `pull.timeout.ms`      | time limit of one pull (default 2000)                 |
//! | `dead.letter.topic`    | where undecodable records go                          |
//!
//! Every other option with a dot in its name is a librdkafka property and is
//! passed through (`bootstrap.servers`, `security.protocol`, ...).

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Message, Offset, TopicPartitionList};
use serde::Serialize;
use skein_engine::error::{EngineError, Result as EngineResult};
use skein_engine::payload::SourceOffset;
use skein_engine::source::{EpochSpec, MicroBatch, Source, SourceConfig, SourceFactory};
use tracing::{debug, warn};

use crate::decode::{Format, RecordDecoder};
use crate::error::{ConnectorError, Result};

/// The `STORED AS` name of this source.
pub const KIND: &str = "KAFKA";

/// Records sent to a dead-letter topic (or dropped for want of one) by every
/// Kafka source of this process.
pub static DEAD_LETTERS: AtomicU64 = AtomicU64::new(0);

/// Options that are ours (or the engine's), not librdkafka's.
const OWN_OPTIONS: &[&str] = &[
    "format",
    "parallelism",
    "startup",
    "offsets",
    "max.records.per.pull",
    "max.bytes.per.pull",
    "max.record.bytes",
    "pull.timeout.ms",
    "dead.letter.topic",
    "event_time",
    "lateness_ms",
];

const METADATA_TIMEOUT: Duration = Duration::from_secs(10);
/// librdkafka fetch settings used unless the table's options set them.
pub const FETCH_DEFAULTS: &[(&str, &str)] = &[
    ("max.partition.fetch.bytes", "16777216"),
    ("fetch.max.bytes", "67108864"),
    ("queued.max.messages.kbytes", "131072"),
];
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
        let bad = |k: &str, v: &str| ConnectorError::Config(format!("option {k} = {v:?}"));
        let number = |k: &str, default: usize| -> Result<usize> {
            config
                .option(k)
                .map(|v| v.parse::<usize>().map_err(|_| bad(k, v)))
                .unwrap_or(Ok(default))
        };
        if config.location.is_empty() {
            return Err(ConnectorError::Config(
                "LOCATION must name the topic".into(),
            ));
        }
        let client: BTreeMap<String, String> = config
            .options
            .iter()
            .filter(|(k, _)| k.contains('.') && !OWN_OPTIONS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
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
            other => return Err(bad("startup", other)),
        };
        let parallelism = number("parallelism", 1)?;
        if parallelism == 0 {
            return Err(bad("parallelism", "0"));
        }
        Ok(KafkaSourceConfig {
            topic: config.location.clone(),
            format: Format::from_str(config.option("format").unwrap_or("json"))?,
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
    /// The record, as text (invalid UTF-8 replaced).
    pub payload: String,
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
        let decoder = RecordDecoder::new(schema, config.format, config.max_record_bytes)?;
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
            .map_err(|e| ConnectorError::Other(format!("opening the reader: {e}")))??;
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

    async fn pull(&self, spec: EpochSpec) -> EngineResult<MicroBatch> {
        let source_err = |e: ConnectorError| EngineError::Source {
            source_name: self.config.topic.clone(),
            reason: e.to_string(),
        };
        let reader = self.reader(spec).await.map_err(source_err)?;
        let config = self.config.clone();
        let decoder = self.decoder.clone();
        let counter = self.dead_letters.clone();
        tokio::task::spawn_blocking(move || reader.pull(&config, &decoder, &counter))
            .await
            .map_err(|e| source_err(ConnectorError::Other(format!("pull task: {e}"))))?
            .map_err(source_err)
    }
}

/// The consumer of one source instance and where it stands.
struct PartitionReader {
    consumer: BaseConsumer,
    /// Next offset to read, per owned partition.
    positions: Mutex<BTreeMap<i32, i64>>,
    dead_letter_producer: Option<ThreadedProducer<DefaultProducerContext>>,
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
        let mut positions = BTreeMap::new();
        let mut assignment = TopicPartitionList::new();
        for &p in &owned {
            let (low, high) = consumer.fetch_watermarks(&config.topic, p, METADATA_TIMEOUT)?;
            let start = match &config.startup {
                Startup::Earliest => low,
                Startup::Latest => high,
                Startup::Offsets(map) => map.get(&p).copied().unwrap_or(low),
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
            Some(_) => {
                let mut c = ClientConfig::new();
                c.set("bootstrap.servers", &config.client["bootstrap.servers"]);
                c.set("enable.idempotence", "true");
                Some(c.create()?)
            }
            None => None,
        };
        Ok(PartitionReader {
            consumer,
            positions: Mutex::new(positions),
            dead_letter_producer,
        })
    }

    fn pull(
        &self,
        config: &KafkaSourceConfig,
        decoder: &RecordDecoder,
        dead_letters: &AtomicU64,
    ) -> Result<MicroBatch> {
        let mut positions = self.positions.lock().expect("positions");
        // Read up to where each partition ended when the pull began, so that
        // a pull ends even while producers keep writing.
        // While the broker is away, wait for it (up to BROKER_WAIT): an
        // empty pull would otherwise look like a drained topic.
        let mut targets: BTreeMap<i32, i64> = BTreeMap::new();
        let waiting_since = Instant::now();
        for &p in positions.keys() {
            loop {
                match self
                    .consumer
                    .fetch_watermarks(&config.topic, p, METADATA_TIMEOUT)
                {
                    Ok((_, high)) => {
                        targets.insert(p, high);
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
        let behind = |positions: &BTreeMap<i32, i64>, p: i32| positions[&p] < targets[&p];
        let mut lagging = positions.keys().filter(|p| behind(&positions, **p)).count();
        let mut buf: Vec<u8> = Vec::new();
        let mut records: Vec<(usize, usize, i32, i64)> = Vec::new();
        let deadline = Instant::now() + config.pull_timeout;
        while lagging > 0
            && records.len() < config.max_records_per_pull
            && buf.len() < config.max_bytes_per_pull
        {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            let wait = (deadline - now).min(Duration::from_millis(100));
            match self.consumer.poll(wait) {
                None => {}
                Some(Err(e)) => warn!(topic = %config.topic, "kafka poll: {e}"),
                Some(Ok(m)) => {
                    let (p, off) = (m.partition(), m.offset());
                    let Some(pos) = positions.get(&p).copied() else {
                        continue;
                    };
                    if off < pos {
                        continue; // already read (a refetch after a reconnect)
                    }
                    let was_behind = behind(&positions, p);
                    let payload = m.payload().unwrap_or_default();
                    let start = buf.len();
                    buf.extend_from_slice(payload);
                    records.push((start, buf.len(), p, off));
                    positions.insert(p, off + 1);
                    if was_behind && !behind(&positions, p) {
                        lagging -= 1;
                    }
                }
            }
        }
        let (batch, rejected) = decoder.decode(records.iter().map(|&(s, e, _, _)| &buf[s..e]))?;
        if !rejected.is_empty() {
            dead_letters.fetch_add(rejected.len() as u64, Ordering::Relaxed);
            DEAD_LETTERS.fetch_add(rejected.len() as u64, Ordering::Relaxed);
            self.send_dead_letters(config, &buf, &records, &rejected)?;
        }
        let offsets = positions
            .iter()
            .map(|(p, o)| SourceOffset {
                source: config.topic.clone(),
                partition: *p,
                offset: *o,
            })
            .collect();
        let batches: Vec<RecordBatch> = if batch.num_rows() > 0 {
            vec![batch]
        } else {
            vec![]
        };
        Ok(MicroBatch { batches, offsets })
    }

    /// Publish the rejected records and wait until the broker has them: the
    /// offsets that pass them must not be committed before.
    fn send_dead_letters(
        &self,
        config: &KafkaSourceConfig,
        buf: &[u8],
        records: &[(usize, usize, i32, i64)],
        rejected: &[crate::decode::Rejected],
    ) -> Result<()> {
        let (Some(producer), Some(dlt)) = (&self.dead_letter_producer, &config.dead_letter_topic)
        else {
            for r in rejected {
                let (_, _, p, off) = records[r.index];
                warn!(topic = %config.topic, partition = p, offset = off, reason = %r.reason, "undecodable record dropped (no dead.letter.topic)");
            }
            return Ok(());
        };
        for r in rejected {
            let (s, e, partition, offset) = records[r.index];
            let letter = DeadLetter {
                topic: &config.topic,
                partition,
                offset,
                reason: &r.reason,
                payload: String::from_utf8_lossy(&buf[s..e]).into_owned(),
            };
            let value = serde_json::to_vec(&letter).expect("dead letter serializes");
            let key = format!("{}/{partition}/{offset}", config.topic);
            let mut record = BaseRecord::to(dlt).key(&key).payload(&value);
            loop {
                match producer.send(record) {
                    Ok(()) => break,
                    Err((e, back)) => {
                        // Queue full: let deliveries drain, then retry.
                        if e.rdkafka_error_code()
                            != Some(rdkafka::types::RDKafkaErrorCode::QueueFull)
                        {
                            return Err(e.into());
                        }
                        std::thread::sleep(Duration::from_millis(10));
                        record = back;
                    }
                }
            }
        }
        producer.flush(Duration::from_secs(30))?;
        Ok(())
    }
}

/// Builds [`KafkaSource`]s from `STORED AS KAFKA` tables.
#[derive(Debug, Default)]
pub struct KafkaSourceFactory;

impl SourceFactory for KafkaSourceFactory {
    fn create(&self, config: &SourceConfig, schema: SchemaRef) -> EngineResult<Arc<dyn Source>> {
        let kafka =
            KafkaSourceConfig::from_source_config(config).map_err(|e| EngineError::Source {
                source_name: config.location.clone(),
                reason: e.to_string(),
            })?;
        let source = KafkaSource::new(kafka, schema).map_err(|e| EngineError::Source {
            source_name: config.location.clone(),
            reason: e.to_string(),
        })?;
        Ok(Arc::new(source))
    }
}
