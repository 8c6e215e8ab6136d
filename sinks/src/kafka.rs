//! The Kafka sink: `INSERT INTO` a `STORED AS KAFKA` table writes each row as
//! one message of the table's topic (LOCATION).
//!
//! The producer is idempotent (`enable.idempotence`), so a retried produce
//! request never duplicates or reorders a partition's messages. A write
//! returns only when the broker acknowledged every message of it; the first
//! delivery error fails the write, naming the topic and the reason, so the
//! engine's retry (or the caller) sees it instead of losing rows quietly.
//!
//! Options: `bootstrap.servers` (required), the encoder's `format`, `key` and
//! `value` (see [`crate::encode`]), and any other librdkafka producer
//! property (any option with a dot that is not one of the Kafka source's own).
//!
//! **Exactly once** (option `checkpoint`): each write is one Kafka
//! transaction holding its rows and the source offsets they cover, the
//! offsets as records of a compacted topic (option `offsets.topic`, default
//! [`DEFAULT_OFFSETS_TOPIC`]) keyed `<checkpoint>/<source topic>/<partition>`
//! with the next offset to read as the value. Consumers reading with
//! `isolation.level=read_committed` see a write whole or not at all. The
//! transactional id is `skein-<checkpoint>-<member>`, so a restarted writer
//! fences its predecessor. A Kafka source with `'startup' 'checkpoint'`
//! resumes from the offsets ([`stored_offsets`]), and a write whose offsets
//! are all at or behind those stored is a replay and writes nothing. Each
//! source partition's offsets must come from one writer: a query whose
//! source stage writes (filters, projections), or whose last stage is one
//! function (`--group-size 1`) emitting per epoch.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use skein_engine::payload::SourceOffset;
use skein_engine::planner::EMIT_OPTION;
use skein_engine::sink::{Sink, SinkConfig, SinkFactory, SinkWrite};
use skein_engine::watermark::EVENT_TIME_OPTIONS;
use skein_engine::{EngineError, Result};
use tokio::sync::Mutex;

use crate::encode::{ENCODER_OPTIONS, RowEncoder};

/// The sink kind, as registered (the table kind of the Kafka source too).
pub const KIND: &str = "KAFKA";

/// The Kafka sink's own options, besides the encoder's ([`ENCODER_OPTIONS`]);
/// other options with a dot that are not the Kafka source's are producer
/// properties.
pub const OPTIONS: &[&str] = &["checkpoint", "offsets.topic"];

/// Where exactly-once writers keep their source offsets unless a table says.
pub const DEFAULT_OFFSETS_TOPIC: &str = "skein-offsets";
/// How long a transaction call waits for the broker.
const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(60);

/// What the producer is set to unless the table says otherwise: idempotent,
/// acknowledged by all in-sync replicas, and batched for throughput.
const PRODUCER_DEFAULTS: &[(&str, &str)] = &[
    ("enable.idempotence", "true"),
    ("acks", "all"),
    ("linger.ms", "5"),
    ("batch.size", "1000000"),
    ("compression.type", "lz4"),
    ("queue.buffering.max.messages", "1000000"),
    ("queue.buffering.max.kbytes", "1048576"),
    ("message.timeout.ms", "120000"),
];

fn sink_error(topic: &str, reason: impl std::fmt::Display) -> EngineError {
    EngineError::Sink {
        sink: format!("kafka topic {topic}"),
        reason: reason.to_string(),
    }
}

/// The librdkafka producer properties a table's options give.
pub fn producer_config(options: &BTreeMap<String, String>) -> ClientConfig {
    let mut config = ClientConfig::new();
    for (k, v) in PRODUCER_DEFAULTS {
        config.set(*k, *v);
    }
    for (k, v) in options {
        let k_ = k.as_str();
        // A table may be read too: the source's options are not the producer's.
        let ours = ENCODER_OPTIONS.contains(&k_)
            || OPTIONS.contains(&k_)
            || skein_connectors::kafka::SOURCE_OPTIONS.contains(&k_)
            || EVENT_TIME_OPTIONS.contains(&k_)
            || k_ == EMIT_OPTION;
        if k.contains('.') && !ours {
            config.set(k, v);
        }
    }
    config
}

