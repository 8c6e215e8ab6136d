//! A source member's offsets log between checkpoints, kept in Kafka itself:
//! the metadata of an offset commit in a consumer group of the member's own
//! (`skein-log-<key>`), committed in a transaction so that a replaced
//! instance cannot write after its successor has read the note.
//!
//! Kafka keeps a committed offset's metadata for exactly this (any string
//! the client wants kept with the offset, up to the broker's
//! `offset.metadata.max.bytes`, 4096 by default). An epoch then costs a
//! transaction on the broker instead of an object-store PUT. The offsets
//! committed are where the member stands, so the group's lag is the
//! query's.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer as _, ConsumerGroupMetadata};
use rdkafka::producer::{BaseProducer, Producer as _};
use rdkafka::{Offset, TopicPartitionList};

use super::config::KafkaSourceConfig;
use crate::error::{ConnectorError, Result};
use skein_clients::kafka::KafkaRole;

/// The longest note kept: the broker's default `offset.metadata.max.bytes`
/// (4096) with room to spare. A longer one goes to the object store.
pub(super) const MAX_NOTE_BYTES: usize = 4000;

/// How long a transaction call waits for the broker.
const TIMEOUT: Duration = Duration::from_secs(30);

/// One member's note: its transactional producer (which fences earlier
/// ones when opened) and a consumer of its group to read the note back.
pub(super) struct NoteKeeper {
    key: String,
    producer: BaseProducer,
    consumer: BaseConsumer,
    group: ConsumerGroupMetadata,
}

/// The consumer group and transactional id of the note kept under `key`.
pub fn note_group(key: &str) -> String {
    format!("skein-log-{key}")
}

impl NoteKeeper {
    /// Open the note under `key`, fencing any earlier writer of it
    /// (blocking: call from a blocking thread).
    pub(super) fn open(config: &KafkaSourceConfig, key: &str) -> Result<Self> {
        let group = note_group(key);
        let mut producer = config.client_config(KafkaRole::Producer);
        producer.set("transactional.id", &group);
        // A transaction here holds offsets only; no record waits in it.
        producer.set("transaction.timeout.ms", "60000");
        producer.set("message.timeout.ms", "60000");
        let producer: BaseProducer = producer.create()?;
        producer.init_transactions(TIMEOUT).map_err(|e| {
            ConnectorError::kafka(
                format!(
                    "opening the offsets log kept in Kafka (transactional id {group}: the \
                     brokers must allow transactions and the principal Write on it; or set \
                     'offsets.log' 'store')"
                ),
                e,
            )
        })?;
        let mut consumer = config.client_config(KafkaRole::Consumer);
        consumer.set("group.id", &group);
        consumer.set("enable.auto.commit", "false");
        consumer.set("isolation.level", "read_committed");
        let consumer: BaseConsumer = consumer.create()?;
        let group_metadata = consumer.group_metadata().ok_or_else(|| {
            ConnectorError::Other(format!("consumer group {group}: no group metadata"))
        })?;
        Ok(NoteKeeper {
            key: key.to_string(),
            producer,
            consumer,
            group: group_metadata,
        })
    }

    pub(super) fn key(&self) -> &str {
        &self.key
    }

    /// The note kept with the lowest of `partitions`, if any.
    pub(super) fn read(&self, topic: &str, partitions: &[i32]) -> Result<Option<String>> {
        let Some(first) = partitions.iter().min() else {
            return Ok(None);
        };
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(topic, *first);
        let committed = self.consumer.committed_offsets(tpl, TIMEOUT)?;
        Ok(committed
            .find_partition(topic, *first)
            .map(|e| e.metadata().to_string())
            .filter(|m| !m.is_empty()))
    }

    /// Commit `at` (partition -> next offset) with `note` on the lowest
    /// partition, in one transaction: when this returns, the note is
    /// durable, or this instance was fenced and it is an error.
    pub(super) fn keep(&self, topic: &str, at: &BTreeMap<i32, i64>, note: &str) -> Result<()> {
        let Some(first) = at.keys().min().copied() else {
            return Ok(());
        };
        let mut tpl = TopicPartitionList::new();
        for (p, o) in at {
            tpl.add_partition_offset(topic, *p, Offset::Offset(*o))?;
        }
        if let Some(mut e) = tpl.find_partition(topic, first) {
            e.set_metadata(note);
        }
        let kept = self
            .producer
            .begin_transaction()
            .and_then(|()| {
                self.producer
                    .send_offsets_to_transaction(&tpl, &self.group, TIMEOUT)
            })
            .and_then(|()| self.producer.commit_transaction(TIMEOUT));
        if let Err(e) = kept {
            // A fenced producer cannot abort; anything else leaves the
            // transaction open for the next epoch to trip on.
            let _ = self.producer.abort_transaction(TIMEOUT);
            return Err(ConnectorError::kafka("keeping the offsets note", e));
        }
        Ok(())
    }
}
