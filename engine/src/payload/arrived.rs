//! Rows as a payload brought them: the batches, and the sender's compressed
//! Arrow IPC stream they were decoded from.
//!
//! A stateful member keeps most of what arrives until its window closes,
//! and a checkpoint must then write those rows. The sender already encoded
//! and compressed them once; keeping its frame lets the checkpoint write it
//! as it is instead of encoding and compressing the same rows a second time
//! on the epoch's path.

use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;

use super::frame::{Encoding, decompress};

/// A sender's compressed Arrow IPC stream, as it travelled.
#[derive(Debug, PartialEq)]
pub struct WireFrame {
    /// How `bytes` is compressed (never [`Encoding::None`]: an uncompressed
    /// stream is not worth keeping beside its rows).
    pub encoding: Encoding,
    /// The compressed stream.
    pub bytes: Vec<u8>,
}

impl WireFrame {
    /// The non-empty batches the frame holds, checked against `expected`
    /// as a payload's data is; every failure is a message, never a panic.
    pub fn decode(&self, expected: &SchemaRef) -> Result<Vec<RecordBatch>, String> {
        let ipc = decompress(self.encoding, &self.bytes)
            .map_err(|e| format!("not a valid {:?} frame: {e}", self.encoding))?;
        let batches = std::panic::catch_unwind(|| crate::ipc_decode::decode_stream(&ipc, expected))
            .unwrap_or_else(|_| Err("the Arrow decoder panicked".into()))?;
        Ok(batches.into_iter().filter(|b| b.num_rows() > 0).collect())
    }
}

/// The rows of one payload and, when it was compressed, its frame.
#[derive(Debug, Clone, Default)]
pub struct Arrived {
    /// The decoded rows.
    pub batches: Vec<RecordBatch>,
    /// The frame they were decoded from.
    pub frame: Option<Arc<WireFrame>>,
}

impl From<Vec<RecordBatch>> for Arrived {
    fn from(batches: Vec<RecordBatch>) -> Self {
        Arrived {
            batches,
            frame: None,
        }
    }
}

/// Every batch of `arrived`, frames dropped.
pub fn batches_of(arrived: Vec<Arrived>) -> Vec<RecordBatch> {
    arrived.into_iter().flat_map(|a| a.batches).collect()
}
