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
//!   their options: docs/formats.md), `parallelism` (source instances),
//!   `max.records.per.pull` (default 100,000), `max.record.bytes`,
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
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::{PutRecordsRequestEntry, ShardIteratorType};
use datafusion::arrow::datatypes::SchemaRef;
use skein_engine::backoff::Backoff;
use skein_engine::error::{Cause, EngineError, Result as EngineResult};
use skein_engine::payload::SourceOffset;
use skein_engine::source::{
    EpochSpec, MicroBatch, PushedRecord, ReplayMode, Source, SourceCapabilities, SourceConfig,
    SourceFactory, TableOptions,
};
use tokio::sync::{Mutex, OnceCell};
use tracing::warn;

use super::reader::*;
use super::shards::{SHARD_END, shard_id};
use crate::error::{ConnectorError, Result};
use crate::options;
use skein_engine::source::partition_number as shard_number;
use skein_formats::Format;
use skein_formats::decode::RecordDecoder;
use skein_formats::decode::rejected::{DEAD_LETTER_PREFIX_BYTES, LetterRecord};

/// Where a shard is first read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KinesisStartup {
    TrimHorizon,
    Latest,
    AtTimestamp { ms: i64 },
}

/// The Kinesis source's options, read by [`KinesisSourceConfig`]; the
/// Kinesis sink and the Lambda deployer (`mode`) add theirs.
pub const SOURCE_OPTIONS: &[&str] = &[
    "format",
    "parallelism",
    "startup",
    "startup.timestamp.ms",
    "max.records.per.pull",
    "max.record.bytes",
    "pull.timeout.ms",
    "dead.letter.stream",
];

#[derive(Debug, Clone)]
pub struct KinesisSourceConfig {
    pub stream: String,
    pub format: Format,
    pub parallelism: usize,
    pub startup: KinesisStartup,
    pub max_records_per_pull: usize,
    pub max_record_bytes: usize,
    pub pull_timeout: Duration,
    pub dead_letter_stream: Option<String>,
}

impl KinesisSourceConfig {
    pub fn from_source_config(config: &SourceConfig) -> Result<Self> {
        let number = |k: &str, default: usize| options::number(config, k, default);
        options::require_location(config, "stream")?;
        let startup = match config.option("startup").unwrap_or("trim_horizon") {
            "trim_horizon" | "earliest" => KinesisStartup::TrimHorizon,
            "latest" => KinesisStartup::Latest,
            "at_timestamp" => {
                let v = config.option("startup.timestamp.ms").ok_or_else(|| {
                    ConnectorError::Config(
                        "startup 'at_timestamp' needs 'startup.timestamp.ms'".into(),
                    )
                })?;
                KinesisStartup::AtTimestamp {
                    ms: v
                        .parse()
                        .map_err(|_| options::bad("startup.timestamp.ms", v))?,
                }
            }
            other => return Err(options::bad("startup", other)),
        };
        let parallelism = options::parallelism(config)?;
        Ok(KinesisSourceConfig {
            stream: config.location.clone(),
            format: Format::from_options(&config.options, &config.location)?,
            parallelism,
            startup,
            max_records_per_pull: number("max.records.per.pull", 100_000)?.max(1),
            max_record_bytes: number("max.record.bytes", 1 << 20)?,
            pull_timeout: Duration::from_millis(number("pull.timeout.ms", 2000)? as u64),
            dead_letter_stream: config
                .option("dead.letter.stream")
                .filter(|s| !s.is_empty())
                .map(str::to_string),
        })
    }
}

/// Reads one Kinesis stream for one source instance.
pub struct KinesisSource {
    pub(super) config: Arc<KinesisSourceConfig>,
    pub(super) decoder: Arc<RecordDecoder>,
    /// Opened on the first pull: planning must not need AWS.
    pub(super) reader: Mutex<Option<ShardReader>>,
    pub(super) client: OnceCell<Client>,
    pub(super) dead_letters: Arc<AtomicU64>,
}

impl std::fmt::Debug for KinesisSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KinesisSource({})", self.config.stream)
    }
}

/// How errors name a Kinesis source: by kind and stream.
pub(super) fn source_name(stream: &str) -> String {
    format!("kinesis stream {stream}")
}

impl KinesisSource {
    pub fn new(config: KinesisSourceConfig, schema: SchemaRef) -> Result<Self> {
        let decoder = RecordDecoder::new(schema, config.format.clone(), config.max_record_bytes)?;
        Ok(KinesisSource {
            config: Arc::new(config),
            decoder: Arc::new(decoder),
            reader: Mutex::new(None),
            client: OnceCell::new(),
            dead_letters: Arc::new(AtomicU64::new(0)),
        })
    }

