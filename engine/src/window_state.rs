//! What a windowed stage holds across epochs: the rows of windows that are
//! still open, per input edge, and the watermark up to which it has emitted.
//!
//! Rows wait here until the stage's watermark (the minimum over every input's
//! senders) passes the end of their window; a join therefore sees each
//! side's rows of a window together, whatever epoch they came in. A row that
//! arrives for a window already emitted is late: it is set aside (for the
//! caller to count, drop or dead-letter) and never makes a second, partial
//! row for that window.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use datafusion::arrow::array::{BooleanArray, Int64Array};
use datafusion::arrow::compute::filter_record_batch;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};

use crate::context::EdgeWindow;
use crate::error::Result;
use crate::payload::{Arrived, WireFrame};
use crate::watermark::times_ms;
use crate::window::{SessionSpec, window_ends};

/// Rows that came after their window was emitted, with that window.
#[derive(Debug)]
pub struct LateRows {
    /// The input edge.
    pub edge: u32,
    /// The late rows.
    pub batch: RecordBatch,
    /// Per row: the window `[start, end)` in ms it belongs to.
    pub windows: Vec<(i64, i64)>,
}

/// A view of a [`WindowBuffer`]'s state, for a checkpoint.
#[derive(Debug)]
pub struct SavedWindows<'a> {
    /// Rows held per edge.
    pub buffered: &'a BTreeMap<u32, Vec<RecordBatch>>,
    /// The watermark windows were released up to.
    pub released: Option<i64>,
    /// Sessions emitted per edge and key.
    pub emitted_sessions: &'a BTreeMap<u32, HashMap<String, (i64, i64)>>,
}

/// One change to what a [`WindowBuffer`] holds. Kept between checkpoints
/// so that a checkpoint can write what changed since the last one rather
/// than every held row: applied in order to the earlier state, the changes
/// give the same buffer (releasing is deterministic).
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// On-time rows kept for an edge.
    Rows {
        /// The input edge.
        edge: u32,
        /// The rows.
        batch: RecordBatch,
    },
    /// On-time rows kept for an edge, every row of one payload, with the
    /// compressed stream they came in: a checkpoint writes that stream
    /// rather than encoding the rows again.
    Arrived {
        /// The input edge.
        edge: u32,
        /// The rows, non-empty batches.
        batches: Vec<RecordBatch>,
        /// The stream they were decoded from.
        frame: Arc<WireFrame>,
    },
    /// The watermark released every window ending at or before it.
    Released(i64),
}

impl Change {
    /// Rows the change keeps.
    pub fn rows(&self) -> usize {
        match self {
            Change::Rows { batch, .. } => batch.num_rows(),
            Change::Arrived { batches, .. } => batches.iter().map(RecordBatch::num_rows).sum(),
            Change::Released(_) => 0,
        }
    }
}

/// Rows in per-edge batches, as a buffer or a saved state holds them.
pub fn rows_held(buffered: &BTreeMap<u32, Vec<RecordBatch>>) -> usize {
    buffered.values().flatten().map(RecordBatch::num_rows).sum()
}

/// The changes since the last checkpoint, when a checkpoint wants them.
#[derive(Debug, Default)]
struct Journal {
    on: bool,
    changes: Vec<Change>,
    /// Something happened that changes cannot say (everything was taken):
    /// the next checkpoint must be whole.
    whole: bool,
}

impl Journal {
    fn push(&mut self, change: impl FnOnce() -> Change) {
        if self.on && !self.whole {
            self.changes.push(change());
        }
    }
}

/// The open windows of one stage.
#[derive(Debug, Default)]
pub struct WindowBuffer {
    windows: BTreeMap<u32, Option<EdgeWindow>>,
    buffered: BTreeMap<u32, Vec<RecordBatch>>,
    /// Windows that end at or before this have been emitted.
    released: Option<i64>,
    /// Per session edge: the first and last time of each key's emitted
    /// sessions, kept while a row could still belong to them.
    emitted_sessions: BTreeMap<u32, HashMap<String, (i64, i64)>>,
    journal: Journal,
}

impl WindowBuffer {
    /// A buffer for edges with the given windows.
    pub fn new(windows: BTreeMap<u32, Option<EdgeWindow>>) -> Self {
        WindowBuffer {
            windows,
            ..Default::default()
        }
    }

