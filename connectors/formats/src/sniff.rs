//! What a sample of record values looks like, for declaring a table over
//! them: the format that reads every one (Confluent-framed Avro or
//! Protobuf, Debezium JSON, JSON) and the columns to declare, as the
//! decoders of this crate would read them.
//!
//! JSON columns are the union of the sampled objects' fields, by name, typed as the
//! JSON decoder reads them: strings `VARCHAR`, integers `BIGINT`, other
//! numbers `DOUBLE`, booleans `BOOLEAN`. An integer field of epoch
//! milliseconds (every value in 2001..2286) is a `TIMESTAMP`, and the first
//! such field is offered as event time. Nested objects and arrays are left
//! out: the decoder reads flat records. Avro columns come from the
//! registry's schema of the topic's subject.

use std::collections::BTreeMap;

use serde_json::Value;
use skein_clients::error::Result as ConnectorResult;
use skein_engine::catalog::browse::{InferredColumn, Sample, SampledRecord};

use crate::registry::{Registry, RegistryConfig, SchemaType, shared};

/// Epoch milliseconds from 2001-09-09 to 2286-11-20: an integer in this
/// range in a field of every sampled record is taken for a time.
const EPOCH_MS: std::ops::Range<i64> = 1_000_000_000_000..10_000_000_000_000;

/// The format and columns a sample suggests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sniffed {
    /// The `'format'` that reads every sampled value, if one does.
    pub format: Option<String>,
    /// The columns to declare.
    pub columns: Vec<InferredColumn>,
    /// The first `TIMESTAMP` column.
    pub event_time: Option<String>,
    /// Where the columns come from, for a person.
    pub columns_from: String,
    /// The registry's schema text, where it has one.
    pub schema: Option<String>,
}

/// What one field's values were.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    Text,
    Integer { all_epoch_ms: bool },
    Number,
    Boolean,
    Nested,
    Mixed,
}

impl Seen {
    fn of(v: &Value) -> Option<Seen> {
        Some(match v {
            Value::Null => return None,
            Value::String(_) => Seen::Text,
            Value::Bool(_) => Seen::Boolean,
            Value::Number(n) => match n.as_i64() {
                Some(i) => Seen::Integer {
                    all_epoch_ms: EPOCH_MS.contains(&i),
                },
                None => Seen::Number,
            },
            Value::Array(_) | Value::Object(_) => Seen::Nested,
        })
    }

    fn and(self, other: Seen) -> Seen {
        use Seen::*;
        match (self, other) {
            (Integer { all_epoch_ms: a }, Integer { all_epoch_ms: b }) => Integer {
                all_epoch_ms: a && b,
            },
            (Integer { .. } | Number, Integer { .. } | Number) => Number,
            (a, b) if a == b => a,
            _ => Mixed,
        }
    }

    fn sql_type(self) -> Option<&'static str> {
        match self {
            Seen::Text => Some("VARCHAR"),
            Seen::Integer { all_epoch_ms: true } => Some("TIMESTAMP"),
            Seen::Integer { .. } => Some("BIGINT"),
            Seen::Number => Some("DOUBLE"),
            Seen::Boolean => Some("BOOLEAN"),
            Seen::Nested | Seen::Mixed => None,
        }
    }
}

/// The columns of flat JSON objects: every field, by name.
fn json_columns(objects: &[&serde_json::Map<String, Value>]) -> (Vec<InferredColumn>, Vec<String>) {
    let mut fields: Vec<(String, Option<Seen>)> = vec![];
    for o in objects {
        for (k, v) in o.iter() {
            let seen = Seen::of(v);
            match fields.iter_mut().find(|(n, _)| n == k) {
                Some((_, was)) => {
                    *was = match (*was, seen) {
                        (Some(a), Some(b)) => Some(a.and(b)),
                        (a, b) => a.or(b),
                    }
                }
                None => fields.push((k.clone(), seen)),
            }
        }
    }
    fields.sort_by(|a, b| a.0.cmp(&b.0));
    let mut left_out = vec![];
    let columns = fields
        .into_iter()
        .filter_map(|(name, seen)| {
            // Only nulls sampled: text reads whatever comes.
            match seen.map_or(Some("VARCHAR"), Seen::sql_type) {
                Some(t) => Some(InferredColumn {
                    name,
                    sql_type: t.to_string(),
                }),
                None => {
                    left_out.push(name);
                    None
                }
            }
        })
        .collect();
    (columns, left_out)
}

