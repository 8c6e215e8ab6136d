//! A stateful member's state as bytes: a JSON header (watermark, what has
//! been emitted) and the held rows of each input edge as an Arrow IPC
//! stream, the whole LZ4-compressed (stores written before that hold zstd
//! frames, which still decode).
//!
//! A state is whole, or the changes since an earlier state (its base): the
//! rows kept and the watermarks that released windows, in order. Changes
//! cost what an epoch added rather than every row of the open windows.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};
use crate::ipc_decode::decode_stream;
use crate::payload::{Encoding, WireFrame, decompress_within, ipc_bytes};
use crate::watermark::Watermark;
use crate::window_state::{Change, SavedWindows};

const MAGIC: &[u8; 8] = b"SKSTATE1";

/// What an LZ4-compressed state starts with, before the payload codec's
/// LZ4 frame (the raw length, then the block). LZ4 rather than zstd: a
/// member compresses its state every epoch on the epoch's path, and zstd
/// at level 1 cost several times what LZ4 does for the same Arrow data
/// (bytes are cheap on an object store; requests and milliseconds are what
/// a checkpoint is billed for).
const LZ4_TAG: &[u8; 4] = b"SKL4";

/// What a state holding senders' frames starts with: the length of the
/// LZ4 part (header and re-encoded rows, as after [`LZ4_TAG`]), that part,
/// then each frame as its encoding, length and bytes. The frames are
/// already compressed, so they sit beside the LZ4 part, not inside it.
const FRAMES_TAG: &[u8; 4] = b"SKLF";

/// LZ4 cannot expand its input more than 255-fold: a state claiming more
/// is corrupt, and refusing it keeps it from allocating without bound.
const LZ4_MAX_RATIO: usize = 255;

fn compress(raw: &[u8]) -> Vec<u8> {
    let mut out = LZ4_TAG.to_vec();
    out.extend_from_slice(&crate::payload::compress(Encoding::Lz4, raw));
    out
}

/// [`compress`], with `frames` after the LZ4 part when there are any.
fn compress_with(raw: &[u8], frames: &[&WireFrame]) -> Vec<u8> {
    if frames.is_empty() {
        return compress(raw);
    }
    let lz4 = crate::payload::compress(Encoding::Lz4, raw);
    let framed: usize = frames.iter().map(|f| f.bytes.len() + 9).sum();
    let mut out = Vec::with_capacity(FRAMES_TAG.len() + 8 + lz4.len() + framed);
    out.extend_from_slice(FRAMES_TAG);
    out.extend_from_slice(&(lz4.len() as u64).to_le_bytes());
    out.extend_from_slice(&lz4);
    for f in frames {
        out.push(encoding_code(f.encoding));
        out.extend_from_slice(&(f.bytes.len() as u64).to_le_bytes());
        out.extend_from_slice(&f.bytes);
    }
    out
}

fn encoding_code(encoding: Encoding) -> u8 {
    match encoding {
        Encoding::None => 0,
        Encoding::Zstd => 1,
        Encoding::Lz4 => 2,
    }
}

fn code_encoding(code: u8) -> std::result::Result<Encoding, String> {
    match code {
        0 => Ok(Encoding::None),
        1 => Ok(Encoding::Zstd),
        2 => Ok(Encoding::Lz4),
        other => Err(format!("unknown frame encoding {other}")),
    }
}

/// Reads bytes in order: `None` when fewer are left than asked for.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.0.len() {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    /// A length, as written: eight bytes, little-endian.
    fn len(&mut self) -> Option<usize> {
        let b = self.take(8)?;
        usize::try_from(u64::from_le_bytes(b.try_into().expect("8 bytes"))).ok()
    }
}

/// The raw bytes of a state and the frames after them: [`compress_with`]'s
/// layout, or [`decompress`]'s.
fn decompress_with(bytes: &[u8]) -> std::result::Result<(Vec<u8>, Vec<WireFrame>), String> {
    let Some(rest) = bytes.strip_prefix(FRAMES_TAG) else {
        return Ok((decompress(bytes)?, vec![]));
    };
    let cut = || "frames cut short".to_string();
    let mut bytes = Cursor(rest);
    let n = bytes.len().ok_or_else(cut)?;
    let lz4 = bytes.take(n).ok_or_else(cut)?;
    let cap = lz4.len().saturating_mul(LZ4_MAX_RATIO).saturating_add(16);
    let raw = decompress_within(Encoding::Lz4, lz4, cap).map_err(|e| e.to_string())?;
    let mut frames = vec![];
    while let Some(code) = bytes.take(1) {
        let encoding = code_encoding(code[0])?;
        let n = bytes.len().ok_or_else(cut)?;
        frames.push(WireFrame {
            encoding,
            bytes: bytes.take(n).ok_or_else(cut)?.to_vec(),
        });
    }
    Ok((raw, frames))
}

