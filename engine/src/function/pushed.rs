//! A source stage fed by a platform's pushes (batches of a Lambda Kinesis
//! event-source mapping) instead of its own pulls.
//!
//! Where the source stage writes the sink itself, a batch is run and
//! written on its own. Where windows or aggregates follow, every batch
//! becomes an epoch of the offsets log: the entry (shard positions before
//! and after, the event-time clock, the watermark) is created before
//! anything leaves, the epoch is sent on as a pull's would be, and it is
//! committed once the synchronous hops have answered. A batch the platform
//! delivers again finds its records taken in the log and is not counted
//! twice; an epoch logged but not sent (a failure, a recycled instance) is
//! read again from the stream and sent before anything new is taken.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::record_batch::RecordBatch;

use super::source_stage::{SourceStage, bind_sources};
use super::{EpochMarks, Response, SourceReader, Stage, StageFunction};
use crate::checkpoint::{
    CheckpointStore, Commit, MemberObject, OffsetsEntry, PoisonRecord, TableRead,
};
use crate::context::NextHop;
use crate::error::{EngineError, Result};
use crate::payload::SourceOffset;
use crate::source::{EpochSpec, PartitionProgress, PushedRecord, partition_number, position_after};
use crate::watermark::{SourceClock, Watermark};

/// What a pushed source member knows of its offsets log.
#[derive(Debug, Default)]
pub(super) struct PushedLog {
    /// Read from the log (done by a cold instance, and again after a
    /// failed send).
    ready: bool,
    next_epoch: u64,
    /// Per shard, the last position taken.
    taken: Vec<SourceOffset>,
    /// Records of the logged epochs that could not be taken, by (shard,
    /// position): a redelivery reports them again.
    poison: BTreeMap<(String, String), PoisonRecord>,
}

impl PushedLog {
    fn taken_in(&self, partition: &str) -> Option<&str> {
        let n = partition_number(partition);
        self.taken
            .iter()
            .find(|o| o.partition == n)
            .and_then(|o| o.position.as_deref())
    }

    fn absorb(&mut self, table: &str, entry: &OffsetsEntry) {
        if let Some(read) = entry.tables.iter().find(|r| r.table == table) {
            self.taken = read.to.clone();
        }
        for p in &entry.poison {
            self.poison
                .insert((p.partition.clone(), p.position.clone()), p.clone());
        }
    }
}

/// `at` with `partition` standing at `position`.
fn stand(at: &mut Vec<SourceOffset>, source: &str, partition: &str, position: &str) {
    let n = partition_number(partition);
    match at.iter_mut().find(|o| o.partition == n) {
        Some(o) => o.position = Some(position.to_string()),
        None => at.push(SourceOffset {
            source: source.to_string(),
            partition: n,
            offset: 0,
            position: Some(position.to_string()),
        }),
    }
}

/// What a pushed source member keeps between batches.
#[derive(Debug)]
pub(super) struct PushedState {
    /// The table's event-time clock, when it has event time.
    clock: Option<SourceClock>,
    log: PushedLog,
}

impl PushedState {
    pub(super) fn new(clock: Option<SourceClock>) -> Self {
        PushedState {
            clock,
            log: PushedLog::default(),
        }
    }

    /// The pushed records not yet taken, and the poison records of a
    /// redelivery's records that are (reported again).
    fn fresh(&self, records: &[PushedRecord]) -> (Vec<PushedRecord>, Vec<PoisonRecord>) {
        // Records at or before a shard's taken position are in the log
        // already: a redelivery.
        let mut again = vec![];
        let fresh = records
            .iter()
            .filter(|r| match self.log.taken_in(&r.partition) {
                Some(t) if !position_after(&r.position, t) => {
                    let key = (r.partition.clone(), r.position.clone());
                    if let Some(p) = self.log.poison.get(&key) {
                        again.push(p.clone());
                    }
                    false
                }
                _ => true,
            })
            .cloned()
            .collect();
        (fresh, again)
    }

