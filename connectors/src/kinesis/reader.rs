//! The shard reader of a Kinesis source: the shards it owns and where
//! each stands, listing and renewing iterators as shards split and merge,
//! and the pull itself (live, or a replay up to a logged epoch's end).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::primitives::DateTime;
use aws_sdk_kinesis::types::ShardIteratorType;
use skein_engine::backoff::Backoff;
use skein_engine::error::Result as EngineResult;
use skein_engine::payload::SourceOffset;
use skein_engine::source::{EpochSpec, MicroBatch, PartitionProgress};
use tracing::warn;

use super::shards::{ListedShard, list_shards, owner, ready};
use crate::error::ConnectorError;

use super::config::KinesisStartup;
use super::stream::Stream;
use tokio::sync::Mutex;

/// GetRecords returns at most this many records per call.
const MAX_RECORDS_PER_GET: i32 = 10_000;

/// One owned shard and where its reader stands.
pub(super) struct Shard {
    pub(super) id: String,
    pub(super) parents: Vec<String>,
    /// Where a shard with nothing read yet starts: the configured startup
    /// for shards of the first listing, the trim horizon for children
    /// that appeared later (all their records come after their parents').
    pub(super) from_startup: bool,
    /// `None` until needed (or after a seek): fetched before the next read.
    pub(super) iterator: Option<String>,
    /// The last sequence number read, where a renewed iterator starts.
    pub(super) last_sequence: Option<String>,
    /// Read to its end (or gone from the stream): never read again.
    pub(super) finished: bool,
}

#[derive(Default)]
pub(super) struct ShardReader {
    /// The owned shards in shard-id order; append-only, so indexes hold.
    pub(super) shards: Vec<Shard>,
    /// The stream's shards as last listed.
    pub(super) listed: BTreeMap<String, ListedShard>,
    pub(super) listed_once: bool,
    /// Pulls so far: which shard a pull reads first turns with it.
    pub(super) pulls: usize,
}

impl ShardReader {
    pub(super) fn is_ready(&self, shard: &Shard) -> bool {
        !shard.finished
            && ready(&shard.parents, &self.listed, |p| {
                self.shards.iter().find(|s| s.id == p).map(|s| s.finished)
            })
    }
}

impl Stream {
    /// Lists the stream's shards and takes the owned ones not yet known.
    /// A known shard gone from the listing (expired, or deleted by an
    /// emulator that drops closed parents) is finished: nothing of it can
    /// be read any more.
    pub(super) async fn refresh(
        &self,
        reader: &mut ShardReader,
        spec: &EpochSpec,
    ) -> EngineResult<()> {
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

    pub(super) fn gone(&self, shard: &mut Shard) {
        warn!(stream = %self.config.stream, shard = %shard.id, last = ?shard.last_sequence,
            "shard is gone from the stream; reading it ends here");
        shard.finished = true;
        shard.iterator = None;
    }

    /// The reader, opened (listed) on first use: planning must not need AWS.
    pub(super) async fn reader<'a>(
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
    pub(super) async fn renew(
        &self,
        client: &Client,
        shard: &Shard,
    ) -> EngineResult<Option<String>> {
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
}

/// Where a replay stops in a shard: the last sequence number the logged
/// pull read, and whether it read the shard to its end.
#[derive(Debug, Clone)]
pub(super) struct Target {
    pub(super) last: Option<String>,
    pub(super) end: bool,
}

use skein_engine::source::{partition_number as shard_number, position_after as sequence_after};

impl Stream {
    /// The logged offset of shard `id` among `at`.
    pub(super) fn logged<'a>(&self, at: &'a [SourceOffset], id: &str) -> Option<&'a SourceOffset> {
        at.iter()
            .find(|o| o.source == self.config.stream && o.partition == shard_number(id))
    }

    /// A pull, or with `targets` (shard number -> where the logged pull
    /// stopped) a replay that reads exactly up to them. A pull lists the
    /// shards first and again after a shard ends, so children of a shard
    /// finished in this pull are read in it too.
    pub(super) async fn pull_to(
        &self,
        slot: &Mutex<Option<ShardReader>>,
        spec: EpochSpec,
        targets: Option<BTreeMap<i32, Target>>,
    ) -> EngineResult<MicroBatch> {
        let mut guard = slot.lock().await;
        let reader = self.reader(&mut guard, &spec).await?;
        let client = self.client().await;
        let started = Instant::now();
        let (budget, time) = match &targets {
            Some(_) => (usize::MAX, Duration::from_secs(60)),
            None => (self.config.max_records_per_pull, self.config.pull_timeout),
        };
        let mut data: Vec<(usize, String, Vec<u8>)> = vec![];
        let mut backoff = Backoff::new(Duration::from_secs(1));
        let mut caught_up = vec![];
        if targets.is_none() {
            reader.pulls += 1;
        }
        let mut list = true;
        while list {
            list = false;
            self.refresh(reader, &spec).await?;
            caught_up.resize(reader.shards.len(), false);
            // The shards to read now with their replay targets (a replay
            // reads what the log says, a pull what is ready), starting at a
            // shard that turns with every pull. Each takes an equal share of
            // what is left of the budget: a small budget still moves every
            // shard (and so event time, which closes windows at the slowest).
            let count = reader.shards.len();
            let first = reader.pulls % count.max(1);
            let reads: Vec<(usize, Option<Target>)> = (0..count)
                .map(|k| (first + k) % count)
                .filter_map(|index| {
                    let shard = &reader.shards[index];
                    match targets.as_ref() {
                        Some(t) => t
                            .get(&shard_number(&shard.id))
                            .filter(|t| t.end || t.last.is_some())
                            .map(|t| (index, Some(t.clone()))),
                        None => reader.is_ready(shard).then_some((index, None)),
                    }
                })
                .collect();
            let sharing = reads.len();
            for (k, (index, target)) in reads.into_iter().enumerate() {
                let share = (budget.saturating_sub(data.len()) / (sharing - k)).max(1);
                let share_ends = data.len().saturating_add(share).min(budget);
                let shard = &mut reader.shards[index];
                let was_finished = shard.finished;
                let stop_at = target
                    .as_ref()
                    .filter(|t| !t.end)
                    .and_then(|t| t.last.clone());
                loop {
                    if data.len() >= share_ends || started.elapsed() >= time || shard.finished {
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
                    let limit =
                        (share_ends - data.len()).clamp(1, MAX_RECORDS_PER_GET as usize) as i32;
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
    pub(super) async fn replayable(
        &self,
        slot: &Mutex<Option<ShardReader>>,
        spec: EpochSpec,
        from: &[SourceOffset],
        to: &[SourceOffset],
    ) -> EngineResult<()> {
        let mut guard = slot.lock().await;
        let reader = self.reader(&mut guard, &spec).await?;
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
    pub(super) fn check_replayed(&self, shard: &Shard, t: &Target) -> EngineResult<()> {
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
