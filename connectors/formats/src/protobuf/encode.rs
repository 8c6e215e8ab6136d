//! Rows as Protobuf messages, for the Kafka and Kinesis sinks: each column
//! is written to the message field of its name. In the Confluent format the
//! message's schema (as .proto text) is registered under `<topic>-value`
//! the first time a sink writes, and every record carries its id and the
//! message indexes.

use std::sync::Mutex;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Float64Type, Int64Type, TimeUnit};
use prost_reflect::{Cardinality, FieldDescriptor, Kind, MessageDescriptor, Syntax};

use super::wire::{I32, I64, LEN, VARINT, put_message_indexes, put_tag, put_varint, zigzag_encode};
use super::{ProtobufFormat, TIMESTAMP};
use crate::confluent::confluent_prefix;
use crate::registry::SchemaType;
use skein_clients::error::{ConnectorError, Result};

/// Encodes rows as messages of the table's message.
#[derive(Debug)]
pub struct ProtobufEncoder {
    format: ProtobufFormat,
    /// The registered schema's id (Confluent format).
    id: Mutex<Option<u32>>,
}

impl ProtobufEncoder {
    pub fn new(format: ProtobufFormat) -> Result<Self> {
        if format.confluent && format.registry.is_none() {
            return Err(ConnectorError::Config(
                "writing the Confluent wire format needs 'schema.registry.url'".into(),
            ));
        }
        Ok(ProtobufEncoder {
            format,
            id: Mutex::new(None),
        })
    }

    /// Each row of `batch` as one message.
    pub fn values(&self, batch: &RecordBatch) -> Result<Vec<Vec<u8>>> {
        let message = &self.format.message;
        let mut columns = Vec::with_capacity(batch.num_columns());
        for (f, c) in batch.schema_ref().fields().iter().zip(batch.columns()) {
            let field = message.get_field_by_name(f.name()).ok_or_else(|| {
                ConnectorError::Config(format!(
                    "column {} has no field in message {}",
                    f.name(),
                    message.full_name()
                ))
            })?;
            columns.push((field.clone(), writable(&field, c)?));
        }
        let prefix = self.prefix()?;
        let mut rows = Vec::with_capacity(batch.num_rows());
        for row in 0..batch.num_rows() {
            let mut out = prefix.clone();
            for (field, column) in &columns {
                if !column.is_null(row) {
                    put_field(&mut out, field, column, row)?;
                }
            }
            rows.push(out);
        }
        Ok(rows)
    }

    /// What goes before every message: nothing, or the Confluent header
    /// and the message indexes (registering the schema the first time).
    fn prefix(&self) -> Result<Vec<u8>> {
        let Some(registry) = self
            .format
            .registry
            .as_ref()
            .filter(|_| self.format.confluent)
        else {
            return Ok(vec![]);
        };
        let mut id = self.id.lock().expect("id");
        let id = match *id {
            Some(id) => id,
            None => {
                let text = proto_text(&self.format.message);
                let new = registry.register(&self.format.subject, SchemaType::Protobuf, &text)?;
                *id = Some(new);
                new
            }
        };
        let mut out = confluent_prefix(id).to_vec();
        put_message_indexes(&mut out, &message_path(&self.format.message));
        Ok(out)
    }
}

/// A column cast to what its field's wire value is made from.
fn writable(field: &FieldDescriptor, c: &ArrayRef) -> Result<ArrayRef> {
    let to = match field.kind() {
        Kind::Double | Kind::Float => DataType::Float64,
        Kind::String | Kind::Enum(_) => DataType::Utf8,
        Kind::Bytes => DataType::Binary,
        Kind::Bool => DataType::Boolean,
        Kind::Message(m) if m.full_name() == TIMESTAMP => {
            DataType::Timestamp(TimeUnit::Nanosecond, None)
        }
        Kind::Message(m) => {
            return Err(ConnectorError::Config(format!(
                "field {} is a message {}; only timestamps are written",
                field.name(),
                m.full_name()
            )));
        }
        // Timestamps into integer fields as milliseconds, as the decoder reads them.
        _ if matches!(c.data_type(), DataType::Timestamp(..)) => {
            let ms = cast(c, &DataType::Timestamp(TimeUnit::Millisecond, None))?;
            return Ok(cast(&ms, &DataType::Int64)?);
        }
        _ => DataType::Int64,
    };
    Ok(cast(c, &to)?)
}

