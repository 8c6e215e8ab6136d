//! The Kafka sink's exactly-once delivery: one transaction per (run, epoch,
//! member) holding the rows and the member's epoch marker.
//!
//! Each member has its own transactional producer (`skein-<name>-<member>`),
//! so members never fence one another and one member's commit says nothing
//! about another's. Opening the producer (`init_transactions`) aborts
//! whatever its predecessor left open; only then are the markers read, so
//! they are final for this member.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::producer::{FutureRecord, Producer as _};
use skein_engine::Result;
use skein_engine::payload::SourceOffset;
use skein_engine::sink::SinkWrite;
use tokio::sync::Mutex;

use super::offsets_topic::{member_markers, read_latest};
use super::reporting::ReportingContext;
use super::{
    KafkaSink, Producer, await_deliveries, ensure_topic, producer_config, send_rows, sink_error,
};
use crate::epoch_markers::{Runs, is_replay, marker_field, marker_name};
use crate::error::ConnectorError;

/// How long a transaction call waits for the broker.
const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(60);

/// What exactly-once writes share: where markers go, and a writer per member.
pub(super) struct ExactlyOnce {
    checkpoint: Option<String>,
    offsets_topic: String,
    runs: Runs,
    /// Opened at each member's first write: the member is known only then.
    writers: std::sync::Mutex<HashMap<u32, Arc<Mutex<Option<TransactionalWriter>>>>>,
}

struct TransactionalWriter {
    producer: Producer,
    context: ReportingContext,
    /// run -> the last epoch this member committed in it.
    committed: BTreeMap<String, u64>,
}

impl ExactlyOnce {
    pub(super) fn new(checkpoint: Option<String>, offsets_topic: String) -> Self {
        ExactlyOnce {
            checkpoint,
            offsets_topic,
            runs: Runs::new(),
            writers: Default::default(),
        }
    }

    fn slot(&self, member: u32) -> Arc<Mutex<Option<TransactionalWriter>>> {
        self.writers
            .lock()
            .expect("kafka writers")
            .entry(member)
            .or_default()
            .clone()
    }

    /// One transaction: the rows, the source offsets (with `checkpoint`) and
    /// the epoch marker, or nothing; a replay writes nothing.
    pub(super) async fn write(&self, sink: &KafkaSink, write: &SinkWrite<'_>) -> Result<()> {
        let name = marker_name(self.checkpoint.as_deref(), write);
        let run = self.runs.of(write);
        let slot = self.slot(write.member);
        let mut slot = slot.lock().await;
        if slot.is_none() {
            *slot = Some(self.open(sink, name, write.member).await?);
        }
        let writer = slot.as_mut().expect("opened above");
        let context = writer.context.clone();
        let _reporting = context.during_write();
        if is_replay(writer.committed.get(run).copied(), write.epoch) {
            tracing::debug!(epoch = write.epoch, member = write.member, topic = %sink.topic, "replayed epoch: nothing to write");
            return Ok(());
        }
        let mut records: Vec<(String, String)> = match &self.checkpoint {
            Some(checkpoint) => latest_offsets(&write.offsets)
                .into_iter()
                .map(|((source, partition), offset)| {
                    (
                        format!("{checkpoint}/{source}/{partition}"),
                        offset.to_string(),
                    )
                })
                .collect(),
            None => vec![],
        };
        if records.is_empty() && write.rows.is_empty() {
            // Nothing to make atomic: a replay of it writes nothing either.
            return Ok(());
        }
        records.push((
            format!("{name}/{}", marker_field(run, write.member)),
            write.epoch.to_string(),
        ));
        let producer = writer.producer.clone();
        let topic = sink.topic.as_str();
        if let Err(e) = producer.begin_transaction() {
            // E.g. an attempt cut off mid-transaction left this producer in
            // it: a new one fences it, aborting what it left open, rather
            // than every later write failing the same way.
            *slot = None;
            return Err(sink_error(
                topic,
                ConnectorError::kafka("begin_transaction", e),
            ));
        }
        let outcome = async {
            send_rows(&producer, topic, &sink.encoder, &write.rows).await?;
            let mut pending = vec![];
            for (key, value) in &records {
                let record = FutureRecord::to(&self.offsets_topic)
                    .key(key.as_bytes())
                    .payload(value.as_bytes());
                match producer.send_result(record) {
                    Ok(d) => pending.push(d),
                    Err((e, _)) => {
                        return Err(sink_error(&self.offsets_topic, ConnectorError::from(e)));
                    }
                }
            }
            await_deliveries(&self.offsets_topic, pending).await?;
            let p = producer.clone();
            tokio::task::spawn_blocking(move || p.commit_transaction(TRANSACTION_TIMEOUT))
                .await
                .map_err(|e| sink_error(topic, ConnectorError::Task("commit_transaction", e)))?
                .map_err(|e| sink_error(topic, ConnectorError::kafka("commit_transaction", e)))
        }
        .await;
        match outcome {
            Ok(()) => {
                writer.committed.insert(run.to_string(), write.epoch);
                Ok(())
            }
            Err(e) => {
                let p = producer.clone();
                let aborted =
                    tokio::task::spawn_blocking(move || p.abort_transaction(TRANSACTION_TIMEOUT))
                        .await;
                if !matches!(aborted, Ok(Ok(()))) {
                    // Committed or not is unknown: a new producer fences this
                    // one and reads the markers again.
                    *slot = None;
                }
                Err(e)
            }
        }
    }