    /// The log entry of an epoch that takes `fresh` (decoded as `mb`), and
    /// the watermark it sends: shard positions before and after, the clock.
    fn entry_for(
        &mut self,
        table: &str,
        stream: &str,
        fresh: &[PushedRecord],
        batches: &[RecordBatch],
        poison: Vec<PoisonRecord>,
    ) -> Result<(OffsetsEntry, Watermark)> {
        let from = self.log.taken.clone();
        let mut to = from.clone();
        let mut progress: Vec<PartitionProgress> = vec![];
        for r in fresh {
            stand(&mut to, stream, &r.partition, &r.position);
            if !progress.iter().any(|p| p.partition == r.partition) {
                // A push hands over what the shard holds: caught up, so a
                // shard that goes quiet turns idle after the timeout.
                progress.push(PartitionProgress {
                    partition: r.partition.clone(),
                    batches: (0..batches.len()).collect(),
                    caught_up: true,
                    ..Default::default()
                });
            }
        }
        let (watermark, clock) = match self.clock.as_mut() {
            Some(clock) => {
                let now = Instant::now();
                clock.observe(batches, &progress, now)?;
                (clock.watermark(now), Some(clock.save()))
            }
            None => (Watermark::default(), None),
        };
        let entry = OffsetsEntry {
            tables: vec![TableRead {
                table: table.to_string(),
                from,
                to,
                clock,
            }],
            watermark: watermark.value,
            idle: watermark.idle,
            drained: false,
            finished: false,
            epochs: None,
            poison,
        };
        Ok((entry, watermark))
    }
}

impl StageFunction {
    fn refuse(&self, reason: &str) -> EngineError {
        EngineError::invocation_failed(self.name.clone(), reason.to_string())
    }

    /// Run this source stage on records a platform pushed to it, instead
    /// of pulling. `batch_id` names the batch (a retried batch keeps it);
    /// where the stage writes the sink it is the epoch of the write, so a
    /// sink that names writes by epoch replaces a retried batch's output.
    pub async fn run_pushed(&self, batch_id: u64, records: &[PushedRecord]) -> Result<Response> {
        let response = match &self.stage {
            Stage::Source(stage) => stage.take_pushed(self, batch_id, records).await,
            _ => Err(self.refuse(ONE_TABLE)),
        };
        // A batch written straight to the sink logs nothing: its counts
        // have no object to ride in.
        if let Some(cs) = &self.env.checkpoints
            && let Err(e) = self.tally.save(cs, self.ctx.stage, self.ctx.member).await
        {
            tracing::warn!(stage = %self.name, error = %e, "writing the member's counts");
        }
        response
    }

    /// Run every output of the stage on `batches` of `table` and route it.
    async fn run_outputs(
        &self,
        qid: &str,
        epoch: u64,
        watermark: Watermark,
        table: &str,
        batches: Vec<RecordBatch>,
        offsets: Vec<SourceOffset>,
    ) -> Result<u64> {
        let bound = [(table.to_string(), batches)].into_iter().collect();
        let mut rows_out = 0;
        for output in &self.outputs {
            let plan = bind_sources(&output.plan, &bound)?;
            // Every pushed epoch is committed once sent.
            let marks = EpochMarks {
                last: false,
                checkpoint: true,
            };
            let header = self.header(output, qid, epoch, watermark, marks, offsets.clone());
            rows_out += self.run_and_route(output, plan, header).await?;
        }
        Ok(rows_out)
    }

    /// Send one logged epoch on, then commit it: the hops are synchronous,
    /// so every stage after this one has run it.
    async fn send_pushed(
        &self,
        cs: &CheckpointStore,
        epoch: u64,
        watermark: Watermark,
        table: &str,
        batches: Vec<RecordBatch>,
        offsets: Vec<SourceOffset>,
    ) -> Result<u64> {
        let qid = &self.ctx.query_code;
        let rows_out = self
            .run_outputs(qid, epoch, watermark, table, batches, offsets)
            .await?;
        let commit = Commit { epoch, last: false };
        cs.commit(commit, None, vec![], &Default::default()).await?;
        cs.forget_before(epoch, &Default::default()).await?;
        Ok(rows_out)
    }

