//! The windowed step of a payload stage: hold rows until the watermark
//! closes their window (or, without windows, until the end of a bounded
//! run), set late rows aside, and hand the closed windows to the plan.

use std::collections::BTreeMap;

use datafusion::arrow::datatypes::SchemaRef;

use super::payload_stage::Outgoing;
use super::{LateHandling, StageFunction};
use crate::compaction::Compactor;
use crate::dead_letter::{DeadLetter, rows_as_json};
use crate::error::Result;
use crate::payload::Arrived;
use crate::watermark::Watermark;
use crate::window_state::{LateRows, WindowBuffer};

/// A windowed stage's rows and how it treats them.
pub(super) struct WindowedStep {
    /// Rows of open windows.
    pub(super) windows: WindowBuffer,
    /// Per input edge of partial aggregate rows: how to merge them.
    compactors: BTreeMap<u32, Compactor>,
    /// Per input edge: where its late rows are counted and sent.
    late: BTreeMap<u32, LateHandling>,
    /// The schema of each edge's rows, as its checkpoints hold them.
    pub(super) schemas: BTreeMap<u32, SchemaRef>,
}

impl WindowedStep {
    pub(super) fn new(
        windows: WindowBuffer,
        compactors: BTreeMap<u32, Compactor>,
        late: BTreeMap<u32, LateHandling>,
        schemas: BTreeMap<u32, SchemaRef>,
    ) -> Self {
        WindowedStep {
            windows,
            compactors,
            late,
            schemas,
        }
    }

    /// Whether its inputs carry event-time windows.
    pub(super) fn is_windowed(&self) -> bool {
        self.windows.is_windowed()
    }

    pub(super) fn bytes(&self) -> usize {
        self.windows.bytes()
    }

    /// Take an epoch's rows; what the windows it closes (or, at the end of
    /// the run, everything held) send on.
    pub(super) async fn take(
        &mut self,
        f: &StageFunction,
        epoch: u64,
        edges: BTreeMap<u32, Vec<Arrived>>,
        last: bool,
        watermark: Watermark,
    ) -> Result<Outgoing> {
        for (edge, arrived) in edges {
            let late = self.windows.add(edge, arrived)?;
            self.set_aside_late(f, epoch, late).await?;
        }
        let closed = if last {
            Some(self.windows.take_all())
        } else if self.windows.is_windowed() {
            // Every input's senders have passed the watermark, so a window
            // it closes is complete on every side.
            match watermark.value {
                Some(wm) => Some(self.windows.release(wm)?),
                None => None,
            }
        } else {
            None
        };
        self.compact(f).await?;
        f.report_held(epoch, watermark, self.windows.bytes());
        Ok(Outgoing::Rows(closed))
    }

    /// Merge an edge's held partial aggregates once they pile up.
    async fn compact(&mut self, f: &StageFunction) -> Result<()> {
        for c in self.compactors.values() {
            if c.wants(self.windows.held_batches(c.edge())) {
                let held = self.windows.take_edge(c.edge());
                let merged = c.merge(held, f.task_ctx.clone()).await?;
                self.windows.put_back(c.edge(), merged);
            }
        }
        Ok(())
    }

    /// Count late rows per table and send them to their table's dead-letter
    /// destination where it asks for that; they are never emitted.
    async fn set_aside_late(
        &self,
        f: &StageFunction,
        epoch: u64,
        late: Vec<LateRows>,
    ) -> Result<()> {
        for l in late {
            let Some(handling) = self.late.get(&l.edge) else {
                continue;
            };
            let n = l.batch.num_rows();
            f.env.late.add(&handling.table, n as u64);
            f.tally.count(|t| t.late_rows += n as u64);
            if let Some((start, end)) = l.windows.last() {
                let text = format!("{n} rows after their window [{start}, {end}) ms was emitted");
                f.tally.measure(|m| m.reason("late", &handling.table, text));
            }
            crate::metrics::late_rows(&handling.table, n as u64);
            tracing::debug!(stage = %f.name, table = %handling.table, rows = n, "late rows");
            if let Some(dlq) = &handling.dead_letters {
                dlq.send(&late_letters(&f.name, handling, epoch, l)?)
                    .await?;
            }
        }
        Ok(())
    }
}

/// Late rows as dead letters, keyed the same on a replay of the epoch.
fn late_letters(
    stage: &str,
    handling: &LateHandling,
    epoch: u64,
    l: LateRows,
) -> Result<Vec<DeadLetter>> {
    Ok(rows_as_json(&l.batch)?
        .into_iter()
        .zip(l.windows)
        .enumerate()
        .map(|(i, (row, window))| DeadLetter {
            table: handling.table.clone(),
            reason: "late".into(),
            window: Some(window),
            row,
            key: format!("{}/late/{stage}/{epoch}/{}/{i}", handling.table, l.edge),
            offsets: vec![],
        })
        .collect())
}
