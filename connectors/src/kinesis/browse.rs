//! The streams of the Kinesis endpoint the environment names, for `skein
//! ui`: each with its open shards, and a sample of a stream's most recent
//! records with the table that would read them. Kinesis has no offsets to
//! count records by, and is read only forwards: a sample reads each open
//! shard from an hour ago (or its oldest record) to its end, keeping the
//! newest, within a time bound.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use aws_sdk_kinesis::primitives::DateTime;
use aws_sdk_kinesis::types::ShardIteratorType;
use skein_clients::error::ConnectorError;
use skein_engine::catalog::browse::{
    PartitionRange, Sample, SampledRecord, SourceBrowser, StreamListing,
};
use skein_formats::sniff::{sample, shown};

use super::KIND;
use super::shards::list_shards;

/// How far back a sample starts reading.
const SAMPLE_FROM: Duration = Duration::from_secs(3600);
/// How long a sample may read.
const SAMPLE_TIMEOUT: Duration = Duration::from_secs(10);
/// The most records a sample reads per shard before it gives up reaching
/// the end (the newest kept are then not the newest).
const SAMPLE_READ_LIMIT: usize = 20_000;

/// Lists and samples the streams of the endpoint in the environment.
pub struct KinesisBrowser;

fn failed(e: ConnectorError) -> skein_engine::EngineError {
    e.for_source(KIND)
}

async fn open_shards(
    client: &aws_sdk_kinesis::Client,
    stream: &str,
) -> Result<Vec<String>, ConnectorError> {
    Ok(list_shards(client, stream)
        .await?
        .into_iter()
        .filter(|s| !s.closed)
        .map(|s| s.id)
        .collect())
}

#[async_trait]
impl SourceBrowser for KinesisBrowser {
    async fn list(
        &self,
        _options: &BTreeMap<String, String>,
    ) -> skein_engine::Result<Vec<StreamListing>> {
        let client = skein_clients::kinesis::client().await;
        let mut names = vec![];
        let mut start: Option<String> = None;
        loop {
            let page = client
                .list_streams()
                .set_exclusive_start_stream_name(start.clone())
                .send()
                .await
                .map_err(|e| failed(ConnectorError::kinesis("ListStreams", e)))?;
            names.extend(page.stream_names().iter().cloned());
            if !page.has_more_streams() || page.stream_names().is_empty() {
                break;
            }
            start = names.last().cloned();
        }
        names.sort();
        let mut out = vec![];
        for name in names {
            let shards = open_shards(&client, &name).await.map_err(failed)?;
            out.push(StreamListing {
                name,
                partitions: shards
                    .into_iter()
                    .map(|id| PartitionRange {
                        partition: id,
                        start: None,
                        end: None,
                    })
                    .collect(),
                records: None,
            });
        }
        Ok(out)
    }

    async fn sample(
        &self,
        options: &BTreeMap<String, String>,
        stream: &str,
        wanted: usize,
    ) -> skein_engine::Result<Sample> {
        let client = skein_clients::kinesis::client().await;
        let shards = open_shards(&client, stream).await.map_err(failed)?;
        let since = SystemTime::now()
            .checked_sub(SAMPLE_FROM)
            .unwrap_or(UNIX_EPOCH);
        let started = Instant::now();
        let mut kept: Vec<(i64, SampledRecord, Vec<u8>)> = vec![];
        for shard in shards {
            let it = client
                .get_shard_iterator()
                .stream_name(stream)
                .shard_id(&shard)
                .shard_iterator_type(ShardIteratorType::AtTimestamp)
                .timestamp(DateTime::from(since))
                .send()
                .await
                .map_err(|e| failed(ConnectorError::kinesis("GetShardIterator", e)))?;
            let mut iterator = it.shard_iterator().map(str::to_string);
            let mut newest: VecDeque<(i64, SampledRecord, Vec<u8>)> = VecDeque::new();
            let mut read = 0usize;
            while let Some(it) = iterator.take() {
                if started.elapsed() > SAMPLE_TIMEOUT || read >= SAMPLE_READ_LIMIT {
                    break;
                }
                let page = client
                    .get_records()
                    .shard_iterator(it)
                    .limit(1000)
                    .send()
                    .await
                    .map_err(|e| failed(ConnectorError::kinesis("GetRecords", e)))?;
                for r in page.records() {
                    read += 1;
                    let ms = r
                        .approximate_arrival_timestamp()
                        .and_then(|t| t.to_millis().ok());
                    let value = r.data().as_ref();
                    newest.push_back((
                        ms.unwrap_or(i64::MIN),
                        SampledRecord {
                            partition: shard.clone(),
                            offset: r.sequence_number().to_string(),
                            timestamp_ms: ms,
                            key: Some(r.partition_key().to_string()),
                            value: shown(value),
                        },
                        value.to_vec(),
                    ));
                    if newest.len() > wanted {
                        newest.pop_front();
                    }
                }
                // At the end of the shard: nothing behind, or no more pages.
                let caught_up = page.millis_behind_latest() == Some(0) || page.records().is_empty();
                iterator = page.next_shard_iterator().map(str::to_string);
                if caught_up {
                    break;
                }
            }
            kept.extend(newest);
        }
        let (options, stream) = (options.clone(), stream.to_string());
        // The registry's client waits on its own runtime.
        tokio::task::spawn_blocking(move || {
            sample(kept, wanted, &options, &stream, BTreeMap::new()).map_err(failed)
        })
        .await
        .map_err(|e| skein_engine::EngineError::Context(format!("sampling a stream: {e}")))?
    }
}
