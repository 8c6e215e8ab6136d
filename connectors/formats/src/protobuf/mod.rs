//! Protobuf: `'format' 'protobuf'` (plain messages) and
//! `'format' 'protobuf-confluent'` (the Confluent wire format: a zero byte,
//! the schema id, the message indexes, the message), both of the message
//! `'protobuf.message'` of a descriptor set (`'protobuf.descriptor'`, a
//! file written by `protoc --descriptor_set_out`).
//!
//! prost-reflect reads the descriptors; the wire format is walked once per
//! message straight into the columns (`decode.rs`), each column reading the
//! field of its name. Protobuf's own evolution rules apply: fields the
//! table does not read are skipped, a field missing from a message has its
//! default (or is null, for a field with presence). With a registry, the
//! schema id a record carries must be known to it; the message indexes must
//! name the table's message. `encode.rs` writes messages for the sinks.

mod decode;
pub mod encode;
mod wire;

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use prost_reflect::{DescriptorPool, FieldDescriptor, Kind, MessageDescriptor};

pub use decode::{ProtobufBuilder, ProtobufDecoder};

use crate::options::{registry_of, value_subject};
use crate::registry::Registry;
use skein_clients::error::{ConnectorError, Result};

/// A table's Protobuf options.
#[derive(Debug, Clone)]
pub struct ProtobufFormat {
    /// The Confluent wire format (else plain messages).
    pub confluent: bool,
    /// The table's message.
    pub message: MessageDescriptor,
    /// Where the schema ids records carry are checked.
    pub registry: Option<Arc<Registry>>,
    /// The subject of the table's values (`<topic>-value`).
    pub subject: String,
}

impl ProtobufFormat {
    pub fn from_options(
        options: &BTreeMap<String, String>,
        location: &str,
        confluent: bool,
    ) -> Result<Self> {
        let need = |k: &str| {
            options
                .get(k)
                .map(|v| v.trim())
                .filter(|v| !v.is_empty())
                .ok_or_else(|| {
                    ConnectorError::Config(format!(
                        "the protobuf formats need '{k}' ('protobuf.descriptor': a descriptor \
                         set file from protoc --descriptor_set_out; 'protobuf.message': the \
                         message's full name)"
                    ))
                })
        };
        let path = need("protobuf.descriptor")?;
        let name = need("protobuf.message")?;
        let bytes = std::fs::read(path)
            .map_err(|e| ConnectorError::Config(format!("protobuf.descriptor {path:?}: {e}")))?;
        let pool = DescriptorPool::decode(bytes.as_slice()).map_err(|e| {
            ConnectorError::Config(format!(
                "protobuf.descriptor {path:?} is not a descriptor set: {e}"
            ))
        })?;
        let message = pool.get_message_by_name(name).ok_or_else(|| {
            let known: Vec<String> = pool.all_messages().map(|m| m.full_name().into()).collect();
            ConnectorError::Config(format!(
                "protobuf.message {name:?} is not in {path:?}; it has {}",
                known.join(", ")
            ))
        })?;
        Ok(ProtobufFormat {
            confluent,
            message,
            registry: registry_of(options)?,
            subject: value_subject(options, location),
        })
    }

    pub(crate) fn registry_problem(&self) -> Option<String> {
        self.registry.as_ref().and_then(|r| r.probe())
    }
}

/// A descriptor set (as `protoc --descriptor_set_out` writes one) of one
/// proto3 message `skein.<message>` with a field per column of `schema`:
/// integers, doubles, booleans, strings and bytes as themselves, timestamps
/// as int64 milliseconds; nullable columns as `optional` fields.
pub fn descriptor_set_for(schema: &Schema, message: &str) -> Result<Vec<u8>> {
    use prost_reflect::prost::Message;
    use prost_reflect::prost_types::field_descriptor_proto::{Label, Type};
    use prost_reflect::prost_types::{
        DescriptorProto, FieldDescriptorProto, FileDescriptorProto, FileDescriptorSet,
        OneofDescriptorProto,
    };
    let mut m = DescriptorProto {
        name: Some(message.to_string()),
        ..Default::default()
    };
    for (i, f) in schema.fields().iter().enumerate() {
        let t = match f.data_type() {
            DataType::Int64 | DataType::Timestamp(..) => Type::Int64,
            DataType::Int32 => Type::Int32,
            DataType::Float64 => Type::Double,
            DataType::Boolean => Type::Bool,
            DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8 => Type::String,
            DataType::Binary | DataType::LargeBinary => Type::Bytes,
            other => {
                return Err(ConnectorError::Config(format!(
                    "column {} is {other}, which has no protobuf field type here",
                    f.name()
                )));
            }
        };
        let optional = f.is_nullable();
        if optional {
            m.oneof_decl.push(OneofDescriptorProto {
                name: Some(format!("_{}", f.name())),
                ..Default::default()
            });
        }
        m.field.push(FieldDescriptorProto {
            name: Some(f.name().to_string()),
            number: Some(i as i32 + 1),
            label: Some(Label::Optional as i32),
            r#type: Some(t as i32),
            proto3_optional: optional.then_some(true),
            oneof_index: optional.then(|| m.oneof_decl.len() as i32 - 1),
            ..Default::default()
        });
    }
    let file = FileDescriptorProto {
        name: Some(format!("{}.proto", message.to_ascii_lowercase())),
        package: Some("skein".into()),
        message_type: vec![m],
        syntax: Some("proto3".into()),
        ..Default::default()
    };
    Ok(FileDescriptorSet { file: vec![file] }.encode_to_vec())
}

