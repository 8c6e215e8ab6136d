//! The Kinesis sink: `INSERT INTO` a `STORED AS KINESIS` table puts each row
//! as one record of the table's stream (LOCATION), with PutRecords.
//!
//! Kinesis' limits shape the requests: at most 500 records and 5 MiB (data
//! plus partition keys) per PutRecords call, 1 MiB per record, and partition
//! keys of 1 to 256 characters. PutRecords is not atomic: a response lists
//! which entries failed (throttled, internal error), and only those are sent
//! again, after the truncated linear backoff, until they all succeed or the
//! attempts run out; then the write fails naming the last error.
//!
//! Options: the encoder's `format`, `key` and `value` (see [`crate::encode`];
//! `key` names the partition-key column; without it the key is a hash of the
//! record, which spreads rows over shards deterministically), and
//! `max.attempts` (default 20). The client uses the standard AWS chain, so
//! `AWS_ENDPOINT_URL` points it at a stand-in.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::PutRecordsRequestEntry;
use datafusion::arrow::record_batch::RecordBatch;
use skein_engine::backoff::Backoff;
use skein_engine::catalog::TableOptions;
use skein_engine::error::Cause;
use skein_engine::sink::{Sink, SinkConfig, SinkFactory, SinkRows, SinkWrite};
use skein_engine::{EngineError, Result};
use tokio::sync::OnceCell;

use crate::encode::{ENCODER_OPTIONS, EncodedRow, RowEncoder};
use crate::error::ConnectorError;
pub use skein_clients::kinesis::KIND;

/// PutRecords takes at most this many records per call.
pub const MAX_RECORDS_PER_CALL: usize = 500;
/// ... and at most this many bytes (data and partition keys) per call.
pub const MAX_BYTES_PER_CALL: usize = 5 * 1024 * 1024;
/// One record's data and partition key together.
pub const MAX_RECORD_BYTES: usize = 1024 * 1024;
/// Partition keys are 1 to 256 Unicode characters.
pub const MAX_PARTITION_KEY_CHARS: usize = 256;

/// The error of the sink writing `stream`, keeping `cause`.
fn sink_error(stream: &str, cause: impl Into<Cause>) -> EngineError {
    EngineError::sink_failed(format!("kinesis stream {stream}"), cause)
}

pub struct KinesisSinkFactory;

impl SinkFactory for KinesisSinkFactory {
    /// Its own options and the row encoder's.
    fn options(&self) -> TableOptions {
        TableOptions::only(SINK_OPTIONS)
            .and(ENCODER_OPTIONS)
            .and(&skein_formats::all_options())
    }

    fn create(&self, config: &SinkConfig) -> Result<Arc<dyn Sink>> {
        Ok(Arc::new(KinesisSink::new(
            &config.location,
            &config.options,
        )?))
    }
}

/// Writes rows to one stream.
pub struct KinesisSink {
    stream: String,
    encoder: RowEncoder,
    max_attempts: u32,
    client: OnceCell<aws_sdk_kinesis::Client>,
}

/// A record ready to put: its partition key and data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KinesisRecord {
    pub partition_key: String,
    pub data: Vec<u8>,
}

impl KinesisRecord {
    fn bytes(&self) -> usize {
        self.partition_key.len() + self.data.len()
    }
}

/// The Kinesis sink's own options, besides the encoder's.
pub const SINK_OPTIONS: &[&str] = &["max.attempts"];