    /// A pushed epoch needs the query's checkpoint store and one source
    /// member.
    fn pushed_store(&self) -> Result<Arc<CheckpointStore>> {
        let cs = self.checkpoints().cloned().ok_or_else(|| {
            self.refuse(
                "pushed records that feed windows or aggregates need the query's checkpoint \
                 store (skein deploy sets one)",
            )
        })?;
        if self.ctx.members != 1 {
            return Err(self.refuse(
                "pushed records that feed windows or aggregates need one source member: \
                 declare the table with 'parallelism' '1'",
            ));
        }
        Ok(cs)
    }
}

/// Why a stage refuses pushed records.
const ONE_TABLE: &str = "pushed records need a stage that reads exactly one source table";

impl SourceStage {
    async fn take_pushed(
        &self,
        f: &StageFunction,
        batch_id: u64,
        records: &[PushedRecord],
    ) -> Result<Response> {
        let [reader] = self.readers.as_slice() else {
            return Err(f.refuse(ONE_TABLE));
        };
        match f.outputs.as_slice() {
            [output] if matches!(output.next, NextHop::Sink(_)) => {}
            _ => return self.run_pushed_epoch(f, reader, records).await,
        }
        let mb = decode_pushed(f, reader, records).await?;
        let poison = poison_of(records, &mb.rejected);
        let events = rows(&mb.batches);
        let (qid, watermark) = ("pushed", Watermark::default());
        let rows_out = f
            .run_outputs(
                qid,
                batch_id,
                watermark,
                &reader.table,
                mb.batches,
                mb.offsets,
            )
            .await?;
        Ok(Response {
            events,
            rows_out,
            poison,
            ..Response::status("ran")
        })
    }

    /// A pushed batch as the next epoch of the offsets log.
    async fn run_pushed_epoch(
        &self,
        f: &StageFunction,
        reader: &SourceReader,
        records: &[PushedRecord],
    ) -> Result<Response> {
        let cs = f.pushed_store()?;
        let stream = f.ctx.sources[0].config.location.clone();
        let mut state = self.pushed.lock().await;
        if !state.log.ready {
            resend_logged(f, &cs, reader, &mut state).await?;
        }
        let (fresh, again) = state.fresh(records);
        if fresh.is_empty() {
            return Ok(Response {
                poison: again,
                ..Response::status("duplicate")
            });
        }
        let epoch = state.log.next_epoch;
        let mb = decode_pushed(f, reader, &fresh).await?;
        let poison = poison_of(&fresh, &mb.rejected);
        let (entry, watermark) =
            state.entry_for(&reader.table, &stream, &fresh, &mb.batches, poison.clone())?;
        let object = MemberObject {
            offsets: Some(entry.clone()),
            tally: f.tally.carry(),
            state: None,
        };
        if !cs
            .put_member_new(f.ctx.stage, f.ctx.member, epoch, object)
            .await?
        {
            state.log.ready = false;
            return Err(f.refuse(&format!(
                "epoch {epoch} of the offsets log was taken by another instance of this \
                 function; the batch is retried"
            )));
        }
        state.log.absorb(&reader.table, &entry);
        state.log.next_epoch = epoch + 1;
        let events = rows(&mb.batches);
        let table = &reader.table;
        let sent = f
            .send_pushed(&cs, epoch, watermark, table, mb.batches, mb.offsets)
            .await;
        // Logged but maybe not sent: the next batch sends it first.
        state.log.ready &= sent.is_ok();
        Ok(Response {
            events,
            rows_out: sent?,
            poison,
            ..Response::status("ran")
        })
    }
}