pub struct KafkaSinkFactory;

impl SinkFactory for KafkaSinkFactory {
    fn create(&self, config: &SinkConfig) -> Result<Arc<dyn Sink>> {
        Ok(Arc::new(KafkaSink::new(&config.location, &config.options)?))
    }
}

/// Writes rows to one topic.
pub struct KafkaSink {
    topic: String,
    encoder: RowEncoder,
    options: BTreeMap<String, String>,
    delivery: Delivery,
}

/// How writes reach the topic; each holds only the producer it uses.
enum Delivery {
    /// The idempotent producer: every message acknowledged, a restart may
    /// write an epoch again.
    Idempotent(FutureProducer),
    /// One transaction per write, with the offsets it covers.
    ExactlyOnce(ExactlyOnce),
}

/// A transactional writer's checkpoint and what it has committed.
struct ExactlyOnce {
    checkpoint: String,
    offsets_topic: String,
    /// Opened on the first write: the member is known only then.
    writer: Mutex<Option<TransactionalWriter>>,
}

struct TransactionalWriter {
    member: u32,
    producer: FutureProducer,
    /// `<source>/<partition>` -> next offset, as committed.
    committed: BTreeMap<String, i64>,
}

fn offset_key(checkpoint: &str, source: &str, partition: i32) -> String {
    format!("{checkpoint}/{source}/{partition}")
}

/// The latest offset per (source, partition) among `offsets`.
fn latest_offsets(offsets: &[SourceOffset]) -> BTreeMap<(String, i32), i64> {
    let mut out: BTreeMap<(String, i32), i64> = BTreeMap::new();
    for o in offsets {
        let e = out
            .entry((o.source.clone(), o.partition))
            .or_insert(o.offset);
        *e = (*e).max(o.offset);
    }
    out
}

impl KafkaSink {
    pub fn new(topic: &str, options: &BTreeMap<String, String>) -> Result<Self> {
        if topic.is_empty() {
            return Err(sink_error(topic, "LOCATION must name the topic"));
        }
        if !options.contains_key("bootstrap.servers") {
            return Err(sink_error(topic, "option 'bootstrap.servers' is required"));
        }
        let encoder = RowEncoder::from_options(options).map_err(|e| sink_error(topic, e))?;
        let delivery = match options.get("checkpoint").filter(|c| !c.is_empty()) {
            // The transactional producer is opened on the first write.
            Some(checkpoint) => Delivery::ExactlyOnce(ExactlyOnce {
                checkpoint: checkpoint.clone(),
                offsets_topic: options
                    .get("offsets.topic")
                    .cloned()
                    .unwrap_or_else(|| DEFAULT_OFFSETS_TOPIC.into()),
                writer: Mutex::new(None),
            }),
            None => Delivery::Idempotent(
                producer_config(options)
                    .create()
                    .map_err(|e| sink_error(topic, format!("creating the producer: {e}")))?,
            ),
        };
        Ok(KafkaSink {
            topic: topic.to_string(),
            encoder,
            options: options.clone(),
            delivery,
        })
    }

