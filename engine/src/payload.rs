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

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::ipc::writer::StreamWriter;
use datafusion::arrow::record_batch::RecordBatch;
use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};

/// Lambda's limit for a synchronous (RequestResponse) invocation payload.
pub const SYNC_PAYLOAD_LIMIT: usize = 6 * 1024 * 1024;
/// Lambda's limit for an asynchronous (Event) invocation payload.
pub const ASYNC_PAYLOAD_LIMIT: usize = 1024 * 1024;
/// Room kept for the JSON envelope around `data`.
const ENVELOPE_ALLOWANCE: usize = 2 * 1024;
/// Most bytes one payload's `data` may decompress to. Senders split their
/// output so no fragment exceeds it (see `encode_to_fit`), so a larger
/// claim is hostile: refusing it keeps a zstd or lz4 bomb from allocating
/// without bound.
pub const MAX_DECODED_BYTES: usize = 256 * 1024 * 1024;
/// Most fragments one sender may split one epoch's output for one receiver
/// into. A sender holds its output in memory: at most 10,240 MiB, Lambda's
/// largest function, which is 10,240 fragments of the smallest (1 MiB,
/// async) limit; halving pieces that still do not fit can leave fragments
/// under the limit, so the cap leaves six-fold room. Senders refuse to send
/// more (`encode_payloads`), receivers refuse to accept more.
pub const MAX_FRAGMENTS: u32 = 65_536;

/// How a payload's Arrow data is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// zstd (the default).
    #[default]
    Zstd,
    /// LZ4 block with its size prepended.
    Lz4,
    /// Not compressed.
    None,
}

/// A payload encoding name that is not one of ours.
#[derive(Debug, thiserror::Error)]
#[error("unknown encoding {0:?} (zstd, lz4, none)")]
pub struct UnknownEncoding(String);

impl std::str::FromStr for Encoding {
    type Err = UnknownEncoding;
    fn from_str(s: &str) -> Result<Self, UnknownEncoding> {
        match s {
            "zstd" => Ok(Encoding::Zstd),
            "lz4" => Ok(Encoding::Lz4),
            "none" => Ok(Encoding::None),
            other => Err(UnknownEncoding(other.to_string())),
        }
    }
}

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
        let bad = |reason: String| EngineError::BadPayload {
            uuid: self.uuid_string(),
            stage: stage.to_string(),
            reason,
        };
        if self.data.is_empty() {
            return Ok(vec![]);
        }
        let compressed = B64
            .decode(self.data.as_bytes())
            .map_err(|e| bad(format!("data is not valid base64: {e}")))?;
        let ipc = decompress(self.encoding, &compressed).map_err(|e| {
            bad(format!(
                "data is not a valid {:?} frame: {e}",
                self.encoding
            ))
        })?;
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
            .map_err(|e| bad(format!("data is not a valid Arrow IPC stream: {e}")))
    }
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

fn compress(encoding: Encoding, raw: &[u8]) -> Vec<u8> {
    match encoding {
        Encoding::None => raw.to_vec(),
        Encoding::Zstd => zstd::bulk::compress(raw, 1).expect("zstd compression of memory"),
        Encoding::Lz4 => lz4_flex::block::compress_prepend_size(raw),
    }
}

