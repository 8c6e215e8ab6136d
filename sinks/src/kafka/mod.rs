//! The Kafka sink: `INSERT INTO` a `STORED AS KAFKA` table writes each row as
//! one message of the table's topic (LOCATION).
//!
//! Options: `bootstrap.servers` (required), the encoder's `format`, `key` and
//! `value` (see [`crate::encode`]), `delivery`, `checkpoint`,
//! `offsets.topic`, and any other librdkafka producer property (any option
//! with a dot that is not one of the Kafka source's own).
//!
//! **Exactly once** (the default, `'delivery' 'exactly-once'`): each write is
//! one Kafka transaction holding its rows and an epoch marker, a record of a
//! compacted topic (option `offsets.topic`, default
//! [`DEFAULT_OFFSETS_TOPIC`]) keyed `<name>/<run>/<member>` whose value is
//! the epoch; `<name>` is the `checkpoint` option or, without it, the query.
//! A write at or below its member's marker is a replay and writes nothing
//! (see [`crate::epoch_markers`]), so this holds at any group size. The
//! transactional id is `skein-<name>-<member>`: a restarted writer fences its
//! predecessor, then reads the markers. Consumers reading
//! with `isolation.level=read_committed` see each write whole or not at all.
//! With `checkpoint`, a transaction also records the source offsets it
//! covers under `<checkpoint>/<source topic>/<partition>`, for a Kafka source
//! with `'startup' 'checkpoint'` ([`stored_offsets`]); they decide nothing
//! here.
//!
//! **At least once** (`'delivery' 'at-least-once'`): the idempotent producer
//! (`enable.idempotence`), so a retried produce request never duplicates or
//! reorders a partition's messages, but a replayed epoch is written again.
//!
//! Either way a write returns only when the broker acknowledged every message
//! of it; the first delivery error fails the write, naming the topic and the
//! reason, so the engine's retry (or the caller) sees it instead of losing
//! rows quietly.

pub mod changes;
mod exactly_once;
mod offsets_topic;
mod reporting;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, FutureRecord};
use skein_engine::catalog::TableOptions;
use skein_engine::error::Cause;
use skein_engine::sink::{Sink, SinkCapabilities, SinkConfig, SinkFactory, SinkRows, SinkWrite};
use skein_engine::{EngineError, Result};

use crate::encode::{ENCODER_OPTIONS, RowEncoder};
use crate::error::ConnectorError;
use exactly_once::ExactlyOnce;
pub use offsets_topic::stored_offsets;
use reporting::ReportingContext;
pub use skein_clients::kafka::KIND;
use skein_clients::kafka::{KafkaRole, client_config};

/// The producer the sink writes with: its client errors go to the sink's
/// health ([`reporting`]).
type Producer = FutureProducer<ReportingContext>;

/// Where exactly-once writers keep their epoch markers (and source offsets)
/// unless a table says.
pub const DEFAULT_OFFSETS_TOPIC: &str = "skein-offsets";

/// The Kafka sink's own options, besides the encoder's
/// ([`crate::encode::ENCODER_OPTIONS`]).
pub const SINK_OPTIONS: &[&str] = &[
    "checkpoint",
    "offsets.topic",
    "delivery",
    skein_engine::sink_health::RETRY_OPTION,
];

/// The error of the sink writing `topic`, keeping `cause`.
fn sink_error(topic: &str, cause: impl Into<Cause>) -> EngineError {
    EngineError::sink_failed(format!("kafka topic {topic}"), cause)
}

/// The librdkafka producer properties a sink's options give.
pub fn producer_config(options: &BTreeMap<String, String>) -> ClientConfig {
    client_config(KafkaRole::Producer, options, &sink_options().names)
}

pub struct KafkaSinkFactory;

/// The options a Kafka sink takes: its own, the row encoder's (with its
/// format's) and any librdkafka property.
fn sink_options() -> TableOptions {
    TableOptions::only(SINK_OPTIONS)
        .and(ENCODER_OPTIONS)
        .and(&skein_formats::all_options())
        .passing_dotted("librdkafka property")
}

#[async_trait]
impl SinkFactory for KafkaSinkFactory {
    fn options(&self) -> TableOptions {
        sink_options()
    }

