//! A stage that takes payloads: collect an epoch from every sender in the
//! arena, then run complete epochs in order. What an epoch does with its
//! rows is the stage's [`EpochStep`]: run them as they come, hold them in
//! windows, or keep them to compute a changelog.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use tokio::sync::Mutex;

use super::member_state::SavedChain;
use super::updating::UpdatingStep;
use super::windowed::WindowedStep;
use super::{EpochMarks, Response, StageFunction, StageOutput, bind_leaves};
use crate::admit::admit;
use crate::arena::{Arena, Collected, EpochInput};
use crate::context::StageMode;
use crate::error::{EngineError, Result};
use crate::exec::StageInput;
use crate::payload::{Arrived, Payload, PayloadHeader, batches_of};
use crate::updating::UpdatingPlan;
use crate::watermark::Watermark;

/// A stage fed by payloads, and what it holds across epochs.
pub(super) struct PayloadStage {
    /// Per input edge: the schema its payloads carry (the leaf's, with the
    /// op column on an edge that carries a changelog).
    wire_schemas: BTreeMap<u32, SchemaRef>,
    state: Mutex<PayloadState>,
}

/// A payload stage's state: the epochs it collects, where it stands, and
/// its step's own state.
pub(super) struct PayloadState {
    arena: Arena,
    /// Complete epochs waiting for an earlier one.
    ready: BTreeMap<u64, EpochInput>,
    pub(super) next_epoch: u64,
    /// This instance took its state from the checkpoint store (or had
    /// nothing to take): done once, before its first epoch.
    restored: bool,
    /// This stage's watermark: it only moves forward.
    pub(super) watermark: Watermark,
    /// The states this member wrote (or restored), that the next
    /// checkpoint may build on.
    pub(super) saved: SavedChain,
    pub(super) step: EpochStep,
}

/// What a payload stage does with an epoch's rows.
pub(super) enum EpochStep {
    /// Nothing kept: the plan runs on each epoch's rows.
    Stream,
    /// Rows held until the watermark closes their window (or, without
    /// windows, until the end of a bounded run).
    Windowed(Box<WindowedStep>),
    /// Rows (or accumulators) kept by key; each epoch sends the changes of
    /// the result.
    Updating(Box<UpdatingStep>),
}

/// What an epoch sends on, computed before the state is written.
pub(super) enum Outgoing {
    /// Rows per input edge to run the stage's plan on; none: only the
    /// metadata that lets counts downstream complete.
    Rows(Option<BTreeMap<u32, Vec<RecordBatch>>>),
    /// An updating stage's changes `(retract, insert)` of its core, to run
    /// through the plan's tail.
    Changes(Arc<UpdatingPlan>, Option<(RecordBatch, RecordBatch)>),
}

impl PayloadStage {
    pub(super) fn new(
        name: &str,
        inputs: Vec<u32>,
        wire_schemas: BTreeMap<u32, SchemaRef>,
        step: EpochStep,
    ) -> Self {
        let state = PayloadState {
            arena: Arena::new(name.to_string(), inputs),
            ready: BTreeMap::new(),
            next_epoch: 0,
            restored: false,
            watermark: Watermark::default(),
            saved: SavedChain::default(),
            step,
        };
        PayloadStage {
            wire_schemas,
            state: Mutex::new(state),
        }
    }

    /// Take one payload; run every epoch it completes, in order.
    pub(super) async fn take(&self, f: &StageFunction, p: Payload) -> Result<Response> {
        admit(&p, &f.ctx, &f.name)?;
        let arrived = self.decode(f, &p)?;
        let mut state = self.state.lock().await;
        if !state.restored {
            state.restore(f).await?;
            state.restored = true;
        }
        if p.epoch < state.next_epoch {
            // Already run (and committed, for a restored member): a retry.
            return Ok(Response::status("duplicate"));
        }
        let run_before = state.next_epoch;
        match state.arena.collect(&p, arrived, run_before)? {
            Collected::Duplicate => return Ok(Response::status("duplicate")),
            Collected::NotReady => return Ok(Response::status("not_ready")),
            Collected::Complete(input) => {
                state.ready.insert(input.epoch, input);
            }
        }
        // Run every epoch that is complete and next in line; the state lock
        // keeps epochs in order even where concurrency is above one.
        let mut rows_out = 0;
        loop {
            let next = state.next_epoch;
            let Some(input) = state.ready.remove(&next) else {
                break;
            };
            rows_out += state.run_epoch(f, input).await?;
            state.next_epoch += 1;
        }
        Ok(Response {
            rows_out,
            ..Response::status("ran")
        })
    }

    /// The payload's rows, checked against the schema its edge carries.
    fn decode(&self, f: &StageFunction, p: &Payload) -> Result<Arrived> {
        let expected =
            self.wire_schemas
                .get(&p.shuffle_id)
                .ok_or_else(|| EngineError::BadPayload {
                    uuid: p.uuid_string(),
                    stage: f.name.clone(),
                    reason: format!("no leaf of this stage reads edge {}", p.shuffle_id),
                })?;
        let mut arrived = p.decode_arrived(&f.name, expected)?;
        // Only a window buffer's checkpoints write frames: elsewhere the
        // compressed bytes would only wait in the arena for nothing.
        let keeps_frames = f.checkpoints().is_some()
            && matches!(f.ctx.mode, StageMode::Complete | StageMode::Accumulate);
        if !keeps_frames {
            arrived.frame = None;
        }
        Ok(arrived)
    }

    /// Bytes of the rows held across epochs; none while an invocation
    /// holds them.
    pub(super) fn state_bytes(&self) -> Option<usize> {
        Some(self.state.try_lock().ok()?.step.bytes())
    }

