//! Messages encoded by hand from the protobuf encoding rules, against a
//! descriptor set built here (as `protoc --descriptor_set_out` writes one).

use std::collections::BTreeMap;

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::{Float64Type, Int64Type, Schema, TimestampNanosecondType};
use prost_reflect::prost::Message;
use prost_reflect::prost_types::{
    DescriptorProto, EnumDescriptorProto, EnumValueDescriptorProto, FieldDescriptorProto,
    FileDescriptorProto, FileDescriptorSet,
    field_descriptor_proto::{Label, Type},
};

use super::*;
use crate::confluent::confluent_prefix;
use crate::decode::RecordDecoder;
use crate::format::Format;
use crate::protobuf::wire::{put_message_indexes, put_tag, put_varint, zigzag_encode};

fn field(
    name: &str,
    number: i32,
    t: Type,
    type_name: Option<&str>,
    optional: bool,
) -> FieldDescriptorProto {
    FieldDescriptorProto {
        name: Some(name.into()),
        number: Some(number),
        label: Some(Label::Optional as i32),
        r#type: Some(t as i32),
        type_name: type_name.map(str::to_string),
        proto3_optional: optional.then_some(true),
        oneof_index: optional.then_some(0),
        ..Default::default()
    }
}

/// `skein.Bid` (auction int64, price sint64, channel string, kind enum,
/// ratio double, date_time Timestamp, note optional string) and a second
/// message `skein.Other`.
pub(crate) fn descriptor_file() -> tempfile_path::Path {
    let timestamp = FileDescriptorProto {
        name: Some("google/protobuf/timestamp.proto".into()),
        package: Some("google.protobuf".into()),
        message_type: vec![DescriptorProto {
            name: Some("Timestamp".into()),
            field: vec![
                field("seconds", 1, Type::Int64, None, false),
                field("nanos", 2, Type::Int32, None, false),
            ],
            ..Default::default()
        }],
        syntax: Some("proto3".into()),
        ..Default::default()
    };
    let bid = FileDescriptorProto {
        name: Some("bid.proto".into()),
        package: Some("skein".into()),
        dependency: vec!["google/protobuf/timestamp.proto".into()],
        message_type: vec![
            DescriptorProto {
                name: Some("Other".into()),
                field: vec![field("x", 1, Type::Int64, None, false)],
                ..Default::default()
            },
            DescriptorProto {
                name: Some("Bid".into()),
                field: vec![
                    field("auction", 1, Type::Int64, None, false),
                    field("price", 2, Type::Sint64, None, false),
                    field("channel", 3, Type::String, None, false),
                    field("kind", 4, Type::Enum, Some(".skein.Kind"), false),
                    field("ratio", 5, Type::Double, None, false),
                    field(
                        "date_time",
                        6,
                        Type::Message,
                        Some(".google.protobuf.Timestamp"),
                        false,
                    ),
                    field("note", 7, Type::String, None, true),
                ],
                oneof_decl: vec![prost_reflect::prost_types::OneofDescriptorProto {
                    name: Some("_note".into()),
                    ..Default::default()
                }],
                ..Default::default()
            },
        ],
        enum_type: vec![EnumDescriptorProto {
            name: Some("Kind".into()),
            value: ["BUY", "SELL"]
                .iter()
                .enumerate()
                .map(|(i, n)| EnumValueDescriptorProto {
                    name: Some(n.to_string()),
                    number: Some(i as i32),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }],
        syntax: Some("proto3".into()),
        ..Default::default()
    };
    let set = FileDescriptorSet {
        file: vec![timestamp, bid],
    };
    tempfile_path::Path::with(&set.encode_to_vec())
}

/// A file in the temporary directory, removed when dropped.
pub(crate) mod tempfile_path {
    pub(crate) struct Path(pub(crate) std::path::PathBuf);
    impl Path {
        pub(crate) fn with(bytes: &[u8]) -> Self {
            use std::sync::atomic::{AtomicU64, Ordering};
            static N: AtomicU64 = AtomicU64::new(0);
            let p = std::env::temp_dir().join(format!(
                "skein-desc-{}-{}.bin",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::write(&p, bytes).unwrap();
            Path(p)
        }
        pub(crate) fn as_str(&self) -> &str {
            self.0.to_str().unwrap()
        }
    }
    impl Drop for Path {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

fn options(desc: &str, format: &str) -> BTreeMap<String, String> {
    [
        ("format", format),
        ("protobuf.descriptor", desc),
        ("protobuf.message", "skein.Bid"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

fn bid(
    auction: i64,
    price: i64,
    channel: &str,
    kind: u64,
    seconds: i64,
    note: Option<&str>,
) -> Vec<u8> {
    let mut m = vec![];
    put_tag(&mut m, 1, VARINT);
    put_varint(&mut m, auction as u64);
    put_tag(&mut m, 2, VARINT);
    put_varint(&mut m, zigzag_encode(price));
    put_tag(&mut m, 3, LEN);
    put_varint(&mut m, channel.len() as u64);
    m.extend_from_slice(channel.as_bytes());
    if kind != 0 {
        put_tag(&mut m, 4, VARINT);
        put_varint(&mut m, kind);
    }
    put_tag(&mut m, 5, I64);
    m.extend_from_slice(&0.5f64.to_le_bytes());
    let mut ts = vec![];
    put_tag(&mut ts, 1, VARINT);
    put_varint(&mut ts, seconds as u64);
    put_tag(&mut ts, 2, VARINT);
    put_varint(&mut ts, 7);
    put_tag(&mut m, 6, LEN);
    put_varint(&mut m, ts.len() as u64);
    m.extend_from_slice(&ts);
    // A field the table does not know: skipped.
    put_tag(&mut m, 99, I32);
    m.extend_from_slice(&[1, 2, 3, 4]);
    if let Some(n) = note {
        put_tag(&mut m, 7, LEN);
        put_varint(&mut m, n.len() as u64);
        m.extend_from_slice(n.as_bytes());
    }
    m
}

#[test]
fn messages_decode_into_the_declared_columns_or_are_rejected() {
    let desc = descriptor_file();
    let f = Format::from_options(&options(desc.as_str(), "protobuf"), "bids").unwrap();
    // No columns declared: the message's.
    let d = RecordDecoder::new(Arc::new(Schema::empty()), f, 1 << 20).unwrap();
    let names: Vec<&str> = d
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .collect();
    assert_eq!(
        names,
        [
            "auction",
            "price",
            "channel",
            "kind",
            "ratio",
            "date_time",
            "note"
        ]
    );
    assert!(!d.schema().field(0).is_nullable() && d.schema().field(6).is_nullable());
    let records = [
        bid(1, -5, "web", 1, 10, Some("n")),
        bid(2, 7, "", 0, 20, None),
        vec![0x08],          // truncated varint
        vec![0x0A, 5, b'a'], // auction with a string's wire type
    ];
    let (batch, rejected) = d.decode(records.iter().map(Vec::as_slice)).unwrap();
    assert_eq!(batch.num_rows(), 2, "{rejected:?}");
    let price: Vec<i64> = batch
        .column(1)
        .as_primitive::<Int64Type>()
        .values()
        .to_vec();
    assert_eq!(price, [-5, 7]);
    let kind = batch.column(3).as_string::<i32>();
    assert_eq!(
        (kind.value(0), kind.value(1)),
        ("SELL", "BUY"),
        "absent enum: its default"
    );
    assert_eq!(batch.column(4).as_primitive::<Float64Type>().value(0), 0.5);
    let ts = batch.column(5).as_primitive::<TimestampNanosecondType>();
    assert_eq!(ts.value(0), 10_000_000_007);
    let note = batch.column(6).as_string::<i32>();
    assert_eq!((note.value(0), note.is_null(1)), ("n", true));
    assert!(
        rejected[0].reason.contains("truncated varint"),
        "{rejected:?}"
    );
    assert!(
        rejected[1].reason.contains("wire type 2, expected 0"),
        "{rejected:?}"
    );

    // Declared columns: a subset, promoted; a type that does not convert is refused.
    let declared = Arc::new(Schema::new(vec![
        Field::new("price", DataType::Float64, false),
        Field::new("AUCTION", DataType::Int64, false),
        Field::new("missing", DataType::Int32, true),
    ]));
    let f = Format::from_options(&options(desc.as_str(), "protobuf"), "bids").unwrap();
    let d = RecordDecoder::new(declared, f.clone(), 1 << 20).unwrap();
    let (batch, _) = d
        .decode([&bid(3, 4, "x", 0, 1, None)[..]].into_iter())
        .unwrap();
    assert_eq!(batch.column(0).as_primitive::<Float64Type>().value(0), 4.0);
    assert_eq!(batch.column(1).as_primitive::<Int64Type>().value(0), 3);
    assert!(batch.column(2).is_null(0));
    let bad = Arc::new(Schema::new(vec![Field::new(
        "channel",
        DataType::Int32,
        false,
    )]));
    let err = RecordDecoder::new(bad, f, 1 << 20).unwrap_err().to_string();
    assert!(
        err.contains("channel") && err.contains("does not convert"),
        "{err}"
    );
}

#[test]
fn confluent_framing_checks_the_message_indexes() {
    let desc = descriptor_file();
    let f = Format::from_options(&options(desc.as_str(), "protobuf-confluent"), "bids").unwrap();
    let declared = Arc::new(Schema::new(vec![Field::new(
        "auction",
        DataType::Int64,
        false,
    )]));
    let d = RecordDecoder::new(declared, f, 1 << 20).unwrap();
    let framed = |path: &[usize], body: Vec<u8>| {
        let mut out = confluent_prefix(3).to_vec();
        put_message_indexes(&mut out, path);
        out.extend(body);
        out
    };
    let records = [
        framed(&[1], bid(11, 0, "", 0, 0, None)),
        framed(&[0], bid(12, 0, "", 0, 0, None)),
        framed(&[5], bid(13, 0, "", 0, 0, None)),
        framed(&[1], bid(1 << 40, 0, "", 0, 0, None)),
        vec![0, 0, 0, 0, 3],
    ];
    let (batch, rejected) = d.decode(records.iter().map(Vec::as_slice)).unwrap();
    let auction: Vec<i64> = batch
        .column(0)
        .as_primitive::<Int64Type>()
        .values()
        .to_vec();
    assert_eq!(auction, [11, 1 << 40]);
    let why: Vec<&str> = rejected.iter().map(|r| r.reason.as_str()).collect();
    assert!(why[0].contains("holds message skein.Other"), "{why:?}");
    assert!(why[1].contains("name no message"), "{why:?}");
    assert!(why[2].contains("truncated varint"), "{why:?}");
}

#[test]
fn rows_written_as_messages_of_a_generated_descriptor_read_back() {
    use crate::protobuf::descriptor_set_for;
    use crate::protobuf::encode::ProtobufEncoder;
    use datafusion::arrow::array::{BooleanArray, Float64Array, Int64Array, StringArray};
    use datafusion::arrow::record_batch::RecordBatch;
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
        Field::new("score", DataType::Float64, false),
        Field::new("ok", DataType::Boolean, false),
    ]));
    let desc = tempfile_path::Path::with(&descriptor_set_for(&schema, "Row").unwrap());
    let opts: BTreeMap<String, String> = [
        ("format", "protobuf"),
        ("protobuf.descriptor", desc.as_str()),
        ("protobuf.message", "skein.Row"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int64Array::from(vec![1, -2, 0])),
            Arc::new(StringArray::from(vec![Some("a"), None, Some("")])),
            Arc::new(Float64Array::from(vec![0.5, -1.0, 0.0])),
            Arc::new(BooleanArray::from(vec![true, false, false])),
        ],
    )
    .unwrap();
    let Ok(Format::Protobuf(f)) = Format::from_options(&opts, "t") else {
        panic!("a Protobuf format")
    };
    let values = ProtobufEncoder::new(f).unwrap().values(&batch).unwrap();
    let d = RecordDecoder::new(schema, Format::from_options(&opts, "t").unwrap(), 1 << 20).unwrap();
    let (back, rejected) = d.decode(values.iter().map(Vec::as_slice)).unwrap();
    assert!(rejected.is_empty(), "{rejected:?}");
    assert_eq!(back, batch);
}

#[test]
fn random_bytes_are_rejected_never_a_panic() {
    let desc = descriptor_file();
    let f = Format::from_options(&options(desc.as_str(), "protobuf-confluent"), "b").unwrap();
    let d = RecordDecoder::new(Arc::new(Schema::empty()), f, 1 << 20).unwrap();
    let mut x: u64 = 0x9E3779B97F4A7C15;
    let mut next = || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) as u8
    };
    let records: Vec<Vec<u8>> = (0..3000)
        .map(|i| {
            let mut r = vec![0, 0, 0, 0, 1, 2, 2];
            let body = bid(i, -i, "web", 1, i, None);
            r.extend((0..body.len()).map(|j| if next() % 8 == 0 { next() } else { body[j] }));
            r
        })
        .collect();
    let (batch, rejected) = d.decode(records.iter().map(Vec::as_slice)).unwrap();
    assert_eq!(batch.num_rows() + rejected.len(), records.len());
}