    /// Transactions (unless `'delivery' 'at-least-once'`), and the offsets
    /// of each write in its offsets topic under `'checkpoint'`.
    fn capabilities(&self) -> SinkCapabilities {
        SinkCapabilities::EXACTLY_ONCE_WITH_OFFSETS
    }

    async fn committed_offsets(
        &self,
        config: &SinkConfig,
        source: &str,
    ) -> Result<Option<BTreeMap<i32, i64>>> {
        let Some(checkpoint) = config.options.get("checkpoint").filter(|c| !c.is_empty()) else {
            return Ok(None);
        };
        let brokers = config
            .options
            .get("bootstrap.servers")
            .ok_or_else(|| sink_error(&config.location, "no 'bootstrap.servers'"))?
            .clone();
        let offsets_topic = config
            .options
            .get("offsets.topic")
            .cloned()
            .unwrap_or_else(|| DEFAULT_OFFSETS_TOPIC.into());
        let (checkpoint, topic) = (checkpoint.clone(), source.to_string());
        let stored = tokio::task::spawn_blocking(move || {
            stored_offsets(&brokers, &offsets_topic, &checkpoint, &topic)
        })
        .await
        .map_err(|e| sink_error(&config.location, e))?;
        stored
            .map(Some)
            .map_err(|e| e.for_sink(format!("kafka topic {}", config.location)))
    }

    fn create(&self, config: &SinkConfig) -> Result<Arc<dyn Sink>> {
        Ok(Arc::new(KafkaSink::new(&config.location, &config.options)?))
    }