impl KinesisSink {
    pub fn new(stream: &str, options: &BTreeMap<String, String>) -> Result<Self> {
        if stream.is_empty() {
            return Err(sink_error(stream, "LOCATION must name the stream"));
        }
        let encoder =
            RowEncoder::from_options(options, stream).map_err(|e| sink_error(stream, e))?;
        let max_attempts = match options.get("max.attempts") {
            Some(v) => v
                .parse::<u32>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| sink_error(stream, format!("max.attempts = {v:?}")))?,
            None => 20,
        };
        Ok(KinesisSink {
            stream: stream.to_string(),
            encoder,
            max_attempts,
            client: OnceCell::new(),
        })
    }

    async fn client(&self) -> &aws_sdk_kinesis::Client {
        self.client
            .get_or_init(skein_clients::kinesis::client)
            .await
    }

    /// The records of `batches`, checked against Kinesis' per-record limits.
    pub fn records(&self, batches: &[RecordBatch]) -> Result<Vec<KinesisRecord>> {
        let mut out = Vec::new();
        for batch in batches.iter().filter(|b| b.num_rows() > 0) {
            let rows = self
                .encoder
                .encode(batch)
                .map_err(|e| sink_error(&self.stream, e))?;
            for row in rows {
                out.push(self.record(row)?);
            }
        }
        Ok(out)
    }

    fn record(&self, row: EncodedRow) -> Result<KinesisRecord> {
        let partition_key = match row.key {
            Some(k) => String::from_utf8_lossy(&k).into_owned(),
            None if self.encoder.key_column().is_some() => {
                return Err(sink_error(
                    &self.stream,
                    "a row has a null partition key (the key column must not be null)",
                ));
            }
            None => {
                let mut h = std::collections::hash_map::DefaultHasher::new();
                row.value.hash(&mut h);
                format!("{:016x}", h.finish())
            }
        };
        let chars = partition_key.chars().count();
        if chars == 0 || chars > MAX_PARTITION_KEY_CHARS {
            return Err(sink_error(
                &self.stream,
                format!("partition key of {chars} characters; Kinesis takes 1 to 256"),
            ));
        }
        let record = KinesisRecord {
            partition_key,
            data: row.value,
        };
        if record.bytes() > MAX_RECORD_BYTES {
            return Err(sink_error(
                &self.stream,
                format!(
                    "a record of {} bytes (data and key) exceeds Kinesis' 1 MiB limit",
                    record.bytes()
                ),
            ));
        }
        Ok(record)
    }

    /// Puts `records`, retrying only the entries that failed. Returns the
    /// number of PutRecords calls made.
    pub async fn put(&self, records: Vec<KinesisRecord>) -> Result<u64> {
        let client = self.client().await;
        let mut calls = 0u64;
        for chunk in put_records_chunks(records) {
            let mut pending = chunk;
            let mut backoff = Backoff::new(std::time::Duration::from_secs(2));
            let mut attempt = 0u32;
            loop {
                attempt += 1;
                let entries: Vec<PutRecordsRequestEntry> = pending
                    .iter()
                    .map(|r| {
                        PutRecordsRequestEntry::builder()
                            .data(Blob::new(r.data.clone()))
                            .partition_key(&r.partition_key)
                            .build()
                            .map_err(|e| sink_error(&self.stream, e))
                    })
                    .collect::<Result<_>>()?;
                calls += 1;
                let outcome = client
                    .put_records()
                    .stream_name(&self.stream)
                    .set_records(Some(entries))
                    .send()
                    .await;
                let last_error = match outcome {
                    Ok(resp) if resp.failed_record_count().unwrap_or(0) == 0 => break,
                    Ok(resp) => {
                        // Entries answer in request order; keep the failed ones.
                        let mut reason = String::new();
                        let failed: Vec<KinesisRecord> = resp
                            .records()
                            .iter()
                            .zip(pending.drain(..))
                            .filter(|(entry, _)| entry.error_code().is_some())
                            .map(|(entry, record)| {
                                reason = format!(
                                    "{}: {}",
                                    entry.error_code().unwrap_or_default(),
                                    entry.error_message().unwrap_or_default()
                                );
                                record
                            })
                            .collect();
                        tracing::debug!(
                            stream = %self.stream,
                            failed = failed.len(),
                            "PutRecords partly failed; retrying those entries"
                        );
                        pending = failed;
                        if pending.is_empty() {
                            break;
                        }
                        reason
                    }
                    Err(e) => format!("{}", aws_sdk_kinesis::error::DisplayErrorContext(&e)),
                };
                if attempt >= self.max_attempts {
                    return Err(sink_error(
                        &self.stream,
                        format!(
                            "{} records still failing after {attempt} attempts; last error: {last_error}",
                            pending.len()
                        ),
                    ));
                }
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
        Ok(calls)
    }
}

/// Creates `stream` with `shards` shards unless it exists, and waits until
/// it is ACTIVE. Returns whether it was created.
pub async fn ensure_stream(stream: &str, shards: i32) -> Result<bool> {
    use aws_sdk_kinesis::types::StreamStatus;
    let client = skein_clients::kinesis::client().await;
    let describe = |client: aws_sdk_kinesis::Client| async move {
        client
            .describe_stream_summary()
            .stream_name(stream)
            .send()
            .await
    };
    let created = match describe(client.clone()).await {
        Ok(_) => false,
        Err(e)
            if e.as_service_error()
                .is_some_and(|s| s.is_resource_not_found_exception()) =>
        {
            client
                .create_stream()
                .stream_name(stream)
                .shard_count(shards)
                .send()
                .await
                .map_err(|e| sink_error(stream, ConnectorError::kinesis("CreateStream", e)))?;
            true
        }
        Err(e) => {
            return Err(sink_error(
                stream,
                ConnectorError::kinesis("DescribeStreamSummary", e),
            ));
        }
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let summary = describe(client.clone())
            .await
            .map_err(|e| sink_error(stream, ConnectorError::kinesis("DescribeStreamSummary", e)))?;
        let status = summary
            .stream_description_summary()
            .map(|s| s.stream_status().clone());
        if status == Some(StreamStatus::Active) {
            return Ok(created);
        }
        if std::time::Instant::now() > deadline {
            return Err(sink_error(
                stream,
                format!("not ACTIVE after 60 s ({status:?})"),
            ));
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// Splits records into PutRecords calls of at most 500 records and 5 MiB.
pub fn put_records_chunks(records: Vec<KinesisRecord>) -> Vec<Vec<KinesisRecord>> {
    let mut chunks = vec![];
    let mut current: Vec<KinesisRecord> = vec![];
    let mut bytes = 0usize;
    for r in records {
        if !current.is_empty()
            && (current.len() == MAX_RECORDS_PER_CALL || bytes + r.bytes() > MAX_BYTES_PER_CALL)
        {
            chunks.push(std::mem::take(&mut current));
            bytes = 0;
        }
        bytes += r.bytes();
        current.push(r);
    }
    if !current.is_empty() {
        chunks.push(current);
    }
    chunks
}

#[async_trait]
impl Sink for KinesisSink {
    async fn write(&self, write: SinkWrite<'_>) -> Result<()> {
        let SinkRows::Append(rows) = &write.rows else {
            return Err(sink_error(
                &self.stream,
                "a KINESIS table only appends rows, and this write holds an updating result's changes",
            ));
        };
        let records = self.records(rows)?;
        self.put(records).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    fn rec(key_len: usize, data_len: usize) -> KinesisRecord {
        KinesisRecord {
            partition_key: "k".repeat(key_len),
            data: vec![b'x'; data_len],
        }
    }

    #[test]
    fn chunks_respect_record_and_byte_limits() {
        let chunks = put_records_chunks((0..1201).map(|_| rec(4, 10)).collect());
        let sizes: Vec<usize> = chunks.iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![500, 500, 201]);
        // 1 MiB - 10 bytes each: five fit in 5 MiB, the sixth starts a call.
        let big = MAX_RECORD_BYTES - 10;
        let chunks = put_records_chunks((0..11).map(|_| rec(10, big - 10)).collect());
        let sizes: Vec<usize> = chunks.iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![5, 5, 1]);
        for c in &chunks {
            assert!(c.iter().map(KinesisRecord::bytes).sum::<usize>() <= MAX_BYTES_PER_CALL);
        }
        assert!(put_records_chunks(vec![]).is_empty());
    }

    #[test]
    fn partition_keys_come_from_the_key_column_and_are_checked() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("user", DataType::Utf8, true),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(vec![1, 2])),
                Arc::new(StringArray::from(vec![Some("ann"), None])),
            ],
        )
        .unwrap();
        let opts = |key: &str| -> BTreeMap<String, String> {
            [("key".to_string(), key.to_string())].into_iter().collect()
        };
        let sink = KinesisSink::new("s", &opts("id")).unwrap();
        let recs = sink.records(std::slice::from_ref(&batch)).unwrap();
        assert_eq!(recs[0].partition_key, "1");
        assert_eq!(recs[1].partition_key, "2");
        let sink = KinesisSink::new("s", &opts("user")).unwrap();
        let err = sink
            .records(std::slice::from_ref(&batch))
            .unwrap_err()
            .to_string();
        assert!(err.contains("null partition key"), "{err}");
        let sink = KinesisSink::new("s", &BTreeMap::new()).unwrap();
        let recs = sink.records(std::slice::from_ref(&batch)).unwrap();
        assert_eq!(recs[0].partition_key.len(), 16);
        assert_ne!(recs[0].partition_key, recs[1].partition_key);
        let oversized = KinesisSink::new("s", &BTreeMap::new())
            .unwrap()
            .record(EncodedRow {
                key: None,
                value: vec![0; MAX_RECORD_BYTES],
            });
        assert!(oversized.unwrap_err().to_string().contains("1 MiB"));
        assert!(KinesisSink::new("", &BTreeMap::new()).is_err());
    }
}
