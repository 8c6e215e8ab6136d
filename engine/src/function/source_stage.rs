//! The source stage of the generic function: pull each table once per
//! epoch, keep event time per partition, run every output on the read.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::physical_plan::ExecutionPlan;

use super::{EpochMarks, Response, StageFunction, StageState, Trigger, bind_leaves};
use crate::checkpoint::{CheckpointStore, MemberObject, OffsetsEntry, TableRead};
use crate::error::{EngineError, Result};
use crate::exec::StageInput;
use crate::source::{EpochSpec, ReplayMode};
use crate::watermark::{Watermark, WatermarkMin};

impl StageFunction {
    pub(super) async fn run_source(&self, t: Trigger) -> Result<Response> {
        if t.qid != self.ctx.query_code {
            return Err(EngineError::invocation_failed(
                self.name.clone(),
                format!(
                    "a trigger for query {:?}, not this function's {}",
                    t.qid, self.ctx.query_code
                ),
            ));
        }
        if !self.ctx.inputs.is_empty() {
            return Err(EngineError::invocation_failed(
                self.name.clone(),
                "a trigger reached a stage that takes payloads",
            ));
        }
        if self.readers.is_empty() {
            return self.run_constant(t).await;
        }
        let mut state = self.state.lock().await;
        let mut bound: BTreeMap<String, Vec<RecordBatch>> = BTreeMap::new();
        let mut offsets = vec![];
        let mut events = 0u64;
        let mut lag: Option<u64> = None;
        let mut watermark = WatermarkMin::default();
        let (mut drained, mut finished) = (true, true);
        let spec = EpochSpec {
            instance: self.ctx.member as usize,
            instances: self.ctx.members as usize,
            epoch: t.epoch,
            epochs: self.ctx.epochs,
        };
        let source_err = |table: &str, e: EngineError| e.at_source(table, &self.name);
        let checkpoints = self.checkpoints().cloned();
        // With checkpoints: a cold instance stands where the log says the
        // previous epoch ended, and an epoch already in the log is read
        // again exactly as it was (an epoch the driver never fired before
        // cannot be in it).
        let mut logged = None;
        if let Some(cs) = &checkpoints {
            if !state.restored {
                self.stand_where_the_log_ends(cs, &mut state, spec, t.committed)
                    .await?;
                state.restored = true;
            }
            state.kept.committed(t.committed);
            if !t.fresh {
                logged = match state.kept.get(t.epoch) {
                    Some(entry) => Some(entry.clone()),
                    None => cs.offsets(self.ctx.stage, self.ctx.member, t.epoch).await?,
                };
                if logged.is_none() && !state.kept.taken_in() {
                    self.take_in_notes(cs, &mut state, spec, t.committed)
                        .await?;
                    logged = state.kept.get(t.epoch).cloned();
                }
            }
        }
        let mut reads = vec![];
        for (r, clock) in self.readers.iter().zip(state.clocks.iter_mut()) {
            let replayed = logged
                .as_ref()
                .and_then(|l: &OffsetsEntry| l.tables.iter().find(|x| x.table == r.table));
            let from = match (&checkpoints, replayed) {
                (Some(_), None) => r
                    .source
                    .position(spec)
                    .await
                    .map_err(|e| source_err(&r.table, e))?,
                _ => vec![],
            };
            let mb = match replayed {
                Some(read) => r.source.replay(spec, &read.from, &read.to).await,
                None => r.source.pull(spec).await,
            }
            .map_err(|e| source_err(&r.table, e))?;
            events += mb.batches.iter().map(|b| b.num_rows() as u64).sum::<u64>();
            self.tally.count(|t| t.dead_letters += mb.dead_letters);
            if let Some(reason) = &mb.dead_letter_reason {
                self.tally
                    .measure(|l| l.reason("dead letter", &r.table, reason.clone()));
            }
            let progress = mb.progress();
            for l in progress.iter().filter_map(|p| p.lag) {
                *lag.get_or_insert(0) += l;
            }
            crate::metrics::source_pull(&r.table, &progress, |p| {
                p.batches
                    .iter()
                    .filter_map(|i| mb.batches.get(*i))
                    .map(|b| b.num_rows() as u64)
                    .sum()
            });
            drained &= progress.iter().all(|p| p.drained || p.finished);
            finished &= progress.iter().all(|p| p.finished);
            match clock {
                Some(clock) => {
                    let now = Instant::now();
                    match replayed.and_then(|read| read.clock.as_ref()) {
                        Some(saved) => clock.restore(saved, now),
                        None => clock.observe(&mb.batches, &progress, now)?,
                    }
                    watermark.add(clock.watermark(now));
                }
                // No event time: constrains nothing.
                None => watermark.add(Watermark::default()),
            }
            if checkpoints.is_some() && replayed.is_none() {
                reads.push(TableRead {
                    table: r.table.clone(),
                    from,
                    to: r
                        .source
                        .position(spec)
                        .await
                        .map_err(|e| source_err(&r.table, e))?,
                    clock: clock.as_ref().map(|c| c.save()),
                });
            }
            offsets.extend(mb.offsets);
            crate::verify::tap::record(&self.ctx.query_code, &r.table, &mb.batches);
            bound.insert(r.table.clone(), mb.batches);
        }
        let mut watermark = watermark.result();
        let mut entry = None;
        match (&checkpoints, &logged) {
            // The same watermark as the first time, whatever the clock says now.
            (_, Some(l)) => {
                watermark = Watermark {
                    value: l.watermark,
                    idle: l.idle,
                };
                drained = l.drained;
                finished = l.finished;
            }
            (Some(_), None) => {
                entry = Some(OffsetsEntry {
                    tables: reads,
                    watermark: watermark.value,
                    idle: watermark.idle,
                    drained,
                    finished,
                    epochs: self.ctx.epochs,
                    poison: vec![],
                });
            }
            (None, None) => {}
        }
        // Between checkpoints the entry goes to the source's note, with the
        // entries before it since the last commit.
        let note = match (&checkpoints, &entry) {
            (Some(cs), Some(entry)) if !t.checkpoint && self.keeps_notes() => {
                // A note replaces the one before: what an earlier instance
                // kept goes into it.
                self.take_in_notes(cs, &mut state, spec, t.committed)
                    .await?;
                state.kept.insert(t.epoch, entry.clone());
                Some(state.kept.note()?)
            }
            _ => None,
        };
        drop(state);
        crate::metrics::watermark(&self.ctx.stage_name(), watermark.value);
        let marks = EpochMarks {
            last: t.last,
            checkpoint: t.checkpoint,
        };
        let watermark_ms = watermark.value.filter(|w| *w > i64::MIN);
        self.tally.measure(|l| {
            l.watermark_ms = watermark_ms.or(l.watermark_ms);
            l.epoch = Some(t.epoch);
        });
        // A changelog table's rows run through the plan by kind.
        let by_kind = self
            .readers
            .iter()
            .any(|r| r.source.changelog())
            .then(|| split_by_kind(&bound, &self.readers))
            .transpose()?;
        // The outputs are computed while the log entry is written; nothing
        // leaves before it is durable: a replay must read what this read.
        let computed = async {
            let mut out = vec![];
            for output in &self.outputs {
                out.push(match &by_kind {
                    None => {
                        let plan = bind_sources(&output.plan, &bound)?;
                        let batches = self.execute(&plan).await?;
                        (output, Computed::Rows(plan, batches))
                    }
                    Some((retracts, inserts)) => {
                        let r = bind_sources(&output.plan, retracts)?;
                        let i = bind_sources(&output.plan, inserts)?;
                        (output, Computed::Changes(self.tagged(&r, &i).await?))
                    }
                });
            }
            Ok::<_, EngineError>(out)
        };
        let logging = async {
            let (Some(cs), Some(entry)) = (&checkpoints, entry) else {
                return Ok(());
            };
            if let Some(note) = &note {
                match self.keep_note(cs, spec, note).await {
                    Ok(true) => return Ok(()),
                    Ok(false) => {}
                    Err(e) => {
                        self.state.lock().await.kept.remove(t.epoch);
                        return Err(e);
                    }
                }
                // Nowhere in the source to keep it: the store has it.
                self.state.lock().await.kept.remove(t.epoch);
            }
            self.log_entry(cs, t.epoch, entry).await
        };
        let (computed, logged) = tokio::join!(computed, logging);
        logged?;
        let mut rows_out = 0;
        for (output, computed) in computed? {
            let header = self.header(output, &t.qid, t.epoch, watermark, marks, offsets.clone());
            rows_out += match computed {
                Computed::Rows(plan, batches) => {
                    self.send_output(output, &plan, header, batches).await?
                }
                Computed::Changes(parts) => {
                    let rows = parts.iter().flatten().map(|b| b.num_rows() as u64).sum();
                    self.route_changes(output, header, Some((output.plan.schema(), parts)))
                        .await?;
                    rows
                }
            };
        }
        Ok(Response {
            status: "ran".into(),
            events,
            rows_out,
            drained,
            finished,
            lag,
            watermark_ms,
            ..Default::default()
        })
    }