    /// Every input edge has a window: rows are released by the watermark.
    pub fn is_windowed(&self) -> bool {
        !self.windows.is_empty() && self.windows.values().all(Option::is_some)
    }

    /// Bytes of the rows held.
    pub fn bytes(&self) -> usize {
        self.buffered
            .values()
            .flatten()
            .map(RecordBatch::get_array_memory_size)
            .sum()
    }

    /// Rows held.
    pub fn rows(&self) -> usize {
        rows_held(&self.buffered)
    }

    /// Keep an epoch's rows of one edge, payload by payload; rows whose
    /// window was already emitted are returned instead. A payload whose
    /// rows are all kept is journalled with its frame.
    pub fn add(&mut self, edge: u32, arrived: Vec<Arrived>) -> Result<Vec<LateRows>> {
        let mut late = vec![];
        let window = self.windows.get(&edge).cloned().flatten();
        // Open sessions per key, computed once per call and only if needed.
        let mut open = None;
        for a in arrived {
            let mut kept = vec![];
            let mut none_late = true;
            for b in a.batches.into_iter().filter(|b| b.num_rows() > 0) {
                let (on_time, late_rows) = match (&window, self.released) {
                    (Some(w), Some(released)) => {
                        self.split_late(edge, w, b, released, &mut open)?
                    }
                    _ => (b, None),
                };
                none_late &= late_rows.is_none();
                late.extend(late_rows);
                if on_time.num_rows() > 0 {
                    // Held at once: the open sessions above are read from
                    // what is held.
                    kept.push(on_time.clone());
                    self.buffered.entry(edge).or_default().push(on_time);
                }
            }
            match a.frame {
                Some(frame) if none_late && !kept.is_empty() => {
                    self.journal.push(|| Change::Arrived {
                        edge,
                        batches: kept,
                        frame,
                    })
                }
                _ => {
                    for batch in kept {
                        self.journal.push(|| Change::Rows { edge, batch });
                    }
                }
            }
        }
        Ok(late)
    }

    /// Remove and return the rows of every window the watermark has closed.
    pub fn release(&mut self, watermark: i64) -> Result<BTreeMap<u32, Vec<RecordBatch>>> {
        if self.released.is_some_and(|r| r >= watermark) {
            return Ok(BTreeMap::new());
        }
        let mut closed = BTreeMap::new();
        for (edge, batches) in self.buffered.iter_mut() {
            let out = match self.windows.get(edge) {
                Some(Some(EdgeWindow::Fixed(w))) => {
                    let mut out = vec![];
                    let mut keep = vec![];
                    for b in batches.drain(..) {
                        let ends = window_ends(b.column(w.index).as_ref(), w.size_ms)?;
                        let is_closed = mask(&ends, |e| e <= watermark);
                        split_into(&b, &is_closed, &mut out, &mut keep)?;
                    }
                    *batches = keep;
                    out
                }
                Some(Some(EdgeWindow::Session(spec))) => {
                    let emitted = self.emitted_sessions.entry(*edge).or_default();
                    release_sessions(batches, spec, watermark, emitted)?
                }
                // Whole sessions, emitted upstream once closed.
                Some(Some(EdgeWindow::SessionStarts)) => std::mem::take(batches),
                _ => continue,
            };
            closed.insert(*edge, out);
        }
        self.released = Some(watermark);
        self.journal.push(|| Change::Released(watermark));
        // A row can belong to an emitted session only while it is within
        // the gap of it; past that, the plain watermark test covers it.
        for (edge, sessions) in self.emitted_sessions.iter_mut() {
            if let Some(Some(EdgeWindow::Session(spec))) = self.windows.get(edge) {
                sessions.retain(|_, (_, last)| last.saturating_add(2 * spec.gap_ms) >= watermark);
            }
        }
        Ok(closed)
    }

    /// Remove and return everything held (the end of a bounded run).
    pub fn take_all(&mut self) -> BTreeMap<u32, Vec<RecordBatch>> {
        self.journal.whole = true;
        self.journal.changes.clear();
        std::mem::take(&mut self.buffered)
    }

    /// Batches held for an edge.
    pub fn held_batches(&self, edge: u32) -> usize {
        self.buffered.get(&edge).map_or(0, Vec::len)
    }