/// Why a compressed frame of a payload does not decompress.
#[derive(Debug, thiserror::Error)]
enum FrameError {
    #[error("frame claims {0} bytes, above the cap of {MAX_DECODED_BYTES}")]
    TooLarge(u64),
    #[error("zstd frame without content size")]
    NoContentSize,
    #[error("no zstd frame header")]
    NotZstd,
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Lz4(#[from] lz4_flex::block::DecompressError),
}

/// Decompress at most [`MAX_DECODED_BYTES`]: the size a frame claims is
/// checked before anything is allocated for it.
fn decompress(encoding: Encoding, data: &[u8]) -> std::result::Result<Vec<u8>, FrameError> {
    let check = |size: u64| {
        if size > MAX_DECODED_BYTES as u64 {
            Err(FrameError::TooLarge(size))
        } else {
            Ok(size as usize)
        }
    };
    match encoding {
        Encoding::None => Ok(data.to_vec()),
        Encoding::Zstd => {
            let size = zstd::zstd_safe::get_frame_content_size(data)
                .map_err(|_| FrameError::NotZstd)?
                .ok_or(FrameError::NoContentSize)?;
            // The output buffer is the claimed size: a frame that lies
            // about it fails instead of growing it.
            Ok(zstd::bulk::decompress(data, check(size)?)?)
        }
        Encoding::Lz4 => {
            let (size, rest) = lz4_flex::block::uncompressed_size(data)?;
            Ok(lz4_flex::block::decompress(rest, check(size as u64)?)?)
        }
    }
}

/// Arrow IPC stream bytes (schema + batches), uncompressed.
pub fn ipc_bytes(schema: &SchemaRef, batches: &[RecordBatch]) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    {
        let mut w = StreamWriter::try_new(&mut buf, schema)?;
        for b in batches {
            w.write(b)?;
        }
        w.finish()?;
    }
    Ok(buf)
}

/// Encode batches as `data`: IPC stream, compressed, base64.
pub fn encode_data(
    encoding: Encoding,
    schema: &SchemaRef,
    batches: &[RecordBatch],
) -> Result<String> {
    Ok(encode_piece(encoding, schema, batches)?.0)
}

/// `data` for `batches` and the size it decompresses to.
fn encode_piece(
    encoding: Encoding,
    schema: &SchemaRef,
    batches: &[RecordBatch],
) -> Result<(String, usize)> {
    let ipc = ipc_bytes(schema, batches)?;
    Ok((B64.encode(compress(encoding, &ipc)), ipc.len()))
}

/// What every payload of one send has in common.
#[derive(Debug, Clone)]
pub struct PayloadHeader {
    /// The query code.
    pub qid: String,
    /// The sending instance.
    pub seq_num: u32,
    /// How many instances its stage has.
    pub seq_len: u32,
    /// The epoch.
    pub epoch: u64,
    /// The sending stage (edge id).
    pub shuffle_id: u32,
    /// How data is compressed.
    pub encoding: Encoding,
    /// The sender's watermark.
    pub watermark: Option<i64>,
    /// Every sender behind the watermark is idle.
    pub idle: bool,
    /// The run's last epoch.
    pub last: bool,
    /// The epoch will be committed: stateful stages keep their state.
    pub checkpoint: bool,
    /// Source offsets read up to.
    pub offsets: Vec<SourceOffset>,
}

/// Encode one upstream instance's output for one receiver, splitting it into
/// as many fragments as needed so that each JSON payload stays under `limit`
/// bytes. Nothing is dropped: a single row too large for any payload is an
/// error rather than a truncation.
pub fn encode_payloads(
    header: &PayloadHeader,
    schema: &SchemaRef,
    batches: &[RecordBatch],
    limit: usize,
) -> Result<Vec<Payload>> {
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    let datas: Vec<String> = if rows == 0 {
        vec![String::new()]
    } else {
        encode_to_fit(header.encoding, schema, batches, limit)?
    };
    let count = u32::try_from(datas.len())
        .ok()
        .filter(|n| *n <= MAX_FRAGMENTS)
        .ok_or_else(|| {
            EngineError::Context(format!(
                "one send needs {} fragments, above the {MAX_FRAGMENTS} a receiver accepts",
                datas.len()
            ))
        })?;
    let mut out = Vec::with_capacity(datas.len());
    for (i, data) in datas.into_iter().enumerate() {
        out.push(Payload {
            uuid: PayloadId {
                qid: header.qid.clone(),
                seq_num: header.seq_num,
                seq_len: header.seq_len,
            },
            fragment: Fragment {
                index: i as u32,
                count,
            },
            epoch: header.epoch,
            shuffle_id: header.shuffle_id,
            encoding: header.encoding,
            watermark: header.watermark,
            idle: header.idle,
            last: header.last,
            checkpoint: header.checkpoint,
            // Offsets ride on the first fragment only; they describe the whole send.
            offsets: if i == 0 {
                header.offsets.clone()
            } else {
                vec![]
            },
            data,
        });
    }
    Ok(out)
}