    /// Write this member's object for `epoch`: its log entry, and its
    /// counts. Created only if the epoch has none: one that does was taken
    /// by another instance (or an earlier run the driver did not know of),
    /// and the epoch fails to run again from the last commit.
    async fn log_entry(&self, cs: &CheckpointStore, epoch: u64, entry: OffsetsEntry) -> Result<()> {
        let object = MemberObject {
            offsets: Some(entry),
            tally: self.tally.carry(),
            state: None,
        };
        if cs
            .put_member_new(self.ctx.stage, self.ctx.member, epoch, object)
            .await?
        {
            return Ok(());
        }
        Err(EngineError::invocation_failed(
            self.name.clone(),
            format!(
                "epoch {epoch} is in the offsets log already; it runs again from the last commit"
            ),
        ))
    }

    /// A cold source member of a checkpointing query: stand where the
    /// offsets log says the previous epoch ended, with the event-time
    /// clocks as they were then. The entry is in the source's note when
    /// the previous epoch was between checkpoints, else in the store.
    async fn stand_where_the_log_ends(
        &self,
        cs: &CheckpointStore,
        state: &mut StageState,
        spec: EpochSpec,
        committed: Option<u64>,
    ) -> Result<()> {
        for r in &self.readers {
            if r.source.replay_mode() == ReplayMode::Unsupported {
                return Err(EngineError::source_failed(
                    r.table.clone(),
                    format!(
                        "{}: this source cannot read an epoch again, so a query reading it \
                         cannot checkpoint",
                        self.name
                    ),
                ));
            }
        }
        if spec.epoch == 0 {
            return Ok(());
        }
        let previous = spec.epoch - 1;
        let object = cs.member(self.ctx.stage, self.ctx.member, previous).await?;
        let entry = match object {
            Some(object) => {
                self.tally.counted_before(object.tally);
                object.offsets
            }
            // Between checkpoints: the source's note has it.
            None => {
                self.take_in_notes(cs, state, spec, committed).await?;
                // The counts ride in the store's objects only: take the
                // commit's (what this member counted since is not known).
                let counted = match committed {
                    Some(c) => cs.member(self.ctx.stage, self.ctx.member, c).await?,
                    None => None,
                };
                self.tally.counted_before(counted.and_then(|o| o.tally));
                state.kept.get(previous).cloned()
            }
        };
        let entry = entry.ok_or_else(|| {
            EngineError::Context(format!(
                "{}: the offsets log in {} (and the note kept in the source) has no epoch \
                 {previous}, so epoch {} cannot start where it ended",
                self.name,
                cs.root(),
                spec.epoch
            ))
        })?;
        let by_epoch = self
            .readers
            .iter()
            .find(|r| r.source.replay_mode() == ReplayMode::ByEpoch);
        if let Some(r) = by_epoch
            && entry.epochs != self.ctx.epochs
        {
            let said =
                |e: Option<u64>| e.map_or("unbounded".to_string(), |n| format!("{n} epochs"));
            return Err(EngineError::source_failed(
                r.table.clone(),
                format!(
                    "{}: this table slices its input by the run's epochs, and the checkpointed \
                     run had {}, not {}: resume with the same --epochs",
                    self.name,
                    said(entry.epochs),
                    said(self.ctx.epochs)
                ),
            ));
        }
        let now = Instant::now();
        for (r, clock) in self.readers.iter().zip(state.clocks.iter_mut()) {
            let Some(read) = entry.tables.iter().find(|x| x.table == r.table) else {
                continue;
            };
            r.source
                .seek(spec, &read.to)
                .await
                .map_err(|e| e.at_source(&r.table, &self.name))?;
            if let (Some(clock), Some(saved)) = (clock.as_mut(), &read.clock) {
                clock.restore(saved, now);
            }
        }
        tracing::info!(stage = %self.name, epoch = previous, "source resumed from the offsets log");
        Ok(())
    }