    /// Take an edge's held partial aggregates to merge them;
    /// [`WindowBuffer::put_back`] returns them merged. The changes go on as
    /// they were: the rows as they came say the same state unmerged (the
    /// final aggregate merges them all the same), so a merge does not make
    /// the next checkpoint whole.
    pub fn take_edge(&mut self, edge: u32) -> Vec<RecordBatch> {
        self.buffered.remove(&edge).unwrap_or_default()
    }

    /// Hold `batches` of `edge` again, after taking them out.
    pub fn put_back(&mut self, edge: u32, batches: Vec<RecordBatch>) {
        let batches: Vec<_> = batches.into_iter().filter(|b| b.num_rows() > 0).collect();
        if !batches.is_empty() {
            self.buffered.insert(edge, batches);
        }
    }

    /// Keep the changes from now on, for checkpoints that write only them.
    pub fn keep_changes(&mut self) {
        self.journal.on = true;
    }

    /// The changes since the last call (or since the state was restored),
    /// or `None` when only a whole checkpoint can say what happened.
    pub fn take_changes(&mut self) -> Option<Vec<Change>> {
        let whole = std::mem::take(&mut self.journal.whole);
        let changes = std::mem::take(&mut self.journal.changes);
        (!whole).then_some(changes)
    }

    /// Apply changes a checkpoint kept, in order, to the restored state.
    /// What they release was emitted before the checkpoint: dropped here.
    pub fn apply(&mut self, changes: Vec<Change>) -> Result<()> {
        for change in changes {
            match change {
                Change::Rows { edge, batch } => self.buffered.entry(edge).or_default().push(batch),
                Change::Arrived { edge, batches, .. } => {
                    self.buffered.entry(edge).or_default().extend(batches)
                }
                Change::Released(watermark) => {
                    self.release(watermark)?;
                }
            }
        }
        self.journal.changes.clear();
        Ok(())
    }

    /// What a checkpoint keeps: the rows held, per edge, and what has been
    /// emitted.
    pub fn saved(&self) -> SavedWindows<'_> {
        SavedWindows {
            buffered: &self.buffered,
            released: self.released,
            emitted_sessions: &self.emitted_sessions,
        }
    }

    /// Take back what [`WindowBuffer::saved`] kept.
    pub fn restore(
        &mut self,
        buffered: BTreeMap<u32, Vec<RecordBatch>>,
        released: Option<i64>,
        emitted_sessions: BTreeMap<u32, HashMap<String, (i64, i64)>>,
    ) {
        self.buffered = buffered;
        self.released = released;
        self.emitted_sessions = emitted_sessions;
        self.journal.changes.clear();
        self.journal.whole = false;
    }

    fn split_late(
        &self,
        edge: u32,
        window: &EdgeWindow,
        b: RecordBatch,
        released: i64,
        open: &mut Option<HashMap<String, i64>>,
    ) -> Result<(RecordBatch, Option<LateRows>)> {
        let windows: Vec<Option<(i64, i64)>> = match window {
            EdgeWindow::Fixed(w) => {
                let ends = window_ends(b.column(w.index).as_ref(), w.size_ms)?;
                ends.iter()
                    .map(|e| e.filter(|e| *e <= released).map(|e| (e - w.size_ms, e)))
                    .collect()
            }
            EdgeWindow::Session(spec) => {
                let times = times_ms(b.column(spec.time).as_ref())?;
                let keys = session_keys(&b, spec)?;
                let emitted = self.emitted_sessions.get(&edge);
                let behind = times
                    .iter()
                    .flatten()
                    .any(|t| t.saturating_add(spec.gap_ms) < released);
                if behind && open.is_none() {
                    *open = Some(self.open_session_starts(edge, spec)?);
                }
                let open = open.as_ref();
                keys.iter()
                    .zip(times.iter())
                    .map(|(k, t)| {
                        let t = t?;
                        let window = (t, t.saturating_add(spec.gap_ms));
                        // Part of a session already emitted.
                        let joins_emitted =
                            emitted.and_then(|m| m.get(k)).is_some_and(|(first, last)| {
                                t >= first - spec.gap_ms && t <= last + spec.gap_ms
                            });
                        // A session of its own that would already be closed,
                        // unless it reaches an open session of its key.
                        let reaches_open = open
                            .and_then(|o| o.get(k))
                            .is_some_and(|first| t >= first - spec.gap_ms);
                        let closed_alone = window.1 < released && !reaches_open;
                        (joins_emitted || closed_alone).then_some(window)
                    })
                    .collect()
            }
            EdgeWindow::SessionStarts => return Ok((b, None)),
        };
        if windows.iter().all(Option::is_none) {
            return Ok((b, None));
        }
        let is_late: BooleanArray = windows.iter().map(|w| Some(w.is_some())).collect();
        let (mut late, mut on_time) = (vec![], vec![]);
        split_into(&b, &is_late, &mut late, &mut on_time)?;
        let on_time = on_time
            .pop()
            .unwrap_or_else(|| RecordBatch::new_empty(b.schema()));
        let late = LateRows {
            edge,
            batch: late.pop().expect("some rows are late"),
            windows: windows.into_iter().flatten().collect(),
        };
        Ok((on_time, Some(late)))
    }

    /// The earliest time of each key's buffered (still open) rows.
    fn open_session_starts(&self, edge: u32, spec: &SessionSpec) -> Result<HashMap<String, i64>> {
        let mut first: HashMap<String, i64> = HashMap::new();
        for b in self.buffered.get(&edge).into_iter().flatten() {
            let times = times_ms(b.column(spec.time).as_ref())?;
            for (k, t) in session_keys(b, spec)?.into_iter().zip(times.iter()) {
                if let Some(t) = t {
                    let e = first.entry(k).or_insert(t);
                    *e = (*e).min(t);
                }
            }
        }
        Ok(first)
    }
}

