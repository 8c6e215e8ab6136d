//! The source stage of the generic function: pull each table once per
//! epoch, keep event time per partition, run every output on the read.
//! An epoch is a short sequence of steps: resume where the offsets log
//! ends, read (or read again) each table, settle the watermark, log or
//! note the read, then compute and send the outputs.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::physical_plan::ExecutionPlan;
use tokio::sync::Mutex;

use super::pushed::PushedState;
use super::source_note::KeptEntries;
use super::{EpochMarks, Response, SourceReader, StageFunction, StageOutput, Trigger, bind_leaves};
use crate::checkpoint::{OffsetsEntry, TableRead};
use crate::error::{EngineError, Result};
use crate::exec::StageInput;
use crate::lookup::set_aside::SetAside;
use crate::payload::SourceOffset;
use crate::source::EpochSpec;
use crate::watermark::{SourceClock, Watermark, WatermarkMin};

/// A stage that reads its tables, and what each way of being fed keeps. A
/// member is fed one way: pulls on the driver's triggers, or a platform's
/// pushed batches (a Lambda event-source mapping), never both.
pub(super) struct SourceStage {
    pub(super) readers: Vec<SourceReader>,
    pub(super) pulled: Mutex<PulledState>,
    pub(super) pushed: Mutex<PushedState>,
}

/// What a pulling source member keeps between epochs.
pub(super) struct PulledState {
    /// Per source reader: its per-partition event-time clock.
    pub(super) clocks: Vec<Option<SourceClock>>,
    /// Stood where the offsets log ends (or had no log): done once.
    pub(super) restored: bool,
    /// The log entries after the last commit that its source keeps
    /// (`source_note.rs`).
    pub(super) kept: KeptEntries,
}

/// One table's read of an epoch.
struct TableEpoch {
    table: String,
    batches: Vec<RecordBatch>,
    offsets: Vec<SourceOffset>,
    lag: Option<u64>,
    drained: bool,
    finished: bool,
    watermark: Watermark,
    /// The largest event time read so far, from any partition.
    newest_ms: Option<i64>,
    /// Where the read started and ended, for the offsets log.
    read: Option<TableRead>,
}

/// Every table's read of an epoch, gathered.
struct EpochRead {
    bound: BTreeMap<String, Vec<RecordBatch>>,
    offsets: Vec<SourceOffset>,
    events: u64,
    lag: Option<u64>,
    watermark: WatermarkMin,
    newest_ms: Option<i64>,
    drained: bool,
    finished: bool,
    reads: Vec<TableRead>,
}

impl EpochRead {
    fn new() -> Self {
        EpochRead {
            bound: BTreeMap::new(),
            offsets: vec![],
            events: 0,
            lag: None,
            watermark: WatermarkMin::default(),
            newest_ms: None,
            drained: true,
            finished: true,
            reads: vec![],
        }
    }

    fn add(&mut self, t: TableEpoch) {
        self.events += t.batches.iter().map(|b| b.num_rows() as u64).sum::<u64>();
        if let Some(l) = t.lag {
            *self.lag.get_or_insert(0) += l;
        }
        self.watermark.add(t.watermark);
        self.newest_ms = self.newest_ms.max(t.newest_ms);
        self.drained &= t.drained;
        self.finished &= t.finished;
        self.reads.extend(t.read);
        self.offsets.extend(t.offsets);
        self.bound.insert(t.table, t.batches);
    }

    /// The epoch's watermark, and the entry to log. An epoch read again
    /// keeps the watermark (and ends) of the first time, whatever the
    /// clocks say now; a fresh read of a query that checkpoints logs one.
    fn settle(
        &mut self,
        logged: Option<&OffsetsEntry>,
        logs: bool,
        epochs: Option<u64>,
    ) -> (Watermark, Option<OffsetsEntry>) {
        let watermark = self.watermark.result();
        if let Some(l) = logged {
            self.drained = l.drained;
            self.finished = l.finished;
            let first = Watermark {
                value: l.watermark,
                idle: l.idle,
            };
            return (first, None);
        }
        let entry = logs.then(|| OffsetsEntry {
            tables: std::mem::take(&mut self.reads),
            watermark: watermark.value,
            idle: watermark.idle,
            drained: self.drained,
            finished: self.finished,
            epochs,
            poison: vec![],
        });
        (watermark, entry)
    }
}

