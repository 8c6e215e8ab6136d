//! Decoding a payload's Arrow IPC stream without trusting it.
//!
//! arrow's `StreamReader` trusts the stream's framing and schema: a negative
//! or huge body length allocates without bound, a buffer outside its body
//! panics, an unknown integer width in the schema panics. Under the Lambda
//! profile's `panic = "abort"` either kills the instance with its arena. So
//! this module walks the stream itself: every length is checked against the
//! bytes really there, the schema is converted by [`crate::ipc_schema`]
//! (errors, never panics) and compared with the plan's, and only then are
//! batches read with arrow's validating `read_record_batch`.

use std::collections::HashMap;

use datafusion::arrow::buffer::Buffer;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::ipc::reader::read_record_batch;
use datafusion::arrow::ipc::{self, MessageHeader};
use datafusion::arrow::record_batch::RecordBatch;

use crate::ipc_schema::schema_from_fb;

/// The continuation marker before every message's metadata length.
const CONTINUATION: u32 = 0xFFFF_FFFF;

/// Most rows (and array slots) one batch may declare; arrow's offsets are i32.
const MAX_LENGTH: i64 = i32::MAX as i64;

/// Decode an IPC stream whose schema must be compatible with `expected`
/// (same column count and types; names may differ). Errors say what was
/// wrong; nothing here panics on any input (see the fuzz test).
pub fn decode_stream(ipc: &[u8], expected: &SchemaRef) -> Result<Vec<RecordBatch>, String> {
    let all = Buffer::from(ipc);
    let mut pos = 0usize;
    let mut schema: Option<SchemaRef> = None;
    let mut batches = vec![];
    while pos < ipc.len() {
        let mut meta_len = read_u32(ipc, pos)?;
        pos += 4;
        if meta_len == CONTINUATION {
            meta_len = read_u32(ipc, pos)?;
            pos += 4;
        }
        // A zero length is the end-of-stream marker.
        if meta_len == 0 {
            break;
        }
        let meta_len = meta_len as usize;
        let meta = ipc
            .get(pos..pos.saturating_add(meta_len))
            .ok_or_else(|| format!("message metadata of {meta_len} bytes at {pos} is cut short"))?;
        pos += meta_len;
        let message = ipc::root_as_message(meta).map_err(|e| {
            format!(
                "message at {} is not a valid flatbuffer: {e}",
                pos - meta_len
            )
        })?;
        let body_len = message.bodyLength();
        let body_len = usize::try_from(body_len)
            .ok()
            .filter(|n| pos.checked_add(*n).is_some_and(|end| end <= ipc.len()))
            .ok_or_else(|| {
                format!(
                    "message body of {body_len} bytes at {pos} does not fit the {} bytes there",
                    ipc.len() - pos
                )
            })?;
        let body = all.slice_with_length(pos, body_len);
        pos += body_len;
        match message.header_type() {
            MessageHeader::Schema => {
                if schema.is_some() {
                    return Err("a second schema message in one stream".into());
                }
                let fb = message
                    .header_as_schema()
                    .ok_or("schema message without a schema")?;
                let got = schema_from_fb(fb)?;
                if !compatible(&got, expected) {
                    return Err(format!(
                        "schema does not match the plan: expected {}, got {}",
                        describe_schema(expected),
                        describe_schema(&got)
                    ));
                }
                schema = Some(got);
            }
            MessageHeader::RecordBatch => {
                let schema = schema.as_ref().ok_or("a record batch before the schema")?;
                let batch = message
                    .header_as_record_batch()
                    .ok_or("record batch message without a batch")?;
                check_batch(&batch, body_len)?;
                check_layout(&batch, schema)?;
                let decoded = read_record_batch(
                    &body,
                    batch,
                    schema.clone(),
                    &HashMap::new(),
                    None,
                    &message.version(),
                )
                .map_err(|e| format!("truncated or corrupt Arrow batch: {e}"))?;
                batches.push(decoded);
            }
            other => {
                return Err(format!(
                    "unexpected {} message (payloads carry no dictionaries or tensors)",
                    other.variant_name().unwrap_or("unknown")
                ));
            }
        }
    }
    if schema.is_none() {
        return Err("no schema message in the stream".into());
    }
    Ok(batches)
}

fn read_u32(bytes: &[u8], at: usize) -> Result<u32, String> {
    let word = bytes
        .get(at..at.saturating_add(4))
        .ok_or_else(|| format!("stream cut short at byte {at}"))?;
    Ok(u32::from_le_bytes([word[0], word[1], word[2], word[3]]))
}