    /// What this stage still waits for.
    pub(super) async fn pending(&self, name: &str) -> Vec<String> {
        let state = self.state.lock().await;
        let mut out = state.arena.pending();
        for epoch in state.ready.keys() {
            out.push(format!(
                "{name}: epoch {epoch} is complete but waits for epoch {}",
                state.next_epoch
            ));
        }
        out
    }
}

impl PayloadState {
    /// One complete epoch: the step takes its rows, the state is encoded,
    /// then written while the epoch's output is computed and sent (both
    /// finish before the invocation answers, so before the epoch commits).
    async fn run_epoch(&mut self, f: &StageFunction, input: EpochInput) -> Result<u64> {
        let epoch = input.epoch;
        self.advance_watermark(f, input.watermark);
        let output = &f.outputs[0];
        let marks = EpochMarks {
            last: input.last,
            checkpoint: input.checkpoint,
        };
        let out_watermark = self.out_watermark(input.last);
        let qid = &f.ctx.query_code;
        let header = f.header(output, qid, epoch, out_watermark, marks, input.offsets);
        let watermark = self.watermark;
        let outgoing = match &mut self.step {
            EpochStep::Stream => {
                f.report_held(epoch, watermark, 0);
                let edges = input.edges.into_iter();
                Outgoing::Rows(Some(edges.map(|(e, a)| (e, batches_of(a))).collect()))
            }
            EpochStep::Windowed(w) => w.take(f, epoch, input.edges, input.last, watermark).await?,
            EpochStep::Updating(u) => u.take(f, epoch, input.edges, input.last).await?,
        };
        let to_save = self.state_to_save(f, epoch, input.last || input.checkpoint)?;
        let (written, rows) = tokio::join!(
            f.write_state(to_save),
            f.send_outgoing(output, header, outgoing)
        );
        if let Some(w) = written? {
            self.saved.note(w);
        }
        rows
    }

    /// The stage's watermark: the later of its own and the epoch's.
    fn advance_watermark(&mut self, f: &StageFunction, input: Watermark) {
        self.watermark = Watermark {
            value: match (self.watermark.value, input.value) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            },
            idle: input.idle,
        };
        crate::metrics::watermark(&f.ctx.stage_name(), self.watermark.value);
    }

    /// The watermark the epoch's output carries. A stage that holds its
    /// rows until the end of the run holds the watermark back too, or the
    /// rows it emits then would be behind it downstream (late).
    fn out_watermark(&self, last: bool) -> Watermark {
        match &self.step {
            EpochStep::Windowed(w) if !w.is_windowed() && !last => Watermark {
                value: Some(i64::MIN),
                idle: false,
            },
            _ => self.watermark,
        }
    }
}

impl EpochStep {
    /// Bytes of the rows it holds.
    fn bytes(&self) -> usize {
        match self {
            EpochStep::Stream => 0,
            EpochStep::Windowed(w) => w.bytes(),
            EpochStep::Updating(u) => u.bytes(),
        }
    }
}

impl StageFunction {
    /// Say what a stage holds after an epoch: the state gauge and the
    /// member's counts for `skein status`.
    pub(super) fn report_held(&self, epoch: u64, watermark: Watermark, bytes: usize) {
        crate::metrics::state_bytes(&self.name, bytes);
        let watermark_ms = watermark.value.filter(|w| *w > i64::MIN);
        self.tally.measure(|l| {
            l.state_bytes = bytes as u64;
            l.watermark_ms = watermark_ms.or(l.watermark_ms);
            l.epoch = Some(epoch);
        });
    }

    /// Send what an epoch computed on; the rows sent.
    async fn send_outgoing(
        &self,
        output: &StageOutput,
        header: PayloadHeader,
        outgoing: Outgoing,
    ) -> Result<u64> {
        match outgoing {
            Outgoing::Rows(rows) => {
                let rows = rows.filter(|edges| edges.values().flatten().any(|b| b.num_rows() > 0));
                match rows {
                    None => self.route(output, header, None).await.map(|()| 0),
                    Some(edges) if self.takes_changes() => {
                        self.run_changes(output, edges, header).await
                    }
                    Some(edges) => self.run_rows(output, edges, header).await,
                }
            }
            Outgoing::Changes(plan, changes) => {
                let out = match changes {
                    Some((retract, insert)) => {
                        Some(self.through_tail(&plan, retract, insert).await?)
                    }
                    None => None,
                };
                let rows = out
                    .iter()
                    .flat_map(|(_, parts)| parts.iter().flatten())
                    .map(|b| b.num_rows() as u64)
                    .sum();
                self.route_changes(output, header, out).await?;
                Ok(rows)
            }
        }
    }

    /// The stage's plan run on rows per input edge, and sent on.
    async fn run_rows(
        &self,
        output: &StageOutput,
        mut edges: BTreeMap<u32, Vec<RecordBatch>>,
        header: PayloadHeader,
    ) -> Result<u64> {
        let plan = bind_leaves(&output.plan, &mut |input| match input {
            StageInput::Shuffle { shuffle_id } => Ok(edges.remove(shuffle_id).unwrap_or_default()),
            StageInput::Source { table, .. } => Err(self.source_beside_exchanges(table)),
        })?;
        self.run_and_route(output, plan, header).await
    }

    /// A source leaf in a stage that takes payloads: a plan this function
    /// cannot run.
    pub(super) fn source_beside_exchanges(&self, table: &str) -> EngineError {
        EngineError::plan(format!(
            "stage {} has a source leaf {table} beside exchanges",
            self.name
        ))
    }
}
