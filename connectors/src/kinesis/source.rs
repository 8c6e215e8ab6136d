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

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::primitives::{Blob, DateTime};
use aws_sdk_kinesis::types::{PutRecordsRequestEntry, ShardIteratorType};
use datafusion::arrow::datatypes::SchemaRef;
use skein_engine::backoff::Backoff;
use skein_engine::error::{Cause, EngineError, Result as EngineResult};
use skein_engine::payload::SourceOffset;
use skein_engine::source::{
    EpochSpec, MicroBatch, PartitionProgress, PushedRecord, ReplayMode, Source, SourceConfig,
    SourceFactory, TableOptions,
};
use tokio::sync::{Mutex, OnceCell};
use tracing::warn;

use super::shards::{ListedShard, SHARD_END, list_shards, owner, ready, shard_id};
use crate::decode::{DEAD_LETTER_PREFIX_BYTES, Format, LetterRecord, RecordDecoder};
use crate::error::{ConnectorError, Result};
use crate::options;

/// GetRecords returns at most this many records per call.
const MAX_RECORDS_PER_GET: i32 = 10_000;

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
    config: Arc<KinesisSourceConfig>,
    decoder: Arc<RecordDecoder>,
    /// Opened on the first pull: planning must not need AWS.
    reader: Mutex<Option<ShardReader>>,
    client: OnceCell<Client>,
    dead_letters: Arc<AtomicU64>,
}

impl std::fmt::Debug for KinesisSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KinesisSource({})", self.config.stream)
    }
}

/// One owned shard and where its reader stands.
struct Shard {
    id: String,
    parents: Vec<String>,
    /// Where a shard with nothing read yet starts: the configured startup
    /// for shards of the first listing, the trim horizon for children
    /// that appeared later (all their records come after their parents').
    from_startup: bool,
    /// `None` until needed (or after a seek): fetched before the next read.
    iterator: Option<String>,
    /// The last sequence number read, where a renewed iterator starts.
    last_sequence: Option<String>,
    /// Read to its end (or gone from the stream): never read again.
    finished: bool,
}

#[derive(Default)]
struct ShardReader {
    /// The owned shards in shard-id order; append-only, so indexes hold.
    shards: Vec<Shard>,
    /// The stream's shards as last listed.
    listed: BTreeMap<String, ListedShard>,
    listed_once: bool,
}

impl ShardReader {
    fn is_ready(&self, shard: &Shard) -> bool {
        !shard.finished
            && ready(&shard.parents, &self.listed, |p| {
                self.shards.iter().find(|s| s.id == p).map(|s| s.finished)
            })
    }
}

/// A record that failed to decode, kept until it is dead-lettered.
struct Undecodable {
    shard: String,
    sequence_number: String,
    reason: String,
    data: Vec<u8>,
}