    /// The transactional producer of `member`, initialised (fencing any
    /// earlier writer with the same id), with the member's markers.
    async fn open(&self, sink: &KafkaSink, name: &str, member: u32) -> Result<TransactionalWriter> {
        let topic = sink.topic.as_str();
        let brokers = sink.options["bootstrap.servers"].clone();
        let mut config = producer_config(&sink.options);
        // librdkafka wants message.timeout.ms <= transaction.timeout.ms.
        if !sink.options.contains_key("transaction.timeout.ms") {
            let message_timeout = config
                .get("message.timeout.ms")
                .unwrap_or("120000")
                .to_string();
            config.set("transaction.timeout.ms", message_timeout);
        }
        // Another member's transaction left open by a crash holds back what
        // read_committed readers see until it is aborted or times out.
        let wait = config
            .get("transaction.timeout.ms")
            .and_then(|ms| ms.parse().ok())
            .map_or(Duration::from_secs(150), |ms| {
                Duration::from_millis(ms) + Duration::from_secs(30)
            });
        config.set("transactional.id", format!("skein-{name}-{member}"));
        // Made before the admin client's wait below: the producer's polling
        // thread is what delivers a refused connection to the sink's health.
        let context = ReportingContext::for_this_write();
        let producer: Producer = config
            .create_with_context(context.clone())
            .map_err(|e| sink_error(topic, ConnectorError::kafka("creating the producer", e)))?;
        ensure_topic(
            &brokers,
            &self.offsets_topic,
            1,
            &[("cleanup.policy", "compact")],
        )
        .await
        .map_err(|e| sink_error(topic, e))?;
        let p = producer.clone();
        let sink_topic = sink.topic.clone();
        tokio::task::spawn_blocking(move || {
            // Connected first: librdkafka asks for the transaction
            // coordinator once a broker is up, and a client that is not up
            // yet waits for its 500 ms retry timer (0.5 s at every open).
            let _ = p
                .client()
                .fetch_metadata(Some(&sink_topic), TRANSACTION_TIMEOUT);
            p.init_transactions(TRANSACTION_TIMEOUT)
        })
        .await
        .map_err(|e| sink_error(topic, ConnectorError::Task("init_transactions", e)))?
        .map_err(|e| sink_error(topic, ConnectorError::kafka("init_transactions", e)))?;
        let (offsets_topic, prefix) = (self.offsets_topic.clone(), format!("{name}/"));
        let records = tokio::task::spawn_blocking(move || {
            read_latest(&brokers, &offsets_topic, &prefix, wait)
        })
        .await
        .map_err(|e| sink_error(topic, ConnectorError::Task("reading the offsets topic", e)))?
        .map_err(|e| sink_error(topic, e))?;
        Ok(TransactionalWriter {
            producer,
            context,
            committed: member_markers(&records, member),
        })
    }
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
