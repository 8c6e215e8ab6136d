//! A stage that takes payloads: collect an epoch from every sender in the
//! arena, then run complete epochs in order, holding windows across them.

use std::collections::BTreeMap;

use datafusion::arrow::record_batch::RecordBatch;

use super::{EpochMarks, Response, StageFunction, StageState, bind_leaves};
use crate::admit::admit;
use crate::arena::{Collected, EpochInput};
use crate::context::StageMode;
use crate::error::{EngineError, Result};
use crate::exec::StageInput;
use crate::payload::{Payload, batches_of};
use crate::source::DeadLetter;
use crate::watermark::Watermark;
use crate::window_state::{LateRows, rows_as_json};

impl StageFunction {
    pub(super) async fn take_payload(&self, p: Payload) -> Result<Response> {
        admit(&p, &self.ctx, &self.name)?;
        let expected =
            self.wire_schemas
                .get(&p.shuffle_id)
                .ok_or_else(|| EngineError::BadPayload {
                    uuid: p.uuid_string(),
                    stage: self.name.clone(),
                    reason: format!("no leaf of this stage reads edge {}", p.shuffle_id),
                })?;
        let mut arrived = p.decode_arrived(&self.name, expected)?;
        // Only a window buffer's checkpoints write frames: elsewhere the
        // compressed bytes would only wait in the arena for nothing.
        let keeps_frames = self.checkpoints().is_some()
            && matches!(self.ctx.mode, StageMode::Complete | StageMode::Accumulate);
        if !keeps_frames {
            arrived.frame = None;
        }
        let mut state = self.state.lock().await;
        if !state.restored {
            self.restore(&mut state).await?;
            state.restored = true;
        }
        if p.epoch < state.next_epoch {
            // Already run (and committed, for a restored member): a retry.
            return Ok(Response {
                status: "duplicate".into(),
                ..Default::default()
            });
        }
        let run_before = state.next_epoch;
        let arena = state
            .arena
            .as_mut()
            .ok_or_else(|| EngineError::BadPayload {
                uuid: p.uuid_string(),
                stage: self.name.clone(),
                reason: "this stage takes no payloads (it reads a source)".into(),
            })?;
        match arena.collect(&p, arrived, run_before)? {
            Collected::Duplicate => {
                return Ok(Response {
                    status: "duplicate".into(),
                    ..Default::default()
                });
            }
            Collected::NotReady => {
                return Ok(Response {
                    status: "not_ready".into(),
                    ..Default::default()
                });
            }
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
            rows_out += self.run_epoch(&mut state, input).await?;
            state.next_epoch += 1;
        }
        Ok(Response {
            status: "ran".into(),
            rows_out,
            ..Default::default()
        })
    }