/// Encode rows as `data` strings that each fit `limit`. The common case
/// encodes once; a too-large output is cut into as many equal row ranges as
/// its size suggests, and any range still too large is halved again.
fn encode_to_fit(
    encoding: Encoding,
    schema: &SchemaRef,
    batches: &[RecordBatch],
    limit: usize,
) -> Result<Vec<String>> {
    let budget = limit.saturating_sub(ENVELOPE_ALLOWANCE);
    let group: Vec<RecordBatch> = batches
        .iter()
        .filter(|b| b.num_rows() > 0)
        .cloned()
        .collect();
    // A piece fits when it is under the payload limit and decompresses
    // to no more than a receiver accepts.
    let fits = |(data, raw): &(String, usize)| data.len() <= budget && *raw <= MAX_DECODED_BYTES;
    let whole = encode_piece(encoding, schema, &group)?;
    if fits(&whole) {
        return Ok(vec![whole.0]);
    }
    let rows: usize = group.iter().map(|b| b.num_rows()).sum();
    // Aim a little under the budget so most pieces fit the first time.
    let pieces = (whole.0.len() as f64 / (budget as f64 * 0.85))
        .max(whole.1 as f64 / (MAX_DECODED_BYTES as f64 * 0.85))
        .ceil()
        .max(2.0) as usize;
    let per = rows.div_ceil(pieces);
    let mut pending: Vec<Vec<RecordBatch>> = vec![];
    let mut rest = group;
    while !rest.is_empty() {
        let left: usize = rest.iter().map(|b| b.num_rows()).sum();
        let (piece, tail) = halve(&rest, per.min(left));
        pending.push(piece);
        rest = tail;
    }
    pending.reverse();
    let mut done = vec![];
    while let Some(piece) = pending.pop() {
        let encoded = encode_piece(encoding, schema, &piece)?;
        if fits(&encoded) {
            done.push(encoded.0);
            continue;
        }
        let n: usize = piece.iter().map(|b| b.num_rows()).sum();
        if n <= 1 {
            return Err(EngineError::Context(format!(
                "one row encodes to {} bytes ({} decoded), above the payload limit of {limit} \
                 or the decoded cap of {MAX_DECODED_BYTES}",
                encoded.0.len(),
                encoded.1
            )));
        }
        let (left, right) = halve(&piece, n / 2);
        // Push right first so fragments stay in row order.
        pending.push(right);
        pending.push(left);
    }
    Ok(done)
}