/// How errors name a Kinesis source: by kind and stream.
fn source_name(stream: &str) -> String {
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

    async fn client(&self) -> &Client {
        self.client
            .get_or_init(|| async {
                let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
                Client::new(&sdk)
            })
            .await
    }

    /// Decodes `records` (shard, sequence number, data) into a micro-batch;
    /// the rejected ones are counted and dead-lettered, or, with `hold`
    /// and no dead-letter stream, handed back in `rejected` (pushed
    /// records: the function reports them to the platform).
    async fn decode_records(
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

    fn error(&self, cause: impl Into<Cause>) -> EngineError {
        EngineError::source_failed(source_name(&self.config.stream), cause)
    }

    /// Lists the stream's shards and takes the owned ones not yet known.
    /// A known shard gone from the listing (expired, or deleted by an
    /// emulator that drops closed parents) is finished: nothing of it can
    /// be read any more.
    async fn refresh(&self, reader: &mut ShardReader, spec: &EpochSpec) -> EngineResult<()> {
        let client = self.client().await;
        let listed = list_shards(client, &self.config.stream)
            .await
            .map_err(|e| self.error(e))?;
        let first = !reader.listed_once;
        for l in &listed {
            if owner(&l.id, spec.instances) != spec.instance
                || reader.shards.iter().any(|s| s.id == l.id)
            {
                continue;
            }
            // Starting at `latest`, a shard already closed has nothing new.
            let skipped = first && l.closed && self.config.startup == KinesisStartup::Latest;
            reader.shards.push(Shard {
                id: l.id.clone(),
                parents: l.parents.clone(),
                from_startup: first,
                iterator: None,
                last_sequence: None,
                finished: skipped,
            });
        }
        reader.listed = listed.into_iter().map(|l| (l.id.clone(), l)).collect();
        reader.listed_once = true;
        for shard in reader.shards.iter_mut() {
            if !shard.finished && !reader.listed.contains_key(&shard.id) {
                self.gone(shard);
            }
        }
        Ok(())
    }

    fn gone(&self, shard: &mut Shard) {
        warn!(stream = %self.config.stream, shard = %shard.id, last = ?shard.last_sequence,
            "shard is gone from the stream; reading it ends here");
        shard.finished = true;
        shard.iterator = None;
    }

    /// The reader, opened (listed) on first use: planning must not need AWS.
    async fn reader<'a>(
        &self,
        slot: &'a mut Option<ShardReader>,
        spec: &EpochSpec,
    ) -> EngineResult<&'a mut ShardReader> {
        if slot.is_none() {
            let mut reader = ShardReader::default();
            self.refresh(&mut reader, spec).await?;
            *slot = Some(reader);
        }
        Ok(slot.as_mut().expect("opened above"))
    }

    /// An iterator just after the last record read of `shard`, or where
    /// it starts if nothing was read; `None` if the shard is gone.
    async fn renew(&self, client: &Client, shard: &Shard) -> EngineResult<Option<String>> {
        let mut req = client
            .get_shard_iterator()
            .stream_name(&self.config.stream)
            .shard_id(&shard.id);
        req = match (
            &shard.last_sequence,
            shard.from_startup,
            &self.config.startup,
        ) {
            (Some(seq), _, _) => req
                .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
                .starting_sequence_number(seq),
            (None, true, KinesisStartup::Latest) => {
                req.shard_iterator_type(ShardIteratorType::Latest)
            }
            (None, true, KinesisStartup::AtTimestamp { ms }) => req
                .shard_iterator_type(ShardIteratorType::AtTimestamp)
                .timestamp(DateTime::from_millis(*ms)),
            _ => req.shard_iterator_type(ShardIteratorType::TrimHorizon),
        };
        match req.send().await {
            Ok(out) => Ok(out.shard_iterator),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_resource_not_found_exception()) =>
            {
                Ok(None)
            }
            Err(e) => Err(self.error(ConnectorError::kinesis(
                format!("GetShardIterator {}", shard.id),
                e,
            ))),
        }
    }

    async fn send_dead_letters(&self, bad: Vec<Undecodable>) -> EngineResult<()> {
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

/// Where a replay stops in a shard: the last sequence number the logged
/// pull read, and whether it read the shard to its end.
#[derive(Debug, Clone)]
struct Target {
    last: Option<String>,
    end: bool,
}

use skein_engine::source::{partition_number as shard_number, position_after as sequence_after};

impl KinesisSource {
    /// The logged offset of shard `id` among `at`.
    fn logged<'a>(&self, at: &'a [SourceOffset], id: &str) -> Option<&'a SourceOffset> {
        at.iter()
            .find(|o| o.source == self.config.stream && o.partition == shard_number(id))
    }

    /// A pull, or with `targets` (shard number -> where the logged pull
    /// stopped) a replay that reads exactly up to them. A pull lists the
    /// shards first and again after a shard ends, so children of a shard
    /// finished in this pull are read in it too.
    async fn pull_to(
        &self,
        spec: EpochSpec,
        targets: Option<BTreeMap<i32, Target>>,
    ) -> EngineResult<MicroBatch> {
        let mut slot = self.reader.lock().await;
        let reader = self.reader(&mut slot, &spec).await?;
        let client = self.client().await;
        let started = Instant::now();
        let (budget, time) = match &targets {
            Some(_) => (usize::MAX, Duration::from_secs(60)),
            None => (self.config.max_records_per_pull, self.config.pull_timeout),
        };
        let mut data: Vec<(usize, String, Vec<u8>)> = vec![];
        let mut backoff = Backoff::new(Duration::from_secs(1));
        let mut caught_up = vec![];
        let mut list = true;
        while list {
            list = false;
            self.refresh(reader, &spec).await?;
            caught_up.resize(reader.shards.len(), false);
            for index in 0..reader.shards.len() {
                let target = targets
                    .as_ref()
                    .map(|t| t.get(&shard_number(&reader.shards[index].id)).cloned());
                // A replay reads what the log says; a pull what is ready.
                let readable = match &target {
                    Some(None) => false,
                    Some(Some(t)) => t.end || t.last.is_some(),
                    None => reader.is_ready(&reader.shards[index]),
                };
                if !readable {
                    continue;
                }
                let shard = &mut reader.shards[index];
                let target = target.flatten();
                let was_finished = shard.finished;
                let stop_at = target
                    .as_ref()
                    .filter(|t| !t.end)
                    .and_then(|t| t.last.clone());
                loop {
                    if data.len() >= budget || started.elapsed() >= time || shard.finished {
                        break;
                    }
                    // A replay stops where the logged pull stopped.
                    if stop_at.is_some() && shard.last_sequence == stop_at {
                        break;
                    }
                    let iterator = match shard.iterator.clone() {
                        Some(i) => i,
                        None => match self.renew(client, shard).await? {
                            Some(i) => i,
                            None => {
                                self.gone(shard);
                                break;
                            }
                        },
                    };
                    let limit = ((budget - data.len()) as i32).clamp(1, MAX_RECORDS_PER_GET);
                    let resp = client
                        .get_records()
                        .shard_iterator(iterator)
                        .limit(limit)
                        .send()
                        .await;
                    let page = match resp {
                        Ok(page) => page,
                        Err(e) => {
                            let service = e.as_service_error();
                            if service.is_some_and(|s| s.is_expired_iterator_exception()) {
                                shard.iterator = None;
                                continue;
                            }
                            if service.is_some_and(|s| s.is_resource_not_found_exception()) {
                                self.gone(shard);
                                break;
                            }
                            if service.is_some_and(|s| {
                                s.is_provisioned_throughput_exceeded_exception()
                                    || s.is_kms_throttling_exception()
                            }) {
                                tokio::time::sleep(backoff.next_delay()).await;
                                continue;
                            }
                            return Err(self.error(ConnectorError::kinesis(
                                format!("GetRecords {}", shard.id),
                                e,
                            )));
                        }
                    };
                    backoff.reset();
                    shard.iterator = page.next_shard_iterator().map(str::to_string);
                    let n = page.records().len();
                    let mut past_target = false;
                    for r in page.records() {
                        if let Some(t) = &stop_at
                            && sequence_after(r.sequence_number(), t)
                        {
                            past_target = true;
                            break;
                        }
                        shard.last_sequence = Some(r.sequence_number().to_string());
                        data.push((
                            index,
                            r.sequence_number().to_string(),
                            r.data().as_ref().to_vec(),
                        ));
                    }
                    if past_target {
                        // Records after the target come again in the next pull.
                        shard.iterator = None;
                        break;
                    }
                    // No next iterator: the shard is closed and read to its
                    // end (its children are in the answer's ChildShards).
                    if shard.iterator.is_none() {
                        shard.finished = true;
                        break;
                    }
                    if target.is_none() && (n == 0 || page.millis_behind_latest() == Some(0)) {
                        caught_up[index] = true;
                        break;
                    }
                }
                if let Some(t) = &target {
                    self.check_replayed(shard, t)?;
                }
                list |= targets.is_none() && shard.finished && !was_finished;
            }
            if data.len() >= budget || started.elapsed() >= time {
                break;
            }
        }
        // Decoded per shard, so event time is tracked per shard.
        let mut out = MicroBatch::default();
        for (index, shard) in reader.shards.iter().enumerate() {
            let records: Vec<(&str, &str, &[u8])> = data
                .iter()
                .filter(|(i, _, _)| *i == index)
                .map(|(_, seq, d)| (shard.id.as_str(), seq.as_str(), d.as_slice()))
                .collect();
            // A finished shard no longer holds the watermark back.
            let done = caught_up[index] || shard.finished;
            let mut progress = PartitionProgress {
                partition: shard.id.clone(),
                caught_up: done,
                // No end offset is known at open; caught up stands for it.
                drained: done,
                finished: shard.finished,
                ..Default::default()
            };
            if !records.is_empty() {
                let mb = self.decode_records(&records, false).await?;
                for b in mb.batches {
                    progress.batches.push(out.batches.len());
                    out.batches.push(b);
                }
            }
            out.partitions.push(progress);
        }
        Ok(out)
    }

    /// A shard the logged pull read from must still be there to read again.
    async fn replayable(
        &self,
        spec: EpochSpec,
        from: &[SourceOffset],
        to: &[SourceOffset],
    ) -> EngineResult<()> {
        let mut slot = self.reader.lock().await;
        let reader = self.reader(&mut slot, &spec).await?;
        for o in to.iter().filter(|o| o.source == self.config.stream) {
            let known = reader
                .shards
                .iter()
                .any(|s| shard_number(&s.id) == o.partition);
            let before = from
                .iter()
                .find(|f| f.source == o.source && f.partition == o.partition)
                .and_then(|f| f.position.as_ref());
            if !known && o.position.as_ref() != before {
                return Err(self.error(format!(
                    "replaying an epoch from the checkpoint: shard {} it read is gone from \
                     the stream (expired?)",
                    o.partition
                )));
            }
        }
        Ok(())
    }

    /// A replay must end exactly where the logged pull ended.
    fn check_replayed(&self, shard: &Shard, t: &Target) -> EngineResult<()> {
        if shard.last_sequence != t.last && t.last.is_some() || (t.end && !shard.finished) {
            return Err(self.error(format!(
                "replaying an epoch from the checkpoint: shard {} gave records up to {:?} \
                 only, not {:?}{} (trimmed by retention?)",
                shard.id,
                shard.last_sequence,
                t.last,
                if t.end { " and its end" } else { "" }
            )));
        }
        Ok(())
    }
}