    pub(super) async fn client(&self) -> &Client {
        self.client
            .get_or_init(skein_clients::kinesis::client)
            .await
    }

    /// Decodes `records` (shard, sequence number, data) into a micro-batch;
    /// the rejected ones are counted and dead-lettered, or, with `hold`
    /// and no dead-letter stream, handed back in `rejected` (pushed
    /// records: the function reports them to the platform).
    pub(super) async fn decode_records(
        &self,
        records: &[(&str, &str, &[u8])],
        hold: bool,
    ) -> EngineResult<MicroBatch> {
        let (batch, mut rejected) = self
            .decoder
            .decode(records.iter().map(|(_, _, d)| *d))
            .map_err(|e| self.error(e))?;
        let mut held = vec![];
        if hold && self.config.dead_letter_stream.is_none() {
            held = rejected.drain(..).map(|r| (r.index, r.reason)).collect();
        }
        let dead_letters = rejected.len() as u64;
        let dead_letter_reason = rejected.last().map(|r| {
            let (shard, seq, _) = records[r.index];
            format!("shard {shard} sequence {seq}: {}", r.reason)
        });
        if !rejected.is_empty() {
            self.dead_letters
                .fetch_add(rejected.len() as u64, Ordering::Relaxed);
            skein_engine::metrics::dead_letters(&self.config.stream, rejected.len() as u64);
            let bad: Vec<Undecodable> = rejected
                .into_iter()
                .map(|r| {
                    let (shard, seq, bytes) = records[r.index];
                    Undecodable {
                        shard: shard.to_string(),
                        sequence_number: seq.to_string(),
                        reason: r.reason,
                        data: bytes.to_vec(),
                    }
                })
                .collect();
            if self.config.dead_letter_stream.is_none() {
                for u in &bad {
                    warn!(stream = %self.config.stream, shard = %u.shard, sequence = %u.sequence_number, reason = %u.reason, "undecodable record");
                }
            }
            self.send_dead_letters(bad).await?;
        }
        let batches = if batch.num_rows() > 0 {
            vec![batch]
        } else {
            vec![]
        };
        Ok(MicroBatch {
            batches,
            rejected: held,
            dead_letters,
            dead_letter_reason,
            ..Default::default()
        })
    }

    /// Undecodable records this source has seen.
    pub fn dead_letters(&self) -> u64 {
        self.dead_letters.load(Ordering::Relaxed)
    }

    pub(super) fn error(&self, cause: impl Into<Cause>) -> EngineError {
        EngineError::source_failed(source_name(&self.config.stream), cause)
    }