    /// The transactional producer of `member`, initialised (fencing any
    /// earlier writer with the same id) with the offsets committed so far.
    async fn open_writer(&self, eo: &ExactlyOnce, member: u32) -> Result<TransactionalWriter> {
        let brokers = self.options["bootstrap.servers"].clone();
        ensure_topic(
            &brokers,
            &eo.offsets_topic,
            1,
            &[("cleanup.policy", "compact")],
        )
        .await
        .map_err(|e| sink_error(&self.topic, e))?;
        let mut config = producer_config(&self.options);
        // librdkafka wants message.timeout.ms <= transaction.timeout.ms.
        if !self.options.contains_key("transaction.timeout.ms") {
            let message_timeout = config
                .get("message.timeout.ms")
                .unwrap_or("120000")
                .to_string();
            config.set("transaction.timeout.ms", message_timeout);
        }
        config.set(
            "transactional.id",
            format!("skein-{}-{member}", eo.checkpoint),
        );
        let producer: FutureProducer = config
            .create()
            .map_err(|e| sink_error(&self.topic, format!("creating the producer: {e}")))?;
        let p = producer.clone();
        tokio::task::spawn_blocking(move || p.init_transactions(TRANSACTION_TIMEOUT))
            .await
            .map_err(|e| sink_error(&self.topic, e))?
            .map_err(|e| sink_error(&self.topic, format!("init_transactions: {e}")))?;
        let (topic, checkpoint) = (eo.offsets_topic.clone(), eo.checkpoint.clone());
        let all = tokio::task::spawn_blocking(move || read_offsets(&brokers, &topic, &checkpoint))
            .await
            .map_err(|e| sink_error(&self.topic, e))?
            .map_err(|e| sink_error(&self.topic, e))?;
        Ok(TransactionalWriter {
            member,
            producer,
            committed: all,
        })
    }

    /// One transaction: the rows and the offsets they cover, or nothing.
    async fn write_exactly_once(&self, eo: &ExactlyOnce, write: &SinkWrite<'_>) -> Result<()> {
        let mut slot = eo.writer.lock().await;
        if slot.as_ref().is_none_or(|w| w.member != write.member) {
            *slot = Some(self.open_writer(eo, write.member).await?);
        }
        let writer = slot.as_mut().expect("opened above");
        let offsets = latest_offsets(&write.offsets);
        let advances = offsets.iter().any(|((source, partition), offset)| {
            writer
                .committed
                .get(&format!("{source}/{partition}"))
                .is_none_or(|old| offset > old)
        });
        if !offsets.is_empty() && !advances {
            tracing::debug!(epoch = write.epoch, topic = %self.topic, "replayed epoch: nothing to write");
            return Ok(());
        }
        let producer = writer.producer.clone();
        producer
            .begin_transaction()
            .map_err(|e| sink_error(&self.topic, format!("begin_transaction: {e}")))?;
        let outcome = async {
            send_rows(&producer, &self.topic, &self.encoder, &write.batches).await?;
            let mut pending = vec![];
            for ((source, partition), offset) in &offsets {
                let key = offset_key(&eo.checkpoint, source, *partition);
                let value = offset.to_string();
                let record = FutureRecord::to(&eo.offsets_topic)
                    .key(key.as_bytes())
                    .payload(value.as_bytes());
                match producer.send_result(record) {
                    Ok(d) => pending.push(d),
                    Err((e, _)) => return Err(sink_error(&eo.offsets_topic, e)),
                }
            }
            await_deliveries(&eo.offsets_topic, pending).await?;
            let p = producer.clone();
            tokio::task::spawn_blocking(move || p.commit_transaction(TRANSACTION_TIMEOUT))
                .await
                .map_err(|e| sink_error(&self.topic, e))?
                .map_err(|e| sink_error(&self.topic, format!("commit_transaction: {e}")))
        }
        .await;
        match outcome {
            Ok(()) => {
                for ((source, partition), offset) in offsets {
                    writer
                        .committed
                        .insert(format!("{source}/{partition}"), offset);
                }
                Ok(())
            }
            Err(e) => {
                let p = producer.clone();
                let aborted =
                    tokio::task::spawn_blocking(move || p.abort_transaction(TRANSACTION_TIMEOUT))
                        .await;
                if !matches!(aborted, Ok(Ok(()))) {
                    // The producer is in an unknown state: open a new one next time.
                    *slot = None;
                }
                Err(e)
            }
        }
    }
}