/// A batch a Lambda Kinesis event-source mapping delivered: `{"Records":
/// [{"eventSource": "aws:kinesis", "eventID": "<shard>:<sequence>",
/// "kinesis": {"data": <base64>, "sequenceNumber", "partitionKey"}}, ...]}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KinesisEventBatch {
    /// Stable for the batch (a retried batch has the same first record):
    /// FNV-1a of its first shard and sequence number.
    pub batch_id: u64,
    pub records: Vec<PushedRecord>,
}

/// Reads an event-source-mapping event; `None` if `event` is not one, an
/// error naming the record and field if it is one but malformed.
pub fn parse_kinesis_event(
    event: &serde_json::Value,
) -> Option<std::result::Result<KinesisEventBatch, String>> {
    use base64::Engine;
    let records = event.get("Records")?.as_array()?;
    let is_kinesis = records
        .first()
        .and_then(|r| r.get("eventSource"))
        .and_then(|s| s.as_str())
        == Some("aws:kinesis");
    if !is_kinesis {
        return None;
    }
    let parse = || -> std::result::Result<KinesisEventBatch, String> {
        let mut out = Vec::with_capacity(records.len());
        for (i, r) in records.iter().enumerate() {
            let field = |path: &[&str]| -> std::result::Result<&str, String> {
                let mut v = r;
                for p in path {
                    v = v
                        .get(p)
                        .ok_or_else(|| format!("record {i}: no {}", path.join(".")))?;
                }
                v.as_str()
                    .ok_or_else(|| format!("record {i}: {} is not a string", path.join(".")))
            };
            let sequence = field(&["kinesis", "sequenceNumber"])?;
            let data = base64::engine::general_purpose::STANDARD
                .decode(field(&["kinesis", "data"])?)
                .map_err(|e| format!("record {i}: kinesis.data is not base64: {e}"))?;
            // eventID is "<shard id>:<sequence number>".
            let shard = field(&["eventID"])?
                .split_once(':')
                .map(|(shard, _)| shard.to_string())
                .ok_or_else(|| format!("record {i}: eventID is not <shard>:<sequence>"))?;
            out.push(PushedRecord {
                partition: shard,
                position: sequence.to_string(),
                data,
            });
        }
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        if let Some(first) = out.first() {
            for b in first
                .partition
                .bytes()
                .chain([0x1f])
                .chain(first.position.bytes())
            {
                hash ^= u64::from(b);
                hash = hash.wrapping_mul(0x0100_0000_01b3);
            }
        }
        Ok(KinesisEventBatch {
            batch_id: hash,
            records: out,
        })
    };
    Some(parse())
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
                .chain(crate::formats::all_options())
                .collect()
        }))
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
    fn event_source_mapping_batches_parse() {
        let event = serde_json::json!({"Records": [
            {"eventSource": "aws:kinesis", "eventID": "shardId-000000000001:4959",
             "kinesis": {"data": "eyJhIjogMX0=", "sequenceNumber": "4959", "partitionKey": "k"}},
            {"eventSource": "aws:kinesis", "eventID": "shardId-000000000001:4960",
             "kinesis": {"data": "", "sequenceNumber": "4960", "partitionKey": "k"}}
        ]});
        let batch = parse_kinesis_event(&event).unwrap().unwrap();
        assert_eq!(batch.records.len(), 2);
        assert_eq!(batch.records[0].data, br#"{"a": 1}"#);
        assert_eq!(batch.records[0].partition, "shardId-000000000001");
        assert_eq!(batch.records[1].position, "4960");
        let again = parse_kinesis_event(&event).unwrap().unwrap();
        assert_eq!(
            batch.batch_id, again.batch_id,
            "a retried batch keeps its id"
        );

        assert!(parse_kinesis_event(&serde_json::json!({"trigger": {}})).is_none());
        let sqs = serde_json::json!({"Records": [{"eventSource": "aws:sqs"}]});
        assert!(parse_kinesis_event(&sqs).is_none());
        let bad = serde_json::json!({"Records": [
            {"eventSource": "aws:kinesis", "eventID": "s:1", "kinesis": {"data": "%%", "sequenceNumber": "1"}}
        ]});
        let err = parse_kinesis_event(&bad).unwrap().unwrap_err();
        assert!(err.contains("record 0") && err.contains("base64"), "{err}");
        let missing =
            serde_json::json!({"Records": [{"eventSource": "aws:kinesis", "eventID": "s:1"}]});
        let err = parse_kinesis_event(&missing).unwrap().unwrap_err();
        assert!(err.contains("kinesis.sequenceNumber"), "{err}");
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
