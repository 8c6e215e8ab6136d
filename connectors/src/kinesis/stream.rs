//! What a Kinesis source's shard reader (`reader.rs`) and its pushed
//! batches share: the stream's client, the table's decoder, and the
//! dead-letter stream undecodable records go to.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::PutRecordsRequestEntry;
use datafusion::arrow::datatypes::SchemaRef;
use skein_engine::backoff::Backoff;
use skein_engine::error::{Cause, EngineError, Result as EngineResult};
use skein_engine::source::MicroBatch;
use tokio::sync::OnceCell;
use tracing::warn;

use super::config::{KinesisSourceConfig, source_name};
use crate::error::{ConnectorError, Result};
use skein_formats::decode::RecordDecoder;
use skein_formats::rejected::{DEAD_LETTER_PREFIX_BYTES, LetterRecord};

/// One Kinesis stream as a source instance reads it.
pub(super) struct Stream {
    pub(super) config: Arc<KinesisSourceConfig>,
    pub(super) decoder: Arc<RecordDecoder>,
    pub(super) client: OnceCell<Client>,
    pub(super) dead_letters: Arc<AtomicU64>,
}

/// A record that failed to decode, kept until it is dead-lettered.
pub(super) struct Undecodable {
    pub(super) shard: String,
    pub(super) sequence_number: String,
    pub(super) reason: String,
    pub(super) data: Vec<u8>,
}

impl Stream {
    pub(super) fn new(config: KinesisSourceConfig, schema: SchemaRef) -> Result<Self> {
        let decoder = RecordDecoder::new(schema, config.format.clone(), config.max_record_bytes)?;
        Ok(Stream {
            config: Arc::new(config),
            decoder: Arc::new(decoder),
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
    pub(super) fn dead_letters(&self) -> u64 {
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
