use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use datafusion::arrow::array::{Int64Array, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::record_batch::RecordBatch;

use super::*;

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

#[test]
fn a_row_taken_from_a_large_view_column_travels_alone() {
    use datafusion::arrow::array::{Array, StringViewArray, UInt32Array};
    use datafusion::arrow::compute::take;
    // 10,000 strings past the 12 bytes a view holds inline, one row taken:
    // its view still points into the buffers of all of them.
    let long: Vec<String> = (0..10_000)
        .map(|i| format!("a string long enough {i}"))
        .collect();
    let all = StringViewArray::from_iter_values(long.iter());
    let one = take(&all, &UInt32Array::from(vec![7]), None).unwrap();
    let schema = Arc::new(Schema::new(vec![Field::new(
        "s",
        DataType::Utf8View,
        false,
    )]));
    let batch = RecordBatch::try_new(schema.clone(), vec![one]).unwrap();
    let bytes = ipc_bytes(&schema, std::slice::from_ref(&batch)).unwrap();
    assert!(bytes.len() < 4_096, "{} bytes for one row", bytes.len());
    let back = crate::ipc_decode::decode_stream(&bytes, &schema).unwrap();
    let s = back[0]
        .column(0)
        .as_any()
        .downcast_ref::<StringViewArray>()
        .unwrap();
    assert_eq!(s.value(0), "a string long enough 7");
    assert_eq!(s.len(), 1);
}