fn put_field(
    out: &mut Vec<u8>,
    field: &FieldDescriptor,
    column: &ArrayRef,
    row: usize,
) -> Result<()> {
    let n = field.number();
    match field.kind() {
        Kind::Double => {
            put_tag(out, n, I64);
            out.extend(
                column
                    .as_primitive::<Float64Type>()
                    .value(row)
                    .to_le_bytes(),
            );
        }
        Kind::Float => {
            put_tag(out, n, I32);
            out.extend((column.as_primitive::<Float64Type>().value(row) as f32).to_le_bytes());
        }
        Kind::String => put_bytes(out, n, column.as_string::<i32>().value(row).as_bytes()),
        Kind::Bytes => put_bytes(out, n, column.as_binary::<i32>().value(row)),
        Kind::Bool => {
            put_tag(out, n, VARINT);
            put_varint(out, column.as_boolean().value(row) as u64);
        }
        Kind::Enum(e) => {
            let name = column.as_string::<i32>().value(row);
            let v = e.get_value_by_name(name).ok_or_else(|| {
                ConnectorError::Other(format!(
                    "row {row}: {name:?} is not a value of enum {}",
                    e.full_name()
                ))
            })?;
            put_tag(out, n, VARINT);
            put_varint(out, v.number() as i64 as u64);
        }
        Kind::Message(_) => {
            let ns = column
                .as_primitive::<datafusion::arrow::datatypes::TimestampNanosecondType>()
                .value(row);
            let mut ts = vec![];
            put_tag(&mut ts, 1, VARINT);
            put_varint(&mut ts, ns.div_euclid(1_000_000_000) as u64);
            put_tag(&mut ts, 2, VARINT);
            put_varint(&mut ts, ns.rem_euclid(1_000_000_000) as u64);
            put_bytes(out, n, &ts);
        }
        kind => {
            let v = column.as_primitive::<Int64Type>().value(row);
            match kind {
                Kind::Sint32 | Kind::Sint64 => {
                    put_tag(out, n, VARINT);
                    put_varint(out, zigzag_encode(v));
                }
                Kind::Fixed64 | Kind::Sfixed64 => {
                    put_tag(out, n, I64);
                    out.extend(v.to_le_bytes());
                }
                Kind::Fixed32 | Kind::Sfixed32 => {
                    put_tag(out, n, I32);
                    out.extend((v as i32).to_le_bytes());
                }
                Kind::Int32 => {
                    put_tag(out, n, VARINT);
                    put_varint(out, v as i32 as i64 as u64);
                }
                _ => {
                    put_tag(out, n, VARINT);
                    put_varint(out, v as u64);
                }
            }
        }
    }
    Ok(())
}

fn put_bytes(out: &mut Vec<u8>, number: u32, b: &[u8]) {
    put_tag(out, number, LEN);
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// The path of `message` in its file: the indexes of its enclosing
/// messages and its own.
pub(crate) fn message_path(message: &MessageDescriptor) -> Vec<usize> {
    let mut path = vec![];
    let mut m = message.clone();
    loop {
        match m.parent_message() {
            Some(parent) => {
                path.push(parent.child_messages().position(|c| c == m).unwrap_or(0));
                m = parent;
            }
            None => {
                path.push(m.parent_file().messages().position(|c| c == m).unwrap_or(0));
                break;
            }
        }
    }
    path.reverse();
    path
}

/// The message as .proto text, for the registry: its fields, and the enums
/// it uses (declared beside it).
pub(crate) fn proto_text(message: &MessageDescriptor) -> String {
    let proto3 = message.parent_file().syntax() == Syntax::Proto3;
    let mut out = format!(
        "syntax = \"{}\";\n",
        if proto3 { "proto3" } else { "proto2" }
    );
    if !message.package_name().is_empty() {
        out.push_str(&format!("package {};\n", message.package_name()));
    }
    if message
        .fields()
        .any(|f| matches!(f.kind(), Kind::Message(m) if m.full_name() == TIMESTAMP))
    {
        out.push_str("import \"google/protobuf/timestamp.proto\";\n");
    }
    out.push_str(&format!("\nmessage {} {{\n", message.name()));
    let mut enums = vec![];
    for f in message.fields() {
        let label = match (f.cardinality(), proto3) {
            (Cardinality::Repeated, _) => "repeated ",
            (Cardinality::Required, _) => "required ",
            (_, false) => "optional ",
            (_, true) if f.supports_presence() => "optional ",
            _ => "",
        };
        let t = match f.kind() {
            Kind::Message(m) => format!(".{}", m.full_name()),
            Kind::Enum(e) => {
                if !enums.contains(&e) {
                    enums.push(e.clone());
                }
                e.name().to_string()
            }
            k => format!("{k:?}").to_ascii_lowercase(),
        };
        out.push_str(&format!("  {label}{t} {} = {};\n", f.name(), f.number()));
    }
    out.push_str("}\n");
    for e in enums {
        out.push_str(&format!("\nenum {} {{\n", e.name()));
        for v in e.values() {
            out.push_str(&format!("  {} = {};\n", v.name(), v.number()));
        }
        out.push_str("}\n");
    }
    out
}
