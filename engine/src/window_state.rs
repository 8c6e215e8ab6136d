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

use datafusion::arrow::array::{Array, BooleanArray, Int64Array};
use datafusion::arrow::compute::filter_record_batch;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};

use crate::context::EdgeWindow;
use crate::error::Result;
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
    /// The watermark released every window ending at or before it.
    Released(i64),
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

    /// Keep an epoch's rows of one edge; rows whose window was already
    /// emitted are returned instead.
    pub fn add(&mut self, edge: u32, batches: Vec<RecordBatch>) -> Result<Vec<LateRows>> {
        let mut late = vec![];
        let window = self.windows.get(&edge).cloned().flatten();
        // Open sessions per key, computed once per call and only if needed.
        let mut open = None;
        for b in batches.into_iter().filter(|b| b.num_rows() > 0) {
            let (on_time, late_rows) = match (&window, self.released) {
                (Some(w), Some(released)) => self.split_late(edge, w, b, released, &mut open)?,
                _ => (b, None),
            };
            if on_time.num_rows() > 0 {
                self.journal.push(|| Change::Rows {
                    edge,
                    batch: on_time.clone(),
                });
                self.buffered.entry(edge).or_default().push(on_time);
            }
            late.extend(late_rows);
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

/// Rows as JSON objects of their displayed values, for dead letters.
pub fn rows_as_json(batch: &RecordBatch) -> Result<Vec<String>> {
    let opts = FormatOptions::default();
    let schema = batch.schema();
    let formatters = batch
        .columns()
        .iter()
        .map(|c| ArrayFormatter::try_new(c.as_ref(), &opts))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok((0..batch.num_rows())
        .map(|r| {
            let obj: serde_json::Map<String, serde_json::Value> = schema
                .fields()
                .iter()
                .zip(&formatters)
                .enumerate()
                .map(|(i, (f, fmt))| {
                    let v = if batch.column(i).is_null(r) {
                        serde_json::Value::Null
                    } else {
                        serde_json::Value::String(fmt.value(r).to_string())
                    };
                    (f.name().clone(), v)
                })
                .collect();
            serde_json::Value::Object(obj).to_string()
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::window::WindowColumn;
    use datafusion::arrow::array::{StringArray, TimestampMillisecondArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
    use std::sync::Arc;

    fn rows(keys: &[&str], times: &[i64]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, false),
            Field::new("t", DataType::Timestamp(TimeUnit::Millisecond, None), false),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(keys.to_vec())),
                Arc::new(TimestampMillisecondArray::from(times.to_vec())),
            ],
        )
        .unwrap()
    }

    fn count(m: &BTreeMap<u32, Vec<RecordBatch>>) -> usize {
        m.values().flatten().map(|b| b.num_rows()).sum()
    }

    #[test]
    fn tumbling_rows_wait_for_the_watermark_and_late_ones_are_set_aside() {
        // Column t holds window starts of 10 s windows.
        let w = EdgeWindow::Fixed(WindowColumn {
            index: 1,
            size_ms: 10_000,
        });
        let mut buf = WindowBuffer::new([(1, Some(w))].into_iter().collect());
        assert!(
            buf.add(1, vec![rows(&["a", "b"], &[0, 10_000])])
                .unwrap()
                .is_empty()
        );
        assert_eq!(count(&buf.release(9_999).unwrap()), 0);
        assert_eq!(count(&buf.release(10_000).unwrap()), 1);
        // The [0, 10 s) window was emitted: a row for it is late.
        let late = buf.add(1, vec![rows(&["c", "d"], &[0, 10_000])]).unwrap();
        assert_eq!(late.len(), 1);
        assert_eq!(late[0].batch.num_rows(), 1);
        assert_eq!(late[0].windows, vec![(0, 10_000)]);
        assert_eq!(count(&buf.take_all()), 2);
    }

    #[test]
    fn a_late_session_row_is_one_that_would_extend_an_emitted_session() {
        let spec = SessionSpec {
            keys: vec![0],
            time: 1,
            gap_ms: 10,
        };
        let mut buf =
            WindowBuffer::new([(1, Some(EdgeWindow::Session(spec)))].into_iter().collect());
        buf.add(1, vec![rows(&["a", "a", "b"], &[80, 85, 100])])
            .unwrap();
        // a's session ends at 85 + 10 < 100: emitted; b stays open.
        assert_eq!(count(&buf.release(100).unwrap()), 2);
        // 90 would join a's emitted session: late. 130 opens a new one.
        // b at 95 reaches b's open session: on time.
        let late = buf
            .add(1, vec![rows(&["a", "a", "b"], &[90, 130, 95])])
            .unwrap();
        assert_eq!(late.iter().map(|l| l.batch.num_rows()).sum::<usize>(), 1);
        assert_eq!(late[0].windows, vec![(90, 100)]);
        // A key never seen, whose lone session would already be closed.
        let late = buf.add(1, vec![rows(&["z"], &[50])]).unwrap();
        assert_eq!(late.len(), 1);
    }

    #[test]
    fn changes_applied_to_an_earlier_state_give_the_same_buffer() {
        let spec = SessionSpec {
            keys: vec![0],
            time: 1,
            gap_ms: 10,
        };
        let windows: BTreeMap<u32, Option<EdgeWindow>> = [
            (
                1,
                Some(EdgeWindow::Fixed(WindowColumn {
                    index: 1,
                    size_ms: 100,
                })),
            ),
            (2, Some(EdgeWindow::Session(spec))),
        ]
        .into();
        let mut live = WindowBuffer::new(windows.clone());
        live.keep_changes();
        live.add(1, vec![rows(&["a", "b"], &[0, 100])]).unwrap();
        live.add(2, vec![rows(&["a", "b"], &[80, 100])]).unwrap();
        live.release(50).unwrap();
        // The checkpoint: a whole state, then only changes.
        let saved = live.saved();
        let (buffered, released, sessions) = (
            saved.buffered.clone(),
            saved.released,
            saved.emitted_sessions.clone(),
        );
        assert!(live.take_changes().is_some());
        live.add(1, vec![rows(&["c"], &[200])]).unwrap();
        live.add(2, vec![rows(&["a", "c"], &[85, 300])]).unwrap();
        live.release(100).unwrap();
        live.add(1, vec![rows(&["d"], &[0])]).unwrap(); // late: not a change
        live.release(250).unwrap();
        let changes = live.take_changes().unwrap();
        let mut back = WindowBuffer::new(windows);
        back.restore(buffered, released, sessions);
        back.apply(changes).unwrap();
        assert_eq!(back.buffered, live.buffered);
        assert_eq!(back.released, live.released);
        assert_eq!(back.emitted_sessions, live.emitted_sessions);
        // After everything is taken only a whole state says what is left.
        live.take_all();
        assert!(live.take_changes().is_none());
        assert_eq!(live.take_changes(), Some(vec![]));
    }

    #[test]
    fn a_merge_leaves_the_changes_as_the_rows_came() {
        let windows: BTreeMap<u32, Option<EdgeWindow>> = [(
            1,
            Some(EdgeWindow::Fixed(WindowColumn {
                index: 1,
                size_ms: 100,
            })),
        )]
        .into();
        let mut live = WindowBuffer::new(windows);
        live.keep_changes();
        assert_eq!(live.take_changes(), Some(vec![]));
        let (first, second) = (rows(&["a"], &[10]), rows(&["a"], &[20]));
        live.add(1, vec![first.clone()]).unwrap();
        live.add(1, vec![second.clone()]).unwrap();
        assert_eq!(live.take_edge(1).len(), 2);
        // Stands for the two partial rows merged into one.
        live.put_back(1, vec![first.clone()]);
        assert_eq!(live.rows(), 1);
        let changes = live
            .take_changes()
            .expect("a merge is no reason for a whole state");
        let batches: Vec<_> = changes
            .into_iter()
            .map(|c| match c {
                Change::Rows { edge: 1, batch } => batch,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(batches, vec![first, second]);
    }

    #[test]
    fn rows_become_json_objects() {
        let json = rows_as_json(&rows(&["a"], &[1_000])).unwrap();
        assert_eq!(
            json,
            vec![r#"{"k":"a","t":"1970-01-01T00:00:01"}"#.to_string()]
        );
    }
}