    pub(super) async fn send_dead_letters(&self, bad: Vec<Undecodable>) -> EngineResult<()> {
        let Some(stream) = &self.config.dead_letter_stream else {
            return Ok(());
        };
        let client = self.client().await;
        // PutRecords takes 500 records and 5 MiB a call; letters are up to
        // a few hundred KiB (a bounded prefix of the record, escaped).
        let mut chunks: Vec<&[Undecodable]> = vec![];
        let (mut start, mut bytes) = (0, 0);
        for (i, u) in bad.iter().enumerate() {
            let size = u.data.len().min(DEAD_LETTER_PREFIX_BYTES) * 6 + 1024;
            if i > start && (i - start == 500 || bytes + size > 4 << 20) {
                chunks.push(&bad[start..i]);
                (start, bytes) = (i, 0);
            }
            bytes += size;
        }
        if start < bad.len() {
            chunks.push(&bad[start..]);
        }
        for chunk in chunks {
            let mut entries: Vec<PutRecordsRequestEntry> = chunk
                .iter()
                .map(|u| {
                    let letter = LetterRecord::new(&u.data);
                    let body = serde_json::json!({
                        "stream": self.config.stream,
                        "shard": u.shard,
                        "sequence_number": u.sequence_number,
                        "reason": u.reason,
                        "record": letter.record,
                        "size": letter.size,
                        "truncated": letter.truncated,
                    });
                    PutRecordsRequestEntry::builder()
                        .partition_key(&u.sequence_number)
                        .data(Blob::new(body.to_string().into_bytes()))
                        .build()
                        .map_err(|e| self.error(e))
                })
                .collect::<EngineResult<_>>()?;
            let mut backoff = Backoff::new(Duration::from_secs(2));
            for attempt in 1.. {
                let resp = client
                    .put_records()
                    .stream_name(stream)
                    .set_records(Some(entries.clone()))
                    .send()
                    .await;
                let failed: Vec<PutRecordsRequestEntry> = match resp {
                    Ok(r) if r.failed_record_count().unwrap_or(0) == 0 => break,
                    Ok(r) => r
                        .records()
                        .iter()
                        .zip(entries.iter())
                        .filter(|(result, _)| result.error_code().is_some())
                        .map(|(_, e)| e.clone())
                        .collect(),
                    Err(e) if attempt >= 20 => {
                        let call = format!("PutRecords to dead-letter stream {stream}");
                        return Err(self.error(ConnectorError::kinesis(call, e)));
                    }
                    Err(_) => entries.clone(),
                };
                if attempt >= 20 {
                    return Err(self.error(format!(
                        "dead-letter stream {stream}: {} records not put after 20 attempts",
                        failed.len()
                    )));
                }
                entries = failed;
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
        Ok(())
    }
}

#[async_trait]
impl Source for KinesisSource {
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

    async fn decode_pushed(&self, records: &[PushedRecord]) -> EngineResult<MicroBatch> {
        let records: Vec<(&str, &str, &[u8])> = records
            .iter()
            .map(|r| (r.partition.as_str(), r.position.as_str(), r.data.as_slice()))
            .collect();
        self.decode_records(&records, true).await
    }

    async fn position(&self, spec: EpochSpec) -> EngineResult<Vec<SourceOffset>> {
        let mut slot = self.reader.lock().await;
        let reader = self.reader(&mut slot, &spec).await?;
        Ok(reader
            .shards
            .iter()
            .map(|s| SourceOffset {
                source: self.config.stream.clone(),
                partition: shard_number(&s.id),
                offset: if s.finished { SHARD_END } else { 0 },
                position: s.last_sequence.clone(),
            })
            .collect())
    }

    /// `MillisBehindLatest` of a one-record read just after each committed
    /// sequence number (finished shards are not behind).
    async fn behind_ms(&self, committed: &[SourceOffset]) -> EngineResult<Vec<(i32, i64)>> {
        let client = self.client().await;
        let mut out = vec![];
        for o in committed {
            if o.offset == SHARD_END || o.source != self.config.stream {
                continue;
            }
            let shard = shard_id(o.partition);
            let mut req = client
                .get_shard_iterator()
                .stream_name(&self.config.stream)
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
                    tracing::debug!(stream = %self.config.stream, %shard, error = %e, "no iterator for the delay");
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
                .map_err(|e| self.error(e))?;
            if let Some(ms) = page.millis_behind_latest() {
                out.push((o.partition, ms));
            }
        }
        Ok(out)
    }

    async fn seek(&self, spec: EpochSpec, at: &[SourceOffset]) -> EngineResult<()> {
        let mut slot = self.reader.lock().await;
        let reader = self.reader(&mut slot, &spec).await?;
        for shard in reader.shards.iter_mut() {
            let Some(o) = self.logged(at, &shard.id) else {
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
        self.replayable(spec, from, to).await?;
        let targets = to
            .iter()
            .filter(|o| o.source == self.config.stream)
            .map(|o| {
                let target = Target {
                    last: o.position.clone(),
                    end: o.offset == SHARD_END,
                };
                (o.partition, target)
            })
            .collect();
        self.pull_to(spec, Some(targets)).await
    }
}

/// Builds [`KinesisSource`]s from `STORED AS KINESIS` tables.
#[derive(Debug, Default)]
pub struct KinesisSourceFactory;

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
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn config(options: &[(&str, &str)]) -> SourceConfig {
        SourceConfig {
            kind: super::super::KIND.into(),
            location: "s".into(),
            options: options
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        }
    }

    #[test]
    fn options_parse_or_name_what_is_wrong() {
        let c = KinesisSourceConfig::from_source_config(&config(&[])).unwrap();
        assert_eq!(c.startup, KinesisStartup::TrimHorizon);
        assert_eq!(c.parallelism, 1);
        let c = KinesisSourceConfig::from_source_config(&config(&[
            ("startup", "at_timestamp"),
            ("startup.timestamp.ms", "1700000000000"),
            ("parallelism", "3"),
            ("dead.letter.stream", "bad"),
        ]))
        .unwrap();
        assert_eq!(
            c.startup,
            KinesisStartup::AtTimestamp {
                ms: 1_700_000_000_000
            }
        );
        assert_eq!(c.dead_letter_stream.as_deref(), Some("bad"));
        for (opts, needle) in [
            (vec![("startup", "at_timestamp")], "startup.timestamp.ms"),
            (vec![("startup", "yesterday")], "startup"),
            (vec![("parallelism", "0")], "parallelism"),
            (vec![("format", "avro")], "avro"),
        ] {
            let err = KinesisSourceConfig::from_source_config(&config(&opts))
                .unwrap_err()
                .to_string();
            assert!(err.contains(needle), "{err}");
        }
        let mut empty = config(&[]);
        empty.location.clear();
        assert!(KinesisSourceConfig::from_source_config(&empty).is_err());
    }
}
