//! Rows as Avro records, for the Kafka and Kinesis sinks: the value is the
//! row as a record (arrow-avro's encoder), the key one column's value as an
//! Avro primitive. Timestamps are written as `timestamp-millis`, which is
//! what other Avro readers expect. In the Confluent format, the schemas are
//! registered under `<topic>-value` and `<topic>-key` (the TopicNameStrategy)
//! the first time a sink writes, and every record carries the id.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arrow_avro::schema::{AvroSchema, SCHEMA_METADATA_KEY};
use arrow_avro::writer::WriterBuilder;
use arrow_avro::writer::format::AvroBinaryFormat;
use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{
    DataType, Field, Float64Type, Int32Type, Int64Type, Schema, TimeUnit, TimestampMillisecondType,
};

use super::AvroFormat;
use crate::confluent::confluent_prefix;
use crate::registry::SchemaType;
use skein_clients::error::{ConnectorError, Result};

/// Encodes rows as Avro records (and keys as Avro primitives).
#[derive(Debug)]
pub struct AvroEncoder {
    format: AvroFormat,
    /// Registered ids by subject and schema.
    ids: Mutex<HashMap<(String, String), u32>>,
}

impl AvroEncoder {
    pub fn new(format: AvroFormat) -> Result<Self> {
        if format.confluent && format.registry.is_none() {
            return Err(ConnectorError::Config(
                "writing the Confluent wire format needs 'schema.registry.url' (the schema is \
                 registered there and its id written with every record)"
                    .into(),
            ));
        }
        Ok(AvroEncoder {
            format,
            ids: Mutex::new(HashMap::new()),
        })
    }

    /// Whether schemas are registered (the Confluent format): keys are
    /// then Avro too.
    pub fn registered(&self) -> bool {
        self.format.confluent
    }

    /// Each row of `batch` as one record.
    pub fn values(&self, batch: &RecordBatch) -> Result<Vec<Vec<u8>>> {
        let batch = writable(batch, self.format.schema.as_deref())?;
        let schema = batch.schema();
        let json = schema_json(&schema)?;
        let prefix = self.prefix(&self.format.subject, &json)?;
        let mut encoder = WriterBuilder::new(schema.as_ref().clone())
            .build_encoder::<AvroBinaryFormat>()
            .map_err(|e| avro_error("an Avro encoder", e))?;
        encoder
            .encode(&batch)
            .map_err(|e| avro_error("encoding rows as Avro", e))?;
        Ok(encoder
            .flush()
            .iter()
            .map(|row| framed(prefix.as_ref(), &row))
            .collect())
    }

    /// Each row's value of column `name` as an Avro primitive (null stays
    /// `None`).
    pub fn keys(&self, batch: &RecordBatch, name: &str) -> Result<Vec<Option<Vec<u8>>>> {
        let column = batch.column_by_name(name).ok_or_else(|| {
            ConnectorError::Config(format!(
                "key column {name:?} is not among the written columns"
            ))
        })?;
        let (schema, values) = primitives(column)
            .map_err(|why| ConnectorError::Config(format!("key column {name:?}: {why}")))?;
        let subject = format!("{}-key", self.format.location);
        let prefix = self.prefix(&subject, &schema)?;
        Ok(values
            .into_iter()
            .map(|v| v.map(|v| framed(prefix.as_ref(), &v)))
            .collect())
    }

    /// The Confluent header of `schema` under `subject`, registering it the
    /// first time; none for plain Avro.
    fn prefix(&self, subject: &str, schema: &str) -> Result<Option<[u8; 5]>> {
        let Some(registry) = self
            .format
            .registry
            .as_ref()
            .filter(|_| self.format.confluent)
        else {
            return Ok(None);
        };
        let key = (subject.to_string(), schema.to_string());
        if let Some(id) = self.ids.lock().expect("ids").get(&key) {
            return Ok(Some(confluent_prefix(*id)));
        }
        let id = registry.register(subject, SchemaType::Avro, schema)?;
        self.ids.lock().expect("ids").insert(key, id);
        Ok(Some(confluent_prefix(id)))
    }
}

/// The Avro schema rows of `schema` are written with: timestamps as
/// `timestamp-millis`, strings as `string` (what [`AvroEncoder`] writes).
pub fn schema_for(schema: &Schema) -> Result<String> {
    let empty = RecordBatch::new_empty(Arc::new(schema.clone()));
    schema_json(&writable(&empty, None)?.schema())
}

fn schema_json(schema: &Schema) -> Result<String> {
    schema
        .metadata()
        .get(SCHEMA_METADATA_KEY)
        .cloned()
        .map(Ok)
        .unwrap_or_else(|| AvroSchema::try_from(schema).map(|s| s.json_string))
        .map_err(|e| avro_error("the rows' Avro schema", e))
}