/// A Debezium change event's row (its `after`, else `before`), under an
/// optional `payload` envelope.
fn debezium_row(o: &serde_json::Map<String, Value>) -> Option<&serde_json::Map<String, Value>> {
    let event = match o.get("payload") {
        Some(Value::Object(p)) => p,
        _ => o,
    };
    let op = event.get("op")?.as_str()?;
    if !matches!(op, "c" | "r" | "u" | "d") {
        return None;
    }
    ["after", "before"]
        .iter()
        .find_map(|k| event.get(*k)?.as_object())
}

fn event_time(columns: &[InferredColumn]) -> Option<String> {
    columns
        .iter()
        .find(|c| c.sql_type == "TIMESTAMP")
        .map(|c| c.name.clone())
}

/// The columns of an Avro record schema, typed as the Avro decoder reads
/// them; fields of other types are left out.
fn avro_columns(schema: &str) -> Result<(Vec<InferredColumn>, Vec<String>), String> {
    let schema: Value = serde_json::from_str(schema).map_err(|e| format!("Avro schema: {e}"))?;
    let fields = schema["fields"]
        .as_array()
        .ok_or("the Avro schema is not a record")?;
    let mut columns = vec![];
    let mut left_out = vec![];
    for f in fields {
        let name = f["name"].as_str().unwrap_or_default().to_string();
        // A union with null is its other branch, nullable.
        let t = match &f["type"] {
            Value::Array(branches) => branches
                .iter()
                .find(|b| b.as_str() != Some("null"))
                .cloned()
                .unwrap_or(Value::Null),
            t => t.clone(),
        };
        let (primitive, logical) = match &t {
            Value::String(s) => (s.as_str(), None),
            Value::Object(o) => (
                o.get("type").and_then(Value::as_str).unwrap_or(""),
                o.get("logicalType").and_then(Value::as_str),
            ),
            _ => ("", None),
        };
        let sql = match (primitive, logical) {
            ("long", Some("timestamp-millis" | "timestamp-micros")) => Some("TIMESTAMP"),
            ("int", Some("date")) => Some("DATE"),
            ("string", _) | ("enum", _) => Some("VARCHAR"),
            ("int", _) => Some("INT"),
            ("long", _) => Some("BIGINT"),
            ("float", _) => Some("FLOAT"),
            ("double", _) => Some("DOUBLE"),
            ("boolean", _) => Some("BOOLEAN"),
            ("bytes", _) | ("fixed", _) => Some("BYTEA"),
            _ => None,
        };
        match sql {
            Some(sql) => columns.push(InferredColumn {
                name,
                sql_type: sql.to_string(),
            }),
            None => left_out.push(name),
        }
    }
    Ok((columns, left_out))
}

fn left_out_note(left_out: &[String]) -> String {
    if left_out.is_empty() {
        String::new()
    } else {
        format!(
            "; left out (nested or of mixed types): {}",
            left_out.join(", ")
        )
    }
}

