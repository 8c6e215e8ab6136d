//! Records encoded by hand from the Avro specification (zig-zag varints,
//! length-prefixed strings, union branch indexes), not by our encoder.

use std::collections::BTreeMap;

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::{
    DataType, Field, Int64Type, Schema, TimeUnit, TimestampNanosecondType,
};

use super::*;
use crate::avro::encode::zigzag;
use crate::decode::RecordDecoder;
use crate::format::Format;
use crate::recorded::Recorded;

fn long(n: i64) -> Vec<u8> {
    zigzag(n)
}

fn string(s: &str) -> Vec<u8> {
    let mut out = zigzag(s.len() as i64);
    out.extend_from_slice(s.as_bytes());
    out
}

fn framed(id: u32, parts: &[Vec<u8>]) -> Vec<u8> {
    let mut out = confluent_prefix(id).to_vec();
    parts.iter().for_each(|p| out.extend_from_slice(p));
    out
}

/// Version 1 of a bid: auction (int), price (long), url (string), ts.
const V1: &str = r#"{"type":"record","name":"Bid","namespace":"nexmark","fields":[
  {"name":"auction","type":"int"},
  {"name":"price","type":"long"},
  {"name":"url","type":"string"},
  {"name":"date_time","type":{"type":"long","logicalType":"timestamp-millis"}}]}"#;

/// Version 2: url removed, channel added with a default, price nullable.
const V2: &str = r#"{"type":"record","name":"Bid","namespace":"nexmark","fields":[
  {"name":"auction","type":"long"},
  {"name":"channel","type":"string","default":"web"},
  {"name":"price","type":["null","long"],"default":null},
  {"name":"date_time","type":{"type":"long","logicalType":"timestamp-millis"}}]}"#;

fn table(nullable_price: bool) -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("auction", DataType::Int64, false),
        Field::new("price", DataType::Int64, nullable_price),
        Field::new("channel", DataType::Utf8, true),
        Field::new(
            "date_time",
            DataType::Timestamp(TimeUnit::Nanosecond, None),
            false,
        ),
    ]))
}