/// Lengths a batch declares, before arrow slices buffers by them.
fn check_batch(batch: &ipc::RecordBatch, body_len: usize) -> Result<(), String> {
    if !(0..=MAX_LENGTH).contains(&batch.length()) {
        return Err(format!("batch declares {} rows", batch.length()));
    }
    if batch.compression().is_some() {
        return Err("IPC buffer compression is not used in payloads".into());
    }
    for node in batch.nodes().into_iter().flatten() {
        if !(0..=MAX_LENGTH).contains(&node.length())
            || !(0..=node.length()).contains(&node.null_count())
        {
            return Err(format!(
                "array of {} slots with {} nulls",
                node.length(),
                node.null_count()
            ));
        }
    }
    for b in batch.buffers().into_iter().flatten() {
        // Buffers start 8-byte aligned in every stream arrow writes.
        let fits = b.offset() % 8 == 0
            && usize::try_from(b.offset())
                .ok()
                .zip(usize::try_from(b.length()).ok())
                .and_then(|(o, l)| o.checked_add(l))
                .is_some_and(|end| end <= body_len);
        if !fits {
            return Err(format!(
                "buffer at offset {} of {} bytes lies outside the {body_len}-byte body",
                b.offset(),
                b.length()
            ));
        }
    }
    if let Some(counts) = batch.variadicBufferCounts()
        && counts.iter().any(|c| !(0..=MAX_LENGTH).contains(&c))
    {
        return Err("bad variadic buffer count".into());
    }
    Ok(())
}

/// What arrow assumes before it validates: a null bitmap holds a bit per
/// slot, a typed buffer a whole number of values (it panics otherwise).
/// Walks the buffers in arrow's order for `schema` (arrow-ipc's
/// `create_array`).
fn check_layout(batch: &ipc::RecordBatch, schema: &SchemaRef) -> Result<(), String> {
    let nodes: Vec<_> = batch.nodes().into_iter().flatten().collect();
    let buffers: Vec<_> = batch.buffers().into_iter().flatten().collect();
    let mut variadic: Vec<i64> = batch.variadicBufferCounts().into_iter().flatten().collect();
    variadic.reverse();
    let mut at = (0usize, 0usize);
    let mut stack: Vec<&DataType> = schema
        .fields()
        .iter()
        .rev()
        .map(|f| f.data_type())
        .collect();
    while let Some(dt) = stack.pop() {
        let (Some(node), Some(validity)) = (nodes.get(at.0), buffers.get(at.1)) else {
            // Too few nodes or buffers: arrow's own reader says so.
            return Ok(());
        };
        at.0 += 1;
        if matches!(dt, DataType::Null) {
            continue;
        }
        if node.null_count() > 0 && validity.length().saturating_mul(8) < node.length() {
            return Err(format!(
                "a null bitmap of {} bytes for {} slots",
                validity.length(),
                node.length()
            ));
        }
        // Element widths of the buffers after the bitmap: arrow views them
        // as typed slices and panics on a length that is not a multiple.
        let widths: &[usize] = match dt {
            DataType::Utf8 | DataType::Binary | DataType::List(_) | DataType::Map(..) => &[4],
            DataType::LargeUtf8 | DataType::LargeBinary | DataType::LargeList(_) => &[8],
            DataType::Utf8View | DataType::BinaryView => &[16],
            _ => match dt.primitive_width() {
                Some(w) => &[w][..],
                None => &[],
            },
        };
        for (k, w) in widths.iter().enumerate() {
            if let Some(b) = buffers.get(at.1 + 1 + k)
                && b.length() % *w as i64 != 0
            {
                return Err(format!(
                    "a buffer of {} bytes for {w}-byte {dt} values",
                    b.length()
                ));
            }
        }
        at.1 += match dt {
            DataType::Utf8 | DataType::Binary | DataType::LargeUtf8 | DataType::LargeBinary => 3,
            DataType::Utf8View | DataType::BinaryView => {
                2 + usize::try_from(variadic.pop().unwrap_or(0)).unwrap_or(0)
            }
            DataType::List(_) | DataType::LargeList(_) | DataType::Map(..) => 2,
            DataType::FixedSizeList(..) | DataType::Struct(_) => 1,
            _ => 2,
        };
        match dt {
            DataType::List(f)
            | DataType::LargeList(f)
            | DataType::Map(f, _)
            | DataType::FixedSizeList(f, _) => stack.push(f.data_type()),
            DataType::Struct(fields) => {
                stack.extend(fields.iter().rev().map(|f| f.data_type()));
            }
            _ => {}
        }
    }
    Ok(())
}

pub(crate) fn describe_schema(s: &SchemaRef) -> String {
    let cols: Vec<String> = s
        .fields()
        .iter()
        .map(|f| format!("{}: {}", f.name(), f.data_type()))
        .collect();
    format!("[{}]", cols.join(", "))
}

/// Same column count and types; names may differ (plans rename freely).
fn compatible(got: &SchemaRef, expected: &SchemaRef) -> bool {
    got.fields().len() == expected.fields().len()
        && got
            .fields()
            .iter()
            .zip(expected.fields().iter())
            .all(|(a, b)| a.data_type() == b.data_type())
}