/// The raw bytes of a state: LZ4 as [`compress`] writes it, or a zstd frame
/// from an older store.
fn decompress(bytes: &[u8]) -> std::result::Result<Vec<u8>, String> {
    match bytes.strip_prefix(LZ4_TAG) {
        Some(frame) => {
            let cap = frame.len().saturating_mul(LZ4_MAX_RATIO).saturating_add(16);
            decompress_within(Encoding::Lz4, frame, cap).map_err(|e| e.to_string())
        }
        None => zstd::stream::decode_all(bytes).map_err(|e| e.to_string()),
    }
}

/// A member's state as of the end of an epoch, decoded.
#[derive(Debug, Default)]
pub struct MemberState {
    /// The epoch this state is as of the end of.
    pub epoch: u64,
    /// The member's input watermark then.
    pub watermark: Watermark,
    /// Rows held per input edge, not yet released.
    pub buffered: BTreeMap<u32, Vec<RecordBatch>>,
    /// The watermark up to which windows were released.
    pub released: Option<i64>,
    /// Per edge, the sessions already emitted per key, as `(start, end)`.
    pub emitted_sessions: BTreeMap<u32, HashMap<String, (i64, i64)>>,
}

/// A member's changes between its state at `base` and at `epoch`, decoded.
#[derive(Debug, Default)]
pub struct MemberChanges {
    /// The epoch these changes lead to.
    pub epoch: u64,
    /// The epoch of the state they apply to.
    pub base: u64,
    /// The epochs of every object a restore of this state reads before
    /// this one, the whole state first and `base` last; empty in states
    /// written before chains were listed (then only `base` is known).
    pub chain: Vec<u64>,
    /// The member's input watermark at `epoch`.
    pub watermark: Watermark,
    /// The changes, in the order they were made.
    pub changes: Vec<Change>,
}

/// What one state object holds.
#[derive(Debug)]
pub enum Snapshot {
    /// The whole state.
    Whole(MemberState),
    /// Changes since an earlier state.
    Changes(MemberChanges),
}

/// One change in a header; its rows are the next batch of its edge's stream.
#[derive(Serialize, Deserialize)]
enum ChangeHead {
    Rows(u32),
    /// The rows are the next of the frames after the LZ4 part.
    Arrived(u32),
    Released(i64),
}

#[derive(Serialize, Deserialize)]
struct Header {
    epoch: u64,
    watermark: Option<i64>,
    idle: bool,
    released: Option<i64>,
    emitted_sessions: BTreeMap<u32, Vec<(String, i64, i64)>>,
    /// The edges whose rows follow, in order.
    edges: Vec<u32>,
    /// Set when this holds changes on the state at that epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    base: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    changes: Vec<ChangeHead>,
    /// With `base`: the epochs of the chain it ends, whole state first, so
    /// that a restore can read them all at once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    chain: Vec<u64>,
}

/// Header, then per edge the length and bytes of its IPC stream, compressed.
fn frame(
    header: &Header,
    streams: &[(u32, &[RecordBatch])],
    frames: &[&WireFrame],
    schemas: &BTreeMap<u32, SchemaRef>,
) -> Result<Vec<u8>> {
    let json = serde_json::to_vec(header).map_err(|e| EngineError::Context(e.to_string()))?;
    let mut raw = Vec::with_capacity(json.len() + 64);
    raw.extend_from_slice(MAGIC);
    raw.extend_from_slice(&(json.len() as u64).to_le_bytes());
    raw.extend_from_slice(&json);
    for (edge, batches) in streams {
        let schema = schemas.get(edge).ok_or_else(|| {
            EngineError::Context(format!("state of edge {edge}: no schema for it"))
        })?;
        let ipc = ipc_bytes(schema, batches)?;
        raw.extend_from_slice(&(ipc.len() as u64).to_le_bytes());
        raw.extend_from_slice(&ipc);
    }
    Ok(compress_with(&raw, frames))
}

