//! Dead letters of a Kafka table: undecodable records its source sends to
//! the table's dead-letter topic, and rows later stages reject (late rows,
//! lookups without a match) sent there by [`KafkaDeadLetters`].

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;
use serde::Serialize;
use skein_clients::kafka::{KafkaRole, client_config};
use skein_engine::dead_letter::{DeadLetter as LateLetter, DeadLetterSink};
use skein_engine::error::Result as EngineResult;

use crate::error::Result;
use skein_formats::rejected::LetterRecord;

/// What goes to the dead-letter topic for one undecodable record.
#[derive(Debug, Serialize)]
pub struct DeadLetter<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub reason: &'a str,
    /// The record, as text (invalid UTF-8 replaced); only its first
    /// [`skein_formats::decode::DEAD_LETTER_PREFIX_BYTES`] when `truncated`.
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

/// Send keyed letters to `topic` and wait until the broker has them all:
/// the offsets (or epoch) that pass them must not be committed before.
pub(super) fn publish_letters(
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
    /// The table's librdkafka properties.
    client: BTreeMap<String, String>,
    producer: std::sync::OnceLock<BaseProducer>,
}

impl std::fmt::Debug for KafkaDeadLetters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KafkaDeadLetters({})", self.topic)
    }
}

impl KafkaDeadLetters {
    /// Letters for `topic`, sent with the table's librdkafka properties
    /// (`client`); the producer is opened on the first letter.
    pub fn new(topic: String, client: BTreeMap<String, String>) -> Self {
        KafkaDeadLetters {
            topic,
            client,
            producer: Default::default(),
        }
    }

    fn producer(&self) -> Result<&BaseProducer> {
        if let Some(p) = self.producer.get() {
            return Ok(p);
        }
        let p = client_config(KafkaRole::Producer, &self.client, &[]).create()?;
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
