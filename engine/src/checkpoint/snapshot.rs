//! A stateful member's state as bytes: a JSON header (watermark, what has
//! been emitted) and the held rows of each input edge as an Arrow IPC
//! stream, the whole zstd-compressed.

use std::collections::{BTreeMap, HashMap};

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};
use crate::ipc_decode::decode_stream;
use crate::payload::ipc_bytes;
use crate::watermark::Watermark;
use crate::window_state::SavedWindows;

const MAGIC: &[u8; 8] = b"SKSTATE1";

/// A member's state as of the end of an epoch, decoded.
#[derive(Debug, Default)]
pub struct MemberState {
    pub epoch: u64,
    pub watermark: Watermark,
    pub buffered: BTreeMap<u32, Vec<RecordBatch>>,
    pub released: Option<i64>,
    pub emitted_sessions: BTreeMap<u32, HashMap<String, (i64, i64)>>,
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
    };
    let json = serde_json::to_vec(&header).map_err(|e| EngineError::Context(e.to_string()))?;
    let mut raw = Vec::with_capacity(json.len() + 64);
    raw.extend_from_slice(MAGIC);
    raw.extend_from_slice(&(json.len() as u64).to_le_bytes());
    raw.extend_from_slice(&json);
    for edge in edges {
        let schema = schemas.get(&edge).ok_or_else(|| {
            EngineError::Context(format!("state of edge {edge}: no schema for it"))
        })?;
        let ipc = ipc_bytes(schema, &windows.buffered[&edge])?;
        raw.extend_from_slice(&(ipc.len() as u64).to_le_bytes());
        raw.extend_from_slice(&ipc);
    }
    zstd::bulk::compress(&raw, 1).map_err(EngineError::Io)
}

/// Decode what [`encode_state`] wrote; `what` names it in errors.
pub fn decode_state(
    bytes: &[u8],
    schemas: &BTreeMap<u32, SchemaRef>,
    what: &str,
) -> Result<MemberState> {
    let bad = |reason: String| EngineError::Context(format!("state {what}: {reason}"));
    let raw =
        zstd::stream::decode_all(bytes).map_err(|e| bad(format!("does not decompress: {e}")))?;
    let mut pos = 0usize;
    let mut take = |n: usize| -> Result<&[u8]> {
        let end = pos
            .checked_add(n)
            .filter(|end| *end <= raw.len())
            .ok_or_else(|| bad("truncated".into()))?;
        let slice = &raw[pos..end];
        pos = end;
        Ok(slice)
    };
    if take(MAGIC.len())? != MAGIC {
        return Err(bad("not a Skein state (bad magic)".into()));
    }
    let len = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes")) as usize;
    let json_len = len(take(8)?);
    let header: Header =
        serde_json::from_slice(take(json_len)?).map_err(|e| bad(format!("header: {e}")))?;
    let mut buffered = BTreeMap::new();
    for edge in &header.edges {
        let n = len(take(8)?);
        let schema = schemas
            .get(edge)
            .ok_or_else(|| bad(format!("edge {edge} is not an input of this stage")))?;
        let batches =
            decode_stream(take(n)?, schema).map_err(|e| bad(format!("edge {edge}: {e}")))?;
        buffered.insert(*edge, batches);
    }
    Ok(MemberState {
        epoch: header.epoch,
        watermark: Watermark {
            value: header.watermark,
            idle: header.idle,
        },
        buffered,
        released: header.released,
        emitted_sessions: header
            .emitted_sessions
            .into_iter()
            .map(|(e, v)| (e, v.into_iter().map(|(k, a, b)| (k, (a, b))).collect()))
            .collect(),
    })
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
        let back = decode_state(&bytes, &schemas, "t").unwrap();
        assert_eq!(back.epoch, 3);
        assert_eq!(back.watermark, wm);
        assert_eq!(back.released, Some(7));
        assert_eq!(back.buffered[&4], vec![batch]);
        assert_eq!(back.emitted_sessions, sessions);
        for cut in [0, 5, bytes.len() / 2, bytes.len() - 1] {
            assert!(decode_state(&bytes[..cut], &schemas, "t").is_err());
        }
        let other = zstd::bulk::compress(b"SKSTATE1\xff\xff\xff\xff\xff\xff\xff\xff", 1).unwrap();
        assert!(decode_state(&other, &schemas, "t").is_err());
    }
}
