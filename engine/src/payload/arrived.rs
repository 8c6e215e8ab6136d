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

/// Why a frame does not decode.
#[derive(Debug, thiserror::Error)]
pub enum FrameDecodeError {
    /// The bytes do not decompress.
    #[error("not a valid {0:?} frame: {1}")]
    Compression(Encoding, String),
    /// What they decompress to is not an Arrow IPC stream of the schema.
    #[error("not a valid Arrow IPC stream: {0}")]
    Ipc(String),
}

impl WireFrame {
    /// The batches the frame holds, checked against `expected`: the IPC
    /// stream is checked before arrow reads it ([`crate::ipc_decode`]), and
    /// every failure is an error, never a panic.
    pub fn decode(&self, expected: &SchemaRef) -> Result<Vec<RecordBatch>, FrameDecodeError> {
        let ipc = decompress(self.encoding, &self.bytes)
            .map_err(|e| FrameDecodeError::Compression(self.encoding, e.to_string()))?;
        // The last line of defence: an arrow path the checks missed must
        // not take the instance down. (Only where panics unwind; under
        // `panic = "abort"` the checks in ipc_decode are what holds.)
        std::panic::catch_unwind(|| crate::ipc_decode::decode_stream(&ipc, expected))
            .unwrap_or_else(|panic| {
                Err(format!(
                    "the Arrow decoder panicked: {}",
                    panic_text(&*panic)
                ))
            })
            .map_err(FrameDecodeError::Ipc)
    }
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

/// The rows of one payload and, when it was compressed, its frame.
#[derive(Debug, Clone, Default)]
pub struct Arrived {
    /// The decoded rows.
    pub batches: Vec<RecordBatch>,
    /// The frame they were decoded from.
    pub frame: Option<Arc<WireFrame>>,
}

/// Every batch of `arrived`, frames dropped.
pub fn batches_of(arrived: Vec<Arrived>) -> Vec<RecordBatch> {
    arrived.into_iter().flat_map(|a| a.batches).collect()
}
