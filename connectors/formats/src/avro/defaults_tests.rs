//! Defaults of the reader schema: each kind of default as a column value,
//! and records of an older writer schema read into the columns of the
//! latest one (records encoded by hand from the Avro specification).

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::{
    DataType, Date32Type, Float64Type, Int32Type, Int64Type, Schema, TimeUnit,
    TimestampMillisecondType,
};

use super::*;
use crate::avro::encode::zigzag;
use crate::avro::reader::columns_of;
use crate::confluent::confluent_prefix;
use crate::decode::RecordDecoder;
use crate::format::Format;
use crate::recorded::Recorded;

fn column(t: DataType, nullable: bool) -> Field {
    Field::new("c", t, nullable)
}

fn value(default: Value, t: DataType, nullable: bool) -> std::result::Result<ScalarValue, String> {
    default_value(&default, &column(t, nullable))
}

#[test]
fn each_kind_of_default_is_a_value_of_its_column() {
    use DataType::*;
    use serde_json::json;
    let ms = Timestamp(TimeUnit::Millisecond, None);
    let us = Timestamp(TimeUnit::Microsecond, None);
    let cases = [
        (json!("web"), Utf8, ScalarValue::Utf8(Some("web".into()))),
        (json!(7), Int32, ScalarValue::Int32(Some(7))),
        (json!(-7), Int64, ScalarValue::Int64(Some(-7))),
        (json!(0.25), Float64, ScalarValue::Float64(Some(0.25))),
        (json!(3), Float64, ScalarValue::Float64(Some(3.0))),
        (json!(true), Boolean, ScalarValue::Boolean(Some(true))),
        (
            json!("\u{00ff}\u{0000}A"),
            Binary,
            ScalarValue::Binary(Some(vec![255, 0, b'A'])),
        ),
        (json!(19_000), Date32, ScalarValue::Date32(Some(19_000))),
        (
            json!(1_700_000_000_000i64),
            ms.clone(),
            ScalarValue::TimestampMillisecond(Some(1_700_000_000_000), None),
        ),
        (
            json!(5),
            us.clone(),
            ScalarValue::TimestampMicrosecond(Some(5), None),
        ),
        (json!(null), Utf8, ScalarValue::Utf8(None)),
        (json!(null), Int64, ScalarValue::Int64(None)),
    ];
    for (default, t, expected) in cases {
        let got = value(default.clone(), t.clone(), true);
        assert_eq!(got, Ok(expected), "{default} as {t}");
    }
    let nan = value(json!("NaN"), Float64, false).unwrap();
    assert!(matches!(nan, ScalarValue::Float64(Some(x)) if x.is_nan()));

    let wrong = [
        (json!(null), Utf8, "NOT NULL"),
        (json!(5), Utf8, "not a Utf8 value"),
        (json!("5"), Int64, "not a Int64 value"),
        (json!(1.5), Int64, "not a Int64 value"),
        (json!(3_000_000_000i64), Int32, "does not fit"),
        (json!("\u{0100}"), Binary, "not a Binary value"),
        (json!([1]), DataType::new_list(Int64, true), "not supported"),
    ];
    for (default, t, why) in wrong {
        let err = value(default.clone(), t.clone(), false).unwrap_err();
        assert!(err.contains(why), "{default} as {t}: {err}");
    }
}

#[test]
fn a_column_the_writer_lacks_takes_its_default_else_null_else_fails() {
    let with = column(DataType::Utf8, false)
        .with_metadata([(DEFAULT_KEY.to_string(), "\"web\"".to_string())].into());
    assert!(matches!(
        Fill::missing(&with),
        Ok(Fill::Default(ScalarValue::Utf8(Some(s)))) if s == "web"
    ));
    assert!(matches!(
        Fill::missing(&column(DataType::Utf8, true)),
        Ok(Fill::Null)
    ));
    let err = Fill::missing(&column(DataType::Utf8, false)).unwrap_err();
    assert!(err.contains("column c is NOT NULL"), "{err}");
    let bad = column(DataType::Int64, false)
        .with_metadata([(DEFAULT_KEY.to_string(), "\"x\"".to_string())].into());
    let err = Fill::missing(&bad).unwrap_err();
    assert!(err.starts_with("column c: its default"), "{err}");
}