/// Encode the changes a member made since its state at the end of
/// `chain`, which lists the epochs of the states a restore reads before
/// these, the whole one first.
pub fn encode_changes(
    epoch: u64,
    chain: &[u64],
    watermark: Watermark,
    changes: &[Change],
    schemas: &BTreeMap<u32, SchemaRef>,
) -> Result<Vec<u8>> {
    let base = *chain
        .last()
        .ok_or_else(|| EngineError::Context("changes with no state to build on".into()))?;
    let mut rows: BTreeMap<u32, Vec<RecordBatch>> = BTreeMap::new();
    let mut frames = vec![];
    let heads = changes
        .iter()
        .map(|c| match c {
            Change::Rows { edge, batch } => {
                rows.entry(*edge).or_default().push(batch.clone());
                ChangeHead::Rows(*edge)
            }
            Change::Arrived { edge, frame, .. } => {
                frames.push(frame.as_ref());
                ChangeHead::Arrived(*edge)
            }
            Change::Released(w) => ChangeHead::Released(*w),
        })
        .collect();
    let header = Header {
        epoch,
        watermark: watermark.value,
        idle: watermark.idle,
        released: None,
        emitted_sessions: BTreeMap::new(),
        edges: rows.keys().copied().collect(),
        base: Some(base),
        changes: heads,
        chain: chain.to_vec(),
    };
    let streams: Vec<(u32, &[RecordBatch])> =
        rows.iter().map(|(e, b)| (*e, b.as_slice())).collect();
    frame(&header, &streams, &frames, schemas)
}

/// Encode a member's state; `schemas` gives each edge's row schema.
pub fn encode_state(
    epoch: u64,
    watermark: Watermark,
    windows: SavedWindows<'_>,
    schemas: &BTreeMap<u32, SchemaRef>,
) -> Result<Vec<u8>> {
    let edges: Vec<u32> = windows
        .buffered
        .iter()
        .filter(|(_, b)| b.iter().any(|b| b.num_rows() > 0))
        .map(|(e, _)| *e)
        .collect();
    let header = Header {
        epoch,
        watermark: watermark.value,
        idle: watermark.idle,
        released: windows.released,
        emitted_sessions: windows
            .emitted_sessions
            .iter()
            .map(|(e, m)| {
                let mut v: Vec<_> = m.iter().map(|(k, (a, b))| (k.clone(), *a, *b)).collect();
                v.sort();
                (*e, v)
            })
            .collect(),
        edges: edges.clone(),
        base: None,
        changes: vec![],
        chain: vec![],
    };
    let streams: Vec<(u32, &[RecordBatch])> = edges
        .iter()
        .map(|e| (*e, windows.buffered[e].as_slice()))
        .collect();
    frame(&header, &streams, &[], schemas)
}