fn framed(prefix: Option<&[u8; 5]>, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + body.len());
    if let Some(p) = prefix {
        out.extend_from_slice(p);
    }
    out.extend_from_slice(body);
    out
}

fn avro_error(doing: &str, e: impl std::fmt::Display) -> ConnectorError {
    ConnectorError::Other(format!("{doing}: {e}"))
}

/// The batch with the column types the Avro writer takes and readers
/// expect: timestamps as UTC milliseconds, strings as `Utf8`. With a
/// declared schema (`'avro.schema'`) it is the writer schema.
fn writable(batch: &RecordBatch, declared: Option<&str>) -> Result<RecordBatch> {
    let mut fields = Vec::with_capacity(batch.num_columns());
    let mut columns = Vec::with_capacity(batch.num_columns());
    for (f, c) in batch.schema_ref().fields().iter().zip(batch.columns()) {
        let to = match f.data_type() {
            DataType::Timestamp(..) => {
                DataType::Timestamp(TimeUnit::Millisecond, Some("+00:00".into()))
            }
            DataType::Utf8View | DataType::LargeUtf8 => DataType::Utf8,
            DataType::BinaryView | DataType::LargeBinary => DataType::Binary,
            other => other.clone(),
        };
        columns.push(if &to == f.data_type() {
            c.clone()
        } else {
            cast(c, &to)?
        });
        fields.push(Field::new(f.name(), to, f.is_nullable()));
    }
    let mut schema = Schema::new(fields);
    if let Some(json) = declared {
        schema = schema.with_metadata([(SCHEMA_METADATA_KEY.to_string(), json.to_string())].into());
    }
    Ok(RecordBatch::try_new(schema.into(), columns)?)
}

/// A column's values as Avro primitives, with the schema that reads them.
fn primitives(column: &ArrayRef) -> std::result::Result<(String, Vec<Option<Vec<u8>>>), String> {
    let n = column.len();
    let each = |f: &dyn Fn(usize) -> Vec<u8>| -> Vec<Option<Vec<u8>>> {
        (0..n).map(|i| (!column.is_null(i)).then(|| f(i))).collect()
    };
    Ok(match column.data_type() {
        DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8 => {
            let s = cast(column, &DataType::Utf8).map_err(|e| e.to_string())?;
            let s = s.as_string::<i32>();
            ("\"string\"".into(), each(&|i| bytes(s.value(i).as_bytes())))
        }
        DataType::Int64 => {
            let a = column.as_primitive::<Int64Type>();
            ("\"long\"".into(), each(&|i| zigzag(a.value(i))))
        }
        DataType::Int32 => {
            let a = column.as_primitive::<Int32Type>();
            ("\"int\"".into(), each(&|i| zigzag(a.value(i) as i64)))
        }
        DataType::Float64 => {
            let a = column.as_primitive::<Float64Type>();
            (
                "\"double\"".into(),
                each(&|i| a.value(i).to_le_bytes().to_vec()),
            )
        }
        DataType::Boolean => {
            let a = column.as_boolean();
            ("\"boolean\"".into(), each(&|i| vec![a.value(i) as u8]))
        }
        DataType::Timestamp(..) => {
            let ms = cast(column, &DataType::Timestamp(TimeUnit::Millisecond, None))
                .map_err(|e| e.to_string())?;
            let a = Arc::new(ms);
            let a = a.as_primitive::<TimestampMillisecondType>();
            (
                r#"{"type":"long","logicalType":"timestamp-millis"}"#.into(),
                each(&|i| zigzag(a.value(i))),
            )
        }
        other => return Err(format!("{other} keys are not written as Avro")),
    })
}

/// Avro's `long`: zig-zag, then a base-128 varint.
pub(crate) fn zigzag(n: i64) -> Vec<u8> {
    let mut v = ((n << 1) ^ (n >> 63)) as u64;
    let mut out = Vec::with_capacity(10);
    loop {
        if v < 0x80 {
            out.push(v as u8);
            return out;
        }
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
}

/// Avro's `bytes` and `string`: the length as a `long`, then the bytes.
fn bytes(b: &[u8]) -> Vec<u8> {
    let mut out = zigzag(b.len() as i64);
    out.extend_from_slice(b);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primitives_are_avro_encoded() {
        assert_eq!(zigzag(0), [0]);
        assert_eq!(zigzag(-1), [1]);
        assert_eq!(zigzag(1), [2]);
        assert_eq!(zigzag(64), [0x80, 0x01]);
        assert_eq!(bytes(b"ab"), [4, b'a', b'b']);
        let keys: ArrayRef = Arc::new(datafusion::arrow::array::StringArray::from(vec![
            Some("k"),
            None,
        ]));
        let (schema, values) = primitives(&keys).unwrap();
        assert_eq!(schema, "\"string\"");
        assert_eq!(values, vec![Some(vec![2, b'k']), None]);
    }
}