fn halve(group: &[RecordBatch], at: usize) -> (Vec<RecordBatch>, Vec<RecordBatch>) {
    let mut left = vec![];
    let mut right = vec![];
    let mut seen = 0;
    for b in group {
        let n = b.num_rows();
        if seen + n <= at {
            left.push(b.clone());
        } else if seen >= at {
            right.push(b.clone());
        } else {
            let k = at - seen;
            left.push(b.slice(0, k));
            right.push(b.slice(k, n - k));
        }
        seen += n;
    }
    (left, right)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Arc;

    fn batch(rows: usize, offset: i64) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("text", DataType::Utf8, false),
        ]));
        let ids = Int64Array::from_iter_values((0..rows as i64).map(|i| i + offset));
        // Pseudo-random text compresses poorly, so sizes are honest.
        let text = StringArray::from_iter_values((0..rows).map(|i| {
            format!(
                "{:x}",
                (i as u64 + offset as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
            )
        }));
        RecordBatch::try_new(schema, vec![Arc::new(ids), Arc::new(text)]).unwrap()
    }

    fn header(encoding: Encoding) -> PayloadHeader {
        PayloadHeader {
            qid: "q".into(),
            seq_num: 0,
            seq_len: 1,
            epoch: 3,
            shuffle_id: 1,
            encoding,
            watermark: Some(42),
            idle: false,
            last: false,
            checkpoint: false,
            offsets: vec![],
        }
    }

    #[test]
    fn round_trip_each_encoding() {
        for enc in [Encoding::Zstd, Encoding::Lz4, Encoding::None] {
            let b = batch(1000, 0);
            let ps = encode_payloads(
                &header(enc),
                &b.schema(),
                std::slice::from_ref(&b),
                SYNC_PAYLOAD_LIMIT,
            )
            .unwrap();
            assert_eq!(ps.len(), 1);
            let json = ps[0].to_json();
            assert!(
                !String::from_utf8_lossy(&json).contains("[0,"),
                "no byte arrays in JSON"
            );
            let back = Payload::from_json(&json).unwrap();
            let got = back.decode_batches("s", &b.schema()).unwrap();
            assert_eq!(got, vec![b]);
        }
    }

    #[test]
    fn large_output_is_split_and_arrives_whole() {
        let batches: Vec<RecordBatch> = (0..10).map(|i| batch(20_000, i * 20_000)).collect();
        let schema = batches[0].schema();
        let ps = encode_payloads(
            &header(Encoding::Zstd),
            &schema,
            &batches,
            ASYNC_PAYLOAD_LIMIT,
        )
        .unwrap();
        assert!(ps.len() > 1, "expected a split, got {}", ps.len());
        let mut rows = vec![];
        for (i, p) in ps.iter().enumerate() {
            assert!(p.to_json().len() <= ASYNC_PAYLOAD_LIMIT);
            assert_eq!(p.fragment.index as usize, i);
            assert_eq!(p.fragment.count as usize, ps.len());
            for b in p.decode_batches("s", &schema).unwrap() {
                let ids = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
                rows.extend(ids.values().iter().copied());
            }
        }
        assert_eq!(rows, (0..200_000).collect::<Vec<i64>>());
    }

    #[test]
    fn empty_output_is_metadata_only() {
        let b = batch(0, 0);
        let ps = encode_payloads(
            &header(Encoding::Zstd),
            &b.schema(),
            &[],
            SYNC_PAYLOAD_LIMIT,
        )
        .unwrap();
        assert_eq!(ps.len(), 1);
        assert!(ps[0].data.is_empty());
        assert!(ps[0].decode_batches("s", &b.schema()).unwrap().is_empty());
    }

    #[test]
    fn corrupt_inputs_name_uuid_and_stage() {
        let b = batch(100, 0);
        let good = encode_payloads(
            &header(Encoding::Zstd),
            &b.schema(),
            std::slice::from_ref(&b),
            SYNC_PAYLOAD_LIMIT,
        )
        .unwrap()
        .remove(0);

        let mut truncated = good.clone();
        truncated.data.truncate(truncated.data.len() / 2);
        truncated.data.push('!');
        let err = truncated
            .decode_batches("stage-02", &b.schema())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("q/0/1") && err.contains("stage-02") && err.contains("base64"),
            "{err}"
        );

        let mut bad_frame = good.clone();
        bad_frame.data = B64.encode(b"definitely not zstd");
        let err = bad_frame
            .decode_batches("stage-02", &b.schema())
            .unwrap_err()
            .to_string();
        assert!(err.contains("Zstd"), "{err}");

        let mut cut_frame = good.clone();
        let raw = B64.decode(&good.data).unwrap();
        cut_frame.data = B64.encode(&raw[..raw.len() - 7]);
        assert!(cut_frame.decode_batches("stage-02", &b.schema()).is_err());

        let other = Arc::new(Schema::new(vec![Field::new("x", DataType::Utf8, true)]));
        let err = good
            .decode_batches("stage-02", &other)
            .unwrap_err()
            .to_string();
        assert!(err.contains("schema does not match"), "{err}");

        let mut bad_seq = good.clone();
        bad_seq.uuid.seq_num = 5;
        let err = bad_seq.validate("stage-02").unwrap_err().to_string();
        assert!(
            err.contains("seq_num 5") && err.contains("stage-02"),
            "{err}"
        );

        assert!(Payload::from_json(b"{\"uuid\": 1").is_err());
    }
}