impl SourceStage {
    pub(super) fn new(readers: Vec<SourceReader>, clocks: Vec<Option<SourceClock>>) -> Self {
        SourceStage {
            readers,
            pushed: Mutex::new(PushedState::new(clocks.first().cloned().flatten())),
            pulled: Mutex::new(PulledState {
                clocks,
                restored: false,
                kept: KeptEntries::default(),
            }),
        }
    }

    /// Whether it reads any table.
    pub(super) fn reads(&self) -> bool {
        !self.readers.is_empty()
    }

    /// One epoch on the driver's trigger.
    pub(super) async fn run(&self, f: &StageFunction, t: Trigger) -> Result<Response> {
        let spec = f.epoch_spec(t.epoch);
        let checkpoints = f.checkpoints().cloned();
        let mut state = self.pulled.lock().await;
        let logged = match &checkpoints {
            Some(cs) => self.resume(f, cs, &mut state, spec, &t).await?,
            None => None,
        };
        let mut read = EpochRead::new();
        for (r, clock) in self.readers.iter().zip(state.clocks.iter_mut()) {
            let replayed = logged
                .as_ref()
                .and_then(|l| l.tables.iter().find(|x| x.table == r.table));
            let logs = checkpoints.is_some();
            read.add(read_table(f, r, clock, spec, replayed, logs).await?);
        }
        let (watermark, entry) = read.settle(logged.as_ref(), checkpoints.is_some(), f.ctx.epochs);
        // Between checkpoints the entry goes to the source's note, with the
        // entries before it since the last commit.
        let note = match (&checkpoints, &entry) {
            (Some(cs), Some(entry)) if !t.checkpoint && self.keeps_notes() => {
                // A note replaces the one before: what an earlier instance
                // kept goes into it.
                self.take_in_notes(f, cs, &mut state.kept, spec, t.committed)
                    .await?;
                state.kept.insert(t.epoch, entry.clone());
                Some(state.kept.note()?)
            }
            _ => None,
        };
        drop(state);
        let watermark_ms = f.report_read(t.epoch, watermark);
        // The outputs are computed while the log entry is written; nothing
        // leaves before it is durable: a replay must read what this read.
        let (computed, logged) = tokio::join!(
            self.compute(f, &read.bound),
            self.log(f, checkpoints.as_deref(), spec, entry, note)
        );
        logged?;
        let rows_out = f.emit(&t, watermark, &read.offsets, computed?).await?;
        Ok(Response {
            events: read.events,
            rows_out,
            drained: read.drained,
            finished: read.finished,
            lag: read.lag,
            watermark_ms,
            newest_event_ms: read.newest_ms,
            ..Response::status("ran")
        })
    }

    /// Every output's plan run on the epoch's rows; a changelog table's
    /// rows run through the plan by kind.
    async fn compute<'f>(
        &self,
        f: &'f StageFunction,
        bound: &BTreeMap<String, Vec<RecordBatch>>,
    ) -> Result<Vec<(&'f StageOutput, Computed)>> {
        let by_kind = self
            .readers
            .iter()
            .any(|r| r.source.changelog())
            .then(|| split_by_kind(bound, &self.readers))
            .transpose()?;
        let mut out = vec![];
        for output in &f.outputs {
            out.push(match &by_kind {
                None => {
                    let plan = bind_sources(&output.plan, bound)?;
                    let ran = f.execute_setting_aside(&plan).await?;
                    (output, Computed::Rows(plan, ran))
                }
                Some((retracts, inserts)) => {
                    let r = bind_sources(&output.plan, retracts)?;
                    let i = bind_sources(&output.plan, inserts)?;
                    (output, Computed::Changes(f.tagged(&r, &i).await?))
                }
            });
        }
        Ok(out)
    }
}

