//! The Protobuf decoder: each message's fields walked once, the declared
//! ones checked and kept as values, then appended as one row (a message
//! that fails adds no row).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::ArrayRef;
use datafusion::arrow::datatypes::{DataType, Field, SchemaRef, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use prost_reflect::{Kind, MessageDescriptor};

use super::wire::{I32, I64, LEN, Reader, VARINT, message_indexes, zigzag_decode};
use super::{ColumnField, ProtobufFormat, column_fields, columns_of};
use crate::confluent::confluent_header;
use crate::registry::{ById, SchemaType};
use crate::text::columns::{ColumnBuilder, Typed};
use skein_clients::error::Result;

/// Field numbers below this are looked up in a table.
const NEAR: usize = 4096;

/// Decodes Protobuf messages into batches of the table's columns.
#[derive(Debug)]
pub struct ProtobufDecoder {
    schema: SchemaRef,
    format: ProtobufFormat,
    columns: Vec<Option<ColumnField>>,
    /// The column reading each field number: a table for the usual small
    /// numbers, a map for the others.
    by_number: Vec<Option<usize>>,
    far: HashMap<u32, usize>,
    /// Schema ids checked against the registry.
    ids: Mutex<HashMap<u32, std::result::Result<(), String>>>,
}

impl ProtobufDecoder {
    /// A decoder into `schema`; without columns, they are the message's.
    pub fn new(schema: SchemaRef, format: ProtobufFormat) -> Result<Self> {
        let schema = match schema.fields().is_empty() {
            true => Arc::new(columns_of(&format.message)?),
            false => schema,
        };
        let fields: Vec<&Field> = schema.fields().iter().map(|f| f.as_ref()).collect();
        let columns = column_fields(&format.message, &fields)?;
        let (mut by_number, mut far) = (vec![], HashMap::new());
        for (i, c) in columns.iter().enumerate() {
            let Some(n) = c.as_ref().map(|c| c.field.number()) else {
                continue;
            };
            match n as usize {
                n if n < NEAR => {
                    if by_number.len() <= n {
                        by_number.resize(n + 1, None);
                    }
                    by_number[n] = Some(i);
                }
                _ => {
                    far.insert(n, i);
                }
            }
        }
        Ok(ProtobufDecoder {
            schema,
            format,
            columns,
            by_number,
            far,
            ids: Mutex::new(HashMap::new()),
        })
    }

    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    pub(crate) fn registry_problem(&self) -> Option<String> {
        self.format.registry_problem()
    }

    pub fn builder(&self, capacity: usize) -> ProtobufBuilder<'_> {
        ProtobufBuilder {
            decoder: self,
            columns: ColumnBuilder::for_schema(&self.schema, capacity),
            values: Vec::with_capacity(self.columns.len()),
            known: None,
        }
    }

    /// Whether records may carry schema `id` (the registry knows it, as
    /// a Protobuf schema).
    fn check_id(&self, id: u32) -> std::result::Result<(), String> {
        let Some(registry) = &self.format.registry else {
            return Ok(());
        };
        if let Some(known) = self.ids.lock().expect("ids").get(&id) {
            return known.clone();
        }
        let verdict = match registry.schema_by_id(id) {
            ById::Found(s) if s.schema_type == SchemaType::Protobuf => Ok(()),
            // Named by its id in `push`.
            ById::Found(s) => Err(format!("a {:?} schema, not Protobuf", s.schema_type)),
            ById::Missing(why) => Err(why),
        };
        self.ids.lock().expect("ids").insert(id, verdict.clone());
        verdict
    }

    /// Whether the message indexes of a record name the table's message.
    fn check_path(&self, path: &[usize]) -> std::result::Result<(), String> {
        let ours = &self.format.message;
        let file = ours.parent_file();
        let mut found: Option<MessageDescriptor> = None;
        for (depth, &i) in path.iter().enumerate() {
            found = match (depth, &found) {
                (0, _) => file.messages().nth(i),
                (_, Some(m)) => m.child_messages().nth(i),
                _ => None,
            };
        }
        match found {
            Some(m) if m.full_name() == ours.full_name() => Ok(()),
            Some(m) => Err(format!(
                "the record holds message {}, the table reads {}",
                m.full_name(),
                ours.full_name()
            )),
            None => Err(format!(
                "message indexes {path:?} name no message of {}",
                file.name()
            )),
        }
    }
}