/// Sends the rows of `batches` to `topic` and waits for every acknowledgement.
async fn send_rows(
    producer: &FutureProducer,
    topic: &str,
    encoder: &RowEncoder,
    batches: &[datafusion::arrow::record_batch::RecordBatch],
) -> Result<()> {
    let pending = enqueue_rows(producer, topic, encoder, batches).await?;
    await_deliveries(topic, pending).await
}

/// Hands the rows of `batches` to the producer's queue, in row order, and
/// returns their deliveries. The idempotent producer keeps each partition in
/// queue order, retries included, so rows enqueued by one call precede those
/// of any later call in every partition.
async fn enqueue_rows(
    producer: &FutureProducer,
    topic: &str,
    encoder: &RowEncoder,
    batches: &[datafusion::arrow::record_batch::RecordBatch],
) -> Result<Vec<rdkafka::producer::DeliveryFuture>> {
    let mut pending = Vec::new();
    for batch in batches.iter().filter(|b| b.num_rows() > 0) {
        let rows = encoder.encode(batch).map_err(|e| sink_error(topic, e))?;
        for row in rows {
            let mut record: FutureRecord<'_, [u8], [u8]> =
                FutureRecord::to(topic).payload(&row.value);
            if let Some(k) = row.key.as_deref() {
                record = record.key(k);
            }
            // A full local queue is back-pressure: wait for room, then retry.
            loop {
                match producer.send_result(record) {
                    Ok(delivery) => {
                        pending.push(delivery);
                        break;
                    }
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                        record = back;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err((e, _)) => return Err(sink_error(topic, e)),
                }
            }
        }
    }
    Ok(pending)
}

/// The acknowledgements of rows [`KafkaSink::enqueue`] handed to the producer.
#[must_use = "rows are delivered only once their acknowledgements are awaited"]
pub struct Acks {
    topic: String,
    pending: Vec<rdkafka::producer::DeliveryFuture>,
}

impl Acks {
    /// Waits for every acknowledgement; the first delivery error fails.
    pub async fn wait(self) -> Result<()> {
        await_deliveries(&self.topic, self.pending).await
    }
}

impl KafkaSink {
    /// Enqueues the rows of `batches` now and returns their acknowledgements
    /// to wait for later: a publisher that calls this in order keeps several
    /// writes in flight and every partition in that order, which concurrent
    /// [`Sink::write`]s do not promise. Not for exactly-once tables, whose
    /// writes are transactions.
    pub async fn enqueue(
        &self,
        batches: &[datafusion::arrow::record_batch::RecordBatch],
    ) -> Result<Acks> {
        let Delivery::Idempotent(producer) = &self.delivery else {
            return Err(sink_error(
                &self.topic,
                "a 'checkpoint' table writes transactions, not enqueued rows",
            ));
        };
        Ok(Acks {
            topic: self.topic.clone(),
            pending: enqueue_rows(producer, &self.topic, &self.encoder, batches).await?,
        })
    }
}

async fn await_deliveries(
    topic: &str,
    pending: Vec<rdkafka::producer::DeliveryFuture>,
) -> Result<()> {
    for delivery in pending {
        match delivery.await {
            Ok(Ok(_)) => {}
            Ok(Err((e, _))) => {
                return Err(sink_error(topic, format!("delivery failed: {e}")));
            }
            Err(_) => return Err(sink_error(topic, "delivery cancelled")),
        }
    }
    Ok(())
}

/// Creates `topic` with `partitions` partitions (replication 1) and the
/// given topic configs, unless it exists. The error names the brokers and
/// the command that starts the local one.
pub async fn ensure_topic(
    brokers: &str,
    topic: &str,
    partitions: i32,
    configs: &[(&str, &str)],
) -> std::result::Result<(), String> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .map_err(|e| format!("Kafka admin client for {brokers}: {e}"))?;
    let mut new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    for (k, v) in configs {
        new = new.set(k, v);
    }
    let results = admin
        .create_topics(
            &[new],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .map_err(|e| {
            format!("creating topic {topic} at {brokers}: {e} (scripts/services.sh start kafka)")
        })?;
    for r in results {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, e)) => return Err(format!("creating topic {t}: {e}")),
        }
    }
    Ok(())
}