fn mask(values: &Int64Array, f: impl Fn(i64) -> bool) -> BooleanArray {
    values.iter().map(|v| Some(v.is_some_and(&f))).collect()
}

/// Rows where `selected` is true go to `yes`, the others to `no`.
fn split_into(
    b: &RecordBatch,
    selected: &BooleanArray,
    yes: &mut Vec<RecordBatch>,
    no: &mut Vec<RecordBatch>,
) -> Result<()> {
    let not: BooleanArray = selected.iter().map(|c| c.map(|c| !c)).collect();
    let y = filter_record_batch(b, selected)?;
    let n = filter_record_batch(b, &not)?;
    if y.num_rows() > 0 {
        yes.push(y);
    }
    if n.num_rows() > 0 {
        no.push(n);
    }
    Ok(())
}

/// The key of every row of a batch, as text (keys are compared, not used).
fn session_keys(batch: &RecordBatch, spec: &SessionSpec) -> Result<Vec<String>> {
    let opts = FormatOptions::default();
    let formatters = spec
        .keys
        .iter()
        .map(|i| ArrayFormatter::try_new(batch.column(*i).as_ref(), &opts))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok((0..batch.num_rows())
        .map(|r| {
            formatters
                .iter()
                .map(|f| f.value(r).to_string())
                .collect::<Vec<_>>()
                .join("\u{1f}")
        })
        .collect())
}

/// Release every row of the keys whose last row is more than the gap behind
/// the watermark (no later row can extend their sessions), noting the span
/// of what was emitted per key.
fn release_sessions(
    batches: &mut Vec<RecordBatch>,
    spec: &SessionSpec,
    watermark: i64,
    emitted: &mut HashMap<String, (i64, i64)>,
) -> Result<Vec<RecordBatch>> {
    let mut span: HashMap<String, (i64, i64)> = HashMap::new();
    let mut keyed = Vec::with_capacity(batches.len());
    for b in batches.iter() {
        let keys = session_keys(b, spec)?;
        let times = times_ms(b.column(spec.time).as_ref())?;
        for (k, t) in keys.iter().zip(times.iter()) {
            if let Some(t) = t {
                let e = span.entry(k.clone()).or_insert((t, t));
                *e = (e.0.min(t), e.1.max(t));
            }
        }
        keyed.push(keys);
    }
    let closed = |k: &String| {
        span.get(k)
            .is_some_and(|(_, last)| last + spec.gap_ms < watermark)
    };
    let (mut out, mut keep) = (vec![], vec![]);
    for (b, keys) in batches.drain(..).zip(keyed) {
        let is_closed: BooleanArray = keys.iter().map(|k| Some(closed(k))).collect();
        split_into(&b, &is_closed, &mut out, &mut keep)?;
    }
    *batches = keep;
    for (k, s) in span.iter().filter(|(k, _)| closed(k)) {
        emitted.insert(k.clone(), *s);
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