async fn decode_pushed(
    f: &StageFunction,
    reader: &SourceReader,
    records: &[PushedRecord],
) -> Result<crate::source::MicroBatch> {
    let mb = reader
        .source
        .decode_pushed(records)
        .await
        .map_err(|e| e.at_source(&reader.table, &f.name))?;
    f.tally.count(|t| t.dead_letters += mb.dead_letters);
    if let Some(reason) = &mb.dead_letter_reason {
        f.tally
            .measure(|l| l.reason("dead letter", &reader.table, reason.clone()));
    }
    Ok(mb)
}

/// Stand where the offsets log ends: after the last commit's entry,
/// reading every epoch logged after it again from the stream and sending
/// it (a stage that ran it already drops the duplicate).
async fn resend_logged(
    f: &StageFunction,
    cs: &CheckpointStore,
    reader: &SourceReader,
    state: &mut PushedState,
) -> Result<()> {
    let (entries, next_epoch) = logged_entries(f, cs).await?;
    let mut log = PushedLog::default();
    for (resend, entry) in entries {
        let read = entry.tables.iter().find(|r| r.table == reader.table);
        if let (Some(clock), Some(saved)) =
            (state.clock.as_mut(), read.and_then(|r| r.clock.as_ref()))
        {
            clock.restore(saved, Instant::now());
        }
        if let (Some(e), Some(read)) = (resend, read) {
            let spec = EpochSpec {
                instance: 0,
                instances: 1,
                epoch: e,
                epochs: None,
            };
            let mb = reader
                .source
                .replay(spec, &read.from, &read.to)
                .await
                .map_err(|err| {
                    err.at_source(
                        &reader.table,
                        format!("{}: reading pushed epoch {e} again", f.name),
                    )
                })?;
            let watermark = Watermark {
                value: entry.watermark,
                idle: entry.idle,
            };
            f.send_pushed(cs, e, watermark, &reader.table, mb.batches, mb.offsets)
                .await?;
            tracing::info!(stage = %f.name, epoch = e, "pushed epoch sent again from the offsets log");
        }
        log.absorb(&reader.table, &entry);
    }
    log.next_epoch = next_epoch;
    log.ready = true;
    state.log = log;
    Ok(())
}

/// The last commit's entry (`None`: not to send again) and every entry
/// logged after it (with its epoch); the epoch after them.
async fn logged_entries(
    f: &StageFunction,
    cs: &CheckpointStore,
) -> Result<(Vec<(Option<u64>, OffsetsEntry)>, u64)> {
    let (stage, member) = (f.ctx.stage, f.ctx.member);
    let commit = cs.committed().await?;
    let mut epoch = commit.map_or(0, |c| c.epoch + 1);
    let mut entries = vec![];
    let mut counted = None;
    if let Some(c) = commit
        && let Some(object) = cs.member(stage, member, c.epoch).await?
    {
        counted = object.tally;
        entries.extend(object.offsets.map(|entry| (None, entry)));
    }
    while let Some(object) = cs.member(stage, member, epoch).await? {
        counted = object.tally.or(counted);
        let Some(entry) = object.offsets else { break };
        entries.push((Some(epoch), entry));
        epoch += 1;
    }
    f.tally.counted_before(counted);
    Ok((entries, epoch))
}

fn rows(batches: &[RecordBatch]) -> u64 {
    batches.iter().map(|b| b.num_rows() as u64).sum()
}

/// The records a decode held back, in order.
fn poison_of(records: &[PushedRecord], rejected: &[(usize, String)]) -> Vec<PoisonRecord> {
    let mut out: Vec<PoisonRecord> = rejected
        .iter()
        .filter_map(|(i, reason)| {
            records.get(*i).map(|r| PoisonRecord {
                partition: r.partition.clone(),
                position: r.position.clone(),
                reason: reason.clone(),
            })
        })
        .collect();
    out.sort_by(|a, b| {
        if position_after(&a.position, &b.position) {
            std::cmp::Ordering::Greater
        } else if a.position == b.position {
            std::cmp::Ordering::Equal
        } else {
            std::cmp::Ordering::Less
        }
    });
    out
}