/// Decodes Protobuf messages one at a time into one batch.
pub struct ProtobufBuilder<'d> {
    decoder: &'d ProtobufDecoder,
    columns: Vec<ColumnBuilder>,
    values: Vec<Option<Typed>>,
    /// The last schema id and message path that passed their checks.
    known: Option<(u32, Vec<usize>)>,
}

impl ProtobufBuilder<'_> {
    pub(crate) fn push(&mut self, record: &[u8]) -> std::result::Result<(), String> {
        let d = self.decoder;
        let start = match d.format.confluent {
            false => 0,
            true => {
                let (id, rest) = confluent_header(record)?;
                let (path, rest) = message_indexes(rest)?;
                if self.known.as_ref() != Some(&(id, path.clone())) {
                    d.check_id(id)
                        .map_err(|why| format!("schema id {id}: {why}"))?;
                    d.check_path(&path)?;
                    self.known = Some((id, path));
                }
                record.len() - rest.len()
            }
        };
        self.values.clear();
        self.values.resize_with(d.columns.len(), || None);
        let mut r = Reader::new(record);
        r.i = start;
        while !r.done() {
            let (number, wire) = r.tag()?;
            let col = match d.by_number.get(number as usize) {
                Some(c) => *c,
                None => d.far.get(&number).copied(),
            };
            let Some(col) = col else {
                r.skip(wire)?;
                continue;
            };
            let cf = d.columns[col]
                .as_ref()
                .expect("mapped columns have a field");
            let to = d.schema.field(col).data_type();
            // The last value of a field wins, as in protobuf.
            self.values[col] = Some(
                value(&mut r, wire, cf, to)
                    .map_err(|why| format!("field {}: {why}", cf.field.name()))?,
            );
        }
        for (i, v) in self.values.iter_mut().enumerate() {
            if v.is_none() {
                *v = Some(absent(d.schema.field(i), d.columns[i].as_ref())?);
            }
        }
        for (col, v) in self.columns.iter_mut().zip(self.values.drain(..)) {
            col.append(v.expect("filled above"), record);
        }
        Ok(())
    }

    pub(crate) fn finish(self) -> Result<RecordBatch> {
        let arrays: Vec<ArrayRef> = self
            .columns
            .into_iter()
            .map(ColumnBuilder::finish)
            .collect();
        Ok(RecordBatch::try_new(self.decoder.schema.clone(), arrays)?)
    }
}

/// The value of a column whose field a message does not hold: null for a
/// field with presence (or no field), else the field's default.
fn absent(column: &Field, cf: Option<&ColumnField>) -> std::result::Result<Typed, String> {
    let default = match cf {
        Some(cf) if !cf.presence => match &cf.kind {
            Kind::String => Some(Typed::Owned(String::new())),
            Kind::Bytes => Some(Typed::Bytes { start: 0, end: 0 }),
            Kind::Bool => Some(Typed::Bool(false)),
            Kind::Float | Kind::Double => Some(Typed::F64(0.0)),
            Kind::Enum(e) => Some(Typed::Owned(e.default_value().name().to_string())),
            Kind::Message(_) => None,
            _ if matches!(column.data_type(), DataType::Float64) => Some(Typed::F64(0.0)),
            _ => Some(Typed::I64(0)),
        },
        _ => None,
    };
    match default {
        Some(v) => Ok(v),
        None if column.is_nullable() => Ok(Typed::Null),
        None => Err(format!("missing field {:?}", column.name())),
    }
}

