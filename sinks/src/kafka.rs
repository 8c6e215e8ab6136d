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

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rdkafka::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use skein_engine::sink::{Sink, SinkConfig, SinkFactory, SinkWrite};
use skein_engine::{EngineError, Result};

use crate::encode::{ENCODER_OPTIONS, RowEncoder};

/// The sink kind, as registered (the table kind of the Kafka source too).
pub const KIND: &str = "KAFKA";

/// Options of a `STORED AS KAFKA` table that belong to the Kafka source and
/// must not reach the producer.
const SOURCE_OPTIONS: &[&str] = &[
    "parallelism",
    "startup",
    "offsets",
    "max.records.per.pull",
    "max.bytes.per.pull",
    "max.record.bytes",
    "pull.timeout.ms",
    "dead.letter.topic",
    "event_time",
    "emit",
    "checkpoint",
];

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
        let ours = ENCODER_OPTIONS.contains(&k.as_str()) || SOURCE_OPTIONS.contains(&k.as_str());
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
    producer: FutureProducer,
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
        let producer: FutureProducer = producer_config(options)
            .create()
            .map_err(|e| sink_error(topic, format!("creating the producer: {e}")))?;
        Ok(KafkaSink {
            topic: topic.to_string(),
            encoder,
            producer,
        })
    }

    /// Sends the rows of `batches` and waits until every one is acknowledged.
    /// Returns the number of messages written.
    pub async fn send(
        &self,
        batches: &[datafusion::arrow::record_batch::RecordBatch],
    ) -> Result<u64> {
        let mut pending = Vec::new();
        let mut sent = 0u64;
        for batch in batches.iter().filter(|b| b.num_rows() > 0) {
            let rows = self
                .encoder
                .encode(batch)
                .map_err(|e| sink_error(&self.topic, e))?;
            for row in rows {
                let mut record: FutureRecord<'_, [u8], [u8]> =
                    FutureRecord::to(&self.topic).payload(&row.value);
                if let Some(k) = row.key.as_deref() {
                    record = record.key(k);
                }
                // A full local queue is back-pressure: wait for room, then retry.
                let mut record = record;
                loop {
                    match self.producer.send_result(record) {
                        Ok(delivery) => {
                            pending.push(delivery);
                            break;
                        }
                        Err((
                            rdkafka::error::KafkaError::MessageProduction(
                                rdkafka::types::RDKafkaErrorCode::QueueFull,
                            ),
                            back,
                        )) => {
                            record = back;
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        Err((e, _)) => return Err(sink_error(&self.topic, e)),
                    }
                }
                sent += 1;
            }
        }
        for delivery in pending {
            match delivery.await {
                Ok(Ok(_)) => {}
                Ok(Err((e, _))) => {
                    return Err(sink_error(&self.topic, format!("delivery failed: {e}")));
                }
                Err(_) => return Err(sink_error(&self.topic, "delivery cancelled")),
            }
        }
        Ok(sent)
    }

    /// Waits until everything queued is delivered (or `timeout` passes).
    pub fn flush(&self, timeout: Duration) -> Result<()> {
        self.producer
            .flush(timeout)
            .map_err(|e| sink_error(&self.topic, format!("flush: {e}")))
    }
}

#[async_trait]
impl Sink for KafkaSink {
    async fn write(&self, write: SinkWrite<'_>) -> Result<()> {
        self.send(&write.batches).await?;
        Ok(())
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
