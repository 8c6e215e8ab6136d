//! Sending: one epoch's output for one receiver as payloads, each under
//! the invocation limit.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::ipc::writer::StreamWriter;
use datafusion::arrow::record_batch::RecordBatch;

use super::envelope::{
    ENVELOPE_ALLOWANCE, Fragment, MAX_FRAGMENTS, Payload, PayloadId, SourceOffset,
};
use super::frame::{Encoding, MAX_DECODED_BYTES, compress};
use crate::error::{EngineError, Result};

/// Arrow IPC stream bytes (schema + batches), uncompressed.
pub fn ipc_bytes(schema: &SchemaRef, batches: &[RecordBatch]) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    {
        let mut w = StreamWriter::try_new(&mut buf, schema)?;
        for b in batches {
            w.write(&compact_views(b)?)?;
        }
        w.finish()?;
    }
    Ok(buf)
}

/// `batch` with each string or binary view column copied into buffers of
/// its own where it refers into far larger ones. A view array's rows point
/// into shared data buffers, which `take` and `slice` keep whole: a hash
/// partition of a Kafka pull (VARCHAR columns are views) would otherwise
/// carry the whole pull's strings to every member, and the IPC writer
/// writes every buffer a column refers to.
pub fn compact_views(batch: &RecordBatch) -> Result<RecordBatch> {
    use datafusion::arrow::array::{ArrayRef, AsArray};
    use datafusion::arrow::datatypes::DataType;
    let mut changed = false;
    let columns: Vec<ArrayRef> = batch
        .columns()
        .iter()
        .map(|c| {
            let compacted = match c.data_type() {
                DataType::Utf8View => compact_if_sparse(c.as_string_view()),
                DataType::BinaryView => compact_if_sparse(c.as_binary_view()),
                _ => None,
            };
            changed |= compacted.is_some();
            compacted.unwrap_or_else(|| c.clone())
        })
        .collect();
    if !changed {
        return Ok(batch.clone());
    }
    Ok(RecordBatch::try_new(batch.schema(), columns)?)
}

/// A copy of `a` in buffers of its own, when it uses under half of the
/// buffers it refers to.
fn compact_if_sparse<T: datafusion::arrow::datatypes::ByteViewType + ?Sized>(
    a: &datafusion::arrow::array::GenericByteViewArray<T>,
) -> Option<datafusion::arrow::array::ArrayRef> {
    let held: usize = a.data_buffers().iter().map(|b| b.len()).sum();
    (held > 2 * a.total_buffer_bytes_used() + 64 * 1024).then(|| std::sync::Arc::new(a.gc()) as _)
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