/// The full name of the well-known timestamp message.
const TIMESTAMP: &str = "google.protobuf.Timestamp";

/// What a column reads from its field.
#[derive(Debug, Clone)]
pub(crate) struct ColumnField {
    pub(crate) field: FieldDescriptor,
    /// The field's kind and presence, looked up once (the descriptor
    /// computes them on every call).
    pub(crate) kind: Kind,
    pub(crate) presence: bool,
}

/// The field of `message` each of `columns` reads (None: the message has
/// none, the column is null), checked to convert to the column's type.
pub(crate) fn column_fields(
    message: &MessageDescriptor,
    columns: &[&Field],
) -> Result<Vec<Option<ColumnField>>> {
    columns
        .iter()
        .map(|column| {
            let found = message.get_field_by_name(column.name()).or_else(|| {
                message
                    .fields()
                    .find(|f| f.name().eq_ignore_ascii_case(column.name()))
            });
            let Some(field) = found else {
                if column.is_nullable() {
                    return Ok(None);
                }
                return Err(ConnectorError::Config(format!(
                    "column {} is NOT NULL and message {} has no such field",
                    column.name(),
                    message.full_name()
                )));
            };
            let timestamp = matches!(field.kind(), Kind::Message(m) if m.full_name() == TIMESTAMP);
            if field.is_list() || field.is_map() {
                return Err(ConnectorError::Config(format!(
                    "column {}: field {} is repeated; a column reads one value",
                    column.name(),
                    field.name()
                )));
            }
            if !converts(&field.kind(), timestamp, column.data_type()) {
                return Err(ConnectorError::Config(format!(
                    "column {} is {}; field {} of {} is {}, which does not convert",
                    column.name(),
                    column.data_type(),
                    field.name(),
                    message.full_name(),
                    kind_name(&field.kind())
                )));
            }
            Ok(Some(ColumnField {
                kind: field.kind(),
                presence: field.supports_presence(),
                field,
            }))
        })
        .collect()
}

fn converts(kind: &Kind, timestamp: bool, to: &DataType) -> bool {
    use DataType as T;
    match (kind, to) {
        (_, T::Timestamp(_, None)) => {
            timestamp
                || matches!(
                    kind,
                    Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 | Kind::Uint64
                )
        }
        (Kind::Int32 | Kind::Sint32 | Kind::Sfixed32, T::Int32 | T::Int64 | T::Float64) => true,
        (Kind::Uint32 | Kind::Fixed32, T::Int64 | T::Float64) => true,
        (
            Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 | Kind::Uint64 | Kind::Fixed64,
            T::Int64 | T::Float64,
        ) => true,
        (Kind::Float | Kind::Double, T::Float64) => true,
        (Kind::Bool, T::Boolean) => true,
        (Kind::String | Kind::Enum(_), T::Utf8 | T::Utf8View) => true,
        (Kind::Bytes, T::Binary) => true,
        _ => false,
    }
}

fn kind_name(kind: &Kind) -> String {
    match kind {
        Kind::Message(m) => format!("message {}", m.full_name()),
        Kind::Enum(e) => format!("enum {}", e.full_name()),
        other => format!("{other:?}").to_ascii_lowercase(),
    }
}

/// The columns a table declared without columns takes from its message.
pub(crate) fn columns_of(message: &MessageDescriptor) -> Result<Schema> {
    let fields = message
        .fields()
        .map(|f| {
            let timestamp = matches!(f.kind(), Kind::Message(ref m) if m.full_name() == TIMESTAMP);
            let t = match f.kind() {
                _ if f.is_list() || f.is_map() => None,
                _ if timestamp => Some(DataType::Timestamp(TimeUnit::Nanosecond, None)),
                Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => Some(DataType::Int32),
                Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 | Kind::Uint32 | Kind::Fixed32 => {
                    Some(DataType::Int64)
                }
                Kind::Uint64 | Kind::Fixed64 => Some(DataType::Int64),
                Kind::Float | Kind::Double => Some(DataType::Float64),
                Kind::Bool => Some(DataType::Boolean),
                Kind::String | Kind::Enum(_) => Some(DataType::Utf8),
                Kind::Bytes => Some(DataType::Binary),
                Kind::Message(_) => None,
            };
            let t = t.ok_or_else(|| {
                ConnectorError::Config(format!(
                    "field {} of {} ({}) has no column type here; declare the columns the table \
                     reads",
                    f.name(),
                    message.full_name(),
                    kind_name(&f.kind())
                ))
            })?;
            Ok(Field::new(f.name(), t, f.supports_presence()))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Schema::new(fields))
}