#[test]
fn uuid_defaults_become_their_sixteen_bytes() {
    let text = serde_json::json!("123e4567-e89b-12d3-a456-426614174000");
    let bytes = uuid_default(&text).unwrap();
    let b = code_points(bytes.as_str().unwrap()).unwrap();
    assert_eq!(b.len(), 16);
    assert_eq!((b[0], b[1], b[15]), (0x12, 0x3e, 0x00));
    assert_eq!(uuid_default(&serde_json::json!("123e4567")), None);
    assert_eq!(uuid_default(&serde_json::json!(5)), None);
    let uuid = serde_json::json!({"type": "string", "logicalType": "uuid"});
    assert!(is_string_uuid(&uuid));
    assert!(is_string_uuid(&serde_json::json!([uuid, "null"])));
    assert!(!is_string_uuid(&serde_json::json!(["null", uuid])));
    assert!(!is_string_uuid(&serde_json::json!("string")));
}

/// The first version of an order: only its id.
const V1: &str = r#"{"type":"record","name":"Order","namespace":"shop","fields":[
  {"name":"id","type":"long"}]}"#;

/// The latest version: fields of every kind added with defaults, and one
/// nullable field without a default.
const V2: &str = r#"{"type":"record","name":"Order","namespace":"shop","fields":[
  {"name":"id","type":"long"},
  {"name":"channel","type":"string","default":"web"},
  {"name":"note","type":["null","string"],"default":null},
  {"name":"qty","type":"int","default":1},
  {"name":"total","type":"long","default":-5},
  {"name":"ratio","type":"double","default":0.5},
  {"name":"weight","type":"float","default":2.5},
  {"name":"rush","type":"boolean","default":true},
  {"name":"size","type":{"type":"enum","name":"Size","symbols":["S","M","L"]},"default":"M"},
  {"name":"tag","type":"bytes","default":"\u00ff\u0001"},
  {"name":"code","type":{"type":"fixed","name":"Code","size":2},"default":"ab"},
  {"name":"day","type":{"type":"int","logicalType":"date"},"default":19000},
  {"name":"at","type":{"type":"long","logicalType":"timestamp-millis"},"default":1700000000000},
  {"name":"maybe","type":["string","null"],"default":"x"},
  {"name":"uid","type":{"type":"string","logicalType":"uuid"},
   "default":"123e4567-e89b-12d3-a456-426614174000"},
  {"name":"extra","type":["null","long"]}]}"#;

fn quoted(schema: &str) -> String {
    serde_json::to_string(&serde_json::json!({ "schema": schema })).unwrap()
}

fn string(s: &str) -> Vec<u8> {
    [zigzag(s.len() as i64), s.as_bytes().to_vec()].concat()
}