/// Read one table's share of an epoch: pulled, or read again from where
/// the log says it was; its event time observed.
async fn read_table(
    f: &StageFunction,
    r: &SourceReader,
    clock: &mut Option<SourceClock>,
    spec: EpochSpec,
    replayed: Option<&TableRead>,
    logs: bool,
) -> Result<TableEpoch> {
    let err = |e: EngineError| e.at_source(&r.table, &f.name);
    let logs_read = logs && replayed.is_none();
    let from = match logs_read {
        true => r.source.position(spec).await.map_err(err)?,
        false => vec![],
    };
    let mb = match replayed {
        Some(read) => r.source.replay(spec, &read.from, &read.to).await,
        None => r.source.pull(spec).await,
    }
    .map_err(err)?;
    f.tally.count(|t| t.dead_letters += mb.dead_letters);
    if let Some(reason) = &mb.dead_letter_reason {
        f.tally
            .measure(|l| l.reason("dead letter", &r.table, reason.clone()));
    }
    let progress = mb.progress();
    crate::metrics::source_pull(&r.table, &progress, |p| {
        p.batches
            .iter()
            .filter_map(|i| mb.batches.get(*i))
            .map(|b| b.num_rows() as u64)
            .sum()
    });
    let watermark = match clock {
        Some(clock) => {
            let now = Instant::now();
            match replayed.and_then(|read| read.clock.as_ref()) {
                Some(saved) => clock.restore(saved, now),
                None => clock.observe(&mb.batches, &progress, now)?,
            }
            clock.watermark(now)
        }
        // No event time: constrains nothing.
        None => Watermark::default(),
    };
    let read = match logs_read {
        true => Some(TableRead {
            table: r.table.clone(),
            from,
            to: r.source.position(spec).await.map_err(err)?,
            clock: clock.as_ref().map(|c| c.save()),
        }),
        false => None,
    };
    crate::verify::tap::record(&f.ctx.query_code, &r.table, &mb.batches);
    let lags: Vec<u64> = progress.iter().filter_map(|p| p.lag).collect();
    Ok(TableEpoch {
        table: r.table.clone(),
        lag: (!lags.is_empty()).then(|| lags.iter().sum()),
        drained: progress.iter().all(|p| p.drained || p.finished),
        finished: progress.iter().all(|p| p.finished),
        watermark,
        newest_ms: clock.as_ref().and_then(|c| c.newest()),
        read,
        offsets: mb.offsets,
        batches: mb.batches,
    })
}

impl StageFunction {
    /// Which slice of which epoch this member reads.
    pub(super) fn epoch_spec(&self, epoch: u64) -> EpochSpec {
        EpochSpec {
            instance: self.ctx.member as usize,
            instances: self.ctx.members as usize,
            epoch,
            epochs: self.ctx.epochs,
        }
    }

    /// Say a source epoch's watermark; the watermark as status shows it.
    fn report_read(&self, epoch: u64, watermark: Watermark) -> Option<i64> {
        crate::metrics::watermark(&self.ctx.stage_name(), watermark.value);
        let watermark_ms = watermark.value.filter(|w| *w > i64::MIN);
        self.tally.measure(|l| {
            l.watermark_ms = watermark_ms.or(l.watermark_ms);
            l.epoch = Some(epoch);
        });
        watermark_ms
    }

    /// Send each output's computed rows on; the rows sent.
    async fn emit(
        &self,
        t: &Trigger,
        watermark: Watermark,
        offsets: &[SourceOffset],
        computed: Vec<(&StageOutput, Computed)>,
    ) -> Result<u64> {
        let marks = EpochMarks {
            last: t.last,
            checkpoint: t.checkpoint,
        };
        let mut rows_out = 0;
        for (output, computed) in computed {
            let offsets = offsets.to_vec();
            let header = self.header(output, &t.qid, t.epoch, watermark, marks, offsets);
            rows_out += match computed {
                Computed::Rows(plan, ran) => self.send_output(output, &plan, header, ran).await?,
                Computed::Changes(parts) => {
                    let rows = parts.iter().flatten().map(|b| b.num_rows() as u64).sum();
                    let schema = output.plan.schema();
                    self.route_changes(output, header, Some((schema, parts)))
                        .await?;
                    rows
                }
            };
        }
        Ok(rows_out)
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

/// Rows per table: `(retractions, inserts)`.
type ByKind = (
    BTreeMap<String, Vec<RecordBatch>>,
    BTreeMap<String, Vec<RecordBatch>>,
);

/// One output of a source stage, computed before it is sent.
enum Computed {
    /// The plan's rows, per output partition, and what its lookup joins
    /// set aside.
    Rows(
        Arc<dyn ExecutionPlan>,
        (Vec<Vec<RecordBatch>>, Arc<SetAside>),
    ),
    /// A changelog's rows run by kind, tagged, per output partition.
    Changes(Vec<Vec<RecordBatch>>),
}

/// `plan` with its source leaves bound to `bound` (per table).
/// Each table's rows split by kind, `(retractions, inserts)`: a changelog
/// table's by its op column, another's all inserts.
fn split_by_kind(
    bound: &BTreeMap<String, Vec<RecordBatch>>,
    readers: &[SourceReader],
) -> Result<ByKind> {
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