/// Decode what [`encode_state`] or [`encode_changes`] wrote; `what` names
/// it in errors.
pub fn decode_state(
    bytes: &[u8],
    schemas: &BTreeMap<u32, SchemaRef>,
    what: &str,
) -> Result<Snapshot> {
    let bad = |reason: String| EngineError::Context(format!("state {what}: {reason}"));
    let (raw, frames) =
        decompress_with(bytes).map_err(|e| bad(format!("does not decompress: {e}")))?;
    let mut frames = frames.into_iter();
    let truncated = || bad("truncated".into());
    let mut bytes = Cursor(&raw);
    if bytes.take(MAGIC.len()).ok_or_else(truncated)? != MAGIC {
        return Err(bad("not a Skein state (bad magic)".into()));
    }
    let json_len = bytes.len().ok_or_else(truncated)?;
    let json = bytes.take(json_len).ok_or_else(truncated)?;
    let header: Header = serde_json::from_slice(json).map_err(|e| bad(format!("header: {e}")))?;
    let mut buffered = BTreeMap::new();
    for edge in &header.edges {
        let n = bytes.len().ok_or_else(truncated)?;
        let schema = schemas
            .get(edge)
            .ok_or_else(|| bad(format!("edge {edge} is not an input of this stage")))?;
        let stream = bytes.take(n).ok_or_else(truncated)?;
        let batches =
            decode_stream(stream, schema).map_err(|e| bad(format!("edge {edge}: {e}")))?;
        buffered.insert(*edge, batches);
    }
    let watermark = Watermark {
        value: header.watermark,
        idle: header.idle,
    };
    if let Some(base) = header.base {
        let mut rows: BTreeMap<u32, std::vec::IntoIter<RecordBatch>> = buffered
            .into_iter()
            .map(|(e, b): (u32, Vec<RecordBatch>)| (e, b.into_iter()))
            .collect();
        let changes = header
            .changes
            .into_iter()
            .map(|c| match c {
                ChangeHead::Rows(edge) => rows
                    .get_mut(&edge)
                    .and_then(Iterator::next)
                    .map(|batch| Change::Rows { edge, batch })
                    .ok_or_else(|| bad(format!("edge {edge} has fewer batches than its changes"))),
                ChangeHead::Arrived(edge) => {
                    let frame = frames
                        .next()
                        .ok_or_else(|| bad(format!("edge {edge}: fewer frames than changes")))?;
                    let schema = schemas
                        .get(&edge)
                        .ok_or_else(|| bad(format!("edge {edge} is not an input of this stage")))?;
                    let batches = frame
                        .decode(schema)
                        .map_err(|e| bad(format!("edge {edge}: frame {e}")))?;
                    Ok(Change::Arrived {
                        edge,
                        batches: batches.into_iter().filter(|b| b.num_rows() > 0).collect(),
                        frame: Arc::new(frame),
                    })
                }
                ChangeHead::Released(w) => Ok(Change::Released(w)),
            })
            .collect::<Result<Vec<_>>>()?;
        if frames.next().is_some() {
            return Err(bad("more frames than changes".into()));
        }
        return Ok(Snapshot::Changes(MemberChanges {
            epoch: header.epoch,
            base,
            chain: header.chain,
            watermark,
            changes,
        }));
    }
    if frames.next().is_some() {
        return Err(bad("a whole state with frames".into()));
    }
    Ok(Snapshot::Whole(MemberState {
        epoch: header.epoch,
        watermark,
        buffered,
        released: header.released,
        emitted_sessions: header
            .emitted_sessions
            .into_iter()
            .map(|(e, v)| (e, v.into_iter().map(|(k, a, b)| (k, (a, b))).collect()))
            .collect(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    #[test]
    fn state_round_trips_and_corruption_is_an_error() {
        let schema: SchemaRef =
            Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, false)]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(Int64Array::from(vec![1, 2, 3]))],
        )
        .unwrap();
        let buffered: BTreeMap<u32, Vec<RecordBatch>> = [(4, vec![batch.clone()])].into();
        let sessions: BTreeMap<u32, HashMap<String, (i64, i64)>> =
            [(4, [("k".to_string(), (1, 9))].into())].into();
        let schemas: BTreeMap<u32, SchemaRef> = [(4, schema)].into();
        let saved = SavedWindows {
            buffered: &buffered,
            released: Some(7),
            emitted_sessions: &sessions,
        };
        let wm = Watermark {
            value: Some(5),
            idle: true,
        };
        let bytes = encode_state(3, wm, saved, &schemas).unwrap();
        let Snapshot::Whole(back) = decode_state(&bytes, &schemas, "t").unwrap() else {
            panic!("a whole state decodes whole");
        };
        assert_eq!(back.epoch, 3);
        assert_eq!(back.watermark, wm);
        assert_eq!(back.released, Some(7));
        assert_eq!(back.buffered[&4], vec![batch.clone()]);
        assert_eq!(back.emitted_sessions, sessions);
        for cut in [0, 5, bytes.len() / 2, bytes.len() - 1] {
            assert!(decode_state(&bytes[..cut], &schemas, "t").is_err());
        }
        let changes = vec![
            Change::Rows {
                edge: 4,
                batch: batch.clone(),
            },
            Change::Released(9),
            Change::Rows { edge: 4, batch },
        ];
        let bytes = encode_changes(5, &[1, 3], wm, &changes, &schemas).unwrap();
        let Snapshot::Changes(back) = decode_state(&bytes, &schemas, "t").unwrap() else {
            panic!("changes decode as changes");
        };
        assert_eq!((back.epoch, back.base, back.watermark), (5, 3, wm));
        assert_eq!(back.chain, [1, 3]);
        assert_eq!(back.changes, changes);
        assert!(encode_changes(5, &[], wm, &changes, &schemas).is_err());
        let other = compress(b"SKSTATE1\xff\xff\xff\xff\xff\xff\xff\xff");
        assert!(decode_state(&other, &schemas, "t").is_err());
        let mut bomb = LZ4_TAG.to_vec();
        bomb.extend_from_slice(&u32::MAX.to_le_bytes());
        bomb.extend_from_slice(&[0; 16]);
        let err = decode_state(&bomb, &schemas, "t").unwrap_err().to_string();
        assert!(err.contains("claims"), "{err}");
    }

    #[test]
    fn a_zstd_state_from_an_older_store_still_decodes() {
        let schema: SchemaRef =
            Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, false)]));
        let batch =
            RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from(vec![4, 5]))])
                .unwrap();
        let schemas: BTreeMap<u32, SchemaRef> = [(1, schema)].into();
        let changes = vec![Change::Rows { edge: 1, batch }];
        let lz4 = encode_changes(2, &[1], Watermark::default(), &changes, &schemas).unwrap();
        assert!(lz4.starts_with(LZ4_TAG));
        let raw = decompress(&lz4).unwrap();
        let old = zstd::bulk::compress(&raw, 1).unwrap();
        let Snapshot::Changes(back) = decode_state(&old, &schemas, "t").unwrap() else {
            panic!("changes decode as changes");
        };
        assert_eq!(back.changes, changes);
    }

    #[test]
    fn rows_that_arrived_compressed_are_written_in_their_frame() {
        let schema: SchemaRef =
            Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, false)]));
        let rows = |v: Vec<i64>| {
            RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from(v))]).unwrap()
        };
        let schemas: BTreeMap<u32, SchemaRef> = [(2, schema.clone())].into();
        let wm = Watermark::default();
        for encoding in [Encoding::Zstd, Encoding::Lz4] {
            let sent = vec![rows((0..1000).collect()), rows(vec![7, 8])];
            let ipc = ipc_bytes(&schema, &sent).unwrap();
            let frame = Arc::new(WireFrame {
                encoding,
                bytes: crate::payload::compress(encoding, &ipc),
            });
            let changes = vec![
                Change::Arrived {
                    edge: 2,
                    batches: sent.clone(),
                    frame: frame.clone(),
                },
                Change::Rows {
                    edge: 2,
                    batch: rows(vec![1]),
                },
                Change::Released(9),
                Change::Arrived {
                    edge: 2,
                    batches: sent.clone(),
                    frame: frame.clone(),
                },
            ];
            let bytes = encode_changes(5, &[3], wm, &changes, &schemas).unwrap();
            assert!(bytes.starts_with(FRAMES_TAG));
            // The frames are written as they came, not encoded again.
            let tail = &bytes[bytes.len() - frame.bytes.len()..];
            assert_eq!(tail, frame.bytes.as_slice());
            let Snapshot::Changes(back) = decode_state(&bytes, &schemas, "t").unwrap() else {
                panic!("changes decode as changes");
            };
            assert_eq!(back.changes, changes, "{encoding:?}");
            for cut in [0, 4, 12, bytes.len() / 2, bytes.len() - 1] {
                assert!(
                    decode_state(&bytes[..cut], &schemas, "t").is_err(),
                    "cut {cut}"
                );
            }
            // One frame fewer than the changes say, or one more.
            let short = &bytes[..bytes.len() - frame.bytes.len() - 9];
            let err = decode_state(short, &schemas, "t").unwrap_err().to_string();
            assert!(err.contains("fewer frames"), "{err}");
            let mut long = bytes.clone();
            long.extend_from_slice(&bytes[bytes.len() - frame.bytes.len() - 9..]);
            let err = decode_state(&long, &schemas, "t").unwrap_err().to_string();
            assert!(err.contains("more frames"), "{err}");
            // An encoding nobody wrote, and rows of another schema.
            let mut odd = bytes.clone();
            let at = bytes.len() - frame.bytes.len() - 9;
            odd[at] = 9;
            let err = decode_state(&odd, &schemas, "t").unwrap_err().to_string();
            assert!(err.contains("unknown frame encoding"), "{err}");
            let other: SchemaRef =
                Arc::new(Schema::new(vec![Field::new("b", DataType::Utf8, true)]));
            let only_frames = encode_changes(5, &[3], wm, &changes[..1], &schemas).unwrap();
            let err = decode_state(&only_frames, &[(2, other)].into(), "t")
                .unwrap_err()
                .to_string();
            assert!(err.contains("edge 2: frame"), "{err}");
        }
    }
}