    /// A stage with no input at all: its rows go out with the first epoch;
    /// later epochs send empty payloads so downstream counts complete.
    pub(super) async fn run_constant(&self, t: Trigger) -> Result<Response> {
        let mut rows_out = 0;
        for output in &self.outputs {
            let marks = EpochMarks {
                last: t.last,
                checkpoint: t.checkpoint,
            };
            let header = self.header(output, &t.qid, t.epoch, Watermark::default(), marks, vec![]);
            if t.epoch > 0 {
                self.route(output, header, None).await?;
                continue;
            }
            let plan = bind_leaves(&output.plan, &mut |input| {
                Err(EngineError::plan(format!(
                    "constant stage has an input {input:?}"
                )))
            })?;
            rows_out += self.run_and_route(output, plan, header).await?;
        }
        Ok(Response {
            status: "ran".into(),
            rows_out,
            finished: true,
            drained: true,
            ..Default::default()
        })
    }
}

/// One output of a source stage, computed before it is sent.
enum Computed {
    /// The plan's rows, per output partition.
    Rows(Arc<dyn ExecutionPlan>, Vec<Vec<RecordBatch>>),
    /// A changelog's rows run by kind, tagged, per output partition.
    Changes(Vec<Vec<RecordBatch>>),
}

/// `plan` with its source leaves bound to `bound` (per table).
/// Each table's rows split by kind, `(retractions, inserts)`: a changelog
/// table's by its op column, another's all inserts.
fn split_by_kind(
    bound: &BTreeMap<String, Vec<RecordBatch>>,
    readers: &[super::SourceReader],
) -> Result<(
    BTreeMap<String, Vec<RecordBatch>>,
    BTreeMap<String, Vec<RecordBatch>>,
)> {
    let (mut retracts, mut inserts) = (BTreeMap::new(), BTreeMap::new());
    for (table, batches) in bound {
        let changelog = readers
            .iter()
            .any(|r| r.table == *table && r.source.changelog());
        let (r, i): (&mut Vec<RecordBatch>, &mut Vec<RecordBatch>) = (
            retracts.entry(table.clone()).or_default(),
            inserts.entry(table.clone()).or_default(),
        );
        for b in batches {
            if changelog {
                let (rb, ib) = crate::changelog::split(b)?;
                r.push(rb);
                i.push(ib);
            } else {
                i.push(b.clone());
            }
        }
    }
    Ok((retracts, inserts))
}

pub(super) fn bind_sources(
    plan: &Arc<dyn ExecutionPlan>,
    bound: &BTreeMap<String, Vec<RecordBatch>>,
) -> Result<Arc<dyn ExecutionPlan>> {
    bind_leaves(plan, &mut |input| match input {
        StageInput::Source { table, projection } => {
            let batches = bound.get(table).cloned().unwrap_or_default();
            match projection {
                Some(p) => batches
                    .iter()
                    .map(|b| b.project(p).map_err(EngineError::from))
                    .collect(),
                None => Ok(batches),
            }
        }
        StageInput::Shuffle { shuffle_id } => Err(EngineError::plan(format!(
            "source stage has a shuffle input {shuffle_id}"
        ))),
    })
}
