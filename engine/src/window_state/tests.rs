use super::*;
use crate::dead_letter::rows_as_json;
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

/// Each batch as a payload of its own, sent uncompressed (no frame).
fn plain(batches: Vec<RecordBatch>) -> Vec<Arrived> {
    batches
        .into_iter()
        .map(|b| Arrived {
            batches: vec![b],
            frame: None,
        })
        .collect()
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
        buf.add(1, plain(vec![rows(&["a", "b"], &[0, 10_000])]))
            .unwrap()
            .is_empty()
    );
    assert_eq!(count(&buf.release(9_999).unwrap()), 0);
    assert_eq!(count(&buf.release(10_000).unwrap()), 1);
    // The [0, 10 s) window was emitted: a row for it is late.
    let late = buf
        .add(1, plain(vec![rows(&["c", "d"], &[0, 10_000])]))
        .unwrap();
    assert_eq!(late.len(), 1);
    assert_eq!(late[0].batch.num_rows(), 1);
    assert_eq!(late[0].windows, vec![(0, 10_000)]);
    assert_eq!(count(&buf.take_all()), 2);
}

#[test]
fn a_payload_kept_whole_is_journalled_with_its_frame_and_one_cut_by_lateness_is_not() {
    let w = EdgeWindow::Fixed(WindowColumn {
        index: 1,
        size_ms: 10_000,
    });
    let mut buf = WindowBuffer::new([(1, Some(w.clone()))].into_iter().collect());
    buf.keep_changes();
    let frame = Arc::new(WireFrame {
        encoding: crate::payload::Encoding::Zstd,
        bytes: vec![1, 2, 3],
    });
    let arrived = |batches: Vec<RecordBatch>| Arrived {
        batches,
        frame: Some(frame.clone()),
    };
    let on_time = rows(&["a", "b"], &[0, 10_000]);
    let empty = rows(&[], &[]);
    buf.add(1, vec![arrived(vec![on_time.clone(), empty])])
        .unwrap();
    buf.release(10_000).unwrap();
    // The [0, 10 s) window was emitted: "c" is late, so its payload's
    // frame no longer says what is held.
    let mixed = rows(&["c", "d"], &[0, 10_000]);
    let late = buf.add(1, vec![arrived(vec![mixed])]).unwrap();
    assert_eq!(late[0].batch.num_rows(), 1);
    let changes = buf.take_changes().unwrap();
    assert_eq!(changes.len(), 3, "{changes:?}");
    assert_eq!(
        changes[0],
        Change::Arrived {
            edge: 1,
            batches: vec![on_time],
            frame: frame.clone(),
        }
    );
    assert_eq!(changes[1], Change::Released(10_000));
    match &changes[2] {
        Change::Rows { edge: 1, batch } => assert_eq!(batch.num_rows(), 1),
        other => panic!("{other:?}"),
    }
    // Applied to the state before them, the changes give the same rows.
    let mut restored = WindowBuffer::new([(1, Some(w))].into_iter().collect());
    restored.apply(changes).unwrap();
    assert_eq!(restored.rows(), buf.rows());
}

#[test]
fn a_late_session_row_is_one_that_would_extend_an_emitted_session() {
    let spec = SessionSpec {
        keys: vec![0],
        time: 1,
        gap_ms: 10,
    };
    let mut buf = WindowBuffer::new([(1, Some(EdgeWindow::Session(spec)))].into_iter().collect());
    buf.add(1, plain(vec![rows(&["a", "a", "b"], &[80, 85, 100])]))
        .unwrap();
    // a's session ends at 85 + 10 < 100: emitted; b stays open.
    assert_eq!(count(&buf.release(100).unwrap()), 2);
    // 90 would join a's emitted session: late. 130 opens a new one.
    // b at 95 reaches b's open session: on time.
    let late = buf
        .add(1, plain(vec![rows(&["a", "a", "b"], &[90, 130, 95])]))
        .unwrap();
    assert_eq!(late.iter().map(|l| l.batch.num_rows()).sum::<usize>(), 1);
    assert_eq!(late[0].windows, vec![(90, 100)]);
    // A key never seen, whose lone session would already be closed.
    let late = buf.add(1, plain(vec![rows(&["z"], &[50])])).unwrap();
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
    live.add(1, plain(vec![rows(&["a", "b"], &[0, 100])]))
        .unwrap();
    live.add(2, plain(vec![rows(&["a", "b"], &[80, 100])]))
        .unwrap();
    live.release(50).unwrap();
    // The checkpoint: a whole state, then only changes.
    let saved = live.saved();
    let (buffered, released, sessions) = (
        saved.buffered.clone(),
        saved.released,
        saved.emitted_sessions.clone(),
    );
    assert!(live.take_changes().is_some());
    live.add(1, plain(vec![rows(&["c"], &[200])])).unwrap();
    live.add(2, plain(vec![rows(&["a", "c"], &[85, 300])]))
        .unwrap();
    live.release(100).unwrap();
    live.add(1, plain(vec![rows(&["d"], &[0])])).unwrap(); // late: not a change
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
    live.add(1, plain(vec![first.clone()])).unwrap();
    live.add(1, plain(vec![second.clone()])).unwrap();
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