/// One field's value, checked against its column type `to`.
fn value(
    r: &mut Reader,
    wire: u8,
    cf: &ColumnField,
    to: &DataType,
) -> std::result::Result<Typed, String> {
    let kind = &cf.kind;
    let expected = match &kind {
        Kind::Double | Kind::Fixed64 | Kind::Sfixed64 => I64,
        Kind::Float | Kind::Fixed32 | Kind::Sfixed32 => I32,
        Kind::String | Kind::Bytes | Kind::Message(_) => LEN,
        _ => VARINT,
    };
    if wire != expected {
        return Err(format!("wire type {wire}, expected {expected}"));
    }
    let int = |n: i64| -> std::result::Result<Typed, String> {
        match to {
            DataType::Int32 if i32::try_from(n).is_err() => {
                Err(format!("{n} does not fit a 32-bit integer"))
            }
            DataType::Float64 => Ok(Typed::F64(n as f64)),
            DataType::Timestamp(unit, _) => scale_ms(n, *unit),
            _ => Ok(Typed::I64(n)),
        }
    };
    Ok(match kind {
        Kind::Int32 => int(r.varint()? as i64 as i32 as i64)?,
        Kind::Int64 => int(r.varint()? as i64)?,
        Kind::Uint32 => int(r.varint()? as u32 as i64)?,
        Kind::Uint64 => int(unsigned(r.varint()?)?)?,
        Kind::Sint32 | Kind::Sint64 => int(zigzag_decode(r.varint()?))?,
        Kind::Fixed64 => int(unsigned(u64::from_le_bytes(r.fixed()?))?)?,
        Kind::Sfixed64 => int(i64::from_le_bytes(r.fixed()?))?,
        Kind::Fixed32 => int(i64::from(u32::from_le_bytes(r.fixed()?)))?,
        Kind::Sfixed32 => int(i64::from(i32::from_le_bytes(r.fixed()?)))?,
        Kind::Double => Typed::F64(f64::from_le_bytes(r.fixed()?)),
        Kind::Float => Typed::F64(f64::from(f32::from_le_bytes(r.fixed()?))),
        Kind::Bool => Typed::Bool(r.varint()? != 0),
        Kind::Enum(e) => {
            let n = r.varint()? as i64 as i32;
            Typed::Owned(match e.get_value(n) {
                Some(v) => v.name().to_string(),
                None => n.to_string(),
            })
        }
        Kind::String => {
            let (start, end) = r.len_delimited()?;
            std::str::from_utf8(&r.b[start..end]).map_err(|e| format!("invalid UTF-8: {e}"))?;
            Typed::Str {
                start: start as u32,
                end: end as u32,
            }
        }
        Kind::Bytes => {
            let (start, end) = r.len_delimited()?;
            Typed::Bytes {
                start: start as u32,
                end: end as u32,
            }
        }
        Kind::Message(_) => {
            let (start, end) = r.len_delimited()?;
            let ns = timestamp_nanos(&r.b[start..end])?;
            match to {
                DataType::Timestamp(unit, _) => Typed::I64(match unit {
                    TimeUnit::Second => ns.div_euclid(1_000_000_000),
                    TimeUnit::Millisecond => ns.div_euclid(1_000_000),
                    TimeUnit::Microsecond => ns.div_euclid(1_000),
                    TimeUnit::Nanosecond => ns,
                }),
                _ => return Err("a message converts only to a timestamp".into()),
            }
        }
    })
}

fn unsigned(v: u64) -> std::result::Result<i64, String> {
    i64::try_from(v).map_err(|_| format!("{v} does not fit a 64-bit signed integer"))
}

/// Milliseconds since the epoch as a timestamp of `unit`.
fn scale_ms(ms: i64, unit: TimeUnit) -> std::result::Result<Typed, String> {
    match unit {
        TimeUnit::Second => Some(ms.div_euclid(1000)),
        TimeUnit::Millisecond => Some(ms),
        TimeUnit::Microsecond => ms.checked_mul(1000),
        TimeUnit::Nanosecond => ms.checked_mul(1_000_000),
    }
    .map(Typed::I64)
    .ok_or_else(|| format!("timestamp {ms} ms is out of range"))
}

/// A `google.protobuf.Timestamp` (seconds = 1, nanos = 2) in nanoseconds.
fn timestamp_nanos(b: &[u8]) -> std::result::Result<i64, String> {
    let mut r = Reader::new(b);
    let (mut seconds, mut nanos) = (0i64, 0i64);
    while !r.done() {
        match r.tag()? {
            (1, VARINT) => seconds = r.varint()? as i64,
            (2, VARINT) => nanos = i64::from(r.varint()? as i64 as i32),
            (_, wire) => r.skip(wire)?,
        }
    }
    seconds
        .checked_mul(1_000_000_000)
        .and_then(|s| s.checked_add(nanos))
        .ok_or_else(|| format!("timestamp of {seconds} s is out of range"))
}

#[cfg(test)]
#[path = "decode_tests.rs"]
mod tests;
