//! The envelope: who sent a payload, which fragment it is, what it carries,
//! and decoding its data back into batches.

use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use serde::{Deserialize, Serialize};

use super::arrived::{Arrived, WireFrame};
use super::frame::Encoding;
use crate::error::{EngineError, Result};

/// Lambda's limit for a synchronous (RequestResponse) invocation payload.
pub const SYNC_PAYLOAD_LIMIT: usize = 6 * 1024 * 1024;
/// Lambda's limit for an asynchronous (Event) invocation payload.
pub const ASYNC_PAYLOAD_LIMIT: usize = 1024 * 1024;
/// Room kept for the JSON envelope around `data`.
pub(super) const ENVELOPE_ALLOWANCE: usize = 2 * 1024;
/// Most fragments one sender may split one epoch's output for one receiver
/// into. A sender holds its output in memory: at most 10,240 MiB, Lambda's
/// largest function, which is 10,240 fragments of the smallest (1 MiB,
/// async) limit; halving pieces that still do not fit can leave fragments
/// under the limit, so the cap leaves six-fold room. Senders refuse to send
/// more (`encode_payloads`), receivers refuse to accept more.
pub const MAX_FRAGMENTS: u32 = 65_536;

/// Names the sending instance among its stage's instances.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PayloadId {
    /// The query code.
    pub qid: String,
    /// The sending instance.
    pub seq_num: u32,
    /// How many instances its stage has.
    pub seq_len: u32,
}

/// Which fragment of one output this payload is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fragment {
    /// This fragment's index.
    pub index: u32,
    /// How many fragments the output has.
    pub count: u32,
}

impl Default for Fragment {
    fn default() -> Self {
        Fragment { index: 0, count: 1 }
    }
}

/// The envelope data travels in between functions (see the module).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Payload {
    /// The sender.
    pub uuid: PayloadId,
    /// Which fragment of the sender's output.
    #[serde(default)]
    pub fragment: Fragment,
    /// The epoch.
    pub epoch: u64,
    /// The exchange edge this payload travels on (the upstream stage id).
    pub shuffle_id: u32,
    /// How `data` is compressed.
    pub encoding: Encoding,
    /// Event-time watermark (ms since the epoch) of the sender, if any.
    #[serde(default)]
    pub watermark: Option<i64>,
    /// Every source behind the sender is idle: its watermark does not hold
    /// the receiver back (see `watermark.rs`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub idle: bool,
    /// True on the last epoch of a bounded run: stateful stages flush.
    #[serde(default)]
    pub last: bool,
    /// The epoch will be committed: stateful stages keep their state.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub checkpoint: bool,
    /// Source positions covered by this data, carried to the sink.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub offsets: Vec<SourceOffset>,
    /// Base64 of the compressed Arrow IPC stream; empty for metadata-only payloads.
    #[serde(default)]
    pub data: String,
}

/// A position in a partitioned source, e.g. (topic, partition, next offset).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SourceOffset {
    /// The source table.
    pub source: String,
    /// The partition (shard).
    pub partition: i32,
    /// The next offset to read.
    pub offset: i64,
    /// A position that is not a number: the last Kinesis sequence number
    /// read from a shard (`partition` is then the shard's number).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<String>,
}

impl Payload {
    /// The payload's id as one string, for errors and logs.
    pub fn uuid_string(&self) -> String {
        format!(
            "{}/{}/{}#{}.{}",
            self.uuid.qid,
            self.uuid.seq_num,
            self.uuid.seq_len,
            self.fragment.index,
            self.shuffle_id
        )
    }

    /// The payload as JSON.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("payload serialises")
    }

    /// A payload from JSON, checking its envelope only.
    pub fn from_json(bytes: &[u8]) -> Result<Self> {
        let p: Payload =
            serde_json::from_slice(bytes).map_err(|e| EngineError::BadEnvelope(e.into()))?;
        Ok(p)
    }

    /// Structural checks that need no decoding of `data`.
    pub fn validate(&self, stage: &str) -> Result<()> {
        let bad = |reason: String| EngineError::BadPayload {
            uuid: self.uuid_string(),
            stage: stage.to_string(),
            reason,
        };
        if self.uuid.seq_len == 0 || self.uuid.seq_num >= self.uuid.seq_len {
            return Err(bad(format!(
                "seq_num {} is not below seq_len {}",
                self.uuid.seq_num, self.uuid.seq_len
            )));
        }
        if self.fragment.count == 0
            || self.fragment.count > MAX_FRAGMENTS
            || self.fragment.index >= self.fragment.count
        {
            return Err(bad(format!(
                "fragment {} is not below fragment count {} (at most {MAX_FRAGMENTS})",
                self.fragment.index, self.fragment.count
            )));
        }
        Ok(())
    }

    /// Decode `data` into record batches, checking the schema against what
    /// the stage expects. Every failure is an error naming the payload and
    /// stage; the IPC stream is checked before arrow reads it
    /// ([`crate::ipc_decode`]).
    pub fn decode_batches(&self, stage: &str, expected: &SchemaRef) -> Result<Vec<RecordBatch>> {
        Ok(self.decode_arrived(stage, expected)?.batches)
    }

    /// Decode `data` as [`Payload::decode_batches`] does, keeping the
    /// compressed stream beside the batches (see [`Arrived`]).
    pub fn decode_arrived(&self, stage: &str, expected: &SchemaRef) -> Result<Arrived> {
        let bad = |reason: String| EngineError::BadPayload {
            uuid: self.uuid_string(),
            stage: stage.to_string(),
            reason,
        };
        if self.data.is_empty() {
            return Ok(Arrived::default());
        }
        let compressed = B64
            .decode(self.data.as_bytes())
            .map_err(|e| bad(format!("data is not valid base64: {e}")))?;
        let frame = WireFrame {
            encoding: self.encoding,
            bytes: compressed,
        };
        let batches = frame
            .decode(expected)
            .map_err(|e| bad(format!("data is {e}")))?;
        let frame = (self.encoding != Encoding::None).then(|| Arc::new(frame));
        Ok(Arrived { batches, frame })
    }
}