    async fn run_epoch(&self, state: &mut StageState, input: EpochInput) -> Result<u64> {
        let qid = self.ctx.query_code.clone();
        let epoch = input.epoch;
        // The stage's watermark never goes back.
        state.watermark = Watermark {
            value: match (state.watermark.value, input.watermark.value) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            },
            idle: input.watermark.idle,
        };
        crate::metrics::watermark(&self.ctx.stage_name(), state.watermark.value);
        let output = &self.outputs[0];
        let marks = EpochMarks {
            last: input.last,
            checkpoint: input.checkpoint,
        };
        if self.ctx.mode == StageMode::Updating {
            let header = self.header(
                output,
                &qid,
                epoch,
                state.watermark,
                marks,
                input.offsets.clone(),
            );
            return self.run_updating(state, input, header).await;
        }
        // A stateful stage without windows holds its rows until the end of
        // the run: its output must hold the watermark back too, or the rows
        // it emits then would be behind the watermark downstream (late).
        let holds_rows = self.ctx.mode != StageMode::Stream && !state.windows.is_windowed();
        let out_watermark = if holds_rows && !input.last {
            Watermark {
                value: Some(i64::MIN),
                idle: false,
            }
        } else {
            state.watermark
        };
        let header = self.header(
            output,
            &qid,
            epoch,
            out_watermark,
            marks,
            input.offsets.clone(),
        );
        let to_run: Option<BTreeMap<u32, Vec<RecordBatch>>> = match self.ctx.mode {
            StageMode::Stream => Some(
                input
                    .edges
                    .into_iter()
                    .map(|(edge, arrived)| (edge, batches_of(arrived)))
                    .collect(),
            ),
            // Handled above.
            StageMode::Updating => None,
            StageMode::Complete | StageMode::Accumulate => {
                for (edge, arrived) in input.edges {
                    let late = state.windows.add(edge, arrived)?;
                    self.set_aside_late(epoch, late).await?;
                }
                if input.last {
                    Some(state.windows.take_all())
                } else if state.windows.is_windowed() {
                    // Every input's senders have passed the watermark, so a
                    // window it closes is complete on every side.
                    match state.watermark.value {
                        Some(wm) => Some(state.windows.release(wm)?),
                        None => None,
                    }
                } else {
                    None
                }
            }
        };
        for c in self.compactors.values() {
            if c.wants(state.windows.held_batches(c.edge())) {
                let held = state.windows.take_edge(c.edge());
                let merged = c.merge(held, self.task_ctx.clone()).await?;
                state.windows.put_back(c.edge(), merged);
            }
        }
        crate::metrics::state_bytes(&self.name, state.windows.bytes());
        let watermark_ms = state.watermark.value.filter(|w| *w > i64::MIN);
        self.tally.measure(|l| {
            l.state_bytes = state.windows.bytes() as u64;
            l.watermark_ms = watermark_ms.or(l.watermark_ms);
            l.epoch = Some(epoch);
        });
        // The state is encoded now and written while the epoch's output is
        // computed and sent: both finish before the invocation answers, and
        // so before the epoch can be committed.
        let to_save = self.state_to_save(state, epoch, input.last || input.checkpoint)?;
        let to_run = to_run.filter(|edges| edges.values().flatten().any(|b| b.num_rows() > 0));
        let run = async {
            match to_run {
                None => {
                    self.route(output, header, None).await?;
                    Ok(0)
                }
                Some(edges) if self.takes_changes() => {
                    self.run_changes(output, edges, header).await
                }
                Some(mut edges) => {
                    let plan = bind_leaves(&output.plan, &mut |input| match input {
                        StageInput::Shuffle { shuffle_id } => {
                            Ok(edges.remove(shuffle_id).unwrap_or_default())
                        }
                        StageInput::Source { table, .. } => Err(EngineError::plan(format!(
                            "stage {} has a source leaf {table} beside exchanges",
                            self.name
                        ))),
                    })?;
                    self.run_and_route(output, plan, header).await
                }
            }
        };
        let (written, rows) = tokio::join!(self.write_state(to_save), run);
        if let Some(w) = written? {
            state.saved.note(w);
        }
        rows
    }

    /// Count late rows per table and send them to their table's dead-letter
    /// destination where it asks for that; they are never emitted.
    async fn set_aside_late(&self, epoch: u64, late: Vec<LateRows>) -> Result<()> {
        for l in late {
            let Some(handling) = self.late.get(&l.edge) else {
                continue;
            };
            let n = l.batch.num_rows();
            self.env.late.add(&handling.table, n as u64);
            self.tally.count(|t| t.late_rows += n as u64);
            if let Some((start, end)) = l.windows.last() {
                let text = format!("{n} rows after their window [{start}, {end}) ms was emitted");
                self.tally
                    .measure(|m| m.reason("late", &handling.table, text));
            }
            crate::metrics::late_rows(&handling.table, n as u64);
            tracing::debug!(stage = %self.name, table = %handling.table, rows = n, "late rows");
            let Some(dlq) = &handling.dead_letters else {
                continue;
            };
            let letters: Vec<DeadLetter> = rows_as_json(&l.batch)?
                .into_iter()
                .zip(l.windows)
                .enumerate()
                .map(|(i, (row, window))| DeadLetter {
                    table: handling.table.clone(),
                    reason: "late".into(),
                    window: Some(window),
                    row,
                    // The same on a replay of this epoch.
                    key: format!(
                        "{}/late/{}/{epoch}/{}/{i}",
                        handling.table, self.name, l.edge
                    ),
                    offsets: vec![],
                })
                .collect();
            dlq.send(&letters).await?;
        }
        Ok(())
    }
}