/// Look at `values` (a stream's recent record values) of the stream
/// `subject_base` (its topic: the registry subject is `<topic>-value`).
pub fn sniff(values: &[&[u8]], registry: Option<&Registry>, subject_base: &str) -> Sniffed {
    let nothing = |why: String| Sniffed {
        format: None,
        columns: vec![],
        event_time: None,
        columns_from: why,
        schema: None,
    };
    if values.is_empty() {
        return nothing("no records to look at".into());
    }
    // Confluent framing: a zero byte and a four-byte schema id.
    if values.iter().all(|v| v.len() >= 5 && v[0] == 0) {
        let Some(registry) = registry else {
            return nothing(
                "the records are framed for a schema registry, and none is configured \
                 (skein ui --schema-registry URL)"
                    .into(),
            );
        };
        let subject = format!("{subject_base}-value");
        return match registry.latest(&subject) {
            Ok(s) => {
                let (format, columns) = match s.schema_type {
                    SchemaType::Avro => (
                        "avro-confluent",
                        avro_columns(&s.schema).unwrap_or_else(|e| (vec![], vec![e])),
                    ),
                    SchemaType::Protobuf => ("protobuf-confluent", (vec![], vec![])),
                    SchemaType::Json => ("json", (vec![], vec![])),
                };
                let (columns, left_out) = columns;
                let from = if columns.is_empty() {
                    format!(
                        "subject {subject} (schema {}): declare the columns from its schema",
                        s.id
                    )
                } else {
                    format!(
                        "subject {subject} (schema {}){}",
                        s.id,
                        left_out_note(&left_out)
                    )
                };
                Sniffed {
                    format: Some(format.into()),
                    event_time: event_time(&columns),
                    columns,
                    columns_from: from,
                    schema: Some(s.schema),
                }
            }
            Err(e) => nothing(format!("subject {subject}: {e}")),
        };
    }
    let parsed: Vec<Option<Value>> = values
        .iter()
        .map(|v| serde_json::from_slice::<Value>(v).ok())
        .collect();
    let objects: Option<Vec<&serde_json::Map<String, Value>>> = parsed
        .iter()
        .map(|v| v.as_ref().and_then(Value::as_object))
        .collect();
    let Some(objects) = objects else {
        return nothing(format!(
            "{} of {} records are not JSON objects: declare the table's format and columns by hand",
            parsed
                .iter()
                .filter(|v| !v.as_ref().is_some_and(Value::is_object))
                .count(),
            values.len()
        ));
    };
    let rows: Option<Vec<_>> = objects.iter().map(|o| debezium_row(o)).collect();
    let (format, rows) = match rows {
        Some(rows) => ("debezium-json", rows),
        None => ("json", objects),
    };
    let (columns, left_out) = json_columns(&rows);
    Sniffed {
        format: Some(format.into()),
        event_time: event_time(&columns),
        columns,
        columns_from: format!(
            "inferred from {} records{}",
            values.len(),
            left_out_note(&left_out)
        ),
        schema: None,
    }
}

/// A record's bytes as a sample shows them: text as is, other bytes as hex.
pub fn shown(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) => s.to_string(),
        Err(_) => bytes.iter().map(|b| format!("{b:02x}")).collect(),
    }
}