#[test]
fn records_of_an_older_schema_take_the_latest_schemas_defaults() {
    let latest =
        serde_json::json!({"subject": "orders-value", "version": 2, "id": 2, "schema": V2});
    let server = Recorded::start(&[
        (
            "GET /subjects/orders-value/versions/latest",
            200,
            &latest.to_string(),
        ),
        ("GET /schemas/ids/1", 200, &quoted(V1)),
        ("GET /schemas/ids/2", 200, &quoted(V2)),
    ]);
    let options: BTreeMap<String, String> = [
        ("format", "avro-confluent"),
        ("schema.registry.url", server.url.as_str()),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let f = Format::from_options(&options, "orders").unwrap();
    let d = RecordDecoder::new(Arc::new(Schema::empty()), f, 1 << 20).unwrap();
    let schema = d.schema().clone();
    let channel = schema.field_with_name("channel").unwrap();
    assert!(!channel.is_nullable(), "a string is NOT NULL, as before");
    assert_eq!(channel.metadata()[DEFAULT_KEY], "\"web\"");
    assert!(
        schema
            .field_with_name("extra")
            .unwrap()
            .metadata()
            .is_empty()
    );

    let v1 = |id: i64| [confluent_prefix(1).to_vec(), zigzag(id)].concat();
    // A v2 record whose values are not the defaults.
    let v2 = [
        confluent_prefix(2).to_vec(),
        zigzag(3),
        string("app"),
        [zigzag(1), string("n")].concat(),
        zigzag(9),
        zigzag(90),
        1.5f64.to_le_bytes().to_vec(),
        4.0f32.to_le_bytes().to_vec(),
        vec![0],
        zigzag(2),
        string("z"),
        b"cd".to_vec(),
        zigzag(2_000),
        zigzag(5),
        zigzag(1),
        string("00000000-0000-0000-0000-000000000001"),
        [zigzag(1), zigzag(77)].concat(),
    ]
    .concat();
    let records = [v1(1), v2, v1(2)];
    let (batch, rejected) = d.decode(records.iter().map(Vec::as_slice)).unwrap();
    assert!(rejected.is_empty(), "{rejected:?}");
    assert_eq!(batch.num_rows(), 3);
    let col = |name: &str| batch.column(schema.index_of(name).unwrap()).clone();
    let ids = col("id");
    assert_eq!(ids.as_primitive::<Int64Type>().values(), &[1, 3, 2]);
    let strings = |name: &str| {
        let c = col(name);
        let c = c.as_string::<i32>();
        (0..3)
            .map(|i| (!c.is_null(i)).then(|| c.value(i).to_string()))
            .collect::<Vec<_>>()
    };
    let s = |v: &str| Some(v.to_string());
    assert_eq!(strings("channel"), [s("web"), s("app"), s("web")]);
    assert_eq!(strings("note"), [None, s("n"), None]);
    assert_eq!(strings("size"), [s("M"), s("L"), s("M")]);
    assert_eq!(strings("maybe"), [s("x"), None, s("x")]);
    assert_eq!(col("qty").as_primitive::<Int32Type>().values(), &[1, 9, 1]);
    assert_eq!(
        col("total").as_primitive::<Int64Type>().values(),
        &[-5, 90, -5]
    );
    assert_eq!(
        col("ratio").as_primitive::<Float64Type>().values(),
        &[0.5, 1.5, 0.5]
    );
    assert_eq!(
        col("weight").as_primitive::<Float64Type>().values(),
        &[2.5, 4.0, 2.5]
    );
    let rush = col("rush");
    let rush = rush.as_boolean();
    assert_eq!((rush.value(0), rush.value(1)), (true, false));
    let bytes = |name: &str, row: usize| col(name).as_binary::<i32>().value(row).to_vec();
    assert_eq!(bytes("tag", 0), [0xff, 0x01]);
    assert_eq!(bytes("tag", 1), b"z");
    assert_eq!(bytes("code", 2), b"ab");
    assert_eq!(bytes("code", 1), b"cd");
    assert_eq!(bytes("uid", 0)[..2], [0x12, 0x3e]);
    assert_eq!(bytes("uid", 1)[15], 1);
    assert_eq!(
        col("day").as_primitive::<Date32Type>().values(),
        &[19_000, 2_000, 19_000]
    );
    assert_eq!(
        col("at")
            .as_primitive::<TimestampMillisecondType>()
            .values(),
        &[1_700_000_000_000, 5, 1_700_000_000_000]
    );
    let extra = col("extra");
    assert!(extra.is_null(0) && extra.is_null(2), "no default: null");
    assert_eq!(extra.as_primitive::<Int64Type>().value(1), 77);

    // The columns, not the decoder, carry the defaults: a decoder given
    // them (as a function is, with the table's schema) fills the same.
    assert_eq!(columns_of(V2).unwrap(), *schema.as_ref());
    let f = Format::from_options(&options, "orders").unwrap();
    let declared = RecordDecoder::new(schema.clone(), f, 1 << 20).unwrap();
    let (again, rejected) = declared.decode(records.iter().map(Vec::as_slice)).unwrap();
    assert!(rejected.is_empty(), "{rejected:?}");
    assert_eq!(again, batch);
}