    fn takes_updates(&self, config: &SinkConfig) -> std::result::Result<(), String> {
        let encoder = RowEncoder::from_options(&config.options, &config.location)
            .map_err(|e| e.to_string())?;
        changes::takes_updates(&encoder)
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
    /// The idempotent producer: every message acknowledged, a replayed
    /// epoch written again.
    AtLeastOnce(Producer, ReportingContext),
    /// One transaction per write, with its epoch marker.
    ExactlyOnce(ExactlyOnce),
}

impl KafkaSink {
    pub fn new(topic: &str, options: &BTreeMap<String, String>) -> Result<Self> {
        if topic.is_empty() {
            return Err(sink_error(topic, "LOCATION must name the topic"));
        }
        if !options.contains_key("bootstrap.servers") {
            return Err(sink_error(topic, "option 'bootstrap.servers' is required"));
        }
        let encoder = RowEncoder::from_options(options, topic).map_err(|e| sink_error(topic, e))?;
        let checkpoint = options.get("checkpoint").filter(|c| !c.is_empty());
        let delivery = match options.get("delivery").map(String::as_str) {
            // The transactional producers are opened on each member's first write.
            None | Some("exactly-once") => Delivery::ExactlyOnce(ExactlyOnce::new(
                checkpoint.cloned(),
                options
                    .get("offsets.topic")
                    .cloned()
                    .unwrap_or_else(|| DEFAULT_OFFSETS_TOPIC.into()),
            )),
            Some("at-least-once") if checkpoint.is_some() => {
                return Err(sink_error(
                    topic,
                    "option 'checkpoint' records offsets in transactions: it needs 'delivery' 'exactly-once'",
                ));
            }
            Some("at-least-once") => {
                let context = ReportingContext::default();
                let producer = producer_config(options)
                    .create_with_context(context.clone())
                    .map_err(|e| {
                        sink_error(topic, ConnectorError::kafka("creating the producer", e))
                    })?;
                Delivery::AtLeastOnce(producer, context)
            }
            Some(other) => {
                return Err(sink_error(
                    topic,
                    format!(
                        "option 'delivery' = {other:?}: give 'exactly-once' (the default) or 'at-least-once'"
                    ),
                ));
            }
        };
        Ok(KafkaSink {
            topic: topic.to_string(),
            encoder,
            options: options.clone(),
            delivery,
        })
    }
}

/// Sends the rows of `batches` to `topic` and waits for every acknowledgement.
async fn send_rows(
    producer: &Producer,
    topic: &str,
    encoder: &RowEncoder,
    rows: &SinkRows,
) -> Result<()> {
    let pending = enqueue_rows(producer, topic, encoder, rows).await?;
    await_deliveries(topic, pending).await
}

/// Hands the rows of `batches` to the producer's queue, in row order, and
/// returns their deliveries. The idempotent producer keeps each partition in
/// queue order, retries included, so rows enqueued by one call precede those
/// of any later call in every partition.
async fn enqueue_rows(
    producer: &Producer,
    topic: &str,
    encoder: &RowEncoder,
    rows: &SinkRows,
) -> Result<Vec<rdkafka::producer::DeliveryFuture>> {
    let mut pending = Vec::new();
    let messages = changes::messages(encoder, rows).map_err(|e| sink_error(topic, e))?;
    {
        for row in messages {
            let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic);
            if let Some(v) = row.value.as_deref() {
                record = record.payload(v);
            }
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
                    Err((e, _)) => return Err(sink_error(topic, ConnectorError::from(e))),
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
        let Delivery::AtLeastOnce(producer, _) = &self.delivery else {
            return Err(sink_error(
                &self.topic,
                "an exactly-once table writes transactions, not enqueued rows: \
                 give 'delivery' 'at-least-once'",
            ));
        };
        Ok(Acks {
            topic: self.topic.clone(),
            pending: enqueue_rows(
                producer,
                &self.topic,
                &self.encoder,
                &SinkRows::Append(batches.to_vec()),
            )
            .await?,
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
                return Err(sink_error(
                    topic,
                    ConnectorError::kafka("delivery failed", e),
                ));
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
) -> std::result::Result<(), ConnectorError> {
    let admin: AdminClient<ReportingContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create_with_context(ReportingContext::for_this_write())
        .map_err(|e| ConnectorError::kafka(format!("admin client for {brokers}"), e))?;
    let mut new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    for (k, v) in configs {
        new = new.set(k, v);
    }
    let results = admin
        .create_topics(
            &[new],
            // Without a client-side limit an unreachable broker costs a minute.
            &AdminOptions::new()
                .operation_timeout(Some(Duration::from_secs(10)))
                .request_timeout(Some(Duration::from_secs(15))),
        )
        .await
        .map_err(|e| {
            let doing =
                format!("creating topic {topic} at {brokers} (scripts/services.sh start kafka)");
            ConnectorError::kafka(doing, e)
        })?;
    for r in results {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, e)) => {
                let e = rdkafka::error::KafkaError::AdminOp(e);
                return Err(ConnectorError::kafka(format!("creating topic {t}"), e));
            }
        }
    }
    Ok(())
}

#[async_trait]
impl Sink for KafkaSink {
    async fn write(&self, write: SinkWrite<'_>) -> Result<()> {
        match &self.delivery {
            Delivery::ExactlyOnce(eo) => eo.write(self, &write).await,
            Delivery::AtLeastOnce(producer, context) => {
                let _reporting = context.during_write();
                send_rows(producer, &self.topic, &self.encoder, &write.rows).await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::SchemaRef;
    use skein_engine::source::{Source, SourceConfig, SourceFactory};

    /// The source side of the table, as far as its options go (the real
    /// one is in skein-connectors).
    struct SourceSide;

    impl SourceFactory for SourceSide {
        fn options(&self) -> TableOptions {
            TableOptions::only(&["format", "max.records.per.pull"])
                .passing_dotted("librdkafka property")
        }
        fn create(&self, _: &SourceConfig, _: SchemaRef) -> Result<Arc<dyn Source>> {
            unreachable!("only options are read")
        }
    }

    #[test]
    fn source_and_encoder_options_do_not_reach_the_producer() {
        let mut catalog = skein_engine::catalog::Catalog::default();
        crate::register(&mut catalog);
        catalog.register_source(KIND, Arc::new(SourceSide));
        let table: BTreeMap<String, String> = [
            ("bootstrap.servers", "127.0.0.1:1"),
            ("max.records.per.pull", "10"),
            ("format", "json"),
            ("key", "id"),
            ("client.id", "mine"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let config = SinkConfig {
            kind: KIND.into(),
            location: "t".into(),
            options: table,
        };
        let options = catalog.sink_view(&config).unwrap().options.clone();
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