/// A stream's sample from the records read of it, each with its time (ms)
/// and value: the newest `wanted`, oldest first, and what they suggest.
/// The declaration's options are `declared` plus the registry's URL (from
/// `options`) when the records are framed for one. Blocking: the registry
/// client waits on its own runtime.
pub fn sample(
    mut read: Vec<(i64, SampledRecord, Vec<u8>)>,
    wanted: usize,
    options: &BTreeMap<String, String>,
    stream: &str,
    mut declared: BTreeMap<String, String>,
) -> ConnectorResult<Sample> {
    read.sort_by_key(|r| r.0);
    let read = read.split_off(read.len().saturating_sub(wanted));
    let values: Vec<&[u8]> = read.iter().map(|r| r.2.as_slice()).collect();
    let registry = RegistryConfig::from_options(options)?
        .map(shared)
        .transpose()?;
    let sniffed = sniff(&values, registry.as_deref(), stream);
    let framed = sniffed
        .format
        .as_deref()
        .is_some_and(|f| f.ends_with("-confluent"));
    if framed && let Some(url) = options.get("schema.registry.url") {
        declared.insert("schema.registry.url".into(), url.clone());
    }
    Ok(Sample {
        records: read.into_iter().map(|r| r.1).collect(),
        format: sniffed.format,
        columns_from: sniffed.columns_from,
        columns: sniffed.columns,
        event_time: sniffed.event_time,
        options: declared,
        schema: sniffed.schema,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cols(s: &Sniffed) -> Vec<(String, String)> {
        s.columns
            .iter()
            .map(|c| (c.name.clone(), c.sql_type.clone()))
            .collect()
    }

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn json_records_give_their_fields_as_the_decoder_reads_them() {
        let values: Vec<&[u8]> = vec![
            br#"{"k":"a","v":1,"ts":1700000000000,"p":1.5,"ok":true,"tags":[1]}"#,
            br#"{"k":"b","v":2,"ts":1700000000100,"p":2,"extra":null}"#,
        ];
        let s = sniff(&values, None, "t");
        assert_eq!(s.format.as_deref(), Some("json"));
        assert_eq!(
            cols(&s),
            pairs(&[
                ("extra", "VARCHAR"),
                ("k", "VARCHAR"),
                ("ok", "BOOLEAN"),
                ("p", "DOUBLE"),
                ("ts", "TIMESTAMP"),
                ("v", "BIGINT"),
            ])
        );
        assert_eq!(s.event_time.as_deref(), Some("ts"));
        assert!(s.columns_from.contains("tags"), "{}", s.columns_from);
    }

    #[test]
    fn debezium_events_give_their_rows_columns() {
        let values: Vec<&[u8]> = vec![
            br#"{"payload":{"op":"c","before":null,"after":{"id":1,"name":"x"}}}"#,
            br#"{"payload":{"op":"d","before":{"id":1,"name":"x"},"after":null}}"#,
        ];
        let s = sniff(&values, None, "t");
        assert_eq!(s.format.as_deref(), Some("debezium-json"));
        assert_eq!(cols(&s), pairs(&[("id", "BIGINT"), ("name", "VARCHAR")]));
    }

    #[test]
    fn text_that_is_not_json_is_said() {
        let values: Vec<&[u8]> = vec![b"a,1", br#"{"k":1}"#];
        let s = sniff(&values, None, "t");
        assert_eq!(s.format, None);
        assert!(s.columns_from.starts_with("1 of 2"), "{}", s.columns_from);
        let framed: Vec<&[u8]> = vec![&[0, 0, 0, 0, 1, 2]];
        assert!(sniff(&framed, None, "t").columns_from.contains("registry"));
    }

    #[test]
    fn an_avro_record_schema_gives_its_columns() {
        let schema = r#"{"type":"record","name":"r","fields":[
            {"name":"id","type":"long"},
            {"name":"name","type":["null","string"]},
            {"name":"at","type":{"type":"long","logicalType":"timestamp-millis"}},
            {"name":"m","type":{"type":"map","values":"string"}}]}"#;
        let (c, left_out) = avro_columns(schema).unwrap();
        let got: Vec<(String, String)> = c.into_iter().map(|c| (c.name, c.sql_type)).collect();
        assert_eq!(
            got,
            pairs(&[("id", "BIGINT"), ("name", "VARCHAR"), ("at", "TIMESTAMP")])
        );
        assert_eq!(left_out, ["m"]);
    }

    #[test]
    fn framed_records_take_the_registrys_schema_of_the_topic() {
        let schema = r#"{\"type\":\"record\",\"name\":\"Click\",\"fields\":[{\"name\":\"ad\",\"type\":\"string\"},{\"name\":\"at\",\"type\":{\"type\":\"long\",\"logicalType\":\"timestamp-millis\"}}]}"#;
        let latest =
            format!(r#"{{"subject":"clicks-value","version":1,"id":4,"schema":"{schema}"}}"#);
        let server = crate::recorded::Recorded::start(&[(
            "GET /subjects/clicks-value/versions/latest",
            200,
            &latest,
        )]);
        let registry = Registry::new(RegistryConfig {
            url: server.url.clone(),
            user_info: None,
            ca: None,
            client_cert: None,
            verify: true,
        })
        .unwrap();
        let framed: Vec<&[u8]> = vec![&[0, 0, 0, 0, 4, 2, b'a'], &[0, 0, 0, 0, 4, 2, b'b']];
        let s = sniff(&framed, Some(&registry), "clicks");
        assert_eq!(s.format.as_deref(), Some("avro-confluent"));
        assert_eq!(cols(&s), pairs(&[("ad", "VARCHAR"), ("at", "TIMESTAMP")]));
        assert_eq!(s.event_time.as_deref(), Some("at"));
        assert!(s.schema.unwrap().contains("Click"));
        assert!(
            s.columns_from.contains("clicks-value"),
            "{}",
            s.columns_from
        );
    }
}