/// Every offset committed under `checkpoint` in `offsets_topic`, as
/// `<source>/<partition>` -> next offset (read_committed; latest wins).
fn read_offsets(
    brokers: &str,
    offsets_topic: &str,
    checkpoint: &str,
) -> std::result::Result<BTreeMap<String, i64>, String> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("skein-offsets-reader-{checkpoint}"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .create()
        .map_err(|e| format!("offsets reader: {e}"))?;
    let metadata = consumer
        .fetch_metadata(Some(offsets_topic), Duration::from_secs(30))
        .map_err(|e| format!("metadata of {offsets_topic}: {e}"))?;
    let partitions: Vec<i32> = metadata
        .topics()
        .first()
        .map(|t| t.partitions().iter().map(|p| p.id()).collect())
        .unwrap_or_default();
    let mut out = BTreeMap::new();
    if partitions.is_empty() {
        return Ok(out);
    }
    let mut tpl = TopicPartitionList::new();
    for p in &partitions {
        tpl.add_partition_offset(offsets_topic, *p, Offset::Beginning)
            .map_err(|e| e.to_string())?;
    }
    consumer.assign(&tpl).map_err(|e| e.to_string())?;
    let prefix = format!("{checkpoint}/");
    let mut at_end = std::collections::BTreeSet::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while at_end.len() < partitions.len() {
        if std::time::Instant::now() > deadline {
            return Err(format!("reading {offsets_topic}: no end after 60 s"));
        }
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                let (Some(key), Some(value)) = (m.key(), m.payload()) else {
                    continue;
                };
                let key = String::from_utf8_lossy(key);
                if let Some(rest) = key.strip_prefix(&prefix)
                    && let Ok(offset) = String::from_utf8_lossy(value).parse::<i64>()
                {
                    out.insert(rest.to_string(), offset);
                }
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                at_end.insert(p);
            }
            Some(Err(e)) => return Err(format!("reading {offsets_topic}: {e}")),
            None => {}
        }
    }
    Ok(out)
}

/// The offsets an exactly-once Kafka sink committed under `checkpoint` for
/// source `topic`: partition -> next offset to read.
pub fn stored_offsets(
    brokers: &str,
    offsets_topic: &str,
    checkpoint: &str,
    topic: &str,
) -> std::result::Result<BTreeMap<i32, i64>, String> {
    let all = read_offsets(brokers, offsets_topic, checkpoint)?;
    Ok(all
        .into_iter()
        .filter_map(|(k, v)| {
            let (t, p) = k.rsplit_once('/')?;
            (t == topic).then(|| Some((p.parse().ok()?, v)))?
        })
        .collect())
}

#[async_trait]
impl Sink for KafkaSink {
    async fn write(&self, write: SinkWrite<'_>) -> Result<()> {
        match &self.delivery {
            Delivery::ExactlyOnce(eo) => self.write_exactly_once(eo, &write).await,
            Delivery::Idempotent(producer) => {
                send_rows(producer, &self.topic, &self.encoder, &write.batches).await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_and_encoder_options_do_not_reach_the_producer() {
        let options: BTreeMap<String, String> = [
            ("bootstrap.servers", "127.0.0.1:1"),
            ("max.records.per.pull", "10"),
            ("format", "json"),
            ("key", "id"),
            ("client.id", "mine"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let c = producer_config(&options);
        assert_eq!(c.get("client.id"), Some("mine"));
        assert_eq!(c.get("enable.idempotence"), Some("true"));
        assert_eq!(c.get("max.records.per.pull"), None);
        assert!(KafkaSink::new("", &options).is_err());
        let mut no_brokers = options.clone();
        no_brokers.remove("bootstrap.servers");
        let err = KafkaSink::new("t", &no_brokers).err().unwrap().to_string();
        assert!(err.contains("bootstrap.servers"), "{err}");
    }
}