fn options(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn registry(url: &str) -> BTreeMap<String, String> {
    options(&[("format", "avro-confluent"), ("schema.registry.url", url)])
}

fn quoted(schema: &str) -> String {
    serde_json::to_string(&serde_json::json!({ "schema": schema })).unwrap()
}

#[test]
fn plain_avro_reads_the_declared_columns_with_promotions() {
    let f =
        Format::from_options(&options(&[("format", "avro"), ("avro.schema", V1)]), "bids").unwrap();
    let d = RecordDecoder::new(table(false), f, 1 << 20).unwrap();
    let r1 = [long(7), long(100), string("http://x"), long(1_000)].concat();
    let r2 = [long(-8), long(5), string(""), long(2_500)].concat();
    let (batch, rejected) = d.decode([&r1[..], &r2[..], &r1[..3]].into_iter()).unwrap();
    assert_eq!(batch.num_rows(), 2);
    let auction: Vec<i64> = batch
        .column(0)
        .as_primitive::<Int64Type>()
        .values()
        .to_vec();
    assert_eq!(auction, [7, -8]);
    assert!(batch.column(2).is_null(0), "the writer has no channel");
    let ts = batch.column(3).as_primitive::<TimestampNanosecondType>();
    assert_eq!(ts.value(1), 2_500_000_000);
    assert_eq!(rejected.len(), 1);
    assert!(
        rejected[0].reason.contains("undecodable Avro"),
        "{rejected:?}"
    );
}

#[test]
fn confluent_records_resolve_per_schema_id_and_bad_ones_are_rejected_with_reasons() {
    let server = Recorded::start(&[
        ("GET /schemas/ids/1", 200, &quoted(V1)),
        ("GET /schemas/ids/2", 200, &quoted(V2)),
        (
            "GET /schemas/ids/3",
            200,
            &quoted(r#"{"type":"record","name":"Bid","fields":[{"name":"price","type":"long"}]}"#),
        ),
        (
            "GET /schemas/ids/4",
            200,
            &quoted(
                r#"{"type":"record","name":"Bid","fields":[{"name":"auction","type":"string"},{"name":"date_time","type":"long"}]}"#,
            ),
        ),
    ]);
    let f = Format::from_options(&registry(&server.url), "bids").unwrap();
    let d = RecordDecoder::new(table(true), f, 1 << 20).unwrap();
    let v1 = |a: i64| framed(1, &[long(a), long(a * 10), string("u"), long(a * 1000)]);
    // v2: auction, channel, price (union branch 1 = long, 0 = null), ts.
    let v2 = |a: i64, price: Option<i64>| {
        let price = match price {
            Some(p) => [long(1), long(p)].concat(),
            None => long(0),
        };
        framed(2, &[long(a), string("app"), price, long(a * 1000)])
    };
    let mut records = vec![v1(1), v1(2), v2(3, Some(30)), v2(4, None), v1(5)];
    records.push(framed(9, &[long(1)])); // unknown id: 404
    records.push(vec![1, 0, 0, 0, 1, 2]); // not the wire format
    records.push(framed(1, &[long(6)])); // truncated
    records.push([v1(7), vec![0]].concat()); // a byte left over
    records.push(framed(3, &[long(1)])); // no auction, which is NOT NULL
    records.push(framed(4, &[string("x"), long(1)])); // auction is a string
    records.push(v2(8, Some(80)));
    let (batch, rejected) = d.decode(records.iter().map(Vec::as_slice)).unwrap();
    let auction: Vec<i64> = batch
        .column(0)
        .as_primitive::<Int64Type>()
        .values()
        .to_vec();
    assert_eq!(auction, [1, 2, 3, 4, 5, 8], "the evolution lost nothing");
    let price = batch.column(1).as_primitive::<Int64Type>();
    assert_eq!(
        (price.value(2), price.is_null(3), price.value(4)),
        (30, true, 50)
    );
    let channel = batch.column(2).as_string::<i32>();
    assert_eq!((channel.is_null(0), channel.value(2)), (true, "app"));
    let reasons: Vec<(usize, &str)> = rejected
        .iter()
        .map(|r| (r.index, r.reason.as_str()))
        .collect();
    assert_eq!(
        reasons.iter().map(|r| r.0).collect::<Vec<_>>(),
        [5, 6, 7, 8, 9, 10],
        "{reasons:?}"
    );
    assert!(
        reasons[0].1.starts_with("schema id 9: HTTP 404"),
        "named once: {reasons:?}"
    );
    assert_eq!(reasons[0].1.matches("schema id").count(), 1, "{reasons:?}");
    assert!(
        reasons[1].1.contains("Confluent wire format"),
        "{reasons:?}"
    );
    assert!(reasons[2].1.contains("undecodable Avro"), "{reasons:?}");
    assert!(reasons[3].1.contains("left over"), "{reasons:?}");
    assert!(
        reasons[4].1.contains("column auction is NOT NULL"),
        "{reasons:?}"
    );
    assert!(reasons[5].1.contains("does not convert"), "{reasons:?}");
}

#[test]
fn a_table_without_columns_takes_the_subjects_latest_schema() {
    let latest = serde_json::json!({"subject": "bids-value", "version": 2, "id": 2, "schema": V2});
    let server = Recorded::start(&[(
        "GET /subjects/bids-value/versions/latest",
        200,
        &latest.to_string(),
    )]);
    let f = Format::from_options(&registry(&server.url), "bids").unwrap();
    let d = RecordDecoder::new(Arc::new(Schema::empty()), f, 1 << 20).unwrap();
    let names: Vec<&str> = d
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .collect();
    assert_eq!(names, ["auction", "channel", "price", "date_time"]);
    assert_eq!(d.schema().field(2).data_type(), &DataType::Int64);
    assert!(d.schema().field(2).is_nullable());
    assert!(matches!(
        d.schema().field(3).data_type(),
        DataType::Timestamp(TimeUnit::Millisecond, None)
    ));
}

#[test]
fn a_sink_registers_value_and_key_schemas_and_its_records_read_back() {
    use crate::avro::encode::AvroEncoder;
    use datafusion::arrow::array::{Int64Array, StringArray, TimestampMillisecondArray};
    let server = Recorded::start(&[
        ("POST /subjects/out-value/versions", 200, r#"{"id":21}"#),
        ("POST /subjects/out-key/versions", 200, r#"{"id":22}"#),
    ]);
    let mut opts = registry(&server.url);
    opts.insert("key".into(), "name".into());
    let Ok(Format::Avro(f)) = Format::from_options(&opts, "out") else {
        panic!("an Avro format")
    };
    let encoder = AvroEncoder::new(f).unwrap();
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
        Field::new(
            "at",
            DataType::Timestamp(TimeUnit::Millisecond, None),
            false,
        ),
    ]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int64Array::from(vec![7, -1])),
            Arc::new(StringArray::from(vec![Some("k"), None])),
            Arc::new(TimestampMillisecondArray::from(vec![1_000, 2_000])),
        ],
    )
    .unwrap();
    // What the sink's row encoder does with a key column.
    let encode = || {
        let values = encoder.values(&batch).unwrap();
        let keys = encoder.keys(&batch, "name").unwrap();
        (values, keys)
    };
    let (values, keys) = encode();
    assert_eq!(&values[0][..5], &confluent_prefix(21));
    assert_eq!(keys[0].as_deref(), Some(&[0, 0, 0, 0, 22, 2, b'k'][..]));
    assert_eq!(keys[1], None);
    // Registered once, under TopicNameStrategy subjects.
    let requests = server.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 2, "{requests:?}");
    let post = requests
        .iter()
        .find(|r| r.path == "/subjects/out-value/versions")
        .unwrap();
    let registered: serde_json::Value = serde_json::from_str(&post.body).unwrap();
    let value_schema = registered["schema"].as_str().unwrap();
    assert!(value_schema.contains("timestamp-millis"), "{value_schema}");
    encode();
    assert_eq!(server.requests.lock().unwrap().len(), 2);

    // What the sink wrote, read by a source whose registry has that schema.
    let reader = Recorded::start(&[("GET /schemas/ids/21", 200, &quoted(value_schema))]);
    let f = Format::from_options(&registry(&reader.url), "out").unwrap();
    let d = RecordDecoder::new(schema.clone(), f, 1 << 20).unwrap();
    let (back, rejected) = d.decode(values.iter().map(Vec::as_slice)).unwrap();
    assert!(rejected.is_empty(), "{rejected:?}");
    assert_eq!(back, batch);
}

#[test]
fn random_bytes_are_rejected_never_a_panic() {
    let f =
        Format::from_options(&options(&[("format", "avro"), ("avro.schema", V2)]), "b").unwrap();
    let d = RecordDecoder::new(table(true), f, 1 << 20).unwrap();
    let good = [long(3), string("app"), long(0), long(3_000)].concat();
    // A fixed linear congruential sequence: the same bytes every run.
    let mut x: u64 = 0x2545F4914F6CDD1D;
    let mut next = || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) as u8
    };
    let mut records = vec![];
    for i in 0..3000 {
        let mut r = match i % 3 {
            0 => good.clone(),
            _ => (0..(next() % 40)).map(|_| next()).collect(),
        };
        if i % 3 == 2 && !r.is_empty() {
            // Mostly valid, one byte changed.
            r = good.clone();
            let at = next() as usize % r.len();
            r[at] = next();
        }
        records.push(r);
    }
    let (batch, rejected) = d.decode(records.iter().map(Vec::as_slice)).unwrap();
    assert_eq!(batch.num_rows() + rejected.len(), records.len());
    assert!(batch.num_rows() >= 1000, "every good record is read");
}
