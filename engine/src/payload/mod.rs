//! The invocation payload: a JSON envelope around an Arrow IPC stream.
//!
//! ```text
//! { "uuid": {"qid", "seq_num", "seq_len"}, "fragment": {"index", "count"},
//!   "epoch", "shuffle_id", "encoding", "watermark", "last", "data": "<base64>" }
//! ```
//! `seq_num` is the sending upstream instance and `seq_len` how many there
//! are; when one instance's output is larger than an invocation may carry it
//! is split into fragments, and `fragment.count` says how many to expect.
//! Bytes always travel as base64 text: Lambda payloads must be JSON.

mod arrived;
mod envelope;
mod frame;
mod send;
#[cfg(test)]
mod tests;

pub use arrived::{Arrived, FrameDecodeError, WireFrame, batches_of};
pub use envelope::{
    ASYNC_PAYLOAD_LIMIT, Fragment, MAX_FRAGMENTS, Payload, PayloadId, SYNC_PAYLOAD_LIMIT,
    SourceOffset,
};
pub use frame::{Encoding, MAX_DECODED_BYTES, UnknownEncoding};
pub(crate) use frame::{compress, decompress_within};
pub use send::{PayloadHeader, encode_data, encode_payloads, ipc_bytes};
